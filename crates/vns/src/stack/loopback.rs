//! Streams to the stack's own host: `127.0.0.0/8` and the stack's own address.
//!
//! A stack's channels leave through a NIC queue, and a packet a host sends to itself never
//! reaches one, so connections that stay on the host are carried by the kernel's loopback
//! interface as plain TCP (`tokio::net::TcpStream`), where the kernel already gives them
//! the semantics a `TcpStream` user expects (close, reset, `SO_LINGER`, `TCP_NODELAY`).
//! A [`VirtualListener`](super::VirtualListener) bound to `0.0.0.0`, to `127.x.y.z` or to
//! the stack's address also listens on the kernel's `127.0.0.1` (or that `127.x.y.z`)
//! with the same port; [`Stack::connect`](super::Stack::connect) to `127.x.y.z` or to the
//! stack's own address goes there.
//!
//! What differs from a virtual socket: the stream has no application class, no virtual
//! header and no channel; [`VirtualStream::is_loopback`](super::VirtualStream::is_loopback)
//! tells it apart. An accepted loopback stream reports `127.0.0.1` addresses (the kernel
//! cannot tell which of the host's addresses the client dialled).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::ReadBuf;
use tracing::debug;

/// A kernel TCP stream over the loopback interface, behind a `VirtualStream`.
pub(crate) struct KernelInner {
    stream: tokio::net::TcpStream,
    local: SocketAddrV4,
    peer: SocketAddrV4,
}

fn v4(a: SocketAddr) -> SocketAddrV4 {
    match a {
        SocketAddr::V4(a) => a,
        // Only IPv4 loopback addresses are ever dialled or listened on.
        SocketAddr::V6(a) => SocketAddrV4::new(Ipv4Addr::LOCALHOST, a.port()),
    }
}

impl KernelInner {
    /// Wraps an accepted or connected stream; `local` and `peer` are the addresses the
    /// stream reports (see the module's documentation).
    fn new(stream: tokio::net::TcpStream, local: SocketAddrV4, peer: SocketAddrV4) -> Self {
        KernelInner {
            stream,
            local,
            peer,
        }
    }

    pub(crate) fn local(&self) -> SocketAddrV4 {
        self.local
    }

    pub(crate) fn peer(&self) -> SocketAddrV4 {
        self.peer
    }

    pub(crate) fn poll_read(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if let Err(e) = std::task::ready!(self.stream.poll_read_ready(cx)) {
                return Poll::Ready(Err(e));
            }
            match self.stream.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // The readiness was stale; `poll_read_ready` registers the task again.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    pub(crate) fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            if let Err(e) = std::task::ready!(self.stream.poll_write_ready(cx)) {
                return Poll::Ready(Err(e));
            }
            match self.stream.try_write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    pub(crate) fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            if let Err(e) = std::task::ready!(self.stream.poll_write_ready(cx)) {
                return Poll::Ready(Err(e));
            }
            match self.stream.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    /// Sends a FIN after what was written (`shutdown(SHUT_WR)`), as tokio's does.
    pub(crate) fn poll_shutdown(&self) -> Poll<io::Result<()>> {
        let r = socket2::SockRef::from(&self.stream).shutdown(std::net::Shutdown::Write);
        Poll::Ready(match r {
            // Already shut down, or the peer is gone: nothing left to send.
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            r => r,
        })
    }

    pub(crate) fn poll_peek_into(
        &self,
        cx: &mut Context<'_>,
        probe: Option<&mut ReadBuf<'_>>,
    ) -> Poll<io::Result<usize>> {
        match probe {
            Some(buf) => self.stream.poll_peek(cx, buf),
            None => self.stream.poll_read_ready(cx).map_ok(|()| 0),
        }
    }

    pub(crate) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream.poll_write_ready(cx)
    }

    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.try_read(buf)
    }

    pub(crate) fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        self.stream.try_write(data)
    }

    pub(crate) fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.stream.try_write_vectored(bufs)
    }

    /// The kernel socket, in non-blocking mode as tokio's `into_std` leaves it.
    pub(crate) fn into_std(self) -> io::Result<std::net::TcpStream> {
        self.stream.into_std()
    }

    pub(crate) fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.stream.set_nodelay(on)
    }

    pub(crate) fn nodelay(&self) -> io::Result<bool> {
        self.stream.nodelay()
    }

    pub(crate) fn set_quickack(&self, on: bool) -> io::Result<()> {
        self.stream.set_quickack(on)
    }

    pub(crate) fn quickack(&self) -> io::Result<bool> {
        self.stream.quickack()
    }

    pub(crate) fn set_linger(&self, dur: Option<Duration>) -> io::Result<()> {
        socket2::SockRef::from(&self.stream).set_linger(dur)
    }

    pub(crate) fn linger(&self) -> io::Result<Option<Duration>> {
        socket2::SockRef::from(&self.stream).linger()
    }
}

/// Whether a connect to `ip` stays on the host: `127.0.0.0/8` or the stack's `own` address.
pub(crate) fn is_local(ip: Ipv4Addr, own: Ipv4Addr) -> bool {
    ip.is_loopback() || ip == own
}

/// Connects over the kernel's loopback interface to `addr` (`127.x.y.z`, or the stack's
/// `own` address, which is dialled as `127.0.0.1`). Nothing listening is
/// `ConnectionRefused`, as from the kernel.
pub(crate) async fn connect(addr: SocketAddrV4, own: Ipv4Addr) -> io::Result<KernelInner> {
    connect_socket(tokio::net::TcpSocket::new_v4()?, addr, own).await
}

/// [`connect`] through a kernel socket with options set
/// ([`VirtualSocket`](super::VirtualSocket)).
pub(crate) async fn connect_socket(
    socket: tokio::net::TcpSocket,
    addr: SocketAddrV4,
    own: Ipv4Addr,
) -> io::Result<KernelInner> {
    let to_self = *addr.ip() == own && !own.is_loopback();
    let dial = if to_self {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, addr.port())
    } else {
        addr
    };
    let stream = socket.connect(dial.into()).await?;
    wrap(stream, addr, own, to_self)
}

fn wrap(
    stream: tokio::net::TcpStream,
    addr: SocketAddrV4,
    own: Ipv4Addr,
    to_self: bool,
) -> io::Result<KernelInner> {
    let mut local = v4(stream.local_addr()?);
    if to_self {
        // The kernel would report the address dialled on both sides.
        local.set_ip(own);
    }
    debug!(%addr, %local, "connected over the kernel's loopback interface");
    Ok(KernelInner::new(stream, local, addr))
}

/// The kernel half of a [`VirtualListener`](super::VirtualListener): listens on the
/// loopback address for the stack's own connections.
pub(crate) struct LoopbackListener {
    listener: tokio::net::TcpListener,
}

impl LoopbackListener {
    /// Listens on `addr` (a loopback address). Fails as the kernel's `bind` does, and with
    /// `Unsupported` in a tokio runtime built without I/O (`enable_io`), where tokio
    /// cannot register the socket.
    pub(crate) fn bind(addr: SocketAddrV4) -> io::Result<LoopbackListener> {
        let std = std::net::TcpListener::bind(addr)?;
        std.set_nonblocking(true)?;
        // tokio panics when the runtime has no I/O driver; that is a configuration the
        // rest of the stack supports, so it only means "no loopback listener here".
        let listener = std::panic::catch_unwind(move || tokio::net::TcpListener::from_std(std))
            .map_err(|_| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "loopback listener needs a tokio runtime with I/O enabled (enable_io)",
            )
        })??;
        Ok(LoopbackListener { listener })
    }

    /// The port the kernel listens on.
    pub(crate) fn port(&self) -> io::Result<u16> {
        Ok(self.listener.local_addr()?.port())
    }

    pub(crate) fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(KernelInner, SocketAddrV4)>> {
        self.listener.poll_accept(cx).map_ok(|(stream, peer)| {
            let peer = v4(peer);
            let local = stream
                .local_addr()
                .map(v4)
                .unwrap_or(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0));
            debug!(%peer, %local, "accepted a loopback connection");
            (KernelInner::new(stream, local, peer), peer)
        })
    }
}
