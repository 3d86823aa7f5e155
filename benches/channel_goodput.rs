//! One TCP channel's goodput against the raw frame-rate ceiling of our AF_XDP link and
//! against kernel TCP over the same veth, all in one run on the test bed (two queues,
//! MTU 1500); prints the ratios at the end (issue target: channel goodput ≥ 70 % of the
//! raw ceiling). See `support/bed.rs` (`measure_all`) for what each benchmark does:
//!
//! - `channel_goodput/raw_tx_only`, `raw_a_to_b`: our link alone, 1514-byte frames;
//! - `kernel_offloads_on`, `kernel_nothing_attached`, `kernel_xdp_on_receiver`: kernel TCP
//!   A → B at veth's defaults, with tx checksumming off, and with our steering program on
//!   vB;
//! - `kernel_to_ours`, `ours_to_kernel`, `ours_to_ours`: one channel (64 MiB per
//!   connection) between our stack and the kernel's, and between two of ours.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! `cargo bench -j1 --bench channel_goodput -- --warm-up-time 1 --measurement-time 3`

#[cfg(target_os = "linux")]
#[path = "support/bed.rs"]
mod bed;

#[cfg(target_os = "linux")]
fn run() {
    use criterion::{Criterion, Throughput};
    use testbed::TestBed;

    /// Bytes per connection.
    const BYTES: u64 = 64 << 20;

    let bed = match TestBed::builder().queues(2).build() {
        Ok(bed) => bed,
        Err(e) => {
            println!("skipping channel_goodput: {e}");
            return;
        }
    };
    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group("channel_goodput");
    g.sample_size(10);
    let figures = bed::measure_all(&bed, BYTES, &mut |name, _what, unit, f| {
        g.throughput(match unit {
            bed::Unit::Frames { count, .. } => Throughput::Elements(count),
            bed::Unit::Bytes(b) => Throughput::Bytes(b),
        });
        g.bench_function(name, |bench| bench.iter_custom(&mut *f));
    });
    g.finish();
    println!("channel_goodput: totals over warm-up and measurement (Gbit/s = bits / time):");
    figures.print();
}

fn main() {
    #[cfg(target_os = "linux")]
    run();
    #[cfg(not(target_os = "linux"))]
    println!("skipping channel_goodput: the test bed is Linux only");
}
