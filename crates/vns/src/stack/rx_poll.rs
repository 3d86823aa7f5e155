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
//! The registration belongs to the runtime of the first task that waits with it (one
//! descriptor can be registered with one reactor). A task of another runtime, or a
//! runtime that has shut down, gets the channel thread's hand-off as before; so does any
//! task when the stack's backend has no AF_XDP queues (the in-memory backend).
//!
//! Only one task is woken per arrival (tokio keeps one reader waker per descriptor for
//! `poll_read_ready`): it feeds every channel's bytes to the endpoint, whose events wake
//! the other waiting tasks from that thread (see [`Core::pull`](super::driver::Core::pull)),
//! and a lease nobody serves (its task went away) ends after [`LEASE`], when the channel
//! thread takes the queue back.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use netdriver::channel::RxPoller;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tracing::{debug, warn};

/// How long a waiting task holds a queue's arrivals (renewed each time it waits): the
/// longest an arrival waits when the task that took the lease is gone.
pub(crate) const LEASE: Duration = Duration::from_millis(1);

/// Rounds a task runs per wait before it lets others run (arrivals that keep coming are
/// then served by the next wait, or by the channel thread).
const ROUNDS_PER_WAIT: usize = 4;

/// The queues of a stack's channel set, as its runtime waits on them.
pub(crate) struct RuntimeQueues {
    pollers: Vec<RxPoller>,
    /// The queues' descriptors registered with the first runtime that waited (`None`:
    /// registering failed, e.g. a runtime without I/O; the hand-off then stays as before).
    fds: OnceLock<Option<Vec<AsyncFd<OwnedFd>>>>,
    /// The registration stopped working (its runtime shut down).
    off: AtomicBool,
    /// Which sockets' tasks use it ([`RuntimeRx`] as a byte; changed by
    /// [`Stack::set_runtime_rx`](super::Stack::set_runtime_rx)).
    mode: AtomicU8,
    /// Queue rounds run by waiting tasks.
    rounds: AtomicU64,
}

/// Which tasks wait on the NIC queues in their own runtime and process arrivals there
/// (run-to-completion receive) instead of waiting for the queue's channel thread to
/// process them and wake the task ([`StackBuilder::runtime_rx`](super::StackBuilder::runtime_rx)).
///
/// Measured on the 2-core bed (`docs/performance.md`): a 4 KB ping-pong's p50 falls to
/// 0.6-0.85x with it, and a latency-class stream's matches a raw channel's; but an echo
/// server that answers partial reads at once, with 32-128 connections, loses up to a
/// third of its request rate, since the task wakes per frame where the channel thread
/// gathers a batch. Hence the default: latency-class sockets only.
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
        Some(RuntimeQueues {
            pollers,
            fds: OnceLock::new(),
            off: AtomicBool::new(false),
            mode: AtomicU8::new(mode.to_byte()),
            rounds: AtomicU64::new(0),
        })
    }

    /// The registered descriptors, registering them with the calling task's runtime on
    /// first use.
    fn fds(&self) -> Option<&[AsyncFd<OwnedFd>]> {
        if self.off.load(Ordering::Relaxed) {
            return None;
        }
        if let Some(fds) = self.fds.get() {
            return fds.as_deref();
        }
        // Not in a runtime (a blocking caller, another executor): try again later.
        tokio::runtime::Handle::try_current().ok()?;
        self.fds.get_or_init(|| self.register()).as_deref()
    }

    fn register(&self) -> Option<Vec<AsyncFd<OwnedFd>>> {
        let mut fds = Vec::with_capacity(self.pollers.len());
        for p in &self.pollers {
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
                Ok(Ok(fd)) => fds.push(fd),
                Ok(Err(e)) => {
                    warn!(error = %e, "registering an AF_XDP socket with the runtime; channel threads keep the receive hand-off");
                    return None;
                }
                Err(_) => {
                    warn!("the tokio runtime has no I/O driver (enable_io); channel threads keep the receive hand-off");
                    return None;
                }
            }
        }
        debug!(queues = fds.len(), "receive runs in the runtime");
        Some(fds)
    }

    /// Queue rounds that waiting tasks ran so far.
    pub(crate) fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    /// Changes which tasks use it (leases already given run out within [`LEASE`]).
    pub(crate) fn set_mode(&self, mode: RuntimeRx) {
        self.mode.store(mode.to_byte(), Ordering::Relaxed);
    }

    /// A task has nothing to read on a socket of class `latency` (it registered for the
    /// channels' hand-off already):
    /// runs the rounds of queues with arrivals on this thread and waits on the others
    /// with `cx`. Returns whether it ran a round (the caller looks for its bytes again).
    pub(crate) fn poll(&self, cx: &mut Context<'_>, latency: bool) -> bool {
        if !RuntimeRx::applies(self.mode.load(Ordering::Relaxed), latency) {
            return false;
        }
        let Some(fds) = self.fds() else {
            return false;
        };
        let mut ran = false;
        // One clock read for the leases of every queue this call waits on.
        let mut now = None;
        for (fd, poller) in fds.iter().zip(&self.pollers) {
            // A queue whose thread died (fault injection) is served by nobody: its socket
            // stays readable while frames pile up, and waiting on it would only spin,
            // since `poll_now` runs nothing for it. Its channels are already failed.
            if poller.is_dead() {
                continue;
            }
            for _ in 0..ROUNDS_PER_WAIT {
                match fd.poll_read_ready(cx) {
                    Poll::Ready(Ok(mut ready)) => {
                        // Cleared before the round: an arrival after this point makes
                        // the descriptor ready again.
                        ready.clear_ready();
                        if poller.poll_now() {
                            ran = true;
                            self.rounds.fetch_add(1, Ordering::Relaxed);
                        } else {
                            // The channel thread (or another task) is in a round that
                            // may have passed the ring before these frames came, and the
                            // readiness is spent: look again soon rather than leave them
                            // to the end of the lease.
                            cx.waker().wake_by_ref();
                        }
                    }
                    Poll::Ready(Err(e)) => {
                        debug!(error = %e, "the runtime's registration of the AF_XDP sockets failed; back to the channel threads");
                        self.off.store(true, Ordering::Relaxed);
                        return ran;
                    }
                    Poll::Pending => {
                        poller.lease_at(*now.get_or_insert_with(std::time::Instant::now), LEASE);
                        break;
                    }
                }
            }
        }
        ran
    }
}
