//! Channels against the peer's kernel TCP on the test bed: bulk echo both ways (100 MB,
//! verified byte for byte), refusal and reset mapped to `io::ErrorKind`s, a slow reader,
//! and a kernel peer out of receive memory.
//!
//! Privileged: each test skips without root, and fails instead when
//! `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

mod common;

use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Instant;

use common::{
    config, echo, program_attached, read_verify, recv_stream, send_stream, start, write_stream,
    DEADLINE,
};
use netdriver::channel::{ChannelError, ChannelStream, Dequeued};
use testbed::{testbed_or_skip, Side, TestBed};

const MB: u64 = 1 << 20;
/// Bytes each bulk test sends one way (and gets back): 100 MB, or `NC_BULK_MB` MB.
fn bulk_bytes() -> u64 {
    std::env::var("NC_BULK_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
        * MB
}

/// A kernel client in A, at its default offloads, sends 100 MB to our listener in B,
/// which echoes it; the client verifies every byte that comes back. Its segments reach
/// our link with partial checksums, accepted because the link is a veth.
#[test]
fn kernel_client_to_our_listener_echoes_100_mb() {
    kernel_client_echo(true);
}

/// The same with A's tx checksum offload off: complete checksums, all verified.
#[test]
fn kernel_client_without_checksum_offload_echoes_100_mb() {
    kernel_client_echo(false);
}

fn kernel_client_echo(offload: bool) {
    let Some(bed) = testbed_or_skip(TestBed::builder().tx_checksum_offload(offload)) else {
        return;
    };
    let bulk = bulk_bytes();
    let set = start(&bed, Side::B, config(&bed, Side::B));
    assert_eq!(set.queues(), vec![0], "the veth end has one rx queue");
    let listener = set.listen(7000).expect("listen");
    let server = std::thread::spawn(move || {
        let (ch, peer) = listener.accept_timeout(DEADLINE).expect("accept");
        let mut stream = ChannelStream::new(ch);
        let n = echo(&mut stream).expect("echo");
        stream.shutdown_write().unwrap();
        stream.flush().unwrap();
        (n, peer, stream.channel().stats())
    });
    let target = SocketAddr::from((bed.side(Side::B).ipv4, 7000));
    let start_t = Instant::now();
    let got = bed
        .run_in(Side::A, move || {
            let conn = TcpStream::connect_timeout(&target, DEADLINE).expect("connect");
            conn.set_read_timeout(Some(DEADLINE)).unwrap();
            let mut w = conn.try_clone().unwrap();
            let writer = std::thread::spawn(move || {
                write_stream(&mut w, 1, bulk, 64 * 1024).expect("write");
                w.shutdown(Shutdown::Write).unwrap();
            });
            let n = read_verify(&mut &conn, 1).expect("read back");
            writer.join().unwrap();
            n
        })
        .unwrap();
    let secs = start_t.elapsed().as_secs_f64();
    let (echoed, peer, stats) = server.join().unwrap();
    assert_eq!(got, bulk);
    assert_eq!(echoed, bulk);
    assert_eq!(*peer.ip(), bed.side(Side::A).ipv4);
    assert!(
        stats.bytes_received >= bulk && stats.bytes_acked >= 1,
        "{stats:?}"
    );
    println!(
        "kernel client -> channel echo: {} MB each way in {secs:.2} s ({:.0} Mbit/s each way, debug build); {stats:?}",
        bulk / MB,
        (bulk * 8) as f64 / secs / 1e6
    );
    let sums = set.rx_checksum_stats();
    assert!(sums.accept_partial, "veth is host-local: {sums:?}");
    assert_eq!(sums.bad, 0, "{sums:?}");
    if offload {
        assert!(sums.partial > 1000, "{sums:?}");
    } else {
        assert_eq!(sums.partial, 0, "{sums:?}");
    }
    set.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::B));
}

/// Our channel in A sends 100 MB to a kernel echo server in B and verifies the echo.
#[test]
fn our_client_to_kernel_server_echoes_100_mb() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let bulk = bulk_bytes();
    let b_ip = bed.side(Side::B).ipv4;
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = bed
        .spawn_thread_in(Side::B, move || {
            let l = TcpListener::bind((b_ip, 0)).unwrap();
            ready_tx.send(l.local_addr().unwrap()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            c.set_read_timeout(Some(DEADLINE)).unwrap();
            let n = echo(&mut c).unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            n
        })
        .unwrap();
    let addr = match ready_rx.recv().unwrap() {
        SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let set = start(&bed, Side::A, config(&bed, Side::A));
    let start_t = Instant::now();
    let ch = set.connect(addr).expect("connect");
    assert_eq!(ch.peer_addr(), addr);
    assert_eq!(*ch.local_addr().ip(), bed.side(Side::A).ipv4);
    let got = std::thread::scope(|s| {
        s.spawn(|| send_stream(&ch, 2, bulk, 64 * 1024));
        recv_stream(&ch, 2)
    });
    let secs = start_t.elapsed().as_secs_f64();
    assert_eq!(got, bulk);
    assert_eq!(server.join().unwrap(), bulk);
    let stats = ch.stats();
    assert!(stats.bytes_sent >= bulk, "{stats:?}");
    println!(
        "channel -> kernel echo: {} MB each way in {secs:.2} s ({:.0} Mbit/s each way, debug build); {stats:?}",
        bulk / MB,
        (bulk * 8) as f64 / secs / 1e6
    );
    drop(ch);
    set.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::A));
}

/// Connecting to a port nobody listens on: the kernel's RST is `ConnectionRefused`.
#[test]
fn connecting_to_a_closed_port_is_refused() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let set = start(&bed, Side::A, config(&bed, Side::A));
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 7999);
    let t = Instant::now();
    let err = set.connect(target).expect_err("nobody listens");
    assert!(matches!(err, ChannelError::Refused), "{err}");
    assert_eq!(
        io::Error::from(err).kind(),
        io::ErrorKind::ConnectionRefused
    );
    assert!(t.elapsed() < DEADLINE);
    // The port went back to the allocator once the thread forgot the connection.
    assert!(common::eventually(DEADLINE, || set.ports_in_use() == 0));
    assert!(common::eventually(DEADLINE, || set.flow_count() == 0));
}

/// A kernel server that closes with SO_LINGER 0 resets the channel: `ConnectionReset`.
#[test]
fn a_kernel_reset_is_connection_reset() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let b_ip = bed.side(Side::B).ipv4;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let server = bed
        .spawn_thread_in(Side::B, move || {
            let l = TcpListener::bind((b_ip, 0)).unwrap();
            ready_tx.send(l.local_addr().unwrap()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            c.write_all(b"before the reset").unwrap();
            go_rx.recv().unwrap();
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            nix::sys::socket::setsockopt(&c, nix::sys::socket::sockopt::Linger, &linger).unwrap();
            drop(c);
        })
        .unwrap();
    let addr = match ready_rx.recv().unwrap() {
        SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let set = start(&bed, Side::A, config(&bed, Side::A));
    let ch = set.connect(addr).expect("connect");
    let mut got = Vec::new();
    while got.len() < 16 {
        match ch.dequeue_blocking(Some(DEADLINE)).unwrap() {
            Dequeued::Chunk(c) => got.extend_from_slice(&c),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, b"before the reset");
    go_tx.send(()).unwrap();
    server.join().unwrap();
    let err = match ch.dequeue_blocking(Some(DEADLINE)) {
        Err(e) => e,
        Ok(Dequeued::Empty) => panic!("no reset within {DEADLINE:?}"),
        Ok(other) => panic!("unexpected {other:?}"),
    };
    assert!(matches!(err, ChannelError::Reset), "{err}");
    let mut stream = ChannelStream::new(ch);
    let e = io::Read::read(&mut stream, &mut [0u8; 8]).expect_err("reset");
    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    let e = stream.write_all(b"x").expect_err("reset");
    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
}

/// A reader that does not dequeue: the Rx queue fills to its byte limit and stops there,
/// TCP's receive buffer fills, the window closes and the kernel sender blocks. Dequeuing
/// then lets the whole stream through, intact.
#[test]
fn a_slow_reader_closes_the_window() {
    const TOTAL: u64 = 32 * MB;
    const RX_LIMIT: usize = 64 * 1024;
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let mut cfg = config(&bed, Side::B);
    cfg.rx_queue.bytes = RX_LIMIT;
    let set = start(&bed, Side::B, cfg);
    let listener = set.listen(7200).expect("listen");
    let target = SocketAddr::from((bed.side(Side::B).ipv4, 7200));
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let progress = written.clone();
    let client = bed
        .spawn_thread_in(Side::A, move || {
            let mut c = TcpStream::connect_timeout(&target, DEADLINE).expect("connect");
            let mut buf = vec![0u8; 16 * 1024];
            let mut off = 0;
            while off < TOTAL {
                common::fill(7, off, &mut buf);
                c.write_all(&buf).unwrap();
                off += buf.len() as u64;
                progress.store(off, std::sync::atomic::Ordering::Relaxed);
            }
        })
        .unwrap();
    let (ch, _) = listener.accept_timeout(DEADLINE).expect("accept");
    assert!(
        common::eventually(DEADLINE, || {
            let s = ch.stats();
            s.rx_queued == RX_LIMIT && s.rx_tcp_queued > 0
        }),
        "the rx queue never filled: {:?}",
        ch.stats()
    );
    // Full, and never beyond the limit; the sender is held back by the closed window.
    let s = ch.stats();
    assert_eq!(s.rx_queued, RX_LIMIT, "{s:?}");
    let sent = written.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        sent < TOTAL && !client.is_finished(),
        "sender not held back: {sent} bytes"
    );
    // Now read: everything arrives, verified.
    let mut v = common::Verifier::new(7);
    while v.offset() < TOTAL {
        match ch.dequeue_blocking(Some(DEADLINE)).expect("dequeue") {
            Dequeued::Chunk(c) => {
                assert!(c.len() <= RX_LIMIT);
                v.check(&c);
            }
            other => panic!("after {} bytes: {other:?}", v.offset()),
        }
    }
    client.join().unwrap();
    println!("slow reader: the sender had written {sent} of {TOTAL} bytes when held back");
}

/// A kernel peer at its defaults that stops reading and then shrinks its receive buffer
/// (`SO_RCVBUF` to the minimum) runs out of receive memory with our data in flight: it
/// drops what arrives and answers with a zero window that acknowledges nothing new. Two
/// regressions (found by `tests/hostile_bed.rs`'s zero-window flood under load):
/// - its own data must keep flowing to us: our ACKs must carry a sequence number its
///   closed window accepts (SND.UNA + SND.WND), or it drops them and stalls;
/// - the channel must outlive the user timeout (1 s here) while the kernel answers our
///   retransmissions, since RFC 9293 §3.8.6.1 forbids timing out a receiver that answers.
///
/// Then the kernel reads, and every byte we sent arrives, then our FIN.
#[test]
fn a_kernel_peer_out_of_receive_memory_keeps_the_channel_and_its_data_flowing() {
    const FROM_KERNEL: u64 = 4 * MB;
    const TO_KERNEL: u64 = 2 * MB;
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let b_ip = bed.side(Side::B).ipv4;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (read_tx, read_rx) = mpsc::channel::<()>();
    let server = bed
        .spawn_thread_in(Side::B, move || {
            let l = TcpListener::bind((b_ip, 0)).unwrap();
            ready_tx.send(l.local_addr().unwrap()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            // The kernel clamps this to its minimum; what it advertised before stays.
            nix::sys::socket::setsockopt(&c, nix::sys::socket::sockopt::RcvBuf, &1)
                .expect("SO_RCVBUF");
            c.set_read_timeout(Some(DEADLINE)).unwrap();
            c.set_write_timeout(Some(DEADLINE)).unwrap();
            common::write_stream(&mut c, 5, FROM_KERNEL, 64 * 1024).expect("kernel write");
            c.shutdown(Shutdown::Write).unwrap();
            read_rx.recv_timeout(DEADLINE).expect("told to read");
            read_verify(&mut c, 9).expect("kernel read")
        })
        .unwrap();
    let addr = match ready_rx.recv().unwrap() {
        SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let mut cfg = config(&bed, Side::A);
    cfg.tcp.user_timeout = std::time::Duration::from_secs(1);
    let set = start(&bed, Side::A, cfg);
    let ch = set.connect(addr).expect("connect");
    std::thread::scope(|s| {
        let sender = s.spawn(|| send_stream(&ch, 9, TO_KERNEL, 16 * 1024));
        // The kernel's data arrives whole while its window stays shut on ours.
        assert_eq!(recv_stream(&ch, 5), FROM_KERNEL);
        // Our retransmissions into the closed window back off past the user timeout
        // (200 + 400 + 800 + 1600 ms from the first), answered each time.
        assert!(
            common::eventually(DEADLINE, || ch.stats().rto_timeouts >= 4),
            "no retransmissions into a closed window: {:?}",
            ch.stats()
        );
        read_tx.send(()).unwrap();
        sender.join().unwrap();
    });
    assert_eq!(server.join().unwrap(), TO_KERNEL);
    let stats = ch.stats();
    println!("kernel peer out of receive memory: {stats:?}");
    drop(ch);
    set.shutdown().unwrap();
}

/// Passive opens check the peer's MAC against the kernel's neighbour entry:
/// with B's kernel holding a permanent entry that puts A's address at another MAC (as it
/// would if the real host had that MAC and A were an impostor on the link), A's kernel
/// client completes the handshake but B aborts the connection before any listener sees
/// it; without an entry the SYN's MAC is kept (counted) and the channel works.
#[test]
fn a_passive_open_from_a_mac_the_kernel_does_not_know_is_aborted() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());
    let set = start(&bed, Side::B, config(&bed, Side::B));
    let listener = set.listen(7000).expect("listen");
    let a_ip = a.ipv4.to_string();
    bed.output_in(
        Side::B,
        "ip",
        &[
            "neigh",
            "replace",
            &a_ip,
            "lladdr",
            "02:00:00:00:00:99",
            "dev",
            &b.ifname,
            "nud",
            "permanent",
        ],
    )
    .expect("ip neigh replace");
    let target = SocketAddr::from((b.ipv4, 7000));
    let err = bed
        .run_in(Side::A, move || {
            // The reset may beat connect(2) back to the caller, or come after the write.
            let mut conn = TcpStream::connect_timeout(&target, DEADLINE)?;
            conn.set_read_timeout(Some(DEADLINE))?;
            conn.write_all(b"impostor")?;
            let mut buf = [0u8; 16];
            io::Read::read(&mut conn, &mut buf)
        })
        .unwrap();
    assert_eq!(
        err.as_ref().map_err(|e| e.kind()),
        Err(io::ErrorKind::ConnectionReset),
        "{err:?}"
    );
    let stats = set.syn_stats();
    assert_eq!(stats.neighbor_mismatches, 1, "{stats:?}");

    // No entry at all: the connection keeps the SYN's MAC and works.
    bed.output_in(Side::B, "ip", &["neigh", "del", &a_ip, "dev", &b.ifname])
        .expect("ip neigh del");
    let client = bed
        .spawn_thread_in(Side::A, move || {
            let mut conn = TcpStream::connect_timeout(&target, DEADLINE).expect("connect");
            conn.set_read_timeout(Some(DEADLINE)).unwrap();
            conn.write_all(b"genuine").unwrap();
            conn.shutdown(Shutdown::Write).unwrap();
            let mut back = Vec::new();
            io::Read::read_to_end(&mut conn, &mut back).unwrap();
            back
        })
        .unwrap();
    let (ch, peer) = listener.accept_timeout(DEADLINE).expect("accept");
    assert_eq!(*peer.ip(), a.ipv4);
    let mut stream = ChannelStream::new(ch);
    echo(&mut stream).expect("echo");
    stream.shutdown_write().unwrap();
    stream.flush().unwrap();
    assert_eq!(client.join().unwrap(), b"genuine");
    // Unverified, unless A's kernel re-probed B meanwhile and B's kernel learnt A anew.
    let stats = set.syn_stats();
    assert!(
        stats.neighbor_mismatches == 1 && stats.neighbor_unverified <= 1,
        "{stats:?}"
    );
    set.shutdown().unwrap();
}

/// A burst of kernel connects six times the listener's backlog while the application
/// accepts nothing: no connection is reset. Those that completed their handshake wait
/// (established, queued in the interface once the accept queue is full), further SYNs are
/// dropped as Linux drops them while its accept queue is full, and their retransmissions
/// get in once the application accepts; every client is served and echoed byte-exact.
#[test]
fn a_connect_burst_beyond_the_backlog_is_served_not_reset() {
    const BACKLOG: usize = 4;
    const CLIENTS: usize = 6 * BACKLOG;
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let mut cfg = config(&bed, Side::B);
    cfg.backlog = BACKLOG;
    let set = start(&bed, Side::B, cfg);
    let listener = set.listen(7000).expect("listen");
    let target = SocketAddr::from((bed.side(Side::B).ipv4, 7000));
    let (connected_tx, connected_rx) = mpsc::channel();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let connected = connected_tx.clone();
            bed.spawn_thread_in(Side::A, move || -> io::Result<Vec<u8>> {
                let mut conn = TcpStream::connect_timeout(&target, DEADLINE)?;
                let _ = connected.send(());
                conn.set_read_timeout(Some(DEADLINE))?;
                let msg = format!("client {i:02} of the burst").into_bytes();
                conn.write_all(&msg)?;
                conn.shutdown(Shutdown::Write)?;
                let mut back = Vec::new();
                io::Read::read_to_end(&mut conn, &mut back)?;
                assert_eq!(back, msg, "client {i}");
                Ok(back)
            })
            .unwrap()
        })
        .collect();
    // Nothing accepted until the accept queue holds BACKLOG connections and at least one
    // SYN met it full.
    for _ in 0..BACKLOG {
        connected_rx
            .recv_timeout(DEADLINE)
            .expect("a client connected");
    }
    assert!(
        common::eventually(DEADLINE, || set.syn_stats().dropped > 0),
        "no SYN met a full accept queue: {:?}",
        set.syn_stats()
    );
    // Now the application serves every client, one echo thread each.
    let servers: Vec<_> = (0..CLIENTS)
        .enumerate()
        .map(|(i, _)| {
            let (ch, _) = listener
                .accept_timeout(DEADLINE)
                .unwrap_or_else(|e| panic!("accept {i}: {e}; {:?}", set.syn_stats()));
            std::thread::spawn(move || {
                let mut stream = ChannelStream::new(ch);
                let n = echo(&mut stream).expect("echo");
                stream.shutdown_write().unwrap();
                stream.flush().unwrap();
                n
            })
        })
        .collect();
    for (i, c) in clients.into_iter().enumerate() {
        let r = c.join().expect("client thread");
        assert!(r.is_ok(), "client {i}: {r:?}");
    }
    for s in servers {
        assert!(s.join().expect("server thread") > 0);
    }
    println!("{:?}", set.syn_stats());
    set.shutdown().unwrap();
}

/// At MTU 9000 a set with default settings offers the MSS the MTU allows (8960), so a
/// kernel peer sends it 8948-byte segments (8960 less the timestamp option); TCP's own
/// default MSS, 1460, would have kept the jumbo link at 1448-byte segments.
#[test]
fn a_set_at_mtu_9000_offers_the_mss_of_its_mtu() {
    use std::os::fd::AsRawFd;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1).mtu(9000)) else {
        return;
    };
    let set = start(&bed, Side::B, config(&bed, Side::B));
    let listener = set.listen(7000).expect("listen");
    let server = std::thread::spawn(move || {
        let (ch, _) = listener.accept_timeout(DEADLINE).expect("accept");
        let mut stream = ChannelStream::new(ch);
        let n = echo(&mut stream).expect("echo");
        stream.shutdown_write().unwrap();
        stream.flush().unwrap();
        n
    });
    let target = SocketAddr::from((bed.side(Side::B).ipv4, 7000));
    let (mss, got) = bed
        .run_in(Side::A, move || {
            let conn = TcpStream::connect_timeout(&target, DEADLINE).expect("connect");
            conn.set_read_timeout(Some(DEADLINE)).unwrap();
            let mut mss: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt writes at most `len` bytes into `mss`, which lives across
            // the call; the descriptor is the connected socket `conn` owns.
            let rc = unsafe {
                libc::getsockopt(
                    conn.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_MAXSEG,
                    (&mut mss as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0, "{}", io::Error::last_os_error());
            let mut w = conn.try_clone().unwrap();
            let writer = std::thread::spawn(move || {
                write_stream(&mut w, 9, 4 * MB, 64 * 1024).expect("write");
                w.shutdown(Shutdown::Write).unwrap();
            });
            let n = read_verify(&mut &conn, 9).expect("read back");
            writer.join().unwrap();
            (mss, n)
        })
        .unwrap();
    assert_eq!(server.join().unwrap(), 4 * MB);
    assert_eq!(got, 4 * MB);
    assert_eq!(mss, 8960 - 12, "the kernel's send MSS towards our set");
    set.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::B));
}

/// Connections a kernel client in A opens one after the other, all from one fixed source
/// port (`SO_REUSEADDR`), to our listener in B on a set over two queues. Our side closes
/// first (answers, then FIN), so each earlier connection is in TIME-WAIT here when the
/// next SYN of the same 4-tuple arrives, and ends it (RFC 6191). The kernel picks a
/// transmit queue per socket, so that SYN often lands on the other queue than the
/// TIME-WAIT, and is either forwarded to the TIME-WAIT's owner (while the closed
/// connection is still whole) or opens the connection on its own queue (once only a
/// TIME-WAIT record is left). Every connection must be served: the new incarnation keeps
/// the flow's directory entry when the old one is forgotten, or its later segments,
/// arriving on the other queue, find no owner and are reset there.
#[test]
fn reconnects_from_one_source_port_to_a_server_that_closes_first_are_all_served() {
    use nix::errno::Errno;
    use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::io::Read;
    use std::os::fd::AsRawFd;

    const CONNECTIONS: u32 = 200;
    const CLIENT_PORT: u16 = 40_123;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let set = start(&bed, Side::B, config(&bed, Side::B));
    assert_eq!(set.queues(), vec![0, 1]);
    let listener = set.listen(7000).expect("listen");
    let server = std::thread::spawn(move || {
        let mut queues = Vec::new();
        for i in 0..CONNECTIONS {
            let (ch, _) = listener
                .accept_timeout(DEADLINE)
                .unwrap_or_else(|e| panic!("accept {i}: {e}"));
            queues.push(ch.queue());
            let mut got = Vec::new();
            while !got.ends_with(b"\n") {
                match ch.dequeue_blocking(Some(DEADLINE)) {
                    Ok(Dequeued::Chunk(c)) => got.extend_from_slice(&c),
                    other => panic!("request {i}: {other:?} after {got:?}"),
                }
            }
            let mut reply = b"re: ".to_vec();
            reply.extend_from_slice(&got);
            ch.enqueue_blocking(bytes::Bytes::from(reply), Some(DEADLINE))
                .unwrap_or_else(|e| panic!("reply {i}: {e}"));
            // Our side closes first and so holds the TIME-WAIT.
            ch.close();
        }
        queues
    });
    let local = SocketAddrV4::new(bed.side(Side::A).ipv4, CLIENT_PORT);
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 7000);
    bed.run_in(Side::A, move || {
        for i in 0..CONNECTIONS {
            let fd = socket::socket(
                AddressFamily::Inet,
                SockType::Stream,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .unwrap();
            socket::setsockopt(&fd, sockopt::ReuseAddr, &true).unwrap();
            socket::bind(fd.as_raw_fd(), &SockaddrIn::from(local)).unwrap();
            // The previous connection of this 4-tuple may still wait in LAST-ACK for our
            // ACK of its FIN; the kernel refuses the tuple until it has it.
            let until = Instant::now() + DEADLINE;
            loop {
                match socket::connect(fd.as_raw_fd(), &SockaddrIn::from(target)) {
                    Ok(()) => break,
                    Err(Errno::EADDRNOTAVAIL) if Instant::now() < until => {
                        std::thread::sleep(std::time::Duration::from_millis(1))
                    }
                    Err(e) => panic!("connect {i}: {e}"),
                }
            }
            let mut s = TcpStream::from(fd);
            s.set_read_timeout(Some(DEADLINE)).unwrap();
            let request = format!("request {i}\n");
            s.write_all(request.as_bytes())
                .unwrap_or_else(|e| panic!("connection {i}: send: {e}"));
            let mut reply = String::new();
            s.read_to_string(&mut reply)
                .unwrap_or_else(|e| panic!("connection {i}: receive: {e}"));
            assert_eq!(reply, format!("re: {request}"), "connection {i}");
        }
    })
    .unwrap();
    let queues = server.join().unwrap();
    // New incarnations arrived on another queue than the last one's TIME-WAIT: forwarded
    // to it, or served where they arrived. The case this test is about happened.
    let (forwarded, dropped) = set.forwarded_frames();
    let moves = queues.windows(2).filter(|w| w[0] != w[1]).count();
    println!("frames forwarded between the queues: {forwarded}; queue changes: {moves}");
    assert!(
        forwarded + moves as u64 > 0,
        "every reconnect found its TIME-WAIT's queue"
    );
    assert_eq!(dropped, 0);
    assert_eq!(set.resets_received(), 0);
}
