//! Transmitting: the frames no connection produces (RSTs, TIME-WAIT ACKs, SYN cookies,
//! ARP replies: a bounded [`Control`] queue, sent first), then every connection's
//! segments round-robin, one per turn, until none has more or the link has no tx buffers.
//! A segment's payload is written once, at [`PAYLOAD_AT`] in the link's buffer, and the
//! TCP (RFC 9293 §3.1), IPv4 (RFC 791) and Ethernet headers in front of it; with the
//! link's offloads the TCP checksum is left partial for the link to complete and a
//! super-segment carries the wire segment size for the link to cut it by. On a link that
//! gathers ([`Offloads::tx_gather`](crate::link::Offloads::tx_gather)) a payload that lies
//! in the application's shared buffers is not written at all: the headers (and any copied
//! payload bytes) go in the buffer, the shared parts are left as holes, and slices of
//! those buffers fill them on the way out ([`SharedSpan`]), read by the kernel.

use std::net::Ipv4Addr;

use bytes::Bytes;

use super::Core;
use crate::link::{Link, PartialChecksum, SharedSpan, TxMeta, ETHERNET_HEADER_LEN};
use crate::time::Instant;
use crate::wire::{
    ethernet, ipv4, ArpRepr, EtherType, EthernetAddress, EthernetRepr, IpProtocol, Ipv4Repr,
    TcpRepr,
};

/// Longest TCP header (20 bytes and 40 of options). Payloads are written at a fixed offset
/// that leaves this much room, whatever header the segment turns out to need.
const MAX_TCP_HEADER_LEN: usize = 60;
/// Where a payload starts in a lent tx buffer: after the longest possible headers.
pub(super) const PAYLOAD_AT: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN + MAX_TCP_HEADER_LEN;

/// A frame to send that no connection produces: an RST for a stray segment, an ARP reply.
#[derive(Debug, Clone, Copy)]
pub(super) enum Control {
    Rst {
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        repr: TcpRepr,
    },
    /// An ACK from a TIME-WAIT record.
    TimeWaitAck {
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        repr: TcpRepr,
    },
    /// A SYN-ACK carrying a SYN cookie.
    CookieSynAck {
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        repr: TcpRepr,
    },
    ArpReply(ArpRepr),
}

/// Most control frames waiting for the next tx phase; beyond this they are dropped, so a
/// flood of stray segments cannot grow memory.
const MAX_CONTROL: usize = 256;

impl Core {
    pub(super) fn queue_control(&mut self, c: Control) {
        if self.control.len() < MAX_CONTROL {
            self.control.push_back(c);
        } else {
            self.stats.tx_control_dropped += 1;
        }
    }

    fn next_ident(&mut self) -> u16 {
        self.ip_ident = self.ip_ident.wrapping_add(1);
        self.ip_ident
    }

    /// Writes the headers of a TCP segment whose payload already lies at `PAYLOAD_AT` in
    /// `buf`, and returns the frame's range. The frame starts where the headers begin.
    /// With `partial`, the TCP checksum is left to the link (see
    /// [`emit_segment_meta`](Self::emit_segment_meta)).
    fn emit_segment(
        &mut self,
        buf: &mut [u8],
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        repr: &TcpRepr,
        payload_len: usize,
        payload_sum: u16,
    ) -> Option<std::ops::Range<usize>> {
        self.emit_segment_with(buf, dst_mac, dst_ip, repr, payload_len, Some(payload_sum))
    }

    /// [`emit_segment`](Self::emit_segment) for a connection's [`Transmit`]: the TCP
    /// checksum left partial when the connection runs with checksum offload, and the
    /// super-segment's wire segment size passed on.
    fn emit_segment_meta(
        &mut self,
        buf: &mut [u8],
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        t: &crate::tcp::Transmit,
    ) -> Option<(std::ops::Range<usize>, TxMeta)> {
        if !self.config.tcp.checksum_offload {
            let r =
                self.emit_segment(buf, dst_mac, dst_ip, &t.repr, t.payload_len, t.payload_sum)?;
            return Some((r, TxMeta::default()));
        }
        let r = self.emit_segment_with(buf, dst_mac, dst_ip, &t.repr, t.payload_len, None)?;
        if t.payload_gathered {
            self.stats.tx_payload_gathered += 1;
        }
        self.stats.tx_checksum_offloaded += 1;
        let segment_size = if t.is_super_segment() {
            self.stats.tx_super_segments += 1;
            u16::try_from(t.segment_size).unwrap_or(u16::MAX)
        } else {
            0
        };
        let meta = TxMeta {
            segment_size,
            partial_checksum: Some(PartialChecksum {
                start: crate::wire::frame::TCP_HEADER_AT as u16,
                offset: 16,
            }),
        };
        Some((r, meta))
    }

    /// The frame writer behind both: `Some(sum)` completes the checksum from the payload's
    /// sum, `None` leaves it partial.
    fn emit_segment_with(
        &mut self,
        buf: &mut [u8],
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        repr: &TcpRepr,
        payload_len: usize,
        payload_sum: Option<u16>,
    ) -> Option<std::ops::Range<usize>> {
        let header_len = repr.header_len();
        let start = PAYLOAD_AT.checked_sub(ethernet::HEADER_LEN + ipv4::HEADER_LEN + header_len)?;
        let eth = EthernetRepr {
            src: self.config.mac,
            dst: dst_mac,
            ethertype: EtherType::Ipv4,
        };
        let ip = Ipv4Repr {
            src: self.config.ipv4,
            dst: dst_ip,
            protocol: IpProtocol::Tcp,
            payload_len: header_len + payload_len,
            ttl: self.config.ttl,
            dscp_ecn: 0,
        };
        let ident = self.next_ident();
        let frame = buf.get_mut(start..)?;
        let emitted = match payload_sum {
            Some(sum) => crate::wire::frame::emit_tcp_frame_summed(
                frame,
                &eth,
                &ip,
                ident,
                repr,
                payload_len,
                Some(sum),
            ),
            None => crate::wire::frame::emit_tcp_frame_partial(
                frame,
                &eth,
                &ip,
                ident,
                repr,
                payload_len,
            ),
        };
        match emitted {
            Ok(len) => {
                self.stats.tx_segments += 1;
                Some(start..start + len)
            }
            Err(_) => {
                self.stats.tx_emit_errors += 1;
                None
            }
        }
    }

    /// Writes one control frame into `buf`.
    fn emit_control(&mut self, buf: &mut [u8], c: Control) -> Option<std::ops::Range<usize>> {
        match c {
            Control::Rst {
                dst_mac,
                dst_ip,
                repr,
            } => {
                let r = self.emit_segment(buf, dst_mac, dst_ip, &repr, 0, 0);
                if r.is_some() {
                    self.stats.tx_rst += 1;
                }
                r
            }
            Control::TimeWaitAck {
                dst_mac,
                dst_ip,
                repr,
            } => self.emit_segment(buf, dst_mac, dst_ip, &repr, 0, 0),
            Control::CookieSynAck {
                dst_mac,
                dst_ip,
                repr,
            } => {
                let r = self.emit_segment(buf, dst_mac, dst_ip, &repr, 0, 0);
                if r.is_some() {
                    self.stats.syn_cookies_sent += 1;
                }
                r
            }
            Control::ArpReply(arp) => {
                let eth = EthernetRepr {
                    src: self.config.mac,
                    dst: arp.target_hw,
                    ethertype: EtherType::Arp,
                };
                let len = ETHERNET_HEADER_LEN + arp.packet_len();
                let ok = buf.get_mut(..len).is_some_and(|frame| {
                    eth.emit(frame).is_ok()
                        && frame
                            .get_mut(ETHERNET_HEADER_LEN..)
                            .is_some_and(|p| arp.emit(p).is_ok())
                });
                if ok {
                    self.stats.tx_arp_replies += 1;
                    Some(0..len)
                } else {
                    self.stats.tx_emit_errors += 1;
                    None
                }
            }
        }
    }

    /// The tx phase of `poll`: control frames, then segments from every connection until
    /// none has anything to send or the link has no more tx buffers. Returns whether any
    /// frame was produced.
    pub(super) fn transmit<L: Link>(&mut self, link: &mut L, now: Instant) -> bool {
        self.tx_ready.clear();
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.conn.is_some() {
                self.tx_ready.push(i as u32);
            }
        }
        // The payload region: from the fixed payload offset up to what the MSS allows (or a
        // super-segment, when the link segments). The connection caps the payload further
        // by the options it carries.
        let payload_cap = usize::from(self.config.tcp.mss).max(self.config.tcp.max_super_segment);
        let mut cursor = 0usize;
        let mut produced_any = false;
        self.tx_blocked_at = None;
        // A link that gathers gets the payloads that lie in shared buffers as they lie.
        let gather = link.offloads().tx_gather;
        let batch = self.config.tx_batch;
        // A connection's gathered runs, at their offsets in the payload.
        let mut runs: Vec<(usize, Bytes)> = Vec::new();
        // Each round hands out a batch of buffers; rounds repeat while the link takes
        // everything, so one poll drains all connections (bounded by their windows).
        for _ in 0..1024 {
            let mut exhausted = false;
            let mut write = |buf: &mut [u8], mut spans: Option<&mut Vec<SharedSpan>>| {
                if let Some(c) = self.control.pop_front() {
                    // A control frame that fails to emit is counted; move on to the next.
                    if let Some(r) = self.emit_control(buf, c) {
                        return Some((r, TxMeta::default()));
                    }
                }
                // Each ready connection gets at most one try per buffer. A connection with
                // nothing more leaves the list by `swap_remove`: the last one takes its
                // place and is tried next, which keeps the turns round-robin enough.
                let mut tries = self.tx_ready.len();
                while tries > 0 && !self.tx_ready.is_empty() {
                    tries -= 1;
                    if cursor >= self.tx_ready.len() {
                        cursor = 0;
                    }
                    let i = self.tx_ready[cursor] as usize;
                    let Some(slot) = self.slots.get_mut(i) else {
                        self.tx_ready.swap_remove(cursor);
                        continue;
                    };
                    let Some(conn) = slot.conn.as_mut() else {
                        self.tx_ready.swap_remove(cursor);
                        continue;
                    };
                    let Some(dst_mac) = slot.remote_mac else {
                        // Without a MAC the segment could not leave; leave it queued in
                        // the connection (its timers will retry) rather than lose it.
                        self.stats.tx_no_neighbor += 1;
                        self.tx_ready.swap_remove(cursor);
                        continue;
                    };
                    let end = (PAYLOAD_AT + payload_cap).min(buf.len());
                    let payload_buf = buf.get_mut(PAYLOAD_AT..end).unwrap_or_default();
                    let polled = if spans.is_some() {
                        runs.clear();
                        conn.poll_transmit_gather(now, payload_buf, &mut runs)
                    } else {
                        conn.poll_transmit(now, payload_buf)
                    };
                    match polled {
                        None => {
                            self.tx_ready.swap_remove(cursor);
                        }
                        Some(t) => {
                            cursor += 1;
                            let dst_ip = *conn.remote().ip();
                            if let Some(r) = self.emit_segment_meta(buf, dst_mac, dst_ip, &t) {
                                if let Some(spans) = spans.as_mut() {
                                    spans.extend(runs.drain(..).map(|(at, bytes)| SharedSpan {
                                        at: PAYLOAD_AT + at,
                                        bytes,
                                    }));
                                }
                                return Some(r);
                            }
                        }
                    }
                }
                if self.control.is_empty() {
                    exhausted = true;
                    None
                } else {
                    // Only failed control frames remain: keep draining them.
                    self.control
                        .pop_front()
                        .and_then(|c| self.emit_control(buf, c))
                        .map(|r| (r, TxMeta::default()))
                }
            };
            let sent = if gather {
                link.tx_batch_gather(now, batch, &mut |buf, spans| write(buf, Some(spans)))
            } else {
                link.tx_batch_meta(now, batch, &mut |buf| write(buf, None))
            };
            produced_any |= sent > 0;
            link.flush(now);
            if exhausted {
                return produced_any;
            }
            if sent == 0 {
                // The link had no buffer at all: try again soon.
                self.tx_blocked_at = Some(now);
                return produced_any;
            }
        }
        self.tx_blocked_at = Some(now);
        produced_any
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddrV4;

    use crate::link::sim::SimLink;
    use crate::netif::tests::{hosts, run_until, IP_B};
    use crate::netif::Interface;
    use crate::tcp::State;
    use crate::time::Duration;

    use super::*;

    /// Frames A put on the wire, as (TCP source port, payload bytes), taken off B's link.
    fn wire_segments(b: &mut Interface<SimLink>, now: Instant) -> Vec<(u16, usize)> {
        let mut out = Vec::new();
        b.link_mut().recv_batch(now, usize::MAX, &mut |f| {
            let ip = &f[ethernet::HEADER_LEN..];
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let tcp = &ip[ipv4::HEADER_LEN..];
            let tcp_header = usize::from(tcp[12] >> 4) * 4;
            let port = u16::from_be_bytes([tcp[0], tcp[1]]);
            out.push((port, total - ipv4::HEADER_LEN - tcp_header));
        });
        out
    }

    #[test]
    fn idle_connections_do_not_disturb_the_round_robin() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        b.listen(80, 16).unwrap();
        let conns: Vec<_> = (0..8)
            .map(|_| a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap())
            .collect();
        let mut accepted = 0;
        run_until(&mut a, &mut b, &mut now, |a, b| {
            while b.accept(80).is_some() {
                accepted += 1;
            }
            accepted == conns.len()
                && conns
                    .iter()
                    .all(|&h| a.conn(h).unwrap().state() == State::Established)
        });
        // Two of eight connections have data (three segments each); six stay idle.
        let mss = usize::from(a.config().tcp.mss);
        let active = [conns[2], conns[5]];
        let ports: Vec<u16> = active
            .iter()
            .map(|&h| a.conn(h).unwrap().local().port())
            .collect();
        let data = vec![7u8; 2 * mss + 100];
        for &h in &active {
            // Without Nagle, the short third segment goes out at once as well.
            a.conn_mut(h).unwrap().set_nodelay(true);
            assert_eq!(a.conn_mut(h).unwrap().send(&data).unwrap(), data.len());
        }
        assert!(a.poll(now));
        let later = now + Duration::from_secs(1);
        let sent: Vec<(u16, usize)> = wire_segments(&mut b, later)
            .into_iter()
            .filter(|&(_, len)| len > 0)
            .collect();
        // Every byte went out in one poll, only from the two, alternating between them.
        assert_eq!(sent.len(), 6, "{sent:?}");
        for (i, &(port, _)) in sent.iter().enumerate() {
            assert_eq!(
                port,
                if sent[0].0 == ports[0] {
                    ports[i % 2]
                } else {
                    ports[1 - i % 2]
                }
            );
        }
        for &p in &ports {
            let bytes: usize = sent.iter().filter(|s| s.0 == p).map(|s| s.1).sum();
            assert_eq!(bytes, data.len());
        }
    }
}
