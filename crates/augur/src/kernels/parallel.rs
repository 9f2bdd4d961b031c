//! Work split over rayon's global pool, by work stealing: when another process holds a core, the calling
//! thread does the work itself instead of waiting at a barrier for a descheduled worker (candle's barrier pool
//! did, which stalls decoding whenever another process is busy). Also `SharedOut`, the output buffer the
//! kernels' tasks write from several threads: its accessors are unsafe, since those writes must be disjoint.

use std::marker::PhantomData;
use std::ops::Range;

/// Runs `f` on a worker of rayon's global pool, or in place when already on one. From any other thread, each
/// parallel region inside `f` would go through the pool's queue and park the caller until it is done: a
/// forward makes about seven such regions per layer, and each hand-off wakes a sleeping thread, a large part
/// of a small model's one-token forward.
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
pub(crate) struct SharedOut<'a> {
    ptr: *mut f32,
    len: usize,
    _buf: PhantomData<&'a mut [f32]>,
}

// SAFETY: it holds the exclusive borrow of an f32 buffer (`Send` like `&mut [f32]`), and hands its memory out
// only through `slice` and `ptr`, whose callers promise that no element is accessed from two threads.
unsafe impl Send for SharedOut<'_> {}
// SAFETY: as for `Send`: shared between threads, it gives access only through the unsafe `slice` and `ptr`.
unsafe impl Sync for SharedOut<'_> {}

impl<'a> SharedOut<'a> {
    pub(crate) fn new(buf: &'a mut [f32]) -> Self {
        Self { ptr: buf.as_mut_ptr(), len: buf.len(), _buf: PhantomData }
    }

    /// `buf[start..start + len]` (a range past the buffer panics).
    ///
    /// # Safety
    /// No two live slices, nor a slice and the elements written through a [`Self::ptr`], overlap.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.len, "slice {start}..{} of a buffer of {}", start + len, self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }

    /// A pointer to `buf[start]`, for a kernel that writes a strided part of `buf[start..start + extent]` (an
    /// extent past the buffer panics).
    ///
    /// # Safety
    /// Writes through it stay within `buf[start..start + extent]` while the buffer's borrow lasts, and no element
    /// written through it is accessed by another thread (or through a [`Self::slice`]) meanwhile.
    pub(crate) unsafe fn ptr(&self, start: usize, extent: usize) -> *mut f32 {
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
