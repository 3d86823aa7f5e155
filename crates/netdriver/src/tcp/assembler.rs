//! Receive-side out-of-order tracking (RFC 9293 §3.10.7.4 "segment text" queuing).
//!
//! The bytes themselves live in the connection's receive buffer at offset `seq - rcv_nxt`;
//! the [`Assembler`] only remembers which ranges past the contiguous point are filled, as
//! offsets from that point (not sequence numbers: mixing the two was smoltcp #1138, #995).
//!
//! Both dimensions are bounded. The number of ranges is fixed at construction and never
//! grows: a segment that would need one more range is refused and the caller drops it.
//! The bytes are bounded by the caller trimming every segment to the receive window before
//! adding it. Unbounded out-of-order state is what the Linux "SACK panic"
//! (CVE-2019-11477) and "SegmentSmack" (CVE-2018-5390) attacks fed on.

/// Returned by [`Assembler::add`] when the segment would need more ranges than allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyRanges;

impl core::fmt::Display for TooManyRanges {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("too many out-of-order ranges")
    }
}

impl std::error::Error for TooManyRanges {}

/// The set of filled byte ranges beyond the receive point, as sorted disjoint,
/// non-adjacent half-open `[start, end)` offsets.
#[derive(Debug, Clone)]
pub struct Assembler {
    /// Sorted, disjoint and non-adjacent; never longer than `max_ranges`, so the
    /// allocation made in `new` is the only one.
    ranges: Vec<(usize, usize)>,
    max_ranges: usize,
}

impl Assembler {
    /// An empty assembler that holds at most `max_ranges` disjoint ranges.
    pub fn new(max_ranges: usize) -> Self {
        Assembler {
            ranges: Vec::with_capacity(max_ranges),
            max_ranges,
        }
    }

    /// Records `[offset, offset + len)` as filled, merging with overlapping or adjacent
    /// ranges. If that would need more than `max_ranges` ranges, nothing changes and
    /// `Err(TooManyRanges)` is returned. `len == 0` is a no-op.
    pub fn add(&mut self, offset: usize, len: usize) -> Result<(), TooManyRanges> {
        if len == 0 {
            return Ok(());
        }
        let start = offset;
        let end = offset.saturating_add(len);
        // First range that touches or follows the new one, and first one wholly after it.
        let i = self.ranges.partition_point(|&(_, e)| e < start);
        let j = self.ranges.partition_point(|&(s, _)| s <= end);
        if i == j {
            if self.ranges.len() >= self.max_ranges {
                return Err(TooManyRanges);
            }
            self.ranges.insert(i, (start, end));
        } else {
            let merged = (start.min(self.ranges[i].0), end.max(self.ranges[j - 1].1));
            self.ranges[i] = merged;
            self.ranges.drain(i + 1..j);
        }
        Ok(())
    }

    /// If a range starts at offset 0, removes it, shifts the others down by its length and
    /// returns that length; otherwise returns 0.
    pub fn remove_front(&mut self) -> usize {
        match self.ranges.first() {
            Some(&(0, end)) => {
                self.ranges.remove(0);
                self.shift(end);
                end
            }
            _ => 0,
        }
    }

    /// The contiguous point moved forward by `n` bytes: ranges below `n` are dropped or
    /// trimmed and the rest shifted down by `n`.
    pub fn advance(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.ranges.retain(|&(_, e)| e > n);
        if let Some(first) = self.ranges.first_mut() {
            first.0 = first.0.max(n);
        }
        self.shift(n);
    }

    fn shift(&mut self, n: usize) {
        for r in &mut self.ranges {
            r.0 -= n;
            r.1 -= n;
        }
    }

    /// Whether no out-of-order data is held.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The number of disjoint ranges held.
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// The ranges as `(offset, len)`, in ascending order.
    pub fn ranges(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.ranges.iter().map(|&(s, e)| (s, e - s))
    }

    /// The number of bytes held out of order.
    pub fn total_len(&self) -> usize {
        self.ranges.iter().map(|&(s, e)| e - s).sum()
    }

    /// Forgets all ranges.
    pub fn clear(&mut self) {
        self.ranges.clear();
    }
}
