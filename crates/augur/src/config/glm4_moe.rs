//! GLM-4.5's `config.json` (Transformers' `Glm4MoeConfig`).

use serde::Deserialize;

use super::deepseek_v3::{MoeDefaults, MoeJson};
use super::hf::{Base, Defaults};
use super::{Architecture, ModelConfig};
use crate::error::{Error, Result};

#[derive(Debug, Deserialize)]
pub(super) struct Glm4MoeJson {
    #[serde(flatten)]
    base: Base,
    #[serde(flatten)]
    moe: MoeJson,
    /// Read where `rope_parameters` does not give it.
    partial_rotary_factor: Option<f64>,
    use_qk_norm: Option<bool>,
}

impl TryFrom<Glm4MoeJson> for ModelConfig {
    type Error = Error;

    fn try_from(c: Glm4MoeJson) -> Result<Self> {
        let defaults = Defaults { rms_norm_eps: 1e-5, ..Defaults::default() };
        let (mut cfg, rope) = c.base.into_model_config(Architecture::Glm4Moe, defaults)?;
        cfg.num_mtp_layers = c.moe.num_nextn_predict_layers.unwrap_or(1);
        cfg.moe = Some(c.moe.into_moe_config(MoeDefaults {
            moe_intermediate_size: 1408,
            n_routed_experts: 128,
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: 1.0,
            first_k_dense_replace: 1,
        })?);
        cfg.partial_rotary_factor = rope.partial_rotary_factor.or(c.partial_rotary_factor).unwrap_or(0.5);
        cfg.use_qk_norm = c.use_qk_norm.unwrap_or(false);
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Architecture, ModelConfig};

    /// The published GLM-4.5 `config.json`.
    const GLM_4_5: &str = r#"{"architectures":["Glm4MoeForCausalLM"],"attention_bias":true,"head_dim":128,
        "hidden_act":"silu","hidden_size":5120,"intermediate_size":12288,"max_position_embeddings":131072,
        "model_type":"glm4_moe","moe_intermediate_size":1536,"n_group":1,"n_routed_experts":160,
        "n_shared_experts":1,"norm_topk_prob":true,"num_attention_heads":96,"num_experts_per_tok":8,
        "num_hidden_layers":92,"num_key_value_heads":8,"num_nextn_predict_layers":1,"partial_rotary_factor":0.5,
        "rms_norm_eps":1e-05,"rope_scaling":null,"rope_theta":1000000,"routed_scaling_factor":2.5,
        "tie_word_embeddings":false,"topk_group":1,"use_qk_norm":true,"vocab_size":151552,
        "first_k_dense_replace":3,"eos_token_id":[151329,151336,151338],"pad_token_id":151329}"#;

    #[test]
    fn reads_the_published_glm_4_5_config() {
        let c = ModelConfig::from_hf_json(GLM_4_5).unwrap();
        assert_eq!(c.architecture, Architecture::Glm4Moe);
        assert_eq!((c.head_dim, c.rotary_dim(), c.num_mtp_layers), (128, 64, 1));
        assert!(c.use_qk_norm && c.attention_bias && c.mla.is_none());
        assert_eq!(c.rope_theta, 1_000_000.0);
        assert_eq!(c.moe.unwrap().n_routed_experts, 160);
        assert_eq!(c.eos_token_ids, vec![151329, 151336, 151338]);
    }
}
