//! Rate limits for warnings that a remote peer can cause.
//!
//! A SYN with a window scale above 14, a passive open from a MAC that its address's owner
//! disowns, a channel that sends garbage: each deserves a warning, and a peer that sends a
//! flood of them must not turn the log into a flood of its own (one line per frame, at
//! line rate). A [`LogLimit`] lets a few warnings of one kind through per second and
//! counts the rest, which the next warning that passes reports (`suppressed = n`).
//!
//! It is a token bucket over whole seconds (a fixed window): at most `per_second` pass in
//! one second of the caller's clock. Lock-free, so one `static` serves every thread. No
//! crate fits: `governor` reads its own clock (the TCP core passes time in) and brings a
//! dependency tree for what is three atomics here.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::time::Instant;

/// At most `per_second` events of one kind are logged per second; see the
/// [module docs](self).
#[derive(Debug)]
pub struct LogLimit {
    per_second: u32,
    /// The second (of the caller's clock, plus one: 0 is "none yet") the count is for.
    second: AtomicU64,
    passed: AtomicU32,
    suppressed: AtomicU64,
}

impl LogLimit {
    /// A limit of `per_second` (at least 1) events per second.
    pub const fn new(per_second: u32) -> LogLimit {
        LogLimit {
            per_second: if per_second == 0 { 1 } else { per_second },
            second: AtomicU64::new(0),
            passed: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether an event at `now` is to be logged: `Some(n)` with the number of events
    /// suppressed since the last one logged, `None` to stay silent (it is counted).
    pub fn check_at(&self, now: Instant) -> Option<u64> {
        self.check_second(now.total_micros() / 1_000_000 + 1)
    }

    /// [`check_at`](Self::check_at) on the coarse monotonic clock, for code that may read
    /// clocks (not the sans-IO cores).
    pub fn check(&self) -> Option<u64> {
        self.check_second(crate::time::coarse_millis() / 1000 + 1)
    }

    fn check_second(&self, second: u64) -> Option<u64> {
        let seen = self.second.load(Ordering::Acquire);
        if seen != second
            && self
                .second
                .compare_exchange(seen, second, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.passed.store(0, Ordering::Release);
        }
        if self.passed.fetch_add(1, Ordering::AcqRel) < self.per_second {
            Some(self.suppressed.swap(0, Ordering::AcqRel))
        } else {
            self.suppressed.fetch_add(1, Ordering::AcqRel);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_per_second_pass_and_the_rest_are_counted() {
        let l = LogLimit::new(3);
        let at = |ms: u64| Instant::from_millis(ms);
        let passed: Vec<_> = (0..10).map(|i| l.check_at(at(1_000 + i))).collect();
        assert_eq!(
            passed,
            [
                Some(0),
                Some(0),
                Some(0),
                None,
                None,
                None,
                None,
                None,
                None,
                None
            ]
        );
        // The next second: the first that passes reports the seven suppressed.
        assert_eq!(l.check_at(at(2_000)), Some(7));
        assert_eq!(l.check_at(at(2_001)), Some(0));
        assert_eq!(l.check_at(at(2_002)), Some(0));
        assert_eq!(l.check_at(at(2_003)), None);
        assert_eq!(l.check_at(at(5_000)), Some(1));
    }

    #[test]
    fn a_flood_logs_at_most_the_limit_per_second() {
        let l = LogLimit::new(5);
        let logged = (0..100_000u64)
            .filter(|i| l.check_at(Instant::from_micros(i * 100)).is_some())
            .count();
        // 100,000 events over 10 s.
        assert_eq!(logged, 50);
    }
}
