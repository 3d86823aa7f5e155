//! Raw AF_XDP copy-mode transmit rate of [`XdpLink`] on a test-bed veth pair (as root):
//! full-size frames from A to B's kernel, which drops them (an experimental EtherType).
//!
//! `cargo run -p netdriver --example xdp_rate -- [SECONDS] [BATCH]` (defaults 2 and 64).
//! Only the sending thread is measured; B's side runs in softirq context on whatever core
//! the kernel picks. `benches/xdp_raw.rs` (root package) measures the same with criterion,
//! and also the rate a receiving `XdpLink` on B sees.

use std::time::{Duration, Instant as StdInstant};

use netdriver::link::xdp::{XdpLink, XdpLinkConfig};
use netdriver::link::{Link, TX_HEADROOM};
use netdriver::time::Instant;
use netdriver::wire::{EtherType, EthernetAddress, EthernetRepr};
use testbed::{Side, TestBed};

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().map_or(2.0, |s| s.parse().expect("SECONDS"));
    let batch: usize = args.next().map_or(64, |s| s.parse().expect("BATCH"));
    let bed = TestBed::builder()
        .queues(1)
        .build()
        .expect("building the test bed (run as root)");
    let a = bed.side(Side::A).clone();
    let b = bed.side(Side::B).clone();
    let (frames, bytes, elapsed) = bed
        .run_in(Side::A, move || {
            let mut link = XdpLink::open(XdpLinkConfig::new(&a.ifname, 0)).expect("open");
            let len = link.max_frame_len();
            let mut header = [0u8; 14];
            EthernetRepr {
                src: EthernetAddress(a.mac),
                dst: EthernetAddress(b.mac),
                ethertype: EtherType::Unknown(0x88b5),
            }
            .emit(&mut header)
            .expect("header");
            let run_for = Duration::from_secs_f64(secs);
            let start = StdInstant::now();
            while start.elapsed() < run_for {
                let mut left = batch;
                link.tx_batch(Instant::ZERO, batch, &mut |buf| {
                    if left == 0 {
                        return None;
                    }
                    left -= 1;
                    buf[TX_HEADROOM..TX_HEADROOM + 14].copy_from_slice(&header);
                    Some(TX_HEADROOM..TX_HEADROOM + len)
                });
                link.flush(Instant::ZERO);
            }
            let s = link.stats();
            (s.tx_frames, s.tx_bytes, start.elapsed())
        })
        .expect("namespace A");
    let t = elapsed.as_secs_f64();
    println!(
        "{frames} frames, {:.0} frames/s, {:.2} Gbit/s of frames ({} B each, batch {batch}, {t:.2} s)",
        frames as f64 / t,
        bytes as f64 * 8.0 / t / 1e9,
        bytes / frames.max(1)
    );
}
