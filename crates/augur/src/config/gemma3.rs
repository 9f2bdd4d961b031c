//! Gemma 3's text `config.json` (Transformers' `Gemma3TextConfig`).

use serde::Deserialize;

use super::hf::{set_layer_types, Base, Defaults};
use super::{gemma3_layer_types, Architecture, ModelConfig};
use crate::error::{Error, Result};

#[derive(Debug, Deserialize)]
pub(super) struct Gemma3Json {
    #[serde(flatten)]
    base: Base,
    /// Gemma's name for `hidden_act`; read first.
    hidden_activation: Option<String>,
    rope_local_base_freq: Option<f64>,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    /// Every `sliding_window_pattern`-th layer is global, where `layer_types` is absent.
    sliding_window_pattern: Option<usize>,
    query_pre_attn_scalar: Option<f64>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
}

/// Gemma's defaults for the common fields (Gemma 3 and 4).
pub(super) fn gemma_defaults() -> Defaults {
    Defaults {
        head_dim: Some(256),
        rope_theta: 1_000_000.0,
        hidden_act: "gelu_pytorch_tanh",
        tie_word_embeddings: true,
        ..Defaults::default()
    }
}

impl TryFrom<Gemma3Json> for ModelConfig {
    type Error = Error;

    fn try_from(mut c: Gemma3Json) -> Result<Self> {
        c.base.hidden_act = c.hidden_activation.or(c.base.hidden_act);
        let (mut cfg, rope) = c.base.into_model_config(Architecture::Gemma3, gemma_defaults())?;
        let pattern = c.sliding_window_pattern.unwrap_or(6);
        set_layer_types(&mut cfg, c.layer_types, |n| gemma3_layer_types(n, pattern), c.sliding_window, None)?;
        cfg.rope_local_base_freq = Some(rope.local_theta.or(c.rope_local_base_freq).unwrap_or(10_000.0));
        cfg.query_pre_attn_scalar = Some(c.query_pre_attn_scalar.unwrap_or(256.0));
        cfg.final_logit_softcapping = c.final_logit_softcapping;
        cfg.attn_logit_softcapping = c.attn_logit_softcapping;
        Ok(cfg)
    }
}
