//! Golden tests against Transformers 5.24 on the tiny random checkpoints of every architecture: logits to
//! 1e-4 relative in f32, greedy tokens exactly.

mod common;

use augur::model::{ForwardOptions, LogitRows};
use common::*;

fn check_model(name: &str) {
    let g = golden(&format!("{name}.json"));
    let mut lm = load(&fixtures().join(name), false);
    for p in g["prompts"].as_array().unwrap() {
        let input = ids(&p["input_ids"]);
        lm.model.truncate(0);
        let out = lm.model.forward(&input, &ForwardOptions::logits(LogitRows::All)).unwrap();
        let ours: Vec<Vec<f32>> = out.logits.unwrap().to_vec2().unwrap();
        let theirs = p["logits"].as_array().unwrap();
        assert_eq!(ours.len(), theirs.len());
        for (pos, (a, b)) in ours.iter().zip(theirs).enumerate() {
            let b: Vec<f32> = b.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
            let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
            let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst <= 1e-4 * scale.max(1.0), "{name} {:?} position {pos}: max diff {worst} (scale {scale})", p["text"]);
        }
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
