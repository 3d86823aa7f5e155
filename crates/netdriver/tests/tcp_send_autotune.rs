//! Send-buffer auto-tuning (`Config::tx_buffer_max`; Linux's `tcp_sndbuf_expand`): an
//! application held back by a full send buffer gets a larger one at the next ACK that
//! frees room, twice the congestion window, up to the maximum; an application that never
//! fills it, a buffer the application sized itself and a connection without a maximum
//! keep theirs. Every byte still leaves in order.

mod tcp_support_b;

use netdriver::tcp::{Config, TcpError};
use tcp_support_b::*;

/// An established connection with a 16 KiB send buffer that may grow to `max`.
fn tuned(max: Option<usize>) -> Tcb {
    let config = Config {
        tx_buffer_max: max,
        ..test_config()
    };
    Tcb::established(config, PeerOpts::default())
}

/// [`tuned`], after its application offered 60 000 bytes (the buffer took 16 384) and
/// the initial window went out; the payload and the segments sent.
fn held_back(max: Option<usize>) -> (Tcb, Vec<u8>, Vec<Seg>) {
    let mut t = tuned(max);
    let d = data(60_000);
    assert_eq!(
        t.conn.send(&d).expect("send"),
        BUF,
        "the buffer takes what fits"
    );
    assert_eq!(t.conn.send(&d[BUF..]), Err(TcpError::WouldBlock));
    let sent = t.drain();
    assert!(!sent.is_empty(), "the initial window goes out");
    assert_eq!(t.stats().tx_buffer, BUF);
    (t, d, sent)
}

/// Bytes the segments carry, checked against the payload in order from byte `from`.
fn check_in_order(segs: &[Seg], d: &[u8], from: usize) -> usize {
    let mut at = from;
    for s in segs {
        if s.payload.is_empty() {
            continue;
        }
        assert_eq!(s.repr.seq, l(at), "segments leave in order");
        assert_eq!(s.payload, d[at..at + s.payload.len()], "bytes at {at}");
        at += s.payload.len();
    }
    at
}

#[test]
fn a_writer_held_back_by_the_buffer_grows_it_to_twice_the_congestion_window() {
    let (mut t, d, sent) = held_back(Some(1 << 20));
    let flight = check_in_order(&sent, &d, 0);
    // The first segment's ACK frees room while less than the window is in flight.
    t.send(t.seg().ack(l(PEER_MSS)));
    let s = t.stats();
    assert!(
        s.bytes_in_flight < s.cwnd,
        "{} in flight, cwnd {}",
        s.bytes_in_flight,
        s.cwnd
    );
    assert_eq!(s.tx_buffer_grown, 1);
    assert_eq!(s.tx_buffer, 2 * s.cwnd.max(10 * PEER_MSS));
    assert!(s.tx_buffer > BUF);
    // The application's next write takes what the larger buffer holds.
    let queued = t.stats().send_queue;
    let took = t.conn.send(&d[BUF..]).expect("room");
    assert_eq!(took, s.tx_buffer - queued);
    // And every byte still leaves in order behind the first flight.
    let more = t.drain();
    check_in_order(&more, &d, flight);
}

#[test]
fn growth_stops_at_the_maximum() {
    let max = 20_000;
    let (mut t, _d, _sent) = held_back(Some(max));
    t.send(t.seg().ack(l(PEER_MSS)));
    let s = t.stats();
    assert!(
        2 * s.cwnd > max,
        "twice the window ({}) is past the maximum",
        2 * s.cwnd
    );
    assert_eq!(s.tx_buffer, max);
    assert_eq!(s.tx_buffer_grown, 1);
    // At the maximum nothing grows again, however long the writer is held back.
    let _ = t.conn.send(&data(60_000));
    t.drain();
    t.send(t.seg().ack(l(2 * PEER_MSS)));
    assert_eq!(t.stats().tx_buffer, max);
    assert_eq!(t.stats().tx_buffer_grown, 1);
}

#[test]
fn a_writer_that_never_fills_the_buffer_never_grows_it() {
    let mut t = tuned(Some(1 << 20));
    let d = data(50_000);
    let mut at = 0;
    for _ in 0..10 {
        t.app_send(&d[at..at + 5000]);
        let segs = t.drain();
        let end = check_in_order(&segs, &d, at);
        assert_eq!(end, at + 5000);
        at = end;
        t.send(t.seg().ack(l(at)));
    }
    assert_eq!(t.stats().tx_buffer, BUF);
    assert_eq!(t.stats().tx_buffer_grown, 0);
}

#[test]
fn a_size_the_application_set_is_kept() {
    let mut t = tuned(Some(1 << 20));
    // As `SO_SNDBUF`: from now on the size is the application's.
    assert_eq!(t.conn.set_send_buffer(BUF), BUF);
    let d = data(60_000);
    assert_eq!(t.conn.send(&d).expect("send"), BUF);
    t.drain();
    t.send(t.seg().ack(l(PEER_MSS)));
    assert_eq!(t.stats().tx_buffer, BUF);
    assert_eq!(t.stats().tx_buffer_grown, 0);
}

#[test]
fn without_a_maximum_the_send_buffer_is_fixed() {
    let (mut t, _d, _sent) = held_back(None);
    t.send(t.seg().ack(l(PEER_MSS)));
    assert_eq!(t.stats().tx_buffer, BUF);
    assert_eq!(t.stats().tx_buffer_grown, 0);
}

/// The default configuration auto-tunes up to 4 MiB, Linux's `tcp_wmem` maximum.
#[test]
fn the_default_configuration_auto_tunes_the_send_buffer() {
    assert_eq!(Config::default().tx_buffer_max, Some(4 << 20));
    let (mut t, _d, _sent) = held_back(Config::default().tx_buffer_max);
    t.send(t.seg().ack(l(PEER_MSS)));
    assert!(t.stats().tx_buffer > BUF);
    assert_eq!(t.stats().tx_buffer_grown, 1);
}

/// After a timeout the congestion window restarts at one segment while the earlier flight
/// still counts as outstanding: the window, not the buffer, holds the sender back, so the
/// ACK of the resent segment grows nothing.
#[test]
fn a_flight_the_congestion_window_holds_back_does_not_grow_the_buffer() {
    let (mut t, d, _sent) = held_back(Some(1 << 20));
    t.fire();
    let resent = t.drain();
    assert_eq!(resent.len(), 1, "one segment resent after the timeout");
    check_in_order(&resent, &d, 0);
    t.send(t.seg().ack(l(PEER_MSS)));
    let s = t.stats();
    assert!(
        s.bytes_in_flight >= s.cwnd,
        "{} in flight, cwnd {}",
        s.bytes_in_flight,
        s.cwnd
    );
    assert_eq!(s.tx_buffer, BUF);
    assert_eq!(s.tx_buffer_grown, 0);
}

/// A channel's connection grows its send buffer too, but to 1 MiB at most: its paths are
/// µs-scale, where a larger flight only queues at the receiver.
#[test]
fn a_channel_tunes_its_send_buffer_up_to_a_mebibyte() {
    let c = netdriver::channel::ChannelSetConfig::new("veth0", std::net::Ipv4Addr::LOCALHOST);
    assert_eq!(c.tcp.tx_buffer_max, Some(1 << 20));
    let (mut t, _d, _sent) = held_back(c.tcp.tx_buffer_max);
    t.send(t.seg().ack(l(PEER_MSS)));
    assert!(t.stats().tx_buffer > BUF);
}
