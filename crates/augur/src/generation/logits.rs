//! Logits processing in Transformers' order (`_get_logits_processor`): sequence bias, repetition penalty,
//! minimum-length EOS suppression, then, when sampling, the warpers Temperature → TopK → TopP → MinP.
//!
//! Each step reproduces the torch code's semantics on a single row of f32 logits; filtered entries become `-inf`.
//! Sorting is avoided where torch sorts: top-k uses a selection, top-p sorts only the tokens that could survive.

use super::config::{GenerationConfig, SequenceBias};
use super::sampler::{max_and_nan, softmax_in_place};
use crate::error::Result;

const NEG_INF: f32 = f32::NEG_INFINITY;

/// The processors `generate()` would apply for one configuration and prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitsProcessor {
    sequence_bias: SequenceBias,
    repetition_penalty: Option<f32>,
    eos_token_ids: Vec<u32>,
    /// EOS is suppressed while the context (prompt included) is shorter than this.
    min_length: usize,
    prompt_len: usize,
    warpers: Option<Warpers>,
}

/// The sampling warpers; each is `None` when Transformers would not install it.
#[derive(Debug, Clone, PartialEq)]
struct Warpers {
    temperature: Option<f32>,
    top_k: Option<usize>,
    /// `(top_p, removal threshold 1 - top_p)`.
    top_p: Option<(f32, f32)>,
    min_p: Option<f32>,
}

/// `min_tokens_to_keep` for single-sequence (non-beam) sampling.
const MIN_TOKENS_TO_KEEP: usize = 1;

impl LogitsProcessor {
    /// Builds the processors for `config` and a prompt of `prompt_len` tokens (for `min_new_tokens`). Errors as
    /// [`GenerationConfig::validate`].
    pub fn new(config: &GenerationConfig, prompt_len: usize) -> Result<Self> {
        config.validate()?;
        let warpers = config.do_sample.then(|| Warpers {
            temperature: (config.temperature != 1.0).then_some(config.temperature),
            top_k: (config.top_k != 0).then_some(config.top_k),
            top_p: (config.top_p < 1.0).then(|| (config.top_p, top_p_removal_threshold(config.top_p))),
            min_p: config.min_p,
        });
        Ok(LogitsProcessor {
            sequence_bias: config.sequence_bias.clone(),
            repetition_penalty: (config.repetition_penalty != 1.0).then_some(config.repetition_penalty),
            eos_token_ids: config.eos_token_id.clone(),
            min_length: config.min_length_for(prompt_len),
            prompt_len,
            warpers,
        })
    }

    /// Processes the logits for the next position. `context` is every token so far, prompt and generated (for a
    /// speculative block: the prompt, accepted tokens and the drafts before this position).
    pub fn process(&self, context: &[u32], logits: &mut [f32]) {
        if !self.sequence_bias.is_empty() {
            apply_sequence_bias(logits, context, &self.sequence_bias);
        }
        if let Some(penalty) = self.repetition_penalty {
            apply_repetition_penalty(logits, context, penalty);
        }
        if context.len() < self.min_length {
            suppress_tokens(logits, &self.eos_token_ids);
        }
        if let Some(w) = &self.warpers {
            if let Some(t) = w.temperature {
                apply_temperature(logits, t);
            }
            // After top-k only its survivors can be finite; later warpers work on them alone, which gives the same
            // result (the others have probability 0) without passes over the whole vocabulary.
            let active = w.top_k.and_then(|k| top_k_core(logits, k, MIN_TOKENS_TO_KEEP));
            if let Some((_, threshold)) = w.top_p {
                on_active(logits, active.as_deref(), |row| top_p_core(row, threshold, MIN_TOKENS_TO_KEEP));
            }
            if let Some(m) = w.min_p {
                on_active(logits, active.as_deref(), |row| min_p_filter(row, m, MIN_TOKENS_TO_KEEP));
            }
        }
    }

    /// Whether the next token is sampled (else it is the argmax).
    pub fn do_sample(&self) -> bool {
        self.warpers.is_some()
    }

    /// True when [`process`](Self::process) changes nothing for a context of this length, so callers can skip it.
    pub fn is_noop(&self, context_len: usize) -> bool {
        self.sequence_bias.is_empty()
            && self.repetition_penalty.is_none()
            && (self.eos_token_ids.is_empty() || context_len >= self.min_length)
            && self
                .warpers
                .as_ref()
                .is_none_or(|w| w.temperature.is_none() && w.top_k.is_none() && w.top_p.is_none() && w.min_p.is_none())
    }

    /// True for greedy decoding that the processors never affect (no repetition penalty, no minimum length beyond
    /// the prompt): the argmax of the raw logits is the answer at every position.
    pub fn is_identity_for_greedy(&self) -> bool {
        !self.do_sample()
            && self.sequence_bias.is_empty()
            && self.repetition_penalty.is_none()
            && (self.eos_token_ids.is_empty() || self.min_length <= self.prompt_len)
    }
}

/// Transformers' `SequenceBiasLogitsProcessor`: the biases of the sequences that the next token can complete
/// are summed per token, then added once. Ids outside the vocabulary are ignored (the pipeline refuses them
/// before generating, with Transformers' error). Linear in the number of biases (a map sums them per token).
pub fn apply_sequence_bias(logits: &mut [f32], context: &[u32], biases: &[(Vec<u32>, f32)]) {
    let mut added: std::collections::HashMap<u32, f32> = std::collections::HashMap::with_capacity(biases.len());
    for (seq, bias) in biases {
        let Some((&last, prefix)) = seq.split_last() else { continue };
        if prefix.len() > context.len() || !context.ends_with(prefix) {
            continue;
        }
        *added.entry(last).or_insert(0.0) += bias;
    }
    for (t, bias) in added {
        if let Some(l) = logits.get_mut(t as usize) {
            *l += bias;
        }
    }
}

/// Transformers' `RepetitionPenaltyLogitsProcessor`: every distinct token of `context` gets `score * penalty` when
/// its score is negative, else `score / penalty`, once. Ids outside the vocabulary are ignored.
pub fn apply_repetition_penalty(logits: &mut [f32], context: &[u32], penalty: f32) {
    let mut seen = vec![0u64; logits.len().div_ceil(64)];
    for &id in context {
        let i = id as usize;
        if i >= logits.len() {
            continue;
        }
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        if seen[word] & bit != 0 {
            continue;
        }
        seen[word] |= bit;
        let s = logits[i];
        logits[i] = if s < 0.0 { s * penalty } else { s / penalty };
    }
}

/// Sets the given tokens to `-inf` (EOS before the minimum length). Ids outside the vocabulary are ignored.
pub fn suppress_tokens(logits: &mut [f32], ids: &[u32]) {
    for &id in ids {
        if let Some(s) = logits.get_mut(id as usize) {
            *s = NEG_INF;
        }
    }
}

/// `TemperatureLogitsWarper`: divides by the temperature.
pub fn apply_temperature(logits: &mut [f32], temperature: f32) {
    for s in logits.iter_mut() {
        *s /= temperature;
    }
}

/// `TopKLogitsWarper`: removes every score strictly below the k-th largest, so ties with the k-th are kept.
/// `k` is raised to `min_tokens_to_keep`; a `k` at least the vocabulary size keeps everything.
pub fn top_k_filter(logits: &mut [f32], k: usize, min_tokens_to_keep: usize) {
    top_k_core(logits, k, min_tokens_to_keep);
}

/// [`top_k_filter`], returning the ids still present afterwards (ascending), or `None` when nothing was filtered.
fn top_k_core(logits: &mut [f32], k: usize, min_tokens_to_keep: usize) -> Option<Vec<u32>> {
    let k = k.max(min_tokens_to_keep).max(1);
    if k >= logits.len() {
        return None;
    }
    let kth = kth_largest(logits, k);
    let mut kept = Vec::with_capacity(k + 8);
    for (i, s) in logits.iter_mut().enumerate() {
        if *s < kth {
            *s = NEG_INF;
        } else {
            kept.push(i as u32);
        }
    }
    Some(kept)
}

/// The k-th largest value counting duplicates (`torch.topk(x, k)[0][-1]`); NaN ranks above everything, as in torch.
/// Requires `1 <= k < len`.
fn kth_largest(values: &[f32], k: usize) -> f32 {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    /// f32 ordered by `total_cmp`; only used on NaN-free data, where that is the IEEE order (-0 < +0 aside).
    #[derive(PartialEq)]
    struct Key(f32);
    impl Eq for Key {}
    impl PartialOrd for Key {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Key {
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            self.0.total_cmp(&other.0)
        }
    }

    // Small k: one pass with a min-heap of the k largest; most values lose a single comparison to its minimum.
    if k <= 1024 && k * 8 <= values.len() {
        let mut heap: BinaryHeap<Reverse<Key>> = BinaryHeap::with_capacity(k + 1);
        let mut has_nan = false;
        for &x in values {
            if x.is_nan() {
                has_nan = true;
                break;
            }
            if heap.len() < k {
                heap.push(Reverse(Key(x)));
            } else if let Some(Reverse(min)) = heap.peek() {
                if x > min.0 {
                    heap.pop();
                    heap.push(Reverse(Key(x)));
                }
            }
        }
        if !has_nan {
            if let Some(Reverse(min)) = heap.peek() {
                return min.0;
            }
        }
    }
    let mut scratch = values.to_vec();
    // Descending: NaN (positive, as torch produces) sorts first, as the largest.
    let (_, kth, _) = scratch.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    *kth
}

/// `1 - top_p`, computed as Python does: in double precision from the decimal value the user wrote, then compared
/// against float32 cumulative probabilities. Going through the f32 (`1.0 - 0.9f32`) would move the boundary by an ulp.
fn top_p_removal_threshold(top_p: f32) -> f32 {
    let decimal: f64 = format!("{top_p}").parse().unwrap_or(top_p as f64);
    (1.0 - decimal) as f32
}

/// `TopPLogitsWarper`: in ascending order of score, removes tokens while the cumulative probability (the token's own
/// included) is `<= 1 - top_p`, keeping at least the `min_tokens_to_keep` most likely tokens.
///
/// On equal scores at the cut, torch's order is unspecified (an unstable sort); here the lower token id is kept.
pub fn top_p_filter(logits: &mut [f32], top_p: f32, min_tokens_to_keep: usize) {
    top_p_core(logits, top_p_removal_threshold(top_p), min_tokens_to_keep);
}

fn top_p_core(logits: &mut [f32], threshold: f32, min_tokens_to_keep: usize) {
    let n = logits.len();
    let keep_min = min_tokens_to_keep.max(1);
    if n <= keep_min {
        return;
    }
    let Some(probs) = torch_softmax(logits) else {
        return; // torch's probabilities would be NaN and nothing would compare as removable
    };

    // Tokens below `floor` are removed whatever happens: all of them together hold at most half the threshold and
    // they come first in ascending order. Only the others need ordering, usually a small part of the vocabulary.
    let floor = (threshold.max(0.0) as f64 / (2.0 * n as f64)) as f32;
    let mut base = 0.0f64;
    let mut candidates: Vec<(f32, u32)> = Vec::new();
    for (i, (&x, &p)) in logits.iter().zip(&probs).enumerate() {
        if p >= floor {
            candidates.push((x, i as u32));
        } else {
            base += p as f64;
        }
    }
    if candidates.len() < keep_min {
        // Only possible with a threshold above 1 (top_p < 0): treat every token as a candidate.
        base = 0.0;
        candidates = logits.iter().enumerate().map(|(i, &x)| (x, i as u32)).collect();
    }
    let lowest_candidate = candidates.iter().map(|c| c.0).fold(f32::INFINITY, f32::min);

    // Ascending by score; among equal scores the higher id first, so it is the one removed.
    let order = |a: &(f32, u32), b: &(f32, u32)| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1));
    // Quickselect for the cut. Invariant: slice positions [lo, end) hold exactly the ranks [lo, end); ranks below
    // `lo` are certainly removed (their cumulative sum is `below`), ranks from `hi` on certainly kept. Halve the
    // unsure block [lo, hi) until it is small, then walk it in order.
    let m = candidates.len();
    let (mut lo, mut hi, mut end) = (0, m - keep_min, m);
    let mut below = base;
    while hi - lo > 32 {
        let mid = lo + (hi - lo) / 2;
        candidates[lo..end].select_nth_unstable_by(mid - lo, order);
        let through_mid = below + candidates[lo..=mid].iter().map(|&(_, i)| probs[i as usize] as f64).sum::<f64>();
        if (through_mid as f32) <= threshold {
            lo = mid + 1;
            below = through_mid;
        } else {
            hi = mid;
            end = mid;
        }
    }
    candidates[lo..end].sort_unstable_by(order);
    // Cumulative sum in double, compared as float32, as torch's CPU cumsum does.
    let mut cumulative = below;
    let mut removed = lo;
    for &(_, i) in &candidates[lo..hi] {
        cumulative += probs[i as usize] as f64;
        if (cumulative as f32) <= threshold {
            removed += 1;
        } else {
            break; // the sum only grows
        }
    }
    for &(_, i) in &candidates[..removed] {
        logits[i as usize] = NEG_INF;
    }
    for s in logits.iter_mut() {
        if *s < lowest_candidate {
            *s = NEG_INF;
        }
    }
}

/// `MinPLogitsWarper`: removes tokens whose probability is below `min_p` times the top probability, keeping at least
/// the `min_tokens_to_keep` most likely tokens.
pub fn min_p_filter(logits: &mut [f32], min_p: f32, min_tokens_to_keep: usize) {
    let Some(probs) = torch_softmax(logits) else {
        return;
    };
    let (top_prob, _) = max_and_nan(&probs);
    let scaled = min_p * top_prob;
    // The k-th largest score: tokens at or above it are always kept.
    let keep_from = if min_tokens_to_keep > 1 && min_tokens_to_keep < logits.len() {
        kth_largest(logits, min_tokens_to_keep)
    } else {
        max_and_nan(logits).0
    };
    for (s, &p) in logits.iter_mut().zip(&probs) {
        if p < scaled && *s < keep_from {
            *s = NEG_INF;
        }
    }
}

/// Probabilities as torch computes them in float32, or `None` where torch's would be NaN (a NaN score, +inf, or
/// no finite score).
fn torch_softmax(logits: &[f32]) -> Option<Vec<f32>> {
    let (max, has_nan) = max_and_nan(logits);
    if has_nan || !max.is_finite() {
        return None;
    }
    let mut probs = logits.to_vec();
    softmax_in_place(&mut probs);
    Some(probs)
}

/// Runs `f` on the entries of `active` only (all others are `-inf` and stay so), or on the whole row.
fn on_active(logits: &mut [f32], active: Option<&[u32]>, f: impl FnOnce(&mut [f32])) {
    match active {
        None => f(logits),
        Some(ids) => {
            let mut values: Vec<f32> = ids.iter().map(|&i| logits[i as usize]).collect();
            f(&mut values);
            for (&i, v) in ids.iter().zip(values) {
                logits[i as usize] = v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::sampler::softmax;

    fn kept(logits: &[f32]) -> Vec<usize> {
        logits.iter().enumerate().filter(|(_, x)| x.is_finite()).map(|(i, _)| i).collect()
    }

    fn sampling(f: impl FnOnce(&mut GenerationConfig)) -> GenerationConfig {
        let mut c = GenerationConfig { do_sample: true, top_k: 0, ..GenerationConfig::default() };
        f(&mut c);
        c
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_once() {
        let mut logits = vec![2.0, -2.0, 1.0, 3.0];
        apply_repetition_penalty(&mut logits, &[0, 1, 0, 1, 0, 9], 2.0);
        assert_eq!(logits, vec![1.0, -4.0, 1.0, 3.0]);

        // A penalty below 1 rewards: positive scores grow, negative ones shrink towards 0.
        let mut logits = vec![2.0, -2.0, 0.0];
        apply_repetition_penalty(&mut logits, &[0, 1, 2], 0.5);
        assert_eq!(logits, vec![4.0, -1.0, 0.0]);
    }

    #[test]
    fn processor_penalises_the_whole_context_including_the_prompt() {
        let c = GenerationConfig { repetition_penalty: 1.25, ..GenerationConfig::default() };
        let p = LogitsProcessor::new(&c, 2).unwrap();
        let mut logits = vec![5.0, -1.0, 5.0];
        p.process(&[1, 0], &mut logits);
        assert_eq!(logits, vec![4.0, -1.25, 5.0]);
        assert!(!p.is_noop(2));
        assert!(!p.is_identity_for_greedy());
    }

    #[test]
    fn min_new_tokens_suppresses_every_eos_until_reached() {
        let c = GenerationConfig { min_new_tokens: Some(2), eos_token_id: vec![1, 3, 99], ..Default::default() };
        let p = LogitsProcessor::new(&c, 3).unwrap();
        let prompt = [7, 7, 7];
        let mut logits = vec![0.0; 4];
        p.process(&prompt, &mut logits);
        assert_eq!(logits, vec![0.0, NEG_INF, 0.0, NEG_INF]);
        let mut logits = vec![0.0; 4];
        p.process(&[7, 7, 7, 0], &mut logits);
        assert_eq!(logits, vec![0.0, NEG_INF, 0.0, NEG_INF], "1 new token < 2");
        let mut logits = vec![0.0; 4];
        p.process(&[7, 7, 7, 0, 0], &mut logits);
        assert_eq!(logits, vec![0.0; 4]);
        assert!(!p.is_noop(4));
        assert!(p.is_noop(5));
        assert!(!p.is_identity_for_greedy());

        // min_length counts the prompt.
        let c = GenerationConfig { min_length: Some(4), eos_token_id: vec![0], ..Default::default() };
        let p = LogitsProcessor::new(&c, 3).unwrap();
        let mut logits = vec![1.0, 2.0];
        p.process(&[5, 5, 5], &mut logits);
        assert_eq!(logits, vec![NEG_INF, 2.0]);
        let mut logits = vec![1.0, 2.0];
        p.process(&[5, 5, 5, 1], &mut logits);
        assert_eq!(logits, vec![1.0, 2.0]);

        // Without EOS ids there is nothing to suppress.
        let c = GenerationConfig { min_new_tokens: Some(2), ..Default::default() };
        assert!(LogitsProcessor::new(&c, 3).unwrap().is_identity_for_greedy());
    }

    #[test]
    fn greedy_ignores_warpers() {
        let c = GenerationConfig { temperature: 0.5, top_k: 1, top_p: 0.1, min_p: Some(0.9), ..Default::default() };
        let p = LogitsProcessor::new(&c, 0).unwrap();
        assert!(p.is_identity_for_greedy());
        assert!(p.is_noop(0));
        let mut logits = vec![1.0, 2.0, 3.0];
        p.process(&[], &mut logits);
        assert_eq!(logits, vec![1.0, 2.0, 3.0]);
    }

    #[test]
    fn temperature_divides() {
        let p = LogitsProcessor::new(&sampling(|c| c.temperature = 0.5), 0).unwrap();
        let mut logits = vec![1.0, -2.0, 0.25];
        p.process(&[], &mut logits);
        assert_eq!(logits, vec![2.0, -4.0, 0.5]);
        assert!(p.do_sample());
        assert!(!p.is_identity_for_greedy());
    }

    #[test]
    fn top_k_keeps_ties_with_the_kth_value() {
        let mut logits = vec![1.0, 3.0, 2.0, 3.0, 2.0, 0.0];
        top_k_filter(&mut logits, 2, 1);
        assert_eq!(kept(&logits), vec![1, 3]);

        let mut logits = vec![1.0, 3.0, 2.0, 3.0, 2.0, 0.0];
        top_k_filter(&mut logits, 3, 1);
        assert_eq!(kept(&logits), vec![1, 2, 3, 4], "the 3rd value is 2.0 and both 2.0 stay");
        assert_eq!(logits[2], 2.0, "kept values are unchanged");

        let mut logits = vec![1.0, 3.0, 2.0];
        top_k_filter(&mut logits, 10, 1);
        assert_eq!(kept(&logits), vec![0, 1, 2]);

        // min_tokens_to_keep raises k.
        let mut logits = vec![1.0, 3.0, 2.0];
        top_k_filter(&mut logits, 1, 2);
        assert_eq!(kept(&logits), vec![1, 2]);
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_top_p() {
        // Probabilities 0.1, 0.3, 0.6 (ascending cumulative 0.1, 0.4, 1.0).
        let base = [1f32.ln(), 3f32.ln(), 6f32.ln()];
        for (top_p, expect) in [(0.5, vec![2]), (0.7, vec![1, 2]), (0.95, vec![0, 1, 2]), (0.0, vec![2])] {
            let mut logits = base.to_vec();
            top_p_filter(&mut logits, top_p, 1);
            assert_eq!(kept(&logits), expect, "top_p = {top_p}");
        }
    }

    #[test]
    fn top_p_boundary_removes_cumulative_equal_to_one_minus_top_p() {
        // Four equal tokens: probabilities exactly 0.25. With top_p 0.75 the first cumulative sum equals 1 - 0.75
        // exactly and `<=` removes it; Python computes 1 - 0.75 in double, which is exact here.
        let mut logits = vec![0.0f32; 4];
        top_p_filter(&mut logits, 0.75, 1);
        assert_eq!(kept(&logits), vec![0, 1, 2], "the higher id goes first among ties");

        // 0.9 as typed: Python's threshold is (1 - 0.9) = 0.09999999999999998 → float32 0.1, not 1 - 0.9f32.
        assert_eq!(top_p_removal_threshold(0.9), 0.1f32);
        assert_ne!(1.0 - 0.9f32, 0.1f32);
    }

    fn pseudo_random_logits(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    #[test]
    fn top_k_heap_path_matches_selection() {
        let mut row = pseudo_random_logits(20_000, 5, 8.0);
        for x in row.iter_mut().step_by(7) {
            *x = x.round(); // ties
        }
        for x in row.iter_mut().step_by(11) {
            *x = NEG_INF;
        }
        for k in [1, 2, 50, 100, 1000, 2500, 5000, 19_999] {
            let mut sorted = row.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            assert_eq!(kth_largest(&row, k), sorted[k - 1], "k = {k}");
        }
        // A NaN ranks first, as in torch.topk, so the k-th value is the (k-1)-th of the rest.
        let mut with_nan = row.clone();
        with_nan[3] = f32::NAN;
        let mut rest = row.clone();
        rest.remove(3);
        rest.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(kth_largest(&with_nan, 50), rest[48]);
    }

    #[test]
    fn processor_on_top_k_survivors_matches_full_row_warpers() {
        let c = sampling(|c| {
            c.temperature = 0.8;
            c.top_k = 200;
            c.top_p = 0.8;
            c.min_p = Some(0.05);
        });
        let p = LogitsProcessor::new(&c, 0).unwrap();
        for seed in 0..5 {
            let row = pseudo_random_logits(30_000, seed, 10.0);
            let mut fast = row.clone();
            p.process(&[], &mut fast);
            let mut full = row.clone();
            apply_temperature(&mut full, 0.8);
            top_k_filter(&mut full, 200, 1);
            top_p_filter(&mut full, 0.8, 1);
            min_p_filter(&mut full, 0.05, 1);
            assert_eq!(fast, full, "seed {seed}");
            assert!(!kept(&fast).is_empty() && kept(&fast).len() <= 200);
        }
    }

    /// Straightforward top-p: full stable-order sort, sequential cumulative sum.
    fn top_p_reference(logits: &[f32], top_p: f32, keep_min: usize) -> Vec<usize> {
        let n = logits.len();
        let Some(probs) = torch_softmax(logits) else { return (0..n).collect() };
        let threshold = top_p_removal_threshold(top_p);
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)));
        let mut out = logits.to_vec();
        let mut cumulative = 0.0f64;
        for &i in &order[..n.saturating_sub(keep_min)] {
            cumulative += probs[i] as f64;
            if (cumulative as f32) <= threshold {
                out[i] = NEG_INF;
            }
        }
        kept(&out)
    }

    #[test]
    fn top_p_matches_a_full_sort_on_large_vocabularies() {
        let mut state = 12345u64;
        let mut uniform = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        let n = 50_000;
        let flat: Vec<f32> = (0..n).map(|_| uniform() * 12.0 - 6.0).collect();
        let peaked: Vec<f32> = flat.iter().map(|x| x * 4.0).collect();
        let nearly_uniform: Vec<f32> = flat.iter().map(|x| x * 0.01).collect();
        let tied: Vec<f32> = flat.iter().map(|x| x.round()).collect();
        let mut masked = flat.clone();
        for (i, x) in masked.iter_mut().enumerate() {
            if i % 3 != 0 {
                *x = NEG_INF;
            }
        }
        for (name, logits) in [
            ("flat", &flat),
            ("peaked", &peaked),
            ("nearly uniform", &nearly_uniform),
            ("tied", &tied),
            ("masked", &masked),
        ] {
            for top_p in [0.0f32, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999] {
                for keep_min in [1, 3] {
                    let mut fast = logits.clone();
                    top_p_filter(&mut fast, top_p, keep_min);
                    let expected = top_p_reference(logits, top_p, keep_min);
                    assert_eq!(kept(&fast), expected, "{name}, top_p = {top_p}, keep {keep_min}");
                    assert!(expected.len() >= keep_min);
                }
            }
        }
        // Kept mass reaches top_p.
        let mut row = flat.clone();
        top_p_filter(&mut row, 0.9, 1);
        let probs = torch_softmax(&flat).unwrap();
        let mass: f32 = kept(&row).iter().map(|&i| probs[i]).sum();
        assert!(mass >= 0.9 - 1e-4, "{mass}");
    }

    #[test]
    fn min_p_is_relative_to_the_top_probability() {
        // Probabilities 0.5, 0.3, 0.15, 0.05: with min_p 0.2 the cut is 0.1.
        let base = [0.5f32.ln(), 0.3f32.ln(), 0.15f32.ln(), 0.05f32.ln()];
        let mut logits = base.to_vec();
        min_p_filter(&mut logits, 0.2, 1);
        assert_eq!(kept(&logits), vec![0, 1, 2]);
        let mut logits = base.to_vec();
        min_p_filter(&mut logits, 0.7, 1);
        assert_eq!(kept(&logits), vec![0]);
        let mut logits = base.to_vec();
        min_p_filter(&mut logits, 1.0, 1);
        assert_eq!(kept(&logits), vec![0], "the top token is always kept");
        let mut logits = base.to_vec();
        min_p_filter(&mut logits, 0.7, 2);
        assert_eq!(kept(&logits), vec![0, 1], "min_tokens_to_keep");
    }

    #[test]
    fn warpers_run_in_transformers_order() {
        // Temperature 0.5 first sharpens [ln 1, ln 2, ln 3, ln 4] to probabilities ∝ 1, 4, 9, 16 (/30); top-k 3
        // drops token 0; top-p 0.6 over 4/29, 9/29, 16/29 (cumulative 0.138, 0.448) drops token 1; min-p 0.6
        // (cut 0.6·0.64 = 0.384 of the renormalised 9/25, 16/25) drops token 2.
        let c = sampling(|c| {
            c.temperature = 0.5;
            c.top_k = 3;
            c.top_p = 0.6;
            c.min_p = Some(0.6);
        });
        let p = LogitsProcessor::new(&c, 0).unwrap();
        let mut logits: Vec<f32> = [1f32, 2.0, 3.0, 4.0].iter().map(|x| x.ln()).collect();
        p.process(&[], &mut logits);
        assert_eq!(kept(&logits), vec![3]);

        // Without min-p tokens 2 and 3 survive, with the tempered scores.
        let c = sampling(|c| {
            c.temperature = 0.5;
            c.top_k = 3;
            c.top_p = 0.6;
        });
        let p = LogitsProcessor::new(&c, 0).unwrap();
        let mut logits: Vec<f32> = [1f32, 2.0, 3.0, 4.0].iter().map(|x| x.ln()).collect();
        p.process(&[], &mut logits);
        assert_eq!(kept(&logits), vec![2, 3]);
        let probs = softmax(&logits);
        assert!((probs[3] - 16.0 / 25.0).abs() < 1e-5, "{probs:?}");
    }

    #[test]
    fn repetition_penalty_runs_before_temperature() {
        let c = sampling(|c| {
            c.repetition_penalty = 2.0;
            c.temperature = 2.0;
        });
        let p = LogitsProcessor::new(&c, 1).unwrap();
        let mut logits = vec![4.0, -4.0];
        p.process(&[0, 1], &mut logits);
        assert_eq!(logits, vec![1.0, -4.0]);
    }

    #[test]
    fn invalid_config_is_rejected() {
        assert!(LogitsProcessor::new(&sampling(|c| c.temperature = 0.0), 0).is_err());
        assert!(LogitsProcessor::new(&GenerationConfig { repetition_penalty: -1.0, ..Default::default() }, 0).is_err());
    }

    #[test]
    fn degenerate_rows_do_not_panic() {
        let mut all_masked = vec![NEG_INF; 5];
        top_k_filter(&mut all_masked, 2, 1);
        top_p_filter(&mut all_masked, 0.5, 1);
        min_p_filter(&mut all_masked, 0.5, 1);
        assert!(all_masked.iter().all(|x| *x == NEG_INF));
        let mut empty: Vec<f32> = vec![];
        top_k_filter(&mut empty, 2, 1);
        top_p_filter(&mut empty, 0.5, 1);
        min_p_filter(&mut empty, 0.5, 1);
        apply_repetition_penalty(&mut empty, &[3], 1.2);
    }
}
