//! [`VirtualSocket`]: options set before a stream connects or a listener listens, the
//! drop-in for `tokio::net::TcpSocket`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Mutex;
use std::time::Duration;

use super::{default_stack, loopback, Stack, VirtualListener, VirtualStream};
use crate::endpoint::SocketOptions;
use netsched::AppClass;

/// What is set on a [`VirtualSocket`] so far.
#[derive(Debug, Clone, Copy)]
struct Settings {
    opts: SocketOptions,
    keepalive: bool,
    reuseaddr: bool,
    reuseport: bool,
    linger: Option<Duration>,
    local: Option<SocketAddrV4>,
}

/// A socket whose options are set before it connects or listens, as with
/// `tokio::net::TcpSocket`: `use netchannel::net::TcpSocket` is the rename.
///
/// | option | on a virtual socket |
/// |---|---|
/// | `set_send_buffer_size` | the socket's send buffer (bytes `write` takes before it waits) |
/// | `set_recv_buffer_size` | the socket's receive buffer; the credit window its handshake announces scales with it (equal to the buffer by default) |
/// | `set_nodelay` | `true` (the default here, unlike the kernel's) sends each write at once; `false` is Nagle's algorithm: short chunks wait while data is unacknowledged, at most `vns::Config::nagle_delay` |
/// | `set_linger` | how the stream's drop closes (see [`VirtualStream::set_linger`]) |
/// | `bind` | the local address (the stack's own or `0.0.0.0`; `127.x.y.z` for loopback) and, before `connect`, the local virtual port |
/// | `set_keepalive` | a plain-TCP stream (to or from a host without NetChannel) probes its peer after two hours idle, every 75 s, failing after 9 unanswered probes (RFC 9293 §3.8.4, Linux's defaults); off by default, as the RFC asks. A virtual stream's liveness is the stack's, per channel ([`StackBuilder::keepalive`](super::StackBuilder::keepalive), on by default: a channel between two stacks is probed after 10 s idle), and it fails when its peer's channels time out |
/// | `set_reuseaddr`, `set_reuseport` | recorded only: a closed virtual socket leaves no `TIME_WAIT` to reuse past, and a virtual port has one listener |
///
/// A listener passes the buffer sizes, `nodelay` and `linger` on to the streams it
/// accepts. Streams to this host ([`Stack::connect`]) are kernel sockets, and get every
/// option for real.
///
/// ```no_run
/// # async fn demo(stack: vns::stack::Stack) -> std::io::Result<()> {
/// let socket = stack.socket();
/// socket.set_send_buffer_size(1 << 20)?;
/// socket.set_recv_buffer_size(1 << 20)?;
/// socket.set_nodelay(false)?; // let small writes coalesce
/// let stream = socket.connect("10.77.0.2:7000".parse().unwrap()).await?;
/// # drop(stream);
/// let listener = stack.socket();
/// listener.set_recv_buffer_size(64 * 1024)?;
/// listener.bind("0.0.0.0:7001".parse().unwrap())?;
/// let listener = listener.listen(1024)?;
/// # drop(listener);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct VirtualSocket {
    stack: Stack,
    settings: Mutex<Settings>,
}

fn ipv4_only() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "virtual sockets are IPv4 only")
}

fn size(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl VirtualSocket {
    pub(crate) fn new(stack: Stack) -> Self {
        VirtualSocket {
            stack,
            settings: Mutex::new(Settings {
                opts: SocketOptions::default(),
                keepalive: false,
                reuseaddr: false,
                reuseport: false,
                linger: None,
                local: None,
            }),
        }
    }

    /// A socket of the process's default stack (see
    /// [`set_default_stack`](super::set_default_stack)).
    pub fn new_v4() -> io::Result<VirtualSocket> {
        Ok(VirtualSocket::new(default_stack()?))
    }

    /// Fails with `Unsupported`: virtual sockets are IPv4 only.
    pub fn new_v6() -> io::Result<VirtualSocket> {
        Err(ipv4_only())
    }

    fn with<R>(&self, f: impl FnOnce(&mut Settings) -> R) -> R {
        f(&mut self.settings.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The stack's virtual-socket configuration (every shard has the same).
    fn vns_config(&self) -> crate::endpoint::Config {
        self.stack.core().lock_shard(0).ep.config().clone()
    }

    fn settings(&self) -> Settings {
        self.with(|s| *s)
    }

    /// The send buffer's size in bytes (at least 1).
    pub fn set_send_buffer_size(&self, size_bytes: u32) -> io::Result<()> {
        self.with(|s| s.opts.send_buffer = Some(size(size_bytes.max(1))));
        Ok(())
    }

    /// The send buffer's size: the one set, or the stack's default.
    pub fn send_buffer_size(&self) -> io::Result<u32> {
        let cfg = self.vns_config();
        let n = self.with(|s| s.opts.send_buffer.unwrap_or(cfg.send_buffer));
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// The receive buffer's size in bytes (at least one chunk's payload); the credit
    /// window the socket's handshake announces scales with it.
    pub fn set_recv_buffer_size(&self, size_bytes: u32) -> io::Result<()> {
        self.with(|s| s.opts.recv_buffer = Some(size(size_bytes)));
        Ok(())
    }

    /// The receive buffer's size: the one set (as it will be clamped), or the stack's
    /// default.
    pub fn recv_buffer_size(&self) -> io::Result<u32> {
        let cfg = self.vns_config();
        let n = self.with(|s| match s.opts.recv_buffer {
            Some(n) => n.clamp(cfg.max_chunk_payload, 1 << 29),
            None => cfg.recv_buffer,
        });
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// `TCP_NODELAY` (see the table above; `true` by default).
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.with(|s| s.opts.nodelay = nodelay);
        Ok(())
    }

    /// The `nodelay` setting.
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(self.with(|s| s.opts.nodelay))
    }

    /// The paper's `SO_APP_TYPE`, set before `connect`: the stream is of this class from
    /// its first chunk (see [`VirtualStream::set_app_class`]). A latency-class stream
    /// connected so also lives in the stack's latency shard, apart from bulk streams, on
    /// both hosts ([`crate::ShardOf`]): its calls never wait for a lock that bulk
    /// streams' tasks hold, which [`VirtualStream::set_app_class`] after the connect does
    /// not give. `Throughput` by default; ignored by `listen`.
    ///
    /// ```no_run
    /// # async fn demo(stack: vns::stack::Stack) -> std::io::Result<()> {
    /// let socket = stack.socket();
    /// socket.set_app_class(vns::AppClass::Latency)?;
    /// let stream = socket.connect("10.77.0.2:7000".parse().unwrap()).await?;
    /// assert_eq!(stream.app_class(), vns::AppClass::Latency);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_app_class(&self, class: AppClass) -> io::Result<()> {
        self.with(|s| s.opts.app_class = class);
        Ok(())
    }

    /// The `app_class` setting.
    pub fn app_class(&self) -> io::Result<AppClass> {
        Ok(self.with(|s| s.opts.app_class))
    }

    /// `SO_LINGER` for the stream this socket becomes (see
    /// [`VirtualStream::set_linger`]).
    pub fn set_linger(&self, dur: Option<Duration>) -> io::Result<()> {
        self.with(|s| s.linger = dur);
        Ok(())
    }

    /// The `linger` setting.
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        Ok(self.with(|s| s.linger))
    }

    /// Keep-alive for a plain-TCP stream (see the table above); virtual streams have their
    /// channels' liveness.
    pub fn set_keepalive(&self, keepalive: bool) -> io::Result<()> {
        self.with(|s| s.keepalive = keepalive);
        Ok(())
    }

    /// The value last given to [`set_keepalive`](Self::set_keepalive).
    pub fn keepalive(&self) -> io::Result<bool> {
        Ok(self.with(|s| s.keepalive))
    }

    /// Recorded (see the table above).
    pub fn set_reuseaddr(&self, reuseaddr: bool) -> io::Result<()> {
        self.with(|s| s.reuseaddr = reuseaddr);
        Ok(())
    }

    /// The value last given to [`set_reuseaddr`](Self::set_reuseaddr).
    pub fn reuseaddr(&self) -> io::Result<bool> {
        Ok(self.with(|s| s.reuseaddr))
    }

    /// Recorded (see the table above).
    pub fn set_reuseport(&self, reuseport: bool) -> io::Result<()> {
        self.with(|s| s.reuseport = reuseport);
        Ok(())
    }

    /// The value last given to [`set_reuseport`](Self::set_reuseport).
    pub fn reuseport(&self) -> io::Result<bool> {
        Ok(self.with(|s| s.reuseport))
    }

    /// Chooses the local address: the stack's own, `0.0.0.0` or a loopback address, and
    /// a port (0: chosen at `connect` or `listen`). Fails with `AddrNotAvailable` for
    /// any other address.
    pub fn bind(&self, addr: SocketAddr) -> io::Result<()> {
        let SocketAddr::V4(v4) = addr else {
            return Err(ipv4_only());
        };
        let ip = *v4.ip();
        if !(ip.is_unspecified() || ip.is_loopback() || ip == self.stack.ipv4()) {
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!(
                    "{addr} is not this stack's address {}, 0.0.0.0 or a loopback address",
                    self.stack.ipv4()
                ),
            ));
        }
        self.with(|s| s.local = Some(v4));
        Ok(())
    }

    /// The address given to [`bind`](Self::bind) (`0.0.0.0:0` before it).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        let local = self.with(|s| s.local);
        Ok(local
            .unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))
            .into())
    }

    /// Connects with these options: a virtual socket to another host, or a kernel
    /// socket through the loopback interface to this one (see [`Stack::connect`]).
    /// A local port chosen with [`bind`](Self::bind) must be free for that peer and
    /// port; with shards it must also map to a shard with the remote port as received
    /// chunks do, or the connect fails with `AddrInUse` (pick another, or 0).
    pub async fn connect(self, addr: SocketAddr) -> io::Result<VirtualStream> {
        let SocketAddr::V4(v4) = addr else {
            return Err(ipv4_only());
        };
        let set = self.settings();
        let stream = if loopback::is_local(*v4.ip(), self.stack.ipv4()) {
            self.connect_loopback(v4, &set).await?
        } else {
            let mut opts = set.opts;
            opts.local_port = set.local.map(|l| l.port()).filter(|&p| p != 0);
            super::stream::connect_with(&self.stack, v4, opts).await?
        };
        if set.linger.is_some() {
            stream.set_linger(set.linger)?;
        }
        if set.keepalive {
            stream.set_keepalive(true);
        }
        Ok(stream)
    }

    async fn connect_loopback(
        &self,
        to: SocketAddrV4,
        set: &Settings,
    ) -> io::Result<VirtualStream> {
        if self.stack.core().refuses_new() {
            return Err(super::core::stopped_error());
        }
        let k = tokio::net::TcpSocket::new_v4()?;
        if let Some(n) = set.opts.send_buffer {
            k.set_send_buffer_size(u32::try_from(n).unwrap_or(u32::MAX))?;
        }
        if let Some(n) = set.opts.recv_buffer {
            k.set_recv_buffer_size(u32::try_from(n).unwrap_or(u32::MAX))?;
        }
        k.set_nodelay(set.opts.nodelay)?;
        k.set_keepalive(set.keepalive)?;
        k.set_reuseaddr(set.reuseaddr)?;
        if let Some(local) = set.local.filter(|l| l.port() != 0) {
            k.bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, local.port()).into())?;
        }
        let inner = loopback::connect_socket(k, to, self.stack.ipv4()).await?;
        Ok(VirtualStream::loopback(inner))
    }

    /// Listens on the address given to [`bind`](Self::bind) (`0.0.0.0:0` if none) with
    /// this backlog, as [`Stack::bind_with_backlog`] does; the streams it accepts get
    /// this socket's buffer sizes, `nodelay` and `linger`.
    pub fn listen(self, backlog: u32) -> io::Result<VirtualListener> {
        let set = self.settings();
        let addr = set
            .local
            .unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
        let mut l = self.stack.listen_now(addr.into(), size(backlog.max(1)))?;
        l.set_accept_options(set.opts, set.linger)?;
        l.set_accept_keepalive(set.keepalive);
        Ok(l)
    }
}
