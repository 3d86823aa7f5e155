//! Raw AF_XDP frame rate on the test bed: our [`XdpLink`] alone, no TCP, 1514-byte frames.
//! This is the ceiling for everything built on the link.
//!
//! - `xdp_raw/tx_only`: an `XdpLink` on `vA` sends frames of an experimental EtherType to
//!   B's kernel, which drops them (nothing attached on `vB`). Time per batch of frames until
//!   every one has completed (copy mode: the kernel copied it into an skb and handed it to
//!   veth).
//! - `xdp_raw/a_to_b`: the same link sends TCP frames to a port B owns; the `xdp-prog`
//!   steering program on `vB` redirects them to an `XdpLink` on `vB` whose thread counts
//!   them. Time per batch of frames *received*: a batch's time is scaled by sent/received,
//!   so frames lost in the rings (rx ring full on B) lower the rate rather than hide.
//!
//! Only the headers of each frame are written (the 1460 bytes behind them are whatever the
//! UMEM frame held), as the kernel copies the whole frame either way. Both threads and the
//! kernel's softirq work share the machine's cores.
//!
//! Needs root (network namespaces, AF_XDP); without it, it prints a skip line and exits 0.
//! `cargo bench --bench xdp_raw -- --warm-up-time 1 --measurement-time 4`

#[cfg(target_os = "linux")]
mod linux {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant as StdInstant};

    use criterion::{Criterion, Throughput};
    use netchannel::netdriver::link::xdp::{XdpLink, XdpLinkConfig};
    use netchannel::netdriver::link::Link;
    use netchannel::netdriver::time::Instant;
    use netchannel::netdriver::wire::{
        emit_tcp_frame, EtherType, EthernetAddress, EthernetRepr, IpProtocol, Ipv4Repr, TcpFlags,
        TcpRepr,
    };
    use testbed::{Side, TestBed};
    use xdp_prog::{AttachMode, AttachOptions, XdpSteering};

    /// Frames per measured batch.
    const BATCH_FRAMES: u64 = 4096;
    /// Frames per `tx_batch` call.
    const TX_BATCH: usize = 64;
    /// The port B owns.
    const PORT: u16 = 9;
    /// Gives up waiting for frames that will not arrive after this long without progress.
    const STALL: Duration = Duration::from_millis(50);

    /// Sends `n` copies of `header` (written at the front of 1514-byte frames) and waits
    /// until the kernel has completed every tx frame.
    fn send_frames(link: &mut XdpLink, header: &[u8], n: u64) {
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

    /// The receiving side on B: steering attached, a link on queue 0, frames counted.
    struct Receiver {
        received: Arc<AtomicU64>,
        stop: Arc<AtomicBool>,
        thread: testbed::NsJoinHandle<String>,
    }

    fn start_receiver(bed: &TestBed) -> Receiver {
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
                steering.own_port(PORT).expect("own the port");
                let mode = steering.mode();
                ready_tx.send(()).expect("ready");
                while !halt.load(Ordering::Relaxed) {
                    let n = link.recv_batch(Instant::ZERO, 64, &mut |_| {});
                    if n > 0 {
                        count.fetch_add(n as u64, Ordering::Relaxed);
                    } else {
                        // Sleeps in poll(2) when idle: no thread spins after the bench.
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
        Receiver {
            received,
            stop,
            thread,
        }
    }

    /// A 54-byte Ethernet + IPv4 + TCP header of a 1514-byte frame from A to B's `PORT`.
    fn tcp_header(bed: &TestBed) -> Vec<u8> {
        let (a, b) = (bed.side(Side::A), bed.side(Side::B));
        let mut frame = vec![0u8; 1514];
        let payload = 1514 - 54;
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
                dst_port: PORT,
                flags: TcpFlags::PSH,
                window: 1000,
                ..TcpRepr::default()
            },
            payload,
        )
        .expect("header");
        frame.truncate(54);
        frame
    }

    pub fn run() {
        let bed = match TestBed::builder().queues(1).build() {
            Ok(bed) => bed,
            Err(e) => {
                println!("skipping xdp_raw: {e}");
                return;
            }
        };
        let a = bed.side(Side::A).clone();
        let b = bed.side(Side::B).clone();
        let mut link = bed
            .run_in(Side::A, move || {
                XdpLink::open(XdpLinkConfig::new(&a.ifname, 0))
            })
            .expect("namespace A")
            .expect("vA link");
        let frame_len = link.max_frame_len() as u64;
        let mut c = Criterion::default().configure_from_args();

        // Tx only: B's kernel drops the frames (nothing attached on vB yet).
        let mut drop_header = [0u8; 14];
        EthernetRepr {
            src: EthernetAddress(bed.side(Side::A).mac),
            dst: EthernetAddress(b.mac),
            ethertype: EtherType::Unknown(0x88b5),
        }
        .emit(&mut drop_header)
        .expect("header");
        let mut g = c.benchmark_group("xdp_raw");
        g.throughput(Throughput::Elements(BATCH_FRAMES));
        g.bench_function("tx_only", |bench| {
            bench.iter_custom(|iters| {
                let start = StdInstant::now();
                send_frames(&mut link, &drop_header, iters * BATCH_FRAMES);
                start.elapsed()
            })
        });

        // A → B through the steering program into B's link.
        let rx = start_receiver(&bed);
        let header = tcp_header(&bed);
        let (mut sent_total, mut got_total) = (0u64, 0u64);
        g.bench_function("a_to_b", |bench| {
            bench.iter_custom(|iters| {
                let n = iters * BATCH_FRAMES;
                let before = rx.received.load(Ordering::Relaxed);
                let start = StdInstant::now();
                send_frames(&mut link, &header, n);
                // Wait for the last frames; stop when nothing arrived for STALL.
                let mut last = rx.received.load(Ordering::Relaxed);
                let mut last_at = StdInstant::now();
                while last - before < n && last_at.elapsed() < STALL {
                    std::thread::sleep(Duration::from_micros(200));
                    let now = rx.received.load(Ordering::Relaxed);
                    if now != last {
                        last = now;
                        last_at = StdInstant::now();
                    }
                }
                let got = (last - before).max(1);
                sent_total += n;
                got_total += got;
                // Time per BATCH_FRAMES frames received.
                (last_at - start).mul_f64(n as f64 / got as f64)
            })
        });
        g.finish();
        rx.stop.store(true, Ordering::Relaxed);
        let summary = rx.thread.join().expect("receiver");
        println!(
            "xdp_raw: a_to_b received {got_total} of {sent_total} frames sent ({:.2} %) of \
             {frame_len} B; {summary}",
            got_total as f64 * 100.0 / sent_total.max(1) as f64
        );
        println!(
            "xdp_raw: Gbit/s of frames = frames/s x {frame_len} x 8 / 1e9 = frames/s x {:.3e}",
            frame_len as f64 * 8.0 / 1e9
        );
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    linux::run();
    #[cfg(not(target_os = "linux"))]
    println!("skipping xdp_raw: AF_XDP is Linux only");
}
