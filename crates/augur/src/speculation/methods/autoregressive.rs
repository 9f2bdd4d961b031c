//! Token-by-token drafting with a model's own logits, shared by the drafters that run a model (the assistant
//! model, early exit): the target's processors, a sampler of its own, the draft length with its schedules and
//! confidence threshold, and the stop at EOS.

use std::sync::Arc;

use crate::error::Result;
use crate::generation::config::GenerationConfig;
use crate::generation::decode::logits_rows;
use crate::generation::logits::LogitsProcessor;
use crate::generation::sampler::{argmax, softmax, Sampler};
use crate::kernels::logits::Logits;
use crate::models::{CausalLm, ForwardOptions, HeadSubset, LogitRows};
use crate::nn::TreeMask;
use crate::speculation::draft_length::DraftLength;
use crate::speculation::drafter::{Draft, TreeShape};

pub(super) struct Autoregressive {
    /// The target's processors, applied once (Transformers applies the warpers twice inside the assistant).
    processor: LogitsProcessor,
    sampler: Sampler,
    pub length: DraftLength,
    eos: Vec<u32>,
    /// Whether drafts carry their distributions: for speculative sampling, and for ensemble verification.
    keep_q: bool,
    /// The drafting model's name in errors.
    name: &'static str,
    /// `cfg`'s tree shape: [`Self::draft_tree`]'s.
    pub tree: Option<TreeShape>,
    /// The cost model's cap on the coming round's verification rows: a tree keeps its most probable nodes
    /// within it.
    pub row_cap: Option<usize>,
}

impl Autoregressive {
    /// `cfg` is the call's resolved configuration (sampling options, seed, assistant knobs); `prompt_len` is for
    /// the minimum-length processor; `adaptive` is the confidence threshold's ROC update when `cfg` leaves it
    /// unset; `name` names the drafting model in errors.
    pub fn new(cfg: &GenerationConfig, prompt_len: usize, adaptive: bool, name: &'static str) -> Result<Self> {
        Ok(Self {
            processor: LogitsProcessor::new(cfg, prompt_len)?,
            // A stream of its own, so that drafting does not shift the verifier's random numbers.
            sampler: Sampler::for_drafter(cfg.seed),
            length: DraftLength::new(
                cfg.effective_num_assistant_tokens(),
                cfg.assistant_tokens_schedule(),
                cfg.effective_assistant_confidence_threshold(),
                cfg.assistant_confidence_adaptive.unwrap_or(adaptive),
            ),
            eos: cfg.eos_token_id.clone(),
            keep_q: cfg.do_sample || cfg.assistant_ensemble_weight.is_some(),
            name,
            tree: cfg.tree_shape(),
            row_cap: None,
        })
    }

    /// How many tokens this round drafts when the loop allows `max`.
    pub fn cap(&self, max: usize) -> usize {
        max.min(self.length.num_assistant_tokens)
    }

    /// Drafts up to [`Self::cap`]`(max)` tokens continuing `context`: `model` runs with `opts` on `feed` (the
    /// tokens it has not cached yet), then on each draft. Logits are laid out over `vocab` rows (the target's):
    /// rows past the shared vocabulary are padding on one side or the other and are never drafted.
    pub fn draft(
        &mut self,
        model: &mut dyn CausalLm,
        opts: &ForwardOptions,
        context: &[u32],
        mut feed: Vec<u32>,
        max: usize,
        vocab: usize,
    ) -> Result<Draft> {
        let max = self.cap(max);
        if max == 0 {
            return Ok(Draft::default());
        }
        let do_sample = self.processor.do_sample();
        let mut ctx = context.to_vec();
        let mut tokens = Vec::with_capacity(max);
        let mut qs = Logits::default();
        let mut confidences = Vec::with_capacity(max);
        for _ in 0..max {
            let out = model.forward(&feed, opts)?;
            let logits = logits_rows(&out, self.name, ctx.len() - 1)?.pop().unwrap_or_default();
            let mut logits = spread(logits, opts.head.as_deref(), vocab);
            if !self.processor.is_noop(ctx.len()) {
                self.processor.process(&ctx, &mut logits);
            }
            let q = softmax(&logits);
            let token = if do_sample { self.sampler.sample(&q) } else { argmax(&logits) };
            let confidence = q[token as usize];
            tokens.push(token);
            confidences.push(confidence);
            if self.keep_q {
                qs.push(&q);
            }
            ctx.push(token);
            feed = vec![token];
            // Transformers' ConfidenceCriteria: the low-confidence token is kept, then drafting stops.
            let threshold = self.length.confidence_threshold;
            if self.eos.contains(&token) || (threshold > 0.0 && confidence < threshold) {
                break;
            }
        }
        self.length.record_probs(&confidences);
        Ok(Draft { tokens, q: self.keep_q.then_some(qs), parents: None })
    }

    /// A tree of drafts of [`Self::tree`]'s `shape` (one branch without one) continuing `context`, at most
    /// [`Self::cap`]`(max)` deep (EAGLE-2's expansion, arXiv
    /// 2406.16858): depth by depth, each node of the frontier gets one child, or `shape.branches` children where
    /// the model's top probability there is below the confidence threshold (greedy: its top tokens; sampling:
    /// independent draws from its distribution, as multi-draft verification needs); of the new nodes, the
    /// `shape.branches` most probable paths (products of the drafted probabilities) form the next frontier.
    /// Each depth is one forward of `model` over the depth's new nodes with a tree mask (each attends to
    /// `context` and its ancestors, cached by the forwards before); the model's cache ends holding `context`
    /// alone. `shape.nodes` nodes at most; under a [`Self::row_cap`], the tree grows to twice the cap and, when
    /// greedy, keeps the cap's most probable nodes (EAGLE-2's rerank: a node is never more probable than its
    /// parent, so the kept nodes form a tree).
    pub fn draft_tree(
        &mut self,
        model: &mut dyn CausalLm,
        opts: &ForwardOptions,
        context: &[u32],
        feed: Vec<u32>,
        max: usize,
        vocab: usize,
    ) -> Result<Draft> {
        let mut shape = self.tree.unwrap_or(TreeShape { branches: 1, nodes: max });
        if let Some(cap) = self.row_cap {
            shape.nodes = shape.nodes.min(2 * cap.max(1));
        }
        let depth = self.cap(max);
        let mut tree = Draft { parents: Some(Vec::new()), q: self.keep_q.then(Logits::default), ..Draft::default() };
        if depth == 0 {
            return Ok(tree);
        }
        let do_sample = self.processor.do_sample();
        let threshold = self.length.confidence_threshold;
        let out = model.forward(&feed, opts)?;
        let logits = logits_rows(&out, self.name, context.len() - 1)?.pop().unwrap_or_default();
        // The frontier: (node, its path's probability, the distribution of its children).
        let logits = spread(logits, opts.head.as_deref(), vocab);
        let mut frontier = vec![(0usize, 1.0f32, self.distribution(context, logits, vocab))];
        let mut parents: Vec<usize> = Vec::new();
        let mut scores: Vec<f32> = Vec::new();
        for level in 1..=depth {
            let first_new = tree.tokens.len();
            for (node, score, q) in &frontier {
                let top = argmax(q);
                let k = if threshold > 0.0 && q[top as usize] < threshold { shape.branches } else { 1 };
                let picks: Vec<u32> =
                    if do_sample { (0..k).map(|_| self.sampler.sample(q)).collect() } else { top_tokens(q, k) };
                for t in picks {
                    if tree.tokens.len() == shape.nodes {
                        break;
                    }
                    tree.tokens.push(t);
                    parents.push(*node);
                    scores.push(score * q[t as usize]);
                    if let Some(qs) = tree.q.as_mut() {
                        qs.push(q);
                    }
                }
            }
            let new = first_new..tree.tokens.len();
            // EOS ends a path: it is a leaf.
            let mut next: Vec<usize> = new.clone().filter(|&i| !self.eos.contains(&tree.tokens[i])).collect();
            next.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            next.truncate(shape.branches);
            if level == depth || next.is_empty() || tree.tokens.len() == shape.nodes {
                break;
            }
            next.sort_unstable();
            // The new nodes after the tree's earlier ones, which the cache holds after `context`.
            let rows: Vec<Option<usize>> = parents.iter().map(|&p| p.checked_sub(1)).collect();
            let tree_opts = ForwardOptions {
                tree: Some(Arc::new(TreeMask::new(&rows)?.with_cached(new.start)?)),
                ..ForwardOptions { logits: LogitRows::Last(new.len()), ..opts.clone() }
            };
            let out = model.forward(&tree.tokens[new.clone()], &tree_opts)?;
            let rows = logits_rows(&out, self.name, context.len())?;
            frontier = next
                .into_iter()
                .map(|i| {
                    let mut ctx = context.to_vec();
                    ctx.extend(crate::speculation::verify::path_to(&parents, i + 1).iter().map(|&j| tree.tokens[j]));
                    let logits = spread(rows[i - new.start].to_vec(), opts.head.as_deref(), vocab);
                    (i + 1, scores[i], self.distribution(&ctx, logits, vocab))
                })
                .collect();
        }
        model.truncate(context.len());
        tree.parents = Some(parents);
        match self.row_cap {
            // Greedy only: under sampling, dropping a node's children by their drawn values would leave its
            // kept children no longer independent draws from its q (the loop's cut, by position, is safe).
            Some(cap) if cap < tree.tokens.len() && !do_sample => {
                let mut order: Vec<usize> = (0..scores.len()).collect();
                order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
                let mut kept = vec![false; scores.len()];
                order.into_iter().take(cap).for_each(|i| kept[i] = true);
                Ok(tree.keep(|i, _| kept[i]))
            }
            _ => Ok(tree),
        }
    }

    /// The processed distribution after `ctx`, laid out over `vocab` rows.
    fn distribution(&self, ctx: &[u32], mut logits: Vec<f32>, vocab: usize) -> Vec<f32> {
        logits.resize(vocab, f32::NEG_INFINITY);
        if !self.processor.is_noop(ctx.len()) {
            self.processor.process(ctx, &mut logits);
        }
        softmax(&logits)
    }
}

/// A model's logits laid out over `vocab` rows (the target's): those of a head over a subset at their ids,
/// -∞ elsewhere, so that the softmax (the `q` the drafts are drawn from and verified against) is the subset's,
/// renormalised; rows past the model's vocabulary are padding, -∞ too.
fn spread(logits: Vec<f32>, head: Option<&HeadSubset>, vocab: usize) -> Vec<f32> {
    let Some(head) = head else {
        let mut logits = logits;
        logits.resize(vocab, f32::NEG_INFINITY);
        return logits;
    };
    let mut out = vec![f32::NEG_INFINITY; vocab];
    for (&id, v) in head.ids.iter().zip(logits) {
        if let Some(o) = out.get_mut(id as usize) {
            *o = v;
        }
    }
    out
}

/// The `k` most probable tokens of `q`, most probable first (ties: the lower id).
fn top_tokens(q: &[f32], k: usize) -> Vec<u32> {
    let mut top: Vec<u32> = Vec::with_capacity(k + 1);
    for (t, &p) in q.iter().enumerate() {
        if top.len() == k && q[top[k - 1] as usize] >= p {
            continue;
        }
        let at = top.partition_point(|&u| q[u as usize] >= p);
        top.insert(at, t as u32);
        top.truncate(k);
    }
    top
}
