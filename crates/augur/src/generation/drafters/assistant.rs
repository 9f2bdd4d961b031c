//! A smaller model with the same tokenizer drafts autoregressively (Transformers' `AssistedCandidateGenerator`),
//! keeping its own KV cache across rounds and cutting it back to what the target accepted.

use super::{Draft, Drafter};
use crate::error::Result;
use crate::generation::config::GenerationConfig;
use crate::generation::decode::logits_rows;
use crate::generation::draft_length::DraftLength;
use crate::generation::logits::LogitsProcessor;
use crate::generation::sampler::{argmax, softmax, Sampler};
use crate::model::{CausalLm, ForwardOptions, LogitRows};

pub struct AssistantModel<'m> {
    model: &'m mut dyn CausalLm,
    /// The target's processors, applied once (Transformers applies the warpers twice inside the assistant).
    processor: LogitsProcessor,
    sampler: Sampler,
    length: DraftLength,
    eos: Vec<u32>,
    /// Target vocabulary size (rows of its logits); the draft distributions are laid out over it.
    target_vocab: usize,
    /// Whether drafts carry their distributions: for speculative sampling, and for ensemble verification.
    keep_q: bool,
}

impl<'m> AssistantModel<'m> {
    /// `cfg` is the call's resolved configuration (sampling options, seed, assistant knobs); `prompt_len` is for
    /// the minimum-length processor.
    pub fn new(
        model: &'m mut dyn CausalLm,
        cfg: &GenerationConfig,
        prompt_len: usize,
        target_vocab: usize,
    ) -> Result<Self> {
        model.truncate(0);
        Ok(Self {
            model,
            processor: LogitsProcessor::new(cfg, prompt_len)?,
            // A stream of its own, so that drafting does not shift the verifier's random numbers.
            sampler: Sampler::new(cfg.seed.map(|s| s.wrapping_add(0x9E37_79B9_7F4A_7C15))),
            length: DraftLength::new(
                cfg.effective_num_assistant_tokens(),
                cfg.assistant_tokens_schedule(),
                cfg.effective_assistant_confidence_threshold(),
                cfg.assistant_confidence_adaptive.unwrap_or(true),
            ),
            eos: cfg.eos_token_id.clone(),
            target_vocab,
            keep_q: cfg.do_sample || cfg.assistant_ensemble_weight.is_some(),
        })
    }

    pub fn num_assistant_tokens(&self) -> usize {
        self.length.num_assistant_tokens
    }
}

impl Drafter for AssistantModel<'_> {
    fn method(&self) -> &'static str {
        "assistant_model"
    }

    fn propose(&mut self, _: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        let max = max.min(self.length.num_assistant_tokens);
        if max == 0 {
            return Ok(Draft::default());
        }
        let do_sample = self.processor.do_sample();
        let mut ctx = context.to_vec();
        let mut feed = context[self.model.cache_len()..].to_vec();
        let mut tokens = Vec::with_capacity(max);
        let mut qs = Vec::new();
        let mut confidences = Vec::with_capacity(max);
        for _ in 0..max {
            let out = self.model.forward(&feed, &ForwardOptions::logits(LogitRows::Last(1)))?;
            let mut logits = logits_rows(&out)?.pop().unwrap_or_default();
            // Rows past the shared vocabulary are padding on one side or the other: never drafted.
            logits.resize(self.target_vocab, f32::NEG_INFINITY);
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

    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> Result<()> {
        // Every cached position before the newest token holds a token the target accepted.
        let keep = context.len().saturating_sub(1);
        if self.model.cache_len() > keep {
            self.model.truncate(keep);
        }
        self.length.update(proposed, accepted);
        Ok(())
    }
}
