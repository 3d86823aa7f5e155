//! One `VirtualStream`'s bulk goodput against one raw channel's and against kernel TCP
//! (`tokio::net::TcpStream`) over the same veth, side by side in one run on the test bed
//! (two queues, MTU 1500). Prints every round, then min / median / max per measurement
//! and the ratios taken round by round (issue target: VirtualStream ≥ 0.90 × raw channel,
//! i.e. VNS costs ≤ 10 %).
//!
//! Phases (each a fresh pair of stacks):
//!
//! 0. `kernel_nothing_attached`: kernel TCP A → B before any stack runs (tx checksumming
//!    off, the test bed's default), then `kernel_streams_nothing_attached`: the same bytes
//!    over S connections at once (default 4);
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
//!    - `virtual_streams`: S `VirtualStream`s at once, sharing the transfer's bytes
//!      (the reference is `kernel_streams_nothing_attached`);
//!    - `kernel_xdp_attached`: kernel TCP A → B with both stacks' steering programs
//!      attached (the like-for-like reference).
//!
//! Each transfer is one connection, timed from connect until the receiver read the last
//! byte (EOF). Environment: `NETCHANNEL_BENCH_BYTES` (per transfer, default 64 MiB),
//! `NETCHANNEL_BENCH_ROUNDS` (default 5), `NETCHANNEL_BENCH_CHANNELS` (N, default 4),
//! `NETCHANNEL_BENCH_STREAMS` (S, default 4, at least 2),
//! `NETCHANNEL_BENCH_ONLY` (comma-separated: run only the measurements whose name
//! contains one of them, e.g. for `perf record`; ratios need both sides).
//!
//! The stacks run over AF_XDP unless `NETCHANNEL_LINK=packet` (the stack builder's
//! environment) puts them on AF_PACKET; `kernel_xdp_attached` then runs with their TCX
//! programs attached instead.
//!
//! Without `--bench` (`cargo test --all-targets`) it runs one round of 2 MiB transfers,
//! as a smoke test.
//!
//! Remote-peer mode: with `NETCHANNEL_BENCH_PEER=IPV4[:PORT]`,
//! `NETCHANNEL_BENCH_INTERFACE=IFACE` and `NETCHANNEL_BENCH_ADDRESS=IPV4` set, it builds no
//! bed and no server: a netchannel stack on IFACE (1, then N channels) sends each transfer
//! as an ncperf bulk stream to `ncperf server -i IFACE -a ADDR` (`virtual_stream`) and
//! `ncperf server --kernel -a ADDR` (`kernel_xdp_attached`) on the peer, port PORT
//! (default 7700), every byte checked by the server. `raw_channel`, `raw_channel_copy`
//! and `kernel_nothing_attached` are skipped there (they need the server's channel set in
//! this process, or a peer with no stack attached); the first line names the peer.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! `cargo bench -j1 --bench vns_goodput`

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

    use netchannel::perf_proto::Pattern;

    use super::bed::gbps;
    use super::remote;
    use super::vns::{self, env_or, kernel_transfer, kernel_transfer_streams, Phase, StackBench};

    /// The remote-peer mode: per channel configuration, one local stack (restarted with
    /// 1, then N throughput channels) sends `total` bytes of ncperf's pattern to
    /// `ncperf server` (`virtual_stream`) and to `ncperf server --kernel`
    /// (`kernel_xdp_attached`: both ends run a stack, so both have its program attached),
    /// each stream checked byte for byte by the server. `raw_channel`, `raw_channel_copy`
    /// and `kernel_nothing_attached` are skipped: the first two need a channel sink in the
    /// server's process, the third a peer with no stack attached.
    fn remote_main(total: u64, rounds: usize, configs: &[usize], on: impl Fn(&str) -> bool) {
        let pattern = Pattern::new();
        let mut phases = Vec::new();
        let mut first = true;
        for &channels in configs {
            let Some((r, rt)) =
                remote::start("vns_goodput", channels, 0, on("kernel_xdp_attached"))
            else {
                return;
            };
            if first {
                println!("{}", r.banner("vns_goodput"));
                println!(
                    "vns_goodput: {} MiB per transfer, {rounds} rounds; raw_channel, \
                     raw_channel_copy and kernel_nothing_attached skipped in remote mode (they \
                     need the server's channel set in this process, or no stack on the peer)",
                    total >> 20
                );
                first = false;
            }
            let mut phase = Phase::default();
            for round in 0..rounds {
                let mut line = format!("{channels} channel(s), round {round}:");
                for (name, kernel) in [("virtual_stream", false), ("kernel_xdp_attached", true)] {
                    if !on(name) {
                        continue;
                    }
                    let d = rt
                        .block_on(r.timed_sink(&pattern, total, kernel))
                        .unwrap_or_else(|e| remote::fail("vns_goodput", format!("{name}: {e}")));
                    let g = gbps(total, d);
                    phase.add(name, g);
                    line += &format!("  {name} {g:.3}");
                }
                println!("{line} Gbit/s");
            }
            r.stop();
            phases.push((channels, phase));
        }
        println!();
        println!(
            "vns_goodput summary ({} MiB per transfer, remote peer):",
            total >> 20
        );
        for (channels, phase) in &phases {
            phase.print(&format!(
                "local stack with {channels} throughput channel(s) per peer:"
            ));
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
        let streams: usize = env_or("NETCHANNEL_BENCH_STREAMS", 4).max(2);
        let only = std::env::var("NETCHANNEL_BENCH_ONLY").unwrap_or_default();
        let on = |name: &str| only.split(',').any(|o| name.contains(o));
        if std::env::var_os(remote::PEER_VAR).is_some() {
            let mut configs = vec![1, many];
            configs.dedup();
            return remote_main(total, rounds, &configs, on);
        }
        let Some((bed, rt)) = vns::bed_and_runtime("vns_goodput") else {
            return;
        };
        let link = std::env::var("NETCHANNEL_LINK").unwrap_or_else(|_| "xdp".into());
        println!(
            "vns_goodput: {} MiB per transfer, {rounds} rounds, test bed with 2 queues, MTU 1500, \
             stacks over {link}",
            total >> 20
        );

        // 0. Kernel TCP with nothing attached.
        let kl = vns::kernel_tokio_listener(&bed, &rt);
        let mut base = Phase::default();
        for round in 0..rounds {
            if !on("kernel_nothing_attached") {
                break;
            }
            let r = gbps(total, kernel_transfer(&bed, &rt, &kl, total));
            println!("round {round}: kernel_nothing_attached {r:.3} Gbit/s");
            base.add("kernel_nothing_attached", r);
        }
        for round in 0..rounds {
            if !on("kernel_streams_nothing_attached") {
                break;
            }
            let r = gbps(
                total,
                kernel_transfer_streams(&bed, &rt, &kl, total, streams),
            );
            println!("round {round}: kernel_streams_nothing_attached ({streams}) {r:.3} Gbit/s");
            base.add("kernel_streams_nothing_attached", r);
        }
        base.print("kernel TCP A -> B, nothing attached (tx csum off):");

        // 1. Stacks with 1 and N channels.
        let mut phases = Vec::new();
        let mut configs = vec![1, many];
        configs.dedup();
        for channels in configs {
            let bench = StackBench::start(&bed, &rt, channels, total);
            let mut phase = Phase::default();
            for round in 0..rounds {
                let mut line = format!("{channels} channel(s), round {round}:");
                let mut vs_raw = (None, None);
                if on("raw_channel") {
                    let raw = gbps(total, bench.raw_channel());
                    phase.add("raw_channel", raw);
                    vs_raw.1 = Some(raw);
                    line += &format!("  raw_channel {raw:.3}");
                }
                if on("raw_channel_copy") {
                    let r = gbps(total, bench.raw_channel_copy());
                    phase.add("raw_channel_copy", r);
                    line += &format!("  raw_channel_copy {r:.3}");
                }
                if on("virtual_stream") {
                    let vs = gbps(total, bench.virtual_stream(&rt));
                    phase.add("virtual_stream", vs);
                    vs_raw.0 = Some(vs);
                    line += &format!("  virtual_stream {vs:.3}");
                }
                if on("virtual_streams") {
                    let r = gbps(total, bench.virtual_streams(&rt, streams));
                    phase.add("virtual_streams", r);
                    line += &format!("  virtual_streams ({streams}) {r:.3}");
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
            bench.stop();
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
