//! Per-connection options changed after creation: send and receive buffer sizes, the MSS
//! clamp, the user timeout (RFC 9293 §3.8.3) and keep-alive (RFC 9293 §3.8.4, RFC 1122
//! §4.2.3.6), each pinned by exact segments and instants.

mod tcp_support_b;

use netdriver::tcp::{Connection, OptionChanges, SeqNumber, State, TcpError};
use netdriver::time::Duration;
use tcp_support_b::*;

// ---- user timeout ----

/// Lowered after establishment, the user timeout fails the connection at the new
/// deadline, measured from when the data became outstanding (the default is 60 s).
#[test]
fn user_timeout_lowered_after_establishment_fails_at_the_new_deadline() {
    let mut t = Tcb::new();
    assert_eq!(t.conn.user_timeout(), Duration::from_secs(60));
    let t1 = t.now;
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    t.conn.set_user_timeout(ms(3000));
    assert_eq!(t.conn.user_timeout(), ms(3000));
    let mut last = Vec::new();
    for _ in 0..20 {
        if t.conn.state() == State::Closed {
            break;
        }
        t.fire();
        last = t.drain();
    }
    assert_eq!(t.conn.state(), State::Closed);
    assert_eq!(t.now, t1 + ms(3000), "gave up at the new user timeout");
    assert_eq!(t.conn.error(), Some(TcpError::TimedOut));
    let rst = last.last().expect("an RST on giving up");
    assert!(rst.repr.flags.rst(), "{:?}", SegView(rst));
    assert_eq!(rst.repr.seq, l(100));
    assert_eq!(t.conn.poll_timeout(), None);
}

/// Lowered below the time already waited, it fails the connection at the next timer
/// run, and the deadline it reports is the one already past.
#[test]
fn user_timeout_lowered_below_the_time_waited_fails_at_once() {
    let mut t = Tcb::new();
    let t1 = t.now;
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    // Two RTOs (200 ms, then 400 ms backed off): retransmissions, still open.
    assert_eq!(t.fire(), t1 + ms(200));
    t.expect(t.out().payload(&d));
    assert_eq!(t.fire(), t1 + ms(600));
    t.expect(t.out().payload(&d));
    t.advance(ms(400));
    t.conn.set_user_timeout(ms(500));
    assert_eq!(t.conn.poll_timeout(), Some(t1 + ms(500)));
    assert_eq!(t.conn.state(), State::Established);
    t.tick(ms(0));
    assert_eq!(t.conn.state(), State::Closed);
    assert_eq!(t.conn.error(), Some(TcpError::TimedOut));
    let rst = t.poll().expect("an RST");
    assert!(rst.repr.flags.rst());
}

// ---- keep-alive ----

/// Keep-alive turned on after establishment probes once the idle time has passed since
/// the last segment received, then at the interval, and the probe count set later ends it.
#[test]
fn keepalive_enabled_after_creation_probes_after_the_idle_time() {
    let mut t = Tcb::new();
    // Established by the peer's SYN-ACK at `t1`, the last segment received.
    let t1 = t.now;
    assert_eq!(t.conn.poll_timeout(), None, "no keep-alive configured");
    t.advance(ms(3000));
    let now = t.now;
    t.conn.set_keepalive(now, Some(ms(10_000)));
    assert_eq!(t.conn.keepalive(), (Some(ms(10_000)), None, 9));
    assert_eq!(t.deadline(), t1 + ms(10_000));
    assert_eq!(t.fire(), t1 + ms(10_000));
    // RFC 9293 §3.8.4 / RFC 1122 §4.2.3.6: SEG.SEQ = SND.NXT - 1, no data.
    t.expect(t.out().seq(SeqNumber(LOCAL_ISN)));
    t.expect_none();
    assert_eq!(t.deadline(), t1 + ms(20_000));
    t.conn.set_keepalive_interval(Some(ms(1000)));
    t.conn.set_keepalive_probes(2);
    assert_eq!(t.fire(), t1 + ms(20_000));
    t.expect(t.out().seq(SeqNumber(LOCAL_ISN)));
    t.expect_none();
    assert_eq!(t.deadline(), t1 + ms(21_000), "the new interval");
    assert_eq!(t.fire(), t1 + ms(21_000));
    assert_eq!(t.conn.state(), State::Closed, "two probes unanswered");
    assert_eq!(t.conn.error(), Some(TcpError::TimedOut));
    let rst = t.poll().expect("an RST");
    assert!(rst.repr.flags.rst());
    assert_eq!(rst.repr.seq, l(0));
}

/// Enabled when the idle time has already passed, the first probe goes out at once;
/// turned off, the timer stops.
#[test]
fn keepalive_enabled_late_probes_at_once_and_can_be_turned_off() {
    let mut t = Tcb::new();
    t.advance(ms(60_000));
    let now = t.now;
    t.conn.set_keepalive(now, Some(ms(10_000)));
    assert_eq!(t.fire(), now);
    t.expect(t.out().seq(SeqNumber(LOCAL_ISN)));
    assert_eq!(t.deadline(), now + ms(10_000));
    // The peer answers; the idle time counts from its answer.
    t.advance(ms(5));
    t.send(t.seg().ack(l(0)));
    t.expect_none();
    assert_eq!(t.deadline(), now + ms(10_005));
    let now = t.now;
    t.conn.set_keepalive(now, None);
    assert_eq!(t.conn.poll_timeout(), None);
    t.tick(ms(100_000));
    t.expect_none();
    assert_eq!(t.conn.state(), State::Established);
}

/// Set before the handshake completes, keep-alive starts at establishment (as when
/// configured).
#[test]
fn keepalive_set_in_syn_sent_starts_at_establishment() {
    let mut conn = Connection::connect(
        test_config(),
        local_addr(),
        remote_addr(),
        SeqNumber(LOCAL_ISN),
        T0,
    );
    conn.set_keepalive(T0, Some(ms(10_000)));
    assert_eq!(conn.poll_timeout(), None, "nothing armed before the SYN");
    let mut buf = [0u8; 64];
    let syn = conn.poll_transmit(T0, &mut buf).expect("a SYN");
    // Only the SYN's retransmission timer runs.
    assert_eq!(conn.poll_timeout(), Some(T0 + ms(200)));
    let mut syn_ack = syn.repr;
    syn_ack.src_port = syn.repr.dst_port;
    syn_ack.dst_port = syn.repr.src_port;
    syn_ack.seq = SeqNumber(REMOTE_ISN);
    syn_ack.ack = Some(SeqNumber(LOCAL_ISN) + 1);
    syn_ack.flags = syn.repr.flags | netdriver::wire::tcp::TcpFlags::ACK;
    syn_ack.options = Default::default();
    let t1 = T0 + ms(10);
    conn.handle_segment(t1, &syn_ack, &[]);
    assert_eq!(conn.state(), State::Established);
    while conn.poll_transmit(t1, &mut buf).is_some() {}
    assert_eq!(conn.poll_timeout(), Some(t1 + ms(10_000)));
}

// ---- MSS clamp ----

/// An MSS clamp set on an open connection lowers the size of later segments; removing it
/// restores the negotiated size.
#[test]
fn mss_clamp_lowers_later_segments() {
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    assert_eq!(t.conn.send_mss(), 1000);
    let d = data(3000);
    t.app_send(&d[..1000]);
    t.expect(t.out().payload(&d[..1000]));
    t.expect_none();
    t.conn.set_mss_clamp(Some(400));
    assert_eq!(t.conn.mss_clamp(), Some(400));
    assert_eq!(t.conn.send_mss(), 400);
    t.app_send(&d[1000..2000]);
    t.expect(t.out().seq(l(1000)).payload(&d[1000..1400]));
    t.expect(t.out().seq(l(1400)).payload(&d[1400..1800]));
    t.expect(t.out().seq(l(1800)).payload(&d[1800..2000]));
    t.expect_none();
    t.conn.set_mss_clamp(None);
    assert_eq!(t.conn.send_mss(), 1000);
    t.app_send(&d[2000..3000]);
    t.expect(t.out().seq(l(2000)).payload(&d[2000..3000]));
    t.expect_none();
    // A clamp below 64 counts as 64.
    t.conn.set_mss_clamp(Some(1));
    assert_eq!(t.conn.send_mss(), 64);
}

/// Set before the SYN goes out, the clamp also lowers the MSS we advertise.
#[test]
fn mss_clamp_before_the_syn_lowers_the_advertised_mss() {
    let mut conn = Connection::connect(
        test_config(),
        local_addr(),
        remote_addr(),
        SeqNumber(LOCAL_ISN),
        T0,
    );
    conn.set_mss_clamp(Some(1200));
    let mut buf = [0u8; 64];
    let syn = conn.poll_transmit(T0, &mut buf).expect("a SYN");
    assert_eq!(syn.repr.options.mss, Some(1200));
}

// ---- buffer sizes ----

/// Grown while full and wrapped, the send buffer takes more data at once, and every byte
/// goes out once, in order.
#[test]
fn send_buffer_grows_with_queued_data_intact() {
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    assert_eq!(t.conn.send_capacity(), BUF);
    let d = data(40_000);
    let mut sent = Vec::new();
    t.app_send(&d[..BUF]);
    for s in t.drain() {
        sent.extend_from_slice(&s.payload);
    }
    assert_eq!(sent.len(), 10_000, "the initial window");
    t.send(t.seg().ack(l(10_000)));
    // Fill the buffer again before the next poll: its bytes now wrap around the ring.
    t.app_send(&d[BUF..BUF + 10_000]);
    assert_eq!(t.conn.send(b"x"), Err(TcpError::WouldBlock));
    assert_eq!(t.conn.set_send_buffer(40_000), 40_000);
    assert_eq!(t.conn.send_capacity(), 40_000);
    assert_eq!(t.conn.send_free(), 40_000 - BUF);
    t.app_send(&d[BUF + 10_000..]);
    // 6384 unacknowledged + 10 000 + 13 616 queued.
    assert_eq!(t.conn.send_queue(), 30_000);
    for _ in 0..10 {
        for s in t.drain() {
            sent.extend_from_slice(&s.payload);
        }
        t.send(t.seg().ack(l(sent.len())));
    }
    assert_eq!(sent.len(), d.len());
    assert!(sent == d, "bytes sent differ from bytes queued");
    assert_eq!(t.stats().bytes_acked, 40_000);
    // Shrinking keeps what is queued: nothing is now, so it takes effect in full.
    assert_eq!(t.conn.set_send_buffer(5000), 5000);
    assert_eq!(t.conn.send_capacity(), 5000);
}

/// Shrinking the send buffer stops at the bytes queued.
#[test]
fn send_buffer_shrinks_no_further_than_what_is_queued() {
    let mut t = Tcb::new();
    let d = data(12_000);
    t.app_send(&d);
    assert_eq!(t.conn.set_send_buffer(1000), 12_000);
    assert_eq!(t.conn.send_free(), 0);
    t.drain();
    t.send(t.seg().ack(l(10_000)));
    assert_eq!(t.conn.set_send_buffer(1000), 2000);
}

/// Grown on an open connection, the receive buffer opens the window at once (a window
/// update goes out), and the peer may fill the new room.
#[test]
fn recv_buffer_grows_and_the_window_opens() {
    let mut t = Tcb::new();
    let d = data(21_000);
    t.send(t.seg().payload(&d[..1000]));
    t.expect(t.out().ack(r(1000)).win((BUF - 1000) as u16));
    t.expect_none();
    assert_eq!(t.conn.set_recv_buffer(32_768), 32_768);
    assert_eq!(t.conn.recv_capacity(), 32_768);
    // RFC 9293 §3.8.6.2.2: the right edge moves by far more than an MSS: update.
    t.expect(t.out().ack(r(1000)).win(32_768 - 1000));
    t.expect_none();
    for i in 1..21 {
        t.send(
            t.seg()
                .seq(r(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
        t.expect(
            t.out()
                .ack(r((i + 1) * 1000))
                .win((32_768 - (i + 1) * 1000) as u16),
        );
    }
    t.expect_none();
    assert_eq!(t.stats().recv_queue, 21_000, "beyond the old 16 KiB buffer");
    // Shrinking never retracts the window promised: 21 000 unread plus 11 768 promised.
    assert_eq!(t.conn.set_recv_buffer(1000), 32_768);
    assert_eq!(t.app_recv(30_000), d);
    // Read: only the promised window is left to keep.
    assert_eq!(t.conn.set_recv_buffer(1000), 32_768 - 21_000);
    assert_eq!(t.conn.recv_capacity(), 11_768);
}

/// Before our SYN goes out, the window scale we offer follows the new receive buffer.
#[test]
fn recv_buffer_set_before_the_syn_picks_the_window_scale() {
    let mut conn = Connection::connect(
        test_config(),
        local_addr(),
        remote_addr(),
        SeqNumber(LOCAL_ISN),
        T0,
    );
    assert_eq!(conn.set_recv_buffer(1 << 20), 1 << 20);
    let mut buf = [0u8; 64];
    let syn = conn.poll_transmit(T0, &mut buf).expect("a SYN");
    // 2^20 >> 4 = 65536 does not fit 16 bits; >> 5 does.
    assert_eq!(syn.repr.options.window_scale, Some(5));
    assert_eq!(syn.repr.window, 65535);
    // Once the SYN is out the offered scale is fixed (RFC 7323 §2.2): its
    // retransmission offers the same one, however large the buffer grows.
    assert_eq!(conn.set_recv_buffer(1 << 24), 1 << 24);
    conn.handle_timeout(T0 + ms(200));
    let again = conn
        .poll_transmit(T0 + ms(200), &mut buf)
        .expect("SYN again");
    assert!(again.repr.flags.syn());
    assert_eq!(again.repr.options.window_scale, Some(5));
}

// ---- batches (what a channel hands its thread) ----

/// A batch applies every field it sets, as the setters would, and leaves the rest.
#[test]
fn option_batch_applies_each_field_it_sets() {
    let mut t = Tcb::new();
    let t1 = t.now;
    let mut changes = OptionChanges::new()
        .send_buffer(BUF * 2)
        .keepalive(Some(ms(1000)));
    changes.merge(
        OptionChanges::new()
            .mss_clamp(Some(500))
            .user_timeout(ms(7000))
            .keepalive_interval(Some(ms(100)))
            .keepalive_probes(1),
    );
    assert!(!changes.is_empty());
    let now = t.now;
    t.conn.apply_options(now, &changes);
    assert_eq!(t.conn.send_capacity(), BUF * 2);
    assert_eq!(t.conn.recv_capacity(), BUF, "not in the batch: unchanged");
    assert_eq!(t.conn.send_mss(), 500);
    assert_eq!(t.conn.user_timeout(), ms(7000));
    assert_eq!(t.conn.keepalive(), (Some(ms(1000)), Some(ms(100)), 1));
    assert_eq!(t.fire(), t1 + ms(1000));
    t.expect(t.out().seq(SeqNumber(LOCAL_ISN)));
    assert_eq!(t.fire(), t1 + ms(1100));
    assert_eq!(
        t.conn.error(),
        Some(TcpError::TimedOut),
        "one probe allowed"
    );
    // An empty batch changes nothing.
    assert!(OptionChanges::new().is_empty());
}
