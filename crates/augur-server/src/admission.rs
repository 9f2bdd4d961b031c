//! Admission, first come first served: the slots sequences run in and the queue before them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Admission, first come first served: at most `slots` sequences run, at most `queue` requests wait, and they
/// are admitted in the order they came (a request for `n` choices is not passed by later smaller ones).
pub(crate) struct Scheduler {
    pub(crate) slots: usize,
    pub(crate) queue: usize,
    state: Mutex<Admission>,
    freed: Condvar,
    /// Running sequences, read by every sequence's back-off policy.
    pub(crate) running: Arc<AtomicUsize>,
}

#[derive(Debug, Default)]
struct Admission {
    running: usize,
    waiting: usize,
    /// The ticket the next request to arrive takes, and the ticket admitted next.
    next_ticket: u64,
    serving: u64,
}

/// `n` slots, given back on drop.
pub(crate) struct Permit<'a>(&'a Scheduler, usize);

impl Scheduler {
    pub(crate) fn new(slots: usize, queue: usize) -> Self {
        Scheduler {
            slots,
            queue,
            state: Mutex::new(Admission::default()),
            freed: Condvar::new(),
            running: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn state(&self) -> MutexGuard<'_, Admission> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for `n` slots at once (a request's choices start together, and no request holds slots while it
    /// waits for more) behind every request that came earlier, or returns `None` at once when the queue is
    /// full. `n` is at most `slots`.
    pub(crate) fn admit(&self, n: usize) -> Option<Permit<'_>> {
        let mut s = self.state();
        let first = s.serving == s.next_ticket;
        if !(first && s.running + n <= self.slots) && s.waiting >= self.queue {
            return None;
        }
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.waiting += 1;
        while s.serving != ticket || s.running + n > self.slots {
            s = self.freed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.waiting -= 1;
        s.serving += 1;
        s.running += n;
        self.running.store(s.running, Ordering::Relaxed);
        // The next in line may fit too.
        self.freed.notify_all();
        Some(Permit(self, n))
    }

    /// (running, waiting)
    pub(crate) fn gauges(&self) -> (usize, usize) {
        let s = self.state();
        (s.running, s.waiting)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state();
        s.running -= self.1;
        self.0.running.store(s.running, Ordering::Relaxed);
        self.0.freed.notify_all();
    }
}
