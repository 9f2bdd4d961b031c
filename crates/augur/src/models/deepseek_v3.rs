//! DeepSeek-V3: multi-head latent attention (low-rank q and kv projections, a rotary part decoupled from the
//! heads and shared by them, YaRN scaling), dense MLPs in the first `first_k_dense_replace` layers and a mixture
//! of experts after, and MTP layers after the last decoder layer.

use candle_core::{DType, Tensor};

use super::decoder::Decoder;
use super::moe_block::{MoeBlock, SequenceAttention};
use super::mtp::{Mtp, MtpHead};
use super::Built;
use crate::config::{MlaConfig, ModelConfig, RopeLayout};
use crate::error::{Error, Result};
use crate::io::weights::Weights;
use crate::kernels::attention::AttendShape;
use crate::nn::{flat, KvCache, Linear, RmsNorm, Ropes, Step};

/// The query projection: full rank, or through a normalised low-rank bottleneck.
enum QueryProj {
    Full(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

pub struct MlaAttention {
    q: QueryProj,
    /// `[kv_lora_rank + qk_rope_head_dim, hidden]`: the compressed kv and the shared rotary key.
    kv_a_proj: Linear,
    kv_a_layernorm: RmsNorm,
    /// `[heads · (qk_nope_head_dim + v_head_dim), kv_lora_rank]`.
    kv_b_proj: Linear,
    o_proj: Linear,
    n_heads: usize,
    mla: MlaConfig,
}

/// Transformers builds the low-rank norms with their default epsilon, not `rms_norm_eps`.
const LORA_NORM_EPS: f64 = 1e-6;

impl MlaAttention {
    fn load(w: &Weights, p: &str, cfg: &ModelConfig, mla: &MlaConfig) -> Result<Self> {
        let (h, hs, bias) = (cfg.num_attention_heads, cfg.hidden_size, cfg.attention_bias);
        let qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
        let q = match mla.q_lora_rank {
            None => QueryProj::Full(w.linear(&format!("{p}.q_proj"), h * qk, hs, false)?),
            Some(r) => QueryProj::LowRank {
                a: w.linear(&format!("{p}.q_a_proj"), r, hs, bias)?,
                norm: RmsNorm::load(w, &format!("{p}.q_a_layernorm.weight"), r, LORA_NORM_EPS, false)?,
                b: w.linear(&format!("{p}.q_b_proj"), h * qk, r, false)?,
            },
        };
        let r = mla.kv_lora_rank;
        Ok(Self {
            q,
            kv_a_proj: w.linear(&format!("{p}.kv_a_proj_with_mqa"), r + mla.qk_rope_head_dim, hs, bias)?,
            kv_a_layernorm: RmsNorm::load(w, &format!("{p}.kv_a_layernorm.weight"), r, LORA_NORM_EPS, false)?,
            kv_b_proj: w.linear(&format!("{p}.kv_b_proj"), h * (mla.qk_nope_head_dim + mla.v_head_dim), r, false)?,
            o_proj: w.linear(&format!("{p}.o_proj"), hs, h * mla.v_head_dim, bias)?,
            n_heads: h,
            mla: mla.clone(),
        })
    }
}

impl SequenceAttention for MlaAttention {
    /// An empty cache: expanded keys and values per head, both padded to `max(qk_head_dim, v_head_dim)`.
    fn new_cache(&self) -> KvCache {
        let m = &self.mla;
        KvCache::new(self.n_heads, (m.qk_nope_head_dim + m.qk_rope_head_dim).max(m.v_head_dim))
    }

    /// `x`: `[1, t, hidden]` at cache positions `step.start..` (appended to `cache`) → `[1, t, hidden]`.
    fn forward(&self, x: &Tensor, step: &Step, ropes: &Ropes, cache: &mut KvCache) -> Result<Tensor> {
        let (_, t, _) = x.dims3()?;
        let m = &self.mla;
        let (h, nope, rot, dv) = (self.n_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
        let qk = nope + rot;
        let width = qk.max(dv);
        let q = match &self.q {
            QueryProj::Full(p) => p.forward(x)?,
            QueryProj::LowRank { a, norm, b } => b.forward(&norm.forward(&a.forward(x)?)?)?,
        }
        .reshape((1, t, h, qk))?;
        let q_pass = q.narrow(3, 0, nope)?;
        let q_rot = q.narrow(3, nope, rot)?.transpose(1, 2)?; // [1, h, t, rot]

        let ckv = self.kv_a_proj.forward(x)?; // [1, t, r + rot]
        let kv_nope = self.kv_a_layernorm.forward(&ckv.narrow(2, 0, m.kv_lora_rank)?)?;
        let k_rot = ckv.narrow(2, m.kv_lora_rank, rot)?.unsqueeze(1)?; // [1, 1, t, rot]

        let (cos, sin) = &step.rope_full;
        let q_rot = ropes.full.apply(&q_rot, cos, sin)?.transpose(1, 2)?; // [1, t, h, rot]
        let k_rot = ropes.full.apply(&k_rot, cos, sin)?.transpose(1, 2)?; // [1, t, 1, rot]

        let kv = self.kv_b_proj.forward(&kv_nope)?.reshape((1, t, h, nope + dv))?;
        let k_nope = kv.narrow(3, 0, nope)?;
        let value = kv.narrow(3, nope, dv)?;
        let key = Tensor::cat(&[k_nope, k_rot.broadcast_as((1, t, h, rot))?.contiguous()?], 3)?;
        let query = Tensor::cat(&[q_pass, q_rot], 3)?; // [1, t, h, qk]

        let pad = |x: Tensor, d: usize| -> Result<Tensor> {
            if d == width {
                return Ok(x);
            }
            let zeros = Tensor::zeros((1, t, h, width - d), DType::F32, x.device())?;
            Ok(Tensor::cat(&[x, zeros], 3)?)
        };
        if cache.len() != step.start {
            return Err(Error::InvalidOption(format!(
                "attention cache holds {} positions but the block starts at {}",
                cache.len(),
                step.start
            )));
        }
        cache.append(&flat(&pad(key, qk)?)?, &flat(&pad(value, dv)?)?);
        let q = flat(&query.transpose(1, 2)?.contiguous()?)?; // [h, t, qk]
        let shape = AttendShape { n_heads: h, n_kv_heads: h, qk_dim: qk, v_dim: dv };
        let out = step.attend(cache, &q, shape, m.softmax_scale as f32, None, None);
        let out = Tensor::from_vec(out, (1, t, h * dv), x.device())?;
        self.o_proj.forward(&out)
    }
}

pub type DeepseekV3Block = MoeBlock<MlaAttention>;

pub fn load(mut cfg: ModelConfig, w: &Weights) -> Result<Built> {
    if w.is_gguf() {
        return Err(Error::config("general.architecture", "deepseek_v3 loads from safetensors only"));
    }
    let mla = cfg.mla.clone().ok_or_else(|| Error::config("kv_lora_rank", "missing"))?;
    let first_dense = cfg.moe.as_ref().map_or(0, |m| m.first_k_dense_replace);
    // The interleaved pairs are rotated in place; only q·k is used, so the layout need not match Transformers'.
    cfg.rope_layout = if mla.rope_interleave { RopeLayout::Interleaved } else { RopeLayout::Halves };
    let block = |w: &Weights, i: usize, first_dense: usize| {
        let attn = MlaAttention::load(w, &format!("model.layers.{i}.self_attn"), &cfg, &mla)?;
        DeepseekV3Block::load(w, &cfg, i, first_dense, attn)
    };
    let layers = (0..cfg.num_hidden_layers).map(|i| block(w, i, first_dense)).collect::<Result<Vec<_>>>()?;
    let decoder = Decoder::new(cfg.clone(), w, layers, None, false)?;
    let mtp = Mtp::load(&cfg, w, &decoder, |w, i| block(w, i, 0))?.map(|m| Box::new(m) as Box<dyn MtpHead>);
    Ok(Built { model: Box::new(decoder.into_lm()), mtp })
}
