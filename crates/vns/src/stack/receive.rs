//! The receive path: each channel's sink ([`ChanSink`], a netdriver [`RxSink`]), which
//! the queue driver that runs the channel hands its received bytes to from inside its
//! round. The sink deframes them, hands every chunk to the shard that owns its socket,
//! finishes the shards it touched (their output, such as credit updates, to the channels;
//! their events to the tasks) and wakes the sockets' tasks: no other thread or task
//! between the wire and the reader.
//!
//! The sink is owned by the queue driver (a channel's bytes are read by one driver at a
//! time), so its deframer needs no lock. Lock order: the queue's state (held by the
//! driver around the sink) → shard → channel transmit; nothing takes a queue's state
//! while holding a shard.

use std::sync::{Arc, MutexGuard, Weak};

use bytes::Bytes;
use netdriver::channel::{ChannelError, RxFlow, RxSink};
use netsched::ChannelId;
use tracing::{debug, warn};

use super::channel::Gone;
use super::core::{Core, Finish};
use super::shard::Shard;
use crate::deframer::{Chunk, Deframer};
use crate::endpoint::ChannelError as EpChannelError;

/// Chunk buffers a channel's deframer keeps for reuse (refilled from the shards'
/// endpoints, which collect them as the application reads).
const RX_SPARE: usize = 8;

/// One channel's receive side, owned by its queue driver. See the
/// [module documentation](self).
pub(crate) struct ChanSink {
    core: Weak<Core>,
    id: ChannelId,
    deframer: Deframer,
    spare: Vec<Vec<u8>>,
    /// Bytes taken from the channel and not yet deframed: the rest of a batch whose
    /// delivery paused.
    pending: Option<Bytes>,
    /// The shard whose endpoint holds a chunk of this channel it could not park within
    /// its budgets: nothing more is delivered until that endpoint unpauses the channel.
    stalled_in: Option<usize>,
}

impl ChanSink {
    /// The sink of channel `id`; `leftover`: bytes that came with the channel's
    /// handshake, delivered before anything else.
    pub(crate) fn new(
        core: Weak<Core>,
        id: ChannelId,
        max_chunk_payload: usize,
        leftover: Option<Bytes>,
    ) -> ChanSink {
        ChanSink {
            core,
            id,
            deframer: Deframer::new(max_chunk_payload),
            spare: Vec::new(),
            pending: leftover,
            stalled_in: None,
        }
    }

    /// Delivers `bytes` (after what is pending), finishing the touched shards and waking
    /// their tasks once every lock is released.
    fn deliver_bytes(&mut self, core: &Core, bytes: Input<'_>) -> RxFlow {
        let mut fin = Finish::default();
        let flow = match self.deliver(core, bytes, &mut fin) {
            Ok(flow) => flow,
            Err(why) => {
                if core.mark_dead(self.id, why) {
                    fin.control = true;
                }
                // Nothing more is taken from a dead channel; the control task drops it.
                RxFlow::Pause
            }
        };
        fin.run(core);
        flow
    }

    fn deliver(&mut self, core: &Core, bytes: Input<'_>, fin: &mut Finish) -> Result<RxFlow, Gone> {
        let table = core.chans.load();
        let mut items = [self.pending.take().map_or(Input::None, Input::Bytes), bytes];
        for k in 0..items.len() {
            let item = std::mem::replace(&mut items[k], Input::None);
            let b = item.as_slice();
            if b.is_empty() {
                continue;
            }
            // The shard last handed a chunk, kept locked while the chunks of this batch go
            // to it (one lock for a batch of one socket's chunks).
            let mut held: Option<(usize, MutexGuard<'_, Shard>)> = None;
            let mut off = 0;
            while off < b.len() {
                let (used, chunk) = match self.deframer.feed_pooled(&b[off..], &mut self.spare) {
                    Ok(r) => r,
                    Err(e) => {
                        // A peer can open channels and send garbage at line rate.
                        static BAD_BYTES: netdriver::log_limit::LogLimit =
                            netdriver::log_limit::LogLimit::new(5);
                        if let Some(suppressed) = BAD_BYTES.check() {
                            warn!(channel = %self.id, error = %e, suppressed, "bad bytes on a channel; dropping it");
                        }
                        if let Some((_, s)) = held.take() {
                            core.finish_shard(s, fin, &table);
                        }
                        return Err(Gone::Lost);
                    }
                };
                off += used;
                let Some(chunk) = chunk else {
                    continue;
                };
                let j = core.shard_for_ports(chunk.header.dst_port, chunk.header.src_port);
                if held.as_ref().is_none_or(|(i, _)| *i != j) {
                    // Let the last shard go before taking the next (one at a time).
                    if let Some((_, s)) = held.take() {
                        core.finish_shard(s, fin, &table);
                    }
                    held = Some((j, core.lock_shard(j)));
                }
                let (_, shard) = held.as_mut().expect("just set");
                let paused = match hand(self.id, shard, chunk) {
                    Ok(p) => p,
                    Err(why) => {
                        if let Some((_, s)) = held.take() {
                            core.finish_shard(s, fin, &table);
                        }
                        return Err(why);
                    }
                };
                if self.spare.len() < RX_SPARE / 2 {
                    let want = RX_SPARE - self.spare.len();
                    shard.ep.take_spare_buffers(&mut self.spare, want);
                }
                if paused {
                    debug!(channel = %self.id, shard = j, "channel reads paused");
                    self.stalled_in = Some(j);
                    // Kept, in order: this batch's rest, then whatever came after it.
                    let mut keep = item.rest(off);
                    for later in &items[k + 1..] {
                        keep = join(keep, later.as_slice());
                    }
                    self.pending = (!keep.is_empty()).then_some(keep);
                    if let Some((_, s)) = held.take() {
                        core.finish_shard(s, fin, &table);
                    }
                    return Ok(RxFlow::Pause);
                }
            }
            if let Some((_, s)) = held.take() {
                core.finish_shard(s, fin, &table);
            }
        }
        Ok(RxFlow::Continue)
    }
}

impl RxSink for ChanSink {
    fn on_bytes(&mut self, bytes: Bytes) -> RxFlow {
        let Some(core) = self.core.upgrade() else {
            return RxFlow::Pause;
        };
        let flow = self.deliver_bytes(&core, Input::Bytes(bytes));
        release(core);
        flow
    }

    /// Deframes straight out of the channel's TCP receive buffer: the payload of each
    /// chunk is copied once, into the chunk's buffer, instead of into a `Bytes` first.
    fn reads_in_place(&self) -> bool {
        true
    }

    fn on_slice(&mut self, bytes: &[u8]) -> RxFlow {
        if self.stalled_in.is_some() {
            // Paused (the second slice of a read that paused on its first): kept behind
            // what is pending, for `resume`.
            let keep = join(self.pending.take().unwrap_or_default(), bytes);
            self.pending = (!keep.is_empty()).then_some(keep);
            return RxFlow::Pause;
        }
        let Some(core) = self.core.upgrade() else {
            return RxFlow::Pause;
        };
        let flow = self.deliver_bytes(&core, Input::Slice(bytes));
        release(core);
        flow
    }

    fn resume(&mut self) -> RxFlow {
        let Some(core) = self.core.upgrade() else {
            return RxFlow::Pause;
        };
        if let Some(j) = self.stalled_in {
            if core.lock_shard(j).ep.should_pause_channel_reads(self.id) {
                release(core);
                return RxFlow::Pause;
            }
            debug!(channel = %self.id, "channel reads resume");
            self.stalled_in = None;
        }
        let flow = self.deliver_bytes(&core, Input::None);
        release(core);
        flow
    }

    fn on_end(&mut self, end: Result<(), ChannelError>) {
        let Some(core) = self.core.upgrade() else {
            return;
        };
        let why = match &end {
            Ok(()) => {
                debug!(channel = %self.id, "channel closed by the peer");
                Gone::Closed
            }
            Err(e) => {
                debug!(channel = %self.id, error = %e, "channel failed");
                Gone::of(e)
            }
        };
        if core.mark_dead(self.id, why) {
            core.control.notify();
        }
        release(core);
    }

    fn on_tx_room(&mut self) {
        let Some(core) = self.core.upgrade() else {
            return;
        };
        core.on_tx_room(self.id);
        release(core);
    }
}

/// Lets go of the core from a queue driver's round. When the stack was dropped meanwhile
/// this may be the last handle, whose drop stops the channel set and waits for the queue
/// this round belongs to: it is dropped on a thread of its own instead.
fn release(core: Arc<Core>) {
    if let Some(last) = Arc::into_inner(core) {
        let _ = std::thread::Builder::new()
            .name("vns-drop".into())
            .spawn(move || drop(last));
    }
}

/// Bytes handed to the sink: kept `Bytes` (what a pause left, bytes the channel's Rx
/// queue held) or a slice lent by TCP's receive buffer.
enum Input<'a> {
    None,
    Bytes(Bytes),
    Slice(&'a [u8]),
}

impl Input<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Input::None => &[],
            Input::Bytes(b) => b,
            Input::Slice(s) => s,
        }
    }

    /// What follows the first `off` bytes, to keep: shared for `Bytes`, copied out of a
    /// lent slice.
    fn rest(&self, off: usize) -> Bytes {
        match self {
            Input::None => Bytes::new(),
            Input::Bytes(b) => b.slice(off..),
            Input::Slice(s) => Bytes::copy_from_slice(&s[off..]),
        }
    }
}

/// `a` followed by `b`, in one buffer.
fn join(a: Bytes, b: &[u8]) -> Bytes {
    if b.is_empty() {
        return a;
    }
    if a.is_empty() {
        return Bytes::copy_from_slice(b);
    }
    let mut v = Vec::with_capacity(a.len() + b.len());
    v.extend_from_slice(&a);
    v.extend_from_slice(b);
    Bytes::from(v)
}

/// Hands a chunk to its shard's endpoint; returns whether the channel's reads pause.
fn hand(id: ChannelId, shard: &mut Shard, chunk: Chunk) -> Result<bool, Gone> {
    match shard.ep.handle_chunk(id, chunk) {
        Ok(paused) => Ok(paused),
        // The shard has let the channel go (the control task is dropping it).
        Err((EpChannelError::UnknownChannel(_), _)) => Err(Gone::Lost),
        // Not expected: reads stop at the first pause. Treated as one: the chunk is
        // dropped with the channel's loss, and the peer sends it again.
        Err((e, _)) => {
            warn!(channel = %id, error = %e, "chunk refused by its shard; dropping the channel");
            Err(Gone::Lost)
        }
    }
}
