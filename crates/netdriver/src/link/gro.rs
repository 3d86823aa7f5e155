//! Receive coalescing in software (GRO): [`SoftGro`] wraps a link and hands the stack
//! runs of in-order TCP segments of one flow as one large segment, as Linux's
//! `tcp_gro_receive` does in a NIC driver's poll.
//!
//! Its use is the simulated bed: a sender's super-segments cut on the simulated wire
//! ([`SimOffload::Segment`](super::sim::SimOffload::Segment)), faults applied per wire
//! segment ([`FaultInjector`](super::fault::FaultInjector)), then coalesced again here, so
//! that seeded simulations exercise a receiver fed large segments with losses, reordering
//! and duplicates *inside* them, as a kernel's GRO would feed it. (The AF_PACKET link
//! receives what the kernel's GRO made and needs none of this.)
//!
//! The rules follow Linux's: consecutive frames of one batch merge when they carry the
//! same Ethernet header, the same IPv4 header apart from length, identification and
//! checksum (no options, no fragments), the same TCP header apart from sequence number,
//! checksum and PSH (ports, ACK, window and every option byte equal), and their sequence
//! numbers continue each other; every merged segment but the last has the first's payload
//! size, and a segment with PSH, or a shorter one, ends the run. Only segments with data
//! and no flags but ACK and PSH merge. A segment merges only if its checksum verifies
//! (or the inner link vouches for it), so a corrupted segment is handed on alone, for
//! the stack to drop; the merged frame is delivered with
//! [`RxMeta::checksum_verified`] set and its TCP checksum field stale, as Linux marks a
//! GRO'd packet `CHECKSUM_UNNECESSARY`.

use core::ops::Range;

use super::{FrameWriter, GatherWriter, Link, LinkStats, Offloads, RxMeta};
use crate::time::Instant;
use crate::wire::checksum;
use crate::wire::{ethernet, EtherType, IpProtocol, TcpFlags};

const IP_AT: usize = ethernet::HEADER_LEN;
const TCP_AT: usize = IP_AT + 20;

/// Counters of a [`SoftGro`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroStats {
    /// Frames handed on that were merged from more than one segment.
    pub merged_frames: u64,
    /// Segments those frames held.
    pub merged_segments: u64,
}

/// What the coalescer needs of a candidate segment.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    /// The frame without Ethernet padding.
    len: usize,
    /// Ethernet, IPv4 and TCP headers.
    headers: usize,
    seq: u32,
    psh: bool,
}

impl Candidate {
    fn payload_len(&self) -> usize {
        self.len - self.headers
    }
}

/// A link whose received TCP segments are coalesced (see the
/// [module documentation](self)).
#[derive(Debug)]
pub struct SoftGro<L: Link> {
    inner: L,
    enabled: bool,
    run: Run,
}

/// The merged frame being built, apart from the link so that the link's callback can
/// borrow it.
#[derive(Debug)]
struct Run {
    /// The frame (empty: none).
    pending: Vec<u8>,
    /// Its headers' length.
    headers: usize,
    /// The payload size of its segments.
    segment_size: usize,
    /// The sequence number that continues it.
    next_seq: u32,
    /// Segments in it.
    segments: u64,
    /// Closed to more segments (its last had PSH or was short).
    closed: bool,
    stats: GroStats,
}

impl<L: Link> SoftGro<L> {
    /// Wraps `inner`; with `enabled` false every frame passes untouched.
    pub fn new(inner: L, enabled: bool) -> SoftGro<L> {
        SoftGro {
            inner,
            enabled,
            run: Run {
                pending: Vec::new(),
                headers: 0,
                segment_size: 0,
                next_seq: 0,
                segments: 0,
                closed: true,
                stats: GroStats::default(),
            },
        }
    }

    /// The coalescing counters.
    pub fn gro_stats(&self) -> GroStats {
        self.run.stats
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped link, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }
}

/// Parses `frame` as a segment that may be merged (see the module documentation).
fn candidate(frame: &[u8], meta: RxMeta) -> Option<Candidate> {
    if frame.len() < TCP_AT + 20
        || u16::from_be_bytes([frame[12], frame[13]]) != u16::from(EtherType::Ipv4)
    {
        return None;
    }
    let ip = &frame[IP_AT..];
    // No options, TCP, no fragment (DF allowed).
    if ip[0] != 0x45 || ip[9] != u8::from(IpProtocol::Tcp) || ip[6] & 0xbf != 0 || ip[7] != 0 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let len = IP_AT + total;
    if total < 40 || len > frame.len() {
        return None;
    }
    let tcp = &frame[TCP_AT..len];
    let headers = TCP_AT + usize::from(tcp[12] >> 4) * 4;
    if headers < TCP_AT + 20 || headers >= len {
        return None;
    }
    let flags = tcp[13];
    if flags & !(TcpFlags::ACK.0 | TcpFlags::PSH.0) != 0 || flags & TcpFlags::ACK.0 == 0 {
        return None;
    }
    if !meta.checksum_verified {
        let src = std::net::Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
        let dst = std::net::Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
        let pseudo = checksum::pseudo_header_v4(src, dst, IpProtocol::Tcp.into(), tcp.len() as u32);
        if checksum::add(pseudo, checksum::data(tcp)) != 0xffff
            || checksum::data(&frame[IP_AT..TCP_AT]) != 0xffff
        {
            return None;
        }
    }
    Some(Candidate {
        len,
        headers,
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        psh: flags & TcpFlags::PSH.0 != 0,
    })
}

impl Run {
    /// Whether `c` (in `frame`) continues the pending merged frame.
    fn continues(&self, frame: &[u8], c: &Candidate) -> bool {
        let p = &self.pending;
        if p.is_empty() || self.closed || c.headers != self.headers || c.seq != self.next_seq {
            return false;
        }
        if c.payload_len() > self.segment_size || p.len() - IP_AT + c.payload_len() > 65535 {
            return false;
        }
        // Ethernet header; IPv4 apart from total length (2..4), identification (4..6) and
        // checksum (10..12); TCP apart from sequence number (4..8), flags (13) and checksum
        // (16..18).
        let same = |r: Range<usize>| p[r.clone()] == frame[r];
        same(0..IP_AT + 2)
            && same(IP_AT + 6..IP_AT + 10)
            && same(IP_AT + 12..TCP_AT + 4)
            && same(TCP_AT + 8..TCP_AT + 13)
            && same(TCP_AT + 14..TCP_AT + 16)
            && same(TCP_AT + 18..self.headers)
    }

    /// Hands the pending frame on, if any.
    fn flush_pending(&mut self, f: &mut dyn FnMut(&[u8], RxMeta), delivered: &mut usize) {
        if self.pending.is_empty() {
            return;
        }
        let meta = if self.segments > 1 {
            // Length and header checksum for the merged datagram.
            let total = (self.pending.len() - IP_AT) as u16;
            self.pending[IP_AT + 2..IP_AT + 4].copy_from_slice(&total.to_be_bytes());
            self.pending[IP_AT + 10..IP_AT + 12].fill(0);
            let sum = checksum::checksum(&self.pending[IP_AT..TCP_AT]);
            self.pending[IP_AT + 10..IP_AT + 12].copy_from_slice(&sum.to_be_bytes());
            self.stats.merged_frames += 1;
            self.stats.merged_segments += self.segments;
            RxMeta {
                checksum_verified: true,
                segment_size: self.segment_size.min(usize::from(u16::MAX)) as u16,
            }
        } else {
            // A lone segment whose checksum was verified on the way in: vouched for too.
            RxMeta {
                checksum_verified: true,
                segment_size: 0,
            }
        };
        f(&self.pending, meta);
        *delivered += 1;
        self.pending.clear();
        self.closed = true;
    }
}

impl<L: Link> Link for SoftGro<L> {
    fn mtu(&self) -> usize {
        self.inner.mtu()
    }

    fn max_frame_len(&self) -> usize {
        self.inner.max_frame_len()
    }

    fn recv_batch(&mut self, now: Instant, max: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        self.recv_batch_meta(now, max, &mut |frame, _| f(frame))
    }

    fn recv_batch_meta(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        if !self.enabled {
            return self.inner.recv_batch_meta(now, max, f);
        }
        let mut delivered = 0;
        let SoftGro { inner, run, .. } = self;
        inner.recv_batch_meta(now, max, &mut |frame, meta| {
            let Some(c) = candidate(frame, meta) else {
                run.flush_pending(f, &mut delivered);
                f(frame, meta);
                delivered += 1;
                return;
            };
            if run.continues(frame, &c) {
                run.pending.extend_from_slice(&frame[c.headers..c.len]);
                if c.psh {
                    run.pending[TCP_AT + 13] |= TcpFlags::PSH.0;
                }
                run.segments += 1;
                run.next_seq = c.seq.wrapping_add(c.payload_len() as u32);
                run.closed = c.psh || c.payload_len() < run.segment_size;
                return;
            }
            run.flush_pending(f, &mut delivered);
            run.pending.extend_from_slice(&frame[..c.len]);
            run.headers = c.headers;
            run.segment_size = c.payload_len();
            run.next_seq = c.seq.wrapping_add(c.payload_len() as u32);
            run.segments = 1;
            run.closed = c.psh;
        });
        run.flush_pending(f, &mut delivered);
        delivered
    }

    fn tx_batch(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&mut [u8]) -> Option<Range<usize>>,
    ) -> usize {
        self.inner.tx_batch(now, max, f)
    }

    fn tx_batch_meta(&mut self, now: Instant, max: usize, f: &mut FrameWriter<'_>) -> usize {
        self.inner.tx_batch_meta(now, max, f)
    }

    fn tx_batch_gather(&mut self, now: Instant, max: usize, f: &mut GatherWriter<'_>) -> usize {
        self.inner.tx_batch_gather(now, max, f)
    }

    fn flush(&mut self, now: Instant) {
        self.inner.flush(now)
    }

    fn poll_at(&self) -> Option<Instant> {
        self.inner.poll_at()
    }

    fn stats(&self) -> LinkStats {
        self.inner.stats()
    }

    fn offloads(&self) -> Offloads {
        self.inner.offloads()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::sim::{self, SimConfig};
    use crate::tcp::SeqNumber;
    use crate::wire::frame::{emit_tcp_frame, parse_tcp_frame, tcp_payload_offset};
    use crate::wire::{EthernetAddress, EthernetRepr, Ipv4Repr, TcpOptions, TcpRepr};
    use std::net::Ipv4Addr;

    /// A data segment at byte `at` of a flow, `len` bytes, with `flags` and ACK `ack`.
    fn segment(at: usize, len: usize, flags: TcpFlags, ack: u32) -> Vec<u8> {
        let tcp = TcpRepr {
            src_port: 5000,
            dst_port: 6000,
            seq: SeqNumber(1000) + at,
            ack: Some(SeqNumber(ack)),
            flags,
            window: 100,
            urgent: 0,
            options: TcpOptions {
                timestamp: Some((1, 2)),
                ..TcpOptions::default()
            },
        };
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
        let off = tcp_payload_offset(&tcp);
        let mut buf = vec![0u8; off + len];
        for (i, b) in buf[off..].iter_mut().enumerate() {
            *b = ((at + i) % 251) as u8;
        }
        let n = emit_tcp_frame(&mut buf, &eth, &ip, at as u16, &tcp, len).unwrap();
        buf.truncate(n);
        buf
    }

    /// Sends `frames` over a simulated pair and returns what a `SoftGro` receiver hands on:
    /// (sequence offset, payload length, verified, segment size).
    fn through(frames: &[Vec<u8>]) -> Vec<(u32, usize, bool, u16)> {
        let (mut a, b) = sim::pair(SimConfig::default());
        for f in frames {
            assert!(a.send_frame(Instant::ZERO, f));
        }
        a.flush(Instant::ZERO);
        let mut gro = SoftGro::new(b, true);
        let mut out = Vec::new();
        gro.recv_batch_meta(Instant::from_millis(1), 64, &mut |frame, meta| {
            // Merged frames carry a stale TCP checksum: parse without verifying it.
            let f = parse_tcp_frame(frame, false).expect("a TCP frame");
            assert!(
                crate::wire::Ipv4Packet::new_checked(&frame[14..])
                    .unwrap()
                    .verify_checksum(),
                "the IPv4 header checksum is redone"
            );
            let at = f.tcp.seq.0 - 1000;
            for (i, b) in f.payload.iter().enumerate() {
                assert_eq!(*b, ((at as usize + i) % 251) as u8, "payload byte");
            }
            out.push((
                at,
                f.payload.len(),
                meta.checksum_verified,
                meta.segment_size,
            ));
        });
        out
    }

    #[test]
    fn in_order_segments_of_one_flow_merge_until_psh() {
        let frames = [
            segment(0, 100, TcpFlags::default(), 7),
            segment(100, 100, TcpFlags::default(), 7),
            segment(200, 100, TcpFlags::PSH, 7),
            segment(300, 100, TcpFlags::default(), 7),
            segment(400, 40, TcpFlags::default(), 7),
        ];
        assert_eq!(
            through(&frames),
            vec![(0, 300, true, 100), (300, 140, true, 100)]
        );
    }

    #[test]
    fn gaps_other_acks_flags_and_longer_segments_end_a_run() {
        let frames = [
            segment(0, 100, TcpFlags::default(), 7),
            segment(200, 100, TcpFlags::default(), 7), // a gap
            segment(300, 100, TcpFlags::default(), 8), // another ACK
            segment(400, 100, TcpFlags::FIN, 8),       // FIN never merges
            segment(500, 100, TcpFlags::default(), 8),
            segment(600, 200, TcpFlags::default(), 8), // longer than the run's segments
        ];
        let got = through(&frames);
        let lens: Vec<(u32, usize)> = got.iter().map(|g| (g.0, g.1)).collect();
        assert_eq!(
            lens,
            vec![
                (0, 100),
                (200, 100),
                (300, 100),
                (400, 100),
                (500, 100),
                (600, 200)
            ]
        );
    }

    #[test]
    fn a_corrupt_segment_is_handed_on_alone_and_not_vouched_for() {
        let mut bad = segment(100, 100, TcpFlags::default(), 7);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let frames = [
            segment(0, 100, TcpFlags::default(), 7),
            bad,
            segment(200, 100, TcpFlags::default(), 7),
        ];
        let (mut a, b) = sim::pair(SimConfig::default());
        for f in &frames {
            a.send_frame(Instant::ZERO, f);
        }
        a.flush(Instant::ZERO);
        let mut gro = SoftGro::new(b, true);
        let mut out = Vec::new();
        gro.recv_batch_meta(Instant::from_millis(1), 64, &mut |frame, meta| {
            out.push((
                frame.len(),
                meta.checksum_verified,
                parse_tcp_frame(frame, true).is_ok(),
            ));
        });
        let n = frames[0].len();
        assert_eq!(
            out,
            vec![(n, true, true), (n, false, false), (n, true, true)]
        );
        assert_eq!(gro.gro_stats(), GroStats::default());
    }

    #[test]
    fn disabled_it_passes_every_frame_untouched() {
        let frames = [
            segment(0, 100, TcpFlags::default(), 7),
            segment(100, 100, TcpFlags::default(), 7),
        ];
        let (mut a, b) = sim::pair(SimConfig::default());
        for f in &frames {
            a.send_frame(Instant::ZERO, f);
        }
        a.flush(Instant::ZERO);
        let mut gro = SoftGro::new(b, false);
        let mut out = Vec::new();
        gro.recv_batch(Instant::from_millis(1), 64, &mut |frame| {
            out.push(frame.to_vec())
        });
        assert_eq!(out, frames.to_vec());
    }
}
