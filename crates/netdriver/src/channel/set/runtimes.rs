//! Where a [`ChannelSet`]'s queues are driven: runtimes added, pinned and removed,
//! queues moved between them, and the placement as a report ([`ChannelPlacement`]).

use super::super::placement::{check_core, DriverPlace, QueueRuntime};
use super::super::ChannelError;
use super::ChannelSet;
use std::sync::atomic::Ordering;
use tracing::{debug, info, warn};

impl ChannelSet {
    /// Starts one more queue runtime, pinned to `core` when given, driving no queue yet;
    /// returns its id once it runs. Give it queues with [`move_queue`](Self::move_queue).
    ///
    /// ```no_run
    /// # fn f(set: &netdriver::channel::ChannelSet) -> Result<(), netdriver::channel::ChannelError> {
    /// use netdriver::channel::DriverPlace;
    /// // Queue 1 gets a runtime of its own on core 1.
    /// let r = set.add_runtime(Some(1))?;
    /// set.move_queue(1, DriverPlace::Runtime(r))?;
    /// assert_eq!(set.placement().place_of(1), Some(DriverPlace::Runtime(r)));
    /// # Ok(()) }
    /// ```
    pub fn add_runtime(&self, core: Option<usize>) -> Result<u32, ChannelError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(ChannelError::ShutDown);
        }
        if let Some(c) = core {
            check_core(c)?;
        }
        let mut rt = self.placement.lock();
        let id = rt.next_id;
        let r = QueueRuntime::start(
            format!("nc-q-{}-{id}", self.name()),
            core,
            rt.node_cpus.clone(),
        )?;
        rt.own.insert(id, r);
        rt.next_id += 1;
        info!(runtime = id, ?core, "queue runtime added");
        Ok(id)
    }

    /// Hands the set a runtime it does not own, under `name`, so that queues can be
    /// placed on it ([`DriverPlace::External`]): an application's runtime (its tasks then
    /// run their queues' rounds between their own, run to completion), or a latency
    /// application's. A queue placed there is watched: if its work waits longer than
    /// [`STALL`](super::placement::STALL) (the runtime's worker blocked), the set's home
    /// runtime drives it until the runtime is responsive again. A name given twice takes
    /// the new handle.
    pub fn add_external_runtime(&self, name: impl Into<String>, handle: tokio::runtime::Handle) {
        let name = name.into();
        debug!(%name, "external runtime added");
        self.placement.lock().external.insert(name, handle);
    }

    /// Moves `queue`'s driver to `place`: a new driver starts there and runs a round at
    /// once, the old one ends at its next poll; nothing queued is lost, duplicated or
    /// reordered (the queue's state is never in two drivers). Moving a queue to where it
    /// runs does nothing.
    pub fn move_queue(&self, queue: u32, place: DriverPlace) -> Result<(), ChannelError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(ChannelError::ShutDown);
        }
        let index = self
            .queue_index(queue)
            .ok_or(ChannelError::NoSuchQueue(queue))?;
        let mut rt = self.placement.lock();
        let handle = rt.handle(&place)?;
        let q = &mut rt.queues[index];
        if q.dead {
            return Err(ChannelError::QueueDied);
        }
        q.wanted = place.clone();
        q.rescued_at = None;
        if q.now == place {
            return Ok(());
        }
        debug!(queue, from = %q.now, to = %place, "moving a queue");
        q.now = place;
        self.slots[index].spawn_driver(&handle);
        Ok(())
    }

    /// Removes queue runtime `id`: its queues move to the remaining runtimes of the set
    /// (each to the one driving the fewest then), then it stops. The home runtime (the
    /// first) is not removed ([`ChannelError::HomeRuntime`]).
    pub fn remove_runtime(&self, id: u32) -> Result<(), ChannelError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(ChannelError::ShutDown);
        }
        let removed = {
            let mut rt = self.placement.lock();
            if !rt.own.contains_key(&id) {
                return Err(ChannelError::NoSuchRuntime(id));
            }
            if id == rt.home {
                return Err(ChannelError::HomeRuntime(id));
            }
            let me = DriverPlace::Runtime(id);
            let mine: Vec<usize> = rt.queues_on(&me).collect();
            for index in mine {
                let to = rt
                    .own
                    .keys()
                    .filter(|&&o| o != id)
                    .min_by_key(|&&o| rt.queues_on(&DriverPlace::Runtime(o)).count())
                    .copied()
                    .unwrap_or(rt.home);
                let place = DriverPlace::Runtime(to);
                let handle = rt.handle(&place)?;
                rt.queues[index].now = place.clone();
                if rt.queues[index].wanted == me {
                    rt.queues[index].wanted = place;
                }
                self.slots[index].spawn_driver(&handle);
            }
            for q in rt.queues.iter_mut() {
                if q.wanted == me {
                    q.wanted = q.now.clone();
                }
            }
            rt.own.remove(&id)
        };
        // Stopped outside the lock: its thread ends once its tasks are dropped.
        drop(removed);
        info!(runtime = id, "queue runtime removed");
        Ok(())
    }

    /// Pins queue runtime `id` to `core` (it moves itself, with all its queues).
    pub fn pin_runtime(&self, id: u32, core: usize) -> Result<(), ChannelError> {
        check_core(core)?;
        let rt = self.placement.lock();
        let r = rt.own.get(&id).ok_or(ChannelError::NoSuchRuntime(id))?;
        r.pin(core);
        Ok(())
    }

    /// Pins the queue runtime that drives `queue` to `core` (a scheduler's `Pin`); `false`
    /// when the queue is placed on a runtime the set does not own (also while the watchdog
    /// has it on the home runtime, which is not to be pinned for a queue passing through),
    /// or the core is not one this process may run on.
    pub fn pin_queue_runtime(&self, queue: u32, core: usize) -> bool {
        let Some(index) = self.queue_index(queue) else {
            return false;
        };
        let id = match self
            .placement
            .lock()
            .queues
            .get(index)
            .map(|q| q.wanted.clone())
        {
            Some(DriverPlace::Runtime(id)) => id,
            _ => return false,
        };
        self.pin_runtime(id, core).is_ok()
    }

    /// Where each queue's driver runs, which runtimes exist, their cores and how busy
    /// their queues have been (a snapshot; `serde`-serialisable and printable).
    pub fn placement(&self) -> ChannelPlacement {
        let rt = self.placement.lock();
        let busy = |q: usize| {
            std::time::Duration::from_nanos(self.slots[q].busy_ns.load(Ordering::Relaxed))
        };
        let mut runtimes: Vec<RuntimePlacement> = rt
            .own
            .iter()
            .map(|(&id, r)| {
                let place = DriverPlace::Runtime(id);
                let queues: Vec<usize> = rt.queues_on(&place).collect();
                RuntimePlacement {
                    place,
                    queues: queues.iter().map(|&i| self.slots[i].queue).collect(),
                    core: r.core(),
                    cpus: r.cpus(),
                    busy: queues.iter().map(|&i| busy(i)).sum(),
                }
            })
            .collect();
        for name in rt.external.keys() {
            let place = DriverPlace::External(name.clone());
            let queues: Vec<usize> = rt.queues_on(&place).collect();
            runtimes.push(RuntimePlacement {
                place,
                queues: queues.iter().map(|&i| self.slots[i].queue).collect(),
                core: None,
                cpus: None,
                busy: queues.iter().map(|&i| busy(i)).sum(),
            });
        }
        ChannelPlacement {
            runtimes,
            dead: rt
                .queues
                .iter()
                .enumerate()
                .filter(|(_, q)| q.dead)
                .map(|(i, _)| self.slots[i].queue)
                .collect(),
            rescues: rt.rescues,
        }
    }

    /// Fault injection, for tests and failure drills: `queue` dies as if its driver had
    /// crashed. Its channels fail at once on this side ([`ChannelError::QueueDied`]), but
    /// nothing goes on the wire: no FIN, no RST. The queue's AF_XDP socket stays open with
    /// every connection as it was, so arrivals for them are dropped unread and the peer
    /// notices only through its keep-alive or user timeout. Nobody drives the queue
    /// afterwards: new channels go to the other queues, and its SYNs go unanswered. The
    /// state is released when the set stops. Returns at once; `false` when there is no
    /// such queue or it was killed before.
    pub fn kill_queue(&self, queue: u32) -> bool {
        let Some(index) = self.queue_index(queue) else {
            return false;
        };
        let slot = &self.slots[index];
        {
            let mut rt = self.placement.lock();
            if rt.queues[index].dead {
                return false;
            }
            rt.queues[index].dead = true;
        }
        warn!(queue, "killing a queue's driver (fault injection)");
        slot.signal.set_dead();
        slot.revoke().die();
        self.graveyard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(slot.clone());
        true
    }
}

/// Where a [`ChannelSet`]'s queues are driven ([`ChannelSet::placement`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ChannelPlacement {
    /// Every runtime of the set: its own queue runtimes by id, then the runtimes handed
    /// to it by name.
    pub runtimes: Vec<RuntimePlacement>,
    /// Queues killed by fault injection ([`ChannelSet::kill_queue`]).
    pub dead: Vec<u32>,
    /// Times the watchdog moved a queue off a runtime that did not drive it in time.
    pub rescues: u64,
}

impl ChannelPlacement {
    /// Where `queue`'s driver runs, if it is alive.
    pub fn place_of(&self, queue: u32) -> Option<DriverPlace> {
        self.runtimes
            .iter()
            .find(|r| r.queues.contains(&queue))
            .map(|r| r.place.clone())
    }

    /// The runtime at `place`, if the set has it.
    pub fn runtime(&self, place: &DriverPlace) -> Option<&RuntimePlacement> {
        self.runtimes.iter().find(|r| &r.place == place)
    }
}

impl std::fmt::Display for ChannelPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, r) in self.runtimes.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{r}")?;
        }
        if !self.dead.is_empty() {
            write!(f, "; dead queues {:?}", self.dead)?;
        }
        Ok(())
    }
}

/// One runtime in a [`ChannelPlacement`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuntimePlacement {
    /// Which runtime.
    pub place: DriverPlace,
    /// The queues it drives now.
    pub queues: Vec<u32>,
    /// The core it is pinned to, if any (runtimes of the set only).
    pub core: Option<usize>,
    /// The CPUs it runs on when it is not pinned: the NIC's NUMA node's that the process
    /// may use (runtimes of the set only; `None`: anywhere).
    #[serde(default)]
    pub cpus: Option<Vec<usize>>,
    /// Time its queues' drivers spent in rounds since the set started (whichever runtime
    /// ran them).
    pub busy: std::time::Duration,
}

impl std::fmt::Display for RuntimePlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} queues {:?}", self.place, self.queues)?;
        match self.core {
            Some(c) => write!(f, " core {c}")?,
            None => f.write_str(" unpinned")?,
        }
        if let Some(cpus) = &self.cpus {
            write!(f, " on cpus {cpus:?}")?;
        }
        write!(f, " busy {:?}", self.busy)
    }
}
