//! Llama (Llama 2 and 3, SmolLM2, LayerSkip Llama checkpoints): pre-norm blocks of grouped-query attention
//! and a SiLU-gated MLP.

use candle_core::Tensor;

use super::decoder::{Block, Decoder};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::io::weights::Weights;
use crate::nn::{Attention, KvCache, Mlp, RmsNorm, Ropes, Step};

pub struct LlamaBlock {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl LlamaBlock {
    pub fn load(w: &Weights, cfg: &ModelConfig, i: usize) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let norm = |n: &str| RmsNorm::load(w, &format!("{p}.{n}.weight"), cfg.hidden_size, cfg.rms_norm_eps, false);
        Ok(Self {
            input_layernorm: norm("input_layernorm")?,
            self_attn: Attention::load(w, &format!("{p}.self_attn"), cfg, cfg.layer_types[i], false, false)?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            mlp: Mlp::load(w, &format!("{p}.mlp"), cfg)?,
        })
    }
}

impl Block for LlamaBlock {
    fn forward(&self, x: &Tensor, steps: &[Step], ropes: &Ropes, caches: &mut [&mut KvCache]) -> Result<Tensor> {
        let h = (x + self.self_attn.forward(&self.input_layernorm.forward(x)?, steps, ropes, caches)?)?;
        Ok((&h + self.mlp.forward(&self.post_attention_layernorm.forward(&h)?)?)?)
    }

    fn new_cache(&self) -> KvCache {
        self.self_attn.new_cache()
    }
}

pub fn load(cfg: ModelConfig, w: &Weights) -> Result<Decoder<LlamaBlock>> {
    let layers = (0..cfg.num_hidden_layers).map(|i| LlamaBlock::load(w, &cfg, i)).collect::<Result<Vec<_>>>()?;
    Decoder::new(cfg, w, layers, None, false)
}
