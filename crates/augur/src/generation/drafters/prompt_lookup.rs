//! Prompt lookup decoding: copy the continuation of an earlier occurrence of the sequence's last n-gram
//! (Transformers' `PromptLookupCandidateGenerator`), no second model.

use super::{Draft, Drafter};
use crate::error::{Error, Result};
use crate::model::CausalLm;

pub struct PromptLookup {
    /// `prompt_lookup_num_tokens`: the longest continuation copied.
    num_output_tokens: usize,
    max_matching_ngram_size: usize,
    eos: Vec<u32>,
}

impl PromptLookup {
    pub fn new(num_output_tokens: usize, max_matching_ngram_size: usize, eos: Vec<u32>) -> Result<Self> {
        if num_output_tokens == 0 || max_matching_ngram_size == 0 {
            return Err(Error::InvalidOption("Invalid max_matching_ngram_size or num_output_tokens".into()));
        }
        Ok(Self { num_output_tokens, max_matching_ngram_size, eos })
    }

    /// Transformers' search: the longest n-gram first; for each, the leftmost earlier occurrence of the
    /// sequence's tail with a non-empty continuation. The continuation stops before the first EOS.
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
            for j in 0..=len - k {
                if &ids[j..j + k] != tail {
                    continue;
                }
                let s = j + k;
                let e = (s + limit).min(len);
                if s >= e {
                    continue;
                }
                let chosen = &ids[s..e];
                let cut = chosen.iter().position(|t| self.eos.contains(t)).unwrap_or(chosen.len());
                // As in Transformers, a match whose continuation starts with EOS ends the search with no draft.
                return chosen[..cut].to_vec();
            }
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
