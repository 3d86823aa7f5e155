//! `StreamInner`: the socket behind a virtual stream (one `SocketId` of the stack's
//! endpoint), its reads and writes, readiness and close on drop.

use std::fmt;
use std::io;
use std::net::SocketAddrV4;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use netsched::AppClass;
use tokio::io::ReadBuf;

use crate::stack::core::stopped_error;
use crate::stack::Stack;

use super::linger::aborts;
use super::would_block::would_block;
use crate::copy::CopyWorkerPool;
use crate::endpoint::{Error, SocketId};

/// The socket behind a stream and its halves; dropping the last reference closes it like
/// the kernel's `close()` (`Endpoint::close`: a reset only with received bytes unread).
pub(crate) struct StreamInner {
    pub(super) stack: Stack,
    pub(super) sid: SocketId,
    pub(super) local: SocketAddrV4,
    pub(super) peer: SocketAddrV4,
    pub(super) linger: Mutex<Option<Duration>>,
    /// The value last given to `set_quickack` (recorded only: see `set_quickack`).
    pub(super) quickack: AtomicBool,
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
    pub(super) fn poll_read(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
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
    pub(super) fn poll_write_pooled(
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

    pub(super) fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(data)])
    }

    /// Writes the buffers in order as one write (`Endpoint::send_vectored`: small pieces
    /// leave in one chunk). A first buffer large enough for the copy workers goes alone
    /// through the pooled path, as a plain write of it would.
    pub(super) fn poll_write_vectored(
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

    pub(super) fn poll_shutdown(&self) -> Poll<io::Result<()>> {
        let core = self.stack.core();
        let mut st = core.lock_socket(self.sid);
        let r = st.ep.shutdown(self.sid);
        // The FIN goes now, behind the bytes written before.
        core.finish_call(st);
        Poll::Ready(r.map_err(io::Error::from))
    }

    pub(super) fn set_app_class(&self, class: AppClass) -> io::Result<()> {
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

impl fmt::Debug for StreamInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualStream")
            .field("socket", &self.sid)
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish()
    }
}

/// Readiness, peeking and non-blocking calls (the rest of `tokio::net::TcpStream`'s
/// surface). Readiness means the next call would not block: bytes, end of stream or an
/// error to report for reading; room in the send buffer, or an error, for writing.
impl StreamInner {
    /// Peeks into `probe` (`None`: only asks whether something is readable); registers
    /// `cx` for the socket's next readable event when nothing is.
    pub(super) fn poll_peek_into(
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

    pub(super) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
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

    pub(super) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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

    pub(super) fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        self.try_write_vectored(&[io::IoSlice::new(data)])
    }

    pub(super) fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
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
