//! The clock of a channel set's queue drivers: tokio's, so that a test that pauses time
//! (`tokio::time::pause`) drives every TCP timer of the set deterministically, and the
//! sans-IO cores get the [`Instant`]s they are fed from one origin.

use crate::time::{Duration, Instant};

/// Microseconds since the set started, on tokio's clock (the real monotonic clock unless
/// the calling runtime paused time).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RuntimeClock {
    origin: tokio::time::Instant,
}

impl RuntimeClock {
    /// A clock whose origin is now.
    pub(crate) fn new() -> RuntimeClock {
        RuntimeClock {
            origin: tokio::time::Instant::now(),
        }
    }

    /// The current time relative to the origin (zero if the calling runtime's paused
    /// clock stands before it).
    pub(crate) fn now(&self) -> Instant {
        self.at(tokio::time::Instant::now())
    }

    /// `t`, a reading of tokio's clock, relative to the origin (for a caller that keeps
    /// the reading itself, to measure a span with it too).
    pub(crate) fn at(&self, t: tokio::time::Instant) -> Instant {
        let d = t.saturating_duration_since(self.origin);
        Instant::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    /// `t` as a tokio instant, for a timer.
    pub(crate) fn deadline(&self, t: Instant) -> tokio::time::Instant {
        self.origin + Duration::from_micros(t.total_micros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under paused time the clock moves only as tokio's does, and a deadline maps back to
    /// the instant it was made from.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn follows_tokio_time() {
        let c = RuntimeClock::new();
        let t0 = c.now();
        tokio::time::advance(std::time::Duration::from_millis(5)).await;
        let t1 = c.now();
        assert_eq!(t1.total_micros() - t0.total_micros(), 5_000);
        let at = t1 + Duration::from_millis(3);
        tokio::time::sleep_until(c.deadline(at)).await;
        assert_eq!(c.now(), at);
    }
}
