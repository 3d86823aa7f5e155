//! The `kv` example (a RESP2 key-value server on our `VirtualListener`) run as a process
//! in namespace A of the test bed, driven from B by the standard Redis tools (`redis-cli`,
//! including `--pipe`, and `redis-benchmark` with pipelining) over the kernel's TCP, by a
//! raw pipelined batch over a plain socket, and by a NetChannel client (a `Stack` in
//! this process) speaking RESP over a `VirtualStream`; its `--max-keys` and
//! `--max-connections` bounds; a clean stop on SIGTERM.
//!
//! Privileged: skips without root or without `redis-cli`/`redis-benchmark` (package
//! `redis-tools`, see `scripts/install-deps.sh`), and fails instead when
//! `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};

use netchannel::Stack;
use support::{example_binary, ExampleServer, DEADLINE};
use testbed::{testbed_or_skip, Side, TestBed};

mod support;

const PORT: u16 = 6379;

/// Whether `redis-cli` and `redis-benchmark` can run; without them the tests skip, or
/// fail under `NETCHANNEL_REQUIRE_XDP=1`.
fn redis_tools_or_skip() -> bool {
    let missing: Vec<&str> = ["redis-cli", "redis-benchmark"]
        .into_iter()
        .filter(|tool| {
            Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map_or(true, |s| !s.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!("{missing:?} not found (install redis-tools: scripts/install-deps.sh)");
    assert!(!testbed::required(), "{}=1 but {why}", testbed::REQUIRE_ENV);
    eprintln!("skipping: {why}");
    false
}

fn show(what: &str, out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("{what}: {}\n{stdout}{stderr}", out.status);
    (stdout, stderr)
}

/// `tool -h <A> -p PORT args...` in B with `stdin` as its input; stdout and stderr,
/// after checking that it exited with success.
fn tool_in_b(bed: &TestBed, tool: &str, args: &[&str], stdin: &[u8]) -> (String, String) {
    let mut child = bed
        .command_in(Side::B, tool)
        .args(["-h", &bed.side(Side::A).ipv4.to_string()])
        .args(["-p", &PORT.to_string()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {tool} in B: {e}"));
    let mut input = child.stdin.take().expect("stdin");
    let stdin = stdin.to_vec();
    let feeder = std::thread::spawn(move || input.write_all(&stdin));
    let out = child.wait_with_output().expect("wait for the tool");
    feeder.join().expect("stdin thread").expect("write stdin");
    let (stdout, stderr) = show(&format!("{tool} {args:?}"), &out);
    assert!(out.status.success(), "{tool} {args:?} failed: {stderr}");
    (stdout, stderr)
}

/// `redis-cli ... args` (one command; not a terminal, so replies come raw: a bulk string
/// or integer as itself, nil as an empty line, an error as its text and an empty line;
/// redis-cli 7 exits with success either way); its output.
fn cli(bed: &TestBed, args: &[&str]) -> String {
    tool_in_b(bed, "redis-cli", args, b"").0
}

/// `args` as a RESP request.
fn request(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads from `r` until `want.len()` bytes have come (or the deadline); what came.
fn read_reply(r: &mut impl Read, want: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < want {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("reading replies after {} bytes: {e}", got.len()),
        }
    }
    got
}

fn program_attached(bed: &TestBed, side: Side) -> bool {
    let ifname = bed.side(side).ifname.clone();
    bed.run_in(side, move || xdp_prog::attached_program(&ifname))
        .expect("enter the namespace")
        .expect("query XDP")
        .is_some()
}

/// Standard clients over the kernel's TCP: redis-cli commands, a `--pipe` bulk load, a
/// raw pipelined batch in one write, and redis-benchmark with 16-deep pipelining, every
/// reply checked; then SIGTERM stops the server cleanly.
#[test]
fn redis_cli_and_redis_benchmark_work_against_the_kv_server() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    if !redis_tools_or_skip() {
        return;
    }
    let bin = example_binary("kv");
    let mut server = ExampleServer::start(&bed, &bin, PORT, &[]);
    assert!(program_attached(&bed, Side::A), "the server attached XDP");

    assert_eq!(cli(&bed, &["PING"]), "PONG\n");
    assert_eq!(cli(&bed, &["ping", "hello there"]), "hello there\n");
    assert_eq!(cli(&bed, &["ECHO", "x"]), "x\n");
    assert_eq!(cli(&bed, &["SET", "greeting", "hello"]), "OK\n");
    assert_eq!(cli(&bed, &["GET", "greeting"]), "hello\n");
    assert_eq!(cli(&bed, &["INCR", "n"]), "1\n");
    assert_eq!(cli(&bed, &["INCR", "n"]), "2\n");
    assert_eq!(cli(&bed, &["MSET", "a", "1", "b", "2"]), "OK\n");
    assert_eq!(cli(&bed, &["MGET", "a", "nope", "b"]), "1\n\n2\n");
    assert_eq!(cli(&bed, &["EXISTS", "a", "b", "nope", "a"]), "3\n");
    assert_eq!(cli(&bed, &["DEL", "a", "nope"]), "1\n");
    assert_eq!(cli(&bed, &["EXISTS", "a", "b"]), "1\n");
    assert_eq!(
        cli(&bed, &["INCR", "greeting"]).trim_end(),
        "ERR value is not an integer or out of range"
    );
    assert_eq!(
        cli(&bed, &["GET"]).trim_end(),
        "ERR wrong number of arguments for 'get' command"
    );
    assert!(
        cli(&bed, &["NOSUCH", "x"]).starts_with("ERR unknown command 'NOSUCH'"),
        "unknown command"
    );

    // A bulk load through `redis-cli --pipe` (it appends an ECHO and waits for it).
    const PIPED: usize = 1000;
    let mut load = Vec::new();
    for i in 0..PIPED {
        load.extend(request(&[b"SET", format!("key:{i}").as_bytes(), b"v"]));
    }
    load.extend(request(&[b"INCR", b"n"]));
    let (stdout, _) = tool_in_b(&bed, "redis-cli", &["--pipe"], &load);
    assert!(
        stdout.contains(&format!("errors: 0, replies: {}", PIPED + 1)),
        "{stdout}"
    );
    assert_eq!(cli(&bed, &["GET", "key:999"]), "v\n");
    assert_eq!(cli(&bed, &["GET", "n"]), "3\n");
    assert_eq!(cli(&bed, &["DBSIZE"]), format!("{}\n", PIPED + 3));

    // A pipelined batch in one write, multibulk and inline mixed, replies byte-exact.
    let target = SocketAddr::from((bed.side(Side::A).ipv4, PORT));
    let raw = bed
        .spawn_thread_in(Side::B, move || {
            let mut s = std::net::TcpStream::connect_timeout(&target, DEADLINE).expect("connect");
            s.set_read_timeout(Some(DEADLINE)).unwrap();
            let mut batch = request(&[b"SET", b"raw", b"\r\nbinary\0"]);
            batch.extend_from_slice(b"GET raw\r\nINCR n\r\nMGET raw nope\r\n");
            batch.extend(request(&[b"DEL", b"raw", b"raw"]));
            batch.extend_from_slice(b"QUIT\r\n");
            s.write_all(&batch).expect("write the batch");
            let want: &[u8] = b"+OK\r\n$9\r\n\r\nbinary\0\r\n:4\r\n*2\r\n$9\r\n\r\nbinary\0\r\n$-1\r\n:1\r\n+OK\r\n";
            let got = read_reply(&mut s, want.len() + 1);
            (got, want.to_vec())
        })
        .expect("raw client thread in B");
    let (got, want) = raw.join().expect("raw client");
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&want),
        "replies to the pipelined batch, then the end of stream after QUIT"
    );
    server.wait_for(&["over plain-tcp: 6 command(s)", "QUIT"]);

    // redis-benchmark: 2000 requests per test, 16 per pipeline, 50 clients.
    let (stdout, stderr) = tool_in_b(
        &bed,
        "redis-benchmark",
        &["-q", "-n", "2000", "-t", "set,get,incr", "-P", "16"],
        b"",
    );
    for test in ["SET", "GET", "INCR"] {
        let line = stdout
            .split(['\n', '\r'])
            .rfind(|l| l.starts_with(&format!("{test}: ")))
            .unwrap_or_else(|| panic!("no {test} result in {stdout:?}"));
        let rps: f64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no figure in {line:?}"));
        assert!(line.contains("requests per second") && rps > 0.0, "{line}");
    }
    let all = format!("{stdout}{stderr}").to_lowercase();
    assert!(!all.contains("error"), "redis-benchmark reported errors");
    // Every INCR of the benchmark reached the store (its key is the literal below).
    assert_eq!(cli(&bed, &["GET", "counter:__rand_int__"]), "2000\n");

    let status = server.stop();
    assert!(status.success(), "server exit after SIGTERM: {status}");
    // Nothing above came near the shared request memory (128 MiB by default).
    server.wait_for(&["stopped after", " bytes, 0 request(s) refused"]);
    assert!(!program_attached(&bed, Side::A), "the server detached XDP");
}

/// A NetChannel client (our stack in B) speaking RESP over a `VirtualStream`: pipelined
/// commands against `--max-keys 2` (the third key gets OOM), while it holds the only
/// connection `--max-connections 1` allows, so a redis-cli from B is refused; QUIT ends
/// it; then SIGTERM stops the server cleanly.
#[test]
fn netchannel_client_speaks_resp_and_the_bounds_hold() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    if !redis_tools_or_skip() {
        return;
    }
    let bin = example_binary("kv");
    let mut server = ExampleServer::start(
        &bed,
        &bin,
        PORT,
        &["--max-keys", "2", "--max-connections", "1"],
    );
    let target = SocketAddr::from((bed.side(Side::A).ipv4, PORT));
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// Reads until `want.len()` bytes (or end of stream, or the deadline); what came.
    async fn replies(s: &mut netchannel::VirtualStream, want: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while got.len() < want {
            let n = tokio::time::timeout(DEADLINE, s.read(&mut buf))
                .await
                .expect("replies in time")
                .expect("read replies");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        got
    }
    let mut vs = rt.block_on(async {
        let mut s = tokio::time::timeout(DEADLINE, stack.connect(target))
            .await
            .expect("connect in time")
            .expect("connect");
        assert!(!s.is_plain_tcp(), "a NetChannel connection");
        let mut batch = Vec::new();
        for req in [
            &[&b"SET"[..], b"a", b"1"][..],
            &[b"SET", b"b", b"x"],
            &[b"SET", b"c", b"3"],
            &[b"INCR", b"a"],
            &[b"INCR", b"b"],
            &[b"MGET", b"a", b"b", b"c"],
        ] {
            batch.extend(request(req));
        }
        s.write_all(&batch).await.expect("write the batch");
        let want = "+OK\r\n+OK\r\n-OOM command not allowed when used memory > 'maxmemory'.\r\n\
                    :2\r\n-ERR value is not an integer or out of range\r\n\
                    *3\r\n$1\r\n2\r\n$1\r\nx\r\n$-1\r\n";
        let got = replies(&mut s, want.len()).await;
        assert_eq!(String::from_utf8_lossy(&got), want);
        s
    });
    server.wait_for(&["accepted connection 1 ", "over netchannel"]);

    // The one connection allowed is taken: a second client is told so.
    assert_eq!(
        cli(&bed, &["PING"]).trim_end(),
        "ERR max number of clients reached"
    );
    server.wait_for(&["refused a connection", "over plain-tcp"]);

    let end = rt.block_on(async {
        vs.write_all(b"QUIT\r\n").await.expect("QUIT");
        replies(&mut vs, usize::MAX).await
    });
    assert_eq!(&end[..], b"+OK\r\n", "QUIT's reply, then the end of stream");
    server.wait_for(&["connection 1 from", "over netchannel: 7 command(s)", "QUIT"]);
    // Its slot is free again.
    assert_eq!(cli(&bed, &["DBSIZE"]), "2\n");

    drop(vs);
    // Dropping the last handle would deliver our FIN in the background (linger); stop
    // gracefully here instead, so that the stack is gone (XDP detached) when this
    // returns.
    rt.block_on(stack.shutdown_graceful(DEADLINE))
        .expect("our stack delivered everything and closed its channels");
    drop(rt);
    drop(stack);
    assert!(
        !program_attached(&bed, Side::B),
        "our stack in B detached XDP"
    );
    let status = server.stop();
    assert!(status.success(), "server exit after SIGTERM: {status}");
    server.wait_for(&["stopped after 2 connection(s)"]);
    assert!(!program_attached(&bed, Side::A), "the server detached XDP");
}
