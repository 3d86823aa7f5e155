//! Retransmission timer (RFC 6298): initial RTO, exact deadlines, backoff, cap, restart on
//! new ACKs, Karn's algorithm, timestamp RTT samples, and giving up (user timeout).

mod tcp_support_b;

use netdriver::tcp::{Config, Connection, SeqNumber, State, TcpError};
use netdriver::time::Duration;
use tcp_support_b::*;

fn nodelay(config: Config, peer: PeerOpts) -> Tcb {
    let mut t = Tcb::established(config, peer);
    t.conn.set_nodelay(true);
    t
}

#[test]
fn initial_rto_is_one_second_and_doubles_for_the_syn() {
    // RFC 6298 §2.1 (initial RTO 1 s) and §5.5 (back off by doubling).
    let config = Config {
        sack: false,
        timestamps: false,
        window_scaling: false,
        ..Config::default()
    };
    let mut conn = Connection::connect(
        config,
        local_addr(),
        remote_addr(),
        SeqNumber(LOCAL_ISN),
        T0,
    );
    let mut buf = [0u8; 2000];
    let syn = conn.poll_transmit(T0, &mut buf).expect("SYN");
    assert!(conn.poll_transmit(T0, &mut buf).is_none());
    assert_eq!(conn.poll_timeout(), Some(T0 + ms(1000)));
    conn.handle_timeout(T0 + ms(999));
    assert!(conn.poll_transmit(T0 + ms(999), &mut buf).is_none());
    conn.handle_timeout(T0 + ms(1000));
    let again = conn
        .poll_transmit(T0 + ms(1000), &mut buf)
        .expect("SYN retransmission");
    assert_eq!(again.repr.seq, syn.repr.seq);
    assert!(again.repr.flags.syn());
    assert_eq!(again.repr.ack, None);
    assert_eq!(conn.poll_timeout(), Some(T0 + ms(3000)));
}

#[test]
fn idle_connection_has_no_deadline() {
    let mut t = Tcb::new();
    assert_eq!(t.conn.poll_timeout(), None);
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    assert!(t.conn.poll_timeout().is_some());
    t.send(t.seg().ack(l(100)));
    t.expect_none();
    assert_eq!(t.conn.poll_timeout(), None, "nothing outstanding, no timer");
}

#[test]
fn rto_deadline_is_exact_and_retransmits_the_first_unacked_segment() {
    let mut t = Tcb::new();
    let t1 = t.now;
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    assert_eq!(t.stats().rto, ms(200));
    assert_eq!(t.deadline(), t1 + ms(200));
    t.tick_to(t1 + ms(199));
    t.expect_none();
    assert_eq!(t.fire(), t1 + ms(200));
    t.expect(t.out().payload(&d));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.rto_timeouts, 1);
    assert_eq!(s.retransmitted_segments, 1);
    assert_eq!(s.rto, ms(400));
    assert_eq!(t.deadline(), t1 + ms(600));
}

#[test]
fn rto_backoff_doubles_each_timeout() {
    let mut t = Tcb::new();
    let t1 = t.now;
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    let mut at = t1;
    for k in 0..6u32 {
        at += ms(200) * 2u32.pow(k);
        assert_eq!(t.fire(), at, "timeout {k}");
        t.expect(t.out().payload(&d));
        t.expect_none();
    }
    assert_eq!(t.stats().rto_timeouts, 6);
    assert_eq!(t.deadline(), at + ms(200 * 64));
}

#[test]
fn rto_backoff_is_capped_at_max_rto() {
    let config = Config {
        max_rto: ms(1000),
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    let mut at = t.now;
    for step in [200, 400, 800, 1000, 1000, 1000] {
        at += ms(step);
        assert_eq!(t.fire(), at);
        t.expect(t.out().payload(&d));
    }
    assert_eq!(t.stats().rto, ms(1000));
    assert_eq!(t.deadline(), at + ms(1000));
}

/// smoltcp #1018 / #953: the retransmission timer must restart when an ACK acknowledges
/// new data (RFC 6298 §5.3), and must not restart when more data is sent (§5.1).
#[test]
fn rto_restarts_on_new_ack_but_not_on_new_send() {
    let mut t = nodelay(test_config(), PeerOpts::default());
    let t1 = t.now;
    let d = data(2000);
    t.app_send(&d[..1000]);
    t.expect(t.out().payload(&d[..1000]));
    assert_eq!(t.deadline(), t1 + ms(200));
    t.advance(ms(100));
    t.app_send(&d[1000..]);
    t.expect(t.out().seq(l(1000)).payload(&d[1000..]));
    assert_eq!(
        t.deadline(),
        t1 + ms(200),
        "sending must not restart the timer"
    );
    t.advance(ms(50));
    t.send(t.seg().ack(l(1000)));
    t.expect_none();
    t.rtt.on_sample(ms(150));
    assert_eq!(t.stats().rto, t.rtt.rto());
    assert_eq!(t.deadline(), t1 + ms(150) + t.rtt.rto());
    assert!(t.deadline() > t1 + ms(200));
}

/// smoltcp #1023: the backed-off RTO must survive until a fresh RTT sample (RFC 6298 §5,
/// Karn), and a fresh sample from newly sent and acknowledged data must reset it.
#[test]
fn rto_backoff_kept_until_a_valid_sample_then_reset() {
    let mut t = nodelay(test_config(), PeerOpts::default());
    let t1 = t.now;
    let d = data(300);
    t.app_send(&d[..100]);
    t.expect(t.out().payload(&d[..100]));
    assert_eq!(t.fire(), t1 + ms(200));
    t.expect(t.out().payload(&d[..100]));
    // The ACK of a retransmitted segment gives no sample (Karn).
    t.tick_to(t1 + ms(250));
    t.send(t.seg().ack(l(100)));
    t.expect_none();
    assert_eq!(t.stats().rto, ms(400), "backoff kept: no valid sample yet");
    // New data is timed with the backed-off RTO...
    t.tick_to(t1 + ms(300));
    t.app_send(&d[100..200]);
    t.expect(t.out().seq(l(100)).payload(&d[100..200]));
    assert_eq!(t.deadline(), t1 + ms(700));
    // ...and its ACK is a valid sample that collapses the RTO again.
    t.tick_to(t1 + ms(350));
    t.send(t.seg().ack(l(200)));
    t.expect_none();
    t.rtt.on_sample(ms(50));
    assert_eq!(t.stats().rto, t.rtt.rto());
    assert_eq!(t.stats().rto, ms(200));
    t.tick_to(t1 + ms(400));
    t.app_send(&d[200..]);
    t.expect(t.out().seq(l(200)).payload(&d[200..]));
    assert_eq!(t.deadline(), t1 + ms(600));
}

/// smoltcp #1190: a 1 s minimum RTO ruins µs-scale links; a configured 1 ms floor holds.
#[test]
fn min_rto_of_one_millisecond_is_honoured() {
    let config = Config {
        min_rto: ms(1),
        initial_rto: ms(1000),
        ..test_config()
    };
    let mut t = nodelay(config, PeerOpts::default());
    let d = data(4100);
    for k in 0..40 {
        t.app_send(&d[k * 100..(k + 1) * 100]);
        t.expect(t.out().seq(l(k * 100)).payload(&d[k * 100..(k + 1) * 100]));
        t.advance(Duration::from_micros(100));
        t.send(t.seg().ack(l((k + 1) * 100)));
        t.expect_none();
        t.rtt.on_sample(Duration::from_micros(100));
        assert_eq!(t.stats().rto, t.rtt.rto(), "sample {k}");
    }
    assert_eq!(t.stats().rto, ms(1));
    let now = t.now;
    t.app_send(&d[4000..]);
    t.expect(t.out().seq(l(4000)).payload(&d[4000..]));
    assert_eq!(t.deadline(), now + ms(1));
    assert_eq!(t.fire(), now + ms(1));
    t.expect(t.out().seq(l(4000)).payload(&d[4000..]));
}

#[test]
fn karn_no_rtt_sample_from_a_retransmitted_segment() {
    let mut t = Tcb::new();
    let srtt = t.stats().srtt;
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    t.fire();
    t.expect(t.out().payload(&d));
    t.advance(ms(5));
    t.send(t.seg().ack(l(100)));
    assert_eq!(t.stats().srtt, srtt, "an ambiguous ACK must not be sampled");
}

#[test]
fn rtt_sample_from_timestamps_even_after_retransmission() {
    // RFC 7323 §4: with timestamps the echoed TSval tells which transmission was acked, so
    // the ACK of a retransmission is a valid sample (RTTM).
    let mut t = nodelay(test_config(), PeerOpts::with_ts());
    let payload = 1000 - 12;
    let d = data(payload);
    let t1 = t.now;
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    assert_eq!(t.fire(), t1 + ms(200));
    t.expect(t.out().payload(&d));
    t.advance(ms(100));
    t.send(t.seg().ack(l(payload))); // echoes the retransmission's TSval
    t.expect_none();
    t.rtt.on_sample(ms(100));
    assert_eq!(t.stats().srtt, t.rtt.srtt());
    assert_eq!(t.stats().rto, t.rtt.rto());
}

#[test]
fn rtt_sample_from_a_plain_ack_updates_srtt_per_rfc6298() {
    let config = Config {
        min_rto: ms(1),
        ..test_config()
    };
    let mut t = nodelay(config, PeerOpts::default());
    let d = data(200);
    t.app_send(&d[..100]);
    t.expect(t.out().payload(&d[..100]));
    t.advance(ms(30));
    t.send(t.seg().ack(l(100)));
    t.rtt.on_sample(ms(30));
    assert_eq!(t.stats().srtt, t.rtt.srtt());
    assert_eq!(t.stats().rto, t.rtt.rto());
    t.app_send(&d[100..]);
    t.expect(t.out().seq(l(100)).payload(&d[100..]));
    t.advance(ms(70));
    t.send(t.seg().ack(l(200)));
    t.rtt.on_sample(ms(70));
    assert_eq!(t.stats().srtt, t.rtt.srtt());
    assert_eq!(t.stats().rto, t.rtt.rto());
}

#[test]
fn rto_sends_one_segment_and_collapses_cwnd() {
    // RFC 5681 §3.1: after an RTO, cwnd = 1 SMSS (loss window) and
    // ssthresh = max(FlightSize / 2, 2 * SMSS).
    let mut t = nodelay(test_config(), PeerOpts::no_sack());
    let d = data(5000);
    t.app_send(&d);
    for i in 0..5 {
        t.expect(
            t.out()
                .seq(l(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
    }
    t.fire();
    t.expect(t.out().seq(l(0)).payload(&d[..1000]));
    t.expect_none();
    assert_eq!(t.stats().cwnd, 1000);
    assert_eq!(t.stats().ssthresh, 2500);
    // The ACK of the retransmission grows cwnd by one segment (slow start): two more go.
    t.advance(ms(10));
    t.send(t.seg().ack(l(1000)));
    assert_eq!(t.stats().cwnd, 2000);
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect(t.out().seq(l(2000)).payload(&d[2000..3000]));
    t.expect_none();
}

/// smoltcp #1034 / #323: a dead peer must not hang the connection forever. After the user
/// timeout without progress the connection fails with TimedOut and sends an RST.
#[test]
fn user_timeout_gives_up_with_timed_out_and_rst() {
    let config = Config {
        user_timeout: ms(3000),
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    let t1 = t.now;
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    let mut last = Vec::new();
    for _ in 0..20 {
        if t.conn.state() == State::Closed {
            break;
        }
        t.fire();
        last = t.drain();
    }
    assert_eq!(t.conn.state(), State::Closed);
    assert_eq!(t.now, t1 + ms(3000), "gave up at the user timeout");
    assert_eq!(t.conn.error(), Some(TcpError::TimedOut));
    let rst = last.last().expect("an RST on giving up");
    assert!(rst.repr.flags.rst(), "{:?}", SegView(rst));
    assert_eq!(rst.repr.seq, l(100));
    assert!(rst.payload.is_empty());
    assert_eq!(t.conn.poll_timeout(), None);
    t.tick(ms(100_000));
    t.expect_none();
    assert_eq!(t.conn.send(b"x"), Err(TcpError::TimedOut));
}

#[test]
fn dead_peer_with_default_timers_closes_within_user_timeout() {
    let config = Config {
        rx_buffer: BUF,
        tx_buffer: BUF,
        ..Config::default()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    let t1 = t.now;
    let d = data(100);
    t.app_send(&d);
    assert_eq!(t.drain().len(), 1);
    let mut fires = 0;
    while t.conn.state() != State::Closed {
        t.fire();
        let out = t.drain();
        assert!(out.len() <= 1);
        fires += 1;
        assert!(fires < 30, "too many timeouts without giving up");
    }
    assert!(t.now <= t1 + Duration::from_secs(60));
    assert_eq!(t.conn.error(), Some(TcpError::TimedOut));
    assert!(t.conn.is_closed());
}

#[test]
fn ack_of_all_data_resets_user_timeout_progress() {
    let config = Config {
        user_timeout: ms(1000),
        ..test_config()
    };
    let mut t = nodelay(config, PeerOpts::default());
    let d = data(200);
    t.app_send(&d[..100]);
    t.expect(t.out().payload(&d[..100]));
    t.fire(); // +200
    t.drain();
    t.tick(ms(500)); // +700
    t.send(t.seg().ack(l(100)));
    t.expect_none();
    // New data 800 ms after the first was sent: the user timeout counts from progress.
    let t2 = t.now;
    t.app_send(&d[100..]);
    t.drain();
    while t.conn.state() != State::Closed {
        t.fire();
        t.drain();
    }
    assert_eq!(t.now, t2 + ms(1000));
}
