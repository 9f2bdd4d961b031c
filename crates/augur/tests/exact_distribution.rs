//! Speculative sampling keeps the target's exact distribution, for every drafter, and the lossy ensemble keeps
//! its mixture: on the tiny fixtures with a small support (top-k), the exact distribution of the first four
//! tokens is enumerated through the target (and the drafter, for the ensemble), and the histogram of seeded
//! speculative draws is tested against it (Pearson's chi-square, α = 10⁻³).
//!
//! Power: each test draws as many continuations as give it power 0.99 against any deviation at chi-square distance
//! `Σ (p'−p)²/p ≥ 0.01` (for example a 10% relative error on every cell, half up and half down, or 20% on cells
//! holding a quarter of the mass); [`exact::draws_for_power`] computes the draws from the cells' degrees of
//! freedom, and each test prints them. A drawn continuation of exact probability 0 fails the test outright.
//!
//! Each test also asserts that what it tests happened: every draw had a round that drafted the stated number of
//! positions, and drafts were both accepted and rejected. Cost-aware drafting is off: it drafts or not on measured
//! seconds, and these tests must follow Transformers' rounds.
//!
//! The mutation tests at the end swap deliberately broken verifiers (and broken drafters) into the same tests,
//! with the same draws, and assert that the test then fails.

mod common;

use augur::generation::config::{GenerationConfig, GenerationOptions};
use augur::generation::logits::LogitsProcessor;
use augur::generation::output::{Emitter, GenerationOutput, GenerationStats};
use augur::generation::sampler::{softmax, Sampler};
use augur::kernels::logits::Logits;
use augur::models::mtp::MtpHead;
use augur::models::{CausalLm, ForwardOptions, LogitRows};
use augur::pipeline::{Assistant, LoadedLm};
use augur::speculation::methods::{
    AssistantModel, EarlyExit, Gemma4AssistantDrafter, MtpDrafter, PromptLookup, SuffixDrafter, UniversalSampling,
};
use augur::speculation::verify::{self, Block, TreeBlock, TreeVerdict, Verdict, Verifier};
use augur::speculation::{draft_vocab, speculative};
use augur::speculation::{Draft, Drafter};
use common::exact::{self, Distribution, Histogram};
use common::*;

const TOKENS: usize = 4;
/// A prompt with a repeated bigram, so that prompt lookup drafts three tokens in the first round.
const PROMPT: [u32; 9] = [297, 346, 370, 319, 265, 280, 297, 346, 370];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Method {
    Assistant,
    Lookup,
    EarlyExit(usize),
    Mtp,
    /// The first of a two-layer checkpoint's MTP layers alone: a one-layer MTP drafter on a 3-layer target (the
    /// one-layer fixtures keep 61 and 46 decoder layers, where Transformers looks for them, and draw too slowly).
    MtpFirstLayer,
    Gemma4,
    Universal,
    /// Suffix decoding over the request's own prompt: one-hot siblings scored by counts.
    Suffix,
}

/// One distribution test: the models, the drafter, the options, and how many positions a round must have drafted
/// in every draw.
struct Case {
    name: &'static str,
    target: &'static str,
    assistant: Option<&'static str>,
    method: Method,
    options: GenerationOptions,
    prompt: Vec<u32>,
    /// Every draw has a round that drafted at least this many positions.
    min_round: usize,
}

/// Seeded sampling of [`TOKENS`] tokens from a top-3 distribution at temperature 1.5, three drafts a round, no
/// confidence stop, no EOS, cost-aware drafting off.
fn sampling() -> GenerationOptions {
    GenerationOptions {
        do_sample: Some(true),
        top_k: Some(3),
        temperature: Some(1.5),
        num_assistant_tokens: Some(3),
        num_assistant_tokens_schedule: Some("constant".into()),
        assistant_confidence_threshold: Some(0.0),
        cost_aware_drafting: Some(false),
        ..greedy(TOKENS)
    }
}

fn case(name: &'static str, method: Method, options: GenerationOptions) -> Case {
    let (target, assistant, min_round) = match method {
        Method::Assistant => ("tiny-llama", Some("tiny-llama-assistant"), 3),
        Method::Lookup => ("tiny-llama", None, 3),
        Method::EarlyExit(_) => ("tiny-llama", None, 3),
        Method::Mtp => ("tiny-deepseek-v3-mtp2", None, 2),
        Method::MtpFirstLayer => ("tiny-deepseek-v3-mtp2", None, 1),
        Method::Gemma4 => ("tiny-gemma4", Some("tiny-gemma4-assistant"), 2),
        Method::Universal => ("tiny-llama", Some("tiny-qwen2-metaspace"), 3),
        Method::Suffix => ("tiny-llama", None, 2),
    };
    let options = match method {
        Method::Lookup => GenerationOptions { prompt_lookup_num_tokens: Some(3), ..options },
        Method::EarlyExit(l) => GenerationOptions { assistant_early_exit: Some(l), ..options },
        Method::Mtp | Method::MtpFirstLayer => GenerationOptions { use_mtp: Some(true), ..options },
        Method::Suffix => GenerationOptions { suffix_max_spec_factor: Some(2.0), ..options },
        _ => options,
    };
    let prompt = match method {
        Method::Lookup if options.speculative_eagle_topk.is_some() => lookup_tree_prompt(&options),
        Method::Suffix => lookup_tree_prompt(&options),
        Method::Lookup => lookup_prompt(&options),
        _ => PROMPT.to_vec(),
    };
    Case { name, target, assistant, method, options, prompt, min_round }
}

/// `a b d x y z a b`: prompt lookup drafts `d x y` after it. `d` is the token the target itself gives the most
/// probability after that very prompt under `options`' processors (searched over the vocabulary), so that the first draft is often accepted
/// and both paths of the verifier run.
fn lookup_prompt(options: &GenerationOptions) -> Vec<u32> {
    vec![297, 346, likely_after_bigram(options)[0], 319, 265, 280, 297, 346]
}

/// The tokens `d` most probable after `a b d x y z a b` (see [`lookup_prompt`]), most probable first.
fn likely_after_bigram(options: &GenerationOptions) -> Vec<u32> {
    let with = |d: u32| vec![297, 346, d, 319, 265, 280, 297, 346];
    let cfg = GenerationConfig::from_options(options);
    let mut lm = load(&fixtures().join("tiny-llama"), false);
    let vocab = lm.config().vocab_size;
    let mut p: Vec<(f32, u32)> = (0..vocab as u32)
        .map(|d| (exact::next_distribution(lm.model.as_mut(), &cfg, 8, &with(d), None, vocab)[d as usize], d))
        .collect();
    p.sort_by(|a, b| b.0.total_cmp(&a.0));
    p.into_iter().map(|(_, d)| d).collect()
}

/// `a b d x y a b e z a b`: a tree of prompt lookup has two distinct continuations, `e z a` (the more recent,
/// tried first) and `d x y`, with `d` and `e` the two tokens most probable after the bigram.
fn lookup_tree_prompt(options: &GenerationOptions) -> Vec<u32> {
    let with = |d: u32, e: u32| vec![297, 346, d, 319, 265, 297, 346, e, 280, 297, 346];
    // Of the pairs of tokens likely after the bigram or after the prompts tried, the one whose two tokens are
    // both likely after the prompt they make (the smaller probability largest): both siblings are then often
    // accepted.
    let likely = likely_after_bigram(options);
    let cfg = GenerationConfig::from_options(options);
    let mut lm = load(&fixtures().join("tiny-llama"), false);
    let vocab = lm.config().vocab_size;
    let mut best = (0.0, vec![]);
    let mut candidates: Vec<u32> = likely[..3].to_vec();
    for _ in 0..3 {
        let mut found = Vec::new();
        for &d in &candidates {
            for &e in candidates.iter().filter(|&&e| e != d) {
                let p = exact::next_distribution(lm.model.as_mut(), &cfg, 11, &with(d, e), None, vocab);
                let score = p[d as usize].min(p[e as usize]);
                if score > best.0 {
                    best = (score, with(d, e));
                }
                found.extend((0..vocab as u32).filter(|&t| p[t as usize] > 0.2));
            }
        }
        for t in found {
            if !candidates.contains(&t) && candidates.len() < 8 {
                candidates.push(t);
            }
        }
    }
    assert!(best.0 > 0.05, "no prompt whose two continuations are both likely: {}", best.0);
    best.1
}

/// The first layer of an MTP head alone.
struct FirstLayer<'a>(&'a mut dyn MtpHead);

impl MtpHead for FirstLayer<'_> {
    fn num_layers(&self) -> usize {
        1
    }
    fn forward_layer(
        &mut self,
        k: usize,
        tokens: &[u32],
        hidden: &augur::Tensor,
        first: usize,
    ) -> augur::Result<augur::Tensor> {
        self.0.forward_layer(k, tokens, hidden, first)
    }
    fn logits(&self, row: &augur::Tensor) -> augur::Result<Vec<f32>> {
        self.0.logits(row)
    }
    fn cache_len(&mut self, k: usize) -> usize {
        self.0.cache_len(k)
    }
    fn truncate(&mut self, k: usize, len: usize) {
        self.0.truncate(k, len)
    }
}

struct Models {
    target: LoadedLm,
    assistant: Option<Assistant>,
}

impl Models {
    fn load(case: &Case) -> Self {
        let target = load(&fixtures().join(case.target), false);
        let assistant = case
            .assistant
            .map(|a| Assistant::load(&fixtures().join(a), &Default::default(), &target.tokenizer).unwrap());
        Models { target, assistant }
    }
}

/// The assistant as a causal LM.
fn lm(a: &mut Option<Assistant>) -> &mut LoadedLm {
    a.as_mut().and_then(Assistant::lm_mut).expect("a causal LM assistant")
}

/// A drafter whose `q` is taken before its processors (the softmax of the assistant's raw logits), while its
/// tokens are still drawn from the processed distribution: mutation 5.
struct RawQ<'a> {
    inner: Box<dyn Drafter + 'a>,
    raw: &'a mut dyn CausalLm,
    vocab: usize,
}

impl Drafter for RawQ<'_> {
    fn method(&self) -> &'static str {
        "raw_q"
    }
    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> augur::Result<Draft> {
        let mut d = self.inner.propose(target, context, max)?;
        if let (Some(q), false) = (d.q.as_mut(), d.tokens.is_empty()) {
            let mut feed = context.to_vec();
            feed.extend_from_slice(&d.tokens[..d.tokens.len() - 1]);
            self.raw.truncate(0);
            let out = self.raw.forward(&feed, &ForwardOptions::logits(LogitRows::Last(d.tokens.len())))?;
            for (qi, mut row) in q.iter_mut().zip(out.logits.unwrap().to_vec2::<f32>()?) {
                row.resize(self.vocab, f32::NEG_INFINITY);
                qi.copy_from_slice(&softmax(&row));
            }
        }
        Ok(d)
    }
    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> augur::Result<()> {
        self.inner.observe(context, proposed, accepted)
    }
    fn reads_target(&self) -> augur::speculation::TargetReads {
        self.inner.reads_target()
    }
    fn target_hidden(&mut self, hidden: &augur::Tensor, rows: usize) -> augur::Result<()> {
        self.inner.target_hidden(hidden, rows)
    }
}

/// A drafter's broken `q`, computed with a second copy of the assistant.
#[derive(Clone, Copy, PartialEq)]
enum Mutant {
    /// Its raw `q` (mutation 5, [`RawQ`]).
    RawQ,
    /// Its whole-vocabulary `q` restricted to its draft vocabulary, not renormalised ([`UnnormalisedQ`]).
    Unnormalised,
}

/// The draft vocabulary an assistant drafter builds in its first round for `options`' `draft_vocab_size`:
/// the frequent ids, then the first round's context (`context`) and EOS outside them.
fn draft_vocab_of(
    options: &GenerationOptions,
    tokenizer: &augur::tokenizer::Tokenizer,
    vocab: usize,
    context: &[u32],
) -> Vec<u32> {
    let n = options.draft_vocab_size.expect("a reduced draft vocabulary");
    let eos = GenerationConfig::from_options(options).eos_token_id;
    let top = draft_vocab::top_ids(tokenizer, vocab, n);
    let extra = draft_vocab::extra_ids(&top, context.iter().chain(&eos).copied(), vocab);
    [top, extra].concat()
}

/// A drafter over a reduced draft vocabulary whose `q` is the assistant's whole-vocabulary (processed)
/// distribution restricted to the draft vocabulary, not renormalised over it, while its drafts are still drawn
/// from the renormalised one: mutation 6.
struct UnnormalisedQ<'a> {
    inner: Box<dyn Drafter + 'a>,
    /// A second copy of the assistant, with its whole head.
    full: &'a mut dyn CausalLm,
    tokenizer: std::sync::Arc<augur::tokenizer::Tokenizer>,
    options: GenerationOptions,
    cfg: GenerationConfig,
    prompt_len: usize,
    vocab: usize,
    /// Whether each id is in the draft vocabulary, from the first round on.
    inside: Option<Vec<bool>>,
}

impl Drafter for UnnormalisedQ<'_> {
    fn method(&self) -> &'static str {
        "unnormalised_q"
    }
    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> augur::Result<Draft> {
        let d = self.inner.propose(target, context, max)?;
        let inside = self.inside.get_or_insert_with(|| {
            let mut inside = vec![false; self.vocab];
            let ids = draft_vocab_of(&self.options, &self.tokenizer, self.full.config().vocab_size, context);
            ids.into_iter().for_each(|id| inside[id as usize] = true);
            inside
        });
        let mut d = d;
        if let Some(q) = d.q.as_mut() {
            for (i, qi) in q.iter_mut().enumerate() {
                let ctx = [context, &d.tokens[..i]].concat();
                let full = exact::next_distribution(self.full, &self.cfg, self.prompt_len, &ctx, None, self.vocab);
                for ((x, &p), &k) in qi.iter_mut().zip(&full).zip(inside.iter()) {
                    *x = if k { p } else { 0.0 };
                }
            }
        }
        Ok(d)
    }
    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> augur::Result<()> {
        self.inner.observe(context, proposed, accepted)
    }
}

/// One seeded speculative generation of `case`, with `verifier`; with a `mutant` (and a second copy of the
/// assistant), the drafter reports a broken `q`.
fn run(
    m: &mut Models,
    case: &Case,
    seed: u64,
    verifier: &dyn Verifier,
    mutant: Option<(Mutant, &mut LoadedLm)>,
) -> GenerationOutput {
    let opts = GenerationOptions { seed: Some(seed), ..case.options.clone() };
    let cfg = GenerationConfig::from_options(&opts);
    let prompt = &case.prompt;
    let target = &mut m.target;
    let vocab = target.config().vocab_size;
    target.model.truncate(0);
    let mut first_layer;
    let mut drafter: Box<dyn Drafter + '_> = match case.method {
        Method::Assistant => {
            let a = lm(&mut m.assistant);
            Box::new(AssistantModel::new(a.model.as_mut(), &cfg, prompt.len(), vocab, &a.tokenizer).unwrap())
        }
        Method::Lookup => Box::new(
            PromptLookup::new(3, cfg.effective_max_matching_ngram_size(), cfg.eos_token_id.clone())
                .unwrap()
                .tree(cfg.tree_shape()),
        ),
        Method::EarlyExit(l) => {
            Box::new(EarlyExit::new(l, target.config().num_hidden_layers, &cfg, prompt.len()).unwrap())
        }
        Method::Mtp => Box::new(MtpDrafter::new(target.mtp.as_mut().unwrap().as_mut(), &cfg, prompt.len()).unwrap()),
        Method::MtpFirstLayer => {
            first_layer = FirstLayer(target.mtp.as_mut().unwrap().as_mut());
            Box::new(MtpDrafter::new(&mut first_layer, &cfg, prompt.len()).unwrap())
        }
        Method::Gemma4 => {
            let Some(Assistant::Gemma4(a)) = m.assistant.as_ref() else { panic!("Gemma 4's assistant") };
            let a = a.model.as_ref();
            Box::new(Gemma4AssistantDrafter::new(a, &cfg, prompt.len(), target.config().sliding_window).unwrap())
        }
        Method::Suffix => Box::new(SuffixDrafter::new(&cfg, prompt.len(), None).unwrap()),
        Method::Universal => {
            let a = lm(&mut m.assistant);
            Box::new(
                UniversalSampling::new(a.model.as_mut(), &target.tokenizer, &a.tokenizer, &cfg, prompt.len(), vocab)
                    .unwrap(),
            )
        }
    };
    match mutant {
        Some((Mutant::RawQ, raw)) => drafter = Box::new(RawQ { inner: drafter, raw: raw.model.as_mut(), vocab }),
        Some((Mutant::Unnormalised, full)) => {
            drafter = Box::new(UnnormalisedQ {
                inner: drafter,
                tokenizer: std::sync::Arc::clone(&full.tokenizer),
                full: full.model.as_mut(),
                options: case.options.clone(),
                cfg: cfg.clone(),
                prompt_len: prompt.len(),
                vocab,
                inside: None,
            })
        }
        None => {}
    }
    let max_new = cfg.max_new_tokens.unwrap();
    let mut emitter = Emitter::new(&target.tokenizer, prompt, max_new, cfg.eos_token_id.clone(), vec![], None);
    let mut stats = GenerationStats::default();
    speculative::generate_with(target.model.as_mut(), drafter.as_mut(), &cfg, &mut emitter, &mut stats, verifier)
        .unwrap();
    drop(drafter);
    emitter.into_output(stats)
}

/// What the draws of a case did, beyond their tokens.
#[derive(Default, Debug)]
struct Drafting {
    /// Draws with a round that drafted at least [`Case::min_round`] positions.
    full_rounds: usize,
    accepted: usize,
    rejected: usize,
    /// Draws with a round that verified a branching tree.
    tree_draws: usize,
}

/// `draws` seeded generations of `case` with `verifier`, their histogram and what drafting did.
fn draw(case: &Case, draws: usize, verifier: &dyn Verifier, mutant: Option<Mutant>) -> (Histogram, Drafting) {
    let mut m = Models::load(case);
    let mut second = mutant.map(|_| load(&fixtures().join(case.assistant.unwrap()), false));
    let mut d = Drafting::default();
    let h = histogram(draws, |s| {
        let out = run(&mut m, case, s, verifier, mutant.zip(second.as_mut()));
        d.full_rounds += out.stats.rounds.iter().any(|&(g, _)| g >= case.min_round) as usize;
        d.tree_draws += (out.stats.tree_rounds > 0) as usize;
        for &(g, n) in &out.stats.rounds {
            d.accepted += n.min(g);
            d.rejected += (n < g) as usize;
        }
        out.tokens
    });
    (h, d)
}

/// The exact distribution of `case`'s output: the target's for lossless verification, else the ensemble's
/// mixture walk (an assistant model or early exit as the drafter).
fn exact_distribution(case: &Case) -> Distribution {
    let cfg = GenerationConfig::from_options(&case.options);
    let mut target = load(&fixtures().join(case.target), false);
    let vocab = target.config().vocab_size;
    let n = cfg.max_new_tokens.unwrap();
    let prompt_len = case.prompt.len();
    let mut p = |ctx: &[u32]| exact::next_distribution(target.model.as_mut(), &cfg, prompt_len, ctx, None, vocab);
    let Some(w) = cfg.assistant_ensemble_weight else {
        return exact::plain(&case.prompt, n, &cfg.eos_token_id, &mut p);
    };
    let k = cfg.effective_num_assistant_tokens();
    match case.method {
        Method::Assistant => {
            let mut a = load(&fixtures().join(case.assistant.unwrap()), false);
            let mut q = |ctx: &[u32]| exact::next_distribution(a.model.as_mut(), &cfg, prompt_len, ctx, None, vocab);
            exact::ensemble(&case.prompt, n, k, w as f64, &mut p, &mut q)
        }
        Method::EarlyExit(l) => {
            let mut t = load(&fixtures().join(case.target), false);
            let mut q = |ctx: &[u32]| exact::next_distribution(t.model.as_mut(), &cfg, prompt_len, ctx, Some(l), vocab);
            exact::ensemble(&case.prompt, n, k, w as f64, &mut p, &mut q)
        }
        other => panic!("no ensemble walk for {other:?}"),
    }
}

/// The test itself, with `verifier` in the loop: the fit of the draws to the exact distribution, and what
/// drafting did.
fn test_case(case: &Case, verifier: &dyn Verifier, mutant: Option<Mutant>) -> (exact::Fit, Drafting, usize) {
    let exact = exact_distribution(case);
    let total: f64 = exact.values().sum();
    assert!((total - 1.0).abs() < 1e-4, "{}: the enumeration sums to {total}", case.name);
    assert!(exact.len() > 10, "{}: the test needs a spread distribution, got {} outcomes", case.name, exact.len());
    let draws = exact::draws_for_power(&exact);
    let (h, drafting) = draw(case, draws, verifier, mutant);
    (exact::fit(&h, &exact), drafting, draws)
}

/// A case passes with the engine's verifier, and drafting did what the test is about.
fn check(case: Case) {
    // The harness runs what the pipeline runs: the same tokens for the same seeds (the pipeline cannot run one
    // layer of a two-layer MTP head).
    let mut pipe = pipeline(case.target, case.assistant);
    let mut m = Models::load(&case);
    for seed in (0..8).filter(|_| case.method != Method::MtpFirstLayer) {
        let opts = GenerationOptions { seed: Some(seed), ..case.options.clone() };
        let want = pipe.generate_ids(&case.prompt, &opts, None).unwrap();
        let got = run(&mut m, &case, seed, &verify::Exact, None);
        assert_eq!(got.tokens, want.tokens, "{}: harness and pipeline differ at seed {seed}", case.name);
        assert_eq!(got.stats.method, want.stats.method, "{}", case.name);
    }
    let (fit, d, draws) = test_case(&case, &verify::Exact, None);
    println!(
        "{}: {draws} draws, {} degrees of freedom, chi-square {:.1} (critical {:.1}), {d:?}",
        case.name, fit.df, fit.statistic, fit.critical
    );
    assert_eq!(
        d.full_rounds, draws,
        "{}: only {} of {draws} draws drafted {} positions in a round",
        case.name, d.full_rounds, case.min_round
    );
    // Both paths of the verifier ran often enough to matter.
    assert!(
        d.accepted > draws / 20 && d.rejected > draws / 50,
        "{}: accepted {} drafts, rejected {} rounds",
        case.name,
        d.accepted,
        d.rejected
    );
    if case.options.speculative_eagle_topk.is_some_and(|k| k > 1) || case.method == Method::Suffix {
        assert_eq!(d.tree_draws, draws, "{}: draws without a branching tree", case.name);
    }
    assert!(fit.passes(), "{}: {fit:?}", case.name);
}

// ---------------------------------------------------------------------------------------------------------------
// Trees: multi-draft speculative sampling over siblings

/// Tree drafts of two branches: an assistant that branches at every node (its top probability is always
/// below 1), drawing two children independently from its distribution; prompt lookup with two distinct
/// continuations (one-hot siblings).
fn tree_sampling() -> GenerationOptions {
    GenerationOptions { speculative_eagle_topk: Some(2), assistant_confidence_threshold: Some(1.0), ..sampling() }
}

/// Suffix decoding after `a b d x y a b e z a b`: `d` and `e` each followed `a b` once, one-hot siblings of
/// probability 1/2 each, with their continuations behind them.
#[test]
fn suffix_tree() {
    check(case("suffix tree", Method::Suffix, sampling()));
}

#[test]
fn assistant_tree() {
    check(case("assistant tree", Method::Assistant, tree_sampling()));
}

#[test]
fn prompt_lookup_tree() {
    check(case("prompt lookup tree", Method::Lookup, tree_sampling()));
}

#[test]
fn assistant_tree_with_repetition_penalty() {
    let opts = GenerationOptions { repetition_penalty: Some(3.0), ..tree_sampling() };
    check(case("assistant tree, repetition penalty", Method::Assistant, opts));
}

#[test]
fn assistant_model() {
    check(case("assistant model", Method::Assistant, sampling()));
}

/// A reduced draft vocabulary of [`DRAFT_VOCAB`] ids (the fixture's tokenizer has no frequency table: its
/// first ids), plus the prompt's and the first round's context's: `q` is renormalised over it.
fn reduced_vocab(options: GenerationOptions) -> GenerationOptions {
    GenerationOptions { draft_vocab_size: Some(DRAFT_VOCAB), ..options }
}

/// Of the fixture's 448 ids: small enough that the target's likely tokens are often outside it.
const DRAFT_VOCAB: usize = 96;

#[test]
fn assistant_with_a_reduced_draft_vocabulary() {
    check(case("assistant, reduced draft vocabulary", Method::Assistant, reduced_vocab(sampling())));
}

#[test]
fn assistant_tree_with_a_reduced_draft_vocabulary() {
    check(case("assistant tree, reduced draft vocabulary", Method::Assistant, reduced_vocab(tree_sampling())));
}

#[test]
fn prompt_lookup() {
    check(case("prompt lookup", Method::Lookup, sampling()));
}

#[test]
fn early_exit() {
    check(case("early exit", Method::EarlyExit(1), sampling()));
}

#[test]
fn mtp_one_layer() {
    check(case("MTP, one layer", Method::MtpFirstLayer, sampling()));
}

#[test]
fn mtp_two_layers() {
    check(case("MTP, two layers", Method::Mtp, sampling()));
}

#[test]
fn gemma4_assistant() {
    check(case("Gemma 4 assistant", Method::Gemma4, sampling()));
}

#[test]
fn universal_sampling() {
    check(case("universal sampling", Method::Universal, sampling()));
}

// ---------------------------------------------------------------------------------------------------------------
// Processors that read the context, with drafted positions inside the block

fn repetition_penalty(penalty: f32) -> GenerationOptions {
    GenerationOptions { repetition_penalty: Some(penalty), ..sampling() }
}

/// EOS allowed from the third new token on: it can end the sequence at the last draft of the first round.
fn min_new_tokens() -> GenerationOptions {
    GenerationOptions { min_new_tokens: Some(2), eos_token_id: Some(vec![likely_eos()]), ..sampling() }
}

/// The token plain sampling most often draws third (so that EOS lands inside the first block often).
fn likely_eos() -> u32 {
    let case = case("", Method::Assistant, sampling());
    let exact = exact_distribution(&case);
    let mut third = std::collections::HashMap::<u32, f64>::new();
    for (seq, p) in &exact {
        *third.entry(seq[2]).or_default() += p;
    }
    third.into_iter().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap().0
}

#[test]
fn assistant_with_repetition_penalty() {
    check(case("assistant, repetition penalty", Method::Assistant, repetition_penalty(3.0)));
}

#[test]
fn prompt_lookup_with_repetition_penalty() {
    // Milder: lookup drafts only tokens of the context, which a strong penalty keeps out of the top 3.
    check(case("prompt lookup, repetition penalty", Method::Lookup, repetition_penalty(1.3)));
}

#[test]
fn assistant_with_top_p() {
    let opts = GenerationOptions { top_k: Some(6), top_p: Some(0.7), temperature: Some(1.3), ..sampling() };
    check(case("assistant, top-p", Method::Assistant, opts));
}

#[test]
fn assistant_with_min_p() {
    let opts = GenerationOptions { top_k: Some(4), min_p: Some(0.3), ..sampling() };
    check(case("assistant, min-p", Method::Assistant, opts));
}

#[test]
fn assistant_with_min_new_tokens_and_eos_in_the_block() {
    let c = case("assistant, min_new_tokens", Method::Assistant, min_new_tokens());
    let eos = c.options.eos_token_id.clone().unwrap();
    let exact = exact_distribution(&c);
    let early: f64 = exact.iter().filter(|(s, _)| s.len() < TOKENS).map(|(_, p)| p).sum();
    assert!(early > 0.1, "EOS {eos:?} ends only {early:.3} of the mass early");
    assert!(exact.keys().all(|s| s.len() >= 3), "EOS before the third token");
    check(c);
}

// ---------------------------------------------------------------------------------------------------------------
// The lossy ensemble follows its mixture ν, not the target

fn ensemble(name: &'static str, method: Method, w: f32) {
    let weighted = || case(name, method, GenerationOptions { assistant_ensemble_weight: Some(w), ..sampling() });
    let lossless = exact_distribution(&case(name, method, sampling()));
    let mixture = exact_distribution(&weighted());
    check(weighted());
    if method == Method::Assistant {
        // This assistant is so close to the target that ν is too (checked only for early exit, below).
        return;
    }
    // And it is not the target's: the same draws fail against p.
    let (h, _) = draw(&weighted(), exact::draws_for_power(&mixture), &verify::Exact, None);
    let fit = exact::fit(&h, &lossless);
    assert!(!fit.passes(), "{name}: w = {w} cannot be told from the target: {fit:?}");
}

#[test]
fn ensemble_with_the_assistant_follows_the_mixture() {
    ensemble("assistant ensemble, w = 0.3", Method::Assistant, 0.3);
}

#[test]
fn ensemble_with_early_exit_follows_the_mixture() {
    ensemble("early-exit ensemble, w = 0.5", Method::EarlyExit(1), 0.5);
}

// ---------------------------------------------------------------------------------------------------------------
// Mutations: the same tests, with the same draws, fail on deliberately broken verifiers

/// Speculative sampling with one defect switched on.
#[derive(Clone, Copy, PartialEq)]
enum Broken {
    /// Accept with `min(1, q/p)` instead of `min(1, p/q)`.
    InverseRatio,
    /// Resample a rejection from `p` instead of `[p − q]⁺`.
    ResidualP,
    /// Draw the bonus token after a fully accepted block from the last draft's `q`.
    BonusFromQ,
    /// Apply the processors to every row with the context before the block (the drafts left out).
    ContextBeforeBlock,
}

impl Verifier for Broken {
    fn process(&self, processor: &LogitsProcessor, context: &[u32], drafts: &[u32], rows: &mut Logits) {
        if *self != Broken::ContextBeforeBlock {
            return verify::Exact.process(processor, context, drafts, rows);
        }
        for row in rows {
            processor.process(context, row);
        }
    }

    fn verdict(&self, block: &Block<'_>, sampler: &mut Sampler) -> Verdict {
        if *self == Broken::ContextBeforeBlock {
            return verify::Exact.verdict(block, sampler);
        }
        let Block { drafts, rows, q, .. } = *block;
        let one_hot = |d: u32, n: usize| (0..n).map(|i| (i == d as usize) as u8 as f32).collect::<Vec<f32>>();
        for (i, &d) in drafts.iter().enumerate() {
            let p = softmax(&rows[i]);
            let qi = q.map_or_else(|| one_hot(d, p.len()), |q| q[i].to_vec());
            let (px, qx) = (p[d as usize] as f64, qi[d as usize] as f64);
            let r = sampler.uniform();
            let accept = match self {
                Broken::InverseRatio => r * px < qx,
                _ => r * qx < px,
            };
            if !accept {
                let residual: Vec<f32> = match self {
                    Broken::ResidualP => p,
                    _ => p.iter().zip(&qi).map(|(a, b)| (a - b).max(0.0)).collect(),
                };
                return Verdict { accepted: i, next: sampler.sample(&residual) };
            }
        }
        let bonus = match (self, q) {
            (Broken::BonusFromQ, Some(q)) if !drafts.is_empty() => q[drafts.len() - 1].to_vec(),
            _ => softmax(&rows[drafts.len()]),
        };
        Verdict { accepted: drafts.len(), next: sampler.sample(&bonus) }
    }
}

/// Multi-draft sampling over a tree with one defect switched on.
#[derive(Clone, Copy, PartialEq)]
enum BrokenTree {
    /// Every sibling tested against the node's own `p`, the residual never updated after a rejection (the
    /// token after all are rejected comes from the last sibling's residual alone).
    StaleResidual,
    /// After a rejected first sibling and an accepted later one, the walk goes on in the rejected sibling's
    /// subtree.
    RejectedSubtreeKept,
}

impl Verifier for BrokenTree {
    fn tree_verdict(&self, block: &TreeBlock<'_>, sampler: &mut Sampler) -> TreeVerdict {
        let TreeBlock { drafts, parents, rows, q, .. } = *block;
        let kids = verify::children(parents);
        let (mut node, mut path) = (0, Vec::new());
        'nodes: loop {
            let own = softmax(&rows[node]);
            let mut p = own.clone();
            let mut rejected_first = None;
            for &c in &kids[node] {
                let d = drafts[c] as usize;
                let qc = q.map_or_else(|| (0..p.len()).map(|i| (i == d) as u8 as f32).collect(), |q| q[c].to_vec());
                let tested = if *self == BrokenTree::StaleResidual { &own } else { &p };
                if qc[d] > 0.0 && sampler.uniform() * f64::from(qc[d]) < f64::from(tested[d]) {
                    path.push(c);
                    node = match (self, rejected_first) {
                        (BrokenTree::RejectedSubtreeKept, Some(r)) => r + 1,
                        _ => c + 1,
                    };
                    continue 'nodes;
                }
                rejected_first.get_or_insert(c);
                let base = if *self == BrokenTree::StaleResidual { &own } else { &p };
                let mut residual: Vec<f32> = base.iter().zip(&qc).map(|(a, b)| (a - b).max(0.0)).collect();
                let total: f32 = residual.iter().sum();
                if total > f32::MIN_POSITIVE {
                    residual.iter_mut().for_each(|v| *v /= total);
                    p = residual;
                }
            }
            return TreeVerdict { path, next: sampler.sample(&p) };
        }
    }
}

#[test]
fn stale_sibling_residuals_are_caught() {
    let c = case("assistant tree", Method::Assistant, tree_sampling());
    assert_caught(c, &BrokenTree::StaleResidual, None, "stale sibling residual");
}

#[test]
fn stale_residuals_over_one_hot_suffix_siblings_are_caught() {
    let c = case("suffix tree", Method::Suffix, sampling());
    assert_caught(c, &BrokenTree::StaleResidual, None, "stale sibling residual");
}

#[test]
fn a_kept_rejected_subtree_is_caught() {
    let c = case("assistant tree", Method::Assistant, tree_sampling());
    assert_caught(c, &BrokenTree::RejectedSubtreeKept, None, "rejected sibling's subtree kept");
}

fn assert_caught(case: Case, verifier: &dyn Verifier, mutant: Option<Mutant>, what: &str) {
    let (fit, d, draws) = test_case(&case, verifier, mutant);
    println!(
        "{what} on {}: {draws} draws, chi-square {:.1} (critical {:.1}), {} impossible",
        case.name, fit.statistic, fit.critical, fit.impossible
    );
    assert!(d.full_rounds == draws, "{what}: the mutant did not draft as the test expects");
    assert!(!fit.passes(), "{what} went unnoticed by the {} test: {fit:?}", case.name);
}

#[test]
fn acceptance_with_q_over_p_is_caught() {
    assert_caught(case("assistant model", Method::Assistant, sampling()), &Broken::InverseRatio, None, "min(1, q/p)");
}

#[test]
fn residual_p_is_caught() {
    assert_caught(case("assistant model", Method::Assistant, sampling()), &Broken::ResidualP, None, "residual p");
}

#[test]
fn bonus_from_q_is_caught() {
    assert_caught(case("assistant model", Method::Assistant, sampling()), &Broken::BonusFromQ, None, "bonus from q");
}

#[test]
fn processors_without_the_drafted_prefix_are_caught() {
    let c = case("assistant, repetition penalty", Method::Assistant, repetition_penalty(3.0));
    assert_caught(c, &Broken::ContextBeforeBlock, None, "context before the block");
}

#[test]
fn q_before_the_drafters_processors_is_caught() {
    assert_caught(
        case("assistant model", Method::Assistant, sampling()),
        &verify::Exact,
        Some(Mutant::RawQ),
        "q before processors",
    );
}

/// Mutation 6: `q` is the whole vocabulary's distribution restricted to the draft vocabulary instead of the
/// distribution the draft was drawn from (renormalised over it).
#[test]
fn q_not_renormalised_over_the_draft_vocabulary_is_caught() {
    let c = case("assistant, reduced draft vocabulary", Method::Assistant, reduced_vocab(sampling()));
    assert_caught(c, &verify::Exact, Some(Mutant::Unnormalised), "q not renormalised over the draft vocabulary");
}

#[test]
fn the_power_arithmetic_is_right() {
    // Central quantiles at 0.999 and the noncentrality giving power 0.99 at α = 0.001, from scipy.stats (chi2.ppf,
    // and brentq over ncx2.sf): df 10 → 29.588 and λ 49.52; df 40 → λ 74.42; df 63 → λ 87.00.
    // Wilson–Hilferty is within 1% of the quantile from 10 degrees of freedom on.
    assert!((exact::chi_square_quantile(10.0, 0.999) / 29.588 - 1.0).abs() < 0.01);
    assert!((exact::chi_square_quantile(50.0, 0.999) / 86.661 - 1.0).abs() < 0.01);
    for (df, lambda) in [(10.0, 49.52), (40.0, 74.42), (63.0, 87.00)] {
        let ours = exact::lambda_for_power(df);
        assert!((ours / lambda - 1.0).abs() < 0.03, "df {df}: λ {ours} against scipy's {lambda}");
    }
}
