//! What one stack costs per NIC queue: threads, resident and pinned memory, and start-up
//! time, on test beds of 1 to 64 queues (a ConnectX-5 has 32-64).
//!
//! For each queue count, a bed is built and a `netchannel::Stack` (its defaults, on every
//! queue of `vB`) is started inside namespace B; the process's `/proc/self/status`
//! (`Threads`, `VmRSS`) is read before and after, and the new threads are grouped by
//! name. Nothing is sent: this is the footprint of a stack at rest. The UMEM column is
//! what the links map (frames × frame size per queue, `MAP_POPULATE`: all resident);
//! AF_XDP charges it to the user's locked memory (`RLIMIT_MEMLOCK`), not to `VmPin`.
//!
//! Environment: `NETCHANNEL_BENCH_QUEUE_COUNTS` (comma-separated, default `1,8,64`; the
//! smoke test run by `cargo test --all-targets` uses `1,4`).
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! `cargo bench -j1 --bench queue_footprint`

#[cfg(target_os = "linux")]
mod run {
    use std::collections::BTreeMap;
    use std::time::Instant;

    use netchannel::netdriver::link::xdp::XdpLinkConfig;
    use netchannel::Stack;
    use testbed::{Side, TestBed};

    /// `Threads` and `VmRSS` (KiB) of this process.
    fn status() -> (u64, u64) {
        let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("Threads:"), field("VmRSS:"))
    }

    /// This process's threads, counted by name with digits dropped (`nc-chan-3` counts
    /// as `nc-chan-`).
    fn thread_names() -> BTreeMap<String, u64> {
        let mut names = BTreeMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for task in dir.flatten() {
                let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                let key: String = comm
                    .trim()
                    .chars()
                    .filter(|c| !c.is_ascii_digit())
                    .collect();
                *names.entry(key).or_insert(0) += 1;
            }
        }
        names
    }

    pub fn main() {
        let bench = std::env::args().any(|a| a == "--bench");
        let counts: Vec<u32> = std::env::var("NETCHANNEL_BENCH_QUEUE_COUNTS")
            .ok()
            .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_else(|| if bench { vec![1, 8, 64] } else { vec![1, 4] });
        println!(
            "{:>6} {:>8} {:>9} {:>10} {:>10} {:>11} {:>10}  new threads by name",
            "queues", "threads", "per-queue", "RSS MiB", "UMEM MiB", "MiB/queue", "start ms"
        );
        for q in counts {
            let bed = match TestBed::builder().queues(q).build() {
                Ok(bed) => bed,
                Err(e) => {
                    println!("skipping queue_footprint: {e}");
                    return;
                }
            };
            let b = bed.side(Side::B).clone();
            let line = bed
                .run_in(Side::B, move || {
                    let names_before = thread_names();
                    let (t0, rss0) = status();
                    let start = Instant::now();
                    let stack = Stack::builder()
                        .interface(b.ifname.clone())
                        .ipv4(b.ipv4)
                        .build()
                        .expect("stack");
                    let took = start.elapsed();
                    let (t1, rss1) = status();
                    let mut names = thread_names();
                    for (name, n) in names_before {
                        if let Some(m) = names.get_mut(&name) {
                            *m = m.saturating_sub(n);
                        }
                    }
                    names.retain(|_, n| *n > 0);
                    drop(stack);
                    let threads = t1.saturating_sub(t0);
                    let rss = rss1.saturating_sub(rss0) as f64 / 1024.0;
                    let link = XdpLinkConfig::new(b.ifname.clone(), 0);
                    let umem = f64::from(q) * f64::from(link.frame_count) * f64::from(link.frame_size)
                        / f64::from(1u32 << 20);
                    format!(
                        "{q:>6} {threads:>8} {:>9.2} {rss:>10.1} {umem:>10.1} {:>11.2} {:>10.1}  {names:?}",
                        threads as f64 / f64::from(q),
                        rss / f64::from(q),
                        took.as_secs_f64() * 1e3,
                    )
                })
                .expect("run in B");
            println!("{line}");
        }
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    run::main();
}
