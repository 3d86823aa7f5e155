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
//! Needs root (network namespaces, XDP); without it, it prints a skip line and exits 0.
//! `cargo bench --bench kernel_tcp_veth -- --warm-up-time 1 --measurement-time 4`

#[cfg(target_os = "linux")]
mod linux {
    use std::io::{Read, Write};
    use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::time::Duration;

    use criterion::{Criterion, Throughput};
    use testbed::{Side, TestBed};
    use xdp_prog::{AttachMode, AttachOptions, XdpSteering};

    const BYTES: usize = 64 << 20;
    const PORT: u16 = 7300;

    /// B's server: for each connection, reads to the end, checks the count and closes; an
    /// empty connection stops it.
    fn start_server(bed: &TestBed) -> (SocketAddr, testbed::NsJoinHandle<()>) {
        let b = bed.side(Side::B).clone();
        let (tx, rx) = mpsc::channel();
        let server = bed
            .spawn_thread_in(Side::B, move || {
                let listener = TcpListener::bind((b.ipv4, PORT)).expect("bind in B");
                tx.send(listener.local_addr().expect("addr"))
                    .expect("ready");
                let mut buf = vec![0u8; 256 << 10];
                for conn in listener.incoming() {
                    let Ok(mut conn) = conn else { break };
                    let mut got = 0;
                    loop {
                        match conn.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => got += n,
                        }
                    }
                    if got == 0 {
                        break;
                    }
                    assert_eq!(got, BYTES, "B's server got a short stream");
                }
            })
            .expect("server thread in B");
        let addr = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("server ready");
        (addr, server)
    }

    /// One 64 MiB connection from A.
    fn one_transfer(target: SocketAddr, data: &[u8]) {
        let mut s = TcpStream::connect(target).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).ok();
        s.write_all(data).expect("write");
        s.shutdown(Shutdown::Write).expect("shutdown");
        let mut rest = [0u8; 16];
        assert_eq!(s.read(&mut rest).expect("wait for B's FIN"), 0);
    }

    pub fn run() {
        let bed = match TestBed::builder().queues(1).build() {
            Ok(bed) => bed,
            Err(e) => {
                println!("skipping kernel_tcp_veth: {e}");
                return;
            }
        };
        let (target, server) = start_server(&bed);
        let data: Vec<u8> = (0..BYTES).map(|i| (i * 7 + (i >> 12)) as u8).collect();
        let mut c = Criterion::default().configure_from_args();
        let mut g = c.benchmark_group("kernel_tcp_veth_64MiB");
        g.throughput(Throughput::Bytes(BYTES as u64));
        g.sample_size(10);
        let client = |bed: &TestBed, data: &[u8]| {
            // A thread in A for each transfer; the data is shared by reference.
            bed.run_in(Side::A, || one_transfer(target, data))
                .expect("namespace A")
        };
        g.bench_function("nothing_attached", |bench| {
            bench.iter(|| client(&bed, &data))
        });

        // The steering program on vB, owning nothing: everything passes to B's kernel.
        let b = bed.side(Side::B).clone();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let holder = bed
            .spawn_thread_in(Side::B, move || {
                let steering = XdpSteering::attach(
                    &b.ifname,
                    AttachOptions {
                        mode: AttachMode::Auto,
                        frags: false,
                        replace_stale: true,
                    },
                )
                .expect("attach on vB");
                ready_tx.send(steering.mode()).expect("ready");
                let _ = stop_rx.recv();
                let counters = steering.counters();
                drop(steering);
                counters
            })
            .expect("thread in B");
        let mode = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("program attached");
        g.bench_function("xdp_on_receiver", |bench| {
            bench.iter(|| client(&bed, &data))
        });
        g.finish();
        drop(stop_tx);
        let counters = holder.join().expect("holder");
        println!("kernel_tcp_veth: program in {mode:?} mode on vB: {counters:?}");
        // An empty connection stops B's server.
        bed.run_in(Side::A, || drop(TcpStream::connect(target)))
            .expect("namespace A");
        server.join().expect("server");
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    linux::run();
    #[cfg(not(target_os = "linux"))]
    println!("skipping kernel_tcp_veth: the test bed is Linux only");
}
