//! Chunks of established sockets and flow control: the absolute credit edge, STOP/RESUME
//! with their epochs, FIN and RESET, placing DATA in the reorder buffer or parking it in the
//! response queue, protocol violations, and the RESUME or credit update after a read
//! (`docs/wire-format.md`, "Types", "STOP/RESUME epochs" and "RESET"; the NetChannel
//! design's per-socket response queue, `docs/architecture.md`, "Flow control and
//! head-of-line protection").

use netsched::ChannelId;
use tracing::{debug, trace, warn};

use crate::deframer::Chunk;
use crate::response_queue::ParkedChunk;
use crate::wire::{ChunkRepr, ChunkType, Seq};

use super::socket::{State, RESET_ORDERED};
use super::{Endpoint, Error, Event, Socket, SocketId};

/// What to do with a received data chunk.
pub(super) enum Placement {
    /// Every byte arrived before (a chunk sent again after a channel loss): ignored.
    Duplicate,
    Insert,
    Park,
    Violation,
}

impl Endpoint {
    pub(super) fn placement(&self, s: &Socket, seq: Seq, len: usize) -> Placement {
        let Some(rx) = s.rx.as_ref() else {
            return Placement::Violation;
        };
        let end = seq.plus(len as u32);
        let edge = s.credit_edge().expect("rx exists");
        // A copy sent again after a channel loss may arrive long after the original (it
        // can wait behind other chunks on a slow channel while the stream moves on), so
        // any distance behind counts, within the circular order's reach.
        let behind = !end.is_after(rx.contiguous_end());
        if len > 0 && (behind || rx.holds_exactly(seq, len) || s.parked.contains(seq, len)) {
            return Placement::Duplicate;
        }
        if seq.since(rx.read_seq()) < 0
            || end.is_after(edge)
            || s.fin_seq.is_some_and(|f| end.is_after(f))
            || s.reset_at.is_some_and(|r| end.is_after(r))
        {
            return Placement::Violation;
        }
        if rx.fits(seq, len) {
            Placement::Insert
        } else {
            Placement::Park
        }
    }

    pub(super) fn receive_established(&mut self, ch: ChannelId, sid: SocketId, chunk: Chunk) {
        let Some(s) = self.sockets.get_mut(&sid) else {
            return;
        };
        if matches!(s.state, State::Failed(_)) {
            return;
        }
        let h = chunk.header;
        let mut acked_all = false;
        if !matches!(
            h.ty,
            ChunkType::Sync | ChunkType::SyncAck | ChunkType::Reset
        ) {
            let limit = Seq(h.credit);
            if !limit.is_after(s.send_limit) {
                // Stale (reordered across channels): the edge only moves forward.
            } else if s.credit_possible(limit) {
                s.send_limit = limit;
                s.acknowledge_data(limit);
                acked_all = s.unacked.is_empty();
                self.schedule_needed = true;
            } else {
                // More than the peer's window past anything it could have read: a hostile
                // or broken peer. The edge is left where it was, the chunk otherwise taken.
                debug!(socket = %sid, credit = %limit, next = %s.next_seq, "credit beyond the peer's window; ignored");
                self.counters.rejected_credits += 1;
            }
        }
        if acked_all && s.detached {
            // A closed socket waited for the peer to read its last bytes.
            self.maybe_reap(sid);
        }
        let Some(s) = self.sockets.get_mut(&sid) else {
            return;
        };
        match h.ty {
            ChunkType::Data => self.receive_data(ch, sid, chunk),
            ChunkType::Ack | ChunkType::Sync | ChunkType::SyncAck => {}
            ChunkType::Stop | ChunkType::Resume => {
                if h.seq.is_after(s.peer_epoch) && !s.epoch_possible(h.seq) {
                    // A far-future epoch would make every later honest RESUME look stale
                    // and freeze the socket.
                    debug!(socket = %sid, epoch = %h.seq, "epoch beyond what the peer could have reached; ignored");
                    self.counters.rejected_epochs += 1;
                } else if h.seq.is_after(s.peer_epoch) {
                    s.peer_epoch = h.seq;
                    s.peer_stopped = h.ty == ChunkType::Stop;
                    debug!(socket = %sid, stopped = s.peer_stopped, "peer flow control");
                    self.schedule_needed = true;
                }
            }
            ChunkType::Fin => {
                if s.fin_seq.is_some_and(|f| f != h.seq)
                    || s.rx
                        .as_ref()
                        .is_some_and(|rx| h.seq.since(rx.contiguous_end()) < 0)
                {
                    self.protocol_violation(sid, "bad FIN");
                    return;
                }
                s.fin_seq = Some(h.seq);
                if s.at_eof() {
                    // Everything was read before the FIN came: acknowledge the last bytes.
                    let edge = s.credit_edge().expect("at_eof needs rx");
                    if !s.ack_pending && edge != s.advertised {
                        s.ack_pending = true;
                        let header = ChunkRepr {
                            src_port: s.key.local,
                            dst_port: s.key.remote,
                            seq: s.epoch,
                            // Filled in again as it leaves, unless the socket is gone by then.
                            credit: edge.0,
                            ty: ChunkType::Ack,
                            payload_len: 0,
                        };
                        self.queue_control(sid, header);
                    }
                }
                let s = &self.sockets[&sid];
                if s.detached && s.at_eof() {
                    self.maybe_reap(sid);
                } else if s.at_eof() {
                    self.push_event(Event::Readable(sid));
                }
            }
            ChunkType::Reset => self.receive_reset(sid, h),
        }
    }

    /// The peer reset the socket. An ordered RESET (`docs/wire-format.md`, "RESET") whose
    /// stream end is still ahead of the bytes received in order is held: the write side
    /// fails at once (the peer discards whatever comes), and the reset takes effect once
    /// every byte before its end has arrived ([`Endpoint::maybe_apply_reset`]). Any other
    /// RESET takes effect now. Either way the in-order bytes received before it stay
    /// readable, then reads fail with `ConnectionReset`. A closed socket just goes. An
    /// unordered RESET that does not echo a position this socket sent answered a chunk of
    /// an earlier connection on the same ports, and is ignored.
    fn receive_reset(&mut self, sid: SocketId, h: ChunkRepr) {
        let s = self.sockets.get_mut(&sid).expect("caller checked");
        if h.credit != RESET_ORDERED && !s.sent_position(h.seq) {
            // The answer to a chunk of an earlier connection on these ports.
            debug!(socket = %sid, seq = %h.seq, "unordered reset for another connection; ignored");
            return;
        }
        if s.detached {
            self.remove_socket(sid);
            return;
        }
        if s.reset_at.is_some() {
            return;
        }
        let end = h.seq;
        // An honest peer's stream ends within the credit we granted it, at its FIN if it
        // sent one; anything else cannot be waited for and applies now.
        let ahead = h.credit == RESET_ORDERED
            && s.rx
                .as_ref()
                .is_some_and(|rx| end.is_after(rx.contiguous_end()))
            && !end.is_after(s.advertised)
            && s.fin_seq.is_none_or(|f| f == end);
        if !ahead {
            debug!(socket = %sid, "reset by the peer");
            self.fail_by_reset(sid);
            return;
        }
        debug!(socket = %sid, end = %end, "reset by the peer; held for the bytes before it");
        s.reset_at = Some(end);
        s.send_buf.clear();
        let wake = std::mem::take(&mut s.write_blocked);
        self.sendable.remove(&sid);
        if wake {
            self.push_event(Event::Writable(sid));
        }
    }

    /// Applies a held RESET once every byte before its stream end has arrived.
    pub(super) fn maybe_apply_reset(&mut self, sid: SocketId) {
        let Some(s) = self.sockets.get(&sid) else {
            return;
        };
        if let (Some(end), Some(rx)) = (s.reset_at, s.rx.as_ref()) {
            if !end.is_after(rx.contiguous_end()) && !matches!(s.state, State::Failed(_)) {
                debug!(socket = %sid, "every byte before the peer's reset arrived; reset");
                self.fail_by_reset(sid);
            }
        }
    }

    fn receive_data(&mut self, ch: ChannelId, sid: SocketId, chunk: Chunk) {
        let s = &self.sockets[&sid];
        let (seq, len) = (chunk.header.seq, chunk.payload.len());
        let placement = self.placement(s, seq, len);
        if matches!(placement, Placement::Duplicate) {
            // Sent again after a channel loss, though the lost channel had delivered it.
            trace!(socket = %sid, seq = %seq, len, "duplicate data chunk; ignored");
            self.counters.duplicate_chunks += 1;
            return;
        }
        if s.detached {
            // The application closed this socket and will never read: abort, like TCP.
            self.reset(sid);
            return;
        }
        // A peer sends bytes twice only as the same chunk again (a duplicate, above), so a
        // chunk that overlaps a parked one is hostile or broken. Checked here, on arrival,
        // so that every parked chunk is known to fit once the reader catches up (issue:
        // two overlapping parked chunks used to panic the reading task in `after_read`).
        if s.parked.overlaps(seq, len) {
            self.protocol_violation(sid, "data overlaps a parked chunk");
            return;
        }
        match placement {
            Placement::Duplicate => {}
            Placement::Violation => self.protocol_violation(sid, "data outside credit or past FIN"),
            Placement::Park if s.rx.as_ref().is_some_and(|rx| rx.overlaps_held(seq, len)) => {
                self.protocol_violation(sid, "data overlaps bytes already received");
            }
            Placement::Insert => {
                let s = self.sockets.get_mut(&sid).expect("exists");
                let rx = s.rx.as_mut().expect("placement checked");
                if rx.insert_vec(chunk.header.seq, chunk.payload).is_err() {
                    self.protocol_violation(sid, "overlapping data");
                    return;
                }
                if rx.readable() > 0 {
                    self.push_event(Event::Readable(sid));
                }
                self.maybe_apply_reset(sid);
            }
            Placement::Park => {
                let s = self.sockets.get_mut(&sid).expect("exists");
                let n = chunk.payload.len();
                s.parked.park(ParkedChunk {
                    seq: chunk.header.seq,
                    payload: chunk.payload,
                    channel: ch,
                });
                let send_stop = !s.stop_sent;
                if send_stop {
                    s.stop_sent = true;
                    s.epoch = s.epoch.plus(1);
                }
                let header = ChunkRepr {
                    src_port: s.key.local,
                    dst_port: s.key.remote,
                    seq: s.epoch,
                    credit: 0,
                    ty: ChunkType::Stop,
                    payload_len: 0,
                };
                self.charge(ch, n);
                trace!(socket = %sid, channel = %ch, n, "parked");
                if send_stop {
                    debug!(socket = %sid, "receive buffer full; STOP");
                    self.queue_control(sid, header);
                }
            }
        }
    }

    fn protocol_violation(&mut self, sid: SocketId, what: &'static str) {
        warn!(socket = %sid, what, "protocol violation; resetting");
        let Some(s) = self.sockets.get(&sid) else {
            return;
        };
        let header = s.reset_header();
        self.queue_control(sid, header);
        self.fail(sid, Error::ConnectionReset);
    }

    /// After the application read: move parked chunks that now fit into the reorder
    /// buffer, resume stalled channels, and send RESUME or a credit update when due.
    pub(super) fn after_read(&mut self, sid: SocketId) {
        let Some(released) = self.unpark(sid) else {
            self.protocol_violation(sid, "parked chunk overlaps received data");
            self.retry_stalled();
            return;
        };
        let s = self.sockets.get_mut(&sid).expect("caller checked");
        if s.rx.as_ref().is_some_and(|rx| rx.readable() > 0) || s.at_eof() {
            self.push_event(Event::Readable(sid));
        }
        let s = self.sockets.get_mut(&sid).expect("exists");
        let threshold = s.bufs.update_threshold;
        let half = s.bufs.recv / 2;
        let rx_len = s.rx.as_ref().map_or(0, |r| r.len());
        let mut control = None;
        if s.reset_at.is_some() {
            // The peer reset: no credit or RESUME for it any more.
        } else if s.stop_sent && s.parked.is_empty() && rx_len <= half {
            s.stop_sent = false;
            s.epoch = s.epoch.plus(1);
            debug!(socket = %sid, "receive buffer drained; RESUME");
            control = Some(ChunkType::Resume);
        } else if !s.ack_pending {
            let edge = s.credit_edge().expect("rx exists");
            // At the end of the stream the last bytes are acknowledged at once: the peer
            // keeps them for resending (and a closed peer socket lingers) until then.
            if edge.since(s.advertised) >= threshold as i64 || (s.at_eof() && edge != s.advertised)
            {
                s.ack_pending = true;
                control = Some(ChunkType::Ack);
            }
        }
        if let Some(ty) = control {
            let header = ChunkRepr {
                src_port: s.key.local,
                dst_port: s.key.remote,
                seq: s.epoch,
                // Filled in again as it leaves, unless the socket is gone by then.
                credit: s.credit_edge().map_or(0, |e| e.0),
                ty,
                payload_len: 0,
            };
            self.queue_control(sid, header);
        }
        if released {
            self.retry_stalled();
        }
        self.maybe_apply_reset(sid);
    }

    /// Moves the socket's parked chunks that fit its receive buffer now into it and gives
    /// back their charge. Returns whether any moved, or `None` when one overlapped bytes
    /// already held (the peer is at fault; the caller resets the socket).
    pub(super) fn unpark(&mut self, sid: SocketId) -> Option<bool> {
        let s = self.sockets.get_mut(&sid)?;
        let rx = s.rx.as_mut()?;
        // Every read asks; nearly always nothing is parked (the take below rebuilt the
        // queue even when empty, ~200 instructions a read).
        if s.parked.is_empty() {
            return Some(false);
        }
        let fitting = s.parked.take_where(|p| rx.fits(p.seq, p.payload.len()));
        let mut released = Vec::with_capacity(fitting.len());
        let mut refused = false;
        for p in fitting {
            let n = p.payload.len();
            // Arrival checks keep parked chunks apart from each other and from held bytes,
            // so this cannot fail; if it ever does, the peer is at fault, never a panic.
            // Either way the chunk's bytes leave the channel's budget below.
            refused |= rx.insert_vec(p.seq, p.payload).is_err();
            released.push((p.channel, n));
        }
        let any = !released.is_empty();
        for (ch, n) in released {
            self.uncharge(ch, n);
        }
        (!refused).then_some(any)
    }
}
