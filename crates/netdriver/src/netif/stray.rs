//! Stray segments: TCP segments whose 4-tuple has no connection on this interface. The
//! callback of [`Interface::poll_with`](super::Interface::poll_with) sees each one
//! ([`StraySegment`]) before it would open a passive connection or be reset, and says
//! what becomes of it ([`StrayVerdict`]): the usual processing, forwarded to the
//! interface that owns the flow, or dropped. What the usual processing does not take is
//! answered with a reset (RFC 9293 §3.10.7.1; never a reset for a reset).

use std::net::{Ipv4Addr, SocketAddrV4};

use super::egress::Control;
use super::Core;
use crate::link::ETHERNET_HEADER_LEN;
use crate::tcp::rst_for_unexpected;
use crate::wire::{EthernetAddress, Ipv4Packet, TcpPacket, TcpRepr};

/// A received TCP segment whose 4-tuple matches no connection of this interface, as shown
/// to the callback of [`Interface::poll_with`](super::Interface::poll_with).
#[derive(Debug, Clone, Copy)]
pub struct StraySegment<'a> {
    /// Our side of the 4-tuple (destination of the segment).
    pub local: SocketAddrV4,
    /// The peer's side (source of the segment).
    pub remote: SocketAddrV4,
    /// Whether the segment is a plain SYN (no ACK, no RST) to a port this interface
    /// listens on: the usual processing would open a passive connection.
    pub syn_to_listener: bool,
    /// Whether the segment is a bare ACK to a port this interface listens on while SYN
    /// cookies are in use: the usual processing checks it for a cookie and, if it holds
    /// one, opens a passive connection.
    pub cookie_ack: bool,
    /// The whole Ethernet frame, checksums verified.
    pub frame: &'a [u8],
}

/// What [`Interface::poll_with`](super::Interface::poll_with) does with a [`StraySegment`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StrayVerdict {
    /// The usual processing: open a passive connection for a SYN to a listener (room
    /// permitting), else answer with a RST.
    Local,
    /// The callback took a copy of the frame to hand to the interface that owns the flow;
    /// nothing is sent from here. Counted in
    /// [`InterfaceStats::rx_forwarded`](super::InterfaceStats::rx_forwarded).
    Forwarded,
    /// Drop silently (e.g. the owner's forwarding queue is full; TCP retransmits). Counted in
    /// [`InterfaceStats::rx_stray_dropped`](super::InterfaceStats::rx_stray_dropped).
    Drop,
}

/// The callback of [`Interface::poll_with`](super::Interface::poll_with) and
/// [`Interface::receive_frame_with`](super::Interface::receive_frame_with).
pub type StrayHook<'a> = dyn FnMut(&StraySegment<'_>) -> StrayVerdict + 'a;

/// Recomputes the TCP checksum of an Ethernet/IPv4/TCP `frame` in place (nothing happens
/// to a frame that is not one).
pub(super) fn complete_tcp_checksum(frame: &mut [u8]) {
    let Some(ip_bytes) = frame.get_mut(ETHERNET_HEADER_LEN..) else {
        return;
    };
    let Ok(mut ipp) = Ipv4Packet::new_checked(ip_bytes) else {
        return;
    };
    let (src, dst) = (ipp.src_addr(), ipp.dst_addr());
    let Ok(mut tp) = TcpPacket::new_checked(ipp.payload_mut()) else {
        return;
    };
    tp.fill_checksum(src, dst);
}

impl Core {
    pub(super) fn reset(
        &mut self,
        src_mac: EthernetAddress,
        src_ip: Ipv4Addr,
        repr: &TcpRepr,
        len: usize,
    ) {
        if let Some(rst) = rst_for_unexpected(repr, len) {
            let dst_mac = *self.neighbors.get(&src_ip).unwrap_or(&src_mac);
            self.queue_control(Control::Rst {
                dst_mac,
                dst_ip: src_ip,
                repr: rst,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::link::sim::{self, SimConfig, SimLink};
    use crate::link::Link;
    use crate::netif::tests::{host, hosts, run_until, IP_A, IP_B, MAC_A, MAC_B};
    use crate::netif::Interface;
    use crate::tcp::State;
    use crate::time::{Duration, Instant};

    use super::*;

    #[test]
    fn connecting_to_a_closed_port_is_refused() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        let ca = a.connect(SocketAddrV4::new(IP_B, 81), now).unwrap();
        run_until(&mut a, &mut b, &mut now, |a, _| {
            a.conn(ca).is_none_or(|c| c.is_closed())
        });
        assert_eq!(b.stats().tx_rst, 1);
        assert_eq!(b.stats().rx_no_connection, 1);
        // Refused, and forgotten.
        assert!(a.conn(ca).is_none());
        assert_eq!(a.connection_count(), 0);
    }

    /// A SYN for no connection of B, shown to B's stray hook.
    fn stray_syn_to(b_port: u16, listen: bool) -> (Interface<SimLink>, Interface<SimLink>, u16) {
        let (mut a, mut b) = hosts();
        if listen {
            b.listen(b_port, 4).unwrap();
        }
        let h = a
            .connect_from(40_000, SocketAddrV4::new(IP_B, b_port), Instant::ZERO)
            .unwrap();
        assert_eq!(a.conn(h).unwrap().local(), SocketAddrV4::new(IP_A, 40_000));
        a.poll(Instant::ZERO);
        (a, b, 40_000)
    }

    #[test]
    fn stray_hook_sees_unknown_flows_and_its_verdict_holds() {
        for (listen, verdict) in [
            (false, StrayVerdict::Local),
            (false, StrayVerdict::Forwarded),
            (true, StrayVerdict::Drop),
            (true, StrayVerdict::Local),
        ] {
            let (_a, mut b, port) = stray_syn_to(80, listen);
            let mut seen = Vec::new();
            b.poll_with(Instant::from_micros(100), &mut |s| {
                seen.push((s.local, s.remote, s.syn_to_listener, s.frame.to_vec()));
                verdict
            });
            assert_eq!(seen.len(), 1, "{listen} {verdict:?}");
            let (local, remote, syn_to_listener, frame) = &seen[0];
            assert_eq!(*local, SocketAddrV4::new(IP_B, 80));
            assert_eq!(*remote, SocketAddrV4::new(IP_A, port));
            assert_eq!(*syn_to_listener, listen);
            let tf = crate::wire::parse_tcp_frame(frame, true).unwrap();
            assert!(tf.tcp.flags.syn() && tf.tcp.ack.is_none());
            let s = b.stats();
            let expect = |rst, fwd, dropped, conns| {
                assert_eq!(
                    (
                        s.tx_rst,
                        s.rx_forwarded,
                        s.rx_stray_dropped,
                        b.connection_count()
                    ),
                    (rst, fwd, dropped, conns),
                    "{listen} {verdict:?}"
                )
            };
            match (listen, verdict) {
                (false, StrayVerdict::Local) => expect(1, 0, 0, 0),
                (_, StrayVerdict::Forwarded) => expect(0, 1, 0, 0),
                (_, StrayVerdict::Drop) => expect(0, 0, 1, 0),
                (true, StrayVerdict::Local) => expect(0, 0, 0, 1),
            }
        }
    }

    #[test]
    fn known_flows_never_reach_the_stray_hook() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        b.listen(80, 4).unwrap();
        a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap();
        let mut calls = 0;
        for _ in 0..20 {
            a.poll(now);
            b.poll_with(now, &mut |s| {
                calls += 1;
                assert!(s.syn_to_listener);
                StrayVerdict::Local
            });
            now += Duration::from_micros(50);
        }
        // Only the SYN was stray; the rest of the handshake found the connection.
        assert_eq!(calls, 1);
        assert!(b.accept(80).is_some());
    }

    #[test]
    fn a_forwarded_syn_opens_the_connection_on_the_owner() {
        let (_a, mut b, port) = stray_syn_to(80, false);
        let mut taken = None;
        b.poll_with(Instant::from_micros(100), &mut |s| {
            taken = Some(s.frame.to_vec());
            StrayVerdict::Forwarded
        });
        // The owner: same addresses, its own link, listening on the port.
        let (lo, mut peer) = sim::pair(SimConfig::default());
        let mut owner = host(lo, MAC_B, IP_B);
        owner.add_neighbor(IP_A, MAC_A);
        owner.listen(80, 4).unwrap();
        let syn = taken.unwrap();
        owner.receive_frame(Instant::from_micros(200), &syn);
        let local = SocketAddrV4::new(IP_B, 80);
        let remote = SocketAddrV4::new(IP_A, port);
        let h = owner.lookup(local, remote).expect("passive connection");
        assert_eq!(owner.conn(h).unwrap().state(), State::SynReceived);
        owner.poll(Instant::from_micros(200));
        let mut frames = Vec::new();
        peer.recv_batch(Instant::from_millis(1), 8, &mut |f| frames.push(f.to_vec()));
        assert_eq!(frames.len(), 1);
        let tf = crate::wire::parse_tcp_frame(&frames[0], true).unwrap();
        assert!(tf.tcp.flags.syn() && tf.tcp.flags.ack());
        assert_eq!((tf.tcp.src_port, tf.tcp.dst_port), (80, port));
        // A forwarded segment for no flow and no listener is reset as usual.
        let mut lone = host(sim::pair(SimConfig::default()).0, MAC_B, IP_B);
        lone.add_neighbor(IP_A, MAC_A);
        lone.receive_frame(Instant::ZERO, &syn);
        assert_eq!(lone.stats().rx_no_connection, 1);
        assert_eq!(lone.connection_count(), 0);
    }
}
