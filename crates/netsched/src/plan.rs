//! Slow-period decisions: how many channels exist to each peer and where they run.

use serde::{Deserialize, Serialize};

use crate::{ChannelClass, ChannelId, PeerId};

/// One change a scheduler's [`plan`](crate::NetScheduler::plan) wants.
///
/// Actions are wishes, not commands already carried out, and a policy may repeat one
/// until it has happened: executing the same action twice must be harmless (open only if
/// still short, close only if still present, pin only if not already there).
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
}
