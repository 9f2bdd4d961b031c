//! Several sequences over one loaded model: forks share the weights and keep their own caches, their
//! concurrent forwards give exactly what each gives alone, and the pipeline's call options and text stream.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Barrier};

use augur::engine::{self, Engine};
use augur::generation::config::GenerationOptions;
use augur::generation::stopping::FinishReason;
use augur::models::{ForwardOptions, LogitRows};
use augur::pipeline::{CallOptions, Prompt};
use augur::speculation::method::MethodName;
use augur::speculation::BackoffPolicy;
use common::{fixtures, greedy, load, pipeline, pipeline_at, scratch, write_random_llama, RandomLlama};

const PROMPTS: [&str; 4] = ["The quick brown fox", "Once upon a time there", "1, 2, 3, 4, 5,", "def main():\n    x ="];

#[test]
fn forks_have_their_own_caches_and_the_same_logits() {
    let pipe = pipeline("tiny-llama", None);
    let ids = pipe.encode(&Prompt::Text(PROMPTS[0].into()), true).unwrap();
    let mut a = pipe.target.model.fork().unwrap();
    let mut b = pipe.target.model.fork().unwrap();
    let rows = |m: &mut Box<dyn augur::models::CausalLm>, t: &[u32]| -> Vec<Vec<f32>> {
        m.forward(t, &ForwardOptions::logits(LogitRows::All)).unwrap().logits.unwrap().to_vec2().unwrap()
    };
    let la = rows(&mut a, &ids);
    assert_eq!(a.cache_len(), ids.len());
    assert_eq!(b.cache_len(), 0, "a fork starts empty whatever its siblings did");
    assert_eq!(pipe.target.model.cache_len(), 0);
    // The other fork, after the first has moved on: the same numbers, bit for bit.
    assert_eq!(rows(&mut a, &[5, 6]).len(), 2);
    assert_eq!(rows(&mut b, &ids), la);
    // Steps interleaved between the forks follow each fork's own cache.
    a.truncate(ids.len());
    for t in [7u32, 8, 9] {
        assert_eq!(rows(&mut a, &[t]), rows(&mut b, &[t]), "token {t}");
    }
    a.truncate(2);
    assert_eq!((a.cache_len(), b.cache_len()), (2, ids.len() + 3));
}

/// Greedy outputs of `PROMPTS` generated one after the other, then by forks on four threads started at once
/// (their forwards overlap, so they run batched): the same tokens, with and without speculation.
#[test]
fn concurrent_sequences_equal_sequential_ones() {
    let pipe = pipeline("tiny-llama", Some("tiny-llama-assistant"));
    for spec in [
        GenerationOptions::default(),
        GenerationOptions { prompt_lookup_num_tokens: Some(3), ..Default::default() },
        GenerationOptions { num_assistant_tokens: Some(4), ..Default::default() },
        GenerationOptions { assistant_early_exit: Some(2), ..Default::default() },
    ] {
        let mut options = greedy(40);
        options.merge(&spec);
        let method = (spec == GenerationOptions::default()).then_some(MethodName::Plain);
        let plain = CallOptions { method, ..CallOptions::new(options.clone()) };
        let mut solo = pipe.fork().unwrap();
        let expected: Vec<Vec<u32>> =
            PROMPTS.iter().map(|p| solo.call(&Prompt::Text((*p).into()), &plain, None).unwrap().tokens).collect();
        let barrier = Arc::new(Barrier::new(PROMPTS.len()));
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let (mut fork, call, barrier, prompt) =
                    (pipe.fork().unwrap(), plain.clone(), Arc::clone(&barrier), p.to_string());
                std::thread::spawn(move || {
                    barrier.wait();
                    fork.call(&Prompt::Text(prompt), &call, None).unwrap()
                })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            let out = h.join().unwrap();
            assert_eq!(out.tokens, expected[i], "prompt {i} with {spec:?}");
        }
    }
}

/// The architectures whose attention runs one sequence at a time inside a batched forward (the mixture-of-experts
/// ones, Gemma 4): forks on two threads at once give the logits one fork gives alone. MTP layers stay with the
/// loaded model, so a pipeline over them does not fork; a Gemma 4 pipeline does.
#[test]
fn per_sequence_models_fork_and_mtp_pipelines_say_so() {
    for name in ["tiny-deepseek-v3-mtp", "tiny-glm4-moe-mtp", "tiny-gemma4"] {
        let lm = load(&fixtures().join(name), false);
        let prompts: Vec<Vec<u32>> = vec![vec![1, 5, 9, 13, 17], vec![2, 4, 6]];
        let logits = |m: &mut Box<dyn augur::models::CausalLm>, t: &[u32]| -> Vec<Vec<f32>> {
            m.forward(t, &ForwardOptions::logits(LogitRows::All)).unwrap().logits.unwrap().to_vec2().unwrap()
        };
        let mut solo = lm.model.fork().unwrap();
        let expected: Vec<Vec<Vec<f32>>> = prompts
            .iter()
            .map(|p| {
                solo.truncate(0);
                let mut rows = logits(&mut solo, p);
                rows.extend(logits(&mut solo, &[3]));
                rows
            })
            .collect();
        let barrier = Arc::new(Barrier::new(prompts.len()));
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (mut fork, barrier, p) = (lm.model.fork().unwrap(), Arc::clone(&barrier), p.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut rows = logits(&mut fork, &p);
                    rows.extend(logits(&mut fork, &[3]));
                    rows
                })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(h.join().unwrap(), expected[i], "{name}, prompt {i}");
        }
        let pipe = pipeline(name, None);
        if name == "tiny-gemma4" {
            pipe.fork().expect("a Gemma 4 pipeline forks");
        } else {
            let err = pipe.fork().err().expect("a pipeline with MTP layers must not fork").to_string();
            assert!(err.contains("MTP layers"), "{err}");
        }
    }
}

#[test]
fn call_options_stream_cancel_and_backoff() {
    let mut pipe = pipeline("tiny-llama", None);
    let prompt = Prompt::Text(PROMPTS[0].into());
    let new = pipe.generate(&prompt, &greedy(12), None).unwrap();

    // return_full_text (Transformers' default) puts the prompt first, in the text and in the stream.
    let mut streamed = String::new();
    let full = pipe.call(&prompt, &CallOptions::new(greedy(12)), Some(&mut |c: &str| streamed.push_str(c))).unwrap();
    assert_eq!(full.text, format!("{}{}", PROMPTS[0], new.text));
    assert_eq!(streamed, full.text);

    // add_special_tokens reaches the tokenizer (the tiny tokenizer adds no special tokens to text, so the
    // counts only show that the encoding asked for is the one generated from).
    let without = pipe.encode(&prompt, false).unwrap();
    let no_bos =
        CallOptions { add_special_tokens: Some(false), return_full_text: Some(false), ..CallOptions::new(greedy(12)) };
    let out = pipe.call(&prompt, &no_bos, None).unwrap();
    assert_eq!(out.stats.prompt_tokens, without.len());

    // Stop strings end the text where they appear.
    let stop = new.text.chars().skip(3).take(2).collect::<String>();
    let mut stop_opts = greedy(12);
    stop_opts.stop_strings = Some(vec![stop.clone()]);
    let stopped = pipe.generate(&prompt, &stop_opts, None).unwrap();
    assert_eq!(stopped.finish_reason, FinishReason::StopString(stop.clone()));
    assert!(stopped.text.contains(&stop) && new.text.starts_with(&stopped.text), "{stopped:?}");
    assert!(stopped.tokens.len() < new.tokens.len());

    // The iterator yields the same text as the callback; `finish` returns the whole output.
    let call = CallOptions { return_full_text: Some(false), ..CallOptions::new(greedy(12)) };
    let mut chunks = pipe.stream(prompt.clone(), call.clone()).unwrap();
    let mut text = String::new();
    for c in chunks.by_ref() {
        text.push_str(&c);
    }
    assert_eq!(text, new.text);
    assert_eq!(chunks.finish().unwrap().tokens, new.tokens);

    // A set cancel flag ends the generation after one token.
    let cancel = Arc::new(AtomicBool::new(true));
    let cancelled = pipe.call(&prompt, &CallOptions { cancel: Some(cancel), ..call.clone() }, None).unwrap();
    assert_eq!(cancelled.finish_reason, FinishReason::Cancelled);
    assert_eq!(cancelled.tokens.len(), 1);

    // Under load the back-off keeps drafting off: no drafts, the same tokens.
    let mut pl = greedy(12);
    pl.prompt_lookup_num_tokens = Some(3);
    let busy = BackoffPolicy { running: Arc::new(AtomicUsize::new(9)), max_load: 1 };
    let backed = pipe.call(&prompt, &CallOptions { generation: pl, backoff: Some(busy), ..call }, None).unwrap();
    assert_eq!(backed.tokens, new.tokens);
    assert_eq!(backed.stats.drafted, 0);
}

/// Log-probabilities are the log-softmax of the target's raw logits at each emitted position: checked against
/// one forward over prompt and output, and identical whichever method drafted (the rows verified are the rows
/// plain decoding computes).
#[test]
fn logprobs_are_the_targets_raw_distribution_with_or_without_speculation() {
    let mut pipe = pipeline("tiny-llama", Some("tiny-llama-assistant"));
    let prompt = Prompt::Text(PROMPTS[2].into());
    let ids = pipe.encode(&prompt, true).unwrap();
    let mut runs = Vec::new();
    for (method, spec) in [
        (MethodName::Plain, GenerationOptions::default()),
        (MethodName::PromptLookup, GenerationOptions { prompt_lookup_num_tokens: Some(3), ..Default::default() }),
        (MethodName::AssistantModel, GenerationOptions { num_assistant_tokens: Some(4), ..Default::default() }),
    ] {
        let mut options = greedy(24);
        options.merge(&spec);
        options.cost_aware_drafting = Some(false);
        let call = CallOptions { method: Some(method), logprobs: Some(3), ..CallOptions::new(options) };
        let out = pipe.call(&prompt, &call, None).unwrap();
        if method != MethodName::Plain {
            assert!(out.stats.drafted > 0, "{method:?} proposed no drafts");
        }
        runs.push(out);
    }
    let plain = &runs[0];
    let logprobs = plain.logprobs.as_ref().expect("logprobs were asked for");
    assert_eq!(logprobs.len(), plain.tokens.len());
    let mut all = ids.clone();
    all.extend(&plain.tokens);
    let mut model = pipe.target.model.fork().unwrap();
    let rows: Vec<Vec<f32>> =
        model.forward(&all, &ForwardOptions::logits(LogitRows::All)).unwrap().logits.unwrap().to_vec2().unwrap();
    for (i, lp) in logprobs.iter().enumerate() {
        let row = &rows[ids.len() - 1 + i];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log_z = max + row.iter().map(|&x| ((x - max) as f64).exp()).sum::<f64>().ln() as f32;
        assert_eq!(lp.token, plain.tokens[i]);
        assert!((lp.logprob - (row[lp.token as usize] - log_z)).abs() < 1e-4, "position {i}: {lp:?}");
        assert_eq!(lp.top.len(), 3);
        // Greedy: the emitted token is the most likely one, and the alternatives come in order.
        assert_eq!(lp.top[0], (lp.token, lp.logprob));
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
    }
    for out in &runs[1..] {
        assert_eq!(out.tokens, plain.tokens);
        assert_eq!(out.logprobs.as_ref().unwrap().len(), logprobs.len());
        for (a, b) in out.logprobs.as_ref().unwrap().iter().zip(logprobs) {
            assert_eq!(a.token, b.token);
            assert!((a.logprob - b.logprob).abs() < 1e-4, "{a:?} against plain {b:?}");
        }
    }
    let none = pipe.call(&prompt, &CallOptions::new(greedy(4)), None).unwrap();
    assert!(none.logprobs.is_none(), "nothing recorded unless asked");
}

/// `include_stop_str_in_output: false` cuts the stop string and what follows it from the text and the stream,
/// also when the stop string spans tokens or begins in the prompt; speculation does not change the cut.
#[test]
fn stop_strings_are_cut_from_the_text_when_asked() {
    let mut pipe = pipeline("tiny-llama", None);
    let prompt_text = PROMPTS[1];
    let prompt = Prompt::Text(prompt_text.into());
    let full = pipe.generate(&prompt, &greedy(30), None).unwrap().text;
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 12, "{full:?}");
    let cases = [
        // (stop, text expected with the stop cut)
        (chars[6..10].iter().collect::<String>(), None),
        (format!("{}{}", &prompt_text[prompt_text.len() - 2..], chars[0]), Some(String::new())),
    ];
    for (stop, expected) in cases {
        let expected = expected.unwrap_or_else(|| full[..full.find(&stop).unwrap()].to_string());
        for lookup in [None, Some(2)] {
            let mut options = greedy(30);
            options.stop_strings = Some(vec![stop.clone()]);
            options.prompt_lookup_num_tokens = lookup;
            let call = CallOptions {
                include_stop_str_in_output: Some(false),
                return_full_text: Some(false),
                ..CallOptions::new(options.clone())
            };
            let mut streamed = String::new();
            let cut = pipe.call(&prompt, &call, Some(&mut |c: &str| streamed.push_str(c))).unwrap();
            assert_eq!(cut.finish_reason, FinishReason::StopString(stop.clone()), "{stop:?}");
            assert_eq!(cut.text, expected, "stop {stop:?}, lookup {lookup:?}");
            assert_eq!(streamed, cut.text, "the stream never shows what is cut");
            let kept = pipe.generate(&prompt, &options, None).unwrap();
            assert_eq!(kept.tokens, cut.tokens, "cutting the text changes no token");
            assert!(kept.text.starts_with(&expected) && kept.text.len() > expected.len());
        }
    }
}

/// `sequence_bias` moves greedy choices: a one-token bias always, a longer sequence's only after its prefix;
/// speculation keeps the biased output; ids beyond the vocabulary are refused with Transformers' error.
#[test]
fn sequence_bias_steers_generation_exactly() {
    let mut pipe = pipeline("tiny-llama", None);
    let prompt = Prompt::Text(PROMPTS[0].into());
    let base = pipe.generate(&prompt, &greedy(8), None).unwrap().tokens;
    let with = |bias: Vec<(Vec<u32>, f32)>, lookup: Option<usize>| GenerationOptions {
        sequence_bias: Some(bias),
        prompt_lookup_num_tokens: lookup,
        cost_aware_drafting: Some(false),
        ..greedy(8)
    };
    let banned = pipe.generate(&prompt, &with(vec![(vec![base[0]], -100.0)], None), None).unwrap().tokens;
    assert_ne!(banned[0], base[0], "a -100 bias bans the greedy token");
    assert!(!banned.contains(&base[0]));
    let forced = 7u32;
    let pushed = pipe.generate(&prompt, &with(vec![(vec![base[0], forced], 100.0)], None), None).unwrap().tokens;
    assert_eq!(pushed[..2], [base[0], forced], "a two-token sequence biases its last token after its prefix");
    for bias in [vec![(vec![base[0]], -100.0)], vec![(vec![base[0], forced], 100.0)]] {
        let plain = pipe.generate(&prompt, &with(bias.clone(), None), None).unwrap().tokens;
        let spec = pipe.generate(&prompt, &with(bias, Some(2)), None).unwrap();
        assert_eq!(spec.tokens, plain);
    }
    let vocab = pipe.target.config().vocab_size as u32;
    let e = pipe.generate(&prompt, &with(vec![(vec![vocab + 5], 1.0)], None), None).unwrap_err().to_string();
    assert!(e.contains(&format!("vocabulary size is {vocab}")) && e.contains(&(vocab + 5).to_string()), "{e}");
    let json = GenerationOptions::from_json_str(r#"{"sequence_bias": [[[3, 4], -2.0], [[5], 1.5], [[3, 4], 1.0]]}"#)
        .unwrap()
        .sequence_bias
        .unwrap();
    assert_eq!(json, vec![(vec![3, 4], 1.0), (vec![5], 1.5)], "a repeated sequence keeps its last bias");
    assert!(GenerationOptions::from_json_str(r#"{"sequence_bias": [[[], 1.0]]}"#).is_err());
}

/// `cache_prompt`: a call whose prompt begins with what the last call left in the cache (its prompt and output)
/// prefills only the rest and gives the tokens a fresh sequence gives, plain, speculative and sampled; a prompt
/// that leaves the cached tokens early reuses up to there; early exit, which runs the prompt through the
/// target's own layers, and calls without the option prefill it all.
#[test]
fn a_cached_prompt_prefix_gives_the_tokens_of_a_fresh_sequence() {
    // The target as its own assistant: every greedy draft is accepted, so the EOS below lands inside a block.
    let pipe = pipeline("tiny-llama", Some("tiny-llama"));
    let first_prompt = pipe.encode(&Prompt::Text(PROMPTS[1].into()), true).unwrap();
    // Drawn by position, so that the text does not depend on which rounds drafted (the cost model times them).
    let sampled = GenerationOptions {
        do_sample: Some(true),
        seed: Some(7),
        temperature: Some(0.9),
        sample_by_position: Some(true),
        ..greedy(24)
    };
    for (spec, reused) in [
        (GenerationOptions::default(), true),
        (GenerationOptions { prompt_lookup_num_tokens: Some(3), ..Default::default() }, true),
        (GenerationOptions { num_assistant_tokens: Some(4), ..Default::default() }, true),
        (sampled, true),
        // Suffix decoding's trees (its last block cut by the budget, past which nothing stays cached).
        (GenerationOptions { suffix_max_depth: Some(8), ..Default::default() }, true),
        (GenerationOptions { assistant_early_exit: Some(2), ..Default::default() }, false),
    ] {
        let mut options = greedy(24);
        options.merge(&spec);
        // Drafts whatever the timings say (the cost model would size rounds by them).
        options.cost_aware_drafting = Some(false);
        let method = if spec == GenerationOptions::default() {
            Some(MethodName::Plain)
        } else {
            spec.suffix_max_depth.map(|_| MethodName::Suffix)
        };
        let fresh = CallOptions { method, ..CallOptions::new(options.clone()) };
        // The first call ends at an EOS inside the output (past which nothing may stay cached).
        let unstopped = pipe.fork().unwrap().call_ids(&first_prompt, &fresh, None).unwrap();
        for at in [6, 7, 8] {
            let eos = unstopped.tokens[at];
            let mut options = options.clone();
            options.eos_token_id = Some(vec![eos]);
            let fresh = CallOptions { generation: options, ..fresh.clone() };
            let cached = CallOptions { cache_prompt: Some(true), ..fresh.clone() };
            let mut warm = pipe.fork().unwrap();
            let first = warm.call_ids(&first_prompt, &cached, None).unwrap();
            assert_eq!(first.tokens.last(), Some(&eos), "{spec:?}");
            assert_eq!(first.stats.cached_prompt_tokens, 0, "nothing cached before the first call ({spec:?})");
            let total = first_prompt.len() + first.tokens.len();
            let kept = warm.target.model.cache_len();
            assert!(kept + 1 >= total && kept <= total, "{kept} positions cached for {total} tokens ({spec:?})");
            // The next turn: the whole first exchange, then the prompt's first tokens again (an n-gram to look
            // up); then a prompt that leaves it at token 3.
            let mut next = [first_prompt.clone(), first.tokens.clone()].concat();
            next.extend_from_slice(&first_prompt[..3]);
            let mut diverging = next[..3].to_vec();
            diverging.extend([40, 41, 42, 43]);
            for (prompt, expected_reuse) in [(&next, kept), (&diverging, 3)] {
                let again = warm.call_ids(prompt, &cached, None).unwrap();
                let alone = pipe.fork().unwrap().call_ids(prompt, &fresh, None).unwrap();
                assert_eq!(again.tokens, alone.tokens, "{spec:?}, prompt of {} tokens", prompt.len());
                let reuse = if reused { expected_reuse } else { 0 };
                assert_eq!(again.stats.cached_prompt_tokens, reuse, "{spec:?}, prompt of {} tokens", prompt.len());
                assert_eq!(alone.stats.cached_prompt_tokens, 0);
                let looks_up = spec.prompt_lookup_num_tokens.is_some() || spec.suffix_max_depth.is_some();
                if spec.num_assistant_tokens.is_some() || (looks_up && prompt == &next) {
                    assert!(again.stats.drafted > 0, "drafts were proposed ({spec:?})");
                }
                // Back to the first exchange's state for the second prompt.
                warm = pipe.fork().unwrap();
                warm.call_ids(&first_prompt, &cached, None).unwrap();
            }
            let off = warm.call_ids(&next, &fresh, None).unwrap();
            assert_eq!(off.stats.cached_prompt_tokens, 0, "reused without cache_prompt ({spec:?})");
        }
    }
}

/// The server wraps a running sequence's drafter in its back-off; the wrapper reports what the drafter it wraps
/// reads of the target, so early exit, which runs the prompt through the target's own layers, still prefills
/// the whole prompt under it (before, the wrapper hid that, and such a call reused the cached prefix).
#[test]
fn a_backed_off_early_exit_prefills_the_whole_prompt() {
    let pipe = pipeline("tiny-llama", None);
    let prompt = pipe.encode(&Prompt::Text(PROMPTS[3].into()), true).unwrap();
    let options = GenerationOptions { assistant_early_exit: Some(2), cost_aware_drafting: Some(false), ..greedy(16) };
    let idle = BackoffPolicy { running: Arc::new(AtomicUsize::new(1)), max_load: 8 };
    let call = CallOptions { cache_prompt: Some(true), backoff: Some(idle), ..CallOptions::new(options) };
    let mut warm = pipe.fork().unwrap();
    let first = warm.call_ids(&prompt, &call, None).unwrap();
    let next = [prompt.clone(), first.tokens.clone()].concat();
    let again = warm.call_ids(&next, &call, None).unwrap();
    assert_eq!(again.stats.method, "early_exit");
    assert!(again.stats.drafted > 0, "early exit drafted under the back-off");
    assert_eq!(again.stats.cached_prompt_tokens, 0, "early exit reused a cached prefix");
    let alone = pipe.fork().unwrap().call_ids(&next, &call, None).unwrap();
    assert_eq!(again.tokens, alone.tokens);
}

/// `auto` with an assistant that shares the target's tokenizer and costs a small part of its step drafts from
/// it, and its output is plain greedy output. (Before, the assistant's first draft, its probe, had to promise
/// the 5% over a plain step that only a measured draft can promise, so `auto` never drafted from the
/// assistant.) The target is a random llama of 24 M parameters with the fixtures' tokenizer, its step some twenty
/// times the assistant's (`tiny-llama-assistant`): with an assistant as costly as its target, as `tiny-llama` is,
/// `auto` rightly declines it, and only a mismeasured step could have it draft.
#[test]
fn auto_drafts_from_the_assistant() {
    let dir = scratch("wide-llama");
    for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"] {
        std::fs::copy(fixtures().join("tiny-llama").join(file), dir.join(file)).unwrap();
    }
    write_random_llama(
        &dir,
        &RandomLlama { hidden: 512, intermediate: 1536, layers: 8, vocab: 448, max_positions: 512 },
    );
    let pipe = pipeline_at(&dir, Some(&fixtures().join("tiny-llama-assistant")));
    let prompt = pipe.encode(&Prompt::Text(PROMPTS[1].into()), true).unwrap();
    let plain = CallOptions { method: Some(MethodName::Plain), ..CallOptions::new(greedy(64)) };
    let auto = CallOptions { method: Some(MethodName::Auto), ..CallOptions::new(greedy(64)) };
    let want = pipe.fork().unwrap().call_ids(&prompt, &plain, None).unwrap();
    let got = pipe.fork().unwrap().call_ids(&prompt, &auto, None).unwrap();
    assert_eq!(got.stats.method, "auto");
    let assistant_rounds = got.stats.draft_sources.get("assistant").copied().unwrap_or(0);
    assert!(assistant_rounds > 0, "no round drafted from the assistant: {:?}", got.stats.draft_sources);
    assert_eq!(got.tokens, want.tokens);
}

/// The engine's idle pool: a sequence goes back with its cache when its request ends, a later request of the
/// same owner whose prompt begins with it reuses it (only the rest is prefilled), and another owner's request
/// never does (its cache is forgotten first); each answer is the one an empty cache gives.
#[test]
fn the_engine_reuses_an_owners_cached_prefix_and_never_anothers() {
    let pipe = pipeline("tiny-llama", None);
    let first = pipe.encode(&Prompt::Text(PROMPTS[1].into()), true).unwrap();
    let alone = |p: &mut augur::pipeline::Pipeline, ids: &[u32]| p.call_ids(ids, &CallOptions::new(greedy(6)), None);
    let mut fresh = pipe.fork().unwrap();
    let engine = Engine::new(pipe, 2, 4).unwrap();
    let cached = CallOptions { cache_prompt: Some(true), ..CallOptions::new(greedy(6)) };
    let ask = |ids: &[u32], owner: &str| {
        let mut running = engine.admit(1).expect("a slot").sequences(ids, owner).unwrap();
        assert_eq!(engine.admission().gauges(), (1, 0));
        running.run(|_, p| p.call_ids(ids, &cached, None)).pop().unwrap().unwrap()
    };
    let out = ask(&first, "a");
    assert_eq!(out.stats.cached_prompt_tokens, 0);
    assert_eq!(engine.admission().gauges(), (0, 0), "the slot is given back with the sequence");
    // The same owner, a prompt that begins with the first one's prompt and answer.
    let longer: Vec<u32> = first.iter().chain(&out.tokens).copied().chain([7, 8]).collect();
    let again = ask(&longer, "a");
    assert!(again.stats.cached_prompt_tokens >= first.len(), "reused {} tokens", again.stats.cached_prompt_tokens);
    assert_eq!(again.tokens, alone(&mut fresh, &longer).unwrap().tokens);
    let other = ask(&longer, "b");
    assert_eq!(other.stats.cached_prompt_tokens, 0, "another owner's cache is never reused");
    assert_eq!(other.tokens, again.tokens);
}

/// Rows run by the engine at once meet in batched forwards and give each row what it gives alone; a row that
/// panics is an error of its own while the others finish.
#[test]
fn the_engines_rows_batch_and_give_each_rows_tokens() {
    let mut pipe = pipeline("tiny-llama", None);
    let rows: Vec<Vec<u32>> = PROMPTS.iter().map(|p| pipe.encode(&Prompt::Text((*p).into()), true).unwrap()).collect();
    let alone: Vec<Vec<u32>> =
        rows.iter().map(|ids| pipe.call_ids(ids, &CallOptions::new(greedy(16)), None).unwrap().tokens).collect();
    let before = pipe.target.model.batched_forwards();
    let together = engine::run_forked(&mut pipe, rows.len(), |i, p| {
        Ok(p.call_ids(&rows[i], &CallOptions::new(greedy(16)), None)?.tokens)
    });
    let together: Vec<Vec<u32>> = together.into_iter().map(Result::unwrap).collect();
    assert_eq!(together, alone);
    assert!(pipe.target.model.batched_forwards() > before, "the rows' forwards were never batched");

    let mut counts = [1u32, 2, 3];
    let ran = engine::run_rows(&mut counts, |i, c| if i == 1 { panic!("row 1") } else { Ok(*c * 10) });
    assert_eq!(ran[0].as_ref().ok(), Some(&10));
    assert!(ran[1].as_ref().is_err_and(|e| e.to_string().contains("row 1")), "{:?}", ran[1]);
    assert_eq!(ran[2].as_ref().ok(), Some(&30));
}
