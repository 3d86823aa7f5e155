//! Wire codecs: Ethernet II, ARP, IPv4 and TCP, and the Internet checksum.
//!
//! Each header follows one pattern: a zero-copy view `Packet<T: AsRef<[u8]>>` (or `Frame`)
//! with field accessors over byte ranges, checked construction that validates lengths, and
//! a parsed `Repr` that can be emitted back into a buffer. Parsing returns a typed
//! [`WireError`] for every malformed input and never panics.
//!
//! | module | format | RFC |
//! |---|---|---|
//! | [`checksum`] | Internet checksum, IPv4 pseudo-header | RFC 1071, RFC 9293 §3.1 |
//! | [`ethernet`] | Ethernet II | RFC 894 |
//! | [`arp`] | ARP, Ethernet/IPv4 only | RFC 826 |
//! | [`ipv4`] | IPv4, no fragments, options skipped | RFC 791 §3.1 |
//! | [`tcp`] | TCP header and options | RFC 9293 §3.1–3.2, RFC 7323, RFC 2018 |
//! | [`frame`] | Ethernet + IPv4 + TCP composed | — |
//!
//! Building a frame writes the payload once, in place, and the headers in front of it;
//! parsing borrows the payload from the received frame:
//!
//! ```
//! use std::net::Ipv4Addr;
//! use netdriver::tcp::seq::SeqNumber;
//! use netdriver::wire::{
//!     frame, EtherType, EthernetAddress, EthernetFrame, EthernetRepr, IpProtocol, Ipv4Packet,
//!     Ipv4Repr, TcpFlags, TcpOptions, TcpPacket, TcpRepr,
//! };
//!
//! let eth = EthernetRepr {
//!     src: EthernetAddress([0x02, 0, 0, 0, 0, 1]),
//!     dst: EthernetAddress([0x02, 0, 0, 0, 0, 2]),
//!     ethertype: EtherType::Ipv4,
//! };
//! let tcp = TcpRepr {
//!     src_port: 40000,
//!     dst_port: 80,
//!     seq: SeqNumber(u32::MAX - 2), // the payload wraps the sequence space
//!     ack: Some(SeqNumber(1)),
//!     flags: TcpFlags::PSH,
//!     window: 512,
//!     urgent: 0,
//!     options: TcpOptions { timestamp: Some((1000, 999)), ..TcpOptions::default() },
//! };
//! let payload = b"hello, world";
//! let ip = Ipv4Repr {
//!     src: Ipv4Addr::new(10, 0, 0, 1),
//!     dst: Ipv4Addr::new(10, 0, 0, 2),
//!     protocol: IpProtocol::Tcp,
//!     payload_len: tcp.header_len() + payload.len(),
//!     ttl: 64,
//!     dscp_ecn: 0,
//! };
//!
//! // By hand, layer by layer: payload first, then TCP (checksums the payload), IPv4, Ethernet.
//! let mut buf = [0u8; 1514];
//! let tcp_at = ethernet::HEADER_LEN + ipv4::HEADER_LEN;
//! let payload_at = tcp_at + tcp.header_len();
//! buf[payload_at..payload_at + payload.len()].copy_from_slice(payload);
//! let seg_len = tcp.emit(&mut buf[tcp_at..], payload.len(), ip.src, ip.dst)?;
//! ip.emit(&mut buf[ethernet::HEADER_LEN..], 1)?;
//! eth.emit(&mut buf)?;
//! let len = tcp_at + seg_len;
//!
//! // The same with the helper.
//! let mut buf2 = [0u8; 1514];
//! let at = frame::tcp_payload_offset(&tcp);
//! buf2[at..at + payload.len()].copy_from_slice(payload);
//! assert_eq!(frame::emit_tcp_frame(&mut buf2, &eth, &ip, 1, &tcp, payload.len())?, len);
//! assert_eq!(buf[..len], buf2[..len]);
//!
//! // Parse back, layer by layer, verifying both checksums.
//! let ef = EthernetFrame::new_checked(&buf[..len])?;
//! assert_eq!(EthernetRepr::parse(&ef)?, eth);
//! let ipp = Ipv4Packet::new_checked(ef.payload_slice())?;
//! assert_eq!(Ipv4Repr::parse(&ipp, true)?, ip);
//! let tp = TcpPacket::new_checked(ipp.payload_slice())?;
//! let (parsed, data) = TcpRepr::parse(&tp, ip.src, ip.dst, true)?;
//! assert_eq!(parsed.ack, tcp.ack);
//! assert_eq!(parsed.flags, TcpFlags::PSH | TcpFlags::ACK); // parse keeps the ACK bit
//! assert_eq!(data, payload);
//!
//! // Or in one call.
//! let f = frame::parse_tcp_frame(&buf[..len], true)?;
//! assert_eq!((f.tcp, f.payload), (parsed, &payload[..]));
//! # use netdriver::wire::{ethernet, ipv4};
//! # Ok::<(), netdriver::wire::WireError>(())
//! ```

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod frame;
pub mod ipv4;
pub mod parts;
pub mod tcp;

pub use arp::{ArpOperation, ArpPacket, ArpRepr};
pub use ethernet::{EtherType, EthernetAddress, EthernetFrame, EthernetRepr};
pub use frame::{emit_tcp_frame, parse_tcp_frame, tcp_payload_offset, TcpFrame};
pub use ipv4::{IpProtocol, Ipv4Packet, Ipv4Repr};
pub use parts::Parts;
pub use tcp::{SackBlock, TcpFlags, TcpOptions, TcpPacket, TcpRepr};

/// Why a frame or header could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer is shorter than the header (or than a length field claims).
    #[error("buffer too short")]
    Truncated,
    /// A length, offset or version field has a value the format does not allow.
    #[error("malformed header field")]
    Malformed,
    /// The checksum does not verify.
    #[error("checksum mismatch")]
    Checksum,
    /// Well-formed, but something this stack does not handle (e.g. an IPv4 fragment).
    #[error("unsupported feature")]
    Unsupported,
}
