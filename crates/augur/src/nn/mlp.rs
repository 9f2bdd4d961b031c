//! The gated feed-forward layer.

use candle_core::{DType, Tensor};

use super::{flat, Linear};
use crate::config::{Activation, ModelConfig};
use crate::error::Result;
use crate::io::weights::Weights;

/// Gated feed-forward: `down(act(gate(x)) · up(x))`.
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
    act: Activation,
}

impl Mlp {
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig) -> Result<Self> {
        Self::load_sized(w, prefix, cfg, cfg.intermediate_size)
    }

    /// An MLP of another width than `intermediate_size` (experts, shared experts).
    pub fn load_sized(w: &Weights, prefix: &str, cfg: &ModelConfig, is: usize) -> Result<Self> {
        let hs = cfg.hidden_size;
        Ok(Self {
            gate: w.linear(&format!("{prefix}.gate_proj"), is, hs, false)?,
            up: w.linear(&format!("{prefix}.up_proj"), is, hs, false)?,
            down: w.linear(&format!("{prefix}.down_proj"), hs, is, false)?,
            act: cfg.hidden_act,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.act == Activation::Silu {
            if let Some(hidden) = Linear::silu_gated(&self.gate, &self.up, x)? {
                return self.down.forward(&hidden);
            }
        }
        let (gate, up) = (self.gate.forward(x)?, self.up.forward(x)?);
        let hidden = match self.act {
            Activation::Silu if gate.dtype() == DType::F32 && up.dtype() == DType::F32 => silu_mul(&gate, &up)?,
            Activation::Silu => (candle_nn::ops::silu(&gate)? * up)?,
            Activation::GeluTanh => (gate.gelu()? * up)?,
        };
        self.down.forward(&hidden)
    }
}

/// `silu(gate) · up` for f32 tensors of one shape (see [`super::silu`]).
fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let (g, mut u) = (flat(gate)?, flat(up)?);
    crate::kernels::activations::silu_mul(&g, &mut u);
    Ok(Tensor::from_vec(u, gate.shape(), gate.device())?)
}
