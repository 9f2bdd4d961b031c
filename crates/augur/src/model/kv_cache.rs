//! A key/value cache that can be cut back to any length, which speculation needs after every rejected draft.

use candle_core::Tensor;

use crate::error::Result;

/// Keys and values of one attention layer. The buffers are `[1, n_kv_heads, capacity, head_dim]`; the first
/// `len` positions are valid. Appending writes in place and grows the buffers by doubling, so a decoding step
/// copies only the new positions.
#[derive(Default)]
pub struct KvCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
    len: usize,
}

const MIN_CAPACITY: usize = 256;

impl KvCache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position from `len` on (a no-op when the cache is already shorter).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn grow(buf: &Option<Tensor>, new: &Tensor, len: usize) -> Result<Tensor> {
        let (b, h, t, d) = new.dims4()?;
        let capacity = buf.as_ref().map_or(0, |x| x.dim(2).unwrap_or(0));
        if len + t <= capacity {
            if let Some(buf) = buf {
                return Ok(buf.clone());
            }
        }
        let new_capacity = (len + t).max(MIN_CAPACITY).max(capacity * 2);
        let grown = Tensor::zeros((b, h, new_capacity, d), new.dtype(), new.device())?;
        if let (Some(old), true) = (buf, len > 0) {
            grown.slice_set(&old.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
        }
        Ok(grown)
    }

    /// Appends `k`, `v` (`[1, n_kv_heads, t, head_dim]`) at position `len` and returns views of all valid
    /// positions, `[1, n_kv_heads, len + t, head_dim]`.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k.dim(2)?;
        let kb = Self::grow(&self.k, k, self.len)?;
        let vb = Self::grow(&self.v, v, self.len)?;
        kb.slice_set(&k.contiguous()?, 2, self.len)?;
        vb.slice_set(&v.contiguous()?, 2, self.len)?;
        self.len += t;
        let out = (kb.narrow(2, 0, self.len)?, vb.narrow(2, 0, self.len)?);
        self.k = Some(kb);
        self.v = Some(vb);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn block(start: f32, t: usize) -> Tensor {
        let data: Vec<f32> = (0..t * 2).map(|i| start + i as f32).collect();
        Tensor::from_vec(data, (1, 1, t, 2), &Device::Cpu).unwrap()
    }

    #[test]
    fn append_truncate_and_overwrite() {
        let mut c = KvCache::default();
        c.append(&block(0.0, 3), &block(100.0, 3)).unwrap();
        c.truncate(1);
        assert_eq!(c.len(), 1);
        let (k, v) = c.append(&block(50.0, 2), &block(150.0, 2)).unwrap();
        assert_eq!(k.dims(), &[1, 1, 3, 2]);
        let k: Vec<f32> = k.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(k, vec![0.0, 1.0, 50.0, 51.0, 52.0, 53.0]);
        let v: Vec<f32> = v.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(v, vec![100.0, 101.0, 150.0, 151.0, 152.0, 153.0]);
    }

    #[test]
    fn grows_past_initial_capacity() {
        let mut c = KvCache::default();
        for i in 0..300 {
            c.append(&block(i as f32, 1), &block(i as f32, 1)).unwrap();
        }
        let (k, _) = c.append(&block(7.0, 1), &block(7.0, 1)).unwrap();
        assert_eq!(k.dims(), &[1, 1, 301, 2]);
        let k: Vec<f32> = k.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(&k[..4], &[0.0, 1.0, 1.0, 2.0]);
        assert_eq!(&k[598..], &[7.0, 8.0]);
    }
}
