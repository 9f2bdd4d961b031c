//! Exact output distributions by enumeration, and a chi-square goodness-of-fit test against them whose power is
//! computed, not guessed.
//!
//! On the tiny fixtures with a small support (top-k), every continuation of a few tokens can be listed with its
//! exact probability, computed through the target (and the drafter, for the lossy ensemble). Seeded speculative
//! draws are then tested against those probabilities: a one-sample test, so the only noise is the draws'.

use std::collections::HashMap;

use augur::generation::config::GenerationConfig;
use augur::generation::logits::LogitsProcessor;
use augur::generation::sampler::softmax;
use augur::models::{CausalLm, ForwardOptions, LogitRows};

/// Probability of each whole continuation (a token list ending at the length budget or at an EOS).
pub type Distribution = HashMap<Vec<u32>, f64>;

/// α of every distribution test.
pub const ALPHA: f64 = 1e-3;
/// Power every distribution test is sized for: the probability of failing on an alternative at chi-square
/// distance [`DISTANCE`] from the exact distribution.
pub const POWER: f64 = 0.99;
/// The smallest deviation each test is sized to detect, as the chi-square distance `D = Σ (p'−p)²/p` between
/// the drawn distribution `p'` and the exact `p`: 0.01 is, for example, a 10% relative error on every cell (half
/// of them too high, half too low), or a 20% error on cells holding a quarter of the mass.
pub const DISTANCE: f64 = 0.01;

/// The processed next-token distribution of `model` after `context`, as plain decoding samples it: one forward
/// of the whole context on an empty cache (the `exit` first layers only, when given), logits laid out over
/// `vocab` rows, the processors of `cfg` for a prompt of `prompt_len` tokens, softmax.
pub fn next_distribution(
    model: &mut dyn CausalLm,
    cfg: &GenerationConfig,
    prompt_len: usize,
    context: &[u32],
    exit: Option<usize>,
    vocab: usize,
) -> Vec<f32> {
    model.truncate(0);
    let opts = ForwardOptions { exit_layer: exit, ..ForwardOptions::logits(LogitRows::Last(1)) };
    let out = model.forward(context, &opts).unwrap();
    let mut row: Vec<f32> = out.logits.unwrap().to_vec2::<f32>().unwrap().pop().unwrap();
    row.resize(vocab, f32::NEG_INFINITY);
    LogitsProcessor::new(cfg, prompt_len).unwrap().process(context, &mut row);
    model.truncate(0);
    softmax(&row)
}

/// Plain sampling's exact distribution of the first `n` new tokens after `prompt` (shorter where an EOS of
/// `cfg` ends the sequence): `P(x₁…xₘ) = Π p(xₜ | prompt, x₍<t₎)` with `p` from `next`.
pub fn plain(prompt: &[u32], n: usize, eos: &[u32], next: &mut dyn FnMut(&[u32]) -> Vec<f32>) -> Distribution {
    let mut out = Distribution::new();
    let mut stack = vec![(Vec::<u32>::new(), 1.0f64)];
    while let Some((prefix, mass)) = stack.pop() {
        let mut ctx = prompt.to_vec();
        ctx.extend_from_slice(&prefix);
        for (x, &p) in next(&ctx).iter().enumerate().filter(|(_, &p)| p > 0.0) {
            let mut seq = prefix.clone();
            seq.push(x as u32);
            let m = mass * p as f64;
            if seq.len() == n || eos.contains(&(x as u32)) {
                *out.entry(seq).or_default() += m;
            } else {
                stack.push((seq, m));
            }
        }
    }
    out
}

/// The exact distribution of the first `n` new tokens under static ensemble verification with weight `w`, for a
/// drafter proposing `k` tokens a round (a constant schedule, no confidence stop, no EOS), with target `p` and
/// drafter `q` distributions given as functions of the whole context.
///
/// A round starting with `r` tokens left drafts `g = min(k, r − 1)`. At a draft position the token `x` comes out
/// accepted with probability `min(q(x), ν(x))` and as the correction after a rejection with `[ν(x) − q(x)]⁺`,
/// `ν = w·p + (1−w)·q` (together: ν); a correction ends the round. After `g` accepted drafts the bonus token
/// comes from `p` alone. So a position follows ν or p depending on the round structure, which this walks.
pub fn ensemble(
    prompt: &[u32],
    n: usize,
    k: usize,
    w: f64,
    p: &mut dyn FnMut(&[u32]) -> Vec<f32>,
    q: &mut dyn FnMut(&[u32]) -> Vec<f32>,
) -> Distribution {
    /// Where the walk stands: the tokens so far, their probability, and the draft position within the round
    /// (`None`: a round starts here).
    struct State {
        seq: Vec<u32>,
        mass: f64,
        draft: Option<(usize, usize)>,
    }
    let mut out = Distribution::new();
    let mut stack = vec![State { seq: vec![], mass: 1.0, draft: None }];
    let context = |seq: &[u32]| [prompt, seq].concat();
    while let Some(State { seq, mass, draft }) = stack.pop() {
        if seq.len() == n {
            *out.entry(seq).or_default() += mass;
            continue;
        }
        let (j, g) = draft.unwrap_or((0, k.min(n - seq.len() - 1)));
        let ctx = context(&seq);
        let pt = p(&ctx);
        let push = |stack: &mut Vec<State>, x: usize, m: f64, draft| {
            let mut s = seq.clone();
            s.push(x as u32);
            if m > 0.0 {
                stack.push(State { seq: s, mass: m, draft });
            }
        };
        if g == 0 {
            // A plain step, or the bonus token after a fully accepted block.
            for (x, &px) in pt.iter().enumerate() {
                push(&mut stack, x, mass * px as f64, None);
            }
            continue;
        }
        let qt = q(&ctx);
        for x in 0..pt.len() {
            let nu = w * pt[x] as f64 + (1.0 - w) * qt[x] as f64;
            let accepted = nu.min(qt[x] as f64);
            let corrected = (nu - qt[x] as f64).max(0.0);
            let next = if j + 1 < g { Some((j + 1, g)) } else { Some((0, 0)) };
            push(&mut stack, x, mass * accepted, next);
            push(&mut stack, x, mass * corrected, None);
        }
    }
    out
}

/// A histogram of drawn continuations.
pub type Histogram = HashMap<Vec<u32>, usize>;

/// The outcome of a goodness-of-fit test.
#[derive(Debug)]
pub struct Fit {
    pub statistic: f64,
    pub critical: f64,
    pub df: usize,
    /// Draws of continuations the exact distribution gives probability 0 (any is a failure).
    pub impossible: usize,
}

impl Fit {
    pub fn passes(&self) -> bool {
        self.impossible == 0 && self.statistic < self.critical
    }
}

/// Pearson's chi-square test of `observed` against `exact` at [`ALPHA`], cells with fewer than 5 expected draws
/// pooled into one.
pub fn fit(observed: &Histogram, exact: &Distribution) -> Fit {
    let n: usize = observed.values().sum();
    let n = n as f64;
    let impossible = observed.iter().filter(|(k, _)| !exact.contains_key(*k)).map(|(_, &c)| c).sum::<usize>();
    let (mut statistic, mut df, mut pooled) = (0.0, 0usize, (0.0, 0.0));
    for (k, &p) in exact {
        let o = *observed.get(k).unwrap_or(&0) as f64;
        if n * p < 5.0 {
            pooled = (pooled.0 + o, pooled.1 + n * p);
        } else {
            statistic += (o - n * p).powi(2) / (n * p);
            df += 1;
        }
    }
    if pooled.1 > 0.0 {
        statistic += (pooled.0 - pooled.1).powi(2) / pooled.1;
        df += 1;
    }
    let df = df.saturating_sub(1).max(1);
    Fit { statistic, critical: chi_square_quantile(df as f64, 1.0 - ALPHA), df, impossible }
}

/// Upper-tail quantile of the standard normal: `z` with `P(Z > z) = 1 − p` (Acklam's rational approximation,
/// relative error below 1.2e-9).
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.38357751867269e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] =
        [-5.447609879822406e1, 1.615858368580409e2, -1.556989798598866e2, 6.680131188771972e1, -1.328068155288572e1];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [7.784695709041462e-3, 3.224671290700398e-1, 2.445134137142996, 3.754408661907416];
    let tail = |q: f64| {
        let r = (-2.0 * q.ln()).sqrt();
        (((((C[0] * r + C[1]) * r + C[2]) * r + C[3]) * r + C[4]) * r + C[5])
            / ((((D[0] * r + D[1]) * r + D[2]) * r + D[3]) * r + 1.0)
    };
    if p < 0.02425 {
        tail(p)
    } else if p > 1.0 - 0.02425 {
        -tail(1.0 - p)
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// The `p` quantile of chi-square with `df` degrees of freedom (Wilson–Hilferty).
pub fn chi_square_quantile(df: f64, p: f64) -> f64 {
    let z = normal_quantile(p);
    let v = 2.0 / (9.0 * df);
    df * (1.0 - v + z * v.sqrt()).powi(3)
}

/// `P(χ²(df, λ) > x)`, the noncentral chi-square tail, by Patnaik's approximation `χ²(df, λ) ≈ c·χ²(h)` and
/// Wilson–Hilferty for the central one.
fn noncentral_tail(df: f64, lambda: f64, x: f64) -> f64 {
    let c = (df + 2.0 * lambda) / (df + lambda);
    let h = (df + lambda).powi(2) / (df + 2.0 * lambda);
    let v = 2.0 / (9.0 * h);
    let z = ((x / c / h).cbrt() - (1.0 - v)) / v.sqrt();
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// The complementary error function (Numerical Recipes' `erfcc`, relative error below 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// The draws that give the test [`POWER`] at [`ALPHA`] against any alternative at chi-square distance
/// [`DISTANCE`] or more: under such an alternative Pearson's statistic is about noncentral chi-square with
/// `λ = draws · D`, so the draws are the smallest `λ` reaching the power, divided by `D`. The degrees of freedom
/// are those of `exact`'s cells that keep 5 expected draws (the rest pooled), found at that size.
pub fn draws_for_power(exact: &Distribution) -> usize {
    let mut draws = 1000usize;
    for _ in 0..4 {
        let cells = exact.values().filter(|&&p| p * draws as f64 >= 5.0).count() + 1;
        draws = (lambda_for_power((cells - 1).max(1) as f64) / DISTANCE).ceil() as usize;
    }
    draws
}

/// The noncentrality at which the test at [`ALPHA`] with `df` degrees of freedom has [`POWER`].
pub fn lambda_for_power(df: f64) -> f64 {
    let critical = chi_square_quantile(df, 1.0 - ALPHA);
    let (mut lo, mut hi) = (0.0f64, 1e6f64);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if noncentral_tail(df, mid, critical) >= POWER {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}
