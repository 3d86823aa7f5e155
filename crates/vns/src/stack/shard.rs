//! A shard of the stack: one [`Endpoint`] owning the sockets whose ports map to it
//! ([`ShardOf`](crate::ShardOf)), the wakers of the tasks waiting on them, and the moving
//! of its output into the channels.
//!
//! A stack runs several shards (`StackBuilder::shards`), each behind its own lock, so that
//! calls on sockets of different shards never wait for each other: an application call
//! locks its socket's shard only, and a channel's received chunks are handed to each
//! chunk's shard in turn (`chan.rs`). Every shard's endpoint knows every channel (the
//! driver adds and removes channels in all of them); each has its own scheduler instance
//! ([`NetScheduler::fork`](netsched::NetScheduler::fork)), outboxes and budgets.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use netdriver::channel::EnqueueError;
use netsched::{ChannelClass, ChannelId};
use tracing::debug;

use super::chan::{Chan, ChanTable, ChanTx};
use super::driver::{lost, Gone, SockWake};
use crate::endpoint::{ChannelLoad, Endpoint, Event, SocketId};
use crate::wire::HEADER_LEN;

/// Bytes of `poll_transmit` output gathered per batch (headers, small chunks and the
/// large payloads enqueued beside them).
const TX_BATCH: usize = 256 * 1024;
/// Payloads up to this size are copied into the batch beside their header; larger ones
/// are enqueued as they are (shared with the socket's send buffer).
const INLINE_PAYLOAD: usize = 4 * 1024;
/// Whole chunks (header in the room in front of the payload) up to this size are copied
/// into the batch when other chunks go with them; larger ones, and one that goes alone,
/// are enqueued as they are.
const WHOLE_INLINE: usize = 512;
/// Batches up to this size are copied out of the shard's batch buffer, which is kept.
const SMALL_BATCH: usize = 16 * 1024;
/// Batches written to one channel per call (in bytes: `TX_BUDGET * TX_BATCH`).
const TX_BUDGET: usize = 16;

/// Most shards a stack runs (a set of them is a bit mask).
pub(crate) const MAX_SHARDS: usize = 64;

/// A set of shard indices.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShardSet(u64);

impl ShardSet {
    pub(crate) fn insert(&mut self, i: usize) {
        self.0 |= 1 << i;
    }

    /// The members, lowest first (one step per member, not per possible shard).
    pub(crate) fn iter(self) -> impl Iterator<Item = usize> {
        let mut rest = self.0;
        std::iter::from_fn(move || {
            if rest == 0 {
                return None;
            }
            let i = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            Some(i)
        })
    }
}

/// What a finishing pass over a shard has to do ([`Shard::finish_needed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FinishNeeded {
    /// Nothing.
    Nothing,
    /// Only hand out the endpoint's events (wake-ups).
    Events,
    /// Place and send chunks, run kicks, hand out events.
    Full,
}

/// Everything behind one shard's lock.
/// Whether a transmit pass waits for a channel's tx lock that another thread holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxLocks {
    /// It waits: an application call sends its own chunks (and those its channel
    /// refused) before it returns.
    Wait,
    /// It passes the channel by: the stack driver, which serves every shard, does not
    /// wait behind one channel's holder (a bulk shard's flush preempted on a busy core
    /// held the driver, and with it the latency class's fallback pulls, for as long).
    Skip,
}

pub(crate) struct Shard {
    pub(crate) ep: Endpoint,
    // Keys this host assigns (socket ids, local ports): FxHash, see Cargo.toml.
    pub(crate) socks: FxHashMap<SocketId, SockWake>,
    pub(crate) listeners: FxHashMap<u16, Option<Waker>>,
    pub(crate) deadlines: BTreeMap<SocketId, Instant>,
    /// The driver has stopped: no channel will ever move again.
    pub(crate) stopped: bool,
    /// Channels whose last load reported to this shard's endpoint was zero. Only the
    /// stack enqueues into a channel, so without new chunks its load can only have fallen
    /// since: such a channel with nothing to send needs neither a visit nor a report.
    idle: FxHashSet<ChannelId>,
    /// Scratch space of [`Shard::transmit_all`]: the batch being gathered.
    tx_buf: Vec<u8>,
    /// Scratch space of [`Shard::transmit_all`]: the channels it visits.
    tx_visit: Vec<ChannelId>,
    /// A pass with [`TxLocks::Skip`] passed a channel whose tx lock another thread held
    /// (see [`Shard::take_tx_skipped`]).
    tx_skipped: bool,
    /// Channel wake-ups (or inline transmits) that enqueues handed back, run by whoever
    /// releases the lock next: a round of a channel thread, with its system call, never
    /// runs under a shard's lock. With how it runs ([`KickMode`]): inline for any
    /// channel while the stack is lightly loaded ([`LightLoad`]), else for latency-class
    /// channels only, on a quiet queue (measured on the 2-core bed, docs/performance.md:
    /// inline rounds save a sparse stream ~10 % of its latency and up to 25 % of one
    /// connection's request rate, but cost 25-35 % of the request rate at 32-128
    /// connections, where the channel threads batch).
    #[cfg(target_os = "linux")]
    pub(crate) kicks: Vec<(netdriver::channel::DeferredKick, KickMode)>,
    /// The stack's count of active streams, shared by its shards (see [`LightLoad`]).
    pub(crate) load: Arc<LightLoad>,
    /// Where the scheduler keeps the classes apart: the class of the channels whose
    /// refused batches this shard helps send ([`transmit_all`](Self::transmit_all)), its
    /// own sockets' class (the latency shard's is `Latency`); `None`: every channel's.
    help_class: Option<ChannelClass>,
    /// Channels on which this shard's own batches wait (refused, `ChanTx::pending`): it
    /// sends them on, whatever their class.
    left_pending: FxHashSet<ChannelId>,
}

/// How a channel kick that an enqueue handed back runs, once no lock is held.
#[cfg(target_os = "linux")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KickMode {
    /// `DeferredKick::run`: inline if the thread sleeps and the queue has been quiet.
    InlineIfQuiet,
    /// `DeferredKick::run_now`: inline whenever the thread sleeps (a lightly loaded stack,
    /// [`LightLoad`]: measured on the 2-core bed, 64-byte requests over 8 connections
    /// 1.15-1.3x against the quiet rule, which woke the thread for most messages there).
    Inline,
}

/// How many of the stack's streams moved bytes lately, and up to how many it counts as
/// lightly loaded: then every stream takes the latency-class per-message path (a small
/// send into a quiet, idle channel goes out from the sending task; a reading task
/// processes its queue's arrivals in its own runtime, `RuntimeRx::LatencyClass`),
/// because with few active streams the channel threads have little to batch and each of
/// their wake-ups is pure cost. With more, throughput-class streams leave both to the
/// channel threads, which batch. Measured on the 2-core bed (`docs/performance.md`,
/// "Few active streams"): one connection's request rate 3.5-5x, 8 connections'
/// 1.0-1.4x. Whether the channel threads' batching pays with many streams depends on
/// whether they have cores of their own, hence the bound chosen from the host.
///
/// Active means: read or wrote bytes in the current or the previous period of
/// [`ACTIVITY_PERIOD`]; idle streams (a server's parked connections) do not count. The
/// figure is the larger of the two periods' counts, so a falling load turns light one
/// period late and a rising one turns busy as soon as the current period has seen enough
/// streams.
///
/// The bound is the user's (`StackBuilder::light_load_streams`) or, by default, chosen
/// from the host ([`auto_light_load_streams`]) and chosen again when the stack's channel
/// threads change ([`retune`](Self::retune)).
#[derive(Debug)]
pub(crate) struct LightLoad {
    max: AtomicUsize,
    /// The bound follows the host ([`auto_light_load_streams`]); cleared when the user
    /// sets one.
    auto: std::sync::atomic::AtomicBool,
    /// [`netdriver::time::coarse_millis`] when it was made.
    origin_ms: u64,
    /// The larger of the current and the previous period's counts, for cheap reads.
    recent: AtomicUsize,
    /// The current period's number plus one (0: none yet; low 32 bits), its count and
    /// the previous period's (16 bits each, saturating), updated by compare-and-swap.
    /// Not a mutex: every shard's streams count here, and a bulk thread preempted while
    /// holding one held a latency application's write behind it (where the classes are
    /// kept apart, nothing else on the per-message path is shared across them).
    periods: AtomicU64,
}

/// [`LightLoad::periods`] packed: (period, current, previous).
fn pack_periods(period: u32, current: u16, previous: u16) -> u64 {
    u64::from(period) << 32 | u64::from(current) << 16 | u64::from(previous)
}

/// [`LightLoad::periods`] unpacked.
fn unpack_periods(v: u64) -> (u32, u16, u16) {
    ((v >> 32) as u32, (v >> 16) as u16, v as u16)
}

/// The light-load bound a stack takes when its user sets none
/// (`StackBuilder::light_load_streams`): unbounded where the stack's live channel threads
/// are at least as many as the cores the process may run on, the default bound
/// otherwise (and for backends without channel threads, `None`).
///
/// Why: handing messages to channel threads pays when they run beside the application,
/// each on a core of its own, and batch there. Where they cannot (as many threads as
/// cores or more), each hand-off is a context switch on a core the application needed,
/// and the threads contend with the application's inline rounds for the queues' locks.
/// Measured on the 2-core bed (2 queues, so 2 channel threads per stack,
/// `docs/performance.md`, "Channel threads without cores of their own"): request rate at
/// 32 and 128 connections 0.93-1.02 of kernel TCP unbounded against 0.70-0.95 with the
/// bound of 8, CPU per request lower too.
pub(crate) fn auto_light_load_streams(channel_threads: Option<usize>, cores: usize) -> usize {
    match channel_threads {
        Some(threads) if threads > 0 && threads >= cores => usize::MAX,
        _ => super::DEFAULT_LIGHT_LOAD_STREAMS,
    }
}

/// The period over which [`LightLoad`] counts active streams.
pub(crate) const ACTIVITY_PERIOD: std::time::Duration = std::time::Duration::from_millis(5);

impl LightLoad {
    /// A bound of `max` streams (`Some`: the user's), or one that follows the host
    /// (`None`: [`DEFAULT_LIGHT_LOAD_STREAMS`](super::DEFAULT_LIGHT_LOAD_STREAMS) until the
    /// first [`retune`](Self::retune)).
    pub(crate) fn new(max: Option<usize>) -> LightLoad {
        LightLoad {
            max: AtomicUsize::new(max.unwrap_or(super::DEFAULT_LIGHT_LOAD_STREAMS)),
            auto: std::sync::atomic::AtomicBool::new(max.is_none()),
            origin_ms: netdriver::time::coarse_millis(),
            recent: AtomicUsize::new(0),
            periods: AtomicU64::new(0),
        }
    }

    /// Whether every stream takes the latency-class path now.
    pub(crate) fn is_light(&self) -> bool {
        let max = self.max.load(Ordering::Relaxed);
        max > 0 && self.recent.load(Ordering::Relaxed) <= max
    }

    /// Changes the bound (`Stack::set_light_load_streams`); it no longer follows the host.
    pub(crate) fn set_max(&self, max: usize) {
        self.auto.store(false, Ordering::Relaxed);
        self.max.store(max, Ordering::Relaxed);
    }

    /// The bound now (`usize::MAX`: unbounded).
    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// Chooses the bound again for `channel_threads` live channel threads on `cores`
    /// usable cores, unless the user set one. Returns the bound.
    pub(crate) fn retune(&self, channel_threads: Option<usize>, cores: usize) -> usize {
        if self.auto.load(Ordering::Relaxed) {
            let max = auto_light_load_streams(channel_threads, cores);
            if self.max.swap(max, Ordering::Relaxed) != max {
                tracing::debug!(
                    channel_threads,
                    cores,
                    bound = max,
                    "light-load bound chosen again"
                );
            }
        }
        self.max()
    }

    /// Streams active in the current or the previous period (the larger count).
    pub(crate) fn active_streams(&self) -> usize {
        self.recent.load(Ordering::Relaxed)
    }

    /// The current period's number, plus one.
    fn period_now(&self) -> u64 {
        // Every read and write asks: the coarse clock (a tick behind at most, against
        // periods of several ticks) costs a fraction of a precise read.
        const PERIOD_MS: u64 = ACTIVITY_PERIOD.as_millis() as u64;
        netdriver::time::coarse_millis().saturating_sub(self.origin_ms) / PERIOD_MS + 1
    }

    /// A stream moved bytes; `last` is the period it last did (updated). Counts each
    /// stream once per period.
    pub(crate) fn note_active(&self, last: &mut u64) {
        self.note_active_in(self.period_now(), last);
    }

    /// [`note_active`](Self::note_active) in period `now` (its number plus one).
    fn note_active_in(&self, now: u64, last: &mut u64) {
        if *last == now {
            return;
        }
        *last = now;
        // Periods wrap at 2^32 (of 5 ms: 248 days): only equality and succession matter.
        let now = now as u32;
        let mut old = self.periods.load(Ordering::Relaxed);
        loop {
            let (period, current, previous) = unpack_periods(old);
            let (current, previous) = if period == now {
                (current.saturating_add(1), previous)
            } else if period.wrapping_add(1) == now {
                (1, current)
            } else {
                (1, 0)
            };
            match self.periods.compare_exchange_weak(
                old,
                pack_periods(now, current, previous),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.recent
                        .store(usize::from(current.max(previous)), Ordering::Relaxed);
                    return;
                }
                Err(seen) => old = seen,
            }
        }
    }
}

impl Shard {
    pub(crate) fn new(ep: Endpoint, load: Arc<LightLoad>) -> Shard {
        Shard {
            load,
            ep,
            socks: FxHashMap::default(),
            listeners: FxHashMap::default(),
            deadlines: BTreeMap::new(),
            stopped: false,
            idle: FxHashSet::default(),
            tx_buf: Vec::with_capacity(SMALL_BATCH),
            tx_visit: Vec::new(),
            tx_skipped: false,
            #[cfg(target_os = "linux")]
            kicks: Vec::new(),
            help_class: None,
            left_pending: FxHashSet::default(),
        }
    }

    /// Where the scheduler keeps the classes apart: this shard helps send only the
    /// refused batches of channels of `class` (besides its own), see
    /// [`transmit_all`](Self::transmit_all).
    pub(crate) fn help_only(&mut self, class: ChannelClass) {
        self.help_class = Some(class);
    }

    /// Moves the endpoint's output into every channel; returns whether work is left over
    /// (a channel's budget was used up, or a channel died: the driver drops it).
    pub(crate) fn transmit_all(
        &mut self,
        table: &ChanTable,
        cx: &mut Context<'_>,
        locks: TxLocks,
    ) -> bool {
        // The scheduler reads the channels' loads when it places new chunks: refresh them
        // first (a channel whose last report was zero cannot have gained load, since only
        // the stack enqueues into it).
        if self.ep.wants_schedule() {
            for chan in table.values() {
                if !self.idle.contains(&chan.id) && chan.dead().is_none() {
                    self.report_load(chan);
                }
            }
        }
        // Most calls (every application call ends with one) find nothing to send: no
        // chunk for any channel and no batch a channel refused. They visit no channel,
        // and the others only the channels with chunks (callgrind, one connection's
        // ping-pong: visiting every channel on every call, 9 calls and 40 load reads per
        // request, was a quarter of the stack's instructions).
        let mut visit = std::mem::take(&mut self.tx_visit);
        self.ep.channels_with_transmit(&mut visit);
        // Batches a channel refused wait in it for whichever shard sends next; a shard
        // helps those of its own class's channels (where the classes are kept apart) and
        // always sends on its own. A latency shard that helped bulk channels waited for
        // their tx locks behind bulk threads, and one preempted holder on the bulk cores
        // held the latency application for a scheduler slice (the isolation bench's
        // 1-5 ms samples, `docs/performance.md`, eleventh session).
        for chan in table.values() {
            if chan.tx_pending_bytes.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let helps = self.help_class.is_none_or(|c| c == chan.class)
                || self.left_pending.contains(&chan.id);
            if helps && !visit.contains(&chan.id) {
                visit.push(chan.id);
            }
        }
        if !self.left_pending.is_empty() {
            self.left_pending.retain(|id| {
                table
                    .get(id)
                    .is_some_and(|c| c.tx_pending_bytes.load(Ordering::Relaxed) != 0)
            });
        }
        let mut buf = std::mem::take(&mut self.tx_buf);
        let mut busy = false;
        for id in &visit {
            let Some(chan) = table.get(id) else {
                continue;
            };
            if chan.dead().is_some() {
                continue;
            }
            match self.transmit(chan, cx, &mut buf, locks) {
                Ok(more) => busy |= more,
                Err(why) => {
                    chan.mark_dead(why);
                    busy = true;
                }
            }
        }
        self.tx_visit = visit;
        self.tx_buf = buf;
        busy
    }

    /// Whether a pass with [`TxLocks::Skip`] passed a channel whose tx lock was held since
    /// the last call (cleared): its chunks wait for a later pass.
    pub(crate) fn take_tx_skipped(&mut self) -> bool {
        std::mem::take(&mut self.tx_skipped)
    }

    /// What [`Core::finish_call`](super::driver::Core::finish_call)'s pass over this
    /// shard has to do: nothing (the endpoint has no output or event,
    /// [`Endpoint::output_idle`](crate::Endpoint::output_idle), no kick waits, and no
    /// channel holds a batch it refused, which any shard of its class may send), only
    /// hand out events ([`Endpoint::transmit_idle`](crate::Endpoint::transmit_idle)), or
    /// the whole pass.
    pub(crate) fn finish_needed(&self, table: &ChanTable) -> FinishNeeded {
        #[cfg(target_os = "linux")]
        if !self.kicks.is_empty() {
            return FinishNeeded::Full;
        }
        if !self.left_pending.is_empty()
            || !self.ep.transmit_idle()
            || table
                .values()
                .any(|c| c.tx_pending_bytes.load(Ordering::Relaxed) != 0)
        {
            return FinishNeeded::Full;
        }
        if self.ep.has_events() {
            FinishNeeded::Events
        } else {
            FinishNeeded::Nothing
        }
    }

    /// Reports every live channel's load to the endpoint, for a snapshot of the stack
    /// (`Stack::stats`, the scheduler's plans): sending refreshes only what the
    /// scheduler reads when it places chunks.
    pub(crate) fn refresh_loads(&mut self, table: &ChanTable) {
        for chan in table.values() {
            if chan.dead().is_none() {
                self.report_load(chan);
            }
        }
    }

    /// Moves the endpoint's chunks for a channel into it. `Err` when the channel is gone.
    ///
    /// Headers and small chunks are gathered into `buf` and enqueued as one `Bytes`; a
    /// large payload is enqueued as the `Bytes` the endpoint hands out (a reference to the
    /// socket's send-buffer segment), right after the batch holding its header: no copy.
    /// The channel's tx lock is held throughout, so that no other shard's chunk comes
    /// between a header and its payload.
    fn transmit(
        &mut self,
        chan: &Chan,
        cx: &mut Context<'_>,
        buf: &mut Vec<u8>,
        locks: TxLocks,
    ) -> Result<bool, Gone> {
        let id = chan.id;
        let mut tx = match locks {
            TxLocks::Wait => chan.lock_tx(),
            // The holder sends what the channel refused before (it goes first); this
            // shard's chunks for it wait in the endpoint for the next pass.
            TxLocks::Skip => match chan.try_lock_tx() {
                Some(tx) => tx,
                None => {
                    self.tx_skipped = true;
                    return Ok(false);
                }
            },
        };
        let mut more = false;
        let mut budget = TX_BUDGET * TX_BATCH;
        // A kick for this channel waits in `kicks` (run once the lock is released): what
        // is queued after it goes with it (a header batch and its payload are one
        // message), without a wake-up of the channel thread per payload.
        #[cfg(target_os = "linux")]
        let mut kick_held = false;
        loop {
            // What the channel refused before goes first, in order.
            while let Some(b) = tx.pending.pop_front() {
                let n = b.len();
                #[cfg(target_os = "linux")]
                let queued = if kick_held {
                    chan.t.enqueue_behind(b)
                } else {
                    chan.t.enqueue_deferred(b).map(|kick| {
                        match kick {
                            // Any channel of a lightly loaded stack sends inline whenever
                            // its thread sleeps; latency channels otherwise only when
                            // their queue is quiet too. After the lock is released.
                            Some(kick) if self.load.is_light() => {
                                self.kicks.push((kick, KickMode::Inline));
                                kick_held = true;
                            }
                            Some(kick) if chan.class == ChannelClass::Latency => {
                                self.kicks.push((kick, KickMode::InlineIfQuiet));
                                kick_held = true;
                            }
                            // Throughput channels of a busy stack: the thread is woken
                            // now.
                            Some(kick) => kick.wake(),
                            None => {}
                        }
                    })
                };
                #[cfg(not(target_os = "linux"))]
                let queued = chan.t.enqueue(b);
                match queued {
                    Ok(()) => {
                        chan.tx_pending_bytes.fetch_sub(n, Ordering::Relaxed);
                    }
                    Err(EnqueueError::Full(b)) => {
                        tx.pending.push_front(b);
                        match chan.t.poll_enqueue_ready(cx) {
                            Poll::Ready(Ok(())) => continue,
                            Poll::Ready(Err(e)) => return lost(id, e),
                            Poll::Pending => {
                                self.left_pending.insert(id);
                                self.report_load(chan);
                                return Ok(false);
                            }
                        }
                    }
                    Err(EnqueueError::Closed(e)) => return lost(id, e),
                }
            }
            if budget == 0 {
                more = true;
                break;
            }
            // After a batch went in, the scheduler's next placements see it (the first
            // batch's are placed on loads `transmit_all` refreshed just before).
            if budget < TX_BUDGET * TX_BATCH {
                self.report_load(chan);
            }
            // Gather the next batch. A whole chunk (its header written in the room in
            // front of its payload) goes as it is, without a copy, when it is large or
            // alone: a lone small message (a request, a response) then costs no
            // allocation here. Small chunks that have company are copied into one batch.
            buf.clear();
            let mut gathered = 0;
            let mut alone: Option<Bytes> = None;
            while gathered < TX_BATCH {
                if alone.is_some() && !self.ep.has_transmit(id) {
                    break;
                }
                if let Some(first) = alone.take() {
                    buf.extend_from_slice(&first);
                }
                let before = buf.len();
                let Some(payload) = self.ep.poll_transmit_parts(id, buf) else {
                    break;
                };
                let whole = buf.len() == before;
                if whole {
                    gathered += payload.len();
                    if payload.len() > WHOLE_INLINE {
                        if !buf.is_empty() {
                            push(&mut tx, chan, take_batch(buf));
                        }
                        push(&mut tx, chan, payload);
                    } else if buf.is_empty() {
                        alone = Some(payload);
                    } else {
                        buf.extend_from_slice(&payload);
                    }
                    continue;
                }
                if payload.len() <= INLINE_PAYLOAD {
                    buf.extend_from_slice(&payload);
                    gathered += HEADER_LEN + payload.len();
                    continue;
                }
                gathered += HEADER_LEN + payload.len();
                push(&mut tx, chan, take_batch(buf));
                push(&mut tx, chan, payload);
            }
            if let Some(first) = alone {
                push(&mut tx, chan, first);
            } else if !buf.is_empty() {
                push(&mut tx, chan, take_batch(buf));
            }
            if gathered == 0 {
                break;
            }
            budget = budget.saturating_sub(gathered);
        }
        if !tx.pending.is_empty() {
            self.left_pending.insert(id);
        }
        drop(tx);
        self.report_load(chan);
        Ok(more)
    }

    /// Tells the endpoint how much the channel holds (its queue and the batches it
    /// refused).
    fn report_load(&mut self, chan: &Chan) {
        let stats = chan.t.stats();
        let pending = chan.tx_pending_bytes.load(Ordering::Relaxed);
        let load = ChannelLoad {
            queued_bytes: (stats.tx_queued + pending) as u64,
            in_flight_bytes: stats.tx_tcp_queued as u64,
            cwnd_bytes: stats.cwnd as u64,
            srtt: stats.srtt,
            retransmitted_segments: stats.retransmitted_segments,
            sent_bytes: stats.bytes_sent,
        };
        if load.queued_bytes == 0 && load.in_flight_bytes == 0 {
            self.idle.insert(chan.id);
        } else {
            self.idle.remove(&chan.id);
        }
        let _ = self.ep.set_channel_load(chan.id, load);
    }

    /// Forgets a channel the endpoint has let go.
    pub(crate) fn forget_channel(&mut self, id: ChannelId) {
        self.idle.remove(&id);
    }

    /// Turns endpoint events into wake-ups; returns whether a paused channel resumed.
    pub(crate) fn drain_events(&mut self, wake: &mut super::driver::Wakes) -> bool {
        let mut unpaused = false;
        while let Some(e) = self.ep.poll_events() {
            match e {
                Event::Incoming { port } => {
                    if let Some(w) = self.listeners.get_mut(&port).and_then(Option::take) {
                        wake.push(w);
                    }
                }
                Event::Connected(s)
                | Event::Readable(s)
                | Event::Writable(s)
                | Event::Failed(s) => {
                    if let Some(sw) = self.socks.get_mut(&s) {
                        wake.extend(sw.read.take());
                        wake.extend(sw.write.take());
                    }
                }
                Event::ChannelUnpaused(_) => unpaused = true,
            }
        }
        unpaused
    }

    /// Fails connects past their deadline and runs the endpoint's timers; returns the next
    /// deadline.
    pub(crate) fn expire(
        &mut self,
        now: Instant,
        wake: &mut super::driver::Wakes,
    ) -> Option<Instant> {
        let mut next = None;
        let mut expired = Vec::new();
        for (&sid, &d) in &self.deadlines {
            if d <= now {
                expired.push(sid);
            } else {
                next = Some(next.map_or(d, |n: Instant| n.min(d)));
            }
        }
        for sid in expired {
            self.deadlines.remove(&sid);
            if self.ep.is_connected(sid) {
                continue;
            }
            if let Some(sw) = self.socks.get_mut(&sid) {
                debug!(socket = %sid, "connect timed out");
                sw.timed_out = true;
                wake.extend(sw.read.take());
                wake.extend(sw.write.take());
                self.ep.reset(sid);
            }
        }
        // The endpoint's own timers (closed sockets lingering for a FIN). A socket reset
        // there queued a RESET: run another round at once to send it.
        let reaped = self.ep.counters().linger_expired;
        self.ep.handle_timeout(now);
        if self.ep.counters().linger_expired != reaped {
            next = Some(now);
        }
        if let Some(d) = self.ep.poll_timeout() {
            next = Some(next.map_or(d, |n: Instant| n.min(d)));
        }
        next
    }

    /// The socket moved `bytes` (0: nothing, not counted): counts it as active
    /// ([`LightLoad`]).
    pub(crate) fn note_active(&mut self, sid: SocketId, bytes: usize) {
        if bytes == 0 {
            return;
        }
        if let Some(w) = self.socks.get_mut(&sid) {
            self.load.note_active(&mut w.active_period);
        }
    }

    /// Registers a socket created by `connect` or `accept`.
    pub(crate) fn track(&mut self, sid: SocketId) {
        self.socks.entry(sid).or_default();
    }

    /// Releases a socket whose handle is gone: closes it (`Endpoint::close`), or with
    /// `abort` resets it.
    pub(crate) fn release(&mut self, sid: SocketId, abort: bool) {
        self.socks.remove(&sid);
        self.deadlines.remove(&sid);
        if abort {
            self.ep.reset(sid);
        } else {
            self.ep.close(sid);
        }
    }

    /// Wakes every task waiting on this shard's sockets and listeners.
    pub(crate) fn wake_all(&mut self, wake: &mut super::driver::Wakes) {
        for s in self.socks.values_mut() {
            wake.extend(s.read.take());
            wake.extend(s.write.take());
        }
        for l in self.listeners.values_mut() {
            wake.extend(l.take());
        }
    }
}

fn push(tx: &mut ChanTx, chan: &Chan, b: Bytes) {
    tx.push(b, &chan.tx_pending_bytes);
}

/// The gathered batch as `Bytes`: small ones are copied (the buffer is kept), larger ones
/// handed over.
fn take_batch(buf: &mut Vec<u8>) -> Bytes {
    if buf.len() <= SMALL_BATCH {
        let b = Bytes::copy_from_slice(buf);
        buf.clear();
        b
    } else {
        Bytes::from(std::mem::replace(buf, Vec::with_capacity(SMALL_BATCH)))
    }
}

#[cfg(test)]
mod tests {
    use super::{auto_light_load_streams, LightLoad, ShardSet, MAX_SHARDS};

    /// A set yields its members once each, lowest first, the highest shard included.
    #[test]
    fn shard_set_yields_its_members_in_order() {
        let mut s = ShardSet::default();
        assert_eq!(s.iter().count(), 0);
        for i in [MAX_SHARDS - 1, 0, 5, 5, 17] {
            s.insert(i);
        }
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 5, 17, MAX_SHARDS - 1]);
    }

    /// The bound a stack takes by default: none where its live channel threads are at
    /// least as many as the cores (they cannot run beside the application), the default
    /// bound where they have cores to spare or where there are no channel threads.
    #[test]
    fn the_default_bound_follows_channel_threads_and_cores() {
        use super::super::DEFAULT_LIGHT_LOAD_STREAMS as D;
        assert_eq!(
            auto_light_load_streams(Some(2), 2),
            usize::MAX,
            "2-core bed"
        );
        assert_eq!(auto_light_load_streams(Some(4), 2), usize::MAX);
        assert_eq!(auto_light_load_streams(Some(1), 1), usize::MAX);
        assert_eq!(auto_light_load_streams(Some(2), 16), D, "cores to spare");
        assert_eq!(auto_light_load_streams(Some(15), 16), D);
        assert_eq!(auto_light_load_streams(Some(16), 16), usize::MAX);
        assert_eq!(auto_light_load_streams(None, 2), D, "no channel threads");
        assert_eq!(auto_light_load_streams(Some(0), 2), D, "every thread dead");
    }

    /// A host-chosen bound is chosen again as threads come and go; a user's bound, given
    /// at build or later, is never replaced.
    #[test]
    fn a_users_bound_is_kept_and_a_chosen_one_follows_the_threads() {
        use super::super::DEFAULT_LIGHT_LOAD_STREAMS as D;
        let auto = LightLoad::new(None);
        assert_eq!(auto.max(), D, "before the first choice");
        assert_eq!(auto.retune(Some(2), 2), usize::MAX);
        let mut s = 0u64;
        for n in 0..1000 {
            auto.note_active_in(1, &mut s);
            s = n;
        }
        assert!(auto.is_light(), "unbounded: light whatever the load");
        assert_eq!(auto.retune(Some(2), 16), D, "threads added cores");
        assert!(!auto.is_light(), "1000 active streams over a bound of {D}");
        auto.set_max(3);
        assert_eq!(auto.retune(Some(2), 2), 3, "set by the user: kept");
        let user = LightLoad::new(Some(5));
        assert_eq!(user.retune(Some(2), 2), 5);
        assert_eq!(user.retune(None, 1), 5);
    }

    /// Each stream counts once per period; the figure is the larger of the current and
    /// the previous period's counts, so it falls one period after the load does and
    /// rises at once; a gap of idle periods forgets the old count.
    #[test]
    fn active_streams_are_counted_per_period() {
        let load = LightLoad::new(Some(2));
        let mut s = [0u64; 4];
        assert!(load.is_light(), "no activity yet");
        load.note_active_in(1, &mut s[0]);
        load.note_active_in(1, &mut s[0]);
        load.note_active_in(1, &mut s[1]);
        assert_eq!(
            load.active_streams(),
            2,
            "a stream counted twice in one period"
        );
        assert!(load.is_light());
        load.note_active_in(1, &mut s[2]);
        assert_eq!(load.active_streams(), 3);
        assert!(!load.is_light(), "3 active streams over a bound of 2");
        // Next period: one stream so far, the previous period's 3 still hold.
        load.note_active_in(2, &mut s[0]);
        assert_eq!(load.active_streams(), 3);
        assert!(!load.is_light());
        // The period after: the previous one had 1.
        load.note_active_in(3, &mut s[3]);
        assert_eq!(load.active_streams(), 1);
        assert!(load.is_light());
        // A busy period, then a gap of idle ones: the old count is forgotten.
        for (i, last) in s.iter_mut().enumerate() {
            load.note_active_in(4, last);
            assert_eq!(load.active_streams(), (i + 1).max(1));
        }
        load.note_active_in(9, &mut s[0]);
        assert_eq!(load.active_streams(), 1);
        // A bound of 0 turns the light path off whatever the count.
        load.set_max(0);
        assert!(!load.is_light());
    }
}
