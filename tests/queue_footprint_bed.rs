//! A stack on an interface with 64 queues (a ConnectX-5 has 32-64) starts with a bounded
//! number of threads and bounded memory: its queues are driven by queue runtimes whose
//! number follows the cores, not the queues, and each queue costs its UMEM and rings.
//! (`benches/queue_footprint.rs` prints the same figures for 1, 8 and 64 queues.)
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use netchannel::Stack;
use testbed::{testbed_or_skip, Side, TestBed};

/// Threads and resident memory (KiB) of this process (`/proc/self/status`).
fn status() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u64 {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:"))
}

#[test]
fn a_stack_on_64_queues_starts_with_bounded_threads_and_memory() {
    const QUEUES: u32 = 64;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(QUEUES)) else {
        return;
    };
    let b = bed.side(Side::B).clone();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let (threads, rss_kib, queues, runtimes) = bed
        .run_in(Side::B, move || {
            let (t0, rss0) = status();
            let stack = Stack::builder()
                .interface(b.ifname.clone())
                .ipv4(b.ipv4)
                .build()
                .expect("a stack on every queue");
            let (t1, rss1) = status();
            let placement = stack.diagnostics().channel_placement();
            let queues = stack.diagnostics().queue_stats().len();
            drop(stack);
            (
                t1.saturating_sub(t0),
                rss1.saturating_sub(rss0),
                queues,
                placement.runtimes.len(),
            )
        })
        .expect("run in B");
    eprintln!(
        "{QUEUES} queues: {threads} new threads, {runtimes} runtimes, {rss_kib} KiB resident"
    );
    assert_eq!(queues, QUEUES as usize, "a socket on every queue");
    // Queue runtimes: at most one per core (here the application's runtime drives the
    // queues and the set keeps one home runtime); plus the neighbour resolver.
    assert!(
        threads <= cores + 3,
        "{threads} new threads for {QUEUES} queues on {cores} cores ({runtimes} runtimes)"
    );
    // Memory: each queue's UMEM (4096 frames of 2 KiB, resident from the start) and its
    // rings; nothing grows with the queues beyond that.
    let per_queue_kib = rss_kib / u64::from(QUEUES);
    assert!(
        per_queue_kib <= 10 * 1024,
        "{per_queue_kib} KiB per queue ({rss_kib} KiB for {QUEUES} queues)"
    );
}
