//! The logit rows a forward hands back, as the host reads them.

use std::ops::{Index, IndexMut};

use candle_core::Tensor;

use crate::error::{Error, Result};

/// A forward's logit rows, `[rows, vocab]`, held flat in host memory: what the logits processors, the sampler,
/// the verifiers and the log-probabilities read, row by row (`logits[i]` is row `i`, `[vocab]`). It is one copy
/// of the forward's output, with no allocation per row. A device backend fills it from its own memory (all the
/// rows asked for, or only the rows a verdict reads) and nothing above it changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Logits {
    data: Vec<f32>,
    vocab: usize,
}

impl Logits {
    /// The rows of a `[rows, vocab]` (or `[vocab]`: one row) f32 tensor.
    pub fn from_tensor(t: &Tensor) -> Result<Self> {
        let (rows, vocab) = match t.dims() {
            &[vocab] => (1, vocab),
            &[rows, vocab] => (rows, vocab),
            dims => return Err(Error::Generation(format!("logits of shape {dims:?}, expected [rows, vocab]"))),
        };
        let data = t.flatten_all()?.to_vec1::<f32>()?;
        debug_assert_eq!(data.len(), rows * vocab);
        Ok(Logits { data, vocab })
    }

    /// Rows given one by one, each `[vocab]` (all of one length).
    pub fn from_rows<R: AsRef<[f32]>>(rows: impl IntoIterator<Item = R>) -> Self {
        rows.into_iter().collect()
    }

    /// Appends a row; the first fixes the vocabulary's size.
    pub fn push(&mut self, row: &[f32]) {
        if self.data.is_empty() {
            self.vocab = row.len();
        }
        assert_eq!(row.len(), self.vocab, "a logit row of {} entries among rows of {}", row.len(), self.vocab);
        self.data.extend_from_slice(row);
    }

    /// The number of rows.
    pub fn len(&self) -> usize {
        self.data.len().checked_div(self.vocab).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The entries per row.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    pub fn iter(&self) -> std::slice::ChunksExact<'_, f32> {
        self.data.chunks_exact(self.vocab.max(1))
    }

    pub fn iter_mut(&mut self) -> std::slice::ChunksExactMut<'_, f32> {
        self.data.chunks_exact_mut(self.vocab.max(1))
    }

    /// Rows `rows` of these, in that order.
    pub fn select(&self, rows: impl IntoIterator<Item = usize>) -> Logits {
        Logits::from_rows(rows.into_iter().map(|r| &self[r]))
    }

    /// Removes the last row and returns it (`None` without rows).
    pub fn pop(&mut self) -> Option<Vec<f32>> {
        let start = self.data.len().checked_sub(self.vocab).filter(|_| !self.data.is_empty())?;
        Some(self.data.split_off(start))
    }
}

impl<R: AsRef<[f32]>> FromIterator<R> for Logits {
    fn from_iter<I: IntoIterator<Item = R>>(rows: I) -> Self {
        let mut out = Logits::default();
        for r in rows {
            out.push(r.as_ref());
        }
        out
    }
}

impl<'a> IntoIterator for &'a Logits {
    type Item = &'a [f32];
    type IntoIter = std::slice::ChunksExact<'a, f32>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a> IntoIterator for &'a mut Logits {
    type Item = &'a mut [f32];
    type IntoIter = std::slice::ChunksExactMut<'a, f32>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl Index<usize> for Logits {
    type Output = [f32];

    fn index(&self, row: usize) -> &[f32] {
        &self.data[row * self.vocab..][..self.vocab]
    }
}

impl IndexMut<usize> for Logits {
    fn index_mut(&mut self, row: usize) -> &mut [f32] {
        &mut self.data[row * self.vocab..][..self.vocab]
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn rows_read_back_as_the_tensor_holds_them() {
        let rows = vec![vec![1.0f32, 2.0, 3.0], vec![4.0, 5.0, 6.0]];
        let t = Tensor::new(rows.clone(), &Device::Cpu).unwrap();
        let mut l = Logits::from_tensor(&t).unwrap();
        assert_eq!((l.len(), l.vocab()), (2, 3));
        assert_eq!(l.iter().map(<[f32]>::to_vec).collect::<Vec<_>>(), rows);
        assert_eq!(&l[1], &rows[1][..]);
        l[0][2] = 9.0;
        assert_eq!(l.select([1, 0]), Logits::from_rows([[4.0, 5.0, 6.0], [1.0, 2.0, 9.0]]));
        assert_eq!(l.pop(), Some(rows[1].clone()));
        assert_eq!(l.pop(), Some(vec![1.0, 2.0, 9.0]));
        assert_eq!((l.pop(), l.len()), (None, 0));
        let one = Logits::from_tensor(&Tensor::new(&[7.0f32, 8.0][..], &Device::Cpu).unwrap()).unwrap();
        assert_eq!((one.len(), &one[0]), (1, &[7.0f32, 8.0][..]));
    }
}
