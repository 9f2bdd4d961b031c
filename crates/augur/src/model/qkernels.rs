//! Matrix products for the GGUF block types that candle 0.11 only has scalar dot products for on x86 (Q4_1,
//! used by SmolLM2's Q4_1 file, and Q5_0, most of Qwen2.5-Coder-0.5B and Gemma 3 270M): measured at 87% of a
//! SmolLM2 forward in `vec_dot_unopt`.
//!
//! Activations are quantized per 32-element block to 8 bits (llama.cpp's Q8_1: scale, integer sum), every
//! weight row is read once for all the rows of a block of tokens (it stays in L1 while it meets each of
//! them), and each output element is computed by the same dot product whatever the number of rows: a token
//! verified in a block gets bit-identical logits to the same token decoded alone.

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;
use rayon::prelude::*;

use crate::error::{Error, Result};

const QK: usize = 32;

/// The weight types with a kernel here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// `d: f16, m: f16, qs: [u8; 16]`, value `d·q + m`, q in 0..16.
    Q4_1,
    /// `d: f16, qh: [u8; 4], qs: [u8; 16]`, value `d·(q − 16)`, q in 0..32 (fifth bit in `qh`).
    Q5_0,
}

impl BlockKind {
    fn of(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::Q4_1 => Some(BlockKind::Q4_1),
            GgmlDType::Q5_0 => Some(BlockKind::Q5_0),
            _ => None,
        }
    }

    fn block_bytes(self) -> usize {
        match self {
            BlockKind::Q4_1 => 20,
            BlockKind::Q5_0 => 22,
        }
    }
}

/// A quantized weight `[n, k]` in GGUF block layout, rows contiguous.
#[derive(Debug)]
pub struct BlockMatrix {
    kind: BlockKind,
    n: usize,
    k: usize,
    data: Vec<u8>,
}

/// One quantized activation block as llama.cpp's Q8_1 stores it: the integers, the scale and the scaled sum
/// (both rounded through f16, as ggml and candle do), and the integer sum.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Q8Block {
    qs: [i8; QK],
    d: f32,
    /// `d · Σ qs`.
    s: f32,
    isum: i32,
}

impl BlockMatrix {
    /// `Some` for the block types this module has kernels for.
    pub fn from_qtensor(q: &QTensor) -> Result<Option<Self>> {
        let Some(kind) = BlockKind::of(q.dtype()) else { return Ok(None) };
        let (n, k) = q.shape().dims2()?;
        if k % QK != 0 {
            return Ok(None);
        }
        let data = q.data()?.into_owned();
        let expected = n * (k / QK) * kind.block_bytes();
        if data.len() != expected {
            return Err(Error::ShapeMismatch {
                name: format!("{kind:?} block data of a [{n}, {k}] tensor (bytes)"),
                expected: vec![expected],
                actual: vec![data.len()],
            });
        }
        Ok(Some(Self { kind, n, k, data }))
    }

    pub fn out_features(&self) -> usize {
        self.n
    }

    /// `x`: `[m, k]` row-major → `[m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        debug_assert_eq!(x.len(), m * k);
        let nb = k / QK;
        let act: Vec<Q8Block> = x.chunks_exact(QK).map(quantize_block).collect();
        let row_bytes = nb * self.kind.block_bytes();
        // `[n, m]`: each weight row gives its m outputs together; transposed at the end.
        let mut out_t = vec![0f32; n * m];
        let simd = Simd::detect();
        out_t.par_chunks_mut(m * ROWS_PER_TASK).enumerate().for_each(|(task, chunk)| {
            let first = task * ROWS_PER_TASK;
            for (i, outs) in chunk.chunks_mut(m).enumerate() {
                let w = &self.data[(first + i) * row_bytes..(first + i + 1) * row_bytes];
                for (tile, o) in outs.chunks_mut(TILE).enumerate() {
                    let rows = tile * TILE..tile * TILE + o.len();
                    dot_rows(self.kind, simd, w, &act[rows.start * nb..rows.end * nb], o);
                }
            }
        });
        if m == 1 {
            return out_t;
        }
        let mut out = vec![0f32; m * n];
        for (j, outs) in out_t.chunks_exact(m).enumerate() {
            for (r, v) in outs.iter().enumerate() {
                out[r * n + j] = *v;
            }
        }
        out
    }
}

/// Activation rows that share one unpacking of each weight block.
const TILE: usize = 4;

/// Weight rows per parallel task: enough work to amortize scheduling, small enough to balance two cores.
const ROWS_PER_TASK: usize = 32;

/// llama.cpp's `quantize_row_q8_1` for one block.
fn quantize_block(x: &[f32]) -> Q8Block {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK];
    let mut isum = 0i32;
    for (q, v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
        isum += *q as i32;
    }
    let round = |v: f32| f16::from_f32(v).to_f32();
    Q8Block { qs, d: round(d), s: round(d * isum as f32), isum }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Simd {
    Avx2,
    Scalar,
}

impl Simd {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            return Simd::Avx2;
        }
        Simd::Scalar
    }
}

/// `out[r]` = weight row `w` · activation row `r` of `acts` (`out.len()` rows of `w`'s block count, at most
/// [`TILE`]). Every row gets the same arithmetic in the same order whatever the number of rows.
fn dot_rows(kind: BlockKind, simd: Simd, w: &[u8], acts: &[Q8Block], out: &mut [f32]) {
    let nb = acts.len() / out.len();
    match simd {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2, FMA and F16C were detected at run time; `w` holds `nb` blocks of `kind`.
        Simd::Avx2 => unsafe {
            match out.len() {
                1 => avx2::dot_tile::<1>(kind, w, acts, nb, out),
                2 => avx2::dot_tile::<2>(kind, w, acts, nb, out),
                3 => avx2::dot_tile::<3>(kind, w, acts, nb, out),
                _ => avx2::dot_tile::<TILE>(kind, w, acts, nb, out),
            }
        },
        _ => {
            for (r, o) in out.iter_mut().enumerate() {
                *o = dot_scalar(kind, w, &acts[r * nb..(r + 1) * nb]);
            }
        }
    }
}

/// The weight block's integers (0..16 for Q4_1, 0..32 for Q5_0), its scale, and its offset `m` (Q4_1) or
/// `−16·d` (Q5_0).
fn unpack_scalar(kind: BlockKind, b: &[u8]) -> ([u8; QK], f32, f32) {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    let mut q = [0u8; QK];
    match kind {
        BlockKind::Q4_1 => {
            let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
            for j in 0..16 {
                q[j] = b[4 + j] & 0x0F;
                q[j + 16] = b[4 + j] >> 4;
            }
            (q, d, m)
        }
        BlockKind::Q5_0 => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                q[j] = (b[6 + j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                q[j + 16] = (b[6 + j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
            }
            (q, d, -16.0 * d)
        }
    }
}

fn dot_scalar(kind: BlockKind, w: &[u8], act: &[Q8Block]) -> f32 {
    let bytes = kind.block_bytes();
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(bytes).zip(act) {
        let (q, d, offset) = unpack_scalar(kind, b);
        let isum: i32 = q.iter().zip(&a.qs).map(|(&x, &y)| x as i32 * y as i32).sum();
        sum += d * a.d * isum as f32 + offset_term(kind, offset, a);
    }
    sum
}

/// The weight offset times the activation sum: `m · s` for Q4_1 (as ggml), `−16·d_w · d_a · Σq` for Q5_0.
#[inline]
fn offset_term(kind: BlockKind, offset: f32, a: &Q8Block) -> f32 {
    match kind {
        BlockKind::Q4_1 => offset * a.s,
        BlockKind::Q5_0 => offset * a.d * a.isum as f32,
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BlockKind, Q8Block};

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16_to_f32(b: &[u8]) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes([b[0], b[1]]) as i32)))
    }

    /// 32 bytes, 0xFF where bit `i` of `bits` is set (llama.cpp's `bytes_from_bits_32`).
    #[target_feature(enable = "avx2")]
    unsafe fn bytes_from_bits(bits: u32) -> __m256i {
        let v = _mm256_set1_epi32(bits as i32);
        let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        let spread = _mm256_shuffle_epi8(v, shuf);
        let mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe_u64 as i64);
        _mm256_cmpeq_epi8(_mm256_or_si256(spread, mask), _mm256_set1_epi64x(-1))
    }

    /// `R` activation rows (`acts`: `R × nb` blocks) against one weight row: each weight block is unpacked
    /// once for all of them.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_tile<const R: usize>(kind: BlockKind, w: &[u8], acts: &[Q8Block], nb: usize, out: &mut [f32]) {
        let bytes = kind.block_bytes();
        let low = _mm_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut offsets = [0f32; R];
        for (i, b) in w.chunks_exact(bytes).enumerate() {
            let d = f16_to_f32(b);
            let (qs_at, offset) = match kind {
                BlockKind::Q4_1 => (4, f16_to_f32(&b[2..])),
                BlockKind::Q5_0 => (6, -16.0 * d),
            };
            let packed = _mm_loadu_si128(b[qs_at..].as_ptr() as *const __m128i);
            let lo = _mm_and_si128(packed, low);
            let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
            let mut q = _mm256_set_m128i(hi, lo);
            if kind == BlockKind::Q5_0 {
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                q = _mm256_or_si256(q, _mm256_and_si256(bytes_from_bits(qh), _mm256_set1_epi8(0x10)));
            }
            for r in 0..R {
                let a = &acts[r * nb + i];
                let y = _mm256_load_si256(a.qs.as_ptr() as *const __m256i);
                let prod = _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), _mm256_cvtepi32_ps(prod), acc[r]);
                offsets[r] += super::offset_term(kind, offset, a);
            }
        }
        for r in 0..R {
            let s = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            out[r] = _mm_cvtss_f32(s) + offsets[r];
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    fn weights(kind: GgmlDType, n: usize, k: usize) -> QTensor {
        let vals: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * (1.0 + (i % 7) as f32)).collect();
        let t = Tensor::from_vec(vals, (n, k), &Device::Cpu).unwrap();
        QTensor::quantize(&t, kind).unwrap()
    }

    fn input(m: usize, k: usize) -> Vec<f32> {
        (0..m * k).map(|i| ((i * 13 % 29) as f32 / 14.0 - 1.0) * 0.5).collect()
    }

    /// Against candle's own (scalar) kernel for these types, which quantizes activations the same way.
    #[test]
    fn matches_candle_kernel() {
        use candle_core::Module;
        for kind in [GgmlDType::Q4_1, GgmlDType::Q5_0] {
            let (n, k, m) = (70, 96, 3);
            let q = weights(kind, n, k);
            let bm = BlockMatrix::from_qtensor(&q).unwrap().unwrap();
            let x = input(m, k);
            let y = bm.matmul(&x, m);
            let reference = candle_core::quantized::QMatMul::from_qtensor(q)
                .unwrap()
                .forward(&Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            for (i, (a, b)) in y.iter().zip(&reference).enumerate() {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{kind:?} [{i}]: {a} vs candle {b}");
            }
        }
    }

    /// The SIMD and scalar dot products agree, and a row's result does not depend on the other rows.
    #[test]
    fn rows_are_independent_and_simd_matches_scalar() {
        for kind in [GgmlDType::Q4_1, GgmlDType::Q5_0] {
            let (n, k, m) = (40, 128, 5);
            let q = weights(kind, n, k);
            let bm = BlockMatrix::from_qtensor(&q).unwrap().unwrap();
            let x = input(m, k);
            let all = bm.matmul(&x, m);
            for r in 0..m {
                let one = bm.matmul(&x[r * k..(r + 1) * k], 1);
                assert_eq!(&all[r * n..(r + 1) * n], &one[..], "{kind:?} row {r}");
            }
            let act: Vec<Q8Block> = x[..k].chunks_exact(QK).map(quantize_block).collect();
            let row = &bm.data[..(k / QK) * bm.kind.block_bytes()];
            let mut v = [0f32];
            dot_rows(bm.kind, Simd::detect(), row, &act, &mut v);
            let (s, v) = (dot_scalar(bm.kind, row, &act), v[0]);
            assert!((s - v).abs() <= 1e-4 * (1.0 + s.abs()), "{kind:?}: scalar {s} vs simd {v}");
        }
    }
}
