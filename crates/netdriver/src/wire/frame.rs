//! Whole Ethernet II + IPv4 + TCP frames: the composition of [`super::ethernet`],
//! [`super::ipv4`] and [`super::tcp`] that the channels send and receive.
//!
//! Building is zero-copy: the sender asks [`tcp_payload_offset`] where the payload goes,
//! writes it there, and [`emit_tcp_frame`] writes the three headers in front of it and the
//! TCP checksum over it. Parsing with [`parse_tcp_frame`] borrows the payload from the frame.

use super::ethernet::{self, EtherType, EthernetFrame, EthernetRepr};
use super::ipv4::{self, IpProtocol, Ipv4Packet, Ipv4Repr};
use super::tcp::{TcpPacket, TcpRepr};
use super::WireError;

/// Where the TCP payload starts in a frame that [`emit_tcp_frame`] builds for `tcp`.
pub fn tcp_payload_offset(tcp: &TcpRepr) -> usize {
    ethernet::HEADER_LEN + ipv4::HEADER_LEN + tcp.header_len()
}

/// Writes the Ethernet, IPv4 and TCP headers of a frame whose `payload_len` bytes of TCP
/// payload the caller has already written at `buf[tcp_payload_offset(tcp)..]`, and returns
/// the frame length. `eth.ethertype` is written as IPv4 and `ip.protocol` as TCP whatever
/// they hold, and `ip.payload_len` is ignored: it is computed from the TCP segment. `ident`
/// becomes the IPv4 identification. The TCP checksum uses `ip.src` and `ip.dst`.
///
/// Fails with [`WireError::Truncated`] if `buf` is too short for the frame and with
/// [`WireError::Malformed`] if the datagram would exceed 65535 bytes.
pub fn emit_tcp_frame(
    buf: &mut [u8],
    eth: &EthernetRepr,
    ip: &Ipv4Repr,
    ident: u16,
    tcp: &TcpRepr,
    payload_len: usize,
) -> Result<usize, WireError> {
    emit_tcp_frame_summed(buf, eth, ip, ident, tcp, payload_len, None)
}

/// [`emit_tcp_frame`] for a sender that summed the payload as it wrote it: with
/// `Some(payload_sum)` (the payload's [`checksum::data`](super::checksum::data), e.g. from
/// [`checksum::copy_and_sum`](super::checksum::copy_and_sum)) the TCP checksum is completed
/// from the headers alone and the payload is not read again; `None` reads it.
pub fn emit_tcp_frame_summed(
    buf: &mut [u8],
    eth: &EthernetRepr,
    ip: &Ipv4Repr,
    ident: u16,
    tcp: &TcpRepr,
    payload_len: usize,
    payload_sum: Option<u16>,
) -> Result<usize, WireError> {
    let seg = buf.get_mut(TCP_HEADER_AT..).ok_or(WireError::Truncated)?;
    let seg_len = match payload_sum {
        Some(sum) => tcp.emit_with_payload_sum(seg, payload_len, sum, ip.src, ip.dst)?,
        None => tcp.emit(seg, payload_len, ip.src, ip.dst)?,
    };
    finish_tcp_frame(buf, eth, ip, ident, seg_len)
}

/// [`emit_tcp_frame`] for a link that completes the TCP checksum (checksum offload): the
/// field holds the pseudo-header sum only, and the payload is not read. The link is told
/// with a [`PartialChecksum`](crate::link::PartialChecksum) starting at
/// [`TCP_HEADER_AT`] with offset 16.
pub fn emit_tcp_frame_partial(
    buf: &mut [u8],
    eth: &EthernetRepr,
    ip: &Ipv4Repr,
    ident: u16,
    tcp: &TcpRepr,
    payload_len: usize,
) -> Result<usize, WireError> {
    let seg = buf.get_mut(TCP_HEADER_AT..).ok_or(WireError::Truncated)?;
    let seg_len = tcp.emit_with_partial_checksum(seg, payload_len, ip.src, ip.dst)?;
    finish_tcp_frame(buf, eth, ip, ident, seg_len)
}

/// Where the TCP header starts in a frame built here (Ethernet II, IPv4 without options).
pub const TCP_HEADER_AT: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN;

/// The IPv4 and Ethernet headers in front of a TCP segment of `seg_len` bytes already
/// written at [`TCP_HEADER_AT`]; returns the frame length.
fn finish_tcp_frame(
    buf: &mut [u8],
    eth: &EthernetRepr,
    ip: &Ipv4Repr,
    ident: u16,
    seg_len: usize,
) -> Result<usize, WireError> {
    let ip_at = ethernet::HEADER_LEN;
    let tcp_at = TCP_HEADER_AT;
    let ip = Ipv4Repr {
        protocol: IpProtocol::Tcp,
        payload_len: seg_len,
        ..*ip
    };
    ip.emit(&mut buf[ip_at..], ident)?;
    let eth = EthernetRepr {
        ethertype: EtherType::Ipv4,
        ..*eth
    };
    eth.emit(buf)?;
    Ok(tcp_at + seg_len)
}

/// A parsed Ethernet/IPv4/TCP frame; the payload borrows the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpFrame<'a> {
    /// The Ethernet header.
    pub eth: EthernetRepr,
    /// The IPv4 header.
    pub ip: Ipv4Repr,
    /// The TCP header.
    pub tcp: TcpRepr,
    /// The TCP payload.
    pub payload: &'a [u8],
}

/// Parses a whole frame down to the TCP payload. A frame that is not IPv4, or a datagram
/// that is not TCP, is [`WireError::Unsupported`]; the IPv4 and TCP checksums are verified
/// when `verify_checksums` is set. Ethernet padding after the IPv4 datagram is ignored.
pub fn parse_tcp_frame(frame: &[u8], verify_checksums: bool) -> Result<TcpFrame<'_>, WireError> {
    let ef = EthernetFrame::new_checked(frame)?;
    let eth = EthernetRepr::parse(&ef)?;
    if eth.ethertype != EtherType::Ipv4 {
        return Err(WireError::Unsupported);
    }
    let ipp = Ipv4Packet::new_checked(ef.payload_slice())?;
    let ip = Ipv4Repr::parse(&ipp, verify_checksums)?;
    if ip.protocol != IpProtocol::Tcp {
        return Err(WireError::Unsupported);
    }
    let tp = TcpPacket::new_checked(ipp.payload_slice())?;
    let (tcp, payload) = TcpRepr::parse(&tp, ip.src, ip.dst, verify_checksums)?;
    Ok(TcpFrame {
        eth,
        ip,
        tcp,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::seq::SeqNumber;
    use crate::wire::{EthernetAddress, TcpFlags, TcpOptions};
    use std::net::Ipv4Addr;

    fn reprs() -> (EthernetRepr, Ipv4Repr, TcpRepr) {
        let eth = EthernetRepr {
            src: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: EtherType::Ipv4,
        };
        let ip = Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            protocol: IpProtocol::Tcp,
            payload_len: 0,
            ttl: 64,
            dscp_ecn: 0,
        };
        let tcp = TcpRepr {
            src_port: 5000,
            dst_port: 6000,
            seq: SeqNumber(u32::MAX - 3),
            ack: Some(SeqNumber(u32::MAX)),
            flags: TcpFlags::PSH,
            window: 1000,
            urgent: 0,
            options: TcpOptions {
                timestamp: Some((7, 8)),
                ..TcpOptions::default()
            },
        };
        (eth, ip, tcp)
    }

    #[test]
    fn round_trip_with_padding() {
        let (eth, ip, tcp) = reprs();
        let mut buf = [0u8; 128];
        let at = tcp_payload_offset(&tcp);
        buf[at..at + 3].copy_from_slice(b"abc");
        let n = emit_tcp_frame(&mut buf, &eth, &ip, 9, &tcp, 3).unwrap();
        assert_eq!(n, at + 3);
        // Parse with trailing padding bytes (as from a minimum-size Ethernet frame).
        buf[n..n + 4].fill(0xee);
        let f = parse_tcp_frame(&buf[..n + 4], true).unwrap();
        assert_eq!(f.eth, eth);
        assert_eq!(f.ip.payload_len, tcp.header_len() + 3);
        assert_eq!(f.tcp.flags, TcpFlags::PSH | TcpFlags::ACK);
        assert_eq!(f.tcp.ack, tcp.ack);
        assert_eq!(f.payload, b"abc");
        for len in 0..n {
            assert!(parse_tcp_frame(&buf[..len], true).is_err(), "len {len}");
            assert!(emit_tcp_frame(&mut [0u8; 128][..len], &eth, &ip, 9, &tcp, 3).is_err());
        }
    }

    #[test]
    fn a_summed_payload_gives_the_same_frame() {
        let (eth, ip, tcp) = reprs();
        let at = tcp_payload_offset(&tcp);
        for len in [0usize, 1, 2, 3, 31, 32, 33, 1000, 1001] {
            let payload: Vec<u8> = (0..len as u32).map(|i| (i * 31 + 5) as u8).collect();
            let mut plain = vec![0u8; at + len];
            let mut summed = vec![0u8; at + len];
            plain[at..].copy_from_slice(&payload);
            let sum = crate::wire::checksum::copy_and_sum(&mut summed[at..], &payload);
            let n = emit_tcp_frame(&mut plain, &eth, &ip, 9, &tcp, len).unwrap();
            let m = emit_tcp_frame_summed(&mut summed, &eth, &ip, 9, &tcp, len, Some(sum)).unwrap();
            assert_eq!((n, &plain), (m, &summed), "len {len}");
            assert!(parse_tcp_frame(&summed, true).is_ok());
        }
    }

    #[test]
    fn other_protocols_unsupported() {
        let (eth, ip, tcp) = reprs();
        let mut buf = [0u8; 128];
        let n = emit_tcp_frame(&mut buf, &eth, &ip, 9, &tcp, 0).unwrap();
        let mut arp = buf;
        arp[13] = 0x06;
        assert_eq!(
            parse_tcp_frame(&arp[..n], true),
            Err(WireError::Unsupported)
        );
        let mut udp = buf;
        udp[14 + 9] = 17;
        assert_eq!(
            parse_tcp_frame(&udp[..n], false),
            Err(WireError::Unsupported)
        );
    }
}
