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
use super::gemma4_assistant::Gemma4AssistantDrafter;
use super::universal::UniversalAssisted;
use super::universal_sampling::UniversalSampling;
use crate::error::{Error, Result};
use crate::generation::config::GenerationConfig;
use crate::generation::decode::ASSISTANT;
use crate::models::{Architecture, ModelConfig};
use crate::models::{CausalLm, ForwardOptions, LogitRows};
use crate::speculation::drafter::{one_step_seconds, Draft, Drafter};
use crate::speculation::factory::{missing, AssistantRef, DraftParts};
use crate::speculation::method::{Available, LoadedModel, SpeculationMethod};
use crate::speculation::registry::{self, Method};
use crate::tokenizer::Tokenizer;

/// `assistant_model`: chosen by a loaded assistant; the drafter follows its architecture and tokenizer (the
/// same tokenizer, Gemma 4's assistant, or universal assisted decoding, greedy or sampled).
pub(crate) const METHOD: Method = Method {
    name: "assistant_model",
    knobs: &[
        &[&registry::ASSISTANT_LOOKBEHIND, &registry::TARGET_LOOKBEHIND],
        &registry::MODEL_DRAFTER,
        &registry::TREE,
    ],
    chosen: |_, models| models.assistant.is_some(),
    named: |_| Ok(()),
    resolve,
    build,
};

fn resolve(cfg: &GenerationConfig, models: &Available<'_>) -> Result<SpeculationMethod> {
    let Some(a) = &models.assistant else {
        return Err(Error::InvalidOption("method `assistant_model` needs an assistant model".into()));
    };
    let target = &models.target;
    if a.config.architecture == Architecture::Gemma4Assistant {
        if target.config.architecture != Architecture::Gemma4 {
            return Err(Error::InvalidOption(format!(
                "the Gemma 4 assistant drafts only for a Gemma 4 target, not {}",
                target.config.architecture.name()
            )));
        }
        if a.config.vocab_size != target.config.vocab_size {
            return Err(Error::InvalidOption(format!(
                "the Gemma 4 assistant's vocabulary ({}) differs from the target's ({})",
                a.config.vocab_size, target.config.vocab_size
            )));
        }
        Ok(SpeculationMethod::Gemma4Assistant)
    } else if same_tokenizer(target, a) {
        Ok(SpeculationMethod::Assistant)
    } else if cfg.do_sample {
        Ok(SpeculationMethod::UniversalSampling)
    } else {
        Ok(SpeculationMethod::Universal)
    }
}

/// Whether the assistant can draft target ids directly: the same vocabulary and the same encodings (the
/// embeddings may still differ by padding rows). Otherwise the universal methods translate.
fn same_tokenizer(target: &LoadedModel<'_>, assistant: &LoadedModel<'_>) -> bool {
    let (target, assistant): (&Tokenizer, &Tokenizer) = (target.tokenizer, assistant.tokenizer);
    let probe = ["Hello, world!", " def main():\n    return 42", "Ünïcödé ✓ 日本語"];
    target.vocab_size() == assistant.vocab_size()
        && probe
            .iter()
            .all(|p| matches!((target.encode(p, false), assistant.encode(p, false)), (Ok(a), Ok(b)) if a == b))
}

fn build<'a>(
    method: SpeculationMethod,
    _cfg: &GenerationConfig,
    prompt_len: usize,
    target: &ModelConfig,
    parts: DraftParts<'a>,
) -> Result<Box<dyn Drafter + 'a>> {
    let a = parts.assistant.ok_or_else(|| missing(method, "an assistant model"))?;
    let acfg = &a.config;
    let model = match (method, a.model) {
        (SpeculationMethod::Gemma4Assistant, AssistantRef::Gemma4(model)) => {
            return Ok(Box::new(Gemma4AssistantDrafter::new(model, acfg, prompt_len, target.sliding_window)?));
        }
        (SpeculationMethod::Gemma4Assistant, AssistantRef::Lm(_)) => {
            return Err(Error::InvalidOption("the assistant is not a Gemma 4 assistant model".into()))
        }
        (_, AssistantRef::Gemma4(_)) => {
            return Err(missing(method, "an assistant that runs on tokens (Gemma 4's assistant does not)"))
        }
        (_, AssistantRef::Lm(model)) => model,
    };
    let vocab = target.vocab_size;
    Ok(match method {
        SpeculationMethod::Assistant => Box::new(AssistantModel::new(model, acfg, prompt_len, vocab)?),
        SpeculationMethod::UniversalSampling => {
            Box::new(UniversalSampling::new(model, parts.target_tokenizer, a.tokenizer, acfg, prompt_len, vocab)?)
        }
        _ => {
            let eos = match &a.defaults.eos_token_id {
                Some(e) if !e.is_empty() => e.clone(),
                _ => a.tokenizer.eos_token_ids().to_vec(),
            };
            Box::new(UniversalAssisted::new(model, parts.target_tokenizer, a.tokenizer, &eos, acfg))
        }
    })
}

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
