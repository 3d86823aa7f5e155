//! Channel sets over AF_PACKET (`LinkKind::Packet`) on the test bed: against the peer's
//! kernel TCP at its defaults both ways (echoes verified byte for byte), on one queue and
//! on two (the sockets in one fanout group), the steering removed when the set stops or
//! unwinds, and the queue driver's wait for a full send buffer (neither a spin nor a
//! stall).
//!
//! Privileged: each test skips without root, and fails instead when
//! `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

mod common;

use std::io::Write;
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{echo, read_verify, recv_stream, send_stream, start, write_stream, DEADLINE};
use netdriver::channel::{ChannelSet, ChannelSetConfig, ChannelStream, LinkKind};
use testbed::{testbed_or_skip, Side, TestBed};

const MB: u64 = 1 << 20;

/// A channel-set configuration over AF_PACKET for `side` of `bed`.
fn packet_config(bed: &TestBed, side: Side) -> ChannelSetConfig {
    let mut c = common::config(bed, side);
    c.link_kind = LinkKind::Packet;
    c
}

/// How many programs sit on `side`'s TCX ingress hook.
fn tcx_programs(bed: &TestBed, side: Side) -> u32 {
    let ifname = bed.side(side).ifname.clone();
    bed.run_in(side, move || xdp_prog::tcx_ingress_programs(&ifname))
        .expect("enter the namespace")
        .expect("query TCX")
}

/// A counter of `/proc/net/snmp`'s `Tcp:` lines in `side`'s namespace.
fn kernel_tcp_counter(bed: &TestBed, side: Side, name: &str) -> u64 {
    let snmp = bed
        .output_in(side, "cat", &["/proc/net/snmp"])
        .expect("snmp");
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap_or(""), tcp.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// A kernel echo server in `side`, listening when this returns; it serves `conns`
/// connections one after another and returns the bytes it echoed on each.
fn kernel_echo_server(
    bed: &TestBed,
    side: Side,
    conns: usize,
) -> (SocketAddrV4, testbed::NsJoinHandle<Vec<u64>>) {
    let ip = bed.side(side).ipv4;
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = bed
        .spawn_thread_in(side, move || {
            let l = TcpListener::bind((ip, 0)).unwrap();
            ready_tx.send(l.local_addr().unwrap()).unwrap();
            let mut echoed = Vec::new();
            let handles: Vec<_> = (0..conns)
                .map(|_| {
                    let (mut c, _) = l.accept().unwrap();
                    c.set_read_timeout(Some(DEADLINE)).unwrap();
                    std::thread::spawn(move || {
                        let n = echo(&mut c).unwrap();
                        c.shutdown(Shutdown::Write).unwrap();
                        n
                    })
                })
                .collect();
            for h in handles {
                echoed.push(h.join().unwrap());
            }
            echoed
        })
        .unwrap();
    let addr = match ready_rx.recv().unwrap() {
        SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    (addr, server)
}

/// `flows` kernel clients in A send `bytes` each to our listener in B, which echoes them,
/// while `flows` channels of ours in B send `bytes` each to a kernel echo server in A;
/// every byte comes back verified. The kernel runs at veth's defaults (TSO, GRO,
/// checksum offload) and B's kernel answers none of our flows.
fn kernel_both_ways(queues: u32, flows: usize, bytes: u64) {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(queues)) else {
        return;
    };
    let rsts_before = kernel_tcp_counter(&bed, Side::B, "OutRsts");
    let set = start(&bed, Side::B, packet_config(&bed, Side::B));
    assert_eq!(set.queues(), (0..queues).collect::<Vec<_>>());
    assert_eq!(tcx_programs(&bed, Side::B), 1, "the TCX ingress drop");
    let listener = set.listen(7000).expect("listen");
    let (kernel_addr, kernel_server) = kernel_echo_server(&bed, Side::A, flows);
    let started = Instant::now();
    std::thread::scope(|s| {
        // Our listener echoes each accepted channel on a thread of its own.
        let listener = &listener;
        let server = s.spawn(move || {
            let echoers: Vec<_> = (0..flows)
                .map(|_| {
                    let (ch, _) = listener.accept_timeout(DEADLINE).expect("accept");
                    std::thread::spawn(move || {
                        let mut stream = ChannelStream::new(ch);
                        let n = echo(&mut stream).expect("echo");
                        stream.shutdown_write().unwrap();
                        stream.flush().unwrap();
                        n
                    })
                })
                .collect();
            echoers
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        // Kernel clients in A.
        let target = SocketAddr::from((bed.side(Side::B).ipv4, 7000));
        let clients: Vec<_> = (0..flows)
            .map(|i| {
                let seed = 100 + i as u64;
                bed.spawn_thread_in(Side::A, move || {
                    let conn = TcpStream::connect_timeout(&target, DEADLINE).expect("connect");
                    conn.set_read_timeout(Some(DEADLINE)).unwrap();
                    let mut w = conn.try_clone().unwrap();
                    let writer = std::thread::spawn(move || {
                        write_stream(&mut w, seed, bytes, 64 * 1024).expect("write");
                        w.shutdown(Shutdown::Write).unwrap();
                    });
                    let n = read_verify(&mut &conn, seed).expect("read back");
                    writer.join().unwrap();
                    n
                })
                .unwrap()
            })
            .collect();
        // Our channels to A's kernel.
        let ours: Vec<_> = (0..flows)
            .map(|i| {
                let seed = 200 + i as u64;
                let set = &set;
                s.spawn(move || {
                    let ch = set.connect(kernel_addr).expect("connect");
                    std::thread::scope(|s2| {
                        s2.spawn(|| send_stream(&ch, seed, bytes, 64 * 1024));
                        recv_stream(&ch, seed)
                    })
                })
            })
            .collect();
        for c in clients {
            assert_eq!(c.join().expect("kernel client"), bytes);
        }
        for o in ours {
            assert_eq!(o.join().expect("our client"), bytes);
        }
        assert_eq!(server.join().expect("our server"), vec![bytes; flows]);
    });
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(kernel_server.join().unwrap(), vec![bytes; flows]);
    let counters = set
        .packet_steering_counters()
        .expect("counters")
        .expect("AF_PACKET steering");
    let sums = set.rx_checksum_stats();
    println!(
        "{queues} queue(s), {flows} flow(s) each way of {} MiB echoed in {secs:.2} s (debug build); \
         steering {counters:?}; forwarded {:?}; checksums {sums:?}; queues {:?}",
        bytes / MB,
        set.forwarded_frames(),
        set.queue_stats()
    );
    assert!(counters.filtered_in > 100, "{counters:?}");
    assert!(counters.kernel_dropped > 100, "{counters:?}");
    assert_eq!(sums.bad, 0, "{sums:?}");
    assert_eq!(
        kernel_tcp_counter(&bed, Side::B, "OutRsts"),
        rsts_before,
        "B's kernel answered our flows"
    );
    set.shutdown().expect("shutdown");
    assert_eq!(
        tcx_programs(&bed, Side::B),
        0,
        "the TCX program left behind"
    );
}

/// One queue: a kernel client echoed by our listener and our channel echoed by a kernel
/// server, 32 MiB each, at once.
#[test]
fn kernel_peers_both_ways_on_one_queue() {
    kernel_both_ways(1, 1, 32 * MB);
}

/// Two queues, their sockets in one `PACKET_FANOUT_QM` group: three flows each way.
#[test]
fn kernel_peers_both_ways_on_two_queues() {
    kernel_both_ways(2, 3, 8 * MB);
}

/// A set that unwinds (a panicking test, a panicking program) still detaches its TCX
/// program and closes its sockets: the kernel answers the port it listened on again.
#[test]
fn a_panic_removes_the_steering() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let cfg = packet_config(&bed, Side::B);
    let unwound = bed
        .run_in(Side::B, move || {
            std::panic::catch_unwind(move || {
                let set = ChannelSet::start(cfg).expect("start");
                let _listener = set.listen(7300).expect("listen");
                assert_eq!(
                    xdp_prog::tcx_ingress_programs(&set.config().ifname).unwrap(),
                    1
                );
                panic!("a test failing with the set alive");
            })
        })
        .expect("enter the namespace");
    assert!(unwound.is_err());
    assert_eq!(
        tcx_programs(&bed, Side::B),
        0,
        "the TCX program left behind"
    );
    // The kernel has the port back: a kernel listener in B takes a kernel client's
    // connection.
    let b_ip = bed.side(Side::B).ipv4;
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = bed
        .spawn_thread_in(Side::B, move || {
            let l = TcpListener::bind((b_ip, 7300)).unwrap();
            ready_tx.send(()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            c.write_all(b"the kernel's").unwrap();
        })
        .unwrap();
    ready_rx.recv_timeout(DEADLINE).unwrap();
    let target = SocketAddr::from((b_ip, 7300));
    let got = bed
        .run_in(Side::A, move || {
            let mut c = TcpStream::connect_timeout(&target, DEADLINE).expect("connect");
            c.set_read_timeout(Some(DEADLINE)).unwrap();
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut c, &mut got).unwrap();
            got
        })
        .unwrap();
    server.join().unwrap();
    assert_eq!(got, b"the kernel's");
}

/// A full send buffer: B's egress is shaped to 100 Mbit/s (TBF, a queue long enough never
/// to drop), our socket's send buffer holds about two 64 KiB super-segments and the link
/// has four tx buffers (with a 4 MiB TCP send buffer, so that TCP fills them all), so our
/// channel to a kernel sink in A finds the socket full and the link out of buffers for
/// most of the transfer. The queue's driver must wait for the socket to poll writable: a
/// driver that retried at every round spins (measured without the wait: 108,595 rounds,
/// busy 642 ms of a 682 ms transfer; with it, 683 rounds and 38 ms), one that waited for
/// the next arrival or timer would stall past the shaped rate.
#[test]
fn a_full_send_buffer_is_waited_for_without_spinning_or_stalling() {
    const BYTES: u64 = 8 * MB;
    const RATE_MBIT: u64 = 100;
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let ifname = bed.side(Side::B).ifname.clone();
    bed.output_in(
        Side::B,
        "tc",
        &[
            "qdisc",
            "add",
            "dev",
            &ifname,
            "root",
            "tbf",
            "rate",
            &format!("{RATE_MBIT}mbit"),
            "burst",
            "256kb",
            "limit",
            "64mb",
        ],
    )
    .expect("tc qdisc add tbf");
    let a_ip = bed.side(Side::A).ipv4;
    let (ready_tx, ready_rx) = mpsc::channel();
    let sink = bed
        .spawn_thread_in(Side::A, move || {
            let l = TcpListener::bind((a_ip, 0)).unwrap();
            ready_tx.send(l.local_addr().unwrap()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            c.set_read_timeout(Some(DEADLINE)).unwrap();
            read_verify(&mut c, 11).expect("kernel sink")
        })
        .unwrap();
    let addr = match ready_rx.recv().unwrap() {
        SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let mut cfg = packet_config(&bed, Side::B);
    cfg.packet_link.tx_buffer_bytes = 64 * 1024;
    cfg.packet_link.tx_frames = 4;
    cfg.tcp.tx_buffer = 4 << 20;
    let set = start(&bed, Side::B, cfg);
    let ch = set.connect(addr).expect("connect");
    let before = set.queue_stats()[0].clone();
    let started = Instant::now();
    send_stream(&ch, 11, BYTES, 64 * 1024);
    assert_eq!(sink.join().unwrap(), BYTES);
    let elapsed = started.elapsed();
    let after = set.queue_stats()[0].clone();
    let busy = after.busy - before.busy;
    let rounds = after.rounds - before.rounds;
    let shaped = Duration::from_secs_f64((BYTES * 8) as f64 / (RATE_MBIT as f64 * 1e6));
    println!(
        "{} MiB through a {RATE_MBIT} Mbit/s shaper with a 64 KiB send buffer: {elapsed:?} \
         (the shaper's pace {shaped:?}); the driver busy {busy:?} in {rounds} rounds, {} polls",
        BYTES / MB,
        after.polls - before.polls
    );
    assert!(
        elapsed >= shaped.mul_f64(0.9),
        "the shaper did not hold the transfer back: {elapsed:?} for {shaped:?} of data"
    );
    assert!(
        elapsed <= shaped * 2 + Duration::from_millis(500),
        "the transfer stalled: {elapsed:?} where the shaper allows {shaped:?}"
    );
    let segments = BYTES / (64 * 1024);
    assert!(
        busy < elapsed / 4 && rounds < 20 * segments,
        "the driver spun on the full socket: busy {busy:?} of {elapsed:?}, {rounds} rounds \
         for {segments} super-segments"
    );
    drop(ch);
    set.shutdown().expect("shutdown");
}
