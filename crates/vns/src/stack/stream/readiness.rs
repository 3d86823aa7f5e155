//! The readiness and non-blocking methods of `tokio::net::TcpStream` on a stream and
//! its halves, written once as macros over a `Sock` in `inner`.

use std::future::poll_fn;
use std::io;
use std::task::{Context, Poll, Waker};

use tokio::io::{Interest, ReadBuf, Ready};

use super::would_block::would_block;
use super::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, VirtualStream, WriteHalf};

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
