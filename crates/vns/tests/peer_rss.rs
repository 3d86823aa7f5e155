//! The acceptor's hello on the in-memory network: a stack whose RSS is known asks its
//! peer for the peer's RSS on a hello channel before it opens channels to it, and then
//! chooses each channel's port to land on a queue of the channel's class at the peer too
//! (`docs/wire-format.md`, "Acceptor's hello"). A peer without a reproducible RSS, a peer
//! that does not know hello channels and a peer that answers garbage each leave the
//! opener with the channels it opened before hellos existed, counted by kind.
//!
//! The switch delivers each frame on the queue index it was sent on, whatever the RSS
//! says, so these tests check what is decided and recorded (the hello, the per-channel
//! record, the counts, bytes exact); where frames land under RSS is checked on the RSS
//! bed (`tests/vns_rss_bed.rs` at the workspace root).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use netdriver::channel::{ChannelSet, RssAlignment};
use netdriver::rss::{RssConfig, MICROSOFT_VERIFICATION_KEY};
use netsched::{ChannelClass, PeerSteering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use vns::stack::{HelloCounts, MemNetwork};
use vns::Stack;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const QUEUES: usize = 4;
const LIMIT: Duration = Duration::from_secs(30);
/// The stacks' channel port (the builder's default).
const CHANNEL_PORT: u16 = netdriver::channel::DEFAULT_CHANNEL_PORT;

/// A 4-queue host's RSS: Microsoft's key (reversed for `reversed`), 128 entries.
fn rss(reversed: bool) -> RssConfig {
    let mut key = MICROSOFT_VERIFICATION_KEY;
    if reversed {
        key.reverse();
    }
    RssConfig::toeplitz(&key, &RssConfig::default_indirection(128, QUEUES as u32)).unwrap()
}

/// A stack at `ip` under `Isolating` (2 throughput channels and 1 latency channel per
/// peer, the latency ones on queue 3), its RSS `known` when given.
fn stack(net: &MemNetwork, ip: Ipv4Addr, known: Option<RssConfig>, key: Option<&str>) -> Stack {
    let mut b = Stack::builder()
        .ipv4(ip)
        .channels(2)
        .latency_channels(1)
        .scheduler(netsched::Isolating::default())
        .connect_timeout(Duration::from_secs(5))
        .preamble_timeout(Duration::from_secs(5));
    if let Some(rss) = known {
        b = b.configure_channels(move |c| c.rss = RssAlignment::Known(rss));
    }
    if let Some(k) = key {
        b = b.channel_key(k);
    }
    b.build_in_memory(net).unwrap()
}

fn pattern(tag: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ tag.wrapping_mul(0x9e37_79b9)).to_le_bytes()[1])
        .collect()
}

/// A throughput stream and a latency stream from `a` to `b`, each echoed byte for byte.
async fn exchange(a: &Stack, b: &Stack, port: u16) {
    let l = b
        .bind(SocketAddr::from(SocketAddrV4::new(B, port)))
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        for _ in 0..2 {
            let (mut s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = s.read(&mut buf).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    s.write_all(&buf[..n]).await.unwrap();
                }
                s.shutdown().await.unwrap();
            });
        }
    });
    for (tag, class, len) in [
        (1, netsched::AppClass::Throughput, 1 << 20),
        (2, netsched::AppClass::Latency, 64 * 1024),
    ] {
        let c = timeout(
            LIMIT,
            a.connect(SocketAddr::from(SocketAddrV4::new(B, port))),
        )
        .await
        .unwrap()
        .unwrap();
        c.set_app_class(class).unwrap();
        let data = pattern(tag, len);
        let (mut r, mut w) = c.into_split();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&sent).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        timeout(LIMIT, r.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        writer.await.unwrap();
        assert!(got == data, "stream {tag}: {} of {len} bytes", got.len());
    }
    server.await.unwrap();
}

/// `stack`'s opened channels' records: (class, queue, where it lands at the peer).
fn records(stack: &Stack) -> Vec<(ChannelClass, Option<u32>, Option<PeerSteering>)> {
    let mut v: Vec<_> = stack
        .diagnostics()
        .stats()
        .channels
        .iter()
        .map(|c| (c.class, c.queue, c.peer_steering))
        .collect();
    v.sort_by_key(|r| (r.0 == ChannelClass::Latency, r.1));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_opener_aims_each_channel_at_a_queue_of_its_class_at_the_acceptor() {
    for key in [None, Some("a channel key of at least 32 bytes!!")] {
        let net = MemNetwork::new().queues_per_host(QUEUES);
        let (rss_a, rss_b) = (rss(true), rss(false));
        let a = stack(&net, A, Some(rss_a), key);
        let b = stack(&net, B, Some(rss_b.clone()), key);
        exchange(&a, &b, 7100).await;
        assert_eq!(
            a.diagnostics().hello_counts(),
            HelloCounts {
                described: 1,
                ..HelloCounts::default()
            },
            "key {key:?}"
        );
        assert_eq!(b.diagnostics().hello_counts().answered, 1);
        let recs = records(&a);
        assert_eq!(recs.len(), 3, "{recs:?}");
        for (class, queue, peer) in &recs {
            match (class, peer) {
                (ChannelClass::Latency, Some(PeerSteering::Aligned { queue: at_b })) => {
                    assert_eq!((*queue, *at_b), (Some(3), 3), "{recs:?}");
                }
                (ChannelClass::Throughput, Some(PeerSteering::Aligned { queue: at_b })) => {
                    assert!(*at_b < 3 && queue.is_some_and(|q| q < 3), "{recs:?}");
                }
                _ => panic!("a channel not aimed at the peer: {recs:?}"),
            }
        }
        // The peer's records: accepted, nothing to say about A's queues.
        assert!(
            records(&b).iter().all(|r| r.2.is_none()),
            "{:?}",
            records(&b)
        );
        let counts = a.diagnostics().channel_set().peer_alignment_counts();
        // The hello channel itself is opened before the peer's RSS is known.
        assert_eq!((counts.aligned, counts.unknown, counts.missed), (3, 1, 0));
        // The hello channel is gone at both ends once finished.
        timeout(LIMIT, b.drained()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_a_known_rss_gets_channels_aligned_at_the_opener_only() {
    let net = MemNetwork::new().queues_per_host(QUEUES);
    let a = stack(&net, A, Some(rss(true)), None);
    let b = stack(&net, B, None, None);
    exchange(&a, &b, 7101).await;
    assert_eq!(
        a.diagnostics().hello_counts(),
        HelloCounts {
            undescribed: 1,
            ..HelloCounts::default()
        }
    );
    assert_eq!(b.diagnostics().hello_counts().answered, 1);
    let recs = records(&a);
    assert_eq!(recs.len(), 3);
    assert!(
        recs.iter().all(|r| r.2 == Some(PeerSteering::Unknown)),
        "{recs:?}"
    );
    // And a stack whose own RSS is unknown asks nothing (as before hellos existed).
    let net = MemNetwork::new().queues_per_host(QUEUES);
    let a = stack(&net, A, None, None);
    let b = stack(&net, B, Some(rss(false)), None);
    exchange(&a, &b, 7102).await;
    assert_eq!(a.diagnostics().hello_counts(), HelloCounts::default());
    assert_eq!(b.diagnostics().hello_counts(), HelloCounts::default());
}

/// What a fake peer does with a hello channel.
#[derive(Clone, Copy, Debug)]
enum FakeAnswer {
    /// Aborts it, as a stack from before hello channels does with a class byte it does
    /// not know.
    Abort,
    /// Answers with these bytes and closes.
    Bytes(&'static [u8]),
}

/// A host at `B` on `net` whose channel port takes channels like a stack (reads the
/// 8-byte preamble; keeps a channel of class 0 or 1) and treats hello channels (class 2)
/// as `answer` says. Returns the host and the class byte of each preamble it reads.
fn fake_peer(
    net: &MemNetwork,
    answer: FakeAnswer,
) -> (Arc<ChannelSet>, std::sync::mpsc::Receiver<Option<u8>>) {
    let host = Arc::new(net.host(B).unwrap());
    let listener = host.listen(CHANNEL_PORT).unwrap();
    let (seen, classes) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        while let Ok((t, _)) = listener.accept_timeout(LIMIT) {
            let mut got = Vec::new();
            while got.len() < 8 {
                match t.dequeue_blocking(Some(LIMIT)) {
                    Ok(netdriver::channel::Dequeued::Chunk(b)) => got.extend_from_slice(&b),
                    _ => break,
                }
            }
            let _ = seen.send(got.get(5).copied());
            match (got.get(5), answer) {
                (Some(0 | 1), _) => kept.push(t),
                (_, FakeAnswer::Abort) => t.abort(),
                (_, FakeAnswer::Bytes(b)) => {
                    // The opener may have given up on it already.
                    let _ = t.enqueue(Bytes::from_static(b));
                    t.close();
                    kept.push(t);
                }
            }
        }
    });
    (host, classes)
}

/// What the opener's hello counts must say after a fake acceptor's answer.
type CountsCheck = fn(&HelloCounts) -> bool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_that_do_not_answer_or_answer_garbage_get_channels_as_before() {
    let oversized: &'static [u8] = b"NCRS\x01\x01\xff\xff";
    let cases: [(FakeAnswer, CountsCheck); 4] = [
        (FakeAnswer::Abort, |c| c.unanswered == 1),
        (FakeAnswer::Bytes(b"GET / HTTP/1.1\r\n\r\n"), |c| {
            c.refused == 1
        }),
        (FakeAnswer::Bytes(oversized), |c| c.refused == 1),
        // A valid header whose body says it describes an RSS with an empty table.
        (
            FakeAnswer::Bytes(
                b"NCRS\x01\x01\x00\x0c\x01\x00\x00\xf0\x00\x00\x00\x00\x00\x00\x00\x00",
            ),
            |c| c.refused == 1,
        ),
    ];
    for (answer, expect) in cases {
        let net = MemNetwork::new().queues_per_host(QUEUES);
        let (_host, classes) = fake_peer(&net, answer);
        let a = stack(&net, A, Some(rss(true)), None);
        // The fake peer runs no endpoint: the connect's SYNC goes unanswered, but the
        // channels open first, as they would without a hello.
        let c = a.connect(SocketAddr::from(SocketAddrV4::new(B, 7103)));
        let _ = timeout(Duration::from_millis(300), c).await;
        timeout(LIMIT, a.channels_reach(3)).await.unwrap();
        let counts = a.diagnostics().hello_counts();
        assert!(expect(&counts), "{answer:?}: {counts:?}");
        assert_eq!(counts.described, 0);
        // The hello channel, then the three channels, reached the peer.
        let got: Vec<Option<u8>> = (0..4)
            .map(|_| classes.recv_timeout(LIMIT).expect("a preamble"))
            .collect();
        assert_eq!(got, [Some(2), Some(0), Some(0), Some(1)], "{answer:?}");
        let recs = records(&a);
        assert!(
            recs.iter().all(|r| r.2 == Some(PeerSteering::Unknown)),
            "{answer:?}: {recs:?}"
        );
    }
}
