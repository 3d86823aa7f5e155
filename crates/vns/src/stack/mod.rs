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
//! - Channels come from netdriver's [`ChannelSet`](netdriver::channel::ChannelSet): AF_XDP
//!   (or, with [`StackBuilder::link`], AF_PACKET) queues of an interface
//!   ([`StackBuilder::build`]), or the ports of an in-memory switch
//!   ([`MemNetwork`], [`StackBuilder::build_in_memory`]) with the same queue drivers and
//!   TCP, for unprivileged tests. Each NIC queue is driven by one future on a runtime the
//!   scheduler's placement chooses (`NetScheduler::place_queues`): the application's
//!   runtime on a small host (run to completion), queue runtimes of the stack's own where
//!   cores are to spare, a latency application's runtime for the latency channels' queues
//!   ([`StackBuilder::latency_runtime`]).
//! - The sockets are split over **shards** ([`StackBuilder::shards`]), each an endpoint
//!   behind its own lock: calls on streams of different shards share no lock but the
//!   channels' transmit sides (`shard.rs`, `channel.rs`; `docs/architecture.md`).
//! - The path of a message: a write moves its chunks into a channel's queue (waking that
//!   queue's driver); the driver sends them; on the peer, the channel's queue driver hands
//!   the received bytes to the channel's sink (`receive.rs`), which deframes them, hands
//!   each chunk to its socket's shard and wakes the reading task. No other thread or task
//!   in between.
//! - The control task (`control/`, one per stack, on the stack's own runtime) accepts
//!   channels on the channel port (9000 unless configured) and runs their handshakes,
//!   opens channels to peers, drops dead ones, runs the shards' timers, carries out the
//!   scheduler's plans and stops the stack. It does nothing per message.
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
//! it. Plain-TCP streams report their channel's own error (`TimedOut` here too).
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
mod builder;
mod channel;
mod control;
mod core;
mod default;
mod env;
mod listener;
mod loopback;
mod mem;
mod receive;
mod shard;
#[cfg(test)]
mod shard_tests;
mod socket;
mod stream;
mod wake;

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tracing::debug;

pub use auth::{ChannelKey, MIN_KEY_LEN};
pub use builder::{BusyPoll, StackBuilder, APPLICATION_RUNTIME, DEFAULT_CHANNELS, LATENCY_RUNTIME};
pub use control::PlanCounters;
pub use default::{clear_default_stack, default_stack, set_default_stack};
pub use listener::VirtualListener;
pub use mem::{MemLimits, MemNetwork};
pub use socket::VirtualSocket;
pub use stream::{
    OwnedReadHalf, OwnedWriteHalf, ReadHalf, ReuniteError, VirtualStream, WriteHalf, IP_TTL,
};

use self::core::Core;
use crate::copy::CopyError;
use crate::copy::CopyStats;
use crate::endpoint::{ConfigError, Error};
use builder::CopyPath;

/// Why a [`Stack`] could not be built.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StackError {
    /// AF_XDP or AF_PACKET sockets and BPF programs need privileges (CAP_NET_ADMIN,
    /// CAP_NET_RAW, CAP_BPF, ...).
    #[error("not permitted (AF_XDP and AF_PACKET need CAP_NET_ADMIN/CAP_NET_RAW/CAP_BPF): {0}")]
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
            StackError::CopyWorkers(_) => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// Classifies a channel-set start failure by the errors in its source chain.
pub(crate) fn classify(e: netdriver::channel::ChannelError, ifname: &str) -> StackError {
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
    pub(crate) fn apply(&self, tcp: &mut netdriver::tcp::Config) {
        tcp.keepalive = self.keepalive;
        tcp.keepalive_interval = Some(self.keepalive_interval);
        tcp.keepalive_probes = self.keepalive_probes;
        tcp.user_timeout = self.user_timeout;
    }

    /// The policy a channel's TCP configuration carries.
    pub(crate) fn of_tcp(tcp: &netdriver::tcp::Config) -> Liveness {
        Liveness {
            keepalive: tcp.keepalive,
            keepalive_interval: tcp.keepalive_interval.or(tcp.keepalive).unwrap_or_default(),
            keepalive_probes: tcp.keepalive_probes,
            user_timeout: tcp.user_timeout,
        }
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
    /// timeout ([`Liveness`]); then, as defaults, every `NETCHANNEL_*` variable set in
    /// the environment (the table at [`default_stack`]), so that a program's stack can be
    /// tuned from outside. Builder calls made after win; a variable that does not parse
    /// makes `build` fail naming it. [`StackBuilder::default`] ignores the environment.
    pub fn builder() -> StackBuilder {
        env::builder()
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

    /// The throughput channels the stack opens to each peer: the user's
    /// ([`StackBuilder::channels`]) or the one chosen from the host.
    pub fn channels_per_peer(&self) -> usize {
        self.core().config.channels
    }

    /// The stack's address.
    pub fn ipv4(&self) -> Ipv4Addr {
        self.inner.core.ipv4()
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
    /// [`StackBuilder::configure_channels`] left them).
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
    /// (4-tuple, NIC queue, RCV.NXT and SND.NXT as its queue driver last published them),
    /// in the order [`Stack::reset_channel`] counts the channels. A test that forges a
    /// RST for a channel reads RCV.NXT here, since a RST is accepted only at exactly
    /// RCV.NXT (RFC 5961).
    pub fn channel_wire(&self) -> Vec<netdriver::channel::ChannelWire> {
        self.core()
            .chans
            .load()
            .values()
            .map(|c| c.t.wire())
            .collect()
    }

    /// Channel connections this stack lost to a RST received from the wire (one at
    /// exactly RCV.NXT, RFC 5961), over its whole life. Channels this stack resets itself
    /// ([`Stack::reset_channel`]) are not counted.
    pub fn channel_resets_received(&self) -> u64 {
        self.core().set.resets_received()
    }

    /// Each NIC queue's driver since the stack started: where it runs, its busy time,
    /// rounds, polls and wake-ups, and what the kernel dropped at its AF_XDP socket because
    /// its driver did not keep up (rx ring full, fill ring empty). Cumulative, unlike the
    /// per-period view in [`Stack::stats`].
    pub fn queue_stats(&self) -> Vec<netdriver::channel::QueueStats> {
        self.core().set.queue_stats()
    }

    /// The stack's channel set: its NIC queues, their drivers and runtimes. For
    /// diagnostics, and for channels of one's own beside the stack's (a raw channel on the
    /// same queues, a plain-TCP connection made by hand).
    pub fn channel_set(&self) -> &netdriver::channel::ChannelSet {
        &self.core().set
    }

    /// Which runtime drives which NIC queue (the application's, a latency application's,
    /// or queue runtimes of the stack's own), their cores and busy time (netdriver's
    /// `ChannelSet::placement`; printable and serialisable). The scheduler's placement
    /// decides it at start ([`NetScheduler::place_queues`](netsched::NetScheduler::place_queues))
    /// and plans change it (`PlanAction::SpawnThread`, `RetireThread`, `AssignQueue`);
    /// [`Stack::stats`] shows the same in the scheduler's terms.
    pub fn channel_placement(&self) -> netdriver::channel::ChannelPlacement {
        self.core().set.placement()
    }

    /// Drives the queues of latency channels on `handle` from now on, where the scheduler
    /// keeps the classes on queues of their own (`Isolating`): the plan-time form of
    /// [`StackBuilder::latency_runtime`], for a latency application started after the
    /// stack. The queues move at once (their state moves whole; nothing is lost).
    pub fn set_latency_runtime(&self, handle: tokio::runtime::Handle) -> io::Result<()> {
        self.core()
            .place_latency_queues(handle)
            .map_err(io::Error::from)
    }

    /// Fault injection, for tests and failure drills: NIC queue `queue` dies as if its
    /// driver had crashed. This stack sees the channels on that queue as lost at once
    /// (their chunks go again on the other channels, as with [`Stack::reset_channel`]),
    /// but nothing goes on the wire, no FIN and no RST: the peer notices only through its
    /// keep-alive or user timeout ([`StackBuilder::keepalive`],
    /// [`StackBuilder::user_timeout`]). Nobody drives the queue afterwards; new channels
    /// use the other queues. Returns `false` for an unknown queue or one killed before.
    pub fn kill_queue(&self, queue: u32) -> bool {
        let killed = self.core().set.kill_queue(queue);
        if killed {
            // The channels' failure reaches their sinks; the control task looks now.
            self.core().control.notify();
        }
        killed
    }

    /// A statistics snapshot of the stack, as its scheduler's
    /// [`plan`](netsched::NetScheduler::plan) sees it; serialisable with serde (to JSON,
    /// say) for logs and tools.
    ///
    /// - `channels`: every channel to every peer, with the loads the channels last
    ///   reported (refreshed whenever the stack moves chunks into a channel): queued and
    ///   in-flight bytes, congestion window, smoothed RTT, retransmitted segments and
    ///   payload bytes sent. `queue`: the NIC queue the channel's connection lives on;
    ///   `thread`: the queue runtime that drives that queue (`None` when the queue is
    ///   driven by a runtime handed to the stack, such as the application's);
    ///   `steering`: how its frames reach that queue (accepted where its SYN landed,
    ///   opened from a port the NIC's RSS aligns, steered by a NIC rule, or forwarded from
    ///   whichever queue they land on; see [`StackBuilder::rss_align`]).
    /// - `flows`: every virtual socket with its class and unsent bytes;
    ///   `recent_rate_bps` is 0 (not measured yet).
    /// - `copy_workers`: each worker with its core and the bytes of copies placed on it and
    ///   not finished.
    /// - `threads`: each queue runtime of the stack's own with its core, its queues' busy
    ///   time and the frames the kernel dropped for its queues over the last plan period
    ///   ([`StackBuilder::execute_plans`]; a zero window before the first period, with
    ///   plans off, and for a runtime started since); `queues`: which runtime drives each
    ///   NIC queue, as of now (the placement); `cores`: the cores the thread that built
    ///   the stack was allowed to run on.
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
    /// opened or closed and where it wants them to run. The control task carries plans
    /// out itself every plan period ([`StackBuilder::execute_plans`]); this only shows one,
    /// and calling it advances the policy's own state (streaks, cooldowns) as one plan
    /// period would.
    pub fn scheduler_plan(&self) -> Vec<netsched::PlanAction> {
        let snapshot = self.stats();
        self.core().lock_shard(0).ep.scheduler_plan(&snapshot)
    }

    /// What the control task did with the scheduler's plans so far: plans asked for, channels
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
    /// are snapshots their queue drivers publish after each round: a reading may miss bytes in
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
            return Err(core::stopped_error());
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
        let plain = match core.set.listen(port) {
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
                return Err(core::stopped_error());
            }
            let inner = loopback::connect(v4, self.ipv4()).await?;
            return Ok(VirtualStream::loopback(inner));
        }
        stream::connect(self, v4).await
    }

    /// Stops the stack now: every channel is aborted, and the stack's streams and
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
    /// their bytes, so that each peer reads everything they hold) and the stack stops
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
            Wait::new(core.clone(), control::Goal::Stopped).await;
        }
        let outcome = core.ctl().stop_outcome;
        match outcome {
            Some(control::StopOutcome::Drained) => Ok(()),
            Some(control::StopOutcome::Expired { pending }) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the stack did not finish within its linger time ({linger:?}); \
                     {pending} byte(s) undelivered were aborted"
                ),
            )),
            Some(control::StopOutcome::Aborted) | None => Err(core::stopped_error()),
        }
    }

    /// Resolves once everything written to this stack's streams has been delivered:
    /// [`Stack::pending_tx_bytes`] read 0 twice, a couple of milliseconds apart (channel
    /// figures are snapshots). The stack's control task reads the figure after each of
    /// its rounds and on a short timer while the future waits (the channels' TCP does not
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
        Wait::new(self.core().clone(), control::Goal::Drained)
    }

    /// Resolves once the stack holds no channel (its NetChannel peers have closed theirs,
    /// or they were lost), or has stopped: what a server waits for before it stops when
    /// its peers read its last bytes from their channels and then close them. Woken by
    /// the control task when a channel goes; no polling.
    pub fn channels_closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        Wait::new(self.core().clone(), control::Goal::NoChannels)
    }

    /// Resolves once the stack holds exactly `n` channels ([`Stack::channel_count`]),
    /// or has stopped: for watching run-time scaling ([`StackBuilder::execute_plans`]).
    /// Woken by the control task's round after channels come and go; no polling.
    pub fn channels_reach(
        &self,
        n: usize,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        Wait::new(self.core().clone(), control::Goal::Channels(n))
    }

    /// Resolves once the control task has asked the scheduler for at least `k` plans in
    /// all ([`PlanCounters::plans`]) and carried them out, or the stack has stopped. Woken
    /// by the control task's round; no polling.
    pub fn plans_reach(&self, k: u64) -> impl std::future::Future<Output = ()> + Send + 'static {
        Wait::new(self.core().clone(), control::Goal::Plans(k))
    }
}

/// A wait for a [`control::Goal`], woken by the control task.
struct Wait {
    core: Arc<Core>,
    goal: control::Goal,
    id: Option<u64>,
}

impl Wait {
    fn new(core: Arc<Core>, goal: control::Goal) -> Wait {
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

/// The stack a handle refers to: dropped with the last handle (streams and listeners hold
/// one).
pub(crate) struct StackInner {
    pub(crate) core: Arc<Core>,
    pub(crate) copy_workers: usize,
    /// Dropped after the core's channels are stopped (field order), which joins the
    /// workers.
    pub(crate) copy: Option<CopyPath>,
    pub(crate) liveness: Liveness,
    /// How long the drop of the last handle lets the stack drain ([`StackBuilder::linger`]).
    pub(crate) linger: Duration,
}

/// How long a stop waits for the control task before it stops the channels anyway.
const STOP_WAIT: Duration = Duration::from_secs(5);

impl StackInner {
    /// Stops the stack now (every channel aborted, every waiting task woken) and waits
    /// for the control task to have done it.
    fn stop(&self) {
        self.core.stop_and_wait(STOP_WAIT);
    }
}

impl Drop for StackInner {
    /// With a linger time and bytes not yet delivered, the control task drains them in
    /// the background and stops the stack by itself; otherwise it stops now, and the
    /// channel set with it (queue runtimes joined, XDP program detached) when the drop
    /// returns.
    fn drop(&mut self) {
        if self.linger.is_zero() || self.core.nothing_pending() {
            self.stop();
            return;
        }
        debug!(linger = ?self.linger, "last handle dropped with bytes undelivered; draining in the background");
        self.core.begin_stop(self.linger);
    }
}

/// The default [`StackBuilder::linger`]: long enough for the last replies of a
/// datacenter service to be acknowledged many times over (a few round trips, a
/// retransmission or two), short enough that a peer which stopped reading does not hold
/// the stack's runtimes (and, on AF_XDP, its XDP program) for long after it was dropped.
pub const DEFAULT_LINGER: Duration = Duration::from_secs(5);

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

    /// One throughput channel per peer where the process has fewer than 4 cores to share
    /// with the application, the default elsewhere; a user's count is kept.
    #[test]
    fn the_default_channel_count_follows_the_cores() {
        use builder::auto_channels;
        assert_eq!(auto_channels(1), 1);
        assert_eq!(auto_channels(2), 1, "2-core bed");
        assert_eq!(auto_channels(3), 1);
        assert_eq!(auto_channels(4), DEFAULT_CHANNELS);
        assert_eq!(auto_channels(16), DEFAULT_CHANNELS);
        let net = MemNetwork::new();
        let default = Stack::builder()
            .ipv4(Ipv4Addr::new(10, 0, 0, 1))
            .build_in_memory(&net)
            .unwrap();
        let usable = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(default.channels_per_peer(), auto_channels(usable));
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
        let d = crate::endpoint::Config::default();
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
        use env::parse_switch;
        assert!(!parse_switch("NETCHANNEL_SYN_COOKIES", "0").unwrap());
        assert!(parse_switch("NETCHANNEL_SYN_COOKIES", "1").unwrap());
        for bad in ["", "on", "2", " 1"] {
            let e = parse_switch("NETCHANNEL_SYN_COOKIES", bad).unwrap_err();
            assert!(e.to_string().contains("NETCHANNEL_SYN_COOKIES"), "{e}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_xdp_mode_and_rss_alignment_reach_the_channel_set() {
        use netdriver::channel::RssAlignment;
        use netdriver::link::xdp::BindMode;
        let ip = Ipv4Addr::new(10, 0, 0, 1);
        let cfg = |mut b: StackBuilder| b.channel_set_config("x0".into(), ip);
        let d = cfg(StackBuilder::default());
        assert_eq!((d.link.bind, d.rss), (BindMode::Auto, RssAlignment::Probe));
        for mode in [BindMode::Copy, BindMode::ZeroCopy, BindMode::Auto] {
            assert_eq!(cfg(StackBuilder::default().xdp_mode(mode)).link.bind, mode);
        }
        assert_eq!(
            cfg(StackBuilder::default().rss_align(false)).rss,
            RssAlignment::Off
        );
        assert_eq!(
            cfg(StackBuilder::default().rss_align(false).rss_align(true)).rss,
            RssAlignment::Probe
        );
        // `configure_channels` still has the last word.
        let c = cfg(StackBuilder::default()
            .xdp_mode(BindMode::ZeroCopy)
            .configure_channels(|c| c.link.bind = BindMode::Copy));
        assert_eq!(c.link.bind, BindMode::Copy);
    }
}
