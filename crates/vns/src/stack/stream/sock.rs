//! `Sock`: what a stream or a half refers to (a virtual socket, a plain-TCP channel or
//! a loopback kernel socket), dispatching each call to it.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddrV4;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{Interest, ReadBuf, Ready};

use crate::stack::loopback::KernelInner;

use super::plain::{plain_keepalive, PLAIN_WRITE_MAX};
use super::{PlainInner, StreamInner};

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
    pub(super) fn poll_read(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self {
            Sock::Virtual(v) => v.poll_read(cx, buf),
            Sock::Plain(p) => p.poll_read(cx, buf),
            Sock::Kernel(k) => k.poll_read(cx, buf),
        }
    }

    pub(super) fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match self {
            Sock::Virtual(v) => v.poll_write(cx, data),
            Sock::Plain(p) => p.poll_write(cx, data),
            Sock::Kernel(k) => k.poll_write(cx, data),
        }
    }

    pub(super) fn poll_write_vectored(
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

    pub(super) fn poll_shutdown(&self) -> Poll<io::Result<()>> {
        match self {
            Sock::Virtual(v) => v.poll_shutdown(),
            Sock::Plain(p) => p.poll_shutdown(),
            Sock::Kernel(k) => k.poll_shutdown(),
        }
    }

    pub(super) fn local(&self) -> SocketAddrV4 {
        match self {
            Sock::Virtual(v) => v.local,
            Sock::Plain(p) => p.local,
            Sock::Kernel(k) => k.local(),
        }
    }

    pub(super) fn peer(&self) -> SocketAddrV4 {
        match self {
            Sock::Virtual(v) => v.peer,
            Sock::Plain(p) => p.peer,
            Sock::Kernel(k) => k.peer(),
        }
    }

    pub(super) fn set_nodelay(&self, on: bool) -> io::Result<()> {
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

    pub(super) fn nodelay(&self) -> io::Result<bool> {
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

    pub(super) fn set_quickack(&self, on: bool) -> io::Result<()> {
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

    pub(super) fn quickack(&self) -> io::Result<bool> {
        Ok(match self {
            Sock::Virtual(v) => v.quickack.load(Ordering::Relaxed),
            Sock::Plain(p) => p.quickack.load(Ordering::Relaxed),
            Sock::Kernel(k) => return k.quickack(),
        })
    }

    pub(super) fn set_linger(&self, dur: Option<Duration>) -> io::Result<()> {
        let slot = match self {
            Sock::Virtual(v) => &v.linger,
            Sock::Plain(p) => &p.linger,
            Sock::Kernel(k) => return k.set_linger(dur),
        };
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = dur;
        Ok(())
    }

    pub(super) fn set_keepalive(&self, on: bool) {
        if let Sock::Plain(p) = self {
            if let Some(t) = &p.t {
                t.set_options(plain_keepalive(on));
            }
        }
    }

    pub(super) fn linger(&self) -> io::Result<Option<Duration>> {
        let slot = match self {
            Sock::Virtual(v) => &v.linger,
            Sock::Plain(p) => &p.linger,
            Sock::Kernel(k) => return k.linger(),
        };
        Ok(*slot.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(super) fn same(&self, other: &Sock) -> bool {
        match (self, other) {
            (Sock::Virtual(a), Sock::Virtual(b)) => Arc::ptr_eq(a, b),
            (Sock::Plain(a), Sock::Plain(b)) => Arc::ptr_eq(a, b),
            (Sock::Kernel(a), Sock::Kernel(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Sock {
    pub(super) fn poll_peek_into(
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

    pub(super) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_peek_into(cx, None).map_ok(|_| ())
    }

    pub(super) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Sock::Virtual(v) => v.poll_write_ready(cx),
            Sock::Plain(p) => p.poll_write_ready(cx),
            Sock::Kernel(k) => k.poll_write_ready(cx),
        }
    }

    pub(super) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Virtual(v) => v.try_read(buf),
            Sock::Plain(p) => p.try_read(buf),
            Sock::Kernel(k) => k.try_read(buf),
        }
    }

    pub(super) fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Virtual(v) => v.try_write(data),
            Sock::Plain(p) => p.try_write(data),
            Sock::Kernel(k) => k.try_write(data),
        }
    }

    pub(super) async fn ready(&self, interest: Interest) -> io::Result<Ready> {
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

    pub(super) fn try_read_vectored(&self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
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

    pub(super) fn try_read_buf<B: bytes::BufMut>(&self, buf: &mut B) -> io::Result<usize> {
        // `BufMut`'s spare room is uninitialised memory, which this crate does not touch
        // without `unsafe`: the bytes go through a scratch buffer.
        let mut scratch = vec![0u8; buf.remaining_mut().min(64 * 1024)];
        let n = self.try_read(&mut scratch)?;
        buf.put_slice(&scratch[..n]);
        Ok(n)
    }

    pub(super) fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
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
