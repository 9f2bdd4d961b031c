//! Suffix decoding (`suffix`, vLLM's `method: "suffix"`): no second model; each round drafts the tree of
//! continuations that followed the context's tail before, in the request's own prompt and output or in earlier
//! requests' outputs (the process-wide [`SuffixCache`], per API key), scored by how often each followed it (see
//! [`crate::speculation::suffix_cache`]). The drafts are deterministic (one-hot `q`), so the tree verifier keeps
//! greedy output and the sampled distribution exact.

use crate::error::{Error, Result};
use crate::generation::config::GenerationConfig;
use crate::generation::output::GenerationStats;
use crate::models::{CausalLm, ModelConfig};
use crate::speculation::drafter::{Draft, Drafter};
use crate::speculation::factory::DraftParts;
use crate::speculation::method::SpeculationMethod;
use crate::speculation::registry::{self, Method, MAX_SUFFIX_DEPTH};
use crate::speculation::suffix_cache::{Candidate, SuffixCacheRef, SuffixIndex, SuffixParams};

/// `suffix`: chosen by a draft-size option (`suffix_max_depth`, `suffix_max_spec_factor`,
/// `suffix_min_token_prob`), as `prompt_lookup_num_tokens` chooses prompt lookup; drafted round by round by `auto`.
pub(crate) const METHOD: Method = Method {
    name: "suffix",
    knobs: &[&registry::SUFFIX, &[&registry::COST_AWARE_DRAFTING]],
    chosen: |cfg, _| {
        cfg.suffix_max_depth.is_some() || cfg.suffix_max_spec_factor.is_some() || cfg.suffix_min_token_prob.is_some()
    },
    named: |_| Ok(()),
    resolve: |cfg, _| {
        params(cfg)?;
        Ok(SpeculationMethod::Registered("suffix".parse()?))
    },
    build,
};

/// vLLM's defaults.
const DEFAULT_MAX_DEPTH: usize = 24;
const DEFAULT_MAX_SPEC_FACTOR: f32 = 1.0;
const DEFAULT_MIN_TOKEN_PROB: f32 = 0.1;

/// The call's `suffix_*` options, checked; `max_tokens` is the depth until a round sets it.
pub(crate) fn params(cfg: &GenerationConfig) -> Result<SuffixParams> {
    let max_depth = cfg.suffix_max_depth.unwrap_or(DEFAULT_MAX_DEPTH);
    let max_spec_factor = cfg.suffix_max_spec_factor.unwrap_or(DEFAULT_MAX_SPEC_FACTOR);
    let min_token_prob = cfg.suffix_min_token_prob.unwrap_or(DEFAULT_MIN_TOKEN_PROB);
    if !(1..=MAX_SUFFIX_DEPTH).contains(&max_depth) {
        return Err(Error::InvalidOption(format!(
            "`suffix_max_depth` must be between 1 and {MAX_SUFFIX_DEPTH}, but is {max_depth}."
        )));
    }
    if !(max_spec_factor.is_finite() && max_spec_factor > 0.0) {
        return Err(Error::InvalidOption(format!(
            "`suffix_max_spec_factor` must be a positive number, but is {max_spec_factor}."
        )));
    }
    if !(0.0..=1.0).contains(&min_token_prob) {
        return Err(Error::InvalidOption(format!(
            "`suffix_min_token_prob` must be between 0 and 1, but is {min_token_prob}."
        )));
    }
    Ok(SuffixParams { max_depth, max_spec_factor, min_token_prob, max_tokens: max_depth })
}

fn build<'a>(
    _: SpeculationMethod,
    cfg: &GenerationConfig,
    prompt_len: usize,
    _: &ModelConfig,
    parts: DraftParts<'a>,
) -> Result<Box<dyn Drafter + 'a>> {
    Ok(Box::new(SuffixDrafter::new(cfg, prompt_len, parts.suffix_cache)?))
}

/// The first `n` nodes of `c` as a tree draft, without tokens outside a vocabulary of `vocab` (a cache shared
/// by models of different vocabularies holds such tokens).
pub(crate) fn draft(c: Candidate, n: usize, vocab: usize) -> Draft {
    let tokens = c.tokens.clone();
    Draft { tokens: c.tokens, q: None, parents: Some(c.parents) }
        .first_nodes(n)
        .keep(|i, _| (tokens[i] as usize) < vocab)
}

/// Where a round's draft came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftSource {
    /// The request's own prompt and output.
    Request,
    /// An earlier request's output, from the process-wide cache.
    Cache,
}

impl DraftSource {
    /// Its name in [`GenerationStats::draft_sources`].
    pub fn name(self) -> &'static str {
        match self {
            DraftSource::Request => "request",
            DraftSource::Cache => "cache",
        }
    }
}

pub struct SuffixDrafter {
    params: SuffixParams,
    /// The context as sequence 0.
    own: SuffixIndex,
    /// The process-wide cache, when the call reads and feeds it.
    cache: Option<SuffixCacheRef>,
    prompt_len: usize,
    /// Where each round that drafted took its draft from.
    sources: Vec<DraftSource>,
}

impl SuffixDrafter {
    pub fn new(cfg: &GenerationConfig, prompt_len: usize, cache: Option<SuffixCacheRef>) -> Result<Self> {
        let cache = cache.filter(|_| cfg.suffix_global_cache.unwrap_or(true));
        Ok(Self { params: params(cfg)?, own: SuffixIndex::default(), cache, prompt_len, sources: Vec::new() })
    }

    /// The best draft of at most `max` nodes continuing `context`, from the request or the cache, and its source.
    pub fn candidate(&mut self, context: &[u32], max: usize) -> (Candidate, DraftSource) {
        self.follow(context);
        let params = SuffixParams { max_tokens: self.params.max_tokens.min(max), ..self.params };
        let skip = context.len().checked_sub(1).map(|last| (0, last as u32));
        let own = self.own.speculate(context, &params, skip);
        let cached = self.cache.as_ref().map(|c| c.cache.speculate(&c.owner, context, &params)).unwrap_or_default();
        if cached.score > own.score {
            (cached, DraftSource::Cache)
        } else {
            (own, DraftSource::Request)
        }
    }

    /// Makes the request's own sequence `context`: the tokens it adds are indexed (a context that does not
    /// extend it is indexed anew).
    fn follow(&mut self, context: &[u32]) {
        let indexed = self.own.sequence(0).unwrap_or_default();
        if context.starts_with(indexed) {
            let from = indexed.len();
            self.own.extend(0, &context[from..]);
        } else {
            self.own.remove(0);
            self.own.extend(0, context);
        }
    }

    /// Records that a round drafted from `source`.
    pub fn drafted_from(&mut self, source: DraftSource) {
        self.sources.push(source);
    }
}

impl Drafter for SuffixDrafter {
    fn method(&self) -> &'static str {
        METHOD.name
    }

    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        let (c, source) = self.candidate(context, max);
        let draft = draft(c, max, target.config().vocab_size);
        if !draft.tokens.is_empty() {
            self.drafted_from(source);
        }
        Ok(draft)
    }

    fn report(&self, stats: &mut GenerationStats) {
        for s in &self.sources {
            *stats.draft_sources.entry(s.name()).or_default() += 1;
        }
    }

    fn observe(&mut self, context: &[u32], _: usize, _: usize) -> Result<()> {
        // The accepted tokens join the request's own sequence now, so that the output reaches the cache whole.
        self.follow(context);
        Ok(())
    }
}

impl Drop for SuffixDrafter {
    /// The request's output joins the process-wide cache once the request ends.
    fn drop(&mut self) {
        if let (Some(c), Some(seq)) = (&self.cache, self.own.sequence(0)) {
            if let Some(output) = seq.get(self.prompt_len..) {
                c.cache.insert(&c.owner, output);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::speculation::suffix_cache::SuffixCache;

    fn drafter(cache: &Arc<SuffixCache>, owner: &str, prompt_len: usize) -> SuffixDrafter {
        let r = SuffixCacheRef { cache: Arc::clone(cache), owner: owner.into() };
        SuffixDrafter::new(&GenerationConfig::default(), prompt_len, Some(r)).unwrap()
    }

    /// Runs a "request": the prompt, then the output fed token by token as if each round accepted one token.
    fn request(d: &mut SuffixDrafter, prompt: &[u32], output: &[u32]) -> Vec<(Vec<u32>, DraftSource)> {
        let mut context = prompt.to_vec();
        let mut drafts = Vec::new();
        for &t in output {
            let (c, source) = d.candidate(&context, 16);
            if !c.tokens.is_empty() {
                drafts.push((c.tokens, source));
            }
            context.push(t);
            d.observe(&context, 0, 0).unwrap();
        }
        drafts
    }

    #[test]
    fn a_later_request_drafts_from_an_earlier_output_of_the_same_key_only() {
        let cache = Arc::new(SuffixCache::new(1000));
        let answer: Vec<u32> = (100..130).collect();
        let mut first = drafter(&cache, "key-a", 2);
        // Nothing repeats within the first request: it drafts nothing.
        assert!(request(&mut first, &[1, 2], &answer).is_empty());
        drop(first);
        assert_eq!(cache.tokens(), answer.len());
        // Another key's request with the same answer finds nothing in the cache.
        let mut other = drafter(&cache, "key-b", 2);
        assert!(request(&mut other, &[1, 2], &answer).is_empty());
        drop(other);
        // The same key's request drafts the rest of the answer from the cache once a token of it matches.
        let mut again = drafter(&cache, "key-a", 2);
        let drafts = request(&mut again, &[1, 2], &answer);
        assert!(!drafts.is_empty() && drafts.iter().all(|(_, s)| *s == DraftSource::Cache), "{drafts:?}");
        assert_eq!(drafts[5].0[..2], answer[6..8]);
    }

    #[test]
    fn the_request_drafts_from_its_own_prompt_without_the_cache() {
        let cfg = GenerationConfig { suffix_global_cache: Some(false), ..Default::default() };
        let cache = Arc::new(SuffixCache::new(1000));
        let r = SuffixCacheRef { cache: Arc::clone(&cache), owner: String::new() };
        let mut d = SuffixDrafter::new(&cfg, 6, Some(r)).unwrap();
        let drafts = request(&mut d, &[5, 6, 7, 8, 9, 10], &[5, 6, 7, 8]);
        assert_eq!(drafts[0], (vec![6], DraftSource::Request));
        assert_eq!(drafts[2], (vec![8, 9, 10], DraftSource::Request));
        drop(d);
        // Opted out: the output is not kept either.
        assert_eq!(cache.tokens(), 0);
    }

    #[test]
    fn bad_options_are_refused_by_name() {
        for (cfg, field) in [
            (GenerationConfig { suffix_max_depth: Some(0), ..Default::default() }, "suffix_max_depth"),
            (
                GenerationConfig { suffix_max_spec_factor: Some(f32::NAN), ..Default::default() },
                "suffix_max_spec_factor",
            ),
            (GenerationConfig { suffix_min_token_prob: Some(1.5), ..Default::default() }, "suffix_min_token_prob"),
        ] {
            let e = params(&cfg).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
