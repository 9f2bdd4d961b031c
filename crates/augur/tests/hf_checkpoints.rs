//! Hugging Face checkpoints in their own bytes: f32, f16 and bf16 safetensors are multiplied where they lie (the
//! mapped file, never widened in memory) by `kernels::dense`, their greedy text is the text of the same weights
//! widened to f32 and multiplied by candle, a process holds little more than the file, and `--quantize` turns
//! the float weights into quantized ones at load (lossy), refused for GGUF files.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use augur::io::weights::Weights;
use augur::models::{Architecture, LoadOptions, QuantizeOnLoad};
use augur::nn::{Embedding, LinearPath};
use augur::pipeline::{LoadedLm, Pipeline};
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use common::{fixtures, greedy, scratch, write_random_llama, RandomLlama};

/// The fixture `name` with every float tensor stored as `dtype`.
fn fixture_as(name: &str, dtype: DType) -> PathBuf {
    let src = fixtures().join(name);
    let dir = scratch(&format!("{name}-{dtype:?}"));
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    let tensors: HashMap<String, Tensor> = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(k, t)| (k, if t.dtype().is_float() { t.to_dtype(dtype).unwrap() } else { t }))
        .collect();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    dir
}

fn load(path: &Path, opts: LoadOptions) -> LoadedLm {
    LoadedLm::load(path, &opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Greedy tokens of `path` loaded under `opts` after each of two prompts.
fn greedy_text(path: &Path, opts: LoadOptions) -> Vec<Vec<u32>> {
    let mut pipe = Pipeline { target: load(path, opts), assistant: None, defaults: Default::default() };
    [vec![1u32, 5, 9, 3], vec![7u32, 7, 2, 11, 4, 30, 6]]
        .iter()
        .map(|prompt| pipe.generate_ids(prompt, &greedy(40), None).unwrap().tokens)
        .collect()
}

fn own(dtype: DType) -> LinearPath {
    LinearPath::Own(match dtype {
        DType::F16 => GgmlDType::F16,
        DType::BF16 => GgmlDType::BF16,
        _ => GgmlDType::F32,
    })
}

/// Every product of an f32, f16 or bf16 checkpoint (attention with and without biases, the MLP, a tied or own
/// LM head) runs in the stored type, the embedding table stays in the file, and the greedy text is the text of
/// the dequantized load (the same weights widened to f32 in memory, multiplied by candle).
#[test]
fn float_checkpoints_multiply_in_their_own_type_and_keep_the_f32_text() {
    for (name, arch) in [
        ("tiny-llama", Architecture::Llama),
        ("tiny-qwen2", Architecture::Qwen2),
        ("tiny-gemma3", Architecture::Gemma3),
    ] {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let dir = fixture_as(name, dtype);
            let w = Weights::open_safetensors(&dir, arch, &Device::Cpu).unwrap();
            let cfg = augur::models::ModelConfig::from_hf_file(&dir.join("config.json")).unwrap();
            let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
            for (prefix, out, inp) in [("model.layers.0.mlp.up_proj", i, h), ("model.layers.0.mlp.down_proj", h, i)] {
                assert_eq!(w.linear(prefix, out, inp, false).unwrap().path(), own(dtype), "{name} {dtype:?} {prefix}");
            }
            let embed = w.embedding("model.embed_tokens.weight", cfg.vocab_size, h).unwrap();
            assert!(matches!(embed, Embedding::Rows { .. }), "{name} {dtype:?}: the table is read where it lies");
            assert_eq!(embed.as_linear(&w).unwrap().path(), own(dtype), "{name} {dtype:?}: tied head");
            let mut reference = Weights::open_safetensors(&dir, arch, &Device::Cpu).unwrap();
            reference.dequantize = true;
            let up = reference.linear("model.layers.0.mlp.up_proj", i, h, false).unwrap();
            assert_eq!(up.path(), LinearPath::Dense, "the reference is candle's f32 product");
            let ours = greedy_text(&dir, LoadOptions::default());
            let widened = greedy_text(&dir, LoadOptions { dequantize: true, ..Default::default() });
            assert_eq!(ours, widened, "{name} {dtype:?}: greedy text against the f32 path");
        }
    }
}

/// `--quantize`: a checkpoint's float weights become Q8_0 or Q4_K (Q8_0 where a row is not whole super-blocks),
/// the text still comes out, and a GGUF file refuses it.
#[test]
fn quantize_on_load_takes_float_checkpoints_only() {
    let dir = fixture_as("tiny-llama", DType::BF16);
    for q in [QuantizeOnLoad::Q8_0, QuantizeOnLoad::Q4K] {
        let mut w = Weights::open_safetensors(&dir, Architecture::Llama, &Device::Cpu).unwrap();
        w.quantize = Some(q);
        // tiny-llama's rows are 64 wide: too narrow for Q4_K's 256-element super-blocks.
        let path = w.linear("model.layers.0.mlp.up_proj", 128, 64, false).unwrap().path();
        assert!(matches!(path, LinearPath::Own(GgmlDType::Q8_0) | LinearPath::Candle(GgmlDType::Q8_0)), "{path:?}");
        let lm = load(&dir, LoadOptions { quantize: Some(q), ..Default::default() });
        assert_eq!(lm.weights.quantized_on_load, Some(q));
        assert_eq!(greedy_text(&dir, LoadOptions { quantize: Some(q), ..Default::default() })[0].len(), 40);
    }
    assert_eq!(QuantizeOnLoad::parse("Q4_K").unwrap(), QuantizeOnLoad::Q4K);
    let err = QuantizeOnLoad::parse("q3").unwrap_err().to_string();
    assert!(err.contains("q3") && err.contains("q8_0, q4_k"), "{err}");
    let gguf = common::real_model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let opts = LoadOptions { quantize: Some(QuantizeOnLoad::Q8_0), ..Default::default() };
    let err = LoadedLm::load(&gguf, &opts).err().expect("a GGUF file refuses --quantize").to_string();
    assert!(err.contains("GGUF") && err.contains("q8_0"), "{err}");
}

/// The peak resident memory of this process (`VmHWM`), in bytes.
#[cfg(target_os = "linux")]
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/self/status");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Loading a bf16 checkpoint and decoding with it raises this process's peak resident memory by at most the
/// file plus 10% (the KV cache of a few tokens is small): widening the weights to f32, as the dequantized
/// load does, would take twice the file. Runs in a child process of its own, where no other test's memory
/// counts.
#[cfg(target_os = "linux")]
#[test]
fn a_bf16_checkpoint_holds_no_more_than_its_file() {
    if let Ok(dir) = std::env::var("AUGUR_RSS_CHILD") {
        let dequantize = std::env::var("AUGUR_RSS_DEQUANTIZE").is_ok();
        let before = peak_rss();
        let opts = LoadOptions { dequantize, ..Default::default() };
        let mut model = augur::models::load(Path::new(&dir), &Device::Cpu, &opts, |_| Ok(())).unwrap().0.model;
        let forward = augur::models::ForwardOptions::logits(augur::models::LogitRows::Last(1));
        for token in [1u32, 2, 3, 4] {
            model.forward(&[token], &forward).unwrap();
        }
        println!("\nAUGUR_RSS_GROWTH={}", peak_rss() - before);
        return;
    }
    let dir = scratch("large-bf16");
    // A llama-shaped bf16 checkpoint of about 100 MB.
    let shape = RandomLlama { hidden: 1024, intermediate: 2816, layers: 4, vocab: 16384, max_positions: 512 };
    write_random_llama(&dir, &shape);
    let file = std::fs::metadata(dir.join("model.safetensors")).unwrap().len();
    let growth = |dequantize: bool| -> u64 {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child.args(["--exact", "a_bf16_checkpoint_holds_no_more_than_its_file", "--nocapture", "--test-threads=1"]);
        child.env("AUGUR_RSS_CHILD", &dir);
        if dequantize {
            child.env("AUGUR_RSS_DEQUANTIZE", "1");
        }
        let out = child.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {text}{}", String::from_utf8_lossy(&out.stderr));
        let line = text.lines().find_map(|l| l.split("AUGUR_RSS_GROWTH=").nth(1)).expect("the child's growth");
        line.trim().parse().unwrap()
    };
    let ours = growth(false);
    assert!(ours as f64 <= file as f64 * 1.1, "peak RSS grew by {ours} bytes for a {file}-byte file");
    let widened = growth(true);
    assert!(widened as f64 > file as f64 * 1.5, "the widened load should be the test's foil: {widened} for {file}");
    std::fs::remove_dir_all(&dir).unwrap();
}
