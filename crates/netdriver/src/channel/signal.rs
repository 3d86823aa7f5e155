//! How a queue's driver is woken: one waker that every enqueue, command, forwarded frame
//! and resume wakes, and the flags that say why.
//!
//! A [`QueueSignal`] belongs to one NIC queue, not to whoever drives it: when the queue
//! moves to another runtime (`placement`), its new driver registers its own waker here
//! and every wake-up follows it.
//!
//! Wake-ups coalesce: [`QueueSignal::notify`] sets a *pending* flag and wakes the driver
//! only when the flag was clear. The driver clears it ([`QueueSignal::take_pending`])
//! before each round, after it registered its waker, so that work queued during a round
//! either is seen by that round or wakes the driver again; a burst of enqueues between
//! two rounds costs one wake-up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Waker;

use atomic_waker::AtomicWaker;

use super::clock::RuntimeClock;

/// What wakes one queue's driver. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct QueueSignal {
    waker: AtomicWaker,
    /// Work is waiting that the driver has not taken yet.
    pending: AtomicBool,
    /// Commands or forwarded frames were queued since a round last took them.
    control: AtomicBool,
    /// The queue died (fault injection, `ChannelSet::kill_queue`): nobody runs its rounds
    /// any more.
    dead: AtomicBool,
    /// When `pending` last went up while clear (microseconds of the set's clock, plus
    /// one; 0: not pending), for the watchdog that moves a queue off a stalled runtime.
    pending_since: AtomicU64,
    /// Wake-ups that found the flag clear and woke a driver.
    wakeups: AtomicU64,
    clock: RuntimeClock,
}

impl QueueSignal {
    pub(crate) fn new(clock: RuntimeClock) -> QueueSignal {
        QueueSignal {
            waker: AtomicWaker::new(),
            pending: AtomicBool::new(false),
            control: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            pending_since: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            clock,
        }
    }

    /// The driver's waker, registered at the start of each of its polls.
    pub(crate) fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }

    /// Work for the driver: wakes it unless a wake-up is already pending.
    pub(crate) fn notify(&self) {
        if self.pending.swap(true, Ordering::AcqRel) {
            return;
        }
        self.pending_since
            .store(self.clock.now().total_micros() + 1, Ordering::Relaxed);
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        self.waker.wake();
    }

    /// [`notify`](Self::notify) for commands or forwarded frames.
    pub(crate) fn notify_control(&self) {
        self.control.store(true, Ordering::Release);
        self.notify();
    }

    /// Wakes whoever is registered, whatever the flags (a queue moving away from it).
    pub(crate) fn wake_driver(&self) {
        self.waker.wake();
    }

    /// Clears the pending flag; whether it was set.
    pub(crate) fn take_pending(&self) -> bool {
        if !self.pending.load(Ordering::Acquire) {
            return false;
        }
        self.pending_since.store(0, Ordering::Relaxed);
        self.pending.swap(false, Ordering::AcqRel)
    }

    /// Whether work is pending (not cleared).
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Since when work has been pending, in the set's clock; `None` when none is.
    pub(crate) fn pending_since(&self) -> Option<crate::time::Instant> {
        match self.pending_since.load(Ordering::Relaxed) {
            0 => None,
            v => Some(crate::time::Instant::from_micros(v - 1)),
        }
    }

    /// Takes the control flag (commands or forwarded frames to look at).
    pub(crate) fn take_control(&self) -> bool {
        self.control.load(Ordering::Acquire) && self.control.swap(false, Ordering::AcqRel)
    }

    /// Sets the control flag again without waking (a round's budget left some).
    pub(crate) fn mark_control(&self) {
        self.control.store(true, Ordering::Release);
        self.pending.store(true, Ordering::Release);
    }

    /// Whether commands or forwarded frames wait.
    pub(crate) fn control_pending(&self) -> bool {
        self.control.load(Ordering::Acquire)
    }

    pub(crate) fn set_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Wake-ups of the driver so far (coalesced ones not counted).
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct Count(AtomicU64);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A burst of notifications between two takes wakes the driver once; a take re-arms.
    #[test]
    fn notifications_coalesce_until_taken() {
        let sig = QueueSignal::new(RuntimeClock::new());
        let count = Arc::new(Count(AtomicU64::new(0)));
        let waker = Waker::from(count.clone());
        sig.register(&waker);
        for _ in 0..100 {
            sig.notify();
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(sig.pending_since().is_some());
        assert!(sig.take_pending());
        assert!(!sig.take_pending());
        assert!(sig.pending_since().is_none());
        sig.register(&waker);
        sig.notify();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert_eq!(sig.wakeups(), 2);
        // Control work is marked and pends like any other.
        assert!(sig.take_pending());
        sig.register(&waker);
        sig.notify_control();
        assert!(sig.take_control());
        assert!(!sig.take_control());
        assert_eq!(count.0.load(Ordering::SeqCst), 3);
    }
}
