//! [`VirtualStream`]: a virtual socket as a tokio byte stream, and its split halves.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use netdriver::channel::{Channel, Dequeued, EnqueueError};
use netsched::AppClass;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf, Ready};
use tracing::debug;

use super::core::stopped_error;
use super::loopback::KernelInner;
use super::{default_stack, Stack};
use crate::copy::CopyWorkerPool;
use crate::endpoint::{Error, SocketId, SocketOptions};

/// The socket behind a stream and its halves; dropping the last reference closes it like
/// the kernel's `close()` (`Endpoint::close`: a reset only with received bytes unread).
pub(crate) struct StreamInner {
    stack: Stack,
    sid: SocketId,
    local: SocketAddrV4,
    peer: SocketAddrV4,
    linger: Mutex<Option<Duration>>,
    /// The value last given to `set_quickack` (recorded only: see `set_quickack`).
    quickack: AtomicBool,
}

impl StreamInner {
    pub(crate) fn new(
        stack: Stack,
        sid: SocketId,
        local: SocketAddrV4,
        peer: SocketAddrV4,
    ) -> Self {
        StreamInner {
            stack,
            sid,
            local,
            peer,
            linger: Mutex::new(None),
            quickack: AtomicBool::new(true),
        }
    }

    /// A read into a buffer of at least the copy path's `read_min` lends the in-order bytes
    /// to the copy workers as the received chunks' slices, copied out in parallel when
    /// there are enough of them (the pool copies fewer inline); any other read copies them
    /// itself. Same locking, results and credit updates either way; the copy runs under the
    /// stack's lock.
    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let pool = self
            .stack
            .copy_path()
            .filter(|path| path.read_min.is_some_and(|min| buf.remaining() >= min))
            .map(|path| &path.pool);
        let core = self.stack.core();
        let mut st = core.lock_socket(self.sid);
        let dst = buf.initialize_unfilled();
        let read = match pool {
            Some(pool) => {
                let len = dst.len();
                st.ep.recv_with(self.sid, len, |chunks| {
                    pool.copy_out_for(self.sid.number(), chunks, dst)
                })
            }
            None => st.ep.recv(self.sid, dst),
        };
        match read {
            Ok(n) => {
                // This task's own earlier wait is over: the bytes' arrival must not wake
                // it again.
                if let Some(w) = st.socks.get_mut(&self.sid) {
                    if w.read.as_ref().is_some_and(|r| r.will_wake(cx.waker())) {
                        w.read = None;
                    }
                }
                // Sends the credit update the read may have made due.
                core.finish_call(st);
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Err(Error::WouldBlock) if st.stopped => Poll::Ready(Err(stopped_error())),
            // The channel's sink delivers the bytes and wakes this task.
            Err(Error::WouldBlock) => {
                if let Some(w) = st.socks.get_mut(&self.sid) {
                    if !w.read.as_ref().is_some_and(|r| r.will_wake(cx.waker())) {
                        w.read = Some(cx.waker().clone());
                    }
                }
                core.finish_call(st);
                Poll::Pending
            }
            Err(e) => {
                core.finish_call(st);
                Poll::Ready(Err(e.into()))
            }
        }
    }

    /// A large write: waits for at least `min` bytes of room in the send buffer (so that
    /// the copy is large enough to share), copies the data into pooled chunk buffers
    /// with the copy workers, outside the stack's lock, and hands the buffers to the send
    /// buffer as they are (each has room for its chunk header). Sent buffers come back to
    /// the pool once the channels drop them.
    fn poll_write_pooled(
        &self,
        cx: &mut Context<'_>,
        data: &[u8],
        pool: &CopyWorkerPool,
        min: usize,
    ) -> Poll<io::Result<usize>> {
        let core = self.stack.core();
        let (room, mut st) = {
            let mut st = core.lock_socket(self.sid);
            if st.stopped {
                return Poll::Ready(Err(stopped_error()));
            }
            match st.ep.send_room(self.sid, min) {
                Ok(room) => (room, st),
                Err(Error::WouldBlock) => {
                    if let Some(w) = st.socks.get_mut(&self.sid) {
                        w.write = Some(cx.waker().clone());
                    }
                    core.finish_call(st);
                    return Poll::Pending;
                }
                Err(e) => {
                    core.finish_call(st);
                    return Poll::Ready(Err(e.into()));
                }
            }
        };
        // Buffers the channels are done with go back to the pool before the copy takes
        // some, so that it reuses them.
        st.ep.reclaim_sent(|b| {
            pool.buffers().put(b);
        });
        drop(st);
        // Buffers this stack's earlier writes lent to other shards' sockets come back
        // too (other shards are only tried, never waited for).
        core.reclaim_sent_elsewhere(core.shard_of(self.sid), |b| {
            pool.buffers().put(b);
        });
        // Only this write half adds to the send buffer, so the room can only grow while
        // the lock is released for the copy.
        let n = room.min(data.len());
        let mut segs = Vec::new();
        pool.copy_in_mut_for(self.sid.number(), &data[..n], &mut segs);
        let mut st = core.lock_socket(self.sid);
        let r = if st.stopped {
            Err(Error::WouldBlock)
        } else {
            st.ep.send_chunks(self.sid, &mut segs)
        };
        for b in segs.drain(..) {
            pool.buffers().put(b);
        }
        match r {
            Ok(n) => {
                core.finish_call(st);
                Poll::Ready(Ok(n))
            }
            Err(_) if st.stopped => Poll::Ready(Err(stopped_error())),
            Err(Error::WouldBlock) => {
                // Not expected (the room only grows); wait for room like the plain path.
                if let Some(w) = st.socks.get_mut(&self.sid) {
                    w.write = Some(cx.waker().clone());
                }
                core.finish_call(st);
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e.into())),
        }
    }

    fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(data)])
    }

    /// Writes the buffers in order as one write (`Endpoint::send_vectored`: small pieces
    /// leave in one chunk). A first buffer large enough for the copy workers goes alone
    /// through the pooled path, as a plain write of it would.
    fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(path) = self.stack.copy_path() {
            let first = bufs.iter().find(|b| !b.is_empty());
            if let Some((min, data)) =
                first.and_then(|d| path.write_min.filter(|&min| d.len() >= min).zip(Some(d)))
            {
                return self.poll_write_pooled(cx, data, &path.pool, min);
            }
        }
        let core = self.stack.core();
        let mut st = core.lock_socket(self.sid);
        if st.stopped {
            return Poll::Ready(Err(stopped_error()));
        }
        match st.ep.send_vectored(self.sid, bufs) {
            Ok(n) => {
                // Sends what was written: its chunks into the channels, whose queue
                // drivers are woken.
                core.finish_call(st);
                Poll::Ready(Ok(n))
            }
            // Room comes with the peer's acknowledgements, through a channel's sink,
            // which wakes this task.
            Err(Error::WouldBlock) => {
                if let Some(w) = st.socks.get_mut(&self.sid) {
                    w.write = Some(cx.waker().clone());
                }
                core.finish_call(st);
                Poll::Pending
            }
            Err(e) => {
                core.finish_call(st);
                Poll::Ready(Err(e.into()))
            }
        }
    }

    fn poll_shutdown(&self) -> Poll<io::Result<()>> {
        let core = self.stack.core();
        let mut st = core.lock_socket(self.sid);
        let r = st.ep.shutdown(self.sid);
        // The FIN goes now, behind the bytes written before.
        core.finish_call(st);
        Poll::Ready(r.map_err(io::Error::from))
    }

    fn set_app_class(&self, class: AppClass) -> io::Result<()> {
        let core = self.stack.core();
        let mut st = core.lock_socket(self.sid);
        let r = st.ep.set_app_class(self.sid, class);
        core.finish_call(st);
        r.map_err(io::Error::from)
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        let abort = aborts(&self.linger);
        let core = self.stack.core();
        let mut st = core.lock_socket(self.sid);
        st.release(self.sid, abort);
        // The FIN (or RESET) goes now; a lingering socket's timer reaches the control task.
        core.finish_call(st);
    }
}

/// Whether a stream's linger setting makes its drop an abort (`Some(Duration::ZERO)`).
fn aborts(linger: &Mutex<Option<Duration>>) -> bool {
    *linger.lock().unwrap_or_else(|p| p.into_inner()) == Some(Duration::ZERO)
}

impl fmt::Debug for StreamInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualStream")
            .field("socket", &self.sid)
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish()
    }
}

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
fn plain_keepalive(on: bool) -> netdriver::tcp::OptionChanges {
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
    stack: Stack,
    /// The channel; taken only by `drop`.
    t: Option<Channel>,
    rx: Mutex<Option<Bytes>>,
    shut: AtomicBool,
    local: SocketAddrV4,
    peer: SocketAddrV4,
    nodelay: AtomicBool,
    /// The value last given to `set_quickack`, which the channel's TCP also got.
    quickack: AtomicBool,
    linger: Mutex<Option<Duration>>,
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

    fn t(&self) -> &Channel {
        self.t.as_ref().expect("the channel is taken only on drop")
    }

    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
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

    fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
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
    fn poll_write_vectored(
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

    fn poll_shutdown(&self) -> Poll<io::Result<()>> {
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
    /// data arrives meanwhile or the linger timeout passes first.
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
        let unread = matches!(t.dequeue(), Ok(Dequeued::Chunk(_)));
        if held || unread || aborts(&self.linger) {
            debug!(peer = %self.peer, "plain-TCP stream dropped with unread data (or linger 0); resetting");
            t.abort();
            return;
        }
        if !self.shut.swap(true, Ordering::AcqRel) {
            t.close();
        }
        let core = self.stack.core();
        core.keep_closing_plain(t);
    }
}

/// Most bytes one write to a plain-TCP stream enqueues as one chunk.
const PLAIN_WRITE_MAX: usize = 64 * 1024;

/// What a stream or a half refers to.
#[derive(Clone)]
pub(crate) enum Sock {
    Virtual(Arc<StreamInner>),
    Plain(Arc<PlainInner>),
    /// To the stack's own host, through the kernel's loopback interface.
    Kernel(Arc<KernelInner>),
}

impl fmt::Debug for Sock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sock::Virtual(v) => v.fmt(f),
            Sock::Plain(p) => f
                .debug_struct("PlainStream")
                .field("local", &p.local)
                .field("peer", &p.peer)
                .finish(),
            Sock::Kernel(k) => f
                .debug_struct("LoopbackStream")
                .field("local", &k.local())
                .field("peer", &k.peer())
                .finish(),
        }
    }
}

impl Sock {
    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self {
            Sock::Virtual(v) => v.poll_read(cx, buf),
            Sock::Plain(p) => p.poll_read(cx, buf),
            Sock::Kernel(k) => k.poll_read(cx, buf),
        }
    }

    fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match self {
            Sock::Virtual(v) => v.poll_write(cx, data),
            Sock::Plain(p) => p.poll_write(cx, data),
            Sock::Kernel(k) => k.poll_write(cx, data),
        }
    }

    fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self {
            Sock::Virtual(v) => v.poll_write_vectored(cx, bufs),
            Sock::Plain(p) => p.poll_write_vectored(cx, bufs),
            Sock::Kernel(k) => k.poll_write_vectored(cx, bufs),
        }
    }

    fn poll_shutdown(&self) -> Poll<io::Result<()>> {
        match self {
            Sock::Virtual(v) => v.poll_shutdown(),
            Sock::Plain(p) => p.poll_shutdown(),
            Sock::Kernel(k) => k.poll_shutdown(),
        }
    }

    fn local(&self) -> SocketAddrV4 {
        match self {
            Sock::Virtual(v) => v.local,
            Sock::Plain(p) => p.local,
            Sock::Kernel(k) => k.local(),
        }
    }

    fn peer(&self) -> SocketAddrV4 {
        match self {
            Sock::Virtual(v) => v.peer,
            Sock::Plain(p) => p.peer,
            Sock::Kernel(k) => k.peer(),
        }
    }

    fn set_nodelay(&self, on: bool) -> io::Result<()> {
        match self {
            Sock::Virtual(v) => {
                let core = v.stack.core();
                let mut st = core.lock_socket(v.sid);
                let r = st.ep.set_nodelay(v.sid, on);
                // What waited leaves now.
                core.finish_call(st);
                return r.map_err(io::Error::from);
            }
            Sock::Plain(p) => p.nodelay.store(on, Ordering::Relaxed),
            Sock::Kernel(k) => return k.set_nodelay(on),
        }
        Ok(())
    }

    fn nodelay(&self) -> io::Result<bool> {
        Ok(match self {
            Sock::Virtual(v) => {
                return v
                    .stack
                    .core()
                    .lock_socket(v.sid)
                    .ep
                    .nodelay(v.sid)
                    .map_err(io::Error::from)
            }
            Sock::Plain(p) => p.nodelay.load(Ordering::Relaxed),
            Sock::Kernel(k) => return k.nodelay(),
        })
    }

    fn set_quickack(&self, on: bool) -> io::Result<()> {
        match self {
            Sock::Virtual(v) => v.quickack.store(on, Ordering::Relaxed),
            Sock::Plain(p) => {
                p.quickack.store(on, Ordering::Relaxed);
                if let Some(t) = &p.t {
                    t.set_options(netdriver::tcp::OptionChanges::new().quickack(on));
                }
            }
            Sock::Kernel(k) => return k.set_quickack(on),
        }
        Ok(())
    }

    fn quickack(&self) -> io::Result<bool> {
        Ok(match self {
            Sock::Virtual(v) => v.quickack.load(Ordering::Relaxed),
            Sock::Plain(p) => p.quickack.load(Ordering::Relaxed),
            Sock::Kernel(k) => return k.quickack(),
        })
    }

    fn set_linger(&self, dur: Option<Duration>) -> io::Result<()> {
        let slot = match self {
            Sock::Virtual(v) => &v.linger,
            Sock::Plain(p) => &p.linger,
            Sock::Kernel(k) => return k.set_linger(dur),
        };
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = dur;
        Ok(())
    }

    fn set_keepalive(&self, on: bool) {
        if let Sock::Plain(p) = self {
            if let Some(t) = &p.t {
                t.set_options(plain_keepalive(on));
            }
        }
    }

    fn linger(&self) -> io::Result<Option<Duration>> {
        let slot = match self {
            Sock::Virtual(v) => &v.linger,
            Sock::Plain(p) => &p.linger,
            Sock::Kernel(k) => return k.linger(),
        };
        Ok(*slot.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn same(&self, other: &Sock) -> bool {
        match (self, other) {
            (Sock::Virtual(a), Sock::Virtual(b)) => Arc::ptr_eq(a, b),
            (Sock::Plain(a), Sock::Plain(b)) => Arc::ptr_eq(a, b),
            (Sock::Kernel(a), Sock::Kernel(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// A virtual socket: a reliable, ordered byte stream to a peer, carried over the stack's
/// channels. The drop-in for `tokio::net::TcpStream`.
///
/// Reads and writes are tokio [`AsyncRead`]/[`AsyncWrite`]; `shutdown` (through
/// `AsyncWriteExt`) sends a FIN after the bytes written, and the peer reads end of stream.
/// A lost channel the socket used fails its pending and later operations with
/// `ConnectionAborted`.
///
/// # Closing
///
/// Dropping the stream (both halves, after `into_split`) closes it as the kernel's
/// `close()` closes a TCP socket, `shutdown` or not:
///
/// - if every byte received was read, the bytes written are still delivered, then a FIN:
///   the peer reads them all, then end of stream. The socket lingers inside the stack
///   (see [`Stack::lingering_sockets`]) until its bytes and FIN are out and the peer's
///   FIN is in; data arriving meanwhile resets it (nobody will read it), and so does
///   `linger_timeout` (`vns::Config`, default 60 s) passing first, e.g. with a peer that
///   keeps its window closed (counted in `EndpointCounters::linger_expired`);
/// - if received bytes were left unread, the connection is reset at once and bytes
///   written but not yet sent are discarded (RFC 1122 4.2.2.13, RFC 2525 §2.17). The peer
///   still reads every byte sent before the reset, then fails with `ConnectionReset`;
///   its writes fail at once.
///
/// [`set_linger(Some(Duration::ZERO))`](Self::set_linger) makes the drop a reset
/// instead, as `SO_LINGER` 0 does.
///
/// A peer's reset never overtakes its data: the in-order bytes received before it stay
/// readable, then reads fail with `ConnectionReset` (`docs/wire-format.md`, "RESET
/// ordering"). Stopping the stack with [`Stack::shutdown_graceful`], or dropping its
/// last handle (within [`StackBuilder::linger`](super::StackBuilder::linger)), delivers
/// them first; [`Stack::abort`] loses what is undelivered.
///
/// `poll_flush` returns at once: bytes written are in the socket's send buffer and leave
/// as credit allows, like a kernel socket's.
///
/// A stream to or from a host that does not speak NetChannel (a kernel TCP peer) is the
/// same type: it runs over one dedicated channel carrying the bytes as they are, and
/// closes by the same rules (its TCP connection sends a FIN or a RST).
#[derive(Debug)]
pub struct VirtualStream {
    inner: Sock,
}

impl VirtualStream {
    /// The endpoint socket behind a virtual stream (`None` for plain TCP).
    #[cfg(test)]
    pub(crate) fn socket_id(&self) -> Option<SocketId> {
        match &self.inner {
            Sock::Virtual(v) => Some(v.sid),
            Sock::Plain(_) | Sock::Kernel(_) => None,
        }
    }

    pub(crate) fn from_inner(inner: StreamInner) -> VirtualStream {
        VirtualStream {
            inner: Sock::Virtual(Arc::new(inner)),
        }
    }

    pub(crate) fn plain(inner: PlainInner) -> VirtualStream {
        VirtualStream {
            inner: Sock::Plain(Arc::new(inner)),
        }
    }

    pub(crate) fn loopback(inner: KernelInner) -> VirtualStream {
        VirtualStream {
            inner: Sock::Kernel(Arc::new(inner)),
        }
    }

    /// Whether the stream carries plain TCP, without NetChannel channels or a virtual
    /// header: to a host without NetChannel, or to this host ([`is_loopback`]).
    ///
    /// [`is_loopback`]: Self::is_loopback
    pub fn is_plain_tcp(&self) -> bool {
        matches!(self.inner, Sock::Plain(_) | Sock::Kernel(_))
    }

    /// Whether the stream stays on this host (`127.0.0.0/8` or the stack's own address),
    /// carried by the kernel's loopback interface (see [`Stack::connect`]).
    pub fn is_loopback(&self) -> bool {
        matches!(self.inner, Sock::Kernel(_))
    }

    /// Like `TcpStream::into_std`: only a loopback stream ([`is_loopback`]) has a kernel
    /// socket to hand over. Any other stream lives in the stack's memory, with no file
    /// descriptor, and fails with `Unsupported` (the stream is dropped, closing as
    /// described under "Closing"). For the same reason `VirtualStream` implements neither `AsRawFd` nor `AsFd`.
    ///
    /// [`is_loopback`]: Self::is_loopback
    pub fn into_std(self) -> io::Result<std::net::TcpStream> {
        let unsupported = || {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "a virtual stream has no kernel socket (only loopback streams do); \
                 into_std, AsRawFd and AsFd cannot be honoured",
            )
        };
        match self.inner {
            Sock::Kernel(k) => match Arc::try_unwrap(k) {
                Ok(k) => k.into_std(),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "into_std on a stream whose halves are still alive",
                )),
            },
            _ => Err(unsupported()),
        }
    }

    /// Connects to `addr` through the process's default stack (see
    /// [`set_default_stack`](super::set_default_stack)).
    ///
    /// Names are resolved without blocking the runtime (tokio's resolver); every IPv4
    /// address they resolve to is tried in turn, and the last error is returned if none
    /// connects.
    pub async fn connect(addr: impl tokio::net::ToSocketAddrs) -> io::Result<VirtualStream> {
        let stack = default_stack()?;
        let mut last = None;
        for a in super::resolve_v4(addr).await? {
            match stack.connect(a.into()).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("resolve_v4 returns at least one address"))
    }

    /// The local address: the stack's address and the socket's virtual port.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.local().into())
    }

    /// The peer's address and virtual port.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.peer().into())
    }

    /// Like `TcpStream::set_nodelay`. On a virtual socket, `true` (the default, unlike a
    /// kernel socket's) sends every write's bytes at once, as their own chunk if need be;
    /// `false` turns on Nagle's algorithm (RFC 896): a short chunk waits while earlier
    /// data is unacknowledged (until the peer's application has read it), so that small
    /// writes made meanwhile leave together, and at most `vns::Config::nagle_delay`
    /// (1 ms). On a loopback stream it sets the kernel socket's `TCP_NODELAY`; on a
    /// plain-TCP stream it is recorded only (the channel's TCP sends at once).
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.inner.set_nodelay(nodelay)
    }

    /// The value last given to [`set_nodelay`](Self::set_nodelay).
    pub fn nodelay(&self) -> io::Result<bool> {
        self.inner.nodelay()
    }

    /// Like `TcpStream::set_quickack` (Linux's `TCP_QUICKACK`). On a plain-TCP stream the
    /// channel's TCP acknowledges the next data segments at once (and an ACK its
    /// delayed-ACK timer holds leaves at its queue's next round), or with `false` by the
    /// delayed-ACK rules; as on Linux the mode is not permanent
    /// ([`netdriver::tcp::Connection::set_quickack`]). On a loopback stream it sets the
    /// kernel socket's option. On a virtual stream it is recorded only: its bytes are
    /// acknowledged per chunk, by credit, over channels that many sockets share, whose
    /// TCP the stack tunes for all of them.
    ///
    /// ```no_run
    /// # async fn f() -> std::io::Result<()> {
    /// let stream = vns::stack::VirtualStream::connect("10.0.0.2:80").await?;
    /// stream.set_quickack(true)?;
    /// assert!(stream.quickack()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_quickack(&self, quickack: bool) -> io::Result<()> {
        self.inner.set_quickack(quickack)
    }

    /// The value last given to [`set_quickack`](Self::set_quickack) (`true` at first, as a
    /// Linux socket reports), or the kernel socket's on a loopback stream.
    pub fn quickack(&self) -> io::Result<bool> {
        self.inner.quickack()
    }

    /// Like `TcpStream::set_linger`: `Some(Duration::ZERO)` makes dropping the stream
    /// abort the connection (a reset; bytes not yet sent are discarded), as `SO_LINGER`
    /// with a zero timeout does. `None`, the default, closes as described in "Closing"
    /// above. Any other duration is recorded only: the close stays graceful, bounded by
    /// the stack's `linger_timeout`, and a drop never blocks.
    pub fn set_linger(&self, dur: Option<Duration>) -> io::Result<()> {
        self.inner.set_linger(dur)
    }

    /// The value last given to [`set_linger`](Self::set_linger).
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        self.inner.linger()
    }

    /// Keep-alive for a plain-TCP stream (see
    /// [`VirtualSocket::set_keepalive`](super::VirtualSocket::set_keepalive)); nothing for
    /// others: a virtual stream's liveness is its channels', a loopback stream's its
    /// socket's.
    pub(crate) fn set_keepalive(&self, on: bool) {
        self.inner.set_keepalive(on);
    }

    /// Declares the socket latency-sensitive or throughput-oriented (the paper's
    /// `SO_APP_TYPE`): its later chunks use only channels of that class. Fails with
    /// `AddrNotAvailable` when the stack has no channel of that class to the peer. No
    /// effect on a plain-TCP stream.
    pub fn set_app_class(&self, class: AppClass) -> io::Result<()> {
        match &self.inner {
            Sock::Virtual(v) => v.set_app_class(class),
            Sock::Plain(_) | Sock::Kernel(_) => Ok(()),
        }
    }

    /// The socket's application class.
    pub fn app_class(&self) -> AppClass {
        match &self.inner {
            Sock::Virtual(v) => v
                .stack
                .core()
                .lock_socket(v.sid)
                .ep
                .app_class(v.sid)
                .unwrap_or(AppClass::Throughput),
            Sock::Plain(_) | Sock::Kernel(_) => AppClass::Throughput,
        }
    }

    /// The stack's shard that holds this virtual socket (see [`Stack::latency_shard`]);
    /// `None` for a plain-TCP or loopback stream.
    pub fn shard(&self) -> Option<usize> {
        match &self.inner {
            Sock::Virtual(v) => Some(v.stack.core().shard_of(v.sid)),
            Sock::Plain(_) | Sock::Kernel(_) => None,
        }
    }

    /// A snapshot of the virtual socket's buffers and flow-control state (bytes unsent,
    /// readable, out of order, parked; STOP sent or received; bytes kept for resending),
    /// for monitoring and diagnosis. `None` for a plain-TCP or loopback stream, or once
    /// the socket is gone.
    pub fn socket_stats(&self) -> Option<crate::SocketStats> {
        match &self.inner {
            Sock::Virtual(v) => v.stack.core().lock_socket(v.sid).ep.socket_stats(v.sid),
            Sock::Plain(_) | Sock::Kernel(_) => None,
        }
    }

    /// Borrowed read and write halves, usable from two tasks at once (like
    /// `TcpStream::split`).
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        (
            ReadHalf { inner: &self.inner },
            WriteHalf { inner: &self.inner },
        )
    }

    /// Owned halves (like `TcpStream::into_split`). Dropping the write half shuts the
    /// write side down; the socket closes when both are gone. Both halves go through the
    /// stack's lock, like the whole stream does.
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        (
            OwnedReadHalf {
                inner: self.inner.clone(),
            },
            OwnedWriteHalf {
                inner: self.inner,
                shutdown_on_drop: true,
            },
        )
    }
}

impl AsyncRead for VirtualStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.inner.poll_read(cx, buf)
    }
}

impl AsyncWrite for VirtualStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_shutdown()
    }
}

/// The read half of [`VirtualStream::split`].
#[derive(Debug)]
pub struct ReadHalf<'a> {
    inner: &'a Sock,
}

/// The write half of [`VirtualStream::split`].
#[derive(Debug)]
pub struct WriteHalf<'a> {
    inner: &'a Sock,
}

impl AsyncRead for ReadHalf<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.inner.poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteHalf<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_shutdown()
    }
}

/// The read half of [`VirtualStream::into_split`].
#[derive(Debug)]
pub struct OwnedReadHalf {
    inner: Sock,
}

/// The write half of [`VirtualStream::into_split`]; dropping it shuts the write side down.
#[derive(Debug)]
pub struct OwnedWriteHalf {
    inner: Sock,
    shutdown_on_drop: bool,
}

impl OwnedReadHalf {
    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.peer().into())
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.local().into())
    }

    /// Rejoins the halves of one stream; hands them back in the error if they do not
    /// match.
    pub fn reunite(self, other: OwnedWriteHalf) -> Result<VirtualStream, ReuniteError> {
        if self.inner.same(&other.inner) {
            let mut other = other;
            other.shutdown_on_drop = false;
            Ok(VirtualStream {
                inner: self.inner.clone(),
            })
        } else {
            Err(ReuniteError(self, other))
        }
    }
}

impl OwnedWriteHalf {
    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.peer().into())
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.local().into())
    }

    /// Drops the half without shutting the write side down.
    pub fn forget(mut self) {
        self.shutdown_on_drop = false;
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        if self.shutdown_on_drop {
            let _ = self.inner.poll_shutdown();
        }
    }
}

impl AsyncRead for OwnedReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.inner.poll_read(cx, buf)
    }
}

impl AsyncWrite for OwnedWriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_shutdown()
    }
}

/// Opens a virtual socket to `addr` on `stack` (see [`Stack::connect`]).
pub(crate) async fn connect(stack: &Stack, addr: SocketAddrV4) -> io::Result<VirtualStream> {
    connect_with(stack, addr, SocketOptions::default()).await
}

/// [`connect`] with per-socket settings ([`VirtualSocket`](super::VirtualSocket)).
pub(crate) async fn connect_with(
    stack: &Stack,
    addr: SocketAddrV4,
    opts: SocketOptions,
) -> io::Result<VirtualStream> {
    let core = stack.core();
    let class = opts.app_class;
    let mut attempt = None;
    let peer =
        match poll_fn(|cx| core.poll_peer(*addr.ip(), class.channel_class(), &mut attempt, cx))
            .await
        {
            Ok(p) => p,
            // No channel port there: a host without NetChannel; try plain TCP.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                debug!(%addr, "no channel port; falling back to plain TCP");
                return connect_plain(stack, addr).await;
            }
            Err(e) => return Err(e),
        };
    let (sid, local) = {
        // A chosen local port decides the shard, as for a received chunk.
        let shard = match opts.local_port {
            Some(p) => core.shard_for_ports(p, addr.port()),
            None => core.next_connect_shard(addr.port(), class),
        };
        let mut st = core.lock_shard(shard);
        if core.refuses_new() {
            return Err(stopped_error());
        }
        let sid = st.ep.connect_with(peer, addr.port(), class, opts)?;
        let (_, local, _) = st.ep.socket_addr(sid).expect("just created");
        st.track(sid);
        st.deadlines
            .insert(sid, Instant::now() + core.config.connect_timeout);
        // The SYNC goes now.
        core.finish_call(st);
        (sid, local)
    };
    // The connect deadline reaches the control task.
    core.control.notify();
    // From here on, dropping the stream (or this future) releases the socket.
    let stream = VirtualStream::from_inner(StreamInner::new(
        stack.clone(),
        sid,
        SocketAddrV4::new(core.ipv4(), local),
        addr,
    ));
    poll_fn(|cx| {
        let mut st = core.lock_socket(sid);
        if st.ep.is_connected(sid) {
            st.deadlines.remove(&sid);
            return Poll::Ready(Ok(()));
        }
        if st.socks.get(&sid).is_some_and(|s| s.timed_out) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect to {addr} timed out"),
            )));
        }
        match st.ep.recv(sid, &mut []) {
            Err(Error::WouldBlock) if st.stopped => Poll::Ready(Err(stopped_error())),
            Err(Error::WouldBlock) | Ok(_) => {
                if let Some(w) = st.socks.get_mut(&sid) {
                    w.write = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e.into())),
        }
    })
    .await?;
    debug!(socket = %sid, %addr, "connected");
    Ok(stream)
}

type PlainResult = io::Result<(Channel, SocketAddrV4)>;

#[derive(Default)]
struct PlainSlot {
    result: Option<PlainResult>,
    waker: Option<Waker>,
}

/// Opens one channel straight to `addr` (a plain-TCP peer), in a helper thread since the
/// channel set's connect blocks.
async fn connect_plain(stack: &Stack, addr: SocketAddrV4) -> io::Result<VirtualStream> {
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

fn would_block() -> io::Error {
    io::ErrorKind::WouldBlock.into()
}

/// Readiness, peeking and non-blocking calls (the rest of `tokio::net::TcpStream`'s
/// surface). Readiness means the next call would not block: bytes, end of stream or an
/// error to report for reading; room in the send buffer, or an error, for writing.
impl StreamInner {
    /// Peeks into `probe` (`None`: only asks whether something is readable); registers
    /// `cx` for the socket's next readable event when nothing is.
    fn poll_peek_into(
        &self,
        cx: &mut Context<'_>,
        probe: Option<&mut ReadBuf<'_>>,
    ) -> Poll<io::Result<usize>> {
        let core = self.stack.core();
        let mut one = [0u8; 1];
        let mut probe = probe;
        let mut st = core.lock_socket(self.sid);
        let peeked = match probe.as_deref_mut() {
            Some(buf) => st.ep.peek(self.sid, buf.initialize_unfilled()),
            None => st.ep.peek(self.sid, &mut one).map(|_| 0),
        };
        match peeked {
            Ok(n) => {
                core.finish_call(st);
                if let Some(buf) = probe {
                    buf.advance(n);
                }
                Poll::Ready(Ok(n))
            }
            Err(Error::WouldBlock) if st.stopped => Poll::Ready(Err(stopped_error())),
            Err(Error::WouldBlock) => {
                if let Some(w) = st.socks.get_mut(&self.sid) {
                    w.read = Some(cx.waker().clone());
                }
                core.finish_call(st);
                Poll::Pending
            }
            // Ready: the read reports it.
            Err(_) if probe.is_none() => {
                core.finish_call(st);
                Poll::Ready(Ok(0))
            }
            Err(e) => {
                core.finish_call(st);
                Poll::Ready(Err(e.into()))
            }
        }
    }

    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let core = self.stack.core();
        let mut st = core.lock_socket(self.sid);
        match st.ep.recv(self.sid, buf) {
            Ok(n) => {
                core.finish_call(st);
                Ok(n)
            }
            Err(Error::WouldBlock) if st.stopped => Err(stopped_error()),
            Err(Error::WouldBlock) => {
                core.finish_call(st);
                Err(would_block())
            }
            Err(e) => {
                core.finish_call(st);
                Err(e.into())
            }
        }
    }

    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let core = self.stack.core();
        let mut st = core.lock_socket(self.sid);
        if st.stopped {
            return Poll::Ready(Err(stopped_error()));
        }
        match st.ep.send_room(self.sid, 1) {
            Err(Error::WouldBlock) => {
                if let Some(w) = st.socks.get_mut(&self.sid) {
                    w.write = Some(cx.waker().clone());
                }
                core.finish_call(st);
                Poll::Pending
            }
            // Room, or an error the write reports.
            _ => Poll::Ready(Ok(())),
        }
    }

    fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        self.try_write_vectored(&[io::IoSlice::new(data)])
    }

    fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let core = self.stack.core();
        let mut st = core.lock_socket(self.sid);
        if st.stopped {
            return Err(stopped_error());
        }
        match st.ep.send_vectored(self.sid, bufs) {
            Ok(n) => {
                core.finish_call(st);
                Ok(n)
            }
            Err(Error::WouldBlock) => {
                core.finish_call(st);
                Err(would_block())
            }
            Err(e) => {
                core.finish_call(st);
                Err(e.into())
            }
        }
    }
}

impl PlainInner {
    /// Makes sure a received chunk (or the end of stream, or an error) is at hand; the
    /// chunk is kept for the next read.
    fn poll_peek_into(
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

    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
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

    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.shut.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        // An error is readiness too: the write reports it.
        self.t().poll_enqueue_ready(cx).map(|_| Ok(()))
    }

    fn try_write(&self, data: &[u8]) -> io::Result<usize> {
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

impl Sock {
    fn poll_peek_into(
        &self,
        cx: &mut Context<'_>,
        probe: Option<&mut ReadBuf<'_>>,
    ) -> Poll<io::Result<usize>> {
        match self {
            Sock::Virtual(v) => v.poll_peek_into(cx, probe),
            Sock::Plain(p) => p.poll_peek_into(cx, probe),
            Sock::Kernel(k) => k.poll_peek_into(cx, probe),
        }
    }

    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_peek_into(cx, None).map_ok(|_| ())
    }

    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Sock::Virtual(v) => v.poll_write_ready(cx),
            Sock::Plain(p) => p.poll_write_ready(cx),
            Sock::Kernel(k) => k.poll_write_ready(cx),
        }
    }

    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Virtual(v) => v.try_read(buf),
            Sock::Plain(p) => p.try_read(buf),
            Sock::Kernel(k) => k.try_read(buf),
        }
    }

    fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Virtual(v) => v.try_write(data),
            Sock::Plain(p) => p.try_write(data),
            Sock::Kernel(k) => k.try_write(data),
        }
    }

    async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        poll_fn(|cx| {
            let mut ready = Ready::EMPTY;
            if interest.is_readable() {
                if let Poll::Ready(r) = self.poll_read_ready(cx) {
                    r?;
                    ready |= Ready::READABLE;
                }
            }
            if interest.is_writable() {
                if let Poll::Ready(r) = self.poll_write_ready(cx) {
                    r?;
                    ready |= Ready::WRITABLE;
                }
            }
            if ready.is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(Ok(ready))
            }
        })
        .await
    }

    fn try_read_vectored(&self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        let mut total = 0;
        for b in bufs.iter_mut().filter(|b| !b.is_empty()) {
            match self.try_read(b) {
                Ok(n) => {
                    total += n;
                    if n < b.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && total > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }

    fn try_read_buf<B: bytes::BufMut>(&self, buf: &mut B) -> io::Result<usize> {
        // `BufMut`'s spare room is uninitialised memory, which this crate does not touch
        // without `unsafe`: the bytes go through a scratch buffer.
        let mut scratch = vec![0u8; buf.remaining_mut().min(64 * 1024)];
        let n = self.try_read(&mut scratch)?;
        buf.put_slice(&scratch[..n]);
        Ok(n)
    }

    fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Sock::Virtual(v) => v.try_write_vectored(bufs),
            Sock::Plain(p) => {
                let mut joined = Vec::new();
                for b in bufs {
                    let n = (PLAIN_WRITE_MAX - joined.len()).min(b.len());
                    joined.extend_from_slice(&b[..n]);
                }
                p.try_write(&joined)
            }
            Sock::Kernel(k) => k.try_write_vectored(bufs),
        }
    }
}

/// The readiness and non-blocking methods of `tokio::net::TcpStream` (and its halves), on
/// a type holding a `Sock` in `inner`.
macro_rules! read_side {
    () => {
        /// Waits until the stream is readable: bytes to read, the end of the stream, or
        /// an error the next read reports. As with tokio, a read may still find nothing
        /// (another task took the bytes): it then returns `WouldBlock` from
        /// [`try_read`](Self::try_read).
        pub async fn readable(&self) -> io::Result<()> {
            poll_fn(|cx| self.inner.poll_read_ready(cx)).await
        }

        /// Polls for read readiness (see [`readable`](Self::readable)). Only the task of
        /// the last call is woken, as with tokio.
        pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.inner.poll_read_ready(cx)
        }

        /// Reads what is readable now, without waiting: `Ok(0)` at the end of the
        /// stream, an error of kind `WouldBlock` when nothing is readable yet.
        pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
            self.inner.try_read(buf)
        }

        /// [`try_read`](Self::try_read) into several buffers, in order.
        pub fn try_read_vectored(&self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
            self.inner.try_read_vectored(bufs)
        }

        /// [`try_read`](Self::try_read) into a [`BufMut`](bytes::BufMut), advancing it.
        pub fn try_read_buf<B: bytes::BufMut>(&self, buf: &mut B) -> io::Result<usize> {
            self.inner.try_read_buf(buf)
        }

        /// Copies readable bytes into `buf` without consuming them (`MSG_PEEK`): the next
        /// read returns them again. Waits until something is readable; `Ok(0)` at the end
        /// of the stream.
        pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
            let mut buf = ReadBuf::new(buf);
            poll_fn(|cx| self.inner.poll_peek_into(cx, Some(&mut buf))).await
        }

        /// Polls a [`peek`](Self::peek): fills `buf` (advancing it) with readable bytes
        /// without consuming them and returns how many.
        pub fn poll_peek(
            &self,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<usize>> {
            self.inner.poll_peek_into(cx, Some(buf))
        }
    };
}

macro_rules! write_side {
    () => {
        /// Waits until the stream is writable: room in the send buffer, or an error the
        /// next write reports.
        pub async fn writable(&self) -> io::Result<()> {
            poll_fn(|cx| self.inner.poll_write_ready(cx)).await
        }

        /// Polls for write readiness (see [`writable`](Self::writable)). Only the task of
        /// the last call is woken, as with tokio.
        pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.inner.poll_write_ready(cx)
        }

        /// Writes what fits in the send buffer now, without waiting; an error of kind
        /// `WouldBlock` when nothing fits.
        pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
            self.inner.try_write(buf)
        }

        /// [`try_write`](Self::try_write) from several buffers, in order.
        pub fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
            self.inner.try_write_vectored(bufs)
        }
    };
}

macro_rules! both_sides {
    () => {
        /// Waits until the stream is ready for any of `interest` and returns which.
        pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
            self.inner.ready(interest).await
        }

        /// Runs `f`, a non-blocking operation, if the stream is ready for `interest`
        /// now; `WouldBlock` otherwise (also from `f`). The closure sees no socket
        /// descriptor (there is none): it uses this stream's `try_*` methods.
        pub fn try_io<R>(
            &self,
            interest: Interest,
            f: impl FnOnce() -> io::Result<R>,
        ) -> io::Result<R> {
            let waker = Waker::noop();
            let mut cx = Context::from_waker(waker);
            let ready = (interest.is_readable()
                && self.inner.poll_peek_into(&mut cx, None).is_ready())
                || (interest.is_writable() && self.inner.poll_write_ready(&mut cx).is_ready());
            if !ready {
                return Err(would_block());
            }
            f()
        }
    };
}

impl VirtualStream {
    read_side!();
    write_side!();
    both_sides!();
}

/// `ready` on the halves, as tokio's halves have it: the stream's readiness for
/// `interest`, whichever half asks.
macro_rules! half_ready {
    () => {
        /// Waits until the stream is ready for any of `interest` and returns which (as
        /// [`VirtualStream::ready`]).
        pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
            self.inner.ready(interest).await
        }
    };
}

impl ReadHalf<'_> {
    half_ready!();
}

impl WriteHalf<'_> {
    half_ready!();
}

impl OwnedReadHalf {
    half_ready!();
}

impl OwnedWriteHalf {
    half_ready!();
}

/// The IPv4 time to live of every segment the stack sends (channels and plain-TCP
/// streams alike; Linux's default). It is the interface's, not a socket's.
pub const IP_TTL: u32 = 64;

impl VirtualStream {
    /// Like `TcpStream::set_zero_linger`: dropping the stream aborts the connection (a
    /// reset; bytes not yet sent are discarded). The same as
    /// `set_linger(Some(Duration::ZERO))`.
    pub fn set_zero_linger(&self) -> io::Result<()> {
        self.set_linger(Some(Duration::ZERO))
    }

    /// Like `TcpStream::ttl`: the IPv4 time to live of the stream's segments,
    /// [`IP_TTL`] (the stack sends every segment with it; for a loopback stream, the
    /// kernel's default, which is the same).
    pub fn ttl(&self) -> io::Result<u32> {
        Ok(IP_TTL)
    }

    /// Like `TcpStream::set_ttl`, which a stream cannot honour: its segments share the
    /// channels' (or the interface's) IPv4 header template. Setting [`IP_TTL`] succeeds;
    /// any other value fails with `Unsupported`.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        if ttl == IP_TTL {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the stack sends every segment with TTL {IP_TTL}; a stream cannot change it"),
        ))
    }

    /// Like `TcpStream::take_error` (`SO_ERROR`): always `Ok(None)`. A virtual stream
    /// holds no error back for later: a failure (reset, peer unreachable, the stack
    /// stopped) is returned by the pending call and by every later one.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(None)
    }
}

impl ReadHalf<'_> {
    read_side!();

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.peer().into())
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.local().into())
    }
}

impl WriteHalf<'_> {
    write_side!();

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.peer().into())
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.local().into())
    }
}

impl OwnedReadHalf {
    read_side!();
}

impl OwnedWriteHalf {
    write_side!();

    /// Rejoins the halves of one stream (see [`OwnedReadHalf::reunite`]).
    pub fn reunite(self, other: OwnedReadHalf) -> Result<VirtualStream, ReuniteError> {
        other.reunite(self)
    }
}

/// The halves given to `reunite` belong to different streams; both are handed back.
#[derive(Debug)]
pub struct ReuniteError(pub OwnedReadHalf, pub OwnedWriteHalf);

impl fmt::Display for ReuniteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tried to reunite halves that are not from the same stream")
    }
}

impl std::error::Error for ReuniteError {}
