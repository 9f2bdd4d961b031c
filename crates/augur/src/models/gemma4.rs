//! Gemma 4 (text), as Transformers 5.24 implements it (`Gemma4TextModel`): sliding-window and global layers with
//! their own head sizes and rotary tables (proportional RoPE on global layers), q/k/v RMS norms and an attention
//! scale of 1, keys reused as values on global layers (`attention_k_eq_v`), per-layer inputs (PLE), the last
//! `num_kv_shared_layers` layers reusing the KV of the last earlier layer of their type (and a wider MLP there with
//! `use_double_wide_mlp`), a learned scalar per layer, tied embeddings scaled by `sqrt(hidden)` and final-logit
//! soft-capping. Mixture-of-experts layers (`enable_moe_block`) are not implemented and rejected at load.
//!
//! The KV that a store layer keeps is also what the Gemma 4 assistant reads ([`KvSharing::shared_kv`]).

use candle_core::{DType, Device, Tensor};

use super::batching::{BatchModel, Job};
use super::decoder::LogitsHead;
use super::{ForwardOptions, ForwardOutput, KvSharing, LogitRows};
use crate::config::{at_most, Gemma4Config, LayerKind, ModelConfig, RopeLayout, MAX_VOCAB, MAX_WIDTH};
use crate::error::{Error, Result};
use crate::io::weights::Weights;
use crate::kernels::attention::{attend, AttendShape, Causal};
use crate::nn::{flat, Embedding, KvCache, Linear, Mlp, RmsNorm, Rope};

impl Gemma4Config {
    /// The Gemma 4 settings of `cfg`, refused where they ask for what is not implemented or too large.
    pub fn from_model_config(cfg: &ModelConfig) -> Result<Self> {
        let g = cfg.gemma4.clone().ok_or_else(|| {
            Error::config("gemma4", "Gemma 4 is read from a Hugging Face config.json (GGUF is not supported yet)")
        })?;
        if g.enable_moe_block {
            return Err(Error::config("enable_moe_block", "Gemma 4 mixture-of-experts layers are not supported yet"));
        }
        if g.use_bidirectional_attention.as_deref() == Some("all") {
            return Err(Error::config(
                "use_bidirectional_attention",
                "`all` (a bidirectional encoder) is not supported",
            ));
        }
        if g.num_kv_shared_layers > cfg.num_hidden_layers {
            return Err(Error::config("num_kv_shared_layers", "exceeds num_hidden_layers"));
        }
        // Rotary tables and projections are sized from these before any weight is read.
        let (head_dim, kv_heads) = g.head_shape(cfg, LayerKind::Full);
        at_most(head_dim, MAX_WIDTH, "global_head_dim")?;
        at_most(kv_heads, MAX_WIDTH, "num_global_key_value_heads")?;
        at_most(g.hidden_size_per_layer_input, MAX_WIDTH, "hidden_size_per_layer_input")?;
        at_most(g.vocab_size_per_layer_input, MAX_VOCAB, "vocab_size_per_layer_input")?;
        Ok(g)
    }

    /// `(head_dim, num_key_value_heads)` of a layer type.
    pub fn head_shape(&self, cfg: &ModelConfig, kind: LayerKind) -> (usize, usize) {
        match kind {
            LayerKind::Sliding => (cfg.head_dim, cfg.num_key_value_heads),
            LayerKind::Full => (self.global_head_dim, self.num_global_key_value_heads),
        }
    }

    /// The rotary table of a layer type: `default` or `proportional` (rotates the first `partial_rotary_factor`
    /// of the frequencies, computed over the whole head, and leaves the rest unrotated).
    pub fn rope(&self, cfg: &ModelConfig, kind: LayerKind) -> Result<Rope> {
        let (key, p) = match kind {
            LayerKind::Full => ("full_attention", self.full_rope.as_ref()),
            LayerKind::Sliding => ("sliding_attention", self.sliding_rope.as_ref()),
        };
        let field = format!("rope_parameters.{key}");
        let (default_type, default_theta, default_partial) = match kind {
            LayerKind::Full => ("proportional", 1_000_000.0, 0.25),
            LayerKind::Sliding => ("default", 10_000.0, 1.0),
        };
        let rope_type = p.and_then(|p| p.rope_type.as_deref()).unwrap_or(default_type);
        let theta = p.and_then(|p| p.rope_theta).unwrap_or(default_theta);
        let (head_dim, _) = self.head_shape(cfg, kind);
        let inv = |i: usize| (1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)) as f32;
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = match rope_type {
            "default" => (0..half).map(inv).collect(),
            "proportional" => {
                let partial = p.and_then(|p| p.partial_rotary_factor);
                let partial = partial.unwrap_or(if p.is_some() { 1.0 } else { default_partial });
                if !(partial > 0.0 && partial <= 1.0) {
                    let field = format!("{field}.partial_rotary_factor");
                    return Err(Error::config(field, format!("must be in (0, 1], not {partial}")));
                }
                let factor = p.and_then(|p| p.factor).unwrap_or(1.0) as f32;
                let rotated = ((partial * head_dim as f64) as usize / 2).min(half);
                (0..half).map(|i| if i < rotated { inv(i) / factor } else { 0.0 }).collect()
            }
            other => return Err(Error::config(field, format!("unsupported rope type `{other}`"))),
        };
        Ok(Rope::from_inv_freq(inv_freq, RopeLayout::Halves))
    }

    /// Per layer: `None` for a layer with its own KV, `Some(j)` for one that reuses layer `j`'s (Transformers'
    /// `kv_sharing_modes`: layers from `n − num_kv_shared_layers` on reuse the last earlier layer of their type).
    pub fn kv_sources(&self, cfg: &ModelConfig) -> Result<Vec<Option<usize>>> {
        let n = cfg.num_hidden_layers;
        let first_shared = n - self.num_kv_shared_layers;
        (0..n)
            .map(|i| {
                if i < first_shared {
                    return Ok(None);
                }
                let kind = cfg.layer_types[i];
                (0..first_shared).rev().find(|&j| cfg.layer_types[j] == kind).map(Some).ok_or_else(|| {
                    Error::config(
                        "num_kv_shared_layers",
                        format!("layer {i} reuses KV but no earlier layer has its type"),
                    )
                })
            })
            .collect()
    }
}

/// RMS norm without a weight (Gemma 4's value norm).
fn rms_unit(x: &Tensor, eps: f32) -> Result<Tensor> {
    let d = x.dim(candle_core::D::Minus1)?;
    let ones = Tensor::ones(d, DType::F32, x.device())?;
    Ok(candle_nn::ops::rms_norm(&x.contiguous()?, &ones, eps)?)
}

/// A layer's own key/value projections (absent on layers that reuse another layer's KV).
struct KvProj {
    k_proj: Linear,
    /// `None` with `attention_k_eq_v` on global layers: the values are the raw keys.
    v_proj: Option<Linear>,
    k_norm: RmsNorm,
}

/// The per-layer-input gate of a layer (PLE).
struct PerLayerInput {
    gate: Linear,
    projection: Linear,
    norm: RmsNorm,
}

/// One decoder layer. Its queries attend to the cache `cache` of [`Gemma4::caches`], its own or a store
/// layer's.
pub(crate) struct Layer {
    pub kind: LayerKind,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    pub q_proj: Linear,
    pub q_norm: RmsNorm,
    kv: Option<KvProj>,
    pub o_proj: Linear,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub window: Option<usize>,
    cache: usize,
    mlp: Mlp,
    ple: Option<PerLayerInput>,
    scalar: f64,
    eps: f32,
}

/// Positions and rotary tables of one forward's rows.
pub(crate) struct Rows<'a> {
    /// Position of the first row.
    pub start: usize,
    /// `(cos, sin)` per layer kind, `[rows, head_dim / 2]`.
    pub full: &'a (Tensor, Tensor),
    pub sliding: &'a (Tensor, Tensor),
}

impl Layer {
    /// `prefix` is `model.layers.{i}` (or the multimodal checkpoint's equivalent); `cache` the index of the cache
    /// its queries read; `own_kv` whether it computes and appends its keys and values.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        w: &Weights,
        prefix: &str,
        cfg: &ModelConfig,
        g: &Gemma4Config,
        kind: LayerKind,
        cache: usize,
        own_kv: bool,
        double_wide: bool,
    ) -> Result<Self> {
        let hs = cfg.hidden_size;
        let (d, kv) = g.head_shape(cfg, kind);
        let h = cfg.num_attention_heads;
        let bias = cfg.attention_bias;
        let eps = cfg.rms_norm_eps;
        let norm = |n: &str, dim: usize| RmsNorm::load(w, &format!("{prefix}.{n}.weight"), dim, eps, false);
        let a = format!("{prefix}.self_attn");
        let kv_proj = if own_kv {
            Some(KvProj {
                k_proj: w.linear(&format!("{a}.k_proj"), kv * d, hs, bias)?,
                v_proj: if g.attention_k_eq_v && kind == LayerKind::Full {
                    None
                } else {
                    Some(w.linear(&format!("{a}.v_proj"), kv * d, hs, bias)?)
                },
                k_norm: norm("self_attn.k_norm", d)?,
            })
        } else {
            None
        };
        let mut mlp_cfg = cfg.clone();
        if double_wide {
            mlp_cfg.intermediate_size *= 2;
        }
        let ple = if g.hidden_size_per_layer_input > 0 {
            let p = g.hidden_size_per_layer_input;
            Some(PerLayerInput {
                gate: w.linear(&format!("{prefix}.per_layer_input_gate"), p, hs, false)?,
                projection: w.linear(&format!("{prefix}.per_layer_projection"), hs, p, false)?,
                norm: norm("post_per_layer_input_norm", hs)?,
            })
        } else {
            None
        };
        let scalar_name = format!("{prefix}.layer_scalar");
        let scalar =
            if w.contains(&scalar_name) { w.f32(&scalar_name, &[1])?.to_vec1::<f32>()?[0] as f64 } else { 1.0 };
        Ok(Self {
            kind,
            input_layernorm: norm("input_layernorm", hs)?,
            post_attention_layernorm: norm("post_attention_layernorm", hs)?,
            pre_feedforward_layernorm: norm("pre_feedforward_layernorm", hs)?,
            post_feedforward_layernorm: norm("post_feedforward_layernorm", hs)?,
            q_proj: w.linear(&format!("{a}.q_proj"), h * d, hs, bias)?,
            q_norm: norm("self_attn.q_norm", d)?,
            kv: kv_proj,
            o_proj: w.linear(&format!("{a}.o_proj"), hs, h * d, bias)?,
            n_heads: h,
            n_kv_heads: kv,
            head_dim: d,
            window: match kind {
                LayerKind::Sliding => cfg.sliding_window,
                LayerKind::Full => None,
            },
            cache,
            mlp: Mlp::load(w, &format!("{prefix}.mlp"), &mlp_cfg)?,
            ple,
            scalar,
            eps: eps as f32,
        })
    }

    /// Roped queries of `x` (`[1, t, hidden]`, already normed) → `[1, heads, t, head_dim]`.
    pub fn queries(&self, x: &Tensor, rope: &Rope, cos_sin: &(Tensor, Tensor)) -> Result<Tensor> {
        let (_, t, _) = x.dims3()?;
        let q = self.q_proj.forward(x)?.reshape((1, t, self.n_heads, self.head_dim))?;
        let q = self.q_norm.forward(&q)?;
        rope.apply(&q.transpose(1, 2)?, &cos_sin.0, &cos_sin.1)
    }

    /// The attention sublayer and the feed-forward around it: `x` `[1, t, hidden]` at rows `rows`, `attn` the
    /// attention output for the normed `x`.
    pub fn finish(&self, x: &Tensor, attn: &Tensor, per_layer_input: Option<&Tensor>) -> Result<Tensor> {
        let h = (x + self.post_attention_layernorm.forward(attn)?)?;
        let m = self.mlp.forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
        let mut h = (&h + self.post_feedforward_layernorm.forward(&m)?)?;
        if let (Some(p), Some(input)) = (&self.ple, per_layer_input) {
            let gate = self.gate_act(&p.gate.forward(&h)?)?;
            let y = p.norm.forward(&p.projection.forward(&(gate * input)?)?)?;
            h = (h + y)?;
        }
        Ok((h * self.scalar)?)
    }

    fn gate_act(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.gelu()?)
    }

    pub fn input_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.input_layernorm.forward(x)
    }

    /// The layer on `x` (`[1, t, hidden]`); its keys and values (if it has its own) are appended to
    /// `caches[self.cache]`, which must hold exactly the positions before `rows.start`.
    fn forward(
        &self,
        x: &Tensor,
        per_layer_input: Option<&Tensor>,
        rows: &Rows<'_>,
        ropes: &(Rope, Rope),
        caches: &mut [KvCache],
    ) -> Result<Tensor> {
        let (_, t, _) = x.dims3()?;
        let (rope, cs) = match self.kind {
            LayerKind::Full => (&ropes.0, rows.full),
            LayerKind::Sliding => (&ropes.1, rows.sliding),
        };
        let hn = self.input_norm(x)?;
        let q = self.queries(&hn, rope, cs)?;
        let cache = &mut caches[self.cache];
        if let Some(kv) = &self.kv {
            if cache.len() != rows.start {
                return Err(Error::InvalidOption(format!(
                    "attention cache holds {} positions but the block starts at {}",
                    cache.len(),
                    rows.start
                )));
            }
            let (n, d) = (self.n_kv_heads, self.head_dim);
            let raw_k = kv.k_proj.forward(&hn)?.reshape((1, t, n, d))?;
            let v = match &kv.v_proj {
                Some(v) => v.forward(&hn)?.reshape((1, t, n, d))?,
                None => raw_k.clone(),
            };
            let k = kv.k_norm.forward(&raw_k)?;
            let k = rope.apply(&k.transpose(1, 2)?, &cs.0, &cs.1)?.transpose(1, 2)?; // [1, t, kv, d]
            let v = rms_unit(&v, self.eps)?;
            cache.append(&flat(&k)?, &flat(&v)?);
        } else if cache.len() < rows.start + t {
            // A reusing layer's queries may start later than the block (rows dropped), never past its source.
            return Err(Error::InvalidOption("a KV-sharing layer ran before the layer whose KV it reuses".into()));
        }
        let q = flat(&q)?;
        let (start, window) = (rows.start, self.window);
        let out = attend(cache, &q, AttendShape::over(cache, self.n_heads), t, 1.0, None, Causal { start, window });
        let out = Tensor::from_vec(out, (1, t, self.n_heads * self.head_dim), x.device())?;
        let a = self.o_proj.forward(&out)?;
        self.finish(x, &a, per_layer_input)
    }
}

/// Per-layer inputs (PLE): a token-identity table and a projection of the embeddings, one slice per layer.
struct PerLayerEmbeddings {
    table: Embedding,
    vocab: usize,
    projection: Linear,
    norm: RmsNorm,
    dim: usize,
}

pub struct Gemma4 {
    cfg: ModelConfig,
    embed: Embedding,
    embed_scale: f64,
    ple: Option<PerLayerEmbeddings>,
    layers: Vec<Layer>,
    /// The shape of each cache a sequence keeps: one per layer that computes its own KV (reusing layers read
    /// their source's).
    cache_shapes: Vec<(usize, usize)>,
    /// For each layer kind, the cache of its last layer with its own KV before the shared ones (Transformers'
    /// `"store"` layer): what reusing layers and the assistant read.
    store: [Option<usize>; 2],
    /// Index of the first layer that reuses KV: from there on rows nobody asked for can be dropped.
    first_shared: usize,
    head: LogitsHead,
    /// `(full, sliding)` rotary tables.
    ropes: (Rope, Rope),
    device: Device,
}

/// One sequence of Gemma 4: its caches and position.
pub struct Gemma4Sequence {
    caches: Vec<KvCache>,
    len: usize,
}

fn kind_index(kind: LayerKind) -> usize {
    match kind {
        LayerKind::Full => 0,
        LayerKind::Sliding => 1,
    }
}

pub fn load(cfg: ModelConfig, w: &Weights) -> Result<Gemma4> {
    if w.is_gguf() {
        return Err(Error::config("gemma4", "Gemma 4 from GGUF is not supported yet; use the Hugging Face checkpoint"));
    }
    let g = Gemma4Config::from_model_config(&cfg)?;
    let pre = g.prefix;
    let sources = g.kv_sources(&cfg)?;
    let n = cfg.num_hidden_layers;
    let first_shared = n - g.num_kv_shared_layers;
    let mut cache_shapes = Vec::new();
    let mut cache_of = vec![0usize; n];
    let mut store = [None, None];
    for i in 0..n {
        cache_of[i] = match sources[i] {
            None => {
                let (d, kv) = g.head_shape(&cfg, cfg.layer_types[i]);
                cache_shapes.push((kv, d));
                if i < first_shared {
                    store[kind_index(cfg.layer_types[i])] = Some(cache_shapes.len() - 1);
                }
                cache_shapes.len() - 1
            }
            Some(j) => cache_of[j],
        };
    }
    let layers = (0..n)
        .map(|i| {
            let shared = sources[i].is_some();
            Layer::load(
                w,
                &format!("{pre}.layers.{i}"),
                &cfg,
                &g,
                cfg.layer_types[i],
                cache_of[i],
                !shared,
                shared && g.use_double_wide_mlp,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let embed = w.embedding(&format!("{pre}.embed_tokens.weight"), cfg.vocab_size, cfg.hidden_size)?;
    let head = LogitsHead::load(&cfg, w, &embed, &format!("{pre}.norm.weight"), false)?;
    let ple = if g.hidden_size_per_layer_input > 0 {
        let p = g.hidden_size_per_layer_input;
        let eps = cfg.rms_norm_eps;
        Some(PerLayerEmbeddings {
            table: w.embedding(&format!("{pre}.embed_tokens_per_layer.weight"), g.vocab_size_per_layer_input, n * p)?,
            vocab: g.vocab_size_per_layer_input,
            projection: w.linear(&format!("{pre}.per_layer_model_projection"), n * p, cfg.hidden_size, false)?,
            norm: RmsNorm::load(w, &format!("{pre}.per_layer_projection_norm.weight"), p, eps, false)?,
            dim: p,
        })
    } else {
        None
    };
    let ropes = (g.rope(&cfg, LayerKind::Full)?, g.rope(&cfg, LayerKind::Sliding)?);
    Ok(Gemma4 {
        embed,
        embed_scale: (cfg.hidden_size as f64).sqrt(),
        ple,
        layers,
        cache_shapes,
        store,
        first_shared,
        head,
        ropes,
        device: w.device().clone(),
        cfg,
    })
}

impl Gemma4 {
    /// Per-layer inputs for `ids` with embeddings `x` (`[t, hidden]`, scaled): `[t, layers, ple_dim]`.
    fn per_layer_inputs(&self, p: &PerLayerEmbeddings, ids: &Tensor, x: &Tensor) -> Result<Tensor> {
        let t = x.dim(0)?;
        let n = self.layers.len();
        let tok = (p.table.forward(ids)? * (p.dim as f64).sqrt())?.reshape((t, n, p.dim))?;
        let proj = (p.projection.forward(x)? * (self.cfg.hidden_size as f64).powf(-0.5))?.reshape((t, n, p.dim))?;
        let proj = p.norm.forward(&proj)?;
        Ok(((proj + tok)? * std::f64::consts::FRAC_1_SQRT_2)?)
    }
}

impl BatchModel for Gemma4 {
    type Sequence = Gemma4Sequence;

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn new_sequence(&self) -> Gemma4Sequence {
        Gemma4Sequence { caches: self.cache_shapes.iter().map(|&(kv, d)| KvCache::new(kv, d)).collect(), len: 0 }
    }

    fn cache_len(&self, seq: &Gemma4Sequence) -> usize {
        seq.len
    }

    fn truncate(&self, seq: &mut Gemma4Sequence, len: usize) {
        seq.len = seq.len.min(len);
        for c in seq.caches.iter_mut() {
            c.truncate(len);
        }
    }

    fn check(&self, seq: &Gemma4Sequence, tokens: &[u32], opts: &ForwardOptions) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::InvalidOption("forward called with no tokens".into()));
        }
        if opts.exit_layer.is_some() {
            return Err(Error::InvalidOption("early exit is not supported on Gemma 4".into()));
        }
        let vocab = self.cfg.vocab_size as u32;
        let ple_vocab = self.ple.as_ref().map_or(vocab, |p| p.vocab as u32).min(vocab);
        if let Some(bad) = tokens.iter().find(|&&id| id >= ple_vocab) {
            return Err(Error::InvalidOption(format!(
                "token id {bad} is outside the model's vocabulary of {ple_vocab}"
            )));
        }
        let end = seq.len + tokens.len();
        if end > self.cfg.max_position_embeddings {
            return Err(Error::PromptTooLong { prompt_tokens: end, context: self.cfg.max_position_embeddings });
        }
        Ok(())
    }

    fn batchable(&self, _seq: &Gemma4Sequence, _opts: &ForwardOptions) -> bool {
        true
    }

    fn forward(&self, seq: &mut Gemma4Sequence, tokens: &[u32], opts: &ForwardOptions) -> Result<ForwardOutput> {
        let (t, start) = (tokens.len(), seq.len);
        let ids = Tensor::new(tokens, &self.device)?;
        let x0 = (self.embed.forward(&ids)? * self.embed_scale)?; // [t, hidden]
        let mut pli = match &self.ple {
            Some(p) => Some(self.per_layer_inputs(p, &ids, &x0)?), // [t, layers, ple]
            None => None,
        };
        let mut x = x0.unsqueeze(0)?;
        let full = self.ropes.0.cos_sin(start, t, &self.device)?;
        let sliding = self.ropes.1.cos_sin(start, t, &self.device)?;
        // Layers that reuse KV write nothing, so rows whose outputs nobody asked for can be dropped there.
        let wanted = if opts.hidden_states {
            t
        } else {
            match opts.logits {
                LogitRows::All => t,
                LogitRows::Last(n) => n.clamp(1, t),
                LogitRows::None => 0,
            }
        };
        let (mut full, mut sliding, mut row_start) = (full, sliding, start);
        for i in 0..self.layers.len() {
            if i == self.first_shared && wanted < t {
                if wanted == 0 {
                    break;
                }
                let skip = t - wanted;
                x = x.narrow(1, skip, wanted)?;
                pli = pli.map(|p| p.narrow(0, skip, wanted)).transpose()?;
                full = (full.0.narrow(0, skip, wanted)?, full.1.narrow(0, skip, wanted)?);
                sliding = (sliding.0.narrow(0, skip, wanted)?, sliding.1.narrow(0, skip, wanted)?);
                row_start = start + skip;
            }
            let rows = Rows { start: row_start, full: &full, sliding: &sliding };
            let layer_input = pli.as_ref().map(|p| p.narrow(1, i, 1)?.squeeze(1)?.unsqueeze(0)).transpose()?;
            x = self.layers[i].forward(&x, layer_input.as_ref(), &rows, &self.ropes, &mut seq.caches)?;
        }
        seq.len = start + t;
        if wanted == 0 {
            return Ok(ForwardOutput { logits: None, hidden: None });
        }
        self.head.outputs(&x.squeeze(0)?, opts)
    }

    /// The sequences one after another: Gemma 4's layers take one sequence's rows at a time.
    fn forward_batch(&self, jobs: &mut [Job<Gemma4Sequence>]) -> Result<Vec<ForwardOutput>> {
        crate::kernels::parallel::on_pool(|| {
            jobs.iter_mut().map(|j| self.forward(&mut j.seq, &j.tokens, &j.opts)).collect()
        })
    }

    fn kv_sharing<'a>(&'a self, seq: &'a Gemma4Sequence) -> Option<Box<dyn KvSharing + 'a>> {
        Some(Box::new(SharedView { model: self, seq }))
    }

    fn head_part(&self, ids: &[u32], keep: bool) -> Result<Option<std::sync::Arc<crate::nn::Linear>>> {
        self.head.part(ids, keep)
    }
}

/// A sequence's store-layer caches, for the Gemma 4 assistant.
struct SharedView<'a> {
    model: &'a Gemma4,
    seq: &'a Gemma4Sequence,
}

impl KvSharing for SharedView<'_> {
    fn shared_kv(&self, kind: LayerKind) -> Option<&KvCache> {
        self.model.store[kind_index(kind)].map(|i| &self.seq.caches[i])
    }

    fn embed_tokens(&self, tokens: &[u32]) -> Result<Tensor> {
        let ids = Tensor::new(tokens, &self.model.device)?;
        Ok((self.model.embed.forward(&ids)? * self.model.embed_scale)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> ModelConfig {
        let json = format!(
            r#"{{"model_type": "gemma4_text", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8,
               "num_hidden_layers": 5, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
               "sliding_window": 4, "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
               "sliding_attention", "sliding_attention"] {extra}}}"#
        );
        ModelConfig::from_hf_json(&json).unwrap()
    }

    #[test]
    fn kv_sharing_reuses_the_last_earlier_layer_of_the_type() {
        let cfg = config(r#", "num_kv_shared_layers": 2"#);
        assert_eq!(cfg.layer_types[4], LayerKind::Full, "the last layer is forced global");
        let g = Gemma4Config::from_model_config(&cfg).unwrap();
        assert_eq!(g.kv_sources(&cfg).unwrap(), vec![None, None, None, Some(1), Some(2)]);
        let none = config("");
        assert_eq!(Gemma4Config::from_model_config(&none).unwrap().kv_sources(&none).unwrap(), vec![None; 5]);
        let bad = config(r#", "num_kv_shared_layers": 4"#);
        assert!(Gemma4Config::from_model_config(&bad).unwrap().kv_sources(&bad).is_err(), "no global layer to reuse");
        let moe = config(r#", "enable_moe_block": true"#);
        assert!(Gemma4Config::from_model_config(&moe).is_err());
    }

    #[test]
    fn global_layers_take_their_own_shapes_and_proportional_rope() {
        let cfg = config(
            r#", "attention_k_eq_v": true, "per_layer_config": {"2": {"head_dim": 16, "num_key_value_heads": 2}}"#,
        );
        let g = Gemma4Config::from_model_config(&cfg).unwrap();
        assert_eq!(g.head_shape(&cfg, LayerKind::Full), (16, 2));
        assert_eq!(g.head_shape(&cfg, LayerKind::Sliding), (8, 1));
        // Default global rope: proportional, a quarter of the 8 frequencies rotated (over the whole head of 16).
        let rope = g.rope(&cfg, LayerKind::Full).unwrap();
        let (cos, sin) = rope.cos_sin(3, 1, &Device::Cpu).unwrap();
        let (cos, sin) = (cos.to_vec2::<f32>().unwrap()[0].clone(), sin.to_vec2::<f32>().unwrap()[0].clone());
        assert_eq!(cos.len(), 8);
        assert!(
            (sin[0] - 3f32.sin()).abs() < 1e-6 && (sin[1] - (3.0 / 1e6f64.powf(2.0 / 16.0)).sin() as f32).abs() < 1e-6
        );
        assert!(cos[2..].iter().all(|&c| c == 1.0) && sin[2..].iter().all(|&s| s == 0.0));
    }
}
