//! Speculative sampling keeps the target's distribution: over thousands of seeded draws, the first two
//! sampled tokens follow the same distribution with the assistant model and with prompt lookup as with plain
//! sampling (a chi-square two-sample test at α = 0.001), and a deliberately wrong verifier fails the test.

mod common;

use std::collections::HashMap;

use augur::generation::config::{GenerationConfig, GenerationOptions};
use augur::generation::drafters::{AssistantModel, Draft, Drafter};
use augur::generation::output::{Emitter, GenerationStats};
use augur::generation::speculative;
use augur::model::CausalLm;
use common::*;

fn plain_draws() -> HashMap<Vec<u32>, usize> {
    let mut pipe = pipeline("tiny-llama", None);
    histogram(DRAWS, |s| pipe.generate_ids(&SAMPLING_PROMPT, &sampling(s + 1_000_000), None).unwrap().tokens)
}

#[test]
fn speculative_sampling_keeps_the_target_distribution() {
    let plain = plain_draws();
    assert!(plain.len() > 5, "the test needs a spread distribution, got {} outcomes", plain.len());
    let mut pipe = pipeline("tiny-llama", Some("tiny-llama-assistant"));
    let assisted = histogram(DRAWS, |s| pipe.generate_ids(&SAMPLING_PROMPT, &sampling(s), None).unwrap().tokens);
    let (stat, critical) = chi_square(&plain, &assisted);
    assert!(stat < critical, "assistant model: chi-square {stat:.1} ≥ {critical:.1}");
    let mut pipe = pipeline("tiny-llama", None);
    let lookup = histogram(DRAWS, |s| {
        let o = GenerationOptions { prompt_lookup_num_tokens: Some(3), ..sampling(s) };
        pipe.generate_ids(&SAMPLING_PROMPT, &o, None).unwrap().tokens
    });
    let (stat, critical) = chi_square(&plain, &lookup);
    assert!(stat < critical, "prompt lookup: chi-square {stat:.1} ≥ {critical:.1}");
}

/// A drafter whose reported `q` makes the verifier accept every draft (`q(x)` ≈ 0, so `p/q` is huge): the
/// always-accepting verifier the test must catch. It drafts, at each position, the least likely token that
/// the assistant's distribution still allows, which plain sampling rarely picks.
struct AlwaysAccepted<'m>(AssistantModel<'m>);

impl Drafter for AlwaysAccepted<'_> {
    fn method(&self) -> &'static str {
        "always_accepted"
    }
    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> augur::Result<Draft> {
        let mut d = self.0.propose(target, context, max)?;
        if let Some(q) = d.q.as_mut() {
            for (row, t) in q.iter_mut().zip(d.tokens.iter_mut()) {
                let rare = (0..row.len()).filter(|&i| row[i] > 0.0).min_by(|&a, &b| row[a].total_cmp(&row[b]));
                *t = rare.unwrap_or(*t as usize) as u32;
                row[*t as usize] = 1e-12;
            }
        }
        Ok(d)
    }
    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> augur::Result<()> {
        self.0.observe(context, proposed, accepted)
    }
}

#[test]
fn a_verifier_that_always_accepts_fails_the_test() {
    let plain = plain_draws();
    let mut target = load(&fixtures().join("tiny-llama"), false);
    let mut assistant = load(&fixtures().join("tiny-llama-assistant"), false);
    let vocab = target.config().vocab_size;
    let broken = histogram(DRAWS, |s| {
        let cfg = GenerationConfig::from_options(&sampling(s));
        target.model.truncate(0);
        let mut drafter = AlwaysAccepted(AssistantModel::new(assistant.model.as_mut(), &cfg, SAMPLING_PROMPT.len(), vocab).unwrap());
        let mut emitter = Emitter::new(&target.tokenizer, &SAMPLING_PROMPT, 2, vec![], vec![], None);
        let mut stats = GenerationStats::default();
        speculative::generate(target.model.as_mut(), &mut drafter, &cfg, &mut emitter, &mut stats).unwrap();
        emitter.into_output(stats).tokens
    });
    let (stat, critical) = chi_square(&plain, &broken);
    assert!(stat > critical, "the broken verifier went unnoticed: chi-square {stat:.1} < {critical:.1}");
}
