//! The one speculative loop, shared by every drafter: propose → verify in one target forward → accept →
//! roll back → adapt. The loop never knows which drafter it drives.

use std::time::Instant;

use super::config::GenerationConfig;
use super::decode::logits_rows;
use super::drafters::{Drafter, TargetState};
use super::logits::LogitsProcessor;
use super::output::{Emitter, GenerationStats};
use super::sampler::Sampler;
use super::verify::{accept_prefix, speculative_sampling, Verdict};
use crate::error::Result;
use crate::model::{CausalLm, ForwardOptions, LogitRows};

/// Generates with `drafter` proposing and `target` verifying until the emitter finishes. The target's cache
/// must be empty.
pub fn generate(
    target: &mut dyn CausalLm,
    drafter: &mut dyn Drafter,
    cfg: &GenerationConfig,
    emitter: &mut Emitter<'_, '_>,
    stats: &mut GenerationStats,
) -> Result<()> {
    let start = Instant::now();
    let processor = LogitsProcessor::new(cfg, emitter.tokens().len())?;
    let mut sampler = Sampler::new(cfg.seed);
    stats.method = drafter.method().into();
    let wants_hidden = drafter.wants_hidden_states();
    // The target's final hidden states of the last forward, with the position of their first row.
    let mut hidden: Option<(candle_core::Tensor, usize)> = None;
    while !emitter.is_finished() {
        // The target adds one token of its own, so at most `remaining − 1` drafts can be kept.
        let max_drafts = emitter.remaining().saturating_sub(1);
        let t0 = Instant::now();
        let state = TargetState { model: &*target, hidden: hidden.as_ref().map(|(h, s)| (h, *s)) };
        let draft = drafter.propose_with(emitter.tokens(), max_drafts, &state)?;
        stats.draft_seconds += t0.elapsed().as_secs_f64();
        let gamma = draft.tokens.len().min(max_drafts);
        let drafts = &draft.tokens[..gamma];

        // Everything the target has not cached yet: the last accepted token (the whole prompt in the first
        // round) followed by the drafts.
        let t1 = Instant::now();
        let cached = target.cache_len();
        let mut feed = emitter.tokens()[cached..].to_vec();
        feed.extend_from_slice(drafts);
        let opts = ForwardOptions { hidden_states: wants_hidden, ..ForwardOptions::logits(LogitRows::Last(gamma + 1)) };
        let out = target.forward(&feed, &opts)?;
        stats.target_forwards += 1;
        if stats.target_forwards == 1 {
            stats.prefill_seconds = start.elapsed().as_secs_f64();
        }
        let mut rows = logits_rows(&out)?;
        if wants_hidden {
            hidden = out.hidden.map(|h| (h, cached));
        }

        // The target's processors at each position, with the drafted prefix as context (Transformers 3.2).
        let len = emitter.tokens().len();
        if !processor.is_noop(len) || !processor.is_noop(len + gamma) {
            let mut context = emitter.tokens().to_vec();
            for (i, row) in rows.iter_mut().enumerate() {
                processor.process(&context, row);
                if i < gamma {
                    context.push(drafts[i]);
                }
            }
        }
        let Verdict { accepted, next } = if processor.do_sample() {
            speculative_sampling(drafts, &rows, draft.q.as_ref().map(|q| &q[..gamma]), &mut sampler)
        } else {
            accept_prefix(drafts, &rows)
        };
        stats.verify_seconds += t1.elapsed().as_secs_f64();

        let mut block = drafts[..accepted].to_vec();
        block.push(next);
        let kept = emitter.accept(&block)?;
        stats.drafted += gamma;
        // A draft cut by EOS, the budget or a stop string was not used, whatever the verdict.
        let n = kept - 1;
        stats.accepted += n;
        stats.rounds.push((gamma, n));
        // The cache keeps the accepted drafts; the new last token is fed next round.
        target.truncate(len + accepted);
        drafter.observe(emitter.tokens(), gamma, accepted)?;
    }
    stats.new_tokens = emitter.generated().len();
    Ok(())
}
