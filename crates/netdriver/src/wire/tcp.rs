//! TCP header: a zero-copy view and a parsed representation (RFC 9293 §3.1), with the
//! options MSS (§3.2), window scale and timestamps (RFC 7323 §2, §3), SACK-permitted and
//! SACK blocks (RFC 2018 §2, §3).

use crate::tcp::seq::SeqNumber;

/// The TCP control bits. Any combination can arrive from the network, so this is a bit set
/// rather than an enum; the state machine decides what a combination means.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    /// No more data from sender.
    pub const FIN: TcpFlags = TcpFlags(0x01);
    /// Synchronise sequence numbers.
    pub const SYN: TcpFlags = TcpFlags(0x02);
    /// Reset the connection.
    pub const RST: TcpFlags = TcpFlags(0x04);
    /// Push function.
    pub const PSH: TcpFlags = TcpFlags(0x08);
    /// Acknowledgement field significant.
    pub const ACK: TcpFlags = TcpFlags(0x10);
    /// Urgent pointer field significant (parsed, never acted on).
    pub const URG: TcpFlags = TcpFlags(0x20);
    /// ECN-Echo (RFC 3168); parsed, not acted on.
    pub const ECE: TcpFlags = TcpFlags(0x40);
    /// Congestion Window Reduced (RFC 3168); parsed, not acted on.
    pub const CWR: TcpFlags = TcpFlags(0x80);

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: TcpFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// `self` with the bits of `other` added.
    pub const fn with(self, other: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 | other.0)
    }

    /// Whether SYN is set.
    pub const fn syn(self) -> bool {
        self.contains(TcpFlags::SYN)
    }
    /// Whether FIN is set.
    pub const fn fin(self) -> bool {
        self.contains(TcpFlags::FIN)
    }
    /// Whether RST is set.
    pub const fn rst(self) -> bool {
        self.contains(TcpFlags::RST)
    }
    /// Whether ACK is set.
    pub const fn ack(self) -> bool {
        self.contains(TcpFlags::ACK)
    }
    /// Whether PSH is set.
    pub const fn psh(self) -> bool {
        self.contains(TcpFlags::PSH)
    }
}

impl core::ops::BitOr for TcpFlags {
    type Output = TcpFlags;
    fn bitor(self, rhs: TcpFlags) -> TcpFlags {
        self.with(rhs)
    }
}

impl core::fmt::Debug for TcpFlags {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        const NAMES: [(TcpFlags, &str); 8] = [
            (TcpFlags::SYN, "SYN"),
            (TcpFlags::FIN, "FIN"),
            (TcpFlags::RST, "RST"),
            (TcpFlags::PSH, "PSH"),
            (TcpFlags::ACK, "ACK"),
            (TcpFlags::URG, "URG"),
            (TcpFlags::ECE, "ECE"),
            (TcpFlags::CWR, "CWR"),
        ];
        let mut first = true;
        for (flag, name) in NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("-")?;
        }
        Ok(())
    }
}

/// One SACK block: the bytes `[left, right)` the receiver holds (RFC 2018 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SackBlock {
    /// First sequence number of the block.
    pub left: SeqNumber,
    /// Sequence number just past the block.
    pub right: SeqNumber,
}

/// The TCP options this stack understands. Unknown options are skipped when parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpOptions {
    /// Maximum segment size (only meaningful on SYN).
    pub mss: Option<u16>,
    /// Window scale shift count as sent (only on SYN; RFC 7323 caps its use at 14).
    pub window_scale: Option<u8>,
    /// SACK permitted (only on SYN).
    pub sack_permitted: bool,
    /// Up to four SACK blocks; at most three fit beside timestamps.
    pub sack_blocks: [Option<SackBlock>; 4],
    /// Timestamps `(TSval, TSecr)` (RFC 7323 §3).
    pub timestamp: Option<(u32, u32)>,
}

/// A parsed TCP header, without its payload. The payload travels beside it (as a slice of
/// the received frame, or written by the sender straight into the frame being built), so
/// no segment is ever copied into an intermediate owned buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number of the first octet (or of the SYN).
    pub seq: SeqNumber,
    /// Acknowledgement number; `Some` exactly when the ACK bit is set.
    pub ack: Option<SeqNumber>,
    /// Control bits other than ACK (ACK is implied by `ack.is_some()`); parsers keep every
    /// bit they saw here, ACK included, and emitters set ACK from `ack`.
    pub flags: TcpFlags,
    /// The window field as on the wire (unscaled).
    pub window: u16,
    /// The urgent pointer as on the wire (never acted on).
    pub urgent: u16,
    /// Options.
    pub options: TcpOptions,
}
