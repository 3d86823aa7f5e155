//! Shared by the tests that run an example as a process (`echo_example`, `kv_example`,
//! `demo_example`): building the example's binary, and a server process in namespace A
//! of the test bed whose output lines a test waits for.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::cell::RefCell;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use testbed::{Side, TestBed};

/// Longest wait for a server to print an expected line or to exit once asked.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The binary of example `name`, built (or found up to date) by cargo in the calling
/// test's target directory and profile.
pub fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test>-<hash>
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps")
        .to_path_buf();
    let target_dir = profile_dir.parent().expect("target directory");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--quiet", "--example", name, "--manifest-path"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build
        .status()
        .unwrap_or_else(|e| panic!("run cargo build --example {name}: {e}"));
    assert!(status.success(), "cargo build --example {name}: {status}");
    let bin = profile_dir.join("examples").join(name);
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

/// An example running as a server in namespace A (`--interface`, `--ipv4` of A's side and
/// `--listen PORT`), killed on drop (the bed would kill it too).
pub struct ExampleServer {
    pid: nix::unistd::Pid,
    /// Lines of its standard output, as they come.
    lines: mpsc::Receiver<String>,
    /// Lines received so far.
    seen: RefCell<Vec<String>>,
    /// Its exit status, from the thread that waits for it.
    exited: mpsc::Receiver<ExitStatus>,
    status: Option<ExitStatus>,
}

impl ExampleServer {
    /// Starts `bin` with `extra` arguments and waits until it says it listens (on the
    /// channel port 9000 too).
    pub fn start(bed: &TestBed, bin: &Path, port: u16, extra: &[&str]) -> ExampleServer {
        let a = bed.side(Side::A);
        let mut child = bed
            .command_in(Side::A, bin)
            .args(["--interface", &a.ifname, "--ipv4", &a.ipv4.to_string()])
            .args(["--listen", &port.to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {} in A: {e}", bin.display()));
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                println!("server: {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        // The process is waited for on its own thread, so that a test waits for its exit
        // on a channel (with a deadline) instead of polling.
        let (done, exited) = mpsc::channel();
        std::thread::spawn(move || {
            if let Ok(status) = child.wait() {
                let _ = done.send(status);
            }
        });
        let server = ExampleServer {
            pid,
            lines,
            seen: RefCell::new(Vec::new()),
            exited,
            status: None,
        };
        let line = server.wait_for(&["listening on port"]);
        assert!(line.contains("channel port 9000"), "{line}");
        server
    }

    /// Waits for an output line (printed so far or later) containing every one of
    /// `parts`; returns it.
    pub fn wait_for(&self, parts: &[&str]) -> String {
        let matches = |l: &String| parts.iter().all(|p| l.contains(p));
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(l) = self.seen.borrow().iter().find(|l| matches(l)) {
                return l.clone();
            }
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.borrow_mut().push(line),
                Err(e) => panic!(
                    "server printed no line with {parts:?} ({e}); it printed {:#?}",
                    self.seen.borrow()
                ),
            }
        }
    }

    /// Sends SIGTERM. `ip netns exec` passes it on to the example, which it replaces
    /// (exec).
    pub fn sigterm(&self) {
        nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    }

    /// Waits (bounded) for the process to exit; its status.
    pub fn wait_exit(&mut self) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        let status = self
            .exited
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|e| panic!("the server did not exit within {DEADLINE:?} ({e})"));
        self.status = Some(status);
        status
    }

    /// Whether the process is still running (it has not exited so far).
    pub fn running(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.exited.try_recv() {
            Ok(status) => {
                self.status = Some(status);
                false
            }
            Err(_) => true,
        }
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit; its status.
    pub fn stop(&mut self) -> ExitStatus {
        self.sigterm();
        self.wait_exit()
    }
}

impl Drop for ExampleServer {
    fn drop(&mut self) {
        if self.status.is_none() && self.exited.try_recv().is_err() {
            let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
            let _ = self.exited.recv_timeout(DEADLINE);
        }
    }
}
