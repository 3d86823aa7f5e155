//! A connection's send buffer: the bytes the application queued, from the oldest
//! unacknowledged byte on (RFC 9293 §3.3.1's SND.UNA onwards), held either copied into a
//! byte ring ([`TxRing`]) or, for large pieces handed over as [`Bytes`], as the
//! application's own buffers, shared and never copied into the ring.
//!
//! A channel's chunks are `Bytes` already (a virtual socket's send buffer cut into chunks,
//! with their headers in front), so copying them into a ring only to copy them again into
//! the frames was one pass over every sent byte that bought nothing: the shared pieces are
//! read straight into the frames. Small pieces are still copied: a 64-byte request costs
//! fewer instructions to copy than to track, and its producer's buffer goes back to its
//! pool at once instead of when the peer acknowledges it.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::tcp::buffer::TxRing;
use crate::wire::checksum;

/// Pieces handed over as `Bytes` shorter than this are copied into the ring. A virtual
/// socket's chunk payloads above 4 KiB go to the channel as they are and smaller chunks
/// in batches of at most 16 KiB that the stack copied already (`vns::stack::shard`), so
/// bulk chunks (up to 62,636 bytes) are shared and the per-message path keeps its ring.
pub const SHARE_MIN: usize = 16 * 1024;

/// Bytes of the queue as [`SendQueue::walk`] hands them out: a slice of the ring, or a
/// range of a shared buffer.
enum Run<'a> {
    Copied(&'a [u8]),
    Shared(&'a Bytes, core::ops::Range<usize>),
}

/// A run of the queue's bytes: the next `n` bytes of the ring, or a shared buffer.
#[derive(Debug, Clone)]
enum Piece {
    Ring(usize),
    Shared(Bytes),
}

impl Piece {
    fn len(&self) -> usize {
        match self {
            Piece::Ring(n) => *n,
            Piece::Shared(b) => b.len(),
        }
    }
}

/// The send buffer. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct SendQueue {
    /// The copied bytes, in the order of their `Piece::Ring` runs.
    ring: TxRing,
    /// Every byte held, oldest first: runs of the ring and shared buffers.
    pieces: VecDeque<Piece>,
    /// Bytes held (ring and shared).
    len: usize,
    /// Bytes held in shared buffers.
    shared: usize,
    capacity: usize,
}

impl SendQueue {
    /// An empty queue of `capacity` bytes (its ring allocated at the first copy).
    pub fn new(capacity: usize) -> Self {
        SendQueue {
            ring: TxRing::new(capacity),
            pieces: VecDeque::new(),
            len: 0,
            shared: 0,
            capacity,
        }
    }

    /// Most bytes held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes of memory the queue holds: its ring's allocation and the shared bytes.
    pub fn allocated(&self) -> usize {
        self.ring.allocated() + self.shared
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room left.
    pub fn free(&self) -> usize {
        self.capacity.saturating_sub(self.len)
    }

    /// Appends (copies) as much of `data` as fits; returns how many bytes were taken.
    pub fn push(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.free());
        if n == 0 {
            return 0;
        }
        // The ring holds at most what the queue holds, so it has room.
        let taken = self.ring.push(&data[..n]);
        debug_assert_eq!(taken, n);
        match self.pieces.back_mut() {
            Some(Piece::Ring(k)) => *k += taken,
            _ => self.pieces.push_back(Piece::Ring(taken)),
        }
        self.len += taken;
        taken
    }

    /// Appends as much of `data` as fits, sharing it (no copy) when that part is at least
    /// [`SHARE_MIN`] bytes long, else copying it; returns how many bytes were taken.
    pub fn push_shared(&mut self, data: &Bytes) -> usize {
        let n = data.len().min(self.free());
        if n < SHARE_MIN {
            return self.push(&data[..n]);
        }
        self.pieces.push_back(Piece::Shared(data.slice(..n)));
        self.len += n;
        self.shared += n;
        n
    }

    /// Hands the bytes from `offset` bytes after the front on, at most `max`, to `f` as
    /// runs in order (each with its offset into the output): slices of the ring, or
    /// ranges of a shared buffer; returns how many bytes.
    fn walk(&self, offset: usize, max: usize, mut f: impl FnMut(usize, Run<'_>)) -> usize {
        if offset >= self.len {
            return 0;
        }
        let want = max.min(self.len - offset);
        let mut skip = offset;
        let mut ring_at = 0;
        let mut done = 0;
        for p in &self.pieces {
            if done == want {
                break;
            }
            let plen = p.len();
            if skip >= plen {
                skip -= plen;
                if let Piece::Ring(n) = p {
                    ring_at += n;
                }
                continue;
            }
            let take = (plen - skip).min(want - done);
            match p {
                Piece::Ring(n) => {
                    self.ring.read_parts(ring_at + skip, take, |s| {
                        f(done, Run::Copied(s));
                        done += s.len();
                    });
                    ring_at += n;
                }
                Piece::Shared(b) => {
                    f(done, Run::Shared(b, skip..skip + take));
                    done += take;
                }
            }
            skip = 0;
        }
        done
    }

    /// [`walk`](Self::walk) with every run as a slice.
    fn read_with(&self, offset: usize, max: usize, mut f: impl FnMut(usize, &[u8])) -> usize {
        self.walk(offset, max, |at, run| match run {
            Run::Copied(s) => f(at, s),
            Run::Shared(b, r) => f(at, &b[r]),
        })
    }

    /// [`read_at`](Self::read_at) for a caller that takes shared bytes as they lie: the
    /// bytes from `offset` bytes after the front on, at most `out.len()`, are copied into
    /// `out` where they were copied into the queue, and where they lie in a shared buffer
    /// (a run of at least `min_span` bytes) a slice of it is pushed onto `spans` with its
    /// offset in `out` instead, leaving that part of `out` unwritten. Returns how many
    /// bytes were read.
    pub fn read_gather(
        &self,
        offset: usize,
        out: &mut [u8],
        min_span: usize,
        spans: &mut Vec<(usize, Bytes)>,
    ) -> usize {
        if self.shared == 0 {
            return self.ring.read_at(offset, out);
        }
        let max = out.len();
        self.walk(offset, max, |at, run| match run {
            Run::Shared(b, r) if r.len() >= min_span => spans.push((at, b.slice(r))),
            Run::Shared(b, r) => out[at..at + r.len()].copy_from_slice(&b[r]),
            Run::Copied(s) => out[at..at + s.len()].copy_from_slice(s),
        })
    }

    /// Copies bytes starting `offset` bytes after the front into `out`; returns how many
    /// were copied (fewer than `out.len()` at the end of the data, 0 past it).
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> usize {
        if self.shared == 0 {
            // Nothing shared: the ring holds every byte, in order (the per-message path).
            return self.ring.read_at(offset, out);
        }
        let max = out.len();
        self.read_with(offset, max, |at, s| {
            out[at..at + s.len()].copy_from_slice(s)
        })
    }

    /// [`read_at`](Self::read_at), also returning the folded Internet checksum sum of the
    /// bytes copied, computed in the same pass.
    pub fn read_at_sum(&self, offset: usize, out: &mut [u8]) -> (usize, u16) {
        if self.shared == 0 {
            return self.ring.read_at_sum(offset, out);
        }
        let max = out.len();
        let mut sum = 0u16;
        let n = self.read_with(offset, max, |at, s| {
            let part = checksum::copy_and_sum(&mut out[at..at + s.len()], s);
            sum = checksum::add(sum, checksum::at_offset(part, at));
        });
        (n, sum)
    }

    /// Changes the capacity to `capacity`, at least the bytes held (nothing queued is
    /// dropped).
    pub fn resize(&mut self, capacity: usize) {
        let capacity = capacity.max(self.len).max(1);
        self.ring.resize(capacity);
        self.capacity = capacity;
    }

    /// Drops `n` bytes (clamped to what is held) from the front.
    pub fn consume(&mut self, n: usize) {
        let mut n = n.min(self.len);
        self.len -= n;
        while n > 0 {
            let Some(front) = self.pieces.front_mut() else {
                break;
            };
            let plen = front.len();
            let k = n.min(plen);
            match front {
                Piece::Ring(r) => {
                    self.ring.consume(k);
                    *r -= k;
                }
                Piece::Shared(b) => {
                    let _ = b.split_to(k);
                    self.shared -= k;
                }
            }
            if k == plen {
                self.pieces.pop_front();
            }
            n -= k;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference model: the bytes pushed, oldest first.
    fn model_read(model: &[u8], offset: usize, len: usize) -> Vec<u8> {
        model.iter().skip(offset).take(len).copied().collect()
    }

    /// Copied and shared pushes, reads at every offset (with sums), partial consumes and
    /// wrap-around of the ring all agree with a plain byte vector, and large `Bytes` are
    /// held without a copy.
    #[test]
    fn mixed_pieces_read_and_consume_like_one_byte_stream() {
        let mut q = SendQueue::new(200 * 1024);
        let mut model: Vec<u8> = Vec::new();
        let mut next = 0u8;
        let mut bytes = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    next = next.wrapping_add(7);
                    next
                })
                .collect()
        };
        for round in 0..40 {
            let small = bytes(100 + round * 37);
            assert_eq!(q.push(&small), small.len());
            model.extend_from_slice(&small);
            let large = Bytes::from(bytes(SHARE_MIN + round * 911));
            let shared_before = q.allocated();
            let took = q.push_shared(&large);
            model.extend_from_slice(&large[..took]);
            if took >= SHARE_MIN {
                // Shared, not copied: the same memory.
                assert_eq!(q.allocated(), shared_before + took);
                let mut first = [0u8; 1];
                assert_eq!(q.read_at(q.len() - took, &mut first), 1);
                assert_eq!(first[0], large[0]);
            }
            let tiny = Bytes::from(bytes(10));
            let took = q.push_shared(&tiny);
            model.extend_from_slice(&tiny[..took]);
            assert_eq!(q.len(), model.len());
            for offset in [0, 1, 99, model.len() / 3, model.len() / 2, model.len() - 1] {
                for len in [1, 1448, 65_000] {
                    let mut out = vec![0u8; len];
                    let n = q.read_at(offset, &mut out);
                    let want = model_read(&model, offset, len);
                    assert_eq!(&out[..n], &want[..], "offset {offset} len {len}");
                    let mut out2 = vec![0u8; len];
                    let (n2, sum) = q.read_at_sum(offset, &mut out2);
                    assert_eq!(n2, n);
                    assert_eq!(sum, checksum::data(&want));
                    // Gathered: the copied bytes in place, the shared ones as slices of
                    // their buffers in the holes; together the same bytes.
                    for min_span in [1, 2000] {
                        let mut out3 = vec![0u8; len];
                        let mut spans = Vec::new();
                        let n3 = q.read_gather(offset, &mut out3, min_span, &mut spans);
                        assert_eq!(n3, n);
                        let mut end = 0;
                        for (at, b) in &spans {
                            assert!(*at >= end && b.len() >= min_span);
                            out3[*at..*at + b.len()].copy_from_slice(b);
                            end = at + b.len();
                        }
                        assert_eq!(&out3[..n], &want[..], "offset {offset} len {len}");
                    }
                }
            }
            // Consume about half, across piece boundaries.
            let c = model.len() / 2 + round;
            q.consume(c);
            model.drain(..c.min(model.len()));
            assert_eq!(q.len(), model.len());
        }
        q.consume(usize::MAX);
        assert!(q.is_empty());
        assert_eq!(q.allocated() - q.ring.allocated(), 0);
    }

    /// With nothing shared (the per-message path) reads go straight to the ring, across its
    /// wrap-around, and a shared piece after them is read in order behind them.
    #[test]
    fn copied_bytes_alone_read_through_the_ring() {
        let mut q = SendQueue::new(8192);
        let mut model = Vec::new();
        for i in 0..50u8 {
            let msg = [i; 300];
            assert_eq!(q.push(&msg), 300);
            model.extend_from_slice(&msg);
            let mut out = [0u8; 600];
            let n = q.read_at(model.len().saturating_sub(600), &mut out);
            assert_eq!(&out[..n], &model[model.len() - n..]);
            if q.len() > 4000 {
                q.consume(1000);
                model.drain(..1000);
            }
        }
        let big = Bytes::from(vec![0xabu8; SHARE_MIN]);
        let mut q = SendQueue::new(2 * SHARE_MIN);
        q.push(b"head");
        assert_eq!(q.push_shared(&big), SHARE_MIN);
        let mut out = [0u8; 8];
        assert_eq!(q.read_at(0, &mut out), 8);
        assert_eq!(&out, b"head\xab\xab\xab\xab");
    }

    /// Gathering lends the shared bytes as slices of the buffers handed over (the same
    /// memory), with their places in the output, and copies the rest around them.
    #[test]
    fn gathering_lends_shared_bytes_in_place_and_copies_the_rest() {
        let mut q = SendQueue::new(8 * SHARE_MIN);
        let a = Bytes::from(vec![1u8; SHARE_MIN]);
        let b = Bytes::from(vec![2u8; 2 * SHARE_MIN]);
        q.push(b"head");
        assert_eq!(q.push_shared(&a), SHARE_MIN);
        q.push(b"mid");
        assert_eq!(q.push_shared(&b), 2 * SHARE_MIN);
        let mut out = vec![0u8; 8 * SHARE_MIN];
        let mut spans = Vec::new();
        let n = q.read_gather(2, &mut out, 100, &mut spans);
        assert_eq!(n, q.len() - 2);
        assert_eq!(&out[..2], b"ad");
        assert_eq!(&out[2 + SHARE_MIN..2 + SHARE_MIN + 3], b"mid");
        assert_eq!(spans.len(), 2);
        assert_eq!((spans[0].0, spans[0].1.as_ptr()), (2, a.as_ptr()));
        assert_eq!(
            (spans[1].0, spans[1].1.as_ptr()),
            (5 + SHARE_MIN, b.as_ptr())
        );
        assert_eq!(spans[1].1.len(), 2 * SHARE_MIN);
        // A shared run shorter than the minimum is copied.
        spans.clear();
        let mut out = [0u8; 10];
        assert_eq!(
            q.read_gather(4 + SHARE_MIN - 3, &mut out, 100, &mut spans),
            10
        );
        assert!(spans.is_empty());
        assert_eq!(&out, &[1, 1, 1, b'm', b'i', b'd', 2, 2, 2, 2]);
        // Past the end: nothing.
        assert_eq!(q.read_gather(q.len(), &mut out, 1, &mut spans), 0);
    }

    /// A full queue takes nothing more; what a shared push could not take is left to the
    /// caller.
    #[test]
    fn a_full_queue_takes_the_part_that_fits() {
        let mut q = SendQueue::new(3 * SHARE_MIN);
        let big = Bytes::from(vec![1u8; 2 * SHARE_MIN]);
        assert_eq!(q.push_shared(&big), 2 * SHARE_MIN);
        assert_eq!(q.push_shared(&big), SHARE_MIN);
        assert_eq!(q.push_shared(&big), 0);
        assert_eq!(q.push(b"x"), 0);
        assert_eq!(q.free(), 0);
    }
}
