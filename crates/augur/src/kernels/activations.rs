//! The gated MLP's `silu(gate) · up` in one pass, with the bits of candle's `silu` followed by its product
//! (`x / (e^−x + 1) · u`, e^−x from glibc's `expf`). Candle calls `expf` per element and multiplies in a second
//! pass, a visible share of a small model's forward. Here, with AVX-512, `expf` is glibc's own algorithm (Arm's
//! optimized routines: 2^(k/32) from a table times a degree-3 polynomial, in f64) eight lanes at a time, which
//! gives glibc's results bit for bit (checked against `f32::exp` over a sweep of the whole range), so outputs do
//! not move: with activations quantized to 8 bits, a one-ulp change can flip a near tie many layers later.

use super::parallel::{for_each_chunk, SharedOut};

/// Elements from which [`silu_mul`] splits its work over the pool: below, the hand-off costs more than half
/// the work (SmolLM2's 1,536 per token stay on one core).
const PARALLEL_FROM: usize = 2048;

/// Elements per item of [`silu_mul`]'s split (a whole number of AVX-512 vectors).
const UNIT: usize = 64;

/// `up[i] = silu(gate[i]) · up[i]`. Each element is computed alone, so splitting the work changes no bits.
pub fn silu_mul(gate: &[f32], up: &mut [f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up sizes");
    if up.len() >= PARALLEL_FROM {
        // On the products' pool, whose threads are awake between the products around this: a rayon region here
        // would wake a sleeping rayon worker, which then contends with them for the cores.
        let n = up.len();
        let out = SharedOut::new(up);
        for_each_chunk(n.div_ceil(UNIT), |units| {
            let (start, end) = (units.start * UNIT, n.min(units.end * UNIT));
            // SAFETY: the chunks' unit ranges are disjoint, so each element is written by one task only.
            let u = unsafe { out.slice(start, end - start) };
            silu_mul_here(&gate[start..end], u);
        });
    } else {
        silu_mul_here(gate, up);
    }
}

/// [`silu_mul`] on the calling thread.
pub(super) fn silu_mul_here(gate: &[f32], up: &mut [f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up sizes");
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: AVX-512 F was detected; `gate` and `up` are as long as each other (asserted above).
        return unsafe { avx512::silu_mul(gate, up) };
    }
    for (u, &g) in up.iter_mut().zip(gate) {
        *u *= silu(g);
    }
}

/// Candle's f32 SiLU.
#[inline]
fn silu(x: f32) -> f32 {
    x / ((-x).exp() + 1.0)
}

/// Table bits of the exponential: 2^(k/32) for k mod 32.
const TABLE_BITS: u32 = 5;
const N: usize = 1 << TABLE_BITS;

/// `bits(2^(i/32)) − (i << 47)`: adding `k << 47` for an integer `k` (k mod 32 = i) gives 2^(k/32) as bits.
fn exp_table() -> [u64; N] {
    std::array::from_fn(|i| ((i as f64) / N as f64).exp2().to_bits().wrapping_sub((i as u64) << (52 - TABLE_BITS)))
}

/// N / ln 2.
const INV_LN2_N: f64 = std::f64::consts::LOG2_E * N as f64;
/// 1.5 · 2^52: adding it rounds to an integer held in the low bits.
const SHIFT: f64 = 6_755_399_441_055_744.0;
/// The polynomial 2^(r/N) ≈ 1 + C2·r + C1·r² + C0·r³ for |r| ≤ 1/2.
const C: [f64; 3] = [
    f64::from_bits(0x3fac_6af8_4b91_2394) / (N * N * N) as f64,
    f64::from_bits(0x3fce_bfce_50fa_c4f3) / (N * N) as f64,
    f64::from_bits(0x3fe6_2e42_ff0c_52d6) / N as f64,
];

/// glibc's `expf` on one value, for the tests (the kernel runs the same steps on eight lanes); valid on
/// [−104, 89], where e^x rounds to 0 below and to infinity above.
#[cfg(test)]
fn expf(x: f32, table: &[u64; N]) -> f32 {
    let xd = x as f64;
    let z = INV_LN2_N * xd;
    let kd = z + SHIFT;
    let ki = kd.to_bits();
    let r = z - (kd - SHIFT);
    let s = f64::from_bits(table[(ki % N as u64) as usize].wrapping_add(ki << (52 - TABLE_BITS)));
    let y = C[0].mul_add(r, C[1]).mul_add(r * r, C[2].mul_add(r, 1.0));
    (y * s) as f32
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{exp_table, C, INV_LN2_N, N, SHIFT, TABLE_BITS};

    pub fn available() -> bool {
        crate::kernels::cpu::features().avx512f
    }

    /// [`super::silu_mul_here`] eight lanes at a time, the tail as candle does it.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F, and `up` holds at least `gate.len()` values (it is read and written through
    /// raw pointers up to there).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn silu_mul(gate: &[f32], up: &mut [f32]) {
        let table = exp_table();
        let t: [__m512i; 4] = std::array::from_fn(|q| _mm512_loadu_si512(table[8 * q..].as_ptr() as *const _));
        let full = gate.len() / 8 * 8;
        for i in (0..full).step_by(8) {
            let x = _mm256_loadu_ps(gate.as_ptr().add(i));
            let e = expf(_mm256_sub_ps(_mm256_setzero_ps(), x), &t);
            let s = _mm256_div_ps(x, _mm256_add_ps(e, _mm256_set1_ps(1.0)));
            let u = up.as_mut_ptr().add(i);
            _mm256_storeu_ps(u, _mm256_mul_ps(s, _mm256_loadu_ps(u)));
        }
        for (u, &g) in up[full..].iter_mut().zip(&gate[full..]) {
            *u *= super::silu(g);
        }
    }

    /// e^x of eight values, as `super::expf` (inputs clamped to its range).
    ///
    /// # Safety
    /// The CPU supports AVX-512 F. It reads no memory but its arguments.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn expf(x: __m256, t: &[__m512i; 4]) -> __m256 {
        let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-104.0)), _mm256_set1_ps(89.0));
        let xd = _mm512_cvtps_pd(x);
        let z = _mm512_mul_pd(_mm512_set1_pd(INV_LN2_N), xd);
        let kd = _mm512_add_pd(z, _mm512_set1_pd(SHIFT));
        let ki = _mm512_castpd_si512(kd);
        let r = _mm512_sub_pd(z, _mm512_sub_pd(kd, _mm512_set1_pd(SHIFT)));
        // Entry ki mod 32: bits 0..3 pick among 16 entries of a pair of registers, bit 4 the pair.
        let low = _mm512_permutex2var_epi64(t[0], ki, t[1]);
        let high = _mm512_permutex2var_epi64(t[2], ki, t[3]);
        let entry = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(N as i64 / 2)), low, high);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(entry, _mm512_slli_epi64::<{ 52 - TABLE_BITS }>(ki)));
        let c = |i: usize| _mm512_set1_pd(C[i]);
        let y = _mm512_fmadd_pd(
            _mm512_fmadd_pd(c(0), r, c(1)),
            _mm512_mul_pd(r, r),
            _mm512_fmadd_pd(c(2), r, _mm512_set1_pd(1.0)),
        );
        _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 97th float of [−110, 100] and the edges: the exponential is glibc's bit for bit (on other C
    /// libraries, within an ulp of theirs).
    #[test]
    fn exp_is_glibcs() {
        let table = exp_table();
        let mut xs: Vec<f32> = vec![-104.0, -103.972_08, -87.336_55, 0.0, -0.0, 88.722_83, 88.722_84, 89.0];
        let (lo, hi) = ((-110f32).to_bits(), 100f32.to_bits());
        xs.extend((0..=hi).step_by(97).map(f32::from_bits));
        xs.extend((0x8000_0000u32..=lo).step_by(97).map(f32::from_bits));
        for x in xs {
            let (ours, libm) = (expf(x.clamp(-104.0, 89.0), &table), x.exp());
            if cfg!(all(target_os = "linux", target_env = "gnu")) {
                assert_eq!(ours.to_bits(), libm.to_bits(), "e^{x}: {ours} against {libm}");
            } else {
                assert!((ours.to_bits() as i64 - libm.to_bits() as i64).abs() <= 1, "e^{x}: {ours} against {libm}");
            }
        }
    }

    /// The vectorized pass gives candle's bits, tail included, on one thread (1,003 elements) and split over
    /// the pool (5,003: past `PARALLEL_FROM`, and not a whole number of units).
    #[test]
    fn silu_mul_is_candles() {
        use candle_core::{Device, Tensor};
        for n in [1003, PARALLEL_FROM + 2955] {
            let gate: Vec<f32> = (0..n).map(|i| (i as f32 - 500.0) * 0.37 + (i % 7) as f32 * 1e-3).collect();
            let up: Vec<f32> = (0..n).map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.25).collect();
            let mut ours = up.clone();
            silu_mul(&gate, &mut ours);
            let t = |v: &[f32]| Tensor::from_slice(v, v.len(), &Device::Cpu).unwrap();
            let want = (candle_nn::ops::silu(&t(&gate)).unwrap() * t(&up)).unwrap().to_vec1::<f32>().unwrap();
            for ((o, w), g) in ours.iter().zip(&want).zip(&gate) {
                assert_eq!(o.to_bits(), w.to_bits(), "silu({g}) of {n}: {o} against {w}");
            }
        }
    }
}
