//! How many tokens to draft each round: `num_assistant_tokens` with its schedules, and the confidence
//! threshold with its ROC adaptation (Transformers' `update_candidate_strategy`).

use crate::generation::config::AssistantTokensSchedule;

#[derive(Debug, Clone)]
pub struct DraftLength {
    pub num_assistant_tokens: usize,
    pub schedule: AssistantTokensSchedule,
    /// Drafting stops after a token whose draft probability is below this; 0 disables it.
    pub confidence_threshold: f32,
    /// Whether the threshold adapts (Transformers does it only for the same-tokenizer assistant).
    adaptive: bool,
    /// Draft probabilities and whether each draft was accepted, for the ROC update.
    probs: Vec<f32>,
    matches: Vec<bool>,
}

impl DraftLength {
    pub fn new(num_assistant_tokens: usize, schedule: AssistantTokensSchedule, threshold: f32, adaptive: bool) -> Self {
        Self {
            num_assistant_tokens,
            schedule,
            confidence_threshold: threshold,
            adaptive: adaptive && threshold > 0.0,
            probs: Vec::new(),
            matches: Vec::new(),
        }
    }

    /// Records the draft probabilities of one round, in order.
    pub fn record_probs(&mut self, probs: &[f32]) {
        if self.adaptive {
            self.probs.extend_from_slice(probs);
        }
    }

    /// The target kept `accepted` of `proposed` drafts. Unlike Transformers, an empty draft (nothing was
    /// proposed) is not counted as a full success.
    pub fn update(&mut self, proposed: usize, accepted: usize) {
        if self.schedule != AssistantTokensSchedule::Constant && proposed > 0 {
            if accepted == proposed {
                self.num_assistant_tokens += 2;
            } else {
                self.num_assistant_tokens = self.num_assistant_tokens.saturating_sub(1).max(1);
            }
        }
        if self.adaptive {
            self.matches.extend(std::iter::repeat_n(true, accepted));
            if self.probs.len() > self.matches.len() {
                self.matches.push(false);
            }
            self.probs.truncate(self.matches.len());
            if self.probs.len() > 5 && self.matches.contains(&true) && self.matches.contains(&false) {
                if let Some(t) = best_threshold(&self.probs, &self.matches) {
                    self.confidence_threshold = t;
                }
            }
        }
    }
}

/// The threshold minimizing `fpr + 3·fnr` over the ROC curve of `(scores, labels)`, as scikit-learn's
/// `roc_curve` lists it (thresholds descending, the first minimum wins). The `+inf` point that scikit-learn
/// prepends is left out: choosing it would stop every draft after one token.
fn best_threshold(scores: &[f32], labels: &[bool]) -> Option<f32> {
    let pos = labels.iter().filter(|&&l| l).count() as f32;
    let neg = labels.len() as f32 - pos;
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let (mut tp, mut fp) = (0f32, 0f32);
    let mut best: Option<(f32, f32)> = None;
    let mut i = 0;
    while i < order.len() {
        let thr = scores[order[i]];
        // `total_cmp`, not `==`: a NaN score equals nothing, not even itself, and would never advance `i`.
        while i < order.len() && scores[order[i]].total_cmp(&thr).is_eq() {
            if labels[order[i]] {
                tp += 1.0
            } else {
                fp += 1.0
            }
            i += 1;
        }
        let cost = fp / neg + 3.0 * (1.0 - tp / pos);
        if best.is_none_or(|(c, _)| cost < c) {
            best = Some((cost, thr));
        }
    }
    best.map(|(_, t)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heuristic_schedule() {
        let mut d = DraftLength::new(4, AssistantTokensSchedule::Heuristic, 0.0, false);
        d.update(4, 4);
        assert_eq!(d.num_assistant_tokens, 6);
        d.update(6, 2);
        assert_eq!(d.num_assistant_tokens, 5);
        d.update(0, 0);
        assert_eq!(d.num_assistant_tokens, 5, "an empty draft is no success");
        let mut c = DraftLength::new(4, AssistantTokensSchedule::Constant, 0.0, false);
        c.update(4, 4);
        assert_eq!(c.num_assistant_tokens, 4);
        let mut one = DraftLength::new(1, AssistantTokensSchedule::HeuristicTransient, 0.0, false);
        one.update(1, 0);
        assert_eq!(one.num_assistant_tokens, 1);
    }

    #[test]
    fn roc_threshold_separates_accepted_from_rejected() {
        let scores = [0.9, 0.8, 0.7, 0.3, 0.2, 0.1];
        let labels = [true, true, true, false, false, false];
        assert_eq!(best_threshold(&scores, &labels), Some(0.7));
        // FN weighs 3× FP: a lone accepted draft at 0.2 pulls the threshold down to it.
        let labels = [true, true, true, false, true, false];
        assert_eq!(best_threshold(&scores, &labels), Some(0.2));
    }

    /// A NaN confidence (from NaN logits that slipped through) must not hang the threshold search. The search
    /// runs on a thread of its own so that a regression fails here instead of hanging the suite.
    #[test]
    fn roc_threshold_search_ends_on_nan() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let scores = [0.9, f32::NAN, 0.7, f32::NAN, 0.2, 0.1];
            let labels = [true, false, true, true, false, false];
            tx.send(best_threshold(&scores, &labels)).unwrap();
        });
        let t = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the ROC search hung on a NaN score");
        assert!(t.is_some());
    }
}
