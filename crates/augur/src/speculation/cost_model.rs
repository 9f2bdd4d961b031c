//! Cost-aware drafting: the loop measures what a round costs (drafting, then verifying γ drafts) and what it
//! yields (accepted drafts plus the target's own token), and caps the next round's draft length at the γ that
//! maximises expected tokens per second, or drafts nothing when a plain one-token step is faster.
//!
//! With per-draft acceptance rate α, a round of γ drafts yields E(γ) = (1 − α^(γ+1)) / (1 − α) tokens
//! (Leviathan et al., 2023) and costs t₁ + γ·(d + v): t₁ a one-token target forward, d the drafting seconds per
//! draft, v the extra verification seconds per draft. Every estimate is measured in this call: t₁ from plain
//! steps (one is taken right after the prefill), d and v from speculative rounds, α from decayed counts. When
//! drafting does not pay, the loop backs off for a growing number of plain steps, then probes again.
//!
//! A drafter with a model of its own must first read the whole prompt with it, a cost paid before any draft
//! (on 2 cores, a 0.5B assistant's prefill of a long prompt can outweigh everything it saves in a short
//! answer). For such drafters the prefill round and the t₁ step are plain, the assistant's one-token forward
//! is timed, its prefill estimated as the target's prefill scaled by the ratio of one-token forwards, and the
//! assistant is only started when that estimate is below what drafting could save over the remaining budget
//! ([`BEST_SAVING`] of the plain decoding time); otherwise the call decodes plainly to the end. The answer's
//! length is unknown (a 14-token answer under a 96-token budget never repays a long prompt's prefill), so the
//! remaining decode is also taken as at most what has been decoded so far plus [`ANSWER_PRIOR`] tokens: an
//! answer that has run n tokens is expected to run about as long again. A long prompt's assistant thus waits
//! until the answer proves long, as in ski rental; a short prompt's starts at once.
//!
//! Such a drafter also reads, on its next draft, every token accepted in the plain steps of a back-off: a
//! probe's drafting seconds hold that reading besides its drafts. Its drafts are costed at the measured per-draft
//! cost, the rest is the reading, per token; that round does not enter the per-draft cost. Every plain step of a
//! back-off that is followed by a probe thus costs the drafter one token's reading, however far apart the probes
//! are, so after a failed probe the probes stop for the call (plain steps to the end) once the reading per token
//! exceeds what drafting could save ([`BEST_SAVING`] of a step) weighted by the chance that a next probe finds
//! drafting paying again, taken as 1 / (failed probes + 1).
//!
//! Greedy outputs are unchanged by construction (only the round structure changes). Under sampling the
//! distribution stays exact, but the random stream is consumed differently depending on timing, so a seeded
//! sampled run is reproducible only with `cost_aware_drafting = false`.

/// Decay of the running estimates per round: the last few rounds dominate.
const DECAY: f64 = 0.7;
/// Longest draft the model proposes on its own (the drafter's own limit still applies).
const MAX_GAMMA: usize = 32;
/// Draft length of a round whose costs are not measured yet (the prefill round, the first drafting round) and
/// of a probe after a back-off: short, because a model drafter (early exit, an assistant) pays for each draft
/// whether or not it is accepted.
const PROBE_GAMMA: usize = 3;
/// Plain steps in the first back-off; doubled after each failed probe up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: usize = 4;
const MAX_BACKOFF: usize = 64;
/// Drafting must promise at least this speedup over a plain step.
const MIN_GAIN: f64 = 1.02;
/// The largest share of the remaining plain decoding time that drafting is assumed able to save, when weighing
/// a drafter's prefill: a 1.25× speedup saves a fifth. On 2 cores the best Spec-Bench category with the Qwen 0.5B
/// assistant gains 1.33×, most gain 1.1–1.25×; with a third (1.5×) assumed, the assistant was started on long
/// RAG and summarization prompts and lost 0.8×.
pub(crate) const BEST_SAVING: f64 = 0.2;
/// Tokens an answer is expected to run beyond those decoded so far, when weighing a drafter's prefill: short
/// answers after long prompts then do not start an assistant whose prefill they cannot repay, while long answers
/// do not wait for their decoded tokens alone to repay it (simulated over Spec-Bench; figures in BENCHMARKS.md).
const ANSWER_PRIOR: usize = 32;

#[derive(Debug, Clone)]
pub struct CostModel {
    /// Seconds of a one-token target forward.
    plain: Option<f64>,
    /// Drafting seconds per proposed draft.
    draft: Option<f64>,
    /// Verification seconds per draft beyond a one-token forward.
    verify: Option<f64>,
    /// Decayed counts of accepted drafts and of rejections (rounds that kept fewer drafts than proposed).
    accepted: f64,
    rejected: f64,
    rounds: usize,
    /// Plain steps left before the next probe, and the length of the next back-off.
    skip: usize,
    backoff: usize,
    probing: bool,
    setup: Setup,
    /// Whether the drafter has a model of its own, which reads the tokens accepted without it.
    reads_missed: bool,
    /// Plain steps since the drafter last drafted: tokens it reads on its next draft.
    unread: usize,
    /// The drafter's seconds of reading one token it did not draft, measured on probes after a back-off.
    read_cost: Option<f64>,
    /// Probes in a row that found drafting still not paying.
    failed_probes: usize,
}

/// Where a drafter with a prefill of its own stands (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Setup {
    /// No prefill of its own, or already paid.
    None,
    /// Not started: the seconds of the drafter's one-token forward, and of the target's prefill once measured.
    Deferred { step: f64, prefill: Option<f64> },
    /// Started this round: its draft seconds include the prefill and are not a per-draft cost.
    Starting,
    /// Judged not to pay for this call: every round is a plain step.
    Declined,
}

/// Where a drafter that must first read the prompt with a model of its own stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefill {
    /// Not judged to pay yet.
    Waiting,
    Started,
    /// Judged never to pay in this call.
    Declined,
}

/// Whether a drafter's prefill, estimated at `prefill` seconds, is to be paid now, with `remaining` tokens left
/// in the budget, `decoded` decoded so far and plain steps of `t1` seconds, drafting saving at most the share
/// `saving` of each (see the module doc): declined when the whole budget cannot repay it, waiting while the
/// answer decoded so far (plus [`ANSWER_PRIOR`]) cannot.
pub fn prefill_pays(prefill: f64, t1: f64, remaining: usize, decoded: usize, saving: f64) -> Prefill {
    let saving_per_token = saving * t1;
    if prefill > saving_per_token * remaining as f64 {
        Prefill::Declined
    } else if prefill > saving_per_token * (decoded + ANSWER_PRIOR) as f64 {
        Prefill::Waiting
    } else {
        Prefill::Started
    }
}

/// What the next round may draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftCap {
    /// No limit from the cost model.
    Unlimited,
    /// At most this many drafts; 0 means a plain step without calling the drafter.
    AtMost(usize),
}

impl Default for CostModel {
    fn default() -> Self {
        Self::new()
    }
}

impl CostModel {
    pub fn new() -> Self {
        Self {
            plain: None,
            draft: None,
            verify: None,
            accepted: 0.0,
            rejected: 0.0,
            rounds: 0,
            skip: 0,
            backoff: FIRST_BACKOFF,
            probing: false,
            setup: Setup::None,
            reads_missed: false,
            unread: 0,
            read_cost: None,
            failed_probes: 0,
        }
    }

    /// For a drafter that must read the prompt with a model of its own, whose one-token forward took
    /// `step_seconds`: it is started only once its prefill is judged to pay.
    pub fn with_drafter_prefill(step_seconds: f64) -> Self {
        Self { setup: Setup::Deferred { step: step_seconds, prefill: None }, reads_missed: true, ..Self::new() }
    }

    /// The cap for the next round, with `remaining` tokens left in the budget.
    pub fn next_cap(&mut self, remaining: usize) -> DraftCap {
        match (self.rounds, self.setup) {
            (_, Setup::Declined) => return DraftCap::AtMost(0),
            // The drafter's prefill waits for t₁.
            (0, Setup::Deferred { .. }) => return DraftCap::AtMost(0),
            // The prefill round's verification cost says nothing about decoding: a probe-length draft.
            (0, _) => return DraftCap::AtMost(PROBE_GAMMA),
            // One plain step right after the prefill measures t₁.
            (1, _) if self.plain.is_none() => return DraftCap::AtMost(0),
            (decoded, Setup::Deferred { step, prefill }) => {
                let t1 = self.plain.unwrap_or(step);
                // Every round so far was a plain one-token step.
                match prefill_pays(prefill.unwrap_or(0.0) * step / t1, t1, remaining, decoded, BEST_SAVING) {
                    Prefill::Declined => self.setup = Setup::Declined,
                    Prefill::Waiting => {}
                    Prefill::Started => {
                        self.setup = Setup::Starting;
                        return DraftCap::AtMost(PROBE_GAMMA);
                    }
                }
                return DraftCap::AtMost(0);
            }
            _ => {}
        }
        if self.skip > 0 {
            self.skip -= 1;
            if self.skip == 0 {
                self.probing = true;
                return DraftCap::AtMost(PROBE_GAMMA);
            }
            return DraftCap::AtMost(0);
        }
        match self.best_gamma() {
            Some(0) => {
                self.skip = self.backoff;
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                DraftCap::AtMost(0)
            }
            Some(g) => DraftCap::AtMost(g),
            None => DraftCap::AtMost(PROBE_GAMMA),
        }
    }

    /// Records a finished round: `gamma` drafts proposed, `accepted` kept, with its timings. `gamma == 0` is a
    /// plain step.
    pub fn record(&mut self, gamma: usize, accepted: usize, draft_seconds: f64, verify_seconds: f64) {
        let first = self.rounds == 0;
        self.rounds += 1;
        if first {
            if let Setup::Deferred { prefill, .. } = &mut self.setup {
                *prefill = Some(verify_seconds);
            }
            // Its drafting cost and acceptance count; its verification ran with the prefill and does not.
            if gamma > 0 {
                self.draft = Some(draft_seconds / gamma as f64);
                self.count(gamma, accepted);
            }
            return;
        }
        if gamma == 0 {
            self.plain = Some(ema(self.plain, verify_seconds, DECAY));
            self.unread += 1;
            return;
        }
        if let Some(t1) = self.plain {
            self.verify = Some(ema(self.verify, ((verify_seconds - t1) / gamma as f64).max(0.0), DECAY));
        }
        let unread = std::mem::take(&mut self.unread);
        if self.setup == Setup::Starting {
            self.setup = Setup::None;
        } else if self.reads_missed && unread > 0 {
            if let Some(d) = self.draft {
                let e = reading_per_token(draft_seconds, gamma, d, unread);
                self.read_cost = Some(ema(self.read_cost, e, DECAY));
            }
        } else {
            self.draft = Some(ema(self.draft, draft_seconds / gamma as f64, DECAY));
        }
        self.count(gamma, accepted);
        if std::mem::take(&mut self.probing) {
            if self.best_gamma().is_some_and(|g| g > 0) {
                self.backoff = FIRST_BACKOFF;
                self.failed_probes = 0;
            } else {
                self.failed_probes += 1;
                if self.probes_cannot_pay() {
                    self.setup = Setup::Declined;
                }
            }
        }
    }

    /// Whether the reading that each plain step costs a drafter that probes again outweighs what the probes can
    /// be expected to win back (see the module doc).
    fn probes_cannot_pay(&self) -> bool {
        match (self.read_cost, self.plain) {
            (Some(e), Some(t1)) => e / t1 > BEST_SAVING / (self.failed_probes + 1) as f64,
            _ => false,
        }
    }

    fn count(&mut self, gamma: usize, accepted: usize) {
        self.accepted = self.accepted * DECAY + accepted as f64;
        self.rejected = self.rejected * DECAY + if accepted < gamma { 1.0 } else { 0.0 };
    }

    /// The draft length with the best expected tokens per second; `None` until every cost is measured.
    fn best_gamma(&self) -> Option<usize> {
        let (t1, d, v) = (self.plain?, self.draft?, self.verify?);
        // A Beta(1, 1) prior keeps α inside (0, 1).
        let alpha = (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0);
        Some(best_length(alpha, (d + v) / t1, MAX_GAMMA, MIN_GAIN).0)
    }
}

/// The draft length up to `max` with the most expected tokens per one-token target forward, for drafts kept
/// with probability `alpha` (a round of γ yields (1 − α^(γ+1)) / (1 − α) tokens) that cost `per_draft` one-token
/// forwards each (drafting and verifying), with that rate; 0 when no length beats `floor`.
pub(crate) fn best_length(alpha: f64, per_draft: f64, max: usize, floor: f64) -> (usize, f64) {
    let (mut best, mut best_rate) = (0, floor);
    for g in 1..=max {
        let rate = (1.0 - alpha.powi(g as i32 + 1)) / (1.0 - alpha) / (1.0 + g as f64 * per_draft);
        if rate > best_rate {
            (best, best_rate) = (g, rate);
        }
    }
    (best, best_rate)
}

/// The decayed average of the estimate `old` and the new measurement `x` (`x` itself when there is none yet).
pub(crate) fn ema(old: Option<f64>, x: f64, decay: f64) -> f64 {
    old.map_or(x, |o| decay * o + (1.0 - decay) * x)
}

/// The reading cost per token of a round in which a drafter with a model of its own first read the `unread`
/// tokens accepted without it and then drafted `drafts` at `per_draft` each: what the round's drafting took
/// (`draft_cost`, in any unit) beyond its drafts, per token.
pub(crate) fn reading_per_token(draft_cost: f64, drafts: usize, per_draft: f64, unread: usize) -> f64 {
    (draft_cost - drafts as f64 * per_draft).max(0.0) / unread.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `rounds` rounds where every draft costs `d` + `v` seconds and drafts are accepted with the
    /// fixed pattern `accept(gamma)`; returns the caps handed out.
    fn simulate(rounds: usize, t1: f64, d: f64, v: f64, accept: impl Fn(usize) -> usize) -> Vec<DraftCap> {
        simulate_with(CostModel::new(), rounds, t1, d, v, accept)
    }

    fn simulate_with(
        mut m: CostModel,
        rounds: usize,
        t1: f64,
        d: f64,
        v: f64,
        accept: impl Fn(usize) -> usize,
    ) -> Vec<DraftCap> {
        let mut caps = Vec::new();
        for _ in 0..rounds {
            let cap = m.next_cap(1000);
            caps.push(cap);
            let gamma = match cap {
                DraftCap::Unlimited => 10,
                DraftCap::AtMost(g) => g.min(10),
            };
            let n = accept(gamma);
            m.record(gamma, n, d * gamma as f64, t1 + v * gamma as f64);
        }
        caps
    }

    #[test]
    fn measures_a_plain_step_after_the_prefill() {
        let caps = simulate(3, 0.01, 0.0, 0.001, |g| g);
        assert_eq!(caps[0], DraftCap::AtMost(PROBE_GAMMA));
        assert_eq!(caps[1], DraftCap::AtMost(0));
    }

    #[test]
    fn cheap_accurate_drafts_keep_drafting() {
        let caps = simulate(40, 0.01, 0.0005, 0.0005, |g| g);
        assert!(caps[3..].iter().all(|c| matches!(c, DraftCap::AtMost(g) if *g >= 8)), "{caps:?}");
    }

    #[test]
    fn useless_drafts_back_off_with_growing_gaps() {
        let caps = simulate(200, 0.01, 0.002, 0.002, |_| 0);
        let drafting: Vec<usize> = caps
            .iter()
            .enumerate()
            .filter(|(i, c)| *i > 1 && !matches!(c, DraftCap::AtMost(0)))
            .map(|(i, _)| i)
            .collect();
        // A few early rounds until the estimates settle, then only probes, further and further apart.
        assert!(drafting.len() < 15, "{drafting:?}");
        let gaps: Vec<usize> = drafting.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.last() >= gaps.first(), "{gaps:?}");
        assert!(*gaps.last().unwrap() >= 32, "{gaps:?}");
    }

    #[test]
    fn expensive_drafts_shorten_the_draft() {
        // Each draft costs 40% of a target forward and half of them are accepted: short drafts are best.
        let caps = simulate(60, 0.01, 0.004, 0.0, |g| g / 2);
        let last = caps.last().unwrap();
        assert!(matches!(last, DraftCap::AtMost(g) if *g <= 3), "{caps:?}");
    }

    #[test]
    fn a_drafter_prefill_waits_and_is_declined_when_it_cannot_pay() {
        // Prefill rounds take `t1 + v·10` in `simulate`; with a 1000-token budget, a drafter whose step costs
        // as much as the target's would need a prefill under a fifth of 1000 steps: it gets it.
        let caps = simulate_with(CostModel::with_drafter_prefill(0.01), 6, 0.01, 0.001, 0.0, |g| g);
        assert_eq!(&caps[..3], &[DraftCap::AtMost(0), DraftCap::AtMost(0), DraftCap::AtMost(PROBE_GAMMA)], "{caps:?}");
        assert!(caps[3..].iter().all(|c| *c != DraftCap::AtMost(0)), "{caps:?}");
        // A measured prefill of 400 target steps is more than a fifth of the budget: never started.
        let mut m = CostModel::with_drafter_prefill(0.01);
        assert_eq!(m.next_cap(1000), DraftCap::AtMost(0));
        m.record(0, 0, 0.0, 4.0);
        assert_eq!(m.next_cap(1000), DraftCap::AtMost(0));
        m.record(0, 0, 0.0, 0.01);
        for _ in 0..20 {
            assert_eq!(m.next_cap(1000), DraftCap::AtMost(0));
            m.record(0, 0, 0.0, 0.01);
        }
    }

    #[test]
    fn a_long_prompt_drafter_waits_for_the_answer_to_prove_long() {
        // A prefill of 10.1 target steps (step ratio 1) is repaid by 51 tokens at a fifth of a step each: the
        // drafter starts once 19 decoded tokens and the 32 expected beyond them reach that, however large the
        // budget.
        let mut m = CostModel::with_drafter_prefill(0.01);
        let mut caps = Vec::new();
        for round in 0..30 {
            let cap = m.next_cap(1000);
            caps.push(cap);
            let seconds = if round == 0 { 0.101 } else { 0.01 };
            match cap {
                DraftCap::AtMost(0) => m.record(0, 0, 0.0, seconds),
                _ => m.record(3, 3, 0.003, seconds),
            }
        }
        let first = caps.iter().position(|c| *c != DraftCap::AtMost(0));
        assert_eq!(first, Some(19), "{caps:?}");
    }

    /// A drafter with a model that drafts poorly: plain steps of `t1`, drafts of `d` each never accepted, and
    /// `e` seconds of reading per token it missed. Returns the caps handed out and the model.
    fn back_off_with_reading(rounds: usize, t1: f64, d: f64, e: f64) -> (Vec<DraftCap>, CostModel) {
        let mut m = CostModel::with_drafter_prefill(d);
        let (mut caps, mut unread) = (Vec::new(), 0);
        for round in 0..rounds {
            let cap = m.next_cap(1000);
            caps.push(cap);
            match cap {
                DraftCap::AtMost(0) => {
                    m.record(0, 0, 0.0, t1);
                    // The prefill and t₁ rounds come before the drafter starts: it reads them with the prompt.
                    unread = if round < 2 { 0 } else { unread + 1 };
                }
                DraftCap::AtMost(g) => {
                    m.record(g, 0, g as f64 * d + std::mem::take(&mut unread) as f64 * e, t1);
                }
                DraftCap::Unlimited => unreachable!("the cost model always caps"),
            }
        }
        (caps, m)
    }

    #[test]
    fn a_probe_after_a_back_off_counts_its_reading_apart_from_its_drafts() {
        // Reading a missed token costs 5% of a step: below what the probes can win back, so they go on.
        let (caps, m) = back_off_with_reading(120, 0.01, 0.006, 0.0005);
        let probes = caps.iter().skip(4).filter(|c| **c != DraftCap::AtMost(0)).count();
        assert!(probes >= 3, "{caps:?}");
        assert!((m.draft.unwrap() - 0.006).abs() < 1e-9, "the draft cost took in the reading: {:?}", m.draft);
        assert!((m.read_cost.unwrap() - 0.0005).abs() < 1e-9, "{:?}", m.read_cost);
    }

    #[test]
    fn probes_stop_when_the_reading_they_cost_cannot_pay() {
        // Reading a missed token costs 30% of a step, more than drafting could ever save: after the first failed
        // probe the drafter is never called again.
        let (caps, m) = back_off_with_reading(200, 0.01, 0.006, 0.003);
        assert_eq!(m.setup, Setup::Declined, "{caps:?}");
        let last_draft = caps.iter().rposition(|c| *c != DraftCap::AtMost(0)).unwrap();
        assert!(last_draft < 40, "{caps:?}");
        // Without a model of its own (prompt lookup), a drafter reads nothing and keeps probing.
        let caps = simulate(200, 0.01, 0.006, 0.0, |_| 0);
        assert!(caps[100..].iter().any(|c| *c != DraftCap::AtMost(0)), "{caps:?}");
    }

    #[test]
    fn the_starting_round_does_not_count_the_drafter_prefill_as_draft_cost() {
        let mut m = CostModel::with_drafter_prefill(0.002);
        m.next_cap(1000);
        m.record(0, 0, 0.0, 0.05);
        m.next_cap(1000);
        m.record(0, 0, 0.0, 0.01);
        assert_eq!(m.next_cap(1000), DraftCap::AtMost(PROBE_GAMMA));
        // Its drafting took 5 s, nearly all of it the drafter's prefill.
        m.record(4, 4, 5.0, 0.011);
        assert_eq!(m.draft, None);
    }
}
