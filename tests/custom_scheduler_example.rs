//! `examples/custom_scheduler.rs` as a process: the user-written policy plugged in with
//! `StackBuilder::scheduler` keeps bulk bytes off its fast lane (the example checks the
//! per-channel statistics itself and fails otherwise), on in-memory stacks.
#![cfg(target_os = "linux")]

use std::process::Command;

use support::example_binary;

mod support;

#[test]
fn the_user_policy_steers_bulk_chunks_off_the_fast_lane() {
    let out = Command::new(example_binary("custom_scheduler"))
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("SizeSteering"), "{stdout}");
    // Four throughput channels listed for each of the two runs.
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.trim_start().starts_with("ch"))
            .count(),
        8
    );
}
