//! The two transports a test runs over, behind one type each for streams, listeners and
//! dialers: netchannel's `VirtualStream` and kernel TCP through tokio's `TcpStream`
//! (`TCP_NODELAY`, as netchannel's streams are by default). A test's code is the same for
//! both; only the dialer differs.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use netchannel::{AppClass, Stack, VirtualListener, VirtualStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// One connection of either transport.
#[derive(Debug)]
pub enum Conn {
    /// A netchannel virtual stream.
    Virtual(VirtualStream),
    /// A kernel TCP connection.
    Kernel(TcpStream),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Virtual(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Kernel(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Virtual(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Kernel(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Virtual(s) => Pin::new(s).poll_flush(cx),
            Conn::Kernel(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Virtual(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Kernel(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A listener of either transport.
#[derive(Debug)]
pub enum Listener {
    /// A netchannel virtual listener.
    Virtual(VirtualListener),
    /// A kernel TCP listener.
    Kernel(TcpListener),
}

impl Listener {
    /// The next connection.
    pub async fn accept(&self) -> io::Result<(Conn, SocketAddr)> {
        match self {
            Listener::Virtual(l) => l.accept().await.map(|(s, a)| (Conn::Virtual(s), a)),
            Listener::Kernel(l) => {
                let (s, a) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok((Conn::Kernel(s), a))
            }
        }
    }
}

/// Where connections come from: a netchannel stack, or the kernel.
#[derive(Debug, Clone)]
pub enum Net {
    /// Virtual streams of this stack.
    Netchannel(Stack),
    /// Kernel TCP (in the calling thread's network namespace).
    Kernel,
}

impl Net {
    /// A connection to `addr`; latency-class when `latency` (netchannel: set before the
    /// connect, so that the stream lives apart from bulk streams on both stacks).
    pub async fn connect(&self, addr: SocketAddr, latency: bool) -> io::Result<Conn> {
        match self {
            Net::Netchannel(stack) => {
                let socket = stack.socket();
                if latency {
                    socket.set_app_class(AppClass::Latency)?;
                }
                Ok(Conn::Virtual(socket.connect(addr).await?))
            }
            Net::Kernel => {
                let s = TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                Ok(Conn::Kernel(s))
            }
        }
    }

    /// A listener on `addr`.
    pub async fn bind(&self, addr: SocketAddr) -> io::Result<Listener> {
        match self {
            Net::Netchannel(stack) => Ok(Listener::Virtual(stack.bind(addr).await?)),
            Net::Kernel => Ok(Listener::Kernel(TcpListener::bind(addr).await?)),
        }
    }

    /// Marks an accepted connection latency-class (netchannel; kernel TCP has no such
    /// thing).
    pub fn classify(conn: &Conn, latency: bool) -> io::Result<()> {
        match conn {
            Conn::Virtual(s) if latency => s.set_app_class(AppClass::Latency),
            _ => Ok(()),
        }
    }
}
