//! A hostile peer against a whole stack (in-memory network, no privileges): channels
//! opened to the channel port that never send their preamble, or send garbage. They must
//! be dropped (bounded in number and in time, counted) while an honest peer's streams
//! keep working.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

use netdriver::channel::{Channel, ChannelSet};
use vns::stack::{MemNetwork, Stack};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const EVIL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 66);
const CHANNEL_PORT: u16 = 9000;
/// Bound on any single wait: a hang fails the test instead of blocking CI.
const LIMIT: Duration = Duration::from_secs(30);

/// Waits until the channel `t` is closed or reset by the other side.
async fn closed(t: &Channel) -> bool {
    let ended = std::future::poll_fn(|cx| loop {
        match t.poll_dequeue(cx) {
            std::task::Poll::Ready(Ok(Some(_))) => continue,
            std::task::Poll::Ready(Ok(None) | Err(_)) => return std::task::Poll::Ready(()),
            std::task::Poll::Pending => return std::task::Poll::Pending,
        }
    });
    timeout(LIMIT, ended).await.is_ok()
}

/// Opens a channel, retrying while the stack's accept queue (not yet taken by its
/// control task) is full, as a client retries a refused SYN. The connect blocks for the
/// handshake: off the runtime's workers.
async fn connect_retrying(host: &Arc<ChannelSet>, to: SocketAddrV4) -> Channel {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let h = host.clone();
        match tokio::task::spawn_blocking(move || h.connect(to))
            .await
            .unwrap()
        {
            Ok(t) => return t,
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "connect: {e}");
                tokio::task::yield_now().await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_garbage_channels_are_dropped_and_counted() {
    let net = MemNetwork::new();
    let b = Stack::builder()
        .ipv4(B)
        .channels(2)
        .preamble_timeout(Duration::from_millis(300))
        .build_in_memory(&net)
        .unwrap();
    let a = Stack::builder()
        .ipv4(A)
        .channels(2)
        .build_in_memory(&net)
        .unwrap();
    let evil = Arc::new(net.host(EVIL).expect("a host on the network"));
    let to = SocketAddrV4::new(B, CHANNEL_PORT);

    // More silent channels than may wait at once: the oldest are aborted right away.
    let silent = 300;
    let mut held = Vec::new();
    for _ in 0..silent {
        held.push(connect_retrying(&evil, to).await);
    }
    // Garbage instead of a preamble.
    let junk = connect_retrying(&evil, to).await;
    junk.enqueue(bytes::Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n"))
        .unwrap();

    // Meanwhile an honest peer connects and is served.
    let l = b
        .bind(SocketAddr::V4(SocketAddrV4::new(B, 7000)))
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = vec![0u8; 100_000];
        s.read_exact(&mut buf).await.unwrap();
        s.write_all(&buf).await.unwrap();
        s.shutdown().await.unwrap();
    });
    let mut c = timeout(LIMIT, a.connect(SocketAddr::V4(SocketAddrV4::new(B, 7000))))
        .await
        .unwrap()
        .unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    c.write_all(&data).await.unwrap();
    let mut back = Vec::new();
    timeout(LIMIT, c.read_to_end(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, data);
    server.await.unwrap();

    // Every silent channel and the garbage one end (cap, then timeout), and are counted.
    assert!(closed(&junk).await, "a garbage preamble aborts the channel");
    for t in &held {
        assert!(closed(t).await, "a silent channel is aborted");
    }
    assert_eq!(b.diagnostics().dropped_channels(), silent as u64 + 1);
    // The honest peer's channels were not touched.
    assert_eq!(a.diagnostics().dropped_channels(), 0);
    assert!(b.diagnostics().channel_count() >= 2);
}

/// A stream closed after shutdown lingers for the peer's FIN. A peer that never sends it
/// (here one that keeps its stream open and silent) no longer holds the socket for good:
/// the stack's control task runs the endpoint's linger timer by itself, resets the socket
/// once `linger_timeout` has passed, and counts it; the peer reads end of stream, then the
/// reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_peer_never_finishes_is_reset_after_the_linger_timeout() {
    let net = MemNetwork::new();
    let b = Stack::builder()
        .ipv4(B)
        .channels(2)
        .vns_config(vns::Config {
            linger_timeout: Duration::from_millis(200),
            ..vns::Config::default()
        })
        .build_in_memory(&net)
        .unwrap();
    let a = Stack::builder()
        .ipv4(A)
        .channels(2)
        .build_in_memory(&net)
        .unwrap();
    let l = b
        .bind(SocketAddr::V4(SocketAddrV4::new(B, 7000)))
        .await
        .unwrap();
    let mut c = timeout(LIMIT, a.connect(SocketAddr::V4(SocketAddrV4::new(B, 7000))))
        .await
        .unwrap()
        .unwrap();
    c.write_all(b"hello").await.unwrap();
    let (mut s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    let mut got = [0u8; 5];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"hello");
    s.shutdown().await.unwrap();
    drop(s);
    // The peer sees end of stream, and keeps its own side open.
    let mut rest = Vec::new();
    timeout(LIMIT, c.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
    // Then the reset, once the linger timeout has passed on B (no other traffic to wake
    // its control task).
    let deadline = tokio::time::Instant::now() + LIMIT;
    let err = loop {
        let mut buf = [0u8; 8];
        match c.read(&mut buf).await {
            Ok(0) => {
                assert!(tokio::time::Instant::now() < deadline, "no reset came");
                tokio::task::yield_now().await;
            }
            Ok(n) => panic!("{n} bytes after end of stream"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    assert_eq!(b.diagnostics().endpoint_counters().linger_expired, 1);
    assert_eq!(a.diagnostics().endpoint_counters().linger_expired, 0);
}
