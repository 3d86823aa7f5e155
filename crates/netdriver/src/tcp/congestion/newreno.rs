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
                .saturating_add(slow_start_increase(newly_acked, self.mss));
            // Do not overshoot ssthresh by more than this ACK allows: the excess is counted
            // toward congestion avoidance instead of slow start.
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
