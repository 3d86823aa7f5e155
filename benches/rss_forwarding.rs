//! What frames forwarded between a channel set's queues cost, on the plain veth bed and on
//! the RSS bed with and without RSS alignment, in one run: how many received frames each
//! side forwards, and the bulk goodput and request/response rate beside them.
//!
//! On veth a frame arrives on the queue its sender transmitted on, so channels between two
//! channel sets are served where their frames land and nothing is forwarded. On the RSS bed
//! (`TestBed::builder().rss`) the receiver's RSS picks the queue from the 4-tuple, as a NIC
//! does: a channel whose local port was not chosen for its queue gets its frames on another
//! queue, which hands each one over (`ChannelSet::forwarded_frames`). A aligned
//! (`RssAlignment::Known`, the bed's table for A) chooses each local port so that B's
//! replies land on the channel's queue; `RssAlignment::Off` takes ports in turn, whatever queue
//! the replies land on.
//!
//! For each row: a fresh bed, two channel sets (4 queues), B listening on a channel port,
//! then two measurements on the same sets:
//!
//! - bulk: A opens `NETCHANNEL_BENCH_CHANNELS` channels (default 8, spread over A's queues
//!   round-robin) one after another, each carrying `NETCHANNEL_BENCH_MIB` MiB (default 16)
//!   to B; Gbit/s of payload;
//! - request/response: A opens the same number of channels at once, each a closed loop
//!   for `NETCHANNEL_BENCH_SECS` seconds (default 2) on its own thread: a request of
//!   `NETCHANNEL_BENCH_SIZE` bytes (default 64; a per-request counter, then a pattern),
//!   which B's echo thread for that channel hands back as it dequeued it, checked byte
//!   for byte before the next; requests/s of all channels together. Each channel makes
//!   one exchange before the clock (and the counters) start, so the handshake is outside.
//!
//! Each measurement prints, per side, the frames its queues received for owned flows (the
//! steering program's redirects) and those forwarded during it, and A's channels by
//! steering (aligned/forwarded, cumulative for the set). `NETCHANNEL_BENCH_ROUNDS` rounds
//! (default 3); the rows run in turn within a round, in reverse order every other round,
//! so that drift from other load on the host falls on all of them alike. A last table gives
//! each row's medians over the rounds and the ratio to the veth row's medians. The load
//! average is printed before and after.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! Without `--bench` (`cargo test --all-targets`) it runs one round, 1 MiB per channel and
//! 0.1 s of requests, as a smoke test that checks every response.
//! `cargo bench --no-run -j2 --bench rss_forwarding`, then
//! `target/release/deps/rss_forwarding-<hash> --bench`.

#[cfg(target_os = "linux")]
#[path = "support/bed.rs"]
mod bed;

#[cfg(target_os = "linux")]
mod run {
    use std::net::SocketAddrV4;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use netchannel::netdriver::channel::{
        Channel, ChannelError, ChannelListener, ChannelSet, ChannelSetConfig, Dequeued,
        RssAlignment,
    };
    use netchannel::netdriver::rss::RssConfig;
    use testbed::{RssTable, Side, TestBed, TestBedBuilder};

    use super::bed;

    const QUEUES: u32 = 4;
    /// B's port for the bulk transfers.
    const BULK_PORT: u16 = 9100;
    /// B's port for the echoed requests.
    const ECHO_PORT: u16 = 9101;
    /// Longest wait for one exchange before the bench gives up.
    const STEP: Duration = Duration::from_secs(10);

    fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    fn load_average() -> String {
        std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "?".to_string())
    }

    fn set_in(bed: &TestBed, side: Side, rss: RssAlignment) -> ChannelSet {
        let e = bed.side(side).clone();
        bed.run_in(side, move || {
            let mut config = ChannelSetConfig::new(e.ifname.clone(), e.ipv4);
            config.rss = rss;
            ChannelSet::start(config).expect("set")
        })
        .expect("run in the namespace")
    }

    /// Frames received for owned flows and frames forwarded, of A and of B.
    #[derive(Clone, Copy, Default)]
    struct Frames {
        a_rx: u64,
        a_fwd: u64,
        b_rx: u64,
        b_fwd: u64,
    }

    impl Frames {
        fn now(a: &ChannelSet, b: &ChannelSet) -> Frames {
            let rx = |s: &ChannelSet| s.steering_counters().map_or(0, |c| c.redirected);
            Frames {
                a_rx: rx(a),
                a_fwd: a.forwarded_frames().0,
                b_rx: rx(b),
                b_fwd: b.forwarded_frames().0,
            }
        }

        fn since(self, before: Frames) -> Frames {
            Frames {
                a_rx: self.a_rx.saturating_sub(before.a_rx),
                a_fwd: self.a_fwd.saturating_sub(before.a_fwd),
                b_rx: self.b_rx.saturating_sub(before.b_rx),
                b_fwd: self.b_fwd.saturating_sub(before.b_fwd),
            }
        }

        /// A's forwarded frames as a share of those it received, %.
        fn a_share(&self) -> f64 {
            100.0 * self.a_fwd as f64 / (self.a_rx as f64).max(1.0)
        }
    }

    /// Moves `channels` × `bytes` from A to B; returns Gbit/s and the frames counted.
    fn bulk(
        bed: &TestBed,
        a: &ChannelSet,
        b: &ChannelSet,
        channels: u32,
        bytes: u64,
    ) -> (f64, Frames) {
        let sink = bed::ChannelSink::start(b.listen(BULK_PORT).expect("listen"), bytes);
        let target = SocketAddrV4::new(bed.side(Side::B).ipv4, BULK_PORT);
        let block = Bytes::from(vec![0x5a; 64 << 10]);
        let before = Frames::now(a, b);
        let start = Instant::now();
        for _ in 0..channels {
            bed::channel_send(a, target, &block, bytes);
        }
        let took = start.elapsed();
        let frames = Frames::now(a, b).since(before);
        sink.stop();
        (bed::gbps(u64::from(channels) * bytes, took), frames)
    }

    /// B's side of the requests: one echo thread per accepted channel, each handing back
    /// every chunk it dequeues until the peer closes.
    struct EchoServer {
        stop: Arc<AtomicBool>,
        thread: std::thread::JoinHandle<()>,
    }

    impl EchoServer {
        fn start(listener: ChannelListener) -> EchoServer {
            let stop = Arc::new(AtomicBool::new(false));
            let halt = Arc::clone(&stop);
            let thread = std::thread::spawn(move || {
                let mut echoes = Vec::new();
                while !halt.load(Ordering::Relaxed) {
                    match listener.accept_timeout(Duration::from_millis(50)) {
                        Ok((ch, _)) => echoes.push(std::thread::spawn(move || echo(&ch))),
                        Err(ChannelError::WouldBlockTimeout) => continue,
                        Err(_) => break,
                    }
                }
                for e in echoes {
                    e.join().expect("echo thread");
                }
            });
            EchoServer { stop, thread }
        }

        fn stop(self) {
            self.stop.store(true, Ordering::Relaxed);
            self.thread.join().expect("echo server");
        }
    }

    fn echo(ch: &Channel) {
        loop {
            match ch.dequeue_blocking(Some(STEP)) {
                Ok(Dequeued::Chunk(c)) => {
                    if ch.enqueue_blocking(c, Some(STEP)).is_err() {
                        break;
                    }
                }
                Ok(Dequeued::Finished) => {
                    ch.close();
                    return;
                }
                Ok(Dequeued::Empty) | Err(_) => break,
            }
        }
        ch.abort();
    }

    /// One request of `size` bytes on `ch` (`n` in its first 8 bytes, then a pattern),
    /// waiting for every byte of the echo and checking it.
    fn exchange(ch: &Channel, n: u64, size: usize, buf: &mut Vec<u8>) {
        let mut request = vec![0u8; size];
        for (i, b) in request.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31) ^ n as u8;
        }
        let head = size.min(8);
        request[..head].copy_from_slice(&n.to_le_bytes()[..head]);
        ch.enqueue_blocking(Bytes::from(request.clone()), Some(STEP))
            .unwrap_or_else(|e| panic!("request {n}: {e}"));
        buf.clear();
        while buf.len() < size {
            match ch.dequeue_blocking(Some(STEP)) {
                Ok(Dequeued::Chunk(c)) => buf.extend_from_slice(&c),
                Ok(Dequeued::Empty) => panic!("request {n}: no answer within {STEP:?}"),
                Ok(Dequeued::Finished) => panic!("request {n}: the echo closed"),
                Err(e) => panic!("request {n}: {e}"),
            }
        }
        assert_eq!(&buf[..], &request[..], "echo of request {n}");
    }

    /// `channels` closed loops of `size`-byte requests from A to B's echo for `secs`;
    /// returns requests/s and the frames counted while the clock ran.
    fn requests(
        bed: &TestBed,
        a: &ChannelSet,
        b: &ChannelSet,
        channels: u32,
        size: usize,
        secs: f64,
    ) -> (f64, Frames) {
        let server = EchoServer::start(b.listen(ECHO_PORT).expect("listen"));
        let target = SocketAddrV4::new(bed.side(Side::B).ipv4, ECHO_PORT);
        let n = channels as usize;
        // Everyone once after the first exchange (then the counters are read), and once
        // more to start the clock.
        let ready = Arc::new(Barrier::new(n + 1));
        let go = Arc::new(Barrier::new(n + 1));
        let clients: Vec<_> = (0..n)
            .map(|_| {
                let ch = a.connect(target).expect("channel connect");
                let (ready, go) = (Arc::clone(&ready), Arc::clone(&go));
                std::thread::spawn(move || {
                    let mut buf = Vec::with_capacity(size);
                    exchange(&ch, 0, size, &mut buf);
                    ready.wait();
                    go.wait();
                    let until = Instant::now() + Duration::from_secs_f64(secs);
                    let mut done = 0u64;
                    while Instant::now() < until {
                        done += 1;
                        exchange(&ch, done, size, &mut buf);
                    }
                    ch.close();
                    match ch.dequeue_blocking(Some(STEP)) {
                        Ok(Dequeued::Finished) => {}
                        other => panic!("no FIN from the echo: {other:?}"),
                    }
                    done
                })
            })
            .collect();
        ready.wait();
        let before = Frames::now(a, b);
        let start = Instant::now();
        go.wait();
        let total: u64 = clients
            .into_iter()
            .map(|c| c.join().expect("client thread"))
            .sum();
        let took = start.elapsed().as_secs_f64();
        let frames = Frames::now(a, b).since(before);
        server.stop();
        (total as f64 / took, frames)
    }

    /// One row's measurements in one round.
    #[derive(Clone, Copy, Default)]
    struct Sample {
        gbps: f64,
        bulk: Frames,
        per_s: f64,
        rpc: Frames,
        aligned: u64,
        forwarded: u64,
    }

    fn median(xs: impl Iterator<Item = f64>) -> f64 {
        let mut v: Vec<f64> = xs.collect();
        bed::median(&mut v)
    }

    fn median_u(xs: impl Iterator<Item = u64>) -> u64 {
        median(xs.map(|x| x as f64)).round() as u64
    }

    pub fn main() {
        let bench = std::env::args().any(|a| a == "--bench");
        let channels: u32 = env_or("NETCHANNEL_BENCH_CHANNELS", 8);
        let mib: u64 = env_or("NETCHANNEL_BENCH_MIB", if bench { 16 } else { 1 });
        let secs: f64 = env_or("NETCHANNEL_BENCH_SECS", if bench { 2.0 } else { 0.1 });
        let size: usize = env_or("NETCHANNEL_BENCH_SIZE", 64);
        let rounds: usize = env_or("NETCHANNEL_BENCH_ROUNDS", if bench { 3 } else { 1 }).max(1);
        let key: Vec<u8> = (0u8..40).map(|i| i.wrapping_mul(73) ^ 0xa5).collect();
        let table = || RssTable::spread(&key, 128, QUEUES).expect("table");
        let rss_a = {
            let t = table();
            RssConfig::toeplitz(t.key(), t.indirection()).expect("RSS")
        };
        let rows: [(&str, RssAlignment); 3] = [
            ("veth", RssAlignment::Probe),
            ("rss, alignment off", RssAlignment::Off),
            ("rss, aligned", RssAlignment::Known(rss_a)),
        ];
        let builder = |row: usize| -> TestBedBuilder {
            let b = TestBed::builder().queues(QUEUES);
            if row == 0 {
                b
            } else {
                b.rss(table(), table())
            }
        };
        println!(
            "{QUEUES} queues, {channels} channels; bulk {mib} MiB per channel; \
             requests of {size} B for {secs} s; {rounds} rounds; load average {}",
            load_average()
        );
        println!(
            "{:<5} {:<19} {:<5} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8}",
            "round", "bed", "load", "rate", "A rx", "A fwd", "B rx", "B fwd", "A fwd%", "A al/fwd"
        );
        let mut samples = vec![Vec::<Sample>::new(); rows.len()];
        for round in 0..rounds {
            let order: Vec<usize> = if round % 2 == 0 {
                (0..rows.len()).collect()
            } else {
                (0..rows.len()).rev().collect()
            };
            for i in order {
                let (name, rss) = &rows[i];
                let bed = match builder(i).build() {
                    Ok(bed) => bed,
                    Err(e) => {
                        println!("skipping rss_forwarding: {e}");
                        return;
                    }
                };
                let a = set_in(&bed, Side::A, rss.clone());
                let b = set_in(&bed, Side::B, RssAlignment::Probe);
                let (gbps, bulk_frames) = bulk(&bed, &a, &b, channels, mib << 20);
                let (per_s, rpc_frames) = requests(&bed, &a, &b, channels, size, secs);
                let steered = a.steering_counts();
                let s = Sample {
                    gbps,
                    bulk: bulk_frames,
                    per_s,
                    rpc: rpc_frames,
                    aligned: steered.aligned,
                    forwarded: steered.forwarded,
                };
                for (load, rate, f) in [
                    ("bulk", format!("{gbps:.2} Gb/s"), s.bulk),
                    ("rpc", format!("{:.0}/s", per_s), s.rpc),
                ] {
                    println!(
                        "{round:<5} {name:<19} {load:<5} {rate:>10} {:>9} {:>9} {:>9} {:>9} {:>6.1} {:>8}",
                        f.a_rx,
                        f.a_fwd,
                        f.b_rx,
                        f.b_fwd,
                        f.a_share(),
                        format!("{}/{}", s.aligned, s.forwarded),
                    );
                }
                samples[i].push(s);
                a.shutdown().expect("stop A's set");
                b.shutdown().expect("stop B's set");
            }
        }
        println!("load average after: {}", load_average());
        println!();
        println!("medians over {rounds} rounds (ratio: to the veth row's median)");
        println!(
            "{:<19} {:>7} {:>6} {:>10} {:>6} {:>8} {:>8} {:>8} {:>8}",
            "bed", "Gbit/s", "ratio", "req/s", "ratio", "bulk fwd", "bulk rx", "rpc fwd", "rpc rx"
        );
        let base = (
            median(samples[0].iter().map(|s| s.gbps)),
            median(samples[0].iter().map(|s| s.per_s)),
        );
        for ((name, _), s) in rows.iter().zip(&samples) {
            let g = median(s.iter().map(|s| s.gbps));
            let r = median(s.iter().map(|s| s.per_s));
            println!(
                "{name:<19} {g:>7.2} {:>6.2} {r:>10.0} {:>6.2} {:>8} {:>8} {:>8} {:>8}",
                g / base.0.max(1e-12),
                r / base.1.max(1e-12),
                median_u(s.iter().map(|s| s.bulk.a_fwd + s.bulk.b_fwd)),
                median_u(s.iter().map(|s| s.bulk.a_rx + s.bulk.b_rx)),
                median_u(s.iter().map(|s| s.rpc.a_fwd + s.rpc.b_fwd)),
                median_u(s.iter().map(|s| s.rpc.a_rx + s.rpc.b_rx)),
            );
        }
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    run::main();
}
