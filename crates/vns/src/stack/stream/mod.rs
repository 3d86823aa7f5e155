//! [`VirtualStream`]: a virtual socket as a tokio byte stream, and its split halves.

// The readiness macros first: the halves use them.
#[macro_use]
mod readiness;
mod connect;
mod halves;
mod linger;
mod plain;
mod sock;
mod virtual_inner;
mod would_block;

pub(crate) use connect::{connect, connect_with};
pub use halves::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, ReuniteError, WriteHalf};
pub(crate) use plain::PlainInner;
pub(crate) use sock::Sock;
pub(crate) use virtual_inner::StreamInner;

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use netsched::AppClass;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::default_stack;
use super::loopback::KernelInner;
#[cfg(test)]
use crate::endpoint::SocketId;

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
///   (see [`Diagnostics::lingering_sockets`](crate::Diagnostics::lingering_sockets)) until its bytes and FIN are out and the peer's
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

    /// The stack's shard that holds this virtual socket (see [`Diagnostics::latency_shard`](crate::Diagnostics::latency_shard));
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
