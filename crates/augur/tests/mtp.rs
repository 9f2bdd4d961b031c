//! DeepSeek-V3 and GLM-4.5 (glm4_moe) against Transformers 5.24 on tiny random checkpoints with MTP layers
//! (`tools/fixtures/generate_mtp.py`): logits to 1e-4 relative in f32, greedy tokens exactly, and `use_mtp`'s
//! drafts and accepted counts per round as Transformers' `MTPCandidateGenerator` makes them (one MTP layer on the
//! published layer indices, two on a 3-layer model). Greedy `use_mtp` output equals plain greedy output,
//! the greedy ensemble weight is applied, and a model without MTP weights gets a clear error (sampling is tested
//! in `exact_distribution.rs`).

mod common;

use augur::generation::config::{GenerationConfig, GenerationOptions};
use augur::generation::output::{Emitter, GenerationStats};
use augur::models::CausalLm;
use augur::speculation::methods::MtpDrafter;
use augur::speculation::speculative;
use augur::speculation::{Draft, Drafter};
use augur::Tensor;
use common::*;

const MODELS: [&str; 3] = ["tiny-deepseek-v3-mtp", "tiny-glm4-moe-mtp", "tiny-deepseek-v3-mtp2"];

fn model_golden(name: &str) -> serde_json::Value {
    golden("mtp.json")["models"][name].clone()
}

fn check_logits(name: &str) {
    let g = model_golden(name);
    let mut lm = load(&fixtures().join(name), false);
    assert_eq!(lm.config().num_mtp_layers as u64, g["num_mtp_layers"].as_u64().unwrap());
    assert!(lm.mtp.is_some(), "{name}: MTP layers not loaded");
    for p in g["prompts"].as_array().unwrap() {
        let input = ids(&p["input_ids"]);
        assert_logits_match(name, lm.model.as_mut(), p);
        let mut pipe = augur::pipeline::Pipeline {
            target: load(&fixtures().join(name), false),
            assistant: None,
            defaults: Default::default(),
        };
        let want = ids(&p["greedy"]);
        let got = pipe.generate_ids(&input, &greedy(want.len()), None).unwrap();
        assert_eq!(got.tokens, want, "{name} greedy on {:?}", p["text"]);
    }
}

#[test]
fn deepseek_v3_matches_transformers() {
    check_logits("tiny-deepseek-v3-mtp");
}

#[test]
fn glm4_moe_matches_transformers() {
    check_logits("tiny-glm4-moe-mtp");
}

#[test]
fn deepseek_v3_with_two_mtp_layers_matches_transformers() {
    check_logits("tiny-deepseek-v3-mtp2");
}

/// Records each round's drafts, and the accepted count the loop reports back.
struct Recording<'m> {
    inner: MtpDrafter<'m>,
    rounds: Vec<(usize, Vec<u32>, usize)>,
}

impl Drafter for Recording<'_> {
    fn method(&self) -> &'static str {
        self.inner.method()
    }
    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> augur::Result<Draft> {
        let d = self.inner.propose(target, context, max)?;
        self.rounds.push((context.len(), d.tokens.clone(), 0));
        Ok(d)
    }
    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> augur::Result<()> {
        if let Some(r) = self.rounds.last_mut() {
            r.2 = accepted;
        }
        self.inner.observe(context, proposed, accepted)
    }
    fn reads_target(&self) -> augur::speculation::TargetReads {
        self.inner.reads_target()
    }
    fn target_hidden(&mut self, hidden: &Tensor, accepted_rows: usize) -> augur::Result<()> {
        self.inner.target_hidden(hidden, accepted_rows)
    }
}

fn check_mtp_rounds(name: &str) {
    let g = model_golden(name);
    let mut lm = load(&fixtures().join(name), false);
    for p in g["prompts"].as_array().unwrap() {
        let input = ids(&p["input_ids"]);
        let want = ids(&p["greedy"]);
        let opts = GenerationOptions { use_mtp: Some(true), ..greedy(want.len()) };
        let cfg = GenerationConfig::from_options(&opts);
        lm.model.truncate(0);
        let head = lm.mtp.as_mut().expect("MTP layers");
        let mut drafter =
            Recording { inner: MtpDrafter::new(head.as_mut(), &cfg, input.len()).unwrap(), rounds: vec![] };
        let mut emitter = Emitter::new(&lm.tokenizer, &input, want.len(), vec![], vec![], None);
        let mut stats = GenerationStats::default();
        speculative::generate(lm.model.as_mut(), &mut drafter, &cfg, &mut emitter, &mut stats).unwrap();
        assert_eq!(emitter.generated(), &want[..], "{name} use_mtp greedy on {:?}", p["text"]);
        let theirs: Vec<(usize, Vec<u32>, usize)> = p["mtp_rounds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["cur_len"].as_u64().unwrap() as usize, ids(&r["draft"]), r["n"].as_u64().unwrap() as usize))
            .collect();
        // Transformers drafts a full block past the length budget and trims after verification; the loop here
        // verifies only what fits, so the last round's drafts are compared up to the budget.
        assert_eq!(drafter.rounds.len(), theirs.len(), "{name} rounds on {:?}", p["text"]);
        for (i, (ours, t)) in drafter.rounds.iter().zip(&theirs).enumerate() {
            assert_eq!(ours.0, t.0, "{name} round {i} length");
            assert_eq!(ours.1, t.1, "{name} round {i} drafts on {:?}", p["text"]);
            assert_eq!(ours.2, t.2, "{name} round {i} accepted on {:?}", p["text"]);
        }
    }
}

#[test]
fn deepseek_v3_mtp_drafts_match_transformers() {
    check_mtp_rounds("tiny-deepseek-v3-mtp");
}

#[test]
fn glm4_moe_mtp_drafts_match_transformers() {
    check_mtp_rounds("tiny-glm4-moe-mtp");
}

#[test]
fn two_mtp_layers_drafts_match_transformers() {
    check_mtp_rounds("tiny-deepseek-v3-mtp2");
}

#[test]
fn use_mtp_greedy_equals_plain_greedy() {
    let prompts: [&[u32]; 3] = [&[297, 346, 370, 319, 265, 280, 297, 346, 370], &[5, 9, 14], &[100]];
    for name in MODELS {
        let mut pipe = pipeline(name, None);
        for p in prompts {
            let plain = pipe.generate_ids(p, &greedy(40), None).unwrap();
            let opts = GenerationOptions { use_mtp: Some(true), ..greedy(40) };
            let mtp = pipe.generate_ids(p, &opts, None).unwrap();
            assert_eq!(mtp.tokens, plain.tokens, "{name} on {p:?}");
            assert_eq!(mtp.stats.method, "mtp");
            assert!(mtp.stats.drafted > 0, "{name}: nothing drafted");
        }
    }
}

#[test]
fn use_mtp_without_mtp_layers_is_an_error() {
    let opts = GenerationOptions { use_mtp: Some(true), ..greedy(4) };
    let mut pipe = pipeline("tiny-llama", None);
    let err = pipe.generate_ids(&[5, 6, 7], &opts, None).unwrap_err().to_string();
    assert!(err.contains("Could not find `num_mtp_layers`"), "{err}");
    let mut pipe = pipeline("tiny-deepseek-v3-mtp2", None);
    pipe.target.mtp = None;
    let err = pipe.generate_ids(&[5, 6, 7], &opts, None).unwrap_err().to_string();
    assert!(err.contains("no MTP weights") && err.contains("model.layers.3."), "{err}");
}

/// The greedy ensemble weight is applied (see [`assert_greedy_ensemble_is_applied`]).
#[test]
fn greedy_ensemble_weight_is_applied() {
    assert_greedy_ensemble_is_applied(
        "tiny-deepseek-v3-mtp2",
        None,
        GenerationOptions { use_mtp: Some(true), ..greedy(24) },
    );
}
