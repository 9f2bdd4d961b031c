//! Builds the drafter of a resolved method through its registry entry, from what the pipeline lends it: the
//! target's tokenizer and MTP layers, and the assistant (a causal LM, or Gemma 4's assistant).

use crate::error::{Error, Result};
use crate::generation::config::{GenerationConfig, GenerationOptions};
use crate::models::gemma4_assistant::Gemma4Assistant;
use crate::models::mtp::MtpHead;
use crate::models::{CausalLm, ModelConfig};
use crate::speculation::method::SpeculationMethod;
use crate::speculation::registry::Method;
use crate::tokenizer::Tokenizer;

use super::backoff::{Backoff, BackoffPolicy};
use super::drafter::Drafter;
use super::suffix_cache::SuffixCacheRef;

/// What the drafters borrow for the call: the target's tokenizer and MTP layers, and the assistant.
pub struct DraftParts<'a> {
    pub target_tokenizer: &'a Tokenizer,
    pub mtp: Option<&'a mut dyn MtpHead>,
    pub assistant: Option<AssistantParts<'a>>,
    /// The process-wide suffix cache the call reads and feeds (suffix decoding), when it has one.
    pub suffix_cache: Option<SuffixCacheRef>,
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

/// The drafter of the registry entry `choice` resolved to, or `None` for plain decoding; wrapped in [`Backoff`]
/// under `backoff`. `cfg` is the call's resolved configuration, `target` the target's model config.
pub fn build<'a>(
    choice: Option<(&Method, SpeculationMethod)>,
    cfg: &GenerationConfig,
    prompt_len: usize,
    target: &ModelConfig,
    parts: DraftParts<'a>,
    backoff: Option<&BackoffPolicy>,
) -> Result<Option<Box<dyn Drafter + 'a>>> {
    let method = choice.map_or(SpeculationMethod::None, |(_, method)| method);
    if cfg.tree_shape().is_some() && !method.drafts_trees() {
        return Err(Error::InvalidOption(format!(
            "`speculative_eagle_topk` above 1 drafts trees with prompt lookup or an assistant model that shares the \
             target's tokenizer, not with method `{method:?}`"
        )));
    }
    let Some((entry, method)) = choice else { return Ok(None) };
    let drafter = (entry.build)(method, cfg, prompt_len, target, parts)?;
    Ok(Some(match backoff {
        Some(policy) => Box::new(Backoff::new(drafter, policy.clone())),
        None => drafter,
    }))
}

/// The error of a drafter that misses a part of the pipeline (`what`) or was handed another method's choice.
pub(crate) fn missing(method: SpeculationMethod, what: &str) -> Error {
    Error::InvalidOption(format!("method `{method:?}` needs {what}"))
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
        draft_vocab_size: pick(|o| o.draft_vocab_size.is_some()).draft_vocab_size,
        ..GenerationOptions::default()
    })
}
