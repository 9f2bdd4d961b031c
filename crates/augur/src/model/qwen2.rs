//! Qwen2 and Qwen2.5: the Llama block with biases on the q, k and v projections (`attention_bias`, which the
//! config defaults to true for this architecture) and optional sliding-window layers.

use super::config::ModelConfig;
use super::layers::Decoder;
use super::llama::{self, LlamaBlock};
use super::weights::Weights;
use crate::error::Result;

pub fn load(cfg: ModelConfig, w: &Weights) -> Result<Decoder<LlamaBlock>> {
    llama::load(cfg, w)
}
