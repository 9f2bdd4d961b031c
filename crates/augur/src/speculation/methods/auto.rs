//! `auto`: each round drafts from whichever source promises the most tokens per second, or not at all. The
//! sources are suffix decoding (free to draft, each node with an estimated probability of being accepted) and,
//! when the pipeline has one with the target's tokenizer, the assistant model.
//!
//! Costs are counted in one-token target forwards (t₁, measured on the call's plain steps): verifying n draft
//! rows costs 1 + n·r, an assistant draft d more. A suffix draft of its n most probable nodes yields
//! 1 + c·Σpᵢ tokens, c calibrating the counts' probabilities against what the target really kept in this call
//! (an output seen once predicts its continuation with probability 1); an assistant draft of γ tokens yields
//! (1 − α^(γ+1)) / (1 − α) at its measured acceptance α (Leviathan et al.). The round takes the best rate of
//! the two, each at its best size, when it beats a plain step by [`MIN_GAIN`]; otherwise a plain step. Before
//! its first draft the assistant's d is its measured one-token forward, α its prior, and its draft at most
//! [`PROBE_GAMMA`] long. r, d, c and α are measured on the call's own rounds (d only on rounds where the
//! assistant had read the whole context) and decay towards their priors, so a source that failed once is tried
//! again later. The assistant must first read the prompt: it starts only when its rate at the prior beats
//! [`MIN_GAIN`] and the saving that rate promises repays the reading (the cost model's rule,
//! [`cost_model::prefill_pays`]): where its drafts cost nearly what they save, it never starts. After rounds
//! without it, it must first read the tokens accepted since (u of them, e each, in one-token forwards): its round
//! then also costs u·e spread over [`REENTRY_ROUNDS`], so that a return pays only when the drafts that follow can
//! repay the reading. e is measured on such returns; before one, it is the target's prefill cost per token scaled
//! by the ratio of one-token forwards.
//!
//! The drafts are verified as any method's: greedy output is plain greedy output, sampling keeps the target's
//! distribution.

use std::time::Instant;

use super::assistant;
use super::suffix::{self, SuffixDrafter};
use crate::error::{Error, Result};
use crate::generation::config::GenerationConfig;
use crate::generation::output::GenerationStats;
use crate::models::{CausalLm, ModelConfig};
use crate::speculation::cost_model::{self, ema, Prefill};
use crate::speculation::drafter::{Draft, Drafter};
use crate::speculation::factory::{missing, DraftParts};
use crate::speculation::method::{Available, SpeculationMethod};
use crate::speculation::registry::{self, Method};

/// `auto`: named by the CLI and the server when no method is; the assistant joins when the pipeline has one
/// that shares the target's tokenizer.
pub(crate) const METHOD: Method = Method {
    name: "auto",
    knobs: &[
        &registry::SUFFIX,
        &[
            &registry::NUM_ASSISTANT_TOKENS,
            &registry::NUM_ASSISTANT_TOKENS_SCHEDULE,
            &registry::ASSISTANT_CONFIDENCE_THRESHOLD,
            &registry::ASSISTANT_CONFIDENCE_ADAPTIVE,
            &registry::DRAFT_VOCAB_SIZE,
        ],
    ],
    chosen: |_, _| false,
    named: |_| Ok(()),
    resolve,
    build,
};

fn resolve(cfg: &GenerationConfig, models: &Available<'_>) -> Result<SpeculationMethod> {
    suffix::params(cfg)?;
    let assistant = match models.assistant {
        None => false,
        Some(_) => match (assistant::METHOD.resolve)(cfg, models)? {
            SpeculationMethod::Assistant => true,
            other => {
                return Err(Error::InvalidOption(format!(
                    "method `auto` drafts with an assistant that shares the target's tokenizer; this one would run as \
                     {other:?}: name method `assistant_model` to use it"
                )))
            }
        },
    };
    Ok(SpeculationMethod::Auto { assistant })
}

fn build<'a>(
    method: SpeculationMethod,
    cfg: &GenerationConfig,
    prompt_len: usize,
    target: &ModelConfig,
    parts: DraftParts<'a>,
) -> Result<Box<dyn Drafter + 'a>> {
    let SpeculationMethod::Auto { assistant } = method else { return Err(missing(method, "method `auto`")) };
    let suffix = SuffixDrafter::new(cfg, prompt_len, parts.suffix_cache.clone())?;
    let assistant = match assistant {
        true => Some((assistant::METHOD.build)(SpeculationMethod::Assistant, cfg, prompt_len, target, parts)?),
        false => None,
    };
    Ok(Box::new(Auto::new(suffix, assistant, prompt_len)))
}

/// A round must promise at least this speedup over a plain step: below it the estimates' noise decides.
const MIN_GAIN: f64 = 1.05;
/// Decay of the measured estimates per round that measures them.
const DECAY: f64 = 0.8;
/// Decay per round that does not: a source that failed is tried again after some tens of rounds, not at once.
const IDLE_DECAY: f64 = 0.97;
/// Prior cost of a verified draft row, in one-token forwards (measured: 0.1–0.3 on 2 cores).
const PRIOR_ROW: f64 = 0.25;
/// Prior calibration of the suffix counts, and its weight in rounds.
const PRIOR_CALIBRATION: f64 = 0.5;
const PRIOR_WEIGHT: f64 = 2.0;
/// Prior acceptance of the assistant's drafts: what an assistant of the target's own family keeps (Spec-Bench,
/// BENCHMARKS.md). A source that failed is tried again once its estimate leans back to this.
const PRIOR_ALPHA: f64 = 0.8;
/// Most nodes drafted with the prompt, whose forward they join.
const PREFILL_NODES: usize = 4;
/// Longest assistant draft considered.
const MAX_GAMMA: usize = 16;
/// The assistant's first draft, before its acceptance is measured.
const PROBE_GAMMA: usize = 3;
/// Rounds over which a return to the assistant spreads the cost of its reading the tokens accepted without it:
/// a return is expected to draft for some rounds before the suffix or a plain step takes over again.
const REENTRY_ROUNDS: f64 = 8.0;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Lane {
    /// The prompt's forward, with at most [`PREFILL_NODES`] suffix drafts.
    Prefill,
    Plain,
    Suffix {
        predicted: f64,
    },
    Assistant {
        first: bool,
        /// Context tokens the assistant had not read when the round began (accepted in rounds without it):
        /// only with none do the draft's seconds measure drafting alone.
        unread: usize,
    },
}

/// What the pending round did, until [`Drafter::observe`] closes it.
struct Round {
    lane: Lane,
    rows: usize,
    draft_seconds: f64,
    /// When the draft was handed to the loop: the verification follows.
    proposed: Instant,
}

/// A decayed ratio with a prior: `(num + prior·weight) / (den + weight)`.
#[derive(Debug, Clone, Copy)]
struct Estimate {
    num: f64,
    den: f64,
    prior: f64,
}

impl Estimate {
    fn new(prior: f64) -> Self {
        Self { num: 0.0, den: 0.0, prior }
    }

    fn value(&self) -> f64 {
        (self.num + self.prior * PRIOR_WEIGHT) / (self.den + PRIOR_WEIGHT)
    }

    fn add(&mut self, num: f64, den: f64) {
        self.num = self.num * DECAY + num;
        self.den = self.den * DECAY + den;
    }

    /// A round without a measurement: the estimate leans towards its prior.
    fn lean(&mut self) {
        self.num *= IDLE_DECAY;
        self.den *= IDLE_DECAY;
    }
}

pub struct Auto<'a> {
    suffix: SuffixDrafter,
    assistant: Option<Box<dyn Drafter + 'a>>,
    prompt_len: usize,
    /// Seconds of a one-token target forward.
    t1: Option<f64>,
    /// Seconds of the prompt's forward.
    prefill: Option<f64>,
    /// Extra verification cost per draft row, in one-token forwards.
    row: Estimate,
    /// Accepted suffix drafts per predicted one.
    calibration: Estimate,
    /// The assistant: its drafts' acceptance, drafting cost per draft (one-token forwards), one-token forward
    /// seconds, and whether it has read the prompt.
    alpha: Estimate,
    draft_cost: Option<f64>,
    /// The assistant's cost of reading a token it did not draft, in one-token target forwards.
    read_cost: Option<f64>,
    assistant_step: Option<f64>,
    assistant_state: Prefill,
    assistant_rounds: usize,
    /// The context's length when the assistant last observed a verdict.
    assistant_seen: Option<usize>,
    round: Option<Round>,
}

impl<'a> Auto<'a> {
    pub fn new(suffix: SuffixDrafter, assistant: Option<Box<dyn Drafter + 'a>>, prompt_len: usize) -> Self {
        let assistant_state = if assistant.is_some() { Prefill::Waiting } else { Prefill::Declined };
        Self {
            suffix,
            assistant,
            prompt_len,
            t1: None,
            prefill: None,
            row: Estimate::new(PRIOR_ROW),
            calibration: Estimate::new(PRIOR_CALIBRATION),
            alpha: Estimate::new(PRIOR_ALPHA),
            draft_cost: None,
            read_cost: None,
            assistant_step: None,
            assistant_state,
            assistant_rounds: 0,
            assistant_seen: None,
            round: None,
        }
    }

    /// The suffix draft's most rewarding prefix: its node count and rate (tokens per one-token forward).
    fn best_suffix(&self, probs: &[f32]) -> (usize, f64) {
        let (c, r) = (self.calibration.value(), self.row.value());
        let (mut best, mut best_rate, mut sum) = (0, 1.0, 0.0);
        for (i, &p) in probs.iter().enumerate() {
            sum += f64::from(p);
            let rate = (1.0 + c * sum) / (1.0 + (i + 1) as f64 * r);
            if rate > best_rate {
                (best, best_rate) = (i + 1, rate);
            }
        }
        (best, best_rate)
    }

    /// The assistant's best draft length and rate, with `unread` context tokens to read first (its round costs
    /// 1 + o + γ·(d + r), o their share of reading). Before its first draft, d is its one-token forward and the
    /// draft at most [`PROBE_GAMMA`] long.
    fn best_assistant(&self, max: usize, unread: usize) -> (usize, f64) {
        let (alpha, r) = (self.alpha.value().min(0.99), self.row.value());
        let (d, max) = match (self.draft_cost, self.assistant_step, self.t1) {
            (Some(d), ..) => (d, MAX_GAMMA.min(max)),
            (None, Some(step), Some(t1)) => (step / t1, PROBE_GAMMA.min(max)),
            _ => return (0, 1.0),
        };
        let base = 1.0 + unread as f64 * self.read_cost().unwrap_or(0.0) / REENTRY_ROUNDS;
        // E/(1 + o + γp) = (E/(1 + γ·p/(1 + o))) / (1 + o): the plain form, scaled.
        let (g, rate) = cost_model::best_length(alpha, (d + r) / base, max, base);
        (g, rate / base)
    }

    /// The assistant's reading cost per token: measured on returns, else the target's prefill cost per token
    /// scaled by the ratio of one-token forwards.
    fn read_cost(&self) -> Option<f64> {
        let scaled = || Some(self.assistant_prefill()? / self.prompt_len.max(1) as f64 / self.t1?);
        self.read_cost.or_else(scaled)
    }

    /// Seconds the assistant's reading of the prompt is expected to take: the target's, scaled by the ratio of
    /// their one-token forwards.
    fn assistant_prefill(&self) -> Option<f64> {
        Some(self.prefill? * self.assistant_step? / self.t1?)
    }

    /// Context tokens the assistant has not read (0 before its first round: its prefill is judged apart).
    fn unread(&self, context_len: usize) -> usize {
        self.assistant_seen.map_or(0, |seen| context_len.saturating_sub(seen))
    }

    /// Whether the assistant may draft this round: started, or its prefill now judged to pay.
    fn assistant_ready(&mut self, decoded: usize, remaining: usize) -> Result<bool> {
        if self.assistant_state == Prefill::Waiting {
            let Some(a) = self.assistant.as_mut() else { return Ok(false) };
            if self.assistant_step.is_none() {
                self.assistant_step = Some(a.step_seconds()?.unwrap_or(0.0));
            }
            // Its rate at the prior acceptance, from its measured step, bounds what drafting can save.
            let (_, rate) = self.best_assistant(remaining, 0);
            if let (Some(t1), Some(prefill), true) = (self.t1, self.assistant_prefill(), rate > MIN_GAIN) {
                let saving = (1.0 - 1.0 / rate).min(cost_model::BEST_SAVING);
                self.assistant_state = cost_model::prefill_pays(prefill, t1, remaining, decoded, saving);
            }
        }
        Ok(self.assistant_state == Prefill::Started)
    }
}

impl Drafter for Auto<'_> {
    fn method(&self) -> &'static str {
        METHOD.name
    }

    fn plans_rounds(&self) -> bool {
        true
    }

    fn report(&self, stats: &mut GenerationStats) {
        self.suffix.report(stats);
        if self.assistant_rounds > 0 {
            stats.draft_sources.insert("assistant", self.assistant_rounds);
        }
    }

    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        let t0 = Instant::now();
        let decoded = context.len().saturating_sub(self.prompt_len);
        let (draft, lane) = if decoded == 0 && self.prefill.is_none() {
            let (c, source) = self.suffix.candidate(context, max.min(PREFILL_NODES));
            let draft = suffix::draft(c, PREFILL_NODES, target.config().vocab_size);
            if !draft.tokens.is_empty() {
                self.suffix.drafted_from(source);
            }
            (draft, Lane::Prefill)
        } else if self.t1.is_none() || max == 0 {
            (Draft::default(), Lane::Plain)
        } else {
            let (c, source) = self.suffix.candidate(context, max);
            let (n, suffix_rate) = self.best_suffix(&c.probs);
            let unread = self.unread(context.len());
            let assistant =
                if self.assistant_ready(decoded, max + 1)? { Some(self.best_assistant(max, unread)) } else { None };
            match assistant {
                Some((g, rate)) if g > 0 && rate > suffix_rate.max(MIN_GAIN) => {
                    let a = self
                        .assistant
                        .as_mut()
                        .ok_or_else(|| missing(SpeculationMethod::Auto { assistant: true }, "an assistant"))?;
                    a.set_cost_cap(Some(g));
                    let first = self.draft_cost.is_none();
                    (a.propose(target, context, g)?, Lane::Assistant { first, unread })
                }
                _ if n > 0 && suffix_rate > MIN_GAIN => {
                    self.suffix.drafted_from(source);
                    let predicted = c.probs[..n].iter().map(|&p| f64::from(p)).sum();
                    (suffix::draft(c, n, target.config().vocab_size), Lane::Suffix { predicted })
                }
                _ => (Draft::default(), Lane::Plain),
            }
        };
        let lane = if draft.tokens.is_empty() && lane != Lane::Prefill { Lane::Plain } else { lane };
        self.round = Some(Round {
            lane,
            rows: draft.tokens.len(),
            draft_seconds: t0.elapsed().as_secs_f64(),
            proposed: Instant::now(),
        });
        Ok(draft)
    }

    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> Result<()> {
        self.suffix.observe(context, proposed, accepted)?;
        let Some(round) = self.round.take() else { return Ok(()) };
        let seconds = round.proposed.elapsed().as_secs_f64();
        // Each estimate this round does not measure leans towards its prior.
        if !matches!(round.lane, Lane::Suffix { .. }) {
            self.calibration.lean();
        }
        if !matches!(round.lane, Lane::Assistant { .. }) {
            self.alpha.lean();
        }
        match round.lane {
            Lane::Prefill => self.prefill = Some(seconds),
            Lane::Plain => self.t1 = Some(ema(self.t1, seconds, DECAY)),
            Lane::Suffix { predicted } => {
                self.calibration.add(accepted as f64, predicted);
                self.measure_rows(round.rows, seconds);
            }
            Lane::Assistant { first, unread } => {
                self.assistant_rounds += 1;
                self.assistant_seen = Some(context.len());
                if let Some(a) = self.assistant.as_mut() {
                    a.observe(context, proposed, accepted)?;
                }
                let rejected = if accepted < proposed { 1.0 } else { 0.0 };
                self.alpha.add(accepted as f64, accepted as f64 + rejected);
                self.measure_rows(round.rows, seconds);
                // The first draft's seconds include the assistant reading the prompt: its one-token forward
                // stands in for them. A later draft after rounds without the assistant includes its reading
                // the tokens accepted since: beyond its drafts at their measured cost, that measures the
                // reading cost per token.
                let per_draft = match (first, unread) {
                    (true, _) => self.assistant_step,
                    (false, 0) => Some(round.draft_seconds / round.rows.max(1) as f64),
                    (false, _) => {
                        if let (Some(d), Some(t1)) = (self.draft_cost, self.t1) {
                            let e = cost_model::reading_per_token(round.draft_seconds / t1, round.rows, d, unread);
                            self.read_cost = Some(ema(self.read_cost, e, DECAY));
                        }
                        None
                    }
                };
                if let (Some(s), Some(t1)) = (per_draft, self.t1) {
                    // The first measurement replaces the stand-in for d rather than averaging with it.
                    let old = if first { None } else { self.draft_cost };
                    self.draft_cost = Some(ema(old, s / t1, DECAY));
                }
            }
        }
        Ok(())
    }
}

impl Auto<'_> {
    /// Folds a verification of `rows` draft rows that took `seconds` into the per-row cost.
    fn measure_rows(&mut self, rows: usize, seconds: f64) {
        if let (Some(t1), true) = (self.t1, rows > 0) {
            // Summed over rows rather than averaged over rounds: a long draft's rows weigh by their number.
            self.row.add((seconds / t1 - 1.0).max(0.0), rows as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto() -> Auto<'static> {
        let suffix = SuffixDrafter::new(&GenerationConfig::default(), 0, None).unwrap();
        let mut a = Auto::new(suffix, None, 0);
        a.t1 = Some(0.01);
        a
    }

    #[test]
    fn likely_suffix_nodes_are_drafted_and_unlikely_ones_are_not() {
        let a = auto();
        // At the priors (c = 0.5, r = 0.25) a certain node yields 1.5 tokens for 1.25 forwards.
        assert_eq!(a.best_suffix(&[1.0, 1.0, 1.0]).0, 3);
        assert_eq!(a.best_suffix(&[1.0, 1.0, 0.2]).0, 2);
        assert_eq!(a.best_suffix(&[0.3]).0, 0);
        assert_eq!(a.best_suffix(&[]).0, 0);
    }

    #[test]
    fn the_calibration_follows_what_the_target_kept() {
        let mut a = auto();
        for _ in 0..6 {
            a.calibration.add(0.0, 3.0);
        }
        assert_eq!(a.best_suffix(&[1.0, 1.0, 1.0]).0, 0, "drafts the target never kept");
        // The estimate leans back towards its prior on rounds that do not draft from the suffix.
        for _ in 0..120 {
            a.calibration.lean();
        }
        assert!(a.best_suffix(&[1.0, 1.0, 1.0]).0 > 0);
        for _ in 0..6 {
            a.calibration.add(3.0, 3.0);
        }
        assert!(a.calibration.value() > 0.8);
    }

    #[test]
    fn the_assistant_drafts_as_long_as_its_acceptance_pays() {
        let mut a = auto();
        assert_eq!(a.best_assistant(10, 0).0, 0, "its step not measured: no rate");
        // Not measured yet: its one-token forward stands in for d, its draft at most PROBE_GAMMA long.
        a.assistant_step = Some(0.001);
        assert_eq!(a.best_assistant(10, 0).0, PROBE_GAMMA);
        a.assistant_step = Some(0.006);
        assert_eq!(a.best_assistant(10, 0).0, 0, "a step of 0.6 t₁ never pays at the prior acceptance");
        a.draft_cost = Some(0.1);
        for _ in 0..10 {
            a.alpha.add(1.0, 1.0);
        }
        let (long, rate) = a.best_assistant(16, 0);
        assert!(long >= 4 && rate > 1.0, "{long} {rate}");
        for _ in 0..10 {
            a.alpha.add(0.0, 1.0);
        }
        assert_eq!(a.best_assistant(16, 0).0, 0, "drafts that are never kept");
    }

    #[test]
    fn a_return_to_the_assistant_pays_for_reading_what_it_missed() {
        let mut a = auto();
        a.draft_cost = Some(0.4);
        for _ in 0..10 {
            a.alpha.add(1.0, 1.0);
        }
        // Before a return is measured, the reading cost is the target's prefill per token scaled by the ratio
        // of one-token forwards: 0.4 s over 40 tokens is one t₁ per token, the assistant's step 0.4 of it.
        assert_eq!(a.read_cost(), None);
        (a.prefill, a.prompt_len, a.assistant_step) = (Some(0.4), 40, Some(0.004));
        assert!((a.read_cost().unwrap() - 0.4).abs() < 1e-9);
        a.read_cost = Some(0.16);
        let (g, in_sync) = a.best_assistant(16, 0);
        assert!(g > 0 && in_sync > 1.1, "{g} {in_sync}");
        let (g, near) = a.best_assistant(16, 4);
        assert!(g > 0 && near < in_sync, "a few tokens to read: still drafts, at a lower rate ({near})");
        assert_eq!(a.best_assistant(16, 56).0, 0, "56 tokens to read cost more than the drafts save");
        assert_eq!(a.unread(100), 0, "before its first round nothing counts as unread");
        a.assistant_seen = Some(60);
        assert_eq!(a.unread(100), 40);
    }
}
