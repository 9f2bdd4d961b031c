//! DeepSeek-V3's `config.json` (Transformers' `DeepseekV3Config`), and the routed-experts fields GLM-4.5 shares.

use serde::Deserialize;

use super::hf::{yarn_mscale, Base, Defaults};
use super::{Architecture, MlaConfig, ModelConfig, MoeConfig};
use crate::error::{Error, Result};

/// The mixture-of-experts fields of DeepSeek-V3 and GLM-4.5.
#[derive(Debug, Deserialize)]
pub(super) struct MoeJson {
    moe_intermediate_size: Option<usize>,
    n_routed_experts: Option<usize>,
    n_shared_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    routed_scaling_factor: Option<f64>,
    norm_topk_prob: Option<bool>,
    first_k_dense_replace: Option<usize>,
    /// MTP layers stored after the decoder layers; not a Transformers field.
    #[serde(alias = "num_mtp_layers")]
    pub num_nextn_predict_layers: Option<usize>,
}

/// The architecture's defaults for the [`MoeJson`] fields.
pub(super) struct MoeDefaults {
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f64,
    pub first_k_dense_replace: usize,
}

impl MoeJson {
    /// Checks the routing can run: groups split the experts evenly, and top-k fits both.
    pub fn into_moe_config(self, d: MoeDefaults) -> Result<MoeConfig> {
        let n_routed_experts = self.n_routed_experts.unwrap_or(d.n_routed_experts);
        let n_group = self.n_group.unwrap_or(d.n_group);
        let num_experts_per_tok = self.num_experts_per_tok.unwrap_or(8);
        if n_group == 0 || !n_routed_experts.is_multiple_of(n_group) {
            return Err(Error::config(
                "n_group",
                format!("{n_group} does not divide n_routed_experts = {n_routed_experts}"),
            ));
        }
        let topk_group = self.topk_group.unwrap_or(d.topk_group);
        if topk_group == 0 || topk_group > n_group || num_experts_per_tok == 0 || num_experts_per_tok > n_routed_experts
        {
            return Err(Error::config(
                "topk_group",
                "needs 1 <= topk_group <= n_group and 1 <= num_experts_per_tok <= n_routed_experts",
            ));
        }
        if n_routed_experts / n_group < 2 {
            return Err(Error::config(
                "n_group",
                "each group needs at least 2 experts (groups are scored by their top 2)",
            ));
        }
        Ok(MoeConfig {
            moe_intermediate_size: self.moe_intermediate_size.unwrap_or(d.moe_intermediate_size),
            n_routed_experts,
            n_shared_experts: self.n_shared_experts.unwrap_or(1),
            num_experts_per_tok,
            n_group,
            topk_group,
            routed_scaling_factor: self.routed_scaling_factor.unwrap_or(d.routed_scaling_factor),
            norm_topk_prob: self.norm_topk_prob.unwrap_or(true),
            first_k_dense_replace: self.first_k_dense_replace.unwrap_or(d.first_k_dense_replace),
        })
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct DeepseekV3Json {
    #[serde(flatten)]
    base: Base,
    #[serde(flatten)]
    moe: MoeJson,
    /// `null` in DeepSeek configs means a full-rank `q_proj`.
    #[serde(default, deserialize_with = "explicit_null")]
    q_lora_rank: Option<Option<usize>>,
    kv_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    rope_interleave: Option<bool>,
}

/// Tells a field set to `null` (`Some(None)`) from an absent one (`None`).
fn explicit_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Option<usize>>, D::Error> {
    Ok(Some(Option::deserialize(d)?))
}

impl TryFrom<DeepseekV3Json> for ModelConfig {
    type Error = Error;

    fn try_from(mut c: DeepseekV3Json) -> Result<Self> {
        let qk_nope_head_dim = c.qk_nope_head_dim.unwrap_or(128);
        let qk_rope_head_dim = c.qk_rope_head_dim.unwrap_or(64);
        // Transformers sets DeepSeek's `head_dim` to the rotary part of each head.
        c.base.head_dim = Some(qk_rope_head_dim);
        let (mut cfg, rope) = c.base.into_model_config(Architecture::DeepseekV3, Defaults::default())?;
        cfg.num_mtp_layers = c.moe.num_nextn_predict_layers.unwrap_or(1);
        cfg.moe = Some(c.moe.into_moe_config(MoeDefaults {
            moe_intermediate_size: 2048,
            n_routed_experts: 256,
            n_group: 8,
            topk_group: 4,
            routed_scaling_factor: 2.5,
            first_k_dense_replace: 3,
        })?);
        let mut softmax_scale = (qk_nope_head_dim as f64 + qk_rope_head_dim as f64).powf(-0.5);
        if let Some((all_dim, factor)) = rope.mscale_all_dim.filter(|(m, _)| *m != 0.0) {
            let m = yarn_mscale(factor, all_dim);
            softmax_scale *= m * m;
        }
        cfg.mla = Some(MlaConfig {
            q_lora_rank: c.q_lora_rank.unwrap_or(Some(1536)),
            kv_lora_rank: c.kv_lora_rank.unwrap_or(512),
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim: c.v_head_dim.unwrap_or(128),
            rope_interleave: c.rope_interleave.unwrap_or(true),
            softmax_scale,
        });
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Architecture, ModelConfig, RopeScaling};

    /// The published DeepSeek-V3 `config.json` (Transformers 4 layout: `rope_scaling`, `type: yarn`).
    const DEEPSEEK_V3: &str = r#"{"architectures":["DeepseekV3ForCausalLM"],"model_type":"deepseek_v3",
        "vocab_size":129280,"hidden_size":7168,"intermediate_size":18432,"moe_intermediate_size":2048,
        "num_hidden_layers":61,"num_nextn_predict_layers":1,"num_attention_heads":128,"num_key_value_heads":128,
        "n_shared_experts":1,"n_routed_experts":256,"routed_scaling_factor":2.5,"kv_lora_rank":512,
        "q_lora_rank":1536,"qk_rope_head_dim":64,"v_head_dim":128,"qk_nope_head_dim":128,"topk_method":"noaux_tc",
        "n_group":8,"topk_group":4,"num_experts_per_tok":8,"first_k_dense_replace":3,"norm_topk_prob":true,
        "scoring_func":"sigmoid","hidden_act":"silu","max_position_embeddings":163840,"rms_norm_eps":1e-06,
        "rope_theta":10000,"rope_scaling":{"beta_fast":32,"beta_slow":1,"factor":40,"mscale":1.0,
        "mscale_all_dim":1.0,"original_max_position_embeddings":4096,"type":"yarn"},"tie_word_embeddings":false,
        "bos_token_id":0,"eos_token_id":1,"attention_bias":false}"#;

    #[test]
    fn reads_the_published_deepseek_v3_config() {
        let c = ModelConfig::from_hf_json(DEEPSEEK_V3).unwrap();
        assert_eq!(c.architecture, Architecture::DeepseekV3);
        assert_eq!(c.head_dim, 64, "the rotary part of each head");
        assert_eq!(c.num_mtp_layers, 1);
        let mla = c.mla.unwrap();
        assert_eq!((mla.q_lora_rank, mla.kv_lora_rank, mla.v_head_dim), (Some(1536), 512, 128));
        // 192^-0.5 · (0.1 · ln 40 + 1)²
        let m = 0.1 * 40f64.ln() + 1.0;
        assert!((mla.softmax_scale - 192f64.powf(-0.5) * m * m).abs() < 1e-12);
        let moe = c.moe.unwrap();
        assert_eq!((moe.n_routed_experts, moe.n_group, moe.topk_group, moe.first_k_dense_replace), (256, 8, 4, 3));
        match c.rope_scaling {
            RopeScaling::Yarn { factor, attention_factor, original_max_position_embeddings, .. } => {
                assert_eq!((factor, original_max_position_embeddings), (40.0, 4096.0));
                assert_eq!(attention_factor, 1.0, "mscale / mscale_all_dim");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_expert_groups_that_do_not_divide_the_experts() {
        let bad = DEEPSEEK_V3.replace(r#""n_group":8"#, r#""n_group":7"#);
        assert!(ModelConfig::from_hf_json(&bad).unwrap_err().to_string().contains("n_group"));
    }
}
