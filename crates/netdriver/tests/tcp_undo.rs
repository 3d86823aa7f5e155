//! Undo of spurious fast recoveries: D-SACK for every retransmission of the episode
//! (RFC 2883 §4, Linux's undo) and timestamps (Eifel, RFC 3522) restore the congestion
//! state saved before the reduction; partial evidence does not.

mod tcp_support_b;

use netdriver::tcp::Config;
use tcp_support_b::*;

/// Ten segments sent at once, the first acknowledged 10 ms later (cwnd 11000), then
/// segments 2-4 SACKed: RACK deems segment 1 lost (reo_wnd 0 with three SACKed) and
/// retransmits it; ssthresh 4500.
fn spurious_setup(config: Config, peer: PeerOpts) -> (Tcb, Vec<u8>) {
    let mut t = Tcb::established(config, peer);
    t.conn.set_nodelay(true);
    let d = data(10_000);
    t.app_send(&d);
    t.expect_full_segments(&d, 0..10);
    t.expect_none();
    t.advance(ms(10));
    t.send(t.seg().ack(l(1000)));
    t.expect_none();
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(5000))]));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_none();
    let s = t.stats();
    assert_eq!((s.fast_retransmits, s.ssthresh), (1, 4500));
    (t, d)
}

#[test]
fn dsack_of_the_only_retransmission_restores_cwnd_and_ssthresh() {
    let (mut t, _) = spurious_setup(test_config(), PeerOpts::default());
    // Segment 1 was only delayed: it arrives, then its retransmission is reported as a
    // duplicate along with the full ACK.
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)).sack(&[(l(1000), l(2000))]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.spurious_recoveries_undone, 1);
    assert_eq!(s.ssthresh, usize::MAX, "ssthresh as before the episode");
    assert_eq!(s.cwnd, 11_000, "cwnd as before the episode");
    // The restored window is usable at once: eleven segments go out.
    let more = data(11_000);
    t.app_send(&more);
    for i in 0..11 {
        t.expect(
            t.out()
                .seq(l(10_000 + i * 1000))
                .payload(&more[i * 1000..(i + 1) * 1000]),
        );
    }
    t.expect_none();
}

#[test]
fn dsack_of_part_of_the_retransmissions_does_not_undo() {
    let (mut t, d) = spurious_setup(test_config(), PeerOpts::default());
    // Segment 5 is lost as well: with 6-9 SACKed it is resent too.
    t.advance(ms(1));
    t.send(
        t.seg()
            .ack(l(1000))
            .sack(&[(l(6000), l(10_000)), (l(2000), l(5000))]),
    );
    t.expect(t.out().seq(l(5000)).payload(&d[5000..6000]));
    t.expect_none();
    // Only segment 1's retransmission is reported duplicate.
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)).sack(&[(l(1000), l(2000))]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.spurious_recoveries_undone, 0);
    assert_eq!((s.cwnd, s.ssthresh), (4500, 4500));
}

#[test]
fn a_dsack_outside_the_episode_does_not_undo() {
    let (mut t, _) = spurious_setup(test_config(), PeerOpts::default());
    // A duplicate of segment 0, acknowledged before the episode started.
    t.send(t.seg().ack(l(1000)).sack(&[(l(0), l(1000))]));
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    let s = t.stats();
    assert_eq!(s.spurious_recoveries_undone, 0);
    assert_eq!((s.cwnd, s.ssthresh), (4500, 4500));
}

#[test]
fn undo_can_be_disabled() {
    let config = Config {
        undo: false,
        ..test_config()
    };
    let (mut t, _) = spurious_setup(config, PeerOpts::default());
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)).sack(&[(l(1000), l(2000))]));
    let s = t.stats();
    assert_eq!(s.spurious_recoveries_undone, 0);
    assert_eq!((s.cwnd, s.ssthresh), (4500, 4500));
}

/// Peer options with timestamps and an MSS that leaves 1000-byte segments beside them.
fn ts_peer() -> PeerOpts {
    PeerOpts {
        mss: Some(1012),
        ..PeerOpts::with_ts()
    }
}

/// TSval the connection puts on segments sent at `t.now` (milliseconds, offset 0).
fn tsval_now(t: &Tcb) -> u32 {
    t.now.total_millis() as u32
}

#[test]
fn eifel_ack_echoing_the_original_undoes() {
    let mut t = Tcb::established(test_config(), ts_peer());
    t.conn.set_nodelay(true);
    let d = data(10_000);
    t.app_send(&d);
    let original_ts = tsval_now(&t);
    for i in 0..10 {
        t.expect(
            t.out()
                .seq(l(i * 1000))
                .payload(&d[i * 1000..(i + 1) * 1000]),
        );
    }
    t.advance(ms(10));
    let peer_ts = |t: &Tcb| t.seg().repr.options.timestamp.unwrap().0;
    t.send(t.seg().ack(l(1000)).ts(peer_ts(&t), original_ts));
    t.send(
        t.seg()
            .ack(l(1000))
            .sack(&[(l(2000), l(5000))])
            .ts(peer_ts(&t), original_ts),
    );
    let rtx_ts = tsval_now(&t);
    assert_eq!(rtx_ts, original_ts + 10, "TSvals tick in ms");
    let rtx = t.poll().expect("the retransmission");
    assert_eq!(rtx.repr.seq, l(1000));
    assert_eq!(rtx.repr.options.timestamp.unwrap().0, rtx_ts);
    t.expect_none();
    assert_eq!(t.stats().ssthresh, 4500);
    // The original of segment 1 arrives (it was delayed): the ACK echoes its TSval,
    // older than the retransmission's (RFC 3522 §3).
    t.advance(ms(2));
    t.send(t.seg().ack(l(10_000)).ts(peer_ts(&t), original_ts));
    let s = t.stats();
    assert_eq!(s.spurious_recoveries_undone, 1);
    assert_eq!((s.cwnd, s.ssthresh), (11_000, usize::MAX));
}

#[test]
fn eifel_ack_echoing_the_retransmission_keeps_the_reduction() {
    let mut t = Tcb::established(test_config(), ts_peer());
    t.conn.set_nodelay(true);
    let d = data(10_000);
    t.app_send(&d);
    let original_ts = tsval_now(&t);
    t.drain();
    t.advance(ms(10));
    let peer_ts = |t: &Tcb| t.seg().repr.options.timestamp.unwrap().0;
    t.send(t.seg().ack(l(1000)).ts(peer_ts(&t), original_ts));
    t.send(
        t.seg()
            .ack(l(1000))
            .sack(&[(l(2000), l(5000))])
            .ts(peer_ts(&t), original_ts),
    );
    let rtx_ts = tsval_now(&t);
    assert_eq!(t.drain().len(), 1);
    // The retransmission filled the hole: its TSval is echoed.
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)).ts(peer_ts(&t), rtx_ts));
    let s = t.stats();
    assert_eq!(s.spurious_recoveries_undone, 0);
    assert_eq!((s.cwnd, s.ssthresh), (4500, 4500));
}

#[test]
fn eifel_is_not_applied_when_the_retransmission_shares_the_originals_millisecond() {
    let us = netdriver::time::Duration::from_micros;
    let mut t = Tcb::established(test_config(), ts_peer());
    t.conn.set_nodelay(true);
    let d = data(10_000);
    t.app_send(&d);
    let original_ts = tsval_now(&t);
    t.drain();
    // A µs-scale path: segment 0 is acknowledged after 200 µs, segments 2-4 SACKed
    // 100 µs later, and RACK retransmits segment 1 at once, in the same millisecond.
    let peer_ts = |t: &Tcb| t.seg().repr.options.timestamp.unwrap().0;
    t.advance(us(200));
    t.send(t.seg().ack(l(1000)).ts(peer_ts(&t), original_ts));
    t.advance(us(100));
    t.send(
        t.seg()
            .ack(l(1000))
            .sack(&[(l(2000), l(5000))])
            .ts(peer_ts(&t), original_ts),
    );
    let rtx = t.poll().expect("the retransmission");
    assert_eq!(rtx.repr.seq, l(1000));
    assert_eq!(rtx.repr.options.timestamp.unwrap().0, original_ts);
    t.expect_none();
    assert_eq!(t.stats().ssthresh, 4500);
    // The echo of the original's TSval is also the retransmission's: which copy arrived
    // cannot be told, so the reduction stays (RFC 3522 needs an older echo).
    t.advance(us(300));
    t.send(t.seg().ack(l(10_000)).ts(peer_ts(&t), original_ts));
    let s = t.stats();
    assert_eq!(s.spurious_recoveries_undone, 0);
    assert_eq!((s.cwnd, s.ssthresh), (4500, 4500));
}
