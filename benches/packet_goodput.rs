//! One connection's goodput over the AF_PACKET link (`PACKET_VNET_HDR`: GSO super-segments
//! out, GRO'd segments in) against kernel TCP at its defaults with nothing attached, on
//! the test bed's veth pair, in the same run:
//!
//! - `kernel -> kernel`: A's kernel client to B's kernel server (the reference);
//! - `kernel -> ours`: A's kernel client to our server on B;
//! - `ours -> kernel`: our client on B to A's kernel server;
//! - `ours -> ours`: our client on A to our server on B;
//! - `ours (AF_XDP) -> kernel`, `ours (AF_XDP, link GSO) -> kernel`: our client on B over
//!   the AF_XDP link (copy mode, the steering program on `vB`) to A's kernel server, the
//!   link's software segmentation (`XdpLinkConfig::segmentation`) off and on.
//!
//! Ours is `netif::Interface` over a `PacketLink` (release build), one thread per end that
//! polls and sleeps in `poll(2)` on the socket (no busy polling), its steering (socket
//! filter, TCX ingress drop) attached for the measurement and removed after it, so that the
//! kernel reference runs with nothing attached. Each transfer is one connection carrying
//! `PACKET_GOODPUT_MIB` MiB (default 256; `PACKET_GOODPUT_RX_BATCH` sets the AF_PACKET
//! link's receive batch): connect, write everything, close, wait for the
//! receiver's FIN, which it sends after reading every byte; the time is the sender's.
//! `PACKET_GOODPUT_ROUNDS` rounds (default 5), the cases interleaved in each; medians and
//! their ratios to `kernel -> kernel` are printed. `PACKET_GOODPUT_LARGE=0` turns our
//! super-segments off (plain MTU-sized segments through the same socket).
//!
//! Without `--bench` (`cargo test --all-targets`) it runs one round of 2 MiB transfers, as
//! a smoke test. Needs root; without it, it prints a skip line and exits 0.
//! `cargo bench --bench packet_goodput`

#[cfg(target_os = "linux")]
#[path = "support/bed.rs"]
mod bed;

#[cfg(target_os = "linux")]
mod linux {
    use std::net::SocketAddrV4;
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant as StdInstant};

    use netchannel::netdriver::link::packet::{PacketLink, PacketLinkConfig};
    use netchannel::netdriver::link::xdp::{XdpLink, XdpLinkConfig};
    use netchannel::netdriver::link::Link;
    use netchannel::netdriver::neigh::{ifindex_of, KernelNeighbors};
    use netchannel::netdriver::netif::{Interface, InterfaceConfig, InterfaceStats};
    use netchannel::netdriver::ports::EphemeralRange;
    use netchannel::netdriver::tcp::{Config, TcpError};
    use netchannel::netdriver::time::Clock;
    use netchannel::netdriver::wire::EthernetAddress;
    use testbed::{Endpoint, Side, TestBed};
    use xdp_prog::{AttachOptions, PacketSteering, XdpSteering};

    use crate::bed::{gbps, kernel_send, median, KernelSink};

    const KERNEL_PORT: u16 = 7300;
    const OUR_PORT: u16 = 7400;
    const MAX_IDLE: Duration = Duration::from_millis(1);
    const TIMEOUT: Duration = Duration::from_secs(60);

    fn env_usize(name: &str, default: usize) -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// An interface for `ep` over `link`, the stack's defaults.
    fn interface<L: Link>(ep: &Endpoint, link: L) -> Interface<L> {
        let ports = EphemeralRange::from_kernel().expect("ephemeral ports");
        Interface::new(
            link,
            InterfaceConfig {
                mac: EthernetAddress(ep.mac),
                ipv4: ep.ipv4,
                ephemeral_ports: ports.ours,
                // Veth: a kernel peer's segments come with partial checksums.
                accept_partial_checksums: true,
                tcp: Config {
                    mss: u16::MAX,
                    ..Config::default()
                },
                ..InterfaceConfig::default()
            },
        )
    }

    /// Our stack over the AF_PACKET link on `ep` (call in its namespace).
    fn open(ep: &Endpoint, large: bool) -> (PacketSteering, Interface<PacketLink>) {
        let steering = PacketSteering::attach(&ep.ifname).expect("attach the steering");
        let mut config = PacketLinkConfig::new(&ep.ifname);
        config.segmentation = large;
        config.rx_batch = env_usize("PACKET_GOODPUT_RX_BATCH", config.rx_batch);
        let link =
            PacketLink::open(config, |fd| steering.attach_socket(fd)).expect("open the link");
        (steering, interface(ep, link))
    }

    fn idle(iface: &Interface<PacketLink>, clock: &Clock) {
        let now = clock.now();
        let wait = iface
            .poll_at()
            .map_or(MAX_IDLE, |t| t.saturating_duration_since(now))
            .min(MAX_IDLE);
        let _ = iface.link().wait_readable(wait);
    }

    /// Our server on `side`: takes one connection, reads `bytes`, closes; returns its
    /// interface's counters. Listening when this returns.
    fn our_sink(
        bed: &TestBed,
        side: Side,
        bytes: usize,
        large: bool,
    ) -> testbed::NsJoinHandle<InterfaceStats> {
        let ep = bed.side(side).clone();
        let (tx, rx) = mpsc::channel();
        let h = bed
            .spawn_thread_in(side, move || {
                let (steering, mut iface) = open(&ep, large);
                let clock = Clock::new();
                steering.own_port(OUR_PORT).expect("own the port");
                iface.listen(OUR_PORT, 1).expect("listen");
                tx.send(()).expect("ready");
                let end = StdInstant::now() + TIMEOUT;
                let mut conn = None;
                let mut got = 0usize;
                let mut buf = vec![0u8; 256 << 10];
                loop {
                    assert!(StdInstant::now() < end, "our sink: {got} of {bytes}");
                    let mut progress = iface.poll(clock.now());
                    conn = conn.or_else(|| iface.accept(OUR_PORT));
                    if let Some(c) = conn.and_then(|h| iface.conn_mut(h)) {
                        loop {
                            match c.recv(&mut buf) {
                                Ok(0) => {
                                    assert_eq!(got, bytes, "our sink: short transfer");
                                    c.close();
                                    // Let the FIN and the last ACKs go.
                                    let linger = StdInstant::now() + Duration::from_millis(20);
                                    while StdInstant::now() < linger {
                                        if !iface.poll(clock.now()) {
                                            idle(&iface, &clock);
                                        }
                                    }
                                    return iface.stats();
                                }
                                Ok(n) => {
                                    got += n;
                                    progress = true;
                                }
                                Err(TcpError::WouldBlock) => break,
                                Err(e) => panic!("our sink: {e}"),
                            }
                        }
                    }
                    if !progress {
                        idle(&iface, &clock);
                    }
                }
            })
            .expect("our sink thread");
        rx.recv_timeout(TIMEOUT).expect("our sink ready");
        h
    }

    /// A link our client can wait on.
    trait Waitable: Link {
        fn wait(&mut self, timeout: Duration);
    }

    impl Waitable for PacketLink {
        fn wait(&mut self, timeout: Duration) {
            let _ = self.wait_readable(timeout);
        }
    }

    impl Waitable for XdpLink {
        fn wait(&mut self, timeout: Duration) {
            let _ = self.wait_readable(timeout);
        }
    }

    /// Which link our client sends over.
    #[derive(Clone, Copy)]
    enum Via {
        /// The AF_PACKET link, super-segments on or off.
        Packet(bool),
        /// The AF_XDP link (copy mode), its software segmentation on or off.
        Xdp(bool),
    }

    /// Our client on `side` sending `bytes` to `target` over `via`; returns the time from
    /// connect to the server's FIN.
    fn our_send(
        bed: &TestBed,
        side: Side,
        target: SocketAddrV4,
        bytes: usize,
        via: Via,
    ) -> Duration {
        let ep = bed.side(side).clone();
        bed.spawn_thread_in(side, move || match via {
            Via::Packet(large) => {
                let (steering, iface) = open(&ep, large);
                client_run(&ep, iface, target, bytes, |port| {
                    steering.own_port(port).expect("own the port")
                })
            }
            Via::Xdp(segmentation) => {
                let steering = XdpSteering::attach(&ep.ifname, AttachOptions::default())
                    .expect("attach the XDP steering");
                let mut config = XdpLinkConfig::new(&ep.ifname, 0);
                config.segmentation = segmentation;
                let link = XdpLink::open(config).expect("open the AF_XDP link");
                steering.register_socket(0, link.fd()).expect("register");
                let iface = interface(&ep, link);
                client_run(&ep, iface, target, bytes, |port| {
                    steering.own_port(port).expect("own the port")
                })
            }
        })
        .expect("our client thread")
        .join()
        .expect("our client")
    }

    fn client_run<L: Waitable>(
        ep: &Endpoint,
        mut iface: Interface<L>,
        target: SocketAddrV4,
        bytes: usize,
        own: impl Fn(u16),
    ) -> Duration {
        let clock = Clock::new();
        let mut neigh = KernelNeighbors::open().expect("neighbours");
        let ifindex = ifindex_of(&ep.ifname).expect("ifindex");
        let mac = neigh
            .resolve(ifindex, *target.ip(), Duration::from_secs(3))
            .expect("resolve the server's MAC");
        iface.add_neighbor(*target.ip(), mac);
        let data = vec![0x5au8; 1 << 20];
        let start = StdInstant::now();
        let h = iface.connect(target, clock.now()).expect("connect");
        own(iface.conn(h).map(|c| c.local().port()).unwrap_or(0));
        let (mut sent, mut closed) = (0usize, false);
        let end = start + TIMEOUT;
        let mut rbuf = [0u8; 64];
        let idle = |iface: &mut Interface<L>, clock: &Clock| {
            let now = clock.now();
            let wait = iface
                .poll_at()
                .map_or(MAX_IDLE, |t| t.saturating_duration_since(now))
                .min(MAX_IDLE);
            iface.link_mut().wait(wait);
        };
        loop {
            assert!(StdInstant::now() < end, "our client: {sent} of {bytes}");
            let mut progress = iface.poll(clock.now());
            let Some(c) = iface.conn_mut(h) else {
                panic!("our client's connection vanished after {sent}");
            };
            while sent < bytes {
                let n = (bytes - sent).min(data.len());
                match c.send(&data[..n]) {
                    Ok(0) | Err(TcpError::WouldBlock) => break,
                    Ok(k) => {
                        sent += k;
                        progress = true;
                    }
                    Err(e) => panic!("our client: {e}"),
                }
            }
            if sent == bytes && !closed {
                c.close();
                closed = true;
            }
            match c.recv(&mut rbuf) {
                Ok(0) if c.send_queue() == 0 => {
                    let took = start.elapsed();
                    let linger = StdInstant::now() + Duration::from_millis(20);
                    while StdInstant::now() < linger {
                        if !iface.poll(clock.now()) {
                            idle(&mut iface, &clock);
                        }
                    }
                    return took;
                }
                Ok(0) | Err(TcpError::WouldBlock) => {}
                Ok(_) => panic!("the server sent data"),
                Err(e) => panic!("our client: {e}"),
            }
            if !progress {
                idle(&mut iface, &clock);
            }
        }
    }

    fn kernel_timed(bed: &TestBed, side: Side, target: SocketAddrV4, bytes: usize) -> Duration {
        let data = Arc::new(vec![0x5au8; bytes]);
        bed.run_in(side, move || {
            let start = StdInstant::now();
            kernel_send(target, &data);
            start.elapsed()
        })
        .expect("enter the namespace")
    }

    pub fn main() {
        let bed = match TestBed::builder().build() {
            Ok(bed) => bed,
            Err(e) => {
                println!("packet_goodput: skipped ({e})");
                return;
            }
        };
        // Without `--bench` (`cargo test --all-targets`): one round of 2 MiB, a smoke test.
        let full = std::env::args().any(|a| a == "--bench");
        let bytes = if full {
            env_usize("PACKET_GOODPUT_MIB", 256) << 20
        } else {
            2 << 20
        };
        let rounds = if full {
            env_usize("PACKET_GOODPUT_ROUNDS", 5)
        } else {
            1
        };
        let large = env_usize("PACKET_GOODPUT_LARGE", 1) != 0;
        let (a, b) = (bed.side(Side::A).ipv4, bed.side(Side::B).ipv4);
        println!(
            "packet_goodput: {} MiB per connection, {rounds} rounds, super-segments {}",
            bytes >> 20,
            if large { "on" } else { "off" }
        );
        let names = [
            "kernel -> kernel",
            "kernel -> ours",
            "ours -> kernel",
            "ours -> ours",
            "ours (AF_XDP) -> kernel",
            "ours (AF_XDP, link GSO) -> kernel",
        ];
        let mut figures: [Vec<f64>; 6] = Default::default();
        for round in 0..rounds {
            // Kernel to kernel, nothing attached.
            let sink = KernelSink::start(&bed, Side::B, KERNEL_PORT, bytes as u64);
            let kk = kernel_timed(&bed, Side::A, SocketAddrV4::new(b, KERNEL_PORT), bytes);
            sink.stop(&bed, Side::A);
            // Kernel to ours.
            let ours = our_sink(&bed, Side::B, bytes, large);
            let ko = kernel_timed(&bed, Side::A, SocketAddrV4::new(b, OUR_PORT), bytes);
            let sink_stats = ours.join().expect("our sink");
            // Ours to kernel.
            let sink = KernelSink::start(&bed, Side::A, KERNEL_PORT, bytes as u64);
            let ok = our_send(
                &bed,
                Side::B,
                SocketAddrV4::new(a, KERNEL_PORT),
                bytes,
                Via::Packet(large),
            );
            sink.stop(&bed, Side::B);
            // Ours to ours.
            let ours = our_sink(&bed, Side::B, bytes, large);
            let oo = our_send(
                &bed,
                Side::A,
                SocketAddrV4::new(b, OUR_PORT),
                bytes,
                Via::Packet(large),
            );
            ours.join().expect("our sink");
            // Ours over AF_XDP to the kernel, the link's segmentation off and on.
            let mut xdp = [Duration::ZERO; 2];
            for (i, seg) in [false, true].into_iter().enumerate() {
                let sink = KernelSink::start(&bed, Side::A, KERNEL_PORT, bytes as u64);
                xdp[i] = our_send(
                    &bed,
                    Side::B,
                    SocketAddrV4::new(a, KERNEL_PORT),
                    bytes,
                    Via::Xdp(seg),
                );
                sink.stop(&bed, Side::B);
            }
            let g: Vec<f64> = [kk, ko, ok, oo, xdp[0], xdp[1]]
                .iter()
                .map(|d| gbps(bytes as u64, *d))
                .collect();
            let line: Vec<String> = names
                .iter()
                .zip(&g)
                .map(|(n, v)| format!("{n} {v:.2}"))
                .collect();
            println!("round {round}: {} Gbit/s", line.join(" | "));
            if round == 0 {
                println!("  our sink's counters (kernel -> ours): {sink_stats:?}");
            }
            for (f, v) in figures.iter_mut().zip(g) {
                f.push(v);
            }
        }
        let medians: Vec<f64> = figures.iter_mut().map(|f| median(f)).collect();
        println!("| case | median Gbit/s | x kernel -> kernel |");
        println!("|---|---|---|");
        for (name, m) in names.iter().zip(&medians) {
            println!("| {name} | {m:.2} | {:.2} |", m / medians[0]);
        }
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    linux::main();
}
