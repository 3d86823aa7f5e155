//! A bounded lock-free queue whose slots are allocated at the first push.
//!
//! A channel's Rx and Tx queues hold up to 1,024 chunks each (40 bytes a slot), 80 KiB
//! together, which every accepted connection paid at its handshake: a peer that opens
//! connections and sends nothing held that much of our memory per connection. With the
//! slots allocated when the first chunk comes, a silent connection costs only its TCP
//! state (`tests/channel_memory.rs` measures it). Once allocated the slots stay until the
//! channel goes, so the hot path is an `ArrayQueue`'s, plus one load.

use std::sync::OnceLock;

use crossbeam_queue::ArrayQueue;

/// An [`ArrayQueue`] of `capacity` slots, allocated by the first [`push`](Self::push).
#[derive(Debug)]
pub(crate) struct LazyQueue<T> {
    capacity: usize,
    slots: OnceLock<ArrayQueue<T>>,
}

impl<T> LazyQueue<T> {
    /// A queue of `capacity` (at least 1) slots, none allocated yet.
    pub(crate) fn new(capacity: usize) -> Self {
        LazyQueue {
            capacity: capacity.max(1),
            slots: OnceLock::new(),
        }
    }

    /// Appends `value`, allocating the slots first if none are; hands it back when full.
    pub(crate) fn push(&self, value: T) -> Result<(), T> {
        self.slots
            .get_or_init(|| ArrayQueue::new(self.capacity))
            .push(value)
    }

    /// The oldest value, if any.
    pub(crate) fn pop(&self) -> Option<T> {
        self.slots.get()?.pop()
    }

    /// Most values the queue holds.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Values queued.
    pub(crate) fn len(&self) -> usize {
        self.slots.get().map_or(0, ArrayQueue::len)
    }

    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.get().is_none_or(ArrayQueue::is_empty)
    }

    /// Whether a push would fail.
    pub(crate) fn is_full(&self) -> bool {
        self.slots.get().is_some_and(ArrayQueue::is_full)
    }

    /// Whether the slots are allocated (a chunk came at some point).
    #[cfg(test)]
    pub(crate) fn is_allocated(&self) -> bool {
        self.slots.get().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_at_the_first_push_and_keeps_the_bound() {
        let q = LazyQueue::new(2);
        assert!(!q.is_allocated());
        assert!(q.is_empty() && !q.is_full());
        assert_eq!(q.len(), 0);
        assert_eq!(q.pop(), None);
        assert!(!q.is_allocated(), "a pop allocates nothing");
        assert_eq!(q.push(1), Ok(()));
        assert!(q.is_allocated());
        assert_eq!(q.push(2), Ok(()));
        assert!(q.is_full());
        assert_eq!(q.push(3), Err(3));
        assert_eq!(
            (q.len(), q.pop(), q.pop(), q.pop()),
            (2, Some(1), Some(2), None)
        );
    }
}
