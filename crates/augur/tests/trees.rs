//! Tree verification: a tree row's logits are the bits of the same position decoded along its path alone, the
//! cache that keeps one path is the cache a fresh prefill of that path builds (the next position's logits are
//! the same bits), and greedy decoding with tree drafts gives plain greedy decoding's tokens, with trees that
//! branched asserted. On every decoder fixture (sliding windows, MLA and MoE blocks) and on SmolLM2's GGUF.

mod common;

use std::sync::Arc;

use augur::generation::config::GenerationOptions;
use augur::models::{CausalLm, ForwardOptions, LogitRows};
use augur::nn::TreeMask;
use common::*;

const TARGETS: [&str; 5] = ["tiny-llama", "tiny-qwen2", "tiny-gemma3", "tiny-deepseek-v3-mtp", "tiny-glm4-moe-mtp"];
const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn bits(row: &[f32]) -> Vec<u32> {
    row.iter().map(|x| x.to_bits()).collect()
}

/// The last row's logits of a fresh run of `tokens` (one forward for the prompt, then one per token, as plain
/// decoding runs).
fn alone(m: &mut dyn CausalLm, prompt: &[u32], path: &[u32]) -> Vec<u32> {
    m.truncate(0);
    let mut out = m.forward(prompt, &ForwardOptions::logits(LogitRows::Last(1))).unwrap();
    for &t in path {
        out = m.forward(&[t], &ForwardOptions::logits(LogitRows::Last(1))).unwrap();
    }
    bits(&out.logits.unwrap().to_vec2::<f32>().unwrap()[0])
}

/// A tree of `n` rows under a root row (row 0): a chain of ten (deeper than the fixtures' sliding window of
/// 8), then each row's parent drawn among the earlier rows.
fn random_tree(seed: u64, n: usize) -> Vec<Option<usize>> {
    let mut next = token_stream(seed, 1 << 20);
    (0..n).map(|i| if i == 0 { None } else { Some(if i < 10 { i - 1 } else { next() as usize % i }) }).collect()
}

fn check_model(name: &str, m: &mut dyn CausalLm, seeds: u64) {
    assert!(m.supports_tree(), "{name}");
    let vocab = m.config().vocab_size as u32;
    for seed in 1..=seeds {
        let mut next = token_stream(seed * 7919, vocab);
        let prompt: Vec<u32> = (0..5 + seed as usize * 3).map(|_| next()).collect();
        let parents = random_tree(seed, 18);
        let tokens: Vec<u32> = (0..parents.len()).map(|_| next()).collect();
        let tree = TreeMask::new(&parents).unwrap();
        let paths: Vec<Vec<usize>> = (0..parents.len()).map(|r| tree.path(r).to_vec()).collect();
        assert!(paths.iter().any(|p| p.len() > 9), "a path deeper than the sliding window");
        // The prompt but its last token, then the tree whose root is that token.
        let (head, root) = prompt.split_at(prompt.len() - 1);
        let mut feed = root.to_vec();
        feed.extend_from_slice(&tokens[1..]);
        let mut tokens = tokens;
        tokens[0] = root[0];
        m.truncate(0);
        m.forward(head, &ForwardOptions::logits(LogitRows::Last(1))).unwrap();
        let opts = ForwardOptions { tree: Some(Arc::new(tree)), ..ForwardOptions::logits(LogitRows::All) };
        let rows = m.forward(&feed, &opts).unwrap().logits.unwrap().to_vec2::<f32>().unwrap();
        for (r, path) in paths.iter().enumerate() {
            let path_tokens: Vec<u32> = path[1..].iter().map(|&i| tokens[i]).collect();
            let want = alone(m, &prompt, &path_tokens);
            assert_eq!(bits(&rows[r]), want, "{name} seed {seed}: tree row {r} (path {path:?})");
        }
        // Keep the deepest path, then decode one more token: the fresh prefill's bits.
        let deepest = paths.iter().max_by_key(|p| p.len()).unwrap().clone();
        m.truncate(0);
        m.forward(head, &ForwardOptions::logits(LogitRows::Last(1))).unwrap();
        m.forward(&feed, &opts).unwrap();
        let start = head.len();
        m.keep_path(start, &deepest).unwrap();
        assert_eq!(m.cache_len(), start + deepest.len(), "{name}");
        let extra = next();
        let kept = m.forward(&[extra], &ForwardOptions::logits(LogitRows::Last(1))).unwrap().logits.unwrap();
        let mut path_tokens: Vec<u32> = deepest[1..].iter().map(|&i| tokens[i]).collect();
        path_tokens.push(extra);
        assert_eq!(
            bits(&kept.to_vec2::<f32>().unwrap()[0]),
            alone(m, &prompt, &path_tokens),
            "{name} seed {seed}: after keep_path({deepest:?})"
        );
    }
}

#[test]
fn tree_rows_are_their_paths_bit_for_bit_and_keep_path_is_a_fresh_prefill() {
    for target in TARGETS {
        let mut lm = load(&fixtures().join(target), false);
        check_model(target, lm.model.as_mut(), 4);
    }
}

#[test]
fn tree_rows_on_a_quantized_gguf() {
    let path = real_model(SMOLLM2);
    let mut lm = load(&path, false);
    check_model(SMOLLM2, lm.model.as_mut(), 2);
}

/// A grown tree (rows cached by earlier forwards, as a drafter grows its tree depth by depth) gets the bits
/// of the whole tree in one forward.
#[test]
fn a_tree_grown_depth_by_depth_gets_the_bits_of_one_forward() {
    let mut lm = load(&fixtures().join("tiny-qwen2"), false);
    let m = lm.model.as_mut();
    let parents = [None, None, Some(0), Some(1), Some(1), Some(2), Some(4)];
    let tokens = [5, 9, 11, 13, 17, 19, 23];
    let prompt = [3, 1, 4, 1, 5, 9, 2, 6];
    m.forward(&prompt, &ForwardOptions::logits(LogitRows::Last(1))).unwrap();
    let whole = ForwardOptions {
        tree: Some(Arc::new(TreeMask::new(&parents).unwrap())),
        ..ForwardOptions::logits(LogitRows::All)
    };
    let once = m.forward(&tokens, &whole).unwrap().logits.unwrap().to_vec2::<f32>().unwrap();
    m.truncate(prompt.len());
    let mut grown = Vec::new();
    for (from, to) in [(0, 2), (2, 5), (5, 7)] {
        let tree = TreeMask::new(&parents[..to]).unwrap().with_cached(from).unwrap();
        let opts = ForwardOptions { tree: Some(Arc::new(tree)), ..ForwardOptions::logits(LogitRows::All) };
        grown.extend(m.forward(&tokens[from..to], &opts).unwrap().logits.unwrap().to_vec2::<f32>().unwrap());
    }
    assert_eq!(grown.iter().map(|r| bits(r)).collect::<Vec<_>>(), once.iter().map(|r| bits(r)).collect::<Vec<_>>());
}

/// Prompts that repeat themselves with variations, so that prompt lookup finds several distinct continuations.
fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    let mut next = token_stream(0x7EE5, vocab);
    (0..5)
        .map(|i| {
            let base: Vec<u32> = (0..2 + i).map(|_| next()).collect();
            let mut p = Vec::new();
            for _ in 0..3 + i % 2 {
                p.extend_from_slice(&base);
                p.extend((0..1 + i % 3).map(|_| next()));
            }
            p.extend_from_slice(&base);
            p
        })
        .collect()
}

#[test]
fn greedy_trees_equal_plain_greedy() {
    for target in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        let mut plain = pipeline(target, None);
        let mut pipe = pipeline(target, Some("tiny-llama-assistant"));
        let vocab = plain.target.config().vocab_size as u32;
        let (mut lookup_trees, mut assistant_trees) = (0, 0);
        for (i, input) in prompts(vocab).iter().enumerate() {
            let base = greedy(24 + 3 * i);
            let want = plain.generate_ids(input, &base, None).unwrap().tokens;
            for (topk, nodes, steps) in [(2, 4, None), (3, 16, None), (4, 24, Some(6)), (2, 1, Some(1))] {
                for cost_aware in [false, true] {
                    let tree = GenerationOptions {
                        speculative_eagle_topk: Some(topk),
                        speculative_num_draft_tokens: Some(nodes),
                        speculative_num_steps: steps,
                        cost_aware_drafting: Some(cost_aware),
                        ..base.clone()
                    };
                    let what = format!(
                        "{target} prompt {i} topk {topk} nodes {nodes} steps {steps:?} cost-aware {cost_aware}"
                    );
                    let lookup = GenerationOptions { prompt_lookup_num_tokens: Some(4), ..tree.clone() };
                    let out = plain.generate_ids(input, &lookup, None).unwrap();
                    assert_eq!(out.tokens, want, "prompt lookup, {what}");
                    assert!(out.stats.rounds.iter().all(|&(n, _)| n <= nodes), "{what}: {:?}", out.stats.rounds);
                    lookup_trees += out.stats.tree_rounds;
                    let assisted = GenerationOptions {
                        num_assistant_tokens: Some(5),
                        assistant_confidence_threshold: Some(0.6),
                        ..tree
                    };
                    let out = pipe.generate_ids(input, &assisted, None).unwrap();
                    assert_eq!(out.tokens, want, "assistant, {what}");
                    assert_eq!(out.stats.method, "assistant_model");
                    assistant_trees += out.stats.tree_rounds;
                }
            }
        }
        println!("{target}: rounds with branching trees: prompt lookup {lookup_trees}, assistant {assistant_trees}");
        assert!(lookup_trees > 10 && assistant_trees > 10, "{target}: {lookup_trees} / {assistant_trees} tree rounds");
    }
}

#[test]
fn tree_options_are_checked() {
    let mut pipe = pipeline("tiny-llama", None);
    let err = |o: GenerationOptions, pipe: &mut augur::pipeline::Pipeline| {
        pipe.generate_ids(&[1, 2, 3], &o, None).unwrap_err().to_string()
    };
    let zero = GenerationOptions { speculative_num_draft_tokens: Some(0), ..greedy(4) };
    assert!(err(zero, &mut pipe).contains("`speculative_num_draft_tokens` must be at least 1"));
    let early = GenerationOptions { speculative_eagle_topk: Some(2), assistant_early_exit: Some(1), ..greedy(4) };
    assert!(err(early, &mut pipe).contains("not with method"), "early exit with trees");
    let mut gemma4 = pipeline("tiny-gemma4", None);
    let lookup = GenerationOptions { speculative_eagle_topk: Some(2), prompt_lookup_num_tokens: Some(3), ..greedy(4) };
    assert!(err(lookup, &mut gemma4).contains("do not verify trees"));
}
