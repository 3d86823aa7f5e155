//! The stack's channels as its data path shares them, and the receive path: reading each
//! channel's byte stream once, deframing it, and handing every chunk to the shard that
//! owns its socket.
//!
//! A channel carries chunks of sockets of every shard, so its two directions have locks
//! of their own, apart from the shards': [`Chan::rx`] is held by whoever reads the
//! channel (a reader task pulling, the driver), [`Chan::tx`] by whoever moves a shard's
//! output into it (so that one shard's chunk, header and payload, is never split by
//! another's). The table of channels ([`ChanTable`]) is read without a lock
//! (`arc_swap`) and replaced by the driver, under the control lock, when a channel comes
//! or goes.
//!
//! Lock order (`docs/architecture.md`, "Threads and locking"): control → shard →
//! channel tx; channel rx → shard → channel tx. Nothing takes a channel's rx lock while
//! holding a shard's, or the control lock while holding either.

use std::collections::{BTreeMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};

use crossbeam_utils::CachePadded;

use bytes::Bytes;
use netsched::{ChannelClass, ChannelId};
use tracing::{debug, warn};

use super::backend::BoxedTransport;
use super::driver::{Core, Gone, RxScope, RxSignal};
use super::shard::{Shard, ShardSet};
use crate::deframer::{Chunk, Deframer};
use crate::endpoint::ChannelError;

/// Chunk buffers a channel's deframer keeps for reuse (refilled from the shards'
/// endpoints, which collect them as the application reads).
const RX_SPARE: usize = 8;

/// Byte batches read from one channel per pass (fairness between channels and with the
/// shards' application calls).
const RX_BUDGET: usize = 64;

/// One channel of the stack, shared by the driver and the data path of every shard.
pub(crate) struct Chan {
    pub(crate) id: ChannelId,
    pub(crate) t: BoxedTransport,
    pub(crate) peer: Ipv4Addr,
    pub(crate) class: ChannelClass,
    // The two locks and the counter each have a cache line of their own: readers and
    // writers on other cores take them at once, and a line shared by them made every
    // `Shard::transmit_all` pay for the receive side's traffic (16-core profile,
    // docs/performance.md).
    pub(crate) rx: CachePadded<Mutex<ChanRx>>,
    pub(crate) tx: CachePadded<Mutex<ChanTx>>,
    /// Bytes of the batches in `tx` the channel refused (full), readable without its
    /// lock.
    pub(crate) tx_pending_bytes: CachePadded<AtomicUsize>,
    /// What the channel's transport wakes when bytes arrive: marks the channel ready and
    /// wakes one reader (see [`ChanRxWake`]).
    rx_wake: Arc<ChanRxWake>,
    /// [`Chan::rx_wake`] as a waker, built once.
    rx_waker: Waker,
    /// Found dead by a data-path call: `Gone` as a code, 0 while alive. The driver drops
    /// it from the table and tells the shards.
    dead: AtomicU8,
}

/// A channel's receive waker: arrivals mark the channel *ready*, then wake one reader
/// through the stack's [`RxSignal`]. A reader's pull ([`Core::pull`]) reads only ready
/// channels, so that readers woken by arrivals on different channels read those
/// channels at the same time instead of queueing on every channel's lock in turn (which
/// kept a stack's receive path to one thread whatever its number of channels). The
/// driver's rounds still read every channel.
///
/// Called by the channel thread of an AF_XDP channel right after it queued the bytes
/// (`netdriver::channel::on_channel_thread_rx`), it reads the channel itself instead
/// ([`Core::pull_here`]): one wake-up per arrival (of the socket's task) instead of two.
pub(crate) struct ChanRxWake {
    ready: AtomicBool,
    rx: Arc<RxSignal>,
    core: Weak<Core>,
    /// The channel is of the latency class: its arrivals wake (and are pulled by) that
    /// class's readers where the classes are kept apart ([`RxSignal`]).
    latency: bool,
}

thread_local! {
    /// This thread is in a pull ([`Core::pull`], [`Core::pull_here`]) now: a receive
    /// waker it calls must not start another (see [`ChanRxWake`]'s wake).
    static PULLING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as pulling until dropped (see [`PULLING`]).
pub(crate) struct PullMark(bool);

impl PullMark {
    pub(crate) fn set() -> PullMark {
        PullMark(PULLING.with(|p| p.replace(true)))
    }
}

impl Drop for PullMark {
    fn drop(&mut self) {
        let was = self.0;
        PULLING.with(|p| p.set(was));
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: this thread counts as a channel thread in its receive step, so that the
    /// in-memory channels (which call the peer's waker from the sender's thread) run
    /// [`Core::pull_here`] as an AF_XDP channel thread would.
    pub(crate) static TEST_CHANNEL_THREAD: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

/// Whether a channel's receive waker runs on a channel thread's receive step
/// (`netdriver::channel::on_channel_thread_rx`).
fn on_channel_thread() -> bool {
    #[cfg(test)]
    if TEST_CHANNEL_THREAD.with(|t| t.get()) {
        return true;
    }
    #[cfg(target_os = "linux")]
    return netdriver::channel::on_channel_thread_rx();
    #[cfg(not(target_os = "linux"))]
    false
}

impl ChanRxWake {
    /// A channel's receive waker: wakes readers through `rx`, and reads on the channel
    /// thread through `core` (`Weak::new()`: never).
    pub(crate) fn new(rx: Arc<RxSignal>, core: Weak<Core>, class: ChannelClass) -> Arc<ChanRxWake> {
        // Ready from the start: what came with the preamble waits, and no waker is
        // registered with the transport before the first read.
        rx.ready_chans.fetch_add(1, Ordering::SeqCst);
        Arc::new(ChanRxWake {
            ready: AtomicBool::new(true),
            rx,
            core,
            latency: class == ChannelClass::Latency,
        })
    }
}

impl ChanRxWake {
    /// Takes the channel's ready mark (a read of it follows), keeping the stack's count of
    /// marked channels.
    pub(crate) fn take_ready(&self) -> bool {
        let ready = self.ready.swap(false, Ordering::SeqCst);
        if ready {
            self.rx.ready_chans.fetch_sub(1, Ordering::SeqCst);
        }
        ready
    }
}

impl Drop for ChanRxWake {
    fn drop(&mut self) {
        // A channel gone with its mark set leaves the count.
        if *self.ready.get_mut() {
            self.rx.ready_chans.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Wake for ChanRxWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Before the reader's wake-up, so that the reader sees it.
        if !self.ready.swap(true, Ordering::SeqCst) {
            self.rx.ready_chans.fetch_add(1, Ordering::SeqCst);
        }
        // Never while this thread is already pulling: a waker can be called back from
        // inside the pull, with its locks held (the transport's `AtomicWaker::register`
        // wakes the new waker at once when an arrival raced the registration, and a
        // channel failing mid-transmit wakes its reader), and a second pull there would
        // wait for a lock this thread holds. That deadlocked the 16-core bench within
        // seconds; the readers' path below takes such an arrival instead.
        if on_channel_thread() && !PULLING.with(|p| p.get()) {
            if let Some(core) = self.core.upgrade() {
                // This channel's class only, where the classes are kept apart: a latency
                // channel's thread does not read bulk channels.
                core.pull_here(self.rx.scope(self.latency));
                // The stack may have gone meanwhile, leaving this the last handle: its
                // channel set would then stop here, joining this very thread.
                if let Some(last) = Arc::into_inner(core) {
                    let _ = std::thread::Builder::new()
                        .name("vns-drop".into())
                        .spawn(move || drop(last));
                }
                return;
            }
        }
        self.rx.arrival(self.latency);
    }
}

/// The receive side of a channel.
pub(crate) struct ChanRx {
    /// Bytes dequeued and not yet deframed: the rest of a batch whose reads paused, or
    /// what followed the preamble.
    pub(crate) pending: Option<Bytes>,
    deframer: Deframer,
    spare: Vec<Vec<u8>>,
    /// The shard whose endpoint holds a chunk of this channel it could not park within
    /// its budgets: the channel is not read until that endpoint unpauses it.
    stalled_in: Option<usize>,
}

/// The transmit side of a channel: batches it refused (full), sent before anything new.
#[derive(Default)]
pub(crate) struct ChanTx {
    pub(crate) pending: VecDeque<Bytes>,
}

/// The stack's channels by id.
pub(crate) type ChanTable = BTreeMap<ChannelId, Arc<Chan>>;

impl Chan {
    pub(crate) fn new(
        id: ChannelId,
        t: BoxedTransport,
        peer: Ipv4Addr,
        class: ChannelClass,
        max_chunk_payload: usize,
        leftover: Option<Bytes>,
        rx_wake: Arc<ChanRxWake>,
    ) -> Chan {
        Chan {
            id,
            t,
            peer,
            class,
            rx: CachePadded::new(Mutex::new(ChanRx {
                pending: leftover,
                deframer: Deframer::new(max_chunk_payload),
                spare: Vec::new(),
                stalled_in: None,
            })),
            tx: CachePadded::new(Mutex::new(ChanTx::default())),
            tx_pending_bytes: CachePadded::new(AtomicUsize::new(0)),
            rx_waker: Waker::from(rx_wake.clone()),
            rx_wake,
            dead: AtomicU8::new(0),
        }
    }

    pub(crate) fn lock_tx(&self) -> MutexGuard<'_, ChanTx> {
        self.tx.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The tx lock if nobody holds it now.
    pub(crate) fn try_lock_tx(&self) -> Option<MutexGuard<'_, ChanTx>> {
        match self.tx.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    fn lock_rx(&self) -> MutexGuard<'_, ChanRx> {
        self.rx.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the channel is dead (the first reason found wins).
    pub(crate) fn mark_dead(&self, why: Gone) {
        let _ = self
            .dead
            .compare_exchange(0, why.code(), Ordering::AcqRel, Ordering::Acquire);
    }

    /// Why the channel is dead, if a data-path call found it so.
    pub(crate) fn dead(&self) -> Option<Gone> {
        Gone::from_code(self.dead.load(Ordering::Acquire))
    }
}

impl ChanTx {
    /// Keeps a batch the channel could not take now (after those it refused before).
    pub(crate) fn push(&mut self, b: Bytes, bytes: &AtomicUsize) {
        if !b.is_empty() {
            bytes.fetch_add(b.len(), Ordering::Relaxed);
            self.pending.push_back(b);
        }
    }
}

/// What a pass over the channels' received bytes did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Received {
    /// Some channel had bytes.
    pub(crate) any: bool,
    /// Work is left over: a channel's budget was used up, or a channel died.
    pub(crate) more: bool,
}

/// Which channels a pass over the received bytes reads ([`Core::receive_all`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// Every channel (the driver's rounds: they also resume paused channels and catch
    /// what a reader left over).
    Every,
    /// Only channels marked ready by an arrival (a reader's pull, a channel thread's),
    /// of the scope's class: the mark is set before the waker runs, so a pull woken by an
    /// arrival reads that arrival's channel.
    Ready(RxScope),
}

impl Core {
    /// Reads the channels' received bytes (which channels: `sweep`), deframes them and
    /// hands each chunk to its socket's shard; `touched` collects the shards that were
    /// handed chunks (the caller finishes them: their output to the channels, their
    /// events to the tasks).
    pub(crate) fn receive_all(&self, sweep: Sweep, touched: &mut ShardSet) -> Received {
        let table = self.chans.load();
        let mut r = Received::default();
        for chan in table.values() {
            if chan.dead().is_some() {
                continue;
            }
            // Cleared before the read: an arrival from now on marks it again. A pull of
            // the ready channels first only loads the flag: most channels are not
            // ready, and a load leaves the flag's cache line shared where a swap would
            // take it from the core that set it (every pull used to swap every flag).
            if let Sweep::Ready(scope) = sweep {
                if !scope.covers(chan.class) || !chan.rx_wake.ready.load(Ordering::SeqCst) {
                    continue;
                }
            }
            let ready = chan.rx_wake.take_ready();
            if matches!(sweep, Sweep::Ready(_)) && !ready {
                continue;
            }
            // A channel another thread is reading is waited for, not skipped: that
            // thread may be past its last look at the channel's queue (its waker
            // registered and already spent on the arrival that brought this caller),
            // and only a read after its unlock is sure to see those bytes.
            let mut rx = chan.lock_rx();
            let mut cx = Context::from_waker(&chan.rx_waker);
            match self.receive(chan, &mut rx, &mut cx, touched) {
                Ok((any, more)) => {
                    r.any |= any;
                    r.more |= more;
                }
                Err(why) => {
                    chan.mark_dead(why);
                    r.more = true;
                }
            }
        }
        r
    }

    /// Reads one channel (its rx lock held): returns whether it had bytes and whether
    /// its budget ran out. `Err` when the channel is gone.
    fn receive(
        &self,
        chan: &Chan,
        rx: &mut ChanRx,
        cx: &mut Context<'_>,
        touched: &mut ShardSet,
    ) -> Result<(bool, bool), Gone> {
        if let Some(j) = rx.stalled_in {
            if self.lock_shard(j).ep.should_pause_channel_reads(chan.id) {
                return Ok((false, false));
            }
            debug!(channel = %chan.id, "channel reads resume");
            rx.stalled_in = None;
        }
        let mut any = false;
        for _ in 0..RX_BUDGET {
            let bytes = match rx.pending.take() {
                Some(b) => b,
                None => match chan.t.poll_dequeue(cx) {
                    Poll::Ready(Ok(Some(b))) => b,
                    Poll::Ready(Ok(None)) => {
                        debug!(channel = %chan.id, "channel closed by the peer");
                        return Err(Gone::Closed);
                    }
                    Poll::Ready(Err(e)) => {
                        debug!(channel = %chan.id, error = %e, "channel failed");
                        return Err(Gone::of(&e));
                    }
                    Poll::Pending => return Ok((any, false)),
                },
            };
            any = true;
            // The shard last handed a chunk, kept locked while the chunks of this batch
            // go to it (one lock for a batch of one socket's chunks).
            let mut held: Option<(usize, MutexGuard<'_, Shard>)> = None;
            let mut off = 0;
            while off < bytes.len() {
                let (used, chunk) = match rx.deframer.feed_pooled(&bytes[off..], &mut rx.spare) {
                    Ok(r) => r,
                    Err(e) => {
                        // A peer can open channels and send garbage at line rate.
                        static BAD_BYTES: netdriver::log_limit::LogLimit =
                            netdriver::log_limit::LogLimit::new(5);
                        if let Some(suppressed) = BAD_BYTES.check() {
                            warn!(channel = %chan.id, error = %e, suppressed, "bad bytes on a channel; dropping it");
                        }
                        return Err(Gone::Lost);
                    }
                };
                off += used;
                let Some(chunk) = chunk else {
                    continue;
                };
                let j = self.shard_for_ports(chunk.header.dst_port, chunk.header.src_port);
                if held.as_ref().is_none_or(|(i, _)| *i != j) {
                    // Let the last shard go before taking the next (one at a time).
                    drop(held.take());
                    held = Some((j, self.lock_shard(j)));
                }
                let (_, shard) = held.as_mut().expect("just set");
                touched.insert(j);
                if deliver(chan.id, shard, chunk)? {
                    debug!(channel = %chan.id, shard = j, "channel reads paused");
                    rx.stalled_in = Some(j);
                    if off < bytes.len() {
                        rx.pending = Some(bytes.slice(off..));
                    }
                    return Ok((any, false));
                }
                if rx.spare.len() < RX_SPARE / 2 {
                    let want = RX_SPARE - rx.spare.len();
                    shard.ep.take_spare_buffers(&mut rx.spare, want);
                }
            }
        }
        Ok((any, true))
    }
}

/// Hands a chunk to its shard's endpoint; returns whether the channel's reads pause.
fn deliver(id: ChannelId, shard: &mut Shard, chunk: Chunk) -> Result<bool, Gone> {
    match shard.ep.handle_chunk(id, chunk) {
        Ok(paused) => Ok(paused),
        // The shard has let the channel go (the driver is dropping it).
        Err((ChannelError::UnknownChannel(_), _)) => Err(Gone::Lost),
        // Not expected: reads stop at the first pause. Treated as one: the chunk is
        // dropped with the channel's loss, and the peer sends it again.
        Err((e, _)) => {
            warn!(channel = %id, error = %e, "chunk refused by its shard; dropping the channel");
            Err(Gone::Lost)
        }
    }
}
