//! The lossless property: greedy speculative output equals plain greedy output, token for token, for every
//! drafter, over many prompts, draft lengths, schedules and cache positions, with cost-aware drafting on (the
//! default, whose rounds depend on timing) and off (Transformers' rounds). Each test counts the rounds that
//! drafted three positions or more, and asserts a stated minimum of them with cost-aware drafting off.

mod common;

use augur::generation::config::GenerationOptions;
use augur::generation::output::GenerationStats;
use common::*;

/// Rounds of `stats` that drafted at least three positions.
fn long_rounds(stats: &GenerationStats) -> usize {
    stats.rounds.iter().filter(|&&(g, _)| g >= 3).count()
}

/// Prompts with repetition (so prompt lookup finds matches) of several lengths, drawn from a fixed seed.
fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    let mut next = token_stream(0x2545F4914F6CDD1Du64, vocab);
    (0..6)
        .map(|i| {
            let base: Vec<u32> = (0..3 + i).map(|_| next()).collect();
            let mut p = Vec::new();
            for _ in 0..(2 + i % 3) {
                p.extend_from_slice(&base);
                p.push(next());
            }
            p
        })
        .collect()
}

fn plain(target: &str, input: &[u32], opts: &GenerationOptions) -> Vec<u32> {
    pipeline(target, None).generate_ids(input, opts, None).unwrap().tokens
}

#[test]
fn assistant_model_is_lossless() {
    for target in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        let mut pipe = pipeline(target, Some("tiny-llama-assistant"));
        let mut drafted_on = 0;
        for (i, input) in prompts(300).iter().enumerate() {
            let base = greedy(28 + i);
            let want = plain(target, input, &base);
            for (k, schedule) in [(1, "constant"), (2, "heuristic"), (4, "constant"), (7, "heuristic_transient")] {
                for threshold in [0.0, 0.4] {
                    for cost_aware in [false, true] {
                        let opts = GenerationOptions {
                            num_assistant_tokens: Some(k),
                            num_assistant_tokens_schedule: Some(schedule.into()),
                            assistant_confidence_threshold: Some(threshold),
                            cost_aware_drafting: Some(cost_aware),
                            ..base.clone()
                        };
                        let out = pipe.generate_ids(input, &opts, None).unwrap();
                        let what = format!(
                            "{target} prompt {i} k={k} {schedule} threshold {threshold} cost-aware {cost_aware}"
                        );
                        assert_eq!(out.tokens, want, "{what}");
                        assert_eq!(out.stats.method, "assistant_model");
                        if cost_aware {
                            drafted_on += out.stats.drafted;
                        } else {
                            assert!(out.stats.drafted > 0, "{what}: nothing drafted");
                            // Without a confidence stop, every round but the budget's last drafts k.
                            if k >= 4 && threshold == 0.0 {
                                assert!(long_rounds(&out.stats) >= 3, "{what}: rounds {:?}", out.stats.rounds);
                            }
                        }
                    }
                }
            }
        }
        assert!(drafted_on > 0, "{target}: with cost-aware drafting on, nothing was ever drafted");
    }
}

#[test]
fn prompt_lookup_is_lossless() {
    for target in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        let mut pipe = pipeline(target, None);
        let (mut runs, mut long, mut drafted_on) = (0, 0, 0);
        for (i, input) in prompts(300).iter().enumerate() {
            let base = greedy(30 + i);
            let want = plain(target, input, &base);
            for n in [1, 3, 10] {
                for ngram in [1, 2, 3] {
                    for cost_aware in [false, true] {
                        let opts = GenerationOptions {
                            prompt_lookup_num_tokens: Some(n),
                            max_matching_ngram_size: Some(ngram),
                            cost_aware_drafting: Some(cost_aware),
                            ..base.clone()
                        };
                        let out = pipe.generate_ids(input, &opts, None).unwrap();
                        assert_eq!(out.tokens, want, "{target} prompt {i} n={n} ngram={ngram} cost-aware {cost_aware}");
                        assert_eq!(out.stats.method, "prompt_lookup");
                        if cost_aware {
                            drafted_on += out.stats.drafted;
                        } else if n >= 3 {
                            runs += 1;
                            long += (long_rounds(&out.stats) > 0) as usize;
                        }
                    }
                }
            }
        }
        // The prompts repeat themselves, so most lookups find a continuation of three tokens or more.
        assert!(long * 2 >= runs, "{target}: only {long} of {runs} runs drafted three positions in a round");
        assert!(drafted_on > 0, "{target}: with cost-aware drafting on, nothing was ever drafted");
    }
}

/// EOS and stop strings inside an accepted block end the sequence exactly where plain decoding ends it.
#[test]
fn eos_and_stop_strings_cut_blocks_like_plain_decoding() {
    let input = &prompts(300)[3];
    let free = plain("tiny-llama", input, &greedy(30));
    // An EOS id that plain greedy produces mid-sequence.
    let eos = free[9];
    let with_eos = GenerationOptions { eos_token_id: Some(vec![eos]), ..greedy(30) };
    let want = plain("tiny-llama", input, &with_eos);
    assert_eq!(want.last(), Some(&eos));
    let mut pipe = pipeline("tiny-llama", Some("tiny-llama-assistant"));
    for k in [3, 8] {
        let opts = GenerationOptions {
            num_assistant_tokens: Some(k),
            assistant_confidence_threshold: Some(0.0),
            cost_aware_drafting: Some(false),
            ..with_eos.clone()
        };
        let got = pipe.generate_ids(input, &opts, None).unwrap();
        assert_eq!(got.tokens, want);
        assert!(long_rounds(&got.stats) > 0, "k={k}: rounds {:?}", got.stats.rounds);
    }
    // A stop string: the decoded text of tokens 5..7 of the free run.
    let text = pipe.target.tokenizer.decode(&free[..8], true).unwrap();
    let stop: String = text.chars().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect();
    let with_stop = GenerationOptions { stop_strings: Some(vec![stop.clone()]), ..greedy(30) };
    let want = pipeline("tiny-llama", None).generate_ids(input, &with_stop, None).unwrap();
    assert!(want.tokens.len() <= 8, "plain decoding stops at the stop string {stop:?}");
    let off = GenerationOptions { cost_aware_drafting: Some(false), ..with_stop.clone() };
    let opts = GenerationOptions { num_assistant_tokens: Some(6), assistant_confidence_threshold: Some(0.0), ..off };
    let got = pipe.generate_ids(input, &opts, None).unwrap();
    assert!(long_rounds(&got.stats) > 0, "rounds {:?}", got.stats.rounds);
    assert_eq!(got.tokens, want.tokens);
    assert_eq!(got.text, want.text);
    assert_eq!(got.finish_reason.as_str(), "stop");
}

/// A stop string completed by an accepted prompt-lookup draft, before its block's last token, stops the sequence
/// where plain decoding stops it.
#[test]
fn stop_strings_inside_lookup_blocks_cut_like_plain_decoding() {
    let mut pipe = pipeline("tiny-llama", None);
    let mut checked = 0;
    for input in prompts(300) {
        let lookup =
            GenerationOptions { prompt_lookup_num_tokens: Some(6), cost_aware_drafting: Some(false), ..greedy(30) };
        let free = pipe.generate_ids(&input, &lookup, None).unwrap();
        // The first round that kept a draft: its block starts at `start`.
        let mut start = 0;
        let Some(&(_, n)) = free.stats.rounds.iter().find(|&&(_, n)| {
            let found = n >= 1;
            if !found {
                start += n + 1;
            }
            found
        }) else {
            continue;
        };
        assert!(n >= 1);
        // A stop string ending at the block's first draft.
        let text = pipe.target.tokenizer.decode(&free.tokens[..start + 1], true).unwrap();
        let prior = pipe.target.tokenizer.decode(&free.tokens[..start], true).unwrap();
        if text.len() <= prior.len() {
            continue;
        }
        // The shortest suffix that occurs first where that draft completes it.
        let Some(stop) = (1..=text.chars().count())
            .map(|l| text.chars().skip(text.chars().count() - l).collect::<String>())
            .find(|s| text.find(s.as_str()) == Some(text.len() - s.len()))
        else {
            continue;
        };
        let with_stop = GenerationOptions { stop_strings: Some(vec![stop.clone()]), ..greedy(30) };
        let want = plain("tiny-llama", &input, &with_stop);
        let got =
            pipe.generate_ids(&input, &GenerationOptions { stop_strings: Some(vec![stop]), ..lookup }, None).unwrap();
        assert!(got.stats.drafted > 0);
        assert_eq!(got.tokens, want);
        assert_eq!(got.finish_reason.as_str(), "stop");
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} prompts had a lookup block to stop inside");
}

/// A stop string that begins in the prompt and is completed by the first new token stops there, as
/// Transformers' `StopStringCriteria` (which reads the whole sequence) stops it; speculation stops at the same
/// token.
#[test]
fn a_stop_string_may_begin_in_the_prompt() {
    let mut pipe = pipeline("tiny-llama", None);
    let input = &prompts(300)[2];
    let free = plain("tiny-llama", input, &greedy(10));
    let tokenizer = &pipe.target.tokenizer;
    let prompt_text = tokenizer.decode(input, false).unwrap();
    let first = tokenizer.decode(&free[..1], true).unwrap();
    assert!(!first.is_empty() && prompt_text.len() >= 2);
    let head: String = prompt_text.chars().rev().take(2).collect::<Vec<_>>().into_iter().rev().collect();
    let stop = format!("{head}{}", first.chars().next().unwrap());
    assert!(!first.contains(&stop), "the stop string {stop:?} must begin in the prompt");
    let opts = GenerationOptions { stop_strings: Some(vec![stop.clone()]), ..greedy(10) };
    let want = pipe.generate_ids(input, &opts, None).unwrap();
    assert_eq!(want.tokens, free[..1], "stop string {stop:?}");
    assert_eq!(want.finish_reason.as_str(), "stop");
    let lookup = GenerationOptions { prompt_lookup_num_tokens: Some(4), cost_aware_drafting: Some(false), ..opts };
    assert_eq!(pipe.generate_ids(input, &lookup, None).unwrap().tokens, want.tokens);
}
