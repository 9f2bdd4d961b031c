//! Prompt lookup decoding: copy the continuation of an earlier occurrence of the sequence's last n-gram
//! (Transformers' `PromptLookupCandidateGenerator`), no second model.
//!
//! Transformers copies from the leftmost occurrence of the longest matching n-gram, however short. Under
//! cost-aware drafting every rejected draft costs a verification, so the choice is made by the evidence instead:
//! the occurrence whose match reaches furthest back (the most recent among equals), and only when at least
//! [`MIN_MATCH`] tokens match: drafts after one-token matches are kept too rarely to repay their verification,
//! and among longer matches the occurrence reaching furthest back keeps the most tokens (replayed over
//! Spec-Bench answers by `tools/bench/lookup_replay.py`; figures in BENCHMARKS.md).

use super::{Draft, Drafter};
use crate::error::{Error, Result};
use crate::models::CausalLm;

/// Fewest matching tokens behind a cost-aware draft.
const MIN_MATCH: usize = 2;
/// How far back a cost-aware match is followed when ranking occurrences.
const MAX_MATCH: usize = 64;

pub struct PromptLookup {
    /// `prompt_lookup_num_tokens`: the longest continuation copied.
    num_output_tokens: usize,
    max_matching_ngram_size: usize,
    eos: Vec<u32>,
    /// Rank occurrences by how far back they match (see the module doc) instead of Transformers' leftmost.
    cost_aware: bool,
}

impl PromptLookup {
    pub fn new(num_output_tokens: usize, max_matching_ngram_size: usize, eos: Vec<u32>) -> Result<Self> {
        if num_output_tokens == 0 || max_matching_ngram_size == 0 {
            return Err(Error::InvalidOption("Invalid max_matching_ngram_size or num_output_tokens".into()));
        }
        Ok(Self { num_output_tokens, max_matching_ngram_size, eos, cost_aware: false })
    }

    /// Chooses occurrences for cost-aware drafting (see the module doc).
    pub fn cost_aware(self, on: bool) -> Self {
        Self { cost_aware: on, ..self }
    }

    /// The longest n-gram first; for each, the leftmost earlier occurrence of the sequence's tail with a
    /// non-empty continuation (Transformers' search), or under cost-aware drafting the one matching furthest
    /// back. The continuation stops before the first EOS.
    /// Transformers' filter of forbidden tokens is not needed: the only non-warper processor that forbids a
    /// token is the minimum length's EOS ban, and continuations are cut at EOS anyway. (Running the filter
    /// through the sampling warpers, as Transformers does, wrongly cuts valid drafts.)
    pub fn lookup(&self, ids: &[u32], max: usize) -> Vec<u32> {
        let len = ids.len();
        let limit = self.num_output_tokens.min(max);
        if limit == 0 || len < 2 {
            return Vec::new();
        }
        for k in (1..=self.max_matching_ngram_size.min(len - 1)).rev() {
            let tail = &ids[len - k..];
            // Occurrences whose continuation is non-empty: they end before the sequence's last token.
            let mut occurrences = (0..len - k).filter(|&j| &ids[j..j + k] == tail);
            let start = if self.cost_aware {
                let matched =
                    |j: usize| k + (1..=j.min(MAX_MATCH - k)).take_while(|&b| ids[j - b] == ids[len - k - b]).count();
                let best = occurrences.map(|j| (matched(j), j)).max();
                match best {
                    Some((m, _)) if m < MIN_MATCH => return Vec::new(),
                    Some((_, j)) => j + k,
                    None => continue,
                }
            } else {
                match occurrences.next() {
                    Some(j) => j + k,
                    None => continue,
                }
            };
            let chosen = &ids[start..(start + limit).min(len)];
            let cut = chosen.iter().position(|t| self.eos.contains(t)).unwrap_or(chosen.len());
            // As in Transformers, a match whose continuation starts with EOS ends the search with no draft.
            return chosen[..cut].to_vec();
        }
        Vec::new()
    }
}

impl Drafter for PromptLookup {
    fn method(&self) -> &'static str {
        "prompt_lookup"
    }

    fn propose(&mut self, _: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        Ok(Draft { tokens: self.lookup(context, max), q: None })
    }

    fn observe(&mut self, _: &[u32], _: usize, _: usize) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_ngram_leftmost_match() {
        let pl = PromptLookup::new(3, 2, vec![]).unwrap();
        // Tail "1 2": leftmost earlier occurrence at 0 → continuation 3 4 5.
        assert_eq!(pl.lookup(&[1, 2, 3, 4, 5, 1, 2, 9, 1, 2], 10), vec![3, 4, 5]);
        // Tail bigram "7 2" never occurred; the unigram "2" first occurs at 1 → 3 4 5.
        assert_eq!(pl.lookup(&[1, 2, 3, 4, 5, 7, 2], 10), vec![3, 4, 5]);
        // Capped by the remaining budget, and by the end of the sequence.
        assert_eq!(pl.lookup(&[1, 2, 3, 4, 5, 1, 2], 2), vec![3, 4]);
        assert_eq!(pl.lookup(&[5, 1, 5], 10), vec![1, 5]);
        assert!(pl.lookup(&[1, 2, 3], 10).is_empty());
    }

    #[test]
    fn cost_aware_takes_the_match_reaching_furthest_back() {
        let pl = PromptLookup::new(2, 2, vec![]).unwrap().cost_aware(true);
        // Tail "8 1 2": "1 2" occurs at 0 (preceded by nothing), at 5 (by 8) and at 10 (by 7): the one at 5.
        assert_eq!(pl.lookup(&[1, 2, 3, 4, 8, 1, 2, 5, 6, 7, 1, 2, 9, 8, 1, 2], 10), vec![5, 6]);
        // Equal reach: the most recent.
        assert_eq!(pl.lookup(&[1, 2, 3, 4, 1, 2, 5, 6, 1, 2], 10), vec![5, 6]);
        // Only a one-token match: no draft (Transformers would copy after the first "2").
        assert!(pl.lookup(&[1, 2, 3, 4, 5, 7, 2], 10).is_empty());
        let leftmost = PromptLookup::new(2, 2, vec![]).unwrap();
        assert_eq!(leftmost.lookup(&[1, 2, 3, 4, 5, 7, 2], 10), vec![3, 4]);
    }

    #[test]
    fn continuation_stops_at_eos() {
        let pl = PromptLookup::new(5, 2, vec![0]).unwrap();
        assert_eq!(pl.lookup(&[1, 2, 3, 0, 4, 1, 2], 10), vec![3]);
        assert!(pl.lookup(&[1, 2, 0, 3, 1, 2], 10).is_empty());
    }

    #[test]
    fn zero_sizes_are_rejected() {
        assert!(PromptLookup::new(0, 2, vec![]).is_err());
        assert!(PromptLookup::new(3, 0, vec![]).is_err());
    }
}
