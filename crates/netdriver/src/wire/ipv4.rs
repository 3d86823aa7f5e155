//! IPv4 header (RFC 791 §3.1), with the header checksum of RFC 791 §3.1 / RFC 1071.
//!
//! This stack sends only unfragmented datagrams with DF set (RFC 791 §3.2; the
//! identification field is still filled per datagram, cf. RFC 6864 §4) and does not
//! reassemble: a received fragment (MF set or a non-zero fragment offset) is reported as
//! [`WireError::Unsupported`]. Options (RFC 791 §3.1, "Options") are skipped, never
//! interpreted. Bytes past the total length (Ethernet padding of short frames) are ignored.

use std::net::Ipv4Addr;

use super::{checksum, WireError};

/// The protocol field: which transport the payload carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpProtocol {
    /// ICMP (1).
    Icmp,
    /// TCP (6).
    Tcp,
    /// UDP (17).
    Udp,
    /// Any other protocol number, kept as seen.
    Unknown(u8),
}

impl From<u8> for IpProtocol {
    fn from(v: u8) -> IpProtocol {
        match v {
            1 => IpProtocol::Icmp,
            6 => IpProtocol::Tcp,
            17 => IpProtocol::Udp,
            other => IpProtocol::Unknown(other),
        }
    }
}

impl From<IpProtocol> for u8 {
    fn from(p: IpProtocol) -> u8 {
        match p {
            IpProtocol::Icmp => 1,
            IpProtocol::Tcp => 6,
            IpProtocol::Udp => 17,
            IpProtocol::Unknown(v) => v,
        }
    }
}

/// Length of an IPv4 header without options (what [`Ipv4Repr::emit`] writes).
pub const HEADER_LEN: usize = 20;

/// The largest total length the header can express.
pub const MAX_PACKET_LEN: usize = 65535;

mod field {
    use core::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
}

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// A zero-copy view of an IPv4 packet.
///
/// [`Ipv4Packet::new_checked`] validates version, header length and total length, after
/// which every accessor is in bounds. A view from [`Ipv4Packet::new_unchecked`] over a
/// buffer shorter than the header it claims panics on access; use it only on buffers you
/// sized yourself (when emitting).
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps a buffer without any check.
    pub const fn new_unchecked(buffer: T) -> Ipv4Packet<T> {
        Ipv4Packet { buffer }
    }

    /// Wraps a buffer after [`Ipv4Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Ipv4Packet<T>, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer holds the fixed header, that the version is 4, that the
    /// header length is at least 20 and fits, and that the total length covers the header
    /// and fits in the buffer.
    pub fn check_len(&self) -> Result<(), WireError> {
        self.check_len_within(self.buffer.as_ref().len())
    }

    /// [`check_len`](Self::check_len) for a buffer that holds only the datagram's front
    /// (the first buffer of a frame received as a chain): the header must fit in the
    /// buffer and the total length in the `datagram_len` bytes the frame carries after its
    /// link header.
    pub fn check_len_within(&self, datagram_len: usize) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if self.version() != 4 {
            return Err(WireError::Malformed);
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(WireError::Malformed);
        }
        if b.len() < hl {
            return Err(WireError::Truncated);
        }
        let total = self.total_len() as usize;
        if total < hl {
            return Err(WireError::Malformed);
        }
        if datagram_len < total {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// Gives back the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Version field (4 for a valid packet).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        (self.buffer.as_ref()[field::VER_IHL] & 0x0f) as usize * 4
    }

    /// The DSCP and ECN bits (the former type-of-service octet).
    pub fn dscp_ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN]
    }

    /// Total length of header and payload.
    pub fn total_len(&self) -> u16 {
        self.read_u16(field::LENGTH.start)
    }

    /// Identification.
    pub fn ident(&self) -> u16 {
        self.read_u16(field::IDENT.start)
    }

    /// Whether Don't Fragment is set.
    pub fn dont_frag(&self) -> bool {
        self.read_u16(field::FLG_OFF.start) & FLAG_DF != 0
    }

    /// Whether More Fragments is set.
    pub fn more_frags(&self) -> bool {
        self.read_u16(field::FLG_OFF.start) & FLAG_MF != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (self.read_u16(field::FLG_OFF.start) & OFFSET_MASK) << 3
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// Protocol of the payload.
    pub fn protocol(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::PROTOCOL])
    }

    /// Header checksum as on the wire.
    pub fn checksum(&self) -> u16 {
        self.read_u16(field::CHECKSUM.start)
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::SRC];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::DST];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// Whether the header checksum verifies (the sum over the header, options included,
    /// is all ones).
    pub fn verify_checksum(&self) -> bool {
        checksum::data(&self.buffer.as_ref()[..self.header_len()]) == 0xffff
    }

    /// The option bytes (empty when IHL is 5).
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }

    /// The payload: from the end of the header to the total length (padding excluded).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.total_len() as usize]
    }

    fn read_u16(&self, at: usize) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[at], b[at + 1]])
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Ipv4Packet<&'a T> {
    /// The payload, borrowed for the buffer's lifetime rather than the view's.
    pub fn payload_slice(&self) -> &'a [u8] {
        let b: &'a [u8] = self.buffer.as_ref();
        &b[self.header_len()..self.total_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Sets version and header length (in bytes, a multiple of 4).
    pub fn set_version_and_header_len(&mut self, version: u8, header_len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = (version << 4) | ((header_len / 4) as u8 & 0x0f);
    }

    /// Sets the DSCP/ECN octet.
    pub fn set_dscp_ecn(&mut self, v: u8) {
        self.buffer.as_mut()[field::DSCP_ECN] = v;
    }

    /// Sets the total length.
    pub fn set_total_len(&mut self, v: u16) {
        self.write_u16(field::LENGTH.start, v);
    }

    /// Sets the identification.
    pub fn set_ident(&mut self, v: u16) {
        self.write_u16(field::IDENT.start, v);
    }

    /// Sets the flags (DF, MF) and the fragment offset in bytes (a multiple of 8).
    pub fn set_flags_and_frag_offset(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let mut v = (offset >> 3) & OFFSET_MASK;
        if dont_frag {
            v |= FLAG_DF;
        }
        if more_frags {
            v |= FLAG_MF;
        }
        self.write_u16(field::FLG_OFF.start, v);
    }

    /// Sets the time to live.
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }

    /// Sets the protocol.
    pub fn set_protocol(&mut self, p: IpProtocol) {
        self.buffer.as_mut()[field::PROTOCOL] = p.into();
    }

    /// Sets the checksum field to a raw value.
    pub fn set_checksum(&mut self, v: u16) {
        self.write_u16(field::CHECKSUM.start, v);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.octets());
    }

    /// Computes and writes the header checksum over the header as currently written.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let sum = checksum::checksum(&self.buffer.as_ref()[..hl]);
        self.set_checksum(sum);
    }

    /// The payload region (header end to total length), mutably.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (hl, total) = (self.header_len(), self.total_len() as usize);
        &mut self.buffer.as_mut()[hl..total]
    }

    fn write_u16(&mut self, at: usize, v: u16) {
        self.buffer.as_mut()[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
}

/// A parsed IPv4 header (options dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Protocol of the payload.
    pub protocol: IpProtocol,
    /// Length of the payload (total length minus header length).
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// DSCP and ECN bits.
    pub dscp_ecn: u8,
}

impl Ipv4Repr {
    /// Parses a checked packet. Verifies the header checksum when `verify_checksum` is set
    /// (clear it when the NIC has already verified it). Fragments are
    /// [`WireError::Unsupported`].
    pub fn parse<T: AsRef<[u8]>>(
        packet: &Ipv4Packet<T>,
        verify_checksum: bool,
    ) -> Result<Ipv4Repr, WireError> {
        Ipv4Repr::parse_within(packet, packet.buffer.as_ref().len(), verify_checksum)
    }

    /// [`parse`](Self::parse) for a buffer holding the datagram's front, `datagram_len`
    /// bytes in all ([`Ipv4Packet::check_len_within`]).
    pub fn parse_within<T: AsRef<[u8]>>(
        packet: &Ipv4Packet<T>,
        datagram_len: usize,
        verify_checksum: bool,
    ) -> Result<Ipv4Repr, WireError> {
        packet.check_len_within(datagram_len)?;
        if verify_checksum && !packet.verify_checksum() {
            return Err(WireError::Checksum);
        }
        if packet.more_frags() || packet.frag_offset() != 0 {
            return Err(WireError::Unsupported);
        }
        Ok(Ipv4Repr {
            src: packet.src_addr(),
            dst: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: packet.total_len() as usize - packet.header_len(),
            ttl: packet.ttl(),
            dscp_ecn: packet.dscp_ecn(),
        })
    }

    /// Length of the header this emits (always 20: no options are sent).
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Length of header plus payload.
    pub const fn total_len(&self) -> usize {
        HEADER_LEN + self.payload_len
    }

    /// Writes a 20-byte header into the front of `buf` with DF set, identification
    /// `ident` and a correct checksum. Only the header is written; `buf` may be just the
    /// header or the whole datagram. Fails with [`WireError::Truncated`] if `buf` is
    /// shorter than the header and with [`WireError::Malformed`] if the payload length
    /// cannot be expressed in the total-length field.
    pub fn emit(&self, buf: &mut [u8], ident: u16) -> Result<(), WireError> {
        if buf.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let total = u16::try_from(self.total_len()).map_err(|_| WireError::Malformed)?;
        let mut p = Ipv4Packet::new_unchecked(&mut buf[..HEADER_LEN]);
        p.set_version_and_header_len(4, HEADER_LEN);
        p.set_dscp_ecn(self.dscp_ecn);
        p.set_total_len(total);
        p.set_ident(ident);
        p.set_flags_and_frag_offset(true, false, 0);
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        p.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A UDP header (checksum left zero; `packet()` fills it) followed by 4 payload bytes
    // and 2 bytes of Ethernet padding past the total length of 24.
    const PACKET: [u8; 26] = [
        0x45, 0x00, 0x00, 0x18, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x00,
    ];

    fn packet() -> [u8; 26] {
        let mut p = PACKET;
        let mut v = Ipv4Packet::new_unchecked(&mut p[..]);
        v.fill_checksum();
        p
    }

    #[test]
    fn known_checksum() {
        // The classic example header: 4500 0073 0000 4000 4011 [b861] c0a8 0001 c0a8 00c7.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum::checksum(&hdr), 0xb861);
        let mut with = hdr;
        with[10] = 0xb8;
        with[11] = 0x61;
        let mut with_payload = with.to_vec();
        with_payload.resize(0x73, 0);
        let p = Ipv4Packet::new_checked(&with_payload[..]).unwrap();
        assert!(p.verify_checksum());
        let repr = Ipv4Repr::parse(&p, true).unwrap();
        assert_eq!(repr.protocol, IpProtocol::Udp);
        assert_eq!(repr.payload_len, 0x73 - 20);
        assert_eq!(repr.src, Ipv4Addr::new(192, 168, 0, 1));
        assert_eq!(repr.dst, Ipv4Addr::new(192, 168, 0, 199));
        assert_eq!(repr.ttl, 64);
    }

    #[test]
    fn parse_ignores_padding() {
        let p = packet();
        let v = Ipv4Packet::new_checked(&p[..]).unwrap();
        let repr = Ipv4Repr::parse(&v, true).unwrap();
        assert_eq!(repr.payload_len, 4);
        assert_eq!(v.payload(), &[0xde, 0xad, 0xbe, 0xef]);
        assert!(v.dont_frag());
    }

    #[test]
    fn emit_matches_known_bytes() {
        let repr = Ipv4Repr {
            src: Ipv4Addr::new(192, 168, 0, 1),
            dst: Ipv4Addr::new(192, 168, 0, 199),
            protocol: IpProtocol::Udp,
            payload_len: 0x73 - 20,
            ttl: 64,
            dscp_ecn: 0,
        };
        let mut buf = [0u8; 20];
        repr.emit(&mut buf, 0).unwrap();
        assert_eq!(
            buf,
            [
                0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
                0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7
            ]
        );
        assert_eq!(repr.emit(&mut buf[..19], 0), Err(WireError::Truncated));
        let huge = Ipv4Repr {
            payload_len: 65536,
            ..repr
        };
        assert_eq!(huge.emit(&mut buf, 0), Err(WireError::Malformed));
    }

    #[test]
    fn truncated_at_every_length() {
        let p = packet();
        for len in 0..24 {
            assert_eq!(
                Ipv4Packet::new_checked(&p[..len]).err(),
                Some(WireError::Truncated),
                "len {len}"
            );
        }
        assert!(Ipv4Packet::new_checked(&p[..24]).is_ok());
    }

    #[test]
    fn bad_fields() {
        let mut p = packet();
        p[0] = 0x65; // version 6
        assert_eq!(
            Ipv4Packet::new_checked(&p[..]).err(),
            Some(WireError::Malformed)
        );
        let mut p = packet();
        p[0] = 0x44; // IHL 4
        assert_eq!(
            Ipv4Packet::new_checked(&p[..]).err(),
            Some(WireError::Malformed)
        );
        let mut p = packet();
        p[0] = 0x47; // IHL 7 = 28 bytes > buffer of 26
        assert_eq!(
            Ipv4Packet::new_checked(&p[..]).err(),
            Some(WireError::Truncated)
        );
        let mut p = packet();
        p[0] = 0x46; // IHL 6 = 24 bytes > total length 23
        p[3] = 23;
        assert_eq!(
            Ipv4Packet::new_checked(&p[..]).err(),
            Some(WireError::Malformed)
        );
        let mut p = packet();
        p[3] = 19; // total length below header
        assert_eq!(
            Ipv4Packet::new_checked(&p[..]).err(),
            Some(WireError::Malformed)
        );
        let mut p = packet();
        p[3] = 27; // total length beyond buffer
        assert_eq!(
            Ipv4Packet::new_checked(&p[..]).err(),
            Some(WireError::Truncated)
        );
        let mut p = packet();
        p[8] ^= 1; // corrupt TTL
        let v = Ipv4Packet::new_checked(&p[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&v, true), Err(WireError::Checksum));
        assert!(Ipv4Repr::parse(&v, false).is_ok());
    }

    #[test]
    fn fragments_are_unsupported() {
        for (flags_hi, flags_lo) in [(0x20, 0x00), (0x00, 0x01), (0x40, 0x10)] {
            let mut p = packet();
            p[6] = flags_hi;
            p[7] = flags_lo;
            let mut v = Ipv4Packet::new_unchecked(&mut p[..]);
            v.fill_checksum();
            let v = Ipv4Packet::new_checked(&p[..]).unwrap();
            assert_eq!(Ipv4Repr::parse(&v, true), Err(WireError::Unsupported));
        }
    }

    #[test]
    fn options_are_skipped() {
        // IHL 6: one 4-byte option (NOP NOP NOP EOL) then 4 payload bytes.
        let mut p = vec![0x46, 0x00, 0x00, 28, 0, 0, 0x40, 0, 64, 6, 0, 0];
        p.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        p.extend_from_slice(&[1, 1, 1, 0]);
        p.extend_from_slice(&[1, 2, 3, 4]);
        Ipv4Packet::new_unchecked(&mut p[..]).fill_checksum();
        let v = Ipv4Packet::new_checked(&p[..]).unwrap();
        let repr = Ipv4Repr::parse(&v, true).unwrap();
        assert_eq!(repr.payload_len, 4);
        assert_eq!(v.options(), &[1, 1, 1, 0]);
        assert_eq!(v.payload(), &[1, 2, 3, 4]);
        assert_eq!(repr.protocol, IpProtocol::Tcp);
    }
}
