//! Read-only statistics snapshots: everything a [`NetScheduler`](crate::NetScheduler)
//! decides from.
//!
//! The virtual-socket layer builds these; a scheduler only reads them. Every counter a
//! producer cannot measure yet is 0 (or `None`, or an empty list) and documented as such
//! where it is filled, so a policy must treat 0 as "unknown or nothing", never as a
//! promise.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{AppClass, ChannelClass, ChannelId};

/// A remote host, numbered by the layer that creates channels to it (the same number the
/// virtual-socket layer uses for the peer).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct PeerId(pub u32);

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "peer{}", self.0)
    }
}

/// One queue runtime of a stack: a thread of the stack's own that drives one or more NIC
/// queues, and so runs the protocol of every channel on them. Queues driven on a runtime
/// the stack was handed (the application's, a latency application's) have none.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct ChannelThreadId(pub u32);

/// One copy worker of a stack, by its index in the stack's worker pool.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct CopyWorkerId(pub u32);

/// A statistics snapshot of one channel, as the scheduler sees it.
///
/// Build one with a struct literal ending in `..ChannelStats::default()`, so that fields
/// added later keep such code compiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChannelStats {
    /// The channel.
    pub id: ChannelId,
    /// What the channel is reserved for.
    pub class: ChannelClass,
    /// The peer host the channel leads to.
    pub peer: PeerId,
    /// Bytes accepted for this channel and not yet sent on the wire (chunks waiting in the
    /// virtual-socket layer's outbox plus the channel's own unsent transmit queue).
    pub queued_bytes: u64,
    /// Bytes sent on the wire and not yet acknowledged by the peer's channel.
    pub in_flight_bytes: u64,
    /// The channel's congestion window in bytes; 0 when unknown (a channel without TCP
    /// beneath it, such as an in-memory one, has none).
    pub cwnd_bytes: u64,
    /// The channel's smoothed round-trip time; `None` before the first sample or without
    /// TCP beneath the channel.
    pub srtt: Option<Duration>,
    /// Segments the channel retransmitted since it opened (cumulative).
    pub retransmitted_segments: u64,
    /// Payload bytes the channel sent since it opened (cumulative, retransmissions
    /// included): the difference between two snapshots is the channel's recent rate.
    pub sent_bytes: u64,
    /// The queue runtime that drives the channel's NIC queue; `None` when unknown or when
    /// the queue is driven on a runtime that is not the stack's own.
    pub thread: Option<ChannelThreadId>,
    /// The NIC queue the channel's connection lives on (its runtime is the queue's, see
    /// [`StackSnapshot::queues`]); `None` when unknown or without one.
    #[serde(default)]
    pub queue: Option<u32>,
    /// How the channel's received frames reach its queue; `None` when unknown (no NIC
    /// queue beneath it). A [`Steering::Forwarded`] channel costs two threads work per
    /// frame it receives on another queue than its own.
    #[serde(default)]
    pub steering: Option<Steering>,
    /// For a channel this host opened, whether its local port was chosen to land on a
    /// queue of its class at the peer as well (the peer described its RSS); `None` for an
    /// accepted channel, or when unknown.
    #[serde(default)]
    pub peer_steering: Option<PeerSteering>,
}

/// How a channel's received frames reach the NIC queue (and so the thread) that runs it:
/// the channel layer's record, made when the channel was opened or accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Steering {
    /// Accepted by this host: run by the queue its SYN arrived on, where the NIC's
    /// receive-side scaling puts all its frames.
    Accepted,
    /// Opened by this host from a local port whose replies the NIC's receive-side scaling
    /// delivers to the channel's queue.
    Aligned,
    /// Opened by this host, its frames steered to the channel's queue by a NIC flow
    /// (ntuple) rule.
    Rule,
    /// Opened by this host without alignment (none possible, or turned off): frames that
    /// arrive on another queue are handed over to the channel's by that queue's thread.
    Forwarded,
}

/// Where a channel this host opened lands at the peer, whose receive-side scaling picks
/// the queue (and so the thread) that runs the channel there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PeerSteering {
    /// The peer's RSS was not known when the channel opened: it lands wherever the peer's
    /// RSS puts its port.
    Unknown,
    /// Its port lands on this queue at the peer, one of the peer's queues of the channel's
    /// class.
    Aligned {
        /// The peer's queue.
        queue: u32,
    },
    /// The peer's RSS was known, but no free port landed on a queue of the class there
    /// and on the channel's own queue here.
    Missed,
}

/// How busy one queue runtime was over the last measuring window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ThreadStats {
    /// The runtime.
    pub id: ChannelThreadId,
    /// The core the runtime's thread is pinned to; `None` when it is not pinned (or
    /// unknown).
    pub core: Option<usize>,
    /// Time the runtime spent driving its queues (not sleeping or waiting) within
    /// `window`.
    pub busy: Duration,
    /// The measuring window.
    pub window: Duration,
    /// Frames for the runtime's NIC queues that the kernel dropped within `window`
    /// because an AF_XDP rx ring was full or a fill ring empty, or an AF_PACKET socket's
    /// receive buffer was full: a runtime that does not keep up loses frames, which its
    /// channels then retransmit. 0 when unknown.
    #[serde(default)]
    pub rx_dropped: u64,
}

impl ThreadStats {
    /// Busy time over the window, in `0.0..=1.0`; 0 for an empty window.
    pub fn utilisation(&self) -> f64 {
        if self.window.is_zero() {
            return 0.0;
        }
        (self.busy.as_secs_f64() / self.window.as_secs_f64()).clamp(0.0, 1.0)
    }
}

/// One NIC queue and the queue runtime that drives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QueueStats {
    /// The queue.
    pub queue: u32,
    /// The runtime that drives it (every channel on the queue runs there).
    pub thread: ChannelThreadId,
}

/// One virtual socket (a flow), as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FlowStats {
    /// The flow's number, the same as [`ChunkInfo::flow`](crate::ChunkInfo::flow).
    pub flow: u64,
    /// The peer host of the socket.
    pub peer: PeerId,
    /// What the application declared the socket to be.
    pub class: AppClass,
    /// Bytes the application wrote that have not been cut into chunks yet.
    pub queued_bytes: u64,
    /// Bytes per second the socket sent recently; 0 when unknown.
    pub recent_rate_bps: u64,
}

/// One copy worker, as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CopyWorkerStats {
    /// The worker.
    pub id: CopyWorkerId,
    /// The core it is pinned to, when known.
    pub core: Option<usize>,
    /// Bytes of copies handed to it and not finished yet.
    pub queued_bytes: u64,
}

/// Everything a scheduler's slow-period [`plan`](crate::NetScheduler::plan) looks at: every
/// channel to every peer, the queue runtimes, the sockets and the copy workers.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StackSnapshot {
    /// Every channel, to every peer, of every class.
    pub channels: Vec<ChannelStats>,
    /// The stack's own queue runtimes.
    pub threads: Vec<ThreadStats>,
    /// Which queue runtime drives each NIC queue (the placement); queues driven on a
    /// runtime that is not the stack's own are not listed, and the list is empty when
    /// the stack has no queues.
    #[serde(default)]
    pub queues: Vec<QueueStats>,
    /// The virtual sockets.
    pub flows: Vec<FlowStats>,
    /// The copy workers.
    pub copy_workers: Vec<CopyWorkerStats>,
    /// The cores the stack may place queue runtimes on; empty when unknown.
    pub cores: Vec<usize>,
}

impl StackSnapshot {
    /// The peers some channel leads to, in order.
    pub fn peers(&self) -> BTreeSet<PeerId> {
        self.channels.iter().map(|c| c.peer).collect()
    }

    /// The channels to `peer`, of every class.
    pub fn channels_to(&self, peer: PeerId) -> impl Iterator<Item = &ChannelStats> + '_ {
        self.channels.iter().filter(move |c| c.peer == peer)
    }

    /// The statistics of queue runtime `id`, if the snapshot has them.
    pub fn thread(&self, id: ChannelThreadId) -> Option<&ThreadStats> {
        self.threads.iter().find(|t| t.id == id)
    }

    /// The queues runtime `id` drives.
    pub fn queues_of(&self, id: ChannelThreadId) -> impl Iterator<Item = u32> + '_ {
        self.queues
            .iter()
            .filter(move |q| q.thread == id)
            .map(|q| q.queue)
    }

    /// The runtime that drives `queue`, if the snapshot says.
    pub fn thread_of_queue(&self, queue: u32) -> Option<ChannelThreadId> {
        self.queues
            .iter()
            .find(|q| q.queue == queue)
            .map(|q| q.thread)
    }

    /// The core channel `id` runs on: its queue runtime's core, when both are known.
    pub fn core_of(&self, id: ChannelId) -> Option<usize> {
        let channel = self.channels.iter().find(|c| c.id == id)?;
        self.thread(channel.thread?)?.core
    }
}
