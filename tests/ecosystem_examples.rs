//! The service examples on the test bed, driven by real clients: the axum service
//! (`axum_http`) in namespace A against curl and ab (no keep-alive: a connection per
//! request) from B's kernel and the hyper client example (`hyper_client`, a NetChannel
//! stack in B); the tonic service and client (`grpc`, unary and both streaming kinds)
//! each on its own stack; and TLS (`tls`, tokio-rustls) over a virtual stream.
//!
//! Needs the cargo features `axum`, `tonic` and `hyper` (`required-features`; the test
//! script builds with `--all-features`). Privileged: skips without root, and fails
//! instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::process::Command;

use support::{example_binary_with, ExampleServer};
use testbed::{testbed_or_skip, Side, TestBed};

mod support;

/// The examples' tests run one at a time: each runs two stacks and a load generator on
/// the bed's 2 cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `cmd` (in B), prints its output, asserts success; its standard output.
fn run_ok(what: &str, cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!(
        "{what}: {}\n{}{}",
        out.status,
        stdout.get(..400).unwrap_or(&stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed: {}", out.status);
    stdout
}

/// `--interface`, `--ipv4` of B, for an example running there on its own stack.
fn b_stack_args(bed: &TestBed) -> Vec<String> {
    let b = bed.side(Side::B);
    vec![
        "--interface".into(),
        b.ifname.clone(),
        "--ipv4".into(),
        b.ipv4.to_string(),
    ]
}

const HTTP_PORT: u16 = 8080;
/// Requests of the ab run, connection per request.
const AB_REQUESTS: u32 = 5000;

#[test]
fn axum_service_serves_curl_ab_and_the_hyper_client() {
    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let server_bin = example_binary_with("axum_http", &["axum"]);
    let client_bin = example_binary_with("hyper_client", &["hyper"]);
    let mut server = ExampleServer::start(&bed, &server_bin, HTTP_PORT, &[]);
    let a_ip = bed.side(Side::A).ipv4;
    let b_ip = bed.side(Side::B).ipv4;
    let base = format!("http://{a_ip}:{HTTP_PORT}");
    let curl = |args: &[&str]| {
        let mut c = bed.command_in(Side::B, "curl");
        c.args(["--silent", "--show-error", "--fail", "--max-time", "30"])
            .args(args);
        run_ok(&format!("curl {}", args.last().unwrap_or(&"")), &mut c)
    };

    assert_eq!(curl(&[&format!("{base}/")]), "Hello from netchannel\n");
    let peer = curl(&[&format!("{base}/peer")]);
    assert!(
        peer.starts_with(&format!("you are {b_ip}:")) && peer.ends_with("over plain-tcp\n"),
        "{peer}"
    );
    // A download and an upload, byte-exact.
    let body = curl(&[&format!("{base}/bytes/1000000")]);
    assert_eq!(body.len(), 1_000_000);
    assert!(body
        .bytes()
        .enumerate()
        .all(|(i, b)| b == b'a' + (i % 26) as u8));
    let upload: String = (0..200_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let file = std::env::temp_dir().join(format!("netchannel-upload-{}", std::process::id()));
    std::fs::write(&file, &upload).unwrap();
    let echoed = curl(&[
        "--data-binary",
        &format!("@{}", file.display()),
        "-H",
        "Content-Type: application/octet-stream",
        &format!("{base}/echo"),
    ]);
    let _ = std::fs::remove_file(&file);
    assert!(
        echoed == upload,
        "the echo differs ({} bytes)",
        echoed.len()
    );

    // A connection per request, the server closing first: every one served.
    let mut ab = bed.command_in(Side::B, "ab");
    ab.args([
        "-q",
        "-r",
        "-s",
        "30",
        "-n",
        &AB_REQUESTS.to_string(),
        "-c",
        "8",
    ])
    .arg(format!("{base}/"));
    let report = run_ok("ab", &mut ab);
    let field = |name: &str| -> Option<u64> {
        report
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l[name.len()..].split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    assert_eq!(field("Complete requests:"), Some(u64::from(AB_REQUESTS)));
    assert_eq!(field("Failed requests:"), Some(0));
    assert_eq!(field("Non-2xx responses:"), None);

    // hyper's pooled client over NetChannel from B's own stack.
    let mut client = bed.command_in(Side::B, &client_bin);
    client
        .args(b_stack_args(&bed))
        .args(["--url", &format!("{base}/peer"), "--requests", "20"]);
    let out = run_ok("hyper_client", &mut client);
    assert!(
        out.contains("20 requests, last: 200 OK") && out.contains("over netchannel"),
        "{out}"
    );
    assert!(out.contains(&format!("you are {b_ip}:")) && out.contains("over netchannel\n"));

    server.sigterm();
    assert!(server.wait_exit().success(), "the server's exit");
    server.wait_for(&["axum_http: stopped"]);
}

#[test]
fn tonic_service_and_client_over_netchannel() {
    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let bin = example_binary_with("grpc", &["tonic"]);
    let mut server = ExampleServer::start(&bed, &bin, 50051, &[]);
    let a_ip = bed.side(Side::A).ipv4;
    let b_ip = bed.side(Side::B).ipv4;
    let mut client = bed.command_in(Side::B, &bin);
    client.args(b_stack_args(&bed)).args([
        "--connect",
        &format!("{a_ip}:50051"),
        "--count",
        "1000",
    ]);
    let out = run_ok("grpc client", &mut client);
    assert!(
        out.contains("Say: \"hello over netchannel\"")
            && out.contains(&format!("the server saw us as {b_ip}:")),
        "{out}"
    );
    assert!(out.contains("Count(1000): 1000 numbers in order"), "{out}");
    assert!(out.contains("Sum(1..=1000) = 500500"), "{out}");
    server.wait_for(&["grpc server: Say from", &b_ip.to_string()]);
    server.sigterm();
    assert!(server.wait_exit().success(), "the server's exit");
}

#[test]
fn tls_handshake_and_echo_over_a_virtual_stream() {
    let _serial = one_at_a_time();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let bin = example_binary_with("tls", &[]);
    let dir = std::env::temp_dir().join(format!("netchannel-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pem = dir.join("cert.pem");
    let pem_arg = pem.to_string_lossy().into_owned();
    let mut server = ExampleServer::start(&bed, &bin, 8443, &["--cert-out", &pem_arg]);
    let a_ip = bed.side(Side::A).ipv4;
    let mut client = bed.command_in(Side::B, &bin);
    client.args(b_stack_args(&bed)).args([
        "--connect",
        &format!("{a_ip}:8443"),
        "--ca",
        &pem_arg,
        "--lines",
        "500",
    ]);
    let out = run_ok("tls client", &mut client);
    assert!(
        out.contains("500 lines echoed over TLS") && out.contains("over netchannel"),
        "{out}"
    );
    server.wait_for(&["over netchannel: echoed 500 lines"]);
    server.sigterm();
    assert!(server.wait_exit().success(), "the server's exit");
    let _ = std::fs::remove_dir_all(&dir);
}
