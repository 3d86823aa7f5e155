//! Forged segments that pass the sequence check but not the ACK check (RFC 5961 §5.2) or
//! carry no ACK at all (RFC 9293 §3.10.7.4 fifth step) are dropped without a trace: they
//! must not move TS.Recent (RFC 7323 §4.3), or every genuine segment after them fails PAWS
//! and the connection stalls for good, and they must not count as a sign of life for the
//! keep-alive, persist or user timers.
//!
//! The harness peer's SYN-ACK carries TSval 5000, so TS.Recent starts at 5000; a forged
//! TSval of 5000 + 10^6 lies a quarter of an hour in the peer's future.

mod tcp_support_b;

use netdriver::tcp::{Config, State, TcpError};
use netdriver::wire::tcp::{TcpFlags, TcpRepr};
use tcp_support_b::*;

const FORGED_TSVAL: u32 = 5000 + 1_000_000;

fn ts_tcb(config: Config) -> Tcb {
    let t = Tcb::established(config, PeerOpts::with_ts());
    assert!(t.ts);
    assert_eq!(t.ts_recent, 5000);
    t
}

/// Genuine data after a forged segment: accepted, acknowledged with the genuine TSval
/// echoed, readable; nothing rejected by PAWS.
#[track_caller]
fn genuine_data_still_flows(t: &mut Tcb) {
    t.advance(ms(1));
    let d = data(100);
    t.send(t.seg().payload(&d));
    t.expect(t.out().ack(r(100)).win(t.window_for(BUF - 100)));
    t.expect_none();
    assert_eq!(t.app_recv(200), d);
    assert_eq!(t.stats().paws_rejected, 0);
}

#[test]
fn a_segment_without_ack_and_a_future_tsval_leaves_ts_recent_alone() {
    let mut t = ts_tcb(test_config());
    t.advance(ms(1));
    // Overlaps RCV.NXT (acceptable by sequence), no ACK bit: dropped (§3.10.7.4).
    let forged = t
        .seg()
        .seq(r(0) - 10)
        .payload(&[0xee; 20])
        .no_ack()
        .ts(FORGED_TSVAL, 0);
    t.send(forged);
    t.ts_recent = 5000;
    t.expect_none();
    assert_eq!(t.conn.recv_queue(), 0);
    genuine_data_still_flows(&mut t);
}

#[test]
fn a_segment_acking_unsent_data_with_a_future_tsval_leaves_ts_recent_alone() {
    let mut t = ts_tcb(test_config());
    t.advance(ms(1));
    let forged = t
        .seg()
        .seq(r(0) - 10)
        .payload(&[0xee; 20])
        .ack(l(50_000))
        .ts(FORGED_TSVAL, 0);
    t.send(forged);
    t.ts_recent = 5000;
    // RFC 5961 §5.2: a challenge ACK echoing the genuine TS.Recent; the data is not taken.
    t.expect(t.out());
    t.expect_none();
    assert_eq!(t.conn.recv_queue(), 0);
    genuine_data_still_flows(&mut t);
}

#[test]
fn a_segment_with_a_too_old_ack_and_a_future_tsval_leaves_ts_recent_alone() {
    let mut t = ts_tcb(test_config());
    t.advance(ms(1));
    let forged = t
        .seg()
        .payload(&[0xee; 20])
        .ack(l(0) - 200_000)
        .ts(FORGED_TSVAL, 0);
    t.send(forged);
    t.ts_recent = 5000;
    t.expect(t.out());
    t.expect_none();
    assert_eq!(t.conn.recv_queue(), 0);
    genuine_data_still_flows(&mut t);
}

/// Linux's bound (`tcp_ack`: MAX.SND.WND, but no more than the bytes acknowledged so far):
/// an ACK below the first byte we ever sent cannot come from the peer, however large its
/// window, so a blind ACK right after the handshake must hit [SND.UNA, SND.NXT].
#[test]
fn an_ack_below_the_first_byte_sent_is_challenged() {
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    t.advance(ms(1));
    t.send(t.seg().payload(&[1; 10]).ack(l(0) - 1));
    t.expect(t.out());
    t.expect_none();
    assert_eq!(
        t.conn.recv_queue(),
        0,
        "the data of a too-old ACK is dropped"
    );

    // Once 1000 bytes are acknowledged, an ACK up to 1000 bytes old is acceptable (a
    // reordered one), one below the first byte is not.
    let d = data(1000);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    t.send(t.seg().ack(l(1000)));
    t.expect_none();
    t.send(t.seg().payload(&[2; 10]).ack(l(0)));
    t.expect(t.out().seq(l(1000)).ack(r(10)).win(t.window_for(BUF - 10)));
    t.send(t.seg().seq(r(10)).payload(&[3; 10]).ack(l(0) - 1));
    t.expect(t.out().seq(l(1000)).ack(r(10)).win(t.window_for(BUF - 10)));
    t.expect_none();
    assert_eq!(t.app_recv(100), vec![2; 10]);
}

/// A forged segment in the middle of keep-alive probing neither restarts the idle clock
/// nor forgives the unanswered probes: a dead peer is detected on time.
#[test]
fn a_forged_segment_does_not_answer_a_keepalive_probe() {
    let mut t = Tcb::established(
        Config {
            keepalive: Some(ms(10_000)),
            keepalive_interval: Some(ms(1_000)),
            keepalive_probes: 2,
            ..test_config()
        },
        PeerOpts::default(),
    );
    let start = t.now;
    assert_eq!(t.fire(), start + ms(10_000));
    t.expect(t.out().seq(l(0) - 1));
    t.expect_none();
    let next = t.deadline();
    assert_eq!(next, start + ms(11_000));
    t.advance(ms(500));
    // In window, but acknowledging data never sent: a challenge ACK, nothing else.
    t.send(t.seg().ack(l(7_000)));
    t.expect(t.out());
    t.expect_none();
    assert_eq!(
        t.deadline(),
        next,
        "the forged segment restarted keep-alive"
    );
    assert_eq!(t.fire(), start + ms(11_000));
    t.expect(t.out().seq(l(0) - 1));
    assert_eq!(t.fire(), start + ms(12_000));
    assert_eq!(t.conn.error(), Some(TcpError::TimedOut));
}

/// The same for zero-window probes: a forged segment is not the receiver's answer, so the
/// user timeout still ends a connection whose peer stopped answering.
#[test]
fn a_forged_segment_does_not_answer_a_zero_window_probe() {
    let config = Config {
        user_timeout: ms(1000),
        ..test_config()
    };
    let mut t = Tcb::established(
        config,
        PeerOpts {
            window: 0,
            ..PeerOpts::default()
        },
    );
    t.conn.set_nodelay(true);
    let t1 = t.now;
    let d = data(100);
    t.app_send(&d);
    t.expect_none();
    assert_eq!(t.fire(), t1 + ms(200));
    t.expect(t.out().seq(l(0)).payload(&d[..1]));
    t.expect_none();
    t.advance(ms(100));
    t.send(t.seg().ack(l(5_000)).win(0));
    // The challenge ACK (at SND.UNA and at SND.NXT while the probe octet is out).
    let acks = t.drain();
    assert!(!acks.is_empty());
    assert!(acks
        .iter()
        .all(|s| s.payload.is_empty() && s.repr.ack == Some(r(0))));
    assert_eq!(t.fire(), t1 + ms(600));
    t.expect(t.out().seq(l(0)).payload(&d[..1]));
    t.expect_none();
    // As without the forged segment: 1200 ms after the first unanswered probe.
    assert_eq!(t.fire(), t1 + ms(1400));
    assert_eq!(t.conn.state(), State::Closed);
    assert_eq!(t.conn.error(), Some(TcpError::TimedOut));
}

/// TIME-WAIT: RFC 6191 compares a new SYN's TSval with TS.Recent, so a forged segment
/// that raised it would refuse the peer's reconnection until TIME-WAIT ends. Only the
/// peer's own FIN acknowledging ours (or a bare ACK at RCV.NXT) moves it there.
#[test]
fn a_forged_segment_in_time_wait_does_not_refuse_the_next_syn() {
    let mut t = ts_tcb(test_config());
    t.conn.close();
    t.expect(t.out().flags(TcpFlags::FIN));
    t.advance(ms(1));
    t.send(t.seg().ack(l(1)).flags(TcpFlags::FIN));
    assert_eq!(t.conn.state(), State::TimeWait);
    t.expect(t.out().seq(l(1)).ack(r(1)));
    t.advance(ms(1));
    for forged in [
        t.seg().no_ack().ts(FORGED_TSVAL, 0),
        t.seg().ack(l(9_000)).ts(FORGED_TSVAL, 0),
        t.seg().seq(r(0) - 5000).ack(l(1)).ts(FORGED_TSVAL, 0),
    ] {
        t.send(forged);
        t.drain();
    }
    t.advance(ms(1));
    let elapsed = (t.now - T0).as_millis() as u32;
    let syn = TcpRepr {
        flags: TcpFlags::SYN,
        ack: None,
        seq: r(100_000),
        ..t.seg().ts(5000 + elapsed, 0).repr
    };
    assert!(
        t.conn.accepts_new_syn_in_time_wait(&syn),
        "the peer's new SYN was refused after a forged segment"
    );
    // The peer's own retransmitted FIN does move TS.Recent.
    t.send(
        t.seg()
            .ack(l(1))
            .flags(TcpFlags::FIN)
            .ts(5000 + elapsed + 10, 0),
    );
    assert!(!t.conn.accepts_new_syn_in_time_wait(&syn));
}
