//! Attention of query rows over a KV cache: portable, AVX2 and AVX-512 units that give each (head, query)
//! pair the same bits in any block. Written by hand so that each pair's sums run in one fixed order whatever
//! the number of query rows (a batched matrix product may change its order with them; see `nn::linear`), which
//! keeps a verified token's bits those it gets decoded alone; the AVX-512 unit also reads each block of keys
//! and values once for a whole group of heads and rows.

use super::kv_cache::KvCache;
use super::tree::TreeMask;

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

/// Which cached keys each query row of a block attends to: a half-open run of the row's *logical* positions
/// (its sequence: the cache before the block, then its ancestors in the block), and where each lies in the
/// cache. Keys are visited in logical order, so a tree row gets the bits the same row gets in a causal block
/// holding only its path.
pub trait Visible: Sync {
    /// The logical positions `row` sees, half-open.
    fn range(&self, row: usize) -> (usize, usize);
    /// The cache position of `row`'s logical position `logical`.
    #[inline(always)]
    fn position(&self, _row: usize, logical: usize) -> usize {
        logical
    }
}

/// A causal block starting at cache position `start`, within `window`.
pub struct Causal {
    pub start: usize,
    pub window: Option<usize>,
}

/// Query row `row` at sequence position `pos` sees `pos + 1` positions, the last `window` of them.
fn window_range(pos: usize, window: Option<usize>) -> (usize, usize) {
    (window.map_or(0, |w| (pos + 1).saturating_sub(w)), pos + 1)
}

impl Visible for Causal {
    #[inline(always)]
    fn range(&self, row: usize) -> (usize, usize) {
        window_range(self.start + row, self.window)
    }
}

/// A tree block at cache position `start`, after the tree's cached rows: row `i` sees the cache before the
/// tree and the rows of its path, at logical positions `tree start..=tree start + depth(i)`.
pub struct TreeRows<'a> {
    pub start: usize,
    pub window: Option<usize>,
    pub tree: &'a TreeMask,
}

impl Visible for TreeRows<'_> {
    #[inline(always)]
    fn range(&self, row: usize) -> (usize, usize) {
        window_range(self.start - self.tree.cached() + self.tree.depth(row), self.window)
    }

    #[inline(always)]
    fn position(&self, row: usize, logical: usize) -> usize {
        let root = self.start - self.tree.cached();
        match logical.checked_sub(root) {
            Some(depth) => root + self.tree.path(row)[depth],
            None => logical,
        }
    }
}

/// Any ranges of cache positions, given as a function of the row (positions are the cache's own).
pub struct Ranges<F>(pub F);

impl<F: Fn(usize) -> (usize, usize) + Sync> Visible for Ranges<F> {
    #[inline(always)]
    fn range(&self, row: usize) -> (usize, usize) {
        (self.0)(row)
    }
}

/// Attention of `t` queries (`q`: `[n_heads, t, qk_dim]`, roped) over the cached positions `visible` gives each
/// row of `cache`, grouped-query heads sharing its key/value heads. Each (head, query) pair is
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
    visible: impl Visible,
) -> Vec<f32> {
    let AttendShape { n_heads: h, n_kv_heads, qk_dim: d, v_dim: dv } = shape;
    // The vector units read each key and value row up to `qk_dim` and `v_dim` unchecked.
    assert!(
        d <= cache.head_dim() && dv <= cache.head_dim(),
        "keys of {d} and values of {dv} in rows of {}",
        cache.head_dim()
    );
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
            let (first, end) = visible.range(r);
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
/// many as leave at least two units per thread over the key/value heads, and at most [`MAX_RUN`]: eight rows
/// of a verified block, each attended on its own, would read all the keys and values eight times from L2.
fn row_runs(t: usize, n_kv_heads: usize, visible: &impl Visible) -> Vec<std::ops::Range<usize>> {
    let per_head = (2 * rayon::current_num_threads()).div_ceil(n_kv_heads.max(1));
    let longest = (t / per_head).clamp(1, MAX_RUN);
    let mut runs = Vec::new();
    let mut start = 0;
    for row in 1..=t {
        if row == t || row - start == longest || visible.range(row).0 != visible.range(start).0 {
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
        let f = crate::kernels::cpu::features();
        if f.avx512f {
            AttendSimd::Avx512
        } else if f.avx2_fma {
            AttendSimd::Avx2
        } else {
            AttendSimd::None
        }
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
        visible: &impl Visible,
        scores: &mut Vec<f32>,
        outs: [&mut [f32]; MAX_RUN],
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.simd == AttendSimd::Avx512
            && self.shape.qk_dim.is_multiple_of(16)
            && self.shape.v_dim.is_multiple_of(16)
            && rows.clone().all(|r| visible.range(r).1 > visible.range(r).0)
        {
            let mut outs = outs;
            // SAFETY: AVX-512 F was detected; the head sizes are multiples of 16 (checked above) and fit the
            // cache's rows (checked by `attend`); `rows` is one of `row_runs`' runs, whose rows share their
            // first visible position, each row seeing at least one (checked above).
            return unsafe { self.unit_avx512(rows, kvh, visible, scores, &mut outs) };
        }
        for (row, o) in rows.zip(outs) {
            let (first, end) = visible.range(row);
            let at = |logical: usize| visible.position(row, logical);
            #[cfg(target_arch = "x86_64")]
            if self.simd != AttendSimd::None {
                // SAFETY: AVX-512 F implies AVX2 and FMA, or they were detected; the head sizes fit the cache's
                // rows (checked by `attend`).
                unsafe { self.unit_avx2(row, kvh, first..end, at, scores, o) };
                continue;
            }
            self.unit_portable(row, kvh, first..end, at, scores, o)
        }
    }

    /// [`Self::unit_avx2`] with 512-bit registers, each key and value row loaded once for two query heads
    /// (scores of eight keys for two heads in 16 registers, reduced together by [`crate::kernels::simd::fold16`]; two
    /// heads' outputs accumulated over each value row), over blocks of [`BLOCK`] rows that stay in L1 while
    /// every head of the group and every row of the unit reads them. The AVX2 unit re-reads the keys from L2
    /// for each head, and its softmax sums in one serial chain.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F; `qk_dim` and `v_dim` are multiples of 16 and at most the cache's head size
    /// (key and value rows are read through raw pointers up to them); every row of `rows` sees at least one
    /// position, and all of them the same first one, `visible(rows.start).0`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn unit_avx512(
        &self,
        rows: std::ops::Range<usize>,
        kvh: usize,
        visible: &impl Visible,
        scores: &mut Vec<f32>,
        outs: &mut [&mut [f32]],
    ) {
        let AttendShape { n_heads: h, n_kv_heads, qk_dim: d, v_dim: dv } = self.shape;
        let g = h / n_kv_heads;
        let first = visible.range(rows.start).0;
        // Per row of the unit: its visible keys (from `first`), and where its `[g, n]` scores start.
        let (mut ns, mut bases) = ([0; MAX_RUN], [0; MAX_RUN]);
        let mut total = 0;
        for (ri, row) in rows.clone().enumerate() {
            (ns[ri], bases[ri]) = (visible.range(row).1 - first, total);
            total += g * ns[ri];
        }
        let outs = &mut outs[..rows.len()];
        let n_max = ns.iter().copied().max().unwrap_or(0);
        scores.clear();
        scores.resize(total, 0.0);
        assert!(outs.iter().all(|o| o.len() == g * dv), "attention output of one unit");
        // Rows `first..` of this head's keys and values, `stride` apart (bounds checked here, once: every
        // position a row sees lies inside them); `at(row, j)` is the row of its `j`-th visible key.
        let stride = self.cache.head_dim();
        let cached = self.cache.len();
        let (keys, values) = (self.cache.key_rows(kvh, first..cached), self.cache.value_rows(kvh, first..cached));
        let (k0, v0) = (keys.as_ptr(), values.as_ptr());
        let at = |row: usize| {
            move |j: usize| {
                let p = visible.position(row, first + j) - first;
                debug_assert!(p < cached - first);
                p
            }
        };
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
                        score_heads::<true>(k0, stride, at(row), d, keys.clone(), a, b);
                    } else {
                        score_heads::<false>(k0, stride, at(row), d, keys.clone(), a, a);
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
                // time waits on the FMA latency.
                let lanes = match dv - c0 {
                    128.. => 8,
                    64.. => 4,
                    32.. => 2,
                    _ => 1,
                };
                // Up to four heads per pass over the block's value rows (three at eight registers each), so
                // that a group of three is one pass of twelve chains, not a pair and a latency-bound single.
                for (ri, (o, row)) in outs.iter_mut().zip(rows.clone()).enumerate() {
                    let (n, op) = (ns[ri], o.as_mut_ptr());
                    let values = j0..(j0 + BLOCK).min(n);
                    let mut i = 0;
                    while i < g && !values.is_empty() {
                        let heads = (g - i).min(if lanes == 8 { 3 } else { 4 });
                        let heads_at = |u: usize| (sp.add(bases[ri] + (i + u) * n), op.add((i + u) * dv));
                        let r = values.clone();
                        macro_rules! pass {
                            ($h:literal, $l:literal) => {
                                value_heads::<$h, $l>(v0, stride, at(row), r, std::array::from_fn(heads_at), c0)
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
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA, and `qk_dim` is at most the cache's head size (each key row is read
    /// through a raw pointer up to it).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unit_avx2(
        &self,
        row: usize,
        kvh: usize,
        logical: std::ops::Range<usize>,
        at: impl Fn(usize) -> usize,
        scores: &mut Vec<f32>,
        o: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let AttendShape { n_heads: h, n_kv_heads, qk_dim: d, v_dim: dv } = self.shape;
        if d % 8 != 0 || dv % 8 != 0 {
            return self.unit_portable(row, kvh, logical, at, scores, o);
        }
        let g = h / n_kv_heads;
        let (first, n) = (logical.start, logical.len());
        scores.clear();
        scores.resize(g * n, 0.0);
        let keys = |pos: usize| self.cache.key(kvh, at(pos)).as_ptr();
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
                *s = dot(q_head, &self.cache.key(kvh, at(first + j))[..d]);
            }
        }
        self.softmax(scores, n);
        for (i, oh) in o.chunks_exact_mut(dv).enumerate() {
            let p = &scores[i * n..(i + 1) * n];
            let mut c0 = 0;
            // 64 dimensions at a time in eight registers; a constant count keeps the sums in registers (with a
            // count known only at run time they lived on the stack, a load and a store per value row).
            while c0 + 64 <= dv {
                self.weighted_values::<8>(p, kvh, |j| at(first + j), c0, oh);
                c0 += 64;
            }
            while c0 < dv {
                self.weighted_values::<1>(p, kvh, |j| at(first + j), c0, oh);
                c0 += 8;
            }
        }
    }

    /// `oh[c0 .. c0 + 8L] = Σ_j p[j] · value(at(j))[c0 .. c0 + 8L]`, in key order.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA (every access is to a bounds-checked slice).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weighted_values<const L: usize>(
        &self,
        p: &[f32],
        kvh: usize,
        at: impl Fn(usize) -> usize,
        c0: usize,
        oh: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let mut acc = [_mm256_setzero_ps(); L];
        for (j, &w) in p.iter().enumerate() {
            let (w, v) = (_mm256_set1_ps(w), self.cache.value(kvh, at(j))[c0..c0 + 8 * L].as_ptr());
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
    fn unit_portable(
        &self,
        row: usize,
        kvh: usize,
        logical: std::ops::Range<usize>,
        at: impl Fn(usize) -> usize,
        scores: &mut Vec<f32>,
        o: &mut [f32],
    ) {
        let AttendShape { n_heads: h, n_kv_heads, qk_dim: d, v_dim: dv } = self.shape;
        let g = h / n_kv_heads;
        let n = logical.len();
        scores.clear();
        scores.resize(g * n, 0.0);
        for (j, pos) in logical.clone().enumerate() {
            let key = &self.cache.key(kvh, at(pos))[..d];
            for i in 0..g {
                let head = kvh * g + i;
                scores[i * n + j] = dot(&self.q[(head * self.t + row) * d..][..d], key);
            }
        }
        self.softmax(scores, n);
        for (j, pos) in logical.enumerate() {
            let value = &self.cache.value(kvh, at(pos))[..dv];
            for (i, oh) in o.chunks_exact_mut(dv).enumerate() {
                let w = scores[i * n + j];
                for (a, b) in oh.iter_mut().zip(value) {
                    *a += w * b;
                }
            }
        }
    }
}

/// Scores of one or two query heads (`a`, and `b` when `PAIR`: query and score pointers) against `keys` (key
/// `j` is row `at(j)` of those `stride` apart from `k0`), each key row loaded once for both: eight keys at a time into 16 registers
/// reduced by [`crate::kernels::simd::fold16`], then the remaining keys one by one.
///
/// # Safety
/// AVX-512 F; `k0` holds rows `at(j)` for every `j` of `keys`, of `d` (a multiple of 16) values each, the
/// queries `d` values, the scores `keys.end`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn score_heads<const PAIR: bool>(
    k0: *const f32,
    stride: usize,
    at: impl Fn(usize) -> usize,
    d: usize,
    keys: std::ops::Range<usize>,
    (qa, sa): (*const f32, *mut f32),
    (qb, sb): (*const f32, *mut f32),
) {
    use crate::kernels::simd::{fold16, FOLD16_SLOT};
    use std::arch::x86_64::*;
    let full = keys.start + (keys.end - keys.start) / 8 * 8;
    for j0 in (keys.start..full).step_by(8) {
        let mut acc = [_mm512_setzero_ps(); 16];
        let rows: [*const f32; 8] = std::array::from_fn(|u| k0.add(at(j0 + u) * stride));
        for c in (0..d).step_by(16) {
            let (xa, xb) = (_mm512_loadu_ps(qa.add(c)), _mm512_loadu_ps(qb.add(c)));
            for u in 0..8 {
                let key = _mm512_loadu_ps(rows[u].add(c));
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
        let key = k0.add(at(j) * stride);
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
/// AVX-512 F; `v0` holds value rows `at(j)` for every `j` of `values`, `stride` apart, with `c0 + 16L` values
/// each; each head's
/// probabilities hold `values.end` values and its output `c0 + 16L`; the outputs do not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn value_heads<const H: usize, const L: usize>(
    v0: *const f32,
    stride: usize,
    at: impl Fn(usize) -> usize,
    values: std::ops::Range<usize>,
    heads: [(*const f32, *mut f32); H],
    c0: usize,
) {
    use std::arch::x86_64::*;
    let mut acc: [[__m512; L]; H] =
        std::array::from_fn(|h| std::array::from_fn(|u| _mm512_loadu_ps(heads[h].1.add(c0 + 16 * u))));
    for j in values {
        let w: [__m512; H] = std::array::from_fn(|h| _mm512_set1_ps(*heads[h].0.add(j)));
        let v = v0.add(at(j) * stride + c0);
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
/// plain fold is a serial chain, which at long contexts makes the softmax's sums a large part of attention).
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
    let p = (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 0.166_666_65)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i + seed) * 7919 % 997) as f32 / 498.5 - 1.0) * 2.0).collect()
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
                let block = attend(&cache, &q, shape, t, 0.125, softcap, Causal { start: ctx, window });
                for row in 0..t {
                    let q1: Vec<f32> = (0..h).flat_map(|head| q[(head * t + row) * d..][..d].to_vec()).collect();
                    let alone = attend(&cache, &q1, shape, 1, 0.125, softcap, Causal { start: ctx + row, window });
                    assert_eq!(
                        alone,
                        block[row * h * d..(row + 1) * h * d],
                        "row {row} of h{h} kv{kv} d{d} {window:?}"
                    );
                }
            }
            let job = AttendJob { cache: &cache, q: &q, shape, t, scale: 0.125, softcap, simd: AttendSimd::detect() };
            for row in 0..t {
                let (mut a, mut b) = (vec![0f32; (h / kv) * d], vec![0f32; (h / kv) * d]);
                job.unit_portable(row, kv - 1, 0..ctx + row + 1, |p| p, &mut Vec::new(), &mut a);
                let mut outs: [&mut [f32]; MAX_RUN] = Default::default();
                outs[0] = &mut b;
                job.unit(row..row + 1, kv - 1, &Ranges(|r| (0, ctx + r + 1)), &mut Vec::new(), outs);
                for (x, y) in a.iter().zip(&b) {
                    assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "h{h} kv{kv} d{d} row {row}: {x} vs {y}");
                }
            }
        }
    }
}
