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
//!
//! Costs, with *n* ranges held (at most the cap, [`Config::max_sack_ranges`], 512 by
//! default): recording one SACK block is a binary search plus at most one shift of the
//! sorted array (*O(n)* word moves, 4 KiB at 512); [`next_hole`](SackScoreboard::next_hole)
//! and [`is_sacked`](SackScoreboard::is_sacked) are binary searches;
//! [`is_lost`](SackScoreboard::is_lost) stops at the `dup_thresh`-th range above the byte.
//! So neither the cap nor a peer's SACK pattern turns a segment or an ACK into a long walk.
//! The array is allocated on demand: a connection without losses holds nothing.
//!
//! [`Config::max_sack_ranges`]: crate::tcp::Config::max_sack_ranges

use crate::tcp::SeqNumber;
use crate::wire::tcp::SackBlock;

/// A bounded set of SACKed sequence ranges, sorted, disjoint and non-adjacent.
#[derive(Debug, Clone)]
pub struct SackScoreboard {
    /// Half-open `[left, right)` ranges in ascending order; never longer than `max_ranges`.
    ranges: Vec<(SeqNumber, SeqNumber)>,
    max_ranges: usize,
    /// Ranges forgotten for want of room (a new lowest one not kept counts too).
    forgotten: u64,
}

impl SackScoreboard {
    /// An empty scoreboard that remembers at most `max_ranges` disjoint ranges.
    pub fn new(max_ranges: usize) -> Self {
        SackScoreboard {
            ranges: Vec::new(),
            max_ranges,
            forgotten: 0,
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
                self.forgotten += 1;
                return 0;
            }
            if self.ranges.len() >= self.max_ranges {
                self.forgotten += 1;
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
        // The first range ending above `seq` is the only one that can hold it.
        let i = self.ranges.partition_point(|&(_, r)| r <= seq);
        self.ranges
            .get(i)
            .is_some_and(|&(l, r)| seq.in_window(l, (r - l) as u32))
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
            // Both counts only grow: stop as soon as the answer is known, so that a
            // scoreboard of many ranges costs `dup_thresh` steps, not a walk.
            if blocks >= dup_thresh || bytes > dup_thresh.saturating_sub(1).saturating_mul(mss) {
                return true;
            }
        }
        blocks >= dup_thresh || bytes > dup_thresh.saturating_sub(1).saturating_mul(mss)
    }

    /// The first un-SACKed range `[start, end)` at or after `from` that lies below
    /// [`highest_sacked`](Self::highest_sacked), or `None` if there is none.
    pub fn next_hole(&self, from: SeqNumber) -> Option<(SeqNumber, SeqNumber)> {
        // The first range ending above `from`; ranges are disjoint and never adjacent, so
        // if it covers `from` the hole runs from its end to the next range's start.
        let i = self.ranges.partition_point(|&(_, r)| r <= from);
        let &(l, r) = self.ranges.get(i)?;
        if l > from {
            return Some((from, l));
        }
        self.ranges.get(i + 1).map(|&(next, _)| (r, next))
    }

    /// The number of disjoint SACKed ranges held.
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// Ranges forgotten because the scoreboard was full (the lowest goes, or a new range
    /// below all of them is not kept).
    pub fn forgotten(&self) -> u64 {
        self.forgotten
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Sequence numbers start just below 2^32 so every test crosses the wrap.
    const BASE: SeqNumber = SeqNumber(u32::MAX - 5000);

    fn s(off: usize) -> SeqNumber {
        BASE + off
    }

    fn blk(l: usize, r: usize) -> SackBlock {
        SackBlock {
            left: s(l),
            right: s(r),
        }
    }

    fn offs(sb: &SackScoreboard) -> Vec<(usize, usize)> {
        sb.ranges().map(|(l, r)| (l - BASE, r - BASE)).collect()
    }

    fn board(blocks: &[SackBlock]) -> SackScoreboard {
        let mut sb = SackScoreboard::new(8);
        sb.on_sack_blocks(s(0), s(20_000), blocks);
        sb
    }

    #[test]
    fn records_and_merges_across_the_wrap() {
        let mut sb = SackScoreboard::new(8);
        let n = sb.on_sack_blocks(s(0), s(20_000), &[blk(1000, 2000), blk(6000, 7000)]);
        assert_eq!(n, 2000);
        assert!(s(6000).0 < s(0).0, "the test must straddle 2^32");
        assert_eq!(offs(&sb), vec![(1000, 2000), (6000, 7000)]);
        let n = sb.on_sack_blocks(s(0), s(20_000), &[blk(1500, 6500)]);
        assert_eq!(n, 4000);
        assert_eq!(offs(&sb), vec![(1000, 7000)]);
        assert_eq!(sb.sacked_bytes(), 6000);
        // A repeated block is not new.
        assert_eq!(sb.on_sack_blocks(s(0), s(20_000), &[blk(1000, 7000)]), 0);
        // Adjacent blocks coalesce.
        assert_eq!(sb.on_sack_blocks(s(0), s(20_000), &[blk(7000, 7100)]), 100);
        assert_eq!(sb.range_count(), 1);
        assert_eq!(sb.highest_sacked(), Some(s(7100)));
    }

    #[test]
    fn invalid_blocks_are_ignored() {
        let mut sb = SackScoreboard::new(8);
        let bad = [
            blk(2000, 2000),     // empty
            blk(3000, 2000),     // reversed
            blk(20_000, 21_000), // beyond snd_nxt
            blk(25_000, 26_000), // far beyond snd_nxt
            SackBlock {
                left: s(0) - 3000,
                right: s(0) - 1000,
            }, // D-SACK below snd_una
            SackBlock {
                left: s(0) - 3000,
                right: s(0),
            }, // ends at snd_una
            SackBlock {
                left: s(100),
                right: SeqNumber(s(100).0.wrapping_add(1 << 31)),
            }, // over half the space
        ];
        assert_eq!(sb.on_sack_blocks(s(0), s(20_000), &bad), 0);
        assert_eq!(sb.range_count(), 0);
        assert_eq!(sb.highest_sacked(), None);
    }

    #[test]
    fn straddling_blocks_are_clipped() {
        let mut sb = SackScoreboard::new(8);
        let below = SackBlock {
            left: s(0) - 500,
            right: s(500),
        };
        let n = sb.on_sack_blocks(s(0), s(20_000), &[below, blk(19_500, 21_000)]);
        assert_eq!(n, 1000);
        assert_eq!(offs(&sb), vec![(0, 500), (19_500, 20_000)]);
    }

    #[test]
    fn nothing_recorded_when_nothing_outstanding() {
        let mut sb = SackScoreboard::new(8);
        assert_eq!(sb.on_sack_blocks(s(10), s(10), &[blk(5, 15)]), 0);
        assert_eq!(sb.on_sack_blocks(s(10), s(5), &[blk(5, 15)]), 0);
        assert_eq!(sb.range_count(), 0);
    }

    #[test]
    fn cumulative_ack_drops_and_trims() {
        let mut sb = board(&[blk(1000, 2000), blk(3000, 4000), blk(6000, 7000)]);
        sb.on_cumulative_ack(s(3500));
        assert_eq!(offs(&sb), vec![(3500, 4000), (6000, 7000)]);
        sb.on_cumulative_ack(s(7000));
        assert_eq!(sb.range_count(), 0);
        // A new ACK's SND.UNA also prunes old ranges.
        let mut sb = board(&[blk(1000, 2000), blk(3000, 4000)]);
        sb.on_sack_blocks(s(2500), s(20_000), &[]);
        assert_eq!(offs(&sb), vec![(3000, 4000)]);
    }

    #[test]
    fn is_sacked_is_half_open() {
        let sb = board(&[blk(4000, 6000)]);
        assert!(!sb.is_sacked(s(3999)));
        assert!(sb.is_sacked(s(4000)));
        assert!(sb.is_sacked(s(5001)));
        assert!(sb.is_sacked(s(5999)));
        assert!(!sb.is_sacked(s(6000)));
    }

    #[test]
    fn is_lost_byte_threshold_is_exact() {
        // DupThresh 3, MSS 1000: lost once more than 2000 bytes above are SACKed.
        let sb = board(&[blk(1000, 3000)]);
        assert!(!sb.is_lost(s(0), 3, 1000));
        let sb = board(&[blk(1000, 3001)]);
        assert!(sb.is_lost(s(0), 3, 1000));
        // Only bytes above seq count.
        assert!(sb.is_lost(s(999), 3, 1000));
        assert!(!sb.is_lost(s(1000), 3, 1000));
    }

    #[test]
    fn is_lost_block_threshold_is_exact() {
        let sb = board(&[blk(1000, 1001), blk(2000, 2001)]);
        assert!(!sb.is_lost(s(0), 3, 1000));
        let sb = board(&[blk(1000, 1001), blk(2000, 2001), blk(3000, 3001)]);
        assert!(sb.is_lost(s(0), 3, 1000));
        assert!(!sb.is_lost(s(1000), 3, 1000));
        assert!(!sb.is_lost(s(5000), 3, 1000));
        // Degenerate thresholds do not panic.
        assert!(sb.is_lost(s(0), 0, 0));
        let empty = SackScoreboard::new(4);
        assert!(!empty.is_lost(s(0), 3, usize::MAX));
    }

    #[test]
    fn next_hole_walks_holes() {
        let sb = board(&[blk(1000, 2000), blk(3000, 4000), blk(6000, 7000)]);
        assert_eq!(sb.next_hole(s(0)), Some((s(0), s(1000))));
        assert_eq!(sb.next_hole(s(500)), Some((s(500), s(1000))));
        assert_eq!(sb.next_hole(s(1000)), Some((s(2000), s(3000))));
        assert_eq!(sb.next_hole(s(2500)), Some((s(2500), s(3000))));
        assert_eq!(sb.next_hole(s(3000)), Some((s(4000), s(6000))));
        assert_eq!(sb.next_hole(s(6000)), None);
        assert_eq!(sb.next_hole(s(7000)), None);
        let mut holes = Vec::new();
        let mut from = s(0);
        while let Some((a, b)) = sb.next_hole(from) {
            holes.push((a - BASE, b - BASE));
            from = b;
        }
        assert_eq!(holes, vec![(0, 1000), (2000, 3000), (4000, 6000)]);
        assert_eq!(SackScoreboard::new(4).next_hole(s(0)), None);
    }

    #[test]
    fn bounded_keeps_the_highest_ranges() {
        let mut sb = SackScoreboard::new(2);
        let n = sb.on_sack_blocks(
            s(0),
            s(20_000),
            &[blk(1000, 1100), blk(3000, 3100), blk(5000, 5100)],
        );
        assert_eq!(n, 300);
        assert_eq!(offs(&sb), vec![(3000, 3100), (5000, 5100)]);
        assert_eq!(sb.forgotten(), 1);
        // A block below everything kept is the one forgotten.
        assert_eq!(sb.on_sack_blocks(s(0), s(20_000), &[blk(100, 200)]), 0);
        assert_eq!(offs(&sb), vec![(3000, 3100), (5000, 5100)]);
        assert_eq!(sb.forgotten(), 2);
        // Merging needs no new slot.
        sb.on_sack_blocks(s(0), s(20_000), &[blk(3100, 5000)]);
        assert_eq!(offs(&sb), vec![(3000, 5100)]);
        for i in 0..1000 {
            sb.on_sack_blocks(s(0), s(20_000), &[blk(6000 + i * 10, 6000 + i * 10 + 5)]);
            assert!(sb.range_count() <= 2);
        }
        let mut none = SackScoreboard::new(0);
        assert_eq!(none.on_sack_blocks(s(0), s(20_000), &[blk(1, 2)]), 0);
        assert_eq!(none.range_count(), 0);
    }

    /// The default cap holds a 100 Gbit/s × 100 µs window (1.25 MB, 856 segments of 1460
    /// bytes) with every other segment lost, as ACKs of 4 blocks report it, and the
    /// queries still walk it exactly; the old cap of 32 kept only the top 32 ranges.
    #[test]
    fn default_cap_holds_a_100g_window_with_every_other_segment_lost() {
        const MSS: usize = 1460;
        const SEGMENTS: usize = 856;
        let base = SeqNumber(u32::MAX - 100_000);
        let at = |seg: usize| base + seg * MSS;
        let nxt = at(SEGMENTS);
        let blocks: Vec<SackBlock> = (1..SEGMENTS)
            .step_by(2)
            .map(|seg| SackBlock {
                left: at(seg),
                right: at(seg + 1),
            })
            .collect();
        let cap = crate::tcp::Config::default().max_sack_ranges;
        let mut sb = SackScoreboard::new(cap);
        for ack in blocks.chunks(4) {
            sb.on_sack_blocks(base, nxt, ack);
        }
        assert_eq!(sb.range_count(), SEGMENTS / 2);
        assert_eq!(sb.sacked_bytes(), SEGMENTS / 2 * MSS);
        // Every hole, in order, from the cumulative ACK point.
        let mut from = base;
        let mut holes = 0;
        while let Some((a, b)) = sb.next_hole(from) {
            assert_eq!((a, b), (at(2 * holes), at(2 * holes + 1)));
            holes += 1;
            from = b;
        }
        assert_eq!(holes, SEGMENTS / 2);
        assert!(sb.is_sacked(at(1)) && !sb.is_sacked(at(0)));
        assert!(sb.is_sacked(at(SEGMENTS - 1) + (MSS - 1)));
        // The lowest hole is lost (hundreds of ranges above), the highest is not (one).
        assert!(sb.is_lost(base, 3, MSS));
        assert!(!sb.is_lost(at(SEGMENTS - 2), 3, MSS));
        let mut old = SackScoreboard::new(32);
        for ack in blocks.chunks(4) {
            old.on_sack_blocks(base, nxt, ack);
        }
        assert_eq!(old.range_count(), 32);
        assert_eq!(sb.forgotten(), 0);
        assert_eq!(old.forgotten(), (SEGMENTS / 2 - 32) as u64);
        assert_eq!(old.next_hole(base), Some((base, at(SEGMENTS - 63))));
    }

    #[test]
    fn clear_forgets_everything() {
        let mut sb = board(&[blk(1000, 2000)]);
        sb.clear();
        assert_eq!(sb.range_count(), 0);
        assert_eq!(sb.sacked_bytes(), 0);
        assert!(!sb.is_sacked(s(1500)));
    }
}
