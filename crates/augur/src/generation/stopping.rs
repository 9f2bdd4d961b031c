//! Why generation ended, and stop strings watched token by token (the [`Emitter`](super::output::Emitter) checks
//! EOS, the budget and these after every kept token).
//!
//! Transformers trims an accepted speculative block to the length budget and to its first EOS (spec 3.4), but checks
//! stop strings only once per round, so a stop string completed inside a block is missed. Here every kept token is
//! checked, in order — a deliberate fix (spec 17); for plain decoding (one token per step) the two agree.

use std::fmt;

use serde::{Serialize, Serializer};

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
}

impl StopStrings {
    /// Empty strings are ignored (they would match everywhere).
    pub fn new<S: Into<String>>(strings: impl IntoIterator<Item = S>) -> Self {
        let strings: Vec<String> = strings.into_iter().map(Into::into).filter(|s| !s.is_empty()).collect();
        let keep = strings.iter().map(|s| s.len()).max().unwrap_or(1) - 1;
        StopStrings { strings, tail: String::new(), keep }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reason_serialises_lowercase() {
        let json =
            serde_json::to_string(&[FinishReason::Eos, FinishReason::Length, FinishReason::StopString("###".into())])
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
}
