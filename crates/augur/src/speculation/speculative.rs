//! The one speculative loop, shared by every drafter: propose → verify in one target forward → accept →
//! roll back → adapt. The loop never knows which drafter it drives.

use std::sync::Arc;
use std::time::Instant;

use super::cost_model::{CostModel, DraftCap};
use super::drafter::{Draft, Drafter};
use super::verify::{self, Block, Exact, TreeBlock, TreeVerdict, Verdict, Verifier};
use crate::error::{Error, Result};
use crate::generation::config::GenerationConfig;
use crate::generation::decode::{logits_rows, TARGET};
use crate::generation::logits::LogitsProcessor;
use crate::generation::output::{Emitter, GenerationStats};
use crate::generation::sampler::Sampler;
use crate::models::{CausalLm, ForwardOptions, LogitRows};
use crate::nn::TreeMask;

/// Generates with `drafter` proposing and `target` verifying until the emitter finishes. The target's cache
/// holds a prefix of the prompt (none, or one kept from an earlier call, unless the drafter
/// [reads the target's prefill](crate::speculation::drafter::TargetReads::prefill)).
pub fn generate(
    target: &mut dyn CausalLm,
    drafter: &mut dyn Drafter,
    cfg: &GenerationConfig,
    emitter: &mut Emitter<'_, '_>,
    stats: &mut GenerationStats,
) -> Result<()> {
    generate_with(target, drafter, cfg, emitter, stats, &Exact)
}

/// [`generate`] with another [`Verifier`] (tests swap in broken ones).
pub fn generate_with(
    target: &mut dyn CausalLm,
    drafter: &mut dyn Drafter,
    cfg: &GenerationConfig,
    emitter: &mut Emitter<'_, '_>,
    stats: &mut GenerationStats,
    verifier: &dyn Verifier,
) -> Result<()> {
    let start = Instant::now();
    if cfg.tree_shape().is_some() && !target.supports_tree() {
        return Err(Error::InvalidOption(format!(
            "`speculative_eagle_topk` above 1: {} models do not verify trees",
            target.config().architecture.name()
        )));
    }
    let processor = LogitsProcessor::new(cfg, emitter.tokens().len())?;
    let mut sampler = Sampler::for_config(cfg);
    // Drafters that read the target's hidden states (MTP) must draft every round to keep up with them; they
    // cost one block and a head, so they are left uncapped.
    let mut cost = if cfg.cost_aware() && !drafter.reads_target().hidden_states && !drafter.plans_rounds() {
        Some(drafter.step_seconds()?.map_or_else(CostModel::new, CostModel::with_drafter_prefill))
    } else {
        None
    };
    stats.method = drafter.method().into();
    let context = target.config().max_position_embeddings;
    while !emitter.is_finished() {
        // The target adds one token of its own, so at most `remaining − 1` drafts can be kept; and every draft
        // (every node of a tree) takes a place in the target's cache, and in the drafter's own.
        let len = emitter.tokens().len();
        let room = context.saturating_sub(len);
        let drafter_room = drafter.context_room(len);
        if drafter_room == Some(0) && stats.context_fallback_at.is_none() {
            stats.context_fallback_at = Some(len);
        }
        let room = room.min(drafter_room.unwrap_or(usize::MAX));
        let mut max_drafts = emitter.remaining().saturating_sub(1).min(room);
        let cap = cost.as_mut().map_or(DraftCap::Unlimited, |c| c.next_cap(emitter.remaining()));
        let plain_step = cap == DraftCap::AtMost(0) || stats.context_fallback_at.is_some();
        if let DraftCap::AtMost(g) = cap {
            max_drafts = max_drafts.min(g);
        }
        let t0 = Instant::now();
        let draft = if plain_step {
            Draft::default()
        } else {
            drafter.set_cost_cap(match cap {
                DraftCap::AtMost(g) => Some(g),
                DraftCap::Unlimited => None,
            });
            drafter.propose(target, emitter.tokens(), max_drafts)?
        };
        let draft_seconds = t0.elapsed().as_secs_f64();
        stats.draft_seconds += draft_seconds;
        let draft = match (&draft.parents, cap) {
            // A node is a verification row: the cost model's cap on a chain's rows caps the tree's (its first
            // nodes, which come first in the drafter's order of preference).
            (Some(_), DraftCap::AtMost(g)) => draft.within_depth(max_drafts).first_nodes(g.min(room)),
            (Some(_), DraftCap::Unlimited) => draft.within_depth(max_drafts).first_nodes(room),
            (None, _) => draft,
        };
        if draft.parents.is_some() && !draft.tokens.is_empty() && target.supports_tree() {
            let (depth, accepted, verify_seconds) =
                tree_round(target, &draft, &processor, emitter, stats, verifier, &mut sampler, start)?;
            if let Some(c) = cost.as_mut() {
                c.record(draft.tokens.len(), accepted, draft_seconds, verify_seconds);
            }
            drafter.observe(emitter.tokens(), depth, accepted)?;
            continue;
        }
        let draft = draft.first_chain();
        let gamma = draft.tokens.len().min(max_drafts);
        let drafts = &draft.tokens[..gamma];

        // Everything the target has not cached yet: the last accepted token (the whole prompt in the first
        // round) followed by the drafts.
        let t1 = Instant::now();
        let cached = target.cache_len();
        let mut feed = emitter.tokens()[cached..].to_vec();
        feed.extend_from_slice(drafts);
        let opts = ForwardOptions {
            hidden_states: drafter.reads_target().hidden_states,
            ..ForwardOptions::logits(LogitRows::Last(gamma + 1))
        };
        let out = target.forward(&feed, &opts)?;
        stats.target_forwards += 1;
        if stats.target_forwards == 1 {
            stats.prefill_seconds = start.elapsed().as_secs_f64();
        }
        let mut rows = logits_rows(&out, TARGET, cached + feed.len() - (gamma + 1))?;

        let raw = emitter.wants_logprobs().then(|| rows.clone());
        verifier.process(&processor, emitter.tokens(), drafts, &mut rows);
        let block = Block {
            drafts,
            rows: &rows,
            q: draft.q.as_ref(),
            ensemble_weight: cfg.assistant_ensemble_weight,
            do_sample: processor.do_sample(),
        };
        let Verdict { accepted, next } =
            if sampler.is_by_position() && block.do_sample && cfg.assistant_ensemble_weight.is_none() {
                verify::matching_draws(&block, len, &mut sampler)
            } else {
                verifier.verdict(&block, &mut sampler)
            };
        let verify_seconds = t1.elapsed().as_secs_f64();
        stats.verify_seconds += verify_seconds;
        if let Some(c) = cost.as_mut() {
            c.record(gamma, accepted, draft_seconds, verify_seconds);
        }

        let mut block = drafts[..accepted].to_vec();
        block.push(next);
        let kept = emitter.accept_scored(&block, raw.as_ref())?;
        stats.drafted += gamma;
        // A draft cut by EOS, the budget or a stop string was not used, whatever the verdict.
        let n = kept - 1;
        stats.accepted += n;
        stats.rounds.push((gamma, n));
        // The cache keeps the accepted drafts; the new last token is fed next round.
        target.truncate(len + accepted);
        if let Some(hidden) = &out.hidden {
            drafter.target_hidden(hidden, feed.len() - gamma + accepted)?;
        }
        drafter.observe(emitter.tokens(), gamma, accepted)?;
    }
    stats.new_tokens = emitter.generated().len();
    drafter.report(stats);
    Ok(())
}

/// One round over a tree draft (see [`crate::speculation::verify::TreeBlock`]): every node verified in one
/// forward with a tree mask, the accepted path kept in the cache. Returns the tree's depth, the accepted drafts
/// and the verification seconds.
#[allow(clippy::too_many_arguments)]
fn tree_round(
    target: &mut dyn CausalLm,
    draft: &Draft,
    processor: &LogitsProcessor,
    emitter: &mut Emitter<'_, '_>,
    stats: &mut GenerationStats,
    verifier: &dyn Verifier,
    sampler: &mut Sampler,
    start: Instant,
) -> Result<(usize, usize, f64)> {
    let t1 = Instant::now();
    let (drafts, parents) = (&draft.tokens[..], draft.parents.as_deref().unwrap_or_default());
    let n = drafts.len();
    let depth = draft.depths().into_iter().max().unwrap_or(0);
    // The tokens not cached yet (a chain ending at the root, the context's last token), then the nodes. A long
    // chain (the prompt, in the first round) goes through the causal path first: under a tree mask its
    // attention costs far more (a 709-token prefill of the 1.5B took about a quarter longer).
    let len = emitter.tokens().len();
    if len - target.cache_len() > 1 {
        let chain = &emitter.tokens()[target.cache_len()..len - 1];
        target.forward(chain, &ForwardOptions::logits(LogitRows::None))?;
    }
    let cached = target.cache_len();
    let m = len - cached;
    let mut feed = emitter.tokens()[cached..].to_vec();
    feed.extend_from_slice(drafts);
    let rows: Vec<Option<usize>> =
        (0..m).map(|r| r.checked_sub(1)).chain(parents.iter().map(|&p| Some(m - 1 + p))).collect();
    let opts = ForwardOptions {
        tree: Some(Arc::new(TreeMask::new(&rows)?)),
        ..ForwardOptions::logits(LogitRows::Last(n + 1))
    };
    let out = target.forward(&feed, &opts)?;
    stats.target_forwards += 1;
    if stats.target_forwards == 1 {
        stats.prefill_seconds = start.elapsed().as_secs_f64();
    }
    let mut logits = logits_rows(&out, TARGET, len - 1)?;
    let raw = emitter.wants_logprobs().then(|| logits.clone());
    verifier.process_tree(processor, emitter.tokens(), drafts, parents, &mut logits);
    let block = TreeBlock { drafts, parents, rows: &logits, q: draft.q.as_ref(), do_sample: processor.do_sample() };
    let TreeVerdict { path, next } = if sampler.is_by_position() && block.do_sample {
        verify::matching_tree_draws(&block, len, sampler)
    } else {
        verifier.tree_verdict(&block, sampler)
    };
    let verify_seconds = t1.elapsed().as_secs_f64();
    stats.verify_seconds += verify_seconds;
    let mut tokens: Vec<u32> = path.iter().map(|&i| drafts[i]).collect();
    tokens.push(next);
    // Each emitted token's row: the root's for the first, then the row of the node it follows.
    let scored = raw.map(|raw| raw.select(std::iter::once(0).chain(path.iter().map(|&i| i + 1))));
    let kept = emitter.accept_scored(&tokens, scored.as_ref())?;
    stats.drafted += n;
    stats.accepted += kept - 1;
    stats.rounds.push((n, kept - 1));
    if depth < n {
        stats.tree_rounds += 1;
    }
    target.keep_path(len, &path)?;
    Ok((depth, path.len(), verify_seconds))
}
