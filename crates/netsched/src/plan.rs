//! Slow-period decisions: how many channels exist to each peer and where they run.

use serde::{Deserialize, Serialize};

use crate::{ChannelClass, ChannelId, ChannelThreadId, PeerId};

/// One change a scheduler's [`plan`](crate::NetScheduler::plan) wants.
///
/// Actions are wishes, not commands already carried out, and a policy may repeat one
/// until it has happened: executing the same action twice must be harmless (open only if
/// still short, close only if still present, pin only if not already there, spawn only if
/// no thread runs on the core yet, retire only if the thread is still there, assign only
/// if the queue is elsewhere).
///
/// The thread actions place the channel threads themselves: a channel thread serves one
/// or more NIC queues (each with every channel whose connection lives on it), and
/// [`StackSnapshot::queues`](crate::StackSnapshot::queues) says which serves which.
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
    /// Run `channel` on a thread pinned to `core`.
    Pin {
        /// The channel.
        channel: ChannelId,
        /// The core.
        core: usize,
    },
    /// Run one more channel thread, pinned to `core` (unless a thread already runs
    /// there). It serves no queue until an [`AssignQueue`](PlanAction::AssignQueue) gives
    /// it one; it appears in the next snapshot's `threads`.
    SpawnThread {
        /// The core.
        core: usize,
    },
    /// End channel thread `thread`; the queues it serves move to the other threads first.
    /// A stack keeps at least one thread: retiring the last is refused.
    RetireThread {
        /// The thread.
        thread: ChannelThreadId,
    },
    /// Serve NIC queue `queue` (every channel on it) from thread `thread`.
    AssignQueue {
        /// The queue, as [`QueueStats::queue`](crate::QueueStats::queue) names it.
        queue: u32,
        /// The thread.
        thread: ChannelThreadId,
    },
}
