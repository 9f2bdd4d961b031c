//! A smaller model with the same tokenizer drafts autoregressively (Transformers' `AssistedCandidateGenerator`),
//! keeping its own KV cache across rounds and cutting it back to what the target accepted.

use super::autoregressive::Autoregressive;
use super::{one_step_seconds, Draft, Drafter};
use crate::error::Result;
use crate::generation::config::GenerationConfig;
use crate::model::{CausalLm, ForwardOptions, LogitRows};

pub struct AssistantModel<'m> {
    model: &'m mut dyn CausalLm,
    drafting: Autoregressive,
    /// Target vocabulary size (rows of its logits); the draft distributions are laid out over it.
    target_vocab: usize,
}

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
        Ok(Self { model, drafting: Autoregressive::new(cfg, prompt_len, true)?, target_vocab })
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
        let opts = ForwardOptions::logits(LogitRows::Last(1));
        self.drafting.draft(self.model, &opts, context, feed, max, self.target_vocab)
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

    fn step_seconds(&mut self) -> Result<Option<f64>> {
        if self.model.cache_len() > 0 {
            return Ok(None);
        }
        one_step_seconds(self.model, 0).map(Some)
    }
}
