//! The runtime: a [`Stack`] of virtual sockets over channels, used through tokio's
//! [`AsyncRead`](tokio::io::AsyncRead)/[`AsyncWrite`](tokio::io::AsyncWrite) as
//! [`VirtualStream`] and [`VirtualListener`], the drop-ins for `TcpStream` and
//! `TcpListener`.
//!
//! This is the NetChannel paper's *virtual network system* seen by applications (§3.2 and
//! §4 of the paper: virtual sockets multiplexed over channels, a two-way handshake over an
//! existing channel, per-socket reordering and flow control, scheduler-driven placement of
//! chunks). The protocol itself is the sans-IO [`Endpoint`]; this module
//! binds it to real channels and to tokio:
//!
//! - [`Backend`]: where channels come from. [`XdpBackend`] runs netdriver's AF_XDP
//!   [`ChannelSet`](netdriver::channel::ChannelSet) (in-crate TCP, one thread per NIC
//!   queue); [`MemNetwork`]/[`MemBackend`] join stacks in one process with bounded
//!   in-memory channels, for unprivileged, deterministic tests.
//! - The sockets are split over **shards** ([`StackBuilder::shards`]), each an endpoint
//!   behind its own lock: calls on streams of different shards share no lock but the
//!   channels' (`shard.rs`, `chan.rs`; `docs/architecture.md`, "Threads and locking").
//! - The driver (one thread per stack, `driver.rs`) accepts channels on the channel port
//!   (9000 unless configured), feeds received chunks to their shards' endpoints (pausing a
//!   channel's reads when an endpoint says so, the last resort of head-of-line
//!   protection), pushes the endpoints' output to the channels the [scheduler](netsched)
//!   picked, reports channel loads and losses, fails connects past their deadline and
//!   wakes the tasks waiting on sockets. It sleeps when idle, woken by channel wakers and
//!   application calls. Application calls move their own output into the channels, and
//!   readers pull received bytes themselves, so the driver is off the data path most of
//!   the time.
//! - On the first `connect` to a host, a helper thread opens the configured number of
//!   throughput channels (plus latency channels) to the host's channel port; each begins
//!   with an 8-byte preamble naming its class (`docs/wire-format.md`). Channels accepted
//!   from a host serve connects to it as well.
//! - Copy workers (the paper's §3.3, [`crate::copy`]): see [below](#copy-workers).
//!
//! # Copy workers
//!
//! [`StackBuilder::copy_workers`]`(n)` gives the stack a
//! [`CopyWorkerPool`] of `n` threads (`vns-copy-i`), placed
//! NUMA-local to the thread that builds the stack and pinned with `core_affinity`; `0`
//! (the default) starts none and the application thread copies everything. Tunables
//! (small-copy threshold, default 512 KiB; pinning; buffer pool size) come with
//! [`StackBuilder::copy_config`]. With workers:
//!
//! - A write of at least the threshold waits for that much room in the socket's send
//!   buffer (instead of waking for every chunk sent), then the application slice is cut
//!   into chunks of `max_chunk_payload` in pooled buffers that keep room for the chunk
//!   header in front, copied by the workers and the application thread together, outside
//!   the stack's lock. The buffers join the send buffer as they are, leave for the
//!   channels without another copy, and return to the pool once the channel has dropped
//!   them (reused, not allocated per chunk: [`Stack::copy_stats`]).
//! - A read into a buffer of at least the threshold lends the received in-order chunks
//!   to the pool, which copies them out in parallel when at least the threshold is
//!   readable (fewer bytes are copied inline).
//! - Smaller writes and reads take the plain path, unchanged. Credit and flow control are
//!   the same on both paths (a read frees receive space and may send a credit update
//!   exactly as before).
//!
//! The workers only engage when the socket buffers can hold a copy that large: the
//! defaults ([`Config::send_buffer`]/[`Config::recv_buffer`], 256 KiB) are below the
//! default threshold, so a stack built with copy workers and no
//! [`StackBuilder::vns_config`] gets buffers of four times the threshold (2 MiB, credit
//! window 4 MiB). An explicit `vns_config` is taken as it is (a warning is logged when
//! its buffers keep the workers idle). The copies block the calling task for their
//! duration, like a `memcpy` in a syscall (tens of µs for 1 MiB). Dropping the stack's
//! last handle joins the workers. Figures: `docs/performance.md`, "Copy workers".
//!
//! ```
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use vns::stack::{MemNetwork, Stack};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let net = MemNetwork::new();
//! // With copy workers and no explicit vns_config, the socket buffers are sized for them.
//! let build = |ip: &str| {
//!     Stack::builder()
//!         .ipv4(ip.parse().unwrap())
//!         .copy_workers(2)
//!         .build_in_memory(&net)
//! };
//! let (a, b) = (build("10.0.0.1")?, build("10.0.0.2")?);
//! let listener = b.bind("10.0.0.2:7000".parse().unwrap()).await?;
//! let mut client = a.connect("10.0.0.2:7000".parse().unwrap()).await?;
//! let (mut server, _) = listener.accept().await?;
//!
//! let data = vec![7u8; 1 << 20];
//! let (written, got) = tokio::join!(client.write_all(&data), async {
//!     let mut got = vec![0u8; data.len()];
//!     server.read_exact(&mut got).await.map(|_| got)
//! });
//! written?;
//! assert!(got? == data);
//! // The 1 MiB write was copied by the workers and the application thread together.
//! assert!(a.copy_stats().parallel_copies >= 1);
//! assert!(a.copy_stats().worker_bytes > 0);
//! # Ok(())
//! # }
//! ```
//!
//! # Liveness
//!
//! A peer whose host goes down, or whose path is cut, sends nothing: no FIN, no RST. A
//! [`VirtualStream`] must still fail rather than hang, and that is the channels' TCP's
//! job, configured by the stack's [`Liveness`] policy and applied to every channel it
//! opens or accepts (NetChannel channels and plain-TCP streams alike):
//!
//! - **Idle channels: keep-alive** ([`StackBuilder::keepalive`],
//!   [`keepalive_interval`](StackBuilder::keepalive_interval),
//!   [`keepalive_probes`](StackBuilder::keepalive_probes)). A channel that has received
//!   nothing for the idle time, with nothing of its own unacknowledged, is probed; after
//!   the probes go unanswered it fails. Default: idle 10 s, 5 probes 1 s apart, so a
//!   `read` waiting on a vanished peer with nothing in flight fails at the latest
//!   idle + probes × interval = **15 s** ([`Liveness::idle_detection`]) after the last
//!   segment from the peer. A probe is one header-only segment per idle channel and
//!   interval, answered by an ACK. `keepalive(None)` turns probing off (such a read then
//!   waits for as long as the peer is silent).
//! - **Data in flight: the user timeout** ([`StackBuilder::user_timeout`], default
//!   **30 s**). A channel whose unacknowledged data (or SYN, FIN) makes no progress for
//!   that long fails: a pending `write` (or a `read` awaiting the reply to data sent)
//!   ends within it.
//! - **Opening channels**: [`StackBuilder::connect_timeout`] (default 10 s) bounds a
//!   `connect` to a host that does not answer.
//!
//! A channel that fails (reset, malformed, or `TimedOut` in TCP) costs its virtual
//! streams nothing while another channel to the host remains: what it carried and the
//! peer had not read goes again on the others (the data-level acknowledgement,
//! `docs/wire-format.md`). When the last one is gone the stack opens channels again if it
//! opened them, and the streams wait up to [`Config::channel_loss_timeout`] for one; then
//! they fail with `io::ErrorKind::TimedOut` ("peer unreachable", [`Error::PeerUnreachable`])
//! after a timeout, `ConnectionAborted` ([`Error::ChannelLost`]) otherwise, handing out the
//! bytes received in order first: the pending `read`/`write` and every later call return
//! it. Plain-TCP streams report their channel's own error (`TimedOut` here too). In-memory channels
//! ([`MemNetwork`]) have no TCP and ignore the policy.
//!
//! ```
//! use std::time::Duration;
//! use vns::stack::{MemNetwork, Stack};
//!
//! # fn main() -> Result<(), vns::StackError> {
//! // A latency-sensitive service that wants dead peers noticed within 2 s when idle and
//! // 5 s with data in flight.
//! let net = MemNetwork::new();
//! let stack = Stack::builder()
//!     .ipv4("10.0.0.1".parse().unwrap())
//!     .keepalive(Some(Duration::from_secs(1)))
//!     .keepalive_interval(Duration::from_millis(250))
//!     .keepalive_probes(4)
//!     .user_timeout(Duration::from_secs(5))
//!     .build_in_memory(&net)?;
//! assert_eq!(stack.liveness().idle_detection(), Some(Duration::from_secs(2)));
//! assert_eq!(stack.liveness().user_timeout, Duration::from_secs(5));
//! // The defaults: 10 s idle + 5 probes x 1 s, 30 s user timeout.
//! let defaults = vns::stack::Liveness::default();
//! assert_eq!(defaults.idle_detection(), Some(Duration::from_secs(15)));
//! # Ok(())
//! # }
//! ```
//!
//! # Example
//!
//! ```
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use vns::stack::{MemNetwork, Stack};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let net = MemNetwork::new();
//! let a = Stack::builder().ipv4("10.0.0.1".parse().unwrap()).build_in_memory(&net)?;
//! let b = Stack::builder().ipv4("10.0.0.2".parse().unwrap()).build_in_memory(&net)?;
//!
//! let listener = b.bind("10.0.0.2:7000".parse().unwrap()).await?;
//! let mut client = a.connect("10.0.0.2:7000".parse().unwrap()).await?;
//! let (mut server, peer) = listener.accept().await?;
//! assert_eq!(peer.ip().to_string(), "10.0.0.1");
//!
//! client.write_all(b"ping").await?;
//! client.shutdown().await?;
//! let mut got = Vec::new();
//! server.read_to_end(&mut got).await?;
//! assert_eq!(got, b"ping");
//! # Ok(())
//! # }
//! ```

mod auth;
mod backend;
mod chan;
mod driver;
mod listener;
mod loopback;
mod mem;
#[cfg(target_os = "linux")]
mod rx_poll;
mod shard;
#[cfg(test)]
mod shard_tests;
mod socket;
mod stream;
mod waker_list;

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use netsched::{NetScheduler, RoundRobin};
use thiserror::Error;
use tracing::{debug, warn};

pub use auth::{ChannelKey, MIN_KEY_LEN};
#[cfg(target_os = "linux")]
pub use backend::XdpBackend;
pub use backend::{Acceptor, Backend, BoxedTransport};
pub use listener::VirtualListener;
pub use mem::{MemAcceptor, MemBackend, MemChannel, MemLimits, MemNetwork};
#[cfg(target_os = "linux")]
pub use rx_poll::RuntimeRx;
pub use socket::VirtualSocket;
pub use stream::{
    OwnedReadHalf, OwnedWriteHalf, ReadHalf, ReuniteError, VirtualStream, WriteHalf, IP_TTL,
};

use crate::copy::{CopyConfig, CopyError, CopyStats, CopyWorkerPool};
use crate::endpoint::{Config, ConfigError, Endpoint, Error};
use crate::wire::HEADER_LEN;
pub use driver::PlanCounters;
use driver::{Core, CoreConfig};

/// Why a [`Stack`] could not be built.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StackError {
    /// AF_XDP sockets or XDP programs need privileges (CAP_NET_ADMIN, CAP_BPF, ...).
    #[error("not permitted (AF_XDP needs CAP_NET_ADMIN/CAP_BPF): {0}")]
    NotPermitted(#[source] netdriver::channel::ChannelError),
    /// The interface does not exist (in the calling thread's network namespace).
    #[error("no such interface: {0}")]
    NoSuchInterface(String),
    /// A required builder setting is missing.
    #[error("missing setting: {0}")]
    Missing(&'static str),
    /// A builder setting has a value that cannot work (the message says which and why).
    #[error("invalid setting: {0}")]
    Invalid(&'static str),
    /// The virtual-socket configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Starting or using the channels failed otherwise.
    #[error("channels: {0}")]
    Channels(#[source] netdriver::channel::ChannelError),
    /// Spawning the driver thread failed.
    #[error("spawning the stack's driver thread: {0}")]
    Spawn(#[source] io::Error),
    /// The copy workers could not be started.
    #[error("copy workers: {0}")]
    CopyWorkers(#[source] CopyError),
    /// An environment variable for the default stack is malformed.
    #[error("environment variable {name}: {msg}")]
    Env {
        /// The variable.
        name: &'static str,
        /// What is wrong.
        msg: String,
    },
}

impl From<StackError> for io::Error {
    fn from(e: StackError) -> io::Error {
        let kind = match &e {
            StackError::NotPermitted(_) => io::ErrorKind::PermissionDenied,
            StackError::NoSuchInterface(_) => io::ErrorKind::NotFound,
            StackError::Missing(_)
            | StackError::Invalid(_)
            | StackError::Config(_)
            | StackError::Env { .. } => io::ErrorKind::InvalidInput,
            StackError::Channels(c) => c.kind(),
            StackError::Spawn(s) => s.kind(),
            StackError::CopyWorkers(_) => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// Classifies a channel-set start failure by the errors in its source chain.
fn classify(e: netdriver::channel::ChannelError, ifname: &str) -> StackError {
    let mut text = e.to_string();
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    let mut perm = false;
    let mut nodev = false;
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            perm |= io.kind() == io::ErrorKind::PermissionDenied;
            nodev |= matches!(io.raw_os_error(), Some(19) | Some(6));
        }
        text.push_str(&s.to_string());
        src = s.source();
    }
    let t = text.to_ascii_lowercase();
    if perm || t.contains("operation not permitted") || t.contains("permission denied") {
        StackError::NotPermitted(e)
    } else if nodev || t.contains("no such device") || t.contains("no such interface") {
        StackError::NoSuchInterface(ifname.to_string())
    } else {
        StackError::Channels(e)
    }
}

/// How a stack's channels notice a peer that vanished without a word (host down, link
/// cut): TCP keep-alive for idle channels and the user timeout for channels with data in
/// flight. Set with [`StackBuilder::keepalive`], [`StackBuilder::keepalive_interval`],
/// [`StackBuilder::keepalive_probes`] and [`StackBuilder::user_timeout`]; read with
/// [`Stack::liveness`]. See [liveness](crate::stack#liveness).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Liveness {
    /// Idle time before the first keep-alive probe; `None`: no keep-alive. Default 10 s.
    pub keepalive: Option<Duration>,
    /// Time between unanswered probes. Default 1 s.
    pub keepalive_interval: Duration,
    /// Unanswered probes after which a channel fails (0 counts as 1). Default 5.
    pub keepalive_probes: u32,
    /// Longest time unacknowledged data may see no progress. Default 30 s.
    pub user_timeout: Duration,
}

impl Default for Liveness {
    /// Datacenter defaults: a peer silent for 10 s is probed every second, and given up
    /// after 5 misses (15 s in all); data unacknowledged for 30 s fails the channel.
    fn default() -> Self {
        Liveness {
            keepalive: Some(Duration::from_secs(10)),
            keepalive_interval: Duration::from_secs(1),
            keepalive_probes: 5,
            user_timeout: Duration::from_secs(30),
        }
    }
}

impl Liveness {
    /// The longest an idle channel (nothing of ours unacknowledged) to a vanished peer
    /// stays up after the last segment received from it: idle + probes × interval.
    /// `None` without keep-alive: then only sending notices a dead peer.
    pub fn idle_detection(&self) -> Option<Duration> {
        self.keepalive.map(|idle| {
            idle.saturating_add(
                self.keepalive_interval
                    .saturating_mul(self.keepalive_probes.max(1)),
            )
        })
    }

    /// Writes the policy into a channel's TCP configuration.
    #[cfg(target_os = "linux")]
    fn apply(&self, tcp: &mut netdriver::tcp::Config) {
        tcp.keepalive = self.keepalive;
        tcp.keepalive_interval = Some(self.keepalive_interval);
        tcp.keepalive_probes = self.keepalive_probes;
        tcp.user_timeout = self.user_timeout;
    }

    /// The policy a channel's TCP configuration carries.
    #[cfg(target_os = "linux")]
    fn of_tcp(tcp: &netdriver::tcp::Config) -> Liveness {
        Liveness {
            keepalive: tcp.keepalive,
            keepalive_interval: tcp.keepalive_interval.or(tcp.keepalive).unwrap_or_default(),
            keepalive_probes: tcp.keepalive_probes,
            user_timeout: tcp.user_timeout,
        }
    }
}

/// Configures and builds a [`Stack`]; see [`Stack::builder`].
pub struct StackBuilder {
    interface: Option<String>,
    ipv4: Option<Ipv4Addr>,
    channels: Option<usize>,
    latency_channels: usize,
    copy_workers: usize,
    copy_config: CopyConfig,
    scheduler: Box<dyn NetScheduler>,
    channel_port: u16,
    backlog: usize,
    connect_timeout: Duration,
    liveness: Liveness,
    /// `None`: [`Config::default`], or buffers sized for the copy workers when there are
    /// any ([`copy_worker_buffers`]).
    vns: Option<Config>,
    /// Send and receive buffer sizes of every socket ([`StackBuilder::socket_buffers`]).
    socket_buffers: Option<(usize, usize)>,
    execute_plans: bool,
    channel_thread_rx: bool,
    busy_poll: Option<BusyPoll>,
    inline_tx: Option<usize>,
    /// `None`: [`default_shards`].
    shards: Option<usize>,
    #[cfg(target_os = "linux")]
    runtime_rx: RuntimeRx,
    /// `None`: chosen from the host (`shard::auto_light_load_streams`).
    light_load_streams: Option<usize>,
    preamble_timeout: Duration,
    linger: Duration,
    /// `Err` holds a refused key until `build` reports it.
    channel_key: Result<Option<ChannelKey>, ()>,
    #[cfg(target_os = "linux")]
    partial_checksums: Option<netdriver::channel::PartialChecksums>,
    #[cfg(target_os = "linux")]
    syn_cookies: bool,
    #[cfg(target_os = "linux")]
    #[allow(clippy::type_complexity)]
    tweak: Option<Box<dyn FnOnce(&mut netdriver::channel::ChannelSetConfig)>>,
}

/// Busy polling by the channel threads, for hosts with cores to spare
/// ([`StackBuilder::busy_poll`]): the core budget is explicit, which cores may spin and
/// for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyPoll {
    /// The cores the channel threads are pinned to (thread *i* on `cores[i % len]`):
    /// only these spin.
    pub cores: Vec<usize>,
    /// How long a channel thread keeps spinning on its receive ring after its last
    /// activity before it sleeps (it never spins longer than this past its last frame).
    pub spin: Duration,
}

impl fmt::Debug for StackBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackBuilder")
            .field("interface", &self.interface)
            .field("ipv4", &self.ipv4)
            .field("channels", &self.channels)
            .field("latency_channels", &self.latency_channels)
            .field("copy_workers", &self.copy_workers)
            .field("channel_port", &self.channel_port)
            .field("liveness", &self.liveness)
            .finish_non_exhaustive()
    }
}

impl Default for StackBuilder {
    fn default() -> Self {
        StackBuilder {
            interface: None,
            ipv4: None,
            channels: None,
            latency_channels: 1,
            copy_workers: 0,
            copy_config: CopyConfig::default(),
            scheduler: Box::new(RoundRobin::default()),
            channel_port: netdriver::channel::DEFAULT_CHANNEL_PORT,
            backlog: 128,
            connect_timeout: Duration::from_secs(10),
            liveness: Liveness::default(),
            vns: None,
            socket_buffers: None,
            execute_plans: true,
            channel_thread_rx: false,
            busy_poll: None,
            inline_tx: None,
            shards: None,
            #[cfg(target_os = "linux")]
            runtime_rx: RuntimeRx::default(),
            light_load_streams: None,
            channel_key: Ok(None),
            #[cfg(target_os = "linux")]
            partial_checksums: None,
            #[cfg(target_os = "linux")]
            syn_cookies: true,
            preamble_timeout: Duration::from_secs(5),
            linger: DEFAULT_LINGER,
            #[cfg(target_os = "linux")]
            tweak: None,
        }
    }
}

impl StackBuilder {
    /// The interface whose queues get AF_XDP sockets (for [`build`](Self::build)).
    pub fn interface(mut self, name: impl Into<String>) -> Self {
        self.interface = Some(name.into());
        self
    }

    /// The stack's own IPv4 address on that interface (or on the in-memory network).
    pub fn ipv4(mut self, addr: Ipv4Addr) -> Self {
        self.ipv4 = Some(addr);
        self
    }

    /// Throughput-class channels opened to each peer on first use (at least 1).
    ///
    /// Default: chosen from the host ([`Stack::channels_per_peer`] tells which). Where the
    /// process may run on fewer than 4 cores and the stack has channel threads (AF_XDP),
    /// one: more channels spread a peer's traffic over more NIC queues and channel
    /// threads, which bring parallelism only with cores to run them beside the
    /// application. Measured on the 2-core bed (2 queues; `docs/performance.md`, "How
    /// many channels a small host opens"): one channel's request rate was 0.92-1.14 of
    /// kernel TCP's at 1-128 connections, against 0.69-0.96 with four, and one stream's
    /// bulk goodput the same with 1, 2 or 4. Otherwise [`DEFAULT_CHANNELS`]. A policy that
    /// scales at run time (`Scaled`) opens more when the channel threads stay busy.
    /// Environment: `NETCHANNEL_CHANNELS`.
    pub fn channels(mut self, n: usize) -> Self {
        self.channels = Some(n.max(1));
        self
    }

    /// Latency-class channels opened to each peer besides (default 1; 0 disables
    /// [`VirtualStream::set_app_class`] with `Latency`).
    pub fn latency_channels(mut self, n: usize) -> Self {
        self.latency_channels = n;
        self
    }

    /// Copy workers (default 0: the application thread copies everything): threads,
    /// pinned to cores NUMA-local to the thread that builds the stack, that share large
    /// copies between application buffers and the stack's chunk buffers with the
    /// application thread (see [copy workers](crate::stack#copy-workers)).
    pub fn copy_workers(mut self, n: usize) -> Self {
        self.copy_workers = n;
        self
    }

    /// Tunables of the copy workers: small-copy threshold, pinning, NUMA spill, buffer
    /// pool size, topology. Its `workers` is ignored ([`copy_workers`](Self::copy_workers)
    /// counts them), and so are `chunk_size` and `headroom`: the stack cuts chunks of its
    /// `max_chunk_payload` with room for the chunk header in front.
    pub fn copy_config(mut self, c: CopyConfig) -> Self {
        self.copy_config = c;
        self
    }

    /// The policy that places chunks on channels (default [`RoundRobin`]); see
    /// [`netsched::NetScheduler`] to write one. Its per-chunk decisions are used, its
    /// plans carried out every plan period ([`StackBuilder::execute_plans`]), and its
    /// [`pick_copy_worker`](netsched::NetScheduler::pick_copy_worker) places the pieces of
    /// large copies on the copy workers (asked of an instance of its own,
    /// [`NetScheduler::fork`]; a policy that cannot fork
    /// leaves copies split evenly).
    pub fn scheduler(mut self, s: impl NetScheduler + 'static) -> Self {
        self.scheduler = Box::new(s);
        self
    }

    /// The port channels listen on and connect to (default 9000).
    pub fn channel_port(mut self, port: u16) -> Self {
        self.channel_port = port;
        self
    }

    /// Backlog of listeners made by [`Stack::bind`] (default 128).
    pub fn backlog(mut self, n: usize) -> Self {
        self.backlog = n.max(1);
        self
    }

    /// Longest wait of [`Stack::connect`] for the handshake, and of each channel's
    /// opening (default 10 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Keep-alive idle time of every channel (default `Some(10 s)`; `None` disables
    /// keep-alive): a channel that has received nothing for this long, with nothing of its
    /// own unacknowledged, is probed every [`keepalive_interval`](Self::keepalive_interval),
    /// and fails with `TimedOut` after [`keepalive_probes`](Self::keepalive_probes)
    /// unanswered probes. This is what notices a peer host that vanished silently (power
    /// loss, cable pulled) while a [`VirtualStream`] waits in `read` with nothing in
    /// flight; without it such a read waits forever. Worst-case detection:
    /// [`Liveness::idle_detection`] = idle + probes × interval (15 s by default). See
    /// [liveness](crate::stack#liveness).
    pub fn keepalive(mut self, idle: Option<Duration>) -> Self {
        self.liveness.keepalive = idle;
        self
    }

    /// Time between unanswered keep-alive probes of a channel (default 1 s).
    pub fn keepalive_interval(mut self, d: Duration) -> Self {
        self.liveness.keepalive_interval = d;
        self
    }

    /// Unanswered keep-alive probes after which a channel fails (default 5; 0 counts as
    /// 1).
    pub fn keepalive_probes(mut self, n: u32) -> Self {
        self.liveness.keepalive_probes = n;
        self
    }

    /// How long a channel may hold unacknowledged data (or SYN, FIN) without progress
    /// before it fails with `TimedOut` (default 30 s; TCP's user timeout, RFC 9293
    /// §3.8.3). This bounds how long a `write` (or a read waiting on the peer's reply to
    /// data already sent) can hang on a vanished peer.
    pub fn user_timeout(mut self, d: Duration) -> Self {
        self.liveness.user_timeout = d;
        self
    }

    /// The virtual-socket tunables (buffers, credit, chunk size). Without this,
    /// [`Config::default`] is used, except that a stack with
    /// [`copy_workers`](Self::copy_workers) gets socket buffers large enough for the
    /// workers to engage: send and receive buffers of four times the small-copy threshold
    /// (2 MiB by default) and a credit window of twice that.
    pub fn vns_config(mut self, c: Config) -> Self {
        self.vns = Some(c);
        self
    }

    /// Whether the driver carries out the scheduler's plans (default `true`): every
    /// [`plan_period`](netsched::NetScheduler::plan_period) it shows the policy a
    /// snapshot ([`Stack::stats`]) and opens the channels it asks for and retires those it
    /// wants closed, without losing a byte (see [`Stack::plan_counters`]). Policies that
    /// plan nothing (the default `plan`) cost one snapshot per period. `false` leaves
    /// plans to [`Stack::scheduler_plan`], for tools that only want to see them.
    /// Environment: `NETCHANNEL_EXECUTE_PLANS=0|1` for the default stack.
    pub fn execute_plans(mut self, on: bool) -> Self {
        self.execute_plans = on;
        self
    }

    /// The default send and receive buffer sizes of the stack's virtual sockets, in bytes,
    /// applied over the [`vns_config`](Self::vns_config) (or the default one): the
    /// credit window and its update threshold keep their proportions to the receive
    /// buffer. A [`VirtualSocket`] sets them per socket. Environment:
    /// `NETCHANNEL_SEND_BUFFER` and `NETCHANNEL_RECV_BUFFER` for the default stack.
    pub fn socket_buffers(mut self, send: usize, recv: usize) -> Self {
        self.socket_buffers = Some((send, recv));
        self
    }

    /// How long dropping the stack's last handle lets what it has not delivered yet drain
    /// in the background before the rest is aborted (default 5 s; environment
    /// `NETCHANNEL_LINGER_MS` for the default stack). `Duration::ZERO` aborts at once, as
    /// [`Stack::abort`] does. The dropping thread never waits: the driver thread keeps
    /// running until every stream has delivered its bytes and FIN and the channels are
    /// closed, or until the linger time is up (see [`Stack::shutdown_graceful`], which
    /// does the same and waits for it). A stack with nothing undelivered stops at once.
    /// A process that exits right after the drop (returning from `main`) ends the
    /// background drain with it: await [`Stack::shutdown_graceful`] there instead.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// How long a channel accepted on the channel port may take to send its preamble
    /// before it is aborted (default 5 s). At most 256 accepted channels wait at once; past
    /// that the one that has waited longest is aborted. [`Stack::dropped_channels`]
    /// counts both, and bad preambles.
    pub fn preamble_timeout(mut self, d: Duration) -> Self {
        self.preamble_timeout = d;
        self
    }

    /// Authenticates every channel with `secret`, a key shared by all the stacks that
    /// talk to each other (at least [`MIN_KEY_LEN`] = 16 bytes; use 32 random characters
    /// or more). A channel then joins only after a challenge-response that proves both
    /// ends hold the key (HMAC-SHA256 over fresh nonces from each side, so a recorded
    /// exchange cannot be replayed); channels without the proof are aborted and counted
    /// in [`Stack::auth_failures`], and opening channels to a peer with another key, or
    /// none, fails with `PermissionDenied`. It authenticates who joins; it does not
    /// encrypt or protect the chunks that follow (see `docs/security.md`). Without a key
    /// (the default) any process reaching the channel port from a peer's address can
    /// join as one of its channels; the stack logs that once. Environment:
    /// `NETCHANNEL_CHANNEL_KEY`. A shorter key makes [`build`](Self::build) fail.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let net = vns::stack::MemNetwork::new();
    /// let stack = vns::Stack::builder()
    ///     .ipv4("10.0.0.1".parse()?)
    ///     .channel_key("a shared secret of 32 characters")
    ///     .build_in_memory(&net)?;
    /// # drop(stack);
    /// # Ok(())
    /// # }
    /// ```
    pub fn channel_key(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.channel_key = ChannelKey::new(secret).map(Some).ok_or(());
        self
    }

    /// Turns on busy polling with an explicit core budget: the channel threads are pinned
    /// to `cores` and, after their last activity, spin on their receive rings for at most
    /// `spin` instead of sleeping, which takes the kernel's wake-up out of a message's
    /// path. Off by default: a spinning thread takes its core from everything else, so
    /// use it only on cores the application leaves free (never on a 2-core machine). An
    /// empty `cores` or a zero `spin` is refused by [`build`](Self::build).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let stack = vns::Stack::builder()
    ///     .interface("eth1")
    ///     .ipv4("10.0.0.2".parse()?)
    ///     .busy_poll([6, 7], Duration::from_micros(200)) // cores 6 and 7 may spin
    ///     .build()?;
    /// # drop(stack);
    /// # Ok(())
    /// # }
    /// ```
    pub fn busy_poll(mut self, cores: impl IntoIterator<Item = usize>, spin: Duration) -> Self {
        self.busy_poll = Some(BusyPoll {
            cores: cores.into_iter().collect(),
            spin,
        });
        self
    }

    /// How many shards the stack splits its virtual sockets over (1 ..= 64; default: the
    /// cores the building thread may run on, at most 16). Each shard is its own
    /// [`Endpoint`] behind its own lock, so that calls on streams of
    /// different shards never wait for each other: no lock is shared by every stream
    /// (`docs/architecture.md`, "Threads and locking"). A socket's shard follows from its
    /// virtual ports; every shard uses every channel. The per-peer and per-stack bounds
    /// of [`StackBuilder::vns_config`] (`channel_budget`, `peer_budget`,
    /// `max_peer_sockets`, `max_sockets`) are shared out evenly (the latency shard below
    /// takes a sixteenth); a listener's backlog is one for all shards. A stack with
    /// latency channels
    /// ([`StackBuilder::latency_channels`], 1 by default) runs one shard more, the latency
    /// shard, for latency-class streams connected as such and the peer's
    /// ([`Stack::latency_shard`], [`crate::ShardOf`]). A scheduler that cannot be forked
    /// ([`NetScheduler::fork`] returns `None`) keeps the
    /// stack on one shard. Environment: `NETCHANNEL_SHARDS`.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let net = vns::stack::MemNetwork::new();
    /// let stack = vns::Stack::builder()
    ///     .ipv4("10.0.0.1".parse()?)
    ///     .shards(4)
    ///     .build_in_memory(&net)?;
    /// // Four for all streams, and the latency shard.
    /// assert_eq!(stack.shards(), 5);
    /// assert_eq!(stack.latency_shard(), Some(4));
    /// let no_latency = vns::Stack::builder()
    ///     .ipv4("10.0.0.2".parse()?)
    ///     .shards(4)
    ///     .latency_channels(0)
    ///     .build_in_memory(&net)?;
    /// assert_eq!((no_latency.shards(), no_latency.latency_shard()), (4, None));
    /// # Ok(())
    /// # }
    /// ```
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = Some(n.clamp(1, shard::MAX_SHARDS));
        self
    }

    /// Whether a channel thread that has received bytes for the stack also deframes them,
    /// hands the chunks to their sockets and wakes those sockets' tasks itself, rather
    /// than wake one waiting task of the application to do that for every socket. On:
    /// one cross-thread wake-up per arrival (channel thread → the socket's task) instead
    /// of two, and the receive work runs on the channel threads, which scale with the
    /// channels, not on the application's threads (`docs/performance.md`, "Receive on the
    /// channel threads": +15 % requests/s at 128 connections over one channel on a
    /// 16-core machine). Off (the default, until it has been measured over several
    /// channels on a machine with cores to spare): the application's tasks read the
    /// channels. Only AF_XDP channels have threads; in-memory channels always use the
    /// tasks. Environment: `NETCHANNEL_CHANNEL_THREAD_RX=0|1`.
    ///
    /// ```
    /// let builder = vns::Stack::builder().channel_thread_rx(true);
    /// # drop(builder);
    /// ```
    pub fn channel_thread_rx(mut self, on: bool) -> Self {
        self.channel_thread_rx = on;
        self
    }

    /// Largest chunk batch a write on a **latency-class** channel sends from the writing
    /// thread itself, after it releases the stack's lock, when the channel's transmit
    /// queue was empty, its thread sleeps and the queue has been quiet (inline transmit:
    /// no wake-up of the channel thread on the message's path). Throughput-class channels
    /// do so only while the stack has few active streams
    /// ([`light_load_streams`](Self::light_load_streams)); otherwise they leave
    /// transmission to their threads, which batch: on the 2-core bed inline
    /// rounds cost 25-35 % of the request rate at 32-128 connections while saving a
    /// sparse stream ~10 % of its latency (`docs/performance.md`). `0` turns it off;
    /// default 16 KiB (`netdriver::channel::ChannelSetConfig::inline_tx`).
    pub fn inline_tx(mut self, max_bytes: usize) -> Self {
        self.inline_tx = Some(max_bytes);
        self
    }

    /// Which tasks with nothing to read wait on the AF_XDP queues in their own tokio
    /// runtime and process the arrivals themselves (run-to-completion receive), rather
    /// than wait for the queue's channel thread to process them and wake them: one thread
    /// hand-off less per received message, at the cost of batching (see [`RuntimeRx`]).
    /// Needs a runtime with I/O enabled (without it, or outside tokio, the hand-off
    /// stays). Default [`RuntimeRx::LatencyClass`]; environment:
    /// `NETCHANNEL_RUNTIME_RX=off|latency|all`.
    ///
    /// ```
    /// use vns::stack::{RuntimeRx, Stack};
    /// let builder = Stack::builder().runtime_rx(RuntimeRx::All);
    /// # drop(builder);
    /// ```
    #[cfg(target_os = "linux")]
    pub fn runtime_rx(mut self, mode: RuntimeRx) -> Self {
        self.runtime_rx = mode;
        self
    }

    /// Up to how many active streams (this stack's streams that read or wrote bytes
    /// within the last 5-10 ms; idle ones do not count) every stream takes the
    /// latency-class per-message path, whatever its
    /// [`AppClass`](crate::AppClass): a small write into a quiet channel whose thread
    /// sleeps goes out from the writing task (no wake-up of the channel thread), and a
    /// reading task processes its queue's arrivals in its own runtime where
    /// [`runtime_rx`](Self::runtime_rx) is [`RuntimeRx::LatencyClass`] (no wake-up of the
    /// task from the channel thread). With more streams, throughput-class streams leave
    /// both to the channel threads, which batch many messages per round and system call.
    /// Measured on the 2-core bed (`docs/performance.md`, "Few active streams"): one
    /// connection's request rate 3.5-5x with it, 8 connections' 1.0-1.4x.
    /// `0` keeps only latency-class streams on that path.
    ///
    /// Default: chosen from the host, and again when the stack's plans add or retire
    /// channel threads ([`Stack::light_load_streams`] tells which). Where the stack's
    /// channel threads are at least as many as the cores the process may run on, they
    /// cannot run beside the application and every hand-off to them is a context switch:
    /// then there is no bound (on the 2-core bed with 2 queues, 32 and 128 connections
    /// ran at 0.93-1.02 of kernel TCP's request rate so, against 0.70-0.95 with a bound
    /// of 8; `docs/performance.md`, "Channel threads without cores of their own").
    /// Otherwise [`DEFAULT_LIGHT_LOAD_STREAMS`], so that with cores to spare many busy
    /// streams leave the per-message work to the channel threads. Environment:
    /// `NETCHANNEL_LIGHT_LOAD_STREAMS`.
    ///
    /// ```
    /// use vns::stack::Stack;
    /// // Many short bursts on many streams: keep the channel threads' batching.
    /// let builder = Stack::builder().light_load_streams(0);
    /// # drop(builder);
    /// ```
    pub fn light_load_streams(mut self, streams: usize) -> Self {
        self.light_load_streams = Some(streams);
        self
    }

    /// Whether channels accept TCP segments with a Linux sender's partial checksum
    /// (`CHECKSUM_PARTIAL`, what a kernel peer with tx checksum offload on sends across a
    /// veth pair). Default [`PartialChecksums::Auto`](netdriver::channel::PartialChecksums):
    /// accepted on veth and netkit interfaces, where frames never leave the host; every
    /// checksum verified on any other interface. Environment:
    /// `NETCHANNEL_PARTIAL_CHECKSUMS=auto|accept|reject`.
    #[cfg(target_os = "linux")]
    pub fn partial_checksums(mut self, policy: netdriver::channel::PartialChecksums) -> Self {
        self.partial_checksums = Some(policy);
        self
    }

    /// Whether the channels answer SYNs with SYN cookies (RFC 4987) when a listener's
    /// backlog of half-open connections, or a queue's connection table, is full (default
    /// on): a spoofed-SYN flood at the channel port (or at a virtual listener's port) then
    /// keeps no state and does not lock new channels and plain-TCP clients out. What a
    /// connection opened from a cookie loses: window scaling, SACK and timestamps (a
    /// 64 KiB window at most); see `docs/security.md`, "SYN cookies". Off, SYNs past the
    /// backlog are dropped. Environment: `NETCHANNEL_SYN_COOKIES=0|1`
    /// (`netdriver::channel::ChannelSetConfig::syn_cookies`).
    #[cfg(target_os = "linux")]
    pub fn syn_cookies(mut self, on: bool) -> Self {
        self.syn_cookies = on;
        self
    }

    /// Adjusts the AF_XDP channel set's configuration before [`build`](Self::build)
    /// starts it (queues, link, TCP, queue limits, ...). It runs after the builder's own
    /// settings are applied (the liveness policy included), so it may override them;
    /// [`Stack::liveness`] reports what the channels got.
    #[cfg(target_os = "linux")]
    pub fn configure_channels(
        mut self,
        f: impl FnOnce(&mut netdriver::channel::ChannelSetConfig) + 'static,
    ) -> Self {
        self.tweak = Some(Box::new(f));
        self
    }

    /// Starts the stack on the interface's AF_XDP queues (needs privileges; run it in the
    /// network namespace of the interface).
    #[cfg(target_os = "linux")]
    pub fn build(mut self) -> Result<Stack, StackError> {
        let ifname = self
            .interface
            .take()
            .ok_or(StackError::Missing("interface"))?;
        let ipv4 = self.ipv4.ok_or(StackError::Missing("ipv4"))?;
        if let Some(b) = &self.busy_poll {
            if b.cores.is_empty() || b.spin.is_zero() {
                return Err(StackError::Invalid(
                    "busy_poll needs at least one core and a non-zero spin time",
                ));
            }
        }
        let cfg = self.channel_set_config(ifname.clone(), ipv4);
        // What the channels really run with, after `configure_channels`.
        self.liveness = Liveness::of_tcp(&cfg.tcp);
        let set = netdriver::channel::ChannelSet::start(cfg).map_err(|e| classify(e, &ifname))?;
        self.start(Arc::new(XdpBackend::new(set)))
    }

    /// The channel set's configuration: defaults, then the builder's settings (port,
    /// connect timeout, liveness: every channel, opened or accepted, plain-TCP ones
    /// included, gets this TCP configuration), then `configure_channels`.
    #[cfg(target_os = "linux")]
    fn channel_set_config(
        &mut self,
        ifname: String,
        ipv4: Ipv4Addr,
    ) -> netdriver::channel::ChannelSetConfig {
        let mut cfg = netdriver::channel::ChannelSetConfig::new(ifname, ipv4);
        cfg.channel_port = self.channel_port;
        cfg.connect_timeout = self.connect_timeout;
        if let Some(b) = &self.busy_poll {
            cfg.cores = Some(b.cores.clone());
            cfg.link.busy_poll = b.spin;
        }
        if let Some(n) = self.inline_tx {
            cfg.inline_tx = n;
        }
        if let Some(p) = self.partial_checksums {
            cfg.partial_checksums = p;
        }
        cfg.syn_cookies = self.syn_cookies;
        self.liveness.apply(&mut cfg.tcp);
        if let Some(f) = self.tweak.take() {
            f(&mut cfg);
        }
        cfg
    }

    /// Starts the stack on an in-memory network (no privileges).
    pub fn build_in_memory(self, net: &MemNetwork) -> Result<Stack, StackError> {
        let ipv4 = self.ipv4.ok_or(StackError::Missing("ipv4"))?;
        self.start(Arc::new(net.backend(ipv4)))
    }

    /// Starts the stack over any channel backend.
    pub fn build_with_backend(self, backend: Arc<dyn Backend>) -> Result<Stack, StackError> {
        self.start(backend)
    }

    fn start(self, backend: Arc<dyn Backend>) -> Result<Stack, StackError> {
        let vns = match self.vns {
            Some(c) => c,
            None if self.copy_workers > 0 => {
                copy_worker_buffers(self.copy_config.small_copy_threshold)
            }
            None => Config::default(),
        };
        let vns = match self.socket_buffers {
            Some((send, recv)) => with_socket_buffers(vns, send, recv),
            None => vns,
        };
        let copy = CopyPath::new(self.copy_workers, self.copy_config, &vns)?;
        if let Some(copy) = &copy {
            // The scheduler's third decision: which worker copies each piece of a large
            // copy. An instance of its own, so that copies never wait on a shard's lock.
            match self.scheduler.fork() {
                Some(mut picker) => copy.pool.set_picker(Box::new(move |request, workers| {
                    picker.pick_copy_worker(request, workers)
                })),
                None => debug!(
                    "the scheduler cannot be forked; copies are split evenly over the workers"
                ),
            }
        }
        vns.validate()?;
        let endpoints =
            shard_endpoints(&vns, self.scheduler, self.shards, self.latency_channels > 0)?;
        let acceptor = backend
            .listen(self.channel_port)
            .map_err(StackError::Channels)?;
        let channel_key = self.channel_key.map_err(|()| {
            StackError::Invalid("a channel key must be at least 16 bytes (vns::stack::MIN_KEY_LEN)")
        })?;
        if channel_key.is_none() {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "channels are unauthenticated: any process that reaches the channel port \
                     from a peer's address can join as one of its channels (set a channel \
                     key: StackBuilder::channel_key or NETCHANNEL_CHANNEL_KEY)"
                )
            });
        }
        let cores: Vec<usize> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.id)
            .collect();
        let channels = self.channels.unwrap_or_else(|| {
            // The cores the process may run on: its affinity mask and its cgroup's CPU
            // quota, whichever is smaller.
            let usable = std::thread::available_parallelism().map_or(1, usize::from);
            #[cfg(target_os = "linux")]
            let threads = backend.placement().is_some();
            #[cfg(not(target_os = "linux"))]
            let threads = false;
            auto_channels(threads, usable)
        });
        debug!(channels, "throughput channels per peer");
        let config = CoreConfig {
            channels,
            latency_channels: self.latency_channels,
            channel_port: self.channel_port,
            backlog: self.backlog,
            connect_timeout: self.connect_timeout,
            preamble_timeout: self.preamble_timeout,
            channel_key,
            #[cfg(target_os = "linux")]
            runtime_rx: self.runtime_rx,
            light_load_streams: self.light_load_streams,
            execute_plans: self.execute_plans,
            channel_thread_rx: self.channel_thread_rx,
            separate_classes: endpoints[0].scheduler_separates_classes(),
            cores,
        };
        let core = Arc::new(Core::new(endpoints, backend, config, acceptor));
        core.set_self();
        let bound = core.retune_light_load();
        debug!(bound, "light-load bound");
        let c = core.clone();
        let driver = std::thread::Builder::new()
            .name("vns-driver".into())
            .spawn(move || c.run())
            .map_err(StackError::Spawn)?;
        debug!(ipv4 = %core.backend.ipv4(), "stack started");
        Ok(Stack {
            inner: Arc::new(StackInner {
                core,
                driver: Mutex::new(Some(driver)),
                copy_workers: self.copy_workers,
                copy,
                liveness: self.liveness,
                linger: self.linger,
            }),
        })
    }
}

/// The default number of shards: the cores the building thread may run on, at most 16.
fn default_shards() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, 16)
}

/// One endpoint per shard, each with its share of the bounds and its own instance of the
/// scheduler; one shard when the scheduler cannot be forked. With `latency` (the stack
/// has latency channels), one more: the latency shard ([`crate::ShardOf`]), for the
/// latency-class sockets connected as such and the peer's.
fn shard_endpoints(
    vns: &Config,
    scheduler: Box<dyn NetScheduler>,
    shards: Option<usize>,
    latency: bool,
) -> Result<Vec<Endpoint>, StackError> {
    let latency_ports = if latency {
        crate::ShardOf::latency_ports_in(vns.ephemeral_ports)
    } else {
        None
    };
    let mut n = shards
        .unwrap_or_else(default_shards)
        .clamp(1, shard::MAX_SHARDS - usize::from(latency_ports.is_some()));
    // Every shard needs ephemeral ports of its own.
    let span = usize::from(vns.ephemeral_ports.1 - vns.ephemeral_ports.0) + 1;
    let latency_span = latency_ports.map_or(0, |(lo, hi)| usize::from(hi - lo) + 1);
    n = n.min(span - latency_span) + usize::from(latency_ports.is_some());
    let mut schedulers = vec![scheduler];
    while schedulers.len() < n {
        match schedulers[0].fork() {
            Some(s) => schedulers.push(s),
            None => {
                if shards.is_some_and(|s| s > 1) {
                    warn!("the scheduler cannot be forked (NetScheduler::fork); the stack runs one shard");
                } else {
                    debug!("the scheduler cannot be forked; one shard");
                }
                schedulers.truncate(1);
                n = 1;
                break;
            }
        }
    }
    // The latency shard takes a sixteenth of each bound (its share of the ports), the
    // others share the rest evenly: the configured bounds hold for the stack as a whole.
    let latency_index = latency_ports.filter(|_| n >= 2).map(|_| n - 1);
    let bulk = n - usize::from(latency_index.is_some());
    let share = |v: usize, min: usize, i: usize| {
        if Some(i) == latency_index {
            (v / 16).max(min)
        } else if latency_index.is_some() {
            ((v - v / 16) / bulk).max(min)
        } else {
            (v / n).max(min)
        }
    };
    schedulers
        .into_iter()
        .enumerate()
        .map(|(i, scheduler)| {
            let mut c = vns.clone();
            if n > 1 {
                c.channel_budget = share(vns.channel_budget, vns.max_chunk_payload, i);
                c.peer_budget = share(vns.peer_budget, c.channel_budget, i);
                c.max_peer_sockets = share(vns.max_peer_sockets, 1, i);
                c.max_sockets = share(vns.max_sockets, 1, i);
                c.rng_seed = vns.rng_seed.map(|s| s.wrapping_add(i as u64));
            }
            c.shard = crate::endpoint::ShardOf {
                index: i as u16,
                count: n as u16,
                // One shard alone owns everything (the scheduler could not be forked).
                latency_ports: latency_ports.filter(|_| n >= 2),
            };
            Endpoint::new(c, scheduler).map_err(StackError::from)
        })
        .collect()
}

/// `c` with these socket buffers, the credit window and its update threshold scaled with
/// the receive buffer (a socket's own buffers scale the same way, `Config::buffers`).
fn with_socket_buffers(c: Config, send: usize, recv: usize) -> Config {
    let b = c.buffers(&crate::endpoint::SocketOptions {
        send_buffer: Some(send),
        recv_buffer: Some(recv),
        ..Default::default()
    });
    Config {
        send_buffer: b.send,
        recv_buffer: b.recv,
        credit_window: b.window,
        credit_update_threshold: b.update_threshold,
        ..c
    }
}

/// The default virtual-socket configuration of a stack with copy workers: the default
/// socket buffers (256 KiB) are below the default small-copy threshold (512 KiB, where a
/// hand-off starts to pay), so the workers would never copy. Send and receive buffers of
/// four times the threshold let a large write or read be shared while the rest of the
/// buffer is in flight; the credit window is twice the receive buffer, as in the default.
fn copy_worker_buffers(threshold: usize) -> Config {
    let d = Config::default();
    let buffer = threshold
        .saturating_mul(4)
        .clamp(d.send_buffer.max(d.max_chunk_payload), 64 << 20);
    Config {
        send_buffer: buffer,
        recv_buffer: buffer,
        credit_window: 2 * buffer,
        credit_update_threshold: buffer / 2,
        ..d
    }
}

/// The copy workers of a stack and which transfers use them.
pub(crate) struct CopyPath {
    pub(crate) pool: CopyWorkerPool,
    /// Writes of at least this many bytes go through the workers (the pool's small-copy
    /// threshold); `None` when the send buffer could never take that much at once.
    pub(crate) write_min: Option<usize>,
    /// Reads into buffers of at least this many bytes copy out through the workers;
    /// `None` when the receive buffer could never hold that much.
    pub(crate) read_min: Option<usize>,
}

impl CopyPath {
    fn new(workers: usize, config: CopyConfig, vns: &Config) -> Result<Option<Self>, StackError> {
        if workers == 0 {
            return Ok(None);
        }
        vns.validate()?;
        let threshold = config.small_copy_threshold;
        let pool = CopyWorkerPool::new(CopyConfig {
            workers,
            chunk_size: vns.max_chunk_payload,
            headroom: HEADER_LEN,
            ..config
        })
        .map_err(StackError::CopyWorkers)?;
        let usable = |buffer: usize| (buffer >= threshold).then_some(threshold.max(1));
        let path = CopyPath {
            pool,
            write_min: usable(vns.send_buffer),
            read_min: usable(vns.recv_buffer),
        };
        if path.write_min.is_none() || path.read_min.is_none() {
            warn!(
                threshold,
                send_buffer = vns.send_buffer,
                recv_buffer = vns.recv_buffer,
                "copy workers: a socket buffer is smaller than the small-copy threshold, so \
                 the workers never copy in that direction (raise the buffers with \
                 vns_config or lower the threshold with copy_config)"
            );
        }
        Ok(Some(path))
    }
}

struct StackInner {
    core: Arc<Core>,
    driver: Mutex<Option<JoinHandle<()>>>,
    copy_workers: usize,
    /// Dropped after the driver is joined (field order), which joins the workers.
    copy: Option<CopyPath>,
    liveness: Liveness,
    /// How long the drop of the last handle lets the stack drain ([`StackBuilder::linger`]).
    linger: Duration,
}

impl StackInner {
    /// Stops the driver now (every channel aborted) and waits for its thread.
    fn stop(&self) {
        self.core.signal.stop();
        self.join();
    }

    /// Waits for the driver thread (it has stopped, or is about to).
    fn join(&self) {
        let handle = self.driver.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for StackInner {
    /// With a linger time and bytes not yet delivered, the driver thread drains them in
    /// the background and stops by itself (detached); otherwise it stops now.
    fn drop(&mut self) {
        if self.linger.is_zero() || self.core.nothing_pending() {
            self.stop();
            return;
        }
        debug!(linger = ?self.linger, "last handle dropped with bytes undelivered; draining in the background");
        self.core.begin_stop(self.linger);
        drop(
            self.driver
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
    }
}

/// The default [`StackBuilder::linger`]: long enough for the last replies of a
/// datacenter service to be acknowledged many times over (a few round trips, a
/// retransmission or two), short enough that a peer which stopped reading does not hold
/// the stack's threads (and, on AF_XDP, its XDP program) for long after it was dropped.
pub const DEFAULT_LINGER: Duration = Duration::from_secs(5);

/// The [`StackBuilder::light_load_streams`] a stack takes by default where its channel
/// threads have cores to spare (fewer threads than cores).
pub const DEFAULT_LIGHT_LOAD_STREAMS: usize = 8;

/// The [`StackBuilder::channels`] a stack takes by default on hosts with cores to spare
/// (and on backends without channel threads).
pub const DEFAULT_CHANNELS: usize = 4;

/// The throughput channels per peer a stack opens when its user sets none
/// ([`StackBuilder::channels`]): one where it has channel threads (`threads`) and the
/// process may run on fewer than 4 `cores`, [`DEFAULT_CHANNELS`] otherwise.
pub(crate) fn auto_channels(threads: bool, cores: usize) -> usize {
    if threads && cores < 4 {
        1
    } else {
        DEFAULT_CHANNELS
    }
}

/// A host's virtual-socket stack: an [`Endpoint`] over channels to other
/// hosts, driven by its own thread. Cheap to clone (a handle); streams and listeners keep
/// it alive. [`Stack::shutdown_graceful`] stops it after delivering what its streams
/// hold, [`Stack::abort`] at once; dropping the last handle drains in the background for
/// at most [`StackBuilder::linger`], then stops.
#[derive(Clone)]
pub struct Stack {
    inner: Arc<StackInner>,
}

impl fmt::Debug for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stack")
            .field("ipv4", &self.ipv4())
            .finish_non_exhaustive()
    }
}

impl Stack {
    /// A builder with the defaults: 4 throughput and 1 latency channel per peer, channel
    /// port 9000, round-robin scheduling, no copy workers, backlog 128, 10 s connect
    /// timeout, channel keep-alive after 10 s idle (5 probes 1 s apart) and a 30 s user
    /// timeout ([`Liveness`]).
    pub fn builder() -> StackBuilder {
        StackBuilder::default()
    }

    /// Two stacks, 10.0.0.1 and 10.0.0.2, on a fresh in-memory network with `channels`
    /// throughput channels per peer (for tests and examples).
    pub fn pair_in_memory(channels: usize) -> Result<(Stack, Stack), StackError> {
        let net = MemNetwork::new();
        let a = Stack::builder()
            .ipv4(Ipv4Addr::new(10, 0, 0, 1))
            .channels(channels)
            .build_in_memory(&net)?;
        let b = Stack::builder()
            .ipv4(Ipv4Addr::new(10, 0, 0, 2))
            .channels(channels)
            .build_in_memory(&net)?;
        Ok((a, b))
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.inner.core
    }

    /// How many times channel threads read this stack's channels themselves, right
    /// after queueing what they received ([`StackBuilder::channel_thread_rx`]); 0 with it
    /// off or without AF_XDP channels.
    pub fn channel_thread_pulls(&self) -> u64 {
        self.core()
            .channel_thread_pulls
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Streams that read or wrote bytes within the last few milliseconds (the count
    /// [`StackBuilder::light_load_streams`] compares with).
    pub fn active_streams(&self) -> usize {
        self.core().load.active_streams()
    }

    /// Whether every stream takes the latency-class per-message path now
    /// ([`StackBuilder::light_load_streams`]).
    pub fn lightly_loaded(&self) -> bool {
        self.core().load.is_light()
    }

    /// Changes [`StackBuilder::light_load_streams`] while the stack runs (for A/B
    /// measurements); the bound no longer follows the host.
    pub fn set_light_load_streams(&self, streams: usize) {
        self.core().load.set_max(streams);
    }

    /// The light-load bound in force ([`StackBuilder::light_load_streams`]): the user's,
    /// or the one chosen from the host; `usize::MAX` when every stream takes the
    /// latency-class path whatever the load.
    pub fn light_load_streams(&self) -> usize {
        self.core().load.max()
    }

    /// The throughput channels the stack opens to each peer: the user's
    /// ([`StackBuilder::channels`]) or the one chosen from the host.
    pub fn channels_per_peer(&self) -> usize {
        self.core().config.channels
    }

    /// Queue rounds that tasks waiting to read ran in their runtime so far
    /// (run-to-completion receive, [`StackBuilder::runtime_rx`]); 0 without it.
    pub fn runtime_rx_rounds(&self) -> u64 {
        #[cfg(target_os = "linux")]
        if let Some(rt) = &self.core().rt_rx {
            return rt.rounds();
        }
        0
    }

    /// Times a task waiting to read found a NIC queue's round held by another thread
    /// (the channel thread, or another task) and asked that thread to run one more
    /// rather than try again itself (run-to-completion receive); 0 without it.
    pub fn runtime_rx_asks(&self) -> u64 {
        #[cfg(target_os = "linux")]
        if let Some(rt) = &self.core().rt_rx {
            return rt.asked();
        }
        0
    }

    /// Of [`runtime_rx_rounds`](Self::runtime_rx_rounds), the rounds a reading task ran
    /// before it looked for its bytes: woken for an arrival still in a queue's ring, it
    /// runs that round first, then takes the bytes and finds them at its first look
    /// (run-to-completion receive); 0 without it.
    pub fn runtime_rx_rounds_first(&self) -> u64 {
        #[cfg(target_os = "linux")]
        if let Some(rt) = &self.core().rt_rx {
            return rt.rounds_first();
        }
        0
    }

    /// The NIC queues whose arrivals a task waiting to read a latency-class socket
    /// (`latency_class`), or any other socket, processes in its runtime (run-to-completion
    /// receive, [`StackBuilder::runtime_rx`]); empty without it. Every queue, unless the
    /// scheduler keeps the classes on queues of their own
    /// ([`NetScheduler::separate_class_threads`],
    /// `Isolating`): then a latency-class socket's task serves the latency channels'
    /// queues only and the others the rest, so that a latency application's thread never
    /// processes bulk arrivals.
    pub fn runtime_rx_queues(&self, latency_class: bool) -> Vec<u32> {
        #[cfg(target_os = "linux")]
        if let Some(rt) = &self.core().rt_rx {
            return rt.queues_served(latency_class);
        }
        let _ = latency_class;
        Vec::new()
    }

    /// For diagnosis: the NIC queues whose AF_XDP socket a tokio runtime registered for
    /// run-to-completion receive ([`StackBuilder::runtime_rx`]), each with the name of the
    /// thread that registered it. A queue is registered by the first task that waits on
    /// it, so where the scheduler keeps the classes on queues of their own (`Isolating`),
    /// a latency application's runtime registers only the latency channels' queues (see
    /// [`Stack::runtime_rx_queues`]). Empty without AF_XDP queues.
    pub fn runtime_rx_registrations(&self) -> Vec<(u32, Option<String>)> {
        #[cfg(target_os = "linux")]
        if let Some(rt) = &self.core().rt_rx {
            return rt.registrations();
        }
        Vec::new()
    }

    /// Changes which tasks use run-to-completion receive ([`StackBuilder::runtime_rx`])
    /// while the stack runs (for A/B measurements); returns whether the stack can use it
    /// at all (it needs AF_XDP queues).
    #[cfg(target_os = "linux")]
    pub fn set_runtime_rx(&self, mode: RuntimeRx) -> bool {
        match &self.core().rt_rx {
            Some(rt) => {
                rt.set_mode(mode);
                true
            }
            None => false,
        }
    }

    /// The stack's address.
    pub fn ipv4(&self) -> Ipv4Addr {
        self.inner.core.backend.ipv4()
    }

    /// The configured number of copy workers.
    pub fn copy_workers(&self) -> usize {
        self.inner.copy_workers
    }

    /// Counters of the copy workers and of their chunk buffer pool; all zero without
    /// workers (then the application thread copies everything on the plain path).
    pub fn copy_stats(&self) -> CopyStats {
        self.inner
            .copy
            .as_ref()
            .map(|c| c.pool.stats())
            .unwrap_or_default()
    }

    /// OS thread ids of the copy workers (Linux), for inspection: they are gone once
    /// the stack's last handle is dropped.
    pub fn copy_worker_tids(&self) -> Vec<u64> {
        self.inner
            .copy
            .as_ref()
            .map(|c| c.pool.worker_tids().into_iter().map(|(_, t)| t).collect())
            .unwrap_or_default()
    }

    pub(crate) fn copy_path(&self) -> Option<&CopyPath> {
        self.inner.copy.as_ref()
    }

    /// The liveness policy of the stack's channels: keep-alive and user timeout as
    /// configured with [`StackBuilder::keepalive`] and friends (or as
    /// [`StackBuilder::configure_channels`] left them). In-memory channels have no TCP
    /// beneath them: there it is only what was asked for.
    pub fn liveness(&self) -> Liveness {
        self.inner.liveness
    }

    /// Channels accepted on the channel port and aborted before they joined: no preamble
    /// within [`StackBuilder::preamble_timeout`], too many waiting at once, or a bad
    /// preamble (a peer that opens channels and never speaks, or speaks garbage).
    pub fn dropped_channels(&self) -> u64 {
        self.core().ctl().dropped_channels
    }

    /// Channels accepted on the channel port that failed authentication: no proof of the
    /// key when this stack has one ([`StackBuilder::channel_key`]), a wrong proof, or a
    /// request to authenticate when it has none. Also counted in
    /// [`Stack::dropped_channels`].
    pub fn auth_failures(&self) -> u64 {
        self.core().ctl().auth_failures
    }

    /// Hostile or broken input the stack's endpoint refused or cut short (SYNCs past the
    /// socket bounds, closed sockets whose peer never sent its FIN, ...).
    pub fn endpoint_counters(&self) -> crate::EndpointCounters {
        let mut c = crate::EndpointCounters::default();
        self.core().each_shard(|_, s| c.add(&s.ep.counters()));
        c
    }

    /// Streams dropped (or closed) that are still finishing inside the stack: their
    /// unsent bytes and FIN leaving, or the peer's FIN on its way. Each goes when both
    /// directions are finished, or is reset after [`crate::Config::linger_timeout`]
    /// (counted in [`crate::EndpointCounters::linger_expired`]).
    pub fn lingering_sockets(&self) -> usize {
        let mut n = 0;
        self.core().each_shard(|_, s| n += s.ep.lingering_sockets());
        n
    }

    /// Plain-TCP streams dropped (or closed) whose connections are still finishing:
    /// their bytes and FIN unacknowledged, or the peer's FIN not yet in.
    pub fn closing_plain_streams(&self) -> usize {
        self.core().ctl().closing_plain()
    }

    /// Plain-TCP streams closed gracefully whose connections were reset because they
    /// did not finish within [`crate::Config::linger_timeout`].
    pub fn plain_linger_expired(&self) -> u64 {
        self.core().ctl().plain_linger_expired
    }

    /// Channels the stack holds now (to all peers).
    pub fn channel_count(&self) -> usize {
        self.core().channel_count()
    }

    /// Fault injection, for tests and failure drills: resets the `n`-th channel the stack
    /// holds (in the order they were opened) as a failed connection. Its TCP connection is
    /// aborted (the peer receives a RST) and nothing is lost: the chunks its sockets had
    /// on it go again on the peer's other channels (the data-level acknowledgement,
    /// `docs/wire-format.md`), or on channels opened again when it was the last one.
    /// Returns `false` when the stack holds fewer than `n + 1` channels.
    ///
    /// ```no_run
    /// # async fn f(stack: vns::Stack) {
    /// assert!(stack.reset_channel(0));
    /// // Streams carry on; the counters show what went again.
    /// let c = stack.endpoint_counters();
    /// println!("resent {} chunks", c.resent_chunks);
    /// # }
    /// ```
    pub fn reset_channel(&self, n: usize) -> bool {
        self.core().reset_channel(n)
    }

    /// Diagnostics and fault-injection tests: each channel's connection on the wire
    /// (4-tuple, NIC queue, RCV.NXT and SND.NXT as its thread last published them), in
    /// the order [`Stack::reset_channel`] counts the channels; `None` for a channel with
    /// no TCP connection beneath it (in-memory). A test that forges a RST for a channel
    /// reads RCV.NXT here, since a RST is accepted only at exactly RCV.NXT (RFC 5961).
    pub fn channel_wire(&self) -> Vec<Option<netdriver::channel::ChannelWire>> {
        self.core()
            .chans
            .load()
            .values()
            .map(|c| c.t.wire())
            .collect()
    }

    /// Channel connections this stack lost to a RST received from the wire (one at
    /// exactly RCV.NXT, RFC 5961), over its whole life; always 0 for in-memory stacks.
    /// Channels this stack resets itself ([`Stack::reset_channel`]) are not counted.
    pub fn channel_resets_received(&self) -> u64 {
        self.core().backend.resets_received()
    }

    /// Each channel thread (by NIC queue) since the stack started: its core, its busy
    /// time, and what the kernel dropped at its AF_XDP socket because the thread did not
    /// keep up (rx ring full, fill ring empty). Cumulative, unlike the per-period view in
    /// [`Stack::stats`]; empty for in-memory stacks.
    #[cfg(target_os = "linux")]
    pub fn queue_threads(&self) -> Vec<netdriver::channel::QueueThreadStats> {
        self.core().backend.thread_stats()
    }

    /// Which channel thread serves which NIC queue, on which core, and each thread's
    /// busy time since it started (netdriver's `ChannelSet::placement`; printable and
    /// serialisable). Plans change it (`PlanAction::SpawnThread`, `RetireThread`,
    /// `AssignQueue`); [`Stack::stats`] shows the same in the scheduler's terms. `None`
    /// for in-memory stacks.
    #[cfg(target_os = "linux")]
    pub fn channel_placement(&self) -> Option<netdriver::channel::ChannelPlacement> {
        self.core().backend.placement()
    }

    /// Fault injection, for tests and failure drills: the channel thread of NIC queue
    /// `queue` dies as if it had crashed (with every queue it serves). This stack sees the channels on that queue as
    /// lost at once (their chunks go again on the other channels, as with
    /// [`Stack::reset_channel`]), but nothing goes on the wire, no FIN and no RST: the
    /// peer notices only through its keep-alive or user timeout
    /// ([`StackBuilder::keepalive`], [`StackBuilder::user_timeout`]). The queue is served
    /// by nobody afterwards, not even inline by [`RuntimeRx`] tasks; new channels use the
    /// other queues. Returns `false` when no thread runs `queue` (or it is dead already,
    /// or the stack has no NIC queues: in-memory).
    pub fn kill_queue_thread(&self, queue: u32) -> bool {
        let killed = self.core().backend.kill_queue_thread(queue);
        if killed {
            // The channels' failure wakes their readers; the driver also looks now.
            self.core().signal.notify();
        }
        killed
    }

    /// Fault injection, for tests and drills: holds NIC queue `queue`'s round (the lock
    /// its channel thread and inline rounds take) from another thread until the returned
    /// hold is dropped, as an application thread preempted in the middle of an inline
    /// round would. A task that finds the round held meanwhile asks the holder for one
    /// more round rather than try again at once ([`Stack::runtime_rx_asks`]); the hold
    /// hands that round to the channel thread when dropped. `None` without NIC queues
    /// (in-memory) or for an unknown queue.
    #[cfg(target_os = "linux")]
    pub fn hold_queue_round(&self, queue: u32) -> Option<netdriver::channel::RoundHold> {
        self.core().backend.hold_queue_round(queue)
    }

    /// A statistics snapshot of the stack, as its scheduler's
    /// [`plan`](netsched::NetScheduler::plan) sees it; serialisable with serde (to JSON,
    /// say) for logs and tools.
    ///
    /// - `channels`: every channel to every peer, with the loads the channels last
    ///   reported (refreshed whenever the stack moves chunks into a channel): queued and
    ///   in-flight bytes, congestion window, smoothed RTT, retransmitted segments and
    ///   payload bytes sent. In-memory channels have no TCP: their `cwnd_bytes` is 0 and
    ///   `srtt` `None`. `queue`: the NIC queue the channel's connection lives on; `thread`:
    ///   the channel thread that serves that queue (both `None` for in-memory channels).
    /// - `flows`: every virtual socket with its class and unsent bytes;
    ///   `recent_rate_bps` is 0 (not measured yet).
    /// - `copy_workers`: each worker with its core and the bytes of copies placed on it and
    ///   not finished.
    /// - `threads`: each live channel thread with its core, its busy time and the frames
    ///   the kernel dropped for its queues over the last plan period
    ///   ([`StackBuilder::execute_plans`]; a zero window before the first period, with
    ///   plans off, and for a thread started since; empty for in-memory stacks); `queues`:
    ///   which thread serves each NIC queue, as of now (the placement); `cores`: the cores
    ///   the thread that built the stack was allowed to run on.
    pub fn stats(&self) -> netsched::StackSnapshot {
        let core = self.core();
        let mut snapshot = {
            let mut first = core.lock_shard(0);
            first.refresh_loads(&core.chans.load());
            first.ep.scheduler_snapshot()
        };
        // The channels' queues as every shard sees them: shard 0's loads (the channel
        // layer's queue and TCP) plus what the other shards hold for them; every
        // shard's sockets.
        for i in 1..core.shard_count() {
            let s = core.lock_shard(i);
            for c in &mut snapshot.channels {
                c.queued_bytes += s.ep.channel_outbox_bytes(c.id) as u64;
            }
            snapshot.flows.extend(s.ep.scheduler_snapshot().flows);
        }
        let threads = core.ctl().plans.threads.clone();
        core.place(&mut snapshot, &threads);
        if let Some(copy) = &self.inner.copy {
            snapshot.copy_workers = copy.pool.worker_stats();
        }
        snapshot
    }

    /// What the stack's scheduler plans over [`Stack::stats`] now: channels it wants
    /// opened or closed and where it wants them to run. The driver carries plans out
    /// itself every plan period ([`StackBuilder::execute_plans`]); this only shows one,
    /// and calling it advances the policy's own state (streaks, cooldowns) as one plan
    /// period would.
    pub fn scheduler_plan(&self) -> Vec<netsched::PlanAction> {
        let snapshot = self.stats();
        self.core().lock_shard(0).ep.scheduler_plan(&snapshot)
    }

    /// What the driver did with the scheduler's plans so far: plans asked for, channels
    /// opened and retired, actions refused ([`StackBuilder::execute_plans`]).
    pub fn plan_counters(&self) -> PlanCounters {
        self.core().ctl().plans.counters
    }

    /// Bytes written to this stack's streams that have not reached their peers yet:
    /// unsent bytes of open and gracefully closed sockets (a pending FIN counts one), and
    /// bytes queued on its channels or sent and not yet acknowledged, plain-TCP
    /// connections closed gracefully included. [`Stack::abort`] loses these;
    /// [`Stack::shutdown_graceful`] and dropping the last handle deliver them first.
    /// To wait for 0, await [`Stack::drained`] rather than poll this. The channels' parts
    /// are snapshots their threads publish after each poll: a reading may miss bytes in
    /// the instant a thread moves them (`drained` confirms a 0 with a second reading).
    pub fn pending_tx_bytes(&self) -> usize {
        self.core().pending_tx_bytes()
    }

    /// Listens on virtual port `addr.port()` (0: any free port) with the stack's backlog.
    /// The address must be the stack's, unspecified, or on the loopback network.
    ///
    /// Connections that stay on this host arrive through the kernel's loopback interface
    /// (see [`Stack::connect`]):
    /// - `127.x.y.z`: the listener is the kernel's on that address only (no virtual
    ///   port), and binding fails as the kernel's `bind` would;
    /// - `0.0.0.0` or the stack's address: a virtual port, and also the kernel's
    ///   `127.0.0.1` on the same port when that is free (with port 0, a port free in
    ///   both is chosen). When the kernel's port is taken (another process, or another
    ///   stack in this one), the listener serves only virtual sockets, as logged.
    pub async fn bind(&self, addr: SocketAddr) -> io::Result<VirtualListener> {
        self.bind_with_backlog(addr, self.core().config.backlog)
            .await
    }

    /// [`bind`](Self::bind) with an explicit backlog.
    pub async fn bind_with_backlog(
        &self,
        addr: SocketAddr,
        backlog: usize,
    ) -> io::Result<VirtualListener> {
        self.listen_now(addr, backlog)
    }

    /// A socket to set options on before it connects or listens (the stack's
    /// `tokio::net::TcpSocket`; see [`VirtualSocket`]).
    pub fn socket(&self) -> VirtualSocket {
        VirtualSocket::new(self.clone())
    }

    /// [`Stack::bind_with_backlog`], which never waits.
    pub(crate) fn listen_now(
        &self,
        addr: SocketAddr,
        backlog: usize,
    ) -> io::Result<VirtualListener> {
        let ip = match addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() || ip == self.ipv4() || ip.is_loopback() => ip,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrNotAvailable,
                    format!(
                        "{addr} is not this stack's address {}, 0.0.0.0 or a loopback address",
                        self.ipv4()
                    ),
                ))
            }
        };
        let core = self.core();
        if core.refuses_new() {
            return Err(driver::stopped_error());
        }
        if ip.is_loopback() && ip != self.ipv4() {
            let kernel = loopback::LoopbackListener::bind(SocketAddrV4::new(ip, addr.port()))?;
            let port = kernel.port()?;
            return Ok(VirtualListener::loopback_only(
                self.clone(),
                ip,
                port,
                kernel,
            ));
        }
        let mut kernel = None;
        let port = if addr.port() != 0 {
            self.bind_shards(addr.port(), backlog)?;
            kernel = Self::bind_loopback_beside(addr.port(), false);
            addr.port()
        } else {
            // A port free both as a virtual port and on the kernel's loopback; failing
            // that, any free virtual port.
            let free = |need_kernel: bool, kernel: &mut Option<_>| {
                (32768..=60999u16)
                    .filter(|&p| p != core.config.channel_port)
                    .find(|&p| {
                        if self.bind_shards(p, backlog).is_err() {
                            return false;
                        }
                        *kernel = Self::bind_loopback_beside(p, need_kernel);
                        if need_kernel && kernel.is_none() {
                            core.each_shard(|_, s| {
                                let _ = s.ep.unbind(p);
                            });
                            return false;
                        }
                        true
                    })
            };
            free(true, &mut kernel)
                .or_else(|| free(false, &mut kernel))
                .ok_or(Error::PortsExhausted)?
        };
        // Plain-TCP peers connect to the same port.
        let plain = match core.backend.listen(port) {
            Ok(a) => Some(a),
            Err(e) => {
                core.each_shard(|_, s| {
                    let _ = s.ep.unbind(port);
                });
                return Err(e.into());
            }
        };
        Ok(VirtualListener::new(self.clone(), ip, port, plain, kernel))
    }

    /// The kernel's `127.0.0.1:port` for a listener bound to `0.0.0.0` or the stack's
    /// address: `None` when it is taken (logged unless `quiet`, a port-0 search).
    fn bind_loopback_beside(port: u16, quiet: bool) -> Option<loopback::LoopbackListener> {
        match loopback::LoopbackListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)) {
            Ok(l) => Some(l),
            Err(e) => {
                if !quiet {
                    tracing::info!(port, error = %e, "no loopback listener beside the virtual port; connections from this host to it are refused");
                }
                None
            }
        }
    }

    /// Listens on `port` in every shard (a SYNC goes to the shard its ports map to), with
    /// one backlog shared by all; undone if a shard refuses.
    fn bind_shards(&self, port: u16, backlog: usize) -> Result<(), Error> {
        let core = self.core();
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut bound = 0;
        let mut failed = None;
        core.each_shard(|i, s| {
            if failed.is_none() {
                match s.ep.bind_shared(port, backlog, queued.clone()) {
                    Ok(()) => bound = i + 1,
                    Err(e) => failed = Some(e),
                }
            }
        });
        match failed {
            None => Ok(()),
            Some(e) => {
                core.each_shard(|i, s| {
                    if i < bound {
                        let _ = s.ep.unbind(port);
                    }
                });
                Err(e)
            }
        }
    }

    /// The latency shard's index (the last shard), where the stack has latency channels:
    /// the shard of latency-class sockets connected as such ([`VirtualSocket::set_app_class`])
    /// and of the peer's (see [`crate::ShardOf`]).
    pub fn latency_shard(&self) -> Option<usize> {
        self.core().latency_shard()
    }

    /// The shards the stack splits its virtual sockets over ([`StackBuilder::shards`]).
    pub fn shards(&self) -> usize {
        self.core().shard_count()
    }

    /// Opens a virtual socket to `addr`: on first use of the host, opens the stack's
    /// channels to its channel port, then the SYNC/SYNC_ACK handshake over them. Fails
    /// with `ConnectionRefused` when nothing listens there, `TimedOut` after the connect
    /// timeout.
    ///
    /// An address on this host (`127.0.0.0/8`, or the stack's own address) never reaches
    /// a NIC queue: such a stream is plain TCP over the kernel's loopback interface
    /// ([`VirtualStream::is_loopback`]), to the kernel's `127.x.y.z` (the stack's own
    /// address is dialled as `127.0.0.1`) and the same port, where a
    /// [`VirtualListener`] of this process (bound to `0.0.0.0`, a loopback address or
    /// the stack's address) accepts it.
    ///
    /// ```no_run
    /// # async fn demo(stack: vns::stack::Stack) -> std::io::Result<()> {
    /// let listener = stack.bind("0.0.0.0:7000".parse().unwrap()).await?;
    /// let own = std::net::SocketAddr::from((stack.ipv4(), 7000));
    /// let client = stack.connect(own).await?;
    /// let (server, _) = listener.accept().await?;
    /// assert!(client.is_loopback() && server.is_loopback());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(&self, addr: SocketAddr) -> io::Result<VirtualStream> {
        let SocketAddr::V4(v4) = addr else {
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                "virtual sockets are IPv4 only",
            ));
        };
        if loopback::is_local(*v4.ip(), self.ipv4()) {
            if self.core().refuses_new() {
                return Err(driver::stopped_error());
            }
            let inner = loopback::connect(v4, self.ipv4()).await?;
            return Ok(VirtualStream::loopback(inner));
        }
        stream::connect(self, v4).await
    }

    /// Stops the driver now: every channel is aborted, and the stack's streams and
    /// listeners fail; what they have not delivered is lost. Other handles stay valid but
    /// unusable. This is what dropping the last handle does with
    /// [`StackBuilder::linger`] zero; [`Stack::shutdown_graceful`] delivers first.
    pub fn abort(&self) {
        self.inner.stop();
    }

    /// The old name of [`Stack::abort`] (stops at once, losing what is undelivered).
    #[deprecated(
        note = "use `abort()` (at once) or `shutdown_graceful(linger).await` (delivers first)"
    )]
    pub fn shutdown(&self) {
        self.abort();
    }

    /// Stops the stack gracefully, as a process exit closes its TCP sockets: new
    /// channels, connects, binds and accepts are refused at once (listeners stop
    /// listening; connections they had queued are reset), and the write side of every
    /// open stream is shut (its FIN follows its bytes; reads go on working). Then every
    /// stream, open or dropped and lingering, delivers what it has not yet delivered
    /// ([`Stack::pending_tx_bytes`] reaches 0), the channels are closed (a FIN after
    /// their bytes, so that each peer reads everything they hold) and the driver stops
    /// once each peer has seen the end of its channels. A peer's streams whose whole
    /// incoming stream was delivered keep their bytes and end of stream when the
    /// channels go.
    ///
    /// At most `linger` after the call, whatever is left is aborted, as by
    /// [`Stack::abort`]: then this returns `TimedOut`. `NotConnected` when the stack was
    /// aborted before (or meanwhile). `Duration::ZERO` aborts at once. The stack's
    /// handles stay valid but unusable afterwards.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// use vns::stack::Stack;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let (a, b) = Stack::pair_in_memory(2)?;
    /// let listener = b.bind("10.0.0.2:7000".parse().unwrap()).await?;
    /// let mut client = a.connect("10.0.0.2:7000".parse().unwrap()).await?;
    /// let (mut server, _) = listener.accept().await?;
    ///
    /// let reader = tokio::spawn(async move {
    ///     let mut got = Vec::new();
    ///     client.read_to_end(&mut got).await.map(|_| got.len())
    /// });
    /// // The last reply is written and the stream dropped: it is not all delivered yet.
    /// server.write_all(&[7u8; 1 << 20]).await?;
    /// drop(server);
    /// // Stopping b gracefully delivers it all, then closes.
    /// b.shutdown_graceful(Duration::from_secs(5)).await?;
    /// assert_eq!(reader.await.unwrap()?, 1 << 20);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn shutdown_graceful(&self, linger: Duration) -> io::Result<()> {
        let core = self.core();
        if linger.is_zero() {
            self.abort();
        } else {
            core.begin_stop(linger);
            Wait::new(core.clone(), driver::Goal::Stopped).await;
            self.inner.join();
        }
        let outcome = core.ctl().stop_outcome;
        match outcome {
            Some(driver::StopOutcome::Drained) => Ok(()),
            Some(driver::StopOutcome::Expired { pending }) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the stack did not finish within its linger time ({linger:?}); \
                     {pending} byte(s) undelivered were aborted"
                ),
            )),
            Some(driver::StopOutcome::Aborted) | None => Err(driver::stopped_error()),
        }
    }

    /// Resolves once everything written to this stack's streams has been delivered:
    /// [`Stack::pending_tx_bytes`] read 0 twice, a couple of milliseconds apart (channel
    /// figures are snapshots). The stack's driver reads the figure after each of its
    /// rounds and on a short timer while the future waits (the channels' TCP does not
    /// report acknowledgements): no polling by the caller. Resolves at once when the
    /// stack has stopped (then what is left is lost). Bound the wait with
    /// `tokio::time::timeout`; writes meanwhile make it wait for them too.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// use vns::stack::Stack;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let (a, b) = Stack::pair_in_memory(2)?;
    /// let listener = b.bind("10.0.0.2:7000".parse().unwrap()).await?;
    /// let mut client = a.connect("10.0.0.2:7000".parse().unwrap()).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// client.write_all(b"last words").await?;
    /// drop(client); // lingers inside the stack until delivered
    /// tokio::time::timeout(Duration::from_secs(5), a.drained()).await?;
    /// assert_eq!(a.pending_tx_bytes(), 0);
    /// let mut got = Vec::new();
    /// server.read_to_end(&mut got).await?;
    /// assert_eq!(got, b"last words");
    /// # Ok(())
    /// # }
    /// ```
    pub fn drained(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        Wait::new(self.core().clone(), driver::Goal::Drained)
    }

    /// Resolves once the stack holds no channel (its NetChannel peers have closed theirs,
    /// or they were lost), or has stopped: what a server waits for before it stops when
    /// its peers read its last bytes from their channels and then close them. Woken by
    /// the driver when a channel goes; no polling.
    pub fn channels_closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        Wait::new(self.core().clone(), driver::Goal::NoChannels)
    }

    /// Resolves once the stack holds exactly `n` channels ([`Stack::channel_count`]),
    /// or has stopped: for watching run-time scaling ([`StackBuilder::execute_plans`]).
    /// Woken by the driver's round after channels come and go; no polling.
    pub fn channels_reach(
        &self,
        n: usize,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        Wait::new(self.core().clone(), driver::Goal::Channels(n))
    }

    /// Resolves once the driver has asked the scheduler for at least `k` plans in all
    /// ([`PlanCounters::plans`]) and carried them out, or the stack has stopped. Woken by
    /// the driver's round; no polling.
    pub fn plans_reach(&self, k: u64) -> impl std::future::Future<Output = ()> + Send + 'static {
        Wait::new(self.core().clone(), driver::Goal::Plans(k))
    }
}

/// A wait for a [`driver::Goal`], woken by the driver.
struct Wait {
    core: Arc<Core>,
    goal: driver::Goal,
    id: Option<u64>,
}

impl Wait {
    fn new(core: Arc<Core>, goal: driver::Goal) -> Wait {
        Wait {
            core,
            goal,
            id: None,
        }
    }
}

impl std::future::Future for Wait {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let this = &mut *self;
        this.core.poll_wait(this.goal, &mut this.id, cx)
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.core.cancel_wait(id);
        }
    }
}

static DEFAULT_STACK: Mutex<Option<Stack>> = Mutex::new(None);

/// Installs the process's default stack, used by [`VirtualStream::connect`] and
/// [`VirtualListener::bind`]; returns the previous one.
pub fn set_default_stack(stack: Stack) -> Option<Stack> {
    DEFAULT_STACK
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .replace(stack)
}

/// Removes the process's default stack (it stops once its other handles are gone).
pub fn clear_default_stack() -> Option<Stack> {
    DEFAULT_STACK
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
}

/// The process's default stack: the installed one ([`set_default_stack`]), or else one
/// built (and installed) from the environment. Every builder option that is a number, a
/// switch or a string can be set there; the scheduler, `copy_config` and `vns_config`
/// (structures) only through [`set_default_stack`]. A variable that does not parse fails
/// with [`StackError::Env`] naming it and saying what it expects.
///
/// | variable | builder option |
/// |---|---|
/// | `NETCHANNEL_INTERFACE` (required) | [`StackBuilder::interface`] |
/// | `NETCHANNEL_IPV4` (required) | [`StackBuilder::ipv4`] |
/// | `NETCHANNEL_CHANNELS` | [`StackBuilder::channels`] |
/// | `NETCHANNEL_LATENCY_CHANNELS` | [`StackBuilder::latency_channels`] |
/// | `NETCHANNEL_COPY_WORKERS` | [`StackBuilder::copy_workers`] |
/// | `NETCHANNEL_CHANNEL_PORT` | [`StackBuilder::channel_port`] |
/// | `NETCHANNEL_BACKLOG` | [`StackBuilder::backlog`] |
/// | `NETCHANNEL_SEND_BUFFER`, `NETCHANNEL_RECV_BUFFER` (bytes) | [`StackBuilder::socket_buffers`] |
/// | `NETCHANNEL_SCHEDULER` (`round-robin`, `source-port`, `isolating`) | [`StackBuilder::scheduler`] |
/// | `NETCHANNEL_EXECUTE_PLANS` (`0`, `1`) | [`StackBuilder::execute_plans`] |
/// | `NETCHANNEL_SHARDS` | [`StackBuilder::shards`] |
/// | `NETCHANNEL_CONNECT_TIMEOUT_MS` | [`StackBuilder::connect_timeout`] |
/// | `NETCHANNEL_PREAMBLE_TIMEOUT_MS` | [`StackBuilder::preamble_timeout`] |
/// | `NETCHANNEL_KEEPALIVE_MS` (0: off) | [`StackBuilder::keepalive`] |
/// | `NETCHANNEL_KEEPALIVE_INTERVAL_MS` | [`StackBuilder::keepalive_interval`] |
/// | `NETCHANNEL_KEEPALIVE_PROBES` | [`StackBuilder::keepalive_probes`] |
/// | `NETCHANNEL_USER_TIMEOUT_MS` | [`StackBuilder::user_timeout`] |
/// | `NETCHANNEL_INLINE_TX` (bytes) | [`StackBuilder::inline_tx`] |
/// | `NETCHANNEL_RUNTIME_RX` (`off`, `latency`, `all`) | `StackBuilder::runtime_rx` |
/// | `NETCHANNEL_LIGHT_LOAD_STREAMS` | [`StackBuilder::light_load_streams`] |
/// | `NETCHANNEL_CHANNEL_THREAD_RX` (`0`, `1`) | [`StackBuilder::channel_thread_rx`] |
/// | `NETCHANNEL_LINGER_MS` | [`StackBuilder::linger`] |
/// | `NETCHANNEL_CHANNEL_KEY` | [`StackBuilder::channel_key`] |
/// | `NETCHANNEL_BUSY_POLL_US` with `NETCHANNEL_BUSY_POLL_CORES` | [`StackBuilder::busy_poll`] |
/// | `NETCHANNEL_PARTIAL_CHECKSUMS` (`auto`, `accept`, `reject`) | `StackBuilder::partial_checksums` |
/// | `NETCHANNEL_SYN_COOKIES` (`0`, `1`) | `StackBuilder::syn_cookies` |
pub fn default_stack() -> io::Result<Stack> {
    let mut slot = DEFAULT_STACK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = slot.as_ref() {
        return Ok(s.clone());
    }
    let stack = stack_from_env()?;
    *slot = Some(stack.clone());
    Ok(stack)
}

fn env_var(name: &'static str) -> Result<Option<String>, StackError> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(StackError::Env {
            name,
            msg: e.to_string(),
        }),
    }
}

fn env_parse<T: std::str::FromStr>(name: &'static str) -> Result<Option<T>, StackError>
where
    T::Err: fmt::Display,
{
    env_var(name)?
        .map(|v| {
            v.parse().map_err(|e: T::Err| StackError::Env {
                name,
                msg: e.to_string(),
            })
        })
        .transpose()
}

/// A switch's value: `0` (off) or `1` (on).
#[cfg(target_os = "linux")]
fn parse_switch(name: &'static str, v: &str) -> Result<bool, StackError> {
    match v {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(StackError::Env {
            name,
            msg: format!("{v:?}: expected 0 (off) or 1 (on)"),
        }),
    }
}

fn stack_from_env() -> Result<Stack, StackError> {
    let ifname = env_var("NETCHANNEL_INTERFACE")?.ok_or(StackError::Env {
        name: "NETCHANNEL_INTERFACE",
        msg: "not set, and no default stack installed (netchannel::set_default_stack)".into(),
    })?;
    let ipv4: Ipv4Addr = env_parse("NETCHANNEL_IPV4")?.ok_or(StackError::Env {
        name: "NETCHANNEL_IPV4",
        msg: "not set".into(),
    })?;
    let mut b = Stack::builder().interface(ifname).ipv4(ipv4);
    if let Some(n) = env_parse("NETCHANNEL_CHANNELS")? {
        b = b.channels(n);
    }
    if let Some(n) = env_parse("NETCHANNEL_LATENCY_CHANNELS")? {
        b = b.latency_channels(n);
    }
    if let Some(n) = env_parse("NETCHANNEL_COPY_WORKERS")? {
        b = b.copy_workers(n);
    }
    if let Some(port) = env_parse("NETCHANNEL_CHANNEL_PORT")? {
        b = b.channel_port(port);
    }
    if let Some(n) = env_parse("NETCHANNEL_SHARDS")? {
        b = b.shards(n);
    }
    if let Some(n) = env_parse("NETCHANNEL_BACKLOG")? {
        b = b.backlog(n);
    }
    match (
        env_parse::<usize>("NETCHANNEL_SEND_BUFFER")?,
        env_parse::<usize>("NETCHANNEL_RECV_BUFFER")?,
    ) {
        (None, None) => {}
        (send, recv) => {
            let d = Config::default();
            b = b.socket_buffers(send.unwrap_or(d.send_buffer), recv.unwrap_or(d.recv_buffer));
        }
    }
    if let Some(v) = env_var("NETCHANNEL_EXECUTE_PLANS")? {
        b = b.execute_plans(parse_switch("NETCHANNEL_EXECUTE_PLANS", &v)?);
    }
    if let Some(v) = env_var("NETCHANNEL_CHANNEL_THREAD_RX")? {
        b = b.channel_thread_rx(parse_switch("NETCHANNEL_CHANNEL_THREAD_RX", &v)?);
    }
    if let Some(v) = env_var("NETCHANNEL_SCHEDULER")? {
        b = match v.as_str() {
            "round-robin" => b.scheduler(netsched::RoundRobin::default()),
            "source-port" => b.scheduler(netsched::SourcePort::default()),
            "isolating" => b.scheduler(netsched::Isolating::default()),
            _ => {
                return Err(StackError::Env {
                    name: "NETCHANNEL_SCHEDULER",
                    msg: format!("{v:?}: expected round-robin, source-port or isolating"),
                })
            }
        };
    }
    let ms = |name| env_parse::<u64>(name).map(|v| v.map(Duration::from_millis));
    if let Some(d) = ms("NETCHANNEL_CONNECT_TIMEOUT_MS")? {
        b = b.connect_timeout(d);
    }
    if let Some(d) = ms("NETCHANNEL_PREAMBLE_TIMEOUT_MS")? {
        b = b.preamble_timeout(d);
    }
    // Keep-alive idle time; 0 turns keep-alive off.
    if let Some(d) = ms("NETCHANNEL_KEEPALIVE_MS")? {
        b = b.keepalive((!d.is_zero()).then_some(d));
    }
    if let Some(d) = ms("NETCHANNEL_KEEPALIVE_INTERVAL_MS")? {
        b = b.keepalive_interval(d);
    }
    if let Some(n) = env_parse("NETCHANNEL_KEEPALIVE_PROBES")? {
        b = b.keepalive_probes(n);
    }
    if let Some(d) = ms("NETCHANNEL_USER_TIMEOUT_MS")? {
        b = b.user_timeout(d);
    }
    if let Some(n) = env_parse("NETCHANNEL_INLINE_TX")? {
        b = b.inline_tx(n);
    }
    if let Some(ms) = env_parse::<u64>("NETCHANNEL_LINGER_MS")? {
        b = b.linger(Duration::from_millis(ms));
    }
    #[cfg(target_os = "linux")]
    if let Some(v) = env_var("NETCHANNEL_RUNTIME_RX")? {
        let mode = match v.as_str() {
            "off" | "0" => RuntimeRx::Off,
            "latency" => RuntimeRx::LatencyClass,
            "all" | "1" => RuntimeRx::All,
            _ => {
                return Err(StackError::Env {
                    name: "NETCHANNEL_RUNTIME_RX",
                    msg: format!("{v:?}: expected off, latency or all"),
                })
            }
        };
        b = b.runtime_rx(mode);
    }
    if let Some(n) = env_parse("NETCHANNEL_LIGHT_LOAD_STREAMS")? {
        b = b.light_load_streams(n);
    }
    if let Some(key) = env_var("NETCHANNEL_CHANNEL_KEY")? {
        if key.len() < MIN_KEY_LEN {
            return Err(StackError::Env {
                name: "NETCHANNEL_CHANNEL_KEY",
                msg: format!("must be at least {MIN_KEY_LEN} bytes (32 random characters or more)"),
            });
        }
        b = b.channel_key(key);
    }
    if let Some(us) = env_parse::<u64>("NETCHANNEL_BUSY_POLL_US")? {
        let cores = env_var("NETCHANNEL_BUSY_POLL_CORES")?.ok_or(StackError::Env {
            name: "NETCHANNEL_BUSY_POLL_CORES",
            msg: "must list the cores that may spin (e.g. 6,7) when NETCHANNEL_BUSY_POLL_US is set"
                .into(),
        })?;
        let cores = cores
            .split(',')
            .map(|c| c.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StackError::Env {
                name: "NETCHANNEL_BUSY_POLL_CORES",
                msg: format!("a comma-separated list of core numbers: {e}"),
            })?;
        b = b.busy_poll(cores, Duration::from_micros(us));
    }
    #[cfg(target_os = "linux")]
    {
        if let Some(p) =
            env_parse::<netdriver::channel::PartialChecksums>("NETCHANNEL_PARTIAL_CHECKSUMS")?
        {
            b = b.partial_checksums(p);
        }
        if let Some(v) = env_var("NETCHANNEL_SYN_COOKIES")? {
            b = b.syn_cookies(parse_switch("NETCHANNEL_SYN_COOKIES", &v)?);
        }
        b.build()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = b;
        Err(StackError::Missing("AF_XDP (Linux only)"))
    }
}

/// The first IPv4 address `addr` resolves to.
/// The IPv4 addresses `addr` resolves to, in order, resolving names without blocking the
/// runtime (tokio's resolver); an error when there is none.
pub(crate) async fn resolve_v4(
    addr: impl tokio::net::ToSocketAddrs,
) -> io::Result<Vec<SocketAddrV4>> {
    let v4: Vec<SocketAddrV4> = tokio::net::lookup_host(addr)
        .await?
        .filter_map(|a| match a {
            SocketAddr::V4(v4) => Some(v4),
            SocketAddr::V6(_) => None,
        })
        .collect();
    if v4.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            "no IPv4 address (virtual sockets are IPv4 only)",
        ));
    }
    Ok(v4)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One throughput channel per peer where channel threads have fewer than 4 cores to
    /// share with the application, the default elsewhere and without channel threads;
    /// a user's count is kept.
    #[test]
    fn the_default_channel_count_follows_the_cores() {
        assert_eq!(auto_channels(true, 1), 1);
        assert_eq!(auto_channels(true, 2), 1, "2-core bed");
        assert_eq!(auto_channels(true, 3), 1);
        assert_eq!(auto_channels(true, 4), DEFAULT_CHANNELS);
        assert_eq!(auto_channels(true, 16), DEFAULT_CHANNELS);
        assert_eq!(
            auto_channels(false, 2),
            DEFAULT_CHANNELS,
            "in-memory backend"
        );
        let net = MemNetwork::new();
        let default = Stack::builder()
            .ipv4(Ipv4Addr::new(10, 0, 0, 1))
            .build_in_memory(&net)
            .unwrap();
        assert_eq!(default.channels_per_peer(), DEFAULT_CHANNELS);
        let set = Stack::builder()
            .ipv4(Ipv4Addr::new(10, 0, 0, 2))
            .channels(3)
            .build_in_memory(&net)
            .unwrap();
        assert_eq!(set.channels_per_peer(), 3);
    }

    #[test]
    fn default_liveness_probes_idle_channels_within_15_s() {
        let l = Liveness::default();
        assert_eq!(l.keepalive, Some(Duration::from_secs(10)));
        assert_eq!(l.idle_detection(), Some(Duration::from_secs(15)));
        assert_eq!(l.user_timeout, Duration::from_secs(30));
        let off = Liveness {
            keepalive: None,
            ..l
        };
        assert_eq!(off.idle_detection(), None);
        // 0 probes count as 1, as in the TCP.
        let zero = Liveness {
            keepalive_probes: 0,
            ..l
        };
        assert_eq!(zero.idle_detection(), Some(Duration::from_secs(11)));
    }

    #[test]
    fn socket_buffers_keep_the_windows_proportions() {
        let net = MemNetwork::new();
        let s = Stack::builder()
            .ipv4(Ipv4Addr::new(10, 0, 0, 1))
            .socket_buffers(4096, 65536)
            .build_in_memory(&net)
            .unwrap();
        let sock = s.socket();
        assert_eq!(sock.send_buffer_size().unwrap(), 4096);
        assert_eq!(sock.recv_buffer_size().unwrap(), 65536);
        let c = s.core().lock_shard(0).ep.config().clone();
        let d = Config::default();
        assert_eq!(c.credit_window, 65536 * d.credit_window / d.recv_buffer);
        assert_eq!(
            c.credit_update_threshold,
            c.credit_window * d.credit_update_threshold / d.credit_window
        );
        c.validate().unwrap();
    }

    #[test]
    fn in_memory_stack_reports_the_configured_policy() {
        let net = MemNetwork::new();
        let s = Stack::builder()
            .ipv4(Ipv4Addr::new(10, 0, 0, 1))
            .keepalive(Some(Duration::from_millis(200)))
            .keepalive_interval(Duration::from_millis(100))
            .keepalive_probes(3)
            .user_timeout(Duration::from_secs(2))
            .build_in_memory(&net)
            .unwrap();
        let l = s.liveness();
        assert_eq!(l.keepalive, Some(Duration::from_millis(200)));
        assert_eq!(l.idle_detection(), Some(Duration::from_millis(500)));
        assert_eq!(l.user_timeout, Duration::from_secs(2));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn every_channel_gets_the_liveness_policy() {
        let ip = Ipv4Addr::new(10, 0, 0, 1);
        // Defaults: keep-alive on, unlike netdriver's TCP default.
        let cfg = Stack::builder().channel_set_config("x0".into(), ip);
        assert_eq!(netdriver::tcp::Config::default().keepalive, None);
        assert_eq!(cfg.tcp.keepalive, Some(Duration::from_secs(10)));
        assert_eq!(cfg.tcp.keepalive_interval, Some(Duration::from_secs(1)));
        assert_eq!(cfg.tcp.keepalive_probes, 5);
        assert_eq!(cfg.tcp.user_timeout, Duration::from_secs(30));

        let mut b = Stack::builder()
            .keepalive(Some(Duration::from_millis(200)))
            .keepalive_interval(Duration::from_millis(50))
            .keepalive_probes(4)
            .user_timeout(Duration::from_secs(2));
        let cfg = b.channel_set_config("x0".into(), ip);
        // The channel set's TCP configuration serves every connection it opens or
        // accepts (NetChannel channels and plain-TCP streams alike).
        assert_eq!(cfg.tcp.keepalive, Some(Duration::from_millis(200)));
        assert_eq!(cfg.tcp.keepalive_interval, Some(Duration::from_millis(50)));
        assert_eq!(cfg.tcp.keepalive_probes, 4);
        assert_eq!(cfg.tcp.user_timeout, Duration::from_secs(2));
        assert_eq!(Liveness::of_tcp(&cfg.tcp), b.liveness);

        // Keep-alive off, and `configure_channels` has the last word.
        let mut b = Stack::builder()
            .keepalive(None)
            .configure_channels(|c| c.tcp.user_timeout = Duration::from_secs(7));
        let cfg = b.channel_set_config("x0".into(), ip);
        assert_eq!(cfg.tcp.keepalive, None);
        let seen = Liveness::of_tcp(&cfg.tcp);
        assert_eq!(seen.user_timeout, Duration::from_secs(7));
        assert_eq!(seen.idle_detection(), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_syn_cookie_switch_reaches_the_channel_set() {
        let ip = Ipv4Addr::new(10, 0, 0, 1);
        let cookies = |mut b: StackBuilder| b.channel_set_config("x0".into(), ip).syn_cookies;
        assert!(cookies(Stack::builder()), "on by default");
        assert!(!cookies(Stack::builder().syn_cookies(false)));
        assert!(cookies(
            Stack::builder().syn_cookies(false).syn_cookies(true)
        ));
        // `configure_channels` still has the last word.
        assert!(cookies(
            Stack::builder()
                .syn_cookies(false)
                .configure_channels(|c| c.syn_cookies = true)
        ));
        // NETCHANNEL_SYN_COOKIES.
        assert!(!parse_switch("NETCHANNEL_SYN_COOKIES", "0").unwrap());
        assert!(parse_switch("NETCHANNEL_SYN_COOKIES", "1").unwrap());
        for bad in ["", "on", "2", " 1"] {
            let e = parse_switch("NETCHANNEL_SYN_COOKIES", bad).unwrap_err();
            assert!(e.to_string().contains("NETCHANNEL_SYN_COOKIES"), "{e}");
        }
    }
}
