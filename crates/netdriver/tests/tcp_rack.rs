//! RACK loss detection (RFC 8985 §6): time-based loss marking from per-segment transmit
//! times, the reordering window (min_RTT/4, 0 in recovery or with DupThresh SACKed segments
//! until reordering is seen, widened by D-SACK), the reorder timer, and the fallback to
//! duplicate ACKs without SACK.
//!
//! The harness handshake and the first ACK give RTT samples of 10 ms: min_RTT = SRTT =
//! 10 ms, so reo_wnd = 2.5 ms.

mod tcp_support_b;

use netdriver::tcp::Config;
use netdriver::time::Duration;
use tcp_support_b::*;

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// Established per `peer`, nodelay, 10 full segments (the initial window) sent at once,
/// and the first acknowledged 10 ms later: cwnd = 11000, FlightSize = 9000.
fn ten_in_flight(config: Config, peer: PeerOpts) -> (Tcb, Vec<u8>) {
    let mut t = Tcb::established(config, peer);
    t.conn.set_nodelay(true);
    let d = data(10_000);
    t.app_send(&d);
    t.expect_full_segments(&d, 0..10);
    t.expect_none();
    t.advance(ms(10));
    t.send(t.seg().ack(l(1000)));
    t.expect_none();
    assert_eq!(t.stats().cwnd, 11_000);
    (t, d)
}

#[test]
fn one_sacked_segment_marks_the_hole_lost_after_rtt_plus_reo_wnd() {
    // RFC 6675 needs three segments' evidence; RACK needs one segment sent after the hole
    // plus the reordering window.
    let (mut t, d) = ten_in_flight(test_config(), PeerOpts::default());
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(3000))]));
    t.expect_none();
    let acked = t.now;
    assert_eq!(
        t.deadline(),
        acked + us(2500),
        "reorder timer: RACK.rtt + reo_wnd"
    );
    // Just before expiry nothing happens.
    t.tick(us(2499));
    t.expect_none();
    assert_eq!(t.stats().fast_retransmits, 0);
    assert_eq!(t.fire(), acked + us(2500));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.fast_retransmits, 1);
    assert_eq!(s.retransmitted_segments, 1);
    assert_eq!(s.rto_timeouts, 0);
    assert_eq!(s.ssthresh, 4500);
    // The retransmission fills the hole; recovery ends at the full ACK.
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    t.expect_none();
    assert_eq!(t.stats().bytes_in_flight, 0);
    assert_eq!(t.conn.poll_timeout(), None);
}

#[test]
fn reordering_within_the_window_retransmits_nothing() {
    let (mut t, _) = ten_in_flight(test_config(), PeerOpts::default());
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(3000))]));
    t.expect_none();
    // The "missing" segment arrives 2 ms later: it was reordered, not lost.
    t.tick(ms(2));
    t.send(t.seg().ack(l(3000)));
    t.expect_none();
    t.tick(ms(1));
    t.expect_none();
    assert_eq!(t.stats().fast_retransmits, 0);
    assert_eq!(t.stats().retransmitted_segments, 0);
    // Reordering was seen (§6.2 step 2): three SACKed segments above a hole no longer
    // mean an immediate loss; reo_wnd stays min_RTT/4.
    t.send(t.seg().ack(l(3000)).sack(&[(l(4000), l(7000))]));
    t.expect_none();
    assert_eq!(t.stats().fast_retransmits, 0);
    assert_eq!(t.deadline(), t.now + us(2500));
}

#[test]
fn dupthresh_sacked_segments_without_reordering_mean_loss_at_once() {
    let (mut t, d) = ten_in_flight(test_config(), PeerOpts::default());
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(5000))]));
    // reo_wnd = 0 (§6.2 step 4): segment 1 is lost now.
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_none();
    assert_eq!(t.stats().fast_retransmits, 1);
}

#[test]
fn dsack_doubles_the_reordering_window() {
    let (mut t, _) = ten_in_flight(test_config(), PeerOpts::default());
    // A D-SACK (first block below the cumulative ACK, RFC 2883): reo_wnd_mult 2.
    t.send(t.seg().ack(l(1000)).sack(&[(l(0), l(1000))]));
    t.expect_none();
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(3000))]));
    t.expect_none();
    assert_eq!(t.deadline(), t.now + us(5000), "2 · min_RTT / 4");
}

#[test]
fn a_sack_of_the_last_segment_marks_all_below_lost_after_the_window() {
    // Segments sent after the most recently delivered one are never marked: the timer is
    // only for those sent before it.
    let (mut t, d) = ten_in_flight(test_config(), PeerOpts::default());
    t.send(t.seg().ack(l(1000)).sack(&[(l(9000), l(10_000))]));
    t.expect_none();
    // Segments 1-8 were sent before segment 9 (same instant, lower sequence): all wait
    // for the same timer, then are lost together. pipe is 0 then (RFC 6675 SetPipe with
    // RACK's marks), below ssthresh 4500: PRR's slow-start reduction bound lets one
    // segment out (nothing delivered yet, plus SMSS), not a burst of four.
    assert_eq!(t.deadline(), t.now + us(2500));
    t.fire();
    t.expect_full_segments(&d, 1..2);
    t.expect_none();
    assert_eq!(t.stats().fast_retransmits, 1);
    assert_eq!(t.stats().retransmitted_segments, 1);
    // Its ACK delivers one segment: sndcnt = DeliveredData + SMSS = two more.
    t.advance(ms(10));
    t.send(t.seg().ack(l(2000)).sack(&[(l(9000), l(10_000))]));
    t.expect_full_segments(&d, 2..4);
    t.expect_none();
    assert_eq!(
        t.stats().cwnd,
        2000,
        "pipe 0 (the rest is lost) + sndcnt 2000"
    );
}

#[test]
fn without_sack_the_duplicate_ack_threshold_remains() {
    let (mut t, d) = ten_in_flight(test_config(), PeerOpts::no_sack());
    for _ in 0..2 {
        t.send(t.seg().ack(l(1000)));
        t.expect_none();
    }
    assert_eq!(
        t.deadline(),
        t.now + ms(200),
        "no reorder timer without SACK"
    );
    t.send(t.seg().ack(l(1000)));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    assert_eq!(t.stats().fast_retransmits, 1);
}

#[test]
fn rack_off_keeps_rfc6675_islost() {
    let config = Config {
        rack: false,
        ..test_config()
    };
    let (mut t, d) = ten_in_flight(config, PeerOpts::default());
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(3000))]));
    t.expect_none();
    assert_eq!(t.deadline(), t.now + ms(200));
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(4000))]));
    t.expect_none();
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(5000))]));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
}

#[test]
fn a_lost_retransmission_is_detected_without_an_rto() {
    // RACK's time order catches a retransmission that is lost again: once data sent after
    // it is delivered and its RTT has passed, it is resent (RFC 8985 §6.2; RFC 6675 needs
    // the RTO for this).
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    let d = data(16_000);
    t.app_send(&d);
    t.expect_full_segments(&d, 0..10);
    t.advance(ms(10));
    t.send(t.seg().ack(l(1000)));
    t.expect_full_segments(&d, 10..12);
    t.expect_none();
    // Segment 1 lost; 2-4 SACKed: it is retransmitted at once (reo_wnd 0).
    t.advance(ms(10));
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(5000))]));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_none();
    // One more SACKed segment: PRR lets segment 12 out, sent after the retransmission.
    t.advance(ms(1));
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(6000))]));
    t.expect(t.out().seq(l(12_000)).payload(&d[12_000..13_000]));
    t.expect_none();
    // Everything but segment 1 arrives, segment 12 included, 10 ms after it was sent: the
    // retransmission (sent 1 ms before segment 12) is lost too.
    t.advance(ms(10));
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(13_000))]));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    // pipe 0 below ssthresh 5500: PRR-SSRB lets the rest of the queue follow.
    t.expect_full_segments(&d, 13..16);
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.retransmitted_segments, 2);
    assert_eq!(s.rto_timeouts, 0);
    assert_eq!(s.fast_retransmits, 1);
}
