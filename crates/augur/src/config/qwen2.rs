//! Qwen2's `config.json` (Transformers' `Qwen2Config`).

use serde::Deserialize;

use super::hf::{set_layer_types, Base, Defaults};
use super::{Architecture, LayerKind, ModelConfig};
use crate::error::{Error, Result};

#[derive(Debug, Deserialize)]
pub(super) struct Qwen2Json {
    #[serde(flatten)]
    base: Base,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    /// Layers before this index use full attention when `use_sliding_window` is set.
    max_window_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
}

impl TryFrom<Qwen2Json> for ModelConfig {
    type Error = Error;

    fn try_from(c: Qwen2Json) -> Result<Self> {
        // Qwen2's q/k/v projections have biases.
        let defaults = Defaults { attention_bias: true, ..Defaults::default() };
        let (mut cfg, _) = c.base.into_model_config(Architecture::Qwen2, defaults)?;
        let sliding = c.use_sliding_window == Some(true);
        let default_types = |n| {
            let full = if sliding { c.max_window_layers.unwrap_or(n) } else { n };
            (0..n).map(|i| if i < full { LayerKind::Full } else { LayerKind::Sliding }).collect()
        };
        set_layer_types(&mut cfg, c.layer_types, default_types, c.sliding_window, None)?;
        Ok(cfg)
    }
}
