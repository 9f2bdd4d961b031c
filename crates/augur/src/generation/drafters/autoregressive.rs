//! Token-by-token drafting with a model's own logits, shared by the drafters that run a model (the assistant
//! model, early exit): the target's processors, a sampler of its own, the draft length with its schedules and
//! confidence threshold, and the stop at EOS.

use super::Draft;
use crate::error::Result;
use crate::generation::config::GenerationConfig;
use crate::generation::decode::logits_rows;
use crate::generation::draft_length::DraftLength;
use crate::generation::logits::LogitsProcessor;
use crate::generation::sampler::{argmax, softmax, Sampler};
use crate::models::{CausalLm, ForwardOptions};

pub(super) struct Autoregressive {
    /// The target's processors, applied once (Transformers applies the warpers twice inside the assistant).
    processor: LogitsProcessor,
    sampler: Sampler,
    pub length: DraftLength,
    eos: Vec<u32>,
    /// Whether drafts carry their distributions: for speculative sampling, and for ensemble verification.
    keep_q: bool,
    /// The drafting model's name in errors.
    name: &'static str,
}

impl Autoregressive {
    /// `cfg` is the call's resolved configuration (sampling options, seed, assistant knobs); `prompt_len` is for
    /// the minimum-length processor; `adaptive` is the confidence threshold's ROC update when `cfg` leaves it
    /// unset; `name` names the drafting model in errors.
    pub fn new(cfg: &GenerationConfig, prompt_len: usize, adaptive: bool, name: &'static str) -> Result<Self> {
        Ok(Self {
            processor: LogitsProcessor::new(cfg, prompt_len)?,
            // A stream of its own, so that drafting does not shift the verifier's random numbers.
            sampler: Sampler::for_drafter(cfg.seed),
            length: DraftLength::new(
                cfg.effective_num_assistant_tokens(),
                cfg.assistant_tokens_schedule(),
                cfg.effective_assistant_confidence_threshold(),
                cfg.assistant_confidence_adaptive.unwrap_or(adaptive),
            ),
            eos: cfg.eos_token_id.clone(),
            keep_q: cfg.do_sample || cfg.assistant_ensemble_weight.is_some(),
            name,
        })
    }

    /// How many tokens this round drafts when the loop allows `max`.
    pub fn cap(&self, max: usize) -> usize {
        max.min(self.length.num_assistant_tokens)
    }

    /// Drafts up to [`Self::cap`]`(max)` tokens continuing `context`: `model` runs with `opts` on `feed` (the
    /// tokens it has not cached yet), then on each draft. Logits are laid out over `vocab` rows (the target's):
    /// rows past the shared vocabulary are padding on one side or the other and are never drafted.
    pub fn draft(
        &mut self,
        model: &mut dyn CausalLm,
        opts: &ForwardOptions,
        context: &[u32],
        mut feed: Vec<u32>,
        max: usize,
        vocab: usize,
    ) -> Result<Draft> {
        let max = self.cap(max);
        if max == 0 {
            return Ok(Draft::default());
        }
        let do_sample = self.processor.do_sample();
        let mut ctx = context.to_vec();
        let mut tokens = Vec::with_capacity(max);
        let mut qs = Vec::new();
        let mut confidences = Vec::with_capacity(max);
        for _ in 0..max {
            let out = model.forward(&feed, opts)?;
            let mut logits = logits_rows(&out, self.name, ctx.len() - 1)?.pop().unwrap_or_default();
            logits.resize(vocab, f32::NEG_INFINITY);
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
}
