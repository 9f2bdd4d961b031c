//! Admission, first come first served: the slots sequences run in and the queue before them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// At most `slots` sequences run, at most `queue` requests wait, and they are admitted in the order they came (a
/// request for `n` sequences is not passed by later smaller ones).
pub struct Admission {
    slots: usize,
    queue: usize,
    state: Mutex<Queue>,
    freed: Condvar,
    /// Running sequences, read by every sequence's back-off policy.
    running: Arc<AtomicUsize>,
}

#[derive(Debug, Default)]
struct Queue {
    running: usize,
    waiting: usize,
    /// The ticket the next request to arrive takes, and the ticket admitted next.
    next_ticket: u64,
    serving: u64,
}

/// `n` slots, given back on drop.
pub struct Permit<'a> {
    admission: &'a Admission,
    slots: usize,
}

impl Admission {
    pub fn new(slots: usize, queue: usize) -> Self {
        Admission {
            slots,
            queue,
            state: Mutex::new(Queue::default()),
            freed: Condvar::new(),
            running: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Most sequences that run at once.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Most requests that wait for slots.
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// The count of running sequences, shared (a back-off policy reads it).
    pub fn running(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.running)
    }

    fn state(&self) -> MutexGuard<'_, Queue> {
        super::lock(&self.state)
    }

    /// Waits for `n` slots at once (a request's sequences start together, and no request holds slots while it
    /// waits for more) behind every request that came earlier, or returns `None` at once when the queue is
    /// full. `n` is at most `slots`.
    pub fn admit(&self, n: usize) -> Option<Permit<'_>> {
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
        Some(Permit { admission: self, slots: n })
    }

    /// (running, waiting)
    pub fn gauges(&self) -> (usize, usize) {
        let s = self.state();
        (s.running, s.waiting)
    }
}

impl Permit<'_> {
    /// The slots it holds.
    pub fn slots(&self) -> usize {
        self.slots
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut s = self.admission.state();
        s.running -= self.slots;
        self.admission.running.store(s.running, Ordering::Relaxed);
        self.admission.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Waits (only to catch a hang) until the gauges satisfy `done`, and returns them.
    fn gauges_when(admission: &Admission, done: impl Fn((usize, usize)) -> bool) -> (usize, usize) {
        let t0 = Instant::now();
        loop {
            let g = admission.gauges();
            if done(g) {
                return g;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "stuck at {g:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A request for 2 slots waiting for them is not passed by a later request for 1 that would fit (else a
    /// steady stream of single requests could hold `n > 1` off forever).
    #[test]
    fn admission_is_first_come_first_served() {
        let admission = Admission::new(2, 8);
        let first = admission.admit(1).unwrap();
        std::thread::scope(|s| {
            let pair = s.spawn(|| {
                let p = admission.admit(2).unwrap();
                let running = admission.gauges().0;
                drop(p);
                running
            });
            gauges_when(&admission, |(_, waiting)| waiting == 1);
            let (release, released) = std::sync::mpsc::channel::<()>();
            let admission = &admission;
            let single = s.spawn(move || {
                let p = admission.admit(1).unwrap();
                let _ = released.recv();
                drop(p);
            });
            // The single request fits beside `first`, but it came after the pair: it waits.
            let g = gauges_when(admission, |(running, waiting)| running == 2 || waiting == 2);
            assert_eq!(g, (1, 2), "the later single request must queue behind the pair");
            drop(first);
            assert_eq!(pair.join().unwrap(), 2, "the pair ran with both slots");
            release.send(()).unwrap();
            single.join().unwrap();
        });
        assert_eq!(admission.gauges(), (0, 0));
    }

    /// A full queue refuses at once rather than waiting; the shared running count follows the permits.
    #[test]
    fn a_full_queue_refuses_and_running_follows_the_permits() {
        let admission = Admission::new(1, 0);
        let running = admission.running();
        let held = admission.admit(1).unwrap();
        assert_eq!(running.load(Ordering::Relaxed), 1);
        assert!(admission.admit(1).is_none(), "no slot free and no room to wait: refused");
        drop(held);
        assert_eq!(running.load(Ordering::Relaxed), 0);
        assert!(admission.admit(1).is_some());
    }
}
