//! State shared by all queues of a set, off the per-segment hot path: the flow directory
//! (which queue owns a 4-tuple), the local-port allocator, and the pool of buffers for
//! frames forwarded between queues.
//!
//! The directory and the allocator are mutex-protected maps: they are touched when a
//! connection is opened or removed, and for segments that arrive on a queue that does not
//! own their flow, never for a segment of a flow the receiving queue owns.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddrV4;
use std::ops::RangeInclusive;
use std::sync::Mutex;

use crossbeam_queue::ArrayQueue;

/// A connection's `(local, remote)` addresses.
pub(crate) type Tuple = (SocketAddrV4, SocketAddrV4);

/// 4-tuple → index of the owning queue.
#[derive(Debug, Default)]
pub(crate) struct FlowDirectory {
    map: Mutex<HashMap<Tuple, usize>>,
}

/// What the directory says about a flow, from one thread's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Nobody owns it.
    Nobody,
    /// The asking thread.
    Me,
    /// Another thread (its index).
    Other(usize),
}

impl FlowDirectory {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Tuple, usize>> {
        // A panic while holding the lock cannot leave the map inconsistent (single
        // inserts and removes), so a poisoned lock is used as is.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that thread `me` owns `t` (replacing any owner).
    pub(crate) fn insert(&self, t: Tuple, me: usize) {
        self.lock().insert(t, me);
    }

    /// Claims `t` for `me` unless another thread owns it; returns the owner after the call.
    pub(crate) fn claim(&self, t: Tuple, me: usize) -> Owner {
        let mut map = self.lock();
        match map.get(&t) {
            Some(&o) if o != me => Owner::Other(o),
            _ => {
                map.insert(t, me);
                Owner::Me
            }
        }
    }

    /// Who owns `t`.
    pub(crate) fn owner(&self, t: &Tuple, me: usize) -> Owner {
        match self.lock().get(t) {
            None => Owner::Nobody,
            Some(&o) if o == me => Owner::Me,
            Some(&o) => Owner::Other(o),
        }
    }

    /// Forgets `t` if `me` owns it.
    pub(crate) fn remove(&self, t: &Tuple, me: usize) {
        let mut map = self.lock();
        if map.get(t) == Some(&me) {
            map.remove(t);
        }
    }

    /// Number of flows recorded.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Local ports of outgoing channels, unique across all threads of a set.
#[derive(Debug)]
pub(crate) struct PortAllocator {
    range: RangeInclusive<u16>,
    state: Mutex<(u16, HashSet<u16>)>,
}

impl PortAllocator {
    pub(crate) fn new(range: RangeInclusive<u16>) -> PortAllocator {
        let first = *range.start();
        PortAllocator {
            range,
            state: Mutex::new((first, HashSet::new())),
        }
    }

    /// Where the next scan for a free port starts: just after the last port claimed, so
    /// that ports are taken round-robin over the range (a port just released is the last
    /// to be reused).
    pub(crate) fn cursor(&self) -> u16 {
        let guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        guard.0.clamp(*self.range.start(), *self.range.end())
    }

    /// Takes `port` if it is in the range and free, and moves the [`cursor`](Self::cursor)
    /// past it; whether it was taken. A port chooser asks about candidates in its own order
    /// (those whose replies land on a channel's queue, say) and keeps the first taken.
    pub(crate) fn try_claim(&self, port: u16) -> bool {
        let (lo, hi) = (*self.range.start(), *self.range.end());
        if !(lo..=hi).contains(&port) {
            return false;
        }
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (next, used) = &mut *guard;
        if !used.insert(port) {
            return false;
        }
        *next = if port == hi { lo } else { port + 1 };
        true
    }

    /// The range ports come from.
    pub(crate) fn range(&self) -> RangeInclusive<u16> {
        self.range.clone()
    }

    /// Gives `port` back.
    pub(crate) fn release(&self, port: u16) {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        guard.1.remove(&port);
    }

    /// Ports in use.
    pub(crate) fn in_use(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1.len()
    }
}

/// Recycled frame buffers for forwarding; bounded, so a flood allocates at most the pool
/// plus what the bounded forwarding channels hold.
#[derive(Debug)]
pub(crate) struct BufferPool {
    bufs: ArrayQueue<Vec<u8>>,
}

impl BufferPool {
    pub(crate) fn new(capacity: usize) -> BufferPool {
        BufferPool {
            bufs: ArrayQueue::new(capacity.max(1)),
        }
    }

    /// A buffer holding a copy of `frame`.
    pub(crate) fn copy_of(&self, frame: &[u8]) -> Vec<u8> {
        let mut buf = self.bufs.pop().unwrap_or_else(|| Vec::with_capacity(2048));
        buf.clear();
        buf.extend_from_slice(frame);
        buf
    }

    /// Returns a buffer (dropped when the pool is full).
    pub(crate) fn put(&self, buf: Vec<u8>) {
        let _ = self.bufs.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn t(p: u16) -> Tuple {
        (
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), p),
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 9000),
        )
    }

    #[test]
    fn directory_claims_and_removes_per_owner() {
        let d = FlowDirectory::default();
        assert_eq!(d.owner(&t(1), 0), Owner::Nobody);
        assert_eq!(d.claim(t(1), 0), Owner::Me);
        assert_eq!(d.claim(t(1), 1), Owner::Other(0));
        assert_eq!(d.owner(&t(1), 1), Owner::Other(0));
        // Only the owner removes.
        d.remove(&t(1), 1);
        assert_eq!(d.len(), 1);
        d.remove(&t(1), 0);
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn ports_are_unique_until_released() {
        let a = PortAllocator::new(100..=102);
        assert_eq!(a.cursor(), 100);
        assert!(a.try_claim(101));
        assert_eq!(a.cursor(), 102);
        assert!(!a.try_claim(101), "taken twice");
        assert!(!a.try_claim(99) && !a.try_claim(103), "outside the range");
        assert!(a.try_claim(102));
        assert_eq!(a.cursor(), 100, "wraps after the last port");
        assert!(a.try_claim(100));
        assert_eq!(a.in_use(), 3);
        a.release(101);
        assert_eq!(a.in_use(), 2);
        assert!(a.try_claim(101));
        assert_eq!(a.cursor(), 102);
    }

    #[test]
    fn pool_recycles() {
        let p = BufferPool::new(1);
        let b = p.copy_of(b"abc");
        assert_eq!(b, b"abc");
        p.put(b);
        let b = p.copy_of(b"x");
        assert_eq!(b, b"x");
        assert!(b.capacity() >= 3);
    }
}
