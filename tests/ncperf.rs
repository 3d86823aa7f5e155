//! `ncperf` as a user runs it: the demo end to end (in-memory stacks without privileges,
//! the two-namespace AF_XDP bed with them), `ncperf server` and `ncperf client` as two
//! processes in the bed's two namespaces (netchannel, then kernel TCP), and each
//! misconfiguration's one-line error with its fix.
//!
//! The bed tests skip without root, and fail instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use testbed::{testbed_or_skip, Side, TestBed};

const NCPERF: &str = env!("CARGO_BIN_EXE_ncperf");
/// Longest wait for a server's first line.
const DEADLINE: Duration = Duration::from_secs(60);

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncperf-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch directory");
    d
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `cmd`; asserts success; returns standard output.
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run ncperf");
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "{cmd:?}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

/// Runs `cmd`; asserts it failed with one line on standard error containing every one of
/// `parts`; returns that line.
fn run_fails(cmd: &mut Command, parts: &[&str]) -> String {
    let out = cmd.output().expect("run ncperf");
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{cmd:?} should fail\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let line = stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "one line, not:\n{stderr}");
    assert!(line.starts_with("ncperf: "), "{line}");
    for p in parts {
        assert!(line.contains(p), "no {p:?} in: {line}");
    }
    println!("{line}");
    line.to_string()
}

fn report(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("the --json report");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["schema"], "ncperf-report/1");
    v
}

fn measurements<'a>(v: &'a Value, test: &str, transport: &str) -> Vec<&'a Value> {
    v["measurements"]
        .as_array()
        .expect("measurements")
        .iter()
        .filter(|m| m["test"] == test && m["transport"] == transport)
        .collect()
}

fn positive(m: &Value, key: &str) -> f64 {
    let x = m[key].as_f64().unwrap_or_else(|| panic!("no {key} in {m}"));
    assert!(x > 0.0, "{key} = {x} in {m}");
    x
}

/// Every test's figures for `transport` are there and plausible.
fn check_suite(v: &Value, transport: &str, rpc_points: usize) {
    let bulk = measurements(v, "bulk", transport);
    assert!(!bulk.is_empty(), "no bulk for {transport}");
    for m in bulk {
        positive(m, "goodput_gbps");
    }
    let rpc = measurements(v, "rpc", transport);
    assert_eq!(rpc.len(), rpc_points, "rpc points of {transport}");
    for m in rpc {
        positive(m, "requests_per_s");
    }
    for m in measurements(v, "latency", transport) {
        let l = &m["latency"];
        assert!(l["samples"].as_u64().unwrap() > 0);
        let (p50, p99, p999) = (
            positive(l, "p50_us"),
            positive(l, "p99_us"),
            positive(l, "p999_us"),
        );
        assert!(p50 <= p99 && p99 <= p999, "{l}");
    }
    for m in measurements(v, "connect", transport) {
        positive(m, "connections_per_s");
    }
}

#[test]
fn demo_on_in_memory_stacks_prints_the_table_json_and_charts() {
    let dir = scratch("mem");
    let json = dir.join("r.json");
    let charts = dir.join("charts");
    let stdout = run_ok(
        Command::new(NCPERF)
            .args(["demo", "--in-memory", "--quick", "--duration", "0.1"])
            .arg("--json")
            .arg(&json)
            .arg("--plot")
            .arg(&charts),
    );
    let first = stdout.lines().next().unwrap_or_default();
    assert!(first.contains("IN-MEMORY STACKS"), "{first}");
    assert!(first.contains("no TCP, no AF_XDP"), "{first}");
    assert!(stdout.contains("netchannel   kernel TCP"), "{stdout}");
    assert!(
        !stdout.contains("kernel+XDP"),
        "no XDP column in memory:\n{stdout}"
    );
    let v = report(&json);
    assert_eq!(v["environment"], "in_memory");
    for t in ["netchannel", "kernel"] {
        check_suite(&v, t, 4);
        let iso = measurements(&v, "isolation", t);
        assert_eq!(iso.len(), 1, "{t}");
        positive(&iso[0]["loaded_latency"], "p999_us");
    }
    assert!(measurements(&v, "rpc", "kernel_xdp").is_empty());
    assert_eq!(measurements(&v, "sweep_channels", "netchannel").len(), 4);
    assert_eq!(
        measurements(&v, "sweep_copy_workers", "netchannel").len(),
        2
    );
    assert!(
        measurements(&v, "sweep_links", "netchannel").is_empty(),
        "in-memory stacks have no link to sweep"
    );
    for chart in [
        "latency_cdf.svg",
        "isolation_cdf.svg",
        "request_rate.svg",
        "goodput_channels.svg",
        "goodput_copy_workers.svg",
    ] {
        let svg = std::fs::read_to_string(charts.join(chart)).expect(chart);
        assert!(
            svg.starts_with("<svg") && svg.contains("netchannel"),
            "{chart}"
        );
    }
    // The charts come back from the report alone.
    let again = dir.join("again");
    let out = run_ok(Command::new(NCPERF).arg("plot").arg(&json).arg(&again));
    assert_eq!(out.lines().count(), 5, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_on_the_test_bed_compares_with_kernel_tcp_at_its_defaults() {
    // Only asks whether a bed can be built here (skip or, under CI, fail); the demo
    // builds its own.
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    drop(bed);
    let dir = scratch("bed");
    let json = dir.join("r.json");
    let stdout = run_ok(
        Command::new(NCPERF)
            .args(["demo", "--quick", "--duration", "0.2"])
            .args(["--sweep-channels", "1", "--sweep-copy-workers", "1"])
            .arg("--json")
            .arg(&json),
    );
    let first = stdout.lines().next().unwrap_or_default();
    assert!(first.contains("AF_XDP TEST BED"), "{first}");
    assert!(first.contains("kernel TCP at its defaults"), "{first}");
    assert!(stdout.contains("kernel+XDP"), "{stdout}");
    assert!(stdout.contains("4 KB latency p99.9 (µs)"), "{stdout}");
    let v = report(&json);
    assert_eq!(v["environment"], "af_xdp_test_bed");
    for t in ["netchannel", "kernel", "kernel_xdp"] {
        check_suite(&v, t, 4);
        assert_eq!(measurements(&v, "isolation", t).len(), 1, "{t}");
    }
    let ifaces = v["machine"]["interfaces"].as_array().expect("interfaces");
    assert_eq!(ifaces.len(), 2);
    for i in ifaces {
        assert_eq!(i["driver"], "veth");
        assert_eq!(
            (i["rx_queues"].as_u64(), i["mtu"].as_u64()),
            (Some(2), Some(1500))
        );
    }
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    assert!(!v["machine"]["kernel"].as_str().unwrap().is_empty());
    // Bulk over each link, 1 stream and the many-streams count, every byte checked.
    let links = measurements(&v, "sweep_links", "netchannel");
    assert_eq!(links.len(), 4, "{links:?}");
    for (m, link) in links.iter().zip(["xdp", "xdp", "packet", "packet"]) {
        assert_eq!(m["link"], link);
        positive(m, "goodput_gbps");
    }
    assert!(stdout.contains("(Gbit/s) by link: xdp → "), "{stdout}");
    assert!(stdout.contains(", packet → "), "{stdout}");
    assert_eq!(v["config"]["stack"]["link"], "xdp");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ncperf server` in namespace B, its output lines as they come; killed on drop.
struct Server {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Server {
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
        let first = lines
            .recv_timeout(DEADLINE)
            .expect("the server's first line");
        assert!(first.contains("listening on"), "{first}");
        Server { child, lines }
    }

    /// SIGTERM; the server's last line.
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

#[test]
fn server_and_client_run_as_two_processes_between_the_namespaces() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());
    let dir = scratch("hosts");
    for kernel in [false, true] {
        let mut stack: Vec<String> = Vec::new();
        if kernel {
            stack.push("--kernel".into());
        }
        let own = |e: &testbed::Endpoint| {
            if kernel {
                vec!["-a".to_string(), e.ipv4.to_string()]
            } else {
                vec![
                    "-i".to_string(),
                    e.ifname.clone(),
                    "-a".to_string(),
                    e.ipv4.to_string(),
                ]
            }
        };
        let server_args: Vec<String> = stack.iter().cloned().chain(own(&b)).collect();
        let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
        let server = Server::start(&bed, &server_args);
        let json = dir.join(format!("client-{kernel}.json"));
        let stdout = run_ok(
            bed.command_in(Side::A, NCPERF)
                .arg("client")
                .args(&stack)
                .args(own(&a))
                .args(["--peer", &b.ipv4.to_string()])
                .args(["--test", "bulk,rpc,latency,connect,isolation"])
                .args(["--duration", "0.2", "--conns", "1,4", "--sizes", "64"])
                .arg("--json")
                .arg(&json),
        );
        assert!(stdout.starts_with("ncperf client: bulk, rpc, latency, connect, isolation"));
        assert!(stdout.contains("requests/s, 64 B × 4 conns"), "{stdout}");
        let v = report(&json);
        assert_eq!(
            (v["command"].as_str(), v["environment"].as_str()),
            (Some("client"), Some("hosts"))
        );
        let t = if kernel { "kernel" } else { "netchannel" };
        check_suite(&v, t, 2);
        let iso = measurements(&v, "isolation", t);
        positive(&iso[0]["latency"], "p999_us");
        positive(&iso[0]["loaded_latency"], "p999_us");
        let last = server.stop();
        assert!(last.contains("ncperf server: stopped after"), "{last}");
        assert!(last.contains("(0 ended in an error)"), "{last}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_such_interface_is_one_line_with_the_fix() {
    run_fails(
        Command::new(NCPERF).args([
            "client", "-i", "nosuch0", "-a", "10.0.0.1", "--peer", "10.0.0.2", "--test", "rpc",
        ]),
        &["no interface \"nosuch0\"", "--interface", "ip netns exec"],
    );
    run_fails(
        Command::new(NCPERF).args(["server", "-a", "10.0.0.1"]),
        &["--interface", "--kernel"],
    );
}

/// A trivial XDP program of another tool, attached to `side`'s interface in generic mode
/// with iproute2.
fn attach_foreign_program(bed: &TestBed, side: Side, dir: &Path) {
    let src = dir.join("pass.c");
    let obj = dir.join("pass.o");
    std::fs::write(
        &src,
        "#include <linux/bpf.h>\n\
         __attribute__((section(\"xdp\"), used)) int other_tool(struct xdp_md *ctx) \
         { return XDP_PASS; }\n\
         char _license[] __attribute__((section(\"license\"), used)) = \"GPL\";\n",
    )
    .expect("write the program");
    let out = Command::new("clang")
        .args([
            "-O2",
            "-target",
            "bpf",
            "-I/usr/include/x86_64-linux-gnu",
            "-c",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .output()
        .expect("run clang");
    assert!(out.status.success(), "clang: {}", text(&out).1);
    let e = bed.side(side);
    bed.output_in(
        side,
        "ip",
        &[
            "link",
            "set",
            "dev",
            &e.ifname,
            "xdpgeneric",
            "obj",
            obj.to_str().expect("path"),
            "sec",
            "xdp",
        ],
    )
    .expect("attach the foreign program");
}

#[test]
fn misconfigurations_on_the_bed_are_one_line_with_the_fix() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());
    let dir = scratch("errors");
    let in_a = || bed.command_in(Side::A, NCPERF);

    // An address that is not on the interface.
    run_fails(
        in_a().args(["server", "-i", &a.ifname, "-a", "10.77.0.9"]),
        &[
            "address 10.77.0.9 is not on vA",
            "10.77.0.1",
            "ip addr add 10.77.0.9/24 dev vA",
        ],
    );

    // No privileges (the same command as an unprivileged user).
    let mut cmd = bed.command_in(Side::A, "setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", NCPERF])
        .args(["server", "-i", &a.ifname, "-a", &a.ipv4.to_string()]);
    run_fails(&mut cmd, &["not permitted", "run as root", "--kernel"]);

    // Nothing listens at the peer: kernel TCP is refused; netchannel's channel is too.
    let peer = format!("{}:7790", b.ipv4);
    run_fails(
        in_a().args(["client", "--kernel", "--peer", &peer, "--test", "rpc"]),
        &["refused", "ncperf server --kernel"],
    );
    run_fails(
        in_a()
            .args(["client", "-i", &a.ifname, "-a", &a.ipv4.to_string()])
            .args(["--peer", &peer, "--test", "rpc"]),
        &[&peer, "ncperf server -i IFACE -a ADDR"],
    );

    // Another tool's XDP program on the interface: left alone, and named with the command
    // that removes it.
    attach_foreign_program(&bed, Side::A, &dir);
    run_fails(
        in_a().args(["server", "-i", &a.ifname, "-a", &a.ipv4.to_string()]),
        &[
            "another tool's XDP program",
            "ip link set dev vA xdpgeneric off",
        ],
    );
    let link = bed
        .output_in(Side::A, "ip", &["-j", "link", "show", "dev", &a.ifname])
        .expect("ip link");
    assert!(
        link.contains("other_tool"),
        "the foreign program stays: {link}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
