//! Receiving: each frame parsed Ethernet → IPv4 (header checksum verified, RFC 791) →
//! TCP, its checksum (RFC 9293 §3.1) completed from the payload's sum as the fast path
//! copies the payload into its connection's ring, unless the link vouched for it;
//! anything malformed, corrupt, not ours or not understood is a counted drop. ARP
//! requests for our address are answered, and teach us the sender (RFC 826). A segment
//! goes to the connection with its 4-tuple; a new SYN ends a TIME-WAIT, connection or
//! record, early (RFC 6191); a segment for a TIME-WAIT record is answered or ignored by
//! the record (RFC 9293 §3.10.7.4); anything else is a stray segment, shown to the hook
//! and then opened by a listener or reset. The [`RxDrop`] fault injection drops data
//! segments here, before any connection sees them.

use std::net::SocketAddrV4;

use super::egress::Control;
use super::stray::{complete_tcp_checksum, StrayHook, StraySegment, StrayVerdict};
use super::{Core, InterfaceStats};
use crate::link::{RxMeta, ETHERNET_HEADER_LEN};
use crate::tcp::time_wait::TimeWaitInput;
use crate::tcp::State;
use crate::time::Instant;
use crate::wire::checksum;
use crate::wire::{
    ArpOperation, ArpPacket, ArpRepr, EtherType, EthernetAddress, EthernetFrame, EthernetRepr,
    IpProtocol, Ipv4Packet, Ipv4Repr, Parts, TcpPacket, TcpRepr, WireError,
};

/// Fault injection for tests and failure drills
/// ([`Interface::drop_received`](super::Interface::drop_received)): received
/// TCP segments carrying data from `from` are counted, and once `skip` of them have been
/// taken, the next `count` are dropped before any connection sees them, as if lost on the
/// wire after the sender's TCP sent them. Drives a real peer's (a Linux kernel's) loss
/// recovery, which no drop on the peer's own side can: netfilter there is a local error its
/// TCP sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxDrop {
    /// The sender whose segments are counted.
    pub from: SocketAddrV4,
    /// Data segments to let through first.
    pub skip: u64,
    /// Data segments to drop after them.
    pub count: u64,
    /// Data segments from `from` seen so far (set to 0 when installing the rule).
    pub seen: u64,
    /// Dropped so far (set to 0 when installing the rule).
    pub dropped: u64,
}

impl RxDrop {
    /// Whether the data segment just seen from `remote` is to be dropped; counts it.
    fn drops(&mut self, remote: SocketAddrV4) -> bool {
        if remote != self.from {
            return false;
        }
        self.seen += 1;
        if self.seen > self.skip && self.dropped < self.count {
            self.dropped += 1;
            return true;
        }
        false
    }
}

/// A TCP checksum still to be completed by the payload's sum (see `receive_tcp`).
#[derive(Debug, Clone, Copy)]
struct PendingChecksum {
    /// Folded sum of the pseudo-header and the TCP header.
    head_sum: u16,
    /// Whether a checksum holding only the pseudo-header sum is accepted for this segment
    /// ([`InterfaceConfig::accept_partial_checksums`](super::InterfaceConfig::accept_partial_checksums)
    /// and the field says so).
    partial_ok: bool,
    /// The link vouched for the checksum ([`RxMeta::checksum_verified`]).
    verified: bool,
}

/// How a parse error is counted.
fn count_error(stats: &mut InterfaceStats, e: WireError) {
    match e {
        WireError::Truncated | WireError::Malformed => stats.rx_malformed += 1,
        WireError::Checksum => stats.rx_bad_checksum += 1,
        WireError::Unsupported => stats.rx_unsupported += 1,
    }
}

/// Whether `head`, the first buffer of a chained frame, holds its Ethernet, IPv4 and TCP
/// headers whole (what the lengths in them claim; garbage lengths are judged later).
fn headers_fit(head: &[u8]) -> bool {
    let ip = ETHERNET_HEADER_LEN;
    let Some(&ver_ihl) = head.get(ip) else {
        return false;
    };
    let tcp = ip + usize::from(ver_ihl & 0x0f) * 4;
    head.get(tcp + 12)
        .is_some_and(|&off| head.len() >= tcp + usize::from(off >> 4) * 4)
}

impl Core {
    /// Handles one received frame lent as its buffers in order
    /// ([`Link::recv_batch_parts`](crate::link::Link::recv_batch_parts)). A frame in
    /// several buffers is parsed where it lies: its headers must all lie in the first
    /// one (else it is refused and counted), and its payload reaches TCP as [`Parts`].
    #[inline]
    pub(super) fn receive_parts(
        &mut self,
        now: Instant,
        parts: &[&[u8]],
        meta: RxMeta,
        stray: &mut StrayHook<'_>,
    ) {
        match parts {
            [] => self.receive(now, &[], meta, stray),
            [frame] => self.receive(now, frame, meta, stray),
            _ => {
                let frame = Parts::of(parts);
                if !headers_fit(frame.first()) {
                    self.stats.rx_frames += 1;
                    self.stats.rx_chain_headers_split += 1;
                    return;
                }
                self.stats.rx_chains += 1;
                self.receive_view(now, frame, meta, stray);
            }
        }
    }

    /// Handles one received frame. Never panics: every failure is a counted drop.
    pub(super) fn receive(
        &mut self,
        now: Instant,
        frame: &[u8],
        meta: RxMeta,
        stray: &mut StrayHook<'_>,
    ) {
        self.receive_view(now, Parts::whole(frame), meta, stray);
    }

    /// [`receive`](Self::receive) for a frame whose headers lie in its first slice.
    fn receive_view(
        &mut self,
        now: Instant,
        frame: Parts<'_>,
        meta: RxMeta,
        stray: &mut StrayHook<'_>,
    ) {
        self.stats.rx_frames += 1;
        let head = frame.first();
        let ef = match EthernetFrame::new_checked(head) {
            Ok(ef) => ef,
            Err(e) => return count_error(&mut self.stats, e),
        };
        let eth = match EthernetRepr::parse(&ef) {
            Ok(eth) => eth,
            Err(e) => return count_error(&mut self.stats, e),
        };
        if eth.dst != self.config.mac && !eth.dst.is_broadcast() {
            self.stats.rx_not_ours += 1;
            return;
        }
        match eth.ethertype {
            EtherType::Arp => match frame.as_slice() {
                Some(_) => self.receive_arp(ef.payload_slice()),
                None => self.stats.rx_malformed += 1,
            },
            EtherType::Ipv4 if eth.dst == self.config.mac => {
                self.receive_ipv4(now, eth.src, frame, meta, stray)
            }
            EtherType::Ipv4 => self.stats.rx_not_ours += 1,
            EtherType::Unknown(_) => self.stats.rx_unsupported += 1,
        }
    }

    fn receive_arp(&mut self, packet: &[u8]) {
        let arp = match ArpPacket::new_checked(packet).and_then(|p| ArpRepr::parse(&p)) {
            Ok(arp) => arp,
            Err(e) => return count_error(&mut self.stats, e),
        };
        if arp.target_ip != self.config.ipv4 {
            self.stats.rx_not_ours += 1;
            return;
        }
        self.stats.rx_arp += 1;
        // RFC 826: a packet addressed to us teaches us the sender's mapping. Static entries
        // are not overridden: the table is configuration first.
        if arp.source_hw.is_unicast() && !arp.source_ip.is_unspecified() {
            self.neighbors.entry(arp.source_ip).or_insert(arp.source_hw);
        }
        if arp.operation == ArpOperation::Request {
            self.queue_control(Control::ArpReply(ArpRepr {
                operation: ArpOperation::Reply,
                source_hw: self.config.mac,
                source_ip: self.config.ipv4,
                target_hw: arp.source_hw,
                target_ip: arp.source_ip,
            }));
        }
    }

    /// `frame`: the whole frame, its IPv4 and TCP headers in its first slice (a
    /// contiguous frame, or a chain [`headers_fit`] passed).
    fn receive_ipv4(
        &mut self,
        now: Instant,
        src_mac: EthernetAddress,
        frame: Parts<'_>,
        meta: RxMeta,
        stray: &mut StrayHook<'_>,
    ) {
        let head = frame.first();
        let ipp = Ipv4Packet::new_unchecked(head.get(ETHERNET_HEADER_LEN..).unwrap_or_default());
        let datagram_len = frame.len().saturating_sub(ETHERNET_HEADER_LEN);
        let ip = match Ipv4Repr::parse_within(&ipp, datagram_len, true) {
            Ok(ip) => ip,
            Err(e) => return count_error(&mut self.stats, e),
        };
        if ip.dst != self.config.ipv4 {
            self.stats.rx_not_ours += 1;
            return;
        }
        if ip.protocol != IpProtocol::Tcp {
            self.stats.rx_unsupported += 1;
            return;
        }
        // The segment, cut to the IPv4 total length (Ethernet padding left out), and its
        // front in the first slice, where the TCP header lies.
        let segment = frame
            .skip(ETHERNET_HEADER_LEN + ipp.header_len())
            .take(ip.payload_len);
        let tp = match TcpPacket::new_checked(segment.first()) {
            Ok(tp) => tp,
            Err(e) => return count_error(&mut self.stats, e),
        };
        let seg_len = u32::try_from(segment.len()).unwrap_or(u32::MAX);
        let pseudo = checksum::pseudo_header_v4(ip.src, ip.dst, IpProtocol::Tcp.into(), seg_len);
        // The checksum is verified in `receive_tcp`, from the pseudo-header and header sum
        // taken here and a payload sum that the receive fast path computes while copying
        // the payload into the connection's ring (one pass over the bytes, not two).
        let verified = meta.checksum_verified;
        // A partial checksum holds the pseudo-header sum alone (see
        // `TcpPacket::has_partial_checksum`).
        let partial_ok =
            !verified && self.config.accept_partial_checksums && tp.checksum() == pseudo;
        if frame.len() > self.link_frame_len {
            self.stats.rx_large_frames += 1;
        }
        let repr = match TcpRepr::parse(&tp, ip.src, ip.dst, false) {
            Ok((repr, _)) => repr,
            Err(e) => {
                // A corrupt segment is counted as corrupt even when the corruption also
                // broke its header, as verifying first would count it.
                let bad =
                    !verified && !partial_ok && checksum::add(pseudo, segment.sum()) != 0xffff;
                return count_error(&mut self.stats, if bad { WireError::Checksum } else { e });
            }
        };
        let header_len = tp.header_len();
        let header = segment.first().get(..header_len).unwrap_or_default();
        let payload = segment.skip(header_len);
        let check = PendingChecksum {
            head_sum: checksum::add(pseudo, checksum::data(header)),
            partial_ok,
            verified,
        };
        self.receive_tcp(now, src_mac, &ip, &repr, payload, check, frame, stray);
    }

    // The frame and the hook travel with the parsed headers so that a stray segment can be
    // handed on whole.
    #[allow(clippy::too_many_arguments)]
    fn receive_tcp(
        &mut self,
        now: Instant,
        src_mac: EthernetAddress,
        ip: &Ipv4Repr,
        repr: &TcpRepr,
        payload: Parts<'_>,
        check: PendingChecksum,
        frame: Parts<'_>,
        stray: &mut StrayHook<'_>,
    ) {
        let local = SocketAddrV4::new(ip.dst, repr.dst_port);
        let remote = SocketAddrV4::new(ip.src, repr.src_port);
        if !payload.is_empty() && self.rx_drop.as_mut().is_some_and(|r| r.drops(remote)) {
            return;
        }
        let key = (local, remote);
        let found = match self.last_flow {
            Some((k, index)) if k == key => Some(index),
            _ => {
                let index = self.by_tuple.get(&key).copied();
                if let Some(index) = index {
                    self.last_flow = Some((key, index));
                }
                index
            }
        };
        let conn = found.and_then(|index| self.slots.get_mut(index as usize)?.conn.as_mut());
        // Verify the checksum before anything depends on the segment. For the next
        // in-order payload of an established connection, the sum comes from copying the
        // payload into the receive ring (see `Connection::place_payload`); otherwise from
        // reading it. A payload whose checksum the link vouched for is placed without it.
        let placed = conn.and_then(|c| c.place_payload(repr.seq, payload, !check.verified));
        let sum_ok = if check.verified {
            // Vouched for by the link; the sum (if any) is not needed.
            self.stats.rx_checksum_offloaded += 1;
            true
        } else {
            let payload_sum = placed.unwrap_or_else(|| payload.sum());
            checksum::add(check.head_sum, payload_sum) == 0xffff
        };
        if !sum_ok {
            if !check.partial_ok {
                // Whatever was placed lies in free ring space and is never committed:
                // the marker dies with the next `handle_segment*`.
                return count_error(&mut self.stats, WireError::Checksum);
            }
            // A Linux peer with tx checksum offload on, across a link that never
            // completes the sum (veth): trusted the way Linux trusts CHECKSUM_PARTIAL.
            self.stats.rx_partial_checksum += 1;
        }
        if let Some(index) = found {
            let reopen = match self
                .slots
                .get_mut(index as usize)
                .and_then(|s| s.conn.as_mut())
            {
                Some(conn) => {
                    // RFC 6191: a new SYN may end TIME-WAIT early; the old incarnation goes
                    // and the SYN is treated as if it found no connection.
                    if conn.state() == State::TimeWait && conn.accepts_new_syn_in_time_wait(repr) {
                        true
                    } else {
                        self.stats.rx_segments += 1;
                        if placed.is_some() {
                            conn.handle_segment_placed(now, repr, payload);
                        } else {
                            conn.handle_segment_parts(now, repr, payload);
                        }
                        false
                    }
                }
                None => false,
            };
            if !reopen {
                return;
            }
            self.stats.time_wait_reopened += 1;
            self.remove(index);
        } else if !self.time_wait.is_empty() {
            let input = self.time_wait.on_segment(
                local,
                remote,
                now,
                repr,
                payload.len(),
                self.config.tcp.time_wait,
                self.config.tcp.invalid_ack_interval,
            );
            match input {
                None => {}
                Some(TimeWaitInput::Reopen) => self.stats.time_wait_reopened += 1,
                Some(TimeWaitInput::Ignore) => {
                    self.stats.rx_time_wait += 1;
                    return;
                }
                Some(TimeWaitInput::Answer(ack)) => {
                    self.stats.rx_time_wait += 1;
                    let dst_mac = *self.neighbors.get(&ip.src).unwrap_or(&src_mac);
                    self.queue_control(Control::TimeWaitAck {
                        dst_mac,
                        dst_ip: ip.src,
                        repr: ack,
                    });
                    return;
                }
            }
        }
        let plain_syn = repr.flags.syn() && !repr.flags.rst() && repr.ack.is_none();
        let listening = self.listeners.contains_key(&repr.dst_port);
        let syn_to_listener = plain_syn && listening;
        // Checked for a cookie only while cookies are out: otherwise a blind guess of an
        // ACK could open a connection at any time (Linux's "recent overflow" test).
        let bare_ack = repr.ack.is_some() && !repr.flags.syn() && !repr.flags.rst();
        let cookie_ack =
            bare_ack && listening && self.config.syn_cookies && self.cookies.recently_sent(now);
        // The hook's frame carries a valid checksum: one the link vouched for may hold a
        // stale or partial field, completed here in a copy (stray segments are rare).
        // A chained frame is gathered here too (the hook takes one slice).
        let frame = match frame.as_slice() {
            Some(frame) if !check.verified => frame,
            _ => {
                self.stray_scratch.clear();
                frame.extend_into(&mut self.stray_scratch);
                if check.verified {
                    complete_tcp_checksum(&mut self.stray_scratch);
                }
                &self.stray_scratch[..]
            }
        };
        let verdict = stray(&StraySegment {
            local,
            remote,
            syn_to_listener,
            cookie_ack,
            frame,
        });
        match verdict {
            StrayVerdict::Local => {}
            StrayVerdict::Forwarded => {
                self.stats.rx_forwarded += 1;
                return;
            }
            StrayVerdict::Drop => {
                self.stats.rx_stray_dropped += 1;
                return;
            }
        }
        if syn_to_listener {
            self.passive_open(now, src_mac, local, remote, repr, payload.len());
            return;
        }
        if cookie_ack {
            // A cookie ACK's data, if chained, is gathered (a rare path).
            let mut gathered = Vec::new();
            let data = match payload.as_slice() {
                Some(p) => p,
                None => {
                    payload.extend_into(&mut gathered);
                    &gathered[..]
                }
            };
            if self.cookie_open(now, src_mac, local, remote, repr, data) {
                return;
            }
        }
        if cookie_ack && !self.cookie_room(local.port()) {
            // While the listener has no room its peers' cookie ACKs are dropped, so a
            // later segment of such a peer (its FIN after its data) carries no cookie
            // that verifies. Dropped, not reset: the data's retransmission carries the
            // cookie once the application accepts again.
            self.stats.accept_queue_full += 1;
            return;
        }
        self.stats.rx_no_connection += 1;
        self.reset(src_mac, ip.src, repr, payload.len());
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use crate::link::sim::{self, SimConfig};
    use crate::link::Link;
    use crate::netif::tests::{host, hosts, run_until, tcp_config, IP_A, IP_B, MAC_A, MAC_B};
    use crate::netif::{Interface, InterfaceConfig};
    use crate::tcp::TcpError;
    use crate::time::Duration;
    use crate::wire::TcpFlags;

    use super::*;

    #[test]
    fn a_corrupt_in_order_payload_placed_by_the_fast_path_is_never_delivered() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        b.listen(80, 4).unwrap();
        let ca = a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap();
        let mut cb = None;
        run_until(&mut a, &mut b, &mut now, |_, b| {
            cb = cb.or_else(|| b.accept(80));
            cb.is_some()
        });
        let cb = cb.unwrap();
        // Let the handshake's last ACK land, then take A's data frames off the wire.
        run_until(&mut a, &mut b, &mut now, |_, b| {
            b.link().incoming_len() == 0
        });
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
        assert_eq!(a.conn_mut(ca).unwrap().send(&data).unwrap(), data.len());
        a.poll(now);
        now += Duration::from_millis(1);
        let mut frames = Vec::new();
        b.link_mut()
            .recv_batch(now, usize::MAX, &mut |f| frames.push(f.to_vec()));
        assert!(frames.len() >= 2, "{} frames", frames.len());
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        for good in &frames {
            // A flipped payload bit: the checksum catches it after the fast path has
            // copied the payload into the ring, and nothing becomes readable.
            let mut bad = good.clone();
            let last = bad.len() - 1;
            bad[last] ^= 0x10;
            let before = b.stats().rx_bad_checksum;
            b.receive_frame(now, &bad);
            assert_eq!(b.stats().rx_bad_checksum, before + 1);
            assert_eq!(
                b.conn_mut(cb).unwrap().recv(&mut buf),
                Err(TcpError::WouldBlock)
            );
            // The intact frame is delivered, byte for byte.
            b.receive_frame(now, good);
            while let Ok(n) = b.conn_mut(cb).unwrap().recv(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
        }
        // Whatever the initial window let out, intact and in order.
        assert!(got.len() >= 2000, "{} bytes", got.len());
        assert!(got[..] == data[..got.len()], "delivered bytes differ");
    }

    #[test]
    fn answers_arp_requests_for_its_address() {
        let (la, mut peer) = sim::pair(SimConfig::default());
        let mut a = host(la, MAC_A, IP_A);
        let req = |target: Ipv4Addr| {
            let arp = ArpRepr {
                operation: ArpOperation::Request,
                source_hw: MAC_B,
                source_ip: IP_B,
                target_hw: EthernetAddress([0; 6]),
                target_ip: target,
            };
            let mut f = vec![0u8; 42];
            EthernetRepr {
                src: MAC_B,
                dst: EthernetAddress::BROADCAST,
                ethertype: EtherType::Arp,
            }
            .emit(&mut f)
            .unwrap();
            arp.emit(&mut f[14..]).unwrap();
            f
        };
        peer.send_frame(Instant::ZERO, &req(Ipv4Addr::new(10, 0, 0, 99)));
        peer.send_frame(Instant::ZERO, &req(IP_A));
        peer.flush(Instant::ZERO);
        a.poll(Instant::from_micros(10));
        let mut replies = Vec::new();
        peer.recv_batch(Instant::from_micros(20), 8, &mut |f| {
            replies.push(f.to_vec())
        });
        assert_eq!(replies.len(), 1);
        let ef = EthernetFrame::new_checked(&replies[0][..]).unwrap();
        assert_eq!(ef.dst_addr(), MAC_B);
        let arp = ArpRepr::parse(&ArpPacket::new_checked(ef.payload_slice()).unwrap()).unwrap();
        assert_eq!(arp.operation, ArpOperation::Reply);
        assert_eq!((arp.source_hw, arp.source_ip), (MAC_A, IP_A));
        assert_eq!(a.stats().tx_arp_replies, 1);
        assert_eq!(a.stats().rx_not_ours, 1);
        // And it learnt where 10.0.0.2 is.
        assert!(a.connect(SocketAddrV4::new(IP_B, 1), Instant::ZERO).is_ok());
    }

    #[test]
    fn garbage_frames_are_counted_never_fatal() {
        use rand::{Rng, SeedableRng};
        let (la, mut peer) = sim::pair(SimConfig::default());
        let mut a = host(la, MAC_A, IP_A);
        a.listen(80, 8).unwrap();
        // A valid SYN to mutate.
        let valid = syn_frame(b"", |full, _| full);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let mut now = Instant::ZERO;
        for i in 0..5000u32 {
            let mut f = valid.clone();
            match i % 4 {
                0 => f.truncate(rng.gen_range(0..f.len())),
                1 => {
                    let bit = rng.gen_range(14 * 8..f.len() * 8);
                    f[bit / 8] ^= 1 << (bit % 8);
                }
                2 => f = (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect(),
                _ => {
                    // Keep the headers, random bytes for IP and TCP.
                    for b in &mut f[14..] {
                        *b = rng.gen();
                    }
                }
            }
            peer.send_frame(now, &f);
            peer.flush(now);
            now += Duration::from_micros(1);
            a.poll(now);
        }
        a.poll(now + Duration::from_millis(1));
        let s = a.stats();
        assert_eq!(s.rx_frames, 5000);
        assert!(s.rx_malformed > 0 && s.rx_bad_checksum > 0 && s.rx_not_ours > 0);
        // Every single-bit flip past the Ethernet header was caught.
        assert_eq!(a.connection_count(), 0, "{s:?}");
    }

    /// A SYN from B to A's port 80 with `payload`, its TCP checksum field set by `csum`
    /// from the complete checksum and the pseudo-header sum (what a Linux sender with tx
    /// checksum offload leaves there).
    fn syn_frame(payload: &[u8], csum: impl Fn(u16, u16) -> u16) -> Vec<u8> {
        use crate::wire::checksum;
        let syn = TcpRepr {
            src_port: 1234,
            dst_port: 80,
            seq: crate::tcp::SeqNumber(1),
            ack: None,
            flags: TcpFlags::SYN,
            window: 1000,
            urgent: 0,
            options: Default::default(),
        };
        let seg_len = 20 + payload.len();
        let ip = Ipv4Repr {
            src: IP_B,
            dst: IP_A,
            protocol: IpProtocol::Tcp,
            payload_len: seg_len,
            ttl: 64,
            dscp_ecn: 0,
        };
        let eth = EthernetRepr {
            src: MAC_B,
            dst: MAC_A,
            ethertype: EtherType::Ipv4,
        };
        let mut f = vec![0u8; 34 + seg_len];
        crate::wire::emit_tcp_frame(&mut f, &eth, &ip, 1, &syn, payload.len()).unwrap();
        f[54..].copy_from_slice(payload);
        // emit_tcp_frame summed zeroes where the payload now is: recompute.
        let mut tp = TcpPacket::new_unchecked(&mut f[34..]);
        tp.fill_checksum(IP_B, IP_A);
        let full = tp.checksum();
        let pseudo = checksum::pseudo_header_v4(IP_B, IP_A, 6, seg_len as u32);
        tp.set_checksum(csum(full, pseudo));
        f
    }

    /// Sends `frame` from a raw peer to a host listening on 80 (built with `accept`) and
    /// returns its stats and how many frames it answered with.
    fn answer_to(frame: &[u8], accept: bool) -> (InterfaceStats, usize) {
        let (la, mut peer) = sim::pair(SimConfig::default());
        let mut a = Interface::new(
            la,
            InterfaceConfig {
                mac: MAC_A,
                ipv4: IP_A,
                tcp: tcp_config(),
                isn_key: Some([7; 16]),
                accept_partial_checksums: accept,
                ..InterfaceConfig::default()
            },
        );
        a.add_neighbor(IP_B, MAC_B);
        a.listen(80, 8).unwrap();
        peer.send_frame(Instant::ZERO, frame);
        peer.flush(Instant::ZERO);
        a.poll(Instant::from_micros(10));
        let mut answers = 0;
        peer.recv_batch(Instant::from_micros(20), 8, &mut |_| answers += 1);
        (a.stats(), answers)
    }

    #[test]
    fn partial_checksums_are_accepted_only_when_configured() {
        let data = b"partial checksum payload";
        let partial = syn_frame(data, |_, pseudo| pseudo);
        assert!(
            parse_tcp_frame_checked(&partial).is_none(),
            "a partial checksum does not verify"
        );
        // Default: verified like any other checksum, dropped and counted as bad.
        let (s, answers) = answer_to(&partial, false);
        assert_eq!(
            (s.rx_bad_checksum, s.rx_partial_checksum, answers),
            (1, 0, 0)
        );
        // Trusted link: the SYN opens a connection (a SYN-ACK goes out), counted apart.
        let (s, answers) = answer_to(&partial, true);
        assert_eq!(
            (s.rx_bad_checksum, s.rx_partial_checksum, answers),
            (0, 1, 1)
        );
        // A complete checksum is not counted as partial.
        let (s, answers) = answer_to(&syn_frame(data, |full, _| full), true);
        assert_eq!(
            (s.rx_bad_checksum, s.rx_partial_checksum, answers),
            (0, 0, 1)
        );
        // Neither complete nor partial: still dropped on a trusted link.
        let (s, answers) = answer_to(&syn_frame(data, |_, pseudo| pseudo ^ 0x0100), true);
        assert_eq!(
            (s.rx_bad_checksum, s.rx_partial_checksum, answers),
            (1, 0, 0)
        );
        let (s, answers) = answer_to(&syn_frame(data, |full, _| full.wrapping_add(1)), true);
        assert_eq!(
            (s.rx_bad_checksum, s.rx_partial_checksum, answers),
            (1, 0, 0)
        );
    }

    fn parse_tcp_frame_checked(f: &[u8]) -> Option<()> {
        crate::wire::parse_tcp_frame(f, true).ok().map(|_| ())
    }

    #[test]
    fn an_rx_drop_rule_drops_only_the_chosen_data_segments_of_its_sender() {
        let from = SocketAddrV4::new(IP_B, 80);
        let mut rule = RxDrop {
            from,
            skip: 2,
            count: 2,
            seen: 0,
            dropped: 0,
        };
        let other = SocketAddrV4::new(IP_B, 81);
        let verdicts: Vec<bool> = (0..6).map(|_| rule.drops(from)).collect();
        assert_eq!(verdicts, [false, false, true, true, false, false]);
        assert!(!rule.drops(other), "another sender is never counted");
        assert_eq!((rule.seen, rule.dropped), (6, 2));
    }
}
