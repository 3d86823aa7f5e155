//! Interoperability of the whole stack (`netif::Interface` over an AF_XDP [`XdpLink`])
//! with the Linux kernel's TCP, under faults, on the test bed's veth pair.
//!
//! Side B runs our stack: the `xdp-prog` steering program on `vB` redirects TCP to the
//! ports the stack owns to one [`XdpLink`] (a one-queue bed), and a single-threaded driver
//! loop alternates [`Interface::poll`] with [`XdpLink::wait_readable`] (until the
//! interface's next timer). Side A is the kernel (`std::net`). Every test moves
//! deterministic pseudo-random data both ways — a kernel client to our server and our
//! client to a kernel server — verifies every byte, and fails (rather than hangs) when a
//! wall-clock deadline passes. Faults come from:
//!
//! - the kernel side: `iptables -m statistic` drops 1% of A's TCP in and out (this kernel
//!   has no `netem`);
//! - our side: a seeded [`FaultInjector`] around the [`XdpLink`] (loss, reordering,
//!   duplication, corruption);
//! - the wire: malformed frames injected from A with a second [`XdpLink`] on `vA`.
//!
//! One more run uses MTU 9000, where every full-size segment crosses our link as a chain of
//! UMEM frames (multi-buffer AF_XDP).
//!
//! A's kernel runs at veth's defaults (tx checksum offload on) unless a test says
//! otherwise: its segments then reach our link with partial checksums (the pseudo-header
//! sum only, `CHECKSUM_PARTIAL`), which our stack accepts because the driver is veth, as
//! `ChannelSet` does with `PartialChecksums::Auto`. The variants with offload off
//! (`ethtool -K vA tx off`) check the path where every checksum is complete, and the fault
//! injector's test needs it: it corrupts frames, which a partial checksum cannot catch.
//!
//! They need root; without it each test prints why it skips, unless
//! `NETCHANNEL_REQUIRE_XDP=1`, which turns the skip into a failure.
#![cfg(target_os = "linux")]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant as StdInstant};

use netdriver::channel::{driver_name, is_host_local_driver};
use netdriver::link::fault::{FaultConfig, FaultDirection, FaultInjector, FaultStats};
use netdriver::link::xdp::{XdpLink, XdpLinkConfig};
use netdriver::link::{Link, LinkStats};
use netdriver::neigh::{ifindex_of, KernelNeighbors};
use netdriver::netif::{ConnHandle, Interface, InterfaceConfig, InterfaceStats};
use netdriver::ports::EphemeralRange;
use netdriver::tcp::{Config, SeqNumber, Stats, TcpError};
use netdriver::time::{Clock, Instant};
use netdriver::wire::{
    emit_tcp_frame, EtherType, EthernetAddress, EthernetRepr, IpProtocol, Ipv4Packet, Ipv4Repr,
    TcpFlags, TcpRepr,
};
use testbed::{testbed_or_skip, Endpoint, Side, TestBed};
use xdp_prog::{AttachMode, AttachOptions, XdpSteering};

/// The port our server listens on.
const OUR_PORT: u16 = 7000;
/// The port A's kernel server listens on.
const KERNEL_PORT: u16 = 7100;
/// Every test fails once this much wall time has passed.
const DEADLINE: Duration = Duration::from_secs(30);
/// Longest sleep of the driver loop, so it notices the deadline and the application.
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

    /// Checks `buf` against the stream; the error names the first wrong byte's offset.
    fn check(&mut self, buf: &[u8]) -> Result<(), String> {
        for &b in buf {
            let at = self.offset;
            let want = self.next_byte();
            if b != want {
                return Err(format!("byte {at} differs: got {b:#04x}, want {want:#04x}"));
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The kernel side (A)
// ---------------------------------------------------------------------------------------

/// A kernel client: connects to our server, sends `bytes` of `seed`'s stream, shuts down
/// its write side and waits for our FIN.
fn kernel_client(target: SocketAddr, bytes: usize, seed: u64) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(10))
        .map_err(|e| format!("kernel client connect: {e}"))?;
    s.set_write_timeout(Some(DEADLINE))
        .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(DEADLINE))
        .map_err(|e| e.to_string())?;
    let mut pattern = Pattern::new(seed);
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len());
        pattern.fill(&mut buf[..n]);
        s.write_all(&buf[..n]).map_err(|e| {
            format!(
                "kernel client write ({} of {bytes} sent): {e}",
                bytes - left
            )
        })?;
        left -= n;
    }
    s.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)
        .map_err(|e| format!("kernel client waiting for our FIN: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("our server sent {} unexpected bytes", rest.len()));
    }
    Ok(())
}

/// A kernel server: accepts one connection, checks `bytes` of `seed`'s stream and the FIN
/// after it, then closes.
fn kernel_server(listener: TcpListener, bytes: usize, seed: u64) -> Result<(), String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let end = StdInstant::now() + DEADLINE;
    let mut s = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if StdInstant::now() > end {
                    return Err("kernel server: no connection came".into());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(format!("kernel server accept: {e}")),
        }
    };
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(DEADLINE))
        .map_err(|e| e.to_string())?;
    let mut pattern = Pattern::new(seed);
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0usize;
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| format!("kernel server read after {got} of {bytes} bytes: {e}"))?;
        if n == 0 {
            break;
        }
        pattern
            .check(&buf[..n])
            .map_err(|e| format!("kernel server: {e}"))?;
        got += n;
    }
    if got != bytes {
        return Err(format!(
            "kernel server got {got} of {bytes} bytes before the FIN"
        ));
    }
    Ok(())
}

/// Switches tx checksum offload (and with it TSO) off on A's veth end.
fn kernel_checksums_in_software(bed: &TestBed) {
    let a = bed.side(Side::A);
    bed.output_in(Side::A, "ethtool", &["-K", &a.ifname, "tx", "off"])
        .expect("ethtool -K vA tx off");
}

/// The kernel's count of retransmitted TCP segments in `side`'s namespace
/// (`RetransSegs` of `/proc/net/snmp`).
fn kernel_retransmits(bed: &TestBed, side: Side) -> u64 {
    let snmp = bed
        .output_in(side, "cat", &["/proc/net/snmp"])
        .expect("read /proc/net/snmp");
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap_or(""), tcp.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RetransSegs")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Which `iptables` front end works in this namespace: the default one (nf_tables on this
/// machine) or `iptables-legacy`.
fn iptables(bed: &TestBed) -> &'static str {
    for tool in ["iptables", "iptables-legacy"] {
        if bed.output_in(Side::A, tool, &["-w", "-L", "-n"]).is_ok() {
            return tool;
        }
    }
    panic!("neither iptables nor iptables-legacy works (scripts/install-deps.sh installs it)");
}

/// Makes A's kernel drop `probability` of the TCP segments it receives and of those it
/// sends. Returns the tool that worked.
fn kernel_random_drops(bed: &TestBed, probability: f64) -> &'static str {
    let tool = iptables(bed);
    let p = probability.to_string();
    for chain in ["INPUT", "OUTPUT"] {
        bed.output_in(
            Side::A,
            tool,
            &[
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
                &p,
                "-j",
                "DROP",
            ],
        )
        .unwrap_or_else(|e| panic!("{tool} -A {chain}: {e}"));
    }
    tool
}

/// Packets the DROP rules of A's INPUT and OUTPUT chains matched.
fn kernel_drops(bed: &TestBed, tool: &str) -> u64 {
    let mut total = 0;
    for chain in ["INPUT", "OUTPUT"] {
        let out = bed
            .output_in(Side::A, tool, &["-w", "-L", chain, "-n", "-v", "-x"])
            .unwrap_or_default();
        total += out
            .lines()
            .filter(|l| l.contains("DROP"))
            .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

// ---------------------------------------------------------------------------------------
// Our side (B)
// ---------------------------------------------------------------------------------------

/// A link whose readiness the driver loop can wait on.
trait Waitable: Link {
    /// Sleeps until a frame may be ready, for at most `timeout`.
    fn wait(&mut self, timeout: Duration);
}

impl Waitable for XdpLink {
    fn wait(&mut self, timeout: Duration) {
        // An error (EINTR) only ends the wait early; the loop polls again.
        let _ = self.wait_readable(timeout);
    }
}

impl Waitable for FaultInjector<XdpLink> {
    fn wait(&mut self, timeout: Duration) {
        let _ = self.inner_mut().wait_readable(timeout);
    }
}

/// What our stack does in one run.
struct Plan {
    /// Bytes our server (port [`OUR_PORT`]) must receive from the kernel client.
    serve: usize,
    serve_seed: u64,
    /// Bytes our client sends to the kernel server (A, [`KERNEL_PORT`]).
    send: usize,
    send_seed: u64,
    /// The loop keeps running (and counting) while this is set, even once both transfers
    /// are done.
    hold: Arc<AtomicBool>,
}

/// What our stack saw.
#[derive(Debug, Default)]
struct Report {
    iface: InterfaceStats,
    link: LinkStats,
    faults: Option<FaultStats>,
    /// Frames the link received and sent as descriptor chains.
    chains: (u64, u64),
    /// Last stats of our server's and our client's connection.
    server_conn: Stats,
    client_conn: Stats,
    elapsed: Duration,
    /// Frames the kernel could not put on our AF_XDP socket's rx ring (`XDP_STATISTICS`:
    /// dropped, ring full), for tests that count every frame sent to us.
    ring_drops: u64,
}

impl Report {
    fn retransmitted(&self) -> u64 {
        self.server_conn.retransmitted_segments + self.client_conn.retransmitted_segments
    }
}

/// Which TCP checksums our stack takes from A's kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checksums {
    /// As the stack does on veth: a checksum holding the pseudo-header sum alone is a
    /// partial one a sender on this host left (`InterfaceConfig::accept_partial_checksums`).
    PartialTrusted,
    /// Only complete checksums (A computes them in software).
    CompleteOnly,
}

/// Our stack on B's veth end: steering attached, one link on queue 0, port
/// [`OUR_PORT`] owned.
struct OurStack<L: Waitable> {
    iface: Interface<L>,
    steering: XdpSteering,
    clock: Clock,
}

impl<L: Waitable> OurStack<L> {
    /// Must run in B's namespace.
    /// `frags`: attach the `xdp.frags` program (an MTU above 3506).
    /// `accept_partial`: trust a checksum holding the pseudo-header sum alone (see
    /// [`Checksums`]).
    fn open(
        b: &Endpoint,
        frags: bool,
        accept_partial: bool,
        wrap: impl FnOnce(XdpLink) -> L,
    ) -> OurStack<L> {
        let steering = XdpSteering::attach(
            &b.ifname,
            AttachOptions {
                mode: AttachMode::Auto,
                frags,
                replace_stale: true,
            },
        )
        .expect("attach the steering program");
        let link = XdpLink::open(XdpLinkConfig::new(&b.ifname, 0)).expect("open the link");
        assert_eq!(link.multi_buffer(), frags);
        steering.register_socket(0, link.fd()).expect("register");
        steering.own_port(OUR_PORT).expect("own the server port");
        let ports = EphemeralRange::from_kernel().expect("ephemeral ports");
        let driver = driver_name(&b.ifname).expect("ETHTOOL_GDRVINFO on the bed's veth");
        assert_eq!(driver, "veth");
        let config = InterfaceConfig {
            accept_partial_checksums: accept_partial && is_host_local_driver(&driver),
            mac: EthernetAddress(b.mac),
            ipv4: b.ipv4,
            ephemeral_ports: ports.ours,
            // Clamped to the link's MTU − 40 by `Interface::new`.
            tcp: Config {
                mss: u16::MAX,
                ..Config::default()
            },
            ..InterfaceConfig::default()
        };
        OurStack {
            iface: Interface::new(wrap(link), config),
            steering,
            clock: Clock::new(),
        }
    }

    /// Runs `plan` to completion, or fails at `end`. `ready` gets a message once our
    /// server listens.
    fn run(
        &mut self,
        plan: &Plan,
        kernel_server: SocketAddrV4,
        ready: mpsc::Sender<()>,
        end: StdInstant,
    ) -> Result<Report, String> {
        let start = StdInstant::now();
        let iface = &mut self.iface;
        iface.listen(OUR_PORT, 4).map_err(|e| e.to_string())?;
        let _ = ready.send(());

        // Our client: the kernel resolves A's MAC, the local port is owned before the SYN
        // can leave (at the next poll).
        let mut client = None;
        if plan.send > 0 {
            let mut neigh = KernelNeighbors::open().map_err(|e| e.to_string())?;
            let ifindex = ifindex_of(self.steering.ifname()).map_err(|e| e.to_string())?;
            let mac = neigh
                .resolve(ifindex, *kernel_server.ip(), Duration::from_secs(3))
                .map_err(|e| format!("resolving A's MAC: {e}"))?;
            iface.add_neighbor(*kernel_server.ip(), mac);
            let h = iface
                .connect(kernel_server, self.clock.now())
                .map_err(|e| e.to_string())?;
            let port = iface.conn(h).map(|c| c.local().port()).unwrap_or(0);
            self.steering.own_port(port).map_err(|e| e.to_string())?;
            client = Some(h);
        }

        let mut report = Report::default();
        let mut server: Option<ConnHandle> = None;
        let mut server_pattern = Pattern::new(plan.serve_seed);
        let mut server_got = 0usize;
        let mut server_eof = plan.serve == 0;
        let mut server_done = plan.serve == 0;
        let mut send_pattern = Pattern::new(plan.send_seed);
        let mut sent = 0usize;
        let mut client_closed = false;
        let mut client_done = plan.send == 0;
        let mut chunk = vec![0u8; 16 * 1024];
        let mut pending = 0..0; // bytes of `chunk` generated but not yet taken by `send`
        let mut rbuf = vec![0u8; 64 * 1024];

        while !(server_done && client_done) || plan.hold.load(Ordering::Acquire) {
            if StdInstant::now() > end {
                return Err(format!(
                    "deadline: server got {server_got} of {} (eof {server_eof}), client sent \
                     {sent} of {} (closed {client_closed}); iface {:?}; link {:?}; server \
                     {:?}; client {:?}",
                    plan.serve,
                    plan.send,
                    iface.stats(),
                    iface.link().stats(),
                    report.server_conn,
                    report.client_conn
                ));
            }
            let now = self.clock.now();
            let mut progress = iface.poll(now);

            // Our server.
            if server.is_none() && plan.serve > 0 {
                server = iface.accept(OUR_PORT);
            }
            if let Some(h) = server {
                match iface.conn_mut(h) {
                    Some(conn) => {
                        report.server_conn = conn.stats();
                        loop {
                            match conn.recv(&mut rbuf) {
                                Ok(0) => {
                                    if !server_eof {
                                        server_eof = true;
                                        conn.close();
                                        progress = true;
                                    }
                                    break;
                                }
                                Ok(n) => {
                                    server_pattern
                                        .check(&rbuf[..n])
                                        .map_err(|e| format!("our server: {e}"))?;
                                    server_got += n;
                                    progress = true;
                                }
                                Err(TcpError::WouldBlock) => break,
                                Err(e) => {
                                    return Err(format!(
                                        "our server's connection failed after {server_got} \
                                         bytes: {e}"
                                    ))
                                }
                            }
                        }
                    }
                    // Removed: it closed and everything was read.
                    None => {
                        if !server_eof {
                            return Err(format!(
                                "our server's connection vanished after {server_got} bytes: \
                                 {:?}",
                                iface.pop_closed()
                            ));
                        }
                        server_done = true;
                    }
                }
                if server_eof && server_got != plan.serve {
                    return Err(format!(
                        "our server got {server_got} of {} bytes before the FIN",
                        plan.serve
                    ));
                }
            }

            // Our client.
            if let (Some(h), false) = (client, client_done) {
                match iface.conn_mut(h) {
                    Some(conn) => {
                        report.client_conn = conn.stats();
                        while sent < plan.send {
                            if pending.is_empty() {
                                let n = (plan.send - sent).min(chunk.len());
                                send_pattern.fill(&mut chunk[..n]);
                                pending = 0..n;
                            }
                            match conn.send(&chunk[pending.clone()]) {
                                Ok(n) => {
                                    pending.start += n;
                                    sent += n;
                                    progress = true;
                                }
                                Err(TcpError::WouldBlock) => break,
                                Err(e) => {
                                    return Err(format!(
                                        "our client failed after {sent} bytes: {e}"
                                    ))
                                }
                            }
                        }
                        if sent == plan.send && !client_closed {
                            conn.close();
                            client_closed = true;
                            progress = true;
                        }
                        // Done once the kernel server's FIN came (it closes after checking
                        // every byte) and all our data is acknowledged.
                        match conn.recv(&mut rbuf) {
                            Ok(0) if conn.send_queue() == 0 => client_done = true,
                            Ok(0) | Err(TcpError::WouldBlock) => {}
                            Ok(n) => return Err(format!("kernel server sent {n} bytes")),
                            Err(e) => return Err(format!("our client failed: {e}")),
                        }
                    }
                    None => match iface.pop_closed() {
                        Some((_, None)) if client_closed => client_done = true,
                        other => {
                            return Err(format!("our client's connection vanished: {other:?}"))
                        }
                    },
                }
            }

            if !progress {
                let now = self.clock.now();
                let wait = iface
                    .poll_at()
                    .map_or(MAX_IDLE, |t| t.saturating_duration_since(now))
                    .min(MAX_IDLE);
                iface.link_mut().wait(wait);
            }
        }
        // Give our last ACKs/FIN a moment to leave (the kernel side retransmits otherwise).
        let linger = StdInstant::now() + Duration::from_millis(50);
        while StdInstant::now() < linger {
            let now = self.clock.now();
            if !iface.poll(now) {
                iface.link_mut().wait(Duration::from_millis(2));
            }
        }
        report.iface = iface.stats();
        report.link = iface.link().stats();
        report.elapsed = start.elapsed();
        Ok(report)
    }
}

/// [`transfer`] of 8 MiB each way over the bare link, partial checksums trusted as on
/// veth, with `probe` reading the link at the end.
fn plain_transfer(bed: &TestBed, probe: fn(&XdpLink, &mut Report)) -> Report {
    transfer(
        bed,
        8 << 20,
        Checksums::PartialTrusted,
        Arc::default(),
        |l| l,
        probe,
        || {},
    )
}

/// One run: our stack on B (its link wrapped by `wrap`), A's kernel client and server
/// carrying `bytes` each way; `during` runs on the test thread while it goes on, and
/// `probe` reads what it wants of the link into the report at the end.
fn transfer<L, W>(
    bed: &TestBed,
    bytes: usize,
    checksums: Checksums,
    hold: Arc<AtomicBool>,
    wrap: W,
    probe: fn(&L, &mut Report),
    during: impl FnOnce(),
) -> Report
where
    L: Waitable + Send + 'static,
    W: FnOnce(XdpLink) -> L + Send + 'static,
{
    let a = bed.side(Side::A).clone();
    let b = bed.side(Side::B).clone();
    let end = StdInstant::now() + DEADLINE;
    let plan = Plan {
        serve: bytes,
        serve_seed: 0x5eed_0001,
        send: bytes,
        send_seed: 0x5eed_0002,
        hold,
    };

    // A's kernel server listens before our client can connect.
    let (lst_tx, lst_rx) = mpsc::channel();
    let (send, send_seed) = (plan.send, plan.send_seed);
    let kserver = bed
        .spawn_thread_in(Side::A, move || {
            let listener = TcpListener::bind((a.ipv4, KERNEL_PORT)).map_err(|e| e.to_string())?;
            let _ = lst_tx.send(());
            kernel_server(listener, send, send_seed)
        })
        .unwrap();
    lst_rx
        .recv_timeout(DEADLINE)
        .expect("kernel server listening");

    let (ready_tx, ready_rx) = mpsc::channel();
    let server_addr = SocketAddrV4::new(a.ipv4, KERNEL_PORT);
    let b2 = b.clone();
    let frags = bed.mtu() > 3506;
    let ours = bed
        .spawn_thread_in(Side::B, move || {
            let accept_partial = checksums == Checksums::PartialTrusted;
            let mut stack = OurStack::open(&b2, frags, accept_partial, wrap);
            let mut report = stack.run(&plan, server_addr, ready_tx, end);
            if let Ok(r) = &mut report {
                probe(stack.iface.link(), r);
            }
            report
        })
        .unwrap();
    let ready = ready_rx.recv_timeout(DEADLINE).is_ok();

    let target = SocketAddr::from((b.ipv4, OUR_PORT));
    let (serve, serve_seed) = (bytes, 0x5eed_0001);
    let kclient = ready.then(|| {
        bed.spawn_thread_in(Side::A, move || kernel_client(target, serve, serve_seed))
            .unwrap()
    });
    during();
    let ours = ours.join().expect("our stack's thread");
    let kclient = kclient.map(|c| c.join().expect("kernel client thread"));
    let kserver = kserver.join().expect("kernel server thread");
    let report = ours.unwrap_or_else(|e| {
        panic!("our stack: {e}\nkernel client: {kclient:?}\nkernel server: {kserver:?}")
    });
    assert!(ready, "our stack never got ready");
    kclient
        .expect("kernel client ran")
        .unwrap_or_else(|e| panic!("kernel client: {e}"));
    kserver.unwrap_or_else(|e| panic!("kernel server: {e}"));
    let mb = bytes as f64 / 1e6;
    println!(
        "{mb:.1} MB each way in {:.2} s; iface {:?}; link {:?}; chains rx/tx {:?}; faults {:?}; \
         our retransmits server {} client {}",
        report.elapsed.as_secs_f64(),
        report.iface,
        report.link,
        report.chains,
        report.faults,
        report.server_conn.retransmitted_segments,
        report.client_conn.retransmitted_segments,
    );
    report
}

fn no_faults(_: &XdpLink, _: &mut Report) {}

fn ring_drops(link: &XdpLink, report: &mut Report) {
    let k = link.kernel_stats().expect("XDP_STATISTICS");
    report.ring_drops = k.rx_dropped + k.rx_ring_full;
}

fn chain_counts(link: &XdpLink, report: &mut Report) {
    report.chains = (link.rx_chains(), link.tx_chains());
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// 8 MiB each way while A's kernel, at its defaults, drops 1% of the TCP segments it
/// sends and receives.
#[test]
fn transfers_survive_kernel_side_random_drops() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    let tool = kernel_random_drops(&bed, 0.01);
    println!("kernel-side drops with {tool}");
    let retrans_before = kernel_retransmits(&bed, Side::A);
    let report = plain_transfer(&bed, no_faults);
    let drops = kernel_drops(&bed, tool);
    let kernel_retrans = kernel_retransmits(&bed, Side::A) - retrans_before;
    println!(
        "{tool}: {drops} segments dropped; kernel retransmitted {kernel_retrans}, we \
         retransmitted {}",
        report.retransmitted()
    );
    assert!(drops > 0, "the iptables rules dropped nothing");
    assert!(
        report.retransmitted() > 0 || kernel_retrans > 0,
        "drops but no retransmissions"
    );
    assert_eq!(report.iface.rx_bad_checksum, 0, "{:?}", report.iface);
    // Offload on: the kernel's segments came with partial checksums, and were accepted.
    assert!(
        report.iface.rx_partial_checksum > 1000,
        "{:?}",
        report.iface
    );
}

/// 8 MiB each way with A's tx checksum offload off: every segment arrives with a complete
/// checksum, which is verified, and none is counted as partial.
#[test]
fn transfers_with_kernel_checksums_in_software() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    kernel_checksums_in_software(&bed);
    let report = plain_transfer(&bed, no_faults);
    let s = report.iface;
    assert_eq!((s.rx_bad_checksum, s.rx_partial_checksum), (0, 0), "{s:?}");
    assert!(s.rx_segments > 1000, "{s:?}");
}

/// 8 MiB each way at MTU 9000: both TCPs use 8960-byte segments, which our link receives
/// and sends as chains of UMEM frames (multi-buffer AF_XDP, the `xdp.frags` program).
#[test]
fn transfers_with_jumbo_frames() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1).mtu(9000)) else {
        return;
    };
    let report = plain_transfer(&bed, chain_counts);
    let (rx_chains, tx_chains) = report.chains;
    assert!(rx_chains > 500, "only {rx_chains} frames came as chains");
    assert!(tx_chains > 500, "only {tx_chains} frames left as chains");
    assert_eq!(report.link.dropped_oversize, 0);
    assert_eq!(report.iface.rx_bad_checksum + report.iface.rx_malformed, 0);
    assert!(report.iface.rx_partial_checksum > 0, "{:?}", report.iface);
}

/// 8 MiB each way with the link's software segmentation on: our TCP hands the link
/// super-segments, which it cuts into MTU-sized frames (with their checksums) in UMEM.
#[test]
fn transfers_with_the_links_segmentation() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    let report = transfer(
        &bed,
        8 << 20,
        Checksums::PartialTrusted,
        Arc::default(),
        |mut l: XdpLink| {
            assert!(l.set_segmentation(true));
            l
        },
        |l: &XdpLink, r: &mut Report| r.chains.1 = l.tx_super_segments(),
        || {},
    );
    assert!(
        report.chains.1 > 100,
        "super-segments cut: {}",
        report.chains.1
    );
    assert!(report.iface.tx_super_segments > 100, "{:?}", report.iface);
    assert_eq!(report.link.dropped_oversize, 0);
    assert_eq!(report.iface.rx_bad_checksum + report.iface.rx_malformed, 0);
}

/// 8 MiB each way with our own fault injector on both directions of our link.
#[test]
fn transfers_survive_our_fault_injector() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    // The injector corrupts frames, as a faulty NIC or cable would: only a complete
    // checksum catches that, so A computes them (a partial one would let the corruption
    // through, which is why partial checksums are trusted on veth only).
    kernel_checksums_in_software(&bed);
    let retrans_before = kernel_retransmits(&bed, Side::A);
    let config = FaultConfig {
        loss: 0.01,
        reorder: 0.02,
        duplicate: 0.01,
        corrupt: 0.01,
        seed: 0x00fa_0175,
        direction: FaultDirection::Both,
        ..FaultConfig::default()
    };
    let report = transfer(
        &bed,
        8 << 20,
        // A sends complete checksums: none is to be taken as partial. Trusted, a
        // complete checksum that happens to equal the pseudo-header sum (one frame in
        // 65,536) would pass as partial, and a bit the injector flipped in its payload
        // with it (seen once in a clean-clone run of the test suite).
        Checksums::CompleteOnly,
        Arc::default(),
        move |l| FaultInjector::new(l, config),
        |l: &FaultInjector<XdpLink>, r: &mut Report| r.faults = Some(l.fault_stats()),
        || {},
    );
    let kernel_retrans = kernel_retransmits(&bed, Side::A) - retrans_before;
    let f = report.faults.expect("fault stats");
    println!(
        "kernel retransmitted {kernel_retrans}, we retransmitted {}",
        report.retransmitted()
    );
    assert!(
        f.lost > 0 && f.reordered > 0 && f.duplicated > 0 && f.corrupted > 0,
        "{f:?}"
    );
    assert!(
        report.retransmitted() > 0 && kernel_retrans > 0,
        "losses both ways but retransmissions: ours {}, kernel {kernel_retrans}",
        report.retransmitted()
    );
    // Corrupted received frames are caught by a checksum or the address filter.
    assert!(
        report.iface.rx_bad_checksum + report.iface.rx_not_ours + report.iface.rx_malformed > 0,
        "{:?}",
        report.iface
    );
}

/// Malformed frames, by kind, that A injects on the wire; `redirected` ones pass the
/// steering program's parse (IPv4, TCP, whole TCP header, our port) and reach our stack.
#[derive(Debug, Default, Clone, Copy)]
struct Injected {
    bad_tcp_checksum: u64,
    bad_ip_checksum: u64,
    malformed: u64,
    not_ours: u64,
    no_connection: u64,
    random: u64,
    /// Frames the steering program passes to B's kernel (too short, not TCP).
    to_kernel: u64,
}

impl Injected {
    fn redirected(&self) -> u64 {
        self.bad_tcp_checksum
            + self.bad_ip_checksum
            + self.malformed
            + self.not_ours
            + self.no_connection
            + self.random
    }
}

/// A splitmix64 step, for the garbage.
fn rand64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A well-formed segment from A to B's `dst_port` with `payload` bytes (checksums right).
fn valid_segment(
    a: &Endpoint,
    b: &Endpoint,
    src_port: u16,
    dst_port: u16,
    payload: usize,
) -> Vec<u8> {
    let mut frame = vec![0u8; 14 + 20 + 20 + payload];
    let eth = EthernetRepr {
        src: EthernetAddress(a.mac),
        dst: EthernetAddress(b.mac),
        ethertype: EtherType::Ipv4,
    };
    let ip = Ipv4Repr {
        src: a.ipv4,
        dst: b.ipv4,
        protocol: IpProtocol::Tcp,
        payload_len: 0,
        ttl: 64,
        dscp_ecn: 0,
    };
    let tcp = TcpRepr {
        src_port,
        dst_port,
        seq: SeqNumber(0x1234_5678),
        ack: Some(SeqNumber(0x0abc_def0)),
        flags: TcpFlags::ACK,
        window: 1000,
        ..TcpRepr::default()
    };
    let len = emit_tcp_frame(&mut frame, &eth, &ip, 7, &tcp, payload).expect("emit");
    frame.truncate(len);
    frame
}

/// Rewrites the IPv4 header checksum of `frame` after an edit.
fn fix_ip_checksum(frame: &mut [u8]) {
    Ipv4Packet::new_unchecked(&mut frame[14..34]).fill_checksum();
}

/// Sends malformed frames of every kind from A's veth end through an [`XdpLink`], `rounds`
/// rounds a few milliseconds apart.
fn inject_garbage(a: &Endpoint, b: &Endpoint, rounds: usize) -> Injected {
    let mut link = XdpLink::open(XdpLinkConfig::new(&a.ifname, 0)).expect("open vA link");
    let mut n = Injected::default();
    let mut rng = 0x6a5b_a6e0_u64;
    let stray_port = 40_000;
    let send = |link: &mut XdpLink, frame: &[u8]| {
        assert!(
            link.send_frame(Instant::ZERO, frame),
            "vA link refused a frame"
        );
    };
    for round in 0..rounds {
        let payload = (rand64(&mut rng) % 200) as usize + 1;
        let base = valid_segment(a, b, stray_port, OUR_PORT, payload);

        // TCP checksum wrong (a payload byte changed after the checksum was computed).
        let mut f = base.clone();
        let last = f.len() - 1;
        f[last] ^= 0x5a;
        send(&mut link, &f);
        n.bad_tcp_checksum += 1;

        // IPv4 header checksum wrong.
        let mut f = base.clone();
        f[24] ^= 0xff;
        send(&mut link, &f);
        n.bad_ip_checksum += 1;

        // IPv4 total length beyond the frame (absurd), and shorter than its header.
        for total in [0xffffu16, 10] {
            let mut f = base.clone();
            f[16..18].copy_from_slice(&total.to_be_bytes());
            fix_ip_checksum(&mut f);
            send(&mut link, &f);
            n.malformed += 1;
        }

        // The TCP header cut short by the IPv4 length (the frame still carries 20 bytes
        // of it, so the steering program sees the port).
        let mut f = base.clone();
        f[16..18].copy_from_slice(&(20u16 + 8).to_be_bytes());
        fix_ip_checksum(&mut f);
        send(&mut link, &f);
        n.malformed += 1;

        // TCP data offset longer than the segment (15 words), and below 5 words.
        for words in [15u8, 2] {
            let mut f = valid_segment(a, b, stray_port, OUR_PORT, 0);
            f[14 + 20 + 12] = (words << 4) | (f[14 + 20 + 12] & 0x0f);
            send(&mut link, &f);
            n.malformed += 1;
        }

        // Another host's MAC; another IPv4 destination.
        let mut f = base.clone();
        f[0..6].copy_from_slice(&[0x02, 0x11, 0x22, 0x33, 0x44, (round % 250) as u8]);
        send(&mut link, &f);
        let mut f = valid_segment(a, b, stray_port, OUR_PORT, payload);
        f[30..34].copy_from_slice(&[10, 77, 0, 99]);
        fix_ip_checksum(&mut f);
        send(&mut link, &f);
        n.not_ours += 2;

        // A perfectly valid segment for no connection (our stack answers with a RST,
        // which A's kernel ignores).
        send(
            &mut link,
            &valid_segment(a, b, stray_port + 1 + (round % 100) as u16, OUR_PORT, 0),
        );
        n.no_connection += 1;

        // Random bytes everywhere except what the steering program looks at.
        let mut f = vec![0u8; 54 + (rand64(&mut rng) % 1400) as usize];
        for chunk in f.chunks_mut(8) {
            let r = rand64(&mut rng).to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[20..22].copy_from_slice(&[0, 0]); // not a fragment
        f[23] = 6;
        f[36..38].copy_from_slice(&OUR_PORT.to_be_bytes());
        send(&mut link, &f);
        n.random += 1;

        // Frames the program passes to B's kernel: an Ethernet header alone, a truncated
        // IPv4 header, a truncated TCP header, random bytes of a random EtherType.
        let mut header_only = base[..14].to_vec();
        send(&mut link, &header_only);
        header_only.extend_from_slice(&base[14..24]);
        send(&mut link, &header_only);
        send(&mut link, &base[..14 + 20 + 10]);
        let mut f = vec![0u8; 14 + (rand64(&mut rng) % 1000) as usize];
        for b in f.iter_mut() {
            *b = rand64(&mut rng) as u8;
        }
        f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        send(&mut link, &f);
        n.to_kernel += 4;

        link.flush(Instant::ZERO);
        std::thread::sleep(Duration::from_millis(3));
    }
    link.flush(Instant::ZERO);
    n
}

/// A transfer each way while A injects malformed frames of every kind: our stack counts
/// each as what it is, and the transfers complete with every byte right.
#[test]
fn garbage_on_the_wire_is_counted_and_survived() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    let a = bed.side(Side::A).clone();
    let b = bed.side(Side::B).clone();
    // Our stack keeps counting until every injected frame had time to arrive.
    let hold = Arc::new(AtomicBool::new(true));
    let release = Arc::clone(&hold);
    let mut injected = None;
    let bed_ref = &bed;
    let report = transfer(
        &bed,
        8 << 20,
        Checksums::PartialTrusted,
        hold,
        |l| l,
        ring_drops,
        || {
            let n = bed_ref
                .run_in(Side::A, move || inject_garbage(&a, &b, 300))
                .expect("inject in A");
            std::thread::sleep(Duration::from_millis(50));
            release.store(false, Ordering::Release);
            injected = Some(n);
        },
    );
    let n = injected.expect("injection report");
    let s = report.iface;
    // A frame the kernel could not put on the rx ring (full under the transfers' bursts)
    // never reached the stack: each kind may fall short by that many, no more.
    let lost = report.ring_drops;
    println!(
        "injected {n:?} ({} redirected); {lost} lost on the rx ring; stack {s:?}",
        n.redirected()
    );
    assert!(n.redirected() > 0);
    assert!(
        lost * 10 < n.redirected(),
        "most injected frames arrive: {lost} lost"
    );
    assert!(
        s.rx_bad_checksum + lost >= n.bad_tcp_checksum + n.bad_ip_checksum,
        "bad checksums: {s:?} vs {n:?}"
    );
    assert!(
        s.rx_malformed + lost >= n.malformed,
        "malformed: {s:?} vs {n:?}"
    );
    assert!(
        s.rx_not_ours + lost >= n.not_ours,
        "not ours: {s:?} vs {n:?}"
    );
    assert!(
        s.rx_no_connection + lost >= n.no_connection,
        "no connection: {s:?} vs {n:?}"
    );
    assert!(s.tx_rst + lost >= n.no_connection, "RSTs: {s:?} vs {n:?}");
    let dropped =
        s.rx_bad_checksum + s.rx_malformed + s.rx_not_ours + s.rx_unsupported + s.rx_no_connection;
    assert!(
        dropped + lost >= n.redirected(),
        "counted drops {dropped} < {n:?}"
    );
}
