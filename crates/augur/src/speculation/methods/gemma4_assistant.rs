//! The Gemma 4 assistant as a drafter (Transformers' `SinglePositionMultiTokenCandidateGenerator`, spec 11): no
//! draft in the first round (the target's prefill runs first); then, from the hidden state that produced the
//! newest token and that token's embedding in the target's table, the assistant drafts step after step at the
//! constant position of the newest token, attending to the target's shared KV and feeding its projected hidden
//! state back. It keeps no state of its own.
//!
//! Two deviations from Transformers 5.24, both defects there (spec 11.5):
//! - the shared KV is the target's cache cut to the accepted sequence (positions before the newest token), where
//!   5.24 slices `[:L]` and keeps keys and values of rejected drafts after a partial acceptance;
//! - with `do_sample` the drafts are sampled from the target's processors applied to the assistant's logits, and
//!   that exact distribution is returned as `q` (5.24 drafts the argmax but returns the softmax of the raw logits,
//!   so its speculative sampling is not lossless). Greedy drafting is unchanged: argmax of the raw logits, and
//!   with `assistant_ensemble_weight` their softmax is the `q` of ensemble verification, as in 5.24.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::generation::config::{GenerationConfig, GenerationOptions};
use crate::generation::decode::{check_finite, ASSISTANT};
use crate::generation::logits::LogitsProcessor;
use crate::generation::sampler::{argmax, softmax, Sampler};
use crate::kernels::logits::Logits;
use crate::models::gemma4_assistant::{Gemma4Assistant, SharedKv};
use crate::models::{self, CausalLm, LayerKind, LoadOptions, QuantizeOnLoad};
use crate::speculation::drafter::{Draft, Drafter, TargetReads};
use crate::speculation::factory::{AssistantParts, AssistantRef};
use crate::tokenizer::Tokenizer;

/// Gemma 4's assistant with what was read beside it, as its method loads it. It works in its target's
/// vocabulary and keeps no state, so a clone is another sequence's assistant.
#[derive(Clone)]
pub struct LoadedGemma4Assistant {
    pub path: PathBuf,
    /// Read-only while drafting, so forks share it.
    pub model: Arc<Gemma4Assistant>,
    pub tokenizer: Arc<Tokenizer>,
    /// Its `generation_config.json`, if any.
    pub defaults: GenerationOptions,
}

impl LoadedGemma4Assistant {
    /// The assistant at `path` where that is a Gemma 4 assistant's Hugging Face directory, else `None`. It is
    /// never quantized at load (`opts.quantize` is an error); a directory without a tokenizer takes `shared`
    /// (the target's).
    pub fn load_if_at(path: &Path, opts: &LoadOptions, shared: &Arc<Tokenizer>) -> Result<Option<Self>> {
        if !models::is_gemma4_assistant(path)? {
            return Ok(None);
        }
        Self::refuse_quantize(path, opts.quantize)?;
        let model = Arc::new(models::load_gemma4_assistant(path, &Device::Cpu)?);
        let gc = path.join("generation_config.json");
        let defaults = if gc.exists() { GenerationOptions::from_json_file(&gc)? } else { GenerationOptions::default() };
        let tokenizer = Self::own_tokenizer(path)?.map_or_else(|| shared.clone(), Arc::new);
        Ok(Some(Self { path: path.to_path_buf(), model, tokenizer, defaults }))
    }

    /// The error for quantizing the assistant at `path` on load, which is never done.
    pub fn refuse_quantize(path: &Path, quantize: Option<QuantizeOnLoad>) -> Result<()> {
        match quantize {
            Some(q) => Err(Error::InvalidOption(format!(
                "{}: Gemma 4's assistant is not quantized at load ({} asked for)",
                path.display(),
                q.name()
            ))),
            None => Ok(()),
        }
    }

    /// The tokenizer stored with the assistant at `path`, if any (without one it works in its target's).
    pub fn own_tokenizer(path: &Path) -> Result<Option<Tokenizer>> {
        path.join("tokenizer.json").exists().then(|| Tokenizer::from_hf_dir(path)).transpose()
    }

    /// What its drafter borrows for a call whose assistant configuration is `config`.
    pub fn parts(&self, config: GenerationConfig) -> AssistantParts<'_> {
        AssistantParts {
            config,
            model: AssistantRef::Gemma4(&self.model),
            tokenizer: &self.tokenizer,
            defaults: &self.defaults,
        }
    }
}

pub struct Gemma4AssistantDrafter<'m> {
    model: &'m Gemma4Assistant,
    /// The target's processors (sampling only).
    processor: LogitsProcessor,
    sampler: Sampler,
    num_assistant_tokens: usize,
    /// The target's sliding window: its sliding store layer hands Transformers' assistant the last `W − 1` cached
    /// positions plus the block it just verified.
    target_window: Option<usize>,
    /// The assistant's own window: its bidirectional sliding mask lets a query see `W + 1` positions.
    window: Option<usize>,
    /// The target's final hidden states of its last forward, `[rows, hidden]`, and how many of those rows were
    /// accepted into its cache (the rest belong to rejected drafts). `None` before the first forward.
    hidden: Option<(Tensor, usize)>,
    /// Whether greedy drafts carry the softmax of the raw logits (ensemble verification needs a `q`).
    greedy_q: bool,
}

impl<'m> Gemma4AssistantDrafter<'m> {
    /// `cfg` is the call's resolved configuration (sampling options, seed, `num_assistant_tokens`);
    /// `target_window` the target's `sliding_window`.
    pub fn new(
        model: &'m Gemma4Assistant,
        cfg: &GenerationConfig,
        prompt_len: usize,
        target_window: Option<usize>,
    ) -> Result<Self> {
        Ok(Self {
            window: model.config().sliding_window,
            model,
            processor: LogitsProcessor::new(cfg, prompt_len)?,
            sampler: Sampler::for_drafter(cfg.seed),
            num_assistant_tokens: cfg.effective_num_assistant_tokens(),
            target_window,
            hidden: None,
            greedy_q: cfg.assistant_ensemble_weight.is_some(),
        })
    }
}

impl Drafter for Gemma4AssistantDrafter<'_> {
    fn method(&self) -> &'static str {
        "gemma4_assistant"
    }

    fn reads_target(&self) -> TargetReads {
        TargetReads::HIDDEN_STATES
    }

    fn target_hidden(&mut self, hidden: &Tensor, accepted_rows: usize) -> Result<()> {
        self.hidden = Some((hidden.clone(), accepted_rows));
        Ok(())
    }

    fn propose(&mut self, target: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        let max = max.min(self.num_assistant_tokens);
        let Some((hidden, kept)) = self.hidden.as_ref() else { return Ok(Draft::default()) };
        if max == 0 || context.len() < 2 || *kept == 0 || *kept > context.len() - 1 {
            return Ok(Draft::default());
        }
        // `p`: position of the newest token, the first not in the target's cache; the hidden rows start at
        // `hidden_start`.
        let p = context.len() - 1;
        let hidden_start = p - kept;
        let target = &*target;
        if target.cache_len() != p {
            return Err(Error::InvalidOption(format!(
                "the Gemma 4 assistant needs the target's cache at {p} positions, it holds {}",
                target.cache_len()
            )));
        }
        let rows = hidden.dim(0)?;
        if p == 0 || p - 1 < hidden_start || p - 1 - hidden_start >= rows {
            return Err(Error::InvalidOption("the target's hidden states do not cover the newest token".into()));
        }
        let hb = self.model.backbone_hidden_size;
        if hidden.dim(1)? != hb {
            return Err(Error::InvalidOption(format!(
                "the assistant was built for a target hidden size of {hb}, the target's is {}",
                hidden.dim(1)?
            )));
        }
        let shared = target.kv_sharing();
        let kv = |kind| shared.as_ref().and_then(|s| s.shared_kv(kind));
        let (full, sliding) = match (kv(LayerKind::Full), kv(LayerKind::Sliding)) {
            (Some(f), Some(s)) => (f, s),
            _ => {
                return Err(Error::InvalidOption(
                    "the Gemma 4 assistant needs a Gemma 4 target with both sliding and global layers".into(),
                ))
            }
        };
        // Positions the assistant sees, as in Transformers without its stale-KV defect: every accepted global
        // position; of the sliding ones, the last `min(W_assistant + 1, W_target − 1 + kept)`, `kept` being the
        // rows of the last target forward that were accepted into the cache.
        let mut n_sliding = p;
        if let Some(w) = self.window {
            n_sliding = n_sliding.min(w + 1);
        }
        if let Some(w) = self.target_window {
            n_sliding = n_sliding.min(w - 1 + kept);
        }
        let full = SharedKv { cache: full, visible: (0, p) };
        let sliding = SharedKv { cache: sliding, visible: (p - n_sliding, p) };

        let do_sample = self.processor.do_sample();
        let mut h = hidden.narrow(0, p - 1 - hidden_start, 1)?; // [1, hb]
        let mut token = context[p];
        let mut ctx = context.to_vec();
        let mut tokens = Vec::with_capacity(max);
        let mut qs = Logits::default();
        for _ in 0..max {
            let e = shared.as_ref().expect("checked above").embed_tokens(&[token])?; // [1, hb]
            let input = Tensor::cat(&[&e, &h], 1)?.unsqueeze(0)?; // [1, 1, 2·hb]
            let (mut logits, next_h) = self.model.step(&input, p, &full, &sliding)?;
            check_finite(&logits, ASSISTANT, ctx.len() - 1)?;
            token = if do_sample {
                if !self.processor.is_noop(ctx.len()) {
                    self.processor.process(&ctx, &mut logits);
                }
                let q = softmax(&logits);
                let t = self.sampler.sample(&q);
                qs.push(&q);
                t
            } else {
                if self.greedy_q {
                    qs.push(&softmax(&logits));
                }
                argmax(&logits)
            };
            tokens.push(token);
            ctx.push(token);
            h = next_h;
        }
        Ok(Draft { tokens, q: (do_sample || self.greedy_q).then_some(qs), parents: None })
    }

    fn observe(&mut self, _context: &[u32], _proposed: usize, _accepted: usize) -> Result<()> {
        // Nothing to roll back: every step reads the target's state afresh.
        Ok(())
    }
}
