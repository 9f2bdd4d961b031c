//! The assistant's reduced draft vocabulary (FR-Spec, arXiv 2502.14856; EAGLE-3's `draft_vocab_size`): the
//! token ids its LM head drafts from. A small assistant's head is a large share of the weight bytes each draft
//! reads (Qwen2.5-0.5B's 151,936 × 896), and most of its rows are tokens that text rarely holds.
//!
//! The set is the `n` most frequent ids of a frequency table, plus every token of the prompt and the EOS ids
//! (the drafter adds these). The table shipped here (`data/draft_vocab/`, see its README for the corpus and
//! its licence) was counted with one tokenizer and is used only for a tokenizer whose [`fingerprint`] it
//! carries; any other tokenizer ranks its ids in merge order (BPE numbers merges as it learns them, so the
//! first ids are the frequent ones) and takes the first `n`.

use std::sync::LazyLock;

use sha2::{Digest, Sha256};

use crate::tokenizer::Tokenizer;

/// Vocabularies above this size get a reduced draft vocabulary under cost-aware drafting when the call leaves
/// `draft_vocab_size` unset (Qwen2.5's 151,936, Gemma's 262,144; not Llama 3's 128,256, where it saves less).
pub const LARGE_VOCAB_ABOVE: usize = 131_072;
/// The default size for those vocabularies (BENCHMARKS.md, "Reduced draft vocabulary").
pub const DEFAULT_DRAFT_VOCAB_SIZE: usize = 32_768;

/// The table: `MAGIC`, the tokenizer's vocabulary size (u32), its [`fingerprint`] (u64), the number of ids
/// (u32), then the ids (u32 each), most frequent first; all little-endian.
const TABLE: &[u8] = include_bytes!("../../data/draft_vocab/qwen2.bin");
const MAGIC: &[u8; 8] = b"AUGURFR1";

/// Texts whose encodings, with the vocabulary size, identify a tokenizer: code, prose, digits, whitespace
/// runs and characters outside ASCII.
const PROBES: [&str; 5] = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def main():\n    return {\"key\": [1, 2, 3]}  # comment\n",
    "  1234567890 3.14159 -42\t\ttabs\r\n",
    "Ünïcödé ✓ 日本語のテキスト ελληνικά русский",
    "<|endoftext|><|im_start|>user\n",
];

/// A frequency table as [`TABLE`] stores it.
pub struct Table {
    pub vocab_size: usize,
    pub fingerprint: u64,
    /// Most frequent first.
    pub ids: Vec<u32>,
}

impl Table {
    /// The table's bytes: [`TABLE`]'s layout. `None` where they do not hold one.
    pub fn parse(bytes: &[u8]) -> Option<Table> {
        let u32_at = |at: usize| bytes.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        if bytes.get(..8)? != MAGIC {
            return None;
        }
        let vocab_size = u32_at(8)? as usize;
        let fingerprint = u64::from_le_bytes(bytes.get(12..20)?.try_into().ok()?);
        let count = u32_at(20)? as usize;
        let ids = (0..count).map(|i| u32_at(24 + 4 * i)).collect::<Option<Vec<u32>>>()?;
        Some(Table { vocab_size, fingerprint, ids })
    }

    /// [`TABLE`]'s layout, for the tool that counts a table.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend((self.vocab_size as u32).to_le_bytes());
        out.extend(self.fingerprint.to_le_bytes());
        out.extend((self.ids.len() as u32).to_le_bytes());
        self.ids.iter().for_each(|id| out.extend(id.to_le_bytes()));
        out
    }

    /// Whether this table was counted with `tokenizer`.
    pub fn fits(&self, tokenizer: &Tokenizer) -> bool {
        self.vocab_size == tokenizer.vocab_size() && Some(self.fingerprint) == fingerprint(tokenizer)
    }
}

/// The table shipped with augur.
pub static SHIPPED: LazyLock<Option<Table>> = LazyLock::new(|| Table::parse(TABLE));

/// The first 8 bytes of SHA-256 over the vocabulary size and the encodings of [`PROBES`]; `None` where a probe
/// does not encode.
pub fn fingerprint(tokenizer: &Tokenizer) -> Option<u64> {
    let mut h = Sha256::new();
    h.update((tokenizer.vocab_size() as u64).to_le_bytes());
    for probe in PROBES {
        for id in tokenizer.encode(probe, false).ok()? {
            h.update(id.to_le_bytes());
        }
        h.update(u32::MAX.to_le_bytes());
    }
    let digest = h.finalize();
    Some(u64::from_le_bytes(digest[..8].try_into().ok()?))
}

/// The `n` ids (below `vocab`) a draft vocabulary of size `n` starts from, ascending: the shipped table's most
/// frequent where it was counted with `tokenizer`, then (or else) the lowest ids not yet taken.
pub fn top_ids(tokenizer: &Tokenizer, vocab: usize, n: usize) -> Vec<u32> {
    let n = n.min(vocab);
    let mut taken = vec![false; vocab];
    let mut ids = Vec::with_capacity(n);
    if let Some(table) = SHIPPED.as_ref().filter(|t| t.fits(tokenizer)) {
        for &id in table.ids.iter().filter(|&&id| (id as usize) < vocab) {
            if ids.len() == n {
                break;
            }
            if !std::mem::replace(&mut taken[id as usize], true) {
                ids.push(id);
            }
        }
    }
    for id in 0..vocab as u32 {
        if ids.len() == n {
            break;
        }
        if !taken[id as usize] {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    ids
}

/// The ids of `tokens` (the prompt, the EOS ids) outside `top` (ascending) and below `vocab`: the part of a
/// request's draft vocabulary that the drafter gathers per request. Ascending, without repeats.
pub fn extra_ids(top: &[u32], tokens: impl IntoIterator<Item = u32>, vocab: usize) -> Vec<u32> {
    let mut extra: Vec<u32> =
        tokens.into_iter().filter(|&t| (t as usize) < vocab && top.binary_search(&t).is_err()).collect();
    extra.sort_unstable();
    extra.dedup();
    extra
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_table_parses_and_round_trips() {
        let table = SHIPPED.as_ref().expect("the shipped table parses");
        assert!(table.ids.len() >= DEFAULT_DRAFT_VOCAB_SIZE, "{} ids", table.ids.len());
        assert!(table.ids.iter().all(|&id| (id as usize) < table.vocab_size));
        assert_eq!(table.to_bytes(), TABLE);
        assert!(Table::parse(&TABLE[..TABLE.len() - 1]).is_none(), "a cut table is refused");
        assert!(Table::parse(b"not a table at all, not at all").is_none());
    }

    #[test]
    fn extra_ids_are_those_outside_the_top_once_each() {
        assert_eq!(extra_ids(&[1, 2, 5], [7, 2, 9, 7, 100, 0], 50), vec![0, 7, 9]);
    }
}
