//! What a driver asks a connection to skip work. `Connection::output_pending`: the test
//! it uses to skip polling a connection (and a round) that has nothing to send. It must be true whenever `poll_transmit` would
//! return a segment (RFC 9293 §3.8.6 window updates, §3.10.4 FIN, RFC 5681 §4.2
//! immediate ACKs, new data), and false on an idle connection, so that skipping saves
//! work. Each case checks both sides: the flag before the poll, and the segment the poll
//! then returns. `Connection::stats_mark`: equal marks mean equal statistics, so a
//! driver publishes a connection's statistics only when its mark moved.

mod tcp_support_b;

use netdriver::tcp::Config;
use tcp_support_b::*;

fn quiet(config: Config) -> Tcb {
    let mut t = Tcb::established(config, PeerOpts::default());
    t.drain();
    assert!(
        !t.conn.output_pending(),
        "an established, drained connection owes nothing"
    );
    t
}

#[test]
fn new_data_is_pending_until_sent() {
    let mut t = quiet(test_config());
    t.app_send(&data(300));
    assert!(t.conn.output_pending());
    let seg = t.poll().expect("the data goes out");
    assert_eq!(seg.payload.len(), 300);
    assert!(!t.conn.output_pending(), "sent data leaves nothing owed");
    t.expect_none();
}

#[test]
fn an_immediate_ack_is_pending_until_sent() {
    let mut t = quiet(test_config());
    // Out of order: RFC 5681 §4.2 wants an immediate duplicate ACK.
    t.send(t.seg().seq(r(1000)).payload(&data(100)));
    assert!(t.conn.output_pending());
    t.expect(
        t.out()
            .ack(r(0))
            .sack(&[(r(1000), r(1100))])
            .win(t.full_window()),
    );
    assert!(!t.conn.output_pending());
    t.expect_none();
}

#[test]
fn a_delayed_ack_is_a_timer_not_pending_output() {
    let config = Config {
        delayed_ack: Some(ms(40)),
        quick_ack_segments: 0,
        ..test_config()
    };
    let mut t = quiet(config);
    let t1 = t.now;
    t.send(t.seg().payload(&data(100)));
    // Nothing to send now; the timer says when.
    assert!(!t.conn.output_pending());
    t.expect_none();
    assert_eq!(t.deadline(), t1 + ms(40));
    t.tick_to(t1 + ms(40));
    t.expect(t.out().ack(r(100)).win(t.window_for(BUF - 100)));
    assert!(!t.conn.output_pending());
}

#[test]
fn a_window_update_after_a_drained_zero_window_is_pending() {
    let config = Config {
        rx_buffer: 4096,
        ..test_config()
    };
    let mut t = quiet(config);
    let d = data(4096);
    for i in 0..4 {
        t.send(
            t.seg()
                .seq(r(i * 1024))
                .payload(&d[i * 1024..(i + 1) * 1024]),
        );
        t.drain();
    }
    assert!(
        !t.conn.output_pending(),
        "a full buffer with every ACK sent owes nothing"
    );
    assert_eq!(t.app_recv(4096), d);
    assert!(
        t.conn.output_pending(),
        "the reader opened the window: an update is owed"
    );
    t.expect(t.out().ack(r(4096)).win(4096));
    assert!(!t.conn.output_pending());
}

#[test]
fn a_small_read_owes_no_window_update() {
    let config = Config {
        rx_buffer: 4096,
        ..test_config()
    };
    let mut t = quiet(config);
    let d = data(1024);
    t.send(t.seg().payload(&d));
    t.drain();
    assert_eq!(t.app_recv(100), d[..100]);
    // Receiver SWS avoidance: the edge moves too little for an update.
    assert!(!t.conn.output_pending());
    t.expect_none();
}

#[test]
fn a_fin_is_pending_until_sent_and_after_the_data() {
    let mut t = quiet(test_config());
    t.app_send(&data(200));
    t.conn.close();
    assert!(t.conn.output_pending());
    let segs = t.drain();
    assert!(
        segs.iter()
            .any(|s| s.repr.flags.contains(netdriver::wire::tcp::TcpFlags::FIN)),
        "the FIN went out"
    );
    assert!(
        !t.conn.output_pending(),
        "a sent FIN waits for its ACK, not for a poll"
    );
}

#[test]
fn a_retransmission_after_the_rto_is_pending() {
    let mut t = quiet(test_config());
    t.app_send(&data(300));
    t.drain();
    assert!(
        !t.conn.output_pending(),
        "in flight, unacknowledged: only the timer is due"
    );
    // The RTO (or the tail-loss probe before it) rewinds or queues a resend.
    t.fire();
    assert!(t.conn.output_pending());
    assert!(t.poll().is_some(), "the resend goes out");
}

#[test]
fn a_reset_is_pending_even_on_a_closed_connection() {
    let mut t = quiet(test_config());
    t.conn.abort();
    assert!(t.conn.output_pending(), "an abort owes the peer a RST");
    let seg = t.poll().expect("the RST goes out");
    assert!(seg.repr.flags.contains(netdriver::wire::tcp::TcpFlags::RST));
    assert!(!t.conn.output_pending());
    t.expect_none();
}

#[test]
fn the_stats_mark_moves_with_every_change_and_only_then() {
    let mut t = quiet(test_config());
    let mut last = t.conn.stats_mark();
    let mut moved = |t: &Tcb, what: &str| {
        let now = t.conn.stats_mark();
        assert_ne!(now, last, "{what}: the mark did not move");
        last = now;
    };
    t.app_send(&data(300));
    moved(&t, "application write");
    t.drain();
    moved(&t, "segment sent");
    t.send(t.seg().ack(l(300)).payload(&data(100)));
    moved(&t, "segment received");
    assert_eq!(t.app_recv(100).len(), 100);
    moved(&t, "application read");
    t.drain();
    let still = t.conn.stats_mark();
    let stats = t.conn.stats();
    t.advance(ms(1));
    assert_eq!(t.conn.stats_mark(), still, "nothing happened");
    let again = t.conn.stats();
    assert_eq!(
        (
            again.bytes_sent,
            again.bytes_acked,
            again.bytes_received,
            again.cwnd,
            again.srtt
        ),
        (
            stats.bytes_sent,
            stats.bytes_acked,
            stats.bytes_received,
            stats.cwnd,
            stats.srtt
        ),
        "an unmoved mark, unchanged statistics"
    );
    // A retransmission timeout changes cwnd and counters without the peer's help.
    t.app_send(&data(100));
    t.drain();
    let before = t.conn.stats_mark();
    t.fire();
    t.drain();
    assert_ne!(t.conn.stats_mark(), before, "timer-driven resend");
}
