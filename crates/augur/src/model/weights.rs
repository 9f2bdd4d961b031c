//! Weights from a GGUF file (quantized tensors, llama.cpp names) or a Hugging Face directory (safetensors,
//! single or sharded). Model files ask for tensors by their Hugging Face names; GGUF names are derived here,
//! in one place.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::config::Architecture;
#[cfg(target_arch = "x86_64")]
use super::kquants::SuperBlockMatrix;
use super::qkernels::{matmul_shared, matmul_silu_gated, BlockMatrix, QuantKernel, RowReader};
use crate::error::{Error, Result};

enum Source {
    /// Tensors are read from the file into memory one at a time (not mapped): the file's pages then stay in the
    /// page cache instead of adding to the process's resident memory next to the weights' own copies.
    Gguf { content: gguf_file::Content, file: Mutex<File> },
    Safetensors { tensors: candle_core::safetensors::MmapedSafetensors },
}

pub struct Weights {
    source: Source,
    path: PathBuf,
    arch: Architecture,
    device: Device,
    /// Dequantize every tensor to f32 at load: the reference path for comparing with another implementation.
    pub dequantize: bool,
}

/// A linear layer `y = x Wᵀ + b`; `W` is `[out, in]`, quantized or dense f32.
#[derive(Clone)]
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Tensor>,
}

#[derive(Clone)]
enum LinearWeight {
    Candle(QMatMul),
    /// Types with our own CPU kernels: the 32-element blocks (`qkernels`), Q4_K and Q6_K (`kquants`).
    Own(Arc<dyn QuantKernel>),
}

/// Which product a [`Linear`] runs, for tests that check each one was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearPath {
    /// One of our kernels (`qkernels`, `kquants`), for this stored type.
    Own(GgmlDType),
    /// candle's quantized product, for this stored type.
    Candle(GgmlDType),
    /// candle's dense f32 product (safetensors, float GGUF tensors, a dequantized load).
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
    fn from_stored(dtype: GgmlDType, n: usize, k: usize, read: &mut RowReader, bias: Option<Tensor>) -> Result<Option<Self>> {
        Ok(own_kernel(dtype, n, k, read)?.map(|b| Self { weight: LinearWeight::Own(b), bias }))
    }

    fn new(weight: QMatMul, bias: Option<Tensor>) -> Result<Self> {
        let weight = match &weight {
            QMatMul::QTensor(q) if q.device().is_cpu() => {
                match own_kernel_of(q)? {
                    Some(b) => LinearWeight::Own(b),
                    None => LinearWeight::Candle(weight),
                }
            }
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
        self.forward_first(x, usize::MAX)
    }

    /// The first `n` outputs of [`Self::forward`] (`[.., min(n, out)]`), each the same as in the full product:
    /// our kernels read only those weight rows (a drafter's shortened LM head).
    pub fn forward_first(&self, x: &Tensor, n: usize) -> Result<Tensor> {
        let in_dim = x.dim(candle_core::D::Minus1)?;
        let rows = x.elem_count() / in_dim;
        let y = match &self.weight {
            LinearWeight::Own(b) => {
                let y = b.matmul_first(&x.flatten_all()?.to_vec1::<f32>()?, rows, n.min(b.out_features()));
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
        let out = y.dim(candle_core::D::Minus1)?;
        let y = if n < out { y.narrow(candle_core::D::Minus1, 0, n)? } else { y };
        self.add_bias(y)
    }

    /// `y` (`[.., n]`, the first `n` outputs) plus the first `n` values of the bias, if any.
    fn add_bias(&self, y: Tensor) -> Result<Tensor> {
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(&b.narrow(0, 0, y.dim(candle_core::D::Minus1)?)?)?,
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
        let Some(y) = matmul_silu_gated(kernels[0], kernels[1], &x.flatten_all()?.to_vec1::<f32>()?, rows, in_dim) else {
            return Ok(None);
        };
        Ok(Some(shaped_like(x, y, rows)?))
    }
}

/// `y` (`rows` rows of values) as a tensor of `x`'s shape but for its last dimension.
fn shaped_like(x: &Tensor, y: Vec<f32>, rows: usize) -> Result<Tensor> {
    let mut shape = x.dims().to_vec();
    *shape.last_mut().expect("rank >= 1") = y.len() / rows.max(1);
    Ok(Tensor::from_vec(y, shape, x.device())?)
}

/// Token embeddings `[vocab, hidden]`. A quantized GGUF table stays in the file: each forward reads and
/// dequantizes the rows of its tokens, so the table (Qwen2.5-1.5B's is 131 MB) is not resident.
#[derive(Clone)]
pub enum Embedding {
    Dense(Tensor),
    Stored(Arc<StoredTable>),
}

/// A GGUF tensor's place in its file, read a row at a time.
pub struct StoredTable {
    file: Mutex<File>,
    path: PathBuf,
    name: String,
    /// Byte offset of row 0 in the file.
    start: u64,
    row_bytes: usize,
    dtype: GgmlDType,
    rows: usize,
    hidden: usize,
    /// The name the table is loaded under as an LM head (tied embeddings).
    hf_prefix: String,
}

impl Embedding {
    /// `ids`: `[k]` → `[k, hidden]` f32.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Embedding::Dense(t) => t.embedding(ids)?,
            Embedding::Stored(table) => table.rows(&ids.to_vec1::<u32>()?, ids.device())?,
        })
    }

    /// The same table as an LM head (tied embeddings).
    pub fn as_linear(&self, w: &Weights) -> Result<Linear> {
        let weight = match self {
            Embedding::Dense(t) => QMatMul::Tensor(t.clone()),
            Embedding::Stored(table) => return w.linear(&table.hf_prefix, table.rows, table.hidden, false),
        };
        Linear::new(weight, None)
    }
}

impl StoredTable {
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
            let row = candle_core::quantized::ggml_file::qtensor_from_ggml(self.dtype, &bytes, vec![self.hidden], &Device::Cpu)?;
            out.extend(row.dequantize(&Device::Cpu)?.to_vec1::<f32>()?);
        }
        Ok(Tensor::from_vec(out, (ids.len(), self.hidden), device)?)
    }
}

/// Reads `buf.len()` bytes at `offset` of `file`.
fn read_at(file: &Mutex<File>, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    // A panic elsewhere while holding the lock leaves the file handle as usable as before.
    let mut file = file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(buf)
}

/// Bytes of one stored row of `cols` elements of `dtype`. The reader checked every GGUF tensor's size and end
/// against the file ([`super::gguf::read`]), so row offsets within a tensor (`start + row · row_bytes`) stay
/// inside the file and cannot overflow.
fn row_bytes(dtype: GgmlDType, cols: usize) -> usize {
    cols / dtype.block_size() * dtype.type_size()
}

/// llama.cpp's name for a Hugging Face tensor name.
fn gguf_name(arch: Architecture, hf: &str) -> String {
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let Some(rest) = hf.strip_prefix("model.layers.") else { return hf.to_string() };
    let Some((layer, rest)) = rest.split_once('.') else { return hf.to_string() };
    let (module, suffix) = rest.rsplit_once('.').unwrap_or((rest, ""));
    let g = match module {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" if arch == Architecture::Gemma3 => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "pre_feedforward_layernorm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        other => other,
    };
    format!("blk.{layer}.{g}.{suffix}")
}

/// The shard files that `model.safetensors.index.json` (at `index`, read as `text`) lists, each inside `dir`.
///
/// A shard name must be a relative path of plain components: `..`, a root or a drive prefix would let a
/// downloaded index open files outside the model directory. The check is on the name, not on the resolved path,
/// since the Hugging Face cache keeps shards as symlinks into its blob store.
pub fn shard_paths(dir: &Path, index: &Path, text: &str) -> Result<Vec<PathBuf>> {
    let bad = |reason: String| Error::BadFile { path: index.to_path_buf(), format: "safetensors index", reason };
    let json: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad("no `weight_map` object".into()))?;
    let mut shards = Vec::new();
    for (tensor, shard) in map {
        let shard =
            shard.as_str().ok_or_else(|| bad(format!("`weight_map.{tensor}` should be a file name, found {shard}")))?;
        let plain =
            !shard.is_empty() && Path::new(shard).components().all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(bad(format!("`weight_map.{tensor}` = {shard:?} is not a file name inside the model directory")));
        }
        shards.push(dir.join(shard));
    }
    shards.sort();
    shards.dedup();
    Ok(shards)
}

fn gguf_error(path: &Path, reason: impl ToString) -> Error {
    Error::BadFile { path: path.to_path_buf(), format: "GGUF", reason: reason.to_string() }
}

impl Weights {
    /// Opens a GGUF file and checks that every tensor it lists lies inside the file (see [`super::gguf`]).
    pub fn open_gguf(path: &Path, device: &Device) -> Result<Self> {
        let f = File::open(path).map_err(|e| Error::io(path, e))?;
        let file_len = f.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut reader = std::io::BufReader::new(f);
        let content = super::gguf::read(&mut reader, file_len, path)?;
        let f = reader.into_inner();
        let arch_name = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok().cloned())
            .ok_or_else(|| Error::config("general.architecture", format!("missing from {}", path.display())))?;
        let arch = Architecture::parse(&arch_name)?;
        Ok(Weights {
            source: Source::Gguf { content, file: Mutex::new(f) },
            path: path.to_path_buf(),
            arch,
            device: device.clone(),
            dequantize: false,
        })
    }

    /// The GGUF file's metadata and tensor table; `None` for a safetensors directory.
    pub fn gguf(&self) -> Option<&gguf_file::Content> {
        match &self.source {
            Source::Gguf { content, .. } => Some(content),
            Source::Safetensors { .. } => None,
        }
    }

    /// Forgets the GGUF metadata and keeps the tensor table. Once the configuration and the tokenizer are read,
    /// the metadata is only memory: SmolLM2's vocabulary and merges take 6.3 MB as candle's values, otherwise held
    /// through the whole load.
    pub fn drop_gguf_metadata(&mut self) {
        if let Source::Gguf { content, .. } = &mut self.source {
            content.metadata = HashMap::new();
        }
    }

    /// Opens `model.safetensors` or the shards listed by `model.safetensors.index.json` in `dir`.
    pub fn open_safetensors(dir: &Path, arch: Architecture, device: &Device) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
            shard_paths(dir, &index, &text)?
        } else {
            return Err(Error::io(
                &single,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no model.safetensors nor model.safetensors.index.json"),
            ));
        };
        for f in &files {
            if !f.exists() {
                return Err(Error::io(f, std::io::Error::new(std::io::ErrorKind::NotFound, "shard listed in the index is missing")));
            }
        }
        // SAFETY: the files are mapped read-only and not modified while mapped.
        let tensors = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }.map_err(|e| {
            // Name the shard at fault: the first that does not open alone (SAFETY as above).
            let path = files
                .iter()
                .find(|f| unsafe { candle_core::safetensors::MmapedSafetensors::new(f) }.is_err())
                .unwrap_or(&dir.to_path_buf())
                .clone();
            Error::BadFile { path, format: "safetensors", reason: e.to_string() }
        })?;
        Ok(Weights {
            source: Source::Safetensors { tensors },
            path: dir.to_path_buf(),
            arch,
            device: device.clone(),
            dequantize: false,
        })
    }

    pub fn is_gguf(&self) -> bool {
        matches!(self.source, Source::Gguf { .. })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    fn stored_name(&self, hf: &str) -> String {
        match self.source {
            Source::Gguf { .. } => gguf_name(self.arch, hf),
            Source::Safetensors { .. } => hf.to_string(),
        }
    }

    pub fn contains(&self, hf: &str) -> bool {
        let name = self.stored_name(hf);
        match &self.source {
            Source::Gguf { content, .. } => content.tensor_infos.contains_key(&name),
            Source::Safetensors { tensors } => tensors.get(&name).is_ok(),
        }
    }

    fn missing(&self, name: String) -> Error {
        Error::MissingTensor { path: self.path.clone(), name }
    }

    fn check_shape(name: &str, actual: &[usize], expected: &[usize]) -> Result<()> {
        if actual != expected {
            return Err(Error::ShapeMismatch { name: name.to_string(), expected: expected.to_vec(), actual: actual.to_vec() });
        }
        Ok(())
    }

    /// A GGUF tensor's entry, with its shape checked.
    fn tensor_info<'c>(&self, content: &'c gguf_file::Content, name: &str, shape: &[usize]) -> Result<&'c gguf_file::TensorInfo> {
        let info = content.tensor_infos.get(name).ok_or_else(|| self.missing(name.to_string()))?;
        Self::check_shape(name, info.shape.dims(), shape)?;
        Ok(info)
    }

    fn qtensor(&self, content: &gguf_file::Content, file: &Mutex<File>, name: &str, shape: &[usize]) -> Result<QTensor> {
        let info = self.tensor_info(content, name, shape)?;
        // A panic elsewhere while holding the lock leaves the file handle as usable as before.
        let mut file = file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        info.read(&mut *file, content.tensor_data_offset, &self.device)
            .map_err(|e| gguf_error(&self.path, format!("tensor `{name}`: {e}")))
    }

    /// A tensor dequantized or converted to f32, with its shape checked.
    pub fn f32(&self, hf: &str, shape: &[usize]) -> Result<Tensor> {
        let name = self.stored_name(hf);
        match &self.source {
            Source::Gguf { content, file } => Ok(self.qtensor(content, file, &name, shape)?.dequantize(&self.device)?),
            Source::Safetensors { tensors } => {
                let view = tensors.get(&name).map_err(|_| self.missing(name.clone()))?;
                Self::check_shape(&name, view.shape(), shape)?;
                let t = tensors.load(&name, &self.device)?;
                Ok(t.to_dtype(DType::F32)?)
            }
        }
    }

    /// A weight used in products as stored (quantized) when it comes from a GGUF file; `None` where it is
    /// used as dense f32 instead: safetensors (bf16 is widened once here rather than on every product, see the
    /// CPU notes) or a dequantized load.
    fn quantized(&self, hf: &str, shape: &[usize]) -> Result<Option<Arc<QTensor>>> {
        match &self.source {
            Source::Gguf { content, file } if !self.dequantize => {
                Ok(Some(Arc::new(self.qtensor(content, file, &self.stored_name(hf), shape)?)))
            }
            _ => Ok(None),
        }
    }

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
        let weight = match self.quantized(&wname, &[out_dim, in_dim])? {
            Some(q) => QMatMul::from_arc(q)?,
            None => QMatMul::Tensor(self.f32(&wname, &[out_dim, in_dim])?),
        };
        Linear::new(weight, bias_of()?)
    }

    /// A quantized GGUF tensor `[rows, cols]` (shape checked) on a CPU load: its type and a reader of its
    /// stored rows, for kernels that regroup the rows at load.
    fn stored_rows(&self, hf: &str, shape: &[usize]) -> Result<Option<(GgmlDType, Box<RowReader<'_>>)>> {
        let Source::Gguf { content, file } = &self.source else { return Ok(None) };
        if self.dequantize || !self.device.is_cpu() {
            return Ok(None);
        }
        let name = self.stored_name(hf);
        let info = self.tensor_info(content, &name, shape)?;
        let dtype = info.ggml_dtype;
        let row_bytes = row_bytes(dtype, shape[1]);
        let start = content.tensor_data_offset + info.offset;
        let read = move |rows: std::ops::Range<usize>| -> Result<Vec<u8>> {
            let mut bytes = vec![0u8; rows.len() * row_bytes];
            read_at(file, start + (rows.start * row_bytes) as u64, &mut bytes)
                .map_err(|e| gguf_error(&self.path, format!("tensor `{name}`: {e}")))?;
            Ok(bytes)
        };
        Ok(Some((dtype, Box::new(read))))
    }

    pub fn embedding(&self, hf: &str, vocab: usize, hidden: usize) -> Result<Embedding> {
        if let Source::Gguf { content, .. } = &self.source {
            let name = self.stored_name(hf);
            let info = self.tensor_info(content, &name, &[vocab, hidden])?;
            let dtype = info.ggml_dtype;
            // Float tables are used dense, as are all tables of a dequantized load.
            if !self.dequantize && !matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
                let file = File::open(&self.path).map_err(|e| Error::io(&self.path, e))?;
                return Ok(Embedding::Stored(Arc::new(StoredTable {
                    file: Mutex::new(file),
                    path: self.path.clone(),
                    start: content.tensor_data_offset + info.offset,
                    row_bytes: row_bytes(dtype, hidden),
                    dtype,
                    rows: vocab,
                    hidden,
                    hf_prefix: hf.strip_suffix(".weight").unwrap_or(hf).to_string(),
                    name,
                })));
            }
        }
        Ok(Embedding::Dense(self.f32(hf, &[vocab, hidden])?))
    }

    /// Quantization types of the stored tensors with their counts, for `augur info`.
    pub fn dtype_summary(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        match &self.source {
            Source::Gguf { content, .. } => {
                for info in content.tensor_infos.values() {
                    *out.entry(format!("{:?}", info.ggml_dtype)).or_default() += 1;
                }
            }
            Source::Safetensors { tensors } => {
                for (_, view) in tensors.tensors() {
                    *out.entry(format!("{:?}", view.dtype())).or_default() += 1;
                }
            }
        }
        out
    }

    /// Number of parameters stored.
    pub fn parameter_count(&self) -> usize {
        match &self.source {
            Source::Gguf { content, .. } => content.tensor_infos.values().map(|i| i.shape.elem_count()).sum(),
            Source::Safetensors { tensors } => {
                tensors.tensors().iter().map(|(_, v)| v.shape().iter().product::<usize>()).sum()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn gguf_names_follow_llama_cpp() {
        let a = Architecture::Llama;
        assert_eq!(gguf_name(a, "model.layers.3.self_attn.q_proj.weight"), "blk.3.attn_q.weight");
        assert_eq!(gguf_name(a, "model.layers.0.self_attn.k_proj.bias"), "blk.0.attn_k.bias");
        assert_eq!(gguf_name(a, "model.layers.1.post_attention_layernorm.weight"), "blk.1.ffn_norm.weight");
        assert_eq!(
            gguf_name(Architecture::Gemma3, "model.layers.1.post_attention_layernorm.weight"),
            "blk.1.post_attention_norm.weight"
        );
        assert_eq!(gguf_name(a, "model.embed_tokens.weight"), "token_embd.weight");
        assert_eq!(gguf_name(a, "lm_head.weight"), "output.weight");
    }
}
