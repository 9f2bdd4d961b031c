//! The pre-norm block of the mixture-of-experts architectures (DeepSeek-V3, GLM-4.5): its own attention,
//! attending one sequence at a time, then the dense MLP or the experts.

use candle_core::Tensor;

use super::decoder::Block;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::io::weights::Weights;
use crate::nn::moe::FeedForward;
use crate::nn::{per_sequence, KvCache, RmsNorm, Ropes, Step};

/// An attention that runs one sequence's rows over its cache.
pub trait SequenceAttention: Send + Sync + 'static {
    /// `x`: `[1, t, hidden]` → `[1, t, hidden]`, appending to `cache`.
    fn forward(&self, x: &Tensor, step: &Step, ropes: &Ropes, cache: &mut KvCache) -> Result<Tensor>;
    fn new_cache(&self) -> KvCache;
}

pub struct MoeBlock<A: SequenceAttention> {
    input_layernorm: RmsNorm,
    self_attn: A,
    post_attention_layernorm: RmsNorm,
    mlp: FeedForward,
}

impl<A: SequenceAttention> MoeBlock<A> {
    /// Layer `i` with its attention; layers before `first_dense` use the dense MLP.
    pub fn load(w: &Weights, cfg: &ModelConfig, i: usize, first_dense: usize, self_attn: A) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let norm = |n: &str| RmsNorm::load(w, &format!("{p}.{n}.weight"), cfg.hidden_size, cfg.rms_norm_eps, false);
        Ok(Self {
            input_layernorm: norm("input_layernorm")?,
            self_attn,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            mlp: FeedForward::load(w, &format!("{p}.mlp"), cfg, i, first_dense)?,
        })
    }
}

impl<A: SequenceAttention> Block for MoeBlock<A> {
    fn forward(&self, x: &Tensor, steps: &[Step], ropes: &Ropes, caches: &mut [&mut KvCache]) -> Result<Tensor> {
        let a = per_sequence(&self.input_layernorm.forward(x)?, steps, caches, |x, step, cache| {
            self.self_attn.forward(x, step, ropes, cache)
        })?;
        let h = (x + a)?;
        Ok((&h + self.mlp.forward(&self.post_attention_layernorm.forward(&h)?)?)?)
    }

    fn new_cache(&self) -> KvCache {
        self.self_attn.new_cache()
    }
}
