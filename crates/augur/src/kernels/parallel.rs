//! Work split over rayon's global pool, by work stealing: when another process holds a core, the calling
//! thread does the work itself instead of waiting at a barrier for a descheduled worker (candle's barrier pool
//! did that: a Qwen 0.5B decode fell from 33 to 5 tokens/s next to one busy process on 2 cores).

use std::marker::PhantomData;
use std::ops::Range;

/// Runs `f` on a worker of rayon's global pool, or in place when already on one. From any other thread, each
/// parallel region inside `f` would go through the pool's queue and park the caller until it is done: a
/// forward makes about seven such regions per layer, and each hand-off wakes a sleeping thread (they took a
/// third of SmolLM2's one-token forward).
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// Runs `f` over chunks of `0..n_items` on the pool (the calling thread takes part); about eight chunks per
/// thread, so a slow thread does not hold the others up.
pub fn for_each_chunk(n_items: usize, f: impl Fn(Range<usize>) + Sync + Send) {
    use rayon::prelude::*;
    let chunk = n_items.div_ceil(rayon::current_num_threads() * 8).max(1);
    (0..n_items.div_ceil(chunk)).into_par_iter().for_each(|c| f(c * chunk..n_items.min((c + 1) * chunk)));
}

/// One output buffer written from several threads, each to its own elements.
pub struct SharedOut<'a> {
    ptr: *mut f32,
    len: usize,
    _buf: PhantomData<&'a mut [f32]>,
}

// SAFETY: only hands out memory through `slice` and `ptr`, whose callers promise disjoint writes.
unsafe impl Send for SharedOut<'_> {}
unsafe impl Sync for SharedOut<'_> {}

impl<'a> SharedOut<'a> {
    pub fn new(buf: &'a mut [f32]) -> Self {
        Self { ptr: buf.as_mut_ptr(), len: buf.len(), _buf: PhantomData }
    }

    /// `buf[start..start + len]`.
    ///
    /// # Safety
    /// No two live slices overlap.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.len, "slice {start}..{} of a buffer of {}", start + len, self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }

    /// A pointer to `buf[start]`, for a kernel that writes a strided part of `buf[start..start + extent]`.
    ///
    /// # Safety
    /// No element written through it is accessed by another thread meanwhile.
    pub unsafe fn ptr(&self, start: usize, extent: usize) -> *mut f32 {
        assert!(start + extent <= self.len, "extent {start}..{} of a buffer of {}", start + extent, self.len);
        self.ptr.add(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forward's work runs on a pool worker, called from outside the pool or from inside it.
    #[test]
    fn on_pool_runs_on_a_worker() {
        assert_eq!(rayon::current_thread_index(), None);
        let outer = on_pool(|| (rayon::current_thread_index(), on_pool(rayon::current_thread_index)));
        assert!(outer.0.is_some(), "{outer:?}");
        assert_eq!(outer.0, outer.1, "a nested call stays on its worker");
    }
}
