//! The queue driver: one future that owns a NIC queue's state and runs its rounds, and
//! the receive sink through which it hands a channel's bytes to their consumer.
//!
//! A [`QueueDriver`] is spawned on a tokio runtime (which one is a placement decision,
//! `placement.rs`). Its poll waits on three things only, and a fourth while the link's
//! socket is full:
//!
//! - the link's arrivals: the socket's readiness (AF_XDP, AF_PACKET) through an `AsyncFd`
//!   the driver registers with its own runtime's reactor (an in-memory link wakes a waker
//!   instead);
//! - the queue's [`QueueSignal`], woken by every enqueue, command, forwarded frame and
//!   resume;
//! - a timer at the interface's next deadline (TCP's retransmission, delayed-ACK, probe
//!   and keep-alive timers);
//! - room to send, while the link holds frames its socket refused
//!   ([`QueueLink::tx_blocked`](crate::link::QueueLink::tx_blocked): an AF_PACKET send
//!   buffer that was full): the same descriptor, registered for writability too.
//!
//! # Waiting for room to send
//!
//! An AF_PACKET link keeps the frames a full send buffer refused and lends no more tx
//! buffers until they are out. The interface then asks to be polled again at once (its
//! next deadline is the round's own time), which the driver would obey by running rounds
//! back to back, a `sendmmsg` each that fails again, until the kernel drained the buffer:
//! a spin, for as long as the device takes. And when the interface had nothing more to
//! send, the refused frames would wait for the next arrival or timer: a stall. The kernel
//! announces room itself (the socket polls writable once the buffer is half empty), so
//! while the link is blocked the driver waits for that, as it waits for readability, and
//! takes a deadline no later than its last round's time as the interface's request to
//! retry, which that wait answers. Writability is asked only while the link is blocked
//! (the registration is replaced when that changes, two `epoll_ctl` calls): registered
//! for good, every skb the kernel frees would report the socket writable again and wake
//! the runtime's reactor, once per frame sent, for a driver that waits for nothing of
//! the kind.
//!
//! When woken it runs rounds until the queue is settled, at most [`ROUNDS_PER_POLL`] per
//! poll (a work limiter, so that a flood on one queue cannot hold its runtime's thread:
//! past the limit the driver wakes itself and yields), then registers again and returns
//! `Pending`. Received bytes go to each channel's [`RxSink`] from inside the round, so the
//! consumer's work (deframing, handing chunks to sockets, waking their tasks) is done
//! where the bytes arrive, with no other thread or task in between. Nothing but the
//! driver runs a queue's round.
//!
//! The state sits in a [`QueueSlot`] behind a mutex that the driver takes for the length
//! of a poll: uncontended, except when the queue moves to another runtime
//! ([`QueueSlot::spawn_driver`]: a new driver with a new generation; the old one sees the
//! generation change under the lock at its next poll and ends, dropping its registration)
//! or when the set stops or kills it ([`QueueSlot::revoke`]).

use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::Sleep;
use tracing::{debug, warn};

use super::clock::RuntimeClock;
use super::round::QueueState;
use super::signal::QueueSignal;
use crate::time::{Duration, Instant};

/// Most rounds one poll of a driver runs before it yields (its runtime's other tasks run,
/// and the driver is polled again). A round handles at most a link batch of frames each
/// way, so this bounds a poll to a few hundred frames.
pub const ROUNDS_PER_POLL: usize = 32;

/// How a driver waits for frames when its runtime cannot register the link's descriptor
/// (a runtime without I/O): it looks this often.
const RX_FALLBACK_TICK: Duration = Duration::from_millis(1);

/// One NIC queue as its drivers hold it: the state, the signal, and which driver may run
/// rounds now (its generation). Shared by the set and the current driver.
pub(crate) struct QueueSlot {
    pub(crate) queue: u32,
    /// The link's readiness descriptor, if it has one (fixed for the life of the link).
    pub(crate) rx_fd: Option<RawFd>,
    pub(crate) signal: Arc<QueueSignal>,
    state: Mutex<QueueState>,
    /// Bumped for every new driver and for every revocation: a driver whose generation is
    /// not the slot's ends at its next poll.
    generation: AtomicU64,
    clock: RuntimeClock,
    /// Where a driver goes whose runtime cannot drive it (no I/O or no timers).
    fallback: Mutex<Option<tokio::runtime::Handle>>,
    /// Nanoseconds spent in polls that ran rounds, whatever runtime ran them.
    pub(crate) busy_ns: AtomicU64,
    /// Rounds run.
    pub(crate) rounds: AtomicU64,
    /// Polls of the queue's drivers.
    pub(crate) polls: AtomicU64,
    /// When the last poll ran (microseconds of the set's clock, plus one; 0: never).
    last_poll: AtomicU64,
    /// The current driver was dropped by its runtime (which stopped, or shut down while
    /// the driver was spawned on it): nobody drives the queue until the set's watchdog
    /// places it again.
    orphaned: AtomicBool,
}

impl std::fmt::Debug for QueueSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueSlot")
            .field("queue", &self.queue)
            .field("generation", &self.generation.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl QueueSlot {
    pub(crate) fn new(
        queue: u32,
        signal: Arc<QueueSignal>,
        state: QueueState,
        clock: RuntimeClock,
    ) -> QueueSlot {
        QueueSlot {
            queue,
            rx_fd: state.rx_fd(),
            signal,
            state: Mutex::new(state),
            generation: AtomicU64::new(0),
            clock,
            fallback: Mutex::new(None),
            busy_ns: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            polls: AtomicU64::new(0),
            last_poll: AtomicU64::new(0),
            orphaned: AtomicBool::new(false),
        }
    }

    /// The state, for the set's own uses (stop, kill, diagnostics); waits for a poll in
    /// progress.
    pub(crate) fn lock_state(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state if no driver is polling it right now.
    pub(crate) fn try_lock_state(&self) -> Option<MutexGuard<'_, QueueState>> {
        match self.state.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Where a driver goes when its runtime cannot drive it.
    pub(crate) fn set_fallback(&self, handle: tokio::runtime::Handle) {
        *self.fallback.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    /// Spawns a driver of this queue on `handle`; the driver before it (if any) ends at
    /// its next poll (it is woken for that), and the queue's wake-ups reach the new one
    /// from its first poll, which runs a round at once.
    pub(crate) fn spawn_driver(self: &Arc<Self>, handle: &tokio::runtime::Handle) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.signal.wake_driver();
        handle.spawn(QueueDriver::new(self.clone(), generation));
    }

    /// Ends whatever driver the queue has (at its next poll) and hands the state to the
    /// caller, once any poll in progress is over: for stopping or killing the queue
    /// without waiting for a runtime that may be busy or gone.
    pub(crate) fn revoke(&self) -> MutexGuard<'_, QueueState> {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.signal.wake_driver();
        self.lock_state()
    }

    /// When a driver last polled the queue (the set's clock); `None`: never.
    pub(crate) fn last_poll(&self) -> Option<Instant> {
        match self.last_poll.load(Ordering::Relaxed) {
            0 => None,
            v => Some(Instant::from_micros(v - 1)),
        }
    }

    /// Whether the queue's driver was dropped by its runtime since the last call (see
    /// [`QueueDriver`]'s `Drop`); clears the mark.
    pub(crate) fn take_orphaned(&self) -> bool {
        self.orphaned.swap(false, Ordering::AcqRel)
    }

    fn is_current(&self, generation: u64) -> bool {
        self.generation.load(Ordering::Acquire) == generation
    }
}

/// The link's descriptor as the runtime's reactor sees it: the socket stays owned by the
/// link (in the queue's state, which the driver keeps alive); this only names it.
struct LinkFd(RawFd);

impl AsRawFd for LinkFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// How the driver learns of arrivals (and of room to send).
enum RxWait {
    /// Not set up yet (the first poll does, on the driving runtime).
    Unset,
    /// The link's descriptor, registered with this runtime's reactor for readability, and
    /// for writability too while `writable` (the link is blocked; see the
    /// [module documentation](self#waiting-for-room-to-send)).
    Fd {
        afd: AsyncFd<LinkFd>,
        writable: bool,
    },
    /// The link wakes the driver's waker itself (in-memory links).
    Waker,
    /// Neither works here: look every [`RX_FALLBACK_TICK`].
    Tick,
}

/// The future that drives one queue. See the [module documentation](self).
pub(crate) struct QueueDriver {
    // Dropped first: the registration names the socket that `slot` keeps open.
    rx: RxWait,
    slot: Arc<QueueSlot>,
    generation: u64,
    timer: Option<Pin<Box<Sleep>>>,
    /// The deadline the timer is armed for.
    timer_at: Option<Instant>,
}

impl QueueDriver {
    fn new(slot: Arc<QueueSlot>, generation: u64) -> QueueDriver {
        QueueDriver {
            slot,
            generation,
            rx: RxWait::Unset,
            timer: None,
            timer_at: None,
        }
    }

    /// Sets up the wait for arrivals on the driving runtime. `false` when this runtime
    /// cannot drive a queue (it has no timers).
    fn set_up(&mut self, st: &QueueState) -> bool {
        // A runtime built without timers (or without I/O) panics at their first use
        // instead of returning an error: ask once, here, and let the queue go elsewhere.
        let timers = std::panic::catch_unwind(|| {
            drop(tokio::time::sleep(std::time::Duration::ZERO));
        });
        if timers.is_err() {
            return false;
        }
        self.rx = match st.rx_fd() {
            None => RxWait::Waker,
            Some(fd) => {
                let reg = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    // SAFETY: as in `register`.
                    unsafe { register(fd, false) }
                }));
                match reg {
                    Ok(Ok(afd)) => RxWait::Fd {
                        afd,
                        writable: false,
                    },
                    Ok(Err(e)) => {
                        // EEXIST: the previous driver on this runtime has not let go yet.
                        debug!(queue = self.slot.queue, error = %e, "registering the queue's descriptor; looking every tick until it can");
                        RxWait::Tick
                    }
                    Err(_) => {
                        warn!(
                            queue = self.slot.queue,
                            "the driving runtime has no I/O; the queue is polled every tick"
                        );
                        RxWait::Tick
                    }
                }
            }
        };
        true
    }

    /// Arms the timer for `at` (only when earlier than what it is armed for, or when it
    /// fired: a later deadline lets the armed timer fire early and look again, which is
    /// cheaper than moving it on every message that pushes TCP's timers back). Returns
    /// whether it is due already.
    fn arm(&mut self, at: Instant, cx: &mut Context<'_>) -> bool {
        let deadline = self.slot.clock.deadline(at);
        let timer = match &mut self.timer {
            Some(t) => {
                if self.timer_at.is_none_or(|armed| at < armed) {
                    t.as_mut().reset(deadline);
                    self.timer_at = Some(at);
                }
                t
            }
            None => {
                self.timer_at = Some(at);
                self.timer
                    .insert(Box::pin(tokio::time::sleep_until(deadline)))
            }
        };
        if timer.as_mut().poll(cx).is_ready() {
            self.timer_at = None;
            return true;
        }
        false
    }

    /// Runs rounds until the queue settles or the work limit is reached; registers for
    /// every wake-up. Returns `Ready` when this driver is to end.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let slot = self.slot.clone();
        if !slot.is_current(self.generation) {
            return Poll::Ready(());
        }
        let mut st = slot.lock_state();
        // Checked again under the lock: a revocation or a newer driver took the queue
        // while this poll waited for it.
        if !slot.is_current(self.generation) {
            return Poll::Ready(());
        }
        slot.signal.register(cx.waker());
        if matches!(self.rx, RxWait::Unset) && !self.set_up(&st) {
            drop(st);
            return self.move_to_fallback();
        }
        // One reading of the clock serves the first round, and the last reading (a round's
        // or the timers') ends the busy span: three readings fewer per poll than reading
        // for each use (callgrind of a one-connection exchange: a clock reading costs
        // about as much as a tenth of a round, and every message polls two drivers).
        let started = tokio::time::Instant::now();
        let mut reading = Some(started);
        let mut last_reading;
        slot.polls.fetch_add(1, Ordering::Relaxed);
        let mut rounds = 0;
        let mut last_round;
        loop {
            // Rounds until settled.
            let settled = loop {
                slot.signal.take_pending();
                last_reading = reading.take().unwrap_or_else(tokio::time::Instant::now);
                let now = slot.clock.at(last_reading);
                last_round = now;
                let active = st.round(now);
                rounds += 1;
                let quiet = !active || st.settled_until(now).is_some();
                if quiet && !slot.signal.is_pending() {
                    break true;
                }
                if rounds >= ROUNDS_PER_POLL {
                    break false;
                }
            };
            if !settled {
                // The work limiter: yield, and come back after the runtime's other tasks.
                cx.waker().wake_by_ref();
                break;
            }
            // Arrivals.
            match &mut self.rx {
                RxWait::Fd { afd, .. } => match afd.poll_read_ready(cx) {
                    Poll::Ready(Ok(mut guard)) => {
                        // Frames the rounds left, or an edge that came after them: another
                        // round. Otherwise the rounds drained the ring: clear the readiness
                        // and register for the next edge, without a round that would find
                        // nothing (callgrind of a one-connection 64-byte exchange: 5.9
                        // rounds per request with that round, 4.1 without).
                        let again = st.rx_ready() || {
                            guard.clear_ready();
                            drop(guard);
                            afd.poll_read_ready(cx).is_ready()
                        };
                        if again {
                            if rounds < ROUNDS_PER_POLL {
                                continue;
                            }
                            cx.waker().wake_by_ref();
                            break;
                        }
                    }
                    Poll::Ready(Err(e)) => {
                        warn!(queue = slot.queue, error = %e, "waiting for the queue's descriptor failed; polling every tick");
                        self.rx = RxWait::Tick;
                    }
                    Poll::Pending => {}
                },
                RxWait::Waker => {
                    st.register_rx_waker(cx.waker());
                    if st.rx_ready() {
                        if rounds < ROUNDS_PER_POLL {
                            continue;
                        }
                        cx.waker().wake_by_ref();
                        break;
                    }
                }
                RxWait::Tick | RxWait::Unset => {}
            }
            // Room to send.
            let blocked = st.worker.iface.link().tx_blocked();
            if self.want_writable(blocked) {
                if let RxWait::Fd { afd, .. } = &mut self.rx {
                    match afd.poll_write_ready(cx) {
                        Poll::Ready(Ok(mut guard)) => {
                            // The round's flush finds out whether the room is enough; if
                            // not, the next edge wakes the driver again.
                            guard.clear_ready();
                            if rounds < ROUNDS_PER_POLL {
                                continue;
                            }
                            cx.waker().wake_by_ref();
                            break;
                        }
                        Poll::Ready(Err(e)) => {
                            warn!(queue = slot.queue, error = %e, "waiting for room on the queue's descriptor failed; polling every tick");
                            self.rx = RxWait::Tick;
                        }
                        Poll::Pending => {}
                    }
                }
            }
            // Timers (and the tick of a driver that cannot wait for arrivals).
            last_reading = tokio::time::Instant::now();
            let now = slot.clock.at(last_reading);
            let mut next = st.poll_at();
            if blocked && matches!(self.rx, RxWait::Fd { writable: true, .. }) {
                // A deadline at the last round's time or before is the interface asking
                // to retry the transmit the link refused (or a timer that round ran
                // already): writability answers it. Later timers still count, and the
                // interface's own `poll_at` would hide them behind its retry, so they are
                // looked up.
                if next.is_some_and(|at| at <= last_round) {
                    next = connection_timers_after(&st, last_round);
                }
            }
            if matches!(self.rx, RxWait::Tick) {
                let tick = now + RX_FALLBACK_TICK;
                next = Some(next.map_or(tick, |n| n.min(tick)));
            }
            match next {
                Some(at) if at <= now || self.arm(at, cx) => {
                    if rounds < ROUNDS_PER_POLL {
                        continue;
                    }
                    cx.waker().wake_by_ref();
                    break;
                }
                _ => break,
            }
        }
        drop(st);
        slot.rounds.fetch_add(rounds as u64, Ordering::Relaxed);
        let ns = u64::try_from(last_reading.duration_since(started).as_nanos()).unwrap_or(u64::MAX);
        slot.busy_ns.fetch_add(ns, Ordering::Relaxed);
        slot.last_poll.store(
            slot.clock.at(last_reading).total_micros() + 1,
            Ordering::Relaxed,
        );
        Poll::Pending
    }

    /// Whether to wait for the link's descriptor to poll writable: while the link is
    /// `blocked`, on a descriptor registered for it (the registration is replaced when
    /// that changes; see the [module documentation](self#waiting-for-room-to-send)).
    fn want_writable(&mut self, blocked: bool) -> bool {
        let RxWait::Fd { afd, writable } = &mut self.rx else {
            return false;
        };
        if *writable == blocked {
            return blocked;
        }
        let fd = afd.get_ref().0;
        // Deregistered first: one descriptor is registered once per reactor.
        let old = std::mem::replace(&mut self.rx, RxWait::Unset);
        drop(old);
        // SAFETY: as in `register`.
        self.rx = match unsafe { register(fd, blocked) } {
            Ok(afd) => RxWait::Fd {
                afd,
                writable: blocked,
            },
            Err(e) => {
                warn!(queue = self.slot.queue, error = %e, "registering the queue's descriptor again; polling every tick");
                RxWait::Tick
            }
        };
        blocked && matches!(self.rx, RxWait::Fd { .. })
    }

    /// This runtime cannot drive the queue: a driver on the set's fallback runtime takes
    /// it, and this one ends.
    fn move_to_fallback(&mut self) -> Poll<()> {
        let fallback = self
            .slot
            .fallback
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match fallback {
            Some(h) => {
                warn!(
                    queue = self.slot.queue,
                    "the runtime the queue was placed on has no timers; the set's own runtime drives it"
                );
                self.slot.spawn_driver(&h);
            }
            None => warn!(
                queue = self.slot.queue,
                "the runtime the queue was placed on has no timers, and the set has no runtime of its own: the queue is not driven"
            ),
        }
        Poll::Ready(())
    }
}

/// Registers the link's descriptor `fd` with the current runtime's reactor, for
/// readability and, when `writable`, writability.
///
/// # Safety
///
/// `fd` is the link's socket, which the queue's state owns and keeps open for as long as
/// the driver's `slot` lives; the registration is kept in a field dropped before `slot`,
/// so it never outlives the socket.
unsafe fn register(fd: RawFd, writable: bool) -> std::io::Result<AsyncFd<LinkFd>> {
    let interest = if writable {
        Interest::READABLE | Interest::WRITABLE
    } else {
        Interest::READABLE
    };
    // SAFETY: upheld by the caller.
    unsafe { AsyncFd::register_with_interest(LinkFd(fd), interest) }.map_err(|e| e.into_parts().1)
}

/// The earliest timer of the queue's connections after `after`, without the interface's
/// request to retry a refused transmit (see the
/// [module documentation](self#waiting-for-room-to-send)). TIME-WAIT records are left
/// out: their expiry only frees memory, and waits for the next wake-up.
fn connection_timers_after(st: &QueueState, after: Instant) -> Option<Instant> {
    let iface = &st.worker.iface;
    iface
        .handles()
        .filter_map(|h| iface.conn(h)?.poll_timeout())
        .filter(|&t| t > after)
        .min()
}

impl Drop for QueueDriver {
    /// A driver ends on its own only once it is no longer current (moved, revoked): one
    /// dropped while still current was dropped by its runtime, which stopped (a runtime
    /// handed to the set that its owner shut down). The queue is marked so that the set's
    /// watchdog places it on a runtime of the set's own.
    fn drop(&mut self) {
        if self.slot.is_current(self.generation) {
            self.slot.orphaned.store(true, Ordering::Release);
        }
    }
}

impl Future for QueueDriver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.drive(cx)
    }
}
