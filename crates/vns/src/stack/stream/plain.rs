//! `PlainInner`: a stream to a plain-TCP peer over one dedicated channel, its
//! keep-alive defaults, readiness, and opening it.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use netdriver::channel::{Channel, Dequeued, EnqueueError};
use tokio::io::ReadBuf;
use tracing::debug;

use crate::stack::core::channel_pending;
use crate::stack::Stack;

use super::linger::aborts;
use super::would_block::would_block;
use super::VirtualStream;
use crate::endpoint::Error;

/// Idle time before a plain-TCP stream whose socket asked for keep-alive
/// ([`VirtualSocket::set_keepalive`](super::VirtualSocket::set_keepalive)) is probed: RFC
/// 9293 §3.8.4 wants at least two hours by default, Linux's `tcp_keepalive_time`.
pub const PLAIN_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);
/// Time between unanswered keep-alive probes of a plain-TCP stream (Linux's
/// `tcp_keepalive_intvl`).
pub const PLAIN_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(75);
/// Unanswered keep-alive probes after which a plain-TCP stream fails (Linux's
/// `tcp_keepalive_probes`).
pub const PLAIN_KEEPALIVE_PROBES: u32 = 9;

/// The keep-alive of a plain-TCP connection: off unless its socket asked (RFC 9293
/// §3.8.4: off by default, a per-connection switch), then the kernel's defaults above. A
/// kernel peer does not see the probes the stack's own channels use for their liveness.
pub(super) fn plain_keepalive(on: bool) -> netdriver::tcp::OptionChanges {
    let changes = netdriver::tcp::OptionChanges::new();
    if on {
        changes
            .keepalive(Some(PLAIN_KEEPALIVE_IDLE))
            .keepalive_interval(Some(PLAIN_KEEPALIVE_INTERVAL))
            .keepalive_probes(PLAIN_KEEPALIVE_PROBES)
    } else {
        changes.keepalive(None)
    }
}

/// A stream to a plain-TCP peer (a host without NetChannel): one dedicated channel
/// carries the application's bytes as they are, without chunk headers. Its connection
/// has keep-alive off unless asked ([`plain_keepalive`]).
pub(crate) struct PlainInner {
    pub(super) stack: Stack,
    /// The channel; taken only by `drop`.
    pub(super) t: Option<Channel>,
    pub(super) rx: Mutex<Option<Bytes>>,
    pub(super) shut: AtomicBool,
    pub(super) local: SocketAddrV4,
    pub(super) peer: SocketAddrV4,
    pub(super) nodelay: AtomicBool,
    /// The value last given to `set_quickack`, which the channel's TCP also got.
    pub(super) quickack: AtomicBool,
    pub(super) linger: Mutex<Option<Duration>>,
}

impl PlainInner {
    pub(crate) fn new(stack: Stack, t: Channel, local: SocketAddrV4, peer: SocketAddrV4) -> Self {
        t.set_options(plain_keepalive(false));
        PlainInner {
            stack,
            t: Some(t),
            rx: Mutex::new(None),
            shut: AtomicBool::new(false),
            local,
            peer,
            nodelay: AtomicBool::new(false),
            quickack: AtomicBool::new(true),
            linger: Mutex::new(None),
        }
    }

    pub(super) fn t(&self) -> &Channel {
        self.t.as_ref().expect("the channel is taken only on drop")
    }

    pub(super) fn poll_read(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        let mut chunk = match rx.take() {
            Some(b) => b,
            None => match self.t().poll_dequeue(cx) {
                Poll::Ready(Ok(Some(b))) => b,
                Poll::Ready(Ok(None)) => return Poll::Ready(Ok(())),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => return Poll::Pending,
            },
        };
        let n = chunk.len().min(buf.remaining());
        buf.put_slice(&chunk.split_to(n));
        if !chunk.is_empty() {
            *rx = Some(chunk);
        }
        Poll::Ready(Ok(()))
    }

    pub(super) fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        if self.shut.load(Ordering::Acquire) {
            return Poll::Ready(Err(Error::WriteClosed.into()));
        }
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            match self.t().poll_enqueue_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => return Poll::Pending,
            }
            let n = data.len().min(PLAIN_WRITE_MAX);
            match self.t().enqueue(Bytes::copy_from_slice(&data[..n])) {
                Ok(()) => return Poll::Ready(Ok(n)),
                Err(EnqueueError::Full(_)) => continue,
                Err(EnqueueError::Closed(e)) => return Poll::Ready(Err(e.into())),
            }
        }
    }

    /// The buffers joined into one chunk (up to [`PLAIN_WRITE_MAX`] bytes), so that they
    /// leave together.
    pub(super) fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut joined = Vec::new();
        for b in bufs {
            let n = (PLAIN_WRITE_MAX - joined.len()).min(b.len());
            joined.extend_from_slice(&b[..n]);
            if joined.len() == PLAIN_WRITE_MAX {
                break;
            }
        }
        self.poll_write(cx, &joined)
    }

    pub(super) fn poll_shutdown(&self) -> Poll<io::Result<()>> {
        if !self.shut.swap(true, Ordering::AcqRel) {
            self.t().close();
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for PlainInner {
    /// Closes like the kernel's `close()`: with received bytes left unread (a partly
    /// read chunk, or bytes in the channel's queues) the connection is reset; otherwise
    /// the queued bytes and a FIN go, and the stack keeps the channel until they are
    /// acknowledged and the peer's FIN is in (`Stack::pending_tx_bytes`), resetting it if
    /// data arrives meanwhile or the linger timeout passes first. When the peer's FIN is
    /// in and every byte is acknowledged already, the queue driver alone finishes.
    fn drop(&mut self) {
        let Some(t) = self.t.take() else { return };
        let held = self
            .rx
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        // Unread bytes are judged by the channel's queue itself, not by its statistics:
        // those are a snapshot the queue driver publishes, which can still count bytes
        // this stream has already read, and a reset on that stale figure discarded the
        // replies a server wrote just before closing (seen under load in `kv_example`).
        // Bytes still in the TCP receive buffer that reach the queue after this look
        // count as data arriving after the close, which resets as well
        // (`Core::keep_closing_plain`).
        let next = t.dequeue();
        let unread = matches!(next, Ok(Dequeued::Chunk(_)));
        if held || unread || aborts(&self.linger) {
            debug!(peer = %self.peer, "plain-TCP stream dropped with unread data (or linger 0); resetting");
            t.abort();
            return;
        }
        if !self.shut.swap(true, Ordering::AcqRel) {
            t.close();
        }
        // The peer closed first and everything this side wrote is acknowledged: nothing is
        // left for the stack to watch (no data can follow the peer's FIN, no byte is owed
        // for a drain), so the channel is let go here and its queue driver alone sends the
        // FIN and takes the last ACK (a closed channel's handle drops without an abort).
        // Handing it to the control task would cost a wake-up of another thread per
        // connection, which was most of what a client-closes-first connection cost.
        if matches!(next, Ok(Dequeued::Finished)) && channel_pending(&t) == 0 {
            return;
        }
        let core = self.stack.core();
        core.keep_closing_plain(t);
    }
}

/// Most bytes one write to a plain-TCP stream enqueues as one chunk.
pub(super) const PLAIN_WRITE_MAX: usize = 64 * 1024;

impl PlainInner {
    /// Makes sure a received chunk (or the end of stream, or an error) is at hand; the
    /// chunk is kept for the next read.
    pub(super) fn poll_peek_into(
        &self,
        cx: &mut Context<'_>,
        probe: Option<&mut ReadBuf<'_>>,
    ) -> Poll<io::Result<usize>> {
        let mut rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        if rx.is_none() {
            match self.t().poll_dequeue(cx) {
                Poll::Ready(Ok(Some(b))) => *rx = Some(b),
                Poll::Ready(Ok(None)) => return Poll::Ready(Ok(0)),
                Poll::Ready(Err(_)) if probe.is_none() => return Poll::Ready(Ok(0)),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => return Poll::Pending,
            }
        }
        let chunk = rx.as_ref().expect("filled above");
        match probe {
            Some(buf) => {
                let n = chunk.len().min(buf.remaining());
                buf.put_slice(&chunk[..n]);
                Poll::Ready(Ok(n))
            }
            None => Poll::Ready(Ok(0)),
        }
    }

    pub(super) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        let mut chunk = match rx.take() {
            Some(b) => b,
            None => match self.t().dequeue() {
                Ok(Dequeued::Chunk(b)) => b,
                Ok(Dequeued::Empty) => return Err(would_block()),
                Ok(Dequeued::Finished) => return Ok(0),
                Err(e) => return Err(e.into()),
            },
        };
        let n = chunk.len().min(buf.len());
        buf[..n].copy_from_slice(&chunk.split_to(n));
        if !chunk.is_empty() {
            *rx = Some(chunk);
        }
        Ok(n)
    }

    pub(super) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.shut.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        // An error is readiness too: the write reports it.
        self.t().poll_enqueue_ready(cx).map(|_| Ok(()))
    }

    pub(super) fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        if self.shut.load(Ordering::Acquire) {
            return Err(Error::WriteClosed.into());
        }
        if data.is_empty() {
            return Ok(0);
        }
        let n = data.len().min(PLAIN_WRITE_MAX);
        match self.t().enqueue(Bytes::copy_from_slice(&data[..n])) {
            Ok(()) => Ok(n),
            Err(EnqueueError::Full(_)) => Err(would_block()),
            Err(EnqueueError::Closed(e)) => Err(e.into()),
        }
    }
}

pub(super) type PlainResult = io::Result<(Channel, SocketAddrV4)>;

#[derive(Default)]
pub(super) struct PlainSlot {
    pub(super) result: Option<PlainResult>,
    pub(super) waker: Option<Waker>,
}

/// Opens one channel straight to `addr` (a plain-TCP peer), on a thread of its own, since the
/// channel set's connect blocks.
pub(super) async fn connect_plain(stack: &Stack, addr: SocketAddrV4) -> io::Result<VirtualStream> {
    let slot = Arc::new(Mutex::new(PlainSlot::default()));
    let core = stack.core().clone();
    let s2 = slot.clone();
    std::thread::Builder::new()
        .name("vns-plain".into())
        .spawn(move || {
            let r = core
                .set
                .connect(addr)
                .map(|c| {
                    let local = c.local_addr();
                    (c, local)
                })
                .map_err(io::Error::from);
            drop(core);
            let w = {
                let mut s = s2.lock().unwrap_or_else(|p| p.into_inner());
                s.result = Some(r);
                s.waker.take()
            };
            if let Some(w) = w {
                w.wake();
            }
        })?;
    let (t, local) = poll_fn(|cx| {
        let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    })
    .await?;
    debug!(%addr, %local, "connected over plain TCP");
    Ok(VirtualStream::plain(PlainInner::new(
        stack.clone(),
        t,
        local,
        addr,
    )))
}
