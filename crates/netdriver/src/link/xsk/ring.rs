//! The four single-producer, single-consumer rings an AF_XDP socket shares with the
//! kernel (fill, completion, rx, tx), as `libxdp`'s `xsk.h` drives them.
//!
//! A ring is a power-of-two array of entries plus a producer and a consumer index, free
//! running `u32`s (an entry's slot is `index & (size - 1)`; the difference of two indices
//! is meaningful across wrap-around). Each side keeps a cached copy of the other side's
//! index and reads the shared one (with `Acquire`) only when the cache says it is out of
//! room or out of entries; it publishes its own index with `Release` after writing or
//! reading the entries, so the kernel never sees an index ahead of the entries. The
//! arithmetic lives in [`ProdIndex`] and [`ConsIndex`], free of shared memory, so that it
//! can be tested on its own.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};

use super::sys::{Mapping, XDP_RING_NEED_WAKEUP};

/// The producer side's view of a ring: where it writes next and up to where it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProdIndex {
    /// The next index to write (published as the producer index on submit).
    pub cached_prod: u32,
    /// The consumer index last read, plus the ring's size: the first index not free.
    pub cached_cons: u32,
    /// Entries in the ring.
    pub size: u32,
}

impl ProdIndex {
    /// A producer of an empty ring of `size` entries whose indices start at `prod`.
    pub fn new(size: u32, prod: u32, cons: u32) -> ProdIndex {
        ProdIndex {
            cached_prod: prod,
            cached_cons: cons.wrapping_add(size),
            size,
        }
    }

    /// Free entries, reading the consumer index (`load`) only when the cache shows fewer
    /// than `wanted`.
    pub fn free(&mut self, wanted: u32, load: impl FnOnce() -> u32) -> u32 {
        let free = self.cached_cons.wrapping_sub(self.cached_prod);
        if free >= wanted {
            return free;
        }
        self.cached_cons = load().wrapping_add(self.size);
        self.cached_cons.wrapping_sub(self.cached_prod)
    }

    /// Takes up to `n` free entries; returns the first index and how many were taken.
    pub fn reserve(&mut self, n: u32, load: impl FnOnce() -> u32) -> (u32, u32) {
        let n = n.min(self.free(n, load));
        let at = self.cached_prod;
        self.cached_prod = self.cached_prod.wrapping_add(n);
        (at, n)
    }
}

/// The consumer side's view of a ring: where it reads next and up to where it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsIndex {
    /// The next index to read (published as the consumer index on release).
    pub cached_cons: u32,
    /// The producer index last read: the first index not yet filled.
    pub cached_prod: u32,
}

impl ConsIndex {
    /// A consumer whose indices start at `cons`, with the producer at `prod`.
    pub fn new(prod: u32, cons: u32) -> ConsIndex {
        ConsIndex {
            cached_cons: cons,
            cached_prod: prod,
        }
    }

    /// Entries ready, at most `wanted`, reading the producer index (`load`) only when the
    /// cache shows none.
    pub fn available(&mut self, wanted: u32, load: impl FnOnce() -> u32) -> u32 {
        let mut entries = self.cached_prod.wrapping_sub(self.cached_cons);
        if entries == 0 {
            self.cached_prod = load();
            entries = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        entries.min(wanted)
    }

    /// Takes up to `n` ready entries; returns the first index and how many were taken.
    pub fn peek(&mut self, n: u32, load: impl FnOnce() -> u32) -> (u32, u32) {
        let n = self.available(n, load);
        let at = self.cached_cons;
        self.cached_cons = self.cached_cons.wrapping_add(n);
        (at, n)
    }
}

/// Where a ring's parts lie in its mapping (`struct xdp_ring_offset`).
#[derive(Debug, Clone, Copy)]
pub struct RingLayout {
    /// Entries (a power of two).
    pub size: u32,
    /// Byte offset of the producer index.
    pub producer: u64,
    /// Byte offset of the consumer index.
    pub consumer: u64,
    /// Byte offset of the entries.
    pub desc: u64,
    /// Byte offset of the flags word (`XDP_RING_NEED_WAKEUP`).
    pub flags: u64,
}

impl RingLayout {
    /// The bytes to map for entries of `entry` bytes.
    pub fn map_len(&self, entry: usize) -> usize {
        self.desc as usize + self.size as usize * entry
    }
}

/// A mapped ring of `T` entries: the shared indices and the entry array.
#[derive(Debug)]
struct Shared<T> {
    map: Mapping,
    layout: RingLayout,
    _entries: PhantomData<T>,
}

impl<T: Copy> Shared<T> {
    /// Checks that `map` holds `layout` with entries of `T` and aligned indices.
    fn new(map: Mapping, layout: RingLayout) -> Option<Shared<T>> {
        let aligned = |off: u64, align: usize| off as usize % align == 0;
        let fits = |off: u64, len: usize| off as usize + len <= map.size();
        let ok = layout.size.is_power_of_two()
            && map.size() >= layout.map_len(std::mem::size_of::<T>())
            && [layout.producer, layout.consumer, layout.flags]
                .iter()
                .all(|&o| aligned(o, 4) && fits(o, 4))
            && aligned(layout.desc, std::mem::align_of::<T>());
        ok.then_some(Shared {
            map,
            layout,
            _entries: PhantomData,
        })
    }

    fn index(&self, offset: u64) -> &AtomicU32 {
        // SAFETY: `offset` is one of the layout's index offsets, checked in `new` to lie
        // inside the mapping and be 4-aligned; the kernel only ever accesses these words
        // atomically, and the borrow lives no longer than the mapping.
        unsafe { &*self.map.as_ptr().add(offset as usize).cast::<AtomicU32>() }
    }

    fn producer(&self) -> &AtomicU32 {
        self.index(self.layout.producer)
    }

    fn consumer(&self) -> &AtomicU32 {
        self.index(self.layout.consumer)
    }

    fn flags(&self) -> &AtomicU32 {
        self.index(self.layout.flags)
    }

    fn slot(&self, index: u32) -> *mut T {
        let i = (index & (self.layout.size - 1)) as usize;
        // SAFETY: `i` is below `size`, and the mapping holds `size` entries of `T` from
        // `desc` (checked in `new`); only the pointer is computed here.
        unsafe {
            self.map
                .as_ptr()
                .add(self.layout.desc as usize)
                .cast::<T>()
                .add(i)
        }
    }
}

/// The side of a ring this process produces into (fill, tx).
#[derive(Debug)]
pub struct ProdRing<T> {
    shared: Shared<T>,
    idx: ProdIndex,
}

impl<T: Copy> ProdRing<T> {
    /// The producer side of the ring in `map`; `None` when the layout does not fit.
    pub fn new(map: Mapping, layout: RingLayout) -> Option<ProdRing<T>> {
        let shared = Shared::new(map, layout)?;
        let prod = shared.producer().load(Ordering::Relaxed);
        let cons = shared.consumer().load(Ordering::Acquire);
        Some(ProdRing {
            idx: ProdIndex::new(layout.size, prod, cons),
            shared,
        })
    }

    /// Free entries, reading the kernel's consumer index only when fewer than `wanted`
    /// are known free.
    pub fn free(&mut self, wanted: u32) -> u32 {
        let cons = self.shared.consumer();
        self.idx.free(wanted, || cons.load(Ordering::Acquire))
    }

    /// Entries in the ring.
    pub fn size(&self) -> u32 {
        self.shared.layout.size
    }

    /// Writes as many of `items` as there is room for and publishes them; returns how many.
    pub fn produce(&mut self, items: &[T]) -> usize {
        let n = u32::try_from(items.len()).unwrap_or(u32::MAX);
        let cons = self.shared.consumer();
        let (at, n) = self.idx.reserve(n, || cons.load(Ordering::Acquire));
        for (i, item) in items[..n as usize].iter().enumerate() {
            let slot = self.shared.slot(at.wrapping_add(i as u32));
            // SAFETY: the slot lies between the published producer index and the
            // consumer index plus the size: the kernel does not read it until the
            // producer index is published below, and writes it never.
            unsafe { slot.write_volatile(*item) };
        }
        if n > 0 {
            self.shared
                .producer()
                .store(self.idx.cached_prod, Ordering::Release);
        }
        n as usize
    }

    /// Whether the kernel asked for a wake-up (`XDP_USE_NEED_WAKEUP`).
    pub fn needs_wakeup(&self) -> bool {
        self.shared.flags().load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0
    }
}

/// The side of a ring this process consumes from (rx, completion).
#[derive(Debug)]
pub struct ConsRing<T> {
    shared: Shared<T>,
    idx: ConsIndex,
}

impl<T: Copy> ConsRing<T> {
    /// The consumer side of the ring in `map`; `None` when the layout does not fit.
    pub fn new(map: Mapping, layout: RingLayout) -> Option<ConsRing<T>> {
        let shared = Shared::new(map, layout)?;
        let prod = shared.producer().load(Ordering::Acquire);
        let cons = shared.consumer().load(Ordering::Relaxed);
        Some(ConsRing {
            idx: ConsIndex::new(prod, cons),
            shared,
        })
    }

    /// Entries ready, at most `wanted` (reads the kernel's producer index when none are
    /// known).
    pub fn available(&mut self, wanted: u32) -> u32 {
        let prod = self.shared.producer();
        self.idx.available(wanted, || prod.load(Ordering::Acquire))
    }

    /// Copies up to `out.len()` ready entries into `out` and hands their slots back to
    /// the kernel; returns how many.
    pub fn consume(&mut self, out: &mut [T]) -> usize {
        let n = u32::try_from(out.len()).unwrap_or(u32::MAX);
        let prod = self.shared.producer();
        let (at, n) = self.idx.peek(n, || prod.load(Ordering::Acquire));
        for (i, o) in out[..n as usize].iter_mut().enumerate() {
            let slot = self.shared.slot(at.wrapping_add(i as u32));
            // SAFETY: the slot lies between the consumer index and the producer index
            // read with `Acquire`: the kernel wrote it before publishing, and does not
            // write it again until the consumer index is published below.
            *o = unsafe { slot.read_volatile() };
        }
        if n > 0 {
            self.shared
                .consumer()
                .store(self.idx.cached_cons, Ordering::Release);
        }
        n as usize
    }

    /// Whether the kernel asked for a wake-up (`XDP_USE_NEED_WAKEUP`).
    pub fn needs_wakeup(&self) -> bool {
        self.shared.flags().load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_producer_fills_the_ring_and_no_further() {
        let mut p = ProdIndex::new(8, 0, 0);
        assert_eq!(p.reserve(5, || unreachable!("room is known")), (0, 5));
        // 3 left known; asking for 4 reads the consumer, which has not moved.
        assert_eq!(p.reserve(4, || 0), (5, 3));
        assert_eq!(p.reserve(1, || 0), (8, 0));
        // The consumer took 2: two more.
        assert_eq!(p.reserve(4, || 2), (8, 2));
        assert_eq!(p.free(1, || 2), 0);
    }

    #[test]
    fn producer_indices_wrap_around_u32() {
        let start = u32::MAX - 2;
        let mut p = ProdIndex::new(4, start, start);
        assert_eq!(p.free(4, || unreachable!()), 4);
        let (at, n) = p.reserve(4, || unreachable!());
        assert_eq!((at, n), (start, 4));
        assert_eq!(p.cached_prod, 1);
        assert_eq!(p.free(1, || start), 0);
        // The consumer moved past the wrap: all four free again.
        assert_eq!(p.free(1, || 1), 4);
    }

    #[test]
    fn a_consumer_reads_only_what_was_produced() {
        let mut c = ConsIndex::new(0, 0);
        assert_eq!(c.peek(4, || 0), (0, 0));
        assert_eq!(c.peek(4, || 3), (0, 3));
        // The cache shows nothing left: the producer is read again.
        assert_eq!(c.available(4, || 3), 0);
        assert_eq!(c.peek(2, || 10), (3, 2));
        // Seven known ready: no read.
        assert_eq!(c.available(100, || unreachable!()), 5);
    }

    #[test]
    fn consumer_indices_wrap_around_u32() {
        let start = u32::MAX - 1;
        let mut c = ConsIndex::new(start, start);
        let (at, n) = c.peek(8, || start.wrapping_add(5));
        assert_eq!((at, n), (start, 5));
        assert_eq!(c.cached_cons, 3);
        assert_eq!(c.available(8, || 3), 0);
    }

    #[test]
    fn slots_are_indices_modulo_size() {
        let map = Mapping::anonymous(4096, false).unwrap();
        let layout = RingLayout {
            size: 8,
            producer: 0,
            consumer: 64,
            desc: 192,
            flags: 128,
        };
        let ring = Shared::<u64>::new(map, layout).unwrap();
        let base = ring.slot(0) as usize;
        assert_eq!(ring.slot(9) as usize - base, 8);
        assert_eq!(ring.slot(u32::MAX) as usize - base, 7 * 8);
        let map = Mapping::anonymous(4096, false).unwrap();
        let bad = RingLayout {
            desc: 4040,
            ..layout
        };
        assert!(
            Shared::<u64>::new(map, bad).is_none(),
            "entries beyond the map"
        );
    }

    #[test]
    fn a_ring_carries_entries_from_producer_to_consumer() {
        let map = Mapping::anonymous(4096, false).unwrap();
        let layout = RingLayout {
            size: 4,
            producer: 0,
            consumer: 64,
            desc: 192,
            flags: 128,
        };
        // One mapping seen from both sides, as the kernel and this process see a ring.
        let shared = Shared::<u64>::new(map, layout).unwrap();
        let mut prod = ProdRing {
            idx: ProdIndex::new(4, 0, 0),
            shared,
        };
        assert_eq!(prod.produce(&[1, 2, 3, 4, 5]), 4);
        assert_eq!(prod.shared.producer().load(Ordering::Relaxed), 4);
        let mut cons = ConsRing {
            idx: ConsIndex::new(0, 0),
            shared: prod.shared,
        };
        let mut out = [0u64; 3];
        assert_eq!(cons.consume(&mut out), 3);
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(cons.shared.consumer().load(Ordering::Relaxed), 3);
        assert!(!cons.needs_wakeup());
    }
}
