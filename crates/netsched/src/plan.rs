//! Slow-period decisions: how many channels exist to each peer and where they run.

use serde::{Deserialize, Serialize};

use crate::{ChannelClass, ChannelId, ChannelThreadId, PeerId};

/// One change a scheduler's [`plan`](crate::NetScheduler::plan) wants.
///
/// Actions are wishes, not commands already carried out, and a policy may repeat one
/// until it has happened: executing the same action twice must be harmless (open only if
/// still short, close only if still present, pin only if not already there, spawn only if
/// no queue runtime is pinned to the core yet, retire only if the runtime is still there,
/// assign only if the queue is elsewhere).
///
/// The thread actions place the stack's queue runtimes themselves: a queue runtime (a
/// thread of the stack's own, named by a [`ChannelThreadId`]) drives one or more NIC
/// queues (each with every channel whose connection lives on it), and
/// [`StackSnapshot::queues`](crate::StackSnapshot::queues) says which drives which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum PlanAction {
    /// Open one more channel of `class` to `peer`.
    OpenChannel {
        /// The peer host.
        peer: PeerId,
        /// The class of the new channel.
        class: ChannelClass,
    },
    /// Close `channel` (after the chunks already queued on it are sent).
    CloseChannel {
        /// The channel.
        channel: ChannelId,
    },
    /// Pin the queue runtime that drives `channel`'s NIC queue to `core` (the stack
    /// refuses when that runtime also drives channels of the other class, or when the
    /// queue is driven on a runtime that is not the stack's own).
    Pin {
        /// The channel.
        channel: ChannelId,
        /// The core.
        core: usize,
    },
    /// Run one more queue runtime, pinned to `core` (unless one is pinned there
    /// already). It drives no queue until an [`AssignQueue`](PlanAction::AssignQueue)
    /// gives it one; it appears in the next snapshot's `threads`.
    SpawnThread {
        /// The core.
        core: usize,
    },
    /// End queue runtime `thread`; the queues it drives move to the other runtimes
    /// first. The stack's home runtime (which runs its control task and takes the
    /// queues of stalled runtimes) is never retired: retiring it is refused.
    RetireThread {
        /// The queue runtime.
        thread: ChannelThreadId,
    },
    /// Drive NIC queue `queue` (every channel on it) on queue runtime `thread`.
    AssignQueue {
        /// The queue, as [`QueueStats::queue`](crate::QueueStats::queue) names it.
        queue: u32,
        /// The queue runtime.
        thread: ChannelThreadId,
    },
}
