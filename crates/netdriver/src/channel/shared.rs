//! What every queue of a channel set and its handles share: the flow directory, the
//! port allocator, the RSS aligner, the forwarding pool, each queue's command and
//! forwarding inboxes and counters, the steering program's endpoint claims, and the
//! listeners.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crossbeam_channel::Sender;
use tracing::warn;

use super::accept_queue::ListenerShared;
use super::command::Command;
use super::directory::{BufferPool, FlowDirectory, PortAllocator, Tuple};
use super::queue::Limits;
use super::signal::QueueSignal;
use super::stats::{ChecksumCounters, SynCounters};
use super::steering::SetSteering;
use super::ChannelError;
use crate::netif::StrayVerdict;
use crate::rss::{ChannelEnds, ConnectSteering, PeerTarget, RssAligner};

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
    /// Chooses the local port (and, where the NIC's RSS decides, the queue) of each
    /// channel the set opens, and counts how every channel's frames reach its queue.
    pub(crate) aligner: RssAligner,
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

    /// The local port of a channel to `remote` from queue `index`, claimed from the
    /// allocator (scanning from where the last claim left off), and how its frames will
    /// reach its queue ([`RssAligner::connect_among`]). When `movable` and the
    /// interface's RSS is known, any live queue may own the channel if no free port lands
    /// on queue `index`: [`ConnectSteering::queue`] names the owner. Without a known RSS
    /// (veth, alignment off): the next free port, on queue `index`. With `peer`, a port
    /// that also lands on one of its queues at the peer is preferred
    /// ([`ConnectSteering::peer_alignment`] says whether one did).
    pub(crate) fn choose_port(
        &self,
        index: usize,
        movable: bool,
        remote: SocketAddrV4,
        peer: Option<PeerTarget<'_>>,
    ) -> Result<ConnectSteering, ChannelError> {
        let others: Vec<u32> = if movable && self.aligner.rss().is_some() {
            self.peers
                .iter()
                .filter(|p| !p.signal.is_dead())
                .map(|p| p.queue)
                .collect()
        } else {
            Vec::new()
        };
        let ends = ChannelEnds {
            local: self.ipv4,
            remote,
            queue: self.peers[index].queue,
            peer,
        };
        let ports = &self.ports;
        let chosen = self
            .aligner
            .connect_among(ends, &others, ports.range(), ports.cursor(), |p| {
                ports.try_claim(p)
            })
            .map_err(|_| ChannelError::NoFreePort)?;
        tracing::debug!(%remote, port = chosen.port, queue = chosen.queue, steering = %chosen.steering, peer = %chosen.peer_alignment, "channel port chosen");
        Ok(chosen)
    }

    /// A set without steering program or drivers, around `peers`, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(peers: Vec<Peer>) -> SetShared {
        SetShared {
            ipv4: Ipv4Addr::new(10, 0, 0, 1),
            directory: FlowDirectory::default(),
            ports: PortAllocator::new(61000..=61009),
            aligner: RssAligner::disabled("test"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::clock::RuntimeClock;
    use crate::rss::{ChannelSteering, ForwardReason, RssConfig, MICROSOFT_VERIFICATION_KEY};
    use std::collections::HashSet;

    const REMOTE: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 9000);

    /// A set of `queues` queues (ids 0..) over `ports`, opening with `aligner`.
    fn set_of(queues: u32, aligner: RssAligner, ports: RangeInclusive<u16>) -> SetShared {
        let peers = (0..queues)
            .map(|queue| Peer {
                queue,
                signal: Arc::new(QueueSignal::new(RuntimeClock::new())),
                commands: crossbeam_channel::unbounded().0,
                forward: crossbeam_channel::bounded(1).0,
                checksums: Default::default(),
                syns: Default::default(),
                resets_received: Default::default(),
                rx_fault_dropped: Default::default(),
            })
            .collect();
        SetShared {
            aligner,
            ports: PortAllocator::new(ports),
            ..SetShared::for_tests(peers)
        }
    }

    fn rss4() -> RssConfig {
        RssConfig::toeplitz(
            &MICROSOFT_VERIFICATION_KEY,
            &RssConfig::default_indirection(128, 4),
        )
        .unwrap()
    }

    /// The queue the replies to a channel from `port` land on under [`rss4`].
    fn lands(port: u16) -> u32 {
        let local = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), port);
        rss4().reply_queue(local, REMOTE).unwrap()
    }

    #[test]
    fn without_a_known_rss_ports_are_taken_in_turn_on_the_queue_asked_for() {
        // An interface without RSS (read and found missing: `lo` as veth), and alignment
        // off: what every set did before alignment, round-robin ports on the given queue.
        for (aligner, reason) in [
            (RssAligner::probe("lo", false), ForwardReason::RssUnreadable),
            (RssAligner::disabled("x"), ForwardReason::AlignmentOff),
        ] {
            let set = set_of(2, aligner, 61000..=61003);
            let mut got = Vec::new();
            for index in [0, 1, 1, 0] {
                let c = set.choose_port(index, true, REMOTE, None).unwrap();
                assert_eq!(c.queue, index as u32);
                assert_eq!(c.steering, ChannelSteering::Forwarded { reason });
                assert!(c.rule.is_none());
                got.push(c.port);
            }
            assert_eq!(got, [61000, 61001, 61002, 61003]);
            assert!(matches!(
                set.choose_port(0, true, REMOTE, None),
                Err(ChannelError::NoFreePort)
            ));
            // A released port is found again from where the scan left off.
            set.ports.release(61001);
            assert_eq!(set.choose_port(1, true, REMOTE, None).unwrap().port, 61001);
            assert_eq!(set.aligner.counts().forwarded, 5);
        }
    }

    #[test]
    fn a_known_rss_gives_each_channel_a_port_whose_replies_land_on_its_queue() {
        let set = set_of(4, RssAligner::with_config("x", rss4(), None), 61000..=65535);
        let mut ports = HashSet::new();
        for index in [0, 1, 2, 3, 3, 2, 1, 0] {
            let c = set.choose_port(index, true, REMOTE, None).unwrap();
            assert_eq!(c.steering, ChannelSteering::Aligned);
            assert_eq!(
                c.queue, index as u32,
                "the queue asked for keeps the channel"
            );
            assert_eq!(lands(c.port), c.queue);
            assert!(ports.insert(c.port), "port {} twice", c.port);
        }
        assert_eq!(set.ports.in_use(), 8);
        assert_eq!(set.aligner.counts().aligned, 8);
    }

    #[test]
    fn when_no_free_port_lands_on_the_queue_the_queue_the_replies_land_on_takes_it() {
        let set = set_of(4, RssAligner::with_config("x", rss4(), None), 61000..=61009);
        let q = lands(61000);
        for p in (61000..=61009).filter(|&p| lands(p) == q) {
            assert!(set.ports.try_claim(p));
        }
        let index = q as usize;
        // Named queue (`connect_on`): it keeps the channel, whose frames are forwarded.
        let fixed = set.choose_port(index, false, REMOTE, None).unwrap();
        assert_eq!(fixed.queue, q);
        assert_eq!(
            fixed.steering,
            ChannelSteering::Forwarded {
                reason: ForwardReason::NoPortLands
            }
        );
        assert_ne!(lands(fixed.port), q);
        // Round robin (`connect`): the queue the chosen port's replies land on owns it.
        let moved = set.choose_port(index, true, REMOTE, None).unwrap();
        assert_eq!(moved.steering, ChannelSteering::Aligned);
        assert_ne!(moved.queue, q);
        assert_eq!(lands(moved.port), moved.queue);
    }

    #[test]
    fn dead_queues_take_no_channel() {
        let set = set_of(4, RssAligner::with_config("x", rss4(), None), 61000..=61009);
        let q = lands(61000);
        let others: Vec<u32> = (61000..=61009).map(lands).filter(|&l| l != q).collect();
        let live = *others.last().expect("some port lands elsewhere");
        for p in (61000..=61009).filter(|&p| lands(p) == q) {
            assert!(set.ports.try_claim(p));
        }
        for peer in &set.peers {
            if peer.queue != q && peer.queue != live {
                peer.signal.set_dead();
            }
        }
        let c = set.choose_port(q as usize, true, REMOTE, None).unwrap();
        assert_eq!((c.queue, c.steering), (live, ChannelSteering::Aligned));
        assert_eq!(lands(c.port), live);
    }

    #[test]
    fn a_peer_target_lands_each_channel_on_the_peers_queues_as_well() {
        use crate::rss::{FlowTuple, PeerAlignment};
        let set = set_of(4, RssAligner::with_config("x", rss4(), None), 61000..=65535);
        // The peer: another key, 8 queues, its latency queue 7.
        let mut key = MICROSOFT_VERIFICATION_KEY;
        key.reverse();
        let theirs = RssConfig::toeplitz(&key, &RssConfig::default_indirection(128, 8)).unwrap();
        let at_peer = |port: u16| {
            let local = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), port);
            theirs.queue_of(&FlowTuple::new(local, REMOTE)).unwrap()
        };
        let latency = [7];
        let bulk = [0, 1, 2, 3, 4, 5, 6];
        for (index, targets) in [(3, &latency[..]), (0, &bulk[..]), (3, &latency[..])] {
            let peer = PeerTarget {
                rss: &theirs,
                queues: targets,
            };
            let c = set.choose_port(index, false, REMOTE, Some(peer)).unwrap();
            assert_eq!(
                (c.queue, c.steering),
                (index as u32, ChannelSteering::Aligned)
            );
            assert_eq!(lands(c.port), index as u32, "this end");
            let q = at_peer(c.port);
            assert!(
                targets.contains(&q),
                "port {} lands on {q} at the peer",
                c.port
            );
            assert_eq!(c.peer_alignment, PeerAlignment::Aligned { queue: q });
        }
        // Without a target: this end only, recorded as unknown at the peer.
        let c = set.choose_port(1, false, REMOTE, None).unwrap();
        assert_eq!(c.peer_alignment, PeerAlignment::Unknown);
        let counts = set.aligner.peer_counts();
        assert_eq!((counts.aligned, counts.unknown, counts.missed), (3, 1, 0));
    }
}
