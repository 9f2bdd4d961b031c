//! Layers built from a checkpoint's tensors. [`Weights`] (in `io`) yields tensors, mapped matrices and readers of
//! stored rows; the methods here, on the same type so that model files read `w.linear(...)` as candle's read
//! `vb.get(...)`, turn them into [`Linear`], [`Embedding`] and [`StoredTable`] layers.

use std::fs::File;
use std::sync::{Arc, Mutex};

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::Tensor;

use super::{Embedding, Linear, StoredTable};
use crate::error::{Error, Result};
use crate::io::weights::Weights;

impl Weights {
    pub fn linear(&self, hf_prefix: &str, out_dim: usize, in_dim: usize, bias: bool) -> Result<Linear> {
        let wname = format!("{hf_prefix}.weight");
        let bias_of = || -> Result<Option<Tensor>> {
            Ok(if bias { Some(self.f32(&format!("{hf_prefix}.bias"), &[out_dim])?) } else { None })
        };
        if let Some((dtype, mut read)) = self.stored_rows(&wname, &[out_dim, in_dim])? {
            if let Some(linear) = Linear::from_stored(dtype, out_dim, in_dim, &mut read, bias_of()?)? {
                return Ok(linear);
            }
        }
        if let Some(dense) = self.dense(&wname, out_dim, in_dim)? {
            let quantized = self.quantize.and_then(|q| q.for_width(in_dim));
            return match quantized {
                Some(dtype) => {
                    let q = QTensor::quantize(&self.f32(&wname, &[out_dim, in_dim])?, dtype)?;
                    Linear::new(QMatMul::from_qtensor(q)?, bias_of()?)
                }
                None => Ok(Linear::dense(dense, bias_of()?)),
            };
        }
        let weight = match self.quantized(&wname, &[out_dim, in_dim])? {
            Some(q) => QMatMul::from_arc(q)?,
            None => QMatMul::Tensor(self.f32(&wname, &[out_dim, in_dim])?),
        };
        Linear::new(weight, bias_of()?)
    }

    pub fn embedding(&self, hf: &str, vocab: usize, hidden: usize) -> Result<Embedding> {
        if let Some(table) = self.dense(hf, vocab, hidden)? {
            let hf_prefix = hf.strip_suffix(".weight").unwrap_or(hf).to_string();
            return Ok(Embedding::Rows { table: Arc::new(table), hf_prefix });
        }
        if let Some(table) = self.stored_table(hf, vocab, hidden)? {
            return Ok(Embedding::Stored(Arc::new(table)));
        }
        Ok(Embedding::Dense(self.f32(hf, &[vocab, hidden])?))
    }

    /// A quantized GGUF tensor `[rows, cols]` (shape checked) left in its file, to be read a row at a time: a
    /// token embedding, or an LM head's rows for a drafter's reduced head. `None` for float tensors, which are
    /// used dense, as are all tensors of a dequantized load.
    pub fn stored_table(&self, hf: &str, rows: usize, cols: usize) -> Result<Option<StoredTable>> {
        let Some(at) = self.stored_rows_at(hf, rows, cols)? else { return Ok(None) };
        let file = File::open(&at.path).map_err(|e| Error::io(&at.path, e))?;
        Ok(Some(StoredTable {
            file: Mutex::new(file),
            path: at.path,
            start: at.start,
            row_bytes: at.row_bytes,
            dtype: at.dtype,
            rows,
            hidden: cols,
            hf_prefix: hf.strip_suffix(".weight").unwrap_or(hf).to_string(),
            name: at.name,
        }))
    }
}
