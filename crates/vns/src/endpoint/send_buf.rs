//! Send buffers: a socket's written bytes in segments of one chunk payload with room for a
//! chunk header in front (`SendBuf`, cut into `Piece`s), and the endpoint's pool of
//! segments for reuse once the channels are done with them (`SegPool`; see
//! `docs/performance.md`).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use crate::wire::HEADER_LEN;

#[cfg(doc)]
use super::Endpoint;
use super::SENT_LENT_MAX;

/// A piece of a send buffer: payload bytes, perhaps preceded by room for their chunk
/// header, so that header and payload leave as one `Bytes` without a copy.
#[derive(Debug, Default)]
pub(super) struct Piece {
    pub(super) buf: BytesMut,
    pub(super) headroom: bool,
    /// The start of a buffer lent by [`Endpoint::send_chunks`]: once sent, the endpoint
    /// keeps a reference to hand the buffer back for reuse when the channel is done.
    pub(super) track: bool,
    /// The start of a segment the send buffer allocated (or took from the endpoint's
    /// segment pool): once sent, the endpoint keeps a reference to put the segment back in
    /// its pool when the channel is done with it.
    pub(super) recycle: bool,
}

impl Piece {
    pub(super) fn data(&self) -> &[u8] {
        if self.headroom {
            &self.buf[HEADER_LEN..]
        } else {
            &self.buf
        }
    }

    pub(super) fn len(&self) -> usize {
        self.buf.len() - if self.headroom { HEADER_LEN } else { 0 }
    }
}

/// A socket's send buffer: written bytes in segments of at most one chunk payload, each
/// allocated with room for a chunk header in front, so that cutting a chunk hands out the
/// segment (or a part of it) instead of a copy.
#[derive(Debug, Default)]
pub(super) struct SendBuf {
    /// Filled segments, oldest first.
    segs: VecDeque<Piece>,
    /// The segment being filled (header room included once allocated); it never grows
    /// past the capacity it was made with.
    tail: BytesMut,
    /// Small pieces were split off the front of `tail`'s segment: `tail` is the rest of
    /// that allocation, not its start, so it is not the one to recycle.
    tail_split: bool,
    len: usize,
}

/// A partly filled segment taken with at most this many bytes (times the segment size)
/// is split (its bytes go, the rest of the segment takes later writes); a fuller one goes
/// as it is.
const TAIL_MOVE_FRACTION: usize = 2;

impl SendBuf {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn clear(&mut self) {
        *self = SendBuf::default();
    }

    /// Bytes in the segment being filled.
    fn tail_len(&self) -> usize {
        self.tail.len().saturating_sub(HEADER_LEN)
    }

    /// Appends (copies) `data`, in segments of `seg` bytes, taken from `pool` while it has
    /// any.
    pub(super) fn push(&mut self, mut data: &[u8], seg: usize, pool: &mut SegPool) {
        self.len += data.len();
        while !data.is_empty() {
            if self.tail_split
                && self.tail_len() == 0
                && self.tail.capacity() - self.tail.len() < data.len().min(seg)
            {
                // What small pieces left of a segment is too short for this write: a
                // fresh segment keeps its chunks whole.
                self.tail = BytesMut::new();
            }
            if self.tail.capacity() == 0 {
                self.tail = pool.take(HEADER_LEN + seg);
                self.tail_split = false;
                self.tail.extend_from_slice(&[0; HEADER_LEN]);
            }
            let n = (self.tail.capacity() - self.tail.len()).min(data.len());
            self.tail.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.tail_len() >= seg || self.tail.len() == self.tail.capacity() {
                self.segs.push_back(Piece {
                    buf: std::mem::take(&mut self.tail),
                    headroom: true,
                    track: false,
                    recycle: !self.tail_split,
                });
            }
        }
    }

    /// Appends whole segments without copying: each `BytesMut` holds `HEADER_LEN` bytes of
    /// room, then its payload (at most one segment). A partly filled tail is closed first
    /// so that the order of the bytes is kept.
    pub(super) fn push_segments(&mut self, segs: impl Iterator<Item = BytesMut>) {
        if self.tail_len() > 0 {
            self.segs.push_back(Piece {
                buf: std::mem::take(&mut self.tail),
                headroom: true,
                track: false,
                recycle: !self.tail_split,
            });
        }
        for buf in segs {
            let n = buf.len().saturating_sub(HEADER_LEN);
            if n == 0 {
                continue;
            }
            self.len += n;
            self.segs.push_back(Piece {
                buf,
                headroom: true,
                track: true,
                recycle: false,
            });
        }
    }

    /// Takes at most `max` bytes (at least one when not empty) from the front, from one
    /// segment: a chunk shorter than `max` ends where a segment ends.
    pub(super) fn take(&mut self, max: usize, seg: usize) -> Piece {
        if self.segs.is_empty() {
            let n = self.tail_len();
            if n == 0 {
                return Piece::default();
            }
            if n * TAIL_MOVE_FRACTION <= seg {
                // A small partial segment: its bytes, with the header room in front, are
                // split off the segment (no copy, no allocation: the pieces share it),
                // and the rest of the segment takes the next writes. Copying them out
                // instead cost an allocation and a copy per small write, and a second
                // allocation for the reference kept for resending (callgrind).
                let piece = self.tail.split_to(HEADER_LEN + n);
                let recycle = !self.tail_split;
                self.tail_split = true;
                if self.tail.capacity() > HEADER_LEN {
                    self.tail.extend_from_slice(&[0; HEADER_LEN]);
                } else {
                    // Used up: the next write takes a new segment.
                    self.tail = BytesMut::new();
                }
                self.segs.push_back(Piece {
                    buf: piece,
                    headroom: true,
                    track: false,
                    recycle,
                });
            } else {
                self.segs.push_back(Piece {
                    buf: std::mem::take(&mut self.tail),
                    headroom: true,
                    track: false,
                    recycle: !self.tail_split,
                });
            }
        }
        let front = self.segs.front_mut().expect("not empty");
        let out = if front.len() <= max {
            self.segs.pop_front().expect("not empty")
        } else if front.headroom {
            front.headroom = false;
            // The front part keeps the allocation's start, so it is the one that can be
            // widened back over the whole buffer for reuse.
            Piece {
                buf: front.buf.split_to(HEADER_LEN + max),
                headroom: true,
                track: std::mem::take(&mut front.track),
                recycle: std::mem::take(&mut front.recycle),
            }
        } else {
            Piece {
                buf: front.buf.split_to(max),
                headroom: false,
                track: std::mem::take(&mut front.track),
                recycle: std::mem::take(&mut front.recycle),
            }
        };
        self.len -= out.len();
        out
    }
}

/// Send-buffer segments kept for reuse: sent ones the endpoint still references, until the
/// channel drops its own reference, and idle ones for the next writes.
///
/// Without it every segment (one chunk payload, ~62 KiB) is allocated by the writing task
/// and freed by the thread that sent it (its queue's driver): the allocator hands the
/// memory back to the kernel and faults it in again (`madvise`, TLB shoot-downs, page
/// faults), which cost more than the copy into the segment (measured in
/// `docs/investigations/bulk-on-veth.md`, "Zero-copy deframing examined; send segments
/// pooled").
///
/// Bounded: at most [`SEG_POOL_IDLE`] idle segments; `sent` is swept (released segments
/// move to `idle` or are freed) whenever it has doubled since the last sweep, so it holds
/// at most about twice the segments still in the channels plus [`SEG_SWEEP_MIN`], and never
/// more than [`SENT_LENT_MAX`].
#[derive(Debug, Default)]
pub(super) struct SegPool {
    pub(super) idle: Vec<BytesMut>,
    pub(super) sent: VecDeque<Bytes>,
    sweep_at: usize,
    /// Segments allocated and reused so far (for tests and debugging).
    pub(super) allocated: u64,
    pub(super) reused: u64,
}

/// Most idle send-buffer segments an endpoint keeps (~1 MiB with the default payload).
pub(super) const SEG_POOL_IDLE: usize = 16;

/// `SegPool::sent` is not swept below this many entries.
const SEG_SWEEP_MIN: usize = 8;

impl SegPool {
    /// A segment of at least `cap` bytes' capacity, empty: an idle one if any (sweeping
    /// the sent ones first when none is idle), else a new allocation.
    fn take(&mut self, cap: usize) -> BytesMut {
        if self.idle.is_empty() && !self.sent.is_empty() {
            self.sweep(cap);
        }
        match self.idle.pop() {
            Some(b) => {
                self.reused += 1;
                b
            }
            None => {
                self.allocated += 1;
                BytesMut::with_capacity(cap)
            }
        }
    }

    /// Keeps a reference to a sent segment until the channel is done with it.
    pub(super) fn keep_sent(&mut self, b: Bytes, cap: usize) {
        if self.sent.len() >= SENT_LENT_MAX {
            self.sent.pop_front();
        }
        self.sent.push_back(b);
        if self.sent.len() >= self.sweep_at.max(SEG_SWEEP_MIN) {
            self.sweep(cap);
        }
    }

    /// Moves every sent segment that nothing else references any more to `idle` (or
    /// frees it when `idle` is full); keeps the others in order.
    pub(super) fn sweep(&mut self, cap: usize) {
        for _ in 0..self.sent.len() {
            let b = self.sent.pop_front().expect("counted");
            if !b.is_unique() {
                self.sent.push_back(b);
                continue;
            }
            if let Ok(m) = b.try_into_mut() {
                self.put(m, cap);
            }
        }
        self.sweep_at = 2 * self.sent.len();
    }

    /// Keeps `b` for reuse if there is room and it can be widened back over at least
    /// `cap` bytes without allocating.
    fn put(&mut self, mut b: BytesMut, cap: usize) {
        if self.idle.len() >= SEG_POOL_IDLE {
            return;
        }
        b.clear();
        if b.capacity() >= cap || b.try_reclaim(cap) {
            self.idle.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The idle pool keeps at most `SEG_POOL_IDLE` segments however many are released.
    #[test]
    fn segment_pool_is_bounded() {
        let cap = HEADER_LEN + 100;
        let mut pool = SegPool::default();
        let segs: Vec<Bytes> = (0..3 * SEG_POOL_IDLE)
            .map(|_| {
                let mut b = pool.take(cap);
                b.resize(cap, 1);
                b.freeze()
            })
            .collect();
        for s in &segs {
            pool.keep_sent(s.clone(), cap);
        }
        assert!(pool.idle.is_empty(), "all still held");
        drop(segs);
        pool.sweep(cap);
        assert_eq!(pool.idle.len(), SEG_POOL_IDLE);
        assert!(pool.sent.is_empty());
        assert!(pool
            .idle
            .iter()
            .all(|b| b.is_empty() && b.capacity() >= cap));
    }

    /// Small writes taken one at a time are split off one segment, header room in front
    /// (no copy, no new segment per write), and a write too long for what is left of that
    /// segment starts a fresh one, so that its chunk is a whole segment.
    #[test]
    fn small_pieces_share_a_segment_and_large_writes_stay_whole() {
        let seg = 1000;
        let mut b = SendBuf::default();
        let mut pool = SegPool::default();
        let mut held = Vec::new();
        // 15 pieces of 56 bytes (header room and payload) fit the segment's 1016.
        for i in 0..15u8 {
            b.push(&[i; 40], seg, &mut pool);
            let p = b.take(seg, seg);
            assert!(p.headroom, "piece {i} keeps its header room");
            assert_eq!(p.data(), &[i; 40][..]);
            assert_eq!(
                p.recycle,
                i == 0,
                "only the segment's first piece starts it"
            );
            held.push(p.buf.freeze());
        }
        assert_eq!(pool.allocated, 1, "one segment for every small write");
        // 176 bytes are left of it: a full-size write takes a new one.
        b.push(&[7; 1000], seg, &mut pool);
        let p = b.take(seg, seg);
        assert_eq!(p.len(), seg, "a whole segment's chunk");
        assert!(p.recycle, "a fresh segment's start");
        assert_eq!(pool.allocated, 2);
        // The pieces held meanwhile are intact.
        for (i, h) in held.iter().enumerate() {
            assert_eq!(&h[HEADER_LEN..], &[i as u8; 40][..]);
        }
    }

    proptest! {
        /// Whatever the write and take sizes, the send buffer hands out exactly the bytes
        /// written, in order, in pieces of 1..=max bytes that never cross a segment; with
        /// the pieces sent through a segment pool and held by the "channel" for a while,
        /// no piece's bytes change while it is held (a segment is reused only once free).
        #[test]
        fn send_buffer_hands_out_what_was_written(
            seg in 1usize..300,
            ops in proptest::collection::vec((0u8..3, 1usize..700), 1..60),
        ) {
            let mut b = SendBuf::default();
            let mut pool = SegPool::default();
            let cap = HEADER_LEN + seg;
            let mut held: VecDeque<(Bytes, Vec<u8>)> = VecDeque::new();
            let (mut written, mut taken) = (Vec::new(), Vec::new());
            let mut next = 0u8;
            for (op, n) in ops {
                if op == 0 {
                    let data: Vec<u8> = (0..n).map(|_| { next = next.wrapping_add(1); next }).collect();
                    b.push(&data, seg, &mut pool);
                    written.extend_from_slice(&data);
                } else if op == 1 {
                    // The channel is done with its oldest pieces.
                    for _ in 0..n % 4 {
                        if let Some((piece, copy)) = held.pop_front() {
                            prop_assert_eq!(&piece[..], &copy[..]);
                        }
                    }
                    prop_assert!(pool.idle.len() <= SEG_POOL_IDLE);
                    prop_assert!(pool.sent.len() < pool.sweep_at.max(SEG_SWEEP_MIN));
                    if n % 2 == 0 {
                        // After a sweep only segments something else holds (a held piece,
                        // or the buffer's own unsent part) stay referenced.
                        pool.sweep(cap);
                        prop_assert!(pool.sent.iter().all(|s| !s.is_unique()));
                        prop_assert!(pool.sent.len() <= held.len() + 1);
                    }
                } else {
                    let before = b.len();
                    let got = b.take(n, seg);
                    prop_assert!(got.len() <= n.min(seg));
                    prop_assert_eq!(got.len() == 0, before == 0);
                    prop_assert_eq!(b.len(), before - got.len());
                    prop_assert_eq!(got.data().len(), got.len());
                    if got.headroom {
                        prop_assert_eq!(got.buf.len(), HEADER_LEN + got.len());
                    }
                    taken.extend_from_slice(got.data());
                    let recycle = got.recycle;
                    let piece = got.buf.freeze();
                    if recycle {
                        pool.keep_sent(piece.clone(), cap);
                    }
                    held.push_back((piece.clone(), piece.to_vec()));
                }
                prop_assert_eq!(b.len(), written.len() - taken.len());
            }
            while !b.is_empty() {
                taken.extend_from_slice(b.take(seg, seg).data());
            }
            prop_assert_eq!(taken, written);
            for (piece, copy) in held {
                prop_assert_eq!(&piece[..], &copy[..]);
            }
        }
    }
}
