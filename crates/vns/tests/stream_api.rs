//! The rest of `tokio::net::TcpStream`'s surface on `VirtualStream` and its halves:
//! readiness (`ready`, `readable`, `writable`, `poll_*_ready`), non-blocking calls
//! (`try_read*`, `try_write*`, `try_io`), `peek`, and `reunite` with its error type; on
//! virtual sockets and on plain-TCP streams, over the in-memory network.

use std::io::{ErrorKind, IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::time::timeout;
use vns::stack::{MemNetwork, Stack};
use vns::VirtualStream;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const LIMIT: Duration = Duration::from_secs(30);

fn addr(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddrV4::new(ip, port).into()
}

async fn connected(a: &Stack, b: &Stack, port: u16) -> (VirtualStream, VirtualStream) {
    let l = b.bind(addr(B, port)).await.unwrap();
    let c = timeout(LIMIT, a.connect(addr(B, port)))
        .await
        .unwrap()
        .unwrap();
    let (s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    (c, s)
}

#[tokio::test]
async fn readiness_and_non_blocking_calls() {
    let (a, b) = Stack::pair_in_memory(2).unwrap();
    let (c, s) = connected(&a, &b, 7300).await;

    // Nothing to read yet: `try_read` does not wait, `ready` reports writable only.
    let mut buf = [0u8; 64];
    assert_eq!(
        s.try_read(&mut buf).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    let r = timeout(LIMIT, s.ready(Interest::READABLE | Interest::WRITABLE))
        .await
        .unwrap()
        .unwrap();
    assert!(r.is_writable() && !r.is_readable(), "{r:?}");
    timeout(LIMIT, c.writable()).await.unwrap().unwrap();

    // Written without waiting, then readable on the other side.
    assert_eq!(c.try_write(b"hello, ").unwrap(), 7);
    let parts = [IoSlice::new(b"vectored "), IoSlice::new(b"world")];
    assert_eq!(c.try_write_vectored(&parts).unwrap(), 14);
    timeout(LIMIT, s.readable()).await.unwrap().unwrap();
    let mut got = Vec::new();
    while got.len() < 21 {
        match s.try_read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                timeout(LIMIT, s.readable()).await.unwrap().unwrap()
            }
            Err(e) => panic!("try_read: {e}"),
        }
    }
    assert_eq!(got, b"hello, vectored world");
    assert_eq!(
        s.try_read(&mut buf).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );

    // `try_read_vectored` fills its buffers in order, `try_read_buf` advances a BufMut.
    c.try_write(b"0123456789").unwrap();
    timeout(LIMIT, s.readable()).await.unwrap().unwrap();
    let (mut x, mut y) = ([0u8; 4], [0u8; 3]);
    let n = {
        let mut bufs = [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)];
        s.try_read_vectored(&mut bufs).unwrap()
    };
    assert_eq!(n, 7);
    assert_eq!((&x, &y), (b"0123", b"456"));
    let mut rest = bytes::BytesMut::with_capacity(16);
    assert_eq!(s.try_read_buf(&mut rest).unwrap(), 3);
    assert_eq!(&rest[..], b"789");

    // `try_io` runs the closure only when ready.
    let r = s.try_io(Interest::READABLE, || Ok::<_, std::io::Error>(1));
    assert_eq!(r.unwrap_err().kind(), ErrorKind::WouldBlock);
    c.try_write(b"!").unwrap();
    timeout(LIMIT, s.readable()).await.unwrap().unwrap();
    let r = s.try_io(Interest::READABLE, || s.try_read(&mut buf));
    assert_eq!(r.unwrap(), 1);

    // End of stream is readiness, and `try_read` returns 0.
    let mut c = c;
    c.shutdown().await.unwrap();
    timeout(LIMIT, s.readable()).await.unwrap().unwrap();
    assert_eq!(s.try_read(&mut buf).unwrap(), 0);
}

#[tokio::test]
async fn peek_leaves_the_bytes_for_the_next_read() {
    let (a, b) = Stack::pair_in_memory(3).unwrap();
    let (mut c, mut s) = connected(&a, &b, 7301).await;
    c.write_all(b"peekaboo").await.unwrap();
    let mut p = [0u8; 4];
    let n = timeout(LIMIT, s.peek(&mut p)).await.unwrap().unwrap();
    assert_eq!(&p[..n], &b"peekaboo"[..n]);
    // Peeking again sees the same bytes; reading consumes them.
    let mut p2 = [0u8; 4];
    let n2 = s.peek(&mut p2).await.unwrap();
    assert_eq!(&p2[..n2], &p[..n2.min(n)]);
    let mut all = [0u8; 8];
    s.read_exact(&mut all).await.unwrap();
    assert_eq!(&all, b"peekaboo");
    // A large message across several chunks peeks whole up to the buffer.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    c.write_all(&big).await.unwrap();
    let mut got = Vec::new();
    while got.len() < big.len() {
        let mut window = vec![0u8; 50_000];
        let n = timeout(LIMIT, s.peek(&mut window)).await.unwrap().unwrap();
        assert!(n > 0);
        assert_eq!(
            &window[..n],
            &big[got.len()..got.len() + n],
            "peek at {}",
            got.len()
        );
        let mut take = vec![0u8; n];
        s.read_exact(&mut take).await.unwrap();
        assert_eq!(take, &window[..n]);
        got.extend_from_slice(&take);
    }
    c.shutdown().await.unwrap();
    let mut p = [0u8; 4];
    assert_eq!(timeout(LIMIT, s.peek(&mut p)).await.unwrap().unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halves_have_readiness_and_reunite_checks_its_halves() {
    let (a, b) = Stack::pair_in_memory(2).unwrap();
    let (mut c, mut s) = connected(&a, &b, 7302).await;
    {
        let (r, w) = s.split();
        assert_eq!(r.local_addr().unwrap(), addr(B, 7302));
        assert_eq!(w.peer_addr().unwrap(), c.local_addr().unwrap());
        c.write_all(b"ab").await.unwrap();
        timeout(LIMIT, r.readable()).await.unwrap().unwrap();
        let mut p = [0u8; 2];
        let n = r.peek(&mut p).await.unwrap();
        assert!(n >= 1 && p[0] == b'a');
        timeout(LIMIT, w.writable()).await.unwrap().unwrap();
        assert_eq!(w.try_write(b"cd").unwrap(), 2);
    }
    let mut back = [0u8; 2];
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"cd");

    let (sr, sw) = s.into_split();
    let (cr, cw) = c.into_split();
    // Halves of different streams: both come back in the error.
    let err = sr.reunite(cw).unwrap_err();
    assert!(err.to_string().contains("not from the same stream"));
    let vns::stack::ReuniteError(sr, cw) = err;
    let _s = sw.reunite(sr).expect("halves of one stream");
    let _c = cw.reunite(cr).expect("halves of one stream");
}

/// `socket_stats` reports the virtual socket's buffers: bytes written and not yet read by
/// the peer are kept for resending, bytes arrived and not read are readable; a plain-TCP
/// stream has none.
#[tokio::test]
async fn socket_stats_show_what_waits_where() {
    let (a, b) = Stack::pair_in_memory(2).unwrap();
    let (mut c, mut s) = connected(&a, &b, 7304).await;
    c.write_all(&[7u8; 1000]).await.unwrap();
    // Readable once the bytes are in; the writer keeps them until the reader reads.
    timeout(LIMIT, s.readable()).await.unwrap().unwrap();
    let mut buf = [0u8; 1000];
    let mut at = 0;
    while s.socket_stats().unwrap().readable_bytes + at < 1000 {
        // Not every chunk may be in at the first readiness.
        at += s.read(&mut buf[at..]).await.unwrap();
    }
    let rs = s.socket_stats().unwrap();
    assert_eq!(rs.readable_bytes + at, 1000);
    assert!(!rs.stop_sent && rs.parked_bytes == 0);
    let ws = c.socket_stats().unwrap();
    assert_eq!(ws.unsent_bytes, 0);
    assert!(ws.unacked_bytes > 0 && ws.unacked_bytes <= 1000);
    s.read_exact(&mut buf[at..]).await.unwrap();
    assert_eq!(s.socket_stats().unwrap().readable_bytes, 0);

    let net = MemNetwork::new();
    let a = Stack::builder().ipv4(A).build_in_memory(&net).unwrap();
    let plain_host = net.host(Ipv4Addr::new(10, 0, 0, 3)).unwrap();
    let _acceptor = plain_host.listen(7305).unwrap();
    let p = timeout(LIMIT, a.connect(addr(Ipv4Addr::new(10, 0, 0, 3), 7305)))
        .await
        .unwrap()
        .unwrap();
    assert!(p.is_plain_tcp());
    assert_eq!(p.socket_stats(), None);
}

#[tokio::test]
async fn plain_tcp_streams_peek_and_try_read() {
    let net = MemNetwork::new();
    let a = Stack::builder().ipv4(A).build_in_memory(&net).unwrap();
    // A plain server (no channel port): the stream falls back to plain TCP.
    let plain_host = net.host(Ipv4Addr::new(10, 0, 0, 3)).unwrap();
    let acceptor = plain_host.listen(7303).unwrap();
    let mut c = timeout(LIMIT, a.connect(addr(Ipv4Addr::new(10, 0, 0, 3), 7303)))
        .await
        .unwrap()
        .unwrap();
    assert!(c.is_plain_tcp());
    let t = std::future::poll_fn(|cx| acceptor.poll_accept(cx))
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        c.try_read(&mut buf).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    t.enqueue(bytes::Bytes::from_static(b"plain bytes"))
        .unwrap();
    timeout(LIMIT, c.readable()).await.unwrap().unwrap();
    let mut p = [0u8; 5];
    let n = c.peek(&mut p).await.unwrap();
    assert_eq!(&p[..n], &b"plain"[..n]);
    let mut got = Vec::new();
    while got.len() < 11 {
        match c.try_read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                timeout(LIMIT, c.readable()).await.unwrap().unwrap()
            }
            Err(e) => panic!("try_read: {e}"),
        }
    }
    assert_eq!(got, b"plain bytes");
    timeout(LIMIT, c.writable()).await.unwrap().unwrap();
    assert_eq!(c.try_write(b"reply").unwrap(), 5);
    t.close();
    timeout(LIMIT, c.readable()).await.unwrap().unwrap();
    assert_eq!(c.try_read(&mut buf).unwrap(), 0);
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn listener_local_addr_is_the_bound_address() {
    let (_a, b) = Stack::pair_in_memory(1).unwrap();
    let any = b.bind(addr(Ipv4Addr::UNSPECIFIED, 7310)).await.unwrap();
    assert_eq!(any.local_addr().unwrap(), addr(Ipv4Addr::UNSPECIFIED, 7310));
    let own = b.bind(addr(B, 7311)).await.unwrap();
    assert_eq!(own.local_addr().unwrap(), addr(B, 7311));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_awaited_from_several_tasks() {
    let (a, b) = Stack::pair_in_memory(2).unwrap();
    let l = std::sync::Arc::new(b.bind(addr(B, 7313)).await.unwrap());
    // Three tasks wait in `accept` at once; each must get one of the three connections.
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let l = l.clone();
            tokio::spawn(async move {
                let (mut s, _) = l.accept().await.unwrap();
                let mut b = [0u8; 1];
                s.read_exact(&mut b).await.unwrap();
                b[0]
            })
        })
        .collect();
    tokio::task::yield_now().await;
    let mut clients = Vec::new();
    for i in 0..3u8 {
        let mut c = timeout(LIMIT, a.connect(addr(B, 7313)))
            .await
            .unwrap()
            .unwrap();
        c.write_all(&[i]).await.unwrap();
        clients.push(c);
    }
    let mut got = Vec::new();
    for t in tasks {
        got.push(
            timeout(LIMIT, t)
                .await
                .expect("an accept was never woken")
                .unwrap(),
        );
    }
    got.sort_unstable();
    assert_eq!(got, [0, 1, 2]);
}

#[tokio::test]
async fn connect_and_bind_resolve_names_on_the_default_stack() {
    let (a, b) = Stack::pair_in_memory(1).unwrap();
    vns::stack::set_default_stack(a.clone());
    let l = b.bind(addr(B, 7314)).await.unwrap();
    // A string, resolved without blocking; then a list where only the last connects.
    let mut c = timeout(LIMIT, VirtualStream::connect("10.0.0.2:7314"))
        .await
        .unwrap()
        .unwrap();
    let (mut s, _) = l.accept().await.unwrap();
    c.write_all(b"x").await.unwrap();
    let mut one = [0u8; 1];
    s.read_exact(&mut one).await.unwrap();
    let tried: &[SocketAddr] = &[addr(B, 7399), addr(B, 7314)];
    let c2 = timeout(LIMIT, VirtualStream::connect(tried)).await.unwrap();
    assert!(c2.is_ok(), "the second address listens: {c2:?}");
    // IPv6 only: a clear error.
    let e = VirtualStream::connect("[::1]:7314").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AddrNotAvailable);
    let l2 = vns::VirtualListener::bind("0.0.0.0:7315").await.unwrap();
    assert_eq!(l2.local_addr().unwrap(), addr(Ipv4Addr::UNSPECIFIED, 7315));
    // A real name of this host: `localhost`, resolved by the system (its IPv6 address,
    // if any, is skipped), is served through the kernel's loopback.
    let lo = vns::VirtualListener::bind("localhost:0").await.unwrap();
    let lo_port = lo.local_addr().unwrap().port();
    assert_eq!(lo.local_addr().unwrap(), addr(Ipv4Addr::LOCALHOST, lo_port));
    let mut c3 = timeout(
        LIMIT,
        VirtualStream::connect(format!("localhost:{lo_port}")),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(c3.is_loopback());
    let (mut s3, _) = lo.accept().await.unwrap();
    c3.write_all(b"by name").await.unwrap();
    let mut seven = [0u8; 7];
    s3.read_exact(&mut seven).await.unwrap();
    assert_eq!(&seven, b"by name");
    // A name that does not resolve: the resolver's error, not a panic.
    assert!(VirtualStream::connect("no-such-host.invalid:1")
        .await
        .is_err());
    vns::stack::clear_default_stack();
}

/// `poll_write_vectored` is a true vectored write: every piece in one call, read back in
/// order (the endpoint joins them into one chunk: `tests/endpoint.rs`).
#[tokio::test]
async fn write_vectored_takes_every_piece_in_one_call() {
    let (a, b) = Stack::pair_in_memory(2).unwrap();
    let (mut c, mut s) = connected(&a, &b, 7320).await;
    assert!(tokio::io::AsyncWrite::is_write_vectored(&c));
    let pieces = [
        IoSlice::new(b"ab"),
        IoSlice::new(b""),
        IoSlice::new(b"cdef"),
    ];
    let n = c.write_vectored(&pieces).await.unwrap();
    assert_eq!(n, 6);
    let n = c.try_write_vectored(&[IoSlice::new(b"g"), IoSlice::new(b"hi")]);
    assert_eq!(n.unwrap(), 3);
    c.shutdown().await.unwrap();
    let mut got = Vec::new();
    timeout(LIMIT, s.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, b"abcdefghi");
}

/// Streams to the stack's own address and to 127.0.0.1 stay on the host: they are plain
/// TCP over the kernel's loopback interface, accepted by the same listener that serves
/// virtual sockets from other hosts.
#[tokio::test]
async fn connects_to_this_host_go_through_the_kernels_loopback() {
    let (a, b) = Stack::pair_in_memory(1).unwrap();
    let l = b.bind(addr(Ipv4Addr::UNSPECIFIED, 0)).await.unwrap();
    assert!(l.serves_loopback());
    let port = l.local_addr().unwrap().port();
    // To the stack's own address.
    let mut own = timeout(LIMIT, b.connect(addr(B, port)))
        .await
        .unwrap()
        .unwrap();
    assert!(own.is_loopback() && own.is_plain_tcp());
    assert_eq!(own.peer_addr().unwrap(), addr(B, port));
    assert_eq!(own.local_addr().unwrap().ip(), B);
    let (mut s, from) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    assert!(s.is_loopback());
    assert_eq!(from.ip(), Ipv4Addr::LOCALHOST);
    own.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    s.write_all(b"pong").await.unwrap();
    own.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"pong");
    // Real socket options, and the kernel socket can be handed over.
    own.set_nodelay(true).unwrap();
    assert!(own.nodelay().unwrap());
    own.set_linger(Some(Duration::from_secs(3))).unwrap();
    assert_eq!(own.linger().unwrap(), Some(Duration::from_secs(3)));
    let std_stream = own.into_std().unwrap();
    assert_eq!(
        std_stream.peer_addr().unwrap(),
        addr(Ipv4Addr::LOCALHOST, port)
    );
    drop(std_stream);
    // The kernel's close: end of stream for the peer.
    assert_eq!(s.read(&mut buf).await.unwrap(), 0);
    // To 127.0.0.1, with a half close.
    let mut lo = timeout(LIMIT, b.connect(addr(Ipv4Addr::LOCALHOST, port)))
        .await
        .unwrap()
        .unwrap();
    let (mut s2, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    lo.write_all(b"abc").await.unwrap();
    lo.shutdown().await.unwrap();
    let mut got = Vec::new();
    s2.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"abc");
    s2.write_all(b"back").await.unwrap();
    drop(s2);
    let mut back = Vec::new();
    lo.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"back");
    // Another host still gets a virtual socket on the same listener.
    let (remote, _) = tokio::join!(a.connect(addr(B, port)), async {
        let (s, _) = l.accept().await.unwrap();
        assert!(!s.is_loopback() && !s.is_plain_tcp());
    });
    let remote = remote.unwrap();
    assert!(!remote.is_loopback());
    let e = remote.into_std().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.to_string().contains("no kernel socket"), "{e}");
}

/// A listener on a loopback address is the kernel's only: this host reaches it, other
/// hosts' virtual sockets do not; nothing listening is refused as by the kernel.
#[tokio::test]
async fn a_loopback_bind_serves_this_host_only() {
    let (a, b) = Stack::pair_in_memory(1).unwrap();
    let l = b.bind(addr(Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    assert_eq!(l.local_addr().unwrap(), addr(Ipv4Addr::LOCALHOST, port));
    let e = timeout(LIMIT, a.connect(addr(B, port)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
    let c = timeout(LIMIT, b.connect(addr(Ipv4Addr::LOCALHOST, port)))
        .await
        .unwrap()
        .unwrap();
    let (s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    // Dropping a stream with unread bytes resets the peer, as the kernel does.
    c.try_write(b"unread").unwrap();
    s.readable().await.unwrap();
    drop(s);
    let mut c = c;
    let mut buf = [0u8; 8];
    let r = timeout(LIMIT, c.read(&mut buf)).await.unwrap();
    assert_eq!(r.unwrap_err().kind(), ErrorKind::ConnectionReset);
    drop(l);
    let e = b
        .connect(addr(Ipv4Addr::LOCALHOST, port))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
    // Not an address of this host.
    let e = b
        .bind(addr(Ipv4Addr::new(10, 9, 9, 9), 0))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AddrNotAvailable);
    let e = b.bind(addr(B, 0)).await.unwrap().into_std().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
}

/// `VirtualSocket` (`TcpSocket`): options set before connect and listen reach the stream:
/// the send buffer bounds a write, `nodelay` and `linger` are the stream's (an accepting
/// listener passes them on), a bound local port is the stream's, and one in use is
/// refused.
#[tokio::test]
async fn virtual_socket_options_reach_the_stream() {
    let (a, b) = Stack::pair_in_memory(2).unwrap();
    let ls = b.socket();
    ls.set_recv_buffer_size(64 * 1024).unwrap();
    ls.set_nodelay(false).unwrap();
    ls.set_linger(Some(Duration::ZERO)).unwrap();
    ls.set_reuseaddr(true).unwrap();
    assert!(ls.reuseaddr().unwrap());
    assert_eq!(ls.recv_buffer_size().unwrap(), 64 * 1024);
    ls.bind(addr(B, 7330)).unwrap();
    assert_eq!(ls.local_addr().unwrap(), addr(B, 7330));
    let l = ls.listen(16).unwrap();
    assert_eq!(l.local_addr().unwrap(), addr(B, 7330));

    let cs = a.socket();
    assert!(cs.nodelay().unwrap(), "virtual sockets default to nodelay");
    cs.set_send_buffer_size(1000).unwrap();
    assert_eq!(cs.send_buffer_size().unwrap(), 1000);
    cs.set_nodelay(false).unwrap();
    cs.set_keepalive(true).unwrap();
    assert!(cs.keepalive().unwrap());
    // A local port that maps to a shard with the remote port, as received chunks do.
    let count = a.diagnostics().shards() as u32;
    let local = (40_000..41_000u32)
        .find(|p| (p + 7330) % count == 0)
        .unwrap() as u16;
    cs.bind(addr(Ipv4Addr::UNSPECIFIED, local)).unwrap();
    let c = timeout(LIMIT, cs.connect(addr(B, 7330)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.local_addr().unwrap().port(), local);
    assert!(!c.nodelay().unwrap());
    let (s, from) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    assert_eq!(from, addr(A, local));
    assert!(!s.nodelay().unwrap(), "the listener passes nodelay on");
    assert_eq!(s.linger().unwrap(), Some(Duration::ZERO));
    // The send buffer takes 1000 bytes and no more.
    assert_eq!(c.try_write(&[5u8; 5000]).unwrap(), 1000);
    // The same local port to the same peer port again: in use.
    let again = a.socket();
    again.bind(addr(Ipv4Addr::UNSPECIFIED, local)).unwrap();
    let e = again.connect(addr(B, 7330)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AddrInUse);
    // Not an address of this host; IPv6.
    let e = a
        .socket()
        .bind(addr(Ipv4Addr::new(10, 9, 9, 9), 1))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AddrNotAvailable);
    assert_eq!(
        vns::VirtualSocket::new_v6().unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    drop(s);
}

/// With `nodelay` off, a short write that waits behind unacknowledged data (the peer read
/// it but has nothing to reply, so no credit comes back) still leaves within
/// `Config::nagle_delay`: the stack's control task wakes for the hold. Every byte arrives,
/// in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nagle_holds_are_released_by_the_stack() {
    let (a, b) = Stack::pair_in_memory(2).unwrap();
    let (c, mut s) = connected(&a, &b, 7331).await;
    c.set_nodelay(false).unwrap();
    let mut c = c;
    let mut want = Vec::new();
    let mut got = Vec::new();
    for i in 0..50u8 {
        let piece = [i; 3];
        c.write_all(&piece).await.unwrap();
        want.extend_from_slice(&piece);
        // Each piece is read before the next is written: nothing comes back to the
        // writer, so the hold, not an acknowledgement, lets the next one go.
        while got.len() < want.len() {
            let mut buf = [0u8; 64];
            let n = timeout(LIMIT, s.read(&mut buf))
                .await
                .expect("a held write never left")
                .unwrap();
            got.extend_from_slice(&buf[..n]);
        }
    }
    assert_eq!(got, want);
}
