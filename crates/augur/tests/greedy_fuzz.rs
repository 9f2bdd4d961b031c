//! Greedy differential fuzzing: random drafters, draft lengths, schedules, confidence thresholds, processors,
//! stop strings, EOS ids, budgets and prompts, on every fixture and on SmolLM2, with cost-aware drafting on and
//! off; each speculative run must give plain greedy decoding's tokens, text and finish reason. Suffix decoding
//! and `auto` share one process-wide suffix cache across the cases (one owner per target), and a second test
//! runs them on concurrent forks sharing a cache.
//!
//! `AUGUR_FUZZ_CASES` (default 300, about a minute on the CI machine) cases are drawn from `AUGUR_FUZZ_SEED`
//! (default fixed); case `i` uses seed `AUGUR_FUZZ_SEED + i`, and a failure prints the one-line command that
//! runs that case alone. Run more with, for example, `AUGUR_FUZZ_CASES=5000 cargo test --release -p augur --test
//! greedy_fuzz`.

mod common;

use std::collections::HashMap;

use std::sync::Arc;

use augur::generation::config::GenerationOptions;
use augur::generation::output::GenerationOutput;
use augur::pipeline::{Assistant, CallOptions, Pipeline};
use augur::speculation::method::MethodName;
use augur::speculation::suffix_cache::{SuffixCache, SuffixCacheRef};
use common::*;

const DEFAULT_SEED: u64 = 0x5EED_F022;
const DEFAULT_CASES: u64 = 300;

/// A reproducible random source (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Which models a case runs, and the drafters they allow.
struct Setup {
    target: &'static str,
    /// A same-tokenizer assistant, a different-tokenizer one, MTP layers, a Gemma 4 assistant.
    assistant: Option<&'static str>,
    universal: Option<&'static str>,
    mtp: bool,
    gemma4: bool,
    /// How often it is drawn, relative to the others (the real model and the many-layer fixtures are slow).
    weight: u64,
}

const SETUPS: &[Setup] = &[
    Setup {
        target: "tiny-llama",
        assistant: Some("tiny-llama-assistant"),
        universal: Some("tiny-qwen2-metaspace"),
        mtp: false,
        gemma4: false,
        weight: 6,
    },
    Setup {
        target: "tiny-qwen2",
        assistant: Some("tiny-llama-assistant"),
        universal: None,
        mtp: false,
        gemma4: false,
        weight: 3,
    },
    Setup {
        target: "tiny-qwen2-metaspace",
        assistant: None,
        universal: Some("tiny-llama"),
        mtp: false,
        gemma4: false,
        weight: 2,
    },
    Setup {
        target: "tiny-gemma3",
        assistant: Some("tiny-llama-assistant"),
        universal: None,
        mtp: false,
        gemma4: false,
        weight: 3,
    },
    Setup { target: "tiny-gemma4", assistant: None, universal: None, mtp: false, gemma4: true, weight: 3 },
    Setup { target: "tiny-deepseek-v3-mtp2", assistant: None, universal: None, mtp: true, gemma4: false, weight: 3 },
    Setup { target: "tiny-deepseek-v3-mtp", assistant: None, universal: None, mtp: true, gemma4: false, weight: 1 },
    Setup { target: "tiny-glm4-moe-mtp", assistant: None, universal: None, mtp: true, gemma4: false, weight: 1 },
    Setup { target: SMOLLM2, assistant: None, universal: None, mtp: false, gemma4: false, weight: 2 },
];

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// One drawn case: the models, the prompt and the options (the drafter's among them).
struct Case {
    setup: &'static Setup,
    assistant: Option<&'static str>,
    prompt: Vec<u32>,
    options: GenerationOptions,
    method: &'static str,
}

fn draw(seed: u64, mut vocab: impl FnMut(&str) -> u32) -> Case {
    let mut r = Rng(seed | 1);
    let total: u64 = SETUPS.iter().map(|s| s.weight).sum();
    let mut w = r.below(total);
    let setup = SETUPS
        .iter()
        .find(|s| {
            w < s.weight || {
                w -= s.weight;
                false
            }
        })
        .unwrap();
    let v = vocab(setup.target);
    // A prompt that repeats itself, so that prompt lookup finds matches.
    let base: Vec<u32> = (0..1 + r.below(8)).map(|_| r.below(v as u64) as u32).collect();
    let mut prompt = Vec::new();
    for _ in 0..1 + r.below(4) {
        prompt.extend_from_slice(&base);
        if r.chance(50) {
            prompt.push(r.below(v as u64) as u32);
        }
    }
    let mut o = greedy(1 + r.below(40) as usize);
    o.cost_aware_drafting = Some(r.chance(50));
    if r.chance(30) {
        o.repetition_penalty = Some(*r.pick(&[0.8, 1.2, 1.5, 3.0]));
    }
    if r.chance(30) {
        o.eos_token_id = Some((0..1 + r.below(3)).map(|_| r.below(v as u64) as u32).collect());
        if r.chance(50) {
            o.min_new_tokens = Some(r.below(6) as usize);
        }
    }
    let mut methods = vec!["prompt_lookup", "suffix", "auto"];
    if !setup.gemma4 {
        // Gemma 4's per-layer inputs and KV sharing leave early exit unsupported there.
        methods.push("early_exit");
    }
    if setup.assistant.is_some() {
        methods.push("assistant_model");
    }
    if setup.universal.is_some() {
        methods.push("universal_assisted");
    }
    if setup.mtp {
        methods.extend(["mtp", "mtp"]);
    }
    if setup.gemma4 {
        methods.extend(["gemma4_assistant", "gemma4_assistant"]);
    }
    let method = *r.pick(&methods);
    // Trees, for the drafters that propose them, on targets that verify them (not Gemma 4).
    if matches!(method, "prompt_lookup" | "assistant_model") && !setup.gemma4 && r.chance(50) {
        o.speculative_eagle_topk = Some(2 + r.below(3) as usize);
        o.speculative_num_draft_tokens = Some(1 + r.below(24) as usize);
        if r.chance(50) {
            o.speculative_num_steps = Some(1 + r.below(8) as usize);
        }
    }
    let mut assistant = None;
    match method {
        "prompt_lookup" => {
            o.prompt_lookup_num_tokens = Some(1 + r.below(10) as usize);
            o.max_matching_ngram_size = Some(r.below(4) as usize);
        }
        "mtp" => o.use_mtp = Some(true),
        "suffix" | "auto" => {
            o.suffix_max_depth = Some(1 + r.below(32) as usize);
            o.suffix_max_spec_factor = Some(*r.pick(&[0.5, 1.0, 2.0, 4.0]));
            o.suffix_min_token_prob = Some(*r.pick(&[0.0, 0.1, 0.3]));
            o.suffix_global_cache = Some(r.chance(70));
            if method == "auto" && r.chance(50) {
                assistant = setup.assistant;
                o.num_assistant_tokens = Some(1 + r.below(8) as usize);
            }
        }
        _ => {
            if method == "early_exit" {
                o.assistant_early_exit = Some(1 + r.below(2) as usize);
            }
            assistant = match method {
                "assistant_model" => setup.assistant,
                "universal_assisted" => setup.universal,
                "gemma4_assistant" => Some("tiny-gemma4-assistant"),
                _ => None,
            };
            o.num_assistant_tokens = Some(1 + r.below(8) as usize);
            o.num_assistant_tokens_schedule =
                Some(r.pick(&["constant", "heuristic", "heuristic_transient"]).to_string());
            o.assistant_confidence_threshold = Some(*r.pick(&[0.0, 0.2, 0.4, 0.7]));
        }
    }
    Case { setup, assistant, prompt, options: o, method }
}

/// Loaded pipelines, by target and assistant.
#[derive(Default)]
struct Pipelines(HashMap<(&'static str, Option<&'static str>), Pipeline>);

impl Pipelines {
    fn get(&mut self, target: &'static str, assistant: Option<&'static str>) -> &mut Pipeline {
        self.0.entry((target, assistant)).or_insert_with(|| {
            let path = |name: &str| if name == SMOLLM2 { real_model(name) } else { fixtures().join(name) };
            let t = load(&path(target), false);
            let a = assistant.map(|a| Assistant::load(&path(a), &Default::default(), &t.tokenizer).unwrap());
            Pipeline { target: t, assistant: a, defaults: GenerationOptions::default() }
        })
    }
}

#[test]
fn greedy_speculation_equals_plain_greedy() {
    let env =
        |k: &str| std::env::var(k).ok().map(|v| v.parse::<u64>().unwrap_or_else(|_| panic!("{k}={v}: not a number")));
    let seed = env("AUGUR_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let cases = env("AUGUR_FUZZ_CASES").unwrap_or(DEFAULT_CASES);
    let mut pipes = Pipelines::default();
    let cache = Arc::new(SuffixCache::new(4096));
    let mut vocabs = HashMap::new();
    let mut by_method: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut tree_rounds: HashMap<&str, usize> = HashMap::new();
    for i in 0..cases {
        let case_seed = seed.wrapping_add(i);
        let case = draw(case_seed, |t| {
            *vocabs.entry(t.to_string()).or_insert_with(|| {
                pipes.get(SETUPS.iter().find(|s| s.target == t).unwrap().target, None).target.config().vocab_size as u32
            })
        });
        let mut case = case;
        if let Some(l) = case.options.assistant_early_exit {
            let layers = pipes.get(case.setup.target, None).target.config().num_hidden_layers;
            case.options.assistant_early_exit = Some(l.min(layers - 1));
        }
        let repro =
            format!("AUGUR_FUZZ_SEED={case_seed} AUGUR_FUZZ_CASES=1 cargo test --release -p augur --test greedy_fuzz");
        let plain_pipe = pipes.get(case.setup.target, None);
        let mut plain_opts = greedy(0);
        plain_opts.max_new_tokens = case.options.max_new_tokens;
        plain_opts.repetition_penalty = case.options.repetition_penalty;
        plain_opts.eos_token_id = case.options.eos_token_id.clone();
        plain_opts.min_new_tokens = case.options.min_new_tokens;
        // A stop string from the plain output's text, sometimes.
        let mut stop = None;
        let free = plain_pipe.generate_ids(&case.prompt, &plain_opts, None).unwrap();
        if free.text.chars().count() > 3 && Rng(case_seed ^ 0xABCD).chance(30) {
            let n = free.text.chars().count();
            let mut r = Rng(case_seed ^ 0x1234);
            let (a, len) = (r.below(n as u64 - 1) as usize, 1 + r.below(3) as usize);
            stop = Some(free.text.chars().skip(a).take(len).collect::<String>());
        }
        plain_opts.stop_strings = stop.clone().map(|s| vec![s]);
        let want =
            if stop.is_some() { plain_pipe.generate_ids(&case.prompt, &plain_opts, None).unwrap() } else { free };
        let options = GenerationOptions { stop_strings: stop.map(|s| vec![s]), ..case.options.clone() };
        let call = CallOptions {
            method: (case.method == "auto").then_some(MethodName::Auto),
            suffix_cache: Some(SuffixCacheRef { cache: Arc::clone(&cache), owner: case.setup.target.into() }),
            ..CallOptions::new(options.clone())
        };
        let got: GenerationOutput = pipes
            .get(case.setup.target, case.assistant)
            .call_ids(&case.prompt, &call, None)
            .unwrap_or_else(|e| panic!("{e}\nreproduce: {repro}"));
        let what = || {
            format!(
                "{} on {} with {:?}, prompt {:?}\nreproduce: {repro}",
                case.method, case.setup.target, options, case.prompt
            )
        };
        assert_eq!(got.stats.method, case.method, "{}", what());
        assert_eq!(got.tokens, want.tokens, "{}", what());
        assert_eq!(got.text, want.text, "{}", what());
        assert_eq!(got.finish_reason, want.finish_reason, "{}", what());
        let e = by_method.entry(case.method).or_default();
        e.0 += 1;
        e.1 += got.stats.drafted;
        *tree_rounds.entry(case.method).or_default() += got.stats.tree_rounds;
    }
    println!(
        "cases and drafted tokens by method: {by_method:?}; rounds that verified branching trees: {tree_rounds:?}"
    );
    if cases >= DEFAULT_CASES {
        // Every drafter was drawn, and drafted.
        let all = ["prompt_lookup", "suffix", "auto", "early_exit", "assistant_model", "universal_assisted", "mtp"];
        for m in all.into_iter().chain(["gemma4_assistant"]) {
            let (n, drafted) = by_method.get(m).copied().unwrap_or_default();
            assert!(n > 0 && drafted > 0, "{m}: {n} cases, {drafted} drafted tokens");
        }
        assert!(cache.outputs() > 0, "no output reached the suffix cache");
        for m in ["prompt_lookup", "assistant_model", "suffix"] {
            assert!(tree_rounds.get(m).copied().unwrap_or(0) > 0, "{m} never verified a branching tree");
        }
    }
}

/// Suffix decoding and `auto` on concurrent forks of one pipeline, sharing one suffix cache: every output is
/// plain greedy decoding's, drafts were made, and later requests found earlier outputs in the cache.
#[test]
fn concurrent_requests_sharing_a_suffix_cache_decode_plain_greedy() {
    let pipe = Pipeline {
        target: load(&fixtures().join("tiny-llama"), false),
        assistant: None,
        defaults: GenerationOptions::default(),
    };
    let vocab = pipe.target.config().vocab_size as u64;
    // Prompts built from a few shared phrases, so that outputs repeat across requests.
    let mut r = Rng(7);
    let phrases: Vec<Vec<u32>> = (0..3).map(|_| (0..4 + r.below(4)).map(|_| r.below(vocab) as u32).collect()).collect();
    let prompts: Vec<Vec<u32>> =
        (0..16).map(|_| (0..1 + r.below(3)).flat_map(|_| r.pick(&phrases).clone()).collect()).collect();
    let mut plain_pipe = pipe.fork().unwrap();
    let want: Vec<Vec<u32>> =
        prompts.iter().map(|p| plain_pipe.generate_ids(p, &greedy(24), None).unwrap().tokens).collect();
    let cache = Arc::new(SuffixCache::new(1 << 16));
    let drafted: usize = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let (mut fork, cache, prompts, want) = (pipe.fork().unwrap(), Arc::clone(&cache), &prompts, &want);
                s.spawn(move || {
                    let mut drafted = 0;
                    for i in (w..prompts.len()).step_by(4) {
                        let method = if i % 2 == 0 { MethodName::Auto } else { MethodName::Suffix };
                        let call = CallOptions {
                            method: Some(method),
                            suffix_cache: Some(SuffixCacheRef { cache: Arc::clone(&cache), owner: String::new() }),
                            ..CallOptions::new(greedy(24))
                        };
                        let got = fork.call_ids(&prompts[i], &call, None).unwrap();
                        assert_eq!(got.tokens, want[i], "{method} on prompt {i}: {:?}", prompts[i]);
                        drafted += got.stats.drafted;
                    }
                    drafted
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    assert!(drafted > 0, "no request drafted");
    assert_eq!(cache.outputs(), prompts.len(), "every request's output joins the cache");
}
