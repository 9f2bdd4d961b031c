//! A linear layer over quantized or dense weights, and the token embedding table.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};

use candle_core::quantized::ggml_file::qtensor_from_ggml;

use super::StoredTable;
use crate::error::Result;
use crate::kernels::dense::DenseMatrix;
#[cfg(target_arch = "x86_64")]
use crate::kernels::quant::kquants::SuperBlockMatrix;
use crate::kernels::quant::{blocks32::BlockMatrix, matmul_shared, matmul_silu_gated, rows_of, QuantKernel, RowReader};

/// A linear layer `y = x Wᵀ + b`; `W` is `[out, in]`, quantized or dense (f32, f16, bf16).
#[derive(Clone)]
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Tensor>,
}

#[derive(Clone)]
enum LinearWeight {
    Candle(QMatMul),
    /// Types with our own CPU kernels: the 32-element blocks (`qkernels`), Q4_K and Q6_K (`kquants`), and
    /// safetensors' float weights in their own type (`kernels::dense`).
    Own(Arc<dyn QuantKernel>),
}

/// Which product a [`Linear`] runs, for tests that check each one was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearPath {
    /// One of our kernels (`qkernels`, `kquants`; `dense` for F32, F16 and BF16), for this stored type.
    Own(GgmlDType),
    /// candle's quantized product, for this stored type.
    Candle(GgmlDType),
    /// candle's dense f32 product (float GGUF tensors, a dequantized load, safetensors off the CPU).
    Dense,
}

/// Our kernel for a quantized weight `[n, k]` of `dtype`, built from its stored rows, where this machine has one.
fn own_kernel(dtype: GgmlDType, n: usize, k: usize, read: &mut RowReader) -> Result<Option<Arc<dyn QuantKernel>>> {
    if let Some(b) = BlockMatrix::from_stored(dtype, n, k, read)? {
        return Ok(Some(Arc::new(b)));
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(b) = SuperBlockMatrix::from_stored(dtype, n, k, read)? {
        return Ok(Some(Arc::new(b)));
    }
    Ok(None)
}

/// Our kernel for a loaded quantized weight, where this machine has one.
fn own_kernel_of(q: &QTensor) -> Result<Option<Arc<dyn QuantKernel>>> {
    if let Some(b) = BlockMatrix::from_qtensor(q)? {
        return Ok(Some(Arc::new(b)));
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(b) = SuperBlockMatrix::from_qtensor(q)? {
        return Ok(Some(Arc::new(b)));
    }
    Ok(None)
}

impl Linear {
    /// From a tensor's stored rows, where one of our kernels takes its type on this machine.
    pub(crate) fn from_stored(
        dtype: GgmlDType,
        n: usize,
        k: usize,
        read: &mut RowReader,
        bias: Option<Tensor>,
    ) -> Result<Option<Self>> {
        Ok(own_kernel(dtype, n, k, read)?.map(|b| Self { weight: LinearWeight::Own(b), bias }))
    }

    /// A float weight multiplied in its own type where it lies.
    pub(crate) fn dense(weight: DenseMatrix, bias: Option<Tensor>) -> Self {
        Self { weight: LinearWeight::Own(Arc::new(weight)), bias }
    }

    pub(crate) fn new(weight: QMatMul, bias: Option<Tensor>) -> Result<Self> {
        let weight = match &weight {
            QMatMul::QTensor(q) if q.device().is_cpu() => match own_kernel_of(q)? {
                Some(b) => LinearWeight::Own(b),
                None => LinearWeight::Candle(weight),
            },
            _ => LinearWeight::Candle(weight),
        };
        Ok(Self { weight, bias })
    }

    /// The product this layer runs.
    pub fn path(&self) -> LinearPath {
        match &self.weight {
            LinearWeight::Own(b) => LinearPath::Own(b.dtype()),
            LinearWeight::Candle(QMatMul::QTensor(q)) => LinearPath::Candle(q.dtype()),
            LinearWeight::Candle(QMatMul::Tensor(_) | QMatMul::TensorF16(_)) => LinearPath::Dense,
        }
    }

    /// The fewest and the most rows one call of candle's product may take for every row's sums to run in one
    /// order whatever the block, `in_dim` wide. Candle's Q6_K (x86) takes compact weights for one row and
    /// repacked tiles for more. Its dense product (the gemm crate) takes a matrix-vector loop for one row and a
    /// dot-product kernel while rows × outputs ≤ 256, then its general kernel, whose order depends on `in_dim`
    /// alone but for one switch: with at most 64 outputs it cuts an `in_dim` past 512 into chunks of 512 up to
    /// 64 rows and into chunks sized from the caches past them. `tests/bits.rs` checks these bounds.
    fn row_grouping(&self, in_dim: usize) -> (usize, usize) {
        match &self.weight {
            LinearWeight::Own(_) => (1, usize::MAX),
            LinearWeight::Candle(QMatMul::QTensor(q)) if q.dtype() == GgmlDType::Q6K => (2, usize::MAX),
            LinearWeight::Candle(QMatMul::QTensor(_)) => (1, usize::MAX),
            LinearWeight::Candle(QMatMul::Tensor(w) | QMatMul::TensorF16(w)) => {
                let out = w.dim(0).unwrap_or(1).max(1);
                let fewest = (256 / out + 1).max(2);
                let most = if out <= 64 && in_dim > 512 && fewest <= 64 { 64 } else { usize::MAX };
                (fewest, most)
            }
        }
    }

    /// `x`: `[.., in]` → `[.., out]`. Each row's result is the same whatever the number of rows, so a token
    /// verified in a block, or batched with other sequences, gets exactly the logits it would get decoded
    /// alone (greedy speculation is lossless bit for bit): where candle's kernels would switch with the row
    /// count, the rows go in runs that keep one kernel ([`Self::row_grouping`]), short runs padded with zeros.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let in_dim = x.dim(candle_core::D::Minus1)?;
        let rows = x.elem_count() / in_dim;
        let y = match &self.weight {
            LinearWeight::Own(b) => {
                let y = b.matmul_first(&x.flatten_all()?.to_vec1::<f32>()?, rows, b.out_features());
                shaped_like(x, y, rows)?
            }
            LinearWeight::Candle(w) => {
                let (fewest, most) = self.row_grouping(in_dim);
                if (fewest..=most).contains(&rows) {
                    w.forward(x)?
                } else {
                    let flat = x.reshape((rows, in_dim))?;
                    let mut parts = Vec::with_capacity(rows.div_ceil(most));
                    for start in (0..rows).step_by(most) {
                        let len = most.min(rows - start);
                        let part = flat.narrow(0, start, len)?;
                        let part = if len < fewest { part.pad_with_zeros(0, 0, fewest - len)? } else { part };
                        parts.push(w.forward(&part)?.narrow(0, 0, len)?);
                    }
                    let y = if parts.len() == 1 { parts.pop().expect("one run") } else { Tensor::cat(&parts, 0)? };
                    let mut out_shape = x.dims().to_vec();
                    *out_shape.last_mut().expect("rank >= 1") = y.dim(1)?;
                    y.reshape(out_shape)?
                }
            }
        };
        self.add_bias(y)
    }

    /// The layer of this one's output rows `ids` (weight `[ids.len(), in]`), each output as [`Self::forward`]
    /// computes it where the gathered rows keep their kernel: a drafter's LM head over part of the vocabulary.
    /// `stored`: the weight's rows as its GGUF file stores them, read from there when given (our quantized
    /// kernels regroup the rows at load and cannot hand one back). `None` where neither gives the rows.
    pub(crate) fn gather(&self, ids: &[u32], stored: Option<&StoredTable>) -> Result<Option<Self>> {
        let index = |device: &candle_core::Device| Tensor::from_slice(ids, ids.len(), device);
        let bias = match &self.bias {
            Some(b) => Some(b.index_select(&index(b.device())?, 0)?),
            None => None,
        };
        let n = ids.len();
        if let Some(table) = stored {
            let bytes = table.read_rows(ids)?;
            if let Some(l) =
                Self::from_stored(table.dtype, n, table.hidden, &mut rows_of(&bytes, table.row_bytes), bias.clone())?
            {
                return Ok(Some(l));
            }
            let q = qtensor_from_ggml(table.dtype, &bytes, vec![n, table.hidden], &candle_core::Device::Cpu)?;
            return Ok(Some(Self { weight: LinearWeight::Candle(QMatMul::from_qtensor(q)?), bias }));
        }
        let weight = match &self.weight {
            LinearWeight::Own(b) => match b.gather(ids)? {
                Some(g) => LinearWeight::Own(g),
                None => return Ok(None),
            },
            LinearWeight::Candle(QMatMul::Tensor(w)) => {
                LinearWeight::Candle(QMatMul::Tensor(w.index_select(&index(w.device())?, 0)?))
            }
            LinearWeight::Candle(QMatMul::TensorF16(w)) => {
                LinearWeight::Candle(QMatMul::TensorF16(w.index_select(&index(w.device())?, 0)?))
            }
            LinearWeight::Candle(QMatMul::QTensor(q)) => {
                let (rows, k) = q.shape().dims2()?;
                let data = q.data()?;
                let row_bytes = data.len() / rows.max(1);
                let mut bytes = Vec::with_capacity(n * row_bytes);
                for &id in ids {
                    let at = id as usize * row_bytes;
                    let row = data.get(at..at + row_bytes).ok_or_else(|| outside(id, rows))?;
                    bytes.extend_from_slice(row);
                }
                let q = qtensor_from_ggml(q.dtype(), &bytes, vec![n, k], &q.device())?;
                LinearWeight::Candle(QMatMul::from_qtensor(q)?)
            }
        };
        Ok(Some(Self { weight, bias }))
    }

    /// `y` (`[.., out]`) plus the bias, if any.
    fn add_bias(&self, y: Tensor) -> Result<Tensor> {
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// Our kernels of `linears`, if all of them have one.
    fn own_kernels<'a>(linears: &[&'a Linear]) -> Option<Vec<&'a dyn QuantKernel>> {
        linears
            .iter()
            .map(|l| match &l.weight {
                LinearWeight::Own(b) => Some(b.as_ref()),
                LinearWeight::Candle(_) => None,
            })
            .collect()
    }

    /// [`Self::forward`] of each of `linears` on the same `x` (`[.., in]`), such as a layer's q, k and v: one
    /// quantization of `x` and one parallel region for all where our kernels allow ([`matmul_shared`]), else
    /// one product after another; the same results either way.
    pub fn forward_shared(linears: &[&Linear], x: &Tensor) -> Result<Vec<Tensor>> {
        let in_dim = x.dim(candle_core::D::Minus1)?;
        let rows = x.elem_count() / in_dim;
        if let Some(kernels) = Self::own_kernels(linears) {
            if let Some(ys) = matmul_shared(&kernels, &x.flatten_all()?.to_vec1::<f32>()?, rows, in_dim) {
                return ys.into_iter().zip(linears).map(|(y, l)| l.add_bias(shaped_like(x, y, rows)?)).collect();
            }
        }
        linears.iter().map(|l| l.forward(x)).collect()
    }

    /// `silu(gate(x)) · up(x)` in one pass ([`matmul_silu_gated`]) where our kernels allow and neither has a
    /// bias; `None` otherwise, for the caller to take the two products.
    pub fn silu_gated(gate: &Linear, up: &Linear, x: &Tensor) -> Result<Option<Tensor>> {
        if gate.bias.is_some() || up.bias.is_some() || x.dtype() != DType::F32 {
            return Ok(None);
        }
        let Some(kernels) = Self::own_kernels(&[gate, up]) else { return Ok(None) };
        let in_dim = x.dim(candle_core::D::Minus1)?;
        let rows = x.elem_count() / in_dim;
        let Some(y) = matmul_silu_gated(kernels[0], kernels[1], &x.flatten_all()?.to_vec1::<f32>()?, rows, in_dim)
        else {
            return Ok(None);
        };
        Ok(Some(shaped_like(x, y, rows)?))
    }
}

/// The error for a gathered row past a weight's `rows`.
pub(crate) fn outside(id: u32, rows: usize) -> crate::error::Error {
    crate::error::Error::InvalidOption(format!("token id {id} is outside the {rows} rows of the LM head"))
}

/// `y` (`rows` rows of values) as a tensor of `x`'s shape but for its last dimension.
fn shaped_like(x: &Tensor, y: Vec<f32>, rows: usize) -> Result<Tensor> {
    let mut shape = x.dims().to_vec();
    *shape.last_mut().expect("rank >= 1") = y.len() / rows.max(1);
    Ok(Tensor::from_vec(y, shape, x.device())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QTensor;
    use candle_core::Device;

    /// A dense product gives each row the bits it gets alone, in any number of rows: across gemm's switches at
    /// one row, at rows × outputs = 256, and at 64 rows and outputs with more than 512 inputs.
    #[test]
    fn dense_rows_are_independent_of_the_block() {
        for (out, k) in [(3, 600), (32, 64), (48, 768), (64, 64), (128, 256), (200, 1536)] {
            let values = |n: usize, seed: usize| -> Vec<f32> {
                (0..n).map(|i| ((i * 7919 + seed) % 1013) as f32 / 506.5 - 1.0).collect()
            };
            let w = Tensor::from_vec(values(out * k, 1), (out, k), &Device::Cpu).unwrap();
            let linear = Linear::new(QMatMul::Tensor(w), None).unwrap();
            assert_eq!(linear.path(), LinearPath::Dense);
            let x = values(100 * k, 2);
            let alone: Vec<Vec<f32>> = (0..100)
                .map(|r| {
                    let row = Tensor::from_slice(&x[r * k..(r + 1) * k], (1, 1, k), &Device::Cpu).unwrap();
                    linear.forward(&row).unwrap().flatten_all().unwrap().to_vec1().unwrap()
                })
                .collect();
            for rows in [2, 3, 5, 8, 9, 16, 17, 64, 65, 100] {
                let block = Tensor::from_slice(&x[..rows * k], (1, rows, k), &Device::Cpu).unwrap();
                let y: Vec<Vec<f32>> = linear.forward(&block).unwrap().squeeze(0).unwrap().to_vec2().unwrap();
                for (r, row) in y.iter().enumerate() {
                    let same = row.iter().zip(&alone[r]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{out} outputs, {k} inputs: row {r} of {rows}");
                }
            }
        }
    }

    /// candle's quantized products give each row the bits it gets alone, for the types our kernels take where
    /// this machine has them too: what runs where it has not (its repacked x86 tiles, AMX past 31 rows).
    #[test]
    fn candle_quantized_rows_are_independent_of_the_block() {
        let (out, k) = (256, 512);
        let values = |n: usize, seed: usize| -> Vec<f32> {
            (0..n).map(|i| ((i * 7919 + seed) % 1013) as f32 / 506.5 - 1.0).collect()
        };
        let w = Tensor::from_vec(values(out * k, 1), (out, k), &Device::Cpu).unwrap();
        let x = values(40 * k, 2);
        use GgmlDType::*;
        for dtype in [Q4_0, Q4_1, Q5_0, Q8_0, Q4K, Q6K] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let linear = Linear { weight: LinearWeight::Candle(QMatMul::from_qtensor(q).unwrap()), bias: None };
            assert_eq!(linear.path(), LinearPath::Candle(dtype));
            let alone: Vec<Vec<f32>> = (0..40)
                .map(|r| {
                    let row = Tensor::from_slice(&x[r * k..(r + 1) * k], (1, 1, k), &Device::Cpu).unwrap();
                    linear.forward(&row).unwrap().flatten_all().unwrap().to_vec1().unwrap()
                })
                .collect();
            for rows in [2, 3, 4, 5, 8, 9, 16, 31, 32, 33, 40] {
                let block = Tensor::from_slice(&x[..rows * k], (1, rows, k), &Device::Cpu).unwrap();
                let y: Vec<Vec<f32>> = linear.forward(&block).unwrap().squeeze(0).unwrap().to_vec2().unwrap();
                for (r, row) in y.iter().enumerate() {
                    let same = row.iter().zip(&alone[r]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{dtype:?}: row {r} of {rows}");
                }
            }
        }
    }
}
