//! Channels: in-crate TCP connections with application-facing Tx and Rx queues, each NIC
//! queue owned by one driver future on a runtime its placement chooses.
//!
//! A *channel* (the NetChannel paper's unit) is one L4 connection between two hosts plus
//! two queues of opaque chunks: the application [`enqueue`](Channel::enqueue)s
//! [`Bytes`] chunks that the queue's driver hands to TCP, and
//! [`dequeue`](Channel::dequeue)s the chunks it cut from TCP's receive buffer (or
//! installs an [`RxSink`] that the driver hands them to directly). The API is the
//! paper's: create ([`ChannelSet::connect`], [`ChannelListener::accept`]), destroy
//! ([`Channel::abort`] or drop), enqueue, dequeue; plus [`Channel::stats`] for the
//! scheduler.
//!
//! # One owner per NIC queue
//!
//! [`ChannelSet::start`] attaches the steering XDP program (`xdp_prog::XdpSteering`) to
//! the interface and opens one AF_XDP [`XdpLink`](crate::link::xdp::XdpLink) per rx queue
//! ([`ChannelSet::start_on_switch`] uses the ports of an in-memory
//! [`SimSwitch`](crate::link::switch::SimSwitch) instead). With
//! [`LinkKind::Packet`] it attaches the AF_PACKET steering (`xdp_prog::PacketSteering`: a
//! socket filter and a TCX ingress drop) and opens one
//! [`PacketLink`](crate::link::packet::PacketLink) per queue, the sockets sharing the
//! interface's frames by receive queue (`packet_set.rs`). A queue's state, its
//! [`Interface`](crate::netif::Interface) and every TCP connection whose frames arrive on
//! that queue, timers included, is owned by one queue driver (`driver.rs`): a future
//! that waits on the link's readiness, on the queue's wake-up signal and on a timer at the
//! interface's next deadline, and then runs rounds until the queue is settled (bounded by
//! a work limiter). A round (`round.rs`):
//!
//! 1. takes commands (connect, listen, unlisten) and frames forwarded from other queues;
//! 2. moves chunks from each channel's Tx queue into `Connection::send`, keeping the part
//!    of a chunk that did not fit;
//! 3. `Interface::poll(now)`: receive, timers, transmit;
//! 4. hands received bytes to each channel's [`RxSink`], or moves them into its Rx queue
//!    as [`Bytes`] chunks, **stopping when the sink pauses or the Rx queue is at its
//!    limit** so that TCP's receive buffer fills and its advertised window closes: that
//!    is the backpressure from a slow reader to the remote sender;
//! 5. accepts new connections of listened ports, notices closes and errors, publishes
//!    each channel's statistics, wakes waiting users.
//!
//! Nothing else runs a queue's round: an application call that gives a queue work (an
//! enqueue, a dequeue that made room in a full Rx queue, a command) sets the queue's
//! pending flag and wakes its driver, once per burst.
//!
//! # Placement
//!
//! Which runtime drives each queue is a [`Placement`] at start and
//! [`ChannelSet::move_queue`] afterwards: queue runtimes of the set's own (a thread each,
//! running a current-thread tokio runtime, optionally pinned: the paper's disaggregated
//! mode), or a runtime handed to the set ([`ChannelSet::add_external_runtime`]: the
//! application's, so that its tasks and its queues' rounds run to completion on the same
//! threads). One runtime drives any number of queues. Moving a queue starts a driver on
//! the target runtime; the old one ends at its next poll, and the queue's state is never
//! in two drivers, so nothing is lost, duplicated or reordered. A watchdog moves a queue
//! off a runtime that leaves its work waiting (a blocked worker) and brings it back later
//! (`placement.rs`). [`ChannelSet::placement`] is a `serde` snapshot.
//!
//! ```no_run
//! # fn f(set: &netdriver::channel::ChannelSet) -> Result<(), netdriver::channel::ChannelError> {
//! use netdriver::channel::DriverPlace;
//! let r = set.add_runtime(Some(3))?;              // a queue runtime on core 3
//! set.move_queue(0, DriverPlace::Runtime(r))?;    // drives queue 0 from now on
//! println!("{}", set.placement());
//! # Ok(()) }
//! ```
//!
//! # Queues and wake-ups
//!
//! Each direction is a `crossbeam_queue::ArrayQueue<Bytes>` (bounded, lock-free, head and
//! tail on separate cache lines) plus an atomic byte counter, bounded by
//! [`ChannelSetConfig::tx_queue`] / [`ChannelSetConfig::rx_queue`]. Readiness is signalled
//! with `atomic_waker::AtomicWaker`s (one for "chunk or end of stream to dequeue", one
//! for "room to enqueue"), so one channel serves async code (`poll_dequeue`,
//! `poll_enqueue_ready`) and blocking code (`dequeue_blocking`, `enqueue_blocking`, which
//! register a waker that unparks the calling thread). There is one consumer per
//! direction: concurrent dequeuers (or enqueuers) of the same channel steal each other's
//! wake-ups.
//!
//! # Flows that arrive on another queue
//!
//! The peer picks the queue its segments arrive on (on veth: the rx queue is the sender's
//! tx queue, chosen by the sending kernel per socket, and it may change when the socket is
//! rehashed; on a NIC, RSS). A SYN-ACK or data for a connection owned by queue *q* can
//! therefore arrive on queue *r*. A shared **flow directory** maps each 4-tuple to its
//! owning queue (entries are made before a SYN leaves, or when a SYN to a listener is
//! first seen, and removed with the connection). Queue *r*'s interface asks, for every
//! segment of a flow it does not know (`Interface::poll_with`); if the directory names
//! another owner, *r* copies the frame into a pooled buffer and sends it over a bounded
//! channel to the owner (waking its driver), which feeds it to its interface
//! (`Interface::receive_frame_with`). Only segments of flows nobody owns are answered
//! with a reset. When the owner's forwarding queue is full the frame is dropped: TCP
//! retransmits.
//!
//! # Ports
//!
//! Local ports of outgoing channels come from one allocator shared by all queues, over
//! the stack's ephemeral range ([`crate::ports::EphemeralRange`], outside the kernel's),
//! so two queues never pick the same port. A connection's endpoint is claimed in the
//! steering program's map before its SYN leaves; listened ports are claimed before
//! `listen` returns.
//!
//! Where the NIC's RSS picks the receive queue, the port also decides where the peer's
//! replies land, so the set chooses it ([`ChannelSetConfig::rss`], [`crate::rss`]): a
//! free port whose replies hash to the channel's queue, or, when none is free, a port
//! whose replies land on another queue, which then owns the channel. Its frames are then
//! never forwarded. [`Channel::steering`] and [`ChannelSet::steering_counts`] say what
//! each channel got.
//!
//! # Message transports
//!
//! The application-facing contract is the [`ChannelTransport`] trait: enqueue and
//! dequeue of opaque chunks, readiness, close, abort and statistics. It does not assume a
//! byte stream. The TCP channel happens to re-cut chunks along whatever boundaries TCP
//! delivers (a [`Channel`] preserves bytes and their order, not chunk boundaries). A
//! message (datagram) transport, e.g. over UDP or a reliable-datagram protocol, would
//! implement the same trait with **one chunk = one message**: `enqueue` takes a chunk as a
//! message (refusing one larger than its maximum message size), `dequeue` returns whole
//! messages, boundaries preserved, and since the trait promises no ordering across chunks
//! it may deliver them out of order or (if unreliable) not at all. Layers above (the
//! virtual sockets' per-socket sequence numbers) already reorder, so they work unchanged.
//!
//! # Example
//!
//! ```no_run
//! # #[cfg(target_os = "linux")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::io::{Read, Write};
//! use std::time::Duration;
//! use netdriver::channel::{ChannelSet, ChannelSetConfig, ChannelStream};
//!
//! // In the network namespace of interface vB (10.77.0.2): a driver per queue.
//! let set = ChannelSet::start(ChannelSetConfig::new("vB", "10.77.0.2".parse()?))?;
//! let listener = set.listen_channels()?; // port 9000 on every queue
//!
//! // A channel to a peer's channel port, and the paper's enqueue/dequeue.
//! let channel = set.connect("10.77.0.1:9000".parse()?)?;
//! channel.enqueue(bytes::Bytes::from_static(b"hello"))
//!     .map_err(|e| e.into_error())?;
//! let reply = channel.dequeue_blocking(Some(Duration::from_secs(1)))?;
//! println!("{reply:?}, stats {:?}", channel.stats());
//!
//! // Or as a blocking byte stream.
//! let (accepted, peer) = listener.accept()?;
//! let mut stream = ChannelStream::new(accepted);
//! let mut buf = [0u8; 5];
//! stream.read_exact(&mut buf)?;
//! stream.write_all(&buf)?;
//! stream.shutdown_write()?;
//! set.shutdown(); // stops the queues, detaches the XDP program
//! # let _ = peer;
//! # Ok(())
//! # }
//! # #[cfg(not(target_os = "linux"))]
//! # fn main() {}
//! ```

use std::io;
use std::net::SocketAddrV4;
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::tcp::TcpError;
use crate::time::{Duration, Instant};

#[cfg(target_os = "linux")]
mod accept_queue;
#[cfg(target_os = "linux")]
mod attach;
#[cfg(target_os = "linux")]
mod block;
#[cfg(target_os = "linux")]
mod clock;
#[cfg(target_os = "linux")]
mod command;
#[cfg(target_os = "linux")]
mod config;
#[cfg(target_os = "linux")]
mod directory;
#[cfg(target_os = "linux")]
mod driver;
#[cfg(target_os = "linux")]
mod entry;
#[cfg(target_os = "linux")]
mod handle;
#[cfg(target_os = "linux")]
mod lazy_queue;
#[cfg(target_os = "linux")]
mod listener;
#[cfg(target_os = "linux")]
mod node_cpus;
#[cfg(target_os = "linux")]
mod packet_set;
#[cfg(target_os = "linux")]
mod place;
#[cfg(target_os = "linux")]
pub mod placement;
#[cfg(target_os = "linux")]
mod queue;
#[cfg(target_os = "linux")]
mod round;
#[cfg(target_os = "linux")]
mod set;
#[cfg(target_os = "linux")]
mod shared;
#[cfg(target_os = "linux")]
mod signal;
#[cfg(target_os = "linux")]
mod sink;
#[cfg(target_os = "linux")]
mod stats;
#[cfg(target_os = "linux")]
mod steering;
#[cfg(target_os = "linux")]
mod stray;
#[cfg(target_os = "linux")]
mod stream;
#[cfg(target_os = "linux")]
mod sys;

#[cfg(target_os = "linux")]
pub use config::{
    ChannelSetConfig, LinkKind, PartialChecksums, QueueLimits, RssAlignment, DEFAULT_CHANNEL_PORT,
    LINEAR_XDP_MAX_MTU,
};
#[cfg(target_os = "linux")]
pub use driver::ROUNDS_PER_POLL;
#[cfg(target_os = "linux")]
pub use handle::Channel;
#[cfg(target_os = "linux")]
pub use listener::ChannelListener;
#[cfg(target_os = "linux")]
pub use placement::{DriverPlace, Placement};
#[cfg(target_os = "linux")]
pub use set::{ChannelPlacement, ChannelSet, RuntimePlacement};
#[cfg(target_os = "linux")]
pub use sink::{RxFlow, RxSink};
#[cfg(target_os = "linux")]
pub use stats::{QueueStats, RxChecksumStats, SynStats};
#[cfg(target_os = "linux")]
pub use stream::ChannelStream;
#[cfg(target_os = "linux")]
pub use sys::{driver_name, is_host_local_driver, rx_queue_count, xsk_drops, XskDrops};

/// Why a channel, a listener or a channel set failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// The peer reset the connection.
    #[error("channel reset by peer")]
    Reset,
    /// The peer refused the connection (nothing listens on that port).
    #[error("channel refused by peer")]
    Refused,
    /// TCP gave up: SYN retries, the user timeout or keep-alive probes ran out.
    #[error("channel timed out: the peer stopped answering (retransmissions or keep-alive probes unacknowledged)")]
    TimedOut,
    /// The handshake did not complete within [`ChannelSetConfig::connect_timeout`].
    #[error("connect timed out after {0:?}")]
    ConnectTimeout(Duration),
    /// The channel was closed for sending by [`Channel::close`], or aborted locally.
    #[error("channel closed")]
    Closed,
    /// The channel set was shut down; its threads are gone.
    #[error("channel set shut down")]
    ShutDown,
    /// A blocking call's timeout expired.
    #[error("operation timed out")]
    WouldBlockTimeout,
    /// The peer's MAC address could not be resolved.
    #[error("resolving the peer's MAC address: {0}")]
    Neighbor(#[source] crate::neigh::NeighError),
    /// The configuration is unusable.
    #[error("invalid channel set configuration: {0}")]
    InvalidConfig(String),
    /// Every local port of the stack's range is in use.
    #[error("no free local port in the stack's ephemeral range")]
    NoFreePort,
    /// The port is already listened on by this channel set.
    #[error("port {0} is already listened on")]
    AddrInUse(u16),
    /// The interface's connection table is full.
    #[error("too many connections on the queue's interface")]
    TooManyConnections,
    /// The channel's queue died (only by fault injection, [`ChannelSet::kill_queue`]):
    /// the connection is left as it was on the wire, unserved, and the peer learns of it
    /// only by its own liveness checks.
    #[error("the channel's queue died")]
    QueueDied,
    /// No queue runtime of the set has this id (never added, or removed).
    #[error("no queue runtime {0} in the set")]
    NoSuchRuntime(u32),
    /// The set was not started on this NIC queue.
    #[error("no queue {0} in the set")]
    NoSuchQueue(u32),
    /// The set's home runtime (its first queue runtime, which hosts the watchdog and
    /// rescued queues) cannot be removed.
    #[error("queue runtime {0} is the set's home runtime")]
    HomeRuntime(u32),
    /// The process may not run on this core (not in its affinity mask, or no such core).
    #[error("core {0} is not available to this process")]
    CoreNotAllowed(usize),
    /// Attaching or updating the steering XDP program failed.
    #[cfg(target_os = "linux")]
    #[error("XDP steering: {0}")]
    Xdp(#[source] xdp_prog::XdpError),
    /// Opening an AF_XDP socket failed.
    #[cfg(target_os = "linux")]
    #[error("AF_XDP link: {0}")]
    Link(#[source] crate::link::xdp::XdpLinkError),
    /// Attaching or updating the AF_PACKET steering (socket filter, TCX ingress drop)
    /// failed.
    #[cfg(target_os = "linux")]
    #[error("AF_PACKET steering: {0}")]
    PacketSteering(#[source] xdp_prog::PacketSteeringError),
    /// Opening an AF_PACKET socket failed.
    #[cfg(target_os = "linux")]
    #[error("AF_PACKET link: {0}")]
    PacketLink(#[source] crate::link::packet::PacketLinkError),
    /// Reading the kernel's port range failed.
    #[error("ports: {0}")]
    Ports(#[source] crate::ports::PortsError),
    /// A system call (thread spawn, runtime, ioctl) failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl ChannelError {
    /// The channel error for a TCP connection's failure reason.
    pub fn from_tcp(e: TcpError) -> ChannelError {
        match e {
            TcpError::Reset => ChannelError::Reset,
            TcpError::Refused => ChannelError::Refused,
            TcpError::TimedOut => ChannelError::TimedOut,
            TcpError::Closed | TcpError::WouldBlock => ChannelError::Closed,
        }
    }

    /// The `io::ErrorKind` this error maps to.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            ChannelError::Reset => io::ErrorKind::ConnectionReset,
            ChannelError::Refused => io::ErrorKind::ConnectionRefused,
            ChannelError::TimedOut
            | ChannelError::ConnectTimeout(_)
            | ChannelError::WouldBlockTimeout => io::ErrorKind::TimedOut,
            ChannelError::Closed => io::ErrorKind::BrokenPipe,
            ChannelError::ShutDown => io::ErrorKind::NotConnected,
            ChannelError::Neighbor(_) => io::ErrorKind::HostUnreachable,
            ChannelError::InvalidConfig(_) => io::ErrorKind::InvalidInput,
            ChannelError::NoFreePort => io::ErrorKind::AddrNotAvailable,
            ChannelError::AddrInUse(_) => io::ErrorKind::AddrInUse,
            ChannelError::TooManyConnections => io::ErrorKind::OutOfMemory,
            ChannelError::QueueDied => io::ErrorKind::ConnectionAborted,
            ChannelError::NoSuchRuntime(_) | ChannelError::NoSuchQueue(_) => {
                io::ErrorKind::NotFound
            }
            ChannelError::HomeRuntime(_) | ChannelError::CoreNotAllowed(_) => {
                io::ErrorKind::InvalidInput
            }
            #[cfg(target_os = "linux")]
            ChannelError::Xdp(_)
            | ChannelError::Link(_)
            | ChannelError::PacketSteering(_)
            | ChannelError::PacketLink(_) => io::ErrorKind::Other,
            ChannelError::Ports(_) => io::ErrorKind::Other,
            ChannelError::Io { source, .. } => source.kind(),
        }
    }
}

impl From<ChannelError> for io::Error {
    fn from(e: ChannelError) -> io::Error {
        match e {
            ChannelError::Io { source, .. } => source,
            e => io::Error::new(e.kind(), e),
        }
    }
}

/// Why [`Channel::enqueue`] did not take a chunk.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// The Tx queue is at its chunk or byte limit (or a blocking enqueue timed out); the
    /// chunk is handed back.
    #[error("channel tx queue full")]
    Full(Bytes),
    /// The channel cannot send any more: closed, reset, or its set shut down. The chunk
    /// was dropped.
    #[error("channel cannot send: {0}")]
    Closed(ChannelError),
}

impl EnqueueError {
    /// The error as a [`ChannelError`] (`Full` becomes
    /// [`ChannelError::WouldBlockTimeout`]), dropping any returned chunk.
    pub fn into_error(self) -> ChannelError {
        match self {
            EnqueueError::Full(_) => ChannelError::WouldBlockTimeout,
            EnqueueError::Closed(e) => e,
        }
    }
}

impl From<EnqueueError> for io::Error {
    fn from(e: EnqueueError) -> io::Error {
        match e {
            EnqueueError::Full(_) => io::Error::new(io::ErrorKind::WouldBlock, "tx queue full"),
            EnqueueError::Closed(e) => e.into(),
        }
    }
}

/// What [`Channel::dequeue`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dequeued {
    /// A chunk of received bytes (never empty).
    Chunk(Bytes),
    /// Nothing yet; more may come.
    Empty,
    /// End of stream: the peer closed its sending direction and every byte before its FIN
    /// has been dequeued. Stays so.
    Finished,
}

/// Where a channel is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChannelState {
    /// The handshake is under way.
    Connecting,
    /// Established: data flows (one or both directions may have been closed).
    Open,
    /// The connection is gone (closed in both directions, failed, or aborted).
    Closed,
}

/// A snapshot of one channel, for schedulers and diagnostics. The TCP part is published
/// by the queue's driver after each of its rounds that touched the connection; the
/// application-queue part is read live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelStats {
    /// Bytes in the application Tx queue, not yet handed to TCP.
    pub tx_queued: usize,
    /// Bytes in TCP's send buffer (unsent plus unacknowledged).
    pub tx_tcp_queued: usize,
    /// Bytes in the application Rx queue, not yet dequeued.
    pub rx_queued: usize,
    /// Bytes in TCP's receive buffer, not yet moved to the Rx queue.
    pub rx_tcp_queued: usize,
    /// Sent but unacknowledged sequence space.
    pub bytes_in_flight: usize,
    /// Congestion window in bytes.
    pub cwnd: usize,
    /// Smoothed round-trip time, once sampled.
    pub srtt: Option<Duration>,
    /// Segments that resent data (any cause).
    pub retransmitted_segments: u64,
    /// Retransmission-timer expiries.
    pub rto_timeouts: u64,
    /// Payload bytes sent (retransmissions included).
    pub bytes_sent: u64,
    /// Payload bytes acknowledged by the peer.
    pub bytes_acked: u64,
    /// In-order payload bytes received.
    pub bytes_received: u64,
    /// When the driver took the TCP part (the set's clock); `Instant::ZERO` before the
    /// first snapshot.
    pub updated_at: Instant,
}

impl ChannelStats {
    /// Bytes queued towards the peer: application queue plus TCP send buffer.
    pub fn tx_total(&self) -> usize {
        self.tx_queued + self.tx_tcp_queued
    }

    /// Bytes received and not yet consumed: TCP receive buffer plus application queue.
    pub fn rx_total(&self) -> usize {
        self.rx_queued + self.rx_tcp_queued
    }
}

/// Where a channel's TCP connection stands on the wire: its 4-tuple, its NIC queue and
/// its sequence numbers as the queue's driver last published them (after each of its
/// rounds, so possibly a round old). For diagnostics and fault-injection tests: a test
/// that forges a RST for a channel needs the 4-tuple and RCV.NXT, since a RST is accepted
/// only at exactly RCV.NXT (RFC 5961 §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelWire {
    /// Our address of the connection.
    pub local: SocketAddrV4,
    /// The peer's address.
    pub peer: SocketAddrV4,
    /// The NIC queue (and so the queue driver) the connection lives on.
    pub queue: u32,
    /// RCV.NXT: the next sequence number expected from the peer (0 before the first
    /// snapshot).
    pub rcv_nxt: u32,
    /// SND.NXT: the next sequence number to send (0 before the first snapshot).
    pub snd_nxt: u32,
    /// When the driver published these (the set's clock; `Instant::ZERO` before the
    /// first snapshot).
    pub updated_at: Instant,
}

/// The application-facing contract of a channel: opaque chunks in, opaque chunks out.
///
/// Nothing here assumes a byte stream or an order across chunks; see the
/// [module documentation](self) for how a message transport implements it. All methods
/// take `&self` and never block (the blocking helpers of [`Channel`] are built on the
/// `poll_*` methods).
pub trait ChannelTransport: Send + Sync {
    /// Queues `chunk` for sending. `Full` hands it back when the Tx queue is at its limit.
    fn enqueue(&self, chunk: Bytes) -> Result<(), EnqueueError>;

    /// Takes the next received chunk, if any, or reports the end of the stream.
    fn dequeue(&self) -> Result<Dequeued, ChannelError>;

    /// `Ready(Ok)` once an enqueue would find room (or `Ready(Err)` once it never will);
    /// otherwise registers `cx`'s waker.
    fn poll_enqueue_ready(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>>;

    /// `Ready(Ok(Some(chunk)))`, `Ready(Ok(None))` at the end of the stream, `Ready(Err)`
    /// on failure; otherwise registers `cx`'s waker.
    fn poll_dequeue(&self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ChannelError>>;

    /// Ends the sending direction after every queued chunk.
    fn close(&self);

    /// Destroys the channel at once (TCP: a reset), dropping queued data.
    fn abort(&self);

    /// A statistics snapshot.
    fn stats(&self) -> ChannelStats;

    /// The connection on the wire, for diagnostics and fault-injection tests; `None`
    /// (the default) for transports without one (in-memory channels).
    fn wire(&self) -> Option<ChannelWire> {
        None
    }

    /// Changes TCP options of the connection under the channel (see
    /// [`Channel::set_options`]); ignored (the default) by transports without one.
    fn set_options(&self, _changes: crate::tcp::OptionChanges) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_io_kinds() {
        let kind = |e: ChannelError| io::Error::from(e).kind();
        assert_eq!(
            kind(ChannelError::from_tcp(TcpError::Reset)),
            io::ErrorKind::ConnectionReset
        );
        assert_eq!(
            kind(ChannelError::from_tcp(TcpError::Refused)),
            io::ErrorKind::ConnectionRefused
        );
        assert_eq!(
            kind(ChannelError::from_tcp(TcpError::TimedOut)),
            io::ErrorKind::TimedOut
        );
        assert_eq!(
            kind(ChannelError::ConnectTimeout(Duration::from_secs(1))),
            io::ErrorKind::TimedOut
        );
        assert_eq!(kind(ChannelError::Closed), io::ErrorKind::BrokenPipe);
        assert_eq!(kind(ChannelError::ShutDown), io::ErrorKind::NotConnected);
        let e = io::Error::from(EnqueueError::Full(Bytes::from_static(b"x")));
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn handles_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<ChannelSet>();
        send_sync::<Channel>();
        send_sync::<ChannelListener>();
        fn send<T: Send>() {}
        send::<ChannelStream>();
        // The trait is object safe.
        let _: Option<Box<dyn ChannelTransport>> = None;
    }

    #[test]
    fn totals_add_both_queues() {
        let s = ChannelStats {
            tx_queued: 3,
            tx_tcp_queued: 4,
            rx_queued: 5,
            rx_tcp_queued: 6,
            ..ChannelStats::default()
        };
        assert_eq!((s.tx_total(), s.rx_total()), (7, 11));
    }
}
