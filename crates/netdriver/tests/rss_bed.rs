//! Privileged tests of RSS on the test beds: the plain veth bed has none (and says so),
//! and on the RSS bed every frame arrives on the queue its receiver's RSS picks, whoever
//! sent it and on whichever queue, as [`netdriver::rss::RssConfig`] computes. Channel sets
//! aligned to their RSS ([`RssAlignment`]) then get every frame of every channel on the
//! queue that owns it (nothing forwarded between queues); without alignment the opening
//! side forwards, and on veth a set opens channels as it always did.
//!
//! They need root. Without it each test prints why it skips, unless
//! `NETCHANNEL_REQUIRE_XDP=1`, which turns the skip into a failure (CI).
#![cfg(target_os = "linux")]

mod common;

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant as StdInstant};

use netdriver::channel::{Channel, ChannelSet, RssAlignment};
use netdriver::link::xdp::{XdpLink, XdpLinkConfig};
use netdriver::link::Link;
use netdriver::rss::{
    read_rss, ChannelSteering, FlowTuple, ForwardReason, PortChooser, RssConfig, RssError,
    RssState, SteeringCounts, MICROSOFT_VERIFICATION_KEY,
};
use netdriver::time::Instant;
use netdriver::wire::{
    emit_tcp_frame, parse_tcp_frame, EtherType, EthernetAddress, EthernetRepr, IpProtocol,
    Ipv4Repr, TcpFlags, TcpRepr,
};
use testbed::{testbed_or_skip, RelayEnd, RssTable, Side, TestBed};
use xdp_prog::{AttachMode, AttachOptions, XdpSteering};

const QUEUES: u32 = 4;
const PORT: u16 = 7000;
const DEADLINE: Duration = Duration::from_secs(10);

/// B's "NIC" uses Microsoft's verification key, A's the same bytes reversed; both spread
/// 128 entries over the queues.
fn tables() -> (RssTable, RssTable) {
    let key_b = MICROSOFT_VERIFICATION_KEY;
    let mut key_a = key_b;
    key_a.reverse();
    (
        RssTable::spread(&key_a, 128, QUEUES).unwrap(),
        RssTable::spread(&key_b, 128, QUEUES).unwrap(),
    )
}

fn config(table: &RssTable) -> RssConfig {
    RssConfig::toeplitz(table.key(), table.indirection()).unwrap()
}

/// The steering program on `ifname`, owning `PORT`, and one link per queue, registered.
/// Runs in the interface's namespace.
fn receivers(ifname: &str) -> (XdpSteering, Vec<XdpLink>) {
    let steering = XdpSteering::attach(
        ifname,
        AttachOptions {
            mode: AttachMode::Native,
            frags: false,
            replace_stale: true,
        },
    )
    .expect("attach the steering program");
    let links: Vec<XdpLink> = (0..QUEUES)
        .map(|q| {
            let link = XdpLink::open(XdpLinkConfig::new(ifname, q)).expect("open a link");
            steering.register_socket(q, link.fd()).unwrap();
            link
        })
        .collect();
    steering.own_port(PORT).unwrap();
    (steering, links)
}

/// Receives until `want` distinct tuples of segments `pick` accepts arrived (or the
/// deadline); returns each tuple's queues (a tuple seen twice, a kernel's SYN
/// retransmitted, lists both).
fn collect(
    links: &mut [XdpLink],
    want: usize,
    pick: impl Fn(&TcpRepr) -> bool,
) -> HashMap<FlowTuple, Vec<u32>> {
    let mut seen: HashMap<FlowTuple, Vec<u32>> = HashMap::new();
    let end = StdInstant::now() + DEADLINE;
    while seen.len() < want && StdInstant::now() < end {
        for (q, link) in links.iter_mut().enumerate() {
            link.recv_batch(Instant::ZERO, 64, &mut |f| {
                // Kernels send partial checksums over veth: do not verify.
                if let Ok(tf) = parse_tcp_frame(f, false) {
                    if pick(&tf.tcp) {
                        let tuple = FlowTuple::new(
                            SocketAddrV4::new(tf.ip.src, tf.tcp.src_port),
                            SocketAddrV4::new(tf.ip.dst, tf.tcp.dst_port),
                        );
                        seen.entry(tuple).or_default().push(q as u32);
                    }
                }
            });
        }
        std::thread::yield_now();
    }
    seen
}

/// Asserts every tuple arrived only on the queue `rss` picks, and that `want` arrived
/// over more than one queue.
fn assert_on_rss_queues(seen: &HashMap<FlowTuple, Vec<u32>>, rss: &RssConfig, want: usize) {
    assert_eq!(seen.len(), want, "tuples that arrived: {seen:?}");
    let mut per_queue = [0usize; QUEUES as usize];
    for (tuple, queues) in seen {
        let expected = rss.queue_of(tuple).unwrap();
        assert!(
            queues.iter().all(|&q| q == expected),
            "{tuple:?} arrived on {queues:?}, RSS picks {expected}"
        );
        per_queue[expected as usize] += 1;
    }
    assert!(
        per_queue.iter().all(|&n| n > 0),
        "every queue should get some of {want} flows: {per_queue:?}"
    );
}

#[test]
fn veth_has_no_rss_and_says_so() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    bed.run_in(Side::B, || {
        let err = read_rss("vB").unwrap_err();
        assert!(
            matches!(err, RssError::Unsupported { ref driver, .. } if driver == "veth"),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("veth has no RSS"), "{msg}");
        let tuple = FlowTuple::new(
            "10.77.0.1:40000".parse().unwrap(),
            "10.77.0.2:7000".parse().unwrap(),
        );
        let err = netdriver::rss::install_ntuple("vB", tuple, 1).unwrap_err();
        assert!(matches!(err, RssError::Unsupported { .. }), "{err:?}");
    })
    .unwrap();
}

/// Frames A's AF_XDP sockets send on every tx queue arrive at B on the queue B's RSS
/// picks, not on the sending queue's number (as on a plain veth).
#[test]
fn crafted_frames_arrive_on_the_receivers_rss_queue() {
    let (nic_a, nic_b) = tables();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(QUEUES).rss(nic_a, nic_b.clone()))
    else {
        return;
    };
    let rss_b = config(&nic_b);
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());
    let (_steering, mut links_b) = bed.run_in(Side::B, || receivers("vB")).unwrap();
    let mut senders: Vec<XdpLink> = bed
        .run_in(Side::A, || {
            (0..QUEUES)
                .map(|q| XdpLink::open(XdpLinkConfig::new("vA", q)).expect("open a link"))
                .collect()
        })
        .unwrap();

    const FLOWS: u16 = 64;
    let mut sent_on_own_queue = 0;
    for i in 0..FLOWS {
        let sport = 40_000 + i * 7;
        let q = usize::from(i) % QUEUES as usize;
        let tuple = FlowTuple::new(
            SocketAddrV4::new(a.ipv4, sport),
            SocketAddrV4::new(b.ipv4, PORT),
        );
        if rss_b.queue_of(&tuple) == Some(q as u32) {
            sent_on_own_queue += 1;
        }
        let mut frame = [0u8; 54];
        let len = emit_tcp_frame(
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
                src_port: sport,
                dst_port: PORT,
                flags: TcpFlags::SYN,
                window: 1000,
                ..TcpRepr::default()
            },
            0,
        )
        .unwrap();
        assert!(senders[q].send_frame(Instant::ZERO, &frame[..len]));
        senders[q].flush(Instant::ZERO);
    }
    // On a plain veth every frame would arrive on its sending queue; here only those RSS
    // happens to agree with.
    assert!(
        sent_on_own_queue < usize::from(FLOWS) / 2,
        "{sent_on_own_queue}"
    );
    let seen = collect(&mut links_b, usize::from(FLOWS), |tcp| tcp.dst_port == PORT);
    assert_on_rss_queues(&seen, &rss_b, usize::from(FLOWS));
    let relay = bed.relay().unwrap();
    let toward_b = relay.queue_counts(RelayEnd::B, QUEUES).unwrap();
    assert!(
        toward_b.iter().sum::<u64>() >= u64::from(FLOWS),
        "{toward_b:?}"
    );
    drop(links_b);
}

/// SYNs the kernel of each side sends from chosen source ports arrive at the other side
/// on the queue that side's RSS picks: each direction uses its receiver's key.
#[test]
fn kernel_frames_arrive_on_the_receivers_rss_queue_both_ways() {
    let (nic_a, nic_b) = tables();
    let Some(bed) = testbed_or_skip(
        TestBed::builder()
            .queues(QUEUES)
            .rss(nic_a.clone(), nic_b.clone()),
    ) else {
        return;
    };
    for (from, table) in [(Side::A, &nic_b), (Side::B, &nic_a)] {
        let to = from.peer();
        let rss = config(table);
        let ifname = bed.side(to).ifname.clone();
        let (_steering, mut links) = bed.run_in(to, || receivers(&ifname)).unwrap();
        let (src, dst) = (bed.side(from).ipv4, bed.side(to).ipv4);
        const FLOWS: u16 = 24;
        // Non-blocking connects: each sends its SYN at once; the sockets stay open (and
        // retransmit) until the frames are collected.
        let sockets = bed
            .run_in(from, move || {
                (0..FLOWS)
                    .map(|i| syn_from(src, 45_000 + i * 11, SocketAddrV4::new(dst, PORT)))
                    .collect::<Vec<_>>()
            })
            .unwrap();
        let seen = collect(&mut links, usize::from(FLOWS), |tcp| tcp.dst_port == PORT);
        drop(sockets);
        assert_on_rss_queues(&seen, &rss, usize::from(FLOWS));
    }
}

/// A non-blocking TCP socket bound to `src:sport` connecting to `dst` (its SYN is sent).
fn syn_from(src: Ipv4Addr, sport: u16, dst: SocketAddrV4) -> std::os::fd::OwnedFd {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(
        fd.as_raw_fd(),
        &SockaddrIn::from(SocketAddrV4::new(src, sport)),
    )
    .unwrap();
    match connect(fd.as_raw_fd(), &SockaddrIn::from(dst)) {
        Err(nix::errno::Errno::EINPROGRESS) => {}
        other => panic!("connect from port {sport}: {other:?}"),
    }
    fd
}

/// Ports the chooser picks with A's RSS make B's replies arrive on the chosen queue at A:
/// A's kernel connects from each chosen port to B's kernel listener, and B's SYN-ACKs are
/// received by A's per-queue sockets.
#[test]
fn chosen_ports_bring_the_replies_to_their_queue() {
    let (nic_a, nic_b) = tables();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(QUEUES).rss(nic_a.clone(), nic_b))
    else {
        return;
    };
    let rss_a = config(&nic_a);
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());
    let remote = SocketAddrV4::new(b.ipv4, PORT);
    let _listener = bed
        .run_in(Side::B, move || {
            std::net::TcpListener::bind(remote).unwrap()
        })
        .unwrap();
    let (steering, mut links_a) = bed.run_in(Side::A, || receivers("vA")).unwrap();

    let mut used = HashSet::new();
    let mut chosen = Vec::new();
    for round in 0..3u16 {
        for q in 0..QUEUES {
            let target = [q];
            let chooser =
                PortChooser::new(a.ipv4, remote, 50_000..=60_000, &rss_a, &target).unwrap();
            let choice = chooser
                .choose(50_000 + round * 1000, |p| used.insert(p))
                .unwrap();
            assert_eq!(choice.local_queue, q);
            steering.own_port(choice.port).unwrap();
            chosen.push((choice.port, q));
        }
    }
    let sockets = bed
        .run_in(Side::A, {
            let chosen = chosen.clone();
            let src = a.ipv4;
            move || {
                chosen
                    .iter()
                    .map(|&(p, _)| syn_from(src, p, remote))
                    .collect::<Vec<_>>()
            }
        })
        .unwrap();
    let seen = collect(&mut links_a, chosen.len(), |tcp| tcp.src_port == PORT);
    drop(sockets);
    for (port, q) in chosen {
        let reply = FlowTuple::reply(SocketAddrV4::new(a.ipv4, port), remote);
        let queues = seen
            .get(&reply)
            .unwrap_or_else(|| panic!("no reply to port {port} arrived: {seen:?}"));
        assert!(
            queues.iter().all(|&x| x == q),
            "{reply:?} arrived on {queues:?}, chosen for {q}"
        );
    }
}

/// Channels `a` opens to `b`'s listener on [`PORT`], `n` of them (round robin over `a`'s
/// queues), each carrying `bytes` each way at once; returns both ends of each, A's first.
fn channels_both_ways(
    bed: &TestBed,
    a: &ChannelSet,
    b: &ChannelSet,
    n: usize,
    bytes: u64,
) -> Vec<(Channel, Channel)> {
    let listener = b.listen(PORT).expect("listen");
    let remote = SocketAddrV4::new(bed.side(Side::B).ipv4, PORT);
    let pairs: Vec<(Channel, Channel)> = (0..n)
        .map(|_| {
            let opened = a.connect(remote).expect("connect");
            let (accepted, _) = listener.accept().expect("accept");
            (opened, accepted)
        })
        .collect();
    std::thread::scope(|s| {
        for (i, (opened, accepted)) in pairs.iter().enumerate() {
            let seed = i as u64;
            s.spawn(move || common::send_stream(opened, seed, bytes, 16 << 10));
            s.spawn(move || common::send_stream(accepted, seed + 100, bytes, 16 << 10));
            s.spawn(move || assert_eq!(common::recv_stream(accepted, seed), bytes));
            s.spawn(move || assert_eq!(common::recv_stream(opened, seed + 100), bytes));
        }
    });
    pairs
}

/// Channels A opens on the RSS bed, A aligned to its "NIC"'s RSS: each is owned by the
/// queue B's replies land on (the queue it was given, round robin), the queue B's SYN
/// arrived on owns each accepted end, and no frame is forwarded between queues at either
/// end while bytes flow both ways.
#[test]
fn aligned_channels_get_every_frame_on_their_own_queue() {
    let (nic_a, nic_b) = tables();
    let Some(bed) = testbed_or_skip(
        TestBed::builder()
            .queues(QUEUES)
            .rss(nic_a.clone(), nic_b.clone()),
    ) else {
        return;
    };
    let (rss_a, rss_b) = (config(&nic_a), config(&nic_b));
    let mut ca = common::config(&bed, Side::A);
    ca.rss = RssAlignment::Known(rss_a.clone());
    let a = common::start(&bed, Side::A, ca);
    let b = common::start(&bed, Side::B, common::config(&bed, Side::B));
    assert_eq!(a.rss_state(), &RssState::Predictable(rss_a.clone()));
    const CHANNELS: usize = 8;
    let pairs = channels_both_ways(&bed, &a, &b, CHANNELS, 256 << 10);
    for (i, (opened, accepted)) in pairs.iter().enumerate() {
        let (local, remote) = (opened.local_addr(), opened.peer_addr());
        assert_eq!(opened.steering(), ChannelSteering::Aligned);
        assert_eq!(opened.queue(), i as u32 % QUEUES, "round robin kept");
        assert_eq!(rss_a.reply_queue(local, remote), Some(opened.queue()));
        assert_eq!(accepted.steering(), ChannelSteering::Accepted);
        assert_eq!(
            rss_b.queue_of(&FlowTuple::new(local, remote)),
            Some(accepted.queue())
        );
    }
    assert_eq!(a.forwarded_frames(), (0, 0), "A forwarded frames");
    assert_eq!(b.forwarded_frames(), (0, 0), "B forwarded frames");
    assert_eq!(
        a.steering_counts(),
        SteeringCounts {
            aligned: CHANNELS as u64,
            ..Default::default()
        }
    );
    assert_eq!(b.steering_counts().accepted, CHANNELS as u64);
    // The frames A received came through the relay, on more than one queue.
    let toward_a = bed
        .relay()
        .unwrap()
        .queue_counts(RelayEnd::A, QUEUES)
        .unwrap();
    assert!(
        toward_a.iter().filter(|&&n| n > 0).count() == QUEUES as usize,
        "{toward_a:?}"
    );
}

/// The same channels without alignment: A's replies land wherever B's ports hash, and A
/// forwards them between its queues (what alignment removes, and what the test above
/// would see without it).
#[test]
fn unaligned_channels_are_forwarded_on_the_rss_bed() {
    let (nic_a, nic_b) = tables();
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(QUEUES).rss(nic_a.clone(), nic_b))
    else {
        return;
    };
    let rss_a = config(&nic_a);
    let mut ca = common::config(&bed, Side::A);
    ca.rss = RssAlignment::Off;
    let a = common::start(&bed, Side::A, ca);
    let b = common::start(&bed, Side::B, common::config(&bed, Side::B));
    let pairs = channels_both_ways(&bed, &a, &b, 8, 256 << 10);
    let misplaced = pairs
        .iter()
        .filter(|(o, _)| rss_a.reply_queue(o.local_addr(), o.peer_addr()) != Some(o.queue()))
        .count();
    assert!(misplaced > 0, "every port happened to land on its queue");
    for (opened, _) in &pairs {
        assert_eq!(
            opened.steering(),
            ChannelSteering::Forwarded {
                reason: ForwardReason::AlignmentOff
            }
        );
    }
    assert!(a.forwarded_frames().0 > 0, "{:?}", a.forwarded_frames());
    assert_eq!(b.forwarded_frames(), (0, 0));
    assert_eq!(a.steering_counts().forwarded, 8);
}

/// On the plain veth bed a set reads no RSS and opens channels as it always did: queues
/// round robin, ports one after another from the start of its range; nothing forwarded
/// (veth delivers each frame on the queue its sender used). Its queues report their
/// AF_XDP binding (copy mode: veth has no zero copy) and UMEM.
#[test]
fn on_veth_channels_open_round_robin_from_consecutive_ports() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(QUEUES)) else {
        return;
    };
    let mut ca = common::config(&bed, Side::A);
    ca.ephemeral_ports = Some(62000..=62999);
    let a = common::start(&bed, Side::A, ca);
    let b = common::start(&bed, Side::B, common::config(&bed, Side::B));
    match a.rss_state() {
        RssState::Unreadable(why) => assert!(why.contains("veth"), "{why}"),
        other => panic!("{other:?}"),
    }
    let pairs = channels_both_ways(&bed, &a, &b, 8, 64 << 10);
    for (i, (opened, accepted)) in pairs.iter().enumerate() {
        assert_eq!(opened.queue(), i as u32 % QUEUES);
        assert_eq!(opened.local_addr().port(), 62000 + i as u16);
        assert_eq!(
            opened.steering(),
            ChannelSteering::Forwarded {
                reason: ForwardReason::RssUnreadable
            }
        );
        assert_eq!(accepted.queue(), opened.queue(), "veth: the sender's queue");
    }
    assert_eq!(a.forwarded_frames(), (0, 0));
    assert_eq!(b.forwarded_frames(), (0, 0));
    for q in a.queue_stats() {
        let binding = q.binding.expect("an AF_XDP queue has a binding");
        assert!(!binding.is_zero_copy(), "veth has no zero copy: {binding}");
        let umem = q.umem.expect("an AF_XDP queue has a UMEM");
        assert!(umem.bytes >= 4096 * 2048, "{umem:?}");
    }
}
