//! What every queue of a channel set and its handles share: the flow directory, the
//! port allocator, the forwarding pool, each queue's command and forwarding inboxes and
//! counters, the steering program's endpoint claims, and the listeners.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crossbeam_channel::Sender;
use tracing::warn;

use super::directory::{BufferPool, FlowDirectory, PortAllocator, Tuple};
use super::listener::ListenerShared;
use super::queue::Limits;
use super::round::Command;
use super::signal::QueueSignal;
use super::stats::{ChecksumCounters, SynCounters};
use super::steering::SetSteering;
use super::ChannelError;
use crate::netif::StrayVerdict;

/// One queue as the rest of the set sees it (whichever runtime drives it).
#[derive(Debug)]
pub(crate) struct Peer {
    pub(crate) queue: u32,
    pub(crate) signal: Arc<QueueSignal>,
    pub(crate) commands: Sender<Command>,
    pub(crate) forward: Sender<Vec<u8>>,
    /// The queue's checksum counters, republished every round.
    pub(crate) checksums: ChecksumCounters,
    /// The queue's SYN counters, republished every round.
    pub(crate) syns: SynCounters,
    /// Connections the queue lost to a RST from the peer.
    pub(crate) resets_received: AtomicU64,
    /// Segments its [`RxDrop`](crate::netif::RxDrop) rule dropped (fault injection).
    pub(crate) rx_fault_dropped: AtomicU64,
}

/// What all queues of a set and its handles share.
#[derive(Debug)]
pub(crate) struct SetShared {
    pub(crate) ipv4: Ipv4Addr,
    pub(crate) directory: FlowDirectory,
    pub(crate) ports: PortAllocator,
    pub(crate) pool: BufferPool,
    pub(crate) peers: Vec<Peer>,
    /// The steering (XDP program, or AF_PACKET socket filter and TCX program); `None` once
    /// detached at shutdown (and always for sets on an in-memory switch: see `steered`).
    pub(crate) steering: RwLock<Option<SetSteering>>,
    /// Whether the set steers its endpoints with a program (AF_XDP, AF_PACKET); an
    /// in-memory set has nothing to claim.
    pub(crate) steered: bool,
    pub(crate) tx_limits: Limits,
    pub(crate) rx_limits: Limits,
    pub(crate) nodelay: bool,
    pub(crate) stopped: AtomicBool,
    pub(crate) listeners: Mutex<HashMap<u16, Arc<ListenerShared>>>,
    /// Connections per claimed local endpoint.
    pub(crate) endpoints: Mutex<HashMap<SocketAddrV4, usize>>,
    /// Frames handed from the receiving queue to the owning one.
    pub(crate) forwarded: AtomicU64,
    /// Frames dropped because the owner's forwarding queue was full.
    pub(crate) forward_dropped: AtomicU64,
}

impl SetShared {
    /// Hands `frame` to queue `owner` (a copy in a pooled buffer), waking it; `Drop` when
    /// its queue is full.
    pub(crate) fn forward(&self, owner: usize, frame: &[u8]) -> StrayVerdict {
        let Some(peer) = self.peers.get(owner) else {
            return StrayVerdict::Drop;
        };
        match peer.forward.try_send(self.pool.copy_of(frame)) {
            Ok(()) => {
                peer.signal.notify_control();
                self.forwarded.fetch_add(1, Ordering::Relaxed);
                StrayVerdict::Forwarded
            }
            Err(e) => {
                self.pool.put(e.into_inner());
                self.forward_dropped.fetch_add(1, Ordering::Relaxed);
                StrayVerdict::Drop
            }
        }
    }

    /// Releases a flow of queue `me`: its directory entry, its claim on its local
    /// endpoint and, for an outgoing channel, its port.
    pub(crate) fn release_flow(&self, me: usize, tuple: &Tuple, active_port: Option<u16>) {
        self.directory.remove(tuple, me);
        self.unclaim_endpoint(tuple.0);
        if let Some(port) = active_port {
            self.ports.release(port);
        }
    }

    /// Releases what one connection of a flow of queue `me` held, as
    /// [`release_flow`](Self::release_flow), but keeps the directory entry when
    /// `successor`: a newer connection of the same 4-tuple lives on the same queue (a SYN
    /// ended the old one's TIME-WAIT) and owns the flow now.
    pub(crate) fn release_incarnation(
        &self,
        me: usize,
        tuple: &Tuple,
        active_port: Option<u16>,
        successor: bool,
    ) {
        if !successor {
            self.directory.remove(tuple, me);
        }
        self.unclaim_endpoint(tuple.0);
        if let Some(port) = active_port {
            self.ports.release(port);
        }
    }

    /// Counts one more connection on local endpoint `ep`, which the steering program
    /// steers to the stack while any is counted. Accepted connections share their
    /// listener's endpoint and keep it steered after the listener is gone, so that their
    /// segments never fall to the kernel (which would answer with resets).
    pub(crate) fn claim_endpoint(&self, ep: SocketAddrV4) -> Result<(), ChannelError> {
        let mut eps = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        let n = eps.get(&ep).copied().unwrap_or(0);
        if n == 0 && self.steered {
            self.with_steering(|s| s.own_endpoint(ep))?;
        }
        eps.insert(ep, n + 1);
        Ok(())
    }

    /// Undoes one [`claim_endpoint`](Self::claim_endpoint).
    pub(crate) fn unclaim_endpoint(&self, ep: SocketAddrV4) {
        let mut eps = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        let Some(n) = eps.get_mut(&ep) else {
            return;
        };
        if *n > 1 {
            *n -= 1;
        } else {
            eps.remove(&ep);
            if let Some(s) = self.steering_read().as_ref() {
                if let Err(e) = s.release_endpoint(ep) {
                    warn!(local = %ep, error = %e, "releasing a channel endpoint");
                }
            }
        }
    }

    pub(crate) fn steering_read(&self) -> std::sync::RwLockReadGuard<'_, Option<SetSteering>> {
        self.steering.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the steering program; for an in-memory set (nothing to steer), `f`
    /// is skipped and `T::default()` returned.
    pub(crate) fn with_steering<T: Default>(
        &self,
        f: impl FnOnce(&SetSteering) -> Result<T, ChannelError>,
    ) -> Result<T, ChannelError> {
        if !self.steered {
            return Ok(T::default());
        }
        match self.steering_read().as_ref() {
            Some(s) => f(s),
            None => Err(ChannelError::ShutDown),
        }
    }

    pub(crate) fn listeners(&self) -> std::sync::MutexGuard<'_, HashMap<u16, Arc<ListenerShared>>> {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SetShared {
    pub(crate) fn ports_range(&self) -> RangeInclusive<u16> {
        self.ports.range()
    }

    /// A set without steering program or drivers, around `peers`, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(peers: Vec<Peer>) -> SetShared {
        SetShared {
            ipv4: Ipv4Addr::new(10, 0, 0, 1),
            directory: FlowDirectory::default(),
            ports: PortAllocator::new(61000..=61009),
            pool: BufferPool::new(4),
            peers,
            steering: RwLock::new(None),
            steered: false,
            tx_limits: super::QueueLimits::default().into(),
            rx_limits: super::QueueLimits::default().into(),
            nodelay: true,
            stopped: AtomicBool::new(false),
            listeners: Mutex::new(HashMap::new()),
            endpoints: Mutex::new(HashMap::new()),
            forwarded: AtomicU64::new(0),
            forward_dropped: AtomicU64::new(0),
        }
    }
}
