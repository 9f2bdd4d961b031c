//! Per-sequence speculation back-off, wrapped around any drafter: a round without drafts is a plain decoding
//! step inside the shared loop (one new token, verified exactly as before), so backing off never changes the
//! output. It skips drafting while the server is loaded past a threshold, and for a growing number of rounds
//! when drafts stop being accepted (then probes again).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{Draft, Drafter};
use crate::error::Result;

/// When a sequence stops drafting.
#[derive(Debug, Clone)]
pub struct BackoffPolicy {
    /// Sequences running now, and the count above which drafting pauses (the target's forwards then serve
    /// the other sequences instead of verifying drafts).
    pub load: Option<(Arc<AtomicUsize>, usize)>,
    /// Drafting pauses when the moving acceptance rate (accepted ÷ proposed drafts) falls below this.
    pub min_acceptance: f64,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self { load: None, min_acceptance: 0.15 }
    }
}

/// Rounds drafted before the acceptance rate is trusted, and the longest pause after a probe fails.
const WARMUP_ROUNDS: usize = 4;
const MAX_PAUSE: usize = 64;
/// Weight of the newest round in the moving acceptance rate.
const EMA: f64 = 0.3;

pub struct Backoff<'a> {
    inner: Box<dyn Drafter + 'a>,
    policy: BackoffPolicy,
    /// Moving acceptance rate of the rounds that drafted.
    rate: f64,
    drafted_rounds: usize,
    /// Rounds left without drafting, and the next pause length.
    paused: usize,
    pause: usize,
    /// Whether this round's proposal came from `inner` (only then does `inner` observe the verdict).
    drafted: bool,
}

impl<'a> Backoff<'a> {
    pub fn new(inner: Box<dyn Drafter + 'a>, policy: BackoffPolicy) -> Self {
        Self { inner, policy, rate: 1.0, drafted_rounds: 0, paused: 0, pause: 4, drafted: false }
    }

    fn overloaded(&self) -> bool {
        self.policy.load.as_ref().is_some_and(|(n, max)| n.load(Ordering::Relaxed) > *max)
    }
}

impl Drafter for Backoff<'_> {
    fn method(&self) -> &'static str {
        self.inner.method()
    }

    fn propose(&mut self, context: &[u32], max: usize) -> Result<Draft> {
        self.drafted = false;
        if self.overloaded() {
            return Ok(Draft::default());
        }
        if self.paused > 0 {
            self.paused -= 1;
            return Ok(Draft::default());
        }
        self.drafted = true;
        self.inner.propose(context, max)
    }

    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> Result<()> {
        if !self.drafted {
            return Ok(());
        }
        self.inner.observe(context, proposed, accepted)?;
        if proposed == 0 {
            return Ok(());
        }
        self.drafted_rounds += 1;
        self.rate = (1.0 - EMA) * self.rate + EMA * (accepted as f64 / proposed as f64);
        if self.drafted_rounds >= WARMUP_ROUNDS && self.rate < self.policy.min_acceptance {
            self.paused = self.pause;
            self.pause = (self.pause * 2).min(MAX_PAUSE);
            // The probe after the pause starts from a neutral rate rather than the failing one.
            self.rate = self.policy.min_acceptance;
            self.drafted_rounds = WARMUP_ROUNDS - 1;
        } else if self.rate >= 2.0 * self.policy.min_acceptance {
            self.pause = 4;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Always proposes the same two tokens.
    struct Fixed;

    impl Drafter for Fixed {
        fn method(&self) -> &'static str {
            "fixed"
        }
        fn propose(&mut self, _: &[u32], _: usize) -> Result<Draft> {
            Ok(Draft { tokens: vec![1, 2], q: None })
        }
        fn observe(&mut self, _: &[u32], _: usize, _: usize) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn pauses_when_drafts_fail_and_under_load() {
        let mut b = Backoff::new(Box::new(Fixed), BackoffPolicy::default());
        let mut empty = 0;
        for _ in 0..40 {
            let d = b.propose(&[0], 8).unwrap();
            if d.tokens.is_empty() {
                empty += 1;
            }
            b.observe(&[0], d.tokens.len(), 0).unwrap();
        }
        assert!(empty > 20, "a drafter that is never accepted must be paused most of the time ({empty}/40)");

        let mut good = Backoff::new(Box::new(Fixed), BackoffPolicy::default());
        for _ in 0..40 {
            let d = good.propose(&[0], 8).unwrap();
            assert_eq!(d.tokens.len(), 2, "accepted drafts never pause");
            good.observe(&[0], 2, 2).unwrap();
        }

        let load = Arc::new(AtomicUsize::new(5));
        let policy = BackoffPolicy { load: Some((Arc::clone(&load), 4)), ..Default::default() };
        let mut busy = Backoff::new(Box::new(Fixed), policy);
        assert!(busy.propose(&[0], 8).unwrap().tokens.is_empty(), "5 sequences > 4: no drafts");
        load.store(4, Ordering::Relaxed);
        assert_eq!(busy.propose(&[0], 8).unwrap().tokens.len(), 2, "back under the threshold: drafts again");
    }
}
