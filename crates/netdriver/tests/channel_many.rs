//! 64 concurrent channels against the peer's kernel on a 2-queue test bed, each stream
//! verified: kernel clients to our listener, and our channels to a kernel server. With two
//! queues the kernel chooses the queue a flow's segments arrive on, so segments of flows
//! owned by one queue arrive on the other and are forwarded.
//!
//! Privileged: each test skips without root, and fails instead when
//! `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Instant;

use common::{
    config, echo, fill, program_attached, read_verify, recv_stream, send_stream, start, DEADLINE,
};
use netdriver::channel::ChannelStream;
use testbed::{testbed_or_skip, Side, TestBed};

const CONNS: usize = 64;
/// Bytes each connection sends (and gets back).
const PER_CONN: u64 = 128 * 1024;

#[test]
fn sixty_four_kernel_clients_to_our_listener() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let set = start(&bed, Side::B, config(&bed, Side::B));
    assert_eq!(set.queues(), vec![0, 1]);
    let listener = set.listen_channels().expect("listen on 9000");
    assert_eq!(listener.port(), 9000);
    let t0 = Instant::now();
    let server = std::thread::spawn(move || {
        let mut echoers = Vec::new();
        let mut queues = BTreeSet::new();
        for _ in 0..CONNS {
            let (ch, _) = listener.accept_timeout(DEADLINE).expect("accept");
            queues.insert(ch.queue());
            echoers.push(std::thread::spawn(move || {
                let mut s = ChannelStream::new(ch);
                let n = echo(&mut s).expect("echo");
                s.shutdown_write().unwrap();
                s.flush().unwrap();
                n
            }));
        }
        let total: u64 = echoers.into_iter().map(|h| h.join().unwrap()).sum();
        (total, queues)
    });
    let target = SocketAddr::from((bed.side(Side::B).ipv4, 9000));
    let clients: Vec<_> = (0..CONNS as u64)
        .map(|i| {
            bed.spawn_thread_in(Side::A, move || {
                let mut c = TcpStream::connect_timeout(&target, DEADLINE).expect("connect");
                c.set_read_timeout(Some(DEADLINE)).unwrap();
                let mut buf = vec![0u8; PER_CONN as usize];
                fill(100 + i, 0, &mut buf);
                c.write_all(&buf).unwrap();
                c.shutdown(Shutdown::Write).unwrap();
                read_verify(&mut c, 100 + i).expect("read back")
            })
            .unwrap()
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), PER_CONN);
    }
    let (total, queues) = server.join().unwrap();
    assert_eq!(total, PER_CONN * CONNS as u64);
    println!(
        "{CONNS} kernel clients -> channels: {} KiB each way each in {:.2} s; accepted on \
         queues {queues:?}; forwarded (ok, dropped) {:?}",
        PER_CONN / 1024,
        t0.elapsed().as_secs_f64(),
        set.forwarded_frames()
    );
    set.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::B));
}

#[test]
fn sixty_four_channels_to_a_kernel_server() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let b_ip = bed.side(Side::B).ipv4;
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = bed
        .spawn_thread_in(Side::B, move || {
            let l = TcpListener::bind((b_ip, 0)).unwrap();
            ready_tx.send(l.local_addr().unwrap()).unwrap();
            let echoers: Vec<_> = (0..CONNS)
                .map(|_| {
                    let (mut c, _) = l.accept().unwrap();
                    std::thread::spawn(move || {
                        c.set_read_timeout(Some(DEADLINE)).unwrap();
                        let n = echo(&mut c).unwrap();
                        c.shutdown(Shutdown::Write).unwrap();
                        n
                    })
                })
                .collect();
            echoers.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        })
        .unwrap();
    let addr = match ready_rx.recv().unwrap() {
        SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let set = start(&bed, Side::A, config(&bed, Side::A));
    let t0 = Instant::now();
    let channels: Vec<_> = (0..CONNS)
        .map(|i| {
            set.connect(addr)
                .unwrap_or_else(|e| panic!("connect {i}: {e}"))
        })
        .collect();
    let queues: BTreeSet<u32> = channels.iter().map(|c| c.queue()).collect();
    assert_eq!(
        queues,
        BTreeSet::from([0, 1]),
        "round-robin over both queues"
    );
    let ports: BTreeSet<u16> = channels.iter().map(|c| c.local_addr().port()).collect();
    assert_eq!(ports.len(), CONNS, "every channel has its own port");
    assert_eq!(set.ports_in_use(), CONNS);
    std::thread::scope(|s| {
        for (i, ch) in channels.iter().enumerate() {
            s.spawn(move || {
                let seed = 200 + i as u64;
                send_stream(ch, seed, PER_CONN, 16 * 1024);
                assert_eq!(recv_stream(ch, seed), PER_CONN, "channel {i}");
            });
        }
    });
    assert_eq!(server.join().unwrap(), PER_CONN * CONNS as u64);
    println!(
        "{CONNS} channels -> kernel: {} KiB each way each in {:.2} s; forwarded (ok, dropped) {:?}",
        PER_CONN / 1024,
        t0.elapsed().as_secs_f64(),
        set.forwarded_frames()
    );
    // The kernel picks the queue of its replies per socket (veth: rx queue = the sender's
    // tx queue), so with 64 flows on 2 queues some replies reach the non-owning thread.
    // (All 64 matching their owner by chance has probability about 2^-64.)
    assert!(set.forwarded_frames().0 > 0, "{:?}", set.forwarded_frames());
    drop(channels);
    set.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::A));
}
