//! An in-process channel backend: [`MemNetwork`] joins any number of stacks with bounded
//! in-memory channels, so every virtual-socket test runs without privileges and without
//! a network.
//!
//! Each [`MemChannel`] end implements [`ChannelTransport`] like a netdriver
//! [`Channel`](netdriver::channel::Channel) does: a bounded queue of [`Bytes`] chunks
//! per direction (chunk and byte limits, so a reader that stops dequeuing holds its
//! sender back), wakers for "chunk to dequeue" and "room to enqueue", `close` as an end
//! of stream after the queued chunks, `abort` (and drop) as a reset seen by both ends.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use netdriver::channel::{ChannelError, ChannelStats, ChannelTransport, Dequeued, EnqueueError};

use super::backend::{Acceptor, Backend, BoxedTransport};

/// Limits of one direction of a [`MemChannel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemLimits {
    /// Most chunks queued in one direction.
    pub chunks: usize,
    /// Most bytes queued in one direction (a single larger chunk still enters an empty
    /// queue).
    pub bytes: usize,
}

impl Default for MemLimits {
    /// 256 chunks, 1 MiB.
    fn default() -> Self {
        MemLimits {
            chunks: 256,
            bytes: 1 << 20,
        }
    }
}

#[derive(Debug, Default)]
struct Direction {
    queue: VecDeque<Bytes>,
    bytes: usize,
    fin: bool,
    rx_waker: Option<Waker>,
    tx_waker: Option<Waker>,
    sent: u64,
}

#[derive(Debug)]
struct Pipe {
    dirs: [Direction; 2],
    reset: bool,
    limits: MemLimits,
}

#[cfg(test)]
thread_local! {
    /// Tests: an empty channel read on this thread wakes its waker at once, as
    /// `AtomicWaker::register` does when an arrival races the registration (a spurious
    /// wake-up, which wakers must tolerate), inside the reader's locks.
    pub(crate) static TEST_SPURIOUS_RX_WAKE: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One end of an in-memory channel. Dropping it resets the channel unless it was closed.
#[derive(Debug)]
pub struct MemChannel {
    pipe: Arc<Mutex<Pipe>>,
    side: usize,
}

impl MemChannel {
    /// Two connected ends.
    pub fn pair(limits: MemLimits) -> (MemChannel, MemChannel) {
        let pipe = Arc::new(Mutex::new(Pipe {
            dirs: Default::default(),
            reset: false,
            limits,
        }));
        (
            MemChannel {
                pipe: pipe.clone(),
                side: 0,
            },
            MemChannel { pipe, side: 1 },
        )
    }

    fn wake_all(p: &mut Pipe) -> Vec<Waker> {
        p.dirs
            .iter_mut()
            .flat_map(|d| [d.rx_waker.take(), d.tx_waker.take()])
            .flatten()
            .collect()
    }
}

impl ChannelTransport for MemChannel {
    fn enqueue(&self, chunk: Bytes) -> Result<(), EnqueueError> {
        let waker = {
            let mut p = lock(&self.pipe);
            if p.reset {
                return Err(EnqueueError::Closed(ChannelError::Reset));
            }
            let limits = p.limits;
            let d = &mut p.dirs[self.side];
            if d.fin {
                return Err(EnqueueError::Closed(ChannelError::Closed));
            }
            if !d.queue.is_empty()
                && (d.queue.len() >= limits.chunks || d.bytes + chunk.len() > limits.bytes)
            {
                return Err(EnqueueError::Full(chunk));
            }
            if chunk.is_empty() {
                return Ok(());
            }
            d.bytes += chunk.len();
            d.sent += chunk.len() as u64;
            d.queue.push_back(chunk);
            d.rx_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    fn dequeue(&self) -> Result<Dequeued, ChannelError> {
        let (r, waker) = {
            let mut p = lock(&self.pipe);
            if p.reset {
                return Err(ChannelError::Reset);
            }
            let d = &mut p.dirs[1 - self.side];
            match d.queue.pop_front() {
                Some(c) => {
                    d.bytes -= c.len();
                    (Dequeued::Chunk(c), d.tx_waker.take())
                }
                None if d.fin => (Dequeued::Finished, None),
                None => (Dequeued::Empty, None),
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(r)
    }

    fn poll_enqueue_ready(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        let mut p = lock(&self.pipe);
        if p.reset {
            return Poll::Ready(Err(ChannelError::Reset));
        }
        let limits = p.limits;
        let d = &mut p.dirs[self.side];
        if d.fin {
            return Poll::Ready(Err(ChannelError::Closed));
        }
        if d.queue.is_empty() || (d.queue.len() < limits.chunks && d.bytes < limits.bytes) {
            return Poll::Ready(Ok(()));
        }
        d.tx_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn poll_dequeue(&self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ChannelError>> {
        match self.dequeue() {
            Ok(Dequeued::Chunk(c)) => return Poll::Ready(Ok(Some(c))),
            Ok(Dequeued::Finished) => return Poll::Ready(Ok(None)),
            Err(e) => return Poll::Ready(Err(e)),
            Ok(Dequeued::Empty) => {}
        }
        let mut p = lock(&self.pipe);
        let reset = p.reset;
        let d = &mut p.dirs[1 - self.side];
        if !d.queue.is_empty() || d.fin || reset {
            drop(p);
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        d.rx_waker = Some(cx.waker().clone());
        #[cfg(test)]
        if TEST_SPURIOUS_RX_WAKE.with(|t| t.get()) {
            drop(p);
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    fn close(&self) {
        let w = {
            let mut p = lock(&self.pipe);
            let d = &mut p.dirs[self.side];
            d.fin = true;
            d.rx_waker.take()
        };
        if let Some(w) = w {
            w.wake();
        }
    }

    fn abort(&self) {
        let ws = {
            let mut p = lock(&self.pipe);
            if p.reset {
                return;
            }
            p.reset = true;
            for d in &mut p.dirs {
                d.queue.clear();
                d.bytes = 0;
            }
            MemChannel::wake_all(&mut p)
        };
        ws.into_iter().for_each(Waker::wake);
    }

    fn stats(&self) -> ChannelStats {
        let p = lock(&self.pipe);
        let tx = &p.dirs[self.side];
        let rx = &p.dirs[1 - self.side];
        ChannelStats {
            tx_queued: tx.bytes,
            rx_queued: rx.bytes,
            bytes_sent: tx.sent,
            bytes_acked: tx.sent - tx.bytes as u64,
            bytes_received: rx.sent - rx.bytes as u64,
            ..ChannelStats::default()
        }
    }
}

impl Drop for MemChannel {
    /// Resets the channel, unless this end closed it (then the peer reads the queued
    /// chunks and the end of stream, like a TCP close).
    fn drop(&mut self) {
        let closed = lock(&self.pipe).dirs[self.side].fin;
        if !closed {
            self.abort();
        }
    }
}

#[derive(Debug)]
struct AcceptQueue {
    queue: VecDeque<(MemChannel, SocketAddrV4)>,
    waker: Option<Waker>,
    closed: bool,
}

#[derive(Debug, Default)]
struct NetInner {
    listeners: HashMap<SocketAddrV4, Arc<Mutex<AcceptQueue>>>,
    next_port: u16,
}

/// An in-process network: stacks attached to it with [`MemNetwork::backend`] open
/// in-memory channels to each other's listened ports. Cloning shares the network.
#[derive(Debug, Clone, Default)]
pub struct MemNetwork {
    inner: Arc<Mutex<NetInner>>,
    limits: MemLimits,
    backlog: usize,
}

impl MemNetwork {
    /// An empty network with default channel limits.
    pub fn new() -> MemNetwork {
        MemNetwork::with_limits(MemLimits::default())
    }

    /// An empty network whose channels have these per-direction limits.
    pub fn with_limits(limits: MemLimits) -> MemNetwork {
        MemNetwork {
            inner: Arc::default(),
            limits,
            backlog: 128,
        }
    }

    /// A channel backend for a host with address `ipv4` on this network.
    pub fn backend(&self, ipv4: Ipv4Addr) -> MemBackend {
        MemBackend {
            net: self.clone(),
            ipv4,
        }
    }

    fn connect(
        &self,
        from: Ipv4Addr,
        to: SocketAddrV4,
    ) -> Result<(MemChannel, SocketAddrV4), ChannelError> {
        let mut net = lock(&self.inner);
        let q = net
            .listeners
            .get(&to)
            .cloned()
            .ok_or(ChannelError::Refused)?;
        net.next_port = net.next_port.wrapping_add(1);
        let local = SocketAddrV4::new(from, 20_000 + net.next_port % 40_000);
        drop(net);
        let mut q = lock(&q);
        if q.closed || q.queue.len() >= self.backlog {
            return Err(ChannelError::Refused);
        }
        let (client, server) = MemChannel::pair(self.limits);
        q.queue.push_back((server, local));
        if let Some(w) = q.waker.take() {
            w.wake();
        }
        Ok((client, local))
    }
}

/// A host's view of a [`MemNetwork`]: the [`Backend`] of an in-memory stack.
#[derive(Debug, Clone)]
pub struct MemBackend {
    net: MemNetwork,
    ipv4: Ipv4Addr,
}

/// Accepts in-memory channels to one listened address; dropping it stops listening and
/// resets channels not yet accepted.
#[derive(Debug)]
pub struct MemAcceptor {
    net: MemNetwork,
    addr: SocketAddrV4,
    queue: Arc<Mutex<AcceptQueue>>,
}

impl Acceptor for MemAcceptor {
    fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(BoxedTransport, SocketAddrV4), ChannelError>> {
        let mut q = lock(&self.queue);
        if let Some((c, peer)) = q.queue.pop_front() {
            return Poll::Ready(Ok((Box::new(c), peer)));
        }
        if q.closed {
            return Poll::Ready(Err(ChannelError::ShutDown));
        }
        q.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for MemAcceptor {
    fn drop(&mut self) {
        let mut net = lock(&self.net.inner);
        if net
            .listeners
            .get(&self.addr)
            .is_some_and(|q| Arc::ptr_eq(q, &self.queue))
        {
            net.listeners.remove(&self.addr);
        }
        drop(net);
        let mut q = lock(&self.queue);
        q.closed = true;
        q.queue.clear();
    }
}

impl Backend for MemBackend {
    fn ipv4(&self) -> Ipv4Addr {
        self.ipv4
    }

    fn connect(
        &self,
        remote: SocketAddrV4,
    ) -> Result<(BoxedTransport, SocketAddrV4), ChannelError> {
        let (c, local) = self.net.connect(self.ipv4, remote)?;
        Ok((Box::new(c), local))
    }

    fn listen(&self, port: u16) -> Result<Box<dyn Acceptor>, ChannelError> {
        let addr = SocketAddrV4::new(self.ipv4, port);
        let mut net = lock(&self.net.inner);
        if net.listeners.contains_key(&addr) {
            return Err(ChannelError::AddrInUse(port));
        }
        let queue = Arc::new(Mutex::new(AcceptQueue {
            queue: VecDeque::new(),
            waker: None,
            closed: false,
        }));
        net.listeners.insert(addr, queue.clone());
        Ok(Box::new(MemAcceptor {
            net: self.net.clone(),
            addr,
            queue,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_fifo_with_fin_and_reset() {
        let (a, b) = MemChannel::pair(MemLimits {
            chunks: 2,
            bytes: 10,
        });
        a.enqueue(Bytes::from_static(b"hello")).unwrap();
        a.enqueue(Bytes::from_static(b"world")).unwrap();
        assert!(matches!(
            a.enqueue(Bytes::from_static(b"!")),
            Err(EnqueueError::Full(_))
        ));
        assert_eq!(
            b.dequeue().unwrap(),
            Dequeued::Chunk(Bytes::from_static(b"hello"))
        );
        a.enqueue(Bytes::from_static(b"!")).unwrap();
        a.close();
        assert_eq!(
            b.dequeue().unwrap(),
            Dequeued::Chunk(Bytes::from_static(b"world"))
        );
        assert_eq!(
            b.dequeue().unwrap(),
            Dequeued::Chunk(Bytes::from_static(b"!"))
        );
        assert_eq!(b.dequeue().unwrap(), Dequeued::Finished);
        assert_eq!(b.stats().bytes_received, 11);
        a.abort();
        assert!(matches!(b.dequeue(), Err(ChannelError::Reset)));
    }

    #[test]
    fn refused_without_listener_and_accepts_with_one() {
        let net = MemNetwork::new();
        let a = net.backend(Ipv4Addr::new(10, 0, 0, 1));
        let b = net.backend(Ipv4Addr::new(10, 0, 0, 2));
        let to = SocketAddrV4::new(b.ipv4(), 9000);
        assert!(matches!(a.connect(to), Err(ChannelError::Refused)));
        let l = b.listen(9000).unwrap();
        let (c, _) = a.connect(to).unwrap();
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let Poll::Ready(Ok((s, peer))) = l.poll_accept(&mut cx) else {
            panic!("no channel accepted");
        };
        assert_eq!(*peer.ip(), a.ipv4());
        c.enqueue(Bytes::from_static(b"x")).unwrap();
        assert_eq!(
            s.dequeue().unwrap(),
            Dequeued::Chunk(Bytes::from_static(b"x"))
        );
        drop(l);
        assert!(matches!(a.connect(to), Err(ChannelError::Refused)));
    }
}
