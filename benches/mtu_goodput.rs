//! Bulk goodput by MTU: one channel and one `VirtualStream` against kernel TCP **at its
//! defaults** (nothing attached, TSO/GSO/GRO and checksum offload on: what users compare
//! with), on the same veth at the same MTU, interleaved round by round in one run.
//!
//! For each MTU (default 1500, 9000 and [`LARGEST_MTU`], the largest our link takes; veth
//! with the `xdp.frags` program accepts up to 65535), a fresh two-queue test bed, then
//! rounds of:
//!
//! 1. `kernel_defaults`: kernel TCP A → B (tokio sockets in the namespaces), checked to
//!    run with no XDP or TCX program attached on either end;
//! 2. for each variant (`base`: a fixed receive buffer; `autotune`: receive-buffer
//!    auto-tuning up to `NETCHANNEL_BENCH_RX_MAX_KIB`, default 6 MiB; `nogso`: `autotune`
//!    with the AF_XDP link's software segmentation off; `nocsum`: `autotune` with the
//!    AF_XDP link's checksum offload through TX metadata off, so that it sums every frame
//!    itself; `packet`: `autotune` over the AF_PACKET link, `LinkKind::Packet`, instead
//!    of AF_XDP), a
//!    fresh pair of stacks with one throughput channel per peer, then `raw_channel` (one
//!    channel of A's set to B's, 64 KiB `Bytes` slices, no copy) and `virtual_stream`
//!    (one `VirtualStream`, 64 KiB `write_all`s, read to EOF), and the stacks stopped
//!    again (which detaches their programs).
//!
//! Above MTU 1500 the sets use 4096-byte UMEM frames (a 9014-byte frame is a chain of 3;
//! at [`LARGEST_MTU`] 16, the most a chain may have), as `support/vns.rs`'s `StackPair`
//! sets them for any bed above MTU 1500; the MSS (MTU − 40) and the steering program's
//! `xdp.frags` variant follow the MTU by `ChannelSet`'s defaults. `base`
//! pins `rx_buffer_max: None` (a fixed 256 KiB receive buffer) and `autotune` sets it
//! (the default: `tcp::Config::rx_buffer_max` is 6 MiB).
//!
//! The stacks are placed as a stack built inside the bench's runtime places them (queues on
//! the application's runtime where the scheduler wants them there);
//! `NETCHANNEL_BENCH_PLACEMENT=own` gives them queue runtimes of their own instead.
//!
//! Environment: `NETCHANNEL_BENCH_MTUS` (comma-separated), `NETCHANNEL_BENCH_BYTES` (per
//! transfer, default 256 MiB), `NETCHANNEL_BENCH_ROUNDS` (default 5),
//! `NETCHANNEL_BENCH_VARIANTS` (`base,autotune`; also `nogso`, `nocsum`, `packet`), `NETCHANNEL_BENCH_RX_MAX_KIB`,
//! `NETCHANNEL_BENCH_TX_KIB` (TCP send buffer of both variants; default TCP's 256 KiB),
//! `NETCHANNEL_BENCH_ONLY` (comma-separated substrings of the measurements to run, e.g.
//! for `perf record`; ratios need both sides).
//!
//! Without `--bench` (`cargo test --all-targets`) it runs one round of 2 MiB transfers at
//! MTU 1500 and 9000, as a smoke test.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! `cargo bench -j1 --bench mtu_goodput`

#[cfg(target_os = "linux")]
#[path = "support/bed.rs"]
mod bed;
#[cfg(target_os = "linux")]
#[path = "support/vns.rs"]
mod vns;

#[cfg(target_os = "linux")]
mod run {
    use super::bed::gbps;
    use super::vns::{self, env_or, kernel_transfer, Phase, StackBench};
    use netchannel::netdriver::channel::{ChannelSetConfig, LinkKind};
    use testbed::{Side, TestBed};

    /// The largest MTU our link takes with 4096-byte UMEM frames: a frame may span at most
    /// 16 descriptors (`MAX_CHAIN_DESCRIPTORS`) of 4096 − 256 bytes each, less the
    /// 14-byte Ethernet header.
    pub const LARGEST_MTU: u32 = 16 * (4096 - 256) - 14;

    /// A variant of our side's settings.
    #[derive(Clone, Copy)]
    struct Variant {
        raw: &'static str,
        stream: &'static str,
        /// `tcp::Config::rx_buffer_max`.
        rx_max: Option<usize>,
        /// The AF_XDP link's software segmentation (`XdpLinkConfig::segmentation`).
        segmentation: bool,
        /// Checksums through TX metadata (`XdpLinkConfig::tx_checksum_offload`).
        tx_checksum: bool,
        /// The link.
        link: LinkKind,
    }

    /// A variant's TCP settings (the MTU-dependent ones are `StackPair`'s, see the module
    /// docs).
    fn tune(
        rx_max: Option<usize>,
        tx: Option<usize>,
        segmentation: bool,
        tx_checksum: bool,
        link: LinkKind,
    ) -> impl Fn(&mut ChannelSetConfig) + Clone + Send + 'static {
        move |cfg: &mut ChannelSetConfig| {
            cfg.tcp.rx_buffer_max = rx_max;
            cfg.link.segmentation = segmentation;
            cfg.link.tx_checksum_offload = tx_checksum;
            cfg.link_kind = link;
            if let Some(tx) = tx {
                cfg.tcp.tx_buffer = tx;
            }
        }
    }

    /// Panics if an XDP program or a TCX program is attached to either veth end (the
    /// kernel reference must run at veth's defaults, with our stacks' programs gone).
    fn assert_no_xdp(bed: &TestBed) {
        for side in Side::BOTH {
            let ifname = bed.side(side).ifname.clone();
            let text = bed
                .output_in(side, "ip", &["link", "show", "dev", &ifname])
                .expect("ip link show");
            assert!(
                !text.contains("xdp"),
                "an XDP program is still attached: {text}"
            );
            let tcx = bed
                .run_in(side, move || xdp_prog::tcx_ingress_programs(&ifname))
                .expect("enter the namespace")
                .expect("query TCX");
            assert_eq!(tcx, 0, "a TCX program is still attached to {side:?}");
        }
    }

    /// How an XDP program is attached to `side`'s veth end now, as `ip link` shows it
    /// (`xdp`: native, `xdpgeneric`: generic), or `none`.
    fn xdp_mode(bed: &TestBed, side: Side) -> String {
        let ifname = bed.side(side).ifname.clone();
        let text = bed
            .output_in(side, "ip", &["link", "show", "dev", &ifname])
            .expect("ip link show");
        text.split_whitespace()
            .find(|w| w.starts_with("xdp"))
            .unwrap_or("none")
            .to_owned()
    }

    pub fn main() {
        let full = vns::bench_mode();
        let total: u64 = env_or(
            "NETCHANNEL_BENCH_BYTES",
            if full { 256u64 << 20 } else { 2 << 20 },
        );
        let rounds: usize = env_or("NETCHANNEL_BENCH_ROUNDS", if full { 5 } else { 1 });
        let default_mtus = if full {
            format!("1500,9000,{LARGEST_MTU}")
        } else {
            "1500,9000".to_owned()
        };
        let mtus: Vec<u32> = std::env::var("NETCHANNEL_BENCH_MTUS")
            .unwrap_or(default_mtus)
            .split(',')
            .map(|m| m.trim().parse().expect("NETCHANNEL_BENCH_MTUS: numbers"))
            .collect();
        let rx_max = env_or("NETCHANNEL_BENCH_RX_MAX_KIB", 6144usize) << 10;
        let tx = std::env::var("NETCHANNEL_BENCH_TX_KIB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map(|k| k << 10);
        let names = std::env::var("NETCHANNEL_BENCH_VARIANTS")
            .unwrap_or_else(|_| "base,autotune".to_owned());
        let mut variants = Vec::new();
        for name in names.split(',') {
            variants.push(match name.trim() {
                "base" => Variant {
                    raw: "raw_channel",
                    stream: "virtual_stream",
                    rx_max: None,
                    segmentation: true,
                    tx_checksum: true,
                    link: LinkKind::Xdp,
                },
                "autotune" => Variant {
                    raw: "raw_channel_autotune",
                    stream: "virtual_stream_autotune",
                    rx_max: Some(rx_max),
                    segmentation: true,
                    tx_checksum: true,
                    link: LinkKind::Xdp,
                },
                "nogso" => Variant {
                    raw: "raw_channel_nogso",
                    stream: "virtual_stream_nogso",
                    rx_max: Some(rx_max),
                    segmentation: false,
                    tx_checksum: true,
                    link: LinkKind::Xdp,
                },
                "nocsum" => Variant {
                    raw: "raw_channel_nocsum",
                    stream: "virtual_stream_nocsum",
                    rx_max: Some(rx_max),
                    segmentation: true,
                    tx_checksum: false,
                    link: LinkKind::Xdp,
                },
                "packet" => Variant {
                    raw: "raw_channel_packet",
                    stream: "virtual_stream_packet",
                    rx_max: Some(rx_max),
                    segmentation: true,
                    tx_checksum: true,
                    link: LinkKind::Packet,
                },
                other => panic!("NETCHANNEL_BENCH_VARIANTS: unknown variant {other:?}"),
            });
        }
        let only = std::env::var("NETCHANNEL_BENCH_ONLY").unwrap_or_default();
        let on = |name: &str| only.split(',').any(|o| name.contains(o));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(env_or("NETCHANNEL_BENCH_WORKERS", 2usize).max(1))
            .enable_all()
            .build()
            .expect("runtime");
        // The stacks drive their queues where an application's stack built in this
        // runtime would (the default placement), not on runtimes of their own: the
        // bench's stacks are built outside it.
        vns::set_app_runtime(Some(rt.handle().clone()));
        println!(
            "mtu_goodput: {} MiB per transfer, {rounds} rounds, MTUs {mtus:?}, test bed with \
             2 queues, kernel TCP at veth's defaults; autotune up to {} KiB; TCP send buffer {}",
            total >> 20,
            rx_max >> 10,
            tx.map_or("default".to_owned(), |t| format!("{} KiB", t >> 10)),
        );
        let mut phases = Vec::new();
        for &mtu in &mtus {
            let bed = match TestBed::builder().queues(2).mtu(mtu).build() {
                Ok(bed) => bed,
                Err(e) => {
                    println!("skipping mtu_goodput: {e}");
                    return;
                }
            };
            let kl = vns::kernel_tokio_listener(&bed, &rt);
            let mut phase = Phase::default();
            for round in 0..rounds {
                let mut line = format!("MTU {mtu}, round {round}:");
                if on("kernel_defaults") {
                    assert_no_xdp(&bed);
                    let k = gbps(total, kernel_transfer(&bed, &rt, &kl, total));
                    phase.add("kernel_defaults", k);
                    line += &format!("  kernel_defaults {k:.3}");
                }
                for v in &variants {
                    if !on(v.raw) && !on(v.stream) {
                        continue;
                    }
                    let bench = StackBench::start_configured(
                        &bed,
                        &rt,
                        1,
                        total,
                        tune(v.rx_max, tx, v.segmentation, v.tx_checksum, v.link),
                    );
                    if round == 0 {
                        line += &format!(
                            "  [program on vA: {}, vB: {}]",
                            xdp_mode(&bed, Side::A),
                            xdp_mode(&bed, Side::B)
                        );
                    }
                    if on(v.raw) {
                        let (d, stats) = bench.raw_channel_stats();
                        let r = gbps(total, d);
                        phase.add(v.raw, r);
                        line += &format!(
                            "  {} {r:.3} (resent {}, RTOs {})",
                            v.raw, stats.retransmitted_segments, stats.rto_timeouts
                        );
                    }
                    if on(v.stream) {
                        let r = gbps(total, bench.virtual_stream(&rt));
                        phase.add(v.stream, r);
                        line += &format!("  {} {r:.3}", v.stream);
                    }
                    bench.stop();
                }
                println!("{line} Gbit/s");
            }
            drop(kl);
            phases.push((mtu, phase));
        }
        println!();
        println!("mtu_goodput summary ({} MiB per transfer):", total >> 20);
        for (mtu, phase) in &phases {
            phase.print(&format!("MTU {mtu}:"));
            for (a, b) in [
                ("raw_channel", "kernel_defaults"),
                ("virtual_stream", "kernel_defaults"),
                ("raw_channel_autotune", "kernel_defaults"),
                ("virtual_stream_autotune", "kernel_defaults"),
                ("raw_channel_autotune", "raw_channel"),
                ("virtual_stream_autotune", "virtual_stream"),
                ("raw_channel_packet", "kernel_defaults"),
                ("virtual_stream_packet", "kernel_defaults"),
                ("raw_channel_packet", "raw_channel_autotune"),
                ("virtual_stream_packet", "virtual_stream_autotune"),
                ("raw_channel_autotune", "raw_channel_nocsum"),
                ("virtual_stream_autotune", "virtual_stream_nocsum"),
            ] {
                if let Some((lo, med, hi)) = phase.ratio(a, b) {
                    println!(
                        "{:<48} {lo:>6.2} {med:>6.2} {hi:>6.2}",
                        format!("{a} / {b}")
                    );
                }
            }
        }
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    run::main();
    #[cfg(not(target_os = "linux"))]
    println!("skipping mtu_goodput: the test bed is Linux only");
}
