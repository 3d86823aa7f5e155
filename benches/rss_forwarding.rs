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
//! For each row: a fresh bed, two channel sets (4 queues), B listening on channel ports,
//! then three measurements on the same sets:
//!
//! - up: A opens `NETCHANNEL_BENCH_CHANNELS` channels (default 8, spread over A's queues
//!   round-robin) one after another, each carrying `NETCHANNEL_BENCH_MIB` MiB (default 16)
//!   to B; Gbit/s of payload. A, the side whose queue alignment decides, receives only
//!   ACKs here;
//! - down: the same, B sending to A over the channels A opens: the data frames arrive at
//!   the opening side;
//! - request/response: A opens the same number of channels at once, each a closed loop
//!   for `NETCHANNEL_BENCH_SECS` seconds (default 2) on its own thread: a request of
//!   `NETCHANNEL_BENCH_SIZE` bytes (default 64; a per-request counter, then a pattern),
//!   which B's echo thread for that channel hands back as it dequeued it, checked byte
//!   for byte before the next; requests/s of all channels together. Each channel makes
//!   one exchange before the clock (and the counters) start, so the handshake is outside.
//!
//! Three more rows (`NETCHANNEL_BENCH_STACKS=0` leaves them out) take the same three
//! measurements between two full stacks (`netchannel::Stack` on each end, the same
//! number of throughput channels per peer, both sets at the row's alignment) over
//! virtual streams, on a tokio runtime of 2 workers: veth, the RSS bed with alignment
//! off, and aligned (both ends given the bed's table, so the acceptor's hello aligns B's
//! end too).
//!
//! Each measurement prints, per side, the frames its queues received for owned flows (the
//! steering program's redirects) and those forwarded during it, and A's channels by
//! steering (aligned/forwarded, cumulative for the set, so it counts all three
//! measurements' channels and, for the stacks, the hello channel), and the process's CPU
//! time (user and system, `getrusage`: both ends, and the kernel's work in their system
//! calls) per MiB or per request. `NETCHANNEL_BENCH_ROUNDS` rounds
//! (default 3); the rows run in turn within a round, in reverse order every other round,
//! so that drift from other load on the host falls on all of them alike. A last table gives
//! each row's medians over the rounds and the ratio to the veth row's medians, and the
//! ratio aligned / off of each measurement, per round (median, min, max). The load
//! average is printed before and after.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! Without `--bench` (`cargo test --all-targets`) it runs one round, 1 MiB per channel and
//! 0.1 s of requests (about 10 s in a debug build), as a smoke test that checks every
//! byte count and every response.
//! `cargo bench --no-run -j2 --bench rss_forwarding`, then
//! `target/release/deps/rss_forwarding-<hash> --bench`.

#[cfg(target_os = "linux")]
#[path = "support/bed.rs"]
mod bed;

#[cfg(target_os = "linux")]
#[path = "support/vns.rs"]
mod vns;

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
    use super::vns::{self, StackPair};

    const QUEUES: u32 = 4;
    /// B's port for the bulk transfers.
    const BULK_PORT: u16 = 9100;
    /// B's port for the echoed requests.
    const ECHO_PORT: u16 = 9101;
    /// B's port for the transfers from B to A.
    const SOURCE_PORT: u16 = 9102;
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

    /// The process's user and system CPU time so far, µs.
    fn cpu_us() -> f64 {
        // SAFETY: getrusage only writes the struct it is given.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_SELF is always valid.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
            return f64::NAN;
        }
        let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
        us(ru.ru_utime) + us(ru.ru_stime)
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
        /// The process's CPU time (user and system, µs): both ends, their threads, and
        /// the kernel's work done in their system calls.
        cpu_us: f64,
    }

    impl Frames {
        fn now(a: &ChannelSet, b: &ChannelSet) -> Frames {
            let rx = |s: &ChannelSet| s.steering_counters().map_or(0, |c| c.redirected);
            Frames {
                a_rx: rx(a),
                a_fwd: a.forwarded_frames().0,
                b_rx: rx(b),
                b_fwd: b.forwarded_frames().0,
                cpu_us: cpu_us(),
            }
        }

        fn since(self, before: Frames) -> Frames {
            Frames {
                a_rx: self.a_rx.saturating_sub(before.a_rx),
                a_fwd: self.a_fwd.saturating_sub(before.a_fwd),
                b_rx: self.b_rx.saturating_sub(before.b_rx),
                b_fwd: self.b_fwd.saturating_sub(before.b_fwd),
                cpu_us: self.cpu_us - before.cpu_us,
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

    /// B's side of the transfers to A: each channel it accepts gets `bytes` (64 KiB
    /// slices), then B's FIN; B waits for A's FIN before taking the next.
    struct Source {
        stop: Arc<AtomicBool>,
        thread: std::thread::JoinHandle<()>,
    }

    impl Source {
        fn start(listener: ChannelListener, bytes: u64) -> Source {
            let stop = Arc::new(AtomicBool::new(false));
            let halt = Arc::clone(&stop);
            let thread = std::thread::spawn(move || {
                let block = Bytes::from(vec![0xa5; 64 << 10]);
                while !halt.load(Ordering::Relaxed) {
                    let ch = match listener.accept_timeout(Duration::from_millis(50)) {
                        Ok((ch, _)) => ch,
                        Err(ChannelError::WouldBlockTimeout) => continue,
                        Err(_) => break,
                    };
                    let mut sent = 0u64;
                    while sent < bytes {
                        let n = (bytes - sent).min(block.len() as u64) as usize;
                        ch.enqueue_blocking(block.slice(..n), Some(STEP))
                            .unwrap_or_else(|e| panic!("enqueue at byte {sent}: {e}"));
                        sent += n as u64;
                    }
                    ch.close();
                    match ch.dequeue_blocking(Some(STEP)) {
                        Ok(Dequeued::Finished) => {}
                        other => panic!("no FIN from A: {other:?}"),
                    }
                }
            });
            Source { stop, thread }
        }

        fn stop(self) {
            self.stop.store(true, Ordering::Relaxed);
            self.thread.join().expect("source");
        }
    }

    /// Moves `channels` × `bytes` from B to A over channels A opens one after another (the
    /// data frames arrive at the opening side, where alignment decides their queue);
    /// returns Gbit/s and the frames counted.
    fn download(
        bed: &TestBed,
        a: &ChannelSet,
        b: &ChannelSet,
        channels: u32,
        bytes: u64,
    ) -> (f64, Frames) {
        let source = Source::start(b.listen(SOURCE_PORT).expect("listen"), bytes);
        let target = SocketAddrV4::new(bed.side(Side::B).ipv4, SOURCE_PORT);
        let before = Frames::now(a, b);
        let start = Instant::now();
        for _ in 0..channels {
            let ch = a.connect(target).expect("channel connect");
            let mut got = 0u64;
            loop {
                match ch.dequeue_blocking(Some(STEP)) {
                    Ok(Dequeued::Chunk(c)) => got += c.len() as u64,
                    Ok(Dequeued::Finished) => break,
                    other => panic!("download at byte {got}: {other:?}"),
                }
            }
            assert_eq!(got, bytes, "short download");
            ch.close();
        }
        let took = start.elapsed();
        let frames = Frames::now(a, b).since(before);
        source.stop();
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
    ) -> (f64, Frames, u64) {
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
        (total as f64 / took, frames, total)
    }

    /// The same two measurements between two full stacks (`netchannel::Stack` on each
    /// end, `channels` throughput channels per peer, both sets at `rss`), over virtual
    /// streams: `channels` transfers of `bytes` one after another (after one of 64 KiB
    /// that opens the channels), then `channels` streams of echoed requests.
    fn stacks(
        bed: &TestBed,
        rss: RssAlignment,
        channels: u32,
        bytes: u64,
        size: usize,
        secs: f64,
    ) -> Sample {
        use netchannel::perf_proto::Requests;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        vns::set_app_runtime(Some(rt.handle().clone()));
        let pair = StackPair::start_configured(bed, channels as usize, 0, false, move |c| {
            c.rss = rss.clone();
        });
        let (a, b) = (pair.channels_a(), pair.channels_b());
        let to = pair.vns_addr();
        let sink = Arc::new(rt.block_on(pair.b.bind(to)).expect("bind"));
        vns::vns_transfer(&rt, &pair.a, &sink, to, 64 << 10);
        let before = Frames::now(a, b);
        let start = Instant::now();
        for _ in 0..channels {
            vns::vns_transfer(&rt, &pair.a, &sink, to, bytes);
        }
        let gbps = bed::gbps(u64::from(channels) * bytes, start.elapsed());
        let bulk = Frames::now(a, b).since(before);

        let mut source_to = to;
        source_to.set_port(to.port() + 2);
        let l = rt.block_on(pair.b.bind(source_to)).expect("bind");
        rt.spawn(async move {
            let block = vec![0xa5u8; 64 << 10];
            while let Ok((mut s, _)) = l.accept().await {
                let mut sent = 0u64;
                while sent < bytes {
                    let n = (bytes - sent).min(block.len() as u64) as usize;
                    s.write_all(&block[..n]).await.expect("write");
                    sent += n as u64;
                }
                s.shutdown().await.expect("shutdown");
                // Until A closes (dropping it with bytes unacknowledged would reset it).
                let mut rest = [0u8; 16];
                let _ = s.read(&mut rest).await;
            }
        });
        let before = Frames::now(a, b);
        let start = Instant::now();
        let stack_a = pair.a.clone();
        rt.block_on(async move {
            let mut buf = vec![0u8; 64 << 10];
            for _ in 0..channels {
                let mut s = stack_a.connect(source_to).await.expect("connect");
                let mut got = 0u64;
                loop {
                    let n = tokio::time::timeout(STEP, s.read(&mut buf))
                        .await
                        .expect("no bytes in time")
                        .expect("read");
                    if n == 0 {
                        break;
                    }
                    got += n as u64;
                }
                assert_eq!(got, bytes, "short download");
                let _ = s.shutdown().await;
            }
        });
        let down_gbps = bed::gbps(u64::from(channels) * bytes, start.elapsed());
        let down = Frames::now(a, b).since(before);

        let mut echo_to = to;
        echo_to.set_port(to.port() + 1);
        let l = rt.block_on(pair.b.bind(echo_to)).expect("bind");
        rt.spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 << 10];
                    while let Ok(n @ 1..) = s.read(&mut buf).await {
                        if s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = s.shutdown().await;
                });
            }
        });
        let stack_a = pair.a.clone();
        let streams = rt.block_on(async move {
            let mut v = Vec::new();
            for tag in 0..u64::from(channels) {
                let mut s = stack_a.connect(echo_to).await.expect("connect");
                let mut r = Requests::new(size, tag);
                r.exchange(&mut s).await.expect("first exchange");
                v.push((s, r));
            }
            v
        });
        let before = Frames::now(a, b);
        let start = Instant::now();
        let until = start + Duration::from_secs_f64(secs);
        let total: u64 = rt.block_on(async move {
            let tasks: Vec<_> = streams
                .into_iter()
                .map(|(mut s, mut r)| {
                    tokio::spawn(async move {
                        let first = r.done();
                        while Instant::now() < until {
                            tokio::time::timeout(STEP, r.exchange(&mut s))
                                .await
                                .expect("no answer in time")
                                .expect("exchange");
                        }
                        let _ = s.shutdown().await;
                        r.done() - first
                    })
                })
                .collect();
            let mut total = 0;
            for t in tasks {
                total += t.await.expect("client task");
            }
            total
        });
        let per_s = total as f64 / start.elapsed().as_secs_f64();
        let done = total;
        let rpc = Frames::now(a, b).since(before);
        let steered = a.steering_counts();
        let sample = Sample {
            gbps,
            bulk,
            down_gbps,
            down,
            per_s,
            rpc,
            aligned: steered.aligned,
            cpu: cpu_per_unit(&[bulk, down, rpc], u64::from(channels) * bytes, done),
            forwarded: steered.forwarded,
        };
        pair.stop();
        vns::set_app_runtime(None);
        drop(rt);
        sample
    }

    /// CPU µs per MiB of the two transfers (`bytes` each) and per request (`done`).
    fn cpu_per_unit(f: &[Frames; 3], bytes: u64, done: u64) -> [f64; 3] {
        let mib = bytes as f64 / f64::from(1u32 << 20);
        [
            f[0].cpu_us / mib,
            f[1].cpu_us / mib,
            f[2].cpu_us / (done as f64).max(1.0),
        ]
    }

    /// One row's measurements in one round.
    #[derive(Clone, Copy, Default)]
    struct Sample {
        gbps: f64,
        bulk: Frames,
        down_gbps: f64,
        down: Frames,
        per_s: f64,
        rpc: Frames,
        /// CPU µs per MiB (up, down) and per request.
        cpu: [f64; 3],
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

    /// Two channel sets, A's at `rss` and B's at its default: [`bulk`], then [`requests`].
    fn channel_sets(
        bed: &TestBed,
        rss: RssAlignment,
        channels: u32,
        bytes: u64,
        size: usize,
        secs: f64,
    ) -> Sample {
        let a = set_in(bed, Side::A, rss);
        let b = set_in(bed, Side::B, RssAlignment::Probe);
        let (gbps, bulk_frames) = bulk(bed, &a, &b, channels, bytes);
        let (down_gbps, down) = download(bed, &a, &b, channels, bytes);
        let (per_s, rpc_frames, done) = requests(bed, &a, &b, channels, size, secs);
        let steered = a.steering_counts();
        a.shutdown().expect("stop A's set");
        b.shutdown().expect("stop B's set");
        Sample {
            gbps,
            bulk: bulk_frames,
            down_gbps,
            down,
            per_s,
            rpc: rpc_frames,
            aligned: steered.aligned,
            cpu: cpu_per_unit(
                &[bulk_frames, down, rpc_frames],
                u64::from(channels) * bytes,
                done,
            ),
            forwarded: steered.forwarded,
        }
    }

    /// One line of the table.
    struct Row {
        name: &'static str,
        /// Two full stacks rather than two channel sets.
        stacks: bool,
        /// The RSS bed rather than plain veth.
        rss_bed: bool,
        alignment: RssAlignment,
    }

    pub fn main() {
        let bench = std::env::args().any(|a| a == "--bench");
        let channels: u32 = env_or("NETCHANNEL_BENCH_CHANNELS", 8);
        let mib: u64 = env_or("NETCHANNEL_BENCH_MIB", if bench { 16 } else { 1 });
        let secs: f64 = env_or("NETCHANNEL_BENCH_SECS", if bench { 2.0 } else { 0.1 });
        let size: usize = env_or("NETCHANNEL_BENCH_SIZE", 64);
        let rounds: usize = env_or("NETCHANNEL_BENCH_ROUNDS", if bench { 3 } else { 1 }).max(1);
        let with_stacks = env_or("NETCHANNEL_BENCH_STACKS", 1u32) != 0;
        let key: Vec<u8> = (0u8..40).map(|i| i.wrapping_mul(73) ^ 0xa5).collect();
        let table = || RssTable::spread(&key, 128, QUEUES).expect("table");
        let known = || {
            let t = table();
            RssAlignment::Known(RssConfig::toeplitz(t.key(), t.indirection()).expect("RSS"))
        };
        let row = |name, stacks, rss_bed, alignment| Row {
            name,
            stacks,
            rss_bed,
            alignment,
        };
        let mut rows = vec![
            row("veth", false, false, RssAlignment::Probe),
            row("rss, alignment off", false, true, RssAlignment::Off),
            row("rss, aligned", false, true, known()),
        ];
        if with_stacks {
            rows.extend([
                row("stacks, veth", true, false, RssAlignment::Probe),
                row("stacks, rss, off", true, true, RssAlignment::Off),
                row("stacks, rss, aligned", true, true, known()),
            ]);
        }
        println!(
            "{QUEUES} queues, {channels} channels; bulk {mib} MiB per channel; \
             requests of {size} B for {secs} s; {rounds} rounds; load average {}",
            load_average()
        );
        println!(
            "{:<5} {:<20} {:<5} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8} {:>7}",
            "round",
            "bed",
            "load",
            "rate",
            "A rx",
            "A fwd",
            "B rx",
            "B fwd",
            "A fwd%",
            "A al/fwd",
            "cpu µs"
        );
        let mut samples = vec![Vec::<Sample>::new(); rows.len()];
        for round in 0..rounds {
            let order: Vec<usize> = if round % 2 == 0 {
                (0..rows.len()).collect()
            } else {
                (0..rows.len()).rev().collect()
            };
            for i in order {
                let r = &rows[i];
                let builder: TestBedBuilder = if r.rss_bed {
                    TestBed::builder().queues(QUEUES).rss(table(), table())
                } else {
                    TestBed::builder().queues(QUEUES)
                };
                let bed = match builder.build() {
                    Ok(bed) => bed,
                    Err(e) => {
                        println!("skipping rss_forwarding: {e}");
                        return;
                    }
                };
                let measure = if r.stacks { stacks } else { channel_sets };
                let s = measure(&bed, r.alignment.clone(), channels, mib << 20, size, secs);
                for (load, rate, f, cpu) in [
                    ("up", format!("{:.2} Gb/s", s.gbps), s.bulk, s.cpu[0]),
                    ("down", format!("{:.2} Gb/s", s.down_gbps), s.down, s.cpu[1]),
                    ("rpc", format!("{:.0}/s", s.per_s), s.rpc, s.cpu[2]),
                ] {
                    println!(
                        "{round:<5} {:<20} {load:<5} {rate:>10} {:>9} {:>9} {:>9} {:>9} {:>6.1} {:>8} {cpu:>7.1}",
                        r.name,
                        f.a_rx,
                        f.a_fwd,
                        f.b_rx,
                        f.b_fwd,
                        f.a_share(),
                        format!("{}/{}", s.aligned, s.forwarded),
                    );
                }
                samples[i].push(s);
            }
        }
        println!("load average after: {}", load_average());
        println!();
        println!(
            "medians over {rounds} rounds; x: ratio to the median of the veth row of the same \
             kind; fwd/rx: frames forwarded / received, A and B together; cpu: CPU µs per MiB \
             (up, down) and per request"
        );
        println!(
            "{:<20} {:>6} {:>5} {:>6} {:>5} {:>7} {:>5} {:>12} {:>12} {:>12} {:>14}",
            "bed",
            "up",
            "x",
            "down",
            "x",
            "req/s",
            "x",
            "up fwd/rx",
            "down fwd/rx",
            "rpc fwd/rx",
            "cpu"
        );
        let medians = |s: &[Sample]| {
            (
                median(s.iter().map(|s| s.gbps)),
                median(s.iter().map(|s| s.down_gbps)),
                median(s.iter().map(|s| s.per_s)),
            )
        };
        let frames = |s: &[Sample], f: fn(&Sample) -> Frames| {
            format!(
                "{}/{}",
                median_u(s.iter().map(|x| f(x).a_fwd + f(x).b_fwd)),
                median_u(s.iter().map(|x| f(x).a_rx + f(x).b_rx)),
            )
        };
        for (r, s) in rows.iter().zip(&samples) {
            let base = medians(&samples[if r.stacks { 3 } else { 0 }]);
            let (up, down, q) = medians(s);
            println!(
                "{:<20} {up:>6.2} {:>5.2} {down:>6.2} {:>5.2} {q:>7.0} {:>5.2} {:>12} {:>12} {:>12} {:>14}",
                r.name,
                up / base.0.max(1e-12),
                down / base.1.max(1e-12),
                q / base.2.max(1e-12),
                frames(s, |x| x.bulk),
                frames(s, |x| x.down),
                frames(s, |x| x.rpc),
                format!(
                    "{:.0}/{:.0}/{:.1}",
                    median(s.iter().map(|x| x.cpu[0])),
                    median(s.iter().map(|x| x.cpu[1])),
                    median(s.iter().map(|x| x.cpu[2])),
                ),
            );
        }
        // Alignment's effect on the same bed: aligned over off, round by round (the two
        // rows run next to each other in every round).
        println!();
        println!("aligned / off, same bed, per round: median [min, max]");
        for (kind, off, on) in [("channel sets", 1, 2), ("stacks", 4, 5)] {
            if on >= rows.len() {
                continue;
            }
            let ratio = |f: fn(&Sample) -> f64| {
                let mut v: Vec<f64> = samples[on]
                    .iter()
                    .zip(&samples[off])
                    .map(|(a, o)| f(a) / f(o).max(1e-12))
                    .collect();
                let m = bed::median(&mut v);
                format!("{m:.2} [{:.2}, {:.2}]", v[0], v[v.len() - 1])
            };
            println!(
                "{kind:<13} up {}   down {}   rpc {}",
                ratio(|s| s.gbps),
                ratio(|s| s.down_gbps),
                ratio(|s| s.per_s),
            );
            println!(
                "{:<13} up {}   down {}   rpc {}",
                "  CPU/unit",
                ratio(|s| s.cpu[0]),
                ratio(|s| s.cpu[1]),
                ratio(|s| s.cpu[2]),
            );
        }
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    run::main();
}
