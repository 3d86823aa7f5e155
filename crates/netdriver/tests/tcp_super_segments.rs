//! Super-segments (TSO/GSO) and coalesced segments (GRO/LRO), exact-segment.
//!
//! Sending: with [`Config::max_super_segment`] set, one transmit carries what the same
//! calls without it would have sent back to back (whole MSS-sized segments, and a short
//! tail only when it would have gone alone: Nagle and SWS apply to it), while everything
//! accounted per segment (RACK and RTT records, loss marks) stays per wire segment: a loss
//! inside a super-segment is repaired as that one segment, a partial ACK of one moves
//! SND.UNA by what it covers.
//!
//! Receiving: a segment holding several of the peer's segments (a link coalesced them)
//! is data like any other: acknowledged at once (more than two full segments), SACKed
//! whole when out of order, trimmed to the receive buffer when longer than it, and taken
//! whatever MSS we advertised.
//!
//! The peer's MSS is 1000 (the harness's), so a super-segment's pieces are 1000 bytes.

mod tcp_support_b;

use netdriver::tcp::{Config, State};
use netdriver::wire::tcp::TcpFlags;
use tcp_support_b::*;

/// The harness config with super-segments of up to 64 KiB and room for them.
fn super_config() -> Config {
    Config {
        max_super_segment: 65_000,
        tx_buffer: 64 * 1024,
        ..test_config()
    }
}

/// A buffer large enough for any super-segment.
const BIG: usize = 70_000;

#[test]
fn the_initial_window_goes_as_one_super_segment_of_whole_segments() {
    let mut t = Tcb::established(super_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(12_000);
    t.app_send(&d);
    // IW = 10 segments (RFC 6928): one super-segment of ten 1000-byte pieces.
    let mut buf = vec![0u8; BIG];
    let tx = t.conn.poll_transmit(t.now, &mut buf).expect("a segment");
    assert_eq!(tx.payload_len, 10_000);
    assert_eq!(tx.segment_size, 1000);
    assert!(tx.is_super_segment());
    assert_eq!(tx.repr.seq, l(0));
    assert_eq!(&buf[..10_000], &d[..10_000]);
    t.expect_none();
    let s = t.stats();
    assert_eq!((s.super_segments_sent, s.super_segment_pieces), (1, 10));
    assert_eq!(
        s.segments_sent, 3,
        "SYN, the handshake's ACK and the super-segment"
    );
    assert_eq!(s.bytes_in_flight, 10_000);
}

#[test]
fn the_callers_buffer_caps_a_super_segment_at_whole_segments() {
    let mut t = Tcb::established(super_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(12_000);
    t.app_send(&d);
    // A 4096-byte buffer holds four pieces.
    t.expect(t.out().seq(l(0)).payload(&d[..4000]));
    t.expect(t.out().seq(l(4000)).payload(&d[4000..8000]));
    t.expect(t.out().seq(l(8000)).payload(&d[8000..10_000]));
    t.expect_none();
}

#[test]
fn without_the_setting_every_segment_is_one_wire_segment() {
    let mut t = Tcb::established(test_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(3000);
    t.app_send(&d);
    t.expect_with(BIG, t.out().seq(l(0)).payload(&d[..1000]));
    t.expect_with(BIG, t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_with(BIG, t.out().seq(l(2000)).payload(&d[2000..3000]));
    t.expect_none();
    assert_eq!(t.stats().super_segments_sent, 0);
}

#[test]
fn nagle_holds_a_super_segments_short_tail_until_the_ack() {
    let mut t = Tcb::established(super_config(), PeerOpts::default());
    let d = data(3500);
    t.app_send(&d);
    // Alone, the three full segments would go and the 500-byte tail would wait for the
    // ACK (Nagle): the super-segment is exactly those three.
    t.expect_with(BIG, t.out().seq(l(0)).payload(&d[..3000]));
    t.expect_none();
    t.advance(ms(10));
    t.send(t.seg().ack(l(3000)));
    t.expect_with(BIG, t.out().seq(l(3000)).payload(&d[3000..]));
    t.expect_none();
}

#[test]
fn with_nodelay_or_a_fin_next_the_tail_rides_along() {
    let mut t = Tcb::established(super_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(3500);
    t.app_send(&d);
    t.expect_with(BIG, t.out().seq(l(0)).payload(&d));
    t.expect_none();

    let mut t = Tcb::established(super_config(), PeerOpts::default());
    t.app_send(&d);
    t.conn.close();
    t.expect_with(BIG, t.out().seq(l(0)).flags(TcpFlags::FIN).payload(&d));
    t.expect_none();
}

#[test]
fn a_loss_inside_a_super_segment_is_retransmitted_as_that_segment_alone() {
    let mut t = Tcb::established(super_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(10_000);
    t.app_send(&d);
    t.expect_with(BIG, t.out().seq(l(0)).payload(&d));
    t.advance(ms(10));
    // The fourth wire segment was lost; the peer acknowledges the first three and SACKs
    // the six after it: DupThresh SACKed segments, no reordering seen, so RACK marks the
    // hole lost at once (RFC 8985 §6.2). Kept per wire segment, the loss is exactly
    // [3000, 4000).
    t.send(t.seg().ack(l(3000)).sack(&[(l(4000), l(10_000))]));
    t.expect_with(BIG, t.out().seq(l(3000)).payload(&d[3000..4000]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.fast_retransmits, 1);
    assert_eq!(s.retransmitted_segments, 1);
    assert_eq!(s.bytes_sent, 11_000);
    // The retransmission fills the hole: recovery ends with nothing in flight.
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    t.expect_none();
    assert_eq!(t.stats().bytes_in_flight, 0);
}

#[test]
fn two_losses_inside_a_super_segment_are_two_single_retransmissions() {
    let mut t = Tcb::established(super_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(10_000);
    t.app_send(&d);
    t.expect_with(BIG, t.out().seq(l(0)).payload(&d));
    t.advance(ms(10));
    t.send(
        t.seg()
            .ack(l(2000))
            .sack(&[(l(3000), l(5000)), (l(6000), l(10_000))]),
    );
    let sent = t.drain();
    let got: Vec<(u32, usize)> = sent
        .iter()
        .map(|s| (s.repr.seq.0, s.payload.len()))
        .collect();
    assert_eq!(
        got,
        vec![(l(2000).0, 1000), (l(5000).0, 1000)],
        "exactly the two lost wire segments"
    );
    assert_eq!(sent[0].payload, d[2000..3000]);
    assert_eq!(sent[1].payload, d[5000..6000]);
}

#[test]
fn a_partial_ack_of_a_super_segment_frees_what_it_covers_and_cwnd_sends_more() {
    let mut t = Tcb::established(super_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(40_000);
    t.app_send(&d);
    t.expect_with(BIG, t.out().seq(l(0)).payload(&d[..10_000]));
    t.advance(ms(10));
    t.send(t.seg().ack(l(4000)));
    let s = t.stats();
    assert_eq!(s.bytes_acked, 4000);
    assert_eq!(s.bytes_in_flight, 6000);
    assert_eq!(s.retransmitted_segments, 0);
    // Whatever room cwnd has now goes out as whole segments in one super-segment.
    let room = (s.cwnd - s.bytes_in_flight) / 1000 * 1000;
    assert!(room >= 4000, "slow start grew cwnd: {}", s.cwnd);
    t.expect_with(
        BIG,
        t.out().seq(l(10_000)).payload(&d[10_000..10_000 + room]),
    );
    t.expect_none();
}

#[test]
fn after_an_rto_the_resent_flight_grows_back_as_super_segments() {
    let mut t = Tcb::established(super_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(10_000);
    t.app_send(&d);
    t.expect_with(BIG, t.out().seq(l(0)).payload(&d));
    // Nothing comes back: the RTO resends one segment (cwnd = 1 MSS, go-back-N).
    t.fire();
    t.expect_with(BIG, t.out().seq(l(0)).payload(&d[..1000]));
    t.expect_none();
    assert_eq!(t.stats().rto_timeouts, 1);
    // Its ACK doubles cwnd: the next two are resent together, never past SND.MAX.
    t.advance(ms(10));
    t.send(t.seg().ack(l(1000)));
    t.expect_with(BIG, t.out().seq(l(1000)).payload(&d[1000..3000]));
    t.expect_none();
}

/// Config for the receiving tests: delayed ACKs on and no quick-ACK budget, so that an
/// immediate ACK shows the two-full-segments rule.
fn receiving_config() -> Config {
    Config {
        delayed_ack: Some(ms(40)),
        quick_ack_segments: 0,
        ..test_config()
    }
}

#[test]
fn a_coalesced_segment_is_acknowledged_at_once_and_read_whole() {
    let mut t = Tcb::established(receiving_config(), PeerOpts::default());
    let d = data(6000);
    // One segment of 1000 bytes waits for the delayed ACK...
    t.send(t.seg().payload(&d[..1000]));
    t.expect_none();
    // ...a coalesced one of five (longer than our MSS of 1460) means more than two full
    // segments unacknowledged: ACK now, for all of it.
    t.send(t.seg().seq(r(1000)).payload(&d[1000..6000]));
    t.expect(t.out().ack(r(6000)).win(t.window_for(BUF - 6000)));
    t.expect_none();
    assert_eq!(t.app_recv(10_000), d);
    assert_eq!(t.stats().bytes_received, 6000);
}

#[test]
fn an_out_of_order_coalesced_segment_is_sacked_whole_and_a_coalesced_fill_acks_through_it() {
    let mut t = Tcb::established(receiving_config(), PeerOpts::default());
    let d = data(8000);
    t.send(t.seg().seq(r(3000)).payload(&d[3000..8000]));
    t.expect(
        t.out()
            .ack(r(0))
            .win(t.window_for(BUF))
            .sack(&[(r(3000), r(8000))]),
    );
    t.expect_none();
    // The fill overlaps the held range by 1000 bytes: everything up to 8000 is in order.
    t.send(t.seg().payload(&d[..4000]));
    t.expect(t.out().ack(r(8000)).win(t.window_for(BUF - 8000)));
    t.expect_none();
    assert_eq!(t.app_recv(10_000), d);
}

#[test]
fn a_coalesced_segment_longer_than_the_buffer_is_trimmed_to_it_and_its_fin_waits() {
    let mut t = Tcb::established(receiving_config(), PeerOpts::default());
    let d = data(20_000);
    t.send(t.seg().flags(TcpFlags::FIN).payload(&d));
    // Only the buffer's worth is taken; the FIN beyond it is not.
    t.expect(t.out().ack(r(BUF)).win(0));
    t.expect_none();
    assert_eq!(t.app_recv(BUF), d[..BUF]);
    assert_eq!(t.conn.state(), State::Established);
    // The window update, and the rest with its FIN.
    let update = t.drain();
    assert_eq!(update.len(), 1, "{update:?}");
    t.send(t.seg().seq(r(BUF)).flags(TcpFlags::FIN).payload(&d[BUF..]));
    t.expect(
        t.out()
            .ack(r(20_000) + 1)
            .win(t.window_for(BUF - (20_000 - BUF))),
    );
    assert_eq!(t.conn.state(), State::CloseWait);
    assert_eq!(t.app_recv(BUF), d[BUF..]);
}

#[test]
fn a_duplicate_coalesced_segment_is_reported_by_dsack() {
    let mut t = Tcb::established(receiving_config(), PeerOpts::default());
    let d = data(5000);
    t.send(t.seg().payload(&d));
    t.expect(t.out().ack(r(5000)).win(t.window_for(BUF - 5000)));
    // The same five segments again (a retransmission the peer coalesced): D-SACK.
    t.send(t.seg().payload(&d));
    t.expect(
        t.out()
            .ack(r(5000))
            .win(t.window_for(BUF - 5000))
            .sack(&[(r(0), r(5000))]),
    );
    t.expect_none();
    assert_eq!(t.app_recv(10_000), d);
}
