//! What a channel set counts: SYNs and cookies, receive checksums, and each queue's work.

use std::sync::atomic::AtomicU64;

use super::place::DriverPlace;
use super::sys::XskDrops;
use crate::link::packet_stats::PacketLinkStats;
use crate::link::umem_memory::UmemPlacement;
use crate::link::xdp::{TxChecksum, XdpBinding};

/// A queue's SYN and SYN-cookie counters, copied from its interface every round.
#[derive(Debug, Default)]
pub(crate) struct SynCounters {
    pub(crate) dropped: AtomicU64,
    pub(crate) cookies_sent: AtomicU64,
    pub(crate) cookies_accepted: AtomicU64,
    pub(crate) cookies_rejected: AtomicU64,
    /// Incremented by the round itself (not copied from the interface).
    pub(crate) neighbor_mismatches: AtomicU64,
    pub(crate) neighbor_unverified: AtomicU64,
    pub(crate) neighbor_reprobes: AtomicU64,
}

/// Passive-open counters of a [`ChannelSet`](super::ChannelSet), summed over its queues (see
/// [`InterfaceStats`](crate::netif::InterfaceStats) for each).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SynStats {
    /// Whether SYN cookies are on ([`ChannelSetConfig::syn_cookies`](super::ChannelSetConfig::syn_cookies)).
    pub cookies_enabled: bool,
    /// SYNs (or valid cookie ACKs) dropped for want of room.
    pub dropped: u64,
    /// SYN-ACKs sent with a cookie.
    pub cookies_sent: u64,
    /// Connections opened from a valid cookie.
    pub cookies_accepted: u64,
    /// ACKs whose cookie was forged or expired.
    pub cookies_rejected: u64,
    /// Passive opens aborted because the peer's MAC differed from the neighbour table's
    /// entry for its address.
    pub neighbor_mismatches: u64,
    /// Passive opens accepted with the SYN's MAC because the neighbour table had no
    /// usable entry for the peer, or its probe went unanswered.
    pub neighbor_unverified: u64,
    /// Passive opens whose MAC a learnt neighbour entry disputed: the kernel was asked to
    /// resolve the address anew (one probe per address at a time), and the connection
    /// was refused only if the owner's answer named another MAC.
    pub neighbor_reprobes: u64,
}

/// A queue's receive checksum counters, copied from its interface every round.
#[derive(Debug, Default)]
pub(crate) struct ChecksumCounters {
    pub(crate) partial: AtomicU64,
    pub(crate) bad: AtomicU64,
}

/// Receive checksum counters of a [`ChannelSet`](super::ChannelSet), summed over its queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxChecksumStats {
    /// Whether segments with a partial checksum are accepted (the resolved
    /// [`PartialChecksums`](super::PartialChecksums) policy).
    pub accept_partial: bool,
    /// Segments accepted with a partial checksum.
    pub partial: u64,
    /// IPv4 headers and TCP segments dropped for a checksum that does not verify.
    pub bad: u64,
}

/// One queue's driver, as [`ChannelSet::queue_stats`](super::ChannelSet::queue_stats) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStats {
    /// The NIC queue.
    pub queue: u32,
    /// Where its driver runs now.
    pub place: DriverPlace,
    /// The core of the queue runtime that drives it, when that runtime is pinned.
    pub core: Option<usize>,
    /// Time its drivers spent in polls that ran rounds since the set started (whatever
    /// runtime ran them): the queue's protocol work. Sample it twice for a utilisation.
    pub busy: std::time::Duration,
    /// Rounds run since the set started.
    pub rounds: u64,
    /// Polls of its drivers since the set started.
    pub polls: u64,
    /// Wake-ups of its driver by enqueues, commands and resumes since the set started
    /// (coalesced ones not counted; arrivals and timers wake it through its runtime).
    pub wakeups: u64,
    /// What the kernel dropped at the queue's AF_XDP socket (its rx ring full, its fill
    /// ring empty); `None` for links without one.
    pub xsk_drops: Option<XskDrops>,
    /// How the queue's AF_XDP socket is bound (zero copy, or copy mode and why); `None`
    /// for links that are not AF_XDP sockets.
    pub binding: Option<XdpBinding>,
    /// Where the queue's UMEM lives (size, NUMA node, huge pages); `None` for links that
    /// are not AF_XDP sockets.
    pub umem: Option<UmemPlacement>,
    /// Who completes the TCP checksums the queue's AF_XDP socket sends: the device or the
    /// kernel through TX metadata, or the link itself and why; `None` for links that are
    /// not AF_XDP sockets.
    pub tx_checksum: Option<TxChecksum>,
    /// The queue's AF_PACKET link's counters (super-segments sent and coalesced frames
    /// received, full sends, drops), cumulative since the set started; `None` for links
    /// that are not AF_PACKET sockets.
    pub packet: Option<PacketLinkStats>,
}

impl QueueStats {
    /// Frames the kernel dropped at the queue's socket for want of room (an AF_XDP
    /// socket's full rx ring or empty fill ring; an AF_PACKET socket's full receive
    /// buffer), cumulative; 0 for links without a kernel socket.
    pub fn kernel_rx_drops(&self) -> u64 {
        self.xsk_drops.map_or(0, |d| d.rx_dropped) + self.packet.map_or(0, |p| p.rx_socket_drops)
    }
}
