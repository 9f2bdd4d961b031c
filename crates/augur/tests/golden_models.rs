//! Golden tests against Transformers 5.24 on the tiny random checkpoints of every architecture: logits to
//! 1e-4 relative in f32, greedy tokens exactly.

mod common;

use common::*;

fn check_model(name: &str) {
    let g = golden(&format!("{name}.json"));
    let mut lm = load(&fixtures().join(name), false);
    for p in g["prompts"].as_array().unwrap() {
        let input = ids(&p["input_ids"]);
        assert_logits_match(name, lm.model.as_mut(), p);
        let mut pipe = augur::pipeline::Pipeline {
            target: load(&fixtures().join(name), false),
            assistant: None,
            defaults: Default::default(),
        };
        let want = ids(&p["greedy"]);
        let got = pipe.generate_ids(&input, &greedy(want.len()), None).unwrap();
        assert_eq!(got.tokens, want, "{name} greedy on {:?}", p["text"]);
    }
}

#[test]
fn tiny_llama_matches_transformers() {
    check_model("tiny-llama");
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_model("tiny-qwen2");
}

#[test]
fn tiny_gemma3_matches_transformers() {
    check_model("tiny-gemma3");
}
