//! Congestion control: the window a sender may have in flight.
//!
//! The connection calls into a [`CongestionControl`] at the events RFC 5681 names: new
//! cumulative ACKs outside loss recovery (§3.1 slow start with RFC 3465 appropriate byte
//! counting, every acknowledged byte counted up to one cwnd per ACK so that stretch ACKs
//! from GRO receivers do not slow it, then congestion avoidance), entering fast recovery (§3.2, RFC 6582),
//! leaving it on a full ACK (RFC 6582 §3.2 step 3), a retransmission timeout (§3.1 eq. 4 and
//! the loss window) and restarting after idle (§4.1). Loss detection and recovery bookkeeping
//! stay in the connection; the algorithm only decides windows.
//!
//! The initial window is RFC 6928's `min(10*MSS, max(2*MSS, 14600))`.
//!
//! Two algorithms: [`NewReno`] (RFC 5681 + RFC 6582) and [`Cubic`] (RFC 9438, the default).

use crate::time::{Duration, Instant};

pub mod cubic;
pub mod newreno;

pub use cubic::Cubic;
pub use newreno::NewReno;

/// A congestion controller. All sizes are in bytes. Implementations never read a clock:
/// time comes only from the `now` arguments.
pub trait CongestionControl: Send + core::fmt::Debug {
    /// A short name for logs and statistics.
    fn name(&self) -> &'static str;

    /// The congestion window (cwnd) in bytes.
    fn window(&self) -> usize;

    /// The slow-start threshold in bytes (`usize::MAX` until the first loss).
    fn ssthresh(&self) -> usize;

    /// Sets the sender MSS after negotiation; if nothing has changed the window yet, the
    /// initial window is re-derived from it.
    fn set_mss(&mut self, mss: usize);

    /// New cumulative ACK of `newly_acked` bytes outside loss recovery: grows the window by
    /// slow start or congestion avoidance. `rtt` is the sample this ACK produced, if any.
    fn on_ack(
        &mut self,
        now: Instant,
        newly_acked: usize,
        rtt: Option<Duration>,
        bytes_in_flight: usize,
    );

    /// Loss detected by duplicate ACKs or SACK: entering fast recovery. Reduces ssthresh
    /// and sets cwnd to it.
    fn on_congestion_event(&mut self, now: Instant, bytes_in_flight: usize);

    /// Leaving fast recovery on a full ACK (RFC 6582 §3.2 step 3).
    fn on_recovery_exit(&mut self, now: Instant);

    /// A retransmission timeout fired: ssthresh is reduced and cwnd drops to the loss window
    /// of one MSS (RFC 5681 §3.1).
    fn on_retransmission_timeout(&mut self, now: Instant, bytes_in_flight: usize);

    /// A copy of the controller's whole state, saved when a loss recovery starts so that
    /// the reduction can be undone if the recovery proves spurious (RFC 3522 / RFC 2883
    /// §4 undo).
    fn clone_box(&self) -> Box<dyn CongestionControl>;

    /// The sender was idle for longer than an RTO (RFC 5681 §4.1). The default does nothing.
    fn on_idle_restart(&mut self, now: Instant) {
        let _ = now;
    }
}

/// Which congestion-control algorithm a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CongestionAlgorithm {
    /// RFC 5681 AIMD with RFC 6582 recovery.
    NewReno,
    /// RFC 9438 CUBIC.
    #[default]
    Cubic,
}

impl CongestionAlgorithm {
    /// A fresh controller of this kind for a sender MSS of `mss` bytes.
    pub fn build(self, mss: usize) -> Box<dyn CongestionControl> {
        match self {
            CongestionAlgorithm::NewReno => Box::new(NewReno::new(mss)),
            CongestionAlgorithm::Cubic => Box::new(Cubic::new(mss)),
        }
    }
}

/// RFC 6928 initial window: `min(10*MSS, max(2*MSS, 14600))`.
pub fn initial_window(mss: usize) -> usize {
    let mss = mss.max(1);
    mss.saturating_mul(10).min(mss.saturating_mul(2).max(14600))
}

/// Slow-start growth for one ACK: the bytes it newly acknowledged (RFC 3465 §2.1
/// appropriate byte counting), bounded by the current window (`L = cwnd / SMSS` in
/// RFC 3465 §2.3's terms).
///
/// Why not RFC 3465's experimental `L = 2`: a GRO/LRO receiver acknowledges a 64 KB
/// super-segment (44 full segments at MTU 1500) with one stretch ACK, and with `L = 2`
/// slow start then grows by 2 MSS per 44 segments instead of doubling per round trip;
/// a 100 Gbit/s path would need hundreds of round trips to open its window. Linux
/// (`tcp_slow_start`, since 2015's "tcp: properly handle stretch acks in slow start") counts every newly acknowledged segment for the same
/// reason, and so does this.
///
/// Why still a bound: the burst an ACK releases is what it freed plus what it added. With
/// the growth capped at cwnd, one ACK can at most double the window, which is what slow
/// start does in one round trip anyway. The case it matters for is an ACK that covers far
/// more than the current window, e.g. after an RTO cut cwnd to one segment the originals
/// turn out to have arrived and one ACK covers the whole old flight: uncapped, cwnd would
/// jump to ssthresh and release it as one line-rate burst. ssthresh still ends slow start
/// as before (RFC 5681 §3.1), and RFC 7661 cwnd validation (in the connection) keeps an
/// application-limited sender from growing at all.
pub(crate) fn slow_start_increase(newly_acked: usize, cwnd: usize) -> usize {
    newly_acked.min(cwnd)
}

/// The RFC 5681 loss reduction `max(FlightSize/2, 2*MSS)`.
pub(crate) fn half_flight(bytes_in_flight: usize, mss: usize) -> usize {
    (bytes_in_flight / 2).max(mss.saturating_mul(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_window_per_rfc6928() {
        assert_eq!(initial_window(1460), 14600);
        assert_eq!(initial_window(1000), 10000);
        assert_eq!(initial_window(536), 5360);
        assert_eq!(initial_window(4000), 14600);
        assert_eq!(initial_window(9000), 18000);
        assert_eq!(initial_window(0), 10);
        assert_eq!(initial_window(usize::MAX), usize::MAX);
    }

    #[test]
    fn build_picks_the_algorithm() {
        assert_eq!(CongestionAlgorithm::default(), CongestionAlgorithm::Cubic);
        let c = CongestionAlgorithm::Cubic.build(1460);
        assert_eq!(c.name(), "cubic");
        assert_eq!(c.window(), 14600);
        let r = CongestionAlgorithm::NewReno.build(1000);
        assert_eq!(r.name(), "newreno");
        assert_eq!(r.window(), 10000);
        assert_eq!(r.ssthresh(), usize::MAX);
    }

    /// Slow start by bytes acknowledged (RFC 3465 §2.1) keeps up with stretch ACKs: one ACK
    /// covering 8 segments grows every controller's window by 8 MSS, not by L = 2.
    #[test]
    fn stretch_ack_in_slow_start_counts_every_segment() {
        for alg in [CongestionAlgorithm::NewReno, CongestionAlgorithm::Cubic] {
            let mut cc = alg.build(1000);
            assert_eq!(cc.window(), 10_000);
            cc.on_ack(Instant::ZERO, 8 * 1000, None, 10_000);
            assert_eq!(cc.window(), 18_000, "{alg:?}");
            // A GRO-sized stretch ACK (44 segments) at 18 segments: the growth is bounded by
            // the window itself, so one ACK at most doubles it.
            cc.on_ack(Instant::ZERO, 44 * 1000, None, 18_000);
            assert_eq!(cc.window(), 36_000, "{alg:?}");
        }
    }

    /// The bound matters after an RTO: cwnd is one segment and a cumulative ACK covering
    /// the whole old flight (the originals had arrived) must not jump to ssthresh.
    #[test]
    fn slow_start_growth_per_ack_is_bounded_by_cwnd() {
        for alg in [CongestionAlgorithm::NewReno, CongestionAlgorithm::Cubic] {
            let mut cc = alg.build(1000);
            cc.on_retransmission_timeout(Instant::ZERO, 100_000);
            assert_eq!(cc.window(), 1000, "{alg:?}");
            assert!(cc.ssthresh() >= 50_000, "{alg:?}");
            cc.on_ack(Instant::from_millis(1), 100_000, None, 100_000);
            assert_eq!(cc.window(), 2000, "{alg:?}");
            // Slow start still ends at ssthresh (RFC 5681 §3.1).
            let ssthresh = cc.ssthresh();
            for i in 0..20 {
                cc.on_ack(Instant::from_millis(2 + i), 64_000, None, 64_000);
            }
            assert!(cc.window() >= ssthresh, "{alg:?}");
            assert!(cc.window() < ssthresh + 64_000, "{alg:?}");
        }
    }

    /// Congestion avoidance is untouched by the slow-start change: a stretch ACK there
    /// earns at most one MSS per window with NewReno, and CUBIC's growth stays within its
    /// 1.5x per-RTT clamp.
    #[test]
    fn stretch_ack_in_congestion_avoidance_is_unchanged() {
        let mut reno = CongestionAlgorithm::NewReno.build(1000);
        reno.on_congestion_event(Instant::ZERO, 20_000);
        reno.on_recovery_exit(Instant::ZERO);
        assert_eq!(reno.window(), 10_000);
        reno.on_ack(Instant::ZERO, 8 * 1000, None, 10_000);
        assert_eq!(reno.window(), 10_000);
        reno.on_ack(Instant::ZERO, 8 * 1000, None, 10_000);
        assert_eq!(reno.window(), 11_000);

        let mut cubic = CongestionAlgorithm::Cubic.build(1000);
        cubic.on_congestion_event(Instant::ZERO, 20_000);
        cubic.on_recovery_exit(Instant::ZERO);
        let w0 = cubic.window();
        assert_eq!(w0, 7000);
        cubic.on_ack(
            Instant::from_millis(1),
            8 * 1000,
            Some(Duration::from_millis(1)),
            7000,
        );
        let w1 = cubic.window();
        // CUBIC in avoidance grows by far less than the 8 MSS slow start would give.
        assert!(
            w1 >= w0 && w1 < w0 + 8000 && w1 as f64 <= 1.5 * w0 as f64,
            "{w0} -> {w1}"
        );
    }

    /// Every algorithm survives degenerate and hostile inputs with a sane window.
    #[test]
    fn no_panics_on_extreme_inputs() {
        for alg in [CongestionAlgorithm::NewReno, CongestionAlgorithm::Cubic] {
            for mss in [0, 1, 1460, usize::MAX] {
                let mut cc = alg.build(mss);
                let t = |us: u64| Instant::from_micros(us);
                let rtts = [
                    None,
                    Some(Duration::ZERO),
                    Some(Duration::MAX),
                    Some(Duration::from_micros(1)),
                ];
                for (i, rtt) in rtts.iter().enumerate() {
                    cc.on_ack(t(i as u64), usize::MAX, *rtt, usize::MAX);
                    cc.on_ack(t(0), 0, *rtt, 0);
                    cc.on_ack(t(u64::MAX), 1, *rtt, 0);
                }
                cc.on_congestion_event(t(5), 0);
                cc.on_ack(t(u64::MAX), usize::MAX, Some(Duration::MAX), usize::MAX);
                cc.on_ack(t(0), usize::MAX, Some(Duration::ZERO), 0);
                cc.on_recovery_exit(t(3));
                cc.on_congestion_event(t(6), usize::MAX);
                cc.on_retransmission_timeout(t(7), usize::MAX);
                cc.on_retransmission_timeout(t(7), 0);
                cc.on_idle_restart(t(8));
                for i in 0..100u64 {
                    cc.on_ack(t(i * 1_000_000_000), usize::MAX / 2, Some(Duration::MAX), 0);
                }
                cc.set_mss(0);
                cc.set_mss(mss);
                assert!(cc.window() >= 1, "{alg:?} mss {mss}");
                assert!(cc.ssthresh() >= 1, "{alg:?} mss {mss}");
            }
        }
    }
}
