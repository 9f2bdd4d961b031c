//! Self-speculation by early exit (LayerSkip; Transformers' `EarlyExitCandidateGenerator`): the target's first
//! `L` layers, its final norm and its LM head draft autoregressively, and the full model verifies.
//!
//! There is one model and one cache. Drafting appends the drafted positions to the first `L` layers' caches only
//! (see `ForwardOptions::exit_layer`); the verification forward then reuses those entries, and the hidden states
//! that left layer `L`, for every position whose token it is fed again, so the first `L` layers never recompute
//! a drafted position. The context's early-layer entries need no drafting pass at all: the verifier already
//! wrote them. Transformers instead keeps a separate `L`-layer cache for the drafts and recomputes everything.

use super::autoregressive::Autoregressive;
use crate::error::{Error, Result};
use crate::generation::config::GenerationConfig;
use crate::models::{CausalLm, ForwardOptions, LogitRows, ModelConfig};
use crate::speculation::drafter::{Draft, Drafter, TargetReads};
use crate::speculation::factory::{missing, DraftParts};
use crate::speculation::method::SpeculationMethod;
use crate::speculation::registry::{self, Method};

/// `early_exit`: chosen by `assistant_early_exit`, ahead of every other method.
pub(crate) const METHOD: Method = Method {
    name: "early_exit",
    knobs: &[&[&registry::ASSISTANT_EARLY_EXIT], &registry::MODEL_DRAFTER, &registry::TREE],
    chosen: |cfg, _| cfg.assistant_early_exit.is_some(),
    named: |own| early_exit_layers(own.assistant_early_exit).map(|_| ()),
    resolve: |cfg, _| Ok(SpeculationMethod::EarlyExit { layers: early_exit_layers(cfg.assistant_early_exit)? }),
    build,
};

fn early_exit_layers(layers: Option<usize>) -> Result<usize> {
    layers
        .ok_or_else(|| Error::InvalidOption("method `early_exit` needs `assistant_early_exit` (a layer count)".into()))
}

fn build<'a>(
    method: SpeculationMethod,
    cfg: &GenerationConfig,
    prompt_len: usize,
    target: &ModelConfig,
    _parts: DraftParts<'a>,
) -> Result<Box<dyn Drafter + 'a>> {
    let SpeculationMethod::EarlyExit { layers } = method else {
        return Err(missing(method, "a layer count"));
    };
    Ok(Box::new(EarlyExit::new(layers, target.num_hidden_layers, cfg, prompt_len)?))
}

/// The drafting model's name in errors: the target's own first layers.
const EARLY_EXIT: &str = "the target model's early-exit draft";

pub struct EarlyExit {
    exit_layer: usize,
    drafting: Autoregressive,
}

impl EarlyExit {
    /// `exit_layer` must leave at least one layer to the verifier: `1 ≤ exit_layer < num_layers`. The draft-length
    /// knobs come from `cfg`, the call's configuration (for early exit Transformers reads them from the main
    /// model's generation config); the confidence threshold does not adapt, as in Transformers.
    pub fn new(exit_layer: usize, num_layers: usize, cfg: &GenerationConfig, prompt_len: usize) -> Result<Self> {
        if exit_layer == 0 || exit_layer >= num_layers {
            return Err(Error::InvalidOption(format!(
                "`assistant_early_exit` must be between 1 and {} (the model has {num_layers} layers), but is \
                 {exit_layer}",
                num_layers.saturating_sub(1)
            )));
        }
        Ok(Self { exit_layer, drafting: Autoregressive::new(cfg, prompt_len, false, EARLY_EXIT)? })
    }

    pub fn num_assistant_tokens(&self) -> usize {
        self.drafting.length.num_assistant_tokens
    }
}

impl Drafter for EarlyExit {
    fn method(&self) -> &'static str {
        "early_exit"
    }

    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        if self.drafting.cap(max) == 0 {
            return Ok(Draft::default());
        }
        // Drop anything an earlier draft left past the verified cache; the context is drafted from there.
        let cached = target.cache_len();
        target.truncate(cached);
        let opts = ForwardOptions { exit_layer: Some(self.exit_layer), ..ForwardOptions::logits(LogitRows::Last(1)) };
        let vocab = target.config().vocab_size;
        self.drafting.draft(target, &opts, context, context[cached..].to_vec(), max, vocab)
    }

    /// Its first draft runs the prompt through the target's early layers, which a full forward then reuses.
    fn reads_target(&self) -> TargetReads {
        TargetReads::PREFILL
    }

    fn observe(&mut self, _: &[u32], proposed: usize, accepted: usize) -> Result<()> {
        // The verification forward already consumed or discarded the drafted positions.
        self.drafting.length.update(proposed, accepted);
        Ok(())
    }
}
