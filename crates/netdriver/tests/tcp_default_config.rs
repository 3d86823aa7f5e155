//! Exact segments for the configuration users get: `Config::default()` unchanged (CUBIC,
//! SACK, timestamps, window scaling, 256 KiB buffers, Nagle, delayed ACK with quick-ACK,
//! tail loss probe, limited transmit), against a peer offering SACK, timestamps and window
//! scaling, as Linux does. The other harness tests turn several of these off to isolate
//! one mechanism; this one runs them together through a handshake, a request, a reply
//! with a loss in the middle (SACK fast recovery), then a reply whose tail is lost
//! (repaired by the probe at 2·SRTT).
//!
//! TSvals we emit are not predicted (the harness checks they never go backwards); TSecr is
//! compared exactly.

mod tcp_support_b;

use netdriver::tcp::Config;
use netdriver::time::Duration;
use tcp_support_b::*;

/// Default receive buffer.
const RX: usize = 256 * 1024;
/// Our send MSS: the peer's 1000 less the 12-byte timestamp option (RFC 6691).
const SMSS: usize = 988;

fn peer() -> PeerOpts {
    PeerOpts {
        timestamps: true,
        wscale: Some(7),
        ..PeerOpts::default()
    }
}

#[test]
fn default_config_handshake_request_reply_loss_and_recovery() {
    let mut t = Tcb::established(Config::default(), peer());
    assert_eq!(t.conn.negotiated(), (true, true, true));
    // The shift expresses the auto-tuning maximum, 6 MiB: 7 (RFC 7323 §2.3; 256 KiB alone
    // would need 3); the peer's shift is 7.
    assert_eq!(t.conn.window_scales(), (7, 7));
    assert_eq!(t.conn.send_mss(), SMSS);
    let s = t.stats();
    assert_eq!(
        s.srtt,
        Some(ms(10)),
        "the SYN-ACK's TSecr gives the first sample"
    );
    assert_eq!(s.cwnd, 10 * SMSS, "RFC 6928 initial window");

    // A 100-byte request: quick-ACK acknowledges it at once, no 40 ms delayed ACK.
    let request = data(100);
    t.advance(ms(5));
    t.send(t.seg().payload(&request));
    let win = t.window_for(RX - 100);
    t.expect(t.out().ack(r(100)).win(win));
    t.expect_none();
    assert_eq!(t.app_recv(200), request);

    // The reply: exactly the initial window, ten full segments (Nagle lets full ones go).
    let reply = data(10 * SMSS);
    t.app_send(&reply);
    let seg = |i: usize| &reply[i * SMSS..(i + 1) * SMSS];
    for i in 0..10 {
        t.expect(
            t.out()
                .seq(l(i * SMSS))
                .ack(r(100))
                .win(win)
                .payload(seg(i)),
        );
    }
    t.expect_none();
    let sent = t.now;
    // Ten segments out: the PTO is 2·SRTT away, before the 200 ms RTO.
    assert_eq!(t.deadline(), sent + ms(20));

    // Segment 1 is lost. The peer acknowledges segment 0 (slow start: cwnd + 1 SMSS)...
    t.advance(ms(10));
    t.send(t.seg().seq(r(100)).ack(l(SMSS)));
    t.expect_none();
    assert_eq!(t.stats().cwnd, 11 * SMSS);
    // ...then SACKs 2, 3 and 4 in three duplicate ACKs. No data is left unsent, so limited
    // transmit has nothing to send; the PTO is cancelled by the first SACK block.
    for k in 1..=2 {
        t.advance(ms(1));
        t.send(
            t.seg()
                .seq(r(100))
                .ack(l(SMSS))
                .sack(&[(l(2 * SMSS), l((2 + k) * SMSS))]),
        );
        t.expect_none();
        // RACK (RFC 8985 §6.2): segment 1 was sent with the SACKed ones, RACK.rtt is
        // 10 + k ms, so it is lost once reo_wnd = min_RTT/4 = 2.5 ms more have passed.
        assert_eq!(
            t.deadline(),
            t.now + Duration::from_micros(2500),
            "RACK reorder timer"
        );
    }
    // The third: three segments SACKed and no reordering seen, so reo_wnd = 0 (RFC 8985
    // §6.2 step 4) and RACK marks segment 1 lost at once: fast recovery;
    // CUBIC reduces cwnd to 0.7 × 10868.
    t.advance(ms(1));
    t.send(
        t.seg()
            .seq(r(100))
            .ack(l(SMSS))
            .sack(&[(l(2 * SMSS), l(5 * SMSS))]),
    );
    t.expect(t.out().seq(l(SMSS)).ack(r(100)).win(win).payload(seg(1)));
    // PRR (RFC 6937): pipe = 5 segments above the SACKed range = 4940 <= ssthresh 7607,
    // so the slow-start reduction bound applies: sndcnt = min(7607 - 4940,
    // DeliveredData (one SMSS) + SMSS) = 1976 and cwnd = pipe + sndcnt = 6916. The
    // retransmission uses one SMSS of it; there is no other hole and no new data.
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.fast_retransmits, 1);
    assert_eq!(s.ssthresh, 7607);
    assert_eq!(s.cwnd, 6916);
    assert_eq!(s.tail_loss_probes, 0);
    // Everything arrives: recovery ends with cwnd = ssthresh.
    t.advance(ms(10));
    t.send(t.seg().seq(r(100)).ack(l(10 * SMSS)));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.bytes_in_flight, 0);
    assert_eq!(s.cwnd, 7607);
    assert_eq!(s.rto_timeouts, 0);
    assert_eq!(s.retransmitted_segments, 1);
    assert_eq!(t.conn.poll_timeout(), None);

    // A second reply of five segments whose last two are lost.
    let base = 10 * SMSS;
    let reply2 = data(5 * SMSS);
    let seg2 = |i: usize| &reply2[i * SMSS..(i + 1) * SMSS];
    t.advance(ms(5));
    t.app_send(&reply2);
    for i in 0..5 {
        t.expect(
            t.out()
                .seq(l(base + i * SMSS))
                .ack(r(100))
                .win(win)
                .payload(seg2(i)),
        );
    }
    t.expect_none();
    t.advance(ms(10));
    t.send(t.seg().seq(r(100)).ack(l(base + 3 * SMSS)));
    t.expect_none();
    let ack_at = t.now;
    let srtt = t.stats().srtt.expect("sampled");
    // Two segments in flight: PTO = 2·SRTT after this ACK (RFC 8985 §7.2).
    assert_eq!(t.fire(), ack_at + srtt * 2);
    // The probe: the highest-sequence segment.
    t.expect(
        t.out()
            .seq(l(base + 4 * SMSS))
            .ack(r(100))
            .win(win)
            .payload(seg2(4)),
    );
    t.expect_none();
    assert_eq!(t.stats().tail_loss_probes, 1);
    // Its SACK shows segment 3 missing below it: fast recovery resends it at once.
    t.advance(ms(10));
    t.send(
        t.seg()
            .seq(r(100))
            .ack(l(base + 3 * SMSS))
            .sack(&[(l(base + 4 * SMSS), l(base + 5 * SMSS))]),
    );
    t.expect(
        t.out()
            .seq(l(base + 3 * SMSS))
            .ack(r(100))
            .win(win)
            .payload(seg2(3)),
    );
    t.expect_none();
    t.advance(ms(10));
    t.send(t.seg().seq(r(100)).ack(l(base + 5 * SMSS)));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.fast_retransmits, 2);
    assert_eq!(s.rto_timeouts, 0);
    assert_eq!(s.bytes_in_flight, 0);
    assert_eq!(t.conn.poll_timeout(), None);
}
