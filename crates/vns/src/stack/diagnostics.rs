//! What a [`Stack`] reports about itself for tests, benches and operators, behind one
//! accessor ([`Stack::diagnostics`]): counters, channel and queue state, placement,
//! plans, and a few hooks that break things on purpose (`reset_channel`, `kill_queue`).
//! The application's API (sockets, listeners, stopping) stays on [`Stack`].

use super::{CopyStats, PlanCounters, Stack};

impl Stack {
    /// What the stack reports about itself: counters, channels, NIC queues and their
    /// drivers, the scheduler's view and plans, and fault injection for tests and drills.
    ///
    /// ```no_run
    /// # fn f(stack: vns::Stack) {
    /// let d = stack.diagnostics();
    /// println!("{} channels; {} refused", d.channel_count(), d.dropped_channels());
    /// println!("{}", d.channel_placement());
    /// # }
    /// ```
    pub fn diagnostics(&self) -> Diagnostics<'_> {
        Diagnostics { stack: self }
    }
}

/// A [`Stack`]'s report about itself (see [`Stack::diagnostics`]).
#[derive(Debug, Clone, Copy)]
pub struct Diagnostics<'a> {
    stack: &'a Stack,
}

impl<'a> Diagnostics<'a> {
    fn core(&self) -> &'a std::sync::Arc<super::core::Core> {
        self.stack.core()
    }

    /// Counters of the copy workers and of their chunk buffer pool; all zero without
    /// workers (then the application thread copies everything on the plain path).
    pub fn copy_stats(&self) -> CopyStats {
        self.stack
            .inner
            .copy
            .as_ref()
            .map(|c| c.pool.stats())
            .unwrap_or_default()
    }

    /// OS thread ids of the copy workers (Linux), for inspection: they are gone once
    /// the stack's last handle is dropped.
    pub fn copy_worker_tids(&self) -> Vec<u64> {
        self.stack
            .inner
            .copy
            .as_ref()
            .map(|c| c.pool.worker_tids().into_iter().map(|(_, t)| t).collect())
            .unwrap_or_default()
    }

    /// The latency shard's index (the last shard), where the stack has latency channels:
    /// the shard of latency-class sockets connected as such
    /// ([`VirtualSocket::set_app_class`](super::VirtualSocket::set_app_class)) and of the
    /// peer's (see [`crate::ShardOf`]).
    pub fn latency_shard(&self) -> Option<usize> {
        self.core().latency_shard()
    }

    /// The shards the stack splits its virtual sockets over
    /// ([`StackBuilder::shards`](super::StackBuilder::shards)).
    pub fn shards(&self) -> usize {
        self.core().shard_count()
    }

    /// Channels accepted on the channel port and aborted before they joined: no preamble
    /// within [`StackBuilder::preamble_timeout`](super::StackBuilder::preamble_timeout), too many waiting at once, or a bad
    /// preamble (a peer that opens channels and never speaks, or speaks garbage).
    pub fn dropped_channels(&self) -> u64 {
        self.core().ctl().dropped_channels
    }

    /// Channels accepted on the channel port that failed authentication: no proof of the
    /// key when this stack has one ([`StackBuilder::channel_key`](super::StackBuilder::channel_key)), a wrong proof, or a
    /// request to authenticate when it has none. Also counted in
    /// [`Diagnostics::dropped_channels`].
    pub fn auth_failures(&self) -> u64 {
        self.core().ctl().auth_failures
    }

    /// Hellos this stack answered, and those it asked its peers for before opening
    /// channels to them and what they came to (`docs/wire-format.md`, "Acceptor's
    /// hello"): described (each channel then aims at a queue of its class at the peer
    /// too), undescribed, refused as malformed, unanswered.
    pub fn hello_counts(&self) -> super::HelloCounts {
        self.core().ctl().hellos
    }

    /// Hostile or broken input the stack's endpoint refused or cut short (SYNCs past the
    /// socket bounds, closed sockets whose peer never sent its FIN, ...).
    pub fn endpoint_counters(&self) -> crate::EndpointCounters {
        let mut c = crate::EndpointCounters::default();
        self.core().each_shard(|_, s| c.add(&s.ep.counters()));
        c
    }

    /// Streams dropped (or closed) that are still finishing inside the stack: their
    /// unsent bytes and FIN leaving, or the peer's FIN on its way. Each goes when both
    /// directions are finished, or is reset after [`crate::Config::linger_timeout`]
    /// (counted in [`crate::EndpointCounters::linger_expired`]).
    pub fn lingering_sockets(&self) -> usize {
        let mut n = 0;
        self.core().each_shard(|_, s| n += s.ep.lingering_sockets());
        n
    }

    /// Plain-TCP streams dropped (or closed) whose connections are still finishing:
    /// their bytes and FIN unacknowledged, or the peer's FIN not yet in.
    pub fn closing_plain_streams(&self) -> usize {
        self.core().ctl().closing_plain()
    }

    /// Plain-TCP streams closed gracefully whose connections were reset because they
    /// did not finish within [`crate::Config::linger_timeout`].
    pub fn plain_linger_expired(&self) -> u64 {
        self.core().ctl().plain_linger_expired
    }

    /// Channels the stack holds now (to all peers).
    pub fn channel_count(&self) -> usize {
        self.core().channel_count()
    }

    /// Fault injection, for tests and failure drills: resets the `n`-th channel the stack
    /// holds (in the order they were opened) as a failed connection. Its TCP connection is
    /// aborted (the peer receives a RST) and nothing is lost: the chunks its sockets had
    /// on it go again on the peer's other channels (the data-level acknowledgement,
    /// `docs/wire-format.md`), or on channels opened again when it was the last one.
    /// Returns `false` when the stack holds fewer than `n + 1` channels.
    ///
    /// ```no_run
    /// # async fn f(stack: vns::Stack) {
    /// assert!(stack.diagnostics().reset_channel(0));
    /// // Streams carry on; the counters show what went again.
    /// let c = stack.diagnostics().endpoint_counters();
    /// println!("resent {} chunks", c.resent_chunks);
    /// # }
    /// ```
    pub fn reset_channel(&self, n: usize) -> bool {
        self.core().reset_channel(n)
    }

    /// Diagnostics and fault-injection tests: each channel's connection on the wire
    /// (4-tuple, NIC queue, RCV.NXT and SND.NXT as its queue driver last published them),
    /// in the order [`Diagnostics::reset_channel`] counts the channels. A test that forges a
    /// RST for a channel reads RCV.NXT here, since a RST is accepted only at exactly
    /// RCV.NXT (RFC 5961).
    pub fn channel_wire(&self) -> Vec<netdriver::channel::ChannelWire> {
        self.core()
            .chans
            .load()
            .values()
            .map(|c| c.t.wire())
            .collect()
    }

    /// Channel connections this stack lost to a RST received from the wire (one at
    /// exactly RCV.NXT, RFC 5961), over its whole life. Channels this stack resets itself
    /// ([`Diagnostics::reset_channel`]) are not counted.
    pub fn channel_resets_received(&self) -> u64 {
        self.core().set.resets_received()
    }

    /// Each NIC queue's driver since the stack started: where it runs, its busy time,
    /// rounds, polls and wake-ups, and what the kernel dropped at its AF_XDP socket because
    /// its driver did not keep up (rx ring full, fill ring empty); over AF_PACKET, the
    /// link's counters (`QueueStats::packet`: super-segments sent, coalesced frames
    /// received, full sends, drops). Cumulative, unlike the per-period view in
    /// [`Diagnostics::stats`], whose runtimes' `rx_dropped` counts either kind of drop.
    pub fn queue_stats(&self) -> Vec<netdriver::channel::QueueStats> {
        self.core().set.queue_stats()
    }

    /// The stack's channel set: its NIC queues, their drivers and runtimes. For
    /// diagnostics, and for channels of one's own beside the stack's (a raw channel on the
    /// same queues, a plain-TCP connection made by hand).
    pub fn channel_set(&self) -> &'a netdriver::channel::ChannelSet {
        &self.core().set
    }

    /// Which runtime drives which NIC queue (the application's, a latency application's,
    /// or queue runtimes of the stack's own), their cores and busy time (netdriver's
    /// `ChannelSet::placement`; printable and serialisable). The scheduler's placement
    /// decides it at start ([`NetScheduler::place_queues`](netsched::NetScheduler::place_queues))
    /// and plans change it (`PlanAction::SpawnThread`, `RetireThread`, `AssignQueue`);
    /// [`Diagnostics::stats`] shows the same in the scheduler's terms.
    pub fn channel_placement(&self) -> netdriver::channel::ChannelPlacement {
        self.core().set.placement()
    }

    /// Fault injection, for tests and failure drills: NIC queue `queue` dies as if its
    /// driver had crashed. This stack sees the channels on that queue as lost at once
    /// (their chunks go again on the other channels, as with [`Diagnostics::reset_channel`]),
    /// but nothing goes on the wire, no FIN and no RST: the peer notices only through its
    /// keep-alive or user timeout ([`StackBuilder::keepalive`](super::StackBuilder::keepalive),
    /// [`StackBuilder::user_timeout`](super::StackBuilder::user_timeout)). Nobody drives the queue afterwards; new channels
    /// use the other queues. Returns `false` for an unknown queue or one killed before.
    pub fn kill_queue(&self, queue: u32) -> bool {
        let killed = self.core().set.kill_queue(queue);
        if killed {
            // The channels' failure reaches their sinks; the control task looks now.
            self.core().control.notify();
        }
        killed
    }

    /// A statistics snapshot of the stack, as its scheduler's
    /// [`plan`](netsched::NetScheduler::plan) sees it; serialisable with serde (to JSON,
    /// say) for logs and tools.
    ///
    /// - `channels`: every channel to every peer, with the loads the channels last
    ///   reported (refreshed whenever the stack moves chunks into a channel): queued and
    ///   in-flight bytes, congestion window, smoothed RTT, retransmitted segments and
    ///   payload bytes sent. `queue`: the NIC queue the channel's connection lives on;
    ///   `thread`: the queue runtime that drives that queue (`None` when the queue is
    ///   driven by a runtime handed to the stack, such as the application's);
    ///   `steering`: how its frames reach that queue (accepted where its SYN landed,
    ///   opened from a port the NIC's RSS aligns, steered by a NIC rule, or forwarded from
    ///   whichever queue they land on; see [`StackBuilder::rss_align`](super::StackBuilder::rss_align)).
    /// - `flows`: every virtual socket with its class and unsent bytes;
    ///   `recent_rate_bps` is 0 (not measured yet).
    /// - `copy_workers`: each worker with its core and the bytes of copies placed on it and
    ///   not finished.
    /// - `threads`: each queue runtime of the stack's own with its core, its queues' busy
    ///   time and the frames the kernel dropped for its queues over the last plan period
    ///   ([`StackBuilder::execute_plans`](super::StackBuilder::execute_plans); a zero window before the first period, with
    ///   plans off, and for a runtime started since); `queues`: which runtime drives each
    ///   NIC queue, as of now (the placement); `cores`: the cores the thread that built
    ///   the stack was allowed to run on.
    pub fn stats(&self) -> netsched::StackSnapshot {
        let core = self.core();
        let mut snapshot = {
            let mut first = core.lock_shard(0);
            first.refresh_loads(&core.chans.load());
            first.ep.scheduler_snapshot()
        };
        // The channels' queues as every shard sees them: shard 0's loads (the channel
        // layer's queue and TCP) plus what the other shards hold for them; every
        // shard's sockets.
        for i in 1..core.shard_count() {
            let s = core.lock_shard(i);
            for c in &mut snapshot.channels {
                c.queued_bytes += s.ep.channel_outbox_bytes(c.id) as u64;
            }
            snapshot.flows.extend(s.ep.scheduler_snapshot().flows);
        }
        let threads = core.ctl().plans.threads.clone();
        core.place(&mut snapshot, &threads);
        if let Some(copy) = &self.stack.inner.copy {
            snapshot.copy_workers = copy.pool.worker_stats();
        }
        snapshot
    }

    /// What the stack's scheduler plans over [`Diagnostics::stats`] now: channels it wants
    /// opened or closed and where it wants them to run. The control task carries plans
    /// out itself every plan period ([`StackBuilder::execute_plans`](super::StackBuilder::execute_plans)); this only shows one,
    /// and calling it advances the policy's own state (streaks, cooldowns) as one plan
    /// period would.
    pub fn scheduler_plan(&self) -> Vec<netsched::PlanAction> {
        let snapshot = self.stats();
        self.core().lock_shard(0).ep.scheduler_plan(&snapshot)
    }

    /// What the control task did with the scheduler's plans so far: plans asked for, channels
    /// opened and retired, actions refused ([`StackBuilder::execute_plans`](super::StackBuilder::execute_plans)).
    pub fn plan_counters(&self) -> PlanCounters {
        self.core().ctl().plans.counters
    }
}
