//! Causal language models built for speculation: a forward pass takes a block of new tokens at the cache
//! position and returns logits for every position asked for, hidden states, or an early layer's output; the
//! cache can be cut back to any length.

pub mod config;
mod gemma3;
pub mod kv_cache;
pub mod layers;
mod llama;
mod qwen2;
pub mod weights;

use std::path::Path;

use candle_core::{Device, Tensor};

pub use config::{Architecture, ModelConfig};
pub use weights::Weights;

use crate::error::{Error, Result};

pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "qwen2", "gemma3"];

/// Which positions of a forward block get logits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogitRows {
    All,
    /// The last `n` positions (a verification block needs `drafts + 1`).
    Last(usize),
    None,
}

#[derive(Debug, Clone)]
pub struct ForwardOptions {
    pub logits: LogitRows,
    /// Also return the final hidden states (after the final norm), `[t, hidden]`.
    pub hidden_states: bool,
    /// Run only the first `L` layers, then the final norm and LM head (early-exit drafting). The cache of the
    /// skipped layers is left as it was and `cache_len` does not advance.
    pub exit_layer: Option<usize>,
}

impl ForwardOptions {
    pub fn logits(rows: LogitRows) -> Self {
        Self { logits: rows, hidden_states: false, exit_layer: None }
    }
}

pub struct ForwardOutput {
    /// `[rows, vocab]`, f32.
    pub logits: Option<Tensor>,
    /// `[t, hidden]`, after the final norm.
    pub hidden: Option<Tensor>,
}

/// A causal language model: shared weights plus one sequence's KV cache.
pub trait CausalLm: Send {
    fn config(&self) -> &ModelConfig;
    /// Runs `tokens` at positions `cache_len()..`, appending to the cache.
    fn forward(&mut self, tokens: &[u32], opts: &ForwardOptions) -> Result<ForwardOutput>;
    /// Forgets every cached position from `len` on.
    fn truncate(&mut self, len: usize);
    fn cache_len(&self) -> usize;
    /// Another sequence over the same weights (shared, not copied), with an empty cache: how several requests
    /// run against one loaded model.
    fn fork(&self) -> Box<dyn CausalLm>;
}

/// Builds the model for `cfg.architecture`: the architecture registry.
pub fn build(cfg: ModelConfig, w: &Weights) -> Result<Box<dyn CausalLm>> {
    match cfg.architecture {
        Architecture::Llama => Ok(Box::new(llama::load(cfg, w)?)),
        Architecture::Qwen2 => Ok(Box::new(qwen2::load(cfg, w)?)),
        Architecture::Gemma3 => Ok(Box::new(gemma3::load(cfg, w)?)),
    }
}

/// A loaded model with what was read alongside it.
pub struct LoadedModel {
    pub model: Box<dyn CausalLm>,
    pub weights_info: WeightsInfo,
    /// The GGUF metadata, when the model came from a GGUF file (it also holds the tokenizer).
    pub gguf: Option<std::sync::Arc<candle_core::quantized::gguf_file::Content>>,
}

/// What `augur info` reports about the stored weights.
#[derive(Debug, Clone)]
pub struct WeightsInfo {
    pub format: &'static str,
    pub parameters: usize,
    /// Storage types with their tensor counts, most frequent first.
    pub dtypes: Vec<(String, usize)>,
}

fn info(w: &Weights) -> WeightsInfo {
    let mut dtypes: Vec<_> = w.dtype_summary().into_iter().collect();
    dtypes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    WeightsInfo { format: if w.is_gguf() { "gguf" } else { "safetensors" }, parameters: w.parameter_count(), dtypes }
}

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Dequantize GGUF weights to f32 (slow; the reference path for comparisons with Transformers, which
    /// dequantizes GGUF files too).
    pub dequantize: bool,
}

/// Loads a GGUF file or a Hugging Face model directory.
pub fn load(path: &Path, device: &Device) -> Result<LoadedModel> {
    load_with(path, device, &LoadOptions::default())
}

pub fn load_with(path: &Path, device: &Device, opts: &LoadOptions) -> Result<LoadedModel> {
    if path.is_dir() {
        let cfg = ModelConfig::from_hf_file(&path.join("config.json"))?;
        let mut w = Weights::open_safetensors(path, cfg.architecture, device)?;
        w.dequantize = opts.dequantize;
        let weights_info = info(&w);
        Ok(LoadedModel { model: build(cfg, &w)?, weights_info, gguf: None })
    } else if path.is_file() {
        let (mut w, content) = Weights::open_gguf(path, device)?;
        w.dequantize = opts.dequantize;
        let mut cfg = ModelConfig::from_gguf(&content)?;
        if w.contains("rope_freqs.weight") {
            let f = w.f32("rope_freqs.weight", &[cfg.head_dim / 2])?.to_vec1::<f32>()?;
            cfg.rope_scaling = config::RopeScaling::Factors(f);
        }
        let weights_info = info(&w);
        Ok(LoadedModel { model: build(cfg, &w)?, weights_info, gguf: Some(content) })
    } else {
        Err(Error::ModelNotFound(path.display().to_string()))
    }
}
