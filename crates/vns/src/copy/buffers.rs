//! A bounded LIFO pool of chunk buffers.
//!
//! Reusing a cache-warm buffer beats allocating a fresh one (the seed study measured
//! 8.1 Gbit/s against 5.8 Gbit/s), and the most recently returned buffer is the warmest, so
//! the pool hands buffers out last-in first-out. It holds at most `capacity` idle buffers;
//! returns beyond that, and buffers too small for a chunk, are dropped. Counters tell
//! allocations from reuses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};

/// Counters of a [`BufferPool`] (monotonic since creation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferStats {
    /// Buffers allocated because the pool was empty.
    pub allocations: u64,
    /// Buffers handed out from the pool (or a caller's reused buffer) instead of allocated.
    pub reuses: u64,
    /// Buffers given back and kept.
    pub recycled: u64,
    /// Buffers given back but dropped: pool full, too small, or still shared.
    pub discarded: u64,
}

/// A bounded pool of `BytesMut` buffers of at least `buffer_size` bytes of capacity.
#[derive(Debug)]
pub struct BufferPool {
    buffer_size: usize,
    capacity: usize,
    idle: Mutex<Vec<BytesMut>>,
    allocations: AtomicU64,
    reuses: AtomicU64,
    recycled: AtomicU64,
    discarded: AtomicU64,
}

impl BufferPool {
    /// A pool of buffers of `buffer_size` bytes keeping at most `capacity` idle ones.
    pub fn new(buffer_size: usize, capacity: usize) -> Self {
        Self {
            buffer_size,
            capacity,
            idle: Mutex::new(Vec::with_capacity(capacity)),
            allocations: AtomicU64::new(0),
            reuses: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
        }
    }

    /// Capacity every buffer handed out has at least.
    pub fn buffer_size(&self) -> usize {
        self.buffer_size
    }

    /// Most idle buffers kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Idle buffers now held.
    pub fn idle(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<BytesMut>> {
        // A panic while holding this lock cannot leave the Vec inconsistent.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One empty buffer, reused when possible.
    pub fn take(&self) -> BytesMut {
        let mut out = Vec::with_capacity(1);
        self.take_into(1, &mut out);
        out.pop().unwrap_or_default()
    }

    /// Appends `n` empty buffers to `out`, the warmest idle ones first, allocating the
    /// rest. One lock for the batch.
    pub fn take_into(&self, n: usize, out: &mut Vec<BytesMut>) {
        let reused = {
            let mut idle = self.lock();
            let k = n.min(idle.len());
            let from = idle.len() - k;
            // Warmest (last returned) first.
            out.extend(idle.drain(from..).rev());
            k
        };
        for _ in reused..n {
            out.push(BytesMut::with_capacity(self.buffer_size));
        }
        self.reuses.fetch_add(reused as u64, Ordering::Relaxed);
        self.allocations
            .fetch_add((n - reused) as u64, Ordering::Relaxed);
    }

    /// Counts a caller-held buffer reused in place (for [`BufferStats::reuses`]).
    pub(crate) fn note_reuse(&self, n: usize) {
        self.reuses.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Gives a buffer back. Kept (cleared) if the pool has room and it can hold a chunk.
    /// Returns whether it was kept. A buffer whose view was cut down (the front part of a
    /// split, or advanced) is widened back over its whole allocation when it is the only
    /// handle left (`BytesMut::try_reclaim`, no copy, no allocation).
    pub fn put(&self, mut buf: BytesMut) -> bool {
        buf.clear();
        if buf.capacity() < self.buffer_size && !buf.try_reclaim(self.buffer_size) {
            // Too small, or still shared; reserving here would allocate anyway.
            self.discarded.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let kept = {
            let mut idle = self.lock();
            if idle.len() < self.capacity {
                idle.push(buf);
                true
            } else {
                false
            }
        };
        let counter = if kept {
            &self.recycled
        } else {
            &self.discarded
        };
        counter.fetch_add(1, Ordering::Relaxed);
        kept
    }

    /// Gives a frozen chunk back: kept only if this was its last reference (no copy is
    /// made; a chunk still shared elsewhere is just dropped here).
    pub fn put_bytes(&self, chunk: Bytes) -> bool {
        match chunk.try_into_mut() {
            Ok(buf) => self.put(buf),
            Err(_shared) => {
                self.discarded.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> BufferStats {
        BufferStats {
            allocations: self.allocations.load(Ordering::Relaxed),
            reuses: self.reuses.load(Ordering::Relaxed),
            recycled: self.recycled.load(Ordering::Relaxed),
            discarded: self.discarded.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_lifo_and_stays_bounded() {
        let pool = BufferPool::new(1024, 2);
        let mut bufs = Vec::new();
        pool.take_into(3, &mut bufs);
        assert_eq!(
            pool.stats(),
            BufferStats {
                allocations: 3,
                ..Default::default()
            }
        );
        let ptrs: Vec<*const u8> = bufs.iter().map(|b| b.as_ptr()).collect();
        for b in bufs.drain(..) {
            pool.put(b);
        }
        // Bounded: the third return is dropped.
        assert_eq!(pool.idle(), 2);
        assert_eq!(pool.stats().recycled, 2);
        assert_eq!(pool.stats().discarded, 1);
        // LIFO: the last kept (second) comes out first, same memory.
        let b = pool.take();
        assert_eq!(b.as_ptr(), ptrs[1]);
        assert!(b.is_empty() && b.capacity() >= 1024);
        let s = pool.stats();
        assert_eq!((s.allocations, s.reuses), (3, 1));
    }

    #[test]
    fn frozen_chunks_come_back_only_when_unique() {
        let pool = BufferPool::new(64, 4);
        let mut b = pool.take();
        b.extend_from_slice(&[7; 64]);
        let ptr = b.as_ptr();
        let chunk = b.freeze();
        let clone = chunk.clone();
        assert!(!pool.put_bytes(chunk), "a shared chunk must not be reused");
        assert!(pool.put_bytes(clone), "the last reference is reusable");
        let again = pool.take();
        assert_eq!(again.as_ptr(), ptr, "the same allocation comes back");
        assert!(again.is_empty());
        // Too small buffers are not kept.
        assert!(!pool.put(BytesMut::with_capacity(8)));
    }

    #[test]
    fn the_front_of_a_split_buffer_comes_back_whole_once_unique() {
        let pool = BufferPool::new(64, 4);
        let mut b = pool.take();
        b.extend_from_slice(&[1; 64]);
        let ptr = b.as_ptr();
        // A chunk cut short: the front part is sent first, the rest later.
        let front = b.split_to(16).freeze();
        let rest = b.freeze();
        let kept = front.clone();
        drop(front);
        assert!(!pool.put_bytes(kept.clone()), "the rest still shares it");
        drop(rest);
        assert!(pool.put_bytes(kept), "widened over the whole allocation");
        let again = pool.take();
        assert_eq!(again.as_ptr(), ptr);
        assert!(again.capacity() >= 64);
    }
}
