//! Waiting for the stack to drain, and stopping it: goals tasks wait for (everything
//! delivered, no channel left, so many channels, so many plans, stopped), the graceful
//! stop (no new streams; every open stream shut and drained; then the channels closed
//! with a FIN, and the stop complete once the peers have seen their end), and the stop
//! itself (every channel abandoned, every waiting task woken).

use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use netsched::{ChannelClass, ChannelId};
use tracing::{debug, warn};

use super::super::channel::Gone;
use super::super::core::{channel_pending, Core};
use super::super::wake::Wakes;
use super::earliest;
use super::state::drain::{Goal, StopOutcome, Stopping, Waiter};
use super::state::peers::Opening;
use super::state::Control;
use crate::endpoint::SocketId;

/// How often the control task re-reads `pending_tx_bytes` while a task waits for the
/// stack to drain.
const DRAIN_RECHECK: Duration = Duration::from_millis(2);

impl Control {
    /// Starts a graceful stop (the control lock held): no new channels, connects, binds
    /// or accepts (listeners stop listening, their queued connections are reset); every
    /// open stream's write side is shut (a FIN after its bytes). The control task then
    /// waits until everything is delivered, closes the channels (a FIN after their bytes)
    /// and stops once the peers have seen their end, or at `deadline`, aborting what is
    /// left. A second call can only bring the deadline forward. Returns whether the
    /// control task has work (the caller wakes it and `wake`).
    pub(crate) fn begin_stop(&mut self, core: &Core, deadline: Instant, wake: &mut Wakes) -> bool {
        if self.stopped {
            return false;
        }
        if let Some(s) = &mut self.stopping {
            s.deadline = s.deadline.min(deadline);
            return true;
        }
        debug!("stopping the stack gracefully");
        self.stopping = Some(Stopping {
            deadline,
            closed: false,
        });
        core.refuse_new();
        let acceptor = self.acceptor.take();
        for inc in self.incoming.drain(..) {
            inc.t.abort();
        }
        for p in self.peers.values_mut() {
            if let Opening::Running { waiters, .. } = &mut p.opening {
                waiters.drain(..).for_each(|w| wake.push(w));
            }
        }
        let mut fin = super::super::core::Finish::default();
        let table = core.chans.load();
        for i in 0..core.shard_count() {
            let mut s = core.lock_shard(i);
            for port in s.ep.listening_ports() {
                let _ = s.ep.unbind(port);
            }
            for l in s.listeners.values_mut() {
                wake.extend(l.take());
            }
            let sids: Vec<SocketId> = s.socks.keys().copied().collect();
            for sid in sids {
                let _ = s.ep.shutdown(sid);
            }
            for w in s.socks.values_mut() {
                wake.extend(w.read.take());
                wake.extend(w.write.take());
            }
            core.finish_shard(s, &mut fin, &table);
        }
        drop(table);
        fin.control = false;
        fin.run(core);
        drop(acceptor);
        true
    }

    /// Polls a wait for `goal`; `id` names the wait (given out on its first poll).
    pub(crate) fn poll_wait(
        &mut self,
        core: &Core,
        goal: Goal,
        id: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let ctl = self;
        let pos = id.and_then(|i| ctl.waiters.iter().position(|w| w.id == i));
        let reached = ctl.stopped
            || pos.is_some_and(|p| ctl.waiters[p].reached)
            || (goal == Goal::NoChannels
                && core.chans.load().is_empty()
                && ctl.closing_chans.is_empty())
            || goal == Goal::Channels(core.chans.load().len())
            || matches!(goal, Goal::Plans(k) if ctl.plans.counters.plans >= k);
        if reached {
            if let Some(p) = pos {
                ctl.waiters.swap_remove(p);
            }
            *id = None;
            return Poll::Ready(());
        }
        let w = cx.waker();
        match pos {
            Some(p) => {
                let slot = &mut ctl.waiters[p].waker;
                if !slot.as_ref().is_some_and(|old| old.will_wake(w)) {
                    *slot = Some(w.clone());
                }
            }
            None => {
                let i = ctl.next_waiter;
                ctl.next_waiter += 1;
                ctl.waiters.push(Waiter {
                    id: i,
                    goal,
                    waker: Some(w.clone()),
                    reached: false,
                });
                *id = Some(i);
            }
        }
        Poll::Pending
    }

    /// Forgets a wait that is dropped before it ended.
    pub(crate) fn cancel_wait(&mut self, id: u64) {
        self.waiters.retain(|w| w.id != id);
    }
}

impl Core {
    /// Bytes not yet delivered to peers: the endpoints', those on the way to and in the
    /// channels (queued, unsent or unacknowledged), and those of gracefully closed
    /// plain-TCP channels (the control lock held).
    pub(crate) fn pending_tx_bytes_locked(&self, ctl: &Control) -> usize {
        let mut n = 0;
        self.each_shard(|_, s| n += s.ep.pending_tx_bytes());
        for c in self.chans.load().values() {
            n += c.tx_pending_bytes.load(Ordering::Relaxed) + channel_pending(&c.t);
        }
        n + ctl.closing_plain_pending()
    }

    /// [`Stack::pending_tx_bytes`](super::super::Stack::pending_tx_bytes).
    pub(crate) fn pending_tx_bytes(&self) -> usize {
        let ctl = self.ctl();
        self.pending_tx_bytes_locked(&ctl)
    }

    /// Whether the stack holds nothing undelivered (one reading of
    /// [`Core::pending_tx_bytes`]).
    pub(crate) fn nothing_pending(&self) -> bool {
        self.pending_tx_bytes() == 0
    }

    /// Polls a wait for `goal`; `id` names the wait (given out on its first poll).
    pub(crate) fn poll_wait(
        &self,
        goal: Goal,
        id: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let mut ctl = self.ctl();
        let reached = ctl.poll_wait(self, goal, id, cx);
        drop(ctl);
        if reached.is_pending() {
            // The control task reads the figures now and on its re-check timer.
            self.control.notify();
        }
        reached
    }

    /// Forgets a wait that is dropped before it ended.
    pub(crate) fn cancel_wait(&self, id: u64) {
        self.ctl().cancel_wait(id);
    }

    /// Starts a graceful stop (see [`Control::begin_stop`]); does not block.
    pub(crate) fn begin_stop(&self, linger: Duration) {
        let deadline = Instant::now() + linger;
        let mut wake = Wakes::default();
        {
            let mut ctl = self.ctl();
            if !ctl.begin_stop(self, deadline, &mut wake) {
                return;
            }
        }
        wake.drain_each(Waker::wake);
        self.control.notify();
    }
}

impl Core {
    /// Wakes the tasks whose [`Goal`] is reached and runs a graceful stop: reads
    /// `pending_tx_bytes` (at most every [`DRAIN_RECHECK`]) while anyone waits or the stack
    /// is stopping. Returns whether the control task should stop now, and when it wants to
    /// look again.
    pub(super) fn check_waiters(
        &self,
        ctl: &mut Control,
        now: Instant,
        cx: &mut Context<'_>,
        wake: &mut Wakes,
    ) -> (bool, Option<Instant>) {
        let waiting = ctl.waiters.iter().any(|w| !w.reached);
        if !waiting && ctl.stopping.is_none() {
            ctl.zero_checks = 0;
            ctl.next_check = None;
            return (false, None);
        }
        if ctl.next_check.is_none_or(|t| now >= t) {
            if self.pending_tx_bytes_locked(ctl) == 0 {
                ctl.zero_checks = ctl.zero_checks.saturating_add(1);
            } else {
                ctl.zero_checks = 0;
            }
            ctl.next_check = Some(now + DRAIN_RECHECK);
        }
        let drained = ctl.zero_checks >= 2;
        // A graceful stop: once everything is delivered, close the channels (a FIN
        // after their bytes; the peer reads what they still hold, then their end) and
        // wait for each peer to answer with its own end or a reset.
        let mut done = false;
        if let Some(stopping) = &ctl.stopping {
            let (deadline, closed) = (stopping.deadline, stopping.closed);
            if !closed && drained {
                self.close_channels(ctl, wake);
            }
            let closed = closed || drained;
            if closed {
                ctl.closing_chans.retain(|c| loop {
                    match c.t.poll_dequeue(cx) {
                        Poll::Ready(Ok(Some(_))) => continue,
                        Poll::Ready(Ok(None)) | Poll::Ready(Err(_)) => break false,
                        Poll::Pending => break true,
                    }
                });
                if ctl.closing_chans.is_empty() {
                    debug!("stack drained and its channels closed; stopping");
                    ctl.stop_outcome = Some(StopOutcome::Drained);
                    done = true;
                }
            }
            if !done && now >= deadline {
                let pending = self.pending_tx_bytes_locked(ctl);
                warn!(
                    pending,
                    closing_channels = ctl.closing_chans.len(),
                    "linger time is up; aborting what the stack has not delivered"
                );
                ctl.stop_outcome = Some(StopOutcome::Expired { pending });
                done = true;
            }
            if let Some(s) = &mut ctl.stopping {
                s.closed = closed;
            }
        }
        let mut next = None;
        let no_channels = self.chans.load().is_empty() && ctl.closing_chans.is_empty();
        let (channels, plans) = (self.chans.load().len(), ctl.plans.counters.plans);
        for w in ctl.waiters.iter_mut().filter(|w| !w.reached) {
            let reached = match w.goal {
                Goal::Drained => drained,
                Goal::NoChannels => no_channels,
                Goal::Channels(n) => channels == n,
                Goal::Plans(k) => plans >= k,
                Goal::Stopped => false,
            };
            if reached {
                w.reached = true;
                wake.extend(w.waker.take());
            } else if w.goal == Goal::Drained {
                next = ctl.next_check;
            }
        }
        if let Some(s) = &ctl.stopping {
            next = earliest(earliest(next, ctl.next_check), Some(s.deadline));
        }
        (done, next)
    }

    /// Closes every channel gracefully for a stop (everything was delivered): its
    /// sockets lose it like a lost channel (sockets whose peer's stream is complete keep
    /// their bytes), the channel sends a FIN after what it holds and is kept in
    /// `closing_chans` until the peer answers.
    fn close_channels(&self, ctl: &mut Control, wake: &mut Wakes) {
        let ids: Vec<ChannelId> = self.chans.load().keys().copied().collect();
        for id in ids {
            let Some(c) = self.unlist_channel(id) else {
                continue;
            };
            self.each_shard(|_, s| {
                s.ep.abandon_channel(id);
                s.forget_channel(id);
            });
            debug!(channel = %id, peer = %c.peer, "closing the channel");
            c.t.close();
            if let Some(p) = ctl.peers.get_mut(&c.peer) {
                match c.class {
                    ChannelClass::Throughput => p.throughput -= 1,
                    ChannelClass::Latency => p.latency -= 1,
                }
            }
            ctl.closing_chans.push(c);
        }
        let mut resume = super::super::wake::Few::default();
        self.each_shard(|_, s| {
            s.drain_events(wake, &mut resume);
        });
    }

    /// The end of the stack: every channel is abandoned, and every task waiting on the
    /// stack woken (their calls now fail).
    pub(crate) fn stop_now(&self) {
        let mut wake = Wakes::default();
        let mut resume = super::super::wake::Few::default();
        let mut ctl = self.ctl();
        ctl.stopped = true;
        self.refuse_new();
        if ctl.stop_outcome.is_none() {
            ctl.stop_outcome = Some(StopOutcome::Aborted);
        }
        let ids: Vec<ChannelId> = self.chans.load().keys().copied().collect();
        for id in ids {
            self.lose_channel(&mut ctl, id, Gone::Abandoned);
        }
        for inc in ctl.incoming.drain(..) {
            inc.t.abort();
        }
        for c in ctl.closing_chans.drain(..) {
            c.t.abort();
        }
        for w in &mut ctl.waiters {
            w.reached = true;
            wake.extend(w.waker.take());
        }
        let acceptor = ctl.acceptor.take();
        for p in ctl.peers.values_mut() {
            if let Opening::Running { waiters, .. } = &mut p.opening {
                waiters.drain(..).for_each(|w| wake.push(w));
            }
        }
        self.each_shard(|_, s| {
            s.stopped = true;
            s.drain_events(&mut wake, &mut resume);
            s.wake_all(&mut wake);
        });
        drop(ctl);
        drop(acceptor);
        wake.drain_each(Waker::wake);
    }
}
