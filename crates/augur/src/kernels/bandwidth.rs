//! The machine's memory read bandwidth, as the kernels' threads see it: what bounds decoding, which reads every
//! weight once per token. `augur bench` divides a model's bytes by it to say how close decoding is to the bound.

use std::time::Instant;

use rayon::prelude::*;

/// Bytes per second (best of `reps`) at which the pool's threads read a buffer of `bytes` (far larger than the
/// caches), each thread a share of it.
pub fn read_bytes_per_s(bytes: usize, reps: usize) -> f64 {
    let words: Vec<u64> = (0..(bytes / 8) as u64).collect();
    let mut best = 0f64;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let folded = words.par_chunks(1 << 15).map(|c| c.iter().fold(0, |a, &b| a ^ b)).reduce(|| 0, |a, b| a ^ b);
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(folded);
        best = best.max(words.len() as f64 * 8.0 / secs);
    }
    best
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_whole_buffer_at_a_positive_rate() {
        let rate = super::read_bytes_per_s(1 << 20, 2);
        assert!(rate.is_finite() && rate > 0.0, "{rate}");
    }
}
