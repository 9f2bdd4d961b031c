//! Bad input gets a clear error naming the problem, never a panic.

mod common;

use std::path::Path;

use augur::generation::config::GenerationOptions;
use augur::models::ModelConfig;
use common::*;

fn copy_fixture(name: &str, to: &Path) {
    for f in std::fs::read_dir(fixtures().join(name)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
    }
}

#[test]
fn truncated_gguf() {
    let d = scratch("trunc");
    let bytes = std::fs::read(real_model("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let f = d.join("t.gguf");
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err(&f);
    assert!(e.contains("truncated") && e.contains("t.gguf"), "{e}");
}

#[test]
fn wrong_magic() {
    let d = scratch("magic");
    let f = d.join("m.gguf");
    std::fs::write(&f, b"NOPE\x03\x00\x00\x00 and more bytes").unwrap();
    let e = load_err(&f);
    assert!(e.contains("not a valid GGUF") && e.contains("m.gguf"), "{e}");
}

#[test]
fn missing_tensor() {
    let d = scratch("missing");
    copy_fixture("tiny-llama", &d);
    // Rewrite the safetensors without one tensor.
    let st = std::fs::read(d.join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&st).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView)> =
        tensors.tensors().into_iter().filter(|(n, _)| n != "model.layers.1.mlp.up_proj.weight").collect();
    safetensors::serialize_to_file(kept, None, &d.join("model.safetensors")).unwrap();
    let e = load_err(&d);
    assert!(e.contains("model.layers.1.mlp.up_proj.weight") && e.contains("missing"), "{e}");
}

#[test]
fn shapes_that_contradict_the_config() {
    let d = scratch("shape");
    copy_fixture("tiny-llama", &d);
    let cfg = std::fs::read_to_string(d.join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    v["intermediate_size"] = serde_json::json!(v["intermediate_size"].as_u64().unwrap() + 8);
    std::fs::write(d.join("config.json"), v.to_string()).unwrap();
    let e = load_err(&d);
    assert!(e.contains("has shape") && e.contains("mlp"), "{e}");
}

#[test]
fn unknown_architecture() {
    let e = ModelConfig::from_hf_json(r#"{"model_type": "mamba", "hidden_size": 8}"#).unwrap_err().to_string();
    assert!(e.contains("unknown architecture `mamba`") && e.contains("llama"), "{e}");
}

#[test]
fn missing_files() {
    let e = load_err(Path::new("/no/such/model.gguf"));
    assert!(e.contains("/no/such/model.gguf"), "{e}");
    let d = scratch("nocfg");
    let e = load_err(&d);
    assert!(e.contains("config.json"), "{e}");
}

#[test]
fn prompt_longer_than_the_context() {
    let mut pipe = pipeline("tiny-llama", None);
    let context = pipe.target.config().max_position_embeddings;
    let e = pipe.generate_ids(&vec![5; context + 3], &greedy(4), None).unwrap_err().to_string();
    assert!(e.contains(&format!("{} tokens", context + 3)) && e.contains(&context.to_string()), "{e}");
}

#[test]
fn conflicting_options() {
    let mut pipe = pipeline("tiny-llama", None);
    let o = GenerationOptions { prompt_lookup_num_tokens: Some(3), assistant_ensemble_weight: Some(0.5), ..greedy(4) };
    let e = pipe.generate_ids(&[1, 2, 3], &o, None).unwrap_err().to_string();
    assert!(e.contains("assistant_ensemble_weight") && e.contains("prompt lookup"), "{e}");
    let o = GenerationOptions { do_sample: Some(true), temperature: Some(0.0), ..greedy(4) };
    let e = pipe.generate_ids(&[1, 2, 3], &o, None).unwrap_err().to_string();
    assert!(e.contains("temperature"), "{e}");
    let o = GenerationOptions { prompt_lookup_num_tokens: Some(0), ..greedy(4) };
    let e = pipe.generate_ids(&[1, 2, 3], &o, None).unwrap_err().to_string();
    assert!(e.contains("Invalid max_matching_ngram_size or num_output_tokens"), "{e}");
    let o = GenerationOptions { use_mtp: Some(true), ..greedy(4) };
    let e = pipe.generate_ids(&[1, 2, 3], &o, None).unwrap_err().to_string();
    assert!(e.contains("num_mtp_layers"), "{e}");
}

#[test]
fn token_outside_the_vocabulary() {
    let mut pipe = pipeline("tiny-llama", None);
    let e = pipe.generate_ids(&[1, 99_999], &greedy(4), None).unwrap_err().to_string();
    assert!(e.contains("99999") && e.contains("vocabulary"), "{e}");
}
