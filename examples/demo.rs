//! Channel-level figures. With root (network namespaces, AF_XDP, XDP), on the
//! two-namespace test bed (a veth pair with two queues, MTU 1500), in one run and side by
//! side:
//!
//! - the raw frame rate of our AF_XDP link alone (no TCP): the ceiling;
//! - one TCP channel's goodput: ours → ours, kernel → ours, ours → kernel;
//! - kernel TCP over the same veth, without and with our XDP program attached;
//! - the ratios (channel goodput / raw ceiling; ours / kernel);
//! - then a [`netchannel::Stack`] in each namespace, with 1 and then `--vns-channels` (4)
//!   throughput channels per peer, and in each configuration `--vns-rounds` rounds of,
//!   interleaved: one raw channel of the stacks' own channel sets (no copy, and through
//!   `ChannelStream`'s copying `Read`/`Write`), one [`netchannel::VirtualStream`] to a
//!   [`netchannel::VirtualListener`], and kernel TCP over the same veth, with the ratios
//!   taken round by round. The code is the `vns_goodput` bench's (`benches/support/vns.rs`).
//!
//! Without those privileges (or with `--sim`) it runs two netchannel endpoints over the
//! simulated link instead (in memory, virtual time, seeded faults), then one
//! `VirtualStream` between two stacks on an in-memory network (no TCP, no AF_XDP), every
//! byte verified, and says so.
//!
//! The suite a user runs (request rate, latency, connections, isolation, against kernel
//! TCP at its defaults) is `ncperf demo`; figures of this example and what they mean:
//! `docs/investigations/bulk-on-veth.md`.
//!
//! ```text
//! cargo run --release --example demo                  # test bed, or simulated fallback
//! cargo run --release --example demo -- --vns-bytes 67108864 --vns-rounds 5
//! cargo run --release --example demo -- --sim --bytes 64000000 --loss 0.01 --latency-us 50
//! ```

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use netchannel::netdriver::link::fault::{FaultConfig, FaultDirection, FaultInjector, FaultStats};
use netchannel::netdriver::link::sim::{self, SimConfig, SimLink};
use netchannel::netdriver::link::Link;
use netchannel::netdriver::netif::{Interface, InterfaceConfig};
use netchannel::netdriver::tcp::congestion::CongestionAlgorithm;
use netchannel::netdriver::tcp::{Config, Stats, TcpError};
use netchannel::netdriver::time::{Duration, Instant};
use netchannel::netdriver::wire::EthernetAddress;

type Host = Interface<FaultInjector<SimLink>>;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Congestion {
    Newreno,
    Cubic,
}

/// netchannel's main job: goodput on the AF_XDP test bed next to the raw link rate and
/// kernel TCP, or (without privileges, or with --sim) two endpoints over a simulated link.
#[derive(Debug, Parser)]
#[command(version, args_override_self = true)]
struct Args {
    /// Run on the simulated link even when the test bed could be built.
    #[arg(long)]
    sim: bool,
    /// Test bed: bytes per connection of each transfer.
    #[arg(long, default_value_t = 256 << 20)]
    bed_bytes: u64,
    /// Test bed: rounds of each measurement (figures are totals over the rounds).
    #[arg(long, default_value_t = 5)]
    rounds: u64,
    /// Test bed: frames per round of the raw frame-rate measurements.
    #[arg(long, default_value_t = 256 * 1024)]
    raw_frames: u64,
    /// VirtualStream phase (test bed): bytes per connection of each transfer; in the
    /// fallback, the bytes of the in-memory VirtualStream transfer.
    #[arg(long, default_value_t = 256 << 20)]
    vns_bytes: u64,
    /// VirtualStream phase (test bed): rounds per channel count (0 skips the phase).
    #[arg(long, default_value_t = 3)]
    vns_rounds: u64,
    /// VirtualStream phase (test bed): throughput channels per peer of the second
    /// configuration (the first has 1).
    #[arg(long, default_value_t = 4)]
    vns_channels: usize,
    /// Simulated link: bytes to transfer from A to B.
    #[arg(long, default_value_t = 16_000_000)]
    bytes: u64,
    /// Frame loss probability per direction (0..1).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Frame reordering probability per direction (0..1).
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Frame duplication probability per direction (0..1).
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Single-bit corruption probability per direction (0..1).
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// One-way link latency in microseconds.
    #[arg(long, default_value_t = 50)]
    latency_us: u64,
    /// Link bandwidth in Mbit/s per direction; 0 means infinite.
    #[arg(long, default_value_t = 10_000)]
    bandwidth_mbps: u64,
    /// IP MTU of the link (the frame is 14 bytes longer).
    #[arg(long, default_value_t = 1500)]
    mtu: usize,
    /// TCP send and receive buffer size in KiB.
    #[arg(long, default_value_t = 256)]
    buffer_kib: usize,
    /// Minimum retransmission timeout in milliseconds.
    #[arg(long, default_value_t = 5)]
    min_rto_ms: u64,
    /// Seed of the fault injectors (and of the ISN keys).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Congestion control.
    #[arg(long, value_enum, default_value_t = Congestion::Cubic)]
    congestion: Congestion,
}

const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xb]);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const PORT: u16 = 7000;

/// The data sent: a 64 KiB pseudo-random block repeated; the receiver checks every byte
/// against it by position.
fn block() -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..65536)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn host(link: SimLink, args: &Args, mac: EthernetAddress, ip: Ipv4Addr, faults_seed: u64) -> Host {
    let faults = FaultConfig {
        loss: args.loss,
        reorder: args.reorder,
        duplicate: args.duplicate,
        corrupt: args.corrupt,
        seed: faults_seed,
        direction: FaultDirection::Rx,
        ..FaultConfig::default()
    };
    let tcp = Config {
        congestion: match args.congestion {
            Congestion::Newreno => CongestionAlgorithm::NewReno,
            Congestion::Cubic => CongestionAlgorithm::Cubic,
        },
        min_rto: Duration::from_millis(args.min_rto_ms),
        initial_rto: Duration::from_millis(args.min_rto_ms.max(1) * 10),
        time_wait: Duration::from_millis(10),
        rx_buffer: args.buffer_kib * 1024,
        tx_buffer: args.buffer_kib * 1024,
        // The MSS follows the MTU (the interface clamps it to MTU - 40).
        mss: u16::try_from(args.mtu.saturating_sub(40)).unwrap_or(u16::MAX),
        ..Config::default()
    };
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&args.seed.to_le_bytes());
    key[8] = mac.0[5];
    Interface::new(
        FaultInjector::new(link, faults),
        InterfaceConfig {
            mac,
            ipv4: ip,
            tcp,
            isn_key: Some(key),
            ..InterfaceConfig::default()
        },
    )
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    if !args.sim {
        match test_bed(&args) {
            Ok(()) => return ExitCode::SUCCESS,
            Err(why) => {
                println!("================================================================================");
                println!(" The AF_XDP test bed cannot run here, so this demo falls back to the");
                println!(" SIMULATED LINK (then a VirtualStream between in-memory stacks).");
                println!(" Reason: {why}");
                println!(" (The test bed needs root: network namespaces, AF_XDP sockets, XDP.)");
                println!("================================================================================");
            }
        }
    }
    if let Err(e) = run(&args) {
        eprintln!("demo failed: {e}");
        return ExitCode::FAILURE;
    }
    match in_memory_stream(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(target_os = "linux")]
#[path = "../benches/support/bed.rs"]
mod bed;
#[cfg(target_os = "linux")]
#[path = "../benches/support/vns.rs"]
mod vns;

/// The message of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a measurement panicked".into())
}

/// The side-by-side run on the test bed; `Err` says why it cannot run here.
#[cfg(target_os = "linux")]
fn test_bed(args: &Args) -> Result<(), String> {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    let bed = testbed::TestBed::builder()
        .queues(2)
        .build()
        .map_err(|e| e.to_string())?;
    println!("================================================================================");
    println!(
        " netchannel demo: AF_XDP TEST BED. Two network namespaces ({} and {})",
        bed.side(testbed::Side::A).netns,
        bed.side(testbed::Side::B).netns
    );
    println!(
        " joined by a veth pair (vA 10.77.0.1 <-> vB 10.77.0.2, {} queues, MTU {}).",
        bed.queues(),
        bed.mtu()
    );
    println!(" veth does AF_XDP in copy mode only; every thread shares this machine's cores.");
    println!("================================================================================");
    println!(
        "{} round(s) per measurement; transfers: one connection of {} bytes each; raw: {} frames",
        args.rounds, args.bed_bytes, args.raw_frames
    );
    let rounds = args.rounds.max(1);
    let raw_iters = (args.raw_frames / bed::RAW_BATCH).max(1);
    let started = std::time::Instant::now();
    let figures = catch_unwind(AssertUnwindSafe(|| {
        bed::measure_all(&bed, args.bed_bytes, &mut |name, what, unit, f| {
            let iters = match unit {
                bed::Unit::Frames { .. } => raw_iters,
                bed::Unit::Bytes(_) => 1,
            };
            let mut line = format!("{name:<24} ");
            for _ in 0..rounds {
                let d = f(iters);
                let bytes = match unit {
                    bed::Unit::Frames { count, frame_len } => count * frame_len * iters,
                    bed::Unit::Bytes(b) => b * iters,
                };
                line.push_str(&format!(" {:7.3}", bed::gbps(bytes, d)));
            }
            println!("{line}  Gbit/s  {what}");
        })
    }))
    .map_err(|panic| {
        format!(
            "the test bed was built but a measurement failed: {}",
            panic_message(&*panic)
        )
    })?;
    let phases = catch_unwind(AssertUnwindSafe(|| vns_phase(&bed, args))).map_err(|panic| {
        format!(
            "the test bed was built but a VirtualStream measurement failed: {}",
            panic_message(&*panic)
        )
    })?;
    println!();
    println!(
        "totals over all rounds ({:.1} s in all):",
        started.elapsed().as_secs_f64()
    );
    figures.print();
    for (channels, phase) in &phases {
        phase.print(&format!(
            "VirtualStream phase, stacks with {channels} throughput channel(s) per peer \
             ({} rounds x {} bytes, interleaved):",
            args.vns_rounds, args.vns_bytes
        ));
    }
    println!();
    println!("Raw figures count whole 1514-byte frames; transfers count TCP payload (1460 of");
    println!("each 1514 bytes). Kernel peers run at veth's defaults (tx checksum offload and");
    println!("TSO on; our channels accept their partial checksums on veth) except");
    println!("kernel_nothing_attached, which turns tx checksumming off for comparison.");
    if !phases.is_empty() {
        println!("In the VirtualStream phase each round runs raw_channel, raw_channel_copy,");
        println!("virtual_stream and kernel_xdp_attached one after the other on the same two");
        println!("stacks, so the ratios compare transfers made seconds apart.");
    }
    Ok(())
}

/// What each measurement of the VirtualStream phase is.
#[cfg(target_os = "linux")]
const VNS_MEASUREMENTS: [(&str, &str); 4] = [
    (
        "raw_channel",
        "one channel of the stacks' own channel sets, A -> B (64 KiB Bytes, no copy)",
    ),
    (
        "raw_channel_copy",
        "the same through ChannelStream (std Read/Write: one copy each side)",
    ),
    (
        "virtual_stream",
        "one VirtualStream, Stack on vA -> VirtualListener on vB (tokio, 64 KiB writes)",
    ),
    (
        "kernel_xdp_attached",
        "kernel TCP A -> B over the same veth (tokio), both stacks attached",
    ),
];

/// The product on the test bed: a `netchannel::Stack` in each namespace, with 1 and then
/// `--vns-channels` throughput channels per peer; per round, interleaved, a raw channel of
/// the stacks' channel sets (without and with copies), one `VirtualStream` and kernel TCP.
/// Prints each configuration's rounds and returns their rates.
#[cfg(target_os = "linux")]
fn vns_phase(bed: &testbed::TestBed, args: &Args) -> Vec<(usize, vns::Phase)> {
    if args.vns_rounds == 0 {
        return Vec::new();
    }
    let total = args.vns_bytes.max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!();
    println!(
        "VirtualStream phase: {} round(s) per configuration, interleaved; one connection of \
         {total} bytes each",
        args.vns_rounds
    );
    let kernel = vns::kernel_tokio_listener(bed, &rt);
    let mut configs = vec![1, args.vns_channels.max(1)];
    configs.dedup();
    let mut phases = Vec::new();
    for channels in configs {
        let bench = vns::StackBench::start(bed, &rt, channels, total);
        let mut phase = vns::Phase::default();
        for _ in 0..args.vns_rounds {
            phase.add("raw_channel", bed::gbps(total, bench.raw_channel()));
            phase.add(
                "raw_channel_copy",
                bed::gbps(total, bench.raw_channel_copy()),
            );
            phase.add(
                "virtual_stream",
                bed::gbps(total, bench.virtual_stream(&rt)),
            );
            let k = vns::kernel_transfer(bed, &rt, &kernel, total);
            phase.add("kernel_xdp_attached", bed::gbps(total, k));
        }
        bench.stop();
        println!("stacks with {channels} throughput channel(s) per peer:");
        for (name, what) in VNS_MEASUREMENTS {
            let mut line = format!("{name:<24} ");
            for r in phase.get(name) {
                line.push_str(&format!(" {r:7.3}"));
            }
            println!("{line}  Gbit/s  {what}");
        }
        let median = |a, b| phase.ratio(a, b).map_or(f64::NAN, |(_, m, _)| m);
        println!(
            "  virtual_stream / raw_channel {:.2}, / raw_channel_copy {:.2}, \
             / kernel_xdp_attached {:.2}  (medians of the rounds' ratios)",
            median("virtual_stream", "raw_channel"),
            median("virtual_stream", "raw_channel_copy"),
            median("virtual_stream", "kernel_xdp_attached"),
        );
        phases.push((channels, phase));
    }
    phases
}

#[cfg(not(target_os = "linux"))]
fn test_bed(_: &Args) -> Result<(), String> {
    Err("the AF_XDP test bed is Linux only".into())
}

/// The fallback's VirtualStream: two `Stack`s on an in-memory network (no TCP, no
/// AF_XDP: channels are in-process queues), one `VirtualStream` of `--vns-bytes` bytes
/// from one to a `VirtualListener` on the other, every byte checked.
fn in_memory_stream(args: &Args) -> Result<(), String> {
    use netchannel::vns::stack::MemNetwork;
    use netchannel::Stack;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let total = args.vns_bytes;
    println!();
    println!("================================================================================");
    println!(" VirtualStream over IN-MEMORY stacks (vns::stack::MemNetwork): no TCP, no");
    println!(" AF_XDP, no link; the channels are in-process queues. This shows the API and");
    println!(" the VNS layer's own cost, not network goodput.");
    println!("================================================================================");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let net = MemNetwork::new();
    let stack = |ip| {
        Stack::builder()
            .ipv4(ip)
            .build_in_memory(&net)
            .map_err(|e| format!("stack on {ip}: {e}"))
    };
    let (a, b) = (stack(IP_A)?, stack(IP_B)?);
    let to = std::net::SocketAddr::from(SocketAddrV4::new(IP_B, PORT));
    let result = rt.block_on(async {
        let listener = b.bind(to).await.map_err(|e| format!("bind: {e}"))?;
        let data = block();
        let start = std::time::Instant::now();
        let sender = {
            let (a, data) = (a.clone(), data.clone());
            tokio::spawn(async move {
                let mut s = a.connect(to).await?;
                let mut sent = 0u64;
                while sent < total {
                    let at = (sent % data.len() as u64) as usize;
                    let n = (data.len() - at).min((total - sent) as usize);
                    s.write_all(&data[at..at + n]).await?;
                    sent += n as u64;
                }
                s.shutdown().await?;
                // Keep the stream until the receiver closes its side (dropping it with
                // bytes unsent would reset it).
                let mut rest = [0u8; 16];
                let _ = s.read(&mut rest).await;
                std::io::Result::Ok(())
            })
        };
        let (mut s, peer) = listener
            .accept()
            .await
            .map_err(|e| format!("accept: {e}"))?;
        let mut buf = vec![0u8; 64 << 10];
        let mut received = 0u64;
        loop {
            let n = s.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                break;
            }
            for (i, &byte) in buf[..n].iter().enumerate() {
                let at = ((received + i as u64) % data.len() as u64) as usize;
                if byte != data[at] {
                    return Err(format!("corrupt byte at offset {}", received + i as u64));
                }
            }
            received += n as u64;
        }
        let elapsed = start.elapsed();
        s.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
        sender
            .await
            .map_err(|e| format!("sender task: {e}"))?
            .map_err(|e| format!("sender: {e}"))?;
        if received != total {
            return Err(format!("EOF after {received} of {total} bytes"));
        }
        Ok((peer, elapsed))
    });
    a.abort();
    b.abort();
    let (peer, elapsed) = result?;
    println!(
        "one VirtualStream {peer} -> {to}: {total} bytes, every byte verified, in {:.3} s",
        elapsed.as_secs_f64()
    );
    println!(
        "goodput: {:.3} Gbit/s  (in memory, wall clock, this machine's cores shared by both \
         stacks; not comparable with the test bed's figures)",
        total as f64 * 8.0 / elapsed.as_secs_f64().max(1e-12) / 1e9
    );
    Ok(())
}

fn run(args: &Args) -> Result<(), String> {
    println!("================================================================================");
    println!(" netchannel demo: SIMULATED LINK (in memory, virtual time).");
    println!(" These numbers measure the user-space TCP stack over a simulated wire, not the");
    println!(" AF_XDP test bed (run as root without --sim for that).");
    println!("================================================================================");
    let sim_config = SimConfig {
        latency: Duration::from_micros(args.latency_us),
        bandwidth_bps: (args.bandwidth_mbps > 0).then(|| args.bandwidth_mbps * 1_000_000),
        mtu: args.mtu,
        per_frame_overhead: 24,
        ..SimConfig::default()
    };
    println!(
        "link: latency {} us, bandwidth {}, MTU {} (frame {}), queue {} frames; \
         faults per direction: loss {} reorder {} duplicate {} corrupt {} (seed {})",
        args.latency_us,
        if args.bandwidth_mbps == 0 {
            "infinite".to_string()
        } else {
            format!("{} Mbit/s", args.bandwidth_mbps)
        },
        args.mtu,
        args.mtu + 14,
        sim_config.queue_frames,
        args.loss,
        args.reorder,
        args.duplicate,
        args.corrupt,
        args.seed
    );
    let (la, lb) = sim::pair(sim_config);
    let mut a = host(la, args, MAC_A, IP_A, args.seed);
    let mut b = host(lb, args, MAC_B, IP_B, args.seed ^ 0x5eed_5eed_5eed_5eed);
    a.add_neighbor(IP_B, MAC_B);
    b.add_neighbor(IP_A, MAC_A);
    b.listen(PORT, 8).map_err(|e| e.to_string())?;

    let data = block();
    let total = args.bytes;
    let start = Instant::ZERO;
    let wall = std::time::Instant::now();
    let client = a
        .connect(SocketAddrV4::new(IP_B, PORT), start)
        .map_err(|e| e.to_string())?;
    let mut server = None;
    let (mut sent, mut received, mut closed) = (0u64, 0u64, false);
    let mut buf = vec![0u8; 64 * 1024];
    let mut sender_stats = Stats::default();
    let mut receiver_stats = Stats::default();
    let mut now = start;
    let mut done_at = None;
    let deadline = start + Duration::from_secs(3600);
    let mut polls = 0u64;

    loop {
        polls += 1;
        let mut progress = a.poll(now) | b.poll(now);
        if let Some(conn) = a.conn_mut(client) {
            while sent < total {
                let at = (sent % data.len() as u64) as usize;
                let n = (data.len() - at).min((total - sent) as usize);
                match conn.send(&data[at..at + n]) {
                    Ok(0) | Err(TcpError::WouldBlock) => break,
                    Ok(k) => {
                        sent += k as u64;
                        progress = true;
                    }
                    Err(e) => return Err(format!("send: {e}")),
                }
            }
            if sent == total && !closed && conn.state().is_synchronized() {
                conn.close();
                closed = true;
            }
            sender_stats = conn.stats();
        }
        server = server.or_else(|| b.accept(PORT));
        if let Some(conn) = server.and_then(|h| b.conn_mut(h)) {
            loop {
                match conn.recv(&mut buf) {
                    Ok(0) => {
                        if received != total {
                            return Err(format!("EOF after {received} of {total} bytes"));
                        }
                        if done_at.is_none() {
                            done_at = Some(now);
                            conn.close();
                        }
                        break;
                    }
                    Ok(n) => {
                        for (i, &byte) in buf[..n].iter().enumerate() {
                            let at = ((received + i as u64) % data.len() as u64) as usize;
                            if byte != data[at] {
                                return Err(format!(
                                    "corrupt byte at offset {}",
                                    received + i as u64
                                ));
                            }
                        }
                        received += n as u64;
                        progress = true;
                    }
                    Err(TcpError::WouldBlock) => break,
                    Err(e) => return Err(format!("recv: {e}")),
                }
            }
            receiver_stats = conn.stats();
        }
        while let Some((_, error)) = a.pop_closed() {
            if let Some(e) = error {
                return Err(format!("sender connection failed: {e}"));
            }
        }
        if done_at.is_some() && a.connection_count() == 0 && b.connection_count() == 0 {
            break;
        }
        if progress {
            continue;
        }
        match [a.poll_at(), b.poll_at()].into_iter().flatten().min() {
            Some(t) => now = now.max(t),
            None => return Err(format!("stalled at {now} with nothing scheduled")),
        }
        if now > deadline {
            return Err("virtual deadline of one hour exceeded".into());
        }
    }
    let cpu = wall.elapsed();
    let virt = done_at.unwrap_or(now) - start;
    report(
        args,
        &a,
        &b,
        &sender_stats,
        &receiver_stats,
        virt,
        cpu,
        polls,
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    a: &Host,
    b: &Host,
    tx: &Stats,
    rx: &Stats,
    virt: Duration,
    cpu: std::time::Duration,
    polls: u64,
) {
    let bytes = args.bytes as f64;
    let gbps = |secs: f64| {
        if secs > 0.0 {
            bytes * 8.0 / secs / 1e9
        } else {
            f64::INFINITY
        }
    };
    println!();
    println!(
        "transferred {} bytes A -> B, every byte verified",
        args.bytes
    );
    println!(
        "goodput (virtual time): {:.3} Gbit/s  ({} bytes in {:.6} s of simulated time)",
        gbps(virt.as_secs_f64()),
        args.bytes,
        virt.as_secs_f64()
    );
    println!(
        "stack CPU throughput:   {:.3} Gbit/s  ({:.3} s wall clock on this machine, both \
         endpoints and the link on one thread, {polls} polls)",
        gbps(cpu.as_secs_f64()),
        cpu.as_secs_f64()
    );
    println!(
        "sender: {} segments, {} retransmitted ({:.2}%), {} fast retransmits, {} RTO expiries, \
         srtt {}, rto {:?}, cwnd {} B, ssthresh {}",
        tx.segments_sent,
        tx.retransmitted_segments,
        100.0 * tx.retransmitted_segments as f64 / tx.segments_sent.max(1) as f64,
        tx.fast_retransmits,
        tx.rto_timeouts,
        tx.srtt
            .map(|d| format!("{} us", d.as_micros()))
            .unwrap_or_else(|| "n/a".into()),
        tx.rto,
        tx.cwnd,
        if tx.ssthresh == usize::MAX {
            "inf".to_string()
        } else {
            format!("{} B", tx.ssthresh)
        },
    );
    println!(
        "receiver: {} segments received, {} bytes delivered in order, {} out-of-order drops",
        rx.segments_received, rx.bytes_received, rx.ooo_dropped
    );
    let print_faults = |name: &str, f: FaultStats| {
        println!(
            "faults on frames into {name}: {} frames, lost {}, reordered {}, duplicated {}, \
             corrupted {}",
            f.frames, f.lost, f.reordered, f.duplicated, f.corrupted
        );
    };
    print_faults("A", a.link().fault_stats());
    print_faults("B", b.link().fault_stats());
    for (name, host) in [("A", a), ("B", b)] {
        let s = host.stats();
        let l = host.link().stats();
        println!(
            "interface {name}: rx {} frames, dropped: bad checksum {}, malformed {}, not ours {}, \
             unsupported {}; link tx {} frames, queue drops {}",
            s.rx_frames,
            s.rx_bad_checksum,
            s.rx_malformed,
            s.rx_not_ours,
            s.rx_unsupported,
            l.tx_frames,
            l.dropped_no_buffer
        );
    }
    println!("(simulated link, not the AF_XDP test bed)");
}
