//! The sender's SACK scoreboard (RFC 2018, RFC 6675).
//!
//! Records which bytes in `(SND.UNA, SND.NXT]` the receiver has selectively acknowledged.
//! Blocks are validated as RFC 2018 §4 and RFC 6675 §5 require: a block with
//! `right <= left`, or one lying outside the sent-but-unacknowledged range, is ignored
//! (that covers D-SACK blocks below SND.UNA); a block straddling an edge is clipped.
//!
//! The scoreboard holds at most a fixed number of ranges. When a new range does not fit,
//! the lowest range is forgotten: losing SACK information is always safe, it only causes an
//! unnecessary retransmission, whereas an unbounded scoreboard is the Linux "SACK panic"
//! (CVE-2019-11477). The highest ranges are kept because they drive loss detection
//! ([`SackScoreboard::is_lost`]) and the recovery point.
//!
//! All stored ranges lie within one send window, far less than 2^31 bytes, so circular
//! sequence comparisons between them are sound.

use crate::tcp::SeqNumber;
use crate::wire::tcp::SackBlock;

/// A bounded set of SACKed sequence ranges, sorted, disjoint and non-adjacent.
#[derive(Debug, Clone)]
pub struct SackScoreboard {
    /// Half-open `[left, right)` ranges in ascending order; never longer than `max_ranges`.
    ranges: Vec<(SeqNumber, SeqNumber)>,
    max_ranges: usize,
}

impl SackScoreboard {
    /// An empty scoreboard that remembers at most `max_ranges` disjoint ranges.
    pub fn new(max_ranges: usize) -> Self {
        SackScoreboard {
            ranges: Vec::with_capacity(max_ranges),
            max_ranges,
        }
    }

    /// Records the SACK blocks of one ACK, given the sender's `snd_una` and `snd_nxt`.
    /// Invalid blocks are ignored and partially valid ones clipped to `(snd_una, snd_nxt]`.
    /// Returns the number of bytes SACKed for the first time.
    pub fn on_sack_blocks(
        &mut self,
        snd_una: SeqNumber,
        snd_nxt: SeqNumber,
        blocks: &[SackBlock],
    ) -> usize {
        self.on_cumulative_ack(snd_una);
        let window = snd_nxt.distance_from(snd_una);
        if window <= 0 {
            return 0;
        }
        let window = i64::from(window);
        let mut newly = 0usize;
        for block in blocks {
            let len = block.right.distance_from(block.left);
            if len <= 0 {
                continue;
            }
            // In offsets from snd_una, where plain integer comparisons are valid.
            let lo = i64::from(block.left.distance_from(snd_una));
            let hi = lo + i64::from(len);
            let (lo, hi) = (lo.max(0), hi.min(window));
            if hi <= lo {
                continue;
            }
            // Both fit in u32 since 0 <= lo < hi <= window < 2^31.
            let left = snd_una + lo as usize;
            let right = snd_una + hi as usize;
            newly = newly.saturating_add(self.insert(left, right));
        }
        newly
    }

    /// Inserts `[left, right)`, returning how many bytes were not already SACKed.
    fn insert(&mut self, left: SeqNumber, right: SeqNumber) -> usize {
        let i = self.ranges.partition_point(|&(_, r)| r < left);
        let j = self.ranges.partition_point(|&(l, _)| l <= right);
        if i == j {
            if self.max_ranges == 0 {
                return 0;
            }
            if self.ranges.len() >= self.max_ranges {
                if i == 0 {
                    // The new range is the lowest of all: it is the one to forget.
                    return 0;
                }
                self.ranges.remove(0);
                self.ranges.insert(i - 1, (left, right));
            } else {
                self.ranges.insert(i, (left, right));
            }
            return right - left;
        }
        let covered: usize = self.ranges[i..j]
            .iter()
            .map(|&(l, r)| r.min(right).distance_from(l.max(left)).max(0) as usize)
            .sum();
        let merged = (left.min(self.ranges[i].0), right.max(self.ranges[j - 1].1));
        self.ranges[i] = merged;
        self.ranges.drain(i + 1..j);
        (right - left).saturating_sub(covered)
    }

    /// The cumulative ACK point moved to `snd_una`: drops everything below it.
    pub fn on_cumulative_ack(&mut self, snd_una: SeqNumber) {
        self.ranges.retain(|&(_, r)| r > snd_una);
        if let Some(first) = self.ranges.first_mut() {
            first.0 = first.0.max(snd_una);
        }
    }

    /// Whether the byte with sequence number `seq` has been SACKed.
    pub fn is_sacked(&self, seq: SeqNumber) -> bool {
        self.ranges
            .iter()
            .any(|&(l, r)| seq.in_window(l, (r - l) as u32))
    }

    /// The total number of SACKed bytes.
    pub fn sacked_bytes(&self) -> usize {
        self.ranges.iter().map(|&(l, r)| r - l).sum()
    }

    /// The right edge of the highest SACKed range.
    pub fn highest_sacked(&self) -> Option<SeqNumber> {
        self.ranges.last().map(|&(_, r)| r)
    }

    /// RFC 6675 §4 `IsLost(seq)`: true when at least `dup_thresh` discontiguous SACKed
    /// ranges lie above `seq`, or more than `(dup_thresh - 1) * mss` bytes above `seq` have
    /// been SACKed.
    pub fn is_lost(&self, seq: SeqNumber, dup_thresh: usize, mss: usize) -> bool {
        let mut blocks = 0usize;
        let mut bytes = 0usize;
        for &(l, r) in self.ranges.iter().rev() {
            if r <= seq + 1 {
                break;
            }
            blocks += 1;
            bytes = bytes.saturating_add(r - l.max(seq + 1));
        }
        blocks >= dup_thresh || bytes > dup_thresh.saturating_sub(1).saturating_mul(mss)
    }

    /// The first un-SACKed range `[start, end)` at or after `from` that lies below
    /// [`highest_sacked`](Self::highest_sacked), or `None` if there is none.
    pub fn next_hole(&self, from: SeqNumber) -> Option<(SeqNumber, SeqNumber)> {
        let mut cursor = from;
        for &(l, r) in &self.ranges {
            if r <= cursor {
                continue;
            }
            if l <= cursor {
                cursor = r;
                continue;
            }
            return Some((cursor, l));
        }
        None
    }

    /// The number of disjoint SACKed ranges held.
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// Forgets all SACK information (for instance after an RTO, RFC 6675 §5.1).
    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    /// The SACKed ranges as half-open `(left, right)` pairs, in ascending order.
    pub fn ranges(&self) -> impl Iterator<Item = (SeqNumber, SeqNumber)> + '_ {
        self.ranges.iter().copied()
    }
}
