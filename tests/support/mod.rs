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

pub mod chunks;
pub mod raw;

/// Longest wait for a server to print an expected line or to exit once asked.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The binary of example `name`, built (or found up to date) by cargo in the calling
/// test's target directory and profile.
pub fn example_binary(name: &str) -> PathBuf {
    example_binary_with(name, &[])
}

/// [`example_binary`] for an example that needs cargo `features`.
pub fn example_binary_with(name: &str, features: &[&str]) -> PathBuf {
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
    if !features.is_empty() {
        build.arg("--features").arg(features.join(","));
    }
    let status = build
        .status()
        .unwrap_or_else(|e| panic!("run cargo build --example {name}: {e}"));
    assert!(status.success(), "cargo build --example {name}: {status}");
    let bin = profile_dir.join("examples").join(name);
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

/// A process's memory (`/proc/PID/status`), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// Resident set size now (`VmRSS`).
    pub rss: u64,
    /// Largest resident set size so far, or since the last
    /// [`ExampleServer::reset_peak_memory`] (`VmHWM`).
    pub peak: u64,
    /// Anonymous memory resident now (`RssAnon`: heap, stacks; without the UMEM, which is
    /// shared memory, nor the executable's pages).
    pub anon: u64,
}

/// An example running as a server in namespace A (`--interface`, `--ipv4` of A's side and
/// `--listen PORT`), killed on drop (the bed would kill it too).
pub struct ExampleServer {
    pid: nix::unistd::Pid,
    /// Its executable.
    bin: PathBuf,
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
            bin: bin.to_path_buf(),
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
        if let Some(l) = self.seen.borrow().iter().find(|l| matches(l)) {
            return l.clone();
        }
        // Only new lines from here (a server may print thousands of lines: scanning all of
        // them again for each would make many waits quadratic).
        let end = Instant::now() + DEADLINE;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = matches(&line).then(|| line.clone());
                    self.seen.borrow_mut().push(line);
                    if let Some(l) = hit {
                        return l;
                    }
                }
                Err(e) => panic!(
                    "server printed no line with {parts:?} ({e}); it printed {:#?}",
                    self.seen.borrow()
                ),
            }
        }
    }

    /// Waits until `n` output lines (printed so far or later) satisfy `pred`.
    pub fn wait_for_count(&self, n: usize, pred: impl Fn(&str) -> bool) {
        let mut count = self.seen.borrow().iter().filter(|l| pred(l)).count();
        let end = Instant::now() + DEADLINE;
        while count < n {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    count += usize::from(pred(&line));
                    self.seen.borrow_mut().push(line);
                }
                Err(e) => panic!("server printed {count} of {n} lines awaited ({e})"),
            }
        }
    }

    /// The process's memory now, from `/proc/PID/status` (the example's own: `ip netns
    /// exec` replaces itself with it).
    pub fn memory(&self) -> Memory {
        let path = format!("/proc/{}/status", self.pid);
        let status =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        let kib = |field: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {field} in {path}:\n{status}"))
                * 1024
        };
        let name = status.lines().next().unwrap_or_default();
        let bin = self.bin.file_name().and_then(|n| n.to_str()).unwrap_or("");
        // `Name:` holds at most 15 characters of the executable's name.
        assert!(
            name.contains(&bin[..bin.len().min(15)]),
            "{path} is not the example's: {name}"
        );
        Memory {
            rss: kib("VmRSS"),
            peak: kib("VmHWM"),
            anon: kib("RssAnon"),
        }
    }

    /// The process's threads now (`Threads:` of `/proc/PID/status`).
    pub fn threads(&self) -> u64 {
        let path = format!("/proc/{}/status", self.pid);
        let status =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no Threads in {path}"))
    }

    /// The process's open file descriptors now (entries of `/proc/PID/fd`).
    pub fn open_fds(&self) -> usize {
        let path = format!("/proc/{}/fd", self.pid);
        std::fs::read_dir(&path)
            .unwrap_or_else(|e| panic!("reading {path}: {e}"))
            .count()
    }

    /// Resets the process's peak resident set size (`VmHWM`) to its current size
    /// (`/proc/PID/clear_refs`, value 5; needs root), so that a later [`Self::memory`]'s
    /// `peak` is the largest it has been since; returns the memory now.
    pub fn reset_peak_memory(&self) -> Memory {
        let path = format!("/proc/{}/clear_refs", self.pid);
        std::fs::write(&path, "5").unwrap_or_else(|e| panic!("writing {path}: {e}"));
        self.memory()
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
