//! [`ChannelSetConfig`]: everything a channel set is started with.

use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

use tracing::{debug, info, warn};
use xdp_prog::AttachOptions;

use super::placement::Placement;
use super::queue::Limits;
use super::ChannelError;
use crate::link::packet::PacketLinkConfig;
use crate::link::xdp::XdpLinkConfig;
use crate::rss::RssConfig;
use crate::tcp;
use crate::time::Duration;

/// The paper's channel port: where channels listen unless told otherwise.
pub const DEFAULT_CHANNEL_PORT: u16 = 9000;

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
    /// Queue ids to open sockets on (one queue driver each); `None`: every rx queue
    /// of the interface (as the `ETHTOOL_GCHANNELS` ioctl reports them, see
    /// [`super::rx_queue_count`]).
    pub queues: Option<Vec<u32>>,
    /// Which link the queues run over (default [`LinkKind::Xdp`]).
    pub link_kind: LinkKind,
    /// Template of every queue's AF_XDP link (frames, batches, bind mode, busy polling);
    /// its `ifname` and `queue_id` are replaced per queue. Its batch sizes are the
    /// interfaces' with [`LinkKind::Xdp`].
    pub link: XdpLinkConfig,
    /// Template of every queue's AF_PACKET link with [`LinkKind::Packet`] (batches,
    /// socket buffers, segmentation); its `ifname` and `fanout` are replaced per queue,
    /// and its batch sizes are the interfaces'.
    pub packet_link: PacketLinkConfig,
    /// How the steering program is attached with [`LinkKind::Xdp`] (default: native with
    /// generic fallback, replacing a stale program). With `frags` off,
    /// [`ChannelSet::start`] still attaches the `xdp.frags` variant where the interface's
    /// MTU needs it (above [`LINEAR_XDP_MAX_MTU`], or links binding multi-buffer).
    pub attach: AttachOptions,
    /// Configuration of every TCP connection. [`ChannelSetConfig::new`] sets its `mss` to
    /// `u16::MAX`, which each queue's interface lowers to its link's MTU − 40: segments
    /// fill the frames the interface carries (1460 bytes at MTU 1500, 8960 at 9000),
    /// where `tcp::Config`'s own default, 1460, would leave a jumbo-frame link sending
    /// 1500-byte frames. It also sets `full_segments_per_ack` to 4 (TCP's default, RFC
    /// 5681's, is 2): a channel carries messages of a few segments whose replies usually
    /// follow at once, and with 2 the second full segment of a 4 KB message cost a pure
    /// ACK just before the reply that could carry it (7.65 frames per 4 KB
    /// request/response where 6 do). And it sets `tlp_min_pto` to 8 ms (TCP's default
    /// 2 ms): every message pushes the probe timer back, and a driver woken at each short
    /// deadline found it moved, a wake-up per message on a host with few cores. Linux
    /// adds 2 ms to a PTO and arms it in jiffies (4 ms at Debian's HZ=250), so its probes
    /// also go out after 4-8 ms; the RTO's floor stays 200 ms.
    pub tcp: tcp::Config,
    /// Disable Nagle's algorithm on channels (default true: chunks are sent as they come).
    pub nodelay: bool,
    /// The port [`ChannelSet::listen_channels`] listens on (default
    /// [`DEFAULT_CHANNEL_PORT`], 9000).
    pub channel_port: u16,
    /// Where the queues' drivers run to begin with (see [`Placement`]); the default is one
    /// queue runtime per queue, up to the cores the process may use.
    pub placement: Placement,
    /// Limits of each channel's Tx queue.
    pub tx_queue: QueueLimits,
    /// Limits of each channel's Rx queue. When it is full, the driver stops reading and
    /// TCP's window closes.
    pub rx_queue: QueueLimits,
    /// Longest wait for the kernel to resolve a peer's MAC address.
    pub neighbor_timeout: Duration,
    /// Longest wait for a handshake in [`ChannelSet::connect`].
    pub connect_timeout: Duration,
    /// Local ports of outgoing channels; `None`: the range outside the kernel's
    /// (`ports::EphemeralRange::from_kernel`).
    pub ephemeral_ports: Option<RangeInclusive<u16>>,
    /// Unaccepted connections a listener keeps (per queue, and in its accept queue).
    pub backlog: usize,
    /// Most connections per queue.
    pub max_connections: usize,
    /// Frames each queue's forwarding queue holds (see the module docs).
    pub forward_queue: usize,
    /// Whether segments with a Linux sender's partial checksum are accepted (default
    /// [`PartialChecksums::Auto`]: on veth and netkit only).
    pub partial_checksums: PartialChecksums,
    /// Answer SYNs with SYN cookies (RFC 4987) when a listener's backlog (or a queue's
    /// connection table) is full, instead of dropping them; see
    /// [`InterfaceConfig::syn_cookies`]. One secret, drawn from the OS's generator, serves
    /// every queue of the set. Default on.
    pub syn_cookies: bool,
    /// How the queue and local port of each channel the set opens are chosen so that the
    /// NIC's RSS delivers the peer's replies to the queue that owns it (default
    /// [`RssAlignment::Probe`]). See [`crate::rss`].
    pub rss: RssAlignment,
}

/// How a [`ChannelSet`](super::ChannelSet) aligns the channels it opens with the NIC's
/// receive-side scaling ([`ChannelSetConfig::rss`]).
///
/// On a NIC the receiver's RSS picks each frame's queue from the 4-tuple, and a channel is
/// served by one queue: a channel opened from an arbitrary local port gets the peer's
/// replies on an arbitrary queue, and each is forwarded to the owning one
/// ([`ChannelSet::forwarded_frames`](super::ChannelSet::forwarded_frames)). Alignment
/// chooses the local port so that the replies land on the channel's queue (or, when no
/// free port lands there, lets the queue the replies land on own the channel), with
/// [`RssAligner`](crate::rss::RssAligner). Accepted channels need nothing: the queue
/// their SYN arrived on owns them. [`ChannelSet::steering_counts`](super::ChannelSet::steering_counts)
/// and [`Channel::steering`](super::Channel::steering) report what each channel got.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RssAlignment {
    /// Read the interface's RSS when the set starts (`ETHTOOL_GRSSH`, `ETHTOOL_GRXFH`,
    /// logged): where the hash can be reproduced, ports are chosen; where it cannot, each
    /// opened channel gets an ntuple rule steering its replies to its queue where the NIC
    /// takes one (`ethtool -K IF ntuple on`), removed when the connection is gone; else
    /// its frames are forwarded. On a host-local device (veth, netkit), which has no RSS
    /// and delivers each frame on the queue its sender used, no rule is tried and
    /// channels are opened as without alignment. The default.
    #[default]
    Probe,
    /// Align to this RSS instead of the interface's (one read elsewhere, or the RSS test
    /// bed's, whose relay hashes in front of a veth); no ntuple rules.
    Known(RssConfig),
    /// No alignment (for A/B measurements): queues round robin, any free port; every
    /// opened channel is recorded as forwarded, for
    /// [`ForwardReason::AlignmentOff`](crate::rss::ForwardReason::AlignmentOff).
    Off,
}

impl ChannelSetConfig {
    /// Defaults for `ifname` with address `ipv4`: all queues, the link defaults
    /// ([`XdpLinkConfig::new`]: 4096 frames of 2 KiB, zero copy where the driver
    /// supports it and copy mode elsewhere, veth included; the UMEM on the interface's
    /// NUMA node), default TCP with the MSS the MTU allows, port 9000, one unpinned queue
    /// runtime per queue, queues of 1024 chunks / 4 MiB, 3 s neighbour and 10 s connect
    /// timeouts, RSS alignment from the interface's own RSS ([`RssAlignment::Probe`]).
    pub fn new(ifname: impl Into<String>, ipv4: Ipv4Addr) -> ChannelSetConfig {
        let ifname = ifname.into();
        ChannelSetConfig {
            link: XdpLinkConfig::new(ifname.clone(), 0),
            packet_link: PacketLinkConfig::new(ifname.clone()),
            link_kind: LinkKind::default(),
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
                // Bounded by default: a peer that opens a window of 0 and never reads
                // holds a connection and its buffers for five minutes at most (its probe
                // answers would keep it for ever, RFC 1122 §4.2.2.17).
                zero_window_limit: Some(Duration::from_secs(300)),
                // A request's ACK rides on its answer: the channel's reader says when it
                // waits (`Connection::reader_waiting`); a sink turns it off.
                reply_carries_ack: true,
                // A channel carries many streams, so its send buffer grows with the
                // flight (`tcp::Config::tx_buffer_max`), but on a µs-scale path only to
                // 1 MiB (a 100 Gbit/s path's flight at an 80 µs round trip): beyond that
                // the flight only queues at the receiver. On the two-core bed, eight
                // streams over AF_PACKET moved 17.6-18.5 Gbit/s with 1 MiB against
                // 13.8-17.7 with 4 MiB, and a latency stream beside eight bulk ones kept
                // a p99.9 of 5.9-8.3 ms against 7.7-10 ms (5.4-5.9 with the buffer fixed
                // at 256 KiB; `docs/investigations/bulk.md`, "Eight streams on one
                // channel").
                tx_buffer_max: Some(1 << 20),
                ..tcp::Config::default()
            },
            nodelay: true,
            channel_port: DEFAULT_CHANNEL_PORT,
            placement: Placement::default(),
            tx_queue: QueueLimits::default(),
            rx_queue: QueueLimits::default(),
            neighbor_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(10),
            ephemeral_ports: None,
            backlog: 128,
            max_connections: 4096,
            forward_queue: 1024,
            partial_checksums: PartialChecksums::Auto,
            syn_cookies: true,
            rss: RssAlignment::Probe,
        }
    }
}

impl ChannelSetConfig {
    /// The receive and transmit batch sizes of the queues' interfaces: the link's.
    pub(crate) fn link_batches(&self) -> (usize, usize) {
        match self.link_kind {
            LinkKind::Xdp => (self.link.rx_batch, self.link.tx_batch),
            LinkKind::Packet => (self.packet_link.rx_batch, self.packet_link.tx_frames),
        }
    }
}

/// Which link a [`ChannelSet`](super::ChannelSet)'s queues run over
/// ([`ChannelSetConfig::link_kind`]).
///
/// | | AF_XDP ([`Xdp`](LinkKind::Xdp)) | AF_PACKET ([`Packet`](LinkKind::Packet)) |
/// |---|---|---|
/// | frames | in a UMEM shared with the kernel; zero copy where the driver has it | copied by the kernel each way (once per 64 KiB super-segment) |
/// | segmentation | in software, in the link | the kernel's GSO or the NIC's TSO, through a `virtio_net_hdr` |
/// | receive coalescing | none | the kernel's GRO |
/// | steering | an XDP program; on veth it turns the peer's TSO off | a socket filter and a TCX ingress program; the interface keeps its offloads |
/// | queues | one socket per NIC queue, bound to it | one socket per queue in a `PACKET_FANOUT_QM` group; frames by receive queue, transmit on the kernel's choice |
///
/// AF_XDP is the link for NICs with zero-copy AF_XDP (the production target). AF_PACKET
/// is the link where AF_XDP must copy (veth, drivers without zero copy): there it carries
/// bulk several times faster, measured in `docs/investigations/bulk.md`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// AF_XDP sockets and the steering XDP program. The default.
    #[default]
    Xdp,
    /// AF_PACKET sockets with `PACKET_VNET_HDR` ([`PacketLink`](crate::link::packet::PacketLink)),
    /// the socket filter and TCX ingress drop of `xdp_prog::PacketSteering`.
    Packet,
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LinkKind::Xdp => "xdp",
            LinkKind::Packet => "packet",
        })
    }
}

impl std::str::FromStr for LinkKind {
    type Err = String;

    /// `xdp` (also `af_xdp`) or `packet` (also `af_packet`), in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "xdp" | "af_xdp" => Ok(LinkKind::Xdp),
            "packet" | "af_packet" => Ok(LinkKind::Packet),
            _ => Err(format!("{s:?} is not a link (xdp or packet)")),
        }
    }
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

/// Resolves [`ChannelSetConfig::partial_checksums`] for the interface, in the calling
/// thread's network namespace.
pub(crate) fn resolve_partial_checksums(config: &ChannelSetConfig) -> bool {
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
pub(crate) fn resolve_attach(config: &ChannelSetConfig) -> Result<AttachOptions, ChannelError> {
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
