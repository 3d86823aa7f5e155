//! The paper's three operating points, side by side in one run on the test bed
//! (two queues, MTU 1500), each against kernel TCP (`tokio::net::TcpStream`,
//! `TCP_NODELAY`) over the same veth:
//!
//! 1. **One application thread, many cores**: one VirtualStream's bulk goodput (one
//!    writer task, one reader task) as throughput channels per peer go 1 → 2 → 4, and
//!    one kernel stream's.
//! 2. **Short messages scale with channels**: closed-loop request rate of many
//!    connections (`NETCHANNEL_BENCH_CONNS`, default 32, one request outstanding each),
//!    64 B and 4 KB, as channels per peer go 1 → 2 → 4; also per core of this machine.
//! 3. **Isolation**: p99.9 of one latency-class 4 KB request/response stream while 8
//!    throughput-class streams saturate the link, under `Isolating` and under the
//!    default round robin, and the same for kernel TCP; each as a ratio to the same
//!    stream's p99.9 alone (the paper saw 37× inflation on Linux; target ≤ 2× for
//!    `Isolating`). The latency stream's client and server run as an application of
//!    their own (a runtime with one worker), as in the paper, and again on the bulk
//!    application's runtime (`NETCHANNEL_BENCH_LATENCY_APP`: `own`, `shared`, default
//!    both). Under `Isolating` the latency channels' NIC queues are driven on the latency
//!    application's runtime (`Stack::set_latency_runtime`), the others on the bulk
//!    application's.
//!
//! Every response and every bulk byte count is checked. Environment:
//! `NETCHANNEL_BENCH_MB` (bulk transfer, default 200), `NETCHANNEL_BENCH_SECS` (per rate
//! measurement, default 2), `NETCHANNEL_BENCH_CONNS` (default 32),
//! `NETCHANNEL_BENCH_SAMPLES` (latency samples per case, default 5000),
//! `NETCHANNEL_BENCH_POINTS` (which points to run, default `123`),
//! `NETCHANNEL_BENCH_LATENCY_QUEUES=own` (point 3 under `Isolating`: the latency queues on
//! a queue runtime of each stack's own instead of the latency application's runtime),
//! `NETCHANNEL_BENCH_LATENCY_NICE` (point 3, `own` mode: the nice value of the latency
//! application's threads, for both stacks; the paper's "Linux + prioritization" is -20
//! with kernel TCP), `NETCHANNEL_BENCH_PIN_APPS` (point 3: the bulk application on every
//! core but the last, the latency application on the last, for both stacks: a host with
//! a core to spare for it), `NETCHANNEL_BENCH_ISOLATION_STACKS` (point 3's rows, default
//! `isolating,roundrobin,kernel`), `NETCHANNEL_BENCH_SLOWEST` (point 3: print each case's
//! that many slowest samples, each sample of 1 ms or more as it comes, with its index and
//! its end on `CLOCK_MONOTONIC` to find it in a `perf record -k CLOCK_MONOTONIC` trace, and
//! which runtime drives which queue). Each application listens on a port of its own and
//! accepts on its own runtime. Without `--bench`
//! (`cargo test --all-targets`) it runs a small smoke version.
//!
//! Remote-peer mode: with `NETCHANNEL_BENCH_PEER=IPV4[:PORT]`,
//! `NETCHANNEL_BENCH_INTERFACE=IFACE` and `NETCHANNEL_BENCH_ADDRESS=IPV4` set, it builds no
//! bed and no server: points 1 and 2 run from a netchannel stack on IFACE (restarted with
//! 1, 2 and 4 channels) against `ncperf server -i IFACE -a ADDR` on the peer and kernel
//! TCP against `ncperf server --kernel -a ADDR` there, both on PORT (default 7700), with
//! ncperf's bulk streams (every byte checked by the server) and echo requests (every
//! response checked). Point 3 is skipped there: its rows set both stacks' scheduler and
//! where both latency applications and their queues run, and the server's stack is
//! another process (`ncperf client --test isolation` measures isolation between hosts).
//! The first line names the peer.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! `cargo bench -j1 --bench operating_points`

#[cfg(target_os = "linux")]
#[path = "support/bed.rs"]
mod bed;
#[cfg(target_os = "linux")]
#[path = "support/remote.rs"]
mod remote;
#[cfg(target_os = "linux")]
#[path = "support/vns.rs"]
mod vns;

#[cfg(target_os = "linux")]
mod run {
    use std::net::{SocketAddr, SocketAddrV4};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use netchannel::{AppClass, VirtualStream};
    use testbed::TestBed;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::runtime::Runtime;

    use netchannel::perf_proto::{Op, Pattern, Requests};

    use super::remote::{self, Remote};
    use super::vns::{self, env_or, Samples, StackPair};

    const STEP: Duration = Duration::from_secs(10);
    const CHANNELS: [usize; 3] = [1, 2, 4];

    /// Serves a connection by the kind byte it sends first: `B` is a bulk stream (read and
    /// dropped), anything else is echoed.
    async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
        let mut kind = [0u8; 1];
        if s.read_exact(&mut kind).await.is_err() {
            return;
        }
        if kind[0] == b'B' {
            let mut buf = vec![0u8; 64 << 10];
            while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
        } else {
            echo(s).await;
        }
    }

    async fn echo<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
    }

    /// Request/response on `s` until `stop`: each request a counter then a pattern,
    /// checked when it comes back. Returns the exchanges completed.
    async fn ping<S: AsyncRead + AsyncWrite + Unpin>(
        mut s: S,
        size: usize,
        stop: Arc<AtomicBool>,
        lat: Option<&mut Samples>,
    ) -> u64 {
        let mut req = vec![0u8; size.max(8)];
        let mut back = vec![0u8; req.len()];
        let mut n = 0u64;
        let mut lat = lat;
        while !stop.load(Ordering::Relaxed) {
            req[..8].copy_from_slice(&n.to_le_bytes());
            let t = Instant::now();
            tokio::time::timeout(STEP, async {
                s.write_all(&req).await?;
                s.read_exact(&mut back).await.map(|_| ())
            })
            .await
            .expect("an exchange stalled")
            .expect("exchange");
            if let Some(l) = lat.as_deref_mut() {
                let took = t.elapsed();
                l.push(took);
                // With `NETCHANNEL_BENCH_SLOWEST`, when in the run each sample of 1 ms or
                // more came (whether they cluster at the start, while the load ramps up).
                if took >= Duration::from_millis(1) && show_slow() {
                    // Its end on CLOCK_MONOTONIC, to find it in a trace.
                    println!(
                        "slow sample {n}: {} µs, ended at {} s (CLOCK_MONOTONIC)",
                        took.as_micros(),
                        vns::monotonic_now()
                    );
                }
            }
            assert!(back == req, "response {n} differs");
            n += 1;
            if lat.as_ref().is_some_and(|l| l.len() >= l_cap()) {
                break;
            }
        }
        n
    }

    /// Whether `NETCHANNEL_BENCH_SLOWEST` asks for the slow samples' places.
    fn show_slow() -> bool {
        env_or("NETCHANNEL_BENCH_SLOWEST", 0usize) > 0
    }

    fn l_cap() -> usize {
        if super::vns::bench_mode() {
            env_or("NETCHANNEL_BENCH_SAMPLES", 5000usize)
        } else {
            300
        }
    }

    /// Point 1: one stream's goodput in Gbit/s.
    fn one_stream(bed: &TestBed, rt: &Runtime, total: u64) {
        println!(
            "## 1. One application thread, many cores: one stream, {} MB",
            total >> 20
        );
        let kl = vns::kernel_tokio_listener(bed, rt);
        let kernel = vns::kernel_transfer(bed, rt, &kl, total);
        let gbit = |d: Duration| (total * 8) as f64 / d.as_secs_f64() / 1e9;
        println!("| channels | VirtualStream Gbit/s | kernel TCP Gbit/s | ratio |");
        println!("|---|---|---|---|");
        for ch in CHANNELS {
            let pair = StackPair::start(bed, ch);
            let l = Arc::new(rt.block_on(pair.b.bind(pair.vns_addr())).expect("bind"));
            let d = vns::vns_transfer(rt, &pair.a, &l, pair.vns_addr(), total);
            let (v, k) = (gbit(d), gbit(kernel));
            println!("| {ch} | {v:.2} | {k:.2} | {:.2} |", v / k);
            drop(l);
            pair.stop();
        }
    }

    /// `conns` closed-loop connections for `secs`; requests per second.
    fn rate<S, F>(rt: &Runtime, conns: usize, size: usize, secs: f64, connect: F) -> f64
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        F: Fn() -> S,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let streams: Vec<S> = (0..conns).map(|_| connect()).collect();
        let start = Instant::now();
        let tasks: Vec<_> = streams
            .into_iter()
            .map(|s| {
                let (stop, done) = (stop.clone(), done.clone());
                rt.spawn(async move {
                    let n = ping(s, size, stop, None).await;
                    done.fetch_add(n, Ordering::Relaxed);
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            rt.block_on(t).expect("client");
        }
        done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
    }

    /// Point 2: request rates as channels grow.
    fn short_messages(bed: &TestBed, rt: &Runtime, kaddr: SocketAddrV4, conns: usize, secs: f64) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        println!(
            "\n## 2. Short messages scale with channels: {conns} connections, closed loop, {cores} cores"
        );
        println!("| size | channels | VirtualStream req/s | per core | kernel req/s | ratio | vs 1 channel |");
        println!("|---|---|---|---|---|---|---|");
        for size in [64usize, 4096] {
            let kernel = rate(rt, conns, size, secs, || kernel_open(bed, rt, kaddr, b'E'));
            let mut first = None;
            for ch in CHANNELS {
                let pair = StackPair::start(bed, ch);
                let l = rt.block_on(pair.b.bind(pair.vns_addr())).expect("bind");
                rt.spawn(async move {
                    while let Ok((s, _)) = l.accept().await {
                        tokio::spawn(serve(s));
                    }
                });
                let (a, to) = (pair.a.clone(), pair.vns_addr());
                let v = rate(rt, conns, size, secs, || -> VirtualStream {
                    rt.block_on(async {
                        let mut s = a.connect(to).await.expect("connect");
                        s.write_all(b"E").await.expect("kind");
                        s
                    })
                });
                let base = *first.get_or_insert(v);
                println!(
                    "| {size} B | {ch} | {v:.0} | {:.0} | {kernel:.0} | {:.2} | {:.2} |",
                    v / cores as f64,
                    v / kernel,
                    v / base
                );
                pair.stop();
            }
        }
    }

    /// p99.9 of a 4 KB ping-pong on `lat`, driven from `lat_rt`, with `load` (bulk writers
    /// on `rt`) running or not.
    fn p999<S, L>(rt: &Runtime, lat_rt: &Runtime, lat: S, load: Vec<L>) -> Tail
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        L: AsyncWrite + Unpin + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = load
            .into_iter()
            .map(|mut w| {
                let stop = stop.clone();
                rt.spawn(async move {
                    let block = vec![0x5au8; 64 << 10];
                    while !stop.load(Ordering::Relaxed) {
                        if w.write_all(&block).await.is_err() {
                            break;
                        }
                    }
                })
            })
            .collect();
        let mut samples = Samples::with_capacity(l_cap());
        let never = Arc::new(AtomicBool::new(false));
        // The measuring thread is the latency application's too.
        let own = !std::ptr::eq(rt, lat_rt);
        let old = own.then(latency_nice).flatten().map(set_thread_nice);
        let pin = own.then(pinned_apps).flatten();
        let all = process_cores();
        if let Some((_, c)) = &pin {
            set_thread_cores(&[*c]);
        }
        lat_rt.block_on(ping(lat, 4096, never, Some(&mut samples)));
        if let Some(old) = old {
            set_thread_nice(old);
        }
        if pin.is_some() {
            set_thread_cores(&all);
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            let _ = rt.block_on(w);
        }
        // `NETCHANNEL_BENCH_SLOWEST=n`: each case's n slowest samples, for reading tails
        // (whether they cluster at a timer's period, say).
        let slowest: usize = env_or("NETCHANNEL_BENCH_SLOWEST", 0);
        if slowest > 0 {
            let n = samples.len().max(1) as f64;
            let v: Vec<u64> = (0..slowest.min(samples.len()))
                .map(|k| samples.quantile_us(1.0 - k as f64 / n) as u64)
                .collect();
            println!("slowest samples (µs): {v:?}");
        }
        let h = samples.histogram(&[1000, 5000]);
        Tail {
            p50: samples.quantile_us(0.5),
            p999: samples.quantile_us(0.999),
            over_1ms: h[1] + h[2],
            over_5ms: h[2],
        }
    }

    /// A latency case's figures (µs) and its samples of 1 ms or more and 5 ms or more.
    struct Tail {
        p50: f64,
        p999: f64,
        over_1ms: usize,
        over_5ms: usize,
    }

    /// The table cells of a stream alone and loaded: p50s, p99.9s, inflation, slow samples.
    fn tail_cells(alone: &Tail, loaded: &Tail) -> String {
        format!(
            "{:.1} | {:.1} | {:.1} | {:.1} | {:.2}× | {} / {}",
            alone.p50,
            alone.p999,
            loaded.p50,
            loaded.p999,
            loaded.p999 / alone.p999,
            loaded.over_1ms,
            loaded.over_5ms
        )
    }

    /// Where point 3's latency stream (its client and its server) runs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum LatencyApp {
        /// A runtime of its own (one worker, plus the measuring thread): a second
        /// application beside the bulk one, as in the paper's setup (a latency-sensitive
        /// service sharing the host and the stack with bulk transfers).
        Own,
        /// The bulk application's runtime: its tasks also wait behind the bulk tasks in
        /// that runtime's run queues, which no network stack can isolate them from.
        Shared,
    }

    /// The modes `NETCHANNEL_BENCH_LATENCY_APP` asks for (`own`, `shared`; default both).
    fn latency_apps() -> Vec<LatencyApp> {
        let v: String = env_or("NETCHANNEL_BENCH_LATENCY_APP", "own,shared".to_string());
        let mut apps = Vec::new();
        for m in v.split(',').map(str::trim) {
            match m {
                "own" => apps.push(LatencyApp::Own),
                "shared" => apps.push(LatencyApp::Shared),
                other => panic!("NETCHANNEL_BENCH_LATENCY_APP: unknown mode {other:?}"),
            }
        }
        apps
    }

    /// Point 3: the latency stream alone and under bulk load, per scheduler and kernel, for
    /// each place its application runs ([`LatencyApp`]).
    fn isolation(bed: &TestBed, rt: &Runtime, kaddr: SocketAddrV4) {
        // `NETCHANNEL_BENCH_PIN_APPS`: the bulk application on every core but the last,
        // the latency application on the last (whose runtime drives the latency
        // channels' queues under `Isolating`), for both stacks.
        let pin = pinned_apps();
        let bench_rt = rt.handle().clone();
        let pinned_bulk = pin.as_ref().map(|(bulk, _)| {
            let bulk = bulk.clone();
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .on_thread_start(move || set_thread_cores(&bulk))
                .build()
                .expect("the bulk application's runtime")
        });
        let (rt, kaddr) = match &pinned_bulk {
            Some(brt) => (
                brt,
                vns::kernel_server_at(bed, brt, vns::KERNEL_PORT + 2, serve),
            ),
            None => (rt, kaddr),
        };
        // The stacks started for this point take the (pinned) bulk application's runtime
        // as the application's, so that the bulk channels' queues are driven on the bulk
        // cores too: on the benches' own runtime, unpinned, their rounds (a millisecond
        // under 8 bulk streams) landed on the latency application's core and held its
        // samples until the next scheduler tick.
        if pinned_bulk.is_some() {
            vns::set_app_runtime(Some(rt.handle().clone()));
        }
        for app in latency_apps() {
            let nice = latency_nice();
            let lat_core = pin.as_ref().map(|(_, l)| *l);
            let own = (app == LatencyApp::Own).then(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    // Named apart from the bulk application's workers, for profiles.
                    .thread_name("latency-app")
                    .enable_all()
                    .on_thread_start(move || {
                        if let Some(n) = nice {
                            set_thread_nice(n);
                        }
                        if let Some(c) = lat_core {
                            set_thread_cores(&[c]);
                        }
                    })
                    .build()
                    .expect("the latency application's runtime")
            });
            isolation_with(bed, rt, own.as_ref().unwrap_or(rt), kaddr, app);
        }
        if pinned_bulk.is_some() {
            vns::set_app_runtime(Some(bench_rt));
        }
    }

    /// `NETCHANNEL_BENCH_PIN_APPS` set: the bulk application's cores and the latency
    /// application's core (the last of the process's).
    fn pinned_apps() -> Option<(Vec<usize>, usize)> {
        std::env::var_os("NETCHANNEL_BENCH_PIN_APPS")?;
        let mut cores = process_cores();
        let last = cores.pop()?;
        (!cores.is_empty()).then_some((cores, last))
    }

    /// The cores the process may run on.
    fn process_cores() -> Vec<usize> {
        // SAFETY: `sched_getaffinity` fills the set it is given, of the size it is told.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Vec::new();
            }
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    /// Confines the calling thread to `cores`.
    fn set_thread_cores(cores: &[usize]) {
        // SAFETY: `sched_setaffinity` on the calling thread (0) with a set built here.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in cores {
                libc::CPU_SET(c, &mut set);
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                panic!("pinning to {cores:?}: {}", std::io::Error::last_os_error());
            }
        }
    }

    /// `NETCHANNEL_BENCH_LATENCY_NICE`: the nice value of the latency application's
    /// threads (its runtime's worker and the measuring thread while it measures), in the
    /// `own` mode only; unset, they keep the process's. The paper's "Linux +
    /// prioritization" case (nice -20 for the latency application) is this with kernel
    /// TCP.
    fn latency_nice() -> Option<i32> {
        std::env::var("NETCHANNEL_BENCH_LATENCY_NICE")
            .ok()
            .map(|v| {
                v.trim()
                    .parse()
                    .expect("NETCHANNEL_BENCH_LATENCY_NICE: an integer")
            })
    }

    /// Sets the calling thread's nice value (Linux: per thread). Returns the old one.
    fn set_thread_nice(n: i32) -> i32 {
        // SAFETY: plain system calls on the calling thread's own id; no memory is shared.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            let old = libc::getpriority(libc::PRIO_PROCESS, tid);
            if libc::setpriority(libc::PRIO_PROCESS, tid, n) != 0 {
                panic!("setting nice {n}: {}", std::io::Error::last_os_error());
            }
            old
        }
    }

    /// Point 3 with the latency stream's client and server on `lat_rt` (the bulk
    /// streams' on `rt`).
    fn isolation_with(
        bed: &TestBed,
        rt: &Runtime,
        lat_rt: &Runtime,
        kaddr: SocketAddrV4,
        app: LatencyApp,
    ) {
        println!(
            "\n## 3. Isolation: 4 KB request/response p99.9 with 8 bulk streams beside it \
             (latency stream's application: {})",
            match app {
                LatencyApp::Own => "its own runtime",
                LatencyApp::Shared => "the bulk application's runtime",
            }
        );
        println!("| stack | p50 alone µs | p99.9 alone µs | p50 loaded µs | p99.9 loaded µs | p99.9 inflation | loaded samples ≥ 1 / ≥ 5 ms | segments resent |");
        println!("|---|---|---|---|---|---|---|---|");
        let stacks: String = env_or(
            "NETCHANNEL_BENCH_ISOLATION_STACKS",
            "isolating,roundrobin,kernel".to_string(),
        );
        let wanted = |s: &str| stacks.split(',').any(|w| w.trim() == s);
        for (name, isolating) in [
            ("VirtualStream, Isolating", true),
            ("VirtualStream, RoundRobin", false),
        ] {
            if !wanted(if isolating { "isolating" } else { "roundrobin" }) {
                continue;
            }
            let pair = StackPair::start_scheduled(bed, 4, 1, isolating);
            if isolating {
                // The latency channels' queues are driven on the latency application's
                // runtime (the bulk queues stay on the bulk application's): a latency
                // arrival is read by the runtime that waits for it, never behind a bulk
                // round.
                // `NETCHANNEL_BENCH_LATENCY_QUEUES=own`: on a queue runtime of each stack's
                // own instead (a thread of their own), to
                // compare the two placements.
                let own =
                    std::env::var("NETCHANNEL_BENCH_LATENCY_QUEUES").is_ok_and(|v| v == "own");
                for s in [&pair.a, &pair.b] {
                    if own {
                        let set = s.diagnostics().channel_set();
                        let id = set.add_runtime(None).expect("a queue runtime");
                        let last = *set.queues().last().expect("queues");
                        set.move_queue(
                            last,
                            netchannel::netdriver::channel::DriverPlace::Runtime(id),
                        )
                        .expect("latency queue moved");
                    } else {
                        s.set_latency_runtime(lat_rt.handle().clone())
                            .expect("latency runtime");
                    }
                }
            }
            // Each application listens on a port of its own and accepts on its own
            // runtime, as with kernel TCP below: a stream's first reads then happen in the
            // runtime of the application that serves it. (The latency application used
            // to accept and classify every stream: its runtime read the bulk streams'
            // first bytes, so its reactor registered the bulk queue's AF_XDP socket and
            // the bulk arrivals woke the latency application, ~2,000 times in a run.)
            let lat_addr = pair.vns_addr();
            let bulk_addr = SocketAddr::new(lat_addr.ip(), lat_addr.port() + 1);
            let l = lat_rt.block_on(pair.b.bind(lat_addr)).expect("bind");
            let bl = rt.block_on(pair.b.bind(bulk_addr)).expect("bind");
            // Latency-class on both ends.
            lat_rt.spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    let _ = s.set_app_class(AppClass::Latency);
                    tokio::spawn(serve(s));
                }
            });
            rt.spawn(async move {
                while let Ok((s, _)) = bl.accept().await {
                    tokio::spawn(serve(s));
                }
            });
            let a = pair.a.clone();
            let open = |kind: u8| -> VirtualStream {
                let on = if kind == b'L' { lat_rt } else { rt };
                on.block_on(async {
                    // Latency-class before the connect (the paper's `SO_APP_TYPE`): the
                    // stream lives in the stacks' latency shards, apart from the bulk ones.
                    let socket = a.socket();
                    if kind == b'L' {
                        socket
                            .set_app_class(AppClass::Latency)
                            .expect("latency class");
                    }
                    let to = if kind == b'L' { lat_addr } else { bulk_addr };
                    let mut s = socket.connect(to).await.expect("connect");
                    s.write_all(&[kind]).await.expect("kind");
                    s
                })
            };
            // Frames the kernel dropped at the AF_XDP sockets (rings full), both ends.
            let xsk_dropped = || -> u64 {
                [&pair.a, &pair.b]
                    .iter()
                    .flat_map(|s| s.diagnostics().queue_stats())
                    .filter_map(|t| t.xsk_drops)
                    .map(|d| d.rx_dropped)
                    .sum()
            };
            let alone = p999::<_, VirtualStream>(rt, lat_rt, open(b'L'), Vec::new());
            let dropped_alone = xsk_dropped();
            let loaded = p999(rt, lat_rt, open(b'L'), (0..8).map(|_| open(b'B')).collect());
            let dropped_loaded = xsk_dropped() - dropped_alone;
            if show_slow() {
                println!(
                    "queue placement: A {}, B {}",
                    pair.a.diagnostics().channel_placement(),
                    pair.b.diagnostics().channel_placement(),
                );
            }
            // Segments the channels sent again, by class, both ends: a tail of ~200 ms
            // is a retransmission (timeout or single-segment probe) on a channel.
            let resent = |class| -> u64 {
                [&pair.a, &pair.b]
                    .iter()
                    .flat_map(|s| s.diagnostics().stats().channels)
                    .filter(|c| c.class == class)
                    .map(|c| c.retransmitted_segments)
                    .sum()
            };
            println!(
                "| {name} | {} | latency channels resent {}, throughput {}; AF_XDP rx drops alone {dropped_alone}, loaded {dropped_loaded} |",
                tail_cells(&alone, &loaded),
                resent(netchannel::sched::ChannelClass::Latency),
                resent(netchannel::sched::ChannelClass::Throughput)
            );
            pair.stop();
        }
        if !wanted("kernel") {
            return;
        }
        // Kernel TCP: the same. The latency application has a server of its own when it
        // has a runtime of its own (a kernel socket stays with the runtime that
        // registered it).
        let laddr = if app == LatencyApp::Own {
            vns::kernel_server_at(bed, lat_rt, vns::KERNEL_PORT + 1, serve)
        } else {
            kaddr
        };
        let open = |kind: u8| {
            if kind == b'L' {
                kernel_open(bed, lat_rt, laddr, kind)
            } else {
                kernel_open(bed, rt, kaddr, kind)
            }
        };
        let alone = p999::<_, tokio::net::TcpStream>(rt, lat_rt, open(b'L'), Vec::new());
        let loaded = p999(rt, lat_rt, open(b'L'), (0..8).map(|_| open(b'B')).collect());
        println!("| kernel TCP | {} | |", tail_cells(&alone, &loaded));
    }

    /// A kernel TCP connection to the bench's kernel server, announcing its kind.
    fn kernel_open(
        bed: &TestBed,
        rt: &Runtime,
        kaddr: SocketAddrV4,
        kind: u8,
    ) -> tokio::net::TcpStream {
        let mut s = vns::kernel_stream(bed, rt, kaddr);
        rt.block_on(s.write_all(&[kind])).expect("kind");
        s
    }

    /// Closed-loop ncperf echo requests of `size` bytes on every one of `streams` for
    /// `secs`, each response checked byte for byte; requests per second.
    fn checked_rate<S>(
        rt: &Runtime,
        streams: Vec<S>,
        size: usize,
        secs: f64,
    ) -> std::io::Result<f64>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        rt.block_on(async move {
            let start = Instant::now();
            let until = start + Duration::from_secs_f64(secs);
            let tasks: Vec<_> = streams
                .into_iter()
                .enumerate()
                .map(|(i, mut s)| {
                    tokio::spawn(async move {
                        let mut r = Requests::new(size, i as u64);
                        while Instant::now() < until {
                            let what = format!("request {} of connection {i}", r.done());
                            remote::step(&what, r.exchange(&mut s)).await?;
                        }
                        remote::close_echo(s).await?;
                        Ok::<u64, std::io::Error>(r.done())
                    })
                })
                .collect();
            let mut total = 0;
            for t in tasks {
                total += t.await.map_err(std::io::Error::other)??;
            }
            Ok(total as f64 / start.elapsed().as_secs_f64())
        })
    }

    /// The remote-peer mode: points 1 and 2 from a local stack (restarted with 1, 2 and 4
    /// throughput channels) against `ncperf server` on the peer, and kernel TCP against
    /// `ncperf server --kernel` there, with ncperf's bulk streams (every byte checked by
    /// the server) and echo requests (every response checked). Point 3 is skipped: its
    /// rows set both stacks' scheduler and where both latency applications and their
    /// queues run, and the server's stack is another process (`ncperf client --test
    /// isolation` measures isolation between hosts).
    fn remote_main(total: u64, secs: f64, conns: usize, points: &str) {
        let pattern = Pattern::new();
        let gbit = |d: Duration| (total * 8) as f64 / d.as_secs_f64() / 1e9;
        let started = |ch: usize| -> Option<(Remote, Runtime)> {
            remote::start("operating_points", ch, 0, true)
        };
        let fail = |what: &str, e: std::io::Error| -> ! {
            remote::fail("operating_points", format!("{what}: {e}"))
        };
        let mut first = true;
        let mut banner = |r: &Remote| {
            if first {
                println!("{}", r.banner("operating_points"));
                println!(
                    "operating points against the remote peer ({} build); point 3 skipped in \
                     remote mode (it sets both stacks' scheduler and latency placement)",
                    if cfg!(debug_assertions) {
                        "debug"
                    } else {
                        "release"
                    }
                );
                first = false;
            }
        };
        if points.contains('1') {
            let mut kernel = None;
            for ch in CHANNELS {
                let Some((r, rt)) = started(ch) else { return };
                banner(&r);
                let k = *kernel.get_or_insert_with(|| {
                    let d = rt
                        .block_on(r.timed_sink(&pattern, total, true))
                        .unwrap_or_else(|e| fail("kernel bulk stream", e));
                    println!(
                        "## 1. One application thread, many cores: one stream, {} MB",
                        total >> 20
                    );
                    println!("| channels | VirtualStream Gbit/s | kernel TCP Gbit/s | ratio |");
                    println!("|---|---|---|---|");
                    gbit(d)
                });
                let d = rt
                    .block_on(r.timed_sink(&pattern, total, false))
                    .unwrap_or_else(|e| fail("virtual bulk stream", e));
                let v = gbit(d);
                println!("| {ch} | {v:.2} | {k:.2} | {:.2} |", v / k);
                r.stop();
            }
        }
        if points.contains('2') {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let mut lines = Vec::new();
            for size in [64usize, 4096] {
                let mut kernel = None;
                let mut base = None;
                for ch in CHANNELS {
                    let Some((r, rt)) = started(ch) else { return };
                    banner(&r);
                    let k = match kernel {
                        Some(k) => k,
                        None => {
                            let streams = rt
                                .block_on(async {
                                    let mut v = Vec::with_capacity(conns);
                                    for _ in 0..conns {
                                        v.push(r.kernel_conn(Op::Echo, false).await?);
                                    }
                                    Ok(v)
                                })
                                .unwrap_or_else(|e| fail("kernel connections", e));
                            let k = checked_rate(&rt, streams, size, secs)
                                .unwrap_or_else(|e| fail("kernel requests", e));
                            *kernel.insert(k)
                        }
                    };
                    let streams = rt
                        .block_on(async {
                            let mut v = Vec::with_capacity(conns);
                            for _ in 0..conns {
                                v.push(r.virtual_conn(Op::Echo, false).await?);
                            }
                            Ok(v)
                        })
                        .unwrap_or_else(|e| fail("virtual connections", e));
                    let v = checked_rate(&rt, streams, size, secs)
                        .unwrap_or_else(|e| fail("virtual requests", e));
                    let b = *base.get_or_insert(v);
                    lines.push(format!(
                        "| {size} B | {ch} | {v:.0} | {:.0} | {k:.0} | {:.2} | {:.2} |",
                        v / cores as f64,
                        v / k,
                        v / b
                    ));
                    r.stop();
                }
            }
            println!(
                "\n## 2. Short messages scale with channels: {conns} connections, closed loop, {cores} cores (this host)"
            );
            println!("| size | channels | VirtualStream req/s | per core | kernel req/s | ratio | vs 1 channel |");
            println!("|---|---|---|---|---|---|---|");
            for l in lines {
                println!("{l}");
            }
        }
        if points.contains('3') {
            println!(
                "\n## 3. Isolation: skipped in remote mode (it sets both stacks' scheduler and \
                 where both latency applications and their queues run; `ncperf client --test \
                 isolation` measures it between hosts)"
            );
        }
    }

    pub fn main() {
        let bench = vns::bench_mode();
        let total: u64 = env_or("NETCHANNEL_BENCH_MB", if bench { 200u64 } else { 8 }) << 20;
        let secs: f64 = env_or("NETCHANNEL_BENCH_SECS", if bench { 2.0 } else { 0.2 });
        let conns: usize = env_or("NETCHANNEL_BENCH_CONNS", if bench { 32 } else { 4 });
        if std::env::var_os(remote::PEER_VAR).is_some() {
            let points: String = env_or("NETCHANNEL_BENCH_POINTS", "123".to_string());
            return remote_main(total, secs, conns, &points);
        }
        let Some((bed, rt)) = vns::bed_and_runtime("operating_points") else {
            return;
        };
        println!(
            "operating points on the bed ({} queues, MTU 1500; {} build)",
            vns::bed_queues(),
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
        );
        let points: String = env_or("NETCHANNEL_BENCH_POINTS", "123".to_string());
        if points.contains('1') {
            one_stream(&bed, &rt, total);
        }
        // One kernel server for the rest (point 1's listener is gone with its port).
        let kaddr = vns::kernel_server(&bed, &rt, serve);
        if points.contains('2') {
            short_messages(&bed, &rt, kaddr, conns, secs);
        }
        if points.contains('3') {
            isolation(&bed, &rt, kaddr);
        }
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    run::main();
    #[cfg(not(target_os = "linux"))]
    println!("skipping operating_points: the test bed needs Linux");
}
