//! Verification of a block of drafts against the target's distributions: the longest greedy prefix, or
//! speculative sampling (Algorithm 1 of arXiv 2211.17192) that keeps the target's distribution exactly.

use super::sampler::{argmax, softmax, Sampler};

/// The outcome of one round: how many drafts were accepted, and the target's own token after them (the
/// correction at the first rejection, or the bonus token when every draft passed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub accepted: usize,
    pub next: u32,
}

/// Greedy: keep drafts while they equal the argmax of the processed target logits. `logits` has one row per
/// draft plus the bonus row.
pub fn accept_prefix(drafts: &[u32], logits: &[Vec<f32>]) -> Verdict {
    for (i, &d) in drafts.iter().enumerate() {
        let best = argmax(&logits[i]);
        if best != d {
            return Verdict { accepted: i, next: best };
        }
    }
    Verdict { accepted: drafts.len(), next: argmax(&logits[drafts.len()]) }
}

/// Speculative sampling. `logits` are the processed target logits (one row per draft plus the bonus row);
/// `q[i]` is the exact distribution draft `i` was sampled from, or `None` for a deterministic drafter
/// (a one-hot `q`). Draft `x` is accepted with probability `min(1, p(x)/q(x))`; at the first rejection the
/// token comes from `normalize(max(0, p − q))`; when every draft passes, from the bonus row's `p`.
pub fn speculative_sampling(
    drafts: &[u32],
    logits: &[Vec<f32>],
    q: Option<&[Vec<f32>]>,
    sampler: &mut Sampler,
) -> Verdict {
    for (i, &d) in drafts.iter().enumerate() {
        let p = softmax(&logits[i]);
        let px = p[d as usize];
        let qx = q.map_or(1.0, |q| q[i][d as usize]);
        let r = sampler.uniform();
        // `r <= p/q`, written without the division so q(x) = 0 (never sampled) cannot divide by zero.
        if qx > 0.0 && r * qx <= px {
            continue;
        }
        let mut residual: Vec<f32> = match q {
            Some(q) => p.iter().zip(&q[i]).map(|(a, b)| (a - b).max(0.0)).collect(),
            None => {
                let mut r = p.clone();
                r[d as usize] = 0.0;
                r
            }
        };
        let total: f32 = residual.iter().sum();
        if total <= f32::MIN_POSITIVE {
            // p == q up to rounding: any rejection was a rounding artifact, so sample from p itself.
            residual = p;
        } else {
            residual.iter_mut().for_each(|v| *v /= total);
        }
        return Verdict { accepted: i, next: sampler.sample(&residual) };
    }
    let p = softmax(&logits[drafts.len()]);
    Verdict { accepted: drafts.len(), next: sampler.sample(&p) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ln(p: &[f32]) -> Vec<f32> {
        p.iter().map(|x| x.ln()).collect()
    }

    #[test]
    fn greedy_keeps_the_matching_prefix_and_corrects() {
        let rows = vec![ln(&[0.1, 0.9]), ln(&[0.8, 0.2]), ln(&[0.3, 0.7])];
        assert_eq!(accept_prefix(&[1, 1], &rows), Verdict { accepted: 1, next: 0 });
        assert_eq!(accept_prefix(&[1, 0], &rows), Verdict { accepted: 2, next: 1 });
        assert_eq!(accept_prefix(&[0, 0], &rows), Verdict { accepted: 0, next: 1 });
        assert_eq!(accept_prefix(&[], &rows), Verdict { accepted: 0, next: 1 });
    }

    /// One draft position over three tokens: the first emitted token must follow p whatever q proposes.
    fn first_token_distribution(p: &[f32], q: Option<&[f32]>, draws: usize) -> Vec<f64> {
        let mut s = Sampler::new(Some(7));
        let mut counts = vec![0usize; p.len()];
        let rows = vec![ln(p), ln(p)];
        for _ in 0..draws {
            let d = match q {
                Some(q) => s.sample(q),
                None => 0,
            };
            let qs = q.map(|q| vec![q.to_vec()]);
            let v = speculative_sampling(&[d], &rows, qs.as_deref(), &mut s);
            let first = if v.accepted == 1 { d } else { v.next };
            counts[first as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    #[test]
    fn sampling_keeps_the_target_distribution() {
        let p = [0.5, 0.3, 0.2];
        for q in [Some(&[0.1f32, 0.1, 0.8][..]), Some(&[0.6, 0.3, 0.1][..]), None] {
            let f = first_token_distribution(&p, q, 40_000);
            for (a, b) in f.iter().zip(p) {
                assert!((a - b as f64).abs() < 0.01, "{f:?} vs {p:?} for q = {q:?}");
            }
        }
    }
}
