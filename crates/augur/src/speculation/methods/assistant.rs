//! A smaller model with the same tokenizer drafts autoregressively (Transformers' `AssistedCandidateGenerator`),
//! keeping its own KV cache across rounds and cutting it back to what the target accepted.
//!
//! A reduced draft vocabulary (FR-Spec; `draft_vocab_size`, see [`crate::speculation::draft_vocab`]): the
//! assistant's LM head runs over the most frequent token ids, the prompt's and the EOS ids only, its rows
//! gathered once per assistant (the frequent part, kept on the loaded model) and once per request (the prompt's
//! others). A large head is a large share of a small assistant's weight bytes, read in full by every draft.
//! The draft distribution `q` is the softmax over the subset, renormalised (0 outside it): drafts are drawn
//! from it and verified against it, so speculative sampling stays exact and greedy stays the target's argmax;
//! a token outside the subset is never drafted, which costs acceptance, never correctness. Unset, the size is
//! [`draft_vocab::DEFAULT_DRAFT_VOCAB_SIZE`] for vocabularies above [`draft_vocab::LARGE_VOCAB_ABOVE`] under
//! cost-aware drafting; Transformers' rounds (`cost_aware_drafting = false`) keep the whole head unless the
//! call sets it.

use std::sync::Arc;

use super::autoregressive::Autoregressive;
use super::gemma4_assistant::Gemma4AssistantDrafter;
use super::universal::UniversalAssisted;
use super::universal_sampling::UniversalSampling;
use crate::error::{Error, Result};
use crate::generation::config::GenerationConfig;
use crate::generation::decode::ASSISTANT;
use crate::models::{Architecture, ModelConfig};
use crate::models::{CausalLm, ForwardOptions, HeadSubset, LogitRows};
use crate::speculation::draft_vocab;
use crate::speculation::drafter::{one_step_seconds, Draft, Drafter};
use crate::speculation::factory::{missing, AssistantRef, DraftParts};
use crate::speculation::method::{Available, SpeculationMethod};
use crate::speculation::registry::{self, Method};
use crate::tokenizer::Tokenizer;

/// `assistant_model`: chosen by a loaded assistant; the drafter follows its architecture and tokenizer (the
/// same tokenizer, Gemma 4's assistant, or universal assisted decoding, greedy or sampled).
pub(crate) const METHOD: Method = Method {
    name: "assistant_model",
    knobs: &[
        &[&registry::ASSISTANT_LOOKBEHIND, &registry::TARGET_LOOKBEHIND, &registry::DRAFT_VOCAB_SIZE],
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
    } else if same_tokenizer(target.tokenizer, a.tokenizer) {
        Ok(SpeculationMethod::Assistant)
    } else if cfg.do_sample {
        Ok(SpeculationMethod::UniversalSampling)
    } else {
        Ok(SpeculationMethod::Universal)
    }
}

/// Whether the assistant can draft target ids directly: the same vocabulary and the same encodings (the
/// embeddings may still differ by padding rows). Otherwise the universal methods translate.
fn same_tokenizer(target: &Tokenizer, assistant: &Tokenizer) -> bool {
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
        SpeculationMethod::Assistant => Box::new(AssistantModel::new(model, acfg, prompt_len, vocab, a.tokenizer)?),
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

/// The frequent ids of a draft vocabulary of `size` for a head of `vocab` rows (ascending), ranked by
/// `tokenizer`; `None` drafts from the whole head. Without a size, cost-aware drafting takes
/// [`draft_vocab::DEFAULT_DRAFT_VOCAB_SIZE`] above [`draft_vocab::LARGE_VOCAB_ABOVE`].
fn frequent_ids(size: Option<usize>, cost_aware: bool, vocab: usize, tokenizer: &Tokenizer) -> Option<Vec<u32>> {
    let size = match size {
        Some(n) => n,
        None if cost_aware && vocab > draft_vocab::LARGE_VOCAB_ABOVE => draft_vocab::DEFAULT_DRAFT_VOCAB_SIZE,
        None => 0,
    };
    (size > 0 && size < vocab).then(|| draft_vocab::top_ids(tokenizer, vocab, size))
}

/// Gathers the default draft vocabulary's head rows of the assistant `model` (ranked by its `tokenizer`) and
/// keeps them on the model, as its first call would: done when the assistant loads, so that the first call
/// does not pay for the gather (on a 152 k-row head, more than reading its prompt). Only for an assistant that
/// drafts the target's ids (its tokenizer is `target`'s): the universal methods draft from the whole head.
pub fn keep_default_head(model: &dyn CausalLm, tokenizer: &Tokenizer, target: &Tokenizer) -> Result<()> {
    if !same_tokenizer(target, tokenizer) {
        return Ok(());
    }
    if let Some(top) = frequent_ids(None, true, model.config().vocab_size, tokenizer) {
        model.head_part(&top, true)?;
    }
    Ok(())
}

pub struct AssistantModel<'m> {
    model: &'m mut dyn CausalLm,
    drafting: Autoregressive,
    /// Target vocabulary size (rows of its logits); the draft distributions are laid out over it.
    target_vocab: usize,
    /// The draft vocabulary's frequent ids (ascending), before the first round adds the prompt's; `None`: the
    /// whole head.
    top: Option<Vec<u32>>,
    /// The head over the draft vocabulary, built in the first round (when the prompt is known).
    head: Option<Arc<HeadSubset>>,
    eos: Vec<u32>,
}

impl<'m> AssistantModel<'m> {
    /// `cfg` is the call's resolved configuration (sampling options, seed, assistant knobs); `prompt_len` is for
    /// the minimum-length processor; `tokenizer` (the assistant's) picks the draft vocabulary's ranking.
    pub fn new(
        model: &'m mut dyn CausalLm,
        cfg: &GenerationConfig,
        prompt_len: usize,
        target_vocab: usize,
        tokenizer: &Tokenizer,
    ) -> Result<Self> {
        model.truncate(0);
        let top = frequent_ids(cfg.draft_vocab_size, cfg.cost_aware(), model.config().vocab_size, tokenizer);
        let drafting = Autoregressive::new(cfg, prompt_len, true, ASSISTANT)?;
        if drafting.tree.is_some() && !model.supports_tree() {
            return Err(Error::InvalidOption(format!(
                "`speculative_eagle_topk` above 1: a {} assistant cannot draft trees",
                model.config().architecture.name()
            )));
        }
        Ok(Self { model, drafting, target_vocab, top, head: None, eos: cfg.eos_token_id.clone() })
    }

    pub fn num_assistant_tokens(&self) -> usize {
        self.drafting.length.num_assistant_tokens
    }

    /// The token ids the assistant drafts from (ascending but for the request's own, after the frequent ones),
    /// once its first round has run; `None` for the whole head.
    pub fn draft_vocab(&self) -> Option<&[u32]> {
        self.head.as_ref().map(|h| h.ids.as_slice())
    }

    /// The head over the draft vocabulary: its frequent part kept on the model, `context`'s tokens and EOS
    /// outside it gathered for this request. `None` (the whole head) where the model cannot gather its head.
    fn build_head(&mut self, context: &[u32]) -> Result<Option<Arc<HeadSubset>>> {
        let Some(top) = self.top.take() else { return Ok(None) };
        let Some(part) = self.model.head_part(&top, true)? else { return Ok(None) };
        let vocab = self.model.config().vocab_size;
        let extra = draft_vocab::extra_ids(&top, context.iter().chain(&self.eos).copied(), vocab);
        let mut parts = vec![part];
        let mut ids = top;
        if !extra.is_empty() {
            match self.model.head_part(&extra, false)? {
                Some(p) => parts.push(p),
                None => return Ok(None),
            }
            ids.extend(extra);
        }
        Ok(Some(Arc::new(HeadSubset { ids, parts })))
    }
}
impl Drafter for AssistantModel<'_> {
    fn method(&self) -> &'static str {
        "assistant_model"
    }

    fn propose(&mut self, _: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        if self.top.is_some() {
            self.head = self.build_head(context)?;
        }
        let feed = context[self.model.cache_len()..].to_vec();
        let opts = ForwardOptions { head: self.head.clone(), ..ForwardOptions::logits(LogitRows::Last(1)) };
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
