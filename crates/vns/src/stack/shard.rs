//! A shard of the stack: one [`Endpoint`] owning the sockets whose ports map to it
//! ([`ShardOf`](crate::ShardOf)), the wakers of the tasks waiting on them, and the moving
//! of its output into the channels.
//!
//! A stack runs several shards (`StackBuilder::shards`), each behind its own lock, so that
//! calls on sockets of different shards never wait for each other: an application call
//! locks its socket's shard only, and a channel's received chunks are handed to each
//! chunk's shard in turn (`receive.rs`). Every shard's endpoint knows every channel (the
//! control task adds and removes channels in all of them); each has its own scheduler
//! instance ([`NetScheduler::fork`](netsched::NetScheduler::fork)), outboxes and budgets.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::atomic::Ordering;
use std::task::Waker;
use std::time::Instant;

use bytes::Bytes;
use netdriver::channel::EnqueueError;
use netsched::ChannelId;
use tracing::debug;

use super::channel::{lost, Chan, ChanTable, ChanTx, Gone};
use super::wake::{SockWake, Wakes};
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

/// Most shards a stack runs (a set of them is a bit mask).
pub(crate) const MAX_SHARDS: usize = 64;

/// A set of shard indices.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShardSet(u64);

impl ShardSet {
    /// The set whose bit *i* is shard *i*.
    pub(crate) fn from_bits(bits: u64) -> ShardSet {
        ShardSet(bits)
    }

    #[cfg(test)]
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
    /// Place and send chunks, hand out events.
    Full,
}

/// Everything behind one shard's lock.
pub(crate) struct Shard {
    /// The shard's index (its bit in a channel's `waiting` set).
    pub(crate) index: usize,
    pub(crate) ep: Endpoint,
    // Keys this host assigns (socket ids, local ports): FxHash, see Cargo.toml.
    pub(crate) socks: FxHashMap<SocketId, SockWake>,
    pub(crate) listeners: FxHashMap<u16, Option<Waker>>,
    pub(crate) deadlines: BTreeMap<SocketId, Instant>,
    /// The stack has stopped: no channel will ever move again.
    pub(crate) stopped: bool,
    /// Channels whose last load reported to this shard's endpoint was zero. Only the
    /// stack enqueues into a channel, so without new chunks its load can only have fallen
    /// since: such a channel with nothing to send needs neither a visit nor a report.
    idle: FxHashSet<ChannelId>,
    /// Scratch space of [`Shard::transmit_all`]: the batch being gathered.
    tx_buf: Vec<u8>,
    /// Scratch space of [`Shard::transmit_all`]: the channels it visits.
    tx_visit: Vec<ChannelId>,
    /// Channels on which this shard's batches wait (refused, `ChanTx::pending`).
    left_pending: FxHashSet<ChannelId>,
}

impl Shard {
    pub(crate) fn new(index: usize, ep: Endpoint) -> Shard {
        Shard {
            index,
            ep,
            socks: FxHashMap::default(),
            listeners: FxHashMap::default(),
            deadlines: BTreeMap::new(),
            stopped: false,
            idle: FxHashSet::default(),
            tx_buf: Vec::with_capacity(SMALL_BATCH),
            tx_visit: Vec::new(),
            left_pending: FxHashSet::default(),
        }
    }

    /// Moves the endpoint's output into every channel it has output for, until the
    /// endpoint has no more or a channel refuses (full: the rest waits in the channel's
    /// `ChanTx`, and the channel's queue driver sends it when the channel has room,
    /// `Core::on_tx_room`). Returns whether a channel was found dead (the control task
    /// drops it).
    pub(crate) fn transmit_all(&mut self, table: &ChanTable) -> bool {
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
        // Most calls (every application call ends with one) find nothing to send: they
        // visit no channel, and the others only the channels with chunks (callgrind, one
        // connection's ping-pong: visiting every channel on every call, 9 calls and 40
        // load reads per request, was a quarter of the stack's instructions).
        let mut visit = std::mem::take(&mut self.tx_visit);
        self.ep.channels_with_transmit(&mut visit);
        if !self.left_pending.is_empty() {
            self.left_pending.retain(|id| {
                table
                    .get(id)
                    .is_some_and(|c| c.tx_pending_bytes.load(Ordering::Relaxed) != 0)
            });
        }
        let mut buf = std::mem::take(&mut self.tx_buf);
        let mut died = false;
        for id in &visit {
            let Some(chan) = table.get(id) else {
                continue;
            };
            if chan.dead().is_some() {
                continue;
            }
            if let Err(why) = self.transmit(chan, &mut buf) {
                died |= chan.mark_dead(why);
            }
        }
        self.tx_visit = visit;
        self.tx_buf = buf;
        died
    }

    /// [`transmit_all`](Self::transmit_all) for one channel that has room again (its
    /// queue driver's `on_tx_room`): what it refused before, then what this shard has
    /// for it. Returns whether the channel was found dead.
    pub(crate) fn transmit_to(&mut self, chan: &Chan) -> bool {
        if chan.dead().is_some() {
            return false;
        }
        let mut buf = std::mem::take(&mut self.tx_buf);
        let r = self.transmit(chan, &mut buf);
        self.tx_buf = buf;
        match r {
            Ok(()) => false,
            Err(why) => chan.mark_dead(why),
        }
    }

    /// What [`Core::finish_call`](super::core::Core::finish_call)'s pass over this shard
    /// has to do: nothing (the endpoint has no output or event,
    /// [`Endpoint::output_idle`](crate::Endpoint::output_idle)), only hand out events
    /// ([`Endpoint::transmit_idle`](crate::Endpoint::transmit_idle)), or the whole pass.
    pub(crate) fn finish_needed(&self) -> FinishNeeded {
        if !self.ep.transmit_idle() {
            return FinishNeeded::Full;
        }
        if self.ep.has_events() {
            FinishNeeded::Events
        } else {
            FinishNeeded::Nothing
        }
    }

    /// Reports every live channel's load to the endpoint, for a snapshot of the stack
    /// (`Diagnostics::stats`, the scheduler's plans): sending refreshes only what the
    /// scheduler reads when it places chunks.
    pub(crate) fn refresh_loads(&mut self, table: &ChanTable) {
        for chan in table.values() {
            if chan.dead().is_none() {
                self.report_load(chan);
            }
        }
    }

    /// Moves the endpoint's chunks for a channel into it, after the batches it refused
    /// before. `Err` when the channel is gone.
    ///
    /// Headers and small chunks are gathered into `buf` and enqueued as one `Bytes`; a
    /// large payload is enqueued as the `Bytes` the endpoint hands out (a reference to the
    /// socket's send-buffer segment), right after the batch holding its header: no copy.
    /// The channel's tx lock is held throughout, so that no other shard's chunk comes
    /// between a header and its payload. When the channel is full the rest waits in its
    /// `ChanTx` and the shard in its `waiting` set: the channel's queue driver sends it
    /// once there is room.
    fn transmit(&mut self, chan: &Chan, buf: &mut Vec<u8>) -> Result<(), Gone> {
        let id = chan.id;
        let mut tx = chan.lock_tx();
        let mut first = true;
        let mut marked = false;
        loop {
            // What the channel refused before goes first, in order.
            while let Some(b) = tx.pending.pop_front() {
                let n = b.len();
                match chan.t.enqueue(b) {
                    Ok(()) => {
                        chan.tx_pending_bytes.fetch_sub(n, Ordering::Relaxed);
                    }
                    Err(EnqueueError::Full(b)) => {
                        tx.pending.push_front(b);
                        if !marked {
                            // The channel's driver sends the rest when it has room. Marked
                            // first, then one more try: room that came before the mark is
                            // taken here, room that comes after it reaches the driver's
                            // `on_tx_room`, which finds the mark.
                            chan.wait_for_room(self.index);
                            marked = true;
                            continue;
                        }
                        self.left_pending.insert(id);
                        drop(tx);
                        self.report_load(chan);
                        return Ok(());
                    }
                    Err(EnqueueError::Closed(e)) => return lost(id, e).map(|_| ()),
                }
            }
            // After a batch went in, the scheduler's next placements see it (the first
            // batch's are placed on loads `transmit_all` refreshed just before).
            if !first {
                self.report_load(chan);
            }
            first = false;
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
            if gathered == 0 && tx.pending.is_empty() {
                break;
            }
        }
        drop(tx);
        self.report_load(chan);
        Ok(())
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

    /// Turns endpoint events into wake-ups, and channels whose paused reads may resume
    /// into `resume`.
    pub(crate) fn drain_events(
        &mut self,
        wake: &mut Wakes,
        resume: &mut super::wake::Few<ChannelId>,
    ) {
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
                Event::ChannelUnpaused(id) => resume.push(id),
            }
        }
    }

    /// Fails connects past their deadline and runs the endpoint's timers; returns the next
    /// deadline.
    pub(crate) fn expire(&mut self, now: Instant, wake: &mut Wakes) -> Option<Instant> {
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
    pub(crate) fn wake_all(&mut self, wake: &mut Wakes) {
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
    use super::{ShardSet, MAX_SHARDS};

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
}
