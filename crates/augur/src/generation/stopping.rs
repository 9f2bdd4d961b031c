//! When generation ends: EOS, the length budget and stop strings, checked token by token.
//!
//! Transformers trims an accepted speculative block to the length budget and to its first EOS (spec 3.4), but checks
//! stop strings only once per round, so a stop string completed inside a block is missed. Here every kept token is
//! checked, in order — a deliberate fix (spec 17); for plain decoding (one token per step) the two agree.

use std::fmt;

use serde::{Serialize, Serializer};

use super::config::GenerationConfig;
use crate::error::Result;

/// Why generation ended. Serialises as `"eos"`, `"length"`, `"stop"` or `"cancelled"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was generated (and kept).
    Eos,
    /// The `max_new_tokens` / `max_length` budget is used up.
    Length,
    /// The generated text now ends with this stop string.
    StopString(String),
    /// The caller cancelled (a stream dropped, an HTTP client gone).
    Cancelled,
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Length => "length",
            FinishReason::StopString(_) => "stop",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for FinishReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// A stop string completed by the newest piece of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopHit {
    /// Index into the stop strings as given.
    pub index: usize,
    pub stop: String,
    /// Byte offset in the newest piece just after the stop string's last byte: `&piece[..end_in_piece]` is the text
    /// up to and including the stop string.
    pub end_in_piece: usize,
}

/// Watches decoded text for stop strings, as Transformers' `StopStringCriteria`: a stop string matches when it ends
/// inside the text of the newest token. It may begin in earlier tokens, even in the prompt (Transformers checks the
/// whole sequence), but a stop string entirely in the past never matches again.
///
/// Transformers matches on the tokens' vocabulary strings; this works on the decoded text, which is what those
/// strings stand for (they differ only for byte-level pieces of multi-byte characters).
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    strings: Vec<String>,
    /// The last bytes seen (at least the longest stop string minus one), so matches can span pieces.
    tail: String,
    keep: usize,
    /// Length of the generated text seen through [`StopStrings::check`].
    checked_len: usize,
}

impl StopStrings {
    /// Empty strings are ignored (they would match everywhere).
    pub fn new<S: Into<String>>(strings: impl IntoIterator<Item = S>) -> Self {
        let strings: Vec<String> = strings.into_iter().map(Into::into).filter(|s| !s.is_empty()).collect();
        let keep = strings.iter().map(|s| s.len()).max().unwrap_or(1) - 1;
        StopStrings { strings, tail: String::new(), keep, checked_len: 0 }
    }

    pub fn from_config(config: &GenerationConfig) -> Self {
        StopStrings::new(config.stop_strings.iter().cloned())
    }

    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }

    pub fn strings(&self) -> &[String] {
        &self.strings
    }

    /// Feeds text that cannot trigger a stop by itself but that a stop string may start in (the prompt).
    pub fn prime(&mut self, text: &str) {
        self.tail.push_str(text);
        self.trim_tail();
    }

    /// Appends the text added by the newest token; returns the stop string that now ends inside it. When several
    /// do, the one that ends first wins, then the one listed first.
    pub fn push(&mut self, piece: &str) -> Option<StopHit> {
        if self.strings.is_empty() || piece.is_empty() {
            self.prime(piece);
            return None;
        }
        let old_len = self.tail.len();
        self.tail.push_str(piece);
        let mut best: Option<(usize, usize)> = None; // (end in window, index)
        for (index, stop) in self.strings.iter().enumerate() {
            if let Some(end) = first_match_ending_after(&self.tail, stop, old_len) {
                if best.is_none_or(|(e, _)| end < e) {
                    best = Some((end, index));
                }
            }
        }
        self.trim_tail();
        best.map(|(end, index)| StopHit { index, stop: self.strings[index].clone(), end_in_piece: end - old_len })
    }

    /// Same as [`push`](Self::push), given the whole generated text so far instead of the newest piece. The text
    /// must only grow between calls; a shorter text (a detokenizer that revised its tail) is taken as the new
    /// baseline without a check.
    pub fn check(&mut self, generated_text: &str) -> Option<StopHit> {
        let start = self.checked_len;
        if generated_text.len() < start || !generated_text.is_char_boundary(start) {
            self.checked_len = generated_text.len();
            return None;
        }
        self.checked_len = generated_text.len();
        self.push(&generated_text[start..])
    }

    /// Forgets the text seen so far (a new generation).
    pub fn reset(&mut self) {
        self.tail.clear();
        self.checked_len = 0;
    }

    fn trim_tail(&mut self) {
        if self.tail.len() > self.keep {
            let mut cut = self.tail.len() - self.keep;
            while !self.tail.is_char_boundary(cut) {
                cut -= 1; // keep a little more rather than split a character
            }
            self.tail.drain(..cut);
        }
    }
}

/// End (exclusive byte offset) of the leftmost occurrence of `stop` in `text` that ends after byte `after`.
fn first_match_ending_after(text: &str, stop: &str, after: usize) -> Option<usize> {
    let mut from = (after + 1).saturating_sub(stop.len());
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    while let Some(pos) = text[from..].find(stop) {
        let start = from + pos;
        let end = start + stop.len();
        if end > after {
            return Some(end);
        }
        // Too early; resume at the next character.
        from = start + text[start..].chars().next().map_or(1, char::len_utf8);
    }
    None
}

/// How much of a block of new tokens to keep, and whether generation is finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockOutcome {
    pub keep: usize,
    /// `None`: generation goes on.
    pub finish: Option<FinishReason>,
}

/// End-of-sequence ids and the new-token budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoppingCriteria {
    eos_token_ids: Vec<u32>,
    max_new_tokens: usize,
}

impl StoppingCriteria {
    pub fn new(eos_token_ids: Vec<u32>, max_new_tokens: usize) -> Self {
        StoppingCriteria { eos_token_ids, max_new_tokens }
    }

    /// From the config's EOS ids and length options (see [`GenerationConfig::max_new_tokens_for`]).
    pub fn from_config(
        config: &GenerationConfig,
        prompt_len: usize,
        max_position_embeddings: Option<usize>,
    ) -> Result<Self> {
        Ok(StoppingCriteria::new(
            config.eos_token_id.clone(),
            config.max_new_tokens_for(prompt_len, max_position_embeddings)?,
        ))
    }

    pub fn is_eos(&self, token: u32) -> bool {
        self.eos_token_ids.contains(&token)
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn max_new_tokens(&self) -> usize {
        self.max_new_tokens
    }

    /// New tokens still allowed after `generated` of them.
    pub fn remaining(&self, generated: usize) -> usize {
        self.max_new_tokens.saturating_sub(generated)
    }

    /// For `block`, the tokens accepted after `generated` new tokens: trims to the length budget, then keeps up to
    /// and including the first EOS (Transformers' order). EOS wins over length when both apply.
    pub fn check_block(&self, generated: usize, block: &[u32]) -> BlockOutcome {
        self.check_block_with(generated, block, |_| None)
    }

    /// [`check_block`](Self::check_block), also ending at the first token for which `stop` reports a completed stop
    /// string. `stop` is called once per kept non-EOS token, in order (typically: decode the token, then
    /// [`StopStrings::push`]); it is not called for tokens after the end.
    pub fn check_block_with(
        &self,
        generated: usize,
        block: &[u32],
        mut stop: impl FnMut(u32) -> Option<String>,
    ) -> BlockOutcome {
        let allowed = block.len().min(self.remaining(generated));
        for (i, &token) in block[..allowed].iter().enumerate() {
            if self.is_eos(token) {
                return BlockOutcome { keep: i + 1, finish: Some(FinishReason::Eos) };
            }
            if let Some(s) = stop(token) {
                return BlockOutcome { keep: i + 1, finish: Some(FinishReason::StopString(s)) };
            }
        }
        let finish = (generated + allowed >= self.max_new_tokens).then_some(FinishReason::Length);
        BlockOutcome { keep: allowed, finish }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reason_serialises_lowercase() {
        let json = serde_json::to_string(&[
            FinishReason::Eos,
            FinishReason::Length,
            FinishReason::StopString("###".into()),
        ])
        .unwrap();
        assert_eq!(json, r#"["eos","length","stop"]"#);
        assert_eq!(FinishReason::StopString("x".into()).to_string(), "stop");
    }

    #[test]
    fn stop_string_must_end_in_the_newest_piece() {
        // Transformers' docstring examples for "stop".
        let hits = |pieces: &[&str]| {
            let mut s = StopStrings::new(["stop"]);
            pieces.iter().map(|p| s.push(p).is_some()).collect::<Vec<_>>()
        };
        assert_eq!(hits(&["st", "op"]), vec![false, true]);
        assert_eq!(hits(&["stop"]), vec![true]);
        assert_eq!(hits(&["st", "opera"]), vec![false, true]);
        assert_eq!(hits(&["sto", "pper"]), vec![false, true]);
        assert_eq!(hits(&["las", "topper"]), vec![false, true]);
        assert_eq!(hits(&["s", "to", "pped"]), vec![false, false, true]);
        // Once past, a stop string does not match again.
        assert_eq!(hits(&["stop", "at"]), vec![true, false]);
        assert_eq!(hits(&["st", "op", "at"]), vec![false, true, false]);
    }

    #[test]
    fn hit_reports_the_earliest_ending_stop_string_and_its_end() {
        let mut s = StopStrings::new(["world", "lo w", ""]);
        assert_eq!(s.strings().len(), 2, "the empty string is dropped");
        assert_eq!(s.push("hel"), None);
        let hit = s.push("lo world!").unwrap();
        assert_eq!(hit, StopHit { index: 1, stop: "lo w".into(), end_in_piece: 4 });
    }

    #[test]
    fn stop_string_may_start_in_the_prompt() {
        let mut s = StopStrings::new(["</s>"]);
        s.prime("some prompt </");
        assert_eq!(s.push("s>").map(|h| h.end_in_piece), Some(2));

        let mut s = StopStrings::new(["</s>"]);
        s.prime("prompt with </s> inside");
        assert_eq!(s.push(" more"), None, "a stop string in the prompt alone never triggers");
    }

    #[test]
    fn check_takes_the_growing_text() {
        let mut s = StopStrings::new(["\n\n"]);
        assert_eq!(s.check("Hello"), None);
        assert_eq!(s.check("Hello\n"), None);
        let hit = s.check("Hello\n\nBye").unwrap();
        assert_eq!(hit.end_in_piece, 1);
        s.reset();
        assert_eq!(s.check("\n"), None);
        assert!(s.check("\n\n").is_some());
    }

    #[test]
    fn multibyte_text_is_handled() {
        let mut s = StopStrings::new(["é!"]);
        assert_eq!(s.push("caf"), None);
        assert_eq!(s.push("é"), None);
        assert_eq!(s.push("!").map(|h| h.end_in_piece), Some(1));
        let mut s = StopStrings::new(["ab"]);
        s.prime("ééé");
        assert_eq!(s.push("éa"), None);
        assert!(s.push("b").is_some());
    }

    #[test]
    fn block_is_cut_after_the_first_eos() {
        let c = StoppingCriteria::new(vec![2, 9], 100);
        assert_eq!(c.check_block(0, &[5, 6, 7]), BlockOutcome { keep: 3, finish: None });
        assert_eq!(c.check_block(0, &[5, 9, 7, 2]), BlockOutcome { keep: 2, finish: Some(FinishReason::Eos) });
        assert_eq!(c.check_block(0, &[2]), BlockOutcome { keep: 1, finish: Some(FinishReason::Eos) });
    }

    #[test]
    fn block_is_trimmed_to_the_length_budget_first() {
        let c = StoppingCriteria::new(vec![2], 5);
        assert_eq!(c.check_block(3, &[5, 6, 7]), BlockOutcome { keep: 2, finish: Some(FinishReason::Length) });
        // The EOS lies beyond the budget: trimmed away, so the reason is length.
        assert_eq!(c.check_block(3, &[5, 6, 2]), BlockOutcome { keep: 2, finish: Some(FinishReason::Length) });
        // EOS as the last allowed token: EOS wins.
        assert_eq!(c.check_block(3, &[5, 2, 7]), BlockOutcome { keep: 2, finish: Some(FinishReason::Eos) });
        assert_eq!(c.check_block(5, &[5]), BlockOutcome { keep: 0, finish: Some(FinishReason::Length) });
        assert_eq!(c.check_block(0, &[]), BlockOutcome { keep: 0, finish: None });
    }

    #[test]
    fn block_stops_at_the_token_completing_a_stop_string() {
        let vocab = ["a", "b", "END", "x", "<eos>"];
        let c = StoppingCriteria::new(vec![4], 10);
        let mut stops = StopStrings::new(["bE"]);
        let mut calls = 0;
        let out = c.check_block_with(0, &[0, 1, 2, 3, 4], |t| {
            calls += 1;
            stops.push(vocab[t as usize]).map(|h| h.stop)
        });
        assert_eq!(out, BlockOutcome { keep: 3, finish: Some(FinishReason::StopString("bE".into())) });
        assert_eq!(calls, 3, "nothing after the stop is decoded");
    }

    #[test]
    fn from_config_resolves_the_budget() {
        let config = GenerationConfig { eos_token_id: vec![7], max_new_tokens: Some(4), ..Default::default() };
        let c = StoppingCriteria::from_config(&config, 10, None).unwrap();
        assert_eq!((c.max_new_tokens(), c.eos_token_ids()), (4, &[7u32][..]));
        assert!(c.is_eos(7) && !c.is_eos(8));
        assert_eq!(c.remaining(3), 1);
        let config = GenerationConfig { max_length: Some(10), ..Default::default() };
        assert!(StoppingCriteria::from_config(&config, 10, None).is_err());
        let s = StopStrings::from_config(&GenerationConfig { stop_strings: vec!["x".into()], ..Default::default() });
        assert!(!s.is_empty());
    }
}
