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
    fn never_allocates_past_capacity() {
        let mut a = Assembler::new(3);
        let cap = a.ranges.capacity();
        for i in 0..100 {
            let _ = a.add(i * 7 % 90, 2);
            assert!(a.range_count() <= 3);
        }
        assert_eq!(a.ranges.capacity(), cap);
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
                prop_assert_eq!(a.total_len(), oracle.len());
                prop_assert!(a.range_count() <= max);
            }
        }
    }
}
