//! Moving a tokio program to netchannel is a rename of its imports, tested as one: the same
//! client and server code, written once against tokio's names, is compiled twice — `use
//! tokio::net::...` and `use netchannel::net::...` — and the two builds must produce the
//! same transcript. The netchannel build runs on the default stack (in-memory stacks, so
//! unprivileged) and talks to a virtual socket on another stack; the tokio build talks to a
//! kernel peer over the loopback interface.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(30);

/// A client as a tokio program writes it: `TcpSocket` options, `connect`, vectored and
/// plain writes, readiness, `peek`, owned halves, `shutdown`, `read_to_end`, `reunite`.
/// Returns what it saw.
macro_rules! client_program {
    ($net:ident, $addr:expr) => {{
        use std::io::IoSlice;
        use $net::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
        use $net::net::{TcpSocket, TcpStream};
        async move {
            let addr: SocketAddr = $addr;
            let socket = TcpSocket::new_v4()?;
            socket.set_nodelay(true)?;
            socket.set_recv_buffer_size(256 * 1024)?;
            let mut s: TcpStream = socket.connect(addr).await?;
            let mut log = Vec::new();
            log.push(format!("peer {}", s.peer_addr()?.port() == addr.port()));
            s.write_all(b"hello ").await?;
            let pieces = [IoSlice::new(b"vec"), IoSlice::new(b"tored\n")];
            let n = s.write_vectored(&pieces).await?;
            log.push(format!("vectored {n}"));
            // The echo comes back: wait for it, look without taking, then take.
            s.readable().await?;
            let mut first = [0u8; 5];
            let mut n = 0;
            while n < first.len() {
                n = s.peek(&mut first).await?;
            }
            log.push(format!("peeked {:?}", String::from_utf8_lossy(&first[..n])));
            // The IP options a stream has, and the error it holds back (none).
            log.push(format!("ttl {} {}", s.ttl()?, s.take_error()?.is_none()));
            s.set_ttl(64)?;
            s.set_quickack(true)?;
            log.push(format!("quickack {}", s.quickack()?));
            let (mut r, mut w): (OwnedReadHalf, OwnedWriteHalf) = s.into_split();
            let ready = w.ready(tokio::io::Interest::WRITABLE).await?;
            log.push(format!("write half ready {}", ready.is_writable()));
            w.write_all(b"bye\n").await?;
            w.shutdown().await?;
            let mut got = Vec::new();
            r.read_to_end(&mut got).await?;
            log.push(format!("echo {:?}", String::from_utf8_lossy(&got)));
            let s: TcpStream = r.reunite(w).expect("halves of one stream");
            log.push(format!("reunited {}", s.local_addr().is_ok()));
            Ok::<_, std::io::Error>(log)
        }
    }};
}

/// A server as a tokio program writes it: `bind` by string, `accept`, borrowed halves
/// copied into each other (an echo), then the stream dropped without `shutdown` (the
/// kernel's close: the peer reads everything, then end of stream).
macro_rules! server_program {
    ($net:ident, $bind:expr, $ready:expr) => {{
        use $net::net::TcpListener;
        async move {
            let listener = TcpListener::bind($bind).await?;
            assert_eq!(listener.ttl()?, 64);
            let port = listener.local_addr()?.port();
            let _ = $ready.send(port);
            let (mut s, _peer) = listener.accept().await?;
            let (mut r, mut w) = s.split();
            let ready = r.ready(tokio::io::Interest::READABLE).await?;
            assert!(ready.is_readable());
            let copied = tokio::io::copy(&mut r, &mut w).await?;
            w.write_all(b"served\n").await?;
            drop(s);
            Ok::<_, std::io::Error>(copied)
        }
    }};
}

/// An echo server on a kernel socket or a virtual one (the harness's side, not renamed).
async fn echo<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S) {
    let mut buf = vec![0u8; 4096];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        s.write_all(&buf[..n]).await.unwrap();
    }
    s.shutdown().await.unwrap();
}

/// What the harness's client sees from `server_program`.
async fn talk<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S) -> Vec<u8> {
    s.write_all(b"one two three").await.unwrap();
    s.shutdown().await.unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    got
}

#[test]
fn the_same_tokio_program_behaves_the_same_after_the_rename() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // tokio: a kernel echo server on the loopback interface.
        let kl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let kaddr = kl.local_addr().unwrap();
        let kserve = tokio::spawn(async move { echo(kl.accept().await.unwrap().0).await });
        let kernel_log = timeout(LIMIT, client_program!(tokio, kaddr))
            .await
            .unwrap()
            .unwrap();
        kserve.await.unwrap();

        // netchannel: the default stack is A; the echo server is a virtual socket on B.
        let (a, b) = netchannel::Stack::pair_in_memory(2).unwrap();
        netchannel::set_default_stack(a.clone());
        let b_ip = Ipv4Addr::new(10, 0, 0, 2);
        let vl = b.bind(SocketAddrV4::new(b_ip, 7700).into()).await.unwrap();
        let vserve = tokio::spawn(async move { echo(vl.accept().await.unwrap().0).await });
        let vaddr = SocketAddr::from(SocketAddrV4::new(b_ip, 7700));
        let virtual_log = timeout(LIMIT, client_program!(netchannel, vaddr))
            .await
            .unwrap()
            .unwrap();
        vserve.await.unwrap();
        assert_eq!(virtual_log, kernel_log);
        assert_eq!(
            kernel_log.last().map(String::as_str),
            Some("reunited true"),
            "{kernel_log:?}"
        );

        // The server side: tokio's on the loopback interface, ours on the default stack
        // reached from B over virtual sockets.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let kserver = tokio::spawn(server_program!(tokio, "127.0.0.1:0", tx));
        let port = rx.await.unwrap();
        let kc = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let kernel_reply = timeout(LIMIT, talk(kc)).await.unwrap();
        let kernel_copied = kserver.await.unwrap().unwrap();

        let (tx, rx) = tokio::sync::oneshot::channel();
        let vserver = tokio::spawn(server_program!(netchannel, "0.0.0.0:0", tx));
        let port = rx.await.unwrap();
        let a_ip = Ipv4Addr::new(10, 0, 0, 1);
        let vc = b
            .connect(SocketAddrV4::new(a_ip, port).into())
            .await
            .unwrap();
        assert!(
            !vc.is_loopback(),
            "another host reaches it over virtual sockets"
        );
        let virtual_reply = timeout(LIMIT, talk(vc)).await.unwrap();
        let virtual_copied = vserver.await.unwrap().unwrap();
        assert_eq!(virtual_reply, kernel_reply);
        assert_eq!(kernel_reply, b"one two threeserved\n");
        assert_eq!((virtual_copied, kernel_copied), (13, 13));
        netchannel::clear_default_stack();
    });
}
