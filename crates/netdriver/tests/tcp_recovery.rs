//! Loss recovery: fast retransmit (RFC 5681 §3.2), NewReno partial ACKs (RFC 6582) without
//! SACK, SACK-based recovery (RFC 6675), and the SACK blocks we emit (RFC 2018 §4).

mod tcp_support_b;

use netdriver::tcp::Config;
use tcp_support_b::*;

/// Established with SACK per `peer`, nodelay, 10 full segments (10000 bytes, the initial
/// window) in flight, and the first one acknowledged so that cwnd = 11000 and
/// FlightSize = 9000.
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
    assert_eq!(t.stats().bytes_in_flight, 9000);
    (t, d)
}

#[test]
fn fast_retransmit_on_third_duplicate_ack() {
    let (mut t, d) = ten_in_flight(test_config(), PeerOpts::no_sack());
    t.send(t.seg().ack(l(1000)));
    t.expect_none();
    t.send(t.seg().ack(l(1000)));
    t.expect_none();
    assert_eq!(t.stats().fast_retransmits, 0);
    t.send(t.seg().ack(l(1000)));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.fast_retransmits, 1);
    assert_eq!(s.retransmitted_segments, 1);
    assert_eq!(s.rto_timeouts, 0);
    // RFC 5681 eq. (4): ssthresh = max(FlightSize / 2, 2 * SMSS).
    assert_eq!(s.ssthresh, 4500);
}

#[test]
fn two_duplicate_acks_do_not_retransmit() {
    let (mut t, _) = ten_in_flight(test_config(), PeerOpts::no_sack());
    for _ in 0..2 {
        t.send(t.seg().ack(l(1000)));
        t.expect_none();
    }
    assert_eq!(t.stats().fast_retransmits, 0);
    assert_eq!(t.stats().ssthresh, usize::MAX);
}

#[test]
fn dup_ack_threshold_is_configurable() {
    let config = Config {
        dup_ack_threshold: 2,
        ..test_config()
    };
    let (mut t, d) = ten_in_flight(config, PeerOpts::no_sack());
    t.send(t.seg().ack(l(1000)));
    t.expect_none();
    t.send(t.seg().ack(l(1000)));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    assert_eq!(t.stats().fast_retransmits, 1);
}

#[test]
fn acks_that_change_the_window_or_carry_data_are_not_duplicates() {
    // RFC 5681 §2 "DUPLICATE ACKNOWLEDGMENT": no data, same window, same ack.
    let (mut t, _) = ten_in_flight(test_config(), PeerOpts::no_sack());
    t.send(t.seg().ack(l(1000)).win(60_000));
    t.send(t.seg().ack(l(1000)).win(50_000));
    t.send(t.seg().ack(l(1000)).payload(b"hello"));
    let out = t.drain();
    assert_eq!(t.stats().fast_retransmits, 0);
    assert!(
        out.iter().all(|s| s.payload.is_empty()),
        "no retransmission"
    );
}

#[test]
fn recovery_does_not_retransmit_again_on_more_dup_acks() {
    let (mut t, d) = ten_in_flight(test_config(), PeerOpts::no_sack());
    for _ in 0..2 {
        t.send(t.seg().ack(l(1000)));
    }
    t.send(t.seg().ack(l(1000)));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    for _ in 0..5 {
        t.send(t.seg().ack(l(1000)));
        t.expect_none();
    }
    assert_eq!(t.stats().fast_retransmits, 1);
    assert_eq!(t.stats().retransmitted_segments, 1);
}

#[test]
fn full_ack_exits_recovery_with_cwnd_at_ssthresh() {
    let (mut t, d) = ten_in_flight(test_config(), PeerOpts::no_sack());
    for _ in 0..3 {
        t.send(t.seg().ack(l(1000)));
    }
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.ssthresh, 4500);
    assert_eq!(s.cwnd, 4500, "RFC 6582 §3.2 step 3: cwnd = ssthresh");
    assert_eq!(s.bytes_in_flight, 0);
    assert_eq!(t.conn.send_queue(), 0);
}

#[test]
fn newreno_partial_ack_retransmits_next_hole_at_once() {
    // Segments 1 and 4 lost. After the fast retransmit of 1, the partial ACK up to 4
    // retransmits 4 immediately (RFC 6582 §3.2 step 4), without three more dup ACKs.
    let (mut t, d) = ten_in_flight(test_config(), PeerOpts::no_sack());
    for _ in 0..3 {
        t.send(t.seg().ack(l(1000)));
    }
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_none();
    t.advance(ms(10));
    t.send(t.seg().ack(l(4000)));
    t.expect(t.out().seq(l(4000)).payload(&d[4000..5000]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.retransmitted_segments, 2);
    assert_eq!(
        s.ssthresh, 4500,
        "a partial ACK does not reduce ssthresh again"
    );
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    t.expect_none();
    assert_eq!(t.stats().cwnd, 4500);
    assert_eq!(t.stats().retransmitted_segments, 2);
}

#[test]
fn sack_recovery_retransmits_the_first_hole() {
    let (mut t, d) = ten_in_flight(test_config(), PeerOpts::default());
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(3000))]));
    t.expect_none();
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(4000))]));
    t.expect_none();
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(5000))]));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_none();
    assert_eq!(t.stats().fast_retransmits, 1);
    assert_eq!(t.stats().ssthresh, 4500);
    // Everything else arrives: the hole was the only one, nothing else is resent.
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(10_000))]));
    t.expect_none();
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.retransmitted_segments, 1);
    assert_eq!(s.cwnd, 4500);
    assert_eq!(s.ssthresh, 4500);
}

#[test]
fn sack_recovery_retransmits_holes_in_order_once_each_is_lost() {
    // Segments 1 and 3 lost. RFC 6675: enter on the third dup ACK, retransmit segment 1;
    // segment 3 only counts as lost once more than 2 * SMSS above it are SACKed, and is
    // sent once cwnd - pipe >= SMSS. New data never goes before a lost hole.
    let (mut t, d) = ten_in_flight(test_config(), PeerOpts::default());
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(3000))]));
    t.send(
        t.seg()
            .ack(l(1000))
            .sack(&[(l(4000), l(5000)), (l(2000), l(3000))]),
    );
    t.expect_none();
    t.send(
        t.seg()
            .ack(l(1000))
            .sack(&[(l(4000), l(6000)), (l(2000), l(3000))]),
    );
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_none(); // pipe = 1000 (rtx) + 1000 (seg 3) + 4000 (segs 6-9) > cwnd 4500
    t.send(
        t.seg()
            .ack(l(1000))
            .sack(&[(l(4000), l(7000)), (l(2000), l(3000))]),
    );
    t.expect_none(); // seg 3 lost now; pipe = 1000 + 3000; cwnd - pipe < SMSS
    t.send(
        t.seg()
            .ack(l(1000))
            .sack(&[(l(4000), l(8000)), (l(2000), l(3000))]),
    );
    t.expect(t.out().seq(l(3000)).payload(&d[3000..4000]));
    t.expect_none();
    assert_eq!(t.stats().retransmitted_segments, 2);
    assert_eq!(t.stats().fast_retransmits, 1);
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    t.expect_none();
    assert_eq!(t.stats().cwnd, 4500);
}

#[test]
fn sack_blocks_outside_the_flight_are_ignored() {
    // RFC 2018 §4 / RFC 6675 §5: blocks below SND.UNA or above SND.NXT are invalid and
    // must not be taken as evidence of loss (SACK-panic class inputs).
    let (mut t, _) = ten_in_flight(test_config(), PeerOpts::default());
    let bogus = [(l(20_000), l(30_000)), (l(0), l(500)), (l(5000), l(4000))];
    t.send(t.seg().ack(l(1000)).sack(&bogus));
    t.send(t.seg().ack(l(1000)).sack(&bogus));
    t.expect_none();
    assert_eq!(t.stats().fast_retransmits, 0);
}

// ---- SACK blocks we emit (RFC 2018 §4) ----

fn ooo_seg(t: &Tcb, d: &[u8], at: usize) -> Seg {
    t.seg().seq(r(at)).payload(&d[at..at + 1000])
}

#[test]
fn emitted_sack_blocks_most_recent_first_at_most_four() {
    let mut t = Tcb::new();
    let d = data(10_000);
    let mut blocks = Vec::new();
    for k in 0..5 {
        let at = 1000 + 2000 * k;
        t.send(ooo_seg(&t, &d, at));
        blocks.insert(0, (r(at), r(at + 1000)));
        blocks.truncate(4);
        t.expect(t.out().ack(r(0)).sack(&blocks));
        t.expect_none();
    }
}

#[test]
fn emitted_sack_blocks_at_most_three_with_timestamps() {
    let mut t = Tcb::established(test_config(), PeerOpts::with_ts());
    let d = data(10_000);
    let mut blocks = Vec::new();
    for k in 0..5 {
        let at = 1000 + 2000 * k;
        t.send(ooo_seg(&t, &d, at));
        blocks.insert(0, (r(at), r(at + 1000)));
        blocks.truncate(3);
        // RFC 7323 §4.3: out-of-order segments do not update TS.Recent, so the echo
        // stays the SYN-ACK's TSval.
        t.expect(t.out().ack(r(0)).ts(0, 5000).sack(&blocks));
        t.expect_none();
    }
}

#[test]
fn emitted_first_block_is_the_one_holding_the_latest_segment() {
    let mut t = Tcb::new();
    let d = data(10_000);
    t.send(ooo_seg(&t, &d, 1000));
    t.expect(t.out().ack(r(0)).sack(&[(r(1000), r(2000))]));
    t.send(ooo_seg(&t, &d, 5000));
    t.expect(
        t.out()
            .ack(r(0))
            .sack(&[(r(5000), r(6000)), (r(1000), r(2000))]),
    );
    // Extends the older block: the merged block comes first.
    t.send(ooo_seg(&t, &d, 2000));
    t.expect(
        t.out()
            .ack(r(0))
            .sack(&[(r(1000), r(3000)), (r(5000), r(6000))]),
    );
    t.expect_none();
}

#[test]
fn emitted_blocks_drop_what_the_cumulative_ack_covers() {
    let mut t = Tcb::new();
    let d = data(10_000);
    for at in [1000, 3000, 5000] {
        t.send(ooo_seg(&t, &d, at));
        t.drain();
    }
    t.send(ooo_seg(&t, &d, 0));
    t.expect(
        t.out()
            .ack(r(2000))
            .win(BUF as u16 - 2000)
            .sack(&[(r(5000), r(6000)), (r(3000), r(4000))]),
    );
    t.expect_none();
}

#[test]
fn no_sack_blocks_when_the_peer_did_not_permit_sack() {
    let mut t = Tcb::established(test_config(), PeerOpts::no_sack());
    let d = data(3000);
    t.send(ooo_seg(&t, &d, 1000));
    t.expect(t.out().ack(r(0)));
    t.expect_none();
}

/// CVE-2019-11477 ("SACK panic") class: a peer spraying many distinct, shifting SACK
/// blocks must not grow the scoreboard or make the sender misbehave; after the final
/// cumulative ACK everything is clean.
#[test]
fn sack_block_spray_is_bounded() {
    let config = Config {
        max_sack_ranges: 4,
        ..test_config()
    };
    let (mut t, _) = ten_in_flight(config, PeerOpts::default());
    let mut emitted = 0;
    for k in 0..300usize {
        let base = 2000 + (k % 7) * 100;
        let blocks: Vec<_> = (0..4)
            .map(|j| {
                let left = base + j * 1900 + (k % 3) * 10;
                (l(left), l((left + 50).min(10_000)))
            })
            .collect();
        t.send(t.seg().ack(l(1000)).sack(&blocks));
        let out = t.drain();
        for s in &out {
            assert!(s.repr.seq >= l(1000) && s.repr.seq < l(10_000));
            assert!(s.payload.len() <= 1000);
        }
        emitted += out.len();
        assert!(t.stats().bytes_in_flight <= 9000);
    }
    // Only the nine unacknowledged segments can be resent before any new ACK; no more
    // than one pass over them.
    assert!(emitted <= 9, "{emitted} retransmissions");
    // Sixteen distinct blocks spread over 8 KB do not fit 4 ranges: what did not is
    // counted.
    assert!(t.stats().sack_ranges_forgotten > 0, "{:?}", t.stats());
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    t.expect_none();
    assert_eq!(t.stats().bytes_in_flight, 0);
    assert_eq!(t.conn.send_queue(), 0);
    assert_eq!(t.conn.poll_timeout(), None);
}

// ---- limited transmit (RFC 3042) ----

/// Established with `peer`, nodelay, 14 segments queued and the initial window (10) sent;
/// segment 0 is lost, so every ACK that follows is a duplicate of l(0).
fn ten_sent_four_queued(config: Config, peer: PeerOpts) -> (Tcb, Vec<u8>) {
    let mut t = Tcb::established(config, peer);
    t.conn.set_nodelay(true);
    let d = data(14_000);
    t.app_send(&d);
    t.expect_full_segments(&d, 0..10);
    t.expect_none();
    t.advance(ms(10));
    (t, d)
}

#[test]
fn limited_transmit_sends_one_new_segment_per_first_two_dup_acks() {
    let (mut t, d) = ten_sent_four_queued(test_config(), PeerOpts::no_sack());
    // RFC 3042 §2: first duplicate ACK, one new segment beyond cwnd.
    t.send(t.seg().ack(l(0)));
    t.expect(t.out().seq(l(10_000)).payload(&d[10_000..11_000]));
    t.expect_none();
    // Second: one more (FlightSize = cwnd + 2·SMSS).
    t.send(t.seg().ack(l(0)));
    t.expect(t.out().seq(l(11_000)).payload(&d[11_000..12_000]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.cwnd, 10_000, "cwnd is not changed by limited transmit");
    assert_eq!(s.limited_transmits, 2);
    assert_eq!(s.bytes_in_flight, 12_000);
    // Third: fast retransmit of the hole, and nothing new: ssthresh = 12000 / 2 and
    // cwnd = ssthresh + 3·SMSS = 9000 is below the 12000 in flight.
    t.send(t.seg().ack(l(0)));
    t.expect(t.out().seq(l(0)).payload(&d[..1000]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.fast_retransmits, 1);
    assert_eq!(s.ssthresh, 6000);
    assert_eq!(s.limited_transmits, 2);
}

#[test]
fn limited_transmit_with_sack_and_its_limits() {
    // With SACK the duplicate ACKs carry blocks; the same two segments go out.
    let (mut t, d) = ten_sent_four_queued(test_config(), PeerOpts::default());
    t.send(t.seg().ack(l(0)).sack(&[(l(1000), l(2000))]));
    t.expect(t.out().seq(l(10_000)).payload(&d[10_000..11_000]));
    t.expect_none();
    t.send(t.seg().ack(l(0)).sack(&[(l(1000), l(3000))]));
    t.expect(t.out().seq(l(11_000)).payload(&d[11_000..12_000]));
    t.expect_none();
    assert_eq!(t.stats().limited_transmits, 2);

    // The peer's window must allow it: a window of exactly the flight lets nothing out.
    let peer = PeerOpts {
        window: 10_000,
        ..PeerOpts::no_sack()
    };
    let (mut t, _) = ten_sent_four_queued(test_config(), peer);
    t.send(t.seg().ack(l(0)));
    t.expect_none();
    assert_eq!(t.stats().limited_transmits, 0);

    // Disabled in the config.
    let config = Config {
        limited_transmit: false,
        ..test_config()
    };
    let (mut t, _) = ten_sent_four_queued(config, PeerOpts::no_sack());
    t.send(t.seg().ack(l(0)));
    t.expect_none();
    t.send(t.seg().ack(l(0)));
    t.expect_none();
    assert_eq!(t.stats().limited_transmits, 0);
}

// ---- D-SACK blocks we emit (RFC 2883) ----

#[test]
fn duplicate_segment_is_reported_in_a_dsack_block() {
    let mut t = Tcb::new();
    let d = data(3000);
    t.send(t.seg().payload(&d[..1000]));
    t.expect(t.out().ack(r(1000)).win(BUF as u16 - 1000));
    t.expect_none();
    // RFC 2883 §4.1.1: the whole segment again (its ACK was lost): the first SACK block
    // reports it, below the cumulative ACK.
    t.send(t.seg().payload(&d[..1000]));
    t.expect(
        t.out()
            .ack(r(1000))
            .win(BUF as u16 - 1000)
            .sack(&[(r(0), r(1000))]),
    );
    t.expect_none();
    assert_eq!(t.stats().dsacks_sent, 1);
    // Reported once: the next ACK has no SACK blocks.
    t.send(t.seg().seq(r(1000)).payload(&d[1000..2000]));
    t.expect(t.out().ack(r(2000)).win(BUF as u16 - 2000));
    t.expect_none();
    // A segment half old, half new: the old half is reported, the new half accepted.
    t.send(t.seg().seq(r(1500)).payload(&d[1500..2500]));
    t.expect(
        t.out()
            .ack(r(2500))
            .win(BUF as u16 - 2500)
            .sack(&[(r(1500), r(2000))]),
    );
    t.expect_none();
    assert_eq!(t.stats().dsacks_sent, 2);
}

#[test]
fn duplicate_out_of_order_segment_dsack_then_its_sack_block() {
    let mut t = Tcb::new();
    let d = data(6000);
    t.send(ooo_seg(&t, &d, 1000));
    t.expect(t.out().ack(r(0)).sack(&[(r(1000), r(2000))]));
    t.send(ooo_seg(&t, &d, 3000));
    t.expect(
        t.out()
            .ack(r(0))
            .sack(&[(r(3000), r(4000)), (r(1000), r(2000))]),
    );
    // RFC 2883 §4.1.2: a duplicate of held out-of-order data: the D-SACK block first,
    // then the SACK block that contains it, then the others.
    t.send(ooo_seg(&t, &d, 1000));
    t.expect(
        t.out()
            .ack(r(0))
            .sack(&[(r(1000), r(2000)), (r(1000), r(2000)), (r(3000), r(4000))]),
    );
    t.expect_none();
    assert_eq!(t.stats().dsacks_sent, 1);
}

#[test]
fn no_dsack_without_sack() {
    let mut t = Tcb::established(test_config(), PeerOpts::no_sack());
    let d = data(1000);
    t.send(t.seg().payload(&d));
    t.expect(t.out().ack(r(1000)).win(BUF as u16 - 1000));
    t.send(t.seg().payload(&d));
    t.expect(t.out().ack(r(1000)).win(BUF as u16 - 1000));
    t.expect_none();
    assert_eq!(t.stats().dsacks_sent, 0);
}
