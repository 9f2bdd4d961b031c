//! Streaming detokenization: token ids in, newly completed text out.
//!
//! Byte-level BPE and byte-fallback tokens can end in the middle of a UTF-8 character, which
//! decodes to U+FFFD until the rest arrives; like Transformers' `TextStreamer`, text is held back
//! while it ends in U+FFFD and flushed by [`TextStream::finish`]. Concatenating every chunk gives
//! exactly `decode(all_ids)`.
//!
//! Decoding is incremental (as in text-generation-inference): only a window from one already
//! emitted token onward is decoded, and the new text is its growth. The window keeps that one
//! token as context because decoders treat the first token specially (SentencePiece strips its
//! leading space). When the tokenizer cleans up tokenization spaces (`" ."` → `"."`), that
//! clean-up ([`SpaceCleanUp`]) is applied to the stream too, holding back text a later token could
//! still change; [`TextStream::without_clean_up`] leaves it to the caller, who can then look at the
//! text before it is held back (stop strings do).

use super::{clean_up_tokenization, Tokenizer};
use crate::error::Result;

/// Incremental detokenizer over a borrowed [`Tokenizer`].
pub struct TextStream<'a> {
    tok: &'a Tokenizer,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// Start of the decoding window in `ids`.
    prefix: usize,
    /// Text of `decode(ids[prefix..])` already handed out (or, for the context token, accounted for).
    window_emitted: String,
    clean_up: SpaceCleanUp,
}

impl<'a> TextStream<'a> {
    pub fn new(tok: &'a Tokenizer, skip_special_tokens: bool) -> Self {
        TextStream {
            tok,
            skip_special_tokens,
            ids: Vec::new(),
            prefix: 0,
            window_emitted: String::new(),
            clean_up: SpaceCleanUp::new(tok.clean_up_tokenization_spaces),
        }
    }

    /// Hands out the decoded text as it is, without the tokenizer's space clean-up.
    pub fn without_clean_up(mut self) -> Self {
        self.clean_up = SpaceCleanUp::new(false);
        self
    }

    /// Every id pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Adds one token; returns the text it completes (often empty while a character is partial).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.push_many(&[id])
    }

    /// Adds several tokens at once (e.g. the accepted run of a speculative step).
    pub fn push_many(&mut self, ids: &[u32]) -> Result<String> {
        if ids.is_empty() {
            return Ok(String::new());
        }
        self.ids.extend_from_slice(ids);
        let text = self.tok.decode_raw(&self.ids[self.prefix..], self.skip_special_tokens)?;
        if !text.starts_with(&self.window_emitted) {
            // The decoder rewrote earlier text (not seen with the supported decoders); wait for
            // more tokens, `finish` settles it.
            return Ok(String::new());
        }
        let complete = text.trim_end_matches('\u{FFFD}');
        let chunk = if complete.len() > self.window_emitted.len() {
            complete[self.window_emitted.len()..].to_string()
        } else {
            String::new()
        };
        if complete.len() == text.len() {
            self.advance_window(text)?;
        } else if complete.len() > self.window_emitted.len() {
            self.window_emitted = complete.to_string();
        }
        Ok(self.clean_up.push(&chunk, false))
    }

    /// Ends the stream: returns whatever was held back (partial characters included, as U+FFFD).
    pub fn finish(&mut self) -> Result<String> {
        let text = self.tok.decode_raw(&self.ids[self.prefix..], self.skip_special_tokens)?;
        let chunk = match text.strip_prefix(self.window_emitted.as_str()) {
            Some(rest) => rest.to_string(),
            None => {
                let common = text
                    .char_indices()
                    .zip(self.window_emitted.chars())
                    .find(|((_, a), b)| a != b)
                    .map(|((i, _), _)| i)
                    .unwrap_or(self.window_emitted.len().min(text.len()));
                text[common..].to_string()
            }
        };
        self.prefix = self.ids.len();
        self.window_emitted.clear();
        Ok(self.clean_up.push(&chunk, true))
    }

    /// Moves the window to start at the last token, once all text so far is complete. A byte
    /// token (`<0xNN>`) cannot start a window: the byte-fallback decoder decodes runs of them
    /// together, so the run must stay whole.
    fn advance_window(&mut self, window_text: String) -> Result<()> {
        let last = self.ids.len() - 1;
        if last <= self.prefix || self.is_byte_token(self.ids[last]) {
            // Keep the window; all of its text is out.
            self.window_emitted = window_text;
            return Ok(());
        }
        self.prefix = last;
        self.window_emitted = self.tok.decode_raw(&self.ids[last..], self.skip_special_tokens)?;
        Ok(())
    }

    fn is_byte_token(&self, id: u32) -> bool {
        self.tok.id_to_token(id).is_some_and(|t| {
            let b = t.as_bytes();
            b.len() == 6
                && b.starts_with(b"<0x")
                && b[5] == b'>'
                && b[3].is_ascii_hexdigit()
                && b[4].is_ascii_hexdigit()
        })
    }
}

/// Transformers' space clean-up (`" ."` → `"."`) over a stream of text: what a later chunk could still change
/// is held back until it cannot.
#[derive(Debug, Clone, Default)]
pub struct SpaceCleanUp {
    on: bool,
    /// Text not cleaned up and handed out yet.
    raw_tail: String,
}

impl SpaceCleanUp {
    /// `on: false` hands every chunk out as it is.
    pub fn new(on: bool) -> Self {
        SpaceCleanUp { on, raw_tail: String::new() }
    }

    /// Adds `chunk`; returns the cleaned-up text that no later chunk can change (all of it when `last`).
    /// Clean-up patterns all start with a space and span at most 5 characters, so text can be cleaned up and
    /// released up to any point that has no space among the 4 characters before it.
    pub fn push(&mut self, chunk: &str, last: bool) -> String {
        if !self.on {
            return chunk.to_string();
        }
        self.raw_tail.push_str(chunk);
        if last {
            return clean_up_tokenization(&std::mem::take(&mut self.raw_tail));
        }
        // Largest cut with no space in the (up to) 4 characters before it.
        let mut cut = self.raw_tail.len();
        let mut run = 0;
        for (i, c) in self.raw_tail.char_indices().rev() {
            if run == 4 {
                break;
            }
            if c == ' ' {
                cut = i;
                run = 0;
            } else {
                run += 1;
            }
        }
        let rest = self.raw_tail.split_off(cut);
        let ready = std::mem::replace(&mut self.raw_tail, rest);
        clean_up_tokenization(&ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::byte_level_tokenizer;
    use tokenizers::models::bpe::Vocab;

    /// Streams `ids` one at a time; returns the chunks after checking none splits a character.
    fn stream_chunks(tok: &Tokenizer, ids: &[u32], skip: bool) -> Vec<String> {
        let mut s = tok.stream(skip);
        let mut chunks = Vec::new();
        for &id in ids {
            chunks.push(s.push(id).unwrap());
        }
        chunks.push(s.finish().unwrap());
        let all: String = chunks.concat();
        assert_eq!(all, tok.decode(ids, skip).unwrap(), "chunks {chunks:?}");
        chunks
    }

    #[test]
    fn byte_level_multibyte_chars_are_never_split() {
        let tok = byte_level_tokenizer();
        let text = "hi 😀 日本語 é<|im_end|> world\n";
        let ids = tok.encode(text, false).unwrap();
        // 😀 is four byte tokens, each CJK character three.
        assert_eq!(tok.encode("😀", false).unwrap().len(), 4);
        assert_eq!(tok.encode("日", false).unwrap().len(), 3);
        let chunks = stream_chunks(&tok, &ids, false);
        assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')), "{chunks:?}");
        assert!(chunks.contains(&"😀".to_string()), "{chunks:?}");
        let skipped = stream_chunks(&tok, &ids, true);
        assert_eq!(skipped.concat(), "hi 😀 日本語 é world\n");
    }

    #[test]
    fn push_many_and_truncated_character_flushes_replacement() {
        let tok = byte_level_tokenizer();
        let ids = tok.encode("a😀b", false).unwrap();
        let mut s = tok.stream(false);
        let mut out = s.push_many(&ids[..3]).unwrap();
        assert_eq!(out, "a");
        out += &s.push_many(&ids[3..]).unwrap();
        out += &s.finish().unwrap();
        assert_eq!(out, "a😀b");
        // A stream cut inside a character ends with what decode gives: U+FFFD.
        let mut s = tok.stream(false);
        let mut out = s.push_many(&ids[..3]).unwrap();
        out += &s.finish().unwrap();
        assert_eq!(out, tok.decode(&ids[..3], false).unwrap());
        assert!(out.ends_with('\u{FFFD}'));
    }

    /// A tiny SentencePiece-style BPE with byte fallback (like Gemma / Llama 2).
    fn byte_fallback_tokenizer(add_space_prefix: bool) -> Tokenizer {
        use tokenizers::decoders::{
            byte_fallback::ByteFallback, fuse::Fuse, sequence::Sequence, strip::Strip, DecoderWrapper,
        };
        use tokenizers::models::bpe::BPE;
        use tokenizers::normalizers::{Prepend, Replace, Sequence as NSeq};
        let mut vocab = Vocab::new();
        for t in ["<unk>", "<s>", "</s>"] {
            let n = vocab.len() as u32;
            vocab.insert(t.to_string(), n);
        }
        for b in 0..=255u8 {
            let n = vocab.len() as u32;
            vocab.insert(format!("<0x{b:02X}>"), n);
        }
        for t in ["▁", "a", "b", "▁a", "日"] {
            let n = vocab.len() as u32;
            vocab.insert(t.to_string(), n);
        }
        let merges = vec![("▁".to_string(), "a".to_string())];
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .unk_token("<unk>".into())
            .fuse_unk(true)
            .byte_fallback(true)
            .build()
            .unwrap();
        let mut inner = crate::tokenizer::Inner::new(bpe.into());
        let replace = Replace::new(" ", "▁").unwrap();
        if add_space_prefix {
            inner.with_normalizer(Some(NSeq::new(vec![Prepend::new("▁".into()).into(), replace.into()]))).unwrap();
        } else {
            inner.with_normalizer(Some(replace)).unwrap();
        }
        let mut decoders = vec![
            DecoderWrapper::Replace(Replace::new("▁", " ").unwrap()),
            DecoderWrapper::ByteFallback(ByteFallback::new()),
            DecoderWrapper::Fuse(Fuse::new()),
        ];
        if add_space_prefix {
            decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
        }
        inner.with_decoder(Some(Sequence::new(decoders)));
        inner.add_special_tokens([tokenizers::AddedToken::from("<s>", true)]).unwrap();
        Tokenizer::from_parts(
            inner,
            &serde_json::json!({"bos_token": "<s>"}),
            &serde_json::Value::Null,
            None,
            std::path::Path::new("t"),
        )
        .unwrap()
    }

    #[test]
    fn byte_fallback_runs_are_decoded_whole() {
        for prefix in [false, true] {
            let tok = byte_fallback_tokenizer(prefix);
            assert_eq!(tok.kind(), "SentencePiece BPE (byte fallback)");
            // 😀 and 本 are byte tokens; back-to-back characters make one byte run.
            let text = "a 日😀本 b 😀😀a ab";
            let ids = tok.encode(text, false).unwrap();
            assert_eq!(tok.decode(&ids, false).unwrap(), text);
            let chunks = stream_chunks(&tok, &ids, false);
            assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')), "{chunks:?}");
            // With bos in front (skipped or not).
            let mut with_bos = vec![tok.bos_token_id().unwrap()];
            with_bos.extend(&ids);
            stream_chunks(&tok, &with_bos, true);
            stream_chunks(&tok, &with_bos, false);
        }
    }

    #[test]
    fn clean_up_spaces_are_streamed_like_decode() {
        let mut tok = byte_level_tokenizer();
        tok.clean_up_tokenization_spaces = true;
        for text in
            ["Hello world . Is it ? yes ! a , b", "do n't , I 'm here ' s x 've ' y", " . ? !  ,", "ab ' ' cd 're"]
        {
            let ids = tok.encode(text, false).unwrap();
            let chunks = stream_chunks(&tok, &ids, false);
            assert_eq!(chunks.concat(), clean_up_tokenization(text));
        }
    }
}
