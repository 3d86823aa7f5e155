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

// ---------------------------------------------------------------------------------------
// Codec: everything below works on the types above without changing them.
// ---------------------------------------------------------------------------------------

use std::net::Ipv4Addr;

use super::checksum;
use super::WireError;

/// Length of a TCP header without options.
pub const HEADER_LEN: usize = 20;
/// The most option bytes a header can carry (data offset 15).
pub const MAX_OPTIONS_LEN: usize = 40;
/// The longest TCP header.
pub const MAX_HEADER_LEN: usize = HEADER_LEN + MAX_OPTIONS_LEN;
/// The IP protocol number of TCP, as used in the pseudo-header.
pub const PROTOCOL: u8 = 6;

mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const SEQ: usize = 4;
    pub const ACK: usize = 8;
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WINDOW: usize = 14;
    pub const CHECKSUM: usize = 16;
    pub const URGENT: usize = 18;
}

mod opt {
    pub const EOL: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WS: u8 = 3;
    pub const SACK_PERM: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TS: u8 = 8;
}

/// A zero-copy view of a TCP segment (header and payload).
///
/// The buffer must be exactly the segment: the IPv4 payload, not the whole frame, because
/// the checksum and the payload extend to its end. [`TcpPacket::new_checked`] validates the
/// data offset, after which every accessor is in bounds. A view from
/// [`TcpPacket::new_unchecked`] over a buffer shorter than the header it claims panics on
/// access; use it only on buffers you sized yourself.
#[derive(Debug, Clone)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Wraps a buffer without any check.
    pub const fn new_unchecked(buffer: T) -> TcpPacket<T> {
        TcpPacket { buffer }
    }

    /// Wraps a buffer after [`TcpPacket::check_len`].
    pub fn new_checked(buffer: T) -> Result<TcpPacket<T>, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the fixed header is present, that the data offset is at least 5 words
    /// ([`WireError::Malformed`] otherwise) and that the header it announces fits in the
    /// buffer ([`WireError::Truncated`] otherwise).
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(WireError::Malformed);
        }
        if len < hl {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// Gives back the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn read_u16(&self, at: usize) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    fn read_u32(&self, at: usize) -> u32 {
        let b = self.buffer.as_ref();
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        self.read_u16(field::SRC_PORT)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        self.read_u16(field::DST_PORT)
    }

    /// Sequence number.
    pub fn seq_number(&self) -> SeqNumber {
        SeqNumber(self.read_u32(field::SEQ))
    }

    /// Acknowledgement number field (meaningful only when ACK is set).
    pub fn ack_number(&self) -> SeqNumber {
        SeqNumber(self.read_u32(field::ACK))
    }

    /// Data offset in 32-bit words.
    pub fn data_offset(&self) -> u8 {
        self.buffer.as_ref()[field::DATA_OFF] >> 4
    }

    /// Header length in bytes (data offset × 4).
    pub fn header_len(&self) -> usize {
        self.data_offset() as usize * 4
    }

    /// The eight control bits.
    pub fn flags(&self) -> TcpFlags {
        TcpFlags(self.buffer.as_ref()[field::FLAGS])
    }

    /// Window field (unscaled).
    pub fn window_len(&self) -> u16 {
        self.read_u16(field::WINDOW)
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        self.read_u16(field::CHECKSUM)
    }

    /// Urgent pointer.
    pub fn urgent_at(&self) -> u16 {
        self.read_u16(field::URGENT)
    }

    /// The option bytes (between the fixed header and the data offset).
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }

    /// The payload (from the data offset to the end of the buffer).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// Whether the checksum over the pseudo-header (RFC 9293 §3.1) and the whole segment
    /// verifies.
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        let b = self.buffer.as_ref();
        let Ok(len) = u32::try_from(b.len()) else {
            return false;
        };
        let pseudo = checksum::pseudo_header_v4(src, dst, PROTOCOL, len);
        checksum::add(pseudo, checksum::data(b)) == 0xffff
    }

    /// Whether the checksum field holds only the pseudo-header sum, as a Linux sender with
    /// transmit checksum offload leaves it (`CHECKSUM_PARTIAL`: the device was to add the
    /// segment's sum and complement it). Such a segment crossed a host-local link (veth)
    /// that never computed the rest; nothing about its bytes is verified. Only a caller that
    /// trusts the link may accept it (see `InterfaceConfig::accept_partial_checksums`).
    pub fn has_partial_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        let Ok(len) = u32::try_from(self.buffer.as_ref().len()) else {
            return false;
        };
        // Linux writes `~csum_tcpudp_magic(..)`, the folded sum itself, not complemented.
        self.checksum() == checksum::pseudo_header_v4(src, dst, PROTOCOL, len)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> TcpPacket<&'a T> {
    /// The payload, borrowed for the buffer's lifetime rather than the view's.
    pub fn payload_slice(&self) -> &'a [u8] {
        let b: &'a [u8] = self.buffer.as_ref();
        &b[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    fn write_u16(&mut self, at: usize, v: u16) {
        self.buffer.as_mut()[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }

    fn write_u32(&mut self, at: usize, v: u32) {
        self.buffer.as_mut()[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        self.write_u16(field::SRC_PORT, v);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        self.write_u16(field::DST_PORT, v);
    }

    /// Sets the sequence number.
    pub fn set_seq_number(&mut self, v: SeqNumber) {
        self.write_u32(field::SEQ, v.0);
    }

    /// Sets the acknowledgement number field.
    pub fn set_ack_number(&mut self, v: SeqNumber) {
        self.write_u32(field::ACK, v.0);
    }

    /// Sets the header length in bytes (a multiple of 4, at most 60); the reserved bits
    /// are cleared.
    pub fn set_header_len(&mut self, len: usize) {
        self.buffer.as_mut()[field::DATA_OFF] = ((len / 4) as u8 & 0x0f) << 4;
    }

    /// Sets the eight control bits.
    pub fn set_flags(&mut self, flags: TcpFlags) {
        self.buffer.as_mut()[field::FLAGS] = flags.0;
    }

    /// Sets the window field.
    pub fn set_window_len(&mut self, v: u16) {
        self.write_u16(field::WINDOW, v);
    }

    /// Sets the checksum field to a raw value.
    pub fn set_checksum(&mut self, v: u16) {
        self.write_u16(field::CHECKSUM, v);
    }

    /// Sets the urgent pointer.
    pub fn set_urgent_at(&mut self, v: u16) {
        self.write_u16(field::URGENT, v);
    }

    /// The option bytes, mutably (per the current data offset).
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[HEADER_LEN..hl]
    }

    /// The payload, mutably.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[hl..]
    }

    /// Fills the checksum field like [`fill_checksum`](Self::fill_checksum), given the
    /// folded sum of the payload (the bytes after the header, from
    /// [`checksum::data`] or [`checksum::copy_and_sum`]) instead of reading them again.
    /// Only the header is read. A sum that is not the payload's makes a segment the peer
    /// drops as corrupt, nothing worse.
    pub fn fill_checksum_with_payload_sum(
        &mut self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        payload_sum: u16,
    ) {
        self.set_checksum(0);
        let hl = self.header_len();
        let b = self.buffer.as_ref();
        let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
        let pseudo = checksum::pseudo_header_v4(src, dst, PROTOCOL, len);
        // The header is a whole number of 32-bit words, so the payload's lanes line up.
        let header = checksum::data(b.get(..hl).unwrap_or(b));
        let sum = checksum::finish(checksum::combine(&[pseudo, header, payload_sum]));
        self.set_checksum(sum);
    }

    /// Computes the checksum over the pseudo-header and the whole buffer (header and
    /// payload as currently written) and stores it.
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let b = self.buffer.as_ref();
        let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
        let pseudo = checksum::pseudo_header_v4(src, dst, PROTOCOL, len);
        let sum = checksum::finish(checksum::add(pseudo, checksum::data(b)));
        self.set_checksum(sum);
    }
}

impl TcpOptions {
    /// Parses an options area (the bytes between the fixed header and the data offset).
    ///
    /// EOL ends the list; NOP is skipped; MSS, window scale, SACK-permitted, SACK and
    /// timestamps are read; any other kind with a length of at least 2 that fits is
    /// skipped. [`WireError::Malformed`] is returned for a missing length byte, a length
    /// below 2 or overrunning the area, or a known option with a wrong length (e.g. MSS
    /// not 4, SACK not 2 + 8n with n in 1..=4). A repeated option overwrites the earlier
    /// one. Every step advances at least one byte, so this always terminates.
    pub fn parse(mut bytes: &[u8]) -> Result<TcpOptions, WireError> {
        let mut o = TcpOptions::default();
        while let Some((&kind, rest)) = bytes.split_first() {
            match kind {
                opt::EOL => break,
                opt::NOP => {
                    bytes = rest;
                    continue;
                }
                _ => {}
            }
            let len = *rest.first().ok_or(WireError::Malformed)? as usize;
            if len < 2 || len > bytes.len() {
                return Err(WireError::Malformed);
            }
            let data = &bytes[2..len];
            match kind {
                opt::MSS => {
                    let d: [u8; 2] = data.try_into().map_err(|_| WireError::Malformed)?;
                    o.mss = Some(u16::from_be_bytes(d));
                }
                opt::WS => {
                    let [shift] = data else {
                        return Err(WireError::Malformed);
                    };
                    o.window_scale = Some(*shift);
                }
                opt::SACK_PERM => {
                    if !data.is_empty() {
                        return Err(WireError::Malformed);
                    }
                    o.sack_permitted = true;
                }
                opt::SACK => {
                    if data.is_empty() || data.len() % 8 != 0 || data.len() > 32 {
                        return Err(WireError::Malformed);
                    }
                    o.sack_blocks = [None; 4];
                    for (slot, block) in o.sack_blocks.iter_mut().zip(data.chunks_exact(8)) {
                        let left = u32::from_be_bytes([block[0], block[1], block[2], block[3]]);
                        let right = u32::from_be_bytes([block[4], block[5], block[6], block[7]]);
                        *slot = Some(SackBlock {
                            left: SeqNumber(left),
                            right: SeqNumber(right),
                        });
                    }
                }
                opt::TS => {
                    let d: [u8; 8] = data.try_into().map_err(|_| WireError::Malformed)?;
                    let val = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
                    let ecr = u32::from_be_bytes([d[4], d[5], d[6], d[7]]);
                    o.timestamp = Some((val, ecr));
                }
                _ => {}
            }
            bytes = &bytes[len..];
        }
        Ok(o)
    }

    /// Parses an options area as a receiver does (RFC 9293 §3.1: options may appear in
    /// any segment, unknown ones are ignored; §3.2 MUST-7: an illegal length must not
    /// crash), with Linux's rules (`tcp_parse_options`): a missing length byte, or a length
    /// below 2 or overrunning the area, ends the parse and keeps the options before it;
    /// a known option of the wrong length is skipped. So a segment with a malformed
    /// option is processed without the options from there on (a SYN is answered, as
    /// Linux answers it), where [`parse`](Self::parse) rejects it.
    pub fn parse_lenient(mut bytes: &[u8]) -> TcpOptions {
        let mut o = TcpOptions::default();
        while let Some((&kind, rest)) = bytes.split_first() {
            match kind {
                opt::EOL => break,
                opt::NOP => {
                    bytes = rest;
                    continue;
                }
                _ => {}
            }
            let Some(&len) = rest.first() else {
                break;
            };
            let len = usize::from(len);
            if len < 2 || len > bytes.len() {
                break;
            }
            // The option alone, checked strictly: a wrong length skips just this one.
            if let Ok(one) = TcpOptions::parse(&bytes[..len]) {
                o.mss = one.mss.or(o.mss);
                o.window_scale = one.window_scale.or(o.window_scale);
                o.sack_permitted |= one.sack_permitted;
                if one.sack_blocks[0].is_some() {
                    o.sack_blocks = one.sack_blocks;
                }
                o.timestamp = one.timestamp.or(o.timestamp);
            }
            bytes = &bytes[len..];
        }
        o
    }

    /// The number of present SACK blocks (the `Some` entries).
    pub fn sack_count(&self) -> usize {
        self.sack_blocks.iter().flatten().count()
    }

    /// How many SACK blocks [`TcpOptions::emit`] writes: all present ones if they fit in
    /// the 40-byte options area beside the other options, otherwise as many as fit, taken
    /// from the front of `sack_blocks` (RFC 2018 §4: the first block reports the most
    /// recent data, so it is the one to keep). With timestamps that is at most 3 blocks;
    /// with timestamps, MSS and window scale together, at most 2.
    pub fn sack_blocks_to_emit(&self) -> usize {
        let room = MAX_OPTIONS_LEN - self.len_without_sack();
        let fit = room.saturating_sub(4) / 8;
        self.sack_count().min(fit)
    }

    /// Options bytes other than SACK blocks (always a multiple of 4, at most 20).
    fn len_without_sack(&self) -> usize {
        let mut len = 0;
        if self.mss.is_some() {
            len += 4;
        }
        if self.timestamp.is_some() {
            len += 12; // SACK-permitted + TS, or NOP NOP TS
        } else if self.sack_permitted {
            len += 4; // NOP NOP SACK-permitted
        }
        if self.window_scale.is_some() {
            len += 4; // NOP WS
        }
        len
    }

    /// Length in bytes of the options area [`TcpOptions::emit`] writes: a multiple of 4,
    /// at most [`MAX_OPTIONS_LEN`].
    pub fn emitted_len(&self) -> usize {
        let n = self.sack_blocks_to_emit();
        self.len_without_sack() + if n > 0 { 4 + 8 * n } else { 0 }
    }

    /// Writes the options into `buf` and returns the number of bytes written
    /// ([`TcpOptions::emitted_len`]). The layout follows common practice and keeps every
    /// multi-byte option 4-byte aligned: MSS; SACK-permitted + timestamps (or NOP NOP
    /// timestamps, or NOP NOP SACK-permitted); NOP window scale; NOP NOP SACK.
    /// `None` entries in `sack_blocks` are skipped. Fails with [`WireError::Truncated`]
    /// when `buf` is shorter than the options.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.emitted_len();
        let out = buf.get_mut(..len).ok_or(WireError::Truncated)?;
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        if let Some(mss) = self.mss {
            let m = mss.to_be_bytes();
            put(&[opt::MSS, 4, m[0], m[1]]);
        }
        match (self.timestamp, self.sack_permitted) {
            (Some(_), true) => put(&[opt::SACK_PERM, 2]),
            (Some(_), false) => put(&[opt::NOP, opt::NOP]),
            (None, true) => put(&[opt::NOP, opt::NOP, opt::SACK_PERM, 2]),
            (None, false) => {}
        }
        if let Some((val, ecr)) = self.timestamp {
            put(&[opt::TS, 10]);
            put(&val.to_be_bytes());
            put(&ecr.to_be_bytes());
        }
        if let Some(ws) = self.window_scale {
            put(&[opt::NOP, opt::WS, 3, ws]);
        }
        let n = self.sack_blocks_to_emit();
        if n > 0 {
            put(&[opt::NOP, opt::NOP, opt::SACK, (2 + 8 * n) as u8]);
            for block in self.sack_blocks.iter().flatten().take(n) {
                put(&block.left.0.to_be_bytes());
                put(&block.right.0.to_be_bytes());
            }
        }
        debug_assert_eq!(at, len);
        Ok(len)
    }
}

impl TcpRepr {
    /// Parses a checked segment. `src_ip`/`dst_ip` are the addresses of the enclosing IPv4
    /// header, used for the pseudo-header when `verify_checksum` is set (clear it when the
    /// NIC has verified the checksum already). Returns the header and the payload, which
    /// borrows the segment's buffer (not the view), so nothing is copied.
    ///
    /// `ack` is `Some` exactly when the ACK bit is set; `flags` keeps every bit seen,
    /// ACK included. Options are read as [`TcpOptions::parse_lenient`] reads them: a
    /// malformed option does not make the segment malformed.
    pub fn parse<'a, T: AsRef<[u8]> + ?Sized>(
        packet: &TcpPacket<&'a T>,
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
        verify_checksum: bool,
    ) -> Result<(TcpRepr, &'a [u8]), WireError> {
        packet.check_len()?;
        if verify_checksum && !packet.verify_checksum(src_ip, dst_ip) {
            return Err(WireError::Checksum);
        }
        let flags = packet.flags();
        let repr = TcpRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            seq: packet.seq_number(),
            ack: flags.ack().then(|| packet.ack_number()),
            flags,
            window: packet.window_len(),
            urgent: packet.urgent_at(),
            options: TcpOptions::parse_lenient(packet.options()),
        };
        Ok((repr, packet.payload_slice()))
    }

    /// [`TcpRepr::parse`] straight from the segment bytes (the IPv4 payload).
    pub fn parse_segment(
        segment: &[u8],
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
        verify_checksum: bool,
    ) -> Result<(TcpRepr, &[u8]), WireError> {
        let packet = TcpPacket::new_checked(segment)?;
        TcpRepr::parse(&packet, src_ip, dst_ip, verify_checksum)
    }

    /// Length of the header [`TcpRepr::emit`] writes: 20 plus the options, at most 60.
    /// Where the options would not fit in 40 bytes, fewer SACK blocks are emitted (see
    /// [`TcpOptions::sack_blocks_to_emit`]), and this length accounts for that.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.options.emitted_len()
    }

    /// The sequence space a segment with this header and `payload_len` bytes occupies:
    /// the payload plus one for SYN and one for FIN.
    pub fn sequence_len(&self, payload_len: usize) -> usize {
        payload_len + usize::from(self.flags.syn()) + usize::from(self.flags.fin())
    }

    /// The control bits as emitted: `flags` with ACK set exactly when `ack` is `Some`.
    pub fn wire_flags(&self) -> TcpFlags {
        let f = TcpFlags(self.flags.0 & !TcpFlags::ACK.0);
        if self.ack.is_some() {
            f.with(TcpFlags::ACK)
        } else {
            f
        }
    }

    /// Writes the header into `segment[..header_len()]` and fills the checksum over the
    /// pseudo-header, the header and the `payload_len` bytes at
    /// `segment[header_len()..header_len() + payload_len]`, which the caller has already
    /// written there (so a sender writes its payload once, straight into the frame at
    /// offset [`TcpRepr::header_len`], and then emits the header in front of it).
    /// Bytes of `segment` past the payload are left alone.
    ///
    /// Returns the segment length (`header_len() + payload_len`). Fails with
    /// [`WireError::Truncated`] if `segment` is shorter than that and with
    /// [`WireError::Malformed`] if the segment is longer than an IPv4 datagram allows.
    pub fn emit(
        &self,
        segment: &mut [u8],
        payload_len: usize,
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
    ) -> Result<usize, WireError> {
        let (mut p, total) = self.emit_header(segment, payload_len)?;
        p.fill_checksum(src_ip, dst_ip);
        Ok(total)
    }

    /// [`TcpRepr::emit`] for a caller that summed the payload while writing it
    /// (`payload_sum` is its [`checksum::data`]): the checksum is completed from the header
    /// alone, so the payload is not read a second time.
    pub fn emit_with_payload_sum(
        &self,
        segment: &mut [u8],
        payload_len: usize,
        payload_sum: u16,
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
    ) -> Result<usize, WireError> {
        let (mut p, total) = self.emit_header(segment, payload_len)?;
        p.fill_checksum_with_payload_sum(src_ip, dst_ip, payload_sum);
        Ok(total)
    }

    /// [`TcpRepr::emit`] for a link that completes the checksum (checksum offload): the
    /// field gets the pseudo-header sum only, as Linux leaves it for `CHECKSUM_PARTIAL`,
    /// and neither header nor payload is summed here.
    pub fn emit_with_partial_checksum(
        &self,
        segment: &mut [u8],
        payload_len: usize,
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
    ) -> Result<usize, WireError> {
        let (mut p, total) = self.emit_header(segment, payload_len)?;
        let len = u32::try_from(total).unwrap_or(u32::MAX);
        p.set_checksum(checksum::pseudo_header_v4(src_ip, dst_ip, PROTOCOL, len));
        Ok(total)
    }

    /// Writes every header field and option of a segment of `payload_len` bytes of payload
    /// into `segment`, all but the checksum; returns the packet view and the segment length.
    fn emit_header<'a>(
        &self,
        segment: &'a mut [u8],
        payload_len: usize,
    ) -> Result<(TcpPacket<&'a mut [u8]>, usize), WireError> {
        let hl = self.header_len();
        let total = hl.checked_add(payload_len).ok_or(WireError::Malformed)?;
        if total > super::ipv4::MAX_PACKET_LEN - super::ipv4::HEADER_LEN {
            return Err(WireError::Malformed);
        }
        let seg = segment.get_mut(..total).ok_or(WireError::Truncated)?;
        let mut p = TcpPacket::new_unchecked(seg);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_seq_number(self.seq);
        p.set_ack_number(self.ack.unwrap_or_default());
        p.set_header_len(hl);
        p.set_flags(self.wire_flags());
        p.set_window_len(self.window);
        p.set_urgent_at(self.urgent);
        self.options.emit(p.options_mut())?;
        Ok((p, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    // A Linux-style SYN 10.0.0.1:40000 -> 10.0.0.2:80, seq 2^32 - 16, window 64240, with
    // MSS 1460, SACK-permitted, timestamps (0x12345678, 0), NOP, window scale 7. The
    // checksum 0x33df was computed independently of this crate.
    const SYN: [u8; 40] = [
        0x9c, 0x40, 0x00, 0x50, 0xff, 0xff, 0xff, 0xf0, 0x00, 0x00, 0x00, 0x00, 0xa0, 0x02, 0xfa,
        0xf0, 0x33, 0xdf, 0x00, 0x00, 0x02, 0x04, 0x05, 0xb4, 0x04, 0x02, 0x08, 0x0a, 0x12, 0x34,
        0x56, 0x78, 0x00, 0x00, 0x00, 0x00, 0x01, 0x03, 0x03, 0x07,
    ];

    // The reply direction: ACK|PSH, seq 2^32 - 2, ack 5, window 502, NOP NOP TS, "hello"
    // (whose payload wraps the sequence space). Checksum 0xdead computed independently.
    const DATA: [u8; 37] = [
        0x00, 0x50, 0x9c, 0x40, 0xff, 0xff, 0xff, 0xfe, 0x00, 0x00, 0x00, 0x05, 0x80, 0x18, 0x01,
        0xf6, 0xde, 0xad, 0x00, 0x00, 0x01, 0x01, 0x08, 0x0a, 0xde, 0xad, 0xbe, 0xef, 0x01, 0x02,
        0x03, 0x04, 0x68, 0x65, 0x6c, 0x6c, 0x6f,
    ];

    fn syn_repr() -> TcpRepr {
        TcpRepr {
            src_port: 40000,
            dst_port: 80,
            seq: SeqNumber(0xffff_fff0),
            ack: None,
            flags: TcpFlags::SYN,
            window: 64240,
            urgent: 0,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                sack_blocks: [None; 4],
                timestamp: Some((0x1234_5678, 0)),
            },
        }
    }

    fn data_repr() -> TcpRepr {
        TcpRepr {
            src_port: 80,
            dst_port: 40000,
            seq: SeqNumber(0xffff_fffe),
            ack: Some(SeqNumber(5)),
            flags: TcpFlags::ACK | TcpFlags::PSH,
            window: 502,
            urgent: 0,
            options: TcpOptions {
                timestamp: Some((0xdead_beef, 0x0102_0304)),
                ..TcpOptions::default()
            },
        }
    }

    #[test]
    fn parse_known_syn() {
        let p = TcpPacket::new_checked(&SYN[..]).unwrap();
        assert_eq!(p.header_len(), 40);
        assert_eq!(p.checksum(), 0x33df);
        assert!(p.verify_checksum(CLIENT, SERVER));
        assert!(!p.verify_checksum(SERVER, Ipv4Addr::new(10, 0, 0, 3)));
        let (repr, payload) = TcpRepr::parse(&p, CLIENT, SERVER, true).unwrap();
        assert_eq!(repr, syn_repr());
        assert!(payload.is_empty());
        assert_eq!(repr.sequence_len(0), 1);
    }

    #[test]
    fn emit_known_syn() {
        let repr = syn_repr();
        assert_eq!(repr.header_len(), 40);
        let mut buf = [0u8; 64];
        let n = repr.emit(&mut buf, 0, CLIENT, SERVER).unwrap();
        assert_eq!(n, 40);
        assert_eq!(&buf[..40], &SYN);
    }

    #[test]
    fn parse_and_emit_known_data_segment() {
        let (repr, payload) = TcpRepr::parse_segment(&DATA, SERVER, CLIENT, true).unwrap();
        assert_eq!(repr, data_repr());
        assert_eq!(payload, b"hello");
        assert_eq!(repr.seq + payload.len(), SeqNumber(3));

        // The sender writes the payload first, at header_len, then emits the header.
        let mut buf = [0u8; 40];
        let hl = data_repr().header_len();
        buf[hl..hl + 5].copy_from_slice(b"hello");
        let n = data_repr().emit(&mut buf, 5, SERVER, CLIENT).unwrap();
        assert_eq!(&buf[..n], &DATA);
        assert_eq!(&buf[n..], &[0, 0, 0]);
    }

    #[test]
    fn checksum_mismatch_and_skip() {
        let mut d = DATA;
        d[36] ^= 0x20;
        assert_eq!(
            TcpRepr::parse_segment(&d, SERVER, CLIENT, true),
            Err(WireError::Checksum)
        );
        let (_, payload) = TcpRepr::parse_segment(&d, SERVER, CLIENT, false).unwrap();
        assert_eq!(payload, b"hellO");
    }

    #[test]
    fn truncated_at_every_length() {
        for len in 0..SYN.len() {
            assert_eq!(
                TcpPacket::new_checked(&SYN[..len]).err(),
                Some(WireError::Truncated),
                "len {len}"
            );
            assert!(TcpRepr::parse_segment(&SYN[..len], CLIENT, SERVER, false).is_err());
        }
        // A prefix of a data segment that keeps the header is a valid (shorter) segment
        // whose checksum no longer verifies.
        for len in 32..DATA.len() {
            assert_eq!(
                TcpRepr::parse_segment(&DATA[..len], SERVER, CLIENT, true),
                Err(WireError::Checksum)
            );
        }
        let mut buf = [0u8; 64];
        for len in 0..40 {
            assert_eq!(
                syn_repr().emit(&mut buf[..len], 0, CLIENT, SERVER),
                Err(WireError::Truncated)
            );
        }
        assert_eq!(
            data_repr().emit(&mut buf[..36], 5, SERVER, CLIENT),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn bad_data_offset() {
        for off in 0..5u8 {
            let mut d = DATA;
            d[12] = off << 4;
            assert_eq!(
                TcpPacket::new_checked(&d[..]).err(),
                Some(WireError::Malformed)
            );
        }
        let mut d = DATA;
        d[12] = 0xf0; // 60 bytes > 37
        assert_eq!(
            TcpPacket::new_checked(&d[..]).err(),
            Some(WireError::Truncated)
        );
    }

    #[test]
    fn ack_follows_the_bit() {
        let mut d = DATA;
        d[13] = 0x08; // PSH only: the ack field is ignored
        let (repr, _) = TcpRepr::parse_segment(&d, SERVER, CLIENT, false).unwrap();
        assert_eq!(repr.ack, None);
        assert_eq!(repr.flags, TcpFlags::PSH);
        d[13] = 0xff; // every bit
        let (repr, _) = TcpRepr::parse_segment(&d, SERVER, CLIENT, false).unwrap();
        assert_eq!(repr.ack, Some(SeqNumber(5)));
        assert_eq!(repr.flags, TcpFlags(0xff));

        // Emit: ACK comes from `ack`, not from `flags`.
        let mut buf = [0u8; 64];
        let r = TcpRepr {
            flags: TcpFlags::ACK | TcpFlags::FIN,
            ack: None,
            ..data_repr()
        };
        r.emit(&mut buf, 0, SERVER, CLIENT).unwrap();
        assert_eq!(buf[13], 0x01);
        assert_eq!(&buf[8..12], &[0, 0, 0, 0]);
        let r = TcpRepr {
            flags: TcpFlags::RST,
            ack: Some(SeqNumber(u32::MAX)),
            ..data_repr()
        };
        r.emit(&mut buf, 0, SERVER, CLIENT).unwrap();
        assert_eq!(buf[13], 0x14);
        assert_eq!(&buf[8..12], &[0xff; 4]);
    }

    /// A receiver's reading: the options before a malformed length are kept, a known
    /// option of the wrong length is skipped, unknown ones are ignored (as Linux's
    /// `tcp_parse_options`).
    #[test]
    fn lenient_options_parse_like_linux() {
        // MSS, then a length of 0: MSS kept, the rest ignored.
        let o = TcpOptions::parse_lenient(&[2, 4, 0x05, 0xb4, 30, 0, 3, 3, 7]);
        assert_eq!((o.mss, o.window_scale), (Some(1460), None));
        // Overrunning length, missing length byte.
        assert_eq!(
            TcpOptions::parse_lenient(&[2, 4, 0x05, 0xb4, 8, 10, 0, 0]).mss,
            Some(1460)
        );
        assert_eq!(TcpOptions::parse_lenient(&[1, 1, 2]), TcpOptions::default());
        // A wrong-length MSS is skipped; the window scale after it is read.
        let o = TcpOptions::parse_lenient(&[2, 3, 5, 1, 3, 3, 7, 0]);
        assert_eq!((o.mss, o.window_scale), (None, Some(7)));
        // Well-formed areas read as the strict parse reads them.
        let good = [
            2, 4, 0x23, 0x28, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 3, 3, 7,
        ];
        assert_eq!(
            Ok(TcpOptions::parse_lenient(&good)),
            TcpOptions::parse(&good)
        );
    }

    #[test]
    fn options_parse_edge_cases() {
        // Empty, EOL then garbage, NOPs only.
        assert_eq!(TcpOptions::parse(&[]), Ok(TcpOptions::default()));
        assert_eq!(
            TcpOptions::parse(&[0, 0xff, 0xff, 0xff]),
            Ok(TcpOptions::default())
        );
        assert_eq!(TcpOptions::parse(&[1, 1, 1, 1]), Ok(TcpOptions::default()));
        // Unknown option (kind 30, MPTCP) of sane length skipped, then MSS.
        let o = TcpOptions::parse(&[30, 4, 0xaa, 0xbb, 2, 4, 0x23, 0x28]).unwrap();
        assert_eq!(o.mss, Some(9000));
        // Length 0 or 1: would loop forever or not advance.
        for bad in [[30u8, 0], [30, 1], [2, 0], [5, 1]] {
            assert_eq!(TcpOptions::parse(&bad), Err(WireError::Malformed));
        }
        // Missing length byte, overrunning length.
        assert_eq!(TcpOptions::parse(&[2]), Err(WireError::Malformed));
        assert_eq!(TcpOptions::parse(&[1, 30]), Err(WireError::Malformed));
        assert_eq!(TcpOptions::parse(&[2, 4, 5]), Err(WireError::Malformed));
        assert_eq!(TcpOptions::parse(&[30, 5, 0, 0]), Err(WireError::Malformed));
        // Known option, wrong length.
        assert_eq!(TcpOptions::parse(&[2, 3, 5]), Err(WireError::Malformed));
        assert_eq!(TcpOptions::parse(&[3, 4, 7, 0]), Err(WireError::Malformed));
        assert_eq!(TcpOptions::parse(&[4, 3, 0]), Err(WireError::Malformed));
        assert_eq!(
            TcpOptions::parse(&[8, 8, 0, 0, 0, 0, 0, 0]),
            Err(WireError::Malformed)
        );
        assert_eq!(TcpOptions::parse(&[5, 2]), Err(WireError::Malformed));
        assert_eq!(
            TcpOptions::parse(&[5, 6, 0, 0, 0, 0]),
            Err(WireError::Malformed)
        );
        // SACK with 4 blocks straddling the wrap.
        let mut s = vec![5u8, 34];
        for i in 0..4u32 {
            s.extend_from_slice(&(u32::MAX - 100).wrapping_add(50 * i).to_be_bytes());
            s.extend_from_slice(&(u32::MAX - 80).wrapping_add(50 * i).to_be_bytes());
        }
        let o = TcpOptions::parse(&s).unwrap();
        assert_eq!(o.sack_count(), 4);
        assert_eq!(
            o.sack_blocks[3],
            Some(SackBlock {
                left: SeqNumber(49),
                right: SeqNumber(69)
            })
        );
    }

    fn blocks(n: usize) -> [Option<SackBlock>; 4] {
        let mut b = [None; 4];
        for (i, slot) in b.iter_mut().enumerate().take(n) {
            let left = SeqNumber(u32::MAX - 1000) + i * 100;
            *slot = Some(SackBlock {
                left,
                right: left + 50,
            });
        }
        b
    }

    #[test]
    fn sack_blocks_trimmed_to_fit() {
        let full = TcpOptions {
            mss: Some(1460),
            window_scale: Some(14),
            sack_permitted: true,
            sack_blocks: blocks(4),
            timestamp: Some((1, 2)),
        };
        assert_eq!(full.sack_blocks_to_emit(), 2);
        assert_eq!(full.emitted_len(), 40);
        let ts_only = TcpOptions {
            sack_blocks: blocks(4),
            timestamp: Some((1, 2)),
            ..TcpOptions::default()
        };
        assert_eq!(ts_only.sack_blocks_to_emit(), 3);
        assert_eq!(ts_only.emitted_len(), 12 + 4 + 24);
        let bare = TcpOptions {
            sack_blocks: blocks(4),
            ..TcpOptions::default()
        };
        assert_eq!(bare.sack_blocks_to_emit(), 4);
        assert_eq!(bare.emitted_len(), 36);

        let repr = TcpRepr {
            options: full,
            ..data_repr()
        };
        assert_eq!(repr.header_len(), 60);
        let mut buf = [0u8; 60];
        repr.emit(&mut buf, 0, SERVER, CLIENT).unwrap();
        let (parsed, _) = TcpRepr::parse_segment(&buf, SERVER, CLIENT, true).unwrap();
        let mut expected = full;
        expected.sack_blocks[2] = None;
        expected.sack_blocks[3] = None;
        assert_eq!(parsed.options, expected);
    }
}
