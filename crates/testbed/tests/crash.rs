//! A process that dies without unwinding (abort, SIGKILL) cannot run `Drop`: its namespaces
//! stay until `TestBed::cleanup_stale` (called by every build) removes them. This binary
//! holds a single test so that no other bed of this process cleans up concurrently.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use testbed::{testbed_or_skip, Side, TestBed};

/// Set in the child: build a bed, print its namespaces, abort.
const CHILD_ENV: &str = "NCTB_CRASH_CHILD";

#[test]
fn namespaces_of_a_crashed_process_are_removed() {
    if std::env::var_os(CHILD_ENV).is_some() {
        let bed = TestBed::builder()
            .queues(2)
            .build()
            .expect("child builds a bed");
        let mut out = std::io::stdout().lock();
        for side in Side::BOTH {
            writeln!(out, "NETNS {}", bed.side(side).netns).unwrap();
        }
        out.flush().unwrap();
        std::process::abort();
    }

    // Only to learn whether this process may build beds (skip or fail otherwise).
    let Some(probe) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    drop(probe);

    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "namespaces_of_a_crashed_process_are_removed",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the child should have aborted: {out:?}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("NETNS "))
        .collect();
    assert_eq!(names.len(), 2, "child output: {stdout}");
    let handle = |n: &str| Path::new("/var/run/netns").join(n);
    for n in &names {
        assert!(
            handle(n).exists(),
            "{n} vanished although its process never ran Drop"
        );
    }

    let removed = TestBed::cleanup_stale().unwrap();
    assert!(removed >= 2, "removed {removed}");
    for n in &names {
        assert!(!handle(n).exists(), "{n} survived cleanup_stale");
    }
}
