//! The drafters, one file per method (the universal one in two: greedy and sampled). A drafter proposes; it
//! never verifies.

mod assistant;
mod autoregressive;
mod early_exit;
mod gemma4_assistant;
mod mtp;
mod prompt_lookup;
mod universal;
mod universal_sampling;

pub use assistant::AssistantModel;
pub use early_exit::EarlyExit;
pub use gemma4_assistant::Gemma4AssistantDrafter;
pub use mtp::MtpDrafter;
pub use prompt_lookup::PromptLookup;
pub use universal::UniversalAssisted;
pub use universal_sampling::{UniversalSampling, VocabMap};
