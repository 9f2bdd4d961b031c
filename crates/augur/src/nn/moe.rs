//! Mixture of experts as DeepSeek-V3 and GLM-4.5 route it: sigmoid scores plus a correction bias choose the
//! experts (inside the best `topk_group` groups, each group scored by its top two), the unbiased scores weight
//! them (normalised when `norm_topk_prob`, then times `routed_scaling_factor`), and shared experts see every
//! token. The first `first_k_dense_replace` layers use a dense MLP instead.

use candle_core::{Device, Tensor};

use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Error, Result};
use crate::io::weights::Weights;
use crate::nn::Linear;
use crate::nn::Mlp;

pub struct SparseMoe {
    /// `[n_routed_experts, hidden]`, f32.
    router: Linear,
    correction_bias: Vec<f32>,
    experts: Vec<Mlp>,
    shared: Mlp,
    cfg: MoeConfig,
}

impl SparseMoe {
    /// Loads `{prefix}.gate`, `{prefix}.experts.{e}` and `{prefix}.shared_experts`.
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig, moe: &MoeConfig) -> Result<Self> {
        let e = moe.n_routed_experts;
        let experts = (0..e)
            .map(|i| Mlp::load_sized(w, &format!("{prefix}.experts.{i}"), cfg, moe.moe_intermediate_size))
            .collect::<Result<Vec<_>>>()?;
        let bias_name = format!("{prefix}.gate.e_score_correction_bias");
        let correction_bias =
            if w.contains(&bias_name) { w.f32(&bias_name, &[e])?.to_vec1::<f32>()? } else { vec![0.0; e] };
        Ok(Self {
            router: w.linear(&format!("{prefix}.gate"), e, cfg.hidden_size, false)?,
            correction_bias,
            experts,
            shared: Mlp::load_sized(
                w,
                &format!("{prefix}.shared_experts"),
                cfg,
                moe.moe_intermediate_size * moe.n_shared_experts,
            )?,
            cfg: moe.clone(),
        })
    }

    /// The chosen experts of one token and their weights, from its router logits.
    fn route(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        let c = &self.cfg;
        let scores: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
        let choice: Vec<f32> = scores.iter().zip(&self.correction_bias).map(|(s, b)| s + b).collect();
        let per_group = c.n_routed_experts / c.n_group;
        let group_score = |g: usize| {
            let mut v: Vec<f32> = choice[g * per_group..(g + 1) * per_group].to_vec();
            v.sort_by(|a, b| b.total_cmp(a));
            v[0] + v[1]
        };
        let mut groups: Vec<(usize, f32)> = (0..c.n_group).map(|g| (g, group_score(g))).collect();
        groups.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut allowed = vec![false; c.n_group];
        for (g, _) in groups.iter().take(c.topk_group) {
            allowed[*g] = true;
        }
        let mut candidates: Vec<usize> = (0..c.n_routed_experts).filter(|e| allowed[e / per_group]).collect();
        candidates.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
        candidates.truncate(c.num_experts_per_tok);
        let mut chosen: Vec<(usize, f32)> = candidates.iter().map(|&e| (e, scores[e])).collect();
        if c.norm_topk_prob {
            let denom = chosen.iter().map(|(_, w)| w).sum::<f32>() + 1e-20;
            chosen.iter_mut().for_each(|(_, w)| *w /= denom);
        }
        let scale = c.routed_scaling_factor as f32;
        chosen.iter_mut().for_each(|(_, w)| *w *= scale);
        // Experts are summed in index order, as Transformers' loop over the experts hit does.
        chosen.sort_by_key(|(e, _)| *e);
        chosen
    }

    /// `x`: `[1, t, hidden]` → `[1, t, hidden]`. Each token's sum runs over its experts in index order, the
    /// same whatever the other tokens of the block, so a block verification matches decoding one at a time.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (_, t, hidden) = x.dims3()?;
        let rows = x.reshape((t, hidden))?;
        let logits: Vec<Vec<f32>> = self.router.forward(&rows)?.to_vec2()?;
        let routes: Vec<Vec<(usize, f32)>> = logits.iter().map(|l| self.route(l)).collect();
        let mut out = vec![vec![0f32; hidden]; t];
        for (e, expert) in self.experts.iter().enumerate() {
            let tokens: Vec<(usize, f32)> = routes
                .iter()
                .enumerate()
                .filter_map(|(i, r)| r.iter().find(|(ee, _)| *ee == e).map(|(_, w)| (i, *w)))
                .collect();
            if tokens.is_empty() {
                continue;
            }
            let idx = Tensor::new(tokens.iter().map(|(i, _)| *i as u32).collect::<Vec<_>>(), &Device::Cpu)?
                .to_device(x.device())?;
            let y: Vec<Vec<f32>> = expert.forward(&rows.index_select(&idx, 0)?)?.to_vec2()?;
            for ((i, w), row) in tokens.iter().zip(y) {
                for (o, v) in out[*i].iter_mut().zip(row) {
                    *o += v * w;
                }
            }
        }
        let routed = Tensor::from_vec(out.concat(), (1, t, hidden), x.device())?;
        Ok((routed + self.shared.forward(x)?)?)
    }
}

/// The feed-forward part of a DeepSeek-V3 or GLM-4.5 block: dense in the first layers, experts after.
pub enum FeedForward {
    Dense(Mlp),
    Moe(SparseMoe),
}

impl FeedForward {
    /// Layer `layer` (MTP layers pass `first_dense = 0`: they are always experts).
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig, layer: usize, first_dense: usize) -> Result<Self> {
        let moe = cfg.moe.as_ref().ok_or_else(|| Error::config("n_routed_experts", "missing"))?;
        Ok(if layer < first_dense {
            FeedForward::Dense(Mlp::load(w, prefix, cfg)?)
        } else {
            FeedForward::Moe(SparseMoe::load(w, prefix, cfg, moe)?)
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Moe(m) => m.forward(x),
        }
    }
}
