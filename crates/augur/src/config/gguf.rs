//! GGUF metadata (`{arch}.*` keys, as llama.cpp writes them) into the engine's config.

use std::path::Path;

use candle_core::quantized::gguf_file;

use super::{
    at_most, gemma3_layer_types, in_file, positive, Activation, Architecture, LayerKind, ModelConfig, RopeLayout,
    RopeScaling, MAX_LAYERS,
};
use crate::error::{Error, Result};

impl ModelConfig {
    /// [`Self::from_gguf`] with errors that name the file.
    pub fn from_gguf_file(content: &gguf_file::Content, path: &Path) -> Result<Self> {
        Self::from_gguf(content).map_err(|e| in_file(e, path))
    }

    /// Reads the hyper-parameters from a GGUF file's metadata (`{arch}.*` keys, as llama.cpp writes them).
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self> {
        let md = &content.metadata;
        let get = |key: &str| md.get(key);
        let arch_name = get("general.architecture")
            .and_then(|v| v.to_string().ok().cloned())
            .ok_or_else(|| Error::config("general.architecture", "missing from GGUF metadata"))?;
        let architecture = Architecture::parse(&arch_name)?;
        let a = architecture.name();
        let key = |k: &str| format!("{a}.{k}");
        let u = |k: &str| -> Result<usize> {
            let full = key(k);
            md.get(&full)
                .ok_or_else(|| Error::config(&full, "missing from GGUF metadata"))?
                .to_u64()
                .or_else(|_| md[&full].to_u32().map(u64::from))
                .map(|v| v as usize)
                .map_err(|e| Error::config(&full, e.to_string()))
        };
        let f = |k: &str| -> Option<f64> { md.get(&key(k)).and_then(|v| v.to_f32().ok()).map(f64::from) };

        let hidden_size = u("embedding_length")?;
        let num_attention_heads = positive(u("attention.head_count")?, &key("attention.head_count"))?;
        let num_hidden_layers = at_most(u("block_count")?, MAX_LAYERS, &key("block_count"))?;
        let head_dim = match u("attention.key_length") {
            Ok(d) => d,
            Err(_) => hidden_size / num_attention_heads,
        };
        let vocab_size = match u("vocab_size") {
            Ok(v) => v,
            Err(_) => md
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.to_vec().ok())
                .map(|v| v.len())
                .ok_or_else(|| Error::config(key("vocab_size"), "missing, and no tokenizer.ggml.tokens"))?,
        };
        let sliding_window = u("attention.sliding_window").ok();
        let layer_types = match architecture {
            // llama.cpp fixes Gemma 3's pattern at 6 rather than storing it.
            Architecture::Gemma3 => gemma3_layer_types(num_hidden_layers, 6),
            _ => vec![LayerKind::Full; num_hidden_layers],
        };
        let rope_scaling = match (
            md.get(&key("rope.scaling.type")).and_then(|v| v.to_string().ok()).map(String::as_str),
            f("rope.scaling.factor"),
        ) {
            (Some("linear"), Some(factor)) if factor != 1.0 => RopeScaling::Linear { factor },
            _ => RopeScaling::None,
        };
        let id = |k: &str| md.get(k).and_then(|v| v.to_u32().ok());
        let has_output = content.tensor_infos.contains_key("output.weight");
        let cfg = ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: u("feed_forward_length")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: u("attention.head_count_kv").unwrap_or(num_attention_heads),
            head_dim,
            rms_norm_eps: f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope_theta: f("rope.freq_base").unwrap_or(match architecture {
                Architecture::Gemma3 => 1_000_000.0,
                _ => 10_000.0,
            }),
            rope_local_base_freq: (architecture == Architecture::Gemma3).then_some(10_000.0),
            rope_scaling,
            rope_layout: match architecture {
                Architecture::Llama => RopeLayout::Interleaved,
                _ => RopeLayout::Halves,
            },
            max_position_embeddings: u("context_length").unwrap_or(2048),
            tie_word_embeddings: !has_output,
            attention_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
            sliding_window: if layer_types.contains(&LayerKind::Sliding) { sliding_window } else { None },
            layer_types,
            query_pre_attn_scalar: (architecture == Architecture::Gemma3).then_some(head_dim as f64),
            final_logit_softcapping: f("final_logit_softcapping"),
            attn_logit_softcapping: f("attn_logit_softcapping"),
            hidden_act: match architecture {
                Architecture::Gemma3 => Activation::GeluTanh,
                _ => Activation::Silu,
            },
            bos_token_id: id("tokenizer.ggml.bos_token_id"),
            eos_token_ids: id("tokenizer.ggml.eos_token_id").into_iter().collect(),
            partial_rotary_factor: 1.0,
            use_qk_norm: false,
            moe: None,
            mla: None,
            num_mtp_layers: 0,
            gemma4: None,
        };
        cfg.check()?;
        Ok(cfg)
    }
}
