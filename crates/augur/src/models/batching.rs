//! Batching of concurrent sequences: [`Batched`] wraps a model's shared weights into a [`CausalLm`] per
//! sequence, and turns the plain forwards that sequences call at the same time (one thread each) into one
//! batched forward. Each row gets the numbers it would get alone (the kernels are row-invariant), so batching
//! never changes an output. [`Batched::fork`] adds a sequence over the same weights.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{CausalLm, ForwardOptions, ForwardOutput, KvSharing};
use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// A model's shared weights, run for one sequence's state at a time or for several sequences in one forward.
pub trait BatchModel: Send + Sync + 'static {
    /// One sequence's state: its KV caches and position.
    type Sequence: Send;
    fn config(&self) -> &ModelConfig;
    /// An empty sequence.
    fn new_sequence(&self) -> Self::Sequence;
    fn cache_len(&self, seq: &Self::Sequence) -> usize;
    /// Forgets every cached position of `seq` from `len` on.
    fn truncate(&self, seq: &mut Self::Sequence, len: usize);
    /// Checks a forward's tokens and options before it runs (alone or batched).
    fn check(&self, seq: &Self::Sequence, tokens: &[u32], opts: &ForwardOptions) -> Result<()>;
    /// Whether this forward may run batched with other sequences' (early-exit drafting runs alone).
    fn batchable(&self, seq: &Self::Sequence, opts: &ForwardOptions) -> bool;
    /// One sequence's forward, on the calling thread.
    fn forward(&self, seq: &mut Self::Sequence, tokens: &[u32], opts: &ForwardOptions) -> Result<ForwardOutput>;
    /// The forwards of several sequences as one forward.
    fn forward_batch(&self, jobs: &mut [Job<Self::Sequence>]) -> Result<Vec<ForwardOutput>>;
    /// Whether forwards may carry a tree ([`super::ForwardOptions::tree`]).
    fn supports_tree(&self) -> bool {
        false
    }
    /// [`CausalLm::keep_path`] on `seq`.
    fn keep_path(&self, _seq: &mut Self::Sequence, _start: usize, _keep: &[usize]) -> Result<()> {
        Err(Error::InvalidOption(format!("{} models do not verify trees", self.config().architecture.name())))
    }
    /// What `seq` shares with a drafter that reads its KV (see [`KvSharing`]).
    fn kv_sharing<'a>(&'a self, _seq: &'a Self::Sequence) -> Option<Box<dyn KvSharing + 'a>> {
        None
    }
    /// [`CausalLm::head_part`].
    fn head_part(&self, _ids: &[u32], _keep: bool) -> Result<Option<Arc<crate::nn::Linear>>> {
        Ok(None)
    }
}

/// One sequence's forward, handed to the batch's leader with the sequence's state.
pub struct Job<S> {
    pub tokens: Vec<u32>,
    pub opts: ForwardOptions,
    pub seq: S,
}

struct Pending<S> {
    id: u64,
    /// The sequence that asked.
    owner: u64,
    job: Job<S>,
}

struct Finished<S> {
    seq: S,
    out: Result<ForwardOutput>,
}

struct BatchState<S> {
    pending: Vec<Pending<S>>,
    done: HashMap<u64, Finished<S>>,
    /// Whether a thread is running a batch now.
    leading: bool,
    /// Sequences seen in the last two batches: how many a new batch waits for (briefly).
    last: HashSet<u64>,
    before_last: HashSet<u64>,
}

/// What the sequences of one model share: the weights and the batch being gathered. The first caller becomes
/// the leader: it waits up to [`BATCH_WINDOW`] for the sequences of the recent batches to arrive, runs them
/// all as one forward on its own thread, hands out the results, and lets the next waiting caller lead. A
/// single sequence never waits.
struct Batcher<M: BatchModel> {
    model: M,
    state: Mutex<BatchState<M::Sequence>>,
    changed: Condvar,
    ids: AtomicU64,
    /// Forwards that ran in one batch with another sequence's.
    batched: AtomicU64,
}

/// How long a batch waits for the sequences that were in the recent batches.
const BATCH_WINDOW: Duration = Duration::from_millis(2);

impl<M: BatchModel> Batcher<M> {
    fn new_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    fn state(&self) -> MutexGuard<'_, BatchState<M::Sequence>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `job` (with the others pending) and returns it finished.
    fn run(&self, owner: u64, job: Job<M::Sequence>) -> Finished<M::Sequence> {
        let id = self.new_id();
        let mut st = self.state();
        st.pending.push(Pending { id, owner, job });
        self.changed.notify_all();
        loop {
            if let Some(f) = st.done.remove(&id) {
                return f;
            }
            if st.leading {
                st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            st.leading = true;
            let expected = st.last.union(&st.before_last).count();
            let deadline = Instant::now() + BATCH_WINDOW;
            while st.pending.len() < expected {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                st = self.changed.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
            }
            let pending = std::mem::take(&mut st.pending);
            drop(st);
            if pending.len() > 1 {
                self.batched.fetch_add(pending.len() as u64, Ordering::Relaxed);
            }
            let owners: HashSet<u64> = pending.iter().map(|p| p.owner).collect();
            let finished = self.run_batch(pending);
            st = self.state();
            st.before_last = std::mem::replace(&mut st.last, owners);
            st.done.extend(finished);
            st.leading = false;
            self.changed.notify_all();
        }
    }

    /// Runs the pending jobs as one forward; a failed forward fails each job, with its caches cut back.
    fn run_batch(&self, pending: Vec<Pending<M::Sequence>>) -> Vec<(u64, Finished<M::Sequence>)> {
        let ids: Vec<u64> = pending.iter().map(|p| p.id).collect();
        let mut jobs: Vec<Job<M::Sequence>> = pending.into_iter().map(|p| p.job).collect();
        let starts: Vec<usize> = jobs.iter().map(|j| self.model.cache_len(&j.seq)).collect();
        let result = catch_unwind(AssertUnwindSafe(|| self.model.forward_batch(&mut jobs)))
            .unwrap_or_else(|_| Err(Error::Generation("the batched forward panicked".into())));
        match result {
            Ok(outs) => ids
                .into_iter()
                .zip(jobs)
                .zip(outs)
                .map(|((id, j), out)| (id, Finished { seq: j.seq, out: Ok(out) }))
                .collect(),
            Err(e) => {
                let message = e.to_string();
                ids.into_iter()
                    .zip(jobs)
                    .zip(starts)
                    .map(|((id, mut job), start)| {
                        self.model.truncate(&mut job.seq, start);
                        (id, Finished { seq: job.seq, out: Err(Error::Generation(message.clone())) })
                    })
                    .collect()
            }
        }
    }
}

/// One sequence over a model's shared weights: the [`CausalLm`] that every batchable architecture loads as.
pub struct Batched<M: BatchModel> {
    shared: Arc<Batcher<M>>,
    /// `None` only while a batch's leader holds it.
    seq: Option<M::Sequence>,
    /// This sequence's id in the batcher.
    id: u64,
}

impl<M: BatchModel> Batched<M> {
    /// The first sequence over `model`.
    pub fn new(model: M) -> Self {
        let seq = model.new_sequence();
        let shared = Arc::new(Batcher {
            model,
            state: Mutex::new(BatchState {
                pending: Vec::new(),
                done: HashMap::new(),
                leading: false,
                last: HashSet::new(),
                before_last: HashSet::new(),
            }),
            changed: Condvar::new(),
            ids: AtomicU64::new(0),
            batched: AtomicU64::new(0),
        });
        let id = shared.new_id();
        Self { shared, seq: Some(seq), id }
    }

    fn sequence(&self) -> &M::Sequence {
        self.seq.as_ref().expect("a sequence is only taken during its own forward")
    }

    /// Another sequence over the same weights (shared, not copied), with an empty cache.
    pub fn fork_same(&self) -> Self {
        Self { shared: Arc::clone(&self.shared), seq: Some(self.shared.model.new_sequence()), id: self.shared.new_id() }
    }

    fn seq_mut(&mut self) -> &mut M::Sequence {
        self.seq.as_mut().expect("a sequence is only taken during its own forward")
    }
}

impl<M: BatchModel> CausalLm for Batched<M> {
    fn config(&self) -> &ModelConfig {
        self.shared.model.config()
    }

    fn forward(&mut self, tokens: &[u32], opts: &ForwardOptions) -> Result<ForwardOutput> {
        let model = &self.shared.model;
        model.check(self.sequence(), tokens, opts)?;
        if !model.batchable(self.sequence(), opts) {
            let shared = Arc::clone(&self.shared);
            let seq = self.seq_mut();
            return crate::kernels::parallel::on_pool(|| shared.model.forward(seq, tokens, opts));
        }
        let seq = self.seq.take().expect("a sequence is only taken during its own forward");
        let job = Job { tokens: tokens.to_vec(), opts: opts.clone(), seq };
        let shared = Arc::clone(&self.shared);
        let done = shared.run(self.id, job);
        self.seq = Some(done.seq);
        done.out
    }

    fn truncate(&mut self, len: usize) {
        let shared = Arc::clone(&self.shared);
        shared.model.truncate(self.seq_mut(), len)
    }

    fn cache_len(&self) -> usize {
        self.shared.model.cache_len(self.sequence())
    }

    fn supports_tree(&self) -> bool {
        self.shared.model.supports_tree()
    }

    fn keep_path(&mut self, start: usize, keep: &[usize]) -> Result<()> {
        let shared = Arc::clone(&self.shared);
        shared.model.keep_path(self.seq_mut(), start, keep)
    }

    fn fork(&self) -> Result<Box<dyn CausalLm>> {
        Ok(Box::new(self.fork_same()))
    }

    fn batched_forwards(&self) -> u64 {
        self.shared.batched.load(Ordering::Relaxed)
    }

    fn kv_sharing(&self) -> Option<Box<dyn KvSharing + '_>> {
        self.shared.model.kv_sharing(self.sequence())
    }

    fn head_part(&self, ids: &[u32], keep: bool) -> Result<Option<Arc<crate::nn::Linear>>> {
        self.shared.model.head_part(ids, keep)
    }
}
