//! Plain autoregressive decoding (Transformers' `_sample`): one target forward per new token.

use std::time::Instant;

use super::config::GenerationConfig;
use super::logits::LogitsProcessor;
use super::output::{Emitter, GenerationStats};
use super::sampler::{argmax, Sampler};
use crate::error::Result;
use crate::model::{CausalLm, ForwardOptions, LogitRows};

/// The logits of the last `rows` positions of a forward, one `Vec` per position.
pub(crate) fn logits_rows(out: &crate::model::ForwardOutput) -> Result<Vec<Vec<f32>>> {
    match &out.logits {
        Some(l) => Ok(l.to_vec2::<f32>()?),
        None => Ok(Vec::new()),
    }
}

/// Picks the next token from raw `logits` with the processors applied for `context`.
pub(crate) fn next_token(
    processor: &LogitsProcessor,
    sampler: &mut Sampler,
    context: &[u32],
    mut logits: Vec<f32>,
) -> u32 {
    if !processor.is_noop(context.len()) {
        processor.process(context, &mut logits);
    }
    if processor.do_sample() {
        sampler.sample_logits(&logits)
    } else {
        argmax(&logits)
    }
}

/// Decodes until the emitter finishes. The model's cache must be empty.
pub fn generate(
    model: &mut dyn CausalLm,
    cfg: &GenerationConfig,
    emitter: &mut Emitter<'_, '_>,
    stats: &mut GenerationStats,
) -> Result<()> {
    let start = Instant::now();
    let processor = LogitsProcessor::new(cfg, emitter.tokens().len())?;
    let mut sampler = Sampler::new(cfg.seed);
    let mut pending = emitter.tokens().to_vec();
    stats.method = "plain".into();
    while !emitter.is_finished() {
        let out = model.forward(&pending, &ForwardOptions::logits(LogitRows::Last(1)))?;
        stats.target_forwards += 1;
        if stats.target_forwards == 1 {
            stats.prefill_seconds = start.elapsed().as_secs_f64();
        }
        let logits = logits_rows(&out)?.pop().unwrap_or_default();
        let next = next_token(&processor, &mut sampler, emitter.tokens(), logits);
        emitter.accept(&[next])?;
        pending = vec![next];
    }
    stats.new_tokens = emitter.generated().len();
    stats.verify_seconds = start.elapsed().as_secs_f64();
    Ok(())
}
