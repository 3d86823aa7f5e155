//! The per-host virtual-socket state machine.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::fmt;

use bytes::{Bytes, BytesMut};

use netsched::{AppClass, ChannelClass, ChannelId, ChannelStats, ChunkInfo, NetScheduler};
use thiserror::Error;
use tracing::{debug, trace, warn};

use crate::deframer::{Chunk, Deframer};
use crate::reorder::ReorderBuffer;
use crate::response_queue::{ParkedChunk, ResponseQueue};
use crate::wire::{ChunkPacket, ChunkRepr, ChunkType, Seq, WireError, HEADER_LEN, MAX_PAYLOAD};

/// A remote host, numbered by the caller (the layer that creates channels to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerId(pub u32);

/// A virtual socket of an [`Endpoint`]. Ids are never reused within an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SocketId(u64);

impl fmt::Display for SocketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vs{}", self.0)
    }
}

/// Tunables of an [`Endpoint`]. Sizes are in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Largest chunk payload this endpoint sends and accepts (the paper's code used at most
    /// 62,620; the wire limit is 65,535).
    pub max_chunk_payload: usize,
    /// Per-socket send buffer: [`Endpoint::send`] accepts at most this many unsent bytes.
    pub send_buffer: usize,
    /// Per-socket receive buffer: the reorder window a socket holds itself. At least
    /// `max_chunk_payload`.
    pub recv_buffer: usize,
    /// How far past the application's read position the peer may send (the credit). At
    /// least `recv_buffer`; the excess over `recv_buffer` is what may end up parked in the
    /// socket's response queue, charged to channel budgets.
    pub credit_window: usize,
    /// Send a credit update once the credit edge has moved this far past the last one
    /// advertised (1 ..= `credit_window`).
    pub credit_update_threshold: usize,
    /// Per-channel budget of parked bytes (response queues charged to the channel). At
    /// least `max_chunk_payload`. When a chunk would exceed it, the endpoint stops
    /// consuming the channel's bytes (the last resort that holds the channel's window).
    pub channel_budget: usize,
    /// Local virtual ports [`Endpoint::connect`] picks from (inclusive).
    pub ephemeral_ports: (u16, u16),
    /// Initial sequence number of the first connection (later ones are spread from it);
    /// set near `u32::MAX` to exercise wrap-around.
    pub first_isn: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_chunk_payload: 62_620,
            send_buffer: 256 * 1024,
            recv_buffer: 256 * 1024,
            credit_window: 512 * 1024,
            credit_update_threshold: 128 * 1024,
            channel_budget: 2 * 1024 * 1024,
            ephemeral_ports: (49152, 65535),
            first_isn: 0x4e43_0001,
        }
    }
}

/// Why a [`Config`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// A size relation documented on [`Config`] does not hold.
    #[error("invalid configuration: {0}")]
    Invalid(&'static str),
}

impl Config {
    /// Checks the relations documented on each field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m| Err(ConfigError::Invalid(m));
        if self.max_chunk_payload == 0 || self.max_chunk_payload > MAX_PAYLOAD {
            return bad("max_chunk_payload must be 1..=65535");
        }
        if self.send_buffer == 0 {
            return bad("send_buffer must be positive");
        }
        if self.recv_buffer < self.max_chunk_payload {
            return bad("recv_buffer must be at least max_chunk_payload");
        }
        if self.credit_window < self.recv_buffer || self.credit_window > 1 << 30 {
            return bad("credit_window must be recv_buffer..=2^30");
        }
        if self.credit_update_threshold == 0 || self.credit_update_threshold > self.credit_window {
            return bad("credit_update_threshold must be 1..=credit_window");
        }
        if self.channel_budget < self.max_chunk_payload {
            return bad("channel_budget must be at least max_chunk_payload");
        }
        if self.ephemeral_ports.0 > self.ephemeral_ports.1 {
            return bad("ephemeral_ports must be a non-empty range");
        }
        Ok(())
    }
}

/// Errors of socket operations. Non-exhaustive: new failure causes (as `PeerUnreachable`
/// was) may be added without breaking callers' `match`es.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
#[non_exhaustive]
pub enum Error {
    /// The operation cannot make progress now; wait for an [`Event`].
    #[error("operation would block")]
    WouldBlock,
    /// No socket with this id (closed, or never existed).
    #[error("no such virtual socket")]
    InvalidSocket,
    /// The peer has no listener on the port, or its backlog was full.
    #[error("connection refused")]
    ConnectionRefused,
    /// The peer reset the connection (dropped its socket without shutdown, or a protocol
    /// violation was seen).
    #[error("connection reset by peer")]
    ConnectionReset,
    /// A channel this socket used was lost; chunks on it may never arrive.
    #[error("channel to the peer lost")]
    ChannelLost,
    /// A channel this socket used timed out: the peer stopped answering (keep-alive
    /// probes or retransmissions went unacknowledged), as when its host went down or the
    /// path to it was cut. Chunks on the channel may never arrive.
    #[error(
        "peer unreachable: a channel to it timed out (keep-alive or retransmissions unanswered)"
    )]
    PeerUnreachable,
    /// The socket is not connected yet.
    #[error("not connected")]
    NotConnected,
    /// The write side was shut down.
    #[error("write side already shut down")]
    WriteClosed,
    /// The virtual port is already bound.
    #[error("virtual port already in use")]
    AddrInUse,
    /// Nothing is listening on this local virtual port.
    #[error("virtual port not bound")]
    NotListening,
    /// No channel of the socket's class leads to the peer.
    #[error("no channel of the needed class to the peer")]
    NoChannel,
    /// Every ephemeral virtual port to this peer is in use.
    #[error("ephemeral virtual ports exhausted")]
    PortsExhausted,
}

impl Error {
    /// The closest [`std::io::ErrorKind`], for the tokio layer.
    pub fn kind(self) -> std::io::ErrorKind {
        use std::io::ErrorKind as K;
        match self {
            Error::WouldBlock => K::WouldBlock,
            Error::InvalidSocket | Error::NotListening => K::InvalidInput,
            Error::ConnectionRefused => K::ConnectionRefused,
            Error::ConnectionReset => K::ConnectionReset,
            Error::ChannelLost => K::ConnectionAborted,
            Error::PeerUnreachable => K::TimedOut,
            Error::NotConnected => K::NotConnected,
            Error::WriteClosed => K::BrokenPipe,
            Error::AddrInUse | Error::PortsExhausted => K::AddrInUse,
            Error::NoChannel => K::AddrNotAvailable,
        }
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(e.kind(), e)
    }
}

/// Errors of channel-facing operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ChannelError {
    /// The channel was never added, or was lost.
    #[error("unknown channel {0}")]
    UnknownChannel(ChannelId),
    /// The channel was already added.
    #[error("channel {0} already exists")]
    DuplicateChannel(ChannelId),
    /// The channel's byte stream carried a bad chunk header; the channel is treated as
    /// lost (its sockets fail with [`Error::ChannelLost`]) and must be destroyed.
    #[error("malformed chunk on channel: {0}")]
    Malformed(#[from] WireError),
}

/// Readiness news from [`Endpoint::poll_events`]. Events are coalesced: one is queued at
/// most once until it is polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// A connection waits in the accept queue of the listener on this port.
    Incoming {
        /// The listening virtual port.
        port: u16,
    },
    /// A connect completed (SYNC_ACK received).
    Connected(SocketId),
    /// [`Endpoint::recv`] can make progress (data, end of stream, or an error).
    Readable(SocketId),
    /// [`Endpoint::send`] can make progress again.
    Writable(SocketId),
    /// The socket failed (refused, reset, channel lost); its operations now return the error.
    Failed(SocketId),
    /// A channel whose reads were paused may be read again
    /// ([`Endpoint::should_pause_channel_reads`] is now false).
    ChannelUnpaused(ChannelId),
}

/// The channel layer's own statistics for a channel, fed in by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelLoad {
    /// Bytes in the channel's transmit queue, not yet sent.
    pub queued_bytes: u64,
    /// Bytes sent and not yet acknowledged.
    pub in_flight_bytes: u64,
}

/// A snapshot of one socket's buffers, for tests and monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SocketStats {
    /// Bytes accepted by `send` and not yet cut into chunks.
    pub unsent_bytes: usize,
    /// Bytes more the peer's credit allows now.
    pub send_credit: usize,
    /// Bytes held in the reorder buffer (readable plus out of order).
    pub reorder_bytes: usize,
    /// The reorder buffer's bound.
    pub reorder_capacity: usize,
    /// Bytes readable in order now.
    pub readable_bytes: usize,
    /// Bytes parked in the response queue.
    pub parked_bytes: usize,
    /// Whether the peer asked us to stop sending.
    pub peer_stopped: bool,
    /// Whether we asked the peer to stop sending.
    pub stop_sent: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    peer: PeerId,
    local: u16,
    remote: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    SynSent,
    Established,
    Failed(Error),
}

#[derive(Debug)]
struct Socket {
    key: Key,
    class: AppClass,
    state: State,
    /// Closed by the application after shutdown; lingers until FINs are exchanged.
    detached: bool,
    channels_used: BTreeSet<ChannelId>,
    // Send side.
    send_buf: SendBuf,
    next_seq: Seq,
    send_limit: Seq,
    peer_stopped: bool,
    peer_epoch: Seq,
    write_shut: bool,
    fin_sent: bool,
    write_blocked: bool,
    /// Free send-buffer bytes that wake a blocked writer ([`Endpoint::send_room`]).
    write_low_water: usize,
    // Receive side (the reorder buffer exists once the peer's ISN is known).
    rx: Option<ReorderBuffer>,
    parked: ResponseQueue,
    /// Chunks that arrived before SYNC_ACK (they may overtake it on other channels).
    early: Vec<(ChannelId, Chunk)>,
    fin_seq: Option<Seq>,
    advertised: Seq,
    stop_sent: bool,
    epoch: Seq,
    ack_pending: bool,
}

impl Socket {
    fn new(key: Key, class: AppClass, isn: Seq) -> Self {
        Socket {
            key,
            class,
            state: State::SynSent,
            detached: false,
            channels_used: BTreeSet::new(),
            send_buf: SendBuf::default(),
            next_seq: isn,
            send_limit: isn,
            peer_stopped: false,
            peer_epoch: Seq(0),
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
        }
    }

    fn credit_edge(&self, cfg: &Config) -> Option<Seq> {
        self.rx
            .as_ref()
            .map(|rx| rx.read_seq().plus(cfg.credit_window as u32))
    }

    fn send_credit(&self) -> usize {
        self.send_limit.since(self.next_seq).max(0) as usize
    }

    /// Its FIN has left and every byte up to the peer's FIN is here (read or not).
    fn finished_both_ways(&self) -> bool {
        let received_all = match (&self.rx, self.fin_seq) {
            (Some(rx), Some(fin)) => rx.contiguous_end() == fin && self.parked.is_empty(),
            _ => false,
        };
        self.state == State::Established && self.fin_sent && received_all
    }

    fn at_eof(&self) -> bool {
        match (&self.rx, self.fin_seq) {
            (Some(rx), Some(fin)) => rx.readable() == 0 && rx.read_seq() == fin,
            _ => false,
        }
    }
}

#[derive(Debug)]
struct OutChunk {
    header: ChunkRepr,
    /// Shares the socket's send-buffer segment (no copy).
    payload: Piece,
    socket: Option<SocketId>,
}

/// A piece of a send buffer: payload bytes, perhaps preceded by room for their chunk
/// header, so that header and payload leave as one `Bytes` without a copy.
#[derive(Debug, Default)]
struct Piece {
    buf: BytesMut,
    headroom: bool,
    /// The start of a buffer lent by [`Endpoint::send_chunks`]: once sent, the endpoint
    /// keeps a reference to hand the buffer back for reuse when the channel is done.
    track: bool,
    /// The start of a segment the send buffer allocated (or took from the endpoint's
    /// segment pool): once sent, the endpoint keeps a reference to put the segment back in
    /// its pool when the channel is done with it.
    recycle: bool,
}

impl Piece {
    fn data(&self) -> &[u8] {
        if self.headroom {
            &self.buf[HEADER_LEN..]
        } else {
            &self.buf
        }
    }

    fn len(&self) -> usize {
        self.buf.len() - if self.headroom { HEADER_LEN } else { 0 }
    }
}

/// A socket's send buffer: written bytes in segments of at most one chunk payload, each
/// allocated with room for a chunk header in front, so that cutting a chunk hands out the
/// segment (or a part of it) instead of a copy.
#[derive(Debug, Default)]
struct SendBuf {
    /// Filled segments, oldest first.
    segs: VecDeque<Piece>,
    /// The segment being filled (header room included once allocated); it never grows
    /// past the capacity it was made with.
    tail: BytesMut,
    len: usize,
}

/// A partly filled segment taken with at most this many bytes (times the segment size)
/// is copied out and its allocation kept for later writes; a fuller one goes as it is.
const TAIL_MOVE_FRACTION: usize = 2;

impl SendBuf {
    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn clear(&mut self) {
        *self = SendBuf::default();
    }

    /// Bytes in the segment being filled.
    fn tail_len(&self) -> usize {
        self.tail.len().saturating_sub(HEADER_LEN)
    }

    /// Appends (copies) `data`, in segments of `seg` bytes, taken from `pool` while it has
    /// any.
    fn push(&mut self, mut data: &[u8], seg: usize, pool: &mut SegPool) {
        self.len += data.len();
        while !data.is_empty() {
            if self.tail.capacity() == 0 {
                self.tail = pool.take(HEADER_LEN + seg);
                self.tail.extend_from_slice(&[0; HEADER_LEN]);
            }
            let n = (self.tail.capacity() - self.tail.len()).min(data.len());
            self.tail.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.tail_len() >= seg || self.tail.len() == self.tail.capacity() {
                self.segs.push_back(Piece {
                    buf: std::mem::take(&mut self.tail),
                    headroom: true,
                    track: false,
                    recycle: true,
                });
            }
        }
    }

    /// Appends whole segments without copying: each `BytesMut` holds `HEADER_LEN` bytes of
    /// room, then its payload (at most one segment). A partly filled tail is closed first
    /// so that the order of the bytes is kept.
    fn push_segments(&mut self, segs: impl Iterator<Item = BytesMut>) {
        if self.tail_len() > 0 {
            self.segs.push_back(Piece {
                buf: std::mem::take(&mut self.tail),
                headroom: true,
                track: false,
                recycle: true,
            });
        }
        for buf in segs {
            let n = buf.len().saturating_sub(HEADER_LEN);
            if n == 0 {
                continue;
            }
            self.len += n;
            self.segs.push_back(Piece {
                buf,
                headroom: true,
                track: true,
                recycle: false,
            });
        }
    }

    /// Takes at most `max` bytes (at least one when not empty) from the front, from one
    /// segment: a chunk shorter than `max` ends where a segment ends.
    fn take(&mut self, max: usize, seg: usize) -> Piece {
        if self.segs.is_empty() {
            let n = self.tail_len();
            if n == 0 {
                return Piece::default();
            }
            if n * TAIL_MOVE_FRACTION <= seg {
                // A small partial segment: copy it out, keep the allocation for the next
                // writes (no fresh allocation per small write).
                let piece = BytesMut::from(&self.tail[HEADER_LEN..]);
                self.tail.truncate(HEADER_LEN);
                self.segs.push_back(Piece {
                    buf: piece,
                    headroom: false,
                    track: false,
                    recycle: false,
                });
            } else {
                self.segs.push_back(Piece {
                    buf: std::mem::take(&mut self.tail),
                    headroom: true,
                    track: false,
                    recycle: true,
                });
            }
        }
        let front = self.segs.front_mut().expect("not empty");
        let out = if front.len() <= max {
            self.segs.pop_front().expect("not empty")
        } else if front.headroom {
            front.headroom = false;
            // The front part keeps the allocation's start, so it is the one that can be
            // widened back over the whole buffer for reuse.
            Piece {
                buf: front.buf.split_to(HEADER_LEN + max),
                headroom: true,
                track: std::mem::take(&mut front.track),
                recycle: std::mem::take(&mut front.recycle),
            }
        } else {
            Piece {
                buf: front.buf.split_to(max),
                headroom: false,
                track: std::mem::take(&mut front.track),
                recycle: std::mem::take(&mut front.recycle),
            }
        };
        self.len -= out.len();
        out
    }
}

/// Send-buffer segments kept for reuse: sent ones the endpoint still references, until the
/// channel drops its own reference, and idle ones for the next writes.
///
/// Without it every segment (one chunk payload, ~62 KiB) was allocated by the writing task
/// and freed by the channel thread that sent it: the allocator handed the memory back to
/// the kernel and faulted it in again (`madvise`, TLB shoot-downs, page faults), which cost
/// more than the copy into the segment (see docs/performance.md).
///
/// Bounded: at most [`SEG_POOL_IDLE`] idle segments; `sent` is swept (released segments
/// move to `idle` or are freed) whenever it has doubled since the last sweep, so it holds
/// at most about twice the segments still in the channels plus [`SEG_SWEEP_MIN`], and never
/// more than [`SENT_LENT_MAX`].
#[derive(Debug, Default)]
struct SegPool {
    idle: Vec<BytesMut>,
    sent: VecDeque<Bytes>,
    sweep_at: usize,
    /// Segments allocated and reused so far (for tests and debugging).
    allocated: u64,
    reused: u64,
}

/// Most idle send-buffer segments an endpoint keeps (~1 MiB with the default payload).
const SEG_POOL_IDLE: usize = 16;

/// `SegPool::sent` is not swept below this many entries.
const SEG_SWEEP_MIN: usize = 8;

impl SegPool {
    /// A segment of at least `cap` bytes' capacity, empty: an idle one if any (sweeping
    /// the sent ones first when none is idle), else a new allocation.
    fn take(&mut self, cap: usize) -> BytesMut {
        if self.idle.is_empty() && !self.sent.is_empty() {
            self.sweep(cap);
        }
        match self.idle.pop() {
            Some(b) => {
                self.reused += 1;
                b
            }
            None => {
                self.allocated += 1;
                BytesMut::with_capacity(cap)
            }
        }
    }

    /// Keeps a reference to a sent segment until the channel is done with it.
    fn keep_sent(&mut self, b: Bytes, cap: usize) {
        if self.sent.len() >= SENT_LENT_MAX {
            self.sent.pop_front();
        }
        self.sent.push_back(b);
        if self.sent.len() >= self.sweep_at.max(SEG_SWEEP_MIN) {
            self.sweep(cap);
        }
    }

    /// Moves every sent segment that nothing else references any more to `idle` (or
    /// frees it when `idle` is full); keeps the others in order.
    fn sweep(&mut self, cap: usize) {
        for _ in 0..self.sent.len() {
            let b = self.sent.pop_front().expect("counted");
            if !b.is_unique() {
                self.sent.push_back(b);
                continue;
            }
            if let Ok(m) = b.try_into_mut() {
                self.put(m, cap);
            }
        }
        self.sweep_at = 2 * self.sent.len();
    }

    /// Keeps `b` for reuse if there is room and it can be widened back over at least
    /// `cap` bytes without allocating.
    fn put(&mut self, mut b: BytesMut, cap: usize) {
        if self.idle.len() >= SEG_POOL_IDLE {
            return;
        }
        b.clear();
        if b.capacity() >= cap || b.try_reclaim(cap) {
            self.idle.push(b);
        }
    }
}

#[derive(Debug)]
struct Channel {
    peer: PeerId,
    class: ChannelClass,
    deframer: Deframer,
    outbox: VecDeque<OutChunk>,
    outbox_bytes: usize,
    load: ChannelLoad,
    parked_bytes: usize,
    /// A chunk that could not be parked within the budget; reads pause until it can.
    stalled: Option<Chunk>,
}

#[derive(Debug)]
struct Listener {
    backlog: usize,
    queue: VecDeque<SocketId>,
}

/// What to do with a received data chunk.
enum Placement {
    Insert,
    Park,
    Violation,
}

/// One host's virtual sockets over its channels: a deterministic, sans-IO state machine.
///
/// The caller (the channel layer, a tokio driver, or a test) owns the channels and moves
/// bytes; the endpoint never does I/O and reads no clock. The driver:
///
/// 1. registers channels with [`Endpoint::add_channel`], and reports their load with
///    [`Endpoint::set_channel_load`] whenever it changes;
/// 2. feeds every byte a channel receives to [`Endpoint::handle_chunk_bytes`], keeping the
///    bytes it does not consume, and stops offering bytes while
///    [`Endpoint::should_pause_channel_reads`] is true (until [`Event::ChannelUnpaused`]);
/// 3. after any call, drains [`Endpoint::poll_transmit`] for each channel with room and
///    writes the chunks into the channel;
/// 4. drains [`Endpoint::poll_events`] and wakes the tasks waiting on those sockets;
/// 5. calls [`Endpoint::handle_channel_lost`] when a channel dies.
///
/// The application side calls [`Endpoint::bind`], [`Endpoint::accept`],
/// [`Endpoint::connect`], [`Endpoint::send`], [`Endpoint::recv`], [`Endpoint::shutdown`],
/// [`Endpoint::close`] and [`Endpoint::reset`].
pub struct Endpoint {
    config: Config,
    scheduler: Box<dyn NetScheduler>,
    channels: BTreeMap<ChannelId, Channel>,
    sockets: BTreeMap<SocketId, Socket>,
    by_key: BTreeMap<Key, SocketId>,
    listeners: BTreeMap<u16, Listener>,
    events: VecDeque<Event>,
    queued_events: HashSet<Event>,
    next_socket: u64,
    connections: u32,
    next_ephemeral: u16,
    schedule_needed: bool,
    /// Emptied chunk buffers of the maximum payload's capacity, for the deframers to reuse
    /// (at most [`SPARE_BUFFERS`]).
    spare: Vec<Vec<u8>>,
    /// Buffers lent by [`Endpoint::send_chunks`] and sent: a reference each, until the
    /// channel drops its own and [`Endpoint::reclaim_sent`] hands them back.
    sent_lent: VecDeque<Bytes>,
    /// Send-buffer segments for reuse by every socket's plain writes.
    seg_pool: SegPool,
    /// Sockets that may have something to schedule (unsent bytes or a FIN not yet
    /// queued): [`Endpoint::schedule`] visits these only, so the cost of a call does not
    /// grow with the number of idle sockets. A socket leaves once it has nothing left.
    sendable: BTreeSet<SocketId>,
    /// Scratch list of [`Endpoint::schedule`] (kept to avoid an allocation per call).
    schedule_ids: Vec<SocketId>,
}

/// Chunk buffers an endpoint keeps for reuse (each of the maximum payload's capacity).
const SPARE_BUFFERS: usize = 32;

/// Most sent lent buffers the endpoint keeps references to; older ones are let go (freed
/// by whoever drops them last) so that an application that stops lending buffers does not
/// leave them held here.
const SENT_LENT_MAX: usize = 4096;

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("channels", &self.channels.len())
            .field("sockets", &self.sockets.len())
            .field("listeners", &self.listeners.len())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// An endpoint with no channels, sockets or listeners.
    pub fn new(
        config: Config,
        scheduler: impl NetScheduler + 'static,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let next_ephemeral = config.ephemeral_ports.0;
        Ok(Endpoint {
            config,
            scheduler: Box::new(scheduler),
            channels: BTreeMap::new(),
            sockets: BTreeMap::new(),
            by_key: BTreeMap::new(),
            listeners: BTreeMap::new(),
            events: VecDeque::new(),
            queued_events: HashSet::new(),
            next_socket: 0,
            connections: 0,
            next_ephemeral,
            schedule_needed: false,
            spare: Vec::new(),
            sent_lent: VecDeque::new(),
            seg_pool: SegPool::default(),
            sendable: BTreeSet::new(),
            schedule_ids: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    // ----------------------------------------------------------------- channels

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
                self.receive_chunk(id, chunk);
            }
        }
        if !self.channels.contains_key(&id) {
            return Err(ChannelError::UnknownChannel(id));
        }
        Ok(consumed)
    }

    /// Appends the next chunk for channel `id` (header and payload) to `out` and returns its
    /// length, or `None` when nothing is queued for the channel. Call it, after any other
    /// call, while the channel can take more bytes; data is assigned to channels by the
    /// scheduler here, so a channel that is not polled does not receive new chunks.
    pub fn poll_transmit(&mut self, id: ChannelId, out: &mut Vec<u8>) -> Option<usize> {
        let item = self.next_out(id)?;
        item.header.emit_to_vec(item.payload.data(), out);
        if item.payload.track {
            self.keep_lent(item.payload.buf.freeze());
        } else if item.payload.recycle {
            let cap = self.seg_cap();
            self.seg_pool.keep_sent(item.payload.buf.freeze(), cap);
        }
        Some(item.header.wire_len())
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
        let ch = self.channels.get_mut(&id)?;
        let mut item = ch.outbox.pop_front()?;
        ch.outbox_bytes -= item.header.wire_len();
        self.schedule_needed = true;
        if let Some(sid) = item.socket {
            if let Some(s) = self.sockets.get_mut(&sid) {
                let fresh = !matches!(item.header.ty, ChunkType::Sync | ChunkType::SyncAck);
                if let (true, Some(edge)) = (fresh, s.credit_edge(&self.config)) {
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
        let out = if item.payload.headroom {
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
        if track {
            self.keep_lent(out.clone());
        } else if recycle {
            let cap = self.seg_cap();
            self.seg_pool.keep_sent(out.clone(), cap);
        }
        Some(out)
    }

    /// Whether any chunk waits for channel `id` (after scheduling).
    pub fn has_transmit(&mut self, id: ChannelId) -> bool {
        if self.schedule_needed {
            self.schedule();
        }
        self.channels.get(&id).is_some_and(|c| !c.outbox.is_empty())
    }

    /// The next readiness event, if any. Drain after every call into the endpoint.
    pub fn poll_events(&mut self) -> Option<Event> {
        let e = self.events.pop_front()?;
        self.queued_events.remove(&e);
        Some(e)
    }

    /// Checks the endpoint's internal accounting: every channel's parked bytes equal
    /// what its sockets' response queues and early chunks hold charged to it and stay
    /// within [`Config::channel_budget`]; no reorder buffer holds more than
    /// [`Config::recv_buffer`]; the send buffers stay within [`Config::send_buffer`].
    /// For tests and fuzzing (a hostile peer must never break these); `Err` names the
    /// first broken one.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        for (&id, c) in &self.channels {
            let charged: usize = self
                .sockets
                .values()
                .map(|s| {
                    s.parked.charged_to(id)
                        + s.early
                            .iter()
                            .filter(|(ch, _)| *ch == id)
                            .map(|(_, c)| c.payload.len())
                            .sum::<usize>()
                })
                .sum();
            if charged != c.parked_bytes {
                return Err(format!(
                    "{id}: {} bytes charged, sockets hold {charged}",
                    c.parked_bytes
                ));
            }
            if c.parked_bytes > self.config.channel_budget {
                return Err(format!(
                    "{id}: {} parked bytes over the budget",
                    c.parked_bytes
                ));
            }
        }
        for (sid, s) in &self.sockets {
            if let Some(rx) = &s.rx {
                if rx.len() > self.config.recv_buffer {
                    return Err(format!("{sid}: reorder buffer holds {}", rx.len()));
                }
            }
            if s.send_buf.len() > self.config.send_buffer {
                return Err(format!("{sid}: send buffer holds {}", s.send_buf.len()));
            }
        }
        Ok(())
    }

    /// Sockets the endpoint holds (live, lingering after a graceful close, or failed and
    /// not yet closed by the application).
    pub fn socket_count(&self) -> usize {
        self.sockets.len()
    }

    // ----------------------------------------------------------------- sockets

    /// Listens on virtual port `port`, keeping at most `backlog` (at least 1) established
    /// connections waiting for [`Endpoint::accept`]; further requests are refused.
    pub fn bind(&mut self, port: u16, backlog: usize) -> Result<(), Error> {
        if self.listeners.contains_key(&port) {
            return Err(Error::AddrInUse);
        }
        self.listeners.insert(
            port,
            Listener {
                backlog: backlog.max(1),
                queue: VecDeque::new(),
            },
        );
        Ok(())
    }

    /// Stops listening on `port`; connections waiting in its accept queue are reset.
    pub fn unbind(&mut self, port: u16) -> Result<(), Error> {
        let l = self.listeners.remove(&port).ok_or(Error::NotListening)?;
        for sid in l.queue {
            self.reset(sid);
        }
        Ok(())
    }

    /// Takes the next established connection on listening port `port`.
    pub fn accept(&mut self, port: u16) -> Result<SocketId, Error> {
        let l = self.listeners.get_mut(&port).ok_or(Error::NotListening)?;
        l.queue.pop_front().ok_or(Error::WouldBlock)
    }

    /// Opens a virtual socket to port `port` of `peer`, over that peer's channels of the
    /// socket's class. Returns at once; [`Event::Connected`] or [`Event::Failed`] follows.
    pub fn connect(&mut self, peer: PeerId, port: u16, class: AppClass) -> Result<SocketId, Error> {
        if !self
            .channels
            .values()
            .any(|c| c.peer == peer && c.class == class.channel_class())
        {
            return Err(Error::NoChannel);
        }
        let local = self.ephemeral_port(peer, port)?;
        let key = Key {
            peer,
            local,
            remote: port,
        };
        let isn = self.next_isn();
        let sid = self.new_socket(Socket::new(key, class, isn));
        let header = ChunkRepr {
            src_port: local,
            dst_port: port,
            seq: isn,
            credit: self.config.credit_window as u32,
            ty: ChunkType::Sync,
            payload_len: 0,
        };
        debug!(socket = %sid, ?peer, local, port, "connect");
        self.queue_control(sid, header);
        Ok(sid)
    }

    /// Changes a socket's application class (the paper's `SO_APP_TYPE`): its later chunks
    /// go to channels of the new class. [`Error::NoChannel`] when no channel of that class
    /// leads to the socket's peer.
    pub fn set_app_class(&mut self, id: SocketId, class: AppClass) -> Result<(), Error> {
        let peer = self.live_socket(id)?.key.peer;
        if !self
            .channels
            .values()
            .any(|c| c.peer == peer && c.class == class.channel_class())
        {
            return Err(Error::NoChannel);
        }
        self.live_socket(id)?.class = class;
        self.schedule_needed = true;
        Ok(())
    }

    /// A socket's application class.
    pub fn app_class(&self, id: SocketId) -> Option<AppClass> {
        self.sockets.get(&id).map(|s| s.class)
    }

    /// The peer host and the local and remote virtual ports of a socket.
    pub fn socket_addr(&self, id: SocketId) -> Option<(PeerId, u16, u16)> {
        self.sockets
            .get(&id)
            .map(|s| (s.key.peer, s.key.local, s.key.remote))
    }

    /// Whether the socket completed its handshake (and has not failed).
    pub fn is_connected(&self, id: SocketId) -> bool {
        self.sockets
            .get(&id)
            .is_some_and(|s| s.state == State::Established)
    }

    /// A snapshot of the socket's buffers.
    pub fn socket_stats(&self, id: SocketId) -> Option<SocketStats> {
        let s = self.sockets.get(&id)?;
        Some(SocketStats {
            unsent_bytes: s.send_buf.len(),
            send_credit: s.send_credit(),
            reorder_bytes: s.rx.as_ref().map_or(0, |r| r.len()),
            reorder_capacity: self.config.recv_buffer,
            readable_bytes: s.rx.as_ref().map_or(0, |r| r.readable()),
            parked_bytes: s.parked.bytes(),
            peer_stopped: s.peer_stopped,
            stop_sent: s.stop_sent,
        })
    }

    /// Bytes the endpoint still has to hand to its channels: unsent bytes of live sockets
    /// (gracefully closing ones included), one for each shut-down socket whose FIN has
    /// not left yet, and the chunks waiting in channel outboxes (headers included). Zero
    /// once everything the application wrote (and every FIN) is in the channels.
    pub fn pending_tx_bytes(&self) -> usize {
        let sockets: usize = self
            .sockets
            .values()
            .filter(|s| !matches!(s.state, State::Failed(_)))
            .map(|s| s.send_buf.len() + usize::from(s.write_shut && !s.fin_sent))
            .sum();
        let outboxes: usize = self.channels.values().map(|c| c.outbox_bytes).sum();
        sockets + outboxes
    }

    /// Queues bytes for sending; returns how many were taken (bounded by the free space of
    /// the socket's send buffer; credit limits when they leave it). Allowed before the
    /// handshake completes. [`Error::WouldBlock`] when the buffer is full
    /// ([`Event::Writable`] follows).
    pub fn send(&mut self, id: SocketId, data: &[u8]) -> Result<usize, Error> {
        let cap = self.config.send_buffer;
        let seg = self.config.max_chunk_payload;
        // Not `live_socket`: the segment pool is borrowed beside the socket.
        let s = match self.sockets.get_mut(&id) {
            Some(s) if !s.detached => s,
            _ => return Err(Error::InvalidSocket),
        };
        if let State::Failed(e) = s.state {
            return Err(e);
        }
        if s.write_shut {
            return Err(Error::WriteClosed);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let n = cap.saturating_sub(s.send_buf.len()).min(data.len());
        if n == 0 {
            s.write_blocked = true;
            s.write_low_water = 1;
            return Err(Error::WouldBlock);
        }
        s.send_buf.push(&data[..n], seg, &mut self.seg_pool);
        self.sendable.insert(id);
        self.schedule_needed = true;
        Ok(n)
    }

    /// Free bytes in the socket's send buffer, if at least `min` (clamped to
    /// `1..=send_buffer`); otherwise [`Error::WouldBlock`], and [`Event::Writable`] follows
    /// once that much is free (a low-water mark, so that a writer with a large buffer is
    /// woken for a large copy rather than for every chunk sent). Fails like
    /// [`Endpoint::send`] on a failed or shut-down socket.
    pub(crate) fn send_room(&mut self, id: SocketId, min: usize) -> Result<usize, Error> {
        let cap = self.config.send_buffer;
        let s = self.live_socket(id)?;
        if let State::Failed(e) = s.state {
            return Err(e);
        }
        if s.write_shut {
            return Err(Error::WriteClosed);
        }
        let room = cap.saturating_sub(s.send_buf.len());
        let min = min.clamp(1, cap);
        if room < min {
            s.write_blocked = true;
            s.write_low_water = min;
            return Err(Error::WouldBlock);
        }
        Ok(room)
    }

    /// [`Endpoint::send`] of data already cut into send-buffer segments, without copying:
    /// each buffer holds [`HEADER_LEN`] bytes of room for its chunk header, then at most
    /// `max_chunk_payload` bytes. Takes buffers from the front of `segs` while they fit
    /// in the free space and returns the payload bytes taken; the rest stay in `segs`.
    /// Sent buffers come back through [`Endpoint::reclaim_sent`].
    pub(crate) fn send_chunks(
        &mut self,
        id: SocketId,
        segs: &mut Vec<BytesMut>,
    ) -> Result<usize, Error> {
        let cap = self.config.send_buffer;
        let seg = self.config.max_chunk_payload;
        let s = self.live_socket(id)?;
        if let State::Failed(e) = s.state {
            return Err(e);
        }
        if s.write_shut {
            return Err(Error::WriteClosed);
        }
        let mut room = cap.saturating_sub(s.send_buf.len());
        let mut taken = 0;
        let mut bytes = 0;
        for b in segs.iter() {
            let n = b.len().saturating_sub(HEADER_LEN);
            if n > room || n > seg {
                break;
            }
            room -= n;
            bytes += n;
            taken += 1;
        }
        if taken == 0 {
            return if segs.is_empty() {
                Ok(0)
            } else {
                s.write_blocked = true;
                s.write_low_water = 1;
                Err(Error::WouldBlock)
            };
        }
        s.send_buf.push_segments(segs.drain(..taken));
        self.sendable.insert(id);
        self.schedule_needed = true;
        Ok(bytes)
    }

    /// Reads in-order bytes. `Ok(0)` (with a non-empty `buf`) is the end of the stream:
    /// the peer shut down its write side and everything before was read.
    /// [`Error::WouldBlock`] when nothing is readable yet ([`Event::Readable`] follows).
    pub fn recv(&mut self, id: SocketId, buf: &mut [u8]) -> Result<usize, Error> {
        let max = self.config.max_chunk_payload;
        let s = match self.sockets.get_mut(&id) {
            Some(s) if !s.detached => s,
            _ => return Err(Error::InvalidSocket),
        };
        if let State::Failed(e) = s.state {
            return Err(e);
        }
        let Some(rx) = s.rx.as_mut() else {
            return Err(Error::WouldBlock);
        };
        if buf.is_empty() {
            return Ok(0);
        }
        let n = rx.read_recycling(buf, &mut self.spare, SPARE_BUFFERS, max);
        if n == 0 {
            return if s.at_eof() {
                Ok(0)
            } else {
                Err(Error::WouldBlock)
            };
        }
        self.after_read(id);
        Ok(n)
    }

    /// [`Endpoint::recv`] into `len` bytes (> 0) of the caller's, copied by `copy`: it is
    /// lent the in-order bytes (at most `len`) as the received chunks' slices and returns
    /// how many it copied. Same results, events and credit updates as `recv`.
    pub(crate) fn recv_with(
        &mut self,
        id: SocketId,
        len: usize,
        copy: impl FnOnce(&[&[u8]]) -> usize,
    ) -> Result<usize, Error> {
        let max = self.config.max_chunk_payload;
        let s = match self.sockets.get_mut(&id) {
            Some(s) if !s.detached => s,
            _ => return Err(Error::InvalidSocket),
        };
        if let State::Failed(e) = s.state {
            return Err(e);
        }
        let Some(rx) = s.rx.as_mut() else {
            return Err(Error::WouldBlock);
        };
        if len == 0 {
            return Ok(0);
        }
        let n = rx.read_with(len, &mut self.spare, SPARE_BUFFERS, max, copy);
        if n == 0 {
            return if s.at_eof() {
                Ok(0)
            } else {
                Err(Error::WouldBlock)
            };
        }
        self.after_read(id);
        Ok(n)
    }

    /// Shuts the write side: a FIN follows the bytes already sent, and the peer reads end
    /// of stream after them. Reading continues to work.
    pub fn shutdown(&mut self, id: SocketId) -> Result<(), Error> {
        let s = self.live_socket(id)?;
        if let State::Failed(e) = s.state {
            return Err(e);
        }
        s.write_shut = true;
        self.sendable.insert(id);
        self.schedule_needed = true;
        Ok(())
    }

    /// Releases the socket, as dropping a stream does. After a [`Endpoint::shutdown`] with
    /// all received data read, the socket lingers (invisible to the caller) until its bytes
    /// and FIN are sent and the peer's FIN arrives; otherwise the connection is reset.
    pub fn close(&mut self, id: SocketId) {
        let Some(s) = self.sockets.get_mut(&id) else {
            return;
        };
        if s.detached {
            return;
        }
        let graceful = s.state == State::Established
            && s.write_shut
            && s.rx.as_ref().is_some_and(|r| r.is_empty())
            && s.parked.is_empty();
        if !graceful {
            self.reset(id);
            return;
        }
        s.detached = true;
        self.maybe_reap(id);
    }

    /// Aborts the connection: a RESET goes to the peer and the socket is released.
    pub fn reset(&mut self, id: SocketId) {
        let Some(s) = self.sockets.get(&id) else {
            return;
        };
        if !matches!(s.state, State::Failed(_)) {
            let header = ChunkRepr {
                src_port: s.key.local,
                dst_port: s.key.remote,
                seq: s.next_seq,
                credit: 0,
                ty: ChunkType::Reset,
                payload_len: 0,
            };
            debug!(socket = %id, "reset");
            self.queue_control(id, header);
        }
        self.remove_socket(id);
    }

    // ----------------------------------------------------------------- internals

    fn live_socket(&mut self, id: SocketId) -> Result<&mut Socket, Error> {
        match self.sockets.get_mut(&id) {
            Some(s) if !s.detached => Ok(s),
            _ => Err(Error::InvalidSocket),
        }
    }

    fn push_event(&mut self, e: Event) {
        if self.queued_events.insert(e) {
            self.events.push_back(e);
        }
    }

    fn next_isn(&mut self) -> Seq {
        let isn = Seq(self.config.first_isn).plus(self.connections.wrapping_mul(0x9e37_79b9));
        self.connections = self.connections.wrapping_add(1);
        isn
    }

    fn ephemeral_port(&mut self, peer: PeerId, remote: u16) -> Result<u16, Error> {
        let (lo, hi) = self.config.ephemeral_ports;
        let span = u32::from(hi - lo) + 1;
        for _ in 0..span {
            let p = self.next_ephemeral;
            self.next_ephemeral = if p >= hi { lo } else { p + 1 };
            if !self.listeners.contains_key(&p)
                && !self.by_key.contains_key(&Key {
                    peer,
                    local: p,
                    remote,
                })
            {
                return Ok(p);
            }
        }
        Err(Error::PortsExhausted)
    }

    fn new_socket(&mut self, s: Socket) -> SocketId {
        let sid = SocketId(self.next_socket);
        self.next_socket += 1;
        self.by_key.insert(s.key, sid);
        self.sockets.insert(sid, s);
        sid
    }

    fn remove_socket(&mut self, id: SocketId) {
        let Some(mut s) = self.sockets.remove(&id) else {
            return;
        };
        self.by_key.remove(&s.key);
        for p in s.parked.take_all() {
            self.uncharge(p.channel, p.payload.len());
        }
        for (ch, c) in s.early.drain(..) {
            self.uncharge(ch, c.payload.len());
        }
        for l in self.listeners.values_mut() {
            l.queue.retain(|&q| q != id);
        }
        self.retry_stalled();
    }

    fn fail(&mut self, id: SocketId, err: Error) {
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
        let parked = s.parked.take_all();
        let early: Vec<_> = s.early.drain(..).collect();
        for p in parked {
            self.uncharge(p.channel, p.payload.len());
        }
        for (ch, c) in early {
            self.uncharge(ch, c.payload.len());
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

    fn uncharge(&mut self, ch: ChannelId, n: usize) {
        if let Some(c) = self.channels.get_mut(&ch) {
            debug_assert!(c.parked_bytes >= n, "uncharging more than was charged");
            c.parked_bytes = c.parked_bytes.saturating_sub(n);
        }
    }

    /// Removes a detached socket once both directions are finished.
    fn maybe_reap(&mut self, id: SocketId) {
        let Some(s) = self.sockets.get(&id) else {
            return;
        };
        if s.detached && s.fin_sent && s.at_eof() {
            debug!(socket = %id, "closed");
            self.remove_socket(id);
        }
    }

    /// Candidate channels (all classes) to `peer`, as the scheduler sees them.
    fn peer_stats(&self, peer: PeerId) -> Vec<ChannelStats> {
        self.channels
            .iter()
            .filter(|(_, c)| c.peer == peer)
            .map(|(&id, c)| stats_of(id, c))
            .collect()
    }

    fn enqueue(&mut self, ch: ChannelId, item: OutChunk) {
        if let Some(sid) = item.socket {
            if let Some(s) = self.sockets.get_mut(&sid) {
                s.channels_used.insert(ch);
            }
        }
        if let Some(c) = self.channels.get_mut(&ch) {
            c.outbox_bytes += item.header.wire_len();
            c.outbox.push_back(item);
        }
    }

    /// Queues a control chunk of socket `sid` on the channel the scheduler picks, or else
    /// the least-loaded channel of the socket's class (control chunks bypass thresholds).
    fn queue_control(&mut self, sid: SocketId, header: ChunkRepr) {
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
        let picked = self
            .scheduler
            .pick_channel(&info, &stats)
            .filter(|id| stats.iter().any(|c| c.id == *id));
        let ch = picked.or_else(|| {
            stats
                .iter()
                .filter(|c| c.class == class.channel_class())
                .min_by_key(|c| (c.queued_bytes, c.id))
                .map(|c| c.id)
        });
        match ch {
            Some(ch) => self.enqueue(
                ch,
                OutChunk {
                    header,
                    payload: Piece::default(),
                    socket: Some(sid),
                },
            ),
            None => warn!(socket = %sid, ty = ?header.ty, "no channel for control chunk; dropped"),
        }
    }

    /// Cuts chunks from send buffers, one per socket per round, onto the channels the
    /// scheduler picks, until nothing more can go; queues FINs after the last byte.
    fn schedule(&mut self) {
        self.schedule_needed = false;
        if self.sendable.is_empty() {
            return;
        }
        let mut ids = std::mem::take(&mut self.schedule_ids);
        ids.clear();
        ids.extend(self.sendable.iter().copied());
        let mut active = ids.clone();
        while !active.is_empty() {
            let mut next = Vec::new();
            for &sid in &active {
                if self.schedule_one(sid) {
                    next.push(sid);
                }
            }
            active = next;
        }
        for &sid in &ids {
            let keep = self.sockets.get(&sid).is_some_and(|s| {
                !matches!(s.state, State::Failed(_))
                    && (!s.send_buf.is_empty() || (s.write_shut && !s.fin_sent))
            });
            // A socket that queues its FIN below has nothing left after it.
            let fin_due = self.sockets.get(&sid).is_some_and(|s| {
                s.state == State::Established
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
            if s.state == State::Established && s.write_shut && !s.fin_sent && s.send_buf.is_empty()
            {
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

    /// Sends one data chunk of `sid` if it can; returns whether it did.
    fn schedule_one(&mut self, sid: SocketId) -> bool {
        let max = self.config.max_chunk_payload;
        let cap = self.config.send_buffer;
        let Some(s) = self.sockets.get(&sid) else {
            return false;
        };
        if s.state != State::Established || s.peer_stopped || s.send_buf.is_empty() {
            return false;
        }
        let len = s.send_buf.len().min(s.send_credit()).min(max);
        if len == 0 {
            return false;
        }
        let stats = self.peer_stats(s.key.peer);
        let info = ChunkInfo {
            flow: sid.0,
            class: s.class,
            len,
        };
        let Some(ch) = self.scheduler.pick_channel(&info, &stats) else {
            return false;
        };
        if !stats.iter().any(|c| c.id == ch) {
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
            State::SynSent if h.ty != ChunkType::SyncAck && h.ty != ChunkType::Reset => {
                chunk.payload.len()
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

    fn placement(&self, s: &Socket, seq: Seq, len: usize) -> Placement {
        let Some(rx) = s.rx.as_ref() else {
            return Placement::Violation;
        };
        let end = seq.plus(len as u32);
        let edge = s.credit_edge(&self.config).expect("rx exists");
        if seq.since(rx.read_seq()) < 0
            || end.is_after(edge)
            || s.fin_seq.is_some_and(|f| end.is_after(f))
        {
            return Placement::Violation;
        }
        if rx.fits(seq, len) {
            Placement::Insert
        } else {
            Placement::Park
        }
    }

    fn receive_chunk(&mut self, ch: ChannelId, chunk: Chunk) {
        let need = self.parking_need(ch, &chunk);
        let budget = self.config.channel_budget;
        let c = self.channels.get_mut(&ch).expect("caller checked");
        if need > 0 && c.parked_bytes + need > budget {
            debug!(channel = %ch, parked = c.parked_bytes, need, "channel budget exhausted; pausing reads");
            c.stalled = Some(chunk);
            return;
        }
        self.dispatch(ch, chunk);
    }

    /// Re-dispatches stalled chunks whose parking now fits their channel's budget.
    fn retry_stalled(&mut self) {
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
            self.receive_chunk(ch, chunk);
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
                ChunkType::Reset => self.fail(sid, Error::ConnectionRefused),
                _ => {
                    let n = chunk.payload.len();
                    s.early.push((ch, chunk));
                    self.channels.get_mut(&ch).expect("exists").parked_bytes += n;
                }
            },
            State::Established => self.receive_established(ch, sid, chunk),
        }
    }

    fn receive_unmatched(&mut self, ch: ChannelId, key: Key, chunk: Chunk) {
        let h = chunk.header;
        match h.ty {
            ChunkType::Sync => self.receive_sync(ch, key, h),
            ChunkType::Data | ChunkType::Fin | ChunkType::SyncAck => {
                debug!(channel = %ch, ?key, ty = ?h.ty, "chunk for no socket; resetting");
                self.reply_reset(ch, key);
            }
            // Never answer these: a late credit update or reset to a socket that is
            // already gone is harmless.
            ChunkType::Ack | ChunkType::Stop | ChunkType::Resume | ChunkType::Reset => {}
        }
    }

    fn reply_reset(&mut self, ch: ChannelId, key: Key) {
        let header = ChunkRepr {
            src_port: key.local,
            dst_port: key.remote,
            seq: Seq(0),
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
        let Some(l) = self.listeners.get(&key.local) else {
            debug!(?key, "SYNC to a port nobody listens on; refusing");
            self.reply_reset(ch, key);
            return;
        };
        if l.queue.len() >= l.backlog {
            debug!(?key, backlog = l.backlog, "backlog full; refusing");
            self.reply_reset(ch, key);
            return;
        }
        let class = match self.channels[&ch].class {
            ChannelClass::Latency => AppClass::Latency,
            ChannelClass::Throughput => AppClass::Throughput,
        };
        let isn = self.next_isn();
        let mut s = Socket::new(key, class, isn);
        s.state = State::Established;
        s.send_limit = isn.plus(h.credit.min(1 << 30));
        s.rx = Some(ReorderBuffer::new(h.seq, self.config.recv_buffer));
        s.advertised = h.seq.plus(self.config.credit_window as u32);
        s.channels_used.insert(ch);
        let sid = self.new_socket(s);
        self.listeners
            .get_mut(&key.local)
            .expect("checked")
            .queue
            .push_back(sid);
        let header = ChunkRepr {
            src_port: key.local,
            dst_port: key.remote,
            seq: isn,
            credit: self.config.credit_window as u32,
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

    fn establish_active(&mut self, sid: SocketId, h: ChunkRepr) {
        let window = self.config.credit_window as u32;
        let recv_buffer = self.config.recv_buffer;
        let s = self.sockets.get_mut(&sid).expect("caller checked");
        s.state = State::Established;
        s.send_limit = s.next_seq.plus(h.credit.min(1 << 30));
        s.rx = Some(ReorderBuffer::new(h.seq, recv_buffer));
        s.advertised = h.seq.plus(window);
        let early: Vec<_> = s.early.drain(..).collect();
        debug!(socket = %sid, early = early.len(), "connected");
        self.push_event(Event::Connected(sid));
        self.push_event(Event::Writable(sid));
        self.schedule_needed = true;
        for (ch, chunk) in early {
            self.uncharge(ch, chunk.payload.len());
            if self.channels.contains_key(&ch) {
                self.receive_established(ch, sid, chunk);
            }
        }
    }

    fn receive_established(&mut self, ch: ChannelId, sid: SocketId, chunk: Chunk) {
        let Some(s) = self.sockets.get_mut(&sid) else {
            return;
        };
        if matches!(s.state, State::Failed(_)) {
            return;
        }
        let h = chunk.header;
        if !matches!(
            h.ty,
            ChunkType::Sync | ChunkType::SyncAck | ChunkType::Reset
        ) {
            let limit = Seq(h.credit);
            if limit.is_after(s.send_limit) {
                s.send_limit = limit;
                self.schedule_needed = true;
            }
        }
        match h.ty {
            ChunkType::Data => self.receive_data(ch, sid, chunk),
            ChunkType::Ack | ChunkType::Sync | ChunkType::SyncAck => {}
            ChunkType::Stop | ChunkType::Resume => {
                if h.seq.is_after(s.peer_epoch) {
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
                if s.detached && s.at_eof() {
                    self.maybe_reap(sid);
                } else if s.at_eof() {
                    self.push_event(Event::Readable(sid));
                }
            }
            ChunkType::Reset => {
                if s.detached {
                    self.remove_socket(sid);
                } else {
                    self.fail(sid, Error::ConnectionReset);
                }
            }
        }
    }

    fn receive_data(&mut self, ch: ChannelId, sid: SocketId, chunk: Chunk) {
        let s = &self.sockets[&sid];
        if s.detached {
            // The application closed this socket and will never read: abort, like TCP.
            self.reset(sid);
            return;
        }
        let (seq, len) = (chunk.header.seq, chunk.payload.len());
        // Channels are reliable and a peer never sends a byte twice, so a chunk that
        // overlaps a parked one is hostile or broken. Checked here, on arrival, so that
        // every parked chunk is known to fit once the reader catches up (issue: two
        // overlapping parked chunks used to panic the reading task in `after_read`).
        if s.parked.overlaps(seq, len) {
            self.protocol_violation(sid, "data overlaps a parked chunk");
            return;
        }
        match self.placement(s, seq, len) {
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
                self.channels.get_mut(&ch).expect("exists").parked_bytes += n;
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
        let header = ChunkRepr {
            src_port: s.key.local,
            dst_port: s.key.remote,
            seq: s.next_seq,
            credit: 0,
            ty: ChunkType::Reset,
            payload_len: 0,
        };
        self.queue_control(sid, header);
        self.fail(sid, Error::ConnectionReset);
    }

    /// After the application read: move parked chunks that now fit into the reorder
    /// buffer, resume stalled channels, and send RESUME or a credit update when due.
    fn after_read(&mut self, sid: SocketId) {
        let threshold = self.config.credit_update_threshold;
        let half = self.config.recv_buffer / 2;
        let s = self.sockets.get_mut(&sid).expect("caller checked");
        let rx = s.rx.as_mut().expect("caller checked");
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
        if refused {
            for (ch, n) in released {
                self.uncharge(ch, n);
            }
            self.protocol_violation(sid, "parked chunk overlaps received data");
            self.retry_stalled();
            return;
        }
        if rx.readable() > 0 || s.at_eof() {
            self.push_event(Event::Readable(sid));
        }
        let s = self.sockets.get_mut(&sid).expect("exists");
        let rx_len = s.rx.as_ref().map_or(0, |r| r.len());
        let mut control = None;
        if s.stop_sent && s.parked.is_empty() && rx_len <= half {
            s.stop_sent = false;
            s.epoch = s.epoch.plus(1);
            debug!(socket = %sid, "receive buffer drained; RESUME");
            control = Some(ChunkType::Resume);
        } else if !s.ack_pending {
            let edge = s.credit_edge(&self.config).expect("rx exists");
            if edge.since(s.advertised) >= threshold as i64 {
                s.ack_pending = true;
                control = Some(ChunkType::Ack);
            }
        }
        if let Some(ty) = control {
            let header = ChunkRepr {
                src_port: s.key.local,
                dst_port: s.key.remote,
                seq: s.epoch,
                credit: 0,
                ty,
                payload_len: 0,
            };
            self.queue_control(sid, header);
        }
        let any = !released.is_empty();
        for (ch, n) in released {
            self.uncharge(ch, n);
        }
        if any {
            self.retry_stalled();
        }
    }
}

fn stats_of(id: ChannelId, c: &Channel) -> ChannelStats {
    ChannelStats {
        id,
        class: c.class,
        queued_bytes: c.load.queued_bytes + c.outbox_bytes as u64,
        in_flight_bytes: c.load.in_flight_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netsched::RoundRobin;
    use proptest::prelude::*;

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
        let mut client = Endpoint::new(cfg.clone(), RoundRobin::default()).unwrap();
        let mut server = Endpoint::new(cfg, RoundRobin::default()).unwrap();
        let ch = ChannelId(0);
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
        let mut client = Endpoint::new(cfg.clone(), RoundRobin::default()).unwrap();
        let mut server = Endpoint::new(cfg, RoundRobin::default()).unwrap();
        let ch = ChannelId(0);
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

    /// The idle pool keeps at most `SEG_POOL_IDLE` segments however many are released.
    #[test]
    fn segment_pool_is_bounded() {
        let cap = HEADER_LEN + 100;
        let mut pool = SegPool::default();
        let segs: Vec<Bytes> = (0..3 * SEG_POOL_IDLE)
            .map(|_| {
                let mut b = pool.take(cap);
                b.resize(cap, 1);
                b.freeze()
            })
            .collect();
        for s in &segs {
            pool.keep_sent(s.clone(), cap);
        }
        assert!(pool.idle.is_empty(), "all still held");
        drop(segs);
        pool.sweep(cap);
        assert_eq!(pool.idle.len(), SEG_POOL_IDLE);
        assert!(pool.sent.is_empty());
        assert!(pool
            .idle
            .iter()
            .all(|b| b.is_empty() && b.capacity() >= cap));
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
        let mut client = Endpoint::new(cfg.clone(), RoundRobin::default()).unwrap();
        let mut server = Endpoint::new(cfg, RoundRobin::default()).unwrap();
        let ch = ChannelId(0);
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

    proptest! {
        /// Whatever the write and take sizes, the send buffer hands out exactly the bytes
        /// written, in order, in pieces of 1..=max bytes that never cross a segment; with
        /// the pieces sent through a segment pool and held by the "channel" for a while,
        /// no piece's bytes change while it is held (a segment is reused only once free).
        #[test]
        fn send_buffer_hands_out_what_was_written(
            seg in 1usize..300,
            ops in proptest::collection::vec((0u8..3, 1usize..700), 1..60),
        ) {
            let mut b = SendBuf::default();
            let mut pool = SegPool::default();
            let cap = HEADER_LEN + seg;
            let mut held: VecDeque<(Bytes, Vec<u8>)> = VecDeque::new();
            let (mut written, mut taken) = (Vec::new(), Vec::new());
            let mut next = 0u8;
            for (op, n) in ops {
                if op == 0 {
                    let data: Vec<u8> = (0..n).map(|_| { next = next.wrapping_add(1); next }).collect();
                    b.push(&data, seg, &mut pool);
                    written.extend_from_slice(&data);
                } else if op == 1 {
                    // The channel is done with its oldest pieces.
                    for _ in 0..n % 4 {
                        if let Some((piece, copy)) = held.pop_front() {
                            prop_assert_eq!(&piece[..], &copy[..]);
                        }
                    }
                    prop_assert!(pool.idle.len() <= SEG_POOL_IDLE);
                    prop_assert!(pool.sent.len() < pool.sweep_at.max(SEG_SWEEP_MIN));
                    if n % 2 == 0 {
                        // After a sweep only segments something else holds (a held piece,
                        // or the buffer's own unsent part) stay referenced.
                        pool.sweep(cap);
                        prop_assert!(pool.sent.iter().all(|s| !s.is_unique()));
                        prop_assert!(pool.sent.len() <= held.len() + 1);
                    }
                } else {
                    let before = b.len();
                    let got = b.take(n, seg);
                    prop_assert!(got.len() <= n.min(seg));
                    prop_assert_eq!(got.len() == 0, before == 0);
                    prop_assert_eq!(b.len(), before - got.len());
                    prop_assert_eq!(got.data().len(), got.len());
                    if got.headroom {
                        prop_assert_eq!(got.buf.len(), HEADER_LEN + got.len());
                    }
                    taken.extend_from_slice(got.data());
                    let recycle = got.recycle;
                    let piece = got.buf.freeze();
                    if recycle {
                        pool.keep_sent(piece.clone(), cap);
                    }
                    held.push_back((piece.clone(), piece.to_vec()));
                }
                prop_assert_eq!(b.len(), written.len() - taken.len());
            }
            while !b.is_empty() {
                taken.extend_from_slice(b.take(seg, seg).data());
            }
            prop_assert_eq!(taken, written);
            for (piece, copy) in held {
                prop_assert_eq!(&piece[..], &copy[..]);
            }
        }
    }
}
