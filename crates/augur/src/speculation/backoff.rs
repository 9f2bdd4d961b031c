//! Per-sequence speculation back-off under load, wrapped around any drafter: a round without drafts is a plain
//! decoding step inside the shared loop (one new token, verified exactly as before), so backing off never
//! changes the output. It skips drafting while the server runs more sequences than a threshold (the target's
//! forwards then serve the other sequences instead of verifying drafts). Backing off when drafts do not pay is
//! the cost model's job (`speculation/cost_model.rs`), not this wrapper's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::Tensor;

use super::drafter::{Draft, Drafter, TargetReads};
use crate::error::Result;
use crate::generation::output::GenerationStats;
use crate::models::CausalLm;

/// When a sequence stops drafting: while `running` exceeds `max_load`.
#[derive(Debug, Clone)]
pub struct BackoffPolicy {
    /// Sequences running now.
    pub running: Arc<AtomicUsize>,
    /// The count above which drafting pauses.
    pub max_load: usize,
}

pub struct Backoff<'a> {
    inner: Box<dyn Drafter + 'a>,
    policy: BackoffPolicy,
    /// Whether this round's proposal came from `inner` (only then does `inner` observe the verdict).
    drafted: bool,
}

impl<'a> Backoff<'a> {
    pub fn new(inner: Box<dyn Drafter + 'a>, policy: BackoffPolicy) -> Self {
        Self { inner, policy, drafted: false }
    }
}

impl Drafter for Backoff<'_> {
    fn method(&self) -> &'static str {
        self.inner.method()
    }

    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        self.drafted = self.policy.running.load(Ordering::Relaxed) <= self.policy.max_load;
        if !self.drafted {
            return Ok(Draft::default());
        }
        self.inner.propose(target, context, max)
    }

    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> Result<()> {
        if !self.drafted {
            return Ok(());
        }
        self.inner.observe(context, proposed, accepted)
    }

    fn reads_target(&self) -> TargetReads {
        self.inner.reads_target()
    }

    fn plans_rounds(&self) -> bool {
        self.inner.plans_rounds()
    }

    fn report(&self, stats: &mut GenerationStats) {
        self.inner.report(stats)
    }

    fn context_room(&self, context_len: usize) -> Option<usize> {
        self.inner.context_room(context_len)
    }

    fn target_hidden(&mut self, hidden: &Tensor, accepted_rows: usize) -> Result<()> {
        self.inner.target_hidden(hidden, accepted_rows)
    }

    fn step_seconds(&mut self) -> Result<Option<f64>> {
        self.inner.step_seconds()
    }

    fn set_cost_cap(&mut self, cap: Option<usize>) {
        self.inner.set_cost_cap(cap)
    }
}
