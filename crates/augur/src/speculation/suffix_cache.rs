//! What suffix decoding knows (SuffixDecoding, Oliaro et al. 2024; Arctic Inference; vLLM's `method: "suffix"`):
//! token sequences, and for a context's tail the tree of continuations that followed the same tokens before,
//! each scored by how often it followed them.
//!
//! Arctic Inference keeps a suffix tree whose nodes count the suffixes through them. The same counts come from
//! where each token occurs: a node `s` (a string of at most `max_depth` tokens) counts the places `s` occurs, and
//! the places that follow the context's last `m` tokens are those of its last token whose preceding tokens match
//! `m − 1` further back. [`SuffixIndex`] keeps those occurrence lists instead of tree nodes (16 bytes a token,
//! appended and removed per sequence in linear time) and builds the draft tree from them per round. The draft
//! follows Arctic Inference's `speculate`: for each match length `m` (the longest first), a best-first tree of at
//! most `min(max_tokens, ⌊m · max_spec_factor⌋)` nodes, none deeper than `max_depth − m` (the tree's depth
//! bounds a match plus its draft) nor less probable than `min_token_prob`; a node's probability is the product
//! of its path's counts over its parent's; the tree with the highest summed probability (the expected number of
//! accepted tokens) wins.
//!
//! [`SuffixCache`] is the process-wide part: earlier requests' outputs, one [`SuffixIndex`] per owner (an API
//! key: owners never read each other's outputs), within one bound on cached tokens shared by all owners, the
//! least recently used output evicted first (inserting or drafting from an output uses it).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};

/// The most occurrences of the context's last token a round reads, the most recent first: beyond them a common
/// token's statistics only cost time.
const MAX_OCCURRENCES: usize = 4096;

/// How a suffix draft is sized (the `suffix_*` options).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SuffixParams {
    /// The deepest match plus draft.
    pub max_depth: usize,
    /// Draft tokens allowed per matched token.
    pub max_spec_factor: f32,
    /// Nodes less probable than this are not drafted.
    pub min_token_prob: f32,
    /// The most nodes of one draft.
    pub max_tokens: usize,
}

/// A scored draft tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Candidate {
    pub tokens: Vec<u32>,
    /// `parents[i]`: 0 for the context's last token, `j + 1` for `tokens[j]`; parents come before children.
    pub parents: Vec<usize>,
    /// Each node's estimated probability of being accepted, non-increasing: the most probable nodes come first.
    pub probs: Vec<f32>,
    /// The summed probabilities: the expected number of accepted drafts.
    pub score: f32,
    /// The tokens of the context's tail that matched.
    pub match_len: usize,
    /// The sequences whose occurrences the draft was built from.
    pub sources: Vec<u64>,
}

/// One occurrence: a sequence and a position in it.
type At = (u64, u32);

/// Token sequences and, for each token, where it occurs (ascending).
#[derive(Debug, Default)]
pub struct SuffixIndex {
    seqs: HashMap<u64, Vec<u32>>,
    at: HashMap<u32, Vec<At>>,
    tokens: usize,
}

impl SuffixIndex {
    /// Appends `tokens` to sequence `seq` (a new one when absent).
    pub fn extend(&mut self, seq: u64, tokens: &[u32]) {
        let s = self.seqs.entry(seq).or_default();
        for &t in tokens {
            self.at.entry(t).or_default().push((seq, s.len() as u32));
            s.push(t);
        }
        self.tokens += tokens.len();
    }

    /// Removes sequence `seq`; the tokens it held.
    pub fn remove(&mut self, seq: u64) -> usize {
        let Some(s) = self.seqs.remove(&seq) else { return 0 };
        let mut distinct = s.clone();
        distinct.sort_unstable();
        distinct.dedup();
        for t in distinct {
            if let Some(list) = self.at.get_mut(&t) {
                list.retain(|&(q, _)| q != seq);
                if list.is_empty() {
                    self.at.remove(&t);
                }
            }
        }
        self.tokens -= s.len();
        s.len()
    }

    /// The tokens held.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    pub fn sequence(&self, seq: u64) -> Option<&[u32]> {
        self.seqs.get(&seq).map(Vec::as_slice)
    }

    /// The best draft continuing `context` (see the module doc); `skip` is an occurrence not to count (the
    /// context's own last token, when the context is one of the sequences).
    pub fn speculate(&self, context: &[u32], params: &SuffixParams, skip: Option<At>) -> Candidate {
        let mut best = Candidate::default();
        let Some(&last) = context.last() else { return best };
        let Some(list) = self.at.get(&last) else { return best };
        let longest = params.max_depth.min(context.len());
        // Each occurrence with how many of the context's last tokens it matches (at most `longest`).
        let mut matched: Vec<(At, usize)> = Vec::new();
        for &(seq, pos) in list.iter().rev().filter(|&&a| Some(a) != skip).take(MAX_OCCURRENCES) {
            let s = &self.seqs[&seq];
            let pos = pos as usize;
            let reach = longest.min(pos + 1);
            let m = 1 + (1..reach).take_while(|&b| s[pos - b] == context[context.len() - 1 - b]).count();
            matched.push(((seq, pos as u32), m));
        }
        for m in (1..=longest).rev() {
            let max_tokens = params.max_tokens.min((m as f32 * params.max_spec_factor + 1e-6) as usize);
            let depth = params.max_depth.saturating_sub(m);
            if max_tokens == 0 || depth == 0 {
                continue;
            }
            let roots: Vec<At> = matched.iter().filter(|&&(_, l)| l >= m).map(|&(a, _)| a).collect();
            if roots.is_empty() {
                continue;
            }
            let candidate = self.tree(roots, max_tokens, depth, params.min_token_prob);
            if candidate.score > best.score {
                best = Candidate { match_len: m, ..candidate };
            }
        }
        best
    }

    /// The best-first tree over the continuations of `roots` (occurrences of the matched tail).
    fn tree(&self, roots: Vec<At>, max_tokens: usize, max_depth: usize, min_prob: f32) -> Candidate {
        let mut sources: Vec<u64> = roots.iter().map(|&(s, _)| s).collect();
        sources.sort_unstable();
        sources.dedup();
        let mut out = Candidate { sources, ..Candidate::default() };
        let mut heap = BinaryHeap::new();
        let mut order = 0;
        self.expand(&mut heap, &mut order, &roots, 1.0, 0, 0, max_depth, min_prob);
        while out.tokens.len() < max_tokens {
            let Some(node) = heap.pop() else { break };
            out.tokens.push(node.token);
            out.parents.push(node.parent);
            out.probs.push(node.prob);
            out.score += node.prob;
            let index = out.tokens.len();
            self.expand(&mut heap, &mut order, &node.at, node.prob, index, node.depth, max_depth, min_prob);
        }
        out
    }

    /// Pushes the children of a node (its occurrences `at`, ending at the node's token) onto `heap`: one per
    /// distinct next token, with `prob` times its share of the node's occurrences.
    #[allow(clippy::too_many_arguments)]
    fn expand(
        &self,
        heap: &mut BinaryHeap<Node>,
        order: &mut usize,
        at: &[At],
        prob: f32,
        index: usize,
        depth: usize,
        max_depth: usize,
        min_prob: f32,
    ) {
        if depth >= max_depth {
            return;
        }
        let mut next: Vec<(u32, At)> = at
            .iter()
            .filter_map(|&(seq, pos)| self.seqs[&seq].get(pos as usize + 1).map(|&t| (t, (seq, pos + 1))))
            .collect();
        next.sort_unstable_by_key(|&(t, _)| t);
        for group in next.chunk_by(|a, b| a.0 == b.0) {
            let p = prob * group.len() as f32 / at.len() as f32;
            if p >= min_prob {
                *order += 1;
                let at = group.iter().map(|&(_, a)| a).collect();
                heap.push(Node { prob: p, order: *order, token: group[0].0, parent: index, depth: depth + 1, at });
            }
        }
    }
}

/// A node waiting in the best-first queue: the most probable first, then the first pushed.
struct Node {
    prob: f32,
    order: usize,
    token: u32,
    parent: usize,
    depth: usize,
    at: Vec<At>,
}

impl Ord for Node {
    fn cmp(&self, other: &Self) -> Ordering {
        self.prob.total_cmp(&other.prob).then(other.order.cmp(&self.order))
    }
}

impl PartialOrd for Node {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Node {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Node {}

/// Earlier requests' outputs, process-wide (see the module doc). Shared between concurrent requests.
#[derive(Debug)]
pub struct SuffixCache {
    capacity: usize,
    state: Mutex<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    owners: HashMap<String, SuffixIndex>,
    /// Each output's owner and last use.
    entries: HashMap<u64, (String, u64)>,
    /// Outputs by last use, the least recent first.
    lru: BTreeMap<u64, u64>,
    clock: u64,
    next_id: u64,
    tokens: usize,
}

impl CacheState {
    fn touch(&mut self, id: u64) {
        self.clock += 1;
        let clock = self.clock;
        if let Some((_, used)) = self.entries.get_mut(&id) {
            self.lru.remove(used);
            *used = clock;
            self.lru.insert(clock, id);
        }
    }
}

/// A call's view of the process-wide cache: the cache, and whose outputs the call reads and feeds.
#[derive(Debug, Clone)]
pub struct SuffixCacheRef {
    pub cache: Arc<SuffixCache>,
    /// The API key's name (empty without keys): owners never read each other's outputs.
    pub owner: String,
}

/// Tokens the cache holds by default: about 16 MB.
pub const DEFAULT_SUFFIX_CACHE_TOKENS: usize = 1 << 20;

impl SuffixCache {
    /// A cache of at most `capacity` tokens (0: it keeps nothing).
    pub fn new(capacity: usize) -> Self {
        Self { capacity, state: Mutex::new(CacheState::default()) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CacheState> {
        // A panic elsewhere while holding the lock leaves whole sequences in place: the state is still valid.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a finished output of `owner`'s (its last `capacity` tokens at most), evicting the least recently
    /// used outputs beyond the bound.
    pub fn insert(&self, owner: &str, output: &[u32]) {
        let output = &output[output.len().saturating_sub(self.capacity)..];
        if output.is_empty() {
            return;
        }
        let mut st = self.state();
        while st.tokens + output.len() > self.capacity {
            let Some((_, id)) = st.lru.pop_first() else { break };
            if let Some((who, _)) = st.entries.remove(&id) {
                let freed = st.owners.get_mut(&who).map_or(0, |index| index.remove(id));
                st.tokens -= freed;
                if st.owners.get(&who).is_some_and(|i| i.tokens() == 0) {
                    st.owners.remove(&who);
                }
            }
        }
        let id = st.next_id;
        st.next_id += 1;
        st.owners.entry(owner.to_string()).or_default().extend(id, output);
        st.tokens += output.len();
        st.entries.insert(id, (owner.to_string(), 0));
        st.touch(id);
    }

    /// The best draft from `owner`'s outputs continuing `context`; the outputs it was built from count as used.
    pub fn speculate(&self, owner: &str, context: &[u32], params: &SuffixParams) -> Candidate {
        let mut st = self.state();
        let candidate = st.owners.get(owner).map(|index| index.speculate(context, params, None)).unwrap_or_default();
        if !candidate.tokens.is_empty() {
            for &id in &candidate.sources {
                st.touch(id);
            }
        }
        candidate
    }

    /// The tokens held, over all owners.
    pub fn tokens(&self) -> usize {
        self.state().tokens
    }

    /// The outputs held, over all owners.
    pub fn outputs(&self) -> usize {
        self.state().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(max_depth: usize) -> SuffixParams {
        SuffixParams { max_depth, max_spec_factor: 1.0, min_token_prob: 0.1, max_tokens: 16 }
    }

    /// The counts a suffix tree would hold, computed the slow way: every earlier occurrence of the context's
    /// last `m` tokens, and how many of them go on with `next`.
    fn brute_share(seq: &[u32], context: &[u32], m: usize, next: &[u32]) -> f32 {
        let tail = &context[context.len() - m..];
        let starts: Vec<usize> = (0..=seq.len() - m).filter(|&i| &seq[i..i + m] == tail).collect();
        let going_on = starts.iter().filter(|&&i| seq[i + m..].starts_with(next)).count();
        going_on as f32 / starts.len() as f32
    }

    #[test]
    fn probabilities_are_the_suffix_trees_count_ratios() {
        // "1 2" is followed by 3 three times (then 4, 6, 5) and by 9 once.
        let seq = [1, 2, 3, 4, 1, 2, 3, 6, 1, 2, 9, 1, 2, 3, 5, 7];
        let mut index = SuffixIndex::default();
        index.extend(7, &seq);
        let context = [8, 1, 2];
        // Factor 2: a two-token match drafts up to four tokens.
        let c = index.speculate(&context, &SuffixParams { max_spec_factor: 2.0, ..params(8) }, None);
        assert_eq!(c.match_len, 2);
        // Best first: 3 (3/4), then the 1/4 nodes in the order they were found: 9, then 4 and 5 after 3.
        assert_eq!(c.tokens, vec![3, 9, 4, 5]);
        assert_eq!(c.parents, vec![0, 0, 1, 1]);
        for (i, path) in [vec![3], vec![9], vec![3, 4], vec![3, 5]].iter().enumerate() {
            assert!((c.probs[i] - brute_share(&seq, &context, 2, path)).abs() < 1e-6, "{path:?}: {c:?}");
        }
        assert!((c.score - c.probs.iter().sum::<f32>()).abs() < 1e-6);
        assert_eq!(c.sources, vec![7]);
    }

    #[test]
    fn the_draft_is_bounded_by_the_match_the_depth_and_the_probability() {
        let seq: Vec<u32> = (0..40).collect();
        let mut index = SuffixIndex::default();
        index.extend(0, &seq);
        // A three-token match drafts at most three tokens (factor 1)...
        let c = index.speculate(&[2, 3, 4], &params(24), None);
        assert_eq!((c.match_len, c.tokens.clone()), (3, vec![5, 6, 7]));
        // ...twice as many with factor 2, and never deeper than max_depth − match.
        let c = index.speculate(&[2, 3, 4], &SuffixParams { max_spec_factor: 2.0, ..params(24) }, None);
        assert_eq!(c.tokens, vec![5, 6, 7, 8, 9, 10]);
        // Depth 6: matching 4 leaves 2 tokens, 3 leaves 3, 2 leaves 4: the two-token match's draft wins.
        let c = index.speculate(&[1, 2, 3, 4], &SuffixParams { max_spec_factor: 4.0, ..params(6) }, None);
        assert_eq!((c.match_len, c.tokens.clone()), (2, vec![5, 6, 7, 8]), "{c:?}");
        // A continuation seen once in ten is below a 0.1 bound: not drafted.
        let mut index = SuffixIndex::default();
        let mut seq = Vec::new();
        for i in 0..10 {
            seq.extend([1, if i == 0 { 5 } else { 6 }]);
        }
        index.extend(0, &seq);
        let c = index.speculate(&[1], &SuffixParams { min_token_prob: 0.11, ..params(8) }, None);
        assert_eq!(c.tokens, vec![6]);
    }

    #[test]
    fn the_skipped_occurrence_is_not_counted_and_removal_forgets() {
        let mut index = SuffixIndex::default();
        index.extend(0, &[1, 2, 3, 1, 2]);
        assert_eq!(index.speculate(&[1, 2], &params(8), Some((0, 4))).tokens, vec![3, 1]);
        // The context's own tail, counted, would halve the probabilities: one occurrence of two goes on.
        let c = index.speculate(&[1, 2], &params(8), None);
        assert!((c.probs[0] - 0.5).abs() < 1e-6, "{c:?}");
        index.extend(1, &[1, 2, 4]);
        assert_eq!(index.remove(0), 5);
        assert_eq!(index.tokens(), 3);
        assert_eq!(index.speculate(&[1, 2], &params(8), None).tokens, vec![4]);
        assert_eq!(index.remove(1), 3);
        assert!(index.at.is_empty() && index.speculate(&[1, 2], &params(8), None).tokens.is_empty());
    }

    #[test]
    fn the_cache_keeps_its_bound_and_evicts_the_least_recently_used() {
        let cache = SuffixCache::new(10);
        cache.insert("", &[1, 2, 3, 4]);
        cache.insert("", &[5, 6, 7, 8]);
        // Drafting from the first output uses it: the second is now the least recently used.
        assert_eq!(cache.speculate("", &[1, 2], &params(8)).tokens, vec![3, 4]);
        cache.insert("", &[9, 10, 11]);
        assert_eq!((cache.tokens(), cache.outputs()), (7, 2));
        assert!(cache.speculate("", &[5, 6], &params(8)).tokens.is_empty());
        assert_eq!(cache.speculate("", &[1, 2], &params(8)).tokens, vec![3, 4]);
        // An output longer than the bound keeps its last tokens.
        cache.insert("", &(100..120).collect::<Vec<u32>>());
        assert_eq!((cache.tokens(), cache.outputs()), (10, 1));
        assert_eq!(cache.speculate("", &[110, 111], &params(8)).tokens, vec![112, 113]);
        let nothing = SuffixCache::new(0);
        nothing.insert("", &[1, 2, 3]);
        assert_eq!(nothing.tokens(), 0);
    }

    #[test]
    fn owners_do_not_see_each_others_outputs() {
        let cache = SuffixCache::new(100);
        cache.insert("key-a", &[1, 2, 3, 4]);
        assert_eq!(cache.speculate("key-a", &[1, 2], &params(8)).tokens, vec![3, 4]);
        assert!(cache.speculate("key-b", &[1, 2], &params(8)).tokens.is_empty());
        assert!(cache.speculate("", &[1, 2], &params(8)).tokens.is_empty());
    }
}
