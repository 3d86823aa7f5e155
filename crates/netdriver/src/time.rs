//! Time as the protocol state machines see it.
//!
//! The TCP never reads a clock: every entry point takes `now: Instant`. An [`Instant`] is a
//! count of microseconds since an arbitrary origin chosen by the driver of the state
//! machine: the simulated link starts its virtual clock at zero, a channel set's queue
//! drivers use the time since the set started (on tokio's clock, so that tests can pause
//! it), other real drivers a [`Clock`]. Microsecond resolution is what µs-scale links need
//! (RTO minimum down to 1 ms, RTTs of tens of µs) and a `u64` of them lasts 584,000 years.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};
pub use core::time::Duration;

/// A point in time, in microseconds since the driver's origin.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant {
    micros: u64,
}

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant { micros: 0 };

    /// An instant `micros` microseconds after the origin.
    pub const fn from_micros(micros: u64) -> Instant {
        Instant { micros }
    }

    /// An instant `millis` milliseconds after the origin.
    pub const fn from_millis(millis: u64) -> Instant {
        Instant {
            micros: millis.saturating_mul(1000),
        }
    }

    /// Microseconds since the origin.
    pub const fn total_micros(self) -> u64 {
        self.micros
    }

    /// Milliseconds since the origin, rounded down.
    pub const fn total_millis(self) -> u64 {
        self.micros / 1000
    }

    /// The time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_micros(self.micros.saturating_sub(earlier.micros))
    }
}

fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant {
            micros: self.micros.saturating_add(duration_micros(rhs)),
        }
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, rhs: Duration) -> Instant {
        Instant {
            micros: self.micros.saturating_sub(duration_micros(rhs)),
        }
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturates at zero when `rhs` is later than `self`.
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:06}s",
            self.micros / 1_000_000,
            self.micros % 1_000_000
        )
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A monotonic wall clock that produces [`Instant`]s for real (non-simulated) drivers.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: std::time::Instant,
}

impl Clock {
    /// A clock whose origin is now.
    pub fn new() -> Clock {
        Clock {
            origin: std::time::Instant::now(),
        }
    }

    /// The instant this clock counts from.
    pub fn origin(&self) -> std::time::Instant {
        self.origin
    }

    /// The current time relative to this clock's origin.
    pub fn now(&self) -> Instant {
        Instant::from_micros(duration_micros(self.origin.elapsed()))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// Milliseconds on the kernel's coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`: the
/// time of the last timer tick, so up to a tick, 1-4 ms, behind; read from the vDSO
/// without the time-stamp counter). For bookkeeping that counts in periods of several
/// milliseconds and asks on every message, where a precise clock read was the larger
/// cost (callgrind). Falls back to the precise clock where the coarse one is missing.
pub fn coarse_millis() -> u64 {
    #[cfg(target_os = "linux")]
    if let Ok(t) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE) {
        let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
        let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
        return secs.saturating_mul(1000).saturating_add(nanos / 1_000_000);
    }
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let d = ORIGIN.get_or_init(std::time::Instant::now).elapsed();
    d.as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(d.subsec_millis()))
}

/// How late a background thread's timed sleep may end when what it wakes for is a
/// fallback (a periodic look), not a protocol timer: one timer tick at `HZ=250`. On a busy
/// core the wake-up then comes with a tick the core takes anyway, instead of with an
/// interrupt of its own: on the 2-core bed a timer interrupt on the core running a
/// ping-pong cost 16 µs (median, 27 at p90) in the guest, and each one made that exchange a
/// tail sample (`docs/investigations/latency-tail.md`, "Timer slack").
pub const FALLBACK_SLACK: std::time::Duration = std::time::Duration::from_millis(4);

/// The slack for a sleep until a protocol timer `wait` ahead: an eighth of the wait, at
/// least the kernel's default 50 µs and at most [`FALLBACK_SLACK`].
pub fn timer_slack(wait: std::time::Duration) -> std::time::Duration {
    (wait / 8).clamp(std::time::Duration::from_micros(50), FALLBACK_SLACK)
}

/// The calling thread's timer slack (`PR_SET_TIMERSLACK`: how much later than asked the
/// kernel may end its timed sleeps, so that it can serve several timers with one
/// interrupt), set with a system call only when it changes. Keep one per thread.
#[derive(Debug, Default)]
pub struct TimerSlack {
    /// The slack last set, in nanoseconds (0: never set here).
    set_ns: u64,
}

impl TimerSlack {
    /// Slack not set yet (the thread has the kernel's default, or its parent's).
    pub const fn new() -> TimerSlack {
        TimerSlack { set_ns: 0 }
    }

    /// Lets the thread's timed sleeps end up to `slack` late, from the next sleep on.
    /// Values are taken in 50 µs steps, so that nearby ones share one system call.
    pub fn set(&mut self, slack: std::time::Duration) {
        const STEP_NS: u64 = 50_000;
        let ns = u64::try_from(slack.as_nanos())
            .unwrap_or(u64::MAX)
            .div_ceil(STEP_NS)
            .max(1)
            .saturating_mul(STEP_NS);
        if ns == self.set_ns {
            return;
        }
        #[cfg(target_os = "linux")]
        {
            let arg = libc::c_ulong::try_from(ns).unwrap_or(libc::c_ulong::MAX);
            if nix::sys::prctl::set_timerslack(arg).is_err() {
                return;
            }
        }
        self.set_ns = ns;
    }

    /// The slack last set here, if any.
    pub fn get(&self) -> Option<std::time::Duration> {
        (self.set_ns > 0).then(|| std::time::Duration::from_nanos(self.set_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_slack_follows_the_wait_within_bounds() {
        use std::time::Duration as D;
        assert_eq!(timer_slack(D::from_millis(2)), D::from_micros(250));
        assert_eq!(timer_slack(D::from_micros(100)), D::from_micros(50));
        assert_eq!(timer_slack(D::from_secs(1)), FALLBACK_SLACK);
        let mut s = TimerSlack::new();
        assert_eq!(s.get(), None);
        s.set(D::from_micros(120));
        assert_eq!(
            s.get(),
            Some(D::from_micros(150)),
            "rounded up to a 50 µs step"
        );
        #[cfg(target_os = "linux")]
        assert_eq!(
            nix::sys::prctl::get_timerslack().ok(),
            Some(150_000),
            "the thread's slack as the kernel has it"
        );
        s.set(D::from_micros(140));
        assert_eq!(s.get(), Some(D::from_micros(150)));
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_millis(5);
        assert_eq!(t + Duration::from_millis(1), Instant::from_micros(6000));
        assert_eq!(t - Duration::from_secs(1), Instant::ZERO);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(t - Instant::from_millis(2), Duration::from_millis(3));
        assert_eq!(
            Instant::from_micros(u64::MAX) + Duration::from_secs(1),
            Instant::from_micros(u64::MAX)
        );
    }

    #[test]
    fn clock_is_monotonic() {
        let c = Clock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
    }

    #[test]
    fn the_coarse_clock_follows_the_precise_one_to_a_tick() {
        // The coarse clock is the monotonic clock as of its last tick: never ahead of a
        // precise reading taken after it, and behind it by at most a tick (10 ms at
        // HZ=100, the coarsest kernel setting). Compared many times, no waiting.
        let precise_ms = || {
            let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
            u64::try_from(t.tv_sec()).unwrap() * 1000
                + u64::try_from(t.tv_nsec()).unwrap() / 1_000_000
        };
        let mut last = 0;
        for _ in 0..10_000 {
            let c = coarse_millis();
            let p = precise_ms();
            assert!(c <= p, "coarse {c} ms ahead of precise {p} ms");
            assert!(p - c <= 10, "coarse {c} ms more than a tick behind {p} ms");
            assert!(c >= last, "coarse clock went back: {last} -> {c}");
            last = c;
        }
    }
}
