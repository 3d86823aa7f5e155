//! What tasks wait for and how a stop goes, as the control lock holds them: the goals,
//! the waiting tasks, a graceful stop in progress, and how the stack stopped. The control
//! task's `drain.rs` acts on them.

use std::task::Waker;
use std::time::Instant;

/// What a task waits for (`Core::poll_wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Goal {
    /// Nothing written is undelivered: `pending_tx_bytes` read 0 twice,
    /// `DRAIN_RECHECK` apart (`control/drain.rs`).
    Drained,
    /// The stack holds no channel.
    NoChannels,
    /// The stack holds exactly this many channels.
    Channels(usize),
    /// The control task has asked the scheduler for at least this many plans.
    Plans(u64),
    /// The control task has stopped.
    Stopped,
}

/// A graceful stop in progress (`Core::begin_stop`).
#[derive(Debug)]
pub(crate) struct Stopping {
    /// When whatever is left is aborted.
    pub(in crate::stack::control) deadline: Instant,
    /// Everything was drained and the channels are closed (a FIN after their bytes):
    /// waiting for each peer to see the end of its channel.
    pub(in crate::stack::control) closed: bool,
}

/// A task waiting for a [`Goal`] (`Core::poll_wait`).
#[derive(Debug)]
pub(in crate::stack::control) struct Waiter {
    pub(in crate::stack::control) id: u64,
    pub(in crate::stack::control) goal: Goal,
    pub(in crate::stack::control) waker: Option<Waker>,
    /// The control task found the goal reached (the wait's next poll ends).
    pub(in crate::stack::control) reached: bool,
}

/// How the control task stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopOutcome {
    /// A graceful stop delivered everything and closed the channels.
    Drained,
    /// A graceful stop ran out of linger time with this many bytes undelivered (0: the
    /// peers had not yet seen the end of the channels); the rest was aborted.
    Expired { pending: usize },
    /// Stopped at once ([`Stack::abort`](crate::stack::Stack::abort)).
    Aborted,
}
