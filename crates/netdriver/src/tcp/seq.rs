//! TCP sequence numbers: 32-bit values compared modulo 2^32 (RFC 9293 §3.4).
//!
//! Raw `u32` arithmetic on sequence numbers is the source of a whole class of bugs near the
//! wrap point (smoltcp #489, gVisor #14, picoTCP #118), so all sequence maths goes through
//! [`SeqNumber`]: adding a length wraps, subtracting two numbers gives a signed distance, and
//! ordering is "less than by less than half the space".

use core::cmp::Ordering;
use core::fmt;
use core::ops::{Add, AddAssign, Sub};

/// A TCP sequence (or acknowledgement) number.
///
/// `PartialOrd` is circular: `a < b` when `b - a` lies in `1..2^31`. It is not a total order
/// over the whole space, which is why this type implements `PartialOrd` but not `Ord`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SeqNumber(pub u32);

impl SeqNumber {
    /// The raw 32-bit value, for the wire.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The signed distance from `other` to `self` (positive when `self` is later).
    pub const fn distance_from(self, other: SeqNumber) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }

    /// The larger of two sequence numbers in circular order.
    pub fn max(self, other: SeqNumber) -> SeqNumber {
        if self.distance_from(other) >= 0 {
            self
        } else {
            other
        }
    }

    /// The smaller of two sequence numbers in circular order.
    pub fn min(self, other: SeqNumber) -> SeqNumber {
        if self.distance_from(other) <= 0 {
            self
        } else {
            other
        }
    }

    /// Whether `self` lies in the half-open window `[start, start + len)`.
    pub fn in_window(self, start: SeqNumber, len: u32) -> bool {
        self.0.wrapping_sub(start.0) < len
    }
}

impl fmt::Debug for SeqNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for SeqNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Add<usize> for SeqNumber {
    type Output = SeqNumber;
    /// Advances by a byte count. Lengths of 2^31 or more are a logic error: no segment or
    /// window is that large, so this panics in debug builds to catch it.
    fn add(self, rhs: usize) -> SeqNumber {
        debug_assert!(
            rhs < (1 << 31),
            "sequence advance {rhs} is not a valid length"
        );
        SeqNumber(self.0.wrapping_add(rhs as u32))
    }
}

impl AddAssign<usize> for SeqNumber {
    fn add_assign(&mut self, rhs: usize) {
        *self = *self + rhs;
    }
}

impl Sub<usize> for SeqNumber {
    type Output = SeqNumber;
    fn sub(self, rhs: usize) -> SeqNumber {
        debug_assert!(
            rhs < (1 << 31),
            "sequence retreat {rhs} is not a valid length"
        );
        SeqNumber(self.0.wrapping_sub(rhs as u32))
    }
}

impl Sub<SeqNumber> for SeqNumber {
    type Output = usize;
    /// The number of bytes from `rhs` up to `self`. `rhs` must not be later than `self`;
    /// a negative distance is a logic error (debug panic, zero in release).
    fn sub(self, rhs: SeqNumber) -> usize {
        let d = self.distance_from(rhs);
        debug_assert!(d >= 0, "sequence subtraction {self} - {rhs} is negative");
        d.max(0) as usize
    }
}

impl PartialOrd for SeqNumber {
    fn partial_cmp(&self, other: &SeqNumber) -> Option<Ordering> {
        Some(self.distance_from(*other).cmp(&0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_across_wrap() {
        let a = SeqNumber(u32::MAX - 10);
        let b = a + 20;
        assert_eq!(b.0, 9);
        assert!(a < b);
        assert!(b > a);
        assert_eq!(b - a, 20);
        assert_eq!(b.distance_from(a), 20);
        assert_eq!(a.distance_from(b), -20);
        assert_eq!(a.max(b), b);
        assert_eq!(a.min(b), a);
    }

    #[test]
    fn window_membership_wraps() {
        let start = SeqNumber(u32::MAX - 1);
        assert!(start.in_window(start, 1));
        assert!((start + 3).in_window(start, 4));
        assert!(!(start + 4).in_window(start, 4));
        assert!(!(start - 1).in_window(start, 4));
        assert!(!start.in_window(start, 0));
    }
}
