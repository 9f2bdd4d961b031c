//! Rotary position embeddings.

use candle_core::{Device, Tensor};

use crate::config::{ModelConfig, RopeLayout, RopeScaling};
use crate::error::{Error, Result};

#[derive(Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    layout: RopeLayout,
    /// Multiplies cos and sin (YaRN's attention factor; 1 otherwise).
    attention_scaling: f32,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64, scaling: &RopeScaling, layout: RopeLayout) -> Result<Self> {
        let half = head_dim / 2;
        let mut inv_freq: Vec<f64> = (0..half).map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)).collect();
        let mut attention_scaling = 1.0;
        match scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                let low_wavelen = original_max_position_embeddings / low_freq_factor;
                let high_wavelen = original_max_position_embeddings / high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (original_max_position_embeddings / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
            RopeScaling::Factors(factors) => {
                if factors.len() != half {
                    return Err(Error::ShapeMismatch {
                        name: "rope_freqs.weight".into(),
                        expected: vec![half],
                        actual: vec![factors.len()],
                    });
                }
                inv_freq.iter_mut().zip(factors).for_each(|(f, d)| *f /= *d as f64);
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => {
                // Transformers' `_compute_yarn_parameters`: dimensions below `low` keep their frequency
                // (extrapolation), those above `high` are divided by `factor`, with a linear ramp between.
                let dim = head_dim as f64;
                let correction = |rot: f64| {
                    let turns = original_max_position_embeddings / (rot * 2.0 * std::f64::consts::PI);
                    dim * turns.ln() / (2.0 * theta.ln())
                };
                let (mut low, mut high) = (correction(*beta_fast), correction(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
                if low == high {
                    high += 0.001;
                }
                for (i, f) in inv_freq.iter_mut().enumerate() {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    *f = *f / factor * (1.0 - extrapolation) + *f * extrapolation;
                }
                attention_scaling = *attention_factor as f32;
            }
        }
        Ok(Self { inv_freq: inv_freq.into_iter().map(|f| f as f32).collect(), layout, attention_scaling })
    }

    /// A table from its inverse frequencies (`head_dim / 2` of them; a zero leaves its pair of dimensions as is).
    pub fn from_inv_freq(inv_freq: Vec<f32>, layout: RopeLayout) -> Self {
        Self { inv_freq, layout, attention_scaling: 1.0 }
    }

    /// `cos` and `sin` for positions `start..start + t`, each `[t, head_dim / 2]`.
    pub fn cos_sin(&self, start: usize, t: usize, device: &Device) -> Result<(Tensor, Tensor)> {
        self.cos_sin_at(start..start + t, device)
    }

    /// `cos` and `sin` for each of `positions` (a tree block's rows sit at their depths), each `[t, head_dim / 2]`.
    pub fn cos_sin_at(
        &self,
        positions: impl ExactSizeIterator<Item = usize>,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let (half, t) = (self.inv_freq.len(), positions.len());
        let mut cos = Vec::with_capacity(t * half);
        let mut sin = Vec::with_capacity(t * half);
        for p in positions {
            for f in &self.inv_freq {
                // Angles in f32 as Transformers computes them (positions × inverse frequencies in f32).
                let a = p as f32 * f;
                cos.push(a.cos() * self.attention_scaling);
                sin.push(a.sin() * self.attention_scaling);
            }
        }
        Ok((Tensor::from_vec(cos, (t, half), device)?, Tensor::from_vec(sin, (t, half), device)?))
    }

    /// Rotates the first `2 · half` dimensions of each head of `x` (`[t, heads, head_dim]`, row `r` at the
    /// position of the table's row `r`) in place, with the table's `cos` and `sin` (`[t, half]`, flat): the
    /// arithmetic of candle's `rope`/`rope_i`, element for element, without their copies to and from
    /// `[heads, t, head_dim]` (most of their cost at a few rows).
    pub fn rotate(&self, x: &mut [f32], heads: usize, head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = self.inv_freq.len();
        for (h, v) in x.chunks_exact_mut(head_dim).enumerate() {
            let at = h / heads * half;
            let (cos, sin) = (&cos[at..at + half], &sin[at..at + half]);
            let v = &mut v[..2 * half];
            match self.layout {
                RopeLayout::Halves => {
                    let (a, b) = v.split_at_mut(half);
                    for i in 0..half {
                        let (x1, x2) = (a[i], b[i]);
                        a[i] = x1 * cos[i] - x2 * sin[i];
                        b[i] = x1 * sin[i] + x2 * cos[i];
                    }
                }
                RopeLayout::Interleaved => {
                    for (i, pair) in v.chunks_exact_mut(2).enumerate() {
                        let (x1, x2) = (pair[0], pair[1]);
                        pair[0] = x1 * cos[i] - x2 * sin[i];
                        pair[1] = x1 * sin[i] + x2 * cos[i];
                    }
                }
            }
        }
    }

    /// `x`: `[1, heads, t, head_dim]`.
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        Ok(match self.layout {
            RopeLayout::Halves => candle_nn::rotary_emb::rope(&x, cos, sin)?,
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(&x, cos, sin)?,
        })
    }
}

/// The rotary tables of full-attention and sliding-window layers.
#[derive(Clone)]
pub struct Ropes {
    pub full: Rope,
    pub sliding: Rope,
}

impl Ropes {
    pub fn new(cfg: &ModelConfig) -> Result<Self> {
        let dim = cfg.rotary_dim();
        let full = Rope::new(dim, cfg.rope_theta, &cfg.rope_scaling, cfg.rope_layout)?;
        let sliding = match cfg.rope_local_base_freq {
            // Gemma 3's local layers use their own base and no scaling.
            Some(base) => Rope::new(dim, base, &RopeScaling::None, cfg.rope_layout)?,
            None => Rope::new(dim, cfg.rope_theta, &cfg.rope_scaling, cfg.rope_layout)?,
        };
        Ok(Self { full, sliding })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::flat;

    fn filled(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i + seed) * 7919 % 997) as f32 / 498.5 - 1.0) * 2.0).collect()
    }

    /// `Rope::rotate` on `[t, heads, d]` gives candle's `rope`/`rope_i` on `[1, heads, t, d]`, bit for bit.
    #[test]
    fn rotate_is_candles_rope() {
        let (t, heads, d) = (5, 3, 16);
        for layout in [RopeLayout::Halves, RopeLayout::Interleaved] {
            let rope = Rope::new(d, 10_000.0, &RopeScaling::None, layout).unwrap();
            let (cos, sin) = rope.cos_sin(7, t, &Device::Cpu).unwrap();
            let x = filled(t * heads * d, 3);
            let want = rope
                .apply(
                    &Tensor::from_slice(&x, (1, t, heads, d), &Device::Cpu).unwrap().transpose(1, 2).unwrap(),
                    &cos,
                    &sin,
                )
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let mut ours = x.clone();
            rope.rotate(&mut ours, heads, d, &flat(&cos).unwrap(), &flat(&sin).unwrap());
            assert_eq!(
                ours.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            assert_ne!(ours, x);
        }
    }
}
