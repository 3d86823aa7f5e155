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
//!
//! The per-segment cost must not grow with the number of ranges either: SegmentSmack was
//! a linear walk of the out-of-order queue per arriving segment, which a peer makes
//! expensive by creating many holes. With caps sized for 100 Gbit/s (hundreds of ranges,
//! see [`Config::max_ooo_ranges`](crate::tcp::Config::max_ooo_ranges)) a sorted `Vec`
//! would memmove up to the whole table per insert and shift every range per in-order
//! segment. The ranges are therefore kept in a `BTreeMap` keyed by absolute position
//! (offset plus a running base), so that adding, merging, looking up the range holding an
//! offset, and moving the contiguous point are O(log n) per range touched, and each range
//! is created and removed at most once.

use std::collections::BTreeMap;

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
    /// Absolute `start -> end` of each range, sorted, disjoint and non-adjacent; never
    /// more than `max_ranges` entries. Absolute positions are offsets plus `base`, so
    /// moving the contiguous point changes `base` instead of rewriting every key. `u128`
    /// because an offset may be anything up to `usize::MAX` and `base` only grows: no
    /// sum of the two can overflow it.
    ranges: BTreeMap<u128, u128>,
    /// Absolute position of offset 0 (the contiguous point, RCV.NXT).
    base: u128,
    /// Bytes held in all ranges, kept so that [`total_len`](Self::total_len) is O(1).
    total: usize,
    max_ranges: usize,
}

impl Assembler {
    /// An empty assembler that holds at most `max_ranges` disjoint ranges. Nothing is
    /// allocated until the first range is added; with `n` ranges the map holds about
    /// `n / 5 + 1` B-tree nodes of at most 456 bytes each at worst (`n` = 512: under
    /// 48 KiB), so the memory is bounded by `max_ranges` whatever the peer sends.
    pub fn new(max_ranges: usize) -> Self {
        Assembler {
            ranges: BTreeMap::new(),
            base: 0,
            total: 0,
            max_ranges,
        }
    }

    /// The most ranges this assembler holds.
    pub fn max_ranges(&self) -> usize {
        self.max_ranges
    }

    /// Changes the range cap. Lowering it below the number of ranges held keeps them
    /// (nothing received is discarded); only new ranges are refused until merges and
    /// deliveries bring the count under the new cap.
    pub fn set_max_ranges(&mut self, max_ranges: usize) {
        self.max_ranges = max_ranges;
    }

    /// Records `[offset, offset + len)` as filled, merging with overlapping or adjacent
    /// ranges. If that would need more than `max_ranges` ranges, nothing changes and
    /// `Err(TooManyRanges)` is returned. `len == 0` is a no-op. Costs O(log n) plus
    /// O(log n) for each range merged away.
    pub fn add(&mut self, offset: usize, len: usize) -> Result<(), TooManyRanges> {
        if len == 0 {
            return Ok(());
        }
        let mut start = self.base + offset as u128;
        let mut end = self.base + offset.saturating_add(len) as u128;
        // Ranges that overlap or touch [start, end] are those starting at or before `end`
        // whose end is at or after `start`; being sorted and disjoint, they are the last
        // few of the ranges starting at or before `end`.
        let touches = self
            .ranges
            .range(..=end)
            .next_back()
            .is_some_and(|(_, &e)| e >= start);
        if !touches && self.ranges.len() >= self.max_ranges {
            return Err(TooManyRanges);
        }
        while let Some((&s, &e)) = self.ranges.range(..=end).next_back() {
            if e < start {
                break;
            }
            self.ranges.remove(&s);
            self.total -= (e - s) as usize;
            start = start.min(s);
            end = end.max(e);
        }
        self.ranges.insert(start, end);
        self.total += (end - start) as usize;
        Ok(())
    }

    /// If a range starts at offset 0, removes it, shifts the others down by its length and
    /// returns that length; otherwise returns 0.
    pub fn remove_front(&mut self) -> usize {
        match self.ranges.first_key_value() {
            Some((&s, &e)) if s == self.base => {
                self.ranges.remove(&s);
                let len = (e - s) as usize;
                self.total -= len;
                self.base = e;
                len
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
        self.base += n as u128;
        while let Some((&s, &e)) = self.ranges.first_key_value() {
            if s >= self.base {
                break;
            }
            self.ranges.remove(&s);
            self.total -= (e - s) as usize;
            if e > self.base {
                // Partly below the new point: keep the part above it.
                self.ranges.insert(self.base, e);
                self.total += (e - self.base) as usize;
                break;
            }
        }
    }

    /// The range holding the byte at `offset`, as `(offset, len)`, if any. O(log n).
    pub fn containing(&self, offset: usize) -> Option<(usize, usize)> {
        let at = self.base + offset as u128;
        let (&s, &e) = self.ranges.range(..=at).next_back()?;
        (at < e).then(|| self.relative(s, e))
    }

    /// An absolute range as `(offset, len)`. Ranges never start below `base`, and no
    /// range ends more than `usize::MAX` past it (offsets are `usize` and `base` only
    /// grows), so both fit.
    fn relative(&self, s: u128, e: u128) -> (usize, usize) {
        ((s - self.base) as usize, (e - s) as usize)
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
        self.ranges.iter().map(|(&s, &e)| self.relative(s, e))
    }

    /// The number of bytes held out of order.
    pub fn total_len(&self) -> usize {
        self.total
    }

    /// Forgets all ranges.
    pub fn clear(&mut self) {
        self.ranges.clear();
        self.total = 0;
        self.base = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn ranges(a: &Assembler) -> Vec<(usize, usize)> {
        a.ranges().collect()
    }

    fn with(max: usize, adds: &[(usize, usize)]) -> Assembler {
        let mut a = Assembler::new(max);
        for &(o, l) in adds {
            a.add(o, l).unwrap();
        }
        a
    }

    #[test]
    fn disjoint_ranges_stay_sorted() {
        let a = with(8, &[(20, 5), (5, 5), (40, 1)]);
        assert_eq!(ranges(&a), vec![(5, 5), (20, 5), (40, 1)]);
        assert_eq!(a.range_count(), 3);
        assert_eq!(a.total_len(), 11);
    }

    #[test]
    fn merges_in_every_overlap_configuration() {
        let base = [(10, 10)]; // [10, 20)
        type Range = (usize, usize);
        let cases: &[(Range, Range)] = &[
            ((5, 5), (5, 15)),    // adjacent before
            ((20, 5), (10, 15)),  // adjacent after
            ((5, 10), (5, 15)),   // overlaps start
            ((15, 10), (10, 15)), // overlaps end
            ((12, 3), (10, 10)),  // inside
            ((10, 10), (10, 10)), // identical
            ((0, 30), (0, 30)),   // covers
            ((10, 3), (10, 10)),  // same start, shorter
            ((18, 2), (10, 10)),  // same end, shorter
        ];
        for &(add, want) in cases {
            let mut a = with(1, &base);
            a.add(add.0, add.1).unwrap();
            assert_eq!(ranges(&a), vec![want], "adding {add:?}");
        }
    }

    #[test]
    fn bridging_add_merges_many_ranges() {
        let mut a = with(4, &[(0, 2), (4, 2), (8, 2), (12, 2)]);
        a.add(1, 12).unwrap();
        assert_eq!(ranges(&a), vec![(0, 14)]);
        let mut a = with(4, &[(2, 2), (6, 2), (10, 2)]);
        a.add(4, 2).unwrap();
        assert_eq!(ranges(&a), vec![(2, 6), (10, 2)]);
    }

    #[test]
    fn cap_refuses_new_range_and_leaves_state_unchanged() {
        let mut a = with(2, &[(10, 5), (30, 5)]);
        assert_eq!(a.add(20, 5), Err(TooManyRanges));
        assert_eq!(a.add(0, 5), Err(TooManyRanges));
        assert_eq!(a.add(50, 5), Err(TooManyRanges));
        assert_eq!(ranges(&a), vec![(10, 5), (30, 5)]);
        // Extending or bridging needs no new range, so it still works when full.
        a.add(15, 2).unwrap();
        a.add(17, 13).unwrap();
        assert_eq!(ranges(&a), vec![(10, 25)]);
    }

    #[test]
    fn zero_capacity_refuses_everything_but_empty_adds() {
        let mut a = Assembler::new(0);
        assert_eq!(a.add(0, 0), Ok(()));
        assert_eq!(a.add(3, 1), Err(TooManyRanges));
        assert!(a.is_empty());
    }

    #[test]
    fn never_holds_more_than_the_cap() {
        let mut a = Assembler::new(3);
        for i in 0..100 {
            let _ = a.add(i * 7 % 90, 2);
            assert!(a.range_count() <= 3);
        }
        assert_eq!(a.range_count(), 3);
    }

    /// Hundreds of holes, as a 100 Gbit/s x 100 µs window with every other segment lost
    /// makes (the reason `max_ooo_ranges` defaults to 512). Insert out of order, in both directions, then merge them all.
    #[test]
    fn many_ranges_insert_merge_and_deliver_exactly() {
        const N: usize = 512;
        const SEG: usize = 1460;
        let mut a = Assembler::new(N);
        // Every other segment, odd ones, added from the far end back to the front.
        for k in (0..N).rev() {
            a.add((2 * k + 1) * SEG, SEG).unwrap();
        }
        assert_eq!(a.range_count(), N);
        assert_eq!(a.total_len(), N * SEG);
        let want: Vec<_> = (0..N).map(|k| ((2 * k + 1) * SEG, SEG)).collect();
        assert_eq!(ranges(&a), want);
        // Full: a new hole past the last range is refused, one inside a gap too.
        assert_eq!(a.add((2 * N + 1) * SEG, SEG), Err(TooManyRanges));
        assert_eq!(a.add(2 * SEG + 10, 5), Err(TooManyRanges));
        assert_eq!(a.range_count(), N);
        // Lookups by offset, O(log n).
        assert_eq!(a.containing(SEG), Some((SEG, SEG)));
        assert_eq!(a.containing(2 * SEG - 1), Some((SEG, SEG)));
        assert_eq!(a.containing(2 * SEG), None);
        assert_eq!(a.containing(0), None);
        assert_eq!(
            a.containing((2 * N - 1) * SEG + 7),
            Some(((2 * N - 1) * SEG, SEG))
        );
        // Fill the even gaps from 300 upwards: each merges its two neighbours.
        for k in (300..N).map(|k| 2 * k) {
            a.add(k * SEG, SEG).unwrap();
        }
        assert_eq!(a.range_count(), 300);
        assert_eq!(
            a.ranges().last(),
            Some((599 * SEG, (2 * N - 599) * SEG)),
            "the tail merged into one range"
        );
        // One add bridging the first 100 ranges (offsets SEG .. 200*SEG) merges them.
        a.add(SEG + 5, 199 * SEG - 5).unwrap();
        assert_eq!(a.range_count(), 201);
        assert_eq!(ranges(&a)[0], (SEG, 199 * SEG));
        assert_eq!(ranges(&a)[1], (201 * SEG, SEG));
        // In-order data at 0 delivers the front range with it, then the gaps one by one.
        a.add(0, SEG).unwrap();
        assert_eq!(a.remove_front(), 200 * SEG);
        assert_eq!(a.remove_front(), 0);
        let mut delivered = 200 * SEG;
        while !a.is_empty() {
            a.add(0, SEG).unwrap();
            delivered += a.remove_front();
        }
        assert_eq!(delivered, 2 * N * SEG);
        assert_eq!(a.total_len(), 0);
    }

    /// Advancing past many ranges drops them all and trims the one it lands in.
    #[test]
    fn advance_over_many_ranges() {
        let mut a = Assembler::new(1000);
        for k in 0..1000 {
            a.add(10 * k + 5, 3).unwrap();
        }
        a.advance(5006);
        // Ranges [5, 8) .. [4995, 4998) are gone, [5005, 5008) is trimmed to [5006, 5008).
        assert_eq!(a.range_count(), 500);
        assert_eq!(ranges(&a)[0], (0, 2));
        assert_eq!(ranges(&a)[1], (9, 3));
        assert_eq!(a.total_len(), 2 + 499 * 3);
        a.advance(usize::MAX);
        assert!(a.is_empty());
        assert_eq!(a.total_len(), 0);
        // Offsets stay relative after huge advances.
        a.add(3, 4).unwrap();
        assert_eq!(ranges(&a), vec![(3, 4)]);
    }

    #[test]
    fn lowering_the_cap_keeps_what_is_held() {
        let mut a = with(4, &[(2, 2), (6, 2), (10, 2)]);
        a.set_max_ranges(1);
        assert_eq!(a.max_ranges(), 1);
        assert_eq!(a.range_count(), 3);
        assert_eq!(a.add(20, 1), Err(TooManyRanges));
        // Merges still work.
        a.add(4, 2).unwrap();
        assert_eq!(ranges(&a), vec![(2, 6), (10, 2)]);
    }

    #[test]
    fn zero_length_add_is_a_noop() {
        let mut a = with(1, &[(10, 5)]);
        a.add(100, 0).unwrap();
        assert_eq!(ranges(&a), vec![(10, 5)]);
    }

    #[test]
    fn huge_values_saturate() {
        let mut a = Assembler::new(2);
        a.add(usize::MAX - 1, usize::MAX).unwrap();
        assert_eq!(ranges(&a), vec![(usize::MAX - 1, 1)]);
        a.advance(usize::MAX);
        assert!(a.is_empty());
    }

    #[test]
    fn remove_front_only_at_zero() {
        let mut a = with(4, &[(3, 4), (10, 2)]);
        assert_eq!(a.remove_front(), 0);
        a.add(0, 3).unwrap();
        assert_eq!(a.remove_front(), 7);
        assert_eq!(ranges(&a), vec![(3, 2)]);
        assert_eq!(a.remove_front(), 0);
        assert_eq!(Assembler::new(1).remove_front(), 0);
    }

    #[test]
    fn advance_drops_trims_and_shifts() {
        let mut a = with(4, &[(2, 3), (8, 4), (20, 1)]);
        a.advance(10);
        assert_eq!(ranges(&a), vec![(0, 2), (10, 1)]);
        a.advance(0);
        assert_eq!(ranges(&a), vec![(0, 2), (10, 1)]);
        a.advance(5);
        assert_eq!(ranges(&a), vec![(5, 1)]);
        a.clear();
        assert!(a.is_empty());
        assert_eq!(a.total_len(), 0);
    }

    fn runs(set: &BTreeSet<usize>) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for &x in set {
            match out.last_mut() {
                Some((s, l)) if *s + *l == x => *l += 1,
                _ => out.push((x, 1)),
            }
        }
        out
    }

    #[derive(Debug, Clone)]
    enum Op {
        Add(usize, usize),
        RemoveFront,
        Advance(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0usize..120, 0usize..20).prop_map(|(o, l)| Op::Add(o, l)),
            1 => Just(Op::RemoveFront),
            1 => (0usize..30).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #[test]
        fn matches_bitmap_oracle(max in 1usize..6, ops in proptest::collection::vec(op(), 1..60)) {
            let mut a = Assembler::new(max);
            let mut oracle = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Add(o, l) => {
                        let mut next = oracle.clone();
                        next.extend(o..o + l);
                        match a.add(o, l) {
                            Ok(()) => oracle = next,
                            // Refused only when the result would really need too many ranges.
                            Err(TooManyRanges) => prop_assert!(runs(&next).len() > max),
                        }
                    }
                    Op::RemoveFront => {
                        let n = a.remove_front();
                        let want = match runs(&oracle).first() {
                            Some(&(0, l)) => l,
                            _ => 0,
                        };
                        prop_assert_eq!(n, want);
                        oracle = oracle.iter().filter(|&&x| x >= n).map(|&x| x - n).collect();
                    }
                    Op::Advance(n) => {
                        a.advance(n);
                        oracle = oracle.iter().filter(|&&x| x >= n).map(|&x| x - n).collect();
                    }
                }
                prop_assert_eq!(ranges(&a), runs(&oracle));
                for x in 0..140usize {
                    let want = runs(&oracle).into_iter().find(|&(s, l)| s <= x && x < s + l);
                    prop_assert_eq!(a.containing(x), want);
                }
                prop_assert_eq!(a.total_len(), oracle.len());
                prop_assert!(a.range_count() <= max);
            }
        }
    }
}
