//! Register-level steps shared by the AVX-512 kernels (attention's scores, the activation quantization),
//! written with intrinsics because each is a fixed tree of cross-lane shuffles.

use std::arch::x86_64::*;

/// Where [`fold16`] wants its `u`-th input: it folds in a tree whose natural output order is this transpose of
/// 4 × 4.
pub(crate) const FOLD16_SLOT: [usize; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// Lane `u` of the result is the sum (the maximum, with `MAX`) of the 16 lanes of `a[FOLD16_SLOT[u]]`: four
/// rounds of shuffles and adds (16 → 8 → 4 → 2 → 1 registers) instead of 16 separate horizontal reductions.
///
/// # Safety
/// The CPU supports AVX-512 F ([`crate::kernels::cpu::Features::avx512f`]). It reads and writes no memory
/// but its argument and result.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn fold16<const MAX: bool>(a: &[__m512; 16]) -> __m512 {
    let op = |x: __m512, y: __m512| if MAX { _mm512_max_ps(x, y) } else { _mm512_add_ps(x, y) };
    // Each 256-bit half of v[m] holds 8 partials of a[2m] and of a[2m + 1].
    let v: [__m512; 8] = std::array::from_fn(|m| {
        let (x, y) = (a[2 * m], a[2 * m + 1]);
        op(_mm512_shuffle_f32x4::<0x44>(x, y), _mm512_shuffle_f32x4::<0xEE>(x, y))
    });
    // Each 128-bit lane L of w[m] holds 4 partials of a[4m + L].
    let w: [__m512; 4] = std::array::from_fn(|m| {
        let (x, y) = (v[2 * m], v[2 * m + 1]);
        op(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xDD>(x, y))
    });
    let z: [__m512; 2] = std::array::from_fn(|p| {
        let (x, y) = (w[2 * p], w[2 * p + 1]);
        op(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y))
    });
    op(_mm512_shuffle_ps::<0x44>(z[0], z[1]), _mm512_shuffle_ps::<0xEE>(z[0], z[1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold16_folds_each_register_into_its_lane() {
        if !crate::kernels::cpu::features().avx512f {
            return;
        }
        let vals: Vec<[f32; 16]> =
            (0..16).map(|r| std::array::from_fn(|l| ((r * 16 + l) * 7 % 23) as f32 * 0.5 - 3.0)).collect();
        // SAFETY: AVX-512 F was detected.
        let (sums, maxima) = unsafe {
            let mut a = [_mm512_setzero_ps(); 16];
            for (u, slot) in FOLD16_SLOT.iter().enumerate() {
                a[*slot] = _mm512_loadu_ps(vals[u].as_ptr());
            }
            let (mut sums, mut maxima) = ([0f32; 16], [0f32; 16]);
            _mm512_storeu_ps(sums.as_mut_ptr(), fold16::<false>(&a));
            _mm512_storeu_ps(maxima.as_mut_ptr(), fold16::<true>(&a));
            (sums, maxima)
        };
        for (u, v) in vals.iter().enumerate() {
            assert_eq!(sums[u], v.iter().sum::<f32>(), "sum, lane {u}");
            assert_eq!(maxima[u], v.iter().fold(f32::MIN, |a, &b| a.max(b)), "maximum, lane {u}");
        }
    }
}
