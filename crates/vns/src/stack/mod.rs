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
//! - On the first `connect` to a host, an opener thread opens the configured number of
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
//!   them (reused, not allocated per chunk: [`Diagnostics::copy_stats`](crate::Diagnostics::copy_stats)).
//! - A read into a buffer of at least the threshold lends the received in-order chunks
//!   to the pool, which copies them out in parallel when at least the threshold is
//!   readable (fewer bytes are copied inline).
//! - Smaller writes and reads take the plain path, unchanged. Credit and flow control are
//!   the same on both paths (a read frees receive space and may send a credit update
//!   exactly as on the plain path).
//!
//! The workers only engage when the socket buffers can hold a copy that large: the
//! default send buffer ([`Config::send_buffer`], 256 KiB) is below the default
//! threshold, so a stack built with copy workers and no
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
//! assert!(a.diagnostics().copy_stats().parallel_copies >= 1);
//! assert!(a.diagnostics().copy_stats().worker_bytes > 0);
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
mod diagnostics;
mod env;
mod error;
mod listener;
mod liveness;
mod loopback;
mod mem;
mod receive;
mod runtime_names;
mod shard;
#[cfg(test)]
mod shard_tests;
mod sizing;
mod socket;
mod stream;
mod wake;

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

pub use auth::{ChannelKey, MIN_KEY_LEN};
pub use builder::{BusyPoll, StackBuilder, DEFAULT_CHANNELS};
pub use control::{HelloCounts, PlanCounters};
pub use default::{clear_default_stack, default_stack, set_default_stack};
pub use diagnostics::Diagnostics;
pub(crate) use error::classify;
pub use error::StackError;
pub use listener::VirtualListener;
pub use liveness::Liveness;
pub use mem::{MemLimits, MemNetwork};
pub use runtime_names::{APPLICATION_RUNTIME, LATENCY_RUNTIME};
pub use socket::VirtualSocket;
pub use stream::{
    OwnedReadHalf, OwnedWriteHalf, ReadHalf, ReuniteError, VirtualStream, WriteHalf, IP_TTL,
};

use self::core::Core;
use crate::copy::CopyStats;
use crate::endpoint::Error;
use sizing::CopyPath;

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

    pub(crate) fn copy_path(&self) -> Option<&CopyPath> {
        self.inner.copy.as_ref()
    }

    /// The liveness policy of the stack's channels: keep-alive and user timeout as
    /// configured with [`StackBuilder::keepalive`] and friends (or as
    /// [`StackBuilder::configure_channels`] left them).
    pub fn liveness(&self) -> Liveness {
        self.inner.liveness
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

    /// Drives the queues of latency channels on `handle` from now on, where the scheduler
    /// keeps the classes on queues of their own (`Isolating`): the plan-time form of
    /// [`StackBuilder::latency_runtime`], for a latency application started after the
    /// stack. The queues move at once (their state moves whole; nothing is lost).
    pub fn set_latency_runtime(&self, handle: tokio::runtime::Handle) -> io::Result<()> {
        self.core()
            .place_latency_queues(handle)
            .map_err(io::Error::from)
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

    /// Resolves once the stack holds no channel (its NetChannel peers have closed theirs,
    /// or they were lost), or has stopped: what a server waits for before it stops when
    /// its peers read its last bytes from their channels and then close them. Woken by
    /// the control task when a channel goes; no polling.
    pub fn channels_closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        Wait::new(self.core().clone(), control::Goal::NoChannels)
    }

    /// Resolves once the stack holds exactly `n` channels ([`Diagnostics::channel_count`](crate::Diagnostics::channel_count)),
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
mod tests;
