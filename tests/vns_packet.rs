//! End to end over AF_PACKET on the test bed: two `Stack`s built with
//! `.link(LinkKind::Packet)`, one per namespace, each on both queues of its veth end (their
//! sockets in one fanout group), with several channels between them: many virtual streams
//! echoed, and a large transfer, every byte verified; then a kernel client and a kernel
//! server against a stack (plain TCP through the same sockets). No XDP program is
//! attached while they run; the TCX programs are gone once the stacks are.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
//! `NETCHANNEL_VNS_PACKET_BYTES` sets the size of the large transfer (default 64 MiB).
#![cfg(target_os = "linux")]

use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use netchannel::netdriver::channel::LinkKind;
use netchannel::netdriver::link::packet::PacketLinkStats;
use netchannel::{Stack, VirtualStream};
use testbed::{testbed_or_skip, Side, TestBed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

const CHANNELS: usize = 2;
const STREAMS: u32 = 32;
const PER_STREAM: usize = 256 * 1024;
const LIMIT: Duration = Duration::from_secs(120);

/// The tests of this file run one at a time: each drives two stacks and large transfers
/// through the bed, and two at once on a 2-core machine starve each other.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// A tokio runtime with 2 workers, as the bed's 2 cores.
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `side`'s stack over AF_PACKET.
fn stack_in(bed: &TestBed, side: Side) -> Stack {
    let e = bed.side(side);
    let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
    bed.run_in(side, move || {
        Stack::builder()
            .interface(ifname)
            .ipv4(ipv4)
            .link(LinkKind::Packet)
            .channels(CHANNELS)
            .connect_timeout(Duration::from_secs(10))
            .build()
    })
    .expect("enter the namespace")
    .expect("build the stack")
}

/// The AF_PACKET link counters of every queue of `stack`, summed, as its queue
/// statistics report them (each queue must report them: every link is an AF_PACKET one).
fn packet_counters(stack: &Stack) -> PacketLinkStats {
    let queues = stack.diagnostics().queue_stats();
    assert!(!queues.is_empty());
    let mut sum = PacketLinkStats::default();
    for q in queues {
        let p = q
            .packet
            .unwrap_or_else(|| panic!("queue {} reports no AF_PACKET counters", q.queue));
        sum.rx_coalesced += p.rx_coalesced;
        sum.rx_checksum_verified += p.rx_checksum_verified;
        sum.rx_truncated += p.rx_truncated;
        sum.tx_super_segments += p.tx_super_segments;
        sum.tx_full += p.tx_full;
        sum.tx_dropped += p.tx_dropped;
        sum.rx_socket_drops += p.rx_socket_drops;
        sum.tx_errors += p.tx_errors;
    }
    sum
}

/// The programs on `side`'s interface: (an XDP program attached, TCX ingress programs).
fn programs(bed: &TestBed, side: Side) -> (bool, u32) {
    let ifname = bed.side(side).ifname.clone();
    bed.run_in(side, move || {
        (
            xdp_prog::attached_program(&ifname).unwrap().is_some(),
            xdp_prog::tcx_ingress_programs(&ifname).unwrap(),
        )
    })
    .unwrap()
}

/// Waits until `side` has no TCX program left (a stack dropped with bytes undelivered
/// lingers a few seconds before its channel set stops).
fn tcx_gone(bed: &TestBed, side: Side) -> bool {
    let end = Instant::now() + Duration::from_secs(15);
    while Instant::now() < end {
        if programs(bed, side).1 == 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A deterministic byte of stream `tag` at `offset`.
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

async fn recv_pattern(s: &mut VirtualStream, tag: u64) -> u64 {
    let mut buf = vec![0u8; 64 * 1024];
    let mut off = 0u64;
    loop {
        let n = s.read(&mut buf).await.expect("read");
        if n == 0 {
            return off;
        }
        for (i, &b) in buf[..n].iter().enumerate() {
            assert_eq!(
                b,
                byte(tag, off + i as u64),
                "stream {tag} at {}",
                off + i as u64
            );
        }
        off += n as u64;
    }
}

#[test]
fn two_stacks_over_af_packet() {
    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = stack_in(&bed, Side::A);
    let b = stack_in(&bed, Side::B);
    for side in [Side::A, Side::B] {
        assert_eq!(
            programs(&bed, side),
            (false, 1),
            "{side:?}: the AF_PACKET steering, no XDP program"
        );
    }
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    let total: u64 = std::env::var("NETCHANNEL_VNS_PACKET_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 << 20);

    let rt = two_workers();
    rt.block_on(async {
        // Many streams at once, each echoed and verified.
        let l = b
            .bind_with_backlog(at(7000), STREAMS as usize)
            .await
            .unwrap();
        let server = tokio::spawn(async move {
            let mut tasks = Vec::new();
            for _ in 0..STREAMS {
                let (mut s, _) = l.accept().await.unwrap();
                assert!(!s.is_plain_tcp());
                tasks.push(tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    tokio::io::copy(&mut r, &mut w).await.unwrap();
                    w.shutdown().await.unwrap();
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        });
        let t0 = Instant::now();
        let clients: Vec<_> = (0..STREAMS)
            .map(|i| {
                let a = a.clone();
                tokio::spawn(async move {
                    let c = a.connect(at(7000)).await.unwrap();
                    let (mut r, mut w) = c.into_split();
                    let tag = u64::from(i);
                    let send = async move {
                        let mut buf = vec![0u8; PER_STREAM];
                        fill(tag, 0, &mut buf);
                        w.write_all(&buf).await.unwrap();
                        w.shutdown().await.unwrap();
                    };
                    let recv = async move {
                        let mut got = Vec::new();
                        r.read_to_end(&mut got).await.unwrap();
                        got
                    };
                    let (_, got) = tokio::join!(send, recv);
                    assert_eq!(got.len(), PER_STREAM, "stream {i}");
                    let mut want = vec![0u8; PER_STREAM];
                    fill(tag, 0, &mut want);
                    assert!(got == want, "stream {i} corrupted");
                })
            })
            .collect();
        timeout(LIMIT, async {
            for c in clients {
                c.await.unwrap();
            }
            server.await.unwrap();
        })
        .await
        .expect("many streams stalled");
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "{STREAMS} streams x {PER_STREAM} B echoed in {secs:.2} s ({:.1} Mbit/s each way)",
            (u64::from(STREAMS) * PER_STREAM as u64 * 8) as f64 / secs / 1e6
        );

        // One large transfer, verified byte by byte.
        let l = b.bind(at(7001)).await.unwrap();
        let rx = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            recv_pattern(&mut s, 4242).await
        });
        let mut c = a.connect(at(7001)).await.unwrap();
        let t0 = Instant::now();
        timeout(LIMIT, async {
            send_pattern(&mut c, 4242, total).await;
            c.shutdown().await.unwrap();
            assert_eq!(rx.await.unwrap(), total);
        })
        .await
        .expect("large transfer stalled");
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "{total} B over one VirtualStream in {secs:.2} s ({:.1} Mbit/s)",
            total as f64 * 8.0 / secs / 1e6
        );
    });
    for (name, s) in [("A", &a), ("B", &b)] {
        let set = s.diagnostics().channel_set();
        let steering = set
            .packet_steering_counters()
            .expect("counters")
            .expect("AF_PACKET steering");
        println!(
            "{name}: steering {steering:?}; forwarded {:?}; checksums {:?}",
            set.forwarded_frames(),
            set.rx_checksum_stats()
        );
        assert!(steering.filtered_in > 1000, "{name}: {steering:?}");
        assert_eq!(set.rx_checksum_stats().bad, 0, "{name}");
    }
    // The links' own counters, in the stacks' queue statistics: A sent the large transfer
    // as super-segments, which B's sockets received whole (coalesced, checksums vouched
    // for), and nothing was dropped on either side.
    let (pa, pb) = (packet_counters(&a), packet_counters(&b));
    println!("A: link counters {pa:?}\nB: link counters {pb:?}");
    let supers = total / (64 << 10);
    assert!(pa.tx_super_segments >= supers / 2, "A: {pa:?}");
    assert!(pb.rx_coalesced >= supers / 2, "B: {pb:?}");
    assert!(pb.rx_checksum_verified >= pb.rx_coalesced, "B: {pb:?}");
    for (name, p) in [("A", pa), ("B", pb)] {
        assert_eq!(
            (p.rx_truncated, p.tx_errors),
            (0, 0),
            "{name}: truncated or refused frames: {p:?}"
        );
    }
    drop(rt);
    drop(a);
    drop(b);
    for side in [Side::A, Side::B] {
        assert!(
            tcx_gone(&bed, side),
            "{side:?}: the TCX program left behind"
        );
    }
}

/// A kernel client against a `VirtualListener`, and a stack's connect to a kernel server
/// (no channel port there: plain TCP), both through the stack's AF_PACKET sockets.
#[test]
fn plain_kernel_tcp_peers_over_af_packet() {
    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let b = stack_in(&bed, Side::B);
    let a_ip = bed.side(Side::A).ipv4;
    let b_ip = bed.side(Side::B).ipv4;
    const LEN: usize = 8 << 20;
    let mut data = vec![0u8; LEN];
    fill(77, 0, &mut data);

    let rt = two_workers();
    let l = rt
        .block_on(b.bind(SocketAddrV4::new(b_ip, 7100).into()))
        .unwrap();
    let server = rt.spawn(async move {
        let (mut s, peer) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
        assert!(s.is_plain_tcp());
        let (mut r, mut w) = s.split();
        let n = tokio::io::copy(&mut r, &mut w).await.unwrap();
        w.shutdown().await.unwrap();
        (peer, n)
    });
    let d2 = data.clone();
    let echoed = bed
        .run_in(Side::A, move || {
            let mut s = std::net::TcpStream::connect((b_ip, 7100)).expect("kernel connect");
            s.set_read_timeout(Some(LIMIT)).unwrap();
            let mut r = s.try_clone().unwrap();
            let reader = std::thread::spawn(move || {
                let mut got = Vec::new();
                r.read_to_end(&mut got).map(|_| got)
            });
            s.write_all(&d2).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            reader.join().unwrap().expect("kernel read")
        })
        .unwrap();
    assert!(
        echoed == data,
        "kernel client got {} bytes back",
        echoed.len()
    );
    let (peer, n) = rt.block_on(server).unwrap();
    assert_eq!(n, LEN as u64);
    assert_eq!(peer.ip(), std::net::IpAddr::V4(a_ip));

    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let kernel_server = bed
        .spawn_thread_in(Side::A, move || {
            let l = std::net::TcpListener::bind((a_ip, 7101)).unwrap();
            ready_tx.send(()).unwrap();
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(LIMIT)).unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&got).unwrap();
            got.len()
        })
        .unwrap();
    ready_rx.recv_timeout(LIMIT).unwrap();
    let got = rt.block_on(async {
        let mut c = timeout(LIMIT, b.connect(SocketAddrV4::new(a_ip, 7101).into()))
            .await
            .unwrap()
            .expect("connect with fallback");
        assert!(c.is_plain_tcp());
        c.write_all(&data).await.unwrap();
        c.shutdown().await.unwrap();
        let mut got = Vec::new();
        timeout(LIMIT, c.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        got
    });
    assert!(got == data, "got {} bytes back", got.len());
    assert_eq!(kernel_server.join().unwrap(), LEN);
    drop(rt);
    drop(b);
    assert!(tcx_gone(&bed, Side::B), "the TCX program left behind");
}
