//! The Gemma 4 assistant (`Gemma4AssistantForCausalLM`, Transformers 5.24): a small Gemma 4 text stack whose
//! layers have queries only and attend to the target's shared KV (the last sliding and the last global layer with
//! their own KV). Its input is the target's scaled embedding of the newest token concatenated with the hidden state
//! that produced it, projected down (`pre_projection`); its output hidden state is projected back up
//! (`post_projection`) to feed the next draft step. With `use_ordered_embeddings` the logits come from a centroid
//! head: only the tokens of the `centroid_intermediate_top_k` best clusters get a real logit, the others
//! `min(selected) − 1`.
//!
//! It keeps no state: the drafter ([`crate::speculation::methods::Gemma4AssistantDrafter`]) hands it the target's
//! caches and the visible ranges for each step.

use candle_core::{DType, Device, Tensor};

use super::gemma4::{Layer, Rows};
use crate::config::{Gemma4Config, LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::io::weights::Weights;
use crate::kernels::attention::{attend, AttendShape, Ranges};
use crate::kernels::kv_cache::KvCache;
use crate::nn::Linear;
use crate::nn::{RmsNorm, Rope};

/// The centroid head (`Gemma4AssistantMaskedEmbedder`).
struct MaskedEmbedder {
    /// `[num_centroids, hidden]`.
    centroids: Linear,
    /// Token ids grouped by cluster: cluster `c` owns `ordering[c·per .. (c+1)·per]`.
    ordering: Vec<u32>,
    per_cluster: usize,
    top_k: usize,
}

/// One step's view of the target's shared KV: the cache and the half-open range of positions visible to the
/// assistant's layers of that kind.
pub struct SharedKv<'a> {
    pub cache: &'a KvCache,
    pub visible: (usize, usize),
}

pub struct Gemma4Assistant {
    cfg: ModelConfig,
    /// Hidden size of the target the assistant drafts for.
    pub backbone_hidden_size: usize,
    pre_projection: Linear,
    post_projection: Linear,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// `[vocab, hidden]`: the LM head's rows, for the centroid head.
    lm_rows: Vec<f32>,
    masked: Option<MaskedEmbedder>,
    /// `(full, sliding)` rotary tables.
    ropes: (Rope, Rope),
    device: Device,
}

pub fn load(cfg: ModelConfig, w: &Weights) -> Result<Gemma4Assistant> {
    if w.is_gguf() {
        return Err(Error::config("gemma4_assistant", "the Gemma 4 assistant is read from Hugging Face safetensors"));
    }
    let g = Gemma4Config::from_model_config(&cfg)?;
    let a = g.assistant.clone().ok_or_else(|| {
        Error::config("config.json", "the Gemma 4 assistant's own fields come with a nested `text_config`")
    })?;
    // Transformers' `validate_architecture`, and `__post_init__` making every layer reuse KV.
    if g.hidden_size_per_layer_input != 0 {
        return Err(Error::config("hidden_size_per_layer_input", "must be 0 for the Gemma 4 assistant"));
    }
    if g.use_double_wide_mlp {
        return Err(Error::config("use_double_wide_mlp", "must be false for the Gemma 4 assistant"));
    }
    if g.num_kv_shared_layers != 0 && g.num_kv_shared_layers != cfg.num_hidden_layers {
        return Err(Error::config("num_kv_shared_layers", "every layer of the Gemma 4 assistant must reuse KV"));
    }
    let (h, hb) = (cfg.hidden_size, a.backbone_hidden_size);
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let kind = cfg.layer_types[i];
            Layer::load(w, &format!("model.layers.{i}"), &cfg, &g, kind, 0, false, false)
        })
        .collect::<Result<Vec<_>>>()?;
    let lm_head = if cfg.tie_word_embeddings || !w.contains("lm_head.weight") {
        w.linear("model.embed_tokens", cfg.vocab_size, h, false)?
    } else {
        w.linear("lm_head", cfg.vocab_size, h, false)?
    };
    let masked = if a.use_ordered_embeddings {
        let (c, v) = (a.num_centroids, cfg.vocab_size);
        if c == 0 || v % c != 0 || a.centroid_intermediate_top_k == 0 || a.centroid_intermediate_top_k > c {
            return Err(Error::config(
                "num_centroids",
                format!("{c} clusters with top {} do not fit a vocabulary of {v}", a.centroid_intermediate_top_k),
            ));
        }
        let ordering: Vec<u32> =
            w.f32("masked_embedding.token_ordering", &[v])?.to_vec1::<f32>()?.into_iter().map(|x| x as u32).collect();
        if let Some(bad) = ordering.iter().find(|&&t| t as usize >= v) {
            return Err(Error::config(
                "masked_embedding.token_ordering",
                format!("token {bad} outside the vocabulary"),
            ));
        }
        Some(MaskedEmbedder {
            centroids: w.linear("masked_embedding.centroids", c, h, false)?,
            ordering,
            per_cluster: v / c,
            top_k: a.centroid_intermediate_top_k,
        })
    } else {
        None
    };
    let lm_rows = if masked.is_some() {
        // The masked head scores arbitrary rows of the table: it keeps them widened (the plain head does not).
        let rows = if cfg.tie_word_embeddings || !w.contains("lm_head.weight") {
            w.f32("model.embed_tokens.weight", &[cfg.vocab_size, h])?
        } else {
            w.f32("lm_head.weight", &[cfg.vocab_size, h])?
        };
        rows.flatten_all()?.to_vec1::<f32>()?
    } else {
        Vec::new()
    };
    Ok(Gemma4Assistant {
        backbone_hidden_size: hb,
        pre_projection: w.linear("pre_projection", h, 2 * hb, false)?,
        post_projection: w.linear("post_projection", hb, h, false)?,
        layers,
        norm: RmsNorm::load(w, "model.norm.weight", h, cfg.rms_norm_eps, false)?,
        lm_head,
        lm_rows,
        masked,
        ropes: (g.rope(&cfg, LayerKind::Full)?, g.rope(&cfg, LayerKind::Sliding)?),
        device: w.device().clone(),
        cfg,
    })
}

impl Gemma4Assistant {
    /// One draft step. `input`: `[1, 1, 2·backbone_hidden]` (target embedding of the newest token, then the hidden
    /// state that produced it), at position `pos`; `full` / `sliding`: the target's shared KV. Returns the raw
    /// logits `[vocab]` and the projected hidden state `[1, backbone_hidden]` for the next step.
    pub fn step(
        &self,
        input: &Tensor,
        pos: usize,
        full: &SharedKv<'_>,
        sliding: &SharedKv<'_>,
    ) -> Result<(Vec<f32>, Tensor)> {
        let mut x = self.pre_projection.forward(input)?; // [1, 1, hidden]
        let cs_full = self.ropes.0.cos_sin(pos, 1, &self.device)?;
        let cs_sliding = self.ropes.1.cos_sin(pos, 1, &self.device)?;
        let rows = Rows { start: pos, full: &cs_full, sliding: &cs_sliding };
        for layer in &self.layers {
            let (rope, cs, kv) = match layer.kind {
                LayerKind::Full => (&self.ropes.0, rows.full, full),
                LayerKind::Sliding => (&self.ropes.1, rows.sliding, sliding),
            };
            let cache = kv.cache;
            if cache.head_dim() != layer.head_dim || layer.n_heads % cache.n_kv_heads() != 0 {
                return Err(Error::InvalidOption(format!(
                    "the assistant's {:?} layers ({} heads of {}) do not fit the target's shared KV ({} heads of {})",
                    layer.kind,
                    layer.n_heads,
                    layer.head_dim,
                    cache.n_kv_heads(),
                    cache.head_dim()
                )));
            }
            let (first, end) = kv.visible;
            if first >= end || end > cache.len() {
                return Err(Error::InvalidOption(format!(
                    "the assistant cannot attend to positions {first}..{end} of a shared KV of {}",
                    cache.len()
                )));
            }
            let q = layer.queries(&layer.input_norm(&x)?, rope, cs)?.flatten_all()?.to_vec1::<f32>()?;
            let out =
                attend(cache, &q, AttendShape::over(cache, layer.n_heads), 1, 1.0, None, Ranges(|_| (first, end)));
            let out = Tensor::from_vec(out, (1, 1, layer.n_heads * layer.head_dim), &self.device)?;
            let a = layer.o_proj.forward(&out)?;
            x = layer.finish(&x, &a, None)?;
        }
        let h = self.norm.forward(&x)?.reshape((1, self.cfg.hidden_size))?;
        let projected = self.post_projection.forward(&h)?;
        let logits = match &self.masked {
            None => self.lm_head.forward(&h)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
            Some(m) => self.masked_logits(m, &h)?,
        };
        Ok((logits, projected))
    }

    /// The centroid head on `h` (`[1, hidden]`).
    fn masked_logits(&self, m: &MaskedEmbedder, h: &Tensor) -> Result<Vec<f32>> {
        let c = m.centroids.forward(h)?.flatten_all()?.to_vec1::<f32>()?;
        let mut order: Vec<usize> = (0..c.len()).collect();
        // Best clusters first; ties broken by index, as a stable sort would.
        order.sort_by(|&a, &b| c[b].total_cmp(&c[a]).then(a.cmp(&b)));
        let hv = h.flatten_all()?.to_vec1::<f32>()?;
        let d = hv.len();
        let mut selected = Vec::with_capacity(m.top_k * m.per_cluster);
        for &cluster in &order[..m.top_k] {
            for &tok in &m.ordering[cluster * m.per_cluster..(cluster + 1) * m.per_cluster] {
                let row = &self.lm_rows[tok as usize * d..(tok as usize + 1) * d];
                selected.push((tok, row.iter().zip(&hv).map(|(a, b)| a * b).sum::<f32>()));
            }
        }
        let fill = selected.iter().map(|&(_, l)| l).fold(f32::INFINITY, f32::min) - 1.0;
        let mut logits = vec![fill; self.cfg.vocab_size];
        for (tok, l) in selected {
            logits[tok as usize] = l;
        }
        Ok(logits)
    }
}

impl Gemma4Assistant {
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }
}
