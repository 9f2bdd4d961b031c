//! Where generated tokens go: the [`Emitter`] appends accepted tokens one at a time, so EOS, the length budget
//! and stop strings cut a speculative block at the exact token where plain decoding would have stopped; it
//! streams text as it lands and keeps the statistics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::Serialize;

use super::stopping::{FinishReason, StopStrings};
use crate::error::Result;
use crate::tokenizer::{TextStream, Tokenizer};

/// Counters and timings of one generation call.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GenerationStats {
    /// Which way tokens were proposed: `plain`, `assistant_model`, `prompt_lookup`, ….
    pub method: String,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub target_forwards: usize,
    /// The first target forward (the prompt, plus the first drafts under speculation).
    pub prefill_seconds: f64,
    pub seconds: f64,
    /// New tokens per second over the whole call.
    pub tokens_per_s: f64,
    /// New tokens after the first, per second after the prefill.
    pub decode_tokens_per_s: f64,
    pub drafted: usize,
    pub accepted: usize,
    pub acceptance_rate: f64,
    /// New tokens per target forward pass (accepted drafts plus the target's own token).
    pub mean_accepted_per_forward: f64,
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    /// Per speculative round: drafts proposed and drafts kept (Transformers' `n`, after the EOS and length
    /// cut).
    #[serde(skip)]
    pub rounds: Vec<(usize, usize)>,
}

impl GenerationStats {
    /// Fills the derived fields once the call is over.
    pub fn finish(&mut self) {
        let rate = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        self.tokens_per_s = rate(self.new_tokens as f64, self.seconds);
        self.decode_tokens_per_s = rate(self.new_tokens.saturating_sub(1) as f64, self.seconds - self.prefill_seconds);
        self.acceptance_rate = rate(self.accepted as f64, self.drafted as f64);
        self.mean_accepted_per_forward = rate(self.new_tokens as f64, self.target_forwards as f64);
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GenerationOutput {
    /// The generated text (special tokens skipped).
    pub text: String,
    /// The generated token ids, EOS included when it ended the sequence.
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    pub stats: GenerationStats,
}

/// The growing sequence of one request.
pub struct Emitter<'t, 's> {
    /// Prompt followed by every accepted token.
    tokens: Vec<u32>,
    prompt_len: usize,
    max_new_tokens: usize,
    eos: Vec<u32>,
    stops: StopStrings,
    stream: TextStream<'t>,
    text: String,
    sink: Option<&'s mut dyn FnMut(&str)>,
    finish: Option<FinishReason>,
    cancel: Option<Arc<AtomicBool>>,
}

impl<'t, 's> Emitter<'t, 's> {
    pub fn new(
        tokenizer: &'t Tokenizer,
        prompt: &[u32],
        max_new_tokens: usize,
        eos: Vec<u32>,
        stop_strings: Vec<String>,
        sink: Option<&'s mut dyn FnMut(&str)>,
    ) -> Self {
        let mut stops = StopStrings::new(stop_strings);
        if !stops.is_empty() {
            // A stop string may begin in the prompt, as Transformers' `StopStringCriteria` reads the whole
            // sequence; its last tokens hold every byte a stop string could begin with.
            let longest = stops.strings().iter().map(String::len).max().unwrap_or(0);
            let tail = &prompt[prompt.len().saturating_sub(longest)..];
            stops.prime(&tokenizer.decode(tail, false).unwrap_or_default());
        }
        Emitter {
            tokens: prompt.to_vec(),
            prompt_len: prompt.len(),
            max_new_tokens,
            eos,
            stops,
            stream: tokenizer.stream(true),
            text: String::new(),
            sink,
            finish: (max_new_tokens == 0).then_some(FinishReason::Length),
            cancel: None,
        }
    }

    /// Ends the sequence (as [`FinishReason::Cancelled`]) after the next accepted token once `flag` is set.
    pub fn with_cancel(mut self, flag: Option<Arc<AtomicBool>>) -> Self {
        self.cancel = flag;
        self
    }

    /// Prompt and accepted tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// How many more tokens the budget allows.
    pub fn remaining(&self) -> usize {
        self.max_new_tokens - self.generated().len()
    }

    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    fn emit(&mut self, chunk: String) {
        if chunk.is_empty() {
            return;
        }
        if let Some(sink) = self.sink.as_mut() {
            sink(&chunk);
        }
        self.text.push_str(&chunk);
    }

    /// Appends `block` token by token and returns how many tokens were kept: all of them, or up to and
    /// including the token that ends the sequence (an EOS, the last token of the budget, or the token that
    /// completes a stop string).
    pub fn accept(&mut self, block: &[u32]) -> Result<usize> {
        let mut kept = 0;
        for &t in block {
            if self.finish.is_some() {
                break;
            }
            self.tokens.push(t);
            kept += 1;
            if self.eos.contains(&t) {
                self.finish = Some(FinishReason::Eos);
            } else {
                let chunk = self.stream.push(t)?;
                if let Some(hit) = self.stops.push(&chunk) {
                    self.finish = Some(FinishReason::StopString(hit.stop));
                }
                self.emit(chunk);
            }
            if self.finish.is_none() && self.generated().len() >= self.max_new_tokens {
                self.finish = Some(FinishReason::Length);
            }
            if self.finish.is_none() && self.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
                self.finish = Some(FinishReason::Cancelled);
            }
        }
        if self.finish.is_some() {
            let rest = self.stream.finish()?;
            self.emit(rest);
        }
        Ok(kept)
    }

    pub fn into_output(self, stats: GenerationStats) -> GenerationOutput {
        GenerationOutput {
            text: self.text,
            tokens: self.tokens[self.prompt_len..].to_vec(),
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
            stats,
        }
    }
}
