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
//!    comes back in a valid ACK), or is answered with a reset ([`rst_for_unexpected`]);
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

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::RangeInclusive;
use std::sync::Arc;

use crate::link::{Link, PartialChecksum, RxMeta, TxMeta, ETHERNET_HEADER_LEN};
use crate::tcp::isn::IsnGenerator;
use crate::tcp::syncookie::{cookie_syn_ack, CookieError, SynCookies};
use crate::tcp::time_wait::{TimeWaitInput, TimeWaitTable};
use crate::tcp::{rst_for_unexpected, Config, Connection, State, TcpError};
use crate::time::Instant;
use crate::wire::checksum;
use crate::wire::{
    ethernet, ipv4, ArpOperation, ArpPacket, ArpRepr, EtherType, EthernetAddress, EthernetFrame,
    EthernetRepr, IpProtocol, Ipv4Packet, Ipv4Repr, TcpPacket, TcpRepr, WireError,
};

/// Longest TCP header (20 bytes and 40 of options). Payloads are written at a fixed offset
/// that leaves this much room, whatever header the segment turns out to need.
const MAX_TCP_HEADER_LEN: usize = 60;
/// Where a payload starts in a lent tx buffer: after the longest possible headers.
const PAYLOAD_AT: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN + MAX_TCP_HEADER_LEN;
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

/// A received TCP segment whose 4-tuple matches no connection of this interface, as shown
/// to the callback of [`Interface::poll_with`].
#[derive(Debug, Clone, Copy)]
pub struct StraySegment<'a> {
    /// Our side of the 4-tuple (destination of the segment).
    pub local: SocketAddrV4,
    /// The peer's side (source of the segment).
    pub remote: SocketAddrV4,
    /// Whether the segment is a plain SYN (no ACK, no RST) to a port this interface
    /// listens on: the usual processing would open a passive connection.
    pub syn_to_listener: bool,
    /// Whether the segment is a bare ACK to a port this interface listens on while SYN
    /// cookies are in use: the usual processing checks it for a cookie and, if it holds
    /// one, opens a passive connection.
    pub cookie_ack: bool,
    /// The whole Ethernet frame, checksums verified.
    pub frame: &'a [u8],
}

/// What [`Interface::poll_with`] does with a [`StraySegment`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StrayVerdict {
    /// The usual processing: open a passive connection for a SYN to a listener (room
    /// permitting), else answer with a RST.
    Local,
    /// The callback took a copy of the frame to hand to the interface that owns the flow;
    /// nothing is sent from here. Counted in [`InterfaceStats::rx_forwarded`].
    Forwarded,
    /// Drop silently (e.g. the owner's forwarding queue is full; TCP retransmits). Counted in
    /// [`InterfaceStats::rx_stray_dropped`].
    Drop,
}

/// The callback of [`Interface::poll_with`] and [`Interface::receive_frame_with`].
pub type StrayHook<'a> = dyn FnMut(&StraySegment<'_>) -> StrayVerdict + 'a;

/// Names a connection of an [`Interface`]. A handle is never reused for another
/// connection: once its connection is gone, lookups with it return `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnHandle {
    index: u32,
    generation: u32,
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
    /// Super-segments handed to the link to cut into wire segments.
    pub tx_super_segments: u64,
    /// Segments sent with their checksum left to the link.
    pub tx_checksum_offloaded: u64,
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

/// A listening port.
#[derive(Debug)]
struct Listener {
    backlog: usize,
    /// Connections opened by SYNs to this port and not yet accepted, oldest first.
    queue: VecDeque<ConnHandle>,
    /// The driver has nowhere to put accepted connections ([`Interface::hold_accepts`]).
    held: bool,
}

/// One entry of the connection table.
#[derive(Debug)]
struct Slot {
    generation: u32,
    conn: Option<Connection>,
    /// The remote's MAC once known.
    remote_mac: Option<EthernetAddress>,
    /// The listening port whose accept queue holds this connection, until accepted.
    listener: Option<u16>,
}

/// A frame to send that no connection produces: an RST for a stray segment, an ARP reply.
#[derive(Debug, Clone, Copy)]
enum Control {
    Rst {
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        repr: TcpRepr,
    },
    /// An ACK from a TIME-WAIT record.
    TimeWaitAck {
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        repr: TcpRepr,
    },
    /// A SYN-ACK carrying a SYN cookie.
    CookieSynAck {
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        repr: TcpRepr,
    },
    ArpReply(ArpRepr),
}

/// Most removal records kept for [`Interface::pop_closed`].
pub const MAX_CLOSED_EVENTS: usize = 1024;

/// Most control frames waiting for the next tx phase; beyond this they are dropped, so a
/// flood of stray segments cannot grow memory.
const MAX_CONTROL: usize = 256;

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

/// Fault injection for tests and failure drills ([`Interface::drop_received`]): received
/// TCP segments carrying data from `from` are counted, and once `skip` of them have been
/// taken, the next `count` are dropped before any connection sees them, as if lost on the
/// wire after the sender's TCP sent them. Drives a real peer's (a Linux kernel's) loss
/// recovery, which no drop on the peer's own side can: netfilter there is a local error its
/// TCP sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxDrop {
    /// The sender whose segments are counted.
    pub from: SocketAddrV4,
    /// Data segments to let through first.
    pub skip: u64,
    /// Data segments to drop after them.
    pub count: u64,
    /// Data segments from `from` seen so far (set to 0 when installing the rule).
    pub seen: u64,
    /// Dropped so far (set to 0 when installing the rule).
    pub dropped: u64,
}

impl RxDrop {
    /// Whether the data segment just seen from `remote` is to be dropped; counts it.
    fn drops(&mut self, remote: SocketAddrV4) -> bool {
        if remote != self.from {
            return false;
        }
        self.seen += 1;
        if self.seen > self.skip && self.dropped < self.count {
            self.dropped += 1;
            return true;
        }
        false
    }
}

/// A TCP checksum still to be completed by the payload's sum (see `receive_tcp`).
#[derive(Debug, Clone, Copy)]
struct PendingChecksum {
    /// Folded sum of the pseudo-header and the TCP header.
    head_sum: u16,
    /// Whether a checksum holding only the pseudo-header sum is accepted for this segment
    /// ([`InterfaceConfig::accept_partial_checksums`] and the field says so).
    partial_ok: bool,
    /// The link vouched for the checksum ([`RxMeta::checksum_verified`]).
    verified: bool,
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
        let received = link.recv_batch_meta(now, max, &mut |frame, meta| {
            core.receive(now, frame, meta, stray)
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

/// Whether the connection queued for a listener at `h` is ready to be accepted: its
/// handshake completed (or it closed first).
fn handshake_over(slots: &[Slot], h: ConnHandle) -> bool {
    slots
        .get(h.index as usize)
        .and_then(|s| s.conn.as_ref())
        .is_some_and(|c| c.state().is_synchronized() || c.is_closed())
}

/// Recomputes the TCP checksum of an Ethernet/IPv4/TCP `frame` in place (nothing happens
/// to a frame that is not one).
fn complete_tcp_checksum(frame: &mut [u8]) {
    let Some(ip_bytes) = frame.get_mut(ETHERNET_HEADER_LEN..) else {
        return;
    };
    let Ok(mut ipp) = Ipv4Packet::new_checked(ip_bytes) else {
        return;
    };
    let (src, dst) = (ipp.src_addr(), ipp.dst_addr());
    let Ok(mut tp) = TcpPacket::new_checked(ipp.payload_mut()) else {
        return;
    };
    tp.fill_checksum(src, dst);
}

/// The TIME-WAIT record a poll replaces `c` with: for a passively opened connection in
/// TIME-WAIT with nothing left to read or send. Connections we opened keep TIME-WAIT
/// whole: their local port stays theirs (and out of the allocators) until it ends.
fn time_wait_record(c: &Connection, now: Instant) -> Option<crate::tcp::time_wait::TimeWait> {
    if !c.is_passive() || c.state() != State::TimeWait || c.recv_queue() != 0 {
        return None;
    }
    c.time_wait(now)
}

/// Whether a poll forgets the connection: closed, and nothing left to read from it.
fn forgettable(c: &Connection) -> bool {
    c.is_closed() && (c.recv_queue() == 0 || c.error().is_some())
}

/// How a parse error is counted.
fn count_error(stats: &mut InterfaceStats, e: WireError) {
    match e {
        WireError::Truncated | WireError::Malformed => stats.rx_malformed += 1,
        WireError::Checksum => stats.rx_bad_checksum += 1,
        WireError::Unsupported => stats.rx_unsupported += 1,
    }
}

impl Core {
    fn slot(&self, h: ConnHandle) -> Option<&Slot> {
        self.slots
            .get(h.index as usize)
            .filter(|s| s.generation == h.generation)
    }

    fn slot_mut(&mut self, h: ConnHandle) -> Option<&mut Slot> {
        self.slots
            .get_mut(h.index as usize)
            .filter(|s| s.generation == h.generation)
    }

    fn insert(
        &mut self,
        conn: Connection,
        remote_mac: Option<EthernetAddress>,
        listener: Option<u16>,
    ) -> ConnHandle {
        let tuple = (conn.local(), conn.remote());
        let index = match self.free_slots.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    conn: None,
                    remote_mac: None,
                    listener: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.conn = Some(conn);
        slot.remote_mac = remote_mac;
        slot.listener = listener;
        self.by_tuple.insert(tuple, index);
        self.live += 1;
        self.stats.connections_opened += 1;
        ConnHandle {
            index,
            generation: slot.generation,
        }
    }

    fn remove(&mut self, index: u32) {
        let Some(slot) = self.slots.get_mut(index as usize) else {
            return;
        };
        let Some(conn) = slot.conn.take() else { return };
        let h = ConnHandle {
            index,
            generation: slot.generation,
        };
        // A new generation makes every outstanding handle to this slot stale.
        slot.generation = slot.generation.wrapping_add(1);
        if let Some(port) = slot.listener.take() {
            if let Some(l) = self.listeners.get_mut(&port) {
                l.queue.retain(|&q| q != h);
            }
        }
        self.by_tuple.remove(&(conn.local(), conn.remote()));
        self.last_flow = None;
        if self.closed.len() >= MAX_CLOSED_EVENTS {
            self.closed.pop_front();
        }
        self.closed.push_back((h, conn.error()));
        self.free_slots.push(index);
        self.live -= 1;
        self.stats.connections_removed += 1;
    }

    /// The next free local address towards `remote`.
    fn ephemeral_port(&mut self, remote: SocketAddrV4) -> Result<SocketAddrV4, NetifError> {
        let (lo, hi) = (
            *self.config.ephemeral_ports.start(),
            *self.config.ephemeral_ports.end(),
        );
        if lo > hi {
            return Err(NetifError::NoFreePort);
        }
        let span = u32::from(hi - lo) + 1;
        for _ in 0..span {
            let port = self.next_port.clamp(lo, hi);
            self.next_port = if port == hi { lo } else { port + 1 };
            let local = SocketAddrV4::new(self.config.ipv4, port);
            if !self.by_tuple.contains_key(&(local, remote)) && !self.listeners.contains_key(&port)
            {
                return Ok(local);
            }
        }
        Err(NetifError::NoFreePort)
    }

    fn queue_control(&mut self, c: Control) {
        if self.control.len() < MAX_CONTROL {
            self.control.push_back(c);
        } else {
            self.stats.tx_control_dropped += 1;
        }
    }

    /// Handles one received frame. Never panics: every failure is a counted drop.
    fn receive(&mut self, now: Instant, frame: &[u8], meta: RxMeta, stray: &mut StrayHook<'_>) {
        self.stats.rx_frames += 1;
        let ef = match EthernetFrame::new_checked(frame) {
            Ok(ef) => ef,
            Err(e) => return count_error(&mut self.stats, e),
        };
        let eth = match EthernetRepr::parse(&ef) {
            Ok(eth) => eth,
            Err(e) => return count_error(&mut self.stats, e),
        };
        if eth.dst != self.config.mac && !eth.dst.is_broadcast() {
            self.stats.rx_not_ours += 1;
            return;
        }
        match eth.ethertype {
            EtherType::Arp => self.receive_arp(ef.payload_slice()),
            EtherType::Ipv4 if eth.dst == self.config.mac => {
                self.receive_ipv4(now, eth.src, ef.payload_slice(), frame, meta, stray)
            }
            EtherType::Ipv4 => self.stats.rx_not_ours += 1,
            EtherType::Unknown(_) => self.stats.rx_unsupported += 1,
        }
    }

    fn receive_arp(&mut self, packet: &[u8]) {
        let arp = match ArpPacket::new_checked(packet).and_then(|p| ArpRepr::parse(&p)) {
            Ok(arp) => arp,
            Err(e) => return count_error(&mut self.stats, e),
        };
        if arp.target_ip != self.config.ipv4 {
            self.stats.rx_not_ours += 1;
            return;
        }
        self.stats.rx_arp += 1;
        // RFC 826: a packet addressed to us teaches us the sender's mapping. Static entries
        // are not overridden: the table is configuration first.
        if arp.source_hw.is_unicast() && !arp.source_ip.is_unspecified() {
            self.neighbors.entry(arp.source_ip).or_insert(arp.source_hw);
        }
        if arp.operation == ArpOperation::Request {
            self.queue_control(Control::ArpReply(ArpRepr {
                operation: ArpOperation::Reply,
                source_hw: self.config.mac,
                source_ip: self.config.ipv4,
                target_hw: arp.source_hw,
                target_ip: arp.source_ip,
            }));
        }
    }

    fn receive_ipv4(
        &mut self,
        now: Instant,
        src_mac: EthernetAddress,
        packet: &[u8],
        frame: &[u8],
        meta: RxMeta,
        stray: &mut StrayHook<'_>,
    ) {
        let ipp = match Ipv4Packet::new_checked(packet) {
            Ok(p) => p,
            Err(e) => return count_error(&mut self.stats, e),
        };
        let ip = match Ipv4Repr::parse(&ipp, true) {
            Ok(ip) => ip,
            Err(e) => return count_error(&mut self.stats, e),
        };
        if ip.dst != self.config.ipv4 {
            self.stats.rx_not_ours += 1;
            return;
        }
        if ip.protocol != IpProtocol::Tcp {
            self.stats.rx_unsupported += 1;
            return;
        }
        let segment = ipp.payload_slice();
        let tp = match TcpPacket::new_checked(segment) {
            Ok(tp) => tp,
            Err(e) => return count_error(&mut self.stats, e),
        };
        // The checksum is verified in `receive_tcp`, from the pseudo-header and header sum
        // taken here and a payload sum that the receive fast path computes while copying
        // the payload into the connection's ring (one pass over the bytes, not two).
        let verified = meta.checksum_verified;
        let partial_ok = !verified
            && self.config.accept_partial_checksums
            && tp.has_partial_checksum(ip.src, ip.dst);
        if frame.len() > self.link_frame_len {
            self.stats.rx_large_frames += 1;
        }
        let (repr, payload) = match TcpRepr::parse(&tp, ip.src, ip.dst, false) {
            Ok(x) => x,
            Err(e) => {
                // A corrupt segment is counted as corrupt even when the corruption also
                // broke its header, as verifying first would count it.
                let bad = !verified && !partial_ok && !tp.verify_checksum(ip.src, ip.dst);
                return count_error(&mut self.stats, if bad { WireError::Checksum } else { e });
            }
        };
        let header = segment
            .get(..segment.len() - payload.len())
            .unwrap_or_default();
        let seg_len = u32::try_from(segment.len()).unwrap_or(u32::MAX);
        let check = PendingChecksum {
            head_sum: checksum::add(
                checksum::pseudo_header_v4(ip.src, ip.dst, IpProtocol::Tcp.into(), seg_len),
                checksum::data(header),
            ),
            partial_ok,
            verified,
        };
        self.receive_tcp(now, src_mac, &ip, &repr, payload, check, frame, stray);
    }

    // The frame and the hook travel with the parsed headers so that a stray segment can be
    // handed on whole.
    #[allow(clippy::too_many_arguments)]
    fn receive_tcp(
        &mut self,
        now: Instant,
        src_mac: EthernetAddress,
        ip: &Ipv4Repr,
        repr: &TcpRepr,
        payload: &[u8],
        check: PendingChecksum,
        frame: &[u8],
        stray: &mut StrayHook<'_>,
    ) {
        let local = SocketAddrV4::new(ip.dst, repr.dst_port);
        let remote = SocketAddrV4::new(ip.src, repr.src_port);
        if !payload.is_empty() && self.rx_drop.as_mut().is_some_and(|r| r.drops(remote)) {
            return;
        }
        let key = (local, remote);
        let found = match self.last_flow {
            Some((k, index)) if k == key => Some(index),
            _ => {
                let index = self.by_tuple.get(&key).copied();
                if let Some(index) = index {
                    self.last_flow = Some((key, index));
                }
                index
            }
        };
        let conn = found.and_then(|index| self.slots.get_mut(index as usize)?.conn.as_mut());
        // Verify the checksum before anything depends on the segment. For the next
        // in-order payload of an established connection, the sum comes from copying the
        // payload into the receive ring (see `Connection::place_payload`); otherwise from
        // reading it.
        let placed = conn.and_then(|c| c.place_payload(repr.seq, payload));
        let sum_ok = if check.verified {
            // Vouched for by the link; the sum (if any) is not needed.
            self.stats.rx_checksum_offloaded += 1;
            true
        } else {
            let payload_sum = placed.unwrap_or_else(|| checksum::data(payload));
            checksum::add(check.head_sum, payload_sum) == 0xffff
        };
        if !sum_ok {
            if !check.partial_ok {
                // Whatever was placed lies in free ring space and is never committed:
                // the marker dies with the next `handle_segment*`.
                return count_error(&mut self.stats, WireError::Checksum);
            }
            // A Linux peer with tx checksum offload on, across a link that never
            // completes the sum (veth): trusted the way Linux trusts CHECKSUM_PARTIAL.
            self.stats.rx_partial_checksum += 1;
        }
        if let Some(index) = found {
            let reopen = match self
                .slots
                .get_mut(index as usize)
                .and_then(|s| s.conn.as_mut())
            {
                Some(conn) => {
                    // RFC 6191: a new SYN may end TIME-WAIT early; the old incarnation goes
                    // and the SYN is treated as if it found no connection.
                    if conn.state() == State::TimeWait && conn.accepts_new_syn_in_time_wait(repr) {
                        true
                    } else {
                        self.stats.rx_segments += 1;
                        if placed.is_some() {
                            conn.handle_segment_placed(now, repr, payload);
                        } else {
                            conn.handle_segment(now, repr, payload);
                        }
                        false
                    }
                }
                None => false,
            };
            if !reopen {
                return;
            }
            self.stats.time_wait_reopened += 1;
            self.remove(index);
        } else if !self.time_wait.is_empty() {
            let input = self.time_wait.on_segment(
                local,
                remote,
                now,
                repr,
                payload.len(),
                self.config.tcp.time_wait,
                self.config.tcp.invalid_ack_interval,
            );
            match input {
                None => {}
                Some(TimeWaitInput::Reopen) => self.stats.time_wait_reopened += 1,
                Some(TimeWaitInput::Ignore) => {
                    self.stats.rx_time_wait += 1;
                    return;
                }
                Some(TimeWaitInput::Answer(ack)) => {
                    self.stats.rx_time_wait += 1;
                    let dst_mac = *self.neighbors.get(&ip.src).unwrap_or(&src_mac);
                    self.queue_control(Control::TimeWaitAck {
                        dst_mac,
                        dst_ip: ip.src,
                        repr: ack,
                    });
                    return;
                }
            }
        }
        let plain_syn = repr.flags.syn() && !repr.flags.rst() && repr.ack.is_none();
        let listening = self.listeners.contains_key(&repr.dst_port);
        let syn_to_listener = plain_syn && listening;
        // Checked for a cookie only while cookies are out: otherwise a blind guess of an
        // ACK could open a connection at any time (Linux's "recent overflow" test).
        let bare_ack = repr.ack.is_some() && !repr.flags.syn() && !repr.flags.rst();
        let cookie_ack =
            bare_ack && listening && self.config.syn_cookies && self.cookies.recently_sent(now);
        // The hook's frame carries a valid checksum: one the link vouched for may hold a
        // stale or partial field, completed here in a copy (stray segments are rare).
        let frame = if check.verified {
            self.stray_scratch.clear();
            self.stray_scratch.extend_from_slice(frame);
            complete_tcp_checksum(&mut self.stray_scratch);
            &self.stray_scratch[..]
        } else {
            frame
        };
        let verdict = stray(&StraySegment {
            local,
            remote,
            syn_to_listener,
            cookie_ack,
            frame,
        });
        match verdict {
            StrayVerdict::Local => {}
            StrayVerdict::Forwarded => {
                self.stats.rx_forwarded += 1;
                return;
            }
            StrayVerdict::Drop => {
                self.stats.rx_stray_dropped += 1;
                return;
            }
        }
        if syn_to_listener {
            self.passive_open(now, src_mac, local, remote, repr, payload.len());
            return;
        }
        if cookie_ack && self.cookie_open(now, src_mac, local, remote, repr, payload) {
            return;
        }
        if cookie_ack && !self.cookie_room(local.port()) {
            // While the listener has no room its peers' cookie ACKs are dropped, so a
            // later segment of such a peer (its FIN after its data) carries no cookie
            // that verifies. Dropped, not reset: the data's retransmission carries the
            // cookie once the application accepts again.
            self.stats.accept_queue_full += 1;
            return;
        }
        self.stats.rx_no_connection += 1;
        self.reset(src_mac, ip.src, repr, payload.len());
    }

    fn passive_open(
        &mut self,
        now: Instant,
        src_mac: EthernetAddress,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        syn: &TcpRepr,
        payload_len: usize,
    ) {
        let (full, held) = self
            .listeners
            .get(&local.port())
            .map_or((true, false), |l| (l.queue.len() >= l.backlog, l.held));
        if held {
            // Like Linux with a full accept queue: no cookie either; the SYN's
            // retransmission is the retry.
            self.stats.accept_queue_full += 1;
            self.stats.syn_dropped += 1;
            return;
        }
        if full || self.live >= self.config.max_connections {
            if self.config.syn_cookies {
                // RFC 4987 §3.6: answer, and keep nothing.
                let (cookie, mss) = self.cookies.generate(now, local, remote, syn);
                let repr = cookie_syn_ack(&self.config.tcp, syn, cookie);
                let dst_mac = *self.neighbors.get(remote.ip()).unwrap_or(&src_mac);
                tracing::trace!(%local, %remote, cookie = cookie.0, mss, "netif: backlog full, SYN cookie");
                self.queue_control(Control::CookieSynAck {
                    dst_mac,
                    dst_ip: *remote.ip(),
                    repr,
                });
                return;
            }
            // Dropped, not reset: the peer's SYN retransmission is the retry.
            self.stats.syn_dropped += 1;
            return;
        }
        let isn = self.isn.generate(now, local, remote);
        match Connection::accept(self.config.tcp.clone(), local, remote, syn, isn, now) {
            Ok(mut conn) => {
                conn.set_ts_offset(self.isn.ts_offset(local, remote));
                // Static entries win; otherwise answer where the SYN came from, so that a
                // peer without a static entry here can still connect.
                let mac = *self.neighbors.get(remote.ip()).unwrap_or(&src_mac);
                let h = self.insert(conn, Some(mac), Some(local.port()));
                if let Some(l) = self.listeners.get_mut(&local.port()) {
                    l.queue.push_back(h);
                }
            }
            Err(_) => {
                self.stats.rx_no_connection += 1;
                self.reset(src_mac, *remote.ip(), syn, payload_len);
            }
        }
    }

    /// A bare ACK to a listening port for no connection, while cookies are out: opens the
    /// connection if it returns a valid cookie (RFC 4987 §3.6). Returns false when the
    /// cookie does not verify (the caller then resets, as for any stray segment).
    fn cookie_open(
        &mut self,
        now: Instant,
        src_mac: EthernetAddress,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        repr: &TcpRepr,
        payload: &[u8],
    ) -> bool {
        let mss = match self.cookies.check(now, local, remote, repr) {
            Ok(mss) => mss,
            Err(e) => {
                let why = match e {
                    CookieError::Expired => "expired",
                    CookieError::Invalid | CookieError::NotAnAck => "invalid",
                };
                tracing::debug!(%local, %remote, why, "netif: SYN cookie rejected");
                self.stats.syn_cookies_rejected += 1;
                return false;
            }
        };
        // The cookie is genuine; what remains is room.
        if !self.cookie_room(local.port()) || self.live >= self.config.max_connections {
            // Dropped, not reset: the peer's data retransmission carries the cookie again.
            if self.listeners.get(&local.port()).is_some_and(|l| l.held) {
                self.stats.accept_queue_full += 1;
            }
            self.stats.syn_dropped += 1;
            return true;
        }
        let cookie = repr.ack.unwrap_or_default() - 1;
        match Connection::accept_cookie(
            self.config.tcp.clone(),
            local,
            remote,
            repr,
            payload,
            cookie,
            mss,
            now,
        ) {
            Ok(conn) => {
                self.stats.syn_cookies_accepted += 1;
                self.stats.rx_segments += 1;
                let mac = *self.neighbors.get(remote.ip()).unwrap_or(&src_mac);
                let h = self.insert(conn, Some(mac), Some(local.port()));
                if let Some(l) = self.listeners.get_mut(&local.port()) {
                    l.queue.push_back(h);
                }
                true
            }
            Err(_) => {
                self.stats.syn_cookies_rejected += 1;
                false
            }
        }
    }

    /// Whether listener `port` has room for a connection opened from a cookie: it is not
    /// held and fewer than its backlog of established connections wait in it. Half-open
    /// connections in the queue (a SYN flood's) do not count against a cookie connection,
    /// or cookies would be useless exactly when they are needed.
    fn cookie_room(&self, port: u16) -> bool {
        self.listeners.get(&port).is_some_and(|l| {
            if l.held {
                return false;
            }
            let established = l
                .queue
                .iter()
                .filter(|&&h| {
                    self.slots
                        .get(h.index as usize)
                        .and_then(|s| s.conn.as_ref())
                        .is_some_and(|c| c.state() != State::SynReceived)
                })
                .count();
            established < l.backlog
        })
    }

    fn reset(&mut self, src_mac: EthernetAddress, src_ip: Ipv4Addr, repr: &TcpRepr, len: usize) {
        if let Some(rst) = rst_for_unexpected(repr, len) {
            let dst_mac = *self.neighbors.get(&src_ip).unwrap_or(&src_mac);
            self.queue_control(Control::Rst {
                dst_mac,
                dst_ip: src_ip,
                repr: rst,
            });
        }
    }

    fn next_ident(&mut self) -> u16 {
        self.ip_ident = self.ip_ident.wrapping_add(1);
        self.ip_ident
    }

    /// Writes the headers of a TCP segment whose payload already lies at `PAYLOAD_AT` in
    /// `buf`, and returns the frame's range. The frame starts where the headers begin.
    /// With `partial`, the TCP checksum is left to the link (see
    /// [`emit_segment_meta`](Self::emit_segment_meta)).
    fn emit_segment(
        &mut self,
        buf: &mut [u8],
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        repr: &TcpRepr,
        payload_len: usize,
        payload_sum: u16,
    ) -> Option<std::ops::Range<usize>> {
        self.emit_segment_with(buf, dst_mac, dst_ip, repr, payload_len, Some(payload_sum))
    }

    /// [`emit_segment`](Self::emit_segment) for a connection's [`Transmit`]: the TCP
    /// checksum left partial when the connection runs with checksum offload, and the
    /// super-segment's wire segment size passed on.
    fn emit_segment_meta(
        &mut self,
        buf: &mut [u8],
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        t: &crate::tcp::Transmit,
    ) -> Option<(std::ops::Range<usize>, TxMeta)> {
        if !self.config.tcp.checksum_offload {
            let r =
                self.emit_segment(buf, dst_mac, dst_ip, &t.repr, t.payload_len, t.payload_sum)?;
            return Some((r, TxMeta::default()));
        }
        let r = self.emit_segment_with(buf, dst_mac, dst_ip, &t.repr, t.payload_len, None)?;
        self.stats.tx_checksum_offloaded += 1;
        let segment_size = if t.is_super_segment() {
            self.stats.tx_super_segments += 1;
            u16::try_from(t.segment_size).unwrap_or(u16::MAX)
        } else {
            0
        };
        let meta = TxMeta {
            segment_size,
            partial_checksum: Some(PartialChecksum {
                start: crate::wire::frame::TCP_HEADER_AT as u16,
                offset: 16,
            }),
        };
        Some((r, meta))
    }

    /// The frame writer behind both: `Some(sum)` completes the checksum from the payload's
    /// sum, `None` leaves it partial.
    fn emit_segment_with(
        &mut self,
        buf: &mut [u8],
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        repr: &TcpRepr,
        payload_len: usize,
        payload_sum: Option<u16>,
    ) -> Option<std::ops::Range<usize>> {
        let header_len = repr.header_len();
        let start = PAYLOAD_AT.checked_sub(ethernet::HEADER_LEN + ipv4::HEADER_LEN + header_len)?;
        let eth = EthernetRepr {
            src: self.config.mac,
            dst: dst_mac,
            ethertype: EtherType::Ipv4,
        };
        let ip = Ipv4Repr {
            src: self.config.ipv4,
            dst: dst_ip,
            protocol: IpProtocol::Tcp,
            payload_len: header_len + payload_len,
            ttl: self.config.ttl,
            dscp_ecn: 0,
        };
        let ident = self.next_ident();
        let frame = buf.get_mut(start..)?;
        let emitted = match payload_sum {
            Some(sum) => crate::wire::frame::emit_tcp_frame_summed(
                frame,
                &eth,
                &ip,
                ident,
                repr,
                payload_len,
                Some(sum),
            ),
            None => crate::wire::frame::emit_tcp_frame_partial(
                frame,
                &eth,
                &ip,
                ident,
                repr,
                payload_len,
            ),
        };
        match emitted {
            Ok(len) => {
                self.stats.tx_segments += 1;
                Some(start..start + len)
            }
            Err(_) => {
                self.stats.tx_emit_errors += 1;
                None
            }
        }
    }

    /// Writes one control frame into `buf`.
    fn emit_control(&mut self, buf: &mut [u8], c: Control) -> Option<std::ops::Range<usize>> {
        match c {
            Control::Rst {
                dst_mac,
                dst_ip,
                repr,
            } => {
                let r = self.emit_segment(buf, dst_mac, dst_ip, &repr, 0, 0);
                if r.is_some() {
                    self.stats.tx_rst += 1;
                }
                r
            }
            Control::TimeWaitAck {
                dst_mac,
                dst_ip,
                repr,
            } => self.emit_segment(buf, dst_mac, dst_ip, &repr, 0, 0),
            Control::CookieSynAck {
                dst_mac,
                dst_ip,
                repr,
            } => {
                let r = self.emit_segment(buf, dst_mac, dst_ip, &repr, 0, 0);
                if r.is_some() {
                    self.stats.syn_cookies_sent += 1;
                }
                r
            }
            Control::ArpReply(arp) => {
                let eth = EthernetRepr {
                    src: self.config.mac,
                    dst: arp.target_hw,
                    ethertype: EtherType::Arp,
                };
                let len = ETHERNET_HEADER_LEN + arp.packet_len();
                let ok = buf.get_mut(..len).is_some_and(|frame| {
                    eth.emit(frame).is_ok()
                        && frame
                            .get_mut(ETHERNET_HEADER_LEN..)
                            .is_some_and(|p| arp.emit(p).is_ok())
                });
                if ok {
                    self.stats.tx_arp_replies += 1;
                    Some(0..len)
                } else {
                    self.stats.tx_emit_errors += 1;
                    None
                }
            }
        }
    }

    /// The tx phase of `poll`: control frames, then segments from every connection until
    /// none has anything to send or the link has no more tx buffers. Returns whether any
    /// frame was produced.
    fn transmit<L: Link>(&mut self, link: &mut L, now: Instant) -> bool {
        self.tx_ready.clear();
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.conn.is_some() {
                self.tx_ready.push(i as u32);
            }
        }
        // The payload region: from the fixed payload offset up to what the MSS allows (or a
        // super-segment, when the link segments). The connection caps the payload further
        // by the options it carries.
        let payload_cap = usize::from(self.config.tcp.mss).max(self.config.tcp.max_super_segment);
        let mut cursor = 0usize;
        let mut produced_any = false;
        self.tx_blocked_at = None;
        // Each round hands out a batch of buffers; rounds repeat while the link takes
        // everything, so one poll drains all connections (bounded by their windows).
        for _ in 0..1024 {
            let mut exhausted = false;
            let sent = link.tx_batch_meta(now, self.config.tx_batch, &mut |buf| {
                if let Some(c) = self.control.pop_front() {
                    // A control frame that fails to emit is counted; move on to the next.
                    if let Some(r) = self.emit_control(buf, c) {
                        return Some((r, TxMeta::default()));
                    }
                }
                // Each ready connection gets at most one try per buffer. A connection with
                // nothing more leaves the list by `swap_remove`: the last one takes its
                // place and is tried next, which keeps the turns round-robin enough.
                let mut tries = self.tx_ready.len();
                while tries > 0 && !self.tx_ready.is_empty() {
                    tries -= 1;
                    if cursor >= self.tx_ready.len() {
                        cursor = 0;
                    }
                    let i = self.tx_ready[cursor] as usize;
                    let Some(slot) = self.slots.get_mut(i) else {
                        self.tx_ready.swap_remove(cursor);
                        continue;
                    };
                    let Some(conn) = slot.conn.as_mut() else {
                        self.tx_ready.swap_remove(cursor);
                        continue;
                    };
                    let Some(dst_mac) = slot.remote_mac else {
                        // Without a MAC the segment could not leave; leave it queued in
                        // the connection (its timers will retry) rather than lose it.
                        self.stats.tx_no_neighbor += 1;
                        self.tx_ready.swap_remove(cursor);
                        continue;
                    };
                    let end = (PAYLOAD_AT + payload_cap).min(buf.len());
                    let payload_buf = buf.get_mut(PAYLOAD_AT..end).unwrap_or_default();
                    match conn.poll_transmit(now, payload_buf) {
                        None => {
                            self.tx_ready.swap_remove(cursor);
                        }
                        Some(t) => {
                            cursor += 1;
                            let dst_ip = *conn.remote().ip();
                            if let Some(r) = self.emit_segment_meta(buf, dst_mac, dst_ip, &t) {
                                return Some(r);
                            }
                        }
                    }
                }
                if self.control.is_empty() {
                    exhausted = true;
                    None
                } else {
                    // Only failed control frames remain: keep draining them.
                    self.control
                        .pop_front()
                        .and_then(|c| self.emit_control(buf, c))
                        .map(|r| (r, TxMeta::default()))
                }
            });
            produced_any |= sent > 0;
            link.flush(now);
            if exhausted {
                return produced_any;
            }
            if sent == 0 {
                // The link had no buffer at all: try again soon.
                self.tx_blocked_at = Some(now);
                return produced_any;
            }
        }
        self.tx_blocked_at = Some(now);
        produced_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::sim::{self, SimConfig, SimLink};
    use crate::tcp::TcpError;
    use crate::time::Duration;
    use crate::wire::{EthernetAddress, TcpFlags};

    const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
    const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xb]);
    const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn tcp_config() -> Config {
        Config {
            min_rto: Duration::from_millis(1),
            initial_rto: Duration::from_millis(10),
            time_wait: Duration::from_millis(5),
            delayed_ack: None,
            ..Config::default()
        }
    }

    fn host(link: SimLink, mac: EthernetAddress, ip: Ipv4Addr) -> Interface<SimLink> {
        Interface::new(
            link,
            InterfaceConfig {
                mac,
                ipv4: ip,
                tcp: tcp_config(),
                isn_key: Some([7; 16]),
                ..InterfaceConfig::default()
            },
        )
    }

    fn hosts() -> (Interface<SimLink>, Interface<SimLink>) {
        let (la, lb) = sim::pair(SimConfig::default());
        let mut a = host(la, MAC_A, IP_A);
        let mut b = host(lb, MAC_B, IP_B);
        a.add_neighbor(IP_B, MAC_B);
        b.add_neighbor(IP_A, MAC_A);
        (a, b)
    }

    /// Polls both hosts, jumping virtual time, until `done` or nothing is scheduled.
    fn run_until(
        a: &mut Interface<SimLink>,
        b: &mut Interface<SimLink>,
        now: &mut Instant,
        mut done: impl FnMut(&mut Interface<SimLink>, &mut Interface<SimLink>) -> bool,
    ) {
        for _ in 0..100_000 {
            a.poll(*now);
            b.poll(*now);
            if done(a, b) {
                return;
            }
            match [a.poll_at(), b.poll_at()].into_iter().flatten().min() {
                Some(t) => *now = (*now).max(t),
                None => return,
            }
        }
        panic!("no end in sight");
    }

    /// Frames A put on the wire, as (TCP source port, payload bytes), taken off B's link.
    fn wire_segments(b: &mut Interface<SimLink>, now: Instant) -> Vec<(u16, usize)> {
        let mut out = Vec::new();
        b.link_mut().recv_batch(now, usize::MAX, &mut |f| {
            let ip = &f[ethernet::HEADER_LEN..];
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let tcp = &ip[ipv4::HEADER_LEN..];
            let tcp_header = usize::from(tcp[12] >> 4) * 4;
            let port = u16::from_be_bytes([tcp[0], tcp[1]]);
            out.push((port, total - ipv4::HEADER_LEN - tcp_header));
        });
        out
    }

    #[test]
    fn idle_connections_do_not_disturb_the_round_robin() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        b.listen(80, 16).unwrap();
        let conns: Vec<_> = (0..8)
            .map(|_| a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap())
            .collect();
        let mut accepted = 0;
        run_until(&mut a, &mut b, &mut now, |a, b| {
            while b.accept(80).is_some() {
                accepted += 1;
            }
            accepted == conns.len()
                && conns
                    .iter()
                    .all(|&h| a.conn(h).unwrap().state() == State::Established)
        });
        // Two of eight connections have data (three segments each); six stay idle.
        let mss = usize::from(a.config().tcp.mss);
        let active = [conns[2], conns[5]];
        let ports: Vec<u16> = active
            .iter()
            .map(|&h| a.conn(h).unwrap().local().port())
            .collect();
        let data = vec![7u8; 2 * mss + 100];
        for &h in &active {
            // Without Nagle, the short third segment goes out at once as well.
            a.conn_mut(h).unwrap().set_nodelay(true);
            assert_eq!(a.conn_mut(h).unwrap().send(&data).unwrap(), data.len());
        }
        assert!(a.poll(now));
        let later = now + Duration::from_secs(1);
        let sent: Vec<(u16, usize)> = wire_segments(&mut b, later)
            .into_iter()
            .filter(|&(_, len)| len > 0)
            .collect();
        // Every byte went out in one poll, only from the two, alternating between them.
        assert_eq!(sent.len(), 6, "{sent:?}");
        for (i, &(port, _)) in sent.iter().enumerate() {
            assert_eq!(
                port,
                if sent[0].0 == ports[0] {
                    ports[i % 2]
                } else {
                    ports[1 - i % 2]
                }
            );
        }
        for &p in &ports {
            let bytes: usize = sent.iter().filter(|s| s.0 == p).map(|s| s.1).sum();
            assert_eq!(bytes, data.len());
        }
    }

    #[test]
    fn handshake_data_and_close() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        b.listen(80, 4).unwrap();
        let ca = a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap();
        let mut cb = None;
        run_until(&mut a, &mut b, &mut now, |_, b| {
            cb = cb.or_else(|| b.accept(80));
            cb.is_some()
        });
        let cb = cb.unwrap();
        assert_eq!(a.conn(ca).unwrap().state(), State::Established);
        assert_eq!(a.conn_mut(ca).unwrap().send(b"hello").unwrap(), 5);
        a.conn_mut(ca).unwrap().close();
        let mut got = Vec::new();
        run_until(&mut a, &mut b, &mut now, |_, b| {
            let mut buf = [0u8; 64];
            match b.conn_mut(cb).unwrap().recv(&mut buf) {
                Ok(0) => true,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    false
                }
                Err(TcpError::WouldBlock) => false,
                Err(e) => panic!("{e}"),
            }
        });
        assert_eq!(got, b"hello");
        b.conn_mut(cb).unwrap().close();
        run_until(&mut a, &mut b, &mut now, |a, b| {
            a.connection_count() + b.connection_count() == 0
        });
        assert!(a.conn(ca).is_none() && b.conn(cb).is_none());
        assert_eq!(a.stats().connections_removed, 1);
        assert_eq!(b.stats().connections_removed, 1);
    }

    /// A passively opened connection whose side closes first leaves the connection table
    /// for a TIME-WAIT record once the peer's FIN is in (HTTP/1.0's server): the record
    /// ends after 2×MSL, or earlier when a new SYN of the same 4-tuple reopens it
    /// (RFC 6191).
    #[test]
    fn a_server_that_closes_first_keeps_a_time_wait_record_not_a_connection() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        b.listen(80, 4).unwrap();
        let remote = SocketAddrV4::new(IP_B, 80);
        let mut recorded = now;
        for round in 0..2 {
            let ca = a.connect_from(40_000, remote, now).unwrap();
            let mut cb = None;
            run_until(&mut a, &mut b, &mut now, |_, b| {
                cb = cb.or_else(|| b.accept(80));
                cb.is_some()
            });
            let cb = cb.unwrap();
            // The server answers and closes first; the client reads to the end and closes.
            assert_eq!(b.conn_mut(cb).unwrap().send(b"bye").unwrap(), 3);
            b.conn_mut(cb).unwrap().close();
            let mut got = Vec::new();
            run_until(&mut a, &mut b, &mut now, |a, _| {
                let mut buf = [0u8; 16];
                match a.conn_mut(ca).unwrap().recv(&mut buf) {
                    Ok(0) => true,
                    Ok(n) => {
                        got.extend_from_slice(&buf[..n]);
                        false
                    }
                    Err(TcpError::WouldBlock) => false,
                    Err(e) => panic!("{e}"),
                }
            });
            assert_eq!(got, b"bye");
            a.conn_mut(ca).unwrap().close();
            run_until(&mut a, &mut b, &mut now, |a, b| {
                a.connection_count() == 0 && b.connection_count() == 0
            });
            // An orderly end for the application; the 4-tuple is held by a record.
            let mut closed = Vec::new();
            while let Some(c) = b.pop_closed() {
                closed.push(c);
            }
            assert_eq!(closed, [(cb, None)]);
            assert_eq!(b.time_wait_count(), 1);
            assert_eq!(b.stats().time_wait_records, round + 1);
            assert_eq!(b.stats().time_wait_reopened, round);
            recorded = now;
            // Then a new connection from the same port: its SYN ends the record.
            now += Duration::from_millis(1);
        }
        // Without one, the record ends with 2×MSL (5 ms here, from the peer's FIN, which
        // came just before the record).
        run_until(&mut a, &mut b, &mut now, |_, b| b.time_wait_count() == 0);
        let lived = now - recorded;
        assert!(
            lived > Duration::from_millis(1) && lived <= Duration::from_millis(5),
            "{lived:?}"
        );
        assert!(b.poll_at().is_none());
        assert_eq!(b.stats().rx_no_connection, 0);
    }

    #[test]
    fn a_corrupt_in_order_payload_placed_by_the_fast_path_is_never_delivered() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        b.listen(80, 4).unwrap();
        let ca = a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap();
        let mut cb = None;
        run_until(&mut a, &mut b, &mut now, |_, b| {
            cb = cb.or_else(|| b.accept(80));
            cb.is_some()
        });
        let cb = cb.unwrap();
        // Let the handshake's last ACK land, then take A's data frames off the wire.
        run_until(&mut a, &mut b, &mut now, |_, b| {
            b.link().incoming_len() == 0
        });
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
        assert_eq!(a.conn_mut(ca).unwrap().send(&data).unwrap(), data.len());
        a.poll(now);
        now += Duration::from_millis(1);
        let mut frames = Vec::new();
        b.link_mut()
            .recv_batch(now, usize::MAX, &mut |f| frames.push(f.to_vec()));
        assert!(frames.len() >= 2, "{} frames", frames.len());
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        for good in &frames {
            // A flipped payload bit: the checksum catches it after the fast path has
            // copied the payload into the ring, and nothing becomes readable.
            let mut bad = good.clone();
            let last = bad.len() - 1;
            bad[last] ^= 0x10;
            let before = b.stats().rx_bad_checksum;
            b.receive_frame(now, &bad);
            assert_eq!(b.stats().rx_bad_checksum, before + 1);
            assert_eq!(
                b.conn_mut(cb).unwrap().recv(&mut buf),
                Err(TcpError::WouldBlock)
            );
            // The intact frame is delivered, byte for byte.
            b.receive_frame(now, good);
            while let Ok(n) = b.conn_mut(cb).unwrap().recv(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
        }
        // Whatever the initial window let out, intact and in order.
        assert!(got.len() >= 2000, "{} bytes", got.len());
        assert!(got[..] == data[..got.len()], "delivered bytes differ");
    }

    #[test]
    fn connecting_to_a_closed_port_is_refused() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        let ca = a.connect(SocketAddrV4::new(IP_B, 81), now).unwrap();
        run_until(&mut a, &mut b, &mut now, |a, _| {
            a.conn(ca).is_none_or(|c| c.is_closed())
        });
        assert_eq!(b.stats().tx_rst, 1);
        assert_eq!(b.stats().rx_no_connection, 1);
        // Refused, and forgotten.
        assert!(a.conn(ca).is_none());
        assert_eq!(a.connection_count(), 0);
    }

    #[test]
    fn connect_needs_a_neighbor_and_free_ports() {
        let (la, _lb) = sim::pair(SimConfig::default());
        let mut a = Interface::new(
            la,
            InterfaceConfig {
                ephemeral_ports: 5000..=5001,
                isn_key: Some([0; 16]),
                ..InterfaceConfig::default()
            },
        );
        let remote = SocketAddrV4::new(IP_B, 80);
        assert_eq!(
            a.connect(remote, Instant::ZERO),
            Err(NetifError::NoNeighbor)
        );
        a.add_neighbor(IP_B, MAC_B);
        let h1 = a.connect(remote, Instant::ZERO).unwrap();
        let h2 = a.connect(remote, Instant::ZERO).unwrap();
        assert_ne!(h1, h2);
        assert_eq!(
            a.connect(remote, Instant::ZERO),
            Err(NetifError::NoFreePort)
        );
        // Another remote port: the same local ports are free towards it.
        assert!(a
            .connect(SocketAddrV4::new(IP_B, 81), Instant::ZERO)
            .is_ok());
        assert_eq!(a.listen(9, 1), Ok(()));
        assert_eq!(a.listen(9, 1), Err(NetifError::AddrInUse));
    }

    #[test]
    fn the_backlog_bounds_unaccepted_connections() {
        let (mut a, mut b) = hosts();
        // Without cookies, SYNs beyond the backlog are dropped (see the cookie tests in
        // tests/tcp_syncookie.rs for the default).
        b.core.config.syn_cookies = false;
        let mut now = Instant::ZERO;
        b.listen(80, 2).unwrap();
        let hs: Vec<_> = (0..4)
            .map(|_| a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap())
            .collect();
        for _ in 0..6 {
            a.poll(now);
            b.poll(now);
            now += Duration::from_micros(20);
        }
        assert_eq!(b.connection_count(), 2);
        assert_eq!(b.stats().syn_dropped, 2);
        let established = hs
            .iter()
            .filter(|&&h| a.conn(h).unwrap().state() == State::Established)
            .count();
        assert_eq!(established, 2);
        // Accepting makes room; the dropped SYNs get through on retransmission.
        assert!(b.accept(80).is_some() && b.accept(80).is_some());
        assert!(b.accept(80).is_none());
        run_until(&mut a, &mut b, &mut now, |a, _| {
            hs.iter()
                .all(|&h| a.conn(h).unwrap().state() == State::Established)
        });
        assert_eq!(b.connection_count(), 4);
    }

    /// A held listener (the application's accept queue full) keeps completed connections
    /// established and queued, drops new SYNs and cookie ACKs (no reset, no cookie), and
    /// lets the interface settle; released, the dropped SYNs get in on retransmission.
    #[test]
    fn a_held_listener_keeps_connections_and_drops_new_syns() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        b.listen(80, 4).unwrap();
        let first: Vec<_> = (0..2)
            .map(|_| a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap())
            .collect();
        run_until(&mut a, &mut b, &mut now, |a, _| {
            first
                .iter()
                .all(|&h| a.conn(h).unwrap().state() == State::Established)
        });
        b.hold_accepts(80, true);
        // Held, the two waiting connections do not keep the interface busy.
        b.poll(now);
        assert!(b.settled(now), "held connections kept the interface busy");
        let later: Vec<_> = (0..3)
            .map(|_| a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap())
            .collect();
        for _ in 0..6 {
            a.poll(now);
            b.poll(now);
            now += Duration::from_micros(20);
        }
        assert_eq!(b.connection_count(), 2);
        assert_eq!(b.stats().accept_queue_full, 3);
        assert_eq!(b.stats().syn_dropped, 3);
        assert_eq!((b.stats().tx_rst, b.stats().syn_cookies_sent), (0, 0));
        for &h in &first {
            assert_eq!(a.conn(h).unwrap().state(), State::Established);
        }
        // Released: the queued ones are accepted, the others get in on retransmission.
        b.hold_accepts(80, false);
        assert!(b.accept(80).is_some() && b.accept(80).is_some());
        run_until(&mut a, &mut b, &mut now, |a, _| {
            later
                .iter()
                .all(|&h| a.conn(h).unwrap().state() == State::Established)
        });
        assert_eq!(b.connection_count(), 5);
        assert_eq!(b.stats().tx_rst, 0);
    }

    #[test]
    fn answers_arp_requests_for_its_address() {
        let (la, mut peer) = sim::pair(SimConfig::default());
        let mut a = host(la, MAC_A, IP_A);
        let req = |target: Ipv4Addr| {
            let arp = ArpRepr {
                operation: ArpOperation::Request,
                source_hw: MAC_B,
                source_ip: IP_B,
                target_hw: EthernetAddress([0; 6]),
                target_ip: target,
            };
            let mut f = vec![0u8; 42];
            EthernetRepr {
                src: MAC_B,
                dst: EthernetAddress::BROADCAST,
                ethertype: EtherType::Arp,
            }
            .emit(&mut f)
            .unwrap();
            arp.emit(&mut f[14..]).unwrap();
            f
        };
        peer.send_frame(Instant::ZERO, &req(Ipv4Addr::new(10, 0, 0, 99)));
        peer.send_frame(Instant::ZERO, &req(IP_A));
        peer.flush(Instant::ZERO);
        a.poll(Instant::from_micros(10));
        let mut replies = Vec::new();
        peer.recv_batch(Instant::from_micros(20), 8, &mut |f| {
            replies.push(f.to_vec())
        });
        assert_eq!(replies.len(), 1);
        let ef = EthernetFrame::new_checked(&replies[0][..]).unwrap();
        assert_eq!(ef.dst_addr(), MAC_B);
        let arp = ArpRepr::parse(&ArpPacket::new_checked(ef.payload_slice()).unwrap()).unwrap();
        assert_eq!(arp.operation, ArpOperation::Reply);
        assert_eq!((arp.source_hw, arp.source_ip), (MAC_A, IP_A));
        assert_eq!(a.stats().tx_arp_replies, 1);
        assert_eq!(a.stats().rx_not_ours, 1);
        // And it learnt where 10.0.0.2 is.
        assert!(a.connect(SocketAddrV4::new(IP_B, 1), Instant::ZERO).is_ok());
    }

    #[test]
    fn garbage_frames_are_counted_never_fatal() {
        use rand::{Rng, SeedableRng};
        let (la, mut peer) = sim::pair(SimConfig::default());
        let mut a = host(la, MAC_A, IP_A);
        a.listen(80, 8).unwrap();
        // A valid SYN to mutate.
        let valid = syn_frame(b"", |full, _| full);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let mut now = Instant::ZERO;
        for i in 0..5000u32 {
            let mut f = valid.clone();
            match i % 4 {
                0 => f.truncate(rng.gen_range(0..f.len())),
                1 => {
                    let bit = rng.gen_range(14 * 8..f.len() * 8);
                    f[bit / 8] ^= 1 << (bit % 8);
                }
                2 => f = (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect(),
                _ => {
                    // Keep the headers, random bytes for IP and TCP.
                    for b in &mut f[14..] {
                        *b = rng.gen();
                    }
                }
            }
            peer.send_frame(now, &f);
            peer.flush(now);
            now += Duration::from_micros(1);
            a.poll(now);
        }
        a.poll(now + Duration::from_millis(1));
        let s = a.stats();
        assert_eq!(s.rx_frames, 5000);
        assert!(s.rx_malformed > 0 && s.rx_bad_checksum > 0 && s.rx_not_ours > 0);
        // Every single-bit flip past the Ethernet header was caught.
        assert_eq!(a.connection_count(), 0, "{s:?}");
    }
    /// A SYN from B to A's port 80 with `payload`, its TCP checksum field set by `csum`
    /// from the complete checksum and the pseudo-header sum (what a Linux sender with tx
    /// checksum offload leaves there).
    fn syn_frame(payload: &[u8], csum: impl Fn(u16, u16) -> u16) -> Vec<u8> {
        use crate::wire::checksum;
        let syn = TcpRepr {
            src_port: 1234,
            dst_port: 80,
            seq: crate::tcp::SeqNumber(1),
            ack: None,
            flags: TcpFlags::SYN,
            window: 1000,
            urgent: 0,
            options: Default::default(),
        };
        let seg_len = 20 + payload.len();
        let ip = Ipv4Repr {
            src: IP_B,
            dst: IP_A,
            protocol: IpProtocol::Tcp,
            payload_len: seg_len,
            ttl: 64,
            dscp_ecn: 0,
        };
        let eth = EthernetRepr {
            src: MAC_B,
            dst: MAC_A,
            ethertype: EtherType::Ipv4,
        };
        let mut f = vec![0u8; 34 + seg_len];
        crate::wire::emit_tcp_frame(&mut f, &eth, &ip, 1, &syn, payload.len()).unwrap();
        f[54..].copy_from_slice(payload);
        // emit_tcp_frame summed zeroes where the payload now is: recompute.
        let mut tp = TcpPacket::new_unchecked(&mut f[34..]);
        tp.fill_checksum(IP_B, IP_A);
        let full = tp.checksum();
        let pseudo = checksum::pseudo_header_v4(IP_B, IP_A, 6, seg_len as u32);
        tp.set_checksum(csum(full, pseudo));
        f
    }

    /// Sends `frame` from a raw peer to a host listening on 80 (built with `accept`) and
    /// returns its stats and how many frames it answered with.
    fn answer_to(frame: &[u8], accept: bool) -> (InterfaceStats, usize) {
        let (la, mut peer) = sim::pair(SimConfig::default());
        let mut a = Interface::new(
            la,
            InterfaceConfig {
                mac: MAC_A,
                ipv4: IP_A,
                tcp: tcp_config(),
                isn_key: Some([7; 16]),
                accept_partial_checksums: accept,
                ..InterfaceConfig::default()
            },
        );
        a.add_neighbor(IP_B, MAC_B);
        a.listen(80, 8).unwrap();
        peer.send_frame(Instant::ZERO, frame);
        peer.flush(Instant::ZERO);
        a.poll(Instant::from_micros(10));
        let mut answers = 0;
        peer.recv_batch(Instant::from_micros(20), 8, &mut |_| answers += 1);
        (a.stats(), answers)
    }

    #[test]
    fn half_open_connections_hold_no_ring_memory() {
        let (mut a, mut b) = hosts();
        b.listen(80, 64).unwrap();
        let target = SocketAddrV4::new(IP_B, 80);
        let mut now = Instant::ZERO;
        for port in 0..40 {
            a.connect_from(41_000 + port, target, now).unwrap();
        }
        // SYNs out, SYN-ACKs back; A does not complete the handshakes yet.
        a.poll(now);
        for _ in 0..10_000 {
            if b.handles().count() == 40 {
                break;
            }
            now += Duration::from_micros(10);
            b.poll(now);
        }
        let half_open: Vec<_> = b.handles().collect();
        assert_eq!(half_open.len(), 40);
        for &h in &half_open {
            let c = b.conn(h).unwrap();
            assert_eq!(c.state(), State::SynReceived);
            assert_eq!(c.buffer_memory(), 0, "a SYN allocated buffers");
        }
        // Completing one handshake and moving data allocates that connection's rings.
        let first = a.handles().next().unwrap();
        run_until(&mut a, &mut b, &mut now, |a, _| {
            a.conn(first).unwrap().state() == State::Established
        });
        assert_eq!(a.conn_mut(first).unwrap().send(b"hello"), Ok(5));
        run_until(&mut a, &mut b, &mut now, |_, b| {
            b.handles()
                .filter_map(|h| b.conn(h))
                .any(|c| c.recv_queue() == 5)
        });
        let (used, idle): (Vec<_>, Vec<_>) = b
            .handles()
            .filter_map(|h| b.conn(h))
            .partition(|c| c.recv_queue() == 5);
        assert_eq!(used.len(), 1);
        assert!(used[0].buffer_memory() > 0);
        assert!(idle.iter().all(|c| c.buffer_memory() == 0));
    }

    #[test]
    fn partial_checksums_are_accepted_only_when_configured() {
        let data = b"partial checksum payload";
        let partial = syn_frame(data, |_, pseudo| pseudo);
        assert!(
            parse_tcp_frame_checked(&partial).is_none(),
            "a partial checksum does not verify"
        );
        // Default: verified like any other checksum, dropped and counted as bad.
        let (s, answers) = answer_to(&partial, false);
        assert_eq!(
            (s.rx_bad_checksum, s.rx_partial_checksum, answers),
            (1, 0, 0)
        );
        // Trusted link: the SYN opens a connection (a SYN-ACK goes out), counted apart.
        let (s, answers) = answer_to(&partial, true);
        assert_eq!(
            (s.rx_bad_checksum, s.rx_partial_checksum, answers),
            (0, 1, 1)
        );
        // A complete checksum is not counted as partial.
        let (s, answers) = answer_to(&syn_frame(data, |full, _| full), true);
        assert_eq!(
            (s.rx_bad_checksum, s.rx_partial_checksum, answers),
            (0, 0, 1)
        );
        // Neither complete nor partial: still dropped on a trusted link.
        let (s, answers) = answer_to(&syn_frame(data, |_, pseudo| pseudo ^ 0x0100), true);
        assert_eq!(
            (s.rx_bad_checksum, s.rx_partial_checksum, answers),
            (1, 0, 0)
        );
        let (s, answers) = answer_to(&syn_frame(data, |full, _| full.wrapping_add(1)), true);
        assert_eq!(
            (s.rx_bad_checksum, s.rx_partial_checksum, answers),
            (1, 0, 0)
        );
    }

    fn parse_tcp_frame_checked(f: &[u8]) -> Option<()> {
        crate::wire::parse_tcp_frame(f, true).ok().map(|_| ())
    }

    /// A SYN for no connection of B, shown to B's stray hook.
    fn stray_syn_to(b_port: u16, listen: bool) -> (Interface<SimLink>, Interface<SimLink>, u16) {
        let (mut a, mut b) = hosts();
        if listen {
            b.listen(b_port, 4).unwrap();
        }
        let h = a
            .connect_from(40_000, SocketAddrV4::new(IP_B, b_port), Instant::ZERO)
            .unwrap();
        assert_eq!(a.conn(h).unwrap().local(), SocketAddrV4::new(IP_A, 40_000));
        a.poll(Instant::ZERO);
        (a, b, 40_000)
    }

    #[test]
    fn connect_from_uses_the_given_port_once() {
        let (mut a, _b) = hosts();
        let remote = SocketAddrV4::new(IP_B, 80);
        let h = a.connect_from(5555, remote, Instant::ZERO).unwrap();
        let local = SocketAddrV4::new(IP_A, 5555);
        assert_eq!(a.lookup(local, remote), Some(h));
        assert_eq!(
            a.connect_from(5555, remote, Instant::ZERO),
            Err(NetifError::AddrInUse)
        );
        // The same port towards another remote is another 4-tuple.
        let other = SocketAddrV4::new(IP_B, 81);
        assert!(a.connect_from(5555, other, Instant::ZERO).is_ok());
        a.listen(6000, 1).unwrap();
        assert_eq!(
            a.connect_from(6000, remote, Instant::ZERO),
            Err(NetifError::AddrInUse)
        );
        assert_eq!(
            a.connect_from(
                1,
                SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 9), 1),
                Instant::ZERO
            ),
            Err(NetifError::NoNeighbor)
        );
        assert_eq!(a.lookup(local, SocketAddrV4::new(IP_B, 82)), None);
    }

    #[test]
    fn stray_hook_sees_unknown_flows_and_its_verdict_holds() {
        for (listen, verdict) in [
            (false, StrayVerdict::Local),
            (false, StrayVerdict::Forwarded),
            (true, StrayVerdict::Drop),
            (true, StrayVerdict::Local),
        ] {
            let (_a, mut b, port) = stray_syn_to(80, listen);
            let mut seen = Vec::new();
            b.poll_with(Instant::from_micros(100), &mut |s| {
                seen.push((s.local, s.remote, s.syn_to_listener, s.frame.to_vec()));
                verdict
            });
            assert_eq!(seen.len(), 1, "{listen} {verdict:?}");
            let (local, remote, syn_to_listener, frame) = &seen[0];
            assert_eq!(*local, SocketAddrV4::new(IP_B, 80));
            assert_eq!(*remote, SocketAddrV4::new(IP_A, port));
            assert_eq!(*syn_to_listener, listen);
            let tf = crate::wire::parse_tcp_frame(frame, true).unwrap();
            assert!(tf.tcp.flags.syn() && tf.tcp.ack.is_none());
            let s = b.stats();
            let expect = |rst, fwd, dropped, conns| {
                assert_eq!(
                    (
                        s.tx_rst,
                        s.rx_forwarded,
                        s.rx_stray_dropped,
                        b.connection_count()
                    ),
                    (rst, fwd, dropped, conns),
                    "{listen} {verdict:?}"
                )
            };
            match (listen, verdict) {
                (false, StrayVerdict::Local) => expect(1, 0, 0, 0),
                (_, StrayVerdict::Forwarded) => expect(0, 1, 0, 0),
                (_, StrayVerdict::Drop) => expect(0, 0, 1, 0),
                (true, StrayVerdict::Local) => expect(0, 0, 0, 1),
            }
        }
    }

    #[test]
    fn known_flows_never_reach_the_stray_hook() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        b.listen(80, 4).unwrap();
        a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap();
        let mut calls = 0;
        for _ in 0..20 {
            a.poll(now);
            b.poll_with(now, &mut |s| {
                calls += 1;
                assert!(s.syn_to_listener);
                StrayVerdict::Local
            });
            now += Duration::from_micros(50);
        }
        // Only the SYN was stray; the rest of the handshake found the connection.
        assert_eq!(calls, 1);
        assert!(b.accept(80).is_some());
    }

    #[test]
    fn a_forwarded_syn_opens_the_connection_on_the_owner() {
        let (_a, mut b, port) = stray_syn_to(80, false);
        let mut taken = None;
        b.poll_with(Instant::from_micros(100), &mut |s| {
            taken = Some(s.frame.to_vec());
            StrayVerdict::Forwarded
        });
        // The owner: same addresses, its own link, listening on the port.
        let (lo, mut peer) = sim::pair(SimConfig::default());
        let mut owner = host(lo, MAC_B, IP_B);
        owner.add_neighbor(IP_A, MAC_A);
        owner.listen(80, 4).unwrap();
        let syn = taken.unwrap();
        owner.receive_frame(Instant::from_micros(200), &syn);
        let local = SocketAddrV4::new(IP_B, 80);
        let remote = SocketAddrV4::new(IP_A, port);
        let h = owner.lookup(local, remote).expect("passive connection");
        assert_eq!(owner.conn(h).unwrap().state(), State::SynReceived);
        owner.poll(Instant::from_micros(200));
        let mut frames = Vec::new();
        peer.recv_batch(Instant::from_millis(1), 8, &mut |f| frames.push(f.to_vec()));
        assert_eq!(frames.len(), 1);
        let tf = crate::wire::parse_tcp_frame(&frames[0], true).unwrap();
        assert!(tf.tcp.flags.syn() && tf.tcp.flags.ack());
        assert_eq!((tf.tcp.src_port, tf.tcp.dst_port), (80, port));
        // A forwarded segment for no flow and no listener is reset as usual.
        let mut lone = host(sim::pair(SimConfig::default()).0, MAC_B, IP_B);
        lone.add_neighbor(IP_A, MAC_A);
        lone.receive_frame(Instant::ZERO, &syn);
        assert_eq!(lone.stats().rx_no_connection, 1);
        assert_eq!(lone.connection_count(), 0);
    }

    #[test]
    fn an_rx_drop_rule_drops_only_the_chosen_data_segments_of_its_sender() {
        let from = SocketAddrV4::new(IP_B, 80);
        let mut rule = RxDrop {
            from,
            skip: 2,
            count: 2,
            seen: 0,
            dropped: 0,
        };
        let other = SocketAddrV4::new(IP_B, 81);
        let verdicts: Vec<bool> = (0..6).map(|_| rule.drops(from)).collect();
        assert_eq!(verdicts, [false, false, true, true, false, false]);
        assert!(!rule.drops(other), "another sender is never counted");
        assert_eq!((rule.seen, rule.dropped), (6, 2));
    }
}
