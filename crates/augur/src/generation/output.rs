//! Where generated tokens go: the [`Emitter`] appends accepted tokens one at a time, so EOS, the length budget
//! and stop strings cut a speculative block at the exact token where plain decoding would have stopped; it
//! streams text as it lands and keeps the statistics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::Serialize;

use super::sampler::log_sum_exp;
use super::stopping::{FinishReason, StopHit, StopStrings};
use crate::error::Result;
use crate::kernels::logits::Logits;
use crate::tokenizer::{SpaceCleanUp, TextStream, Tokenizer};

/// Counters and timings of one generation call.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GenerationStats {
    /// Which way tokens were proposed: `plain`, `assistant_model`, `prompt_lookup`, ….
    pub method: String,
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values an earlier call left in the cache, not prefilled again
    /// ([`crate::pipeline::CallOptions::cache_prompt`]).
    pub cached_prompt_tokens: usize,
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
    /// Speculative rounds that verified a tree of drafts (`speculative_eagle_topk` above 1) with more than one
    /// branch.
    pub tree_rounds: usize,
    /// The sequence length at which the drafter's own context (a shorter assistant's) was full: from there on
    /// the request decoded plainly.
    pub context_fallback_at: Option<usize>,
    /// Rounds that drafted, by where their drafts came from: suffix decoding's `request` (its own prompt and
    /// output) and `cache` (earlier requests' outputs), and under `auto` also `assistant`. Empty for the other
    /// methods.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub draft_sources: std::collections::BTreeMap<&'static str, usize>,
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
    /// One entry per token of `tokens`, when asked for (see [`Emitter::with_logprobs`]).
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// An emitted token's log-probability under the target's raw distribution at its position (the log-softmax
/// of the target's logits before any processor, vLLM's default `raw_logprobs`), with the most likely tokens
/// there. Speculation changes none of it: the verified rows are the rows plain decoding computes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The `top` most likely tokens and their log-probabilities, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// `token`'s entry from one row of raw logits `[vocab]`.
    pub fn from_logits(row: &[f32], token: u32, top: usize) -> Self {
        let log_z = log_sum_exp(row);
        let logprob = row.get(token as usize).map_or(f32::NEG_INFINITY, |&x| x - log_z);
        let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
        if top > 0 {
            for (i, &x) in row.iter().enumerate() {
                if best.len() == top && x <= best[top - 1].1 {
                    continue;
                }
                let at = best.partition_point(|&(_, y)| y >= x);
                best.insert(at, (i as u32, x));
                best.truncate(top);
            }
        }
        let top = best.into_iter().map(|(t, x)| (t, x - log_z)).collect();
        TokenLogprob { token, logprob, top }
    }
}

/// Where each accepted block's kept token ids go, with their log-probabilities when those are recorded (else
/// an empty slice).
pub type TokenSink<'s> = &'s mut dyn FnMut(&[u32], &[TokenLogprob]);

/// The growing sequence of one request.
pub struct Emitter<'t, 's> {
    /// Prompt followed by every accepted token.
    tokens: Vec<u32>,
    prompt_len: usize,
    max_new_tokens: usize,
    eos: Vec<u32>,
    stops: StopStrings,
    /// Decoded text before the tokenizer's space clean-up: stop strings are matched on it, so that a stop string
    /// fires at the token that completes it, not when the clean-up releases its text.
    stream: TextStream<'t>,
    /// The clean-up, applied to the text on its way out.
    clean_up: SpaceCleanUp,
    /// Whether any decoded text has gone to the clean-up (the prompt's tail counts for stop strings until then).
    sent_any: bool,
    text: String,
    sink: Option<&'s mut dyn FnMut(&str)>,
    /// Receives each accepted block's kept tokens, as Transformers' streamers receive token ids.
    token_sink: Option<TokenSink<'s>>,
    finish: Option<FinishReason>,
    cancel: Option<Arc<AtomicBool>>,
    /// `(alternatives per token, entries so far)` when log-probabilities are recorded.
    logprobs: Option<(usize, Vec<TokenLogprob>)>,
    /// Whether a stop string that ends the generation is cut from the text, with everything after it (OpenAI's
    /// and vLLM's rule; Transformers keeps it).
    exclude_stop: bool,
    /// The prompt's last bytes, where a stop string may begin (see [`Emitter::new`]).
    prompt_tail: String,
    /// New text not sent yet because a stop string may begin in it (only while `exclude_stop`).
    held: String,
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
        let mut prompt_tail = String::new();
        if !stops.is_empty() {
            // A stop string may begin in the prompt, as Transformers' `StopStringCriteria` reads the whole
            // sequence; its last tokens hold every byte a stop string could begin with.
            let longest = stops.strings().iter().map(String::len).max().unwrap_or(0);
            let tail = &prompt[prompt.len().saturating_sub(longest)..];
            prompt_tail = tokenizer.decode(tail, false).unwrap_or_default();
            stops.prime(&prompt_tail);
        }
        Emitter {
            tokens: prompt.to_vec(),
            prompt_len: prompt.len(),
            max_new_tokens,
            eos,
            stops,
            stream: tokenizer.stream(true).without_clean_up(),
            clean_up: SpaceCleanUp::new(tokenizer.clean_up_tokenization_spaces()),
            sent_any: false,
            text: String::new(),
            sink,
            token_sink: None,
            finish: (max_new_tokens == 0).then_some(FinishReason::Length),
            cancel: None,
            logprobs: None,
            exclude_stop: false,
            prompt_tail,
            held: String::new(),
        }
    }

    /// Hands each accepted block's kept tokens (EOS included), with their log-probabilities when recorded, to
    /// `sink` as they land.
    pub fn with_token_sink(mut self, sink: Option<TokenSink<'s>>) -> Self {
        self.token_sink = sink;
        self
    }

    /// Records each kept token's [`TokenLogprob`] with `top` alternatives (`None`: nothing recorded).
    pub fn with_logprobs(mut self, top: Option<usize>) -> Self {
        self.logprobs = top.map(|n| (n, Vec::new()));
        self
    }

    /// Cuts the stop string that ends the generation, and what follows it, from the text; text that may be the
    /// start of a stop string is held back from the sink until it is known not to be.
    pub fn excluding_stop_strings(mut self, exclude: bool) -> Self {
        self.exclude_stop = exclude;
        self
    }

    /// Matches stop strings on the generated text only, as OpenAI, vLLM and llama.cpp's server do (`false`, the
    /// default, is Transformers' `StopStringCriteria`, which reads the whole sequence, prompt included).
    pub fn stop_strings_on_generated_only(mut self, generated_only: bool) -> Self {
        if generated_only {
            self.stops = StopStrings::new(self.stops.strings().to_vec());
            self.prompt_tail.clear();
        }
        self
    }

    /// Whether the decoding loop must hand the raw rows of a block to [`Emitter::accept_scored`].
    pub fn wants_logprobs(&self) -> bool {
        self.logprobs.is_some()
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

    /// Sends decoded text through the space clean-up, which may hold its end back until the next text.
    fn send(&mut self, chunk: &str) {
        self.sent_any |= !chunk.is_empty();
        let out = self.clean_up.push(chunk, false);
        self.deliver(&out);
    }

    fn deliver(&mut self, chunk: &str) {
        if chunk.is_empty() {
            return;
        }
        if let Some(sink) = self.sink.as_mut() {
            sink(chunk);
        }
        self.text.push_str(chunk);
    }

    /// Sends new text, holding back (when stop strings are cut) its longest end that some stop string begins
    /// with, counting the prompt's tail while nothing has been sent.
    fn emit(&mut self, chunk: &str) {
        if !self.exclude_stop || self.stops.is_empty() {
            self.send(chunk);
            return;
        }
        self.held.push_str(chunk);
        let lead = if !self.sent_any { self.prompt_tail.as_str() } else { "" };
        let seen = format!("{lead}{}", self.held);
        let keep = self
            .stops
            .strings()
            .iter()
            .flat_map(|stop| (1..stop.len()).filter(|&k| stop.is_char_boundary(k) && seen.ends_with(&stop[..k])))
            .max()
            .unwrap_or(0)
            .min(self.held.len());
        let held = std::mem::take(&mut self.held);
        let (out, rest) = held.split_at(held.len() - keep);
        self.send(out);
        self.held = rest.to_string();
    }

    /// The text of a token that completed `hit`: with stop strings cut, the held text up to where the stop
    /// string begins is sent and the rest dropped; else the whole piece is sent, as Transformers keeps it.
    fn emit_stopped(&mut self, chunk: &str, hit: &StopHit) {
        if !self.exclude_stop {
            self.send(chunk);
            return;
        }
        let lead = if !self.sent_any { self.prompt_tail.len() } else { 0 };
        let end = lead + self.held.len() + hit.end_in_piece;
        let start = end.saturating_sub(hit.stop.len()).saturating_sub(lead);
        let mut held = std::mem::take(&mut self.held);
        held.push_str(chunk);
        held.truncate(start.min(held.len()));
        self.send(&held);
    }

    /// Appends `block` token by token and returns how many tokens were kept: all of them, or up to and
    /// including the token that ends the sequence (an EOS, the last token of the budget, or the token that
    /// completes a stop string).
    pub fn accept(&mut self, block: &[u32]) -> Result<usize> {
        self.accept_scored(block, None)
    }

    /// [`Emitter::accept`], recording the kept tokens' log-probabilities when they are asked for: `rows[i]`
    /// holds the raw target logits `[vocab]` that `block[i]` was chosen from.
    pub fn accept_scored(&mut self, block: &[u32], rows: Option<&Logits>) -> Result<usize> {
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
                match self.stops.push(&chunk) {
                    Some(hit) => {
                        self.emit_stopped(&chunk, &hit);
                        self.finish = Some(FinishReason::StopString(hit.stop));
                    }
                    None => self.emit(&chunk),
                }
            }
            if self.finish.is_none() && self.generated().len() >= self.max_new_tokens {
                self.finish = Some(FinishReason::Length);
            }
            if self.finish.is_none() && self.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
                self.finish = Some(FinishReason::Cancelled);
            }
        }
        let kept_tokens = &self.tokens[self.tokens.len() - kept..];
        let mut scored: &[TokenLogprob] = &[];
        if let (Some(rows), Some((top, out))) = (rows, self.logprobs.as_mut()) {
            out.extend(rows.iter().zip(kept_tokens).map(|(row, &t)| TokenLogprob::from_logits(row, t, *top)));
            scored = &out[out.len() - kept..];
        }
        if kept > 0 {
            if let Some(sink) = self.token_sink.as_mut() {
                sink(kept_tokens, scored);
            }
        }
        if self.finish.is_some() {
            // The stream's last text (a partial character's U+FFFD) may still complete a stop string.
            let rest = self.stream.finish()?;
            let stopped = matches!(self.finish, Some(FinishReason::StopString(_)));
            match self.stops.push(&rest).filter(|_| !stopped) {
                Some(hit) => {
                    self.emit_stopped(&rest, &hit);
                    self.finish = Some(FinishReason::StopString(hit.stop));
                }
                None if !(stopped && self.exclude_stop) => {
                    self.emit(&rest);
                    let held = std::mem::take(&mut self.held);
                    self.send(&held);
                }
                None => {}
            }
            let last = self.clean_up.push("", true);
            self.deliver(&last);
        }
        Ok(kept)
    }

    pub fn into_output(self, stats: GenerationStats) -> GenerationOutput {
        GenerationOutput {
            text: self.text,
            tokens: self.tokens[self.prompt_len..].to_vec(),
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
            stats,
            logprobs: self.logprobs.map(|(_, l)| l),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::byte_level_tokenizer;

    /// Feeds `generated` to an emitter over `prompt` one token at a time; returns (text, kept tokens, reason).
    fn run<'t>(
        tok: &'t Tokenizer,
        prompt: &str,
        generated: &str,
        max_new: usize,
        stops: &[&str],
        configure: impl FnOnce(Emitter<'t, 'static>) -> Emitter<'t, 'static>,
    ) -> (String, usize, FinishReason) {
        let prompt = tok.encode(prompt, false).unwrap();
        let ids = tok.encode(generated, false).unwrap();
        let stops = stops.iter().map(|s| s.to_string()).collect();
        let mut e = configure(Emitter::new(tok, &prompt, max_new, vec![], stops, None));
        for &t in &ids {
            if e.is_finished() {
                break;
            }
            e.accept(&[t]).unwrap();
        }
        let out = e.into_output(GenerationStats::default());
        (out.text, out.tokens.len(), out.finish_reason)
    }

    fn cleaning() -> Tokenizer {
        let mut tok = byte_level_tokenizer();
        tok.clean_up_tokenization_spaces = true;
        tok
    }

    /// The clean-up holds back text after a space; the stop string fires at the token that completes it anyway.
    #[test]
    fn stop_string_fires_at_its_token_under_the_space_clean_up() {
        let tok = cleaning();
        let (text, kept, reason) = run(&tok, "x", "ab cd ef gh ij", 64, &["cd"], |e| e.excluding_stop_strings(true));
        assert_eq!(kept, "ab cd".len(), "the stop string's last token ends the generation");
        assert_eq!((text.as_str(), reason), ("ab ", FinishReason::StopString("cd".into())));
    }

    /// A stop string completed by the budget's last token ends with `stop`, and is cut, not leaked with `length`.
    #[test]
    fn stop_string_completed_by_the_last_token_does_not_leak_with_length() {
        let tok = cleaning();
        for exclude in [true, false] {
            let (text, kept, reason) =
                run(&tok, "x", "ab cd", "ab cd".len(), &["cd"], |e| e.excluding_stop_strings(exclude));
            assert_eq!((kept, reason), ("ab cd".len(), FinishReason::StopString("cd".into())));
            assert_eq!(text, if exclude { "ab " } else { "ab cd" });
        }
    }

    /// With clean-up, what goes out is still the cleaned-up text, held back no further than the end.
    #[test]
    fn clean_up_still_applies_to_the_emitted_text() {
        let tok = cleaning();
        let (text, _, reason) = run(&tok, "x", "a , b .", "a , b .".len(), &[], |e| e);
        assert_eq!((text.as_str(), reason), ("a, b.", FinishReason::Length));
    }

    /// Transformers' rule by default (a stop string may begin in the prompt); OpenAI's with `generated_only`.
    #[test]
    fn a_stop_string_whose_start_lies_in_the_prompt() {
        let tok = byte_level_tokenizer();
        let (text, kept, _) = run(&tok, "Name: Bob\n", "\nAge: 3\n\nrest", 64, &["\n\n"], |e| e);
        assert_eq!((text.as_str(), kept), ("\n", 1), "Transformers reads the whole sequence");
        let (text, kept, reason) = run(&tok, "Name: Bob\n", "\nAge: 3\n\nrest", 64, &["\n\n"], |e| {
            e.excluding_stop_strings(true).stop_strings_on_generated_only(true)
        });
        assert_eq!((text.as_str(), kept), ("\nAge: 3", "\nAge: 3\n\n".len()));
        assert_eq!(reason, FinishReason::StopString("\n\n".into()));
    }
}
