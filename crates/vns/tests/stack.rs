//! The tokio contract of `VirtualStream`/`VirtualListener`, on stacks joined by an
//! in-memory network (no privileges): tokio's own `TcpStream` tests ported, plus
//! virtual-socket specifics (many streams, a paused reader, channel loss, timeouts).

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use tokio_util::codec::{Framed, LinesCodec};

use netdriver::channel::{Channel, ChannelSet, ChannelSetConfig, QueueLimits};
use vns::stack::{MemNetwork, Stack};
use vns::{AppClass, VirtualListener, VirtualStream};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// Bound on any single wait: a hang fails the test instead of blocking CI.
const LIMIT: Duration = Duration::from_secs(30);

fn addr(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddrV4::new(ip, port).into()
}

fn pair(channels: usize) -> (Stack, Stack) {
    Stack::pair_in_memory(channels).unwrap()
}

fn pattern(tag: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ tag.wrapping_mul(0x9e37_79b9)).to_le_bytes()[1])
        .collect()
}

/// A host of `net` that runs no stack (a plain-TCP peer).
fn plain_host(net: &MemNetwork, ip: Ipv4Addr) -> Arc<ChannelSet> {
    Arc::new(net.host(ip).expect("a host on the network"))
}

/// A raw channel from `host` to `to`, and its local address (the connect blocks for the
/// handshake: off the runtime's workers).
async fn connect_raw(host: &Arc<ChannelSet>, to: SocketAddrV4) -> (Channel, SocketAddrV4) {
    let h = host.clone();
    let t = tokio::task::spawn_blocking(move || h.connect(to))
        .await
        .unwrap()
        .expect("connect");
    let local = t.local_addr();
    (t, local)
}

async fn connected(a: &Stack, b: &Stack, port: u16) -> (VirtualStream, VirtualStream) {
    let l = b.bind(addr(B, port)).await.unwrap();
    let c = timeout(LIMIT, a.connect(addr(B, port)))
        .await
        .unwrap()
        .unwrap();
    let (s, peer) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    assert_eq!(peer, c.local_addr().unwrap());
    (c, s)
}

#[tokio::test]
async fn echo_and_addresses() {
    let (a, b) = pair(2);
    let (mut c, mut s) = connected(&a, &b, 7000).await;
    assert_eq!(c.peer_addr().unwrap(), addr(B, 7000));
    assert_eq!(s.local_addr().unwrap(), addr(B, 7000));
    assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
    c.set_nodelay(true).unwrap();
    assert!(c.nodelay().unwrap());
    assert!(
        c.quickack().unwrap(),
        "on at first, as a Linux socket reports"
    );
    c.set_quickack(false).unwrap();
    assert!(!c.quickack().unwrap(), "recorded");
    c.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 5];
    s.read_exact(&mut buf).await.unwrap();
    s.write_all(&buf).await.unwrap();
    let mut back = [0u8; 5];
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"hello");
    // Channels: 2 throughput + 1 latency each side.
    assert_eq!(a.diagnostics().channel_count(), 3);
    assert_eq!(b.diagnostics().channel_count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_halves_from_two_tasks() {
    let (a, b) = pair(3);
    let (c, s) = connected(&a, &b, 7001).await;
    // Server echoes with its halves in two tasks.
    let (mut sr, mut sw) = s.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 10_000];
        loop {
            let n = sr.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            tx.send(buf[..n].to_vec()).await.unwrap();
        }
    });
    let writer = tokio::spawn(async move {
        while let Some(v) = rx.recv().await {
            sw.write_all(&v).await.unwrap();
        }
        sw.shutdown().await.unwrap();
    });
    let data = pattern(1, 1 << 20);
    let (mut cr, mut cw) = c.into_split();
    let d2 = data.clone();
    let send = tokio::spawn(async move {
        cw.write_all(&d2).await.unwrap();
        cw.shutdown().await.unwrap();
        cw
    });
    let mut got = Vec::new();
    timeout(LIMIT, cr.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data);
    let cw = send.await.unwrap();
    reader.await.unwrap();
    writer.await.unwrap();
    assert!(cr.reunite(cw).is_ok());
}

#[tokio::test]
async fn borrowed_split_halves_concurrently() {
    let (a, b) = pair(2);
    let (mut c, mut s) = connected(&a, &b, 7002).await;
    let data = pattern(2, 300_000);
    let server = async {
        let (mut r, mut w) = s.split();
        tokio::io::copy(&mut r, &mut w).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let client = async {
        let (mut r, mut w) = c.split();
        let write = async {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
        };
        let mut got = Vec::new();
        let read = r.read_to_end(&mut got);
        let (_, n) = tokio::join!(write, read);
        assert_eq!(n.unwrap(), data.len());
        got
    };
    let (_, got) = timeout(LIMIT, async { tokio::join!(server, client) })
        .await
        .unwrap();
    assert!(got == data);
}

#[tokio::test]
async fn shutdown_then_read_to_eof_both_ways() {
    let (a, b) = pair(2);
    let (mut c, mut s) = connected(&a, &b, 7003).await;
    c.write_all(b"request").await.unwrap();
    c.shutdown().await.unwrap();
    let mut req = Vec::new();
    timeout(LIMIT, s.read_to_end(&mut req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(req, b"request");
    // EOF stays EOF.
    assert_eq!(s.read(&mut [0u8; 8]).await.unwrap(), 0);
    // Half-closed: the server still writes, the client still reads.
    s.write_all(b"response").await.unwrap();
    s.shutdown().await.unwrap();
    let mut resp = Vec::new();
    timeout(LIMIT, c.read_to_end(&mut resp))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp, b"response");
    // Writing after our own shutdown is an error.
    let e = c.write_all(b"more").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BrokenPipe);
}

/// Dropping a stream without `shutdown` closes it like the kernel's `close()`: a client
/// that writes 1 MB and drops at once (most of it still in its stack) loses nothing; the
/// server reads every byte, then end of stream, and its own drop finishes the exchange.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_without_shutdown_delivers_the_data_then_eof() {
    const LEN: usize = 1 << 20;
    let (a, b) = pair(2);
    let (c, mut s) = connected(&a, &b, 7004).await;
    let data = pattern(4, LEN);
    let sent = data.clone();
    let client = tokio::spawn(async move {
        let mut c = c;
        c.write_all(&sent).await.unwrap();
        // Dropped here, no shutdown.
    });
    let mut got = Vec::new();
    timeout(LIMIT, s.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got == data, "got {} of {LEN} bytes", got.len());
    timeout(LIMIT, client).await.unwrap().unwrap();
    drop(s);
    // Both closed gracefully: nothing lingers, nothing was reset.
    assert!(
        eventually(
            || a.diagnostics().lingering_sockets() == 0 && b.diagnostics().lingering_sockets() == 0
        )
        .await,
        "closed sockets were not reaped"
    );
    assert_eq!(a.diagnostics().endpoint_counters().linger_expired, 0);
    assert_eq!(a.pending_tx_bytes(), 0);
}

/// A server that writes its reply and returns (dropping the stream) delivers the reply,
/// then end of stream, to the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_reply_then_drop_reaches_the_client() {
    const LEN: usize = 600_000;
    let (a, b) = pair(2);
    let l = b.bind(addr(B, 7006)).await.unwrap();
    let reply = pattern(6, LEN);
    let sent = reply.clone();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut req = [0u8; 7];
        s.read_exact(&mut req).await.unwrap();
        assert_eq!(&req, b"request");
        s.write_all(&sent).await.unwrap();
    });
    let mut c = timeout(LIMIT, a.connect(addr(B, 7006)))
        .await
        .unwrap()
        .unwrap();
    c.write_all(b"request").await.unwrap();
    let mut got = Vec::new();
    timeout(LIMIT, c.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got == reply, "got {} of {LEN} bytes", got.len());
    timeout(LIMIT, server).await.unwrap().unwrap();
    // The client can still write (half-closed), and closes without a reset.
    c.write_all(b"thanks").await.unwrap();
}

/// Dropping a stream with received bytes left unread resets the connection, as a kernel
/// socket does: the peer first reads what was sent to it before, then `ConnectionReset`,
/// and its writes fail.
#[tokio::test]
async fn drop_with_unread_data_resets_the_peer() {
    let (a, b) = pair(2);
    let (mut c, mut s) = connected(&a, &b, 7007).await;
    s.write_all(b"sent before").await.unwrap();
    c.write_all(b"hello").await.unwrap();
    let mut two = [0u8; 2];
    s.read_exact(&mut two).await.unwrap();
    drop(s); // "llo" unread
    let mut got = Vec::new();
    let e = timeout(LIMIT, c.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset);
    assert_eq!(got, b"sent before");
    // Later operations keep failing.
    let e = c.write_all(b"x").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset);
    assert_eq!(
        c.read(&mut [0u8; 4]).await.unwrap_err().kind(),
        ErrorKind::ConnectionReset
    );
}

/// `set_linger(Some(Duration::ZERO))` makes a drop abortive, as `SO_LINGER` 0 does on a
/// kernel socket: a reset even with nothing unread, for virtual and plain-TCP streams.
#[tokio::test]
async fn linger_zero_makes_drop_a_reset() {
    let (a, b) = pair(2);
    let (mut c, s) = connected(&a, &b, 7008).await;
    assert_eq!(s.linger().unwrap(), None);
    s.set_linger(Some(Duration::ZERO)).unwrap();
    assert_eq!(s.linger().unwrap(), Some(Duration::ZERO));
    drop(s);
    let e = timeout(LIMIT, c.read(&mut [0u8; 4]))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset);
    assert_eq!(b.diagnostics().lingering_sockets(), 0);

    let (_b, _host, t, s) = plain_pair(7009, Duration::from_secs(60)).await;
    // tokio's newer spelling of the same.
    s.set_zero_linger().unwrap();
    assert_eq!(s.linger().unwrap(), Some(Duration::ZERO));
    drop(s);
    assert_eq!(transport_error(&t).await.kind(), ErrorKind::ConnectionReset);
}

#[tokio::test]
async fn read_and_write_after_peer_close() {
    let (a, b) = pair(2);
    let (mut c, mut s) = connected(&a, &b, 7005).await;
    // The peer shuts down and closes gracefully after reading everything.
    s.shutdown().await.unwrap();
    assert_eq!(
        timeout(LIMIT, c.read(&mut [0u8; 4]))
            .await
            .unwrap()
            .unwrap(),
        0
    );
    // Our direction still works until the peer drops.
    c.write_all(b"late").await.unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"late");
    drop(s);
    // The peer is gone: writing eventually fails with a reset, reading too.
    let deadline = tokio::time::Instant::now() + LIMIT;
    let err = loop {
        match c.write_all(b"data").await {
            Err(e) => break e,
            Ok(()) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "writes never failed"
                );
                tokio::task::yield_now().await;
            }
        }
    };
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    assert_eq!(
        c.read(&mut [0u8; 4]).await.unwrap_err().kind(),
        ErrorKind::ConnectionReset
    );
}

#[tokio::test]
async fn connect_refused() {
    let (a, b) = pair(2);
    // A stack with nothing bound on the port.
    let e = timeout(LIMIT, a.connect(addr(B, 7999)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
    // No host at that address: as when ARP goes unanswered.
    let e = timeout(LIMIT, a.connect(addr(Ipv4Addr::new(10, 0, 0, 9), 7000)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::HostUnreachable);
    // Binding someone else's address is refused; a second bind of a port too.
    assert_eq!(
        b.bind(addr(A, 7000)).await.unwrap_err().kind(),
        ErrorKind::AddrNotAvailable
    );
    let _l = b.bind(addr(B, 7000)).await.unwrap();
    assert_eq!(
        b.bind(addr(B, 7000)).await.unwrap_err().kind(),
        ErrorKind::AddrInUse
    );
    // Port 0 picks a free port.
    let l0 = b.bind(addr(Ipv4Addr::UNSPECIFIED, 0)).await.unwrap();
    assert_ne!(l0.local_addr().unwrap().port(), 0);
}

#[tokio::test]
async fn connect_times_out_when_the_peer_never_answers() {
    let net = MemNetwork::new();
    let a = Stack::builder()
        .ipv4(A)
        .connect_timeout(Duration::from_millis(300))
        .build_in_memory(&net)
        .unwrap();
    // A host whose channel port accepts channels that nobody ever reads.
    let silent = plain_host(&net, B);
    let _listening = silent.listen(9000).unwrap();
    let start = std::time::Instant::now();
    let e = timeout(LIMIT, a.connect(addr(B, 7000)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(start.elapsed() >= Duration::from_millis(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_streams_with_verified_data() {
    const N: u32 = 200;
    const LEN: usize = 20_000;
    let (a, b) = pair(4);
    // Every client connects at once: the backlog holds them all.
    let l = b
        .bind_with_backlog(addr(B, 7006), N as usize)
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        let mut tasks = Vec::new();
        for _ in 0..N {
            let (mut s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                s.read_to_end(&mut got).await.unwrap();
                // Echo back with the bytes reversed, to verify both directions.
                got.reverse();
                s.write_all(&got).await.unwrap();
                s.shutdown().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let mut clients = Vec::new();
    for i in 0..N {
        let a = a.clone();
        clients.push(tokio::spawn(async move {
            let mut c = a.connect(addr(B, 7006)).await.unwrap();
            let data = pattern(i, LEN + i as usize);
            c.write_all(&data).await.unwrap();
            c.shutdown().await.unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.unwrap();
            got.reverse();
            assert!(got == data, "stream {i} corrupted");
        }));
    }
    timeout(LIMIT * 2, async {
        for c in clients {
            c.await.unwrap();
        }
        server.await.unwrap();
    })
    .await
    .unwrap();
}

/// A full backlog behaves like a kernel listener's: the next client is not refused; its
/// SYNC is dropped and sent again, and it connects once an accept makes room.
#[tokio::test]
async fn a_full_backlog_makes_the_client_wait_not_fail() {
    let (a, b) = pair(2);
    let l = b.bind_with_backlog(addr(B, 7007), 2).await.unwrap();
    let c1 = a.connect(addr(B, 7007)).await.unwrap();
    let c2 = a.connect(addr(B, 7007)).await.unwrap();
    let a2 = a.clone();
    let c3 = tokio::spawn(async move { a2.connect(addr(B, 7007)).await });
    timeout(LIMIT, async {
        while b.diagnostics().endpoint_counters().backlog_full_syncs == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the third SYNC never met the full backlog");
    // Only an accept can make room, so the third connect is still waiting.
    assert!(!c3.is_finished());
    let (s1, _) = l.accept().await.unwrap();
    assert_eq!(s1.peer_addr().unwrap(), c1.local_addr().unwrap());
    let c3 = timeout(LIMIT, c3)
        .await
        .expect("the waiting client never got in")
        .unwrap()
        .unwrap();
    assert!(a.diagnostics().endpoint_counters().sync_retries >= 1);
    assert_eq!(b.diagnostics().endpoint_counters().refused_syncs, 0);
    let (s2, _) = l.accept().await.unwrap();
    assert_eq!(s2.peer_addr().unwrap(), c2.local_addr().unwrap());
    let (s3, _) = l.accept().await.unwrap();
    assert_eq!(s3.peer_addr().unwrap(), c3.local_addr().unwrap());
}

/// A client that waits on a full backlog nobody accepts from times out like a kernel
/// client whose SYNs go unanswered.
#[tokio::test]
async fn a_backlog_nobody_drains_times_the_client_out() {
    let net = vns::stack::MemNetwork::new();
    let a = Stack::builder()
        .ipv4(A)
        .connect_timeout(Duration::from_millis(600))
        .build_in_memory(&net)
        .unwrap();
    let b = Stack::builder().ipv4(B).build_in_memory(&net).unwrap();
    let _l = b.bind_with_backlog(addr(B, 7017), 1).await.unwrap();
    let _c1 = a.connect(addr(B, 7017)).await.unwrap();
    let e = timeout(LIMIT, a.connect(addr(B, 7017)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    // 200 ms, then 400 ms: at least the first retry went before the deadline.
    assert!(a.diagnostics().endpoint_counters().sync_retries >= 1);
    assert!(b.diagnostics().endpoint_counters().backlog_full_syncs >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfer_is_byte_exact() {
    const LEN: usize = 32 << 20;
    let (a, b) = pair(4);
    let (mut c, mut s) = connected(&a, &b, 7008).await;
    let data = pattern(8, LEN);
    let d2 = data.clone();
    let w = tokio::spawn(async move {
        for part in d2.chunks(100_003) {
            c.write_all(part).await.unwrap();
        }
        c.shutdown().await.unwrap();
        c
    });
    let mut got = Vec::with_capacity(LEN);
    timeout(LIMIT * 2, s.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), LEN);
    assert!(got == data);
    w.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_reader_does_not_stall_other_streams() {
    let (a, b) = pair(2);
    let (mut sleepy_c, _sleepy_s) = connected(&a, &b, 7009).await;
    let (mut busy_c, mut busy_s) = connected(&a, &b, 7010).await;
    // Fill the sleeping reader's socket until its writer blocks.
    let filler = tokio::spawn(async move {
        let chunk = vec![7u8; 64 * 1024];
        let mut sent = 0usize;
        loop {
            match timeout(Duration::from_millis(500), sleepy_c.write_all(&chunk)).await {
                Ok(r) => {
                    r.unwrap();
                    sent += chunk.len();
                }
                Err(_) => return (sleepy_c, sent),
            }
        }
    });
    let (_sleepy_c, parked) = timeout(LIMIT, filler).await.unwrap().unwrap();
    assert!(parked > 0);
    // The other stream, sharing every channel, moves 8 MB meanwhile.
    let data = pattern(10, 8 << 20);
    let d2 = data.clone();
    let w = tokio::spawn(async move {
        busy_c.write_all(&d2).await.unwrap();
        busy_c.shutdown().await.unwrap();
        busy_c
    });
    let mut got = Vec::new();
    timeout(LIMIT, busy_s.read_to_end(&mut got))
        .await
        .expect("the busy stream stalled behind the sleeping reader")
        .unwrap();
    assert!(got == data);
    w.await.unwrap();
}

#[tokio::test]
async fn framed_lines_over_a_virtual_stream() {
    let (a, b) = pair(2);
    let (c, s) = connected(&a, &b, 7011).await;
    let server = tokio::spawn(async move {
        let mut f = Framed::new(s, LinesCodec::new());
        while let Some(line) = f.next().await {
            let line = line.unwrap();
            f.send(line.to_uppercase()).await.unwrap();
        }
    });
    let mut f = Framed::new(c, LinesCodec::new());
    for i in 0..100 {
        f.send(format!("line number {i}")).await.unwrap();
        let reply = timeout(LIMIT, f.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(reply, format!("LINE NUMBER {i}"));
    }
    f.get_mut().shutdown().await.unwrap();
    drop(f);
    timeout(LIMIT, server).await.unwrap().unwrap();
}

#[tokio::test]
async fn peer_vanishing_fails_pending_and_later_operations() {
    let (a, b) = pair(2);
    let (mut c, _s) = connected(&a, &b, 7012).await;
    let pending = tokio::spawn(async move {
        let r = c.read(&mut [0u8; 16]).await;
        (c, r)
    });
    // Give the read a chance to park, then make the peer host disappear.
    tokio::task::yield_now().await;
    b.abort();
    let (mut c, r) = timeout(LIMIT, pending).await.unwrap().unwrap();
    assert_eq!(r.unwrap_err().kind(), ErrorKind::ConnectionAborted);
    assert_eq!(
        c.write_all(b"x").await.unwrap_err().kind(),
        ErrorKind::ConnectionAborted
    );
    // The shut-down stack refuses new work.
    assert!(b.bind(addr(B, 7013)).await.is_err());
}

#[tokio::test]
async fn app_class_switches_channels() {
    let (a, b) = pair(2);
    let (mut c, mut s) = connected(&a, &b, 7014).await;
    assert_eq!(c.app_class(), AppClass::Throughput);
    c.set_app_class(AppClass::Latency).unwrap();
    assert_eq!(c.app_class(), AppClass::Latency);
    c.write_all(b"urgent").await.unwrap();
    let mut buf = [0u8; 6];
    timeout(LIMIT, s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"urgent");

    // Without latency channels the class cannot be set.
    let net = MemNetwork::new();
    let x = Stack::builder()
        .ipv4(A)
        .latency_channels(0)
        .build_in_memory(&net)
        .unwrap();
    let y = Stack::builder().ipv4(B).build_in_memory(&net).unwrap();
    let (c, _s) = connected(&x, &y, 7015).await;
    assert_eq!(
        c.set_app_class(AppClass::Latency).unwrap_err().kind(),
        ErrorKind::AddrNotAvailable
    );
}

#[tokio::test]
async fn default_stack_serves_the_tokio_style_constructors() {
    let (a, b) = pair(2);
    // The default stack is B; a connects to it through its own handle.
    vns::set_default_stack(b.clone());
    let l = VirtualListener::bind("10.0.0.2:7016").await.unwrap();
    let mut c = a.connect(addr(B, 7016)).await.unwrap();
    let (mut s, _) = l.accept().await.unwrap();
    c.write_all(b"hi").await.unwrap();
    let mut buf = [0u8; 2];
    s.read_exact(&mut buf).await.unwrap();
    // And B connects back to A by address alone.
    let la = a.bind(addr(A, 7017)).await.unwrap();
    let mut back = VirtualStream::connect("10.0.0.1:7017").await.unwrap();
    let (mut sa, _) = la.accept().await.unwrap();
    back.write_all(b"yo").await.unwrap();
    sa.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"yo");
    vns::stack::clear_default_stack();
}

/// Reads a plain transport to its end of stream.
async fn read_transport_to_end(t: &dyn netdriver::channel::ChannelTransport) -> Vec<u8> {
    let mut got = Vec::new();
    loop {
        match std::future::poll_fn(|cx| t.poll_dequeue(cx)).await.unwrap() {
            Some(b) => got.extend_from_slice(&b),
            None => return got,
        }
    }
}

#[tokio::test]
async fn listener_serves_plain_tcp_peers() {
    let net = MemNetwork::new();
    let b = Stack::builder().ipv4(B).build_in_memory(&net).unwrap();
    let l = b.bind(addr(B, 7020)).await.unwrap();
    // A host without NetChannel connects straight to the listened port.
    let host = plain_host(&net, Ipv4Addr::new(10, 0, 0, 3));
    let (t, local) = connect_raw(&host, SocketAddrV4::new(B, 7020)).await;
    t.enqueue(bytes::Bytes::from_static(b"GET /\r\n")).unwrap();
    t.close();
    let (mut s, peer) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    assert!(s.is_plain_tcp());
    assert_eq!(peer, SocketAddr::from(local));
    let mut req = Vec::new();
    timeout(LIMIT, s.read_to_end(&mut req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(req, b"GET /\r\n");
    s.write_all(b"200 OK").await.unwrap();
    s.shutdown().await.unwrap();
    drop(s);
    let got = timeout(LIMIT, read_transport_to_end(&t)).await.unwrap();
    assert_eq!(got, b"200 OK");
}

#[tokio::test]
async fn connect_falls_back_to_plain_tcp() {
    let net = MemNetwork::new();
    let a = Stack::builder().ipv4(A).build_in_memory(&net).unwrap();
    // A plain server: no channel port, only its service port.
    let c_ip = Ipv4Addr::new(10, 0, 0, 3);
    let host = plain_host(&net, c_ip);
    let acceptor = host.listen(7021).unwrap();
    let server = tokio::spawn(async move {
        let t = std::future::poll_fn(|cx| acceptor.poll_accept(cx))
            .await
            .unwrap();
        let req = read_transport_to_end(&t).await;
        let mut resp = req.clone();
        resp.reverse();
        t.enqueue(bytes::Bytes::from(resp)).unwrap();
        t.close();
        req
    });
    let mut c = timeout(LIMIT, a.connect(addr(c_ip, 7021)))
        .await
        .unwrap()
        .unwrap();
    assert!(c.is_plain_tcp());
    assert_eq!(c.peer_addr().unwrap(), addr(c_ip, 7021));
    c.write_all(b"abc").await.unwrap();
    c.shutdown().await.unwrap();
    let mut resp = Vec::new();
    timeout(LIMIT, c.read_to_end(&mut resp))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp, b"cba");
    assert_eq!(server.await.unwrap(), b"abc");
    // Nothing at all on the port: still refused.
    let e = timeout(LIMIT, a.connect(addr(c_ip, 7022)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
}

/// Polls `cond` every millisecond until it holds; false after `LIMIT`.
async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + LIMIT;
    while tokio::time::Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    cond()
}

/// `pending_tx_bytes` counts what a closed stream still has to deliver (here: held back
/// by a reader that has not read yet) and reaches 0 only once the peer has it all, so a
/// program can stop its stack after its last reply without cutting it off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_tx_bytes_cover_closed_streams_until_delivered() {
    const LEN: usize = 1 << 20;
    let (a, b) = pair(2);
    let (mut c, s) = connected(&a, &b, 7030).await;
    // The handshake's own chunks are acknowledged a round later.
    assert!(eventually(|| b.pending_tx_bytes() == 0).await);
    let data = pattern(30, LEN);
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        let mut s = s;
        s.write_all(&sent).await.unwrap();
        s.shutdown().await.unwrap();
        // Dropped after shutdown: closes gracefully and lingers in the stack.
    });
    // The reader sleeps: beyond its credit, bytes wait in the server's stack.
    assert!(
        eventually(|| b.pending_tx_bytes() >= 128 * 1024).await,
        "pending {}",
        b.pending_tx_bytes()
    );
    let mut got = Vec::new();
    timeout(LIMIT, c.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got == data, "got {} bytes", got.len());
    timeout(LIMIT, writer).await.unwrap().unwrap();
    timeout(LIMIT, b.drained()).await.unwrap();
    assert_eq!(b.pending_tx_bytes(), 0);
    c.shutdown().await.unwrap();
    timeout(LIMIT, a.drained()).await.unwrap();
    assert_eq!(a.pending_tx_bytes(), 0);
}

/// A socket finished both ways (its FIN sent, everything up to the peer's FIN received)
/// keeps its unread bytes and end of stream when the channels then go away (the peer's
/// stack stopping after its last reply), instead of failing with `ConnectionAborted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_stream_keeps_its_bytes_when_the_channels_go() {
    const LEN: usize = 100_000;
    let (a, b) = pair(2);
    let (mut c, mut s) = connected(&a, &b, 7031).await;
    let data = pattern(31, LEN);
    c.shutdown().await.unwrap();
    s.write_all(&data).await.unwrap();
    s.shutdown().await.unwrap();
    let mut eof = Vec::new();
    timeout(LIMIT, s.read_to_end(&mut eof))
        .await
        .unwrap()
        .unwrap();
    assert!(eof.is_empty());
    drop(s);
    // Everything (and both FINs) delivered; then the server's stack stops.
    timeout(LIMIT, async { tokio::join!(a.drained(), b.drained()) })
        .await
        .unwrap();
    b.abort();
    timeout(LIMIT, a.channels_closed())
        .await
        .expect("channels lost");
    assert_eq!(a.diagnostics().channel_count(), 0);
    let mut got = Vec::new();
    timeout(LIMIT, c.read_to_end(&mut got))
        .await
        .unwrap()
        .expect("the bytes received before the channels went");
    assert!(got == data, "got {} bytes", got.len());
    // A stream that was not finished still fails.
    let (a2, b2) = pair(2);
    let (mut c2, _s2) = connected(&a2, &b2, 7032).await;
    b2.abort();
    timeout(LIMIT, a2.channels_closed()).await.unwrap();
    assert_eq!(
        c2.read(&mut [0u8; 8]).await.unwrap_err().kind(),
        ErrorKind::ConnectionAborted
    );
}

/// A plain-TCP stream closed gracefully and dropped still counts in `pending_tx_bytes`
/// until its peer has taken the bytes. The peer's TCP takes what its buffers hold (its
/// receive buffer and its channel's Rx queue, here 32 KiB) and acknowledges it, as a
/// kernel's would; the rest waits at the stack until the peer reads. (The write
/// completes at once: the stream's channel queues it all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_tx_bytes_cover_closed_plain_streams() {
    const LEN: usize = 1 << 20;
    let net = MemNetwork::new();
    let b = Stack::builder().ipv4(B).build_in_memory(&net).unwrap();
    let l = b.bind(addr(B, 7033)).await.unwrap();
    // A plain host whose channels queue at most 32 KiB of what they receive.
    let mut cfg = ChannelSetConfig::new("mem", Ipv4Addr::new(10, 0, 0, 3));
    cfg.rx_queue = QueueLimits {
        chunks: 16,
        bytes: 32 * 1024,
    };
    let host = Arc::new(ChannelSet::start_on_switch(cfg, net.switch(), net.queues()).unwrap());
    let (t, _) = connect_raw(&host, SocketAddrV4::new(B, 7033)).await;
    let (mut s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    assert!(s.is_plain_tcp());
    let data = pattern(33, LEN);
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        s.write_all(&sent).await.unwrap();
        s.shutdown().await.unwrap();
        // Dropped after its shutdown: closed gracefully, kept by the stack.
    });
    // The plain host has not read: beyond what its TCP took, the bytes wait here.
    let held_by_peer = 256 * 1024 + 32 * 1024;
    assert!(
        eventually(|| b.pending_tx_bytes() >= LEN - held_by_peer).await,
        "{}",
        b.pending_tx_bytes()
    );
    let got = timeout(LIMIT, read_transport_to_end_after(&t, writer))
        .await
        .unwrap();
    assert!(got == data, "got {} bytes", got.len());
    timeout(LIMIT, b.drained()).await.unwrap();
    assert_eq!(b.pending_tx_bytes(), 0);
}

/// Reads everything from `t` (the writer's stream is shut when `writer` ends), then
/// closes `t`.
async fn read_transport_to_end_after(t: &Channel, writer: tokio::task::JoinHandle<()>) -> Vec<u8> {
    let got = read_transport_to_end(t).await;
    writer.await.unwrap();
    t.close();
    got
}

/// A plain-TCP host connected to a `VirtualListener` on a stack `b` (with `linger` as
/// its linger timeout): the host, its channel and the accepted stream.
async fn plain_pair(
    port: u16,
    linger: Duration,
) -> (Stack, Arc<ChannelSet>, Channel, VirtualStream) {
    let net = MemNetwork::new();
    let b = Stack::builder()
        .ipv4(B)
        .vns_config(vns::Config {
            linger_timeout: linger,
            ..vns::Config::default()
        })
        .build_in_memory(&net)
        .unwrap();
    let l = b.bind(addr(B, port)).await.unwrap();
    let host = plain_host(&net, Ipv4Addr::new(10, 0, 0, 3));
    let (t, _) = connect_raw(&host, SocketAddrV4::new(B, port)).await;
    let (s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    assert!(s.is_plain_tcp());
    (b, host, t, s)
}

/// The error a plain transport's next read meets (after any bytes still queued).
async fn transport_error(t: &Channel) -> std::io::Error {
    loop {
        match timeout(LIMIT, std::future::poll_fn(|cx| t.poll_dequeue(cx)))
            .await
            .unwrap()
        {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("end of stream instead of a reset"),
            Err(e) => return e.into(),
        }
    }
}

/// A plain-TCP stream dropped without `shutdown` closes like a kernel socket: the bytes
/// written reach the peer, then end of stream; once the peer closes too, the stack lets
/// the channel go, uncounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_stream_drop_without_shutdown_delivers_the_data_then_fin() {
    let (b, _host, t, mut s) = plain_pair(7034, Duration::from_secs(60)).await;
    let data = pattern(34, 300_000);
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        s.write_all(&sent).await.unwrap();
        // Dropped here, no shutdown.
    });
    let got = timeout(LIMIT, read_transport_to_end(&t)).await.unwrap();
    assert!(got == data, "got {} bytes", got.len());
    timeout(LIMIT, writer).await.unwrap().unwrap();
    assert_eq!(
        b.diagnostics().closing_plain_streams(),
        1,
        "waits for the peer's FIN"
    );
    t.close();
    assert!(eventually(|| b.diagnostics().closing_plain_streams() == 0).await);
    assert_eq!(b.diagnostics().plain_linger_expired(), 0);
    assert_eq!(b.pending_tx_bytes(), 0);
}

/// A plain-TCP stream whose peer closed first, dropped once it has read the end and its
/// answer is acknowledged, is let go at once (the queue driver alone finishes the close:
/// nothing is left for the stack to watch); the peer reads the answer, then end of
/// stream, not a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_stream_whose_peer_closed_first_is_let_go_at_its_drop() {
    let (b, _host, t, mut s) = plain_pair(7039, Duration::from_secs(60)).await;
    t.enqueue(bytes::Bytes::from_static(b"request")).unwrap();
    let mut req = [0u8; 7];
    timeout(LIMIT, s.read_exact(&mut req))
        .await
        .unwrap()
        .unwrap();
    s.write_all(b"answer").await.unwrap();
    // The peer takes the answer and closes (the client closes first).
    let mut got = Vec::new();
    while got.len() < 6 {
        let chunk = timeout(LIMIT, std::future::poll_fn(|cx| t.poll_dequeue(cx)))
            .await
            .unwrap()
            .unwrap()
            .expect("the answer");
        got.extend_from_slice(&chunk);
    }
    assert_eq!(got, b"answer");
    t.close();
    let mut rest = Vec::new();
    timeout(LIMIT, s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
    // The end of stream was read, so the segment that carried the peer's FIN (and its
    // acknowledgement of the answer) is in the channel's figures already.
    drop(s);
    assert_eq!(
        b.diagnostics().closing_plain_streams(),
        0,
        "let go, not handed to the stack"
    );
    assert_eq!(
        timeout(LIMIT, read_transport_to_end(&t)).await.unwrap(),
        b"",
        "end of stream, not a reset"
    );
    assert_eq!(b.diagnostics().plain_linger_expired(), 0);
}

/// A plain-TCP stream dropped with received bytes unread (part of a chunk, or bytes it
/// never read) resets the connection; so does data arriving after a graceful drop.
#[tokio::test]
async fn plain_stream_drop_with_unread_data_resets_the_peer() {
    // Partly read.
    let (_b, _host, t, mut s) = plain_pair(7035, Duration::from_secs(60)).await;
    t.enqueue(bytes::Bytes::from_static(b"hello")).unwrap();
    let mut two = [0u8; 2];
    timeout(LIMIT, s.read_exact(&mut two))
        .await
        .unwrap()
        .unwrap();
    drop(s);
    assert_eq!(transport_error(&t).await.kind(), ErrorKind::ConnectionReset);
    // Never read (but arrived: bytes still on the wire when the stream goes count as
    // data arriving after the close, the next case).
    let (_b, _host, t, s) = plain_pair(7036, Duration::from_secs(60)).await;
    t.enqueue(bytes::Bytes::from_static(b"unread")).unwrap();
    timeout(LIMIT, s.readable()).await.unwrap().unwrap();
    drop(s);
    assert_eq!(transport_error(&t).await.kind(), ErrorKind::ConnectionReset);
    // Data after a graceful drop: nobody will read it.
    let (b, _host, t, s) = plain_pair(7037, Duration::from_secs(60)).await;
    drop(s);
    assert_eq!(
        timeout(LIMIT, read_transport_to_end(&t)).await.unwrap(),
        b""
    );
    t.enqueue(bytes::Bytes::from_static(b"too late")).unwrap();
    assert!(eventually(|| b.diagnostics().closing_plain_streams() == 0).await);
    assert_eq!(
        t.poll_enqueue_ready(&mut std::task::Context::from_waker(
            futures_util::task::noop_waker_ref()
        ))
        .map_err(|e| std::io::Error::from(e).kind()),
        std::task::Poll::Ready(Err(ErrorKind::ConnectionReset))
    );
}

/// A plain-TCP stream dropped while its peer neither reads nor closes is held only until
/// the linger timeout: then the connection is reset and counted. The peer's TCP took the
/// bytes and the FIN before (its reads see them, then end of stream, as a kernel
/// socket's would); the reset fails its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_plain_stream_is_reset_after_the_linger_timeout() {
    let (b, _host, t, mut s) = plain_pair(7038, Duration::from_millis(200)).await;
    s.write_all(b"unread by the peer").await.unwrap();
    drop(s);
    assert_eq!(b.diagnostics().closing_plain_streams(), 1);
    assert!(eventually(|| b.diagnostics().closing_plain_streams() == 0).await);
    assert_eq!(b.diagnostics().plain_linger_expired(), 1);
    assert_eq!(b.pending_tx_bytes(), 0);
    assert_eq!(
        timeout(LIMIT, read_transport_to_end(&t)).await.unwrap(),
        b"unread by the peer"
    );
    assert!(
        eventually(|| matches!(
            t.enqueue(bytes::Bytes::from_static(b"x")),
            Err(netdriver::channel::EnqueueError::Closed(
                netdriver::channel::ChannelError::Reset
            ))
        ))
        .await,
        "the peer's connection is reset"
    );
}

/// A peer that goes silent (its queues die: nothing more on the wire, no FIN, no RST):
/// the channels' keep-alive gives up on it, and the stream's pending read and every later
/// call fail with `TimedOut`.
#[tokio::test]
async fn channel_timeout_fails_pending_and_later_operations_with_timed_out() {
    let net = MemNetwork::new();
    let a = Stack::builder()
        .ipv4(A)
        .channels(2)
        .keepalive(Some(Duration::from_millis(200)))
        .keepalive_interval(Duration::from_millis(100))
        .keepalive_probes(2)
        .build_in_memory(&net)
        .unwrap();
    let b = Stack::builder()
        .ipv4(B)
        .channels(2)
        .build_in_memory(&net)
        .unwrap();
    let (mut c, mut s) = connected(&a, &b, 7030).await;
    c.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    timeout(LIMIT, s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"ping");
    let pending = tokio::spawn(async move {
        let r = c.read(&mut [0u8; 16]).await;
        (c, r)
    });
    tokio::task::yield_now().await;
    // B goes silent; A's keep-alive gives up on it.
    for q in 0..net.queues() as u32 {
        assert!(b.diagnostics().kill_queue(q));
    }
    let (mut c, r) = timeout(LIMIT, pending).await.unwrap().unwrap();
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert!(e.to_string().contains("peer unreachable"), "{e}");
    // Later calls fail at once, the same way.
    let e = timeout(LIMIT, c.write_all(b"x"))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    let e = timeout(LIMIT, c.read(&mut [0u8; 4]))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
}

/// Socket buffers (and credit) large enough for 4 MiB to sit in a send buffer, and then
/// in the peer's receive buffer, without anyone reading.
fn big_buffers() -> vns::Config {
    vns::Config {
        send_buffer: 8 << 20,
        recv_buffer: 8 << 20,
        credit_window: 8 << 20,
        ..vns::Config::default()
    }
}

/// Stacks `a` and `b` with these socket configurations; `b` gets `linger` as its drop
/// linger time.
fn stacks(a_cfg: vns::Config, b_cfg: vns::Config, linger: Duration) -> (Stack, Stack) {
    let net = MemNetwork::new();
    let a = Stack::builder()
        .ipv4(A)
        .channels(2)
        .vns_config(a_cfg)
        .build_in_memory(&net)
        .unwrap();
    let b = Stack::builder()
        .ipv4(B)
        .channels(2)
        .vns_config(b_cfg)
        .linger(linger)
        .build_in_memory(&net)
        .unwrap();
    (a, b)
}

/// Reads until end of stream or an error: what was read, and the error if any.
async fn read_until_end_or_error(s: &mut VirtualStream) -> (Vec<u8>, Option<std::io::Error>) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf).await {
            Ok(0) => return (got, None),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return (got, Some(e)),
        }
    }
}

/// A stream writes 4 MB and is dropped; the stack's graceful shutdown delivers all of
/// it and closes before it returns, and the peer, which had not read anything yet, then
/// reads all 4 MB and end of stream although the channels are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_delivers_a_dropped_streams_bytes() {
    const LEN: usize = 4 << 20;
    let (a, b) = stacks(big_buffers(), big_buffers(), Duration::from_secs(5));
    let (mut c, mut s) = connected(&a, &b, 7100).await;
    let data = pattern(100, LEN);
    s.write_all(&data).await.unwrap();
    drop(s);
    timeout(LIMIT, b.shutdown_graceful(LIMIT))
        .await
        .unwrap()
        .expect("everything delivered within the linger time");
    // The stopped stack refuses new work.
    assert!(b.bind(addr(B, 7101)).await.is_err());
    assert!(a.connect(addr(B, 7100)).await.is_err());
    let (got, err) = timeout(LIMIT, read_until_end_or_error(&mut c))
        .await
        .unwrap();
    assert!(
        err.is_none(),
        "read failed: {err:?} after {} bytes",
        got.len()
    );
    assert!(got == data, "got {} of {LEN} bytes", got.len());
    // Our write side lost its channels with the peer's stack.
    assert!(c.write_all(b"x").await.is_err());
}

/// With default buffers 4 MB do not fit: the shutdown waits for the reader (reading
/// meanwhile), whose last bytes survive the channels' closing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_waits_for_a_slow_reader() {
    const LEN: usize = 4 << 20;
    let (a, b) = pair(2);
    let (mut c, s) = connected(&a, &b, 7102).await;
    let data = pattern(102, LEN);
    let sent = data.clone();
    let reader = tokio::spawn(async move { read_until_end_or_error(&mut c).await });
    let writer = tokio::spawn(async move {
        let mut s = s;
        s.write_all(&sent).await.unwrap();
        // Dropped without shutdown: closes gracefully and lingers in the stack.
    });
    timeout(LIMIT, writer).await.unwrap().unwrap();
    timeout(LIMIT, b.shutdown_graceful(LIMIT))
        .await
        .unwrap()
        .expect("delivered within the linger time");
    let (got, err) = timeout(LIMIT, reader).await.unwrap().unwrap();
    assert!(
        err.is_none(),
        "read failed: {err:?} after {} bytes",
        got.len()
    );
    assert!(got == data, "got {} of {LEN} bytes", got.len());
}

/// A peer that never reads: `drained` does not resolve, and the graceful shutdown gives
/// up after its linger time, aborts and says so; the peer's stream fails (bounded)
/// without the bytes it never got, and so does the open stream's writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_gives_up_after_the_linger_time() {
    const LEN: usize = 4 << 20;
    let linger = Duration::from_millis(300);
    // The server's send buffer takes it all; the client's credit is the default.
    let (a, b) = stacks(
        vns::Config::default(),
        big_buffers(),
        Duration::from_secs(5),
    );
    let (mut c, mut s) = connected(&a, &b, 7104).await;
    s.write_all(&pattern(104, LEN)).await.unwrap();
    // Not dropped: an open stream is shut by the shutdown.
    assert!(b.pending_tx_bytes() > 0);
    assert!(
        timeout(Duration::from_millis(50), b.drained())
            .await
            .is_err(),
        "drained with {} bytes pending",
        b.pending_tx_bytes()
    );
    let started = std::time::Instant::now();
    let r = timeout(LIMIT, b.shutdown_graceful(linger)).await.unwrap();
    let took = started.elapsed();
    assert_eq!(
        r.expect_err("not everything can be delivered").kind(),
        ErrorKind::TimedOut
    );
    assert!(took >= linger, "returned after {took:?}");
    assert!(
        took < linger + Duration::from_secs(5),
        "returned after {took:?}"
    );
    assert!(s.write_all(b"x").await.is_err());
    let (got, err) = timeout(LIMIT, read_until_end_or_error(&mut c))
        .await
        .unwrap();
    assert!(got.len() < LEN, "read {} bytes", got.len());
    assert_eq!(
        err.expect("the stream fails").kind(),
        ErrorKind::ConnectionAborted
    );
}

/// Dropping the last handle of a stack with bytes undelivered returns at once; the
/// stack delivers them in the background (the peer reads all 4 MB and end of stream),
/// then its control task closes the channels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_delivers_in_the_background() {
    const LEN: usize = 4 << 20;
    let (a, b) = stacks(
        vns::Config::default(),
        big_buffers(),
        Duration::from_secs(20),
    );
    let (mut c, mut s) = connected(&a, &b, 7106).await;
    let data = pattern(106, LEN);
    s.write_all(&data).await.unwrap();
    drop(s);
    // The client's credit is the default: most of it waits in b's stack.
    assert!(b.pending_tx_bytes() > LEN / 2, "{}", b.pending_tx_bytes());
    let started = std::time::Instant::now();
    drop(b);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "the drop waited {took:?}");
    let (got, err) = timeout(LIMIT, read_until_end_or_error(&mut c))
        .await
        .unwrap();
    assert!(
        err.is_none(),
        "read failed: {err:?} after {} bytes",
        got.len()
    );
    assert!(got == data, "got {} of {LEN} bytes", got.len());
    // Then b's control task closed its channels and stopped.
    timeout(LIMIT, a.channels_closed()).await.unwrap();
    assert_eq!(a.diagnostics().channel_count(), 0);
}

/// Stacks `a` and `b` as [`stacks`] makes them, `a` noticing within seconds a peer that
/// stops answering (user timeout 3 s, keep-alive after 2 s idle, 2 probes 1 s apart).
fn stacks_quick_to_notice(b_cfg: vns::Config, linger: Duration) -> (Stack, Stack) {
    let net = MemNetwork::new();
    let a = Stack::builder()
        .ipv4(A)
        .channels(2)
        .user_timeout(Duration::from_secs(3))
        .keepalive(Some(Duration::from_secs(2)))
        .keepalive_interval(Duration::from_secs(1))
        .keepalive_probes(2)
        .build_in_memory(&net)
        .unwrap();
    let b = Stack::builder()
        .ipv4(B)
        .channels(2)
        .vns_config(b_cfg)
        .linger(linger)
        .build_in_memory(&net)
        .unwrap();
    (a, b)
}

/// Whether `e` is how a stream learns that its peer's stack aborted: the peer's resets
/// (`ConnectionAborted`, once the stack gives up reopening channels to it), or, where the
/// resets were refused or lost, the channels' user timeout (`TimedOut`). A reset sent
/// while the receiver's window is closed and its last ACKs are still on the wire carries
/// a sequence number the receiver must drop (RFC 9293 §3.10.7.4, RFC 5961 §3.2), and the
/// in-memory switch drops frames to a stopped host, as a host whose stack is gone would,
/// instead of answering for it; both outcomes are an abort to the reader.
fn is_abort(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::ConnectionAborted | ErrorKind::TimedOut)
}

/// Linger zero is the old behaviour: dropping the last handle aborts at once, and the
/// peer loses what was not delivered; `shutdown_graceful(ZERO)` aborts too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linger_zero_aborts_at_once() {
    const LEN: usize = 4 << 20;
    let (a, b) = stacks_quick_to_notice(big_buffers(), Duration::ZERO);
    let (mut c, mut s) = connected(&a, &b, 7108).await;
    s.write_all(&pattern(108, LEN)).await.unwrap();
    drop(s);
    assert!(b.pending_tx_bytes() > LEN / 2, "{}", b.pending_tx_bytes());
    drop(b);
    let (got, err) = match timeout(LIMIT, read_until_end_or_error(&mut c)).await {
        Ok(r) => r,
        Err(_) => panic!(
            "no end or error within {LIMIT:?}: channels {}, placement {}, {:#?}, pending {}",
            a.diagnostics().channel_count(),
            a.diagnostics().channel_placement(),
            a.diagnostics().stats().channels,
            a.pending_tx_bytes()
        ),
    };
    assert!(got.len() < LEN, "read {} bytes", got.len());
    let e = err.expect("the stream fails");
    assert!(is_abort(&e), "{e}");

    let (a, b) = stacks_quick_to_notice(big_buffers(), Duration::from_secs(5));
    let (mut c, mut s) = connected(&a, &b, 7109).await;
    s.write_all(&pattern(109, LEN)).await.unwrap();
    let e = b.shutdown_graceful(Duration::ZERO).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotConnected);
    let (got, err) = timeout(LIMIT, read_until_end_or_error(&mut c))
        .await
        .unwrap();
    assert!(got.len() < LEN, "read {} bytes", got.len());
    let e = err.expect("the stream fails");
    assert!(is_abort(&e), "{e}");
}

/// `drained` resolves once a dropped stream's bytes are delivered, woken by the stack
/// (the reader reads after the wait began), and at once on a stack with nothing
/// pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_resolves_when_everything_is_delivered() {
    let (a, b) = pair(2);
    timeout(LIMIT, b.drained()).await.unwrap();
    let (mut c, mut s) = connected(&a, &b, 7110).await;
    let data = pattern(110, 100_000);
    s.write_all(&data).await.unwrap();
    drop(s);
    let wait = tokio::spawn(b.drained());
    let mut got = Vec::new();
    timeout(LIMIT, c.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got == data);
    timeout(LIMIT, wait).await.unwrap().unwrap();
    assert_eq!(b.pending_tx_bytes(), 0);
    // A stopped stack resolves at once.
    b.abort();
    timeout(LIMIT, b.drained()).await.unwrap();
}

/// One 8 MB stream and 16 small ones both ways over 4 channels; `resets` channels are
/// reset (by the side `from`) while they transfer. Every byte arrives once, in order.
async fn transfer_through_channel_resets(from_a: bool, resets: usize) {
    const BIG: usize = 8 << 20;
    const SMALL: usize = 64 * 1024;
    let (a, b) = pair(4);
    let (mut big_c, mut big_s) = connected(&a, &b, 7200).await;
    let mut small = Vec::new();
    for i in 0..16u16 {
        small.push(connected(&a, &b, 7201 + i).await);
    }
    let data = pattern(200, BIG);
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        big_c.write_all(&sent).await.unwrap();
        big_c.shutdown().await.unwrap();
        big_c
    });
    let mut tasks = Vec::new();
    for (i, (mut c, mut s)) in small.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let up = pattern(300 + i as u32, SMALL);
            let down = pattern(400 + i as u32, SMALL);
            let (up2, down2) = (up.clone(), down.clone());
            let w1 = async {
                c.write_all(&up2).await.unwrap();
                c.shutdown().await.unwrap();
                read_until_end_or_error(&mut c).await
            };
            let w2 = async {
                s.write_all(&down2).await.unwrap();
                s.shutdown().await.unwrap();
                read_until_end_or_error(&mut s).await
            };
            let ((got_down, e1), (got_up, e2)) = tokio::join!(w1, w2);
            assert!(e1.is_none() && e2.is_none(), "{e1:?} {e2:?}");
            assert!(got_up == up, "small stream {i} up");
            assert!(got_down == down, "small stream {i} down");
        }));
    }
    let mut got = Vec::with_capacity(BIG);
    let mut buf = vec![0u8; 64 * 1024];
    let mut resets_left = resets;
    let resent_now = || {
        a.diagnostics().endpoint_counters().resent_chunks
            + b.diagnostics().endpoint_counters().resent_chunks
    };
    // A reset that found nothing unacknowledged on the channel (the writer paused, all
    // acknowledged) exercises no recovery: then one more, at the next eighth (seen once in
    // a CI run under load, "nothing was sent again").
    let mut spare_resets = 4;
    let mut eighths_done = 0;
    loop {
        let n = timeout(LIMIT, big_s.read(&mut buf)).await.unwrap().unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        // Reset a channel each time another eighth of the stream arrived.
        if got.len() >= (eighths_done + 1) * BIG / 8 {
            eighths_done += 1;
            let extra = resets_left == 0 && resent_now() == 0 && spare_resets > 0;
            if resets_left > 0 || extra {
                let side = if from_a { &a } else { &b };
                assert!(side.diagnostics().reset_channel(0));
                if extra {
                    spare_resets -= 1;
                } else {
                    resets_left -= 1;
                }
            }
        }
    }
    assert_eq!(resets_left, 0);
    assert!(got == data, "got {} of {BIG} bytes", got.len());
    timeout(LIMIT, writer).await.unwrap().unwrap();
    for t in tasks {
        timeout(LIMIT, t).await.unwrap().unwrap();
    }
    let resent = a.diagnostics().endpoint_counters().resent_chunks
        + b.diagnostics().endpoint_counters().resent_chunks;
    assert!(resent > 0, "nothing was sent again");
}

/// A channel reset mid-transfer loses nothing: its sockets' chunks go again on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_channel_loses_no_byte() {
    transfer_through_channel_resets(true, 1).await;
}

/// The receiving side resets three of the four channels, one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_reset_channels_lose_no_byte() {
    transfer_through_channel_resets(false, 3).await;
}

/// Every channel reset: the side that opened them opens them again and the streams carry
/// on over the new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_reopen_after_the_last_one_is_reset() {
    let (a, b) = pair(2);
    let (mut c, mut s) = connected(&a, &b, 7300).await;
    c.write_all(b"before").await.unwrap();
    let mut buf = [0u8; 6];
    timeout(LIMIT, s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(a.diagnostics().reset_channel(0));
    assert!(a.diagnostics().reset_channel(0));
    c.write_all(b"after").await.unwrap();
    let mut buf = [0u8; 5];
    timeout(LIMIT, s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"after");
    s.write_all(b"back").await.unwrap();
    let mut buf = [0u8; 4];
    timeout(LIMIT, c.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"back");
    assert!(a.diagnostics().channel_count() >= 1);
}

/// In-memory channels are TCP connections like AF_XDP ones: each has its wire snapshot
/// (4-tuple, queue, sequence numbers), and a queue killed on one side loses its channels
/// there while the streams carry on over the others; no RST is ever received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_channels_have_wires_and_queues_that_can_die() {
    let (a, b) = pair(3);
    let (mut c, mut s) = connected(&a, &b, 7300).await;
    let wire = a.diagnostics().channel_wire();
    assert_eq!(wire.len(), a.diagnostics().channel_count());
    assert!(wire.len() >= 3, "{wire:?}");
    assert!(
        wire.iter()
            .all(|w| *w.local.ip() == A && *w.peer.ip() == B && w.queue < 2),
        "{wire:?}"
    );
    let on_zero = wire.iter().filter(|w| w.queue == 0).count();
    assert!(
        on_zero > 0 && on_zero < wire.len(),
        "channels on both queues: {wire:?}"
    );
    assert!(a.diagnostics().kill_queue(0));
    assert!(!a.diagnostics().kill_queue(0), "killed once");
    c.write_all(b"still here").await.unwrap();
    let mut got = [0u8; 10];
    timeout(LIMIT, s.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"still here");
    assert_eq!(
        (
            a.diagnostics().channel_resets_received(),
            b.diagnostics().channel_resets_received()
        ),
        (0, 0)
    );
}
