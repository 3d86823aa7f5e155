//! Kernel TCP goodput over the test bed's veth pair (`std::net`, 64 MiB per connection),
//! the yardstick our stack is compared with on the same wire:
//!
//! - `kernel_tcp_veth_64MiB/nothing_attached`: plain veth, offloads at their defaults
//!   (TSO/GSO and GRO, checksum offload);
//! - `kernel_tcp_veth_64MiB/xdp_on_receiver`: the same with the `xdp-prog` steering program
//!   attached on the receiving end (`vB`), passing everything (no port is owned). On veth a
//!   native XDP program moves the receiving side onto the per-frame XDP path, which is what
//!   an interface carrying both the stack and the kernel's traffic pays.
//!
//! A connects to B, writes 64 MiB, shuts down its write side and waits for B's FIN, which
//! B sends after reading every byte; one iteration is one connection.
//!
//! Then, in the same run, our stack (`netif::Interface` over an `XdpLink` on `vB`, one
//! thread, release build) against A's kernel, with A's tx checksum offload (and so TSO)
//! switched off, since our stack drops the unfinished checksums veth would hand it:
//!
//! - `kernel_tcp_veth_64MiB/xdp_on_receiver_tx_off`: kernel to kernel again under those
//!   conditions, the like-for-like reference;
//! - `kernel_tcp_veth_64MiB/netchannel_rx`: A's kernel client sends 64 MiB to our server;
//! - `kernel_tcp_veth_64MiB/netchannel_tx`: our client sends 64 MiB to A's kernel server.
//!
//! Needs root (network namespaces, XDP); without it, it prints a skip line and exits 0.
//! `cargo bench --bench kernel_tcp_veth -- --warm-up-time 1 --measurement-time 4`

#[cfg(target_os = "linux")]
#[path = "support/bed.rs"]
mod bed;

#[cfg(target_os = "linux")]
mod linux {
    use std::net::SocketAddrV4;
    use std::sync::mpsc;
    use std::time::{Duration, Instant as StdInstant};

    use criterion::{Criterion, Throughput};
    use netchannel::netdriver::link::xdp::{XdpLink, XdpLinkConfig};
    use netchannel::netdriver::link::Link;
    use netchannel::netdriver::neigh::{ifindex_of, KernelNeighbors};
    use netchannel::netdriver::netif::{ConnHandle, Interface, InterfaceConfig};
    use netchannel::netdriver::ports::EphemeralRange;
    use netchannel::netdriver::tcp::TcpError;
    use netchannel::netdriver::time::Clock;
    use netchannel::netdriver::wire::EthernetAddress;
    use testbed::{Endpoint, Side, TestBed};

    use crate::bed::{kernel_send, KernelSink};
    use xdp_prog::{AttachMode, AttachOptions, XdpSteering};

    const BYTES: usize = 64 << 20;
    /// B's kernel server.
    const PORT: u16 = 7300;
    /// Our server on B.
    const OUR_PORT: u16 = 7400;
    /// A's kernel server for our client.
    const A_PORT: u16 = 7500;
    /// Longest sleep of our driver loop when idle.
    const MAX_IDLE: Duration = Duration::from_millis(1);

    /// Work for our stack's thread.
    enum Command {
        /// Connect to A's server, send `BYTES`, close, wait for its FIN; then answer.
        Send(mpsc::Sender<Result<(), String>>),
        /// Stop the thread.
        Stop,
    }

    /// Our client's transfer in progress.
    struct Job {
        h: ConnHandle,
        /// Bytes handed to `send` so far.
        queued: usize,
        closed: bool,
        /// Where to say how it ended.
        reply: mpsc::Sender<Result<(), String>>,
    }

    /// Our stack on B: the steering program (which also serves the `xdp_on_receiver`
    /// measurements, passing the kernel's flows), one link, a server that discards what it
    /// receives, and a client run on command. Returns a summary when stopped.
    fn our_stack(
        b: Endpoint,
        a_server: SocketAddrV4,
        ready: mpsc::Sender<String>,
        commands: mpsc::Receiver<Command>,
    ) -> String {
        let steering = XdpSteering::attach(
            &b.ifname,
            AttachOptions {
                mode: AttachMode::Auto,
                frags: false,
                replace_stale: true,
            },
        )
        .expect("attach on vB");
        let link = XdpLink::open(XdpLinkConfig::new(&b.ifname, 0)).expect("vB link");
        steering.register_socket(0, link.fd()).expect("register");
        steering.own_port(OUR_PORT).expect("own our port");
        let mut iface = Interface::new(
            link,
            InterfaceConfig {
                mac: EthernetAddress(b.mac),
                ipv4: b.ipv4,
                ephemeral_ports: EphemeralRange::from_kernel().expect("ports").ours,
                ..InterfaceConfig::default()
            },
        );
        iface.listen(OUR_PORT, 8).expect("listen");
        let clock = Clock::new();
        ready.send(format!("{:?}", steering.mode())).expect("ready");

        let data = vec![0x5au8; 64 << 10];
        let mut sink = vec![0u8; 64 << 10];
        let mut servers: Vec<ConnHandle> = Vec::new();
        let mut job: Option<Job> = None;
        let mut neighbors_known = false;
        loop {
            let now = clock.now();
            let mut progress = iface.poll(now);
            while let Some(h) = iface.accept(OUR_PORT) {
                servers.push(h);
            }
            servers.retain(|&h| {
                let Some(conn) = iface.conn_mut(h) else {
                    return false;
                };
                loop {
                    match conn.recv(&mut sink) {
                        Ok(0) => {
                            if conn.may_send() {
                                conn.close();
                            }
                            break;
                        }
                        Ok(_) => progress = true,
                        Err(_) => break,
                    }
                }
                true
            });
            if job.is_none() {
                match commands.try_recv() {
                    Ok(Command::Send(reply)) => {
                        if !neighbors_known {
                            let mut neigh = KernelNeighbors::open().expect("netlink");
                            let mac = neigh
                                .resolve(
                                    ifindex_of(&b.ifname).expect("ifindex"),
                                    *a_server.ip(),
                                    Duration::from_secs(3),
                                )
                                .expect("A's MAC");
                            iface.add_neighbor(*a_server.ip(), mac);
                            neighbors_known = true;
                        }
                        match iface.connect(a_server, clock.now()) {
                            Ok(h) => {
                                let port = iface.conn(h).map_or(0, |c| c.local().port());
                                steering.own_port(port).expect("own the client port");
                                job = Some(Job {
                                    h,
                                    queued: 0,
                                    closed: false,
                                    reply,
                                });
                            }
                            Err(e) => {
                                let _ = reply.send(Err(e.to_string()));
                            }
                        }
                        progress = true;
                    }
                    Ok(Command::Stop) | Err(mpsc::TryRecvError::Disconnected) => break,
                    Err(mpsc::TryRecvError::Empty) => {}
                }
            }
            if let Some(Job {
                h,
                queued,
                closed,
                reply,
            }) = &mut job
            {
                let outcome = match iface.conn_mut(*h) {
                    None => Some(Err("our client's connection vanished".to_string())),
                    Some(conn) => {
                        while *queued < BYTES {
                            let n = (BYTES - *queued).min(data.len());
                            match conn.send(&data[..n]) {
                                Ok(n) => {
                                    *queued += n;
                                    progress = true;
                                }
                                Err(_) => break,
                            }
                        }
                        if *queued == BYTES && !*closed {
                            conn.close();
                            *closed = true;
                        }
                        match conn.recv(&mut sink) {
                            Ok(0) if conn.send_queue() == 0 => Some(Ok(())),
                            Ok(0) | Err(TcpError::WouldBlock) => None,
                            Ok(_) => Some(Err("A's server sent data".to_string())),
                            Err(e) => Some(Err(e.to_string())),
                        }
                    }
                };
                if let Some(outcome) = outcome {
                    let _ = reply.send(outcome);
                    job = None;
                    progress = true;
                }
            }
            if !progress {
                let now = clock.now();
                let wait = iface
                    .poll_at()
                    .map_or(MAX_IDLE, |t| t.saturating_duration_since(now))
                    .min(MAX_IDLE);
                let _ = iface.link_mut().wait_readable(wait);
            }
        }
        format!(
            "our stack: {:?}; link {:?}; program {:?}",
            iface.stats(),
            iface.link().stats(),
            steering.counters()
        )
    }

    pub fn run() {
        let bed = match TestBed::builder().queues(1).build() {
            Ok(bed) => bed,
            Err(e) => {
                println!("skipping kernel_tcp_veth: {e}");
                return;
            }
        };
        let server = KernelSink::start(&bed, Side::B, PORT, BYTES as u64);
        let target = server.addr;
        let data: Vec<u8> = (0..BYTES).map(|i| (i * 7 + (i >> 12)) as u8).collect();
        let mut c = Criterion::default().configure_from_args();
        let mut g = c.benchmark_group("kernel_tcp_veth_64MiB");
        g.throughput(Throughput::Bytes(BYTES as u64));
        g.sample_size(10);
        let client = |bed: &TestBed, data: &[u8]| {
            // A thread in A for each transfer; the data is shared by reference.
            bed.run_in(Side::A, || kernel_send(target, data))
                .expect("namespace A")
        };
        g.bench_function("nothing_attached", |bench| {
            bench.iter(|| client(&bed, &data))
        });

        // The steering program on vB, with our stack owning only its own ports: the
        // kernel's flows pass to B's kernel.
        let a = bed.side(Side::A).clone();
        let b = bed.side(Side::B).clone();
        let a_sink = KernelSink::start(&bed, Side::A, A_PORT, BYTES as u64);
        let (ready_tx, ready_rx) = mpsc::channel();
        let (cmd_tx, cmd_rx) = mpsc::channel();
        let a_server = SocketAddrV4::new(a.ipv4, A_PORT);
        let ours = bed
            .spawn_thread_in(Side::B, move || our_stack(b, a_server, ready_tx, cmd_rx))
            .expect("our stack's thread in B");
        let mode = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("program attached");
        g.bench_function("xdp_on_receiver", |bench| {
            bench.iter(|| client(&bed, &data))
        });

        // Our stack needs finished checksums from A's kernel.
        bed.output_in(Side::A, "ethtool", &["-K", &a.ifname, "tx", "off"])
            .expect("ethtool -K vA tx off");
        g.bench_function("xdp_on_receiver_tx_off", |bench| {
            bench.iter(|| client(&bed, &data))
        });
        let our_server = SocketAddrV4::new(bed.side(Side::B).ipv4, OUR_PORT);
        g.bench_function("netchannel_rx", |bench| {
            bench.iter(|| {
                bed.run_in(Side::A, || kernel_send(our_server, &data))
                    .expect("namespace A")
            })
        });
        g.bench_function("netchannel_tx", |bench| {
            bench.iter(|| {
                let (tx, rx) = mpsc::channel();
                cmd_tx
                    .send(Command::Send(tx))
                    .expect("our stack is running");
                let started = StdInstant::now();
                rx.recv_timeout(Duration::from_secs(60))
                    .unwrap_or_else(|e| panic!("our client: {e} after {:?}", started.elapsed()))
                    .unwrap_or_else(|e| panic!("our client: {e}"));
            })
        });
        g.finish();
        let _ = cmd_tx.send(Command::Stop);
        let summary = ours.join().expect("our stack");
        println!("kernel_tcp_veth: program in {mode} mode on vB; {summary}");
        // Empty connections stop the servers.
        server.stop(&bed, Side::A);
        a_sink.stop(&bed, Side::A);
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    linux::run();
    #[cfg(not(target_os = "linux"))]
    println!("skipping kernel_tcp_veth: the test bed is Linux only");
}
