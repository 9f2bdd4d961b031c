//! The lossless property: greedy speculative output equals plain greedy output, token for token, for every
//! drafter, over many prompts, draft lengths, schedules and cache positions.

mod common;

use augur::generation::config::GenerationOptions;
use common::*;

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
        for (i, input) in prompts(300).iter().enumerate() {
            let base = greedy(28 + i);
            let want = plain(target, input, &base);
            for (k, schedule) in [(1, "constant"), (2, "heuristic"), (4, "constant"), (7, "heuristic_transient")] {
                for threshold in [0.0, 0.4] {
                    let opts = GenerationOptions {
                        num_assistant_tokens: Some(k),
                        num_assistant_tokens_schedule: Some(schedule.into()),
                        assistant_confidence_threshold: Some(threshold),
                        ..base.clone()
                    };
                    let out = pipe.generate_ids(input, &opts, None).unwrap();
                    assert_eq!(out.tokens, want, "{target} prompt {i} k={k} {schedule} threshold {threshold}");
                    assert_eq!(out.stats.method, "assistant_model");
                }
            }
        }
    }
}

#[test]
fn prompt_lookup_is_lossless() {
    for target in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        let mut pipe = pipeline(target, None);
        for (i, input) in prompts(300).iter().enumerate() {
            let base = greedy(30 + i);
            let want = plain(target, input, &base);
            for n in [1, 3, 10] {
                for ngram in [1, 2, 3] {
                    let opts = GenerationOptions {
                        prompt_lookup_num_tokens: Some(n),
                        max_matching_ngram_size: Some(ngram),
                        ..base.clone()
                    };
                    let out = pipe.generate_ids(input, &opts, None).unwrap();
                    assert_eq!(out.tokens, want, "{target} prompt {i} n={n} ngram={ngram}");
                }
            }
        }
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
        let opts = GenerationOptions { num_assistant_tokens: Some(k), assistant_confidence_threshold: Some(0.0), ..with_eos.clone() };
        assert_eq!(pipe.generate_ids(input, &opts, None).unwrap().tokens, want);
    }
    // A stop string: the decoded text of tokens 5..7 of the free run.
    let text = pipe.target.tokenizer.decode(&free[..8], true).unwrap();
    let stop: String = text.chars().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect();
    let with_stop = GenerationOptions { stop_strings: Some(vec![stop.clone()]), ..greedy(30) };
    let want = pipeline("tiny-llama", None).generate_ids(input, &with_stop, None).unwrap();
    assert!(want.tokens.len() <= 8, "plain decoding stops at the stop string {stop:?}");
    for opts in [
        GenerationOptions { num_assistant_tokens: Some(6), assistant_confidence_threshold: Some(0.0), ..with_stop.clone() },
        GenerationOptions { prompt_lookup_num_tokens: Some(6), ..with_stop.clone() },
    ] {
        let got = pipe.generate_ids(input, &opts, None).unwrap();
        assert_eq!(got.tokens, want.tokens);
        assert_eq!(got.text, want.text);
        assert_eq!(got.finish_reason.as_str(), "stop");
    }
}
