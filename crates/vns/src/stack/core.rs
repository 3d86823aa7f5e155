//! The state a stack shares between its handles, its streams, its channels' sinks and its
//! control task ([`Core`]), and the data path's calls on it.
//!
//! Three kinds of lock, none of them stack-wide on the per-message path: one per shard
//! (its endpoint and its tasks' wakers: application calls on its sockets, the sinks of
//! channels that deliver to it), one per channel's transmit side (`channel.rs`), and the
//! control lock ([`Control`]: channels coming and going, peers, waiters, stopping). The
//! channel table is read without a lock. Order: control → shard → channel transmit; a
//! queue driver's state (held around a sink) → shard → channel transmit.
//!
//! An application call (`poll_read`, `poll_write`, ...) locks its socket's shard, calls
//! its endpoint and ends with [`Core::finish_call`], which moves the call's output into
//! the channels (each enqueue wakes the channel's queue driver, once per burst) and wakes
//! the tasks whose sockets became ready. Received bytes come in through the channels'
//! sinks (`receive.rs`), on the queue drivers. Nothing on a message's path waits for
//! another thread or task.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::task::Waker;
use std::time::Duration;

use arc_swap::ArcSwap;
use netdriver::channel::{Channel, ChannelSet};
use netsched::{ChannelClass, ChannelId};
use tracing::{debug, warn};

use super::auth;
use super::channel::{ChanTable, Gone};
use super::control::state::Control;
use super::runtime_names::{APPLICATION_RUNTIME, LATENCY_RUNTIME};
use super::shard::{FinishNeeded, Shard, MAX_SHARDS};
use super::wake::{ControlSignal, Few, Wakes};
use crate::endpoint::{Endpoint, SocketId};

/// Settings the control task and the application calls need.
#[derive(Debug, Clone)]
pub(crate) struct CoreConfig {
    pub channels: usize,
    pub latency_channels: usize,
    pub channel_port: u16,
    pub backlog: usize,
    pub connect_timeout: Duration,
    /// How long an accepted channel may take to send its preamble (and to complete the
    /// authentication exchange), and how long an opened one waits for the acceptor's
    /// challenge.
    pub preamble_timeout: Duration,
    /// The key channels authenticate with; `None`: unauthenticated channels.
    pub channel_key: Option<auth::ChannelKey>,
    /// The control task carries out the scheduler's plans (`StackBuilder::execute_plans`).
    pub execute_plans: bool,
    /// The cores the stack may place queue runtimes on, for the plans' snapshots.
    pub cores: Vec<usize>,
    /// Latency channels open on queues of their own (the scheduler's
    /// `separate_class_threads`).
    pub separate_classes: bool,
}

/// What the stack shares. See the [module documentation](self).
pub(crate) struct Core {
    ctl: Mutex<Control>,
    shards: Box<[Mutex<Shard>]>,
    pub(crate) chans: ArcSwap<ChanTable>,
    /// Where the next connect's socket goes (round robin over the shards, the latency
    /// shard apart).
    next_shard: AtomicUsize,
    /// How sockets map to shards by their ports (every shard's `Config::shard`, its
    /// index apart).
    shard_map: crate::ShardOf,
    /// New channels, connects, binds and accepts are refused: the stack has stopped or is
    /// stopping (mirrors [`Control::refuses_new`] for calls that hold a shard's lock).
    refusing: AtomicBool,
    /// Wakes the control task.
    pub(crate) control: Arc<ControlSignal>,
    /// The channels' queues, their drivers and runtimes.
    pub(crate) set: ChannelSet,
    pub(crate) config: CoreConfig,
    /// Largest chunk payload of the endpoints (the channels' deframers).
    pub(crate) max_chunk_payload: usize,
    /// The core itself, for the channels' sinks (which hold it weakly: the channels are
    /// the core's, through the set).
    me: OnceLock<Weak<Core>>,
    /// Set once the control task has ended (it stopped the stack).
    control_done: Arc<ControlDone>,
}

/// Whether the stack's control task has ended, for [`Core::stop_and_wait`]. Shared with
/// the task, which signals it after dropping its handle on the core: a stop that waited
/// for it then holds the core's last handle, and the channel set stops (queue runtimes
/// joined, XDP program detached) when that handle is dropped, not later on the task's
/// thread.
#[derive(Debug, Default)]
pub(crate) struct ControlDone {
    done: Mutex<bool>,
    cv: Condvar,
}

impl ControlDone {
    /// Records that the control task ended and wakes whoever waits for it.
    pub(crate) fn signal(&self) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_all();
    }
}

/// What a pass over some shards leaves to do once their locks are released.
#[derive(Default)]
pub(crate) struct Finish {
    pub(crate) wake: Wakes,
    /// Channels whose paused reads may resume.
    pub(crate) resume: Few<ChannelId>,
    /// Work for the control task: a channel died, a timer changed.
    pub(crate) control: bool,
}

impl Finish {
    /// Wakes the tasks, resumes the channels and tells the control task (no lock held).
    pub(crate) fn run(&mut self, core: &Core) {
        if self.control {
            self.control = false;
            core.control.notify();
        }
        self.resume.drain_each(|id| {
            if let Some(c) = core.chans.load().get(&id) {
                c.t.resume_rx();
            }
        });
        self.wake.drain_each(Waker::wake);
    }
}

impl Core {
    /// A core over `endpoints`, one per shard (each numbered as its index in its config's
    /// [`ShardOf`](crate::ShardOf)), and the channel set; `control` is the control lock's
    /// state.
    pub(crate) fn new(
        endpoints: Vec<Endpoint>,
        set: ChannelSet,
        config: CoreConfig,
        control: Control,
    ) -> Core {
        assert!(
            !endpoints.is_empty() && endpoints.len() <= MAX_SHARDS,
            "1..=MAX_SHARDS shards"
        );
        let max_chunk_payload = endpoints[0].config().max_chunk_payload;
        let shard_map = endpoints[0].config().shard;
        Core {
            ctl: Mutex::new(control),
            shards: endpoints
                .into_iter()
                .enumerate()
                .map(|(i, ep)| Mutex::new(Shard::new(i, ep)))
                .collect(),
            chans: ArcSwap::from_pointee(ChanTable::new()),
            next_shard: AtomicUsize::new(0),
            shard_map,
            refusing: AtomicBool::new(false),
            control: Arc::new(ControlSignal::default()),
            set,
            config,
            max_chunk_payload,
            me: OnceLock::new(),
            control_done: Arc::new(ControlDone::default()),
        }
    }

    /// Lets the channels' sinks reach the core (call once, right after the core is put in
    /// its `Arc`).
    pub(crate) fn set_self(self: &Arc<Self>) {
        let _ = self.me.set(Arc::downgrade(self));
    }

    /// The core, weakly (for a channel's sink).
    pub(crate) fn weak(&self) -> Weak<Core> {
        self.me.get().cloned().unwrap_or_default()
    }

    /// The stack's address.
    pub(crate) fn ipv4(&self) -> Ipv4Addr {
        self.set.config().ipv4
    }

    /// The control lock.
    pub(crate) fn ctl(&self) -> MutexGuard<'_, Control> {
        self.ctl.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shard `i`'s lock.
    pub(crate) fn lock_shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shard `i`'s lock if it is free now.
    pub(crate) fn try_lock_shard(&self, i: usize) -> Option<MutexGuard<'_, Shard>> {
        match self.shards[i].try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The shard that owns socket `sid` (ids step by the shard count from the shard's
    /// index).
    pub(crate) fn shard_of(&self, sid: SocketId) -> usize {
        (sid.number() % self.shards.len() as u64) as usize
    }

    /// Socket `sid`'s shard's lock.
    pub(crate) fn lock_socket(&self, sid: SocketId) -> MutexGuard<'_, Shard> {
        self.lock_shard(self.shard_of(sid))
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard a new connect's socket to `remote` (a virtual port) goes to: the
    /// latency shard for a latency-class socket (or a port of that shard's), else the
    /// others in turn.
    pub(crate) fn next_connect_shard(&self, remote: u16, class: netsched::AppClass) -> usize {
        let map = &self.shard_map;
        match map.latency_shard() {
            Some(l) if class == netsched::AppClass::Latency || map.is_latency_port(remote) => {
                usize::from(l)
            }
            Some(l) => self.next_shard.fetch_add(1, Ordering::Relaxed) % usize::from(l),
            None => self.next_shard.fetch_add(1, Ordering::Relaxed) % self.shards.len(),
        }
    }

    /// The shard that owns the socket with these virtual ports (`local` here, `remote`
    /// on the peer): for a received chunk, its destination and source ports.
    pub(crate) fn shard_for_ports(&self, local: u16, remote: u16) -> usize {
        usize::from(self.shard_map.shard_for(local, remote))
    }

    /// The latency shard's index, if the stack has one.
    pub(crate) fn latency_shard(&self) -> Option<usize> {
        self.shard_map.latency_shard().map(usize::from)
    }

    /// Hands the sent chunk buffers the channels are done with to `reuse`, from every
    /// shard but `own` whose lock is free now (a large write reclaims its own shard's
    /// under its lock; a write on a socket of another shard must not leave these idle).
    pub(crate) fn reclaim_sent_elsewhere(
        &self,
        own: usize,
        mut reuse: impl FnMut(bytes::BytesMut),
    ) {
        for (i, shard) in self.shards.iter().enumerate() {
            if i == own {
                continue;
            }
            if let Ok(mut s) = shard.try_lock() {
                s.ep.reclaim_sent(&mut reuse);
            }
        }
    }

    /// Whether new channels, connects, binds and accepts are refused.
    pub(crate) fn refuses_new(&self) -> bool {
        self.refusing.load(Ordering::Acquire)
    }

    /// Refuses new channels, connects, binds and accepts from now on.
    pub(crate) fn refuse_new(&self) {
        self.refusing.store(true, Ordering::Release);
    }

    /// Runs `f` on every shard in turn (each locked while `f` runs), in index order.
    pub(crate) fn each_shard(&self, mut f: impl FnMut(usize, &mut Shard)) {
        for i in 0..self.shards.len() {
            f(i, &mut self.lock_shard(i));
        }
    }

    /// Marks channel `id` dead (the first reason found wins); whether this call did.
    pub(crate) fn mark_dead(&self, id: ChannelId, why: Gone) -> bool {
        self.chans.load().get(&id).is_some_and(|c| c.mark_dead(why))
    }

    /// Ends a call on shard `shard` (its lock given): moves what the call queued (data, a
    /// credit update) into the channels, wakes the tasks whose sockets became ready, and
    /// tells the control task of a channel found dead or a timer changed.
    pub(crate) fn finish_call(&self, shard: MutexGuard<'_, Shard>) {
        if shard.stopped {
            return;
        }
        // A call that found nothing to read usually leaves nothing to finish: skip the
        // pass.
        match shard.finish_needed() {
            FinishNeeded::Nothing => return,
            // Events only (a read's own `Readable`, say): handed out without the
            // transmit pass.
            FinishNeeded::Events => {
                let mut fin = Finish::default();
                let mut shard = shard;
                shard.drain_events(&mut fin.wake, &mut fin.resume);
                drop(shard);
                fin.run(self);
                return;
            }
            FinishNeeded::Full => {}
        }
        let mut fin = Finish::default();
        let table = self.chans.load();
        self.finish_shard(shard, &mut fin, &table);
        drop(table);
        fin.run(self);
    }

    /// [`Core::finish_call`]'s work for one shard (its lock given, released here),
    /// leaving the wake-ups in `fin` to run once no lock is held. `table`: the channels,
    /// as the caller loaded them.
    pub(crate) fn finish_shard(
        &self,
        mut shard: MutexGuard<'_, Shard>,
        fin: &mut Finish,
        table: &ChanTable,
    ) {
        if shard.stopped {
            return;
        }
        fin.control |= shard.transmit_all(table);
        shard.drain_events(&mut fin.wake, &mut fin.resume);
        // A timer armed (a linger, a SYNC retry, a held short chunk): the control task
        // runs the endpoints' timers.
        fin.control |= shard.ep.timers_changed();
    }

    /// Channel `id`'s queue has room again (its queue driver's round): what its shards
    /// kept for it goes now, on that round.
    pub(crate) fn on_tx_room(&self, id: ChannelId) {
        let table = self.chans.load();
        let Some(chan) = table.get(&id) else {
            return;
        };
        let waiting = chan.take_waiting();
        if waiting == 0 {
            return;
        }
        let mut fin = Finish::default();
        for i in super::shard::ShardSet::from_bits(waiting).iter() {
            if i >= self.shards.len() {
                continue;
            }
            let mut shard = self.lock_shard(i);
            if shard.stopped {
                continue;
            }
            fin.control |= shard.transmit_to(chan);
            // What the endpoint had for other channels, and its events.
            self.finish_shard(shard, &mut fin, &table);
        }
        drop(table);
        fin.run(self);
    }

    /// Channels held now.
    pub(crate) fn channel_count(&self) -> usize {
        self.chans.load().len()
    }

    /// What the control task signals once it has ended ([`ControlDone::signal`]).
    pub(crate) fn control_done(&self) -> Arc<ControlDone> {
        self.control_done.clone()
    }

    /// Asks the control task to stop the stack now and waits (at most `timeout`) until it
    /// has. Returns whether it ended in time.
    pub(crate) fn stop_and_wait(&self, timeout: Duration) -> bool {
        self.control.stop();
        let ControlDone { done, cv } = &*self.control_done;
        let done = done.lock().unwrap_or_else(|p| p.into_inner());
        let (done, _) = cv
            .wait_timeout_while(done, timeout, |d| !*d)
            .unwrap_or_else(|p| p.into_inner());
        if !*done {
            warn!(
                ?timeout,
                "the stack's control task did not stop in time; stopping its channels anyway"
            );
        }
        *done
    }

    /// The classes of the queues the stack's channels are on, for placement: where the
    /// classes are kept apart, latency channels open on the last queue.
    pub(crate) fn queue_class(&self, queue: u32) -> Option<ChannelClass> {
        let queues = self.set.queues();
        if !self.config.separate_classes || queues.len() < 2 {
            return None;
        }
        Some(if queues.last() == Some(&queue) {
            ChannelClass::Latency
        } else {
            ChannelClass::Throughput
        })
    }

    /// Hands the stack a latency application's runtime and asks the scheduler again where
    /// the queues go ([`NetScheduler::place_queues`](netsched::NetScheduler::place_queues)
    /// with a latency runtime); the queues it places there move at once.
    pub(crate) fn place_latency_queues(
        &self,
        handle: tokio::runtime::Handle,
    ) -> Result<(), netdriver::channel::ChannelError> {
        use netdriver::channel::DriverPlace;
        self.set.add_external_runtime(LATENCY_RUNTIME, handle);
        let placement = self.set.placement();
        let queues = self.set.queues();
        let app = DriverPlace::External(APPLICATION_RUNTIME.into());
        let host = netsched::QueueHost {
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            queues: queues
                .iter()
                .map(|&queue| netsched::QueueInfo {
                    queue,
                    class: self.queue_class(queue),
                })
                .collect(),
            application_runtime: placement.runtime(&app).is_some(),
            latency_runtime: true,
        };
        let places = self.lock_shard(0).ep.scheduler_place_queues(&host);
        for (&queue, place) in queues.iter().zip(places) {
            let to = match place {
                netsched::QueuePlace::LatencyApplication => {
                    DriverPlace::External(LATENCY_RUNTIME.into())
                }
                // Only the latency queues move: the others stay where they are driven.
                _ => continue,
            };
            self.set.move_queue(queue, to)?;
        }
        Ok(())
    }

    /// Opens a channel to `remote` whose queue suits `class` (where the classes are kept
    /// apart, latency channels on the last queue, throughput channels round robin over
    /// the others). With the peer's hello (`peer`), the channel's port also lands on one
    /// of the peer's queues of the class where a free one does. Blocks for the
    /// handshake: opener threads only.
    pub(crate) fn connect_channel(
        &self,
        remote: SocketAddrV4,
        class: ChannelClass,
        next_bulk: &AtomicUsize,
        peer: Option<&crate::hello::RssDescription>,
    ) -> Result<Channel, netdriver::channel::ChannelError> {
        let target = peer.and_then(|d| {
            let queues = match class {
                ChannelClass::Latency => &d.latency,
                ChannelClass::Throughput => &d.throughput,
            };
            (!queues.is_empty()).then_some(netdriver::rss::PeerTarget {
                rss: &d.rss,
                queues,
            })
        });
        let queues = self.set.queues();
        if !self.config.separate_classes || queues.len() < 2 {
            return match target {
                Some(t) => self.set.connect_toward(remote, t),
                None => self.set.connect(remote),
            };
        }
        let queue = match class {
            ChannelClass::Latency => queues[queues.len() - 1],
            ChannelClass::Throughput => {
                let i = next_bulk.fetch_add(1, Ordering::Relaxed);
                queues[i % (queues.len() - 1)]
            }
        };
        match target {
            Some(t) => self.set.connect_on_toward(queue, remote, t),
            None => self.set.connect_on(queue, remote),
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        debug!(ipv4 = %self.ipv4(), "stack gone; stopping its channel set");
    }
}

/// The error of a call on a stack that stopped.
pub(crate) fn stopped_error() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the stack was shut down")
}

/// Bytes a channel holds towards its peer: queued, in TCP's send buffer or unacknowledged.
pub(crate) fn channel_pending(t: &Channel) -> usize {
    let s = t.stats();
    s.tx_queued + s.tx_tcp_queued.max(s.bytes_in_flight)
}
