//! GLM-4.5 (`glm4_moe`): grouped-query attention with q/k/v biases as configured, optional per-head q/k norms and
//! a rotary embedding over only the first `partial_rotary_factor` of each head; dense MLPs in the first
//! `first_k_dense_replace` layers and a mixture of experts with a shared expert after; MTP layers after the last
//! decoder layer.

use candle_core::Tensor;

use super::decoder::Decoder;
use super::moe_block::{MoeBlock, SequenceAttention};
use super::mtp::{Mtp, MtpHead};
use super::Built;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::io::weights::Weights;
use crate::kernels::attention::AttendShape;
use crate::nn::{flat, KvCache, Linear, RmsNorm, Ropes, Step};

pub struct Glm4MoeAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    scale: f64,
}

impl Glm4MoeAttention {
    fn load(w: &Weights, p: &str, cfg: &ModelConfig) -> Result<Self> {
        let (h, kv, d, hs, bias) =
            (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size, cfg.attention_bias);
        let norm = |n: &str| RmsNorm::load(w, &format!("{p}.{n}.weight"), d, cfg.rms_norm_eps, false);
        Ok(Self {
            q_proj: w.linear(&format!("{p}.q_proj"), h * d, hs, bias)?,
            k_proj: w.linear(&format!("{p}.k_proj"), kv * d, hs, bias)?,
            v_proj: w.linear(&format!("{p}.v_proj"), kv * d, hs, bias)?,
            o_proj: w.linear(&format!("{p}.o_proj"), hs, h * d, false)?,
            qk_norm: if cfg.use_qk_norm { Some((norm("q_norm")?, norm("k_norm")?)) } else { None },
            n_heads: h,
            n_kv_heads: kv,
            head_dim: d,
            rotary_dim: cfg.rotary_dim(),
            scale: (d as f64).powf(-0.5),
        })
    }

    /// Rotates the first `rotary_dim` dimensions of `x` (`[1, heads, t, head_dim]`) and keeps the rest.
    fn rotate(&self, x: &Tensor, step: &Step, ropes: &Ropes) -> Result<Tensor> {
        let (cos, sin) = &step.rope_full;
        let r = self.rotary_dim;
        let rotated = ropes.full.apply(&x.narrow(3, 0, r)?, cos, sin)?;
        if r == self.head_dim {
            return Ok(rotated);
        }
        Ok(Tensor::cat(&[rotated, x.narrow(3, r, self.head_dim - r)?], 3)?)
    }
}

impl SequenceAttention for Glm4MoeAttention {
    fn new_cache(&self) -> KvCache {
        KvCache::new(self.n_kv_heads, self.head_dim)
    }

    /// `x`: `[1, t, hidden]` at cache positions `step.start..` (appended to `cache`) → `[1, t, hidden]`.
    fn forward(&self, x: &Tensor, step: &Step, ropes: &Ropes, cache: &mut KvCache) -> Result<Tensor> {
        let (_, t, _) = x.dims3()?;
        let (h, kv, d) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let q = self.q_proj.forward(x)?.reshape((1, t, h, d))?;
        let k = self.k_proj.forward(x)?.reshape((1, t, kv, d))?;
        let v = self.v_proj.forward(x)?.reshape((1, t, kv, d))?;
        let (q, k) = match &self.qk_norm {
            Some((qn, kn)) => (qn.forward(&q)?, kn.forward(&k)?),
            None => (q, k),
        };
        let q = self.rotate(&q.transpose(1, 2)?.contiguous()?, step, ropes)?; // [1, h, t, d]
        let k = self.rotate(&k.transpose(1, 2)?.contiguous()?, step, ropes)?.transpose(1, 2)?; // [1, t, kv, d]
        if cache.len() != step.start {
            return Err(Error::InvalidOption(format!(
                "attention cache holds {} positions but the block starts at {}",
                cache.len(),
                step.start
            )));
        }
        cache.append(&flat(&k)?, &flat(&v)?);
        let shape = AttendShape { n_heads: h, n_kv_heads: kv, qk_dim: d, v_dim: d };
        let out = step.attend(cache, &flat(&q)?, shape, self.scale as f32, None, None);
        let out = Tensor::from_vec(out, (1, t, h * d), x.device())?;
        self.o_proj.forward(&out)
    }
}

pub type Glm4MoeBlock = MoeBlock<Glm4MoeAttention>;

pub fn load(cfg: ModelConfig, w: &Weights) -> Result<Built> {
    if w.is_gguf() {
        return Err(Error::config("general.architecture", "glm4_moe loads from safetensors only"));
    }
    let rd = cfg.rotary_dim();
    if rd == 0 || !rd.is_multiple_of(2) || rd > cfg.head_dim {
        return Err(Error::config(
            "partial_rotary_factor",
            format!("gives {rd} rotary dimensions of {}", cfg.head_dim),
        ));
    }
    let first_dense = cfg.moe.as_ref().map_or(0, |m| m.first_k_dense_replace);
    let block = |w: &Weights, i: usize, first_dense: usize| {
        let attn = Glm4MoeAttention::load(w, &format!("model.layers.{i}.self_attn"), &cfg)?;
        Glm4MoeBlock::load(w, &cfg, i, first_dense, attn)
    };
    let layers = (0..cfg.num_hidden_layers).map(|i| block(w, i, first_dense)).collect::<Result<Vec<_>>>()?;
    let decoder = Decoder::new(cfg.clone(), w, layers, None, false)?;
    let mtp = Mtp::load(&cfg, w, &decoder, |w, i| block(w, i, 0))?.map(|m| Box::new(m) as Box<dyn MtpHead>);
    Ok(Built { model: Box::new(decoder.into_lm()), mtp })
}
