//! The `demo` example (`examples/demo.rs`) as a process, with small transfers: the simulated
//! fallback (`--sim`) verifies its TCP transfer over the simulated link and a
//! `VirtualStream` between two in-memory stacks; on the test bed (privileged) it prints
//! every measurement of the channel run and of the VirtualStream phase, with the ratios.
//!
//! The test-bed test skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::process::Command;

use support::example_binary;
use testbed::{testbed_or_skip, TestBed};

mod support;

/// Runs the demo with `args`; asserts it succeeded and returns its standard output.
fn run_demo(args: &[&str]) -> String {
    let out = Command::new(example_binary("demo"))
        .args(args)
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo {args:?}: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The Gbit/s figure that follows `prefix` on the line starting with it.
fn rate_after(stdout: &str, prefix: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{stdout}"));
    line[prefix.len()..]
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no figure after {prefix:?} in {line:?}"))
}

#[test]
fn sim_fallback_verifies_the_tcp_transfer_and_an_in_memory_virtual_stream() {
    let stdout = run_demo(&["--sim", "--bytes", "2000000", "--vns-bytes", "3000000"]);
    assert!(stdout.contains("SIMULATED LINK"), "{stdout}");
    assert!(
        stdout.contains("transferred 2000000 bytes A -> B, every byte verified"),
        "{stdout}"
    );
    assert!(stdout.contains("IN-MEMORY stacks"), "{stdout}");
    assert!(
        stdout.contains("3000000 bytes, every byte verified"),
        "{stdout}"
    );
    assert!(rate_after(&stdout, "goodput:") > 0.0, "{stdout}");
    // --sim never touches the test bed.
    assert!(!stdout.contains("AF_XDP TEST BED"), "{stdout}");
}

#[test]
fn test_bed_run_measures_the_virtual_stream_beside_a_raw_channel_and_kernel_tcp() {
    // Only asks whether a bed can be built here (skip or, under CI, fail); the demo
    // builds its own.
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    drop(bed);
    let stdout = run_demo(&[
        "--bed-bytes",
        "2097152",
        "--rounds",
        "1",
        "--raw-frames",
        "4096",
        "--vns-bytes",
        "2097152",
        "--vns-rounds",
        "2",
        "--vns-channels",
        "2",
    ]);
    assert!(stdout.contains("AF_XDP TEST BED"), "{stdout}");
    assert!(!stdout.contains("falls back"), "{stdout}");
    // Both configurations ran, each with every measurement in each of its two rounds.
    for channels in [1, 2] {
        assert!(
            stdout.contains(&format!(
                "stacks with {channels} throughput channel(s) per peer:"
            )),
            "{stdout}"
        );
    }
    for name in [
        "raw_channel ",
        "raw_channel_copy ",
        "virtual_stream ",
        "kernel_xdp_attached ",
    ] {
        let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with(name)).collect();
        // One row per configuration in the phase, one in each summary.
        assert!(rows.len() >= 2, "{name}: {rows:?}");
        let figures: Vec<f64> = rows[0]
            .split_whitespace()
            .skip(1)
            .take_while(|w| *w != "Gbit/s")
            .map(|w| w.parse().expect("a rate"))
            .collect();
        assert_eq!(figures.len(), 2, "{name}: {:?}", rows[0]);
        assert!(figures.iter().all(|&r| r > 0.0), "{name}: {figures:?}");
    }
    for ratio in [
        "virtual_stream / raw_channel ",
        "virtual_stream / raw_channel_copy ",
        "virtual_stream / kernel_xdp_attached ",
    ] {
        assert_eq!(
            stdout.lines().filter(|l| l.starts_with(ratio)).count(),
            2,
            "{ratio} once per configuration:\n{stdout}"
        );
    }
}
