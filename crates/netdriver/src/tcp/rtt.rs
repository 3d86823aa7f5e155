//! Retransmission timeout estimation (RFC 6298).
//!
//! The smoothed RTT and its variation follow RFC 6298 §2.2 (first sample) and §2.3 (later
//! samples) with alpha = 1/8, beta = 1/4, K = 4 and a clock granularity G of 1 µs, the
//! resolution of [`Instant`](crate::time::Instant). The computed RTO is clamped to a
//! configurable `[min_rto, max_rto]`: RFC 6298 §2.4 asks for a 1 s floor, but that floor ruins
//! µs-scale links (smoltcp #1190), so the floor is the caller's choice and may be as low as
//! 1 ms. Timeouts double the RTO (§5.5) and a fresh sample cancels the doubling, since a
//! measured round trip proves the path alive (forgetting that was smoltcp #1023).

use crate::time::Duration;

/// Clock granularity G of RFC 6298 §2: the resolution of [`crate::time::Instant`].
const GRANULARITY_MICROS: u128 = 1;

/// An RFC 6298 round-trip time estimator and retransmission-timeout calculator.
#[derive(Debug, Clone)]
pub struct RttEstimator {
    min_rto: Duration,
    max_rto: Duration,
    /// SRTT in µs; `None` until the first sample.
    srtt: Option<u128>,
    /// RTTVAR in µs.
    rttvar: u128,
    /// The RTO before backoff, already clamped.
    base_rto: Duration,
    backoff: u32,
    min_rtt: Option<Duration>,
}

fn micros(d: Duration) -> u128 {
    d.as_micros()
}

fn from_micros(us: u128) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(u64::MAX))
}

impl RttEstimator {
    /// An estimator with no samples yet, whose RTO is `initial_rto` (RFC 6298 §2.1
    /// recommends 1 s) until the first sample. All RTOs are clamped to
    /// `[min_rto, max_rto]`; if `min_rto > max_rto`, `max_rto` wins.
    pub fn new(initial_rto: Duration, min_rto: Duration, max_rto: Duration) -> Self {
        let min_rto = min_rto.min(max_rto);
        let mut est = RttEstimator {
            min_rto,
            max_rto,
            srtt: None,
            rttvar: 0,
            base_rto: initial_rto,
            backoff: 0,
            min_rtt: None,
        };
        est.base_rto = est.clamp(initial_rto);
        est
    }

    fn clamp(&self, rto: Duration) -> Duration {
        // Not `Ord::clamp`: it panics when the bounds are inverted, and `new` already fixed
        // them, but a panic-free path costs nothing here.
        rto.max(self.min_rto).min(self.max_rto)
    }

    /// Feeds one RTT measurement (RFC 6298 §2.2 for the first, §2.3 for later ones),
    /// recomputes the RTO, and cancels any timeout backoff.
    pub fn on_sample(&mut self, rtt: Duration) {
        let r = micros(rtt);
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                // RTTVAR is updated with the old SRTT, as §2.3 orders.
                let delta = srtt.abs_diff(r);
                self.rttvar = (3 * self.rttvar + delta) / 4;
                self.srtt = Some((7 * srtt + r) / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(r);
        let rto = srtt.saturating_add(GRANULARITY_MICROS.max(self.rttvar.saturating_mul(4)));
        self.base_rto = self.clamp(from_micros(rto));
        self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
        self.backoff = 0;
    }

    /// The current RTO, including exponential backoff, clamped to `max_rto`.
    pub fn rto(&self) -> Duration {
        // Past 2^40 the product exceeds any sane max_rto, so the shift is capped instead of
        // overflowing.
        let factor = 1u128 << self.backoff.min(40);
        self.clamp(from_micros(micros(self.base_rto).saturating_mul(factor)))
    }

    /// Doubles the RTO after a retransmission timeout (RFC 6298 §5.5), never beyond
    /// `max_rto`. The count keeps increasing so callers can give up after N timeouts.
    pub fn on_timeout_backoff(&mut self) {
        self.backoff = self.backoff.saturating_add(1);
    }

    /// Cancels the backoff, returning the RTO to the estimate.
    pub fn reset_backoff(&mut self) {
        self.backoff = 0;
    }

    /// How many consecutive timeouts have doubled the RTO since the last reset.
    pub fn backoff_count(&self) -> u32 {
        self.backoff
    }

    /// The smoothed RTT, or `None` before the first sample.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt.map(from_micros)
    }

    /// [`srtt`](Self::srtt) in whole microseconds (saturating), without a `Duration`.
    pub fn srtt_micros(&self) -> Option<u64> {
        self.srtt.map(|us| u64::try_from(us).unwrap_or(u64::MAX))
    }

    /// The RTT variation (zero before the first sample).
    pub fn rttvar(&self) -> Duration {
        from_micros(self.rttvar)
    }

    /// The smallest RTT sampled so far, or `None` before the first sample.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn est() -> RttEstimator {
        RttEstimator::new(ms(1000), ms(1), ms(60_000))
    }

    #[test]
    fn initial_rto_before_samples() {
        let e = est();
        assert_eq!(e.rto(), ms(1000));
        assert_eq!(e.srtt(), None);
        assert_eq!(e.rttvar(), Duration::ZERO);
        assert_eq!(e.min_rtt(), None);
        assert_eq!(e.backoff_count(), 0);
    }

    #[test]
    fn first_sample_sets_srtt_and_half_rttvar() {
        let mut e = est();
        e.on_sample(ms(100));
        assert_eq!(e.srtt(), Some(ms(100)));
        assert_eq!(e.rttvar(), ms(50));
        // SRTT + K*RTTVAR = 100 + 4*50.
        assert_eq!(e.rto(), ms(300));
    }

    #[test]
    fn later_samples_follow_the_smoothing_formula() {
        let mut e = est();
        e.on_sample(ms(100));
        e.on_sample(ms(200));
        // RTTVAR = 3/4*50 + 1/4*|100-200| = 62.5; SRTT = 7/8*100 + 1/8*200 = 112.5.
        assert_eq!(e.rttvar(), us(62_500));
        assert_eq!(e.srtt(), Some(us(112_500)));
        assert_eq!(e.rto(), us(112_500 + 4 * 62_500));
        e.on_sample(ms(100));
        // RTTVAR = 3/4*62.5 + 1/4*12.5 = 50; SRTT = 7/8*112.5 + 1/8*100 = 110.9375.
        assert_eq!(e.rttvar(), us(50_000));
        assert_eq!(e.srtt(), Some(us(110_937)));
        assert_eq!(e.min_rtt(), Some(ms(100)));
    }

    #[test]
    fn rto_clamped_to_a_1ms_floor_not_1s() {
        let mut e = est();
        e.on_sample(us(20));
        assert_eq!(e.srtt(), Some(us(20)));
        assert_eq!(e.rto(), ms(1));
        let mut e = RttEstimator::new(ms(1000), us(50), ms(60_000));
        e.on_sample(us(20));
        // 20 + 4*10 µs sits just above the 50 µs floor.
        assert_eq!(e.rto(), us(60));
    }

    #[test]
    fn zero_sample_uses_clock_granularity() {
        let mut e = RttEstimator::new(ms(1000), Duration::ZERO, ms(60_000));
        e.on_sample(Duration::ZERO);
        assert_eq!(e.rto(), us(1));
    }

    #[test]
    fn rto_clamped_to_max() {
        let mut e = RttEstimator::new(ms(1000), ms(1), ms(5000));
        e.on_sample(ms(4000));
        assert_eq!(e.rto(), ms(5000));
        e.on_sample(Duration::MAX);
        assert_eq!(e.rto(), ms(5000));
        let e = RttEstimator::new(ms(90_000), ms(1), ms(5000));
        assert_eq!(e.rto(), ms(5000));
    }

    #[test]
    fn inverted_bounds_do_not_panic() {
        let mut e = RttEstimator::new(ms(100), ms(500), ms(200));
        assert_eq!(e.rto(), ms(200));
        e.on_sample(ms(1));
        assert_eq!(e.rto(), ms(200));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let mut e = RttEstimator::new(ms(1000), ms(1), ms(5000));
        e.on_sample(ms(100));
        assert_eq!(e.rto(), ms(300));
        e.on_timeout_backoff();
        assert_eq!(e.rto(), ms(600));
        assert_eq!(e.backoff_count(), 1);
        e.on_timeout_backoff();
        e.on_timeout_backoff();
        assert_eq!(e.rto(), ms(2400));
        e.on_timeout_backoff();
        assert_eq!(e.rto(), ms(4800));
        e.on_timeout_backoff();
        assert_eq!(e.rto(), ms(5000));
        for _ in 0..1000 {
            e.on_timeout_backoff();
        }
        assert_eq!(e.rto(), ms(5000));
        assert_eq!(e.backoff_count(), 1005);
        e.reset_backoff();
        assert_eq!(e.rto(), ms(300));
    }

    #[test]
    fn backoff_saturates_instead_of_overflowing() {
        let mut e = RttEstimator::new(ms(1000), ms(1), Duration::MAX);
        for _ in 0..200 {
            e.on_timeout_backoff();
        }
        assert!(e.rto() >= ms(1000));
    }

    #[test]
    fn fresh_sample_cancels_backoff() {
        // smoltcp #1023: a backed-off RTO must not outlive evidence that the path works.
        let mut e = est();
        e.on_sample(ms(10));
        e.on_timeout_backoff();
        e.on_timeout_backoff();
        assert_eq!(e.rto(), ms(120));
        e.on_sample(ms(10));
        assert_eq!(e.backoff_count(), 0);
        // RTTVAR decayed to 3/4*5 ms; SRTT still 10 ms.
        assert_eq!(e.rto(), us(10_000 + 4 * 3_750));
    }

    #[test]
    fn min_rtt_tracks_smallest_sample() {
        let mut e = est();
        e.on_sample(ms(30));
        e.on_sample(ms(10));
        e.on_sample(ms(50));
        assert_eq!(e.min_rtt(), Some(ms(10)));
    }
}
