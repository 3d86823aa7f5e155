//! Wake-ups: the tasks a call or a round leaves to wake once its locks are released, the
//! wakers a stream's tasks leave with their shard, and the control task's signal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

use atomic_waker::AtomicWaker;

/// Items gathered under a lock to be handled after it (wake-ups): the first in place,
/// the rest in a `Vec`. Most calls leave one or none, and a `Vec` per call allocated and
/// freed a buffer per message.
#[derive(Debug)]
pub(crate) struct Few<T> {
    first: Option<T>,
    rest: Vec<T>,
}

impl<T> Default for Few<T> {
    fn default() -> Self {
        Few {
            first: None,
            rest: Vec::new(),
        }
    }
}

impl<T> Few<T> {
    pub(crate) fn push(&mut self, item: T) {
        if self.first.is_none() {
            self.first = Some(item);
        } else {
            self.rest.push(item);
        }
    }

    /// Hands every item to `f`, first in first out, leaving it empty.
    pub(crate) fn drain_each(&mut self, mut f: impl FnMut(T)) {
        if let Some(first) = self.first.take() {
            f(first);
            if !self.rest.is_empty() {
                self.rest.drain(..).for_each(f);
            }
        }
    }
}

impl<T> Extend<T> for Few<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, items: I) {
        for item in items {
            self.push(item);
        }
    }
}

/// Tasks to wake once no lock is held.
pub(crate) type Wakes = Few<Waker>;

/// A stream's or connect's wakers, kept with its shard.
#[derive(Debug, Default)]
pub(crate) struct SockWake {
    pub read: Option<Waker>,
    pub write: Option<Waker>,
    pub timed_out: bool,
}

/// Wakes the stack's control task (`control`): channels to accept or drop, timers,
/// waiters, a stop. Never on a message's path, except a channel that dies.
#[derive(Debug, Default)]
pub(crate) struct ControlSignal {
    waker: AtomicWaker,
    notified: AtomicBool,
    stop: AtomicBool,
}

impl ControlSignal {
    /// Makes the control task run a round (cheap when a round is due already).
    pub(crate) fn notify(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            self.waker.wake();
        }
    }

    /// Asks the control task to stop the stack now.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.notified.store(true, Ordering::Release);
        self.waker.wake();
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// The control task's waker, registered at each of its polls.
    pub(crate) fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }

    /// Clears the notification (the control task is about to run a round).
    pub(crate) fn take(&self) -> bool {
        self.notified.swap(false, Ordering::AcqRel)
    }
}

impl Wake for ControlSignal {
    fn wake(self: Arc<Self>) {
        self.notify();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.notify();
    }
}
