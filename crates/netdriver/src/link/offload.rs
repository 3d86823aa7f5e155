//! Segmentation and checksum offloads done in software, for links that cannot do them
//! and for the simulated wire (see the [link documentation](super#offloads-segmentation-and-checksums)).
//!
//! - [`complete_checksum`] finishes a checksum left partial ([`PartialChecksum`]), as a
//!   NIC does for `CHECKSUM_PARTIAL`.
//! - [`Segmenter`] cuts a TCP/IPv4 super-segment into wire segments of a given payload size,
//!   as Linux's `tcp_gso_segment` does (RFC 9293 leaves segmentation to the sender; what
//!   goes on the wire is what a sender without offload would have sent): each segment gets
//!   the super-segment's headers with its own sequence number, IPv4 total length,
//!   identification (incremented per segment) and complete checksums; PSH and FIN stay on
//!   the last segment only and CWR on the first only.
//!
//! Nothing here panics on any input: a frame that is not a well-formed TCP/IPv4 frame is
//! refused as a whole ([`Segmenter::new`] returns an error).

use super::PartialChecksum;
use crate::wire::checksum;
use crate::wire::{ethernet, EtherType, IpProtocol, TcpFlags, WireError};

/// Completes a checksum left partial in `frame`: sums the bytes from `partial.start` to
/// the end (the field holds the pseudo-header sum) and writes the complement into the
/// field. Does nothing when the field lies outside the frame.
pub fn complete_checksum(frame: &mut [u8], partial: PartialChecksum) {
    let start = usize::from(partial.start);
    let at = start + usize::from(partial.offset);
    if at + 2 > frame.len() {
        return;
    }
    let sum = checksum::data(&frame[start..]);
    frame[at..at + 2].copy_from_slice(&checksum::finish(sum).to_be_bytes());
}

/// Byte offsets of the fields the segmenter rewrites, in a frame with a 14-byte Ethernet
/// header.
const IP_AT: usize = ethernet::HEADER_LEN;
const IP_TOTAL_LEN: usize = IP_AT + 2;
const IP_IDENT: usize = IP_AT + 4;
const IP_CHECKSUM: usize = IP_AT + 10;
const IP_SRC: usize = IP_AT + 12;
const TCP_SEQ: usize = 4;
const TCP_FLAGS: usize = 13;
const TCP_CHECKSUM: usize = 16;

/// A TCP/IPv4 super-segment being cut into wire segments (see the
/// [module documentation](self)).
#[derive(Debug, Clone, Copy)]
pub struct Segmenter<'a> {
    frame: &'a [u8],
    /// Ethernet + IPv4 + TCP header length: where the payload starts.
    headers: usize,
    /// Offset of the TCP header.
    tcp_at: usize,
    payload_len: usize,
    segment_size: usize,
}

impl<'a> Segmenter<'a> {
    /// Prepares to cut `frame` (an Ethernet II frame of a TCP/IPv4 segment, without IPv4
    /// options) into segments of at most `segment_size` payload bytes; 0, or a payload no
    /// longer than it, gives the frame back as one segment (with complete checksums).
    /// Ethernet padding after the IPv4 datagram is dropped.
    pub fn new(frame: &'a [u8], segment_size: usize) -> Result<Segmenter<'a>, WireError> {
        if frame.len() < IP_AT + 20 {
            return Err(WireError::Truncated);
        }
        if u16::from_be_bytes([frame[12], frame[13]]) != u16::from(EtherType::Ipv4) {
            return Err(WireError::Unsupported);
        }
        let ip = &frame[IP_AT..];
        if ip[0] != 0x45 {
            // IPv4 without options only: a super-segment is ours, and we send none.
            return Err(WireError::Unsupported);
        }
        if ip[9] != u8::from(IpProtocol::Tcp) {
            return Err(WireError::Unsupported);
        }
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        if total < 40 || IP_AT + total > frame.len() {
            return Err(WireError::Malformed);
        }
        let tcp_at = IP_AT + 20;
        let tcp_header = usize::from(frame[tcp_at + 12] >> 4) * 4;
        if tcp_header < 20 || 20 + tcp_header > total {
            return Err(WireError::Malformed);
        }
        let headers = tcp_at + tcp_header;
        let frame = &frame[..IP_AT + total];
        let payload_len = frame.len() - headers;
        let segment_size = if segment_size == 0 {
            payload_len.max(1)
        } else {
            segment_size
        };
        Ok(Segmenter {
            frame,
            headers,
            tcp_at,
            payload_len,
            segment_size,
        })
    }

    /// How many wire segments the frame is cut into (at least 1).
    pub fn count(&self) -> usize {
        self.payload_len.div_ceil(self.segment_size).max(1)
    }

    /// The length of wire segment `index`'s frame.
    pub fn len_of(&self, index: usize) -> usize {
        let from = (index * self.segment_size).min(self.payload_len);
        let to = (from + self.segment_size).min(self.payload_len);
        self.headers + (to - from)
    }

    /// Writes wire segment `index` (of [`count`](Self::count)) into `out` and returns its
    /// length, or `None` when `index` is past the last segment or `out` is too short.
    pub fn write(&self, index: usize, out: &mut [u8]) -> Option<usize> {
        self.write_with(index, out, true)
    }

    /// [`write`](Self::write), but the TCP checksum field is left partial: it holds the
    /// pseudo-header sum, for a device to complete ([`partial`](Self::partial) says where).
    pub fn write_partial(&self, index: usize, out: &mut [u8]) -> Option<usize> {
        self.write_with(index, out, false)
    }

    /// Where every segment's TCP checksum lies, for [`write_partial`](Self::write_partial).
    pub fn partial(&self) -> PartialChecksum {
        PartialChecksum {
            start: self.tcp_at as u16,
            offset: TCP_CHECKSUM as u16,
        }
    }

    fn write_with(&self, index: usize, out: &mut [u8], full: bool) -> Option<usize> {
        if index >= self.count() {
            return None;
        }
        let from = index * self.segment_size;
        let to = (from + self.segment_size).min(self.payload_len);
        let len = self.headers + (to - from);
        let out = out.get_mut(..len)?;
        out[..self.headers].copy_from_slice(&self.frame[..self.headers]);
        out[self.headers..].copy_from_slice(&self.frame[self.headers + from..self.headers + to]);
        let last = index + 1 == self.count();

        // IPv4: total length, identification, header checksum.
        let ip_total = (len - IP_AT) as u16;
        out[IP_TOTAL_LEN..IP_TOTAL_LEN + 2].copy_from_slice(&ip_total.to_be_bytes());
        let ident = u16::from_be_bytes([out[IP_IDENT], out[IP_IDENT + 1]]);
        let ident = ident.wrapping_add(index as u16);
        out[IP_IDENT..IP_IDENT + 2].copy_from_slice(&ident.to_be_bytes());
        out[IP_CHECKSUM..IP_CHECKSUM + 2].fill(0);
        let ip_sum = checksum::checksum(&out[IP_AT..IP_AT + 20]);
        out[IP_CHECKSUM..IP_CHECKSUM + 2].copy_from_slice(&ip_sum.to_be_bytes());

        // TCP: sequence number, flags, checksum.
        let tcp = &mut out[self.tcp_at..];
        let seq = u32::from_be_bytes([
            tcp[TCP_SEQ],
            tcp[TCP_SEQ + 1],
            tcp[TCP_SEQ + 2],
            tcp[TCP_SEQ + 3],
        ]);
        let seq = seq.wrapping_add(from as u32);
        tcp[TCP_SEQ..TCP_SEQ + 4].copy_from_slice(&seq.to_be_bytes());
        let mut flags = tcp[TCP_FLAGS];
        if !last {
            flags &= !(TcpFlags::PSH.0 | TcpFlags::FIN.0);
        }
        if index > 0 {
            flags &= !TcpFlags::CWR.0;
        }
        tcp[TCP_FLAGS] = flags;
        tcp[TCP_CHECKSUM..TCP_CHECKSUM + 2].fill(0);
        let src = std::net::Ipv4Addr::new(
            out[IP_SRC],
            out[IP_SRC + 1],
            out[IP_SRC + 2],
            out[IP_SRC + 3],
        );
        let dst = std::net::Ipv4Addr::new(
            out[IP_SRC + 4],
            out[IP_SRC + 5],
            out[IP_SRC + 6],
            out[IP_SRC + 7],
        );
        let tcp = &mut out[self.tcp_at..];
        let pseudo = checksum::pseudo_header_v4(src, dst, IpProtocol::Tcp.into(), tcp.len() as u32);
        let sum = if full {
            checksum::finish(checksum::add(pseudo, checksum::data(tcp)))
        } else {
            pseudo
        };
        tcp[TCP_CHECKSUM..TCP_CHECKSUM + 2].copy_from_slice(&sum.to_be_bytes());
        Some(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::SeqNumber;
    use crate::wire::frame::{emit_tcp_frame, parse_tcp_frame, tcp_payload_offset};
    use crate::wire::{EthernetAddress, EthernetRepr, Ipv4Repr, TcpOptions, TcpRepr};
    use std::net::Ipv4Addr;

    fn super_frame(payload_len: usize, flags: TcpFlags) -> (Vec<u8>, Vec<u8>) {
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
            seq: SeqNumber(u32::MAX - 1000),
            ack: Some(SeqNumber(77)),
            flags,
            window: 1000,
            urgent: 0,
            options: TcpOptions {
                timestamp: Some((7, 8)),
                ..TcpOptions::default()
            },
        };
        let payload: Vec<u8> = (0..payload_len as u32)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let at = tcp_payload_offset(&tcp);
        let mut buf = vec![0u8; at + payload_len];
        buf[at..].copy_from_slice(&payload);
        let n = emit_tcp_frame(&mut buf, &eth, &ip, 100, &tcp, payload_len).unwrap();
        buf.truncate(n);
        (buf, payload)
    }

    #[test]
    fn a_super_segment_is_cut_into_valid_segments_carrying_every_byte_once() {
        for (len, size) in [
            (65_000usize, 1448usize),
            (4344, 1448),
            (4345, 1448),
            (10, 1448),
            (0, 1448),
        ] {
            let (frame, payload) = super_frame(len, TcpFlags::PSH | TcpFlags::FIN | TcpFlags::CWR);
            let s = Segmenter::new(&frame, size).unwrap();
            assert_eq!(s.count(), len.div_ceil(size).max(1));
            let mut got = Vec::new();
            let mut out = vec![0u8; 2000];
            for i in 0..s.count() {
                let n = s.write(i, &mut out).unwrap();
                assert_eq!(n, s.len_of(i));
                let f = parse_tcp_frame(&out[..n], true).expect("valid checksums");
                assert!(f.payload.len() <= size);
                assert_eq!(f.tcp.seq, SeqNumber(u32::MAX - 1000) + got.len());
                let last = i + 1 == s.count();
                assert_eq!(f.tcp.flags.psh(), last, "segment {i}");
                assert_eq!(f.tcp.flags.fin(), last, "segment {i}");
                assert_eq!(f.tcp.flags.0 & TcpFlags::CWR.0 != 0, i == 0, "segment {i}");
                assert_eq!(f.tcp.options.timestamp, Some((7, 8)));
                got.extend_from_slice(f.payload);
            }
            assert_eq!(got, payload, "len {len}");
            assert!(s.write(s.count(), &mut out).is_none());
        }
    }

    #[test]
    fn partial_segments_complete_to_the_full_ones() {
        let (frame, _) = super_frame(5000, TcpFlags::PSH);
        let s = Segmenter::new(&frame, 1448).unwrap();
        let (mut full, mut partial) = (vec![0u8; 2000], vec![0u8; 2000]);
        for i in 0..s.count() {
            let n = s.write(i, &mut full).unwrap();
            assert_eq!(s.write_partial(i, &mut partial), Some(n));
            assert_ne!(
                full[..n],
                partial[..n],
                "segment {i}: the checksum is left partial"
            );
            assert!(parse_tcp_frame(&partial[..n], true).is_err());
            complete_checksum(&mut partial[..n], s.partial());
            assert_eq!(full[..n], partial[..n], "segment {i}");
        }
    }

    #[test]
    fn a_partial_checksum_is_completed() {
        let (mut frame, _) = super_frame(1001, TcpFlags::PSH);
        let tcp_at = 34;
        // What a partial checksum holds: the pseudo-header sum over the segment length.
        let seg_len = (frame.len() - tcp_at) as u32;
        let pseudo = checksum::pseudo_header_v4(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            6,
            seg_len,
        );
        frame[tcp_at + 16..tcp_at + 18].copy_from_slice(&pseudo.to_be_bytes());
        assert!(parse_tcp_frame(&frame, true).is_err());
        complete_checksum(
            &mut frame,
            PartialChecksum {
                start: 34,
                offset: 16,
            },
        );
        assert!(parse_tcp_frame(&frame, true).is_ok());
        // Out of range: nothing happens, nothing panics.
        complete_checksum(
            &mut frame[..40],
            PartialChecksum {
                start: 34,
                offset: 16,
            },
        );
    }

    #[test]
    fn malformed_frames_are_refused_never_panic() {
        let (frame, _) = super_frame(3000, TcpFlags::default());
        for len in 0..60 {
            let _ = Segmenter::new(&frame[..len], 1448);
        }
        let mut bad = frame.clone();
        bad[IP_AT + 2] = 0xff; // total length beyond the frame
        assert!(Segmenter::new(&bad, 1448).is_err());
        let mut bad = frame.clone();
        bad[IP_AT + 20 + 12] = 0xf0; // TCP header longer than the datagram allows
        bad[IP_AT + 2..IP_AT + 4].copy_from_slice(&60u16.to_be_bytes());
        assert!(Segmenter::new(&bad, 1448).is_err());
        let mut bad = frame;
        bad[IP_AT] = 0x46;
        assert_eq!(
            Segmenter::new(&bad, 1448).unwrap_err(),
            WireError::Unsupported
        );
    }
}
