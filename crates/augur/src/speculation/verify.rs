//! Verification of a block of drafts against the target's distributions: the longest greedy prefix, or
//! speculative sampling (Algorithm 1 of arXiv 2211.17192) that keeps the target's distribution exactly; and of
//! a tree of drafts: the longest greedy path, or multi-draft speculative sampling over each node's children
//! (recursive rejection sampling, SpecInfer, arXiv 2305.09781).

use crate::generation::logits::LogitsProcessor;
use crate::generation::sampler::{argmax, softmax, Sampler};
use crate::kernels::logits::Logits;

/// One verification forward's rows, as the loop hands them to a [`Verifier`].
pub struct Block<'a> {
    /// The drafts, `[γ]`.
    pub drafts: &'a [u32],
    /// The target's processed logits, `[γ + 1, vocab]`: one row per draft plus the bonus row.
    pub rows: &'a Logits,
    /// `q[i]`: the distribution draft `i` was drawn from (`None`: a deterministic drafter, one-hot `q`); rows
    /// past γ (drafts cut off before verification) are never read.
    pub q: Option<&'a Logits>,
    /// `assistant_ensemble_weight`, `None` for lossless verification.
    pub ensemble_weight: Option<f32>,
    pub do_sample: bool,
}

/// One tree-verification forward's rows: draft `i` continues node `parents[i]` (0: the root, the context's last
/// token; `j + 1`: draft `j < i`), siblings in the order they are tried.
pub struct TreeBlock<'a> {
    /// The drafts, `[n]`.
    pub drafts: &'a [u32],
    /// `[n]`, as above.
    pub parents: &'a [usize],
    /// The target's processed logits, `[n + 1, vocab]`: the root's row, then one per draft.
    pub rows: &'a Logits,
    /// `q[i]`: the distribution draft `i` was drawn from; siblings were drawn independently from the same one.
    /// `None`: deterministic drafts (one-hot `q`), distinct among siblings.
    pub q: Option<&'a Logits>,
    pub do_sample: bool,
}

/// A tree round's outcome: the accepted path (draft indices, root to leaf) and the target's own next token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeVerdict {
    pub path: Vec<usize>,
    pub next: u32,
}

/// How the loop turns a verification forward into a verdict. The engine uses [`Exact`] alone; the trait is the
/// seam through which tests swap in deliberately broken verifiers and show that the suite catches each.
pub trait Verifier {
    /// Applies the target's processors to `rows` (`[γ + 1, vocab]`), row `i` with `context` followed by the
    /// first `i` drafts as its context (Transformers' `_assisted_decoding`, spec 3.2).
    fn process(&self, processor: &LogitsProcessor, context: &[u32], drafts: &[u32], rows: &mut Logits) {
        let len = context.len();
        if processor.is_noop(len) && processor.is_noop(len + drafts.len()) {
            return;
        }
        let mut context = context.to_vec();
        for (i, row) in rows.iter_mut().enumerate() {
            processor.process(&context, row);
            if let Some(&d) = drafts.get(i) {
                context.push(d);
            }
        }
    }

    /// The verdict on `block`: speculative sampling when sampling, else the greedy (or ensemble) prefix.
    fn verdict(&self, block: &Block<'_>, sampler: &mut Sampler) -> Verdict {
        let Block { drafts, rows, q, ensemble_weight, do_sample } = *block;
        match (do_sample, ensemble_weight, q) {
            (true, w, q) => speculative_sampling(drafts, rows, q, w, sampler),
            (false, Some(w), Some(q)) => accept_ensemble(drafts, rows, q, w),
            (false, _, _) => accept_prefix(drafts, rows),
        }
    }

    /// [`Self::process`] for a tree: the root's row with `context`, each draft's row with `context` followed by
    /// the drafts on its path.
    fn process_tree(
        &self,
        processor: &LogitsProcessor,
        context: &[u32],
        drafts: &[u32],
        parents: &[usize],
        rows: &mut Logits,
    ) {
        let len = context.len();
        let paths: Vec<Vec<usize>> = (0..rows.len()).map(|node| path_to(parents, node)).collect();
        let deepest = paths.iter().map(Vec::len).max().unwrap_or(0);
        if processor.is_noop(len) && processor.is_noop(len + deepest) {
            return;
        }
        let mut ctx = context.to_vec();
        for (path, row) in paths.iter().zip(rows.iter_mut()) {
            ctx.truncate(len);
            ctx.extend(path.iter().map(|&i| drafts[i]));
            processor.process(&ctx, row);
        }
    }

    /// The verdict on a tree: the greedy path, or multi-draft speculative sampling.
    fn tree_verdict(&self, block: &TreeBlock<'_>, sampler: &mut Sampler) -> TreeVerdict {
        if block.do_sample {
            tree_sampling(block, sampler)
        } else {
            accept_tree_path(block.drafts, block.parents, block.rows)
        }
    }
}

/// What `p` becomes after draft `d` drawn from `q` is rejected: `normalize([p − q]⁺)`, or `p` without `d` for a
/// deterministic draft (`q` one-hot). When nothing is left (`p == q` up to rounding, so the rejection was a
/// rounding artifact), `p` itself.
fn residual_after_rejection(p: Vec<f32>, q: Option<&[f32]>, d: usize) -> Vec<f32> {
    let mut residual: Vec<f32> = match q {
        Some(q) => p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect(),
        None => {
            let mut r = p.clone();
            r[d] = 0.0;
            r
        }
    };
    let total: f32 = residual.iter().sum();
    if total <= f32::MIN_POSITIVE {
        return p;
    }
    residual.iter_mut().for_each(|v| *v /= total);
    residual
}

/// The draft indices from the root down to `node` (0: the root, `i + 1`: draft `i`), root first.
pub fn path_to(parents: &[usize], node: usize) -> Vec<usize> {
    let mut path = Vec::new();
    let mut at = node;
    while at > 0 {
        path.push(at - 1);
        at = parents[at - 1];
    }
    path.reverse();
    path
}

/// The children of every node (`[n + 1]`, node 0 the root), in draft order.
pub fn children(parents: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); parents.len() + 1];
    for (i, &p) in parents.iter().enumerate() {
        out[p].push(i);
    }
    out
}

/// Greedy over a tree: from the root, follow the child that is the target's argmax at its parent while there
/// is one; the argmax where there is none is the target's token. A chain gives [`accept_prefix`]'s verdict.
pub fn accept_tree_path(drafts: &[u32], parents: &[usize], rows: &Logits) -> TreeVerdict {
    let kids = children(parents);
    let (mut node, mut path) = (0, Vec::new());
    loop {
        let best = argmax(&rows[node]);
        match kids[node].iter().find(|&&c| drafts[c] == best) {
            Some(&c) => {
                path.push(c);
                node = c + 1;
            }
            None => return TreeVerdict { path, next: best },
        }
    }
}

/// Multi-draft speculative sampling: at each node, its children are tried in order, child `x` kept with
/// probability `min(1, p(x)/q(x))` against the current `p`; after each rejection `p` becomes the residual
/// `normalize([p − q]⁺)` (one-hot `q`: `p` with `x` removed). The first kept child becomes the node and its own
/// row the new `p`; when every child is rejected (or there is none) the token is drawn from the current `p`.
/// With siblings drawn independently from `q` (or distinct deterministic ones) the output follows the target's
/// distribution exactly; a chain is [`speculative_sampling`]'s algorithm, draw for draw.
pub fn tree_sampling(block: &TreeBlock<'_>, sampler: &mut Sampler) -> TreeVerdict {
    let TreeBlock { drafts, parents, rows, q, .. } = *block;
    let kids = children(parents);
    let (mut node, mut path) = (0, Vec::new());
    'nodes: loop {
        let mut p = softmax(&rows[node]);
        for &c in &kids[node] {
            let d = drafts[c] as usize;
            let qx = q.map_or(1.0, |q| q[c][d]);
            // As in `speculative_sampling`: `r < p/q` without the division, strict so that p(x) = 0 is never kept.
            let r = sampler.uniform();
            if qx > 0.0 && r * f64::from(qx) < f64::from(p[d]) {
                path.push(c);
                node = c + 1;
                continue 'nodes;
            }
            p = residual_after_rejection(p, q.map(|q| &q[c][..]), d);
        }
        return TreeVerdict { path, next: sampler.sample(&p) };
    }
}

/// The verifier of this module's functions, as Transformers 5.24 verifies (with its listed defects fixed).
pub struct Exact;

impl Verifier for Exact {}

/// The outcome of one round: how many drafts were accepted, and the target's own token after them (the
/// correction at the first rejection, or the bonus token when every draft passed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub accepted: usize,
    pub next: u32,
}

/// Greedy: keep drafts while they equal the argmax of the processed target logits. `logits` has one row per
/// draft plus the bonus row.
pub fn accept_prefix(drafts: &[u32], logits: &Logits) -> Verdict {
    for (i, &d) in drafts.iter().enumerate() {
        let best = argmax(&logits[i]);
        if best != d {
            return Verdict { accepted: i, next: best };
        }
    }
    Verdict { accepted: drafts.len(), next: argmax(&logits[drafts.len()]) }
}

/// Greedy static ensemble verification (Transformers' `assistant_ensemble_weight`, spec 9): draft `i` is kept
/// while it equals the argmax of `ν_i = w·p_i + (1−w)·q_i`, the mixture of the target's and the drafter's
/// processed distributions, and the correction is that argmax; the bonus row uses the target alone. Lossy by
/// design. `q[i]` is the drafter's distribution at draft `i`.
pub fn accept_ensemble(drafts: &[u32], logits: &Logits, q: &Logits, w: f32) -> Verdict {
    // Transformers multiplies float32 tensors by the Python floats `w` and `1 − w`.
    let (a, b) = (w, (1.0 - f64::from(w)) as f32);
    for (i, &d) in drafts.iter().enumerate() {
        let p = softmax(&logits[i]);
        let nu: Vec<f32> = p.iter().zip(&q[i]).map(|(p, q)| a * p + b * q).collect();
        let best = argmax(&nu);
        if best != d {
            return Verdict { accepted: i, next: best };
        }
    }
    Verdict { accepted: drafts.len(), next: argmax(&logits[drafts.len()]) }
}

/// Speculative sampling. `logits` are the processed target logits (one row per draft plus the bonus row);
/// `q[i]` is the exact distribution draft `i` was sampled from, or `None` for a deterministic drafter
/// (a one-hot `q`). Draft `x` is accepted with probability `min(1, p(x)/q(x))` (never when `p(x) = 0`); at the
/// first rejection the
/// token comes from `normalize(max(0, p − q))`; when every draft passes, from the bonus row's `p`.
///
/// With an ensemble weight `w` (and a `q`; Transformers ignores `w` without one) draft `x` is accepted with
/// probability `min(1, ν(x)/q(x)) = min(1, 1 − w + w·p(x)/q(x))`, `ν = w·p + (1−w)·q`; the residual
/// `normalize([ν − q]+) = normalize([p − q]+)` and the bonus row are unchanged. The output then follows `ν`,
/// not `p`: lossy by design.
pub fn speculative_sampling(
    drafts: &[u32],
    logits: &Logits,
    q: Option<&Logits>,
    ensemble_weight: Option<f32>,
    sampler: &mut Sampler,
) -> Verdict {
    let w = q.and(ensemble_weight).map(|w| (w, (1.0 - f64::from(w)) as f32));
    for (i, &d) in drafts.iter().enumerate() {
        let p = softmax(&logits[i]);
        let px = p[d as usize];
        let qx = q.map_or(1.0, |q| q[i][d as usize]);
        // `r < p/q` with `r` uniform in (0, 1), or `r < 1 − w + w·p/q` with an ensemble weight, written without
        // the division so that q(x) = 0 (never sampled) cannot divide by zero, and so that w = 1 is exactly the
        // lossless test. Strict, with `r > 0`, so that a token the target's processors filtered (p(x) = 0) is
        // never kept.
        let r = sampler.uniform();
        let bound = match w {
            Some((a, b)) => b * qx + a * px,
            None => px,
        };
        let accept = qx > 0.0 && r * f64::from(qx) < f64::from(bound);
        if accept {
            continue;
        }
        let residual = residual_after_rejection(p, q.map(|q| &q[i][..]), d as usize);
        return Verdict { accepted: i, next: sampler.sample(&residual) };
    }
    let p = softmax(&logits[drafts.len()]);
    Verdict { accepted: drafts.len(), next: sampler.sample(&p) }
}

/// Verification by matching draws (llama.cpp's, under `sample_by_position`): the target draws its own token at
/// every position from that position's stream, as plain decoding draws it, and a draft is kept while it equals
/// that draw. The tokens are plain sampling's draw for draw, whatever was drafted. `first` is the sequence
/// position of the block's first row (the context's length).
pub fn matching_draws(block: &Block<'_>, first: usize, sampler: &mut Sampler) -> Verdict {
    for (i, row) in block.rows.iter().enumerate() {
        sampler.at(first + i);
        let own = sampler.sample(&softmax(row));
        if block.drafts.get(i) != Some(&own) {
            return Verdict { accepted: i, next: own };
        }
    }
    // Only a block without rows gets here (the bonus row has no draft to match).
    Verdict { accepted: block.drafts.len(), next: argmax(&block.rows[block.drafts.len()]) }
}

/// [`matching_draws`] over a tree: from the root, the target draws at the node's depth and follows the child
/// that equals its draw while there is one. `first` is the root row's sequence position.
pub fn matching_tree_draws(block: &TreeBlock<'_>, first: usize, sampler: &mut Sampler) -> TreeVerdict {
    let kids = children(block.parents);
    let (mut node, mut path) = (0, Vec::new());
    loop {
        sampler.at(first + path.len());
        let own = sampler.sample(&softmax(&block.rows[node]));
        match kids[node].iter().find(|&&c| block.drafts[c] == own) {
            Some(&c) => {
                path.push(c);
                node = c + 1;
            }
            None => return TreeVerdict { path, next: own },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ln(p: &[f32]) -> Vec<f32> {
        p.iter().map(|x| x.ln()).collect()
    }

    #[test]
    fn greedy_keeps_the_matching_prefix_and_corrects() {
        let rows = Logits::from_rows(vec![ln(&[0.1, 0.9]), ln(&[0.8, 0.2]), ln(&[0.3, 0.7])]);
        assert_eq!(accept_prefix(&[1, 1], &rows), Verdict { accepted: 1, next: 0 });
        assert_eq!(accept_prefix(&[1, 0], &rows), Verdict { accepted: 2, next: 1 });
        assert_eq!(accept_prefix(&[0, 0], &rows), Verdict { accepted: 0, next: 1 });
        assert_eq!(accept_prefix(&[], &rows), Verdict { accepted: 0, next: 1 });
    }

    /// One draft position over three tokens: the first emitted token must follow p whatever q proposes.
    fn first_token_distribution(p: &[f32], q: Option<&[f32]>, draws: usize) -> Vec<f64> {
        let mut s = Sampler::new(Some(7));
        let mut counts = vec![0usize; p.len()];
        let rows = Logits::from_rows(vec![ln(p), ln(p)]);
        for _ in 0..draws {
            let d = match q {
                Some(q) => s.sample(q),
                None => 0,
            };
            let qs = q.map(|q| Logits::from_rows([q]));
            let v = speculative_sampling(&[d], &rows, qs.as_ref(), None, &mut s);
            let first = if v.accepted == 1 { d } else { v.next };
            counts[first as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    #[test]
    fn greedy_ensemble_compares_with_the_mixture_and_corrects_with_it() {
        // Target prefers 1 at the first position, the draft prefers 0: the mixture decides.
        let rows = Logits::from_rows(vec![ln(&[0.4, 0.6]), ln(&[0.3, 0.7])]);
        let q = Logits::from_rows(vec![vec![0.9, 0.1]]);
        // ν = 0.5·[0.4, 0.6] + 0.5·[0.9, 0.1] = [0.65, 0.35]: draft 0 is kept, the bonus is the target's argmax.
        assert_eq!(accept_ensemble(&[0], &rows, &q, 0.5), Verdict { accepted: 1, next: 1 });
        assert_eq!(accept_ensemble(&[1], &rows, &q, 0.5), Verdict { accepted: 0, next: 0 });
        // ν = 0.9·p + 0.1·q = [0.45, 0.55]: the target wins.
        assert_eq!(accept_ensemble(&[0], &rows, &q, 0.9), Verdict { accepted: 0, next: 1 });
        assert_eq!(accept_ensemble(&[1], &rows, &q, 1.0), accept_prefix(&[1], &rows));
        assert_eq!(accept_ensemble(&[0], &rows, &q, 1.0), accept_prefix(&[0], &rows));
    }

    /// One draft position: the first emitted token follows ν = w·p + (1−w)·q with an ensemble weight.
    #[test]
    fn ensemble_sampling_follows_the_mixture() {
        let p = [0.5f32, 0.3, 0.2];
        let q = [0.1f32, 0.1, 0.8];
        for w in [0.25f32, 0.5, 0.9] {
            let mut s = Sampler::new(Some(11));
            let rows = Logits::from_rows(vec![ln(&p), ln(&p)]);
            let mut counts = [0usize; 3];
            let draws = 40_000;
            for _ in 0..draws {
                let d = s.sample(&q);
                let v = speculative_sampling(&[d], &rows, Some(&Logits::from_rows([q])), Some(w), &mut s);
                counts[if v.accepted == 1 { d } else { v.next } as usize] += 1;
            }
            for i in 0..3 {
                let nu = w * p[i] + (1.0 - w) * q[i];
                let f = counts[i] as f32 / draws as f32;
                assert!((f - nu).abs() < 0.01, "w = {w}: token {i} at {f}, ν = {nu}");
            }
        }
    }

    /// At w = 1 the ensemble acceptance test is the lossless one, bit for bit: the same random stream gives the
    /// same verdicts.
    #[test]
    fn ensemble_weight_one_is_the_lossless_test() {
        let rows = Logits::from_rows(vec![ln(&[0.5, 0.3, 0.2]), ln(&[0.2, 0.2, 0.6]), ln(&[0.1, 0.6, 0.3])]);
        let q = Logits::from_rows(vec![vec![0.2, 0.3, 0.5], vec![0.7, 0.2, 0.1]]);
        let (mut a, mut b) = (Sampler::new(Some(3)), Sampler::new(Some(3)));
        for i in 0..5000u32 {
            let drafts = [i % 3, (i / 3) % 3];
            let x = speculative_sampling(&drafts, &rows, Some(&q), None, &mut a);
            let y = speculative_sampling(&drafts, &rows, Some(&q), Some(1.0), &mut b);
            assert_eq!(x, y);
        }
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

    /// A draft the target's processors filtered out (p(x) = 0) is never accepted, even by the smallest uniform.
    /// Seed 8,215,248 is the first whose first `f32` uniform in [0, 1) is 0, which `r·q ≤ p` accepted; found by
    /// search, and checked here so that the test keeps testing that boundary.
    #[test]
    fn a_filtered_draft_is_never_accepted() {
        use rand::{Rng, SeedableRng};
        const SEED: u64 = 8_215_248;
        assert_eq!(rand::rngs::StdRng::seed_from_u64(SEED).random::<f32>(), 0.0);
        let rows = Logits::from_rows(vec![vec![0.0, f32::NEG_INFINITY], vec![0.0, 0.0]]);
        let q = Logits::from_rows(vec![vec![0.5, 0.5]]);
        let v = speculative_sampling(&[1], &rows, Some(&q), None, &mut Sampler::new(Some(SEED)));
        assert_eq!(v, Verdict { accepted: 0, next: 0 });
        let v = speculative_sampling(&[1], &rows, None, None, &mut Sampler::new(Some(SEED)));
        assert_eq!(v, Verdict { accepted: 0, next: 0 });
    }

    /// vLLM's rejection-sampler test of the zero-mass residual: when `[p − q]⁺` has no mass (q equals p, or a
    /// deterministic draft holds all of p) a rejection draws from `p` itself, never from NaNs or a zero vector.
    #[test]
    fn zero_mass_residual_branches_draw_from_p() {
        let p = vec![0.25f32, 0.75, 0.0];
        assert_eq!(residual_after_rejection(p.clone(), Some(&p), 1), p, "q = p");
        let all_on_d = vec![0.0f32, 1.0, 0.0];
        assert_eq!(residual_after_rejection(all_on_d.clone(), None, 1), all_on_d, "one-hot q on p's whole mass");
        // q above p everywhere p has mass: rounding-level rejections still draw inside p's support.
        let rows = Logits::from_rows(vec![ln(&p), ln(&p)]);
        let q = Logits::from_rows(vec![p.clone()]);
        let mut s = Sampler::new(Some(3));
        for _ in 0..2_000 {
            let v = speculative_sampling(&[0], &rows, Some(&q), None, &mut s);
            assert!(p[v.next as usize] > 0.0, "{v:?}");
        }
    }

    /// vLLM's "sampled tokens are inside the top-k / top-p support", randomized: rows processed with top-k and
    /// top-p, drafts drawn from random `q` over the whole vocabulary (outside the support too); every token
    /// kept or drawn by speculative sampling, tree sampling and matching draws is inside its row's support.
    #[test]
    fn sampled_tokens_stay_inside_the_top_k_and_top_p_support() {
        use crate::generation::config::GenerationConfig;
        use crate::generation::logits::LogitsProcessor;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let vocab = 40;
        for (case, (top_k, top_p)) in [(5, 1.0), (0, 0.6), (8, 0.8)].into_iter().enumerate() {
            let cfg = GenerationConfig { do_sample: true, top_k, top_p, ..GenerationConfig::default() };
            let processor = LogitsProcessor::new(&cfg, 1).unwrap();
            let mut sampler = Sampler::new(Some(case as u64));
            let mut keyed = Sampler::by_position(Some(case as u64));
            for _ in 0..500 {
                let gamma = rng.random_range(1..5);
                let rows: Logits = (0..=gamma)
                    .map(|_| {
                        let mut row: Vec<f32> = (0..vocab).map(|_| rng.random_range(-4.0..4.0)).collect();
                        processor.process(&[0], &mut row);
                        row
                    })
                    .collect();
                let inside = |i: usize, t: u32| rows[i][t as usize] > f32::NEG_INFINITY;
                let q: Logits = (0..gamma)
                    .map(|_| {
                        let w: Vec<f32> = (0..vocab).map(|_| rng.random::<f32>()).collect();
                        let sum: f32 = w.iter().sum();
                        w.iter().map(|x| x / sum).collect::<Vec<f32>>()
                    })
                    .collect();
                let drafts: Vec<u32> = q.iter().map(|q| sampler.sample(q)).collect();
                for v in [
                    speculative_sampling(&drafts, &rows, Some(&q), None, &mut sampler),
                    speculative_sampling(&drafts, &rows, None, None, &mut sampler),
                    matching_draws(
                        &Block { drafts: &drafts, rows: &rows, q: Some(&q), ensemble_weight: None, do_sample: true },
                        1,
                        &mut keyed,
                    ),
                ] {
                    assert!((0..v.accepted).all(|i| inside(i, drafts[i])), "case {case}: {v:?}");
                    assert!(inside(v.accepted, v.next), "case {case}: {v:?}");
                }
                // The drafts as siblings under the root: a one-level tree.
                let parents = vec![0; gamma];
                let tree_rows = Logits::from_rows(vec![&rows[0]; gamma + 1]);
                let block =
                    TreeBlock { drafts: &drafts, parents: &parents, rows: &tree_rows, q: None, do_sample: true };
                let mut distinct = drafts.clone();
                distinct.sort_unstable();
                distinct.dedup();
                if distinct.len() == drafts.len() {
                    let t = tree_sampling(&block, &mut sampler);
                    assert!(t.path.iter().all(|&c| inside(0, drafts[c])) && inside(0, t.next), "case {case}: {t:?}");
                }
            }
        }
    }

    /// Matching draws give plain sampling's tokens draw for draw: the draw at each position is that position's,
    /// whatever was drafted before it.
    #[test]
    fn matching_draws_are_plain_sampling_draw_for_draw() {
        let rows: Logits = (0..4).map(|i| ln(&[0.2, 0.3, 0.1 + 0.1 * i as f32, 0.4 - 0.1 * i as f32])).collect();
        for seed in 0..50 {
            let mut plain = Sampler::by_position(Some(seed));
            let own: Vec<u32> = (0..4)
                .map(|i| {
                    plain.at(10 + i);
                    plain.sample(&softmax(&rows[i]))
                })
                .collect();
            let mut keyed = Sampler::by_position(Some(seed));
            for drafts in [&own[..3], &[9, 9, 9][..], &[own[0], 9, 9][..]] {
                let block = Block { drafts, rows: &rows, q: None, ensemble_weight: None, do_sample: true };
                let v = matching_draws(&block, 10, &mut keyed);
                assert_eq!(drafts[..v.accepted], own[..v.accepted]);
                assert_eq!(v.next, own[v.accepted], "seed {seed}, drafts {drafts:?}");
            }
        }
    }
}
