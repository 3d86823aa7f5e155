//! Quick-ACK (Linux's quickack mode): the first data segments of a connection, and the
//! first ones after a silence longer than the RTO, are acknowledged at once; the delayed-ACK
//! rules (RFC 9293 §3.8.6.3, RFC 5681 §4.2) apply once the budget is spent.
//!
//! The budget is `min(quick_ack_segments, rx_buffer / (2 × mss))`, at least 2: with the
//! harness's 16 KiB buffer and our MSS of 1460 that is 5 segments.

mod tcp_support_b;

use netdriver::tcp::Config;
use netdriver::time::Duration;
use tcp_support_b::*;

/// The budget the harness configuration gives: 16384 / 2920 = 5.
const BUDGET: usize = 5;

fn quick() -> Tcb {
    let config = Config {
        delayed_ack: Some(ms(40)),
        ..test_config()
    };
    assert_eq!(config.quick_ack_segments, 16, "the default");
    Tcb::established(config, PeerOpts::default())
}

/// The window we advertise once the peer's first `received` bytes sit unread in the
/// buffer (nothing is read in these tests, so the right edge never moves).
fn win(received: usize) -> u16 {
    (BUF - received) as u16
}

/// The peer sends `n` 100-byte segments starting at its byte `from`, 1 ms apart; each is
/// acknowledged at once.
fn expect_quick(t: &mut Tcb, from: usize, n: usize) {
    let d = data(from + n * 100);
    for k in 0..n {
        let at = from + k * 100;
        t.send(t.seg().seq(r(at)).payload(&d[at..at + 100]));
        t.expect(t.out().ack(r(at + 100)).win(win(at + 100)));
        t.expect_none();
        t.advance(ms(1));
    }
}

#[test]
fn first_segments_are_acked_at_once_then_delayed_ack_resumes() {
    let mut t = quick();
    expect_quick(&mut t, 0, BUDGET);
    // The budget is spent: the next segment waits for the delayed-ACK timer...
    let d = data(2000);
    let at = BUDGET * 100;
    let t1 = t.now;
    t.send(t.seg().seq(r(at)).payload(&d[at..at + 100]));
    t.expect_none();
    assert_eq!(t.deadline(), t1 + ms(40));
    assert_eq!(t.fire(), t1 + ms(40));
    t.expect(t.out().ack(r(at + 100)).win(win(at + 100)));
    t.expect_none();
    // ...two short segments in a row are not two full-sized ones: they wait too...
    let at = at + 100;
    let t2 = t.now;
    t.send(t.seg().seq(r(at)).payload(&d[at..at + 100]));
    t.expect_none();
    t.send(t.seg().seq(r(at + 100)).payload(&d[at + 100..at + 200]));
    t.expect_none();
    assert_eq!(t.fire(), t2 + ms(40));
    t.expect(t.out().ack(r(at + 200)).win(win(at + 200)));
    // ...and a second full-sized segment in a row is acknowledged at once (RFC 5681
    // §4.2; our advertised MSS, 1460, is the full size).
    const FULL: usize = 1460;
    let at = at + 200;
    let d = data(at + 2 * FULL);
    t.send(t.seg().seq(r(at)).payload(&d[at..at + FULL]));
    t.expect_none();
    t.advance(ms(1));
    t.send(
        t.seg()
            .seq(r(at + FULL))
            .payload(&d[at + FULL..at + 2 * FULL]),
    );
    t.expect(t.out().ack(r(at + 2 * FULL)).win(win(at + 2 * FULL)));
    t.expect_none();
}

#[test]
fn quick_ack_resumes_after_an_idle_period_longer_than_the_rto() {
    let mut t = quick();
    expect_quick(&mut t, 0, BUDGET);
    // A silence of exactly the RTO (200 ms) is not enough...
    let at = BUDGET * 100;
    let d = data(at + 2000);
    t.advance(ms(199)); // 1 ms passed already since the last segment.
    let t1 = t.now;
    t.send(t.seg().seq(r(at)).payload(&d[at..at + 100]));
    t.expect_none();
    assert_eq!(t.fire(), t1 + ms(40));
    t.expect(t.out().ack(r(at + 100)).win(win(at + 100)));
    t.expect_none();
    // ...a silence 1 µs longer than the RTO refills the budget (Linux's
    // `tcp_event_data_recv`).
    t.advance(ms(160) + Duration::from_micros(1));
    expect_quick(&mut t, at + 100, BUDGET);
    // Spent again.
    let at = at + 100 + BUDGET * 100;
    let d = data(at + 100);
    t.send(t.seg().seq(r(at)).payload(&d[at..at + 100]));
    t.expect_none();
    assert_eq!(t.deadline(), t.now + ms(40));
}

#[test]
fn budget_is_capped_by_the_configured_count_and_zero_disables_it() {
    // quick_ack_segments below the buffer's cap: 2 segments.
    let config = Config {
        delayed_ack: Some(ms(40)),
        quick_ack_segments: 2,
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    expect_quick(&mut t, 0, 2);
    let d = data(300);
    t.send(t.seg().seq(r(200)).payload(&d[200..300]));
    t.expect_none();
    assert_eq!(t.deadline(), t.now + ms(40));

    let config = Config {
        delayed_ack: Some(ms(40)),
        quick_ack_segments: 0,
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    t.send(t.seg().payload(&d[..100]));
    t.expect_none();
    assert_eq!(t.deadline(), t.now + ms(40));
}

#[test]
fn quick_ack_budget_of_the_default_buffer_is_sixteen() {
    // 256 KiB / (2 × 1460) = 89 segments: Linux's cap of 16 applies.
    let mut t = Tcb::established(Config::default(), PeerOpts::default());
    let d = data(17 * 100);
    for k in 0..16 {
        t.send(t.seg().seq(r(k * 100)).payload(&d[k * 100..(k + 1) * 100]));
        let out = t.drain();
        assert_eq!(out.len(), 1, "segment {k} acknowledged at once");
        assert_eq!(out[0].repr.ack, Some(r((k + 1) * 100)));
        t.advance(ms(1));
    }
    t.send(t.seg().seq(r(1600)).payload(&d[1600..]));
    t.expect_none();
    assert_eq!(t.deadline(), t.now + ms(40));
}

#[test]
fn set_quickack_sends_a_held_ack_at_once_and_acks_the_next_segments_at_once() {
    let mut t = quick();
    expect_quick(&mut t, 0, BUDGET);
    assert!(!t.conn.quickack(), "the budget is spent");
    // A segment the delayed-ACK rules hold...
    let d = data(BUDGET * 100 + 1000);
    let at = BUDGET * 100;
    t.send(t.seg().seq(r(at)).payload(&d[at..at + 100]));
    t.expect_none();
    // ...leaves at once when the application asks for quick ACKs (TCP_QUICKACK = 1),
    t.conn.set_quickack(true);
    assert!(t.conn.quickack());
    t.expect(t.out().ack(r(at + 100)).win(win(at + 100)));
    t.expect_none();
    // and the next segments are acknowledged at once again.
    expect_quick(&mut t, at + 100, 2);
}

#[test]
fn set_quickack_off_delays_acks_from_the_next_segment() {
    let mut t = quick();
    assert!(t.conn.quickack(), "a new connection acknowledges at once");
    t.conn
        .apply_options(t.now, &netdriver::tcp::OptionChanges::new().quickack(false));
    assert!(!t.conn.quickack());
    let d = data(100);
    let t0 = t.now;
    t.send(t.seg().seq(r(0)).payload(&d));
    t.expect_none();
    assert_eq!(t.fire(), t0 + ms(40));
    t.expect(t.out().ack(r(100)).win(win(100)));
}
