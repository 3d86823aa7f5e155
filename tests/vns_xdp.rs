//! End to end over the AF_XDP test bed: two `Stack`s, one per namespace, each on both
//! queues of its veth end, with several channels between them; many virtual streams, a
//! large verified transfer and `Framed` over a `VirtualStream`.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
//! `NETCHANNEL_VNS_XDP_BYTES` sets the size of the large transfer (default 100 MB).
#![cfg(target_os = "linux")]

use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use netchannel::vns::copy::CopyConfig;
use netchannel::vns::stack::DEFAULT_LIGHT_LOAD_STREAMS;
use netchannel::vns::Config;
use netchannel::{RuntimeRx, Stack, VirtualStream};
use testbed::{testbed_or_skip, Side, TestBed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

const CHANNELS: usize = 4;
const STREAMS: u32 = 64;
const PER_STREAM: usize = 256 * 1024;
const LIMIT: Duration = Duration::from_secs(120);

/// The tests of this file run one at a time. Each drives two stacks and large transfers
/// through the bed; ten at once on a 2-core machine starve each other, and under that
/// starvation a transfer across a channel fault sometimes stalls (seen once in a clean
/// run of all ten together, 2026-11-26; like the stall of `hostile_bed.rs`'s flood, an
/// open problem of its own, not what these tests measure).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A tokio runtime with 2 workers, as the bed's 2 cores.
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A current-thread tokio runtime: tasks run only when the test's own future waits.
fn one_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// Each side's stack, with run-to-completion receive for `mode`'s sockets.
fn runtime_rx_stacks(bed: &TestBed, mode: RuntimeRx) -> (Stack, Stack) {
    let (a, b) = (stack_in(bed, Side::A), stack_in(bed, Side::B));
    for s in [&a, &b] {
        assert!(s.set_runtime_rx(mode));
    }
    (a, b)
}

fn stack_in(bed: &TestBed, side: Side) -> Stack {
    stack_with_workers_in(bed, side, 0)
}

/// Copy workers share copies of at least this many bytes.
const COPY_THRESHOLD: usize = 256 * 1024;

fn stack_with_workers_in(bed: &TestBed, side: Side, workers: usize) -> Stack {
    let e = bed.side(side);
    let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
    bed.run_in(side, move || {
        let mut b = Stack::builder()
            .interface(ifname)
            .ipv4(ipv4)
            .channels(CHANNELS)
            .connect_timeout(Duration::from_secs(10));
        if workers > 0 {
            // Socket buffers that hold a copy worth sharing (the defaults are smaller
            // than the threshold).
            b = b
                .copy_workers(workers)
                .copy_config(CopyConfig {
                    small_copy_threshold: COPY_THRESHOLD,
                    ..CopyConfig::default()
                })
                .vns_config(Config {
                    send_buffer: 2 << 20,
                    recv_buffer: 2 << 20,
                    credit_window: 4 << 20,
                    credit_update_threshold: 512 << 10,
                    ..Config::default()
                });
        }
        b.build()
    })
    .expect("enter the namespace")
    .expect("build the stack")
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
fn two_stacks_over_af_xdp() {
    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = stack_in(&bed, Side::A);
    let b = stack_in(&bed, Side::B);
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    let total: u64 = std::env::var("NETCHANNEL_VNS_XDP_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000_000);

    let rt = two_workers();
    rt.block_on(async {
        // Refused: nothing listens on the port (the channels exist after this).
        let e = timeout(LIMIT, a.connect(at(7999)))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        // CHANNELS throughput channels plus one latency channel, over both queues.
        assert_eq!(a.channel_count(), CHANNELS + 1);

        // Many streams at once, each echoed and verified.
        let l = b
            .bind_with_backlog(at(7000), STREAMS as usize)
            .await
            .unwrap();
        let server = tokio::spawn(async move {
            let mut tasks = Vec::new();
            for _ in 0..STREAMS {
                let (mut s, _) = l.accept().await.unwrap();
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

        // Framed messages over a stream.
        let l = b.bind(at(7002)).await.unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let mut f = Framed::new(s, LengthDelimitedCodec::new());
            while let Some(msg) = f.next().await {
                let mut msg = msg.unwrap();
                msg.reverse();
                f.send(msg.freeze()).await.unwrap();
            }
        });
        let c = a.connect(at(7002)).await.unwrap();
        let mut f = Framed::new(c, LengthDelimitedCodec::new());
        for i in 0..200u64 {
            let len = 1 + (i as usize * 997) % 50_000;
            let mut msg = vec![0u8; len];
            fill(i, 0, &mut msg);
            f.send(bytes::Bytes::from(msg.clone())).await.unwrap();
            let reply = timeout(LIMIT, f.next()).await.unwrap().unwrap().unwrap();
            msg.reverse();
            assert_eq!(&reply[..], &msg[..], "message {i}");
        }
        f.get_mut().shutdown().await.unwrap();
        drop(f);
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
    drop(rt);
    drop(a);
    drop(b);
}

#[test]
fn plain_kernel_tcp_peers_over_af_xdp() {
    let _serial = one_at_a_time();
    use std::io::{Read, Write};
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    // Only B runs a stack; A is a plain host (kernel TCP, no channel port).
    let b = stack_in(&bed, Side::B);
    let a_ip = bed.side(Side::A).ipv4;
    let b_ip = bed.side(Side::B).ipv4;
    const LEN: usize = 1 << 20;
    let mut data = vec![0u8; LEN];
    fill(77, 0, &mut data);

    let rt = two_workers();
    // A kernel client against a VirtualListener.
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

    // Our connect to a kernel server: A has no channel port, so it falls back to TCP.
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
}

/// Copy workers over AF_XDP: a transfer delivered while nobody reads is then read into a
/// 1 MiB buffer, and a large transfer is written in 1 MiB writes; both are verified and
/// went through the workers of both stacks (2 each).
#[test]
fn copy_workers_over_af_xdp() {
    let _serial = one_at_a_time();
    const IO: usize = 1 << 20;
    const HELD: u64 = 3 << 20;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = stack_with_workers_in(&bed, Side::A, 2);
    let b = stack_with_workers_in(&bed, Side::B, 2);
    assert_eq!(a.copy_workers(), 2);
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    let total: u64 = std::env::var("NETCHANNEL_VNS_XDP_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32 << 20);
    let rt = one_thread();
    rt.block_on(async {
        let l = b.bind(at(7200)).await.unwrap();
        let mut c = timeout(LIMIT, a.connect(at(7200))).await.unwrap().unwrap();
        let (mut s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();

        // 3 MiB fit the credit window: all of it reaches B before anything is read.
        let mut data = vec![0u8; HELD as usize];
        fill(7, 0, &mut data);
        timeout(LIMIT, c.write_all(&data)).await.unwrap().unwrap();
        timeout(LIMIT, a.drained())
            .await
            .expect("not delivered in time");
        let mut buf = vec![0u8; IO];
        let mut got = Vec::new();
        while (got.len() as u64) < HELD {
            let n = timeout(LIMIT, s.read(&mut buf)).await.unwrap().unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got == data, "held transfer corrupted");
        let held = b.copy_stats();
        assert!(held.parallel_copies_out > 0, "reads not shared: {held:?}");

        // A large transfer in 1 MiB writes, verified byte by byte.
        let rx = tokio::spawn(async move { recv_pattern(&mut s, 4243).await });
        let t0 = Instant::now();
        timeout(LIMIT, async {
            let mut buf = vec![0u8; IO];
            let mut off = 0u64;
            while off < total {
                let n = (total - off).min(IO as u64) as usize;
                fill(4243, off, &mut buf[..n]);
                c.write_all(&buf[..n]).await.expect("write");
                off += n as u64;
            }
            c.shutdown().await.unwrap();
            assert_eq!(rx.await.unwrap(), total);
        })
        .await
        .expect("large transfer stalled");
        let secs = t0.elapsed().as_secs_f64();
        let (sa, sb) = (a.copy_stats(), b.copy_stats());
        println!(
            "{total} B with 2 copy workers per stack in {secs:.2} s ({:.1} Mbit/s)\n\
             writer {sa:?}\nreader {sb:?}",
            total as f64 * 8.0 / secs / 1e6
        );
        assert!(
            sa.parallel_copies > sa.parallel_copies_out && sa.worker_bytes > 0,
            "writes not shared: {sa:?}"
        );
        assert!(sa.buffers.reuses > 0, "no chunk buffer reused: {sa:?}");
    });
    let tids = [a.copy_worker_tids(), b.copy_worker_tids()].concat();
    assert_eq!(tids.len(), 4);
    drop(rt);
    drop((a, b));
    // Joined by the drop; the kernel may list a joined thread for a moment longer.
    let gone = |t: &u64| !std::path::Path::new(&format!("/proc/self/task/{t}")).exists();
    let end = Instant::now() + LIMIT;
    while !tids.iter().all(gone) && Instant::now() < end {
        std::thread::yield_now();
    }
    assert!(tids.iter().all(gone), "copy workers left running");
}

/// Closed-loop exchanges on `s`: `n` messages of varying size (1 B to 20 kB), each
/// echoed and checked byte for byte.
async fn exchange(s: &mut VirtualStream, tag: u64, n: u64) {
    let mut off = 0u64;
    let mut back = vec![0u8; 20_000];
    for i in 0..n {
        let len = 1 + ((i * 7919 + tag * 104_729) % 20_000) as usize;
        let mut msg = vec![0u8; len];
        fill(tag, off, &mut msg);
        s.write_all(&msg).await.expect("write");
        s.read_exact(&mut back[..len]).await.expect("read the echo");
        assert!(back[..len] == msg[..], "stream {tag}, message {i}");
        off += len as u64;
    }
}

/// Echoes every read back at once, partial reads included, until the peer's end of
/// stream; then shuts its own side.
async fn echo_until_eof(s: &mut VirtualStream) {
    let mut buf = vec![0u8; 20_000];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        s.write_all(&buf[..n]).await.unwrap();
    }
    s.shutdown().await.unwrap();
}

/// Shuts `s` down and reads it up to the peer's end of stream; returns what came before
/// that end.
async fn shut_and_drain(s: &mut VirtualStream) -> Vec<u8> {
    s.shutdown().await.unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    rest
}

/// One 64-byte message each way on `s`.
async fn small_exchange(s: &mut VirtualStream, tag: u8) {
    let msg = [tag; 64];
    let mut back = [0u8; 64];
    s.write_all(&msg).await.expect("write");
    s.read_exact(&mut back).await.expect("read the echo");
    assert_eq!(back, msg, "echo of {tag}");
}

/// Without a channel count from its user, an AF_XDP stack opens one throughput channel
/// per peer where the process may run on fewer than 4 cores (channel threads bring no
/// parallelism without cores to run them beside the application), 4 elsewhere; and that
/// many open (besides the latency channel).
#[test]
fn the_channel_count_is_chosen_from_the_host() {
    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let build = |side: Side| {
        let e = bed.side(side);
        let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
        bed.run_in(side, move || {
            Stack::builder()
                .interface(ifname)
                .ipv4(ipv4)
                .connect_timeout(Duration::from_secs(10))
                .build()
        })
        .expect("enter the namespace")
        .expect("stack")
    };
    let a = build(Side::A);
    let b = build(Side::B);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let expected = if cores < 4 { 1 } else { 4 };
    assert_eq!(a.channels_per_peer(), expected, "{cores} cores");
    assert_eq!(b.channels_per_peer(), expected, "{cores} cores");
    let at = SocketAddr::from(SocketAddrV4::new(bed.side(Side::B).ipv4, 7120));
    let rt = two_workers();
    rt.block_on(async {
        let l = b.bind(at).await.unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            echo_until_eof(&mut s).await
        });
        let mut c = timeout(LIMIT, a.connect(at)).await.unwrap().unwrap();
        small_exchange(&mut c, 1).await;
        timeout(LIMIT, a.channels_reach(expected + 1))
            .await
            .expect("the channels never opened");
        assert_eq!(a.stats().channels.len(), expected + 1, "{:?}", a.stats());
        c.shutdown().await.unwrap();
        drop(c);
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
    drop(rt);
    drop(a);
    drop(b);
}

/// A lease a latency-class reader takes on the queues (run-to-completion receive, 10 ms)
/// ends as soon as a reader that leaves receiving to the channel threads waits: a
/// throughput-class exchange right after a latency-class one does not wait for the lease
/// to run out. Before, each such exchange waited up to a lease for its echo (and at 32
/// connections, stalls under leases left behind made the load look light again, which
/// took more leases: 5 % of the rate in some rounds).
#[test]
fn a_reader_left_to_the_channel_threads_ends_runtime_leases() {
    let _serial = one_at_a_time();
    use netchannel::AppClass;

    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = stack_in(&bed, Side::A);
    let b = stack_in(&bed, Side::B);
    // Only latency-class sockets receive in the runtime, whatever the load.
    for s in [&a, &b] {
        s.set_light_load_streams(0);
        assert!(s.set_runtime_rx(RuntimeRx::LatencyClass));
        // The default scheduler keeps no class apart: a waiting task of either class
        // serves every queue.
        assert_eq!(s.runtime_rx_queues(true), vec![0, 1]);
        assert_eq!(s.runtime_rx_queues(false), vec![0, 1]);
    }
    let b_ip = bed.side(Side::B).ipv4;
    let at = SocketAddr::from(SocketAddrV4::new(b_ip, 7110));
    let rt = two_workers();
    rt.block_on(async {
        let l = b.bind(at).await.unwrap();
        // B's ends stay throughput-class: its readers leave receiving to its threads.
        let server = tokio::spawn(async move {
            let mut echoes = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = l.accept().await.unwrap();
                echoes.push(tokio::spawn(async move { echo_until_eof(&mut s).await }));
            }
            for e in echoes {
                e.await.unwrap();
            }
        });
        let mut lat = a.connect(at).await.unwrap();
        lat.set_app_class(AppClass::Latency).unwrap();
        small_exchange(&mut lat, 0).await;
        let mut thr = a.connect(at).await.unwrap();
        small_exchange(&mut thr, 0).await;

        const ROUNDS: u32 = 50;
        let rounds_before = a.runtime_rx_rounds();
        let mut throughput_time = Duration::ZERO;
        timeout(LIMIT, async {
            for i in 1..=ROUNDS {
                small_exchange(&mut lat, i as u8).await;
                let t = Instant::now();
                small_exchange(&mut thr, i as u8).await;
                throughput_time += t.elapsed();
            }
        })
        .await
        .expect("exchanges stalled");
        let rounds_after = a.runtime_rx_rounds();
        // A's latency-class reader did take leases (it ran rounds itself).
        assert!(
            rounds_after > rounds_before,
            "the latency-class reader ran no rounds: {rounds_before} -> {rounds_after}"
        );
        // A throughput exchange that waited for the lease's end would take ~10 ms (the
        // lease its partner just renewed); fifty of them half a second. Unhindered, one
        // takes tens of microseconds (a millisecond in a debug build on a busy machine).
        assert!(
            throughput_time < Duration::from_millis(200),
            "{ROUNDS} throughput-class exchanges after latency-class ones took {throughput_time:?}"
        );
        for s in [&mut lat, &mut thr] {
            assert!(shut_and_drain(s).await.is_empty());
        }
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
    drop(rt);
    a.abort();
    b.abort();
}

/// The queues' descriptors wake a task that is waiting: a reader whose read was served
/// by another task's round and that now awaits something else is not picked. Before,
/// tokio's one waker per descriptor was the last task to wait, so an arrival for another
/// waiting reader woke that task for nothing and the reader waited for the lease's end.
#[test]
fn queue_arrivals_wake_a_task_that_still_waits() {
    let _serial = one_at_a_time();
    use netchannel::AppClass;

    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let (a, b) = runtime_rx_stacks(&bed, RuntimeRx::LatencyClass);
    let b_ip = bed.side(Side::B).ipv4;
    let at = SocketAddr::from(SocketAddrV4::new(b_ip, 7111));
    // One thread: the spawned reader runs (and waits) at the `yield_now` below, before
    // the second reader waits.
    let rt = one_thread();
    const ROUNDS: u8 = 50;
    rt.block_on(async {
        let l = b.bind(at).await.unwrap();
        // B: the first stream gets a message whenever the test asks; the second echoes.
        // (A's readers are the latency-class ones under test.)
        let (send_tx, mut send_rx) = tokio::sync::mpsc::channel::<u8>(1);
        let server = tokio::spawn(async move {
            let (mut pushed, _) = l.accept().await.unwrap();
            let (mut echoed, _) = l.accept().await.unwrap();
            let echo = tokio::spawn(async move { echo_until_eof(&mut echoed).await });
            while let Some(tag) = send_rx.recv().await {
                pushed.write_all(&[tag; 64]).await.unwrap();
            }
            pushed.shutdown().await.unwrap();
            echo.await.unwrap();
        });
        let mut x = a.connect(at).await.unwrap();
        x.set_app_class(AppClass::Latency).unwrap();
        let mut y = a.connect(at).await.unwrap();
        y.set_app_class(AppClass::Latency).unwrap();
        small_exchange(&mut y, 0).await;

        let mut waited = Duration::ZERO;
        for tag in 1..=ROUNDS {
            // X waits for B's message.
            let reader = tokio::spawn(async move {
                let mut got = [0u8; 64];
                x.read_exact(&mut got).await.unwrap();
                assert_eq!(got, [tag; 64]);
                (x, Instant::now())
            });
            tokio::task::yield_now().await;
            // Y waits after X, is served, and then waits on something else (the rest of
            // this loop).
            small_exchange(&mut y, tag).await;
            let sent = Instant::now();
            send_tx.send(tag).await.unwrap();
            let (back, got_at) = timeout(LIMIT, reader).await.expect("X stalled").unwrap();
            x = back;
            waited += got_at.saturating_duration_since(sent);
        }
        // Waiting for the lease's end cost 3-8 ms a round (up to the lease, 10 ms); served
        // at once, tens of microseconds (a millisecond in a debug build on a busy machine).
        assert!(
            waited < Duration::from_millis(100),
            "{ROUNDS} arrivals for a waiting reader took {waited:?}"
        );
        drop(send_tx);
        let mut rest = Vec::new();
        x.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        assert!(shut_and_drain(&mut y).await.is_empty());
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
    drop(rt);
    a.abort();
    b.abort();
}

/// Counts the polls of the future it wraps.
struct CountPolls<F> {
    inner: std::pin::Pin<Box<F>>,
    polls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl<F: std::future::Future> std::future::Future for CountPolls<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.polls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.as_mut().poll(cx)
    }
}

/// A reader whose queue has frames while another thread holds the queue's round asks
/// that holder for one more round and waits, rather than try again at once. Before, the
/// task woke itself and looked again until the round was free: with the holder
/// preempted on the same core (the isolation bench's applications and latency channel
/// threads pinned together), that spin kept the holder off the core for the rest of a
/// scheduler slice, the latency stream's 1-5 ms samples. The frames are not lost either:
/// the holder's asked-for round takes them, and the reader is woken for its bytes.
#[test]
fn a_reader_that_finds_the_round_held_asks_the_holder_instead_of_spinning() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let (a, b) = runtime_rx_stacks(&bed, RuntimeRx::All);
    let b_ip = bed.side(Side::B).ipv4;
    let at = SocketAddr::from(SocketAddrV4::new(b_ip, 7113));
    // One thread: the reader runs only when the test's own future waits.
    let rt = one_thread();
    rt.block_on(async {
        let l = b.bind(at).await.unwrap();
        let (send_tx, mut send_rx) = tokio::sync::mpsc::channel::<u8>(1);
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            // One exchange first, so that A's reads already wait in the runtime.
            let mut first = [0u8; 64];
            s.read_exact(&mut first).await.unwrap();
            s.write_all(&first).await.unwrap();
            while let Some(tag) = send_rx.recv().await {
                s.write_all(&[tag; 64]).await.unwrap();
            }
            s.shutdown().await.unwrap();
        });
        let mut x = a.connect(at).await.unwrap();
        small_exchange(&mut x, 1).await;

        let polls = Arc::new(AtomicUsize::new(0));
        let reader = tokio::spawn(CountPolls {
            inner: Box::pin(async move {
                let mut got = [0u8; 64];
                x.read_exact(&mut got).await.unwrap();
                (x, got)
            }),
            polls: polls.clone(),
        });
        tokio::task::yield_now().await;
        // Every queue's round held (the stream's channel is on one of them).
        let holds: Vec<_> = (0..2).filter_map(|q| a.hold_queue_round(q)).collect();
        assert_eq!(holds.len(), 2, "A's two queues' rounds held");
        let asks_before = a.runtime_rx_asks();
        send_tx.send(2).await.unwrap();
        // The frame reaches A's queue, the reader is woken for it and finds the round
        // held: it asks.
        // (`yield_now` lets the runtime poll its reactor and run every ready task once.)
        let deadline = Instant::now() + Duration::from_secs(10);
        while a.runtime_rx_asks() == asks_before {
            assert!(
                Instant::now() < deadline,
                "the reader never asked the round's holder (polled {} times)",
                polls.load(Ordering::Relaxed)
            );
            tokio::task::yield_now().await;
        }
        // Then it waits: a reader that woke itself would be polled again on each of the
        // runtime's next passes.
        const PASSES: usize = 200;
        let at_ask = polls.load(Ordering::Relaxed);
        for _ in 0..PASSES {
            tokio::task::yield_now().await;
        }
        let later = polls.load(Ordering::Relaxed);
        assert!(
            later <= at_ask + 2,
            "the reader kept polling while the round was held: {at_ask} polls at the ask, {later} after {PASSES} passes of the runtime"
        );
        assert!(!reader.is_finished(), "the bytes came while the round was held");
        // Let go: the asked-for round takes the frame and the reader gets its bytes.
        drop(holds);
        let (mut x, got) = timeout(LIMIT, reader).await.expect("reader stalled").unwrap();
        assert_eq!(got, [2u8; 64]);
        drop(send_tx);
        let mut rest = Vec::new();
        x.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
    drop(rt);
    a.abort();
    b.abort();
}

/// A reading task woken for an arrival that still waits in its queue's ring runs that
/// queue's round before it looks for its bytes, so that its first look after the pull
/// finds them (`Stack::runtime_rx_rounds_first`). It used to look, pull, look again,
/// register as a waiter and only then run the round: about 2 k instructions of a 64-byte
/// read's 15 k. The echo's bytes stay exact.
#[test]
fn a_reader_woken_for_an_arrival_runs_its_round_before_it_looks() {
    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let (a, b) = runtime_rx_stacks(&bed, RuntimeRx::All);
    let b_ip = bed.side(Side::B).ipv4;
    let at = SocketAddr::from(SocketAddrV4::new(b_ip, 7114));
    const EXCHANGES: u64 = 200;
    // One thread: the server's reads are woken by the runtime's reactor for the client's
    // frames, never by a channel thread that took them first.
    let rt = one_thread();
    rt.block_on(async {
        let l = b.bind(at).await.unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            echo_until_eof(&mut s).await;
        });
        let mut x = a.connect(at).await.unwrap();
        // Every reader's queue registered with the runtime first.
        small_exchange(&mut x, 0).await;
        let before = (a.runtime_rx_rounds_first(), b.runtime_rx_rounds_first());
        timeout(LIMIT, async {
            for i in 0..EXCHANGES {
                small_exchange(&mut x, (i % 251) as u8 + 1).await;
            }
        })
        .await
        .expect("ping-pong stalled");
        let after = (a.runtime_rx_rounds_first(), b.runtime_rx_rounds_first());
        let gained = (after.0 - before.0, after.1 - before.1);
        assert!(
            gained.0 >= EXCHANGES / 2 && gained.1 >= EXCHANGES / 2,
            "of {EXCHANGES} woken reads per side, rounds run before the look: A {} B {}",
            gained.0,
            gained.1
        );
        x.shutdown().await.unwrap();
        let mut rest = Vec::new();
        x.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "bytes after the echoes");
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
    drop(rt);
    a.abort();
    b.abort();
}

/// A lease that outlives the wait that took it ends when an arrival finds no runtime task
/// waiting: a raw channel's blocking reader on the same channel set, right after a
/// latency-class exchange, gets its bytes from the channel thread at once instead of
/// after the lease (10 ms).
#[test]
fn an_arrival_with_no_runtime_reader_waiting_ends_the_lease() {
    let _serial = one_at_a_time();
    use bytes::Bytes;
    use netchannel::netdriver::channel::{ChannelSet, ChannelSetConfig, Dequeued};
    use netchannel::vns::stack::XdpBackend;
    use netchannel::AppClass;
    use std::sync::Arc;

    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let start = |side: Side| {
        let e = bed.side(side).clone();
        bed.run_in(side, move || {
            let set = ChannelSet::start(ChannelSetConfig::new(e.ifname.clone(), e.ipv4))
                .expect("channel set");
            let backend = Arc::new(XdpBackend::new(set));
            let stack = Stack::builder()
                .ipv4(e.ipv4)
                .channels(CHANNELS)
                .connect_timeout(Duration::from_secs(10))
                .build_with_backend(backend.clone())
                .expect("stack");
            (stack, backend)
        })
        .expect("enter the namespace")
    };
    let (b, set_b) = start(Side::B);
    let (a, set_a) = start(Side::A);
    let b_ip = bed.side(Side::B).ipv4;
    const RAW_PORT: u16 = 7113;
    let raw_l = set_b.channel_set().listen(RAW_PORT).expect("raw listen");
    let raw_a = set_a
        .channel_set()
        .connect(SocketAddrV4::new(b_ip, RAW_PORT))
        .expect("raw connect");
    let echo = std::thread::spawn(move || {
        let (ch, _) = raw_l.accept_timeout(LIMIT).expect("raw accept");
        while let Ok(Dequeued::Chunk(c)) = ch.dequeue_blocking(Some(LIMIT)) {
            if ch.enqueue_blocking(c, Some(LIMIT)).is_err() {
                break;
            }
        }
    });
    let rt = two_workers();
    let at = SocketAddr::from(SocketAddrV4::new(b_ip, 7112));
    let (mut lat, server) = rt.block_on(async {
        let l = b.bind(at).await.unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            echo_until_eof(&mut s).await;
        });
        let lat = a.connect(at).await.unwrap();
        lat.set_app_class(AppClass::Latency).unwrap();
        (lat, server)
    });
    let raw_exchange = |tag: u8| {
        raw_a
            .enqueue_blocking(Bytes::from(vec![tag; 64]), Some(LIMIT))
            .expect("raw send");
        let mut got = 0;
        while got < 64 {
            match raw_a.dequeue_blocking(Some(LIMIT)) {
                Ok(Dequeued::Chunk(c)) => {
                    assert!(c.iter().all(|&b| b == tag));
                    got += c.len();
                }
                other => panic!("raw echo: {other:?}"),
            }
        }
    };
    raw_exchange(0);

    const ROUNDS: u8 = 50;
    let rounds_before = a.runtime_rx_rounds();
    let mut raw_time = Duration::ZERO;
    for tag in 1..=ROUNDS {
        // A's reading task takes a lease, gets its echo and stops waiting.
        rt.block_on(small_exchange(&mut lat, tag));
        let t = Instant::now();
        raw_exchange(tag);
        raw_time += t.elapsed();
    }
    assert!(
        a.runtime_rx_rounds() > rounds_before,
        "the latency-class reader took no lease (ran no rounds)"
    );
    // Waiting for the lease's end cost up to 10 ms a round (about half a second in all);
    // served at once, tens of microseconds (a millisecond in a debug build on a busy
    // machine).
    assert!(
        raw_time < Duration::from_millis(200),
        "{ROUNDS} raw-channel exchanges after latency-class ones took {raw_time:?}"
    );
    rt.block_on(async {
        shut_and_drain(&mut lat).await;
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
    raw_a.close();
    echo.join().expect("raw echo thread");
    drop(rt);
    a.abort();
    b.abort();
}

/// Run-to-completion receive (`RuntimeRx`): reading tasks that process the queues'
/// arrivals in their runtime, alone and many at once, with reads, writes, shutdowns and
/// drops interleaved; every byte exact, in bounded time. Then the default (latency-class
/// sockets only) and `Off` are told apart by the stacks' round counters, and a second
/// runtime still gets its bytes after the first one, which holds the registration, is
/// gone.
#[test]
fn run_to_completion_receive_over_af_xdp() {
    let _serial = one_at_a_time();
    use netchannel::AppClass;

    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = stack_in(&bed, Side::A);
    let b = stack_in(&bed, Side::B);
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    const TASKS: u64 = 24;

    let rt = two_workers();
    rt.block_on(async {
        assert!(a.set_runtime_rx(RuntimeRx::All) && b.set_runtime_rx(RuntimeRx::All));
        let l = b.bind_with_backlog(at(7100), TASKS as usize).await.unwrap();
        let server = tokio::spawn(async move {
            let mut tasks = Vec::new();
            for _ in 0..TASKS {
                let (mut s, _) = l.accept().await.unwrap();
                tasks.push(tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    // The peer either shuts down (EOF) or drops its stream.
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        });
        let clients: Vec<_> = (0..TASKS)
            .map(|tag| {
                let a = a.clone();
                tokio::spawn(async move {
                    let mut c = a.connect(at(7100)).await.unwrap();
                    if tag % 3 == 0 {
                        c.set_app_class(AppClass::Latency).unwrap();
                    }
                    exchange(&mut c, tag, 40 + tag * 5).await;
                    if tag % 2 == 0 {
                        // Shut down, then read the server's end of stream.
                        let rest = shut_and_drain(&mut c).await;
                        assert!(rest.is_empty(), "stream {tag}: bytes after the echoes");
                    }
                    // Odd streams are dropped with everything read.
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
        .expect("streams stalled with run-to-completion receive");
        assert!(
            a.runtime_rx_rounds() > 0 && b.runtime_rx_rounds() > 0,
            "no task ran a queue round: A {} B {}",
            a.runtime_rx_rounds(),
            b.runtime_rx_rounds()
        );

        // Default mode: a latency-class stream's tasks run rounds, and with `Off`
        // nobody does.
        assert!(a.set_runtime_rx(RuntimeRx::default()) && b.set_runtime_rx(RuntimeRx::default()));
        let l = b.bind(at(7101)).await.unwrap();
        let server = tokio::spawn(async move {
            for _ in 0..2 {
                let (mut s, _) = l.accept().await.unwrap();
                s.set_app_class(AppClass::Latency).unwrap();
                echo_until_eof(&mut s).await;
            }
        });
        for (mode, tag) in [(RuntimeRx::LatencyClass, 100), (RuntimeRx::Off, 101)] {
            a.set_runtime_rx(mode);
            b.set_runtime_rx(mode);
            let mut c = a.connect(at(7101)).await.unwrap();
            c.set_app_class(AppClass::Latency).unwrap();
            let before = (a.runtime_rx_rounds(), b.runtime_rx_rounds());
            timeout(LIMIT, exchange(&mut c, tag, 200))
                .await
                .expect("latency stream stalled");
            let after = (a.runtime_rx_rounds(), b.runtime_rx_rounds());
            match mode {
                RuntimeRx::Off => assert_eq!(after, before, "rounds with RuntimeRx::Off"),
                _ => assert!(
                    after.0 > before.0 && after.1 > before.1,
                    "latency-class tasks ran no rounds: {before:?} -> {after:?}"
                ),
            }
            shut_and_drain(&mut c).await;
        }
        timeout(LIMIT, server).await.unwrap().unwrap();

        // A throughput-class stream takes the same path while its stack has few active
        // streams (`light_load_streams`), and leaves receiving to the channel threads
        // when the bound is 0.
        a.set_runtime_rx(RuntimeRx::default());
        b.set_runtime_rx(RuntimeRx::default());
        let l = b.bind(at(7103)).await.unwrap();
        let server = tokio::spawn(async move {
            for _ in 0..2 {
                let (mut s, _) = l.accept().await.unwrap();
                echo_until_eof(&mut s).await;
            }
        });
        // Sends its tasks made inline (their own rounds on the channel threads' queues).
        let inline_sends =
            |s: &Stack| -> u64 { s.queue_threads().iter().map(|t| t.inline_sends).sum() };
        // Rounds those calls (sends and receives) ran: a call stops after a round that
        // leaves the queue settled, rather than running a further round that finds
        // nothing.
        let inline_rounds =
            |s: &Stack| -> u64 { s.queue_threads().iter().map(|t| t.inline_rounds).sum() };
        for (light, tag) in [(8, 102), (0, 103)] {
            a.set_light_load_streams(light);
            b.set_light_load_streams(light);
            let mut c = a.connect(at(7103)).await.unwrap();
            let before = (a.runtime_rx_rounds(), b.runtime_rx_rounds());
            let sends_before = (inline_sends(&a), inline_sends(&b));
            let inline_before = inline_rounds(&a) + inline_rounds(&b);
            timeout(LIMIT, exchange(&mut c, tag, 200))
                .await
                .expect("throughput stream stalled");
            let after = (a.runtime_rx_rounds(), b.runtime_rx_rounds());
            let sends_after = (inline_sends(&a), inline_sends(&b));
            let inline_after = inline_rounds(&a) + inline_rounds(&b);
            if light == 0 {
                assert_eq!(
                    after, before,
                    "rounds for a throughput stream on a busy stack"
                );
                assert_eq!(
                    sends_after, sends_before,
                    "inline sends on throughput channels of a busy stack"
                );
            } else {
                assert!(a.lightly_loaded() && b.lightly_loaded());
                assert!(
                    after.0 > before.0 && after.1 > before.1,
                    "a lone throughput stream's tasks ran no rounds: {before:?} -> {after:?}"
                );
                assert!(
                    sends_after.0 > sends_before.0 && sends_after.1 > sends_before.1,
                    "a lone throughput stream's tasks sent nothing inline: \
                     {sends_before:?} -> {sends_after:?}"
                );
                // Each call ran a round; a call that ran two (work, then nothing) for
                // every message would make this at least 2. A call counts its rounds
                // before itself: one in flight on the other worker when the first
                // counts were read may have its rounds before the window and itself in it.
                let calls = (after.0 - before.0)
                    + (after.1 - before.1)
                    + (sends_after.0 - sends_before.0)
                    + (sends_after.1 - sends_before.1);
                let rounds = inline_after - inline_before;
                assert!(
                    rounds + 1 >= calls && 2 * rounds < 3 * calls,
                    "{rounds} inline rounds for {calls} inline calls"
                );
            }
            shut_and_drain(&mut c).await;
        }
        timeout(LIMIT, server).await.unwrap().unwrap();
        a.set_light_load_streams(DEFAULT_LIGHT_LOAD_STREAMS);
        b.set_light_load_streams(DEFAULT_LIGHT_LOAD_STREAMS);
        a.set_runtime_rx(RuntimeRx::All);
        b.set_runtime_rx(RuntimeRx::All);
    });
    // The registration belongs to the runtime just dropped: a new one (current-thread)
    // still gets every byte, through the channel threads.
    drop(rt);
    let rt = one_thread();
    rt.block_on(async {
        let l = b.bind(at(7102)).await.unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let (mut r, mut w) = s.split();
            tokio::io::copy(&mut r, &mut w).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut c = a.connect(at(7102)).await.unwrap();
        timeout(LIMIT, exchange(&mut c, 200, 100))
            .await
            .expect("stalled after the first runtime was dropped");
        c.shutdown().await.unwrap();
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
    drop(rt);
    drop(a);
    drop(b);
}

/// Receive on the channel threads (`StackBuilder::channel_thread_rx`, off by default):
/// many streams exchange echoed messages of every size at once, with reads, writes and
/// shutdowns interleaved, every byte checked; the channel threads of both stacks did
/// the reading (their pull counters moved). Then the same with it off on both stacks:
/// the bytes still arrive, through the application's tasks, and no channel thread
/// pulled.
#[test]
fn receive_on_the_channel_threads_over_af_xdp() {
    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    const TASKS: u64 = 16;
    let rt = two_workers();
    for on in [true, false] {
        let start = |side: Side| {
            let e = bed.side(side).clone();
            bed.run_in(side, move || {
                Stack::builder()
                    .interface(e.ifname.clone())
                    .ipv4(e.ipv4)
                    .channels(CHANNELS)
                    .channel_thread_rx(on)
                    .connect_timeout(Duration::from_secs(10))
                    .build()
            })
            .expect("enter the namespace")
            .expect("build the stack")
        };
        let (a, b) = (start(Side::A), start(Side::B));
        rt.block_on(async {
            let l = b.bind_with_backlog(at(7110), TASKS as usize).await.unwrap();
            let server = tokio::spawn(async move {
                let mut tasks = Vec::new();
                for _ in 0..TASKS {
                    let (mut s, _) = l.accept().await.unwrap();
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
            let clients: Vec<_> = (0..TASKS)
                .map(|tag| {
                    let a = a.clone();
                    tokio::spawn(async move {
                        let mut c = a.connect(at(7110)).await.unwrap();
                        exchange(&mut c, tag, 30 + tag * 4).await;
                        let rest = shut_and_drain(&mut c).await;
                        assert!(rest.is_empty(), "stream {tag}: bytes after the echoes");
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
            .unwrap_or_else(|_| panic!("streams stalled (channel_thread_rx {on})"));
        });
        let pulls = (a.channel_thread_pulls(), b.channel_thread_pulls());
        if on {
            assert!(
                pulls.0 > 0 && pulls.1 > 0,
                "channel threads read nothing themselves: {pulls:?}"
            );
        } else {
            assert_eq!(
                pulls,
                (0, 0),
                "channel threads read with channel_thread_rx off"
            );
        }
        // At once, so that the next pair finds the interfaces free.
        a.abort();
        b.abort();
    }
}

/// The cores each `vns-driver` thread of this process may run on (`Cpus_allowed_list`).
fn driver_threads_cores() -> Vec<std::collections::BTreeSet<usize>> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != "vns-driver" {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let Some(list) = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        else {
            continue;
        };
        let mut cores = std::collections::BTreeSet::new();
        for part in list.trim().split(',').filter(|p| !p.is_empty()) {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            if let (Ok(lo), Ok(hi)) = (lo.parse::<usize>(), hi.parse::<usize>()) {
                cores.extend(lo..=hi);
            }
        }
        out.push(cores);
    }
    out
}

/// What happens mid-transfer in [`transfer_through`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `Stack::reset_channel` on each side in turn: the receiver at a third of the
    /// stream, the sender at two thirds.
    StackResets,
    /// From a third of the stream on, an outside sender (a raw IP socket in B's
    /// namespace) forges RSTs for one of the bulk sender's channels until one takes.
    WireRst,
    /// At a third of the stream, the receiver's channel thread of one queue is killed
    /// (`Stack::kill_queue_thread`): no FIN, no RST; the sender notices by its short
    /// user timeout and keep-alive. With `runtime_rx`, both stacks' reading tasks run
    /// the queues' receive rounds themselves (`RuntimeRx::All`): they must not serve the
    /// dead queue, which would keep its connections answering and hide the death.
    KilledThread { runtime_rx: bool },
}

/// Liveness for [`Fault::KilledThread`]: the side whose peer's thread died learns of it
/// only by its own checks, so they are made short (the defaults take 15-30 s).
const SHORT_USER_TIMEOUT: Duration = Duration::from_secs(3);

fn stack_for(bed: &TestBed, side: Side, fault: Fault) -> Stack {
    let Fault::KilledThread { runtime_rx } = fault else {
        return stack_in(bed, side);
    };
    let e = bed.side(side);
    let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
    bed.run_in(side, move || {
        let mode = if runtime_rx {
            RuntimeRx::All
        } else {
            RuntimeRx::default()
        };
        Stack::builder()
            .runtime_rx(mode)
            // Without `runtime_rx` the channel threads are to receive, even for this
            // one stream.
            .light_load_streams(if runtime_rx {
                DEFAULT_LIGHT_LOAD_STREAMS
            } else {
                0
            })
            .interface(ifname)
            .ipv4(ipv4)
            .channels(CHANNELS)
            .connect_timeout(Duration::from_secs(10))
            .keepalive(Some(Duration::from_secs(1)))
            .keepalive_interval(Duration::from_millis(250))
            .keepalive_probes(4)
            .user_timeout(SHORT_USER_TIMEOUT)
            .build()
    })
    .expect("enter the namespace")
    .expect("build the stack")
}

/// The large stream's progress, announced by its reader: what moves the channels'
/// sequence numbers that the wire-RST forger watches, so it re-checks them when the
/// stream moves instead of polling on a timer.
#[derive(Default)]
struct Progress {
    read: std::sync::Mutex<u64>,
    moved: std::sync::Condvar,
}

impl Progress {
    /// The reader has read `off` bytes.
    fn announce(&self, off: u64) {
        *self.read.lock().unwrap_or_else(|e| e.into_inner()) = off;
        self.moved.notify_all();
    }

    /// Checks `cond` now and each time the stream moves, until it holds or `limit`
    /// passes; returns whether it held.
    fn wait_for(&self, limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + limit;
        let mut seen = *self.read.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if cond() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let guard = self.read.lock().unwrap_or_else(|e| e.into_inner());
            let (guard, _) = self
                .moved
                .wait_timeout_while(guard, left, |read| *read == seen)
                .unwrap_or_else(|e| e.into_inner());
            seen = *guard;
        }
    }
}

/// Issue 13 §2 on the bed: 4 channels carry one large stream (`NETCHANNEL_VNS_XDP_BYTES`,
/// default 100 MB) and 32 small ones echoed both ways, while `fault` strikes a channel
/// (or a queue's channels) mid-transfer. Every byte arrives once, in order, and the
/// counters show what went again.
fn transfer_through(fault: Fault) {
    // `RUST_LOG=vns=debug` shows the losses and flow control when a run stalls.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = stack_for(&bed, Side::A, fault);
    let b = stack_for(&bed, Side::B, fault);
    // The outside sender of `Fault::WireRst`: opened in B's namespace, so that its RSTs
    // take the kernel's route over the veth into A's NIC queues like B's own segments.
    let injector = (fault == Fault::WireRst).then(|| RstInjector::open_in(&bed, Side::B));
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    let total: u64 = std::env::var("NETCHANNEL_VNS_XDP_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000_000);
    const SMALL: u32 = 32;
    let rt = two_workers();
    rt.block_on(async {
        let big_l = b.bind(at(7400)).await.unwrap();
        let small_l = b.bind_with_backlog(at(7401), SMALL as usize).await.unwrap();
        let mut c = timeout(LIMIT, a.connect(at(7400))).await.unwrap().unwrap();
        let (mut s, _) = timeout(LIMIT, big_l.accept()).await.unwrap().unwrap();
        assert_eq!(a.channel_count(), CHANNELS + 1);
        let resets_before = (a.channel_resets_received(), b.channel_resets_received());
        let echo = tokio::spawn(async move {
            let mut tasks = Vec::new();
            for _ in 0..SMALL {
                let (mut s, _) = small_l.accept().await.unwrap();
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
        let small: Vec<_> = (0..SMALL)
            .map(|i| {
                let a = a.clone();
                tokio::spawn(async move {
                    let c = a.connect(at(7401)).await.unwrap();
                    let (mut r, mut w) = c.into_split();
                    let tag = 1000 + u64::from(i);
                    let send = async move {
                        // Written in pieces so that the streams span the faults.
                        let mut buf = vec![0u8; PER_STREAM];
                        fill(tag, 0, &mut buf);
                        for piece in buf.chunks(PER_STREAM / 8) {
                            w.write_all(piece).await.unwrap();
                            tokio::task::yield_now().await;
                        }
                        w.shutdown().await.unwrap();
                    };
                    let recv = async move {
                        let mut got = Vec::new();
                        r.read_to_end(&mut got).await.unwrap();
                        got
                    };
                    let (_, got) = tokio::join!(send, recv);
                    let mut want = vec![0u8; PER_STREAM];
                    fill(tag, 0, &mut want);
                    assert!(got == want, "small stream {i}: {} bytes", got.len());
                })
            })
            .collect();
        let sender = tokio::spawn(async move {
            send_pattern(&mut c, 77, total).await;
            c.shutdown().await.unwrap();
            c
        });
        let mut buf = vec![0u8; 64 * 1024];
        let mut off = 0u64;
        let mut struck = 0;
        // `Fault::WireRst`: the injecting threads (one per strike), and how far the
        // stream was when the first RST took.
        let mut rsts: Vec<std::thread::JoinHandle<Result<u32, String>>> = Vec::new();
        let mut rst_done_at: Option<u64> = None;
        // `Fault::KilledThread`: the killed queue and how many channels it carried.
        let mut killed: Option<(u32, usize)> = None;
        let progress = std::sync::Arc::new(Progress::default());
        timeout(LIMIT, async {
            loop {
                let n = s.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                for (i, &x) in buf[..n].iter().enumerate() {
                    assert_eq!(
                        x,
                        byte(77, off + i as u64),
                        "large stream at {}",
                        off + i as u64
                    );
                }
                off += n as u64;
                progress.announce(off);
                let rst_over = rsts.last().is_some_and(|h| h.is_finished());
                if rst_done_at.is_none() && rst_over {
                    rst_done_at = Some(off);
                }
                match fault {
                    // Chunks in flight on them either way.
                    Fault::StackResets => {
                        if struck == 0 && off >= total / 3 {
                            assert!(b.reset_channel(1));
                            struck += 1;
                        } else if struck == 1 && off >= 2 * total / 3 {
                            assert!(a.reset_channel(2));
                            struck += 1;
                        }
                    }
                    // The first strike at a third of the stream, then every other
                    // throughput channel in turn, each an eighth of the stream later: the
                    // stream ends on the latency channel alone. (Regression: with three
                    // or four channels struck, the stream stalled in about 1 run of 20,
                    // on a chunk the receiver dropped with a reset channel after ignoring
                    // the sender's copy; see `parked_chunks_stay_when_their_copies_came_
                    // first_on_another_channel` in crates/vns/tests/channel_loss.rs.)
                    Fault::WireRst
                        if (struck == 0 && off >= total / 3)
                            || (struck < CHANNELS as u64
                                && rst_over
                                && off >= total / 3 + struck * total / 8
                                && off + total / 8 <= total) =>
                    {
                        // On its own thread: the stream keeps flowing while it aims.
                        let a = a.clone();
                        let inj = injector.clone().expect("opened for this fault");
                        let progress = progress.clone();
                        rsts.push(std::thread::spawn(move || {
                            reset_from_the_wire(&a, &inj, &progress, Duration::from_secs(60))
                        }));
                        struck += 1;
                    }
                    Fault::KilledThread { .. } if struck == 0 && off >= total / 3 => {
                        let wire = b.channel_wire();
                        let q = wire[1].expect("a TCP channel").queue;
                        let on_q = wire.iter().flatten().filter(|w| w.queue == q).count();
                        assert!(b.kill_queue_thread(q));
                        killed = Some((q, on_q));
                        struck += 1;
                    }
                    _ => {}
                }
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "large transfer stalled after a channel fault at {off} of {total}: \
                 receiver {:?}; sender stack {:#?}; counters {:?} / {:?}",
                s.socket_stats(),
                a.stats(),
                a.endpoint_counters(),
                b.endpoint_counters()
            )
        });
        assert_eq!(off, total);
        match fault {
            Fault::StackResets => assert_eq!(struck, 2),
            Fault::WireRst => assert_eq!(struck, CHANNELS as u64),
            Fault::KilledThread { .. } => assert_eq!(struck, 1),
        }
        timeout(LIMIT, sender).await.unwrap().unwrap();
        timeout(LIMIT, async {
            for t in small {
                t.await.unwrap();
            }
            echo.await.unwrap();
        })
        .await
        .expect("small streams stalled after a channel fault");
        let (ca, cb) = (a.endpoint_counters(), b.endpoint_counters());
        println!(
            "{fault:?}: resent {} + {} chunks, {} + {} duplicates dropped; channels now {} / {}; \
             RSTs received from the wire {} / {}",
            ca.resent_chunks,
            cb.resent_chunks,
            ca.duplicate_chunks,
            cb.duplicate_chunks,
            a.channel_count(),
            b.channel_count(),
            a.channel_resets_received() - resets_before.0,
            b.channel_resets_received() - resets_before.1,
        );
        match fault {
            Fault::StackResets => assert_eq!(a.channel_count(), CHANNELS + 1 - 2),
            Fault::WireRst => {
                for rst in rsts {
                    let attempts = rst
                        .join()
                        .expect("injector thread")
                        .expect("the forged RST never took");
                    println!("a forged RST took after {attempts} attempt(s)");
                }
                println!(
                    "the first took {rst_done_at:?} bytes into the stream; {struck} strike(s)"
                );
                assert!(
                    rst_done_at.is_some_and(|o| o < total),
                    "the RST took only after the transfer ({rst_done_at:?} of {total})"
                );
                assert_eq!(a.channel_count(), CHANNELS + 1 - struck as usize);
                assert!(
                    a.channel_resets_received() > resets_before.0,
                    "the bulk sender lost its channel without a RST from the wire"
                );
                // The peer's half learns of it when it next sends (A's kernel, owning
                // the released port no more than the stack does, answers with a RST)
                // or by keep-alive.
                assert!(
                    timeout(LIMIT, b.channels_reach(CHANNELS + 1 - struck as usize))
                        .await
                        .is_ok(),
                    "the receiver still holds {} channels",
                    b.channel_count()
                );
            }
            Fault::KilledThread { runtime_rx } => {
                let (q, on_q) = killed.expect("a queue was killed");
                if runtime_rx {
                    // The reading tasks did run queue rounds (of the live queue).
                    assert!(a.runtime_rx_rounds() > 0 && b.runtime_rx_rounds() > 0);
                }
                println!("queue {q} killed with {on_q} channel(s) on it");
                assert!(on_q > 0);
                assert_eq!(b.channel_count(), CHANNELS + 1 - on_q);
                // The sender's halves of those channels see no answer: its user timeout
                // (data in flight) or keep-alive (idle) fails them.
                assert!(
                    timeout(LIMIT, a.channels_reach(CHANNELS + 1 - on_q))
                        .await
                        .is_ok(),
                    "the sender still holds {} channels",
                    a.channel_count()
                );
                // The thread died silently: no RST on the wire either way.
                assert_eq!(
                    (a.channel_resets_received(), b.channel_resets_received()),
                    resets_before
                );
            }
        }
        assert!(
            ca.resent_chunks + cb.resent_chunks > 0,
            "nothing went again"
        );
    });
    drop(rt);
    drop(a);
    drop(b);
}

/// Issue 13 §2 on the bed: one channel reset by each side in turn through the fault
/// layer (`Stack::reset_channel`: the resetting side aborts its TCP connection and the
/// peer receives a real RST from the wire); every byte arrives once, in order.
#[test]
fn channel_resets_mid_transfer_lose_nothing_over_af_xdp() {
    let _serial = one_at_a_time();
    transfer_through(Fault::StackResets);
}

/// Issue 13 §2 on the bed: a RST forged by an outside sender (a raw socket in the
/// receiver's namespace, aimed at one of the bulk sender's channels at its RCV.NXT) resets
/// a channel mid-transfer; every byte arrives once, in order.
#[test]
fn forged_rst_from_the_wire_mid_transfer_loses_nothing_over_af_xdp() {
    let _serial = one_at_a_time();
    transfer_through(Fault::WireRst);
}

/// Issue 13 §2 on the bed: the receiver's channel thread of one queue dies mid-transfer
/// (fault injection: no FIN, no RST); the receiver loses that queue's channels at once,
/// the sender by its user timeout or keep-alive; every byte arrives once, in order.
#[test]
fn killed_channel_thread_mid_transfer_loses_nothing_over_af_xdp() {
    let _serial = one_at_a_time();
    transfer_through(Fault::KilledThread { runtime_rx: false });
}

/// As [`killed_channel_thread_mid_transfer_loses_nothing_over_af_xdp`], with every
/// reading task running the queues' receive rounds itself (`RuntimeRx::All`): the dead
/// queue is served by nobody, so the sender still notices the death.
#[test]
fn killed_channel_thread_with_runtime_rx_loses_nothing_over_af_xdp() {
    let _serial = one_at_a_time();
    transfer_through(Fault::KilledThread { runtime_rx: true });
}

/// A raw IPv4 socket (`IPPROTO_RAW`: we write the IP header) opened in one side's
/// namespace, sending forged TCP RSTs through that namespace's routing: an outside
/// sender on the wire, as far as the other side's stack can tell.
#[derive(Clone)]
struct RstInjector {
    fd: std::sync::Arc<std::os::fd::OwnedFd>,
}

impl RstInjector {
    fn open_in(bed: &TestBed, side: Side) -> RstInjector {
        let fd = bed
            .run_in(side, || {
                use std::os::fd::FromRawFd;
                // SAFETY: plain socket(2) call; the result is checked before use.
                let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
                assert!(
                    fd >= 0,
                    "raw IPv4 socket: {}",
                    std::io::Error::last_os_error()
                );
                // SAFETY: `fd` is a fresh descriptor that nothing else owns.
                unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
            })
            .expect("enter the namespace");
        RstInjector {
            fd: std::sync::Arc::new(fd),
        }
    }

    /// Sends a RST from `from` to `to` with sequence number `seq` (valid IPv4 and TCP
    /// checksums, no ACK, no options).
    fn send(&self, from: SocketAddrV4, to: SocketAddrV4, seq: u32) -> std::io::Result<()> {
        use netchannel::netdriver::tcp::SeqNumber;
        use netchannel::netdriver::wire::{
            emit_tcp_frame, ethernet, EtherType, EthernetAddress, EthernetRepr, IpProtocol,
            Ipv4Repr, TcpFlags, TcpOptions, TcpRepr,
        };
        use std::os::fd::AsRawFd;
        let tcp = TcpRepr {
            src_port: from.port(),
            dst_port: to.port(),
            seq: SeqNumber(seq),
            ack: None,
            flags: TcpFlags::RST,
            window: 0,
            urgent: 0,
            options: TcpOptions::default(),
        };
        // Built as an Ethernet frame (the codec's unit), sent without its Ethernet
        // header: the kernel routes the IP datagram and resolves the MAC itself.
        let mut frame = vec![0u8; netchannel::netdriver::wire::tcp_payload_offset(&tcp)];
        let eth = EthernetRepr {
            src: EthernetAddress([0; 6]),
            dst: EthernetAddress([0; 6]),
            ethertype: EtherType::Ipv4,
        };
        let ip = Ipv4Repr {
            src: *from.ip(),
            dst: *to.ip(),
            protocol: IpProtocol::Tcp,
            payload_len: 0,
            ttl: 64,
            dscp_ecn: 0,
        };
        let len = emit_tcp_frame(&mut frame, &eth, &ip, 1, &tcp, 0).expect("emit RST");
        let datagram = &frame[ethernet::HEADER_LEN..len];
        // SAFETY: sockaddr_in is plain data; all-zero is a valid value.
        let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_addr.s_addr = u32::from(*to.ip()).to_be();
        // SAFETY: the buffer is valid for its length; `sin` is a valid sockaddr_in
        // passed with its size.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                datagram.as_ptr() as *const libc::c_void,
                datagram.len(),
                0,
                &sin as *const libc::sockaddr_in as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        assert_eq!(n as usize, datagram.len(), "short raw send");
        Ok(())
    }
}

/// Resets one of `victim`'s channels with a RST forged by `inj`, from the wire.
///
/// The victim's TCP takes a RST only at exactly its RCV.NXT (RFC 5961; anything else in
/// the window draws a challenge ACK), and RCV.NXT moves whenever the peer sends on the
/// channel; so it picks a channel that carries the victim's data (SND.NXT moving) while
/// its RCV.NXT moves least, then reads RCV.NXT and sends a RST, again and again, until
/// the channel is gone from the victim's table, at most `limit`. Returns the attempts.
fn reset_from_the_wire(
    victim: &Stack,
    inj: &RstInjector,
    progress: &Progress,
    limit: Duration,
) -> Result<u32, String> {
    let deadline = Instant::now() + limit;
    let sample = || -> Vec<_> { victim.channel_wire().into_iter().flatten().collect() };
    // Snapshots until the victim has sent a good amount on some channel since the first:
    // then how far each channel's numbers moved tells which to aim at.
    let first = sample();
    let mut target = None;
    progress.wait_for(Duration::from_secs(10), || {
        let now = sample();
        let moved: Vec<_> = first
            .iter()
            .filter_map(|f| {
                let n = now
                    .iter()
                    .find(|w| (w.local, w.peer) == (f.local, f.peer))?;
                let sent = n.snd_nxt.wrapping_sub(f.snd_nxt);
                let recvd = n.rcv_nxt.wrapping_sub(f.rcv_nxt);
                Some((sent, recvd, n.local, n.peer))
            })
            .collect();
        if moved.iter().all(|m| m.0 < 1 << 20) {
            return false;
        }
        target = moved
            .iter()
            .filter(|m| m.0 > 0)
            .min_by_key(|m| m.1)
            .map(|m| (m.2, m.3));
        true
    });
    let (local, peer) = target.ok_or("no channel carried the victim's data")?;
    let present = || {
        victim
            .channel_wire()
            .into_iter()
            .flatten()
            .find(|w| (w.local, w.peer) == (local, peer))
    };
    let mut attempts = 0;
    while Instant::now() < deadline {
        let Some(w) = present() else {
            return Ok(attempts);
        };
        inj.send(w.peer, w.local, w.rcv_nxt)
            .map_err(|e| format!("sending the RST: {e}"))?;
        attempts += 1;
        // It took if the channel goes; it missed if RCV.NXT moved first (aim again).
        let mut gone = false;
        progress.wait_for(Duration::from_millis(20), || {
            match present() {
                None => gone = true,
                Some(now) => return now.rcv_nxt != w.rcv_nxt,
            }
            true
        });
        if gone {
            return Ok(attempts);
        }
    }
    Err(format!(
        "the channel {local} -> {peer} outlived {attempts} forged RSTs ({limit:?})"
    ))
}

/// Round robin over the channels of the chunk's class (the test policies' chunk choice).
fn round_robin(
    next: &mut usize,
    chunk: &netchannel::sched::ChunkInfo,
    channels: &[netchannel::sched::ChannelStats],
) -> Option<netchannel::sched::ChannelId> {
    let fit: Vec<_> = channels
        .iter()
        .filter(|c| c.class == chunk.class.channel_class())
        .collect();
    *next = next.wrapping_add(1);
    fit.get(*next % fit.len().max(1)).map(|c| c.id)
}

/// A user's policy for the scaling test: round robin, and as many throughput channels to
/// each peer as `target` says (one opened, or the newest closed, per plan).
#[derive(Debug)]
struct FollowTarget {
    target: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    next: usize,
}

impl netchannel::sched::NetScheduler for FollowTarget {
    fn pick_channel(
        &mut self,
        chunk: &netchannel::sched::ChunkInfo,
        channels: &[netchannel::sched::ChannelStats],
    ) -> Option<netchannel::sched::ChannelId> {
        round_robin(&mut self.next, chunk, channels)
    }

    fn plan(
        &mut self,
        snapshot: &netchannel::sched::StackSnapshot,
    ) -> Vec<netchannel::sched::PlanAction> {
        use netchannel::sched::{ChannelClass, PlanAction};
        let want = self.target.load(std::sync::atomic::Ordering::Relaxed);
        let mut actions = Vec::new();
        for peer in snapshot.peers() {
            let mut ours: Vec<_> = snapshot
                .channels_to(peer)
                .filter(|c| c.class == ChannelClass::Throughput)
                .map(|c| c.id)
                .collect();
            ours.sort();
            if ours.len() < want {
                actions.push(PlanAction::OpenChannel {
                    peer,
                    class: ChannelClass::Throughput,
                });
            } else if ours.len() > want {
                let channel = *ours.last().expect("more than the target");
                actions.push(PlanAction::CloseChannel { channel });
            }
        }
        actions
    }

    fn plan_period(&self) -> Duration {
        Duration::from_millis(10)
    }
}

/// Issue 12 on the bed: the stack carries out a user policy's plans while one large
/// stream and 16 small echoed ones move: channels go from 1 to 4 (opened over AF_XDP at
/// run time, accepted by the peer) and back to 1 (retired: drained, then closed). Every
/// byte arrives once, in order, and both stacks end with one channel.
#[test]
fn plans_scale_channels_1_to_4_to_1_over_af_xdp() {
    let _serial = one_at_a_time();
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let target = Arc::new(AtomicUsize::new(1));
    let build = |side: Side, policy: Option<FollowTarget>| {
        let e = bed.side(side);
        let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
        bed.run_in(side, move || {
            let b = Stack::builder()
                .interface(ifname)
                .ipv4(ipv4)
                .channels(1)
                .latency_channels(0)
                .connect_timeout(Duration::from_secs(10));
            match policy {
                Some(p) => b.scheduler(p).build(),
                None => b.build(),
            }
        })
        .expect("enter the namespace")
        .expect("stack")
    };
    let a = build(
        Side::A,
        Some(FollowTarget {
            target: target.clone(),
            next: 0,
        }),
    );
    let b = build(Side::B, None);
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    let total: u64 = std::env::var("NETCHANNEL_VNS_XDP_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000_000)
        / 2;
    const SMALL: u32 = 16;
    let rt = two_workers();
    rt.block_on(async {
        let big_l = b.bind(at(7500)).await.unwrap();
        let small_l = b.bind_with_backlog(at(7501), SMALL as usize).await.unwrap();
        let mut c = timeout(LIMIT, a.connect(at(7500))).await.unwrap().unwrap();
        let (mut s, _) = timeout(LIMIT, big_l.accept()).await.unwrap().unwrap();
        assert_eq!(a.channel_count(), 1);
        let echo = tokio::spawn(async move {
            let mut tasks = Vec::new();
            for _ in 0..SMALL {
                let (mut s, _) = small_l.accept().await.unwrap();
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
        let small: Vec<_> = (0..SMALL)
            .map(|i| {
                let a = a.clone();
                tokio::spawn(async move {
                    let c = a.connect(at(7501)).await.unwrap();
                    let (mut r, mut w) = c.into_split();
                    let tag = 2000 + u64::from(i);
                    let send = async move {
                        let mut buf = vec![0u8; PER_STREAM];
                        fill(tag, 0, &mut buf);
                        for piece in buf.chunks(PER_STREAM / 16) {
                            w.write_all(piece).await.unwrap();
                            tokio::task::yield_now().await;
                        }
                        w.shutdown().await.unwrap();
                    };
                    let recv = async move {
                        let mut got = Vec::new();
                        r.read_to_end(&mut got).await.unwrap();
                        got
                    };
                    let (_, got) = tokio::join!(send, recv);
                    let mut want = vec![0u8; PER_STREAM];
                    fill(tag, 0, &mut want);
                    assert!(got == want, "small stream {i}: {} bytes", got.len());
                })
            })
            .collect();
        let sender = tokio::spawn(async move {
            send_pattern(&mut c, 91, total).await;
            c.shutdown().await.unwrap();
            c
        });
        let mut buf = vec![0u8; 64 * 1024];
        let mut off = 0u64;
        let mut phase = 0;
        timeout(LIMIT, async {
            loop {
                let n = s.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                for (i, &x) in buf[..n].iter().enumerate() {
                    assert_eq!(x, byte(91, off + i as u64), "at {}", off + i as u64);
                }
                off += n as u64;
                if phase == 0 && off >= total / 5 {
                    target.store(4, Ordering::Relaxed);
                    phase = 1;
                } else if phase == 1 && a.channel_count() == 4 {
                    target.store(1, Ordering::Relaxed);
                    phase = 2;
                }
            }
        })
        .await
        .expect("the large stream stalled while channels scaled");
        assert_eq!(off, total);
        timeout(LIMIT, sender).await.unwrap().unwrap();
        timeout(LIMIT, async {
            for t in small {
                t.await.unwrap();
            }
            echo.await.unwrap();
        })
        .await
        .expect("small streams stalled while channels scaled");
        // However far the scaling got during the transfer, it completes the round trip.
        if phase < 2 {
            timeout(LIMIT, a.channels_reach(4))
                .await
                .expect("never 4 channels");
            target.store(1, Ordering::Relaxed);
        }
        timeout(LIMIT, a.channels_reach(1))
            .await
            .expect("A never back to 1 channel");
        timeout(LIMIT, b.channels_reach(1))
            .await
            .expect("B never back to 1 channel");
        let pc = a.plan_counters();
        println!(
            "scaling over AF_XDP: phase {phase} during the transfer; {pc:?}; resent {} + {} chunks",
            a.endpoint_counters().resent_chunks,
            b.endpoint_counters().resent_chunks
        );
        assert!(
            pc.opened >= 3 && pc.retired >= 3 && pc.closed >= 3,
            "{pc:?}"
        );
        assert_eq!(pc.open_failed, 0, "{pc:?}");
        // What the plans saw: each channel on its queue's thread, and the threads'
        // utilisation measured over a plan period.
        let stats = a.stats();
        assert!(
            stats.channels.iter().all(|c| c.thread.is_some()),
            "{stats:?}"
        );
        assert_eq!(stats.threads.len(), 2, "one thread per queue: {stats:?}");
        assert!(stats
            .threads
            .iter()
            .all(|t| !t.window.is_zero() && t.busy <= t.window));
        let threads: std::collections::BTreeSet<_> = stats.threads.iter().map(|t| t.id).collect();
        assert!(stats
            .channels
            .iter()
            .all(|c| c.thread.is_some_and(|t| threads.contains(&t))));
    });
    drop(rt);
    drop(a);
    drop(b);
}

/// A stack in `side`'s namespace under `Isolating`: 2 throughput channels and 1 latency
/// channel per peer, run-to-completion receive `rx`.
fn isolating_stack(bed: &TestBed, side: Side, rx: RuntimeRx) -> Stack {
    let e = bed.side(side);
    let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
    bed.run_in(side, move || {
        Stack::builder()
            .interface(ifname)
            .ipv4(ipv4)
            .channels(2)
            .latency_channels(1)
            .scheduler(netchannel::sched::Isolating::default())
            .runtime_rx(rx)
            .connect_timeout(Duration::from_secs(10))
            .build()
    })
    .expect("enter the namespace")
    .expect("stack")
}

/// Issue 12, isolation on the bed: a latency application on a runtime of its own
/// registers only the latency channels' queues with its reactor, and the bulk application
/// the others. Regression: the first runtime to wait registered every queue's AF_XDP
/// socket; the latency application's reactor then polled the bulk queues' sockets, which
/// in copy mode drives their transmission under the socket's mutex, and waited 1-5 ms
/// behind the bulk channel thread's batches (`perf sched`, tenth session).
#[test]
fn a_latency_application_registers_only_the_latency_queues_with_its_runtime() {
    let _serial = one_at_a_time();
    use netchannel::sched::ChannelClass;
    use netchannel::AppClass;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    // Bulk readers wait in their runtime too, so that the bulk queues get registered (by
    // the bulk application).
    let a = isolating_stack(&bed, Side::A, RuntimeRx::All);
    let b = isolating_stack(&bed, Side::B, RuntimeRx::All);
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    let runtime = |name: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()
            .unwrap()
    };
    let lat_rt = runtime("lat-app");
    let bulk_rt = runtime("bulk-app");
    const PINGS: usize = 100;
    const MSG: usize = 4096;
    const BULK: u64 = 5_000_000;
    let (lat_l, bulk_l) = bulk_rt.block_on(async {
        (
            b.bind(at(7611)).await.unwrap(),
            b.bind(at(7610)).await.unwrap(),
        )
    });
    // The latency application first: it waits before any bulk task does.
    let b2 = b.clone();
    let echo = lat_rt.spawn(async move {
        let (mut s, _) = lat_l.accept().await.unwrap();
        timeout(LIMIT, b2.channels_reach(3))
            .await
            .expect("B never got its latency channel");
        s.set_app_class(AppClass::Latency).unwrap();
        let mut buf = vec![0u8; MSG];
        for _ in 0..PINGS {
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
        }
    });
    let a2 = a.clone();
    let pings = lat_rt.spawn(async move {
        let mut lat = timeout(LIMIT, a2.connect(at(7611))).await.unwrap().unwrap();
        lat.set_app_class(AppClass::Latency).unwrap();
        let (mut msg, mut back) = (vec![0u8; MSG], vec![0u8; MSG]);
        for k in 0..PINGS {
            fill(910, (k * MSG) as u64, &mut msg);
            lat.write_all(&msg).await.unwrap();
            lat.read_exact(&mut back).await.unwrap();
            assert!(back == msg, "echo {k}");
        }
    });
    lat_rt.block_on(async {
        timeout(LIMIT, pings).await.unwrap().unwrap();
        timeout(LIMIT, echo).await.unwrap().unwrap();
    });
    bulk_rt.block_on(async {
        let sink = tokio::spawn(async move {
            let (mut s, _) = bulk_l.accept().await.unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            let mut off = 0u64;
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break off;
                }
                let mut want = vec![0u8; n];
                fill(310, off, &mut want);
                assert!(buf[..n] == want[..], "bulk stream at {off}");
                off += n as u64;
            }
        });
        let mut c = timeout(LIMIT, a.connect(at(7610))).await.unwrap().unwrap();
        send_pattern(&mut c, 310, BULK).await;
        c.shutdown().await.unwrap();
        assert_eq!(timeout(LIMIT, sink).await.unwrap().unwrap(), BULK);
    });
    for (name, stack) in [("A", &a), ("B", &b)] {
        let st = stack.stats();
        let queues_of = |class| -> std::collections::BTreeSet<u32> {
            st.channels
                .iter()
                .filter(|c| c.class == class)
                .filter_map(|c| c.queue)
                .collect()
        };
        let (lat_q, bulk_q) = (
            queues_of(ChannelClass::Latency),
            queues_of(ChannelClass::Throughput),
        );
        assert!(lat_q.is_disjoint(&bulk_q), "{name}: {st:?}");
        let regs = stack.runtime_rx_registrations();
        println!("{name}: latency queues {lat_q:?}, bulk {bulk_q:?}; registered {regs:?}");
        for q in &lat_q {
            assert!(
                regs.iter()
                    .any(|(rq, by)| rq == q && by.as_deref() == Some("lat-app")),
                "{name}: latency queue {q} not registered by the latency application: {regs:?}"
            );
        }
        // The bulk application's worker or the thread of its `block_on` (the test's).
        for (q, by) in &regs {
            if bulk_q.contains(q) {
                assert_ne!(
                    by.as_deref(),
                    Some("lat-app"),
                    "{name}: the latency application registered bulk queue {q}: {regs:?}"
                );
            }
        }
        assert!(
            regs.iter().any(|(q, _)| bulk_q.contains(q)),
            "{name}: the bulk application waited on no bulk queue: {regs:?}"
        );
    }
    drop((lat_rt, bulk_rt));
    a.abort();
    b.abort();
}

/// Issue 12, isolation on the bed: with `Isolating` on both stacks (2 queues), the latency
/// channel opens on a queue thread of its own, the policy's plans pin that thread and the
/// bulk one to different cores, and while 4 bulk streams saturate the throughput channels
/// a latency-class stream's exchanges go on the latency channel only: it never carries
/// bulk bytes, and no thread runs channels of both classes.
#[test]
fn isolating_keeps_latency_streams_off_bulk_channels_threads_and_cores() {
    let _serial = one_at_a_time();
    use netchannel::sched::ChannelClass;
    use netchannel::AppClass;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = isolating_stack(&bed, Side::A, RuntimeRx::default());
    let b = isolating_stack(&bed, Side::B, RuntimeRx::default());
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    const BULK: u64 = 20_000_000;
    const PINGS: usize = 200;
    const MSG: usize = 4096;
    let rt = two_workers();
    rt.block_on(async {
        let bulk_l = b.bind(at(7600)).await.unwrap();
        let lat_l = b.bind(at(7601)).await.unwrap();
        let sink = tokio::spawn(async move {
            let mut readers = Vec::new();
            for _ in 0..4u64 {
                let (mut s, _) = bulk_l.accept().await.unwrap();
                readers.push(tokio::spawn(async move {
                    // Streams are accepted in any order: each names its pattern first.
                    let i = s.read_u64().await.unwrap();
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut off = 0u64;
                    loop {
                        let n = s.read(&mut buf).await.unwrap();
                        if n == 0 {
                            break;
                        }
                        let mut want = vec![0u8; n];
                        fill(300 + i, off, &mut want);
                        assert!(buf[..n] == want[..], "bulk stream at {off}");
                        off += n as u64;
                    }
                    off
                }));
            }
            let mut total = 0;
            for r in readers {
                total += r.await.unwrap();
            }
            total
        });
        let b2 = b.clone();
        let echo = tokio::spawn(async move {
            let (mut s, _) = lat_l.accept().await.unwrap();
            // B accepts A's channels one by one: the latency one may join after this
            // socket's SYNC came in on a throughput one (until then there is no channel
            // of the class, `AddrNotAvailable`). All three (2 + 1) are there first.
            timeout(LIMIT, b2.channels_reach(3))
                .await
                .expect("B never got its latency channel");
            s.set_app_class(AppClass::Latency).unwrap();
            let mut buf = vec![0u8; MSG];
            for _ in 0..PINGS {
                s.read_exact(&mut buf).await.unwrap();
                s.write_all(&buf).await.unwrap();
            }
        });
        let mut lat = timeout(LIMIT, a.connect(at(7601))).await.unwrap().unwrap();
        lat.set_app_class(AppClass::Latency).unwrap();
        let senders: Vec<_> = (0..4u64)
            .map(|i| {
                let a = a.clone();
                tokio::spawn(async move {
                    let mut c = a.connect(at(7600)).await.unwrap();
                    c.write_u64(i).await.unwrap();
                    send_pattern(&mut c, 300 + i, BULK).await;
                    c.shutdown().await.unwrap();
                })
            })
            .collect();
        let mut msg = vec![0u8; MSG];
        let mut back = vec![0u8; MSG];
        timeout(LIMIT, async {
            for k in 0..PINGS {
                fill(900, (k * MSG) as u64, &mut msg);
                lat.write_all(&msg).await.unwrap();
                lat.read_exact(&mut back).await.unwrap();
                assert!(back == msg, "echo {k}");
            }
        })
        .await
        .expect("the latency stream stalled");
        for s in senders {
            timeout(LIMIT, s).await.unwrap().unwrap();
        }
        assert_eq!(timeout(LIMIT, sink).await.unwrap().unwrap(), 4 * BULK);
        timeout(LIMIT, echo).await.unwrap().unwrap();
        // The plans pinned the latency thread and the bulk thread (a plan period after
        // the channels were there, long before now; two more plans to be sure).
        let asked = a.plan_counters().plans;
        timeout(LIMIT, a.plans_reach(asked + 2))
            .await
            .expect("no more plans were asked for");
        assert!(
            a.plan_counters().pinned >= 2,
            "threads not pinned apart: {:?}",
            a.plan_counters()
        );
        // The stack's driver thread (bulk work: every channel, every shard) is kept off
        // the latency channels' cores once they are pinned.
        let latency_cores: std::collections::BTreeSet<usize> = {
            let st = a.stats();
            let lat_threads: Vec<_> = st
                .channels
                .iter()
                .filter(|c| c.class == ChannelClass::Latency)
                .filter_map(|c| c.thread)
                .collect();
            st.threads
                .iter()
                .filter(|t| lat_threads.contains(&t.id))
                .filter_map(|t| t.core)
                .collect()
        };
        assert!(!latency_cores.is_empty(), "the latency thread has a core");
        let drivers = driver_threads_cores();
        assert!(
            drivers
                .iter()
                .any(|c| !c.is_empty() && c.is_disjoint(&latency_cores)),
            "no driver thread kept off the latency cores {latency_cores:?}: {drivers:?}"
        );
        for (name, stack) in [("A", &a), ("B", &b)] {
            let st = stack.stats();
            let threads_of = |class| -> std::collections::BTreeSet<_> {
                st.channels
                    .iter()
                    .filter(|c| c.class == class)
                    .map(|c| c.thread.expect("AF_XDP channels run on a queue thread"))
                    .collect()
            };
            let (lat_t, bulk_t) = (
                threads_of(ChannelClass::Latency),
                threads_of(ChannelClass::Throughput),
            );
            assert!(!lat_t.is_empty() && !bulk_t.is_empty(), "{name}: {st:?}");
            assert!(
                lat_t.is_disjoint(&bulk_t),
                "{name}: a thread runs both classes: {st:?}"
            );
            // A task reading a latency-class socket processes arrivals of the latency
            // channels' queue only in its runtime, any other task those of the rest: the
            // latency application's thread never processes bulk frames.
            let queues_of = |class| -> std::collections::BTreeSet<u32> {
                st.channels
                    .iter()
                    .filter(|c| c.class == class)
                    .map(|c| c.queue.expect("AF_XDP channels are on a NIC queue"))
                    .collect()
            };
            let served = |latency_class| -> std::collections::BTreeSet<u32> {
                stack.runtime_rx_queues(latency_class).into_iter().collect()
            };
            assert_eq!(
                served(true),
                queues_of(ChannelClass::Latency),
                "{name}: queues a latency-class task serves"
            );
            assert_eq!(
                served(false),
                queues_of(ChannelClass::Throughput),
                "{name}: queues other tasks serve"
            );
            let lat_sent: u64 = st
                .channels
                .iter()
                .filter(|c| c.class == ChannelClass::Latency)
                .map(|c| c.sent_bytes)
                .sum();
            let bulk_sent: u64 = st
                .channels
                .iter()
                .filter(|c| c.class == ChannelClass::Throughput)
                .map(|c| c.sent_bytes)
                .sum();
            println!(
                "{name}: latency channels sent {lat_sent} B on threads {lat_t:?}, \
                 throughput channels {bulk_sent} B on {bulk_t:?}; threads {:?}",
                st.threads
            );
            assert!(lat_sent >= (PINGS * MSG) as u64, "{name}: {lat_sent}");
            assert!(
                lat_sent < 2 * (PINGS * MSG) as u64 + (1 << 20),
                "{name}: bulk bytes on the latency channel: {lat_sent}"
            );
        }
        let st = a.stats();
        let core_of = |class| {
            let t = st
                .channels
                .iter()
                .find(|c| c.class == class)
                .and_then(|c| c.thread)
                .unwrap();
            st.threads.iter().find(|x| x.id == t).and_then(|x| x.core)
        };
        let (lc, bc) = (
            core_of(ChannelClass::Latency),
            core_of(ChannelClass::Throughput),
        );
        assert!(
            lc.is_some() && bc.is_some() && lc != bc,
            "cores: latency {lc:?}, bulk {bc:?}"
        );
    });
    drop(rt);
    drop(a);
    drop(b);
}

/// The shipped `Scaler` (issue 12), end to end over AF_XDP: stack A runs
/// `Scaled<RoundRobin>` with plans carried out, starting with one channel to B. A bulk
/// stream from A to B keeps A's channel thread busy above the scale-up threshold, so the
/// scaler opens a second channel; once the stream ends and the channels idle through the
/// grace periods, it closes one again. Every byte of the stream arrives exactly once, in
/// order, across both changes. The thresholds are low (5 % busy to grow) so that the test
/// does not depend on how fast this machine is; the decisions themselves, thresholds and
/// hysteresis included, are unit-tested in `netsched::scaling`.
#[test]
fn the_scaler_grows_and_shrinks_channels_under_real_load_over_af_xdp() {
    let _serial = one_at_a_time();
    use netchannel::sched::{RoundRobin, Scaled, ScalingConfig};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let build = |side: Side, scaled: bool| {
        let e = bed.side(side);
        let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
        bed.run_in(side, move || {
            let b = Stack::builder()
                .interface(ifname)
                .ipv4(ipv4)
                .channels(1)
                .latency_channels(0)
                .connect_timeout(Duration::from_secs(10));
            if scaled {
                let config = ScalingConfig {
                    scale_up_utilisation: 0.05,
                    scale_up_periods: 2,
                    scale_down_utilisation: 0.04,
                    idle_grace_periods: 3,
                    cooldown_periods: 2,
                    min_channels: 1,
                    max_channels: 2,
                };
                let policy = Scaled::new(RoundRobin::default(), config).expect("scaling config");
                b.scheduler(policy).execute_plans(true).build()
            } else {
                b.build()
            }
        })
        .expect("enter the namespace")
        .expect("stack")
    };
    let a = build(Side::A, true);
    let b = build(Side::B, false);
    let b_ip = bed.side(Side::B).ipv4;
    let to = SocketAddr::from(SocketAddrV4::new(b_ip, 7600));
    let rt = two_workers();
    rt.block_on(async {
        let l = b.bind(to).await.unwrap();
        let mut c = timeout(LIMIT, a.connect(to)).await.unwrap().unwrap();
        let (mut s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
        assert_eq!(a.channel_count(), 1);
        let stop = Arc::new(AtomicBool::new(false));
        let (progress_tx, mut progress) = tokio::sync::watch::channel(0u64);
        let sender = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 60_000];
                let mut off = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    fill(77, off, &mut buf);
                    c.write_all(&buf).await.expect("write");
                    off += buf.len() as u64;
                    progress_tx.send_replace(off);
                }
                c.shutdown().await.expect("shutdown");
                off
            })
        };
        let receiver = tokio::spawn(async move { recv_pattern(&mut s, 77).await });
        timeout(LIMIT, a.channels_reach(2))
            .await
            .expect("the scaler opened a second channel under load");
        let plans = a.plan_counters();
        // The stream goes on over both channels for a while before it ends.
        let at_growth = *progress.borrow();
        timeout(LIMIT, progress.wait_for(|&sent| sent >= at_growth + (32 << 20)))
            .await
            .expect("the stream went on")
            .expect("the sender is running");
        let carried: Vec<u64> = a.stats().channels.iter().map(|c| c.sent_bytes).collect();
        assert_eq!(carried.len(), 2);
        assert!(carried.iter().all(|&n| n > 0), "both channels carried bytes: {carried:?}");
        stop.store(true, Ordering::Relaxed);
        let sent = sender.await.unwrap();
        let received = timeout(LIMIT, receiver).await.unwrap().unwrap();
        assert_eq!(received, sent, "every byte once, in order");
        assert!(sent > 0);
        timeout(LIMIT, a.channels_reach(1))
            .await
            .expect("the scaler closed the idle channel");
        assert_eq!(a.channel_count(), 1);
        println!(
            "scaler: 1 -> 2 -> 1 channels while {} MB went through; plans at growth {plans:?}, at the end {:?}",
            sent >> 20,
            a.plan_counters()
        );
    });
    drop(rt);
    a.abort();
    b.abort();
}

/// A user's policy for the thread-placement test: round robin, and by `phase`: 1, a
/// channel thread on the last core the stack may use, serving every queue; 2, that
/// thread retired.
#[derive(Debug)]
struct ThreadShaper {
    phase: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    next: usize,
}

impl netchannel::sched::NetScheduler for ThreadShaper {
    fn pick_channel(
        &mut self,
        chunk: &netchannel::sched::ChunkInfo,
        channels: &[netchannel::sched::ChannelStats],
    ) -> Option<netchannel::sched::ChannelId> {
        round_robin(&mut self.next, chunk, channels)
    }

    fn plan(
        &mut self,
        snapshot: &netchannel::sched::StackSnapshot,
    ) -> Vec<netchannel::sched::PlanAction> {
        use netchannel::sched::PlanAction;
        let Some(&core) = snapshot.cores.last() else {
            return Vec::new();
        };
        let mine = snapshot
            .threads
            .iter()
            .find(|t| t.core == Some(core))
            .map(|t| t.id);
        match (self.phase.load(std::sync::atomic::Ordering::Relaxed), mine) {
            (1, None) => vec![PlanAction::SpawnThread { core }],
            (1, Some(thread)) => snapshot
                .queues
                .iter()
                .filter(|q| q.thread != thread)
                .map(|q| PlanAction::AssignQueue {
                    queue: q.queue,
                    thread,
                })
                .collect(),
            (2, Some(thread)) => vec![PlanAction::RetireThread { thread }],
            _ => Vec::new(),
        }
    }

    fn plan_period(&self) -> Duration {
        Duration::from_millis(10)
    }
}

/// Issue 12, thread placement on the bed: while one virtual stream carries data both
/// ways, a plan spawns a channel thread on a core, moves both NIC queues (and with them
/// every channel) onto it, and later retires it (the queues go back to the first
/// threads). Every byte arrives once and in order both ways, the plans' counters and the
/// snapshots show each step, and no channel was lost.
#[test]
fn plans_spawn_move_and_retire_channel_threads_under_load_over_af_xdp() {
    let _serial = one_at_a_time();
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let phase = Arc::new(AtomicUsize::new(0));
    let a = {
        let e = bed.side(Side::A);
        let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
        let policy = ThreadShaper {
            phase: phase.clone(),
            next: 0,
        };
        bed.run_in(Side::A, move || {
            Stack::builder()
                .interface(ifname)
                .ipv4(ipv4)
                .channels(CHANNELS)
                .connect_timeout(Duration::from_secs(10))
                .scheduler(policy)
                .build()
        })
        .expect("enter the namespace")
        .expect("stack")
    };
    let b = stack_in(&bed, Side::B);
    let b_ip = bed.side(Side::B).ipv4;
    let at = SocketAddr::from(SocketAddrV4::new(b_ip, 7600));
    let total: u64 = std::env::var("NETCHANNEL_VNS_XDP_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000_000)
        / 2;
    let rt = two_workers();
    // The thread the plan spawned, if it is there and serves both queues.
    let spawned_serving_all = |a: &Stack| {
        let p = a.channel_placement().expect("AF_XDP stacks have threads");
        let first: Vec<u32> = p
            .threads
            .iter()
            .map(|t| t.id)
            .filter(|&id| id < 2)
            .collect();
        p.threads
            .iter()
            .find(|t| !first.contains(&t.id) && t.queues.len() == 2)
            .map(|t| t.id)
    };
    rt.block_on(async {
        let l = b.bind(at).await.unwrap();
        let c = timeout(LIMIT, a.connect(at)).await.unwrap().unwrap();
        let (s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
        let before = a.channel_placement().unwrap();
        assert_eq!(before.threads.len(), 2, "one thread per queue: {before}");
        let channels = a.channel_count();
        let (mut a_rd, mut a_wr) = c.into_split();
        let (mut b_rd, mut b_wr) = s.into_split();
        // B to A, verified on A.
        let back = tokio::spawn(async move {
            let mut buf = vec![0u8; 60_000];
            let mut off = 0u64;
            while off < total {
                let n = (total - off).min(buf.len() as u64) as usize;
                fill(94, off, &mut buf[..n]);
                b_wr.write_all(&buf[..n]).await.expect("write B to A");
                off += n as u64;
            }
            b_wr.shutdown().await.unwrap();
        });
        let back_rx = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut off = 0u64;
            loop {
                let n = a_rd.read(&mut buf).await.expect("read on A");
                if n == 0 {
                    return off;
                }
                for (i, &x) in buf[..n].iter().enumerate() {
                    assert_eq!(x, byte(94, off + i as u64), "B to A at {}", off + i as u64);
                }
                off += n as u64;
            }
        });
        let forth = tokio::spawn(async move {
            let mut buf = vec![0u8; 60_000];
            let mut off = 0u64;
            while off < total {
                let n = (total - off).min(buf.len() as u64) as usize;
                fill(93, off, &mut buf[..n]);
                a_wr.write_all(&buf[..n]).await.expect("write A to B");
                off += n as u64;
            }
            a_wr.shutdown().await.unwrap();
        });
        // A to B, verified here, moving the phases on as it goes.
        let mut buf = vec![0u8; 64 * 1024];
        let mut off = 0u64;
        let mut last_look = 0u64;
        let (mut moved_at, mut retired_at) = (None, None);
        let mut spawned = None;
        timeout(LIMIT, async {
            loop {
                let n = b_rd.read(&mut buf).await.expect("read on B");
                if n == 0 {
                    break;
                }
                for (i, &x) in buf[..n].iter().enumerate() {
                    assert_eq!(x, byte(93, off + i as u64), "A to B at {}", off + i as u64);
                }
                off += n as u64;
                if off - last_look < (1 << 20) {
                    continue;
                }
                last_look = off;
                match phase.load(Ordering::Relaxed) {
                    0 if off >= total / 5 => phase.store(1, Ordering::Relaxed),
                    1 if moved_at.is_some() && off >= total / 2 => {
                        // The spawned thread carried both queues' traffic meanwhile.
                        let t = spawned.expect("moved");
                        let p = a.channel_placement().unwrap();
                        let busy = p.thread(t).map(|x| x.busy).unwrap_or_default();
                        assert!(!busy.is_zero(), "{p}");
                        phase.store(2, Ordering::Relaxed);
                    }
                    1 if moved_at.is_none() => {
                        if let Some(t) = spawned_serving_all(&a) {
                            // What the scheduler sees: every channel on the new thread.
                            let stats = a.stats();
                            let id = netchannel::sched::ChannelThreadId(t);
                            assert!(stats.queues.iter().all(|q| q.thread == id), "{stats:?}");
                            assert!(
                                stats.channels.iter().all(|c| c.thread == Some(id)),
                                "{stats:?}"
                            );
                            spawned = Some(t);
                            moved_at = Some(off);
                        }
                    }
                    2 if retired_at.is_none() => {
                        let p = a.channel_placement().unwrap();
                        if spawned.is_some_and(|t| p.thread(t).is_none()) {
                            retired_at = Some(off);
                        }
                    }
                    _ => {}
                }
            }
        })
        .await
        .expect("A to B stalled while threads moved");
        assert_eq!(off, total);
        timeout(LIMIT, forth).await.unwrap().unwrap();
        timeout(LIMIT, back).await.unwrap().unwrap();
        assert_eq!(timeout(LIMIT, back_rx).await.unwrap().unwrap(), total);
        let pc = a.plan_counters();
        println!(
            "thread placement over AF_XDP: queues moved at {moved_at:?}, thread retired at \
             {retired_at:?} of {total} bytes; {pc:?}; placement now {}",
            a.channel_placement().unwrap()
        );
        // Both happened while data was flowing.
        assert!(moved_at.is_some_and(|m| m < total), "{moved_at:?}");
        assert!(retired_at.is_some_and(|r| r < total), "{retired_at:?}");
        assert_eq!(pc.threads_spawned, 1, "{pc:?}");
        assert_eq!(pc.queues_moved, 2, "{pc:?}");
        assert_eq!(pc.threads_retired, 1, "{pc:?}");
        assert_eq!(pc.refused, 0, "{pc:?}");
        // No channel was lost on the way, and the placement is back to two threads
        // serving the queues, as the snapshot (serialisable) shows.
        assert_eq!(a.channel_count(), channels);
        assert_eq!(a.channel_resets_received(), 0);
        let stats = a.stats();
        assert_eq!(stats.threads.len(), 2, "{stats:?}");
        let threads: std::collections::BTreeSet<_> = stats.threads.iter().map(|t| t.id).collect();
        assert!(!threads.contains(&netchannel::sched::ChannelThreadId(spawned.unwrap())));
        assert_eq!(stats.queues.len(), 2, "{stats:?}");
        assert!(stats.queues.iter().all(|q| threads.contains(&q.thread)));
        let json = serde_json::to_string(&stats).unwrap();
        let back: netchannel::sched::StackSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back.queues, stats.queues);
    });
    drop(rt);
    drop(a);
    drop(b);
}

/// The shipped `Scaler` placing channel threads (`Scaled::placing_threads`, issue 12), end
/// to end over AF_XDP: A's channel set starts with one thread serving both NIC queues (the
/// other thread removed). A bulk stream keeps that thread busy above the threshold, so the
/// scaler spawns a thread on a core no thread is pinned to and hands it the second queue.
/// The stream's bytes all arrive once, in order, across the move; the placement and the
/// plan counters show the spawn and the move.
#[test]
fn the_scaler_gives_a_crowded_threads_second_queue_a_thread_of_its_own_over_af_xdp() {
    let _serial = one_at_a_time();
    use netchannel::netdriver::channel::{ChannelSet, ChannelSetConfig};
    use netchannel::sched::{RoundRobin, Scaled, ScalingConfig};
    use netchannel::vns::stack::XdpBackend;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let e = bed.side(Side::A).clone();
    let a = bed
        .run_in(Side::A, move || {
            let set = ChannelSet::start(ChannelSetConfig::new(e.ifname.clone(), e.ipv4))
                .expect("channel set");
            // One thread for both queues: thread 1's queue goes to thread 0.
            set.remove_thread(1).expect("remove thread 1");
            let p = set.placement();
            assert_eq!(
                p.thread_of(0),
                p.thread_of(1),
                "both queues on one thread: {p}"
            );
            let config = ScalingConfig {
                scale_up_utilisation: 0.05,
                scale_up_periods: 2,
                scale_down_utilisation: 0.01,
                idle_grace_periods: 1000,
                cooldown_periods: 2,
                min_channels: 2,
                max_channels: 2,
            };
            let policy = Scaled::new(RoundRobin::default(), config)
                .expect("scaling config")
                .placing_threads();
            Stack::builder()
                .ipv4(e.ipv4)
                .channels(2)
                .latency_channels(0)
                .connect_timeout(Duration::from_secs(10))
                .scheduler(policy)
                .execute_plans(true)
                .build_with_backend(Arc::new(XdpBackend::new(set)))
        })
        .expect("enter the namespace")
        .expect("stack A");
    let b = stack_in(&bed, Side::B);
    let to = SocketAddr::from(SocketAddrV4::new(bed.side(Side::B).ipv4, 7700));
    let rt = two_workers();
    rt.block_on(async {
        let l = b.bind(to).await.unwrap();
        let mut c = timeout(LIMIT, a.connect(to)).await.unwrap().unwrap();
        let (mut s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let sender = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 60_000];
                let mut off = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    fill(78, off, &mut buf);
                    c.write_all(&buf).await.expect("write");
                    off += buf.len() as u64;
                }
                c.shutdown().await.expect("shutdown");
                off
            })
        };
        let receiver = tokio::spawn(async move { recv_pattern(&mut s, 78).await });
        // Plan after plan, until the scaler has moved a queue.
        timeout(LIMIT, async {
            while a.plan_counters().queues_moved == 0 {
                let next = a.plan_counters().plans + 1;
                a.plans_reach(next).await;
            }
        })
        .await
        .expect("the scaler moved a queue off the crowded thread");
        let p = a
            .channel_placement()
            .expect("AF_XDP stacks have a placement");
        let (t0, t1) = (p.thread_of(0), p.thread_of(1));
        assert!(
            t0.is_some() && t1.is_some() && t0 != t1,
            "queues on threads {t0:?}, {t1:?}: {p}"
        );
        let spawned = p.thread(t1.unwrap()).expect("queue 1's thread");
        assert!(
            spawned.core.is_some() && !spawned.dead,
            "the new thread is pinned and alive: {p}"
        );
        let plans = a.plan_counters();
        assert!(
            plans.threads_spawned >= 1 && plans.queues_moved >= 1 && plans.refused == 0,
            "{plans:?}"
        );
        stop.store(true, Ordering::Relaxed);
        let sent = sender.await.unwrap();
        let received = timeout(LIMIT, receiver).await.unwrap().unwrap();
        assert_eq!(received, sent, "every byte once, in order");
        println!("scaler placement: {p}; {} MB; {plans:?}", sent >> 20);
    });
    drop(rt);
    a.abort();
    b.abort();
}
