//! The per-host virtual-socket state machine.
//!
//! [`Endpoint`] and the state it owns are declared here, with its events and the check of
//! its internal accounting; the rest of its methods live in one child module per concept,
//! each an `impl Endpoint` block:
//!
//! - `config`: [`Config`], its validation, [`ConfigError`];
//! - `error`: [`Error`] (socket operations) and [`ChannelError`] (channel-facing operations);
//! - `socket`: [`PeerId`], [`SocketId`], a socket's state, and creating, failing and removing
//!   sockets;
//! - `send_buf`: a socket's send buffer and the endpoint's pool of send-buffer segments;
//! - `channels`: per-channel state, adding and losing channels, their load, receiving chunk
//!   bytes, the parked-byte budget;
//! - `handshake`: listeners, `bind`/`accept`/`connect`, SYNC and SYNC_ACK, RESET to chunks
//!   for no socket;
//! - `flow`: chunks of established sockets: credit, STOP/RESUME, FIN, RESET, placing data;
//! - `transmit`: cutting chunks from send buffers onto the scheduler's channels, handing them
//!   to the driver;
//! - `app`: the application-side calls (`send`, `recv`, `shutdown`, `close`, `reset`) and
//!   socket accessors.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::fmt;
use std::time::Instant;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::SeedableRng;

use netsched::{ChannelId, NetScheduler};

use crate::wire;

mod app;
mod channels;
mod config;
mod error;
mod flow;
mod handshake;
mod send_buf;
mod snapshot;
mod socket;
mod transmit;

pub use app::SocketStats;
pub use channels::{ChannelLoad, MAX_QUEUED_REPLIES};
pub use config::{Config, ConfigError, ShardOf, SocketOptions, SYNC_RETRY_MAX};
pub use error::{ChannelError, Error};
pub use socket::{PeerId, SocketId, EARLY_CHUNK_COST, RESET_ORDERED};

use channels::Channel;
use handshake::Listener;
use send_buf::SegPool;
use socket::{Key, Socket};

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
    // Local ids only (FxHash, see Cargo.toml): one insert per message.
    queued_events: rustc_hash::FxHashSet<Event>,
    /// Events raised so far ([`Endpoint::events_raised`]).
    events_pushed: u64,
    next_socket: u64,
    connections: u32,
    /// Picks ISNs and ephemeral ports (a CSPRNG: they must not be predictable).
    rng: StdRng,
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
    /// Chunks in all channels' outboxes together: `channels_with_transmit` answers an
    /// empty set without visiting the channels.
    outbox_chunks: usize,
    /// Scratch of `schedule`: the sockets of this pass and of the next.
    schedule_scratch: (Vec<SocketId>, Vec<SocketId>),
    /// Scratch of `schedule_one`: the peer's channels as the scheduler sees them.
    schedule_stats: Vec<netsched::ChannelStats>,
    /// What each peer holds: sockets its SYNCs created, bytes parked on its channels.
    peers: BTreeMap<PeerId, PeerLoad>,
    /// Sockets created by SYNCs from all peers together (bounded by
    /// [`Config::max_sockets`]).
    passive_sockets: usize,
    /// Sockets closed by the application that linger for the peer's FIN, with the time
    /// they are reset at; `None` until [`Endpoint::handle_timeout`] first sees them (the
    /// endpoint reads no clock, so a close does not know the time).
    lingering: BTreeMap<SocketId, Option<Instant>>,
    /// Some socket in `lingering` has no deadline yet.
    linger_unset: bool,
    /// No lingering deadline is before this (the earliest when it was computed; sockets
    /// removed since may have left it early). Lets `handle_timeout`, which the driver
    /// calls on every round, skip the walk over `lingering` until something is due.
    linger_next: Option<Instant>,
    /// The latest time passed to [`Endpoint::handle_timeout`].
    clock: Option<Instant>,
    /// Peers whose last channel was lost, whose sockets wait for a new one (until the
    /// deadline, set by the next `handle_timeout` like a linger deadline).
    orphaned: BTreeMap<PeerId, Orphan>,
    /// Some entry of `orphaned` has no deadline yet.
    orphan_unset: bool,
    /// Chunks to resend to a peer that has no channel left, for the next one.
    stranded: BTreeMap<PeerId, VecDeque<transmit::OutChunk>>,
    /// Channels the peer closed gracefully whose delivered chunks still wait in response
    /// queues (kept, see [`Endpoint::handle_channel_closed`]): their peer and the bytes
    /// still charged to it, given back as the chunks leave.
    closed_charges: BTreeMap<ChannelId, (PeerId, usize)>,
    /// Connecting sockets: when each sends its SYNC again (`None` until
    /// [`Endpoint::handle_timeout`] first sees it) and the wait after that.
    sync_retries: BTreeMap<SocketId, (Option<Instant>, std::time::Duration)>,
    /// Some entry of `sync_retries` has no time yet.
    sync_retry_unset: bool,
    /// No entry of `sync_retries` is due before this.
    sync_retry_next: Option<Instant>,
    /// Sockets holding a short chunk back (`nodelay` off), with when the hold ends
    /// (`None` until [`Endpoint::handle_timeout`] first sees it).
    nagle_holds: BTreeMap<SocketId, Option<Instant>>,
    /// Some entry of `nagle_holds` has no time yet.
    nagle_unset: bool,
    /// A timer was added since [`Endpoint::timers_changed`] was last asked.
    timers_changed: bool,
    /// Accepted SYNCs (ports and initial sequence number), at most
    /// [`handshake::SEEN_SYNCS`], and their order for forgetting the oldest.
    seen_syncs: HashSet<(socket::Key, crate::wire::Seq)>,
    seen_sync_order: VecDeque<(socket::Key, crate::wire::Seq)>,
    counters: EndpointCounters,
}

impl EndpointCounters {
    /// Adds another endpoint's counts to these (a stack's shards, summed).
    pub fn add(&mut self, o: &EndpointCounters) {
        self.dropped_replies += o.dropped_replies;
        self.refused_syncs += o.refused_syncs;
        self.linger_expired += o.linger_expired;
        self.channel_budget_stalls += o.channel_budget_stalls;
        self.peer_budget_stalls += o.peer_budget_stalls;
        self.rejected_epochs += o.rejected_epochs;
        self.rejected_credits += o.rejected_credits;
        self.resent_chunks += o.resent_chunks;
        self.duplicate_chunks += o.duplicate_chunks;
        self.backlog_full_syncs += o.backlog_full_syncs;
        self.sync_retries += o.sync_retries;
        self.duplicate_syncs += o.duplicate_syncs;
    }
}

/// Sockets waiting for a channel to their peer after its last one was lost.
#[derive(Debug, Clone, Copy)]
struct Orphan {
    /// When they fail; `None` until [`Endpoint::handle_timeout`] first sees the entry.
    deadline: Option<Instant>,
    /// What they fail with: the last loss's error.
    error: Error,
}

/// What one peer holds of an endpoint's memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct PeerLoad {
    /// Sockets its SYNCs created that still exist.
    sockets: usize,
    /// Bytes parked (or held early) on its channels: the sum of their `parked_bytes`.
    parked: usize,
}

/// Counts of hostile or broken input an endpoint refused or cut short, for monitoring
/// (each one is also logged at debug level). Never reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointCounters {
    /// RESET replies to chunks for unknown sockets dropped because the channel already
    /// held [`MAX_QUEUED_REPLIES`] of them unsent.
    pub dropped_replies: u64,
    /// SYNCs refused because their peer already had [`Config::max_peer_sockets`] sockets
    /// or all peers together [`Config::max_sockets`].
    pub refused_syncs: u64,
    /// Closed sockets reset because the peer's FIN (or the credit for the last bytes) did
    /// not come within [`Config::linger_timeout`].
    pub linger_expired: u64,
    /// Times a channel's reads paused because a chunk would have taken its bytes parked
    /// past [`Config::channel_budget`].
    pub channel_budget_stalls: u64,
    /// Times a channel's reads paused because a chunk would have taken its peer's bytes
    /// parked (over all its channels) past [`Config::peer_budget`].
    pub peer_budget_stalls: u64,
    /// STOP or RESUME chunks ignored because their epoch is past any the peer could have
    /// reached (two per DATA chunk sent to it).
    pub rejected_epochs: u64,
    /// Credit edges ignored because they reach past the peer's window beyond anything it
    /// could have read.
    pub rejected_credits: u64,
    /// Chunks sent again because the channel they went on (or waited for) was lost.
    pub resent_chunks: u64,
    /// DATA chunks ignored because every byte of them had arrived already (a peer sending
    /// again what a lost channel had in fact delivered).
    pub duplicate_chunks: u64,
    /// SYNCs dropped unanswered because the listener's backlog was full (the client
    /// sends them again, [`Config::sync_retry`]), as Linux drops a SYN.
    pub backlog_full_syncs: u64,
    /// SYNCs this endpoint sent again because no SYNC_ACK had come within
    /// [`Config::sync_retry`] (a peer's backlog was full).
    pub sync_retries: u64,
    /// SYNCs dropped because they repeated one accepted before (a retry that arrived
    /// after its connection was gone).
    pub duplicate_syncs: u64,
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
        let first_socket = u64::from(config.shard.index);
        let rng = match config.rng_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        Ok(Endpoint {
            config,
            scheduler: Box::new(scheduler),
            channels: BTreeMap::new(),
            sockets: BTreeMap::new(),
            by_key: BTreeMap::new(),
            listeners: BTreeMap::new(),
            events: VecDeque::new(),
            queued_events: rustc_hash::FxHashSet::default(),
            events_pushed: 0,
            next_socket: first_socket,
            connections: 0,
            rng,
            schedule_needed: false,
            spare: Vec::new(),
            sent_lent: VecDeque::new(),
            seg_pool: SegPool::default(),
            sendable: BTreeSet::new(),
            schedule_ids: Vec::new(),
            outbox_chunks: 0,
            schedule_scratch: (Vec::new(), Vec::new()),
            schedule_stats: Vec::new(),
            peers: BTreeMap::new(),
            passive_sockets: 0,
            lingering: BTreeMap::new(),
            linger_unset: false,
            linger_next: None,
            clock: None,
            orphaned: BTreeMap::new(),
            orphan_unset: false,
            stranded: BTreeMap::new(),
            closed_charges: BTreeMap::new(),
            sync_retries: BTreeMap::new(),
            sync_retry_unset: false,
            sync_retry_next: None,
            nagle_holds: BTreeMap::new(),
            nagle_unset: false,
            timers_changed: false,
            seen_syncs: HashSet::new(),
            seen_sync_order: VecDeque::new(),
            counters: EndpointCounters::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// RESET replies to chunks for unknown sockets that were dropped because the
    /// channel already held [`MAX_QUEUED_REPLIES`] of them
    /// unsent (a peer sending to sockets that do not exist while not reading).
    pub fn dropped_replies(&self) -> u64 {
        self.counters.dropped_replies
    }

    /// Counts of refused or cut-short hostile input ([`EndpointCounters`]).
    pub fn counters(&self) -> EndpointCounters {
        self.counters
    }

    /// Sockets that SYNCs from `peer` created and that still exist (bounded by
    /// [`Config::max_peer_sockets`]).
    pub fn peer_sockets(&self, peer: PeerId) -> usize {
        self.peers.get(&peer).map_or(0, |p| p.sockets)
    }

    /// Bytes parked (or held early) on all of `peer`'s channels together (bounded by
    /// [`Config::peer_budget`]).
    pub fn peer_parked_bytes(&self, peer: PeerId) -> usize {
        self.peers.get(&peer).map_or(0, |p| p.parked)
    }

    /// Sockets closed by the application that still linger for the peer's FIN (each is
    /// reset [`Config::linger_timeout`] after its close at the latest).
    pub fn lingering_sockets(&self) -> usize {
        self.lingering.len()
    }

    /// Whether a call since the last time this was asked started a timer that
    /// [`Endpoint::poll_timeout`] now reports (a short chunk held back, see
    /// [`SocketOptions::nodelay`]): a driver that sleeps until the old timeout should
    /// look again. Asking clears it.
    pub fn timers_changed(&mut self) -> bool {
        std::mem::take(&mut self.timers_changed)
    }

    /// Events raised so far (each call that raised one, merged or not): equal counts
    /// mean that no socket became readable, writable or failed in between (a reader that
    /// looked and found nothing need not look again, only register).
    pub fn events_raised(&self) -> u64 {
        self.events_pushed
    }

    /// Whether [`poll_events`](Self::poll_events) has an event to hand out.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next readiness event, if any. Drain after every call into the endpoint.
    pub fn poll_events(&mut self) -> Option<Event> {
        let e = self.events.pop_front()?;
        self.queued_events.remove(&e);
        Some(e)
    }

    /// Checks the endpoint's internal accounting: every channel's parked bytes equal
    /// what its sockets' response queues and early chunks (each at least
    /// [`EARLY_CHUNK_COST`]) hold charged to it and stay
    /// within [`Config::channel_budget`], and each peer's sum within
    /// [`Config::peer_budget`]; its queued RESET replies stay within
    /// [`MAX_QUEUED_REPLIES`]; no reorder buffer holds more than
    /// [`Config::recv_buffer`]; the send buffers stay within [`Config::send_buffer`];
    /// sockets created by SYNCs are counted right and stay within
    /// [`Config::max_peer_sockets`] per peer and [`Config::max_sockets`] in all; every
    /// closed, lingering socket has a timer; no established socket's credit edge or peer
    /// epoch is past what its peer could have granted.
    /// For tests and fuzzing (a hostile peer must never break these); `Err` names the
    /// first broken one.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        // What the sockets hold charged to a channel: parked chunks and early ones.
        let held_for = |id: ChannelId| -> usize {
            self.sockets
                .values()
                .map(|s| {
                    s.parked.charged_to(id)
                        + s.early
                            .iter()
                            .filter(|(ch, _)| *ch == id)
                            .map(|(_, c)| socket::early_cost(c, self.config.max_chunk_payload))
                            .sum::<usize>()
                })
                .sum()
        };
        for (&id, c) in &self.channels {
            let charged = held_for(id);
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
            let replies = c.outbox.iter().filter(|o| o.is_reply()).count();
            if replies != c.queued_replies || replies > MAX_QUEUED_REPLIES {
                return Err(format!(
                    "{id}: {replies} replies queued, {} counted (bound {MAX_QUEUED_REPLIES})",
                    c.queued_replies
                ));
            }
        }
        for (&id, &(_, left)) in &self.closed_charges {
            let held = held_for(id);
            if held != left || left == 0 {
                return Err(format!(
                    "closed {id}: {left} bytes still charged, sockets hold {held}"
                ));
            }
        }
        let mut parked: BTreeMap<PeerId, usize> = BTreeMap::new();
        for c in self.channels.values().filter(|c| c.parked_bytes > 0) {
            *parked.entry(c.peer).or_default() += c.parked_bytes;
        }
        for &(peer, left) in self.closed_charges.values() {
            *parked.entry(peer).or_default() += left;
        }
        let counted: BTreeMap<PeerId, usize> = self
            .peers
            .iter()
            .filter(|(_, p)| p.parked > 0)
            .map(|(&peer, p)| (peer, p.parked))
            .collect();
        if parked != counted {
            return Err(format!(
                "peers' parked bytes: channels hold {parked:?}, {counted:?} counted"
            ));
        }
        if let Some((peer, n)) = parked.iter().find(|(_, &n)| n > self.config.peer_budget) {
            return Err(format!("{peer:?}: {n} parked bytes over the peer budget"));
        }
        let mut passive: BTreeMap<PeerId, usize> = BTreeMap::new();
        for s in self.sockets.values().filter(|s| s.passive) {
            *passive.entry(s.key.peer).or_default() += 1;
        }
        let counted: BTreeMap<PeerId, usize> = self
            .peers
            .iter()
            .filter(|(_, p)| p.sockets > 0)
            .map(|(&peer, p)| (peer, p.sockets))
            .collect();
        if passive != counted {
            return Err(format!(
                "peers' sockets: {passive:?} exist, {counted:?} counted"
            ));
        }
        let total: usize = passive.values().sum();
        if total != self.passive_sockets || total > self.config.max_sockets {
            return Err(format!(
                "{total} sockets opened by peers, {} counted (bound {})",
                self.passive_sockets, self.config.max_sockets
            ));
        }
        if let Some((peer, n)) = passive
            .iter()
            .find(|(_, &n)| n > self.config.max_peer_sockets)
        {
            return Err(format!("{peer:?} holds {n} sockets over the bound"));
        }
        let detached: BTreeSet<SocketId> = self
            .sockets
            .iter()
            .filter(|(_, s)| s.detached)
            .map(|(&id, _)| id)
            .collect();
        if !detached.iter().eq(self.lingering.keys()) {
            return Err(format!(
                "{} closed sockets linger, {} timed",
                detached.len(),
                self.lingering.len()
            ));
        }
        for (sid, at) in &self.lingering {
            let Some(at) = at else {
                if !self.linger_unset {
                    return Err(format!("{sid} lingers untimed, unflagged"));
                }
                continue;
            };
            if self.linger_next.is_none_or(|next| next > *at) {
                return Err(format!("{sid}: its deadline is before the earliest noted"));
            }
            // A deadline is set from the clock, which only moves forward.
            if self
                .clock
                .is_none_or(|now| *at > now + self.config.linger_timeout)
            {
                return Err(format!("{sid} lingers past its timeout"));
            }
        }
        for (sid, s) in &self.sockets {
            if let Some(rx) = &s.rx {
                if rx.len() > s.bufs.recv {
                    return Err(format!("{sid}: reorder buffer holds {}", rx.len()));
                }
            }
            if s.state == socket::State::Established
                && (!s.credit_possible(s.send_limit) || !s.epoch_possible(s.peer_epoch))
            {
                return Err(format!(
                    "{sid}: credit edge {} or epoch {} past what the peer could grant",
                    s.send_limit, s.peer_epoch
                ));
            }
            if s.send_buf.len() > s.bufs.send {
                return Err(format!("{sid}: send buffer holds {}", s.send_buf.len()));
            }
            // Kept for resending: in order, between the data-level acknowledgement and
            // the next byte to send, within the resend buffer.
            let mut prev_end: Option<wire::Seq> = None;
            for u in &s.unacked {
                if !u.end().is_after(s.data_acked) {
                    return Err(format!("{sid}: acknowledged chunk at {} kept", u.seq));
                }
                if prev_end.is_some_and(|p| u.seq.since(p) < 0) {
                    return Err(format!("{sid}: kept chunks out of order at {}", u.seq));
                }
                if u.end().is_after(s.next_seq) {
                    return Err(format!("{sid}: kept chunk at {} past next_seq", u.seq));
                }
                prev_end = Some(u.end());
            }
            if s.next_seq.since(s.data_acked) > self.resend_bound() as i64 {
                return Err(format!(
                    "{sid}: {} bytes unacknowledged over the resend buffer",
                    s.next_seq.since(s.data_acked)
                ));
            }
        }
        for peer in self.stranded.keys() {
            if self.channels.values().any(|c| c.peer == *peer) {
                return Err(format!("{peer:?}: chunks stranded beside a channel"));
            }
        }
        Ok(())
    }

    fn push_event(&mut self, e: Event) {
        self.events_pushed = self.events_pushed.wrapping_add(1);
        if self.queued_events.insert(e) {
            self.events.push_back(e);
        }
    }
}
