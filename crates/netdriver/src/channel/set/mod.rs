//! [`ChannelSet`]: a set of NIC queues (AF_XDP or AF_PACKET sockets on an interface, or
//! ports of an in-memory switch), a driver per queue on the runtimes its [`Placement`] names, and the
//! calls that create channels ([`ChannelSet::connect`], [`ChannelSet::listen`]).

mod runtimes;
mod stats;

pub use runtimes::{ChannelPlacement, RuntimePlacement};

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use atomic_waker::AtomicWaker;
use crossbeam_queue::ArrayQueue;
use tracing::{debug, info, warn};
use xdp_prog::XdpSteering;

use super::accept_queue::ListenerShared;
use super::attach::{Neighbors, Resolver};
use super::block::block_on;
use super::clock::RuntimeClock;
use super::command::Command;
use super::config::{resolve_attach, resolve_partial_checksums, RssAlignment};
use super::directory::{BufferPool, FlowDirectory, PortAllocator};
use super::driver::QueueSlot;
use super::handle::Channel;
use super::listener::ChannelListener;
use super::placement::{
    usable_cores, watch, DriverPlace, Placement, PlacementState, QueuePlace, QueueRuntime,
};
use super::queue::ChannelShared;
use super::round::{QueueState, Worker};
use super::shared::{Peer, SetShared};
use super::signal::QueueSignal;
use super::stats::{ChecksumCounters, SynCounters};
use super::steering::SetSteering;
use super::{ChannelError, ChannelSetConfig, LinkKind};
use crate::link::packet_stats::PacketCounters;
use crate::link::switch::SimSwitch;
use crate::link::umem_memory::UmemPlacement;
use crate::link::xdp::{TxChecksum, XdpBinding, XdpLink};
use crate::link::{Link, QueueLink};
use crate::netif::{Interface, InterfaceConfig};
use crate::rss::PeerTarget;
use crate::rss::RssAligner;
use crate::time::Duration;
use crate::wire::EthernetAddress;

/// How long `listen` waits for every queue to confirm.
const LISTEN_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// The queues of one interface (or of one host on an in-memory switch), their drivers,
/// and the channels they run. See the [module documentation](super).
///
/// Dropping the set (or [`shutdown`](ChannelSet::shutdown)) stops every queue (aborting
/// its connections), stops the set's queue runtimes and detaches the steering program.
#[derive(Debug)]
pub struct ChannelSet {
    shared: Arc<SetShared>,
    /// One per queue, by index; the watchdog holds a weak reference.
    slots: Arc<Vec<Arc<QueueSlot>>>,
    placement: Arc<PlacementState>,
    clock: RuntimeClock,
    resolver: Resolver,
    neighbors: Mutex<HashMap<Ipv4Addr, EthernetAddress>>,
    next_queue: AtomicUsize,
    config: ChannelSetConfig,
    /// The resolved [`ChannelSetConfig::partial_checksums`].
    accept_partial: bool,
    /// Killed queues (fault injection), kept as they were until the set stops: their
    /// sockets stay open and bound, so arrivals for their flows are dropped unread, as
    /// with a crashed process, rather than answered by the kernel with resets.
    graveyard: Mutex<Vec<Arc<QueueSlot>>>,
    /// Each queue's AF_XDP socket binding, UMEM and transmit checksums, by index (`None`
    /// for other links).
    links: Vec<(
        Option<XdpBinding>,
        Option<UmemPlacement>,
        Option<TxChecksum>,
    )>,
    /// Each queue's AF_PACKET link counters, by index (`None` for other links).
    packet_counters: Vec<Option<Arc<PacketCounters>>>,
    stopped: bool,
}

/// The queues' answers to a listen: one each, until all said yes or one said no.
struct ListenConfirmations {
    answers: tokio::sync::mpsc::UnboundedReceiver<Result<(), ChannelError>>,
    left: usize,
}

impl ListenConfirmations {
    fn poll(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ChannelError>> {
        use std::task::Poll;
        while self.left > 0 {
            match self.answers.poll_recv(cx) {
                Poll::Ready(Some(Ok(()))) => self.left -= 1,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => return Poll::Ready(Err(ChannelError::ShutDown)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// What `start` builds per queue before the set exists.
pub(super) struct QueueParts {
    pub(super) queue: u32,
    pub(super) link: Box<dyn QueueLink>,
    pub(super) neighbors: Neighbors,
    /// An AF_XDP link's binding and UMEM placement, for [`QueueStats`].
    pub(super) binding: Option<XdpBinding>,
    pub(super) umem: Option<UmemPlacement>,
    pub(super) tx_checksum: Option<TxChecksum>,
    /// An AF_PACKET link's counters, for [`QueueStats`].
    pub(super) packet: Option<Arc<PacketCounters>>,
}

impl ChannelSet {
    /// Attaches the steering program to `config.ifname`, opens one AF_XDP link per queue,
    /// registers their sockets, reads the interface's RSS (as `config.rss` says) and
    /// starts a driver per queue on the runtimes `config.placement` names, all in the
    /// calling thread's network namespace. On any error everything done so far is undone
    /// (runtimes stopped, program detached).
    ///
    /// With [`LinkKind::Packet`] the links are AF_PACKET sockets instead, and the
    /// steering is their socket filter and a TCX ingress program (see
    /// [`ChannelSetConfig::link_kind`]).
    pub fn start(config: ChannelSetConfig) -> Result<ChannelSet, ChannelError> {
        let queues = match &config.queues {
            Some(q) => q.clone(),
            None => {
                let n =
                    super::rx_queue_count(&config.ifname).map_err(|source| ChannelError::Io {
                        op: "reading the interface's queue count (ETHTOOL_GCHANNELS)",
                        source,
                    })?;
                (0..n.max(1)).collect()
            }
        };
        check_queues(&queues)?;
        if config.link_kind == LinkKind::Packet {
            return ChannelSet::start_packet(config, queues);
        }
        if let Some(q) = queues.iter().find(|&&q| q >= xdp_prog::MAX_QUEUES) {
            return Err(ChannelError::InvalidConfig(format!(
                "queue {q} beyond the steering program's {} slots",
                xdp_prog::MAX_QUEUES
            )));
        }
        let accept_partial = resolve_partial_checksums(&config);
        let mac = crate::neigh::interface_mac(&config.ifname).map_err(ChannelError::Neighbor)?;
        let ifindex = crate::neigh::ifindex_of(&config.ifname).map_err(ChannelError::Neighbor)?;
        let attach = resolve_attach(&config)?;
        // From here on, `steering` detaches on every early return (its drop).
        let steering = XdpSteering::attach(&config.ifname, attach).map_err(ChannelError::Xdp)?;
        let mut parts = Vec::with_capacity(queues.len());
        for &q in &queues {
            let mut lc = config.link.clone();
            lc.ifname = config.ifname.clone();
            lc.queue_id = q;
            let link = XdpLink::open(lc).map_err(ChannelError::Link)?;
            steering
                .register_socket(q, link.fd())
                .map_err(ChannelError::Xdp)?;
            // Opened here, in the interface's namespace, so that whichever runtime drives
            // the queue has it.
            let table = match crate::neigh::KernelNeighbors::open() {
                Ok(n) => Some(n),
                Err(e) => {
                    warn!(queue = q, error = %e, "opening the neighbour table; accepted peers' MAC addresses go unchecked");
                    None
                }
            };
            parts.push(QueueParts {
                queue: q,
                binding: Some(link.binding()),
                umem: Some(link.umem_placement()),
                tx_checksum: Some(link.tx_checksum()),
                packet: None,
                link: Box::new(link),
                neighbors: Neighbors::Kernel { table, ifindex },
            });
        }
        let resolver = Resolver::kernel(&config.ifname, ifindex, config.neighbor_timeout)?;
        let aligner = aligner_for(&config);
        let set = ChannelSet::assemble(
            config,
            mac,
            parts,
            Some(SetSteering::Xdp(steering)),
            resolver,
            accept_partial,
            aligner,
        )?;
        info!(
            ifname = %set.config.ifname, ipv4 = %set.config.ipv4, ?queues,
            "channel set started"
        );
        Ok(set)
    }

    /// A set on an in-memory switch: host `config.ipv4` is attached to `switch` with
    /// `queues` queues (port *i* is queue *i*), and the same drivers, TCP and interfaces as
    /// over AF_XDP run over the switch's ports. No privileges needed; `config.ifname`,
    /// `config.queues`, `config.link` and `config.attach` are not used, nor `config.rss`
    /// unless it is [`RssAlignment::Known`] (the switch's ports are no NIC's queues:
    /// channels are opened without alignment; a known RSS is used as given, to test
    /// what is decided from it, though the switch still delivers each frame on the queue
    /// index it was sent on). The host leaves the switch when the set stops.
    pub fn start_on_switch(
        mut config: ChannelSetConfig,
        switch: &SimSwitch,
        queues: usize,
    ) -> Result<ChannelSet, ChannelError> {
        let (mac, ports) = switch
            .attach(config.ipv4, queues)
            .map_err(|e| ChannelError::InvalidConfig(e.to_string()))?;
        config.queues = Some((0..queues as u32).collect());
        let parts = ports
            .into_iter()
            .enumerate()
            .map(|(q, port)| QueueParts {
                queue: q as u32,
                link: Box::new(port) as Box<dyn QueueLink>,
                neighbors: Neighbors::Switch(switch.clone()),
                binding: None,
                umem: None,
                tx_checksum: None,
                packet: None,
            })
            .collect();
        // Frames on the switch are memory copies that nobody corrupts: the partial
        // checksums of the kernel's offload never occur, but accepting them is harmless.
        let accept_partial = !matches!(config.partial_checksums, super::PartialChecksums::Reject);
        let name = config.ipv4.to_string();
        let aligner = match &config.rss {
            RssAlignment::Known(rss) => RssAligner::with_config(&name, rss.clone(), None),
            _ => RssAligner::disabled(&name),
        };
        // On an error the ports are dropped, and the host leaves the switch with them.
        ChannelSet::assemble(
            config,
            mac,
            parts,
            None,
            Resolver::Switch(switch.clone()),
            accept_partial,
            aligner,
        )
    }

    /// Builds the set around its queues' links and starts their drivers.
    pub(super) fn assemble(
        config: ChannelSetConfig,
        mac: EthernetAddress,
        parts: Vec<QueueParts>,
        steering: Option<SetSteering>,
        resolver: Resolver,
        accept_partial: bool,
        aligner: RssAligner,
    ) -> Result<ChannelSet, ChannelError> {
        let ports = match &config.ephemeral_ports {
            Some(r) => r.clone(),
            None => {
                crate::ports::EphemeralRange::from_kernel()
                    .map_err(ChannelError::Ports)?
                    .ours
            }
        };
        let clock = RuntimeClock::new();
        let mut peers = Vec::with_capacity(parts.len());
        let mut ends = Vec::with_capacity(parts.len());
        for p in &parts {
            let signal = Arc::new(QueueSignal::new(clock));
            let (ctx, crx) = crossbeam_channel::unbounded();
            let (ftx, frx) = crossbeam_channel::bounded(config.forward_queue.max(1));
            peers.push(Peer {
                queue: p.queue,
                signal: signal.clone(),
                commands: ctx,
                forward: ftx,
                checksums: ChecksumCounters::default(),
                syns: SynCounters::default(),
                resets_received: AtomicU64::new(0),
                rx_fault_dropped: AtomicU64::new(0),
            });
            ends.push((signal, crx, frx));
        }
        let steered = steering.is_some();
        let shared = Arc::new(SetShared {
            ipv4: config.ipv4,
            directory: FlowDirectory::default(),
            ports: PortAllocator::new(ports),
            aligner,
            pool: BufferPool::new(config.forward_queue.max(1)),
            peers,
            steering: RwLock::new(steering),
            steered,
            tx_limits: config.tx_queue.into(),
            rx_limits: config.rx_queue.into(),
            nodelay: config.nodelay,
            stopped: AtomicBool::new(false),
            listeners: Mutex::new(HashMap::new()),
            endpoints: Mutex::new(HashMap::new()),
            forwarded: AtomicU64::new(0),
            forward_dropped: AtomicU64::new(0),
        });
        // One secret for all queues: a peer's ACK may come back on another queue than the
        // SYN its cookie answered.
        let syn_cookie_secret = Some(Arc::new(crate::tcp::syncookie::SynCookies::new()));
        let mut slots = Vec::with_capacity(parts.len());
        let links = parts
            .iter()
            .map(|p| (p.binding, p.umem, p.tx_checksum))
            .collect();
        let packet_counters = parts.iter().map(|p| p.packet.clone()).collect();
        for (index, (p, (signal, crx, frx))) in parts.into_iter().zip(ends).enumerate() {
            let (rx_batch, tx_batch) = config.link_batches();
            let iface = Interface::new(
                p.link,
                InterfaceConfig {
                    mac,
                    ipv4: config.ipv4,
                    tcp: config.tcp.clone(),
                    ephemeral_ports: shared.ports_range(),
                    max_connections: config.max_connections,
                    max_time_wait: crate::netif::DEFAULT_MAX_TIME_WAIT,
                    isn_key: None,
                    rx_batch,
                    tx_batch,
                    ttl: 64,
                    accept_partial_checksums: accept_partial,
                    syn_cookies: config.syn_cookies,
                    syn_cookie_secret: syn_cookie_secret.clone(),
                    large_segments: true,
                    checksum_offload: true,
                },
            );
            debug!(queue = p.queue, mtu = iface.link().mtu(), "queue set up");
            let worker = Worker {
                index,
                queue: p.queue,
                iface,
                clock,
                signal: signal.clone(),
                commands: crx,
                forwarded: frx,
                set: shared.clone(),
                neighbors: p.neighbors,
            };
            slots.push(Arc::new(QueueSlot::new(
                p.queue,
                signal,
                QueueState::new(worker),
                clock,
            )));
        }
        let mut set = ChannelSet {
            shared,
            slots: Arc::new(slots),
            placement: Arc::new(PlacementState::default()),
            clock,
            resolver,
            neighbors: Mutex::new(HashMap::new()),
            next_queue: AtomicUsize::new(0),
            config,
            accept_partial,
            graveyard: Mutex::new(Vec::new()),
            links,
            packet_counters,
            stopped: false,
        };
        set.place_initially()?;
        Ok(set)
    }

    /// Starts the queue runtimes of `config.placement` and a driver per queue; the first
    /// runtime is the home of the watchdog and of rescued queues.
    fn place_initially(&mut self) -> Result<(), ChannelError> {
        let n = self.slots.len();
        let name = |id: u32| format!("nc-q-{}-{id}", self.name());
        let mut rt = self.placement.lock();
        rt.node_cpus =
            super::node_cpus::runtime_cpus(&self.config.ifname, self.config.link.numa_node);
        let places: Vec<DriverPlace> = match &self.config.placement {
            Placement::Runtimes { count, cores } => {
                if cores.as_ref().is_some_and(|c| c.is_empty()) {
                    return Err(ChannelError::InvalidConfig("empty core list".into()));
                }
                let count = count.unwrap_or_else(|| n.min(usable_cores())).clamp(1, n);
                for i in 0..count {
                    let core = cores.as_ref().map(|c| c[i % c.len()]);
                    let id = rt.next_id;
                    let r = QueueRuntime::start(name(id), core, rt.node_cpus.clone())?;
                    rt.own.insert(id, r);
                    rt.next_id += 1;
                }
                (0..n)
                    .map(|i| DriverPlace::Runtime((i % count) as u32))
                    .collect()
            }
            Placement::External { name: ext, handle } => {
                let id = rt.next_id;
                let r = QueueRuntime::start(name(id), None, rt.node_cpus.clone())?;
                rt.own.insert(id, r);
                rt.next_id += 1;
                rt.external.insert(ext.clone(), handle.clone());
                (0..n).map(|_| DriverPlace::External(ext.clone())).collect()
            }
            Placement::ExternalOnly { name: ext, handle } => {
                rt.external.insert(ext.clone(), handle.clone());
                (0..n).map(|_| DriverPlace::External(ext.clone())).collect()
            }
            Placement::Explicit {
                places,
                external,
                cores,
            } => {
                if places.len() != n {
                    return Err(ChannelError::InvalidConfig(format!(
                        "a placement of {} queues for a set of {n}",
                        places.len()
                    )));
                }
                if cores.as_ref().is_some_and(|c| c.is_empty()) {
                    return Err(ChannelError::InvalidConfig("empty core list".into()));
                }
                let count = places
                    .iter()
                    .filter_map(|p| match p {
                        DriverPlace::Runtime(r) => Some(*r + 1),
                        DriverPlace::External(_) => None,
                    })
                    .max()
                    .unwrap_or(1);
                for i in 0..count {
                    let core = cores.as_ref().map(|c| c[i as usize % c.len()]);
                    let id = rt.next_id;
                    let r = QueueRuntime::start(name(id), core, rt.node_cpus.clone())?;
                    rt.own.insert(id, r);
                    rt.next_id += 1;
                }
                for (ext, handle) in external {
                    rt.external.insert(ext.clone(), handle.clone());
                }
                places.clone()
            }
        };
        rt.home = *rt.own.keys().next().unwrap_or(&0);
        let home = rt.home_handle();
        for (slot, place) in self.slots.iter().zip(&places) {
            if let Some(h) = &home {
                slot.set_fallback(h.clone());
            }
            slot.spawn_driver(&rt.handle(place)?);
        }
        rt.queues = places
            .into_iter()
            .map(|p| QueuePlace {
                now: p.clone(),
                wanted: p,
                rescued_at: None,
                dead: false,
            })
            .collect();
        if let Some(h) = home {
            h.spawn(watch(
                Arc::downgrade(&self.placement),
                Arc::downgrade(&self.slots),
                self.clock,
            ));
        }
        Ok(())
    }

    /// The name runtimes and logs use for the set.
    fn name(&self) -> String {
        if self.shared.steered {
            self.config.ifname.clone()
        } else {
            self.config.ipv4.to_string()
        }
    }

    fn queue_index(&self, queue: u32) -> Option<usize> {
        self.shared.peers.iter().position(|p| p.queue == queue)
    }

    /// Opens a channel to `remote` on the next queue (round-robin) and waits for the
    /// handshake, at most [`ChannelSetConfig::connect_timeout`].
    ///
    /// The peer's MAC comes from the neighbour table (the kernel's, resolved with ARP if
    /// need be, at most [`ChannelSetConfig::neighbor_timeout`]; or the switch's) and is
    /// then cached for the life of the set; `remote` must be on-link. The local port comes
    /// from the set's shared allocator and is steered to the stack before the SYN leaves.
    /// Where the interface's RSS is known ([`ChannelSetConfig::rss`]), the port is one
    /// whose replies RSS delivers to the queue; when no free port lands there, the queue
    /// the chosen port's replies land on takes the channel instead, so that no frame of
    /// it is forwarded ([`Channel::steering`] says what it got). Elsewhere (veth), any
    /// free port.
    ///
    /// Queues killed by fault injection ([`kill_queue`](Self::kill_queue)) are skipped;
    /// with none left it fails with [`ChannelError::QueueDied`].
    pub fn connect(&self, remote: SocketAddrV4) -> Result<Channel, ChannelError> {
        let index = self.next_live_queue()?;
        let mac = self.resolve(*remote.ip())?;
        let (channel, shared) = self.open_on(index, true, remote, mac, None)?;
        let timeout = self.config.connect_timeout;
        match block_on(Some(timeout), |cx| shared.poll_established(cx)) {
            Some(Ok(())) => Ok(channel),
            // Dropping `channel` aborts the attempt; the driver releases the port.
            Some(Err(e)) => Err(e),
            None => Err(ChannelError::ConnectTimeout(timeout)),
        }
    }

    /// [`connect`](Self::connect) for async callers: the handshake (and an ARP exchange,
    /// where the kernel's table has none) is awaited, so a task on the runtime that drives
    /// the queue may call it.
    pub async fn connect_async(&self, remote: SocketAddrV4) -> Result<Channel, ChannelError> {
        let index = self.next_live_queue()?;
        let mac = self.resolve_async(*remote.ip()).await?;
        let (channel, shared) = self.open_on(index, true, remote, mac, None)?;
        let timeout = self.config.connect_timeout;
        let established = std::future::poll_fn(|cx| shared.poll_established(cx));
        match tokio::time::timeout(timeout, established).await {
            Ok(Ok(())) => Ok(channel),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ChannelError::ConnectTimeout(timeout)),
        }
    }

    /// [`connect`](Self::connect) with the peer's RSS: the local port is one that also
    /// lands, under `peer.rss`, on one of `peer.queues` at the peer where a free one does
    /// (else this end is aligned alone). [`Channel::peer_alignment`] says which.
    pub fn connect_toward(
        &self,
        remote: SocketAddrV4,
        peer: PeerTarget<'_>,
    ) -> Result<Channel, ChannelError> {
        let index = self.next_live_queue()?;
        let mac = self.resolve(*remote.ip())?;
        let (channel, shared) = self.open_on(index, true, remote, mac, Some(peer))?;
        self.wait_established(channel, &shared)
    }

    /// [`connect_on`](Self::connect_on) with the peer's RSS, as
    /// [`connect_toward`](Self::connect_toward).
    pub fn connect_on_toward(
        &self,
        queue: u32,
        remote: SocketAddrV4,
        peer: PeerTarget<'_>,
    ) -> Result<Channel, ChannelError> {
        let index = self
            .queue_index(queue)
            .ok_or(ChannelError::NoSuchQueue(queue))?;
        let mac = self.resolve(*remote.ip())?;
        let (channel, shared) = self.open_on(index, false, remote, mac, Some(peer))?;
        self.wait_established(channel, &shared)
    }

    /// Waits for an opened channel's handshake, at most the connect timeout.
    fn wait_established(
        &self,
        channel: Channel,
        shared: &ChannelShared,
    ) -> Result<Channel, ChannelError> {
        let timeout = self.config.connect_timeout;
        match block_on(Some(timeout), |cx| shared.poll_established(cx)) {
            Some(Ok(())) => Ok(channel),
            // Dropping `channel` aborts the attempt; the driver releases the port.
            Some(Err(e)) => Err(e),
            None => Err(ChannelError::ConnectTimeout(timeout)),
        }
    }

    /// Opens a channel to `remote` whose connection lives on queue `queue`. Where the
    /// interface's RSS is known, the local port is one whose replies land on `queue`; when
    /// none is free (or the NIC's table leaves `queue` out), the channel stays on `queue`
    /// with an ntuple rule where the NIC takes one, else forwarded.
    pub fn connect_on(&self, queue: u32, remote: SocketAddrV4) -> Result<Channel, ChannelError> {
        let index = self
            .queue_index(queue)
            .ok_or(ChannelError::NoSuchQueue(queue))?;
        let mac = self.resolve(*remote.ip())?;
        let (channel, shared) = self.open_on(index, false, remote, mac, None)?;
        let timeout = self.config.connect_timeout;
        match block_on(Some(timeout), |cx| shared.poll_established(cx)) {
            Some(Ok(())) => Ok(channel),
            Some(Err(e)) => Err(e),
            None => Err(ChannelError::ConnectTimeout(timeout)),
        }
    }

    /// The next queue, round-robin, that has not died.
    fn next_live_queue(&self) -> Result<usize, ChannelError> {
        let n = self.shared.peers.len();
        for _ in 0..n {
            let i = self.next_queue.fetch_add(1, Ordering::Relaxed) % n;
            if !self.shared.peers[i].signal.is_dead() {
                return Ok(i);
            }
        }
        Err(ChannelError::QueueDied)
    }

    /// Claims a local port and asks queue `index`'s driver (or, when `movable`, that of
    /// the queue the port's replies land on, see `SetShared::choose_port`) to send the
    /// SYN to `remote` (at `mac`); returns the channel and its shared state, whose
    /// [`poll_established`](ChannelShared::poll_established) tells the outcome.
    fn open_on(
        &self,
        index: usize,
        movable: bool,
        remote: SocketAddrV4,
        mac: EthernetAddress,
        peer: Option<PeerTarget<'_>>,
    ) -> Result<(Channel, Arc<ChannelShared>), ChannelError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(ChannelError::ShutDown);
        }
        if self.shared.peers[index].signal.is_dead() {
            return Err(ChannelError::QueueDied);
        }
        let chosen = self.shared.choose_port(index, movable, remote, peer)?;
        let index = self.queue_index(chosen.queue).unwrap_or(index);
        let port = chosen.port;
        let local = SocketAddrV4::new(self.shared.ipv4, port);
        if let Err(e) = self.shared.claim_endpoint(local) {
            self.shared.ports.release(port);
            return Err(e);
        }
        let peer = &self.shared.peers[index];
        // The directory knows the flow before its SYN can leave.
        self.shared.directory.insert((local, remote), index);
        let shared = Arc::new(
            ChannelShared::new(
                local,
                remote,
                peer.queue,
                chosen.steering,
                self.shared.tx_limits,
                self.shared.rx_limits,
                peer.signal.clone(),
            )
            .opened_toward(chosen.peer_alignment),
        );
        let cmd = Command::Connect {
            shared: shared.clone(),
            mac,
            rule: chosen.rule,
        };
        if peer.commands.send(cmd).is_err() {
            self.shared
                .release_flow(index, &(local, remote), Some(port));
            return Err(ChannelError::ShutDown);
        }
        peer.signal.notify_control();
        Ok((Channel::new(shared.clone()), shared))
    }

    /// The peer's MAC, from the set's cache or the neighbour table.
    fn resolve(&self, ip: Ipv4Addr) -> Result<EthernetAddress, ChannelError> {
        if let Some(&mac) = self
            .neighbors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ip)
        {
            return Ok(mac);
        }
        let mac = self.resolver.resolve(ip)?;
        self.neighbors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ip, mac);
        Ok(mac)
    }

    /// [`resolve`](Self::resolve), awaiting an ARP exchange.
    async fn resolve_async(&self, ip: Ipv4Addr) -> Result<EthernetAddress, ChannelError> {
        let cached = self
            .neighbors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ip)
            .copied();
        if let Some(mac) = cached {
            return Ok(mac);
        }
        let mac = self.resolver.resolve_async(ip).await?;
        self.neighbors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ip, mac);
        Ok(mac)
    }

    /// Listens on `port` on every queue's interface; accepted channels of all queues
    /// arrive in the returned listener. Returns once every queue listens.
    pub fn listen(&self, port: u16) -> Result<ChannelListener, ChannelError> {
        let (listener, mut confirmations) = self.start_listen(port)?;
        block_on(Some(LISTEN_CONFIRM_TIMEOUT), |cx| confirmations.poll(cx))
            .unwrap_or(Err(ChannelError::ShutDown))?;
        Ok(listener)
    }

    /// [`listen`](Self::listen) for async callers: the queues' confirmations are awaited,
    /// so a task on the runtime that drives them may call it.
    pub async fn listen_async(&self, port: u16) -> Result<ChannelListener, ChannelError> {
        let (listener, mut confirmations) = self.start_listen(port)?;
        let confirmed = std::future::poll_fn(|cx| confirmations.poll(cx));
        tokio::time::timeout(LISTEN_CONFIRM_TIMEOUT, confirmed)
            .await
            .unwrap_or(Err(ChannelError::ShutDown))?;
        Ok(listener)
    }

    /// Registers a listener on `port` and asks every live queue to listen; the queues'
    /// answers come through the returned [`ListenConfirmations`].
    fn start_listen(
        &self,
        port: u16,
    ) -> Result<(ChannelListener, ListenConfirmations), ChannelError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(ChannelError::ShutDown);
        }
        let backlog = self.config.backlog.max(1);
        let listener = Arc::new(ListenerShared {
            port,
            // Room for `backlog` and for drivers that each saw room for one more at once.
            accept: ArrayQueue::new(backlog.saturating_mul(2)),
            backlog,
            held_back: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            closed: AtomicBool::new(false),
        });
        {
            let mut ls = self.shared.listeners();
            if ls.contains_key(&port) {
                return Err(ChannelError::AddrInUse(port));
            }
            ls.insert(port, listener.clone());
        }
        // From here on, dropping `handle` undoes the listen.
        let handle = ChannelListener {
            shared: listener.clone(),
            set: self.shared.clone(),
        };
        self.shared.with_steering(|s| s.own_port(port))?;
        let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel();
        // A killed queue (fault injection) listens no more: its SYNs go unanswered, as
        // they would with a crashed process.
        let live: Vec<_> = self
            .shared
            .peers
            .iter()
            .filter(|p| !p.signal.is_dead())
            .collect();
        if live.is_empty() {
            return Err(ChannelError::QueueDied);
        }
        for p in &live {
            let cmd = Command::Listen {
                port,
                backlog,
                listener: listener.clone(),
                done: done_tx.clone(),
            };
            p.commands.send(cmd).map_err(|_| ChannelError::ShutDown)?;
            p.signal.notify_control();
        }
        let confirmations = ListenConfirmations {
            answers: done_rx,
            left: live.len(),
        };
        Ok((handle, confirmations))
    }

    /// Listens on the channel port ([`ChannelSetConfig::channel_port`], 9000 by default).
    pub fn listen_channels(&self) -> Result<ChannelListener, ChannelError> {
        self.listen(self.config.channel_port)
    }

    /// The queue ids.
    pub fn queues(&self) -> Vec<u32> {
        self.shared.peers.iter().map(|p| p.queue).collect()
    }

    /// The set's configuration.
    pub fn config(&self) -> &ChannelSetConfig {
        &self.config
    }

    /// The set's home runtime (its first queue runtime, which hosts the watchdog and
    /// rescued queues), for tasks that belong with the set and do no per-message work: a
    /// stack's control task. `None` once the set stopped.
    pub fn home_runtime(&self) -> Option<tokio::runtime::Handle> {
        self.placement.lock().home_handle()
    }

    /// Fault injection, for tests and failure drills: every queue drops received data
    /// segments by `rule` ([`RxDrop`](crate::netif::RxDrop): after `skip` data segments
    /// from `rule.from`, the next `count`), before TCP sees them, as if they were lost on
    /// the wire; `None` removes the rules. What a rule dropped is counted in
    /// [`ChannelSet::fault_dropped`]. Takes effect at each queue's next round.
    pub fn drop_received(&self, rule: Option<crate::netif::RxDrop>) {
        warn!(?rule, "dropping received segments (fault injection)");
        for p in &self.shared.peers {
            p.rx_fault_dropped.store(0, Ordering::Relaxed);
            if p.commands.send(Command::DropReceived(rule)).is_ok() {
                p.signal.notify_control();
            }
        }
    }

    /// Segments the [`ChannelSet::drop_received`] rules have dropped, over all queues.
    pub fn fault_dropped(&self) -> u64 {
        self.shared
            .peers
            .iter()
            .map(|p| p.rx_fault_dropped.load(Ordering::Relaxed))
            .sum()
    }

    /// Local ports of outgoing channels in use.
    pub fn ports_in_use(&self) -> usize {
        self.shared.ports.in_use()
    }

    /// Stops every queue (aborting every connection: the peers get resets) and the set's
    /// queue runtimes, then detaches the steering program. Does not wait for runtimes the
    /// set does not own: their drivers end at their next poll. Reports a failed detach;
    /// dropping the set does the same and logs.
    pub fn shutdown(mut self) -> Result<(), ChannelError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), ChannelError> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        self.shared.stopped.store(true, Ordering::Release);
        for slot in self.slots.iter() {
            if !slot.signal.is_dead() {
                slot.revoke().stop();
            }
        }
        let runtimes = std::mem::take(&mut self.placement.lock().own);
        drop(runtimes);
        // Killed queues (fault injection): their sockets close with the slots, with no
        // more on the wire than a crashed process would send.
        self.graveyard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        // An in-memory host leaves the switch now (its address may be attached again),
        // whatever drivers of runtimes the set does not own still hold its ports.
        if let Resolver::Switch(sw) = &self.resolver {
            sw.detach(self.config.ipv4);
        }
        self.resolver.stop();
        for l in self.shared.listeners().values() {
            l.close();
        }
        let steering = self
            .shared
            .steering
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match steering {
            Some(s) => {
                let res = s.detach();
                info!(ifname = %self.config.ifname, "channel set stopped");
                res
            }
            None => Ok(()),
        }
    }
}

impl Drop for ChannelSet {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            warn!(error = %e, "stopping the channel set");
        }
    }
}

/// The RSS aligner `config.rss` asks for, in the calling thread's network namespace: the
/// interface's RSS read now (without ntuple rules on host-local devices such as veth,
/// which have none and deliver each frame on the queue its sender used), a known one, or
/// none.
pub(super) fn aligner_for(config: &ChannelSetConfig) -> RssAligner {
    let ifname = &config.ifname;
    match &config.rss {
        RssAlignment::Probe => {
            let host_local =
                super::sys::driver_name(ifname).is_ok_and(|d| super::sys::is_host_local_driver(&d));
            RssAligner::probe(ifname, !host_local)
        }
        RssAlignment::Known(rss) => {
            let aligner = RssAligner::with_config(ifname, rss.clone(), None);
            aligner.log_state();
            aligner
        }
        RssAlignment::Off => {
            let aligner = RssAligner::disabled(ifname);
            aligner.log_state();
            aligner
        }
    }
}

/// Checks a queue list: not empty, no queue twice.
fn check_queues(queues: &[u32]) -> Result<(), ChannelError> {
    if queues.is_empty() {
        return Err(ChannelError::InvalidConfig("no queues".into()));
    }
    let mut sorted = queues.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != queues.len() {
        return Err(ChannelError::InvalidConfig(
            "a queue is listed twice".into(),
        ));
    }
    Ok(())
}
