//! Shared helpers of the integration tests: fixture and model locations, JSON loading, pipelines.
#![allow(dead_code)]

use std::path::PathBuf;

use augur::generation::config::GenerationOptions;
use augur::model::LoadOptions;
use augur::pipeline::{LoadedLm, Pipeline};
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

/// A real model file in augur's model cache; fails (never skips) when it was not fetched.
pub fn real_model(file: &str) -> PathBuf {
    let p = augur::resolve::models_dir().join(file);
    assert!(
        p.exists(),
        "{} is missing: run `bash ../shared/models/fetch-models.sh {}` (as .ci/run does)",
        p.display(),
        augur::resolve::models_dir().display()
    );
    p
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("array of ids").iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn load(path: &std::path::Path, dequantize: bool) -> LoadedLm {
    LoadedLm::load_with(path, &augur::Device::Cpu, &LoadOptions { dequantize })
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn pipeline(target: &str, assistant: Option<&str>) -> Pipeline {
    let t = load(&fixtures().join(target), false);
    let a = assistant.map(|a| load(&fixtures().join(a), false));
    Pipeline { target: t, assistant: a, defaults: GenerationOptions::default() }
}

/// Greedy options with EOS never stopping (as the goldens were recorded).
pub fn greedy(max_new_tokens: usize) -> GenerationOptions {
    GenerationOptions { max_new_tokens: Some(max_new_tokens), eos_token_id: Some(vec![]), ..Default::default() }
}
