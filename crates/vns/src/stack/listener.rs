//! [`VirtualListener`]: accepts virtual sockets on a virtual port.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tracing::debug;

use super::core::stopped_error;
use super::loopback::LoopbackListener;
use super::stream::{PlainInner, StreamInner, VirtualStream};
use super::{default_stack, resolve_v4, Stack};
use crate::endpoint::{Error, SocketOptions};
use netdriver::channel::ChannelListener;

/// Listens on a virtual port of a stack: the drop-in for `tokio::net::TcpListener`.
///
/// Connections the peer completed wait in a bounded backlog until
/// [`accept`](Self::accept) takes them. While it is full, further SYNCs are dropped and
/// their clients send them again until an accept makes room or their connect times out,
/// as with a kernel listener whose accept queue is full (not refused). Dropping the listener stops listening and
/// resets connections still in the backlog.
pub struct VirtualListener {
    stack: Stack,
    /// The address it was bound to (`0.0.0.0` stays so, as with the kernel).
    ip: Ipv4Addr,
    port: u16,
    /// Whether the port is a virtual port (not for a listener on a loopback address).
    virt: bool,
    /// Plain-TCP connections to the same port, from hosts without NetChannel.
    plain: Option<ChannelListener>,
    /// Connections from this host, through the kernel's loopback interface.
    kernel: Option<LoopbackListener>,
    /// The tasks waiting in `accept`: the stack and the plain acceptor hold one waker,
    /// this list's, which wakes them all (each tries again; one gets the connection).
    waiters: Arc<Waiters>,
    /// The shard the next `accept` looks in first.
    next: AtomicUsize,
    /// `SO_LINGER` for the streams it accepts ([`VirtualSocket::listen`]).
    ///
    /// [`VirtualSocket::listen`]: super::VirtualSocket::listen
    accept_linger: Option<Duration>,
    /// `TCP_NODELAY` for the loopback streams it accepts (virtual ones get it from the
    /// endpoint's listener options).
    accept_nodelay: Option<bool>,
    /// `SO_KEEPALIVE` for the plain-TCP streams it accepts (off by default, as RFC 9293
    /// §3.8.4 asks; [`VirtualSocket::set_keepalive`]).
    ///
    /// [`VirtualSocket::set_keepalive`]: super::VirtualSocket::set_keepalive
    accept_keepalive: bool,
}

/// Wakers of the tasks awaiting `accept` on one listener.
#[derive(Default)]
struct Waiters(Mutex<Vec<Waker>>);

impl Waiters {
    fn add(&self, w: &Waker) {
        let mut ws = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !ws.iter().any(|x| x.will_wake(w)) {
            ws.push(w.clone());
        }
    }
}

impl Wake for Waiters {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let ws = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        ws.into_iter().for_each(Waker::wake);
    }
}

impl fmt::Debug for VirtualListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualListener")
            .field("local", &self.local())
            .finish()
    }
}

impl VirtualListener {
    pub(crate) fn new(
        stack: Stack,
        ip: Ipv4Addr,
        port: u16,
        plain: Option<ChannelListener>,
        kernel: Option<LoopbackListener>,
    ) -> Self {
        VirtualListener {
            stack,
            ip,
            port,
            virt: true,
            plain,
            kernel,
            waiters: Arc::default(),
            next: AtomicUsize::new(0),
            accept_linger: None,
            accept_nodelay: None,
            accept_keepalive: false,
        }
    }

    /// What the streams it accepts from now on get: buffer sizes and `nodelay` (passed to
    /// every shard's endpoint), and `linger`.
    pub(crate) fn set_accept_options(
        &mut self,
        opts: SocketOptions,
        linger: Option<Duration>,
    ) -> io::Result<()> {
        if self.virt {
            let mut r = Ok(());
            self.stack.core().each_shard(|_, s| {
                if let Err(e) = s.ep.set_listener_options(self.port, opts) {
                    r = Err(e);
                }
            });
            r?;
        }
        self.accept_linger = linger;
        self.accept_nodelay = Some(opts.nodelay);
        Ok(())
    }

    /// Keep-alive for the plain-TCP streams it accepts from now on.
    pub(crate) fn set_accept_keepalive(&mut self, on: bool) {
        self.accept_keepalive = on;
    }

    /// Applies the accept options to a stream just accepted.
    fn accepted(&self, s: VirtualStream) -> io::Result<VirtualStream> {
        if self.accept_keepalive {
            s.set_keepalive(true);
        }
        if self.accept_linger.is_some() {
            s.set_linger(self.accept_linger)?;
        }
        if let (Some(on), true) = (self.accept_nodelay, s.is_loopback()) {
            s.set_nodelay(on)?;
        }
        Ok(s)
    }

    /// A listener on a loopback address: only the kernel's.
    pub(crate) fn loopback_only(
        stack: Stack,
        ip: Ipv4Addr,
        port: u16,
        kernel: LoopbackListener,
    ) -> Self {
        let mut l = VirtualListener::new(stack, ip, port, None, Some(kernel));
        l.virt = false;
        l
    }

    /// Like `TcpListener::into_std`, which cannot be honoured: a virtual port has no
    /// kernel socket. Fails with `Unsupported` (the listener is dropped); for the same
    /// reason `VirtualListener` implements neither `AsRawFd` nor `AsFd`.
    pub fn into_std(self) -> io::Result<std::net::TcpListener> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a virtual listener has no kernel socket; into_std, AsRawFd and AsFd cannot be honoured",
        ))
    }

    /// Whether connections from this host reach the listener (through the kernel's
    /// loopback interface; see [`Stack::bind`]).
    pub fn serves_loopback(&self) -> bool {
        self.kernel.is_some()
    }

    /// Listens on `addr` through the process's default stack (see
    /// [`set_default_stack`](super::set_default_stack)).
    pub async fn bind(addr: impl tokio::net::ToSocketAddrs) -> io::Result<VirtualListener> {
        let stack = default_stack()?;
        let mut last = None;
        for a in resolve_v4(addr).await? {
            match stack.bind(a.into()).await {
                Ok(l) => return Ok(l),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("resolve_v4 returns at least one address"))
    }

    /// The address connections arrive at (the stack's, also for a `0.0.0.0` bind).
    fn local(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.stack.core().ipv4(), self.port)
    }

    /// Like `TcpListener::ttl`: the IPv4 time to live of the segments of accepted
    /// streams, [`IP_TTL`](super::stream::IP_TTL) (the interface's, for every segment).
    pub fn ttl(&self) -> io::Result<u32> {
        Ok(super::stream::IP_TTL)
    }

    /// Like `TcpListener::set_ttl`: setting [`IP_TTL`](super::stream::IP_TTL) succeeds,
    /// any other value fails with `Unsupported` (see [`VirtualStream::set_ttl`]).
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        if ttl == super::stream::IP_TTL {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the stack sends every segment with TTL 64; a listener cannot change it",
        ))
    }

    /// The address listened on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddrV4::new(self.ip, self.port).into())
    }

    /// Waits for the next connection; returns it with the peer's address.
    pub async fn accept(&self) -> io::Result<(VirtualStream, SocketAddr)> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// Polls for the next connection. One task at a time should wait on a listener.
    pub fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(VirtualStream, SocketAddr)>> {
        let core = self.stack.core();
        if core.refuses_new() {
            return Poll::Ready(Err(stopped_error()));
        }
        // The listener is in every shard (a SYNC goes to the shard its ports map to):
        // look in each, from a rotating start so that no shard's queue waits behind
        // another's.
        let count = if self.virt { core.shard_count() } else { 0 };
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let waker = Waker::from(self.waiters.clone());
        self.waiters.add(cx.waker());
        for k in 0..count {
            let i = (first + k) % count;
            let mut st = core.lock_shard(i);
            match st.ep.accept(self.port) {
                Ok(sid) => {
                    st.track(sid);
                    let (peer, local, remote) = st.ep.socket_addr(sid).expect("just accepted");
                    // What the accept made due (a credit update) goes now.
                    core.finish_call(st);
                    let ip = core.peer_ip(peer).expect("channels of known peers only");
                    let peer_addr = SocketAddrV4::new(ip, remote);
                    debug!(socket = %sid, peer = %peer_addr, "accepted");
                    let inner = StreamInner::new(
                        self.stack.clone(),
                        sid,
                        SocketAddrV4::new(core.ipv4(), local),
                        peer_addr,
                    );
                    let s = self.accepted(VirtualStream::from_inner(inner));
                    return Poll::Ready(s.map(|s| (s, peer_addr.into())));
                }
                Err(Error::WouldBlock) if st.stopped => return Poll::Ready(Err(stopped_error())),
                Err(Error::WouldBlock) => {
                    st.listeners.insert(self.port, Some(waker.clone()));
                }
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
        let mut cx = Context::from_waker(&waker);
        if let Poll::Ready(r) = self.poll_accept_plain(&mut cx) {
            return Poll::Ready(r.and_then(|(s, peer)| Ok((self.accepted(s)?, peer))));
        }
        match self.kernel.as_ref().map(|k| k.poll_accept(&mut cx)) {
            Some(Poll::Ready(Ok((k, peer)))) => {
                let s = self.accepted(VirtualStream::loopback(k));
                Poll::Ready(s.map(|s| (s, peer.into())))
            }
            Some(Poll::Ready(Err(e))) => Poll::Ready(Err(e)),
            Some(Poll::Pending) | None => Poll::Pending,
        }
    }
}

impl VirtualListener {
    fn poll_accept_plain(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(VirtualStream, SocketAddr)>> {
        let Some(a) = self.plain.as_ref() else {
            return Poll::Pending;
        };
        match a.poll_accept(cx) {
            Poll::Ready(Ok(t)) => {
                let peer = t.peer_addr();
                debug!(%peer, port = self.port, "accepted a plain-TCP connection");
                let inner = PlainInner::new(self.stack.clone(), t, self.local(), peer);
                Poll::Ready(Ok((VirtualStream::plain(inner), peer.into())))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e.into())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for VirtualListener {
    fn drop(&mut self) {
        if !self.virt {
            return;
        }
        let core = self.stack.core();
        for i in 0..core.shard_count() {
            let mut st = core.lock_shard(i);
            st.listeners.remove(&self.port);
            let _ = st.ep.unbind(self.port);
            // The resets of connections still in the backlog go now.
            core.finish_call(st);
        }
    }
}
