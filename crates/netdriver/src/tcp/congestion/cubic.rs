//! CUBIC congestion control (RFC 9438).
//!
//! After a loss the window follows `W_cubic(t) = C*(t - K)^3 + W_max` (§4.2): concave up to
//! the window where the loss happened, flat around it, then convex probing beyond. Growth per
//! RTT is capped at 1.5x (§4.2 target clamp). At small RTTs or windows a Reno-friendly
//! estimate `W_est` (§4.3) takes over so CUBIC is never slower than Reno. Fast convergence
//! (§4.7) lowers `W_max` when losses come before the old maximum is reached, releasing
//! bandwidth to newer flows. Congestion events and RTOs end the current epoch (§4.6, §4.8).
//! Slow start is shared with NewReno (RFC 5681 with RFC 3465 ABC, L = 2).
//!
//! Windows are tracked in segments as `f64` for the curve, and in bytes for the connection.
//! The epoch clock is the caller's `now`; nothing here reads a clock.

use super::{initial_window, slow_start_increase, CongestionControl};
use crate::time::{Duration, Instant};

/// C, in segments per second cubed (§5.1).
const C: f64 = 0.4;
/// Multiplicative decrease factor (§4.6).
const BETA: f64 = 0.7;
/// Reno-friendly additive increase per RTT, `3*(1-beta)/(1+beta)` (§4.3).
const ALPHA: f64 = 3.0 * (1.0 - BETA) / (1.0 + BETA);
/// Upper bound on the window in bytes: keeps f64 -> usize conversions and products far
/// from overflow whatever the inputs (1 TiB is beyond any real window).
const MAX_CWND: f64 = (1u64 << 40) as f64;

/// The CUBIC congestion controller.
#[derive(Debug, Clone)]
pub struct Cubic {
    mss: usize,
    /// cwnd in bytes, fractional so that per-ACK increments smaller than a byte add up.
    cwnd: f64,
    ssthresh: usize,
    /// Window before the last reduction, in segments (0 before any loss).
    w_max: f64,
    /// Start of the current congestion-avoidance epoch.
    epoch_start: Option<Instant>,
    /// K in seconds for the current epoch.
    k: f64,
    /// The plateau of the current epoch's curve, in segments.
    origin: f64,
    /// The Reno-friendly window estimate, in segments.
    w_est: f64,
    /// Latest RTT sample, used to look one RTT ahead for the target.
    last_rtt: Duration,
    touched: bool,
}

impl Cubic {
    /// A controller in slow start with the RFC 6928 initial window for `mss`.
    pub fn new(mss: usize) -> Self {
        let mss = mss.max(1);
        Cubic {
            mss,
            cwnd: initial_window(mss) as f64,
            ssthresh: usize::MAX,
            w_max: 0.0,
            epoch_start: None,
            k: 0.0,
            origin: 0.0,
            w_est: 0.0,
            last_rtt: Duration::ZERO,
            touched: false,
        }
    }

    /// `W_max` in segments: the window at the last reduction, after fast convergence.
    pub fn w_max(&self) -> f64 {
        self.w_max
    }

    /// K in seconds for the current epoch (0 when no epoch is running).
    pub fn k(&self) -> f64 {
        self.k
    }

    fn mss_f(&self) -> f64 {
        self.mss as f64
    }

    fn cwnd_segments(&self) -> f64 {
        self.cwnd / self.mss_f()
    }

    fn set_cwnd(&mut self, bytes: f64) {
        // `max` then `min` also turns a NaN into a finite value.
        self.cwnd = bytes.max(self.mss_f()).min(MAX_CWND);
    }

    fn w_cubic(&self, t: f64) -> f64 {
        let d = t - self.k;
        C * d * d * d + self.origin
    }

    /// §4.6 and §4.7: remember where the loss happened and pick the new ssthresh.
    fn reduce(&mut self) -> f64 {
        let segs = self.cwnd_segments();
        // Fast convergence: a loss below the previous maximum means the share shrank.
        self.w_max = if segs < self.w_max {
            segs * (1.0 + BETA) / 2.0
        } else {
            segs
        };
        self.epoch_start = None;
        self.k = 0.0;
        (self.cwnd * BETA).max(2.0 * self.mss_f())
    }

    fn start_epoch(&mut self, now: Instant) {
        self.epoch_start = Some(now);
        let segs = self.cwnd_segments();
        // Entering avoidance above W_max (after slow start, or W_max unknown): no plateau
        // to approach, so the curve starts convex from here.
        self.origin = self.w_max.max(segs);
        self.k = ((self.origin - segs) / C).cbrt();
        self.w_est = segs;
    }
}

impl CongestionControl for Cubic {
    fn name(&self) -> &'static str {
        "cubic"
    }

    fn window(&self) -> usize {
        self.cwnd as usize
    }

    fn ssthresh(&self) -> usize {
        self.ssthresh
    }

    fn set_mss(&mut self, mss: usize) {
        self.mss = mss.max(1);
        if !self.touched {
            self.cwnd = initial_window(self.mss) as f64;
        }
        self.set_cwnd(self.cwnd);
    }

    fn on_ack(
        &mut self,
        now: Instant,
        newly_acked: usize,
        rtt: Option<Duration>,
        _bytes_in_flight: usize,
    ) {
        if let Some(rtt) = rtt {
            self.last_rtt = rtt;
        }
        if newly_acked == 0 {
            return;
        }
        self.touched = true;
        if self.window() < self.ssthresh {
            let grown = self.cwnd + slow_start_increase(newly_acked, self.mss) as f64;
            self.set_cwnd(grown.min(self.ssthresh as f64));
            return;
        }
        let epoch_start = match self.epoch_start {
            Some(t) => t,
            None => {
                self.start_epoch(now);
                now
            }
        };
        let segs = self.cwnd_segments();
        let acked_segs = (newly_acked as f64 / self.mss_f()).min(MAX_CWND);
        let t = now.saturating_duration_since(epoch_start).as_secs_f64();
        let rtt = self.last_rtt.as_secs_f64();

        // §4.3: Reno-friendly estimate, one ALPHA per cwnd of acknowledged segments.
        self.w_est += ALPHA * acked_segs / segs;
        self.w_est = self.w_est.min(MAX_CWND);

        if self.w_cubic(t) < self.w_est {
            self.set_cwnd(self.w_est * self.mss_f());
            return;
        }
        // §4.2: aim for where the curve will be one RTT from now, growing at most 1.5x.
        let target = self.w_cubic(t + rtt).clamp(segs, 1.5 * segs);
        let grown = segs + (target - segs) / segs * acked_segs;
        self.set_cwnd(grown * self.mss_f());
    }

    fn on_congestion_event(&mut self, _now: Instant, _bytes_in_flight: usize) {
        self.touched = true;
        // The reduction is from cwnd (as Linux does), not from the flight size: a flow that
        // is briefly application-limited at the loss would otherwise collapse its window.
        let ssthresh = self.reduce();
        self.ssthresh = ssthresh as usize;
        self.set_cwnd(ssthresh);
    }

    fn on_recovery_exit(&mut self, _now: Instant) {
        self.touched = true;
        self.set_cwnd(self.ssthresh as f64);
        // The epoch starts at the first ACK in congestion avoidance.
        self.epoch_start = None;
    }

    fn on_retransmission_timeout(&mut self, _now: Instant, bytes_in_flight: usize) {
        self.touched = true;
        // §4.8: reduce as on a loss, but ssthresh from the flight size since cwnd may
        // already have been cut by recovery; then the Reno loss window.
        self.reduce();
        let ssthresh = (bytes_in_flight as f64 * BETA).max(2.0 * self.mss_f());
        self.ssthresh = ssthresh.min(MAX_CWND) as usize;
        self.set_cwnd(self.mss_f());
    }

    fn on_idle_restart(&mut self, _now: Instant) {
        let iw = initial_window(self.mss) as f64;
        self.set_cwnd(self.cwnd.min(iw));
        // A curve measured from before the idle period would jump on the first ACK.
        self.epoch_start = None;
    }
}
