//! Raw AF_XDP frame rate on the test bed: our [`XdpLink`] alone, no TCP, 1514-byte frames.
//! This is the ceiling for everything built on the link.
//!
//! - `xdp_raw/tx_only`: an `XdpLink` on `vA` sends frames of an experimental EtherType to
//!   B's kernel, which drops them (nothing attached on `vB`). Time per batch of frames until
//!   every one has completed (copy mode: the kernel copied it into an skb and handed it to
//!   veth).
//! - `xdp_raw/tx_only_budget_32`: the same with the link's copy-mode budget per `sendto`
//!   kick at the kernel's old fixed 32 frames (`XdpLinkConfig::tx_skb_budget`), where
//!   `tx_only` runs with the tx ring's worth (`XDP_MAX_TX_SKB_BUDGET`, Linux 6.17+).
//! - `xdp_raw/a_to_b`: the same link sends TCP frames to a port B owns; the `xdp-prog`
//!   steering program on `vB` redirects them to an `XdpLink` on `vB` whose thread counts
//!   them. Time per batch of frames *received*: a batch's time is scaled by sent/received,
//!   so frames lost in the rings (rx ring full on B) lower the rate rather than hide.
//!
//! Only the headers of each frame are written (the 1460 bytes behind them are whatever the
//! UMEM frame held), as the kernel copies the whole frame either way. Both threads and the
//! kernel's softirq work share the machine's cores.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! `cargo bench --bench xdp_raw -- --warm-up-time 1 --measurement-time 4`

#[cfg(target_os = "linux")]
#[path = "support/bed.rs"]
mod bed;

#[cfg(target_os = "linux")]
mod linux {
    use std::time::Instant as StdInstant;

    use criterion::{Criterion, Throughput};
    use netchannel::netdriver::link::Link;
    use testbed::TestBed;

    use crate::bed::{self, RawReceiver};

    /// Frames per measured batch.
    const BATCH_FRAMES: u64 = 4096;

    pub fn run() {
        let bed = match TestBed::builder().queues(1).build() {
            Ok(bed) => bed,
            Err(e) => {
                println!("skipping xdp_raw: {e}");
                return;
            }
        };
        let mut link = bed::open_tx_link(&bed);
        let frame_len = link.max_frame_len() as u64;
        let mut c = Criterion::default().configure_from_args();

        // Tx only: B's kernel drops the frames (nothing attached on vB yet).
        let drop_header = bed::drop_header(&bed);
        let mut g = c.benchmark_group("xdp_raw");
        g.throughput(Throughput::Elements(BATCH_FRAMES));
        g.bench_function("tx_only", |bench| {
            bench.iter_custom(|iters| {
                let start = StdInstant::now();
                bed::send_frames(&mut link, &drop_header, iters * BATCH_FRAMES);
                start.elapsed()
            })
        });

        // The same with the kernel's default of 32 frames per copy-mode kick instead of the
        // tx ring's worth (`XDP_MAX_TX_SKB_BUDGET`, Linux 6.17+), in the same run.
        println!(
            "xdp_raw: tx budget per kick {} frames",
            link.tx_skb_budget()
        );
        drop(link);
        let mut link32 = bed::open_tx_link_with(&bed, |c| c.tx_skb_budget = 32);
        g.bench_function("tx_only_budget_32", |bench| {
            bench.iter_custom(|iters| {
                let start = StdInstant::now();
                bed::send_frames(&mut link32, &drop_header, iters * BATCH_FRAMES);
                start.elapsed()
            })
        });
        drop(link32);
        let mut link = bed::open_tx_link(&bed);

        // A → B through the steering program into B's link.
        let rx = RawReceiver::start(&bed);
        let header = bed::tcp_header(&bed);
        let (mut sent_total, mut got_total) = (0u64, 0u64);
        g.bench_function("a_to_b", |bench| {
            bench.iter_custom(|iters| {
                let n = iters * BATCH_FRAMES;
                let (time, got) = bed::a_to_b(&mut link, &rx, &header, n);
                sent_total += n;
                got_total += got;
                // Time per BATCH_FRAMES frames received.
                time
            })
        });
        g.finish();
        let summary = rx.stop();
        println!(
            "xdp_raw: a_to_b received {got_total} of {sent_total} frames sent ({:.2} %) of \
             {frame_len} B; {summary}",
            got_total as f64 * 100.0 / sent_total.max(1) as f64
        );
        println!(
            "xdp_raw: Gbit/s of frames = frames/s x {frame_len} x 8 / 1e9 = frames/s x {:.3e}",
            frame_len as f64 * 8.0 / 1e9
        );
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    linux::run();
    #[cfg(not(target_os = "linux"))]
    println!("skipping xdp_raw: AF_XDP is Linux only");
}
