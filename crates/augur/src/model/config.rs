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
    /// The whole `config.json` (for a nested checkpoint, the object the fields above were read from, with the outer
    /// one under `"outer"`): architecture-specific fields that only one model file reads. `None` for GGUF.
    pub hf_config: Option<std::sync::Arc<serde_json::Value>>,
}

impl ModelConfig {
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
        other => Err(Error::config("rope_scaling.rope_type", format!("unsupported rope scaling `{other}`"))),
    }
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_hf_json(&text).map_err(|e| match e {
            Error::Config { field, reason } => {
                Error::Config { field: format!("{}: {field}", path.display()), reason }
            }
            other => other,
        })
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
        let num_attention_heads = required(c.num_attention_heads, "num_attention_heads")?;
        let num_hidden_layers = required(c.num_hidden_layers, "num_hidden_layers")?;
        let head_dim = match (c.head_dim, architecture) {
            (Some(d), _) => d,
            (None, Architecture::Gemma3 | Architecture::Gemma4 | Architecture::Gemma4Assistant) => 256,
            (None, _) => hidden_size / num_attention_heads,
        };
        let mut rope_theta = c.rope_theta;
        let mut rope_scaling = match &c.rope_scaling {
            Some(s) => rope_scaling_from_hf(s)?,
            None => RopeScaling::None,
        };
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
        let num_attention_heads = u("attention.head_count")?;
        let num_hidden_layers = u("block_count")?;
        let head_dim = u("attention.key_length").unwrap_or(hidden_size / num_attention_heads);
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
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(Error::config(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads = {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(Error::config("head_dim", "must be even for rotary embeddings"));
        }
        Ok(())
    }
}
