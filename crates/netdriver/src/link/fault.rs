//! Fault injection over any [`Link`]: seeded loss, reordering, duplication and corruption.
//!
//! [`FaultInjector`] wraps a link (the simulated one today, the AF_XDP one later) and, on
//! transmit, on receive, or on both ([`FaultDirection`]), decides for every frame with a
//! seeded [`SmallRng`], in this order:
//!
//! 1. **loss** (probability [`FaultConfig::loss`]): the frame vanishes;
//! 2. **corruption** ([`FaultConfig::corrupt`]): one bit, chosen uniformly over the whole
//!    frame, is flipped. There is no Ethernet FCS in this model, so a flip in the IPv4 or
//!    TCP bytes must be caught by their checksums, one in the destination MAC or EtherType
//!    by the receiver's filtering; a flip in the source MAC goes unnoticed, as it would be
//!    harmless to a stack that does not learn addresses from data frames;
//! 3. **duplication** ([`FaultConfig::duplicate`]): a copy follows the frame;
//! 4. **reordering** ([`FaultConfig::reorder`]): the frame is held back and released after
//!    [`FaultConfig::reorder_depth`] later frames have passed, or after
//!    [`FaultConfig::reorder_delay`], whichever comes first.
//!
//! Every decision draws from one generator in a fixed order, so a run is reproducible from
//! its seed as long as the frames offered are the same. Held frames (reordered ones, and
//! duplicates waiting for a slot) are copies kept in at most [`FaultConfig::max_held`]
//! recycled buffers per direction; when that store is full a reorder or duplicate is simply
//! not applied (and counted), so memory stays bounded.
//!
//! Offloads ([`Link::offloads`]) are the wrapped link's: frame metadata travels with
//! held frames, a corrupted received frame loses the inner link's vouching for its
//! checksum ([`RxMeta::checksum_verified`]), and a transmitted frame whose checksum is
//! left to the link is completed in software before a bit of it is flipped (a
//! super-segment, which only the link can complete, is not corrupted), so that a
//! corruption stays detectable as it is on a wire.
//!
//! Faults copy frames only when they apply (a held or duplicated frame, a corrupted
//! received frame); frames that pass untouched are never copied, so the wrapper adds no
//! copy to the fault-free path.

use std::collections::VecDeque;
use std::ops::Range;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::offload::complete_checksum;
use super::{tx_range_ok, FrameWriter, GatherWriter, Link, LinkStats, Offloads, RxMeta, TxMeta};
use crate::time::{Duration, Instant};

/// Which way faults are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FaultDirection {
    /// To frames this side transmits.
    Tx,
    /// To frames this side receives.
    #[default]
    Rx,
    /// To both, with independent draws.
    Both,
}

impl FaultDirection {
    fn tx(self) -> bool {
        matches!(self, FaultDirection::Tx | FaultDirection::Both)
    }
    fn rx(self) -> bool {
        matches!(self, FaultDirection::Rx | FaultDirection::Both)
    }
}

/// What a [`FaultInjector`] does. Rates are probabilities per frame; values outside
/// `[0, 1]` act as the nearest bound and NaN as 0.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    /// Probability that a frame is lost.
    pub loss: f64,
    /// Probability that a frame is held back and delivered late.
    pub reorder: f64,
    /// Probability that a frame is delivered twice.
    pub duplicate: f64,
    /// Probability that one random bit of a frame is flipped.
    pub corrupt: f64,
    /// Seed of the generator that makes every decision.
    pub seed: u64,
    /// Where faults apply.
    pub direction: FaultDirection,
    /// A held-back frame is released after this many later frames have passed.
    pub reorder_depth: u32,
    /// ... or after this long, whichever comes first, so a frame is not held forever when
    /// traffic stops.
    pub reorder_delay: Duration,
    /// Most frames held at once per direction (bounds memory).
    pub max_held: usize,
}

impl Default for FaultConfig {
    /// No faults, seed 0, on receive, reorder depth 3 or 1 ms, 64 held frames.
    fn default() -> Self {
        FaultConfig {
            loss: 0.0,
            reorder: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            seed: 0,
            direction: FaultDirection::Rx,
            reorder_depth: 3,
            reorder_delay: Duration::from_millis(1),
            max_held: 64,
        }
    }
}

/// Counts of faults applied, over both directions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Frames the injector decided on.
    pub frames: u64,
    /// Frames lost.
    pub lost: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Frames held back and delivered late.
    pub reordered: u64,
    /// Reorders or duplicates not applied because the held store was full.
    pub held_full: u64,
}

/// A frame copy waiting to be released.
#[derive(Debug)]
struct Held {
    buf: Vec<u8>,
    len: usize,
    /// What the frame's link said of it (received frames) or asked of the link (sent ones).
    rx_meta: RxMeta,
    tx_meta: TxMeta,
    /// Released when this many more frames have passed (0: due now) ...
    frames_left: u32,
    /// ... or at this time.
    release_at: Instant,
}

/// The held frames of one direction, with their recycled buffers.
#[derive(Debug, Default)]
struct HeldStore {
    frames: VecDeque<Held>,
    free: Vec<Vec<u8>>,
}

impl HeldStore {
    fn has_room(&self, max: usize) -> bool {
        self.frames.len() < max
    }

    /// Applies a verdict's duplication and reordering through the store, counting each
    /// (or the lack of room for it). Returns whether the frame itself was held back for
    /// reordering, in which case the caller must not pass it on now.
    #[allow(clippy::too_many_arguments)]
    fn divert(
        &mut self,
        v: &Verdict,
        frame: &[u8],
        metas: (RxMeta, TxMeta),
        stats: &mut FaultStats,
        max_held: usize,
        depth: u32,
        now: Instant,
        release_at: Instant,
    ) -> bool {
        if v.duplicate {
            if self.has_room(max_held) {
                stats.duplicated += 1;
                self.hold(frame, metas, 0, now);
            } else {
                stats.held_full += 1;
            }
        }
        if v.reorder {
            if self.has_room(max_held) {
                stats.reordered += 1;
                self.hold(frame, metas, depth, release_at);
                return true;
            }
            stats.held_full += 1;
        }
        false
    }

    fn hold(
        &mut self,
        frame: &[u8],
        metas: (RxMeta, TxMeta),
        frames_left: u32,
        release_at: Instant,
    ) {
        let mut buf = self.free.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        self.frames.push_back(Held {
            len: frame.len(),
            rx_meta: metas.0,
            tx_meta: metas.1,
            buf,
            frames_left,
            release_at,
        });
    }

    /// One more frame has passed the held ones.
    fn tick(&mut self) {
        for h in &mut self.frames {
            h.frames_left = h.frames_left.saturating_sub(1);
        }
    }

    /// Removes the oldest held frame that is due at `now`.
    fn pop_due(&mut self, now: Instant) -> Option<Held> {
        let i = self
            .frames
            .iter()
            .position(|h| h.frames_left == 0 || h.release_at <= now)?;
        self.frames.remove(i)
    }

    fn recycle(&mut self, held: Held) {
        self.free.push(held.buf);
    }

    /// When the next held frame is due (possibly already past).
    fn next_due(&self) -> Option<Instant> {
        self.frames
            .iter()
            .map(|h| {
                if h.frames_left == 0 {
                    Instant::ZERO
                } else {
                    h.release_at
                }
            })
            .min()
    }
}

/// The fate of one frame.
#[derive(Debug, Clone, Copy, Default)]
struct Verdict {
    lose: bool,
    /// Bit index to flip, counted from the first byte's least significant bit.
    flip_bit: Option<usize>,
    duplicate: bool,
    reorder: bool,
}

/// The decision-making part of the injector, apart from the wrapped link so that the
/// link's callbacks can borrow it.
#[derive(Debug)]
struct Faults {
    config: FaultConfig,
    rng: SmallRng,
    stats: FaultStats,
}

impl Faults {
    fn chance(&mut self, p: f64) -> bool {
        // `gen_bool` panics outside [0, 1]; a plain comparison clamps, and NaN never fires.
        p > 0.0 && self.rng.gen::<f64>() < p
    }

    fn decide(&mut self, len: usize) -> Verdict {
        self.stats.frames += 1;
        if self.chance(self.config.loss) {
            self.stats.lost += 1;
            return Verdict {
                lose: true,
                ..Verdict::default()
            };
        }
        let mut v = Verdict::default();
        if len > 0 && self.chance(self.config.corrupt) {
            self.stats.corrupted += 1;
            v.flip_bit = Some(self.rng.gen_range(0..len * 8));
        }
        v.duplicate = self.chance(self.config.duplicate);
        v.reorder = self.chance(self.config.reorder);
        v
    }
}

fn flip(frame: &mut [u8], bit: usize) {
    if let Some(byte) = frame.get_mut(bit / 8) {
        *byte ^= 1 << (bit % 8);
    }
}

/// A [`Link`] that applies seeded faults to the link it wraps. See the
/// [module documentation](self).
#[derive(Debug)]
pub struct FaultInjector<L: Link> {
    inner: L,
    faults: Faults,
    tx_held: HeldStore,
    rx_held: HeldStore,
    /// Reused copy of a received frame being corrupted (received frames are lent
    /// read-only).
    scratch: Vec<u8>,
}

impl<L: Link> FaultInjector<L> {
    /// Wraps `inner`.
    pub fn new(inner: L, config: FaultConfig) -> Self {
        FaultInjector {
            inner,
            faults: Faults {
                rng: SmallRng::seed_from_u64(config.seed),
                config,
                stats: FaultStats::default(),
            },
            tx_held: HeldStore::default(),
            rx_held: HeldStore::default(),
            scratch: Vec::new(),
        }
    }

    /// The counts of faults applied so far.
    pub fn fault_stats(&self) -> FaultStats {
        self.faults.stats
    }

    /// The configuration.
    pub fn config(&self) -> &FaultConfig {
        &self.faults.config
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped link, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// Unwraps the link; held frames are discarded.
    pub fn into_inner(self) -> L {
        self.inner
    }

    /// Frames held back right now (both directions).
    pub fn held_frames(&self) -> usize {
        self.tx_held.frames.len() + self.rx_held.frames.len()
    }
}

impl<L: Link> Link for FaultInjector<L> {
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
        if !self.faults.config.direction.rx() {
            return self.inner.recv_batch_meta(now, max, f);
        }
        let FaultInjector {
            inner,
            faults,
            rx_held: held,
            scratch,
            ..
        } = self;
        let mut delivered = 0;
        // Frames whose hold expired go first: they were received earlier.
        while delivered < max {
            let Some(h) = held.pop_due(now) else { break };
            f(h.buf.get(..h.len).unwrap_or(&[]), h.rx_meta);
            held.recycle(h);
            delivered += 1;
        }
        if delivered < max {
            let max_held = faults.config.max_held;
            let depth = faults.config.reorder_depth;
            let release_at = now + faults.config.reorder_delay;
            inner.recv_batch_meta(now, max - delivered, &mut |frame, mut meta| {
                held.tick();
                let v = faults.decide(frame.len());
                if v.lose {
                    return;
                }
                let frame: &[u8] = match v.flip_bit {
                    Some(bit) => {
                        scratch.clear();
                        scratch.extend_from_slice(frame);
                        flip(scratch, bit);
                        // Whatever the link verified, these are not the bytes it verified.
                        meta.checksum_verified = false;
                        scratch
                    }
                    None => frame,
                };
                // Extras (a duplicate) go through the held store so that they never take
                // the budget the inner link reserved for its own frames.
                if held.divert(
                    &v,
                    frame,
                    (meta, TxMeta::default()),
                    &mut faults.stats,
                    max_held,
                    depth,
                    now,
                    release_at,
                ) {
                    return;
                }
                f(frame, meta);
                delivered += 1;
            });
            // Duplicates, and frames released by the ones that just passed.
            while delivered < max {
                let Some(h) = held.pop_due(now) else { break };
                f(h.buf.get(..h.len).unwrap_or(&[]), h.rx_meta);
                held.recycle(h);
                delivered += 1;
            }
        }
        delivered
    }

    fn tx_batch(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&mut [u8]) -> Option<Range<usize>>,
    ) -> usize {
        self.tx_batch_meta(now, max, &mut |buf| Some((f(buf)?, TxMeta::default())))
    }

    fn tx_batch_gather(&mut self, now: Instant, max: usize, f: &mut GatherWriter<'_>) -> usize {
        if !self.faults.config.direction.tx() {
            return self.inner.tx_batch_gather(now, max, f);
        }
        // Faults act on whole frames in a buffer: the spans are copied in (the default).
        super::gather_by_copying(self, now, max, f)
    }

    fn tx_batch_meta(&mut self, now: Instant, max: usize, f: &mut FrameWriter<'_>) -> usize {
        if !self.faults.config.direction.tx() {
            return self.inner.tx_batch_meta(now, max, f);
        }
        let FaultInjector {
            inner,
            faults,
            tx_held: held,
            ..
        } = self;
        let max_held = faults.config.max_held;
        let depth = faults.config.reorder_depth;
        let release_at = now + faults.config.reorder_delay;
        let mut produced = 0;
        let mut caller_done = false;
        // Lost and held frames hand their buffer straight back to the caller for the next
        // frame, and released frames take buffers of their own, so the inner link may need
        // up to `max` plus the held frames.
        let inner_max = max.saturating_add(held.frames.len()).saturating_add(max);
        let max_frame_len = inner.max_frame_len();
        let max_super_len = inner.offloads().tx_segmentation.max(max_frame_len);
        inner.tx_batch_meta(now, inner_max, &mut |buf| loop {
            if let Some(h) = held.pop_due(now) {
                let len = h.len;
                if let Some(dst) = buf.get_mut(..len) {
                    dst.copy_from_slice(h.buf.get(..len).unwrap_or(&[]));
                }
                let meta = h.tx_meta;
                held.recycle(h);
                return Some((0..len, meta));
            }
            if caller_done || produced >= max {
                return None;
            }
            let Some((range, mut meta)) = f(buf) else {
                caller_done = true;
                continue;
            };
            produced += 1;
            let limit = if meta.segment_size > 0 {
                max_super_len
            } else {
                max_frame_len
            };
            if !tx_range_ok(&range, buf.len(), limit) {
                // Let the inner link count the drop.
                return Some((range, meta));
            }
            let Some(frame) = buf.get_mut(range.clone()) else {
                return Some((range, meta));
            };
            let len = frame.len();
            held.tick();
            let v = faults.decide(len);
            if v.lose {
                continue;
            }
            if let Some(bit) = v.flip_bit {
                match meta.partial_checksum {
                    None => flip(frame, bit),
                    Some(partial) if meta.segment_size == 0 => {
                        complete_checksum(frame, partial);
                        meta.partial_checksum = None;
                        flip(frame, bit);
                    }
                    // Only the link can complete a super-segment's checksums.
                    Some(_) => {}
                }
            }
            if held.divert(
                &v,
                frame,
                (RxMeta::default(), meta),
                &mut faults.stats,
                max_held,
                depth,
                now,
                release_at,
            ) {
                continue;
            }
            return Some((range, meta));
        });
        produced
    }

    fn flush(&mut self, now: Instant) {
        if self.faults.config.direction.tx() && self.tx_held.next_due().is_some_and(|t| t <= now) {
            let held = &mut self.tx_held;
            let n = held.frames.len();
            self.inner.tx_batch_meta(now, n, &mut |buf| {
                let h = held.pop_due(now)?;
                let len = h.len;
                if let Some(dst) = buf.get_mut(..len) {
                    dst.copy_from_slice(h.buf.get(..len).unwrap_or(&[]));
                }
                let meta = h.tx_meta;
                held.recycle(h);
                Some((0..len, meta))
            });
        }
        self.inner.flush(now);
    }

    fn poll_at(&self) -> Option<Instant> {
        [
            self.inner.poll_at(),
            self.tx_held.next_due(),
            self.rx_held.next_due(),
        ]
        .into_iter()
        .flatten()
        .min()
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

    const N: u32 = 10_000;
    const FRAME_LEN: usize = 64;

    fn frame(i: u32) -> Vec<u8> {
        let mut f = vec![0u8; FRAME_LEN];
        f[..4].copy_from_slice(&i.to_be_bytes());
        for (j, b) in f.iter_mut().enumerate().skip(4) {
            *b = (i as usize).wrapping_mul(31).wrapping_add(j) as u8;
        }
        f
    }

    fn index(f: &[u8]) -> u32 {
        u32::from_be_bytes([f[0], f[1], f[2], f[3]])
    }

    #[derive(Debug, PartialEq)]
    struct Run {
        received: Vec<Vec<u8>>,
        stats: FaultStats,
    }

    /// Sends frames 0..N, one per microsecond, from one end to the other, with `config`
    /// applied at the sender (direction Tx) or at the receiver (otherwise), and collects
    /// what arrives once everything held has been released.
    fn run(config: FaultConfig) -> Run {
        let (a, b) = sim::pair(SimConfig::default());
        let (ca, cb) = if config.direction == FaultDirection::Tx {
            (config, FaultConfig::default())
        } else {
            (FaultConfig::default(), config)
        };
        let mut a = FaultInjector::new(a, ca);
        let mut b = FaultInjector::new(b, cb);
        let mut received = Vec::new();
        let mut now = Instant::ZERO;
        for i in 0..N {
            now = Instant::from_micros(u64::from(i));
            assert!(a.send_frame(now, &frame(i)));
            a.flush(now);
            b.recv_batch(now, 16, &mut |f| received.push(f.to_vec()));
        }
        // Drain: follow poll_at until both sides are quiet.
        for _ in 0..100_000 {
            let Some(next) = [a.poll_at(), b.poll_at()].into_iter().flatten().min() else {
                break;
            };
            now = now.max(next);
            a.flush(now);
            b.recv_batch(now, 16, &mut |f| received.push(f.to_vec()));
        }
        assert_eq!(a.poll_at().or(b.poll_at()), None, "did not drain");
        assert_eq!(a.held_frames() + b.held_frames(), 0);
        let (sa, sb) = (a.fault_stats(), b.fault_stats());
        let stats = FaultStats {
            frames: sa.frames + sb.frames,
            lost: sa.lost + sb.lost,
            corrupted: sa.corrupted + sb.corrupted,
            duplicated: sa.duplicated + sb.duplicated,
            reordered: sa.reordered + sb.reordered,
            held_full: sa.held_full + sb.held_full,
        };
        Run { received, stats }
    }

    fn rate(count: u64) -> f64 {
        count as f64 / f64::from(N)
    }

    fn assert_near(what: &str, got: f64, want: f64) {
        // 10k Bernoulli trials at p <= 0.2: sd <= 0.004; allow five of them.
        assert!(
            (got - want).abs() < 0.02,
            "{what}: rate {got}, expected about {want}"
        );
    }

    fn both_directions(base: FaultConfig) -> [FaultConfig; 2] {
        [
            FaultConfig {
                direction: FaultDirection::Tx,
                ..base.clone()
            },
            FaultConfig {
                direction: FaultDirection::Rx,
                ..base
            },
        ]
    }

    #[test]
    fn no_faults_is_transparent() {
        let r = run(FaultConfig::default());
        let want: Vec<Vec<u8>> = (0..N).map(frame).collect();
        assert_eq!(r.received, want);
        assert_eq!(
            r.stats.lost + r.stats.corrupted + r.stats.duplicated + r.stats.reordered,
            0
        );
    }

    #[test]
    fn loss_rate() {
        for config in both_directions(FaultConfig {
            loss: 0.1,
            seed: 1,
            ..FaultConfig::default()
        }) {
            let r = run(config);
            assert_near("loss", rate(r.stats.lost), 0.1);
            assert_eq!(r.received.len() as u64, u64::from(N) - r.stats.lost);
            // What arrives is intact and in order.
            let idx: Vec<u32> = r.received.iter().map(|f| index(f)).collect();
            assert!(idx.windows(2).all(|w| w[0] < w[1]));
            assert!(r.received.iter().all(|f| *f == frame(index(f))));
        }
    }

    #[test]
    fn duplication_rate() {
        for config in both_directions(FaultConfig {
            duplicate: 0.05,
            seed: 2,
            ..FaultConfig::default()
        }) {
            let r = run(config);
            assert_near("duplicate", rate(r.stats.duplicated), 0.05);
            assert_eq!(r.received.len() as u64, u64::from(N) + r.stats.duplicated);
            let mut counts = vec![0u32; N as usize];
            for f in &r.received {
                assert_eq!(*f, frame(index(f)));
                counts[index(f) as usize] += 1;
            }
            assert!(counts.iter().all(|&c| c == 1 || c == 2));
            let dups = counts.iter().filter(|&&c| c == 2).count() as u64;
            assert_eq!(dups, r.stats.duplicated);
        }
    }

    #[test]
    fn corruption_flips_exactly_one_bit() {
        for config in both_directions(FaultConfig {
            corrupt: 0.2,
            seed: 3,
            ..FaultConfig::default()
        }) {
            let r = run(config);
            assert_near("corrupt", rate(r.stats.corrupted), 0.2);
            assert_eq!(r.received.len(), N as usize);
            let mut damaged = 0;
            for (i, f) in r.received.iter().enumerate() {
                let want = frame(i as u32);
                let bits: u32 = f.iter().zip(&want).map(|(x, y)| (x ^ y).count_ones()).sum();
                assert!(bits <= 1);
                damaged += u64::from(bits);
            }
            assert_eq!(damaged, r.stats.corrupted);
        }
    }

    #[test]
    fn reordering_delivers_everything_once_but_late() {
        for config in both_directions(FaultConfig {
            reorder: 0.1,
            seed: 4,
            ..FaultConfig::default()
        }) {
            let r = run(config);
            assert_near("reorder", rate(r.stats.reordered), 0.1);
            let mut idx: Vec<u32> = r.received.iter().map(|f| index(f)).collect();
            let late = idx.windows(2).filter(|w| w[0] > w[1]).count() as u64;
            assert!(late > r.stats.reordered / 2, "{late} inversions");
            idx.sort_unstable();
            assert_eq!(idx, (0..N).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_reordered_frame_comes_after_depth_frames() {
        let config = FaultConfig {
            reorder: 1.0,
            reorder_depth: 2,
            reorder_delay: Duration::from_secs(1),
            max_held: 1,
            ..FaultConfig::default()
        };
        let (a, mut b) = sim::pair(SimConfig::default());
        let mut a = FaultInjector::new(
            a,
            FaultConfig {
                direction: FaultDirection::Tx,
                ..config
            },
        );
        let mut got = Vec::new();
        for i in 0..4 {
            a.send_frame(Instant::ZERO, &frame(i));
        }
        a.flush(Instant::ZERO);
        b.recv_batch(Instant::from_millis(1), 16, &mut |f| got.push(index(f)));
        // Frame 0 is held (the store has room for one only), 1 and 2 pass and release it;
        // then 3 takes the free slot and waits for two more frames (or a second).
        assert_eq!(got, vec![1, 2, 0]);
        assert_eq!(a.fault_stats().held_full, 2);
        assert_eq!(a.held_frames(), 1);
        assert_eq!(a.poll_at(), Some(Instant::from_millis(1000)));
    }

    #[test]
    fn a_held_frame_is_released_by_time_alone() {
        for direction in [FaultDirection::Tx, FaultDirection::Rx] {
            let config = FaultConfig {
                reorder: 1.0,
                reorder_depth: 100,
                reorder_delay: Duration::from_micros(50),
                direction,
                ..FaultConfig::default()
            };
            let (a, b) = sim::pair(SimConfig::default());
            let mut a = FaultInjector::new(a, config.clone());
            let mut b = FaultInjector::new(b, config);
            a.send_frame(Instant::ZERO, &frame(7));
            a.flush(Instant::ZERO);
            let mut got = Vec::new();
            let mut now = Instant::ZERO;
            while let Some(t) = [a.poll_at(), b.poll_at()].into_iter().flatten().min() {
                now = t;
                a.flush(now);
                b.recv_batch(now, 16, &mut |f| got.push(index(f)));
            }
            assert_eq!(got, vec![7]);
            // Held 50 µs on one side plus 10 µs of latency.
            assert_eq!(now, Instant::from_micros(60), "{direction:?}");
        }
    }

    #[test]
    fn held_frames_are_bounded() {
        let config = FaultConfig {
            reorder: 1.0,
            duplicate: 1.0,
            reorder_depth: 1000,
            reorder_delay: Duration::from_secs(10),
            max_held: 8,
            ..FaultConfig::default()
        };
        let (a, b) = sim::pair(SimConfig::default());
        let mut a = a;
        let mut b = FaultInjector::new(b, config);
        for i in 0..100 {
            a.send_frame(Instant::ZERO, &frame(i));
        }
        a.flush(Instant::ZERO);
        let mut got = 0;
        b.recv_batch(Instant::from_millis(1), 1000, &mut |_| got += 1);
        assert!(b.held_frames() <= 8);
        assert!(b.fault_stats().held_full > 0);
        assert_eq!(
            got + b.held_frames(),
            100 + b.fault_stats().duplicated as usize
        );
    }

    #[test]
    fn recv_batch_never_exceeds_max() {
        let config = FaultConfig {
            duplicate: 1.0,
            ..FaultConfig::default()
        };
        let (mut a, b) = sim::pair(SimConfig::default());
        let mut b = FaultInjector::new(b, config);
        for i in 0..10 {
            a.send_frame(Instant::ZERO, &frame(i));
        }
        a.flush(Instant::ZERO);
        let mut total = 0;
        loop {
            let mut got = 0;
            let n = b.recv_batch(Instant::from_millis(1), 3, &mut |_| got += 1);
            assert_eq!(n, got);
            assert!(n <= 3);
            if n == 0 {
                break;
            }
            total += n;
        }
        assert_eq!(total, 20);
    }

    #[test]
    fn all_faults_together_are_deterministic_per_seed() {
        let config = |seed, direction| FaultConfig {
            loss: 0.05,
            reorder: 0.05,
            duplicate: 0.05,
            corrupt: 0.05,
            seed,
            direction,
            ..FaultConfig::default()
        };
        let one = run(config(42, FaultDirection::Rx));
        assert_eq!(one, run(config(42, FaultDirection::Rx)));
        assert_ne!(one.received, run(config(43, FaultDirection::Rx)).received);
        for (what, count) in [
            ("loss", one.stats.lost),
            ("reorder", one.stats.reordered),
            ("duplicate", one.stats.duplicated),
            ("corrupt", one.stats.corrupted),
        ] {
            // Rates of frames that survived loss are a little lower; the tolerance covers it.
            assert_near(what, rate(count), 0.05);
        }
        let both = run(config(42, FaultDirection::Both));
        assert_eq!(both, run(config(42, FaultDirection::Both)));
    }

    #[test]
    fn tx_frames_starting_in_the_headroom_keep_their_bytes() {
        let config = FaultConfig {
            reorder: 0.5,
            duplicate: 0.2,
            reorder_depth: 1,
            direction: FaultDirection::Tx,
            seed: 9,
            ..FaultConfig::default()
        };
        let (a, mut b) = sim::pair(SimConfig::default());
        let mut a = FaultInjector::new(a, config);
        let mut next = 0u32;
        let n = a.tx_batch(Instant::ZERO, 100, &mut |buf| {
            let f = frame(next);
            next += 1;
            buf[20..20 + f.len()].copy_from_slice(&f);
            Some(20..20 + f.len())
        });
        assert_eq!(n, 100);
        a.flush(Instant::ZERO);
        let mut got = Vec::new();
        let mut now = Instant::ZERO;
        while let Some(t) = [a.poll_at(), b.poll_at()].into_iter().flatten().min() {
            now = now.max(t);
            a.flush(now);
            b.recv_batch(now, 1000, &mut |f| got.push(f.to_vec()));
        }
        assert_eq!(got.len() as u64, 100 + a.fault_stats().duplicated);
        assert!(got.iter().all(|f| *f == frame(index(f))));
    }

    #[test]
    fn out_of_range_rates_do_not_panic() {
        let r = run(FaultConfig {
            loss: f64::NAN,
            corrupt: -1.0,
            duplicate: 2.0,
            ..FaultConfig::default()
        });
        assert_eq!(r.stats.lost + r.stats.corrupted, 0);
        assert_eq!(r.stats.duplicated, u64::from(N));
    }
}
