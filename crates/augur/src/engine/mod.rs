//! Running sequences: the floor above the pipeline that owns what runs concurrently. [`Engine`] admits
//! requests first come first served ([`admission`]), hands each a sequence from its idle pool (a fork of the
//! loaded pipeline that keeps its KV cache, reused by a request of the same owner whose prompt it begins) and
//! takes it back; [`run_rows`] and [`run_forked`] run several rows on threads of their own, so that their
//! forwards meet in one batched forward (`models::batching`); [`Pipeline::stream`] runs one on a thread of its
//! own. The server, the Python package and streaming call this rather than spawning threads or forks of their own.

pub mod admission;
pub mod stream;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard};

pub use admission::{Admission, Permit};
pub use stream::TextChunks;

use crate::error::{Error, Result};
use crate::pipeline::Pipeline;

/// A loaded pipeline served to concurrent requests: admission, and a pool of idle sequences with their caches.
pub struct Engine {
    /// What new sequences are forked from; it never runs a request itself.
    template: Mutex<Pipeline>,
    idle: Mutex<Vec<Idle>>,
    admission: Admission,
}

/// An idle sequence and the owner (API key) of the request that last ran on it.
struct Idle {
    pipe: Pipeline,
    owner: String,
}

/// A request's slots, before its sequences are taken.
pub struct Admitted<'e> {
    engine: &'e Engine,
    permit: Permit<'e>,
}

impl<'e> Admitted<'e> {
    /// A sequence per slot for a request of `owner` whose prompt is `ids`: each the idle one of the same owner
    /// whose cache holds the longest prefix of `ids`, else any idle one (its cache forgotten), else a new fork.
    /// On an error the sequences taken go back to the pool.
    pub fn sequences(self, ids: &[u32], owner: &str) -> Result<Running<'e>> {
        let Admitted { engine, permit } = self;
        let n = permit.slots();
        let mut running = Running { engine, pipes: Vec::with_capacity(n), owner: owner.to_string(), _permit: permit };
        for _ in 0..n {
            running.pipes.push(engine.sequence_for(ids, owner)?);
        }
        Ok(running)
    }
}

/// A request's admitted sequences; dropping it returns them to the idle pool (their caches kept for the same
/// owner), then their slots.
pub struct Running<'e> {
    engine: &'e Engine,
    pipes: Vec<Pipeline>,
    owner: String,
    _permit: Permit<'e>,
}

impl Engine {
    /// Serves `pipeline` with at most `slots` sequences running and `queue` requests waiting. The first
    /// sequence is forked now, so that a model that cannot be forked (loaded MTP layers) fails here, not per
    /// request.
    pub fn new(pipeline: Pipeline, slots: usize, queue: usize) -> Result<Self> {
        let first = pipeline.fork()?;
        Ok(Engine {
            template: Mutex::new(pipeline),
            idle: Mutex::new(vec![Idle { pipe: first, owner: String::new() }]),
            admission: Admission::new(slots, queue),
        })
    }

    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Waits for `n` slots behind every request that came earlier, or `None` at once when the queue is full
    /// (see [`Admission::admit`]).
    pub fn admit(&self, n: usize) -> Option<Admitted<'_>> {
        Some(Admitted { engine: self, permit: self.admission.admit(n)? })
    }

    fn sequence_for(&self, ids: &[u32], owner: &str) -> Result<Pipeline> {
        let mut idle = lock(&self.idle);
        let prefix = |i: &Idle| if i.owner == owner { i.pipe.target.cached_prefix(ids) } else { 0 };
        let best = (0..idle.len()).max_by_key(|&i| (prefix(&idle[i]), i));
        match best {
            Some(i) => {
                let Idle { mut pipe, owner: last } = idle.swap_remove(i);
                if last != owner {
                    pipe.target.forget_cache();
                }
                Ok(pipe)
            }
            None => {
                drop(idle);
                lock(&self.template).fork()
            }
        }
    }
}

impl Running<'_> {
    /// Runs `row` on each sequence (see [`run_rows`]).
    pub fn run<R: Send>(&mut self, row: impl Fn(usize, &mut Pipeline) -> Result<R> + Sync) -> Vec<Result<R>> {
        run_rows(&mut self.pipes, row)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let owner = &self.owner;
        lock(&self.engine.idle).extend(self.pipes.drain(..).map(|pipe| Idle { pipe, owner: owner.clone() }));
    }
}

/// Runs `row(i, &mut rows[i])` for every row: one in the calling thread, several each on a thread of its own,
/// so that their forwards run as batched forwards (each row gets the numbers it would get alone). A row that
/// panics gives an error; the others run on.
pub fn run_rows<T: Send, R: Send>(rows: &mut [T], row: impl Fn(usize, &mut T) -> Result<R> + Sync) -> Vec<Result<R>> {
    let panicked = |i: usize| Error::Generation(format!("row {i}'s generation panicked"));
    if let [only] = rows {
        return vec![catch_unwind(AssertUnwindSafe(|| row(0, only))).unwrap_or_else(|_| Err(panicked(0)))];
    }
    let row = &row;
    std::thread::scope(|s| {
        let handles: Vec<_> = rows.iter_mut().enumerate().map(|(i, r)| s.spawn(move || row(i, r))).collect();
        handles.into_iter().enumerate().map(|(i, h)| h.join().unwrap_or_else(|_| Err(panicked(i)))).collect()
    })
}

/// Runs `rows` rows on `pipe` and forks of it: row 0 on `pipe`, each other on a fork, all at once as in
/// [`run_rows`]. A model that cannot fork (loaded MTP layers) runs them one after another on `pipe`.
pub fn run_forked<R: Send>(
    pipe: &mut Pipeline,
    rows: usize,
    row: impl Fn(usize, &mut Pipeline) -> Result<R> + Sync,
) -> Vec<Result<R>> {
    let forks = match rows {
        0 | 1 => None,
        n => (1..n).map(|_| pipe.fork()).collect::<Result<Vec<_>>>().ok(),
    };
    let Some(mut forks) = forks else {
        return (0..rows).map(|i| row(i, pipe)).collect();
    };
    let mut all: Vec<&mut Pipeline> = std::iter::once(pipe).chain(forks.iter_mut()).collect();
    run_rows(&mut all, |i, p| row(i, p))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
