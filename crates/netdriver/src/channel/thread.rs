//! Channel threads and the queue states they drive: a queue's state (its interface and
//! every connection on it) is behind a mutex, and a thread serves any number of queues,
//! running each one's rounds and sleeping on all their descriptors at once. Queues move
//! between threads whole ([`QueueSlot`], through a thread's inbox). See the [module
//! documentation](super) for the loop.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use bytes::BytesMut;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use rustc_hash::FxHashMap;
use tracing::{debug, trace, warn};

use super::directory::{Owner, Tuple};
use super::queue::{ChannelShared, Failure, ThreadSignal, WireSeq};
use super::set::{ListenerShared, SetShared};
use super::{Channel, ChannelError};
use crate::link::xdp::XdpLink;
use crate::netif::{ConnHandle, Interface, StraySegment, StrayVerdict};
use crate::tcp::TcpError;
use crate::time::{Clock, Duration, Instant};
use crate::wire::EthernetAddress;

/// Largest chunk cut from a connection's receive buffer at once.
const RX_CHUNK: usize = 64 * 1024;
/// Most commands handled per round, so a flood of them cannot starve the data path.
const COMMANDS_PER_ROUND: usize = 64;
/// Most forwarded frames handled per round.
const FORWARDED_PER_ROUND: usize = 256;
/// While the queue was active within [`ACTIVE_WINDOW`], the thread sleeps at most this
/// long, so that a timer armed by an inline round (a retransmission timeout, a delayed
/// ACK) fires at most this late without a wake-up per message; a timer due sooner than
/// the thread's planned wake-up gets a kick instead.
const ACTIVE_TICK: Duration = Duration::from_millis(10);
/// See [`ACTIVE_TICK`].
const ACTIVE_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);
/// Most rounds an inline caller runs before leaving the rest to the thread.
const INLINE_ROUNDS: usize = 4;

/// Work for a channel thread from the application side.
#[derive(Debug)]
pub(crate) enum Command {
    /// Open the channel's connection (port and flow directory entry already claimed).
    Connect {
        shared: Arc<ChannelShared>,
        mac: EthernetAddress,
    },
    /// Listen on `port`; the result goes to `done`.
    Listen {
        port: u16,
        backlog: usize,
        listener: Arc<ListenerShared>,
        done: Sender<Result<(), ChannelError>>,
    },
    /// Stop listening on `port` (connections not yet accepted are aborted).
    Unlisten { port: u16 },
    /// Fault injection: install (or remove) a rule dropping received data segments.
    DropReceived(Option<crate::netif::RxDrop>),
}

/// One channel's thread-side state.
#[derive(Debug)]
struct Entry {
    shared: Arc<ChannelShared>,
    /// The rest of a chunk that TCP's send buffer had no room for.
    partial: Option<bytes::Bytes>,
    fin_queued: bool,
    aborted: bool,
    eof: bool,
    /// The connection's statistics mark when they were last published (`publish` skips
    /// a connection whose mark has not moved).
    published: Option<crate::tcp::connection::StatsMark>,
}

/// A flow this thread must release from the directory (and, for an outgoing channel, its
/// port and steering entry) when the interface forgets the connection.
#[derive(Debug, Clone, Copy)]
struct Owned {
    tuple: Tuple,
    active_port: Option<u16>,
}

/// Everything a channel thread owns.
pub(crate) struct Worker {
    pub(crate) index: usize,
    pub(crate) queue: u32,
    pub(crate) iface: Interface<XdpLink>,
    pub(crate) clock: Clock,
    pub(crate) signal: Arc<ThreadSignal>,
    pub(crate) commands: Receiver<Command>,
    pub(crate) forwarded: Receiver<Vec<u8>>,
    pub(crate) set: Arc<SetShared>,
    /// The interface's index, for neighbour lookups.
    pub(crate) ifindex: u32,
    /// The kernel's neighbour table, opened when the queue is set up (by
    /// `ChannelSet::start`, in the interface's namespace, so that threads added later in
    /// any namespace can serve the queue); `None` if that failed (accepted peers then go
    /// unverified).
    pub(crate) neigh: Option<crate::neigh::KernelNeighbors>,
}

/// What a killed channel thread leaves behind (fault injection), per queue: its state, with
/// the interface, the AF_XDP socket and every connection in it, kept as it was, so that
/// the socket stays open and bound (arrivals for its flows are redirected to it and
/// dropped unread, as with a crashed thread, rather than passed to the kernel, which
/// would answer them with resets). The set keeps it in its graveyard and drops it when it
/// stops.
pub(crate) struct DeadQueue {
    /// Held only to keep the socket and connections as they were.
    _state: Arc<Mutex<QueueState>>,
}

impl std::fmt::Debug for DeadQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadQueue").finish_non_exhaustive()
    }
}

/// Mutable bookkeeping of the loop, apart from the interface so both can be borrowed.
#[derive(Debug, Default)]
struct Book {
    // Keys this host assigns: FxHash (see Cargo.toml).
    entries: FxHashMap<ConnHandle, Entry>,
    owned: FxHashMap<ConnHandle, Owned>,
    listeners: FxHashMap<u16, Arc<ListenerShared>>,
    /// Flows claimed in the directory for a SYN during this round's receive.
    claims: Vec<Tuple>,
}

/// A queue's state: the thread runs its rounds under this lock and sleeps without it, so
/// that an application thread that enqueues a small chunk can run a round itself when
/// the thread is not at it (inline transmit, [`run_inline_marked`]): the chunk leaves on the
/// wire from the enqueuing thread, without a wake-up of the channel thread.
pub(crate) struct QueueState {
    worker: Worker,
    book: Book,
    rxbuf: BytesMut,
}

impl QueueState {
    /// One round of the loop described in the [module documentation](super); returns
    /// whether anything happened (the caller runs another round before sleeping).
    fn round(&mut self, now: Instant) -> bool {
        self.round_marked(now, true)
    }

    /// [`round`](Self::round); `mark_end`: record its end for the inline-transmit quiet
    /// rule (a receive round run by a reading task does not: the reply that usually
    /// follows must not find the queue busy, and the clock read is saved).
    fn round_marked(&mut self, now: Instant, mark_end: bool) -> bool {
        let (w, book) = (&mut self.worker, &mut self.book);
        let mut active = false;
        if w.signal.take_control() {
            active |= w.handle_commands(book, now);
            active |= w.handle_forwarded(book, now);
            if !w.commands.is_empty() || !w.forwarded.is_empty() {
                // A round's budget left some.
                w.signal.mark_control();
            }
        }
        active |= w.push_tx(book, now);
        let (set, me) = (&w.set, w.index);
        let claims = &mut book.claims;
        active |= w
            .iface
            .poll_with(now, &mut |s| stray_verdict(set, me, claims, s, true));
        w.settle_claims(book);
        active |= w.pull_rx(book, &mut self.rxbuf);
        active |= w.accept(book);
        active |= w.reap(book);
        w.publish(book, now);
        if mark_end {
            w.signal.round_ended_at(&w.clock, now);
        }
        active
    }

    /// Whether a round right now would find nothing to do, arrivals on the link apart
    /// (the kernel announces those through the socket's readiness): no command or
    /// forwarded frame waits, no claim is open, every channel's application side is idle
    /// and its close or abort handled, and the interface is settled
    /// ([`Interface::settled`]). Conservative: it may say no when a round would idle.
    /// `Some` carries, when it is settled, the interface's next timer
    /// ([`Interface::settled_until`]).
    fn settled_until(&self, now: Instant) -> Option<Option<Instant>> {
        let w = &self.worker;
        let quiet = !w.signal.control_pending()
            && self.book.claims.is_empty()
            && self.book.entries.values().all(|e| {
                e.aborted
                    || (e.partial.is_none()
                        && e.shared.tx_idle()
                        && !e.shared.abort_requested()
                        && (e.fin_queued || !e.shared.close_requested()))
            });
        if quiet {
            w.iface.settled_until(now)
        } else {
            None
        }
    }
}

fn lock_state(state: &Mutex<QueueState>) -> MutexGuard<'_, QueueState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs rounds of the queue behind `signal` from the calling thread, if its channel
/// thread is not running one (never waits for the lock). Returns false when it ran
/// nothing (the caller then wakes the thread as usual). After the rounds, the thread is
/// told there was work (it looks again before it sleeps) and kicked if a timer is now
/// due before its planned wake-up. `mark_end`: whether its rounds count as rounds for
/// the quiet rule (see [`QueueState::round_marked`]).
pub(crate) fn run_inline_marked(signal: &ThreadSignal, mark_end: bool) -> bool {
    !matches!(run_inline_as(signal, mark_end, false), InlineSend::No)
}

/// What [`send_inline`] did with a chunk just queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InlineSend {
    /// The caller ran the queue's rounds.
    Ran,
    /// Another thread (an application's, or the channel thread) runs the queue's round
    /// now and was asked for one more before it lets go ([`ThreadSignal::ask_for_round`]).
    Handed,
    /// Nothing happened: the caller wakes the channel thread.
    No,
}

/// [`run_inline_marked`] for a chunk just queued: when another application thread holds the
/// queue's round (two tasks of a runtime sending on one queue), the chunk is left to it
/// rather than to the channel thread, which the caller would otherwise wake. Measured on
/// the 2-core bed, 8 connections over 4 channels: those wake-ups were ~0.2 per request,
/// each preempting an application thread, and the woken thread then blocked on the lock
/// the holder still had.
pub(crate) fn send_inline(signal: &ThreadSignal) -> InlineSend {
    run_inline_as(signal, true, true)
}

/// Passes an inline holder runs for others who asked ([`ThreadSignal::ask_for_round`])
/// before it wakes the channel thread for them instead: a task is not to be kept sending
/// other tasks' chunks indefinitely.
const ASKED_PASSES: usize = 4;

fn try_lock_state(state: &Mutex<QueueState>) -> Option<MutexGuard<'_, QueueState>> {
    match state.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Takes the queue's round or, when another thread holds it, asks that thread for one
/// more ([`ThreadSignal::ask_for_round`]); `None`: asked.
fn lock_or_ask<'a>(
    state: &'a Mutex<QueueState>,
    signal: &ThreadSignal,
) -> Option<MutexGuard<'a, QueueState>> {
    if let Some(g) = try_lock_state(state) {
        return Some(g);
    }
    signal.ask_for_round();
    // The holder may have let go before the ask was visible to it: then the round is
    // free now and runs here.
    try_lock_state(state)
}

pub(crate) fn run_inline_as(signal: &ThreadSignal, mark_end: bool, hand: bool) -> InlineSend {
    // A dead thread's queue stays dead: running its rounds here would keep its
    // connections alive from application threads and hide the death.
    if signal.stop_requested() || signal.is_dead() {
        return InlineSend::No;
    }
    let Some(state) = signal.inline_state() else {
        return InlineSend::No;
    };
    let first = if hand {
        lock_or_ask(&state, signal)
    } else {
        try_lock_state(&state)
    };
    let Some(mut g) = first else {
        return if hand {
            InlineSend::Handed
        } else {
            InlineSend::No
        };
    };
    let mut passes = 0;
    loop {
        let mut settled = false;
        let mut next_known = None;
        let mut rounds = 0;
        let mut last_now = Instant::ZERO;
        for _ in 0..INLINE_ROUNDS {
            let now = g.worker.clock.now();
            last_now = now;
            rounds += 1;
            // A round that did something is usually followed by one that finds nothing;
            // when nothing is left for it (`settled`), that round is skipped: in a
            // ping-pong it was half the rounds run inline.
            if !g.round_marked(now, mark_end) {
                settled = true;
                break;
            }
            if let Some(next) = g.settled_until(now) {
                settled = true;
                next_known = Some(next);
                break;
            }
        }
        signal.count_inline_rounds(rounds);
        let next = next_known.unwrap_or_else(|| g.worker.iface.poll_at());
        signal.set_inline_timer(next);
        drop(g);
        // Somebody found the round held while it ran here and asked for one more.
        let asked = signal.take_round_wanted();
        passes += 1;
        let mut handed = false;
        if asked && passes <= ASKED_PASSES {
            match lock_or_ask(&state, signal) {
                Some(again) => {
                    g = again;
                    continue;
                }
                // The round's new holder was asked in turn.
                None => handed = true,
            }
        }
        if settled && (!asked || handed) {
            signal.after_inline(next, last_now);
        } else {
            // Work is left (the rounds did not settle, or asks went past the passes'
            // bound): the channel thread takes it.
            signal.notify();
        }
        return InlineSend::Ran;
    }
}

/// What the stray-segment hook decides, given the directory.
fn stray_verdict(
    set: &SetShared,
    me: usize,
    claims: &mut Vec<Tuple>,
    s: &StraySegment<'_>,
    from_link: bool,
) -> StrayVerdict {
    let tuple = (s.local, s.remote);
    // A SYN cookie's ACK may open a connection just as a SYN does: claim it the same way
    // (settle_claims releases the claim if the cookie does not verify).
    let may_open = s.syn_to_listener || s.cookie_ack;
    let owner = if may_open {
        set.directory.claim(tuple, me)
    } else {
        set.directory.owner(&tuple, me)
    };
    match owner {
        Owner::Me => {
            if may_open {
                claims.push(tuple);
            }
            StrayVerdict::Local
        }
        Owner::Nobody => StrayVerdict::Local,
        // A frame that was forwarded once is never forwarded again.
        Owner::Other(_) if !from_link => StrayVerdict::Drop,
        Owner::Other(o) => set.forward(o, s.frame),
    }
}

/// One queue as a channel thread holds it: its state, its signal and a duplicate of its
/// AF_XDP descriptor to sleep on while the state is unlocked. It is handed from thread to
/// thread whole ([`ChannelSet::move_queue`](super::ChannelSet::move_queue)), so the
/// connections, their rings and their buffers never exist twice or change hands piecewise.
pub(crate) struct QueueSlot {
    /// The queue's index in the set (`SetShared::peers`).
    index: usize,
    queue: u32,
    signal: Arc<ThreadSignal>,
    state: Arc<Mutex<QueueState>>,
    /// A duplicate of the socket (it shares the open socket; poll(2) sees the same
    /// readiness).
    fd: OwnedFd,
}

impl std::fmt::Debug for QueueSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueSlot")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl QueueSlot {
    /// The NIC queue.
    pub(crate) fn queue(&self) -> u32 {
        self.queue
    }

    /// Sets a queue up around its worker; makes its state reachable for inline rounds.
    pub(crate) fn new(worker: Worker) -> std::io::Result<QueueSlot> {
        let fd = worker.iface.link().as_fd().try_clone_to_owned()?;
        let (index, queue, signal) = (worker.index, worker.queue, worker.signal.clone());
        let state = Arc::new(Mutex::new(QueueState {
            worker,
            book: Book::default(),
            rxbuf: BytesMut::new(),
        }));
        signal.set_inline_state(Arc::downgrade(&state));
        Ok(QueueSlot {
            index,
            queue,
            signal,
            state,
            fd,
        })
    }

    /// The queue dies as with a crashed thread (fault injection; see [`Worker::die`]): its
    /// state goes to the set's graveyard, kept until the set stops.
    fn bury(self) {
        let mut g = lock_state(&self.state);
        let QueueState { worker, book, .. } = &mut *g;
        worker.die(book);
        let set = worker.set.clone();
        drop(g);
        self.signal.set_dead();
        warn!(
            queue = self.queue,
            "channel thread killed (fault injection); its connections are left unserved"
        );
        set.graveyard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(DeadQueue { _state: self.state });
    }

    /// The set stops: every connection is aborted (see [`Worker::stop`]).
    fn stop(self) {
        if self.signal.is_dead() {
            return self.bury();
        }
        let mut g = lock_state(&self.state);
        let QueueState { worker, book, .. } = &mut *g;
        worker.stop(book);
        debug!(queue = self.queue, "queue stopped");
    }

    /// A queue that cannot reach a thread any more (handed to one that ended): stopped if
    /// the set is stopping, else lost as with a crash, never left unserved but alive.
    fn orphaned(self, set: &SetShared) {
        if set.stopped.load(Ordering::Acquire) {
            self.stop();
        } else {
            warn!(
                queue = self.queue,
                "a queue was handed to a thread that had ended"
            );
            self.signal.request_kill();
            self.bury();
        }
    }
}

/// An order for a channel thread from the set ([`ThreadControl::release`]) or from
/// another thread (a queue handed over).
enum Order {
    /// Serve this queue from now on.
    Adopt(QueueSlot),
    /// Hand queue `index` to `to`: now if this thread holds it, else as soon as it arrives
    /// (it may still be on its way here from an earlier move).
    Release {
        index: usize,
        to: Arc<ThreadControl>,
    },
}

#[derive(Default)]
struct Inbox {
    orders: Vec<Order>,
    /// The thread ended: nothing it is sent is ever taken.
    exited: bool,
}

/// What the set and the other threads share with one channel thread: its wake-up
/// eventfd, its orders, its core and its busy time.
pub(crate) struct ThreadControl {
    pub(crate) id: u32,
    /// The thread's own wake-up (orders, pins, stop and kill); each of its queues has its
    /// own signal besides, which the thread also sleeps on.
    pub(crate) signal: ThreadSignal,
    inbox: Mutex<Inbox>,
    /// The thread is to end once it has handed every queue on (`ChannelSet::remove_thread`).
    retire: std::sync::atomic::AtomicBool,
    /// The core the thread is to run on (`usize::MAX`: unpinned); it moves itself.
    pub(crate) core: std::sync::atomic::AtomicUsize,
    /// Nanoseconds spent in rounds, over all its queues.
    pub(crate) busy_ns: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for ThreadControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadControl")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ThreadControl {
    pub(crate) fn new(id: u32, core: Option<usize>) -> std::io::Result<ThreadControl> {
        Ok(ThreadControl {
            id,
            signal: ThreadSignal::new()?,
            inbox: Mutex::new(Inbox::default()),
            retire: std::sync::atomic::AtomicBool::new(false),
            core: std::sync::atomic::AtomicUsize::new(core.unwrap_or(usize::MAX)),
            busy_ns: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, order: Order) -> Result<(), Order> {
        let mut inbox = self.inbox();
        if inbox.exited {
            return Err(order);
        }
        inbox.orders.push(order);
        drop(inbox);
        self.signal.notify();
        Ok(())
    }

    /// Gives the thread a queue to serve; the queue back if the thread has ended.
    fn deliver(&self, slot: QueueSlot) -> Result<(), QueueSlot> {
        let mut inbox = self.inbox();
        if inbox.exited {
            return Err(slot);
        }
        inbox.orders.push(Order::Adopt(slot));
        drop(inbox);
        self.signal.notify();
        Ok(())
    }

    /// Asks the thread to hand queue `index` to `to`; false if the thread has ended.
    pub(crate) fn release(&self, index: usize, to: Arc<ThreadControl>) -> bool {
        self.send(Order::Release { index, to }).is_ok()
    }

    /// Asks the thread to end once it has handed on every queue it holds or was asked to
    /// hand on.
    pub(crate) fn request_retire(&self) {
        self.retire.store(true, Ordering::Release);
        self.signal.notify();
    }
}

/// A queue the thread serves, with what its last round left.
struct Held {
    slot: QueueSlot,
    /// Its interface's next timer, as its last round here left it (an inline round that
    /// arms an earlier one kicks the thread, see `ThreadSignal::after_inline`).
    deadline: Option<Instant>,
    /// Its round is due at the next pass: it just arrived, its descriptors were readable,
    /// or the thread woke for a reason that may concern it (a timeout, a spin that ended).
    ready: bool,
    /// Its last round did something: the next pass runs one again, as a lone queue's
    /// thread would before sleeping.
    active: bool,
    /// The queue's count of inline rounds when this thread last ran its round or looked
    /// at the queue under a lease: a runtime that ran rounds since serves the queue, and
    /// frames on its ring are that runtime's to take (see `idle`).
    inline_seen: u64,
}

impl Held {
    fn new(slot: QueueSlot) -> Held {
        Held {
            slot,
            deadline: None,
            ready: true,
            active: false,
            inline_seen: 0,
        }
    }
}

/// How a channel thread starts: see [`run_thread`].
pub(crate) struct ThreadStart {
    pub(crate) ctl: Arc<ThreadControl>,
    pub(crate) set: Arc<SetShared>,
    pub(crate) clock: Clock,
    pub(crate) busy_poll: Duration,
    /// The queues it serves from the start (the set's first threads: one each).
    pub(crate) slots: Vec<QueueSlot>,
    /// Told once the thread runs (named and pinned), so that the set hands it work only
    /// then.
    pub(crate) started: Option<std::sync::mpsc::SyncSender<()>>,
}

/// A channel thread's body: serves its queues (and those it is given) until the set stops,
/// it is retired (its queues handed on), or killed (fault injection: its queues die, see
/// [`QueueSlot::bury`]).
pub(crate) fn run_thread(start: ThreadStart) {
    let ThreadStart {
        ctl,
        set,
        clock,
        busy_poll,
        slots,
        started,
    } = start;
    let id = ctl.id;
    let mut pinned = usize::MAX;
    repin(&ctl, &mut pinned);
    super::queue::mark_channel_thread();
    debug!(thread = id, "channel thread up");
    if let Some(started) = started {
        let _ = started.send(());
    }
    let mut held: Vec<Held> = slots.into_iter().map(Held::new).collect();
    // Queues to hand on as soon as they arrive here.
    let mut forwards: HashMap<usize, Arc<ThreadControl>> = HashMap::new();
    let mut last_active = std::time::Instant::now();
    let mut slack = crate::time::TimerSlack::new();
    loop {
        if set.stopped.load(Ordering::Acquire) {
            break;
        }
        if ctl.signal.kill_requested() {
            // A crash takes every queue of the thread with it.
            for h in held.drain(..) {
                h.slot.signal.request_kill();
                h.slot.bury();
            }
            let orders = {
                let mut inbox = ctl.inbox();
                inbox.exited = true;
                std::mem::take(&mut inbox.orders)
            };
            for o in orders {
                if let Order::Adopt(slot) = o {
                    slot.orphaned(&set);
                }
            }
            ctl.signal.set_dead();
            return;
        }
        let orders = std::mem::take(&mut ctl.inbox().orders);
        let mut moved = !orders.is_empty();
        for order in orders {
            match order {
                Order::Adopt(slot) => match forwards.remove(&slot.index) {
                    Some(to) => hand_over(&set, slot, &to),
                    None => {
                        debug!(thread = id, queue = slot.queue, "queue adopted");
                        held.push(Held::new(slot));
                    }
                },
                Order::Release { index, to } => {
                    match held.iter().position(|h| h.slot.index == index) {
                        Some(i) => hand_over(&set, held.swap_remove(i).slot, &to),
                        None => {
                            forwards.insert(index, to);
                        }
                    }
                }
            }
        }
        if ctl.retire.load(Ordering::Acquire) && held.is_empty() && forwards.is_empty() {
            let mut inbox = ctl.inbox();
            if inbox.orders.is_empty() {
                inbox.exited = true;
                debug!(thread = id, "channel thread retired");
                return;
            }
            continue;
        }
        ctl.signal.take_pending();
        repin(&ctl, &mut pinned);
        let started = std::time::Instant::now();
        let now = clock.now();
        let mut active = moved;
        let mut i = 0;
        while i < held.len() {
            let h = &mut held[i];
            // Set by `kill_queue_thread` on a queue that was on its way here when its
            // thread was killed.
            if h.slot.signal.kill_requested() {
                held.swap_remove(i).slot.bury();
                moved = true;
                continue;
            }
            // Only the queues with something to do get a round: a thread serving many
            // queues does not walk every idle one on each wake-up.
            let mut pending = h.slot.signal.take_pending();
            if h.slot.signal.take_inline_ran() && !pending {
                // Under a lease the runtime's rounds serve the queue: the thread only
                // learns the timers they left. Without one the thread runs a round
                // after them, as it always did.
                if h.slot.signal.rx_lease_left().is_some() {
                    h.deadline = h.slot.signal.inline_timer();
                } else {
                    pending = true;
                }
            }
            let due = h.deadline.is_some_and(|d| d <= now);
            if !(h.ready || h.active || pending || due) {
                i += 1;
                continue;
            }
            h.ready = false;
            let round_start = std::time::Instant::now();
            let (queue_active, rx_drop) = {
                let mut g = lock_state(&h.slot.state);
                // This round covers whatever an application thread asked an inline
                // holder for (it set `pending` too, which brought the thread here).
                h.slot.signal.clear_round_wanted();
                let a = g.round(clock.now());
                h.deadline = g.worker.iface.poll_at();
                // No inline round runs while the thread holds the state: this round's
                // word on the timers is the newest, and the inline count is exact.
                h.slot.signal.take_inline_ran();
                h.inline_seen = h.slot.signal.inline_rounds();
                (a, g.worker.iface.rx_drop())
            };
            h.active = queue_active;
            active |= queue_active;
            if let Some(p) = set.peers.get(h.slot.index) {
                // The queue's share of the thread's work, for per-queue utilisation.
                let ns = u64::try_from(round_start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                p.busy_ns.fetch_add(ns, Ordering::Relaxed);
                p.thread_rounds.fetch_add(1, Ordering::Relaxed);
                if let Some(rule) = rx_drop {
                    p.rx_fault_dropped.store(rule.dropped, Ordering::Relaxed);
                }
            }
            i += 1;
        }
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        ctl.busy_ns.fetch_add(ns, Ordering::Relaxed);
        if active || moved {
            last_active = std::time::Instant::now();
            continue;
        }
        idle(
            &ctl,
            &mut held,
            &mut slack,
            clock,
            busy_poll,
            now,
            last_active,
        );
    }
    // The set stops: every queue here, and every queue on its way here, stops.
    for h in held.drain(..) {
        h.slot.stop();
    }
    let orders = {
        let mut inbox = ctl.inbox();
        inbox.exited = true;
        std::mem::take(&mut inbox.orders)
    };
    for o in orders {
        if let Order::Adopt(slot) = o {
            slot.stop();
        }
    }
    debug!(thread = id, "channel thread down");
}

/// Hands `slot` to `to`, waking it; a thread that ended gets none (see
/// [`QueueSlot::orphaned`]).
fn hand_over(set: &SetShared, slot: QueueSlot, to: &ThreadControl) {
    let queue = slot.queue;
    // The new thread runs a round at once: whatever woke the queue meanwhile (its
    // pending flag) is looked at there.
    match to.deliver(slot) {
        Ok(()) => debug!(queue, to = to.id, "queue handed over"),
        Err(slot) => slot.orphaned(set),
    }
}

/// Moves the calling thread to the core its control names, if that changed.
fn repin(ctl: &ThreadControl, pinned: &mut usize) {
    let want = ctl.core.load(Ordering::Acquire);
    if want == usize::MAX || want == *pinned {
        return;
    }
    *pinned = want;
    if core_affinity::set_for_current(core_affinity::CoreId { id: want }) {
        debug!(thread = ctl.id, core = want, "channel thread pinned");
    } else {
        warn!(
            thread = ctl.id,
            core = want,
            "cannot pin the channel thread"
        );
    }
}

impl Worker {
    /// Fault injection: the thread dies as if it had crashed, except that its channels
    /// learn of it (what a supervisor noticing the death would tell them), so that the
    /// local side sees them lost. Nothing goes on the wire: no FIN, no RST; the
    /// connections stay in the interface, their flows steered to the queue's socket,
    /// where arrivals now pile up unread, so the peer learns of the death only by its
    /// own liveness checks (keep-alive, user timeout). Connects and listens queued for
    /// the thread fail.
    fn die(&mut self, book: &mut Book) {
        for e in book.entries.values() {
            e.shared.fail(Failure::ThreadDied);
            e.shared.set_closed();
        }
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::Connect { shared, .. } => {
                    // Its SYN never left: nothing of it is on the wire to keep steered.
                    shared.fail(Failure::ThreadDied);
                    shared.set_closed();
                    let t = (shared.local, shared.peer);
                    self.set
                        .release_flow(self.index, &t, Some(shared.local.port()));
                }
                Command::Listen { done, .. } => {
                    let _ = done.send(Err(ChannelError::ThreadDied));
                }
                Command::Unlisten { .. } | Command::DropReceived(_) => {}
            }
        }
    }

    fn handle_commands(&mut self, book: &mut Book, now: Instant) -> bool {
        let mut any = false;
        for _ in 0..COMMANDS_PER_ROUND {
            let cmd = match self.commands.try_recv() {
                Ok(c) => c,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            };
            any = true;
            match cmd {
                Command::Connect { shared, mac } => self.connect(book, shared, mac, now),
                Command::Listen {
                    port,
                    backlog,
                    listener,
                    done,
                } => {
                    let res = self
                        .iface
                        .listen(port, backlog)
                        .map_err(|_| ChannelError::AddrInUse(port));
                    if res.is_ok() {
                        book.listeners.insert(port, listener);
                    }
                    let _ = done.send(res);
                }
                Command::Unlisten { port } => {
                    self.iface.unlisten(port);
                    book.listeners.remove(&port);
                }
                Command::DropReceived(rule) => self.iface.drop_received(rule),
            }
        }
        any
    }

    fn connect(
        &mut self,
        book: &mut Book,
        shared: Arc<ChannelShared>,
        mac: EthernetAddress,
        now: Instant,
    ) {
        let (local, peer) = (shared.local, shared.peer);
        self.iface.add_neighbor(*peer.ip(), mac);
        match self.iface.connect_from(local.port(), peer, now) {
            Ok(h) => {
                if let Some(conn) = self.iface.conn_mut(h) {
                    conn.set_nodelay(self.set.nodelay);
                }
                trace!(queue = self.queue, %local, %peer, "channel connecting");
                book.owned.insert(
                    h,
                    Owned {
                        tuple: (local, peer),
                        active_port: Some(local.port()),
                    },
                );
                book.entries.insert(h, Entry::new(shared));
            }
            Err(e) => {
                warn!(queue = self.queue, %local, %peer, error = %e, "channel connect failed");
                shared.fail(match e {
                    crate::netif::NetifError::TooManyConnections => Failure::TooManyConnections,
                    _ => Failure::NoFreePort,
                });
                shared.set_closed();
                self.set
                    .release_flow(self.index, &(local, peer), Some(local.port()));
            }
        }
    }

    fn handle_forwarded(&mut self, book: &mut Book, now: Instant) -> bool {
        let mut any = false;
        for _ in 0..FORWARDED_PER_ROUND {
            let Ok(frame) = self.forwarded.try_recv() else {
                break;
            };
            any = true;
            let (set, me) = (&self.set, self.index);
            let claims = &mut book.claims;
            self.iface.receive_frame_with(now, &frame, &mut |s| {
                stray_verdict(set, me, claims, s, false)
            });
            self.set.pool.put(frame);
        }
        any
    }

    /// Applies each channel's pending option changes, then moves chunks from its Tx queue
    /// into its connection.
    fn push_tx(&mut self, book: &mut Book, now: Instant) -> bool {
        let mut any = false;
        for (&h, e) in book.entries.iter_mut() {
            let Some(conn) = self.iface.conn_mut(h) else {
                continue;
            };
            if e.aborted {
                continue;
            }
            if e.shared.abort_requested() {
                conn.abort();
                e.aborted = true;
                e.shared.fail(Failure::Closed);
                while let Some(c) = e.partial.take().or_else(|| e.shared.pop_tx()) {
                    e.shared.tx_taken(c.len());
                }
                any = true;
                continue;
            }
            // Before the data: a send buffer grown by these changes takes this round's
            // chunks already.
            if let Some(changes) = e.shared.take_options() {
                trace!(
                    queue = self.queue,
                    ?changes,
                    "channel: applying option changes"
                );
                conn.apply_options(now, &changes);
                any = true;
            }
            // Read the close request before draining, so a chunk enqueued before close()
            // is never left behind the FIN.
            let closing = e.shared.close_requested();
            let mut moved = false;
            let mut drained = false;
            loop {
                let Some(chunk) = e.partial.take().or_else(|| e.shared.pop_tx()) else {
                    drained = true;
                    break;
                };
                match conn.send(&chunk) {
                    Ok(n) => {
                        e.shared.tx_taken(n);
                        moved = true;
                        if n < chunk.len() {
                            e.partial = Some(chunk.slice(n..));
                            break;
                        }
                    }
                    Err(TcpError::WouldBlock) => {
                        e.partial = Some(chunk);
                        break;
                    }
                    Err(_) => {
                        // The connection cannot send any more: the data is dropped and the
                        // failure (if any) reported by `pull_rx`.
                        e.shared.tx_taken(chunk.len());
                        while let Some(c) = e.shared.pop_tx() {
                            e.shared.tx_taken(c.len());
                        }
                        moved = true;
                        break;
                    }
                }
            }
            if moved {
                e.shared.wake_tx_at_low_water();
                any = true;
            }
            if closing && drained && !e.fin_queued {
                conn.close();
                e.fin_queued = true;
                any = true;
            }
        }
        any
    }

    /// Records the connections opened by SYNs claimed during this round, and releases the
    /// claims of SYNs that opened nothing (backlog full).
    fn settle_claims(&mut self, book: &mut Book) {
        // Every round asks; nearly none has a claim.
        if book.claims.is_empty() {
            return;
        }
        let mut claims = std::mem::take(&mut book.claims);
        for tuple in claims.drain(..) {
            match self.iface.lookup(tuple.0, tuple.1) {
                Some(h) => self.own_passive_in(&mut book.owned, h, tuple),
                None => self.set.directory.remove(&tuple, self.index),
            }
        }
        book.claims = claims;
    }

    /// Records a passively opened connection (once) and claims its endpoint.
    fn own_passive_in(
        &self,
        owned: &mut FxHashMap<ConnHandle, Owned>,
        h: ConnHandle,
        tuple: Tuple,
    ) {
        if owned.contains_key(&h) {
            return;
        }
        if let Err(e) = self.set.claim_endpoint(tuple.0) {
            warn!(local = %tuple.0, error = %e, "claiming an accepted connection's endpoint");
        }
        owned.insert(
            h,
            Owned {
                tuple,
                active_port: None,
            },
        );
    }

    /// Moves received bytes into each channel's Rx queue, up to its limits; notices
    /// establishment, end of stream and failures.
    fn pull_rx(&mut self, book: &mut Book, rxbuf: &mut BytesMut) -> bool {
        let mut any = false;
        for (&h, e) in book.entries.iter_mut() {
            let Some(conn) = self.iface.conn_mut(h) else {
                continue;
            };
            if conn.state().is_synchronized() {
                e.shared.set_open();
            }
            let mut moved = false;
            loop {
                let room = e.shared.rx_room();
                if room == 0 {
                    if e.shared.block_rx() {
                        break;
                    }
                    continue;
                }
                // No more than TCP holds: a short message then takes the rest of the
                // buffer's capacity instead of asking for a whole RX_CHUNK, which
                // allocated a fresh 64 KiB buffer per arrival whenever an earlier piece was
                // still held (8 connections of 64 B requests: page faults on the new
                // buffer, and glibc's madvise with a TLB shootdown when it was freed).
                // At least 1, so that nothing readable still reports end of stream.
                let want = room.min(RX_CHUNK).min(conn.recv_queue().max(1));
                // Appended, not read into a zero-filled slice: zeroing every 64 KiB
                // buffer before the copy cost ~6 % of a bulk receiver's CPU. `reserve`
                // takes the previous allocation back when every piece handed out of it
                // has been dropped (the consumer kept up), else allocates a fresh one.
                debug_assert!(rxbuf.is_empty());
                if rxbuf.capacity() < want {
                    rxbuf.reserve(RX_CHUNK);
                }
                match conn.recv_with(want, |s| rxbuf.extend_from_slice(s)) {
                    Ok(0) => {
                        if !e.eof {
                            e.eof = true;
                            e.shared.finish_rx();
                            any = true;
                        }
                        break;
                    }
                    Ok(n) => {
                        debug_assert_eq!(rxbuf.len(), n);
                        e.shared.push_rx(rxbuf.split().freeze());
                        moved = true;
                    }
                    Err(TcpError::WouldBlock | TcpError::Closed) => break,
                    Err(err) => {
                        e.shared.fail(Failure::from_tcp(err));
                        any = true;
                        break;
                    }
                }
            }
            if moved {
                e.shared.wake_rx_from_round();
                any = true;
            }
        }
        any
    }

    /// Hands connections that completed their handshake to their listeners.
    fn accept(&mut self, book: &mut Book) -> bool {
        // Every round asks; a connection to accept is rare.
        if !self.iface.accept_pending() {
            return false;
        }
        let mut any = false;
        for (&port, l) in &book.listeners {
            while let Some(h) = self.iface.accept(port) {
                any = true;
                let Some(conn) = self.iface.conn_mut(h) else {
                    continue;
                };
                conn.set_nodelay(self.set.nodelay);
                let tuple = (conn.local(), conn.remote());
                self.own_passive_in(&mut book.owned, h, tuple);
                if !self.neighbor_check(h, *tuple.1.ip()) {
                    // Aborted; `reap` releases the flow once the interface forgets it.
                    continue;
                }
                let shared = Arc::new(ChannelShared::new(
                    tuple.0,
                    tuple.1,
                    self.queue,
                    self.set.tx_limits,
                    self.set.rx_limits,
                    self.signal.clone(),
                ));
                self.set.directory.insert(tuple, self.index);
                book.entries.insert(h, Entry::new(shared.clone()));
                trace!(queue = self.queue, local = %tuple.0, peer = %tuple.1, "channel accepted");
                // A full accept queue or a closed listener drops the channel, which aborts
                // it at the next round.
                if l.push(Channel::new(shared)) {
                    l.wake();
                }
            }
        }
        any
    }

    /// Checks the MAC address a passive open learnt from the peer's SYN (or cookie ACK)
    /// against the kernel's neighbour entry for its IP address: a host on the link that
    /// answers from another MAC than the kernel knows for that address is spoofing it,
    /// and its connection is aborted (counted in `SynStats::neighbor_mismatches`). When
    /// the kernel has no usable entry (or the table cannot be read) the connection keeps
    /// the SYN's MAC, counted in `SynStats::neighbor_unverified`. Returns whether the
    /// connection may be handed to its listener.
    fn neighbor_check(&mut self, h: ConnHandle, ip: std::net::Ipv4Addr) -> bool {
        let Some(mac) = self.iface.remote_mac(h) else {
            return true;
        };
        // A match read within the last second is reused; anything else is read anew.
        let recent = |n: &mut crate::neigh::KernelNeighbors| {
            n.entry_confirming(self.ifindex, ip, mac, std::time::Duration::from_secs(1))
        };
        let known = match self.neigh.as_mut().map(recent) {
            Some(Ok(entry)) => entry.and_then(|e| e.usable_mac()),
            Some(Err(e)) => {
                debug!(queue = self.queue, %ip, error = %e, "neighbour lookup failed");
                None
            }
            None => None,
        };
        let counters = self.set.peers.get(self.index).map(|p| &p.syns);
        match known {
            Some(k) if k == mac => true,
            Some(k) => {
                warn!(queue = self.queue, %ip, syn_mac = %mac, kernel_mac = %k, "passive open from a MAC the kernel does not know for this address; aborted");
                if let Some(c) = counters {
                    c.neighbor_mismatches.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(conn) = self.iface.conn_mut(h) {
                    conn.abort();
                }
                false
            }
            None => {
                debug!(queue = self.queue, %ip, %mac, "no kernel neighbour entry; keeping the SYN's MAC");
                if let Some(c) = counters {
                    c.neighbor_unverified.fetch_add(1, Ordering::Relaxed);
                }
                true
            }
        }
    }

    /// Forgets connections the interface removed, releasing their flows and ports.
    fn reap(&mut self, book: &mut Book) -> bool {
        let mut any = false;
        while let Some((h, err)) = self.iface.pop_closed() {
            any = true;
            if let Some(o) = book.owned.remove(&h) {
                // A SYN that ended this flow's TIME-WAIT (RFC 6191) opened the next
                // incarnation of its 4-tuple here before the old one was reaped: the
                // directory entry is the new connection's and stays, or its segments
                // arriving on another queue would find no owner and be reset there.
                let successor = self.iface.lookup(o.tuple.0, o.tuple.1).is_some();
                self.set
                    .release_incarnation(self.index, &o.tuple, o.active_port, successor);
            }
            if err == Some(TcpError::Reset) {
                // Only a RST received from the peer (RFC 5961-checked) fails a connection
                // with `Reset`; local aborts fail it with `Closed`.
                if let Some(p) = self.set.peers.get(self.index) {
                    p.resets_received.fetch_add(1, Ordering::Relaxed);
                }
            }
            if let Some(e) = book.entries.remove(&h) {
                match err {
                    Some(err) => e.shared.fail(Failure::from_tcp(err)),
                    // An orderly removal: both FINs are through and every byte was read.
                    None => e.shared.finish_rx(),
                }
                e.shared.set_closed();
            }
        }
        any
    }

    fn publish(&self, book: &mut Book, now: Instant) {
        let stats = self.iface.stats();
        if let Some(peer) = self.set.peers.get(self.index) {
            let c = &peer.checksums;
            c.partial
                .store(stats.rx_partial_checksum, Ordering::Relaxed);
            c.bad.store(stats.rx_bad_checksum, Ordering::Relaxed);
            let s = &peer.syns;
            s.dropped.store(stats.syn_dropped, Ordering::Relaxed);
            s.cookies_sent
                .store(stats.syn_cookies_sent, Ordering::Relaxed);
            s.cookies_accepted
                .store(stats.syn_cookies_accepted, Ordering::Relaxed);
            s.cookies_rejected
                .store(stats.syn_cookies_rejected, Ordering::Relaxed);
        }
        for (&h, e) in book.entries.iter_mut() {
            if let Some(conn) = self.iface.conn(h) {
                // Most connections of a queue did nothing this round.
                let mark = conn.stats_mark();
                if e.published == Some(mark) {
                    continue;
                }
                e.published = Some(mark);
                let wire = WireSeq {
                    rcv_nxt: conn.rcv_nxt().0,
                    snd_nxt: conn.snd_nxt().0,
                };
                e.shared.publish(&conn.traffic(), wire, now);
            }
        }
    }

    /// Aborts every connection, tells every channel the set is gone, fails pending
    /// commands.
    fn stop(&mut self, book: &mut Book) {
        for e in book.entries.values() {
            e.shared.fail(Failure::ShutDown);
        }
        let handles: Vec<_> = self.iface.handles().collect();
        for h in handles {
            if let Some(conn) = self.iface.conn_mut(h) {
                conn.abort();
            }
        }
        let now = self.clock.now();
        // Sends the resets and forgets the connections.
        self.iface.poll(now);
        self.reap(book);
        for e in book.entries.values() {
            e.shared.set_closed();
        }
        for (_, o) in book.owned.drain() {
            self.set.release_flow(self.index, &o.tuple, o.active_port);
        }
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::Connect { shared, .. } => {
                    shared.fail(Failure::ShutDown);
                    shared.set_closed();
                    let t = (shared.local, shared.peer);
                    self.set
                        .release_flow(self.index, &t, Some(shared.local.port()));
                }
                Command::Listen { done, .. } => {
                    let _ = done.send(Err(ChannelError::ShutDown));
                }
                Command::Unlisten { .. } | Command::DropReceived(_) => {}
            }
        }
        while let Ok(frame) = self.forwarded.try_recv() {
            self.set.pool.put(frame);
        }
    }
}

/// Nothing happened this pass: spin briefly if configured and recently active, else sleep
/// in one poll(2) on the thread's eventfd and, for each of its queues, the AF_XDP socket
/// and the queue's eventfd, until the earliest timer (at most [`ACTIVE_TICK`] while
/// recently active, see there). The queues' states are not locked while sleeping, so that
/// application threads can run rounds inline meanwhile. Marks the queues whose rounds are
/// due on waking ([`Held::ready`]).
fn idle(
    ctl: &ThreadControl,
    held: &mut [Held],
    slack: &mut crate::time::TimerSlack,
    clock: crate::time::Clock,
    busy_poll: Duration,
    now: Instant,
    last_active: std::time::Instant,
) {
    let deadline = held.iter().filter_map(|h| h.deadline).min();
    if deadline.is_some_and(|d| d <= now) {
        return;
    }
    if !busy_poll.is_zero() && last_active.elapsed() < busy_poll {
        while last_active.elapsed() < busy_poll {
            // An inline round holds the lock: it is doing the work, look again after.
            let rx_ready = held.iter().any(|h| {
                h.slot
                    .state
                    .try_lock()
                    .map(|mut g| g.worker.iface.link_mut().rx_ready())
                    .unwrap_or(false)
            });
            let pending = held.iter().any(|h| h.slot.signal.take_pending());
            if rx_ready
                || pending
                || ctl.signal.take_pending()
                || deadline.is_some_and(|d| d <= clock.now())
            {
                // Cheaper to run every round once than to tell which.
                held.iter_mut().for_each(|h| h.ready = true);
                return;
            }
            std::hint::spin_loop();
        }
    }
    let mut planned = if last_active.elapsed() < ACTIVE_WINDOW {
        let tick = now + ACTIVE_TICK;
        Some(deadline.map_or(tick, |d| d.min(tick)))
    } else {
        deadline
    };
    // A runtime watches a queue's socket (`RxPoller`): the thread waits for the lease to
    // end, on the eventfds and timers only, then takes the socket back. The lease's end is
    // part of the planned wake-up, so that a timer the runtime's rounds arm (a delayed
    // ACK) kicks the thread only if it is due before that.
    let mut leased = Vec::with_capacity(held.len());
    for h in held.iter_mut() {
        let lease = h.slot.signal.rx_lease_left();
        if let Some(left) = lease {
            // Frames already on the ring may have made the socket readable before the
            // runtime's task looked, and found this thread in its round then: they raise
            // no new readiness, so they are this thread's to take. But while the runtime
            // runs rounds (inline ones since this thread last looked), frames on the ring
            // are an exchange in flight that its next round takes: taking them here
            // handed a ping-pong's response to the reader through this thread, a
            // cross-thread wake-up that doubled that exchange's time, at about half of
            // the lease-end wake-ups (`docs/performance.md`, fourteenth session).
            let inline = h.slot.signal.inline_rounds();
            let served = inline != h.inline_seen;
            h.inline_seen = inline;
            // A round running inline (the lock held) takes them.
            let waiting = !served
                && try_lock_state(&h.slot.state)
                    .is_some_and(|mut g| g.worker.iface.link_mut().rx_ready());
            if waiting {
                h.ready = true;
                return;
            }
            let end = now + left;
            planned = Some(planned.map_or(end, |p| p.min(end)));
        }
        leased.push(lease.is_some());
    }
    // Every queue's signal learns when the thread wakes (inline rounds kick it only for a
    // timer due before), and that it sleeps; work pending on any keeps it awake.
    for h in held.iter() {
        h.slot.signal.set_planned(planned);
    }
    if !ctl.signal.prepare_sleep() {
        return;
    }
    for (i, h) in held.iter().enumerate() {
        if !h.slot.signal.prepare_sleep() {
            ctl.signal.awake();
            for earlier in &held[..i] {
                earlier.slot.signal.awake();
            }
            return;
        }
    }
    // A wake-up for a protocol timer may come an eighth of its wait late; one for a
    // lease's end or the active tick, a timer tick late, so that on a busy core it comes
    // with that tick rather than with an interrupt of its own.
    if let Some(p) = planned {
        let for_timer = deadline.is_some_and(|d| d <= p);
        slack.set(if for_timer {
            crate::time::timer_slack(p.saturating_duration_since(now))
        } else {
            crate::time::FALLBACK_SLACK
        });
    }
    let timeout = match planned {
        None => PollTimeout::NONE,
        Some(d) => {
            let wait = d.saturating_duration_since(now);
            // Round up: waking early would only spin.
            let ms = wait.as_micros().div_ceil(1000);
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
        }
    };
    // Which queue each descriptor is of (`None`: the thread's own eventfd).
    let mut owner = Vec::with_capacity(1 + 2 * held.len());
    let mut fds = Vec::with_capacity(1 + 2 * held.len());
    fds.push(PollFd::new(ctl.signal.eventfd().as_fd(), PollFlags::POLLIN));
    owner.push(None);
    for (i, (h, &leased)) in held.iter().zip(&leased).enumerate() {
        fds.push(PollFd::new(
            h.slot.signal.eventfd().as_fd(),
            PollFlags::POLLIN,
        ));
        owner.push(Some(i));
        if !leased {
            fds.push(PollFd::new(h.slot.fd.as_fd(), PollFlags::POLLIN));
            owner.push(Some(i));
        }
    }
    let woken: Option<Vec<usize>> = match nix::poll::poll(&mut fds, timeout) {
        Ok(n) if n > 0 => Some(
            fds.iter()
                .zip(&owner)
                .filter(|(fd, _)| fd.revents().is_some_and(|r| !r.is_empty()))
                .filter_map(|(_, &o)| o)
                .collect(),
        ),
        // A timeout is a timer (or the end of a lease, or the active tick): every queue
        // looks.
        Ok(_) => None,
        Err(e) => {
            if e != nix::errno::Errno::EINTR {
                warn!(thread = ctl.id, error = %e, "poll(2) failed");
            }
            None
        }
    };
    drop(fds);
    for h in held.iter() {
        h.slot.signal.count_wakeup();
    }
    match woken {
        Some(queues) => queues.into_iter().for_each(|i| held[i].ready = true),
        // A timeout: every queue looks, except one a runtime still serves under a renewed
        // lease (its rounds are the runtime's): the next pass learns the timers the
        // runtime's rounds left and runs its round only if one is due, and `idle` looks
        // for frames left on its ring.
        None => held
            .iter_mut()
            .for_each(|h| h.ready = h.slot.signal.rx_lease_left().is_none()),
    }
    ctl.signal.awake();
    for h in held.iter() {
        h.slot.signal.awake();
    }
}

impl Entry {
    fn new(shared: Arc<ChannelShared>) -> Entry {
        Entry {
            shared,
            partial: None,
            fin_queued: false,
            aborted: false,
            eof: false,
            published: None,
        }
    }
}

/// Resolves peers' MAC addresses on its own thread (in the set's network namespace), so
/// that a blocking ARP resolution never stalls a channel thread and works from callers
/// in any namespace.
pub(crate) struct ResolveRequest {
    pub(crate) ip: std::net::Ipv4Addr,
    pub(crate) reply: Sender<Result<EthernetAddress, crate::neigh::NeighError>>,
}

/// The resolver thread's body: serves requests until every sender is gone.
pub(crate) fn resolver(ifindex: u32, timeout: Duration, requests: Receiver<ResolveRequest>) {
    let mut table = crate::neigh::KernelNeighbors::open();
    while let Ok(req) = requests.recv() {
        let res = match &mut table {
            Ok(t) => t.resolve(ifindex, req.ip, timeout),
            Err(e) => Err(crate::neigh::NeighError::Netlink {
                op: "opening the neighbour table",
                source: std::io::Error::other(e.to_string()),
            }),
        };
        let _ = req.reply.send(res);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::set::Peer;
    use std::net::{Ipv4Addr, SocketAddrV4};
    use std::sync::atomic::Ordering;

    /// A set of two "threads" whose forwarding queues hold one frame each.
    fn two_threads() -> (SetShared, Vec<Receiver<Vec<u8>>>) {
        let mut peers = Vec::new();
        let mut rxs = Vec::new();
        for q in 0..2 {
            let (ctx, _crx) = crossbeam_channel::unbounded();
            let (ftx, frx) = crossbeam_channel::bounded(1);
            peers.push(Peer {
                queue: q,
                signal: Arc::new(ThreadSignal::new().unwrap()),
                commands: ctx,
                forward: ftx,
                checksums: Default::default(),
                syns: Default::default(),
                resets_received: Default::default(),
                busy_ns: Default::default(),
                thread_rounds: Default::default(),
                rx_fault_dropped: Default::default(),
            });
            rxs.push(frx);
        }
        (SetShared::for_tests(peers), rxs)
    }

    fn seg(port: u16, syn_to_listener: bool, frame: &[u8]) -> StraySegment<'_> {
        StraySegment {
            local: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 9000),
            remote: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), port),
            syn_to_listener,
            cookie_ack: false,
            frame,
        }
    }

    #[test]
    fn unknown_flows_are_handled_locally() {
        let (set, _rx) = two_threads();
        let mut claims = Vec::new();
        let v = stray_verdict(&set, 0, &mut claims, &seg(1, false, b"f"), true);
        assert_eq!(v, StrayVerdict::Local);
        assert!(claims.is_empty());
        assert_eq!(set.directory.len(), 0);
    }

    #[test]
    fn a_first_syn_is_claimed_and_a_repeat_elsewhere_forwarded() {
        let (set, rx) = two_threads();
        let mut claims = Vec::new();
        let s = seg(2, true, b"syn");
        assert_eq!(
            stray_verdict(&set, 0, &mut claims, &s, true),
            StrayVerdict::Local
        );
        assert_eq!(claims, [(s.local, s.remote)]);
        // The retransmitted SYN arrives on thread 1: it goes to thread 0, which is woken.
        let mut other = Vec::new();
        assert_eq!(
            stray_verdict(&set, 1, &mut other, &s, true),
            StrayVerdict::Forwarded
        );
        assert!(other.is_empty());
        assert_eq!(rx[0].try_recv().unwrap(), b"syn");
        assert!(set.peers[0].signal.take_pending());
        assert!(!set.peers[1].signal.take_pending());
    }

    #[test]
    fn a_cookie_ack_is_claimed_like_a_syn() {
        let (set, _rx) = two_threads();
        let mut claims = Vec::new();
        let s = StraySegment {
            cookie_ack: true,
            ..seg(4, false, b"ack")
        };
        assert_eq!(
            stray_verdict(&set, 1, &mut claims, &s, true),
            StrayVerdict::Local
        );
        assert_eq!(claims, [(s.local, s.remote)]);
        assert_eq!(set.directory.owner(&(s.local, s.remote), 1), Owner::Me);
    }

    #[test]
    fn forwarding_is_once_and_bounded() {
        let (set, rx) = two_threads();
        let mut claims = Vec::new();
        let s = seg(3, false, b"data");
        set.directory.insert((s.local, s.remote), 1);
        assert_eq!(
            stray_verdict(&set, 0, &mut claims, &s, true),
            StrayVerdict::Forwarded
        );
        // Thread 1's queue (one frame) is full: the next one is dropped, not reset.
        assert_eq!(
            stray_verdict(&set, 0, &mut claims, &s, true),
            StrayVerdict::Drop
        );
        assert_eq!(set.forwarded.load(Ordering::Relaxed), 1);
        assert_eq!(set.forward_dropped.load(Ordering::Relaxed), 1);
        assert_eq!(rx[1].len(), 1);
        // A frame that was forwarded once and still finds another owner is dropped.
        assert_eq!(
            stray_verdict(&set, 0, &mut claims, &s, false),
            StrayVerdict::Drop
        );
        assert_eq!(rx[1].len(), 1);
    }
}
