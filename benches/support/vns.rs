//! Virtual-socket measurements on the two-namespace test bed, shared by
//! `benches/vns_goodput.rs` and `benches/vns_latency.rs` (which include this file as a
//! module next to `support/bed.rs`):
//!
//! - [`StackPair`]: a `netchannel::Stack` on vA and one on vB, each over its own
//!   `ChannelSet` (kept reachable, so that a raw channel between the same two sets can
//!   be measured beside the virtual sockets that share them);
//! - [`KernelPair`]: kernel TCP sockets made inside the namespaces and driven by tokio
//!   (`tokio::net::TcpStream`), over the same veth;
//! - [`Samples`]: sorted latency samples and their percentiles;
//! - bulk transfers and their figures, shared by `benches/vns_goodput.rs` and the main
//!   job (`examples/demo.rs`, which includes this file too): [`StackBench`] (a stack
//!   pair with sinks for raw channels, one transfer per call), [`vns_transfer`],
//!   [`kernel_transfer`], [`Phase`] (per-round rates, spread and ratios).
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use netchannel::netdriver::channel::{ChannelSet, ChannelSetConfig, DriverPlace};
use netchannel::{Stack, VirtualListener};
use testbed::{Side, TestBed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

use super::bed::{self, ChannelSink};

/// The port of B's virtual listener.
pub const VNS_PORT: u16 = 7100;
/// The port B's channel set listens on for raw channels (besides the stack's 9000).
pub const RAW_CHANNEL_PORT: u16 = 9100;
/// The port of B's kernel TCP listener.
pub const KERNEL_PORT: u16 = 7200;

/// Waits (at most 15 s) until no XDP program is attached to `ifname` in the calling
/// thread's namespace. A stack dropped with bytes undelivered drains them in the
/// background for up to its linger time (`StackBuilder::linger`, 5 s by default) and keeps
/// its steering program until then; a stack started on the same interface meanwhile would
/// find the program busy.
pub fn wait_for_previous_stack(ifname: &str) {
    let end = std::time::Instant::now() + Duration::from_secs(15);
    while matches!(xdp_prog::attached_program(ifname), Ok(Some(_)))
        && std::time::Instant::now() < end
    {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether the binary runs as a benchmark (`cargo bench` passes `--bench`); otherwise
/// `cargo test --all-targets` runs it as a smoke test with small defaults.
pub fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// The test bed (2 queues, or `NETCHANNEL_BENCH_QUEUES`: on a machine with cores to
/// spare, more queues give more queue drivers) and a tokio runtime with 2 workers
/// (`NETCHANNEL_BENCH_WORKERS`) for bench `name`, or `None` after printing why the bench
/// skips (no root, no namespaces).
pub fn bed_and_runtime(name: &str) -> Option<(TestBed, Runtime)> {
    // Diagnostics on request only (`RUST_LOG=netdriver::tcp::connection::timers=trace`,
    // say): logging costs time the figures would show.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let bed = match TestBed::builder().queues(bed_queues()).build() {
        Ok(bed) => bed,
        Err(e) => {
            println!("skipping {name}: {e}");
            return None;
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_or("NETCHANNEL_BENCH_WORKERS", 2usize).max(1))
        .enable_all()
        .build()
        .expect("runtime");
    set_app_runtime(Some(rt.handle().clone()));
    Some((bed, rt))
}

/// The benches' application runtime, which the stacks they start may drive their queues
/// on (`StackBuilder::runtime`): set by [`bed_and_runtime`].
static APP_RUNTIME: Mutex<Option<tokio::runtime::Handle>> = Mutex::new(None);

/// Sets (or clears) the runtime the stacks started from now on take as the application's.
pub fn set_app_runtime(h: Option<tokio::runtime::Handle>) {
    *APP_RUNTIME.lock().unwrap() = h;
}

/// Where the benches' stacks drive their queues: `NETCHANNEL_BENCH_PLACEMENT=own` keeps
/// them on queue runtimes of their own; anything else (the default, `auto`) lets the
/// scheduler choose, the benches' runtime being the application's.
pub fn placed(builder: netchannel::StackBuilder) -> netchannel::StackBuilder {
    if std::env::var("NETCHANNEL_BENCH_PLACEMENT").as_deref() == Ok("own") {
        return builder.application_runtime(false);
    }
    match APP_RUNTIME.lock().unwrap().clone() {
        Some(h) => builder.runtime(h),
        None => builder,
    }
}

/// Kernel TCP in B: a listener on [`KERNEL_PORT`] whose every connection (`TCP_NODELAY`)
/// is served by `serve` in its own task on `rt`. Returns the listener's address.
pub fn kernel_server<F, Fut>(bed: &TestBed, rt: &Runtime, serve: F) -> SocketAddrV4
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    kernel_server_at(bed, rt, KERNEL_PORT, serve)
}

/// [`kernel_server`] on `port`, for a second kernel server in B (another application's,
/// on its own runtime).
pub fn kernel_server_at<F, Fut>(bed: &TestBed, rt: &Runtime, port: u16, serve: F) -> SocketAddrV4
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let kl = {
        let _g = rt.enter();
        tokio::net::TcpListener::from_std(kernel_listener(bed, port)).expect("tokio listener")
    };
    let addr = match kl.local_addr().expect("addr") {
        SocketAddr::V4(v4) => v4,
        SocketAddr::V6(_) => unreachable!("IPv4 listener"),
    };
    rt.spawn(async move {
        while let Ok((s, _)) = kl.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(serve(s));
        }
    });
    addr
}

/// A kernel TCP connection from A to `to` (`TCP_NODELAY`), registered with `rt`.
pub fn kernel_stream(bed: &TestBed, rt: &Runtime, to: SocketAddrV4) -> tokio::net::TcpStream {
    let s = kernel_connect(bed, to);
    s.set_nodelay(true).expect("nodelay");
    let _g = rt.enter();
    tokio::net::TcpStream::from_std(s).expect("tokio stream")
}

/// The test bed's queue count: `NETCHANNEL_BENCH_QUEUES`, default 2.
pub fn bed_queues() -> u32 {
    env_or("NETCHANNEL_BENCH_QUEUES", 2u32).max(1)
}

/// Busy polling for the benches' stacks, from the environment (off unless
/// `NETCHANNEL_BENCH_BUSY_POLL_US` is set and non-zero): the queue runtimes of side A are
/// pinned to `NETCHANNEL_BENCH_CORES_A` and those of B to `NETCHANNEL_BENCH_CORES_B`
/// (comma-separated core ids), and spin that many µs after their last activity. Only for
/// machines with cores to spare.
fn bench_busy_poll(side: Side, builder: netchannel::StackBuilder) -> netchannel::StackBuilder {
    let spin: u64 = env_or("NETCHANNEL_BENCH_BUSY_POLL_US", 0u64);
    let var = match side {
        Side::A => "NETCHANNEL_BENCH_CORES_A",
        Side::B => "NETCHANNEL_BENCH_CORES_B",
    };
    let cores: Vec<usize> = std::env::var(var)
        .unwrap_or_default()
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    if spin > 0 && !cores.is_empty() {
        return builder.busy_poll(cores, Duration::from_micros(spin));
    }
    builder
}

/// A number from the environment, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Moves every queue of `stack` to a queue runtime of its own (queue *i* on runtime *i*,
/// started as needed); returns where each queue was.
fn own_runtimes(stack: &Stack) -> Vec<(u32, DriverPlace)> {
    let set = stack.diagnostics().channel_set();
    let before = set.placement();
    let mut was = Vec::new();
    for (i, q) in set.queues().into_iter().enumerate() {
        let place = DriverPlace::Runtime(i as u32);
        if before.runtime(&place).is_none() {
            set.add_runtime(None).expect("a queue runtime");
        }
        if let Some(p) = before.place_of(q) {
            was.push((q, p));
        }
        set.move_queue(q, place).expect("move to an own runtime");
    }
    was
}

/// The virtual-socket configuration of the benches: the defaults, with
/// `NETCHANNEL_BENCH_{SEND,RECV,CREDIT,THRESHOLD}_KIB` overriding the send buffer, the
/// receive buffer, the credit window and the credit update threshold (for experiments).
pub fn vns_config() -> netchannel::vns::Config {
    let mut c = netchannel::vns::Config::default();
    let kib = |name: &str, v: usize| env_or(name, v >> 10) << 10;
    c.send_buffer = kib("NETCHANNEL_BENCH_SEND_KIB", c.send_buffer);
    c.recv_buffer = kib("NETCHANNEL_BENCH_RECV_KIB", c.recv_buffer);
    c.credit_window = kib("NETCHANNEL_BENCH_CREDIT_KIB", c.credit_window);
    c.credit_update_threshold = kib("NETCHANNEL_BENCH_THRESHOLD_KIB", c.credit_update_threshold);
    c
}

/// Two stacks, A (client side) and B (server side), each over a channel set on its veth
/// end (both queues).
pub struct StackPair {
    /// The stack on vA.
    pub a: Stack,
    /// The stack on vB.
    pub b: Stack,
    /// B's address.
    pub b_ip: Ipv4Addr,
}

impl StackPair {
    /// Starts a channel set and a stack with `channels` throughput channels per peer (no
    /// latency channel) on each end.
    pub fn start(bed: &TestBed, channels: usize) -> StackPair {
        StackPair::start_with(bed, channels, 0)
    }

    /// [`start`](Self::start) with `latency` latency channels per peer besides.
    pub fn start_with(bed: &TestBed, channels: usize, latency: usize) -> StackPair {
        StackPair::start_scheduled(bed, channels, latency, false)
    }

    /// [`start_with`](Self::start_with), the stacks scheduling with
    /// `netchannel::sched::Isolating` when `isolating` (else the default round robin).
    pub fn start_scheduled(
        bed: &TestBed,
        channels: usize,
        latency: usize,
        isolating: bool,
    ) -> StackPair {
        StackPair::start_configured(bed, channels, latency, isolating, |_| {})
    }

    /// [`start_scheduled`](Self::start_scheduled), each side's `ChannelSetConfig` passed
    /// through `tune` before its set starts (TCP options). Above MTU 1500 the sets use
    /// 4096-byte UMEM frames (fewer descriptors per chain, and chains of up to 16 reach
    /// MTU 61426); the MSS follows the MTU by `ChannelSetConfig::new`'s default.
    pub fn start_configured(
        bed: &TestBed,
        channels: usize,
        latency: usize,
        isolating: bool,
        tune: impl Fn(&mut ChannelSetConfig) + Clone + Send + 'static,
    ) -> StackPair {
        let jumbo = bed.mtu() > 1500;
        let start = |side: Side| {
            let e = bed.side(side).clone();
            let tune = tune.clone();
            let builder = placed(Stack::builder());
            bed.run_in(side, move || {
                wait_for_previous_stack(&e.ifname);
                let mut builder = builder
                    .interface(e.ifname.clone())
                    .vns_config(vns_config())
                    .ipv4(e.ipv4)
                    .latency_channels(latency)
                    .connect_timeout(Duration::from_secs(10))
                    .configure_channels(move |cfg: &mut ChannelSetConfig| {
                        if jumbo {
                            cfg.link.frame_size = 4096;
                        }
                        tune(cfg);
                    });
                builder = bench_busy_poll(side, builder);
                // 0: the stack's default (chosen from the host).
                if channels > 0 {
                    builder = builder.channels(channels);
                }
                // For A/B runs of the stack's shards (0: the default, one per core).
                let shards = env_or("NETCHANNEL_BENCH_SHARDS", 0usize);
                if shards > 0 {
                    builder = builder.shards(shards);
                }
                if isolating {
                    builder = builder.scheduler(netchannel::sched::Isolating::default());
                } else if std::env::var("NETCHANNEL_BENCH_SCHEDULER").as_deref()
                    == Ok("source_port")
                {
                    // For A/B runs of per-chunk spreading against per-socket pinning.
                    builder = builder.scheduler(netchannel::sched::SourcePort::default());
                }
                builder.build().expect("stack")
            })
            .expect("enter the namespace")
        };
        let b = start(Side::B);
        let a = start(Side::A);
        StackPair {
            a,
            b,
            b_ip: bed.side(Side::B).ipv4,
        }
    }

    /// B's virtual listener address.
    pub fn vns_addr(&self) -> SocketAddr {
        SocketAddrV4::new(self.b_ip, VNS_PORT).into()
    }

    /// B's raw channel address.
    pub fn raw_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.b_ip, RAW_CHANNEL_PORT)
    }

    /// A's channel set.
    pub fn channels_a(&self) -> &ChannelSet {
        self.a.diagnostics().channel_set()
    }

    /// B's channel set.
    pub fn channels_b(&self) -> &ChannelSet {
        self.b.diagnostics().channel_set()
    }

    /// Moves every queue of both stacks to queue runtimes of the stacks' own (queue *i* on
    /// runtime *i*, started as needed: the disaggregated placement); returns where each
    /// queue was, for [`place_back`](Self::place_back).
    pub fn own_runtimes(&self) -> [Vec<(u32, DriverPlace)>; 2] {
        [own_runtimes(&self.a), own_runtimes(&self.b)]
    }

    /// Moves the queues back to where [`own_runtimes`](Self::own_runtimes) found them.
    pub fn place_back(&self, placed: [Vec<(u32, DriverPlace)>; 2]) {
        for (stack, places) in [&self.a, &self.b].into_iter().zip(placed) {
            for (q, p) in places {
                stack
                    .diagnostics()
                    .channel_set()
                    .move_queue(q, p)
                    .expect("move back");
            }
        }
    }

    /// Stops both stacks (and so their channel sets, runtimes joined, programs detached).
    pub fn stop(self) {
        self.a.abort();
        self.b.abort();
    }
}

/// A kernel TCP listener made in B's namespace.
pub fn kernel_listener(bed: &TestBed, port: u16) -> std::net::TcpListener {
    let ip = bed.side(Side::B).ipv4;
    let l = bed
        .run_in(Side::B, move || std::net::TcpListener::bind((ip, port)))
        .expect("enter B")
        .expect("bind the kernel listener");
    l.set_nonblocking(true).expect("nonblocking");
    l
}

/// A kernel TCP connection made in A's namespace to `to` (nonblocking, for tokio).
pub fn kernel_connect(bed: &TestBed, to: SocketAddrV4) -> std::net::TcpStream {
    let s = bed
        .run_in(Side::A, move || {
            std::net::TcpStream::connect_timeout(&to.into(), Duration::from_secs(10))
        })
        .expect("enter A")
        .expect("kernel connect");
    s.set_nonblocking(true).expect("nonblocking");
    s
}

/// Turns tx checksumming on both veth ends on or off (the test bed's default is off).
pub fn ethtool_tx(bed: &TestBed, on: bool) {
    for side in Side::BOTH {
        let ifname = bed.side(side).ifname.clone();
        bed.output_in(
            side,
            "ethtool",
            &["-K", &ifname, "tx", if on { "on" } else { "off" }],
        )
        .expect("ethtool -K tx");
    }
}

/// Latency samples in nanoseconds.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    ns: Vec<u64>,
    sorted: bool,
}

impl Samples {
    /// Room for `n` samples.
    pub fn with_capacity(n: usize) -> Samples {
        Samples {
            ns: Vec::with_capacity(n),
            sorted: true,
        }
    }

    /// Adds one.
    pub fn push(&mut self, d: Duration) {
        self.ns.push(d.as_nanos() as u64);
        self.sorted = false;
    }

    /// How many samples fall below each of `edges_us` (µs, ascending) and at or above the
    /// one before it; the last count is those at or above the last edge.
    #[allow(dead_code)]
    pub fn histogram(&self, edges_us: &[u64]) -> Vec<usize> {
        let mut counts = vec![0; edges_us.len() + 1];
        for &ns in &self.ns {
            let i = edges_us.partition_point(|&e| e * 1000 <= ns);
            counts[i] += 1;
        }
        counts
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.ns.len()
    }

    /// The `q` quantile (0..=1, nearest rank) in microseconds; 0 when empty.
    pub fn quantile_us(&mut self, q: f64) -> f64 {
        if self.ns.is_empty() {
            return 0.0;
        }
        if !self.sorted {
            self.ns.sort_unstable();
            self.sorted = true;
        }
        let rank = ((q * self.ns.len() as f64).ceil() as usize).clamp(1, self.ns.len());
        self.ns[rank - 1] as f64 / 1e3
    }

    /// The mean in microseconds.
    pub fn mean_us(&self) -> f64 {
        if self.ns.is_empty() {
            return 0.0;
        }
        self.ns.iter().sum::<u64>() as f64 / self.ns.len() as f64 / 1e3
    }
}

/// min, median and max of `xs`.
pub fn spread(xs: &[f64]) -> (f64, f64, f64) {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let m = v.len() / 2;
    let med = if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    };
    (v[0], med, v[v.len() - 1])
}

/// The port B's channel set listens on for [`StreamSink`] (raw channels read through
/// `ChannelStream`).
pub const RAW_STREAM_PORT: u16 = 9101;

/// A drain like `bed::ChannelSink`, but reading each channel through a `ChannelStream`
/// into a 64 KiB buffer (a copy, as an application reading a byte stream makes).
pub struct StreamSink {
    bad: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl StreamSink {
    /// Drains the channels `listener` accepts, expecting `expected` bytes on each.
    pub fn start(
        listener: netchannel::netdriver::channel::ChannelListener,
        expected: u64,
    ) -> StreamSink {
        use netchannel::netdriver::channel::{ChannelError, ChannelStream};
        use std::io::Read;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let bad = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, halt) = (bad.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            while !halt.load(Ordering::Relaxed) {
                let ch = match listener.accept_timeout(Duration::from_millis(100)) {
                    Ok((ch, _)) => ch,
                    Err(ChannelError::WouldBlockTimeout) => continue,
                    Err(_) => break,
                };
                let mut s = ChannelStream::new(ch);
                s.set_read_timeout(Some(Duration::from_secs(30)));
                let mut got = 0u64;
                let ok = loop {
                    match s.read(&mut buf) {
                        Ok(0) => break true,
                        Ok(n) => got += n as u64,
                        Err(_) => break false,
                    }
                };
                if ok && got == expected {
                    let _ = s.shutdown_write();
                } else {
                    b.fetch_add(1, Ordering::Relaxed);
                    s.channel().abort();
                }
            }
        });
        StreamSink { bad, stop, thread }
    }

    /// Stops the drain; panics if a transfer was bad.
    pub fn stop(self) {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("stream sink");
        assert_eq!(
            self.bad.load(Ordering::Relaxed),
            0,
            "bad channel-stream transfers"
        );
    }
}

/// One channel from `set` to `to` written through a `ChannelStream` in `block`-sized
/// writes (each copied into a fresh chunk), `total` bytes; returns once the receiver's
/// FIN arrived.
pub fn stream_send(set: &ChannelSet, to: SocketAddrV4, block: &[u8], total: u64) {
    use netchannel::netdriver::channel::ChannelStream;
    use std::io::{Read, Write};
    let mut s = ChannelStream::new(set.connect(to).expect("channel connect"));
    s.set_read_timeout(Some(Duration::from_secs(30)));
    s.set_write_timeout(Some(Duration::from_secs(30)));
    let mut sent = 0u64;
    while sent < total {
        let n = (total - sent).min(block.len() as u64) as usize;
        s.write_all(&block[..n]).expect("channel stream write");
        sent += n as u64;
    }
    s.shutdown_write().expect("shutdown");
    let mut rest = [0u8; 16];
    assert_eq!(s.read(&mut rest).expect("wait for the receiver's FIN"), 0);
}

// ---------------------------------------------------------------------------------------
// Bulk transfers: VirtualStream, raw channel, kernel TCP

/// Application buffer of every write and read of the bulk transfers.
pub const BLOCK: usize = 64 << 10;

/// Reads `s` to its end; returns the count.
async fn drain<R: tokio::io::AsyncRead + Unpin>(s: &mut R) -> std::io::Result<u64> {
    let mut buf = vec![0u8; BLOCK];
    let mut got = 0u64;
    loop {
        match s.read(&mut buf).await? {
            0 => return Ok(got),
            n => got += n as u64,
        }
    }
}

/// Writes `total` bytes as `block`-sized writes, then shuts the writing side down.
async fn fill<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    block: &[u8],
    total: u64,
) -> std::io::Result<()> {
    let mut sent = 0u64;
    while sent < total {
        let n = (total - sent).min(block.len() as u64) as usize;
        w.write_all(&block[..n]).await?;
        sent += n as u64;
    }
    w.shutdown().await
}

/// One virtual-stream transfer of `total` bytes from `a` to `l` (64 KiB `write_all`s,
/// read to EOF), timed from connect until the receiver read the last byte.
pub fn vns_transfer(
    rt: &Runtime,
    a: &Stack,
    l: &Arc<VirtualListener>,
    to: SocketAddr,
    total: u64,
) -> Duration {
    vns_transfer_streams(rt, a, l, to, total, 1)
}

/// [`vns_transfer`] over `streams` virtual streams at once, each carrying an equal share
/// of `total` (the last the remainder), timed from the first connect until every receiver
/// read its last byte.
pub fn vns_transfer_streams(
    rt: &Runtime,
    a: &Stack,
    l: &Arc<VirtualListener>,
    to: SocketAddr,
    total: u64,
    streams: usize,
) -> Duration {
    let streams = streams.max(1);
    let shares = shares(total, streams);
    let (a, l) = (a.clone(), l.clone());
    rt.block_on(async move {
        let start = std::time::Instant::now();
        let rx = tokio::spawn(async move {
            let mut readers = Vec::with_capacity(streams);
            for _ in 0..streams {
                let (mut s, _) = l.accept().await.expect("accept");
                readers.push(tokio::spawn(async move {
                    let got = drain(&mut s).await.expect("read");
                    s.shutdown().await.expect("shutdown");
                    got
                }));
            }
            let mut got = 0u64;
            for r in readers {
                got += r.await.expect("reader");
            }
            got
        });
        let senders: Vec<_> = shares
            .into_iter()
            .map(|share| {
                let a = a.clone();
                tokio::spawn(async move {
                    let block = vec![0x5au8; BLOCK];
                    let mut c = a.connect(to).await.expect("connect");
                    fill(&mut c, &block, share).await.expect("write");
                    // Keep the stream until the receiver has everything (dropping it
                    // with bytes unsent would reset it).
                    let mut rest = [0u8; 16];
                    let _ = c.read(&mut rest).await;
                })
            })
            .collect();
        let got = tokio::time::timeout(Duration::from_secs(300), rx)
            .await
            .expect("virtual stream transfer timed out")
            .expect("receiver");
        let d = start.elapsed();
        for tx in senders {
            tx.await.expect("sender");
        }
        assert_eq!(got, total, "virtual streams delivered a short transfer");
        d
    })
}

/// `total` cut into `streams` equal shares, the last with the remainder.
fn shares(total: u64, streams: usize) -> Vec<u64> {
    let n = streams as u64;
    let mut v = vec![total / n; streams];
    if let Some(last) = v.last_mut() {
        *last += total % n;
    }
    v
}

/// A kernel TCP listener in B's namespace on [`KERNEL_PORT`], for tokio (make it inside
/// `rt`'s context).
pub fn kernel_tokio_listener(bed: &TestBed, rt: &Runtime) -> Arc<tokio::net::TcpListener> {
    let _g = rt.enter();
    Arc::new(
        tokio::net::TcpListener::from_std(kernel_listener(bed, KERNEL_PORT))
            .expect("tokio listener"),
    )
}

/// One kernel TCP transfer A → B (sockets made in the namespaces, driven by tokio),
/// timed like [`vns_transfer`].
pub fn kernel_transfer(
    bed: &TestBed,
    rt: &Runtime,
    l: &Arc<tokio::net::TcpListener>,
    total: u64,
) -> Duration {
    kernel_transfer_streams(bed, rt, l, total, 1)
}

/// [`kernel_transfer`] over `streams` connections at once, shared as in
/// [`vns_transfer_streams`] and timed the same way.
pub fn kernel_transfer_streams(
    bed: &TestBed,
    rt: &Runtime,
    l: &Arc<tokio::net::TcpListener>,
    total: u64,
    streams: usize,
) -> Duration {
    let streams = streams.max(1);
    let to = match l.local_addr().expect("addr") {
        SocketAddr::V4(v4) => v4,
        SocketAddr::V6(_) => unreachable!("IPv4 listener"),
    };
    let l = l.clone();
    let start = std::time::Instant::now();
    let rx = rt.spawn(async move {
        let mut readers = Vec::with_capacity(streams);
        for _ in 0..streams {
            let (mut s, _) = l.accept().await.expect("accept");
            readers.push(tokio::spawn(
                async move { drain(&mut s).await.expect("read") },
            ));
        }
        let mut got = 0u64;
        for r in readers {
            got += r.await.expect("reader");
        }
        got
    });
    let std_streams: Vec<_> = (0..streams).map(|_| kernel_connect(bed, to)).collect();
    let shares = shares(total, streams);
    rt.block_on(async move {
        let senders: Vec<_> = std_streams
            .into_iter()
            .zip(shares)
            .map(|(std_stream, share)| {
                tokio::spawn(async move {
                    let block = vec![0x5au8; BLOCK];
                    let mut c = tokio::net::TcpStream::from_std(std_stream).expect("tokio stream");
                    fill(&mut c, &block, share).await.expect("write");
                    let mut rest = [0u8; 16];
                    let _ = c.read(&mut rest).await;
                })
            })
            .collect();
        let got = tokio::time::timeout(Duration::from_secs(300), rx)
            .await
            .expect("kernel transfer timed out")
            .expect("receiver");
        let d = start.elapsed();
        for tx in senders {
            tx.await.expect("sender");
        }
        assert_eq!(got, total, "kernel TCP delivered a short transfer");
        d
    })
}

/// A [`StackPair`] ready for bulk transfers of `total` bytes: B's channel set drains raw
/// channels ([`RAW_CHANNEL_PORT`], no copy) and channel streams ([`RAW_STREAM_PORT`],
/// `ChannelStream`), and B's stack has a virtual listener on [`VNS_PORT`].
pub struct StackBench {
    /// The stacks.
    pub pair: StackPair,
    /// B's virtual listener.
    pub listener: Arc<VirtualListener>,
    sink: ChannelSink,
    stream_sink: StreamSink,
    block: Bytes,
    total: u64,
}

impl StackBench {
    /// Starts the stacks (`channels` throughput channels per peer), the sinks and the
    /// listener, and runs one small virtual-stream transfer that opens the stacks'
    /// channels (so that the first measured one does not pay for it).
    pub fn start(bed: &TestBed, rt: &Runtime, channels: usize, total: u64) -> StackBench {
        StackBench::start_configured(bed, rt, channels, total, |_| {})
    }

    /// [`start`](Self::start) with each side's `ChannelSetConfig` passed through `tune`
    /// (see [`StackPair::start_configured`]).
    pub fn start_configured(
        bed: &TestBed,
        rt: &Runtime,
        channels: usize,
        total: u64,
        tune: impl Fn(&mut ChannelSetConfig) + Clone + Send + 'static,
    ) -> StackBench {
        let pair = StackPair::start_configured(bed, channels, 0, false, tune);
        let sink = ChannelSink::start(
            pair.channels_b()
                .listen(RAW_CHANNEL_PORT)
                .expect("raw listen"),
            total,
        );
        let stream_sink = StreamSink::start(
            pair.channels_b()
                .listen(RAW_STREAM_PORT)
                .expect("raw stream listen"),
            total,
        );
        let listener = Arc::new(
            rt.block_on(pair.b.bind(pair.vns_addr()))
                .expect("bind the virtual listener"),
        );
        let _ = vns_transfer(rt, &pair.a, &listener, pair.vns_addr(), total.min(4 << 20));
        StackBench {
            pair,
            listener,
            sink,
            stream_sink,
            block: Bytes::from(vec![0x5au8; BLOCK]),
            total,
        }
    }

    /// `raw_channel`: one channel of A's set to B's (64 KiB `Bytes` slices, no copy).
    pub fn raw_channel(&self) -> Duration {
        self.raw_channel_stats().0
    }

    /// [`raw_channel`](Self::raw_channel), with the sending channel's last statistics.
    pub fn raw_channel_stats(&self) -> (Duration, netchannel::netdriver::channel::ChannelStats) {
        let start = std::time::Instant::now();
        let stats = bed::channel_send(
            self.pair.channels_a(),
            self.pair.raw_addr(),
            &self.block,
            self.total,
        );
        (start.elapsed(), stats)
    }

    /// `raw_channel_copy`: the same through `ChannelStream` (std `Read`/`Write`, a copy
    /// on each side, as a byte-stream API makes).
    pub fn raw_channel_copy(&self) -> Duration {
        let start = std::time::Instant::now();
        stream_send(
            self.pair.channels_a(),
            SocketAddrV4::new(self.pair.b_ip, RAW_STREAM_PORT),
            &self.block,
            self.total,
        );
        start.elapsed()
    }

    /// `virtual_stream`: one `VirtualStream` from A's stack to B's listener.
    pub fn virtual_stream(&self, rt: &Runtime) -> Duration {
        vns_transfer(
            rt,
            &self.pair.a,
            &self.listener,
            self.pair.vns_addr(),
            self.total,
        )
    }

    /// `virtual_streams`: `streams` `VirtualStream`s at once from A's stack to B's
    /// listener, sharing the transfer's bytes.
    pub fn virtual_streams(&self, rt: &Runtime, streams: usize) -> Duration {
        vns_transfer_streams(
            rt,
            &self.pair.a,
            &self.listener,
            self.pair.vns_addr(),
            self.total,
            streams,
        )
    }

    /// Stops the listener, the sinks (panics if a transfer was bad) and the stacks.
    pub fn stop(self) {
        drop(self.listener);
        self.sink.stop();
        self.stream_sink.stop();
        self.pair.stop();
    }
}

/// Per-measurement rates of a phase, one per round.
#[derive(Default)]
pub struct Phase {
    names: Vec<&'static str>,
    rates: Vec<Vec<f64>>,
}

impl Phase {
    /// Records one round's rate of `name`.
    pub fn add(&mut self, name: &'static str, gbit: f64) {
        let i = match self.names.iter().position(|&n| n == name) {
            Some(i) => i,
            None => {
                self.names.push(name);
                self.rates.push(Vec::new());
                self.names.len() - 1
            }
        };
        self.rates[i].push(gbit);
    }

    /// The rates of `name`, round by round.
    pub fn get(&self, name: &str) -> &[f64] {
        self.names
            .iter()
            .position(|&n| n == name)
            .map_or(&[], |i| &self.rates[i])
    }

    /// The measurements and their rates, in the order first added.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &[f64])> {
        self.names
            .iter()
            .copied()
            .zip(self.rates.iter().map(Vec::as_slice))
    }

    /// min, median and max of `a / b` taken round by round; `None` if either is missing.
    pub fn ratio(&self, a: &str, b: &str) -> Option<(f64, f64, f64)> {
        let rs: Vec<f64> = self
            .get(a)
            .iter()
            .zip(self.get(b))
            .map(|(x, y)| x / y.max(1e-12))
            .collect();
        (!rs.is_empty()).then(|| spread(&rs))
    }

    /// The ratios worth printing, with a note each.
    pub const RATIOS: [(&'static str, &'static str, &'static str); 5] = [
        (
            "virtual_stream",
            "raw_channel",
            "   (target >= 0.90: VNS costs <= 10 %)",
        ),
        (
            "virtual_stream",
            "raw_channel_copy",
            "   (the same, both against a channel read and written with copies)",
        ),
        (
            "raw_channel_copy",
            "raw_channel",
            "   (what the two copies cost)",
        ),
        ("virtual_stream", "kernel_xdp_attached", ""),
        ("raw_channel", "kernel_xdp_attached", ""),
    ];

    /// Prints min / median / max per measurement and the ratios round by round.
    pub fn print(&self, title: &str) {
        println!();
        println!("{title}");
        println!(
            "{:<26} {:>8} {:>8} {:>8}   (Gbit/s over rounds)",
            "measurement", "min", "median", "max"
        );
        for (n, r) in self.iter() {
            let (lo, med, hi) = spread(r);
            println!("{n:<26} {lo:>8.3} {med:>8.3} {hi:>8.3}");
        }
        if self.names.len() > 1 {
            println!("ratios, round by round (min median max):");
        }
        for (a, b, note) in Self::RATIOS {
            if let Some((lo, med, hi)) = self.ratio(a, b) {
                println!(
                    "{:<48} {lo:>6.2} {med:>6.2} {hi:>6.2}{note}",
                    format!("{a} / {b}")
                );
            }
        }
    }
}

/// Now on `CLOCK_MONOTONIC`, as `seconds.microseconds`: the clock of `perf record -k
/// CLOCK_MONOTONIC`, so that a slow sample a bench prints can be found in a trace.
#[allow(dead_code)]
pub fn monotonic_now() -> String {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    format!("{}.{:06}", ts.tv_sec, ts.tv_nsec / 1000)
}
