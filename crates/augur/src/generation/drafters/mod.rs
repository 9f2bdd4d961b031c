//! Ways of proposing tokens, one file each. A drafter proposes; it never verifies.

mod assistant;
mod gemma4_assistant;
mod prompt_lookup;

pub use assistant::AssistantModel;
pub use gemma4_assistant::Gemma4AssistantDrafter;
pub use prompt_lookup::PromptLookup;

use candle_core::Tensor;

use crate::error::Result;
use crate::model::CausalLm;

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
    /// Whether the loop should keep the target's final hidden states of each forward for [`Self::propose_with`]
    /// (drafters that start from the target's state: MTP heads, Gemma 4's assistant).
    fn wants_hidden_states(&self) -> bool {
        false
    }
    /// [`Self::propose`] with the target's state at hand; drafters that read it override this one.
    fn propose_with(&mut self, context: &[u32], max: usize, _target: &TargetState<'_>) -> Result<Draft> {
        self.propose(context, max)
    }
}

/// The target as a drafter sees it between rounds: its cache holds exactly the accepted sequence but its newest
/// token (`context.len() − 1` positions).
pub struct TargetState<'a> {
    pub model: &'a dyn CausalLm,
    /// The final hidden states (after the final norm) of the target's last forward, `[rows, hidden]`, with the
    /// position of the first row; rows at or past `context.len() − 1` belong to rejected drafts. `None` before the
    /// first forward, or when the drafter did not ask for them.
    pub hidden: Option<(&'a Tensor, usize)>,
}
