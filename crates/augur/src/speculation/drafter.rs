//! What a drafter is: the [`Draft`] it proposes and the [`Drafter`] trait the loop drives. A drafter proposes;
//! it never verifies.

use candle_core::Tensor;

use crate::error::Result;
pub use crate::generation::config::TreeShape;
use crate::generation::output::GenerationStats;
use crate::kernels::logits::Logits;
use crate::models::CausalLm;

/// Candidate tokens for one round.
#[derive(Debug, Clone, Default)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// `q[i]`: the exact distribution (probabilities, `[tokens, vocab]` in all) `tokens[i]` was sampled from (greedy: the
    /// distribution it is the argmax of, kept for ensemble verification). `None` means a deterministic proposal,
    /// i.e. a one-hot `q`.
    pub q: Option<Logits>,
    /// A tree draft: `parents[i]` is the node `tokens[i]` continues (0: the context's last token, `j + 1`:
    /// `tokens[j]`, `j < i`), siblings in the order the verifier tries them; siblings drawn from a distribution
    /// were drawn independently from the same `q`. `None`: a chain, each token continuing the one before.
    pub parents: Option<Vec<usize>>,
}

impl Draft {
    /// The depth of each token in the tree (1: a child of the root), `[tokens]`.
    pub fn depths(&self) -> Vec<usize> {
        let mut depths: Vec<usize> = Vec::with_capacity(self.tokens.len());
        for i in 0..self.tokens.len() {
            let parent = self.parents.as_ref().map_or(i, |p| p[i]);
            depths.push(if parent == 0 { 1 } else { depths[parent - 1] + 1 });
        }
        depths
    }

    /// The tree's nodes at most `max_depth` deep (a chain's first `max_depth` tokens), renumbered.
    pub fn within_depth(self, max_depth: usize) -> Draft {
        self.keep(|_, depth| depth <= max_depth)
    }

    /// The tree's first `n` nodes.
    pub fn first_nodes(self, n: usize) -> Draft {
        self.keep(|i, _| i < n)
    }

    /// A tree's first chain (the root's first child, its first child, …): what a target that cannot verify
    /// trees checks.
    pub fn first_chain(self) -> Draft {
        let Some(parents) = self.parents.clone() else { return self };
        let mut on = vec![false; parents.len() + 1];
        on[0] = true;
        let mut taken = vec![false; parents.len() + 1];
        for (i, &p) in parents.iter().enumerate() {
            if on[p] && !taken[p] {
                (on[i + 1], taken[p]) = (true, true);
            }
        }
        let mut draft = self.keep(|i, _| on[i + 1]);
        draft.parents = None;
        draft
    }

    /// The nodes `keep(index, depth)` accepts, with all their ancestors accepted too, renumbered.
    pub(crate) fn keep(self, keep: impl Fn(usize, usize) -> bool) -> Draft {
        let depths = self.depths();
        let parents = self.parents.clone();
        let parent = |i: usize| parents.as_ref().map_or(i, |p| p[i]);
        let mut new_index = vec![None; self.tokens.len() + 1];
        new_index[0] = Some(0);
        let (mut tokens, mut q, mut new_parents) = (Vec::new(), self.q.as_ref().map(|_| Logits::default()), Vec::new());
        for (i, &t) in self.tokens.iter().enumerate() {
            if let (Some(p), true) = (new_index[parent(i)], keep(i, depths[i])) {
                new_parents.push(p);
                tokens.push(t);
                if let (Some(q), Some(all)) = (q.as_mut(), self.q.as_ref()) {
                    q.push(&all[i]);
                }
                new_index[i + 1] = Some(tokens.len());
            }
        }
        Draft { tokens, q, parents: self.parents.map(|_| new_parents) }
    }
}

/// The one seam for drafters built on the target's internals: what they read of it besides the tokens it
/// verified. The loop hands over the hidden rows ([`Drafter::target_hidden`]); the target's shared KV and its
/// embeddings a drafter reads in [`Drafter::propose`] through [`CausalLm::kv_sharing`]; early layers through
/// [`crate::models::ForwardOptions::exit_layer`] forwards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetReads {
    /// The final hidden states of every verification forward (MTP, Gemma 4's assistant). Such a drafter must
    /// draft every round to keep up with them, so the cost model leaves it uncapped.
    pub hidden_states: bool,
    /// The target's states of the whole prompt (its hidden rows, its KV, its early layers): a call must prefill
    /// all of the prompt rather than reuse a cached prefix.
    pub prefill: bool,
}

impl TargetReads {
    /// Only the verified tokens: every model-free drafter and every assistant with a model of its own.
    pub const NOTHING: Self = Self { hidden_states: false, prefill: false };
    /// Every forward's hidden rows, the prompt's included.
    pub const HIDDEN_STATES: Self = Self { hidden_states: true, prefill: true };
    /// The prompt's states only (early exit's layers).
    pub const PREFILL: Self = Self { hidden_states: false, prefill: true };
}

/// Proposes candidate tokens for the target to verify.
pub trait Drafter {
    /// The method's name as `--json` stats report it.
    fn method(&self) -> &'static str;
    /// Up to `max` tokens continuing `context` (prompt and accepted tokens). `target` is the verifying model:
    /// only drafters that run on it (early exit) use it, and they must leave its `cache_len` as it was.
    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft>;
    /// The target kept `accepted` of the `proposed` drafts and `context` is now the whole sequence: roll back
    /// and adapt.
    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> Result<()>;
    /// Whether the drafter sizes every round itself from its own measurements (`auto`): the loop's cost model
    /// then stays out of its way, and every round calls [`Drafter::propose`].
    fn plans_rounds(&self) -> bool {
        false
    }
    /// Adds what the drafter alone knows to the call's statistics, once the call is over.
    fn report(&self, _stats: &mut GenerationStats) {}
    /// What the drafter reads of the target besides the verified tokens (see [`TargetReads`]); a drafter that
    /// wraps another returns the other's.
    fn reads_target(&self) -> TargetReads {
        TargetReads::NOTHING
    }
    /// The verification forward's final hidden states `[fed, hidden]`, of which the first `accepted_rows` belong
    /// to positions the target kept; called before [`Drafter::observe`] when [`TargetReads::hidden_states`].
    fn target_hidden(&mut self, _hidden: &Tensor, _accepted_rows: usize) -> Result<()> {
        Ok(())
    }
    /// For drafters that must first read the whole context with a model of their own (an assistant model):
    /// the measured seconds of one one-token forward of that model, taken on an empty cache and discarded, so
    /// that the loop can weigh reading the prompt against what drafting can save before paying for it. `None`
    /// for drafters without such a cost.
    fn step_seconds(&mut self) -> Result<Option<f64>> {
        Ok(None)
    }
    /// The cost model's cap on the coming round's drafts, told before [`Drafter::propose`] (`None`: only the
    /// length budget limits them). A drafter whose model counts in other tokens than the target's (universal
    /// assisted decoding) uses it to stop its model early instead of drafting and discarding; the length budget
    /// alone keeps Transformers' rounds.
    fn set_cost_cap(&mut self, _cap: Option<usize>) {}
    /// How many drafts the drafter's own model can still make after a context of `context_len` tokens before
    /// its context is full (`None`: it has no context of its own, or one at least the target's). At 0 the loop
    /// decodes plainly for the rest of the request.
    fn context_room(&self, _context_len: usize) -> Option<usize> {
        None
    }
}

/// One one-token forward of `model` on an empty cache, discarded: the seconds it took (see
/// [`Drafter::step_seconds`]).
pub(crate) fn one_step_seconds(model: &mut dyn CausalLm, token: u32) -> Result<f64> {
    model.truncate(0);
    let t = std::time::Instant::now();
    model.forward(&[token], &crate::models::ForwardOptions::logits(crate::models::LogitRows::Last(1)))?;
    let seconds = t.elapsed().as_secs_f64();
    model.truncate(0);
    Ok(seconds)
}
