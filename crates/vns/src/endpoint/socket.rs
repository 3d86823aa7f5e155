//! Virtual sockets: the ids ([`PeerId`], [`SocketId`]), a socket's key (peer host, local and
//! remote virtual port, as in `docs/wire-format.md`), its state and per-socket send and
//! receive state (with what holding a chunk that overtook its SYNC_ACK costs), and
//! creating, failing, reaping and removing sockets.

use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::time::Instant;

use bytes::Bytes;
use netsched::{AppClass, ChannelId};
use tracing::debug;

use crate::deframer::Chunk;
use crate::reorder::ReorderBuffer;
use crate::response_queue::ResponseQueue;
use crate::wire::{ChunkRepr, ChunkType, Seq};

use super::config::SocketBuffers;
use super::send_buf::SendBuf;
use super::{Endpoint, Error, Event};

/// The credit field of a RESET that a socket sends: its sequence field is the end of the
/// sender's stream, and the receiver applies it only once every byte before that arrived.
/// A RESET with `0` there (a reply to a chunk for no socket, or a refused SYNC) carries no
/// stream position and applies on arrival (`docs/wire-format.md`, "RESET").
pub const RESET_ORDERED: u32 = 1;

/// A remote host, numbered by the caller (the layer that creates channels to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerId(pub u32);

/// A virtual socket of an [`Endpoint`]. Ids are never reused within an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SocketId(pub(super) u64);

impl SocketId {
    /// The id's number (its shard is this modulo the shard count).
    pub(crate) fn number(self) -> u64 {
        self.0
    }
}

impl fmt::Display for SocketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vs{}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Key {
    pub(super) peer: PeerId,
    pub(super) local: u16,
    pub(super) remote: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    SynSent,
    Established,
    Failed(Error),
}

#[derive(Debug)]
pub(super) struct Socket {
    pub(super) key: Key,
    pub(super) class: AppClass,
    pub(super) state: State,
    /// Closed by the application after shutdown; lingers until FINs are exchanged (or
    /// [`Config::linger_timeout`](super::Config::linger_timeout) passes).
    pub(super) detached: bool,
    /// Created by the peer's SYNC (counted in its [`super::PeerLoad`]).
    pub(super) passive: bool,
    pub(super) channels_used: BTreeSet<ChannelId>,
    // Send side.
    pub(super) send_buf: SendBuf,
    pub(super) next_seq: Seq,
    pub(super) send_limit: Seq,
    pub(super) peer_stopped: bool,
    pub(super) peer_epoch: Seq,
    /// The peer's credit window (from its SYNC or SYNC_ACK): its credit edge is its read
    /// position, at most `next_seq`, plus this.
    pub(super) peer_window: u32,
    /// DATA chunks cut for the peer: each of its STOPs answers one it parked and each
    /// RESUME follows a STOP, so its epoch is at most twice this.
    pub(super) data_chunks_sent: u64,
    pub(super) write_shut: bool,
    pub(super) fin_sent: bool,
    pub(super) write_blocked: bool,
    /// Free send-buffer bytes that wake a blocked writer ([`Endpoint::send_room`]).
    pub(super) write_low_water: usize,
    // Receive side (the reorder buffer exists once the peer's ISN is known).
    pub(super) rx: Option<ReorderBuffer>,
    pub(super) parked: ResponseQueue,
    /// Chunks that arrived before SYNC_ACK (they may overtake it on other channels).
    pub(super) early: Vec<(ChannelId, Chunk)>,
    pub(super) fin_seq: Option<Seq>,
    pub(super) advertised: Seq,
    pub(super) stop_sent: bool,
    pub(super) epoch: Seq,
    pub(super) ack_pending: bool,
    /// The peer's ordered RESET arrived, ending its stream here, before every byte up to
    /// it did: the write side is dead already, the read side delivers the bytes before it
    /// and then fails (`docs/wire-format.md`, "RESET").
    pub(super) reset_at: Option<Seq>,
    /// Failed by the peer's RESET, or by the loss of every channel to the peer: the
    /// in-order bytes received before stay readable, and reads report the error after
    /// them.
    pub(super) readable_after_failure: bool,
    /// Failed (its channels lost) after every byte up to the peer's FIN had arrived: the
    /// read side is complete, so reads hand out the bytes and then end of stream, as
    /// after a clean close; only the write side fails.
    pub(super) eof_after_failure: bool,
    // Data-level acknowledgement (`docs/wire-format.md`, "Data-level acknowledgement").
    /// DATA chunks handed to a channel or queued for one, not yet acknowledged at the data
    /// level, in sequence order: kept so that they can go again on another channel when
    /// theirs dies. At most the peer's window (one can only send within its credit).
    pub(super) unacked: VecDeque<Unacked>,
    /// Every byte before this one is acknowledged at the data level: the peer's
    /// application has read it (its credit edge less its window).
    pub(super) data_acked: Seq,
    /// The channel our FIN went out on (handed to it), until the socket goes.
    pub(super) fin_channel: Option<ChannelId>,
    /// The channel our SYNC (while connecting) or SYNC_ACK (a passive socket that has
    /// heard nothing since) went out on: it goes again if that channel dies.
    pub(super) handshake_channel: Option<ChannelId>,
    /// A chunk other than SYNC arrived from the peer (a passive socket's SYNC_ACK arrived).
    pub(super) heard: bool,
    /// Our initial sequence number (a SYNC or SYNC_ACK that goes again carries it).
    pub(super) isn: Seq,
    /// Buffer sizes and the credit window this socket grants.
    pub(super) bufs: SocketBuffers,
    /// Small chunks leave at once; `false`: they wait while data is unacknowledged.
    pub(super) nodelay: bool,
    /// The hold on a short chunk ran out ([`Config::nagle_delay`]): it leaves now.
    ///
    /// [`Config::nagle_delay`]: super::Config::nagle_delay
    pub(super) nagle_release: bool,
}

/// Least bytes an early chunk (one that overtook its socket's SYNC_ACK) is charged: what
/// holding it costs besides its payload (its header and place in the list, about 48
/// bytes), rounded up. Without it, control chunks with no payload (ACK, STOP, FIN) were
/// held for free, and a peer could send them without end to a socket still connecting.
pub const EARLY_CHUNK_COST: usize = 64;

/// Bytes an early chunk is charged to its channel and peer budgets: its payload, at least
/// [`EARLY_CHUNK_COST`] (capped at the largest payload, so that one chunk always fits an
/// empty budget).
pub(super) fn early_cost(chunk: &Chunk, max_payload: usize) -> usize {
    chunk.payload.len().max(EARLY_CHUNK_COST.min(max_payload))
}

/// A DATA chunk kept until the peer acknowledges it at the data level.
#[derive(Debug)]
pub(super) struct Unacked {
    pub(super) seq: Seq,
    /// The payload as it was sent (shares the send-buffer segment; no copy).
    pub(super) payload: Bytes,
    /// The channel that was handed the chunk; `None` while it waits in an outbox (where a
    /// lost channel's chunks are moved from, not resent from here).
    pub(super) channel: Option<ChannelId>,
}

impl Unacked {
    pub(super) fn end(&self) -> Seq {
        self.seq.plus(self.payload.len() as u32)
    }
}

impl Socket {
    /// The RESET that aborts this socket: ordered, at the end of its stream (one past the
    /// last byte cut into a DATA chunk), so that the peer reads every byte sent before it.
    pub(super) fn reset_header(&self) -> ChunkRepr {
        ChunkRepr {
            src_port: self.key.local,
            dst_port: self.key.remote,
            seq: self.next_seq,
            credit: RESET_ORDERED,
            ty: ChunkType::Reset,
            payload_len: 0,
        }
    }

    pub(super) fn new(key: Key, class: AppClass, isn: Seq, bufs: SocketBuffers) -> Self {
        Socket {
            key,
            class,
            state: State::SynSent,
            detached: false,
            passive: false,
            channels_used: BTreeSet::new(),
            send_buf: SendBuf::default(),
            next_seq: isn,
            send_limit: isn,
            peer_stopped: false,
            peer_epoch: Seq(0),
            peer_window: 0,
            data_chunks_sent: 0,
            write_shut: false,
            fin_sent: false,
            write_blocked: false,
            write_low_water: 1,
            rx: None,
            parked: ResponseQueue::new(),
            early: Vec::new(),
            fin_seq: None,
            advertised: Seq(0),
            stop_sent: false,
            epoch: Seq(0),
            ack_pending: false,
            reset_at: None,
            readable_after_failure: false,
            eof_after_failure: false,
            unacked: VecDeque::new(),
            data_acked: isn,
            fin_channel: None,
            handshake_channel: None,
            heard: false,
            isn,
            bufs,
            nodelay: true,
            nagle_release: false,
        }
    }

    /// What a read of `len` bytes meets on a failed socket: `None` when it has not failed,
    /// `Some(Ok(()))` when it failed by the peer's RESET or a loss of its channels and
    /// still holds in-order bytes
    /// (the read hands them out, `len` > 0), else `Some(Err)`.
    pub(super) fn read_error(&self, len: usize) -> Option<Result<(), Error>> {
        let State::Failed(e) = self.state else {
            return None;
        };
        if self.eof_after_failure {
            return Some(Ok(()));
        }
        let readable = self.rx.as_ref().is_some_and(|rx| rx.readable() > 0);
        Some(if self.readable_after_failure && readable && len > 0 {
            Ok(())
        } else {
            Err(e)
        })
    }

    /// The error a write meets: the socket's failure, or `ConnectionReset` while a RESET
    /// of the peer's is held for the bytes before it; `None` when writes may go on.
    pub(super) fn write_error(&self) -> Option<Error> {
        match self.state {
            State::Failed(e) => Some(e),
            _ if self.reset_at.is_some() => Some(Error::ConnectionReset),
            _ => None,
        }
    }

    /// Whether `seq` is a position of this socket's own stream sent so far, from its ISN
    /// (the SYNC or SYNC_ACK) to its next byte. An unordered RESET answers a chunk of ours
    /// that found no socket and echoes its sequence number: one outside this range
    /// answered a chunk of an earlier connection on the same ports (a key is reused as
    /// soon as its socket is gone, while chunks on other channels may still be on their
    /// way), as RFC 9293 §3.10.7.3 checks a RST's sequence number against the window.
    pub(super) fn sent_position(&self, seq: Seq) -> bool {
        !self.isn.is_after(seq) && !seq.is_after(self.next_seq)
    }

    pub(super) fn credit_edge(&self) -> Option<Seq> {
        self.rx
            .as_ref()
            .map(|rx| rx.read_seq().plus(self.bufs.window as u32))
    }

    /// Whether a credit edge is one the peer could have granted: its read position (at
    /// most our next byte) plus its window.
    pub(super) fn credit_possible(&self, edge: Seq) -> bool {
        !edge.is_after(self.next_seq.plus(self.peer_window))
    }

    /// Whether a STOP/RESUME epoch is one the peer could have reached (see
    /// `data_chunks_sent`). Epochs compare circularly, so past 2^31 chunks anything goes.
    pub(super) fn epoch_possible(&self, epoch: Seq) -> bool {
        let max = self.data_chunks_sent.saturating_mul(2);
        max >= 1 << 31 || u64::from(epoch.0) <= max
    }

    /// Records a DATA chunk handed to channel `ch`. A chunk sent again (an entry for its
    /// sequence number exists) only changes the entry's channel; one already acknowledged
    /// is not kept.
    pub(super) fn note_sent_data(&mut self, ch: ChannelId, seq: Seq, payload: Bytes) {
        if !seq.plus(payload.len() as u32).is_after(self.data_acked) {
            return;
        }
        let base = self.data_acked;
        // Chunks leave their channels' outboxes in any order: keep the list sorted.
        let at = self
            .unacked
            .partition_point(|u| u.seq.since(base) < seq.since(base));
        match self.unacked.get_mut(at) {
            Some(u) if u.seq == seq => u.channel = Some(ch),
            _ => self.unacked.insert(
                at,
                Unacked {
                    seq,
                    payload,
                    channel: Some(ch),
                },
            ),
        }
    }

    /// Takes a credit edge from the peer as a cumulative data-level acknowledgement: the
    /// peer grants its window past its read position, so every byte before `edge` less
    /// the window has been read there and need never go again.
    pub(super) fn acknowledge_data(&mut self, edge: Seq) {
        let acked = Seq(edge.0.wrapping_sub(self.peer_window));
        if !acked.is_after(self.data_acked) || acked.is_after(self.next_seq) {
            return;
        }
        self.data_acked = acked;
        while self
            .unacked
            .front()
            .is_some_and(|u| !u.end().is_after(acked))
        {
            self.unacked.pop_front();
        }
    }

    /// Payload bytes kept for a possible resend.
    pub(super) fn unacked_bytes(&self) -> usize {
        self.unacked.iter().map(|u| u.payload.len()).sum()
    }

    pub(super) fn send_credit(&self) -> usize {
        self.send_limit.since(self.next_seq).max(0) as usize
    }

    /// Its FIN has left and every byte up to the peer's FIN is here (read or not).
    pub(super) fn finished_both_ways(&self) -> bool {
        self.state == State::Established && self.fin_sent && self.received_all()
    }

    /// Every byte up to the peer's FIN is here (read or not): the read side is complete.
    /// Bytes parked past the receive buffer count when they follow on without a gap.
    pub(super) fn received_all(&self) -> bool {
        let (Some(rx), Some(fin)) = (&self.rx, self.fin_seq) else {
            return false;
        };
        let mut end = rx.contiguous_end();
        let mut spans: Vec<(Seq, usize)> = self.parked.spans().collect();
        spans.sort_by_key(|&(seq, _)| seq.since(end));
        for (seq, len) in spans {
            if seq != end {
                return false;
            }
            end = end.plus(len as u32);
        }
        end == fin
    }

    pub(super) fn at_eof(&self) -> bool {
        match (&self.rx, self.fin_seq) {
            (Some(rx), Some(fin)) => rx.readable() == 0 && rx.read_seq() == fin,
            _ => false,
        }
    }
}

impl Endpoint {
    pub(super) fn live_socket(&mut self, id: SocketId) -> Result<&mut Socket, Error> {
        match self.sockets.get_mut(&id) {
            Some(s) if !s.detached => Ok(s),
            _ => Err(Error::InvalidSocket),
        }
    }

    pub(super) fn new_socket(&mut self, s: Socket) -> SocketId {
        // Ids step by the shard count from the shard's index: unique over the shards.
        let sid = SocketId(self.next_socket);
        self.next_socket += u64::from(self.config.shard.count);
        if s.passive {
            self.peers.entry(s.key.peer).or_default().sockets += 1;
            self.passive_sockets += 1;
        }
        self.by_key.insert(s.key, sid);
        self.sockets.insert(sid, s);
        sid
    }

    pub(super) fn remove_socket(&mut self, id: SocketId) {
        let Some(mut s) = self.sockets.remove(&id) else {
            return;
        };
        self.by_key.remove(&s.key);
        self.lingering.remove(&id);
        if s.passive {
            self.passive_sockets -= 1;
            if let Some(p) = self.peers.get_mut(&s.key.peer) {
                p.sockets -= 1;
                if *p == super::PeerLoad::default() {
                    self.peers.remove(&s.key.peer);
                }
            }
        }
        for p in s.parked.take_all() {
            self.uncharge(p.channel, p.payload.len());
        }
        for (ch, c) in s.early.drain(..) {
            self.uncharge(ch, early_cost(&c, self.config.max_chunk_payload));
        }
        for l in self.listeners.values_mut() {
            l.queue.retain(|&q| q != id);
        }
        self.retry_stalled();
    }

    pub(super) fn fail(&mut self, id: SocketId, err: Error) {
        let Some(s) = self.sockets.get_mut(&id) else {
            return;
        };
        if matches!(s.state, State::Failed(_)) {
            return;
        }
        debug!(socket = %id, %err, "socket failed");
        s.state = State::Failed(err);
        s.send_buf.clear();
        let detached = s.detached;
        // A socket whose received bytes stay readable keeps those parked past its receive
        // buffer too: they reach the buffer as the application reads (`unpark`).
        let keep = !detached && (s.readable_after_failure || s.eof_after_failure);
        let parked = if keep {
            Vec::new()
        } else {
            s.parked.take_all()
        };
        let early: Vec<_> = s.early.drain(..).collect();
        for p in parked {
            self.uncharge(p.channel, p.payload.len());
        }
        for (ch, c) in early {
            self.uncharge(ch, early_cost(&c, self.config.max_chunk_payload));
        }
        if detached {
            self.remove_socket(id);
            return;
        }
        self.push_event(Event::Failed(id));
        self.push_event(Event::Readable(id));
        self.push_event(Event::Writable(id));
        self.retry_stalled();
    }

    /// Fails a socket because the peer reset it: the in-order bytes it holds stay
    /// readable before the error.
    pub(super) fn fail_by_reset(&mut self, id: SocketId) {
        if let Some(s) = self.sockets.get_mut(&id) {
            s.readable_after_failure = true;
        }
        self.fail(id, Error::ConnectionReset);
    }

    /// Releases a socket the application closed gracefully: it lingers, invisible to the
    /// application, until both directions are finished or its linger time is up.
    pub(super) fn detach(&mut self, id: SocketId) {
        let Some(s) = self.sockets.get_mut(&id) else {
            return;
        };
        s.detached = true;
        // The deadline is set by the next `handle_timeout`: the clock seen last may be
        // long past (a driver that slept), and would cut the linger short.
        self.lingering.insert(id, None);
        self.linger_unset = true;
        self.maybe_reap(id);
    }

    /// When [`Endpoint::handle_timeout`] should be called next: the earliest linger
    /// deadline, channel-loss deadline or SYNC retry; the latest time it was given (so at once) when a socket was closed since,
    /// whose deadline it sets; `None` when nothing is timed. Before the first
    /// `handle_timeout` no deadline is known: a driver calls `handle_timeout` once when it
    /// starts, then whenever this instant has passed (and again after any call, since a
    /// call may change it).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let unset =
            self.linger_unset || self.orphan_unset || self.sync_retry_unset || self.nagle_unset;
        if let (true, Some(now)) = (unset, self.clock) {
            return Some(now);
        }
        let orphans = self.orphaned.values().filter_map(|o| o.deadline).min();
        let holds = self.nagle_holds.values().flatten().min().copied();
        [self.linger_next, orphans, self.sync_retry_next, holds]
            .into_iter()
            .flatten()
            .min()
    }

    /// Advances the endpoint's clock to `now` (an earlier time than one seen before is
    /// ignored) and acts on what timed out: a closed socket that has lingered
    /// [`Config::linger_timeout`](super::Config::linger_timeout) is reset (a RESET goes to the peer) and removed, and
    /// counted in [`EndpointCounters::linger_expired`](super::EndpointCounters); the
    /// sockets of a peer left without a channel for [`Config::channel_loss_timeout`](super::Config::channel_loss_timeout) fail
    /// ([`Endpoint::handle_channel_lost`]); a connecting socket whose SYNC_ACK is
    /// overdue sends its SYNC again ([`Config::sync_retry`](super::Config::sync_retry)). The
    /// endpoint reads no clock of its own; the caller passes monotonic time in, as for a
    /// sans-IO QUIC connection.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.map_or(now, |c| c.max(now));
        self.clock = Some(now);
        self.expire_orphans(now);
        if self.sync_retry_unset || self.sync_retry_next.is_some_and(|t| t <= now) {
            self.sync_retry_next = self.retry_syncs(now);
        }
        self.expire_nagle_holds(now);
        if !self.linger_unset && self.linger_next.is_none_or(|next| now < next) {
            return;
        }
        let linger = self.config.linger_timeout;
        let mut expired = Vec::new();
        let mut next: Option<Instant> = None;
        for (&sid, at) in &mut self.lingering {
            let t = *at.get_or_insert(now + linger);
            if t <= now {
                expired.push(sid);
            } else {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        self.linger_unset = false;
        self.linger_next = next;
        for sid in expired {
            debug!(socket = %sid, ?linger, "closed socket lingered too long; resetting");
            self.counters.linger_expired += 1;
            self.reset(sid);
        }
    }

    /// Fails the sockets of peers that have waited [`Config::channel_loss_timeout`](super::Config::channel_loss_timeout) for a
    /// channel; sets the deadline of those that lost their last channel since the last
    /// call.
    fn expire_orphans(&mut self, now: Instant) {
        if self.orphaned.is_empty() {
            return;
        }
        let wait = self.config.channel_loss_timeout;
        let mut expired = Vec::new();
        for (&peer, o) in &mut self.orphaned {
            let t = *o.deadline.get_or_insert(now + wait);
            if t <= now {
                expired.push((peer, o.error));
            }
        }
        self.orphan_unset = false;
        for (peer, error) in expired {
            debug!(?peer, ?wait, "no channel to the peer came back in time");
            self.handle_peer_gone(peer, error);
        }
    }

    /// Removes a detached socket once both directions are finished.
    pub(super) fn maybe_reap(&mut self, id: SocketId) {
        let Some(s) = self.sockets.get(&id) else {
            return;
        };
        // Kept while chunks it sent may still have to go again on another channel: until
        // the peer has read every byte (as a TCP socket stays until its data is acked).
        if s.detached && s.fin_sent && s.at_eof() && s.unacked.is_empty() {
            debug!(socket = %id, "closed");
            self.remove_socket(id);
        }
    }
}
