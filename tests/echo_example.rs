//! The `echo` example's fixed command line, run as processes on the test bed: our server
//! (a `VirtualListener` on AF_XDP) in namespace A serving kernel TCP clients and
//! NetChannel clients (the example on our stack) from B, one after the other and several
//! at once, every byte verified; our client against a kernel echo server (plain-TCP
//! fallback); and a clean stop on SIGTERM that resets open connections of both kinds and
//! leaves no XDP program behind.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;

use netchannel::Stack;
use support::{example_binary, ExampleServer, DEADLINE};
use testbed::{testbed_or_skip, Side, TestBed};

mod support;

const PORT: u16 = 7000;
/// Bytes each client sends (a debug build of our stack moves ~100 Mbit/s each way).
const BYTES: &str = "20M";
const BYTES_N: u64 = 20_000_000;

/// The example as a client in B, sending `bytes` to `target`; on our stack when `ours`.
fn client_command(
    bed: &TestBed,
    bin: &PathBuf,
    target: SocketAddr,
    bytes: &str,
    ours: bool,
) -> Command {
    let b = bed.side(Side::B);
    let mut cmd = bed.command_in(Side::B, bin);
    cmd.args(["--connect", &target.to_string(), "--bytes", bytes])
        .args(["--timeout-secs", "30"]);
    if ours {
        cmd.args(["--interface", &b.ifname, "--ipv4", &b.ipv4.to_string()]);
    }
    cmd
}

fn show(what: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!(
        "{what}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs the example client to our server in A; its standard output, after checking that
/// it succeeded and verified `BYTES`.
fn client(bed: &TestBed, bin: &PathBuf, ours: bool) -> String {
    let target = SocketAddr::from((bed.side(Side::A).ipv4, PORT));
    let out = client_command(bed, bin, target, BYTES, ours)
        .output()
        .expect("run the echo client in B");
    let stdout = show(&format!("client (ours: {ours})"), &out);
    assert!(out.status.success(), "client (ours: {ours}) failed");
    assert!(
        stdout.contains(&format!("{BYTES_N} bytes")) && stdout.contains("every byte verified"),
        "{stdout}"
    );
    assert!(stdout.contains("Gbit/s"), "{stdout}");
    stdout
}

fn program_attached(bed: &TestBed, side: Side) -> bool {
    let ifname = bed.side(side).ifname.clone();
    bed.run_in(side, move || xdp_prog::attached_program(&ifname))
        .expect("enter the namespace")
        .expect("query XDP")
        .is_some()
}

/// Our server in A echoes a kernel client and then our NetChannel client in B, 20 MB
/// each, saying which kind each connection is, and exits by itself after the two
/// connections (`--max-connections 2`).
#[test]
fn echo_server_serves_kernel_and_netchannel_clients() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let bin = example_binary("echo");
    let mut server = ExampleServer::start(&bed, &bin, PORT, &["--max-connections", "2"]);
    assert!(program_attached(&bed, Side::A), "the server attached XDP");
    let b_ip = bed.side(Side::B).ipv4.to_string();

    let stdout = client(&bed, &bin, false);
    assert!(stdout.contains("using the kernel's TCP"), "{stdout}");
    let line = server.wait_for(&["accepted connection 1 "]);
    assert!(
        line.contains(&b_ip) && line.ends_with("over plain-tcp"),
        "{line}"
    );
    let line = server.wait_for(&["connection 1 from", "echoed"]);
    assert!(
        line.contains("over plain-tcp: echoed 20000000 bytes"),
        "{line}"
    );

    let stdout = client(&bed, &bin, true);
    assert!(stdout.contains("netchannel on vB"), "{stdout}");
    assert!(stdout.contains("over netchannel"), "{stdout}");
    assert!(!program_attached(&bed, Side::B), "our client detached XDP");
    let line = server.wait_for(&["accepted connection 2 "]);
    assert!(
        line.contains(&b_ip) && line.ends_with("over netchannel"),
        "{line}"
    );
    let line = server.wait_for(&["connection 2 from", "echoed"]);
    assert!(
        line.contains("over netchannel: echoed 20000000 bytes"),
        "{line}"
    );

    server.wait_for(&["stopped after 2 connection(s)"]);
    let status = server.wait_exit();
    assert!(status.success(), "server exit: {status}");
    assert!(!program_attached(&bed, Side::A), "the server detached XDP");
}

/// With `--channel-key`, our server in A admits over real AF_XDP channels only NetChannel
/// clients that prove the same key: one with another key fails, saying why, and never
/// reaches the listener; one with the key is echoed.
#[test]
fn echo_server_with_a_channel_key_serves_only_clients_with_it() {
    const KEY: &str = "a channel key shared by the test's stacks";
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let bin = example_binary("echo");
    let mut server = ExampleServer::start(
        &bed,
        &bin,
        PORT,
        &["--max-connections", "1", "--channel-key", KEY],
    );
    let target = SocketAddr::from((bed.side(Side::A).ipv4, PORT));

    let out = client_command(&bed, &bin, target, "1M", true)
        .args(["--channel-key", "another key, long enough to be accepted"])
        .output()
        .expect("run the echo client in B");
    show("client with another key", &out);
    assert!(
        !out.status.success(),
        "a client with another key was served"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("does not hold our channel key"),
        "the client says why: {stderr}"
    );
    assert!(
        !program_attached(&bed, Side::B),
        "the failed client detached XDP"
    );

    let out = client_command(&bed, &bin, target, BYTES, true)
        .args(["--channel-key", KEY])
        .output()
        .expect("run the echo client in B");
    let stdout = show("client with the key", &out);
    assert!(out.status.success(), "the client with the key failed");
    assert!(stdout.contains("over netchannel"), "{stdout}");
    assert!(stdout.contains("every byte verified"), "{stdout}");
    // The refused client never became a connection: the one served is number 1.
    let line = server.wait_for(&["accepted connection 1 "]);
    assert!(line.ends_with("over netchannel"), "{line}");
    server.wait_for(&["stopped after 1 connection(s)"]);
    let status = server.wait_exit();
    assert!(status.success(), "server exit: {status}");
}

/// Several clients at once, both kinds: three kernel clients and one NetChannel client
/// (one stack per interface: a second one on vB would find its XDP program busy), all
/// verified; then SIGTERM stops the idle server with success.
#[test]
fn echo_server_serves_several_clients_at_once() {
    const KERNEL: usize = 3;
    const EACH: &str = "8M";
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let bin = example_binary("echo");
    let mut server = ExampleServer::start(&bed, &bin, PORT, &[]);
    let target = SocketAddr::from((bed.side(Side::A).ipv4, PORT));
    let mut children = Vec::new();
    for i in 0..=KERNEL {
        let ours = i == KERNEL;
        let child = client_command(&bed, &bin, target, EACH, ours)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a client in B");
        children.push((ours, child));
    }
    for (ours, child) in children {
        let out = child.wait_with_output().expect("client output");
        let stdout = show(&format!("client (ours: {ours})"), &out);
        assert!(out.status.success(), "client (ours: {ours}) failed");
        assert!(
            stdout.contains("8000000 bytes") && stdout.contains("every byte verified"),
            "{stdout}"
        );
        let kind = if ours {
            "over netchannel"
        } else {
            "kernel's TCP"
        };
        assert!(stdout.contains(kind), "{stdout}");
    }
    // Four connections, each echoed in full; exactly one over netchannel.
    let mut kinds = Vec::new();
    for id in 1..=KERNEL + 1 {
        let line = server.wait_for(&[&format!("connection {id} from"), "echoed"]);
        assert!(line.contains("echoed 8000000 bytes"), "{line}");
        kinds.push(line.contains("over netchannel:"));
    }
    assert_eq!(kinds.iter().filter(|&&k| k).count(), 1, "{kinds:?}");
    server.sigterm();
    let status = server.wait_exit();
    assert!(status.success(), "server exit after SIGTERM: {status}");
    server.wait_for(&["stopped after 4 connection(s)"]);
    assert!(!program_attached(&bed, Side::A), "XDP detached");
    assert!(!program_attached(&bed, Side::B), "XDP detached");
}

/// SIGTERM stops a server that is in the middle of two connections, a kernel TCP one and
/// a NetChannel one (held open by this test): it resets both, exits with success and
/// detaches the XDP program.
#[test]
fn echo_server_stops_cleanly_on_sigterm() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let bin = example_binary("echo");
    let mut server = ExampleServer::start(&bed, &bin, PORT, &[]);
    assert!(program_attached(&bed, Side::A));
    let target = SocketAddr::from((bed.side(Side::A).ipv4, PORT));
    // A kernel connection that stays open.
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
    server.wait_for(&["accepted connection 1 ", "over plain-tcp"]);

    // A NetChannel connection that stays open, from a stack in this process.
    let b = bed.side(Side::B);
    let (ifname, ipv4) = (b.ifname.clone(), b.ipv4);
    let stack = bed
        .run_in(Side::B, move || {
            Stack::builder().interface(ifname).ipv4(ipv4).build()
        })
        .expect("enter B")
        .expect("our stack in B");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut vs = rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::time::timeout(DEADLINE, stack.connect(target))
            .await
            .expect("connect in time")
            .expect("connect");
        assert!(!s.is_plain_tcp());
        s.write_all(b"pong").await.unwrap();
        let mut buf = [0u8; 4];
        tokio::time::timeout(DEADLINE, s.read_exact(&mut buf))
            .await
            .expect("echo in time")
            .unwrap();
        assert_eq!(&buf, b"pong");
        s
    });
    server.wait_for(&["accepted connection 2 ", "over netchannel"]);

    server.sigterm();
    let status = server.wait_exit();
    assert!(status.success(), "server exit after SIGTERM: {status}");
    assert!(!program_attached(&bed, Side::A), "XDP detached");
    server.wait_for(&["connection 1 from", "over plain-tcp: stopped by a signal"]);
    server.wait_for(&["connection 2 from", "over netchannel: stopped by a signal"]);
    // The held NetChannel stream learns that the server went away.
    let r = rt.block_on(async {
        use tokio::io::AsyncReadExt;
        tokio::time::timeout(DEADLINE, vs.read(&mut [0u8; 8])).await
    });
    let r = r.expect("the read ends in time");
    assert!(r.is_err(), "read after the server reset: {r:?}");
    let _ = done_tx.send(());
    holder.join().expect("client thread");
    drop(vs);
    // Stopped here rather than left to the drop's background linger, so that the XDP
    // program is detached when the drop returns. The server reset our streams: nothing
    // is left to deliver, and the outcome does not matter.
    let _ = rt.block_on(stack.shutdown_graceful(DEADLINE));
    drop(rt);
    drop(stack);
    assert!(
        !program_attached(&bed, Side::B),
        "our stack in B detached XDP"
    );
}

/// Our client on our stack against a kernel echo server in A (no channel port there):
/// `connect` falls back to plain TCP, and 20 MB come back verified.
#[test]
fn netchannel_client_falls_back_to_plain_tcp_against_a_kernel_server() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let bin = example_binary("echo");
    let a_ip = bed.side(Side::A).ipv4;
    let (ready_tx, ready_rx) = mpsc::channel();
    let kernel_server = bed
        .spawn_thread_in(Side::A, move || {
            use std::io::{Read, Write};
            let l = std::net::TcpListener::bind((a_ip, PORT)).expect("bind in A");
            ready_tx.send(()).expect("ready");
            let (mut s, _) = l.accept().expect("accept");
            s.set_read_timeout(Some(DEADLINE)).unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            let mut echoed = 0u64;
            loop {
                let n = s.read(&mut buf).expect("read");
                if n == 0 {
                    break;
                }
                s.write_all(&buf[..n]).expect("echo");
                echoed += n as u64;
            }
            s.shutdown(std::net::Shutdown::Write).expect("shutdown");
            echoed
        })
        .expect("kernel server thread in A");
    ready_rx
        .recv_timeout(DEADLINE)
        .expect("kernel server ready");
    let stdout = client(&bed, &bin, true);
    assert!(stdout.contains("netchannel on vB"), "{stdout}");
    assert!(stdout.contains("over plain-tcp"), "{stdout}");
    assert_eq!(kernel_server.join().expect("kernel server"), BYTES_N);
    assert!(!program_attached(&bed, Side::B), "our client detached XDP");
}
