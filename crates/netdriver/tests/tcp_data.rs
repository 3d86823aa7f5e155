//! Data transfer in ESTABLISHED: exact seq/ack/window of every segment, segmentation,
//! the receive window, out-of-order and duplicate data, the window edge, and the bound on
//! out-of-order state.

mod tcp_support_b;

use netdriver::tcp::{Config, TcpError};
use tcp_support_b::*;

fn config_rx(rx_buffer: usize) -> Config {
    Config {
        rx_buffer,
        ..test_config()
    }
}

// ---- receiving ----

#[test]
fn recv_segment_is_acked_with_exact_ack_and_shrunk_window() {
    let mut t = Tcb::new();
    let d = data(500);
    t.send(t.seg().payload(&d));
    t.expect(t.out().ack(r(500)).win(BUF as u16 - 500));
    t.expect_none();
    assert_eq!(t.conn.recv_queue(), 500);
    assert_eq!(t.app_recv(1000), d);
    assert_eq!(t.conn.recv_queue(), 0);
    assert_eq!(t.stats().bytes_received, 500);
}

#[test]
fn recv_nothing_is_would_block() {
    let mut t = Tcb::new();
    let mut buf = [0u8; 10];
    assert_eq!(t.conn.recv(&mut buf), Err(TcpError::WouldBlock));
}

#[test]
fn recv_window_shrinks_as_data_queues_across_the_wrap() {
    // The peer's ISN is 2^32 - 2000: byte 2000 lies past the wrap.
    let mut t = Tcb::new();
    let d = data(4000);
    for i in 0..4 {
        t.send(
            t.seg()
                .seq(r(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
        t.expect(
            t.out()
                .ack(r((i + 1) * 1000))
                .win((BUF - (i + 1) * 1000) as u16),
        );
    }
    t.expect_none();
    assert_eq!(t.app_recv(10_000), d);
}

#[test]
fn recv_window_reopens_after_the_application_reads() {
    let mut t = Tcb::new();
    let d = data(3100);
    for i in 0..3 {
        t.send(
            t.seg()
                .seq(r(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
        t.expect(
            t.out()
                .ack(r((i + 1) * 1000))
                .win((BUF - (i + 1) * 1000) as u16),
        );
    }
    assert_eq!(t.app_recv(3000), d[..3000]);
    // A window update may or may not be sent right away; if it is, it is exact.
    for s in t.drain() {
        t.check(&s, t.out().ack(r(3000)));
    }
    t.send(t.seg().seq(r(3000)).payload(&d[3000..]));
    t.expect(t.out().ack(r(3100)).win(BUF as u16 - 100));
    t.expect_none();
}

#[test]
fn recv_piggybacks_ack_on_queued_data() {
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    let ours = data(100);
    t.app_send(&ours);
    let theirs = data(500);
    t.send(t.seg().payload(&theirs));
    // One segment carries both our data and the ACK of theirs.
    t.expect(t.out().ack(r(500)).win(BUF as u16 - 500).payload(&ours));
    t.expect_none();
}

#[test]
fn out_of_order_segment_is_held_sacked_and_delivered_when_gap_fills() {
    let mut t = Tcb::new();
    let d = data(2000);
    t.send(t.seg().seq(r(1000)).payload(&d[1000..]));
    // Immediate duplicate ACK with a SACK block for the held bytes; the window is measured
    // from RCV.NXT, so held out-of-order bytes do not shrink it.
    t.expect(t.out().ack(r(0)).sack(&[(r(1000), r(2000))]));
    t.expect_none();
    let mut buf = [0u8; 100];
    assert_eq!(t.conn.recv(&mut buf), Err(TcpError::WouldBlock));
    assert_eq!(t.conn.recv_queue(), 0);

    t.send(t.seg().seq(r(0)).payload(&d[..1000]));
    t.expect(t.out().ack(r(2000)).win(BUF as u16 - 2000));
    t.expect_none();
    assert_eq!(t.conn.recv_queue(), 2000);
    assert_eq!(t.app_recv(4000), d);
}

#[test]
fn out_of_order_segments_fill_several_holes() {
    let mut t = Tcb::new();
    let d = data(5000);
    // Arrival order: 4, 2, 0, 3, 1 (in units of 1000 bytes).
    t.send(t.seg().seq(r(4000)).payload(&d[4000..5000]));
    t.expect(t.out().ack(r(0)).sack(&[(r(4000), r(5000))]));
    t.send(t.seg().seq(r(2000)).payload(&d[2000..3000]));
    t.expect(
        t.out()
            .ack(r(0))
            .sack(&[(r(2000), r(3000)), (r(4000), r(5000))]),
    );
    t.send(t.seg().seq(r(0)).payload(&d[..1000]));
    t.expect(
        t.out()
            .ack(r(1000))
            .win(BUF as u16 - 1000)
            .sack(&[(r(2000), r(3000)), (r(4000), r(5000))]),
    );
    t.send(t.seg().seq(r(3000)).payload(&d[3000..4000]));
    t.expect(
        t.out()
            .ack(r(1000))
            .win(BUF as u16 - 1000)
            .sack(&[(r(2000), r(5000))]),
    );
    t.send(t.seg().seq(r(1000)).payload(&d[1000..2000]));
    t.expect(t.out().ack(r(5000)).win(BUF as u16 - 5000));
    t.expect_none();
    assert_eq!(t.app_recv(10_000), d);
}

#[test]
fn duplicate_segment_is_acked_and_not_delivered_twice() {
    let mut t = Tcb::new();
    let d = data(1000);
    t.send(t.seg().payload(&d));
    t.expect(t.out().ack(r(1000)).win(BUF as u16 - 1000));
    // RFC 9293 §3.10.7.4: an unacceptable (old) segment is answered with an ACK; the
    // peer permitted SACK, so the ACK reports the duplicate in a D-SACK block (RFC 2883).
    t.send(t.seg().payload(&d));
    t.expect(
        t.out()
            .ack(r(1000))
            .win(BUF as u16 - 1000)
            .sack(&[(r(0), r(1000))]),
    );
    t.expect_none();
    assert_eq!(t.conn.recv_queue(), 1000);
    assert_eq!(t.app_recv(5000), d);
}

#[test]
fn overlapping_segment_delivers_only_new_bytes() {
    let mut t = Tcb::new();
    let d = data(1500);
    t.send(t.seg().payload(&d[..1000]));
    t.expect(t.out().ack(r(1000)).win(BUF as u16 - 1000));
    // The duplicated half is reported in a D-SACK block (RFC 2883 §4.1.1).
    t.send(t.seg().seq(r(500)).payload(&d[500..1500]));
    t.expect(
        t.out()
            .ack(r(1500))
            .win(BUF as u16 - 1500)
            .sack(&[(r(500), r(1000))]),
    );
    t.expect_none();
    assert_eq!(t.app_recv(5000), d);
}

#[test]
fn overlapping_out_of_order_segments_merge() {
    let mut t = Tcb::new();
    let d = data(3000);
    t.send(t.seg().seq(r(1000)).payload(&d[1000..2000]));
    t.expect(t.out().ack(r(0)).sack(&[(r(1000), r(2000))]));
    t.send(t.seg().seq(r(1500)).payload(&d[1500..3000]));
    t.expect(t.out().ack(r(0)).sack(&[(r(1000), r(3000))]));
    t.send(t.seg().seq(r(0)).payload(&d[..1200]));
    t.expect(t.out().ack(r(3000)).win(BUF as u16 - 3000));
    assert_eq!(t.app_recv(5000), d);
}

#[test]
fn data_beyond_the_window_is_trimmed() {
    let mut t = Tcb::established(config_rx(4096), PeerOpts::default());
    let d = data(5000);
    for i in 0..4 {
        t.send(
            t.seg()
                .seq(r(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
        t.expect(
            t.out()
                .ack(r((i + 1) * 1000))
                .win((4096 - (i + 1) * 1000) as u16),
        );
    }
    // 96 bytes of window left; the segment carries 1000.
    t.send(t.seg().seq(r(4000)).payload(&d[4000..5000]));
    t.expect(t.out().ack(r(4096)).win(0));
    t.expect_none();
    assert_eq!(t.conn.recv_queue(), 4096);
    assert_eq!(t.app_recv(10_000), d[..4096]);
}

#[test]
fn segment_entirely_beyond_the_window_is_dropped_and_acked() {
    let mut t = Tcb::established(config_rx(4096), PeerOpts::default());
    let d = data(5096);
    t.send(t.seg().seq(r(4096)).payload(&d[4096..]));
    t.expect(t.out().ack(r(0)).win(4096));
    t.expect_none();
    assert_eq!(t.conn.recv_queue(), 0);
    // The dropped bytes were not held: after the window fills and drains, the ACK stops at
    // the window edge instead of jumping over them.
    for i in 0..4 {
        t.send(
            t.seg()
                .seq(r(i * 1024))
                .payload(&d[i * 1024..(i + 1) * 1024]),
        );
        t.expect(
            t.out()
                .ack(r((i + 1) * 1024))
                .win((4096 - (i + 1) * 1024) as u16),
        );
    }
    t.expect_none();
    assert_eq!(t.app_recv(10_000), d[..4096]);
}

#[test]
fn out_of_order_queue_is_bounded_and_excess_is_counted() {
    let config = Config {
        max_ooo_ranges: 4,
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    let d = data(12_000);
    // Six holes: the first four out-of-order ranges are held, the last two dropped.
    for k in 0..6 {
        let at = 1000 + 2000 * k;
        t.send(t.seg().seq(r(at)).payload(&d[at..at + 1000]));
        let acks = t.drain();
        assert_eq!(acks.len(), 1, "one duplicate ACK per segment: {acks:?}");
        assert_eq!(acks[0].repr.ack, Some(r(0)));
        assert!(acks[0].payload.is_empty());
    }
    assert_eq!(t.stats().ooo_dropped, 2);
    assert_eq!(t.conn.recv_queue(), 0);
    // Filling holes 0, 2000, 4000, 6000 joins the four held ranges...
    for k in 0..4 {
        let at = 2000 * k;
        t.send(t.seg().seq(r(at)).payload(&d[at..at + 1000]));
        t.drain();
    }
    t.send(t.seg().seq(r(8000)).payload(&d[8000..9000]));
    // ...but 9000..10000 was dropped, so the ACK stops there.
    t.expect(t.out().ack(r(9000)).win(BUF as u16 - 9000));
    t.expect_none();
    assert_eq!(t.app_recv(20_000), d[..9000]);
}

/// CVE-2018-5390 "SegmentSmack" / CVE-2019-11477 class: a flood of tiny out-of-order
/// segments, each opening a new hole, must not grow the connection's state.
#[test]
fn segment_smack_flood_of_tiny_holes_is_bounded() {
    let mut t = Tcb::new();
    let d = data(4001);
    for k in 0..2000 {
        let at = 2 * k + 1;
        t.send(t.seg().seq(r(at)).payload(&d[at..at + 1]));
        let out = t.drain();
        assert!(
            out.len() <= 1,
            "at most one ACK per segment, got {}",
            out.len()
        );
        assert_eq!(t.conn.recv_queue(), 0);
    }
    // max_ooo_ranges defaults to 512 (sized for the holes of a 100 Gbit/s window): 512
    // held, the rest dropped and counted.
    assert_eq!(t.stats().ooo_ranges, 512);
    assert_eq!(t.stats().ooo_dropped, 2000 - 512);
    t.send(t.seg().seq(r(0)).payload(&d[..1]));
    // Byte 1 was held (the first hole), so filling byte 0 delivers two bytes.
    let acks = t.drain();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].repr.ack, Some(r(2)));
    assert_eq!(acks[0].repr.window, BUF as u16 - 2);
    assert_eq!(t.app_recv(100), d[..2]);
}

// ---- sending ----

#[test]
fn send_single_segment_exact() {
    let mut t = Tcb::new();
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    t.expect_none();
    assert_eq!(t.conn.send_queue(), 100);
    assert_eq!(t.stats().bytes_in_flight, 100);
    t.send(t.seg().ack(l(100)));
    t.expect_none();
    assert_eq!(t.conn.send_queue(), 0);
    assert_eq!(t.stats().bytes_in_flight, 0);
    assert_eq!(t.stats().bytes_acked, 100);
}

#[test]
fn send_is_segmented_at_the_peer_mss_across_the_wrap() {
    // Our ISN is 2^32 - 1000: byte 999 is the last before the wrap.
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    let d = data(3500);
    t.app_send(&d);
    t.expect(t.out().seq(l(0)).payload(&d[..1000]));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect(t.out().seq(l(2000)).payload(&d[2000..3000]));
    t.expect(t.out().seq(l(3000)).payload(&d[3000..]));
    t.expect_none();
    assert_eq!(l(1000).0, 0);
    t.send(t.seg().ack(l(3500)));
    t.expect_none();
    assert_eq!(t.conn.send_queue(), 0);
}

#[test]
fn send_respects_a_smaller_mss_from_our_config() {
    let config = Config {
        mss: 600,
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(1500);
    t.app_send(&d);
    t.expect(t.out().seq(l(0)).payload(&d[..600]));
    t.expect(t.out().seq(l(600)).payload(&d[600..1200]));
    t.expect(t.out().seq(l(1200)).payload(&d[1200..]));
    t.expect_none();
}

#[test]
fn send_without_peer_mss_option_uses_536() {
    // RFC 9293 §3.7.1: absent an MSS option the send MSS is 536.
    let mut t = Tcb::established(
        test_config(),
        PeerOpts {
            mss: None,
            ..PeerOpts::default()
        },
    );
    t.conn.set_nodelay(true);
    let d = data(1000);
    t.app_send(&d);
    t.expect(t.out().seq(l(0)).payload(&d[..536]));
    t.expect(t.out().seq(l(536)).payload(&d[536..]));
    t.expect_none();
}

#[test]
fn send_is_segmented_at_the_payload_buffer_size() {
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    let d = data(1000);
    t.app_send(&d);
    t.expect_with(300, t.out().seq(l(0)).payload(&d[..300]));
    t.expect_with(300, t.out().seq(l(300)).payload(&d[300..600]));
    t.expect_with(300, t.out().seq(l(600)).payload(&d[600..900]));
    t.expect_with(300, t.out().seq(l(900)).payload(&d[900..]));
    t.expect_none();
}

#[test]
fn send_stops_at_the_peer_window_and_resumes_when_it_slides() {
    let mut t = Tcb::established(
        test_config(),
        PeerOpts {
            window: 3000,
            ..PeerOpts::default()
        },
    );
    t.conn.set_nodelay(true);
    let d = data(5000);
    t.app_send(&d);
    for i in 0..3 {
        t.expect(
            t.out()
                .seq(l(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
    }
    t.expect_none();
    t.send(t.seg().ack(l(1000)).win(3000));
    t.expect(t.out().seq(l(3000)).payload(&d[3000..4000]));
    t.expect_none();
    t.send(t.seg().ack(l(4000)).win(3000));
    t.expect(t.out().seq(l(4000)).payload(&d[4000..5000]));
    t.expect_none();
}

#[test]
fn send_is_limited_by_the_initial_window_then_slow_start() {
    // RFC 6928 IW = min(10*MSS, max(2*MSS, 14600)) = 10 segments of 1000; RFC 5681 slow
    // start with RFC 3465 ABC: an ACK of 2000 bytes grows cwnd by 2000.
    let config = Config {
        tx_buffer: 65536,
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(20_000);
    t.app_send(&d);
    for i in 0..10 {
        t.expect(
            t.out()
                .seq(l(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
    }
    t.expect_none();
    assert_eq!(t.stats().cwnd, 10_000);
    assert_eq!(t.stats().bytes_in_flight, 10_000);
    t.advance(ms(10));
    t.send(t.seg().ack(l(2000)));
    assert_eq!(t.stats().cwnd, 12_000);
    for i in 10..14 {
        t.expect(
            t.out()
                .seq(l(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
    }
    t.expect_none();
    assert_eq!(t.stats().bytes_in_flight, 12_000);
}

/// A stretch ACK from a GRO receiver covering 8 segments grows cwnd by all 8
/// (RFC 3465 §2.1 byte counting, bounded by cwnd), not by L = 2 MSS, and the sender fills
/// the grown window at once: 8 segments freed plus 8 of growth.
#[test]
fn stretch_ack_in_slow_start_grows_cwnd_by_every_acked_segment() {
    let config = Config {
        tx_buffer: 65536,
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(40_000);
    t.app_send(&d);
    for i in 0..10 {
        t.expect(
            t.out()
                .seq(l(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
    }
    t.expect_none();
    assert_eq!(t.stats().cwnd, 10_000);
    t.advance(ms(10));
    t.send(t.seg().ack(l(8000)));
    assert_eq!(t.stats().cwnd, 18_000);
    for i in 10..26 {
        t.expect(
            t.out()
                .seq(l(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
    }
    t.expect_none();
    assert_eq!(t.stats().bytes_in_flight, 18_000);
}

#[test]
fn partial_ack_frees_exactly_the_acked_bytes() {
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    let d = data(3000);
    t.app_send(&d);
    assert_eq!(t.drain().len(), 3);
    t.send(t.seg().ack(l(1500)));
    assert_eq!(t.conn.send_queue(), 1500);
    assert_eq!(t.stats().bytes_in_flight, 1500);
    assert_eq!(t.conn.send_capacity(), BUF, "capacity is the buffer size");
    t.expect_none();
}

#[test]
fn send_buffer_is_bounded_by_tx_buffer() {
    let mut t = Tcb::new();
    let d = data(BUF + 1000);
    assert_eq!(t.conn.send_capacity(), BUF);
    assert_eq!(t.conn.send(&d), Ok(BUF));
    assert_eq!(t.conn.send(&d), Err(TcpError::WouldBlock));
    assert_eq!(t.conn.send_queue(), BUF);
}

#[test]
fn ack_for_unsent_data_is_ignored_and_acked() {
    // RFC 9293 §3.10.7.4: SEG.ACK > SND.NXT → send an ACK, drop the segment.
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    t.send(t.seg().ack(l(5000)));
    t.expect(t.out().seq(l(100)));
    t.expect_none();
    assert_eq!(t.conn.send_queue(), 100);
    assert_eq!(t.stats().bytes_in_flight, 100);
}

/// smoltcp #1138 / #995 / #689: sequence numbers mixed up with buffer offsets. Out-of-order
/// data is placed while the receive ring has wrapped (the reader consumed part of it) and
/// the peer's sequence space has wrapped past 2^32; the bytes must come out in order.
#[test]
fn out_of_order_data_placed_correctly_in_a_wrapped_ring_across_seq_wrap() {
    let mut t = Tcb::established(config_rx(4096), PeerOpts::default());
    let d = data(5000);
    for i in 0..3 {
        t.send(
            t.seg()
                .seq(r(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
        t.drain();
    }
    assert_eq!(t.app_recv(2500), d[..2500]);
    for s in t.drain() {
        t.check(&s, t.out().ack(r(3000)).win(3596));
    }
    // Peer byte 2000 was sequence number 0; bytes 3000..5000 wrap the 4096-byte ring.
    t.send(t.seg().seq(r(4000)).payload(&d[4000..5000]));
    t.expect(t.out().ack(r(3000)).win(3596).sack(&[(r(4000), r(5000))]));
    t.send(t.seg().seq(r(3000)).payload(&d[3000..4000]));
    t.expect(t.out().ack(r(5000)).win(1596));
    t.expect_none();
    assert_eq!(t.app_recv(4096), d[2500..]);
}
