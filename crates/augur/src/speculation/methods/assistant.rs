//! A smaller model with the same tokenizer drafts autoregressively (Transformers' `AssistedCandidateGenerator`),
//! keeping its own KV cache across rounds and cutting it back to what the target accepted.
//!
//! With cost-aware drafting (the default), an assistant whose vocabulary is larger than [`SHORT_HEAD_ABOVE`]
//! drafts from the first [`SHORT_HEAD_ROWS`] token ids only: its LM head reads only those rows. BPE
//! vocabularies number their tokens in merge order, so the first ids are the frequent ones, and a large head is
//! a large share of a small assistant's weight bytes, read in full by every draft. Drafts outside it are never proposed (their q is 0), which costs some acceptance and never
//! correctness: the target verifies every draft, greedy and sampled alike. Transformers' rounds
//! (`cost_aware_drafting = false`) use the whole head.

use super::autoregressive::Autoregressive;
use crate::error::{Error, Result};
use crate::generation::config::GenerationConfig;
use crate::generation::decode::ASSISTANT;
use crate::models::{CausalLm, ForwardOptions, LogitRows};
use crate::speculation::drafter::{one_step_seconds, Draft, Drafter};

pub struct AssistantModel<'m> {
    model: &'m mut dyn CausalLm,
    drafting: Autoregressive,
    /// Target vocabulary size (rows of its logits); the draft distributions are laid out over it.
    target_vocab: usize,
    /// Token ids the short head covers (see the module doc), or `None` for the whole head.
    head_rows: Option<usize>,
}

/// Vocabularies above this size get a short head under cost-aware drafting (Qwen2.5's 151,936, Gemma's
/// 262,144; not Llama 3's 128,256, where it would save less).
pub const SHORT_HEAD_ABOVE: usize = 131_072;
/// Token ids a short head covers. On Spec-Bench coding with the Qwen2.5-Coder pair, 32,768 cut acceptance from
/// about 0.91 to 0.85; 65,536 kept it and cut a draft's cost by a sixth.
pub const SHORT_HEAD_ROWS: usize = 65_536;

impl<'m> AssistantModel<'m> {
    /// `cfg` is the call's resolved configuration (sampling options, seed, assistant knobs); `prompt_len` is for
    /// the minimum-length processor.
    pub fn new(
        model: &'m mut dyn CausalLm,
        cfg: &GenerationConfig,
        prompt_len: usize,
        target_vocab: usize,
    ) -> Result<Self> {
        model.truncate(0);
        let head_rows = (cfg.cost_aware() && model.config().vocab_size > SHORT_HEAD_ABOVE).then_some(SHORT_HEAD_ROWS);
        let drafting = Autoregressive::new(cfg, prompt_len, true, ASSISTANT)?;
        if drafting.tree.is_some() && !model.supports_tree() {
            return Err(Error::InvalidOption(format!(
                "`speculative_eagle_topk` above 1: a {} assistant cannot draft trees",
                model.config().architecture.name()
            )));
        }
        Ok(Self { model, drafting, target_vocab, head_rows })
    }

    pub fn num_assistant_tokens(&self) -> usize {
        self.drafting.length.num_assistant_tokens
    }
}
impl Drafter for AssistantModel<'_> {
    fn method(&self) -> &'static str {
        "assistant_model"
    }

    fn propose(&mut self, _: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        let feed = context[self.model.cache_len()..].to_vec();
        let opts = ForwardOptions { head_rows: self.head_rows, ..ForwardOptions::logits(LogitRows::Last(1)) };
        if self.drafting.tree.is_some() {
            self.drafting.draft_tree(self.model, &opts, context, feed, max, self.target_vocab)
        } else {
            self.drafting.draft(self.model, &opts, context, feed, max, self.target_vocab)
        }
    }

    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> Result<()> {
        // Every cached position before the newest token holds a token the target accepted.
        let keep = context.len().saturating_sub(1);
        if self.model.cache_len() > keep {
            self.model.truncate(keep);
        }
        self.drafting.length.update(proposed, accepted);
        Ok(())
    }

    fn set_cost_cap(&mut self, cap: Option<usize>) {
        self.drafting.row_cap = cap;
    }

    /// The assistant caches the context and then, per depth, one draft (a chain) or up to `branches` children
    /// of each of up to `branches` expanded nodes (a tree).
    fn context_room(&self, context_len: usize) -> Option<usize> {
        let per_depth = self.drafting.tree.map_or(1, |t| t.branches.max(1).pow(2));
        Some(self.model.config().max_position_embeddings.saturating_sub(context_len) / per_depth)
    }

    fn step_seconds(&mut self) -> Result<Option<f64>> {
        if self.model.cache_len() > 0 {
            return Ok(None);
        }
        one_step_seconds(self.model, 0).map(Some)
    }
}
