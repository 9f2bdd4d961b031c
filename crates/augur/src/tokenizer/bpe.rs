//! Byte-level BPE held compactly, for vocabularies rebuilt from GGUF metadata.
//!
//! The `tokenizers` crate's BPE keeps its vocabulary twice, as `HashMap<String, u32>` and `HashMap<u32, String>`,
//! each entry with its own allocated spelling: for a small model, the largest thing in memory after the weights.
//! [`CompactBpe`] keeps each spelling once, in one string, with an open-addressing index of ids. It encodes exactly as the crate's BPE does (same merge
//! order, unknown-token handling and offsets): `tests::matches_the_crates_bpe` checks it against the crate, and
//! `tests/tokenizer_gguf.rs` checks whole GGUF tokenizers against the published `tokenizer.json` files.

use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BpeTrainer, Vocab, BPE};
use tokenizers::models::{ModelWrapper, TrainerWrapper};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{Model, Token, TokenizerImpl};

/// The tokenizer pipeline with either model: what [`super::Tokenizer`] wraps.
pub type Inner = TokenizerImpl<AnyModel, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// A model from a `tokenizer.json` (any type the crate knows) or a compact byte-level BPE.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)] // one per tokenizer
pub enum AnyModel {
    Crate(ModelWrapper),
    Compact(CompactBpe),
}

impl AnyModel {
    pub fn is_bpe(&self) -> bool {
        matches!(self, AnyModel::Compact(_) | AnyModel::Crate(ModelWrapper::BPE(_)))
    }
}

impl From<BPE> for AnyModel {
    fn from(bpe: BPE) -> Self {
        AnyModel::Crate(bpe.into())
    }
}

/// Byte-level BPE: every token's spelling once, an id index, and the merges.
#[derive(Clone)]
pub struct CompactBpe {
    tables: Arc<Tables>,
}

struct Tables {
    /// Every token's spelling, concatenated; token `i` is `text[start(i)..ends[i]]`.
    text: String,
    ends: Vec<u32>,
    /// Open addressing with linear probing: the id whose spelling hashes here, or `EMPTY`. Only the first id of a
    /// spelling is indexed, as in the crate's map (a later duplicate has no spelling of its own there).
    index: Vec<u32>,
    /// Distinct spellings: the crate's vocabulary size.
    distinct: usize,
    /// The index's hash, keyed at random per process: the vocabulary comes from a downloaded file, and with a fixed
    /// hash (FNV-1a before) spellings chosen to share slots turn the linear probing, and the load, quadratic.
    hasher: std::collections::hash_map::RandomState,
    /// `(left, right) → (rank, merged id)`.
    merges: HashMap<(u32, u32), (u32, u32)>,
    unk_token: Option<String>,
    ignore_merges: bool,
}

const EMPTY: u32 = u32::MAX;

impl CompactBpe {
    /// `tokens`: spellings by id; `merges`: pairs of spellings, by rank. Mirrors the crate's builder: the first id
    /// of a repeated spelling is the one looked up, a later merge of the same pair replaces an earlier one, and a
    /// merge whose parts or result are not tokens is an error.
    pub fn new(
        tokens: &[impl AsRef<str>],
        merges: &[(String, String)],
        unk_token: Option<String>,
        ignore_merges: bool,
    ) -> Result<Self, String> {
        let mut text = String::with_capacity(tokens.iter().map(|t| t.as_ref().len()).sum());
        let mut ends = Vec::with_capacity(tokens.len());
        for t in tokens {
            text.push_str(t.as_ref());
            ends.push(u32::try_from(text.len()).map_err(|_| "the vocabulary spells over 4 GiB".to_string())?);
        }
        let slots = (tokens.len() + tokens.len() / 2).next_power_of_two().max(16);
        let mut tables = Tables {
            text,
            ends,
            index: vec![EMPTY; slots],
            distinct: 0,
            hasher: std::collections::hash_map::RandomState::new(),
            merges: HashMap::with_capacity(merges.len()),
            unk_token,
            ignore_merges,
        };
        for id in 0..tokens.len() as u32 {
            let slot = tables.slot(tables.spelling(id));
            if tables.index[slot] == EMPTY {
                tables.index[slot] = id;
                tables.distinct += 1;
            }
        }
        let id = |t: &Tables, s: &str| t.id(s).ok_or_else(|| format!("merge token `{s}` is not in the vocabulary"));
        for (rank, (a, b)) in merges.iter().enumerate() {
            let pair = (id(&tables, a)?, id(&tables, b)?);
            let merged = id(&tables, &format!("{a}{b}"))?;
            tables.merges.insert(pair, (rank as u32, merged));
        }
        Ok(Self { tables: Arc::new(tables) })
    }

    /// The same model as the crate's BPE (for saving, and for the tests that compare the two).
    pub fn to_crate_bpe(&self) -> tokenizers::Result<BPE> {
        let t = &self.tables;
        let vocab: Vocab =
            (0..t.ends.len() as u32).filter_map(|id| Some((t.indexed_spelling(id)?.to_string(), id))).collect();
        let mut ranked: Vec<_> = t.merges.iter().collect();
        ranked.sort_by_key(|(_, (rank, _))| *rank);
        let merges = ranked.into_iter().map(|(&(a, b), _)| (t.spelling(a).to_string(), t.spelling(b).to_string()));
        let mut builder = BPE::builder().vocab_and_merges(vocab, merges.collect()).ignore_merges(t.ignore_merges);
        if let Some(unk) = &t.unk_token {
            builder = builder.unk_token(unk.clone());
        }
        builder.build()
    }
}

impl Tables {
    fn spelling(&self, id: u32) -> &str {
        let i = id as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.text[start..self.ends[i] as usize]
    }

    /// `id`'s spelling if `id` is the one its spelling looks up (the crate's vocabulary has no entry for a later
    /// duplicate), else `None`; also `None` past the vocabulary.
    fn indexed_spelling(&self, id: u32) -> Option<&str> {
        let s = (id < self.ends.len() as u32).then(|| self.spelling(id))?;
        (self.id(s) == Some(id)).then_some(s)
    }

    /// The slot holding `s`, or the empty slot where it would go.
    fn slot(&self, s: &str) -> usize {
        let mask = self.index.len() - 1;
        let mut slot = self.hasher.hash_one(s) as usize & mask;
        while self.index[slot] != EMPTY && self.spelling(self.index[slot]) != s {
            slot = (slot + 1) & mask;
        }
        slot
    }

    fn id(&self, s: &str) -> Option<u32> {
        let id = self.index[self.slot(s)];
        (id != EMPTY).then_some(id)
    }

    /// The crate's `BPE::merge_word` and `Word::merge_all` without dropout, continuing-subword prefix, end-of-word
    /// suffix or byte fallback (none of which byte-level BPE uses): `(id, byte length)` per final symbol.
    fn merge_word(&self, w: &str) -> tokenizers::Result<Vec<Symbol>> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(w.len());
        let push = |symbols: &mut Vec<Symbol>, c: u32, len: usize| {
            let n = symbols.len() as isize;
            if let Some(last) = symbols.last_mut() {
                last.next = n;
            }
            symbols.push(Symbol { c, prev: n - 1, next: -1, len });
        };
        let mut unk: Option<(u32, usize)> = None;
        for (i, ch) in w.char_indices() {
            let s = &w[i..i + ch.len_utf8()];
            if let Some(id) = self.id(s) {
                if let Some((u, len)) = unk.take() {
                    push(&mut symbols, u, len);
                }
                push(&mut symbols, id, s.len());
            } else if let Some(unk_token) = &self.unk_token {
                let unk_id =
                    self.id(unk_token).ok_or_else(|| format!("Unk token `{unk_token}` not found in the vocabulary"))?;
                if let Some((u, len)) = unk.replace((unk_id, s.len())) {
                    push(&mut symbols, u, len);
                }
            }
        }
        if let Some((u, len)) = unk {
            push(&mut symbols, u, len);
        }

        let mut queue: BinaryHeap<Merge> = symbols
            .windows(2)
            .enumerate()
            .filter_map(|(pos, w)| {
                let &(rank, new_id) = self.merges.get(&(w[0].c, w[1].c))?;
                Some(Merge { pos, rank, new_id })
            })
            .collect();
        while let Some(top) = queue.pop() {
            let cur = symbols[top.pos];
            if cur.len == 0 || cur.next == -1 {
                continue;
            }
            let next_pos = cur.next as usize;
            let right = symbols[next_pos];
            if self.merges.get(&(cur.c, right.c)).is_none_or(|&(_, id)| id != top.new_id) {
                continue;
            }
            symbols[top.pos].c = top.new_id;
            symbols[top.pos].len += right.len;
            symbols[top.pos].next = right.next;
            symbols[next_pos].len = 0;
            if right.next > -1 && (right.next as usize) < symbols.len() {
                symbols[right.next as usize].prev = top.pos as isize;
            }
            let cur = symbols[top.pos];
            if cur.prev >= 0 {
                let prev = cur.prev as usize;
                if let Some(&(rank, new_id)) = self.merges.get(&(symbols[prev].c, cur.c)) {
                    queue.push(Merge { pos: prev, rank, new_id });
                }
            }
            let next = cur.next as usize;
            if next < symbols.len() {
                if let Some(&(rank, new_id)) = self.merges.get(&(cur.c, symbols[next].c)) {
                    queue.push(Merge { pos: top.pos, rank, new_id });
                }
            }
        }
        symbols.retain(|s| s.len != 0);
        Ok(symbols)
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    c: u32,
    prev: isize,
    next: isize,
    len: usize,
}

/// A candidate merge; the heap pops the lowest rank first, then the leftmost position, as the crate's does.
#[derive(PartialEq, Eq)]
struct Merge {
    pos: usize,
    rank: u32,
    new_id: u32,
}

impl Ord for Merge {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.rank.cmp(&self.rank).then(other.pos.cmp(&self.pos))
    }
}

impl PartialOrd for Merge {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Model for CompactBpe {
    type Trainer = TrainerWrapper;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        let t = &self.tables;
        if sequence.is_empty() {
            return Ok(Vec::new());
        }
        if t.ignore_merges {
            if let Some(id) = t.id(sequence) {
                return Ok(vec![Token::new(id, sequence.to_string(), (0, sequence.len()))]);
            }
        }
        let mut pos = 0;
        Ok(t.merge_word(sequence)?
            .into_iter()
            .map(|s| {
                let offsets = (pos, pos + s.len);
                pos += s.len;
                Token::new(s.c, t.spelling(s.c).to_string(), offsets)
            })
            .collect())
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tables.id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.tables.indexed_spelling(id).map(str::to_string)
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        (0..self.tables.ends.len() as u32).filter_map(|id| self.id_to_token(id).map(|s| (s, id))).collect()
    }

    fn get_vocab_size(&self) -> usize {
        self.tables.distinct
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        self.to_crate_bpe()?.save(folder, prefix)
    }

    fn get_trainer(&self) -> TrainerWrapper {
        BpeTrainer::default().into()
    }
}

impl Model for AnyModel {
    type Trainer = TrainerWrapper;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        match self {
            AnyModel::Crate(m) => m.tokenize(sequence),
            AnyModel::Compact(m) => m.tokenize(sequence),
        }
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        match self {
            AnyModel::Crate(m) => m.token_to_id(token),
            AnyModel::Compact(m) => m.token_to_id(token),
        }
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        match self {
            AnyModel::Crate(m) => m.id_to_token(id),
            AnyModel::Compact(m) => m.id_to_token(id),
        }
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        match self {
            AnyModel::Crate(m) => m.get_vocab(),
            AnyModel::Compact(m) => m.get_vocab(),
        }
    }

    fn get_vocab_size(&self) -> usize {
        match self {
            AnyModel::Crate(m) => m.get_vocab_size(),
            AnyModel::Compact(m) => m.get_vocab_size(),
        }
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        match self {
            AnyModel::Crate(m) => m.save(folder, prefix),
            AnyModel::Compact(m) => m.save(folder, prefix),
        }
    }

    fn get_trainer(&self) -> TrainerWrapper {
        match self {
            AnyModel::Crate(m) => m.get_trainer(),
            AnyModel::Compact(m) => m.get_trainer(),
        }
    }
}

/// Written as the crate's model (a compact BPE as the BPE it equals), so a saved `tokenizer.json` loads anywhere.
impl Serialize for AnyModel {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            AnyModel::Crate(m) => m.serialize(serializer),
            AnyModel::Compact(m) => {
                let bpe = m.to_crate_bpe().map_err(serde::ser::Error::custom)?;
                ModelWrapper::BPE(bpe).serialize(serializer)
            }
        }
    }
}

impl<'de> Deserialize<'de> for AnyModel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ModelWrapper::deserialize(deserializer).map(AnyModel::Crate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary with what stresses the merge order: overlapping pairs (`aaa`), merges that compete for a
    /// symbol, a spelling given twice, a character outside the vocabulary, and merged tokens that are whole words.
    fn vocab_and_merges() -> (Vec<String>, Vec<(String, String)>) {
        let tokens: Vec<String> = [
            "<unk>", "a", "b", "c", "d", "aa", "ab", "bc", "aab", "abc", "aaa", "cd", "bcd", "ab", "aabc", "dd", "ddd",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let merges = [("a", "a"), ("b", "c"), ("a", "b"), ("aa", "b"), ("a", "bc"), ("c", "d"), ("b", "cd")]
            .iter()
            .chain(&[("aa", "a"), ("aab", "c"), ("d", "d"), ("dd", "d"), ("a", "b")])
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        (tokens, merges)
    }

    fn crate_bpe(tokens: &[String], merges: &[(String, String)], ignore_merges: bool) -> BPE {
        let mut vocab = Vocab::new();
        for (id, t) in tokens.iter().enumerate() {
            vocab.entry(t.clone()).or_insert(id as u32);
        }
        BPE::builder()
            .vocab_and_merges(vocab, merges.to_vec())
            .unk_token("<unk>".into())
            .ignore_merges(ignore_merges)
            .build()
            .unwrap()
    }

    #[test]
    fn matches_the_crates_bpe() {
        let (tokens, merges) = vocab_and_merges();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for ignore_merges in [false, true] {
            let ours = CompactBpe::new(&tokens, &merges, Some("<unk>".into()), ignore_merges).unwrap();
            let theirs = crate_bpe(&tokens, &merges, ignore_merges);
            assert_eq!(ours.get_vocab_size(), theirs.get_vocab_size());
            assert_eq!(ours.get_vocab(), theirs.get_vocab());
            for id in 0..tokens.len() as u32 + 2 {
                assert_eq!(ours.id_to_token(id), theirs.id_to_token(id), "id {id}");
            }
            for t in tokens.iter().map(String::as_str).chain(["x", "abcd", ""]) {
                assert_eq!(ours.token_to_id(t), theirs.token_to_id(t), "{t:?}");
            }
            for _ in 0..3000 {
                let len = (next() % 12) as usize;
                let word: String = (0..len).map(|_| ['a', 'b', 'c', 'd', 'x', 'é'][(next() % 6) as usize]).collect();
                let key = |t: Vec<Token>| t.into_iter().map(|t| (t.id, t.value, t.offsets)).collect::<Vec<_>>();
                assert_eq!(key(ours.tokenize(&word).unwrap()), key(theirs.tokenize(&word).unwrap()), "{word:?}");
            }
        }
    }

    #[test]
    fn saves_as_the_crates_bpe_and_rejects_unknown_merge_tokens() {
        let (tokens, merges) = vocab_and_merges();
        let ours = CompactBpe::new(&tokens, &merges, Some("<unk>".into()), false).unwrap();
        let json = serde_json::to_string(&AnyModel::Compact(ours.clone())).unwrap();
        let back: AnyModel = serde_json::from_str(&json).unwrap();
        for word in ["aaabcd", "abcabc", "dddd", "xax"] {
            let ids = |m: &dyn Fn(&str) -> Vec<Token>| m(word).into_iter().map(|t| t.id).collect::<Vec<_>>();
            assert_eq!(ids(&|w| ours.tokenize(w).unwrap()), ids(&|w| back.tokenize(w).unwrap()), "{word}");
        }
        let bad = [("a".to_string(), "z".to_string())];
        let err = CompactBpe::new(&tokens, &bad, None, false).err().unwrap();
        assert!(err.contains("`z`"), "{err}");
    }
}
