//! Universal assisted decoding (assistant and target with different tokenizers): the greedy drafts equal
//! Transformers' round by round, greedy output equals plain greedy on the tiny fixtures and on real model pairs,
//! and universal sampling keeps the target's distribution while Transformers' misaligned `q` does not.

mod common;

use std::collections::HashMap;

use augur::generation::config::{GenerationConfig, GenerationOptions};
use augur::generation::output::{Emitter, GenerationStats};
use augur::models::CausalLm;
use augur::pipeline::{Assistant, Pipeline, Prompt};
use augur::speculation::methods::{UniversalAssisted, UniversalSampling};
use augur::speculation::speculative;
use augur::speculation::{Draft, Drafter};
use common::*;

const ASSISTANT: &str = "tiny-qwen2-metaspace";

/// Records what the wrapped drafter proposed each round.
struct Recording<D> {
    inner: D,
    drafts: Vec<Vec<u32>>,
}

impl<D: Drafter> Drafter for Recording<D> {
    fn method(&self) -> &'static str {
        self.inner.method()
    }
    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> augur::Result<Draft> {
        let d = self.inner.propose(target, context, max)?;
        self.drafts.push(d.tokens.clone());
        Ok(d)
    }
    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> augur::Result<()> {
        self.inner.observe(context, proposed, accepted)
    }
}

/// Our drafts and acceptances equal Transformers' per-round candidates (`universal.json`), with
/// `cost_aware_drafting` off (Transformers drafts every round). Two Transformers 5.24 defects would otherwise make
/// the rounds differ (the final tokens never do), and the golden is recorded around them (see
/// tools/fixtures/generate_universal.py):
/// - the assistant's attention mask is inferred from the *target's* pad id, so assistant tokens with that id are
///   masked out of its input; the golden passes a target pad id outside the assistant's vocabulary, where the
///   defect cannot reach (`pad_defect` records that the target's own pad id, 0 = the assistant's `<unk>`, changes
///   the drafts of the first run);
/// - the assistant's cache is cropped to `len − 2 − remove_from_pkv`, which keeps stale keys and values when the
///   re-encoded target tokens replace some and add more than two; in the one run where that happens, we compare
///   with `rounds_cache_fixed` (Transformers with only those stale entries cropped), and the rounds before
///   `first_stale_round` are Transformers' own, checked here to equal the fixed ones.
#[test]
fn greedy_drafts_match_transformers_round_by_round() {
    let g = golden("universal.json");
    let mut target = load(&fixtures().join("tiny-llama"), false);
    let mut assistant = load(&fixtures().join(ASSISTANT), false);
    let max_new = g["max_new_tokens"].as_u64().unwrap() as usize;
    let (mut rounds_checked, mut accepted_total) = (0, 0);
    for config in g["configs"].as_array().unwrap() {
        let settings = config["settings_on_assistant_generation_config"].as_object().unwrap();
        let mut options = GenerationOptions::from_json_map(settings).unwrap();
        options.merge(&greedy(max_new));
        // The cost model skips drafting on timings; Transformers drafts every round.
        options.cost_aware_drafting = Some(false);
        let cfg = GenerationConfig::from_options(&options);
        for run in config["runs"].as_array().unwrap() {
            let prompt = ids(&run["input_ids"]);
            target.model.truncate(0);
            let eos = assistant.tokenizer.eos_token_ids().to_vec();
            let inner =
                UniversalAssisted::new(assistant.model.as_mut(), &target.tokenizer, &assistant.tokenizer, &eos, &cfg);
            let mut drafter = Recording { inner, drafts: Vec::new() };
            let mut emitter = Emitter::new(&target.tokenizer, &prompt, max_new, vec![], vec![], None);
            let mut stats = GenerationStats::default();
            speculative::generate(target.model.as_mut(), &mut drafter, &cfg, &mut emitter, &mut stats).unwrap();
            let out = emitter.into_output(stats);
            assert_eq!(out.tokens, ids(&run["output"]), "{settings:?} {:?}", run["text"]);
            let transformers = run["rounds"].as_array().unwrap();
            let want = match run.get("rounds_cache_fixed") {
                Some(fixed) => {
                    let fixed = fixed.as_array().unwrap();
                    let first_stale = run["first_stale_round"].as_u64().unwrap() as usize;
                    for (raw, fix) in transformers.iter().zip(fixed).take(first_stale) {
                        assert_eq!(raw["draft"], fix["draft"]);
                        assert_eq!(raw["n"], fix["n"]);
                    }
                    fixed
                }
                None => transformers,
            };
            assert_eq!(drafter.drafts.len(), want.len(), "rounds for {settings:?} {:?}", run["text"]);
            for (i, (got, r)) in drafter.drafts.iter().zip(want).enumerate() {
                let cur_len = r["cur_len"].as_u64().unwrap() as usize;
                // Transformers caps the candidates at the length budget, we one below it (the target adds a
                // token of its own): the last round may differ by that one token.
                let room = prompt.len() + max_new - cur_len - 1;
                let mut hf = ids(&r["draft"]);
                hf.truncate(room);
                assert_eq!(got, &hf, "round {i} of {settings:?} {:?}", run["text"]);
                assert_eq!(out.stats.rounds[i].1, r["n"].as_u64().unwrap() as usize, "accepted in round {i}");
                accepted_total += out.stats.rounds[i].1;
                rounds_checked += 1;
            }
        }
    }
    assert!(rounds_checked > 100, "{rounds_checked} rounds");
    assert!(accepted_total > 0, "no draft was ever accepted: the golden exercises no multi-token round");
}

fn plain_and_universal(pipe: &mut Pipeline, prompt: &[u32], options: &GenerationOptions) {
    let plain_pipe_assistant = pipe.assistant.take();
    let plain = pipe.generate_ids(prompt, options, None).unwrap();
    pipe.assistant = plain_pipe_assistant;
    let uni = pipe.generate_ids(prompt, options, None).unwrap();
    assert_eq!(uni.stats.method, "universal_assisted");
    if options.cost_aware_drafting == Some(false) {
        assert!(uni.stats.drafted > 0, "prompt {prompt:?}: nothing drafted");
    }
    assert_eq!(uni.tokens, plain.tokens, "prompt {prompt:?}");
    assert_eq!(uni.text, plain.text);
}

#[test]
fn universal_greedy_is_lossless_on_tiny_fixtures_both_ways() {
    let g = golden("universal.json");
    let prompts: Vec<Vec<u32>> =
        g["configs"][0]["runs"].as_array().unwrap().iter().map(|r| ids(&r["input_ids"])).collect();
    let options = [
        greedy(32),
        GenerationOptions { num_assistant_tokens: Some(3), assistant_confidence_threshold: Some(0.0), ..greedy(32) },
        GenerationOptions { num_assistant_tokens_schedule: Some("heuristic".into()), ..greedy(32) },
    ]
    .map(|o| [GenerationOptions { cost_aware_drafting: Some(false), ..o.clone() }, o])
    .concat();
    let mut forward = pipeline("tiny-llama", Some(ASSISTANT));
    for p in &prompts {
        for o in &options {
            plain_and_universal(&mut forward, p, o);
        }
    }
    // The other way round: the Metaspace-tokenized model is the target, prompts in its tokens.
    let mut backward = pipeline(ASSISTANT, Some("tiny-llama"));
    for r in g["configs"][0]["runs"].as_array().unwrap() {
        let p = backward.encode(&Prompt::Text(r["text"].as_str().unwrap().into()), true).unwrap();
        for o in &options {
            plain_and_universal(&mut backward, &p, o);
        }
    }
}

/// Short Spec-Bench questions, first of a few categories (long ones would make the test minutes long on 2
/// cores).
fn spec_bench_prompts(n: usize) -> Vec<String> {
    let path = spec_bench_questions();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let q: serde_json::Value = serde_json::from_str(line).unwrap();
        let turn = q["turns"][0].as_str().unwrap();
        if turn.len() <= 300 && seen.insert(q["category"].as_str().unwrap().to_string()) && out.len() < n {
            out.push(turn.to_string());
        }
    }
    assert_eq!(out.len(), n);
    out
}

#[test]
fn universal_greedy_is_lossless_on_smollm2_and_gemma3() {
    let smollm2 = load(&real_model("SmolLM2-135M-Instruct.Q4_1.gguf"), false);
    let gemma = load(&real_model("gemma-3-270m-q4_k_m.gguf"), false);
    let prompts = spec_bench_prompts(2);
    // Transformers' fixed rounds: the cost model's choice depends on measured times, so on a loaded machine it
    // may not draft at all, and this test must see drafts accepted.
    let options =
        GenerationOptions { max_new_tokens: Some(24), cost_aware_drafting: Some(false), ..Default::default() };
    let mut pipe = Pipeline { target: smollm2, assistant: Some(Assistant::Lm(gemma)), defaults: Default::default() };
    let mut accepted = 0;
    for _direction in 0..2 {
        for p in &prompts {
            let ids = pipe.encode(&Prompt::Text(p.clone()), true).unwrap();
            let assistant = pipe.assistant.take();
            let plain = pipe.generate_ids(&ids, &options, None).unwrap();
            pipe.assistant = assistant;
            let uni = pipe.generate_ids(&ids, &options, None).unwrap();
            assert_eq!(uni.stats.method, "universal_assisted");
            assert_eq!(uni.tokens, plain.tokens, "{} on {p:?}", pipe.target.path.display());
            accepted += uni.stats.accepted;
        }
        // The other way round: Gemma 3 verifies SmolLM2's drafts.
        let Some(Assistant::Lm(a)) = pipe.assistant.take() else { panic!("a causal LM assistant") };
        pipe.assistant = Some(Assistant::Lm(std::mem::replace(&mut pipe.target, a)));
    }
    assert!(accepted > 0, "the real assistants never got a draft accepted");
}

// ---------------------------------------------------------------------------------------------------------------
// Sampling

/// The shared sampling options without the cost model, which drafts or not on timings: seeded draws are
/// reproducible only without it.
fn sampling(seed: u64) -> GenerationOptions {
    GenerationOptions { cost_aware_drafting: Some(false), ..common::sampling(seed) }
}

fn sampling_prompt() -> Vec<u32> {
    ids(&golden("universal.json")["configs"][0]["runs"][0]["input_ids"])
}

fn plain_draws(prompt: &[u32]) -> HashMap<Vec<u32>, usize> {
    let mut pipe = pipeline("tiny-llama", None);
    histogram(DRAWS, |s| pipe.generate_ids(prompt, &sampling(s + 1_000_000), None).unwrap().tokens)
}

/// Transformers 5.24's layout of `q` (spec 8.4): the pruned LM head's column `k` is assistant token
/// `overlap[k]`, in the iteration order of the assistant's vocabulary dict (here: by token string, one order a
/// hash map may give), but its probability is written at the target id of the `k`-th overlapping assistant
/// token in ascending id order. The drafted tokens themselves are right, and are verified as Transformers
/// verifies them: a draft whose misplaced `q` is 0 has `p/q = ∞` and is accepted whenever `p > 0`.
struct Misaligned<'m, 't> {
    inner: UniversalSampling<'m, 't>,
    /// `(from, to)` target ids: `q_transformers[to] = q[from]`.
    moves: Vec<(usize, usize)>,
    /// Drafts, and those whose misplaced `q` was 0.
    drafted: usize,
    zero_q: usize,
}

impl<'m, 't> Misaligned<'m, 't> {
    fn new(inner: UniversalSampling<'m, 't>, assistant_tok: &augur::tokenizer::Tokenizer) -> Self {
        let a2t = &inner.vocab_map().assistant_to_target;
        let ascending: Vec<usize> = (0..a2t.len()).filter(|&a| a2t[a].is_some()).collect();
        let mut dict_order = ascending.clone();
        dict_order.sort_by_key(|&a| assistant_tok.id_to_token(a as u32).unwrap());
        let moves = dict_order
            .iter()
            .zip(&ascending)
            .map(|(&col, &slot)| (a2t[col].unwrap() as usize, a2t[slot].unwrap() as usize))
            .collect();
        Self { inner, moves, drafted: 0, zero_q: 0 }
    }
}

impl Drafter for Misaligned<'_, '_> {
    fn method(&self) -> &'static str {
        "misaligned"
    }
    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> augur::Result<Draft> {
        let mut d = self.inner.propose(target, context, max)?;
        for (q, &token) in d.q.iter_mut().flatten().zip(&d.tokens) {
            let mut moved = vec![0.0; q.len()];
            for &(from, to) in &self.moves {
                moved[to] = q[from];
            }
            // Transformers accepts a draft whose q is 0 (p/q = ∞); our verifier refuses it (it cannot have been
            // drawn). The smallest positive q is accepted whenever p > 0, as by Transformers.
            self.drafted += 1;
            if moved[token as usize] == 0.0 {
                moved[token as usize] = f32::MIN_POSITIVE;
                self.zero_q += 1;
            }
            q.copy_from_slice(&moved);
        }
        Ok(d)
    }
    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> augur::Result<()> {
        self.inner.observe(context, proposed, accepted)
    }
}

/// The same chi-square as `universal_sampling_keeps_the_target_distribution` (same prompt, options and draws)
/// catches Transformers' misplaced `q`: most drafts then have `q = 0` and are accepted outright, so the first
/// token follows the assistant's distribution instead of the target's (statistic ≈ 3000 against a critical
/// value ≈ 67, where ours gives ≈ 19).
#[test]
fn transformers_misaligned_q_fails_the_test() {
    let prompt = sampling_prompt();
    let plain = plain_draws(&prompt);
    let mut target = load(&fixtures().join("tiny-llama"), false);
    let mut assistant = load(&fixtures().join(ASSISTANT), false);
    let vocab = target.config().vocab_size;
    let (mut drafted, mut zero_q) = (0, 0);
    let misplaced = histogram(DRAWS, |s| {
        let cfg = GenerationConfig::from_options(&sampling(s));
        target.model.truncate(0);
        let inner = UniversalSampling::new(
            assistant.model.as_mut(),
            &target.tokenizer,
            &assistant.tokenizer,
            &cfg,
            prompt.len(),
            vocab,
        )
        .unwrap();
        let mut drafter = Misaligned::new(inner, &assistant.tokenizer);
        assert!(drafter.moves.iter().any(|(a, b)| a != b), "the two orders agree: nothing is misaligned");
        let mut emitter = Emitter::new(&target.tokenizer, &prompt, 2, vec![], vec![], None);
        let mut stats = GenerationStats::default();
        speculative::generate(target.model.as_mut(), &mut drafter, &cfg, &mut emitter, &mut stats).unwrap();
        (drafted, zero_q) = (drafted + drafter.drafted, zero_q + drafter.zero_q);
        emitter.into_output(stats).tokens
    });
    assert!(zero_q * 2 > drafted, "only {zero_q} of {drafted} drafts had a misplaced q of 0");
    let (stat, critical) = chi_square(&plain, &misplaced);
    assert!(stat > critical, "the misaligned q went unnoticed: chi-square {stat:.1} < {critical:.1}");
}
