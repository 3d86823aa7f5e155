//! The AF_PACKET link under the whole stack (`netif::Interface` over a [`PacketLink`]) on
//! the test bed's veth pair: against the Linux kernel's TCP at its defaults both ways,
//! ours to ours, with kernel-side random drops (iptables), and with a peer whose 64 KiB
//! super-segments reach a stack that asked for none. Every byte is checked; every test
//! fails (rather than hangs) when a wall-clock deadline passes.
//!
//! A stack runs on one end of the bed: [`PacketSteering`] attaches the socket filter to the
//! link's socket and the TCX ingress drop to the interface, and the stack owns its ports
//! there; one thread alternates [`Interface::poll`] with [`PacketLink::wait_readable`].
//! Besides the bytes, each test checks what makes the link worth having: super-segments
//! went out whole (`tx_super_segments`), the kernel's came in whole (`rx_coalesced`), the
//! kernel's TCP on our end answered none of our flows (its `OutRsts` did not move, and the
//! TCX program dropped our segments on its path).
//!
//! They need root; without it each test prints why it skips, unless
//! `NETCHANNEL_REQUIRE_XDP=1`, which turns the skip into a failure.
#![cfg(target_os = "linux")]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant as StdInstant};

use netdriver::link::packet::{PacketLink, PacketLinkConfig, PacketLinkStats};
use netdriver::link::Link;
use netdriver::neigh::{ifindex_of, KernelNeighbors};
use netdriver::netif::{ConnHandle, Interface, InterfaceConfig, InterfaceStats};
use netdriver::ports::EphemeralRange;
use netdriver::tcp::{Config, State, TcpError};
use netdriver::time::Clock;
use netdriver::wire::EthernetAddress;
use testbed::{testbed_or_skip, Endpoint, Side, TestBed};
use xdp_prog::{PacketCounters, PacketSteering};

/// The port our servers listen on.
const OUR_PORT: u16 = 7000;
/// The port kernel servers listen on.
const KERNEL_PORT: u16 = 7100;
/// Every test fails once this much wall time has passed.
const DEADLINE: Duration = Duration::from_secs(60);
/// Longest sleep of the driver loop.
const MAX_IDLE: Duration = Duration::from_millis(5);

// ---------------------------------------------------------------------------------------
// Deterministic data
// ---------------------------------------------------------------------------------------

/// A byte stream from a seeded splitmix64 generator: the sender fills, the receiver checks.
struct Pattern {
    state: u64,
    word: [u8; 8],
    used: usize,
    offset: u64,
}

impl Pattern {
    fn new(seed: u64) -> Pattern {
        Pattern {
            state: seed,
            word: [0; 8],
            used: 8,
            offset: 0,
        }
    }

    fn next_byte(&mut self) -> u8 {
        if self.used == 8 {
            self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            self.word = (z ^ (z >> 31)).to_le_bytes();
            self.used = 0;
        }
        self.used += 1;
        self.offset += 1;
        self.word[self.used - 1]
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_byte();
        }
    }

    fn check(&mut self, buf: &[u8]) -> Result<(), String> {
        for &b in buf {
            let at = self.offset;
            if b != self.next_byte() {
                return Err(format!("byte {at} differs"));
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Kernel peers (at their defaults)
// ---------------------------------------------------------------------------------------

fn kernel_client(target: SocketAddr, bytes: usize, seed: u64) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(10))
        .map_err(|e| format!("kernel client connect: {e}"))?;
    s.set_write_timeout(Some(DEADLINE))
        .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(DEADLINE))
        .map_err(|e| e.to_string())?;
    let mut pattern = Pattern::new(seed);
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len());
        pattern.fill(&mut buf[..n]);
        s.write_all(&buf[..n])
            .map_err(|e| format!("kernel client write ({} sent): {e}", bytes - left))?;
        left -= n;
    }
    s.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)
        .map_err(|e| format!("kernel client waiting for our FIN: {e}"))?;
    Ok(())
}

fn kernel_server(listener: TcpListener, bytes: usize, seed: u64) -> Result<(), String> {
    let (mut s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    s.set_read_timeout(Some(DEADLINE))
        .map_err(|e| e.to_string())?;
    let mut pattern = Pattern::new(seed);
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0usize;
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| format!("kernel server read after {got} of {bytes}: {e}"))?;
        if n == 0 {
            break;
        }
        pattern
            .check(&buf[..n])
            .map_err(|e| format!("kernel server: {e}"))?;
        got += n;
    }
    if got != bytes {
        return Err(format!("kernel server got {got} of {bytes} before the FIN"));
    }
    Ok(())
}

/// A counter of `/proc/net/snmp`'s `Tcp:` lines in `side`'s namespace.
fn kernel_tcp_counter(bed: &TestBed, side: Side, name: &str) -> u64 {
    let snmp = bed
        .output_in(side, "cat", &["/proc/net/snmp"])
        .expect("snmp");
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap_or(""), tcp.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Packets the first rule of `chain` in A's namespace matched (`iptables -L -v -x`).
fn rule_packets(bed: &TestBed, tool: &str, chain: &str) -> u64 {
    let out = bed
        .output_in(Side::A, tool, &["-w", "-L", chain, "-n", "-v", "-x"])
        .unwrap_or_else(|e| panic!("{tool} -L {chain}: {e}"));
    // A title line, the column names, then the rules.
    out.lines()
        .nth(2)
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no rule counters in {out:?}"))
}

fn iptables(bed: &TestBed) -> &'static str {
    for tool in ["iptables", "iptables-legacy"] {
        if bed.output_in(Side::A, tool, &["-w", "-L", "-n"]).is_ok() {
            return tool;
        }
    }
    panic!("neither iptables nor iptables-legacy works (scripts/install-deps.sh installs it)");
}

// ---------------------------------------------------------------------------------------
// Our stack
// ---------------------------------------------------------------------------------------

/// What one of our stacks does.
#[derive(Clone)]
struct Job {
    /// Receive this many bytes of this seed's stream on [`OUR_PORT`], then close.
    serve: Option<(usize, u64)>,
    /// Send this many bytes of this seed's stream to this server, then close.
    send: Option<(SocketAddrV4, usize, u64)>,
    /// The link's and the interface's offloads on (off: a stack that asked for none).
    offloads: bool,
}

#[derive(Debug, Default)]
struct Report {
    iface: InterfaceStats,
    link: PacketLinkStats,
    steering: PacketCounters,
    retransmitted: u64,
    elapsed: Duration,
    conns: Vec<netdriver::tcp::Stats>,
}

/// Whether our FIN has been acknowledged: nothing of ours is left for the peer, and the
/// stack may stop. Until then a lost FIN is only repaired by this stack's timers (a loss
/// probe or the RTO, 200 ms or more after the FIN), which run only while it is polled.
fn fin_acked(state: State) -> bool {
    matches!(state, State::FinWait2 | State::TimeWait | State::Closed)
}

/// Why connection `h` stopped resolving: its record among those [`Interface::pop_closed`]
/// returns, kept in `closed` (both connections' records come through one queue).
fn closed_record(
    iface: &mut Interface<PacketLink>,
    closed: &mut Vec<(ConnHandle, Option<TcpError>)>,
    h: ConnHandle,
) -> Option<Option<TcpError>> {
    closed.extend(std::iter::from_fn(|| iface.pop_closed()));
    closed.iter().find(|(c, _)| *c == h).map(|(_, e)| *e)
}

/// Runs `job` with a stack on `ep` (call in its namespace) until done or `end`. A
/// connection is done once the peer's FIN is read and ours is acknowledged: a stack that
/// stopped with its FIN in flight would leave a kernel peer waiting for it.
fn our_stack(
    ep: &Endpoint,
    job: &Job,
    ready: mpsc::Sender<()>,
    end: StdInstant,
) -> Result<Report, String> {
    let steering = PacketSteering::attach(&ep.ifname).map_err(|e| e.to_string())?;
    let mut config = PacketLinkConfig::new(&ep.ifname);
    config.segmentation = job.offloads;
    let link =
        PacketLink::open(config, |fd| steering.attach_socket(fd)).map_err(|e| e.to_string())?;
    let ports = EphemeralRange::from_kernel().map_err(|e| e.to_string())?;
    let mut iface = Interface::new(
        link,
        InterfaceConfig {
            mac: EthernetAddress(ep.mac),
            ipv4: ep.ipv4,
            ephemeral_ports: ports.ours,
            tcp: Config {
                mss: u16::MAX,
                ..Config::default()
            },
            large_segments: job.offloads,
            checksum_offload: job.offloads,
            ..InterfaceConfig::default()
        },
    );
    let clock = Clock::new();
    let start = StdInstant::now();
    if job.serve.is_some() {
        steering.own_port(OUR_PORT).map_err(|e| e.to_string())?;
        iface.listen(OUR_PORT, 4).map_err(|e| e.to_string())?;
    }
    let _ = ready.send(());

    let mut client: Option<ConnHandle> = None;
    if let Some((server, _, _)) = job.send {
        let mut neigh = KernelNeighbors::open().map_err(|e| e.to_string())?;
        let ifindex = ifindex_of(&ep.ifname).map_err(|e| e.to_string())?;
        let mac = neigh
            .resolve(ifindex, *server.ip(), Duration::from_secs(3))
            .map_err(|e| format!("resolving the server's MAC: {e}"))?;
        iface.add_neighbor(*server.ip(), mac);
        let h = iface
            .connect(server, clock.now())
            .map_err(|e| e.to_string())?;
        let port = iface.conn(h).map(|c| c.local().port()).unwrap_or(0);
        steering.own_port(port).map_err(|e| e.to_string())?;
        client = Some(h);
    }

    let mut report = Report::default();
    let (serve_bytes, serve_seed) = job.serve.unwrap_or((0, 0));
    let (send_bytes, send_seed) = job.send.map_or((0, 0), |(_, n, s)| (n, s));
    let mut server: Option<ConnHandle> = None;
    let mut server_pattern = Pattern::new(serve_seed);
    let (mut server_got, mut server_closed, mut server_done) = (0usize, false, job.serve.is_none());
    let mut send_pattern = Pattern::new(send_seed);
    let (mut sent, mut client_closed, mut client_done) = (0usize, false, job.send.is_none());
    let mut chunk = vec![0u8; 64 * 1024];
    // Every other write hands the connection a buffer to share (`send_bytes`, as a
    // channel's chunks go), which the link sends as it lies (gathered), not copied.
    let mut writes = 0u64;
    let mut pending = 0..0;
    let mut rbuf = vec![0u8; 256 * 1024];
    let (mut server_retx, mut client_retx) = (0u64, 0u64);
    let mut closed = Vec::new();

    while !(server_done && client_done) {
        if StdInstant::now() > end {
            return Err(format!(
                "deadline: server got {server_got} of {serve_bytes}, client sent {sent} of \
                 {send_bytes}; iface {:?}; link {:?} {:?}",
                iface.stats(),
                iface.link().stats(),
                iface.link().packet_stats()
            ));
        }
        let mut progress = iface.poll(clock.now());
        if server.is_none() && !server_done {
            server = iface.accept(OUR_PORT);
        }
        if let (Some(h), false) = (server, server_done) {
            match iface.conn_mut(h) {
                Some(conn) => {
                    server_retx = conn.stats().retransmitted_segments;
                    while !server_closed {
                        match conn.recv(&mut rbuf) {
                            Ok(0) => {
                                if server_got != serve_bytes {
                                    return Err(format!(
                                        "our server: FIN after {server_got} of {serve_bytes}"
                                    ));
                                }
                                conn.close();
                                server_closed = true;
                                progress = true;
                            }
                            Ok(n) => {
                                server_pattern
                                    .check(&rbuf[..n])
                                    .map_err(|e| format!("our server: {e}"))?;
                                server_got += n;
                                progress = true;
                            }
                            Err(TcpError::WouldBlock) => break,
                            Err(e) => return Err(format!("our server after {server_got}: {e}")),
                        }
                    }
                    server_done = server_closed && fin_acked(conn.state());
                }
                // LAST-ACK ends in CLOSED once our FIN is acknowledged, and `poll` then
                // forgets the connection.
                None => match closed_record(&mut iface, &mut closed, h) {
                    Some(None) if server_closed => server_done = true,
                    other => {
                        return Err(format!(
                            "our server's connection vanished at {server_got}: {other:?}"
                        ))
                    }
                },
            }
        }
        if let (Some(h), false) = (client, client_done) {
            match iface.conn_mut(h) {
                Some(conn) => {
                    client_retx = conn.stats().retransmitted_segments;
                    while sent < send_bytes {
                        if pending.is_empty() {
                            let n = (send_bytes - sent).min(chunk.len());
                            send_pattern.fill(&mut chunk[..n]);
                            pending = 0..n;
                        }
                        writes += 1;
                        let written = if writes % 2 == 0 {
                            conn.send_bytes(&bytes::Bytes::copy_from_slice(&chunk[pending.clone()]))
                        } else {
                            conn.send(&chunk[pending.clone()])
                        };
                        match written {
                            Ok(n) => {
                                pending.start += n;
                                sent += n;
                                progress = true;
                            }
                            Err(TcpError::WouldBlock) => break,
                            Err(e) => return Err(format!("our client after {sent}: {e}")),
                        }
                    }
                    if sent == send_bytes && !client_closed {
                        conn.close();
                        client_closed = true;
                        progress = true;
                    }
                    match conn.recv(&mut rbuf) {
                        Ok(0) if client_closed && fin_acked(conn.state()) => client_done = true,
                        Ok(0) | Err(TcpError::WouldBlock) => {}
                        Ok(n) => return Err(format!("the server sent {n} bytes")),
                        Err(e) => return Err(format!("our client: {e}")),
                    }
                }
                None => match closed_record(&mut iface, &mut closed, h) {
                    Some(None) if client_closed => client_done = true,
                    other => return Err(format!("our client's connection vanished: {other:?}")),
                },
            }
        }
        if !progress {
            let now = clock.now();
            let wait = iface
                .poll_at()
                .map_or(MAX_IDLE, |t| t.saturating_duration_since(now))
                .min(MAX_IDLE);
            let _ = iface.link().wait_readable(wait);
        }
    }
    report.elapsed = start.elapsed();
    report.retransmitted = server_retx + client_retx;
    // Our last ACKs leave, the peer's last segments are answered.
    let linger = StdInstant::now() + Duration::from_millis(100);
    while StdInstant::now() < linger {
        if !iface.poll(clock.now()) {
            let _ = iface.link().wait_readable(Duration::from_millis(2));
        }
    }
    report.iface = iface.stats();
    let _ = iface.link_mut().kernel_drops();
    report.link = iface.link().packet_stats();
    for h in [server, client].into_iter().flatten() {
        if let Some(c) = iface.conn(h) {
            report.conns.push(c.stats());
        }
    }
    report.steering = steering.counters().map_err(|e| e.to_string())?;
    Ok(report)
}

/// Starts our stack on `side` with `job`; returns its thread once it listens.
fn start_ours(
    bed: &TestBed,
    side: Side,
    job: Job,
) -> testbed::NsJoinHandle<Result<Report, String>> {
    let ep = bed.side(side).clone();
    let (tx, rx) = mpsc::channel();
    let end = StdInstant::now() + DEADLINE;
    let h = bed
        .spawn_thread_in(side, move || our_stack(&ep, &job, tx, end))
        .expect("spawn our stack");
    rx.recv_timeout(DEADLINE).expect("our stack started");
    h
}

/// A kernel server on `side`: listening when this returns.
fn start_kernel_server(
    bed: &TestBed,
    side: Side,
    bytes: usize,
    seed: u64,
) -> testbed::NsJoinHandle<Result<(), String>> {
    let ip = bed.side(side).ipv4;
    let (tx, rx) = mpsc::channel();
    let h = bed
        .spawn_thread_in(side, move || {
            let l = TcpListener::bind((ip, KERNEL_PORT)).map_err(|e| e.to_string())?;
            let _ = tx.send(());
            kernel_server(l, bytes, seed)
        })
        .expect("spawn kernel server");
    rx.recv_timeout(DEADLINE).expect("kernel server listening");
    h
}

/// A kernel client in A sends `bytes` of pattern `seed` to our server in B (with or
/// without `offloads`), which checks them; our stack's report once both are done.
fn kernel_client_to_ours(bed: &TestBed, bytes: usize, seed: u64, offloads: bool) -> Report {
    let ours = start_ours(
        bed,
        Side::B,
        Job {
            serve: Some((bytes, seed)),
            send: None,
            offloads,
        },
    );
    let target = SocketAddr::from((bed.side(Side::B).ipv4, OUR_PORT));
    let kclient = bed
        .spawn_thread_in(Side::A, move || kernel_client(target, bytes, seed))
        .unwrap();
    let report = ours.join().expect("our thread").expect("our stack");
    kclient
        .join()
        .expect("kernel client thread")
        .expect("kernel client");
    report
}

fn print(what: &str, bytes: usize, r: &Report) {
    println!(
        "{what}: {:.1} MB in {:.2} s; iface {:?}; link {:?}; steering {:?}; retransmitted {}; connections {:?}",
        bytes as f64 / 1e6,
        r.elapsed.as_secs_f64(),
        r.iface,
        r.link,
        r.steering,
        r.retransmitted,
        r.conns
    );
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// A kernel client to our server and our client to a kernel server at once, 32 MiB each
/// way, kernel at veth's defaults (TSO, GRO, checksum offload).
#[test]
fn kernel_peers_at_defaults_both_ways() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let bytes = 32 << 20;
    let rsts_before = kernel_tcp_counter(&bed, Side::B, "OutRsts");
    let kserver = start_kernel_server(&bed, Side::A, bytes, 2);
    let a_ip = bed.side(Side::A).ipv4;
    let ours = start_ours(
        &bed,
        Side::B,
        Job {
            serve: Some((bytes, 1)),
            send: Some((SocketAddrV4::new(a_ip, KERNEL_PORT), bytes, 2)),
            offloads: true,
        },
    );
    let target = SocketAddr::from((bed.side(Side::B).ipv4, OUR_PORT));
    let kclient = bed
        .spawn_thread_in(Side::A, move || kernel_client(target, bytes, 1))
        .unwrap();
    let report = ours.join().expect("our thread");
    let kclient = kclient.join().expect("kernel client thread");
    let kserver = kserver.join().expect("kernel server thread");
    let report = report.unwrap_or_else(|e| {
        panic!("our stack: {e}\nkernel client: {kclient:?}\nkernel server: {kserver:?}")
    });
    kclient.unwrap_or_else(|e| panic!("kernel client: {e}"));
    kserver.unwrap_or_else(|e| panic!("kernel server: {e}"));
    print("kernel <-> ours", 2 * bytes, &report);
    let r = &report;
    assert!(r.link.tx_super_segments > 100, "{:?}", r.link);
    assert!(r.link.tx_gathered_bytes > 0, "{:?}", r.link);
    assert!(
        r.link.rx_coalesced > 100,
        "the kernel's TSO segments came whole: {:?}",
        r.link
    );
    assert!(r.iface.rx_large_frames > 100, "{:?}", r.iface);
    assert_eq!(r.iface.rx_bad_checksum, 0, "{:?}", r.iface);
    assert!(r.steering.kernel_dropped > 100, "{:?}", r.steering);
    assert_eq!(
        kernel_tcp_counter(&bed, Side::B, "OutRsts"),
        rsts_before,
        "B's kernel answered our flows"
    );
}

/// Ours to ours: a stack on each end, 64 MiB from A's client to B's server.
#[test]
fn ours_to_ours() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let bytes = 64 << 20;
    let server = start_ours(
        &bed,
        Side::B,
        Job {
            serve: Some((bytes, 3)),
            send: None,
            offloads: true,
        },
    );
    let b_ip = bed.side(Side::B).ipv4;
    let client = start_ours(
        &bed,
        Side::A,
        Job {
            serve: None,
            send: Some((SocketAddrV4::new(b_ip, OUR_PORT), bytes, 3)),
            offloads: true,
        },
    );
    let c = client.join().expect("client thread").expect("our client");
    let s = server.join().expect("server thread").expect("our server");
    print("ours -> ours (client)", bytes, &c);
    print("ours -> ours (server)", bytes, &s);
    assert!(c.link.tx_super_segments > 100, "{:?}", c.link);
    assert!(
        c.link.tx_gathered_bytes > (bytes / 4) as u64,
        "shared writes went gathered: {:?}",
        c.link
    );
    assert!(c.iface.tx_payload_gathered > 100, "{:?}", c.iface);
    assert!(s.iface.rx_large_frames > 100, "{:?}", s.iface);
    assert_eq!(s.iface.rx_bad_checksum, 0);
}

/// A's kernel loses 5% of the TCP packets it sends and receives (iptables); both
/// directions still deliver every byte, and both senders recover by retransmitting.
/// Netfilter sees GSO/GRO packets whole, so a loss takes a whole super-segment (up to 44
/// wire segments) and 16 MiB each way is only some 300 packets: the rate is high enough
/// that each direction loses some (the chance that one does not is below 1e-6).
///
/// What A receives is dropped (`-j DROP` in INPUT): our segments are lost after they left
/// us, and we retransmit. What A sends cannot be lost that way: a `DROP` verdict in OUTPUT
/// makes `ip_local_out` fail with `EPERM`, which TCP's `tcp_write_xmit` takes as "not
/// sent" and sends the same bytes again later as new data, never as a retransmission and
/// never as a loss our receiver sees (the kernel's `RetransSegs` then moved only when a
/// lost ACK happened to end in a loss probe, about one run in three). OUTPUT therefore
/// hands the packet to an NFQUEUE that no program listens on: the packet is dropped, but
/// the verdict is "stolen", so the hook reports success and the kernel's TCP learns of
/// the loss from our ACKs, as from a lossy wire.
#[test]
fn kernel_side_random_drops() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let tool = iptables(&bed);
    let lose: [(&str, &[&str]); 2] = [
        ("INPUT", &["DROP"]),
        ("OUTPUT", &["NFQUEUE", "--queue-num", "7"]),
    ];
    for (chain, verdict) in lose {
        let mut args = vec![
            "-w",
            "-A",
            chain,
            "-p",
            "tcp",
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            "0.05",
            "-j",
        ];
        args.extend_from_slice(verdict);
        bed.output_in(Side::A, tool, &args)
            .unwrap_or_else(|e| panic!("{tool} -A {chain}: {e}"));
    }
    let bytes = 16 << 20;
    let kretrans = kernel_tcp_counter(&bed, Side::A, "RetransSegs");
    let kserver = start_kernel_server(&bed, Side::A, bytes, 5);
    let a_ip = bed.side(Side::A).ipv4;
    let ours = start_ours(
        &bed,
        Side::B,
        Job {
            serve: Some((bytes, 4)),
            send: Some((SocketAddrV4::new(a_ip, KERNEL_PORT), bytes, 5)),
            offloads: true,
        },
    );
    let target = SocketAddr::from((bed.side(Side::B).ipv4, OUR_PORT));
    let kclient = bed
        .spawn_thread_in(Side::A, move || kernel_client(target, bytes, 4))
        .unwrap();
    let report = ours.join().expect("our thread");
    let kclient = kclient.join().expect("kernel client thread");
    let kserver = kserver.join().expect("kernel server thread");
    let report = report.unwrap_or_else(|e| {
        panic!("our stack: {e}\nkernel client: {kclient:?}\nkernel server: {kserver:?}")
    });
    kclient.unwrap_or_else(|e| panic!("kernel client: {e}"));
    kserver.unwrap_or_else(|e| panic!("kernel server: {e}"));
    print("kernel <-> ours, 5% drops", 2 * bytes, &report);
    let kernel_retrans = kernel_tcp_counter(&bed, Side::A, "RetransSegs") - kretrans;
    let (lost_in, lost_out) = (
        rule_packets(&bed, tool, "INPUT"),
        rule_packets(&bed, tool, "OUTPUT"),
    );
    assert!(
        lost_in > 0 && lost_out > 0,
        "losses on both paths: {lost_in} packets to A, {lost_out} from A"
    );
    assert!(
        report.retransmitted > 0 && kernel_retrans > 0,
        "both senders recovered from losses ({lost_in} packets to A, {lost_out} from A): \
         we retransmitted {}, the kernel {kernel_retrans}",
        report.retransmitted
    );
}

/// Our server's FIN is lost once (A's INPUT drops the first FIN from [`OUR_PORT`]), after
/// the kernel client's FIN, so nothing else is in flight: our stack runs on until its FIN
/// is acknowledged, its loss probe or RTO resends the FIN (200 ms or more later), and the
/// kernel client reads the end of the stream. A stack that stopped once it had closed
/// left the kernel client waiting for that FIN until its read timed out.
#[test]
fn a_lost_fin_of_ours_is_resent_before_our_stack_stops() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let tool = iptables(&bed);
    // The first FIN from our port is dropped and remembered (`recent`); later ones pass.
    let rule = format!(
        "-w -A INPUT -p tcp --sport {OUR_PORT} --tcp-flags FIN FIN \
         -m recent --name ncfin ! --rcheck -m recent --name ncfin --set -j DROP"
    );
    let args: Vec<&str> = rule.split_whitespace().collect();
    bed.output_in(Side::A, tool, &args)
        .unwrap_or_else(|e| panic!("{tool} -A INPUT: {e}"));
    let bytes = 1 << 20;
    let report = kernel_client_to_ours(&bed, bytes, 7, true);
    print("kernel -> ours, our first FIN lost", bytes, &report);
    assert_eq!(
        rule_packets(&bed, tool, "INPUT"),
        1,
        "one FIN of ours dropped, the one resent passed"
    );
}

/// A stack with every offload off (its link takes MTU-sized frames with complete
/// checksums, its TCP sends plain segments) still takes the kernel's 64 KiB
/// super-segments, which veth carries whole whatever the receiver asked for.
#[test]
fn a_kernel_peers_64k_segments_reach_a_stack_that_asked_for_none() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let bytes = 16 << 20;
    let report = kernel_client_to_ours(&bed, bytes, 6, false);
    print("kernel -> ours without offloads", bytes, &report);
    assert!(report.iface.rx_large_frames > 10, "{:?}", report.iface);
    assert_eq!(report.iface.tx_super_segments, 0);
    assert_eq!(report.iface.tx_checksum_offloaded, 0);
    assert_eq!(report.link.tx_super_segments, 0);
}
