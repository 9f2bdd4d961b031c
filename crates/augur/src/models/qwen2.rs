//! Qwen2 and Qwen2.5: the Llama block with biases on the q, k and v projections (`attention_bias`, which the
//! config defaults to true for this architecture) and optional sliding-window layers.

use super::decoder::Decoder;
use super::llama::{self, LlamaBlock};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::io::weights::Weights;

pub fn load(cfg: ModelConfig, w: &Weights) -> Result<Decoder<LlamaBlock>> {
    llama::load(cfg, w)
}
