//! Per-channel state: adding and losing channels (loss fails the sockets that used the
//! channel), the channel layer's load as the scheduler sees it, receiving a channel's bytes
//! (deframing and dispatching chunks to their sockets), and each channel's budget of parked
//! bytes with the last resort of pausing its reads (the NetChannel design's head-of-line
//! protection; `docs/architecture.md`, "Flow control and head-of-line protection").

use std::collections::VecDeque;

use netsched::{ChannelClass, ChannelId, ChannelStats};
use tracing::{debug, trace};

use crate::deframer::{Chunk, Deframer};
use crate::wire::{ChunkRepr, ChunkType};

use super::flow::Placement;
use super::socket::{Key, State, RESET_ORDERED};
use super::transmit::OutChunk;
use super::{ChannelError, Endpoint, Error, Event, PeerId, Socket, SocketId};

/// The channel layer's own statistics for a channel, fed in by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelLoad {
    /// Bytes in the channel's transmit queue, not yet sent.
    pub queued_bytes: u64,
    /// Bytes sent and not yet acknowledged.
    pub in_flight_bytes: u64,
    /// Congestion window in bytes (0: unknown, or no TCP beneath the channel).
    pub cwnd_bytes: u64,
    /// Smoothed round-trip time, once sampled.
    pub srtt: Option<std::time::Duration>,
    /// Segments retransmitted since the channel opened.
    pub retransmitted_segments: u64,
    /// Payload bytes sent since the channel opened.
    pub sent_bytes: u64,
}

#[derive(Debug)]
pub(super) struct Channel {
    pub(super) peer: PeerId,
    pub(super) class: ChannelClass,
    pub(super) deframer: Deframer,
    pub(super) outbox: VecDeque<OutChunk>,
    pub(super) outbox_bytes: usize,
    pub(super) load: ChannelLoad,
    pub(super) parked_bytes: usize,
    /// A chunk that could not be parked within the budget; reads pause until it can.
    pub(super) stalled: Option<Chunk>,
    /// RESETs answering chunks for no socket, queued in `outbox` (bounded by
    /// [`MAX_QUEUED_REPLIES`]).
    pub(super) queued_replies: usize,
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

/// Most RESET replies to chunks for unknown sockets a channel's outbox holds. A peer that
/// sends DATA for sockets that do not exist while keeping its window closed would
/// otherwise grow the outbox by one chunk per chunk it sends; past the bound replies are
/// dropped (and counted, [`Endpoint::dropped_replies`]): a peer that never reads them
/// loses nothing it would have seen.
pub const MAX_QUEUED_REPLIES: usize = 256;

impl Endpoint {
    /// Registers an established channel to `peer`. Call before feeding its bytes.
    pub fn add_channel(
        &mut self,
        id: ChannelId,
        peer: PeerId,
        class: ChannelClass,
    ) -> Result<(), ChannelError> {
        if self.channels.contains_key(&id) {
            return Err(ChannelError::DuplicateChannel(id));
        }
        debug!(channel = %id, ?peer, ?class, "channel added");
        self.channels.insert(
            id,
            Channel {
                peer,
                class,
                deframer: Deframer::new(self.config.max_chunk_payload),
                outbox: VecDeque::new(),
                outbox_bytes: 0,
                load: ChannelLoad::default(),
                parked_bytes: 0,
                stalled: None,
                queued_replies: 0,
            },
        );
        self.schedule_needed = true;
        Ok(())
    }

    /// Reports the channel layer's own queue statistics (the scheduler sees them added to
    /// the endpoint's outbox for the channel). Call whenever they change materially.
    pub fn set_channel_load(
        &mut self,
        id: ChannelId,
        load: ChannelLoad,
    ) -> Result<(), ChannelError> {
        let ch = self
            .channels
            .get_mut(&id)
            .ok_or(ChannelError::UnknownChannel(id))?;
        ch.load = load;
        self.schedule_needed = true;
        Ok(())
    }

    /// The scheduler's view of a channel now.
    pub fn channel_stats(&self, id: ChannelId) -> Option<ChannelStats> {
        self.channels.get(&id).map(|c| stats_of(id, c))
    }

    /// Bytes parked in response queues and charged to this channel's budget.
    pub fn channel_parked_bytes(&self, id: ChannelId) -> usize {
        self.channels.get(&id).map_or(0, |c| c.parked_bytes)
    }

    /// Whether the caller should stop reading this channel (and so let its transport
    /// window close). True only as the last resort: a chunk could not be parked within the
    /// channel's budget. [`Event::ChannelUnpaused`] says when it turns false.
    pub fn should_pause_channel_reads(&self, id: ChannelId) -> bool {
        self.channels.get(&id).is_some_and(|c| c.stalled.is_some())
    }

    /// The channel died (connection reset, peer host down, poisoned stream). Every socket
    /// that sent or received a chunk on it fails with [`Error::ChannelLost`], since those
    /// chunks may be gone; other sockets are untouched.
    pub fn handle_channel_lost(&mut self, id: ChannelId) {
        self.lose_channel(id, Error::ChannelLost);
    }

    /// The channel timed out: its transport gave up on an unresponsive peer (TCP
    /// keep-alive or user timeout). Like [`Endpoint::handle_channel_lost`], except that
    /// the sockets fail with [`Error::PeerUnreachable`] (`TimedOut`), which tells the
    /// application the peer went silent rather than closed the channel.
    pub fn handle_channel_timed_out(&mut self, id: ChannelId) {
        self.lose_channel(id, Error::PeerUnreachable);
    }

    fn lose_channel(&mut self, id: ChannelId, error: Error) {
        let Some(ch) = self.channels.remove(&id) else {
            return;
        };
        // Every socket holding bytes charged to the channel used it and fails below (or
        // has none parked): its share of the peer's budget goes now, while the channel's
        // peer is known.
        self.release_peer(ch.peer, ch.parked_bytes);
        debug!(channel = %id, outbox = ch.outbox.len(), %error, "channel lost");
        let victims: Vec<SocketId> = self
            .sockets
            .iter()
            .filter(|(_, s)| s.channels_used.contains(&id))
            .map(|(&sid, _)| sid)
            .collect();
        for sid in victims {
            // A socket finished both ways (its FIN out, everything up to the peer's FIN
            // received) needs no channel any more: like a TCP socket after both FINs, it
            // keeps its unread bytes and end of stream instead of failing.
            if self
                .sockets
                .get(&sid)
                .is_some_and(Socket::finished_both_ways)
            {
                continue;
            }
            // One whose read side is complete (the peer's FIN and every byte before it
            // are here) keeps them: reads hand out the bytes, then end of stream; only
            // writes fail. The peer's stack stopping right after its last bytes (a
            // graceful `Stack::shutdown_graceful`) must not take them back.
            if let Some(s) = self.sockets.get_mut(&sid) {
                if s.state == State::Established && s.received_all() {
                    s.eof_after_failure = true;
                }
            }
            self.fail(sid, error);
        }
        self.schedule_needed = true;
    }

    /// Consumes bytes received on a channel: deframes chunks and dispatches them to their
    /// sockets. Returns how many bytes were consumed; fewer than offered only when reads
    /// are paused ([`Endpoint::should_pause_channel_reads`]), in which case the caller
    /// keeps the rest in the channel's receive buffer and offers it again after
    /// [`Event::ChannelUnpaused`]. A malformed header fails the channel like
    /// [`Endpoint::handle_channel_lost`] and returns [`ChannelError::Malformed`].
    pub fn handle_chunk_bytes(
        &mut self,
        id: ChannelId,
        bytes: &[u8],
    ) -> Result<usize, ChannelError> {
        let mut consumed = 0;
        while consumed < bytes.len() {
            let ch = self
                .channels
                .get_mut(&id)
                .ok_or(ChannelError::UnknownChannel(id))?;
            if ch.stalled.is_some() {
                break;
            }
            let (used, chunk) = match ch.deframer.feed_pooled(&bytes[consumed..], &mut self.spare) {
                Ok(r) => r,
                Err(e) => {
                    self.handle_channel_lost(id);
                    return Err(ChannelError::Malformed(e));
                }
            };
            consumed += used;
            if let Some(chunk) = chunk {
                self.receive_chunk(id, chunk, false);
            }
        }
        if !self.channels.contains_key(&id) {
            return Err(ChannelError::UnknownChannel(id));
        }
        Ok(consumed)
    }

    /// Charges `n` parked (or early) bytes to channel `ch` and its peer.
    pub(super) fn charge(&mut self, ch: ChannelId, n: usize) {
        if let Some(c) = self.channels.get_mut(&ch) {
            c.parked_bytes += n;
            self.peers.entry(c.peer).or_default().parked += n;
        }
    }

    /// Gives back what [`Endpoint::charge`] took. A channel already lost gave its peer's
    /// share back when it went.
    pub(super) fn uncharge(&mut self, ch: ChannelId, n: usize) {
        if let Some(c) = self.channels.get_mut(&ch) {
            debug_assert!(c.parked_bytes >= n, "uncharging more than was charged");
            c.parked_bytes = c.parked_bytes.saturating_sub(n);
            let peer = c.peer;
            self.release_peer(peer, n);
        }
    }

    fn release_peer(&mut self, peer: PeerId, n: usize) {
        if let Some(p) = self.peers.get_mut(&peer) {
            debug_assert!(p.parked >= n, "uncharging more than the peer was charged");
            p.parked = p.parked.saturating_sub(n);
            if *p == super::PeerLoad::default() {
                self.peers.remove(&peer);
            }
        }
    }

    /// Candidate channels (all classes) to `peer`, as the scheduler sees them.
    pub(super) fn peer_stats(&self, peer: PeerId) -> Vec<ChannelStats> {
        self.channels
            .iter()
            .filter(|(_, c)| c.peer == peer)
            .map(|(&id, c)| stats_of(id, c))
            .collect()
    }

    /// Bytes a chunk would need parked (or held early) if dispatched now, if any.
    fn parking_need(&self, ch: ChannelId, chunk: &Chunk) -> usize {
        let Some(peer) = self.channels.get(&ch).map(|c| c.peer) else {
            return 0;
        };
        let h = &chunk.header;
        let key = Key {
            peer,
            local: h.dst_port,
            remote: h.src_port,
        };
        let Some(s) = self.by_key.get(&key).and_then(|sid| self.sockets.get(sid)) else {
            return 0;
        };
        match s.state {
            State::SynSent if h.ty != ChunkType::SyncAck && !refusal(*h) => {
                early_cost(chunk, self.config.max_chunk_payload)
            }
            State::Established if h.ty == ChunkType::Data && !s.detached => {
                match self.placement(s, h.seq, chunk.payload.len()) {
                    Placement::Park => chunk.payload.len(),
                    _ => 0,
                }
            }
            _ => 0,
        }
    }

    /// Dispatches a chunk, or holds it (pausing the channel's reads) when parking it
    /// would exceed its channel's or its peer's budget. `retry`: the chunk was held
    /// before (not counted again).
    fn receive_chunk(&mut self, ch: ChannelId, chunk: Chunk, retry: bool) {
        let need = self.parking_need(ch, &chunk);
        if need > 0 {
            let c = self.channels.get_mut(&ch).expect("caller checked");
            let peer_parked = self.peers.get(&c.peer).map_or(0, |p| p.parked);
            let over_channel = c.parked_bytes + need > self.config.channel_budget;
            let over_peer = peer_parked + need > self.config.peer_budget;
            if over_channel || over_peer {
                debug!(channel = %ch, parked = c.parked_bytes, peer_parked, need, "budget exhausted; pausing reads");
                c.stalled = Some(chunk);
                if !retry {
                    if over_channel {
                        self.counters.channel_budget_stalls += 1;
                    } else {
                        self.counters.peer_budget_stalls += 1;
                    }
                }
                return;
            }
        }
        self.dispatch(ch, chunk);
    }

    /// Re-dispatches stalled chunks whose parking now fits their channel's budget.
    pub(super) fn retry_stalled(&mut self) {
        let stalled: Vec<ChannelId> = self
            .channels
            .iter()
            .filter(|(_, c)| c.stalled.is_some())
            .map(|(&id, _)| id)
            .collect();
        for ch in stalled {
            let chunk = self
                .channels
                .get_mut(&ch)
                .and_then(|c| c.stalled.take())
                .expect("listed above");
            self.receive_chunk(ch, chunk, true);
            if !self.should_pause_channel_reads(ch) {
                debug!(channel = %ch, "channel reads resume");
                self.push_event(Event::ChannelUnpaused(ch));
            }
        }
    }

    fn dispatch(&mut self, ch: ChannelId, chunk: Chunk) {
        let peer = self.channels[&ch].peer;
        let h = chunk.header;
        trace!(channel = %ch, ty = ?h.ty, seq = %h.seq, len = h.payload_len, "rx chunk");
        let key = Key {
            peer,
            local: h.dst_port,
            remote: h.src_port,
        };
        let Some(&sid) = self.by_key.get(&key) else {
            self.receive_unmatched(ch, key, chunk);
            return;
        };
        let s = self.sockets.get_mut(&sid).expect("by_key is consistent");
        s.channels_used.insert(ch);
        match s.state {
            State::Failed(_) => {}
            State::SynSent => match h.ty {
                ChunkType::SyncAck => self.establish_active(sid, h),
                // An ordered RESET comes from the peer's socket, so the SYNC_ACK was sent
                // before it: held like any chunk that overtook the SYNC_ACK.
                ChunkType::Reset if refusal(h) => self.fail(sid, Error::ConnectionRefused),
                _ => {
                    let n = early_cost(&chunk, self.config.max_chunk_payload);
                    s.early.push((ch, chunk));
                    self.charge(ch, n);
                }
            },
            State::Established => self.receive_established(ch, sid, chunk),
        }
    }
}

/// A RESET that refuses a connection request (no socket sent it): unordered.
fn refusal(h: ChunkRepr) -> bool {
    h.ty == ChunkType::Reset && h.credit != RESET_ORDERED
}

fn stats_of(id: ChannelId, c: &Channel) -> ChannelStats {
    ChannelStats {
        id,
        class: c.class,
        queued_bytes: c.load.queued_bytes + c.outbox_bytes as u64,
        in_flight_bytes: c.load.in_flight_bytes,
        peer: netsched::PeerId(c.peer.0),
        cwnd_bytes: c.load.cwnd_bytes,
        srtt: c.load.srtt,
        retransmitted_segments: c.load.retransmitted_segments,
        sent_bytes: c.load.sent_bytes,
        // Which channel thread runs the channel is not known to the endpoint yet.
        thread: None,
    }
}
