//! [`ChannelListener`]: channels accepted on one port, on every queue of a set.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use crossbeam_queue::ArrayQueue;
use std::net::SocketAddrV4;
use tracing::warn;

use super::handle::Channel;
use super::queue::block_on;
use super::round::Command;
use super::shared::SetShared;
use super::ChannelError;
use crate::time::Duration;

/// What a listener shares with the queues' drivers.
#[derive(Debug)]
pub(crate) struct ListenerShared {
    pub(crate) port: u16,
    /// Accepted channels; drivers push only while fewer than `backlog` wait
    /// ([`has_room_or_hold`](Self::has_room_or_hold)).
    pub(crate) accept: ArrayQueue<Channel>,
    pub(crate) backlog: usize,
    /// A driver found the queue full and left connections in its interface: the next
    /// accept wakes the drivers.
    pub(crate) held_back: AtomicBool,
    pub(crate) waker: AtomicWaker,
    pub(crate) closed: AtomicBool,
}

impl ListenerShared {
    /// Queues an accepted channel; false (and the channel is dropped, so aborted) when the
    /// listener closed (or, which the room check prevents, the queue is full).
    pub(crate) fn push(&self, ch: Channel) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return false;
        }
        self.accept.push(ch).is_ok()
    }

    /// Whether a driver may queue one more channel; when not, records that it holds
    /// connections back, so that the next accept wakes it (checked again after
    /// recording, against an accept in between).
    pub(crate) fn has_room_or_hold(&self) -> bool {
        if self.accept.len() < self.backlog {
            return true;
        }
        self.held_back.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.accept.len() < self.backlog
    }

    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<Result<Channel, ChannelError>> {
        for attempt in 0..2 {
            if let Some(ch) = self.accept.pop() {
                return Poll::Ready(Ok(ch));
            }
            if self.closed.load(Ordering::Acquire) {
                return Poll::Ready(Err(ChannelError::ShutDown));
            }
            if attempt == 0 {
                self.waker.register(cx.waker());
            }
        }
        Poll::Pending
    }
}

/// Accepts channels to one port on every queue of a [`ChannelSet`]. Dropping it stops
/// listening and aborts channels not yet accepted.
#[derive(Debug)]
pub struct ChannelListener {
    pub(crate) shared: Arc<ListenerShared>,
    pub(crate) set: Arc<SetShared>,
}

impl ChannelListener {
    /// The port.
    pub fn port(&self) -> u16 {
        self.shared.port
    }

    /// The next channel, or registers `cx`'s waker; wakes the queue drivers when one of
    /// them held connections back for want of room, since there is room now.
    fn take(&self, cx: &mut Context<'_>) -> Poll<Result<Channel, ChannelError>> {
        let r = self.shared.poll_accept(cx);
        if matches!(r, Poll::Ready(Ok(_))) {
            std::sync::atomic::fence(Ordering::SeqCst);
            if self.shared.held_back.swap(false, Ordering::SeqCst) {
                for p in &self.set.peers {
                    p.signal.notify();
                }
            }
        }
        r
    }

    /// Waits for the next channel and returns it with its peer's address.
    pub fn accept(&self) -> Result<(Channel, SocketAddrV4), ChannelError> {
        block_on(None, |cx| self.take(cx))
            .unwrap_or(Err(ChannelError::WouldBlockTimeout))
            .map(|c| {
                let peer = c.peer_addr();
                (c, peer)
            })
    }

    /// [`accept`](Self::accept), waiting at most `timeout`
    /// ([`ChannelError::WouldBlockTimeout`] then).
    pub fn accept_timeout(
        &self,
        timeout: Duration,
    ) -> Result<(Channel, SocketAddrV4), ChannelError> {
        block_on(Some(timeout), |cx| self.take(cx))
            .unwrap_or(Err(ChannelError::WouldBlockTimeout))
            .map(|c| {
                let peer = c.peer_addr();
                (c, peer)
            })
    }

    /// Async accept.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<Result<Channel, ChannelError>> {
        self.take(cx)
    }
}

impl Drop for ChannelListener {
    fn drop(&mut self) {
        let port = self.shared.port;
        self.shared.close();
        let mine = {
            let mut ls = self.set.listeners();
            if ls.get(&port).is_some_and(|l| Arc::ptr_eq(l, &self.shared)) {
                ls.remove(&port);
                true
            } else {
                false
            }
        };
        if !mine {
            return;
        }
        for p in &self.set.peers {
            if p.commands.send(Command::Unlisten { port }).is_ok() {
                p.signal.notify_control();
            }
        }
        if let Err(e) = self.set.with_steering(|s| s.release_port(port)) {
            if !matches!(e, ChannelError::ShutDown) {
                warn!(port, error = %e, "releasing a listened port");
            }
        }
        while self.shared.accept.pop().is_some() {}
    }
}
