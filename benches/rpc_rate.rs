//! Closed-loop request/response rate of `VirtualStream`s against kernel TCP
//! (`tokio::net::TcpStream`, `TCP_NODELAY`) over the same veth, side by side in one run on
//! the test bed (two queues, MTU 1500, offloads at the bed's settings).
//!
//! Each of C connections has one request outstanding at a time: the client writes a
//! request of S bytes (a per-request counter, then a pattern), the server echoes what it
//! reads, and the client reads S bytes back and checks them byte for byte before sending
//! the next. The rate is completed requests over the measurement's wall time, all
//! connections together. Sizes 64 B and 4 KB; C = 1, 8, 32, 128. The measurements are
//! interleaved (VirtualStream, kernel, then kernel, VirtualStream in the next round) so
//! that load from other processes falls on both alike; the table gives each one's median
//! over the rounds and the ratio of the medians, and the per-round ratios' spread.
//!
//! Client and server tasks run on one tokio multi-thread runtime with 2 workers; both
//! stacks run on the same 2 cores. Environment: `NETCHANNEL_BENCH_SECS` (per measurement,
//! default 2), `NETCHANNEL_BENCH_ROUNDS` (default 3), `NETCHANNEL_BENCH_CHANNELS`
//! (throughput channels per peer; default: the stack's, chosen from the host),
//! `NETCHANNEL_BENCH_CONNS` (comma-separated,
//! default `1,8,32,128`), `NETCHANNEL_BENCH_SIZES` (default `64,4096`),
//! `NETCHANNEL_BENCH_ONLY` (`virtual` or `kernel`: measure one side only, for profiling),
//! `NETCHANNEL_BENCH_STATS` (set: print both stacks' `Diagnostics::stats` as JSON after each
//! round: which channel carried how much, on which queue).
//! Each round also measures the VirtualStreams with every NIC queue of both stacks driven
//! by a queue runtime of the stack's own (queue *i* on runtime *i*: the disaggregated
//! placement, moved there at run time with `ChannelSet::move_queue`, and back to where
//! the scheduler placed them after), column `vs_own_runtimes`;
//! `NETCHANNEL_BENCH_OWN_RUNTIMES=0` skips it. `NETCHANNEL_BENCH_PLACEMENT=own` starts the
//! stacks on their own runtimes in the first place. A second table gives the
//! process's CPU time per request (`getrusage`, user and system: both stacks, the runtime
//! and the kernel's work in their system calls), which on a closed loop that leaves cores
//! idle says more about per-message cost than the rate alone.
//!
//! Without `--bench` (`cargo test --all-targets`) it runs 1 and 8 connections for 0.1 s
//! each, as a smoke test that checks every response.
//!
//! Remote-peer mode: with `NETCHANNEL_BENCH_PEER=IPV4[:PORT]`,
//! `NETCHANNEL_BENCH_INTERFACE=IFACE` and `NETCHANNEL_BENCH_ADDRESS=IPV4` set, it builds no
//! bed and no server: one netchannel stack on IFACE runs the client side against
//! `ncperf server -i IFACE -a ADDR` (virtual streams) and `ncperf server --kernel -a ADDR`
//! (kernel TCP) on the peer, both on PORT (default 7700), with ncperf's hello and
//! requests, every response checked byte for byte. The first line names the peer. The
//! `vs_own_runtimes` column is skipped (it moves the queues of both stacks, and the
//! server's is in another process), and the CPU table is the client process's alone.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! `cargo bench -j1 --bench rpc_rate`

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
    use std::io;
    use std::time::{Duration, Instant};

    use netchannel::perf_proto::{Op, Requests};
    use netchannel::VirtualStream;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::runtime::Runtime;

    use super::remote::{self, Remote};
    use super::vns::{self, env_or, spread, StackPair};

    /// Longest wait for one exchange before the bench gives up.
    const STEP: Duration = Duration::from_secs(10);

    /// Echoes whatever it reads until EOF.
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
        let _ = s.shutdown().await;
    }

    /// Closed-loop requests of `size` bytes on `s` until `until` (ncperf's requests, each
    /// response checked byte for byte); returns the stream and the number of verified
    /// responses, or the first failed exchange.
    async fn client<S: AsyncRead + AsyncWrite + Unpin>(
        mut s: S,
        size: usize,
        until: Instant,
        tag: u64,
    ) -> (S, io::Result<u64>) {
        let mut r = Requests::new(size, tag);
        while Instant::now() < until {
            let done = r.done();
            let exchange = tokio::time::timeout(STEP, r.exchange(&mut s)).await;
            let failed = match exchange {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(_) => io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("request {done} of connection {tag}: no answer within {STEP:?}"),
                ),
            };
            return (s, Err(failed));
        }
        let done = r.done();
        (s, Ok(done))
    }

    /// The process's user and system CPU time so far, µs (both stacks, their threads, the
    /// runtime, and the kernel work done in their system calls and softirqs).
    fn cpu_us() -> (f64, f64) {
        // SAFETY: getrusage only writes the struct it is given.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_SELF is always valid.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        if rc != 0 {
            return (f64::NAN, f64::NAN);
        }
        let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
        (us(ru.ru_utime), us(ru.ru_stime))
    }

    /// One measurement: requests/s and the process's CPU µs per request (user, system).
    #[derive(Clone, Copy)]
    struct Rate {
        per_s: f64,
        user_us: f64,
        sys_us: f64,
    }

    const NO_RATE: Rate = Rate {
        per_s: f64::NAN,
        user_us: f64::NAN,
        sys_us: f64::NAN,
    };

    /// Runs `client` on the first `n` streams at once for `secs`; returns requests/s and
    /// CPU time per request, or the first exchange that failed.
    fn measure<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        rt: &Runtime,
        streams: &mut Vec<S>,
        n: usize,
        size: usize,
        secs: f64,
    ) -> io::Result<Rate> {
        let mut rest = streams.split_off(n);
        let taken = std::mem::take(streams);
        let (u0, s0) = cpu_us();
        let (back, total, elapsed, first_err) = rt.block_on(async move {
            let start = Instant::now();
            let until = start + Duration::from_secs_f64(secs);
            let tasks: Vec<_> = taken
                .into_iter()
                .enumerate()
                .map(|(i, s)| tokio::spawn(client(s, size, until, i as u64)))
                .collect();
            let mut back = Vec::with_capacity(tasks.len());
            let mut total = 0;
            let mut first_err = None;
            for t in tasks {
                let (s, done) = t.await.expect("client task");
                back.push(s);
                match done {
                    Ok(n) => total += n,
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            (back, total, start.elapsed(), first_err)
        });
        let (u1, s1) = cpu_us();
        *streams = back;
        streams.append(&mut rest);
        if let Some(e) = first_err {
            return Err(e);
        }
        let done = (total as f64).max(1.0);
        Ok(Rate {
            per_s: total as f64 / elapsed.as_secs_f64(),
            user_us: (u1 - u0) / done,
            sys_us: (s1 - s0) / done,
        })
    }

    fn list(name: &str, default: &str) -> Vec<usize> {
        std::env::var(name)
            .unwrap_or_else(|_| default.to_string())
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect()
    }

    /// The bench's settings, from the environment.
    struct Params {
        secs: f64,
        rounds: usize,
        channels: usize,
        conns: Vec<usize>,
        sizes: Vec<usize>,
        run_v: bool,
        run_k: bool,
        own_runtimes: bool,
    }

    impl Params {
        fn from_env() -> Params {
            let full = vns::bench_mode();
            // For profiling one side: `virtual` or `kernel` skips the other's measurements.
            let only = std::env::var("NETCHANNEL_BENCH_ONLY").unwrap_or_default();
            Params {
                secs: env_or("NETCHANNEL_BENCH_SECS", if full { 2.0 } else { 0.1 }),
                rounds: env_or("NETCHANNEL_BENCH_ROUNDS", if full { 3 } else { 1 }).max(1),
                // 0: the stack's default.
                channels: env_or("NETCHANNEL_BENCH_CHANNELS", 0),
                conns: list(
                    "NETCHANNEL_BENCH_CONNS",
                    if full { "1,8,32,128" } else { "1,8" },
                ),
                sizes: list("NETCHANNEL_BENCH_SIZES", "64,4096"),
                run_v: only != "kernel",
                run_k: only != "virtual",
                // `NETCHANNEL_BENCH_OWN_RUNTIMES=0` skips the third measurement.
                own_runtimes: env_or("NETCHANNEL_BENCH_OWN_RUNTIMES", 1u8) != 0,
            }
        }

        fn max_conns(&self) -> usize {
            self.conns.iter().copied().max().unwrap_or(1)
        }
    }

    /// rates[size][conns] = (virtual per round, kernel per round, virtual with every
    /// queue on a runtime of its stack's own per round)
    type Rates = Vec<Vec<(Vec<Rate>, Vec<Rate>, Vec<Rate>)>>;

    /// A failed measurement stops the bench with one line.
    fn ok<T>(r: io::Result<T>) -> T {
        r.unwrap_or_else(|e| remote::fail("rpc_rate", e))
    }

    /// The measurement rounds over `virt` and `kernel`; the own-runtimes column where
    /// `pair` holds both stacks (the local bed); `after_round` after each round.
    fn run_rounds(
        rt: &Runtime,
        p: &Params,
        virt: &mut Vec<VirtualStream>,
        kernel: &mut Vec<TcpStream>,
        pair: Option<&StackPair>,
        after_round: impl Fn(),
    ) -> Rates {
        let (run_v, run_k, secs) = (p.run_v, p.run_k, p.secs);
        let max_conns = p.max_conns();
        // Warm-up: every connection once, of each kind measured (a profile of one side
        // then holds none of the other's requests).
        if run_v {
            ok(measure(rt, virt, max_conns, 64, secs.min(0.2)));
        }
        if run_k {
            ok(measure(rt, kernel, max_conns, 64, secs.min(0.2)));
        }
        let mut rates: Rates =
            vec![vec![(Vec::new(), Vec::new(), Vec::new()); p.conns.len()]; p.sizes.len()];
        for round in 0..p.rounds {
            let t = Instant::now();
            for (si, &size) in p.sizes.iter().enumerate() {
                for (ci, &c) in p.conns.iter().enumerate() {
                    let mut v = |rt: &Runtime| {
                        if run_v {
                            ok(measure(rt, virt, c, size, secs))
                        } else {
                            NO_RATE
                        }
                    };
                    let mut k = |rt: &Runtime| {
                        if run_k {
                            ok(measure(rt, kernel, c, size, secs))
                        } else {
                            NO_RATE
                        }
                    };
                    let (v, k) = if round % 2 == 0 {
                        let v = v(rt);
                        (v, k(rt))
                    } else {
                        let k = k(rt);
                        (v(rt), k)
                    };
                    // The same streams with every queue on a runtime of its stack's own.
                    let t = match pair {
                        Some(pair) if run_v && p.own_runtimes => {
                            let placed = pair.own_runtimes();
                            let t = ok(measure(rt, virt, c, size, secs));
                            pair.place_back(placed);
                            t
                        }
                        _ => NO_RATE,
                    };
                    rates[si][ci].0.push(v);
                    rates[si][ci].1.push(k);
                    rates[si][ci].2.push(t);
                }
            }
            println!("round {round} done in {:.1} s", t.elapsed().as_secs_f64());
            after_round();
        }
        rates
    }

    pub fn main() {
        let p = Params::from_env();
        if let Some((remote, rt)) = remote::start("rpc_rate", p.channels, 0, p.run_k) {
            return remote_main(&p, remote, rt);
        }
        let (secs, rounds, channels) = (p.secs, p.rounds, p.channels);
        let (conns, sizes) = (&p.conns, &p.sizes);
        let max_conns = p.max_conns();
        let Some((bed, rt)) = vns::bed_and_runtime("rpc_rate") else {
            return;
        };
        let pair = StackPair::start(&bed, channels);
        println!(
            "rpc_rate: closed loop, {secs} s per measurement, {rounds} rounds, sizes {sizes:?}, \
             connections {conns:?}, {} channels per peer ({}; NETCHANNEL_BENCH_CHANNELS), \
             test bed with {} queues, MTU 1500",
            pair.a.channels_per_peer(),
            if channels == 0 {
                "the stack's default"
            } else {
                "set"
            },
            vns::bed_queues()
        );
        println!(
            "stacks: {} shards each (NETCHANNEL_BENCH_SHARDS); queues driven by {}",
            pair.a.diagnostics().shards(),
            pair.a.diagnostics().channel_placement()
        );
        // Kernel TCP: a listener in B echoing on every connection.
        let kaddr = vns::kernel_server(&bed, &rt, echo);
        let mut kernel: Vec<TcpStream> = (0..max_conns)
            .map(|_| vns::kernel_stream(&bed, &rt, kaddr))
            .collect();
        // VirtualStreams: B's listener echoing on every accepted stream.
        let l = rt
            .block_on(pair.b.bind(pair.vns_addr()))
            .expect("bind the virtual listener");
        rt.spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(echo(s));
            }
        });
        let a = pair.a.clone();
        let to = pair.vns_addr();
        let mut virt: Vec<VirtualStream> = rt.block_on(async move {
            let mut v = Vec::with_capacity(max_conns);
            for _ in 0..max_conns {
                v.push(a.connect(to).await.expect("connect"));
            }
            v
        });
        let rates = run_rounds(&rt, &p, &mut virt, &mut kernel, Some(&pair), || {
            if std::env::var_os("NETCHANNEL_BENCH_STATS").is_some() {
                for (n, st) in [("A", &pair.a), ("B", &pair.b)] {
                    let json = serde_json::to_string(&st.diagnostics().stats()).unwrap_or_default();
                    println!("stats {n}: {json}");
                }
                for (n, set) in [("A", pair.channels_a()), ("B", pair.channels_b())] {
                    for q in set.queue_stats() {
                        println!(
                            "queue {n}{} on {}: busy {:?}, rounds {}, polls {}, wake-ups {}",
                            q.queue, q.place, q.busy, q.rounds, q.polls, q.wakeups
                        );
                    }
                }
            }
        });
        rt.block_on(async {
            for s in virt.iter_mut() {
                let _ = s.shutdown().await;
            }
            for s in kernel.iter_mut() {
                let _ = s.shutdown().await;
            }
        });
        drop((virt, kernel));
        pair.stop();
        print_tables(&p, &rates, false);
    }

    /// The remote-peer mode: the same measurements from one local stack against an
    /// `ncperf server` (netchannel) and an `ncperf server --kernel` on the peer, both
    /// echoing (ncperf's `Echo` connections). The own-runtimes column is skipped: it
    /// moves the queues of both stacks, and the server's stack is in another process.
    fn remote_main(p: &Params, remote: Remote, rt: Runtime) {
        let (secs, rounds, conns, sizes) = (p.secs, p.rounds, &p.conns, &p.sizes);
        println!("{}", remote.banner("rpc_rate"));
        println!(
            "rpc_rate: closed loop, {secs} s per measurement, {rounds} rounds, sizes {sizes:?}, \
             connections {conns:?}, {} channels per peer ({}; NETCHANNEL_BENCH_CHANNELS); \
             vs_own_runtimes skipped in remote mode (it moves both stacks' queues); CPU time \
             is this process's only (the client side)",
            remote.stack.channels_per_peer(),
            if p.channels == 0 {
                "the stack's default"
            } else {
                "set"
            },
        );
        let max_conns = p.max_conns();
        let (mut virt, mut kernel) = rt
            .block_on(async {
                let mut v = Vec::with_capacity(max_conns);
                let mut k = Vec::with_capacity(max_conns);
                for _ in 0..max_conns {
                    if p.run_v {
                        v.push(remote.virtual_conn(Op::Echo, false).await?);
                    }
                    if p.run_k {
                        k.push(remote.kernel_conn(Op::Echo, false).await?);
                    }
                }
                Ok::<_, io::Error>((v, k))
            })
            .unwrap_or_else(|e| {
                remote::fail("rpc_rate", format!("opening {max_conns} connections: {e}"))
            });
        let stack = remote.stack.clone();
        let rates = run_rounds(&rt, p, &mut virt, &mut kernel, None, || {
            if std::env::var_os("NETCHANNEL_BENCH_STATS").is_some() {
                let json = serde_json::to_string(&stack.diagnostics().stats()).unwrap_or_default();
                println!("stats (local stack): {json}");
            }
        });
        let closed = rt.block_on(async {
            for s in virt {
                remote::close_echo(s).await?;
            }
            for s in kernel {
                remote::close_echo(s).await?;
            }
            Ok::<_, io::Error>(())
        });
        remote.stop();
        ok(closed);
        print_tables(p, &rates, true);
    }

    /// The summary tables: requests/s and their ratios, CPU per request.
    fn print_tables(p: &Params, rates: &Rates, remote: bool) {
        let (rounds, conns, sizes) = (p.rounds, &p.conns, &p.sizes);
        println!();
        println!(
            "rpc_rate summary (requests/s, median of {rounds} rounds; ratio = virtual / kernel):"
        );
        println!(
            "{:>6} {:>6} {:>14} {:>14} {:>8}   per-round ratios [min-max]   {:>14} {:>8} [min-max]",
            "size", "conns", "virtual_stream", "kernel_tcp", "ratio", "vs_own_runtimes", "own/vs"
        );
        for (si, &size) in sizes.iter().enumerate() {
            for (ci, &c) in conns.iter().enumerate() {
                let (vr, kr, tr) = &rates[si][ci];
                let rate = |r: &[Rate]| r.iter().map(|r| r.per_s).collect::<Vec<_>>();
                let (v, k, t) = (&rate(vr), &rate(kr), &rate(tr));
                let (_, vm, _) = spread(v);
                let (_, km, _) = spread(k);
                let (_, tm, _) = spread(t);
                let per: Vec<f64> = v.iter().zip(k).map(|(a, b)| a / b.max(1e-9)).collect();
                let (lo, _, hi) = spread(&per);
                let own = if remote {
                    format!("{:>14} {:>8} [skipped: remote]", "-", "-")
                } else {
                    let per_t: Vec<f64> = t.iter().zip(v).map(|(a, b)| a / b.max(1e-9)).collect();
                    let (tlo, _, thi) = spread(&per_t);
                    format!("{tm:>14.0} {:>8.2} [{tlo:.2}-{thi:.2}]", tm / vm.max(1e-9))
                };
                println!(
                    "{size:>6} {c:>6} {vm:>14.0} {km:>14.0} {:>8.2}   [{lo:.2}-{hi:.2}]   {own}",
                    vm / km.max(1e-9),
                );
            }
        }
        println!();
        println!(
            "CPU per request (µs of process time, user + system, median of {rounds} rounds; \
             ratio = virtual / kernel, lower is better{}):",
            if remote {
                "; this process only, the client side"
            } else {
                ""
            }
        );
        println!(
            "{:>6} {:>6} {:>22} {:>22} {:>8}",
            "size", "conns", "virtual_stream u+s", "kernel_tcp u+s", "ratio"
        );
        for (si, &size) in sizes.iter().enumerate() {
            for (ci, &c) in conns.iter().enumerate() {
                let (vr, kr, _) = &rates[si][ci];
                let med = |r: &[Rate], f: fn(&Rate) -> f64| {
                    spread(&r.iter().map(f).collect::<Vec<_>>()).1
                };
                let (vu, vs) = (med(vr, |r| r.user_us), med(vr, |r| r.sys_us));
                let (ku, ks) = (med(kr, |r| r.user_us), med(kr, |r| r.sys_us));
                println!(
                    "{size:>6} {c:>6} {:>10.1} {:>5.1}+{:<5.1} {:>10.1} {:>5.1}+{:<5.1} {:>8.2}",
                    vu + vs,
                    vu,
                    vs,
                    ku + ks,
                    ku,
                    ks,
                    (vu + vs) / (ku + ks).max(1e-9)
                );
            }
        }
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    run::main();
    #[cfg(not(target_os = "linux"))]
    println!("skipping rpc_rate: the test bed is Linux only");
}
