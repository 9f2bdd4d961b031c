//! Picking tokens: argmax, softmax and a seeded multinomial sampler.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::config::GenerationConfig;

/// Index of the largest value, the first one on ties (as `torch.argmax`). A NaN counts as the largest value, as in
/// torch. Returns 0 for an empty slice.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &x) in logits.iter().enumerate() {
        if x.is_nan() {
            return i as u32;
        }
        if x > best_value {
            best = i;
            best_value = x;
        }
    }
    best as u32
}

/// Numerically stable softmax; `-inf` logits get probability 0.
///
/// Degenerate inputs, where torch returns NaN: all `-inf` gives all zeros, and `+inf` logits share the mass equally.
/// A NaN logit makes every probability NaN, as in torch.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let mut probs = logits.to_vec();
    softmax_in_place(&mut probs);
    probs
}

/// [`softmax`] without allocating.
pub fn softmax_in_place(values: &mut [f32]) {
    let (max, has_nan) = max_and_nan(values);
    if has_nan {
        values.fill(f32::NAN);
        return;
    }
    if max == f32::NEG_INFINITY {
        values.fill(0.0);
        return;
    }
    if max == f32::INFINITY {
        let n = values.iter().filter(|&&x| x == f32::INFINITY).count() as f32;
        for v in values.iter_mut() {
            *v = if *v == f32::INFINITY { 1.0 / n } else { 0.0 };
        }
        return;
    }
    for v in values.iter_mut() {
        *v = exp_f32(*v - max);
    }
    let inv = (1.0 / sum_f64(values)) as f32;
    for v in values.iter_mut() {
        *v *= inv;
    }
}

/// Largest value ignoring NaN (`-inf` for none), and whether there is a NaN. Eight lanes so it vectorises.
pub(crate) fn max_and_nan(values: &[f32]) -> (f32, bool) {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut nan = false;
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = if x > *m { x } else { *m };
            nan |= x.is_nan();
        }
    }
    for &x in rest {
        lanes[0] = if x > lanes[0] { x } else { lanes[0] };
        nan |= x.is_nan();
    }
    (lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max), nan)
}

/// `ln Σ exp(x)` over finite `values` (the log-softmax's normaliser), shifted by the largest and summed in double
/// precision in eight lanes, as [`softmax_in_place`] sums.
pub(crate) fn log_sum_exp(values: &[f32]) -> f32 {
    let (max, _) = max_and_nan(values);
    if !max.is_finite() {
        return max;
    }
    let mut lanes = [0.0f64; 8];
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (s, &x) in lanes.iter_mut().zip(chunk) {
            *s += exp_f32(x - max) as f64;
        }
    }
    let sum = lanes.iter().sum::<f64>() + rest.iter().map(|&x| exp_f32(x - max) as f64).sum::<f64>();
    max + sum.ln() as f32
}

/// Sum in double precision (so 150k small terms lose nothing), eight lanes so it vectorises.
pub(crate) fn sum_f64(values: &[f32]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (s, &x) in lanes.iter_mut().zip(chunk) {
            *s += x as f64;
        }
    }
    lanes.iter().sum::<f64>() + rest.iter().map(|&x| x as f64).sum::<f64>()
}

/// `exp` for softmax over large vocabularies: Cephes' single-precision polynomial (about 1 ulp, like torch's
/// vectorised exp), branch-free so loops over it vectorise; `std`'s `exp` is a scalar libm call. Results below
/// e^-87 (1.6e-38) flush to 0, which also keeps slow denormals out of the sums.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer held in the low mantissa bits
    const C1: f32 = 0.693_359_4; // ln 2 split in two for an exact range reduction
    const C2: f32 = -2.121_944_4e-4;
    const LO: f32 = -87.0;
    const HI: f32 = 88.722_83; // ln(f32::MAX), rounded down
    let xc = if x < LO { LO } else { x };
    let xc = if xc > HI { HI } else { xc };
    let shifted = xc * LOG2E + ROUND;
    let n = shifted - ROUND;
    let k = shifted.to_bits() as i32 - ROUND.to_bits() as i32; // n as an integer, in [-126, 128]
    let r = xc - n * C1 - n * C2;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * (r * r) + r + 1.0;
    // 2^k in two halves, since 2^128 is not a float32.
    let h = k >> 1;
    let s1 = f32::from_bits(((h + 127) as u32) << 23);
    let s2 = f32::from_bits(((k - h + 127) as u32) << 23);
    let v = y * s1 * s2;
    if x < LO {
        0.0
    } else if x > HI {
        f32::INFINITY
    } else {
        v
    }
}

/// Random source for sampling and for speculative acceptance tests. A fixed seed gives reproducible draws for a given
/// build (the generator is `rand`'s `StdRng`); it cannot reproduce torch's random stream.
#[derive(Debug, Clone)]
pub struct Sampler {
    rng: StdRng,
    /// The key of the per-position streams (see [`Sampler::by_position`]); `None`: one stream for the call.
    key: Option<u64>,
}

impl Sampler {
    /// `None` seeds from the operating system.
    pub fn new(seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Sampler { rng, key: None }
    }

    /// A sampler whose draws at a position come from a stream of their own, keyed by (seed, position) once
    /// [`Sampler::at`] names the position: what is drawn at one position never depends on how many draws other
    /// positions made (so not on which rounds drafted).
    pub fn by_position(seed: Option<u64>) -> Self {
        let key = seed.unwrap_or_else(|| StdRng::from_os_rng().random());
        Sampler { rng: StdRng::seed_from_u64(key), key: Some(key) }
    }

    /// The config's sampler: per position under `sample_by_position`, else one stream.
    pub fn for_config(config: &GenerationConfig) -> Self {
        if config.sample_by_position {
            Self::by_position(config.seed)
        } else {
            Self::new(config.seed)
        }
    }

    /// Whether draws are keyed by position.
    pub fn is_by_position(&self) -> bool {
        self.key.is_some()
    }

    /// Starts the stream of sequence position `position` (the index in prompt + generated tokens of the token to
    /// be drawn); nothing for a one-stream sampler.
    pub fn at(&mut self, position: usize) {
        if let Some(key) = self.key {
            // SplitMix64's finaliser over the key and the position: distinct, well-mixed seeds per position.
            let mut z = key ^ (position as u64).wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            self.rng = StdRng::seed_from_u64(z ^ (z >> 31));
        }
    }

    /// A drafter's own sampler under the call's `seed`: a stream apart from the verifier's, so that drafting
    /// and acceptance draws are independent.
    pub fn for_drafter(seed: Option<u64>) -> Self {
        Self::new(seed.map(|s| s.wrapping_add(0x9E37_79B9_7F4A_7C15)))
    }

    /// Draws an index with probability proportional to `probs` (as `torch.multinomial(probs, 1)`; the weights need
    /// not sum to 1). Zero, negative and NaN weights are never drawn. If no weight is positive and finite, there is
    /// nothing to sample from (torch raises); the argmax is returned instead so decoding can go on.
    pub fn sample(&mut self, probs: &[f32]) -> u32 {
        let total: f64 = probs.iter().filter(|p| **p > 0.0).map(|&p| p as f64).sum();
        if !(total > 0.0 && total.is_finite()) {
            return argmax(probs);
        }
        let u = self.rng.random::<f64>() * total;
        let mut acc = 0.0f64;
        let mut last_positive = 0usize;
        for (i, &p) in probs.iter().enumerate() {
            if p > 0.0 {
                acc += p as f64;
                last_positive = i;
                if u < acc {
                    return i as u32;
                }
            }
        }
        // Rounding can leave `u` a hair above the running sum; the last drawable index is the right answer then.
        last_positive as u32
    }

    /// Softmax of `logits`, then [`Sampler::sample`].
    pub fn sample_logits(&mut self, logits: &[f32]) -> u32 {
        self.sample(&softmax(logits))
    }

    /// Uniform in the open interval (0, 1), for the speculative acceptance test `r < p/q`: the midpoints of
    /// 2⁵³ equal cells, so neither 0 (which would accept a token with p = 0) nor 1 can come out.
    pub fn uniform(&mut self) -> f64 {
        ((self.rng.random::<u64>() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
}

/// The next token from processed logits: a sample when `config.do_sample`, else the argmax (Transformers' `_sample`).
pub fn sample_or_argmax(config: &GenerationConfig, sampler: &mut Sampler, logits: &[f32]) -> u32 {
    if config.do_sample {
        sampler.sample_logits(logits)
    } else {
        argmax(logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEG_INF: f32 = f32::NEG_INFINITY;

    #[test]
    fn argmax_takes_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[NEG_INF, NEG_INF, -1.0]), 2);
        assert_eq!(argmax(&[NEG_INF, NEG_INF]), 0);
        assert_eq!(argmax(&[1.0, f32::NAN, 5.0]), 1, "torch treats NaN as the maximum");
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn softmax_values_and_infinities() {
        let p = softmax(&[0.0, 2f32.ln(), NEG_INF]);
        assert!((p[0] - 1.0 / 3.0).abs() < 1e-6);
        assert!((p[1] - 2.0 / 3.0).abs() < 1e-6);
        assert_eq!(p[2], 0.0);

        // Large logits must not overflow.
        let p = softmax(&[1000.0, 1000.0, 999.0]);
        let e = (-1.0f32).exp();
        assert!((p[0] - 1.0 / (2.0 + e)).abs() < 1e-6);
        assert!((p[2] - e / (2.0 + e)).abs() < 1e-6);

        assert_eq!(softmax(&[NEG_INF, NEG_INF]), vec![0.0, 0.0]);
        assert_eq!(softmax(&[f32::INFINITY, 1.0, f32::INFINITY]), vec![0.5, 0.0, 0.5]);
        assert!(softmax(&[f32::NEG_INFINITY, f32::NAN]).iter().all(|p| p.is_nan()));
        assert!(softmax(&[1.0, f32::NAN]).iter().all(|p| p.is_nan()));
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 88.7 {
            let exact = (x as f64).exp();
            let rel = ((exp_f32(x) as f64 - exact) / exact).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(worst < 3.0e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-200.0), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert!((exp_f32(88.7) / 88.7f32.exp() - 1.0).abs() < 1e-6);
        assert_eq!(exp_f32(88.8), f32::INFINITY);
    }

    #[test]
    fn max_and_sum_helpers() {
        let v: Vec<f32> = (0..21).map(|i| i as f32 - 3.0).collect();
        assert_eq!(max_and_nan(&v), (17.0, false));
        assert_eq!(sum_f64(&v), (0..21).map(|i| i as f64 - 3.0).sum::<f64>());
        let mut w = v.clone();
        w[19] = f32::NAN;
        assert_eq!(max_and_nan(&w), (17.0, true));
        w[19] = 16.0;
        w[2] = f32::NAN;
        assert_eq!(max_and_nan(&w), (17.0, true));
        assert_eq!(max_and_nan(&[]), (f32::NEG_INFINITY, false));
    }

    #[test]
    fn seeded_sampler_is_reproducible() {
        let probs = [0.1, 0.2, 0.3, 0.4];
        let mut a = Sampler::new(Some(7));
        let mut b = Sampler::new(Some(7));
        let xs: Vec<u32> = (0..100).map(|_| a.sample(&probs)).collect();
        let ys: Vec<u32> = (0..100).map(|_| b.sample(&probs)).collect();
        assert_eq!(xs, ys);
        let us: Vec<f64> = (0..10).map(|_| a.uniform()).collect();
        let vs: Vec<f64> = (0..10).map(|_| b.uniform()).collect();
        assert_eq!(us, vs);
        let mut c = Sampler::new(Some(8));
        let zs: Vec<u32> = (0..100).map(|_| c.sample(&probs)).collect();
        assert_ne!(xs, zs, "another seed gives another stream");
    }

    #[test]
    fn sample_follows_the_probabilities() {
        // Chi-square goodness of fit, 4 categories (3 degrees of freedom): 16.27 is the 0.1% critical value.
        let probs = [0.1f32, 0.2, 0.3, 0.4];
        let n = 20_000;
        let mut counts = [0usize; 4];
        let mut s = Sampler::new(Some(1234));
        for _ in 0..n {
            counts[s.sample(&probs) as usize] += 1;
        }
        let chi2: f64 = counts
            .iter()
            .zip(probs)
            .map(|(&c, p)| {
                let expected = n as f64 * p as f64;
                (c as f64 - expected).powi(2) / expected
            })
            .sum();
        assert!(chi2 < 16.27, "chi2 = {chi2}, counts = {counts:?}");
    }

    #[test]
    fn sample_never_draws_zero_weight_and_accepts_unnormalised_weights() {
        let mut s = Sampler::new(Some(3));
        let weights = [0.0, 3.0, 0.0, 1.0, 0.0];
        let mut counts = [0usize; 5];
        for _ in 0..4000 {
            counts[s.sample(&weights) as usize] += 1;
        }
        assert_eq!(counts[0] + counts[2] + counts[4], 0);
        assert!((2800..3200).contains(&counts[1]), "{counts:?}");
        // Nothing drawable: falls back to the argmax instead of panicking.
        assert_eq!(s.sample(&[0.0, 0.0]), 0);
        assert_eq!(s.sample(&[0.0, f32::INFINITY, 1.0]), 1);
    }

    #[test]
    fn uniform_is_in_unit_interval() {
        let mut s = Sampler::new(Some(11));
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let u = s.uniform();
            assert!(u > 0.0 && u < 1.0, "{u}");
            sum += u;
        }
        assert!((sum / 10_000.0 - 0.5).abs() < 0.02);
    }

    #[test]
    fn sample_or_argmax_follows_do_sample() {
        let logits = [0.0, 2.0, 1.0];
        let mut s = Sampler::new(Some(0));
        let greedy = GenerationConfig::default();
        assert_eq!(sample_or_argmax(&greedy, &mut s, &logits), 1);
        let sampling = GenerationConfig { do_sample: true, ..GenerationConfig::default() };
        let draws: Vec<u32> = (0..200).map(|_| sample_or_argmax(&sampling, &mut s, &logits)).collect();
        assert!(draws.iter().any(|&t| t != 1), "sampling must sometimes leave the argmax");
        let top = draws.iter().filter(|&&t| t == 1).count();
        assert!((110..160).contains(&top), "p(argmax) = 0.665, got {top}/200");
    }
}
