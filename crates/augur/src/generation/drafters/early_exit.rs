//! Self-speculation by early exit (LayerSkip; Transformers' `EarlyExitCandidateGenerator`): the target's first
//! `L` layers, its final norm and its LM head draft autoregressively, and the full model verifies.
//!
//! There is one model and one cache. Drafting appends the drafted positions to the first `L` layers' caches only
//! (see `ForwardOptions::exit_layer`); the verification forward then reuses those entries, and the hidden states
//! that left layer `L`, for every position whose token it is fed again, so the first `L` layers never recompute
//! a drafted position. The context's early-layer entries need no drafting pass at all: the verifier already
//! wrote them. Transformers instead keeps a separate `L`-layer cache for the drafts and recomputes everything.

use super::{Draft, Drafter};
use crate::error::{Error, Result};
use crate::generation::config::GenerationConfig;
use crate::generation::decode::logits_rows;
use crate::generation::draft_length::DraftLength;
use crate::generation::logits::LogitsProcessor;
use crate::generation::sampler::{argmax, softmax, Sampler};
use crate::model::{CausalLm, ForwardOptions, LogitRows};

pub struct EarlyExit {
    exit_layer: usize,
    /// The target's processors, applied once to the early logits.
    processor: LogitsProcessor,
    sampler: Sampler,
    length: DraftLength,
    eos: Vec<u32>,
    /// Whether drafts carry their distributions: for speculative sampling, and for ensemble verification.
    keep_q: bool,
}

impl EarlyExit {
    /// `exit_layer` must leave at least one layer to the verifier: `1 ≤ exit_layer < num_layers`. The draft-length
    /// knobs come from `cfg`, the call's configuration (for early exit Transformers reads them from the main
    /// model's generation config); the confidence threshold does not adapt, as in Transformers.
    pub fn new(exit_layer: usize, num_layers: usize, cfg: &GenerationConfig, prompt_len: usize) -> Result<Self> {
        if exit_layer == 0 || exit_layer >= num_layers {
            return Err(Error::InvalidOption(format!(
                "`assistant_early_exit` must be between 1 and {} (the model has {num_layers} layers), but is \
                 {exit_layer}",
                num_layers.saturating_sub(1)
            )));
        }
        Ok(Self {
            exit_layer,
            processor: LogitsProcessor::new(cfg, prompt_len)?,
            // A stream of its own, so that drafting does not shift the verifier's random numbers.
            sampler: Sampler::new(cfg.seed.map(|s| s.wrapping_add(0x9E37_79B9_7F4A_7C15))),
            length: DraftLength::new(
                cfg.effective_num_assistant_tokens(),
                cfg.assistant_tokens_schedule(),
                cfg.effective_assistant_confidence_threshold(),
                cfg.assistant_confidence_adaptive.unwrap_or(false),
            ),
            eos: cfg.eos_token_id.clone(),
            keep_q: cfg.do_sample || cfg.assistant_ensemble_weight.is_some(),
        })
    }

    pub fn num_assistant_tokens(&self) -> usize {
        self.length.num_assistant_tokens
    }
}

impl Drafter for EarlyExit {
    fn method(&self) -> &'static str {
        "early_exit"
    }

    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        let max = max.min(self.length.num_assistant_tokens);
        if max == 0 {
            return Ok(Draft::default());
        }
        // Drop anything an earlier draft left past the verified cache; the context is drafted from there.
        let cached = target.cache_len();
        target.truncate(cached);
        let opts = ForwardOptions { exit_layer: Some(self.exit_layer), ..ForwardOptions::logits(LogitRows::Last(1)) };
        let do_sample = self.processor.do_sample();
        let mut ctx = context.to_vec();
        let mut feed = context[cached..].to_vec();
        let mut tokens = Vec::with_capacity(max);
        let mut qs = Vec::new();
        let mut confidences = Vec::with_capacity(max);
        for _ in 0..max {
            let out = target.forward(&feed, &opts)?;
            let mut logits = logits_rows(&out)?.pop().unwrap_or_default();
            if !self.processor.is_noop(ctx.len()) {
                self.processor.process(&ctx, &mut logits);
            }
            let q = softmax(&logits);
            let token = if do_sample { self.sampler.sample(&q) } else { argmax(&logits) };
            let confidence = q[token as usize];
            tokens.push(token);
            confidences.push(confidence);
            if self.keep_q {
                qs.push(q);
            }
            ctx.push(token);
            feed = vec![token];
            // Transformers' ConfidenceCriteria: the low-confidence token is kept, then drafting stops.
            let threshold = self.length.confidence_threshold;
            if self.eos.contains(&token) || (threshold > 0.0 && confidence < threshold) {
                break;
            }
        }
        self.length.record_probs(&confidences);
        Ok(Draft { tokens, q: self.keep_q.then_some(qs) })
    }

    fn observe(&mut self, _: &[u32], proposed: usize, accepted: usize) -> Result<()> {
        // The verification forward already consumed or discarded the drafted positions.
        self.length.update(proposed, accepted);
        Ok(())
    }
}
