//! Plain autoregressive decoding (Transformers' `_sample`): one target forward per new token.

use std::time::Instant;

use super::config::GenerationConfig;
use super::logits::LogitsProcessor;
use super::output::{Emitter, GenerationStats};
use super::sampler::{argmax, Sampler};
use crate::error::{Error, Result};
use crate::kernels::logits::Logits;
use crate::models::{CausalLm, ForwardOptions, LogitRows};

/// Names of the models in [`Error::NonFiniteLogits`]; the pipeline adds their files.
pub const TARGET: &str = "the target model";
pub const ASSISTANT: &str = "the assistant model";

/// The logit rows of a forward, one per position asked for: `first_position` is the sequence position of the
/// first row, `model` names the model, both for the error a NaN or infinite logit gives.
pub(crate) fn logits_rows(out: &crate::models::ForwardOutput, model: &str, first_position: usize) -> Result<Logits> {
    let rows = match &out.logits {
        Some(l) => Logits::from_tensor(l)?,
        None => Logits::default(),
    };
    for (i, row) in rows.iter().enumerate() {
        check_finite(row, model, first_position + i)?;
    }
    Ok(rows)
}

/// A NaN or infinite logit is an error: left in, NaN wins every argmax and empties every distribution, so the
/// output would be garbage passed off as text.
pub(crate) fn check_finite(row: &[f32], model: &str, position: usize) -> Result<()> {
    // `0·x` is 0 for a finite `x` and NaN otherwise: one pass in eight lanes so it vectorizes; the search for
    // the culprit only runs on a bad row.
    let mut lanes = [0.0f32; 8];
    let chunks = row.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            *l += x * 0.0;
        }
    }
    if lanes.iter().chain(rest).all(|&x| x * 0.0 == 0.0) {
        return Ok(());
    }
    match row.iter().position(|x| !x.is_finite()) {
        Some(token) => Err(Error::NonFiniteLogits { model: model.into(), position, token, value: row[token] }),
        None => Ok(()),
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

/// Decodes until the emitter finishes. The model's cache holds a prefix of the prompt (none, or one kept
/// from an earlier call).
pub fn generate(
    model: &mut dyn CausalLm,
    cfg: &GenerationConfig,
    emitter: &mut Emitter<'_, '_>,
    stats: &mut GenerationStats,
) -> Result<()> {
    let start = Instant::now();
    let processor = LogitsProcessor::new(cfg, emitter.tokens().len())?;
    let mut sampler = Sampler::for_config(cfg);
    let mut pending = emitter.tokens()[model.cache_len()..].to_vec();
    stats.method = "plain".into();
    while !emitter.is_finished() {
        let out = model.forward(&pending, &ForwardOptions::logits(LogitRows::Last(1)))?;
        stats.target_forwards += 1;
        if stats.target_forwards == 1 {
            stats.prefill_seconds = start.elapsed().as_secs_f64();
        }
        let mut rows = logits_rows(&out, TARGET, model.cache_len() - 1)?;
        let raw = emitter.wants_logprobs().then(|| rows.clone());
        sampler.at(emitter.tokens().len());
        let next = next_token(&processor, &mut sampler, emitter.tokens(), rows.pop().unwrap_or_default());
        emitter.accept_scored(&[next], raw.as_ref())?;
        pending = vec![next];
    }
    stats.new_tokens = emitter.generated().len();
    stats.verify_seconds = start.elapsed().as_secs_f64();
    Ok(())
}
