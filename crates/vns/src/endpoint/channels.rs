//! Per-channel state: adding and losing channels (loss fails the sockets that used the
//! channel), the channel layer's load as the scheduler sees it, receiving a channel's bytes
//! (deframing and dispatching chunks to their sockets), and each channel's budget of parked
//! bytes with the last resort of pausing its reads (the NetChannel design's head-of-line
//! protection; `docs/architecture.md`, "Flow control and head-of-line protection").

use std::collections::VecDeque;

use bytes::BytesMut;
use netsched::{ChannelClass, ChannelId, ChannelStats};
use tracing::{debug, trace};

use crate::deframer::{Chunk, Deframer};
use crate::wire::{ChunkRepr, ChunkType, Seq};

use super::flow::Placement;
use super::send_buf::Piece;
use super::socket::{early_cost, Key, State, RESET_ORDERED};
use super::transmit::OutChunk;
use super::{ChannelError, Endpoint, Error, Event, PeerId, SocketId};

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
    /// The last RESETs of sockets (ordered ones, of sockets that are gone) handed to this
    /// channel, at most [`RECENT_RESETS`](super::transmit::RECENT_RESETS): they go again
    /// on another channel if this one dies, since no socket is left to remember them.
    pub(super) recent_resets: VecDeque<ChunkRepr>,
    /// Being closed ([`Endpoint::retire_channel`]): no new chunk goes on it.
    pub(super) retiring: bool,
}

/// Most RESET replies to chunks for unknown sockets a channel's outbox holds. A peer that
/// sends DATA for sockets that do not exist while keeping its window closed would
/// otherwise grow the outbox by one chunk per chunk it sends; past the bound replies are
/// dropped (and counted, [`Endpoint::dropped_replies`]): a peer that never reads them
/// loses nothing it would have seen.
pub const MAX_QUEUED_REPLIES: usize = 256;

impl Endpoint {
    /// Starts closing channel `id` without losing anything (run-time scaling,
    /// `netsched::PlanAction::CloseChannel`): from now on no chunk is scheduled on it
    /// (the scheduler is not offered it), while those already queued on it still leave
    /// and what arrives on it is still taken. Once [`Endpoint::channel_drained`], the
    /// caller closes the channel's transport gracefully; its end then comes back as
    /// [`Endpoint::handle_channel_closed`] (or `_lost`), which sends again on the other
    /// channels whatever the peer had not acknowledged at the data level. Refused for a
    /// channel that is unknown or the peer's last one not being retired.
    pub fn retire_channel(&mut self, id: ChannelId) -> Result<(), ChannelError> {
        let peer = self
            .channels
            .get(&id)
            .ok_or(ChannelError::UnknownChannel(id))?
            .peer;
        let others = self
            .channels
            .iter()
            .filter(|(&o, c)| o != id && c.peer == peer && !c.retiring)
            .count();
        if others == 0 {
            return Err(ChannelError::LastChannel(id));
        }
        let c = self.channels.get_mut(&id).expect("checked");
        c.retiring = true;
        debug!(channel = %id, outbox = c.outbox.len(), "channel retiring");
        Ok(())
    }

    /// Whether a retiring channel has handed everything queued on it to its transport
    /// (see [`Endpoint::retire_channel`]); `false` for any other channel.
    pub fn channel_drained(&self, id: ChannelId) -> bool {
        self.channels
            .get(&id)
            .is_some_and(|c| c.retiring && c.outbox.is_empty())
    }

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
                recent_resets: VecDeque::new(),
                retiring: false,
            },
        );
        self.schedule_needed = true;
        // Sockets waiting for a channel to this peer carry on over the new one.
        self.orphaned.remove(&peer);
        if let Some(items) = self.stranded.remove(&peer) {
            debug!(channel = %id, ?peer, chunks = items.len(), "resending over the new channel");
            for item in items {
                self.enqueue(id, item);
            }
        }
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

    /// Bytes of the chunks queued in this endpoint for channel `id` and not yet handed to
    /// it (headers included).
    pub fn channel_outbox_bytes(&self, id: ChannelId) -> usize {
        self.channels.get(&id).map_or(0, |c| c.outbox_bytes)
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

    /// The channel died (connection reset, peer host down, poisoned stream, bad bytes).
    /// No socket fails for it while another channel to the peer remains
    /// (`docs/wire-format.md`, "Data-level acknowledgement"):
    ///
    /// - DATA chunks handed to it and not yet acknowledged at the data level go again on
    ///   the peer's remaining channels, and so do the chunks still queued for it, a FIN, a
    ///   SYNC or SYNC_ACK that went on it, and its recent sockets' RESETs;
    /// - each socket to the peer sends its credit and STOP/RESUME state again, since a
    ///   credit update or STOP that went on the channel may be lost;
    /// - chunks it delivered that wait in response queues (parked, or early for a socket
    ///   still connecting) stay, charged to the peer until they leave: the peer sends
    ///   them again (they are not acknowledged), but its copy may have arrived first, on
    ///   another channel, and been ignored as a duplicate of the one kept here
    ///   ([`EndpointCounters::duplicate_chunks`](super::EndpointCounters)); the two sides
    ///   learn of a reset at different times;
    /// - a RESET held for the bytes before it applies now: those bytes may be gone.
    ///
    /// With no channel to the peer left, the sockets wait for a new one
    /// ([`Endpoint::add_channel`]) for [`Config::channel_loss_timeout`](super::Config),
    /// then fail with [`Error::ChannelLost`] (a socket whose peer's stream is complete
    /// keeps its bytes and end of stream); [`Endpoint::handle_peer_gone`] fails them at
    /// once when no channel can be opened.
    pub fn handle_channel_lost(&mut self, id: ChannelId) {
        self.lose_channel(id, Error::ChannelLost);
    }

    /// The peer closed the channel gracefully: its byte stream ended (a FIN after its last
    /// byte, every one of which was fed to [`Endpoint::handle_chunk_bytes`]). Handled like
    /// [`Endpoint::handle_channel_lost`]; the chunks it delivered that wait in response
    /// queues matter most here, since a peer that closes its channels gracefully (its
    /// stack stopping after everything was acknowledged by our transport) does not send
    /// them again.
    pub fn handle_channel_closed(&mut self, id: ChannelId) {
        self.lose_channel(id, Error::ChannelLost);
    }

    /// The channel timed out: its transport gave up on an unresponsive peer (TCP
    /// keep-alive or user timeout). Like [`Endpoint::handle_channel_lost`], except that
    /// sockets that fail for it fail with [`Error::PeerUnreachable`] (`TimedOut`), which
    /// tells the application the peer went silent rather than closed the channel.
    pub fn handle_channel_timed_out(&mut self, id: ChannelId) {
        self.lose_channel(id, Error::PeerUnreachable);
    }

    /// This side gives the channel up for good (the stack stops or aborts): nothing moves
    /// to another channel, and every socket that sent or received a chunk on it fails with
    /// [`Error::ChannelLost`] at once, except one finished both ways; one whose peer's
    /// stream is complete keeps its bytes and end of stream, only its writes fail.
    pub fn abandon_channel(&mut self, id: ChannelId) {
        let Some(ch) = self.channels.remove(&id) else {
            return;
        };
        self.outbox_chunks -= ch.outbox.len();
        self.release_peer(ch.peer, ch.parked_bytes);
        debug!(channel = %id, outbox = ch.outbox.len(), "channel abandoned");
        let victims: Vec<SocketId> = self
            .sockets
            .iter()
            .filter(|(_, s)| s.channels_used.contains(&id))
            .map(|(&sid, _)| sid)
            .collect();
        for sid in victims {
            self.fail_for_loss(sid, Error::ChannelLost);
        }
        if !self.channels.values().any(|c| c.peer == ch.peer) {
            self.stranded.remove(&ch.peer);
        }
        self.schedule_needed = true;
    }

    /// No channel to `peer` can be opened (the stack tried, or the peer is known to be
    /// gone): if none remains, its sockets fail now (with the error of the loss that left
    /// them without a channel, else `error`) instead of waiting
    /// [`Config::channel_loss_timeout`](super::Config), as after a loss. Does nothing
    /// while a channel to the peer exists.
    pub fn handle_peer_gone(&mut self, peer: PeerId, error: Error) {
        if self.channels.values().any(|c| c.peer == peer) {
            return;
        }
        // The loss's own error (a timed-out channel's `PeerUnreachable`) wins.
        let error = self.orphaned.remove(&peer).map_or(error, |o| o.error);
        self.stranded.remove(&peer);
        let victims: Vec<SocketId> = self
            .sockets
            .iter()
            .filter(|(_, s)| s.key.peer == peer)
            .map(|(&sid, _)| sid)
            .collect();
        debug!(?peer, sockets = victims.len(), %error, "no channel to the peer; its sockets fail");
        for sid in victims {
            self.fail_for_loss(sid, error);
        }
    }

    /// Whether sockets wait for a channel to `peer` (its last one was lost).
    pub fn peer_orphaned(&self, peer: PeerId) -> bool {
        self.orphaned.contains_key(&peer)
    }

    /// Fails a socket because its channels are gone. One finished both ways (its FIN out,
    /// everything up to the peer's FIN received) needs no channel any more: like a TCP
    /// socket after both FINs, it keeps its unread bytes and end of stream. One whose read
    /// side is complete keeps them too (reads hand out the bytes, then end of stream); only
    /// writes fail. Any other hands out the in-order bytes it holds, then the error. The peer's stack stopping right after its last bytes (a graceful
    /// `Stack::shutdown_graceful`) must not take them back.
    pub(super) fn fail_for_loss(&mut self, sid: SocketId, error: Error) {
        let Some(s) = self.sockets.get_mut(&sid) else {
            return;
        };
        if s.finished_both_ways() {
            return;
        }
        if s.state == State::Established && s.received_all() {
            s.eof_after_failure = true;
        }
        s.readable_after_failure = true;
        self.fail(sid, error);
    }

    /// The chunks it delivered that wait in response queues are kept, never dropped for
    /// the peer to send again. Dropping them lost bytes for good (a stream stalled on a
    /// hole under forged RSTs, `docs/investigations/forged-resets.md`): when the peer
    /// learned of the reset first, its copy arrived on another channel while ours was
    /// still parked, was ignored as a duplicate, and the peer then had it delivered.
    fn lose_channel(&mut self, id: ChannelId, error: Error) {
        let Some(ch) = self.channels.remove(&id) else {
            return;
        };
        self.outbox_chunks -= ch.outbox.len();
        let peer = ch.peer;
        // What its sockets hold charged to it (parked and early chunks) stays charged to
        // the peer and is given back as it leaves.
        if ch.parked_bytes > 0 {
            self.closed_charges.insert(id, (peer, ch.parked_bytes));
        }
        debug!(channel = %id, outbox = ch.outbox.len(), %error, "channel lost");
        // Queued for the channel and not handed to it: to another channel as they are.
        // RESET replies to chunks for no socket are dropped (the peer asks again).
        for item in ch.outbox {
            if !item.is_reply() {
                self.requeue(peer, ch.class, item);
            }
        }
        for header in ch.recent_resets {
            self.counters.resent_chunks += 1;
            self.requeue(
                peer,
                ch.class,
                OutChunk {
                    header,
                    payload: Piece::default(),
                    socket: None,
                },
            );
        }
        let sids: Vec<SocketId> = self
            .sockets
            .iter()
            .filter(|(_, s)| s.key.peer == peer)
            .map(|(&sid, _)| sid)
            .collect();
        let mut held_resets = Vec::new();
        for sid in sids {
            let s = self.sockets.get_mut(&sid).expect("listed above");
            s.channels_used.remove(&id);
            // A socket finished both ways still sends again what the peer has not read.
            if matches!(s.state, State::Failed(_)) {
                continue;
            }
            let resend = self.resend_for_loss(sid, id, error == Error::PeerUnreachable);
            // The credit and STOP/RESUME refresh is news, not a copy.
            self.counters.resent_chunks += resend
                .iter()
                .filter(|c| {
                    !matches!(
                        c.header.ty,
                        ChunkType::Ack | ChunkType::Stop | ChunkType::Resume
                    )
                })
                .count() as u64;
            let class = self.sockets[&sid].class.channel_class();
            for item in resend {
                self.requeue(peer, class, item);
            }
            if self.sockets[&sid].reset_at.is_some() {
                held_resets.push(sid);
            }
        }
        for sid in held_resets {
            debug!(socket = %sid, "channel lost under a held reset; applying it");
            self.fail_by_reset(sid);
        }
        if !self.channels.values().any(|c| c.peer == peer) {
            debug!(
                ?peer,
                "no channel to the peer left; its sockets wait for one"
            );
            self.orphaned.insert(
                peer,
                super::Orphan {
                    deadline: None,
                    error,
                },
            );
            self.orphan_unset = true;
        }
        self.retry_stalled();
        self.schedule_needed = true;
    }

    /// The chunks socket `sid` must send again because channel `lost` died: its DATA
    /// chunks handed to that channel and not acknowledged (copies of the payloads kept),
    /// a FIN, SYNC or SYNC_ACK that went on it, and its flow-control state.
    ///
    /// `timed_out`: the channel's transport gave up on an unresponsive peer (keep-alive or
    /// user timeout) rather than being reset. Then the flow-control state goes again only
    /// for a socket that had something else to send again on the channel: a channel that
    /// timed out idle had every byte acknowledged by the peer's transport long before
    /// (keep-alive only probes an idle connection), so its credit updates and STOP/RESUME
    /// arrived; and a refresh sent to the peer's other channels would put bytes in flight
    /// on them, turning their own quick keep-alive detection of a vanished peer into a
    /// wait for the user timeout (`tests/vns_liveness.rs`).
    fn resend_for_loss(
        &mut self,
        sid: SocketId,
        lost: ChannelId,
        timed_out: bool,
    ) -> Vec<OutChunk> {
        let s = self.sockets.get_mut(&sid).expect("caller checked");
        let mut out = Vec::new();
        let (local, remote) = (s.key.local, s.key.remote);
        let header = |ty, seq, credit, len: usize| ChunkRepr {
            src_port: local,
            dst_port: remote,
            seq,
            credit,
            ty,
            payload_len: len as u16,
        };
        let control = |header| OutChunk {
            header,
            payload: Piece::default(),
            socket: Some(sid),
        };
        let window = s.bufs.window as u32;
        let handshake_lost = s.handshake_channel == Some(lost);
        if s.state == State::SynSent {
            if handshake_lost {
                s.handshake_channel = None;
                out.push(control(header(ChunkType::Sync, s.isn, window, 0)));
            }
            return out;
        }
        if handshake_lost && s.passive && !s.heard {
            s.handshake_channel = None;
            out.push(control(header(ChunkType::SyncAck, s.isn, window, 0)));
        }
        if s.write_error().is_none() {
            for u in s.unacked.iter_mut().filter(|u| u.channel == Some(lost)) {
                // Waits in an outbox until handed again (see `Unacked::channel`).
                u.channel = None;
                s.data_chunks_sent += 1;
                out.push(OutChunk {
                    header: header(ChunkType::Data, u.seq, 0, u.payload.len()),
                    payload: Piece {
                        buf: BytesMut::from(&u.payload[..]),
                        ..Piece::default()
                    },
                    socket: Some(sid),
                });
            }
        }
        if s.fin_channel == Some(lost) {
            s.fin_channel = None;
            out.push(control(header(ChunkType::Fin, s.next_seq, 0, 0)));
        }
        if s.rx.is_some() && s.reset_at.is_none() && (!timed_out || !out.is_empty()) {
            // A credit update or STOP/RESUME may have gone with the channel; the peer
            // takes each only if it is news (edges and epochs only move forward).
            if s.epoch != Seq(0) {
                let ty = if s.stop_sent {
                    ChunkType::Stop
                } else {
                    ChunkType::Resume
                };
                out.push(control(header(ty, s.epoch, 0, 0)));
            }
            s.ack_pending = true;
            out.push(control(header(ChunkType::Ack, s.epoch, 0, 0)));
        }
        out
    }

    /// Queues a chunk that must reach `peer`: on its least-loaded channel of `class`, else
    /// of any class; with none left it waits for the next channel to the peer.
    pub(super) fn requeue(&mut self, peer: PeerId, class: ChannelClass, item: OutChunk) {
        let ch = self
            .channels
            .iter()
            .filter(|(_, c)| c.peer == peer)
            .min_by_key(|(&id, c)| {
                (
                    c.retiring,
                    c.class != class,
                    c.load.queued_bytes + c.outbox_bytes as u64,
                    id,
                )
            })
            .map(|(&id, _)| id);
        match ch {
            Some(ch) => self.enqueue(ch, item),
            None => self.stranded.entry(peer).or_default().push_back(item),
        }
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

    /// Dispatches one chunk that the caller deframed from channel `id`'s bytes itself: the
    /// form of [`Endpoint::handle_chunk_bytes`] for a caller whose channels feed several
    /// endpoints (a stack's shards, each owning the sockets [`ShardOf`](super::ShardOf)
    /// maps to it), which reads each channel's byte stream once and hands every chunk to
    /// its socket's shard. Returns whether reads of the channel are paused after it
    /// ([`Endpoint::should_pause_channel_reads`]): the chunk is then held here, and the
    /// caller offers no more of the channel's chunks to this endpoint until
    /// [`Event::ChannelUnpaused`]. A chunk for a channel this endpoint does not know is
    /// refused with [`ChannelError::UnknownChannel`], one offered while the channel's
    /// reads are paused with [`ChannelError::Paused`] (handing the chunk back).
    pub fn handle_chunk(
        &mut self,
        id: ChannelId,
        chunk: Chunk,
    ) -> Result<bool, (ChannelError, Chunk)> {
        match self.channels.get(&id) {
            None => return Err((ChannelError::UnknownChannel(id), chunk)),
            Some(ch) if ch.stalled.is_some() => return Err((ChannelError::Paused(id), chunk)),
            Some(_) => {}
        }
        self.receive_chunk(id, chunk, false);
        Ok(self.should_pause_channel_reads(id))
    }

    /// Moves up to `max` emptied chunk buffers (of the maximum payload's capacity) into
    /// `out`, for a caller that deframes channels itself ([`Endpoint::handle_chunk`]) to
    /// reuse: the endpoint collects them as the application reads its sockets' bytes.
    pub fn take_spare_buffers(&mut self, out: &mut Vec<Vec<u8>>, max: usize) {
        let n = self.spare.len().min(max);
        let at = self.spare.len() - n;
        out.extend(self.spare.drain(at..));
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
        } else if let Some((peer, left)) = self.closed_charges.get_mut(&ch) {
            debug_assert!(*left >= n, "uncharging more than a closed channel kept");
            let peer = *peer;
            *left = left.saturating_sub(n);
            if *left == 0 {
                self.closed_charges.remove(&ch);
            }
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
        let mut out = Vec::new();
        self.peer_stats_into(peer, &mut out);
        out
    }

    /// [`peer_stats`](Self::peer_stats) into `out` (cleared first), for a caller that
    /// keeps the vector.
    pub(super) fn peer_stats_into(&self, peer: PeerId, out: &mut Vec<ChannelStats>) {
        out.clear();
        out.extend(
            self.channels
                .iter()
                .filter(|(_, c)| c.peer == peer && !c.retiring)
                .map(|(&id, c)| stats_of(id, c)),
        );
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
        if h.ty != ChunkType::Sync {
            s.heard = true;
        }
        match s.state {
            State::Failed(_) => {}
            State::SynSent => match h.ty {
                ChunkType::SyncAck => self.establish_active(sid, h),
                // An ordered RESET comes from the peer's socket, so the SYNC_ACK was sent
                // before it: held like any chunk that overtook the SYNC_ACK.
                ChunkType::Reset if refusal(h) => {
                    if s.sent_position(h.seq) {
                        self.fail(sid, Error::ConnectionRefused);
                    } else {
                        debug!(socket = %sid, seq = %h.seq, "refusal of another SYNC; ignored");
                    }
                }
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
        // Which queue and thread run the channel, and how its frames reach that queue,
        // are the stack's to fill in (`Core::place`): the endpoint does not know.
        thread: None,
        queue: None,
        steering: None,
        peer_steering: None,
    }
}
