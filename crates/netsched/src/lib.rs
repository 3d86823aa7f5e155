//! The NetChannel scheduler layer.
//!
//! A [`NetScheduler`] makes three kinds of decision for a stack, each from read-only
//! statistics snapshots; it never touches a channel, a socket or a queue itself, so users
//! can write their own policies against the trait:
//!
//! 1. **Per chunk** ([`NetScheduler::pick_channel`]): which channel carries each chunk of
//!    a virtual socket, from the [`ChannelStats`] of the channels to the socket's peer.
//! 2. **Per slow period** ([`NetScheduler::plan`]): how many channels exist to each peer,
//!    of which class, and which core runs each (scaling and placement), from a whole
//!    [`StackSnapshot`], as a list of [`PlanAction`]s, which the stack carries out every
//!    [`plan_period`](NetScheduler::plan_period) (`vns::StackBuilder::execute_plans`):
//!    channels opened, retired without losing a byte, queue runtimes pinned, spawned,
//!    retired and given queues.
//! 3. **Per large copy** ([`NetScheduler::pick_copy_worker`]): which copy worker copies
//!    each piece of a large copy, from the [`CopyWorkerStats`] of the workers (their
//!    queued bytes); `None` leaves the piece to the application thread.
//!
//! Policies shipped here:
//!
//! - [`RoundRobin`], the paper's: round-robin per chunk over the channels of the
//!   socket's class, skipping a channel holding more than 2 MB queued, and round-robin
//!   over copy workers, skipping one holding more than 640 KB.
//! - [`SourcePort`], the paper's code default: each socket pinned to one channel of its
//!   class by a hash of its flow number.
//! - [`Isolating`]: latency-class sockets on latency channels that run on cores of their
//!   own, throughput sockets never on them; its plan pins the two classes to disjoint
//!   cores.
//! - [`Scaler`] (with [`ScalingConfig`]): run-time scaling decisions any policy can use
//!   from its `plan`; [`Scaled`] adds it to any policy.
//!
//! A latency-class socket uses only latency channels and a throughput-class socket only
//! throughput channels in every policy here, so the two never share a queue.
//!
//! ```
//! use netsched::{AppClass, ChannelClass, ChannelId, ChannelStats, ChunkInfo, NetScheduler, RoundRobin};
//!
//! let mut rr = RoundRobin::default();
//! let chan = |id, class, queued_bytes| ChannelStats {
//!     id: ChannelId(id),
//!     class,
//!     queued_bytes,
//!     ..ChannelStats::default()
//! };
//! let stats = [
//!     chan(0, ChannelClass::Throughput, 0),
//!     chan(1, ChannelClass::Latency, 0),
//!     chan(2, ChannelClass::Throughput, 3 << 20),
//!     chan(3, ChannelClass::Throughput, 0),
//! ];
//! let chunk = ChunkInfo { flow: 7, class: AppClass::Throughput, len: 4096 };
//! // Channel 1 is latency-only, channel 2 is over the 2 MB threshold.
//! assert_eq!(rr.pick_channel(&chunk, &stats), Some(ChannelId(0)));
//! assert_eq!(rr.pick_channel(&chunk, &stats), Some(ChannelId(3)));
//! assert_eq!(rr.pick_channel(&chunk, &stats), Some(ChannelId(0)));
//! let urgent = ChunkInfo { flow: 8, class: AppClass::Latency, len: 64 };
//! assert_eq!(rr.pick_channel(&urgent, &stats), Some(ChannelId(1)));
//! ```
#![forbid(unsafe_code)]

mod isolating;
mod placement;
mod plan;
mod round_robin;
mod scaling;
mod source_port;
mod stats;

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use isolating::Isolating;
pub use placement::{
    default_queue_placement, isolating_queue_placement, QueueHost, QueueInfo, QueuePlace,
    DISAGGREGATE_MIN_CORES,
};
pub use plan::PlanAction;
pub use round_robin::RoundRobin;
pub use scaling::{Scaled, Scaler, ScalingConfig, ScalingConfigError};
pub use source_port::SourcePort;
pub use stats::{
    ChannelStats, ChannelThreadId, CopyWorkerId, CopyWorkerStats, FlowStats, PeerId, PeerSteering,
    QueueStats, StackSnapshot, Steering, ThreadStats,
};

/// Identifies one channel (one L4 connection to a peer host) within a host.
///
/// The number is chosen by whoever creates channels (the channel layer); the scheduler and
/// the virtual-socket layer only compare it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct ChannelId(pub u32);

impl fmt::Display for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ch{}", self.0)
    }
}

/// What a channel is reserved for (the paper's isolation of latency-sensitive traffic).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub enum ChannelClass {
    /// Carries only latency-class sockets; kept on NIC queues, runtimes and cores of its
    /// own where the policy separates the classes.
    Latency,
    /// Carries throughput-class (bulk) sockets.
    #[default]
    Throughput,
}

/// What an application declared its socket to be (the paper's `SO_APP_TYPE`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub enum AppClass {
    /// Latency-sensitive: uses only [`ChannelClass::Latency`] channels.
    Latency,
    /// Throughput-oriented (the default): uses only [`ChannelClass::Throughput`] channels.
    #[default]
    Throughput,
}

impl AppClass {
    /// The channel class this application class is allowed to use.
    pub fn channel_class(self) -> ChannelClass {
        match self {
            AppClass::Latency => ChannelClass::Latency,
            AppClass::Throughput => ChannelClass::Throughput,
        }
    }
}

/// The chunk a scheduling decision is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    /// A stable number for the flow (the virtual socket), for policies that pin flows.
    pub flow: u64,
    /// The socket's application class.
    pub class: AppClass,
    /// Payload bytes in the chunk (0 for a control chunk).
    pub len: usize,
}

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyDirection {
    /// From an application buffer into chunks leaving on channels (a write).
    ToChannels,
    /// From received chunks into an application buffer (a read).
    FromChannels,
}

/// A large copy a copy-worker decision is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyRequest {
    /// The flow (virtual socket) the copy is for.
    pub flow: u64,
    /// Bytes to copy.
    pub len: usize,
    /// Which way.
    pub direction: CopyDirection,
}

/// The paper's default queued-bytes threshold: a channel holding more is skipped.
pub const DEFAULT_QUEUED_THRESHOLD: u64 = 2 * 1024 * 1024;

/// The paper's default copy-worker threshold: a worker holding more queued copy bytes is
/// skipped.
pub const DEFAULT_COPY_WORKER_THRESHOLD: u64 = 640 * 1024;

/// How often a stack is meant to call [`NetScheduler::plan`] unless the policy says
/// otherwise ([`NetScheduler::plan_period`]).
pub const DEFAULT_PLAN_PERIOD: Duration = Duration::from_millis(100);

/// A scheduling policy: where chunks go, how many channels exist and where they run,
/// which worker copies.
///
/// The trait is object safe; a stack holds its policy as `Box<dyn NetScheduler>`, chosen
/// with `StackBuilder::scheduler`. It must be `Send` (the stack calls each instance from
/// whichever thread holds the lock that instance sits behind, one call at a time, so it
/// need not be `Sync`).
///
/// Implementations should be deterministic functions of their own state and their
/// arguments: the virtual-socket core is a deterministic state machine and its tests replay
/// exact schedules. Only [`pick_channel`](Self::pick_channel) is required; the other
/// decisions have defaults (no plan; the least-loaded copy worker under 640 KB).
///
/// # Writing a policy
///
/// A complete user-written policy: each chunk goes to the least-loaded channel of its
/// class, copies go to the emptiest worker, and the plan asks for a latency channel to
/// every peer that has throughput channels only.
///
/// ```
/// use netsched::{
///     AppClass, ChannelClass, ChannelId, ChannelStats, ChunkInfo, CopyRequest, CopyWorkerId,
///     CopyWorkerStats, NetScheduler, PeerId, PlanAction, StackSnapshot,
/// };
///
/// /// Sends each chunk where the fewest bytes wait (queued plus in flight).
/// #[derive(Debug, Default)]
/// struct LeastLoaded {
///     chunks_placed: u64,
/// }
///
/// impl NetScheduler for LeastLoaded {
///     fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
///         let class = chunk.class.channel_class();
///         let pick = channels
///             .iter()
///             .filter(|c| c.class == class) // never mix classes
///             .min_by_key(|c| (c.queued_bytes + c.in_flight_bytes, c.id))?;
///         self.chunks_placed += 1;
///         Some(pick.id)
///     }
///
///     fn pick_copy_worker(&mut self, _: &CopyRequest, workers: &[CopyWorkerStats]) -> Option<CopyWorkerId> {
///         workers.iter().min_by_key(|w| (w.queued_bytes, w.id)).map(|w| w.id)
///     }
///
///     fn plan(&mut self, snapshot: &StackSnapshot) -> Vec<PlanAction> {
///         snapshot
///             .peers()
///             .into_iter()
///             .filter(|&p| snapshot.channels_to(p).all(|c| c.class == ChannelClass::Throughput))
///             .map(|peer| PlanAction::OpenChannel { peer, class: ChannelClass::Latency })
///             .collect()
///     }
/// }
///
/// let mut policy: Box<dyn NetScheduler> = Box::new(LeastLoaded::default());
/// let chan = |id, class, queued_bytes| ChannelStats {
///     id: ChannelId(id),
///     class,
///     queued_bytes,
///     ..ChannelStats::default()
/// };
/// let channels = [
///     chan(0, ChannelClass::Throughput, 9000),
///     chan(1, ChannelClass::Throughput, 100),
///     chan(2, ChannelClass::Latency, 0),
/// ];
/// let bulk = ChunkInfo { flow: 1, class: AppClass::Throughput, len: 4096 };
/// assert_eq!(policy.pick_channel(&bulk, &channels), Some(ChannelId(1)));
///
/// let snapshot = StackSnapshot {
///     channels: vec![ChannelStats { peer: PeerId(3), ..channels[0] }],
///     ..StackSnapshot::default()
/// };
/// assert_eq!(
///     policy.plan(&snapshot),
///     [PlanAction::OpenChannel { peer: PeerId(3), class: ChannelClass::Latency }]
/// );
/// ```
pub trait NetScheduler: Send {
    /// Picks the channel that carries `chunk`, among `channels` (every channel to the
    /// socket's peer host, of every class). Returns `None` when no channel should take the
    /// chunk now (all eligible channels are over their thresholds); the caller keeps the
    /// data and asks again later. Returning an id that is not in `channels` is a bug the
    /// caller treats like `None`.
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId>;

    /// Picks the copy worker that copies `request`, among `workers`. `None`: no worker
    /// should take it, and the application thread copies it itself.
    ///
    /// The default takes the worker with the fewest queued bytes (the lowest id on a
    /// tie), skipping workers over [`DEFAULT_COPY_WORKER_THRESHOLD`].
    fn pick_copy_worker(
        &mut self,
        request: &CopyRequest,
        workers: &[CopyWorkerStats],
    ) -> Option<CopyWorkerId> {
        let _ = request;
        workers
            .iter()
            .filter(|w| w.queued_bytes <= DEFAULT_COPY_WORKER_THRESHOLD)
            .min_by_key(|w| (w.queued_bytes, w.id))
            .map(|w| w.id)
    }

    /// The slow-period decisions: channels to open or close and where channels run, from
    /// a snapshot of the whole stack. Called every [`plan_period`](Self::plan_period).
    /// Actions describe a wanted change; a policy may return the same action again while
    /// the change has not happened, so executing one twice must be harmless. The default
    /// wants no change.
    ///
    /// `vns::Stack` carries plans out every period (`StackBuilder::execute_plans`, on by
    /// default): it opens the channels asked for and retires those to close without
    /// losing a byte (queued chunks leave first; nothing new goes on them). `Pin` is not
    /// carried out yet. See `vns::Diagnostics::plan_counters`.
    fn plan(&mut self, snapshot: &StackSnapshot) -> Vec<PlanAction> {
        let _ = snapshot;
        Vec::new()
    }

    /// How often [`plan`](Self::plan) is meant to run (default [`DEFAULT_PLAN_PERIOD`]).
    fn plan_period(&self) -> Duration {
        DEFAULT_PLAN_PERIOD
    }

    /// Another instance of this policy, for another shard of the stack. A stack splits
    /// its virtual sockets over shards that run independently (no lock shared between
    /// their per-chunk calls), and each shard asks its own instance for
    /// [`pick_channel`](Self::pick_channel); [`plan`](Self::plan) is asked of the first
    /// instance only, and [`pick_copy_worker`](Self::pick_copy_worker) of one more instance
    /// that the copy workers hold (so that a copy never waits on a shard).
    /// The default, `None`, keeps the whole stack on one shard (one instance sees every
    /// chunk). Policies whose per-chunk state is per flow or a cursor return a copy of
    /// themselves; the shipped ones do.
    fn fork(&self) -> Option<Box<dyn NetScheduler>> {
        None
    }

    /// Whether the stack should open latency channels on NIC queues (and so queue
    /// runtimes) of their own, apart from throughput channels, when it has more than one
    /// queue: the
    /// placement half of isolation, decided when a channel opens (a channel cannot move
    /// to another queue later). The default, `false`, spreads every channel over all
    /// queues.
    fn separate_class_threads(&self) -> bool {
        false
    }

    /// Where the stack drives each of its NIC queues (see [`QueuePlace`]): asked when the
    /// stack starts and when a latency application's runtime is handed to it. The
    /// default is [`default_queue_placement`]: the application's runtime on a small host,
    /// queue runtimes of the stack's own where cores are to spare.
    fn place_queues(&self, host: &QueueHost) -> Vec<QueuePlace> {
        default_queue_placement(host)
    }
}

impl<S: NetScheduler + ?Sized> NetScheduler for Box<S> {
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
        (**self).pick_channel(chunk, channels)
    }

    fn pick_copy_worker(
        &mut self,
        request: &CopyRequest,
        workers: &[CopyWorkerStats],
    ) -> Option<CopyWorkerId> {
        (**self).pick_copy_worker(request, workers)
    }

    fn plan(&mut self, snapshot: &StackSnapshot) -> Vec<PlanAction> {
        (**self).plan(snapshot)
    }

    fn plan_period(&self) -> Duration {
        (**self).plan_period()
    }

    fn fork(&self) -> Option<Box<dyn NetScheduler>> {
        (**self).fork()
    }

    fn separate_class_threads(&self) -> bool {
        (**self).separate_class_threads()
    }

    fn place_queues(&self, host: &QueueHost) -> Vec<QueuePlace> {
        (**self).place_queues(host)
    }
}

/// The first id after `last` among `ids`, wrapping to the smallest: one round-robin step.
///
/// The cursor is an id, not an index, so entries coming and going do not skew the
/// rotation.
fn next_after<K: Ord + Copy>(last: Option<K>, ids: impl Iterator<Item = K> + Clone) -> Option<K> {
    ids.clone()
        .filter(|&k| last.is_some_and(|l| k > l))
        .min()
        .or_else(|| ids.min())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct OnlyPick;

    impl NetScheduler for OnlyPick {
        fn pick_channel(&mut self, _: &ChunkInfo, c: &[ChannelStats]) -> Option<ChannelId> {
            c.first().map(|c| c.id)
        }
    }

    fn worker(id: u32, queued_bytes: u64) -> CopyWorkerStats {
        CopyWorkerStats {
            id: CopyWorkerId(id),
            queued_bytes,
            ..CopyWorkerStats::default()
        }
    }

    const COPY: CopyRequest = CopyRequest {
        flow: 1,
        len: 1 << 20,
        direction: CopyDirection::ToChannels,
    };

    #[test]
    fn defaults_plan_nothing_and_take_the_emptiest_worker_under_640_kb() {
        let mut s: Box<dyn NetScheduler> = Box::new(OnlyPick);
        assert!(s.plan(&StackSnapshot::default()).is_empty());
        assert_eq!(s.plan_period(), DEFAULT_PLAN_PERIOD);
        let workers = [worker(0, 5000), worker(1, 100), worker(2, 100)];
        assert_eq!(s.pick_copy_worker(&COPY, &workers), Some(CopyWorkerId(1)));
        let over = [worker(0, 640 * 1024 + 1), worker(1, 640 * 1024)];
        assert_eq!(s.pick_copy_worker(&COPY, &over), Some(CopyWorkerId(1)));
        assert_eq!(s.pick_copy_worker(&COPY, &over[..1]), None);
        assert_eq!(s.pick_copy_worker(&COPY, &[]), None);
    }

    #[test]
    fn next_after_wraps_and_survives_missing_cursor() {
        assert_eq!(next_after(None, [3, 1, 2].into_iter()), Some(1));
        assert_eq!(next_after(Some(1), [3, 1, 2].into_iter()), Some(2));
        assert_eq!(next_after(Some(3), [3, 1, 2].into_iter()), Some(1));
        // The cursor's own id is gone: continue after it.
        assert_eq!(next_after(Some(2), [3, 1].into_iter()), Some(3));
        assert_eq!(next_after(Some(2), std::iter::empty::<u32>()), None);
    }

    #[test]
    fn snapshot_round_trips_through_json() {
        let snapshot = StackSnapshot {
            channels: vec![ChannelStats {
                id: ChannelId(4),
                class: ChannelClass::Latency,
                peer: PeerId(2),
                srtt: Some(Duration::from_micros(30)),
                thread: Some(ChannelThreadId(1)),
                queue: Some(6),
                ..ChannelStats::default()
            }],
            threads: vec![ThreadStats {
                id: ChannelThreadId(1),
                core: Some(3),
                busy: Duration::from_millis(5),
                window: Duration::from_millis(10),
                rx_dropped: 2,
            }],
            queues: vec![
                QueueStats {
                    queue: 6,
                    thread: ChannelThreadId(1),
                },
                QueueStats {
                    queue: 7,
                    thread: ChannelThreadId(1),
                },
            ],
            cores: vec![0, 1, 2, 3],
            ..StackSnapshot::default()
        };
        let json = serde_json::to_string(&snapshot).unwrap();
        let back: StackSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, snapshot);
        assert_eq!(back.core_of(ChannelId(4)), Some(3));
        assert_eq!(back.core_of(ChannelId(5)), None);
        assert_eq!(back.threads[0].utilisation(), 0.5);
        assert_eq!(back.thread_of_queue(7), Some(ChannelThreadId(1)));
        assert_eq!(back.thread_of_queue(8), None);
        assert_eq!(
            back.queues_of(ChannelThreadId(1)).collect::<Vec<_>>(),
            [6, 7]
        );
        // A snapshot from before the placement fields reads as "unknown".
        let old = r#"{"channels":[],"threads":[],"flows":[],"copy_workers":[],"cores":[]}"#;
        assert!(serde_json::from_str::<StackSnapshot>(old)
            .unwrap()
            .queues
            .is_empty());
    }

    #[test]
    fn thread_actions_round_trip_through_json() {
        let plan = vec![
            PlanAction::SpawnThread { core: 3 },
            PlanAction::AssignQueue {
                queue: 1,
                thread: ChannelThreadId(4),
            },
            PlanAction::RetireThread {
                thread: ChannelThreadId(0),
            },
        ];
        let json = serde_json::to_string(&plan).unwrap();
        assert_eq!(
            serde_json::from_str::<Vec<PlanAction>>(&json).unwrap(),
            plan
        );
    }
}
