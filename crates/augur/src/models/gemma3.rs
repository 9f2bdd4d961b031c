//! Gemma 3 (text): embeddings scaled by `sqrt(hidden)`, norms around both attention and MLP, q/k norms,
//! interleaved sliding-window and global layers with their own rotary bases, tanh-GELU, tied embeddings and
//! optional final-logit soft-capping.

use candle_core::Tensor;

use super::decoder::{Block, Decoder};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::io::weights::Weights;
use crate::nn::{Attention, KvCache, Mlp, RmsNorm, Ropes, Step};

pub struct Gemma3Block {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    mlp: Mlp,
    post_feedforward_layernorm: RmsNorm,
}

impl Gemma3Block {
    fn load(w: &Weights, cfg: &ModelConfig, i: usize) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let norm = |n: &str| RmsNorm::load(w, &format!("{p}.{n}.weight"), cfg.hidden_size, cfg.rms_norm_eps, true);
        Ok(Self {
            input_layernorm: norm("input_layernorm")?,
            self_attn: Attention::load(w, &format!("{p}.self_attn"), cfg, cfg.layer_types[i], true, true)?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            pre_feedforward_layernorm: norm("pre_feedforward_layernorm")?,
            mlp: Mlp::load(w, &format!("{p}.mlp"), cfg)?,
            post_feedforward_layernorm: norm("post_feedforward_layernorm")?,
        })
    }
}

impl Block for Gemma3Block {
    fn forward(&self, x: &Tensor, steps: &[Step], ropes: &Ropes, caches: &mut [&mut KvCache]) -> Result<Tensor> {
        let a = self.self_attn.forward(&self.input_layernorm.forward(x)?, steps, ropes, caches)?;
        let h = (x + self.post_attention_layernorm.forward(&a)?)?;
        let m = self.mlp.forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
        Ok((&h + self.post_feedforward_layernorm.forward(&m)?)?)
    }

    fn new_cache(&self) -> KvCache {
        self.self_attn.new_cache()
    }
}

pub fn load(cfg: ModelConfig, w: &Weights) -> Result<Decoder<Gemma3Block>> {
    let layers = (0..cfg.num_hidden_layers).map(|i| Gemma3Block::load(w, &cfg, i)).collect::<Result<Vec<_>>>()?;
    let scale = (cfg.hidden_size as f64).sqrt();
    Decoder::new(cfg, w, layers, Some(scale), true)
}
