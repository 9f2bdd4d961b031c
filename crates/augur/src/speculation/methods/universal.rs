//! Universal assisted generation (UAG, greedy): an assistant with a different tokenizer drafts in its own
//! token space; its drafts are decoded to text, re-encoded with the target's tokenizer, and both streams are
//! aligned by the longest common run of tokens within a look-behind window (Transformers'
//! `AssistedCandidateGeneratorDifferentTokenizers`, spec section 7).
//!
//! Differences from Transformers 5.24, none of which changes the greedy output (verification is exact):
//! - the assistant-side window start is clamped at 0 (Transformers' negative slice keeps only the *last*
//!   tokens of the assistant's sequence and can drop drafts);
//! - the assistant's cache keeps the longest prefix of what it holds that still equals the new assistant
//!   sequence (Transformers' `len − 2 − remove_from_pkv` often crops more, recomputing tokens that still align,
//!   but when the re-encoded target tokens replace some and add more than two it keeps the stale keys and values
//!   of replaced tokens, and drafts from a context that is not the assistant's input);
//! - the assistant attends to all of its input (Transformers infers its attention mask from the *target's* pad
//!   id whenever EOS differs from it, masking out assistant tokens that happen to have that id);
//! - the assistant drafts with its plain argmax and stops on its own EOS tokens: the target's processors and
//!   EOS ids index the target's vocabulary, so Transformers applies them to the wrong tokens.

use crate::error::Result;
use crate::generation::config::GenerationConfig;
use crate::generation::decode::{logits_rows, ASSISTANT};
use crate::generation::sampler::{argmax, softmax};
use crate::models::{CausalLm, ForwardOptions, LogitRows};
use crate::speculation::draft_length::DraftLength;
use crate::speculation::drafter::{Draft, Drafter};
use crate::tokenizer::{clean_up_tokenization, Tokenizer};

/// Text of `ids` with special tokens skipped, as Transformers' universal generators decode it: they ask for
/// `clean_up_tokenization_spaces`, which Transformers 5.24 ignores for BPE models (most tokenizers).
pub(crate) fn decode_text(tok: &Tokenizer, ids: &[u32]) -> Result<String> {
    let text = tok.decode_raw(ids, true)?;
    let bpe = tok.inner().get_model().is_bpe();
    Ok(if bpe { text } else { clean_up_tokenization(&text) })
}

/// Text of `ids` in `from`, re-encoded by `to`, as Transformers' `convert_source_tokens_to_target_tokens`
/// (encoded *with* the destination's special tokens, BOS and the like).
pub(crate) fn convert(ids: &[u32], from: &Tokenizer, to: &Tokenizer, add_special_tokens: bool) -> Result<Vec<u32>> {
    to.encode(&decode_text(from, ids)?, add_special_tokens)
}

/// Transformers' `_get_tokens_diag`: the longest run of equal tokens on a diagonal of
/// `M[i][j] = new[i] == prompt[j]` (the first in row-major order on ties). Returns `None` when no token is
/// shared, else `(discrepancy_length, new_tokens_only, discrepancy_only)`: how many tokens of `prompt` follow
/// the run, the tokens of `new` past the replacements for them, and those replacements.
pub(crate) fn tokens_diag<'a>(prompt: &[u32], new: &'a [u32]) -> Option<(usize, &'a [u32], &'a [u32])> {
    let mut best: Option<(usize, usize, usize)> = None;
    for (i, &n) in new.iter().enumerate() {
        for (j, &p) in prompt.iter().enumerate() {
            // A run starts where the previous diagonal cell does not match.
            if n != p || (i > 0 && j > 0 && new[i - 1] == prompt[j - 1]) {
                continue;
            }
            let len = new[i..].iter().zip(&prompt[j..]).take_while(|(a, b)| a == b).count();
            if best.is_none_or(|(_, _, l)| len > l) {
                best = Some((i, j, len));
            }
        }
    }
    let (i, j, len) = best?;
    let new_start = i + len;
    let disc = prompt.len() - (j + len);
    let split = (new_start + disc).min(new.len());
    Some((disc, &new[split..], &new[new_start.min(new.len())..split]))
}

/// An assistant model whose KV cache tracks the token ids it holds, so that each forward keeps the longest
/// still-valid prefix and feeds only the rest.
pub(crate) struct CachedAssistant<'m> {
    model: &'m mut dyn CausalLm,
    /// The ids whose keys and values the cache holds, in order.
    cached: Vec<u32>,
}

impl<'m> CachedAssistant<'m> {
    pub(crate) fn new(model: &'m mut dyn CausalLm) -> Self {
        model.truncate(0);
        Self { model, cached: Vec::new() }
    }

    /// The logits (`[assistant vocab]`) that follow `ids`. The cache is rolled back to the longest prefix it
    /// shares with `ids` (at most `ids.len() − 1`, so at least one token is fed).
    pub(crate) fn next_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        let keep = self.cached.iter().zip(ids).take_while(|(a, b)| a == b).count().min(ids.len().saturating_sub(1));
        if self.model.cache_len() > keep {
            self.model.truncate(keep);
        }
        self.cached.truncate(keep);
        let out = self.model.forward(&ids[keep..], &ForwardOptions::logits(LogitRows::Last(1)))?;
        self.cached.extend_from_slice(&ids[keep..]);
        Ok(logits_rows(&out, ASSISTANT, ids.len() - 1)?.pop().unwrap_or_default())
    }

    /// [`Drafter::step_seconds`] while nothing is cached yet.
    pub(crate) fn step_seconds(&mut self) -> Result<Option<f64>> {
        if !self.cached.is_empty() {
            return Ok(None);
        }
        crate::speculation::drafter::one_step_seconds(self.model, 0).map(Some)
    }
}

/// Assistant tokens drafted beyond the cost model's cap in target tokens (see `UniversalAssisted::propose`).
const ASSISTANT_TOKENS_BEYOND_CAP: usize = 2;

/// Greedy drafting with an assistant whose tokenizer differs from the target's.
pub struct UniversalAssisted<'m, 't> {
    assistant: CachedAssistant<'m>,
    target_tok: &'t Tokenizer,
    assistant_tok: &'t Tokenizer,
    length: DraftLength,
    /// The assistant's own EOS ids (empty when EOS does not end the call).
    eos: Vec<u32>,
    assistant_lookbehind: usize,
    target_lookbehind: usize,
    /// The assistant's last sequence (its input plus its drafts), in assistant ids.
    prev_assistant_ids: Option<Vec<u32>>,
    /// Target length when the assistant last drafted.
    prev_target_len: usize,
    /// The cost model's cap on this round's target drafts (see [`Drafter::set_cost_cap`]).
    cost_cap: Option<usize>,
}

impl<'m, 't> UniversalAssisted<'m, 't> {
    /// `cfg` carries the assistant knobs (`num_assistant_tokens`, schedule, confidence threshold, look-behinds);
    /// `assistant_eos` are the assistant's EOS ids, used when `cfg` has EOS ids at all.
    pub fn new(
        model: &'m mut dyn CausalLm,
        target_tok: &'t Tokenizer,
        assistant_tok: &'t Tokenizer,
        assistant_eos: &[u32],
        cfg: &GenerationConfig,
    ) -> Self {
        Self {
            assistant: CachedAssistant::new(model),
            target_tok,
            assistant_tok,
            // The ROC adaptation is off for the different-tokenizer generators, as in Transformers.
            length: DraftLength::new(
                cfg.effective_num_assistant_tokens(),
                cfg.assistant_tokens_schedule(),
                cfg.effective_assistant_confidence_threshold(),
                false,
            ),
            eos: if cfg.eos_token_id.is_empty() { Vec::new() } else { assistant_eos.to_vec() },
            assistant_lookbehind: cfg.effective_assistant_lookbehind(),
            target_lookbehind: cfg.effective_target_lookbehind(),
            prev_assistant_ids: None,
            prev_target_len: 0,
            cost_cap: None,
        }
    }

    /// Transformers' `_prepare_assistant_input_ids`: the assistant's sequence for target `context`, re-encoding
    /// only the last `target_lookbehind` old target tokens plus the new ones and splicing them in where they
    /// align.
    fn assistant_input(&mut self, context: &[u32]) -> Result<Vec<u32>> {
        let prev = match self.prev_assistant_ids.take() {
            Some(prev) if self.prev_target_len > self.target_lookbehind => prev,
            _ => return convert(context, self.target_tok, self.assistant_tok, true),
        };
        let start = self.prev_target_len - self.target_lookbehind;
        let new = convert(&context[start..], self.target_tok, self.assistant_tok, true)?;
        let prompt_use = &prev[prev.len().saturating_sub(new.len())..];
        let mut ids = prev.clone();
        match tokens_diag(prompt_use, &new) {
            Some((disc, new_only, disc_only)) => {
                if disc > 0 && !disc_only.is_empty() {
                    // The assistant tokens after the common run (rejected drafts, re-tokenized text) give way
                    // to the re-encoded target tokens.
                    ids.truncate(ids.len() - (disc - disc_only.len()));
                    let at = ids.len() - disc_only.len();
                    ids[at..].copy_from_slice(disc_only);
                }
                ids.extend_from_slice(new_only);
            }
            None => ids.extend_from_slice(&new),
        }
        Ok(ids)
    }

    /// Transformers' `_process_assistant_outputs`: the target tokens the assistant's sequence adds to `context`.
    fn target_drafts(&self, context: &[u32], input_len: usize, sequence: &[u32]) -> Result<Vec<u32>> {
        let start = input_len.saturating_sub(self.assistant_lookbehind);
        let window = convert(&sequence[start..], self.assistant_tok, self.target_tok, true)?;
        let use_ = &context[context.len().saturating_sub(window.len())..];
        Ok(match tokens_diag(use_, &window) {
            Some((_, new_only, _)) => new_only.to_vec(),
            None => window,
        })
    }
}

impl Drafter for UniversalAssisted<'_, '_> {
    fn method(&self) -> &'static str {
        "universal_assisted"
    }

    fn propose(&mut self, _: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        // Under a cost cap, assistant tokens far beyond it (20 where 3 are wanted) would be paid for and then
        // cut; a few extra are kept because one target token can span several assistant tokens.
        let max_new = match self.cost_cap {
            Some(cap) => self.length.num_assistant_tokens.min(cap + ASSISTANT_TOKENS_BEYOND_CAP),
            None => self.length.num_assistant_tokens,
        };
        if max_new == 0 || max == 0 {
            return Ok(Draft::default());
        }
        let input = self.assistant_input(context)?;
        let mut sequence = input.clone();
        let threshold = self.length.confidence_threshold;
        for _ in 0..max_new {
            let logits = self.assistant.next_logits(&sequence)?;
            let token = argmax(&logits);
            sequence.push(token);
            if self.eos.contains(&token) || (threshold > 0.0 && softmax(&logits)[token as usize] < threshold) {
                break;
            }
        }
        let mut tokens = self.target_drafts(context, input.len(), &sequence)?;
        tokens.truncate(max);
        self.prev_target_len = context.len();
        self.prev_assistant_ids = Some(sequence);
        Ok(Draft { tokens, q: None, parents: None })
    }

    fn observe(&mut self, _context: &[u32], proposed: usize, accepted: usize) -> Result<()> {
        // The assistant's sequence is re-aligned with the target's at the next proposal.
        self.length.update(proposed, accepted);
        Ok(())
    }

    fn step_seconds(&mut self) -> Result<Option<f64>> {
        self.assistant.step_seconds()
    }

    fn set_cost_cap(&mut self, cap: Option<usize>) {
        self.cost_cap = cap;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_diagonal_and_discrepancy() {
        // prompt = old assistant tail with two rejected drafts (8, 9); new = re-encoding ending in 7.
        let prompt = [1, 2, 3, 4, 8, 9];
        let new = [2, 3, 4, 7];
        let (disc, new_only, disc_only) = tokens_diag(&prompt, &new).unwrap();
        assert_eq!((disc, new_only, disc_only), (2, &[][..], &[7][..]));
        // Extra new tokens past the replaced ones.
        let (disc, new_only, disc_only) = tokens_diag(&[1, 2, 3, 9], &[2, 3, 5, 6, 7]).unwrap();
        assert_eq!((disc, new_only, disc_only), (1, &[6, 7][..], &[5][..]));
        // Ties: the first run in row-major order of `new` wins.
        let (disc, new_only, _) = tokens_diag(&[5, 6, 5, 6], &[5, 6, 1]).unwrap();
        assert_eq!((disc, new_only), (2, &[][..]));
        assert!(tokens_diag(&[1, 2], &[3, 4]).is_none());
    }
}
