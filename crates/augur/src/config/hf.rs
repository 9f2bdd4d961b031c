//! What every architecture's `config.json` shares (Transformers' decoder fields), and its conversion into the
//! common part of [`ModelConfig`]; each architecture's struct flattens [`Base`] in and adds its own fields.

use serde::Deserialize;

use super::{
    activation, at_most, layer_kind, positive, required, Architecture, LayerKind, ModelConfig, RopeLayout, RopeScaling,
    MAX_LAYERS,
};
use crate::error::{Error, Result};

/// Accepts an id or a list of ids, as `config.json` does for `eos_token_id`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

impl OneOrMany {
    fn ids(v: &Option<Self>) -> Vec<u32> {
        match v {
            Some(Self::One(id)) => vec![*id],
            Some(Self::Many(ids)) => ids.clone(),
            None => vec![],
        }
    }
}

/// One set of rotary parameters: Transformers 4's `rope_scaling`, or (with `rope_theta`) an entry of
/// Transformers 5's `rope_parameters`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct RopeJson {
    #[serde(alias = "type")]
    pub rope_type: Option<String>,
    pub rope_theta: Option<f64>,
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<f64>,
    pub beta_fast: Option<f64>,
    pub beta_slow: Option<f64>,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    pub attention_factor: Option<f64>,
    pub truncate: Option<bool>,
    pub partial_rotary_factor: Option<f64>,
}

/// Transformers 5's `rope_parameters`: one set for every layer, or one per layer type (Gemma).
#[derive(Debug, Deserialize)]
pub(super) struct RopeParameters {
    pub full_attention: Option<RopeJson>,
    pub sliding_attention: Option<RopeJson>,
    #[serde(flatten)]
    pub single: RopeJson,
}

/// The decoder fields every supported `config.json` has; absent ones take the architecture's [`Defaults`].
#[derive(Debug, Deserialize)]
pub(super) struct Base {
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub hidden_act: Option<String>,
    pub max_position_embeddings: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<RopeJson>,
    /// Transformers 5 folds `rope_theta` and `rope_scaling` into `rope_parameters`.
    pub rope_parameters: Option<RopeParameters>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
    pub bos_token_id: Option<OneOrMany>,
    pub eos_token_id: Option<OneOrMany>,
}

/// An architecture's Transformers defaults for the [`Base`] fields.
pub(super) struct Defaults {
    /// `None`: `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub hidden_act: &'static str,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub max_position_embeddings: usize,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            head_dim: None,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            hidden_act: "silu",
            tie_word_embeddings: false,
            attention_bias: false,
            max_position_embeddings: 2048,
        }
    }
}

/// What the rotary fields say beyond `rope_theta` and `rope_scaling`, for the architectures that read it.
pub(super) struct RopeExtras {
    /// YaRN's `(mscale_all_dim, factor)` (DeepSeek's softmax scale).
    pub mscale_all_dim: Option<(f64, f64)>,
    pub partial_rotary_factor: Option<f64>,
    /// `rope_theta` of the sliding-window layers.
    pub local_theta: Option<f64>,
}

/// YaRN's attention-magnitude correction `0.1·m·ln(scale) + 1` (1 for `scale <= 1`).
pub(super) fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

fn rope_scaling(s: &RopeJson) -> Result<RopeScaling> {
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
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    yarn_mscale(factor, m) / yarn_mscale(factor, all)
                }
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

impl Base {
    /// The common part of the engine's config: every layer global, no MoE, MLA or MTP; the sizes that
    /// allocations follow are checked here, before anything is built from them.
    pub fn into_model_config(self, architecture: Architecture, d: Defaults) -> Result<(ModelConfig, RopeExtras)> {
        let hidden_size = required(self.hidden_size, "hidden_size")?;
        let num_attention_heads =
            positive(required(self.num_attention_heads, "num_attention_heads")?, "num_attention_heads")?;
        let num_hidden_layers =
            at_most(required(self.num_hidden_layers, "num_hidden_layers")?, MAX_LAYERS, "num_hidden_layers")?;
        let head_dim = self.head_dim.or(d.head_dim).unwrap_or(hidden_size / num_attention_heads);

        let mut rope_theta = self.rope_theta;
        let mut scaling = match &self.rope_scaling {
            Some(s) => rope_scaling(s)?,
            None => RopeScaling::None,
        };
        let mut extras = RopeExtras {
            mscale_all_dim: self.rope_scaling.as_ref().and_then(|s| s.mscale_all_dim.zip(s.factor)),
            partial_rotary_factor: None,
            local_theta: None,
        };
        if let Some(params) = self.rope_parameters {
            let (global, local) = match params.full_attention {
                Some(g) => (g, params.sliding_attention),
                None => (params.single, None),
            };
            rope_theta = global.rope_theta.or(rope_theta);
            scaling = rope_scaling(&global)?;
            if global.rope_type.as_deref().unwrap_or("default") != "default" {
                extras.mscale_all_dim = global.mscale_all_dim.zip(global.factor);
            }
            extras.partial_rotary_factor = global.partial_rotary_factor;
            extras.local_theta = local.and_then(|l| l.rope_theta);
        }
        let act_name = self.hidden_act.as_deref().unwrap_or(d.hidden_act);
        let cfg = ModelConfig {
            architecture,
            vocab_size: required(self.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: required(self.intermediate_size, "intermediate_size")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(d.rms_norm_eps),
            rope_theta: rope_theta.unwrap_or(d.rope_theta),
            rope_local_base_freq: extras.local_theta,
            rope_scaling: scaling,
            rope_layout: RopeLayout::Halves,
            max_position_embeddings: self.max_position_embeddings.unwrap_or(d.max_position_embeddings),
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(d.tie_word_embeddings),
            attention_bias: self.attention_bias.unwrap_or(d.attention_bias),
            sliding_window: None,
            layer_types: vec![LayerKind::Full; num_hidden_layers],
            query_pre_attn_scalar: None,
            final_logit_softcapping: None,
            attn_logit_softcapping: None,
            hidden_act: activation(act_name)?,
            bos_token_id: OneOrMany::ids(&self.bos_token_id).first().copied(),
            eos_token_ids: OneOrMany::ids(&self.eos_token_id),
            partial_rotary_factor: extras.partial_rotary_factor.unwrap_or(1.0),
            use_qk_norm: false,
            moe: None,
            mla: None,
            num_mtp_layers: 0,
            gemma4: None,
        };
        Ok((cfg, extras))
    }
}

/// Sets the layer types (`layer_types` as given, else `default`) and, where any layer slides, the window
/// (`sliding_window`, else `default_window`, else an error).
pub(super) fn set_layer_types(
    cfg: &mut ModelConfig,
    layer_types: Option<Vec<String>>,
    default: impl FnOnce(usize) -> Vec<LayerKind>,
    sliding_window: Option<usize>,
    default_window: Option<usize>,
) -> Result<()> {
    let n = cfg.num_hidden_layers;
    let types = match layer_types {
        Some(types) => types.iter().map(|t| layer_kind(t)).collect::<Result<Vec<_>>>()?,
        None => default(n),
    };
    if types.len() != n {
        return Err(Error::config("layer_types", format!("has {} entries for {n} layers", types.len())));
    }
    cfg.layer_types = types;
    if cfg.architecture == Architecture::Gemma4 || cfg.architecture == Architecture::Gemma4Assistant {
        // Transformers forces Gemma 4's last layer to global attention.
        if let Some(last) = cfg.layer_types.last_mut() {
            *last = LayerKind::Full;
        }
    }
    cfg.sliding_window = if cfg.layer_types.contains(&LayerKind::Sliding) {
        Some(required(sliding_window.or(default_window), "sliding_window")?)
    } else {
        None
    };
    Ok(())
}
