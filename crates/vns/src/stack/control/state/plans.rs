//! The scheduler's plans as the control lock holds them: when the policy is asked next,
//! the openings and retirements under way, the queue runtimes' last measurements and
//! pins, and what was done ([`PlanCounters`]). The control task's `plans.rs` carries the
//! plans out.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use netsched::{ChannelId, ThreadStats};

/// What the control task did with its scheduler's plans ([`Diagnostics::plan_counters`](crate::Diagnostics::plan_counters)).
///
/// [`Diagnostics::plan_counters`](crate::Diagnostics::plan_counters): crate::stack::Stack::plan_counters
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlanCounters {
    /// Times the policy was asked for a plan.
    pub plans: u64,
    /// Channels opened because a plan asked for them.
    pub opened: u64,
    /// Openings a plan asked for that failed (the peer refused, or the handshake failed).
    pub open_failed: u64,
    /// Channels a plan asked to close that started retiring.
    pub retired: u64,
    /// Queue runtimes a plan pinned to another core (`Pin`).
    pub pinned: u64,
    /// Queue runtimes a plan started (`SpawnThread`).
    pub threads_spawned: u64,
    /// Queue runtimes a plan ended (`RetireThread`).
    pub threads_retired: u64,
    /// NIC queues a plan moved to another queue runtime (`AssignQueue`).
    pub queues_moved: u64,
    /// Retiring channels whose transport was closed once drained.
    pub closed: u64,
    /// Actions not carried out: a close of a peer's last channel or of an unknown
    /// channel; a `Pin` of a queue runtime that also drives channels of the other class,
    /// of a queue on a runtime that is not the stack's own, or to a core the process may
    /// not use; a thread action the channel set refuses (the home runtime's retirement,
    /// an unknown queue or runtime, a dead queue, a runtime that cannot start).
    pub refused: u64,
}

/// The control task's plan state, behind the control lock.
#[derive(Debug, Default)]
pub(crate) struct PlanState {
    /// When the policy is asked next (`None`: at the next round).
    pub(in crate::stack::control) next: Option<Instant>,
    /// Peers a plan's opening is running for.
    pub(in crate::stack::control) opening: HashSet<Ipv4Addr>,
    /// Channels retiring: whether their transport was closed yet.
    pub(in crate::stack::control) retiring: BTreeMap<ChannelId, bool>,
    pub(crate) counters: PlanCounters,
    /// Each queue runtime's cumulative busy time and its queues' kernel rx drops at the
    /// last plan, and when, by runtime id.
    pub(in crate::stack::control) last_busy: HashMap<u32, (Duration, u64, Instant)>,
    /// The queue runtimes' utilisation over the last plan period.
    pub(crate) threads: Vec<ThreadStats>,
    /// The core each queue's runtime was last pinned to by a plan.
    pub(in crate::stack::control) pins: HashMap<u32, usize>,
}

impl PlanState {
    /// A channel left the stack (its end, or a loss): nothing to retire any more.
    pub(in crate::stack::control) fn forget(&mut self, id: ChannelId) {
        self.retiring.remove(&id);
    }
}
