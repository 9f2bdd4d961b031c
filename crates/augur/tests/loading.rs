//! The one load path, from names to a loaded pipeline: `Pipeline::load_reporting` resolves and loads the target,
//! then the assistant (in the target's vocabulary when it has none of its own), then the assistant's tokenizer,
//! and reports each load; what it cannot load is refused with the file named.

mod common;

use std::sync::Arc;

use augur::generation::config::GenerationOptions;
use augur::io::catalogue::Model;
use augur::io::pull::Progress;
use augur::models::{LoadOptions, QuantizeOnLoad};
use augur::pipeline::{load_tokenizer, Assistant, CallOptions, LoadSpec, Pipeline, Prompt};
use common::*;

/// The loads reported, as lines.
#[derive(Default)]
struct Recorded(Vec<String>);

impl Progress for Recorded {
    fn start(&mut self, model: &Model) {
        self.0.push(format!("pull {}", model.name));
    }
    fn step(&mut self, _: &str) {}
    fn position(&mut self, _: u64) {}
    fn finish(&mut self, _: &Model, _: &str) {}
    fn loading(&mut self, what: &str) {
        self.0.push(format!("loading {what}"));
    }
    fn loaded(&mut self) {
        self.0.push("loaded".into());
    }
}

fn fixture(name: &str) -> Option<String> {
    Some(fixtures().join(name).to_string_lossy().into_owned())
}

#[test]
fn a_target_and_its_assistant_load_in_one_call_and_the_assistant_drafts() {
    let spec =
        LoadSpec { model: fixture("tiny-llama"), assistant: fixture("tiny-llama-assistant"), ..Default::default() };
    let mut progress = Recorded::default();
    let mut pipe = Pipeline::load_reporting(&spec, &mut progress).unwrap();
    assert_eq!(progress.0, ["loading tiny-llama", "loaded", "loading the assistant tiny-llama-assistant", "loaded"]);
    assert!(matches!(pipe.assistant, Some(Assistant::Lm(_))));
    // Transformers' rounds, every draft kept: the tiny assistant's drafts are unconfident and would not pay.
    let options = GenerationOptions {
        num_assistant_tokens: Some(3),
        assistant_confidence_threshold: Some(0.0),
        cost_aware_drafting: Some(false),
        ..greedy(12)
    };
    let out = pipe.call(&Prompt::Text("Hello".into()), &CallOptions::new(options), None).unwrap();
    assert_eq!(out.stats.method, "assistant_model");
    assert!(out.stats.drafted > 0, "the loaded assistant drafted nothing: {:?}", out.stats.rounds);
}

#[test]
fn the_assistant_tokenizer_replaces_the_assistants_own() {
    let tokenizer = fixtures().join("tiny-qwen2-metaspace");
    let spec = LoadSpec {
        model: fixture("tiny-llama"),
        assistant: fixture("tiny-llama-assistant"),
        assistant_tokenizer: Some(tokenizer.clone()),
        ..Default::default()
    };
    let pipe = Pipeline::load(&spec).unwrap();
    let assistant = pipe.assistant.as_ref().unwrap().tokenizer();
    assert!(!Arc::ptr_eq(assistant, &pipe.target.tokenizer));
    assert_eq!(assistant.vocab_size(), load_tokenizer(&tokenizer).unwrap().vocab_size());
    assert_ne!(assistant.vocab_size(), pipe.target.tokenizer.vocab_size());
}

#[test]
fn an_assistant_tokenizer_without_an_assistant_is_refused() {
    let spec = LoadSpec {
        model: fixture("tiny-llama"),
        assistant_tokenizer: Some(fixtures().join("tiny-llama")),
        ..Default::default()
    };
    let e = Pipeline::load(&spec).err().expect("a tokenizer for no assistant loaded").to_string();
    assert!(e.contains("an assistant tokenizer needs an assistant model"), "{e}");
}

#[test]
fn gemma4s_assistant_refuses_quantization_at_load_rather_than_ignoring_it() {
    let spec = LoadSpec {
        model: fixture("tiny-gemma4"),
        assistant: fixture("tiny-gemma4-assistant"),
        options: LoadOptions { quantize: Some(QuantizeOnLoad::parse("q8_0").unwrap()), ..Default::default() },
        ..Default::default()
    };
    let e = Pipeline::load(&spec).err().expect("a quantized Gemma 4 assistant loaded").to_string();
    assert!(e.contains("tiny-gemma4-assistant") && e.contains("not quantized at load"), "{e}");
    let unquantized = LoadSpec { options: LoadOptions::default(), ..spec };
    let pipe = Pipeline::load(&unquantized).unwrap();
    assert!(matches!(pipe.assistant, Some(Assistant::Gemma4(_))));
}

#[test]
fn a_missing_model_is_named_and_nothing_starts_loading() {
    let missing = fixtures().join("no-such-model.gguf").to_string_lossy().into_owned();
    let spec = LoadSpec { model: Some(missing), ..Default::default() };
    let mut progress = Recorded::default();
    let e = Pipeline::load_reporting(&spec, &mut progress).err().expect("a missing model loaded").to_string();
    assert!(e.contains("no-such-model.gguf"), "{e}");
    assert!(progress.0.is_empty(), "{:?}", progress.0);
}
