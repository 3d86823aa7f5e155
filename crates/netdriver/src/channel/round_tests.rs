//! Unit tests of one queue's round: forwarding between queues, stray frames.

use super::*;
use crate::channel::directory::Owner;
use crate::channel::shared::Peer;
use crate::netif::{StraySegment, StrayVerdict};
use std::net::{Ipv4Addr, SocketAddrV4};

/// A set of two queues whose forwarding queues hold one frame each.
fn two_queues() -> (SetShared, Vec<Receiver<Vec<u8>>>) {
    let mut peers = Vec::new();
    let mut rxs = Vec::new();
    for q in 0..2 {
        let (ctx, _crx) = crossbeam_channel::unbounded();
        let (ftx, frx) = crossbeam_channel::bounded(1);
        peers.push(Peer {
            queue: q,
            signal: Arc::new(QueueSignal::new(RuntimeClock::new())),
            commands: ctx,
            forward: ftx,
            checksums: Default::default(),
            syns: Default::default(),
            resets_received: Default::default(),
            rx_fault_dropped: Default::default(),
        });
        rxs.push(frx);
    }
    (SetShared::for_tests(peers), rxs)
}

fn seg(port: u16, syn_to_listener: bool, frame: &[u8]) -> StraySegment<'_> {
    StraySegment {
        local: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 9000),
        remote: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), port),
        syn_to_listener,
        cookie_ack: false,
        frame,
    }
}

#[test]
fn unknown_flows_are_handled_locally() {
    let (set, _rx) = two_queues();
    let mut claims = Vec::new();
    let v = stray_verdict(&set, 0, &mut claims, &seg(1, false, b"f"), true);
    assert_eq!(v, StrayVerdict::Local);
    assert!(claims.is_empty());
    assert_eq!(set.directory.len(), 0);
}

#[test]
fn a_first_syn_is_claimed_and_a_repeat_elsewhere_forwarded() {
    let (set, rx) = two_queues();
    let mut claims = Vec::new();
    let s = seg(2, true, b"syn");
    assert_eq!(
        stray_verdict(&set, 0, &mut claims, &s, true),
        StrayVerdict::Local
    );
    assert_eq!(claims, [(s.local, s.remote)]);
    // The retransmitted SYN arrives on thread 1: it goes to thread 0, which is woken.
    let mut other = Vec::new();
    assert_eq!(
        stray_verdict(&set, 1, &mut other, &s, true),
        StrayVerdict::Forwarded
    );
    assert!(other.is_empty());
    assert_eq!(rx[0].try_recv().unwrap(), b"syn");
    assert!(set.peers[0].signal.take_pending());
    assert!(!set.peers[1].signal.take_pending());
}

#[test]
fn a_cookie_ack_is_claimed_like_a_syn() {
    let (set, _rx) = two_queues();
    let mut claims = Vec::new();
    let s = StraySegment {
        cookie_ack: true,
        ..seg(4, false, b"ack")
    };
    assert_eq!(
        stray_verdict(&set, 1, &mut claims, &s, true),
        StrayVerdict::Local
    );
    assert_eq!(claims, [(s.local, s.remote)]);
    assert_eq!(set.directory.owner(&(s.local, s.remote), 1), Owner::Me);
}

#[test]
fn forwarding_is_once_and_bounded() {
    let (set, rx) = two_queues();
    let mut claims = Vec::new();
    let s = seg(3, false, b"data");
    set.directory.insert((s.local, s.remote), 1);
    assert_eq!(
        stray_verdict(&set, 0, &mut claims, &s, true),
        StrayVerdict::Forwarded
    );
    // Thread 1's queue (one frame) is full: the next one is dropped, not reset.
    assert_eq!(
        stray_verdict(&set, 0, &mut claims, &s, true),
        StrayVerdict::Drop
    );
    assert_eq!(set.forwarded.load(Ordering::Relaxed), 1);
    assert_eq!(set.forward_dropped.load(Ordering::Relaxed), 1);
    assert_eq!(rx[1].len(), 1);
    // A frame that was forwarded once and still finds another owner is dropped.
    assert_eq!(
        stray_verdict(&set, 0, &mut claims, &s, false),
        StrayVerdict::Drop
    );
    assert_eq!(rx[1].len(), 1);
}
