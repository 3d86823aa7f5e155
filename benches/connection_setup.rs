//! Connection set-up rate on the test bed (two queues, MTU 1500): new connections per
//! second, each carrying one small request and its response, against kernel TCP in the
//! same run.
//!
//! A connection: the client connects, writes a 64-byte request, the server answers with
//! 64 bytes; then either the server closes first (it shuts down after its answer and the
//! client reads to the end: HTTP/1.0's pattern, the server holds the TIME-WAIT) or the
//! client closes first (it closes once it has the answer, and the server closes when it
//! reads the end: the client holds the TIME-WAIT). Every answer is checked. `C` clients
//! (`NETCHANNEL_BENCH_CONNS`, default 8) loop so until `NETCHANNEL_BENCH_CONNECTIONS`
//! connections (default 8000) are done; the rate is connections over the wall time. Each
//! measurement has a server port of its own, so that the TIME-WAITs one leaves (60 s)
//! never slow another's port search or share its 4-tuples; 8000 stays well inside the
//! kernel client's ephemeral range (28,232 ports, searched in steps of 2).
//!
//! Rows, each round in this order (so that drift falls on all alike; the table gives each
//! one's median over `NETCHANNEL_BENCH_ROUNDS` rounds and its ratio to the reference):
//!
//! - `kernel`: kernel clients in A against a tokio `TcpListener` in B with nothing
//!   attached to either veth end (the reference);
//! - `kernel→virtual`: the same kernel clients against a `VirtualListener` on B's stack
//!   (plain TCP on B's channels);
//! - `kernel+xdp`: kernel against kernel again while B's stack (its XDP program) runs;
//! - `virtual→virtual`: virtual streams of a stack in A against the `VirtualListener`
//!   (NetChannel connections over the channels the stacks hold open).
//!
//! The clients run on one thread (a current-thread tokio runtime, as `ab` runs on one),
//! the servers on a 2-worker runtime; both stacks and the clients share the bed's 2 cores.
//! Then `ab -n N -c C` (no keep-alive: a connection per HTTP/1.0 request, the server closes
//! first) against a minimal HTTP server on each listener, when `ab` is installed
//! (`NETCHANNEL_BENCH_AB_REQUESTS`, default 5000; `0` skips it), with its failed requests.
//!
//! `NETCHANNEL_BENCH_ONLY` (a row's name) measures one row, for profiling.
//!
//! Without `--bench` (`cargo test --all-targets`) it runs 300 connections per row and
//! `ab` for 500 requests, as a smoke test that checks every answer and that no request
//! failed.
//!
//! Remote-peer mode: with `NETCHANNEL_BENCH_PEER=IPV4[:PORT]`,
//! `NETCHANNEL_BENCH_INTERFACE=IFACE` and `NETCHANNEL_BENCH_ADDRESS=IPV4` set, it builds no
//! bed and no server: each connection is an ncperf one-shot request (64 bytes echoed,
//! checked, then the server's close) against the peer's `ncperf server --kernel -a ADDR`
//! from kernel clients (`kernel+xdp`, the reference there: a stack runs at both ends) and
//! its `ncperf server -i IFACE -a ADDR` from virtual streams of a stack on IFACE
//! (`virtual→virtual`), both on PORT (default 7700). Skipped there: the client-closes-first
//! mode (ncperf's server always closes first), `kernel` (a peer with nothing attached),
//! `kernel→virtual` (the peer's kernel server holds its virtual listener's port) and `ab`.
//! The first line names the peer.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! `cargo bench -j1 --bench connection_setup`

#[cfg(target_os = "linux")]
#[path = "support/bed.rs"]
mod bed;
#[cfg(target_os = "linux")]
#[path = "support/remote.rs"]
mod remote;
#[cfg(target_os = "linux")]
#[path = "support/vns.rs"]
mod vns;

#[cfg(target_os = "linux")]
mod run {
    use std::future::Future;
    use std::io;
    use std::net::{SocketAddr, SocketAddrV4};
    use std::process::Command;
    use std::time::{Duration, Instant};

    use netchannel::{Stack, VirtualListener};
    use testbed::{Side, TestBed};
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::runtime::Runtime;

    use netchannel::perf_proto::Op;

    use super::bed::median;
    use super::remote::{self, Remote};
    use super::vns::{self, env_or};

    /// Request and answer size.
    const SIZE: usize = 64;
    /// Longest wait for one connection before the bench gives up.
    const STEP: Duration = Duration::from_secs(10);
    /// Ports in B: the request/answer protocol and HTTP, on the virtual listener and on
    /// the kernel's.
    const VIRTUAL_PORT: u16 = 7300;
    const VIRTUAL_HTTP_PORT: u16 = 7400;
    const KERNEL_PORT: u16 = 7500;
    const KERNEL_HTTP_PORT: u16 = 7600;
    /// The first request byte says who closes first.
    const SERVER_FIRST: u8 = b'S';
    const CLIENT_FIRST: u8 = b'C';
    const HTTP_ANSWER: &[u8] =
        b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nHello, world\n";

    fn answer_to(request: &[u8]) -> [u8; SIZE] {
        let mut a = [0u8; SIZE];
        for (o, i) in a.iter_mut().zip(request) {
            *o = !*i;
        }
        a
    }

    /// Serves one connection of the request/answer protocol.
    async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> io::Result<()> {
        let mut req = [0u8; SIZE];
        s.read_exact(&mut req).await?;
        s.write_all(&answer_to(&req)).await?;
        if req[0] == CLIENT_FIRST {
            // The client's end first; then ours.
            let mut rest = [0u8; 1];
            if s.read(&mut rest).await? != 0 {
                return Err(io::Error::other("bytes after the request"));
            }
        }
        s.shutdown().await
    }

    /// Serves one HTTP/1.0 request: reads to the blank line (at most 8 KiB), answers and
    /// closes.
    async fn serve_http<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> io::Result<()> {
        let mut buf = Vec::with_capacity(512);
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut chunk).await?;
            if n == 0 || buf.len() + n > 8192 {
                return Err(io::ErrorKind::InvalidData.into());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        s.write_all(HTTP_ANSWER).await?;
        s.shutdown().await
    }

    /// One connection's exchange on the client side.
    async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
        mut s: S,
        server_first: bool,
        tag: u64,
    ) -> io::Result<()> {
        let mut req = [0u8; SIZE];
        req[0] = if server_first {
            SERVER_FIRST
        } else {
            CLIENT_FIRST
        };
        req[1..9].copy_from_slice(&tag.to_le_bytes());
        s.write_all(&req).await?;
        let mut got = [0u8; SIZE];
        s.read_exact(&mut got).await?;
        if got != answer_to(&req) {
            return Err(io::Error::other("wrong answer"));
        }
        if server_first {
            let mut rest = [0u8; 1];
            if s.read(&mut rest).await? != 0 {
                return Err(io::Error::other("bytes after the answer"));
            }
        }
        // Dropping the stream closes it (after the server's end, or first).
        Ok(())
    }

    /// `conns` client loops of connect + exchange, `total` connections together;
    /// connections per second.
    async fn clients<C, F, S>(connect: C, conns: usize, total: u64, server_first: bool) -> f64
    where
        C: Fn() -> F + Clone + 'static,
        F: Future<Output = io::Result<S>>,
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let start = Instant::now();
        let local = tokio::task::LocalSet::new();
        let next = std::rc::Rc::new(std::cell::Cell::new(0u64));
        let mut handles = Vec::with_capacity(conns);
        for c in 0..conns {
            let connect = connect.clone();
            let next = next.clone();
            handles.push(local.spawn_local(async move {
                loop {
                    let tag = next.get();
                    if tag >= total {
                        break;
                    }
                    next.set(tag + 1);
                    tokio::time::timeout(STEP, async {
                        let s = connect().await?;
                        exchange(s, server_first, tag).await
                    })
                    .await
                    .unwrap_or_else(|_| panic!("connection {tag} (client {c}) timed out"))
                    .unwrap_or_else(|e| panic!("connection {tag} (client {c}): {e}"));
                }
            }));
        }
        local
            .run_until(async {
                for h in handles {
                    h.await.expect("client task");
                }
            })
            .await;
        total as f64 / start.elapsed().as_secs_f64()
    }

    /// Kernel clients in A to `to`, on a current-thread runtime on a thread in A.
    fn kernel_clients(
        bed: &TestBed,
        to: SocketAddrV4,
        conns: usize,
        total: u64,
        server_first: bool,
    ) -> f64 {
        bed.run_in(Side::A, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(clients(
                move || async move {
                    let s = tokio::net::TcpStream::connect(to).await?;
                    s.set_nodelay(true)?;
                    Ok(s)
                },
                conns,
                total,
                server_first,
            ))
        })
        .expect("enter A")
    }

    /// Virtual streams of `stack` to `to`, on a current-thread runtime.
    fn virtual_clients(
        stack: &Stack,
        to: SocketAddr,
        conns: usize,
        total: u64,
        server_first: bool,
    ) -> f64 {
        let stack = stack.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(clients(
            move || {
                let stack = stack.clone();
                async move { stack.connect(to).await }
            },
            conns,
            total,
            server_first,
        ))
    }

    /// A stack with the defaults on `side`'s veth end, its queues placed as in a stack
    /// built inside the servers' runtime (`vns::placed`: on that runtime on 2 cores, as
    /// an application built in `#[tokio::main]` gets them; `NETCHANNEL_BENCH_PLACEMENT=own`
    /// gives them runtimes of their own).
    fn stack_in(bed: &TestBed, side: Side) -> Stack {
        let e = bed.side(side).clone();
        bed.run_in(side, move || {
            vns::placed(Stack::builder())
                .interface(e.ifname)
                .ipv4(e.ipv4)
                .connect_timeout(Duration::from_secs(10))
                .build()
        })
        .expect("enter the namespace")
        .expect("build the stack")
    }

    /// Accepts on `l` forever, serving each connection with `serve` in its own task.
    fn spawn_virtual_server<F, Fut>(rt: &Runtime, l: VirtualListener, serve: F)
    where
        F: Fn(netchannel::VirtualStream) -> Fut + Send + 'static,
        Fut: Future<Output = io::Result<()>> + Send + 'static,
    {
        rt.spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let f = serve(s);
                tokio::spawn(async move {
                    let _ = f.await;
                });
            }
        });
    }

    /// What `ab` said: requests per second, complete and failed requests.
    struct AbResult {
        per_s: f64,
        complete: u64,
        failed: u64,
        ok: bool,
    }

    fn ab(bed: &TestBed, to: SocketAddrV4, n: u64, conns: usize) -> AbResult {
        let out = bed
            .command_in(Side::A, "ab")
            .args(["-q", "-r", "-s", "10", "-n", &n.to_string()])
            .args(["-c", &conns.to_string()])
            .arg(format!("http://{to}/"))
            .output()
            .expect("run ab");
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |name: &str| -> Option<f64> {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l[name.len()..].split_whitespace().next())
                .and_then(|v| v.parse().ok())
        };
        if !out.status.success() {
            println!(
                "ab against {to} failed: {}\n{text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        AbResult {
            per_s: field("Requests per second:").unwrap_or(f64::NAN),
            complete: field("Complete requests:").unwrap_or(0.0) as u64,
            failed: field("Failed requests:").unwrap_or(0.0) as u64,
            ok: out.status.success(),
        }
    }

    fn ab_installed() -> bool {
        Command::new("ab")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
    }

    const ROWS: [&str; 4] = ["kernel", "kernel→virtual", "kernel+xdp", "virtual→virtual"];

    /// The server port of a measurement: each (round, row, mode) has its own, so that the
    /// TIME-WAIT connections one leaves (60 s, on the side that closed first) never share
    /// a 4-tuple with another's, and every measurement finds the client's ephemeral ports
    /// free.
    fn port(base: u16, round: usize, row: usize, mode: usize) -> u16 {
        base + (round * 8 + row * 2 + mode) as u16
    }

    /// `conns` client loops (on one thread) of connect + one ncperf one-shot request of
    /// [`SIZE`] bytes (the server echoes it and closes first), `total` connections
    /// together, every answer and close checked; connections per second.
    async fn one_shot_clients<C, F, S>(connect: C, conns: usize, total: u64) -> io::Result<f64>
    where
        C: Fn() -> F + Clone + 'static,
        F: Future<Output = io::Result<S>>,
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let start = Instant::now();
        let local = tokio::task::LocalSet::new();
        let next = std::rc::Rc::new(std::cell::Cell::new(0u64));
        let mut handles: Vec<tokio::task::JoinHandle<io::Result<()>>> = Vec::with_capacity(conns);
        for c in 0..conns {
            let connect = connect.clone();
            let next = next.clone();
            handles.push(local.spawn_local(async move {
                loop {
                    let tag = next.get();
                    if tag >= total {
                        return Ok(());
                    }
                    next.set(tag + 1);
                    let body = remote::one_shot_body(SIZE, tag);
                    let what = format!("connection {tag} (client {c})");
                    remote::step(&what, async {
                        let s = connect().await?;
                        remote::one_shot(s, &body).await
                    })
                    .await
                    .map_err(|e| io::Error::new(e.kind(), format!("{what}: {e}")))?;
                }
            }));
        }
        local
            .run_until(async {
                for h in handles {
                    h.await.map_err(io::Error::other)??;
                }
                Ok::<(), io::Error>(())
            })
            .await?;
        Ok(total as f64 / start.elapsed().as_secs_f64())
    }

    /// The remote-peer mode: `kernel+xdp` (kernel clients against `ncperf server --kernel`,
    /// a stack attached at both ends; the reference) and `virtual→virtual` (virtual streams
    /// of the local stack against `ncperf server`), both with ncperf's one-shot requests,
    /// where the server closes first. Skipped: the client-closes-first mode (ncperf's
    /// server always closes first), `kernel` (it needs a peer with nothing attached),
    /// `kernel→virtual` (the peer's kernel server holds the same port as its virtual
    /// listener) and `ab` (its HTTP server).
    fn remote_main(r: Remote, total: u64, rounds: usize, conns: usize, only: &str) {
        let on = |row: usize| only.is_empty() || only == ROWS[row];
        println!("{}", r.banner("connection_setup"));
        println!(
            "connection_setup: {conns} clients, {total} connections per measurement, {rounds} \
             rounds, {SIZE}-byte ncperf one-shot request and echo (the server closes first); \
             the client-closes-first mode, the kernel and kernel→virtual rows and ab are \
             skipped in remote mode (ncperf's server closes first; the peer runs a stack, and \
             its kernel server holds the virtual listener's port)"
        );
        let fail = |e: io::Error| -> ! { remote::fail("connection_setup", e) };
        let client_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| fail(e));
        let r = std::rc::Rc::new(r);
        // rates[row]: per-round connections per second (server closes first).
        let mut rates: [Vec<f64>; ROWS.len()] = Default::default();
        for _ in 0..rounds {
            if on(2) {
                let rr = r.clone();
                let rate = client_rt
                    .block_on(one_shot_clients(
                        move || {
                            let rr = rr.clone();
                            async move { rr.kernel_conn_arg(Op::OneShot, SIZE as u16, false).await }
                        },
                        conns,
                        total,
                    ))
                    .unwrap_or_else(|e| fail(io::Error::new(e.kind(), format!("kernel+xdp: {e}"))));
                rates[2].push(rate);
            }
            if on(3) {
                let rr = r.clone();
                let rate = client_rt
                    .block_on(one_shot_clients(
                        move || {
                            let rr = rr.clone();
                            async move {
                                rr.virtual_conn_arg(Op::OneShot, SIZE as u16, false).await
                            }
                        },
                        conns,
                        total,
                    ))
                    .unwrap_or_else(|e| {
                        fail(io::Error::new(e.kind(), format!("virtual→virtual: {e}")))
                    });
                rates[3].push(rate);
            }
        }
        if let Ok(r) = std::rc::Rc::try_unwrap(r) {
            r.stop();
        }
        println!("\nserver closes first: connections/s (median of {rounds}), ratio to kernel+xdp");
        let reference = median(&mut rates[2].clone());
        for (row, name) in ROWS.iter().enumerate() {
            if rates[row].is_empty() {
                continue;
            }
            let m = median(&mut rates[row].clone());
            println!(
                "  {name:<16} {m:>9.0}  {:>5.2}×   rounds {:?}",
                m / reference,
                rates[row]
                    .iter()
                    .map(|r| r.round() as u64)
                    .collect::<Vec<_>>()
            );
        }
        println!("\nclient closes first: skipped in remote mode (ncperf's server closes first)");
        println!("\nab: skipped in remote mode");
    }

    pub fn main() {
        let full = vns::bench_mode();
        let total: u64 = env_or(
            "NETCHANNEL_BENCH_CONNECTIONS",
            if full { 8000 } else { 300 },
        );
        let rounds: usize = env_or("NETCHANNEL_BENCH_ROUNDS", if full { 3 } else { 1 }).max(1);
        let conns: usize = env_or("NETCHANNEL_BENCH_CONNS", 8usize).max(1);
        let ab_n: u64 = env_or(
            "NETCHANNEL_BENCH_AB_REQUESTS",
            if full { 5000u64 } else { 500 },
        );
        // For profiling one row: its name (`kernel`, `kernel→virtual`, ...).
        let only = std::env::var("NETCHANNEL_BENCH_ONLY").unwrap_or_default();
        let on = |row: usize| only.is_empty() || only == ROWS[row];
        let ab_on = ab_n > 0 && ab_installed();
        if let Some((r, rt)) = remote::start("connection_setup", 0, 0, only.is_empty() || on(2)) {
            remote_main(r, total, rounds, conns, &only);
            drop(rt);
            return;
        }
        let Some((bed, rt)) = vns::bed_and_runtime("connection_setup") else {
            return;
        };
        println!(
            "connection_setup: {conns} clients, {total} connections per measurement, {rounds} \
             rounds, {SIZE}-byte request and answer, test bed with {} queues, MTU 1500",
            bed.queues()
        );
        let b_ip = bed.side(Side::B).ipv4;
        let at = |port: u16| SocketAddrV4::new(b_ip, port);
        // rates[mode][row]: per-round connections per second; mode 0: the server closes
        // first.
        let mut rates: [[Vec<f64>; ROWS.len()]; 2] = Default::default();
        let mut ab_rows: Vec<(&str, AbResult)> = Vec::new();
        for round in 0..rounds {
            // Kernel listeners in B for this round's kernel rows, made before B's stack
            // runs; the `kernel` row runs with nothing attached to either end.
            for row in [0, 2] {
                for mode in 0..2 {
                    vns::kernel_server_at(
                        &bed,
                        &rt,
                        port(KERNEL_PORT, round, row, mode),
                        |s| async move {
                            let _ = serve(s).await;
                        },
                    );
                }
            }
            let kernel_http = port(KERNEL_HTTP_PORT, round, 0, 0);
            let kernel_http_xdp = port(KERNEL_HTTP_PORT, round, 2, 0);
            for p in [kernel_http, kernel_http_xdp] {
                vns::kernel_server_at(&bed, &rt, p, |s| async move {
                    let _ = serve_http(s).await;
                });
            }
            for (mode, server_first) in [(0, true), (1, false)] {
                if on(0) {
                    let to = at(port(KERNEL_PORT, round, 0, mode));
                    rates[mode][0].push(kernel_clients(&bed, to, conns, total, server_first));
                }
            }
            if ab_on && on(0) {
                ab_rows.push(("kernel", ab(&bed, at(kernel_http), ab_n, conns)));
            }
            let b = stack_in(&bed, Side::B);
            for row in [1, 3] {
                for mode in 0..2 {
                    let to = at(port(VIRTUAL_PORT, round, row, mode));
                    let l = rt
                        .block_on(b.bind(to.into()))
                        .expect("bind a virtual listener");
                    spawn_virtual_server(&rt, l, serve);
                }
            }
            let virt_http = port(VIRTUAL_HTTP_PORT, round, 1, 0);
            let l = rt
                .block_on(b.bind(at(virt_http).into()))
                .expect("bind the virtual HTTP listener");
            spawn_virtual_server(&rt, l, serve_http);
            for (mode, server_first) in [(0, true), (1, false)] {
                if on(1) {
                    let to = at(port(VIRTUAL_PORT, round, 1, mode));
                    rates[mode][1].push(kernel_clients(&bed, to, conns, total, server_first));
                }
                if on(2) {
                    let to = at(port(KERNEL_PORT, round, 2, mode));
                    rates[mode][2].push(kernel_clients(&bed, to, conns, total, server_first));
                }
            }
            if ab_on && on(1) {
                ab_rows.push(("kernel→virtual", ab(&bed, at(virt_http), ab_n, conns)));
            }
            if ab_on && on(2) {
                ab_rows.push(("kernel+xdp", ab(&bed, at(kernel_http_xdp), ab_n, conns)));
            }
            if on(3) {
                let a = stack_in(&bed, Side::A);
                for (mode, server_first) in [(0, true), (1, false)] {
                    let to = at(port(VIRTUAL_PORT, round, 3, mode));
                    rates[mode][3].push(virtual_clients(&a, to.into(), conns, total, server_first));
                }
                a.abort();
            }
            b.abort();
        }
        for (mode, title) in [(0, "server closes first"), (1, "client closes first")] {
            println!("\n{title}: connections/s (median of {rounds}), ratio to kernel");
            let reference = median(&mut rates[mode][0].clone());
            for (row, name) in ROWS.iter().enumerate() {
                if rates[mode][row].is_empty() {
                    continue;
                }
                let m = median(&mut rates[mode][row].clone());
                println!(
                    "  {name:<16} {m:>9.0}  {:>5.2}×   rounds {:?}",
                    m / reference,
                    rates[mode][row]
                        .iter()
                        .map(|r| r.round() as u64)
                        .collect::<Vec<_>>()
                );
            }
        }
        if ab_on {
            println!("\nab -n {ab_n} -c {conns} (no keep-alive): requests/s, failed");
            for (name, r) in &ab_rows {
                println!(
                    "  {name:<16} {:>9.0}  complete {:>6}  failed {:>4}{}",
                    r.per_s,
                    r.complete,
                    r.failed,
                    if r.ok { "" } else { "  (ab failed)" }
                );
            }
            for (name, r) in &ab_rows {
                assert!(
                    r.ok && r.failed == 0 && r.complete == ab_n,
                    "ab against {name}: {} complete, {} failed",
                    r.complete,
                    r.failed
                );
            }
        } else {
            println!("\nab: skipped (not installed, or NETCHANNEL_BENCH_AB_REQUESTS=0)");
        }
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    run::main();
    #[cfg(not(target_os = "linux"))]
    println!("skipping connection_setup: the test bed is Linux only");
}
