//! The GGUF header, metadata and tensor table, read with limits.
//!
//! This is our own reader rather than candle's `gguf_file::Content::read` because model files come from
//! strangers and candle's reader trusts them: it panics on `general.alignment = 0` (`div_ceil(0)`), lets a
//! 1 KiB array on disk become 32 KiB of `Value`s with no overall bound, keeps the last of duplicate keys or
//! tensor names, and leaves tensor sizes and `offset + size` to unchecked arithmetic later. It produces the
//! same `Content` (so the rest of the engine and candle's `TensorInfo::read` work unchanged), with every count,
//! length and size checked against the limits below and against the file's length, and every failure a
//! [`Error::BadFile`] naming the file and the key or tensor.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value, VersionedMagic};
use candle_core::quantized::GgmlDType;

use crate::error::{Error, Result};

/// Most tensors a file may list (DeepSeek-V3's GGUF has about 1,100).
pub const MAX_TENSORS: u64 = 1 << 16;
/// Most metadata entries (real files have a few dozen).
pub const MAX_METADATA_ENTRIES: u64 = 1 << 16;
/// Longest key or tensor name in bytes (llama.cpp's names are under 64).
pub const MAX_NAME_LEN: u64 = 1 << 16;
/// Longest string value in bytes (chat templates are the longest, tens of KiB).
pub const MAX_STRING_LEN: u64 = 1 << 24;
/// Most elements of one array (vocabularies have up to a few hundred thousand tokens).
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
/// Deepest nesting of arrays in arrays (real files do not nest).
pub const MAX_DEPTH: usize = 4;
/// Bytes of memory the metadata may take as values: each element of an array is one candle `Value` (32 bytes)
/// whatever its size on disk, so this bounds what a file of small elements costs (Gemma 3's 262,144-token
/// vocabulary takes about 30 MB).
pub const MAX_METADATA_MEMORY: u64 = 1 << 28;
/// Largest `general.alignment` (llama.cpp writes 32).
pub const MAX_ALIGNMENT: u64 = 1 << 16;
/// Most dimensions of a tensor (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;

const DEFAULT_ALIGNMENT: u64 = 32;

/// Reads the GGUF header, metadata and tensor table from `reader`, which holds a file of `file_len` bytes from its
/// start; checks that every tensor lies inside the file. `path` names the file in errors.
pub fn read(reader: &mut impl Read, file_len: u64, path: &Path) -> Result<Content> {
    let mut r = Reader { inner: reader, pos: 0, file_len, path, memory: 0, v1: false };
    let magic = r.u32("the magic number")?;
    if magic != 0x4655_4747 && magic != 0x4747_5546 {
        return Err(r.bad(format!("bad magic number 0x{magic:08x} (expected `GGUF`)")));
    }
    let magic = match r.u32("the version")? {
        1 => VersionedMagic::GgufV1,
        2 => VersionedMagic::GgufV2,
        3 => VersionedMagic::GgufV3,
        v => return Err(r.bad(format!("unsupported version {v} (supported: 1, 2, 3)"))),
    };
    r.v1 = magic == VersionedMagic::GgufV1;
    let tensor_count = r.length("the tensor count")?;
    let kv_count = r.length("the metadata count")?;
    r.limit("the tensor count", tensor_count, MAX_TENSORS)?;
    r.limit("the metadata count", kv_count, MAX_METADATA_ENTRIES)?;
    // Each entry takes at least its name's length prefix, a type and one byte; each tensor its name's length
    // prefix, a dimension count, a type and an offset.
    let prefix = r.prefix_len();
    let needed = kv_count * (prefix + 5) + tensor_count * (prefix + 16);
    r.fits("the header", needed)?;

    let mut metadata = HashMap::with_capacity(kv_count as usize);
    for _ in 0..kv_count {
        let key = r.string(MAX_NAME_LEN, "a metadata key")?;
        let ty = r.u32(&format!("the type of `{key}`"))?;
        let value = r.value(ty, 0, &format!("metadata `{key}`"))?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(r.bad(format!("metadata key `{key}` appears twice")));
        }
    }

    let mut tensor_infos = HashMap::with_capacity(tensor_count as usize);
    for _ in 0..tensor_count {
        let name = r.string(MAX_NAME_LEN, "a tensor name")?;
        let n_dims = r.u32(&format!("tensor `{name}`'s dimension count"))?;
        if n_dims > MAX_DIMS {
            return Err(r.bad(format!("tensor `{name}` has {n_dims} dimensions (at most {MAX_DIMS})")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = r.length(&format!("tensor `{name}`'s shape"))?;
            dims.push(usize::try_from(d).map_err(|_| r.bad(format!("tensor `{name}`: dimension {d} is too large")))?);
        }
        // GGUF lists the fastest-varying dimension first.
        dims.reverse();
        let ty = r.u32(&format!("tensor `{name}`'s type"))?;
        let ggml_dtype = dtype(ty).ok_or_else(|| r.bad(format!("tensor `{name}` has unknown type {ty}")))?;
        let offset = r.u64(&format!("tensor `{name}`'s offset"))?;
        let info = TensorInfo { ggml_dtype, shape: dims.into(), offset };
        if tensor_infos.insert(name.clone(), info).is_some() {
            return Err(r.bad(format!("tensor `{name}` appears twice")));
        }
    }

    let alignment = alignment(&metadata).map_err(|reason| r.bad(format!("`general.alignment`: {reason}")))?;
    let tensor_data_offset =
        r.pos.checked_next_multiple_of(alignment).ok_or_else(|| r.bad("the tensor data offset overflows"))?;
    let data_len = file_len.saturating_sub(tensor_data_offset);
    let mut total: u64 = 0;
    for (name, info) in &tensor_infos {
        let size = tensor_bytes(info).map_err(|reason| r.bad(format!("tensor `{name}`: {reason}")))?;
        if !info.offset.is_multiple_of(alignment) {
            return Err(r.bad(format!(
                "tensor `{name}`: offset {} is not a multiple of the alignment {alignment}",
                info.offset
            )));
        }
        info.offset.checked_add(size).filter(|&end| end <= data_len).ok_or_else(|| {
            r.bad(format!(
                "truncated: tensor `{name}` needs {size} bytes at offset {} of the tensor data, which holds only \
                 {data_len} bytes",
                info.offset
            ))
        })?;
        total = total.saturating_add(size);
    }
    if total > data_len {
        return Err(
            r.bad(format!("the tensors declare {total} bytes in all, more than the {data_len} bytes of tensor data"))
        );
    }
    Ok(Content { magic, metadata, tensor_infos, tensor_data_offset })
}

/// Bytes of a tensor's data, with the arithmetic checked.
pub fn tensor_bytes(info: &TensorInfo) -> std::result::Result<u64, String> {
    let elems = info
        .shape
        .dims()
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .ok_or_else(|| format!("shape {:?} has more elements than fit in 64 bits", info.shape.dims()))?;
    let block = info.ggml_dtype.block_size() as u64;
    if !elems.is_multiple_of(block) {
        return Err(format!("{elems} elements are not a multiple of the block size {block} of {:?}", info.ggml_dtype));
    }
    (elems / block)
        .checked_mul(info.ggml_dtype.type_size() as u64)
        .ok_or_else(|| format!("shape {:?} has more bytes than fit in 64 bits", info.shape.dims()))
}

/// ggml's type numbers (candle's `GgmlDType::from_u32`, which is private to candle).
fn dtype(ty: u32) -> Option<GgmlDType> {
    Some(match ty {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// `general.alignment`, of any integer type (llama.cpp writes u32); a power of two up to [`MAX_ALIGNMENT`].
fn alignment(metadata: &HashMap<String, Value>) -> std::result::Result<u64, String> {
    let a = match metadata.get("general.alignment") {
        None => return Ok(DEFAULT_ALIGNMENT),
        Some(Value::U8(v)) => *v as i64,
        Some(Value::U16(v)) => *v as i64,
        Some(Value::U32(v)) => *v as i64,
        Some(Value::I8(v)) => *v as i64,
        Some(Value::I16(v)) => *v as i64,
        Some(Value::I32(v)) => *v as i64,
        Some(Value::U64(v)) => i64::try_from(*v).unwrap_or(i64::MAX),
        Some(Value::I64(v)) => *v,
        Some(v) => return Err(format!("should be an integer, found {:?}", v.value_type())),
    };
    if a <= 0 || !(a as u64).is_power_of_two() || a as u64 > MAX_ALIGNMENT {
        return Err(format!("{a} is not a power of two between 1 and {MAX_ALIGNMENT}"));
    }
    Ok(a as u64)
}

struct Reader<'a, R> {
    inner: &'a mut R,
    pos: u64,
    file_len: u64,
    path: &'a Path,
    /// Bytes the metadata values take so far, against [`MAX_METADATA_MEMORY`].
    memory: u64,
    /// Version 1 writes lengths and counts as u32, later versions as u64.
    v1: bool,
}

impl<R: Read> Reader<'_, R> {
    fn bad(&self, reason: impl Into<String>) -> Error {
        Error::BadFile { path: self.path.to_path_buf(), format: "GGUF", reason: reason.into() }
    }

    fn remaining(&self) -> u64 {
        self.file_len.saturating_sub(self.pos)
    }

    /// Errors unless `needed` more bytes lie in the file.
    fn fits(&self, what: &str, needed: u64) -> Result<()> {
        if needed > self.remaining() {
            return Err(self.bad(format!(
                "truncated: {what} needs {needed} bytes at byte {}, the file has {} more",
                self.pos,
                self.remaining()
            )));
        }
        Ok(())
    }

    fn limit(&self, what: &str, value: u64, max: u64) -> Result<()> {
        if value > max {
            return Err(self.bad(format!("{what} {value} exceeds the limit of {max}")));
        }
        Ok(())
    }

    fn charge(&mut self, what: &str, bytes: u64) -> Result<()> {
        self.memory = self.memory.saturating_add(bytes);
        if self.memory > MAX_METADATA_MEMORY {
            return Err(self.bad(format!("{what}: the metadata would take over {MAX_METADATA_MEMORY} bytes of memory")));
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        self.fits(what, N as u64)?;
        let mut b = [0u8; N];
        self.inner.read_exact(&mut b).map_err(|e| Error::io(self.path, e))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    fn prefix_len(&self) -> u64 {
        if self.v1 {
            4
        } else {
            8
        }
    }

    /// A length or count: u32 in version 1, u64 after.
    fn length(&mut self, what: &str) -> Result<u64> {
        if self.v1 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    /// A length-prefixed string, decoded as candle decodes it: trailing NULs dropped, invalid UTF-8 replaced.
    fn string(&mut self, max: u64, what: &str) -> Result<String> {
        let len = self.length(what)?;
        self.limit(&format!("the length of {what}"), len, max)?;
        self.fits(what, len)?;
        let mut v = vec![0u8; len as usize];
        self.inner.read_exact(&mut v).map_err(|e| Error::io(self.path, e))?;
        self.pos += len;
        while v.last() == Some(&0) {
            v.pop();
        }
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    /// One value of GGUF type `ty`, at array depth `depth`; `what` names its entry in errors.
    fn value(&mut self, ty: u32, depth: usize, what: &str) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.bytes::<1>(what)?[0]),
            1 => Value::I8(self.bytes::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.bytes(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes(what)?)),
            4 => Value::U32(u32::from_le_bytes(self.bytes(what)?)),
            5 => Value::I32(i32::from_le_bytes(self.bytes(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes(what)?)),
            7 => match self.bytes::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.bad(format!("{what}: {b} is not a boolean (0 or 1)"))),
            },
            8 => {
                let s = self.string(MAX_STRING_LEN, what)?;
                self.charge(what, s.len() as u64)?;
                Value::String(s)
            }
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(self.bad(format!("{what}: arrays nested deeper than {MAX_DEPTH}")));
                }
                let elem_ty = self.u32(what)?;
                let min_size = match elem_ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    10..=12 => 8,
                    8 => self.prefix_len(),
                    9 => 4 + self.prefix_len(),
                    t => return Err(self.bad(format!("{what}: unknown array element type {t}"))),
                };
                let len = self.length(what)?;
                self.limit(&format!("{what}: the array length"), len, MAX_ARRAY_LEN)?;
                self.fits(what, len * min_size)?;
                self.charge(what, len * std::mem::size_of::<Value>() as u64)?;
                let mut values = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    values.push(self.value(elem_ty, depth + 1, what)?);
                }
                Value::Array(values)
            }
            10 => Value::U64(u64::from_le_bytes(self.bytes(what)?)),
            11 => Value::I64(i64::from_le_bytes(self.bytes(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes(what)?)),
            t => return Err(self.bad(format!("{what} has unknown type {t}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_a_power_of_two_of_any_integer_type() {
        let of = |v: Value| alignment(&HashMap::from([("general.alignment".to_string(), v)]));
        assert_eq!(alignment(&HashMap::new()), Ok(32));
        assert_eq!(of(Value::U32(64)), Ok(64));
        assert_eq!(of(Value::U64(16)), Ok(16));
        for bad in [Value::U32(0), Value::U32(48), Value::I32(-32), Value::U64(1 << 40)] {
            assert!(of(bad).unwrap_err().contains("power of two"));
        }
        assert!(of(Value::F32(32.0)).unwrap_err().contains("should be an integer"));
    }
}
