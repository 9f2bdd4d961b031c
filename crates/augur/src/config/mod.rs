//! The engine's model configuration, read from a Hugging Face `config.json` (one serde struct per architecture,
//! fields named as there) or from GGUF metadata. Each source converts into [`ModelConfig`]: the few values the
//! model files need, with the architecture's Transformers defaults applied, so that a sparse `config.json` means
//! what it means to Transformers.

mod deepseek_v3;
mod gemma3;
mod gemma4;
mod gguf;
mod glm4_moe;
mod hf;
mod llama;
mod qwen2;

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

pub use gemma4::{Gemma4AssistantConfig, Gemma4Config, Gemma4Rope};

/// The `model_type`s (config.json) and `general.architecture`s (GGUF) that load.
pub const SUPPORTED_ARCHITECTURES: &[&str] =
    &["llama", "qwen2", "gemma3", "gemma4", "gemma4_assistant", "deepseek_v3", "glm4_moe"];

/// The architectures augur can run; the names are Transformers' `model_type` and GGUF's
/// `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Gemma3,
    DeepseekV3,
    Glm4Moe,
    /// Gemma 4's text model (`gemma4_text`, or the text half of a `gemma4` checkpoint).
    Gemma4,
    /// `Gemma4AssistantForCausalLM`: drafts from a Gemma 4 target's hidden states and KV cache.
    Gemma4Assistant,
}

impl Architecture {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "llama" | "LlamaForCausalLM" => Ok(Self::Llama),
            "qwen2" | "Qwen2ForCausalLM" => Ok(Self::Qwen2),
            "gemma3" | "gemma3_text" | "Gemma3ForCausalLM" => Ok(Self::Gemma3),
            "deepseek_v3" | "DeepseekV3ForCausalLM" => Ok(Self::DeepseekV3),
            "glm4_moe" | "Glm4MoeForCausalLM" => Ok(Self::Glm4Moe),
            "gemma4" | "gemma4_text" | "Gemma4ForCausalLM" | "Gemma4ForConditionalGeneration" => Ok(Self::Gemma4),
            "gemma4_assistant" | "Gemma4AssistantForCausalLM" => Ok(Self::Gemma4Assistant),
            other => Err(Error::UnknownArchitecture {
                name: other.to_string(),
                supported: SUPPORTED_ARCHITECTURES.join(", "),
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Gemma3 => "gemma3",
            Self::DeepseekV3 => "deepseek_v3",
            Self::Glm4Moe => "glm4_moe",
            Self::Gemma4 => "gemma4",
            Self::Gemma4Assistant => "gemma4_assistant",
        }
    }
}

/// How positions are rotated: HF checkpoints rotate the two halves of each head (`rotate_half`); llama.cpp
/// permutes Llama's q/k weights so that its GGUF files rotate interleaved pairs instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    Halves,
    Interleaved,
}

/// Rope scaling declared by the checkpoint (`rope_scaling` in `config.json`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// Per-frequency divisors stored in a GGUF file (`rope_freqs.weight`), llama.cpp's form of Llama 3 scaling.
    Factors(Vec<f32>),
    /// YaRN (DeepSeek-V3): frequencies blended between interpolated and extrapolated by a linear ramp over the
    /// dimensions, and cos/sin multiplied by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        truncate: bool,
    },
}

/// Mixture of experts with shared experts and sigmoid, group-limited top-k routing (DeepSeek-V3, GLM-4.5).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f64,
    pub norm_topk_prob: bool,
    /// Layers before this index use the dense MLP (`intermediate_size`).
    pub first_k_dense_replace: usize,
}

/// Multi-head latent attention (DeepSeek-V3): low-rank q and kv projections and a decoupled rotary part.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaConfig {
    /// `None`: a full-rank `q_proj`.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// The checkpoint stores the rotary dimensions as interleaved pairs.
    pub rope_interleave: bool,
    /// `qk_head_dim^-0.5`, times YaRN's `mscale(factor, mscale_all_dim)²` when set.
    pub softmax_scale: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    Full,
    Sliding,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Silu,
    GeluTanh,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// Base frequency of sliding-window layers where it differs (Gemma 3's `rope_local_base_freq`).
    pub rope_local_base_freq: Option<f64>,
    pub rope_scaling: RopeScaling,
    pub rope_layout: RopeLayout,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub sliding_window: Option<usize>,
    /// One entry per decoder layer.
    pub layer_types: Vec<LayerKind>,
    /// Attention scores are scaled by `query_pre_attn_scalar^-0.5` (Gemma), else `head_dim^-0.5`.
    pub query_pre_attn_scalar: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub hidden_act: Activation,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Fraction of each head that is rotated (GLM-4.5 rotates half); 1.0 elsewhere.
    pub partial_rotary_factor: f64,
    /// RMS norms on each query and key head (GLM-4.5's `use_qk_norm`).
    pub use_qk_norm: bool,
    pub moe: Option<MoeConfig>,
    pub mla: Option<MlaConfig>,
    /// MTP layers stored after the decoder layers (`num_nextn_predict_layers`); the weights may be absent.
    pub num_mtp_layers: usize,
    /// Gemma 4's own settings; `None` for the other architectures and for GGUF.
    pub gemma4: Option<Gemma4Config>,
}

impl ModelConfig {
    /// Dimensions of each head that the rotary embedding turns.
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor) as usize
    }

    pub fn attention_scale(&self) -> f64 {
        self.query_pre_attn_scalar.unwrap_or(self.head_dim as f64).powf(-0.5)
    }
}

/// Most decoder layers a config may declare (the largest published models have about 130): a layer list is
/// allocated from this count before any weight is read.
pub const MAX_LAYERS: usize = 1 << 12;
/// Largest vocabulary (Gemma's 262,144 tokens is the largest published).
pub const MAX_VOCAB: usize = 1 << 22;
/// Largest width of any kind (hidden, intermediate, head size, head and expert counts): tensor shapes are products
/// of a few of these, which then fit in 64 bits with room to spare.
pub const MAX_WIDTH: usize = 1 << 20;

/// A config error with the file named before the field.
fn in_file(e: Error, path: &Path) -> Error {
    match e {
        Error::Config { field, reason } => Error::Config { field: format!("{}: {field}", path.display()), reason },
        other => other,
    }
}

fn positive(v: usize, field: &str) -> Result<usize> {
    if v == 0 {
        return Err(Error::config(field, "must be positive"));
    }
    Ok(v)
}

pub(crate) fn at_most(v: usize, max: usize, field: &str) -> Result<usize> {
    if v > max {
        return Err(Error::config(field, format!("{v} exceeds the limit of {max}")));
    }
    Ok(v)
}

fn required<T>(v: Option<T>, field: &str) -> Result<T> {
    v.ok_or_else(|| Error::config(field, "missing"))
}

fn activation(name: &str) -> Result<Activation> {
    match name {
        "silu" | "swish" => Ok(Activation::Silu),
        "gelu_pytorch_tanh" | "gelu_tanh" | "gelu" => Ok(Activation::GeluTanh),
        other => Err(Error::config("hidden_act", format!("unsupported activation `{other}`"))),
    }
}

fn layer_kind(name: &str) -> Result<LayerKind> {
    match name {
        "full_attention" => Ok(LayerKind::Full),
        "sliding_attention" => Ok(LayerKind::Sliding),
        other => Err(Error::config("layer_types", format!("unknown layer type `{other}`"))),
    }
}

/// Gemma 3 makes every `pattern`-th layer global and the others sliding.
fn gemma3_layer_types(n: usize, pattern: usize) -> Vec<LayerKind> {
    (0..n).map(|i| if pattern > 0 && (i + 1) % pattern == 0 { LayerKind::Full } else { LayerKind::Sliding }).collect()
}

/// The two fields that say which architecture a `config.json` describes.
#[derive(Deserialize)]
struct ModelType {
    model_type: Option<String>,
    architectures: Option<Vec<String>>,
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_hf_json(&text).map_err(|e| in_file(e, path))
    }

    /// Reads the text of a `config.json` into the struct of its architecture (`model_type`, else the first of
    /// `architectures`), then converts that.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let parse_err = |e: serde_json::Error| Error::config("config.json", e.to_string());
        let t: ModelType = serde_json::from_str(text).map_err(parse_err)?;
        let arch_name = t
            .model_type
            .clone()
            .or_else(|| t.architectures.as_ref().and_then(|a| a.first().cloned()))
            .ok_or_else(|| Error::config("model_type", "missing (and no `architectures`)"))?;
        let architecture = Architecture::parse(&arch_name)?;
        let cfg = match architecture {
            Architecture::Llama => serde_json::from_str::<llama::LlamaJson>(text).map_err(parse_err)?.try_into()?,
            Architecture::Qwen2 => serde_json::from_str::<qwen2::Qwen2Json>(text).map_err(parse_err)?.try_into()?,
            Architecture::Gemma3 => serde_json::from_str::<gemma3::Gemma3Json>(text).map_err(parse_err)?.try_into()?,
            Architecture::DeepseekV3 => {
                serde_json::from_str::<deepseek_v3::DeepseekV3Json>(text).map_err(parse_err)?.try_into()?
            }
            Architecture::Glm4Moe => {
                serde_json::from_str::<glm4_moe::Glm4MoeJson>(text).map_err(parse_err)?.try_into()?
            }
            Architecture::Gemma4 | Architecture::Gemma4Assistant => {
                gemma4::from_json(text, t.model_type.as_deref(), architecture)?
            }
        };
        cfg.check()?;
        Ok(cfg)
    }

    /// Rejects hyper-parameters that cannot describe a working model.
    fn check(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(Error::config(field, "must be positive"));
            }
        }
        at_most(self.num_hidden_layers, MAX_LAYERS, "num_hidden_layers")?;
        at_most(self.num_mtp_layers, MAX_LAYERS, "num_nextn_predict_layers")?;
        at_most(self.vocab_size, MAX_VOCAB, "vocab_size")?;
        let mut widths = vec![
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("sliding_window", self.sliding_window.unwrap_or(0)),
        ];
        if let Some(m) = &self.moe {
            widths.extend([
                ("moe_intermediate_size", m.moe_intermediate_size),
                ("n_routed_experts", m.n_routed_experts),
                ("n_shared_experts", m.n_shared_experts),
            ]);
        }
        if let Some(m) = &self.mla {
            widths.extend([
                ("q_lora_rank", m.q_lora_rank.unwrap_or(0)),
                ("kv_lora_rank", m.kv_lora_rank),
                ("qk_nope_head_dim", m.qk_nope_head_dim),
                ("qk_rope_head_dim", m.qk_rope_head_dim),
                ("v_head_dim", m.v_head_dim),
            ]);
        }
        for (field, v) in widths {
            at_most(v, MAX_WIDTH, field)?;
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(Error::config(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads = {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::config("head_dim", "must be even for rotary embeddings"));
        }
        // A factor above 1 would rotate more dimensions than a head has (the first forward would index past it).
        let f = self.partial_rotary_factor;
        if !(f > 0.0 && f <= 1.0) {
            return Err(Error::config("partial_rotary_factor", format!("must be in (0, 1], not {f}")));
        }
        let rd = self.rotary_dim();
        if rd == 0 || !rd.is_multiple_of(2) {
            return Err(Error::config(
                "partial_rotary_factor",
                format!("{f} gives {rd} rotary dimensions of {}: they must be a positive even number", self.head_dim),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `partial_rotary_factor` in (0, 1] (a factor above 1 panicked on the first forward), and a positive even
    /// number of rotary dimensions.
    #[test]
    fn partial_rotary_factor_outside_0_1_is_refused() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-llama/config.json");
        let base: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        for (factor, ok) in [(1.5, false), (0.0, false), (-1.0, false), (0.01, false), (0.5, true), (1.0, true)] {
            let mut c = base.clone();
            c["rope_parameters"]["partial_rotary_factor"] = serde_json::json!(factor);
            match ModelConfig::from_hf_json(&c.to_string()) {
                Ok(cfg) => assert!(ok, "{factor} accepted (rotary dims {})", cfg.rotary_dim()),
                Err(e) => {
                    assert!(!ok, "{factor}: {e}");
                    assert!(e.to_string().contains("partial_rotary_factor"), "{e}");
                }
            }
        }
    }
}
