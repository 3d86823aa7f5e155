//! Privileged tests of the AF_XDP link on a veth pair between two network namespaces the
//! test bed creates (and always deletes), against the peer's kernel stack.
//!
//! They need root. Without it each test prints why it skips, unless
//! `NETCHANNEL_REQUIRE_XDP=1`, which turns the skip into a failure (CI).
#![cfg(target_os = "linux")]

use std::io;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant as StdInstant};

use netdriver::link::xdp::{
    BindMode, MultiBuffer, XdpBinding, XdpLink, XdpLinkConfig, XdpLinkError, ZeroCopyRefusal,
};
use netdriver::link::xdp_features::xdp_features;
use netdriver::link::{Link, TX_HEADROOM};
use netdriver::tcp::rst_for_unexpected;
use netdriver::time::Instant;
use netdriver::wire::{
    emit_tcp_frame, parse_tcp_frame, ArpOperation, ArpRepr, EtherType, EthernetAddress,
    EthernetRepr, IpProtocol, Ipv4Packet, Ipv4Repr, TcpFlags, TcpRepr,
};
use testbed::{testbed_or_skip, Side, TestBed};
use xdp_prog::{AttachMode, AttachOptions, XdpSteering};

const DEADLINE: Duration = Duration::from_secs(10);
const PORT: u16 = 7000;

/// Polls `cond` until it holds or [`DEADLINE`] passes; returns whether it held.
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let end = StdInstant::now() + DEADLINE;
    loop {
        if cond() {
            return true;
        }
        if StdInstant::now() >= end {
            return false;
        }
        std::thread::yield_now();
    }
}

fn steer(ifname: &str) -> XdpSteering {
    steer_with(ifname, false)
}

fn steer_with(ifname: &str, frags: bool) -> XdpSteering {
    XdpSteering::attach(
        ifname,
        AttachOptions {
            mode: AttachMode::Auto,
            frags,
            replace_stale: true,
        },
    )
    .expect("attach the steering program")
}

fn mac_text(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Sends an ARP request from A through the link, then answers a kernel client's SYN from
/// B, received through the link, with a RST sent through the link.
#[test]
fn round_trips_with_the_peer_kernel() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    let a = bed.side(Side::A).clone();
    let b = bed.side(Side::B).clone();
    let bed = &bed;
    bed.run_in(Side::A, move || {
        let steering = steer(&a.ifname);
        let mut link = XdpLink::open(XdpLinkConfig::new(&a.ifname, 0)).expect("open the link");
        assert_eq!(link.mtu(), 1500);
        steering.register_socket(0, link.fd()).unwrap();
        steering.own_port(PORT).unwrap();
        let free_at_start = link.tx_frames_free();

        // Tx: "who has B? tell A" from A's MAC and address; B's kernel learns A's MAC.
        let neigh = || {
            bed.output_in(Side::B, "ip", &["neigh", "show", &a.ipv4.to_string()])
                .unwrap()
        };
        let a_mac = mac_text(a.mac);
        assert!(!neigh().contains(&a_mac), "B knows A before any frame");
        let mut frame = [0u8; 42];
        EthernetRepr {
            src: EthernetAddress(a.mac),
            dst: EthernetAddress([0xff; 6]),
            ethertype: EtherType::Arp,
        }
        .emit(&mut frame)
        .unwrap();
        ArpRepr {
            operation: ArpOperation::Request,
            source_hw: EthernetAddress(a.mac),
            source_ip: a.ipv4,
            target_hw: EthernetAddress([0; 6]),
            target_ip: b.ipv4,
        }
        .emit(&mut frame[14..])
        .unwrap();
        assert!(link.send_frame(Instant::ZERO, &frame));
        link.flush(Instant::ZERO);
        assert!(
            eventually(|| neigh().contains(&a_mac)),
            "B's kernel never learned A's MAC {a_mac} from the ARP request: {}",
            neigh()
        );
        assert_eq!(link.stats().tx_frames, 1);

        // Nothing owned has been sent to A yet: the ARP reply went to A's kernel.
        assert!(!link.wait_readable(Duration::from_millis(20)).unwrap());
        assert_eq!(link.stats().rx_frames, 0);

        // Rx: B's kernel connects to A:7000; the SYN is steered to the link. With tx
        // checksum offload on (the veth default) B's kernel leaves the TCP checksum
        // unfinished (CHECKSUM_PARTIAL) and the frame reaches XDP that way; switched off,
        // the SYN arrives with a checksum that verifies.
        bed.output_in(Side::B, "ethtool", &["-K", &b.ifname, "tx", "off"])
            .unwrap();
        let target = SocketAddr::from((a.ipv4, PORT));
        let client = bed
            .spawn_thread_in(Side::B, move || {
                TcpStream::connect_timeout(&target, DEADLINE).map(|_| ())
            })
            .unwrap();
        let mut syn = None;
        let end = StdInstant::now() + DEADLINE;
        while syn.is_none() && StdInstant::now() < end {
            if !link.wait_readable(Duration::from_millis(100)).unwrap() {
                continue;
            }
            link.recv_batch(Instant::ZERO, 64, &mut |f| {
                if let Ok(tf) = parse_tcp_frame(f, true) {
                    if tf.tcp.flags.syn()
                        && tf.tcp.dst_port == PORT
                        && tf.ip.src == b.ipv4
                        && tf.ip.dst == a.ipv4
                    {
                        syn = Some((tf.eth, tf.ip, tf.tcp, tf.payload.len()));
                    }
                }
            });
        }
        let (eth, ip, tcp, payload_len) = syn.unwrap_or_else(|| {
            panic!(
                "no SYN from B arrived on the link: program {:?} in {:?} mode, socket {:?}, link {:?}",
                steering.counters(),
                steering.mode(),
                link.kernel_stats(),
                link.stats()
            )
        });
        assert!(link.stats().rx_frames >= 1);
        assert!(steering.counters().unwrap().redirected >= 1);

        // Answer with a RST built in place, at an offset inside the headroom.
        let rst = rst_for_unexpected(&tcp, payload_len).expect("a SYN gets a RST");
        let eth_out = EthernetRepr {
            src: eth.dst,
            dst: eth.src,
            ethertype: EtherType::Ipv4,
        };
        let ip_out = Ipv4Repr {
            src: ip.dst,
            dst: ip.src,
            protocol: IpProtocol::Tcp,
            payload_len: 0,
            ttl: 64,
            dscp_ecn: 0,
        };
        let mut once = true;
        let sent = link.tx_batch(Instant::ZERO, 1, &mut |buf| {
            if !std::mem::take(&mut once) {
                return None;
            }
            let at = TX_HEADROOM / 2;
            let len = emit_tcp_frame(&mut buf[at..], &eth_out, &ip_out, 1, &rst, 0).unwrap();
            Some(at..at + len)
        });
        assert_eq!(sent, 1);
        link.flush(Instant::ZERO);
        let outcome = client.join().expect("client thread");
        let err = outcome.expect_err("connect succeeded against a RST");
        assert_eq!(
            err.kind(),
            io::ErrorKind::ConnectionRefused,
            "the client did not see our RST: {err}"
        );
        assert!(
            eventually(|| {
                link.flush(Instant::ZERO);
                link.tx_frames_free() == free_at_start
            }),
            "tx frames were not reclaimed"
        );
    })
    .unwrap();
}

/// veth has no zero-copy support: the bind says so with a typed error.
#[test]
fn zero_copy_on_veth_is_refused() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    let ifname = bed.side(Side::A).ifname.clone();
    bed.run_in(Side::A, move || {
        let mut config = XdpLinkConfig::new(&ifname, 0);
        config.bind = BindMode::ZeroCopy;
        let err = XdpLink::open(config).expect_err("zero-copy bind on veth");
        assert!(
            matches!(err, XdpLinkError::ZeroCopyUnsupported { .. }),
            "unexpected error: {err}"
        );
        assert!(err.to_string().contains("BindMode::Copy"), "{err}");
        // Copy mode on the same queue works once the failed socket is gone.
        XdpLink::open(XdpLinkConfig::new(&ifname, 0)).expect("copy-mode bind");
    })
    .unwrap();
}

/// The default bind mode binds in zero copy where the driver advertises it; veth does not,
/// and the link reports the fallback to copy mode with that reason. An explicit copy bind
/// says it was asked.
#[test]
fn auto_bind_falls_back_to_copy_mode_on_veth_and_says_why() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());
    bed.run_in(Side::A, move || {
        let config = XdpLinkConfig::new(&a.ifname, 0);
        assert_eq!(config.bind, BindMode::Auto, "the default");
        let mut link = XdpLink::open(config).expect("auto bind on veth");
        // veth advertises native XDP with redirects, not zero copy.
        let features = xdp_features(&a.ifname).expect("the netdev family (Linux 6.3+)");
        assert!(
            features.native_redirect() && !features.zero_copy(),
            "{features:?}"
        );
        assert_eq!(
            link.binding(),
            XdpBinding::CopyFallback {
                reason: ZeroCopyRefusal::NotAdvertised
            }
        );
        assert!(!link.binding().is_zero_copy());
        let shown = link.binding().to_string();
        assert_eq!(
            shown,
            "copy (the driver does not advertise AF_XDP zero copy)"
        );
        // The fallen-back socket works: an ARP request reaches B's kernel.
        let mut frame = [0u8; 42];
        EthernetRepr {
            src: EthernetAddress(a.mac),
            dst: EthernetAddress([0xff; 6]),
            ethertype: EtherType::Arp,
        }
        .emit(&mut frame)
        .unwrap();
        ArpRepr {
            operation: ArpOperation::Request,
            source_hw: EthernetAddress(a.mac),
            source_ip: a.ipv4,
            target_hw: EthernetAddress([0; 6]),
            target_ip: b.ipv4,
        }
        .emit(&mut frame[14..])
        .unwrap();
        assert!(link.send_frame(Instant::ZERO, &frame));
        link.flush(Instant::ZERO);
        assert_eq!(link.stats().tx_frames, 1);
        assert!(link.stats().tx_kicks >= 1, "copy mode kicks");

        let mut copy = XdpLinkConfig::new(&a.ifname, 1);
        copy.bind = "copy".parse().unwrap();
        let link = XdpLink::open(copy).expect("copy bind");
        assert_eq!(link.binding(), XdpBinding::Copy);
    })
    .unwrap();
    let seen = bed
        .output_in(Side::B, "ip", &["neigh", "show", &a.ipv4.to_string()])
        .unwrap();
    assert!(seen.contains(&mac_text(a.mac)), "B did not learn A: {seen}");
}

/// Regression (a CI flake): the kernel frees a closed socket's hold on its queue from a work
/// queue, so binding the same queue right after closing a socket could fail with `EBUSY`.
/// `XdpLink::open` retries within `busy_retry`; reopening back to back always works.
#[test]
fn a_queue_can_be_bound_again_right_after_a_close() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let ifname = bed.side(Side::B).ifname.clone();
    bed.run_in(Side::B, move || {
        for round in 0..40 {
            let links: Vec<XdpLink> = (0..2)
                .map(|q| {
                    XdpLink::open(XdpLinkConfig::new(&ifname, q))
                        .unwrap_or_else(|e| panic!("round {round}, queue {q}: {e}"))
                })
                .collect();
            assert_eq!(links.len(), 2);
        }
        // Without retries a busy queue is an error at once, not a hang.
        let _held = XdpLink::open(XdpLinkConfig::new(&ifname, 0)).expect("bind queue 0");
        let mut again = XdpLinkConfig::new(&ifname, 0);
        again.busy_retry = Duration::ZERO;
        let started = StdInstant::now();
        let err = XdpLink::open(again).expect_err("queue 0 is held");
        assert!(started.elapsed() < Duration::from_secs(1), "{err}");
        assert!(err.to_string().contains("vB"), "{err}");
    })
    .unwrap();
}

/// 10 000 full-size frames in batches of 64: every one reaches B and every tx frame comes
/// back to the free pool. Prints the (debug-build) frame rate.
#[test]
fn tx_frames_are_reclaimed() {
    const FRAMES: usize = 10_000;
    const BATCH: usize = 64;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    let a = bed.side(Side::A).clone();
    let b = bed.side(Side::B).clone();
    let rx_packets = || -> u64 {
        let path = format!("/sys/class/net/{}/statistics/rx_packets", b.ifname);
        bed.output_in(Side::B, "cat", &[&path])
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let before = rx_packets();
    let link_stats = bed
        .run_in(Side::A, move || {
            let mut link = XdpLink::open(XdpLinkConfig::new(&a.ifname, 0)).expect("open");
            let initial = link.tx_frames_free();
            assert_eq!(initial, link.tx_frames_total());
            let frame_len = link.max_frame_len();
            let mut header = [0u8; 14];
            EthernetRepr {
                src: EthernetAddress(a.mac),
                dst: EthernetAddress(b.mac),
                // IEEE local experimental EtherType: B's kernel counts and drops it.
                ethertype: EtherType::Unknown(0x88b5),
            }
            .emit(&mut header)
            .unwrap();
            let start = StdInstant::now();
            let end = start + DEADLINE;
            let mut sent = 0;
            while sent < FRAMES {
                assert!(StdInstant::now() < end, "only {sent} frames sent");
                let want = BATCH.min(FRAMES - sent);
                let mut i = 0;
                let base = sent;
                sent += link.tx_batch(Instant::ZERO, want, &mut |buf| {
                    if i == want {
                        return None;
                    }
                    i += 1;
                    let frame = &mut buf[TX_HEADROOM..TX_HEADROOM + frame_len];
                    frame[..14].copy_from_slice(&header);
                    frame[14..22].copy_from_slice(&(base as u64 + i as u64).to_be_bytes());
                    Some(TX_HEADROOM..TX_HEADROOM + frame_len)
                });
                link.flush(Instant::ZERO);
            }
            assert!(
                eventually(|| {
                    link.flush(Instant::ZERO);
                    link.tx_frames_free() == initial
                }),
                "{} of {initial} tx frames back",
                link.tx_frames_free()
            );
            let secs = start.elapsed().as_secs_f64();
            // The kernel has taken every frame: flushing again has nothing to push, so it
            // must not make a system call (rounds that only receive flush too).
            let kicks = link.stats().tx_kicks;
            for _ in 0..100 {
                link.flush(Instant::ZERO);
            }
            assert_eq!(
                link.stats().tx_kicks,
                kicks,
                "a flush with nothing queued kicked the kernel"
            );
            println!(
                "AF_XDP copy-mode tx: {FRAMES} frames of {frame_len} B in {secs:.3} s: \
                 {:.0} frames/s, {:.2} Gbit/s (debug build)",
                FRAMES as f64 / secs,
                (FRAMES * frame_len * 8) as f64 / secs / 1e9
            );
            link.stats()
        })
        .unwrap();
    assert_eq!(link_stats.tx_frames, FRAMES as u64);
    assert_eq!(link_stats.dropped_oversize, 0);
    // Every batch was pushed out by at least one kick.
    assert!(
        link_stats.tx_kicks >= (FRAMES / BATCH) as u64,
        "{} kicks for {FRAMES} frames",
        link_stats.tx_kicks
    );
    assert!(
        eventually(|| rx_packets() - before >= FRAMES as u64),
        "B received only {} of {FRAMES} frames",
        rx_packets() - before
    );
}

/// Byte `i` of a test frame's payload.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8)) as u8
}

/// At MTU 9000 a frame needs several UMEM frames: the links bind with `XDP_USE_SG` on their
/// own (`MultiBuffer::Auto`) and the steering program is the `xdp.frags` variant. A SYN
/// from B's kernel still round-trips (RST answer), a 9014-byte UDP frame sent by A's link
/// (3 descriptors of 4096-byte frames) reaches B's kernel whole, and a 9014-byte TCP frame
/// sent by a link on vB (6 descriptors of 2048-byte frames) is reassembled by A's link,
/// and a second one is lent as its three parts.
#[test]
fn jumbo_frames_use_descriptor_chains() {
    const UDP_PORT: u16 = 9999;
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1).mtu(9000)) else {
        return;
    };
    let a = bed.side(Side::A).clone();
    let b = bed.side(Side::B).clone();
    bed.output_in(Side::B, "ethtool", &["-K", &b.ifname, "tx", "off"])
        .unwrap();
    let bed = &bed;
    bed.run_in(Side::A, move || {
        let steering = steer_with(&a.ifname, true);
        assert!(steering.frags());
        let mut config = XdpLinkConfig::new(&a.ifname, 0);
        config.frame_size = 4096;
        let mut link = XdpLink::open(config).expect("open the link at MTU 9000");
        assert_eq!(link.mtu(), 9000);
        assert!(link.multi_buffer(), "Auto did not turn multi-buffer on");
        assert_eq!(link.frame_capacity(), 3840);
        steering.register_socket(0, link.fd()).unwrap();
        steering.own_port(PORT).unwrap();
        let free_at_start = link.tx_frames_free();

        // SYN from B's kernel in, RST out (single-descriptor frames on an SG socket).
        let target = SocketAddr::from((a.ipv4, PORT));
        let client = bed
            .spawn_thread_in(Side::B, move || {
                TcpStream::connect_timeout(&target, DEADLINE).map(|_| ())
            })
            .unwrap();
        let mut syn = None;
        let end = StdInstant::now() + DEADLINE;
        while syn.is_none() && StdInstant::now() < end {
            if !link.wait_readable(Duration::from_millis(100)).unwrap() {
                continue;
            }
            link.recv_batch(Instant::ZERO, 64, &mut |f| {
                if let Ok(tf) = parse_tcp_frame(f, true) {
                    if tf.tcp.flags.syn() && tf.tcp.dst_port == PORT {
                        syn = Some((tf.tcp, tf.payload.len()));
                        // B's kernel offers an MSS for its 9000-byte MTU.
                        assert_eq!(tf.tcp.options.mss, Some(8960));
                    }
                }
            });
        }
        let (tcp, payload_len) = syn.expect("no SYN from B arrived at MTU 9000");
        let rst = rst_for_unexpected(&tcp, payload_len).unwrap();
        let eth_ab = EthernetRepr {
            src: EthernetAddress(a.mac),
            dst: EthernetAddress(b.mac),
            ethertype: EtherType::Ipv4,
        };
        let ip_ab = Ipv4Repr {
            src: a.ipv4,
            dst: b.ipv4,
            protocol: IpProtocol::Tcp,
            payload_len: 0,
            ttl: 64,
            dscp_ecn: 0,
        };
        let mut frame = [0u8; 54];
        let len = emit_tcp_frame(&mut frame, &eth_ab, &ip_ab, 1, &rst, 0).unwrap();
        assert!(link.send_frame(Instant::ZERO, &frame[..len]));
        link.flush(Instant::ZERO);
        let err = client
            .join()
            .unwrap()
            .expect_err("connect succeeded against a RST");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");

        // A → B's kernel: one 9014-byte frame carrying a UDP datagram of 8972 bytes.
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let b_ip = b.ipv4;
        let receiver = bed
            .spawn_thread_in(Side::B, move || {
                let sock = UdpSocket::bind((b_ip, UDP_PORT)).unwrap();
                sock.set_read_timeout(Some(DEADLINE)).unwrap();
                bound_tx.send(()).unwrap();
                let mut buf = vec![0u8; 16 * 1024];
                sock.recv(&mut buf).map(|n| buf[..n].to_vec())
            })
            .unwrap();
        bound_rx.recv().unwrap();
        let mut jumbo = vec![0u8; 9014];
        eth_ab.emit(&mut jumbo).unwrap();
        {
            let mut ip = Ipv4Packet::new_unchecked(&mut jumbo[14..34]);
            ip.set_version_and_header_len(4, 20);
            ip.set_total_len(9000);
            ip.set_flags_and_frag_offset(true, false, 0);
            ip.set_ttl(64);
            ip.set_protocol(IpProtocol::Udp);
            ip.set_src_addr(a.ipv4);
            ip.set_dst_addr(b.ipv4);
            ip.fill_checksum();
        }
        jumbo[34..36].copy_from_slice(&40_000u16.to_be_bytes());
        jumbo[36..38].copy_from_slice(&UDP_PORT.to_be_bytes());
        jumbo[38..40].copy_from_slice(&(9000u16 - 20).to_be_bytes());
        // UDP checksum 0: none (RFC 768).
        for (i, byte) in jumbo[42..].iter_mut().enumerate() {
            *byte = pattern(i);
        }
        assert!(link.send_frame(Instant::ZERO, &jumbo));
        link.flush(Instant::ZERO);
        assert_eq!(link.tx_chains(), 1);
        let got = receiver
            .join()
            .unwrap()
            .expect("B's kernel got no datagram");
        assert_eq!(got.len(), 8972);
        assert!(got.iter().enumerate().all(|(i, &x)| x == pattern(i)));

        // B → A: a 9014-byte TCP frame from a link on vB (2048-byte frames: 6 parts) to
        // the owned port; A's link reassembles it.
        let mut tcp_jumbo = vec![0u8; 9014];
        let eth_ba = EthernetRepr {
            src: EthernetAddress(b.mac),
            dst: EthernetAddress(a.mac),
            ethertype: EtherType::Ipv4,
        };
        let ip_ba = Ipv4Repr {
            src: b.ipv4,
            dst: a.ipv4,
            ..ip_ab
        };
        let seg = TcpRepr {
            src_port: 40_001,
            dst_port: PORT,
            flags: TcpFlags::PSH,
            ack: Some(netdriver::tcp::SeqNumber(1)),
            window: 100,
            ..TcpRepr::default()
        };
        let payload_at = 14 + 20 + 20;
        for (i, byte) in tcp_jumbo[payload_at..].iter_mut().enumerate() {
            *byte = pattern(i);
        }
        let len =
            emit_tcp_frame(&mut tcp_jumbo, &eth_ba, &ip_ba, 2, &seg, 9014 - payload_at).unwrap();
        assert_eq!(len, 9014);
        let send_from_b = || {
            let b_ifname = b.ifname.clone();
            let sent = tcp_jumbo.clone();
            bed.run_in(Side::B, move || {
                let mut blink = XdpLink::open(XdpLinkConfig::new(&b_ifname, 0)).unwrap();
                assert!(blink.multi_buffer());
                assert_eq!(blink.frame_capacity(), 1792);
                assert!(blink.send_frame(Instant::ZERO, &sent));
                blink.flush(Instant::ZERO);
                let total = blink.tx_frames_total();
                assert!(
                    eventually(|| {
                        blink.flush(Instant::ZERO);
                        blink.tx_frames_free() == total
                    }),
                    "B's chain was not completed"
                );
                blink.tx_chains()
            })
            .unwrap()
        };
        assert_eq!(send_from_b(), 1);
        let mut received = None;
        let end = StdInstant::now() + DEADLINE;
        while received.is_none() && StdInstant::now() < end {
            if !link.wait_readable(Duration::from_millis(100)).unwrap() {
                continue;
            }
            link.recv_batch(Instant::ZERO, 64, &mut |f| {
                if f.len() > 1514 {
                    received = Some(f.to_vec());
                }
            });
        }
        let received = received.unwrap_or_else(|| {
            panic!(
                "no jumbo frame reached A's link: program {:?}, socket {:?}, link {:?}",
                steering.counters(),
                link.kernel_stats(),
                link.stats()
            )
        });
        assert_eq!(received, tcp_jumbo, "the reassembled frame differs");
        assert_eq!(link.rx_chains(), 1);
        assert_eq!(link.rx_chains_dropped(), 0);
        let tf = parse_tcp_frame(&received, true).expect("checksums verify after reassembly");
        assert_eq!(tf.payload.len(), 9014 - payload_at);

        // The same frame again, lent as its parts where the kernel wrote them: three
        // chunks of A's UMEM (3840 + 3840 + 1334 bytes), nothing gathered.
        assert_eq!(send_from_b(), 1);
        let mut parts = None;
        let end = StdInstant::now() + DEADLINE;
        while parts.is_none() && StdInstant::now() < end {
            if !link.wait_readable(Duration::from_millis(100)).unwrap() {
                continue;
            }
            link.recv_batch_parts(Instant::ZERO, 64, &mut |p, _| {
                if p.iter().map(|x| x.len()).sum::<usize>() > 1514 {
                    parts = Some(p.iter().map(|x| x.to_vec()).collect::<Vec<_>>());
                }
            });
        }
        let parts = parts.expect("the second jumbo frame did not reach A's link");
        let lens: Vec<usize> = parts.iter().map(Vec::len).collect();
        assert_eq!(lens, [3840, 3840, 9014 - 2 * 3840]);
        assert_eq!(parts.concat(), tcp_jumbo, "the lent parts differ");
        assert_eq!(link.rx_chains(), 2);
        assert_eq!(link.rx_chains_dropped(), 0);
        assert!(
            eventually(|| {
                link.flush(Instant::ZERO);
                link.tx_frames_free() == free_at_start
            }),
            "tx frames were not reclaimed"
        );
    })
    .unwrap();
}

/// Without multi-buffer, an MTU the UMEM frames cannot hold is refused with a typed error
/// that says so.
#[test]
fn jumbo_mtu_without_multi_buffer_is_refused() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1).mtu(9000)) else {
        return;
    };
    let ifname = bed.side(Side::A).ifname.clone();
    bed.run_in(Side::A, move || {
        let mut config = XdpLinkConfig::new(&ifname, 0);
        config.multi_buffer = MultiBuffer::Off;
        let err = XdpLink::open(config).expect_err("MTU 9000 in 2048-byte frames");
        assert!(
            matches!(
                err,
                XdpLinkError::FrameTooSmall {
                    mtu: 9000,
                    capacity: 1792,
                    ..
                }
            ),
            "{err}"
        );
    })
    .unwrap();
}

/// Copy mode asks the kernel (Linux 6.17+, `XDP_MAX_TX_SKB_BUDGET`) to send up to a tx
/// ring's worth of frames per `sendto` instead of 32; a budget outside the kernel's range
/// is clamped into it, and the link reports what applies.
#[test]
fn the_copy_mode_tx_budget_is_raised_where_the_kernel_allows() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    let ifname = bed.side(Side::A).ifname.clone();
    bed.run_in(Side::A, move || {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut v = release
            .trim()
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        let has_option = (major, minor) >= (6, 17);
        let link = XdpLink::open(XdpLinkConfig::new(&ifname, 0)).expect("open");
        // The tx ring holds half the 4096 frames.
        let want = if has_option { 2048 } else { 32 };
        assert_eq!(link.tx_skb_budget(), want, "kernel {}", release.trim());
        drop(link);
        let mut config = XdpLinkConfig::new(&ifname, 0);
        config.tx_skb_budget = 5;
        let link = XdpLink::open(config).expect("open");
        assert_eq!(link.tx_skb_budget(), 32);
        drop(link);
        let mut config = XdpLinkConfig::new(&ifname, 0);
        config.tx_skb_budget = 128;
        let link = XdpLink::open(config).expect("open");
        assert_eq!(link.tx_skb_budget(), if has_option { 128 } else { 32 });
    })
    .unwrap();
}
