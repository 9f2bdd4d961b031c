//! Grouped-query attention over a sequence's cuttable cache.

use candle_core::Tensor;

use super::norm::RmsNorm;
use super::rope::Ropes;
use super::{flat, Linear};
use crate::config::{LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::io::weights::Weights;
use crate::kernels::attention::{attend, AttendShape, Causal, TreeRows};
use crate::kernels::kv_cache::KvCache;
use crate::kernels::tree::TreeMask;

/// One sequence's part of a forward, shared by every layer: where its block starts, how many rows it has and
/// the rotary tables.
pub struct Step {
    /// Cache position of the first new token.
    pub start: usize,
    /// New tokens (rows of the block).
    pub len: usize,
    /// `(cos, sin)` for full-attention layers and for sliding-window layers (which may use another base).
    pub rope_full: (Tensor, Tensor),
    pub rope_sliding: (Tensor, Tensor),
    /// A tree-verification block's shape (`None`: causal); the ropes are then at each row's depth.
    pub tree: Option<std::sync::Arc<TreeMask>>,
}

impl Step {
    /// Attention of the block's `t` query rows over `cache` (which already holds the block's keys and values):
    /// causal, or along each row's tree path. `q`: `[n_heads, t, qk_dim]`, roped → `[t, n_heads·v_dim]`.
    pub fn attend(
        &self,
        cache: &KvCache,
        q: &[f32],
        shape: AttendShape,
        scale: f32,
        softcap: Option<f32>,
        window: Option<usize>,
    ) -> Vec<f32> {
        match &self.tree {
            None => attend(cache, q, shape, self.len, scale, softcap, Causal { start: self.start, window }),
            Some(tree) => {
                attend(cache, q, shape, self.len, scale, softcap, TreeRows { start: self.start, window, tree })
            }
        }
    }
}

/// Multi-head attention with grouped-query heads, optional q/k norms, biases, soft-capping and a sliding
/// window. It holds weights only; the sequence's [`KvCache`] is passed in, so sequences share one loaded model.
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    scale: f64,
    softcap: Option<f64>,
    window: Option<usize>,
}

impl Attention {
    /// Loads `{prefix}.{q,k,v,o}_proj` (and `{q,k}_norm` when `qk_norm`).
    pub fn load(
        w: &Weights,
        prefix: &str,
        cfg: &ModelConfig,
        kind: LayerKind,
        qk_norm: bool,
        norm_plus_one: bool,
    ) -> Result<Self> {
        let (h, kv, d) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        let bias = cfg.attention_bias;
        let norm = |n: &str| RmsNorm::load(w, &format!("{prefix}.{n}.weight"), d, cfg.rms_norm_eps, norm_plus_one);
        Ok(Self {
            q_proj: w.linear(&format!("{prefix}.q_proj"), h * d, cfg.hidden_size, bias)?,
            k_proj: w.linear(&format!("{prefix}.k_proj"), kv * d, cfg.hidden_size, bias)?,
            v_proj: w.linear(&format!("{prefix}.v_proj"), kv * d, cfg.hidden_size, bias)?,
            o_proj: w.linear(&format!("{prefix}.o_proj"), cfg.hidden_size, h * d, false)?,
            q_norm: if qk_norm { Some(norm("q_norm")?) } else { None },
            k_norm: if qk_norm { Some(norm("k_norm")?) } else { None },
            n_heads: h,
            n_kv_heads: kv,
            head_dim: d,
            scale: cfg.attention_scale(),
            softcap: cfg.attn_logit_softcapping,
            window: match kind {
                LayerKind::Sliding => cfg.sliding_window,
                LayerKind::Full => None,
            },
        })
    }

    /// An empty cache for this attention's key/value heads.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.n_kv_heads, self.head_dim)
    }

    /// `x`: `[1, rows, hidden]`, the rows of every sequence in `steps` one after the other → `[1, rows, hidden]`.
    /// The projections run over all rows at once; each sequence attends over its own cache (`caches[i]` for
    /// `steps[i]`), to which its keys and values are appended.
    pub fn forward(&self, x: &Tensor, steps: &[Step], ropes: &Ropes, caches: &mut [&mut KvCache]) -> Result<Tensor> {
        let (h, kv, d) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let [q_all, k_all, v_all]: [Tensor; 3] =
            Linear::forward_shared(&[&self.q_proj, &self.k_proj, &self.v_proj], x)?.try_into().expect("three products");
        let mut outs = Vec::with_capacity(steps.len());
        let mut offset = 0;
        for (step, cache) in steps.iter().zip(caches.iter_mut()) {
            let (t, rows) = (step.len, |a: &Tensor| a.narrow(1, offset, step.len));
            let q = rows(&q_all)?.reshape((1, t, h, d))?;
            let k = rows(&k_all)?.reshape((1, t, kv, d))?;
            let v = rows(&v_all)?.reshape((1, t, kv, d))?;
            outs.push(self.attend_sequence(q, k, v, step, ropes, cache)?);
            offset += t;
        }
        let out = if outs.len() == 1 { outs.pop().expect("one sequence") } else { Tensor::cat(&outs, 1)? };
        self.o_proj.forward(&out)
    }

    /// One sequence's attention: `q` `[1, t, h, d]`, `k`/`v` `[1, t, kv, d]` (projected, not roped) → `[1, t, h·d]`.
    fn attend_sequence(
        &self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        step: &Step,
        ropes: &Ropes,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let (h, d, t) = (self.n_heads, self.head_dim, step.len);
        let device = q.device().clone();
        let (q, k) = match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) => (qn.forward(&q)?, kn.forward(&k)?),
            _ => (q, k),
        };
        let (rope, (cos, sin)) =
            if self.window.is_some() { (&ropes.sliding, &step.rope_sliding) } else { (&ropes.full, &step.rope_full) };
        let (cos, sin) = (flat(cos)?, flat(sin)?);
        let (mut q, mut k) = (flat(&q)?, flat(&k)?); // [t, h, d], [t, kv, d]
        rope.rotate(&mut q, h, d, &cos, &sin);
        rope.rotate(&mut k, self.n_kv_heads, d, &cos, &sin);
        if cache.len() != step.start {
            return Err(Error::InvalidOption(format!(
                "attention cache holds {} positions but the block starts at {}",
                cache.len(),
                step.start
            )));
        }
        cache.append(&k, &flat(&v)?);
        let shape = AttendShape { n_heads: h, n_kv_heads: self.n_kv_heads, qk_dim: d, v_dim: d };
        let softcap = self.softcap.map(|c| c as f32);
        let q = heads_first(&q, t, h, d);
        let out = step.attend(cache, &q, shape, self.scale as f32, softcap, self.window);
        Ok(Tensor::from_vec(out, (1, t, h * d), &device)?)
    }
}

/// `x` `[t, heads, d]` as `[heads, t, d]`.
fn heads_first(x: &[f32], t: usize, heads: usize, d: usize) -> Vec<f32> {
    if t == 1 {
        return x.to_vec();
    }
    let mut out = vec![0f32; x.len()];
    for (i, v) in x.chunks_exact(d).enumerate() {
        let (row, head) = (i / heads, i % heads);
        out[(head * t + row) * d..][..d].copy_from_slice(v);
    }
    out
}

/// Runs `f` on each sequence's rows of `x` (`[1, rows, hidden]`, the sequences of `steps` one after the other)
/// with its cache, and joins the results along the rows: attention for blocks that attend one sequence at a time.
pub fn per_sequence(
    x: &Tensor,
    steps: &[Step],
    caches: &mut [&mut KvCache],
    mut f: impl FnMut(&Tensor, &Step, &mut KvCache) -> Result<Tensor>,
) -> Result<Tensor> {
    let mut outs = Vec::with_capacity(steps.len());
    let mut offset = 0;
    for (step, cache) in steps.iter().zip(caches.iter_mut()) {
        outs.push(f(&x.narrow(1, offset, step.len)?, step, cache)?);
        offset += step.len;
    }
    Ok(Tensor::cat(&outs, 1)?)
}
