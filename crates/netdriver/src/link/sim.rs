//! A simulated link: two ends joined in memory, in virtual time.
//!
//! [`pair`] returns two [`SimLink`] ends. A frame flushed at `now` on one end becomes
//! receivable on the other at
//!
//! ```text
//! start   = max(now, time the transmitter finishes the frames before it)
//! deliver = start + (len + per_frame_overhead) * 8 / bandwidth + latency
//! ```
//!
//! so each direction is a FIFO whose serialisation queue models bandwidth queueing (a
//! bottleneck's buffer), and nothing ever reads a clock: time advances only through the
//! `now` arguments, and [`Link::poll_at`] says when the next frame lands.
//!
//! Memory is bounded: at most [`SimConfig::queue_frames`] frames may wait for
//! serialisation and at most [`SimConfig::max_in_flight`] may be held in a direction in
//! total; beyond that frames are dropped at the tail and counted
//! ([`LinkStats::dropped_no_buffer`]). Frame buffers are recycled: a receiver hands drained
//! buffers back to the sender in one batch (as an AF_XDP completion ring does), so a steady
//! transfer allocates nothing per frame.
//!
//! Frames written by [`Link::tx_batch`] wait in the sending end (its "tx ring", at most
//! [`SimConfig::tx_ring`] of them) until [`Link::flush`], exactly as AF_XDP frames wait for
//! the `sendto` kick, so a driver that forgets to flush fails on the simulated link too.
//!
//! [`SimConfig::offload`] gives the link segmentation and checksum offloads
//! ([`SimOffload`]): a NIC's TSO, which cuts super-segments into MTU-sized wire segments
//! (so that faults and bandwidth act per wire segment), or a host-local link such as veth
//! between two ends that both segment in software, which carries super-segments whole.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use super::offload::{complete_checksum, Segmenter};
use super::{
    tx_range_ok, FrameWriter, Link, LinkStats, Offloads, RxMeta, TxMeta, MAX_SUPER_FRAME_LEN,
    TX_HEADROOM,
};
use crate::time::{Duration, Instant};

/// Configuration of a simulated link; both directions behave the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// One-way propagation delay.
    pub latency: Duration,
    /// Bandwidth in bits per second; `None` or `Some(0)` means infinite (no serialisation
    /// delay, no queueing).
    pub bandwidth_bps: Option<u64>,
    /// IP MTU (largest Ethernet payload); longer frames are dropped and counted.
    pub mtu: usize,
    /// Bytes added to every frame's length for serialisation only: 0 models the frame
    /// alone; 24 models real Ethernet (preamble 8, FCS 4, inter-frame gap 12).
    pub per_frame_overhead: usize,
    /// Frames that may wait for serialisation in a direction (the bottleneck buffer);
    /// a frame arriving at a full queue is dropped (drop-tail).
    pub queue_frames: usize,
    /// Hard cap on frames held in a direction, waiting or propagating: bounds memory when
    /// latency × bandwidth is large or bandwidth is infinite.
    pub max_in_flight: usize,
    /// Frames an end may hold between [`Link::tx_batch`] and [`Link::flush`].
    pub tx_ring: usize,
    /// Segmentation and checksum offloads ([`Link::offloads`]); none by default.
    pub offload: SimOffload,
    /// Say [`Offloads::tx_gather`], so that a stack over this link hands shared payloads
    /// over as a gathered tail ([`Link::tx_batch_gather`]; the link copies it, as the
    /// trait's default does); off by default.
    pub gather: bool,
}

/// The offloads of a simulated link (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimOffload {
    /// None: every frame is at most [`Link::max_frame_len`] with complete checksums.
    #[default]
    None,
    /// A NIC's TSO and checksum offload: super-segments (up to [`MAX_SUPER_FRAME_LEN`])
    /// and partial checksums are accepted, and each super-segment is cut into wire
    /// segments with complete checksums ([`Segmenter`]) before it is queued, so that
    /// bandwidth, the queue limits and the receiver's faults see wire segments.
    Segment,
    /// A host-local link between two ends that both offload (veth between two kernels):
    /// super-segments cross whole with their checksums partial, and the receiver is told
    /// the checksum is vouched for ([`RxMeta::checksum_verified`]), as a Linux receiver
    /// trusts `CHECKSUM_PARTIAL` from a local sender.
    Whole,
}

impl Default for SimConfig {
    /// 10 µs latency, infinite bandwidth, MTU 1500 (the test bed's), a 1000-frame queue
    /// (Linux's default `txqueuelen`), 16384 frames in flight, a 2048-frame tx ring.
    fn default() -> Self {
        SimConfig {
            latency: Duration::from_micros(10),
            bandwidth_bps: None,
            mtu: 1500,
            per_frame_overhead: 0,
            queue_frames: 1000,
            max_in_flight: 16384,
            tx_ring: 2048,
            offload: SimOffload::None,
            gather: false,
        }
    }
}

/// A frame on the simulated wire.
#[derive(Debug)]
struct InFlight {
    /// Always `TX_HEADROOM + max_frame_len` bytes long so it can be lent out again as a tx
    /// buffer.
    buf: Vec<u8>,
    /// Where the frame lies in `buf`.
    frame: Range<usize>,
    /// When the transmitter starts serialising it, in nanoseconds of virtual time.
    start_ns: u64,
    deliver_at: Instant,
    /// Its checksum was left partial by a sender on a [`SimOffload::Whole`] link.
    partial: bool,
}

/// One direction of the wire.
#[derive(Debug, Default)]
struct Direction {
    /// Frames in order of `start_ns` (and so of `deliver_at`): a FIFO.
    wire: VecDeque<InFlight>,
    /// When the transmitter finishes the last frame it accepted, in nanoseconds; kept in
    /// nanoseconds so per-frame rounding never accumulates.
    busy_until_ns: u64,
    /// Buffers the receiver has finished with, waiting to go back to the sender.
    returned: Vec<Vec<u8>>,
}

#[derive(Debug)]
struct Shared {
    /// `dirs[i]` carries frames sent by end `i`.
    dirs: [Direction; 2],
}

/// One end of a simulated link. See the [module documentation](self).
#[derive(Debug)]
pub struct SimLink {
    shared: Arc<Mutex<Shared>>,
    /// 0 or 1: this end sends on `dirs[side]` and receives from `dirs[1 - side]`.
    side: usize,
    config: SimConfig,
    stats: LinkStats,
    /// Frames written by `tx_batch`, not yet flushed onto the wire, and whether each one's
    /// checksum is partial.
    staged: Vec<(Vec<u8>, Range<usize>, bool)>,
    /// The buffer super-segments are written into before [`SimOffload::Segment`] cuts
    /// them (empty without it).
    super_buf: Vec<u8>,
    /// Empty tx buffers owned by this end.
    free: Vec<Vec<u8>>,
    /// Frames taken off the wire for the current `recv_batch`; kept to reuse its capacity.
    rx_stage: Vec<InFlight>,
    /// Frame buffers this end has ever allocated (the tests check that reuse works).
    buffers_allocated: u64,
}

/// Creates the two ends of a simulated link.
pub fn pair(config: SimConfig) -> (SimLink, SimLink) {
    let shared = Arc::new(Mutex::new(Shared {
        dirs: [Direction::default(), Direction::default()],
    }));
    let end = |side| SimLink {
        shared: Arc::clone(&shared),
        side,
        config: config.clone(),
        stats: LinkStats::default(),
        staged: Vec::new(),
        super_buf: Vec::new(),
        free: Vec::new(),
        rx_stage: Vec::new(),
        buffers_allocated: 0,
    };
    (end(0), end(1))
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic elsewhere while holding the lock leaves plain data behind, still consistent
    // enough for a simulation; never propagate the poison as a second panic.
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

impl SimLink {
    /// This end's configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Frame buffers this end has allocated so far; a steady transfer stops allocating once
    /// enough buffers circulate.
    pub fn buffers_allocated(&self) -> u64 {
        self.buffers_allocated
    }

    /// Frames currently on the wire towards this end (waiting or propagating).
    pub fn incoming_len(&self) -> usize {
        lock(&self.shared).dirs[1 - self.side].wire.len()
    }
}

/// Serialisation time of a frame of `len` bytes, in nanoseconds, rounded up (0 at infinite
/// bandwidth).
fn serialisation_ns(config: &SimConfig, len: usize) -> u64 {
    match config.bandwidth_bps {
        None | Some(0) => 0,
        Some(bps) => {
            let bits = (len as u128 + config.per_frame_overhead as u128) * 8;
            let ns = (bits * 1_000_000_000).div_ceil(u128::from(bps));
            u64::try_from(ns).unwrap_or(u64::MAX)
        }
    }
}

impl SimLink {
    /// A free wire buffer: a recycled one, or (only when none is left, after reclaiming in
    /// one batch the buffers the peer has finished with) a new one.
    fn take_buffer(&mut self) -> Vec<u8> {
        if let Some(buf) = self.free.pop() {
            return buf;
        }
        // A reclaim only at the start of a batch would allocate one buffer per batch for
        // the probe that ends it.
        let mut shared = lock(&self.shared);
        self.free.append(&mut shared.dirs[self.side].returned);
        drop(shared);
        self.free.pop().unwrap_or_else(|| {
            self.buffers_allocated += 1;
            Vec::new()
        })
    }

    /// [`SimOffload::Segment`]: cuts the frame written into `super_buf` at `range` into
    /// wire segments (or completes its checksum) and stages them. Returns false when the
    /// frame is not one the link can segment (it is then dropped and counted).
    fn stage_segmented(&mut self, range: Range<usize>, meta: TxMeta) -> bool {
        let wire_len = TX_HEADROOM + self.max_frame_len();
        let mut frame = std::mem::take(&mut self.super_buf);
        let ok = match frame.get_mut(range.clone()) {
            None => false,
            Some(f) if meta.segment_size == 0 => {
                if let Some(partial) = meta.partial_checksum {
                    complete_checksum(f, partial);
                }
                if f.len() <= self.max_frame_len() {
                    let mut buf = self.take_buffer();
                    buf.resize(wire_len, 0);
                    buf[..f.len()].copy_from_slice(f);
                    self.staged.push((buf, 0..f.len(), false));
                    true
                } else {
                    false
                }
            }
            Some(f) => match Segmenter::new(f, usize::from(meta.segment_size)) {
                Ok(seg) if (0..seg.count()).all(|i| seg.len_of(i) <= self.max_frame_len()) => {
                    for i in 0..seg.count() {
                        let mut buf = self.take_buffer();
                        buf.resize(wire_len, 0);
                        let n = seg.write(i, &mut buf).unwrap_or(0);
                        self.staged.push((buf, 0..n, false));
                    }
                    true
                }
                _ => false,
            },
        };
        self.super_buf = std::mem::take(&mut frame);
        ok
    }
}

impl Link for SimLink {
    fn mtu(&self) -> usize {
        self.config.mtu
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
        let incoming = 1 - self.side;
        {
            let mut shared = lock(&self.shared);
            let wire = &mut shared.dirs[incoming].wire;
            while self.rx_stage.len() < max && wire.front().is_some_and(|fr| fr.deliver_at <= now) {
                if let Some(frame) = wire.pop_front() {
                    self.rx_stage.push(frame);
                }
            }
        }
        // The callback runs without the lock, so it may touch the other end freely.
        let n = self.rx_stage.len();
        for frame in &self.rx_stage {
            let data = frame.buf.get(frame.frame.clone()).unwrap_or(&[]);
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += data.len() as u64;
            let meta = RxMeta {
                checksum_verified: frame.partial,
                segment_size: 0,
            };
            f(data, meta);
        }
        if n > 0 {
            let mut shared = lock(&self.shared);
            let returned = &mut shared.dirs[incoming].returned;
            returned.extend(self.rx_stage.drain(..).map(|fr| fr.buf));
        }
        n
    }

    fn tx_batch(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&mut [u8]) -> Option<Range<usize>>,
    ) -> usize {
        self.tx_batch_meta(now, max, &mut |buf| Some((f(buf)?, TxMeta::default())))
    }

    fn tx_batch_meta(&mut self, _now: Instant, max: usize, f: &mut FrameWriter<'_>) -> usize {
        let frame_len = self.max_frame_len();
        let offload = self.config.offload;
        let (buf_len, super_len) = match offload {
            SimOffload::None => (TX_HEADROOM + frame_len, frame_len),
            SimOffload::Segment | SimOffload::Whole => {
                (TX_HEADROOM + MAX_SUPER_FRAME_LEN, MAX_SUPER_FRAME_LEN)
            }
        };
        // A super-segment cut on this link takes up to this many ring slots.
        let slots = match offload {
            SimOffload::Segment => MAX_SUPER_FRAME_LEN.div_ceil(self.config.mtu.max(1)),
            _ => 1,
        };
        let mut produced = 0;
        while produced < max && self.staged.len() + slots <= self.config.tx_ring.max(slots) {
            if offload == SimOffload::Segment {
                let mut buf = std::mem::take(&mut self.super_buf);
                buf.resize(buf_len, 0);
                let answer = f(&mut buf);
                self.super_buf = buf;
                let Some((range, meta)) = answer else { break };
                produced += 1;
                let limit = if meta.segment_size > 0 {
                    super_len
                } else {
                    frame_len
                };
                if !tx_range_ok(&range, buf_len, limit) || !self.stage_segmented(range, meta) {
                    self.stats.dropped_oversize += 1;
                }
                continue;
            }
            let mut buf = self.take_buffer();
            // Buffers are all the same size unless the MTU changed; resizing is a no-op then.
            buf.resize(buf_len, 0);
            match f(&mut buf) {
                None => {
                    self.free.push(buf);
                    break;
                }
                Some((range, meta)) => {
                    produced += 1;
                    let limit = if meta.segment_size > 0 {
                        super_len
                    } else {
                        frame_len
                    };
                    if !tx_range_ok(&range, buf_len, limit) {
                        self.stats.dropped_oversize += 1;
                        self.free.push(buf);
                        continue;
                    }
                    let partial = match (meta.partial_checksum, offload) {
                        (Some(_), SimOffload::Whole) => true,
                        (Some(p), _) => {
                            // No offload: completed in software, as the trait's default does.
                            if let Some(frame) = buf.get_mut(range.clone()) {
                                complete_checksum(frame, p);
                            }
                            false
                        }
                        (None, _) => false,
                    };
                    self.staged.push((buf, range, partial));
                }
            }
        }
        produced
    }

    fn flush(&mut self, now: Instant) {
        if self.staged.is_empty() {
            return;
        }
        let now_ns = now.total_micros().saturating_mul(1000);
        let shared = Arc::clone(&self.shared);
        let mut shared = lock(&shared);
        let dir = &mut shared.dirs[self.side];
        for (buf, frame, partial) in self.staged.drain(..) {
            let len = frame.len();
            // Frames that have not started serialising sit in the bottleneck queue; the
            // wire is FIFO in start time, so they are a suffix of it.
            let start_ns = now_ns.max(dir.busy_until_ns);
            let queued = start_ns > now_ns;
            // Counted only when this frame would wait itself (a binary search over the
            // wire; never needed at infinite bandwidth).
            let waiting = || {
                let started = dir.wire.partition_point(|fr| fr.start_ns <= now_ns);
                dir.wire.len() - started
            };
            if dir.wire.len() >= self.config.max_in_flight
                || (queued && waiting() >= self.config.queue_frames)
            {
                self.stats.dropped_no_buffer += 1;
                self.free.push(buf);
                continue;
            }
            let ser_ns = serialisation_ns(&self.config, len);
            let finish_ns = start_ns.saturating_add(ser_ns);
            dir.busy_until_ns = finish_ns;
            let deliver_at = Instant::from_micros(finish_ns.div_ceil(1000)) + self.config.latency;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
            dir.wire.push_back(InFlight {
                buf,
                frame,
                start_ns,
                deliver_at,
                partial,
            });
        }
    }

    fn poll_at(&self) -> Option<Instant> {
        lock(&self.shared).dirs[1 - self.side]
            .wire
            .front()
            .map(|fr| fr.deliver_at)
    }

    fn stats(&self) -> LinkStats {
        self.stats
    }

    fn offloads(&self) -> Offloads {
        match self.config.offload {
            SimOffload::None => Offloads {
                tx_gather: self.config.gather,
                ..Offloads::default()
            },
            SimOffload::Segment | SimOffload::Whole => Offloads {
                tx_segmentation: MAX_SUPER_FRAME_LEN,
                tx_checksum: true,
                tx_gather: self.config.gather,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::SharedSpan;

    fn frame(len: usize, tag: u8) -> Vec<u8> {
        vec![tag; len]
    }

    /// Every frame receivable at `now`, as owned copies.
    fn drain(link: &mut SimLink, now: Instant) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        link.recv_batch(now, usize::MAX, &mut |f| out.push(f.to_vec()));
        out
    }

    fn at(us: u64) -> Instant {
        Instant::from_micros(us)
    }

    #[test]
    fn delivery_time_is_latency_plus_serialisation_with_fifo_queueing() {
        // 8 Mbit/s: one byte per microsecond.
        let (mut a, mut b) = pair(SimConfig {
            latency: Duration::from_micros(100),
            bandwidth_bps: Some(8_000_000),
            ..SimConfig::default()
        });
        assert!(a.send_frame(at(0), &frame(1000, 1)));
        assert!(a.send_frame(at(0), &frame(500, 2)));
        a.flush(at(0));
        // First: 1000 µs on the wire + 100 µs; second queues behind it: 1500 + 100.
        assert_eq!(b.poll_at(), Some(at(1100)));
        assert!(drain(&mut b, at(1099)).is_empty());
        assert_eq!(drain(&mut b, at(1100)), vec![frame(1000, 1)]);
        assert_eq!(b.poll_at(), Some(at(1600)));
        assert!(drain(&mut b, at(1599)).is_empty());
        assert_eq!(drain(&mut b, at(1600)), vec![frame(500, 2)]);
        assert_eq!(b.poll_at(), None);
        // After the transmitter went idle, a frame starts at once.
        assert!(a.send_frame(at(5000), &frame(250, 3)));
        a.flush(at(5000));
        assert_eq!(b.poll_at(), Some(at(5350)));
        // Time is taken at flush, like an AF_XDP kick.
        assert!(a.send_frame(at(6000), &frame(10, 4)));
        a.flush(at(7000));
        assert_eq!(drain(&mut b, at(7110)), vec![frame(250, 3), frame(10, 4)]);
        assert_eq!(b.stats().rx_frames, 4);
        assert_eq!(b.stats().rx_bytes, 1760);
        assert_eq!(a.stats().tx_bytes, 1760);
    }

    #[test]
    fn overhead_counts_in_serialisation_only() {
        let (mut a, mut b) = pair(SimConfig {
            latency: Duration::ZERO,
            bandwidth_bps: Some(8_000_000),
            per_frame_overhead: 24,
            ..SimConfig::default()
        });
        a.send_frame(at(0), &frame(76, 0));
        a.flush(at(0));
        assert_eq!(b.poll_at(), Some(at(100)));
        assert_eq!(drain(&mut b, at(100))[0].len(), 76);
    }

    #[test]
    fn sub_microsecond_serialisation_does_not_accumulate_rounding() {
        // 10 Gbit/s: a 1250-byte frame takes exactly 1 µs; a 125-byte one 0.1 µs.
        let (mut a, mut b) = pair(SimConfig {
            latency: Duration::ZERO,
            bandwidth_bps: Some(10_000_000_000),
            ..SimConfig::default()
        });
        for _ in 0..100 {
            a.send_frame(at(0), &frame(125, 0));
        }
        a.flush(at(0));
        assert_eq!(drain(&mut b, at(9)).len(), 90);
        assert_eq!(drain(&mut b, at(10)).len(), 10);
    }

    #[test]
    fn infinite_bandwidth_delivers_after_latency_only() {
        for bw in [None, Some(0)] {
            let (mut a, mut b) = pair(SimConfig {
                latency: Duration::from_micros(7),
                bandwidth_bps: bw,
                ..SimConfig::default()
            });
            for i in 0..10 {
                a.send_frame(at(3), &frame(1514, i));
            }
            a.flush(at(3));
            assert_eq!(b.poll_at(), Some(at(10)));
            assert_eq!(drain(&mut b, at(10)).len(), 10);
        }
    }

    #[test]
    fn directions_are_independent() {
        let (mut a, mut b) = pair(SimConfig::default());
        a.send_frame(at(0), &frame(60, 1));
        b.send_frame(at(0), &frame(61, 2));
        a.flush(at(0));
        b.flush(at(0));
        assert_eq!(drain(&mut a, at(10)), vec![frame(61, 2)]);
        assert_eq!(drain(&mut b, at(10)), vec![frame(60, 1)]);
    }

    #[test]
    fn oversized_frames_are_dropped_and_counted() {
        let (mut a, mut b) = pair(SimConfig::default());
        assert_eq!(a.max_frame_len(), 1514);
        assert!(!a.send_frame(at(0), &frame(1515, 1)));
        assert!(a.send_frame(at(0), &frame(1514, 2)));
        // A length past the lent buffer, as a buggy in-place writer could return.
        let n = a.tx_batch(at(0), 1, &mut |buf| Some(0..buf.len() + 1));
        assert_eq!(n, 1);
        // A frame of the right size starting in the headroom passes; one past it does not.
        let n = a.tx_batch(at(0), 2, &mut |buf| {
            let start = buf.len() - 1514;
            buf[start..].fill(3);
            Some(start..buf.len())
        });
        assert_eq!(n, 2);
        let n = a.tx_batch(at(0), 1, &mut |_| Some(0..1515));
        assert_eq!(n, 1);
        a.flush(at(0));
        assert_eq!(a.stats().dropped_oversize, 3);
        assert_eq!(a.stats().tx_frames, 3);
        assert_eq!(
            drain(&mut b, at(100)),
            vec![frame(1514, 2), frame(1514, 3), frame(1514, 3)]
        );

        let (mut a, _b) = pair(SimConfig {
            mtu: 9000,
            ..SimConfig::default()
        });
        assert!(a.send_frame(at(0), &frame(9014, 1)));
    }

    #[test]
    fn the_bottleneck_queue_is_drop_tail() {
        let (mut a, mut b) = pair(SimConfig {
            latency: Duration::ZERO,
            bandwidth_bps: Some(8_000_000),
            queue_frames: 10,
            ..SimConfig::default()
        });
        for i in 0..20 {
            a.send_frame(at(0), &frame(100, i));
        }
        a.flush(at(0));
        // One frame on the wire, ten waiting: the rest are dropped at the tail.
        assert_eq!(a.stats().tx_frames, 11);
        assert_eq!(a.stats().dropped_no_buffer, 9);
        // Once two frames have left the queue, two more fit.
        for i in 0..5 {
            a.send_frame(at(200), &frame(100, 100 + i));
        }
        a.flush(at(200));
        assert_eq!(a.stats().dropped_no_buffer, 12);
        let got = drain(&mut b, at(10_000));
        let tags: Vec<u8> = got.iter().map(|f| f[0]).collect();
        assert_eq!(tags, vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100, 101]);
    }

    #[test]
    fn frames_in_flight_are_capped() {
        let (mut a, mut b) = pair(SimConfig {
            latency: Duration::from_millis(1),
            max_in_flight: 5,
            ..SimConfig::default()
        });
        for i in 0..8 {
            a.send_frame(at(0), &frame(100, i));
        }
        a.flush(at(0));
        assert_eq!(a.stats().dropped_no_buffer, 3);
        assert_eq!(b.incoming_len(), 5);
        assert_eq!(drain(&mut b, at(1000)).len(), 5);
    }

    #[test]
    fn tx_ring_bounds_unflushed_frames_and_flush_is_needed() {
        let (mut a, mut b) = pair(SimConfig {
            tx_ring: 4,
            ..SimConfig::default()
        });
        let mut calls = 0;
        let n = a.tx_batch(at(0), 100, &mut |buf| {
            calls += 1;
            buf[..60].fill(7);
            Some(0..60)
        });
        assert_eq!((n, calls), (4, 4));
        assert_eq!(b.poll_at(), None, "nothing leaves before the kick");
        a.flush(at(0));
        assert_eq!(drain(&mut b, at(10)).len(), 4);
    }

    #[test]
    fn recv_batch_respects_max_and_callback_may_use_the_peer() {
        let (mut a, mut b) = pair(SimConfig::default());
        for i in 0..10 {
            a.send_frame(at(0), &frame(60, i));
        }
        a.flush(at(0));
        let mut seen = 0;
        // Echo each frame back from inside the callback: no lock is held there.
        let n = b.recv_batch(at(10), 3, &mut |f| {
            seen += 1;
            let _ = a.poll_at();
            let _ = f;
        });
        assert_eq!((n, seen), (3, 3));
        assert_eq!(drain(&mut b, at(10)).len(), 7);
    }

    #[test]
    fn steady_traffic_reuses_buffers() {
        let (mut a, mut b) = pair(SimConfig::default());
        for i in 0..10_000u64 {
            a.send_frame(at(i), &frame(1514, i as u8));
            a.flush(at(i));
            drain(&mut b, at(i));
        }
        // Latency 10 µs at one frame per µs: about ten frames in flight at a time.
        assert!(
            a.buffers_allocated < 32,
            "allocated {}",
            a.buffers_allocated
        );
        assert_eq!(b.buffers_allocated, 0);
    }

    #[test]
    fn batches_ended_by_a_probe_reuse_buffers() {
        // A stack's tx phase sends what it has and then answers `None` to one more buffer:
        // that probe must not allocate while the peer holds returned buffers (it once did,
        // one buffer per batch, for ever).
        let (mut a, mut b) = pair(SimConfig {
            latency: Duration::ZERO,
            ..SimConfig::default()
        });
        for i in 0..10_000u64 {
            let mut left = 1;
            a.tx_batch(at(i), 64, &mut |buf| {
                if left == 0 {
                    return None;
                }
                left -= 1;
                buf[..60].fill(i as u8);
                Some(0..60)
            });
            a.flush(at(i));
            assert_eq!(drain(&mut b, at(i)).len(), 1);
        }
        assert!(
            a.buffers_allocated() <= 2,
            "allocated {}",
            a.buffers_allocated()
        );
    }

    #[test]
    fn tx_batch_stops_when_the_caller_has_nothing() {
        let (mut a, _b) = pair(SimConfig::default());
        let mut left = 3;
        let n = a.tx_batch(at(0), 100, &mut |_| {
            if left == 0 {
                return None;
            }
            left -= 1;
            Some(0..60)
        });
        assert_eq!(n, 3);
    }

    #[test]
    fn is_usable_as_a_trait_object() {
        let (a, b) = pair(SimConfig::default());
        let mut a: Box<dyn Link + Send> = Box::new(a);
        let mut b: Box<dyn Link + Send> = Box::new(b);
        a.send_frame(at(0), &frame(60, 9));
        a.flush(at(0));
        let mut got = 0;
        b.recv_batch(at(10), 8, &mut |_| got += 1);
        assert_eq!(got, 1);
    }

    /// A TCP frame of `len` payload bytes with its checksum left partial, as the interface
    /// writes one for a link with checksum offload.
    fn partial_frame(len: usize) -> (Vec<u8>, TxMeta) {
        use crate::tcp::SeqNumber;
        use crate::wire::frame::{emit_tcp_frame_partial, tcp_payload_offset, TCP_HEADER_AT};
        use crate::wire::{EtherType, IpProtocol};
        use crate::wire::{EthernetAddress, EthernetRepr, Ipv4Repr, TcpRepr};
        let tcp = TcpRepr {
            src_port: 1,
            dst_port: 2,
            seq: SeqNumber(5),
            ack: Some(SeqNumber(9)),
            flags: crate::wire::TcpFlags::PSH,
            window: 10,
            urgent: 0,
            options: Default::default(),
        };
        let eth = EthernetRepr {
            src: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: EtherType::Ipv4,
        };
        let ip = Ipv4Repr {
            src: std::net::Ipv4Addr::new(10, 0, 0, 1),
            dst: std::net::Ipv4Addr::new(10, 0, 0, 2),
            protocol: IpProtocol::Tcp,
            payload_len: 0,
            ttl: 64,
            dscp_ecn: 0,
        };
        let at = tcp_payload_offset(&tcp);
        let mut buf = vec![0u8; at + len];
        for (i, b) in buf[at..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let n = emit_tcp_frame_partial(&mut buf, &eth, &ip, 3, &tcp, len).unwrap();
        buf.truncate(n);
        let meta = TxMeta {
            segment_size: 1460,
            partial_checksum: Some(crate::link::PartialChecksum {
                start: TCP_HEADER_AT as u16,
                offset: 16,
            }),
        };
        (buf, meta)
    }

    /// The trait's default gathering: the spans are copied into their holes, and a frame
    /// whose spans do not lie inside it in order is refused and counted, not sent.
    #[test]
    fn gathered_spans_fill_their_holes_and_stray_ones_are_counted() {
        let (mut a, mut b) = pair(SimConfig {
            gather: true,
            ..SimConfig::default()
        });
        assert!(a.offloads().tx_gather);
        let span = |at: usize, len: usize, tag: u8| SharedSpan {
            at,
            bytes: bytes::Bytes::from(vec![tag; len]),
        };
        let mut sent = 0;
        let produced = a.tx_batch_gather(at(0), 3, &mut |buf, spans| {
            sent += 1;
            buf[10..1110].fill(1);
            match sent {
                // Holes at 110..810 and 900..1000, written around.
                1 => spans.extend([span(110, 700, 2), span(900, 100, 3)]),
                // Past the frame's end: refused.
                2 => spans.push(span(1000, 200, 4)),
                // Out of order: refused.
                _ => spans.extend([span(500, 10, 5), span(100, 10, 6)]),
            }
            Some((10..1110, TxMeta::default()))
        });
        assert_eq!(produced, 3);
        a.flush(at(0));
        let got = drain(&mut b, at(1_000));
        assert_eq!(got.len(), 1);
        let mut want = vec![1u8; 1100];
        want[100..800].fill(2);
        want[890..990].fill(3);
        assert_eq!(got[0], want);
        assert_eq!(a.stats().dropped_oversize, 2);
    }

    fn send_meta(link: &mut SimLink, frame: &[u8], meta: TxMeta) -> usize {
        let mut done = false;
        link.tx_batch_meta(at(0), 1, &mut |buf| {
            if done {
                return None;
            }
            done = true;
            // A frame too long for the buffer is passed on unwritten for the link to count.
            if let Some(dst) = buf.get_mut(..frame.len()) {
                dst.copy_from_slice(frame);
            }
            Some((0..frame.len(), meta))
        })
    }

    #[test]
    fn a_segmenting_link_cuts_super_segments_into_wire_segments() {
        let (mut a, mut b) = pair(SimConfig {
            offload: SimOffload::Segment,
            ..SimConfig::default()
        });
        assert!(a.offloads().segments(a.max_frame_len()));
        let (frame, meta) = partial_frame(10_000);
        assert_eq!(send_meta(&mut a, &frame, meta), 1);
        a.flush(at(0));
        let mut got = Vec::new();
        b.recv_batch_meta(at(100), 64, &mut |f, m| {
            assert!(!m.checksum_verified);
            let p = crate::wire::parse_tcp_frame(f, true).expect("complete checksums");
            assert!(f.len() <= 1514);
            got.extend_from_slice(p.payload);
        });
        assert_eq!(got.len(), 10_000);
        assert!(got.iter().enumerate().all(|(i, b)| *b == i as u8));
        assert_eq!(b.stats().rx_frames, 7);
        assert_eq!(a.stats().tx_frames, 7);
    }

    #[test]
    fn a_whole_link_carries_super_segments_as_they_are_and_vouches_for_them() {
        let (mut a, mut b) = pair(SimConfig {
            offload: SimOffload::Whole,
            ..SimConfig::default()
        });
        let (frame, meta) = partial_frame(10_000);
        send_meta(&mut a, &frame, meta);
        a.flush(at(0));
        let mut got = Vec::new();
        b.recv_batch_meta(at(100), 64, &mut |f, m| {
            got.push((f.to_vec(), m.checksum_verified))
        });
        assert_eq!(got, vec![(frame, true)]);
    }

    #[test]
    fn without_offloads_a_partial_checksum_is_completed_and_a_super_segment_dropped() {
        let (mut a, mut b) = pair(SimConfig::default());
        assert_eq!(a.offloads(), Offloads::default());
        let (small, mut meta) = partial_frame(100);
        meta.segment_size = 0;
        send_meta(&mut a, &small, meta);
        let (big, meta) = partial_frame(10_000);
        send_meta(&mut a, &big, meta);
        a.flush(at(0));
        assert_eq!(a.stats().dropped_oversize, 1);
        let mut got = 0;
        b.recv_batch(at(100), 64, &mut |f| {
            assert!(crate::wire::parse_tcp_frame(f, true).is_ok());
            got += 1;
        });
        assert_eq!(got, 1);
    }
}
