//! Builds the drafter of a resolved [`SpeculationMethod`] from what the pipeline lends it: the target's
//! tokenizer and MTP layers, and the assistant (a causal LM, or Gemma 4's assistant).

use crate::error::{Error, Result};
use crate::generation::config::{GenerationConfig, GenerationOptions};
use crate::models::gemma4_assistant::Gemma4Assistant;
use crate::models::mtp::MtpHead;
use crate::models::{CausalLm, ModelConfig};
use crate::speculation::method::SpeculationMethod;
use crate::tokenizer::Tokenizer;

use super::backoff::{Backoff, BackoffPolicy};
use super::drafter::Drafter;
use super::methods::{
    AssistantModel, EarlyExit, Gemma4AssistantDrafter, MtpDrafter, PromptLookup, UniversalAssisted, UniversalSampling,
};

/// What the drafters borrow for the call: the target's tokenizer and MTP layers, and the assistant.
pub struct DraftParts<'a> {
    pub target_tokenizer: &'a Tokenizer,
    pub mtp: Option<&'a mut dyn MtpHead>,
    pub assistant: Option<AssistantParts<'a>>,
}

/// The assistant model as the drafters take it.
pub enum AssistantRef<'a> {
    Lm(&'a mut dyn CausalLm),
    Gemma4(&'a Gemma4Assistant),
}

pub struct AssistantParts<'a> {
    pub model: AssistantRef<'a>,
    pub tokenizer: &'a Tokenizer,
    /// The assistant's `generation_config.json` (its EOS ids, for universal assisted decoding).
    pub defaults: &'a GenerationOptions,
    /// The call's configuration with the assistant knobs (see [`assistant_config`]).
    pub config: GenerationConfig,
}

/// The drafter for `method`, or `None` for plain decoding; wrapped in [`Backoff`] under `backoff`. `cfg` is the
/// call's resolved configuration, `target` the target's model config.
pub fn build<'a>(
    method: SpeculationMethod,
    cfg: &GenerationConfig,
    prompt_len: usize,
    target: &ModelConfig,
    parts: DraftParts<'a>,
    backoff: Option<&BackoffPolicy>,
) -> Result<Option<Box<dyn Drafter + 'a>>> {
    let vocab = target.vocab_size;
    let missing = |what: &str| Error::InvalidOption(format!("method `{method:?}` needs {what}"));
    let trees = matches!(
        method,
        SpeculationMethod::None | SpeculationMethod::PromptLookup { .. } | SpeculationMethod::Assistant
    );
    if cfg.tree_shape().is_some() && !trees {
        return Err(Error::InvalidOption(format!(
            "`speculative_eagle_topk` above 1 drafts trees with prompt lookup or an assistant model that shares the \
             target's tokenizer, not with method `{method:?}`"
        )));
    }
    let drafter: Box<dyn Drafter + 'a> = match method {
        SpeculationMethod::None => return Ok(None),
        SpeculationMethod::EarlyExit { layers } => {
            Box::new(EarlyExit::new(layers, target.num_hidden_layers, cfg, prompt_len)?)
        }
        SpeculationMethod::PromptLookup { num_tokens, max_matching_ngram_size } => {
            let tree = cfg.tree_shape();
            let num_tokens = match tree {
                Some(_) => cfg.speculative_num_steps.unwrap_or(num_tokens),
                None => num_tokens,
            };
            let lookup = PromptLookup::new(num_tokens, max_matching_ngram_size, cfg.eos_token_id.clone())?;
            Box::new(lookup.cost_aware(cfg.cost_aware()).tree(tree))
        }
        SpeculationMethod::Mtp => {
            let head = parts.mtp.ok_or_else(|| missing("the target's MTP layers"))?;
            Box::new(MtpDrafter::new(head, cfg, prompt_len)?)
        }
        SpeculationMethod::Assistant
        | SpeculationMethod::Gemma4Assistant
        | SpeculationMethod::Universal
        | SpeculationMethod::UniversalSampling => {
            let a = parts.assistant.ok_or_else(|| missing("an assistant model"))?;
            let acfg = &a.config;
            let model = match (method, a.model) {
                (SpeculationMethod::Gemma4Assistant, AssistantRef::Gemma4(model)) => {
                    return Ok(Some(with_backoff(
                        Box::new(Gemma4AssistantDrafter::new(model, acfg, prompt_len, target.sliding_window)?),
                        backoff,
                    )));
                }
                (SpeculationMethod::Gemma4Assistant, AssistantRef::Lm(_)) => {
                    return Err(Error::InvalidOption("the assistant is not a Gemma 4 assistant model".into()))
                }
                (_, AssistantRef::Gemma4(_)) => {
                    return Err(missing("an assistant that runs on tokens (Gemma 4's assistant does not)"))
                }
                (_, AssistantRef::Lm(model)) => model,
            };
            match method {
                SpeculationMethod::Assistant => Box::new(AssistantModel::new(model, acfg, prompt_len, vocab)?),
                SpeculationMethod::UniversalSampling => Box::new(UniversalSampling::new(
                    model,
                    parts.target_tokenizer,
                    a.tokenizer,
                    acfg,
                    prompt_len,
                    vocab,
                )?),
                _ => {
                    let eos = match &a.defaults.eos_token_id {
                        Some(e) if !e.is_empty() => e.clone(),
                        _ => a.tokenizer.eos_token_ids().to_vec(),
                    };
                    Box::new(UniversalAssisted::new(model, parts.target_tokenizer, a.tokenizer, &eos, acfg))
                }
            }
        }
    };
    Ok(Some(with_backoff(drafter, backoff)))
}

fn with_backoff<'a>(drafter: Box<dyn Drafter + 'a>, backoff: Option<&BackoffPolicy>) -> Box<dyn Drafter + 'a> {
    match backoff {
        Some(policy) => Box::new(Backoff::new(drafter, policy.clone())),
        None => drafter,
    }
}

/// The call's configuration with the assistant knobs. Transformers reads them only from the assistant's
/// generation config and ignores the call's (a defect we fix): here the call's options win, then the pipeline's
/// defaults, then the assistant's `generation_config.json`, then the global defaults.
pub fn assistant_config(
    cfg: &GenerationConfig,
    assistant: &GenerationOptions,
    call: &GenerationOptions,
    pipeline: &GenerationOptions,
) -> GenerationConfig {
    let pick = |f: fn(&GenerationOptions) -> bool| {
        if f(call) {
            call
        } else if f(pipeline) {
            pipeline
        } else {
            assistant
        }
    };
    cfg.with_options(&GenerationOptions {
        num_assistant_tokens: pick(|o| o.num_assistant_tokens.is_some()).num_assistant_tokens,
        num_assistant_tokens_schedule: pick(|o| o.num_assistant_tokens_schedule.is_some())
            .num_assistant_tokens_schedule
            .clone(),
        assistant_confidence_threshold: pick(|o| o.assistant_confidence_threshold.is_some())
            .assistant_confidence_threshold,
        assistant_confidence_adaptive: pick(|o| o.assistant_confidence_adaptive.is_some())
            .assistant_confidence_adaptive,
        assistant_lookbehind: pick(|o| o.assistant_lookbehind.is_some()).assistant_lookbehind,
        target_lookbehind: pick(|o| o.target_lookbehind.is_some()).target_lookbehind,
        ..GenerationOptions::default()
    })
}
