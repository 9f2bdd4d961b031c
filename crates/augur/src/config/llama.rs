//! Llama's `config.json` (Transformers' `LlamaConfig`).

use serde::Deserialize;

use super::hf::{Base, Defaults};
use super::{Architecture, ModelConfig};
use crate::error::{Error, Result};

/// Llama's fields are the common decoder ones.
#[derive(Debug, Deserialize)]
pub(super) struct LlamaJson {
    #[serde(flatten)]
    base: Base,
}

impl TryFrom<LlamaJson> for ModelConfig {
    type Error = Error;

    fn try_from(c: LlamaJson) -> Result<Self> {
        Ok(c.base.into_model_config(Architecture::Llama, Defaults::default())?.0)
    }
}
