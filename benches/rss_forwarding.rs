//! How many received frames a channel set forwards between its queues, on the plain veth
//! bed and on the RSS bed with and without RSS alignment, in one run: the cost alignment
//! of channels removes.
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
//! For each row: two channel sets (4 queues), B listening on a channel port, A opening
//! `NETCHANNEL_BENCH_CHANNELS` channels (default 8, spread over A's queues round-robin)
//! one after another, each carrying `NETCHANNEL_BENCH_MIB` MiB (default 16) to B. Prints,
//! per side, the frames its queues received for owned flows (the steering program's
//! redirects) and those forwarded, A's channels by steering (aligned/forwarded), and the
//! goodput.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! Without `--bench` (`cargo test --all-targets`) it moves 1 MiB per channel as a smoke
//! test. `cargo bench -j1 --bench rss_forwarding`

#[cfg(target_os = "linux")]
#[path = "support/bed.rs"]
mod bed;

#[cfg(target_os = "linux")]
mod run {
    use std::net::SocketAddrV4;
    use std::time::Instant;

    use bytes::Bytes;
    use netchannel::netdriver::channel::{ChannelSet, ChannelSetConfig, RssAlignment};
    use netchannel::netdriver::rss::RssConfig;
    use testbed::{RssTable, Side, TestBed, TestBedBuilder};

    use super::bed;

    const QUEUES: u32 = 4;
    const PORT: u16 = 9100;

    fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
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

    /// Moves `channels` × `bytes` from A to B; returns the seconds it took.
    fn transfer(bed: &TestBed, a: &ChannelSet, b: &ChannelSet, channels: u32, bytes: u64) -> f64 {
        let sink = bed::ChannelSink::start(b.listen(PORT).expect("listen"), bytes);
        let target = SocketAddrV4::new(bed.side(Side::B).ipv4, PORT);
        let block = Bytes::from(vec![0x5a; 64 << 10]);
        let start = Instant::now();
        for _ in 0..channels {
            bed::channel_send(a, target, &block, bytes);
        }
        let took = start.elapsed().as_secs_f64();
        sink.stop();
        took
    }

    pub fn main() {
        let bench = std::env::args().any(|a| a == "--bench");
        let channels: u32 = env_or("NETCHANNEL_BENCH_CHANNELS", 8);
        let mib: u64 = env_or("NETCHANNEL_BENCH_MIB", if bench { 16 } else { 1 });
        let key: Vec<u8> = (0u8..40).map(|i| i.wrapping_mul(73) ^ 0xa5).collect();
        let table = || RssTable::spread(&key, 128, QUEUES).expect("table");
        let rss_a = {
            let t = table();
            RssConfig::toeplitz(t.key(), t.indirection()).expect("RSS")
        };
        let rss_bed = || TestBed::builder().queues(QUEUES).rss(table(), table());
        let rows: [(&str, TestBedBuilder, RssAlignment); 3] = [
            (
                "veth",
                TestBed::builder().queues(QUEUES),
                RssAlignment::Probe,
            ),
            ("rss, alignment off", rss_bed(), RssAlignment::Off),
            ("rss, aligned", rss_bed(), RssAlignment::Known(rss_a)),
        ];
        println!(
            "{:<19} {:>8} {:>11} {:>11} {:>11} {:>11} {:>9} {:>7}",
            "bed",
            "channels",
            "A received",
            "A forwarded",
            "B received",
            "B forwarded",
            "A al/fwd",
            "Gbit/s"
        );
        for (name, builder, rss) in rows {
            let bed = match builder.build() {
                Ok(bed) => bed,
                Err(e) => {
                    println!("skipping rss_forwarding: {e}");
                    return;
                }
            };
            let a = set_in(&bed, Side::A, rss);
            let b = set_in(&bed, Side::B, RssAlignment::Probe);
            let took = transfer(&bed, &a, &b, channels, mib << 20);
            let received = |s: &ChannelSet| s.steering_counters().map_or(0, |c| c.redirected);
            let (fa, fb) = (a.forwarded_frames().0, b.forwarded_frames().0);
            let steered = a.steering_counts();
            println!(
                "{name:<19} {channels:>8} {:>11} {fa:>11} {:>11} {fb:>11} {:>9} {:>7.2}",
                received(&a),
                received(&b),
                format!("{}/{}", steered.aligned, steered.forwarded),
                (u64::from(channels) * (mib << 20)) as f64 * 8.0 / took / 1e9,
            );
            drop((a, b));
        }
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    run::main();
}
