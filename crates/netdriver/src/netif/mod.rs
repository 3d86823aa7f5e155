//! A minimal host over a [`Link`]: one MAC and IPv4 address, a static neighbour table, ARP
//! answers, and a set of TCP connections.
//!
//! [`Interface::poll`] does one round of I/O:
//!
//! 1. receives a batch of frames and, for each, parses Ethernet → IPv4 (header checksum
//!    verified) → TCP (checksum verified). Anything malformed, corrupt, not addressed to
//!    this host or not understood is dropped and counted in [`InterfaceStats`]; no frame
//!    can make it panic. A segment goes to the connection with its 4-tuple, or opens a
//!    connection if it is a SYN to a listening port with room in its backlog, or is
//!    answered with a SYN cookie when the backlog is full (RFC 4987 §3.6, see
//!    [`syncookie`](crate::tcp::syncookie); the connection is created when the cookie
//!    comes back in a valid ACK), or is answered with a reset
//!    ([`rst_for_unexpected`](crate::tcp::rst_for_unexpected));
//! 2. fires every connection's due timer;
//! 3. asks the connections, in turn, for segments, writing each payload straight into a tx
//!    frame of the link and then the TCP, IPv4 and Ethernet headers in front of it (the
//!    payload is copied once, from the send buffer to the frame; see
//!    [`TX_HEADROOM`](crate::link::TX_HEADROOM) for why that needs headroom), and flushes
//!    the link;
//! 4. forgets connections that have closed (once their received data has been read).
//!
//! # Offloads
//!
//! The interface uses what its link offloads ([`Link::offloads`], see
//! [`crate::link`]): with segmentation, connections emit super-segments of up to 64 KiB
//! ([`Config::max_super_segment`]) into tx buffers large enough for them, with the TCP
//! checksum left partial for the link to complete; with checksum offload alone, every
//! segment's checksum is left to the link and payloads are copied without being summed;
//! a received frame whose checksum the link vouches for ([`RxMeta::checksum_verified`])
//! is not verified again. [`InterfaceConfig::large_segments`] and
//! [`InterfaceConfig::checksum_offload`] turn the use of each off. Received segments of
//! any length (a link's coalesced ones) are accepted whatever MSS was advertised.
//!
//! [`Interface::poll_at`] says when to poll next without new frames. Nothing here reads a
//! clock: the same inputs give the same frames, which the seeded simulations rely on.
//!
//! # Hooks for several interfaces sharing one address
//!
//! The channel layer runs one `Interface` per NIC queue, all with the same MAC and IPv4
//! address, and the peer (not we) chooses the queue a segment arrives on. A segment for a
//! connection that another queue's interface owns must then not be answered with a reset.
//! [`Interface::poll_with`] consults a callback for every TCP segment whose 4-tuple has no
//! connection here (a [`StraySegment`]), *before* it would open a passive connection or
//! answer with a RST; the callback may take the frame away ([`StrayVerdict::Forwarded`]),
//! have it dropped, or let the usual processing go on. [`Interface::receive_frame`] feeds
//! such a forwarded frame to the owning interface, and [`Interface::connect_from`] opens a
//! connection from a local port that a shared allocator chose. The callback is plain
//! input, so the interface stays deterministic.
//!
//! # Files
//!
//! - this file: [`Interface`], its configuration, counters and errors, the public API
//!   and the poll loop;
//! - `conns`: the connection table: slots, [`ConnHandle`]s, lookup, insertion, removal,
//!   ephemeral ports, and what a poll does with connections that closed;
//! - `ingress`: receiving: parsing and checksums, dispatch to connections, ARP,
//!   TIME-WAIT record lookups, the [`RxDrop`] fault injection;
//! - `listen`: listeners: backlogs, passive opens, SYN cookies, held accepts;
//! - `stray`: segments for no connection: the hook, its verdicts, RST answers;
//! - `egress`: transmitting: control frames, the round-robin over connections, frame
//!   headers, checksum offload and super-segments.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::RangeInclusive;
use std::sync::Arc;

use crate::link::{Link, RxMeta};
use crate::tcp::isn::IsnGenerator;
use crate::tcp::syncookie::SynCookies;
use crate::tcp::time_wait::TimeWaitTable;
use crate::tcp::{Config, Connection, State, TcpError};
use crate::time::Instant;
use crate::wire::{ipv4, EthernetAddress};

#[cfg(test)]
mod chain_tests;
mod conns;
mod egress;
mod ingress;
mod listen;
mod stray;
#[cfg(test)]
mod tests;

pub use conns::{ConnHandle, MAX_CLOSED_EVENTS};
pub use ingress::RxDrop;
pub use stray::{StrayHook, StraySegment, StrayVerdict};

use conns::{forgettable, time_wait_record, Slot};
use egress::{Control, PAYLOAD_AT};
use listen::{handshake_over, Listener};

/// IPv4 plus a TCP header without options: what the MSS leaves out of the IP MTU.
const IP_TCP_MIN_HEADERS: usize = ipv4::HEADER_LEN + 20;

/// How an [`Interface`] is set up.
#[derive(Debug, Clone)]
pub struct InterfaceConfig {
    /// This host's Ethernet address.
    pub mac: EthernetAddress,
    /// This host's IPv4 address.
    pub ipv4: Ipv4Addr,
    /// Configuration of every connection. Its `mss` is lowered, if need be, to what the
    /// link's MTU allows (MTU − 40).
    pub tcp: Config,
    /// Local ports for [`Interface::connect`], tried in order from where the last one was
    /// found (sequential, so simulations are reproducible).
    pub ephemeral_ports: RangeInclusive<u16>,
    /// Most connections (of all states) at once; further SYNs are dropped and
    /// [`Interface::connect`] fails. Passively opened connections in TIME-WAIT do not
    /// count: they leave the table for a TIME-WAIT record (see `max_time_wait`).
    pub max_connections: usize,
    /// Most TIME-WAIT records kept for passively opened connections that closed first
    /// ([`time_wait`](crate::tcp::time_wait): a few dozen bytes each, in place of the
    /// connection). When the table is full the record that ends first is dropped
    /// ([`InterfaceStats::time_wait_evicted`]). Default [`DEFAULT_MAX_TIME_WAIT`].
    pub max_time_wait: usize,
    /// Key for initial sequence numbers; `None` draws a random one. Fix it for
    /// reproducible runs.
    pub isn_key: Option<[u8; 16]>,
    /// Most frames received per [`Interface::poll`] (the rx batch).
    pub rx_batch: usize,
    /// Most frames sent per [`Link::tx_batch`] call.
    pub tx_batch: usize,
    /// IPv4 time to live of outgoing datagrams.
    pub ttl: u8,
    /// Accept TCP segments whose checksum field holds only the pseudo-header sum (a Linux
    /// sender's `CHECKSUM_PARTIAL`, left incomplete because the link is host-local and
    /// never computes it, as on veth). Such segments carry no check of their bytes, so set
    /// this only for links that cannot corrupt data (veth, a trusted in-host link); real
    /// NICs keep full verification. Counted in [`InterfaceStats::rx_partial_checksum`].
    /// Off by default.
    pub accept_partial_checksums: bool,
    /// Answer SYNs with SYN cookies (RFC 4987 §3.6) instead of dropping them when a
    /// listener's backlog or the connection table is full, so that a spoofed-SYN flood
    /// does not lock real peers out until its half-open connections time out. Connections
    /// opened from a cookie run without window scaling, SACK and timestamps
    /// ([`syncookie`](crate::tcp::syncookie)). On by default.
    pub syn_cookies: bool,
    /// The cookie secret, shared by every interface answering for this address (a peer's
    /// ACK may arrive on another NIC queue than its SYN). `None`: a fresh secret from the
    /// OS's random generator. Fix it for reproducible runs.
    pub syn_cookie_secret: Option<Arc<SynCookies>>,
    /// Send super-segments when the link segments them (TSO/GSO, [`Link::offloads`]):
    /// sets [`Config::max_super_segment`] of every connection from the link. On by
    /// default; a link without segmentation is unaffected.
    pub large_segments: bool,
    /// Leave TCP checksums to the link when it completes them ([`Link::offloads`]); sets
    /// [`Config::checksum_offload`]. On by default; segmentation needs it, so turning it
    /// off turns super-segments off too.
    pub checksum_offload: bool,
}

impl Default for InterfaceConfig {
    /// A locally administered MAC 02:00:00:00:00:01, 10.0.0.1, default TCP settings,
    /// ephemeral ports 49152–65535 (IANA), 1024 connections, batches of 64.
    fn default() -> Self {
        InterfaceConfig {
            mac: EthernetAddress([0x02, 0, 0, 0, 0, 1]),
            ipv4: Ipv4Addr::new(10, 0, 0, 1),
            tcp: Config::default(),
            ephemeral_ports: 49152..=65535,
            max_connections: 1024,
            max_time_wait: DEFAULT_MAX_TIME_WAIT,
            isn_key: None,
            rx_batch: 64,
            tx_batch: 64,
            ttl: 64,
            accept_partial_checksums: false,
            syn_cookies: true,
            syn_cookie_secret: None,
            large_segments: true,
            checksum_offload: true,
        }
    }
}

/// Default of [`InterfaceConfig::max_time_wait`]: 65,536 records (about 6 MiB) per
/// interface, so that a server closing first at 1,000 connections/s keeps each for the
/// full 60 s. Linux keeps up to 2^18 per host by default (`tcp_max_tw_buckets`).
pub const DEFAULT_MAX_TIME_WAIT: usize = 65_536;

/// Why an [`Interface`] operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NetifError {
    /// No neighbour-table entry for the remote address (add one with
    /// [`Interface::add_neighbor`]).
    #[error("no neighbour entry for the remote address")]
    NoNeighbor,
    /// Every ephemeral port is in use towards this remote address.
    #[error("no free ephemeral port")]
    NoFreePort,
    /// [`InterfaceConfig::max_connections`] reached.
    #[error("too many connections")]
    TooManyConnections,
    /// The port is already listening.
    #[error("address in use")]
    AddrInUse,
}

/// Counters of an [`Interface`]; all only grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InterfaceStats {
    /// Frames received from the link.
    pub rx_frames: u64,
    /// Frames for another MAC or IPv4 address.
    pub rx_not_ours: u64,
    /// Frames too short, or with an impossible length or field, at any layer.
    pub rx_malformed: u64,
    /// IPv4 headers or TCP segments whose checksum does not verify.
    pub rx_bad_checksum: u64,
    /// TCP segments accepted with a partial checksum (pseudo-header only) because
    /// [`InterfaceConfig::accept_partial_checksums`] is set; not in `rx_bad_checksum`.
    pub rx_partial_checksum: u64,
    /// Frames of other EtherTypes or IP protocols, IPv4 fragments, unsupported ARP.
    pub rx_unsupported: u64,
    /// TCP segments delivered to a connection.
    pub rx_segments: u64,
    /// Segments for no connection (answered with RST unless they were one).
    pub rx_no_connection: u64,
    /// SYNs dropped because the listener's backlog or the connection table was full
    /// (with SYN cookies off), and valid cookie ACKs dropped because the listener's
    /// established unaccepted connections or the connection table were at their limit.
    pub syn_dropped: u64,
    /// SYN-ACKs sent with a SYN cookie (RFC 4987) because a backlog or the connection
    /// table was full.
    pub syn_cookies_sent: u64,
    /// ACKs whose SYN cookie verified: each opened a connection.
    pub syn_cookies_accepted: u64,
    /// ACKs for no connection, to a listening port while cookies were in use, whose
    /// cookie did not verify or had expired (answered with RST).
    pub syn_cookies_rejected: u64,
    /// ARP packets received and understood.
    pub rx_arp: u64,
    /// TCP segments sent (RSTs included).
    pub tx_segments: u64,
    /// RSTs sent for segments that matched no connection.
    pub tx_rst: u64,
    /// ARP replies sent.
    pub tx_arp_replies: u64,
    /// Times a connection was skipped in a tx phase because its remote's MAC is unknown
    /// (its segments stay queued in the connection).
    pub tx_no_neighbor: u64,
    /// Control frames (RST, ARP reply) dropped because their queue was full.
    pub tx_control_dropped: u64,
    /// Headers that failed to emit (should stay 0: it means a bug, reported not panicked).
    pub tx_emit_errors: u64,
    /// Connections opened (active and passive).
    pub connections_opened: u64,
    /// Connections forgotten after closing.
    pub connections_removed: u64,
    /// Stray segments the [`Interface::poll_with`] callback forwarded elsewhere.
    pub rx_forwarded: u64,
    /// Stray segments the [`Interface::poll_with`] callback had dropped.
    pub rx_stray_dropped: u64,
    /// TCP segments whose checksum the link vouched for ([`RxMeta::checksum_verified`]):
    /// not verified here.
    pub rx_checksum_offloaded: u64,
    /// Received frames longer than the link's largest frame (segments a link coalesced, or
    /// a peer's super-segment a host-local link carried whole).
    pub rx_large_frames: u64,
    /// Frames received as a chain of buffers whose first buffer does not hold the
    /// Ethernet, IPv4 and TCP headers whole: refused, never gathered (no link builds
    /// them; see [`Link::recv_batch_parts`](crate::link::Link::recv_batch_parts)).
    pub rx_chain_headers_split: u64,
    /// Frames received as a chain of buffers (more than one) and parsed where they lie.
    pub rx_chains: u64,
    /// Super-segments handed to the link to cut into wire segments.
    pub tx_super_segments: u64,
    /// Segments sent with their checksum left to the link.
    pub tx_checksum_offloaded: u64,
    /// Segments whose payload went to the link as slices of the application's shared
    /// buffers, behind headers written alone ([`Link::tx_batch_gather`](crate::link::Link::tx_batch_gather)).
    pub tx_payload_gathered: u64,
    /// SYNs and valid cookie ACKs dropped because their listener was held
    /// ([`Interface::hold_accepts`]: the application's accept queue was full); also
    /// counted in `syn_dropped`.
    pub accept_queue_full: u64,
    /// Passively opened connections that entered TIME-WAIT and left the connection table
    /// for a TIME-WAIT record.
    pub time_wait_records: u64,
    /// TIME-WAIT records dropped before their end to make room for newer ones.
    pub time_wait_evicted: u64,
    /// Segments answered or ignored by a TIME-WAIT record.
    pub rx_time_wait: u64,
    /// New SYNs that ended a TIME-WAIT (RFC 6191), record or connection.
    pub time_wait_reopened: u64,
}

/// Everything but the link, so that the link's callbacks can borrow it.
#[derive(Debug)]
struct Core {
    config: InterfaceConfig,
    isn: IsnGenerator,
    cookies: Arc<SynCookies>,
    neighbors: HashMap<Ipv4Addr, EthernetAddress>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    /// `(local, remote)` → slot index.
    by_tuple: HashMap<(SocketAddrV4, SocketAddrV4), u32>,
    /// The last 4-tuple `receive_tcp` found in `by_tuple`, and its slot: a bulk flow's
    /// segments arrive back to back, so comparing 12 bytes spares hashing the tuple (SipHash)
    /// for nearly every segment. Cleared whenever a connection is removed.
    last_flow: Option<((SocketAddrV4, SocketAddrV4), u32)>,
    listeners: rustc_hash::FxHashMap<u16, Listener>,
    control: VecDeque<Control>,
    next_port: u16,
    ip_ident: u16,
    stats: InterfaceStats,
    /// Slots that may still have something to send in the current poll's tx phase (reused
    /// between polls). A slot leaves it once it has nothing more, so finding the next
    /// segment costs O(1) per frame however many idle connections (TIME-WAIT, waiting
    /// for data) the interface holds, instead of a scan over every slot.
    tx_ready: Vec<u32>,
    /// Connections removed after closing, with their error, until the application looks
    /// (oldest dropped beyond [`MAX_CLOSED_EVENTS`]).
    closed: VecDeque<(ConnHandle, Option<TcpError>)>,
    /// Set when the last poll stopped sending because the link had no tx buffers.
    tx_blocked_at: Option<Instant>,
    /// The last poll's receive batch was full (frames may wait on the link).
    rx_batch_full: bool,
    live: usize,
    /// Fault injection: received data segments to drop ([`Interface::drop_received`]).
    rx_drop: Option<RxDrop>,
    /// The link's largest frame ([`Link::max_frame_len`]).
    link_frame_len: usize,
    /// A stray segment's frame with its checksum completed, when the link vouched for it
    /// and left the field stale (the stray hook's frames carry valid checksums).
    stray_scratch: Vec<u8>,
    /// TIME-WAIT records of passively opened connections that closed first.
    time_wait: TimeWaitTable,
}

/// A minimal host over a link. See the [module documentation](self).
#[derive(Debug)]
pub struct Interface<L: Link> {
    link: L,
    core: Core,
}

impl<L: Link> Interface<L> {
    /// A host on `link` configured by `config`.
    pub fn new(link: L, mut config: InterfaceConfig) -> Self {
        let mss_cap = link.mtu().saturating_sub(IP_TCP_MIN_HEADERS);
        let mss_cap = u16::try_from(mss_cap).unwrap_or(u16::MAX);
        config.tcp.mss = config.tcp.mss.min(mss_cap);
        // Offloads: what the link does and the configuration allows.
        let offloads = link.offloads();
        let segments = config.large_segments
            && config.checksum_offload
            && offloads.segments(link.max_frame_len());
        config.tcp.max_super_segment = if segments {
            offloads.tx_segmentation.saturating_sub(PAYLOAD_AT)
        } else {
            0
        };
        config.tcp.checksum_offload = config.checksum_offload && offloads.tx_checksum;
        let link_frame_len = link.max_frame_len();
        let isn = match config.isn_key {
            Some(key) => IsnGenerator::with_key(key),
            None => IsnGenerator::new(),
        };
        let next_port = *config.ephemeral_ports.start();
        let time_wait = TimeWaitTable::new(config.max_time_wait);
        let cookies = config
            .syn_cookie_secret
            .clone()
            .unwrap_or_else(|| Arc::new(SynCookies::new()));
        Interface {
            link,
            core: Core {
                config,
                isn,
                cookies,
                neighbors: HashMap::new(),
                slots: Vec::new(),
                free_slots: Vec::new(),
                by_tuple: HashMap::new(),
                last_flow: None,
                listeners: rustc_hash::FxHashMap::default(),
                control: VecDeque::new(),
                closed: VecDeque::new(),
                next_port,
                ip_ident: 0,
                stats: InterfaceStats::default(),
                tx_ready: Vec::new(),
                tx_blocked_at: None,
                rx_batch_full: false,
                live: 0,
                rx_drop: None,
                link_frame_len,
                stray_scratch: Vec::new(),
                time_wait,
            },
        }
    }

    /// TIME-WAIT records held (see [`InterfaceConfig::max_time_wait`]).
    pub fn time_wait_count(&self) -> usize {
        self.core.time_wait.len()
    }

    /// The configuration (with the MSS as clamped to the link).
    pub fn config(&self) -> &InterfaceConfig {
        &self.core.config
    }

    /// The link.
    pub fn link(&self) -> &L {
        &self.link
    }

    /// The link, mutably.
    pub fn link_mut(&mut self) -> &mut L {
        &mut self.link
    }

    /// The counters.
    pub fn stats(&self) -> InterfaceStats {
        self.core.stats
    }

    /// Fault injection: installs (or with `None` removes) a rule dropping received data
    /// segments ([`RxDrop`]; its counters start from 0).
    pub fn drop_received(&mut self, rule: Option<RxDrop>) {
        self.core.rx_drop = rule.map(|r| RxDrop {
            seen: 0,
            dropped: 0,
            ..r
        });
    }

    /// The installed [`RxDrop`] rule with its counters, if any.
    pub fn rx_drop(&self) -> Option<RxDrop> {
        self.core.rx_drop
    }

    /// Adds (or replaces) a static neighbour entry: `ip` is reachable at `mac`.
    pub fn add_neighbor(&mut self, ip: Ipv4Addr, mac: EthernetAddress) {
        self.core.neighbors.insert(ip, mac);
        for slot in &mut self.core.slots {
            if let Some(conn) = &slot.conn {
                if *conn.remote().ip() == ip {
                    slot.remote_mac = Some(mac);
                }
            }
        }
    }

    /// Starts listening on `port`, keeping at most `backlog` connections that have not
    /// been accepted yet (half-open ones included); SYNs beyond that are answered with SYN
    /// cookies ([`InterfaceConfig::syn_cookies`]) or, with cookies off, dropped (the peer
    /// retries). Connections opened from cookies may take the queue up to twice
    /// `backlog`: they only need fewer than `backlog` *established* connections waiting.
    pub fn listen(&mut self, port: u16, backlog: usize) -> Result<(), NetifError> {
        if self.core.listeners.contains_key(&port) {
            return Err(NetifError::AddrInUse);
        }
        self.core.listeners.insert(
            port,
            Listener {
                backlog,
                queue: VecDeque::new(),
                held: false,
            },
        );
        Ok(())
    }

    /// Stops listening on `port`; connections not yet accepted are aborted.
    pub fn unlisten(&mut self, port: u16) {
        if let Some(listener) = self.core.listeners.remove(&port) {
            for h in listener.queue {
                if let Some(slot) = self.core.slot_mut(h) {
                    slot.listener = None;
                    if let Some(conn) = &mut slot.conn {
                        conn.abort();
                    }
                }
            }
        }
    }

    /// Whether some listener holds a connection, its handshake over or not: `false`
    /// means [`accept`](Self::accept) finds nothing on any port (a cheaper question for a
    /// driver that asks every round).
    pub fn accept_pending(&self) -> bool {
        self.core.listeners.values().any(|l| !l.queue.is_empty())
    }

    /// Holds (`true`) or releases connections to `port` for a driver whose application
    /// accept queue is full. While held, connections that complete their handshake stay
    /// queued here, established (their peers may send; the window bounds what waits), and
    /// do not keep the interface from settling; new SYNs and cookie ACKs to the port are
    /// dropped, as Linux drops them while a listener's accept queue is full
    /// (`LINUX_MIB_LISTENOVERFLOWS`): the peer retransmits and gets in once the application
    /// accepts. Nothing is reset, and the backlog bounds what waits.
    pub fn hold_accepts(&mut self, port: u16, hold: bool) {
        if let Some(l) = self.core.listeners.get_mut(&port) {
            l.held = hold;
        }
    }

    /// The oldest connection to `port` that has completed its handshake and not been
    /// accepted yet.
    pub fn accept(&mut self, port: u16) -> Option<ConnHandle> {
        let core = &mut self.core;
        let listener = core.listeners.get_mut(&port)?;
        let slots = &core.slots;
        let i = listener
            .queue
            .iter()
            .position(|&h| handshake_over(slots, h))?;
        let h = listener.queue.remove(i)?;
        if let Some(slot) = core.slots.get_mut(h.index as usize) {
            slot.listener = None;
        }
        Some(h)
    }

    /// Opens a connection to `remote` from an ephemeral port (active open). The SYN leaves
    /// at the next [`poll`](Interface::poll).
    pub fn connect(
        &mut self,
        remote: SocketAddrV4,
        now: Instant,
    ) -> Result<ConnHandle, NetifError> {
        let core = &mut self.core;
        let mac = *core
            .neighbors
            .get(remote.ip())
            .ok_or(NetifError::NoNeighbor)?;
        if core.live >= core.config.max_connections {
            return Err(NetifError::TooManyConnections);
        }
        let local = core.ephemeral_port(remote)?;
        let isn = core.isn.generate(now, local, remote);
        let mut conn = Connection::connect(core.config.tcp.clone(), local, remote, isn, now);
        conn.set_ts_offset(core.isn.ts_offset(local, remote));
        Ok(core.insert(conn, Some(mac), None))
    }

    /// Opens a connection to `remote` from local port `local_port` (active open), for a
    /// caller that allocates ports itself (several interfaces sharing one address must not
    /// pick the same port). Fails with [`NetifError::AddrInUse`] when that 4-tuple exists
    /// or the port is listening. The SYN leaves at the next [`poll`](Interface::poll).
    pub fn connect_from(
        &mut self,
        local_port: u16,
        remote: SocketAddrV4,
        now: Instant,
    ) -> Result<ConnHandle, NetifError> {
        let core = &mut self.core;
        let mac = *core
            .neighbors
            .get(remote.ip())
            .ok_or(NetifError::NoNeighbor)?;
        if core.live >= core.config.max_connections {
            return Err(NetifError::TooManyConnections);
        }
        let local = SocketAddrV4::new(core.config.ipv4, local_port);
        if core.by_tuple.contains_key(&(local, remote)) || core.listeners.contains_key(&local_port)
        {
            return Err(NetifError::AddrInUse);
        }
        let isn = core.isn.generate(now, local, remote);
        let mut conn = Connection::connect(core.config.tcp.clone(), local, remote, isn, now);
        conn.set_ts_offset(core.isn.ts_offset(local, remote));
        Ok(core.insert(conn, Some(mac), None))
    }

    /// The connection with this 4-tuple, if any.
    pub fn lookup(&self, local: SocketAddrV4, remote: SocketAddrV4) -> Option<ConnHandle> {
        let index = *self.core.by_tuple.get(&(local, remote))?;
        let slot = self.core.slots.get(index as usize)?;
        slot.conn.as_ref().map(|_| ConnHandle {
            index,
            generation: slot.generation,
        })
    }

    /// Processes one frame as if the link had just delivered it (a frame another
    /// interface received and forwarded here). Stray segments get the usual processing;
    /// nothing is sent until the next poll.
    pub fn receive_frame(&mut self, now: Instant, frame: &[u8]) {
        self.receive_frame_with(now, frame, &mut |_| StrayVerdict::Local);
    }

    /// [`receive_frame`](Interface::receive_frame) with a callback for stray segments, as
    /// in [`poll_with`](Interface::poll_with).
    pub fn receive_frame_with(&mut self, now: Instant, frame: &[u8], stray: &mut StrayHook<'_>) {
        self.core.receive(now, frame, RxMeta::default(), stray);
    }

    /// [`receive_frame_with`](Interface::receive_frame_with) with what the link that
    /// received the frame knows of it (a frame taken from another link by hand).
    pub fn receive_frame_meta(
        &mut self,
        now: Instant,
        frame: &[u8],
        meta: RxMeta,
        stray: &mut StrayHook<'_>,
    ) {
        self.core.receive(now, frame, meta, stray);
    }

    /// [`receive_frame_meta`](Interface::receive_frame_meta) for a frame held in several
    /// buffers, in order, as [`Link::recv_batch_parts`] lends a chained frame.
    pub fn receive_parts_meta(
        &mut self,
        now: Instant,
        parts: &[&[u8]],
        meta: RxMeta,
        stray: &mut StrayHook<'_>,
    ) {
        self.core.receive_parts(now, parts, meta, stray);
    }

    /// The connection behind `h`, if it still exists.
    pub fn conn(&self, h: ConnHandle) -> Option<&Connection> {
        self.core.slot(h)?.conn.as_ref()
    }

    /// The MAC address segments of `h` are sent to (the neighbour entry, or for a passive
    /// open without one, the source of the SYN or cookie ACK).
    pub fn remote_mac(&self, h: ConnHandle) -> Option<EthernetAddress> {
        self.core.slot(h)?.conn.as_ref()?;
        self.core.slot(h)?.remote_mac
    }

    /// The connection behind `h`, mutably, if it still exists.
    pub fn conn_mut(&mut self, h: ConnHandle) -> Option<&mut Connection> {
        self.core.slot_mut(h)?.conn.as_mut()
    }

    /// The oldest record of a connection removed after closing: its handle and the error it
    /// failed with (`None` for an orderly close). [`poll`](Interface::poll) forgets a
    /// connection once it is closed and nothing is left to read, so this is how the
    /// application learns why a handle stopped resolving. At most [`MAX_CLOSED_EVENTS`]
    /// records are kept; older ones are dropped.
    pub fn pop_closed(&mut self) -> Option<(ConnHandle, Option<TcpError>)> {
        self.core.closed.pop_front()
    }

    /// Handles of every connection, in table order.
    pub fn handles(&self) -> impl Iterator<Item = ConnHandle> + '_ {
        self.core.slots.iter().enumerate().filter_map(|(i, s)| {
            s.conn.as_ref().map(|_| ConnHandle {
                index: i as u32,
                generation: s.generation,
            })
        })
    }

    /// Number of connections in the table (all states).
    pub fn connection_count(&self) -> usize {
        self.core.live
    }

    /// One round of I/O at `now` (see the [module documentation](self)). Returns whether
    /// anything happened: a frame received, a timer fired, a segment sent or a connection
    /// removed.
    pub fn poll(&mut self, now: Instant) -> bool {
        self.poll_with(now, &mut |_| StrayVerdict::Local)
    }

    /// [`poll`](Interface::poll), consulting `stray` for every received TCP segment whose
    /// 4-tuple has no connection here, before it is accepted or reset (see the
    /// [module documentation](self)).
    pub fn poll_with(&mut self, now: Instant, stray: &mut StrayHook<'_>) -> bool {
        let Interface { link, core } = self;
        let mut progress = false;

        // Receive.
        let max = core.config.rx_batch;
        let received = link.recv_batch_parts(now, max, &mut |parts, meta| {
            core.receive_parts(now, parts, meta, stray)
        });
        progress |= received > 0;
        // A full batch may have left frames on the ring, which no new arrival announces.
        core.rx_batch_full = received >= max;

        // Timers.
        for slot in &mut core.slots {
            if let Some(conn) = &mut slot.conn {
                if conn.poll_timeout().is_some_and(|t| t <= now) {
                    conn.handle_timeout(now);
                    progress = true;
                }
            }
        }

        // Transmit: control frames first, then the connections round-robin, one segment
        // each per turn so that no connection starves the others within a batch.
        progress |= core.transmit(link, now);

        // Forget closed connections, once nothing is left to read from them, and move
        // passively opened ones that reached TIME-WAIT, with nothing left to read or
        // send, to a TIME-WAIT record.
        for i in 0..core.slots.len() {
            let Some(conn) = core.slots[i].conn.as_ref() else {
                continue;
            };
            if forgettable(conn) {
                core.remove(i as u32);
                progress = true;
            } else if let Some(tw) = time_wait_record(conn, now) {
                core.remove(i as u32);
                core.stats.time_wait_records += 1;
                let evicted = core.time_wait.evicted();
                core.time_wait.insert(tw);
                core.stats.time_wait_evicted += core.time_wait.evicted() - evicted;
                progress = true;
            }
        }
        if core.time_wait.expire(now) > 0 {
            progress = true;
        }
        progress
    }

    /// Whether a poll right after the last one would find nothing to do, frames that
    /// arrive later apart (the link announces those): the last receive batch was not
    /// full, no control frame, closed connection or completed handshake waits, the link
    /// took every segment, and no connection has a timer due at `now` or a segment owed
    /// ([`Connection::output_pending`], conservative). A caller that runs polls until one
    /// reports no progress may stop at the first that leaves the interface settled,
    /// saving a poll that would only look.
    pub fn settled(&self, now: Instant) -> bool {
        self.settled_until(now).is_some()
    }

    /// Whether the last transmit found the link without a buffer, so that frames (data,
    /// or the resets of aborted connections) wait for the next poll.
    pub fn tx_blocked(&self) -> bool {
        self.core.tx_blocked_at.is_some()
    }

    /// [`settled`](Self::settled) and, when it is, [`poll_at`](Self::poll_at) from the
    /// same pass over the connections: `None` when a poll would find something to do,
    /// `Some(next)` when it would not (a driver that asks both after each round walked
    /// the connections twice, callgrind).
    pub fn settled_until(&self, now: Instant) -> Option<Option<Instant>> {
        let core = &self.core;
        if core.rx_batch_full
            || !core.control.is_empty()
            || !core.closed.is_empty()
            || core.tx_blocked_at.is_some()
        {
            return None;
        }
        if core
            .listeners
            .values()
            .any(|l| !l.held && l.queue.iter().any(|&h| handshake_over(&core.slots, h)))
        {
            return None;
        }
        let mut next = self.link.poll_at();
        if let Some(t) = core.time_wait.next_expiry() {
            if t <= now {
                return None;
            }
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        for c in core.slots.iter().filter_map(|s| s.conn.as_ref()) {
            let to_record = c.state() == State::TimeWait && c.is_passive() && c.recv_queue() == 0;
            if c.output_pending() || forgettable(c) || to_record {
                return None;
            }
            if let Some(t) = c.poll_timeout() {
                if t <= now {
                    return None;
                }
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        Some(next)
    }

    /// When to poll next if no frame arrives: the earliest of the link's next event and
    /// every connection's timer. `None` means nothing is scheduled (an AF_XDP link then
    /// waits on its fd).
    pub fn poll_at(&self) -> Option<Instant> {
        let conns = self
            .core
            .slots
            .iter()
            .filter_map(|s| s.conn.as_ref()?.poll_timeout());
        [
            self.link.poll_at(),
            self.core.tx_blocked_at,
            self.core.time_wait.next_expiry(),
        ]
        .into_iter()
        .flatten()
        .chain(conns)
        .min()
    }
}
