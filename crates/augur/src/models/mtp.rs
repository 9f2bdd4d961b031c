//! Multi-token-prediction layers (Transformers' `MtpLayer`), stored after the last decoder layer of DeepSeek-V3
//! and GLM-4.5 checkpoints as `model.layers.{num_hidden_layers + k}`: `eh_proj(cat(enorm(E(token)), hnorm(h)))`
//! through a decoder block of the model's own kind, then `shared_head.norm` and the model's LM head. Each layer
//! keeps its own KV cache; the drafter (`speculation/methods/mtp.rs`) decides what to feed and what to cut.

use candle_core::{DType, Device, Tensor};

use super::decoder::{Block, Decoder};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::io::weights::Weights;
use crate::nn::{Embedding, KvCache, Linear, RmsNorm, Ropes, Step};

/// The MTP layers of a loaded model, driven by the MTP drafter.
pub trait MtpHead: Send {
    fn num_layers(&self) -> usize;
    /// Runs MTP layer `k` on `tokens` (the tokens one step after the positions of `hidden`) with the previous
    /// hidden states `hidden` (`[s, hidden]`: the target's last hidden states for layer 0, layer `k − 1`'s output
    /// after), rotating at positions `first_position..`. Appends `s` entries to layer `k`'s cache and returns its
    /// output `[s, hidden]`.
    fn forward_layer(&mut self, k: usize, tokens: &[u32], hidden: &Tensor, first_position: usize) -> Result<Tensor>;
    /// The shared LM head on one row `[hidden]` → `[vocab]` logits.
    fn logits(&self, row: &Tensor) -> Result<Vec<f32>>;
    /// Entries in layer `k`'s cache.
    fn cache_len(&mut self, k: usize) -> usize;
    fn truncate(&mut self, k: usize, len: usize);
}

struct MtpLayer<B: Block> {
    enorm: RmsNorm,
    hnorm: RmsNorm,
    /// `[hidden, 2·hidden]`.
    eh_proj: Linear,
    block: B,
    /// The block's own positions (the MTP layer's, not the sequence's).
    cache: KvCache,
    post_norm: RmsNorm,
}

/// The MTP layers with the model's embedding, LM head and rotary tables (shared, not copied: candle tensors
/// are reference-counted).
pub struct Mtp<B: Block> {
    layers: Vec<MtpLayer<B>>,
    embed: Embedding,
    lm_head: Linear,
    ropes: Ropes,
    device: Device,
}

impl<B: Block> Mtp<B> {
    /// Loads the model's `cfg.num_mtp_layers` MTP layers from `model.layers.{num_hidden_layers}` on, or `None`
    /// when the checkpoint does not hold them (many conversions drop them). `block(w, index)` loads a decoder
    /// block under `model.layers.{index}` as an MTP block (always with experts).
    pub fn load(
        cfg: &ModelConfig,
        w: &Weights,
        decoder: &Decoder<B>,
        block: impl Fn(&Weights, usize) -> Result<B>,
    ) -> Result<Option<Self>> {
        let n = cfg.num_hidden_layers;
        if cfg.num_mtp_layers == 0 || !w.contains(&format!("model.layers.{n}.eh_proj.weight")) {
            return Ok(None);
        }
        let hs = cfg.hidden_size;
        let mut layers = Vec::with_capacity(cfg.num_mtp_layers);
        for i in n..n + cfg.num_mtp_layers {
            let p = format!("model.layers.{i}");
            let norm = |name: &str| RmsNorm::load(w, &format!("{p}.{name}.weight"), hs, cfg.rms_norm_eps, false);
            let mtp_block = block(w, i)?;
            layers.push(MtpLayer {
                enorm: norm("enorm")?,
                hnorm: norm("hnorm")?,
                eh_proj: w.linear(&format!("{p}.eh_proj"), hs, 2 * hs, false)?,
                cache: mtp_block.new_cache(),
                block: mtp_block,
                post_norm: norm("shared_head.norm")?,
            });
        }
        Ok(Some(Self {
            layers,
            embed: decoder.embed.clone(),
            lm_head: decoder.head.lm_head.clone(),
            ropes: Ropes::new(cfg)?,
            device: w.device().clone(),
        }))
    }
}

impl<B: Block> MtpHead for Mtp<B> {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn forward_layer(&mut self, k: usize, tokens: &[u32], hidden: &Tensor, first_position: usize) -> Result<Tensor> {
        let layer =
            self.layers.get_mut(k).ok_or_else(|| Error::InvalidOption(format!("MTP layer {k} does not exist")))?;
        let s = tokens.len();
        let ids = Tensor::new(tokens, &self.device)?;
        let e = self.embed.forward(&ids)?; // [s, hidden]
        let x = Tensor::cat(&[layer.enorm.forward(&e)?, layer.hnorm.forward(hidden)?], 1)?;
        let x = layer.eh_proj.forward(&x)?.unsqueeze(0)?; // [1, s, hidden]
                                                          // The block's causal positions are its own cache entries; its rotary positions are the sequence's.
        let start = layer.cache.len();
        let step = Step {
            start,
            len: s,
            rope_full: self.ropes.full.cos_sin(first_position, s, &self.device)?,
            rope_sliding: self.ropes.sliding.cos_sin(first_position, s, &self.device)?,
            tree: None,
        };
        let x = layer.block.forward(&x, &[step], &self.ropes, &mut [&mut layer.cache])?;
        layer.post_norm.forward(&x.squeeze(0)?)
    }

    fn logits(&self, row: &Tensor) -> Result<Vec<f32>> {
        Ok(self.lm_head.forward(&row.unsqueeze(0)?)?.to_dtype(DType::F32)?.squeeze(0)?.to_vec1()?)
    }

    fn cache_len(&mut self, k: usize) -> usize {
        self.layers.get_mut(k).map_or(0, |l| l.cache.len())
    }

    fn truncate(&mut self, k: usize, len: usize) {
        if let Some(l) = self.layers.get_mut(k) {
            l.cache.truncate(len);
        }
    }
}
