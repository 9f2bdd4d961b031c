//! Gemma 4's `config.json`: the text model (Transformers' `Gemma4TextConfig`), flat or nested in `text_config`
//! of the multimodal model (`Gemma4Config`) or of the assistant (`Gemma4AssistantConfig`).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::gemma3::gemma_defaults;
use super::hf::{set_layer_types, Base, RopeJson};
use super::{gemma3_layer_types, Architecture, LayerKind, ModelConfig};
use crate::error::{Error, Result};

/// What Gemma 4's model files read beyond the common fields, with Transformers' defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4Config {
    /// Head size of the global layers (`global_head_dim`, else the first global layer's `per_layer_config`).
    pub global_head_dim: usize,
    /// KV heads of the global layers: their own count with `attention_k_eq_v`, else `num_key_value_heads`.
    pub num_global_key_value_heads: usize,
    pub attention_k_eq_v: bool,
    pub num_kv_shared_layers: usize,
    pub hidden_size_per_layer_input: usize,
    pub vocab_size_per_layer_input: usize,
    pub use_double_wide_mlp: bool,
    /// Kept so that the model file can refuse what it does not implement.
    pub enable_moe_block: bool,
    pub use_bidirectional_attention: Option<String>,
    /// `rope_parameters.full_attention`, if given.
    pub full_rope: Option<Gemma4Rope>,
    /// `rope_parameters.sliding_attention`, if given.
    pub sliding_rope: Option<Gemma4Rope>,
    /// Where the checkpoint keeps the text model's tensors.
    pub prefix: &'static str,
    /// The assistant's own fields (the outer object of a `gemma4_assistant` checkpoint).
    pub assistant: Option<Gemma4AssistantConfig>,
}

/// One layer type's rotary parameters; the model file applies the defaults, which depend on the layer type.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4Rope {
    pub rope_type: Option<String>,
    pub rope_theta: Option<f64>,
    pub partial_rotary_factor: Option<f64>,
    pub factor: Option<f64>,
}

/// The fields of `Gemma4AssistantForCausalLM`'s outer config.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4AssistantConfig {
    pub backbone_hidden_size: usize,
    pub use_ordered_embeddings: bool,
    pub num_centroids: usize,
    pub centroid_intermediate_top_k: usize,
}

/// A `per_layer_config` entry, as `save_pretrained` writes it.
#[derive(Debug, Deserialize)]
struct PerLayer {
    head_dim: Option<usize>,
    num_key_value_heads: Option<usize>,
}

/// `per_layer_config`: keyed by layer index, or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PerLayerConfig {
    ByIndex(BTreeMap<String, Option<PerLayer>>),
    List(Vec<Option<PerLayer>>),
}

impl PerLayerConfig {
    fn get(&self, i: usize) -> Option<&PerLayer> {
        match self {
            Self::ByIndex(m) => m.get(&i.to_string())?.as_ref(),
            Self::List(l) => l.get(i)?.as_ref(),
        }
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct Gemma4TextJson {
    #[serde(flatten)]
    base: Base,
    /// Gemma's name for `hidden_act`; read first.
    hidden_activation: Option<String>,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    global_head_dim: Option<usize>,
    num_global_key_value_heads: Option<usize>,
    #[serde(default)]
    attention_k_eq_v: bool,
    #[serde(default)]
    num_kv_shared_layers: usize,
    #[serde(default = "default_ple_dim")]
    hidden_size_per_layer_input: usize,
    #[serde(default = "default_ple_vocab")]
    vocab_size_per_layer_input: usize,
    #[serde(default)]
    use_double_wide_mlp: bool,
    #[serde(default)]
    enable_moe_block: bool,
    use_bidirectional_attention: Option<String>,
    /// Set by `save_pretrained` from `global_head_dim` and `num_global_key_value_heads`; read when they are absent.
    per_layer_config: Option<PerLayerConfig>,
}

fn default_ple_dim() -> usize {
    256
}

fn default_ple_vocab() -> usize {
    262_144
}

/// The multimodal checkpoint's outer object; only its text model is read.
#[derive(Debug, Deserialize)]
struct Gemma4Json {
    text_config: Option<Gemma4TextJson>,
}

#[derive(Debug, Deserialize)]
struct Gemma4AssistantJson {
    text_config: Option<Gemma4TextJson>,
    #[serde(default = "default_backbone")]
    backbone_hidden_size: usize,
    #[serde(default)]
    use_ordered_embeddings: bool,
    #[serde(default = "default_centroids")]
    num_centroids: usize,
    #[serde(default = "default_top_k")]
    centroid_intermediate_top_k: usize,
}

fn default_backbone() -> usize {
    1536
}

fn default_centroids() -> usize {
    2048
}

fn default_top_k() -> usize {
    32
}

fn rope(r: Option<RopeJson>) -> Option<Gemma4Rope> {
    r.map(|r| Gemma4Rope {
        rope_type: r.rope_type,
        rope_theta: r.rope_theta,
        partial_rotary_factor: r.partial_rotary_factor,
        factor: r.factor,
    })
}

/// Reads a Gemma 4 `config.json`: nested in `text_config` where the outer `model_type` says so, else flat.
pub(super) fn from_json(text: &str, model_type: Option<&str>, architecture: Architecture) -> Result<ModelConfig> {
    let parse_err = |e: serde_json::Error| Error::config("config.json", e.to_string());
    let missing = || Error::config("text_config", "missing from a Gemma 4 config");
    match model_type {
        Some("gemma4") => {
            let outer: Gemma4Json = serde_json::from_str(text).map_err(parse_err)?;
            outer.text_config.ok_or_else(missing)?.into_model_config(architecture, "model.language_model", None)
        }
        Some("gemma4_assistant") => {
            let outer: Gemma4AssistantJson = serde_json::from_str(text).map_err(parse_err)?;
            let assistant = Gemma4AssistantConfig {
                backbone_hidden_size: outer.backbone_hidden_size,
                use_ordered_embeddings: outer.use_ordered_embeddings,
                num_centroids: outer.num_centroids,
                centroid_intermediate_top_k: outer.centroid_intermediate_top_k,
            };
            outer.text_config.ok_or_else(missing)?.into_model_config(architecture, "model", Some(assistant))
        }
        _ => {
            let flat: Gemma4TextJson = serde_json::from_str(text).map_err(parse_err)?;
            flat.into_model_config(architecture, "model", None)
        }
    }
}

impl Gemma4TextJson {
    fn into_model_config(
        mut self,
        architecture: Architecture,
        prefix: &'static str,
        assistant: Option<Gemma4AssistantConfig>,
    ) -> Result<ModelConfig> {
        self.base.hidden_act = self.hidden_activation.or(self.base.hidden_act);
        // Gemma 4's rotary tables (proportional, per layer type and head size) are built by its model file.
        let rope_parameters = self.base.rope_parameters.take();
        let mut defaults = gemma_defaults();
        defaults.max_position_embeddings = 131_072;
        let (mut cfg, _) = self.base.into_model_config(architecture, defaults)?;
        let pattern = self.sliding_window_pattern.unwrap_or(6);
        set_layer_types(
            &mut cfg,
            self.layer_types,
            |n| gemma3_layer_types(n, pattern),
            self.sliding_window,
            Some(512),
        )?;
        cfg.final_logit_softcapping = self.final_logit_softcapping;
        cfg.attn_logit_softcapping = self.attn_logit_softcapping;

        let first_global = cfg.layer_types.iter().position(|&k| k == LayerKind::Full);
        let per_layer = first_global.and_then(|i| self.per_layer_config.as_ref()?.get(i));
        let global_head_dim = self.global_head_dim.or_else(|| per_layer?.head_dim).unwrap_or(512);
        let num_global_key_value_heads = if self.attention_k_eq_v {
            self.num_global_key_value_heads
                .or_else(|| per_layer?.num_key_value_heads)
                .unwrap_or(cfg.num_key_value_heads)
        } else {
            cfg.num_key_value_heads
        };
        let (full_rope, sliding_rope) = match rope_parameters {
            Some(p) => (rope(p.full_attention), rope(p.sliding_attention)),
            None => (None, None),
        };
        cfg.gemma4 = Some(Gemma4Config {
            global_head_dim,
            num_global_key_value_heads,
            attention_k_eq_v: self.attention_k_eq_v,
            num_kv_shared_layers: self.num_kv_shared_layers,
            hidden_size_per_layer_input: self.hidden_size_per_layer_input,
            vocab_size_per_layer_input: self.vocab_size_per_layer_input,
            use_double_wide_mlp: self.use_double_wide_mlp,
            enable_moe_block: self.enable_moe_block,
            use_bidirectional_attention: self.use_bidirectional_attention,
            full_rope,
            sliding_rope,
            prefix,
            assistant,
        });
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Architecture, LayerKind, ModelConfig};

    const TEXT: &str = r#"{"vocab_size": 16, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 3,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "attention_k_eq_v": true,
        "per_layer_config": [null, null, {"head_dim": 16, "num_key_value_heads": 2}],
        "rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5}}}"#;

    #[test]
    fn the_text_model_is_read_from_where_the_outer_model_type_puts_it() {
        let multimodal = format!(r#"{{"model_type": "gemma4", "text_config": {TEXT}}}"#);
        let c = ModelConfig::from_hf_json(&multimodal).unwrap();
        assert_eq!(c.architecture, Architecture::Gemma4);
        assert_eq!(c.layer_types, [LayerKind::Sliding, LayerKind::Sliding, LayerKind::Full]);
        assert_eq!((c.sliding_window, c.max_position_embeddings), (Some(512), 131_072));
        let g = c.gemma4.unwrap();
        assert_eq!((g.prefix, g.global_head_dim, g.num_global_key_value_heads), ("model.language_model", 16, 2));
        assert_eq!(g.full_rope.unwrap().partial_rotary_factor, Some(0.5));
        assert!(g.sliding_rope.is_none() && g.assistant.is_none());

        let assistant = format!(r#"{{"model_type": "gemma4_assistant", "num_centroids": 4, "text_config": {TEXT}}}"#);
        let g = ModelConfig::from_hf_json(&assistant).unwrap().gemma4.unwrap();
        let a = g.assistant.unwrap();
        assert_eq!((g.prefix, a.num_centroids, a.backbone_hidden_size), ("model", 4, 1536));

        let e = ModelConfig::from_hf_json(r#"{"model_type": "gemma4"}"#).unwrap_err().to_string();
        assert!(e.contains("text_config") && e.contains("missing"), "{e}");
    }
}
