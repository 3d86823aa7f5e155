//! Two stacks under `Isolating` on the RSS bed (`docs/testbed.md`: every frame arrives on
//! the queue its receiver's RSS picks, as on a NIC), each knowing its own "NIC"'s RSS.
//! The opener asks the acceptor for its RSS on a hello channel before it opens channels
//! (`docs/wire-format.md`, "Acceptor's hello") and chooses each channel's port to land on
//! a queue of the channel's class at both ends: every latency channel is owned by the
//! latency queue (the last) at both stacks, every throughput channel by another, and no
//! frame is forwarded between queues at either end while verified bytes flow. Without the
//! acceptor's description the latency channels land at the acceptor wherever its RSS puts
//! their ports, which the test prints as the figure to compare.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::net::{SocketAddr, SocketAddrV4};
use std::time::Duration;

use netchannel::netdriver::channel::RssAlignment;
use netchannel::netdriver::rss::{RssConfig, MICROSOFT_VERIFICATION_KEY};
use netchannel::sched::{ChannelClass, PeerSteering};
use netchannel::vns::stack::HelloCounts;
use netchannel::{AppClass, Stack, VirtualStream};
use testbed::{testbed_or_skip, RssTable, Side, TestBed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

const QUEUES: u32 = 4;
const LATENCY_QUEUE: u32 = QUEUES - 1;
const BULK_CHANNELS: usize = 2;
const LATENCY_CHANNELS: usize = 4;
const LIMIT: Duration = Duration::from_secs(120);
const BULK_STREAMS: u64 = 2;
const BULK_BYTES: u64 = 8 << 20;
const PINGS: usize = 100;
const PING: usize = 4096;

/// B's "NIC" uses Microsoft's verification key, A's the same bytes reversed; both spread
/// 128 entries over the queues.
fn tables() -> (RssTable, RssTable) {
    let key_b = MICROSOFT_VERIFICATION_KEY;
    let mut key_a = key_b;
    key_a.reverse();
    (
        RssTable::spread(&key_a, 128, QUEUES).unwrap(),
        RssTable::spread(&key_b, 128, QUEUES).unwrap(),
    )
}

fn config(table: &RssTable) -> RssConfig {
    RssConfig::toeplitz(table.key(), table.indirection()).unwrap()
}

/// A stack in `side`'s namespace under `Isolating` with queue runtimes of its own, its
/// RSS the bed's table for it when `known` (else probed: veth has none).
fn stack(bed: &TestBed, side: Side, known: Option<RssConfig>) -> Stack {
    let e = bed.side(side);
    let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
    bed.run_in(side, move || {
        let mut b = Stack::builder()
            .interface(ifname)
            .ipv4(ipv4)
            .channels(BULK_CHANNELS)
            .latency_channels(LATENCY_CHANNELS)
            .scheduler(netchannel::sched::Isolating::default())
            .application_runtime(false)
            .connect_timeout(Duration::from_secs(10));
        if let Some(rss) = known {
            b = b.configure_channels(move |c| c.rss = RssAlignment::Known(rss));
        }
        b.build()
    })
    .expect("enter the namespace")
    .expect("build the stack")
}

fn byte(tag: u64, offset: u64) -> u8 {
    let mut z = offset.wrapping_add(tag.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (z ^ (z >> 27)) as u8
}

fn fill(tag: u64, offset: u64, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        *b = byte(tag, offset + i as u64);
    }
}

async fn send_pattern(s: &mut VirtualStream, tag: u64, total: u64) {
    let mut buf = vec![0u8; 60_000];
    let mut off = 0u64;
    while off < total {
        let n = (total - off).min(buf.len() as u64) as usize;
        fill(tag, off, &mut buf[..n]);
        s.write_all(&buf[..n]).await.expect("write");
        off += n as u64;
    }
}

/// Bulk streams A -> B verified by B, and a latency-class stream whose exchanges B
/// echoes and A verifies, at once; returns once every byte arrived.
async fn load(a: &Stack, b: &Stack) {
    let b_ip = b.ipv4();
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    let bulk_l = b.bind(at(7700)).await.unwrap();
    let lat_l = b.bind(at(7701)).await.unwrap();
    let sink = tokio::spawn(async move {
        let mut readers = Vec::new();
        for _ in 0..BULK_STREAMS {
            let (mut s, _) = bulk_l.accept().await.unwrap();
            readers.push(tokio::spawn(async move {
                let tag = s.read_u64().await.unwrap();
                let mut buf = vec![0u8; 64 * 1024];
                let mut want = vec![0u8; 64 * 1024];
                let mut off = 0u64;
                loop {
                    let n = s.read(&mut buf).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    fill(tag, off, &mut want[..n]);
                    assert!(buf[..n] == want[..n], "bulk stream {tag} at {off}");
                    off += n as u64;
                }
                off
            }));
        }
        let mut total = 0;
        for r in readers {
            total += r.await.unwrap();
        }
        total
    });
    let echo = tokio::spawn(async move {
        let (mut s, _) = lat_l.accept().await.unwrap();
        s.set_app_class(AppClass::Latency).unwrap();
        let mut buf = vec![0u8; PING];
        for _ in 0..PINGS {
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
        }
    });
    let a2 = a.clone();
    let pings = tokio::spawn(async move {
        let mut lat = a2.connect(at(7701)).await.unwrap();
        lat.set_app_class(AppClass::Latency).unwrap();
        let (mut msg, mut back) = (vec![0u8; PING], vec![0u8; PING]);
        for k in 0..PINGS {
            fill(900, (k * PING) as u64, &mut msg);
            lat.write_all(&msg).await.unwrap();
            lat.read_exact(&mut back).await.unwrap();
            assert!(back == msg, "echo {k}");
        }
    });
    let senders: Vec<_> = (0..BULK_STREAMS)
        .map(|i| {
            let a = a.clone();
            tokio::spawn(async move {
                let mut c = a.connect(at(7700)).await.unwrap();
                c.write_u64(300 + i).await.unwrap();
                send_pattern(&mut c, 300 + i, BULK_BYTES).await;
                c.shutdown().await.unwrap();
            })
        })
        .collect();
    timeout(LIMIT, pings)
        .await
        .expect("latency stream")
        .unwrap();
    for s in senders {
        timeout(LIMIT, s).await.unwrap().unwrap();
    }
    assert_eq!(
        timeout(LIMIT, sink).await.unwrap().unwrap(),
        BULK_STREAMS * BULK_BYTES
    );
    timeout(LIMIT, echo).await.unwrap().unwrap();
}

/// A channel's class, its queue, and for one the stack opened where it lands at the peer.
type Record = (ChannelClass, u32, Option<PeerSteering>);

/// Each channel's [`Record`] at `stack`.
fn channels(stack: &Stack) -> Vec<Record> {
    stack
        .diagnostics()
        .stats()
        .channels
        .iter()
        .map(|c| (c.class, c.queue.expect("a NIC queue"), c.peer_steering))
        .collect()
}

/// What one run found.
#[derive(Debug)]
struct Found {
    /// Latency channels on the latency queue at A, at B (of `LATENCY_CHANNELS`).
    latency_on_latency_queue: (usize, usize),
    /// Throughput channels on the latency queue at A, at B.
    bulk_on_latency_queue: (usize, usize),
    /// Frames forwarded between queues at A, at B, after the channels were open.
    forwarded: (u64, u64),
    hellos: HelloCounts,
}

/// A fresh RSS bed; A knows its RSS, B when `b_describes`; channels opened, then
/// [`load`].
fn run(b_describes: bool) -> Option<(Found, Vec<Record>)> {
    let (nic_a, nic_b) = tables();
    let bed = testbed_or_skip(
        TestBed::builder()
            .queues(QUEUES)
            .rss(nic_a.clone(), nic_b.clone()),
    )?;
    let a = stack(&bed, Side::A, Some(config(&nic_a)));
    let b = stack(&bed, Side::B, b_describes.then(|| config(&nic_b)));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let total = BULK_CHANNELS + LATENCY_CHANNELS;
    let (fwd_a, fwd_b) = rt.block_on(async {
        // Open the channels first (a connect does), so that what is forwarded after set-up
        // can be told from the set-up.
        let l = b
            .bind(SocketAddr::from(SocketAddrV4::new(b.ipv4(), 7699)))
            .await
            .unwrap();
        let c = timeout(
            LIMIT,
            a.connect(SocketAddr::from(SocketAddrV4::new(b.ipv4(), 7699))),
        )
        .await
        .unwrap()
        .unwrap();
        drop((c, l));
        timeout(LIMIT, a.channels_reach(total)).await.unwrap();
        timeout(LIMIT, b.channels_reach(total)).await.unwrap();
        let before = (
            a.diagnostics().channel_set().forwarded_frames().0,
            b.diagnostics().channel_set().forwarded_frames().0,
        );
        load(&a, &b).await;
        let after = (
            a.diagnostics().channel_set().forwarded_frames().0,
            b.diagnostics().channel_set().forwarded_frames().0,
        );
        (after.0 - before.0, after.1 - before.1)
    });
    let (at_a, at_b) = (channels(&a), channels(&b));
    assert_eq!(
        (at_a.len(), at_b.len()),
        (total, total),
        "{at_a:?} / {at_b:?}"
    );
    let count = |v: &[Record], class| {
        v.iter()
            .filter(|c| c.0 == class && c.1 == LATENCY_QUEUE)
            .count()
    };
    let found = Found {
        latency_on_latency_queue: (
            count(&at_a, ChannelClass::Latency),
            count(&at_b, ChannelClass::Latency),
        ),
        bulk_on_latency_queue: (
            count(&at_a, ChannelClass::Throughput),
            count(&at_b, ChannelClass::Throughput),
        ),
        forwarded: (fwd_a, fwd_b),
        hellos: a.diagnostics().hello_counts(),
    };
    println!(
        "B describes its RSS: {b_describes}; {found:?}; A: {at_a:?}; B: {at_b:?}; \
         A steering {:?}, peer {:?}; B steering {:?}",
        a.diagnostics().channel_set().steering_counts(),
        a.diagnostics().channel_set().peer_alignment_counts(),
        b.diagnostics().channel_set().steering_counts(),
    );
    assert_eq!(b.diagnostics().hello_counts().answered, 1);
    drop((a, b));
    drop(rt);
    Some((found, at_a))
}

#[test]
fn latency_channels_land_on_latency_queues_at_both_ends_on_the_rss_bed() {
    let Some((found, at_a)) = run(true) else {
        return;
    };
    assert_eq!(
        found.hellos,
        HelloCounts {
            described: 1,
            ..HelloCounts::default()
        }
    );
    assert_eq!(
        found.latency_on_latency_queue,
        (LATENCY_CHANNELS, LATENCY_CHANNELS),
        "{found:?}"
    );
    assert_eq!(found.bulk_on_latency_queue, (0, 0), "{found:?}");
    assert_eq!(found.forwarded, (0, 0), "{found:?}");
    for (class, _, peer) in &at_a {
        match (class, peer) {
            (ChannelClass::Latency, Some(PeerSteering::Aligned { queue })) => {
                assert_eq!(*queue, LATENCY_QUEUE)
            }
            (ChannelClass::Throughput, Some(PeerSteering::Aligned { queue })) => {
                assert_ne!(*queue, LATENCY_QUEUE)
            }
            other => panic!("not aimed at B's queues: {other:?} in {at_a:?}"),
        }
    }
}

/// The same without B's description: A's end stays aligned, B's queues are whatever its
/// RSS makes of A's ports (the figure before hellos), and nothing breaks.
#[test]
fn without_the_acceptors_description_only_the_opener_is_aligned_on_the_rss_bed() {
    let Some((found, at_a)) = run(false) else {
        return;
    };
    assert_eq!(
        found.hellos,
        HelloCounts {
            undescribed: 1,
            ..HelloCounts::default()
        }
    );
    assert_eq!(found.latency_on_latency_queue.0, LATENCY_CHANNELS);
    assert_eq!(found.bulk_on_latency_queue.0, 0);
    assert_eq!(
        found.forwarded,
        (0, 0),
        "accepted and aligned ends forward nothing"
    );
    assert!(
        at_a.iter().all(|c| c.2 == Some(PeerSteering::Unknown)),
        "{at_a:?}"
    );
}
