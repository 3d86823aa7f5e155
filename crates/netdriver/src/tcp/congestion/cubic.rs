//! CUBIC congestion control (RFC 9438).
//!
//! After a loss the window follows `W_cubic(t) = C*(t - K)^3 + W_max` (§4.2): concave up to
//! the window where the loss happened, flat around it, then convex probing beyond. Growth per
//! RTT is capped at 1.5x (§4.2 target clamp). At small RTTs or windows a Reno-friendly
//! estimate `W_est` (§4.3) takes over so CUBIC is never slower than Reno. Fast convergence
//! (§4.7) lowers `W_max` when losses come before the old maximum is reached, releasing
//! bandwidth to newer flows. Congestion events and RTOs end the current epoch (§4.6, §4.8).
//! Slow start is shared with NewReno (RFC 5681 with RFC 3465 ABC, growth per ACK up to
//! one cwnd, see `slow_start_increase` in the parent module).
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
    /// The window just before the last reduction, in segments (`cwnd_prior`, §4.3).
    prior: f64,
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
            prior: 0.0,
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
        self.prior = segs;
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
    fn clone_box(&self) -> Box<dyn CongestionControl> {
        Box::new(self.clone())
    }

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
            let grown = self.cwnd + slow_start_increase(newly_acked, self.window()) as f64;
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

        // §4.3: Reno-friendly estimate, ALPHA per cwnd of acknowledged segments; once past
        // the pre-loss window, the estimate grows like Reno itself (alpha = 1).
        let alpha = if self.w_est >= self.prior { 1.0 } else { ALPHA };
        self.w_est += alpha * acked_segs / segs;
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

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: usize = 1000;

    /// A controller that grew to `segs` segments in slow start, then saw a loss, and left
    /// recovery at `now`.
    fn after_loss(segs: usize, now: Instant) -> Cubic {
        let mut cc = Cubic::new(MSS);
        while cc.window() < segs * MSS {
            cc.on_ack(now, MSS, None, 0);
        }
        assert_eq!(cc.window(), segs * MSS);
        cc.on_congestion_event(now, segs * MSS);
        cc.on_recovery_exit(now);
        cc
    }

    /// One RTT of ACKs, one MSS each, all at `now`. Returns the window after.
    fn round(cc: &mut Cubic, now: Instant, rtt: Duration) -> usize {
        let acks = cc.window() / MSS;
        for _ in 0..acks {
            cc.on_ack(now, MSS, Some(rtt), cc.window());
        }
        cc.window()
    }

    #[test]
    fn loss_sets_window_to_beta_times_w_max() {
        let cc = after_loss(100, Instant::ZERO);
        assert_eq!(cc.w_max(), 100.0);
        assert_eq!(cc.window(), 70_000);
        assert_eq!(cc.ssthresh(), 70_000);
    }

    #[test]
    fn concave_then_plateau_at_k_then_convex() {
        let rtt = Duration::from_millis(200);
        let mut now = Instant::from_millis(1000);
        let mut cc = after_loss(100, now);
        let start = now;
        let mut samples = Vec::new(); // (t, cwnd in segments)
        for _ in 0..60 {
            let w = round(&mut cc, now, rtt);
            samples.push((
                now.saturating_duration_since(start).as_secs_f64(),
                w as f64 / MSS as f64,
            ));
            now += rtt;
        }
        // K = cbrt((100 - 70) / 0.4) ≈ 4.217 s.
        let k = cc.k();
        assert!((k - 75f64.cbrt()).abs() < 1e-9, "K = {k}");
        // The window near t = K is back at W_max.
        let (_, at_k) = samples
            .iter()
            .copied()
            .min_by(|a, b| (a.0 - k).abs().total_cmp(&(b.0 - k).abs()))
            .unwrap();
        assert!((at_k - 100.0).abs() < 3.0, "window at K: {at_k}");
        // Growth per round shrinks approaching K (concave) and rises after it (convex).
        let growth = |i: usize| samples[i + 1].1 - samples[i].1;
        let early = growth(1);
        let near_k = growth(20);
        let late = growth(40);
        assert!(early > 2.0 * near_k, "early {early}, near K {near_k}");
        assert!(late > 2.0 * near_k, "late {late}, near K {near_k}");
        assert!(samples.windows(2).all(|w| w[1].1 >= w[0].1));
        // Never more than 1.5x per RTT.
        assert!(samples.windows(2).all(|w| w[1].1 <= 1.5 * w[0].1 + 1e-9));
    }

    #[test]
    fn growth_clamped_to_one_and_a_half_per_rtt() {
        // Far past K the cubic curve is steep; the target clamp limits the round's growth.
        let mut cc = after_loss(10, Instant::ZERO);
        let w0 = cc.window();
        let w1 = round(
            &mut cc,
            Instant::from_millis(60_000),
            Duration::from_millis(100),
        );
        assert!(w1 > w0);
        assert!(w1 as f64 <= 1.5 * w0 as f64 + 1.0, "{w0} -> {w1}");
    }

    #[test]
    fn fast_convergence_lowers_w_max() {
        let mut cc = after_loss(100, Instant::ZERO);
        // A second loss before the window regained W_max.
        cc.on_congestion_event(Instant::from_millis(10), 70_000);
        assert!(
            (cc.w_max() - 70.0 * 1.7 / 2.0).abs() < 1e-9,
            "{}",
            cc.w_max()
        );
        assert_eq!(cc.window(), 49_000);
        // A loss above W_max records the new maximum as is.
        let mut cc = after_loss(100, Instant::ZERO);
        for i in 0..200 {
            round(
                &mut cc,
                Instant::from_millis(i * 100),
                Duration::from_millis(100),
            );
        }
        let segs = cc.window() as f64 / MSS as f64;
        assert!(segs > 100.0);
        cc.on_congestion_event(Instant::from_millis(20_000), cc.window());
        // `window()` rounds down to whole bytes.
        assert!((cc.w_max() - segs).abs() < 1e-3);
    }

    #[test]
    fn reno_friendly_region_dominates_at_small_rtt() {
        let rtt = Duration::from_millis(1);
        let mut now = Instant::ZERO;
        let mut cc = after_loss(100, now);
        let rounds = 100;
        for _ in 0..rounds {
            round(&mut cc, now, rtt);
            now += rtt;
        }
        // 100 ms after the loss the cubic curve has barely moved from 70 segments.
        let segs = cc.window() as f64 / MSS as f64;
        let cubic_only = C * (0.1 - cc.k()).powi(3) + 100.0;
        // Reno-friendly: ALPHA per RTT up to the 100-segment prior window, then 1 per RTT.
        let reno = 100.0 + (rounds as f64 - 30.0 / ALPHA);
        assert!(cubic_only < reno - 2.0, "cubic {cubic_only}, Reno {reno}");
        assert!(
            (segs - reno).abs() < 3.0,
            "window {segs}, Reno estimate {reno}"
        );
    }

    #[test]
    fn reno_friendly_alpha_becomes_one_past_the_prior_window() {
        let rtt = Duration::from_millis(1);
        let mut now = Instant::ZERO;
        let mut cc = after_loss(20, now);
        for _ in 0..100 {
            round(&mut cc, now, rtt);
            now += rtt;
        }
        // ALPHA per RTT from 14 to 20 segments, then one per RTT.
        let to_prior = 6.0 / ALPHA;
        let want = 20.0 + (100.0 - to_prior);
        let segs = cc.window() as f64 / MSS as f64;
        assert!((segs - want).abs() < 3.0, "window {segs}, want {want}");
    }

    #[test]
    fn rto_drops_to_one_mss_and_restarts_slow_start() {
        let mut cc = after_loss(100, Instant::ZERO);
        round(
            &mut cc,
            Instant::from_millis(100),
            Duration::from_millis(100),
        );
        cc.on_retransmission_timeout(Instant::from_millis(500), 40_000);
        assert_eq!(cc.window(), MSS);
        assert_eq!(cc.ssthresh(), 28_000);
        assert_eq!(cc.k(), 0.0);
        cc.on_ack(Instant::from_millis(600), MSS, None, MSS);
        assert_eq!(cc.window(), 2 * MSS);
        // Tiny flight: ssthresh floors at 2 MSS.
        cc.on_retransmission_timeout(Instant::from_millis(700), 0);
        assert_eq!(cc.ssthresh(), 2 * MSS);
        assert_eq!(cc.window(), MSS);
    }

    #[test]
    fn epoch_uses_caller_time_only() {
        // Two controllers fed identical inputs agree exactly: nothing reads a clock.
        let run = || {
            let mut cc = after_loss(50, Instant::from_millis(5));
            for i in 0..50 {
                round(
                    &mut cc,
                    Instant::from_millis(5 + i * 30),
                    Duration::from_millis(30),
                );
            }
            cc.window()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn zero_rtt_and_time_going_backwards_stay_finite() {
        let mut cc = after_loss(20, Instant::from_millis(1000));
        for i in 0..100 {
            cc.on_ack(Instant::from_millis(1000 - i), MSS, Some(Duration::ZERO), 0);
        }
        let w = cc.window();
        assert!(w >= 14_000 && cc.cwnd.is_finite());
        // First CA ACK after slow start with no loss yet: no W_max, so K = 0.
        let mut cc = Cubic::new(MSS);
        cc.on_retransmission_timeout(Instant::ZERO, 0);
        for _ in 0..10 {
            cc.on_ack(Instant::ZERO, MSS, None, 0);
        }
        assert!(cc.k().is_finite() && cc.cwnd.is_finite());
    }
}
