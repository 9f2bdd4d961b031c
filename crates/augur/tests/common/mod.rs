//! Shared helpers of the integration tests: fixture and model locations, JSON loading, pipelines.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use augur::generation::config::GenerationOptions;
use augur::models::LoadOptions;
use augur::pipeline::{Assistant, LoadedLm, Pipeline};
use serde_json::Value;

/// `tests/fixtures` at the repository root: the tiny checkpoints and goldens written by
/// `tools/fixtures/generate.py`.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

pub fn golden(name: &str) -> Value {
    let p = fixtures().join("golden").join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// The Spec-Bench prompt set, kept in the repository (`data/spec_bench`).
pub fn spec_bench_questions() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/spec_bench/question.jsonl")
}

/// A real model file in augur's model cache; fails (never skips) when it was not pulled, naming the command.
pub fn real_model(file: &str) -> PathBuf {
    let p = augur::io::resolve::models_dir().join(file);
    assert!(p.exists(), "{} is missing: {}", p.display(), pull_hint(file));
    p
}

/// How to get the catalogue file `file` into the cache (as `.ci/run` does).
pub fn pull_hint(file: &str) -> String {
    let name = augur::io::catalogue::find(file).map_or(file, |m| m.name);
    format!("run `cargo run --release -p augur-cli -- pull {name}` (as .ci/run does)")
}

/// An empty scratch directory of this test process, named `name`.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("augur-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The error that loading `path` gives (a panic if it loads).
pub fn load_err(path: &std::path::Path) -> String {
    match augur::models::load(path, &augur::Device::Cpu, &LoadOptions::default(), |_| Ok(())) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("array of ids").iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn load(path: &std::path::Path, dequantize: bool) -> LoadedLm {
    LoadedLm::load(path, &LoadOptions { dequantize, ..Default::default() })
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn pipeline(target: &str, assistant: Option<&str>) -> Pipeline {
    pipeline_at(&fixtures().join(target), assistant.map(|a| fixtures().join(a)).as_deref())
}

/// A pipeline of the target at `target` and the assistant at `assistant`, directories or files.
pub fn pipeline_at(target: &std::path::Path, assistant: Option<&std::path::Path>) -> Pipeline {
    let t = load(target, false);
    let a = assistant.map(|path| {
        Assistant::load(path, &Default::default(), &t.tokenizer).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    });
    Pipeline { target: t, assistant: a, defaults: GenerationOptions::default() }
}

/// Greedy options with EOS never stopping (as the goldens were recorded).
pub fn greedy(max_new_tokens: usize) -> GenerationOptions {
    GenerationOptions { max_new_tokens: Some(max_new_tokens), eos_token_id: Some(vec![]), ..Default::default() }
}

/// Token ids below `vocab` from a xorshift generator seeded with `seed`: reproducible test prompts.
pub fn token_stream(seed: u64, vocab: u32) -> impl FnMut() -> u32 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % vocab as u64) as u32
    }
}

/// Seeded draws per distribution in the chi-square tests.
pub const DRAWS: usize = 3000;

/// A prompt over the tiny fixtures' vocabulary for the sampling tests.
pub const SAMPLING_PROMPT: [u32; 9] = [297, 346, 370, 319, 265, 280, 297, 346, 370];

/// The sampling tests' options: two tokens from a top-6 distribution at temperature 1.5 (a few dozen
/// continuations, each drawn often enough in [`DRAWS`] draws), three drafts a round, no confidence stop.
pub fn sampling(seed: u64) -> GenerationOptions {
    GenerationOptions {
        do_sample: Some(true),
        top_k: Some(6),
        temperature: Some(1.5),
        seed: Some(seed),
        num_assistant_tokens: Some(3),
        assistant_confidence_threshold: Some(0.0),
        ..greedy(2)
    }
}

/// How often each continuation comes out of `draws` seeded draws (seeds `0..draws`).
pub fn histogram(draws: usize, mut draw: impl FnMut(u64) -> Vec<u32>) -> HashMap<Vec<u32>, usize> {
    let mut h = HashMap::new();
    for seed in 0..draws as u64 {
        *h.entry(draw(seed)).or_default() += 1;
    }
    h
}

/// Chi-square statistic of two samples of equal size, and its critical value at α = 0.001 (Wilson–Hilferty).
pub fn chi_square(a: &HashMap<Vec<u32>, usize>, b: &HashMap<Vec<u32>, usize>) -> (f64, f64) {
    let mut keys: Vec<&Vec<u32>> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    // Pool rare categories so that every expected count is at least 5.
    let (mut stat, mut df, mut pooled) = (0.0, 0usize, (0.0, 0.0));
    let cell = |x: f64, y: f64, stat: &mut f64, df: &mut usize| {
        *stat += (x - y) * (x - y) / (x + y);
        *df += 1;
    };
    for k in keys {
        let (x, y) = (*a.get(k).unwrap_or(&0) as f64, *b.get(k).unwrap_or(&0) as f64);
        if x + y < 10.0 {
            pooled = (pooled.0 + x, pooled.1 + y);
        } else {
            cell(x, y, &mut stat, &mut df);
        }
    }
    if pooled.0 + pooled.1 > 0.0 {
        cell(pooled.0, pooled.1, &mut stat, &mut df);
    }
    let k = (df - 1) as f64;
    let z = 3.090; // one-sided 0.001 quantile of the standard normal
    let critical = k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3);
    (stat, critical)
}

/// The model's logits at every position of the golden prompt `p["input_ids"]` are within 1e-4 (relative to the
/// row's largest magnitude, at least 1) of Transformers' `p["logits"]`.
pub fn assert_logits_match(name: &str, model: &mut dyn augur::models::CausalLm, p: &Value) {
    use augur::models::{ForwardOptions, LogitRows};
    model.truncate(0);
    let out = model.forward(&ids(&p["input_ids"]), &ForwardOptions::logits(LogitRows::All)).unwrap();
    let ours: Vec<Vec<f32>> = out.logits.unwrap().to_vec2().unwrap();
    let theirs = p["logits"].as_array().unwrap();
    assert_eq!(ours.len(), theirs.len());
    for (pos, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let b: Vec<f32> = b.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(
            worst <= 1e-4 * scale.max(1.0),
            "{name} {:?} position {pos}: max diff {worst} (scale {scale})",
            p["text"]
        );
    }
}

/// With an ensemble weight, greedy drafts are verified against `ν = w·p + (1−w)·q`, as in Transformers 5.24
/// (which returns the drafter's logits in greedy mode too). At w = 0.001, ν is almost q, whose argmax each draft
/// is, so nearly every draft is kept: far more than lossless verification with `base` keeps.
pub fn assert_greedy_ensemble_is_applied(target: &str, assistant: Option<&str>, base: GenerationOptions) {
    let mut pipe = pipeline(target, assistant);
    let input = [297, 346, 370, 319, 265, 280];
    let lossless = pipe.generate_ids(&input, &base, None).unwrap();
    let mixed = GenerationOptions { assistant_ensemble_weight: Some(0.001), ..base };
    let out = pipe.generate_ids(&input, &mixed, None).unwrap();
    let rate = |o: &augur::generation::output::GenerationOutput| o.stats.accepted as f64 / o.stats.drafted as f64;
    assert!(lossless.stats.drafted > 10 && out.stats.drafted > 10, "{target}: too few drafts");
    let (with, without) = (rate(&out), rate(&lossless));
    assert!(with > 0.95 && without < 0.8, "{target}: acceptance {with} with w, {without} without");
}

pub mod exact;

/// The shape of a llama-architecture checkpoint of random weights: 4 query heads per key/value head, head
/// dimension `hidden / 16`, tied embeddings, stored as bf16.
pub struct RandomLlama {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub vocab: usize,
    pub max_positions: usize,
}

/// Writes `config.json` and `model.safetensors` of a [`RandomLlama`] into `dir` (weights uniform in ±0.05 from
/// a fixed xorshift seed, norms 1): a model as costly as a test needs, without a committed file.
pub fn write_random_llama(dir: &std::path::Path, shape: &RandomLlama) {
    use candle_core::{DType, Device, Tensor};
    let RandomLlama { hidden: h, intermediate: f, layers, vocab, max_positions } = *shape;
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": f, "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": layers,
        "vocab_size": vocab, "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu", "torch_dtype": "bfloat16",
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap()
    };
    let ones = || Tensor::ones(h, DType::BF16, &Device::Cpu).unwrap();
    let mut t: HashMap<String, Tensor> = HashMap::new();
    t.insert("model.embed_tokens.weight".into(), random(&[vocab, h]));
    t.insert("model.norm.weight".into(), ones());
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("self_attn.q_proj", [h, h]),
            ("self_attn.k_proj", [h / 4, h]),
            ("self_attn.v_proj", [h / 4, h]),
            ("self_attn.o_proj", [h, h]),
            ("mlp.gate_proj", [f, h]),
            ("mlp.up_proj", [f, h]),
            ("mlp.down_proj", [h, f]),
        ] {
            t.insert(format!("{p}.{name}.weight"), random(&shape));
        }
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            t.insert(format!("{p}.{norm}.weight"), ones());
        }
    }
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
}
