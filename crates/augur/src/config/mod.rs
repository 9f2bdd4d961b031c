//! One model configuration, read from a Hugging Face `config.json` or from GGUF metadata.
//!
//! Field names follow `config.json`; each architecture's defaults are the ones its Transformers config
//! class declares, so a sparse `config.json` means what it means to Transformers.

use std::path::Path;

use candle_core::quantized::gguf_file;
use serde::Deserialize;

use crate::error::{Error, Result};

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
            other => Err(Error::UnknownArchitecture(other.to_string())),
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
    Linear { factor: f64 },
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
    /// The whole `config.json` (for a nested checkpoint, the object the fields above were read from, with the outer
    /// one under `"outer"`): architecture-specific fields that only one model file reads. `None` for GGUF.
    pub hf_config: Option<std::sync::Arc<serde_json::Value>>,
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

/// Accepts an id or a list of ids, as `config.json` does for `eos_token_id`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Debug, Deserialize)]
struct HfRopeScaling {
    #[serde(alias = "type")]
    rope_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
    beta_fast: Option<f64>,
    beta_slow: Option<f64>,
    mscale: Option<f64>,
    mscale_all_dim: Option<f64>,
    attention_factor: Option<f64>,
    truncate: Option<bool>,
    partial_rotary_factor: Option<f64>,
}

/// The fields of `config.json` that the supported architectures use; absent ones take the architecture's
/// defaults.
#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    architectures: Option<Vec<String>>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_local_base_freq: Option<f64>,
    rope_scaling: Option<HfRopeScaling>,
    /// Transformers 5 folds `rope_theta` and `rope_scaling` into `rope_parameters`.
    rope_parameters: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    query_pre_attn_scalar: Option<f64>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    bos_token_id: Option<OneOrMany>,
    eos_token_id: Option<OneOrMany>,
    partial_rotary_factor: Option<f64>,
    use_qk_norm: Option<bool>,
    moe_intermediate_size: Option<usize>,
    n_routed_experts: Option<usize>,
    n_shared_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    routed_scaling_factor: Option<f64>,
    norm_topk_prob: Option<bool>,
    first_k_dense_replace: Option<usize>,
    /// `null` in DeepSeek configs means a full-rank `q_proj`.
    #[serde(default, deserialize_with = "explicit_null")]
    q_lora_rank: Option<Option<usize>>,
    kv_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    rope_interleave: Option<bool>,
    #[serde(alias = "num_mtp_layers")]
    num_nextn_predict_layers: Option<usize>,
}

/// Tells a field set to `null` (`Some(None)`) from an absent one (`None`).
fn explicit_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Option<usize>>, D::Error> {
    Ok(Some(Option::deserialize(d)?))
}

/// YaRN's attention-magnitude correction `0.1·m·ln(scale) + 1` (1 for `scale <= 1`).
fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
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
    (0..n)
        .map(|i| if pattern > 0 && (i + 1) % pattern == 0 { LayerKind::Full } else { LayerKind::Sliding })
        .collect()
}

fn rope_scaling_from_hf(s: &HfRopeScaling) -> Result<RopeScaling> {
    let kind = s.rope_type.as_deref().unwrap_or("default");
    let factor = || required(s.factor, "rope_scaling.factor");
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: required(s.low_freq_factor, "rope_scaling.low_freq_factor")?,
            high_freq_factor: required(s.high_freq_factor, "rope_scaling.high_freq_factor")?,
            original_max_position_embeddings: required(
                s.original_max_position_embeddings,
                "rope_scaling.original_max_position_embeddings",
            )?,
        }),
        "yarn" => {
            let factor = factor()?;
            let attention_factor = match (s.attention_factor, s.mscale, s.mscale_all_dim) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => yarn_mscale(factor, m) / yarn_mscale(factor, all),
                _ => yarn_mscale(factor, 1.0),
            };
            Ok(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: required(
                    s.original_max_position_embeddings,
                    "rope_scaling.original_max_position_embeddings",
                )?,
                beta_fast: s.beta_fast.unwrap_or(32.0),
                beta_slow: s.beta_slow.unwrap_or(1.0),
                attention_factor,
                truncate: s.truncate.unwrap_or(true),
            })
        }
        other => Err(Error::config("rope_scaling.rope_type", format!("unsupported rope scaling `{other}`"))),
    }
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_hf_json(&text).map_err(|e| in_file(e, path))
    }

    /// [`Self::from_gguf`] with errors that name the file.
    pub fn from_gguf_file(content: &gguf_file::Content, path: &Path) -> Result<Self> {
        Self::from_gguf(content).map_err(|e| in_file(e, path))
    }

    pub fn from_hf_json(text: &str) -> Result<Self> {
        let mut json: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::config("config.json", e.to_string()))?;
        let outer_type = json.get("model_type").and_then(|v| v.as_str()).map(str::to_string);
        // Gemma 4 checkpoints nest the text model's fields in `text_config` (the multimodal model and the assistant).
        if matches!(outer_type.as_deref(), Some("gemma4" | "gemma4_assistant")) {
            let mut inner = json
                .get("text_config")
                .cloned()
                .ok_or_else(|| Error::config("text_config", "missing from a Gemma 4 config"))?;
            let obj = inner.as_object_mut().ok_or_else(|| Error::config("text_config", "not an object"))?;
            obj.insert("model_type".into(), serde_json::Value::String(outer_type.clone().unwrap_or_default()));
            obj.insert("outer".into(), json);
            json = inner;
        }
        let c: HfConfig =
            serde_json::from_value(json.clone()).map_err(|e| Error::config("config.json", e.to_string()))?;
        let arch_name = c
            .model_type
            .clone()
            .or_else(|| c.architectures.as_ref().and_then(|a| a.first().cloned()))
            .ok_or_else(|| Error::config("model_type", "missing (and no `architectures`)"))?;
        let architecture = Architecture::parse(&arch_name)?;
        let gemma4 = matches!(architecture, Architecture::Gemma4 | Architecture::Gemma4Assistant);

        let hidden_size = required(c.hidden_size, "hidden_size")?;
        let num_attention_heads = positive(required(c.num_attention_heads, "num_attention_heads")?, "num_attention_heads")?;
        let num_hidden_layers =
            at_most(required(c.num_hidden_layers, "num_hidden_layers")?, MAX_LAYERS, "num_hidden_layers")?;
        let head_dim = match (c.head_dim, architecture) {
            // Transformers sets DeepSeek's `head_dim` to the rotary part of each head.
            (_, Architecture::DeepseekV3) => c.qk_rope_head_dim.unwrap_or(64),
            (Some(d), _) => d,
            (None, Architecture::Gemma3 | Architecture::Gemma4 | Architecture::Gemma4Assistant) => 256,
            (None, _) => hidden_size / num_attention_heads,
        };
        let mut rope_theta = c.rope_theta;
        let mut rope_scaling = match &c.rope_scaling {
            Some(s) => rope_scaling_from_hf(s)?,
            None => RopeScaling::None,
        };
        // YaRN's `mscale_all_dim` (DeepSeek's softmax scale) and the rotated fraction, wherever they are stored.
        let mut rope_mscale = c.rope_scaling.as_ref().and_then(|s| s.mscale_all_dim.zip(s.factor));
        let mut partial_rotary_factor = c.partial_rotary_factor;
        let mut rope_local_base_freq = c.rope_local_base_freq;
        // Gemma 4's rotary tables (proportional, per layer type and head size) are built by its model file.
        if let Some(params) = c.rope_parameters.as_ref().filter(|_| !gemma4) {
            // Either one set of parameters or one per layer type (Gemma 3 in Transformers 5).
            let (global, local) = match (params.get("full_attention"), params.get("sliding_attention")) {
                (Some(g), l) => (g.clone(), l.cloned()),
                _ => (params.clone(), None),
            };
            if let Some(t) = global.get("rope_theta").and_then(|v| v.as_f64()) {
                rope_theta = Some(t);
            }
            let s: HfRopeScaling = serde_json::from_value(global)
                .map_err(|e| Error::config("rope_parameters", e.to_string()))?;
            rope_scaling = rope_scaling_from_hf(&s)?;
            if s.rope_type.as_deref().unwrap_or("default") != "default" {
                rope_mscale = s.mscale_all_dim.zip(s.factor);
            }
            partial_rotary_factor = s.partial_rotary_factor.or(partial_rotary_factor);
            if let Some(t) = local.as_ref().and_then(|l| l.get("rope_theta")).and_then(|v| v.as_f64()) {
                rope_local_base_freq = Some(t);
            }
        }

        let (default_theta, default_eps, default_act) = match architecture {
            Architecture::Llama => (10_000.0, 1e-6, "silu"),
            Architecture::Qwen2 => (10_000.0, 1e-6, "silu"),
            Architecture::Gemma3 | Architecture::Gemma4 | Architecture::Gemma4Assistant => {
                (1_000_000.0, 1e-6, "gelu_pytorch_tanh")
            }
            Architecture::DeepseekV3 => (10_000.0, 1e-6, "silu"),
            Architecture::Glm4Moe => (10_000.0, 1e-5, "silu"),
        };
        let moe = match architecture {
            Architecture::DeepseekV3 | Architecture::Glm4Moe => {
                let deepseek = architecture == Architecture::DeepseekV3;
                let n_routed_experts = c.n_routed_experts.unwrap_or(if deepseek { 256 } else { 128 });
                let n_group = c.n_group.unwrap_or(if deepseek { 8 } else { 1 });
                let num_experts_per_tok = c.num_experts_per_tok.unwrap_or(8);
                if n_group == 0 || !n_routed_experts.is_multiple_of(n_group) {
                    return Err(Error::config("n_group", format!("{n_group} does not divide n_routed_experts = {n_routed_experts}")));
                }
                let topk_group = c.topk_group.unwrap_or(if deepseek { 4 } else { 1 });
                if topk_group == 0 || topk_group > n_group || num_experts_per_tok == 0 || num_experts_per_tok > n_routed_experts {
                    return Err(Error::config("topk_group", "needs 1 <= topk_group <= n_group and 1 <= num_experts_per_tok <= n_routed_experts"));
                }
                if n_routed_experts / n_group < 2 {
                    return Err(Error::config("n_group", "each group needs at least 2 experts (groups are scored by their top 2)"));
                }
                Some(MoeConfig {
                    moe_intermediate_size: c.moe_intermediate_size.unwrap_or(if deepseek { 2048 } else { 1408 }),
                    n_routed_experts,
                    n_shared_experts: c.n_shared_experts.unwrap_or(1),
                    num_experts_per_tok,
                    n_group,
                    topk_group,
                    routed_scaling_factor: c.routed_scaling_factor.unwrap_or(if deepseek { 2.5 } else { 1.0 }),
                    norm_topk_prob: c.norm_topk_prob.unwrap_or(true),
                    first_k_dense_replace: c.first_k_dense_replace.unwrap_or(if deepseek { 3 } else { 1 }),
                })
            }
            _ => None,
        };
        let mla = match architecture {
            Architecture::DeepseekV3 => {
                let qk_nope_head_dim = c.qk_nope_head_dim.unwrap_or(128);
                let qk_rope_head_dim = c.qk_rope_head_dim.unwrap_or(64);
                let mut softmax_scale = (qk_nope_head_dim as f64 + qk_rope_head_dim as f64).powf(-0.5);
                if let Some((all_dim, factor)) = rope_mscale.filter(|(m, _)| *m != 0.0) {
                    let m = yarn_mscale(factor, all_dim);
                    softmax_scale *= m * m;
                }
                Some(MlaConfig {
                    q_lora_rank: c.q_lora_rank.unwrap_or(Some(1536)),
                    kv_lora_rank: c.kv_lora_rank.unwrap_or(512),
                    qk_nope_head_dim,
                    qk_rope_head_dim,
                    v_head_dim: c.v_head_dim.unwrap_or(128),
                    rope_interleave: c.rope_interleave.unwrap_or(true),
                    softmax_scale,
                })
            }
            _ => None,
        };
        let act_name = c.hidden_activation.as_deref().or(c.hidden_act.as_deref()).unwrap_or(default_act);

        let layer_types = match (&c.layer_types, architecture) {
            (Some(types), _) => types.iter().map(|t| layer_kind(t)).collect::<Result<Vec<_>>>()?,
            (None, Architecture::Gemma3 | Architecture::Gemma4 | Architecture::Gemma4Assistant) => {
                gemma3_layer_types(num_hidden_layers, c.sliding_window_pattern.unwrap_or(6))
            }
            (None, Architecture::Qwen2) if c.use_sliding_window == Some(true) => {
                let full = c.max_window_layers.unwrap_or(num_hidden_layers);
                (0..num_hidden_layers)
                    .map(|i| if i < full { LayerKind::Full } else { LayerKind::Sliding })
                    .collect()
            }
            (None, _) => vec![LayerKind::Full; num_hidden_layers],
        };
        if layer_types.len() != num_hidden_layers {
            return Err(Error::config(
                "layer_types",
                format!("has {} entries for {num_hidden_layers} layers", layer_types.len()),
            ));
        }
        let mut layer_types = layer_types;
        if gemma4 {
            // Transformers forces Gemma 4's last layer to global attention.
            if let Some(last) = layer_types.last_mut() {
                *last = LayerKind::Full;
            }
        }
        let sliding_window = if layer_types.contains(&LayerKind::Sliding) {
            Some(match (c.sliding_window, gemma4) {
                (Some(w), _) => w,
                (None, true) => 512,
                (None, false) => required(c.sliding_window, "sliding_window")?,
            })
        } else {
            None
        };
        let ids = |v: &Option<OneOrMany>| match v {
            Some(OneOrMany::One(id)) => vec![*id],
            Some(OneOrMany::Many(ids)) => ids.clone(),
            None => vec![],
        };

        let cfg = ModelConfig {
            architecture,
            vocab_size: required(c.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: required(c.intermediate_size, "intermediate_size")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: c.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim,
            rms_norm_eps: c.rms_norm_eps.unwrap_or(default_eps),
            rope_theta: rope_theta.unwrap_or(default_theta),
            rope_local_base_freq: match architecture {
                Architecture::Gemma3 => Some(rope_local_base_freq.unwrap_or(10_000.0)),
                _ => rope_local_base_freq,
            },
            rope_scaling,
            rope_layout: RopeLayout::Halves,
            max_position_embeddings: c.max_position_embeddings.unwrap_or(if gemma4 { 131_072 } else { 2048 }),
            tie_word_embeddings: c.tie_word_embeddings.unwrap_or(architecture == Architecture::Gemma3 || gemma4),
            attention_bias: c.attention_bias.unwrap_or(architecture == Architecture::Qwen2),
            sliding_window,
            layer_types,
            query_pre_attn_scalar: match architecture {
                Architecture::Gemma3 => Some(c.query_pre_attn_scalar.unwrap_or(256.0)),
                _ => None,
            },
            final_logit_softcapping: c.final_logit_softcapping,
            attn_logit_softcapping: c.attn_logit_softcapping,
            hidden_act: activation(act_name)?,
            bos_token_id: ids(&c.bos_token_id).first().copied(),
            eos_token_ids: ids(&c.eos_token_id),
            partial_rotary_factor: match architecture {
                Architecture::Glm4Moe => partial_rotary_factor.unwrap_or(0.5),
                _ => partial_rotary_factor.unwrap_or(1.0),
            },
            use_qk_norm: c.use_qk_norm.unwrap_or(false),
            moe,
            mla,
            num_mtp_layers: match architecture {
                Architecture::DeepseekV3 | Architecture::Glm4Moe => c.num_nextn_predict_layers.unwrap_or(1),
                _ => 0,
            },
            hf_config: Some(std::sync::Arc::new(json)),
        };
        cfg.check()?;
        Ok(cfg)
    }

    /// Reads the hyper-parameters from a GGUF file's metadata (`{arch}.*` keys, as llama.cpp writes them).
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self> {
        let md = &content.metadata;
        let get = |key: &str| md.get(key);
        let arch_name = get("general.architecture")
            .and_then(|v| v.to_string().ok().cloned())
            .ok_or_else(|| Error::config("general.architecture", "missing from GGUF metadata"))?;
        let architecture = Architecture::parse(&arch_name)?;
        let a = architecture.name();
        let key = |k: &str| format!("{a}.{k}");
        let u = |k: &str| -> Result<usize> {
            let full = key(k);
            md.get(&full)
                .ok_or_else(|| Error::config(&full, "missing from GGUF metadata"))?
                .to_u64()
                .or_else(|_| md[&full].to_u32().map(u64::from))
                .map(|v| v as usize)
                .map_err(|e| Error::config(&full, e.to_string()))
        };
        let f = |k: &str| -> Option<f64> { md.get(&key(k)).and_then(|v| v.to_f32().ok()).map(f64::from) };

        let hidden_size = u("embedding_length")?;
        let num_attention_heads = positive(u("attention.head_count")?, &key("attention.head_count"))?;
        let num_hidden_layers = at_most(u("block_count")?, MAX_LAYERS, &key("block_count"))?;
        let head_dim = match u("attention.key_length") {
            Ok(d) => d,
            Err(_) => hidden_size / num_attention_heads,
        };
        let vocab_size = match u("vocab_size") {
            Ok(v) => v,
            Err(_) => md
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.to_vec().ok())
                .map(|v| v.len())
                .ok_or_else(|| Error::config(key("vocab_size"), "missing, and no tokenizer.ggml.tokens"))?,
        };
        let sliding_window = u("attention.sliding_window").ok();
        let layer_types = match architecture {
            // llama.cpp fixes Gemma 3's pattern at 6 rather than storing it.
            Architecture::Gemma3 => gemma3_layer_types(num_hidden_layers, 6),
            _ => vec![LayerKind::Full; num_hidden_layers],
        };
        let rope_scaling = match (
            md.get(&key("rope.scaling.type")).and_then(|v| v.to_string().ok()).map(String::as_str),
            f("rope.scaling.factor"),
        ) {
            (Some("linear"), Some(factor)) if factor != 1.0 => RopeScaling::Linear { factor },
            _ => RopeScaling::None,
        };
        let id = |k: &str| md.get(k).and_then(|v| v.to_u32().ok());
        let has_output = content.tensor_infos.contains_key("output.weight");
        let cfg = ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: u("feed_forward_length")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: u("attention.head_count_kv").unwrap_or(num_attention_heads),
            head_dim,
            rms_norm_eps: f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope_theta: f("rope.freq_base").unwrap_or(match architecture {
                Architecture::Gemma3 => 1_000_000.0,
                _ => 10_000.0,
            }),
            rope_local_base_freq: (architecture == Architecture::Gemma3).then_some(10_000.0),
            rope_scaling,
            rope_layout: match architecture {
                Architecture::Llama => RopeLayout::Interleaved,
                _ => RopeLayout::Halves,
            },
            max_position_embeddings: u("context_length").unwrap_or(2048),
            tie_word_embeddings: !has_output,
            attention_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
            sliding_window: if layer_types.contains(&LayerKind::Sliding) { sliding_window } else { None },
            layer_types,
            query_pre_attn_scalar: (architecture == Architecture::Gemma3).then_some(head_dim as f64),
            final_logit_softcapping: f("final_logit_softcapping"),
            attn_logit_softcapping: f("attn_logit_softcapping"),
            hidden_act: match architecture {
                Architecture::Gemma3 => Activation::GeluTanh,
                _ => Activation::Silu,
            },
            bos_token_id: id("tokenizer.ggml.bos_token_id"),
            eos_token_ids: id("tokenizer.ggml.eos_token_id").into_iter().collect(),
            partial_rotary_factor: 1.0,
            use_qk_norm: false,
            moe: None,
            mla: None,
            num_mtp_layers: 0,
            hf_config: None,
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published DeepSeek-V3 `config.json` (Transformers 4 layout: `rope_scaling`, `type: yarn`).
    const DEEPSEEK_V3: &str = r#"{"architectures":["DeepseekV3ForCausalLM"],"model_type":"deepseek_v3",
        "vocab_size":129280,"hidden_size":7168,"intermediate_size":18432,"moe_intermediate_size":2048,
        "num_hidden_layers":61,"num_nextn_predict_layers":1,"num_attention_heads":128,"num_key_value_heads":128,
        "n_shared_experts":1,"n_routed_experts":256,"routed_scaling_factor":2.5,"kv_lora_rank":512,
        "q_lora_rank":1536,"qk_rope_head_dim":64,"v_head_dim":128,"qk_nope_head_dim":128,"topk_method":"noaux_tc",
        "n_group":8,"topk_group":4,"num_experts_per_tok":8,"first_k_dense_replace":3,"norm_topk_prob":true,
        "scoring_func":"sigmoid","hidden_act":"silu","max_position_embeddings":163840,"rms_norm_eps":1e-06,
        "rope_theta":10000,"rope_scaling":{"beta_fast":32,"beta_slow":1,"factor":40,"mscale":1.0,
        "mscale_all_dim":1.0,"original_max_position_embeddings":4096,"type":"yarn"},"tie_word_embeddings":false,
        "bos_token_id":0,"eos_token_id":1,"attention_bias":false}"#;

    /// The published GLM-4.5 `config.json`.
    const GLM_4_5: &str = r#"{"architectures":["Glm4MoeForCausalLM"],"attention_bias":true,"head_dim":128,
        "hidden_act":"silu","hidden_size":5120,"intermediate_size":12288,"max_position_embeddings":131072,
        "model_type":"glm4_moe","moe_intermediate_size":1536,"n_group":1,"n_routed_experts":160,
        "n_shared_experts":1,"norm_topk_prob":true,"num_attention_heads":96,"num_experts_per_tok":8,
        "num_hidden_layers":92,"num_key_value_heads":8,"num_nextn_predict_layers":1,"partial_rotary_factor":0.5,
        "rms_norm_eps":1e-05,"rope_scaling":null,"rope_theta":1000000,"routed_scaling_factor":2.5,
        "tie_word_embeddings":false,"topk_group":1,"use_qk_norm":true,"vocab_size":151552,
        "first_k_dense_replace":3,"eos_token_id":[151329,151336,151338],"pad_token_id":151329}"#;

    #[test]
    fn reads_the_published_deepseek_v3_config() {
        let c = ModelConfig::from_hf_json(DEEPSEEK_V3).unwrap();
        assert_eq!(c.architecture, Architecture::DeepseekV3);
        assert_eq!(c.head_dim, 64, "the rotary part of each head");
        assert_eq!(c.num_mtp_layers, 1);
        let mla = c.mla.unwrap();
        assert_eq!((mla.q_lora_rank, mla.kv_lora_rank, mla.v_head_dim), (Some(1536), 512, 128));
        // 192^-0.5 · (0.1 · ln 40 + 1)²
        let m = 0.1 * 40f64.ln() + 1.0;
        assert!((mla.softmax_scale - 192f64.powf(-0.5) * m * m).abs() < 1e-12);
        let moe = c.moe.unwrap();
        assert_eq!((moe.n_routed_experts, moe.n_group, moe.topk_group, moe.first_k_dense_replace), (256, 8, 4, 3));
        match c.rope_scaling {
            RopeScaling::Yarn { factor, attention_factor, original_max_position_embeddings, .. } => {
                assert_eq!((factor, original_max_position_embeddings), (40.0, 4096.0));
                assert_eq!(attention_factor, 1.0, "mscale / mscale_all_dim");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reads_the_published_glm_4_5_config() {
        let c = ModelConfig::from_hf_json(GLM_4_5).unwrap();
        assert_eq!(c.architecture, Architecture::Glm4Moe);
        assert_eq!((c.head_dim, c.rotary_dim(), c.num_mtp_layers), (128, 64, 1));
        assert!(c.use_qk_norm && c.attention_bias && c.mla.is_none());
        assert_eq!(c.rope_theta, 1_000_000.0);
        assert_eq!(c.moe.unwrap().n_routed_experts, 160);
        assert_eq!(c.eos_token_ids, vec![151329, 151336, 151338]);
    }

    #[test]
    fn rejects_expert_groups_that_do_not_divide_the_experts() {
        let bad = DEEPSEEK_V3.replace(r#""n_group":8"#, r#""n_group":7"#);
        assert!(ModelConfig::from_hf_json(&bad).unwrap_err().to_string().contains("n_group"));
    }
}
