//! Connection set-up: listeners (`bind`, `unbind`, `accept`), `connect` with its ephemeral
//! port and initial sequence number, the two-way SYNC → SYNC_ACK handshake, and the RESET
//! answering chunks for no known socket (`docs/wire-format.md`, "Handshake" and "RESET").

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use netsched::{AppClass, ChannelClass, ChannelId};
use rand::Rng;
use tracing::{debug, trace};

use crate::deframer::Chunk;
use crate::reorder::ReorderBuffer;
use crate::wire::{ChunkRepr, ChunkType, Seq};

use super::send_buf::Piece;
use super::socket::{early_cost, Key, State};
use super::transmit::OutChunk;
use super::{Endpoint, Error, Event, PeerId, Socket, SocketId, SocketOptions};

/// Accepted SYNCs an endpoint remembers, so that one sent again after its connection is
/// gone is not taken for a new one: a connection rate of 4,096 per [`SYNC_RETRY_MAX`]
/// (3 s) and per shard before a late copy could be taken (about 100 KiB).
///
/// [`SYNC_RETRY_MAX`]: super::config::SYNC_RETRY_MAX
pub(super) const SEEN_SYNCS: usize = 4096;

#[derive(Debug)]
pub(super) struct Listener {
    pub(super) backlog: usize,
    pub(super) queue: VecDeque<SocketId>,
    /// Connections waiting on this port over every shard that shares the backlog
    /// ([`Endpoint::bind_shared`]); `None`: this endpoint's queue alone.
    pub(super) shared: Option<Arc<AtomicUsize>>,
    /// What the sockets it accepts get ([`Endpoint::set_listener_options`]).
    pub(super) opts: SocketOptions,
}

impl Listener {
    /// Takes a place in the backlog for a new connection; `false` when it is full.
    fn reserve(&self) -> bool {
        match &self.shared {
            None => self.queue.len() < self.backlog,
            Some(n) => n
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                    (q < self.backlog).then_some(q + 1)
                })
                .is_ok(),
        }
    }

    /// Gives back `n` places (connections accepted or reset).
    fn release(&self, n: usize) {
        if let Some(q) = &self.shared {
            let _ = q.fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_sub(n))
            });
        }
    }
}

/// Random draws of an ephemeral port before the scan (`Endpoint::ephemeral_port`): with
/// eight shards and the latency shard's sixteenth of the range, a draw is usable about one
/// time in eight, so 64 draws miss in about one connect in 5,000.
const PORT_DRAWS: u32 = 64;

impl Endpoint {
    /// Listens on virtual port `port`, keeping at most `backlog` (at least 1) established
    /// connections waiting for [`Endpoint::accept`]; further requests are refused.
    pub fn bind(&mut self, port: u16, backlog: usize) -> Result<(), Error> {
        self.bind_listener(port, backlog, None)
    }

    /// [`Endpoint::bind`] for one of several endpoints that share the port's backlog
    /// (the shards of a stack, [`ShardOf`](super::ShardOf)): `queued` counts the
    /// connections waiting on the port over all of them, and a SYNC is refused once it
    /// reaches `backlog`, whichever shard it arrives at. Give every shard the same
    /// counter, starting at 0.
    pub fn bind_shared(
        &mut self,
        port: u16,
        backlog: usize,
        queued: Arc<AtomicUsize>,
    ) -> Result<(), Error> {
        self.bind_listener(port, backlog, Some(queued))
    }

    fn bind_listener(
        &mut self,
        port: u16,
        backlog: usize,
        shared: Option<Arc<AtomicUsize>>,
    ) -> Result<(), Error> {
        if self.listeners.contains_key(&port) {
            return Err(Error::AddrInUse);
        }
        self.listeners.insert(
            port,
            Listener {
                backlog: backlog.max(1),
                queue: VecDeque::new(),
                shared,
                opts: SocketOptions::default(),
            },
        );
        Ok(())
    }

    /// Sets what the sockets `port`'s listener accepts from now on get (buffer sizes and
    /// the window their SYNC_ACK announces; `nodelay`), as options set on a listening
    /// socket pass to the sockets it accepts.
    pub fn set_listener_options(&mut self, port: u16, opts: SocketOptions) -> Result<(), Error> {
        let l = self.listeners.get_mut(&port).ok_or(Error::NotListening)?;
        l.opts = opts;
        Ok(())
    }

    /// Stops listening on `port`; connections waiting in its accept queue are reset.
    pub fn unbind(&mut self, port: u16) -> Result<(), Error> {
        let l = self.listeners.remove(&port).ok_or(Error::NotListening)?;
        l.release(l.queue.len());
        for sid in l.queue {
            self.reset(sid);
        }
        Ok(())
    }

    /// The ports listened on now.
    pub fn listening_ports(&self) -> Vec<u16> {
        self.listeners.keys().copied().collect()
    }

    /// Takes the next established connection on listening port `port`.
    pub fn accept(&mut self, port: u16) -> Result<SocketId, Error> {
        let l = self.listeners.get_mut(&port).ok_or(Error::NotListening)?;
        let sid = l.queue.pop_front().ok_or(Error::WouldBlock)?;
        l.release(1);
        Ok(sid)
    }

    /// Opens a virtual socket to port `port` of `peer`, over that peer's channels of the
    /// socket's class. Returns at once; [`Event::Connected`] or [`Event::Failed`] follows.
    pub fn connect(&mut self, peer: PeerId, port: u16, class: AppClass) -> Result<SocketId, Error> {
        self.connect_with(peer, port, class, SocketOptions::default())
    }

    /// [`Endpoint::connect`] with per-socket settings (buffer sizes, and the credit
    /// window its SYNC announces; `nodelay`).
    pub fn connect_with(
        &mut self,
        peer: PeerId,
        port: u16,
        class: AppClass,
        opts: SocketOptions,
    ) -> Result<SocketId, Error> {
        if !self
            .channels
            .values()
            .any(|c| c.peer == peer && c.class == class.channel_class())
        {
            return Err(Error::NoChannel);
        }
        let local = match opts.local_port {
            None => self.ephemeral_port(peer, port)?,
            Some(p) => {
                let taken = self.by_key.contains_key(&Key {
                    peer,
                    local: p,
                    remote: port,
                });
                if p == 0 || taken || !self.config.shard.owns(p, port) {
                    return Err(Error::AddrInUse);
                }
                p
            }
        };
        let key = Key {
            peer,
            local,
            remote: port,
        };
        let isn = self.next_isn();
        let bufs = self.config.buffers(&opts);
        let mut s = Socket::new(key, class, isn, bufs);
        s.nodelay = opts.nodelay;
        let sid = self.new_socket(s);
        let header = ChunkRepr {
            src_port: local,
            dst_port: port,
            seq: isn,
            credit: bufs.window as u32,
            ty: ChunkType::Sync,
            payload_len: 0,
        };
        debug!(socket = %sid, ?peer, local, port, "connect");
        self.queue_control(sid, header);
        self.sync_retries
            .insert(sid, (None, self.config.sync_retry));
        self.sync_retry_unset = true;
        Ok(sid)
    }

    /// Remembers an accepted SYNC (at most [`SEEN_SYNCS`], the oldest forgotten first).
    fn remember_sync(&mut self, key: Key, isn: Seq) {
        if self.seen_sync_order.len() >= SEEN_SYNCS {
            if let Some(old) = self.seen_sync_order.pop_front() {
                self.seen_syncs.remove(&old);
            }
        }
        if self.seen_syncs.insert((key, isn)) {
            self.seen_sync_order.push_back((key, isn));
        }
    }

    /// Sends again the SYNC of each connecting socket whose SYNC_ACK is overdue (see
    /// [`Config::sync_retry`](super::Config::sync_retry)); forgets sockets that are no
    /// longer connecting. Returns the earliest next try.
    pub(super) fn retry_syncs(&mut self, now: Instant) -> Option<Instant> {
        if self.sync_retries.is_empty() {
            self.sync_retry_unset = false;
            return None;
        }
        let mut again = Vec::new();
        let mut next: Option<Instant> = None;
        let sockets = &self.sockets;
        self.sync_retries.retain(|sid, (at, wait)| {
            let Some(s) = sockets.get(sid).filter(|s| s.state == State::SynSent) else {
                return false;
            };
            let t = *at.get_or_insert(now + *wait);
            if t <= now {
                again.push((*sid, s.key, s.isn, s.bufs.window as u32));
                *wait = (*wait * 2).min(super::config::SYNC_RETRY_MAX);
                *at = Some(now + *wait);
            }
            let t = at.expect("set above");
            next = Some(next.map_or(t, |n| n.min(t)));
            true
        });
        self.sync_retry_unset = false;
        for (sid, key, isn, window) in again {
            debug!(socket = %sid, ?key, "no SYNC_ACK yet; sending the SYNC again");
            self.counters.sync_retries += 1;
            let header = ChunkRepr {
                src_port: key.local,
                dst_port: key.remote,
                seq: isn,
                credit: window,
                ty: ChunkType::Sync,
                payload_len: 0,
            };
            self.queue_control(sid, header);
        }
        next
    }

    /// A random ISN, or with [`Config::first_isn`](super::Config::first_isn) set the
    /// next of a predictable series (tests).
    fn next_isn(&mut self) -> Seq {
        let Some(first) = self.config.first_isn else {
            return Seq(self.rng.gen());
        };
        let isn = Seq(first).plus(self.connections.wrapping_mul(0x9e37_79b9));
        self.connections = self.connections.wrapping_add(1);
        isn
    }

    /// A free local port for a connection to `remote` of `peer`, drawn at random from the
    /// range (a sequential choice would let a peer that sees one connection guess the next
    /// one's port). Draws come first: a scan from a random place takes the first usable
    /// port after a run of unusable ones, and the latency shard's ports fill the top of
    /// the range, so the other shards' scans that start there wrap to the lowest ports: a
    /// few ports were taken far more often than the rest, each again as soon as it was
    /// free, while chunks of the connection before could still be on their way. The scan
    /// from a random place remains for a range nearly full.
    fn ephemeral_port(&mut self, peer: PeerId, remote: u16) -> Result<u16, Error> {
        let (lo, hi) = self.config.ephemeral_ports;
        let span = u32::from(hi - lo) + 1;
        for _ in 0..PORT_DRAWS {
            let p = lo + self.rng.gen_range(0..span) as u16;
            if self.port_usable(peer, p, remote) {
                return Ok(p);
            }
        }
        let start = self.rng.gen_range(0..span);
        for i in 0..span {
            let p = lo + ((start + i) % span) as u16;
            if self.port_usable(peer, p, remote) {
                return Ok(p);
            }
        }
        Err(Error::PortsExhausted)
    }

    /// Whether local port `p` may carry a new connection to `remote` of `peer`: this
    /// shard's (a port whose chunks would be handed to another shard is not ours to use),
    /// not a listener's, and not in use to that remote port.
    fn port_usable(&self, peer: PeerId, p: u16, remote: u16) -> bool {
        self.config.shard.owns(p, remote)
            && !self.listeners.contains_key(&p)
            && !self.by_key.contains_key(&Key {
                peer,
                local: p,
                remote,
            })
    }

    pub(super) fn receive_unmatched(&mut self, ch: ChannelId, key: Key, chunk: Chunk) {
        let h = chunk.header;
        match h.ty {
            ChunkType::Sync => self.receive_sync(ch, key, h),
            ChunkType::Data | ChunkType::SyncAck => {
                // Trace, not debug: a peer chooses how many of these it sends.
                trace!(channel = %ch, ?key, ty = ?h.ty, "chunk for no socket; resetting");
                self.reply_reset(ch, key, h.seq);
            }
            // Never answer these: a late credit update or reset to a socket that is
            // already gone is harmless, and so is a FIN sent again after a channel loss
            // to a socket that took the first one and is gone.
            ChunkType::Ack
            | ChunkType::Stop
            | ChunkType::Resume
            | ChunkType::Reset
            | ChunkType::Fin => {}
        }
    }

    /// Answers a chunk for no socket (or a refused SYNC) with an unordered RESET that
    /// echoes the chunk's sequence number `seq`: the receiver applies it only to a socket
    /// that sent that position (`Socket::sent_position`), so that a late answer to an
    /// earlier connection on the same ports cannot reset the one that reuses them.
    fn reply_reset(&mut self, ch: ChannelId, key: Key, seq: Seq) {
        match self.channels.get_mut(&ch) {
            Some(c) if c.queued_replies < super::channels::MAX_QUEUED_REPLIES => {
                c.queued_replies += 1;
            }
            Some(_) => {
                self.counters.dropped_replies += 1;
                trace!(channel = %ch, ?key, "reply queue full; RESET dropped");
                return;
            }
            None => return,
        }
        let header = ChunkRepr {
            src_port: key.local,
            dst_port: key.remote,
            seq,
            credit: 0,
            ty: ChunkType::Reset,
            payload_len: 0,
        };
        self.enqueue(
            ch,
            OutChunk {
                header,
                payload: Piece::default(),
                socket: None,
            },
        );
    }

    fn receive_sync(&mut self, ch: ChannelId, key: Key, h: ChunkRepr) {
        // A SYNC sent again (`Config::sync_retry`) can arrive after the connection it
        // opened has come and gone: the same ports and initial sequence number as one
        // accepted before. Taking it would queue a phantom connection for `accept`, as a
        // late duplicate SYN would without TIME-WAIT (RFC 9293 §3.6.1); it is dropped.
        if self.seen_syncs.contains(&(key, h.seq)) {
            debug!(?key, isn = %h.seq, "SYNC of a connection accepted before; dropped");
            self.counters.duplicate_syncs += 1;
            return;
        }
        let Some(l) = self.listeners.get(&key.local) else {
            debug!(?key, "SYNC to a port nobody listens on; refusing");
            self.reply_reset(ch, key, h.seq);
            return;
        };
        if !l.reserve() {
            // As Linux drops a SYN when the accept queue is full: the client sends the
            // SYNC again (`Config::sync_retry`) and gets in once an accept makes room,
            // or times out; it is not refused.
            debug!(?key, backlog = l.backlog, "backlog full; SYNC dropped");
            self.counters.backlog_full_syncs += 1;
            return;
        }
        let held = self.peers.get(&key.peer).map_or(0, |p| p.sockets);
        if held >= self.config.max_peer_sockets || self.passive_sockets >= self.config.max_sockets {
            l.release(1);
            // Each SYNC costs the peer 16 bytes and would cost us a socket.
            debug!(
                ?key,
                held,
                total = self.passive_sockets,
                "too many sockets from peers; refusing"
            );
            self.counters.refused_syncs += 1;
            self.reply_reset(ch, key, h.seq);
            return;
        }
        let class = match self.channels[&ch].class {
            ChannelClass::Latency => AppClass::Latency,
            ChannelClass::Throughput => AppClass::Throughput,
        };
        let opts = l.opts;
        let bufs = self.config.buffers(&opts);
        let isn = self.next_isn();
        let mut s = Socket::new(key, class, isn, bufs);
        s.nodelay = opts.nodelay;
        s.passive = true;
        s.state = State::Established;
        s.peer_window = h.credit.min(1 << 30);
        s.send_limit = isn.plus(s.peer_window);
        s.rx = Some(ReorderBuffer::new(h.seq, bufs.recv));
        s.advertised = h.seq.plus(bufs.window as u32);
        s.channels_used.insert(ch);
        let sid = self.new_socket(s);
        self.remember_sync(key, h.seq);
        self.listeners
            .get_mut(&key.local)
            .expect("checked")
            .queue
            .push_back(sid);
        let header = ChunkRepr {
            src_port: key.local,
            dst_port: key.remote,
            seq: isn,
            credit: bufs.window as u32,
            ty: ChunkType::SyncAck,
            payload_len: 0,
        };
        debug!(socket = %sid, ?key, "accepted SYNC");
        self.enqueue(
            ch,
            OutChunk {
                header,
                payload: Piece::default(),
                socket: Some(sid),
            },
        );
        self.push_event(Event::Incoming { port: key.local });
        self.schedule_needed = true;
    }

    pub(super) fn establish_active(&mut self, sid: SocketId, h: ChunkRepr) {
        let s = self.sockets.get_mut(&sid).expect("caller checked");
        let (window, recv_buffer) = (s.bufs.window as u32, s.bufs.recv);
        s.state = State::Established;
        s.peer_window = h.credit.min(1 << 30);
        s.send_limit = s.next_seq.plus(s.peer_window);
        s.rx = Some(ReorderBuffer::new(h.seq, recv_buffer));
        s.advertised = h.seq.plus(window);
        let early: Vec<_> = s.early.drain(..).collect();
        debug!(socket = %sid, early = early.len(), "connected");
        self.push_event(Event::Connected(sid));
        self.push_event(Event::Writable(sid));
        self.schedule_needed = true;
        let max = self.config.max_chunk_payload;
        for (ch, chunk) in early {
            self.uncharge(ch, early_cost(&chunk, max));
            if self.channels.contains_key(&ch) {
                self.receive_established(ch, sid, chunk);
            }
        }
        // What they held (less what is parked again) is free for stalled channels.
        self.retry_stalled();
    }
}
