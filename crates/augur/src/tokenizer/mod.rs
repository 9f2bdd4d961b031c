//! Tokenizers: Hugging Face `tokenizer.json`, tokenizers rebuilt from GGUF metadata, chat templates and
//! streaming detokenization.
//!
//! [`Tokenizer`] wraps a `tokenizers` pipeline ([`Inner`]) with what generation needs besides ids: bos/eos/pad
//! tokens, whether encoding adds bos, and the chat template.

mod bpe;
pub(crate) mod chat;
mod gguf;
mod stream;

use std::collections::HashSet;
use std::path::Path;

use candle_core::quantized::gguf_file;
use serde_json::Value as Json;

pub use bpe::{AnyModel, CompactBpe, Inner};
pub use chat::ChatMessage;
pub use gguf::SUPPORTED_PRE_TOKENIZERS;
pub use stream::{SpaceCleanUp, TextStream};

use crate::error::{Error, Result};

/// A tokenizer plus the special-token facts that generation and chat formatting need.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Inner,
    kind: String,
    bos_token: Option<String>,
    bos_token_id: Option<u32>,
    eos_token: Option<String>,
    eos_token_ids: Vec<u32>,
    pad_token: Option<String>,
    pad_token_id: Option<u32>,
    unk_token: Option<String>,
    add_bos_token: bool,
    chat_template: Option<String>,
    /// Transformers' `clean_up_tokenization_spaces` (" ." → "." …), applied after decoding.
    pub(crate) clean_up_tokenization_spaces: bool,
    /// Ids of special added tokens, kept apart because `tokenizers` only hands out a copy of its
    /// whole added-token table.
    special_ids: HashSet<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.vocab_size())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("pad_token", &self.pad_token)
            .field("add_bos_token", &self.add_bos_token)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

fn read_to_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

/// Reads an optional JSON file: `Ok(None)` when absent, `BadFile` when present but malformed.
fn read_json_opt(path: &Path, format: &'static str) -> Result<Option<Json>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = read_to_string(path)?;
    serde_json::from_str(&text).map(Some).map_err(|e| Error::BadFile {
        path: path.to_path_buf(),
        format,
        reason: e.to_string(),
    })
}

/// A special token in tokenizer_config.json / special_tokens_map.json: a string, or an
/// AddedToken object `{"content": ..}`; `null` means none.
fn special_token_string(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// The default chat template out of `chat_template`, which is a string or a list of
/// `{"name", "template"}` (Transformers uses the one named "default"; a sole template also serves).
fn chat_template_from(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Array(list) => {
            let named = |name: &str| list.iter().find(|t| t.get("name").and_then(Json::as_str) == Some(name));
            let entry = named("default").or(if list.len() == 1 { list.first() } else { None })?;
            entry.get("template").and_then(Json::as_str).map(str::to_string)
        }
        _ => None,
    }
}

impl Tokenizer {
    /// Loads a Hugging Face tokenizer directory: `tokenizer.json` (required), `tokenizer_config.json`
    /// (special tokens, `add_bos_token`, chat template), `special_tokens_map.json` (fills special
    /// tokens the config leaves out, as Transformers does) and `chat_template.jinja` (which, as in
    /// Transformers, takes precedence over the config's template).
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let tok_path = dir.join("tokenizer.json");
        let bytes = std::fs::read(&tok_path).map_err(|e| Error::io(&tok_path, e))?;
        let inner = serde_json::from_slice::<Inner>(&bytes).map_err(|e| Error::BadFile {
            path: tok_path.clone(),
            format: "tokenizer.json",
            reason: e.to_string(),
        })?;
        let config = read_json_opt(&dir.join("tokenizer_config.json"), "tokenizer_config.json")?.unwrap_or(Json::Null);
        let map = read_json_opt(&dir.join("special_tokens_map.json"), "special_tokens_map.json")?.unwrap_or(Json::Null);
        let mut chat_template = chat_template_from(config.get("chat_template"));
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            chat_template = Some(read_to_string(&jinja)?);
        }
        Self::from_parts(inner, &config, &map, chat_template, &dir.join("tokenizer_config.json"))
    }

    /// Builds from an already parsed `tokenizer.json` plus the (possibly `null`) contents of
    /// tokenizer_config.json and special_tokens_map.json; `config_path` only names the file in errors.
    pub fn from_parts(
        mut inner: Inner,
        config: &Json,
        special_tokens_map: &Json,
        chat_template: Option<String>,
        config_path: &Path,
    ) -> Result<Self> {
        // The config wins over special_tokens_map.json, which only fills what the config leaves out.
        let special = |key: &str| {
            special_token_string(config.get(key)).or_else(|| special_token_string(special_tokens_map.get(key)))
        };
        let id_of = |inner: &Inner, key: &str, tok: &Option<String>| -> Result<Option<u32>> {
            match tok {
                None => Ok(None),
                Some(t) => inner.token_to_id(t).map(Some).ok_or_else(|| {
                    Error::config(key, format!("`{t}` ({}) is not in the vocabulary", config_path.display()))
                }),
            }
        };
        let bos_token = special("bos_token");
        let eos_token = special("eos_token");
        let pad_token = special("pad_token");
        let unk_token = special("unk_token");
        let bos_token_id = id_of(&inner, "bos_token", &bos_token)?;
        let eos_token_id = id_of(&inner, "eos_token", &eos_token)?;
        let pad_token_id = id_of(&inner, "pad_token", &pad_token)?;

        // tokenizer.json's post-processor decides whether bos/eos are added; an explicit
        // `add_bos_token`/`add_eos_token` in the config overrides it, as Llama/Gemma's fast
        // tokenizers do with `update_post_processor`.
        let adds = |inner: &Inner, id: Option<u32>, first: bool| -> Result<bool> {
            let Some(id) = id else { return Ok(false) };
            let enc = inner.encode("", true).map_err(|e| Error::Tokenizer(e.to_string()))?;
            let ids = enc.get_ids();
            Ok(if first { ids.first() == Some(&id) } else { ids.last() == Some(&id) })
        };
        let mut add_bos = adds(&inner, bos_token_id, true)?;
        let mut add_eos = adds(&inner, eos_token_id, false)?;
        let want_bos = config.get("add_bos_token").and_then(Json::as_bool);
        let want_eos = config.get("add_eos_token").and_then(Json::as_bool);
        if want_bos.is_some_and(|w| w != add_bos) || want_eos.is_some_and(|w| w != add_eos) {
            add_bos = want_bos.unwrap_or(add_bos) && bos_token_id.is_some();
            add_eos = want_eos.unwrap_or(add_eos) && eos_token_id.is_some();
            let pp = gguf::template_processor(
                add_bos.then(|| bos_token.clone().zip(bos_token_id)).flatten(),
                add_eos.then(|| eos_token.clone().zip(eos_token_id)).flatten(),
            )?;
            inner.with_post_processor(pp);
        }

        let kind = describe(&inner);
        Ok(Tokenizer {
            special_ids: special_ids(&inner),
            inner,
            kind,
            bos_token,
            bos_token_id,
            eos_token,
            eos_token_ids: eos_token_id.into_iter().collect(),
            pad_token,
            pad_token_id,
            unk_token,
            add_bos_token: add_bos,
            chat_template,
            clean_up_tokenization_spaces: config
                .get("clean_up_tokenization_spaces")
                .and_then(Json::as_bool)
                .unwrap_or(false),
        })
    }

    /// Rebuilds the tokenizer from a GGUF file's metadata (see the `gguf` module for what is
    /// supported); `path` only names the file in errors.
    pub fn from_gguf(content: &gguf_file::Content, path: impl AsRef<Path>) -> Result<Self> {
        gguf::from_gguf(content, path.as_ref())
    }

    /// Text → ids. `add_special_tokens` adds bos/eos as the tokenizer's post-processor says; pass
    /// `false` for text that already carries them, such as a rendered chat template.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Tokenizer(format!("cannot encode text: {e}")))
    }

    /// Ids → text. Unknown ids are an error rather than silently dropped.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let n = self.vocab_size() as u32;
        if let Some(bad) = ids.iter().find(|&&id| id >= n || self.inner.id_to_token(id).is_none()) {
            return Err(Error::Tokenizer(format!("cannot decode id {bad}: the vocabulary has {n} tokens")));
        }
        let text = self
            .inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("cannot decode ids: {e}")))?;
        Ok(if self.clean_up_tokenization_spaces { clean_up_tokenization(&text) } else { text })
    }

    /// Decodes without Transformers' space clean-up; the streamer diffs this form.
    pub(crate) fn decode_raw(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| Error::Tokenizer(format!("cannot decode ids: {e}")))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The bytes token `id` stands for (OpenAI's `bytes` of a log-probability entry, which may be part of a
    /// UTF-8 character): byte-level BPE's characters mapped back to their bytes, a byte-fallback `<0xNN>`
    /// token's byte, SentencePiece's `▁` as a space; a special token's text.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(token) = self.id_to_token(id) else { return Vec::new() };
        if self.is_special(id) {
            return token.into_bytes();
        }
        if self.kind == BYTE_LEVEL_BPE {
            if let Some(bytes) = token.chars().map(byte_level_byte).collect::<Option<Vec<u8>>>() {
                return bytes;
            }
        }
        let hex = token.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')).filter(|h| h.len() == 2);
        if let Some(byte) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            return vec![byte];
        }
        token.replace('\u{2581}', " ").into_bytes()
    }

    /// Number of ids, added tokens included (Transformers' `len(tokenizer)`).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Whether `id` is a special added token (skipped by `decode(.., skip_special_tokens = true)`).
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// Short description of the algorithm, for `augur info`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Ids that end generation: the tokenizer's eos (plus, from GGUF, end-of-turn markers).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Replaces the eos list, e.g. with generation_config.json's `eos_token_id`.
    pub fn set_eos_token_ids(&mut self, ids: Vec<u32>) {
        self.eos_token_ids = ids;
    }

    pub fn pad_token(&self) -> Option<&str> {
        self.pad_token.as_deref()
    }

    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad_token_id
    }

    pub fn unk_token(&self) -> Option<&str> {
        self.unk_token.as_deref()
    }

    /// Whether `encode(text, true)` starts with bos.
    pub fn add_bos_token(&self) -> bool {
        self.add_bos_token
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Replaces the chat template (e.g. one given on the command line).
    pub fn set_chat_template(&mut self, template: Option<String>) {
        self.chat_template = template;
    }

    pub fn clean_up_tokenization_spaces(&self) -> bool {
        self.clean_up_tokenization_spaces
    }

    /// The wrapped `tokenizers` tokenizer, for what this type does not expose.
    pub fn inner(&self) -> &Inner {
        &self.inner
    }

    /// A streaming detokenizer over this tokenizer.
    pub fn stream(&self, skip_special_tokens: bool) -> TextStream<'_> {
        TextStream::new(self, skip_special_tokens)
    }
}

/// Transformers' `clean_up_tokenization`: removes spaces before punctuation and contractions.
pub(crate) fn clean_up_tokenization(text: &str) -> String {
    text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}

/// The byte behind a character of byte-level BPE's alphabet (GPT-2's `bytes_to_unicode`): printable bytes stand
/// for themselves, the other 68 (0–32, 127–160, 173) for U+0100 onward in their order.
fn byte_level_byte(c: char) -> Option<u8> {
    match c as u32 {
        b @ (33..=126 | 161..=172 | 174..=255) => Some(b as u8),
        n @ 256..=288 => Some((n - 256) as u8),
        n @ 289..=322 => Some((n - 289 + 127) as u8),
        323 => Some(173),
        _ => None,
    }
}

fn special_ids(inner: &Inner) -> HashSet<u32> {
    inner.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, _)| id).collect()
}

/// [`Tokenizer::kind`] of byte-level BPE, whose tokens spell their bytes in GPT-2's alphabet.
const BYTE_LEVEL_BPE: &str = "byte-level BPE";

/// "byte-level BPE", "SentencePiece BPE", … from the model type and the decoder.
fn describe(inner: &Inner) -> String {
    use tokenizers::models::ModelWrapper;
    let mentions =
        |v: Option<serde_json::Result<String>>, what: &str| v.and_then(|r| r.ok()).is_some_and(|s| s.contains(what));
    let byte_level = mentions(inner.get_decoder().map(serde_json::to_string), "ByteLevel")
        || mentions(inner.get_pre_tokenizer().map(serde_json::to_string), "ByteLevel");
    let model = match inner.get_model() {
        AnyModel::Compact(_) => return BYTE_LEVEL_BPE.to_string(),
        AnyModel::Crate(m) => m,
    };
    match model {
        ModelWrapper::BPE(_) if byte_level => BYTE_LEVEL_BPE.to_string(),
        ModelWrapper::BPE(bpe) if bpe.byte_fallback => "SentencePiece BPE (byte fallback)".to_string(),
        ModelWrapper::BPE(_) => "BPE".to_string(),
        ModelWrapper::Unigram(_) => "SentencePiece Unigram".to_string(),
        ModelWrapper::WordPiece(_) => "WordPiece".to_string(),
        ModelWrapper::WordLevel(_) => "word-level".to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokenizers::models::bpe::Vocab;

    /// A small byte-level BPE (GPT-2 style, every byte is a token) with ChatML special tokens.
    pub(crate) fn byte_level_tokenizer() -> Tokenizer {
        use tokenizers::models::bpe::BPE;
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        let mut vocab = Vocab::new();
        let mut chars: Vec<char> = ByteLevel::alphabet().into_iter().collect();
        chars.sort();
        for c in chars {
            let n = vocab.len() as u32;
            vocab.insert(c.to_string(), n);
        }
        let merges = vec![("Ġ".to_string(), "w".to_string()), ("h".to_string(), "i".to_string())];
        for (a, b) in &merges {
            let n = vocab.len() as u32;
            vocab.insert(format!("{a}{b}"), n);
        }
        let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().expect("valid BPE");
        let mut inner = Inner::new(bpe.into());
        inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        inner.with_decoder(Some(ByteLevel::new(false, true, true)));
        inner
            .add_special_tokens([
                tokenizers::AddedToken::from("<|endoftext|>", true),
                tokenizers::AddedToken::from("<|im_start|>", true),
                tokenizers::AddedToken::from("<|im_end|>", true),
            ])
            .expect("added");
        let config = serde_json::json!({
            "eos_token": {"content": "<|im_end|>", "__type": "AddedToken"},
            "pad_token": "<|endoftext|>",
            "bos_token": null,
            "chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        });
        Tokenizer::from_parts(
            inner,
            &config,
            &Json::Null,
            chat_template_from(config.get("chat_template")),
            Path::new("test"),
        )
        .expect("tokenizer")
    }

    /// Each token's bytes, concatenated, are the text's bytes, also where a token ends inside a character.
    #[test]
    fn token_bytes_concatenate_to_the_text() {
        let tok = byte_level_tokenizer();
        let text = "hi wé 日本\u{0}\u{7f}\u{ad}!";
        let ids = tok.encode(text, false).unwrap();
        assert!(ids.iter().any(|&id| std::str::from_utf8(&tok.token_bytes(id)).is_err()), "a partial character");
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
        assert_eq!(bytes, text.as_bytes());
        let end = tok.token_to_id("<|im_end|>").unwrap();
        assert_eq!(tok.token_bytes(end), b"<|im_end|>");
        for b in 0..=255u8 {
            let c = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
                .into_iter()
                .find(|&c| byte_level_byte(c) == Some(b));
            assert!(c.is_some(), "byte {b} has a character");
        }
    }

    #[test]
    fn byte_level_round_trip_and_specials() {
        let tok = byte_level_tokenizer();
        assert_eq!(tok.kind(), "byte-level BPE");
        let text = "hi world 😀 日本語\n\t  x<|im_end|>";
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
        let end = tok.token_to_id("<|im_end|>").unwrap();
        assert_eq!(ids.last(), Some(&end));
        assert!(tok.is_special(end));
        assert!(!tok.is_special(0));
        assert_eq!(tok.decode(&ids, true).unwrap(), "hi world 😀 日本語\n\t  x");
        assert_eq!(tok.eos_token_ids(), &[end]);
        assert_eq!(tok.eos_token(), Some("<|im_end|>"));
        assert_eq!(tok.pad_token_id(), tok.token_to_id("<|endoftext|>"));
        assert_eq!(tok.bos_token_id(), None);
        assert!(!tok.add_bos_token());
        assert_eq!(tok.vocab_size(), 256 + 2 + 3);
    }

    #[test]
    fn decode_rejects_unknown_ids() {
        let tok = byte_level_tokenizer();
        let err = tok.decode(&[1, 100_000], false).unwrap_err();
        assert!(matches!(err, Error::Tokenizer(ref m) if m.contains("100000")), "{err}");
    }

    #[test]
    fn chat_template_list_form_picks_default() {
        let v = serde_json::json!([
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D"}
        ]);
        assert_eq!(chat_template_from(Some(&v)).as_deref(), Some("D"));
        let one = serde_json::json!([{"name": "rag", "template": "R"}]);
        assert_eq!(chat_template_from(Some(&one)).as_deref(), Some("R"));
        assert_eq!(chat_template_from(Some(&Json::Null)), None);
    }

    #[test]
    fn special_token_forms() {
        assert_eq!(special_token_string(Some(&serde_json::json!("<s>"))).as_deref(), Some("<s>"));
        assert_eq!(
            special_token_string(Some(&serde_json::json!({"content": "</s>", "lstrip": false}))).as_deref(),
            Some("</s>")
        );
        assert_eq!(special_token_string(Some(&Json::Null)), None);
    }

    #[test]
    fn missing_dir_is_io_error_naming_the_file() {
        let err = Tokenizer::from_hf_dir("/nonexistent/augur-model").unwrap_err();
        match err {
            Error::Io { path, .. } => assert!(path.ends_with("tokenizer.json"), "{path:?}"),
            other => panic!("expected Io, got {other}"),
        }
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("augur-tok-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn malformed_tokenizer_json_is_bad_file() {
        let dir = temp_dir("malformed");
        std::fs::write(dir.join("tokenizer.json"), "{\"version\": \"1.0\", \"model\": 12").unwrap();
        let err = Tokenizer::from_hf_dir(&dir).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::BadFile { format: "tokenizer.json", .. }), "{msg}");
        assert!(msg.contains("tokenizer.json"), "{msg}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn hf_dir_reads_config_map_and_jinja() {
        let dir = temp_dir("hfdir");
        let tok = byte_level_tokenizer();
        tok.inner().save(dir.join("tokenizer.json"), false).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"eos_token": "<|im_end|>", "chat_template": "from config", "add_bos_token": true,
                "clean_up_tokenization_spaces": true}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("special_tokens_map.json"),
            r#"{"bos_token": {"content": "<|im_start|>"}, "eos_token": "<|endoftext|>"}"#,
        )
        .unwrap();
        let t = Tokenizer::from_hf_dir(&dir).unwrap();
        assert_eq!(t.chat_template(), Some("from config"));
        // The config's eos wins over the map; the map fills bos.
        assert_eq!(t.eos_token(), Some("<|im_end|>"));
        assert_eq!(t.bos_token(), Some("<|im_start|>"));
        // add_bos_token in the config makes encode add bos.
        assert!(t.add_bos_token());
        let ids = t.encode("hi", true).unwrap();
        assert_eq!(ids.first(), t.bos_token_id().as_ref());
        assert_eq!(t.encode("hi", false).unwrap().len(), 1);
        assert_eq!(t.decode(&t.encode("hi , you !", false).unwrap(), false).unwrap(), "hi, you!");
        std::fs::write(dir.join("chat_template.jinja"), "from jinja").unwrap();
        assert_eq!(Tokenizer::from_hf_dir(&dir).unwrap().chat_template(), Some("from jinja"));
        std::fs::write(dir.join("tokenizer_config.json"), "{not json").unwrap();
        let err = Tokenizer::from_hf_dir(&dir).unwrap_err();
        assert!(matches!(err, Error::BadFile { format: "tokenizer_config.json", .. }), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
