//! [`ChannelListener`]: channels accepted on one port, on every queue of a set.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use std::net::SocketAddrV4;
use tracing::warn;

use super::accept_queue::ListenerShared;
use super::block::block_on;
use super::command::Command;
use super::handle::Channel;
use super::shared::SetShared;
use super::ChannelError;
use crate::time::Duration;

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
