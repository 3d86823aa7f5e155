//! Reordering a socket's chunks that arrive over several channels.

use std::collections::{BTreeMap, VecDeque};

use thiserror::Error;

use crate::wire::Seq;

/// Why a chunk could not go into a [`ReorderBuffer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ReorderError {
    /// The chunk starts before the next byte the buffer expects (already delivered or
    /// already held contiguously): a duplicate or a peer bug.
    #[error("chunk starts before the receive window")]
    Stale,
    /// The chunk reaches past the end of the window.
    #[error("chunk ends past the receive window")]
    OutOfWindow,
    /// The chunk overlaps bytes already held out of order.
    #[error("chunk overlaps a chunk already held")]
    Overlap,
}

/// In-order pieces shorter than this are copied onto the previous piece.
const SMALL_PIECE: usize = 2048;

/// Holds one socket's received bytes until the application reads them, reordering chunks
/// by sequence number.
///
/// The buffer accepts only bytes inside its window `[read_seq, read_seq + capacity)`,
/// where `read_seq` is the next byte the application will read; so it never holds more
/// than `capacity` bytes, however chunks are delayed, and a chunk whose start is the next
/// byte to read always fits once the application has read (a chunk is at most `capacity`
/// bytes). Chunks that do not fit yet wait elsewhere (the socket's response queue).
#[derive(Debug)]
pub struct ReorderBuffer {
    capacity: usize,
    /// Sequence number of the first byte in `ready` (the next byte to read).
    read_seq: Seq,
    /// Bytes read by the application so far; offsets below are relative to the stream start.
    read_offset: u64,
    /// In-order bytes not yet read, as the chunks' own buffers (moved in, not copied);
    /// the first `head` bytes of the front one were read already.
    ready: VecDeque<Vec<u8>>,
    head: usize,
    /// Bytes in `ready` past `head`.
    ready_len: usize,
    /// Out-of-order chunks, keyed by stream offset; they neither overlap each other nor
    /// `ready`.
    pending: BTreeMap<u64, Vec<u8>>,
    pending_bytes: usize,
}

impl ReorderBuffer {
    /// An empty buffer whose first expected byte is `start`, holding at most `capacity`
    /// bytes (at most 2^30).
    pub fn new(start: Seq, capacity: usize) -> Self {
        assert!(
            capacity <= 1 << 30,
            "reorder window must stay far below 2^31"
        );
        ReorderBuffer {
            capacity,
            read_seq: start,
            read_offset: 0,
            ready: VecDeque::new(),
            head: 0,
            ready_len: 0,
            pending: BTreeMap::new(),
            pending_bytes: 0,
        }
    }

    /// The bound on bytes held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held now (in order and out of order); never more than [`Self::capacity`].
    pub fn len(&self) -> usize {
        self.ready_len + self.pending_bytes
    }

    /// Whether no byte is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// In-order bytes the application can read now.
    pub fn readable(&self) -> usize {
        self.ready_len
    }

    /// Sequence number of the next byte the application will read.
    pub fn read_seq(&self) -> Seq {
        self.read_seq
    }

    /// Sequence number just past the in-order bytes (the next byte needed for progress).
    pub fn contiguous_end(&self) -> Seq {
        self.read_seq.plus(self.ready_len as u32)
    }

    /// Sequence number just past the window.
    pub fn window_end(&self) -> Seq {
        self.read_seq.plus(self.capacity as u32)
    }

    /// Whether a chunk of `len` bytes at `seq` lies inside the window now.
    pub fn fits(&self, seq: Seq, len: usize) -> bool {
        let d = seq.since(self.read_seq);
        d >= 0 && d as u64 + len as u64 <= self.capacity as u64
    }

    /// Whether `len` bytes at `seq` (at or after [`Self::read_seq`], inside the window
    /// or beyond it) would overlap bytes held now, in order or out of order. The endpoint
    /// asks this before parking a chunk that does not fit yet, so that a parked chunk can
    /// always be inserted once the window reaches it.
    pub fn overlaps_held(&self, seq: Seq, len: usize) -> bool {
        let d = seq.since(self.read_seq);
        if len == 0 {
            return false;
        }
        if d < 0 || (d as u64) < self.ready_len as u64 {
            return true;
        }
        let off = self.read_offset + d as u64;
        let end = off + len as u64;
        if let Some((&k, v)) = self.pending.range(..=off).next_back() {
            if k + v.len() as u64 > off {
                return true;
            }
        }
        self.pending
            .range(off..)
            .next()
            .is_some_and(|(&k, _)| k < end)
    }

    /// Whether exactly `len` bytes at `seq` are held out of order as one chunk (the same
    /// chunk arriving again).
    pub fn holds_exactly(&self, seq: Seq, len: usize) -> bool {
        let d = seq.since(self.read_seq);
        if d < 0 || (d as u64) < self.ready_len as u64 {
            return false;
        }
        let off = self.read_offset + d as u64;
        self.pending.get(&off).is_some_and(|v| v.len() == len)
    }

    /// Stores a chunk. Fails without storing anything if it is outside the window or
    /// overlaps bytes already held.
    pub fn insert(&mut self, seq: Seq, data: &[u8]) -> Result<(), ReorderError> {
        self.check(seq, data.len())?;
        self.insert_vec(seq, data.to_vec())
    }

    /// [`insert`](Self::insert) taking the chunk's buffer, which the reorder buffer keeps
    /// instead of copying the bytes.
    pub fn insert_vec(&mut self, seq: Seq, data: Vec<u8>) -> Result<(), ReorderError> {
        let off = self.check(seq, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let contiguous = self.read_offset + self.ready_len as u64;
        if off == contiguous {
            self.push_ready(data);
            while let Some(entry) = self.pending.first_entry() {
                if *entry.key() != self.read_offset + self.ready_len as u64 {
                    break;
                }
                let v = entry.remove();
                self.pending_bytes -= v.len();
                self.push_ready(v);
            }
        } else {
            self.pending_bytes += data.len();
            self.pending.insert(off, data);
        }
        debug_assert!(self.len() <= self.capacity);
        Ok(())
    }

    /// Appends in-order bytes; small pieces are copied onto the last buffer, so that the
    /// per-buffer overhead stays small next to the bytes held.
    fn push_ready(&mut self, data: Vec<u8>) {
        self.ready_len += data.len();
        match self.ready.back_mut() {
            // Only where that costs no reallocation of a large buffer.
            Some(last)
                if data.len() < SMALL_PIECE
                    && (last.capacity() - last.len() >= data.len()
                        || last.len() < 4 * SMALL_PIECE) =>
            {
                last.extend_from_slice(&data)
            }
            _ => self.ready.push_back(data),
        }
    }

    /// Where a chunk of `len` bytes at `seq` would go (its stream offset), if it may.
    fn check(&self, seq: Seq, len: usize) -> Result<u64, ReorderError> {
        let d = seq.since(self.read_seq);
        if d < 0 || (d as u64) < self.ready_len as u64 {
            return Err(ReorderError::Stale);
        }
        if d as u64 + len as u64 > self.capacity as u64 {
            return Err(ReorderError::OutOfWindow);
        }
        let off = self.read_offset + d as u64;
        if len == 0 {
            return Ok(off);
        }
        let end = off + len as u64;
        if let Some((&k, v)) = self.pending.range(..=off).next_back() {
            if k + v.len() as u64 > off {
                return Err(ReorderError::Overlap);
            }
        }
        if let Some((&k, _)) = self.pending.range(off..).next() {
            if k < end {
                return Err(ReorderError::Overlap);
            }
        }
        Ok(off)
    }

    /// Lends the in-order bytes, at most `max`, to `copy` as the chunks' own slices (no
    /// copy is made here), then consumes as many bytes as `copy` returns (at most what it
    /// was lent) and returns that count. Emptied chunk buffers go to `spare` like
    /// [`read_recycling`](Self::read_recycling). For copying out with several threads
    /// ([`CopyWorkerPool::copy_out`](crate::copy::CopyWorkerPool::copy_out)).
    pub fn read_with(
        &mut self,
        max: usize,
        spare: &mut Vec<Vec<u8>>,
        keep: usize,
        min_capacity: usize,
        copy: impl FnOnce(&[&[u8]]) -> usize,
    ) -> usize {
        let want = max.min(self.ready_len);
        if want == 0 {
            return 0;
        }
        let mut slices: Vec<&[u8]> = Vec::new();
        let mut lent = 0;
        let mut skip = self.head;
        for chunk in &self.ready {
            if lent == want {
                break;
            }
            let k = (chunk.len() - skip).min(want - lent);
            slices.push(&chunk[skip..skip + k]);
            lent += k;
            skip = 0;
        }
        let n = copy(&slices).min(want);
        self.consume(n, spare, keep, min_capacity);
        n
    }

    /// Drops `n` (at most `ready_len`) in-order bytes from the front, recycling emptied
    /// buffers as [`read_recycling`](Self::read_recycling) does.
    fn consume(&mut self, n: usize, spare: &mut Vec<Vec<u8>>, keep: usize, min_capacity: usize) {
        let mut done = 0;
        while done < n {
            let front = self.ready.front().expect("ready_len counts these bytes");
            let k = (front.len() - self.head).min(n - done);
            done += k;
            self.head += k;
            if self.head == front.len() {
                let mut emptied = self.ready.pop_front().expect("front exists");
                self.head = 0;
                if spare.len() < keep && emptied.capacity() >= min_capacity {
                    emptied.clear();
                    spare.push(emptied);
                }
            }
        }
        self.ready_len -= n;
        self.read_seq = self.read_seq.plus(n as u32);
        self.read_offset += n as u64;
    }

    /// Copies in-order bytes into `buf`, returning how many.
    pub fn read(&mut self, buf: &mut [u8]) -> usize {
        self.read_recycling(buf, &mut Vec::new(), 0, 0)
    }

    /// [`read`](Self::read), moving the chunk buffers it empties (cleared) to `spare`
    /// while `spare` holds fewer than `keep` and they have at least `min_capacity`.
    pub fn read_recycling(
        &mut self,
        buf: &mut [u8],
        spare: &mut Vec<Vec<u8>>,
        keep: usize,
        min_capacity: usize,
    ) -> usize {
        let n = buf.len().min(self.ready_len);
        let mut done = 0;
        while done < n {
            let front = self.ready.front().expect("ready_len counts these bytes");
            let k = (front.len() - self.head).min(n - done);
            buf[done..done + k].copy_from_slice(&front[self.head..self.head + k]);
            done += k;
            self.head += k;
            if self.head == front.len() {
                let done = self.ready.pop_front().expect("front exists");
                self.head = 0;
                if spare.len() < keep && done.capacity() >= min_capacity {
                    let mut done = done;
                    done.clear();
                    spare.push(done);
                }
            }
        }
        self.ready_len -= n;
        self.read_seq = self.read_seq.plus(n as u32);
        self.read_offset += n as u64;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn delivers_in_order_across_wrap() {
        let start = Seq(u32::MAX - 5);
        let mut r = ReorderBuffer::new(start, 20);
        r.insert(start.plus(10), b"klmno").unwrap();
        r.insert(start.plus(5), b"fghij").unwrap();
        assert_eq!(r.readable(), 0);
        assert_eq!(r.len(), 10);
        r.insert(start, b"abcde").unwrap();
        assert_eq!(r.readable(), 15);
        let mut buf = [0; 32];
        assert_eq!(r.read(&mut buf), 15);
        assert_eq!(&buf[..15], b"abcdefghijklmno");
        assert_eq!(r.read_seq(), start.plus(15));
        assert!(r.is_empty());
    }

    #[test]
    fn reading_recycles_emptied_buffers() {
        let mut r = ReorderBuffer::new(Seq(0), 1 << 16);
        r.insert_vec(Seq(0), vec![1; 5000]).unwrap();
        r.insert_vec(Seq(5000), vec![2; 5000]).unwrap();
        let mut spare = Vec::new();
        let mut buf = vec![0; 6000];
        assert_eq!(r.read_recycling(&mut buf, &mut spare, 4, 4096), 6000);
        assert_eq!(&buf[..5000], &[1; 5000][..]);
        assert_eq!(&buf[5000..], &[2; 1000][..]);
        // The first buffer was emptied and recycled (cleared), the second is still read.
        assert_eq!(spare.len(), 1);
        assert!(spare[0].is_empty() && spare[0].capacity() >= 5000);
        assert_eq!(r.read_recycling(&mut buf, &mut spare, 1, 4096), 4000);
        assert_eq!(spare.len(), 1, "keeps at most `keep`");
        assert!(r.is_empty());
    }

    #[test]
    fn read_with_lends_slices_and_consumes_what_was_taken() {
        let mut r = ReorderBuffer::new(Seq(10), 1 << 16);
        r.insert_vec(Seq(10), vec![1; 5000]).unwrap();
        r.insert_vec(Seq(5010), vec![2; 5000]).unwrap();
        r.insert_vec(Seq(10_010), vec![3; 5000]).unwrap();
        let mut head = [0u8; 100];
        assert_eq!(r.read(&mut head), 100);
        let mut spare = Vec::new();
        // Lent: the rest of the first chunk and part of the second, as they are.
        let n = r.read_with(7000, &mut spare, 4, 4096, |slices| {
            assert_eq!(
                slices.iter().map(|s| s.len()).collect::<Vec<_>>(),
                [4900, 2100]
            );
            assert!(slices[0].iter().all(|&b| b == 1) && slices[1].iter().all(|&b| b == 2));
            6000 // took less than lent
        });
        assert_eq!(n, 6000);
        assert_eq!(spare.len(), 1, "the emptied first chunk is recycled");
        assert_eq!(r.read_seq(), Seq(6110));
        assert_eq!(r.readable(), 15_000 - 6100);
        // A closure claiming more than it was lent consumes only what was lent.
        assert_eq!(
            r.read_with(usize::MAX, &mut spare, 4, 4096, |_| usize::MAX),
            8900
        );
        assert!(r.is_empty());
        assert_eq!(
            r.read_with(10, &mut spare, 4, 4096, |_| panic!("nothing to lend")),
            0
        );
    }

    #[test]
    fn rejects_outside_window_and_overlaps() {
        let mut r = ReorderBuffer::new(Seq(100), 10);
        assert_eq!(
            r.insert(Seq(105), b"abcdef"),
            Err(ReorderError::OutOfWindow)
        );
        assert_eq!(r.insert(Seq(99), b"a"), Err(ReorderError::Stale));
        r.insert(Seq(104), b"xyz").unwrap();
        assert_eq!(r.insert(Seq(103), b"ab"), Err(ReorderError::Overlap));
        assert_eq!(r.insert(Seq(106), b"ab"), Err(ReorderError::Overlap));
        r.insert(Seq(100), b"abcd").unwrap();
        assert_eq!(r.insert(Seq(102), b"q"), Err(ReorderError::Stale));
        assert!(r.fits(Seq(107), 3));
        assert!(!r.fits(Seq(107), 4));
        assert_eq!(r.len(), 7);
    }

    #[test]
    fn overlaps_held_sees_ready_pending_and_beyond_the_window() {
        let mut r = ReorderBuffer::new(Seq(100), 10);
        r.insert(Seq(100), b"ab").unwrap(); // ready [100, 102)
        r.insert(Seq(105), b"xy").unwrap(); // pending [105, 107)
        assert!(r.overlaps_held(Seq(101), 1), "ready bytes");
        assert!(r.overlaps_held(Seq(99), 1), "before the read position");
        assert!(r.overlaps_held(Seq(104), 2) && r.overlaps_held(Seq(106), 30));
        assert!(!r.overlaps_held(Seq(102), 3) && !r.overlaps_held(Seq(107), 50));
        assert!(
            !r.overlaps_held(Seq(105), 0),
            "empty ranges overlap nothing"
        );
    }

    proptest! {
        /// Any arrival order of chunks inside the window yields the stream, in order,
        /// and the buffer never holds more than its capacity.
        #[test]
        fn any_order_within_window(
            start in any::<u32>(),
            lens in proptest::collection::vec(1usize..40, 1..60),
            order_seed in any::<u64>(),
        ) {
            let cap = 128;
            let mut r = ReorderBuffer::new(Seq(start), cap);
            let total: usize = lens.iter().sum();
            let stream: Vec<u8> = (0..total).map(|i| (i * 7 + 3) as u8).collect();
            let mut chunks = Vec::new();
            let mut off = 0;
            for l in &lens {
                chunks.push((off, *l));
                off += l;
            }
            let mut waiting: Vec<(usize, usize)> = chunks;
            let mut out = Vec::new();
            let mut x = order_seed | 1;
            while !waiting.is_empty() {
                // Offer a pseudo-random waiting chunk that fits; if none fits, read.
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                let fitting: Vec<usize> = (0..waiting.len())
                    .filter(|&i| r.fits(Seq(start).plus(waiting[i].0 as u32), waiting[i].1))
                    .collect();
                if fitting.is_empty() || x % 4 == 0 {
                    let mut buf = [0u8; 17];
                    let n = r.read(&mut buf[..(x as usize % 17) + 1]);
                    out.extend_from_slice(&buf[..n]);
                    continue;
                }
                let i = fitting[x as usize % fitting.len()];
                let (o, l) = waiting.swap_remove(i);
                r.insert(Seq(start).plus(o as u32), &stream[o..o + l]).unwrap();
                prop_assert!(r.len() <= cap);
            }
            let mut buf = vec![0u8; cap];
            let n = r.read(&mut buf);
            out.extend_from_slice(&buf[..n]);
            prop_assert_eq!(out, stream);
        }
    }
}
