//! The interface over links with offloads: super-segments out, partial checksums left to
//! the link, checksums vouched for on receive, large received segments taken whatever was
//! configured, and the switches that turn each use off. Two interfaces over the simulated
//! link in virtual time; every byte checked.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::Range;

use netdriver::link::sim::{self, SimConfig, SimOffload};
use netdriver::link::{FrameWriter, Link, LinkStats, Offloads, RxMeta};
use netdriver::netif::{ConnHandle, Interface, InterfaceConfig, StrayVerdict};
use netdriver::tcp::{Config, TcpError};
use netdriver::time::{Duration, Instant};
use netdriver::wire::frame::{emit_tcp_frame, tcp_payload_offset};
use netdriver::wire::{
    parse_tcp_frame, EtherType, EthernetAddress, EthernetRepr, IpProtocol, Ipv4Repr, TcpFlags,
    TcpRepr,
};

const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xb]);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// A link that forwards everything and records what it received.
struct Spy<L: Link> {
    inner: L,
    largest_rx: usize,
    rx_verified: u64,
    rx_checksums_bad: u64,
}

impl<L: Link> Spy<L> {
    fn new(inner: L) -> Self {
        Spy {
            inner,
            largest_rx: 0,
            rx_verified: 0,
            rx_checksums_bad: 0,
        }
    }
}

impl<L: Link> Link for Spy<L> {
    fn mtu(&self) -> usize {
        self.inner.mtu()
    }
    fn recv_batch(&mut self, now: Instant, max: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        self.recv_batch_meta(now, max, &mut |frame, _| f(frame))
    }
    fn recv_batch_meta(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        let Spy {
            inner,
            largest_rx,
            rx_verified,
            rx_checksums_bad,
        } = self;
        inner.recv_batch_meta(now, max, &mut |frame, meta| {
            *largest_rx = (*largest_rx).max(frame.len());
            if meta.checksum_verified {
                *rx_verified += 1;
            } else if parse_tcp_frame(frame, true).is_err() {
                *rx_checksums_bad += 1;
            }
            f(frame, meta)
        })
    }
    fn tx_batch(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&mut [u8]) -> Option<Range<usize>>,
    ) -> usize {
        self.inner.tx_batch(now, max, f)
    }
    fn tx_batch_meta(&mut self, now: Instant, max: usize, f: &mut FrameWriter<'_>) -> usize {
        self.inner.tx_batch_meta(now, max, f)
    }
    fn flush(&mut self, now: Instant) {
        self.inner.flush(now)
    }
    fn poll_at(&self) -> Option<Instant> {
        self.inner.poll_at()
    }
    fn stats(&self) -> LinkStats {
        self.inner.stats()
    }
    fn offloads(&self) -> Offloads {
        self.inner.offloads()
    }
}

type Host = Interface<Spy<sim::SimLink>>;

fn host(
    link: sim::SimLink,
    mac: EthernetAddress,
    ip: Ipv4Addr,
    tweak: impl Fn(&mut InterfaceConfig),
) -> Host {
    let mut config = InterfaceConfig {
        mac,
        ipv4: ip,
        tcp: Config {
            min_rto: Duration::from_millis(1),
            initial_rto: Duration::from_millis(10),
            time_wait: Duration::from_millis(5),
            ..Config::default()
        },
        isn_key: Some([9; 16]),
        ..InterfaceConfig::default()
    };
    tweak(&mut config);
    Interface::new(Spy::new(link), config)
}

fn hosts(
    offload: SimOffload,
    tweak_a: impl Fn(&mut InterfaceConfig),
    tweak_b: impl Fn(&mut InterfaceConfig),
) -> (Host, Host) {
    let (la, lb) = sim::pair(SimConfig {
        offload,
        bandwidth_bps: Some(10_000_000_000),
        ..SimConfig::default()
    });
    let mut a = host(la, MAC_A, IP_A, tweak_a);
    let mut b = host(lb, MAC_B, IP_B, tweak_b);
    a.add_neighbor(IP_B, MAC_B);
    b.add_neighbor(IP_A, MAC_A);
    (a, b)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + i / 977) as u8).collect()
}

/// Connects A to B, moves `bytes` from A to B, checks every byte, closes both.
fn transfer(a: &mut Host, b: &mut Host, bytes: usize) {
    let data = pattern(bytes);
    let mut now = Instant::ZERO;
    b.listen(80, 4).unwrap();
    let ca = a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap();
    let mut cb: Option<ConnHandle> = None;
    let (mut sent, mut got) = (0usize, Vec::new());
    let mut closed = false;
    for _ in 0..1_000_000 {
        a.poll(now);
        b.poll(now);
        if let Some(c) = a.conn_mut(ca) {
            if c.state().is_synchronized() {
                while sent < bytes {
                    match c.send(&data[sent..]) {
                        Ok(0) | Err(TcpError::WouldBlock) => break,
                        Ok(n) => sent += n,
                        Err(e) => panic!("send: {e}"),
                    }
                }
                if sent == bytes && !closed {
                    c.close();
                    closed = true;
                }
            }
        }
        cb = cb.or_else(|| b.accept(80));
        if let Some(c) = cb.and_then(|h| b.conn_mut(h)) {
            let mut buf = [0u8; 65536];
            loop {
                match c.recv(&mut buf) {
                    Ok(0) => {
                        assert_eq!(got.len(), bytes);
                        assert!(got == data, "the bytes received differ");
                        c.close();
                        // Let the close finish.
                        for _ in 0..1000 {
                            now += Duration::from_millis(1);
                            a.poll(now);
                            b.poll(now);
                        }
                        return;
                    }
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(TcpError::WouldBlock) => break,
                    Err(e) => panic!("recv: {e}"),
                }
            }
        }
        match [a.poll_at(), b.poll_at()].into_iter().flatten().min() {
            Some(t) if t > now => now = t,
            _ => now += Duration::from_micros(1),
        }
    }
    panic!("transfer did not finish: {} of {bytes} received", got.len());
}

#[test]
fn super_segments_are_cut_into_valid_wire_segments_by_a_segmenting_link() {
    let (mut a, mut b) = hosts(SimOffload::Segment, |_| {}, |_| {});
    assert!(a.config().tcp.max_super_segment > 60_000);
    assert!(a.config().tcp.checksum_offload);
    transfer(&mut a, &mut b, 4 << 20);
    let (sa, sb) = (a.stats(), b.stats());
    assert!(sa.tx_super_segments > 100, "{sa:?}");
    assert!(sa.tx_checksum_offloaded >= sa.tx_super_segments);
    // What B received was cut to the MTU with complete checksums.
    assert!(b.link().largest_rx <= 1514, "{}", b.link().largest_rx);
    assert_eq!(b.link().rx_checksums_bad, 0);
    assert_eq!(sb.rx_bad_checksum, 0);
    assert_eq!(sb.rx_checksum_offloaded, 0);
    let conn_stats = sa.tx_super_segments;
    assert!(conn_stats > 0);
}

#[test]
fn whole_super_segments_are_taken_and_their_checksums_vouched_for() {
    let (mut a, mut b) = hosts(SimOffload::Whole, |_| {}, |_| {});
    transfer(&mut a, &mut b, 4 << 20);
    let sb = b.stats();
    assert!(b.link().largest_rx > 30_000, "{}", b.link().largest_rx);
    assert!(sb.rx_large_frames > 50, "{sb:?}");
    assert!(sb.rx_checksum_offloaded > 50);
    assert_eq!(sb.rx_bad_checksum, 0);
}

#[test]
fn a_stack_that_did_not_ask_for_large_segments_still_takes_them() {
    // B has every offload turned off; A sends super-segments that the link carries whole.
    let (mut a, mut b) = hosts(
        SimOffload::Whole,
        |_| {},
        |c| {
            c.large_segments = false;
            c.checksum_offload = false;
        },
    );
    assert_eq!(b.config().tcp.max_super_segment, 0);
    assert!(!b.config().tcp.checksum_offload);
    transfer(&mut a, &mut b, 2 << 20);
    assert!(b.stats().rx_large_frames > 10);
    assert_eq!(b.stats().tx_super_segments, 0);
    assert_eq!(b.stats().tx_checksum_offloaded, 0);
}

#[test]
fn each_use_of_an_offload_can_be_turned_off() {
    let (mut a, mut b) = hosts(SimOffload::Segment, |c| c.large_segments = false, |_| {});
    assert_eq!(a.config().tcp.max_super_segment, 0);
    assert!(a.config().tcp.checksum_offload);
    transfer(&mut a, &mut b, 1 << 20);
    assert_eq!(a.stats().tx_super_segments, 0);
    assert!(a.stats().tx_checksum_offloaded > 500);
    assert_eq!(b.link().rx_checksums_bad, 0);

    // Segmentation needs checksum offload: off, both are off.
    let (mut a, mut b) = hosts(SimOffload::Segment, |c| c.checksum_offload = false, |_| {});
    assert_eq!(a.config().tcp.max_super_segment, 0);
    assert!(!a.config().tcp.checksum_offload);
    transfer(&mut a, &mut b, 1 << 20);
    assert_eq!(
        a.stats().tx_super_segments + a.stats().tx_checksum_offloaded,
        0
    );

    // And a link without offloads gives neither.
    let (a, _b) = hosts(SimOffload::None, |_| {}, |_| {});
    assert_eq!(a.config().tcp.max_super_segment, 0);
    assert!(!a.config().tcp.checksum_offload);
}

#[test]
fn a_64k_segment_from_a_peer_is_taken_over_a_link_without_offloads() {
    // A hand-made 64 KiB segment (more than 44 times the MSS we advertised), complete
    // checksum, arriving on an interface whose link has no offloads: it is data like any
    // other, taken and acknowledged.
    let (mut a, mut b) = hosts(SimOffload::None, |_| {}, |_| {});
    let mut now = Instant::ZERO;
    b.listen(80, 4).unwrap();
    let ca = a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap();
    let mut cb = None;
    for _ in 0..100 {
        a.poll(now);
        b.poll(now);
        cb = cb.or_else(|| b.accept(80));
        if cb.is_some() && a.conn(ca).unwrap().state().is_synchronized() {
            break;
        }
        now += Duration::from_micros(20);
    }
    let cb = cb.expect("accepted");
    let conn = a.conn(ca).unwrap();
    let (_, snd_nxt, rcv_nxt) = conn.sequence_state();
    let payload = pattern(65_000);
    let repr = TcpRepr {
        src_port: conn.local().port(),
        dst_port: 80,
        seq: snd_nxt,
        ack: Some(rcv_nxt),
        flags: TcpFlags::PSH,
        window: 1000,
        urgent: 0,
        options: Default::default(),
    };
    let at = tcp_payload_offset(&repr);
    let mut frame = vec![0u8; at + payload.len()];
    frame[at..].copy_from_slice(&payload);
    let eth = EthernetRepr {
        src: MAC_A,
        dst: MAC_B,
        ethertype: EtherType::Ipv4,
    };
    let ip = Ipv4Repr {
        src: IP_A,
        dst: IP_B,
        protocol: IpProtocol::Tcp,
        payload_len: 0,
        ttl: 64,
        dscp_ecn: 0,
    };
    let n = emit_tcp_frame(&mut frame, &eth, &ip, 1, &repr, payload.len()).unwrap();
    b.receive_frame(now, &frame[..n]);
    let mut buf = vec![0u8; 70_000];
    let got = b.conn_mut(cb).unwrap().recv(&mut buf).unwrap();
    assert_eq!(got, payload.len());
    assert!(buf[..got] == payload[..]);
    assert_eq!(b.conn(cb).unwrap().rcv_nxt(), snd_nxt + payload.len());
    assert_eq!(b.stats().rx_large_frames, 1);
}

#[test]
fn a_stray_segment_vouched_for_reaches_the_hook_with_a_valid_checksum() {
    // Over a `Whole` link A's SYN leaves with a partial checksum and B is told it is
    // vouched for; B does not listen, so the SYN is stray: the hook's frame must verify.
    let (mut a, mut b) = hosts(SimOffload::Whole, |_| {}, |_| {});
    let now = Instant::ZERO;
    a.connect(SocketAddrV4::new(IP_B, 81), now).unwrap();
    a.poll(now);
    let mut seen = 0;
    b.poll_with(now + Duration::from_millis(1), &mut |s| {
        assert!(
            parse_tcp_frame(s.frame, true).is_ok(),
            "checksum of the hook's frame"
        );
        seen += 1;
        StrayVerdict::Drop
    });
    assert_eq!(seen, 1);
    assert_eq!(b.stats().rx_checksum_offloaded, 1);
    assert_eq!(b.stats().rx_stray_dropped, 1);
}
