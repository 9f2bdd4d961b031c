//! Multi-token prediction (Transformers' `MTPCandidateGenerator` and `MtpModel`): the checkpoint's own MTP
//! layers draft one token each per round, from the target's last hidden states of the positions it just
//! accepted and the embeddings of the tokens one step ahead. The first round drafts nothing (the target's
//! prefill supplies the first hidden states).
//!
//! Layer `k` of a round sees the token ids shifted `k + 1` ahead of the target and rotates at their positions
//! plus `k`. With one layer its cache only ever holds accepted tokens. With more, the deeper layers' last
//! entries were computed from drafted tokens: when fewer than `layers − 1` drafts were accepted, every layer
//! drops its last `layers` entries and recomputes them from the kept target hidden states, as Transformers does.

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::generation::config::GenerationConfig;
use crate::generation::decode::check_finite;
use crate::generation::logits::LogitsProcessor;
use crate::generation::sampler::{argmax, softmax, Sampler};
use crate::kernels::logits::Logits;
use crate::models::mtp::MtpHead;
use crate::models::CausalLm;
use crate::speculation::drafter::{Draft, Drafter, TargetReads};
use crate::speculation::factory::{missing, DraftParts};
use crate::speculation::method::{Available, SpeculationMethod};
use crate::speculation::registry::{self, Method};

/// `mtp`: chosen by `use_mtp`; needs the target's MTP layers loaded.
pub(crate) const METHOD: Method = Method {
    name: "mtp",
    knobs: &[&[&registry::USE_MTP, &registry::COST_AWARE_DRAFTING]],
    chosen: |cfg, _| cfg.use_mtp,
    named: |own| {
        own.use_mtp = Some(true);
        Ok(())
    },
    resolve,
    build,
};

fn resolve(_: &GenerationConfig, models: &Available<'_>) -> Result<SpeculationMethod> {
    let target = &models.target;
    let num_mtp_layers = target.config.num_mtp_layers;
    if models.mtp {
        Ok(SpeculationMethod::Mtp)
    } else if num_mtp_layers > 0 {
        Err(Error::InvalidOption(format!(
            "`use_mtp`: {} declares {num_mtp_layers} MTP layer(s) (`num_nextn_predict_layers`) but holds no MTP \
             weights (`model.layers.{}.*`)",
            target.path.display(),
            target.config.num_hidden_layers
        )))
    } else {
        Err(Error::InvalidOption(
            "Could not find `num_mtp_layers` in the model config. This model probably has no associated mtp weights."
                .into(),
        ))
    }
}

fn build<'a>(
    method: SpeculationMethod,
    cfg: &GenerationConfig,
    prompt_len: usize,
    _target: &crate::models::ModelConfig,
    parts: DraftParts<'a>,
) -> Result<Box<dyn Drafter + 'a>> {
    let head = parts.mtp.ok_or_else(|| missing(method, "the target's MTP layers"))?;
    Ok(Box::new(MtpDrafter::new(head, cfg, prompt_len)?))
}

pub struct MtpDrafter<'m> {
    head: &'m mut dyn MtpHead,
    /// The target's processors: the drafts' `q` is the processed distribution they were drawn from.
    processor: LogitsProcessor,
    sampler: Sampler,
    /// The target's final hidden states of the positions it accepted last round, `[m, hidden]`.
    pending: Option<Tensor>,
    /// Every accepted target hidden state so far, `[positions, hidden]` (kept only with several layers).
    history: Option<Tensor>,
    first_round: bool,
    last_accepted: usize,
    /// Whether drafts carry their distributions: for speculative sampling, and for ensemble verification (5.24
    /// returns the MTP layers' processed logits in both modes).
    keep_q: bool,
}

impl<'m> MtpDrafter<'m> {
    /// `cfg` is the call's resolved configuration; `prompt_len` is for the minimum-length processor.
    pub fn new(head: &'m mut dyn MtpHead, cfg: &GenerationConfig, prompt_len: usize) -> Result<Self> {
        for k in 0..head.num_layers() {
            head.truncate(k, 0);
        }
        Ok(Self {
            head,
            processor: LogitsProcessor::new(cfg, prompt_len)?,
            // A stream of its own, so that drafting does not shift the verifier's random numbers.
            sampler: Sampler::for_drafter(cfg.seed),
            pending: None,
            history: None,
            first_round: true,
            last_accepted: 0,
            keep_q: cfg.do_sample || cfg.assistant_ensemble_weight.is_some(),
        })
    }
}

impl Drafter for MtpDrafter<'_> {
    fn method(&self) -> &'static str {
        "mtp"
    }

    fn reads_target(&self) -> TargetReads {
        TargetReads::HIDDEN_STATES
    }

    fn target_hidden(&mut self, hidden: &Tensor, accepted_rows: usize) -> Result<()> {
        self.pending = Some(hidden.narrow(0, 0, accepted_rows.min(hidden.dim(0)?))?);
        Ok(())
    }

    fn propose(&mut self, _: &mut dyn CausalLm, context: &[u32], _max: usize) -> Result<Draft> {
        // Like Transformers, draft a full block even past the length budget: the loop trims it.
        let Some(fresh) = self.pending.take() else { return Ok(Draft::default()) };
        let layers = self.head.num_layers();
        let m = fresh.dim(0)?;
        let len = context.len();
        if m == 0 || m > len {
            return Err(Error::InvalidOption(format!("MTP drafter got {m} hidden rows for {len} tokens")));
        }
        if layers > 1 {
            self.history = Some(match self.history.take() {
                Some(h) => Tensor::cat(&[h, fresh.clone()], 0)?,
                None => fresh.clone(),
            });
        }
        let (mut ids, mut hidden, first) = match &self.history {
            Some(history) if !self.first_round && self.last_accepted + 1 < layers => {
                let before = self.head.cache_len(0);
                let cut = layers.min(before);
                for k in 0..layers {
                    let l = self.head.cache_len(k);
                    self.head.truncate(k, l.saturating_sub(layers));
                }
                let s = m + cut;
                let rows = history.dim(0)?;
                (context[len - s..].to_vec(), history.narrow(0, rows - s, s)?, len - s)
            }
            _ => (context[len - m..].to_vec(), fresh, len - m),
        };
        self.first_round = false;
        let do_sample = self.processor.do_sample();
        let mut ctx = context.to_vec();
        let mut tokens = Vec::with_capacity(layers);
        let mut qs = Logits::default();
        for k in 0..layers {
            hidden = self.head.forward_layer(k, &ids, &hidden, first + k)?;
            let last = hidden.dim(0)? - 1;
            let mut logits = self.head.logits(&hidden.get(last)?)?;
            check_finite(&logits, "the target model's MTP layers", ctx.len() - 1)?;
            if !self.processor.is_noop(ctx.len()) {
                self.processor.process(&ctx, &mut logits);
            }
            let q = softmax(&logits);
            let token = if do_sample { self.sampler.sample(&q) } else { argmax(&logits) };
            tokens.push(token);
            if self.keep_q {
                qs.push(&q);
            }
            ctx.push(token);
            ids.remove(0);
            ids.push(token);
        }
        Ok(Draft { tokens, q: self.keep_q.then_some(qs), parents: None })
    }

    fn observe(&mut self, _context: &[u32], _proposed: usize, accepted: usize) -> Result<()> {
        self.last_accepted = accepted;
        Ok(())
    }
}
