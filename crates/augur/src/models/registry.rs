//! The architecture registry: a new architecture is one file in `models/`, one line in the list here and its name
//! in `config`'s `SUPPORTED_ARCHITECTURES`.

use super::batching::Batched;
use super::{deepseek_v3, gemma3, gemma4, glm4_moe, llama, qwen2, Built, CausalLm};
use crate::config::{Architecture, ModelConfig};
use crate::error::{Error, Result};
use crate::io::weights::Weights;

/// Builds the model for `cfg.architecture`.
pub fn build(cfg: ModelConfig, w: &Weights) -> Result<Built> {
    let alone = |model: Box<dyn CausalLm>| Ok(Built { model, mtp: None });
    match cfg.architecture {
        Architecture::Llama => alone(Box::new(llama::load(cfg, w)?.into_lm())),
        Architecture::Qwen2 => alone(Box::new(qwen2::load(cfg, w)?.into_lm())),
        Architecture::Gemma3 => alone(Box::new(gemma3::load(cfg, w)?.into_lm())),
        Architecture::Gemma4 => alone(Box::new(Batched::new(gemma4::load(cfg, w)?))),
        Architecture::Gemma4Assistant => Err(Error::InvalidOption(
            "the Gemma 4 assistant drafts from a Gemma 4 target's hidden states and KV cache; it cannot run on \
             tokens alone (pass it as the assistant model of a Gemma 4 target)"
                .into(),
        )),
        Architecture::DeepseekV3 => deepseek_v3::load(cfg, w),
        Architecture::Glm4Moe => glm4_moe::load(cfg, w),
    }
}
