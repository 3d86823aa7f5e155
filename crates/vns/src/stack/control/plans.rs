//! Carrying out the scheduler's plans (`NetScheduler::plan`): every plan period the
//! control task shows the policy a snapshot of the stack and acts on what it wants.
//!
//! - `OpenChannel`: an opener thread opens one more channel of the class to the peer, as a
//!   first connect does (the peer accepts it like any channel). One opening per peer at
//!   a time; a repeated wish while one runs is ignored.
//! - `CloseChannel`: the channel retires without losing anything. Every shard stops
//!   scheduling on it (`Endpoint::retire_channel`); once every shard's queue for it is
//!   empty and the channel holds no refused batch, its transport is closed gracefully
//!   (a FIN after its last byte). The peer sees the end and drops the channel; whatever
//!   either side had not had acknowledged at the data level goes again on the others
//!   (`Endpoint::handle_channel_closed`/`_lost`). A peer's last channel is never retired.
//! - `Pin { channel, core }`: the queue runtime that drives the channel's NIC queue (a
//!   channel cannot move to another queue) is pinned to the core, unless it also drives
//!   channels of the other class, or the queue is driven by the application's runtime.
//!   Policies that keep classes apart (`separate_class_threads`) get latency channels
//!   opened on queues of their own, so that their runtimes can be pinned apart.
//! - `SpawnThread { core }`: one more queue runtime, pinned to the core, unless one is
//!   already pinned there (netdriver's `ChannelSet::add_runtime`). Plans name queue
//!   runtimes by their ids as `ChannelThreadId`s.
//! - `RetireThread { thread }`: the runtime's queues move to the others, then it ends
//!   (`ChannelSet::remove_runtime`); an unknown runtime is taken as already retired, the
//!   home runtime is refused.
//! - `AssignQueue { queue, thread }`: the queue, with every channel on it, is driven by
//!   that runtime from now on (`ChannelSet::move_queue`: a new driver there, the queue's
//!   state never in two, nothing lost or reordered); nothing if it is there already.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netsched::{
    ChannelClass, ChannelId, ChannelThreadId, PlanAction, QueueStats, StackSnapshot, ThreadStats,
};
use tracing::{debug, warn};

use netdriver::channel::{ChannelPlacement, DriverPlace};

use super::super::core::Core;
use super::state::peers::Opening;
use super::state::plans::PlanState;
use super::state::Control;
use super::{earliest, SHARD_RETRY};
use crate::endpoint::PeerId;

/// How often the control task looks at retiring channels between plan periods.
const RETIRE_CHECK: Duration = Duration::from_millis(5);

impl Core {
    /// Moves retiring channels on and, when the plan period is due, asks the policy for
    /// its plan and carries it out (the control lock held). Returns when to come back.
    pub(super) fn run_plans(self: &Arc<Self>, ctl: &mut Control, now: Instant) -> Option<Instant> {
        if !self.config.execute_plans || ctl.refuses_new() {
            return None;
        }
        let mut again = self.close_drained(ctl).then_some(now + RETIRE_CHECK);
        if ctl.plans.next.is_none_or(|t| now >= t) {
            match self.ask_plan(&mut ctl.plans, now) {
                Some((actions, period)) => {
                    ctl.plans.counters.plans += 1;
                    ctl.plans.next = Some(now + period);
                    for a in actions {
                        self.carry_out(ctl, a);
                    }
                    if !ctl.plans.retiring.is_empty() {
                        again = earliest(again, Some(now + RETIRE_CHECK));
                    }
                }
                // A shard was busy: try again soon rather than wait for it.
                None => again = earliest(again, Some(now + SHARD_RETRY)),
            }
        }
        earliest(again, ctl.plans.next)
    }

    /// The stack's snapshot and the policy's plan over it, or `None` when a shard's lock
    /// is held by an application call (the control task never waits for one). Like
    /// `Diagnostics::stats`, without the copy workers (a plan does not place them).
    ///
    /// The queue runtimes are measured only once every shard has answered, so that an
    /// attempt a busy shard turns away neither costs a placement snapshot (callgrind of a
    /// one-connection exchange: most attempts under load were turned away, and their
    /// snapshots were most of the control task's instructions) nor cuts the
    /// utilisation window the next plan sees down to the retry interval.
    fn ask_plan(&self, ps: &mut PlanState, now: Instant) -> Option<(Vec<PlanAction>, Duration)> {
        let mut first = self.try_lock_shard(0)?;
        first.refresh_loads(&self.chans.load());
        let mut snapshot: StackSnapshot = first.ep.scheduler_snapshot();
        for i in 1..self.shard_count() {
            let s = self.try_lock_shard(i)?;
            for c in &mut snapshot.channels {
                c.queued_bytes += s.ep.channel_outbox_bytes(c.id) as u64;
            }
            snapshot.flows.extend(s.ep.scheduler_snapshot().flows);
        }
        self.measure_threads(ps, now);
        self.place(&mut snapshot, &ps.threads);
        let actions = first.ep.scheduler_plan(&snapshot);
        Some((actions, first.ep.scheduler_plan_period()))
    }

    /// The channel set's runtimes and the queues they drive, now.
    fn placement(&self) -> Option<ChannelPlacement> {
        Some(self.set.placement())
    }

    /// Fills in what the endpoints cannot know: which queue and queue runtime run each
    /// channel and how its frames reach that queue, which of the stack's own runtimes
    /// drives each queue, their utilisation
    /// (`threads`, measured at the last plan; a runtime started since is listed with an
    /// empty window), and the cores.
    pub(crate) fn place(&self, snapshot: &mut StackSnapshot, threads: &[ThreadStats]) {
        let placement = self.placement();
        let mut queues = Vec::new();
        let mut listed = Vec::new();
        for (rid, t) in placement
            .iter()
            .flat_map(|p| &p.runtimes)
            .filter_map(|t| runtime_id(&t.place).map(|id| (id, t)))
        {
            let id = ChannelThreadId(rid);
            queues.extend(
                t.queues
                    .iter()
                    .map(|&queue| QueueStats { queue, thread: id }),
            );
            let mut stats = threads
                .iter()
                .find(|m| m.id == id)
                .copied()
                .unwrap_or(ThreadStats {
                    id,
                    ..ThreadStats::default()
                });
            // Pinned since the measurement, perhaps.
            stats.core = t.core;
            listed.push(stats);
        }
        let table = self.chans.load();
        for c in &mut snapshot.channels {
            c.queue = table.get(&c.id).map(|ch| ch.t.queue());
            c.steering = table.get(&c.id).map(|ch| steering_of(ch.t.steering()));
            c.peer_steering = table
                .get(&c.id)
                .and_then(|ch| ch.t.peer_alignment())
                .map(peer_steering_of);
            c.thread = c.queue.and_then(|q| {
                queues
                    .iter()
                    .find(|s: &&QueueStats| s.queue == q)
                    .map(|s| s.thread)
            });
        }
        snapshot.threads = if placement.is_some() {
            listed
        } else {
            threads.to_vec()
        };
        snapshot.queues = queues;
        snapshot.cores.clone_from(&self.config.cores);
    }

    /// The queue runtimes' utilisation since the last plan (their busy time over the
    /// period), kept for the plan and for `Diagnostics::stats`. A runtime's kernel drops are its
    /// queues' (a queue that moved counts with its new runtime from the next period on).
    fn measure_threads(&self, ps: &mut PlanState, now: Instant) {
        {
            let placement = self.set.placement();
            let drops: HashMap<u32, u64> = self
                .set
                .queue_stats()
                .into_iter()
                .map(|q| (q.queue, q.kernel_rx_drops()))
                .collect();
            let mut threads = Vec::new();
            let mut seen = HashMap::new();
            for (rid, t) in placement
                .runtimes
                .iter()
                .filter_map(|t| runtime_id(&t.place).map(|id| (id, t)))
            {
                let dropped: u64 = t.queues.iter().filter_map(|q| drops.get(q)).sum();
                if let Some(&(busy, dropped_before, at)) = ps.last_busy.get(&rid) {
                    let window = now.saturating_duration_since(at);
                    threads.push(ThreadStats {
                        id: ChannelThreadId(rid),
                        core: t.core,
                        // A round is counted when it ends, so one that straddles two
                        // periods counts whole in the later one: at most the window.
                        busy: t.busy.saturating_sub(busy).min(window),
                        window,
                        rx_dropped: dropped.saturating_sub(dropped_before),
                    });
                }
                seen.insert(rid, (t.busy, dropped, now));
            }
            // Retired runtimes are forgotten.
            ps.last_busy = seen;
            ps.threads = threads;
        }
    }

    fn carry_out(self: &Arc<Self>, ctl: &mut Control, action: PlanAction) {
        match action {
            PlanAction::OpenChannel { peer, class } => self.plan_open(ctl, peer, class),
            PlanAction::CloseChannel { channel } => self.plan_close(ctl, channel),
            PlanAction::Pin { channel, core } => self.plan_pin(ctl, channel, core),
            PlanAction::SpawnThread { core } => self.plan_spawn(ctl, core),
            PlanAction::RetireThread { thread } => self.plan_retire(ctl, thread),
            PlanAction::AssignQueue { queue, thread } => self.plan_assign(ctl, queue, thread),
            other => {
                debug!(?other, "plan: action not known to this stack");
                ctl.plans.counters.refused += 1;
            }
        }
    }

    fn plan_open(self: &Arc<Self>, ctl: &mut Control, peer: netsched::PeerId, class: ChannelClass) {
        let Some(&ip) = ctl.peer_ips.get(&PeerId(peer.0)) else {
            ctl.plans.counters.refused += 1;
            return;
        };
        let busy = ctl
            .peers
            .get(&ip)
            .is_some_and(|p| matches!(p.opening, Opening::Running { .. }));
        if busy || !ctl.plans.opening.insert(ip) {
            return;
        }
        debug!(%ip, ?class, "plan: opening a channel");
        let core = self.clone();
        let spawned = std::thread::Builder::new()
            .name("vns-scale".into())
            .spawn(move || core.open_one(ip, class));
        if let Err(e) = spawned {
            warn!(%ip, error = %e, "plan: cannot start opening a channel");
            ctl.plans.opening.remove(&ip);
            ctl.plans.counters.open_failed += 1;
        }
    }

    /// Opens one channel of `class` to `ip` (opener thread) and adds it to the stack.
    fn open_one(self: Arc<Self>, ip: Ipv4Addr, class: ChannelClass) {
        let remote = SocketAddrV4::new(ip, self.config.channel_port);
        let peer_rss = self.ctl().peers.get(&ip).and_then(|p| p.rss.clone());
        let opened = match self.connect_channel(
            remote,
            class,
            &std::sync::atomic::AtomicUsize::new(0),
            peer_rss.as_deref(),
        ) {
            Ok(t) => match self.open_handshake(&t, class) {
                Ok(leftover) => Ok((t, leftover)),
                Err(why) => {
                    t.abort();
                    Err(why)
                }
            },
            Err(e) => Err(e.to_string()),
        };
        {
            let mut ctl = self.ctl();
            ctl.plans.opening.remove(&ip);
            match opened {
                Ok((t, leftover)) if !ctl.refuses_new() => {
                    let peer = ctl.peer_id(ip);
                    self.add_channel(&mut ctl, t, ip, peer, class, leftover);
                    ctl.plans.counters.opened += 1;
                    debug!(%remote, ?class, "plan: channel opened");
                }
                Ok((t, _)) => t.abort(),
                Err(why) => {
                    warn!(%remote, why = %why, "plan: opening a channel failed");
                    ctl.plans.counters.open_failed += 1;
                }
            }
        }
        self.control.notify();
    }

    /// Pins the queue runtime of the channel's NIC queue to `core`, unless that runtime
    /// also drives channels of the other class: pinning it would move them too, against
    /// the policy's wish for one of them (the stack keeps classes on queues of their own
    /// only when the policy asks, `separate_class_threads`).
    fn plan_pin(&self, ctl: &mut Control, id: ChannelId, core: usize) {
        let table = self.chans.load();
        let Some((queue, class)) = table.get(&id).map(|c| (c.t.queue(), c.class)) else {
            ctl.plans.counters.refused += 1;
            return;
        };
        // The runtime's other queues move with it too.
        let placement = self.placement();
        let thread_of = |q: u32| placement.as_ref().and_then(|p| p.place_of(q));
        let thread = thread_of(queue);
        let mixed = table.values().any(|c| {
            c.class != class
                && (c.t.queue() == queue || (thread.is_some() && thread_of(c.t.queue()) == thread))
        });
        if mixed || !self.set.pin_queue_runtime(queue, core) {
            debug!(channel = %id, queue, core, mixed, "plan: pin refused");
            ctl.plans.counters.refused += 1;
            return;
        }
        if ctl.plans.pins.insert(queue, core) != Some(core) {
            debug!(channel = %id, queue, core, "plan: queue runtime pinned");
            ctl.plans.counters.pinned += 1;
        }
    }

    /// Starts a queue runtime pinned to `core`, unless one is pinned there already.
    fn plan_spawn(&self, ctl: &mut Control, core: usize) {
        let placement = self.placement();
        if placement
            .iter()
            .flat_map(|p| &p.runtimes)
            .any(|t| runtime_id(&t.place).is_some() && t.core == Some(core))
        {
            return;
        }
        match self.set.add_runtime(Some(core)) {
            Ok(id) => {
                debug!(runtime = id, core, "plan: queue runtime spawned");
                ctl.plans.counters.threads_spawned += 1;
            }
            Err(e) => {
                debug!(core, error = %e, "plan: spawning a queue runtime refused");
                ctl.plans.counters.refused += 1;
            }
        }
    }

    /// Ends queue runtime `thread` (its queues move to the others first), unless it is
    /// gone already.
    fn plan_retire(&self, ctl: &mut Control, thread: ChannelThreadId) {
        let Some(placement) = self.placement() else {
            ctl.plans.counters.refused += 1;
            return;
        };
        if placement.runtime(&DriverPlace::Runtime(thread.0)).is_none() {
            return;
        }
        match self.set.remove_runtime(thread.0) {
            Ok(()) => {
                debug!(runtime = thread.0, "plan: queue runtime retired");
                ctl.plans.counters.threads_retired += 1;
            }
            Err(e) => {
                debug!(runtime = thread.0, error = %e, "plan: retiring a queue runtime refused");
                ctl.plans.counters.refused += 1;
            }
        }
    }

    /// Moves `queue` to queue runtime `thread`, unless it is driven there already.
    fn plan_assign(&self, ctl: &mut Control, queue: u32, thread: ChannelThreadId) {
        let Some(placement) = self.placement() else {
            ctl.plans.counters.refused += 1;
            return;
        };
        if placement.place_of(queue) == Some(DriverPlace::Runtime(thread.0)) {
            return;
        }
        match self.set.move_queue(queue, DriverPlace::Runtime(thread.0)) {
            Ok(()) => {
                debug!(queue, thread = thread.0, "plan: queue moved");
                ctl.plans.counters.queues_moved += 1;
            }
            Err(e) => {
                debug!(queue, thread = thread.0, error = %e, "plan: moving a queue refused");
                ctl.plans.counters.refused += 1;
            }
        }
    }

    fn plan_close(&self, ctl: &mut Control, id: ChannelId) {
        if ctl.plans.retiring.contains_key(&id) {
            return;
        }
        if !self.chans.load().contains_key(&id) {
            ctl.plans.counters.refused += 1;
            return;
        }
        // Every shard knows the same channels, so the first one's answer is every one's.
        let mut refused = None;
        self.each_shard(|i, s| {
            if refused.is_none() {
                if let Err(e) = s.ep.retire_channel(id) {
                    debug_assert_eq!(i, 0, "shards disagree about channel {id}");
                    refused = Some(e);
                }
            }
        });
        if let Some(e) = refused {
            debug!(channel = %id, error = %e, "plan: close refused");
            ctl.plans.counters.refused += 1;
            return;
        }
        debug!(channel = %id, "plan: channel retiring");
        ctl.plans.retiring.insert(id, false);
        ctl.plans.counters.retired += 1;
    }

    /// Closes the retiring channels every shard has drained and that hold no refused
    /// batch. Returns whether some still wait.
    fn close_drained(&self, ctl: &mut Control) -> bool {
        let table = self.chans.load();
        let mut waiting = false;
        for (id, closed) in ctl.plans.retiring.iter_mut().filter(|(_, c)| !**c) {
            let Some(chan) = table.get(id) else {
                continue;
            };
            let mut drained = chan
                .tx_pending_bytes
                .load(std::sync::atomic::Ordering::Acquire)
                == 0;
            for i in 0..self.shard_count() {
                if !drained {
                    break;
                }
                drained = self
                    .try_lock_shard(i)
                    .is_some_and(|s| s.ep.channel_drained(*id));
            }
            if drained {
                debug!(channel = %id, "plan: retiring channel drained; closing it");
                chan.t.close();
                *closed = true;
                ctl.plans.counters.closed += 1;
            } else {
                waiting = true;
            }
        }
        waiting
    }
}

/// The channel layer's steering record in the scheduler's terms.
fn steering_of(s: netdriver::rss::ChannelSteering) -> netsched::Steering {
    use netdriver::rss::ChannelSteering;
    match s {
        ChannelSteering::Accepted => netsched::Steering::Accepted,
        ChannelSteering::Aligned => netsched::Steering::Aligned,
        ChannelSteering::Ntuple { .. } => netsched::Steering::Rule,
        ChannelSteering::Forwarded { .. } => netsched::Steering::Forwarded,
    }
}

/// The channel layer's record of where an opened channel lands at the peer, in the
/// scheduler's terms.
fn peer_steering_of(p: netdriver::rss::PeerAlignment) -> netsched::PeerSteering {
    use netdriver::rss::PeerAlignment;
    match p {
        PeerAlignment::Unknown => netsched::PeerSteering::Unknown,
        PeerAlignment::Aligned { queue } => netsched::PeerSteering::Aligned { queue },
        PeerAlignment::Missed => netsched::PeerSteering::Missed,
    }
}

/// The id of a queue runtime of the stack's own (`None`: a runtime handed to it).
fn runtime_id(place: &DriverPlace) -> Option<u32> {
    match place {
        DriverPlace::Runtime(id) => Some(*id),
        DriverPlace::External(_) => None,
    }
}
