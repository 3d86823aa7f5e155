//! 4 KB request/response latency (p50, p99, p99.9) of a `VirtualStream` against kernel TCP
//! (`tokio::net::TcpStream`, `TCP_NODELAY`) over the same veth, and against one raw
//! channel, side by side in one run on the test bed (two queues, MTU 1500).
//!
//! Ping-pong with one request outstanding: the client writes 4096 bytes, the server reads
//! them all and writes 4096 bytes back, the client reads them all; one sample is that
//! round trip. Connections stay open for the whole run; the measurements are interleaved
//! in rounds so that load from other processes falls on all of them alike.
//!
//! - `kernel_nothing_attached`: kernel TCP before any stack runs (tx checksumming off);
//! - with a stack on each end (N throughput channels, by default the stack's, chosen from
//!   the host, and 1 latency channel):
//!   `raw_channel` (one channel between the same `ChannelSet`s, blocking threads),
//!   `virtual_stream` (throughput class; the queues placed where the stacks' scheduler
//!   puts them: on the 2-core bed, the bench's runtime, run to completion),
//!   `virtual_stream_own_runtimes` (the same stream with every queue of both stacks on a
//!   queue runtime of the stack's own, the disaggregated placement),
//!   `virtual_stream_latency` (made latency-class before its connect,
//!   `VirtualSocket::set_app_class`: its chunks use the latency channel only, and it
//!   lives in the stacks' latency shards),
//!   `kernel_xdp_attached` (kernel TCP with both stacks' steering programs attached).
//!
//! Client and server tasks run on one tokio multi-thread runtime with 2 workers (the raw
//! channel uses two plain threads). Environment: `NETCHANNEL_BENCH_SAMPLES` (per
//! measurement, default 20000), `NETCHANNEL_BENCH_ROUNDS` (default 4),
//! `NETCHANNEL_BENCH_CHANNELS` (default: the stack's), `NETCHANNEL_BENCH_ONLY` (a comma-separated
//! list of measurement names: only those are sampled in the rounds, e.g. under a
//! profiler), `NETCHANNEL_BENCH_HIST` (set: also print each measurement's samples in 5 µs
//! buckets, its maximum and how many took over 1 and 5 ms, for reading tails),
//! `NETCHANNEL_BENCH_SLOW_US` (print each exchange of a stream that takes that many µs or
//! more, with its end on `CLOCK_MONOTONIC`, to find it in a `perf record -k CLOCK_MONOTONIC`
//! trace), and where each measurement's exchanges begin and end on that clock.
//!
//! Without `--bench` (`cargo test --all-targets`) it takes 200 samples each, as a smoke
//! test.
//!
//! Remote-peer mode: with `NETCHANNEL_BENCH_PEER=IPV4[:PORT]`,
//! `NETCHANNEL_BENCH_INTERFACE=IFACE` and `NETCHANNEL_BENCH_ADDRESS=IPV4` set, it builds no
//! bed and no server: a netchannel stack on IFACE pings ncperf's 4 KB echo requests (each
//! response checked byte for byte) to `ncperf server -i IFACE -a ADDR` on the peer
//! (`virtual_stream` on PORT, default 7700; `virtual_stream_latency` on its latency
//! application's port PORT+1) and to `ncperf server --kernel -a ADDR`
//! (`kernel_xdp_attached`). `kernel_nothing_attached`, `raw_channel` and
//! `virtual_stream_own_runtimes` are skipped there (they need a peer with no stack, or the
//! server's stack in this process); the first line names the peer.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! `cargo bench -j1 --bench vns_latency`

// support/vns.rs uses support/bed.rs's channel drain.
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
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use netchannel::netdriver::channel::{Channel, ChannelError, Dequeued};
    use netchannel::{AppClass, VirtualStream};
    use testbed::TestBed;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::runtime::Runtime;

    use netchannel::perf_proto::{Op, Requests};

    use super::remote::{self, Remote};
    use super::vns::{self, env_or, Samples, StackPair};

    /// Request and response size.
    const MSG: usize = 4096;
    /// Exchanges before the first round, not counted.
    const WARM_UP: usize = 1000;
    /// Longest wait for one exchange.
    const STEP: Duration = Duration::from_secs(10);

    /// Answers every `MSG`-byte request with `MSG` bytes until EOF.
    async fn echo_server<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
        let mut req = vec![0u8; MSG];
        let resp = vec![0xa5u8; MSG];
        while s.read_exact(&mut req).await.is_ok() {
            if s.write_all(&resp).await.is_err() {
                break;
            }
        }
        let _ = s.shutdown().await;
    }

    /// `NETCHANNEL_BENCH_SLOW_US=n`: the exchanges of a stream that take `n` µs or more are
    /// printed as they come (for reading tails against a trace).
    fn slow_threshold() -> Option<Duration> {
        std::env::var("NETCHANNEL_BENCH_SLOW_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_micros)
    }

    /// One slow exchange: how long it took and when it ended on `CLOCK_MONOTONIC` (the
    /// clock of `perf record -k CLOCK_MONOTONIC`).
    fn print_slow(took: Duration) {
        println!(
            "slow exchange: {} µs, ended at {} s (CLOCK_MONOTONIC)",
            took.as_micros(),
            vns::monotonic_now()
        );
    }

    /// With `NETCHANNEL_BENCH_SLOW_US` set, prints where a measurement's exchanges begin or
    /// end on `CLOCK_MONOTONIC`, so that a trace can be cut to one measurement's rounds.
    fn mark(name: &str, edge: &str) {
        if slow_threshold().is_some() {
            println!(
                "measurement {name} {edge} at {} s (CLOCK_MONOTONIC)",
                vns::monotonic_now()
            );
        }
    }

    /// `n` exchanges on `s` (in a runtime task); returns the stream and the samples.
    fn ping_pong<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        rt: &Runtime,
        s: S,
        n: usize,
        samples: Samples,
    ) -> (S, Samples) {
        rt.block_on(async move {
            tokio::spawn(async move {
                let (mut s, mut samples) = (s, samples);
                let req = vec![0x5au8; MSG];
                let mut resp = vec![0u8; MSG];
                let slow = slow_threshold();
                for _ in 0..n {
                    let t = Instant::now();
                    tokio::time::timeout(STEP, async {
                        s.write_all(&req).await?;
                        s.read_exact(&mut resp).await
                    })
                    .await
                    .expect("exchange timed out")
                    .expect("exchange");
                    let took = t.elapsed();
                    samples.push(took);
                    if slow.is_some_and(|d| took >= d) {
                        print_slow(took);
                    }
                }
                (s, samples)
            })
            .await
            .expect("client task")
        })
    }

    /// Reads exactly `n` bytes from a channel.
    fn channel_read(ch: &Channel, n: usize, pending: &mut Option<Bytes>) -> Result<(), ()> {
        let mut got = 0;
        while got < n {
            let mut b = match pending.take() {
                Some(b) => b,
                None => match ch.dequeue_blocking(Some(STEP)) {
                    Ok(Dequeued::Chunk(b)) => b,
                    _ => return Err(()),
                },
            };
            let take = b.len().min(n - got);
            got += take;
            let _ = b.split_to(take);
            if !b.is_empty() {
                *pending = Some(b);
            }
        }
        Ok(())
    }

    /// `n` exchanges over a raw channel.
    fn channel_ping_pong(ch: &Channel, n: usize, samples: &mut Samples) {
        let req = Bytes::from(vec![0x5au8; MSG]);
        let mut pending = None;
        for _ in 0..n {
            let t = Instant::now();
            ch.enqueue_blocking(req.clone(), Some(STEP))
                .expect("enqueue the request");
            channel_read(ch, MSG, &mut pending).expect("read the response");
            samples.push(t.elapsed());
        }
    }

    /// A raw-channel echo server on B's set: one channel, answered until it ends.
    fn channel_echo(pair: &StackPair, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
        let l = pair
            .channels_b()
            .listen(vns::RAW_CHANNEL_PORT)
            .expect("raw listen");
        std::thread::spawn(move || {
            let ch = loop {
                match l.accept_timeout(Duration::from_millis(100)) {
                    Ok((ch, _)) => break ch,
                    Err(ChannelError::WouldBlockTimeout) if !stop.load(Ordering::Relaxed) => {}
                    Err(_) => return,
                }
            };
            let resp = Bytes::from(vec![0xa5u8; MSG]);
            let mut pending = None;
            while channel_read(&ch, MSG, &mut pending).is_ok() {
                if ch.enqueue_blocking(resp.clone(), Some(STEP)).is_err() {
                    break;
                }
            }
            ch.close();
        })
    }

    struct Row {
        name: &'static str,
        samples: Samples,
    }

    fn print(rows: &mut [Row]) {
        println!();
        println!(
            "{:<26} {:>8} {:>9} {:>9} {:>9} {:>9}   (µs, one 4 KB request + 4 KB response)",
            "measurement", "samples", "p50", "p99", "p99.9", "mean"
        );
        for r in rows.iter_mut() {
            println!(
                "{:<26} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                r.name,
                r.samples.len(),
                r.samples.quantile_us(0.5),
                r.samples.quantile_us(0.99),
                r.samples.quantile_us(0.999),
                r.samples.mean_us()
            );
        }
        // `NETCHANNEL_BENCH_HIST=1`: where the samples lie, in 5 µs steps (for reading tails).
        if std::env::var_os("NETCHANNEL_BENCH_HIST").is_some() {
            let edges: Vec<u64> = (4..=30).map(|i| i * 5).collect();
            println!(
                "histogram, µs bucket lower edges: <20 {:?} (last: and above)",
                edges
            );
            for r in rows.iter_mut() {
                if r.samples.len() > 0 {
                    let max = r.samples.quantile_us(1.0);
                    let long = r.samples.histogram(&[1000, 5000]);
                    println!(
                        "{:<26} {:?} max {max:.0}, {} of 1-5 ms, {} over 5 ms",
                        r.name,
                        r.samples.histogram(&edges),
                        long[1],
                        long[2]
                    );
                }
            }
        }
        println!();
        println!("ratios (same run; > 1: slower than the reference):");
        let find = |rows: &mut [Row], n: &str| rows.iter().position(|r| r.name == n);
        for (a, b) in [
            ("virtual_stream", "kernel_xdp_attached"),
            ("virtual_stream", "kernel_nothing_attached"),
            ("virtual_stream", "raw_channel"),
            ("virtual_stream_own_runtimes", "virtual_stream"),
            ("virtual_stream_own_runtimes", "kernel_xdp_attached"),
            ("virtual_stream_latency", "kernel_xdp_attached"),
            ("virtual_stream_latency", "raw_channel"),
            ("raw_channel", "kernel_xdp_attached"),
            ("kernel_xdp_attached", "kernel_nothing_attached"),
        ] {
            let (Some(i), Some(j)) = (find(rows, a), find(rows, b)) else {
                continue;
            };
            if rows[i].samples.len() == 0 || rows[j].samples.len() == 0 {
                continue;
            }
            let q = |rows: &mut [Row], k: usize, p: f64| rows[k].samples.quantile_us(p);
            println!(
                "{:<52} p50 {:>5.2}  p99 {:>5.2}  p99.9 {:>5.2}",
                format!("{a} / {b}"),
                q(rows, i, 0.5) / q(rows, j, 0.5).max(1e-9),
                q(rows, i, 0.99) / q(rows, j, 0.99).max(1e-9),
                q(rows, i, 0.999) / q(rows, j, 0.999).max(1e-9),
            );
        }
    }

    /// Per queue of both stacks (A's, then B's): polls of its driver, rounds, wake-ups by
    /// enqueues.
    fn queue_counts(pair: &StackPair) -> Vec<[u64; 3]> {
        [pair.channels_a(), pair.channels_b()]
            .iter()
            .flat_map(|set| set.queue_stats())
            .map(|q| [q.polls, q.rounds, q.wakeups])
            .collect()
    }

    /// `NETCHANNEL_BENCH_STATS=1`: what the queues' drivers did during one measurement,
    /// per exchange (for reading where a stream's tail comes from).
    fn print_queue_counts(name: &str, exchanges: usize, before: Vec<[u64; 3]>, pair: &StackPair) {
        if std::env::var_os("NETCHANNEL_BENCH_STATS").is_none() {
            return;
        }
        let after = queue_counts(pair);
        let per = |i: usize| {
            after
                .iter()
                .zip(&before)
                .map(|(a, b)| format!("{:.3}", (a[i] - b[i]) as f64 / exchanges as f64))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "{name}: per exchange, per queue (A's, then B's): polls [{}], rounds [{}], \
             wake-ups [{}]",
            per(0),
            per(1),
            per(2)
        );
    }

    /// `n` exchanges of ncperf's `MSG`-byte requests on `s` (in a runtime task), each
    /// response checked byte for byte against its request; returns the stream and the
    /// samples, or the first exchange that failed.
    fn checked_ping_pong<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        rt: &Runtime,
        s: S,
        n: usize,
        samples: Samples,
    ) -> std::io::Result<(S, Samples)> {
        rt.block_on(async move {
            tokio::spawn(async move {
                let (mut s, mut samples) = (s, samples);
                let mut r = Requests::new(MSG, 0);
                let slow = slow_threshold();
                for _ in 0..n {
                    let t = Instant::now();
                    let what = format!("request {}", r.done());
                    remote::step(&what, r.exchange(&mut s)).await?;
                    let took = t.elapsed();
                    samples.push(took);
                    if slow.is_some_and(|d| took >= d) {
                        print_slow(took);
                    }
                }
                Ok((s, samples))
            })
            .await
            .expect("client task")
        })
    }

    /// The remote-peer mode: ping-pong against `ncperf server` (`virtual_stream` on its
    /// main port; `virtual_stream_latency`, latency class before the connect, on its
    /// latency application's port) and `ncperf server --kernel` (`kernel_xdp_attached`:
    /// both ends run a stack). Skipped: `kernel_nothing_attached` (the peer runs a stack),
    /// `raw_channel` (a channel echo in the server's process) and
    /// `virtual_stream_own_runtimes` (it moves the server's queues too).
    fn remote_main(r: Remote, rt: Runtime, per_round: usize, rounds: usize, warm_up: usize) {
        let fail = |e: std::io::Error| -> ! { remote::fail("vns_latency", e) };
        println!("{}", r.banner("vns_latency"));
        println!(
            "vns_latency: {} samples per measurement in {rounds} rounds, 4 KB each way \
             (ncperf echo requests, each response checked); kernel_nothing_attached, \
             raw_channel and virtual_stream_own_runtimes skipped in remote mode (they need \
             no stack on the peer, or the server's stack in this process)",
            per_round * rounds,
        );
        let channels = r.stack.channels_per_peer();
        let (vs, vl, ks) = rt
            .block_on(async {
                let vs = r.virtual_conn(Op::Echo, false).await?;
                let vl = r.virtual_conn(Op::Echo, true).await?;
                let ks = r.kernel_conn(Op::Echo, false).await?;
                Ok((vs, vl, ks))
            })
            .unwrap_or_else(|e| fail(e));
        let warm = |s, n| checked_ping_pong(&rt, s, n, Samples::default()).map(|(s, _)| s);
        let mut vs = warm(vs, warm_up).unwrap_or_else(|e| fail(e));
        let mut vl = warm(vl, warm_up).unwrap_or_else(|e| fail(e));
        let mut ks = checked_ping_pong(&rt, ks, warm_up, Samples::default())
            .unwrap_or_else(|e| fail(e))
            .0;
        let mut vs_s = Samples::with_capacity(per_round * rounds);
        let mut vl_s = Samples::with_capacity(per_round * rounds);
        let mut ks_s = Samples::with_capacity(per_round * rounds);
        let only = std::env::var("NETCHANNEL_BENCH_ONLY").ok();
        let wanted = |name: &str| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|w| w.trim() == name))
        };
        for round in 0..rounds {
            let t = Instant::now();
            if wanted("virtual_stream") {
                mark("virtual_stream", "begins");
                (vs, vs_s) =
                    checked_ping_pong(&rt, vs, per_round, vs_s).unwrap_or_else(|e| fail(e));
                mark("virtual_stream", "ends");
            }
            if wanted("virtual_stream_latency") {
                mark("virtual_stream_latency", "begins");
                (vl, vl_s) =
                    checked_ping_pong(&rt, vl, per_round, vl_s).unwrap_or_else(|e| fail(e));
                mark("virtual_stream_latency", "ends");
            }
            if wanted("kernel_xdp_attached") {
                mark("kernel_xdp_attached", "begins");
                (ks, ks_s) =
                    checked_ping_pong(&rt, ks, per_round, ks_s).unwrap_or_else(|e| fail(e));
                mark("kernel_xdp_attached", "ends");
            }
            println!("round {round} done in {:.1} s", t.elapsed().as_secs_f64());
        }
        rt.block_on(async {
            remote::close_echo(vs).await?;
            remote::close_echo(vl).await?;
            remote::close_echo(ks).await
        })
        .unwrap_or_else(|e| fail(e));
        r.stop();

        println!();
        println!(
            "vns_latency summary (remote peer; local stack with {channels} throughput + 1 \
             latency channel):"
        );
        let mut rows = vec![
            Row {
                name: "kernel_xdp_attached",
                samples: ks_s,
            },
            Row {
                name: "virtual_stream",
                samples: vs_s,
            },
            Row {
                name: "virtual_stream_latency",
                samples: vl_s,
            },
        ];
        print(&mut rows);
    }

    pub fn main() {
        // `cargo test --all-targets`: a few exchanges of each, as a smoke test.
        let full = vns::bench_mode();
        let total: usize = env_or("NETCHANNEL_BENCH_SAMPLES", if full { 20_000 } else { 200 });
        let rounds: usize = env_or("NETCHANNEL_BENCH_ROUNDS", if full { 4 } else { 1 }).max(1);
        let warm_up = if full { WARM_UP } else { 20 };
        // 0: the stack's default.
        let channels: usize = env_or("NETCHANNEL_BENCH_CHANNELS", 0);
        let per_round = total.div_ceil(rounds);
        if let Some((r, rt)) = remote::start("vns_latency", channels, 1, true) {
            return remote_main(r, rt, per_round, rounds, warm_up);
        }
        let Some((bed, rt)) = vns::bed_and_runtime("vns_latency") else {
            return;
        };
        println!(
            "vns_latency: {} samples per measurement in {rounds} rounds, 4 KB each way, test bed with {} queues, MTU 1500",
            per_round * rounds,
            vns::bed_queues()
        );

        // Kernel TCP: one listener in B serving every connection.
        let kaddr = vns::kernel_server(&bed, &rt, echo_server);
        let kernel_stream = |bed: &TestBed| vns::kernel_stream(bed, &rt, kaddr);

        // 0. Nothing attached.
        let mut k0 = Samples::with_capacity(per_round * rounds);
        let s = kernel_stream(&bed);
        let (s, _) = ping_pong(&rt, s, warm_up, Samples::default());
        mark("kernel_nothing_attached", "begins");
        let (s, k0) = ping_pong(&rt, s, per_round * rounds, std::mem::take(&mut k0));
        mark("kernel_nothing_attached", "ends");
        drop(s);

        // 1. With the stacks.
        let pair = StackPair::start_with(&bed, channels, 1);
        let channels = pair.a.channels_per_peer();
        println!(
            "stacks: {} shards each (NETCHANNEL_BENCH_SHARDS)",
            pair.a.diagnostics().shards()
        );
        let stop = Arc::new(AtomicBool::new(false));
        let echo = channel_echo(&pair, stop.clone());
        let raw = pair
            .channels_a()
            .connect(pair.raw_addr())
            .expect("raw connect");
        let l = rt
            .block_on(pair.b.bind(pair.vns_addr()))
            .expect("bind the virtual listener");
        let a = pair.a.clone();
        let to = pair.vns_addr();
        let (vs, vl) = rt.block_on(async move {
            let server = tokio::spawn(async move {
                // The second stream is the latency one: its server end is latency class too.
                for i in 0..2 {
                    let (s, _) = l.accept().await.expect("accept");
                    if i == 1 {
                        s.set_app_class(AppClass::Latency).expect("latency class");
                    }
                    tokio::spawn(echo_server(s));
                }
            });
            let vs = a.connect(to).await.expect("connect");
            // Latency class before the connect (the stream lives in the latency shard).
            let socket = a.socket();
            socket
                .set_app_class(AppClass::Latency)
                .expect("latency class");
            let vl = socket.connect(to).await.expect("connect");
            server.await.expect("server");
            (vs, vl)
        });
        let ks = kernel_stream(&bed);

        let mut raw_s = Samples::with_capacity(per_round * rounds);
        let mut scratch = Samples::default();
        channel_ping_pong(&raw, warm_up, &mut scratch);
        let (mut vs, _) = ping_pong(&rt, vs, warm_up, Samples::default());
        let (mut vl, _) = ping_pong(&rt, vl, warm_up, Samples::default());
        let (mut ks, _) = ping_pong(&rt, ks, warm_up, Samples::default());
        let mut vs_s = Samples::with_capacity(per_round * rounds);
        let mut vl_s = Samples::with_capacity(per_round * rounds);
        let mut vr_s = Samples::with_capacity(per_round * rounds);
        let mut ks_s = Samples::with_capacity(per_round * rounds);
        let only = std::env::var("NETCHANNEL_BENCH_ONLY").ok();
        let wanted = |name: &str| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|w| w.trim() == name))
        };
        for round in 0..rounds {
            let t = Instant::now();
            if wanted("raw_channel") {
                channel_ping_pong(&raw, per_round, &mut raw_s);
            }
            if wanted("virtual_stream") {
                let before = queue_counts(&pair);
                let s: VirtualStream;
                mark("virtual_stream", "begins");
                (s, vs_s) = ping_pong(&rt, vs, per_round, vs_s);
                mark("virtual_stream", "ends");
                vs = s;
                print_queue_counts("virtual_stream", per_round, before, &pair);
            }
            if wanted("virtual_stream_own_runtimes") {
                // The same stream with every queue on a runtime of its stack's own.
                let placed = pair.own_runtimes();
                let (s, _) = ping_pong(&rt, vs, 50, Samples::default());
                mark("virtual_stream_own_runtimes", "begins");
                let (s, samples) = ping_pong(&rt, s, per_round, vr_s);
                mark("virtual_stream_own_runtimes", "ends");
                vr_s = samples;
                pair.place_back(placed);
                vs = ping_pong(&rt, s, 50, Samples::default()).0;
            }
            if wanted("virtual_stream_latency") {
                let before = queue_counts(&pair);
                let s: VirtualStream;
                mark("virtual_stream_latency", "begins");
                (s, vl_s) = ping_pong(&rt, vl, per_round, vl_s);
                mark("virtual_stream_latency", "ends");
                vl = s;
                print_queue_counts("virtual_stream_latency", per_round, before, &pair);
            }
            if wanted("kernel_xdp_attached") {
                let s: tokio::net::TcpStream;
                mark("kernel_xdp_attached", "begins");
                (s, ks_s) = ping_pong(&rt, ks, per_round, ks_s);
                mark("kernel_xdp_attached", "ends");
                ks = s;
            }
            println!("round {round} done in {:.1} s", t.elapsed().as_secs_f64());
        }
        raw.close();
        rt.block_on(async {
            let _ = vs.shutdown().await;
            let _ = vl.shutdown().await;
            let _ = ks.shutdown().await;
        });
        drop((vs, vl, ks));
        stop.store(true, Ordering::Relaxed);
        echo.join().expect("raw echo thread");
        pair.stop();

        println!();
        println!("vns_latency summary (stacks with {channels} throughput + 1 latency channel):");
        let mut rows = vec![
            Row {
                name: "kernel_nothing_attached",
                samples: k0,
            },
            Row {
                name: "kernel_xdp_attached",
                samples: ks_s,
            },
            Row {
                name: "raw_channel",
                samples: raw_s,
            },
            Row {
                name: "virtual_stream",
                samples: vs_s,
            },
            Row {
                name: "virtual_stream_own_runtimes",
                samples: vr_s,
            },
            Row {
                name: "virtual_stream_latency",
                samples: vl_s,
            },
        ];
        print(&mut rows);
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    run::main();
    #[cfg(not(target_os = "linux"))]
    println!("skipping vns_latency: the test bed is Linux only");
}
