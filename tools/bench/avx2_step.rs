//! The AVX2 quantized tiles' inner step alone: for one activation row and 64 weights of 8 rows, two 4-byte
//! broadcasts, two `vpmaddubsw` and two `vpaddw`, 4 independent rows, weights in registers (and the same with
//! plain 32-byte loads instead of broadcasts). Its rate bounds any u8 x i8 product on a CPU without `vpdpbusd`.
//! x86-64 with AVX2 only.
//!
//!   rustc -O tools/bench/avx2_step.rs -o /tmp/avx2_step && taskset -c 1 /tmp/avx2_step
use std::arch::x86_64::*;
use std::time::Instant;

#[target_feature(enable = "avx2")]
unsafe fn steps(a: &[i32], iters: usize, broadcast: bool) -> (f64, __m256i) {
    let (lo, hi) = (_mm256_set1_epi8(3), _mm256_set1_epi8(5));
    let mut d = [_mm256_setzero_si256(); 4];
    let p = a.as_ptr();
    let t = Instant::now();
    for i in 0..iters {
        let o = (i & 7) * 8;
        for r in 0..4 {
            let (x, y) = if broadcast {
                (_mm256_set1_epi32(*p.add(o + 2 * r)), _mm256_set1_epi32(*p.add(o + 2 * r + 1)))
            } else {
                (_mm256_loadu_si256(p.add(o + 8 * r) as *const _), _mm256_loadu_si256(p.add(o + 8 * r + 8) as *const _))
            };
            d[r] = _mm256_add_epi16(d[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, x), _mm256_maddubs_epi16(hi, y)));
        }
    }
    (t.elapsed().as_secs_f64(), _mm256_add_epi16(_mm256_add_epi16(d[0], d[1]), _mm256_add_epi16(d[2], d[3])))
}

fn main() {
    assert!(is_x86_feature_detected!("avx2"), "this probe needs AVX2");
    let a: Vec<i32> = (0..256).map(|i| i * 7).collect();
    let iters = 200_000_000usize;
    for broadcast in [true, false, true, false] {
        // SAFETY: AVX2 was detected above; every read is inside `a` (offsets below 8 * 7 + 8 * 3 + 16 < 256).
        let (s, v) = unsafe { steps(&a, iters, broadcast) };
        std::hint::black_box(v);
        let per_s = (iters * 4) as f64 / s;
        let how = if broadcast { "broadcasts from memory" } else { "plain loads" };
        println!(
            "{how}: {:.2} G steps/s (64 multiply-adds each) = {:.1} G/s per core",
            per_s / 1e9,
            per_s * 64.0 / 1e9
        );
    }
}
