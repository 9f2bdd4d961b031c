//! Rebuilds a Hugging Face tokenizer from GGUF metadata (`tokenizer.ggml.*`).
//!
//! A GGUF file carries no `tokenizer.json`, only the vocabulary, token types, merges or scores and a
//! pre-tokenizer name. This module turns that back into the pipeline the model's published
//! `tokenizer.json` describes, so that ids match Transformers exactly:
//!
//! * `tokenizer.ggml.model == "gpt2"`: byte-level BPE with the file's merges; the split regex comes
//!   from `tokenizer.ggml.pre` (see [`SUPPORTED_PRE_TOKENIZERS`]).
//! * `tokenizer.ggml.model == "llama"`: SentencePiece-style BPE (Llama 2, Gemma 3): `▁` for space, byte
//!   fallback through `<0xNN>` tokens, and merges derived from the scores the way Transformers'
//!   SentencePiece converter derives them.
//!
//! candle's `TokenizerFromGguf` covers only part of this (no SentencePiece vocabularies, GPT-2's
//! `add_prefix_space` where SmolLM has none, user-defined tokens made special), so it is not used.

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::normalizers::{unicode::NFC, Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::sequence::Sequence as ProcessorSequence;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::{special_ids, AnyModel, CompactBpe, Inner, Tokenizer};
use crate::config::MAX_VOCAB;
use crate::error::{Error, Result};

/// `tokenizer.ggml.pre` values this module knows how to rebuild for byte-level BPE vocabularies.
pub const SUPPORTED_PRE_TOKENIZERS: &[&str] = &[
    "default",
    "gpt2",
    "smollm",
    "starcoder",
    "refact",
    "qwen2",
    "deepseek-r1-qwen",
    "llama-bpe",
    "llama3",
    "smaug-bpe",
];

/// Qwen2's split regex, verbatim from its `tokenizer.json` (single digits).
const REGEX_QWEN2: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split regex (tiktoken cl100k), verbatim from its `tokenizer.json` (digits in threes).
const REGEX_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's `llama_token_type`.
mod token_type {
    pub const NORMAL: i64 = 1;
    pub const UNKNOWN: i64 = 2;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
}

/// Reads GGUF metadata with errors that name the file and the key.
struct Meta<'a> {
    ct: &'a Content,
    path: &'a Path,
}

impl<'a> Meta<'a> {
    fn bad(&self, reason: impl Into<String>) -> Error {
        Error::BadFile { path: self.path.to_path_buf(), format: "GGUF", reason: reason.into() }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.ct.metadata.get(key)
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.bad(format!("`{key}` should be a string, found {:?}", v.value_type()))),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            // Some converters write flags as integers.
            Some(v) => as_i64(v)
                .map(|i| Some(i != 0))
                .ok_or_else(|| self.bad(format!("`{key}` should be a boolean, found {:?}", v.value_type()))),
        }
    }

    fn id(&self, key: &str, vocab_len: usize) -> Result<Option<u32>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let id =
            as_i64(v).ok_or_else(|| self.bad(format!("`{key}` should be an integer, found {:?}", v.value_type())))?;
        // llama.cpp writes -1 (or u32::MAX) for "no such token".
        if id < 0 || id == u32::MAX as i64 {
            return Ok(None);
        }
        if id as usize >= vocab_len {
            return Err(self.bad(format!("`{key}` = {id} is outside the vocabulary of {vocab_len} tokens")));
        }
        Ok(Some(id as u32))
    }

    fn array(&self, key: &str) -> Result<Option<&'a Vec<Value>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.bad(format!("`{key}` should be an array, found {:?}", v.value_type()))),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<String>>> {
        let Some(arr) = self.array(key)? else { return Ok(None) };
        arr.iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(self.bad(format!("`{key}`[{i}] should be a string, found {:?}", other.value_type()))),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => *x as i64,
        Value::I8(x) => *x as i64,
        Value::U16(x) => *x as i64,
        Value::I16(x) => *x as i64,
        Value::U32(x) => *x as i64,
        Value::I32(x) => *x as i64,
        Value::U64(x) => *x as i64,
        Value::I64(x) => *x,
        _ => return None,
    })
}

fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::F32(x) => Some(*x as f64),
        Value::F64(x) => Some(*x),
        other => as_i64(other).map(|i| i as f64),
    }
}

/// Builds the tokenizer described by a GGUF file's metadata; `path` only names the file in errors.
pub(crate) fn from_gguf(ct: &Content, path: &Path) -> Result<Tokenizer> {
    let meta = Meta { ct, path };
    let model = meta
        .string("tokenizer.ggml.model")?
        .ok_or_else(|| meta.bad("tokenizer metadata `tokenizer.ggml.model` is missing"))?
        .to_string();
    let mut tokens = meta
        .strings("tokenizer.ggml.tokens")?
        .ok_or_else(|| meta.bad("tokenizer metadata `tokenizer.ggml.tokens` is missing"))?;
    if tokens.is_empty() {
        return Err(meta.bad("`tokenizer.ggml.tokens` is empty"));
    }
    if tokens.len() > MAX_VOCAB {
        return Err(
            meta.bad(format!("`tokenizer.ggml.tokens` has {} tokens, over the limit of {MAX_VOCAB}", tokens.len()))
        );
    }
    let n = tokens.len();
    let types: Vec<i64> = match meta.array("tokenizer.ggml.token_type")? {
        None => vec![token_type::NORMAL; n],
        Some(arr) => {
            if arr.len() != n {
                return Err(meta.bad(format!("`tokenizer.ggml.token_type` has {} entries for {n} tokens", arr.len())));
            }
            arr.iter()
                .map(|v| as_i64(v).ok_or_else(|| meta.bad("`tokenizer.ggml.token_type` holds a non-integer")))
                .collect::<Result<_>>()?
        }
    };

    let bos = meta.id("tokenizer.ggml.bos_token_id", n)?;
    let eos = meta.id("tokenizer.ggml.eos_token_id", n)?;
    let pad = meta.id("tokenizer.ggml.padding_token_id", n)?;
    // llama.cpp writes `unknown_token_id`; some older converters wrote `unk_token_id`.
    let unk = match meta.id("tokenizer.ggml.unknown_token_id", n)? {
        Some(id) => Some(id),
        None => meta.id("tokenizer.ggml.unk_token_id", n)?,
    };
    // End-of-turn / end-of-message markers stop generation in llama.cpp; a GGUF has no
    // generation_config.json, so they are the closest thing to its eos list.
    let eot = meta.id("tokenizer.ggml.eot_token_id", n)?;
    let eom = meta.id("tokenizer.ggml.eom_token_id", n)?;

    let (mut inner, kind, clean_up, default_add_bos) = match model.as_str() {
        "gpt2" => {
            let pre = meta.string("tokenizer.ggml.pre")?.unwrap_or("default").to_string();
            let (inner, clean_up) = byte_level_bpe(&meta, &tokens, &types, unk, &pre)?;
            (inner, format!("byte-level BPE (pre-tokenizer `{pre}`)"), clean_up, false)
        }
        "llama" => {
            respell_space_runs(&mut tokens);
            let add_space_prefix = meta.bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
            let inner = sentencepiece_bpe(&meta, &tokens, &types, unk, add_space_prefix)?;
            (inner, "SentencePiece BPE (byte fallback)".to_string(), false, true)
        }
        other => {
            return Err(meta.bad(format!(
            "tokenizer model `{other}` is not supported (supported: `gpt2` byte-level BPE, `llama` SentencePiece BPE)"
        )))
        }
    };

    add_special_and_user_tokens(&meta, &mut inner, &tokens, &types, [bos, eos, pad, unk])?;

    let add_bos = meta.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos);
    let add_eos = meta.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let byte_level_pp = (model == "gpt2").then(|| PostProcessorWrapper::ByteLevel(ByteLevel::new(false, false, false)));
    let template = template_processor(
        add_bos.then_some(bos).flatten().map(|id| (tokens[id as usize].clone(), id)),
        add_eos.then_some(eos).flatten().map(|id| (tokens[id as usize].clone(), id)),
    )?;
    let pp = match (byte_level_pp, template) {
        (Some(b), Some(t)) => Some(PostProcessorWrapper::Sequence(ProcessorSequence::new(vec![b, t]))),
        (b, t) => t.or(b),
    };
    inner.with_post_processor(pp);

    let mut eos_token_ids: Vec<u32> = Vec::new();
    for id in [eos, eot, eom].into_iter().flatten() {
        if !eos_token_ids.contains(&id) {
            eos_token_ids.push(id);
        }
    }
    let name = |id: Option<u32>| id.map(|i| tokens[i as usize].clone());
    Ok(Tokenizer {
        special_ids: special_ids(&inner),
        inner,
        kind,
        bos_token: name(bos),
        bos_token_id: bos,
        eos_token: name(eos),
        eos_token_ids,
        pad_token: name(pad),
        pad_token_id: pad,
        unk_token: name(unk),
        add_bos_token: add_bos && bos.is_some(),
        chat_template: meta.string("tokenizer.chat_template")?.map(str::to_string),
        clean_up_tokenization_spaces: clean_up,
    })
}

/// Byte-level BPE (GPT-2 family). Returns the tokenizer and whether Transformers cleans up
/// tokenization spaces when decoding for this family.
fn byte_level_bpe(meta: &Meta, tokens: &[String], types: &[i64], unk: Option<u32>, pre: &str) -> Result<(Inner, bool)> {
    let merges = meta
        .strings("tokenizer.ggml.merges")?
        .ok_or_else(|| meta.bad("byte-level BPE needs `tokenizer.ggml.merges`, which is missing"))?
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| {
                meta.bad(format!("`tokenizer.ggml.merges`[{i}] = {m:?} is not two tokens separated by a space"))
            })
        })
        .collect::<Result<Vec<_>>>()?;

    // Normal tokens are written in GPT-2's byte-to-unicode spelling; one that is not (llama.cpp writes
    // some undecodable ones raw) is respelled so the merges that name it find it.
    let alphabet = ByteLevel::alphabet();
    let spellings: Vec<Cow<str>> = tokens
        .iter()
        .enumerate()
        .map(|(id, tok)| {
            if types[id] == token_type::NORMAL && !tok.chars().all(|c| alphabet.contains(&c)) {
                Cow::Owned(byte_level_spelling(tok))
            } else {
                Cow::Borrowed(tok.as_str())
            }
        })
        .collect();
    let unk_token = unk.map(|id| tokens[id as usize].clone());
    let ignore_merges = meta.bool("tokenizer.ggml.ignore_merges")?.unwrap_or(false);
    let bpe = CompactBpe::new(&spellings, &merges, unk_token, ignore_merges)
        .map_err(|e| meta.bad(format!("cannot build the BPE model: {e}")))?;
    let mut tok = Inner::new(AnyModel::Compact(bpe));

    let split = |regex: &str| -> Result<PreTokenizerWrapper> {
        Split::new(SplitPattern::Regex(regex.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map(PreTokenizerWrapper::Split)
            .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex: {e}")))
    };
    // Each arm mirrors the published tokenizer.json of the family llama.cpp names.
    let (normalizer, pre_tokenizer, clean_up): (Option<NormalizerWrapper>, PreTokenizerWrapper, bool) = match pre {
        "default" | "gpt2" => (None, ByteLevel::new(false, true, true).into(), false),
        "smollm" | "starcoder" | "refact" => (
            None,
            PreSequence::new(vec![Digits::new(true).into(), ByteLevel::new(false, true, true).into()]).into(),
            false,
        ),
        "qwen2" | "deepseek-r1-qwen" => (
            Some(NFC.into()),
            PreSequence::new(vec![split(REGEX_QWEN2)?, ByteLevel::new(false, false, false).into()]).into(),
            false,
        ),
        "llama-bpe" | "llama3" | "smaug-bpe" => {
            (None, PreSequence::new(vec![split(REGEX_LLAMA3)?, ByteLevel::new(false, true, false).into()]).into(), true)
        }
        other => {
            return Err(meta.bad(format!(
                "pre-tokenizer `tokenizer.ggml.pre = {other}` is not supported (supported: {})",
                SUPPORTED_PRE_TOKENIZERS.join(", ")
            )))
        }
    };
    if let Some(n) = normalizer {
        tok.with_normalizer(Some(n)).map_err(|e| Error::Tokenizer(e.to_string()))?;
    }
    tok.with_pre_tokenizer(Some(pre_tokenizer));
    tok.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::new(false, false, false))));
    Ok((tok, clean_up))
}

/// GPT-2's byte-to-unicode spelling of a string's UTF-8 bytes.
fn byte_level_spelling(s: &str) -> String {
    s.bytes().map(byte_to_char).collect()
}

/// GPT-2's reversible byte → printable char map.
fn byte_to_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable(b) {
        return b as char;
    }
    // Non-printable bytes take code points 256.. in byte order.
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('\u{FFFD}')
}

/// llama.cpp writes runs of spaces as spaces; the vocabulary (and its merges) spell them with `▁`.
fn respell_space_runs(tokens: &mut [String]) {
    for tok in tokens.iter_mut() {
        if !tok.is_empty() && tok.chars().all(|c| c == ' ') {
            *tok = "▁".repeat(tok.chars().count());
        }
    }
}

/// SentencePiece-style BPE: vocabulary + scores, no merges in the file.
fn sentencepiece_bpe(
    meta: &Meta,
    tokens: &[String],
    types: &[i64],
    unk: Option<u32>,
    add_space_prefix: bool,
) -> Result<Inner> {
    let scores = meta
        .array("tokenizer.ggml.scores")?
        .ok_or_else(|| meta.bad("a SentencePiece vocabulary needs `tokenizer.ggml.scores`, which is missing"))?;
    if scores.len() != tokens.len() {
        return Err(meta.bad(format!(
            "`tokenizer.ggml.scores` has {} entries for {} tokens",
            scores.len(),
            tokens.len()
        )));
    }
    let scores = scores
        .iter()
        .map(|v| as_f64(v).ok_or_else(|| meta.bad("`tokenizer.ggml.scores` holds a non-number")))
        .collect::<Result<Vec<_>>>()?;
    // The merges are sorted by score: a NaN would break the order (the sort panics on it).
    if let Some(i) = scores.iter().position(|s| s.is_nan()) {
        return Err(meta.bad(format!("`tokenizer.ggml.scores`[{i}] is NaN")));
    }

    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, tok) in tokens.iter().enumerate() {
        vocab.entry(tok.clone()).or_insert(id as u32);
    }
    let work: u64 = tokens.iter().map(|t| t.chars().count() as u64 * t.len() as u64).sum();
    if work > MAX_MERGE_WORK {
        return Err(meta.bad(format!(
            "`tokenizer.ggml.tokens`: deriving merges from these tokens takes {work} steps, over the limit of \
             {MAX_MERGE_WORK} (the tokens are too long)"
        )));
    }
    let merges = merges_from_scores(tokens, types, &scores, &vocab);

    let mut builder = BPE::builder().vocab_and_merges(vocab, merges).fuse_unk(true).byte_fallback(true);
    if let Some(id) = unk {
        builder = builder.unk_token(tokens[id as usize].clone());
    }
    let bpe = builder.build().map_err(|e| meta.bad(format!("cannot build the BPE model: {e}")))?;
    let mut tok = Inner::new(bpe.into());

    let replace = Replace::new(" ", "▁").map_err(|e| Error::Tokenizer(e.to_string()))?;
    let normalizer: NormalizerWrapper = if add_space_prefix {
        NormalizerSequence::new(vec![Prepend::new("▁".to_string()).into(), replace.into()]).into()
    } else {
        replace.into()
    };
    tok.with_normalizer(Some(normalizer)).map_err(|e| Error::Tokenizer(e.to_string()))?;

    let mut decoders = vec![
        DecoderWrapper::Replace(
            tokenizers::normalizers::replace::Replace::new("▁", " ").map_err(|e| Error::Tokenizer(e.to_string()))?,
        ),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    tok.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(decoders))));
    Ok(tok)
}

/// Bound on the work of [`merges_from_scores`]: each token of `n` chars is split `n − 1` ways and each split
/// hashes the token's bytes, so a token costs about `n · len`, and so do its merges in memory; the sum grows with the
/// square of the token lengths, which a crafted file makes as long as it likes. Gemma 3's 262,144 tokens take
/// 1.6·10⁷.
const MAX_MERGE_WORK: u64 = 1 << 27;

/// Derives BPE merges from SentencePiece scores, as Transformers' `SentencePieceExtractor` does:
/// every split of a token into two vocabulary pieces is a merge; merges are ranked by the token's
/// score (higher first), then by longer left piece, then longer right piece; ties keep vocabulary
/// order (pieces sorted by their ids).
///
/// llama.cpp stores -1000 for control and user-defined tokens where SentencePiece has 0; using 0 for
/// every non-normal token reproduces Gemma 3's published merge list exactly.
fn merges_from_scores(tokens: &[String], types: &[i64], scores: &[f64], vocab: &Vocab) -> Vec<(String, String)> {
    // (score, left len, right len, left id, right id, left, right)
    let mut merges: Vec<(f64, usize, usize, u32, u32, &str, &str)> = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        let score = if types[id] == token_type::NORMAL { scores[id] } else { 0.0 };
        let start = merges.len();
        let total = tok.chars().count();
        for (k, (byte_idx, _)) in tok.char_indices().enumerate().skip(1) {
            let (l, r) = tok.split_at(byte_idx);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                merges.push((score, k, total - k, li, ri, l, r));
            }
        }
        merges[start..].sort_by_key(|m| (m.3, m.4));
    }
    // Stable sort, descending on (score, len left, len right).
    merges.sort_by(|a, b| {
        b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2))
    });
    merges.into_iter().map(|m| (m.5.to_string(), m.6.to_string())).collect()
}

/// Registers control tokens (and the file's bos/eos/pad/unk) as special added tokens and
/// user-defined tokens as plain added tokens, so both are matched verbatim in input text, as the
/// published tokenizer.json files do.
fn add_special_and_user_tokens(
    meta: &Meta,
    tok: &mut Inner,
    tokens: &[String],
    types: &[i64],
    named: [Option<u32>; 4],
) -> Result<()> {
    let named: HashSet<u32> = named.into_iter().flatten().collect();
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (id, content) in tokens.iter().enumerate() {
        if content.is_empty() {
            continue;
        }
        let ty = types[id];
        if ty == token_type::CONTROL || ty == token_type::UNKNOWN || named.contains(&(id as u32)) {
            special.push(AddedToken::from(content.clone(), true).normalized(false));
        } else if ty == token_type::USER_DEFINED {
            user.push(AddedToken::from(content.clone(), false).normalized(false));
        }
    }
    tok.add_special_tokens(special).map_err(|e| meta.bad(format!("cannot register special tokens: {e}")))?;
    tok.add_tokens(user).map_err(|e| meta.bad(format!("cannot register user-defined tokens: {e}")))?;
    Ok(())
}

/// `TemplateProcessing` that adds bos and/or eos around a single sequence (and each of a pair).
pub(crate) fn template_processor(
    bos: Option<(String, u32)>,
    eos: Option<(String, u32)>,
) -> Result<Option<PostProcessorWrapper>> {
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Vec::new();
    if let Some((t, id)) = &bos {
        specials.push((t.clone(), *id));
    }
    if let Some((t, id)) = &eos {
        if !specials.iter().any(|(s, _)| s == t) {
            specials.push((t.clone(), *id));
        }
    }
    for (seq, type_id) in [("A", 0), ("B", 1)] {
        if let Some((t, _)) = &bos {
            pair.push(format!("{t}:{type_id}"));
            if type_id == 0 {
                single.push(format!("{t}:0"));
            }
        }
        pair.push(format!("${seq}:{type_id}"));
        if type_id == 0 {
            single.push("$A:0".to_string());
        }
        if let Some((t, _)) = &eos {
            pair.push(format!("{t}:{type_id}"));
            if type_id == 0 {
                single.push(format!("{t}:0"));
            }
        }
    }
    let err = |e: String| Error::Tokenizer(format!("cannot build the bos/eos template: {e}"));
    let tp = TemplateProcessing::builder()
        .try_single(single)
        .map_err(|e| err(e.to_string()))?
        .try_pair(pair)
        .map_err(|e| err(e.to_string()))?
        .special_tokens(specials)
        .build()
        .map_err(|e| err(e.to_string()))?;
    Ok(Some(PostProcessorWrapper::Template(tp)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_spelling_matches_gpt2() {
        assert_eq!(byte_level_spelling(" "), "Ġ");
        assert_eq!(byte_level_spelling("\n"), "Ċ");
        assert_eq!(byte_level_spelling("a"), "a");
        assert_eq!(byte_level_spelling("é"), "Ã©");
        let alphabet = ByteLevel::alphabet();
        let all: HashSet<char> = (0..=255u8).map(byte_to_char).collect();
        assert_eq!(all.len(), 256);
        assert!(all.iter().all(|c| alphabet.contains(c)));
    }

    #[test]
    fn merges_follow_sentencepiece_extractor_order() {
        let tokens: Vec<String> = ["<unk>", "a", "b", "c", "ab", "bc", "abc"].iter().map(|s| s.to_string()).collect();
        let types = vec![2, 1, 1, 1, 1, 1, 1];
        let scores = vec![0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0];
        let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let merges = merges_from_scores(&tokens, &types, &scores, &vocab);
        let m: Vec<(&str, &str)> = merges.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(m, [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]);
    }

    #[test]
    fn space_runs_are_respelled() {
        let mut t = vec!["  ".to_string(), " ".to_string(), "a b".to_string()];
        respell_space_runs(&mut t);
        assert_eq!(t, ["▁▁", "▁", "a b"]);
    }
}
