//! End to end over the AF_XDP test bed: two `Stack`s, one per namespace, each on both
//! queues of its veth end, with several channels between them: many virtual streams, large
//! verified transfers, `Framed` over a `VirtualStream`, kernel TCP peers, copy workers,
//! channel faults mid-transfer, the scheduler's plans, and where each NIC queue's driver
//! runs (the application's runtime, a latency application's, or queue runtimes of the
//! stack's own) with what that placement promises: isolation of the latency queue, and
//! streams that keep flowing when the application's runtime is blocked.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
//! `NETCHANNEL_VNS_XDP_BYTES` sets the size of the large transfers (default 100 MB).
#![cfg(target_os = "linux")]

use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use netchannel::netdriver::channel::{ChannelPlacement, DriverPlace};
use netchannel::vns::copy::CopyConfig;
use netchannel::vns::stack::{StackBuilder, APPLICATION_RUNTIME, LATENCY_RUNTIME};
use netchannel::vns::Config;
use netchannel::{Stack, VirtualStream};
use testbed::{testbed_or_skip, Side, TestBed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

const CHANNELS: usize = 4;
const STREAMS: u32 = 64;
const PER_STREAM: usize = 256 * 1024;
const LIMIT: Duration = Duration::from_secs(120);

/// The tests of this file run one at a time. Each drives two stacks and large transfers
/// through the bed; all of them at once on a 2-core machine starve each other, and the
/// timing bounds some of them assert (a blocked runtime's rescue) would measure that
/// starvation instead of the stack.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A tokio runtime with 2 workers, as the bed's 2 cores.
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A multi-thread tokio runtime with one worker, named `name`: an application whose
/// every task shares one thread.
fn one_worker(name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
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

/// Where a test's stack may drive its NIC queues. Stacks are built on a thread that
/// entered the side's namespace, outside any runtime, so the application's runtime is
/// handed to them.
#[derive(Clone)]
enum Drive {
    /// The scheduler's default placement with this runtime as the application's: on a
    /// small host (fewer than `DISAGGREGATE_MIN_CORES` cores, as the bed) every queue is
    /// driven by the application's runtime, run to completion.
    Application(tokio::runtime::Handle),
    /// Queue runtimes of the stack's own, whatever the host: what plans that spawn, move
    /// and retire runtimes act on.
    Own,
}

impl Drive {
    fn apply(self, b: StackBuilder) -> StackBuilder {
        match self {
            Drive::Application(h) => b.runtime(h),
            Drive::Own => b.application_runtime(false),
        }
    }
}

/// Whether this host is one the scheduler's default runs to completion on: every queue on
/// the application's runtime when there is one.
fn small_host() -> bool {
    std::thread::available_parallelism().map_or(1, usize::from)
        < netchannel::sched::DISAGGREGATE_MIN_CORES
}

/// The application's runtime, as the channel placement names it.
fn application() -> DriverPlace {
    DriverPlace::External(APPLICATION_RUNTIME.into())
}

/// A latency application's runtime, as the channel placement names it.
fn latency() -> DriverPlace {
    DriverPlace::External(LATENCY_RUNTIME.into())
}

/// The ids of the stack's own queue runtimes in a placement.
fn own_runtimes(p: &ChannelPlacement) -> Vec<u32> {
    p.runtimes
        .iter()
        .filter_map(|r| match r.place {
            DriverPlace::Runtime(id) => Some(id),
            DriverPlace::External(_) => None,
        })
        .collect()
}

/// Each queue's (rounds, polls) so far, by queue.
fn rounds_and_polls(s: &Stack) -> std::collections::BTreeMap<u32, (u64, u64)> {
    s.diagnostics()
        .queue_stats()
        .into_iter()
        .map(|q| (q.queue, (q.rounds, q.polls)))
        .collect()
}

fn stack_in(bed: &TestBed, side: Side, drive: Drive) -> Stack {
    stack_with_workers_in(bed, side, 0, drive)
}

/// Copy workers share copies of at least this many bytes.
const COPY_THRESHOLD: usize = 256 * 1024;

fn stack_with_workers_in(bed: &TestBed, side: Side, workers: usize, drive: Drive) -> Stack {
    let e = bed.side(side);
    let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
    bed.run_in(side, move || {
        let mut b = drive.apply(
            Stack::builder()
                .interface(ifname)
                .ipv4(ipv4)
                .channels(CHANNELS)
                .connect_timeout(Duration::from_secs(10)),
        );
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

/// Two stacks on the application's runtime (the test's): a refused connect, 64 streams
/// echoed at once and verified, one large transfer verified byte by byte, and `Framed`
/// messages over a stream.
#[test]
fn two_stacks_over_af_xdp() {
    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let rt = two_workers();
    let a = stack_in(&bed, Side::A, Drive::Application(rt.handle().clone()));
    let b = stack_in(&bed, Side::B, Drive::Application(rt.handle().clone()));
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    let total: u64 = std::env::var("NETCHANNEL_VNS_XDP_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000_000);

    rt.block_on(async {
        // Refused: nothing listens on the port (the channels exist after this).
        let e = timeout(LIMIT, a.connect(at(7999)))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        // CHANNELS throughput channels plus one latency channel, over both queues.
        assert_eq!(a.diagnostics().channel_count(), CHANNELS + 1);

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
    drop((a, b));
    drop(rt);
}

/// A stack and a plain host (kernel TCP at its defaults, no channel port): a kernel client
/// against a `VirtualListener`, and a `connect` that falls back to plain TCP against a
/// kernel server; both echo 1 MiB exactly.
#[test]
fn plain_kernel_tcp_peers_over_af_xdp() {
    let _serial = one_at_a_time();
    use std::io::{Read, Write};
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let rt = two_workers();
    // Only B runs a stack; A is a plain host (kernel TCP, no channel port).
    let b = stack_in(&bed, Side::B, Drive::Application(rt.handle().clone()));
    let a_ip = bed.side(Side::A).ipv4;
    let b_ip = bed.side(Side::B).ipv4;
    const LEN: usize = 1 << 20;
    let mut data = vec![0u8; LEN];
    fill(77, 0, &mut data);

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
    drop(b);
    drop(rt);
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
    // The test's runtime has one thread: the queues get runtimes of the stacks' own.
    let a = stack_with_workers_in(&bed, Side::A, 2, Drive::Own);
    let b = stack_with_workers_in(&bed, Side::B, 2, Drive::Own);
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
        let held = b.diagnostics().copy_stats();
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
        let (sa, sb) = (a.diagnostics().copy_stats(), b.diagnostics().copy_stats());
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
    let tids = [
        a.diagnostics().copy_worker_tids(),
        b.diagnostics().copy_worker_tids(),
    ]
    .concat();
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
/// per peer where the process may run on fewer than 4 cores (each channel is a TCP
/// connection whose work shares those cores with the application; more of them only split
/// the batches), 4 elsewhere; and that many open (besides the latency channel).
#[test]
fn the_channel_count_is_chosen_from_the_host() {
    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let rt = two_workers();
    let build = |side: Side| {
        let e = bed.side(side);
        let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
        let app = rt.handle().clone();
        bed.run_in(side, move || {
            Stack::builder()
                .interface(ifname)
                .ipv4(ipv4)
                .runtime(app)
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
        assert_eq!(
            a.diagnostics().stats().channels.len(),
            expected + 1,
            "{:?}",
            a.diagnostics().stats()
        );
        c.shutdown().await.unwrap();
        drop(c);
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
    drop((a, b));
    drop(rt);
}

/// Run to completion on a small host: stacks built with the application's runtime
/// (`StackBuilder::runtime`, the test's) drive both NIC queues there, the scheduler's
/// default on a host with fewer than `DISAGGREGATE_MIN_CORES` cores (elsewhere, runtimes
/// of their own), so that the application's tasks run the queues' rounds between their
/// own. Many tasks exchange echoed messages of every size at once, latency- and
/// throughput-class, with shutdowns and drops interleaved, and a large transfer is
/// verified byte by byte; both queues' drivers did the work (their rounds and polls
/// grew), and the scheduler's snapshot puts no channel on a runtime of the stack's own.
#[test]
fn the_application_runtime_drives_the_queues_of_a_small_host_over_af_xdp() {
    let _serial = one_at_a_time();
    use netchannel::AppClass;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let rt = two_workers();
    let a = stack_in(&bed, Side::A, Drive::Application(rt.handle().clone()));
    let b = stack_in(&bed, Side::B, Drive::Application(rt.handle().clone()));
    let small = small_host();
    for (name, s) in [("A", &a), ("B", &b)] {
        let p = s.diagnostics().channel_placement();
        if small {
            assert_eq!(
                p.runtime(&application()).map(|r| r.queues.clone()),
                Some(vec![0, 1]),
                "{name}: {p}"
            );
            // The one runtime of the stack's own is the home of its control task and of
            // queues rescued from a blocked application; it drives none.
            assert_eq!(own_runtimes(&p), vec![0], "{name}: {p}");
            assert_eq!(
                p.runtime(&DriverPlace::Runtime(0)).map(|r| r.queues.len()),
                Some(0),
                "{name}: {p}"
            );
        } else {
            assert!(p.runtime(&application()).is_none(), "{name}: {p}");
            assert!(
                (0..2).all(|q| matches!(p.place_of(q), Some(DriverPlace::Runtime(_)))),
                "{name}: {p}"
            );
        }
        for q in s.diagnostics().queue_stats() {
            assert_eq!(
                Some(&q.place),
                p.place_of(q.queue).as_ref(),
                "{name}: {q:?}"
            );
        }
    }
    let before = (rounds_and_polls(&a), rounds_and_polls(&b));
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    const TASKS: u64 = 24;
    const BULK: u64 = 16 << 20;
    rt.block_on(async {
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
        .expect("streams stalled on the application's runtime");

        // What the scheduler sees: channels on queues, and (on a small host) none of them
        // on a runtime of the stack's own. Read between two placements that agree, so
        // that a rescue of a queue in between (a worker of the busy machine held off its
        // core for longer than netdriver's `STALL`) is not taken for a wrong snapshot.
        let p0 = a.diagnostics().channel_placement();
        let st = a.diagnostics().stats();
        let p1 = a.diagnostics().channel_placement();
        assert!(!st.channels.is_empty());
        assert!(st.channels.iter().all(|c| c.queue.is_some()), "{st:?}");
        if small
            && p0.rescues == p1.rescues
            && p1
                .runtime(&application())
                .is_some_and(|r| r.queues == [0, 1])
        {
            assert!(st.queues.is_empty(), "{p1}: {st:?}");
            assert!(st.channels.iter().all(|c| c.thread.is_none()), "{st:?}");
        }

        // One large transfer, verified byte by byte.
        let l = b.bind(at(7101)).await.unwrap();
        let rx = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            recv_pattern(&mut s, 4244).await
        });
        let mut c = a.connect(at(7101)).await.unwrap();
        timeout(LIMIT, async {
            send_pattern(&mut c, 4244, BULK).await;
            c.shutdown().await.unwrap();
            assert_eq!(rx.await.unwrap(), BULK);
        })
        .await
        .expect("large transfer stalled on the application's runtime");
    });
    let after = (rounds_and_polls(&a), rounds_and_polls(&b));
    for (name, before, after) in [("A", &before.0, &after.0), ("B", &before.1, &after.1)] {
        for (q, (rounds, polls)) in after {
            let (r0, p0) = before[q];
            assert!(
                *rounds > r0 && *polls > p0,
                "{name}: queue {q} did no work: rounds {r0} -> {rounds}, polls {p0} -> {polls}"
            );
        }
    }
    println!(
        "A: {} (rescues {}); B: {} (rescues {})",
        a.diagnostics().channel_placement(),
        a.diagnostics().channel_placement().rescues,
        b.diagnostics().channel_placement(),
        b.diagnostics().channel_placement().rescues
    );
    drop((a, b));
    drop(rt);
}

/// The default policy, except that every queue is driven by the application's runtime,
/// whatever the host: what a blocked application's runtime does to a stack is then the
/// same on every machine.
#[derive(Debug, Clone, Default)]
struct OnTheApplicationRuntime(netchannel::sched::RoundRobin);

impl netchannel::sched::NetScheduler for OnTheApplicationRuntime {
    fn pick_channel(
        &mut self,
        chunk: &netchannel::sched::ChunkInfo,
        channels: &[netchannel::sched::ChannelStats],
    ) -> Option<netchannel::sched::ChannelId> {
        self.0.pick_channel(chunk, channels)
    }

    fn fork(&self) -> Option<Box<dyn netchannel::sched::NetScheduler>> {
        Some(Box::new(self.clone()))
    }

    fn place_queues(
        &self,
        host: &netchannel::sched::QueueHost,
    ) -> Vec<netchannel::sched::QueuePlace> {
        vec![netchannel::sched::QueuePlace::Application; host.queues.len()]
    }
}

/// A task that blocks the application's runtime (one worker, `std::thread::sleep` for
/// 200 ms inside a task) does not stall the streams of a stack whose queues that runtime
/// drives: the set's watchdog moves each queue whose work waits longer than netdriver's
/// `STALL` to the stack's home runtime. B's queues are driven by such a runtime; the echo
/// task of B's stream runs on another (a task on the blocked worker itself could not run
/// either). A, on the test's runtime, measures 64-byte exchanges over the stream before,
/// during and after the block. The first exchange of the block waits for a rescue of the
/// queue its request arrives on, and its reply, when it leaves on the other queue, for
/// that queue's own rescue: each is `STALL` plus at most a watchdog tick, so every
/// exchange finishes within twice that and a margin, well below the block, and B's
/// placement counts the rescues. Once the runtime is free and `RETURN_AFTER` has passed,
/// the queues are driven by the application's runtime again, and the exchanges go on.
#[test]
fn a_blocked_application_runtime_does_not_stall_streams_over_af_xdp() {
    let _serial = one_at_a_time();
    use netchannel::netdriver::channel::placement::{RETURN_AFTER, STALL, WATCH_TICK};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const BLOCK: Duration = Duration::from_millis(200);
    // Time for the exchange itself beyond the rescues (two stacks in a debug build on a
    // shared 2-core machine).
    const MARGIN: Duration = Duration::from_millis(30);
    let bound = 2 * (STALL + WATCH_TICK) + MARGIN;
    // An exchange that waited for the block to end would take about the whole block.
    assert!(
        bound < BLOCK / 2,
        "the bound must tell a rescue from the block"
    );
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let rt = two_workers();
    let b_app = one_worker("b-app");
    let a = stack_in(&bed, Side::A, Drive::Application(rt.handle().clone()));
    let b = {
        let e = bed.side(Side::B).clone();
        let app = b_app.handle().clone();
        bed.run_in(Side::B, move || {
            Stack::builder()
                .interface(e.ifname)
                .ipv4(e.ipv4)
                .runtime(app)
                .scheduler(OnTheApplicationRuntime::default())
                .connect_timeout(Duration::from_secs(10))
                .build()
        })
        .expect("enter the namespace")
        .expect("stack B")
    };
    let on_app = |p: &ChannelPlacement| {
        p.runtime(&application())
            .is_some_and(|r| r.queues == [0, 1])
    };
    let p = b.diagnostics().channel_placement();
    assert!(on_app(&p), "B's queues on its application's runtime: {p}");
    let at = SocketAddr::from(SocketAddrV4::new(bed.side(Side::B).ipv4, 7130));
    rt.block_on(async {
        let l = b.bind(at).await.unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            echo_until_eof(&mut s).await
        });
        let mut c = timeout(LIMIT, a.connect(at)).await.unwrap().unwrap();
        let mut tag = 0u8;
        let mut timed = async |c: &mut VirtualStream| {
            tag = tag.wrapping_add(1);
            let t0 = Instant::now();
            timeout(LIMIT, small_exchange(c, tag))
                .await
                .expect("an exchange stalled");
            t0.elapsed()
        };
        // The stream runs, and B's queues are on the application's runtime again if the
        // busy machine held its worker off long enough for a rescue already.
        let deadline = Instant::now() + LIMIT;
        loop {
            timed(&mut c).await;
            if on_app(&b.diagnostics().channel_placement()) {
                break;
            }
            assert!(Instant::now() < deadline, "{}", b.diagnostics().channel_placement());
        }
        let rescues = b.diagnostics().channel_placement().rescues;

        // B's application blocks its only worker.
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let over = Arc::new(AtomicBool::new(false));
        let blocker = {
            let over = over.clone();
            b_app.spawn(async move {
                let _ = started_tx.send(Instant::now());
                std::thread::sleep(BLOCK);
                over.store(true, Ordering::SeqCst);
            })
        };
        let blocked_at = started.await.expect("the blocking task ran");
        let mut during = Vec::new();
        while !over.load(Ordering::SeqCst) {
            let started = blocked_at.elapsed();
            let took = timed(&mut c).await;
            during.push((started, took));
        }
        let p = b.diagnostics().channel_placement();
        println!(
            "exchanges during the block (start, time): {:?}; {p}; rescues {} -> {}",
            &during[..during.len().min(4)],
            rescues,
            p.rescues
        );
        // The first exchange started right after the block did: unrescued, it would have
        // waited for the whole block.
        assert!(!during.is_empty());
        for &(started, took) in &during {
            assert!(
                took < bound,
                "an exchange starting {started:?} into the block took {took:?} (bound {bound:?}): {p}"
            );
        }
        assert!(p.rescues > rescues, "no rescue counted: {p}");
        timeout(LIMIT, blocker).await.unwrap().unwrap();

        // Back on the application's runtime once it is free and `RETURN_AFTER` passed.
        let deadline = Instant::now() + RETURN_AFTER * 3 + LIMIT / 4;
        let mut after = 0u32;
        while !on_app(&b.diagnostics().channel_placement()) {
            timed(&mut c).await;
            after += 1;
            assert!(
                Instant::now() < deadline,
                "B's queues never went back: {}",
                b.diagnostics().channel_placement()
            );
        }
        let mut next = Vec::new();
        for _ in 0..20 {
            next.push(timed(&mut c).await);
        }
        println!(
            "back on the application's runtime after {after} more exchanges; the next took \
             {next:?}; {}",
            b.diagnostics().channel_placement()
        );
        c.shutdown().await.unwrap();
        let mut rest = Vec::new();
        timeout(LIMIT, c.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert!(rest.is_empty());
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
    drop((a, b));
    drop((rt, b_app));
}

/// What happens mid-transfer in [`transfer_through`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `Diagnostics::reset_channel` on each side in turn: the receiver at a third of the
    /// stream, the sender at two thirds.
    StackResets,
    /// From a third of the stream on, an outside sender (a raw IP socket in B's
    /// namespace) forges RSTs for one of the bulk sender's channels until one takes.
    WireRst,
    /// At a third of the stream, one of the receiver's NIC queues dies
    /// (`Diagnostics::kill_queue`: its driver stops as if it had crashed, on whatever runtime
    /// drove it): no FIN, no RST; the receiver loses that queue's channels at once, the
    /// sender notices by its short user timeout and keep-alive.
    KilledQueue,
}

/// Liveness for [`Fault::KilledQueue`]: the side whose peer's queue died learns of it only
/// by its own checks, so they are made short (the defaults take 15-30 s).
const SHORT_USER_TIMEOUT: Duration = Duration::from_secs(3);

/// A side's stack for `fault`, on the application's runtime `app`.
fn stack_for(bed: &TestBed, side: Side, fault: Fault, app: tokio::runtime::Handle) -> Stack {
    if fault != Fault::KilledQueue {
        return stack_in(bed, side, Drive::Application(app));
    }
    let e = bed.side(side);
    let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
    bed.run_in(side, move || {
        Stack::builder()
            .interface(ifname)
            .ipv4(ipv4)
            .runtime(app)
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

/// Channel faults on the bed: 4 channels carry one large stream
/// (`NETCHANNEL_VNS_XDP_BYTES`, default 100 MB) and 32 small ones echoed both ways, while
/// `fault` strikes a channel (or a queue's channels) mid-transfer. Both stacks drive their
/// queues on the application's runtime (the test's). Every byte arrives once, in order,
/// and the counters show what went again.
fn transfer_through(fault: Fault) {
    // `RUST_LOG=vns=debug` shows the losses and flow control when a run stalls.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let rt = two_workers();
    let a = stack_for(&bed, Side::A, fault, rt.handle().clone());
    let b = stack_for(&bed, Side::B, fault, rt.handle().clone());
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
    rt.block_on(async {
        let big_l = b.bind(at(7400)).await.unwrap();
        let small_l = b.bind_with_backlog(at(7401), SMALL as usize).await.unwrap();
        let mut c = timeout(LIMIT, a.connect(at(7400))).await.unwrap().unwrap();
        let (mut s, _) = timeout(LIMIT, big_l.accept()).await.unwrap().unwrap();
        assert_eq!(a.diagnostics().channel_count(), CHANNELS + 1);
        let resets_before = (
            a.diagnostics().channel_resets_received(),
            b.diagnostics().channel_resets_received(),
        );
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
        // `Fault::KilledQueue`: the killed queue and how many channels it carried, and
        // its rounds counted well after the kill (a poll in progress at the kill may
        // still count its own).
        let mut killed: Option<(u32, usize)> = None;
        let mut dead_rounds: Option<u64> = None;
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
                            assert!(b.diagnostics().reset_channel(1));
                            struck += 1;
                        } else if struck == 1 && off >= 2 * total / 3 {
                            assert!(a.diagnostics().reset_channel(2));
                            struck += 1;
                        }
                    }
                    // The first strike at a third of the stream, then every other
                    // throughput channel in turn, each an eighth of the stream later: the
                    // stream ends on the latency channel alone. Three or four channels
                    // struck make the receiver drop chunks with a reset channel after it
                    // ignored the sender's copies, which must not stall the stream (see
                    // `parked_chunks_stay_when_their_copies_came_first_on_another_channel`
                    // in crates/vns/tests/channel_loss.rs).
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
                    Fault::KilledQueue if struck == 0 && off >= total / 3 => {
                        let wire = b.diagnostics().channel_wire();
                        let q = wire[1].queue;
                        let on_q = wire.iter().filter(|w| w.queue == q).count();
                        assert!(b.diagnostics().kill_queue(q));
                        assert!(!b.diagnostics().kill_queue(q), "a queue dies once");
                        killed = Some((q, on_q));
                        struck += 1;
                    }
                    Fault::KilledQueue if dead_rounds.is_none() && off >= 2 * total / 3 => {
                        let (q, _) = killed.expect("killed at a third");
                        dead_rounds = b
                            .diagnostics()
                            .queue_stats()
                            .into_iter()
                            .find(|s| s.queue == q)
                            .map(|s| s.rounds);
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
                a.diagnostics().stats(),
                a.diagnostics().endpoint_counters(),
                b.diagnostics().endpoint_counters()
            )
        });
        assert_eq!(off, total);
        match fault {
            Fault::StackResets => assert_eq!(struck, 2),
            Fault::WireRst => assert_eq!(struck, CHANNELS as u64),
            Fault::KilledQueue => assert_eq!(struck, 1),
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
        let (ca, cb) = (
            a.diagnostics().endpoint_counters(),
            b.diagnostics().endpoint_counters(),
        );
        println!(
            "{fault:?}: resent {} + {} chunks, {} + {} duplicates dropped; channels now {} / {}; \
             RSTs received from the wire {} / {}",
            ca.resent_chunks,
            cb.resent_chunks,
            ca.duplicate_chunks,
            cb.duplicate_chunks,
            a.diagnostics().channel_count(),
            b.diagnostics().channel_count(),
            a.diagnostics().channel_resets_received() - resets_before.0,
            b.diagnostics().channel_resets_received() - resets_before.1,
        );
        match fault {
            Fault::StackResets => assert_eq!(a.diagnostics().channel_count(), CHANNELS + 1 - 2),
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
                assert_eq!(
                    a.diagnostics().channel_count(),
                    CHANNELS + 1 - struck as usize
                );
                assert!(
                    a.diagnostics().channel_resets_received() > resets_before.0,
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
                    b.diagnostics().channel_count()
                );
            }
            Fault::KilledQueue => {
                let (q, on_q) = killed.expect("a queue was killed");
                println!("queue {q} killed with {on_q} channel(s) on it");
                assert!(on_q > 0);
                assert_eq!(b.diagnostics().channel_count(), CHANNELS + 1 - on_q);
                // Nobody drives the dead queue, on any runtime: the placement lists it as
                // dead and its rounds stopped; the other queue carried the rest.
                let p = b.diagnostics().channel_placement();
                assert_eq!(p.dead, vec![q], "{p}");
                assert_eq!(p.place_of(q), None, "{p}");
                let rounds = b
                    .diagnostics()
                    .queue_stats()
                    .into_iter()
                    .find(|s| s.queue == q)
                    .map(|s| s.rounds);
                assert!(dead_rounds.is_some());
                assert_eq!(rounds, dead_rounds, "rounds of the dead queue");
                // The sender's halves of those channels see no answer: its user timeout
                // (data in flight) or keep-alive (idle) fails them.
                assert!(
                    timeout(LIMIT, a.channels_reach(CHANNELS + 1 - on_q))
                        .await
                        .is_ok(),
                    "the sender still holds {} channels",
                    a.diagnostics().channel_count()
                );
                // The queue died silently: no RST on the wire either way.
                assert_eq!(
                    (
                        a.diagnostics().channel_resets_received(),
                        b.diagnostics().channel_resets_received()
                    ),
                    resets_before
                );
            }
        }
        assert!(
            ca.resent_chunks + cb.resent_chunks > 0,
            "nothing went again"
        );
    });
    drop((a, b));
    drop(rt);
}

/// One channel reset by each side in turn through the fault layer
/// (`Diagnostics::reset_channel`: the resetting side aborts its TCP connection and the peer
/// receives a real RST from the wire); every byte arrives once, in order.
#[test]
fn channel_resets_mid_transfer_lose_nothing_over_af_xdp() {
    let _serial = one_at_a_time();
    transfer_through(Fault::StackResets);
}

/// A RST forged by an outside sender (a raw socket in the
/// receiver's namespace, aimed at one of the bulk sender's channels at its RCV.NXT) resets
/// a channel mid-transfer; every byte arrives once, in order.
#[test]
fn forged_rst_from_the_wire_mid_transfer_loses_nothing_over_af_xdp() {
    let _serial = one_at_a_time();
    transfer_through(Fault::WireRst);
}

/// One of the receiver's NIC queues dies mid-transfer while the application's runtime
/// drives it (fault injection: no FIN, no RST); the receiver loses that queue's channels
/// at once, the sender by its user timeout or keep-alive; nobody drives the dead queue
/// afterwards; every byte arrives once, in order.
#[test]
fn killed_queue_mid_transfer_loses_nothing_over_af_xdp() {
    let _serial = one_at_a_time();
    transfer_through(Fault::KilledQueue);
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
    let sample = || victim.diagnostics().channel_wire();
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
            .diagnostics()
            .channel_wire()
            .into_iter()
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

/// The stack carries out a user policy's plans while one large stream and 16 small echoed
/// ones move: channels go from 1 to 4 (opened over AF_XDP at run time, accepted by the
/// peer) and back to 1 (retired: drained, then closed). Every byte arrives once, in order,
/// and both stacks end with one channel. The planning stack drives its queues on runtimes
/// of its own, so that its snapshots place every channel on one; the peer runs on the
/// application's runtime.
#[test]
fn plans_scale_channels_1_to_4_to_1_over_af_xdp() {
    let _serial = one_at_a_time();
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let target = Arc::new(AtomicUsize::new(1));
    let rt = two_workers();
    let build = |side: Side, policy: Option<FollowTarget>, drive: Drive| {
        let e = bed.side(side);
        let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
        bed.run_in(side, move || {
            let b = drive.apply(
                Stack::builder()
                    .interface(ifname)
                    .ipv4(ipv4)
                    .channels(1)
                    .latency_channels(0)
                    .connect_timeout(Duration::from_secs(10)),
            );
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
        Drive::Own,
    );
    let b = build(Side::B, None, Drive::Application(rt.handle().clone()));
    let b_ip = bed.side(Side::B).ipv4;
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    let total: u64 = std::env::var("NETCHANNEL_VNS_XDP_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000_000)
        / 2;
    const SMALL: u32 = 16;
    rt.block_on(async {
        let big_l = b.bind(at(7500)).await.unwrap();
        let small_l = b.bind_with_backlog(at(7501), SMALL as usize).await.unwrap();
        let mut c = timeout(LIMIT, a.connect(at(7500))).await.unwrap().unwrap();
        let (mut s, _) = timeout(LIMIT, big_l.accept()).await.unwrap().unwrap();
        assert_eq!(a.diagnostics().channel_count(), 1);
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
                } else if phase == 1 && a.diagnostics().channel_count() == 4 {
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
        let pc = a.diagnostics().plan_counters();
        println!(
            "scaling over AF_XDP: phase {phase} during the transfer; {pc:?}; resent {} + {} chunks",
            a.diagnostics().endpoint_counters().resent_chunks,
            b.diagnostics().endpoint_counters().resent_chunks
        );
        assert!(
            pc.opened >= 3 && pc.retired >= 3 && pc.closed >= 3,
            "{pc:?}"
        );
        assert_eq!(pc.open_failed, 0, "{pc:?}");
        // What the plans saw: the stack's queue runtimes with their utilisation measured
        // over a plan period, every queue on one of them, and each channel on its queue's
        // runtime.
        let stats = a.diagnostics().stats();
        let placement = a.diagnostics().channel_placement();
        let runtimes: std::collections::BTreeSet<_> = own_runtimes(&placement)
            .into_iter()
            .map(netchannel::sched::ChannelThreadId)
            .collect();
        let threads: std::collections::BTreeSet<_> = stats.threads.iter().map(|t| t.id).collect();
        assert_eq!(threads, runtimes, "{placement}: {stats:?}");
        assert!(stats
            .threads
            .iter()
            .all(|t| !t.window.is_zero() && t.busy <= t.window));
        let mut queues: Vec<u32> = stats.queues.iter().map(|q| q.queue).collect();
        queues.sort_unstable();
        assert_eq!(queues, vec![0, 1], "{stats:?}");
        assert!(stats.queues.iter().all(|q| threads.contains(&q.thread)));
        for c in &stats.channels {
            let on = stats.queues.iter().find(|q| Some(q.queue) == c.queue);
            assert!(
                on.is_some_and(|q| c.thread == Some(q.thread)),
                "channel {:?} not on its queue's runtime: {stats:?}",
                c.id
            );
        }
    });
    drop((a, b));
    drop(rt);
}

/// A stack in `side`'s namespace under `Isolating`: 2 throughput channels and 1 latency
/// channel per peer (the latency channels on the last queue, the others on the first),
/// its queues driven as `drive` says, and the latency queue on `latency` when given.
fn isolating_stack(
    bed: &TestBed,
    side: Side,
    drive: Drive,
    latency: Option<tokio::runtime::Handle>,
) -> Stack {
    let e = bed.side(side);
    let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
    bed.run_in(side, move || {
        let mut b = drive.apply(
            Stack::builder()
                .interface(ifname)
                .ipv4(ipv4)
                .channels(2)
                .latency_channels(1)
                .scheduler(netchannel::sched::Isolating::default())
                .connect_timeout(Duration::from_secs(10)),
        );
        if let Some(h) = latency {
            b = b.latency_runtime(h);
        }
        b.build()
    })
    .expect("enter the namespace")
    .expect("stack")
}

/// Bulk streams of the isolation tests, and their bytes each.
const ISOLATION_BULK_STREAMS: u64 = 4;
const ISOLATION_BULK: u64 = 20_000_000;
/// The latency stream's exchanges and their size.
const ISOLATION_PINGS: usize = 200;
const ISOLATION_MSG: usize = 4096;

/// The isolation tests' load, from A to B at ports 7600 (bulk) and 7601 (latency): 4 bulk
/// streams of 20 MB, verified by B, spawned on the current runtime; and at the same time a
/// latency-class stream whose 200 exchanges of 4 KB are echoed by B and verified by A,
/// both ends spawned on `latency_app` (the current runtime when `None`). Returns once
/// every byte arrived.
async fn isolation_load(a: &Stack, b: &Stack, latency_app: Option<tokio::runtime::Handle>) {
    use netchannel::AppClass;
    let b_ip = b.ipv4();
    let at = move |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));
    let latency_app = latency_app.unwrap_or_else(tokio::runtime::Handle::current);
    let bulk_l = b.bind(at(7600)).await.unwrap();
    let lat_l = b.bind(at(7601)).await.unwrap();
    let sink = tokio::spawn(async move {
        let mut readers = Vec::new();
        for _ in 0..ISOLATION_BULK_STREAMS {
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
    let echo = latency_app.spawn(async move {
        let (mut s, _) = lat_l.accept().await.unwrap();
        // B accepts A's channels one by one: the latency one may join after this socket's
        // SYNC came in on a throughput one (until then there is no channel of the class,
        // `AddrNotAvailable`). All three (2 + 1) are there first.
        timeout(LIMIT, b2.channels_reach(3))
            .await
            .expect("B never got its latency channel");
        s.set_app_class(AppClass::Latency).unwrap();
        let mut buf = vec![0u8; ISOLATION_MSG];
        for _ in 0..ISOLATION_PINGS {
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
        }
    });
    let a2 = a.clone();
    let pings = latency_app.spawn(async move {
        let mut lat = timeout(LIMIT, a2.connect(at(7601))).await.unwrap().unwrap();
        lat.set_app_class(AppClass::Latency).unwrap();
        let mut msg = vec![0u8; ISOLATION_MSG];
        let mut back = vec![0u8; ISOLATION_MSG];
        for k in 0..ISOLATION_PINGS {
            fill(900, (k * ISOLATION_MSG) as u64, &mut msg);
            lat.write_all(&msg).await.unwrap();
            lat.read_exact(&mut back).await.unwrap();
            assert!(back == msg, "echo {k}");
        }
    });
    let senders: Vec<_> = (0..ISOLATION_BULK_STREAMS)
        .map(|i| {
            let a = a.clone();
            tokio::spawn(async move {
                let mut c = a.connect(at(7600)).await.unwrap();
                c.write_u64(i).await.unwrap();
                send_pattern(&mut c, 300 + i, ISOLATION_BULK).await;
                c.shutdown().await.unwrap();
            })
        })
        .collect();
    timeout(LIMIT, pings)
        .await
        .expect("the latency stream stalled")
        .unwrap();
    for s in senders {
        timeout(LIMIT, s).await.unwrap().unwrap();
    }
    assert_eq!(
        timeout(LIMIT, sink).await.unwrap().unwrap(),
        ISOLATION_BULK_STREAMS * ISOLATION_BULK
    );
    timeout(LIMIT, echo).await.unwrap().unwrap();
}

/// After [`isolation_load`]: `stack`'s latency channels are on its last queue and its
/// throughput channels on the others; the latency channels carried the latency stream's
/// bytes and no bulk bytes. Returns the bytes the latency and the throughput channels
/// sent.
fn classes_kept_apart(name: &str, stack: &Stack) -> (u64, u64) {
    use netchannel::sched::ChannelClass;
    let st = stack.diagnostics().stats();
    let latency_queue = *stack.diagnostics().channel_set().queues().last().unwrap();
    let of = |class| st.channels.iter().filter(move |c| c.class == class);
    assert!(
        of(ChannelClass::Latency).count() == 1 && of(ChannelClass::Throughput).count() == 2,
        "{name}: {st:?}"
    );
    assert!(
        of(ChannelClass::Latency).all(|c| c.queue == Some(latency_queue)),
        "{name}: a latency channel off the latency queue {latency_queue}: {st:?}"
    );
    assert!(
        of(ChannelClass::Throughput).all(|c| c.queue.is_some_and(|q| q != latency_queue)),
        "{name}: a throughput channel on the latency queue {latency_queue}: {st:?}"
    );
    let lat_sent: u64 = of(ChannelClass::Latency).map(|c| c.sent_bytes).sum();
    let bulk_sent: u64 = of(ChannelClass::Throughput).map(|c| c.sent_bytes).sum();
    let pings = (ISOLATION_PINGS * ISOLATION_MSG) as u64;
    assert!(
        lat_sent >= pings,
        "{name}: latency channels sent {lat_sent}"
    );
    assert!(
        lat_sent < 2 * pings + (1 << 20),
        "{name}: bulk bytes on the latency channel: {lat_sent}"
    );
    (lat_sent, bulk_sent)
}

/// Isolation with queue runtimes of the stacks' own: with `Isolating` on both stacks (2
/// queues), the latency channel opens on the last queue, driven by a queue runtime of its
/// own, the policy's plans pin that runtime and the bulk one to different cores, and while
/// 4 bulk streams saturate the throughput channels a latency-class stream's exchanges go on
/// the latency channel only: it never carries bulk bytes, and no runtime drives channels
/// of both classes.
#[test]
fn isolating_keeps_latency_streams_off_bulk_channels_runtimes_and_cores() {
    let _serial = one_at_a_time();
    use netchannel::sched::ChannelClass;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let rt = two_workers();
    let a = isolating_stack(&bed, Side::A, Drive::Own, None);
    let b = isolating_stack(&bed, Side::B, Drive::Own, None);
    for (name, stack) in [("A", &a), ("B", &b)] {
        let p = stack.diagnostics().channel_placement();
        let (bulk, lat) = (p.place_of(0), p.place_of(1));
        assert!(
            matches!(bulk, Some(DriverPlace::Runtime(_)))
                && matches!(lat, Some(DriverPlace::Runtime(_)))
                && bulk != lat,
            "{name}: the latency queue on a runtime of its own: {p}"
        );
    }
    rt.block_on(async {
        isolation_load(&a, &b, None).await;
        // The plans pinned the latency runtime and the bulk one (a plan period after the
        // channels were there, long before now; two more plans to be sure).
        let asked = a.diagnostics().plan_counters().plans;
        timeout(LIMIT, a.plans_reach(asked + 2))
            .await
            .expect("no more plans were asked for");
    });
    assert!(
        a.diagnostics().plan_counters().pinned >= 2,
        "runtimes not pinned apart: {:?}",
        a.diagnostics().plan_counters()
    );
    for (name, stack) in [("A", &a), ("B", &b)] {
        let st = stack.diagnostics().stats();
        let runtimes_of = |class| -> std::collections::BTreeSet<_> {
            st.channels
                .iter()
                .filter(|c| c.class == class)
                .map(|c| {
                    c.thread
                        .expect("the stack's own runtimes drive every queue")
                })
                .collect()
        };
        let (lat_t, bulk_t) = (
            runtimes_of(ChannelClass::Latency),
            runtimes_of(ChannelClass::Throughput),
        );
        assert!(!lat_t.is_empty() && !bulk_t.is_empty(), "{name}: {st:?}");
        assert!(
            lat_t.is_disjoint(&bulk_t),
            "{name}: a runtime drives both classes: {st:?}"
        );
        let (lat_sent, bulk_sent) = classes_kept_apart(name, stack);
        println!(
            "{name}: latency channels sent {lat_sent} B on runtimes {lat_t:?}, throughput \
             channels {bulk_sent} B on {bulk_t:?}; {}",
            stack.diagnostics().channel_placement()
        );
    }
    let st = a.diagnostics().stats();
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
    drop((a, b));
    drop(rt);
}

/// Isolation with a latency application's runtime: under `Isolating` with
/// `StackBuilder::latency_runtime`, both stacks drive their latency queue (the last one,
/// where latency channels open) on the latency application's runtime, and the other queue
/// where the default puts it (the application's runtime on a small host). While 4 bulk
/// streams on the application's runtime saturate the throughput channels, a latency-class
/// stream on the latency runtime exchanges 4 KB messages: every byte is exact, the latency
/// channels carry the latency stream's bytes and no bulk bytes, and the latency queue's
/// driver ran its rounds there.
#[test]
fn a_latency_runtime_drives_the_latency_queue_over_af_xdp() {
    let _serial = one_at_a_time();
    use netchannel::sched::ChannelClass;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let rt = two_workers();
    let lat_rt = one_worker("lat-app");
    let app = || Drive::Application(rt.handle().clone());
    let a = isolating_stack(&bed, Side::A, app(), Some(lat_rt.handle().clone()));
    let b = isolating_stack(&bed, Side::B, app(), Some(lat_rt.handle().clone()));
    let mut before = Vec::new();
    for (name, stack) in [("A", &a), ("B", &b)] {
        let p = stack.diagnostics().channel_placement();
        assert_eq!(p.place_of(1), Some(latency()), "{name}: {p}");
        if small_host() {
            assert_eq!(p.place_of(0), Some(application()), "{name}: {p}");
        } else {
            assert!(
                matches!(p.place_of(0), Some(DriverPlace::Runtime(_))),
                "{name}: {p}"
            );
        }
        assert_eq!(
            p.runtime(&latency()).map(|r| r.queues.clone()),
            Some(vec![1]),
            "{name}: the latency runtime drives the latency queue only: {p}"
        );
        before.push(rounds_and_polls(stack));
    }
    rt.block_on(isolation_load(&a, &b, Some(lat_rt.handle().clone())));
    for ((name, stack), before) in [("A", &a), ("B", &b)].into_iter().zip(before) {
        let (lat_sent, bulk_sent) = classes_kept_apart(name, stack);
        let st = stack.diagnostics().stats();
        // Queues driven by runtimes handed to the stack are on no runtime of its own.
        assert!(
            st.channels
                .iter()
                .filter(|c| c.class == ChannelClass::Latency)
                .all(|c| c.thread.is_none()),
            "{name}: {st:?}"
        );
        let p = stack.diagnostics().channel_placement();
        let after = rounds_and_polls(stack);
        assert!(
            after[&1].0 > before[&1].0,
            "{name}: the latency queue ran no rounds: {before:?} -> {after:?}"
        );
        // Still there, unless the watchdog found the latency runtime's worker too busy
        // for a moment (then the queue is on the home runtime until it goes back).
        assert!(
            p.place_of(1) == Some(latency()) || p.rescues > 0,
            "{name}: {p}"
        );
        println!(
            "{name}: latency channels sent {lat_sent} B, throughput channels {bulk_sent} B; \
             {p}; rescues {}",
            p.rescues
        );
    }
    drop((a, b));
    drop((rt, lat_rt));
}

/// The shipped `Scaler`, end to end over AF_XDP: stack A runs `Scaled<RoundRobin>` with
/// plans carried out, starting with one channel to B, its queues on runtimes of its own
/// (the scaler reads their utilisation). A bulk stream from A to B keeps A's queue runtime
/// busy above the scale-up threshold, so the scaler opens a second channel; once the stream ends and the channels idle through the
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
    let rt = two_workers();
    let build = |side: Side, scaled: bool| {
        let e = bed.side(side);
        let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
        let drive = if scaled {
            Drive::Own
        } else {
            Drive::Application(rt.handle().clone())
        };
        bed.run_in(side, move || {
            let b = drive.apply(
                Stack::builder()
                    .interface(ifname)
                    .ipv4(ipv4)
                    .channels(1)
                    .latency_channels(0)
                    .connect_timeout(Duration::from_secs(10)),
            );
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
    rt.block_on(async {
        let l = b.bind(to).await.unwrap();
        let mut c = timeout(LIMIT, a.connect(to)).await.unwrap().unwrap();
        let (mut s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
        assert_eq!(a.diagnostics().channel_count(), 1);
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
        let plans = a.diagnostics().plan_counters();
        // The stream goes on over both channels for a while before it ends.
        let at_growth = *progress.borrow();
        timeout(LIMIT, progress.wait_for(|&sent| sent >= at_growth + (32 << 20)))
            .await
            .expect("the stream went on")
            .expect("the sender is running");
        let carried: Vec<u64> = a.diagnostics().stats().channels.iter().map(|c| c.sent_bytes).collect();
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
        assert_eq!(a.diagnostics().channel_count(), 1);
        println!(
            "scaler: 1 -> 2 -> 1 channels while {} MB went through; plans at growth {plans:?}, at the end {:?}",
            sent >> 20,
            a.diagnostics().plan_counters()
        );
    });
    a.abort();
    b.abort();
    drop(rt);
}

/// A user's policy for the runtime-placement test: round robin, and by `phase`: 1, a queue
/// runtime on the last core the stack may use, driving every queue; 2, that runtime
/// retired.
#[derive(Debug)]
struct RuntimeShaper {
    phase: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    next: usize,
}

impl netchannel::sched::NetScheduler for RuntimeShaper {
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

/// Runtime placement by plans on the bed: while one virtual stream carries data both
/// ways, a plan spawns a queue runtime pinned to a core, moves both NIC queues (and with
/// them every channel) onto it, and later retires it (the queues go back to the runtime
/// the stack started with). Every byte arrives once and in order both ways, the queues'
/// rounds went on while the new runtime drove them, the plans' counters and the snapshots
/// show each step, and no channel was lost. The planning stack drives its queues on
/// runtimes of its own; the peer on the application's runtime.
#[test]
fn plans_spawn_move_and_retire_queue_runtimes_under_load_over_af_xdp() {
    let _serial = one_at_a_time();
    use netchannel::sched::ChannelThreadId;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let rt = two_workers();
    let phase = Arc::new(AtomicUsize::new(0));
    let a = {
        let e = bed.side(Side::A);
        let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
        let policy = RuntimeShaper {
            phase: phase.clone(),
            next: 0,
        };
        bed.run_in(Side::A, move || {
            Stack::builder()
                .interface(ifname)
                .ipv4(ipv4)
                .channels(CHANNELS)
                .application_runtime(false)
                .connect_timeout(Duration::from_secs(10))
                .scheduler(policy)
                .build()
        })
        .expect("enter the namespace")
        .expect("stack")
    };
    let b = stack_in(&bed, Side::B, Drive::Application(rt.handle().clone()));
    let b_ip = bed.side(Side::B).ipv4;
    let at = SocketAddr::from(SocketAddrV4::new(b_ip, 7600));
    let total: u64 = std::env::var("NETCHANNEL_VNS_XDP_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000_000)
        / 2;
    // The runtimes the stack started with, and the placement after each change.
    let before = a.diagnostics().channel_placement();
    let first = own_runtimes(&before);
    assert!(
        !first.is_empty() && before.runtimes.len() == first.len(),
        "queue runtimes of the stack's own only: {before}"
    );
    // The runtime the plan spawned, if it is there and drives both queues.
    let spawned_driving_all = |a: &Stack| {
        let p = a.diagnostics().channel_placement();
        p.runtimes
            .iter()
            .find(|r| {
                matches!(r.place, DriverPlace::Runtime(id) if !first.contains(&id))
                    && r.queues.len() == 2
            })
            .and_then(|r| match r.place {
                DriverPlace::Runtime(id) => Some(id),
                DriverPlace::External(_) => None,
            })
    };
    rt.block_on(async {
        let l = b.bind(at).await.unwrap();
        let c = timeout(LIMIT, a.connect(at)).await.unwrap().unwrap();
        let (s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
        let channels = a.diagnostics().channel_count();
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
        let mut rounds_at_move = None;
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
                        // The spawned runtime drove both queues meanwhile, and their
                        // rounds went on.
                        let t = spawned.expect("moved");
                        let now = a.diagnostics().queue_stats();
                        assert!(
                            now.iter().all(|q| q.place == DriverPlace::Runtime(t)),
                            "{now:?}"
                        );
                        let rounds: Vec<u64> = now.iter().map(|q| q.rounds).collect();
                        let at_move: &Vec<u64> = rounds_at_move.as_ref().expect("moved");
                        assert!(
                            rounds.iter().zip(at_move).all(|(r, m)| r > m),
                            "rounds at the move {at_move:?}, now {rounds:?}"
                        );
                        phase.store(2, Ordering::Relaxed);
                    }
                    1 if moved_at.is_none() => {
                        if let Some(t) = spawned_driving_all(&a) {
                            // What the scheduler sees: every queue and channel on the new
                            // runtime.
                            let stats = a.diagnostics().stats();
                            let id = ChannelThreadId(t);
                            assert!(stats.queues.iter().all(|q| q.thread == id), "{stats:?}");
                            assert!(
                                stats.channels.iter().all(|c| c.thread == Some(id)),
                                "{stats:?}"
                            );
                            rounds_at_move = Some(
                                a.diagnostics()
                                    .queue_stats()
                                    .iter()
                                    .map(|q| q.rounds)
                                    .collect(),
                            );
                            spawned = Some(t);
                            moved_at = Some(off);
                        }
                    }
                    2 if retired_at.is_none() => {
                        let p = a.diagnostics().channel_placement();
                        if spawned.is_some_and(|t| p.runtime(&DriverPlace::Runtime(t)).is_none()) {
                            retired_at = Some(off);
                        }
                    }
                    _ => {}
                }
            }
        })
        .await
        .expect("A to B stalled while runtimes moved");
        assert_eq!(off, total);
        timeout(LIMIT, forth).await.unwrap().unwrap();
        timeout(LIMIT, back).await.unwrap().unwrap();
        assert_eq!(timeout(LIMIT, back_rx).await.unwrap().unwrap(), total);
        let pc = a.diagnostics().plan_counters();
        println!(
            "runtime placement over AF_XDP: queues moved at {moved_at:?}, runtime retired at \
             {retired_at:?} of {total} bytes; {pc:?}; placement now {}",
            a.diagnostics().channel_placement()
        );
        // Both happened while data was flowing.
        assert!(moved_at.is_some_and(|m| m < total), "{moved_at:?}");
        assert!(retired_at.is_some_and(|r| r < total), "{retired_at:?}");
        assert_eq!(pc.threads_spawned, 1, "{pc:?}");
        assert_eq!(pc.queues_moved, 2, "{pc:?}");
        assert_eq!(pc.threads_retired, 1, "{pc:?}");
        assert_eq!(pc.refused, 0, "{pc:?}");
        // No channel was lost on the way, and the placement is back to the runtimes the
        // stack started with driving the queues, as the snapshot (serialisable) shows.
        assert_eq!(a.diagnostics().channel_count(), channels);
        assert_eq!(a.diagnostics().channel_resets_received(), 0);
        let after = a.diagnostics().channel_placement();
        assert_eq!(own_runtimes(&after), first, "{after}");
        let stats = a.diagnostics().stats();
        let threads: std::collections::BTreeSet<_> = stats.threads.iter().map(|t| t.id).collect();
        let started: std::collections::BTreeSet<_> =
            first.iter().copied().map(ChannelThreadId).collect();
        assert_eq!(threads, started, "{stats:?}");
        assert_eq!(stats.queues.len(), 2, "{stats:?}");
        assert!(stats.queues.iter().all(|q| threads.contains(&q.thread)));
        let json = serde_json::to_string(&stats).unwrap();
        let back: netchannel::sched::StackSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back.queues, stats.queues);
    });
    drop((a, b));
    drop(rt);
}

/// The shipped `Scaler` placing queue runtimes (`Scaled::placing_threads`), end to end over
/// AF_XDP: A's stack starts with one queue runtime of its own driving both NIC queues. A
/// bulk stream keeps that runtime busy above the threshold, so the scaler spawns a runtime
/// on a core no runtime is pinned to and hands it the second queue. The stream's bytes all
/// arrive once, in order, across the move; the placement and the plan counters show the
/// spawn and the move.
#[test]
fn the_scaler_gives_a_crowded_runtimes_second_queue_a_runtime_of_its_own_over_af_xdp() {
    let _serial = one_at_a_time();
    use netchannel::sched::{RoundRobin, Scaled, ScalingConfig};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let rt = two_workers();
    let e = bed.side(Side::A).clone();
    let a = bed
        .run_in(Side::A, move || {
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
                .interface(e.ifname.clone())
                .ipv4(e.ipv4)
                .channels(2)
                .latency_channels(0)
                .application_runtime(false)
                .connect_timeout(Duration::from_secs(10))
                .scheduler(policy)
                .execute_plans(true)
                .build()
        })
        .expect("enter the namespace")
        .expect("stack A");
    // One runtime for both queues, whatever the host gave the stack: every queue on the
    // home runtime, the others removed.
    let set = a.diagnostics().channel_set();
    let home = DriverPlace::Runtime(0);
    for q in set.queues() {
        set.move_queue(q, home.clone())
            .expect("move to the home runtime");
    }
    for id in own_runtimes(&set.placement()) {
        if id != 0 {
            set.remove_runtime(id).expect("remove a runtime");
        }
    }
    let p = set.placement();
    assert_eq!(own_runtimes(&p), vec![0], "{p}");
    assert_eq!(
        (p.place_of(0), p.place_of(1)),
        (Some(home.clone()), Some(home.clone())),
        "both queues on one runtime: {p}"
    );
    let b = stack_in(&bed, Side::B, Drive::Application(rt.handle().clone()));
    let to = SocketAddr::from(SocketAddrV4::new(bed.side(Side::B).ipv4, 7700));
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
            while a.diagnostics().plan_counters().queues_moved == 0 {
                let next = a.diagnostics().plan_counters().plans + 1;
                a.plans_reach(next).await;
            }
        })
        .await
        .expect("the scaler moved a queue off the crowded runtime");
        let p = a.diagnostics().channel_placement();
        let (r0, r1) = (p.place_of(0), p.place_of(1));
        assert_eq!(r0, Some(home.clone()), "queue 0 stays: {p}");
        assert!(
            matches!(r1, Some(DriverPlace::Runtime(id)) if id != 0),
            "queue 1 on a runtime of its own: {p}"
        );
        let spawned = p.runtime(&r1.unwrap()).expect("queue 1's runtime");
        assert!(
            spawned.core.is_some() && spawned.queues == vec![1] && p.dead.is_empty(),
            "the new runtime is pinned and drives queue 1: {p}"
        );
        let plans = a.diagnostics().plan_counters();
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
    a.abort();
    b.abort();
    drop(rt);
}
