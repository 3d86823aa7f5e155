//! Delayed ACKs (RFC 9293 §3.8.6.3, RFC 5681 §4.2), Nagle's algorithm (RFC 9293 §3.7.4)
//! and keep-alive (RFC 9293 §3.8.4).

mod tcp_support_b;

use netdriver::tcp::connection::KEEPALIVE_PROBES;
use netdriver::tcp::{Config, SeqNumber, State, TcpError};
use netdriver::time::Duration;
use tcp_support_b::*;

/// Our advertised MSS (config default): a segment of this size is full-sized whichever
/// MSS the implementation compares with.
const FULL: usize = 1460;

/// Delayed ACKs without the quick-ACK budget, which would acknowledge the first
/// segments of the connection at once: these tests are about the delayed-ACK rules that
/// apply once it is spent (quick-ACK has its own tests in `tcp_quick_ack.rs`).
fn delayed() -> Tcb {
    let config = Config {
        delayed_ack: Some(ms(40)),
        quick_ack_segments: 0,
        ..test_config()
    };
    Tcb::established(config, PeerOpts::default())
}

// ---- delayed ACK ----

#[test]
fn delayed_ack_fires_exactly_at_the_deadline() {
    let mut t = delayed();
    let t1 = t.now;
    let d = data(500);
    t.send(t.seg().payload(&d));
    t.expect_none();
    assert_eq!(t.deadline(), t1 + ms(40));
    t.tick_to(t1 + ms(39));
    t.expect_none();
    assert_eq!(t.fire(), t1 + ms(40));
    t.expect(t.out().ack(r(500)).win(BUF as u16 - 500));
    t.expect_none();
    assert_eq!(t.conn.poll_timeout(), None);
}

#[test]
fn second_full_segment_is_acked_at_once() {
    let mut t = delayed();
    let d = data(2 * FULL);
    t.send(t.seg().payload(&d[..FULL]));
    t.expect_none();
    t.advance(ms(5));
    t.send(t.seg().seq(r(FULL)).payload(&d[FULL..]));
    t.expect(t.out().ack(r(2 * FULL)).win((BUF - 2 * FULL) as u16));
    t.expect_none();
    assert_eq!(t.conn.poll_timeout(), None, "no delayed ACK left pending");
}

#[test]
fn every_second_full_segment_is_acked_in_a_stream() {
    let mut t = delayed();
    let d = data(6 * FULL);
    for i in 0..6 {
        t.send(
            t.seg()
                .seq(r(i * FULL))
                .payload(&d[i * FULL..(i + 1) * FULL]),
        );
        if i % 2 == 1 {
            t.expect(
                t.out()
                    .ack(r((i + 1) * FULL))
                    .win((BUF - (i + 1) * FULL) as u16),
            );
        }
        t.expect_none();
    }
}

/// smoltcp #935: the delayed-ACK timer and a second full segment racing at the same
/// instant must produce exactly one ACK, covering both segments, and nothing later.
#[test]
fn delayed_ack_timer_racing_a_full_segment_segment_first() {
    let mut t = delayed();
    let t1 = t.now;
    let d = data(2 * FULL);
    t.send(t.seg().payload(&d[..FULL]));
    t.expect_none();
    t.advance(ms(40)); // the deadline, timers not yet run
    t.send(t.seg().seq(r(FULL)).payload(&d[FULL..]));
    t.conn.handle_timeout(t1 + ms(40));
    t.expect(t.out().ack(r(2 * FULL)).win((BUF - 2 * FULL) as u16));
    t.expect_none();
    assert_eq!(t.conn.poll_timeout(), None);
}

/// smoltcp #935, the other order: the timer runs first, then the segment arrives at the
/// same instant. The first segment is ACKed by the timer; the second is not forgotten.
#[test]
fn delayed_ack_timer_racing_a_full_segment_timer_first() {
    let mut t = delayed();
    let t1 = t.now;
    let d = data(2 * FULL);
    t.send(t.seg().payload(&d[..FULL]));
    t.tick_to(t1 + ms(40));
    t.send(t.seg().seq(r(FULL)).payload(&d[FULL..]));
    let acks = t.drain();
    assert!(!acks.is_empty() && acks.len() <= 2, "{}", acks.len());
    let last_ack = acks.last().unwrap().repr.ack;
    if last_ack != Some(r(2 * FULL)) {
        // Only the first was acknowledged: the second must be by its own deadline.
        assert_eq!(last_ack, Some(r(FULL)));
        assert_eq!(t.fire(), t1 + ms(80));
        t.expect(t.out().ack(r(2 * FULL)).win((BUF - 2 * FULL) as u16));
    }
    t.expect_none();
    assert_eq!(t.conn.poll_timeout(), None);
}

#[test]
fn delayed_ack_deadline_is_not_pushed_back_by_later_segments() {
    let mut t = delayed();
    let t1 = t.now;
    let d = data(200);
    t.send(t.seg().payload(&d[..100]));
    t.expect_none();
    t.tick_to(t1 + ms(30));
    t.send(t.seg().seq(r(100)).payload(&d[100..]));
    // An immediate ACK is allowed; a later one than t1 + 40 ms is not.
    if let Some(ack) = t.poll() {
        t.check(&ack, t.out().ack(r(200)).win(BUF as u16 - 200));
    } else {
        assert_eq!(t.fire(), t1 + ms(40));
        t.expect(t.out().ack(r(200)).win(BUF as u16 - 200));
    }
    t.expect_none();
}

#[test]
fn out_of_order_segment_is_acked_immediately_despite_delayed_ack() {
    let mut t = delayed();
    let d = data(2000);
    t.send(t.seg().seq(r(1000)).payload(&d[1000..]));
    t.expect(t.out().ack(r(0)).sack(&[(r(1000), r(2000))]));
    t.expect_none();
}

#[test]
fn segment_filling_a_gap_is_acked_immediately() {
    // RFC 5681 §4.2: an ACK SHOULD be sent at once for a segment that fills a gap.
    let mut t = delayed();
    let d = data(2000);
    t.send(t.seg().seq(r(1000)).payload(&d[1000..]));
    t.drain();
    t.send(t.seg().payload(&d[..1000]));
    t.expect(t.out().ack(r(2000)).win(BUF as u16 - 2000));
    t.expect_none();
}

#[test]
fn no_delayed_ack_acks_every_segment() {
    let mut t = Tcb::new(); // delayed_ack: None
    let d = data(300);
    for i in 0..3 {
        t.send(t.seg().seq(r(i * 100)).payload(&d[i * 100..(i + 1) * 100]));
        t.expect(
            t.out()
                .ack(r((i + 1) * 100))
                .win((BUF - (i + 1) * 100) as u16),
        );
        t.expect_none();
    }
    assert_eq!(t.conn.poll_timeout(), None);
}

#[test]
fn delayed_ack_is_piggybacked_on_data() {
    let mut t = delayed();
    t.conn.set_nodelay(true);
    let t1 = t.now;
    let theirs = data(500);
    t.send(t.seg().payload(&theirs));
    t.expect_none();
    t.tick_to(t1 + ms(10));
    let ours = data(100);
    t.app_send(&ours);
    t.expect(t.out().ack(r(500)).win(BUF as u16 - 500).payload(&ours));
    t.expect_none();
    // No pure ACK at the old delayed-ACK deadline.
    assert_eq!(t.deadline(), t1 + ms(10) + ms(200), "only the RTO remains");
    t.tick_to(t1 + ms(40));
    t.expect_none();
}

// ---- Nagle ----

#[test]
fn nagle_coalesces_small_writes_while_data_is_unacked() {
    let mut t = Tcb::new();
    let d = data(30);
    t.app_send(&d[..10]);
    t.expect(t.out().payload(&d[..10]));
    t.app_send(&d[10..20]);
    t.expect_none();
    t.app_send(&d[20..]);
    t.expect_none();
    t.advance(ms(10));
    t.send(t.seg().ack(l(10)));
    t.expect(t.out().seq(l(10)).payload(&d[10..]));
    t.expect_none();
}

#[test]
fn nagle_still_sends_full_segments() {
    let mut t = Tcb::new();
    let d = data(2010);
    t.app_send(&d[..10]);
    t.expect(t.out().payload(&d[..10]));
    t.app_send(&d[10..]);
    t.expect(t.out().seq(l(10)).payload(&d[10..1010]));
    t.expect(t.out().seq(l(1010)).payload(&d[1010..]));
    t.expect_none();
}

#[test]
fn nodelay_sends_small_writes_at_once() {
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    let d = data(30);
    for i in 0..3 {
        t.app_send(&d[i * 10..(i + 1) * 10]);
        t.expect(t.out().seq(l(i * 10)).payload(&d[i * 10..(i + 1) * 10]));
    }
    t.expect_none();
}

#[test]
fn nagle_disabled_in_config_sends_small_writes_at_once() {
    let config = Config {
        nagle: false,
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    let d = data(20);
    t.app_send(&d[..10]);
    t.expect(t.out().payload(&d[..10]));
    t.app_send(&d[10..]);
    t.expect(t.out().seq(l(10)).payload(&d[10..]));
}

#[test]
fn set_nodelay_releases_data_held_by_nagle() {
    let mut t = Tcb::new();
    let d = data(20);
    t.app_send(&d[..10]);
    t.expect(t.out().payload(&d[..10]));
    t.app_send(&d[10..]);
    t.expect_none();
    t.conn.set_nodelay(true);
    t.expect(t.out().seq(l(10)).payload(&d[10..]));
}

// ---- keep-alive ----

fn keepalive() -> Tcb {
    let config = Config {
        keepalive: Some(Duration::from_secs(10)),
        ..test_config()
    };
    Tcb::established(config, PeerOpts::default())
}

#[test]
fn keepalive_probe_is_snd_una_minus_one_after_idle_interval() {
    let mut t = keepalive();
    let t1 = t.now;
    assert_eq!(t.deadline(), t1 + ms(10_000));
    t.fire();
    // RFC 9293 §3.8.4 / RFC 1122 §4.2.3.6: SEG.SEQ = SND.NXT - 1, no data.
    t.expect(t.out().seq(SeqNumber(LOCAL_ISN)));
    t.expect_none();
    assert_eq!(t.deadline(), t1 + ms(20_000));
}

#[test]
fn keepalive_answer_resets_the_idle_timer() {
    let mut t = keepalive();
    let t1 = t.now;
    t.fire();
    t.expect(t.out().seq(SeqNumber(LOCAL_ISN)));
    t.advance(ms(5));
    t.send(t.seg().ack(l(0)));
    t.expect_none();
    assert_eq!(t.deadline(), t1 + ms(20_005));
    for _ in 0..(2 * KEEPALIVE_PROBES) {
        t.fire();
        t.expect(t.out().seq(SeqNumber(LOCAL_ISN)));
        t.send(t.seg().ack(l(0)));
    }
    assert_eq!(t.conn.state(), State::Established);
    assert_eq!(t.conn.error(), None);
}

#[test]
fn keepalive_gives_up_after_unanswered_probes() {
    let mut t = keepalive();
    let t1 = t.now;
    let mut probes = 0;
    let mut last = Vec::new();
    while t.conn.state() != State::Closed {
        t.fire();
        last = t.drain();
        if t.conn.state() != State::Closed {
            assert_eq!(last.len(), 1);
            assert_eq!(last[0].repr.seq, SeqNumber(LOCAL_ISN));
            assert!(last[0].payload.is_empty());
            probes += 1;
        }
        assert!(probes <= KEEPALIVE_PROBES, "never gives up");
    }
    assert_eq!(probes, KEEPALIVE_PROBES);
    assert_eq!(
        t.now,
        t1 + ms(10_000) * (KEEPALIVE_PROBES + 1),
        "gives up one interval after the last probe"
    );
    assert_eq!(t.conn.error(), Some(TcpError::TimedOut));
    let rst = last.last().expect("RST on giving up");
    assert!(rst.repr.flags.rst());
    assert_eq!(rst.repr.seq, l(0));
    assert_eq!(t.conn.poll_timeout(), None);
}

#[test]
fn keepalive_waits_for_idle_after_traffic() {
    let mut t = keepalive();
    let t1 = t.now;
    t.tick_to(t1 + ms(6000));
    let d = data(100);
    t.send(t.seg().payload(&d));
    t.drain();
    // The idle interval counts from the last segment received.
    assert_eq!(t.deadline(), t1 + ms(16_000));
}

/// `full_segments_per_ack` = 4 (what channels use): three full-sized segments wait for
/// the timer or a reply, the fourth is acknowledged at once.
#[test]
fn full_segments_per_ack_sets_how_many_full_segments_ack_at_once() {
    let config = Config {
        delayed_ack: Some(ms(40)),
        quick_ack_segments: 0,
        full_segments_per_ack: 4,
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    let d = data(4 * FULL);
    for i in 0..3 {
        t.send(
            t.seg()
                .seq(r(i * FULL))
                .payload(&d[i * FULL..(i + 1) * FULL]),
        );
        t.expect_none();
    }
    t.send(t.seg().seq(r(3 * FULL)).payload(&d[3 * FULL..]));
    t.expect(t.out().ack(r(4 * FULL)).win((BUF - 4 * FULL) as u16));
    t.expect_none();

    // A reply carries the ACK of a short message's segments: no pure ACK before it.
    let t1 = t.now;
    let e = data(3 * FULL);
    for i in 0..3 {
        t.send(
            t.seg()
                .seq(r(4 * FULL + i * FULL))
                .payload(&e[i * FULL..(i + 1) * FULL]),
        );
    }
    t.expect_none();
    assert_eq!(t.deadline(), t1 + ms(40));
    t.app_send(b"reply");
    let seg = t.poll().expect("the reply");
    assert_eq!(
        seg.repr.ack,
        Some(r(7 * FULL)),
        "the reply acknowledges all three"
    );
    assert_eq!(seg.payload, b"reply");
}
