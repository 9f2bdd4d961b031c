//! What one draft of an assistant costs with its whole LM head and with reduced draft vocabularies
//! (`speculation::draft_vocab`): after a Spec-Bench prompt, `STEPS` one-token forwards with logits for the last
//! position, each followed by what the drafter does with them (laid out over the vocabulary, softmax), per
//! head; the heads take turns within each of `REPS` repetitions and the median milliseconds per draft are
//! printed. Heads: `full`, `first:N` (ids `0..N`, the merge-order short head), `top:N` (the shipped frequency
//! table's ranking); each reduced head also holds the prompt's tokens, as the drafter's does.
//!
//! ```text
//! cargo run --release -p augur --example draft_head -- MODEL.gguf QUESTIONS.jsonl CATEGORY REPS STEPS full first:65536 top:32768
//! ```

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use augur::generation::sampler::softmax;
use augur::models::{ForwardOptions, HeadSubset, LogitRows};
use augur::pipeline::LoadedLm;
use augur::speculation::draft_vocab;
use augur::tokenizer::ChatMessage;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, questions, category, reps, steps, heads @ ..] = &args[..] else {
        bail!("usage: draft_head MODEL.gguf QUESTIONS.jsonl CATEGORY REPS STEPS HEAD...")
    };
    let (reps, steps): (usize, usize) = (reps.parse()?, steps.parse()?);
    let mut lm = LoadedLm::load(model.as_ref(), &Default::default())?;
    let vocab = lm.config().vocab_size;
    let question = std::fs::read_to_string(questions)?
        .lines()
        .map(serde_json::from_str::<serde_json::Value>)
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .find(|q| q["category"] == category.as_str())
        .with_context(|| format!("no {category} question"))?;
    let text = question["turns"][0].as_str().context("a question's first turn")?;
    let prompt = lm.tokenizer.encode_chat(&[ChatMessage::user(text)], true)?;
    let mut variants = Vec::new();
    for head in heads {
        let subset = match head.split_once(':') {
            None if head == "full" => None,
            Some((kind, n)) => {
                let n: usize = n.parse()?;
                let top: Vec<u32> = match kind {
                    "first" => (0..n.min(vocab) as u32).collect(),
                    "top" => draft_vocab::top_ids(&lm.tokenizer, vocab, n),
                    _ => bail!("{head}: full, first:N or top:N"),
                };
                let extra = draft_vocab::extra_ids(&top, prompt.iter().copied(), vocab);
                let parts = [&top, &extra]
                    .into_iter()
                    .filter(|ids| !ids.is_empty())
                    .map(|ids| lm.model.head_part(ids, false)?.context("the head does not gather"))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Some(Arc::new(HeadSubset { ids: [top, extra].concat(), parts }))
            }
            None => bail!("{head}: full, first:N or top:N"),
        };
        variants.push((head.clone(), subset, Vec::new()));
    }
    lm.model.forward(&prompt, &ForwardOptions::logits(LogitRows::None))?;
    let feed: Vec<u32> =
        lm.tokenizer.encode("    for i in range(len(values)):\n        total += values[i] * 2", false)?;
    for _ in 0..reps {
        for (_, head, times) in variants.iter_mut() {
            let opts = ForwardOptions { head: head.clone(), ..ForwardOptions::logits(LogitRows::Last(1)) };
            for &t in feed.iter().cycle().take(steps) {
                let start = Instant::now();
                let out = lm.model.forward(&[t], &opts)?;
                let row = out.logits.context("logits")?.flatten_all()?.to_vec1::<f32>()?;
                let q = softmax(&spread(row, head.as_deref(), vocab));
                times.push(start.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(q);
            }
            lm.model.truncate(prompt.len());
        }
    }
    println!("{} prompt tokens, {reps} reps x {steps} drafts per head", prompt.len());
    let full = median(&mut variants[0].2.clone());
    for (name, head, times) in &mut variants {
        let rows = head.as_ref().map_or(vocab, |h| h.ids.len());
        let m = median(times);
        println!("{name:>12}: {rows:>6} rows, median {m:.2} ms per draft ({:.2} of the first head's)", m / full);
    }
    Ok(())
}

/// As the drafter lays a subset's logits out over the vocabulary.
fn spread(logits: Vec<f32>, head: Option<&HeadSubset>, vocab: usize) -> Vec<f32> {
    let Some(head) = head else { return logits };
    let mut out = vec![f32::NEG_INFINITY; vocab];
    for (&id, v) in head.ids.iter().zip(logits) {
        out[id as usize] = v;
    }
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
