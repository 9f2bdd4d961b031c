//! An assistant's reduced draft vocabulary (`draft_vocab_size`, FR-Spec) on the tiny fixtures: greedy
//! assisted decoding gives plain greedy's tokens, token for token, with drafts proposed; the set holds the
//! prompt's tokens and EOS whatever the size; only tokens of the set are drafted; the shipped frequency table is
//! used for its own tokenizer alone; nonsense sizes are errors naming the field. The sampled case's exact
//! distribution is in `exact_distribution.rs`, the real model's in `real_qwen05.rs`.

mod common;

use augur::generation::config::{GenerationConfig, GenerationOptions};
use augur::pipeline::Assistant;
use augur::speculation::draft_vocab::{self, SHIPPED};
use augur::speculation::methods::AssistantModel;
use augur::speculation::Drafter;
use common::*;

fn reduced(n: usize, tokens: usize) -> GenerationOptions {
    GenerationOptions {
        draft_vocab_size: Some(n),
        num_assistant_tokens: Some(4),
        assistant_confidence_threshold: Some(0.0),
        cost_aware_drafting: Some(false),
        ..greedy(tokens)
    }
}

#[test]
fn greedy_with_a_reduced_draft_vocabulary_is_plain_greedy() {
    let mut plain = pipeline("tiny-llama", None);
    let mut spec = pipeline("tiny-llama", Some("tiny-llama-assistant"));
    let mut next = token_stream(7, 448);
    let mut drafted = 0;
    for (i, n) in [1, 16, 96, 200, 447, 448, 0].into_iter().enumerate() {
        let prompt: Vec<u32> = (0..6 + i).map(|_| next()).collect();
        let want = plain.generate_ids(&prompt, &greedy(24), None).unwrap();
        let got = spec.generate_ids(&prompt, &reduced(n, 24), None).unwrap();
        assert_eq!(got.tokens, want.tokens, "draft_vocab_size {n}");
        assert_eq!(got.stats.method, "assistant_model");
        assert!(got.stats.drafted > 0, "draft_vocab_size {n}: nothing drafted");
        drafted += got.stats.drafted;
    }
    assert!(drafted > 50, "{drafted} drafts in all");
}

#[test]
fn the_set_holds_the_prompt_and_eos_and_drafts_stay_inside() {
    let mut target = load(&fixtures().join("tiny-llama"), false);
    let path = fixtures().join("tiny-llama-assistant");
    let mut a = Assistant::load(&path, &Default::default(), &target.tokenizer).unwrap();
    let a = a.lm_mut().unwrap();
    let vocab = a.config().vocab_size;
    // Ids past the first 16 (the fixture's tokenizer has no table: its first ids are the frequent part).
    let prompt: Vec<u32> = vec![297, 346, 370, 319, 265, 280, 297, 346, 441];
    let eos = 400;
    for sample in [false, true] {
        let opts = GenerationOptions {
            eos_token_id: Some(vec![eos]),
            do_sample: Some(sample),
            seed: Some(3),
            ..reduced(16, 8)
        };
        let cfg = GenerationConfig::from_options(&opts);
        let mut d = AssistantModel::new(a.model.as_mut(), &cfg, prompt.len(), vocab, &a.tokenizer).unwrap();
        assert!(d.draft_vocab().is_none(), "built in the first round");
        let mut drafted = 0;
        let mut context = prompt.clone();
        for _ in 0..4 {
            let draft = d.propose(target.model.as_mut(), &context, 4).unwrap();
            let set = d.draft_vocab().expect("a reduced draft vocabulary").to_vec();
            for t in prompt.iter().chain([&eos]) {
                assert!(set.contains(t), "{t} is missing from the draft vocabulary");
            }
            assert_eq!(set.len(), 16 + 8, "16 frequent ids, 7 distinct prompt ids and EOS past them");
            assert!((0..16).all(|t| set.contains(&t)));
            for (i, t) in draft.tokens.iter().enumerate() {
                assert!(set.contains(t), "drafted {t}, outside the draft vocabulary");
                if let Some(q) = &draft.q {
                    let mass: f32 = set.iter().map(|&s| q[i][s as usize]).sum();
                    assert!((mass - 1.0).abs() < 1e-5, "q sums to {mass} over the set");
                    assert!(q[i].iter().enumerate().all(|(t, &p)| p == 0.0 || set.contains(&(t as u32))));
                }
            }
            drafted += draft.tokens.len();
            context.extend(&draft.tokens);
            d.observe(&context, draft.tokens.len(), draft.tokens.len()).unwrap();
        }
        assert!(drafted > 0, "nothing drafted");
        target.model.truncate(0);
    }
}

#[test]
fn the_table_is_used_only_for_its_own_tokenizer() {
    let table = SHIPPED.as_ref().expect("the shipped table");
    for name in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        let lm = load(&fixtures().join(name), false);
        assert!(!table.fits(&lm.tokenizer), "{name}'s tokenizer is not Qwen2's");
        let vocab = lm.config().vocab_size;
        let n = vocab / 3;
        assert_eq!(draft_vocab::top_ids(&lm.tokenizer, vocab, n), (0..n as u32).collect::<Vec<_>>(), "{name}");
    }
}

#[test]
fn nonsense_sizes_are_errors_naming_the_field() {
    let mut spec = pipeline("tiny-llama", Some("tiny-llama-assistant"));
    let opts = GenerationOptions { draft_vocab_size: Some(usize::MAX), ..reduced(0, 4) };
    let e = spec.generate_ids(&[1, 2, 3], &opts, None).unwrap_err().to_string();
    assert!(e.contains("draft_vocab_size"), "{e}");
    let e = GenerationOptions::from_json_str(r#"{"draft_vocab_size": -1}"#).unwrap_err().to_string();
    assert!(e.contains("draft_vocab_size"), "{e}");
    let e = GenerationOptions::from_json_str(r#"{"draft_vocab_size": "many"}"#).unwrap_err().to_string();
    assert!(e.contains("draft_vocab_size"), "{e}");
}
