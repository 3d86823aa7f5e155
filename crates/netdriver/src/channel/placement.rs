//! Where each queue's driver runs: queue runtimes of the set's own (threads each running a
//! current-thread tokio runtime, optionally pinned), or runtimes the caller hands over
//! (the application's, for run to completion; a latency application's, for isolation).
//!
//! Placement is decided at plan time, never per message: [`Placement`] at start, then
//! [`ChannelSet::move_queue`](super::ChannelSet::move_queue) (a scheduler's plan).
//! Moving a queue spawns a new driver on the target runtime (`QueueSlot::spawn_driver`);
//! the old one ends at its next poll. One runtime may drive any number of queues, so a
//! NIC with 64 queues does not mean 64 threads.
//!
//! A queue on a runtime the set does not own is at that runtime's mercy: a task that
//! blocks its worker also holds a driver waiting on that worker. The set's
//! [watchdog](watch) therefore looks at such queues every [`WATCH_TICK`]: one whose work
//! has waited longer than [`STALL`] moves to the set's home runtime (its first queue
//! runtime), and goes back once it has been away for [`RETURN_AFTER`]. Other tasks'
//! sockets on the same channels thus wait at most about `STALL + WATCH_TICK` behind a
//! blocked worker. A queue whose runtime stopped (its owner shut it down, dropping the
//! driver) moves to the home runtime at the next tick and stays there.

pub use super::place::DriverPlace;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::thread::JoinHandle;

use atomic_waker::AtomicWaker;
use tracing::{debug, info, warn};

use super::driver::QueueSlot;
use super::ChannelError;
use crate::time::{Duration, Instant};

/// How often the watchdog looks at queues driven by runtimes the set does not own.
pub const WATCH_TICK: Duration = Duration::from_millis(10);
/// How long a queue's work may wait for its driver before the watchdog moves the queue
/// to the set's home runtime.
pub const STALL: Duration = Duration::from_millis(20);
/// How long a rescued queue stays on the home runtime before it goes back to where it was
/// placed.
pub const RETURN_AFTER: Duration = Duration::from_secs(1);

/// Where a set's queues are driven when it starts.
#[derive(Debug, Clone)]
pub enum Placement {
    /// `count` queue runtimes (`None`: one per queue, at most one per core the process may
    /// run on), runtime *i* pinned to `cores[i % len]` when cores are given; queue *i*
    /// goes to runtime *i* modulo their number.
    Runtimes {
        /// How many queue runtimes.
        count: Option<usize>,
        /// Cores to pin them to.
        cores: Option<Vec<usize>>,
    },
    /// Every queue on the runtime `handle` (named `name` in the placement), with one
    /// queue runtime of the set's own as the home of the watchdog and of rescued queues.
    External {
        /// The name the placement shows for the runtime.
        name: String,
        /// The runtime.
        handle: tokio::runtime::Handle,
    },
    /// Every queue on the runtime `handle` and no thread of the set's own: no watchdog
    /// rescues the queues from a blocked worker of that runtime, and a runtime without
    /// timers leaves them undriven. For hosts that want no thread besides their own, and
    /// for deterministic tests under tokio's paused time (every timer of the set then
    /// runs on the paused clock).
    ExternalOnly {
        /// The name the placement shows for the runtime.
        name: String,
        /// The runtime.
        handle: tokio::runtime::Handle,
    },
    /// Queue *i* where `places[i]` says: `DriverPlace::Runtime(r)` names the set's queue
    /// runtime *r* (the set starts runtimes 0 to the largest named, at least one, runtime
    /// *r* pinned to `cores[r % len]` when cores are given), `DriverPlace::External(name)`
    /// one of `external`. Runtime 0 is the home of the watchdog and of rescued queues.
    Explicit {
        /// Where each queue goes, by its index.
        places: Vec<DriverPlace>,
        /// The runtimes handed to the set, by name.
        external: Vec<(String, tokio::runtime::Handle)>,
        /// Cores to pin the set's runtimes to.
        cores: Option<Vec<usize>>,
    },
}

impl Default for Placement {
    fn default() -> Self {
        Placement::Runtimes {
            count: None,
            cores: None,
        }
    }
}

/// How one queue runtime is stopped: a flag and the waker of the future it blocks on.
#[derive(Debug, Default)]
struct StopSignal {
    stop: AtomicBool,
    waker: AtomicWaker,
}

/// One queue runtime: a thread running a current-thread tokio runtime.
#[derive(Debug)]
pub(crate) struct QueueRuntime {
    pub(crate) handle: tokio::runtime::Handle,
    /// The core it is pinned to (`usize::MAX`: unpinned).
    core: Arc<AtomicUsize>,
    /// The CPUs it is confined to while unpinned: the NIC's NUMA node's.
    cpus: Option<Arc<[usize]>>,
    stop: Arc<StopSignal>,
    join: Option<JoinHandle<()>>,
}

impl QueueRuntime {
    /// Starts a queue runtime thread named `name`, pinned to `core` when given, else
    /// confined to `cpus` when given (the NIC's NUMA node, [`super::node_cpus`]); returns
    /// once its runtime runs.
    pub(crate) fn start(
        name: String,
        core: Option<usize>,
        cpus: Option<Arc<[usize]>>,
    ) -> Result<QueueRuntime, ChannelError> {
        let io = |op| move |source| ChannelError::Io { op, source };
        let stop = Arc::new(StopSignal::default());
        let core_cell = Arc::new(AtomicUsize::new(core.unwrap_or(usize::MAX)));
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let thread_stop = stop.clone();
        let thread_core = core_cell.clone();
        let thread_cpus = cpus.clone();
        let join = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let core = thread_core.load(Ordering::Acquire);
                pin_to(core);
                if let (usize::MAX, Some(cpus)) = (core, thread_cpus) {
                    if let Err(e) = super::node_cpus::confine_current_thread(&cpus) {
                        warn!(error = %e, ?cpus, "cannot confine the queue runtime to the NIC's NUMA node");
                    }
                }
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = tx.send(Ok(rt.handle().clone()));
                rt.block_on(std::future::poll_fn(|cx| {
                    thread_stop.waker.register(cx.waker());
                    if thread_stop.stop.load(Ordering::Acquire) {
                        Poll::Ready(())
                    } else {
                        Poll::Pending
                    }
                }));
                // Dropping the runtime drops the drivers still spawned on it; the queues
                // themselves were stopped (or moved) by the set before.
            })
            .map_err(io("spawning a queue runtime"))?;
        let handle = rx
            .recv()
            .map_err(|_| ChannelError::Io {
                op: "starting a queue runtime",
                source: std::io::Error::other("the queue runtime's thread ended at start"),
            })?
            .map_err(io("building a queue runtime"))?;
        Ok(QueueRuntime {
            handle,
            core: core_cell,
            cpus,
            stop,
            join: Some(join),
        })
    }

    /// The core it is pinned to.
    pub(crate) fn core(&self) -> Option<usize> {
        Some(self.core.load(Ordering::Acquire)).filter(|&c| c != usize::MAX)
    }

    /// The CPUs it is confined to, when it is not pinned to one core.
    pub(crate) fn cpus(&self) -> Option<Vec<usize>> {
        match self.core() {
            Some(_) => None,
            None => self.cpus.as_ref().map(|c| c.to_vec()),
        }
    }

    /// Pins the runtime's thread to `core` (from a task on it).
    pub(crate) fn pin(&self, core: usize) {
        if self.core.swap(core, Ordering::AcqRel) != core {
            self.handle.spawn(async move { pin_to(core) });
        }
    }

    /// Stops the runtime and joins its thread (unless called from that thread, a task of
    /// the runtime stopping its own set: it then ends once that task returns).
    pub(crate) fn stop(&mut self) {
        self.stop.stop.store(true, Ordering::Release);
        self.stop.waker.wake();
        if let Some(j) = self.join.take() {
            if j.thread().id() == std::thread::current().id() {
                return;
            }
            if j.join().is_err() {
                warn!("a queue runtime's thread panicked");
            }
        }
    }
}

impl Drop for QueueRuntime {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Moves the calling thread to `core` (`usize::MAX`: leaves it where it is).
fn pin_to(core: usize) {
    if core == usize::MAX {
        return;
    }
    if core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        debug!(core, "queue runtime pinned");
    } else {
        warn!(core, "cannot pin the queue runtime");
    }
}

/// Whether this process may run on `core`.
pub(crate) fn check_core(core: usize) -> Result<(), ChannelError> {
    let allowed = core_affinity::get_core_ids()
        .unwrap_or_default()
        .iter()
        .any(|c| c.id == core);
    if allowed {
        Ok(())
    } else {
        Err(ChannelError::CoreNotAllowed(core))
    }
}

/// Cores this process may run on.
pub(crate) fn usable_cores() -> usize {
    core_affinity::get_core_ids().map_or(1, |c| c.len().max(1))
}

/// One queue's placement, as the set keeps it.
#[derive(Debug, Clone)]
pub(crate) struct QueuePlace {
    /// Where its driver runs now.
    pub(crate) now: DriverPlace,
    /// Where it was placed (the watchdog moves it back there).
    pub(crate) wanted: DriverPlace,
    /// When the watchdog moved it to the home runtime.
    pub(crate) rescued_at: Option<Instant>,
    /// The queue died (fault injection): nobody drives it.
    pub(crate) dead: bool,
}

/// Every runtime of a set and which queue each drives.
#[derive(Debug, Default)]
pub(crate) struct Runtimes {
    /// The set's own queue runtimes, by id.
    pub(crate) own: BTreeMap<u32, QueueRuntime>,
    /// Runtimes handed to the set, by name.
    pub(crate) external: BTreeMap<String, tokio::runtime::Handle>,
    /// Per queue index.
    pub(crate) queues: Vec<QueuePlace>,
    pub(crate) next_id: u32,
    /// The runtime that hosts the watchdog and rescued queues.
    pub(crate) home: u32,
    /// Queues the watchdog moved off a stalled runtime, since the set started.
    pub(crate) rescues: u64,
    /// The CPUs of the NIC's NUMA node this process may use: where unpinned queue
    /// runtimes run (`None`: anywhere).
    pub(crate) node_cpus: Option<Arc<[usize]>>,
}

impl Runtimes {
    /// The handle of `place`.
    pub(crate) fn handle(
        &self,
        place: &DriverPlace,
    ) -> Result<tokio::runtime::Handle, ChannelError> {
        match place {
            DriverPlace::Runtime(id) => self
                .own
                .get(id)
                .map(|r| r.handle.clone())
                .ok_or(ChannelError::NoSuchRuntime(*id)),
            DriverPlace::External(name) => {
                self.external.get(name).cloned().ok_or_else(|| {
                    ChannelError::InvalidConfig(format!("no runtime named {name:?}"))
                })
            }
        }
    }

    /// The home runtime's handle.
    pub(crate) fn home_handle(&self) -> Option<tokio::runtime::Handle> {
        self.own.get(&self.home).map(|r| r.handle.clone())
    }

    /// Queue indices driven by `place` now.
    pub(crate) fn queues_on<'a>(
        &'a self,
        place: &'a DriverPlace,
    ) -> impl Iterator<Item = usize> + 'a {
        self.queues
            .iter()
            .enumerate()
            .filter(move |(_, q)| !q.dead && &q.now == place)
            .map(|(i, _)| i)
    }
}

/// The set's placement state, shared with its watchdog.
#[derive(Debug, Default)]
pub(crate) struct PlacementState {
    runtimes: Mutex<Runtimes>,
}

impl PlacementState {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Runtimes> {
        self.runtimes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The watchdog: every [`WATCH_TICK`], while some queue is placed on a runtime the set
/// does not own, moves queues whose work waited longer than [`STALL`] to the home runtime
/// and brings rescued ones back after [`RETURN_AFTER`]. Runs on the home runtime until
/// the set is gone (`slots` is then the last reference).
pub(crate) async fn watch(
    state: std::sync::Weak<PlacementState>,
    slots: std::sync::Weak<Vec<Arc<QueueSlot>>>,
    clock: super::clock::RuntimeClock,
) {
    loop {
        tokio::time::sleep(WATCH_TICK).await;
        let (Some(state), Some(slots)) = (state.upgrade(), slots.upgrade()) else {
            return;
        };
        let now = clock.now();
        let mut rt = state.lock();
        let home = DriverPlace::Runtime(rt.home);
        let Ok(home_handle) = rt.handle(&home) else {
            return;
        };
        for (i, slot) in slots.iter().enumerate() {
            let Some(place) = rt.queues.get(i).cloned() else {
                continue;
            };
            if place.dead {
                continue;
            }
            if slot.take_orphaned() && place.now != home {
                // The runtime dropped the queue's driver: it stopped. Runtimes handed to
                // the set are not used again once one is seen to have stopped.
                warn!(
                    queue = slot.queue,
                    from = %place.now,
                    "the runtime that drove the queue stopped; the set's home runtime drives it"
                );
                if let DriverPlace::External(name) = &place.now {
                    rt.external.remove(name);
                }
                let gone = place.now.clone();
                for q in rt.queues.iter_mut() {
                    if q.wanted == gone {
                        q.wanted = home.clone();
                    }
                }
                slot.spawn_driver(&home_handle);
                rt.queues[i].now = home.clone();
                rt.queues[i].wanted = home.clone();
                rt.queues[i].rescued_at = None;
                rt.rescues += 1;
                continue;
            }
            if place.now != home && matches!(place.now, DriverPlace::External(_)) {
                if stalled(slot, now) {
                    warn!(
                        queue = slot.queue,
                        from = %place.now,
                        "a queue's work waited longer than {STALL:?} for its runtime; the set's home runtime drives it for now"
                    );
                    slot.spawn_driver(&home_handle);
                    rt.queues[i].now = home.clone();
                    rt.queues[i].rescued_at = Some(now);
                    rt.rescues += 1;
                }
            } else if place.now == home && place.wanted != home {
                let due = place
                    .rescued_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= RETURN_AFTER);
                if due {
                    if let Ok(h) = rt.handle(&place.wanted) {
                        info!(queue = slot.queue, to = %place.wanted, "a rescued queue goes back to its runtime");
                        slot.spawn_driver(&h);
                        rt.queues[i].now = place.wanted.clone();
                        rt.queues[i].rescued_at = None;
                    }
                }
            }
        }
    }
}

/// Whether a queue's work has waited longer than [`STALL`] for its driver: work signalled
/// and not taken, or frames on its ring while no driver polled.
fn stalled(slot: &QueueSlot, now: Instant) -> bool {
    if slot
        .signal
        .pending_since()
        .is_some_and(|t| now.saturating_duration_since(t) >= STALL)
    {
        return true;
    }
    let idle_long = slot
        .last_poll()
        .is_none_or(|t| now.saturating_duration_since(t) >= STALL);
    // Arrivals raise no flag of ours (the runtime's reactor hears of them): look at the
    // ring, without waiting for a poll in progress.
    idle_long && slot.try_lock_state().is_some_and(|mut st| st.rx_ready())
}
