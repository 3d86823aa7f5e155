//! Privileged tests of the AF_XDP link on a veth pair between two network namespaces the
//! test bed creates (and always deletes), against the peer's kernel stack.
//!
//! They need root. Without it each test prints why it skips, unless
//! `NETCHANNEL_REQUIRE_XDP=1`, which turns the skip into a failure (CI).
#![cfg(target_os = "linux")]

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant as StdInstant};

use netdriver::link::xdp::{BindMode, XdpLink, XdpLinkConfig, XdpLinkError};
use netdriver::link::{Link, TX_HEADROOM};
use netdriver::tcp::rst_for_unexpected;
use netdriver::time::Instant;
use netdriver::wire::{
    emit_tcp_frame, parse_tcp_frame, ArpOperation, ArpRepr, EtherType, EthernetAddress,
    EthernetRepr, IpProtocol, Ipv4Repr,
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
    XdpSteering::attach(
        ifname,
        AttachOptions {
            mode: AttachMode::Auto,
            frags: false,
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
    assert!(
        eventually(|| rx_packets() - before >= FRAMES as u64),
        "B received only {} of {FRAMES} frames",
        rx_packets() - before
    );
}
