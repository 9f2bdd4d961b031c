//! Early-exit self-speculation and static ensemble verification:
//! - per-round goldens against Transformers 5.24 (`tools/fixtures/generate_early_exit.py`): outputs, (γ, n) per
//!   round and the drafts themselves, for several exit layers, schedules and greedy ensemble weights;
//! - the lossless property (greedy early exit equals plain greedy) for every exit layer on three architectures;
//! - the shared cache: reusing the early layers' drafted positions gives bit-identical logits, and cutting them
//!   back forgets them;
//! - the ensemble goldens with cost-aware drafting at its default.
//!
//! Sampling with early exit, and the ensemble's mixture, are tested in `exact_distribution.rs`.

mod common;

use augur::generation::config::{GenerationConfig, GenerationOptions};
use augur::models::{CausalLm, ForwardOptions, LogitRows};
use augur::speculation::methods::EarlyExit;
use augur::speculation::Drafter;
use common::*;
use serde_json::Value;

fn knobs(eff: &Value, base: GenerationOptions) -> GenerationOptions {
    GenerationOptions {
        num_assistant_tokens: eff["num_assistant_tokens"].as_u64().map(|v| v as usize),
        num_assistant_tokens_schedule: eff["num_assistant_tokens_schedule"].as_str().map(String::from),
        assistant_confidence_threshold: eff["assistant_confidence_threshold"].as_f64().map(|v| v as f32),
        ..base
    }
}

fn options_for(g: &Value, c: &Value) -> GenerationOptions {
    let mut opts = knobs(&c["effective"], greedy(g["max_new_tokens"].as_u64().unwrap() as usize));
    opts.assistant_early_exit = c["assistant_early_exit"].as_u64().map(|v| v as usize);
    opts.assistant_ensemble_weight = c["assistant_ensemble_weight"].as_f64().map(|v| v as f32);
    // Recorded without scikit-learn: Transformers keeps the assistant's threshold fixed.
    assert_eq!(g["versions"]["sklearn_installed"], false);
    opts.assistant_confidence_adaptive = Some(false);
    // Transformers' round structure (the ensemble's output depends on it too).
    opts.cost_aware_drafting = Some(false);
    opts
}

#[test]
fn rounds_match_transformers() {
    let g = golden("early_exit.json");
    let mut checked = 0;
    let mut ensemble = 0;
    for c in g["configs"].as_array().unwrap() {
        let method = c["method"].as_str().unwrap();
        let opts = options_for(&g, c);
        let mut pipe = match method {
            "early_exit" => pipeline("tiny-llama", None),
            "assistant_model" => pipeline("tiny-llama", Some("tiny-llama-assistant")),
            other => panic!("unknown method {other}"),
        };
        for run in c["runs"].as_array().unwrap() {
            let input = ids(&run["input_ids"]);
            let out = pipe.generate_ids(&input, &opts, None).unwrap();
            let (exit, w) = (&c["assistant_early_exit"], &c["assistant_ensemble_weight"]);
            let what = format!("{method} L={exit} w={w} {}", c["effective"]);
            assert_eq!(out.stats.method, method);
            assert_eq!(out.tokens, ids(&run["output"]), "{what}: output on {:?}", run["text"]);
            let theirs: Vec<(usize, usize)> = run["rounds"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["gamma"].as_u64().unwrap() as usize, r["n"].as_u64().unwrap() as usize))
                .collect();
            assert_eq!(out.stats.rounds, theirs, "{what}: (γ, n) per round on {:?}", run["text"]);
            checked += 1;
            ensemble += usize::from(opts.assistant_ensemble_weight.is_some());
        }
    }
    assert!(checked >= 40 && ensemble >= 12, "only {checked} runs ({ensemble} with an ensemble weight) checked");
}

/// The ensemble goldens hold with cost-aware drafting left at its default: under an ensemble weight the rounds
/// decide the output (a draft position follows ν, a plain step p), so the cost model must not shape them.
#[test]
fn ensemble_goldens_hold_with_cost_aware_drafting_at_its_default() {
    let g = golden("early_exit.json");
    let mut checked = 0;
    for c in g["configs"].as_array().unwrap().iter().filter(|c| c["assistant_ensemble_weight"].is_number()) {
        let opts = GenerationOptions { cost_aware_drafting: None, ..options_for(&g, c) };
        let mut pipe = match c["method"].as_str().unwrap() {
            "early_exit" => pipeline("tiny-llama", None),
            _ => pipeline("tiny-llama", Some("tiny-llama-assistant")),
        };
        for run in c["runs"].as_array().unwrap() {
            let out = pipe.generate_ids(&ids(&run["input_ids"]), &opts, None).unwrap();
            assert_eq!(out.tokens, ids(&run["output"]), "w={} on {:?}", c["assistant_ensemble_weight"], run["text"]);
            assert!(out.stats.drafted > 0);
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} ensemble runs");
}

/// Each recorded draft, re-drafted from a cold cache by the early-exit drafter alone.
#[test]
fn drafts_match_transformers() {
    let g = golden("early_exit.json");
    let mut lm = load(&fixtures().join("tiny-llama"), false);
    let layers = lm.config().num_hidden_layers;
    let mut checked = 0;
    for c in g["configs"].as_array().unwrap() {
        let Some(exit) = c["assistant_early_exit"].as_u64().map(|v| v as usize) else { continue };
        let cfg = GenerationConfig::from_options(&options_for(&g, c));
        for run in c["runs"].as_array().unwrap() {
            let input = ids(&run["input_ids"]);
            let output = ids(&run["output"]);
            for r in run["rounds"].as_array().unwrap() {
                let len = r["cur_len"].as_u64().unwrap() as usize;
                let mut context = input.clone();
                context.extend_from_slice(&output[..len - input.len()]);
                let want = ids(&r["draft"]);
                lm.model.truncate(0);
                let mut d = EarlyExit::new(exit, layers, &cfg, input.len()).unwrap();
                let draft = d.propose(lm.model.as_mut(), &context, want.len()).unwrap();
                assert_eq!(draft.tokens, want, "L={exit} draft at length {len} on {:?}", run["text"]);
                assert_eq!(lm.model.cache_len(), 0, "drafting must not advance the verified cache");
                checked += 1;
            }
        }
    }
    assert!(checked >= 100, "only {checked} drafts checked");
}

/// Prompts with repetition of several lengths, from a fixed seed.
fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    let mut next = token_stream(0x9E3779B97F4A7C15u64, vocab);
    (0..4)
        .map(|i| {
            let base: Vec<u32> = (0..2 + 2 * i).map(|_| next()).collect();
            let mut p = base.clone();
            p.push(next());
            p.extend_from_slice(&base);
            p
        })
        .collect()
}

#[test]
fn early_exit_is_lossless() {
    for target in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        let mut pipe = pipeline(target, None);
        let layers = pipe.target.config().num_hidden_layers;
        for (i, input) in prompts(300).iter().enumerate() {
            let base = greedy(26 + 3 * i);
            let want = pipe.generate_ids(input, &base, None).unwrap().tokens;
            for exit in 1..layers {
                let settings =
                    [(1, "constant", 0.0), (3, "constant", 0.0), (4, "heuristic", 0.0), (20, "constant", 0.4)];
                for ((k, schedule, threshold), cost_aware) in settings.into_iter().flat_map(|s| [(s, false), (s, true)])
                {
                    let opts = GenerationOptions {
                        assistant_early_exit: Some(exit),
                        num_assistant_tokens: Some(k),
                        num_assistant_tokens_schedule: Some(schedule.into()),
                        assistant_confidence_threshold: Some(threshold),
                        cost_aware_drafting: Some(cost_aware),
                        ..base.clone()
                    };
                    let out = pipe.generate_ids(input, &opts, None).unwrap();
                    let what = format!(
                        "{target} prompt {i} L={exit} k={k} {schedule} threshold {threshold} cost-aware {cost_aware}"
                    );
                    assert_eq!(out.tokens, want, "{what}");
                    assert_eq!(out.stats.method, "early_exit");
                    assert!(out.stats.drafted > 0, "{what}");
                    if !cost_aware && k >= 3 && threshold == 0.0 && schedule == "constant" {
                        let long = out.stats.rounds.iter().filter(|&&(g, _)| g >= 3).count();
                        assert!(long >= 3, "{what}: rounds {:?}", out.stats.rounds);
                    }
                }
            }
        }
    }
}

#[test]
fn early_exit_takes_precedence_and_checks_the_layer() {
    let mut pipe = pipeline("tiny-llama", Some("tiny-llama-assistant"));
    let input = &prompts(300)[1];
    let opts = GenerationOptions { assistant_early_exit: Some(2), prompt_lookup_num_tokens: Some(3), ..greedy(8) };
    assert_eq!(pipe.generate_ids(input, &opts, None).unwrap().stats.method, "early_exit");
    for bad in [0, 4, 9] {
        let opts = GenerationOptions { assistant_early_exit: Some(bad), ..greedy(8) };
        let e = pipe.generate_ids(input, &opts, None).unwrap_err().to_string();
        assert!(e.contains("`assistant_early_exit` must be between 1 and 3") && e.contains(&bad.to_string()), "{e}");
    }
    let opts =
        GenerationOptions { prompt_lookup_num_tokens: Some(3), assistant_ensemble_weight: Some(0.5), ..greedy(8) };
    let e = pipe.generate_ids(input, &opts, None).unwrap_err().to_string();
    assert!(e.contains("requires candidate logits"), "{e}");
}

fn logits_of(model: &mut dyn CausalLm, tokens: &[u32], exit: Option<usize>) -> Vec<Vec<f32>> {
    let opts = ForwardOptions { exit_layer: exit, ..ForwardOptions::logits(LogitRows::All) };
    model.forward(tokens, &opts).unwrap().logits.unwrap().to_vec2::<f32>().unwrap()
}

/// Positions drafted through the first layers are reused by the next full forward where its tokens match, giving
/// the logits of never having drafted, bit for bit (a row's numbers do not depend on its block); unmatched or
/// cut-back positions are forgotten.
#[test]
fn drafted_positions_are_reused_exactly_and_cut_back() {
    for target in ["tiny-llama", "tiny-gemma3"] {
        let mut a = load(&fixtures().join(target), false);
        let mut b = load(&fixtures().join(target), false);
        let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % 400).collect();
        let plain = logits_of(b.model.as_mut(), &prompt, None);
        // Draft the whole prompt and three more tokens through two layers, one block then one at a time.
        let early = logits_of(a.model.as_mut(), &prompt, Some(2));
        assert_eq!(a.model.cache_len(), 0);
        assert_ne!(early, plain, "{target}: two layers must not give the full model's logits");
        for t in [7, 8, 9] {
            logits_of(a.model.as_mut(), &[t], Some(2));
        }
        // The full forward of the prompt reuses every early position of the prompt.
        assert_eq!(logits_of(a.model.as_mut(), &prompt, None), plain, "{target}: prompt");
        assert_eq!(a.model.cache_len(), prompt.len());
        // Drafts 7, 8, 9 were dropped by that forward (they were not fed): feeding 7, 8 now is computed afresh.
        let want = logits_of(b.model.as_mut(), &[7, 8, 3], None);
        for t in [7, 8, 9] {
            logits_of(a.model.as_mut(), &[t], Some(3));
        }
        // Two of the three drafts match; the third position is recomputed.
        assert_eq!(logits_of(a.model.as_mut(), &[7, 8, 3], None), want, "{target}: partial match");
        // Drafting after a cut inside the drafted positions continues from the cut.
        let n = a.model.cache_len();
        for t in [4, 5, 6] {
            logits_of(a.model.as_mut(), &[t], Some(1));
        }
        a.model.truncate(n + 1);
        logits_of(a.model.as_mut(), &[9], Some(1));
        let want = logits_of(b.model.as_mut(), &[4, 9, 2], None);
        let got = logits_of(a.model.as_mut(), &[4, 9, 2], None);
        assert_eq!(got, want, "{target}: cut back, then drafted");
        // Cutting the verified cache forgets the drafted positions above it too.
        a.model.truncate(5);
        b.model.truncate(5);
        assert_eq!(logits_of(a.model.as_mut(), &[1, 2], None), logits_of(b.model.as_mut(), &[1, 2], None));
        let opts = ForwardOptions { exit_layer: Some(4), ..ForwardOptions::logits(LogitRows::All) };
        let e = a.model.forward(&[1], &opts);
        assert!(e.is_err(), "exit layer 4 of 4 must be refused");
    }
}
