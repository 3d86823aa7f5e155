//! Neighbour resolution through the kernel's neighbour (ARP) table.
//!
//! The stack does not run ARP itself: the XDP program passes ARP frames to the kernel,
//! which keeps answering and resolving as it does for any interface. When the stack needs
//! a peer's MAC address it reads it from the kernel's neighbour table over a
//! `NETLINK_ROUTE` socket ([`KernelNeighbors::lookup`]); when the entry is missing it makes
//! the kernel resolve it and waits for the answer ([`KernelNeighbors::resolve`]).
//!
//! # Choices
//!
//! - **Netlink crates.** `netlink-sys` (the socket), `netlink-packet-core` (message
//!   framing) and `netlink-packet-route` (the `RTM_*NEIGH`/`RTM_*LINK` payloads), used
//!   synchronously without their optional async features: they are the maintained
//!   rust-netlink family behind `rtnetlink`, typed down to the neighbour states, MIT
//!   licensed, and pull in no runtime. Versions 0.9 / 0.9 / 0.34 are released together.
//!   (`neli` would also do, but its route-family types are thinner and we would decode
//!   `ndmsg` by hand.)
//! - **Lookup.** An `RTM_GETNEIGH` dump of the IPv4 family, filtered by interface in the
//!   request (`NDA_IFINDEX`, which the kernel honours) and again on reception. An entry
//!   counts when its state is `REACHABLE`, `STALE`, `DELAY`, `PROBE` or `PERMANENT` and it
//!   carries a 6-byte link-layer address. `STALE` is accepted on purpose: the kernel keeps
//!   the address until it proves wrong, and re-verifies it by itself whenever the kernel
//!   sends to that peer. `INCOMPLETE` (resolution in progress), `FAILED`, `NOARP` and
//!   `NONE` entries give `None`.
//! - **Triggering resolution.** [`KernelNeighbors::resolve`] sends one empty UDP datagram
//!   to the peer's discard port (9) from a kernel UDP socket bound to the interface with
//!   `SO_BINDTODEVICE`. Sending through an unresolved neighbour makes the kernel create
//!   the entry in state `INCOMPLETE` and broadcast an ARP request at once, synchronously
//!   in `send`. Binding to the device makes the route lookup use that interface even when
//!   another one could reach the address. It needs no netlink write privilege (unlike
//!   `RTM_NEWNEIGH` with `NTF_USE`) and leaves no state behind; the peer answers the
//!   datagram with an ICMP port-unreachable at worst. If `SO_BINDTODEVICE` is refused
//!   (`EPERM` without `CAP_NET_RAW`), the datagram is sent through whatever route the
//!   kernel picks, which for an on-link peer is the same interface. The address must be
//!   on-link (the next hop): for an address behind a gateway the kernel resolves the
//!   gateway instead, and `resolve` then times out.
//! - **Checking a passive open's MAC** ([`judge_peer_mac`], [`PeerMacProbes`]). An entry
//!   the kernel learnt (`REACHABLE`, `STALE`, `DELAY`, `PROBE`) is no evidence against the
//!   MAC a SYN came from: one unsolicited ARP packet sets it (a gratuitous ARP makes it
//!   `STALE`, an unicast reply `REACHABLE`), and with the stack's traffic on AF_XDP the
//!   kernel never sends to that peer, so never re-verifies it. Only an entry set by hand
//!   (`PERMANENT`) refuses a passive open outright. A learnt entry that disagrees costs a
//!   probe instead: the connection keeps the SYN's MAC (the host there completed the
//!   handshake), and [`KernelNeighbors::reprobe`] makes the kernel forget the entry and
//!   ask the address's owner (one broadcast ARP request); if the answer names another MAC
//!   the connection is refused then, otherwise the kernel's entry is corrected too.
//! - **Waiting.** `resolve` polls the table with a bounded exponential backoff (1 ms
//!   doubling to 50 ms, never past the deadline) until the entry is usable
//!   ([`KernelNeighbors::resolve`] returns the MAC), `FAILED` ([`NeighError::Unreachable`]:
//!   the kernel's probes went unanswered; by default it takes `mcast_solicit` (3) probes
//!   `retrans_time_ms` (1 s) apart, so about 3 s), or the deadline passes
//!   ([`NeighError::Timeout`]).
//!
//! # Network namespaces
//!
//! A netlink socket belongs to the network namespace of the thread that opened it, for its
//! whole life: [`KernelNeighbors::open`] on a thread that has entered a namespace (with
//! `setns(2)`, as the test bed's `run_in` does) reads that namespace's table, whichever
//! thread later uses it. The trigger socket of [`KernelNeighbors::resolve`], however, is
//! created when `resolve` runs, so `resolve` checks that the calling thread is still in the
//! table's namespace and returns [`NeighError::WrongNamespace`] otherwise. [`ifindex_of`]
//! and [`interface_mac`] likewise work in the calling thread's namespace. (Reading
//! `/sys/class/net` would not: sysfs shows the namespace of whoever mounted it.)

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP,
    NLM_F_DUMP_INTR, NLM_F_EXCL, NLM_F_MULTIPART, NLM_F_REQUEST,
};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use nix::errno::Errno;
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;

use crate::wire::EthernetAddress;

/// How long one netlink request may wait for the kernel's reply before it is an error.
const NETLINK_REPLY_TIMEOUT: Duration = Duration::from_secs(2);
/// First pause between two polls of the table in [`KernelNeighbors::resolve`].
const BACKOFF_FIRST: Duration = Duration::from_millis(1);
/// Longest pause between two polls of the table in [`KernelNeighbors::resolve`].
const BACKOFF_MAX: Duration = Duration::from_millis(50);
/// How often a dump interrupted by concurrent table changes is retried.
const DUMP_RETRIES: usize = 4;
/// UDP port the resolution trigger is sent to (discard, RFC 863).
const TRIGGER_PORT: u16 = 9;

/// Why a neighbour could not be looked up or resolved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NeighError {
    /// A netlink socket operation, or a request the kernel refused, failed.
    #[error("netlink {op} failed: {source}")]
    Netlink {
        /// The operation (`"socket"`, `"send RTM_GETNEIGH"`, ...).
        op: &'static str,
        /// The error of the system call, or the errno of the kernel's netlink error reply.
        source: io::Error,
    },
    /// The kernel's reply could not be decoded.
    #[error("cannot decode the kernel's reply to {op}: {detail}")]
    Decode {
        /// The request that was answered.
        op: &'static str,
        /// What the decoder said.
        detail: String,
    },
    /// No interface of that name or index exists in this network namespace.
    #[error("no network interface {0} in this network namespace")]
    InterfaceNotFound(String),
    /// The interface has no 6-byte (Ethernet) hardware address.
    #[error("interface {0} has no Ethernet address")]
    NoMacAddress(String),
    /// The kernel UDP socket that triggers ARP could not be created, bound or sent from.
    #[error("cannot trigger ARP resolution of {ip} on {ifname}: {op}: {source}")]
    Trigger {
        /// The address being resolved.
        ip: Ipv4Addr,
        /// The interface.
        ifname: String,
        /// The step that failed.
        op: &'static str,
        /// The error of the system call.
        source: io::Error,
    },
    /// No usable entry appeared before the deadline: ARP is still unanswered.
    #[error(
        "no neighbour entry for {ip} on ifindex {ifindex} after {waited:?}: ARP unanswered so far"
    )]
    Timeout {
        /// The address being resolved.
        ip: Ipv4Addr,
        /// The interface.
        ifindex: u32,
        /// How long `resolve` waited.
        waited: Duration,
    },
    /// The kernel gave up: the entry is `FAILED` (all its ARP probes went unanswered).
    #[error("{ip} is unreachable on ifindex {ifindex}: the kernel's ARP resolution failed")]
    Unreachable {
        /// The address being resolved.
        ip: Ipv4Addr,
        /// The interface.
        ifindex: u32,
    },
    /// `resolve` ran on a thread in another network namespace than the one the table was
    /// opened in, so its trigger would have gone to the wrong namespace.
    #[error(
        "the neighbour table was opened in another network namespace than the calling thread's"
    )]
    WrongNamespace,
}

/// State of a kernel neighbour entry (`NUD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighborState {
    /// `NUD_INCOMPLETE`: the first ARP request is out, no answer yet.
    Incomplete,
    /// `NUD_REACHABLE`: confirmed recently.
    Reachable,
    /// `NUD_STALE`: known but not confirmed recently.
    Stale,
    /// `NUD_DELAY`: stale and in use; the kernel waits for a confirmation before probing.
    Delay,
    /// `NUD_PROBE`: stale, being re-probed by unicast ARP.
    Probe,
    /// `NUD_FAILED`: resolution failed.
    Failed,
    /// `NUD_NOARP`: the device needs no resolution.
    NoArp,
    /// `NUD_PERMANENT`: configured by hand.
    Permanent,
    /// `NUD_NONE`: just created, nothing done yet.
    None,
    /// Any other state value.
    Other(u16),
}

impl NeighborState {
    /// Whether an entry in this state holds an address the stack may use.
    pub fn is_usable(self) -> bool {
        matches!(
            self,
            NeighborState::Reachable
                | NeighborState::Stale
                | NeighborState::Delay
                | NeighborState::Probe
                | NeighborState::Permanent
        )
    }
}

impl From<NeighbourState> for NeighborState {
    fn from(s: NeighbourState) -> Self {
        match s {
            NeighbourState::Incomplete => NeighborState::Incomplete,
            NeighbourState::Reachable => NeighborState::Reachable,
            NeighbourState::Stale => NeighborState::Stale,
            NeighbourState::Delay => NeighborState::Delay,
            NeighbourState::Probe => NeighborState::Probe,
            NeighbourState::Failed => NeighborState::Failed,
            NeighbourState::Noarp => NeighborState::NoArp,
            NeighbourState::Permanent => NeighborState::Permanent,
            NeighbourState::None => NeighborState::None,
            other => NeighborState::Other(u16::from(other)),
        }
    }
}

/// One IPv4 entry of the kernel's neighbour table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighborEntry {
    /// Its state.
    pub state: NeighborState,
    /// Its link-layer address, when it has a 6-byte one (`INCOMPLETE` entries have none).
    pub mac: Option<EthernetAddress>,
}

impl NeighborEntry {
    /// Whether an administrator set the entry (`PERMANENT`): the only entry that outweighs
    /// the MAC a peer's own frames show (see the [module docs](self)).
    pub fn is_set_by_hand(&self) -> bool {
        self.state == NeighborState::Permanent
    }

    /// The address, if the entry is usable ([`NeighborState::is_usable`]).
    pub fn usable_mac(&self) -> Option<EthernetAddress> {
        if self.state.is_usable() {
            self.mac
        } else {
            None
        }
    }
}

/// What the kernel's neighbour table says of the MAC address a passive open came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerMacVerdict {
    /// The entry holds that MAC.
    Agrees,
    /// An entry set by hand names another MAC: the peer is not the address's owner.
    Contradicted(EthernetAddress),
    /// A learnt entry names another MAC: unproven either way (one unsolicited ARP packet
    /// sets such an entry); ask the owner ([`PeerMacProbes`]).
    Disputed(EthernetAddress),
    /// No usable entry.
    Unknown,
}

/// Judges `mac`, the source of a passive open from the entry's address, against `entry`.
pub fn judge_peer_mac(entry: Option<&NeighborEntry>, mac: EthernetAddress) -> PeerMacVerdict {
    match entry.and_then(|e| e.usable_mac().map(|k| (e, k))) {
        None => PeerMacVerdict::Unknown,
        Some((_, known)) if known == mac => PeerMacVerdict::Agrees,
        Some((e, known)) if e.is_set_by_hand() => PeerMacVerdict::Contradicted(known),
        Some((_, known)) => PeerMacVerdict::Disputed(known),
    }
}

/// How a disputed passive open's probe ended ([`PeerMacProbes::poll`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The owner's answer names the connection's MAC: the entry was forged or outdated.
    Confirmed,
    /// The owner's answer names another MAC: the connection came from an impostor.
    Contradicted(EthernetAddress),
    /// No answer, or none that settled it, in time: the connection keeps its MAC.
    Unanswered,
}

/// How long a probe may take: the kernel sends `mcast_solicit` (3) requests
/// `retrans_time_ms` (1 s) apart before it gives up.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(3500);
/// How often [`PeerMacProbes::poll`] reads the table while probes are out.
const PROBE_LOOK_INTERVAL: Duration = Duration::from_millis(10);

/// Passive opens whose MAC a learnt neighbour entry disputed, while the kernel asks each
/// address's owner ([`KernelNeighbors::reprobe`]). One probe per address at a time, at
/// most [`PeerMacProbes::LIMIT`] connections waiting (beyond, a connection keeps its MAC
/// unverified): however many forged ARP packets and connections come, the cost is
/// bounded. Time is passed in.
#[derive(Debug)]
pub struct PeerMacProbes<H> {
    pending: Vec<PendingProbe<H>>,
    next_look: crate::time::Instant,
}

#[derive(Debug)]
struct PendingProbe<H> {
    handle: H,
    ip: Ipv4Addr,
    mac: EthernetAddress,
    deadline: crate::time::Instant,
}

impl<H> Default for PeerMacProbes<H> {
    fn default() -> Self {
        PeerMacProbes {
            pending: Vec::new(),
            next_look: crate::time::Instant::ZERO,
        }
    }
}

impl<H: Copy> PeerMacProbes<H> {
    /// Most connections waiting for a probe's answer.
    pub const LIMIT: usize = 64;

    /// Whether no probe is out.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// When [`poll`](Self::poll) should look next (`None` while no probe is out): a
    /// driver that sleeps until its next deadline must wake for this one too.
    pub fn next_look(&self) -> Option<crate::time::Instant> {
        (!self.pending.is_empty()).then_some(self.next_look)
    }

    /// Starts verifying connection `handle`, which came from `mac` for `ip` on interface
    /// `ifindex`: asks the kernel to resolve `ip` anew unless a probe for it is out
    /// already. Returns false (nothing started) when [`LIMIT`](Self::LIMIT) connections
    /// wait already or the kernel refused the probe.
    pub fn start(
        &mut self,
        table: &mut KernelNeighbors,
        ifindex: u32,
        ip: Ipv4Addr,
        mac: EthernetAddress,
        handle: H,
        now: crate::time::Instant,
    ) -> bool {
        if self.pending.len() >= Self::LIMIT {
            return false;
        }
        if !self.pending.iter().any(|p| p.ip == ip) {
            if let Err(e) = table.reprobe(ifindex, ip) {
                tracing::debug!(%ip, error = %e, "neighbour re-probe refused");
                return false;
            }
            self.next_look = now + PROBE_LOOK_INTERVAL;
        }
        self.pending.push(PendingProbe {
            handle,
            ip,
            mac,
            deadline: now + PROBE_TIMEOUT,
        });
        true
    }

    /// Reads the table (at most every 10 ms) and reports each connection whose probe
    /// ended: `done(handle, ip, outcome)`.
    pub fn poll(
        &mut self,
        table: &mut KernelNeighbors,
        ifindex: u32,
        now: crate::time::Instant,
        mut done: impl FnMut(H, Ipv4Addr, ProbeOutcome),
    ) {
        if self.pending.is_empty() || now < self.next_look {
            return;
        }
        self.next_look = now + PROBE_LOOK_INTERVAL;
        let mut answers: Vec<(Ipv4Addr, Option<NeighborEntry>)> = Vec::new();
        self.pending.retain(|p| {
            let entry = match answers.iter().find(|(ip, _)| *ip == p.ip) {
                Some((_, e)) => *e,
                None => {
                    let e = table.entry(ifindex, p.ip).unwrap_or(None);
                    answers.push((p.ip, e));
                    e
                }
            };
            let outcome = match entry {
                // Resolved anew: the answer to the kernel's request (the probe deleted
                // whatever was learnt before).
                Some(e) if e.state == NeighborState::Reachable || e.is_set_by_hand() => {
                    match e.mac {
                        Some(m) if m == p.mac => Some(ProbeOutcome::Confirmed),
                        Some(m) => Some(ProbeOutcome::Contradicted(m)),
                        None => None,
                    }
                }
                Some(e) if e.state == NeighborState::Failed => Some(ProbeOutcome::Unanswered),
                _ => None,
            };
            let outcome = match outcome {
                None if now >= p.deadline => Some(ProbeOutcome::Unanswered),
                o => o,
            };
            match outcome {
                Some(o) => {
                    done(p.handle, p.ip, o);
                    false
                }
                None => true,
            }
        });
    }
}

/// Identity of a network namespace: device and inode of its `nsfs` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NetnsId {
    dev: u64,
    ino: u64,
}

impl NetnsId {
    /// The namespace of the calling thread.
    fn current() -> io::Result<NetnsId> {
        let meta = std::fs::metadata("/proc/thread-self/ns/net")?;
        Ok(NetnsId {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

/// A `NETLINK_ROUTE` socket on the kernel's neighbour table of one network namespace.
///
/// It belongs to the namespace of the thread that called [`KernelNeighbors::open`] (see
/// the [module docs](self)).
#[derive(Debug)]
pub struct KernelNeighbors {
    socket: Socket,
    seq: u32,
    netns: Option<NetnsId>,
    /// Entries [`entry_confirming`](Self::entry_confirming) read, with when.
    recent: std::collections::HashMap<(u32, Ipv4Addr), (Option<NeighborEntry>, std::time::Instant)>,
    /// The kernel's neighbour-table changes (the `RTMGRP_NEIGH` group), non-blocking: an
    /// entry that changed (a forged ARP rewrote it, say) leaves `recent` before it is
    /// used again. `None` when the subscription failed: then nothing is remembered.
    changes: Option<Socket>,
}

/// The netlink multicast group of neighbour-table changes (`RTMGRP_NEIGH`, as a bind mask).
const RTMGRP_NEIGH: u32 = 4;

/// A netlink socket subscribed to the neighbour table's changes, non-blocking; `None`
/// (with a debug line) when the kernel refuses.
fn subscribe_changes() -> Option<Socket> {
    let open = || -> io::Result<Socket> {
        let mut s = Socket::new(NETLINK_ROUTE)?;
        s.bind(&SocketAddr::new(0, RTMGRP_NEIGH))?;
        s.set_non_blocking(true)?;
        Ok(s)
    };
    match open() {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::debug!(error = %e, "no neighbour-change reports; neighbour entries are read anew each time");
            None
        }
    }
}

/// Most entries [`KernelNeighbors::entry_confirming`] remembers; past it, it forgets them
/// all.
const RECENT_ENTRIES: usize = 1024;

impl KernelNeighbors {
    /// Opens a netlink socket in the calling thread's network namespace.
    pub fn open() -> Result<KernelNeighbors, NeighError> {
        let netlink = |op| move |source| NeighError::Netlink { op, source };
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(netlink("socket"))?;
        socket.bind_auto().map_err(netlink("bind"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(netlink("connect"))?;
        let timeout = TimeVal::new(NETLINK_REPLY_TIMEOUT.as_secs() as _, 0);
        setsockopt(&socket, sockopt::ReceiveTimeout, &timeout).map_err(|e| {
            NeighError::Netlink {
                op: "setsockopt SO_RCVTIMEO",
                source: e.into(),
            }
        })?;
        // Without /proc (unusual), the namespace check of `resolve` is skipped.
        let netns = match NetnsId::current() {
            Ok(id) => Some(id),
            Err(e) => {
                tracing::debug!("cannot identify the network namespace: {e}");
                None
            }
        };
        Ok(KernelNeighbors {
            socket,
            seq: 0,
            netns,
            recent: std::collections::HashMap::new(),
            changes: subscribe_changes(),
        })
    }

    /// Forgets every remembered entry that the kernel reported changed or deleted since
    /// the last look (all of them if reports were lost, or without a subscription).
    fn forget_changed(&mut self) {
        let Some(changes) = self.changes.as_mut() else {
            self.recent.clear();
            return;
        };
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match changes.recv(&mut &mut buf[..], libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                // ENOBUFS: the kernel dropped reports; anything may have changed.
                Err(_) => {
                    self.recent.clear();
                    return;
                }
            };
            let mut offset = 0;
            while offset < n {
                let Ok(msg) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[offset..n])
                else {
                    self.recent.clear();
                    break;
                };
                let len = msg.header.length as usize;
                if let NetlinkPayload::InnerMessage(
                    RouteNetlinkMessage::NewNeighbour(m) | RouteNetlinkMessage::DelNeighbour(m),
                ) = &msg.payload
                {
                    let dst = m.attributes.iter().find_map(|a| match a {
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(d)) => Some(*d),
                        _ => None,
                    });
                    if let Some(ip) = dst {
                        self.recent.remove(&(m.header.ifindex, ip));
                    }
                }
                if len == 0 {
                    break;
                }
                offset += len;
            }
        }
    }

    /// The entry for `ip` on `ifindex`, to check a peer that came from `seen`: what
    /// [`entry`](Self::entry) returned at most `max_age` ago when that entry's usable
    /// MAC address is `seen`, else a fresh [`entry`](Self::entry). Only a match is taken
    /// from memory: a peer from any other address gets the kernel's current answer, as
    /// does one whose entry changed or went. Each `entry` dumps the interface's
    /// neighbour table over netlink: once per accepted connection, that was 7 % of the
    /// protocol thread's time in connection-per-request HTTP
    /// (`docs/investigations/connection-setup.md`), for an answer that changes rarely. At
    /// most [`RECENT_ENTRIES`] are remembered.
    pub fn entry_confirming(
        &mut self,
        ifindex: u32,
        ip: Ipv4Addr,
        seen: EthernetAddress,
        max_age: std::time::Duration,
    ) -> Result<Option<NeighborEntry>, NeighError> {
        let now = std::time::Instant::now();
        self.forget_changed();
        if let Some((entry, at)) = self.recent.get(&(ifindex, ip)) {
            let confirms = entry.and_then(|e| e.usable_mac()) == Some(seen);
            if confirms && now.saturating_duration_since(*at) <= max_age {
                return Ok(*entry);
            }
        }
        let entry = self.entry(ifindex, ip)?;
        if self.recent.len() >= RECENT_ENTRIES {
            self.recent.clear();
        }
        self.recent.insert((ifindex, ip), (entry, now));
        Ok(entry)
    }

    /// The IPv4 entry for `ip` on interface `ifindex`, in whatever state, or `None` when
    /// the kernel has none.
    pub fn entry(
        &mut self,
        ifindex: u32,
        ip: Ipv4Addr,
    ) -> Result<Option<NeighborEntry>, NeighError> {
        let mut req = NeighbourMessage::default();
        req.header.family = AddressFamily::Inet;
        // Strict-checking kernels reject a dump request with ndm_ifindex set; the
        // attribute filter is accepted by both strict and legacy parsing.
        req.attributes.push(NeighbourAttribute::IfIndex(ifindex));
        let replies = self.dump(RouteNetlinkMessage::GetNeighbour(req), "RTM_GETNEIGH")?;
        let entry = replies.into_iter().find_map(|msg| match msg {
            RouteNetlinkMessage::NewNeighbour(n)
                if n.header.family == AddressFamily::Inet && n.header.ifindex == ifindex =>
            {
                let dst = n.attributes.iter().find_map(|a| match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(d)) => Some(*d),
                    _ => None,
                })?;
                if dst != ip {
                    return None;
                }
                let mac = n.attributes.iter().find_map(|a| match a {
                    NeighbourAttribute::LinkLayerAddress(b) if b.len() == 6 => {
                        EthernetAddress::from_bytes(b)
                    }
                    _ => None,
                });
                Some(NeighborEntry {
                    state: n.header.state.into(),
                    mac,
                })
            }
            _ => None,
        });
        Ok(entry)
    }

    /// The MAC address of `ip` on interface `ifindex` if the kernel has a usable entry
    /// (`REACHABLE`, `STALE`, `DELAY`, `PROBE` or `PERMANENT`), else `None`. It never
    /// triggers resolution.
    pub fn lookup(
        &mut self,
        ifindex: u32,
        ip: Ipv4Addr,
    ) -> Result<Option<EthernetAddress>, NeighError> {
        match self.entry(ifindex, ip)?.and_then(|e| e.usable_mac()) {
            Some(mac) => Ok(Some(mac)),
            None => {
                // The dump is silent about an interface that does not exist.
                self.link(ifindex)?;
                Ok(None)
            }
        }
    }

    /// The MAC address of `ip` on interface `ifindex`, making the kernel resolve it with
    /// ARP when its table has no usable entry, and waiting at most about `timeout`
    /// (plus one netlink round trip) for the answer.
    ///
    /// Must run on a thread in the table's network namespace. `ip` must be on-link.
    pub fn resolve(
        &mut self,
        ifindex: u32,
        ip: Ipv4Addr,
        timeout: Duration,
    ) -> Result<EthernetAddress, NeighError> {
        let start = Instant::now();
        let deadline = start + timeout;
        if let Some(mac) = self.lookup(ifindex, ip)? {
            return Ok(mac);
        }
        self.check_namespace()?;
        let (ifname, _) = self.link(ifindex)?;
        trigger_arp(&ifname, ip)?;
        tracing::debug!(%ip, ifindex, "neighbour unknown: ARP triggered");
        let mut backoff = BACKOFF_FIRST;
        loop {
            if let Some(entry) = self.entry(ifindex, ip)? {
                if let Some(mac) = entry.usable_mac() {
                    tracing::debug!(%ip, ifindex, %mac, waited = ?start.elapsed(), "neighbour resolved");
                    return Ok(mac);
                }
                // The trigger moved any old FAILED entry back to INCOMPLETE synchronously,
                // so FAILED now is the verdict of this resolution.
                if entry.state == NeighborState::Failed {
                    return Err(NeighError::Unreachable { ip, ifindex });
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NeighError::Timeout {
                    ip,
                    ifindex,
                    waited: now - start,
                });
            }
            std::thread::sleep(backoff.min(deadline - now));
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Forgets the kernel's entry for `ip` on interface `ifindex` unless it was set by hand
    /// (`RTM_DELNEIGH`) and makes the kernel resolve the address anew (`RTM_NEWNEIGH` with
    /// `NTF_USE`, as `ip neigh add ADDR dev DEV use` does): the new entry starts
    /// `INCOMPLETE` and the kernel broadcasts an ARP request at once, so that the owner's
    /// answer replaces whatever the last unsolicited ARP packet claimed. Does not wait for
    /// the answer. Works from any thread: the netlink socket acts in the table's
    /// namespace. Needs `CAP_NET_ADMIN`.
    pub fn reprobe(&mut self, ifindex: u32, ip: Ipv4Addr) -> Result<(), NeighError> {
        if self.entry(ifindex, ip)?.is_some_and(|e| e.is_set_by_hand()) {
            return Ok(());
        }
        let message = |state: NeighbourState, flags| {
            let mut m = NeighbourMessage::default();
            m.header.family = AddressFamily::Inet;
            m.header.ifindex = ifindex;
            m.header.state = state;
            m.header.flags = flags;
            m.attributes
                .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
            m
        };
        let del = message(NeighbourState::None, NeighbourFlags::empty());
        match self.request(
            RouteNetlinkMessage::DelNeighbour(del),
            NLM_F_ACK,
            "RTM_DELNEIGH",
        ) {
            Err(NeighError::Netlink { source, .. })
                if source.raw_os_error() == Some(Errno::ENOENT as i32) => {}
            other => {
                other?;
            }
        }
        // The state is ignored with NTF_USE; iproute2 sends PERMANENT.
        let add = message(NeighbourState::Permanent, NeighbourFlags::Use);
        match self.request(
            RouteNetlinkMessage::NewNeighbour(add),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            "RTM_NEWNEIGH",
        ) {
            // Someone resolved it in between: that is a fresh answer too.
            Err(NeighError::Netlink { source, .. })
                if source.raw_os_error() == Some(Errno::EEXIST as i32) =>
            {
                Ok(())
            }
            other => other.map(|_| ()),
        }
    }

    /// The MAC address of interface `ifindex`, read with `RTM_GETLINK`.
    pub fn link_mac(&mut self, ifindex: u32) -> Result<EthernetAddress, NeighError> {
        let (name, mac) = self.link(ifindex)?;
        mac.ok_or(NeighError::NoMacAddress(name))
    }

    /// Name and Ethernet address of interface `ifindex` in the table's namespace.
    fn link(&mut self, ifindex: u32) -> Result<(String, Option<EthernetAddress>), NeighError> {
        let not_found = || NeighError::InterfaceNotFound(format!("with index {ifindex}"));
        if ifindex == 0 {
            // Index 0 asks the kernel to look the link up by name instead.
            return Err(not_found());
        }
        let mut req = LinkMessage::default();
        req.header.index = ifindex;
        let replies = match self.request(RouteNetlinkMessage::GetLink(req), 0, "RTM_GETLINK") {
            Err(NeighError::Netlink { source, .. })
                if source.raw_os_error() == Some(Errno::ENODEV as i32) =>
            {
                return Err(not_found())
            }
            other => other?,
        };
        let link = replies
            .into_iter()
            .find_map(|msg| match msg {
                RouteNetlinkMessage::NewLink(link) if link.header.index == ifindex => Some(link),
                _ => None,
            })
            .ok_or_else(not_found)?;
        let mut name = None;
        let mut mac = None;
        for attr in link.attributes {
            match attr {
                LinkAttribute::IfName(n) => name = Some(n),
                LinkAttribute::Address(b) if b.len() == 6 => mac = EthernetAddress::from_bytes(&b),
                _ => {}
            }
        }
        Ok((name.unwrap_or_else(|| format!("with index {ifindex}")), mac))
    }

    fn check_namespace(&self) -> Result<(), NeighError> {
        match (self.netns, NetnsId::current()) {
            (Some(ours), Ok(now)) if ours != now => Err(NeighError::WrongNamespace),
            _ => Ok(()),
        }
    }

    /// A dump request, retried when the kernel flags it as interrupted by table changes.
    fn dump(
        &mut self,
        msg: RouteNetlinkMessage,
        op: &'static str,
    ) -> Result<Vec<RouteNetlinkMessage>, NeighError> {
        for _ in 0..DUMP_RETRIES {
            match self.request(msg.clone(), NLM_F_DUMP, op) {
                Err(NeighError::Decode { detail, .. }) if detail == DUMP_INTERRUPTED => continue,
                other => return other,
            }
        }
        Err(NeighError::Decode {
            op,
            detail: format!("{DUMP_INTERRUPTED} {DUMP_RETRIES} times in a row"),
        })
    }

    /// Sends one request and collects the replies to it.
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        op: &'static str,
    ) -> Result<Vec<RouteNetlinkMessage>, NeighError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut req = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        req.finalize();
        let mut buf = vec![0; req.buffer_len()];
        req.serialize(&mut buf);
        self.socket
            .send(&buf, 0)
            .map_err(|source| NeighError::Netlink { op, source })?;

        let mut out = Vec::new();
        let mut interrupted = false;
        loop {
            let (data, _) = self
                .socket
                .recv_from_full()
                .map_err(|source| NeighError::Netlink { op, source })?;
            let mut offset = 0;
            while offset < data.len() {
                let reply: NetlinkMessage<RouteNetlinkMessage> =
                    NetlinkMessage::deserialize(&data[offset..]).map_err(|e| {
                        NeighError::Decode {
                            op,
                            detail: e.to_string(),
                        }
                    })?;
                let len = reply.header.length as usize;
                if len == 0 {
                    break;
                }
                offset += (len + 3) & !3;
                if reply.header.sequence_number != seq {
                    // A late reply to an earlier request that gave up.
                    continue;
                }
                interrupted |= reply.header.flags & NLM_F_DUMP_INTR != 0;
                let multipart = reply.header.flags & NLM_F_MULTIPART != 0;
                match reply.payload {
                    NetlinkPayload::Done(_) => return finish(out, interrupted, op),
                    NetlinkPayload::Error(err) => match err.code {
                        Some(_) => {
                            return Err(NeighError::Netlink {
                                op,
                                source: err.to_io(),
                            })
                        }
                        None => return finish(out, interrupted, op),
                    },
                    NetlinkPayload::InnerMessage(m) => {
                        out.push(m);
                        if !multipart {
                            return finish(out, interrupted, op);
                        }
                    }
                    NetlinkPayload::Overrun(_) => {
                        return Err(NeighError::Decode {
                            op,
                            detail: "netlink overrun".into(),
                        })
                    }
                    _ => {}
                }
            }
        }
    }
}

const DUMP_INTERRUPTED: &str = "dump interrupted by a concurrent change";

fn finish(
    out: Vec<RouteNetlinkMessage>,
    interrupted: bool,
    op: &'static str,
) -> Result<Vec<RouteNetlinkMessage>, NeighError> {
    if interrupted {
        Err(NeighError::Decode {
            op,
            detail: DUMP_INTERRUPTED.into(),
        })
    } else {
        Ok(out)
    }
}

/// Sends the empty UDP datagram that makes the kernel resolve `ip` on `ifname`.
fn trigger_arp(ifname: &str, ip: Ipv4Addr) -> Result<(), NeighError> {
    let err = |op| {
        move |source| NeighError::Trigger {
            ip,
            ifname: ifname.to_string(),
            op,
            source,
        }
    };
    let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)).map_err(err("bind"))?;
    match setsockopt(
        &sock,
        sockopt::BindToDevice,
        &std::ffi::OsString::from(ifname),
    ) {
        Ok(()) => {}
        Err(Errno::EPERM) => {
            tracing::debug!(
                ifname,
                "SO_BINDTODEVICE not permitted; the route picks the interface"
            )
        }
        Err(e) => return Err(err("SO_BINDTODEVICE")(e.into())),
    }
    sock.connect(SocketAddrV4::new(ip, TRIGGER_PORT))
        .map_err(err("connect"))?;
    sock.send(&[]).map_err(err("send"))?;
    Ok(())
}

/// The index of interface `name` in the calling thread's network namespace
/// (`if_nametoindex(3)`).
pub fn ifindex_of(name: &str) -> Result<u32, NeighError> {
    nix::net::if_::if_nametoindex(name).map_err(|_| NeighError::InterfaceNotFound(name.to_string()))
}

/// The MAC address of interface `name` in the calling thread's network namespace.
pub fn interface_mac(name: &str) -> Result<EthernetAddress, NeighError> {
    let ifindex = ifindex_of(name)?;
    KernelNeighbors::open()?
        .link_mac(ifindex)
        .map_err(|e| match e {
            NeighError::NoMacAddress(_) => NeighError::NoMacAddress(name.to_string()),
            NeighError::InterfaceNotFound(_) => NeighError::InterfaceNotFound(name.to_string()),
            other => other,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usable_states() {
        use NeighborState::*;
        for s in [Reachable, Stale, Delay, Probe, Permanent] {
            assert!(s.is_usable(), "{s:?}");
        }
        for s in [Incomplete, Failed, NoArp, None, Other(0x300)] {
            assert!(!s.is_usable(), "{s:?}");
        }
    }

    #[test]
    fn entry_without_mac_is_not_usable() {
        let e = NeighborEntry {
            state: NeighborState::Reachable,
            mac: Option::None,
        };
        assert_eq!(e.usable_mac(), Option::None);
        let mac = EthernetAddress([2, 0, 0, 0, 0, 1]);
        let e = NeighborEntry {
            state: NeighborState::Incomplete,
            mac: Some(mac),
        };
        assert_eq!(e.usable_mac(), Option::None);
        let e = NeighborEntry {
            state: NeighborState::Stale,
            mac: Some(mac),
        };
        assert_eq!(e.usable_mac(), Some(mac));
    }

    /// Only an entry set by hand outweighs the MAC a passive open came from; a learnt one
    /// that disagrees is disputed (probe), and no entry is unknown.
    #[test]
    fn judging_a_peer_mac() {
        let (syn, other) = (
            EthernetAddress([2, 0, 0, 0, 0, 1]),
            EthernetAddress([2, 0, 0, 0, 0, 2]),
        );
        let e = |state, mac| NeighborEntry {
            state,
            mac: Some(mac),
        };
        use NeighborState::*;
        assert_eq!(judge_peer_mac(Option::None, syn), PeerMacVerdict::Unknown);
        for state in [Reachable, Stale, Delay, Probe, Permanent] {
            assert_eq!(
                judge_peer_mac(Some(&e(state, syn)), syn),
                PeerMacVerdict::Agrees
            );
        }
        for state in [Reachable, Stale, Delay, Probe] {
            assert_eq!(
                judge_peer_mac(Some(&e(state, other)), syn),
                PeerMacVerdict::Disputed(other),
                "{state:?}"
            );
        }
        assert_eq!(
            judge_peer_mac(Some(&e(Permanent, other)), syn),
            PeerMacVerdict::Contradicted(other)
        );
        for state in [Incomplete, Failed, NoArp, None] {
            assert_eq!(
                judge_peer_mac(Some(&e(state, other)), syn),
                PeerMacVerdict::Unknown
            );
        }
    }

    #[test]
    fn state_conversion() {
        assert_eq!(
            NeighborState::from(NeighbourState::Failed),
            NeighborState::Failed
        );
        assert_eq!(
            NeighborState::from(NeighbourState::from(0x80u16)),
            NeighborState::Permanent
        );
        assert_eq!(
            NeighborState::from(NeighbourState::from(0x300u16)),
            NeighborState::Other(0x300)
        );
    }

    #[test]
    fn unknown_interface() {
        assert!(matches!(
            ifindex_of("nc-no-such-if0"),
            Err(NeighError::InterfaceNotFound(n)) if n == "nc-no-such-if0"
        ));
    }
}
