//! The control task: one task per stack, on the stack's home queue runtime, that owns the
//! channels' comings and goings and does nothing per message.
//!
//! Per round it accepts channels on the channel port and runs their handshakes
//! (`incoming.rs`), watches plain-TCP channels closing, runs the shards' timers (connect
//! deadlines, lingering sockets, SYNC retries), drops the channels that died (their
//! sockets' chunks go again on the peer's other channels) and opens channels again to a
//! peer that lost its last one (`peers.rs`), carries out the scheduler's plans
//! (`plans.rs`), and wakes the tasks waiting for a goal or runs a graceful stop
//! (`drain.rs`). It sleeps until the channel listener, an incoming channel, a dying
//! channel, an application call that armed a timer or its next deadline wakes it.
//!
//! What it keeps behind the control lock ([`Control`]: accepted channels, peers, waiters,
//! a stop in progress, the plans' state) is plain data in `state/`, one file per concept
//! beside the file here that acts on it; the core holds that state without knowing the
//! task. The calls of the core that take the lock live here, with their concept.

mod drain;
mod hello;
mod incoming;
mod peers;
mod plans;
pub(super) mod state;

use std::future::Future;
use std::net::Ipv4Addr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use netdriver::channel::Channel;
use tracing::debug;

pub(crate) use state::drain::{Goal, StopOutcome};
pub use state::hello::HelloCounts;
pub use state::plans::PlanCounters;
pub(crate) use state::Control;

use super::core::Core;
use super::wake::Wakes;
use crate::endpoint::PeerId;
use state::peers::Peer;
use state::ClosingPlain;

/// Most accepted channels waiting for their preamble at once; past it the one that has
/// waited longest is aborted (a peer opening channels and never speaking must not fill
/// the queue's connection table, which our own connects share).
pub(crate) const MAX_PENDING_PREAMBLES: usize = 256;

/// How soon the control task looks again at a shard an application call held.
const SHARD_RETRY: Duration = Duration::from_millis(1);

/// Rounds the control task runs in one poll before it yields to its runtime.
const ROUNDS_PER_POLL: usize = 16;

impl Control {
    /// The id of the peer at `ip` (created on first use).
    fn peer_id(&mut self, ip: Ipv4Addr) -> PeerId {
        if let Some(p) = self.peers.get(&ip) {
            return p.id;
        }
        let id = PeerId(self.next_peer);
        self.next_peer += 1;
        self.peers.insert(ip, Peer::new(id));
        self.peer_ips.insert(id, ip);
        id
    }

    /// The address of a peer.
    pub(crate) fn peer_ip(&self, id: PeerId) -> Option<Ipv4Addr> {
        self.peer_ips.get(&id).copied()
    }

    /// Keeps a plain-TCP channel closed gracefully (its stream dropped) until its bytes
    /// and FIN are acknowledged and the peer's FIN is in, for `pending_tx_bytes` and to
    /// reset it if data arrives; at most the endpoint's `linger_timeout`, then it is reset
    /// (counted in `plain_linger_expired`).
    pub(crate) fn keep_closing_plain(&mut self, t: Channel) {
        let deadline = Instant::now() + self.linger_timeout;
        self.closing_plain.push(ClosingPlain {
            t,
            deadline,
            finished: false,
        });
    }

    /// Plain-TCP channels closed gracefully and still finishing.
    pub(crate) fn closing_plain(&self) -> usize {
        self.closing_plain.len()
    }

    /// Bytes the plain-TCP channels closing still hold towards their peers.
    pub(crate) fn closing_plain_pending(&self) -> usize {
        self.closing_plain
            .iter()
            .map(|c| super::core::channel_pending(&c.t))
            .sum()
    }

    /// Watches the plain-TCP channels closed gracefully (their streams dropped): a chunk
    /// arriving now has no reader, so the connection is reset, as a kernel resets a
    /// closed socket that receives data; one whose peer's FIN came and whose bytes are
    /// all acknowledged is let go (closed, not aborted).
    fn poll_closing_plain(&mut self, cx: &mut Context<'_>) {
        self.closing_plain.retain_mut(|c| {
            while !c.finished {
                match c.t.poll_dequeue(cx) {
                    Poll::Ready(Ok(Some(_))) => {
                        debug!("data for a closed plain-TCP stream; resetting");
                        c.t.abort();
                        return false;
                    }
                    Poll::Ready(Ok(None)) => c.finished = true,
                    Poll::Ready(Err(_)) => return false,
                    Poll::Pending => break,
                }
            }
            !(c.finished && super::core::channel_pending(&c.t) == 0)
        });
    }

    /// Resets closed plain-TCP channels past their linger deadline; returns the next
    /// such deadline.
    fn expire_plain(&mut self, now: Instant) -> Option<Instant> {
        let mut next = None;
        let plain_linger_expired = &mut self.plain_linger_expired;
        self.closing_plain.retain(|c| {
            if c.deadline <= now {
                debug!("closed plain-TCP stream lingered too long; resetting");
                c.t.abort();
                *plain_linger_expired += 1;
                return false;
            }
            next = Some(next.map_or(c.deadline, |n: Instant| n.min(c.deadline)));
            true
        });
        next
    }
}

impl Core {
    /// Keeps a plain-TCP channel closed gracefully (its stream dropped) until its bytes
    /// and FIN are acknowledged and the peer's FIN is in (see
    /// [`Control::keep_closing_plain`]); wakes the control task, which watches it.
    pub(crate) fn keep_closing_plain(&self, t: Channel) {
        self.ctl().keep_closing_plain(t);
        self.control.notify();
    }
}

/// The earlier of two optional deadlines.
pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The control task's future. See the [module documentation](self).
pub(crate) struct ControlTask {
    /// Taken when the task ends (see [`ControlTask::end`]).
    core: Option<Arc<Core>>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    timer_at: Option<Instant>,
}

impl ControlTask {
    pub(crate) fn new(core: Arc<Core>) -> ControlTask {
        ControlTask {
            core: Some(core),
            timer: None,
            timer_at: None,
        }
    }

    /// Ends the task: drops its handles on the core, then tells whoever waits for the stop
    /// ([`Core::stop_and_wait`]), so that the waiter's handle can be the core's last.
    fn end(&mut self, core: Arc<Core>) {
        let done = core.control_done();
        drop(core);
        self.core = None;
        done.signal();
    }

    /// Arms the timer for `at`; whether it is due already.
    fn arm(&mut self, at: Instant, cx: &mut Context<'_>) -> bool {
        let deadline = tokio::time::Instant::from_std(at);
        let timer = match &mut self.timer {
            Some(t) => {
                if self.timer_at != Some(at) {
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
}

impl Future for ControlTask {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(core) = self.core.clone() else {
            return Poll::Ready(());
        };
        core.control.register(cx.waker());
        for _ in 0..ROUNDS_PER_POLL {
            core.control.take();
            if core.control.stop_requested() {
                core.stop_now();
                self.end(core);
                return Poll::Ready(());
            }
            let mut wake = Wakes::default();
            let (busy, deadline, done) = core.control_round(cx, &mut wake);
            wake.drain_each(std::task::Waker::wake);
            if done {
                core.stop_now();
                debug!("stack control task stopped");
                self.end(core);
                return Poll::Ready(());
            }
            if busy {
                continue;
            }
            match deadline {
                Some(d) if d <= Instant::now() || self.arm(d, cx) => continue,
                _ => return Poll::Pending,
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Core {
    /// One control round; returns whether work is left over (run again at once), when it
    /// wants to run next, and whether the stack should stop now.
    fn control_round(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        wake: &mut Wakes,
    ) -> (bool, Option<Instant>, bool) {
        // New channels, their preambles, plain-TCP channels closing.
        let mut busy = {
            let mut ctl = self.ctl();
            let busy = self.accept_channels(&mut ctl, cx);
            ctl.poll_closing_plain(cx);
            busy
        };
        // Every shard's timers (and the output and events they make).
        let now = Instant::now();
        let mut deadline = None;
        let mut fin = super::core::Finish::default();
        let table = self.chans.load_full();
        for i in 0..self.shard_count() {
            // A shard an application call holds is not waited for: its timers run next
            // time.
            let Some(mut s) = self.try_lock_shard(i) else {
                deadline = earliest(deadline, Some(now + SHARD_RETRY));
                continue;
            };
            if s.stopped {
                continue;
            }
            deadline = earliest(deadline, s.expire(now, &mut fin.wake));
            self.finish_shard(s, &mut fin, &table);
        }
        drop(table);
        // A channel found dead while finishing is dropped below.
        fin.control = false;
        fin.run(self);
        let mut ctl = self.ctl();
        if self.reap_dead(&mut ctl) {
            busy = true;
        }
        if !ctl.reopen.is_empty() {
            self.reopen_channels(&mut ctl);
        }
        deadline = earliest(deadline, self.expire_incoming(&mut ctl, now));
        deadline = earliest(deadline, ctl.expire_plain(now));
        deadline = earliest(deadline, self.run_plans(&mut ctl, now));
        let (done, check) = self.check_waiters(&mut ctl, now, cx, wake);
        (busy, earliest(deadline, check), done)
    }
}
