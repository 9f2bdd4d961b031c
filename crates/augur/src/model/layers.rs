//! Building blocks shared by the architectures: norms, rotary embeddings, attention over a cuttable cache,
//! gated MLPs, and the decoder stack that turns blocks into a [`CausalLm`].

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};

use super::config::{Activation, LayerKind, ModelConfig, RopeLayout, RopeScaling};
use super::kv_cache::KvCache;
use super::weights::{Embedding, Linear, Weights};
use super::{CausalLm, ForwardOptions, ForwardOutput, LogitRows};
use crate::error::{Error, Result};

/// Root-mean-square norm. Gemma stores `w − 1` in its Hugging Face checkpoints (it scales by `1 + w`), while
/// llama.cpp's converter already adds the 1: `plus_one` says which form is stored.
#[derive(Clone)]
pub struct RmsNorm {
    weight: Tensor,
    /// `weight`'s values, for the CPU path.
    alpha: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    pub fn load(w: &Weights, name: &str, dim: usize, eps: f64, plus_one: bool) -> Result<Self> {
        let mut weight = w.f32(name, &[dim])?;
        if plus_one && !w.is_gguf() {
            weight = (weight + 1.0)?;
        }
        Ok(Self { alpha: weight.to_vec1::<f32>()?, weight, eps: eps as f32 })
    }

    /// Normalizes over the last dimension. On the CPU in f32, candle's arithmetic in candle's order (each row's
    /// sum of squares a serial chain from its first element), with the chains of four rows run side by side:
    /// candle ran them one after another, so a verified block paid each row's chain in full.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !x.device().is_cpu() || x.dtype() != DType::F32 {
            return Ok(candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)?);
        }
        let n = self.alpha.len();
        if n == 0 || x.dim(candle_core::D::Minus1)? != n {
            return Err(Error::ShapeMismatch {
                name: "rms norm input (last dimension)".into(),
                expected: vec![n],
                actual: x.dims().to_vec(),
            });
        }
        let mut v = flat(x)?;
        // Up to four rows at a time: their sums side by side, then each row scaled.
        let norm_rows = |rows: &mut [f32]| {
            let mut sums = [0f32; 4];
            match rows.len() / n {
                4 => sums = sums_of_squares::<4>(rows, n),
                3 => sums[..3].copy_from_slice(&sums_of_squares::<3>(rows, n)),
                2 => sums[..2].copy_from_slice(&sums_of_squares::<2>(rows, n)),
                _ => sums[..1].copy_from_slice(&sums_of_squares::<1>(rows, n)),
            }
            for (row, sum) in rows.chunks_exact_mut(n).zip(sums) {
                let m = (sum / n as f32 + self.eps).sqrt();
                for (e, a) in row.iter_mut().zip(&self.alpha) {
                    *e = *e / m * a;
                }
            }
        };
        // Over the pool past 32 rows, as candle does.
        if v.len() <= 32 * n {
            v.chunks_mut(4 * n).for_each(norm_rows);
        } else {
            use rayon::prelude::*;
            v.par_chunks_mut(4 * n).for_each(norm_rows);
        }
        Ok(Tensor::from_vec(v, x.shape(), x.device())?)
    }
}

/// `Σ x²` of each of the `R` rows of `n` in `rows`, each a serial chain in element order (candle's order), the
/// chains side by side.
fn sums_of_squares<const R: usize>(rows: &[f32], n: usize) -> [f32; R] {
    let row: [&[f32]; R] = std::array::from_fn(|r| &rows[r * n..(r + 1) * n]);
    let mut acc = [0f32; R];
    for i in 0..n {
        for (a, x) in acc.iter_mut().zip(&row) {
            *a += x[i] * x[i];
        }
    }
    acc
}

/// Rotary position embedding: inverse frequencies with the checkpoint's scaling applied.
#[derive(Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    layout: RopeLayout,
    /// Multiplies cos and sin (YaRN's attention factor; 1 otherwise).
    attention_scaling: f32,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64, scaling: &RopeScaling, layout: RopeLayout) -> Result<Self> {
        let half = head_dim / 2;
        let mut inv_freq: Vec<f64> =
            (0..half).map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)).collect();
        let mut attention_scaling = 1.0;
        match scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                let low_wavelen = original_max_position_embeddings / low_freq_factor;
                let high_wavelen = original_max_position_embeddings / high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (original_max_position_embeddings / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
            RopeScaling::Factors(factors) => {
                if factors.len() != half {
                    return Err(Error::ShapeMismatch {
                        name: "rope_freqs.weight".into(),
                        expected: vec![half],
                        actual: vec![factors.len()],
                    });
                }
                inv_freq.iter_mut().zip(factors).for_each(|(f, d)| *f /= *d as f64);
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => {
                // Transformers' `_compute_yarn_parameters`: dimensions below `low` keep their frequency
                // (extrapolation), those above `high` are divided by `factor`, with a linear ramp between.
                let dim = head_dim as f64;
                let correction = |rot: f64| {
                    let turns = original_max_position_embeddings / (rot * 2.0 * std::f64::consts::PI);
                    dim * turns.ln() / (2.0 * theta.ln())
                };
                let (mut low, mut high) = (correction(*beta_fast), correction(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
                if low == high {
                    high += 0.001;
                }
                for (i, f) in inv_freq.iter_mut().enumerate() {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    *f = *f / factor * (1.0 - extrapolation) + *f * extrapolation;
                }
                attention_scaling = *attention_factor as f32;
            }
        }
        Ok(Self { inv_freq: inv_freq.into_iter().map(|f| f as f32).collect(), layout, attention_scaling })
    }

    /// A table from its inverse frequencies (`head_dim / 2` of them; a zero leaves its pair of dimensions as is).
    pub fn from_inv_freq(inv_freq: Vec<f32>, layout: RopeLayout) -> Self {
        Self { inv_freq, layout, attention_scaling: 1.0 }
    }

    /// `cos` and `sin` for positions `start..start + t`, each `[t, head_dim / 2]`.
    pub fn cos_sin(&self, start: usize, t: usize, device: &Device) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(t * half);
        let mut sin = Vec::with_capacity(t * half);
        for p in start..start + t {
            for f in &self.inv_freq {
                // Angles in f32 as Transformers computes them (positions × inverse frequencies in f32).
                let a = p as f32 * f;
                cos.push(a.cos() * self.attention_scaling);
                sin.push(a.sin() * self.attention_scaling);
            }
        }
        Ok((Tensor::from_vec(cos, (t, half), device)?, Tensor::from_vec(sin, (t, half), device)?))
    }

    /// Rotates the first `2 · half` dimensions of each head of `x` (`[t, heads, head_dim]`, row `r` at the
    /// position of the table's row `r`) in place, with the table's `cos` and `sin` (`[t, half]`, flat): the
    /// arithmetic of candle's `rope`/`rope_i`, element for element, without their copies to and from
    /// `[heads, t, head_dim]` (most of their cost at a few rows).
    pub fn rotate(&self, x: &mut [f32], heads: usize, head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = self.inv_freq.len();
        for (h, v) in x.chunks_exact_mut(head_dim).enumerate() {
            let at = h / heads * half;
            let (cos, sin) = (&cos[at..at + half], &sin[at..at + half]);
            let v = &mut v[..2 * half];
            match self.layout {
                RopeLayout::Halves => {
                    let (a, b) = v.split_at_mut(half);
                    for i in 0..half {
                        let (x1, x2) = (a[i], b[i]);
                        a[i] = x1 * cos[i] - x2 * sin[i];
                        b[i] = x1 * sin[i] + x2 * cos[i];
                    }
                }
                RopeLayout::Interleaved => {
                    for (i, pair) in v.chunks_exact_mut(2).enumerate() {
                        let (x1, x2) = (pair[0], pair[1]);
                        pair[0] = x1 * cos[i] - x2 * sin[i];
                        pair[1] = x1 * sin[i] + x2 * cos[i];
                    }
                }
            }
        }
    }

    /// `x`: `[1, heads, t, head_dim]`.
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        Ok(match self.layout {
            RopeLayout::Halves => candle_nn::rotary_emb::rope(&x, cos, sin)?,
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(&x, cos, sin)?,
        })
    }
}

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
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig, kind: LayerKind, qk_norm: bool, norm_plus_one: bool) -> Result<Self> {
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
        let [q_all, k_all, v_all]: [Tensor; 3] = Linear::forward_shared(&[&self.q_proj, &self.k_proj, &self.v_proj], x)?
            .try_into()
            .expect("three products");
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
    fn attend_sequence(&self, q: Tensor, k: Tensor, v: Tensor, step: &Step, ropes: &Ropes, cache: &mut KvCache) -> Result<Tensor> {
        let (h, d, t) = (self.n_heads, self.head_dim, step.len);
        let device = q.device().clone();
        let (q, k) = match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) => (qn.forward(&q)?, kn.forward(&k)?),
            _ => (q, k),
        };
        let (rope, (cos, sin)) = if self.window.is_some() {
            (&ropes.sliding, &step.rope_sliding)
        } else {
            (&ropes.full, &step.rope_full)
        };
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
        let out = attend(cache, &q, shape, t, self.scale as f32, softcap, causal(step.start, self.window));
        Ok(Tensor::from_vec(out, (1, t, h * d), &device)?)
    }
}

/// A tensor's values in row-major order, as f32.
pub(super) fn flat(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
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

/// Head counts and sizes of a cached attention: keys are the first `qk_dim` values of each cached key row and
/// values the first `v_dim` of each value row (MLA caches both padded to one width).
#[derive(Clone, Copy)]
pub struct AttendShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub qk_dim: usize,
    pub v_dim: usize,
}

impl AttendShape {
    /// `n_heads` query heads over `cache`'s key/value heads, keys and values of the cache's head size.
    pub fn over(cache: &KvCache, n_heads: usize) -> Self {
        let d = cache.head_dim();
        Self { n_heads, n_kv_heads: cache.n_kv_heads(), qk_dim: d, v_dim: d }
    }
}

/// The cached positions query `row` of a causal block starting at `start` sees (half-open), within `window`.
pub fn causal(start: usize, window: Option<usize>) -> impl Fn(usize) -> (usize, usize) + Sync {
    move |row| {
        let pos = start + row;
        (window.map_or(0, |w| (pos + 1).saturating_sub(w)), pos + 1)
    }
}

/// Attention of `t` queries (`q`: `[n_heads, t, qk_dim]`, roped) over the cached positions `visible(row)` (a
/// half-open range) of `cache`, grouped-query heads sharing its key/value heads. Each (head, query) pair is
/// computed on its own, in a fixed order over its visible keys, so a position's output is bit-for-bit the same
/// whether it is decoded alone or verified in a block: greedy speculation then stays exactly lossless.
/// Returns `[t, n_heads·v_dim]`.
pub fn attend(
    cache: &KvCache,
    q: &[f32],
    shape: AttendShape,
    t: usize,
    scale: f32,
    softcap: Option<f32>,
    visible: impl Fn(usize) -> (usize, usize) + Sync,
) -> Vec<f32> {
    let AttendShape { n_heads: h, n_kv_heads, qk_dim: d, v_dim: dv } = shape;
    let mut out = vec![0f32; t * h * dv];
    let dst = super::parallel::SharedOut::new(&mut out);
    let job = AttendJob { cache, q, shape, t, scale, softcap, simd: AttendSimd::detect() };
    // One unit per key/value head and run of query rows: the group's query heads and the run's rows read each
    // block of keys and values once.
    let (runs, g) = (row_runs(t, n_kv_heads, &visible), h / n_kv_heads);
    let units = runs.len() * n_kv_heads;
    let run = |range: std::ops::Range<usize>| {
        let mut scores = Vec::new();
        for unit in range {
            let (rows, kvh) = (runs[unit / n_kv_heads].clone(), unit % n_kv_heads);
            let mut outs: [&mut [f32]; MAX_RUN] = Default::default();
            for (o, row) in outs.iter_mut().zip(rows.clone()) {
                // SAFETY: the group's heads are consecutive, so each unit owns its `g · dv` outputs of each row.
                *o = unsafe { dst.slice((row * h + kvh * g) * dv, g * dv) };
            }
            job.unit(rows, kvh, &visible, &mut scores, outs);
        }
    };
    // Below about 2^16 multiply-adds, waking the pool costs more than the work.
    let work: usize = (0..t)
        .map(|r| {
            let (first, end) = visible(r);
            end - first
        })
        .sum::<usize>()
        * h
        * (d + dv);
    if work < 1 << 16 {
        run(0..units);
    } else {
        super::parallel::for_each_chunk(units, run);
    }
    out
}

/// Consecutive query rows attended together ([`attend`]'s units): rows that see the same first position, as
/// many as leave at least two units per thread over the key/value heads, and at most [`MAX_RUN`]. Eight rows
/// of a verified block, each on its own, read all the keys and values eight times from L2 (at 512 cached
/// positions, SmolLM2's 8-token forward spent 4.4 of its 12 ms in attention against 1.6 of 6 for one token).
fn row_runs(t: usize, n_kv_heads: usize, visible: &impl Fn(usize) -> (usize, usize)) -> Vec<std::ops::Range<usize>> {
    let per_head = (2 * rayon::current_num_threads()).div_ceil(n_kv_heads.max(1));
    let longest = (t / per_head).clamp(1, MAX_RUN);
    let mut runs = Vec::new();
    let mut start = 0;
    for row in 1..=t {
        if row == t || row - start == longest || visible(row).0 != visible(start).0 {
            runs.push(start..row);
            start = row;
        }
    }
    runs
}

/// The most query rows in one unit of [`attend`].
const MAX_RUN: usize = 8;

/// What every unit of one [`attend`] call shares.
struct AttendJob<'a> {
    cache: &'a KvCache,
    q: &'a [f32],
    shape: AttendShape,
    t: usize,
    scale: f32,
    softcap: Option<f32>,
    /// Detected once per call, not per unit.
    simd: AttendSimd,
}

#[derive(Clone, Copy, PartialEq)]
enum AttendSimd {
    Avx512,
    Avx2,
    None,
}

impl AttendSimd {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                return AttendSimd::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return AttendSimd::Avx2;
            }
        }
        AttendSimd::None
    }
}

impl AttendJob<'_> {
    /// The `g` query heads of key/value head `kvh` at each of `rows` over its positions `visible(row)` (the
    /// same first position for all), into `outs` (one `[g, v_dim]` per row, zeroed, in the first `rows.len()`).
    /// `scores` is scratch space.
    fn unit(
        &self,
        rows: std::ops::Range<usize>,
        kvh: usize,
        visible: &impl Fn(usize) -> (usize, usize),
        scores: &mut Vec<f32>,
        outs: [&mut [f32]; MAX_RUN],
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.simd == AttendSimd::Avx512
            && self.shape.qk_dim.is_multiple_of(16)
            && self.shape.v_dim.is_multiple_of(16)
            && rows.clone().all(|r| visible(r).1 > visible(r).0)
        {
            let mut outs = outs;
            // SAFETY: AVX-512 F was detected.
            return unsafe { self.unit_avx512(rows, kvh, visible, scores, &mut outs) };
        }
        for (row, o) in rows.zip(outs) {
            let (first, end) = visible(row);
            #[cfg(target_arch = "x86_64")]
            if self.simd != AttendSimd::None {
                // SAFETY: AVX-512 F implies AVX2 and FMA; or they were detected.
                unsafe { self.unit_avx2(row, kvh, first, end, scores, o) };
                continue;
            }
            self.unit_portable(row, kvh, first, end, scores, o)
        }
    }

    /// [`Self::unit_avx2`] with 512-bit registers, each key and value row loaded once for two query heads
    /// (scores of eight keys for two heads in 16 registers, reduced together by [`super::simd::fold16`]; two
    /// heads' outputs accumulated over each value row), over blocks of [`BLOCK`] rows that stay in L1 while
    /// every head of the group and every row of the unit reads them. Qwen2.5-1.5B's attention at 768 cached
    /// positions, one thread: 230–370 µs per layer and query with the AVX2 unit (it re-read the keys from L2
    /// for each head, and its softmax summed in one serial chain), 80–120 µs with this one; an 8-token
    /// verification forward there fell from 124 to 110 ms.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn unit_avx512(
        &self,
        rows: std::ops::Range<usize>,
        kvh: usize,
        visible: &impl Fn(usize) -> (usize, usize),
        scores: &mut Vec<f32>,
        outs: &mut [&mut [f32]],
    ) {
        let AttendShape { n_heads: h, n_kv_heads, qk_dim: d, v_dim: dv } = self.shape;
        let g = h / n_kv_heads;
        let first = visible(rows.start).0;
        // Per row of the unit: its visible keys (from `first`), and where its `[g, n]` scores start.
        let (mut ns, mut bases) = ([0; MAX_RUN], [0; MAX_RUN]);
        let mut total = 0;
        for (ri, row) in rows.clone().enumerate() {
            (ns[ri], bases[ri]) = (visible(row).1 - first, total);
            total += g * ns[ri];
        }
        let outs = &mut outs[..rows.len()];
        let n_max = ns.iter().copied().max().unwrap_or(0);
        scores.clear();
        scores.resize(total, 0.0);
        assert!(outs.iter().all(|o| o.len() == g * dv), "attention output of one unit");
        // Rows `first..first + n_max` of this head's keys and values, `stride` apart (bounds checked here, once).
        let stride = self.cache.head_dim();
        let (_, _) = (self.cache.key(kvh, first + n_max - 1), self.cache.value(kvh, first + n_max - 1));
        let (k0, v0) = (self.cache.key(kvh, first).as_ptr(), self.cache.value(kvh, first).as_ptr());
        let q_of = |row: usize, head: usize| self.q[(head * self.t + row) * d..][..d].as_ptr();
        // Blocks of keys (then of values) small enough for L1, each read from L2 once for all the query heads
        // and rows, two heads at a time (or the last one alone). Row by row the sums run in the same order as
        // without the blocks: eight-key groups from `first`, and each output's value sum in key order.
        let sp = scores.as_mut_ptr();
        for j0 in (0..n_max).step_by(BLOCK) {
            for (ri, row) in rows.clone().enumerate() {
                let n = ns[ri];
                let keys = j0..(j0 + BLOCK).min(n);
                let mut i = 0;
                while i < g && !keys.is_empty() {
                    let a = (q_of(row, kvh * g + i), sp.add(bases[ri] + i * n));
                    if i + 1 < g {
                        let b = (q_of(row, kvh * g + i + 1), sp.add(bases[ri] + (i + 1) * n));
                        score_heads::<true>(k0, stride, d, keys.clone(), a, b);
                    } else {
                        score_heads::<false>(k0, stride, d, keys.clone(), a, a);
                    }
                    i += 2;
                }
            }
        }
        for (&n, &base) in ns.iter().zip(&bases).take(rows.len()) {
            self.softmax(&mut scores[base..base + g * n], n);
        }
        let sp = scores.as_ptr();
        for j0 in (0..n_max).step_by(BLOCK) {
            let mut c0 = 0;
            while c0 < dv {
                // 128 dimensions in eight registers per head while they last, then 64, 32, 16: each register
                // is one chain of dependent FMAs (one per value row), so a head of 64 in one register at a
                // time waited on the FMA latency (SmolLM2's attention took 30–45% longer).
                let lanes = match dv - c0 {
                    128.. => 8,
                    64.. => 4,
                    32.. => 2,
                    _ => 1,
                };
                // Up to four heads per pass over the block's value rows (three at eight registers each), so
                // that a group of three is one pass of twelve chains, not a pair and a latency-bound single.
                for (ri, o) in outs.iter_mut().enumerate() {
                    let (n, op) = (ns[ri], o.as_mut_ptr());
                    let values = j0..(j0 + BLOCK).min(n);
                    let mut i = 0;
                    while i < g && !values.is_empty() {
                        let heads = (g - i).min(if lanes == 8 { 3 } else { 4 });
                        let at = |u: usize| (sp.add(bases[ri] + (i + u) * n), op.add((i + u) * dv));
                        let r = values.clone();
                        macro_rules! pass {
                            ($h:literal, $l:literal) => {
                                value_heads::<$h, $l>(v0, stride, r, std::array::from_fn(at), c0)
                            };
                        }
                        match (heads, lanes) {
                            (1, 8) => pass!(1, 8),
                            (2, 8) => pass!(2, 8),
                            (_, 8) => pass!(3, 8),
                            (1, 4) => pass!(1, 4),
                            (2, 4) => pass!(2, 4),
                            (3, 4) => pass!(3, 4),
                            (_, 4) => pass!(4, 4),
                            (1, 2) => pass!(1, 2),
                            (2, 2) => pass!(2, 2),
                            (3, 2) => pass!(3, 2),
                            (_, 2) => pass!(4, 2),
                            (1, _) => pass!(1, 1),
                            (2, _) => pass!(2, 1),
                            (3, _) => pass!(3, 1),
                            (_, _) => pass!(4, 1),
                        }
                        i += heads;
                    }
                }
                c0 += 16 * lanes;
            }
        }
    }

    /// Eight keys at a time per head (one horizontal reduction for the eight scores), and each head's output
    /// held in registers while the values stream by: the portable loop's per-key reductions and per-value
    /// stores cost several times its arithmetic at head sizes of 64 to 256.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unit_avx2(&self, row: usize, kvh: usize, first: usize, end: usize, scores: &mut Vec<f32>, o: &mut [f32]) {
        use std::arch::x86_64::*;
        let AttendShape { n_heads: h, n_kv_heads, qk_dim: d, v_dim: dv } = self.shape;
        if d % 8 != 0 || dv % 8 != 0 {
            return self.unit_portable(row, kvh, first, end, scores, o);
        }
        let g = h / n_kv_heads;
        let n = end - first;
        scores.clear();
        scores.resize(g * n, 0.0);
        let keys = |pos: usize| self.cache.key(kvh, pos).as_ptr();
        for i in 0..g {
            let head = kvh * g + i;
            let q_head = &self.q[(head * self.t + row) * d..][..d];
            let qv = q_head.as_ptr();
            let sc = &mut scores[i * n..(i + 1) * n];
            let full = n / 8 * 8;
            for j0 in (0..full).step_by(8) {
                let mut acc = [_mm256_setzero_ps(); 8];
                for c in (0..d).step_by(8) {
                    let qc = _mm256_loadu_ps(qv.add(c));
                    for (u, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(qc, _mm256_loadu_ps(keys(first + j0 + u).add(c)), *a);
                    }
                }
                // Lane u of the result is Σ acc[u]: pairwise horizontal adds, then the two 128-bit halves.
                let t0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
                let t1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
                let sums = _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
                _mm256_storeu_ps(sc.as_mut_ptr().add(j0), sums);
            }
            for (j, s) in sc.iter_mut().enumerate().skip(full) {
                *s = dot(q_head, &self.cache.key(kvh, first + j)[..d]);
            }
        }
        self.softmax(scores, n);
        for (i, oh) in o.chunks_exact_mut(dv).enumerate() {
            let p = &scores[i * n..(i + 1) * n];
            let mut c0 = 0;
            // 64 dimensions at a time in eight registers; a constant count keeps the sums in registers (with a
            // count known only at run time they lived on the stack, a load and a store per value row).
            while c0 + 64 <= dv {
                self.weighted_values::<8>(p, kvh, first, c0, oh);
                c0 += 64;
            }
            while c0 < dv {
                self.weighted_values::<1>(p, kvh, first, c0, oh);
                c0 += 8;
            }
        }
    }

    /// `oh[c0 .. c0 + 8L] = Σ_j p[j] · value(first + j)[c0 .. c0 + 8L]`, in key order.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weighted_values<const L: usize>(&self, p: &[f32], kvh: usize, first: usize, c0: usize, oh: &mut [f32]) {
        use std::arch::x86_64::*;
        let mut acc = [_mm256_setzero_ps(); L];
        for (j, &w) in p.iter().enumerate() {
            let (w, v) = (_mm256_set1_ps(w), self.cache.value(kvh, first + j)[c0..c0 + 8 * L].as_ptr());
            for (u, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(v.add(8 * u)), *a);
            }
        }
        for (u, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(oh[c0 + 8 * u..c0 + 8 * u + 8].as_mut_ptr(), *a);
        }
    }

    /// Scales and soft-caps the raw scores (`[g, n]`), then turns each head's row into probabilities.
    #[inline(always)]
    fn softmax(&self, scores: &mut [f32], n: usize) {
        for p in scores.chunks_exact_mut(n.max(1)) {
            for s in p.iter_mut() {
                *s *= self.scale;
                if let Some(c) = self.softcap {
                    *s = (*s / c).tanh() * c;
                }
            }
            let max = lanes(p, f32::NEG_INFINITY, f32::max);
            p.iter_mut().for_each(|s| *s = exp(*s - max));
            let inv = 1.0 / lanes(p, 0.0, |a, b| a + b);
            p.iter_mut().for_each(|s| *s *= inv);
        }
    }

    /// Any head size, any x86-64 or other target.
    fn unit_portable(&self, row: usize, kvh: usize, first: usize, end: usize, scores: &mut Vec<f32>, o: &mut [f32]) {
        let AttendShape { n_heads: h, n_kv_heads, qk_dim: d, v_dim: dv } = self.shape;
        let g = h / n_kv_heads;
        let n = end - first;
        scores.clear();
        scores.resize(g * n, 0.0);
        for (j, pos) in (first..end).enumerate() {
            let key = &self.cache.key(kvh, pos)[..d];
            for i in 0..g {
                let head = kvh * g + i;
                scores[i * n + j] = dot(&self.q[(head * self.t + row) * d..][..d], key);
            }
        }
        self.softmax(scores, n);
        for (j, pos) in (first..end).enumerate() {
            let value = &self.cache.value(kvh, pos)[..dv];
            for (i, oh) in o.chunks_exact_mut(dv).enumerate() {
                let w = scores[i * n + j];
                for (a, b) in oh.iter_mut().zip(value) {
                    *a += w * b;
                }
            }
        }
    }
}

/// Scores of one or two query heads (`a`, and `b` when `PAIR`: query and score pointers) against `keys` (rows
/// `stride` apart from `k0`), each key row loaded once for both: eight keys at a time into 16 registers
/// reduced by [`super::simd::fold16`], then the remaining keys one by one.
///
/// # Safety
/// AVX-512 F; `k0` holds the keys' rows of `d` (a multiple of 16) values, the queries `d` values, the scores
/// `keys.end`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn score_heads<const PAIR: bool>(
    k0: *const f32,
    stride: usize,
    d: usize,
    keys: std::ops::Range<usize>,
    (qa, sa): (*const f32, *mut f32),
    (qb, sb): (*const f32, *mut f32),
) {
    use super::simd::{fold16, FOLD16_SLOT};
    use std::arch::x86_64::*;
    let full = keys.start + (keys.end - keys.start) / 8 * 8;
    for j0 in (keys.start..full).step_by(8) {
        let mut acc = [_mm512_setzero_ps(); 16];
        for c in (0..d).step_by(16) {
            let (xa, xb) = (_mm512_loadu_ps(qa.add(c)), _mm512_loadu_ps(qb.add(c)));
            for u in 0..8 {
                let key = _mm512_loadu_ps(k0.add((j0 + u) * stride + c));
                acc[FOLD16_SLOT[u]] = _mm512_fmadd_ps(xa, key, acc[FOLD16_SLOT[u]]);
                if PAIR {
                    acc[FOLD16_SLOT[8 + u]] = _mm512_fmadd_ps(xb, key, acc[FOLD16_SLOT[8 + u]]);
                }
            }
        }
        let mut sums = [0f32; 16];
        _mm512_storeu_ps(sums.as_mut_ptr(), fold16::<false>(&acc));
        std::ptr::copy_nonoverlapping(sums.as_ptr(), sa.add(j0), 8);
        if PAIR {
            std::ptr::copy_nonoverlapping(sums.as_ptr().add(8), sb.add(j0), 8);
        }
    }
    for j in full..keys.end {
        let key = k0.add(j * stride);
        let (mut a, mut b) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for c in (0..d).step_by(16) {
            let x = _mm512_loadu_ps(key.add(c));
            a = _mm512_fmadd_ps(_mm512_loadu_ps(qa.add(c)), x, a);
            if PAIR {
                b = _mm512_fmadd_ps(_mm512_loadu_ps(qb.add(c)), x, b);
            }
        }
        *sa.add(j) = _mm512_reduce_add_ps(a);
        if PAIR {
            *sb.add(j) = _mm512_reduce_add_ps(b);
        }
    }
}

/// `out[c0 .. c0 + 16L] += Σ_j p[j] · value_j[c0 .. c0 + 16L]` over `values` for `H` heads (`heads`: each
/// one's probabilities and output), in key order, each value row loaded once for all of them.
///
/// # Safety
/// AVX-512 F; `v0` holds the value rows, `stride` apart, with `c0 + 16L` values each; each head's
/// probabilities hold `values.end` values and its output `c0 + 16L`; the outputs do not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn value_heads<const H: usize, const L: usize>(
    v0: *const f32,
    stride: usize,
    values: std::ops::Range<usize>,
    heads: [(*const f32, *mut f32); H],
    c0: usize,
) {
    use std::arch::x86_64::*;
    let mut acc: [[__m512; L]; H] =
        std::array::from_fn(|h| std::array::from_fn(|u| _mm512_loadu_ps(heads[h].1.add(c0 + 16 * u))));
    for j in values {
        let w: [__m512; H] = std::array::from_fn(|h| _mm512_set1_ps(*heads[h].0.add(j)));
        let v = v0.add(j * stride + c0);
        for u in 0..L {
            let x = _mm512_loadu_ps(v.add(16 * u));
            for (a, w) in acc.iter_mut().zip(&w) {
                a[u] = _mm512_fmadd_ps(*w, x, a[u]);
            }
        }
    }
    for (a, (_, out)) in acc.iter().zip(heads) {
        for (u, a) in a.iter().enumerate() {
            _mm512_storeu_ps(out.add(c0 + 16 * u), *a);
        }
    }
}

/// Keys (and values) per block of the AVX-512 attention: 64 rows of 128 floats are 32 KB, within L1.
const BLOCK: usize = 64;

/// `f` folded over `x` in 16 interleaved lanes, then over the lanes in order: a fixed order that vectorizes (a
/// plain fold is a serial chain: over 768 scores the sum alone took a quarter of a long-context attention).
#[inline(always)]
fn lanes(x: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder().iter().fold(init, |a, &b| f(a, b));
    for c in chunks {
        for l in 0..16 {
            acc[l] = f(acc[l], c[l]);
        }
    }
    acc.into_iter().fold(tail, &f)
}

/// `e^x` for x ≤ 0 (Cephes' `expf`: about 1 ulp): inlined so that a loop over scores vectorizes, where
/// `f32::exp` is a call per element. Below −87 (where e^x is denormal) it gives e^−87.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    // n's integer read off the shifted float's bits: a saturating `n as i32` does not vectorize.
    let n_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = (x - n * 0.693_359_4) - n * -2.121_944_4e-4;
    let z = r * r;
    let p = (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 0.166_666_65)
        * r
        + 0.5)
        * z
        + r
        + 1.0;
    p * f32::from_bits(((n_int + 127) as u32) << 23)
}

/// A dot product with eight independent partial sums (vectorizable, and the same order on every call).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Gated feed-forward: `down(act(gate(x)) · up(x))`.
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
    act: Activation,
}

impl Mlp {
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig) -> Result<Self> {
        Self::load_sized(w, prefix, cfg, cfg.intermediate_size)
    }

    /// An MLP of another width than `intermediate_size` (experts, shared experts).
    pub fn load_sized(w: &Weights, prefix: &str, cfg: &ModelConfig, is: usize) -> Result<Self> {
        let hs = cfg.hidden_size;
        Ok(Self {
            gate: w.linear(&format!("{prefix}.gate_proj"), is, hs, false)?,
            up: w.linear(&format!("{prefix}.up_proj"), is, hs, false)?,
            down: w.linear(&format!("{prefix}.down_proj"), hs, is, false)?,
            act: cfg.hidden_act,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.act == Activation::Silu {
            if let Some(hidden) = Linear::silu_gated(&self.gate, &self.up, x)? {
                return self.down.forward(&hidden);
            }
        }
        let (gate, up) = (self.gate.forward(x)?, self.up.forward(x)?);
        let hidden = match self.act {
            Activation::Silu if gate.dtype() == DType::F32 && up.dtype() == DType::F32 => silu_mul(&gate, &up)?,
            Activation::Silu => (candle_nn::ops::silu(&gate)? * up)?,
            Activation::GeluTanh => (gate.gelu()? * up)?,
        };
        self.down.forward(&hidden)
    }
}

/// `silu(gate) · up` for f32 tensors of one shape (see [`super::silu`]).
fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let (g, mut u) = (flat(gate)?, flat(up)?);
    super::silu::silu_mul(&g, &mut u);
    Ok(Tensor::from_vec(u, gate.shape(), gate.device())?)
}

/// One decoder layer of an architecture: weights only, shared by every sequence of the loaded model.
pub trait Block: Send + Sync + 'static {
    /// `x`: `[1, rows, hidden]`, the rows of the sequences in `steps` one after the other → `[1, rows, hidden]`,
    /// appending to each sequence's cache for this layer (`caches[i]` for `steps[i]`).
    fn forward(&self, x: &Tensor, steps: &[Step], ropes: &Ropes, caches: &mut [&mut KvCache]) -> Result<Tensor>;
    /// An empty cache of the shape this layer's attention keeps, for a new sequence.
    fn new_cache(&self) -> KvCache;
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

/// The rotary tables of full-attention and sliding-window layers.
#[derive(Clone)]
pub struct Ropes {
    pub full: Rope,
    pub sliding: Rope,
}

impl Ropes {
    pub fn new(cfg: &ModelConfig) -> Result<Self> {
        let dim = cfg.rotary_dim();
        let full = Rope::new(dim, cfg.rope_theta, &cfg.rope_scaling, cfg.rope_layout)?;
        let sliding = match cfg.rope_local_base_freq {
            // Gemma 3's local layers use their own base and no scaling.
            Some(base) => Rope::new(dim, base, &RopeScaling::None, cfg.rope_layout)?,
            None => Rope::new(dim, cfg.rope_theta, &cfg.rope_scaling, cfg.rope_layout)?,
        };
        Ok(Self { full, sliding })
    }
}

/// Embeddings → blocks → final norm → LM head: the shape every supported architecture shares. The weights
/// are shared (tensors and the block list are reference-counted); the KV caches and the position belong to
/// this sequence, and [`CausalLm::fork`] makes another sequence over the same weights. Forwards that forks
/// call at the same time from different threads run as one batched forward (see [`Batcher`]).
pub struct Decoder<B: Block> {
    pub cfg: ModelConfig,
    pub embed: Embedding,
    /// Gemma multiplies embeddings by `sqrt(hidden_size)`.
    pub embed_scale: Option<f64>,
    pub layers: Arc<Vec<B>>,
    pub norm: RmsNorm,
    pub lm_head: Linear,
    pub ropes: Ropes,
    pub device: Device,
    /// One cache per layer.
    caches: Vec<KvCache>,
    /// Positions cached by every layer.
    len: usize,
    early: EarlyPositions,
    batcher: Arc<Batcher>,
    /// This fork's id in the batcher.
    id: u64,
}

/// Positions past `len` that only the first `layers` layers have cached, written by early-exit drafting: their
/// token ids and the f32 hidden states leaving layer `layers`, `[n, hidden]` row-major. A full forward whose
/// tokens begin with these ids starts the remaining layers from the stored states instead of recomputing the
/// first ones: the same computation, equal to the last bit (every kernel gives a row the same numbers in any block).
#[derive(Default)]
struct EarlyPositions {
    layers: usize,
    tokens: Vec<u32>,
    hidden: Vec<f32>,
}

impl<B: Block> Decoder<B> {
    pub fn new(
        cfg: ModelConfig,
        w: &Weights,
        layers: Vec<B>,
        embed_scale: Option<f64>,
        norm_plus_one: bool,
    ) -> Result<Self> {
        let embed = w.embedding("model.embed_tokens.weight", cfg.vocab_size, cfg.hidden_size)?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.as_linear(w)?
        } else {
            w.linear("lm_head", cfg.vocab_size, cfg.hidden_size, false)?
        };
        let norm = RmsNorm::load(w, "model.norm.weight", cfg.hidden_size, cfg.rms_norm_eps, norm_plus_one)?;
        let ropes = Ropes::new(&cfg)?;
        let caches = empty_caches(&layers);
        let layers = Arc::new(layers);
        let batcher = Arc::new(Batcher::default());
        let id = batcher.new_id();
        let device = w.device().clone();
        let early = EarlyPositions::default();
        Ok(Self { embed, embed_scale, layers, norm, lm_head, ropes, device, cfg, caches, len: 0, early, batcher, id })
    }

    /// `[1, t, hidden]` input embeddings of `tokens`.
    fn embed_tokens(&self, tokens: &[u32]) -> Result<Tensor> {
        let ids = Tensor::new(tokens, &self.device)?;
        let x = self.embed.forward(&ids)?.unsqueeze(0)?;
        Ok(match self.embed_scale {
            Some(s) => (x * s)?,
            None => x,
        })
    }

    /// Runs `layers` on `x` (`[1, t, hidden]`, this sequence alone) at cache positions `start..start+t`.
    fn run_layers(&mut self, mut x: Tensor, layers: std::ops::Range<usize>, start: usize) -> Result<Tensor> {
        let t = x.dim(1)?;
        let steps = [Step {
            start,
            len: t,
            rope_full: self.ropes.full.cos_sin(start, t, &self.device)?,
            rope_sliding: self.ropes.sliding.cos_sin(start, t, &self.device)?,
        }];
        for i in layers {
            x = self.layers[i].forward(&x, &steps, &self.ropes, &mut [&mut self.caches[i]])?;
        }
        Ok(x)
    }

    /// Runs the blocks of several sequences (`jobs`, plain forwards over every layer) in one forward: every
    /// linear layer, norm and the LM head over the rows of all of them, attention per sequence. Each row gets
    /// the numbers it would get alone (the kernels are row-invariant), so batching never changes an output.
    fn forward_rows(&self, jobs: &mut [Job]) -> Result<Vec<ForwardOutput>> {
        super::parallel::on_pool(|| self.forward_rows_here(jobs))
    }

    fn forward_rows_here(&self, jobs: &mut [Job]) -> Result<Vec<ForwardOutput>> {
        let ids: Vec<u32> = jobs.iter().flat_map(|j| j.tokens.iter().copied()).collect();
        let ids = Tensor::new(ids.as_slice(), &self.device)?;
        let mut x = self.embed.forward(&ids)?.unsqueeze(0)?; // [1, rows, hidden]
        if let Some(s) = self.embed_scale {
            x = (x * s)?;
        }
        let steps = jobs
            .iter()
            .map(|j| {
                let (start, len) = (j.len, j.tokens.len());
                Ok(Step {
                    start,
                    len,
                    rope_full: self.ropes.full.cos_sin(start, len, &self.device)?,
                    rope_sliding: self.ropes.sliding.cos_sin(start, len, &self.device)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        for (i, layer) in self.layers.iter().enumerate() {
            let mut caches: Vec<&mut KvCache> = jobs.iter_mut().map(|j| &mut j.caches[i]).collect();
            x = layer.forward(&x, &steps, &self.ropes, &mut caches)?;
        }
        let x = x.squeeze(0)?; // [rows, hidden]
        let mut outputs = Vec::with_capacity(jobs.len());
        let mut logit_rows = Vec::new();
        let mut offset = 0;
        for (job, step) in jobs.iter_mut().zip(&steps) {
            let t = step.len;
            let xs = x.narrow(0, offset, t)?;
            offset += t;
            job.len = step.start + t;
            let picked = match &job.opts.logits {
                LogitRows::All => Some(xs.clone()),
                LogitRows::Last(n) => {
                    let n = (*n).clamp(1, t);
                    Some(xs.narrow(0, t - n, n)?)
                }
                LogitRows::None => None,
            };
            let hidden = if job.opts.hidden_states { Some(self.norm.forward(&xs)?) } else { None };
            outputs.push((picked.as_ref().map(|p| p.dim(0)).transpose()?, hidden));
            logit_rows.extend(picked);
        }
        // One LM-head product over the logit rows of every sequence, over the first rows of the head when
        // every sequence asks for no more.
        let head_rows = jobs.iter().map(|j| j.opts.head_rows).try_fold(0, |n, h| h.map(|h| n.max(h)));
        let logits = match logit_rows.len() {
            0 => None,
            1 => logit_rows.pop(),
            _ => Some(Tensor::cat(&logit_rows, 0)?),
        }
        .map(|r| -> Result<Tensor> {
            let mut l = self.lm_head.forward_first(&self.norm.forward(&r)?, head_rows.unwrap_or(usize::MAX))?;
            if let Some(cap) = self.cfg.final_logit_softcapping {
                l = ((l / cap)?.tanh()? * cap)?;
            }
            Ok(l.to_dtype(DType::F32)?)
        })
        .transpose()?;
        let mut offset = 0;
        outputs
            .into_iter()
            .map(|(rows, hidden)| {
                let logits = match (rows, logits.as_ref()) {
                    (Some(n), Some(l)) => {
                        offset += n;
                        Some(l.narrow(0, offset - n, n)?)
                    }
                    _ => None,
                };
                Ok(ForwardOutput { logits, hidden })
            })
            .collect()
    }
}

/// One sequence's forward, handed to the [`Batcher`] with the sequence's caches.
struct Job {
    id: u64,
    /// The fork that asked.
    owner: u64,
    tokens: Vec<u32>,
    opts: ForwardOptions,
    caches: Vec<KvCache>,
    /// Cached positions before the forward; after it, the new length.
    len: usize,
}

struct Finished {
    caches: Vec<KvCache>,
    len: usize,
    out: Result<ForwardOutput>,
}

#[derive(Default)]
struct BatchState {
    pending: Vec<Job>,
    done: HashMap<u64, Finished>,
    /// Whether a thread is running a batch now.
    leading: bool,
    /// Forks seen in the last two batches: how many requests a new batch waits for (briefly).
    last: HashSet<u64>,
    before_last: HashSet<u64>,
}

/// Gathers the forwards that the forks of one model call concurrently (one thread per sequence) into batched
/// forwards. The first caller becomes the leader: it waits up to [`BATCH_WINDOW`] for the sequences of the
/// recent batches to arrive, runs them all as one forward on its own thread, hands out the results, and lets
/// the next waiting caller lead. A single sequence never waits.
#[derive(Default)]
pub struct Batcher {
    state: Mutex<BatchState>,
    changed: Condvar,
    ids: AtomicU64,
    /// Forwards that ran in one batch with another sequence's.
    batched: AtomicU64,
}

/// How long a batch waits for the sequences that were in the recent batches.
const BATCH_WINDOW: Duration = Duration::from_millis(2);

impl Batcher {
    fn new_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    fn state(&self) -> MutexGuard<'_, BatchState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `job` (with the others pending) on `model`'s weights and returns it finished.
    fn run<B: Block>(&self, model: &Decoder<B>, job: Job) -> Finished {
        let id = job.id;
        let mut st = self.state();
        st.pending.push(job);
        self.changed.notify_all();
        loop {
            if let Some(f) = st.done.remove(&id) {
                return f;
            }
            if st.leading {
                st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            st.leading = true;
            let expected = st.last.union(&st.before_last).count();
            let deadline = Instant::now() + BATCH_WINDOW;
            while st.pending.len() < expected {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                st = self.changed.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
            }
            let jobs = std::mem::take(&mut st.pending);
            drop(st);
            if jobs.len() > 1 {
                self.batched.fetch_add(jobs.len() as u64, Ordering::Relaxed);
            }
            let owners: HashSet<u64> = jobs.iter().map(|j| j.owner).collect();
            let finished = run_jobs(model, jobs);
            st = self.state();
            st.before_last = std::mem::replace(&mut st.last, owners);
            st.done.extend(finished);
            st.leading = false;
            self.changed.notify_all();
        }
    }
}

/// Runs the jobs as one forward; a failed forward fails each job, with its caches cut back.
fn run_jobs<B: Block>(model: &Decoder<B>, mut jobs: Vec<Job>) -> Vec<(u64, Finished)> {
    let starts: Vec<usize> = jobs.iter().map(|j| j.len).collect();
    let result = catch_unwind(AssertUnwindSafe(|| model.forward_rows(&mut jobs)))
        .unwrap_or_else(|_| Err(Error::Generation("the batched forward panicked".into())));
    match result {
        Ok(outs) => jobs
            .into_iter()
            .zip(outs)
            .map(|(job, out)| (job.id, Finished { caches: job.caches, len: job.len, out: Ok(out) }))
            .collect(),
        Err(e) => {
            let message = e.to_string();
            jobs.into_iter()
                .zip(starts)
                .map(|(mut job, start)| {
                    job.caches.iter_mut().for_each(|c| c.truncate(start));
                    let out = Err(Error::Generation(message.clone()));
                    (job.id, Finished { caches: job.caches, len: start, out })
                })
                .collect()
        }
    }
}

impl<B: Block> CausalLm for Decoder<B> {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn cache_len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        for c in self.caches.iter_mut() {
            c.truncate(len);
        }
        let keep = len - self.len;
        self.early.tokens.truncate(keep);
        self.early.hidden.truncate(keep * self.cfg.hidden_size);
    }

    fn batched_forwards(&self) -> u64 {
        self.batcher.batched.load(Ordering::Relaxed)
    }

    fn fork(&self) -> Result<Box<dyn CausalLm>> {
        Ok(Box::new(Decoder {
            cfg: self.cfg.clone(),
            embed: self.embed.clone(),
            embed_scale: self.embed_scale,
            layers: Arc::clone(&self.layers),
            norm: self.norm.clone(),
            lm_head: self.lm_head.clone(),
            ropes: self.ropes.clone(),
            device: self.device.clone(),
            caches: empty_caches(&self.layers),
            len: 0,
            early: EarlyPositions::default(),
            batcher: Arc::clone(&self.batcher),
            id: self.batcher.new_id(),
        }))
    }

    fn forward(&mut self, tokens: &[u32], opts: &ForwardOptions) -> Result<ForwardOutput> {
        let t = tokens.len();
        if t == 0 {
            return Err(Error::InvalidOption("forward called with no tokens".into()));
        }
        let vocab = self.cfg.vocab_size as u32;
        if let Some(bad) = tokens.iter().find(|&&id| id >= vocab) {
            return Err(Error::InvalidOption(format!("token id {bad} is outside the model's vocabulary of {vocab}")));
        }
        let n = self.layers.len();
        if let Some(exit) = opts.exit_layer {
            if exit == 0 || exit >= n {
                return Err(Error::InvalidOption(format!(
                    "exit layer {exit} is outside 1..={} (the model has {n} layers)",
                    n - 1
                )));
            }
            if exit != self.early.layers {
                self.truncate(self.len);
                self.early.layers = exit;
            }
        }
        let end = self.len + t + if opts.exit_layer.is_some() { self.early.tokens.len() } else { 0 };
        if end > self.cfg.max_position_embeddings {
            return Err(Error::PromptTooLong { prompt_tokens: end, context: self.cfg.max_position_embeddings });
        }
        if opts.exit_layer.is_none() && self.early.tokens.is_empty() {
            // A plain forward: batched with the forwards that other forks make at the same time.
            let job = Job {
                id: self.batcher.new_id(),
                owner: self.id,
                tokens: tokens.to_vec(),
                opts: opts.clone(),
                caches: std::mem::take(&mut self.caches),
                len: self.len,
            };
            let batcher = Arc::clone(&self.batcher);
            let done = batcher.run(self, job);
            self.caches = done.caches;
            self.len = done.len;
            return done.out;
        }
        super::parallel::on_pool(|| self.forward_alone(tokens, opts))
    }
}

impl<B: Block> Decoder<B> {
    /// A forward that is not batched with other forks: early-exit drafting, or a full forward that reuses
    /// what drafting computed. Runs on a pool worker (see [`super::parallel::on_pool`]).
    fn forward_alone(&mut self, tokens: &[u32], opts: &ForwardOptions) -> Result<ForwardOutput> {
        let (t, n) = (tokens.len(), self.layers.len());
        let x = match opts.exit_layer {
            Some(exit) => {
                // Drafting: the first `exit` layers only, after the positions they already hold.
                let start = self.len + self.early.tokens.len();
                let x = self.run_layers(self.embed_tokens(tokens)?, 0..exit, start)?;
                self.early.tokens.extend_from_slice(tokens);
                self.early.hidden.extend(flat(&x)?);
                x
            }
            None => {
                let start = self.len;
                // Reuse what drafting computed for the leading tokens, and forget the rest of it.
                let reused = self.early.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count();
                self.truncate(start + reused);
                let x = if reused == 0 {
                    self.run_layers(self.embed_tokens(tokens)?, 0..n, start)?
                } else {
                    let exit = self.early.layers;
                    let hidden = self.early.hidden.split_off(0);
                    let mut x = Tensor::from_vec(hidden, (1, reused, self.cfg.hidden_size), &self.device)?;
                    if reused < t {
                        let rest = self.run_layers(self.embed_tokens(&tokens[reused..])?, 0..exit, start + reused)?;
                        x = Tensor::cat(&[&x, &rest], 1)?;
                    }
                    self.run_layers(x, exit..n, start)?
                };
                self.early.tokens.clear();
                self.len = start + t;
                x
            }
        };
        let x = x.squeeze(0)?; // [t, hidden]
        let rows = match &opts.logits {
            LogitRows::All => Some(x.clone()),
            LogitRows::Last(n) => {
                let n = (*n).clamp(1, t);
                Some(x.narrow(0, t - n, n)?)
            }
            LogitRows::None => None,
        };
        let hidden = if opts.hidden_states { Some(self.norm.forward(&x)?) } else { None };
        let logits = match rows {
            Some(r) => {
                let mut l = self.lm_head.forward(&self.norm.forward(&r)?)?;
                if let Some(cap) = self.cfg.final_logit_softcapping {
                    l = ((l / cap)?.tanh()? * cap)?;
                }
                Some(l.to_dtype(DType::F32)?)
            }
            None => None,
        };
        Ok(ForwardOutput { logits, hidden })
    }
}

fn empty_caches<B: Block>(layers: &[B]) -> Vec<KvCache> {
    layers.iter().map(Block::new_cache).collect()
}
#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i + seed) * 7919 % 997) as f32 / 498.5 - 1.0) * 2.0).collect()
    }

    /// The CPU norm gives candle's bits for any number of rows (alone, in groups side by side, over the pool).
    #[test]
    fn rms_norm_matches_candle_bit_for_bit() {
        for (rows, n) in [(1, 576), (3, 576), (8, 64), (9, 100), (40, 96), (1, 1536)] {
            let alpha = filled(n, 5);
            let weight = Tensor::from_vec(alpha.clone(), n, &Device::Cpu).unwrap();
            let norm = RmsNorm { weight: weight.clone(), alpha, eps: 1e-5 };
            let x = Tensor::from_vec(filled(rows * n, rows), (1, rows, n), &Device::Cpu).unwrap();
            let ours = norm.forward(&x).unwrap();
            let candle = candle_nn::ops::rms_norm(&x, &weight, 1e-5).unwrap();
            assert_eq!(ours.dims(), candle.dims());
            assert_eq!(flat(&ours).unwrap(), flat(&candle).unwrap(), "{rows} rows of {n}");
        }
    }

    /// `Rope::rotate` on `[t, heads, d]` gives candle's `rope`/`rope_i` on `[1, heads, t, d]`, bit for bit.
    #[test]
    fn rotate_is_candles_rope() {
        let (t, heads, d) = (5, 3, 16);
        for layout in [RopeLayout::Halves, RopeLayout::Interleaved] {
            let rope = Rope::new(d, 10_000.0, &RopeScaling::None, layout).unwrap();
            let (cos, sin) = rope.cos_sin(7, t, &Device::Cpu).unwrap();
            let x = filled(t * heads * d, 3);
            let want = rope
                .apply(&Tensor::from_slice(&x, (1, t, heads, d), &Device::Cpu).unwrap().transpose(1, 2).unwrap(), &cos, &sin)
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let mut ours = x.clone();
            rope.rotate(&mut ours, heads, d, &flat(&cos).unwrap(), &flat(&sin).unwrap());
            assert_eq!(ours.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            assert_ne!(ours, x);
        }
    }

    /// Within 2 ulp of the correctly rounded e^x over the range the softmax uses.
    #[test]
    fn exp_is_accurate() {
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let (ours, exact) = (exp(x), (x as f64).exp());
            let ulp = (exact as f32).to_bits().abs_diff(ours.to_bits());
            assert!(ulp <= 2, "e^{x}: {ours} vs {exact} ({ulp} ulp)");
        }
        assert_eq!(exp(0.0), 1.0);
    }

    /// A block of queries gets, row for row, the bits each query gets alone; and the vectorized unit agrees
    /// with the portable one (head sizes with and without a vector tail, each width of the value loop, key
    /// counts with and without a partial group of eight, soft-capping).
    #[test]
    fn attention_rows_are_independent_and_paths_agree() {
        let cases = [
            (14, 2, 64, 40, 6, None),
            (9, 3, 24, 13, 5, Some(30.0)),
            (4, 4, 128, 70, 3, None),
            (12, 2, 128, 45, 4, None),
            (6, 2, 256, 37, 2, Some(50.0)),
            (7, 1, 64, 3, 3, None),
            (9, 3, 64, 150, 3, None),
            (12, 2, 128, 200, 9, None),
            (8, 4, 32, 20, 2, None),
            (4, 2, 96, 30, 3, None),
            (6, 3, 80, 25, 2, None),
        ];
        for (h, kv, d, ctx, t, softcap) in cases {
            let mut cache = KvCache::new(kv, d);
            cache.append(&filled((ctx + t) * kv * d, 1), &filled((ctx + t) * kv * d, 2));
            let shape = AttendShape { n_heads: h, n_kv_heads: kv, qk_dim: d, v_dim: d };
            let q = filled(h * t * d, 3);
            // Without a window, and with one that every row sees the start of differently (rows then attend
            // on their own).
            for window in [None, Some(ctx.div_ceil(2))] {
                let block = attend(&cache, &q, shape, t, 0.125, softcap, causal(ctx, window));
                for row in 0..t {
                    let q1: Vec<f32> = (0..h).flat_map(|head| q[(head * t + row) * d..][..d].to_vec()).collect();
                    let alone = attend(&cache, &q1, shape, 1, 0.125, softcap, causal(ctx + row, window));
                    assert_eq!(alone, block[row * h * d..(row + 1) * h * d], "row {row} of h{h} kv{kv} d{d} {window:?}");
                }
            }
            let job = AttendJob { cache: &cache, q: &q, shape, t, scale: 0.125, softcap, simd: AttendSimd::detect() };
            for row in 0..t {
                let (mut a, mut b) = (vec![0f32; (h / kv) * d], vec![0f32; (h / kv) * d]);
                job.unit_portable(row, kv - 1, 0, ctx + row + 1, &mut Vec::new(), &mut a);
                let mut outs: [&mut [f32]; MAX_RUN] = Default::default();
                outs[0] = &mut b;
                job.unit(row..row + 1, kv - 1, &|r| (0, ctx + r + 1), &mut Vec::new(), outs);
                for (x, y) in a.iter().zip(&b) {
                    assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "h{h} kv{kv} d{d} row {row}: {x} vs {y}");
                }
            }
        }
    }
}
