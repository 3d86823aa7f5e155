//! Wire codecs: Ethernet II, ARP, IPv4 and TCP, and the Internet checksum.
//!
//! Each header follows one pattern: a zero-copy view `Packet<T: AsRef<[u8]>>` (or `Frame`)
//! with field accessors over byte ranges, checked construction that validates lengths, and
//! a parsed `Repr` that can be emitted back into a buffer. Parsing returns a typed
//! [`WireError`] for every malformed input and never panics.

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod ipv4;
pub mod tcp;

pub use arp::{ArpOperation, ArpPacket, ArpRepr};
pub use ethernet::{EtherType, EthernetAddress, EthernetFrame, EthernetRepr};
pub use ipv4::{IpProtocol, Ipv4Packet, Ipv4Repr};
pub use tcp::{SackBlock, TcpFlags, TcpOptions, TcpRepr};

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
