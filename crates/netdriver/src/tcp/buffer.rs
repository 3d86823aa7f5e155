//! Fixed-capacity byte rings for the send and receive directions.
//!
//! A ring holds nothing until its first byte arrives (a SYN, or a flood of them, costs no
//! ring memory until data flows), then an allocation that grows by doubling, from
//! [`MIN_ALLOCATION`], as the bytes it must hold need, and never beyond its capacity: a
//! connection's memory is bounded by its configuration whatever the peer sends, and a
//! connection that carries one small request and its answer allocates a few KiB instead
//! of its whole capacity (a zeroed 256 KiB per ring and direction was a quarter of the
//! protocol thread's time in connection-per-request HTTP, page faults and clearing;
//! `docs/investigations/connection-setup.md`).

use crate::wire::checksum;
use crate::wire::Parts;

/// A ring's first allocation, in bytes (or its capacity, if smaller).
pub const MIN_ALLOCATION: usize = 4096;

/// The allocation that holds `needed` bytes: the next power of two, at least
/// [`MIN_ALLOCATION`], at most `capacity`.
fn allocation_for(needed: usize, capacity: usize) -> usize {
    needed
        .checked_next_power_of_two()
        .unwrap_or(capacity)
        .max(MIN_ALLOCATION)
        .min(capacity)
        .max(needed.min(capacity))
}

/// Copies `data` into `ring` starting at physical index `start`, wrapping at the end.
/// `data.len()` must not exceed `ring.len()`.
fn copy_in(ring: &mut [u8], start: usize, data: &[u8]) {
    let first = data.len().min(ring.len() - start);
    ring[start..start + first].copy_from_slice(&data[..first]);
    ring[..data.len() - first].copy_from_slice(&data[first..]);
}

/// The folded sum of `n` bytes of `ring` from physical index `start`, wrapping.
fn sum_ring(ring: &[u8], start: usize, n: usize) -> u16 {
    let first = n.min(ring.len() - start);
    let a = checksum::data(&ring[start..start + first]);
    let b = checksum::data(&ring[..n - first]);
    checksum::add(a, checksum::at_offset(b, first))
}

/// Copies `out.len()` bytes out of `ring` starting at physical index `start`, wrapping.
fn copy_out(ring: &[u8], start: usize, out: &mut [u8]) {
    let first = out.len().min(ring.len() - start);
    out[..first].copy_from_slice(&ring[start..start + first]);
    let rest = out.len() - first;
    out[first..].copy_from_slice(&ring[..rest]);
}

/// [`copy_in`], summing the bytes copied (see [`checksum::copy_and_sum`]).
fn copy_in_sum(ring: &mut [u8], start: usize, data: &[u8]) -> u16 {
    let first = data.len().min(ring.len() - start);
    let a = checksum::copy_and_sum(&mut ring[start..start + first], &data[..first]);
    let b = checksum::copy_and_sum(&mut ring[..data.len() - first], &data[first..]);
    checksum::add(a, checksum::at_offset(b, first))
}

/// [`copy_out`], summing the bytes copied (see [`checksum::copy_and_sum`]).
fn copy_out_sum(ring: &[u8], start: usize, out: &mut [u8]) -> u16 {
    let first = out.len().min(ring.len() - start);
    let a = checksum::copy_and_sum(&mut out[..first], &ring[start..start + first]);
    let rest = out.len() - first;
    let b = checksum::copy_and_sum(&mut out[first..], &ring[..rest]);
    checksum::add(a, checksum::at_offset(b, first))
}

/// The send ring: bytes the application queued, from the oldest unacknowledged byte on.
/// Acknowledged bytes are consumed from the front; retransmissions read at an offset.
#[derive(Debug, Clone)]
pub struct TxRing {
    /// Empty until the first byte is pushed, then grown as needed up to `capacity`.
    buf: Vec<u8>,
    capacity: usize,
    head: usize,
    len: usize,
}

impl TxRing {
    /// An empty ring of `capacity` bytes (allocated at the first push).
    pub fn new(capacity: usize) -> Self {
        TxRing {
            buf: Vec::new(),
            capacity,
            head: 0,
            len: 0,
        }
    }

    /// Total size in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes of memory the ring holds: 0 until its first byte, then what the bytes held
    /// so far needed (see the module documentation), at most its capacity.
    pub fn allocated(&self) -> usize {
        self.buf.len()
    }

    /// Grows the allocation to hold `needed` bytes from the front, keeping the bytes held
    /// (moved to its start).
    fn reserve(&mut self, needed: usize) {
        if needed <= self.buf.len() {
            return;
        }
        let mut buf = vec![0; allocation_for(needed, self.capacity)];
        if !self.buf.is_empty() {
            copy_out(&self.buf, self.head, &mut buf[..self.len]);
        }
        self.buf = buf;
        self.head = 0;
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
        self.capacity() - self.len
    }

    /// Appends as much of `data` as fits; returns how many bytes were taken.
    pub fn push(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.free());
        if n == 0 {
            return 0;
        }
        self.reserve(self.len + n);
        let tail = (self.head + self.len) % self.buf.len();
        copy_in(&mut self.buf, tail, &data[..n]);
        self.len += n;
        n
    }

    /// Copies bytes starting `offset` bytes after the front into `out`; returns how many
    /// were copied (fewer than `out.len()` at the end of the data, 0 past it).
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> usize {
        if offset >= self.len {
            return 0;
        }
        let n = out.len().min(self.len - offset);
        let start = (self.head + offset) % self.buf.len();
        copy_out(&self.buf, start, &mut out[..n]);
        n
    }

    /// Hands at most `max` bytes from `offset` bytes after the front to `f` in place, as
    /// at most two slices (the ring may wrap), in order; returns how many.
    pub fn read_parts(&self, offset: usize, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        if offset >= self.len {
            return 0;
        }
        let n = max.min(self.len - offset);
        let start = (self.head + offset) % self.buf.len();
        let first = n.min(self.buf.len() - start);
        f(&self.buf[start..start + first]);
        if n > first {
            f(&self.buf[..n - first]);
        }
        n
    }

    /// [`read_at`](Self::read_at), also returning the folded Internet checksum sum of the
    /// bytes copied, computed in the same pass (the sender's ring → frame copy carries the
    /// TCP payload's checksum).
    pub fn read_at_sum(&self, offset: usize, out: &mut [u8]) -> (usize, u16) {
        if offset >= self.len {
            return (0, 0);
        }
        let n = out.len().min(self.len - offset);
        let start = (self.head + offset) % self.buf.len();
        (n, copy_out_sum(&self.buf, start, &mut out[..n]))
    }

    /// Changes the capacity to `capacity`, at least the bytes held (nothing queued is
    /// dropped). An allocated ring is reallocated with the held bytes moved to its start;
    /// an unallocated one just records the new size.
    pub fn resize(&mut self, capacity: usize) {
        let capacity = capacity.max(self.len).max(1);
        if !self.buf.is_empty() {
            let mut buf = vec![0; self.buf.len().min(capacity).max(self.len)];
            copy_out(&self.buf, self.head, &mut buf[..self.len]);
            self.buf = buf;
        }
        self.capacity = capacity;
        self.head = 0;
    }

    /// Drops `n` bytes (clamped to what is held) from the front.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        if n == 0 {
            return;
        }
        self.head = (self.head + n) % self.buf.len();
        self.len -= n;
        if self.len == 0 {
            // Restarting at 0 keeps small transfers contiguous (cheaper copies).
            self.head = 0;
        }
    }
}

/// The receive ring: in-order bytes the application has not read yet, followed by room
/// into which out-of-order segments are written at their offset from `rcv_nxt`
/// (smoltcp-style), so reassembly needs no second buffer. Which out-of-order ranges hold
/// data is tracked separately by the [`Assembler`](crate::tcp::assembler::Assembler).
#[derive(Debug, Clone)]
pub struct RxRing {
    /// Empty until the first byte is written, then grown as needed up to `capacity`.
    buf: Vec<u8>,
    capacity: usize,
    head: usize,
    /// Readable (in-order, committed) bytes.
    len: usize,
}

/// Where an [`RxRing`]'s bytes lie: equal layouts mean that a byte written at an offset
/// after the readable region is still at that offset (nothing was read, committed,
/// resized or reallocated in between).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxLayout {
    /// The allocation's address (a number, so that connections stay `Send`).
    buf: usize,
    capacity: usize,
    head: usize,
    len: usize,
}

impl RxRing {
    /// The ring's current [`RxLayout`].
    pub fn layout(&self) -> RxLayout {
        RxLayout {
            buf: self.buf.as_ptr() as usize,
            capacity: self.capacity,
            head: self.head,
            len: self.len,
        }
    }

    /// An empty ring of `capacity` bytes (allocated at the first write).
    pub fn new(capacity: usize) -> Self {
        RxRing {
            buf: Vec::new(),
            capacity,
            head: 0,
            len: 0,
        }
    }

    /// Total size in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes of memory the ring holds: 0 until its first byte, then what the bytes
    /// written so far needed (see the module documentation), at most its capacity.
    pub fn allocated(&self) -> usize {
        self.buf.len()
    }

    /// Grows the allocation to hold `needed` bytes from the front, keeping every byte of
    /// the old allocation at its offset from the front (readable bytes and out-of-order
    /// data after them alike).
    fn reserve(&mut self, needed: usize) {
        let have = self.buf.len();
        if needed <= have {
            return;
        }
        let mut buf = vec![0; allocation_for(needed, self.capacity)];
        if have > 0 {
            copy_out(&self.buf, self.head, &mut buf[..have]);
        }
        self.buf = buf;
        self.head = 0;
    }

    /// In-order bytes ready for the application.
    pub fn readable(&self) -> usize {
        self.len
    }

    /// Room after the readable bytes: the most the receive window may offer.
    pub fn free(&self) -> usize {
        self.capacity() - self.len
    }

    /// Writes `data` at `offset` bytes after the readable region (offset 0 is `rcv_nxt`)
    /// without making it readable. Bytes beyond the ring's free room are dropped; returns
    /// how many bytes were stored.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> usize {
        let room = self.free();
        if offset >= room {
            return 0;
        }
        let n = data.len().min(room - offset);
        if n == 0 {
            return 0;
        }
        self.reserve(self.len + offset + n);
        let start = (self.head + self.len + offset) % self.buf.len();
        copy_in(&mut self.buf, start, &data[..n]);
        n
    }

    /// [`write_at`](Self::write_at), also returning the folded Internet checksum sum of the
    /// bytes stored, computed in the same pass (the receiver's frame → ring copy verifies
    /// the TCP payload's checksum).
    pub fn write_at_sum(&mut self, offset: usize, data: &[u8]) -> (usize, u16) {
        let room = self.free();
        if offset >= room {
            return (0, 0);
        }
        let n = data.len().min(room - offset);
        if n == 0 {
            return (0, 0);
        }
        self.reserve(self.len + offset + n);
        let start = (self.head + self.len + offset) % self.buf.len();
        (n, copy_in_sum(&mut self.buf, start, &data[..n]))
    }

    /// [`write_at`](Self::write_at) for bytes held in several slices (a payload lent
    /// where a chained frame's buffers lie).
    pub fn write_parts_at(&mut self, offset: usize, data: Parts<'_>) -> usize {
        if let Some(data) = data.as_slice() {
            return self.write_at(offset, data);
        }
        let mut n = 0;
        for s in data.slices() {
            let w = self.write_at(offset + n, s);
            n += w;
            if w < s.len() {
                break;
            }
        }
        n
    }

    /// [`write_at_sum`](Self::write_at_sum) for bytes held in several slices: the sum
    /// is that of the bytes stored laid end to end. The parts are copied first and the
    /// bytes summed once where they now lie, still in L1 (one or two sums, rather than
    /// one per part with its own short tails).
    pub fn write_parts_at_sum(&mut self, offset: usize, data: Parts<'_>) -> (usize, u16) {
        if let Some(data) = data.as_slice() {
            return self.write_at_sum(offset, data);
        }
        let n = self.write_parts_at(offset, data);
        if n == 0 {
            return (0, 0);
        }
        let start = (self.head + self.len + offset) % self.buf.len();
        (n, sum_ring(&self.buf, start, n))
    }

    /// Changes the capacity to `capacity`, keeping the readable bytes and the first
    /// `keep` bytes after them (where out-of-order data may sit); the capacity is at least
    /// that much. An allocated ring is reallocated with those bytes moved to its start;
    /// an unallocated one just records the new size.
    pub fn resize(&mut self, capacity: usize, keep: usize) {
        // Nothing lies beyond the allocation.
        let held = self
            .len
            .saturating_add(keep)
            .min(self.capacity)
            .min(self.buf.len().max(self.len));
        let capacity = capacity.max(held).max(1);
        if !self.buf.is_empty() {
            let mut buf = vec![0; self.buf.len().min(capacity).max(held)];
            copy_out(&self.buf, self.head, &mut buf[..held]);
            self.buf = buf;
        }
        self.capacity = capacity;
        self.head = 0;
    }

    /// Makes the next `n` written bytes readable (clamped to the free room).
    pub fn commit(&mut self, n: usize) {
        self.len += n.min(self.free());
    }

    /// Reads up to `out.len()` readable bytes; returns how many.
    pub fn read(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.len);
        if n == 0 {
            return 0;
        }
        copy_out(&self.buf, self.head, &mut out[..n]);
        self.head = (self.head + n) % self.buf.len();
        self.len -= n;
        n
    }

    /// Reads up to `max` readable bytes by handing them to `sink` as at most two slices
    /// (the ring may wrap), in order; returns how many. Lets a caller append to a growable
    /// buffer without first zero-filling a destination slice.
    pub fn read_with(&mut self, max: usize, mut sink: impl FnMut(&[u8])) -> usize {
        let n = max.min(self.len);
        if n == 0 {
            return 0;
        }
        let first = n.min(self.buf.len() - self.head);
        sink(&self.buf[self.head..self.head + first]);
        if n > first {
            sink(&self.buf[..n - first]);
        }
        self.head = (self.head + n) % self.buf.len();
        self.len -= n;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_stored_and_summed_as_the_bytes_end_to_end_across_the_wrap() {
        let data: Vec<u8> = (0..3001u32).map(|i| (i * 13 + 5) as u8).collect();
        for head in [0usize, 1, 2047, 3000, 4095] {
            for offset in [0usize, 1, 700] {
                for (a, b) in [(1, 2), (66, 1500), (1499, 1500), (3000, 3001)] {
                    let slices = [&data[..a], &data[a..b], &data[b..]];
                    // Two rings wrapped the same way: `head` bytes read through first.
                    let mut rings = [RxRing::new(4096), RxRing::new(4096)];
                    for r in &mut rings {
                        r.write_at(0, &vec![9; head]);
                        r.commit(head);
                        r.read(&mut vec![0; head]);
                    }
                    let [whole, parts] = &mut rings;
                    let want = whole.write_at_sum(offset, &data);
                    let got = parts.write_parts_at_sum(offset, Parts::of(&slices));
                    assert_eq!(got, want, "head {head} offset {offset} cuts {a} {b}");
                    whole.commit(offset + want.0);
                    parts.commit(offset + got.0);
                    let (mut x, mut y) = (vec![0; 4096], vec![0; 4096]);
                    assert_eq!(whole.read(&mut x), parts.read(&mut y));
                    assert_eq!(x, y);
                }
            }
        }
    }

    #[test]
    fn rings_allocate_at_their_first_byte() {
        let mut t = TxRing::new(1 << 18);
        let mut r = RxRing::new(1 << 18);
        assert_eq!((t.allocated(), r.allocated()), (0, 0));
        assert_eq!(
            (t.capacity(), t.free(), r.free()),
            (1 << 18, 1 << 18, 1 << 18)
        );
        // Nothing to store: still nothing allocated, nothing to read.
        assert_eq!(t.push(b""), 0);
        assert_eq!(r.write_at(0, b""), 0);
        assert_eq!(r.write_at(1 << 18, b"x"), 0);
        assert_eq!(t.read_at(0, &mut [0; 4]), 0);
        assert_eq!(r.read(&mut [0; 4]), 0);
        assert_eq!((t.allocated(), r.allocated()), (0, 0));
        assert_eq!(t.push(b"abc"), 3);
        assert_eq!(r.write_at(5, b"xyz"), 3);
        // A small first allocation, not the capacity.
        assert_eq!(
            (t.allocated(), r.allocated()),
            (MIN_ALLOCATION, MIN_ALLOCATION)
        );
        let mut out = [0u8; 3];
        assert_eq!(t.read_at(0, &mut out), 3);
        assert_eq!(&out, b"abc");
        // Growing by doubling to what the bytes need, keeping them where they were.
        assert_eq!(t.push(&[7; 10_000]), 10_000);
        assert_eq!(t.allocated(), 16_384);
        assert_eq!(t.read_at(0, &mut out), 3);
        assert_eq!(&out, b"abc");
        assert_eq!(r.write_at(0, b"ab"), 2);
        assert_eq!(r.write_at(70_000, b"q"), 1);
        assert_eq!(r.allocated(), 131_072);
        r.commit(8);
        let mut got = [9u8; 8];
        assert_eq!(r.read(&mut got), 8);
        assert_eq!(&got, b"ab\0\0\0xyz");
        // Never beyond the capacity.
        assert_eq!(t.push(&[7; 1 << 18]), (1 << 18) - 10_003);
        assert_eq!(t.allocated(), 1 << 18);
    }

    #[test]
    fn a_grown_rx_ring_keeps_wrapped_out_of_order_bytes_at_their_offsets() {
        let mut r = RxRing::new(1 << 16);
        // Fill and read most of a first allocation so that the next bytes wrap.
        assert_eq!(r.write_at(0, &[1; 4000]), 4000);
        r.commit(4000);
        assert_eq!(r.read(&mut [0; 4000]), 4000);
        assert_eq!(r.write_at(0, b"0123456789"), 10);
        assert_eq!(r.write_at(200, b"far"), 3);
        assert_eq!(r.allocated(), MIN_ALLOCATION);
        // Out of order beyond the allocation: grows, the wrapped bytes move with it.
        assert_eq!(r.write_at(9_000, b"later"), 5);
        assert_eq!(r.allocated(), 16_384);
        r.commit(10);
        let mut got = [0u8; 10];
        assert_eq!(r.read(&mut got), 10);
        assert_eq!(&got, b"0123456789");
        r.commit(193);
        let mut skip = [0u8; 190];
        assert_eq!(r.read(&mut skip), 190);
        let mut far = [0u8; 3];
        assert_eq!(r.read(&mut far), 3);
        assert_eq!(&far, b"far");
    }

    #[test]
    fn tx_ring_wraps() {
        let mut r = TxRing::new(8);
        assert_eq!(r.push(b"abcdef"), 6);
        r.consume(4);
        assert_eq!(r.push(b"ghijklmn"), 6);
        assert_eq!(r.len(), 8);
        let mut out = [0u8; 8];
        assert_eq!(r.read_at(0, &mut out), 8);
        assert_eq!(&out, b"efghijkl");
        assert_eq!(r.read_at(3, &mut out[..2]), 2);
        assert_eq!(&out[..2], b"hi");
        assert_eq!(r.read_at(8, &mut out), 0);
    }

    #[test]
    fn rx_ring_read_with_hands_out_both_sides_of_a_wrap() {
        let mut r = RxRing::new(8);
        assert_eq!(r.write_at(0, b"abcdef"), 6);
        r.commit(6);
        let mut out = [0u8; 5];
        assert_eq!(r.read(&mut out), 5);
        // head at 5, "f" readable; "ghijk" goes to 6, 7 and wraps to 0..3.
        assert_eq!(r.write_at(0, b"ghijk"), 5);
        r.commit(5);
        let mut parts: Vec<Vec<u8>> = Vec::new();
        assert_eq!(r.read_with(10, |s| parts.push(s.to_vec())), 6);
        assert_eq!(parts, vec![b"fgh".to_vec(), b"ijk".to_vec()]);
        assert_eq!(r.readable(), 0);
        assert_eq!(r.read_with(10, |_| panic!("nothing to hand out")), 0);
        // A limit below what is readable.
        assert_eq!(r.write_at(0, b"lmnop"), 5);
        r.commit(5);
        let mut got = Vec::new();
        assert_eq!(r.read_with(2, |s| got.extend_from_slice(s)), 2);
        assert_eq!(got, b"lm");
        assert_eq!(r.readable(), 3);
    }

    #[test]
    fn rx_ring_out_of_order() {
        let mut r = RxRing::new(8);
        assert_eq!(r.write_at(3, b"def"), 3);
        assert_eq!(r.write_at(0, b"abc"), 3);
        r.commit(6);
        let mut out = [0u8; 4];
        assert_eq!(r.read(&mut out), 4);
        assert_eq!(&out, b"abcd");
        // Wraps: 2 readable, 6 free; writing at offset 4 keeps only 2 bytes.
        assert_eq!(r.write_at(4, b"wxyz"), 2);
        assert_eq!(r.write_at(8, b"z"), 0);
        assert_eq!(r.free(), 6);
    }

    #[test]
    fn tx_ring_resize_keeps_wrapped_bytes_in_order() {
        let mut r = TxRing::new(8);
        // Unallocated: only the size changes.
        r.resize(4);
        assert_eq!((r.capacity(), r.allocated()), (4, 0));
        r.resize(8);
        assert_eq!(r.push(b"abcdef"), 6);
        r.consume(4);
        assert_eq!(r.push(b"ghijkl"), 6);
        // "efghijkl", wrapped at index 8.
        r.resize(12);
        // The allocation keeps its size until the bytes need more.
        assert_eq!(
            (r.capacity(), r.allocated(), r.len(), r.free()),
            (12, 8, 8, 4)
        );
        assert_eq!(r.push(b"mnopq"), 4);
        let mut out = [0u8; 12];
        assert_eq!(r.read_at(0, &mut out), 12);
        assert_eq!(&out, b"efghijklmnop");
        // Shrinking never drops queued bytes.
        r.resize(3);
        assert_eq!((r.capacity(), r.len()), (12, 12));
        r.consume(10);
        r.resize(3);
        assert_eq!((r.capacity(), r.len(), r.free()), (3, 2, 1));
        assert_eq!(r.read_at(0, &mut out[..2]), 2);
        assert_eq!(&out[..2], b"op");
    }

    #[test]
    fn rx_ring_resize_keeps_readable_and_out_of_order_bytes() {
        let mut r = RxRing::new(8);
        r.resize(8, 0);
        assert_eq!(r.write_at(0, b"abcdef"), 6);
        r.commit(6);
        let mut out = [0u8; 8];
        assert_eq!(r.read(&mut out[..5]), 5);
        // head at 5: "f" readable, "gh" committed (the ring wraps after them), "k" out
        // of order two bytes further.
        assert_eq!(r.write_at(0, b"gh"), 2);
        r.commit(2);
        assert_eq!(r.write_at(2, b"k"), 1);
        r.resize(16, 4);
        assert_eq!((r.capacity(), r.readable(), r.free()), (16, 3, 13));
        assert_eq!(r.write_at(0, b"ij"), 2);
        r.commit(3);
        assert_eq!(r.read(&mut out), 6);
        assert_eq!(&out[..6], b"fghijk");
        // The kept region bounds a shrink.
        assert_eq!(r.write_at(0, b"lm"), 2);
        r.commit(2);
        r.resize(1, 5);
        assert_eq!(r.capacity(), 7);
        assert_eq!(r.read(&mut out), 2);
        assert_eq!(&out[..2], b"lm");
    }

    #[test]
    fn summing_reads_and_writes_match_plain_ones_across_wraps() {
        use crate::wire::checksum::data_reference;
        let bytes: Vec<u8> = (0..61u32).map(|i| (i * 97 + 11) as u8).collect();
        // A 13-byte ring: every head position, so wraps fall at odd and even points.
        for head in 0..13 {
            for len in 0..=13 {
                let mut t = TxRing::new(13);
                t.push(&bytes[..head]);
                t.consume(head);
                t.push(&bytes[..len]);
                for offset in 0..=len {
                    let mut plain = vec![0u8; 13];
                    let mut fused = vec![0u8; 13];
                    let n = t.read_at(offset, &mut plain);
                    let (m, sum) = t.read_at_sum(offset, &mut fused);
                    assert_eq!((m, &fused[..m]), (n, &plain[..n]));
                    assert_eq!(sum, data_reference(&plain[..n]), "head {head} off {offset}");
                }
                let mut r = RxRing::new(13);
                r.write_at(0, &bytes[..head]);
                r.commit(head);
                let mut sink = [0u8; 13];
                r.read(&mut sink[..head]);
                for offset in 0..=len.min(12) {
                    let data = &bytes[20..20 + len - offset];
                    let (n, sum) = r.write_at_sum(offset, data);
                    assert_eq!(sum, data_reference(&data[..n]), "head {head} off {offset}");
                    r.commit(offset + n);
                    let mut out = vec![0u8; offset + n];
                    assert_eq!(r.read(&mut out), offset + n);
                    assert_eq!(&out[offset..], &data[..n]);
                }
            }
        }
    }

    #[test]
    fn zero_capacity_is_harmless() {
        let mut t = TxRing::new(0);
        assert_eq!(t.push(b"x"), 0);
        t.consume(1);
        let mut r = RxRing::new(0);
        assert_eq!(r.write_at(0, b"x"), 0);
        assert_eq!(r.read(&mut [0u8; 1]), 0);
    }
}
