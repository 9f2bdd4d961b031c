//! Causal language models built for speculation: a forward pass takes a block of new tokens at the cache
//! position and returns logits for every position asked for, hidden states, or an early layer's output; the
//! cache can be cut back to any length.

pub mod batching;
pub mod decoder;
mod deepseek_v3;
mod gemma3;
pub mod gemma4;
pub mod gemma4_assistant;
mod glm4_moe;
mod llama;
mod moe_block;
pub mod mtp;
mod qwen2;
mod registry;

use std::path::Path;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};

pub use crate::config::SUPPORTED_ARCHITECTURES;
pub use registry::build;

pub use crate::config::{Architecture, LayerKind, ModelConfig};
use crate::error::{Error, Result};
pub use crate::io::weights::{QuantizeOnLoad, Weights};
use crate::nn::{KvCache, TreeMask};

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
    /// Run only the first `L` layers (`1 ≤ L < num_layers`), then the final norm and LM head: early-exit
    /// drafting. The tokens go after the positions those layers already hold; `cache_len` does not advance. The
    /// next full forward reuses these positions where its tokens match them and discards the rest, and
    /// `truncate` cuts them back like any cached position.
    pub exit_layer: Option<usize>,
    /// Logits for these token ids only (`[rows, ids.len()]`, in [`HeadSubset::ids`]' order), each as the full
    /// head computes it: a drafter's reduced vocabulary (see the assistant drafter).
    pub head: Option<std::sync::Arc<HeadSubset>>,
    /// The block's rows as a tree (one entry per token): tree verification. Each row attends to the cache and
    /// its ancestors and sits at its depth; [`CausalLm::keep_path`] then keeps one path. `None`: causal.
    pub tree: Option<std::sync::Arc<TreeMask>>,
}

impl ForwardOptions {
    pub fn logits(rows: LogitRows) -> Self {
        Self { logits: rows, hidden_states: false, exit_layer: None, head: None, tree: None }
    }
}

/// An LM head over a subset of the vocabulary: the head's rows `ids` gathered into `parts` (each a
/// [`CausalLm::head_part`]), whose outputs, one after the other, are the logits of `ids`.
pub struct HeadSubset {
    pub ids: Vec<u32>,
    pub parts: Vec<std::sync::Arc<crate::nn::Linear>>,
}

impl std::fmt::Debug for HeadSubset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HeadSubset({} ids in {} parts)", self.ids.len(), self.parts.len())
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
    /// Whether [`ForwardOptions::tree`] forwards and [`CausalLm::keep_path`] work on this model.
    fn supports_tree(&self) -> bool {
        false
    }
    /// After a tree forward: keeps the positions `start + keep[i]` (`keep` increasing: the accepted path's
    /// rows), moved to `start + i`, and forgets every other position from `start` on.
    fn keep_path(&mut self, start: usize, keep: &[usize]) -> Result<()> {
        if keep.iter().enumerate().all(|(i, &k)| i == k) {
            self.truncate(start + keep.len());
            return Ok(());
        }
        Err(Error::InvalidOption(format!("{} models do not verify trees", self.config().architecture.name())))
    }
    /// Another sequence over the same weights (shared, not copied), with an empty cache: how several requests
    /// run against one loaded model.
    fn fork(&self) -> Result<Box<dyn CausalLm>> {
        Err(Error::InvalidOption(format!(
            "{} models cannot be forked into concurrent sequences",
            self.config().architecture.name()
        )))
    }
    /// How many forwards of this model and its forks ran batched with another fork's.
    fn batched_forwards(&self) -> u64 {
        0
    }
    /// The KV that the model shares with a drafter that reads it (Gemma 4's assistant), if it shares any.
    fn kv_sharing(&self) -> Option<Box<dyn KvSharing + '_>> {
        None
    }
    /// The LM head's rows `ids` as a layer of their own, for a [`HeadSubset`]; `keep`: kept on the model for the
    /// next call with the same ids (a drafter's fixed set, not a request's own). `None` where the head's weight
    /// cannot be gathered (then drafters use the whole head).
    fn head_part(&self, _ids: &[u32], _keep: bool) -> Result<Option<std::sync::Arc<crate::nn::Linear>>> {
        Ok(None)
    }
}

/// A model that keeps KV for layers of another kind to reuse (Gemma 4's store layers), which its assistant
/// reads, and embeds tokens for that assistant with its own table.
pub trait KvSharing {
    /// The cache that layers of `kind` reuse.
    fn shared_kv(&self, kind: LayerKind) -> Option<&KvCache>;
    /// The model's scaled input embeddings of `tokens`, `[t, hidden]`.
    fn embed_tokens(&self, tokens: &[u32]) -> Result<Tensor>;
}

/// What the registry builds: the model and, for checkpoints with them, the MTP layers (the MTP drafter's).
pub struct Built {
    pub model: Box<dyn CausalLm>,
    pub mtp: Option<Box<dyn mtp::MtpHead>>,
}

/// A loaded model with what was read alongside it.
pub struct LoadedModel {
    pub model: Box<dyn CausalLm>,
    /// The checkpoint's MTP layers (DeepSeek-V3, GLM-4.5), taken out of the model for the MTP drafter.
    pub mtp: Option<Box<dyn mtp::MtpHead>>,
    pub weights_info: WeightsInfo,
}

/// What `augur info` reports about the stored weights.
#[derive(Debug, Clone)]
pub struct WeightsInfo {
    pub format: &'static str,
    pub parameters: usize,
    /// Storage types with their tensor counts, most frequent first.
    pub dtypes: Vec<(String, usize)>,
    /// The type the float weights were quantized to at load (lossy), if they were.
    pub quantized_on_load: Option<QuantizeOnLoad>,
}

fn info(w: &Weights) -> WeightsInfo {
    let mut dtypes: Vec<_> = w.dtype_summary().into_iter().collect();
    dtypes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    WeightsInfo {
        format: if w.is_gguf() { "gguf" } else { "safetensors" },
        parameters: w.parameter_count(),
        dtypes,
        quantized_on_load: w.quantize,
    }
}

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Dequantize GGUF weights to f32 (slow; the reference path for comparisons with Transformers, which
    /// dequantizes GGUF files too).
    pub dequantize: bool,
    /// Quantize a Hugging Face checkpoint's float weights as they load (lossy; refused for a GGUF file).
    pub quantize: Option<QuantizeOnLoad>,
}

/// Whether `path` holds Gemma 4's assistant (`Gemma4AssistantForCausalLM`), which drafts from a target's states
/// and is not a causal LM of its own.
pub fn is_gemma4_assistant(path: &Path) -> Result<bool> {
    let config = path.join("config.json");
    Ok(path.is_dir()
        && config.is_file()
        && ModelConfig::from_hf_file(&config)?.architecture == Architecture::Gemma4Assistant)
}

/// Loads Gemma 4's assistant from its Hugging Face directory.
pub fn load_gemma4_assistant(path: &Path, device: &Device) -> Result<gemma4_assistant::Gemma4Assistant> {
    let cfg = ModelConfig::from_hf_file(&path.join("config.json"))?;
    let w = Weights::open_safetensors(path, cfg.architecture, device)?;
    gemma4_assistant::load(cfg, &w)
}

/// Loads a GGUF file or a Hugging Face model directory; for a GGUF file also `read(metadata)` (the tokenizer
/// lives there), before any tensor is loaded: the metadata is dropped before the weights arrive, so it does not
/// add to peak memory.
pub fn load<T>(
    path: &Path,
    device: &Device,
    opts: &LoadOptions,
    read: impl FnOnce(&gguf_file::Content) -> Result<T>,
) -> Result<(LoadedModel, Option<T>)> {
    if path.is_dir() {
        let cfg = ModelConfig::from_hf_file(&path.join("config.json"))?;
        let mut w = Weights::open_safetensors(path, cfg.architecture, device)?;
        w.dequantize = opts.dequantize;
        w.quantize = opts.quantize;
        let weights_info = info(&w);
        let Built { model, mtp } = build(cfg, &w)?;
        Ok((LoadedModel { model, mtp, weights_info }, None))
    } else if path.is_file() {
        if let Some(q) = opts.quantize {
            return Err(Error::InvalidOption(format!(
                "quantization {} applies to a Hugging Face checkpoint's float weights; {} is a GGUF file, \
                 quantized already",
                q.name(),
                path.display()
            )));
        }
        let mut w = Weights::open_gguf(path, device)?;
        w.dequantize = opts.dequantize;
        let content = w.gguf().expect("open_gguf gives GGUF weights");
        let mut cfg = ModelConfig::from_gguf_file(content, path)?;
        let read = read(content)?;
        w.drop_gguf_metadata();
        if w.contains("rope_freqs.weight") {
            let f = w.f32("rope_freqs.weight", &[cfg.head_dim / 2])?.to_vec1::<f32>()?;
            cfg.rope_scaling = crate::config::RopeScaling::Factors(f);
        }
        let weights_info = info(&w);
        let Built { model, mtp } = build(cfg, &w)?;
        Ok((LoadedModel { model, mtp, weights_info }, Some(read)))
    } else {
        Err(Error::ModelNotFound { name: path.display().to_string(), catalogue: crate::io::catalogue::names() })
    }
}
