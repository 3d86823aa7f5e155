//! [`StackBuilder`]: every setting a stack is started with, and the start: the channel
//! set (AF_XDP, AF_PACKET or the in-memory switch) with its queues placed by the scheduler, the
//! shards' endpoints, the copy workers and the control task.

use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use netsched::{NetScheduler, RoundRobin};
use tracing::debug;

use super::auth::ChannelKey;
use super::control::{Control, ControlTask};
use super::core::{Core, CoreConfig};
use super::runtime_names::{APPLICATION_RUNTIME, LATENCY_RUNTIME};
pub use super::sizing::DEFAULT_CHANNELS;
use super::sizing::{
    auto_channels, copy_worker_buffers, shard_endpoints, with_socket_buffers, CopyPath,
};
use super::{classify, shard, Liveness, MemNetwork, Stack, StackError, StackInner, DEFAULT_LINGER};
use crate::copy::CopyConfig;
use crate::endpoint::Config;

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
    pub(crate) liveness: Liveness,
    /// `None`: [`Config::default`], or buffers sized for the copy workers when there are
    /// any ([`copy_worker_buffers`]).
    vns: Option<Config>,
    /// Send and receive buffer sizes of every socket ([`StackBuilder::socket_buffers`]).
    socket_buffers: Option<(usize, usize)>,
    execute_plans: bool,
    busy_poll: Option<BusyPoll>,
    /// `None`: [`default_shards`].
    shards: Option<usize>,
    /// The runtime of a latency application, for the queues of latency channels
    /// ([`StackBuilder::latency_runtime`]).
    latency_runtime: Option<tokio::runtime::Handle>,
    /// Whether the stack may drive its queues on the application's runtime
    /// ([`StackBuilder::application_runtime`]).
    application_runtime: bool,
    /// The application's runtime, where the stack is not built in it
    /// ([`StackBuilder::runtime`]).
    runtime: Option<tokio::runtime::Handle>,
    preamble_timeout: Duration,
    linger: Duration,
    /// `Err` holds a refused key until `build` reports it.
    channel_key: Result<Option<ChannelKey>, ()>,
    /// A `NETCHANNEL_*` variable that did not parse ([`Stack::builder`]), reported by
    /// `build`.
    env_error: Option<StackError>,
    #[cfg(target_os = "linux")]
    partial_checksums: Option<netdriver::channel::PartialChecksums>,
    #[cfg(target_os = "linux")]
    syn_cookies: bool,
    /// `None`: the link's default ([`BindMode::Auto`](netdriver::link::xdp::BindMode)).
    #[cfg(target_os = "linux")]
    xdp_mode: Option<netdriver::link::xdp::BindMode>,
    /// `None`: the link's default (checksums through TX metadata where accepted).
    #[cfg(target_os = "linux")]
    xdp_tx_checksum: Option<bool>,
    #[cfg(target_os = "linux")]
    rss_align: bool,
    /// The link the channels run over ([`StackBuilder::link`]).
    #[cfg(target_os = "linux")]
    link: netdriver::channel::LinkKind,
    #[cfg(target_os = "linux")]
    #[allow(clippy::type_complexity)]
    tweak: Option<Box<dyn FnOnce(&mut netdriver::channel::ChannelSetConfig) + Send>>,
    /// Where the control task runs: the runtime that drives the first queue when the
    /// placement hands it one (the application's), else the set's home runtime.
    control_runtime: Option<tokio::runtime::Handle>,
}

/// Busy polling by queue runtimes of the stack's own, for hosts with cores to spare
/// ([`StackBuilder::busy_poll`]): the core budget is explicit, which cores may spin and
/// for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyPoll {
    /// The cores the queue runtimes are pinned to (runtime *i* on `cores[i % len]`): only
    /// these spin.
    pub cores: Vec<usize>,
    /// How long a queue's driver keeps polling its receive ring after its last activity
    /// before it waits (it never spins longer than this past its last frame).
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
            busy_poll: None,
            shards: None,
            latency_runtime: None,
            application_runtime: true,
            runtime: None,
            channel_key: Ok(None),
            env_error: None,
            #[cfg(target_os = "linux")]
            partial_checksums: None,
            #[cfg(target_os = "linux")]
            syn_cookies: true,
            #[cfg(target_os = "linux")]
            xdp_mode: None,
            #[cfg(target_os = "linux")]
            xdp_tx_checksum: None,
            #[cfg(target_os = "linux")]
            rss_align: true,
            #[cfg(target_os = "linux")]
            link: netdriver::channel::LinkKind::default(),
            preamble_timeout: Duration::from_secs(5),
            linger: DEFAULT_LINGER,
            #[cfg(target_os = "linux")]
            tweak: None,
            control_runtime: None,
        }
    }
}

impl StackBuilder {
    /// The builder with a `NETCHANNEL_*` variable that did not parse, for `build` to
    /// report.
    pub(super) fn with_env_error(mut self, e: StackError) -> Self {
        self.env_error = Some(e);
        self
    }

    /// Whether an interface was given.
    pub(super) fn has_interface(&self) -> bool {
        self.interface.is_some()
    }

    /// Whether an address was given.
    pub(super) fn has_ipv4(&self) -> bool {
        self.ipv4.is_some()
    }
}

impl StackBuilder {
    /// The interface whose queues get the stack's sockets (AF_XDP, or AF_PACKET with
    /// [`link`](Self::link); for [`build`](Self::build)).
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
    /// process may run on fewer than 4 cores, one: more channels spread a peer's traffic
    /// over more NIC queues and their drivers, which bring parallelism only with cores to
    /// run them beside the application. Measured on the 2-core bed (2 queues;
    /// `docs/investigations/per-message-path.md`, "How many channels a small host
    /// opens"): one channel's request rate was 0.92-1.14 of kernel TCP's at 1-128
    /// connections, against 0.69-0.96 with four, and one stream's bulk goodput the same
    /// with 1, 2 or 4. Otherwise [`DEFAULT_CHANNELS`]. A policy that scales at run time
    /// (`Scaled`) opens more when the queue runtimes stay busy.
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

    /// Whether the control task carries out the scheduler's plans (default `true`): every
    /// [`plan_period`](netsched::NetScheduler::plan_period) it shows the policy a
    /// snapshot ([`Diagnostics::stats`](crate::Diagnostics::stats)) and opens the channels it asks for and retires those it
    /// wants closed, without losing a byte (see [`Diagnostics::plan_counters`](crate::Diagnostics::plan_counters)). Policies that
    /// plan nothing (the default `plan`) cost one snapshot per period. `false` leaves
    /// plans to [`Diagnostics::scheduler_plan`](crate::Diagnostics::scheduler_plan), for tools that only want to see them.
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
    /// [`Stack::abort`] does. The dropping thread never waits: the control task keeps
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
    /// that the one that has waited longest is aborted. [`Diagnostics::dropped_channels`](crate::Diagnostics::dropped_channels)
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
    /// in [`Diagnostics::auth_failures`](crate::Diagnostics::auth_failures), and opening channels to a peer with another key, or
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

    /// Gives the stack's queues cores of their own: they are driven by queue runtimes of
    /// the stack's own pinned to `cores`, off the application's runtime. `spin` is the AF_XDP
    /// links' busy-poll budget ([`XdpLinkConfig::busy_poll`](netdriver::link::xdp::XdpLinkConfig::busy_poll)),
    /// which a blocking wait on a link spends spinning on its receive ring before it sleeps;
    /// the queue drivers themselves wait for the socket's readiness through the runtime's
    /// reactor and do not spin. Off by default; use it only on cores the application
    /// leaves free (never on a 2-core machine). An empty `cores` or a zero `spin` is
    /// refused by [`build`](Self::build).
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
    /// ([`Diagnostics::latency_shard`](crate::Diagnostics::latency_shard), [`crate::ShardOf`]). A scheduler that cannot be forked
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
    /// assert_eq!(stack.diagnostics().shards(), 5);
    /// assert_eq!(stack.diagnostics().latency_shard(), Some(4));
    /// let no_latency = vns::Stack::builder()
    ///     .ipv4("10.0.0.2".parse()?)
    ///     .shards(4)
    ///     .latency_channels(0)
    ///     .build_in_memory(&net)?;
    /// assert_eq!((no_latency.diagnostics().shards(), no_latency.diagnostics().latency_shard()), (4, None));
    /// # Ok(())
    /// # }
    /// ```
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = Some(n.clamp(1, shard::MAX_SHARDS));
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

    /// How the AF_XDP sockets of the stack's queues share frames with the NIC's driver:
    /// [`BindMode::Auto`](netdriver::link::xdp::BindMode) (the default) binds in zero copy
    /// where the driver advertises it and falls back to copy mode, logged, elsewhere (veth);
    /// `ZeroCopy` fails the build where zero copy is refused; `Copy` never tries.
    /// [`Diagnostics::queue_stats`](crate::Diagnostics::queue_stats) says what each queue got.
    /// Environment: `NETCHANNEL_XDP_MODE=auto|copy|zerocopy`
    /// (`netdriver::link::xdp::XdpLinkConfig::bind`).
    #[cfg(target_os = "linux")]
    pub fn xdp_mode(mut self, mode: netdriver::link::xdp::BindMode) -> Self {
        self.xdp_mode = Some(mode);
        self
    }

    /// Whether the AF_XDP links leave the TCP checksums of the frames they send to the
    /// device or the kernel through TX metadata where the kernel accepts it (default on),
    /// rather than summing every frame themselves. Off is for A/B measurements and for
    /// devices whose offload is not to be trusted.
    /// [`Diagnostics::queue_stats`](crate::Diagnostics::queue_stats) says what each queue
    /// got (`tx_checksum`). Environment: `NETCHANNEL_XDP_TX_CHECKSUM=0|1`
    /// (`netdriver::link::xdp::XdpLinkConfig::tx_checksum_offload`).
    #[cfg(target_os = "linux")]
    pub fn xdp_tx_checksum(mut self, on: bool) -> Self {
        self.xdp_tx_checksum = Some(on);
        self
    }

    /// Whether the channels this stack opens are aligned with the NIC's receive-side
    /// scaling (default on): each gets a local port whose replies the NIC's RSS delivers
    /// to the queue that owns it (or an ntuple rule where the hash cannot be reproduced),
    /// so that no frame is handed between queues. Off, ports are taken in turn and a
    /// channel's frames that land on another queue are forwarded: for A/B measurements of
    /// what alignment is worth. On veth (no RSS) it changes nothing. Environment:
    /// `NETCHANNEL_RSS_ALIGN=0|1` (`netdriver::channel::ChannelSetConfig::rss`).
    #[cfg(target_os = "linux")]
    pub fn rss_align(mut self, on: bool) -> Self {
        self.rss_align = on;
        self
    }

    /// Which link the channels run over on the interface (default
    /// [`LinkKind::Xdp`](netdriver::channel::LinkKind::Xdp)): AF_XDP sockets and the
    /// steering XDP program, or with
    /// [`LinkKind::Packet`](netdriver::channel::LinkKind::Packet) AF_PACKET sockets that
    /// hand the kernel 64 KiB super-segments to segment (GSO/TSO) and take what its GRO
    /// coalesced, steered by a socket filter and a TCX program. AF_XDP is the link for NICs
    /// with zero-copy AF_XDP; where it must copy (veth, drivers without zero copy),
    /// AF_PACKET carries bulk several times faster (`docs/investigations/bulk.md`).
    /// [`build_in_memory`](Self::build_in_memory) ignores it. Environment:
    /// `NETCHANNEL_LINK=xdp|packet`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use netdriver::channel::LinkKind;
    /// let stack = vns::Stack::builder()
    ///     .interface("veth1")
    ///     .ipv4("10.0.0.2".parse()?)
    ///     .link(LinkKind::Packet)
    ///     .build()?;
    /// # drop(stack);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(target_os = "linux")]
    pub fn link(mut self, kind: netdriver::channel::LinkKind) -> Self {
        self.link = kind;
        self
    }

    /// Adjusts the channel set's configuration before [`build`](Self::build)
    /// starts it (queues, link, TCP, queue limits, ...). It runs after the builder's own
    /// settings are applied (the liveness policy included), so it may override them;
    /// [`Stack::liveness`] reports what the channels got.
    #[cfg(target_os = "linux")]
    pub fn configure_channels(
        mut self,
        f: impl FnOnce(&mut netdriver::channel::ChannelSetConfig) + Send + 'static,
    ) -> Self {
        self.tweak = Some(Box::new(f));
        self
    }

    /// The runtime of a latency application: where the scheduler keeps the classes on
    /// queues of their own (`Isolating`), the queues of latency channels are driven there,
    /// beside the latency application's tasks and apart from bulk work
    /// ([`NetScheduler::place_queues`](netsched::NetScheduler::place_queues)). Without
    /// one, they go where the scheduler's default puts them.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let latency_app = tokio::runtime::Builder::new_multi_thread()
    ///     .worker_threads(1)
    ///     .enable_all()
    ///     .build()?;
    /// let stack = vns::Stack::builder()
    ///     .interface("eth1")
    ///     .ipv4("10.0.0.2".parse()?)
    ///     .scheduler(netsched::Isolating::default())
    ///     .latency_runtime(latency_app.handle().clone())
    ///     .build()?;
    /// # drop(stack);
    /// # Ok(())
    /// # }
    /// ```
    pub fn latency_runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.latency_runtime = Some(handle);
        self
    }

    /// Whether the stack may drive its NIC queues on the multi-thread tokio runtime it is
    /// built in (default `true`), where the scheduler's placement wants it
    /// ([`NetScheduler::place_queues`](netsched::NetScheduler::place_queues): by default
    /// on hosts with fewer than [`netsched::DISAGGREGATE_MIN_CORES`] cores). The queues'
    /// rounds then run between the application's tasks, to completion; a task that
    /// blocks its worker longer than netdriver's `placement::STALL` costs the queues of
    /// that runtime a move to the stack's own runtime until it is free again. `false`:
    /// queue runtimes of the stack's own, whatever the host. Built outside a runtime, or
    /// in a current-thread one, the stack always drives its queues itself. Environment:
    /// `NETCHANNEL_APPLICATION_RUNTIME=0|1`.
    pub fn application_runtime(mut self, on: bool) -> Self {
        self.application_runtime = on;
        self
    }

    /// The application's tokio runtime, for a stack built outside it (on a thread that
    /// entered the interface's network namespace, say): where the scheduler's placement
    /// wants queues on the application's runtime, they are driven there (see
    /// [`application_runtime`](Self::application_runtime)). By default the runtime the
    /// stack is built in, if any.
    pub fn runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// Starts the stack on the interface's queues, over AF_XDP or AF_PACKET
    /// ([`link`](Self::link); needs privileges; run it in the
    /// network namespace of the interface).
    #[cfg(target_os = "linux")]
    pub fn build(mut self) -> Result<Stack, StackError> {
        if let Some(e) = self.env_error.take() {
            return Err(e);
        }
        let ifname = self
            .interface
            .take()
            .ok_or(StackError::Missing("interface"))?;
        let ipv4 = self.ipv4.ok_or(StackError::Missing("ipv4"))?;
        self.check_busy_poll()?;
        let mut cfg = self.channel_set_config(ifname.clone(), ipv4);
        // What the channels really run with, after `configure_channels`.
        self.liveness = Liveness::of_tcp(&cfg.tcp);
        let queues = match &cfg.queues {
            Some(q) => q.clone(),
            None => {
                let n = netdriver::channel::rx_queue_count(&ifname).map_err(|e| {
                    classify(
                        netdriver::channel::ChannelError::Io {
                            op: "reading the interface's queue count (ETHTOOL_GCHANNELS)",
                            source: e,
                        },
                        &ifname,
                    )
                })?;
                (0..n.max(1)).collect()
            }
        };
        if is_unplaced(&cfg.placement) {
            cfg.placement = self.placement(&queues);
        }
        self.control_runtime = first_queue_runtime(&cfg.placement);
        cfg.queues = Some(queues);
        let set = netdriver::channel::ChannelSet::start(cfg).map_err(|e| classify(e, &ifname))?;
        self.start(set)
    }

    /// Refuses a busy-poll setting that cannot work.
    fn check_busy_poll(&self) -> Result<(), StackError> {
        if let Some(b) = &self.busy_poll {
            if b.cores.is_empty() || b.spin.is_zero() {
                return Err(StackError::Invalid(
                    "busy_poll needs at least one core and a non-zero spin time",
                ));
            }
        }
        Ok(())
    }

    /// Where the channel set drives each of `queues`: the scheduler's placement
    /// ([`NetScheduler::place_queues`](netsched::NetScheduler::place_queues)) for this
    /// host, with the application's runtime where the stack is built in a multi-thread
    /// one. With busy polling, queue runtimes of the stack's own on the cores given.
    fn placement(&self, queues: &[u32]) -> netdriver::channel::Placement {
        use netdriver::channel::{DriverPlace, Placement};
        if let Some(b) = &self.busy_poll {
            return Placement::Runtimes {
                count: Some(b.cores.len().min(queues.len()).max(1)),
                cores: Some(b.cores.clone()),
            };
        }
        let app = self
            .application_runtime
            .then(|| {
                self.runtime
                    .clone()
                    .or_else(|| tokio::runtime::Handle::try_current().ok())
            })
            .flatten()
            .filter(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let separate = self.scheduler.separate_class_threads() && self.latency_channels > 0;
        let host = netsched::QueueHost {
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            queues: queues
                .iter()
                .enumerate()
                .map(|(i, &queue)| netsched::QueueInfo {
                    queue,
                    class: (separate && queues.len() > 1).then(|| {
                        if i + 1 == queues.len() {
                            netsched::ChannelClass::Latency
                        } else {
                            netsched::ChannelClass::Throughput
                        }
                    }),
                })
                .collect(),
            application_runtime: app.is_some(),
            latency_runtime: self.latency_runtime.is_some(),
        };
        let mut places = self.scheduler.place_queues(&host);
        places.resize(queues.len(), netsched::QueuePlace::Runtime(0));
        let mut external = Vec::new();
        let places = places
            .into_iter()
            .map(|p| match (p, &app, &self.latency_runtime) {
                (netsched::QueuePlace::Application, Some(h), _) => {
                    if !external.iter().any(|(n, _)| n == APPLICATION_RUNTIME) {
                        external.push((APPLICATION_RUNTIME.to_string(), h.clone()));
                    }
                    DriverPlace::External(APPLICATION_RUNTIME.into())
                }
                (netsched::QueuePlace::LatencyApplication, _, Some(h)) => {
                    if !external.iter().any(|(n, _)| n == LATENCY_RUNTIME) {
                        external.push((LATENCY_RUNTIME.to_string(), h.clone()));
                    }
                    DriverPlace::External(LATENCY_RUNTIME.into())
                }
                (netsched::QueuePlace::Runtime(r), _, _) => {
                    DriverPlace::Runtime(u32::try_from(r).unwrap_or(0))
                }
                // A runtime the scheduler names but the stack does not have.
                _ => DriverPlace::Runtime(0),
            })
            .collect::<Vec<_>>();
        debug!(?places, cores = host.cores, "queue placement");
        Placement::Explicit {
            places,
            external,
            cores: None,
        }
    }

    /// The channel set's configuration: defaults, then the builder's settings (port,
    /// connect timeout, liveness: every channel, opened or accepted, plain-TCP ones
    /// included, gets this TCP configuration), then `configure_channels`.
    #[cfg(target_os = "linux")]
    pub(crate) fn channel_set_config(
        &mut self,
        ifname: String,
        ipv4: Ipv4Addr,
    ) -> netdriver::channel::ChannelSetConfig {
        let mut cfg = netdriver::channel::ChannelSetConfig::new(ifname, ipv4);
        cfg.channel_port = self.channel_port;
        cfg.connect_timeout = self.connect_timeout;
        if let Some(b) = &self.busy_poll {
            cfg.link.busy_poll = b.spin;
        }
        if let Some(p) = self.partial_checksums {
            cfg.partial_checksums = p;
        }
        cfg.syn_cookies = self.syn_cookies;
        if let Some(mode) = self.xdp_mode {
            cfg.link.bind = mode;
        }
        if let Some(on) = self.xdp_tx_checksum {
            cfg.link.tx_checksum_offload = on;
        }
        if !self.rss_align {
            cfg.rss = netdriver::channel::RssAlignment::Off;
        }
        cfg.link_kind = self.link;
        self.liveness.apply(&mut cfg.tcp);
        // The scheduler's placement is decided once the queues are known (after the hook,
        // which may choose them); a placement the hook sets replaces it.
        cfg.placement = unplaced();
        if let Some(f) = self.tweak.take() {
            f(&mut cfg);
        }
        cfg
    }

    /// Starts the stack on an in-memory network (no privileges): the same channel set,
    /// queue drivers and TCP as over AF_XDP, on the network's in-memory switch.
    pub fn build_in_memory(mut self, net: &MemNetwork) -> Result<Stack, StackError> {
        if let Some(e) = self.env_error.take() {
            return Err(e);
        }
        let ipv4 = self.ipv4.ok_or(StackError::Missing("ipv4"))?;
        self.check_busy_poll()?;
        let mut cfg = self.channel_set_config("mem".into(), ipv4);
        self.liveness = Liveness::of_tcp(&cfg.tcp);
        net.configure(&mut cfg);
        let queues: Vec<u32> = (0..net.queues() as u32).collect();
        if is_unplaced(&cfg.placement) {
            cfg.placement = self.placement(&queues);
        }
        self.control_runtime = first_queue_runtime(&cfg.placement);
        let set = net.start(cfg).map_err(StackError::Channels)?;
        self.start(set)
    }

    fn start(self, set: netdriver::channel::ChannelSet) -> Result<Stack, StackError> {
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
        let linger_timeout = vns.linger_timeout;
        let endpoints =
            shard_endpoints(&vns, self.scheduler, self.shards, self.latency_channels > 0)?;
        let acceptor = set
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
            auto_channels(std::thread::available_parallelism().map_or(1, usize::from))
        });
        debug!(channels, "throughput channels per peer");
        let config = CoreConfig {
            channels,
            latency_channels: self.latency_channels,
            channel_port: self.channel_port,
            backlog: self.backlog,
            connect_timeout: self.connect_timeout,
            preamble_timeout: self.preamble_timeout,
            channel_key: channel_key.clone(),
            execute_plans: self.execute_plans,
            separate_classes: endpoints[0].scheduler_separates_classes(),
            cores,
        };
        let control = Control::new(acceptor, self.preamble_timeout, channel_key, linger_timeout);
        // With the queues: a plain-TCP stream a server closes first goes to the control
        // task until the peer's FIN is in; on a runtime of its own that was a wake-up of
        // another thread per such connection.
        let home = self.control_runtime.clone().or_else(|| set.home_runtime());
        let core = Arc::new(Core::new(endpoints, set, config, control));
        core.set_self();
        match home {
            Some(h) => {
                h.spawn(ControlTask::new(core.clone()));
            }
            None => return Err(StackError::Invalid("the channel set has no runtime")),
        }
        debug!(ipv4 = %core.ipv4(), "stack started");
        Ok(Stack {
            inner: Arc::new(StackInner {
                core,
                copy_workers: self.copy_workers,
                copy,
                liveness: self.liveness,
                linger: self.linger,
            }),
        })
    }
}

/// The runtime handed to the set that drives its first queue, if the placement gives it
/// one (the application's runtime, say); `None` when that queue has a runtime of the
/// set's own.
fn first_queue_runtime(p: &netdriver::channel::Placement) -> Option<tokio::runtime::Handle> {
    match p {
        netdriver::channel::Placement::Explicit {
            places, external, ..
        } => match places.first()? {
            netdriver::channel::DriverPlace::External(name) => external
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, h)| h.clone()),
            netdriver::channel::DriverPlace::Runtime(_) => None,
        },
        _ => None,
    }
}

/// What `channel_set_config` leaves in the placement for the scheduler to decide: an
/// explicit placement of no queue, which no set could start with.
fn unplaced() -> netdriver::channel::Placement {
    netdriver::channel::Placement::Explicit {
        places: Vec::new(),
        external: Vec::new(),
        cores: None,
    }
}

/// Whether `p` is [`unplaced`]: `configure_channels` set no placement of its own.
fn is_unplaced(p: &netdriver::channel::Placement) -> bool {
    matches!(p, netdriver::channel::Placement::Explicit { places, .. } if places.is_empty())
}
