//! A key/value cache that can be cut back to any length, which speculation needs after every rejected draft.

/// Keys and values of one attention layer, as plain buffers laid out `[n_kv_heads, capacity, head_dim]`; the
/// first `len` positions of each head are valid. Appending writes in place and grows the buffers by doubling,
/// so a decoding step copies only the new positions.
pub struct KvCache {
    k: Vec<f32>,
    v: Vec<f32>,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    len: usize,
}

const MIN_CAPACITY: usize = 256;

impl KvCache {
    pub fn new(n_kv_heads: usize, head_dim: usize) -> Self {
        Self { k: Vec::new(), v: Vec::new(), n_kv_heads, head_dim, capacity: 0, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position from `len` on (a no-op when the cache is already shorter).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Keeps, of the positions from `start` on, those at `start + keep[i]` (`keep` increasing), moved to
    /// `start + i`, and forgets the rest: a verified tree's accepted path becomes the cache's next positions.
    pub fn keep_path(&mut self, start: usize, keep: &[usize]) {
        let d = self.head_dim;
        for (i, &k) in keep.iter().enumerate() {
            debug_assert!(k >= i && start + k < self.len, "path rows in order, inside the cache");
            if k != i {
                for head in 0..self.n_kv_heads {
                    let (src, dst) = ((head * self.capacity + start + k) * d, (head * self.capacity + start + i) * d);
                    self.k.copy_within(src..src + d, dst);
                    self.v.copy_within(src..src + d, dst);
                }
            }
        }
        self.len = self.len.min(start + keep.len());
    }

    fn reserve(&mut self, needed: usize) {
        if needed <= self.capacity {
            return;
        }
        let cap = needed.max(MIN_CAPACITY).max(self.capacity * 2);
        let (h, d) = (self.n_kv_heads, self.head_dim);
        let regrow = |old: &[f32], old_cap: usize, len: usize| {
            let mut new = vec![0f32; h * cap * d];
            for head in 0..h {
                let src = &old[head * old_cap * d..head * old_cap * d + len * d];
                new[head * cap * d..head * cap * d + len * d].copy_from_slice(src);
            }
            new
        };
        self.k = regrow(&self.k, self.capacity, self.len);
        self.v = regrow(&self.v, self.capacity, self.len);
        self.capacity = cap;
    }

    /// Appends `t` positions; `k` and `v` are `[t, n_kv_heads, head_dim]` (the projection's row layout).
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        let (h, d) = (self.n_kv_heads, self.head_dim);
        let t = k.len() / (h * d);
        self.reserve(self.len + t);
        for i in 0..t {
            for head in 0..h {
                let dst = (head * self.capacity + self.len + i) * d;
                let src = (i * h + head) * d;
                self.k[dst..dst + d].copy_from_slice(&k[src..src + d]);
                self.v[dst..dst + d].copy_from_slice(&v[src..src + d]);
            }
        }
        self.len += t;
    }

    /// Key `pos` of `head`, `[head_dim]`. Only attention reads the stored rows (the device seam).
    #[inline]
    pub(super) fn key(&self, head: usize, pos: usize) -> &[f32] {
        let o = (head * self.capacity + pos) * self.head_dim;
        &self.k[o..o + self.head_dim]
    }

    /// Value `pos` of `head`, `[head_dim]`.
    #[inline]
    pub(super) fn value(&self, head: usize, pos: usize) -> &[f32] {
        let o = (head * self.capacity + pos) * self.head_dim;
        &self.v[o..o + self.head_dim]
    }

    /// Keys `positions` of `head`, `[positions.len(), head_dim]`: one slice for a kernel that reads them
    /// through a pointer.
    #[inline]
    pub(super) fn key_rows(&self, head: usize, positions: std::ops::Range<usize>) -> &[f32] {
        let o = head * self.capacity;
        &self.k[(o + positions.start) * self.head_dim..(o + positions.end) * self.head_dim]
    }

    /// Values `positions` of `head`, as [`Self::key_rows`].
    #[inline]
    pub(super) fn value_rows(&self, head: usize, positions: std::ops::Range<usize>) -> &[f32] {
        let o = head * self.capacity;
        &self.v[(o + positions.start) * self.head_dim..(o + positions.end) * self.head_dim]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_truncate_overwrite_and_grow() {
        let mut c = KvCache::new(2, 2);
        // t = 3 positions, 2 heads, head_dim 2: value = 10·pos + head.
        let block = |base: f32, t: usize| -> Vec<f32> {
            (0..t).flat_map(|p| (0..2).flat_map(move |h| [base + 10.0 * p as f32 + h as f32; 2])).collect()
        };
        c.append(&block(0.0, 3), &block(100.0, 3));
        c.truncate(1);
        c.append(&block(50.0, 2), &block(150.0, 2));
        assert_eq!(c.len(), 3);
        assert_eq!(c.key(1, 0), &[1.0, 1.0]);
        assert_eq!(c.key(0, 1), &[50.0, 50.0]);
        assert_eq!(c.value(1, 2), &[161.0, 161.0]);
        for _ in 0..300 {
            c.append(&block(7.0, 1), &block(7.0, 1));
        }
        assert_eq!(c.len(), 303);
        assert_eq!(c.key(1, 0), &[1.0, 1.0], "growing keeps old positions");
        assert_eq!(c.key(1, 302), &[8.0, 8.0]);
    }

    #[test]
    fn keep_path_moves_the_kept_rows_down() {
        let mut c = KvCache::new(2, 1);
        let rows: Vec<f32> = (0..6).flat_map(|p| [p as f32, 10.0 + p as f32]).collect();
        c.append(&rows, &rows);
        c.keep_path(2, &[0, 2, 3]);
        assert_eq!(c.len(), 5);
        let kept: Vec<f32> = (0..5).map(|p| c.key(1, p)[0]).collect();
        assert_eq!(kept, [10.0, 11.0, 12.0, 14.0, 15.0]);
        assert_eq!(c.value(0, 3), &[4.0]);
    }
}
