//! Authenticated channels (`StackBuilder::channel_key`) on the in-memory network: peers
//! with the same key talk; a peer without it, with another one, or replaying an old
//! exchange never joins, and the refusals are counted while honest peers keep working.
//! The hostile peer speaks the handshake by hand (`docs/wire-format.md`).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

use netdriver::channel::{Channel, ChannelSet};
use vns::stack::{MemNetwork, Stack};
use vns::StackError;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const EVIL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 66);
const CHANNEL_PORT: u16 = 9000;
const KEY: &str = "correct horse battery staple 2026";
/// Bound on any single wait: a hang fails the test instead of blocking CI.
const LIMIT: Duration = Duration::from_secs(30);

fn stack(net: &MemNetwork, ip: Ipv4Addr, key: Option<&str>) -> Stack {
    stack_with_preamble_timeout(net, ip, key, Duration::from_secs(2))
}

fn stack_with_preamble_timeout(
    net: &MemNetwork,
    ip: Ipv4Addr,
    key: Option<&str>,
    preamble_timeout: Duration,
) -> Stack {
    let mut b = Stack::builder()
        .ipv4(ip)
        .channels(2)
        .preamble_timeout(preamble_timeout);
    if let Some(k) = key {
        b = b.channel_key(k);
    }
    b.build_in_memory(net).unwrap()
}

/// A server on `s`:7000 echoing one connection of `n` bytes.
async fn echo_server(s: &Stack, ip: Ipv4Addr, n: usize) -> tokio::task::JoinHandle<()> {
    let l = s
        .bind(SocketAddr::V4(SocketAddrV4::new(ip, 7000)))
        .await
        .unwrap();
    tokio::spawn(async move {
        let (mut c, _) = l.accept().await.unwrap();
        let mut buf = vec![0u8; n];
        c.read_exact(&mut buf).await.unwrap();
        c.write_all(&buf).await.unwrap();
        c.shutdown().await.unwrap();
    })
}

/// Connects from `client` to `ip`:7000 and checks the echo of `n` bytes.
async fn echo_through(client: &Stack, ip: Ipv4Addr, n: usize) -> io::Result<()> {
    let mut c = timeout(
        LIMIT,
        client.connect(SocketAddr::V4(SocketAddrV4::new(ip, 7000))),
    )
    .await
    .expect("connect hangs")?;
    let data: Vec<u8> = (0..n as u32).map(|i| (i * 13) as u8).collect();
    c.write_all(&data).await?;
    let mut back = Vec::new();
    timeout(LIMIT, c.read_to_end(&mut back))
        .await
        .expect("read hangs")?;
    assert_eq!(back, data);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_with_the_same_key_talk() {
    let net = MemNetwork::new();
    let (a, b) = (stack(&net, A, Some(KEY)), stack(&net, B, Some(KEY)));
    let server = echo_server(&b, B, 50_000).await;
    echo_through(&a, B, 50_000).await.unwrap();
    server.await.unwrap();
    assert_eq!(
        (
            a.diagnostics().auth_failures(),
            b.diagnostics().auth_failures()
        ),
        (0, 0)
    );
    assert_eq!(b.diagnostics().dropped_channels(), 0);
    assert!(b.diagnostics().channel_count() >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_the_key_is_refused_and_counted() {
    let net = MemNetwork::new();
    let b = stack(&net, B, Some(KEY));
    let a = stack(&net, A, None);
    let _server = echo_server(&b, B, 10).await;
    // A's channels are aborted by B: no stream can be opened over them.
    let err = echo_through(&a, B, 10).await.unwrap_err();
    println!("keyless peer: {err}");
    // Both of A's channels were refused for want of a proof.
    let until = tokio::time::Instant::now() + LIMIT;
    while b.diagnostics().auth_failures() < 2 {
        assert!(tokio::time::Instant::now() < until, "refusals not counted");
        tokio::task::yield_now().await;
    }
    assert_eq!(
        b.diagnostics().auth_failures(),
        b.diagnostics().dropped_channels()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_requires_a_key_is_refused_by_one_without() {
    let net = MemNetwork::new();
    let b = stack(&net, B, None);
    let a = stack(&net, A, Some(KEY));
    let _server = echo_server(&b, B, 10).await;
    let err = echo_through(&a, B, 10).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("authentication"), "{err}");
    assert!(b.diagnostics().auth_failures() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_another_key_is_refused() {
    let net = MemNetwork::new();
    let b = stack(&net, B, Some(KEY));
    let a = stack(&net, A, Some("another secret, also long enough"));
    let _server = echo_server(&b, B, 10).await;
    let err = echo_through(&a, B, 10).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
    assert!(
        err.to_string().contains("does not hold our channel key"),
        "{err}"
    );
    assert_eq!(b.diagnostics().channel_count(), 0);
}

#[test]
fn short_keys_are_refused_at_build() {
    let net = MemNetwork::new();
    let err = Stack::builder()
        .ipv4(A)
        .channel_key("short")
        .build_in_memory(&net)
        .unwrap_err();
    assert!(matches!(err, StackError::Invalid(_)), "{err}");
    assert!(err.to_string().contains("16 bytes"), "{err}");
}

fn tag(label: &[u8], nc: &[u8], ns: &[u8], class: u8) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(KEY.as_bytes()).unwrap();
    mac.update(label);
    mac.update(nc);
    mac.update(ns);
    mac.update(&[class]);
    mac.finalize().into_bytes().to_vec()
}

/// Reads exactly `n` bytes from a raw channel, or `None` when it ends first.
async fn read_n(t: &Channel, n: usize) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    while got.len() < n {
        let next = std::future::poll_fn(|cx| t.poll_dequeue(cx));
        match timeout(LIMIT, next).await.expect("peer silent") {
            Ok(Some(b)) => got.extend_from_slice(&b),
            Ok(None) | Err(_) => return None,
        }
    }
    Some(got)
}

/// Waits until the raw channel is closed or reset by the other side.
async fn closed(t: &Channel) -> bool {
    loop {
        let next = std::future::poll_fn(|cx| t.poll_dequeue(cx));
        match timeout(LIMIT, next).await {
            Err(_) => return false,
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None) | Err(_)) => return true,
        }
    }
}

/// A raw channel from `from` to `to` (the connect blocks for the handshake: off the
/// runtime's workers).
async fn connect_raw(from: &Arc<ChannelSet>, to: SocketAddrV4) -> Channel {
    let from = from.clone();
    tokio::task::spawn_blocking(move || from.connect(to))
        .await
        .unwrap()
        .expect("connect")
}

/// The handshake by hand: the preamble with the AUTH flag and a nonce; the stack's
/// challenge comes back. Returns the channel and the stack's nonce.
async fn hello(evil: &Arc<ChannelSet>, nc: &[u8; 16]) -> (Channel, Vec<u8>) {
    let t = connect_raw(evil, SocketAddrV4::new(B, CHANNEL_PORT)).await;
    let mut first = b"NCHN\x01\x00\x01\x00".to_vec();
    first.extend_from_slice(nc);
    t.enqueue(Bytes::from(first)).unwrap();
    let challenge = read_n(&t, 48).await.expect("a challenge");
    let (ns, accept) = challenge.split_at(16);
    // The stack proved it holds the key, for our nonce.
    assert_eq!(accept, tag(b"netchannel accept v1", nc, ns, 0));
    (t, ns.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_replayed_proofs_are_refused_while_honest_peers_work() {
    let net = MemNetwork::new();
    // The first hello's channel must outlive the refusals that follow before its proof is
    // sent; on a loaded machine those can take longer than the usual 2 s, so this stack
    // waits as long as the test's own bound. No refusal below relies on a timeout.
    let b = stack_with_preamble_timeout(&net, B, Some(KEY), LIMIT);
    let a = stack(&net, A, Some(KEY));
    let evil = Arc::new(net.host(EVIL).expect("a host on the network"));
    let nc = [0x42u8; 16];

    // A garbage proof.
    let (t, _) = hello(&evil, &nc).await;
    t.enqueue(Bytes::from(vec![0u8; 32])).unwrap();
    assert!(closed(&t).await, "a forged proof aborts the channel");

    // A proof that was valid for an earlier challenge, replayed on a new channel with the
    // same nonce: the stack's fresh nonce makes it worthless.
    let (t1, ns1) = hello(&evil, &nc).await;
    let old_proof = tag(b"netchannel open v1", &nc, &ns1, 0);
    let (t2, ns2) = hello(&evil, &nc).await;
    assert_ne!(ns1, ns2, "the stack's nonces are fresh");
    t2.enqueue(Bytes::from(old_proof)).unwrap();
    assert!(closed(&t2).await, "a replayed proof aborts the channel");
    // No preamble flag at all.
    let t3 = connect_raw(&evil, SocketAddrV4::new(B, CHANNEL_PORT)).await;
    t3.enqueue(Bytes::from_static(b"NCHN\x01\x00\x00\x00"))
        .unwrap();
    assert!(closed(&t3).await, "an unauthenticated channel is aborted");
    assert_eq!(b.diagnostics().auth_failures(), 3);

    // The right proof for the current challenge joins (whoever holds the key is a peer).
    t1.enqueue(Bytes::from(tag(b"netchannel open v1", &nc, &ns1, 0)))
        .unwrap();
    let until = tokio::time::Instant::now() + LIMIT;
    while b.diagnostics().channel_count() < 1 {
        assert!(
            tokio::time::Instant::now() < until,
            "the proven channel never joined"
        );
        tokio::task::yield_now().await;
    }

    // Meanwhile an honest peer is served.
    let server = echo_server(&b, B, 20_000).await;
    echo_through(&a, B, 20_000).await.unwrap();
    server.await.unwrap();
    assert_eq!(b.diagnostics().auth_failures(), 3);
}
