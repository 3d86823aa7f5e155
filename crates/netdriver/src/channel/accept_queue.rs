//! What a listener shares with the queues' drivers: the queue of accepted channels, its
//! bound, and the wake-ups both ways.

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use crossbeam_queue::ArrayQueue;

use super::handle::Channel;
use super::ChannelError;

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

    pub(super) fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<Result<Channel, ChannelError>> {
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
