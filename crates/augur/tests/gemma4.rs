//! Gemma 4 and its assistant against Transformers 5.24 (`tools/fixtures/generate_gemma4.py`): the target's logits
//! (1e-4 relative, f32) and greedy continuations; the assistant's raw logits in its first drafting round and its
//! greedy drafts in every round (against 5.24 with its stale-KV defect fixed in every round, and against stock 5.24
//! in the rounds the defect cannot reach); lossless greedy; the greedy ensemble weight is applied. Sampling is
//! tested in `exact_distribution.rs`.

mod common;

use augur::generation::config::GenerationOptions;
use augur::generation::output::{Emitter, GenerationStats};
use augur::models::gemma4_assistant::Gemma4Assistant;
use augur::models::{CausalLm, ForwardOptions, LogitRows};
use augur::speculation::methods::Gemma4AssistantDrafter;
use augur::speculation::speculative;
use augur::speculation::{Draft, Drafter};
use common::*;
use serde_json::Value;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn close(ours: &[f32], theirs: &[f32], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    let scale = theirs.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = ours.iter().zip(theirs).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-4 * scale.max(1.0), "{what}: max diff {worst} (scale {scale})");
}

#[test]
fn target_matches_transformers() {
    let g = golden("gemma4.json");
    let mut lm = load(&fixtures().join("tiny-gemma4"), false);
    let prompts = g["prompts"].as_array().unwrap();
    for p in prompts {
        let input = ids(&p["input_ids"]);
        lm.model.truncate(0);
        let out = lm.model.forward(&input, &ForwardOptions::logits(LogitRows::All)).unwrap();
        let ours: Vec<Vec<f32>> = out.logits.unwrap().to_vec2().unwrap();
        let theirs = p["logits"].as_array().unwrap();
        assert_eq!(ours.len(), theirs.len());
        for (pos, (a, b)) in ours.iter().zip(theirs).enumerate() {
            close(a, &floats(b), &format!("{:?} position {pos}", p["text"]));
        }
        // Rows dropped before the KV-sharing layers: the last row alone is the same.
        lm.model.truncate(0);
        let last = lm.model.forward(&input, &ForwardOptions::logits(LogitRows::Last(1))).unwrap();
        let last: Vec<Vec<f32>> = last.logits.unwrap().to_vec2().unwrap();
        close(&last[0], &floats(theirs.last().unwrap()), "last row only");
    }
    let mut pipe = pipeline("tiny-gemma4", None);
    let max_new = g["max_new_tokens"].as_u64().unwrap() as usize;
    for p in prompts {
        let out = pipe.generate_ids(&ids(&p["input_ids"]), &greedy(max_new), None).unwrap();
        assert_eq!(out.tokens, ids(&p["greedy"]), "greedy continuation of {:?}", p["text"]);
    }
    assert!(prompts.iter().any(|p| ids(&p["input_ids"]).len() > 8), "no prompt exceeds the sliding window");
}

/// Records every draft the wrapped drafter proposes.
struct Recording<D> {
    inner: D,
    drafts: Vec<(usize, Draft)>,
}

impl<D: Drafter> Drafter for Recording<D> {
    fn method(&self) -> &'static str {
        self.inner.method()
    }
    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> augur::Result<Draft> {
        let d = self.inner.propose(target, context, max)?;
        self.drafts.push((context.len(), d.clone()));
        Ok(d)
    }
    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> augur::Result<()> {
        self.inner.observe(context, proposed, accepted)
    }
    fn reads_target(&self) -> augur::speculation::TargetReads {
        self.inner.reads_target()
    }
    fn target_hidden(&mut self, hidden: &augur::Tensor, accepted_rows: usize) -> augur::Result<()> {
        self.inner.target_hidden(hidden, accepted_rows)
    }
}

/// Our rounds `(cur_len, drafts)` with the assistant drafting `k` per round, and the output.
fn run_assisted(
    target: &mut augur::pipeline::LoadedLm,
    assistant: &Gemma4Assistant,
    input: &[u32],
    k: usize,
    max_new: usize,
) -> (Vec<(usize, Vec<u32>)>, Vec<u32>) {
    let opts = GenerationOptions { num_assistant_tokens: Some(k), ..greedy(max_new) };
    let cfg = augur::generation::config::GenerationConfig::from_options(&opts);
    let window = target.config().sliding_window;
    let drafter = Gemma4AssistantDrafter::new(assistant, &cfg, input.len(), window).unwrap();
    let mut rec = Recording { inner: drafter, drafts: Vec::new() };
    target.model.truncate(0);
    let mut emitter = Emitter::new(&target.tokenizer, input, max_new, vec![], vec![], None);
    let mut stats = GenerationStats::default();
    speculative::generate(target.model.as_mut(), &mut rec, &cfg, &mut emitter, &mut stats).unwrap();
    let rounds = rec.drafts.into_iter().filter(|(_, d)| !d.tokens.is_empty()).map(|(l, d)| (l, d.tokens)).collect();
    (rounds, emitter.generated().to_vec())
}

fn assistant_model(path: &str) -> Gemma4Assistant {
    augur::models::load_gemma4_assistant(&fixtures().join(path), &augur::Device::Cpu).unwrap()
}

#[test]
fn assistant_drafts_match_transformers() {
    let g = golden("gemma4.json");
    let max_new = g["spec_max_new_tokens"].as_u64().unwrap() as usize;
    let mut target = load(&fixtures().join("tiny-gemma4"), false);
    let assistant = &assistant_model("tiny-gemma4-assistant");
    let (mut fixed_rounds, mut stock_rounds, mut stale_rounds, mut accepted) = (0, 0, 0, 0);
    for run in g["assisted"].as_array().unwrap() {
        let input = ids(&run["input_ids"]);
        let k = run["num_assistant_tokens"].as_u64().unwrap() as usize;
        let (ours, out) = run_assisted(&mut target, assistant, &input, k, max_new);
        assert_eq!(out, ids(&run["plain_greedy"]), "k = {k}: output differs from plain greedy");
        let rounds = |name: &str| -> Vec<(usize, Vec<u32>, usize)> {
            run[name]["rounds"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["cur_len"].as_u64().unwrap() as usize, ids(&r["draft"]), r["n"].as_u64().unwrap() as usize))
                .collect()
        };
        // 5.24 with the shared KV cut to the accepted prefix: every round equal.
        let fixed = rounds("fixed");
        let ours_cmp: Vec<(usize, Vec<u32>)> = ours.clone();
        let theirs: Vec<(usize, Vec<u32>)> = fixed.iter().map(|(l, d, _)| (*l, d.clone())).collect();
        assert_eq!(ours_cmp, theirs, "k = {k}: drafts per round vs 5.24 with the stale-KV fix, prompt {input:?}");
        fixed_rounds += fixed.len();
        accepted += fixed.iter().map(|r| r.2).sum::<usize>();
        // Stock 5.24: equal up to the first round that follows a partial acceptance (its stale KV then shows).
        let stock = rounds("stock");
        for (i, (l, d, _)) in stock.iter().enumerate() {
            let stale = i > 0 && stock[i - 1].2 < stock[i - 1].1.len();
            if stale {
                stale_rounds += 1;
                break;
            }
            assert_eq!(ours[i], (*l, d.clone()), "k = {k}: round {i} vs stock 5.24, prompt {input:?}");
            stock_rounds += 1;
        }
        // The assistant's raw logits of the first drafting round.
        if let Some(want) = run["fixed"].get("first_round_logits") {
            let (l, _) = ours[0];
            let first = first_round_logits(&mut target, assistant, &input, l, &ours[0].1);
            for (i, (a, b)) in first.iter().zip(want.as_array().unwrap()).enumerate() {
                close(a, &floats(b), &format!("assistant logits, draft {i} of {input:?}"));
            }
        }
    }
    assert!(fixed_rounds >= 40 && accepted >= 10, "{fixed_rounds} rounds with {accepted} accepted drafts");
    assert!(stock_rounds >= 12 && stale_rounds > 0, "{stock_rounds} stock rounds compared, {stale_rounds} stale");
}

/// The assistant's raw logits for each draft of the first drafting round (after the prefill of `input` and its
/// first greedy token), recomputed by hand through the same public steps as the drafter.
fn first_round_logits(
    target: &mut augur::pipeline::LoadedLm,
    assistant: &Gemma4Assistant,
    input: &[u32],
    cur_len: usize,
    drafts: &[u32],
) -> Vec<Vec<f32>> {
    use augur::models::gemma4_assistant::SharedKv;
    use augur::models::LayerKind;
    assert_eq!(cur_len, input.len() + 1);
    target.model.truncate(0);
    let opts = ForwardOptions { hidden_states: true, ..ForwardOptions::logits(LogitRows::Last(1)) };
    let out = target.model.forward(input, &opts).unwrap();
    let first = augur::generation::sampler::argmax(&out.logits.unwrap().to_vec2::<f32>().unwrap()[0]);
    let hidden = out.hidden.unwrap();
    let p = input.len();
    let w = target.config().sliding_window.unwrap();
    let m = target.model.kv_sharing().expect("a Gemma 4 target shares its KV");
    let full = SharedKv { cache: m.shared_kv(LayerKind::Full).unwrap(), visible: (0, p) };
    let n = p.min(w + 1);
    let sliding = SharedKv { cache: m.shared_kv(LayerKind::Sliding).unwrap(), visible: (p - n, p) };
    let mut h = hidden.narrow(0, p - 1, 1).unwrap();
    let mut tok = first;
    let mut rows = Vec::new();
    for &d in drafts {
        let e = m.embed_tokens(&[tok]).unwrap();
        let x = candle_core::Tensor::cat(&[&e, &h], 1).unwrap().unsqueeze(0).unwrap();
        let (logits, next) = assistant.step(&x, p, &full, &sliding).unwrap();
        assert_eq!(augur::generation::sampler::argmax(&logits), d);
        rows.push(logits);
        h = next;
        tok = d;
    }
    rows
}

#[test]
fn assisted_greedy_is_lossless() {
    let g = golden("gemma4.json");
    let mut plain = pipeline("tiny-gemma4", None);
    let mut pipe = pipeline("tiny-gemma4", Some("tiny-gemma4-assistant"));
    for p in g["prompts"].as_array().unwrap() {
        let input = ids(&p["input_ids"]);
        for max_new in [1, 2, 7, 30] {
            let want = plain.generate_ids(&input, &greedy(max_new), None).unwrap().tokens;
            for (k, cost_aware) in [1, 2, 4, 8].into_iter().flat_map(|k| [(k, false), (k, true)]) {
                let o = GenerationOptions {
                    num_assistant_tokens: Some(k),
                    cost_aware_drafting: Some(cost_aware),
                    ..greedy(max_new)
                };
                let out = pipe.generate_ids(&input, &o, None).unwrap();
                assert_eq!(out.tokens, want, "k = {k}, max_new = {max_new}, cost-aware {cost_aware}, prompt {input:?}");
                assert_eq!(out.stats.method, "gemma4_assistant");
                // The prefill round drafts nothing; every later round drafts min(k, budget left − 1).
                if max_new >= 3 {
                    assert!(out.stats.drafted > 0, "k = {k}, max_new = {max_new}: nothing drafted");
                }
                if k >= 4 && max_new == 30 {
                    assert!(out.stats.rounds.iter().any(|&(g, _)| g >= 3), "k = {k}: rounds {:?}", out.stats.rounds);
                }
            }
        }
    }
}

#[test]
fn assistant_alone_or_with_another_target_is_a_clear_error() {
    let path = fixtures().join("tiny-gemma4-assistant");
    let Err(e) = augur::pipeline::LoadedLm::load(&path, &Default::default()) else {
        panic!("the assistant loaded as a model that runs on tokens alone")
    };
    assert!(e.to_string().contains("Gemma 4 target"), "{e}");
    let mut pipe = pipeline("tiny-gemma3", Some("tiny-gemma4-assistant"));
    let e = pipe.generate_ids(&[5, 6, 7], &greedy(4), None).unwrap_err();
    assert!(e.to_string().contains("only for a Gemma 4 target"), "{e}");
}

/// The greedy ensemble weight is applied (see [`assert_greedy_ensemble_is_applied`]).
#[test]
fn greedy_ensemble_weight_is_applied() {
    assert_greedy_ensemble_is_applied(
        "tiny-gemma4",
        Some("tiny-gemma4-assistant"),
        GenerationOptions { num_assistant_tokens: Some(3), cost_aware_drafting: Some(false), ..greedy(24) },
    );
}
