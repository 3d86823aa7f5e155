//! The borrowed and owned halves of a [`VirtualStream`](super::VirtualStream), as tokio's.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{Sock, VirtualStream};

/// The read half of [`VirtualStream::split`].
#[derive(Debug)]
pub struct ReadHalf<'a> {
    pub(super) inner: &'a Sock,
}

/// The write half of [`VirtualStream::split`].
#[derive(Debug)]
pub struct WriteHalf<'a> {
    pub(super) inner: &'a Sock,
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
    pub(super) inner: Sock,
}

/// The write half of [`VirtualStream::into_split`]; dropping it shuts the write side down.
#[derive(Debug)]
pub struct OwnedWriteHalf {
    pub(super) inner: Sock,
    pub(super) shutdown_on_drop: bool,
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
