//! The state a channel shares between its application handle ([`Channel`]) and the
//! channel thread that drives its connection: two bounded lock-free chunk queues with byte
//! counters, wakers, status flags and a statistics snapshot. Nothing here takes a lock.
//!
//! Orderings: flags that pair a "work is there" store on one side with a "someone sleeps"
//! load on the other (the Rx-queue-full handshake, [`ThreadSignal`]) use `SeqCst` on both
//! sides, so at least one side sees the other (Dekker); everything else is
//! release/acquire or relaxed counters.

use std::net::SocketAddrV4;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Wake, Waker};

use super::lazy_queue::LazyQueue;
use atomic_waker::AtomicWaker;
use bytes::Bytes;
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::thread::QueueState;
use super::{
    ChannelError, ChannelState, ChannelStats, ChannelTransport, ChannelWire, Dequeued, EnqueueError,
};
use crate::tcp::OptionChanges;
use crate::tcp::Traffic;
use crate::time::{Clock, Duration, Instant};

thread_local! {
    /// Set by [`ChannelShared::wake_rx_from_round`] for the length of a receive waker's
    /// call on a channel thread.
    static ON_THREAD_RX: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set once by every channel thread when it starts ([`mark_channel_thread`]).
    static CHANNEL_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as a channel thread (for [`on_channel_thread_rx`]).
pub(crate) fn mark_channel_thread() {
    CHANNEL_THREAD.with(|f| f.set(true));
}

/// Whether the caller is a channel's receive waker, called by the channel thread of its
/// queue right after it queued received bytes, from its own thread (not from an
/// application thread running the queue's round inline or for run-to-completion
/// receive). Such a waker may consume the bytes on the spot instead of waking another
/// thread to do it, which takes a cross-thread wake-up out of each message's path and
/// puts the consumer's receive work on the channel threads, which scale with the
/// channels: the channel thread holds its queue's lock meanwhile, and nothing else is
/// held, so the work may take the consumer's own locks (it must not block on another
/// queue's state, which nothing does: inline rounds only try that lock). Anywhere else
/// it returns false.
pub fn on_channel_thread_rx() -> bool {
    ON_THREAD_RX.with(|f| f.get())
}

/// How a channel thread is woken: an `eventfd` it sleeps on, written only when the thread
/// said it is about to sleep.
#[derive(Debug)]
pub(crate) struct ThreadSignal {
    sleeping: AtomicBool,
    pending: AtomicBool,
    /// Commands or forwarded frames were queued for the thread since a round last took
    /// them ([`notify_control`](Self::notify_control)).
    control: AtomicBool,
    stop: AtomicBool,
    efd: EventFd,
    /// The queue's state, for inline rounds (`thread::run_inline_marked`); weak, since the
    /// state holds the channels that hold this signal.
    inline: OnceLock<Weak<Mutex<QueueState>>>,
    /// Largest chunk an enqueue into an empty Tx queue sends inline (0: never).
    inline_max: AtomicUsize,
    /// When the thread plans to wake (microseconds of its clock; `u64::MAX`: no timer),
    /// stored before it announces sleep.
    planned: AtomicU64,
    /// An inline round ran since the thread last looked ([`after_inline`](Self::after_inline)):
    /// the thread refreshes its timers before it sleeps. Apart from `pending`, so that
    /// under a lease (the runtime serves the queue's arrivals) it does not run a round
    /// of its own for it, which took the frames of an exchange in flight.
    inline_ran: AtomicBool,
    /// The queue's next timer as the last inline round left it (microseconds of the
    /// set's clock; `u64::MAX`: none), published while that round still held the state,
    /// so in the order of the rounds. The thread reads it after `inline_ran` instead of
    /// taking the state's lock, which an application's inline call would then have found
    /// held.
    inline_timer: AtomicU64,
    /// When the last round of the queue (the thread's or an inline one) ended, in
    /// microseconds since `origin`: inline rounds are for a quiet queue only.
    last_round: AtomicU64,
    origin: std::time::Instant,
    /// Until when (microseconds since `origin`) a runtime watches the queue's socket and
    /// runs the receive rounds itself ([`RxPoller`]): the thread then sleeps on its
    /// eventfd and timers only, so that an arrival wakes one thread, not two.
    rx_lease: AtomicU64,
    /// A duplicate of the queue's AF_XDP socket for [`RxPoller`]s (set at start).
    rx_fd: OnceLock<std::os::fd::OwnedFd>,
    /// Fault injection ([`ChannelSet::kill_queue_thread`](super::ChannelSet::kill_queue_thread)):
    /// the thread is to die as if it had crashed.
    kill: AtomicBool,
    /// The thread died ([`kill`](Self::kill)): nobody runs the queue's rounds any more,
    /// neither the thread nor inline callers.
    dead: AtomicBool,
    /// Chunks that enqueuing threads sent themselves ([`DeferredKick`]).
    inline_sends: AtomicU64,
    /// Rounds run by other threads than the channel thread ([`run_inline_marked`](super::thread::run_inline_marked)).
    inline_rounds: AtomicU64,
    /// A thread that found the queue's round held by an application thread asks that
    /// thread to run one more before it lets go ([`ask_for_round`](Self::ask_for_round)).
    round_wanted: AtomicBool,
    /// Chunks whose sending was left to the application thread running the queue's round
    /// at the time ([`ask_for_round`](Self::ask_for_round)).
    handed_sends: AtomicU64,
    /// Times the queue's thread came back from sleep (`poll(2)`), whatever woke it.
    wakeups: AtomicU64,
}

/// Bytes a message's headers may add to the inline limit when its payload is queued
/// behind them ([`Channel::enqueue_behind`]): a payload of exactly the limit (16 KiB, a
/// common message size) with its header is still one message.
const BEHIND_HEADROOM: usize = 256;

/// A queue whose last round ended less than this long ago is busy: a kick then wakes the
/// thread (which batches) instead of running an inline round per message. Measured on
/// the 2-core bed: per-message inline rounds cost 40-50 % of the request rate at 32-128
/// connections, while a ping-pong's gaps between rounds are tens of microseconds.
const INLINE_QUIET: std::time::Duration = std::time::Duration::from_micros(20);

impl ThreadSignal {
    pub(crate) fn new() -> std::io::Result<ThreadSignal> {
        Self::with_origin(std::time::Instant::now())
    }

    /// A signal whose times count from `origin` (the [`Clock`] of the threads that serve
    /// its queue: see [`round_ended_at`](Self::round_ended_at)).
    pub(crate) fn with_origin(origin: std::time::Instant) -> std::io::Result<ThreadSignal> {
        let efd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(ThreadSignal {
            sleeping: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            inline_ran: AtomicBool::new(false),
            inline_timer: AtomicU64::new(u64::MAX),
            control: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            efd,
            inline: OnceLock::new(),
            inline_max: AtomicUsize::new(0),
            planned: AtomicU64::new(u64::MAX),
            last_round: AtomicU64::new(0),
            origin,
            rx_lease: AtomicU64::new(0),
            rx_fd: OnceLock::new(),
            kill: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            inline_sends: AtomicU64::new(0),
            inline_rounds: AtomicU64::new(0),
            round_wanted: AtomicBool::new(false),
            handed_sends: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
        })
    }

    /// Chunks up to `max` bytes enqueued into an empty Tx queue are sent by the enqueuing
    /// thread when the channel thread is not running a round (0 turns that off).
    pub(crate) fn set_inline_max(&self, max: usize) {
        self.inline_max.store(max, Ordering::Relaxed);
    }

    /// A round of the queue that started at `now` on `clock` just ended (the thread's or
    /// an inline one). The round's own clock reading stands for its end when the clock
    /// shares this signal's origin (the set's threads do): a round is a few microseconds
    /// against [`INLINE_QUIET`], and a second clock read per round was about 2 % of a
    /// 64-byte request's instructions with the other reads it stands for (callgrind).
    pub(crate) fn round_ended_at(&self, clock: &Clock, now: Instant) {
        let at = if clock.origin() == self.origin {
            now.total_micros()
        } else {
            self.micros()
        };
        self.last_round.store(at, Ordering::Relaxed);
    }

    /// Rounds that enqueuing threads ran to send their chunks themselves so far.
    pub(crate) fn inline_sends(&self) -> u64 {
        self.inline_sends.load(Ordering::Relaxed)
    }

    /// Rounds that other threads ran in the channel thread's place so far (inline sends
    /// and run-to-completion receives together).
    pub(crate) fn inline_rounds(&self) -> u64 {
        self.inline_rounds.load(Ordering::Relaxed)
    }

    /// `n` more rounds ran inline.
    pub(crate) fn count_inline_rounds(&self, n: u64) {
        self.inline_rounds.fetch_add(n, Ordering::Relaxed);
    }

    /// Times the thread serving the queue came back from sleep so far.
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// Thread side: it came back from a sleep.
    pub(crate) fn count_wakeup(&self) {
        self.wakeups.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs an inline send round, or leaves the chunk to the application thread running
    /// one now; whether either happened (else the caller wakes the channel thread).
    fn send_inline(&self) -> bool {
        match super::thread::send_inline(self) {
            super::thread::InlineSend::Ran => {
                self.inline_sends.fetch_add(1, Ordering::Relaxed);
                true
            }
            super::thread::InlineSend::Handed => {
                self.handed_sends.fetch_add(1, Ordering::Relaxed);
                true
            }
            super::thread::InlineSend::No => false,
        }
    }

    /// Chunks left to the application thread that ran the queue's round so far.
    pub(crate) fn handed_sends(&self) -> u64 {
        self.handed_sends.load(Ordering::Relaxed)
    }

    /// The queue's round is held by another thread: asks it to run one more before it
    /// lets go, so that what the caller queued goes out without a wake-up of the channel
    /// thread. An inline holder looks with [`take_round_wanted`](Self::take_round_wanted)
    /// after it lets go; the channel thread, should it hold the round, looks at `pending`.
    /// The caller must try the lock once more afterwards: a holder that let go before
    /// the ask was visible does not see it (the fences order the ask against the
    /// holder's release and look, Dekker-style).
    pub(crate) fn ask_for_round(&self) {
        // A swap, not a store: as a read-modify-write it follows every earlier take in the
        // flag's modification order without relying on the fences for that (the loom
        // model found a plain store read past by a later take there).
        self.round_wanted.swap(true, Ordering::SeqCst);
        self.pending.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Holder side, after letting go of the round: whether somebody asked for one more
    /// ([`ask_for_round`](Self::ask_for_round)), clearing the ask.
    pub(crate) fn take_round_wanted(&self) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.round_wanted.swap(false, Ordering::SeqCst)
    }

    /// Thread side, holding the round: a round starting now covers every ask so far (a
    /// swap, so that an ask it clears synchronises with it: the asker's chunk is visible
    /// to the round).
    pub(crate) fn clear_round_wanted(&self) {
        self.round_wanted.swap(false, Ordering::SeqCst);
    }

    /// Whether no round ended within [`INLINE_QUIET`].
    fn quiet(&self) -> bool {
        self.micros()
            .saturating_sub(self.last_round.load(Ordering::Relaxed))
            >= micros_of(INLINE_QUIET)
    }

    fn micros(&self) -> u64 {
        micros_of(self.origin.elapsed())
    }

    /// Leaves the queue's arrivals to a runtime's [`RxPoller`] for `d`.
    pub(crate) fn lease_rx(&self, d: std::time::Duration) {
        self.lease_rx_at(std::time::Instant::now(), d);
    }

    /// [`lease_rx`](Self::lease_rx) from `now`.
    ///
    /// A lease that already runs to within an eighth of `d` of the new end is left as it
    /// is: every wait of a reading task renews it, and a read-modify-write of a word the
    /// channel thread reads, on each, cost more than the lease's last eighth is worth.
    pub(crate) fn lease_rx_at(&self, now: std::time::Instant, d: std::time::Duration) {
        let from = micros_of(now.saturating_duration_since(self.origin));
        let d = micros_of(d);
        let until = from.saturating_add(d);
        if self.rx_lease.load(Ordering::Relaxed) >= until.saturating_sub(d / 8) {
            return;
        }
        self.rx_lease.fetch_max(until, Ordering::Relaxed);
    }

    /// Ends a lease at once; a thread sleeping under it is woken to take the queue's
    /// socket back.
    pub(crate) fn end_rx_lease(&self) {
        if self.rx_lease.swap(0, Ordering::Relaxed) > self.micros() {
            self.notify();
        }
    }

    /// How long a runtime still watches the queue's socket (`None`: nobody does).
    pub(crate) fn rx_lease_left(&self) -> Option<std::time::Duration> {
        let left = self
            .rx_lease
            .load(Ordering::Relaxed)
            .saturating_sub(self.micros());
        (left > 0).then(|| std::time::Duration::from_micros(left))
    }

    /// The duplicate of the queue's AF_XDP descriptor, once the thread has bound it.
    pub(crate) fn rx_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.rx_fd.get().map(|fd| fd.as_fd())
    }

    pub(crate) fn set_rx_fd(&self, fd: std::os::fd::OwnedFd) {
        let _ = self.rx_fd.set(fd);
    }

    /// Whether the thread announced sleep (a hint: it may be waking up right now).
    pub(crate) fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::Relaxed)
    }

    fn inline_max(&self) -> usize {
        self.inline_max.load(Ordering::Relaxed)
    }

    /// Thread side: makes the queue's state reachable for inline rounds.
    pub(crate) fn set_inline_state(&self, state: Weak<Mutex<QueueState>>) {
        let _ = self.inline.set(state);
    }

    pub(crate) fn inline_state(&self) -> Option<Arc<Mutex<QueueState>>> {
        self.inline.get().and_then(Weak::upgrade)
    }

    /// Thread side: records when it will wake (before [`prepare_sleep`](Self::prepare_sleep)).
    pub(crate) fn set_planned(&self, at: Option<Instant>) {
        let v = at.map_or(u64::MAX, |d| d.total_micros());
        self.planned.store(v, Ordering::SeqCst);
    }

    /// After an inline round that ran at `now`: the thread looks again before it sleeps
    /// (`inline_ran`, which pairs with `prepare_sleep` as `pending` does in
    /// [`notify`](Self::notify); see [`take_inline_ran`](Self::take_inline_ran)), and a
    /// sleeping thread is kicked only if the round armed a timer that its planned wake-up
    /// would make late by more than a quarter of the timer's delay.
    ///
    /// A timer firing that little late is harmless, and while traffic flows the inline
    /// rounds run the timers anyway. Kicking for any earlier timer woke the thread about
    /// once per lease: its planned wake-up is the lease's end, 8.75-10 ms ahead after a
    /// renewal, and each send re-arms the connection's 8 ms timer; on the 2-core bed those
    /// wake-ups (0.6 % of a 4 KB ping-pong's sends) were part of its tail
    /// (`docs/performance.md`, thirteenth session).
    pub(crate) fn after_inline(&self, next_timer: Option<Instant>, now: Instant) {
        self.inline_ran.store(true, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            let Some(next) = next_timer.map(Instant::total_micros) else {
                return;
            };
            let slack = next.saturating_sub(now.total_micros()) / 4;
            if next.saturating_add(slack) < self.planned.load(Ordering::SeqCst) {
                self.kick();
            }
        }
    }

    /// [`notify`](Self::notify) for a command or forwarded frame just queued for the
    /// thread: marks them pending first ([`take_control`](Self::take_control)).
    pub(crate) fn notify_control(&self) {
        self.control.store(true, Ordering::Release);
        self.notify();
    }

    /// Round side: whether commands or forwarded frames may wait (cleared; the caller
    /// drains them, and marks them again with [`mark_control`](Self::mark_control) if it
    /// leaves some). Every round asks: one load where nothing was queued, instead of a
    /// look at each of the two channels (~16 per 64-byte request, callgrind).
    pub(crate) fn take_control(&self) -> bool {
        self.control.load(Ordering::Acquire) && self.control.swap(false, Ordering::AcqRel)
    }

    /// Whether commands or forwarded frames may wait (not cleared).
    pub(crate) fn control_pending(&self) -> bool {
        self.control.load(Ordering::Acquire)
    }

    /// Round side: some were left for the next round.
    pub(crate) fn mark_control(&self) {
        self.control.store(true, Ordering::Release);
    }

    /// Tells the thread it has work; a system call only if it sleeps (or is about to).
    pub(crate) fn notify(&self) {
        self.pending.store(true, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            self.kick();
        }
    }

    /// Asks the thread to stop, and wakes it whatever it does.
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.pending.store(true, Ordering::SeqCst);
        self.kick();
    }

    fn kick(&self) {
        // EAGAIN means the counter is saturated: the thread is woken anyway.
        let _ = self.efd.write(1);
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Fault injection: asks the thread to die as if it had crashed (see
    /// [`ChannelSet::kill_queue_thread`](super::ChannelSet::kill_queue_thread)). From
    /// now on no inline round runs either.
    pub(crate) fn request_kill(&self) {
        self.kill.store(true, Ordering::SeqCst);
        self.pending.store(true, Ordering::SeqCst);
        self.kick();
    }

    pub(crate) fn kill_requested(&self) -> bool {
        self.kill.load(Ordering::Acquire)
    }

    /// Thread side: the thread is gone (its channels were told).
    pub(crate) fn set_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// Whether the queue's thread died or is dying (fault injection): its rounds are
    /// run by nobody.
    pub(crate) fn is_dead(&self) -> bool {
        self.kill_requested() || self.dead.load(Ordering::Acquire)
    }

    /// Thread side: consumes the "work pending" flag at the start of a round.
    pub(crate) fn take_pending(&self) -> bool {
        self.pending.swap(false, Ordering::SeqCst)
    }

    /// Inline side, still holding the queue's state: the queue's next timer after the
    /// round (see `inline_timer`).
    pub(crate) fn set_inline_timer(&self, next: Option<Instant>) {
        let v = next.map_or(u64::MAX, |d| d.total_micros());
        self.inline_timer.store(v, Ordering::SeqCst);
    }

    /// Thread side: the queue's next timer as the last inline round left it.
    pub(crate) fn inline_timer(&self) -> Option<Instant> {
        match self.inline_timer.load(Ordering::SeqCst) {
            u64::MAX => None,
            v => Some(Instant::from_micros(v)),
        }
    }

    /// Thread side: whether an inline round ran since the last call (cleared). The
    /// thread then learns the queue's timers again; it runs a round for it only when no
    /// runtime holds the queue's receive lease.
    pub(crate) fn take_inline_ran(&self) -> bool {
        self.inline_ran.load(Ordering::Relaxed) && self.inline_ran.swap(false, Ordering::SeqCst)
    }

    /// Thread side: announces sleep. Returns false (and stays awake) when work arrived
    /// or an inline round ran meanwhile; then the caller must not sleep.
    pub(crate) fn prepare_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        if self.pending.load(Ordering::SeqCst)
            || self.inline_ran.load(Ordering::SeqCst)
            || self.stop.load(Ordering::SeqCst)
        {
            self.sleeping.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Thread side: back from sleep; drains the eventfd.
    pub(crate) fn awake(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
        let _ = self.efd.read();
    }

    pub(crate) fn eventfd(&self) -> &EventFd {
        &self.efd
    }
}

/// The wake-up of a channel thread that [`Channel::enqueue_deferred`] handed back: run it
/// once the caller holds no lock. Dropping it without running it would leave the chunk
/// until the thread's next wake-up for another reason (at most its timer tick while active,
/// or much later): always run it.
#[derive(Debug)]
#[must_use = "the channel thread is not woken until the kick runs"]
pub struct DeferredKick {
    signal: Arc<ThreadSignal>,
}

impl DeferredKick {
    /// Sends the chunk from this thread if the channel thread sleeps, is not running a
    /// round and the queue has been quiet for a while (inline transmit: no wake-up of that
    /// thread on the message's path); if another application thread is running the
    /// queue's round right then, the chunk is left to it (it runs one more round before
    /// letting go, `ThreadSignal::ask_for_round`); else wakes the thread as an enqueue
    /// does. An awake
    /// thread takes the chunk without a wake-up, and on a busy queue the thread batches
    /// many messages per round where inline rounds would cost one round (and one system
    /// call) each.
    pub fn run(self) {
        if self.signal.is_sleeping() && self.signal.quiet() && self.signal.send_inline() {
            return;
        }
        self.signal.notify();
    }

    /// [`run`](Self::run) without the quiet-queue condition: sends the chunk from this
    /// thread whenever the channel thread sleeps and no round runs. For callers that know
    /// the queue carries few streams (vns's lightly loaded stacks), where a busy queue
    /// means a few messages in flight, not many to batch: there the thread's wake-up
    /// costs more than the round it would batch.
    pub fn run_now(self) {
        if self.signal.is_sleeping() && self.signal.send_inline() {
            return;
        }
        self.signal.notify();
    }

    /// Wakes the channel thread as an enqueue does, never sending inline (for channels
    /// that carry bulk or many streams, where the thread batches better).
    pub fn wake(self) {
        self.signal.notify();
    }
}

/// What [`RxPoller::poll_now_or_ask`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxRound {
    /// The caller ran the queue's rounds.
    Ran,
    /// Another thread runs the queue's round now and was asked for one more before it
    /// lets go: it takes what waits on the ring.
    Asked,
    /// Nothing ran and nobody was asked: the queue's thread stops or died, or the queue
    /// has no state for inline rounds.
    NotRun,
}

/// The receive side of one channel thread's queue, for a runtime that waits for
/// arrivals itself and processes them on its own thread (run to completion): a task
/// with nothing to read registers [`fd`](RxPoller::fd) with its reactor (tokio's
/// `AsyncFd`), takes a [`lease`](RxPoller::lease), and when the descriptor turns readable
/// calls [`poll_now`](RxPoller::poll_now), which runs the queue's round (receive, TCP,
/// the channels' Rx queues and wakers) on the calling thread. During the lease the
/// channel thread does not wait on the socket itself, so an arrival wakes one thread
/// (the reader's) instead of the channel thread, which would then wake the reader.
///
/// A lease that nobody serves (the task went away) delays the queue's arrivals until it
/// ends: the thread wakes at its end and takes over. Keep leases short (milliseconds)
/// and renew them each time the task waits again.
#[derive(Debug, Clone)]
pub struct RxPoller {
    pub(crate) queue: u32,
    pub(crate) signal: Arc<ThreadSignal>,
}

impl RxPoller {
    /// The NIC queue this poller serves.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// A descriptor that is readable while frames wait on the queue's AF_XDP socket (a
    /// duplicate of it; `None` if duplicating failed at start).
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.signal.rx_fd.get().map(|fd| fd.as_fd())
    }

    /// Runs the queue's rounds on the calling thread unless its channel thread (or
    /// another caller) is running one right now, or the thread died
    /// ([`is_dead`](Self::is_dead)); returns whether it ran them. Never waits for a lock. Received bytes land in the channels' Rx queues and their
    /// wakers are woken, as when the thread does it.
    pub fn poll_now(&self) -> bool {
        // A receive round must not make the queue look busy to the inline transmit that
        // usually follows it (the reply), which only runs on a quiet queue: its rounds
        // leave the queue's last round as it was.
        super::thread::run_inline_marked(&self.signal, false)
    }

    /// [`poll_now`](Self::poll_now) for a caller that saw frames wait: when another
    /// thread runs the queue's round right now, that thread is asked for one more round
    /// before it lets go (the frames are then its to take, and the channels' wakers
    /// announce what they bring), so that the caller need not try again until it is
    /// woken. A caller that instead tried again at once spun on the round: with the
    /// holder preempted on the same core (applications and channel threads pinned
    /// together), for the rest of its scheduler slice, 1-5 ms (`docs/performance.md`,
    /// eleventh session).
    pub fn poll_now_or_ask(&self) -> RxRound {
        match super::thread::run_inline_as(&self.signal, false, true) {
            super::thread::InlineSend::Ran => RxRound::Ran,
            super::thread::InlineSend::Handed => RxRound::Asked,
            super::thread::InlineSend::No => RxRound::NotRun,
        }
    }

    /// Whether the queue's channel thread died (fault injection,
    /// [`ChannelSet::kill_queue_thread`](super::ChannelSet::kill_queue_thread)). A dead
    /// queue is served by nobody: [`poll_now`](Self::poll_now) runs nothing for it, so
    /// that a runtime cannot keep a dead queue's connections going inline and hide the
    /// death, and a runtime should stop waiting on its descriptor, which stays readable
    /// while frames pile up on the ring.
    pub fn is_dead(&self) -> bool {
        self.signal.is_dead()
    }

    /// Leaves the queue's arrivals to this caller for `d` (extends, never shortens, a
    /// lease already given).
    pub fn lease(&self, d: std::time::Duration) {
        self.signal.lease_rx(d);
    }

    /// [`lease`](Self::lease) from `now`, a time the caller read already (a caller
    /// leasing several queues at once reads the clock once).
    pub fn lease_at(&self, now: std::time::Instant, d: std::time::Duration) {
        self.signal.lease_rx_at(now, d);
    }

    /// Ends the lease now (for a runtime that stops serving the queue before its lease
    /// would end): the channel thread is woken if it sleeps under it, and waits on the
    /// socket again.
    pub fn end_lease(&self) {
        self.signal.end_rx_lease();
    }
}

/// `d` in whole microseconds, saturating, without `as_micros`'s 128-bit arithmetic (the
/// quiet rule and the leases ask on every wait and round).
fn micros_of(d: std::time::Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()))
}

/// A connection's sequence numbers as the thread publishes them with its statistics.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WireSeq {
    pub(crate) rcv_nxt: u32,
    pub(crate) snd_nxt: u32,
}

/// Number of words in [`StatsCell`].
const STATS_WORDS: usize = 13;
const NO_SRTT: u64 = u64::MAX;

/// The TCP part of [`ChannelStats`], written by the channel thread and read by anyone: a
/// sequence lock over atomic words (one writer; readers retry while a write is under
/// way), so neither side takes a lock and no reader can see a torn snapshot.
#[derive(Debug, Default)]
struct StatsCell {
    seq: AtomicU64,
    words: [AtomicU64; STATS_WORDS],
}

impl StatsCell {
    fn write(&self, s: &Traffic, wire: WireSeq, now: Instant) {
        let srtt = s.srtt_us.map_or(NO_SRTT, |us| us.min(NO_SRTT - 1));
        let words = [
            s.send_queue as u64,
            s.recv_queue as u64,
            s.bytes_in_flight as u64,
            s.cwnd as u64,
            srtt,
            s.retransmitted_segments,
            s.rto_timeouts,
            s.bytes_sent,
            s.bytes_acked,
            s.bytes_received,
            now.total_micros(),
            u64::from(wire.rcv_nxt),
            u64::from(wire.snd_nxt),
        ];
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    fn read(&self) -> [u64; STATS_WORDS] {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let words = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return words;
            }
        }
    }
}

/// Why a channel ended, as stored in an atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Failure {
    Reset = 1,
    Refused = 2,
    TimedOut = 3,
    Closed = 4,
    ShutDown = 5,
    TooManyConnections = 6,
    NoFreePort = 7,
    ThreadDied = 8,
}

impl Failure {
    fn from_u8(v: u8) -> Option<Failure> {
        Some(match v {
            1 => Failure::Reset,
            2 => Failure::Refused,
            3 => Failure::TimedOut,
            4 => Failure::Closed,
            5 => Failure::ShutDown,
            6 => Failure::TooManyConnections,
            7 => Failure::NoFreePort,
            8 => Failure::ThreadDied,
            _ => return None,
        })
    }

    pub(crate) fn from_tcp(e: crate::tcp::TcpError) -> Failure {
        use crate::tcp::TcpError;
        match e {
            TcpError::Reset => Failure::Reset,
            TcpError::Refused => Failure::Refused,
            TcpError::TimedOut => Failure::TimedOut,
            TcpError::Closed | TcpError::WouldBlock => Failure::Closed,
        }
    }

    fn error(self) -> ChannelError {
        match self {
            Failure::Reset => ChannelError::Reset,
            Failure::Refused => ChannelError::Refused,
            Failure::TimedOut => ChannelError::TimedOut,
            Failure::Closed => ChannelError::Closed,
            Failure::ShutDown => ChannelError::ShutDown,
            Failure::TooManyConnections => ChannelError::TooManyConnections,
            Failure::NoFreePort => ChannelError::NoFreePort,
            Failure::ThreadDied => ChannelError::ThreadDied,
        }
    }
}

const STATE_CONNECTING: u8 = 0;
const STATE_OPEN: u8 = 1;
const STATE_CLOSED: u8 = 2;

/// What a [`Channel`] and its thread share.
#[derive(Debug)]
pub(crate) struct ChannelShared {
    pub(crate) local: SocketAddrV4,
    pub(crate) peer: SocketAddrV4,
    pub(crate) queue: u32,
    tx: LazyQueue<Bytes>,
    /// Bytes enqueued and not yet taken by TCP (including the rest of a chunk that did not
    /// fit, which the thread keeps).
    tx_bytes: AtomicUsize,
    tx_limit: usize,
    rx: LazyQueue<Bytes>,
    rx_bytes: AtomicUsize,
    rx_limit: usize,
    rx_waker: AtomicWaker,
    tx_waker: AtomicWaker,
    state: AtomicU8,
    failure: AtomicU8,
    rx_finished: AtomicBool,
    /// Set by the thread when it stopped reading because the Rx queue was full.
    rx_blocked: AtomicBool,
    close_requested: AtomicBool,
    abort_requested: AtomicBool,
    /// Option changes the application asked for and the thread has not applied yet,
    /// merged into one value (bounded whatever the number of calls).
    options: Mutex<OptionChanges>,
    /// `options` holds changes: the thread looks without taking the lock otherwise.
    options_pending: AtomicBool,
    stats: StatsCell,
    signal: Arc<ThreadSignal>,
}

/// Chunk and byte limits of one queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) chunks: usize,
    pub(crate) bytes: usize,
}

impl ChannelShared {
    pub(crate) fn new(
        local: SocketAddrV4,
        peer: SocketAddrV4,
        queue: u32,
        tx: Limits,
        rx: Limits,
        signal: Arc<ThreadSignal>,
    ) -> ChannelShared {
        ChannelShared {
            local,
            peer,
            queue,
            tx: LazyQueue::new(tx.chunks),
            tx_bytes: AtomicUsize::new(0),
            tx_limit: tx.bytes.max(1),
            rx: LazyQueue::new(rx.chunks),
            rx_bytes: AtomicUsize::new(0),
            rx_limit: rx.bytes.max(1),
            rx_waker: AtomicWaker::new(),
            tx_waker: AtomicWaker::new(),
            state: AtomicU8::new(STATE_CONNECTING),
            failure: AtomicU8::new(0),
            rx_finished: AtomicBool::new(false),
            rx_blocked: AtomicBool::new(false),
            close_requested: AtomicBool::new(false),
            abort_requested: AtomicBool::new(false),
            options: Mutex::new(OptionChanges::default()),
            options_pending: AtomicBool::new(false),
            stats: StatsCell::default(),
            signal,
        }
    }

    // ---- thread side ----

    /// The next chunk to hand to TCP.
    pub(crate) fn pop_tx(&self) -> Option<Bytes> {
        self.tx.pop()
    }

    /// Whether the thread has nothing to take from the application side: no chunk queued
    /// and no option change pending.
    pub(crate) fn tx_idle(&self) -> bool {
        self.tx.is_empty() && !self.options_pending.load(Ordering::Acquire)
    }

    /// `n` bytes were handed to TCP.
    pub(crate) fn tx_taken(&self, n: usize) {
        self.tx_bytes.fetch_sub(n, Ordering::AcqRel);
    }

    /// Bytes the Rx queue may take now (0 when at a limit).
    pub(crate) fn rx_room(&self) -> usize {
        if self.rx.is_full() {
            return 0;
        }
        self.rx_limit
            .saturating_sub(self.rx_bytes.load(Ordering::SeqCst))
    }

    /// Queues a received chunk; the caller checked [`rx_room`](Self::rx_room).
    pub(crate) fn push_rx(&self, chunk: Bytes) {
        let len = chunk.len();
        self.rx_bytes.fetch_add(len, Ordering::SeqCst);
        if self.rx.push(chunk).is_err() {
            // Only this thread pushes and it checked for room: unreachable in practice.
            self.rx_bytes.fetch_sub(len, Ordering::SeqCst);
            tracing::error!("channel rx queue overflow; chunk dropped");
        }
    }

    /// The thread stops reading for lack of room. Returns false when room appeared
    /// meanwhile (keep reading).
    pub(crate) fn block_rx(&self) -> bool {
        self.rx_blocked.store(true, Ordering::SeqCst);
        if self.rx_room() > 0 {
            self.rx_blocked.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    pub(crate) fn close_requested(&self) -> bool {
        self.close_requested.load(Ordering::Acquire)
    }

    pub(crate) fn abort_requested(&self) -> bool {
        self.abort_requested.load(Ordering::Acquire)
    }

    /// The option changes pending since the last call, if any (thread side).
    pub(crate) fn take_options(&self) -> Option<OptionChanges> {
        if !self.options_pending.swap(false, Ordering::AcqRel) {
            return None;
        }
        let mut pending = self.options.lock().unwrap_or_else(|e| e.into_inner());
        Some(std::mem::take(&mut *pending))
    }

    /// Queues option changes for the thread (application side).
    fn request_options(&self, changes: OptionChanges) {
        if changes.is_empty() {
            return;
        }
        self.options
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .merge(changes);
        // After the merge: the thread that sees the flag finds the changes.
        self.options_pending.store(true, Ordering::Release);
        self.signal.notify();
    }

    pub(crate) fn set_open(&self) {
        if self
            .state
            .compare_exchange(
                STATE_CONNECTING,
                STATE_OPEN,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            self.wake_all();
        }
    }

    /// End of stream: every byte before the peer's FIN is queued.
    pub(crate) fn finish_rx(&self) {
        if !self.rx_finished.swap(true, Ordering::AcqRel) {
            self.rx_waker.wake();
        }
    }

    /// Records why the channel failed (the first reason sticks).
    pub(crate) fn fail(&self, f: Failure) {
        let _ = self
            .failure
            .compare_exchange(0, f as u8, Ordering::AcqRel, Ordering::Acquire);
        self.wake_all();
    }

    /// The connection is gone.
    pub(crate) fn set_closed(&self) {
        self.state.store(STATE_CLOSED, Ordering::Release);
        self.wake_all();
    }

    pub(crate) fn wake_rx(&self) {
        self.rx_waker.wake();
    }

    /// [`wake_rx`](Self::wake_rx) from a queue round's receive path: on the queue's
    /// channel thread, [`on_channel_thread_rx`] is true during the call, so that the
    /// consumer's waker may do the consumer's work right there (see there); on a thread
    /// running the round inline, a plain wake-up.
    pub(crate) fn wake_rx_from_round(&self) {
        if !CHANNEL_THREAD.with(|f| f.get()) {
            return self.wake_rx();
        }
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                ON_THREAD_RX.with(|f| f.set(false));
            }
        }
        ON_THREAD_RX.with(|f| f.set(true));
        let _reset = Reset;
        self.wake_rx();
    }

    /// Wakes the Tx side once the queue has drained to half its limits (chunks and
    /// bytes), not after every chunk taken: a writer blocked on a full queue then refills
    /// half of it per wake-up instead of one chunk, sparing the thread a futex wake (a
    /// cross-core wake-up) per chunk while TCP still has half the queue to send. An
    /// empty queue (what flush waits for) is always below the mark.
    pub(crate) fn wake_tx_at_low_water(&self) {
        let chunks_low = self.tx.len() <= self.tx.capacity() / 2;
        let bytes_low = self.tx_bytes.load(Ordering::Acquire) <= self.tx_limit / 2;
        if chunks_low && bytes_low {
            self.tx_waker.wake();
        }
    }

    pub(crate) fn wake_all(&self) {
        self.rx_waker.wake();
        self.tx_waker.wake();
    }

    pub(crate) fn publish(&self, s: &Traffic, wire: WireSeq, now: Instant) {
        self.stats.write(s, wire, now);
    }

    pub(crate) fn failure(&self) -> Option<Failure> {
        Failure::from_u8(self.failure.load(Ordering::Acquire))
    }

    pub(crate) fn state(&self) -> ChannelState {
        match self.state.load(Ordering::Acquire) {
            STATE_CONNECTING => ChannelState::Connecting,
            STATE_OPEN => ChannelState::Open,
            _ => ChannelState::Closed,
        }
    }

    // ---- application side ----

    fn send_error(&self) -> Option<ChannelError> {
        if let Some(f) = self.failure() {
            return Some(f.error());
        }
        if self.close_requested.load(Ordering::Acquire)
            || self.state.load(Ordering::Acquire) == STATE_CLOSED
        {
            return Some(ChannelError::Closed);
        }
        None
    }

    fn tx_has_room(&self) -> bool {
        !self.tx.is_full() && self.tx_bytes.load(Ordering::Acquire) < self.tx_limit
    }

    fn enqueue(&self, chunk: Bytes) -> Result<(), EnqueueError> {
        if let Some(kick) = self.enqueue_deferred(chunk)? {
            kick.run();
        }
        Ok(())
    }

    /// Puts a chunk on the Tx queue; returns whether the queue was empty before and the
    /// bytes it holds now (`None`: an empty chunk, nothing queued).
    fn push_tx_chunk(&self, chunk: Bytes) -> Result<Option<(bool, usize)>, EnqueueError> {
        if let Some(e) = self.send_error() {
            return Err(EnqueueError::Closed(e));
        }
        if chunk.is_empty() {
            return Ok(None);
        }
        let len = chunk.len();
        // Taken while fewer bytes than the limit are queued: the last chunk may overshoot
        // it, so any chunk fits an empty queue, and "ready" means the same for every size.
        if !self.tx_has_room() {
            return Err(EnqueueError::Full(chunk));
        }
        let was_empty = self.tx.is_empty();
        let queued = self.tx_bytes.fetch_add(len, Ordering::AcqRel) + len;
        if let Err(chunk) = self.tx.push(chunk) {
            self.tx_bytes.fetch_sub(len, Ordering::AcqRel);
            return Err(EnqueueError::Full(chunk));
        }
        Ok(Some((was_empty, queued)))
    }

    /// Queues the chunk; the wake-up of the thread is done at once, except for a small
    /// chunk into an empty queue, whose wake-up (or inline round) is handed back.
    fn enqueue_deferred(&self, chunk: Bytes) -> Result<Option<DeferredKick>, EnqueueError> {
        let len = chunk.len();
        let Some((was_empty, _)) = self.push_tx_chunk(chunk)? else {
            return Ok(None);
        };
        // A small chunk with nothing queued before it is per-message traffic: its kick
        // may send it inline (see `DeferredKick::run`). Bulk stays with the thread.
        if was_empty && len <= self.signal.inline_max() {
            return Ok(Some(DeferredKick {
                signal: self.signal.clone(),
            }));
        }
        self.signal.notify();
        Ok(None)
    }

    /// [`enqueue_deferred`](Self::enqueue_deferred) for a chunk that follows one whose
    /// [`DeferredKick`] the caller holds and has not run yet: that kick's round (or
    /// wake-up) takes this chunk too, so nothing is woken now while the queue holds at
    /// most the inline limit (one message cut into a header and a payload is still one
    /// message). A longer queue is bulk: the thread is woken now, as for any chunk behind
    /// others.
    fn enqueue_behind(&self, chunk: Bytes) -> Result<(), EnqueueError> {
        if let Some((_, queued)) = self.push_tx_chunk(chunk)? {
            if queued > self.signal.inline_max() + BEHIND_HEADROOM {
                self.signal.notify();
            }
        }
        Ok(())
    }

    fn pop_rx(&self) -> Option<Bytes> {
        let chunk = self.rx.pop()?;
        self.rx_bytes.fetch_sub(chunk.len(), Ordering::SeqCst);
        if self.rx_blocked.load(Ordering::SeqCst) && self.rx_blocked.swap(false, Ordering::SeqCst) {
            self.signal.notify();
        }
        Some(chunk)
    }

    fn dequeue(&self) -> Result<Dequeued, ChannelError> {
        if let Some(c) = self.pop_rx() {
            return Ok(Dequeued::Chunk(c));
        }
        let finished = self.rx_finished.load(Ordering::Acquire);
        let failure = self.failure();
        if finished || failure.is_some() {
            // The thread queues every chunk before it sets either flag.
            if let Some(c) = self.pop_rx() {
                return Ok(Dequeued::Chunk(c));
            }
        }
        if finished {
            return Ok(Dequeued::Finished);
        }
        if let Some(f) = failure {
            return Err(f.error());
        }
        if self.state.load(Ordering::Acquire) == STATE_CLOSED {
            return Err(ChannelError::Closed);
        }
        Ok(Dequeued::Empty)
    }

    fn poll_enqueue_ready(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        for attempt in 0..2 {
            if let Some(e) = self.send_error() {
                return Poll::Ready(Err(e));
            }
            if self.tx_has_room() {
                return Poll::Ready(Ok(()));
            }
            if attempt == 0 {
                self.tx_waker.register(cx.waker());
            }
        }
        Poll::Pending
    }

    fn poll_dequeue(&self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ChannelError>> {
        for attempt in 0..2 {
            match self.dequeue() {
                Ok(Dequeued::Chunk(c)) => return Poll::Ready(Ok(Some(c))),
                Ok(Dequeued::Finished) => return Poll::Ready(Ok(None)),
                Err(e) => return Poll::Ready(Err(e)),
                Ok(Dequeued::Empty) if attempt == 0 => self.rx_waker.register(cx.waker()),
                Ok(Dequeued::Empty) => {}
            }
        }
        Poll::Pending
    }

    /// Ready when the thread has handed every enqueued byte to TCP.
    fn poll_flushed(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        for attempt in 0..2 {
            if self.tx_bytes.load(Ordering::Acquire) == 0 {
                return Poll::Ready(Ok(()));
            }
            if let Some(f) = self.failure() {
                return Poll::Ready(Err(f.error()));
            }
            if attempt == 0 {
                self.tx_waker.register(cx.waker());
            }
        }
        Poll::Pending
    }

    /// Ready once the handshake is done or has failed.
    pub(crate) fn poll_established(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        for attempt in 0..2 {
            if let Some(f) = self.failure() {
                return Poll::Ready(Err(f.error()));
            }
            match self.state() {
                ChannelState::Open => return Poll::Ready(Ok(())),
                ChannelState::Closed => return Poll::Ready(Err(ChannelError::Closed)),
                ChannelState::Connecting if attempt == 0 => self.tx_waker.register(cx.waker()),
                ChannelState::Connecting => {}
            }
        }
        Poll::Pending
    }

    fn stats(&self) -> ChannelStats {
        let w = self.stats.read();
        let us = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        // A closed channel's connection is gone, and its buffers with it: the thread
        // publishes no snapshot after removing it, so the last one may predate the final
        // acknowledgements.
        let closed = self.state() == ChannelState::Closed;
        let tcp = |v: u64| if closed { 0 } else { us(v) };
        ChannelStats {
            tx_queued: self.tx_bytes.load(Ordering::Relaxed),
            rx_queued: self.rx_bytes.load(Ordering::Relaxed),
            tx_tcp_queued: tcp(w[0]),
            rx_tcp_queued: tcp(w[1]),
            bytes_in_flight: tcp(w[2]),
            cwnd: us(w[3]),
            srtt: (w[4] != NO_SRTT).then(|| Duration::from_micros(w[4])),
            retransmitted_segments: w[5],
            rto_timeouts: w[6],
            bytes_sent: w[7],
            bytes_acked: w[8],
            bytes_received: w[9],
            updated_at: Instant::from_micros(w[10]),
        }
    }

    fn wire(&self) -> ChannelWire {
        let w = self.stats.read();
        ChannelWire {
            local: self.local,
            peer: self.peer,
            queue: self.queue,
            rcv_nxt: w[11] as u32,
            snd_nxt: w[12] as u32,
            updated_at: Instant::from_micros(w[10]),
        }
    }
}

/// Unparks a blocked thread: the waker behind the blocking calls.
struct Unparker(std::thread::Thread);

impl Wake for Unparker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    static THREAD_WAKER: Waker = Waker::from(Arc::new(Unparker(std::thread::current())));
}

/// Drives `f` on the calling thread, parking between polls, until it is ready or the
/// `timeout` passes (`None`: no limit). Returns `None` on timeout.
pub(crate) fn block_on<T>(
    timeout: Option<Duration>,
    mut f: impl FnMut(&mut Context<'_>) -> Poll<T>,
) -> Option<T> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    THREAD_WAKER.with(|waker| {
        let mut cx = Context::from_waker(waker);
        loop {
            if let Poll::Ready(v) = f(&mut cx) {
                return Some(v);
            }
            match deadline {
                None => std::thread::park(),
                Some(d) => {
                    let now = std::time::Instant::now();
                    if now >= d {
                        return None;
                    }
                    std::thread::park_timeout(d - now);
                }
            }
        }
    })
}

/// One channel: an in-crate TCP connection plus its Tx and Rx queues, driven by the
/// channel thread of [`queue`](Channel::queue). See the
/// [module documentation](super).
///
/// Dropping a channel that was not [`close`](Channel::close)d aborts it (the peer gets a
/// reset); after `close`, dropping lets the queued data and the FIN go out, like closing a
/// socket after `shutdown(SHUT_WR)`.
#[derive(Debug)]
pub struct Channel {
    pub(crate) shared: Arc<ChannelShared>,
}

impl Channel {
    pub(crate) fn new(shared: Arc<ChannelShared>) -> Channel {
        Channel { shared }
    }

    /// Queues `chunk` for sending, without blocking. `Full` hands it back when the Tx
    /// queue is at its chunk or byte limit (a chunk is taken while fewer bytes than the
    /// limit are queued, so the last one may overshoot it); `Closed` after [`close`](Channel::close), or once the
    /// channel failed. Chunks may be enqueued while the handshake is under way.
    pub fn enqueue(&self, chunk: Bytes) -> Result<(), EnqueueError> {
        self.shared.enqueue(chunk)
    }

    /// [`enqueue`](Channel::enqueue), except that for a small chunk into an empty Tx queue
    /// the channel thread's wake-up (or the inline transmit that replaces it) is handed
    /// back instead of done: the caller runs it with [`DeferredKick::run`] once it holds
    /// no lock of its own, so that a round with a system call in it never runs inside the
    /// caller's critical section. The chunk is queued either way, in order.
    pub fn enqueue_deferred(&self, chunk: Bytes) -> Result<Option<DeferredKick>, EnqueueError> {
        self.shared.enqueue_deferred(chunk)
    }

    /// Queues `chunk` behind one whose [`DeferredKick`] the caller holds and has not run
    /// yet (from [`enqueue_deferred`](Self::enqueue_deferred) on this channel, in the same
    /// critical section): the kick sends it too, so nothing is woken now unless the queue
    /// then holds more than the inline limit (`ChannelSetConfig::inline_tx`), which makes
    /// it bulk for the channel thread. Without this, a message cut into a header and a
    /// separately queued payload woke the channel thread for the payload on every message.
    ///
    /// The caller must run the held kick afterwards; otherwise the chunk waits for the
    /// thread's next wake-up for another reason.
    pub fn enqueue_behind(&self, chunk: Bytes) -> Result<(), EnqueueError> {
        self.shared.enqueue_behind(chunk)
    }

    /// Takes the next received chunk without blocking: a chunk, `Empty` (nothing yet), or
    /// `Finished` (the peer closed and everything was dequeued). Chunks queued before a
    /// failure are still delivered; then the failure (`Reset`, `TimedOut`, ...) is
    /// returned.
    pub fn dequeue(&self) -> Result<Dequeued, ChannelError> {
        self.shared.dequeue()
    }

    /// Async readiness to enqueue: `Ready(Ok)` when there is room.
    pub fn poll_enqueue_ready(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        self.shared.poll_enqueue_ready(cx)
    }

    /// Async dequeue: `Ready(Ok(Some(chunk)))`, `Ready(Ok(None))` at the end of stream.
    pub fn poll_dequeue(&self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ChannelError>> {
        self.shared.poll_dequeue(cx)
    }

    /// Async flush: ready once every enqueued byte has been handed to TCP.
    pub fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        self.shared.poll_flushed(cx)
    }

    /// Enqueues `chunk`, waiting for room at most `timeout` (`None`: as long as it
    /// takes). `Full` hands the chunk back on timeout.
    pub fn enqueue_blocking(
        &self,
        chunk: Bytes,
        timeout: Option<Duration>,
    ) -> Result<(), EnqueueError> {
        let mut chunk = Some(chunk);
        let res = block_on(timeout, |cx| loop {
            let Some(c) = chunk.take() else {
                return Poll::Ready(Ok(()));
            };
            match self.shared.enqueue(c) {
                Err(EnqueueError::Full(c)) => {
                    chunk = Some(c);
                    match self.shared.poll_enqueue_ready(cx) {
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(EnqueueError::Closed(e))),
                        // Room appeared since the attempt: try again at once.
                        Poll::Ready(Ok(())) => continue,
                        Poll::Pending => return Poll::Pending,
                    }
                }
                other => return Poll::Ready(other),
            }
        });
        match res {
            Some(r) => r,
            None => Err(EnqueueError::Full(chunk.unwrap_or_default())),
        }
    }

    /// Dequeues, waiting at most `timeout` (`None`: as long as it takes) for a chunk or
    /// the end of stream; `Ok(Dequeued::Empty)` on timeout.
    pub fn dequeue_blocking(&self, timeout: Option<Duration>) -> Result<Dequeued, ChannelError> {
        match block_on(timeout, |cx| self.shared.poll_dequeue(cx)) {
            None => Ok(Dequeued::Empty),
            Some(Ok(Some(c))) => Ok(Dequeued::Chunk(c)),
            Some(Ok(None)) => Ok(Dequeued::Finished),
            Some(Err(e)) => Err(e),
        }
    }

    /// Waits until every enqueued byte has been handed to TCP (not acknowledged: see
    /// [`stats`](Channel::stats) for that), at most `timeout`.
    pub fn flush_blocking(&self, timeout: Option<Duration>) -> Result<(), ChannelError> {
        block_on(timeout, |cx| self.shared.poll_flushed(cx))
            .unwrap_or(Err(ChannelError::WouldBlockTimeout))
    }

    /// Ends the sending direction: a FIN follows every chunk already enqueued. Receiving
    /// goes on until the peer closes.
    pub fn close(&self) {
        self.shared.close_requested.store(true, Ordering::Release);
        self.shared.signal.notify();
    }

    /// Destroys the channel now: queued data is dropped and the peer gets a reset.
    pub fn abort(&self) {
        self.shared.abort_requested.store(true, Ordering::Release);
        self.shared.signal.notify();
    }

    /// Changes TCP options of the channel's connection after creation: buffer sizes,
    /// MSS clamp, user timeout, keep-alive (see [`OptionChanges`] and the
    /// [`Connection`](crate::tcp::Connection) setters it names for what each does). The
    /// channel's thread applies them at its next round; changes requested before it
    /// does are merged, the later ones winning. Options of a connection that is gone are
    /// ignored.
    pub fn set_options(&self, changes: OptionChanges) {
        self.shared.request_options(changes);
    }

    /// Our address of the connection.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.shared.local
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddrV4 {
        self.shared.peer
    }

    /// The NIC queue (and so the channel thread) the channel lives on.
    pub fn queue(&self) -> u32 {
        self.shared.queue
    }

    /// Where the channel is in its life.
    pub fn state(&self) -> ChannelState {
        self.shared.state()
    }

    /// Queue occupancy and the TCP connection's latest snapshot.
    pub fn stats(&self) -> ChannelStats {
        self.shared.stats()
    }

    /// The connection's 4-tuple, queue and sequence numbers as its thread last published
    /// them, for diagnostics and fault-injection tests (see [`ChannelWire`]).
    pub fn wire(&self) -> ChannelWire {
        self.shared.wire()
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        if !self.shared.close_requested() {
            self.abort();
        }
    }
}

impl ChannelTransport for Channel {
    fn enqueue(&self, chunk: Bytes) -> Result<(), EnqueueError> {
        Channel::enqueue(self, chunk)
    }
    fn set_options(&self, changes: OptionChanges) {
        Channel::set_options(self, changes)
    }
    fn enqueue_deferred(&self, chunk: Bytes) -> Result<Option<DeferredKick>, EnqueueError> {
        Channel::enqueue_deferred(self, chunk)
    }
    fn enqueue_behind(&self, chunk: Bytes) -> Result<(), EnqueueError> {
        Channel::enqueue_behind(self, chunk)
    }
    fn dequeue(&self) -> Result<Dequeued, ChannelError> {
        Channel::dequeue(self)
    }
    fn poll_enqueue_ready(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        Channel::poll_enqueue_ready(self, cx)
    }
    fn poll_dequeue(&self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ChannelError>> {
        Channel::poll_dequeue(self, cx)
    }
    fn close(&self) {
        Channel::close(self)
    }
    fn abort(&self) {
        Channel::abort(self)
    }
    fn stats(&self) -> ChannelStats {
        Channel::stats(self)
    }
    fn wire(&self) -> Option<ChannelWire> {
        Some(Channel::wire(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn shared(tx: Limits, rx: Limits) -> Arc<ChannelShared> {
        let a = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1);
        Arc::new(ChannelShared::new(
            a,
            a,
            0,
            tx,
            rx,
            Arc::new(ThreadSignal::new().unwrap()),
        ))
    }

    const L: Limits = Limits {
        chunks: 4,
        bytes: 10,
    };

    /// An inline round's timer kicks a sleeping thread only when the thread's planned
    /// wake-up would make it late by more than a quarter of its delay.
    #[test]
    fn an_inline_timer_kicks_a_sleeping_thread_only_when_it_would_be_late() {
        let sig = ThreadSignal::new().unwrap();
        let kicked = |sig: &ThreadSignal| sig.eventfd().read().is_ok();
        assert!(sig.prepare_sleep());
        sig.set_planned(Some(Instant::from_micros(10_000)));
        let now = Instant::ZERO;
        // Due at 8 ms, the thread wakes at 10 ms: 2 ms late, a quarter of 8 ms.
        sig.after_inline(Some(Instant::from_micros(8_000)), now);
        assert!(!kicked(&sig), "a timer barely earlier than the wake-up");
        sig.after_inline(None, now);
        assert!(!kicked(&sig), "no timer");
        // Due at 5 ms: 5 ms late would be twice its delay.
        sig.after_inline(Some(Instant::from_micros(5_000)), now);
        assert!(kicked(&sig), "a timer due well before the wake-up");
        // A thread that is awake is never kicked; it looks again (`inline_ran`), and
        // does not sleep before it has.
        sig.awake();
        sig.after_inline(Some(Instant::from_micros(1)), now);
        assert!(!kicked(&sig));
        assert!(
            !sig.take_pending(),
            "an inline round is not work for the thread"
        );
        assert!(!sig.prepare_sleep(), "it looks at the timers first");
        sig.awake();
        assert!(sig.take_inline_ran());
        assert!(!sig.take_inline_ran());
        assert!(sig.prepare_sleep());
        // The timer the last inline round left, for the thread to read without the lock.
        assert_eq!(sig.inline_timer(), None);
        sig.set_inline_timer(Some(Instant::from_micros(7_000)));
        assert_eq!(sig.inline_timer(), Some(Instant::from_micros(7_000)));
        sig.set_inline_timer(None);
        assert_eq!(sig.inline_timer(), None);
    }

    #[test]
    fn tx_limits_hand_chunks_back() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        // An oversized chunk enters an empty queue; then the queue is full.
        ch.enqueue(Bytes::from(vec![0; 20])).unwrap();
        match ch.enqueue(Bytes::from_static(b"x")) {
            Err(EnqueueError::Full(c)) => assert_eq!(&c[..], b"x"),
            other => panic!("{other:?}"),
        }
        assert_eq!(ch.stats().tx_queued, 20);
        let c = s.pop_tx().unwrap();
        s.tx_taken(c.len());
        for _ in 0..4 {
            ch.enqueue(Bytes::from_static(b"ab")).unwrap();
        }
        // Chunk limit.
        assert!(matches!(
            ch.enqueue(Bytes::from_static(b"a")),
            Err(EnqueueError::Full(_))
        ));
        ch.close();
        assert!(matches!(
            ch.enqueue(Bytes::from_static(b"a")),
            Err(EnqueueError::Closed(ChannelError::Closed))
        ));
    }

    /// Whether the thread behind `s` was told there is work (its `pending` flag, taken),
    /// and whether it was kicked (its eventfd, drained).
    fn told_and_kicked(s: &ChannelShared) -> (bool, bool) {
        let kicked = s.signal.eventfd().read().is_ok();
        (s.signal.take_pending(), kicked)
    }

    /// A payload queued behind its header's batch, whose deferred kick the caller still
    /// holds, wakes nobody while the queue stays within the inline limit (the kick sends
    /// both); beyond it, the sleeping thread is kicked at once (bulk). A chunk queued
    /// behind others without a held kick (`enqueue_deferred`) kicks it, as before: before
    /// `enqueue_behind`, that woke the channel thread on every message whose payload is
    /// queued on its own (over 4 KB), 0.37-0.6x kernel TCP's request rate for 5-8 KB.
    #[test]
    fn a_payload_behind_a_held_kick_wakes_nobody_within_the_inline_limit() {
        let big = Limits {
            chunks: 16,
            bytes: 1 << 20,
        };
        let s = shared(big, big);
        s.signal.set_inline_max(16 * 1024);
        let ch = Channel::new(s.clone());
        assert!(s.signal.prepare_sleep(), "the thread goes to sleep");
        let kick = ch
            .enqueue_deferred(Bytes::from(vec![1; 24]))
            .unwrap()
            .expect("a small chunk into an empty queue hands its kick back");
        assert_eq!(told_and_kicked(&s), (false, false));
        ch.enqueue_behind(Bytes::from(vec![2; 8192])).unwrap();
        assert_eq!(
            told_and_kicked(&s),
            (false, false),
            "8 KB behind a held kick: one message"
        );
        ch.enqueue_behind(Bytes::from(vec![3; 16 * 1024])).unwrap();
        assert_eq!(
            told_and_kicked(&s),
            (true, true),
            "over the inline limit: the thread takes the queue now"
        );
        ch.enqueue_deferred(Bytes::from(vec![4; 100])).unwrap();
        assert_eq!(
            told_and_kicked(&s),
            (true, true),
            "a chunk behind others without a held kick"
        );
        // Every chunk is queued, in order.
        let sizes: Vec<usize> = std::iter::from_fn(|| s.pop_tx()).map(|c| c.len()).collect();
        assert_eq!(sizes, vec![24, 8192, 16 * 1024, 100]);
        drop(kick);
        // A payload of exactly the limit with its header is still one message.
        let s = shared(big, big);
        s.signal.set_inline_max(16 * 1024);
        let ch = Channel::new(s.clone());
        assert!(s.signal.prepare_sleep());
        let kick = ch.enqueue_deferred(Bytes::from(vec![1; 24])).unwrap();
        assert!(kick.is_some());
        ch.enqueue_behind(Bytes::from(vec![2; 16 * 1024])).unwrap();
        assert_eq!(told_and_kicked(&s), (false, false), "16 KiB and its header");
    }

    /// A waker that counts its wake-ups.
    struct CountWaker(std::sync::atomic::AtomicUsize);

    impl Wake for CountWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_blocked_writer_is_woken_at_half_the_queue() {
        let s = shared(
            Limits {
                chunks: 8,
                bytes: 80,
            },
            L,
        );
        let ch = Channel::new(s.clone());
        for _ in 0..8 {
            ch.enqueue(Bytes::from(vec![0; 10])).unwrap();
        }
        let count = Arc::new(CountWaker(std::sync::atomic::AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(ch.poll_enqueue_ready(&mut cx).is_pending());
        let take = || {
            let c = s.pop_tx().unwrap();
            s.tx_taken(c.len());
            s.wake_tx_at_low_water();
            count.0.load(Ordering::SeqCst)
        };
        // Room for one chunk is not worth a wake-up yet; half the queue is.
        for _ in 0..3 {
            assert_eq!(take(), 0);
        }
        assert_eq!(take(), 1);
        assert!(ch.poll_enqueue_ready(&mut cx).is_ready());
    }

    #[test]
    fn option_changes_merge_into_one_pending_value_and_wake_the_thread() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        assert_eq!(s.take_options(), None);
        // An empty batch is no work.
        ch.set_options(OptionChanges::new());
        assert!(!s.signal.take_pending());
        assert_eq!(s.take_options(), None);
        ch.set_options(
            OptionChanges::new()
                .send_buffer(1 << 20)
                .keepalive(Some(Duration::from_secs(5))),
        );
        assert!(s.signal.take_pending(), "the thread is told");
        ch.set_options(
            OptionChanges::new()
                .send_buffer(1 << 21)
                .mss_clamp(Some(1200)),
        );
        let want = OptionChanges::new()
            .send_buffer(1 << 21)
            .mss_clamp(Some(1200))
            .keepalive(Some(Duration::from_secs(5)));
        assert_eq!(s.take_options(), Some(want));
        assert_eq!(s.take_options(), None, "taken once");
    }

    #[test]
    fn dequeue_tells_empty_finished_and_failure_apart() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        assert_eq!(ch.dequeue().unwrap(), Dequeued::Empty);
        s.push_rx(Bytes::from_static(b"hi"));
        s.finish_rx();
        assert_eq!(
            ch.dequeue().unwrap(),
            Dequeued::Chunk(Bytes::from_static(b"hi"))
        );
        assert_eq!(ch.dequeue().unwrap(), Dequeued::Finished);
        assert_eq!(ch.dequeue().unwrap(), Dequeued::Finished);

        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        s.push_rx(Bytes::from_static(b"x"));
        s.fail(Failure::Reset);
        assert!(matches!(ch.dequeue(), Ok(Dequeued::Chunk(_))));
        assert!(matches!(ch.dequeue(), Err(ChannelError::Reset)));
        assert!(matches!(
            ch.enqueue(Bytes::from_static(b"a")),
            Err(EnqueueError::Closed(ChannelError::Reset))
        ));
    }

    #[test]
    fn a_full_rx_queue_blocks_until_dequeued() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        s.push_rx(Bytes::from(vec![1; 10]));
        assert_eq!(s.rx_room(), 0);
        assert!(s.block_rx());
        assert!(!s.signal.take_pending());
        assert!(matches!(ch.dequeue(), Ok(Dequeued::Chunk(_))));
        // The dequeue that made room told the thread.
        assert!(s.signal.take_pending());
        assert_eq!(s.rx_room(), 10);
        assert!(!s.block_rx());
    }

    #[test]
    fn blocking_dequeue_wakes_on_push_and_times_out() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        assert_eq!(
            ch.dequeue_blocking(Some(Duration::from_millis(5))).unwrap(),
            Dequeued::Empty
        );
        let pusher = {
            let s = s.clone();
            std::thread::spawn(move || {
                s.push_rx(Bytes::from_static(b"late"));
                s.wake_rx();
            })
        };
        let got = ch.dequeue_blocking(Some(Duration::from_secs(10))).unwrap();
        pusher.join().unwrap();
        assert_eq!(got, Dequeued::Chunk(Bytes::from_static(b"late")));
    }

    #[test]
    fn stats_snapshots_round_trip() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        let t = Traffic {
            cwnd: 14600,
            srtt_us: Some(250),
            retransmitted_segments: 3,
            bytes_in_flight: 2920,
            send_queue: 5000,
            recv_queue: 7,
            ..Traffic::default()
        };
        let seq = WireSeq {
            rcv_nxt: 0xfffe_0001,
            snd_nxt: 77,
        };
        s.publish(&t, seq, Instant::from_millis(9));
        let w = ch.wire();
        assert_eq!(
            (w.local, w.peer, w.queue, w.rcv_nxt, w.snd_nxt),
            (s.local, s.peer, s.queue, 0xfffe_0001, 77)
        );
        assert_eq!(w.updated_at, Instant::from_millis(9));
        let st = ch.stats();
        assert_eq!(st.cwnd, 14600);
        assert_eq!(st.srtt, Some(Duration::from_micros(250)));
        assert_eq!(st.retransmitted_segments, 3);
        assert_eq!(
            (st.bytes_in_flight, st.tx_tcp_queued, st.rx_tcp_queued),
            (2920, 5000, 7)
        );
        assert_eq!(st.updated_at, Instant::from_millis(9));
        // Once closed (the connection removed, no later snapshot), nothing is in TCP's
        // buffers any more; the counters stay.
        s.set_closed();
        let st = ch.stats();
        assert_eq!(
            (st.bytes_in_flight, st.tx_tcp_queued, st.rx_tcp_queued),
            (0, 0, 0)
        );
        assert_eq!(st.retransmitted_segments, 3);
    }

    #[test]
    fn a_killed_queue_is_served_by_nobody() {
        let sig = Arc::new(ThreadSignal::new().unwrap());
        let poller = RxPoller {
            queue: 3,
            signal: sig.clone(),
        };
        assert!(!poller.is_dead());
        sig.request_kill();
        // Dead from the request on, before the thread has even looked: no inline round
        // (receive or transmit) may run the queue in its place.
        assert!(sig.kill_requested() && poller.is_dead());
        assert!(!poller.poll_now());
        assert!(!super::super::thread::run_inline_marked(&sig, true));
        // Nor is a chunk handed to a holder of its round.
        assert_eq!(
            super::super::thread::send_inline(&sig),
            super::super::thread::InlineSend::No
        );
        sig.set_dead();
        assert!(poller.is_dead());
        // The request woke the thread: it must not sleep through it.
        assert!(!sig.prepare_sleep());
    }

    #[test]
    fn signal_only_kicks_sleepers() {
        let sig = ThreadSignal::new().unwrap();
        sig.notify();
        // Work is pending: the thread must not go to sleep.
        assert!(!sig.prepare_sleep());
        assert!(sig.take_pending());
        assert!(sig.prepare_sleep());
        sig.notify();
        // The sleeper was kicked: the eventfd is readable.
        assert_eq!(sig.eventfd().read().unwrap(), 1);
        sig.awake();
    }
}
