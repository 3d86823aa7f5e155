//! PAWS (RFC 7323 §5.3) and TS.Recent (§4.3): old TSvals are dropped and answered with an
//! ACK, RSTs are exempt, the §5.5 idle rule invalidates TS.Recent, and TS.Recent only
//! follows the segment covering Last.ACK.sent.
//!
//! The harness peer's SYN-ACK carries TSval 5000, so TS.Recent starts at 5000.

mod tcp_support_b;

use netdriver::tcp::{Config, State, TcpError};
use netdriver::wire::tcp::TcpFlags;
use tcp_support_b::*;

fn ts_peer() -> PeerOpts {
    PeerOpts {
        mss: Some(1012),
        ..PeerOpts::with_ts()
    }
}

fn tcb(config: Config) -> Tcb {
    let t = Tcb::established(config, ts_peer());
    assert!(t.ts);
    assert_eq!(t.ts_recent, 5000);
    t
}

fn our_ts(t: &Tcb) -> u32 {
    t.last_tsval
}

#[test]
fn data_with_an_old_tsval_is_dropped_and_acknowledged() {
    let mut t = tcb(test_config());
    let d = data(100);
    t.advance(ms(1));
    let echo = our_ts(&t);
    t.send(t.seg().payload(&d).ts(4998, echo));
    t.ts_recent = 5000; // the harness took 4998 as sent; the connection must not
                        // §5.3 R1: an ACK of what was received before, echoing the unchanged TS.Recent.
    t.expect(t.out().ack(r(0)));
    t.expect_none();
    assert_eq!(t.stats().paws_rejected, 1);
    assert_eq!(t.conn.recv_queue(), 0);
    // The same data with a current TSval is taken.
    t.send(t.seg().payload(&d).ts(5001, echo));
    t.expect(t.out().ack(r(100)).win(t.window_for(BUF - 100)));
    assert_eq!(t.app_recv(200), d);
}

#[test]
fn an_ack_with_an_old_tsval_is_not_processed() {
    let mut t = tcb(test_config());
    t.conn.set_nodelay(true);
    let d = data(1000);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    t.advance(ms(10));
    let echo = our_ts(&t);
    t.send(t.seg().ack(l(1000)).ts(4000, echo));
    t.ts_recent = 5000;
    assert_eq!(t.stats().bytes_in_flight, 1000, "the old ACK is ignored");
    // Zero-length: answered within the challenge-ACK budget.
    t.expect(t.out().seq(l(1000)));
    t.expect_none();
    assert_eq!(t.stats().paws_rejected, 1);
    t.send(t.seg().ack(l(1000)));
    assert_eq!(t.stats().bytes_in_flight, 0);
}

#[test]
fn a_rst_with_an_old_tsval_still_resets() {
    let mut t = tcb(test_config());
    t.advance(ms(1));
    t.send(t.seg().no_ack().flags(TcpFlags::RST).ts(1, 0));
    assert_eq!(t.conn.state(), State::Closed);
    assert_eq!(t.conn.error(), Some(TcpError::Reset));
    assert_eq!(t.stats().paws_rejected, 0);
}

#[test]
fn ts_recent_is_invalid_after_the_idle_limit() {
    let mut t = tcb(test_config());
    let d = data(100);
    // 24 days idle (RFC 7323 §5.5, the default limit) is within the limit: still
    // rejected.
    t.advance(ms(24 * 24 * 60 * 60 * 1000));
    let echo = our_ts(&t);
    t.send(t.seg().payload(&d).ts(10, echo));
    t.ts_recent = 5000;
    t.expect(t.out().ack(r(0)));
    assert_eq!(t.stats().paws_rejected, 1);
    // Beyond it (RFC 7323 §5.5), the segment is accepted and its TSval becomes TS.Recent.
    t.advance(ms(1));
    t.send(t.seg().payload(&d).ts(10, echo));
    t.expect(t.out().ack(r(100)).win(t.window_for(BUF - 100)));
    assert_eq!(t.stats().paws_rejected, 1);
    assert_eq!(t.ts_recent, 10);
}

#[test]
fn ts_recent_follows_only_the_segment_at_last_ack_sent() {
    let mut t = tcb(test_config());
    let d = data(200);
    t.advance(ms(1));
    let echo = our_ts(&t);
    // Out of order with a newer TSval: SEG.SEQ > Last.ACK.sent, TS.Recent unchanged.
    t.send(t.seg().seq(r(100)).payload(&d[100..]).ts(5020, echo));
    t.ts_recent = 5000;
    t.expect(t.out().ack(r(0)).sack(&[(r(100), r(200))]));
    // The hole's segment, sent earlier (older TSval, but not older than TS.Recent): it
    // is taken, and its TSval becomes TS.Recent (§4.3), not the out-of-order one's.
    t.send(t.seg().payload(&d[..100]).ts(5010, echo));
    t.expect(t.out().ack(r(200)).win(t.window_for(BUF - 200)));
    assert_eq!(t.ts_recent, 5010);
    assert_eq!(t.stats().paws_rejected, 0);
}

#[test]
fn paws_can_be_disabled() {
    let mut t = tcb(Config {
        paws: false,
        ..test_config()
    });
    let d = data(100);
    t.advance(ms(1));
    let echo = our_ts(&t);
    t.send(t.seg().payload(&d).ts(4999, echo));
    t.ts_recent = 5000;
    t.expect(t.out().ack(r(100)).win(t.window_for(BUF - 100)));
    assert_eq!(t.stats().paws_rejected, 0);
}

/// Like Linux (`TCP_PAWS_WINDOW`), PAWS forgives a TSval one tick older than TS.Recent:
/// a peer whose threads read its millisecond clock just before and after a tick may send
/// two segments in the other order, and dropping the second for it costs a
/// retransmission for no protection (a sequence number cannot wrap within a tick).
#[test]
fn a_tsval_one_tick_old_is_taken() {
    let mut t = tcb(test_config());
    let d = data(100);
    t.advance(ms(1));
    let echo = our_ts(&t);
    t.send(t.seg().payload(&d).ts(4999, echo));
    t.ts_recent = 5000;
    t.expect(t.out().ack(r(100)).win(t.window_for(BUF - 100)));
    assert_eq!(t.stats().paws_rejected, 0);
    assert_eq!(t.app_recv(200), d);
}
