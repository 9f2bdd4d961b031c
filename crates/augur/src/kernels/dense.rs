//! Products with dense weights in their checkpoint's own float type (f32, f16, bf16), read where they lie: a
//! memory map of the safetensors file, so a bf16 checkpoint streams 2 bytes a weight per token and is never
//! widened in memory.
//!
//! Written by hand, not taken from candle: candle's bf16 product widens both operands to f32 on every call (about
//! 4× slower than f32, see the CPU notes), and its f32 product changes its summation order with the number of
//! rows. Here every output `(row, column)` is one dot product in one fixed order (eight f32 lanes fused
//! multiply-added along `k`, folded by one tree, then the tail), whatever the tile, the row count or the thread
//! it runs on: a token verified in a block gets the bits it gets decoded alone, which keeps greedy speculation
//! lossless. The AVX2 unit and the portable one follow that same order, so the bits are the same on every x86
//! machine.
//!
//! Weights are widened in registers (exactly: bf16 and f16 are subsets of f32) and activations stay f32. AVX-512
//! BF16's `vdpbf16ps` is not used: it rounds the activations to bf16, which would make the output differ from
//! the f32 reference, and decoding is bound by reading the weights, not by the arithmetic.

use std::sync::Arc;

use candle_core::quantized::GgmlDType;

use super::parallel::{for_each_chunk, SharedOut};
use super::quant::QuantKernel;
use crate::error::{Error, Result};

/// A dense weight's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Float {
    F32,
    F16,
    BF16,
}

impl Float {
    pub fn bytes(self) -> usize {
        match self {
            Float::F32 => 4,
            Float::F16 | Float::BF16 => 2,
        }
    }

    fn ggml(self) -> GgmlDType {
        match self {
            Float::F32 => GgmlDType::F32,
            Float::F16 => GgmlDType::F16,
            Float::BF16 => GgmlDType::BF16,
        }
    }

    /// Every element of `bytes` (little-endian), widened exactly.
    pub fn widen(self, bytes: &[u8]) -> Vec<f32> {
        (0..bytes.len() / self.bytes()).map(|i| self.at(bytes, i)).collect()
    }

    /// Element `i` of `bytes` (little-endian), widened exactly.
    fn at(self, bytes: &[u8], i: usize) -> f32 {
        match self {
            Float::F32 => f32::from_le_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]]),
            Float::F16 => half::f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32(),
            Float::BF16 => f32::from_bits((u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]) as u32) << 16),
        }
    }
}

/// Bytes a dense weight is read from: a mapped file shared by all its tensors, or memory of the weight's own.
pub type Bytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A dense weight `[n, k]`, row-major, `dtype` elements starting at byte `start` of `bytes`.
pub struct DenseMatrix {
    bytes: Bytes,
    start: usize,
    dtype: Float,
    n: usize,
    k: usize,
}

/// Weight rows that share each load of an activation vector (a tile's columns).
const COLS: usize = 4;
/// Activation rows that share each widened weight vector: 4 × 3 accumulators, 3 activations and one weight
/// fill the 16 AVX2 registers.
const ROWS: usize = 3;
/// Activation rows a task runs through before its next weights, so that they stay in cache during a prefill.
const ROW_BLOCK: usize = 64;

impl DenseMatrix {
    /// The weight at `bytes[start..]`; `None` when the bytes end before its `n · k` elements.
    pub fn new(bytes: Bytes, start: usize, dtype: Float, n: usize, k: usize) -> Option<Self> {
        let len = n.checked_mul(k)?.checked_mul(dtype.bytes())?;
        (start.checked_add(len)? <= (*bytes).as_ref().len()).then_some(Self { bytes, start, dtype, n, k })
    }

    /// A weight `[n, k]` read from its stored rows (`n · k` elements of `dtype`).
    pub fn from_vec(data: Vec<u8>, dtype: Float, n: usize, k: usize) -> Result<Self> {
        let len = data.len();
        Self::new(Arc::new(data), 0, dtype, n, k)
            .ok_or_else(|| Error::InvalidOption(format!("{len} bytes cannot hold a [{n}, {k}] {dtype:?} weight")))
    }

    fn data(&self) -> &[u8] {
        let len = self.n * self.k * self.dtype.bytes();
        &(*self.bytes).as_ref()[self.start..self.start + len]
    }

    pub fn in_features(&self) -> usize {
        self.k
    }

    /// Row `i` widened to f32 (an embedding's lookup). A row past the weight's panics.
    pub fn row(&self, i: usize) -> Vec<f32> {
        let b = self.dtype.bytes() * self.k;
        self.dtype.widen(&self.data()[i * b..(i + 1) * b])
    }

    /// Outputs `(r0 + r, j + c)` for `r < rows`, `c < cols` → `out[r][c]` (`rows ≤ ROWS`, `cols ≤ COLS`).
    fn tile(&self, x: &[f32], (r0, rows): (usize, usize), (j, cols): (usize, usize), out: &mut [[f32; COLS]; ROWS]) {
        let k = self.k;
        let row_bytes = k * self.dtype.bytes();
        let data = self.data();
        // Missing columns of the last tile repeat its first weight row; their results are not written.
        let w: [&[u8]; COLS] = std::array::from_fn(|c| {
            let row = j + if c < cols { c } else { 0 };
            &data[row * row_bytes..(row + 1) * row_bytes]
        });
        let x = &x[r0 * k..(r0 + rows) * k];
        #[cfg(target_arch = "x86_64")]
        if super::cpu::features().avx2_fma_f16c {
            // SAFETY: AVX2, FMA and F16C were detected; each of `w` holds k elements of `dtype` and `x` holds
            // `rows` rows of k, as `avx2::tile` requires.
            unsafe {
                match (self.dtype, rows) {
                    (Float::F32, 1) => avx2::tile::<1, 0>(&w, x, k, out),
                    (Float::F32, 2) => avx2::tile::<2, 0>(&w, x, k, out),
                    (Float::F32, _) => avx2::tile::<ROWS, 0>(&w, x, k, out),
                    (Float::F16, 1) => avx2::tile::<1, 1>(&w, x, k, out),
                    (Float::F16, 2) => avx2::tile::<2, 1>(&w, x, k, out),
                    (Float::F16, _) => avx2::tile::<ROWS, 1>(&w, x, k, out),
                    (Float::BF16, 1) => avx2::tile::<1, 2>(&w, x, k, out),
                    (Float::BF16, 2) => avx2::tile::<2, 2>(&w, x, k, out),
                    (Float::BF16, _) => avx2::tile::<ROWS, 2>(&w, x, k, out),
                }
            }
            return;
        }
        for (r, o) in out.iter_mut().enumerate().take(rows) {
            for (c, w) in w.iter().enumerate() {
                o[c] = dot_portable(self.dtype, w, &x[r * k..(r + 1) * k]);
            }
        }
    }
}

/// One output: the AVX2 unit's order in plain Rust (eight lanes fused multiply-added along `k`, folded as
/// `avx2::fold` folds them, then the tail), for CPUs without AVX2 and as the reference the tests hold it to.
fn dot_portable(dtype: Float, w: &[u8], x: &[f32]) -> f32 {
    let k8 = x.len() / 8 * 8;
    let mut lanes = [0f32; 8];
    for i in (0..k8).step_by(8) {
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane = dtype.at(w, i + l).mul_add(x[i + l], *lane);
        }
    }
    let half: [f32; 4] = std::array::from_fn(|l| lanes[l] + lanes[l + 4]);
    let mut s = (half[0] + half[2]) + (half[1] + half[3]);
    for (i, &xi) in x.iter().enumerate().skip(k8) {
        s = dtype.at(w, i).mul_add(xi, s);
    }
    s
}

impl QuantKernel for DenseMatrix {
    fn out_features(&self) -> usize {
        self.n
    }

    fn dtype(&self) -> GgmlDType {
        self.dtype.ggml()
    }

    fn gather(&self, ids: &[u32]) -> Result<Option<Arc<dyn QuantKernel>>> {
        let b = self.dtype.bytes() * self.k;
        let data = self.data();
        let mut out = Vec::with_capacity(ids.len() * b);
        for &id in ids {
            let at = id as usize * b;
            let row = data.get(at..at + b).ok_or_else(|| {
                Error::InvalidOption(format!("token id {id} is outside the {} rows of the LM head", self.n))
            })?;
            out.extend_from_slice(row);
        }
        Ok(Some(Arc::new(Self::from_vec(out, self.dtype, ids.len(), self.k)?)))
    }

    fn matmul_first(&self, x: &[f32], m: usize, n: usize) -> Vec<f32> {
        let n = n.min(self.n);
        assert_eq!(x.len(), m * self.k, "activations of {m} rows of {}", self.k);
        let mut out = vec![0f32; m * n];
        let dst = SharedOut::new(&mut out);
        for_each_chunk(n.div_ceil(COLS), |tiles| {
            let mut res = [[0f32; COLS]; ROWS];
            for block in (0..m).step_by(ROW_BLOCK) {
                for t in tiles.clone() {
                    let (j, cols) = (t * COLS, COLS.min(n - t * COLS));
                    for r0 in (block..m.min(block + ROW_BLOCK)).step_by(ROWS) {
                        let rows = ROWS.min(m - r0);
                        self.tile(x, (r0, rows), (j, cols), &mut res);
                        for (r, res) in res.iter().enumerate().take(rows) {
                            // SAFETY: columns j..j + cols belong to tile t, which only this task runs.
                            unsafe { dst.slice((r0 + r) * n + j, cols) }.copy_from_slice(&res[..cols]);
                        }
                    }
                }
            }
        });
        out
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{COLS, ROWS};

    /// Eight elements at `p` widened to f32: `T` 0 is f32, 1 f16, 2 bf16.
    ///
    /// # Safety
    /// AVX2 and F16C; `p` is valid for reads of eight elements of type `T`.
    #[inline(always)]
    unsafe fn load8<const T: u8>(p: *const u8) -> __m256 {
        match T {
            0 => _mm256_loadu_ps(p as *const f32),
            1 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                p as *const __m128i,
            )))),
        }
    }

    /// The eight lanes' sum: halves added lane by lane, then pairs, then the two left.
    #[inline(always)]
    unsafe fn fold(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// `out[r][c]` = weight row `w[c]` · activation row `r` of `x` (`R` rows of `k`), for `R ≤ ROWS`: each weight
    /// vector is widened once for the `R` rows, each activation vector loaded once for the `COLS` weight rows.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C; each `w[c]` holds at least `k` elements of type `T` and `x` at least
    /// `R · k` floats (the vector loads are unchecked).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile<const R: usize, const T: u8>(
        w: &[&[u8]; COLS],
        x: &[f32],
        k: usize,
        out: &mut [[f32; COLS]; ROWS],
    ) {
        let size = if T == 0 { 4 } else { 2 };
        let k8 = k / 8 * 8;
        let mut acc = [[_mm256_setzero_ps(); R]; COLS];
        let wp: [*const u8; COLS] = std::array::from_fn(|c| w[c].as_ptr());
        let xp = x.as_ptr();
        let mut i = 0;
        while i < k8 {
            let a: [__m256; R] = std::array::from_fn(|r| _mm256_loadu_ps(xp.add(r * k + i)));
            for c in 0..COLS {
                let v = load8::<T>(wp[c].add(i * size));
                for r in 0..R {
                    acc[c][r] = _mm256_fmadd_ps(v, a[r], acc[c][r]);
                }
            }
            i += 8;
        }
        for c in 0..COLS {
            for r in 0..R {
                let mut s = fold(acc[c][r]);
                for e in k8..k {
                    s = super::Float::of(T).at(w[c], e).mul_add(x[r * k + e], s);
                }
                out[r][c] = s;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Float {
    /// The type the AVX2 unit numbers `t`.
    const fn of(t: u8) -> Float {
        match t {
            0 => Float::F32,
            1 => Float::F16,
            _ => Float::BF16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 7919 + seed) % 1013) as f32 / 506.5 - 1.0).collect()
    }

    /// `values` stored as `dtype` (rounded where it is narrower).
    fn stored(v: &[f32], dtype: Float) -> Vec<u8> {
        match dtype {
            Float::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Float::F16 => v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect(),
            Float::BF16 => v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
        }
    }

    /// Every row's outputs are the bits of the portable order, alone or in any block (tiles of 1 to 3 rows,
    /// past a row block), for every type and shape (k with and without a tail, a last tile of 1 to 3 columns),
    /// and each is the exact dot product up to f32 rounding.
    #[test]
    fn rows_are_independent_and_match_the_portable_order() {
        for dtype in [Float::F32, Float::F16, Float::BF16] {
            for (n, k) in [(1, 8), (5, 13), (6, 64), (7, 200), (33, 96), (64, 1000)] {
                let w = stored(&values(n * k, 3), dtype);
                let matrix = DenseMatrix::from_vec(w.clone(), dtype, n, k).unwrap();
                assert_eq!(matrix.out_features(), n);
                let m = 70;
                let x = values(m * k, 5);
                let full = matrix.matmul_first(&x, m, n);
                for r in 0..m {
                    let alone = matrix.matmul_first(&x[r * k..(r + 1) * k], 1, n);
                    for j in 0..n {
                        let row = &w[j * k * dtype.bytes()..(j + 1) * k * dtype.bytes()];
                        let reference = dot_portable(dtype, row, &x[r * k..(r + 1) * k]);
                        let what = format!("{dtype:?} [{n}, {k}] row {r} column {j}");
                        assert_eq!(full[r * n + j].to_bits(), reference.to_bits(), "{what} in 70 rows");
                        assert_eq!(alone[j].to_bits(), reference.to_bits(), "{what} alone");
                        let exact: f64 = (0..k).map(|e| dtype.at(row, e) as f64 * x[r * k + e] as f64).sum();
                        assert!((reference as f64 - exact).abs() < 1e-4 * k as f64, "{what}: {reference} vs {exact}");
                    }
                }
                for rows in [2, 3, 4, 16] {
                    let block = matrix.matmul_first(&x[..rows * k], rows, n);
                    assert_eq!(block, full[..rows * n], "{dtype:?} [{n}, {k}]: {rows} rows");
                }
                let first = matrix.matmul_first(&x[..2 * k], 2, 3.min(n));
                let want: Vec<f32> = (0..2).flat_map(|r| full[r * n..r * n + 3.min(n)].to_vec()).collect();
                assert_eq!(first, want, "{dtype:?} [{n}, {k}]: the first outputs");
            }
        }
    }

    #[test]
    fn rows_widen_exactly_and_short_bytes_are_refused() {
        let v = values(24, 1);
        for dtype in [Float::F32, Float::F16, Float::BF16] {
            let m = DenseMatrix::from_vec(stored(&v, dtype), dtype, 3, 8).unwrap();
            let want: Vec<f32> = match dtype {
                Float::F32 => v[8..16].to_vec(),
                Float::F16 => v[8..16].iter().map(|x| half::f16::from_f32(*x).to_f32()).collect(),
                Float::BF16 => v[8..16].iter().map(|x| half::bf16::from_f32(*x).to_f32()).collect(),
            };
            assert_eq!(m.row(1), want);
            assert!(DenseMatrix::from_vec(stored(&v, dtype), dtype, 4, 8).is_err());
        }
        assert!(DenseMatrix::new(Arc::new(vec![0u8; 16]), 4, Float::F32, 1, 4).is_none());
        assert!(DenseMatrix::new(Arc::new(vec![0u8; 16]), 0, Float::F32, usize::MAX, 4).is_none());
    }
}
