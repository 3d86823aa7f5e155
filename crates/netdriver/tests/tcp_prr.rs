//! Proportional Rate Reduction (RFC 6937, PRR-SSRB) during SACK fast recovery: the
//! proportional phase while pipe > ssthresh, the slow-start reduction bound below it,
//! the exit at ssthresh, and the abrupt reduction it replaces (`Config::prr` off).

mod tcp_support_b;

use netdriver::tcp::Config;
use tcp_support_b::*;

/// Nodelay, 16 segments queued: ten sent, the first acknowledged 10 ms later (cwnd 11000)
/// which lets segments 10 and 11 out: FlightSize 11000 (segments 1-11).
fn eleven_in_flight(config: Config) -> (Tcb, Vec<u8>) {
    let mut t = Tcb::established(config, PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(16_000);
    t.app_send(&d);
    t.expect_full_segments(&d, 0..10);
    t.expect_none();
    t.advance(ms(10));
    t.send(t.seg().ack(l(1000)));
    t.expect_full_segments(&d, 10..12);
    t.expect_none();
    assert_eq!(t.stats().bytes_in_flight, 11_000);
    (t, d)
}

fn sack_up_to(t: &mut Tcb, end: usize) {
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(end))]));
}

#[test]
fn proportional_phase_sends_one_segment_per_two_delivered() {
    let (mut t, d) = eleven_in_flight(test_config());
    // Segment 1 lost; three SACKed segments: RACK marks it lost, recovery starts with
    // RecoverFS = 11000 and ssthresh = 5500, so PRR sends ssthresh/RecoverFS = 1/2 of
    // what is delivered. DeliveredData 3000: sndcnt = ceil(3000·5500/11000) = 1500.
    sack_up_to(&mut t, 5000);
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.ssthresh, 5500);
    assert_eq!(s.cwnd, 7000 + 1500, "pipe 7000 + sndcnt 1500");
    // prr_delivered 4000: ceil(4000·1/2) - prr_out 1000 = 1000: one new segment.
    sack_up_to(&mut t, 6000);
    t.expect(t.out().seq(l(12_000)).payload(&d[12_000..13_000]));
    t.expect_none();
    // prr_delivered 5000: 2500 - 2000 = 500, less than a segment.
    sack_up_to(&mut t, 7000);
    t.expect_none();
    // prr_delivered 6000: 3000 - 2000 = 1000.
    sack_up_to(&mut t, 8000);
    t.expect(t.out().seq(l(13_000)).payload(&d[13_000..14_000]));
    t.expect_none();
    assert_eq!(t.stats().fast_retransmits, 1);
    // Full ACK: recovery ends with cwnd = ssthresh (RFC 6937 §3, RFC 6675 §5).
    t.advance(ms(10));
    t.send(t.seg().ack(l(14_000)));
    let s = t.stats();
    assert_eq!(s.cwnd, 5500);
    assert_eq!(s.ssthresh, 5500);
}

#[test]
fn without_prr_the_window_drops_to_ssthresh_at_once() {
    let config = Config {
        prr: false,
        ..test_config()
    };
    let (mut t, d) = eleven_in_flight(config);
    sack_up_to(&mut t, 5000);
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_none();
    assert_eq!(t.stats().cwnd, 5500);
    // pipe 7000 and then 6000, 5000 stay above cwnd - SMSS: nothing is sent for three
    // ACKs that each report a delivered segment, then the sender resumes in a burst.
    for end in [6000, 7000, 8000] {
        sack_up_to(&mut t, end);
        t.expect_none();
    }
    sack_up_to(&mut t, 9000);
    t.expect(t.out().seq(l(12_000)).payload(&d[12_000..13_000]));
    t.expect_none();
}

#[test]
fn slow_start_reduction_bound_below_ssthresh() {
    // Heavy loss: segments 1-7 lost, 8-11 SACKed. pipe drops far below ssthresh; PRR-SSRB
    // lets out DeliveredData + SMSS per ACK instead of a burst up to ssthresh.
    let (mut t, d) = eleven_in_flight(test_config());
    t.advance(ms(10));
    t.send(t.seg().ack(l(1000)).sack(&[(l(8000), l(12_000))]));
    // pipe 0 <= ssthresh 5500: sndcnt = min(5500, 4000 + 1000) = 5000.
    t.expect_full_segments(&d, 1..6);
    t.expect_none();
    assert_eq!(t.stats().cwnd, 5000);
    // Segment 1's retransmission is acknowledged: DeliveredData 1000, prr_delivered 5000,
    // prr_out 5000: sndcnt = min(5500 - 4000, max(0, 1000) + 1000) = 1500: one segment.
    t.advance(ms(10));
    t.send(t.seg().ack(l(2000)).sack(&[(l(8000), l(12_000))]));
    t.expect_full_segments(&d, 6..7);
    t.expect_none();
}
