//! Two of our channel sets, one per side of a 2-queue test bed: several channels on each
//! queue at once, data both ways verified; and at MTU 9000, with default settings.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::net::SocketAddrV4;
use std::time::Instant;

use common::{config, echo, program_attached, recv_stream, send_stream, start, DEADLINE};
use netdriver::channel::ChannelStream;
use testbed::{testbed_or_skip, Side, TestBed};

const PER_QUEUE: usize = 4;
const PER_CHANNEL: u64 = 4 << 20;

#[test]
fn two_channel_sets_talk_on_every_queue() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = start(&bed, Side::A, config(&bed, Side::A));
    let b = start(&bed, Side::B, config(&bed, Side::B));
    assert_eq!((a.queues(), b.queues()), (vec![0, 1], vec![0, 1]));
    let listener = b.listen_channels().expect("listen");
    let n = 2 * PER_QUEUE;
    let server = std::thread::spawn(move || {
        let echoers: Vec<_> = (0..n)
            .map(|_| {
                let (ch, peer) = listener.accept_timeout(DEADLINE).expect("accept");
                let queue = ch.queue();
                std::thread::spawn(move || {
                    let mut s = ChannelStream::new(ch);
                    let bytes = echo(&mut s).expect("echo");
                    s.shutdown_write().unwrap();
                    s.flush().unwrap();
                    (peer, queue, bytes)
                })
            })
            .collect();
        echoers
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 9000);
    let t0 = Instant::now();
    let channels: Vec<_> = (0..n)
        .map(|i| {
            let q = (i % 2) as u32;
            let ch = a.connect_on(q, target).expect("connect");
            assert_eq!(ch.queue(), q);
            ch
        })
        .collect();
    // Each channel sends and receives at once, on two threads.
    std::thread::scope(|s| {
        for (i, ch) in channels.iter().enumerate() {
            let seed = 300 + i as u64;
            s.spawn(move || send_stream(ch, seed, PER_CHANNEL, 60 * 1024));
            s.spawn(move || assert_eq!(recv_stream(ch, seed), PER_CHANNEL, "channel {i}"));
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    let served = server.join().unwrap();
    assert_eq!(served.len(), n);
    let queue_of: HashMap<u16, u32> = channels
        .iter()
        .map(|c| (c.local_addr().port(), c.queue()))
        .collect();
    for (peer, queue, bytes) in &served {
        assert_eq!(*bytes, PER_CHANNEL);
        // Our frames leave A on tx queue q and arrive on B's rx queue q, so B's thread for
        // queue q accepted the channel A opened on q.
        assert_eq!(queue_of.get(&peer.port()), Some(queue), "{peer}");
    }
    let b_queues: BTreeSet<u32> = served.iter().map(|s| s.1).collect();
    assert_eq!(b_queues, BTreeSet::from([0, 1]));
    println!(
        "{n} channels between two sets on 2 queues: {} MiB each way each in {secs:.2} s \
         (forwarded A {:?}, B {:?})",
        PER_CHANNEL >> 20,
        a.forwarded_frames(),
        b.forwarded_frames()
    );
    // Both stacks steer each flow back to its owner's queue: nothing needed forwarding.
    assert_eq!(a.forwarded_frames(), (0, 0));
    drop(channels);
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::A));
    assert!(!program_attached(&bed, Side::B));
}

/// How `side`'s veth end has an XDP program attached, as `ip link` shows it: `xdp`
/// (native), `xdpgeneric`, or `none`.
fn xdp_mode(bed: &TestBed, side: Side) -> String {
    let ifname = bed.side(side).ifname.clone();
    let text = bed
        .output_in(side, "ip", &["link", "show", "dev", &ifname])
        .expect("ip link show");
    text.split_whitespace()
        .find(|w| w.starts_with("xdp"))
        .unwrap_or("none")
        .to_owned()
}

/// At MTU 9000 a set with default settings attaches the `xdp.frags` program, which veth
/// accepts in native mode (a single-buffer one it refuses above MTU 3506, and the attach
/// fell back to generic mode), and a channel's data crosses both ways (8960-byte segments,
/// chains of UMEM frames).
#[test]
fn channel_sets_at_mtu_9000_attach_the_frags_program_natively() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1).mtu(9000)) else {
        return;
    };
    let a = start(&bed, Side::A, config(&bed, Side::A));
    let b = start(&bed, Side::B, config(&bed, Side::B));
    assert_eq!(xdp_mode(&bed, Side::A), "xdp");
    assert_eq!(xdp_mode(&bed, Side::B), "xdp");
    let listener = b.listen_channels().expect("listen");
    let server = std::thread::spawn(move || {
        let (ch, _) = listener.accept_timeout(DEADLINE).expect("accept");
        let mut s = ChannelStream::new(ch);
        let bytes = echo(&mut s).expect("echo");
        s.shutdown_write().unwrap();
        s.flush().unwrap();
        bytes
    });
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 9000);
    let ch = a.connect(target).expect("connect");
    std::thread::scope(|s| {
        s.spawn(|| send_stream(&ch, 900, PER_CHANNEL, 60 * 1024));
        s.spawn(|| assert_eq!(recv_stream(&ch, 900), PER_CHANNEL));
    });
    assert_eq!(server.join().unwrap(), PER_CHANNEL);
    drop(ch);
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::A));
    assert!(!program_attached(&bed, Side::B));
}
