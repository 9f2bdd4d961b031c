//! Prompt lookup decoding: copy the continuation of an earlier occurrence of the sequence's last n-gram
//! (Transformers' `PromptLookupCandidateGenerator`), no second model.
//!
//! Transformers copies from the leftmost occurrence of the longest matching n-gram, however short. Under
//! cost-aware drafting every rejected draft costs a verification, so the choice is made by the evidence instead:
//! the occurrence whose match reaches furthest back (the most recent among equals), and only when at least
//! [`MIN_MATCH`] tokens match: drafts after one-token matches are kept too rarely to repay their verification,
//! and among longer matches the occurrence reaching furthest back keeps the most tokens (replayed over
//! Spec-Bench answers by `tools/bench/lookup_replay.py`; figures in BENCHMARKS.md).
//!
//! Occurrences come from an n-gram index over the context, extended by the tokens each round adds, instead of a
//! scan of the whole context per round. With a [`TreeShape`], the continuations of several distinct
//! occurrences are proposed as one tree: they share their common prefixes, and the verifier keeps whichever
//! path the target agrees with.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::generation::config::GenerationConfig;
use crate::models::CausalLm;
use crate::speculation::drafter::{Draft, Drafter, TreeShape};
use crate::speculation::factory::{missing, DraftParts};
use crate::speculation::method::SpeculationMethod;
use crate::speculation::registry::{self, Method};

/// Tokens copied per prompt-lookup round when the method is named without `prompt_lookup_num_tokens`.
pub const DEFAULT_PROMPT_LOOKUP_NUM_TOKENS: usize = 10;

/// `prompt_lookup`: chosen by `prompt_lookup_num_tokens`.
pub(crate) const METHOD: Method = Method {
    name: "prompt_lookup",
    knobs: &[
        &[&registry::PROMPT_LOOKUP_NUM_TOKENS, &registry::MAX_MATCHING_NGRAM, &registry::COST_AWARE_DRAFTING],
        &registry::TREE,
    ],
    chosen: |cfg, _| cfg.prompt_lookup_num_tokens.is_some(),
    named: |own| {
        own.prompt_lookup_num_tokens.get_or_insert(DEFAULT_PROMPT_LOOKUP_NUM_TOKENS);
        Ok(())
    },
    resolve,
    build,
};

fn resolve(cfg: &GenerationConfig, _: &crate::speculation::method::Available<'_>) -> Result<SpeculationMethod> {
    if cfg.assistant_ensemble_weight.is_some() {
        return Err(Error::InvalidOption(
            "Setting `assistant_ensemble_weight` requires candidate logits from the assistant model. It is not \
             supported with prompt lookup decoding."
                .into(),
        ));
    }
    Ok(SpeculationMethod::PromptLookup {
        num_tokens: cfg.prompt_lookup_num_tokens.unwrap_or(DEFAULT_PROMPT_LOOKUP_NUM_TOKENS),
        max_matching_ngram_size: cfg.effective_max_matching_ngram_size(),
    })
}

fn build<'a>(
    method: SpeculationMethod,
    cfg: &GenerationConfig,
    _prompt_len: usize,
    _target: &crate::models::ModelConfig,
    _parts: DraftParts<'a>,
) -> Result<Box<dyn Drafter + 'a>> {
    let SpeculationMethod::PromptLookup { num_tokens, max_matching_ngram_size } = method else {
        return Err(missing(method, "a prompt-lookup length"));
    };
    let tree = cfg.tree_shape();
    let num_tokens = match tree {
        Some(_) => cfg.speculative_num_steps.unwrap_or(num_tokens),
        None => num_tokens,
    };
    let lookup = PromptLookup::new(num_tokens, max_matching_ngram_size, cfg.eos_token_id.clone())?;
    Ok(Box::new(lookup.cost_aware(cfg.cost_aware()).tree(tree)))
}

/// Fewest matching tokens behind a cost-aware draft.
const MIN_MATCH: usize = 2;
/// How far back a cost-aware match is followed when ranking occurrences.
const MAX_MATCH: usize = 64;
/// Most recent occurrences of one n-gram a tree draws continuations from.
const TREE_OCCURRENCES: usize = 64;

/// Where each n-gram (of 1 to `max_n` tokens) of a token sequence ends: the positions its continuations start at,
/// ascending. Keyed by a hash; readers compare the tokens, so a collision only costs a comparison.
#[derive(Default)]
struct NgramIndex {
    max_n: usize,
    /// The tokens indexed so far.
    seen: Vec<u32>,
    ends: HashMap<(usize, u64), Vec<usize>>,
}

impl NgramIndex {
    fn key(gram: &[u32]) -> (usize, u64) {
        // FNV-1a over the ids.
        let hash = gram.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3));
        (gram.len(), hash)
    }

    /// Indexes `ids`, reading only what was added since the last call when `ids` extends what was indexed.
    fn update(&mut self, ids: &[u32]) {
        if !ids.starts_with(&self.seen) {
            self.seen.clear();
            self.ends.clear();
        }
        for end in self.seen.len() + 1..=ids.len() {
            for n in 1..=self.max_n.min(end) {
                self.ends.entry(Self::key(&ids[end - n..end])).or_default().push(end);
            }
        }
        self.seen.clear();
        self.seen.extend_from_slice(ids);
    }

    /// Where `gram`'s occurrences end, ascending, the sequence's own tail included.
    fn ends<'a>(&'a self, gram: &'a [u32]) -> impl DoubleEndedIterator<Item = usize> + 'a {
        let ids = &self.seen;
        let n = gram.len();
        self.ends.get(&Self::key(gram)).into_iter().flatten().copied().filter(move |&e| &ids[e - n..e] == gram)
    }
}

pub struct PromptLookup {
    /// `prompt_lookup_num_tokens`: the longest continuation copied.
    num_output_tokens: usize,
    max_matching_ngram_size: usize,
    eos: Vec<u32>,
    /// Rank occurrences by how far back they match (see the module doc) instead of Transformers' leftmost.
    cost_aware: bool,
    tree: Option<TreeShape>,
    index: NgramIndex,
}

impl PromptLookup {
    pub fn new(num_output_tokens: usize, max_matching_ngram_size: usize, eos: Vec<u32>) -> Result<Self> {
        if num_output_tokens == 0 || max_matching_ngram_size == 0 {
            return Err(Error::InvalidOption("Invalid max_matching_ngram_size or num_output_tokens".into()));
        }
        let index = NgramIndex { max_n: max_matching_ngram_size, ..Default::default() };
        Ok(Self { num_output_tokens, max_matching_ngram_size, eos, cost_aware: false, tree: None, index })
    }

    /// Proposes trees of this shape (`None`: one continuation, as Transformers).
    pub fn tree(self, tree: Option<TreeShape>) -> Self {
        Self { tree, ..self }
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
    pub fn lookup(&mut self, ids: &[u32], max: usize) -> Vec<u32> {
        let len = ids.len();
        let limit = self.num_output_tokens.min(max);
        if limit == 0 || len < 2 {
            return Vec::new();
        }
        self.index.update(ids);
        for k in (1..=self.max_matching_ngram_size.min(len - 1)).rev() {
            let tail = &ids[len - k..];
            // Occurrences whose continuation is non-empty: they end before the sequence's last token.
            let mut occurrences = self.index.ends(tail).filter(|&e| e < len).map(|e| e - k);
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

    /// A tree of the continuations of up to `shape.branches` distinct occurrences, at most `max` deep: longer
    /// n-grams first, the most recent occurrences first within one, each continuation cut before EOS and
    /// merged into the tree where it shares a prefix with one already taken; `shape.nodes` nodes at most. The
    /// first continuation is the first chain, tried first.
    pub fn lookup_tree(&mut self, ids: &[u32], max: usize, shape: TreeShape) -> Draft {
        let len = ids.len();
        let limit = self.num_output_tokens.min(max);
        let mut tree = Draft { parents: Some(Vec::new()), ..Draft::default() };
        if limit == 0 || len < 2 {
            return tree;
        }
        self.index.update(ids);
        let (mut taken, mut branches) = (Vec::new(), 0);
        'grams: for k in (1..=self.max_matching_ngram_size.min(len - 1)).rev() {
            let starts: Vec<usize> =
                self.index.ends(&ids[len - k..]).rev().filter(|&e| e < len).take(TREE_OCCURRENCES).collect();
            for start in starts {
                if taken.contains(&start) {
                    continue;
                }
                taken.push(start);
                let chosen = &ids[start..(start + limit).min(len)];
                let cut = chosen.iter().position(|t| self.eos.contains(t)).unwrap_or(chosen.len());
                if insert_path(&mut tree, &chosen[..cut], shape.nodes) {
                    branches += 1;
                }
                if branches == shape.branches || tree.tokens.len() >= shape.nodes {
                    break 'grams;
                }
            }
        }
        tree
    }
}

/// Merges `path` (a continuation of the root) into `tree`, adding at most `budget − len` nodes. Whether it
/// added any.
fn insert_path(tree: &mut Draft, path: &[u32], budget: usize) -> bool {
    let parents = tree.parents.get_or_insert_with(Vec::new);
    let mut node = 0;
    let mut added = false;
    for &t in path {
        let child = (0..tree.tokens.len()).find(|&i| parents[i] == node && tree.tokens[i] == t);
        node = match child {
            Some(i) => i + 1,
            None if tree.tokens.len() < budget => {
                tree.tokens.push(t);
                parents.push(node);
                added = true;
                tree.tokens.len()
            }
            None => break,
        };
    }
    added
}

impl Drafter for PromptLookup {
    fn method(&self) -> &'static str {
        "prompt_lookup"
    }

    fn propose(&mut self, _: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        Ok(match self.tree {
            Some(shape) => self.lookup_tree(context, max, shape),
            None => Draft { tokens: self.lookup(context, max), q: None, parents: None },
        })
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
        let mut pl = PromptLookup::new(3, 2, vec![]).unwrap();
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
        let mut pl = PromptLookup::new(2, 2, vec![]).unwrap().cost_aware(true);
        // Tail "8 1 2": "1 2" occurs at 0 (preceded by nothing), at 5 (by 8) and at 10 (by 7): the one at 5.
        assert_eq!(pl.lookup(&[1, 2, 3, 4, 8, 1, 2, 5, 6, 7, 1, 2, 9, 8, 1, 2], 10), vec![5, 6]);
        // Equal reach: the most recent.
        assert_eq!(pl.lookup(&[1, 2, 3, 4, 1, 2, 5, 6, 1, 2], 10), vec![5, 6]);
        // Only a one-token match: no draft (Transformers would copy after the first "2").
        assert!(pl.lookup(&[1, 2, 3, 4, 5, 7, 2], 10).is_empty());
        let mut leftmost = PromptLookup::new(2, 2, vec![]).unwrap();
        assert_eq!(leftmost.lookup(&[1, 2, 3, 4, 5, 7, 2], 10), vec![3, 4]);
    }

    #[test]
    fn continuation_stops_at_eos() {
        let mut pl = PromptLookup::new(5, 2, vec![0]).unwrap();
        assert_eq!(pl.lookup(&[1, 2, 3, 0, 4, 1, 2], 10), vec![3]);
        assert!(pl.lookup(&[1, 2, 0, 3, 1, 2], 10).is_empty());
    }

    /// The index gives the scan's answers whatever the order of the calls: extending, then starting over.
    #[test]
    fn the_index_follows_the_context() {
        let mut pl = PromptLookup::new(3, 3, vec![]).unwrap();
        let ids = [4, 1, 2, 3, 4, 1, 2, 5, 6, 4, 1, 2];
        for end in 2..=ids.len() {
            let mut fresh = PromptLookup::new(3, 3, vec![]).unwrap();
            assert_eq!(pl.lookup(&ids[..end], 10), fresh.lookup(&ids[..end], 10), "prefix of {end}");
        }
        assert_eq!(pl.lookup(&[9, 9, 8, 9], 10), vec![9, 8, 9]);
    }

    #[test]
    fn trees_merge_distinct_continuations() {
        let mut pl = PromptLookup::new(3, 2, vec![0]).unwrap();
        let shape = TreeShape { branches: 3, nodes: 16 };
        // "1 2" is followed by 3 4 5 (at 2), 3 7 (at 7, then the tail's own "1 2"), 9 0 (at 12): most recent first.
        let ids = [1, 2, 3, 4, 5, 1, 2, 3, 7, 8, 1, 2, 9, 0, 1, 2];
        let t = pl.lookup_tree(&ids, 10, shape);
        assert_eq!(t.tokens, vec![9, 3, 7, 8, 4, 5]);
        assert_eq!(t.parents.as_deref(), Some(&[0, 0, 2, 3, 2, 5][..]));
        // Within a budget of four nodes, and two branches.
        let t = pl.lookup_tree(&ids, 10, TreeShape { branches: 2, nodes: 4 });
        assert_eq!((t.tokens, t.parents.unwrap()), (vec![9, 3, 7, 8], vec![0, 0, 2, 3]));
        // At most two deep.
        let t = pl.lookup_tree(&ids, 2, shape);
        assert_eq!((t.tokens, t.parents.unwrap()), (vec![9, 3, 7, 4], vec![0, 0, 2, 2]));
    }

    #[test]
    fn zero_sizes_are_rejected() {
        assert!(PromptLookup::new(0, 2, vec![]).is_err());
        assert!(PromptLookup::new(3, 0, vec![]).is_err());
    }
}
