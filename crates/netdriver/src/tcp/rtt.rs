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

    /// The RTT variation (zero before the first sample).
    pub fn rttvar(&self) -> Duration {
        from_micros(self.rttvar)
    }

    /// The smallest RTT sampled so far, or `None` before the first sample.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }
}
