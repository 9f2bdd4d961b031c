//! Ways of proposing tokens, one file each. A drafter proposes; it never verifies.

mod assistant;
mod backoff;
mod prompt_lookup;

pub use assistant::AssistantModel;
pub use backoff::{Backoff, BackoffPolicy};
pub use prompt_lookup::PromptLookup;

use crate::error::Result;

/// Candidate tokens for one round.
#[derive(Debug, Clone, Default)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// `q[i]`: the exact distribution (probabilities, `[vocab]`) `tokens[i]` was sampled from. `None` means a
    /// deterministic proposal, i.e. a one-hot `q`.
    pub q: Option<Vec<Vec<f32>>>,
}

/// Proposes candidate tokens for the target to verify.
pub trait Drafter {
    /// The method's name as `--json` stats report it.
    fn method(&self) -> &'static str;
    /// Up to `max` tokens continuing `context` (prompt and accepted tokens).
    fn propose(&mut self, context: &[u32], max: usize) -> Result<Draft>;
    /// The target kept `accepted` of the `proposed` drafts and `context` is now the whole sequence: roll back
    /// and adapt.
    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> Result<()>;
}
