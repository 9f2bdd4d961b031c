//! Token embeddings.

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use candle_core::quantized::{GgmlDType, QMatMul};
use candle_core::{Device, Tensor};

use super::Linear;
use crate::error::{Error, Result};
use crate::io::weights::{read_at, Weights};
use crate::kernels::dense::DenseMatrix;
use crate::kernels::quant::QuantKernel;

/// Token embeddings `[vocab, hidden]`. A quantized GGUF table stays in the file: each forward reads and
/// dequantizes the rows of its tokens, so the table (Qwen2.5-1.5B's is 131 MB) is not resident. A safetensors
/// float table stays in its mapped file, its rows widened as they are looked up.
#[derive(Clone)]
pub enum Embedding {
    Dense(Tensor),
    Stored(Arc<StoredTable>),
    Rows { table: Arc<DenseMatrix>, hf_prefix: String },
}

/// A GGUF tensor's place in its file, read a row at a time.
pub struct StoredTable {
    pub(crate) file: Mutex<File>,
    pub(crate) path: PathBuf,
    pub(crate) name: String,
    /// Byte offset of row 0 in the file.
    pub(crate) start: u64,
    pub(crate) row_bytes: usize,
    pub(crate) dtype: GgmlDType,
    pub(crate) rows: usize,
    pub(crate) hidden: usize,
    /// The name the table is loaded under as an LM head (tied embeddings).
    pub(crate) hf_prefix: String,
}

impl Embedding {
    /// `ids`: `[k]` → `[k, hidden]` f32.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Embedding::Dense(t) => t.embedding(ids)?,
            Embedding::Stored(table) => table.rows(&ids.to_vec1::<u32>()?, ids.device())?,
            Embedding::Rows { table, hf_prefix } => {
                let ids = ids.to_vec1::<u32>()?;
                let mut out = Vec::with_capacity(ids.len() * table.in_features());
                for &id in &ids {
                    if id as usize >= table.out_features() {
                        return Err(Error::InvalidOption(format!(
                            "token id {id} is outside the {} rows of `{hf_prefix}.weight`",
                            table.out_features()
                        )));
                    }
                    out.extend(table.row(id as usize));
                }
                Tensor::from_vec(out, (ids.len(), table.in_features()), &Device::Cpu)?
            }
        })
    }

    /// The same table as an LM head (tied embeddings).
    pub fn as_linear(&self, w: &Weights) -> Result<Linear> {
        let weight = match self {
            Embedding::Dense(t) => QMatMul::Tensor(t.clone()),
            Embedding::Stored(table) => return w.linear(&table.hf_prefix, table.rows, table.hidden, false),
            Embedding::Rows { table, hf_prefix } => {
                return w.linear(hf_prefix, table.out_features(), table.in_features(), false)
            }
        };
        Linear::new(weight, None)
    }
}

impl StoredTable {
    /// The stored bytes of rows `ids`, one after the other (`ids.len() · row_bytes`); runs of consecutive ids
    /// are read at once.
    pub(crate) fn read_rows(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = vec![0u8; ids.len() * self.row_bytes];
        let mut i = 0;
        while i < ids.len() {
            let first = ids[i];
            if first as usize >= self.rows {
                return Err(super::linear::outside(first, self.rows));
            }
            let run = 1 + ids[i + 1..]
                .iter()
                .zip(first + 1..)
                .take_while(|(&id, next)| id == *next && (id as usize) < self.rows)
                .count();
            read_at(
                &self.file,
                self.start + first as u64 * self.row_bytes as u64,
                &mut out[i * self.row_bytes..(i + run) * self.row_bytes],
            )
            .map_err(|e| Error::io(&self.path, e))?;
            i += run;
        }
        Ok(out)
    }

    /// `[ids.len(), hidden]` f32 on `device`.
    fn rows(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        let mut out = Vec::with_capacity(ids.len() * self.hidden);
        let mut bytes = vec![0u8; self.row_bytes];
        for &id in ids {
            if id as usize >= self.rows {
                return Err(Error::InvalidOption(format!(
                    "token id {id} is outside the {} rows of `{}`",
                    self.rows, self.name
                )));
            }
            read_at(&self.file, self.start + id as u64 * self.row_bytes as u64, &mut bytes)
                .map_err(|e| Error::io(&self.path, e))?;
            let row = candle_core::quantized::ggml_file::qtensor_from_ggml(
                self.dtype,
                &bytes,
                vec![self.hidden],
                &Device::Cpu,
            )?;
            out.extend(row.dequantize(&Device::Cpu)?.to_vec1::<f32>()?);
        }
        Ok(Tensor::from_vec(out, (ids.len(), self.hidden), device)?)
    }
}
