//! Ways of proposing tokens, one file each. A drafter proposes; it never verifies.

mod assistant;
mod autoregressive;
mod backoff;
mod early_exit;
pub mod factory;
mod gemma4_assistant;
mod mtp;
mod prompt_lookup;
mod universal;
mod universal_sampling;

pub use assistant::AssistantModel;
pub use backoff::{Backoff, BackoffPolicy};
pub use early_exit::EarlyExit;
pub use gemma4_assistant::Gemma4AssistantDrafter;
pub use mtp::MtpDrafter;
pub use prompt_lookup::PromptLookup;
pub use universal::UniversalAssisted;
pub use universal_sampling::{UniversalSampling, VocabMap};

use candle_core::Tensor;

use crate::error::Result;
use crate::models::CausalLm;

/// Candidate tokens for one round.
#[derive(Debug, Clone, Default)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// `q[i]`: the exact distribution (probabilities, `[vocab]`) `tokens[i]` was sampled from (greedy: the
    /// distribution it is the argmax of, kept for ensemble verification). `None` means a deterministic proposal,
    /// i.e. a one-hot `q`.
    pub q: Option<Vec<Vec<f32>>>,
}

/// Proposes candidate tokens for the target to verify.
pub trait Drafter {
    /// The method's name as `--json` stats report it.
    fn method(&self) -> &'static str;
    /// Up to `max` tokens continuing `context` (prompt and accepted tokens). `target` is the verifying model:
    /// only drafters that run on it (early exit) use it, and they must leave its `cache_len` as it was.
    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft>;
    /// The target kept `accepted` of the `proposed` drafts and `context` is now the whole sequence: roll back
    /// and adapt.
    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> Result<()>;
    /// Whether the drafter needs the target's final hidden states from each verification forward (MTP, Gemma 4's
    /// assistant).
    fn wants_target_hidden(&self) -> bool {
        false
    }
    /// The verification forward's final hidden states `[fed, hidden]`, of which the first `accepted_rows` belong
    /// to positions the target kept; called before [`Drafter::observe`] when [`Drafter::wants_target_hidden`].
    fn target_hidden(&mut self, _hidden: &Tensor, _accepted_rows: usize) -> Result<()> {
        Ok(())
    }
    /// For drafters that must first read the whole context with a model of their own (an assistant model):
    /// the measured seconds of one one-token forward of that model, taken on an empty cache and discarded, so
    /// that the loop can weigh reading the prompt against what drafting can save before paying for it. `None`
    /// for drafters without such a cost.
    fn step_seconds(&mut self) -> Result<Option<f64>> {
        Ok(None)
    }
    /// The cost model's cap on the coming round's drafts, told before [`Drafter::propose`] (`None`: only the
    /// length budget limits them). A drafter whose model counts in other tokens than the target's (universal
    /// assisted decoding) uses it to stop its model early instead of drafting and discarding; the length budget
    /// alone keeps Transformers' rounds.
    fn set_cost_cap(&mut self, _cap: Option<usize>) {}
}

/// One one-token forward of `model` on an empty cache, discarded: the seconds it took (see
/// [`Drafter::step_seconds`]).
pub(crate) fn one_step_seconds(model: &mut dyn CausalLm, token: u32) -> Result<f64> {
    model.truncate(0);
    let t = std::time::Instant::now();
    model.forward(&[token], &crate::models::ForwardOptions::logits(crate::models::LogitRows::Last(1)))?;
    let seconds = t.elapsed().as_secs_f64();
    model.truncate(0);
    Ok(seconds)
}
