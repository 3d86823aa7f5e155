//! NewReno: RFC 5681 slow start and congestion avoidance with RFC 6582 fast recovery.
//!
//! Congestion avoidance counts bytes (RFC 5681 §3.1, the RFC 3465 variant): cwnd grows by
//! one MSS each time a full cwnd of bytes has been acknowledged, so stretch and delayed ACKs
//! do not slow growth.

use super::{half_flight, initial_window, slow_start_increase, CongestionControl};
use crate::time::{Duration, Instant};

/// The NewReno congestion controller.
#[derive(Debug, Clone)]
pub struct NewReno {
    mss: usize,
    cwnd: usize,
    ssthresh: usize,
    /// Bytes acknowledged in congestion avoidance since cwnd last grew.
    bytes_acked: usize,
    /// Set once any event changed the window, after which an MSS change keeps it.
    touched: bool,
}

impl NewReno {
    /// A controller in slow start with the RFC 6928 initial window for `mss`.
    pub fn new(mss: usize) -> Self {
        let mss = mss.max(1);
        NewReno {
            mss,
            cwnd: initial_window(mss),
            ssthresh: usize::MAX,
            bytes_acked: 0,
            touched: false,
        }
    }
}

impl CongestionControl for NewReno {
    fn clone_box(&self) -> Box<dyn CongestionControl> {
        Box::new(self.clone())
    }

    fn name(&self) -> &'static str {
        "newreno"
    }

    fn window(&self) -> usize {
        self.cwnd
    }

    fn ssthresh(&self) -> usize {
        self.ssthresh
    }

    fn set_mss(&mut self, mss: usize) {
        self.mss = mss.max(1);
        if !self.touched {
            self.cwnd = initial_window(self.mss);
        }
    }

    fn on_ack(
        &mut self,
        _now: Instant,
        newly_acked: usize,
        _rtt: Option<Duration>,
        _bytes_in_flight: usize,
    ) {
        if newly_acked == 0 {
            return;
        }
        self.touched = true;
        if self.cwnd < self.ssthresh {
            self.cwnd = self
                .cwnd
                .saturating_add(slow_start_increase(newly_acked, self.cwnd));
            // Slow start ends at ssthresh; growth past it is congestion avoidance's, at its
            // much slower rate.
            if self.cwnd > self.ssthresh {
                self.cwnd = self.ssthresh;
            }
            return;
        }
        self.bytes_acked = self.bytes_acked.saturating_add(newly_acked);
        if self.bytes_acked >= self.cwnd {
            self.bytes_acked -= self.cwnd;
            self.cwnd = self.cwnd.saturating_add(self.mss);
            // A huge stretch ACK must not bank growth for many future rounds.
            self.bytes_acked = self.bytes_acked.min(self.cwnd);
        }
    }

    fn on_congestion_event(&mut self, _now: Instant, bytes_in_flight: usize) {
        self.touched = true;
        self.ssthresh = half_flight(bytes_in_flight, self.mss);
        self.cwnd = self.ssthresh;
        self.bytes_acked = 0;
    }

    fn on_recovery_exit(&mut self, _now: Instant) {
        self.touched = true;
        self.cwnd = self.ssthresh;
        self.bytes_acked = 0;
    }

    fn on_retransmission_timeout(&mut self, _now: Instant, bytes_in_flight: usize) {
        self.touched = true;
        self.ssthresh = half_flight(bytes_in_flight, self.mss);
        self.cwnd = self.mss;
        self.bytes_acked = 0;
    }

    fn on_idle_restart(&mut self, _now: Instant) {
        self.cwnd = self.cwnd.min(initial_window(self.mss));
        self.bytes_acked = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: usize = 1000;
    const T: Instant = Instant::ZERO;

    #[test]
    fn slow_start_grows_by_acked_bytes() {
        let mut cc = NewReno::new(MSS);
        assert_eq!(cc.window(), 10 * MSS);
        cc.on_ack(T, 1000, None, 10_000);
        assert_eq!(cc.window(), 11_000);
        cc.on_ack(T, 500, None, 10_000);
        assert_eq!(cc.window(), 11_500);
        // A stretch ACK for 5 MSS earns all 5 (RFC 3465 §2.1 byte counting), with no
        // L = 2 cap (which would give 13 500): GRO receivers send stretch ACKs, see
        // `slow_start_increase`.
        cc.on_ack(T, 5000, None, 10_000);
        assert_eq!(cc.window(), 16_500);
        cc.on_ack(T, 0, None, 10_000);
        assert_eq!(cc.window(), 16_500);
    }

    #[test]
    fn congestion_avoidance_adds_one_mss_per_window() {
        let mut cc = NewReno::new(MSS);
        cc.on_congestion_event(T, 20_000);
        assert_eq!(cc.ssthresh(), 10_000);
        assert_eq!(cc.window(), 10_000);
        cc.on_recovery_exit(T);
        assert_eq!(cc.window(), 10_000);
        for _ in 0..9 {
            cc.on_ack(T, MSS, None, 10_000);
        }
        assert_eq!(cc.window(), 10_000);
        cc.on_ack(T, MSS, None, 10_000);
        assert_eq!(cc.window(), 11_000);
        // The next increase needs a full 11 000 bytes.
        for _ in 0..10 {
            cc.on_ack(T, MSS, None, 11_000);
        }
        assert_eq!(cc.window(), 11_000);
        cc.on_ack(T, MSS, None, 11_000);
        assert_eq!(cc.window(), 12_000);
        // A huge stretch ACK grows by one MSS, not by the whole count.
        cc.on_ack(T, 1_000_000, None, 12_000);
        assert_eq!(cc.window(), 13_000);
    }

    #[test]
    fn slow_start_stops_at_ssthresh() {
        let mut cc = NewReno::new(MSS);
        cc.on_retransmission_timeout(T, 7000);
        assert_eq!(cc.ssthresh(), 3500);
        assert_eq!(cc.window(), MSS);
        // Growth per ACK is bounded by cwnd (not by L = 2 MSS, which would give 3000
        // here): 1000 -> 2000, then 2000 more would pass ssthresh and stops at it.
        cc.on_ack(T, 2000, None, 1000);
        assert_eq!(cc.window(), 2000);
        cc.on_ack(T, 2000, None, 1000);
        assert_eq!(cc.window(), 3500);
        cc.on_ack(T, 2000, None, 1000);
        assert_eq!(cc.window(), 3500);
    }

    #[test]
    fn loss_reduction_floors_at_two_mss() {
        let mut cc = NewReno::new(MSS);
        cc.on_congestion_event(T, 3000);
        assert_eq!(cc.ssthresh(), 2000);
        assert_eq!(cc.window(), 2000);
        cc.on_retransmission_timeout(T, 0);
        assert_eq!(cc.ssthresh(), 2000);
        assert_eq!(cc.window(), 1000);
    }

    #[test]
    fn set_mss_rederives_window_only_before_use() {
        let mut cc = NewReno::new(536);
        assert_eq!(cc.window(), 5360);
        cc.set_mss(1460);
        assert_eq!(cc.window(), 14_600);
        cc.on_ack(T, 1460, None, 0);
        cc.set_mss(1000);
        assert_eq!(cc.window(), 16_060);
    }

    #[test]
    fn idle_restart_caps_at_initial_window() {
        let mut cc = NewReno::new(MSS);
        for _ in 0..20 {
            cc.on_ack(T, MSS, None, 0);
        }
        assert_eq!(cc.window(), 30_000);
        cc.on_idle_restart(T);
        assert_eq!(cc.window(), 10_000);
        cc.on_retransmission_timeout(T, 10_000);
        cc.on_idle_restart(T);
        assert_eq!(cc.window(), MSS);
    }
}
