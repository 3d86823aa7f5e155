//! The `echo` example's fixed command line, run as processes on the test bed: our server
//! (AF_XDP) in namespace A, clients in B on the kernel's TCP and on our stack, each
//! sending 20 MB that must come back verified; and a clean stop on SIGTERM that leaves no
//! XDP program behind.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use testbed::{testbed_or_skip, Side, TestBed};

const PORT: u16 = 7000;
/// Bytes each client sends (a debug build of our stack moves ~100 Mbit/s each way).
const BYTES: &str = "20M";
/// Longest wait for the server to start listening, or to exit once asked.
const DEADLINE: Duration = Duration::from_secs(60);

/// The example's binary, built (or found up to date) by cargo in this test's target
/// directory and profile.
fn echo_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/echo_example-<hash>
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps")
        .to_path_buf();
    let target_dir = profile_dir.parent().expect("target directory");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--quiet", "--example", "echo", "--manifest-path"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build --example echo");
    assert!(status.success(), "cargo build --example echo: {status}");
    let bin = profile_dir.join("examples").join("echo");
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

/// A running server process: killed on drop (the bed would kill it too).
struct Server {
    child: Child,
    /// Lines of its standard output.
    lines: mpsc::Receiver<String>,
}

impl Server {
    fn start(bed: &TestBed, bin: &PathBuf, extra: &[&str]) -> Server {
        let a = bed.side(Side::A);
        let mut child = bed
            .command_in(Side::A, bin)
            .args(["--interface", &a.ifname, "--ipv4", &a.ipv4.to_string()])
            .args(["--listen", &PORT.to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the echo server in A");
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
        let server = Server { child, lines };
        server.wait_for("listening on port", DEADLINE);
        server
    }

    /// Waits for an output line containing `text`; returns it.
    fn wait_for(&self, text: &str, deadline: Duration) -> String {
        let end = std::time::Instant::now() + deadline;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(e) => panic!("server printed no line with {text:?}: {e}"),
            }
        }
    }

    /// Waits for the process to exit; its status.
    fn wait_exit(&mut self, deadline: Duration) -> std::process::ExitStatus {
        let end = std::time::Instant::now() + deadline;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < end,
                "the server did not exit within {deadline:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client(bed: &TestBed, bin: &PathBuf, ours: bool) -> Output {
    let b = bed.side(Side::B);
    let target = format!("{}:{PORT}", bed.side(Side::A).ipv4);
    let mut cmd = bed.command_in(Side::B, bin);
    cmd.args([
        "--connect",
        &target,
        "--bytes",
        BYTES,
        "--timeout-secs",
        "30",
    ]);
    if ours {
        cmd.args(["--interface", &b.ifname, "--ipv4", &b.ipv4.to_string()]);
    }
    let out = cmd.output().expect("run the echo client in B");
    println!(
        "client (ours: {ours}): {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn program_attached(bed: &TestBed, side: Side) -> bool {
    let ifname = bed.side(side).ifname.clone();
    bed.run_in(side, move || xdp_prog::attached_program(&ifname))
        .expect("enter the namespace")
        .expect("query XDP")
        .is_some()
}

/// Our server in A echoes a kernel client and then our client in B, 20 MB each, and exits
/// by itself after the two connections (`--max-connections 2`).
#[test]
fn echo_server_serves_kernel_and_our_clients() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let bin = echo_binary();
    let mut server = Server::start(&bed, &bin, &["--max-connections", "2"]);
    assert!(program_attached(&bed, Side::A), "the server attached XDP");

    let kernel = client(&bed, &bin, false);
    let stdout = String::from_utf8_lossy(&kernel.stdout);
    assert!(kernel.status.success(), "kernel client: {kernel:?}");
    assert!(stdout.contains("using the kernel's TCP"), "{stdout}");
    assert!(
        stdout.contains("20000000 bytes") && stdout.contains("every byte verified"),
        "{stdout}"
    );
    assert!(stdout.contains("Gbit/s"), "{stdout}");
    let line = server.wait_for("connection 1", DEADLINE);
    assert!(line.contains("echoed 20000000 bytes"), "{line}");

    let ours = client(&bed, &bin, true);
    let stdout = String::from_utf8_lossy(&ours.stdout);
    assert!(ours.status.success(), "our client: {ours:?}");
    assert!(stdout.contains("netchannel on vB"), "{stdout}");
    assert!(stdout.contains("every byte verified"), "{stdout}");
    assert!(!program_attached(&bed, Side::B), "our client detached XDP");
    let line = server.wait_for("connection 2", DEADLINE);
    assert!(line.contains("echoed 20000000 bytes"), "{line}");

    server.wait_for("stopped after 2 connection(s)", DEADLINE);
    let status = server.wait_exit(DEADLINE);
    assert!(status.success(), "server exit: {status}");
    assert!(!program_attached(&bed, Side::A), "the server detached XDP");
}

/// SIGTERM stops a server that is idle, and one that is in the middle of echoing a
/// connection: it exits with success and detaches the XDP program.
#[test]
fn echo_server_stops_cleanly_on_sigterm() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let bin = echo_binary();
    let mut server = Server::start(&bed, &bin, &[]);
    assert!(program_attached(&bed, Side::A));
    // A connection that stays open: the server must abort it on the signal.
    let target = std::net::SocketAddr::from((bed.side(Side::A).ipv4, PORT));
    let (opened_tx, opened_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let holder = bed
        .spawn_thread_in(Side::B, move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect_timeout(&target, DEADLINE).expect("connect");
            s.write_all(b"ping").expect("write");
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).expect("echo");
            assert_eq!(&buf, b"ping");
            opened_tx.send(()).expect("report");
            // Hold the connection until the test is done.
            let _ = done_rx.recv_timeout(DEADLINE);
        })
        .expect("client thread in B");
    opened_rx.recv_timeout(DEADLINE).expect("echoed ping");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    // `ip netns exec` passes the signal on to the example, which it replaces (exec).
    let status = server.wait_exit(DEADLINE);
    assert!(status.success(), "server exit after SIGTERM: {status}");
    assert!(!program_attached(&bed, Side::A), "XDP detached");
    let _ = done_tx.send(());
    holder.join().expect("client thread");
}
