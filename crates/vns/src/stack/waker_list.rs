//! A bounded stack of waiting tasks' wakers, most recent last, that arrivals pick one
//! task from: the channels' readers (`driver::RxSignal`) and the tasks waiting on the NIC
//! queues in their runtime (`rx_poll::QueueReady`). A task leaves when its read returns
//! bytes (`Core::read_wait_over`), so that a pick finds a task that still waits.

use std::sync::{Mutex, MutexGuard};
use std::task::Waker;

#[derive(Debug)]
pub(crate) struct WakerList {
    list: Mutex<Vec<Waker>>,
    /// Most wakers held; more tasks wait for another path (the driver's wake-up, the
    /// channel threads).
    max: usize,
}

impl WakerList {
    pub(crate) fn new(max: usize) -> WakerList {
        WakerList {
            list: Mutex::new(Vec::new()),
            max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Waker>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `w` unless a waker that wakes the same task is listed (then, with `to_top`,
    /// that one moves to the top) or the list is full.
    pub(crate) fn push(&self, w: &Waker, to_top: bool) {
        let mut list = self.lock();
        match list.iter().position(|l| l.will_wake(w)) {
            Some(i) if to_top => {
                let me = list.remove(i);
                list.push(me);
            }
            Some(_) => {}
            None if list.len() < self.max => list.push(w.clone()),
            None => {}
        }
    }

    /// Takes `w`'s task off the list, keeping the others' order; whether it was listed.
    pub(crate) fn remove(&self, w: &Waker) -> bool {
        let mut list = self.lock();
        list.iter()
            .position(|l| l.will_wake(w))
            .map(|i| list.remove(i))
            .is_some()
    }

    /// The most recent waiter, taken off the list.
    pub(crate) fn pop(&self) -> Option<Waker> {
        self.lock().pop()
    }

    /// Wakers listed now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}
