//! Measurements on the two-namespace test bed (`testbed`), shared by the benches
//! (`xdp_raw`, `kernel_tcp_veth`, `channel_goodput`) and the main job (`examples/demo.rs`),
//! which include this file as a module:
//!
//! - raw AF_XDP frame rate of our link: [`send_frames`], [`RawReceiver`], [`a_to_b`];
//! - kernel TCP bulk transfers: [`KernelSink`], [`kernel_send`];
//! - channel bulk transfers: [`ChannelSink`], [`channel_send`].
//!
//! Every transfer is one connection: connect, write everything, close the sending side,
//! wait for the receiver's FIN, which it sends after reading (and counting) every byte.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use netchannel::netdriver::channel::{
    ChannelError, ChannelListener, ChannelSet, ChannelSetConfig, ChannelStats, Dequeued,
};
use netchannel::netdriver::link::xdp::{XdpLink, XdpLinkConfig};
use netchannel::netdriver::link::Link;
use netchannel::netdriver::time::Instant;
use netchannel::netdriver::wire::{
    emit_tcp_frame, EtherType, EthernetAddress, EthernetRepr, IpProtocol, Ipv4Repr, TcpFlags,
    TcpRepr,
};
use testbed::{Side, TestBed};
use xdp_prog::{AttachMode, AttachOptions, XdpSteering};

/// Longest wait for any single step of a transfer.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------
// Raw frame rate

/// Frames per `tx_batch` call of [`send_frames`].
pub const TX_BATCH: usize = 64;
/// The port B owns in the raw measurements.
pub const RAW_PORT: u16 = 9;
/// [`a_to_b`] gives up waiting for frames after this long without progress.
const STALL: Duration = Duration::from_millis(50);

/// Opens our link on A's queue 0 (frames it sends arrive on B's rx queue 0).
pub fn open_tx_link(bed: &TestBed) -> XdpLink {
    open_tx_link_with(bed, |_| {})
}

/// [`open_tx_link`] with `tweak` applied to the link's settings.
pub fn open_tx_link_with(bed: &TestBed, tweak: impl FnOnce(&mut XdpLinkConfig) + Send) -> XdpLink {
    let a = bed.side(Side::A).clone();
    bed.run_in(Side::A, move || {
        let mut config = XdpLinkConfig::new(&a.ifname, 0);
        tweak(&mut config);
        XdpLink::open(config)
    })
    .expect("namespace A")
    .expect("vA link")
}

/// Sends `n` copies of `header` (written at the front of maximum-size frames) and waits
/// until the kernel has completed every tx frame.
pub fn send_frames(link: &mut XdpLink, header: &[u8], n: u64) {
    let len = link.max_frame_len();
    let total = link.tx_frames_total();
    let mut sent = 0u64;
    while sent < n {
        let want = (n - sent).min(TX_BATCH as u64) as usize;
        let mut i = 0;
        sent += link.tx_batch(Instant::ZERO, want, &mut |buf| {
            if i == want {
                return None;
            }
            i += 1;
            buf[..header.len()].copy_from_slice(header);
            Some(0..len)
        }) as u64;
        link.flush(Instant::ZERO);
    }
    let end = StdInstant::now() + Duration::from_secs(5);
    while link.tx_frames_free() < total && StdInstant::now() < end {
        link.flush(Instant::ZERO);
    }
}

/// A 14-byte Ethernet header from A to B with an experimental EtherType, which B's
/// kernel drops (for tx-only rates, with nothing attached on vB).
pub fn drop_header(bed: &TestBed) -> [u8; 14] {
    let mut header = [0u8; 14];
    EthernetRepr {
        src: EthernetAddress(bed.side(Side::A).mac),
        dst: EthernetAddress(bed.side(Side::B).mac),
        ethertype: EtherType::Unknown(0x88b5),
    }
    .emit(&mut header)
    .expect("header");
    header
}

/// The 54-byte Ethernet + IPv4 + TCP header of a 1514-byte frame from A to B's
/// [`RAW_PORT`].
pub fn tcp_header(bed: &TestBed) -> Vec<u8> {
    let (a, b) = (bed.side(Side::A), bed.side(Side::B));
    let mut frame = vec![0u8; 1514];
    emit_tcp_frame(
        &mut frame,
        &EthernetRepr {
            src: EthernetAddress(a.mac),
            dst: EthernetAddress(b.mac),
            ethertype: EtherType::Ipv4,
        },
        &Ipv4Repr {
            src: a.ipv4,
            dst: b.ipv4,
            protocol: IpProtocol::Tcp,
            payload_len: 0,
            ttl: 64,
            dscp_ecn: 0,
        },
        1,
        &TcpRepr {
            src_port: 40_000,
            dst_port: RAW_PORT,
            flags: TcpFlags::PSH,
            window: 1000,
            ..TcpRepr::default()
        },
        1514 - 54,
    )
    .expect("header");
    frame.truncate(54);
    frame
}

/// The receiving side of the raw measurement on B: the steering program attached (it
/// owns [`RAW_PORT`]), a link on queue 0, and a thread counting what arrives.
/// Dropping it stops the thread too (without waiting).
pub struct RawReceiver {
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<testbed::NsJoinHandle<String>>,
}

impl Drop for RawReceiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl RawReceiver {
    /// Attaches the program on vB and starts the counting thread.
    pub fn start(bed: &TestBed) -> RawReceiver {
        let b = bed.side(Side::B).clone();
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let (count, halt) = (Arc::clone(&received), Arc::clone(&stop));
        let thread = bed
            .spawn_thread_in(Side::B, move || {
                let steering = XdpSteering::attach(
                    &b.ifname,
                    AttachOptions {
                        mode: AttachMode::Auto,
                        frags: false,
                        replace_stale: true,
                    },
                )
                .expect("attach the steering program on vB");
                let mut link = XdpLink::open(XdpLinkConfig::new(&b.ifname, 0)).expect("vB link");
                steering.register_socket(0, link.fd()).expect("register");
                steering.own_port(RAW_PORT).expect("own the port");
                let mode = steering.mode();
                ready_tx.send(()).expect("ready");
                while !halt.load(Ordering::Relaxed) {
                    let n = link.recv_batch(Instant::ZERO, 64, &mut |_| {});
                    if n > 0 {
                        count.fetch_add(n as u64, Ordering::Relaxed);
                    } else {
                        // Sleeps in poll(2) when idle: no thread spins after the run.
                        let _ = link.wait_readable(Duration::from_millis(1));
                    }
                }
                format!(
                    "receiver: program in {mode:?} mode, counters {:?}, socket {:?}, link {:?}",
                    steering.counters(),
                    link.kernel_stats(),
                    link.stats()
                )
            })
            .expect("receiver thread in B");
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("receiver ready");
        RawReceiver {
            received,
            stop,
            thread: Some(thread),
        }
    }

    /// Frames received so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Stops the thread (detaching the program); its summary.
    pub fn stop(mut self) -> String {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("joined once");
        thread.join().expect("receiver")
    }
}

/// Sends `n` TCP frames (`header`) from `link` to `rx` and waits for the last to arrive
/// (or for [`STALL`] without progress). Returns the time scaled to `n` frames *received*
/// (`elapsed × sent / received`, so frames lost in the rings lower the rate) and the
/// count received.
pub fn a_to_b(link: &mut XdpLink, rx: &RawReceiver, header: &[u8], n: u64) -> (Duration, u64) {
    let before = rx.received();
    let start = StdInstant::now();
    send_frames(link, header, n);
    let mut last = rx.received();
    let mut last_at = StdInstant::now();
    while last - before < n && last_at.elapsed() < STALL {
        std::thread::sleep(Duration::from_micros(200));
        let now = rx.received();
        if now != last {
            last = now;
            last_at = StdInstant::now();
        }
    }
    let got = (last - before).max(1);
    ((last_at - start).mul_f64(n as f64 / got as f64), got)
}

// ---------------------------------------------------------------------------------------
// Kernel TCP

/// A kernel TCP server in one namespace that reads each connection to its end, counts the
/// bytes and closes; an empty connection stops it.
pub struct KernelSink {
    /// Where it listens.
    pub addr: SocketAddrV4,
    /// Transfers whose byte count was not the expected one.
    pub short: Arc<AtomicU64>,
    thread: testbed::NsJoinHandle<()>,
}

impl KernelSink {
    /// Starts it on `side`'s address, `port`, expecting `expected` bytes per connection.
    pub fn start(bed: &TestBed, side: Side, port: u16, expected: u64) -> KernelSink {
        let ip = bed.side(side).ipv4;
        let (tx, rx) = mpsc::channel();
        let short = Arc::new(AtomicU64::new(0));
        let bad = Arc::clone(&short);
        let thread = bed
            .spawn_thread_in(side, move || {
                let listener = TcpListener::bind((ip, port)).expect("bind the kernel sink");
                tx.send(()).expect("ready");
                let mut buf = vec![0u8; 256 << 10];
                for conn in listener.incoming() {
                    let Ok(mut conn) = conn else { break };
                    let _ = conn.set_read_timeout(Some(STEP_TIMEOUT));
                    let mut got = 0u64;
                    loop {
                        match conn.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => got += n as u64,
                        }
                    }
                    if got == 0 {
                        break;
                    }
                    if got != expected {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
            .expect("kernel sink thread");
        rx.recv_timeout(Duration::from_secs(10))
            .expect("kernel sink ready");
        KernelSink {
            addr: SocketAddrV4::new(ip, port),
            short,
            thread,
        }
    }

    /// Stops it with an empty connection from `from`; panics if a transfer was short.
    pub fn stop(self, bed: &TestBed, from: Side) {
        let addr = SocketAddr::from(self.addr);
        bed.run_in(from, move || drop(TcpStream::connect(addr)))
            .expect("enter the namespace");
        self.thread.join().expect("kernel sink");
        assert_eq!(self.short.load(Ordering::Relaxed), 0, "short transfers");
    }
}

/// One kernel TCP connection to `target` carrying `data` (call it inside the sender's
/// namespace, e.g. through `TestBed::run_in`).
pub fn kernel_send(target: SocketAddrV4, data: &[u8]) {
    let mut s = TcpStream::connect_timeout(&target.into(), STEP_TIMEOUT).expect("connect");
    s.set_read_timeout(Some(STEP_TIMEOUT)).ok();
    s.write_all(data).expect("write");
    s.shutdown(Shutdown::Write).expect("shutdown");
    let mut rest = [0u8; 16];
    assert_eq!(s.read(&mut rest).expect("wait for the receiver's FIN"), 0);
}

// ---------------------------------------------------------------------------------------
// Channels

/// A channel listener's drain: accepts channels one after the other, dequeues each to
/// its end counting bytes, then closes it.
pub struct ChannelSink {
    /// Transfers whose byte count was not the expected one, or that failed.
    pub bad: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl ChannelSink {
    /// Drains the channels `listener` accepts, expecting `expected` bytes on each.
    pub fn start(listener: ChannelListener, expected: u64) -> ChannelSink {
        let bad = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, halt) = (Arc::clone(&bad), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                let ch = match listener.accept_timeout(Duration::from_millis(100)) {
                    Ok((ch, _)) => ch,
                    Err(ChannelError::WouldBlockTimeout) => continue,
                    Err(_) => break,
                };
                let mut got = 0u64;
                let ok = loop {
                    match ch.dequeue_blocking(Some(STEP_TIMEOUT)) {
                        Ok(Dequeued::Chunk(c)) => got += c.len() as u64,
                        Ok(Dequeued::Finished) => break true,
                        Ok(Dequeued::Empty) | Err(_) => break false,
                    }
                };
                if !ok || got != expected {
                    b.fetch_add(1, Ordering::Relaxed);
                    ch.abort();
                } else {
                    // The FIN follows; dropping a closed channel lets it go out.
                    ch.close();
                }
            }
        });
        ChannelSink { bad, stop, thread }
    }

    /// Stops the drain; panics if a transfer was bad.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("channel sink");
        assert_eq!(self.bad.load(Ordering::Relaxed), 0, "bad channel transfers");
    }
}

/// One channel from `set` to `target` carrying `total` bytes, enqueued as 64 KiB slices
/// of `block` (no copy), then closed; returns once the receiver's FIN arrived, with the
/// channel's last statistics (retransmissions).
pub fn channel_send(
    set: &ChannelSet,
    target: SocketAddrV4,
    block: &Bytes,
    total: u64,
) -> ChannelStats {
    let ch = set.connect(target).expect("channel connect");
    let step = block.len().min(64 << 10);
    let mut sent = 0u64;
    while sent < total {
        let n = (total - sent).min(step as u64) as usize;
        ch.enqueue_blocking(block.slice(..n), Some(STEP_TIMEOUT))
            .unwrap_or_else(|e| panic!("enqueue at byte {sent}: {e}"));
        sent += n as u64;
    }
    ch.close();
    match ch.dequeue_blocking(Some(STEP_TIMEOUT)) {
        Ok(Dequeued::Finished) => ch.stats(),
        Ok(Dequeued::Chunk(_)) => panic!("the sink sent data"),
        Ok(Dequeued::Empty) => panic!("no FIN from {target} within {STEP_TIMEOUT:?}"),
        Err(e) => panic!("channel to {target}: {e}"),
    }
}

// ---------------------------------------------------------------------------------------
// Figures

/// Gbit/s of `bytes` moved in `d`.
pub fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 * 8.0 / d.as_secs_f64().max(1e-12) / 1e9
}

/// The median of `xs` (sorted in place); 0 when empty.
pub fn median(xs: &mut [f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let m = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[m]
    } else {
        (xs[m - 1] + xs[m]) / 2.0
    }
}

// ---------------------------------------------------------------------------------------
// The side-by-side run

/// What one iteration of a measurement moves.
#[derive(Debug, Clone, Copy)]
pub enum Unit {
    /// This many frames of `frame_len` bytes.
    Frames {
        /// Frames per iteration.
        count: u64,
        /// Bytes per frame (on the wire, without FCS).
        frame_len: u64,
    },
    /// This many payload bytes (one connection).
    Bytes(u64),
}

/// Frames per iteration of the raw measurements.
pub const RAW_BATCH: u64 = 4096;
/// Ports of the side-by-side run.
const KERNEL_B_PORT: u16 = 7300;
const KERNEL_A_PORT: u16 = 7500;
const CHANNEL_PORT: u16 = 9000;

/// One measurement's totals.
#[derive(Debug, Clone)]
pub struct Figure {
    /// Short name (the criterion benchmark id).
    pub name: &'static str,
    /// What it measures.
    pub what: &'static str,
    /// Frames moved (raw measurements), 0 for transfers.
    pub frames: u64,
    /// Bytes moved: payload for transfers, whole frames for raw measurements.
    pub bytes: u64,
    /// Time they took.
    pub time: Duration,
}

impl Figure {
    /// Gbit/s of payload (transfers) or of frames (raw).
    pub fn gbps(&self) -> f64 {
        gbps(self.bytes, self.time)
    }
}

/// Every measurement of a run, in order.
#[derive(Debug, Default)]
pub struct Figures {
    /// The measurements.
    pub list: Vec<Figure>,
}

impl Figures {
    fn add(&mut self, name: &'static str, what: &'static str, unit: Unit, iters: u64, d: Duration) {
        let (frames, bytes) = match unit {
            Unit::Frames { count, frame_len } => (count * iters, count * iters * frame_len),
            Unit::Bytes(b) => (0, b * iters),
        };
        match self.list.iter_mut().find(|f| f.name == name) {
            Some(f) => {
                f.frames += frames;
                f.bytes += bytes;
                f.time += d;
            }
            None => self.list.push(Figure {
                name,
                what,
                frames,
                bytes,
                time: d,
            }),
        }
    }

    /// The figure called `name`.
    pub fn get(&self, name: &str) -> Option<&Figure> {
        self.list.iter().find(|f| f.name == name)
    }

    /// Prints every figure and the ratios that matter.
    pub fn print(&self) {
        println!();
        println!("{:<26} {:>12}  what", "measurement", "Gbit/s");
        for f in &self.list {
            let extra = if f.frames > 0 {
                format!(
                    " [{:.0} k frames/s of {} B]",
                    f.frames as f64 / f.time.as_secs_f64().max(1e-12) / 1e3,
                    f.bytes / f.frames.max(1)
                )
            } else {
                String::new()
            };
            println!("{:<26} {:>12.3}  {}{extra}", f.name, f.gbps(), f.what);
        }
        println!();
        let ratio = |a: &str, b: &str, note: &str| {
            if let (Some(x), Some(y)) = (self.get(a), self.get(b)) {
                println!(
                    "{:<58} {:>6.2}{note}",
                    format!("{a} / {b}"),
                    x.gbps() / y.gbps().max(1e-12)
                );
            }
        };
        println!("ratios (same run):");
        ratio(
            "ours_to_ours",
            "kernel_offloads_on",
            "   (ours / kernel at veth's defaults: the main reference)",
        );
        ratio(
            "ours_to_ours",
            "raw_a_to_b",
            "   (issue target >= 0.70; 1460/1514 = 0.96 at most)",
        );
        ratio("kernel_to_ours", "raw_a_to_b", "");
        ratio("ours_to_kernel", "raw_a_to_b", "");
        ratio(
            "ours_to_ours",
            "kernel_xdp_on_receiver",
            "   (ours / kernel, same conditions)",
        );
        ratio("kernel_to_ours", "kernel_xdp_on_receiver", "");
        ratio("ours_to_kernel", "kernel_xdp_on_receiver", "");
        ratio(
            "ours_to_ours",
            "kernel_nothing_attached",
            "   (ours / kernel without XDP, tx csum and TSO off)",
        );
        ratio(
            "kernel_xdp_on_receiver",
            "kernel_nothing_attached",
            "   (what attaching XDP costs the kernel)",
        );
    }
}

/// How a caller measures: given a name, a description, the unit of one iteration and a
/// function that runs `iters` iterations and returns their time, it calls that function
/// as often as it likes (criterion's `iter_custom`, or a fixed number of rounds).
pub type Measure<'m> =
    dyn FnMut(&'static str, &'static str, Unit, &mut dyn FnMut(u64) -> Duration) + 'm;

/// Runs every measurement side by side on `bed` (two queues expected) and returns the
/// totals:
///
/// 1. raw frame rate of our link: `raw_tx_only` (A's kernel-bound frames, dropped by B's
///    kernel) and `raw_a_to_b` (TCP frames through the steering program into a link on
///    B's queue 0, the ceiling);
/// 2. kernel TCP A → B with nothing attached, at veth's defaults (`kernel_offloads_on`:
///    TSO, checksum offload; the main reference) and with tx checksumming off
///    (`kernel_nothing_attached`); everything after runs at veth's defaults again;
/// 3. with a channel set on B (its steering program attached to vB):
///    `kernel_xdp_on_receiver` (kernel to kernel, the program passes the flow),
///    `kernel_to_ours` (A's kernel to B's channel listener), `ours_to_kernel` (a channel
///    from B to A's kernel);
/// 4. with a channel set on A as well: `ours_to_ours` (one channel A → B).
///
/// Each transfer is one connection of `bytes` bytes.
pub fn measure_all(bed: &TestBed, bytes: u64, measure: &mut Measure<'_>) -> Figures {
    let mut figures = Figures::default();
    let mut run = |name: &'static str,
                   what: &'static str,
                   unit: Unit,
                   f: &mut dyn FnMut(u64) -> Duration,
                   figures: &mut Figures| {
        let mut counted = |iters: u64| {
            let d = f(iters);
            figures.add(name, what, unit, iters, d);
            d
        };
        measure(name, what, unit, &mut counted);
    };
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());

    // 1. Raw frame rate.
    {
        let mut link = open_tx_link(bed);
        let unit = Unit::Frames {
            count: RAW_BATCH,
            frame_len: link.max_frame_len() as u64,
        };
        let header = drop_header(bed);
        run(
            "raw_tx_only",
            "our AF_XDP link on vA sending 1514 B frames (B's kernel drops them)",
            unit,
            &mut |iters| {
                let start = StdInstant::now();
                send_frames(&mut link, &header, iters * RAW_BATCH);
                start.elapsed()
            },
            &mut figures,
        );
        let rx = RawReceiver::start(bed);
        let header = tcp_header(bed);
        run(
            "raw_a_to_b",
            "frames received: vA link -> veth -> steering program -> vB link (ceiling)",
            unit,
            &mut |iters| a_to_b(&mut link, &rx, &header, iters * RAW_BATCH).0,
            &mut figures,
        );
        let summary = rx.stop();
        tracing::info!(%summary, "raw receiver");
    }

    // 2. Kernel TCP, nothing attached.
    let data = vec![0x5au8; bytes as usize];
    let kernel_b = KernelSink::start(bed, Side::B, KERNEL_B_PORT, bytes);
    let ethtool_tx = |on: &str| {
        for side in Side::BOTH {
            let ifname = bed.side(side).ifname.clone();
            bed.output_in(side, "ethtool", &["-K", &ifname, "tx", on])
                .expect("ethtool -K tx");
        }
    };
    let mut kernel_transfer = |iters: u64| {
        let start = StdInstant::now();
        for _ in 0..iters {
            bed.run_in(Side::A, || kernel_send(kernel_b.addr, &data))
                .expect("namespace A");
        }
        start.elapsed()
    };
    ethtool_tx("on");
    run(
        "kernel_offloads_on",
        "kernel TCP A -> B, plain veth, TSO and checksum offload on (veth's defaults)",
        Unit::Bytes(bytes),
        &mut kernel_transfer,
        &mut figures,
    );
    ethtool_tx("off");
    run(
        "kernel_nothing_attached",
        "kernel TCP A -> B, plain veth, tx checksumming (and so TSO) off",
        Unit::Bytes(bytes),
        &mut kernel_transfer,
        &mut figures,
    );
    // Back to veth's defaults for everything else: kernel peers as users run them.
    ethtool_tx("on");

    // 3. Our channel set on B.
    let config_b = ChannelSetConfig::new(b.ifname.clone(), b.ipv4);
    let set_b = bed
        .run_in(Side::B, move || ChannelSet::start(config_b))
        .expect("namespace B")
        .expect("channel set on vB");
    let sink_b = ChannelSink::start(set_b.listen(CHANNEL_PORT).expect("listen"), bytes);
    run(
        "kernel_xdp_on_receiver",
        "kernel TCP A -> B, our steering program on vB passing it, offloads at defaults",
        Unit::Bytes(bytes),
        &mut kernel_transfer,
        &mut figures,
    );
    let ours_b = SocketAddrV4::new(b.ipv4, CHANNEL_PORT);
    run(
        "kernel_to_ours",
        "kernel TCP client in A -> one channel of ours on vB",
        Unit::Bytes(bytes),
        &mut |iters| {
            let start = StdInstant::now();
            for _ in 0..iters {
                bed.run_in(Side::A, || kernel_send(ours_b, &data))
                    .expect("namespace A");
            }
            start.elapsed()
        },
        &mut figures,
    );
    drop(data);
    let block = Bytes::from(vec![0x5au8; 64 << 10]);
    let kernel_a = KernelSink::start(bed, Side::A, KERNEL_A_PORT, bytes);
    run(
        "ours_to_kernel",
        "one channel of ours on vB -> kernel TCP server in A",
        Unit::Bytes(bytes),
        &mut |iters| {
            let start = StdInstant::now();
            for _ in 0..iters {
                channel_send(&set_b, kernel_a.addr, &block, bytes);
            }
            start.elapsed()
        },
        &mut figures,
    );

    // 4. Ours on both sides.
    let config_a = ChannelSetConfig::new(a.ifname.clone(), a.ipv4);
    let set_a = bed
        .run_in(Side::A, move || ChannelSet::start(config_a))
        .expect("namespace A")
        .expect("channel set on vA");
    run(
        "ours_to_ours",
        "one channel of ours on vA -> one channel of ours on vB",
        Unit::Bytes(bytes),
        &mut |iters| {
            let start = StdInstant::now();
            for _ in 0..iters {
                channel_send(&set_a, ours_b, &block, bytes);
            }
            start.elapsed()
        },
        &mut figures,
    );
    set_a.shutdown().expect("stop the channel set on vA");
    kernel_a.stop(bed, Side::A);
    sink_b.stop();
    set_b.shutdown().expect("stop the channel set on vB");
    kernel_b.stop(bed, Side::B);
    figures
}
