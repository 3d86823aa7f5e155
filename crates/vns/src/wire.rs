//! The NetChannel chunk header: a zero-copy view ([`ChunkPacket`]) with field ranges, and a
//! parsed, validated representation ([`ChunkRepr`]). Layout and rules are documented in
//! `docs/wire-format.md`; parsing never panics on any input.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-------------------------------+-------------------------------+
//! |      source virtual port      |   destination virtual port    |
//! +-------------------------------+-------------------------------+
//! |                   per-socket byte sequence                    |
//! +---------------------------------------------------------------+
//! |                      receiver credit                          |
//! +-------+-------+---------------+-------------------------------+
//! |version|hdr len|     type      |        payload length         |
//! +-------+-------+---------------+-------------------------------+
//! ```

use core::fmt;
use core::ops::Range;

use thiserror::Error;

/// The header version this crate speaks.
pub const VERSION: u8 = 1;
/// Length of a version-1 header in bytes.
pub const HEADER_LEN: usize = 16;
/// The largest payload a chunk can carry (the payload-length field is 16 bits).
pub const MAX_PAYLOAD: usize = u16::MAX as usize;

mod field {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const SEQ: Range<usize> = 4..8;
    pub const CREDIT: Range<usize> = 8..12;
    pub const VERSION_HLEN: usize = 12;
    pub const TYPE: usize = 13;
    pub const PAYLOAD_LEN: Range<usize> = 14..16;
}

/// A per-socket byte sequence number. Arithmetic wraps modulo 2^32 and comparisons are
/// circular (valid while the two numbers are less than 2^31 apart), like TCP's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seq(pub u32);

impl Seq {
    /// The sequence number `n` bytes after this one.
    #[must_use]
    pub fn plus(self, n: u32) -> Seq {
        Seq(self.0.wrapping_add(n))
    }

    /// The signed distance from `base` to `self` (positive when `self` is after `base`).
    pub fn since(self, base: Seq) -> i64 {
        i64::from(self.0.wrapping_sub(base.0) as i32)
    }

    /// Whether `self` is strictly after `other` in circular order.
    pub fn is_after(self, other: Seq) -> bool {
        self.since(other) > 0
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What a chunk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkType {
    /// Payload bytes of the stream starting at the sequence number.
    Data,
    /// A credit update only (the credit field is the news).
    Ack,
    /// Connection request (first half of the two-way handshake).
    Sync,
    /// Connection accepted (second half of the two-way handshake).
    SyncAck,
    /// The sender will send no more data; the sequence number is the stream's end.
    Fin,
    /// Abortive close (ordered: applies once the bytes before its sequence number have
    /// arrived), or refusal of a connection request (unordered).
    Reset,
    /// The receiver's buffer is full: stop sending data even within credit.
    Stop,
    /// The receiver drained its buffer: data may flow again.
    Resume,
}

impl ChunkType {
    /// The type's code on the wire.
    pub fn code(self) -> u8 {
        match self {
            ChunkType::Data => 1,
            ChunkType::Ack => 2,
            ChunkType::Sync => 3,
            ChunkType::SyncAck => 4,
            ChunkType::Fin => 5,
            ChunkType::Reset => 6,
            ChunkType::Stop => 7,
            ChunkType::Resume => 8,
        }
    }

    /// The type with this wire code, if any.
    pub fn from_code(code: u8) -> Option<ChunkType> {
        Some(match code {
            1 => ChunkType::Data,
            2 => ChunkType::Ack,
            3 => ChunkType::Sync,
            4 => ChunkType::SyncAck,
            5 => ChunkType::Fin,
            6 => ChunkType::Reset,
            7 => ChunkType::Stop,
            8 => ChunkType::Resume,
            _ => return None,
        })
    }
}

/// Why bytes are not a valid chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WireError {
    /// Fewer bytes than a header (or than the header plus its declared payload).
    #[error("truncated chunk: need {needed} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        have: usize,
    },
    /// The version nibble is not one this crate speaks.
    #[error("unsupported NetChannel header version {0}")]
    BadVersion(u8),
    /// The header-length nibble does not match the version's header length.
    #[error("bad header length {0} bytes")]
    BadHeaderLength(usize),
    /// The type byte is not a known chunk type.
    #[error("unknown chunk type {0}")]
    BadType(u8),
    /// The payload length is not allowed for the type (data needs 1.., control needs 0), or
    /// exceeds the receiver's configured maximum.
    #[error("payload length {len} not allowed for {ty:?}")]
    BadPayloadLength {
        /// The chunk's type.
        ty: ChunkType,
        /// The declared payload length.
        len: usize,
    },
}

/// A read/write view of a chunk (header followed by payload) in a byte buffer.
#[derive(Debug, Clone)]
pub struct ChunkPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ChunkPacket<T> {
    /// Wraps a buffer without any check; accessors may panic on a short buffer. Use
    /// [`ChunkPacket::new_checked`] for untrusted input.
    pub fn new_unchecked(buffer: T) -> Self {
        ChunkPacket { buffer }
    }

    /// Wraps a buffer after checking it holds at least a header and the declared payload.
    /// Field values are not validated; [`ChunkRepr::parse`] does that.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks the buffer holds a header and the payload its header declares.
    pub fn check_len(&self) -> Result<(), WireError> {
        let have = self.buffer.as_ref().len();
        if have < HEADER_LEN {
            return Err(WireError::Truncated {
                needed: HEADER_LEN,
                have,
            });
        }
        let needed = HEADER_LEN + usize::from(self.payload_len());
        if have < needed {
            return Err(WireError::Truncated { needed, have });
        }
        Ok(())
    }

    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u16_at(&self, r: Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    fn u32_at(&self, r: Range<usize>) -> u32 {
        let b = &self.buffer.as_ref()[r];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Source virtual port.
    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC_PORT)
    }
    /// Destination virtual port.
    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST_PORT)
    }
    /// Per-socket byte sequence number.
    pub fn seq(&self) -> Seq {
        Seq(self.u32_at(field::SEQ))
    }
    /// Receiver credit.
    pub fn credit(&self) -> u32 {
        self.u32_at(field::CREDIT)
    }
    /// Header version (top nibble of byte 12).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION_HLEN] >> 4
    }
    /// Header length in bytes (bottom nibble of byte 12, in 4-byte words).
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VERSION_HLEN] & 0x0f) * 4
    }
    /// Raw type code.
    pub fn type_code(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    /// Declared payload length.
    pub fn payload_len(&self) -> u16 {
        self.u16_at(field::PAYLOAD_LEN)
    }
    /// The payload (needs a length-checked packet).
    pub fn payload(&self) -> &[u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        &self.buffer.as_ref()[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ChunkPacket<T> {
    fn put_u16(&mut self, r: Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }
    fn put_u32(&mut self, r: Range<usize>, v: u32) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the source virtual port.
    pub fn set_src_port(&mut self, v: u16) {
        self.put_u16(field::SRC_PORT, v)
    }
    /// Sets the destination virtual port.
    pub fn set_dst_port(&mut self, v: u16) {
        self.put_u16(field::DST_PORT, v)
    }
    /// Sets the sequence number.
    pub fn set_seq(&mut self, v: Seq) {
        self.put_u32(field::SEQ, v.0)
    }
    /// Sets the credit.
    pub fn set_credit(&mut self, v: u32) {
        self.put_u32(field::CREDIT, v)
    }
    /// Sets version and header length (in bytes, a multiple of 4 up to 60).
    pub fn set_version_and_header_len(&mut self, version: u8, header_len: usize) {
        let words = (header_len / 4) as u8 & 0x0f;
        self.buffer.as_mut()[field::VERSION_HLEN] = (version << 4) | words;
    }
    /// Sets the raw type code.
    pub fn set_type_code(&mut self, v: u8) {
        self.buffer.as_mut()[field::TYPE] = v
    }
    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        self.put_u16(field::PAYLOAD_LEN, v)
    }
    /// The payload, mutably (needs a length-checked packet).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// A parsed, validated chunk header.
///
/// Field meaning depends on the type (see `docs/wire-format.md`): `seq` is the first
/// payload byte for DATA, the end of the stream for FIN and for an ordered RESET, the
/// initial sequence number for SYNC/SYNC_ACK, and the sender's flow-control epoch for
/// STOP/RESUME/ACK. `credit` is a window size in bytes in SYNC/SYNC_ACK, whether a RESET
/// is ordered (`1`) or not (`0`) in RESET, and otherwise the absolute sequence number up
/// to which the peer may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkRepr {
    /// Sender's virtual port.
    pub src_port: u16,
    /// Receiver's virtual port.
    pub dst_port: u16,
    /// Sequence number (meaning per type).
    pub seq: Seq,
    /// Receiver credit (meaning per type).
    pub credit: u32,
    /// Chunk type.
    pub ty: ChunkType,
    /// Payload length in bytes.
    pub payload_len: u16,
}

impl ChunkRepr {
    /// Validates the header in `packet` (which must be length-checked for the header; the
    /// payload need not be present) and returns its representation.
    pub fn parse_header(packet: &ChunkPacket<&[u8]>) -> Result<ChunkRepr, WireError> {
        let have = packet.buffer.len();
        if have < HEADER_LEN {
            return Err(WireError::Truncated {
                needed: HEADER_LEN,
                have,
            });
        }
        let version = packet.version();
        if version != VERSION {
            return Err(WireError::BadVersion(version));
        }
        if packet.header_len() != HEADER_LEN {
            return Err(WireError::BadHeaderLength(packet.header_len()));
        }
        let code = packet.type_code();
        let ty = ChunkType::from_code(code).ok_or(WireError::BadType(code))?;
        let payload_len = packet.payload_len();
        let ok = match ty {
            ChunkType::Data => payload_len > 0,
            _ => payload_len == 0,
        };
        if !ok {
            return Err(WireError::BadPayloadLength {
                ty,
                len: usize::from(payload_len),
            });
        }
        Ok(ChunkRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            seq: packet.seq(),
            credit: packet.credit(),
            ty,
            payload_len,
        })
    }

    /// Parses a whole chunk: validates the header and checks the payload is present.
    /// Returns the header and the payload slice.
    pub fn parse(bytes: &[u8]) -> Result<(ChunkRepr, &[u8]), WireError> {
        let repr = Self::parse_header(&ChunkPacket::new_unchecked(bytes))?;
        let packet = ChunkPacket::new_checked(bytes)?;
        let end = HEADER_LEN + usize::from(repr.payload_len);
        Ok((repr, &packet.into_inner()[HEADER_LEN..end]))
    }

    /// Bytes this chunk occupies on the wire (header plus payload).
    pub fn wire_len(&self) -> usize {
        HEADER_LEN + usize::from(self.payload_len)
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `packet`'s buffer.
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`] (a caller bug, not input).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut ChunkPacket<T>) {
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_seq(self.seq);
        packet.set_credit(self.credit);
        packet.set_version_and_header_len(VERSION, HEADER_LEN);
        packet.set_type_code(self.ty.code());
        packet.set_payload_len(self.payload_len);
    }

    /// Appends header and `payload` to `out`. `payload.len()` must equal `payload_len`.
    pub fn emit_to_vec(&self, payload: &[u8], out: &mut Vec<u8>) {
        debug_assert_eq!(payload.len(), usize::from(self.payload_len));
        let start = out.len();
        out.resize(start + HEADER_LEN, 0);
        self.emit(&mut ChunkPacket::new_unchecked(&mut out[start..]));
        out.extend_from_slice(payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ChunkRepr {
        ChunkRepr {
            src_port: 0x1234,
            dst_port: 0xabcd,
            seq: Seq(0xdead_beef),
            credit: 0x0102_0304,
            ty: ChunkType::Data,
            payload_len: 3,
        }
    }

    const SAMPLE_BYTES: [u8; 19] = [
        0x12, 0x34, 0xab, 0xcd, 0xde, 0xad, 0xbe, 0xef, 0x01, 0x02, 0x03, 0x04, 0x14, 0x01, 0x00,
        0x03, b'a', b'b', b'c',
    ];

    #[test]
    fn emits_exact_bytes() {
        let mut out = Vec::new();
        sample().emit_to_vec(b"abc", &mut out);
        assert_eq!(out, SAMPLE_BYTES);
    }

    #[test]
    fn parses_every_field() {
        let (repr, payload) = ChunkRepr::parse(&SAMPLE_BYTES).unwrap();
        assert_eq!(repr, sample());
        assert_eq!(payload, b"abc");
        let p = ChunkPacket::new_checked(&SAMPLE_BYTES[..]).unwrap();
        assert_eq!(p.version(), 1);
        assert_eq!(p.header_len(), 16);
        assert_eq!(p.type_code(), 1);
    }

    #[test]
    fn round_trips_every_type() {
        for code in 1..=8 {
            let ty = ChunkType::from_code(code).unwrap();
            assert_eq!(ty.code(), code);
            let len = if ty == ChunkType::Data { 5 } else { 0 };
            let repr = ChunkRepr {
                src_port: code.into(),
                dst_port: 65535,
                seq: Seq(u32::MAX - u32::from(code)),
                credit: u32::MAX,
                ty,
                payload_len: len,
            };
            let payload = vec![code; usize::from(len)];
            let mut out = Vec::new();
            repr.emit_to_vec(&payload, &mut out);
            assert_eq!(out.len(), repr.wire_len());
            let (back, p) = ChunkRepr::parse(&out).unwrap();
            assert_eq!(back, repr);
            assert_eq!(p, &payload[..]);
        }
    }

    #[test]
    fn rejects_every_truncated_prefix() {
        for n in 0..SAMPLE_BYTES.len() {
            assert!(
                matches!(
                    ChunkRepr::parse(&SAMPLE_BYTES[..n]),
                    Err(WireError::Truncated { .. })
                ),
                "prefix {n}"
            );
        }
    }

    #[test]
    fn rejects_bad_version_header_len_type_and_payload_len() {
        let mut b = SAMPLE_BYTES;
        b[12] = 0x24;
        assert_eq!(ChunkRepr::parse(&b).unwrap_err(), WireError::BadVersion(2));
        b[12] = 0x04;
        assert_eq!(ChunkRepr::parse(&b).unwrap_err(), WireError::BadVersion(0));
        // The paper's header-length byte (16) reads as version 1 with a zero length.
        b[12] = 0x10;
        assert_eq!(
            ChunkRepr::parse(&b).unwrap_err(),
            WireError::BadHeaderLength(0)
        );
        b[12] = 0x15;
        assert_eq!(
            ChunkRepr::parse(&b).unwrap_err(),
            WireError::BadHeaderLength(20)
        );
        b[12] = 0x14;
        for code in [0u8, 9, 200, 255] {
            b[13] = code;
            assert_eq!(ChunkRepr::parse(&b).unwrap_err(), WireError::BadType(code));
        }
        b[13] = ChunkType::Fin.code();
        assert_eq!(
            ChunkRepr::parse(&b).unwrap_err(),
            WireError::BadPayloadLength {
                ty: ChunkType::Fin,
                len: 3
            }
        );
        let mut empty_data = [0u8; 16];
        empty_data[..16].copy_from_slice(&SAMPLE_BYTES[..16]);
        empty_data[14] = 0;
        empty_data[15] = 0;
        assert_eq!(
            ChunkRepr::parse(&empty_data).unwrap_err(),
            WireError::BadPayloadLength {
                ty: ChunkType::Data,
                len: 0
            }
        );
    }

    #[test]
    fn seq_wraps_and_compares_circularly() {
        let a = Seq(u32::MAX - 1);
        let b = a.plus(3);
        assert_eq!(b, Seq(1));
        assert_eq!(b.since(a), 3);
        assert_eq!(a.since(b), -3);
        assert!(b.is_after(a));
        assert!(!a.is_after(b));
        assert!(!a.is_after(a));
    }
}
