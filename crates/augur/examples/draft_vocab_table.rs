//! Counts a draft-vocabulary frequency table (`speculation::draft_vocab`): every file named on standard input
//! (one path a line) is read as UTF-8 text (files that are not are skipped), encoded with the tokenizer of a
//! GGUF file, and the `TOP` most frequent ids are written, most frequent first (ties: the lower id), with the
//! tokenizer's vocabulary size and fingerprint. `tools/draft_vocab/build.sh` runs it over its corpus:
//!
//! ```text
//! find CORPUS -name '*.py' | cargo run --release -p augur --example draft_vocab_table -- MODEL.gguf OUT TOP
//! ```

use std::io::BufRead;

use anyhow::{bail, Context};
use augur::speculation::draft_vocab::{fingerprint, Table};
use augur::tokenizer::Tokenizer;
use candle_core::quantized::gguf_file;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [gguf, out, top] = &args[..] else { bail!("usage: draft_vocab_table MODEL.gguf OUT TOP < file list") };
    let top: usize = top.parse().context("TOP: a number of ids")?;
    let mut file = std::fs::File::open(gguf).with_context(|| gguf.clone())?;
    let content = gguf_file::Content::read(&mut file)?;
    let tokenizer = Tokenizer::from_gguf(&content, gguf)?;
    let mut counts = vec![0u64; tokenizer.vocab_size()];
    let (mut files, mut bytes) = (0usize, 0usize);
    for path in std::io::stdin().lock().lines() {
        let path = path?;
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        for id in tokenizer.encode(&text, false)? {
            if let Some(c) = counts.get_mut(id as usize) {
                *c += 1;
            }
        }
        files += 1;
        bytes += text.len();
    }
    let mut ids: Vec<u32> = (0..counts.len() as u32).filter(|&id| counts[id as usize] > 0).collect();
    ids.sort_by(|&a, &b| counts[b as usize].cmp(&counts[a as usize]).then(a.cmp(&b)));
    ids.truncate(top);
    let fingerprint = fingerprint(&tokenizer).context("the tokenizer cannot encode the probes")?;
    let table = Table { vocab_size: tokenizer.vocab_size(), fingerprint, ids };
    std::fs::write(out, table.to_bytes()).with_context(|| out.clone())?;
    let total: u64 = counts.iter().sum();
    let kept: u64 = table.ids.iter().map(|&id| counts[id as usize]).sum();
    println!(
        "{files} files, {bytes} bytes, {total} tokens, {} distinct; the {} ids kept cover {:.4} of the tokens",
        counts.iter().filter(|&&c| c > 0).count(),
        table.ids.len(),
        kept as f64 / total.max(1) as f64
    );
    for n in [8192, 16384, 32768, 65536] {
        let covered: u64 = table.ids.iter().take(n).map(|&id| counts[id as usize]).sum();
        println!("top {n}: {:.4} of the tokens", covered as f64 / total.max(1) as f64);
    }
    Ok(())
}
