//! [`ChannelSet`]: the steering program, one AF_XDP link per queue, the channel threads
//! that serve the queues (one per queue to begin with; added, moved and removed with
//! [`ChannelSet::add_thread`], [`ChannelSet::move_queue`], [`ChannelSet::remove_thread`]),
//! and the calls that create channels ([`ChannelSet::connect`], [`ChannelSet::listen`]).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use atomic_waker::AtomicWaker;
use crossbeam_channel::{Receiver, Sender};
use crossbeam_queue::ArrayQueue;
use tracing::{debug, info, warn};
use xdp_prog::{AttachOptions, XdpSteering};

use super::directory::{BufferPool, FlowDirectory, PortAllocator, Tuple};
use super::queue::{block_on, ChannelShared, Limits, RxPoller, ThreadSignal};
use super::sys::{xsk_drops, XskDrops};
use super::thread::{
    resolver, run_thread, Command, DeadQueue, QueueSlot, ResolveRequest, ThreadControl,
    ThreadStart, Worker,
};
use super::{Channel, ChannelError};
use crate::link::xdp::{XdpLink, XdpLinkConfig};
use crate::link::Link;
use crate::netif::{Interface, InterfaceConfig, StrayVerdict};
use crate::tcp;
use crate::time::{Clock, Duration};
use crate::wire::EthernetAddress;
use std::os::fd::AsFd;

/// The paper's channel port: where channels listen unless told otherwise.
pub const DEFAULT_CHANNEL_PORT: u16 = 9000;

/// How long `listen` waits for every channel thread to confirm.
const LISTEN_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// Limits of one application queue of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Most chunks in the queue.
    pub chunks: usize,
    /// Most bytes in the queue (a single larger chunk still enters an empty Tx queue).
    pub bytes: usize,
}

impl Default for QueueLimits {
    /// 1024 chunks, 4 MiB.
    fn default() -> Self {
        QueueLimits {
            chunks: 1024,
            bytes: 4 << 20,
        }
    }
}

impl From<QueueLimits> for Limits {
    fn from(q: QueueLimits) -> Limits {
        Limits {
            chunks: q.chunks,
            bytes: q.bytes,
        }
    }
}

/// Settings of a [`ChannelSet`].
#[derive(Debug, Clone)]
pub struct ChannelSetConfig {
    /// The interface (in the calling thread's network namespace).
    pub ifname: String,
    /// The stack's IPv4 address on it.
    pub ipv4: Ipv4Addr,
    /// Queue ids to run channel threads on; `None`: every rx queue of the interface (as
    /// the `ETHTOOL_GCHANNELS` ioctl reports them, see [`super::rx_queue_count`]).
    pub queues: Option<Vec<u32>>,
    /// Template of every queue's AF_XDP link (frames, batches, bind mode, busy polling);
    /// its `ifname` and `queue_id` are replaced per queue. `busy_poll` bounds how long an
    /// idle thread spins on its rx ring after its last activity.
    pub link: XdpLinkConfig,
    /// How the steering program is attached (default: native with generic fallback,
    /// replacing a stale program). With `frags` off, [`ChannelSet::start`] still attaches
    /// the `xdp.frags` variant where the interface's MTU needs it (above
    /// [`LINEAR_XDP_MAX_MTU`], or links binding multi-buffer).
    pub attach: AttachOptions,
    /// Configuration of every TCP connection. [`ChannelSetConfig::new`] sets its `mss` to
    /// `u16::MAX`, which each queue's interface lowers to its link's MTU − 40: segments
    /// fill the frames the interface carries (1460 bytes at MTU 1500, 8960 at 9000),
    /// where `tcp::Config`'s own default, 1460, would leave a jumbo-frame link sending
    /// 1500-byte frames. It also sets `full_segments_per_ack` to 4 (TCP's default, RFC
    /// 5681's, is 2): a channel carries messages of a few segments whose replies usually
    /// follow at once, and with 2 the second full segment of a 4 KB message cost a pure
    /// ACK just before the reply that could carry it (7.65 frames per 4 KB
    /// request/response where 6 do; `docs/performance.md`, "Pure ACKs"). And it sets
    /// `tlp_min_pto` to 8 ms (TCP's default 2 ms): every message pushes the probe timer
    /// back, and a channel thread sleeping until its next timer woke every 2 ms to find
    /// it moved, preempting the application on a host with few cores (part of the 4 KB
    /// ping-pong's p99; `docs/performance.md`, "Background wake-ups"). Linux adds 2 ms
    /// to a PTO and arms it in jiffies (4 ms at Debian's HZ=250), so its probes also go
    /// out after 4-8 ms; the RTO's floor stays 200 ms.
    pub tcp: tcp::Config,
    /// Disable Nagle's algorithm on channels (default true: chunks are sent as they come).
    pub nodelay: bool,
    /// The port [`ChannelSet::listen_channels`] listens on (default
    /// [`DEFAULT_CHANNEL_PORT`], 9000).
    pub channel_port: u16,
    /// Cores to pin channel threads to, thread *i* on `cores[i % len]`; `None`: unpinned.
    pub cores: Option<Vec<usize>>,
    /// Limits of each channel's Tx queue.
    pub tx_queue: QueueLimits,
    /// Limits of each channel's Rx queue. When it is full, the thread stops reading and
    /// TCP's window closes.
    pub rx_queue: QueueLimits,
    /// Longest wait for the kernel to resolve a peer's MAC address.
    pub neighbor_timeout: Duration,
    /// Longest wait for a handshake in [`ChannelSet::connect`].
    pub connect_timeout: Duration,
    /// Local ports of outgoing channels; `None`: the range outside the kernel's
    /// (`ports::EphemeralRange::from_kernel`).
    pub ephemeral_ports: Option<RangeInclusive<u16>>,
    /// Unaccepted connections a listener keeps (per thread, and in its accept queue).
    pub backlog: usize,
    /// Most connections per queue.
    pub max_connections: usize,
    /// Frames each thread's forwarding queue holds (see the module docs).
    pub forward_queue: usize,
    /// Largest chunk that an enqueue into an empty Tx queue sends from the enqueuing
    /// thread itself, when the queue's channel thread is not running a round (inline
    /// transmit: the chunk goes from the caller to the wire without waking the channel
    /// thread, one cross-thread hand-off less per message). Larger chunks and chunks
    /// behind others stay with the channel thread, so bulk transfers keep their own
    /// cores. `0` turns it off. Default 16 KiB.
    pub inline_tx: usize,
    /// Whether segments with a Linux sender's partial checksum are accepted (default
    /// [`PartialChecksums::Auto`]: on veth and netkit only).
    pub partial_checksums: PartialChecksums,
    /// Answer SYNs with SYN cookies (RFC 4987) when a listener's backlog (or a queue's
    /// connection table) is full, instead of dropping them; see
    /// [`InterfaceConfig::syn_cookies`]. One secret, drawn from the OS's generator, serves
    /// every queue of the set. Default on.
    pub syn_cookies: bool,
}

impl ChannelSetConfig {
    /// Defaults for `ifname` with address `ipv4`: all queues, the link defaults
    /// (4096 frames of 2 KiB, copy mode), default TCP with the MSS the MTU allows, port
    /// 9000, no pinning, queues of 1024 chunks / 4 MiB, 3 s neighbour and 10 s connect
    /// timeouts.
    pub fn new(ifname: impl Into<String>, ipv4: Ipv4Addr) -> ChannelSetConfig {
        let ifname = ifname.into();
        ChannelSetConfig {
            link: XdpLinkConfig::new(ifname.clone(), 0),
            ifname,
            ipv4,
            queues: None,
            attach: AttachOptions::default(),
            tcp: tcp::Config {
                // Clamped to the MTU − 40 by `Interface::new`.
                mss: u16::MAX,
                // See the field's documentation.
                full_segments_per_ack: 4,
                // See the field's documentation.
                tlp_min_pto: std::time::Duration::from_millis(8),
                ..tcp::Config::default()
            },
            nodelay: true,
            channel_port: DEFAULT_CHANNEL_PORT,
            cores: None,
            tx_queue: QueueLimits::default(),
            rx_queue: QueueLimits::default(),
            neighbor_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(10),
            ephemeral_ports: None,
            backlog: 128,
            max_connections: 4096,
            forward_queue: 1024,
            inline_tx: 16 * 1024,
            partial_checksums: PartialChecksums::Auto,
            syn_cookies: true,
        }
    }
}

/// One queue as the rest of the set sees it (whichever channel thread serves it).
#[derive(Debug)]
pub(crate) struct Peer {
    pub(crate) queue: u32,
    pub(crate) signal: Arc<ThreadSignal>,
    pub(crate) commands: Sender<Command>,
    pub(crate) forward: Sender<Vec<u8>>,
    /// The thread's checksum counters, republished every round.
    pub(crate) checksums: ChecksumCounters,
    /// The thread's SYN counters, republished every round.
    pub(crate) syns: SynCounters,
    /// Connections the thread lost to a RST from the peer.
    pub(crate) resets_received: AtomicU64,
    /// Nanoseconds the thread spent in its rounds (not sleeping, not busy-polling idle).
    pub(crate) busy_ns: AtomicU64,
    /// Rounds the thread ran (not inline ones).
    pub(crate) thread_rounds: AtomicU64,
    /// Segments its [`RxDrop`](crate::netif::RxDrop) rule dropped (fault injection).
    pub(crate) rx_fault_dropped: AtomicU64,
}

/// A channel thread's SYN and SYN-cookie counters, copied from its interface every round.
#[derive(Debug, Default)]
pub(crate) struct SynCounters {
    pub(crate) dropped: AtomicU64,
    pub(crate) cookies_sent: AtomicU64,
    pub(crate) cookies_accepted: AtomicU64,
    pub(crate) cookies_rejected: AtomicU64,
    /// Incremented by the thread itself (not copied from the interface).
    pub(crate) neighbor_mismatches: AtomicU64,
    pub(crate) neighbor_unverified: AtomicU64,
}

/// Passive-open counters of a [`ChannelSet`], summed over its channel threads (see
/// [`InterfaceStats`](crate::netif::InterfaceStats) for each).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SynStats {
    /// Whether SYN cookies are on ([`ChannelSetConfig::syn_cookies`]).
    pub cookies_enabled: bool,
    /// SYNs (or valid cookie ACKs) dropped for want of room.
    pub dropped: u64,
    /// SYN-ACKs sent with a cookie.
    pub cookies_sent: u64,
    /// Connections opened from a valid cookie.
    pub cookies_accepted: u64,
    /// ACKs whose cookie was forged or expired.
    pub cookies_rejected: u64,
    /// Passive opens aborted because the peer's MAC differed from the kernel's neighbour
    /// entry for its address.
    pub neighbor_mismatches: u64,
    /// Passive opens accepted with the SYN's MAC because the kernel had no usable
    /// neighbour entry for the peer.
    pub neighbor_unverified: u64,
}

/// A channel thread's receive checksum counters, copied from its interface every round.
#[derive(Debug, Default)]
pub(crate) struct ChecksumCounters {
    pub(crate) partial: AtomicU64,
    pub(crate) bad: AtomicU64,
}

/// Whether a [`ChannelSet`] accepts TCP segments that carry a Linux sender's partial
/// checksum (`CHECKSUM_PARTIAL`: the pseudo-header sum only).
///
/// With transmit checksum offload on (veth's default), a Linux peer leaves the TCP
/// checksum for the device to complete; a veth pair never does, because the frame never
/// leaves the host, so the segment reaches the XDP program with the partial value and
/// full verification would drop every segment of every kernel peer. Linux itself trusts
/// such segments on veth. Accepting them gives up the end-to-end check of those bytes,
/// which is sound only where the link is a memory copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PartialChecksums {
    /// Accept them when the interface's driver is host-local (`veth`, `netkit`, as
    /// `ETHTOOL_GDRVINFO` reports it); verify every checksum on any other interface,
    /// real NICs included. The default.
    #[default]
    Auto,
    /// Accept them on this interface whatever its driver (a link you trust the way Linux
    /// trusts veth).
    Accept,
    /// Verify every checksum; segments with a partial one count as bad and are dropped.
    Reject,
}

impl std::str::FromStr for PartialChecksums {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(PartialChecksums::Auto),
            "accept" => Ok(PartialChecksums::Accept),
            "reject" => Ok(PartialChecksums::Reject),
            other => Err(format!(
                "{other:?} is not a partial-checksum policy (auto, accept or reject)"
            )),
        }
    }
}

/// Receive checksum counters of a [`ChannelSet`], summed over its channel threads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxChecksumStats {
    /// Whether segments with a partial checksum are accepted (the resolved
    /// [`PartialChecksums`] policy).
    pub accept_partial: bool,
    /// Segments accepted with a partial checksum.
    pub partial: u64,
    /// IPv4 headers and TCP segments dropped for a checksum that does not verify.
    pub bad: u64,
}

/// What all threads of a set and its handles share.
#[derive(Debug)]
pub(crate) struct SetShared {
    pub(crate) ipv4: Ipv4Addr,
    pub(crate) directory: FlowDirectory,
    pub(crate) ports: PortAllocator,
    pub(crate) pool: BufferPool,
    pub(crate) peers: Vec<Peer>,
    /// `None` once detached at shutdown.
    pub(crate) steering: RwLock<Option<XdpSteering>>,
    pub(crate) tx_limits: Limits,
    pub(crate) rx_limits: Limits,
    pub(crate) nodelay: bool,
    pub(crate) stopped: AtomicBool,
    listeners: Mutex<HashMap<u16, Arc<ListenerShared>>>,
    /// Connections per claimed local endpoint.
    endpoints: Mutex<HashMap<SocketAddrV4, usize>>,
    /// Frames handed from the receiving thread to the owning one.
    pub(crate) forwarded: AtomicU64,
    /// Frames dropped because the owner's forwarding queue was full.
    pub(crate) forward_dropped: AtomicU64,
    /// Queues killed by fault injection, kept as they were until the set stops
    /// ([`ChannelSet::kill_queue_thread`]). Each holds the set (through its worker): the
    /// set empties this when it stops.
    pub(crate) graveyard: Mutex<Vec<DeadQueue>>,
}

impl SetShared {
    /// Hands `frame` to thread `owner` (a copy in a pooled buffer), waking it; `Drop` when
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

    /// Releases a flow of thread `me`: its directory entry, its claim on its local
    /// endpoint and, for an outgoing channel, its port.
    pub(crate) fn release_flow(&self, me: usize, tuple: &Tuple, active_port: Option<u16>) {
        self.directory.remove(tuple, me);
        self.unclaim_endpoint(tuple.0);
        if let Some(port) = active_port {
            self.ports.release(port);
        }
    }

    /// Releases what one connection of a flow of thread `me` held, as
    /// [`release_flow`](Self::release_flow), but keeps the directory entry when
    /// `successor`: a newer connection of the same 4-tuple lives on the same thread (a SYN
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
        if n == 0 {
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

    fn steering_read(&self) -> std::sync::RwLockReadGuard<'_, Option<XdpSteering>> {
        self.steering.read().unwrap_or_else(|p| p.into_inner())
    }

    fn with_steering<T>(
        &self,
        f: impl FnOnce(&XdpSteering) -> Result<T, xdp_prog::XdpError>,
    ) -> Result<T, ChannelError> {
        match self.steering_read().as_ref() {
            Some(s) => f(s).map_err(ChannelError::Xdp),
            None => Err(ChannelError::ShutDown),
        }
    }

    fn listeners(&self) -> std::sync::MutexGuard<'_, HashMap<u16, Arc<ListenerShared>>> {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A channel thread's handle in the set.
#[derive(Debug)]
struct ThreadEntry {
    ctl: Arc<ThreadControl>,
    join: Option<JoinHandle<()>>,
    /// Killed (fault injection): it serves nothing and gets nothing.
    dead: bool,
}

/// Which thread serves which queue, as the set has ordered it (a move takes effect at
/// the source thread's next pass).
#[derive(Debug, Default)]
struct Threads {
    /// By thread id.
    threads: std::collections::BTreeMap<u32, ThreadEntry>,
    /// The serving thread's id, by queue index (`SetShared::peers`).
    queue_thread: Vec<u32>,
    next_id: u32,
}

impl Threads {
    fn live(&self, id: u32) -> Result<&ThreadEntry, ChannelError> {
        match self.threads.get(&id) {
            None => Err(ChannelError::NoSuchThread(id)),
            Some(t) if t.dead => Err(ChannelError::ThreadDied),
            Some(t) => Ok(t),
        }
    }

    fn queues_of(&self, id: u32) -> impl Iterator<Item = usize> + '_ {
        self.queue_thread
            .iter()
            .enumerate()
            .filter(move |&(_, &t)| t == id)
            .map(|(i, _)| i)
    }
}

/// Channel threads on the queues of one interface, and the channels they drive. See the
/// [module documentation](super).
///
/// Dropping the set (or [`shutdown`](ChannelSet::shutdown)) stops and joins the threads,
/// aborts every connection and detaches the steering program.
#[derive(Debug)]
pub struct ChannelSet {
    shared: Arc<SetShared>,
    threads: Mutex<Threads>,
    clock: Clock,
    resolver: Option<(Sender<ResolveRequest>, JoinHandle<()>)>,
    neighbors: Mutex<HashMap<Ipv4Addr, EthernetAddress>>,
    next_queue: AtomicUsize,
    config: ChannelSetConfig,
    /// The resolved [`ChannelSetConfig::partial_checksums`].
    accept_partial: bool,
}

/// Resolves [`ChannelSetConfig::partial_checksums`] for the interface, in the calling
/// thread's network namespace.
fn resolve_partial_checksums(config: &ChannelSetConfig) -> bool {
    match config.partial_checksums {
        PartialChecksums::Accept => true,
        PartialChecksums::Reject => false,
        PartialChecksums::Auto => match super::sys::driver_name(&config.ifname) {
            Ok(driver) => {
                let local = super::sys::is_host_local_driver(&driver);
                info!(
                    ifname = %config.ifname,
                    %driver,
                    accept_partial_checksums = local,
                    "receive checksum policy"
                );
                local
            }
            Err(e) => {
                // Unknown driver: verify everything, the safe side.
                warn!(ifname = %config.ifname, error = %e,
                    "driver unknown (ETHTOOL_GDRVINFO); verifying every checksum");
                false
            }
        },
    }
}

/// The largest MTU at which a veth peer accepts an XDP program without `xdp.frags` (a
/// 4 KiB page less XDP's headroom and the skb's shared info; measured in
/// `docs/testbed.md`). NIC drivers have limits of the same order for single-buffer XDP.
pub const LINEAR_XDP_MAX_MTU: usize = 3506;

/// `config.attach`, with the `xdp.frags` variant chosen when the interface needs it: when
/// the set's links will bind multi-buffer (`XDP_USE_SG`, whose frames only a frags program
/// may redirect) or the MTU is above [`LINEAR_XDP_MAX_MTU`] (where veth refuses a
/// single-buffer program, and a native attach would fall back to slow generic mode).
fn resolve_attach(config: &ChannelSetConfig) -> Result<AttachOptions, ChannelError> {
    let mut attach = config.attach;
    if !attach.frags {
        let mut link = config.link.clone();
        link.ifname = config.ifname.clone();
        let mtu = crate::link::xdp::mtu_of(&config.ifname).map_err(ChannelError::Link)?;
        attach.frags =
            mtu > LINEAR_XDP_MAX_MTU || link.binds_multi_buffer().map_err(ChannelError::Link)?;
        if attach.frags {
            debug!(ifname = %config.ifname, mtu, "attaching the xdp.frags steering program");
        }
    }
    Ok(attach)
}

impl ChannelSet {
    /// Attaches the steering program to `config.ifname`, opens one AF_XDP link per queue,
    /// registers their sockets and spawns one channel thread per queue (thread *i*
    /// serving queue *i*, with id *i*), all in the
    /// calling thread's network namespace. On any error everything done so far is undone
    /// (threads joined, program detached).
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
        if queues.is_empty() {
            return Err(ChannelError::InvalidConfig("no queues".into()));
        }
        if let Some(q) = queues.iter().find(|&&q| q >= xdp_prog::MAX_QUEUES) {
            return Err(ChannelError::InvalidConfig(format!(
                "queue {q} beyond the steering program's {} slots",
                xdp_prog::MAX_QUEUES
            )));
        }
        let mut sorted = queues.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != queues.len() {
            return Err(ChannelError::InvalidConfig(
                "a queue is listed twice".into(),
            ));
        }
        if config.cores.as_ref().is_some_and(|c| c.is_empty()) {
            return Err(ChannelError::InvalidConfig("empty core list".into()));
        }
        let accept_partial = resolve_partial_checksums(&config);
        let mac = crate::neigh::interface_mac(&config.ifname).map_err(ChannelError::Neighbor)?;
        let ifindex = crate::neigh::ifindex_of(&config.ifname).map_err(ChannelError::Neighbor)?;
        let ports = match &config.ephemeral_ports {
            Some(r) => r.clone(),
            None => {
                crate::ports::EphemeralRange::from_kernel()
                    .map_err(ChannelError::Ports)?
                    .ours
            }
        };

        let attach = resolve_attach(&config)?;
        // From here on, `steering` detaches on every early return.
        let steering = XdpSteering::attach(&config.ifname, attach).map_err(ChannelError::Xdp)?;
        let mut links = Vec::with_capacity(queues.len());
        for &q in &queues {
            let mut lc = config.link.clone();
            lc.ifname = config.ifname.clone();
            lc.queue_id = q;
            let link = XdpLink::open(lc).map_err(ChannelError::Link)?;
            steering
                .register_socket(q, link.fd())
                .map_err(ChannelError::Xdp)?;
            links.push(link);
        }

        let io_err = |op| move |source| ChannelError::Io { op, source };
        let mut peers = Vec::with_capacity(queues.len());
        let mut ends = Vec::with_capacity(queues.len());
        let clock = Clock::new();
        for &q in &queues {
            let signal = Arc::new(
                ThreadSignal::with_origin(clock.origin()).map_err(io_err("creating an eventfd"))?,
            );
            signal.set_inline_max(config.inline_tx);
            let (ctx, crx) = crossbeam_channel::unbounded();
            let (ftx, frx) = crossbeam_channel::bounded(config.forward_queue.max(1));
            peers.push(Peer {
                queue: q,
                signal: signal.clone(),
                commands: ctx,
                forward: ftx,
                checksums: ChecksumCounters::default(),
                syns: SynCounters::default(),
                resets_received: AtomicU64::new(0),
                busy_ns: AtomicU64::new(0),
                thread_rounds: AtomicU64::new(0),
                rx_fault_dropped: AtomicU64::new(0),
            });
            ends.push((signal, crx, frx));
        }
        let shared = Arc::new(SetShared {
            ipv4: config.ipv4,
            directory: FlowDirectory::default(),
            ports: PortAllocator::new(ports),
            pool: BufferPool::new(config.forward_queue.max(1)),
            peers,
            steering: RwLock::new(Some(steering)),
            tx_limits: config.tx_queue.into(),
            rx_limits: config.rx_queue.into(),
            nodelay: config.nodelay,
            stopped: AtomicBool::new(false),
            listeners: Mutex::new(HashMap::new()),
            endpoints: Mutex::new(HashMap::new()),
            forwarded: AtomicU64::new(0),
            forward_dropped: AtomicU64::new(0),
            graveyard: Mutex::new(Vec::new()),
        });
        let mut set = ChannelSet {
            shared: shared.clone(),
            threads: Mutex::new(Threads::default()),
            clock,
            resolver: None,
            neighbors: Mutex::new(HashMap::new()),
            next_queue: AtomicUsize::new(0),
            config: config.clone(),
            accept_partial,
        };

        let (rtx, rrx) = crossbeam_channel::unbounded();
        let timeout = config.neighbor_timeout;
        let handle = std::thread::Builder::new()
            .name(format!("nc-neigh-{}", config.ifname))
            .spawn(move || resolver(ifindex, timeout, rrx))
            .map_err(io_err("spawning the resolver thread"))?;
        set.resolver = Some((rtx, handle));

        // One secret for all queues: a peer's ACK may come back on another queue than the
        // SYN its cookie answered.
        let syn_cookie_secret = Some(Arc::new(crate::tcp::syncookie::SynCookies::new()));
        let (started_tx, started_rx) = std::sync::mpsc::sync_channel(queues.len());
        set.threads_mut().queue_thread = (0..queues.len())
            .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
            .collect();
        for (index, ((link, &q), (signal, crx, frx))) in
            links.into_iter().zip(&queues).zip(ends).enumerate()
        {
            // For `RxPoller`s; without it the queue is served by its thread alone.
            match link.as_fd().try_clone_to_owned() {
                Ok(fd) => signal.set_rx_fd(fd),
                Err(e) => {
                    warn!(queue = q, error = %e, "duplicating the AF_XDP descriptor for runtime polling")
                }
            }
            let iface = Interface::new(
                link,
                InterfaceConfig {
                    mac,
                    ipv4: config.ipv4,
                    tcp: config.tcp.clone(),
                    ephemeral_ports: set.shared.ports_range(),
                    max_connections: config.max_connections,
                    max_time_wait: crate::netif::DEFAULT_MAX_TIME_WAIT,
                    isn_key: None,
                    rx_batch: config.link.rx_batch,
                    tx_batch: config.link.tx_batch,
                    ttl: 64,
                    accept_partial_checksums: accept_partial,
                    syn_cookies: config.syn_cookies,
                    syn_cookie_secret: syn_cookie_secret.clone(),
                },
            );
            debug!(
                queue = q,
                mtu = iface.link().mtu(),
                "channel thread starting"
            );
            // The neighbour table is opened here, in the interface's namespace, so that
            // whichever thread serves the queue later (one added from anywhere) has it.
            let neigh = match crate::neigh::KernelNeighbors::open() {
                Ok(n) => Some(n),
                Err(e) => {
                    warn!(queue = q, error = %e, "opening the neighbour table; accepted peers' MAC addresses go unchecked");
                    None
                }
            };
            let worker = Worker {
                index,
                queue: q,
                iface,
                clock,
                signal: signal.clone(),
                commands: crx,
                forwarded: frx,
                set: shared.clone(),
                ifindex,
                neigh,
            };
            let slot =
                QueueSlot::new(worker).map_err(io_err("duplicating the AF_XDP descriptor"))?;
            let core = config.cores.as_ref().map(|c| c[index % c.len()]);
            // Thread `index` serves queue `index` to begin with.
            set.spawn_thread(core, vec![slot], &started_tx)?;
        }
        // Every thread is running (named, pinned) before the set is handed out.
        drop(started_tx);
        for _ in &queues {
            if started_rx.recv().is_err() {
                return Err(ChannelError::Io {
                    op: "starting a channel thread",
                    source: std::io::Error::other("a channel thread ended before it started"),
                });
            }
        }
        info!(
            ifname = %config.ifname, ipv4 = %config.ipv4, ?queues,
            "channel set started"
        );
        Ok(set)
    }

    fn threads(&self) -> std::sync::MutexGuard<'_, Threads> {
        self.threads.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn threads_mut(&mut self) -> &mut Threads {
        self.threads.get_mut().unwrap_or_else(|p| p.into_inner())
    }

    fn queue_index(&self, queue: u32) -> Option<usize> {
        self.shared.peers.iter().position(|p| p.queue == queue)
    }

    /// Spawns a channel thread serving `slots`; it says so on `started` once it runs.
    fn spawn_thread(
        &self,
        core: Option<usize>,
        slots: Vec<QueueSlot>,
        started: &std::sync::mpsc::SyncSender<()>,
    ) -> Result<u32, ChannelError> {
        let mut threads = self.threads();
        let id = threads.next_id;
        let ctl = Arc::new(
            ThreadControl::new(id, core).map_err(|source| ChannelError::Io {
                op: "creating an eventfd",
                source,
            })?,
        );
        let name = match slots.as_slice() {
            [one] => format!("nc-chan-{}-q{}", self.config.ifname, one.queue()),
            _ => format!("nc-chan-{}-t{id}", self.config.ifname),
        };
        let start = ThreadStart {
            ctl: ctl.clone(),
            set: self.shared.clone(),
            clock: self.clock,
            busy_poll: self.config.link.busy_poll,
            slots,
            started: Some(started.clone()),
        };
        let join = std::thread::Builder::new()
            .name(name)
            .spawn(move || run_thread(start))
            .map_err(|source| ChannelError::Io {
                op: "spawning a channel thread",
                source,
            })?;
        threads.next_id += 1;
        threads.threads.insert(
            id,
            ThreadEntry {
                ctl,
                join: Some(join),
                dead: false,
            },
        );
        Ok(id)
    }

    /// Opens a channel to `remote` on the next queue (round-robin) and waits for the
    /// handshake, at most [`ChannelSetConfig::connect_timeout`].
    ///
    /// The peer's MAC comes from the kernel's neighbour table (resolved with ARP if need
    /// be, at most [`ChannelSetConfig::neighbor_timeout`]) and is then cached for the
    /// life of the set; `remote` must be on-link. The local port comes from the set's
    /// shared allocator and is steered to the stack before the SYN leaves.
    ///
    /// Queues whose thread was killed ([`kill_queue_thread`](Self::kill_queue_thread))
    /// are skipped; with none left it fails with [`ChannelError::ThreadDied`].
    pub fn connect(&self, remote: SocketAddrV4) -> Result<Channel, ChannelError> {
        let n = self.shared.peers.len();
        for _ in 0..n {
            let i = self.next_queue.fetch_add(1, Ordering::Relaxed) % n;
            if !self.shared.peers[i].signal.is_dead() {
                return self.connect_index(i, remote);
            }
        }
        Err(ChannelError::ThreadDied)
    }

    /// Opens a channel to `remote` whose connection lives on queue `queue`.
    pub fn connect_on(&self, queue: u32, remote: SocketAddrV4) -> Result<Channel, ChannelError> {
        let i = self
            .shared
            .peers
            .iter()
            .position(|p| p.queue == queue)
            .ok_or_else(|| {
                ChannelError::InvalidConfig(format!("no channel thread on queue {queue}"))
            })?;
        self.connect_index(i, remote)
    }

    fn connect_index(&self, index: usize, remote: SocketAddrV4) -> Result<Channel, ChannelError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(ChannelError::ShutDown);
        }
        if self.shared.peers[index].signal.is_dead() {
            return Err(ChannelError::ThreadDied);
        }
        let mac = self.resolve(*remote.ip())?;
        let port = self
            .shared
            .ports
            .allocate()
            .ok_or(ChannelError::NoFreePort)?;
        let local = SocketAddrV4::new(self.shared.ipv4, port);
        if let Err(e) = self.shared.claim_endpoint(local) {
            self.shared.ports.release(port);
            return Err(e);
        }
        let peer = &self.shared.peers[index];
        // The directory knows the flow before its SYN can leave.
        self.shared.directory.insert((local, remote), index);
        let shared = Arc::new(ChannelShared::new(
            local,
            remote,
            peer.queue,
            self.shared.tx_limits,
            self.shared.rx_limits,
            peer.signal.clone(),
        ));
        let cmd = Command::Connect {
            shared: shared.clone(),
            mac,
        };
        if peer.commands.send(cmd).is_err() {
            self.shared
                .release_flow(index, &(local, remote), Some(port));
            return Err(ChannelError::ShutDown);
        }
        peer.signal.notify_control();
        let channel = Channel::new(shared.clone());
        let timeout = self.config.connect_timeout;
        match block_on(Some(timeout), |cx| shared.poll_established(cx)) {
            Some(Ok(())) => Ok(channel),
            // Dropping `channel` aborts the attempt; the thread releases the port.
            Some(Err(e)) => Err(e),
            None => Err(ChannelError::ConnectTimeout(timeout)),
        }
    }

    /// The peer's MAC, from the set's cache or the kernel (through the resolver thread).
    fn resolve(&self, ip: Ipv4Addr) -> Result<EthernetAddress, ChannelError> {
        if let Some(&mac) = self
            .neighbors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ip)
        {
            return Ok(mac);
        }
        let Some((requests, _)) = &self.resolver else {
            return Err(ChannelError::ShutDown);
        };
        let (tx, rx) = crossbeam_channel::bounded(1);
        requests
            .send(ResolveRequest { ip, reply: tx })
            .map_err(|_| ChannelError::ShutDown)?;
        let mac = rx
            .recv()
            .map_err(|_| ChannelError::ShutDown)?
            .map_err(ChannelError::Neighbor)?;
        self.neighbors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ip, mac);
        Ok(mac)
    }

    /// Listens on `port` on every queue's interface; accepted channels of all threads
    /// arrive in the returned listener. Returns once every thread listens.
    pub fn listen(&self, port: u16) -> Result<ChannelListener, ChannelError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(ChannelError::ShutDown);
        }
        let backlog = self.config.backlog.max(1);
        let listener = Arc::new(ListenerShared {
            port,
            accept: ArrayQueue::new(backlog),
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
        let (done_tx, done_rx): (_, Receiver<Result<(), ChannelError>>) =
            crossbeam_channel::bounded(self.shared.peers.len());
        // A killed thread (fault injection) listens no more: its queue's SYNs go
        // unanswered, as they would with a crashed thread.
        let live: Vec<_> = self
            .shared
            .peers
            .iter()
            .filter(|p| !p.signal.is_dead())
            .collect();
        if live.is_empty() {
            return Err(ChannelError::ThreadDied);
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
        for _ in &live {
            done_rx
                .recv_timeout(LISTEN_CONFIRM_TIMEOUT)
                .map_err(|_| ChannelError::ShutDown)??;
        }
        Ok(handle)
    }

    /// Listens on the channel port ([`ChannelSetConfig::channel_port`], 9000 by default).
    pub fn listen_channels(&self) -> Result<ChannelListener, ChannelError> {
        self.listen(self.config.channel_port)
    }

    /// The queue ids, one per channel thread.
    pub fn queues(&self) -> Vec<u32> {
        self.shared.peers.iter().map(|p| p.queue).collect()
    }

    /// One [`RxPoller`] per channel thread: the receive side of its queue, for a runtime
    /// that waits for arrivals and runs the queue's rounds on its own threads.
    pub fn rx_pollers(&self) -> Vec<RxPoller> {
        self.shared
            .peers
            .iter()
            .map(|p| RxPoller {
                queue: p.queue,
                signal: p.signal.clone(),
            })
            .collect()
    }

    /// The set's configuration.
    pub fn config(&self) -> &ChannelSetConfig {
        &self.config
    }

    /// The steering program's counters (redirected, passed, ...).
    pub fn steering_counters(&self) -> Result<xdp_prog::Counters, ChannelError> {
        self.shared.with_steering(|s| s.counters())
    }

    /// Flows the flow directory holds (for tests and diagnostics).
    pub fn flow_count(&self) -> usize {
        self.shared.directory.len()
    }

    /// Frames that arrived on one queue for a flow owned by another queue's thread and
    /// were forwarded to it, and those dropped because its forwarding queue was full.
    pub fn forwarded_frames(&self) -> (u64, u64) {
        (
            self.shared.forwarded.load(Ordering::Relaxed),
            self.shared.forward_dropped.load(Ordering::Relaxed),
        )
    }

    /// Receive checksum counters of all channel threads, and whether partial checksums
    /// are accepted on this interface (see [`PartialChecksums`]).
    pub fn rx_checksum_stats(&self) -> RxChecksumStats {
        let mut stats = RxChecksumStats {
            accept_partial: self.accept_partial,
            ..RxChecksumStats::default()
        };
        for p in &self.shared.peers {
            stats.partial += p.checksums.partial.load(Ordering::Relaxed);
            stats.bad += p.checksums.bad.load(Ordering::Relaxed);
        }
        stats
    }

    /// SYN and SYN-cookie counters of all channel threads.
    pub fn syn_stats(&self) -> SynStats {
        let mut stats = SynStats {
            cookies_enabled: self.config.syn_cookies,
            ..SynStats::default()
        };
        for p in &self.shared.peers {
            let s = &p.syns;
            stats.dropped += s.dropped.load(Ordering::Relaxed);
            stats.cookies_sent += s.cookies_sent.load(Ordering::Relaxed);
            stats.cookies_accepted += s.cookies_accepted.load(Ordering::Relaxed);
            stats.cookies_rejected += s.cookies_rejected.load(Ordering::Relaxed);
            stats.neighbor_mismatches += s.neighbor_mismatches.load(Ordering::Relaxed);
            stats.neighbor_unverified += s.neighbor_unverified.load(Ordering::Relaxed);
        }
        stats
    }

    /// Connections of all channel threads failed by a RST from the peer (one that passed
    /// RFC 5961's check: exactly at RCV.NXT). Local aborts are not counted.
    pub fn resets_received(&self) -> u64 {
        self.shared
            .peers
            .iter()
            .map(|p| p.resets_received.load(Ordering::Relaxed))
            .sum()
    }

    /// How much work each queue's channel thread has done so far: the time it spent in
    /// the queue's rounds (receiving, running the TCP state machines, transmitting),
    /// cumulative since the set started, whichever thread ran them, with the core of the
    /// thread that serves the queue now. Sleeping and busy-polling an idle queue do not
    /// count; rounds an application task runs inline do not either (they are that task's
    /// thread's work). Sample it twice for a utilisation. [`placement`](Self::placement)
    /// gives the same per thread.
    pub fn thread_stats(&self) -> Vec<QueueThreadStats> {
        let threads = self.threads();
        self.shared
            .peers
            .iter()
            .enumerate()
            .map(|(i, p)| QueueThreadStats {
                queue: p.queue,
                core: threads
                    .queue_thread
                    .get(i)
                    .and_then(|t| threads.threads.get(t))
                    .and_then(|t| core_of(&t.ctl)),
                busy: std::time::Duration::from_nanos(p.busy_ns.load(Ordering::Relaxed)),
                xsk_drops: p.signal.rx_fd().and_then(|fd| xsk_drops(fd).ok()),
                inline_sends: p.signal.inline_sends(),
                handed_sends: p.signal.handed_sends(),
                inline_rounds: p.signal.inline_rounds(),
                thread_rounds: p.thread_rounds.load(Ordering::Relaxed),
                wakeups: p.signal.wakeups(),
            })
            .collect()
    }

    /// Pins the channel thread that serves `queue` to `core` at run time (a scheduler's
    /// `PlanAction::Pin`); the thread moves itself at its next pass (it is woken for it).
    /// Every queue of that thread, and every channel of those queues, moves with it.
    /// `false` when no live thread serves `queue` or `core` is not one this process may
    /// run on; [`pin_thread`](Self::pin_thread) says which.
    pub fn pin_queue_thread(&self, queue: u32, core: usize) -> bool {
        let Some(index) = self.queue_index(queue) else {
            return false;
        };
        let threads = self.threads();
        let Some(&id) = threads.queue_thread.get(index) else {
            return false;
        };
        drop(threads);
        self.pin_thread(id, core).is_ok()
    }

    /// Spawns a channel thread that serves no queue yet, pinned to `core` when given;
    /// returns its id once it runs (pinned). Give it queues with
    /// [`move_queue`](Self::move_queue).
    ///
    /// ```no_run
    /// # fn f(set: &netdriver::channel::ChannelSet) -> Result<(), netdriver::channel::ChannelError> {
    /// // Queue 1 gets a thread of its own on core 1.
    /// let t = set.add_thread(Some(1))?;
    /// set.move_queue(1, t)?;
    /// assert_eq!(set.placement().thread_of(1), Some(t));
    /// # Ok(()) }
    /// ```
    pub fn add_thread(&self, core: Option<usize>) -> Result<u32, ChannelError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(ChannelError::ShutDown);
        }
        if let Some(c) = core {
            check_core(c)?;
        }
        let (started_tx, started_rx) = std::sync::mpsc::sync_channel(1);
        let id = self.spawn_thread(core, Vec::new(), &started_tx)?;
        drop(started_tx);
        if started_rx.recv().is_err() {
            return Err(ChannelError::Io {
                op: "starting a channel thread",
                source: std::io::Error::other("a channel thread ended before it started"),
            });
        }
        info!(thread = id, ?core, "channel thread added");
        Ok(id)
    }

    /// Moves `queue` to thread `thread`. The queue's state (its interface, connections,
    /// rings and buffers) is handed over whole at the serving thread's next pass, between
    /// two of its rounds: nothing is lost, duplicated or reordered, and the queue's
    /// wake-ups (its own eventfd, which the new thread sleeps on) reach the new thread.
    /// Returns once ordered; [`placement`](Self::placement) shows the new thread at once.
    /// Moving a queue to the thread that serves it does nothing.
    pub fn move_queue(&self, queue: u32, thread: u32) -> Result<(), ChannelError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(ChannelError::ShutDown);
        }
        let index = self
            .queue_index(queue)
            .ok_or(ChannelError::NoSuchQueue(queue))?;
        let mut threads = self.threads();
        let to = threads.live(thread)?.ctl.clone();
        let from_id = threads.queue_thread[index];
        if from_id == thread {
            return Ok(());
        }
        let from = threads.live(from_id)?;
        if !from.ctl.release(index, to) {
            return Err(ChannelError::ThreadDied);
        }
        threads.queue_thread[index] = thread;
        debug!(queue, from = from_id, to = thread, "moving a queue");
        Ok(())
    }

    /// Removes thread `thread`: its queues first move to the remaining live threads (each
    /// to the one serving the fewest queues then, as [`move_queue`](Self::move_queue)
    /// moves them), then it ends. Returns once it has ended. The last live thread is not
    /// removed ([`ChannelError::LastThread`]).
    pub fn remove_thread(&self, thread: u32) -> Result<(), ChannelError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(ChannelError::ShutDown);
        }
        let join = {
            let mut threads = self.threads();
            let ctl = threads.live(thread)?.ctl.clone();
            let others: Vec<u32> = threads
                .threads
                .iter()
                .filter(|(&id, t)| id != thread && !t.dead)
                .map(|(&id, _)| id)
                .collect();
            if others.is_empty() {
                return Err(ChannelError::LastThread(thread));
            }
            let mine: Vec<usize> = threads.queues_of(thread).collect();
            for index in mine {
                let to = *others
                    .iter()
                    .min_by_key(|&&id| threads.queues_of(id).count())
                    .unwrap_or(&others[0]);
                let to_ctl = threads.live(to)?.ctl.clone();
                if !ctl.release(index, to_ctl) {
                    return Err(ChannelError::ThreadDied);
                }
                threads.queue_thread[index] = to;
                debug!(
                    queue = self.shared.peers[index].queue,
                    from = thread,
                    to,
                    "moving a queue off a retiring thread"
                );
            }
            ctl.request_retire();
            threads
                .threads
                .remove(&thread)
                .and_then(|mut t| t.join.take())
        };
        // Not under the lock: the thread may wait for a queue still on its way to it.
        if let Some(j) = join {
            if j.join().is_err() {
                warn!(thread, "a channel thread panicked");
            }
        }
        info!(thread, "channel thread removed");
        Ok(())
    }

    /// Pins thread `thread` to `core`; the thread moves itself at its next pass (it is
    /// woken for it), with all its queues.
    pub fn pin_thread(&self, thread: u32, core: usize) -> Result<(), ChannelError> {
        check_core(core)?;
        let threads = self.threads();
        let t = threads.live(thread)?;
        if t.ctl.core.swap(core, Ordering::AcqRel) != core {
            debug!(thread, core, "pinning a channel thread");
            t.ctl.signal.notify();
        }
        Ok(())
    }

    /// Which thread serves which queue, on which core, and how busy each thread has been
    /// (a snapshot; `serde`-serialisable and printable).
    pub fn placement(&self) -> ChannelPlacement {
        let threads = self.threads();
        let list = threads
            .threads
            .iter()
            .map(|(&id, t)| ChannelThreadPlacement {
                id,
                queues: threads
                    .queues_of(id)
                    .map(|i| self.shared.peers[i].queue)
                    .collect(),
                core: core_of(&t.ctl),
                busy: std::time::Duration::from_nanos(t.ctl.busy_ns.load(Ordering::Relaxed)),
                dead: t.dead,
            })
            .collect();
        ChannelPlacement { threads: list }
    }

    /// Fault injection, for tests and drills: holds NIC queue `queue`'s round (the lock
    /// that its channel thread and inline rounds take) from a thread of its own until the
    /// returned [`RoundHold`] is released or dropped, as an application thread preempted
    /// in the middle of an inline round holds it. Whoever finds the round held meanwhile
    /// asks the holder for one more round ([`RxPoller::poll_now_or_ask`]); on release the
    /// hold hands that round to the channel thread, as an inline holder whose passes are
    /// used up does. Returns once the round is held; `None` when no thread state serves
    /// `queue` (an unknown queue, a stopped set).
    pub fn hold_queue_round(&self, queue: u32) -> Option<RoundHold> {
        let index = self.queue_index(queue)?;
        let signal = self.shared.peers.get(index)?.signal.clone();
        let state = signal.inline_state()?;
        let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("nc-hold-q{queue}"))
            .spawn(move || {
                let round = state.lock().unwrap_or_else(|p| p.into_inner());
                let _ = held_tx.send(());
                // Released, or the hold dropped.
                let _ = release_rx.recv();
                drop(round);
                if signal.take_round_wanted() {
                    signal.notify();
                }
            })
            .ok()?;
        held_rx.recv().ok()?;
        Some(RoundHold {
            release: Some(release_tx),
            thread: Some(thread),
        })
    }

    /// Fault injection, for tests and failure drills: the channel thread that serves
    /// `queue` dies as if it had crashed, and with it every queue it serves (one, unless
    /// queues were moved onto it). Their channels fail at once on this side
    /// ([`ChannelError::ThreadDied`]), but nothing goes on the wire: no FIN, no RST. The
    /// queues' AF_XDP sockets stay open with every connection as it was, so arrivals for
    /// them are dropped unread and the peer notices only through its keep-alive or user
    /// timeout. Nobody serves those queues afterwards: no inline round runs them
    /// ([`RxPoller::is_dead`]), new channels go to the other queues, and their SYNs go
    /// unanswered. The states are released when the set stops. The dead thread stays in
    /// [`placement`](Self::placement), marked dead, and takes no queue.
    ///
    /// Returns at once (the thread dies at its next look at its signal); `false` when no
    /// thread serves `queue` or it was killed before.
    pub fn kill_queue_thread(&self, queue: u32) -> bool {
        let Some(index) = self.queue_index(queue) else {
            return false;
        };
        let mut threads = self.threads();
        let id = threads.queue_thread[index];
        let victims: Vec<usize> = threads.queues_of(id).collect();
        let Some(t) = threads.threads.get_mut(&id) else {
            return false;
        };
        if t.dead || self.shared.peers[index].signal.is_dead() {
            return false;
        }
        warn!(
            queue,
            thread = id,
            "killing a channel thread (fault injection)"
        );
        t.dead = true;
        // Marked before the thread looks, so that no inline round runs them any more,
        // and a queue on its way to the thread dies wherever it is.
        for i in victims {
            self.shared.peers[i].signal.request_kill();
        }
        t.ctl.signal.request_kill();
        true
    }

    /// Fault injection, for tests and failure drills: every queue thread drops received
    /// data segments by `rule` ([`RxDrop`](crate::netif::RxDrop): after `skip` data
    /// segments from `rule.from`, the next `count`), before TCP sees them, as if they were
    /// lost on the wire; `None` removes the rules. What a rule dropped is counted in
    /// [`ChannelSet::fault_dropped`]. Takes effect at each thread's next round.
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

    /// Stops and joins the threads (aborting every connection), then detaches the
    /// steering program. Reports a failed detach; dropping the set does the same and logs.
    pub fn shutdown(mut self) -> Result<(), ChannelError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), ChannelError> {
        self.shared.stopped.store(true, Ordering::Release);
        for p in &self.shared.peers {
            p.signal.request_stop();
        }
        let entries = std::mem::take(&mut self.threads_mut().threads);
        for t in entries.values() {
            t.ctl.signal.request_stop();
        }
        for (id, mut t) in entries {
            if let Some(j) = t.join.take() {
                if j.join().is_err() {
                    warn!(thread = id, "a channel thread panicked");
                }
            }
        }
        // Killed queues (fault injection): their sockets close here, with no more on the
        // wire than a crashed process would send.
        let dead = std::mem::take(
            &mut *self
                .shared
                .graveyard
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        drop(dead);
        if let Some((requests, join)) = self.resolver.take() {
            drop(requests);
            let _ = join.join();
        }
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
                let res = s.detach().map_err(ChannelError::Xdp);
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

impl SetShared {
    fn ports_range(&self) -> RangeInclusive<u16> {
        self.ports.range()
    }

    /// A set without steering program or threads, around `peers`, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(peers: Vec<Peer>) -> SetShared {
        SetShared {
            ipv4: Ipv4Addr::new(10, 0, 0, 1),
            directory: FlowDirectory::default(),
            ports: PortAllocator::new(61000..=61009),
            pool: BufferPool::new(4),
            peers,
            steering: RwLock::new(None),
            tx_limits: QueueLimits::default().into(),
            rx_limits: QueueLimits::default().into(),
            nodelay: true,
            stopped: AtomicBool::new(false),
            listeners: Mutex::new(HashMap::new()),
            endpoints: Mutex::new(HashMap::new()),
            forwarded: AtomicU64::new(0),
            forward_dropped: AtomicU64::new(0),
            graveyard: Mutex::new(Vec::new()),
        }
    }
}

/// What a listener shares with the channel threads.
#[derive(Debug)]
pub(crate) struct ListenerShared {
    port: u16,
    accept: ArrayQueue<Channel>,
    waker: AtomicWaker,
    closed: AtomicBool,
}

impl ListenerShared {
    /// Queues an accepted channel; false (and the channel is dropped, so aborted) when the
    /// queue is full or the listener closed.
    pub(crate) fn push(&self, ch: Channel) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return false;
        }
        self.accept.push(ch).is_ok()
    }

    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<Result<Channel, ChannelError>> {
        for attempt in 0..2 {
            if let Some(ch) = self.accept.pop() {
                return Poll::Ready(Ok(ch));
            }
            if self.closed.load(Ordering::Acquire) {
                return Poll::Ready(Err(ChannelError::ShutDown));
            }
            if attempt == 0 {
                self.waker.register(cx.waker());
            }
        }
        Poll::Pending
    }
}

/// Accepts channels to one port on every queue of a [`ChannelSet`]. Dropping it stops
/// listening and aborts channels not yet accepted.
#[derive(Debug)]
pub struct ChannelListener {
    shared: Arc<ListenerShared>,
    set: Arc<SetShared>,
}

impl ChannelListener {
    /// The port.
    pub fn port(&self) -> u16 {
        self.shared.port
    }

    /// Waits for the next channel and returns it with its peer's address.
    pub fn accept(&self) -> Result<(Channel, SocketAddrV4), ChannelError> {
        block_on(None, |cx| self.shared.poll_accept(cx))
            .unwrap_or(Err(ChannelError::WouldBlockTimeout))
            .map(|c| {
                let peer = c.peer_addr();
                (c, peer)
            })
    }

    /// [`accept`](Self::accept), waiting at most `timeout`
    /// ([`ChannelError::WouldBlockTimeout`] then).
    pub fn accept_timeout(
        &self,
        timeout: Duration,
    ) -> Result<(Channel, SocketAddrV4), ChannelError> {
        block_on(Some(timeout), |cx| self.shared.poll_accept(cx))
            .unwrap_or(Err(ChannelError::WouldBlockTimeout))
            .map(|c| {
                let peer = c.peer_addr();
                (c, peer)
            })
    }

    /// Async accept.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<Result<Channel, ChannelError>> {
        self.shared.poll_accept(cx)
    }
}

impl Drop for ChannelListener {
    fn drop(&mut self) {
        let port = self.shared.port;
        self.shared.close();
        let mine = {
            let mut ls = self.set.listeners();
            if ls.get(&port).is_some_and(|l| Arc::ptr_eq(l, &self.shared)) {
                ls.remove(&port);
                true
            } else {
                false
            }
        };
        if !mine {
            return;
        }
        for p in &self.set.peers {
            if p.commands.send(Command::Unlisten { port }).is_ok() {
                p.signal.notify_control();
            }
        }
        if let Some(s) = self.set.steering_read().as_ref() {
            if let Err(e) = s.release_port(port) {
                warn!(port, error = %e, "releasing a listened port");
            }
        }
        while self.shared.accept.pop().is_some() {}
    }
}

/// One queue's channel thread, as [`ChannelSet::thread_stats`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueThreadStats {
    /// The NIC queue the thread serves.
    pub queue: u32,
    /// The core it is pinned to (`ChannelSetConfig::cores`), if any.
    pub core: Option<usize>,
    /// Time spent in its rounds since the set started.
    pub busy: std::time::Duration,
    /// What the kernel dropped at the queue's AF_XDP socket (its rx ring full, its fill
    /// ring empty); `None` when the socket is not there to ask.
    pub xsk_drops: Option<XskDrops>,
    /// Rounds that application threads ran in the thread's place to send a chunk they
    /// had just queued (inline transmit, `DeferredKick`), since the set started.
    pub inline_sends: u64,
    /// Chunks whose sending an application thread left to another application thread
    /// that ran the queue's round at the time (it runs one more before letting go),
    /// instead of waking the channel thread, since the set started.
    pub handed_sends: u64,
    /// Rounds that application threads ran in the thread's place (inline sends and
    /// run-to-completion receives), since the set started. A caller runs rounds until
    /// one finds nothing to do or leaves the queue settled, so this over the number of
    /// such calls says how many rounds a call costs.
    pub inline_rounds: u64,
    /// Rounds the queue's channel thread ran itself, since the set started. While a
    /// runtime serves the queue's arrivals under a lease ([`RxPoller`]) it runs none,
    /// unless a timer of the queue is due or work was left to it: its wake-ups then only
    /// look.
    pub thread_rounds: u64,
    /// Times the thread serving the queue came back from sleep since the set started,
    /// whatever woke it: arrivals, kicks, timers, the end of a runtime's lease. On a host
    /// with few cores each one may preempt an application thread: they are most of a
    /// ping-pong's latency tail there (`docs/performance.md`, "Background wake-ups").
    pub wakeups: u64,
}

/// The core a thread is to run on, if it is pinned.
fn core_of(ctl: &ThreadControl) -> Option<usize> {
    Some(ctl.core.load(Ordering::Relaxed)).filter(|&c| c != usize::MAX)
}

/// Whether this process may run on `core`.
fn check_core(core: usize) -> Result<(), ChannelError> {
    let allowed = core_affinity::get_core_ids()
        .unwrap_or_default()
        .iter()
        .any(|c| c.id == core);
    if allowed {
        Ok(())
    } else {
        Err(ChannelError::CoreNotAllowed(core))
    }
}

/// Which channel thread serves which queue of a [`ChannelSet`], where the threads run and
/// how busy they have been ([`ChannelSet::placement`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ChannelPlacement {
    /// Every thread of the set, by id, killed ones included.
    pub threads: Vec<ChannelThreadPlacement>,
}

impl ChannelPlacement {
    /// The thread that serves `queue`, if any.
    pub fn thread_of(&self, queue: u32) -> Option<u32> {
        self.threads
            .iter()
            .find(|t| t.queues.contains(&queue))
            .map(|t| t.id)
    }

    /// Thread `id`, if the set has it.
    pub fn thread(&self, id: u32) -> Option<&ChannelThreadPlacement> {
        self.threads.iter().find(|t| t.id == id)
    }
}

impl std::fmt::Display for ChannelPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, t) in self.threads.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

/// One channel thread in a [`ChannelPlacement`].
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ChannelThreadPlacement {
    /// The thread's id in its set (the first threads are numbered as their queues'
    /// indices; added ones count on).
    pub id: u32,
    /// The queues it serves (as ordered: a move takes effect at the source thread's next
    /// pass).
    pub queues: Vec<u32>,
    /// The core it is pinned to, if any.
    pub core: Option<usize>,
    /// Time it spent in rounds since it started, over all the queues it served.
    pub busy: std::time::Duration,
    /// Killed by fault injection ([`ChannelSet::kill_queue_thread`]).
    pub dead: bool,
}

impl std::fmt::Display for ChannelThreadPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "thread {} queues {:?}", self.id, self.queues)?;
        match self.core {
            Some(c) => write!(f, " core {c}")?,
            None => f.write_str(" unpinned")?,
        }
        write!(f, " busy {:?}", self.busy)?;
        if self.dead {
            f.write_str(" dead")?;
        }
        Ok(())
    }
}

/// A NIC queue's round held by [`ChannelSet::hold_queue_round`] (fault injection). Let
/// go with [`release`](Self::release) or by dropping it; either returns once the round is
/// free again.
#[derive(Debug)]
pub struct RoundHold {
    release: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl RoundHold {
    /// Lets the round go (and hands an asked-for round to the channel thread).
    pub fn release(mut self) {
        self.let_go();
    }

    fn let_go(&mut self) {
        drop(self.release.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RoundHold {
    fn drop(&mut self) {
        self.let_go();
    }
}
