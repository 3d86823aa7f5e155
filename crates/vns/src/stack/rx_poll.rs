//! Run-to-completion receive: a task with nothing to read waits on the queues' AF_XDP
//! sockets in its own tokio runtime (`AsyncFd`), and when one turns readable it runs the
//! queue's round itself ([`RxPoller::poll_now`]) and reads what it brought.
//!
//! Without this, an arrival crosses two threads before the reader sees it: the kernel
//! wakes the queue's channel thread, which processes the frame and wakes the reader's
//! task (a wake-up from outside the runtime, which on tokio's multi-thread scheduler also
//! wakes a second worker to look for work). With it, the kernel wakes the runtime's own
//! I/O driver, which wakes the task locally; the channel thread stays asleep, since the
//! task holds a lease on the queue's arrivals ([`RxPoller::lease`]) while it waits.
//!
//! Each queue's registration belongs to the runtime of the first task that waits on that
//! queue (one descriptor can be registered with one reactor). Where the classes have
//! queues of their own (see [`Waiters`]), a latency application's runtime thus registers
//! only the latency queues: its reactor never polls a bulk queue's socket, which for an
//! AF_XDP socket in copy mode means driving that socket's transmission under its mutex,
//! behind the bulk channel thread's batches (1-5 ms waits of the latency application,
//! `docs/performance.md`, tenth session). A task of another runtime, or of a runtime that
//! has shut down, gets the channel thread's hand-off as before; so does any task when the
//! stack's backend has no AF_XDP queues (the in-memory backend).
//!
//! Only one task is woken per arrival (tokio keeps one reader waker per descriptor for
//! `poll_read_ready`): it feeds every channel's bytes to the endpoint, whose events wake
//! the other waiting tasks from that thread (see [`Core::pull`](super::driver::Core::pull)),
//! and a lease nobody serves (its task went away) ends after [`LEASE`], when the channel
//! thread takes the queue back.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use netdriver::channel::{RxPoller, RxRound};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tracing::{debug, warn};

use super::waker_list::WakerList;

/// How long a waiting task holds a queue's arrivals (renewed each time it waits): the
/// longest an arrival waits when the task that took the lease is gone.
///
/// The channel thread wakes at a lease's end to see whether it was renewed, so this is
/// also how often the thread wakes while a runtime serves its queue. At 1 ms those
/// wake-ups (with the stack driver's `PULL_FALLBACK` and the TLP timer's) preempted the
/// 4 KB ping-pong's task in about one exchange in ten on the 2-core bed, most of its p99
/// (`docs/performance.md`, "Background wake-ups"). A long lease is safe because nobody is
/// left waiting under it: the descriptors wake a task that waits ([`QueueReady`]), and a
/// reader that leaves receiving to the channel threads ends the leases when it waits
/// ([`RuntimeQueues::poll`]).
pub(crate) const LEASE: Duration = Duration::from_millis(10);

/// Rounds a task runs per wait before it lets others run (arrivals that keep coming are
/// then served by the next wait, or by the channel thread).
const ROUNDS_PER_WAIT: usize = 4;

/// The queues of a stack's channel set, as its runtime waits on them.
pub(crate) struct RuntimeQueues {
    pollers: Vec<RxPoller>,
    /// Each queue's descriptor, registered with the runtime of the first task that
    /// waited on that queue (`None`: registering failed, e.g. a runtime without I/O; the
    /// hand-off then stays as before, see `off`).
    fds: Vec<OnceLock<Option<Registered>>>,
    /// A registration failed or stopped working (its runtime shut down): the channel
    /// threads hand every arrival off, as without this.
    off: AtomicBool,
    /// Which sockets' tasks use it ([`RuntimeRx`] as a byte; changed by
    /// [`Stack::set_runtime_rx`](super::Stack::set_runtime_rx)).
    mode: AtomicU8,
    /// Queue rounds run by waiting tasks.
    rounds: AtomicU64,
    /// Times a waiting task found a queue's round held by another thread and asked that
    /// thread for one more ([`RxRound::Asked`]).
    asked: AtomicU64,
    /// Of `rounds`, those a task ran before looking for its bytes ([`RuntimeQueues::run_ready`]).
    rounds_first: AtomicU64,
    /// A waiting task leased the queues since a task that does not use them last waited.
    leased: AtomicBool,
    /// The tasks waiting on the descriptors, which [`QueueReady`] picks from.
    waiters: Arc<Waiters>,
    /// The wakers the runtime's reactor holds for the descriptors, one per queue
    /// ([`QueueReady`]).
    ready: Vec<Waker>,
    /// The same, as themselves: whether each is registered ([`QueueReady::armed`]).
    ready_state: Vec<Arc<QueueReady>>,
}

/// A queue's descriptor registered with a runtime's reactor.
struct Registered {
    fd: AsyncFd<OwnedFd>,
    /// The name of the thread that registered it (a worker of that runtime, or the
    /// thread of its `block_on`), for diagnosis.
    by: Option<String>,
}

/// Every queue, as a mask (queues past the 64th are always served).
const ALL_QUEUES: u64 = u64::MAX;

/// Whether queue `i` is in `mask`.
fn in_mask(mask: u64, i: usize) -> bool {
    i >= 64 || mask & (1 << i) != 0
}

/// Most tasks [`Waiters`] holds (more wait for the channel threads' hand-off).
const MAX_WAITERS: usize = 64;

/// The tasks waiting for the queues' arrivals in their runtime, most recent last, in two
/// lists: tasks of latency-class sockets and the others. Where the stack keeps the
/// classes on queues of their own (`Isolating`), each serves only its class's queues
/// ([`mask`](Self::mask)), so that a latency application's thread never processes bulk
/// arrivals (nor holds the lease of their queue, which keeps its channel thread off it)
/// and a bulk task never holds a latency queue; an arrival then wakes a task of the
/// queue's class (one of the other class would not look at that queue, and the arrival
/// would wait for the lease's end). Otherwise both serve every queue.
#[derive(Debug)]
struct Waiters {
    /// Indexed by whether the socket is of the latency class.
    lists: [WakerList; 2],
    /// [`QueueReady`] woke a task that has not looked at the descriptors since.
    picked: AtomicBool,
    /// The queues (a bit each, by position among the pollers) that carry latency
    /// channels, where the stack keeps the classes on queues of their own; 0 where it
    /// does not.
    latency_queues: AtomicU64,
    /// How many queues there are.
    queues: usize,
}

impl Waiters {
    /// The queues a task of a socket of the latency class (`latency_class`) or not serves.
    fn mask(&self, latency_class: bool) -> u64 {
        let latency = self.latency_queues.load(Ordering::Relaxed);
        if latency == 0 {
            return ALL_QUEUES;
        }
        let mine = if latency_class { latency } else { !latency };
        let all = if self.queues >= 64 {
            u64::MAX
        } else {
            (1u64 << self.queues) - 1
        };
        // A class without a queue of its own (its channels lost, say): every queue.
        if mine & all == 0 {
            ALL_QUEUES
        } else {
            mine
        }
    }

    /// The waiting task to wake for an arrival on queue `queue`, the most recent of a
    /// class that serves that queue.
    fn pick(&self, queue: usize) -> Option<Waker> {
        // The queue's own class first (with no split, the latency list first: it is
        // the one whose wait matters most).
        let first = in_mask(self.mask(true), queue);
        for class in [first, !first] {
            if in_mask(self.mask(class), queue) {
                if let Some(w) = self.lists[usize::from(class)].pop() {
                    return Some(w);
                }
            }
        }
        None
    }
}

/// The waker registered with the runtime's reactor for a NIC queue's AF_XDP descriptor:
/// arrivals wake the task that waited last, out of those waiting now, and that task runs
/// the queue's round. With nobody waiting, the queue's lease ends at once and its channel
/// thread takes the arrivals: a lease outlives the wait that took it by up to [`LEASE`],
/// and bytes for a socket that no runtime task reads (a raw channel, a reader on another
/// thread) must not wait for its end.
///
/// tokio keeps one reader waker per descriptor. Registering each waiting task's own
/// waker left the descriptor with the last task to wait, which may have stopped waiting
/// since (its bytes came through another task's round): an arrival then woke it at an
/// await point that does not look at the descriptor, and the tasks still waiting slept
/// until the channel thread took the queue back at the lease's end. A read that returns
/// bytes takes its task off the list ([`RuntimeQueues::leave`]), so this wakes a task
/// that waits; one that was picked and returns without looking runs the rounds itself.
struct QueueReady {
    waiters: Arc<Waiters>,
    queue: RxPoller,
    /// The queue's index among the stack's.
    index: usize,
    /// The reactor holds this waker for the descriptor and has not woken it since: the
    /// last poll of the descriptor was pending and no event came after it. Set before
    /// each poll ([`RuntimeQueues::poll_descriptor`]), cleared when a poll finds the
    /// descriptor readable and when the reactor wakes it (it takes the waker with the
    /// event). A task that finds it set skips the poll, which would only find it pending
    /// and register the same waker again: two to four of a 64-byte read's polls, about
    /// 130 instructions each, in tokio's waiter lock and the cooperative budget
    /// (`docs/performance.md`, thirteenth session).
    ///
    /// Seen set while the reactor wakes it (an event right after the look) is the same as
    /// an event a moment later: the wake picks a waiting task, or with none ends the
    /// queue's lease so that its channel thread takes the frames.
    armed: AtomicBool,
}

impl Wake for QueueReady {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.armed.store(false, Ordering::Release);
        match self.waiters.pick(self.index) {
            Some(w) => {
                self.waiters.picked.store(true, Ordering::Release);
                w.wake();
            }
            // The readiness stays set for the next task to wait; the thread, woken,
            // waits on the socket again and takes the frames now.
            None => self.queue.end_lease(),
        }
    }
}

/// How [`RuntimeQueues::rounds_until_pending`] stopped.
enum LookEnd {
    /// The descriptor is pending, its [`QueueReady`] registered.
    Pending,
    /// The queue's thread stops or died: the readiness is kept, nobody runs its rounds.
    NotRun,
    /// The runtime's registration of the descriptor failed.
    Failed(std::io::Error),
    /// Still readable after [`ROUNDS_PER_WAIT`] rounds.
    RoundsSpent,
}

/// Which tasks wait on the NIC queues in their own runtime and process arrivals there
/// (run-to-completion receive) instead of waiting for the queue's channel thread to
/// process them and wake the task ([`StackBuilder::runtime_rx`](super::StackBuilder::runtime_rx)).
///
/// Measured on the 2-core bed (`docs/performance.md`): a 4 KB ping-pong's p50 falls to
/// 0.6-0.85x with it, and a latency-class stream's matches a raw channel's; but an echo
/// server that answers partial reads at once, with 32-128 connections, loses up to a
/// third of its request rate (30-45 % at 128 connections since the 10 ms lease, under
/// which the channel threads never take a turn), since the task wakes per frame where
/// the channel thread gathers a batch. Hence the default: latency-class sockets only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RuntimeRx {
    /// Channel threads process every arrival and wake the readers.
    Off,
    /// Tasks reading latency-class sockets ([`AppClass::Latency`](crate::AppClass)),
    /// and any socket while the stack has few active streams
    /// (`StackBuilder::light_load_streams`), process arrivals themselves; the rest as
    /// with `Off`.
    #[default]
    LatencyClass,
    /// Every reading task processes arrivals itself while its queue is quiet.
    All,
}

impl RuntimeRx {
    fn to_byte(self) -> u8 {
        match self {
            RuntimeRx::Off => 0,
            RuntimeRx::LatencyClass => 1,
            RuntimeRx::All => 2,
        }
    }

    /// Whether a task reading a socket of this class uses it.
    fn applies(byte: u8, latency: bool) -> bool {
        byte == 2 || (byte == 1 && latency)
    }
}

impl std::fmt::Debug for RuntimeQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeQueues")
            .field("queues", &self.pollers.len())
            .field("off", &self.off.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl RuntimeQueues {
    /// `None` when there is nothing to poll (no AF_XDP queues).
    pub(crate) fn new(pollers: Vec<RxPoller>, mode: RuntimeRx) -> Option<RuntimeQueues> {
        if pollers.is_empty() || pollers.iter().any(|p| p.fd().is_none()) {
            return None;
        }
        let waiters = Arc::new(Waiters {
            lists: [WakerList::new(MAX_WAITERS), WakerList::new(MAX_WAITERS)],
            picked: AtomicBool::new(false),
            latency_queues: AtomicU64::new(0),
            queues: pollers.len(),
        });
        let ready_state: Vec<_> = pollers
            .iter()
            .enumerate()
            .map(|(index, p)| {
                Arc::new(QueueReady {
                    waiters: waiters.clone(),
                    queue: p.clone(),
                    index,
                    armed: AtomicBool::new(false),
                })
            })
            .collect();
        let ready = ready_state.iter().cloned().map(Waker::from).collect();
        Some(RuntimeQueues {
            fds: pollers.iter().map(|_| OnceLock::new()).collect(),
            pollers,
            off: AtomicBool::new(false),
            mode: AtomicU8::new(mode.to_byte()),
            rounds: AtomicU64::new(0),
            asked: AtomicU64::new(0),
            rounds_first: AtomicU64::new(0),
            leased: AtomicBool::new(false),
            ready,
            ready_state,
            waiters,
        })
    }

    /// The stack's channel table changed: `queues` has a bit for each NIC queue (by its
    /// number) that carries a latency channel when the stack keeps the classes on queues
    /// of their own, 0 when it does not (see [`Waiters`], which keeps them by position
    /// among the pollers).
    pub(crate) fn set_latency_queues(&self, queues: u64) {
        let mut mask = 0u64;
        for (i, p) in self.pollers.iter().enumerate().take(64) {
            if p.queue() < 64 && queues & (1 << p.queue()) != 0 {
                mask |= 1 << i;
            }
        }
        self.waiters.latency_queues.store(mask, Ordering::Relaxed);
    }

    /// The NIC queues a waiting task of a latency-class socket (`latency_class`) or of
    /// another serves (see [`Waiters`]).
    pub(crate) fn queues_served(&self, latency_class: bool) -> Vec<u32> {
        let mask = self.waiters.mask(latency_class);
        self.pollers
            .iter()
            .enumerate()
            .filter(|&(i, _)| in_mask(mask, i))
            .map(|(_, p)| p.queue())
            .collect()
    }

    /// Whether tasks may wait on the descriptors now: no registration failed.
    fn usable(&self) -> bool {
        !self.off.load(Ordering::Relaxed)
    }

    /// Queue `i`'s registered descriptor, registering it with the calling task's runtime
    /// on first use; `None` (and every queue off) when that fails, and `None` (to try
    /// again later) when the caller runs in no tokio runtime (a blocking caller, another
    /// executor). The runtime is looked up only before the registration: the lookup
    /// clones the runtime's handle, an atomic that the runtime's workers share.
    fn fd(&self, i: usize) -> Option<&AsyncFd<OwnedFd>> {
        if let Some(r) = self.fds[i].get() {
            return r.as_ref().map(|r| &r.fd);
        }
        tokio::runtime::Handle::try_current().ok()?;
        let fd = self.fds[i].get_or_init(|| self.register(i)).as_ref();
        if fd.is_none() {
            self.off.store(true, Ordering::Relaxed);
        }
        fd.map(|r| &r.fd)
    }

    fn register(&self, i: usize) -> Option<Registered> {
        let p = &self.pollers[i];
        let fd = p.fd()?.try_clone_to_owned().ok()?;
        // Read interest only: an AF_XDP socket is nearly always writable, and every
        // writable edge would wake the runtime's reactor for nothing.
        // `AsyncFd::with_interest` panics (rather than failing) in a runtime built
        // without I/O; such a runtime keeps the channel threads' hand-off. It is
        // deprecated in favour of the `unsafe` `AsyncFd::register_with_interest`
        // because a generic inner value could close or replace its descriptor while
        // registered (tokio#8587); an `OwnedFd` owned by the `AsyncFd` cannot, and
        // this crate has no `unsafe`.
        #[allow(deprecated)]
        let reg = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            AsyncFd::with_interest(fd, Interest::READABLE)
        }));
        match reg {
            Ok(Ok(fd)) => {
                let by = std::thread::current().name().map(str::to_owned);
                debug!(queue = p.queue(), thread = ?by, "receive of the queue runs in this runtime");
                Some(Registered { fd, by })
            }
            Ok(Err(e)) => {
                warn!(error = %e, "registering an AF_XDP socket with the runtime; channel threads keep the receive hand-off");
                None
            }
            Err(_) => {
                warn!("the tokio runtime has no I/O driver (enable_io); channel threads keep the receive hand-off");
                None
            }
        }
    }

    /// The queues (by number) whose descriptor a runtime registered, each with the name
    /// of the thread that did.
    pub(crate) fn registrations(&self) -> Vec<(u32, Option<String>)> {
        self.pollers
            .iter()
            .zip(&self.fds)
            .filter_map(|(p, r)| Some((p.queue(), r.get()?.as_ref()?.by.clone())))
            .collect()
    }

    /// Queue rounds that waiting tasks ran so far.
    pub(crate) fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    /// Times a waiting task found a queue's round held elsewhere and asked its holder
    /// for one more, so far.
    pub(crate) fn asked(&self) -> u64 {
        self.asked.load(Ordering::Relaxed)
    }

    /// Of [`rounds`](Self::rounds), those a task ran before it looked for its bytes
    /// ([`run_ready`](Self::run_ready)), so far.
    pub(crate) fn rounds_first(&self) -> u64 {
        self.rounds_first.load(Ordering::Relaxed)
    }

    /// Changes which tasks use it (leases already given run out within [`LEASE`]).
    pub(crate) fn set_mode(&self, mode: RuntimeRx) {
        self.mode.store(mode.to_byte(), Ordering::Relaxed);
    }

    /// A task has nothing to read on a socket of class `latency` (it registered for the
    /// channels' hand-off already):
    /// runs the rounds of queues with arrivals on this thread and waits on the others
    /// with `cx`, of the queues its class serves (`latency_class`: the socket's class is
    /// latency; see [`Waiters`]). Returns whether it ran a round (the caller looks for its
    /// bytes again).
    ///
    /// The descriptors are registered with [`QueueReady`], never with the task's own
    /// waker: the task joins the list of waiters it picks from.
    pub(crate) fn poll(&self, cx: &mut Context<'_>, latency: bool, latency_class: bool) -> bool {
        if !RuntimeRx::applies(self.mode.load(Ordering::Relaxed), latency) {
            // This task waits for the channel threads: leases that tasks took (a moment
            // ago, under a light load, or for a latency-class socket) must not keep them
            // off the queues while nobody who took them waits any more. Each would hold
            // its queue's arrivals until it ran out, and the stalls made the load look
            // light again (a 10 ms lease took 32 connections to 5 % of their rate).
            if self.leased.load(Ordering::Relaxed) && self.leased.swap(false, Ordering::AcqRel) {
                self.pollers.iter().for_each(RxPoller::end_lease);
            }
            return false;
        }
        if !self.usable() {
            return false;
        }
        if self.waiters.picked.load(Ordering::Relaxed) {
            self.waiters.picked.store(false, Ordering::Relaxed);
        }
        let queues = self.waiters.mask(latency_class);
        let mut ran = false;
        let mut waits = false;
        // One clock read for the leases of every queue this call waits on.
        let mut now = None;
        for (i, (poller, ready)) in self.pollers.iter().zip(&self.ready).enumerate() {
            if !in_mask(queues, i) {
                continue;
            }
            let mut ready_cx = Context::from_waker(ready);
            // A queue whose thread died (fault injection) is served by nobody: its socket
            // stays readable while frames pile up, and waiting on it would only spin,
            // since `poll_now` runs nothing for it. Its channels are already failed.
            if poller.is_dead() {
                continue;
            }
            let Some(fd) = self.fd(i) else {
                return ran;
            };
            let (rounds, end) = if self.armed(i) {
                (0, LookEnd::Pending)
            } else {
                self.rounds_until_pending(i, poller, fd, &mut ready_cx)
            };
            ran |= rounds > 0;
            match end {
                LookEnd::Pending => {
                    poller.lease_at(*now.get_or_insert_with(std::time::Instant::now), LEASE);
                    if !self.leased.load(Ordering::Relaxed) {
                        self.leased.store(true, Ordering::Release);
                    }
                    waits = true;
                }
                // The queue's thread stops or died: nothing runs its rounds here. The
                // task looks again soon.
                LookEnd::NotRun => cx.waker().wake_by_ref(),
                LookEnd::Failed(e) => {
                    debug!(error = %e, "the runtime's registration of the AF_XDP sockets failed; back to the channel threads");
                    self.off.store(true, Ordering::Relaxed);
                    return ran;
                }
                LookEnd::RoundsSpent => {}
            }
        }
        if waits {
            // On top if listed already: the most recent waiter is the likeliest to be
            // waiting still.
            self.waiters.lists[usize::from(latency_class)].push(cx.waker(), true);
        }
        ran
    }

    /// A task about to look for its bytes (`latency`, `latency_class` as for
    /// [`RuntimeQueues::poll`]): runs the rounds of the queues it would wait on that are
    /// readable now, and nothing more: no lease and no listing among the waiters; only
    /// descriptors a runtime registered already are looked at, and each is left pending
    /// (its [`QueueReady`] registered) as after any wait. Returns whether it ran a round;
    /// the caller then pulls before its look.
    ///
    /// A task woken for an arrival that waits in a queue's ring otherwise looked, pulled
    /// and looked again, found nothing each time, registered as a waiter and only then
    /// ran the round and looked a third time: about 2 k instructions of a 64-byte read's
    /// 15 k (`docs/performance.md`, twelfth session).
    pub(crate) fn run_ready(&self, latency: bool, latency_class: bool) -> bool {
        if !RuntimeRx::applies(self.mode.load(Ordering::Relaxed), latency) || !self.usable() {
            return false;
        }
        let queues = self.waiters.mask(latency_class);
        let mut ran = false;
        for (i, (poller, ready)) in self.pollers.iter().zip(&self.ready).enumerate() {
            if !in_mask(queues, i) || poller.is_dead() {
                continue;
            }
            let Some(Some(reg)) = self.fds[i].get() else {
                continue;
            };
            // Pending since its last look, and no event since: nothing to run.
            if self.armed(i) {
                continue;
            }
            let mut ready_cx = Context::from_waker(ready);
            // Until the descriptor says pending, as a wait does: stopping after the round
            // left the queue with no waker when this task then found its bytes and did
            // not wait, and the next arrival woke nobody until the lease's end
            // (`queue_arrivals_wake_a_task_that_still_waits`, about one run in ten). A
            // queue left readable (`NotRun`) or a failed registration is the wait's to
            // handle, if the task waits.
            let (rounds, _) = self.rounds_until_pending(i, poller, &reg.fd, &mut ready_cx);
            if rounds > 0 {
                self.rounds_first.fetch_add(rounds, Ordering::Relaxed);
                ran = true;
            }
        }
        if ran && self.waiters.picked.load(Ordering::Relaxed) {
            // It looked at the descriptors since it was picked (see `leave`).
            self.waiters.picked.store(false, Ordering::Relaxed);
        }
        ran
    }

    /// Runs or asks for the rounds of queue `poller` while its descriptor `fd` is
    /// readable, at most [`ROUNDS_PER_WAIT`]: returns the rounds run here and why it
    /// stopped. Only a pending poll leaves [`QueueReady`] (`ready_cx`) registered with
    /// the reactor, which takes the waker with each event.
    fn rounds_until_pending(
        &self,
        i: usize,
        poller: &RxPoller,
        fd: &AsyncFd<OwnedFd>,
        ready_cx: &mut Context<'_>,
    ) -> (u64, LookEnd) {
        let mut rounds = 0;
        for _ in 0..ROUNDS_PER_WAIT {
            match self.poll_descriptor(i, fd, ready_cx) {
                Poll::Ready(Ok(ready)) => match self.round_or_ask(poller, ready) {
                    RxRound::Ran => rounds += 1,
                    RxRound::Asked => {}
                    RxRound::NotRun => return (rounds, LookEnd::NotRun),
                },
                Poll::Ready(Err(e)) => return (rounds, LookEnd::Failed(e)),
                Poll::Pending => return (rounds, LookEnd::Pending),
            }
        }
        (rounds, LookEnd::RoundsSpent)
    }

    /// Whether queue `i`'s descriptor is pending with its [`QueueReady`] registered and
    /// no event came since ([`QueueReady::armed`]): a poll would find the same.
    fn armed(&self, i: usize) -> bool {
        self.ready_state[i].armed.load(Ordering::Acquire)
    }

    /// Polls queue `i`'s descriptor with its [`QueueReady`] (`ready_cx`), keeping
    /// [`QueueReady::armed`]: set before the poll, so that an event during the poll
    /// (which wakes the waker the poll registered, and clears the flag) is never
    /// overwritten; cleared when the poll finds the descriptor readable, since the
    /// reactor then holds no waker for it.
    fn poll_descriptor<'a>(
        &self,
        i: usize,
        fd: &'a AsyncFd<OwnedFd>,
        ready_cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<tokio::io::unix::AsyncFdReadyGuard<'a, OwnedFd>>> {
        let armed = &self.ready_state[i].armed;
        armed.store(true, Ordering::SeqCst);
        let p = fd.poll_read_ready(ready_cx);
        if p.is_ready() {
            armed.store(false, Ordering::Release);
        }
        p
    }

    /// A readable queue's round, run here or asked of the thread that holds it, with the
    /// descriptor's readiness settled to match and the counters kept:
    /// - `Ran`: cleared after the round (tokio ignores the clear if an event came during
    ///   it, so frames that arrived meanwhile leave the descriptor ready);
    /// - `Asked`: the channel thread or another task runs the round and was asked for one
    ///   more before it lets go; that round takes the frames, and the channels' hand-off
    ///   wakes a reader for them. Cleared, so that the next look registers for the next
    ///   arrival. Trying again at once instead (a self-wake) spun on the round: with the
    ///   holder preempted on the same core, for the rest of a scheduler slice (the
    ///   isolation bench's 1-5 ms samples with the applications pinned,
    ///   `docs/performance.md`, eleventh session). Clearing without the ask lost frames
    ///   the holder's round had passed already (the ping-pong's rare 1-8 ms samples);
    /// - `NotRun` (the queue's thread stops or died): kept; the caller arranges another
    ///   look.
    fn round_or_ask(
        &self,
        poller: &RxPoller,
        mut ready: tokio::io::unix::AsyncFdReadyGuard<'_, OwnedFd>,
    ) -> RxRound {
        let round = poller.poll_now_or_ask();
        match round {
            RxRound::Ran => {
                ready.clear_ready();
                self.rounds.fetch_add(1, Ordering::Relaxed);
            }
            RxRound::Asked => {
                ready.clear_ready();
                self.asked.fetch_add(1, Ordering::Relaxed);
            }
            RxRound::NotRun => ready.retain_ready(),
        }
        round
    }

    /// A task whose read returned bytes no longer waits: it leaves the waiters. If it was
    /// picked for a queue's arrivals and has not looked at the descriptors since, it runs
    /// the rounds of the queues ready now, so that the tasks still waiting are served
    /// (unless its socket, of class `latency`, no longer receives in the runtime: then the
    /// channel threads do, their leases ended); of the queues its class serves
    /// (`latency_class`, see [`Waiters`]).
    pub(crate) fn leave(&self, w: &Waker, latency: bool, latency_class: bool) {
        if self.waiters.lists[usize::from(latency_class)].remove(w)
            || !self.waiters.picked.swap(false, Ordering::AcqRel)
        {
            return;
        }
        // Switched off, or the load turned busy, since it was picked: the channel threads
        // serve the queues.
        if !RuntimeRx::applies(self.mode.load(Ordering::Relaxed), latency) {
            return;
        }
        if !self.usable() {
            return;
        }
        let queues = self.waiters.mask(latency_class);
        for (i, (poller, queue_ready)) in self.pollers.iter().zip(&self.ready).enumerate() {
            if poller.is_dead() || !in_mask(queues, i) {
                continue;
            }
            let Some(fd) = self.fd(i) else {
                return;
            };
            if self.armed(i) {
                continue;
            }
            let mut ready_cx = Context::from_waker(queue_ready);
            if let Poll::Ready(Ok(ready)) = self.poll_descriptor(i, fd, &mut ready_cx) {
                // Nothing runs the queue's rounds here: a waiter (or, with none, the
                // channel thread) looks again.
                if self.round_or_ask(poller, ready) == RxRound::NotRun {
                    queue_ready.wake_by_ref();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A waker that counts its wake-ups.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counted() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    fn waiters(queues: usize, latency_queues: u64) -> Waiters {
        Waiters {
            lists: [WakerList::new(MAX_WAITERS), WakerList::new(MAX_WAITERS)],
            picked: AtomicBool::new(false),
            latency_queues: AtomicU64::new(latency_queues),
            queues,
        }
    }

    #[test]
    fn without_a_class_split_every_task_serves_every_queue() {
        let w = waiters(2, 0);
        assert_eq!(w.mask(true), ALL_QUEUES);
        assert_eq!(w.mask(false), ALL_QUEUES);
        // A bulk task waited last; there is no latency task: it is picked for either queue.
        let (bulk, bw) = counted();
        w.lists[0].push(&bw, true);
        assert!(w.pick(1).is_some_and(|x| x.will_wake(&bw)));
        assert!(w.pick(0).is_none(), "the list is empty once picked");
        drop(bulk);
    }

    #[test]
    fn with_classes_on_queues_of_their_own_each_class_serves_its_queues() {
        // Queue 1 carries the latency channels, queue 0 the throughput ones.
        let w = waiters(2, 0b10);
        assert_eq!(w.mask(true), 0b10);
        assert_eq!(w.mask(false) & 0b11, 0b01);
        assert!(in_mask(w.mask(true), 1) && !in_mask(w.mask(true), 0));
        assert!(in_mask(w.mask(false), 0) && !in_mask(w.mask(false), 1));
        let (_lat, lw) = counted();
        let (_bulk, bw) = counted();
        // The latency task waited first, a bulk task last: an arrival on the latency
        // queue still wakes the latency task (the bulk task would not look there, and the
        // arrival would wait for the lease's end), and one on the throughput queue the
        // bulk task.
        w.lists[1].push(&lw, true);
        w.lists[0].push(&bw, true);
        assert!(w.pick(1).is_some_and(|x| x.will_wake(&lw)));
        assert!(
            w.pick(1).is_none(),
            "no bulk task is woken for the latency queue"
        );
        assert!(w.pick(0).is_some_and(|x| x.will_wake(&bw)));
        w.lists[1].push(&lw, true);
        assert!(
            w.pick(0).is_none(),
            "no latency task is woken for the throughput queue"
        );
    }

    #[test]
    fn a_class_without_a_queue_of_its_own_serves_every_queue() {
        // Every queue carries latency channels (one queue, or the throughput channels
        // lost): throughput tasks serve them all rather than none.
        let w = waiters(2, 0b11);
        assert_eq!(w.mask(true), 0b11);
        assert_eq!(w.mask(false), ALL_QUEUES);
        let (_bulk, bw) = counted();
        w.lists[0].push(&bw, true);
        assert!(w.pick(0).is_some_and(|x| x.will_wake(&bw)));
    }
}
