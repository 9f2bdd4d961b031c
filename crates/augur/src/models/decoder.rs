//! The decoder every architecture shares: embeddings → blocks → final norm → LM head, with the one logits
//! tail. [`Decoder`] holds the weights; a [`DecoderSequence`] holds one sequence's caches, and
//! [`super::batching::Batched`] runs sequences over one decoder.

use candle_core::{DType, Device, Tensor};

use super::batching::{BatchModel, Batched, Job};
use super::{ForwardOptions, ForwardOutput, HeadSubset, LogitRows};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::io::weights::Weights;
use std::sync::{Arc, Mutex};

use crate::nn::{flat, Embedding, KvCache, Linear, RmsNorm, Ropes, Step, StoredTable, TreeMask};

/// One decoder layer of an architecture: weights only, shared by every sequence of the loaded model.
pub trait Block: Send + Sync + 'static {
    /// `x`: `[1, rows, hidden]`, the rows of the sequences in `steps` one after the other → `[1, rows, hidden]`,
    /// appending to each sequence's cache for this layer (`caches[i]` for `steps[i]`).
    fn forward(&self, x: &Tensor, steps: &[Step], ropes: &Ropes, caches: &mut [&mut KvCache]) -> Result<Tensor>;
    /// An empty cache of the shape this layer's attention keeps, for a new sequence.
    fn new_cache(&self) -> KvCache;
}

/// The final norm, the LM head and the soft-cap: the logits tail of every architecture.
#[derive(Clone)]
pub struct LogitsHead {
    pub norm: RmsNorm,
    pub lm_head: Linear,
    pub final_logit_softcapping: Option<f64>,
    /// The LM head's rows where its GGUF file keeps them, read for [`Self::part`].
    stored: Option<Arc<StoredTable>>,
    /// Parts of the head gathered for a drafter and kept for its next calls: at most [`KEPT_PARTS`].
    kept: Arc<Mutex<Vec<KeptPart>>>,
}

/// A kept head part: its ids and its rows.
type KeptPart = (Vec<u32>, Arc<Linear>);

/// Kept head parts: a drafter's set, and one more (another draft vocabulary size) before the oldest goes.
const KEPT_PARTS: usize = 2;

impl LogitsHead {
    /// Loads `norm_name` and `lm_head` (or the embedding table, when tied).
    pub fn load(cfg: &ModelConfig, w: &Weights, embed: &Embedding, norm_name: &str, plus_one: bool) -> Result<Self> {
        let (lm_head, stored) = if cfg.tie_word_embeddings {
            let stored = match embed {
                Embedding::Stored(table) => Some(Arc::clone(table)),
                _ => None,
            };
            (embed.as_linear(w)?, stored)
        } else {
            let head = w.linear("lm_head", cfg.vocab_size, cfg.hidden_size, false)?;
            (head, w.stored_table("lm_head.weight", cfg.vocab_size, cfg.hidden_size)?.map(Arc::new))
        };
        let norm = RmsNorm::load(w, norm_name, cfg.hidden_size, cfg.rms_norm_eps, plus_one)?;
        let final_logit_softcapping = cfg.final_logit_softcapping;
        Ok(Self { norm, lm_head, final_logit_softcapping, stored, kept: Arc::default() })
    }

    /// The head's rows `ids` as a layer of their own ([`crate::models::CausalLm::head_part`]).
    pub fn part(&self, ids: &[u32], keep: bool) -> Result<Option<Arc<Linear>>> {
        let mut kept = self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, part)) = kept.iter().find(|(k, _)| k.as_slice() == ids) {
            return Ok(Some(Arc::clone(part)));
        }
        let Some(part) = self.lm_head.gather(ids, self.stored.as_deref())?.map(Arc::new) else { return Ok(None) };
        if keep {
            if kept.len() == KEPT_PARTS {
                kept.remove(0);
            }
            kept.push((ids.to_vec(), Arc::clone(&part)));
        }
        Ok(Some(part))
    }

    /// The rows of `x` (`[t, hidden]`) that `rows` asks logits for.
    pub fn pick(x: &Tensor, rows: &LogitRows) -> Result<Option<Tensor>> {
        let t = x.dim(0)?;
        Ok(match rows {
            LogitRows::All => Some(x.clone()),
            LogitRows::Last(n) => {
                let n = (*n).clamp(1, t);
                Some(x.narrow(0, t - n, n)?)
            }
            LogitRows::None => None,
        })
    }

    /// `[rows, hidden]` (before the final norm) → `[rows, vocab]` f32 logits, or `[rows, subset.ids.len()]`
    /// over a subset of the vocabulary.
    pub fn logits(&self, rows: &Tensor, subset: Option<&HeadSubset>) -> Result<Tensor> {
        let x = self.norm.forward(rows)?;
        let mut l = match subset {
            None => self.lm_head.forward(&x)?,
            Some(s) => {
                let parts = s.parts.iter().map(|p| p.forward(&x)).collect::<Result<Vec<_>>>()?;
                Tensor::cat(&parts, candle_core::D::Minus1)?
            }
        };
        if let Some(cap) = self.final_logit_softcapping {
            l = ((l / cap)?.tanh()? * cap)?;
        }
        Ok(l.to_dtype(DType::F32)?)
    }

    /// One sequence's outputs from its last hidden states `x` (`[t, hidden]`).
    pub fn outputs(&self, x: &Tensor, opts: &ForwardOptions) -> Result<ForwardOutput> {
        let hidden = if opts.hidden_states { Some(self.norm.forward(x)?) } else { None };
        let logits = Self::pick(x, &opts.logits)?.map(|r| self.logits(&r, opts.head.as_deref())).transpose()?;
        Ok(ForwardOutput { logits, hidden })
    }
}

/// A decoder's shared weights: embeddings, blocks, the logits tail and the rotary tables.
pub struct Decoder<B: Block> {
    pub cfg: ModelConfig,
    pub embed: Embedding,
    /// Gemma multiplies embeddings by `sqrt(hidden_size)`.
    pub embed_scale: Option<f64>,
    pub layers: Vec<B>,
    pub head: LogitsHead,
    pub ropes: Ropes,
    pub device: Device,
}

/// One sequence of a [`Decoder`]: a cache per layer and the positions every layer holds.
pub struct DecoderSequence {
    caches: Vec<KvCache>,
    len: usize,
    early: EarlyPositions,
}

/// Positions past `len` that only the first `layers` layers have cached, written by early-exit drafting: their
/// token ids and the f32 hidden states leaving layer `layers`, `[n, hidden]` row-major. A full forward whose
/// tokens begin with these ids starts the remaining layers from the stored states instead of recomputing the
/// first ones: the same computation, equal to the last bit (every kernel gives a row the same numbers in any
/// block).
#[derive(Default)]
struct EarlyPositions {
    layers: usize,
    tokens: Vec<u32>,
    hidden: Vec<f32>,
}

impl<B: Block> Decoder<B> {
    pub fn new(
        cfg: ModelConfig,
        w: &Weights,
        layers: Vec<B>,
        embed_scale: Option<f64>,
        norm_plus_one: bool,
    ) -> Result<Self> {
        let embed = w.embedding("model.embed_tokens.weight", cfg.vocab_size, cfg.hidden_size)?;
        let head = LogitsHead::load(&cfg, w, &embed, "model.norm.weight", norm_plus_one)?;
        let ropes = Ropes::new(&cfg)?;
        let device = w.device().clone();
        Ok(Self { embed, embed_scale, layers, head, ropes, device, cfg })
    }

    /// This decoder as a model of one sequence, which forks into more.
    pub fn into_lm(self) -> Batched<Self> {
        Batched::new(self)
    }

    /// `[1, t, hidden]` input embeddings of `tokens`.
    fn embed_tokens(&self, tokens: &[u32]) -> Result<Tensor> {
        let ids = Tensor::new(tokens, &self.device)?;
        let x = self.embed.forward(&ids)?.unsqueeze(0)?;
        Ok(match self.embed_scale {
            Some(s) => (x * s)?,
            None => x,
        })
    }

    /// The step of a block of `len` rows at cache position `start`, causal or shaped as `tree`.
    fn step(&self, start: usize, len: usize, tree: Option<&Arc<TreeMask>>) -> Result<Step> {
        let (rope_full, rope_sliding) = match tree {
            None => (
                self.ropes.full.cos_sin(start, len, &self.device)?,
                self.ropes.sliding.cos_sin(start, len, &self.device)?,
            ),
            Some(t) => {
                let at = || (0..len).map(|row| start - t.cached() + t.depth(row));
                (self.ropes.full.cos_sin_at(at(), &self.device)?, self.ropes.sliding.cos_sin_at(at(), &self.device)?)
            }
        };
        Ok(Step { start, len, rope_full, rope_sliding, tree: tree.cloned() })
    }

    /// Runs `layers` on `x` (`[1, t, hidden]`, one sequence) at cache positions `start..start+t`.
    fn run_layers(
        &self,
        caches: &mut [KvCache],
        mut x: Tensor,
        layers: std::ops::Range<usize>,
        start: usize,
        tree: Option<&Arc<TreeMask>>,
    ) -> Result<Tensor> {
        let steps = [self.step(start, x.dim(1)?, tree)?];
        for i in layers {
            x = self.layers[i].forward(&x, &steps, &self.ropes, &mut [&mut caches[i]])?;
        }
        Ok(x)
    }

    /// Every linear layer, norm and the LM head over the rows of all `jobs`, attention per sequence.
    fn forward_rows(&self, jobs: &mut [Job<DecoderSequence>]) -> Result<Vec<ForwardOutput>> {
        let ids: Vec<u32> = jobs.iter().flat_map(|j| j.tokens.iter().copied()).collect();
        let mut x = self.embed_tokens(&ids)?; // [1, rows, hidden]
        let steps = jobs
            .iter()
            .map(|j| self.step(j.seq.len, j.tokens.len(), j.opts.tree.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        for (i, layer) in self.layers.iter().enumerate() {
            let mut caches: Vec<&mut KvCache> = jobs.iter_mut().map(|j| &mut j.seq.caches[i]).collect();
            x = layer.forward(&x, &steps, &self.ropes, &mut caches)?;
        }
        let x = x.squeeze(0)?; // [rows, hidden]
        let mut outputs = Vec::with_capacity(jobs.len());
        let mut picked_rows = Vec::with_capacity(jobs.len());
        let mut offset = 0;
        for (job, step) in jobs.iter_mut().zip(&steps) {
            let xs = x.narrow(0, offset, step.len)?;
            offset += step.len;
            job.seq.len = step.start + step.len;
            let picked = LogitsHead::pick(&xs, &job.opts.logits)?;
            let hidden = if job.opts.hidden_states { Some(self.head.norm.forward(&xs)?) } else { None };
            outputs.push((picked.as_ref().map(|p| p.dim(0)).transpose()?, hidden));
            picked_rows.push(picked);
        }
        // One LM-head product over the logit rows of every sequence when all ask for the same head (the whole
        // one, or one drafter's subset); else one product per sequence.
        let first = jobs.first().and_then(|j| j.opts.head.clone());
        let same = |h: &Option<Arc<HeadSubset>>| match (h, &first) {
            (None, None) => true,
            (Some(h), Some(f)) => Arc::ptr_eq(h, f),
            _ => false,
        };
        if !jobs.iter().all(|j| same(&j.opts.head)) {
            return outputs
                .into_iter()
                .zip(picked_rows)
                .zip(jobs.iter())
                .map(|(((_, hidden), rows), job)| {
                    let logits = rows.map(|r| self.head.logits(&r, job.opts.head.as_deref())).transpose()?;
                    Ok(ForwardOutput { logits, hidden })
                })
                .collect();
        }
        let mut logit_rows: Vec<Tensor> = picked_rows.into_iter().flatten().collect();
        let logits = match logit_rows.len() {
            0 => None,
            1 => logit_rows.pop(),
            _ => Some(Tensor::cat(&logit_rows, 0)?),
        }
        .map(|r| self.head.logits(&r, first.as_deref()))
        .transpose()?;
        let mut offset = 0;
        outputs
            .into_iter()
            .map(|(rows, hidden)| {
                let logits = match (rows, logits.as_ref()) {
                    (Some(n), Some(l)) => {
                        offset += n;
                        Some(l.narrow(0, offset - n, n)?)
                    }
                    _ => None,
                };
                Ok(ForwardOutput { logits, hidden })
            })
            .collect()
    }

    /// A forward that is not batched with other sequences: early-exit drafting, or a full forward that reuses
    /// what drafting computed.
    fn forward_alone(&self, seq: &mut DecoderSequence, tokens: &[u32], opts: &ForwardOptions) -> Result<ForwardOutput> {
        let (t, n) = (tokens.len(), self.layers.len());
        if let Some(exit) = opts.exit_layer {
            if exit != seq.early.layers {
                let len = seq.len;
                self.truncate(seq, len);
                seq.early.layers = exit;
            }
        }
        let x = match opts.exit_layer {
            Some(exit) => {
                // Drafting: the first `exit` layers only, after the positions they already hold.
                let start = seq.len + seq.early.tokens.len();
                let x = self.run_layers(&mut seq.caches, self.embed_tokens(tokens)?, 0..exit, start, None)?;
                seq.early.tokens.extend_from_slice(tokens);
                seq.early.hidden.extend(flat(&x)?);
                x
            }
            None => {
                let start = seq.len;
                // Reuse what drafting computed for the leading tokens, and forget the rest of it (all of it
                // under a tree block, whose rows are not a sequence).
                let reused = match opts.tree {
                    Some(_) => 0,
                    None => seq.early.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count(),
                };
                self.truncate(seq, start + reused);
                let x = if reused == 0 {
                    self.run_layers(&mut seq.caches, self.embed_tokens(tokens)?, 0..n, start, opts.tree.as_ref())?
                } else {
                    let exit = seq.early.layers;
                    let hidden = seq.early.hidden.split_off(0);
                    let mut x = Tensor::from_vec(hidden, (1, reused, self.cfg.hidden_size), &self.device)?;
                    if reused < t {
                        let rest = self.embed_tokens(&tokens[reused..])?;
                        let rest = self.run_layers(&mut seq.caches, rest, 0..exit, start + reused, None)?;
                        x = Tensor::cat(&[&x, &rest], 1)?;
                    }
                    self.run_layers(&mut seq.caches, x, exit..n, start, None)?
                };
                seq.early.tokens.clear();
                seq.len = start + t;
                x
            }
        };
        self.head.outputs(&x.squeeze(0)?, opts)
    }
}

impl<B: Block> BatchModel for Decoder<B> {
    type Sequence = DecoderSequence;

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn new_sequence(&self) -> DecoderSequence {
        DecoderSequence {
            caches: self.layers.iter().map(Block::new_cache).collect(),
            len: 0,
            early: EarlyPositions::default(),
        }
    }

    fn cache_len(&self, seq: &DecoderSequence) -> usize {
        seq.len
    }

    fn truncate(&self, seq: &mut DecoderSequence, len: usize) {
        seq.len = seq.len.min(len);
        for c in seq.caches.iter_mut() {
            c.truncate(len);
        }
        let keep = len - seq.len;
        seq.early.tokens.truncate(keep);
        seq.early.hidden.truncate(keep * self.cfg.hidden_size);
    }

    fn check(&self, seq: &DecoderSequence, tokens: &[u32], opts: &ForwardOptions) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::InvalidOption("forward called with no tokens".into()));
        }
        let vocab = self.cfg.vocab_size as u32;
        if let Some(bad) = tokens.iter().find(|&&id| id >= vocab) {
            return Err(Error::InvalidOption(format!("token id {bad} is outside the model's vocabulary of {vocab}")));
        }
        let n = self.layers.len();
        if let Some(tree) = &opts.tree {
            if tree.len() != tokens.len() || tree.cached() > seq.len || opts.exit_layer.is_some() {
                return Err(Error::InvalidOption(format!(
                    "a tree of {} rows over a forward of {} tokens{}",
                    tree.len(),
                    tokens.len(),
                    if opts.exit_layer.is_some() { " that exits early" } else { "" }
                )));
            }
        }
        if let Some(exit) = opts.exit_layer {
            if exit == 0 || exit >= n {
                return Err(Error::InvalidOption(format!(
                    "exit layer {exit} is outside 1..={} (the model has {n} layers)",
                    n - 1
                )));
            }
        }
        // Early positions of another exit layer are dropped before drafting, so they do not count then.
        let early = match opts.exit_layer {
            Some(exit) if exit == seq.early.layers => seq.early.tokens.len(),
            _ => 0,
        };
        let end = seq.len + tokens.len() + early;
        if end > self.cfg.max_position_embeddings {
            return Err(Error::PromptTooLong { prompt_tokens: end, context: self.cfg.max_position_embeddings });
        }
        Ok(())
    }

    fn supports_tree(&self) -> bool {
        true
    }

    fn keep_path(&self, seq: &mut DecoderSequence, start: usize, keep: &[usize]) -> Result<()> {
        let increasing = keep.windows(2).all(|w| w[0] < w[1]);
        if !increasing || keep.last().is_some_and(|&k| start + k >= seq.len) || !seq.early.tokens.is_empty() {
            return Err(Error::InvalidOption(format!(
                "cannot keep block rows {keep:?} from position {start} of a sequence of {}",
                seq.len
            )));
        }
        for c in seq.caches.iter_mut() {
            c.keep_path(start, keep);
        }
        seq.len = seq.len.min(start + keep.len());
        Ok(())
    }

    fn batchable(&self, seq: &DecoderSequence, opts: &ForwardOptions) -> bool {
        opts.exit_layer.is_none() && seq.early.tokens.is_empty()
    }

    fn forward(&self, seq: &mut DecoderSequence, tokens: &[u32], opts: &ForwardOptions) -> Result<ForwardOutput> {
        self.forward_alone(seq, tokens, opts)
    }

    fn forward_batch(&self, jobs: &mut [Job<DecoderSequence>]) -> Result<Vec<ForwardOutput>> {
        crate::kernels::parallel::on_pool(|| self.forward_rows(jobs))
    }

    fn head_part(&self, ids: &[u32], keep: bool) -> Result<Option<Arc<Linear>>> {
        self.head.part(ids, keep)
    }
}
