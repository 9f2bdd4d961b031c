//! Weights from a GGUF file (quantized tensors, llama.cpp names) or a Hugging Face directory (safetensors,
//! single or sharded). Model files ask for tensors by their Hugging Face names; GGUF names are derived here,
//! in one place. Weights yield tensors, mapped matrices and readers of stored rows; `nn::load` builds layers
//! from them.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use crate::config::Architecture;
use crate::error::{Error, Result};
use crate::kernels::dense::{DenseMatrix, Float};
use crate::kernels::mmap::{self, Mmap};
use crate::kernels::quant::RowReader;

enum Source {
    /// Tensors are read from the file into memory one at a time (not mapped): the file's pages then stay in the
    /// page cache instead of adding to the process's resident memory next to the weights' own copies.
    Gguf { content: gguf_file::Content, file: Mutex<File> },
    /// The files stay mapped: float weights are multiplied where they lie ([`DenseMatrix`]), never copied.
    Safetensors { files: Vec<Arc<Mmap>>, tensors: HashMap<String, StoredTensor> },
}

/// Where a safetensors tensor lies: bytes `start..end` of mapped file `file`.
struct StoredTensor {
    file: usize,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// Types a checkpoint's float weights can be quantized to as they load (`--quantize`): lossy against the
/// checkpoint, for speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantizeOnLoad {
    Q8_0,
    Q4K,
}

impl QuantizeOnLoad {
    pub const NAMES: &'static str = "q8_0, q4_k";

    pub fn parse(name: &str) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "q8_0" => Ok(Self::Q8_0),
            "q4_k" => Ok(Self::Q4K),
            other => {
                Err(Error::InvalidOption(format!("unknown quantization {other:?}: expected one of {}", Self::NAMES)))
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Q8_0 => "q8_0",
            Self::Q4K => "q4_k",
        }
    }

    /// The type a weight `in_dim` wide gets: Q4_K needs rows of whole 256-element super-blocks, Q8_0 rows of
    /// 32-element blocks (a weight with neither stays in its own type, as llama.cpp's quantizer falls back too).
    pub(crate) fn for_width(self, in_dim: usize) -> Option<GgmlDType> {
        match self {
            Self::Q4K if in_dim.is_multiple_of(256) => Some(GgmlDType::Q4K),
            _ if in_dim.is_multiple_of(32) => Some(GgmlDType::Q8_0),
            _ => None,
        }
    }
}

/// A float tensor's elements in their stored type, as f32 (exactly; 64-bit values rounded). `None` for a type
/// that is not a number augur reads.
fn widen(dtype: safetensors::Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    use safetensors::Dtype::*;
    fn each<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> f32) -> Vec<f32> {
        bytes.chunks_exact(N).map(|c| f(c.try_into().expect("N bytes"))).collect()
    }
    Some(match dtype {
        F64 => each(bytes, |b| f64::from_le_bytes(b) as f32),
        F32 => Float::F32.widen(bytes),
        F16 => Float::F16.widen(bytes),
        BF16 => Float::BF16.widen(bytes),
        I64 => each(bytes, |b| i64::from_le_bytes(b) as f32),
        I32 => each(bytes, |b| i32::from_le_bytes(b) as f32),
        I16 => each(bytes, |b| i16::from_le_bytes(b) as f32),
        I8 => each(bytes, |b: [u8; 1]| b[0] as i8 as f32),
        U64 => each(bytes, |b| u64::from_le_bytes(b) as f32),
        U32 => each(bytes, |b| u32::from_le_bytes(b) as f32),
        U16 => each(bytes, |b| u16::from_le_bytes(b) as f32),
        U8 | BOOL => each(bytes, |b: [u8; 1]| b[0] as f32),
        _ => return None,
    })
}

pub struct Weights {
    source: Source,
    path: PathBuf,
    arch: Architecture,
    device: Device,
    /// Dequantize every tensor to f32 at load: the reference path for comparing with another implementation.
    pub dequantize: bool,
    /// Quantize a checkpoint's float weights at load (lossy; safetensors only).
    pub quantize: Option<QuantizeOnLoad>,
}

/// A quantized GGUF tensor's place in its file: row `i` is the `row_bytes` bytes at `start + i · row_bytes`.
pub(crate) struct RowsAt {
    pub path: PathBuf,
    /// The tensor's name in the file.
    pub name: String,
    pub start: u64,
    pub row_bytes: usize,
    pub dtype: GgmlDType,
}

/// Reads `buf.len()` bytes at `offset` of `file`.
pub(crate) fn read_at(file: &Mutex<File>, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    // A panic elsewhere while holding the lock leaves the file handle as usable as before.
    let mut file = file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(buf)
}

/// Bytes of one stored row of `cols` elements of `dtype`. The reader checked every GGUF tensor's size and end
/// against the file ([`crate::io::gguf::read`]), so row offsets within a tensor (`start + row · row_bytes`) stay
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
            return Err(bad(format!(
                "`weight_map.{tensor}` = {shard:?} is not a file name inside the model directory"
            )));
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
    /// Opens a GGUF file and checks that every tensor it lists lies inside the file (see [`crate::io::gguf`]).
    pub fn open_gguf(path: &Path, device: &Device) -> Result<Self> {
        let f = File::open(path).map_err(|e| Error::io(path, e))?;
        let file_len = f.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut reader = std::io::BufReader::new(f);
        let content = crate::io::gguf::read(&mut reader, file_len, path)?;
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
            quantize: None,
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
    /// the metadata (a vocabulary and its merges as candle's values) is only memory, otherwise held through the whole
    /// load.
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
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no model.safetensors nor model.safetensors.index.json",
                ),
            ));
        };
        for f in &files {
            if !f.exists() {
                return Err(Error::io(
                    f,
                    std::io::Error::new(std::io::ErrorKind::NotFound, "shard listed in the index is missing"),
                ));
            }
        }
        let mut maps = Vec::with_capacity(files.len());
        let mut tensors = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            let map = mmap::map(f).map_err(|e| Error::io(f, e))?;
            let bad = |reason: String| Error::BadFile { path: f.clone(), format: "safetensors", reason };
            let (header, meta) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| bad(e.to_string()))?;
            // The data follows the 8-byte header length and the header; `read_metadata` checked that the
            // offsets tile exactly the rest of the file.
            let data = 8 + header;
            for (name, info) in meta.tensors() {
                let (start, end) = (data + info.data_offsets.0, data + info.data_offsets.1);
                let stored = StoredTensor { file: i, dtype: info.dtype, shape: info.shape.clone(), start, end };
                if tensors.insert(name.clone(), stored).is_some() {
                    return Err(bad(format!("tensor `{name}` is stored in more than one shard")));
                }
            }
            maps.push(Arc::new(map));
        }
        Ok(Weights {
            source: Source::Safetensors { files: maps, tensors },
            path: dir.to_path_buf(),
            arch,
            device: device.clone(),
            dequantize: false,
            quantize: None,
        })
    }

    /// A safetensors tensor's entry, with its shape checked.
    fn stored_tensor<'t>(
        &self,
        tensors: &'t HashMap<String, StoredTensor>,
        name: &str,
        shape: &[usize],
    ) -> Result<&'t StoredTensor> {
        let t = tensors.get(name).ok_or_else(|| self.missing(name.to_string()))?;
        Self::check_shape(name, &t.shape, shape)?;
        Ok(t)
    }

    /// A float weight `[n, k]` of a safetensors file, where it lies, for products on the CPU in its own type;
    /// `None` for a GGUF file, a dequantized load, another device or another type.
    pub(crate) fn dense(&self, hf: &str, n: usize, k: usize) -> Result<Option<DenseMatrix>> {
        let Source::Safetensors { files, tensors } = &self.source else { return Ok(None) };
        if self.dequantize || !self.device.is_cpu() {
            return Ok(None);
        }
        let t = self.stored_tensor(tensors, hf, &[n, k])?;
        let float = match t.dtype {
            safetensors::Dtype::F32 => Float::F32,
            safetensors::Dtype::F16 => Float::F16,
            safetensors::Dtype::BF16 => Float::BF16,
            _ => return Ok(None),
        };
        let file: crate::kernels::dense::Bytes = files[t.file].clone();
        Ok(DenseMatrix::new(file, t.start, float, n, k))
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
            Source::Safetensors { tensors, .. } => tensors.contains_key(&name),
        }
    }

    fn missing(&self, name: String) -> Error {
        Error::MissingTensor { path: self.path.clone(), name }
    }

    fn check_shape(name: &str, actual: &[usize], expected: &[usize]) -> Result<()> {
        if actual != expected {
            return Err(Error::ShapeMismatch {
                name: name.to_string(),
                expected: expected.to_vec(),
                actual: actual.to_vec(),
            });
        }
        Ok(())
    }

    /// A GGUF tensor's entry, with its shape checked.
    fn tensor_info<'c>(
        &self,
        content: &'c gguf_file::Content,
        name: &str,
        shape: &[usize],
    ) -> Result<&'c gguf_file::TensorInfo> {
        let info = content.tensor_infos.get(name).ok_or_else(|| self.missing(name.to_string()))?;
        Self::check_shape(name, info.shape.dims(), shape)?;
        Ok(info)
    }

    fn qtensor(
        &self,
        content: &gguf_file::Content,
        file: &Mutex<File>,
        name: &str,
        shape: &[usize],
    ) -> Result<QTensor> {
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
            Source::Gguf { content, file } => {
                Ok(self.qtensor(content, file, &name, shape)?.dequantize(&self.device)?)
            }
            Source::Safetensors { files, tensors } => {
                let t = self.stored_tensor(tensors, &name, shape)?;
                let values = widen(t.dtype, &files[t.file][t.start..t.end]).ok_or_else(|| Error::BadFile {
                    path: self.path.clone(),
                    format: "safetensors",
                    reason: format!("tensor `{name}` holds {:?}, not numbers augur reads", t.dtype),
                })?;
                Ok(Tensor::from_vec(values, shape, &self.device)?)
            }
        }
    }

    /// A weight used in products as stored (quantized) when it comes from a GGUF file; `None` where it is
    /// used as dense f32 instead: safetensors off the CPU, or a dequantized load.
    pub(crate) fn quantized(&self, hf: &str, shape: &[usize]) -> Result<Option<Arc<QTensor>>> {
        match &self.source {
            Source::Gguf { content, file } if !self.dequantize => {
                Ok(Some(Arc::new(self.qtensor(content, file, &self.stored_name(hf), shape)?)))
            }
            _ => Ok(None),
        }
    }

    /// A quantized GGUF tensor `[rows, cols]` (shape checked) on a CPU load: its type and a reader of its
    /// stored rows, for kernels that regroup the rows at load.
    pub(crate) fn stored_rows(&self, hf: &str, shape: &[usize]) -> Result<Option<(GgmlDType, Box<RowReader<'_>>)>> {
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

    /// Where a quantized GGUF tensor `[rows, cols]` (shape checked) lies in its file, for a table read a row at a
    /// time (see `Weights::stored_table`); `None` for float tensors and on a dequantized load.
    pub(crate) fn stored_rows_at(&self, hf: &str, rows: usize, cols: usize) -> Result<Option<RowsAt>> {
        let Source::Gguf { content, .. } = &self.source else { return Ok(None) };
        let name = self.stored_name(hf);
        let info = self.tensor_info(content, &name, &[rows, cols])?;
        let dtype = info.ggml_dtype;
        if self.dequantize || matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
            return Ok(None);
        }
        Ok(Some(RowsAt {
            path: self.path.clone(),
            start: content.tensor_data_offset + info.offset,
            row_bytes: row_bytes(dtype, cols),
            dtype,
            name,
        }))
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
            Source::Safetensors { tensors, .. } => {
                for t in tensors.values() {
                    *out.entry(format!("{:?}", t.dtype)).or_default() += 1;
                }
            }
        }
        out
    }

    /// Number of parameters stored.
    pub fn parameter_count(&self) -> usize {
        match &self.source {
            Source::Gguf { content, .. } => content.tensor_infos.values().map(|i| i.shape.elem_count()).sum(),
            Source::Safetensors { tensors, .. } => tensors.values().map(|t| t.shape.iter().product::<usize>()).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
