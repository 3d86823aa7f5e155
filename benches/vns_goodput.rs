//! One `VirtualStream`'s bulk goodput against one raw channel's and against kernel TCP
//! (`tokio::net::TcpStream`) over the same veth, side by side in one run on the test bed
//! (two queues, MTU 1500). Prints every round, then min / median / max per measurement
//! and the ratios taken round by round (issue target: VirtualStream ≥ 0.90 × raw channel,
//! i.e. VNS costs ≤ 10 %).
//!
//! Phases (each a fresh pair of stacks):
//!
//! 0. `kernel_nothing_attached`: kernel TCP A → B before any stack runs (tx checksumming
//!    off, the test bed's default);
//! 1. stacks with **1** throughput channel per peer, then with **N** (default 4). In each,
//!    rounds of, interleaved:
//!    - `raw_channel`: one channel of A's `ChannelSet` → B's `ChannelSet` (the same sets
//!      the stacks run on; 64 KiB `Bytes` slices, no copy), as `channel_goodput`'s
//!      `ours_to_ours`;
//!    - `raw_channel_copy`: the same through `ChannelStream` (std `Read`/`Write`): each
//!      64 KiB write copied into a fresh chunk, each read copied out into a 64 KiB buffer,
//!      the two copies a byte-stream API makes and a `VirtualStream` makes too;
//!    - `virtual_stream`: one `VirtualStream` from A's stack to a `VirtualListener` on B,
//!      64 KiB `write_all`s, read to EOF;
//!    - `kernel_xdp_attached`: kernel TCP A → B with both stacks' steering programs
//!      attached (the like-for-like reference).
//!
//! Each transfer is one connection, timed from connect until the receiver read the last
//! byte (EOF). Environment: `NETCHANNEL_BENCH_BYTES` (per transfer, default 64 MiB),
//! `NETCHANNEL_BENCH_ROUNDS` (default 5), `NETCHANNEL_BENCH_CHANNELS` (N, default 4),
//! `NETCHANNEL_BENCH_ONLY` (comma-separated: run only the measurements whose name
//! contains one of them, e.g. for `perf record`; ratios need both sides).
//!
//! Without `--bench` (`cargo test --all-targets`) it runs one round of 2 MiB transfers,
//! as a smoke test.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! `cargo bench -j1 --bench vns_goodput`

#[cfg(target_os = "linux")]
#[path = "support/bed.rs"]
mod bed;
#[cfg(target_os = "linux")]
#[path = "support/vns.rs"]
mod vns;

#[cfg(target_os = "linux")]
mod run {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use netchannel::{Stack, VirtualListener};
    use testbed::TestBed;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::runtime::Runtime;

    use super::bed::{self, gbps, ChannelSink};
    use super::vns::{self, env_or, spread, StackPair};

    /// Application buffer of every write and read.
    const BLOCK: usize = 64 << 10;

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

    /// Writes `total` bytes as `block`-sized writes.
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

    /// One virtual-stream transfer of `total` bytes from `a` to `l`.
    fn vns_transfer(
        rt: &Runtime,
        a: &Stack,
        l: &Arc<VirtualListener>,
        to: SocketAddr,
        total: u64,
    ) -> Duration {
        let (a, l) = (a.clone(), l.clone());
        rt.block_on(async move {
            let start = Instant::now();
            let rx = tokio::spawn(async move {
                let (mut s, _) = l.accept().await.expect("accept");
                let got = drain(&mut s).await.expect("read");
                s.shutdown().await.expect("shutdown");
                got
            });
            let tx = tokio::spawn(async move {
                let block = vec![0x5au8; BLOCK];
                let mut c = a.connect(to).await.expect("connect");
                fill(&mut c, &block, total).await.expect("write");
                // Keep the stream until the receiver has everything (dropping it with
                // bytes unsent would reset it).
                let mut rest = [0u8; 16];
                let _ = c.read(&mut rest).await;
            });
            let got = tokio::time::timeout(Duration::from_secs(300), rx)
                .await
                .expect("virtual stream transfer timed out")
                .expect("receiver");
            let d = start.elapsed();
            tx.await.expect("sender");
            assert_eq!(got, total, "virtual stream delivered a short transfer");
            d
        })
    }

    /// One kernel TCP transfer A → B (sockets made in the namespaces, driven by tokio).
    fn kernel_transfer(
        bed: &TestBed,
        rt: &Runtime,
        l: &Arc<tokio::net::TcpListener>,
        total: u64,
    ) -> Duration {
        let to = match l.local_addr().expect("addr") {
            SocketAddr::V4(v4) => v4,
            SocketAddr::V6(_) => unreachable!("IPv4 listener"),
        };
        let l = l.clone();
        let start = Instant::now();
        let rx = rt.spawn(async move {
            let (mut s, _) = l.accept().await.expect("accept");
            drain(&mut s).await.expect("read")
        });
        let std_stream = vns::kernel_connect(bed, to);
        rt.block_on(async move {
            let tx = tokio::spawn(async move {
                let block = vec![0x5au8; BLOCK];
                let mut c = tokio::net::TcpStream::from_std(std_stream).expect("tokio stream");
                fill(&mut c, &block, total).await.expect("write");
                let mut rest = [0u8; 16];
                let _ = c.read(&mut rest).await;
            });
            let got = tokio::time::timeout(Duration::from_secs(300), rx)
                .await
                .expect("kernel transfer timed out")
                .expect("receiver");
            let d = start.elapsed();
            tx.await.expect("sender");
            assert_eq!(got, total, "kernel TCP delivered a short transfer");
            d
        })
    }

    /// Per-measurement rates of a phase, one per round.
    #[derive(Default)]
    struct Phase {
        names: Vec<&'static str>,
        rates: Vec<Vec<f64>>,
    }

    impl Phase {
        fn add(&mut self, name: &'static str, gbit: f64) {
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

        fn get(&self, name: &str) -> &[f64] {
            self.names
                .iter()
                .position(|&n| n == name)
                .map_or(&[], |i| &self.rates[i])
        }

        fn print(&self, title: &str) {
            println!();
            println!("{title}");
            println!(
                "{:<26} {:>8} {:>8} {:>8}   (Gbit/s over rounds)",
                "measurement", "min", "median", "max"
            );
            for (n, r) in self.names.iter().zip(&self.rates) {
                let (lo, med, hi) = spread(r);
                println!("{n:<26} {lo:>8.3} {med:>8.3} {hi:>8.3}");
            }
            let ratio = |a: &str, b: &str, note: &str| {
                let (x, y) = (self.get(a), self.get(b));
                let rs: Vec<f64> = x.iter().zip(y).map(|(x, y)| x / y.max(1e-12)).collect();
                if rs.is_empty() {
                    return;
                }
                let (lo, med, hi) = spread(&rs);
                println!(
                    "{:<48} {lo:>6.2} {med:>6.2} {hi:>6.2}{note}",
                    format!("{a} / {b}")
                );
            };
            if self.names.len() > 1 {
                println!("ratios, round by round (min median max):");
            }
            ratio(
                "virtual_stream",
                "raw_channel",
                "   (target >= 0.90: VNS costs <= 10 %)",
            );
            ratio(
                "virtual_stream",
                "raw_channel_copy",
                "   (the same, both against a channel read and written with copies)",
            );
            ratio(
                "raw_channel_copy",
                "raw_channel",
                "   (what the two copies cost)",
            );
            ratio("virtual_stream", "kernel_xdp_attached", "");
            ratio("raw_channel", "kernel_xdp_attached", "");
        }
    }

    pub fn main() {
        // `cargo test --all-targets`: one small round of each, as a smoke test.
        let full = vns::bench_mode();
        let total: u64 = env_or(
            "NETCHANNEL_BENCH_BYTES",
            if full { 64u64 << 20 } else { 2 << 20 },
        );
        let rounds: usize = env_or("NETCHANNEL_BENCH_ROUNDS", if full { 5 } else { 1 });
        let many: usize = env_or("NETCHANNEL_BENCH_CHANNELS", 4);
        let only = std::env::var("NETCHANNEL_BENCH_ONLY").unwrap_or_default();
        let on = |name: &str| only.split(',').any(|o| name.contains(o));
        let bed = match TestBed::builder().queues(2).build() {
            Ok(bed) => bed,
            Err(e) => {
                println!("skipping vns_goodput: {e}");
                return;
            }
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        println!(
            "vns_goodput: {} MiB per transfer, {rounds} rounds, test bed with 2 queues, MTU 1500",
            total >> 20
        );

        // 0. Kernel TCP with nothing attached.
        let kl = {
            let _g = rt.enter();
            Arc::new(
                tokio::net::TcpListener::from_std(vns::kernel_listener(&bed, vns::KERNEL_PORT))
                    .expect("tokio listener"),
            )
        };
        let mut base = Phase::default();
        for round in 0..rounds {
            if !on("kernel_nothing_attached") {
                break;
            }
            let r = gbps(total, kernel_transfer(&bed, &rt, &kl, total));
            println!("round {round}: kernel_nothing_attached {r:.3} Gbit/s");
            base.add("kernel_nothing_attached", r);
        }
        base.print("kernel TCP A -> B, nothing attached (tx csum off):");

        // 1. Stacks with 1 and N channels.
        let mut phases = Vec::new();
        let mut configs = vec![1, many];
        configs.dedup();
        for channels in configs {
            let pair = StackPair::start(&bed, channels);
            let sink = ChannelSink::start(
                pair.channels_b()
                    .listen(vns::RAW_CHANNEL_PORT)
                    .expect("raw listen"),
                total,
            );
            let stream_sink = vns::StreamSink::start(
                pair.channels_b()
                    .listen(vns::RAW_STREAM_PORT)
                    .expect("raw stream listen"),
                total,
            );
            let stream_addr = std::net::SocketAddrV4::new(pair.b_ip, vns::RAW_STREAM_PORT);
            let l = Arc::new(
                rt.block_on(pair.b.bind(pair.vns_addr()))
                    .expect("bind the virtual listener"),
            );
            let block = Bytes::from(vec![0x5au8; BLOCK]);
            let mut phase = Phase::default();
            // Warm-up: opens the stacks' channels.
            let _ = vns_transfer(&rt, &pair.a, &l, pair.vns_addr(), total.min(4 << 20));
            for round in 0..rounds {
                let mut line = format!("{channels} channel(s), round {round}:");
                let mut vs_raw = (None, None);
                if on("raw_channel") {
                    let start = Instant::now();
                    bed::channel_send(pair.channels_a(), pair.raw_addr(), &block, total);
                    let raw = gbps(total, start.elapsed());
                    phase.add("raw_channel", raw);
                    vs_raw.1 = Some(raw);
                    line += &format!("  raw_channel {raw:.3}");
                }
                if on("raw_channel_copy") {
                    let start = Instant::now();
                    vns::stream_send(pair.channels_a(), stream_addr, &block, total);
                    let r = gbps(total, start.elapsed());
                    phase.add("raw_channel_copy", r);
                    line += &format!("  raw_channel_copy {r:.3}");
                }
                if on("virtual_stream") {
                    let d = vns_transfer(&rt, &pair.a, &l, pair.vns_addr(), total);
                    let vs = gbps(total, d);
                    phase.add("virtual_stream", vs);
                    vs_raw.0 = Some(vs);
                    line += &format!("  virtual_stream {vs:.3}");
                }
                if on("kernel_xdp_attached") {
                    let k = gbps(total, kernel_transfer(&bed, &rt, &kl, total));
                    phase.add("kernel_xdp_attached", k);
                    line += &format!("  kernel_xdp_attached {k:.3}");
                }
                if let (Some(vs), Some(raw)) = vs_raw {
                    line += &format!(" Gbit/s  (vs/raw {:.2})", vs / raw);
                } else {
                    line += " Gbit/s";
                }
                println!("{line}");
            }
            drop(l);
            sink.stop();
            stream_sink.stop();
            pair.stop();
            phases.push((channels, phase));
        }
        println!();
        println!("vns_goodput summary ({} MiB per transfer):", total >> 20);
        base.print("kernel TCP A -> B, nothing attached (tx csum off):");
        for (channels, phase) in &phases {
            phase.print(&format!(
                "stacks with {channels} throughput channel(s) per peer (2 queues):"
            ));
        }
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    run::main();
    #[cfg(not(target_os = "linux"))]
    println!("skipping vns_goodput: the test bed is Linux only");
}
