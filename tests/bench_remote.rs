//! The benches' remote-peer mode as a user runs it between two hosts: `ncperf server`
//! (netchannel) and `ncperf server --kernel` as two processes in namespace B of a bed, and
//! the `rpc_rate` bench binary in its smoke mode (no `--bench`) in namespace A with
//! `NETCHANNEL_BENCH_PEER`, `NETCHANNEL_BENCH_INTERFACE` and `NETCHANNEL_BENCH_ADDRESS`
//! set: it must exit 0 and print figures for both netchannel and kernel TCP. A peer
//! where nothing listens, and a missing variable, must each stop it with one line.
//!
//! The bench binary is the one cargo built beside this test (`cargo test --test
//! bench_remote --bench rpc_rate`, or `--all-targets`); without it the test fails and
//! says how to build it.
//!
//! Skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use netchannel::perf_proto::{self, Op};
use testbed::{testbed_or_skip, Side, TestBed};

const NCPERF: &str = env!("CARGO_BIN_EXE_ncperf");
/// Longest wait for a server's first line, or for its port to accept.
const DEADLINE: Duration = Duration::from_secs(60);

/// The newest `rpc_rate` bench executable cargo built into this test's directory.
fn bench_binary() -> PathBuf {
    let me = std::env::current_exe().expect("this test's path");
    let dir = me.parent().expect("the deps directory");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .expect("read the deps directory")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.starts_with("rpc_rate-") && p.extension().is_none()
        })
        .filter_map(|p| {
            use std::os::unix::fs::PermissionsExt;
            let m = std::fs::metadata(&p).ok()?;
            (m.is_file() && m.permissions().mode() & 0o111 != 0)
                .then(|| (m.modified().ok().unwrap_or(std::time::UNIX_EPOCH), p))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, p)) => p,
        None => panic!(
            "no rpc_rate bench binary in {}; build it with this test: `cargo test --test \
             bench_remote --bench rpc_rate`",
            dir.display()
        ),
    }
}

/// An `ncperf server` in namespace B, its output lines as they come; killed on drop (so
/// also when an assertion fails).
struct Server {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Server {
    /// Starts it and waits (at most [`DEADLINE`]) for its first line, which it prints once
    /// its listeners accept.
    fn start(bed: &TestBed, args: &[&str]) -> Server {
        let mut child = bed
            .command_in(Side::B, NCPERF)
            .arg("server")
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn ncperf server in B");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let server = Server { child, lines };
        let first = server
            .lines
            .recv_timeout(DEADLINE)
            .expect("the server's first line");
        assert!(first.contains("listening on"), "{first}");
        server
    }

    /// SIGTERM; asserts a clean exit; the server's last line.
    fn stop(mut self) -> String {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "server: {status}");
        let mut last = String::new();
        while let Ok(l) = self.lines.recv_timeout(DEADLINE) {
            last = l;
        }
        last
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (at most [`DEADLINE`]) until the kernel server at `to` accepts from namespace A
/// and answers a well-formed, empty echo connection with its close.
fn wait_kernel_port(bed: &TestBed, to: SocketAddr) {
    let end = Instant::now() + DEADLINE;
    let probe = move || -> std::io::Result<()> {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(&perf_proto::hello(Op::Echo, 0))?;
        s.shutdown(std::net::Shutdown::Write)?;
        let mut rest = Vec::new();
        s.read_to_end(&mut rest)?;
        if !rest.is_empty() {
            return Err(std::io::Error::other("bytes from an empty echo"));
        }
        Ok(())
    };
    loop {
        let r = bed.run_in(Side::A, probe).expect("enter A");
        match r {
            Ok(()) => return,
            Err(e) if Instant::now() >= end => panic!("kernel server at {to}: {e}"),
            // A refused connect returns at once; the next try is the next instant.
            Err(_) => std::thread::yield_now(),
        }
    }
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The bench in namespace A, in remote mode against `peer` (with `env` besides).
fn bench(bed: &TestBed, peer: &str, env: &[(&str, String)]) -> Output {
    let a = bed.side(Side::A).clone();
    let mut cmd = bed.command_in(Side::A, bench_binary());
    cmd.env("NETCHANNEL_BENCH_PEER", peer)
        .env("NETCHANNEL_BENCH_INTERFACE", &a.ifname)
        .env("NETCHANNEL_BENCH_ADDRESS", a.ipv4.to_string())
        .env("NETCHANNEL_BENCH_SECS", "0.2")
        .env_remove("NETCHANNEL_BENCH_ONLY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run the rpc_rate bench")
}

/// The summary's rows: (size, conns, netchannel requests/s, kernel requests/s).
fn summary_rows(stdout: &str) -> Vec<(u64, u64, f64, f64)> {
    stdout
        .lines()
        .skip_while(|l| !l.starts_with("rpc_rate summary"))
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() >= 4, "a summary row: {l}");
            (
                f[0].parse().expect("size"),
                f[1].parse().expect("conns"),
                f[2].parse().expect("netchannel's rate"),
                f[3].parse().expect("kernel's rate"),
            )
        })
        .collect()
}

#[test]
fn rpc_rate_bench_runs_against_ncperf_servers_on_a_remote_peer() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let b = bed.side(Side::B).clone();
    let bench_path = bench_binary();
    println!("bench: {}", bench_path.display());
    let ip = b.ipv4.to_string();
    let netchannel = Server::start(&bed, &["-i", &b.ifname, "-a", &ip]);
    let kernel = Server::start(&bed, &["--kernel", "-a", &ip]);
    wait_kernel_port(
        &bed,
        SocketAddr::new(b.ipv4.into(), perf_proto::DEFAULT_PORT),
    );

    let out = bench(&bed, &ip, &[]);
    let (stdout, stderr) = text(&out);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "rpc_rate: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first.contains(&format!("against remote peer {ip}")),
        "{first}"
    );
    let rows = summary_rows(&stdout);
    // Smoke mode: sizes 64 and 4096, 1 and 8 connections.
    assert_eq!(
        rows.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(),
        vec![(64, 1), (64, 8), (4096, 1), (4096, 8)],
        "{stdout}"
    );
    for (size, conns, v, k) in &rows {
        assert!(
            *v > 0.0,
            "no netchannel figure for {size} B × {conns}: {stdout}"
        );
        assert!(
            *k > 0.0,
            "no kernel figure for {size} B × {conns}: {stdout}"
        );
    }
    assert!(stdout.contains("skipped: remote"), "{stdout}");

    // Nothing listens on the next ports but one: both transports' first request fails,
    // netchannel's first, in one line.
    let out = bench(
        &bed,
        &format!("{ip}:{}", perf_proto::DEFAULT_PORT + 10),
        &[],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let line = stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "one line, not:\n{stderr}");
    assert!(line.starts_with("rpc_rate: peer "), "{line}");
    assert!(line.contains("unreachable over netchannel"), "{line}");
    assert!(line.contains("ncperf server -i IFACE -a ADDR"), "{line}");

    // No local interface: one line naming the variable.
    let out = bench(
        &bed,
        &ip,
        &[("NETCHANNEL_BENCH_INTERFACE", "nosuch0".to_string())],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let line = stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "one line, not:\n{stderr}");
    assert!(line.contains("no interface \"nosuch0\""), "{line}");
    assert!(line.contains("NETCHANNEL_BENCH_INTERFACE"), "{line}");

    for (name, server) in [("netchannel", netchannel), ("kernel", kernel)] {
        let last = server.stop();
        assert!(
            last.contains("ncperf server: stopped after"),
            "{name}: {last}"
        );
        assert!(last.contains("(0 ended in an error)"), "{name}: {last}");
    }
}
