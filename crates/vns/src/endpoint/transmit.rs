//! Transmission: cutting chunks from send buffers onto the channels the scheduler picks
//! (one per socket per round, FIN after the last byte), queueing control chunks, filling in
//! each chunk's credit edge as it leaves (`docs/wire-format.md`, "Credit edge"), handing
//! chunks to the driver (`poll_transmit`, `poll_transmit_parts`), and taking sent buffers
//! back for reuse.

use std::time::Instant;

use bytes::{Bytes, BytesMut};

use netsched::{ChannelId, ChunkInfo};
use tracing::{trace, warn};

use crate::wire::{ChunkPacket, ChunkRepr, ChunkType, HEADER_LEN};

use super::send_buf::Piece;
use super::socket::{State, RESET_ORDERED};
use super::{Endpoint, Event, SocketId, SENT_LENT_MAX};

#[derive(Debug)]
pub(super) struct OutChunk {
    pub(super) header: ChunkRepr,
    /// Shares the socket's send-buffer segment (no copy).
    pub(super) payload: Piece,
    pub(super) socket: Option<SocketId>,
}

impl OutChunk {
    /// A RESET answering a chunk for no socket (counted in `Channel::queued_replies`); a
    /// gone socket's own RESET sent again after a channel loss has no socket either, but
    /// is ordered.
    pub(super) fn is_reply(&self) -> bool {
        self.socket.is_none()
            && self.header.ty == ChunkType::Reset
            && self.header.credit != RESET_ORDERED
    }
}

/// RESETs a channel remembers
/// ([`Channel::recent_resets`](super::channels::Channel::recent_resets)).
pub(super) const RECENT_RESETS: usize = 64;

impl Endpoint {
    /// Appends the next chunk for channel `id` (header and payload) to `out` and returns its
    /// length, or `None` when nothing is queued for the channel. Call it, after any other
    /// call, while the channel can take more bytes; data is assigned to channels by the
    /// scheduler here, so a channel that is not polled does not receive new chunks.
    pub fn poll_transmit(&mut self, id: ChannelId, out: &mut Vec<u8>) -> Option<usize> {
        let item = self.next_out(id)?;
        item.header.emit_to_vec(item.payload.data(), out);
        let (track, recycle, headroom) = (
            item.payload.track,
            item.payload.recycle,
            item.payload.headroom,
        );
        let buf = item.payload.buf.freeze();
        self.note_handed(id, &item.header, item.socket, &buf, headroom);
        if track {
            self.keep_lent(buf);
        } else if recycle {
            let cap = self.seg_cap();
            self.seg_pool.keep_sent(buf, cap);
        }
        Some(item.header.wire_len())
    }

    /// Remembers what a chunk handed to channel `id` needs if that channel dies
    /// (`docs/wire-format.md`, "Data-level acknowledgement"): a DATA chunk's payload until
    /// the peer acknowledges it, where a FIN, SYNC or SYNC_ACK went, and a socket's RESET.
    /// `buf` is the chunk's buffer, with room for the header in front when `headroom`.
    fn note_handed(
        &mut self,
        id: ChannelId,
        header: &ChunkRepr,
        socket: Option<SocketId>,
        buf: &Bytes,
        headroom: bool,
    ) {
        if header.ty == ChunkType::Reset && header.credit == RESET_ORDERED {
            // The socket is gone already; its RESET is remembered on the channel.
            if let Some(c) = self.channels.get_mut(&id) {
                if c.recent_resets.len() >= RECENT_RESETS {
                    c.recent_resets.pop_front();
                }
                c.recent_resets.push_back(*header);
            }
            return;
        }
        let Some(s) = socket.and_then(|sid| self.sockets.get_mut(&sid)) else {
            return;
        };
        match header.ty {
            ChunkType::Data => {
                let payload = if headroom {
                    buf.slice(HEADER_LEN..)
                } else {
                    buf.clone()
                };
                s.note_sent_data(id, header.seq, payload);
            }
            ChunkType::Fin => s.fin_channel = Some(id),
            ChunkType::Sync | ChunkType::SyncAck => s.handshake_channel = Some(id),
            _ => {}
        }
    }

    /// Most bytes a socket keeps cut and unacknowledged ([`Config::resend_buffer`]).
    ///
    /// [`Config::resend_buffer`]: super::Config::resend_buffer
    pub(super) fn resend_bound(&self) -> usize {
        self.config.resend_buffer.max(self.config.credit_window)
    }

    /// Capacity of a send-buffer segment: room for a header, then one chunk payload.
    fn seg_cap(&self) -> usize {
        HEADER_LEN + self.config.max_chunk_payload
    }

    /// Keeps a reference to a sent lent buffer until the channel is done with it.
    fn keep_lent(&mut self, b: Bytes) {
        if self.sent_lent.len() >= SENT_LENT_MAX {
            self.sent_lent.pop_front();
        }
        self.sent_lent.push_back(b);
    }

    /// Hands every sent buffer lent by [`Endpoint::send_chunks`] that nothing else
    /// references any more (the channel has dropped it) to `reuse`, as a `BytesMut` over
    /// the data it was sent with (`BytesMut::try_reclaim` or `clear` + `reserve` widen it
    /// over its whole allocation). Returns how many.
    pub(crate) fn reclaim_sent(&mut self, mut reuse: impl FnMut(BytesMut)) -> usize {
        let mut n = 0;
        // Channels free their chunks in about the order sent, but one slow channel must
        // not hold back the others' buffers: look at every entry, keeping the order.
        for _ in 0..self.sent_lent.len() {
            let b = self.sent_lent.pop_front().expect("counted");
            match b.try_into_mut() {
                Ok(m) => {
                    reuse(m);
                    n += 1;
                }
                Err(b) => self.sent_lent.push_back(b),
            }
        }
        n
    }

    /// The next chunk for channel `id`, its credit field filled in.
    fn next_out(&mut self, id: ChannelId) -> Option<OutChunk> {
        if self.schedule_needed {
            self.schedule();
        }
        let mut item = loop {
            let ch = self.channels.get_mut(&id)?;
            let item = ch.outbox.pop_front()?;
            ch.outbox_bytes -= item.header.wire_len();
            self.outbox_chunks -= 1;
            if item.is_reply() {
                ch.queued_replies = ch.queued_replies.saturating_sub(1);
            }
            // A copy queued after a channel loss whose bytes the peer has read meanwhile
            // (the lost channel had delivered them after all) need not go.
            let acked = item.header.ty == ChunkType::Data
                && item
                    .socket
                    .and_then(|sid| self.sockets.get(&sid))
                    .is_some_and(|s| {
                        !item
                            .header
                            .seq
                            .plus(u32::from(item.header.payload_len))
                            .is_after(s.data_acked)
                    });
            if !acked {
                break item;
            }
        };
        self.schedule_needed = true;
        if let Some(sid) = item.socket {
            if let Some(s) = self.sockets.get_mut(&sid) {
                let fresh = !matches!(item.header.ty, ChunkType::Sync | ChunkType::SyncAck);
                if let (true, Some(edge)) = (fresh, s.credit_edge()) {
                    item.header.credit = edge.0;
                    if edge.is_after(s.advertised) {
                        s.advertised = edge;
                    }
                    if item.header.ty == ChunkType::Ack {
                        s.ack_pending = false;
                        item.header.seq = s.epoch;
                    }
                }
            }
        }
        trace!(channel = %id, ty = ?item.header.ty, seq = %item.header.seq, len = item.header.payload_len, "tx chunk");
        Some(item)
    }

    /// [`Endpoint::poll_transmit`] without copying the payload: returns the next chunk's
    /// payload as it sits in the socket's send buffer (empty for control chunks), which the
    /// caller sends after what `header` holds. The chunk's header is either already in
    /// front of the returned bytes (the send buffer keeps room for it) or appended to
    /// `header`. `None` when nothing is queued for the channel.
    pub fn poll_transmit_parts(&mut self, id: ChannelId, header: &mut Vec<u8>) -> Option<Bytes> {
        let mut item = self.next_out(id)?;
        let track = item.payload.track;
        let recycle = item.payload.recycle;
        let headroom = item.payload.headroom;
        let out = if headroom {
            // The segment has room for the header in front: one `Bytes`, no copy.
            let buf = &mut item.payload.buf;
            item.header
                .emit(&mut ChunkPacket::new_unchecked(&mut buf[..HEADER_LEN]));
            item.payload.buf.freeze()
        } else {
            let at = header.len();
            header.resize(at + HEADER_LEN, 0);
            item.header
                .emit(&mut ChunkPacket::new_unchecked(&mut header[at..]));
            item.payload.buf.freeze()
        };
        self.note_handed(id, &item.header, item.socket, &out, headroom);
        if track {
            self.keep_lent(out.clone());
        } else if recycle {
            let cap = self.seg_cap();
            self.seg_pool.keep_sent(out.clone(), cap);
        }
        Some(out)
    }

    /// Whether a driver's finishing pass after a call into the endpoint would find
    /// nothing to do: no socket data to place (a scheduling pass due with nothing to
    /// place does nothing), no chunk in any channel's outbox, no event to hand out and no
    /// timer changed. Most application calls that find nothing to read end with such a
    /// pass.
    pub fn output_idle(&self) -> bool {
        self.transmit_idle() && self.events.is_empty()
    }

    /// [`output_idle`](Self::output_idle) but for events: nothing to place or send and
    /// no timer changed, so that a finishing pass has only events to hand out. A read
    /// ends so: the chunk that brought its bytes left a `Readable` event for the
    /// reader's own socket.
    pub fn transmit_idle(&self) -> bool {
        self.sendable.is_empty() && self.outbox_chunks == 0 && !self.timers_changed
    }

    /// Whether sockets wait for the scheduler to place their data on channels (it then
    /// reads the channels' loads, so a driver refreshes them first).
    pub fn wants_schedule(&self) -> bool {
        !self.sendable.is_empty()
    }

    /// The channels with chunks waiting (after scheduling), in id order, into `out`
    /// (cleared first): the ones a driver visits, rather than asking
    /// [`has_transmit`](Self::has_transmit) of each.
    pub fn channels_with_transmit(&mut self, out: &mut Vec<ChannelId>) {
        if self.schedule_needed {
            self.schedule();
        }
        out.clear();
        debug_assert_eq!(
            self.outbox_chunks,
            self.channels
                .values()
                .map(|c| c.outbox.len())
                .sum::<usize>(),
            "outbox_chunks counts every outbox's chunks"
        );
        if self.outbox_chunks == 0 {
            return;
        }
        out.extend(
            self.channels
                .iter()
                .filter(|(_, c)| !c.outbox.is_empty())
                .map(|(&id, _)| id),
        );
    }

    /// Whether any chunk waits for channel `id` (after scheduling).
    pub fn has_transmit(&mut self, id: ChannelId) -> bool {
        if self.schedule_needed {
            self.schedule();
        }
        self.channels.get(&id).is_some_and(|c| !c.outbox.is_empty())
    }

    /// Bytes the endpoint still has to hand to its channels: unsent bytes of live sockets
    /// (gracefully closing ones included), one for each shut-down socket whose FIN has
    /// not left yet, and the chunks waiting in channel outboxes (headers included). Zero
    /// once everything the application wrote (and every FIN) is in the channels.
    pub fn pending_tx_bytes(&self) -> usize {
        let sockets: usize = self
            .sockets
            .values()
            .filter(|s| s.write_error().is_none())
            .map(|s| s.send_buf.len() + usize::from(s.write_shut && !s.fin_sent))
            .sum();
        let outboxes: usize = self.channels.values().map(|c| c.outbox_bytes).sum();
        sockets + outboxes
    }

    pub(super) fn enqueue(&mut self, ch: ChannelId, item: OutChunk) {
        if let Some(sid) = item.socket {
            if let Some(s) = self.sockets.get_mut(&sid) {
                s.channels_used.insert(ch);
            }
        }
        if let Some(c) = self.channels.get_mut(&ch) {
            c.outbox_bytes += item.header.wire_len();
            c.outbox.push_back(item);
            self.outbox_chunks += 1;
        }
    }

    /// Queues a control chunk of socket `sid` on the channel the scheduler picks, or else
    /// the least-loaded channel of the socket's class (control chunks bypass thresholds),
    /// else of any class; with no channel to the peer left, for the next one.
    pub(super) fn queue_control(&mut self, sid: SocketId, header: ChunkRepr) {
        let Some(s) = self.sockets.get(&sid) else {
            return;
        };
        let (peer, class) = (s.key.peer, s.class);
        let stats = self.peer_stats(peer);
        let info = ChunkInfo {
            flow: sid.0,
            class,
            len: 0,
        };
        let item = OutChunk {
            header,
            payload: Piece::default(),
            socket: Some(sid),
        };
        match self
            .scheduler
            .pick_channel(&info, &stats)
            .filter(|id| stats.iter().any(|c| c.id == *id))
        {
            Some(ch) => self.enqueue(ch, item),
            None => self.requeue(peer, class.channel_class(), item),
        }
    }

    /// Cuts chunks from send buffers, one per socket per round, onto the channels the
    /// scheduler picks, until nothing more can go; queues FINs after the last byte.
    fn schedule(&mut self) {
        self.schedule_needed = false;
        if self.sendable.is_empty() {
            return;
        }
        // Scratch vectors kept between calls: this runs once per message.
        let mut ids = std::mem::take(&mut self.schedule_ids);
        let (mut active, mut next) = std::mem::take(&mut self.schedule_scratch);
        ids.clear();
        ids.extend(self.sendable.iter().copied());
        active.clear();
        active.extend_from_slice(&ids);
        while !active.is_empty() {
            next.clear();
            for &sid in &active {
                if self.schedule_one(sid) {
                    next.push(sid);
                }
            }
            std::mem::swap(&mut active, &mut next);
        }
        self.schedule_scratch = (active, next);
        for &sid in &ids {
            let keep = self.sockets.get(&sid).is_some_and(|s| {
                s.write_error().is_none()
                    && (!s.send_buf.is_empty() || (s.write_shut && !s.fin_sent))
            });
            // A socket that queues its FIN below has nothing left after it.
            let fin_due = self.sockets.get(&sid).is_some_and(|s| {
                s.state == State::Established
                    && s.reset_at.is_none()
                    && s.write_shut
                    && !s.fin_sent
                    && s.send_buf.is_empty()
            });
            if !keep || fin_due {
                self.sendable.remove(&sid);
            }
            let Some(s) = self.sockets.get_mut(&sid) else {
                continue;
            };
            if fin_due {
                s.fin_sent = true;
                let header = ChunkRepr {
                    src_port: s.key.local,
                    dst_port: s.key.remote,
                    seq: s.next_seq,
                    credit: 0,
                    ty: ChunkType::Fin,
                    payload_len: 0,
                };
                self.queue_control(sid, header);
                self.maybe_reap(sid);
            }
        }
        self.schedule_ids = ids;
    }

    /// Ends the holds on short chunks that have lasted [`Config::nagle_delay`]; forgets
    /// sockets that are gone or no longer hold anything back.
    ///
    /// [`Config::nagle_delay`]: super::Config::nagle_delay
    pub(super) fn expire_nagle_holds(&mut self, now: Instant) {
        if self.nagle_holds.is_empty() {
            self.nagle_unset = false;
            return;
        }
        let delay = self.config.nagle_delay;
        let mut due = Vec::new();
        self.nagle_holds.retain(|&sid, at| {
            let t = *at.get_or_insert(now + delay);
            if t <= now {
                due.push(sid);
                return false;
            }
            true
        });
        self.nagle_unset = false;
        for sid in due {
            if let Some(s) = self.sockets.get_mut(&sid) {
                s.nagle_release = true;
                self.sendable.insert(sid);
                self.schedule_needed = true;
            }
        }
    }

    /// Sends one data chunk of `sid` if it can; returns whether it did.
    fn schedule_one(&mut self, sid: SocketId) -> bool {
        let max = self.config.max_chunk_payload;
        let Some(s) = self.sockets.get(&sid) else {
            return false;
        };
        let cap = s.bufs.send;
        if s.state != State::Established || s.peer_stopped || s.send_buf.is_empty() {
            return false;
        }
        // Bytes cut and not yet acknowledged at the data level stay held for resending.
        let held = s.next_seq.since(s.data_acked).max(0) as usize;
        let room = self.resend_bound().saturating_sub(held);
        let len = s.send_buf.len().min(s.send_credit()).min(max).min(room);
        if len == 0 {
            return false;
        }
        // Nagle's algorithm (RFC 896 §2, RFC 1122 4.2.3.4) with `nodelay` off: a chunk
        // shorter than a full one waits while earlier data is unacknowledged, so that
        // small writes made meanwhile join it; a FIN to follow, or the hold running out,
        // sends it. A chunk the credit cuts short is not this rule's to hold.
        if !s.nodelay
            && len < max
            && len == s.send_buf.len()
            && !s.write_shut
            && !s.nagle_release
            && s.next_seq.since(s.data_acked) > 0
        {
            if let std::collections::btree_map::Entry::Vacant(e) = self.nagle_holds.entry(sid) {
                e.insert(None);
                self.nagle_unset = true;
                self.timers_changed = true;
            }
            return false;
        }
        // The peer's channels, gathered into a vector kept between calls.
        let mut stats = std::mem::take(&mut self.schedule_stats);
        self.peer_stats_into(s.key.peer, &mut stats);
        let info = ChunkInfo {
            flow: sid.0,
            class: s.class,
            len,
        };
        let class = s.class.channel_class();
        let picked = self.scheduler.pick_channel(&info, &stats);
        let picked = picked.or_else(|| {
            // Its class has no channel to the peer left (lost): the others carry it rather
            // than the socket stall, isolation giving way to delivery.
            if stats.iter().any(|c| c.class == class) {
                return None;
            }
            stats
                .iter()
                .min_by_key(|c| (c.queued_bytes, c.id))
                .map(|c| c.id)
        });
        let offered = picked.is_some_and(|ch| stats.iter().any(|c| c.id == ch));
        self.schedule_stats = stats;
        let Some(ch) = picked else {
            return false;
        };
        if !offered {
            warn!(channel = %ch, "scheduler picked a channel not offered");
            return false;
        }
        let s = self.sockets.get_mut(&sid).expect("checked above");
        let payload = s.send_buf.take(len, max);
        let len = payload.len();
        let header = ChunkRepr {
            src_port: s.key.local,
            dst_port: s.key.remote,
            seq: s.next_seq,
            credit: 0,
            ty: ChunkType::Data,
            payload_len: len as u16,
        };
        s.next_seq = s.next_seq.plus(len as u32);
        s.data_chunks_sent += 1;
        s.nagle_release = false;
        self.nagle_holds.remove(&sid);
        let wake = s.write_blocked && cap.saturating_sub(s.send_buf.len()) >= s.write_low_water;
        if wake {
            s.write_blocked = false;
        }
        self.enqueue(
            ch,
            OutChunk {
                header,
                payload,
                socket: Some(sid),
            },
        );
        if wake {
            self.push_event(Event::Writable(sid));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::send_buf::SEG_POOL_IDLE;
    use crate::endpoint::{Config, Error, PeerId};
    use netsched::{AppClass, ChannelClass, RoundRobin};

    /// A client and a server endpoint joined by channel `ch`, the server listening on 7000
    /// and the client's socket to it connecting (its SYNC not yet delivered).
    fn connecting(cfg: Config, ch: ChannelId) -> (Endpoint, Endpoint, SocketId) {
        let mut client = Endpoint::new(cfg.clone(), RoundRobin::default()).unwrap();
        let mut server = Endpoint::new(cfg, RoundRobin::default()).unwrap();
        client
            .add_channel(ch, PeerId(1), ChannelClass::Throughput)
            .unwrap();
        server
            .add_channel(ch, PeerId(0), ChannelClass::Throughput)
            .unwrap();
        server.bind(7000, 4).unwrap();
        let sid = client
            .connect(PeerId(1), 7000, AppClass::Throughput)
            .unwrap();
        (client, server, sid)
    }

    /// Moves every chunk `from` has for `ch` to `to`; returns the payload buffers handed
    /// out (to compare their memory with what was lent).
    fn deliver(from: &mut Endpoint, to: &mut Endpoint, ch: ChannelId) -> Vec<Bytes> {
        let mut wire = Vec::new();
        let mut payloads = Vec::new();
        loop {
            let mut header = Vec::new();
            let Some(p) = from.poll_transmit_parts(ch, &mut header) else {
                break;
            };
            wire.extend_from_slice(&header);
            wire.extend_from_slice(&p);
            if !p.is_empty() {
                payloads.push(p);
            }
        }
        assert_eq!(to.handle_chunk_bytes(ch, &wire).unwrap(), wire.len());
        payloads
    }

    fn writable(ep: &mut Endpoint, sid: SocketId) -> bool {
        std::iter::from_fn(|| ep.poll_events()).any(|e| e == Event::Writable(sid))
    }

    /// Lent segments leave as the same memory (header written into their headroom), a
    /// writer waiting with a low-water mark is woken only once that much room is free,
    /// `recv_with` lends the received bytes and keeps the credit flowing, and sent
    /// segments come back once nothing else holds them.
    #[test]
    fn lent_segments_low_water_and_lent_reads() {
        const P: usize = 1000;
        let cfg = Config {
            max_chunk_payload: P,
            send_buffer: 4 * P,
            recv_buffer: P,
            credit_window: P,
            credit_update_threshold: P,
            channel_budget: 4 * P,
            ..Config::default()
        };
        let ch = ChannelId(0);
        let (mut client, mut server, sid) = connecting(cfg, ch);

        let data: Vec<u8> = (0..4 * P).map(|i| (i * 7 + 1) as u8).collect();
        let mut segs: Vec<BytesMut> = data
            .chunks(P)
            .map(|c| {
                let mut b = BytesMut::with_capacity(HEADER_LEN + P);
                b.resize(HEADER_LEN, 0);
                b.extend_from_slice(c);
                b
            })
            .collect();
        let ptrs: Vec<*const u8> = segs.iter().map(|b| b.as_ptr()).collect();
        assert_eq!(client.send_room(sid, 3 * P), Ok(4 * P));
        assert_eq!(client.send_chunks(sid, &mut segs), Ok(4 * P));
        assert!(segs.is_empty());
        assert_eq!(client.send_room(sid, 5 * P / 2), Err(Error::WouldBlock));

        // Handshake, then one chunk per credit window.
        let mut sent = deliver(&mut client, &mut server, ch);
        deliver(&mut server, &mut client, ch);
        sent.extend(deliver(&mut client, &mut server, ch));
        let accepted = server.accept(7000).unwrap();
        // The handshake's own Writable (connected) is not a room wake-up.
        while client.poll_events().is_some() {}
        let mut got = Vec::new();
        let mut woken_at = None;
        for round in 1..=4 {
            assert_eq!(sent.len(), round, "one chunk per window");
            let n = server
                .recv_with(accepted, usize::MAX, |chunks| {
                    chunks.iter().for_each(|c| got.extend_from_slice(c));
                    chunks.iter().map(|c| c.len()).sum()
                })
                .unwrap();
            assert_eq!(n, P);
            deliver(&mut server, &mut client, ch); // the credit update
            sent.extend(deliver(&mut client, &mut server, ch));
            if writable(&mut client, sid) && woken_at.is_none() {
                woken_at = Some(round);
            }
        }
        assert_eq!(got, data);
        // Low water 2.5 chunks: no wake-up with 1 or 2 chunks of room (rounds 0 and 1),
        // one once the third chunk has left (round 2).
        assert_eq!(woken_at, Some(2));
        // Each chunk left in the lent memory, its header in the headroom.
        let out: Vec<*const u8> = sent.iter().map(|b| b.as_ptr()).collect();
        assert_eq!(out, ptrs);
        assert!(sent.iter().all(|b| b.len() == HEADER_LEN + P));
        // Held by the "channel": nothing comes back; dropped: all four do.
        assert_eq!(client.reclaim_sent(|_| {}), 0);
        drop(sent);
        let mut back = Vec::new();
        assert_eq!(client.reclaim_sent(|b| back.push(b)), 4);
        assert!(back.iter().all(|b| b.capacity() >= HEADER_LEN + P));
        let back: Vec<*const u8> = back.iter().map(|b| b.as_ptr()).collect();
        assert_eq!(back, ptrs);
    }

    /// Plain writes take their send-buffer segments from the endpoint's pool: a segment
    /// the channel still holds is never reused (its bytes stay as sent), one it has
    /// dropped is (same memory), the idle pool stays bounded, and the bytes delivered are
    /// exactly the bytes written.
    #[test]
    fn sent_segments_are_reused_once_the_channel_drops_them() {
        const P: usize = 1000;
        let cfg = Config {
            max_chunk_payload: P,
            send_buffer: 4 * P,
            recv_buffer: 4 * P,
            credit_window: 4 * P,
            credit_update_threshold: P,
            channel_budget: 8 * P,
            ..Config::default()
        };
        let ch = ChannelId(0);
        let (mut client, mut server, sid) = connecting(cfg, ch);
        let data: Vec<u8> = (0..3 * 4 * P).map(|i| (i * 13 + 5) as u8).collect();
        let ptrs = |b: &[Bytes]| -> Vec<*const u8> { b.iter().map(|p| p.as_ptr()).collect() };
        let mut got = Vec::new();
        let mut buf = vec![0u8; 8 * P];
        let mut accepted = None;
        let mut first = Vec::new();
        let mut held: Vec<Vec<Bytes>> = Vec::new();
        let mut counts = Vec::new();
        for (i, part) in data.chunks(4 * P).enumerate() {
            assert_eq!(client.send(sid, part), Ok(4 * P));
            counts.push((client.seg_pool.allocated, client.seg_pool.reused));
            let mut sent = deliver(&mut client, &mut server, ch);
            if i == 0 {
                // Handshake.
                deliver(&mut server, &mut client, ch);
                sent.extend(deliver(&mut client, &mut server, ch));
                accepted = server.accept(7000).ok();
                first = ptrs(&sent);
            }
            assert_eq!(sent.len(), 4, "one chunk per segment");
            held.push(sent);
            // Read everything so that the credit comes back for the next batch.
            let rid = accepted.expect("accepted");
            while let Ok(n) = server.recv(rid, &mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            deliver(&mut server, &mut client, ch);
            if i == 1 {
                // The "channel" drops the first batch; it still holds the second.
                held.remove(0);
            }
        }
        assert_eq!(got, data);
        let (second, third) = (ptrs(&held[0]), ptrs(&held[1]));
        // Batch 2 was written while batch 1 was held: other memory. Batch 3 was written
        // after batch 1 was dropped: batch 1's memory again, not batch 2's (still held,
        // its bytes as sent).
        assert!(second.iter().all(|p| !first.contains(p)));
        assert!(third.iter().all(|p| first.contains(p)));
        // (The allocator could hand back freed memory too: the counters tell apart.)
        assert_eq!(counts, [(4, 0), (8, 0), (8, 4)]);
        for (k, piece) in held[0].iter().enumerate() {
            assert_eq!(
                &piece[HEADER_LEN..],
                &data[4 * P + k * P..4 * P + (k + 1) * P]
            );
        }
        // Once the channel drops everything, the idle pool takes what it may, no more.
        drop(held);
        client.seg_pool.sweep(HEADER_LEN + P);
        assert!(client.seg_pool.sent.is_empty());
        assert!(!client.seg_pool.idle.is_empty());
        assert!(client.seg_pool.idle.len() <= SEG_POOL_IDLE);
    }

    /// A lent segment that credit cuts in two comes back once both parts are gone, and
    /// can be widened over its whole allocation again.
    #[test]
    fn a_lent_segment_cut_by_credit_comes_back_whole() {
        const P: usize = 1000;
        let cfg = Config {
            max_chunk_payload: P,
            send_buffer: 4 * P,
            recv_buffer: 3 * P / 2,
            credit_window: 3 * P / 2,
            credit_update_threshold: P / 2,
            channel_budget: 4 * P,
            ..Config::default()
        };
        let ch = ChannelId(0);
        let (mut client, mut server, sid) = connecting(cfg, ch);
        let mut segs: Vec<BytesMut> = (0..2u8)
            .map(|i| {
                let mut b = BytesMut::with_capacity(HEADER_LEN + P);
                b.resize(HEADER_LEN, 0);
                b.resize(HEADER_LEN + P, i + 1);
                b
            })
            .collect();
        let ptrs: Vec<*const u8> = segs.iter().map(|b| b.as_ptr()).collect();
        assert_eq!(client.send_chunks(sid, &mut segs), Ok(2 * P));
        let mut sent = deliver(&mut client, &mut server, ch);
        deliver(&mut server, &mut client, ch);
        sent.extend(deliver(&mut client, &mut server, ch));
        // 1.5 chunks of credit: the second segment left cut, its front half first.
        let lens: Vec<usize> = sent.iter().map(|b| b.len() - HEADER_LEN).collect();
        assert_eq!(lens, [P, P / 2]);
        let accepted = server.accept(7000).unwrap();
        let mut buf = vec![0u8; 2 * P];
        assert_eq!(server.recv(accepted, &mut buf), Ok(3 * P / 2));
        deliver(&mut server, &mut client, ch);
        let rest = deliver(&mut client, &mut server, ch);
        assert_eq!(rest.len(), 1);
        assert_eq!(
            rest[0].len(),
            P / 2,
            "the rest: no header room, sent after its header"
        );
        assert_eq!(server.recv(accepted, &mut buf), Ok(P / 2));
        assert!(buf[..P / 2].iter().all(|&b| b == 2));
        drop(sent);
        // The front half alone is not reusable while the rest is still out.
        let mut back = Vec::new();
        assert_eq!(client.reclaim_sent(|b| back.push(b)), 1);
        drop(rest);
        // The channel is done with the rest, but the socket keeps it for resending until
        // the peer's credit says it was read.
        assert_eq!(client.reclaim_sent(|b| back.push(b)), 0);
        deliver(&mut server, &mut client, ch);
        assert_eq!(client.reclaim_sent(|b| back.push(b)), 1);
        for (mut b, ptr) in back.into_iter().zip(ptrs) {
            assert_eq!(b.as_ptr(), ptr);
            b.clear();
            assert!(
                b.try_reclaim(HEADER_LEN + P),
                "the whole allocation is free again"
            );
            assert_eq!(b.as_ptr(), ptr);
        }
    }
}
