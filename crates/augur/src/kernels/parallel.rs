//! How the kernels' products are shared out over threads, and `SharedOut`, the output buffer their tasks write
//! from several threads (its accessors are unsafe, since those writes must be disjoint).
//!
//! A product's chunks go to a pool of our own whose threads wait for the next product by spinning, for a few
//! milliseconds after their last one, before they sleep. Hand-written because a decode step is over a hundred
//! products of tens of microseconds each, with single-threaded work (norms, attention) between them: rayon's
//! workers fall asleep within such gaps, and waking a sleeping thread (on a virtual machine, a halted vCPU) costs
//! a good part of a product (BENCHMARKS.md has the measurement). Chunks are claimed, never assigned: each thread
//! takes its own run's, then the others' that are left, so when another process holds a core the calling thread
//! does the work itself instead of waiting at a barrier for a descheduled worker (candle's barrier pool did).
//! Work that finds the pool taken (another thread's product, or a product inside a product) goes to rayon's
//! global pool.

use std::any::Any;
use std::marker::PhantomData;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Runs `f` on a worker of rayon's global pool, or in place when already on one. From any other thread, each
/// rayon region inside `f` (the norms and activations of several rows) would go through the pool's queue and
/// park the caller until it is done.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// Runs `f` over chunks of `0..n_items` on the kernels' pool (the calling thread takes part); about eight chunks
/// per thread, so a slow thread does not hold the others up.
pub fn for_each_chunk(n_items: usize, f: impl Fn(Range<usize>) + Sync + Send) {
    let threads = rayon::current_num_threads();
    let chunk = n_items.div_ceil(threads * 8).max(1);
    let chunks = n_items.div_ceil(chunk);
    let run = |c: usize| f(c * chunk..n_items.min((c + 1) * chunk));
    if threads == 1 || chunks == 1 {
        (0..chunks).for_each(run);
    } else if !HotPool::get(threads - 1).run(chunks, &run) {
        use rayon::prelude::*;
        (0..chunks).into_par_iter().for_each(run);
    }
}

/// How long a pool thread spins for the next product after its last one (the gaps inside a decode step and
/// between steps are shorter), then how long of that it spins without yielding the core.
const SPIN: Duration = Duration::from_millis(3);
const SPIN_HOT: Duration = Duration::from_micros(100);

/// A value alone on its cache lines (two, for the adjacent-line prefetcher): the counters that the threads
/// write must not share a line with each other or with what the caller's stack holds beside them.
#[repr(align(128))]
struct Line<T>(T);

/// One product's chunks, on the calling thread's stack while the pool's threads work on it. Each thread has
/// its own run of chunks, claimed from its own counter (a line no other thread touches until it steals), and
/// takes from the others' runs once its own is done: one claim per chunk from a shared counter cost a small
/// model's products several percent in lines passed between the cores.
struct Job<'a> {
    run: &'a (dyn Fn(usize) + Sync),
    /// Per thread (0: the caller; i + 1: pool thread i), the next chunk of its run and the run's end.
    parts: Vec<(Line<AtomicUsize>, usize)>,
    /// Chunks finished (or panicked), added by each thread once it finds none left.
    done: Line<AtomicUsize>,
    /// The first chunk's panic, raised on the caller once every chunk is done.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl<'a> Job<'a> {
    fn new(run: &'a (dyn Fn(usize) + Sync), chunks: usize, threads: usize) -> Self {
        let parts = (0..threads).map(|t| (Line(AtomicUsize::new(t * chunks / threads)), (t + 1) * chunks / threads));
        Self { run, parts: parts.collect(), done: Line(AtomicUsize::new(0)), panic: Mutex::new(None) }
    }

    /// Runs thread `me`'s chunks, then the others', until none are left.
    fn work(&self, me: usize) {
        let mut ran = 0;
        let n = self.parts.len();
        for part in (0..n).map(|i| &self.parts[(me + i) % n]) {
            loop {
                let c = part.0 .0.fetch_add(1, SeqCst);
                if c >= part.1 {
                    break;
                }
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (self.run)(c))) {
                    self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(payload);
                }
                ran += 1;
            }
        }
        if ran > 0 {
            self.done.0.fetch_add(ran, SeqCst);
        }
    }
}

/// The kernels' threads (the caller is one more) and the product they share, if any.
struct HotPool {
    /// The caller and the pool's threads.
    threads: usize,
    /// A caller holds the pool.
    taken: AtomicBool,
    /// Bumped when a product is posted and again when it is withdrawn.
    epoch: Line<AtomicUsize>,
    /// The posted product, a `*const Job` with its lifetime erased; null when none.
    job: AtomicPtr<()>,
    /// Pool threads that may be reading `job`: the caller waits for none before its job leaves its stack.
    inside: Line<AtomicUsize>,
    /// Pool threads asleep (or about to sleep) on `wake`.
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

impl HotPool {
    /// The process's pool, its `workers` threads started on first use.
    fn get(workers: usize) -> &'static HotPool {
        static POOL: OnceLock<&'static HotPool> = OnceLock::new();
        POOL.get_or_init(|| {
            let pool: &'static HotPool = Box::leak(Box::new(HotPool {
                threads: workers + 1,
                taken: AtomicBool::new(false),
                epoch: Line(AtomicUsize::new(0)),
                job: AtomicPtr::new(std::ptr::null_mut()),
                inside: Line(AtomicUsize::new(0)),
                sleeping: AtomicUsize::new(0),
                lock: Mutex::new(()),
                wake: Condvar::new(),
            }));
            for i in 0..workers {
                let spawned =
                    std::thread::Builder::new().name(format!("augur-kernels-{i}")).spawn(move || pool.serve(i + 1));
                if spawned.is_err() {
                    break;
                }
            }
            pool
        })
    }

    /// Runs `run` over `0..chunks` with the pool's threads; `false` (nothing run) where the pool is taken.
    fn run(&self, chunks: usize, run: &(dyn Fn(usize) + Sync)) -> bool {
        if self.taken.swap(true, SeqCst) {
            return false;
        }
        let job = Job::new(run, chunks, self.threads);
        self.job.store(&job as *const Job as *mut (), SeqCst);
        self.epoch.0.fetch_add(1, SeqCst);
        if self.sleeping.load(SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
        job.work(0);
        wait_until(|| job.done.0.load(SeqCst) == chunks);
        self.job.store(std::ptr::null_mut(), SeqCst);
        self.epoch.0.fetch_add(1, SeqCst);
        wait_until(|| self.inside.0.load(SeqCst) == 0);
        self.taken.store(false, SeqCst);
        if let Some(payload) = job.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
            resume_unwind(payload);
        }
        true
    }

    /// A pool thread's loop: spin for the next product, sleep when none comes, work on each.
    fn serve(&self, me: usize) {
        let mut seen = self.epoch.0.load(SeqCst);
        loop {
            let since = Instant::now();
            let mut spins = 0u32;
            while self.epoch.0.load(SeqCst) == seen {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(64) {
                    let idle = since.elapsed();
                    if idle > SPIN {
                        let guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                        self.sleeping.fetch_add(1, SeqCst);
                        let guard = self
                            .wake
                            .wait_while(guard, |_| self.epoch.0.load(SeqCst) == seen)
                            .unwrap_or_else(|e| e.into_inner());
                        self.sleeping.fetch_sub(1, SeqCst);
                        drop(guard);
                    } else if idle > SPIN_HOT {
                        std::thread::yield_now();
                    }
                }
            }
            seen = self.epoch.0.load(SeqCst);
            self.inside.0.fetch_add(1, SeqCst);
            if self.epoch.0.load(SeqCst) == seen {
                let job = self.job.load(SeqCst) as *const Job;
                // SAFETY: the job was posted in this epoch, and its caller keeps it alive until, after withdrawing
                // it (a new epoch), it sees `inside` at zero: this thread counted itself in before it saw the epoch
                // unchanged, so the caller waits for it.
                if let Some(job) = unsafe { job.as_ref() } {
                    job.work(me);
                }
            }
            self.inside.0.fetch_sub(1, SeqCst);
        }
    }
}

/// Spins until `done`, yielding the core after a while (a pool thread descheduled mid-chunk).
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        spins = spins.saturating_add(1);
        if spins < 1 << 14 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
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

    /// Every chunk runs once, whichever thread claims it, from one caller or from several at once (those that
    /// find the pool taken go to rayon's).
    #[test]
    fn every_item_runs_once() {
        use std::sync::atomic::AtomicU32;
        let counts: Vec<AtomicU32> = (0..1000).map(|_| AtomicU32::new(0)).collect();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        for_each_chunk(counts.len(), |r| r.for_each(|i| _ = counts[i].fetch_add(1, SeqCst)));
                    }
                });
            }
        });
        assert!(counts.iter().all(|c| c.load(SeqCst) == 200), "each item once per call");
    }

    /// The pool's threads take part: slow chunks run on more than one thread (where there are two).
    #[test]
    fn chunks_are_shared_out() {
        if rayon::current_num_threads() < 2 {
            eprintln!("SKIPPED chunks_are_shared_out: one thread in the pool");
            return;
        }
        let shared = (0..20).any(|_| {
            let threads = Mutex::new(std::collections::HashSet::new());
            for_each_chunk(16, |_| {
                threads.lock().expect("unpoisoned").insert(std::thread::current().id());
                std::thread::sleep(Duration::from_millis(1));
            });
            threads.into_inner().expect("unpoisoned").len() > 1
        });
        assert!(shared, "every chunk ran on the calling thread");
    }

    /// A panicking chunk panics the caller, after the others are done, and leaves the pool usable.
    #[test]
    fn a_panic_reaches_the_caller() {
        let hit = catch_unwind(|| for_each_chunk(64, |r| assert!(!r.contains(&40), "item 40")));
        let payload = hit.expect_err("the panic reached the caller");
        let message = payload.downcast_ref::<&str>().copied().or(payload.downcast_ref::<String>().map(String::as_str));
        assert_eq!(message, Some("item 40"), "the chunk's own message");
        let sum = AtomicUsize::new(0);
        for_each_chunk(64, |r| _ = sum.fetch_add(r.len(), SeqCst));
        assert_eq!(sum.load(SeqCst), 64);
    }
}
