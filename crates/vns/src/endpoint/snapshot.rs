//! What the endpoint shows its scheduler's slow-period `plan`: every channel and socket.

use netsched::{FlowStats, PlanAction, StackSnapshot};

use super::Endpoint;

impl Endpoint {
    /// The endpoint's part of a [`StackSnapshot`]: every channel (as
    /// [`NetScheduler::pick_channel`](netsched::NetScheduler::pick_channel) sees it) and
    /// every socket. Threads, cores and copy workers are the host's to fill in
    /// (`Diagnostics::stats` does). A socket's `recent_rate_bps` is 0: not measured yet.
    pub fn scheduler_snapshot(&self) -> StackSnapshot {
        let channels = self
            .channels
            .keys()
            .filter_map(|&id| self.channel_stats(id))
            .collect();
        let flows = self
            .sockets
            .iter()
            .map(|(sid, s)| FlowStats {
                flow: sid.0,
                peer: netsched::PeerId(s.key.peer.0),
                class: s.class,
                queued_bytes: s.send_buf.len() as u64,
                recent_rate_bps: 0,
            })
            .collect();
        StackSnapshot {
            channels,
            flows,
            ..StackSnapshot::default()
        }
    }

    /// Asks the scheduler for its plan over `snapshot`. The endpoint does not carry it
    /// out: its host does (`vns::Stack` opens and closes channels, with
    /// [`Endpoint::retire_channel`] for a close that loses nothing).
    pub fn scheduler_plan(&mut self, snapshot: &StackSnapshot) -> Vec<PlanAction> {
        self.scheduler.plan(snapshot)
    }

    /// Whether the scheduler wants the classes' channels on threads of their own
    /// ([`NetScheduler::separate_class_threads`](netsched::NetScheduler::separate_class_threads)).
    pub fn scheduler_separates_classes(&self) -> bool {
        self.scheduler.separate_class_threads()
    }

    /// Where the scheduler wants the stack's NIC queues driven
    /// ([`NetScheduler::place_queues`](netsched::NetScheduler::place_queues)).
    pub fn scheduler_place_queues(&self, host: &netsched::QueueHost) -> Vec<netsched::QueuePlace> {
        self.scheduler.place_queues(host)
    }

    /// How often the scheduler wants [`Endpoint::scheduler_plan`] asked
    /// ([`NetScheduler::plan_period`](netsched::NetScheduler::plan_period)).
    pub fn scheduler_plan_period(&self) -> std::time::Duration {
        self.scheduler.plan_period()
    }
}
