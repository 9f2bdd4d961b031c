//! Root-mean-square norm.

use candle_core::{DType, Tensor};

use super::flat;
use crate::error::{Error, Result};
use crate::io::weights::Weights;

/// Root-mean-square norm. Gemma stores `w − 1` in its Hugging Face checkpoints (it scales by `1 + w`), while
/// llama.cpp's converter already adds the 1: `plus_one` says which form is stored.
#[derive(Clone)]
pub struct RmsNorm {
    weight: Tensor,
    /// `weight`'s values, for the CPU path.
    alpha: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    pub fn load(w: &Weights, name: &str, dim: usize, eps: f64, plus_one: bool) -> Result<Self> {
        let mut weight = w.f32(name, &[dim])?;
        if plus_one && !w.is_gguf() {
            weight = (weight + 1.0)?;
        }
        Ok(Self { alpha: weight.to_vec1::<f32>()?, weight, eps: eps as f32 })
    }

    /// Normalizes over the last dimension. On the CPU in f32, candle's arithmetic in candle's order (each row's
    /// sum of squares a serial chain from its first element), with the chains of four rows run side by side:
    /// candle ran them one after another, so a verified block paid each row's chain in full.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !x.device().is_cpu() || x.dtype() != DType::F32 {
            return Ok(candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)?);
        }
        let n = self.alpha.len();
        if n == 0 || x.dim(candle_core::D::Minus1)? != n {
            return Err(Error::ShapeMismatch {
                name: "rms norm input (last dimension)".into(),
                expected: vec![n],
                actual: x.dims().to_vec(),
            });
        }
        let mut v = flat(x)?;
        // Up to four rows at a time: their sums side by side, then each row scaled.
        let norm_rows = |rows: &mut [f32]| {
            let mut sums = [0f32; 4];
            match rows.len() / n {
                4 => sums = sums_of_squares::<4>(rows, n),
                3 => sums[..3].copy_from_slice(&sums_of_squares::<3>(rows, n)),
                2 => sums[..2].copy_from_slice(&sums_of_squares::<2>(rows, n)),
                _ => sums[..1].copy_from_slice(&sums_of_squares::<1>(rows, n)),
            }
            for (row, sum) in rows.chunks_exact_mut(n).zip(sums) {
                let m = (sum / n as f32 + self.eps).sqrt();
                for (e, a) in row.iter_mut().zip(&self.alpha) {
                    *e = *e / m * a;
                }
            }
        };
        // Over the pool past 32 rows, as candle does.
        if v.len() <= 32 * n {
            v.chunks_mut(4 * n).for_each(norm_rows);
        } else {
            use rayon::prelude::*;
            v.par_chunks_mut(4 * n).for_each(norm_rows);
        }
        Ok(Tensor::from_vec(v, x.shape(), x.device())?)
    }
}

/// `Σ x²` of each of the `R` rows of `n` in `rows`, each a serial chain in element order (candle's order), the
/// chains side by side.
fn sums_of_squares<const R: usize>(rows: &[f32], n: usize) -> [f32; R] {
    let row: [&[f32]; R] = std::array::from_fn(|r| &rows[r * n..(r + 1) * n]);
    let mut acc = [0f32; R];
    for i in 0..n {
        for (a, x) in acc.iter_mut().zip(&row) {
            *a += x[i] * x[i];
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn filled(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i + seed) * 7919 % 997) as f32 / 498.5 - 1.0) * 2.0).collect()
    }

    /// The CPU norm gives candle's bits for any number of rows (alone, in groups side by side, over the pool).
    #[test]
    fn rms_norm_matches_candle_bit_for_bit() {
        for (rows, n) in [(1, 576), (3, 576), (8, 64), (9, 100), (40, 96), (1, 1536)] {
            let alpha = filled(n, 5);
            let weight = Tensor::from_vec(alpha.clone(), n, &Device::Cpu).unwrap();
            let norm = RmsNorm { weight: weight.clone(), alpha, eps: 1e-5 };
            let x = Tensor::from_vec(filled(rows * n, rows), (1, rows, n), &Device::Cpu).unwrap();
            let ours = norm.forward(&x).unwrap();
            let candle = candle_nn::ops::rms_norm(&x, &weight, 1e-5).unwrap();
            assert_eq!(ours.dims(), candle.dims());
            assert_eq!(flat(&ours).unwrap(), flat(&candle).unwrap(), "{rows} rows of {n}");
        }
    }
}
