//! The entry points of the fuzz targets (`fuzz/` at the repository root) and of the test that replays their
//! corpora (`tests/fuzz_corpus.rs`), so that `cargo test` checks every saved input without nightly or libFuzzer.
//!
//! Each takes arbitrary bytes, runs them through the loader's own parsing as a downloaded file would be, and
//! returns the first error. Whatever the bytes, it must return: a panic, a hang or an abort is a finding.

use std::path::Path;

use crate::config::{Architecture, Gemma4Config, LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::io::{gguf, weights};
use crate::nn::rope::{Rope, Ropes};
use crate::tokenizer::{ChatMessage, Tokenizer};

/// The name fuzzed bytes go by in errors.
const FILE: &str = "fuzz-input";

/// GGUF header, metadata and tensor table, then the model config from the metadata.
pub fn gguf_config(data: &[u8]) -> Result<()> {
    let path = Path::new(FILE);
    let content = gguf::read(&mut &data[..], data.len() as u64, path)?;
    let cfg = ModelConfig::from_gguf_file(&content, path)?;
    tables(&cfg)
}

/// What a model builds from its config before any weight: the rotary tables of both layer kinds, each applied
/// once to a query head (and Gemma 4's per-kind tables over its per-kind head shapes), and the attention scale.
fn tables(cfg: &ModelConfig) -> Result<()> {
    let _ = cfg.attention_scale();
    let ropes = Ropes::new(cfg)?;
    let rotate = |rope: &Rope, head_dim: usize| -> Result<()> {
        let (cos, sin) = rope.cos_sin(0, 1, &candle_core::Device::Cpu)?;
        let (cos, sin) = (cos.flatten_all()?.to_vec1::<f32>()?, sin.flatten_all()?.to_vec1::<f32>()?);
        rope.rotate(&mut vec![0.0; head_dim], 1, head_dim, &cos, &sin);
        Ok(())
    };
    rotate(&ropes.full, cfg.head_dim)?;
    rotate(&ropes.sliding, cfg.head_dim)?;
    if matches!(cfg.architecture, Architecture::Gemma4 | Architecture::Gemma4Assistant) {
        let g = Gemma4Config::from_model_config(cfg)?;
        for kind in [LayerKind::Full, LayerKind::Sliding] {
            let (head_dim, _) = g.head_shape(cfg, kind);
            rotate(&g.rope(cfg, kind)?, head_dim)?;
        }
        if cfg.architecture == Architecture::Gemma4 {
            g.kv_sources(cfg)?;
        }
    }
    Ok(())
}

/// GGUF metadata, then the tokenizer rebuilt from it, used once each way.
pub fn gguf_tokenizer(data: &[u8]) -> Result<()> {
    let path = Path::new(FILE);
    let content = gguf::read(&mut &data[..], data.len() as u64, path)?;
    let tok = Tokenizer::from_gguf(&content, path)?;
    let ids = tok.encode("Hello, world!  12345 \u{2581}caf\u{e9} <0x41>\n\tend", true)?;
    tok.decode(&ids, false)?;
    tok.decode(&ids, true)?;
    Ok(())
}

/// `config.json` → model config (every architecture), and Gemma 4's own fields where it is Gemma 4.
pub fn config_json(data: &[u8]) -> Result<()> {
    let text = std::str::from_utf8(data).map_err(|e| Error::config("config.json", e.to_string()))?;
    let cfg = ModelConfig::from_hf_json(text)?;
    tables(&cfg)
}

/// A sharded checkpoint's `model.safetensors.index.json` where the bytes start with `{`, else a safetensors file
/// (header and tensors).
pub fn safetensors(data: &[u8]) -> Result<()> {
    if data.first() == Some(&b'{') {
        let text =
            std::str::from_utf8(data).map_err(|e| Error::config("model.safetensors.index.json", e.to_string()))?;
        let dir = Path::new("model");
        weights::shard_paths(dir, &dir.join("model.safetensors.index.json"), text)?;
    } else {
        candle_core::safetensors::load_buffer(data, &candle_core::Device::Cpu)?;
    }
    Ok(())
}

/// A chat template and a conversation: the bytes up to the first NUL are the template, the rest NUL-separated
/// role and content strings; the first byte's low bit is `add_generation_prompt`.
pub fn chat_template(data: &[u8]) -> Result<()> {
    let mut parts = data.split(|&b| b == 0).map(String::from_utf8_lossy);
    let template = parts.next().unwrap_or_default();
    let rest: Vec<_> = parts.collect();
    let messages: Vec<ChatMessage> =
        rest.chunks(2).map(|m| ChatMessage::new(m[0].as_ref(), m.get(1).map_or("", |c| c.as_ref()))).collect();
    let add_generation_prompt = data.first().is_some_and(|b| b & 1 == 1);
    let specials = [("bos_token", Some("<s>")), ("eos_token", Some("</s>")), ("pad_token", None), ("unk_token", None)];
    crate::tokenizer::chat::render_with(&template, &messages, add_generation_prompt, &specials)?;
    Ok(())
}
