//! Qwen2.5-Coder-0.5B-Instruct from its GGUF file (fetched by `.ci/run`): the configuration read from the
//! file's tensor table (q/k/v biases, an LM head of its own), and a continuation that only a correctly
//! built model gives. Without the biases the model still runs, and speculation stays lossless against it, but
//! it writes noise.

mod common;

use augur::models::{ForwardOptions, LogitRows};
use common::{load, real_model};

const FILE: &str = "qwen2.5-coder-0.5b-instruct.gguf";

#[test]
fn gguf_config_reads_the_tensor_table() {
    let mut lm = load(&real_model(FILE), false);
    let cfg = lm.model.config();
    assert!(cfg.attention_bias, "the file has blk.0.attn_q.bias");
    assert!(!cfg.tie_word_embeddings, "the file has an output.weight of its own");
    let ids = lm.tokenizer.encode("The capital of France is", false).unwrap();
    let out = lm.model.forward(&ids, &ForwardOptions::logits(LogitRows::Last(1))).unwrap();
    let l = out.logits.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let best = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
    assert_eq!(lm.tokenizer.decode(&[best], false).unwrap(), " Paris");
}

/// The reduced draft vocabulary on the real model: the shipped frequency table was counted with this
/// tokenizer and ranks its ids (not in merge order); the head over a subset (this file's own `output.weight`,
/// gathered from the file) gives the whole head's logits bit for bit; and the model assisting itself with the
/// default reduced vocabulary gives plain greedy's tokens, drafting all the while.
#[test]
fn reduced_draft_vocabulary_on_the_real_model() {
    use augur::generation::config::GenerationOptions;
    use augur::models::HeadSubset;
    use augur::pipeline::{Assistant, Pipeline};
    use augur::speculation::draft_vocab::{self, DEFAULT_DRAFT_VOCAB_SIZE, SHIPPED};
    use std::sync::Arc;

    let mut lm = load(&real_model(FILE), false);
    let vocab = lm.config().vocab_size;
    assert!(SHIPPED.as_ref().expect("the shipped table").fits(&lm.tokenizer), "counted with this tokenizer");
    let top = draft_vocab::top_ids(&lm.tokenizer, vocab, DEFAULT_DRAFT_VOCAB_SIZE);
    assert_eq!(top.len(), DEFAULT_DRAFT_VOCAB_SIZE);
    assert!(top.iter().any(|&id| id as usize >= DEFAULT_DRAFT_VOCAB_SIZE), "the table's ranking, not merge order");

    let tokens = lm.tokenizer.encode("def fibonacci(n):\n    ", false).unwrap();
    let full = lm.model.forward(&tokens, &ForwardOptions::logits(LogitRows::All)).unwrap().logits.unwrap();
    lm.model.truncate(0);
    let part = lm.model.head_part(&top, false).unwrap().expect("the GGUF head gathers");
    let opts = ForwardOptions {
        head: Some(Arc::new(HeadSubset { ids: top.clone(), parts: vec![part] })),
        ..ForwardOptions::logits(LogitRows::All)
    };
    let subset = lm.model.forward(&tokens, &opts).unwrap().logits.unwrap().to_vec2::<f32>().unwrap();
    for (f, s) in full.to_vec2::<f32>().unwrap().iter().zip(&subset) {
        assert_eq!(top.iter().map(|&id| f[id as usize]).collect::<Vec<f32>>(), *s);
    }
    lm.model.truncate(0);

    let assistant = Assistant::load(&real_model(FILE), &Default::default(), &lm.tokenizer).unwrap();
    // Loading gathered the default draft vocabulary's head and kept it on the model: the part handed out now
    // is that one (a part not kept is gathered afresh on each ask), so the first call does not gather it.
    let Assistant::Lm(a) = &assistant else { panic!("a causal LM assistant") };
    let kept = a.model.head_part(&top, false).unwrap().unwrap();
    assert!(Arc::ptr_eq(&kept, &a.model.head_part(&top, false).unwrap().unwrap()), "no head part kept at load");
    let mut pipe = Pipeline { target: lm, assistant: None, defaults: GenerationOptions::default() };
    let prompt = pipe.target.tokenizer.encode("import numpy as np\n\ndef softmax(x):\n", false).unwrap();
    let base = GenerationOptions { max_new_tokens: Some(32), eos_token_id: Some(vec![]), ..Default::default() };
    let plain = pipe.generate_ids(&prompt, &base, None).unwrap();
    pipe.assistant = Some(assistant);
    // Cost-aware drafting off, so that every round drafts; the size set as the default would be.
    let reduced = GenerationOptions {
        draft_vocab_size: Some(DEFAULT_DRAFT_VOCAB_SIZE),
        cost_aware_drafting: Some(false),
        ..base
    };
    let spec = pipe.generate_ids(&prompt, &reduced, None).unwrap();
    assert_eq!(spec.tokens, plain.tokens);
    assert!(spec.stats.drafted > 0 && spec.stats.accepted > 0, "{:?}", spec.stats);
}
