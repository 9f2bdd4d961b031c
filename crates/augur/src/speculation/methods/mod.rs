//! The methods, one file each (the assistant's drafters in four: same tokenizer, Gemma 4's assistant, and
//! universal, greedy and sampled): each method's file holds its registry entry and its drafter, and adding a
//! method is its file plus its two lines here. A drafter proposes; it never verifies.

mod assistant;
mod auto;
mod autoregressive;
#[cfg(test)]
mod dummy;
mod early_exit;
mod gemma4_assistant;
mod mtp;
mod prompt_lookup;
mod suffix;
mod universal;
mod universal_sampling;

use super::registry::Method;

/// The methods, one line each, in Transformers' precedence order (spec 1.3: early exit, prompt lookup, MTP, then
/// the assistant model): with no method named, the first whose [`Method::chosen`] holds runs.
pub const REGISTRY: &[Method] = &[
    early_exit::METHOD,
    prompt_lookup::METHOD,
    mtp::METHOD,
    assistant::METHOD,
    suffix::METHOD,
    auto::METHOD,
    #[cfg(test)]
    dummy::METHOD,
];

pub use assistant::{keep_default_head, AssistantModel};
pub use early_exit::EarlyExit;
pub use gemma4_assistant::{Gemma4AssistantDrafter, LoadedGemma4Assistant};
pub use mtp::MtpDrafter;
pub use prompt_lookup::{PromptLookup, DEFAULT_PROMPT_LOOKUP_NUM_TOKENS};
pub use suffix::{DraftSource, SuffixDrafter};
pub use universal::UniversalAssisted;
pub use universal_sampling::{UniversalSampling, VocabMap};
