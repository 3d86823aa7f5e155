//! Our side of the bulk-transfer benchmark: two `netif::Interface`s over the simulated link
//! (whole Ethernet frames, IPv4 and TCP checksums computed and verified), one connection
//! carrying `bytes` one way.

use std::net::{Ipv4Addr, SocketAddrV4};

use netchannel::netdriver::link::fault::{FaultConfig, FaultDirection, FaultInjector};
use netchannel::netdriver::link::sim::{self, SimConfig, SimOffload};
use netchannel::netdriver::link::Link;
use netchannel::netdriver::netif::{Interface, InterfaceConfig};
use netchannel::netdriver::tcp::Config;
use netchannel::netdriver::time::{Duration, Instant};
use netchannel::netdriver::wire::EthernetAddress;

use super::pattern;

/// What one transfer achieved.
pub struct Outcome {
    /// Bytes the receiver read (equals the request unless the transfer stalled).
    pub received: usize,
    /// Virtual time from the SYN to the last byte read.
    pub elapsed: Duration,
    /// Segments the sender retransmitted.
    pub retransmitted: u64,
    /// The receiver's receive buffer at the end (grown by auto-tuning, if on).
    pub rx_buffer: usize,
}

/// Transfers `bytes` over a link with the given one-way `latency`, `bandwidth_bps`
/// (`None` = infinite) and receive-side `loss` rate (seeded).
pub fn transfer(
    bytes: usize,
    buffer: usize,
    ip_mtu: usize,
    latency: Duration,
    bandwidth_bps: Option<u64>,
    loss: f64,
) -> Outcome {
    transfer_with(bytes, buffer, ip_mtu, latency, bandwidth_bps, loss, |_| {})
}

/// The per-core comparison with smoltcp: [`transfer`] over a zero-latency,
/// infinite-bandwidth link with Nagle and delayed ACK off on both ends (as the smoltcp peer
/// runs). Returns the bytes received and checked.
pub fn bulk(bytes: usize, buffer: usize, ip_mtu: usize) -> usize {
    let (la, lb) = sim::pair(SimConfig {
        latency: Duration::ZERO,
        mtu: ip_mtu,
        ..SimConfig::default()
    });
    // No fault injector: the smoltcp peer's link has none either.
    run(la, lb, bytes, buffer, |c| {
        c.nagle = false;
        c.delayed_ack = None;
    })
    .received
}

/// [`bulk`] with super-segments: the link carries them whole with their checksums left
/// partial and vouched for ([`SimOffload::Whole`], as veth between two ends that offload,
/// or a NIC with TSO, GRO and checksum offload), so each 64 KiB costs the TCP one
/// segment's work and no byte is summed. The per-core figure of the TCP with the
/// offloads the GSO link gives it.
pub fn bulk_large(bytes: usize, buffer: usize, ip_mtu: usize) -> usize {
    let (la, lb) = sim::pair(SimConfig {
        latency: Duration::ZERO,
        mtu: ip_mtu,
        offload: SimOffload::Whole,
        ..SimConfig::default()
    });
    run(la, lb, bytes, buffer, |c| {
        c.nagle = false;
        c.delayed_ack = None;
    })
    .received
}

/// [`transfer`] with `tweak` applied to both ends' TCP configuration (for A/B runs of
/// loss recovery).
pub fn transfer_with(
    bytes: usize,
    buffer: usize,
    ip_mtu: usize,
    latency: Duration,
    bandwidth_bps: Option<u64>,
    loss: f64,
    tweak: impl Fn(&mut Config),
) -> Outcome {
    let (la, lb) = sim::pair(SimConfig {
        latency,
        bandwidth_bps,
        mtu: ip_mtu,
        ..SimConfig::default()
    });
    let faults = |seed| FaultConfig {
        loss,
        seed,
        direction: FaultDirection::Rx,
        ..FaultConfig::default()
    };
    run(
        FaultInjector::new(la, faults(1)),
        FaultInjector::new(lb, faults(2)),
        bytes,
        buffer,
        tweak,
    )
}

/// Two interfaces over `la` and `lb`, one connection from A to B carrying `bytes` (each
/// byte checked on arrival), driven in virtual time.
fn run<L: Link>(la: L, lb: L, bytes: usize, buffer: usize, tweak: impl Fn(&mut Config)) -> Outcome {
    let mac_a = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
    let mac_b = EthernetAddress([2, 0, 0, 0, 0, 0xb]);
    let ip_a = Ipv4Addr::new(10, 77, 0, 1);
    let ip_b = Ipv4Addr::new(10, 77, 0, 2);
    let host = |link, mac, ip| {
        let mut tcp = Config {
            rx_buffer: buffer,
            // Fixed, as smoltcp's (the like-for-like comparison); `tweak` may turn
            // auto-tuning on.
            rx_buffer_max: None,
            tx_buffer: buffer,
            tx_buffer_max: None,
            min_rto: Duration::from_millis(1),
            ..Config::default()
        };
        tweak(&mut tcp);
        Interface::new(
            link,
            InterfaceConfig {
                mac,
                ipv4: ip,
                tcp,
                isn_key: Some([7; 16]),
                rx_batch: std::env::var("TCP_BULK_RX_BATCH")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(InterfaceConfig::default().rx_batch),
                ..InterfaceConfig::default()
            },
        )
    };
    let mut a = host(la, mac_a, ip_a);
    let mut b = host(lb, mac_b, ip_b);
    a.add_neighbor(ip_b, mac_b);
    b.add_neighbor(ip_a, mac_a);
    b.listen(7000, 1).expect("listen");

    let start = Instant::ZERO;
    let mut now = start;
    let client = a
        .connect(SocketAddrV4::new(ip_b, 7000), now)
        .expect("connect");
    let mut server = None;
    let pattern = pattern::pattern();
    let lend = pattern::recv_lends();
    let mut sink = vec![0u8; 64 * 1024];
    let (mut sent, mut received) = (0usize, 0usize);
    let mut idle_rounds = 0u32;
    let mut rounds = 0u64;
    while received < bytes {
        rounds += 1;
        let mut progressed = a.poll(now) | b.poll(now);
        if let Some(c) = a.conn_mut(client) {
            while sent < bytes {
                match c.send(pattern::next(&pattern, sent, bytes - sent)) {
                    Ok(0) => break,
                    Ok(n) => {
                        sent += n;
                        progressed = true;
                    }
                    Err(_) => break,
                }
            }
        }
        if server.is_none() {
            server = b.accept(7000);
        }
        if let Some(s) = server.and_then(|h| b.conn_mut(h)) {
            loop {
                let got = if lend {
                    let mut at = received;
                    s.recv_with(usize::MAX, |bytes| {
                        assert!(
                            pattern::check(&pattern, at, bytes),
                            "a wrong byte near offset {at}"
                        );
                        at += bytes.len();
                    })
                } else {
                    s.recv(&mut sink).inspect(|&n| {
                        assert!(
                            pattern::check(&pattern, received, &sink[..n]),
                            "a wrong byte near offset {received}"
                        );
                    })
                };
                match got {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        received += n;
                        progressed = true;
                    }
                }
            }
        }
        if progressed {
            idle_rounds = 0;
            continue;
        }
        idle_rounds += 1;
        if idle_rounds > 10_000 {
            break;
        }
        // Nothing moved: jump virtual time to the next event (frame delivery or timer).
        let next = [a.poll_at(), b.poll_at()].into_iter().flatten().min();
        now = match next {
            Some(t) if t > now => t,
            _ => now + Duration::from_micros(1),
        };
    }
    if std::env::var_os("TCP_BULK_DEBUG").is_some() {
        eprintln!(
            "rounds {rounds}, frames: a {:?} b {:?}; interface a {:?}; b {:?}",
            a.link().stats(),
            b.link().stats(),
            a.stats(),
            b.stats(),
        );
    }
    let retransmitted = a
        .conn(client)
        .map(|c| c.stats().retransmitted_segments)
        .unwrap_or(0);
    let rx_buffer = server
        .and_then(|h| b.conn(h))
        .map_or(0, |c| c.stats().rx_buffer);
    Outcome {
        received,
        elapsed: now - start,
        retransmitted,
        rx_buffer,
    }
}
