//! A peer host that vanishes silently, over the AF_XDP test bed: B's veth end goes down
//! (nothing leaves B any more, no FIN, no RST; AF_XDP bypasses netfilter, so a drop rule
//! would not do), and A's virtual streams must fail with `TimedOut` within the bounds
//! the stack's liveness policy sets, never hang:
//!
//! - an idle stream blocked in `read` (nothing in flight) through TCP keep-alive; a
//!   plain-TCP stream accepted from a kernel client in B does not (RFC 9293 §3.8.4:
//!   keep-alive off by default for a kernel peer), its idle read waits as a kernel
//!   socket's would;
//! - a stream with data in flight through the user timeout;
//! - later calls fail at once, and a new connect to B fails within its timeout.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use netchannel::{Stack, StackBuilder, VirtualStream};
use testbed::{testbed_or_skip, Side, TestBed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

/// Bound on waits that involve no failure detection (handshakes, echoes).
const LIMIT: Duration = Duration::from_secs(30);
/// Bound on detecting the vanished peer: far above what the configured policy needs
/// (0.5 s of keep-alive, 2 s of user timeout), far below a hang or the 30 s user timeout
/// of the keep-alive test.
const DETECT: Duration = Duration::from_secs(10);
/// What "at once" means for calls on a stream already failed.
const AT_ONCE: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

fn stack_in(bed: &TestBed, side: Side, liveness: fn(StackBuilder) -> StackBuilder) -> Stack {
    let e = bed.side(side);
    let (ifname, ipv4) = (e.ifname.clone(), e.ipv4);
    bed.run_in(side, move || {
        liveness(
            Stack::builder()
                .interface(ifname)
                .ipv4(ipv4)
                .channels(2)
                .connect_timeout(CONNECT_TIMEOUT),
        )
        .build()
    })
    .expect("enter the namespace")
    .expect("build the stack")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A VirtualStream from `a` to a listener of `b` at `at`: (client, server).
async fn connected(a: &Stack, b: &Stack, at: SocketAddr) -> (VirtualStream, VirtualStream) {
    let l = b.bind(at).await.unwrap();
    let c = timeout(LIMIT, a.connect(at)).await.unwrap().unwrap();
    let (s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    (c, s)
}

/// Waits (bounded) until everything `s` sent is acknowledged, so that its channels are
/// idle: keep-alive only probes channels with nothing unacknowledged.
async fn acknowledged(s: &Stack) {
    timeout(LIMIT, s.drained())
        .await
        .expect("A's bytes acknowledged");
}

/// B's host vanishes: its interface goes down, so nothing it sends reaches A any more.
fn vanish(bed: &TestBed) {
    let ifname = bed.side(Side::B).ifname.clone();
    bed.output_in(Side::B, "ip", &["link", "set", &ifname, "down"])
        .expect("set B's link down");
}

/// A stream echo: A sends, B answers, A reads the answer (which acknowledges A's bytes).
async fn exchange(c: &mut VirtualStream, s: &mut VirtualStream) {
    c.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    timeout(LIMIT, s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"ping");
    s.write_all(b"pong").await.unwrap();
    timeout(LIMIT, c.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"pong");
}

fn assert_timed_out(e: &std::io::Error, what: &str) {
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{what}: {e}");
}

#[test]
fn idle_streams_to_a_vanished_host_fail_through_keepalive() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    // Keep-alive detects within 200 ms + 3 x 100 ms; the user timeout (30 s) is far
    // beyond DETECT, so only keep-alive can end the idle reads in time.
    let policy = |b: StackBuilder| {
        b.keepalive(Some(Duration::from_millis(200)))
            .keepalive_interval(Duration::from_millis(100))
            .keepalive_probes(3)
            .user_timeout(Duration::from_secs(30))
    };
    let a = stack_in(&bed, Side::A, policy);
    let b = stack_in(&bed, Side::B, policy);
    assert_eq!(
        a.liveness().idle_detection(),
        Some(Duration::from_millis(500))
    );
    assert_eq!(a.liveness().user_timeout, Duration::from_secs(30));
    let (a_ip, b_ip) = (bed.side(Side::A).ipv4, bed.side(Side::B).ipv4);
    let at_b = |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));

    let rt = runtime();
    let (mut c, mut s) = rt.block_on(connected(&a, &b, at_b(7200)));
    rt.block_on(exchange(&mut c, &mut s));

    // A kernel client in B against a VirtualListener on A: a plain-TCP stream.
    let la = rt
        .block_on(a.bind(SocketAddrV4::new(a_ip, 7201).into()))
        .unwrap();
    let mut kernel = bed
        .run_in(Side::B, move || std::net::TcpStream::connect((a_ip, 7201)))
        .unwrap()
        .expect("kernel connect");
    kernel.set_read_timeout(Some(LIMIT)).unwrap();
    let mut p = rt.block_on(async {
        let (p, _) = timeout(LIMIT, la.accept()).await.unwrap().unwrap();
        p
    });
    assert!(p.is_plain_tcp());
    let mut buf = [0u8; 5];
    kernel.write_all(b"hello").unwrap();
    rt.block_on(async { timeout(LIMIT, p.read_exact(&mut buf)).await })
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"hello");
    rt.block_on(p.write_all(b"world")).unwrap();
    kernel.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"world");
    // The kernel's last word acknowledges A's "world".
    kernel.write_all(b"done!").unwrap();
    rt.block_on(async { timeout(LIMIT, p.read_exact(&mut buf)).await })
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"done!");
    rt.block_on(acknowledged(&a));

    // Reads pending on A with nothing in flight, then B vanishes.
    let read_c = rt.spawn(async move {
        let r = c.read(&mut [0u8; 16]).await;
        (c, r)
    });
    let read_p = rt.spawn(async move {
        let r = p.read(&mut [0u8; 16]).await;
        (p, r)
    });
    let t0 = Instant::now();
    vanish(&bed);
    let (mut c, rc) = rt.block_on(async {
        timeout(DETECT, read_c)
            .await
            .expect("the idle virtual stream's read hangs")
            .unwrap()
    });
    let detected = t0.elapsed();
    eprintln!("idle streams failed {detected:?} after B vanished (policy bound 500 ms)");
    let e = rc.expect_err("the virtual stream's read must fail");
    assert_timed_out(&e, "virtual stream read");
    assert!(e.to_string().contains("peer unreachable"), "{e}");
    // The plain-TCP stream has no keep-alive unless its socket asks (then two hours
    // idle): the stack's channel liveness is not for kernel peers.
    assert!(
        !read_p.is_finished(),
        "the idle plain-TCP stream failed: keep-alive probes went to a kernel peer"
    );
    read_p.abort();

    rt.block_on(async {
        // Later calls fail at once.
        let e = timeout(AT_ONCE, c.write_all(b"x"))
            .await
            .expect("a later write hangs")
            .unwrap_err();
        assert_timed_out(&e, "later write");
        let e = timeout(AT_ONCE, c.read(&mut [0u8; 4]))
            .await
            .expect("a later read hangs")
            .unwrap_err();
        assert_timed_out(&e, "later read");

        // A new connect to the vanished host fails within its timeout (the channels are
        // gone, and new ones cannot be opened).
        let t = Instant::now();
        let e = timeout(CONNECT_TIMEOUT + DETECT, a.connect(at_b(7200)))
            .await
            .expect("a new connect hangs")
            .expect_err("a connect to a vanished host must fail");
        eprintln!("new connect failed after {:?}: {e}", t.elapsed());
        assert!(
            matches!(
                e.kind(),
                ErrorKind::TimedOut | ErrorKind::ConnectionRefused | ErrorKind::HostUnreachable
            ),
            "new connect: {e}"
        );
    });
    drop(rt);
    drop(kernel);
    drop((a, b));
}

#[test]
fn in_flight_write_to_a_vanished_host_fails_within_the_user_timeout() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    // No keep-alive: with data in flight only the user timeout can end the write.
    const USER_TIMEOUT: Duration = Duration::from_secs(2);
    let policy = |b: StackBuilder| b.keepalive(None).user_timeout(USER_TIMEOUT);
    let a = stack_in(&bed, Side::A, policy);
    let b = stack_in(&bed, Side::B, policy);
    assert_eq!(a.liveness().idle_detection(), None);
    let b_ip = bed.side(Side::B).ipv4;
    let at_b = |port| SocketAddr::from(SocketAddrV4::new(b_ip, port));

    let rt = runtime();
    let (mut c, mut s) = rt.block_on(connected(&a, &b, at_b(7300)));
    rt.block_on(exchange(&mut c, &mut s));
    rt.block_on(acknowledged(&a));

    let t0 = Instant::now();
    vanish(&bed);
    // More than the socket buffers and the credit window hold: the write stays pending
    // with data in flight that B never acknowledges.
    let write = rt.spawn(async move {
        let data = vec![0x5a_u8; 16 << 20];
        let r = c.write_all(&data).await;
        (c, r)
    });
    let (mut c, r) = rt
        .block_on(async { timeout(USER_TIMEOUT + DETECT, write).await })
        .expect("the write with data in flight hangs")
        .unwrap();
    let detected = t0.elapsed();
    eprintln!("in-flight write failed {detected:?} after B vanished (user timeout 2 s)");
    assert_timed_out(&r.expect_err("the write must fail"), "pending write");
    // The user timeout counts from the first unacknowledged send, after the link went
    // down: the write cannot fail before it (a faster failure would be something else).
    assert!(
        detected >= USER_TIMEOUT,
        "failed after {detected:?}, before the user timeout"
    );

    rt.block_on(async {
        let e = timeout(AT_ONCE, c.write_all(b"x"))
            .await
            .expect("a later write hangs")
            .unwrap_err();
        assert_timed_out(&e, "later write");
        let e = timeout(AT_ONCE, c.read(&mut [0u8; 4]))
            .await
            .expect("a later read hangs")
            .unwrap_err();
        assert_timed_out(&e, "later read");
    });
    drop(rt);
    drop((a, b));
}
