//! The AF_XDP link: frames in a UMEM shared with the kernel, one socket on one rx/tx queue
//! pair of an interface (Linux only), built on this crate's own socket, UMEM and ring code
//! ([`xsk`](super::xsk)).
//!
//! An [`XdpLink`] owns a UMEM of [`XdpLinkConfig::frame_count`] frames and one AF_XDP
//! socket bound to `(ifname, queue_id)`. Half the frames belong to receive: at open they
//! all go to the fill ring, and [`Link::recv_batch`] puts every frame it consumed from the
//! rx ring straight back there, in one ring operation per batch. The other half belong to
//! transmit and live in a LIFO stack of free frames (the most recently completed frame is
//! the one most likely still in cache): [`Link::tx_batch`] pops frames and lends them to
//! the writer, [`Link::flush`] submits the written ones to the tx ring, kicks the kernel
//! with `sendto` and pushes the frames the completion ring returns back on the stack.
//! Nothing is allocated per frame: the descriptor scratch arrays are sized at open.
//! (If a [`Link::recv_batch`] callback panics, that batch's frames are not refilled and
//! the link receives into fewer frames from then on.)
//!
//! The link loads no XDP program of its own: frames only arrive once a steering program (the
//! `xdp-prog` crate's `XdpSteering`) is attached to the interface and the socket's
//! [`fd`](XdpLink::fd) is registered in its `XSKMAP` for [`queue_id`](XdpLinkConfig::queue_id).
//!
//! # Readiness
//!
//! [`Link::poll_at`] is `None`: readiness comes from the socket. A driver loop calls
//! [`XdpLink::wait_readable`], which spins on the rx ring for at most
//! [`XdpLinkConfig::busy_poll`] and then sleeps in `poll(2)`.
//!
//! # Where the frame starts in a tx buffer
//!
//! A tx buffer is lent as exactly [`TX_HEADROOM`] + [`Link::max_frame_len`] bytes starting
//! at the frame's data area (256 bytes into its UMEM chunk), and the writer says where in
//! it the frame lies; the tx descriptor points at that offset directly.
//!
//! # Checksum offload through TX metadata
//!
//! Where the kernel accepts a UMEM with TX metadata (`tx_metadata_len`, Linux 6.8+, with
//! the `XDP_UMEM_TX_METADATA_LEN` flag since 6.11) and
//! [`XdpLinkConfig::tx_checksum_offload`] is on (the default; [`TX_CHECKSUM_ENV`] for a
//! default stack), the TCP frames the link is handed with a partial checksum
//! ([`Link::tx_batch_meta`], and those it segments itself) leave with the pseudo-header
//! sum in the checksum field, as for Linux's `CHECKSUM_PARTIAL`, and a descriptor flagged
//! `XDP_TX_METADATA` whose `xsk_tx_metadata` (the 24 bytes in front of the frame, inside
//! the 256 bytes of headroom) asks for the checksum (`XDP_TXMD_FLAGS_CHECKSUM`,
//! `csum_start`, `csum_offset`): the link's own checksum pass over every byte goes. In
//! copy mode the kernel builds a `CHECKSUM_PARTIAL` skb from it, which the driver's
//! offload (or the kernel's software fallback for a device without) completes, and a
//! veth peer takes as it is; a zero-copy driver that does not advertise TX checksum
//! offload gets a UMEM registered with `XDP_UMEM_TX_SW_CSUM`, so that the kernel sums
//! in software. Multi-buffer chains carry the request on their first descriptor. Where
//! the kernel refuses TX metadata, the link sums each frame itself. [`XdpLink::tx_checksum`] (and a channel set's
//! `QueueStats::tx_checksum`) says which of the three applies and why ([`TxChecksum`]).
//!
//! # Frames larger than a UMEM frame (multi-buffer)
//!
//! A UMEM frame holds at most [`XdpLinkConfig::frame_size`] − 256 bytes of packet data
//! (1792 or 3840), so an MTU of 9000 (the production NICs') cannot fit one. The kernel
//! then hands a frame over as a *chain* of descriptors, all but the last flagged
//! `XDP_PKT_CONTD` in the descriptor's `options`, provided the socket binds with
//! `XDP_USE_SG` and the XDP program is the `xdp.frags` variant (`xdp-prog`'s
//! `AttachOptions::frags`); a 9014-byte frame arrives as 3 descriptors of 4096-byte
//! frames. [`XdpLinkConfig::multi_buffer`] chooses ([`MultiBuffer::Auto`]: exactly when the
//! interface's largest tx buffer does not fit one UMEM frame).
//!
//! - **Receive**: a single-descriptor frame is still lent straight from the UMEM, and so is
//!   a chain: [`Link::recv_batch_parts`] lends it as its parts, one slice per descriptor,
//!   where the kernel wrote them (each in its own fill-ring chunk, behind that chunk's
//!   headroom), and the stack parses the headers in the first part and copies the payload
//!   into TCP's receive ring from there. A chain whose last part has not arrived by the end
//!   of a call keeps its chunks off the fill ring until the next call completes it. A
//!   chain that grows beyond [`Link::max_frame_len`] or [`MAX_RX_CHAIN_PARTS`], or has a
//!   part outside its chunk, is dropped whole and counted
//!   ([`LinkStats::dropped_oversize`] and [`XdpLink::rx_chains_dropped`]).
//!   [`Link::recv_batch`] and [`Link::recv_batch_meta`], which lend one slice, gather a
//!   chain into a scratch buffer of [`Link::max_frame_len`] bytes first.
//! - **Transmit**: the UMEM is registered in unaligned mode
//!   (`XDP_UMEM_UNALIGNED_CHUNK_FLAG`), where a descriptor may start anywhere and run into
//!   the next chunk, and the transmit half is cut into slots of adjacent chunks, each
//!   holding one tx buffer of [`TX_HEADROOM`] + [`Link::max_frame_len`] bytes (the trait's
//!   contract). The writer writes the frame in place; it goes out as a chain of
//!   descriptors pointing into the slot one after the other, each at most a frame's
//!   capacity long, all but the last flagged `XDP_PKT_CONTD` (the first carries the
//!   checksum request, where there is one). A slot is free again once the completion ring
//!   has returned every descriptor of its frame. Chains go to the tx ring whole, never
//!   split across two ring operations.
//!
//! Neither direction copies a chain's bytes in the link. (A zero-copy driver maps the UMEM
//! for DMA page by page: a tx descriptor that crosses into a page not contiguous with its
//! own is refused, so in zero copy such a link wants huge pages.)
//!
//! # Zero copy and copy mode
//!
//! A zero-copy socket (`XDP_ZEROCOPY`) lets the NIC DMA straight into and out of the UMEM;
//! drivers without AF_XDP zero-copy support (veth among them) copy each frame between the
//! UMEM and an skb instead (`XDP_COPY`). [`BindMode::Auto`], the default, binds in zero
//! copy where the driver advertises it (its `xdp-features`,
//! [`xdp_features`]) and falls back to copy mode where
//! it does not or where the zero-copy bind fails, logging the reason and recording it:
//! [`XdpLink::binding`] says which mode the socket is bound in and, after a fallback, why
//! ([`XdpBinding::CopyFallback`], [`ZeroCopyRefusal`]). [`BindMode::ZeroCopy`] fails with
//! [`XdpLinkError::ZeroCopyUnsupported`] instead; [`BindMode::Copy`] never tries.
//! [`BindMode`] parses from `auto`, `copy` and `zerocopy` ([`BIND_MODE_ENV`] names the
//! environment variable a default stack reads it from).
//!
//! In copy mode the kernel sends tx frames only from within the `sendto` kick, at most 32
//! per call, so [`flush`](Link::flush) kicks until the tx ring is drained; a zero-copy
//! socket is kicked only when the kernel asks (`XDP_USE_NEED_WAKEUP`).

use core::ops::Range;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use tracing::{debug, info, warn};

use super::offload::{complete_checksum, Segmenter};
use super::umem_memory::{
    huge_pages_free, interface_numa_node, page_nodes, HugePages, HugePagesRefusal, NumaNode,
    PreferNode, UmemPlacement,
};
pub use super::xdp_bind::{
    BindMode, ParseBindModeError, XdpBinding, ZeroCopyRefusal, BIND_MODE_ENV,
};
use super::xdp_checksum::checksum_request;
pub use super::xdp_checksum::{SoftwareChecksum, TxChecksum, TX_CHECKSUM_ENV};
use super::xdp_features::xdp_features;
pub use super::xdp_rx_chain::MAX_RX_CHAIN_PARTS;
use super::xdp_rx_chain::{read_frames, RxChainCounts, RxLimits};
use super::xsk::sys::{XDP_PKT_CONTD, XDP_TX_METADATA};
use super::xsk::umem::data_addr;
pub use super::xsk::XskStatistics;
use super::xsk::{TxMetadataRequest, Umem, XdpDesc, XskError, XskOptions, XskSocket};
use super::{
    tx_range_ok, FrameWriter, Link, LinkStats, Offloads, PartialChecksum, RxMeta,
    ETHERNET_HEADER_LEN, MAX_SUPER_FRAME_LEN, TX_HEADROOM,
};
use crate::time::Instant;

/// The headroom the kernel keeps in front of every received frame for the XDP program
/// (`XDP_PACKET_HEADROOM`); a tx frame's data area starts as far into its chunk, which
/// leaves room for the TX metadata in front of it.
const XDP_PACKET_HEADROOM: u32 = 256;

/// The most frames one copy-mode `sendto` sends by default (the kernel's `TX_BATCH_SIZE`),
/// and the least [`XdpLinkConfig::tx_skb_budget`] may ask.
const COPY_MODE_TX_PER_KICK: usize = 32;

/// The most descriptors a chain may have: the kernel builds a transmitted chain into an skb
/// of at most `MAX_SKB_FRAGS` (17) fragments and refuses longer ones; one is kept spare.
pub const MAX_CHAIN_DESCRIPTORS: usize = 16;

/// Whether frames may span several UMEM frames (see the
/// [module documentation](self#frames-larger-than-a-umem-frame-multi-buffer)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MultiBuffer {
    /// On exactly when [`TX_HEADROOM`] + the interface's largest frame does not fit one UMEM
    /// frame (an MTU above 3506 with 4096-byte frames, above 1458 with 2048-byte ones).
    #[default]
    Auto,
    /// Never: opening fails with [`XdpLinkError::FrameTooSmall`] when a frame cannot fit.
    Off,
    /// Always bind with `XDP_USE_SG` (chains are then received even when frames fit).
    On,
}

/// Settings of an [`XdpLink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdpLinkConfig {
    /// The interface, in the calling thread's network namespace.
    pub ifname: String,
    /// The rx/tx queue pair the socket binds to.
    pub queue_id: u32,
    /// Frames in the UMEM, a power of two of at least 64: half for receive (all on the
    /// fill ring), half for transmit.
    pub frame_count: u32,
    /// Bytes per UMEM frame: 2048 or 4096 (a power of two the kernel accepts in aligned
    /// mode). After the kernel's 256 bytes of XDP headroom it must hold [`TX_HEADROOM`] +
    /// the interface's MTU + 14.
    pub frame_size: u32,
    /// The most frames one [`Link::recv_batch`] call consumes (the size of its descriptor
    /// scratch array).
    pub rx_batch: usize,
    /// The most frames one [`Link::flush`] reclaims from the completion ring per ring
    /// operation (the size of its descriptor scratch array).
    pub tx_batch: usize,
    /// Zero copy, copy, or zero copy where the driver supports it.
    pub bind: BindMode,
    /// Bind with `XDP_USE_NEED_WAKEUP`: the kernel says when it needs a kick, sparing
    /// system calls when it is already busy.
    pub need_wakeup: bool,
    /// How long [`XdpLink::wait_readable`] spins on the rx ring before sleeping in
    /// `poll(2)`. Zero never spins.
    pub busy_poll: Duration,
    /// Multi-buffer (descriptor chains, `XDP_USE_SG`) on, off, or as the MTU needs. With it
    /// on, the steering program must be the `xdp.frags` variant.
    pub multi_buffer: MultiBuffer,
    /// The NUMA node the UMEM's pages are placed on (see [`super::umem_memory`]): by
    /// default the interface's, when the kernel names one.
    pub numa_node: NumaNode,
    /// Whether the UMEM uses huge pages: by default when enough are free (see
    /// [`super::umem_memory`]).
    pub huge_pages: HugePages,
    /// Segmentation and checksums in the link ([`Link::offloads`]): the stack hands over
    /// super-segments of up to 64 KiB and leaves TCP checksums to the link, which cuts
    /// each into MTU-sized frames straight into UMEM frames, summing each frame as it is
    /// written (software GSO, as Linux's `tcp_gso_segment` at the latest point before the
    /// device). The stack's per-segment work (headers, timers, loss records, the ring
    /// slot) is then paid once per super-segment; the kernel's per-frame copy-mode work
    /// is not changed by it. Only for frames that fit one UMEM frame (no multi-buffer).
    /// On by default: one connection to a kernel peer on the 2-core veth bed gained 4–13 %
    /// in every same-run round (e.g. 4.51 → 4.86 Gbit/s median of five;
    /// `benches/packet_goodput.rs`, `docs/investigations/bulk.md`).
    pub segmentation: bool,
    /// Copy mode: the most frames one `sendto` kick sends (`XDP_MAX_TX_SKB_BUDGET`, Linux
    /// 6.17+), clamped to 32..=the tx ring's size; 0 asks for the ring's size. Older
    /// kernels refuse the option and keep their 32 ([`XdpLink::tx_skb_budget`] says which
    /// applies). Fewer kicks per frame sent: a `sendto` costs a system call and the
    /// kernel's per-call work (mutex, ring reads) on top of the per-frame skb.
    pub tx_skb_budget: u32,
    /// How long [`XdpLink::open`] keeps retrying a bind that fails with `EBUSY`. The
    /// kernel releases a closed AF_XDP socket's hold on its queue from a work queue, so a
    /// socket bound right after another on the same queue closed (a restart, a set
    /// started again after a failed start) can see the queue busy for a few
    /// milliseconds. Zero fails at once.
    pub busy_retry: Duration,
    /// Ask the kernel (or the device) to complete the TCP checksums of transmitted frames
    /// through TX metadata where it accepts it, rather than summing every frame in the
    /// link (see the [module documentation](self#checksum-offload-through-tx-metadata)).
    /// On by default; [`TX_CHECKSUM_ENV`] for a default stack.
    pub tx_checksum_offload: bool,
}

impl XdpLinkConfig {
    /// Defaults for `ifname` queue `queue_id`: 4096 frames of 2048 bytes, batches of 64,
    /// zero copy where the driver supports it (else copy mode), need-wakeup on, no busy
    /// polling, multi-buffer as the MTU needs, the UMEM on the interface's NUMA node and
    /// in huge pages when enough are free, segmentation in the link, the largest
    /// copy-mode budget per kick the kernel allows, checksums through TX metadata where
    /// the kernel accepts it.
    pub fn new(ifname: impl Into<String>, queue_id: u32) -> XdpLinkConfig {
        XdpLinkConfig {
            ifname: ifname.into(),
            queue_id,
            frame_count: 4096,
            frame_size: 2048,
            rx_batch: 64,
            tx_batch: 64,
            bind: BindMode::Auto,
            need_wakeup: true,
            busy_poll: Duration::ZERO,
            multi_buffer: MultiBuffer::Auto,
            numa_node: NumaNode::Interface,
            huge_pages: HugePages::Auto,
            segmentation: true,
            tx_skb_budget: 0,
            busy_retry: Duration::from_secs(2),
            tx_checksum_offload: true,
        }
    }
}

impl XdpLinkConfig {
    /// For an interface of `mtu`: whether a tx frame needs a chain of UMEM frames, and
    /// whether the socket binds with `XDP_USE_SG` ([`multi_buffer`](Self::multi_buffer)).
    fn chains_for(&self, mtu: usize) -> (bool, bool) {
        let capacity = self.frame_size.saturating_sub(XDP_PACKET_HEADROOM) as usize;
        let tx_chains = capacity < TX_HEADROOM + mtu + ETHERNET_HEADER_LEN;
        let multi_buffer = match self.multi_buffer {
            MultiBuffer::Off => false,
            MultiBuffer::On => true,
            MultiBuffer::Auto => tx_chains,
        };
        (tx_chains, multi_buffer)
    }

    /// Whether [`XdpLink::open`] with this configuration binds with `XDP_USE_SG` on
    /// [`ifname`](Self::ifname) as its MTU is now (read in the calling thread's network
    /// namespace). A steering program must then be the `xdp.frags` variant, so that a
    /// loader can choose it before the links open.
    pub fn binds_multi_buffer(&self) -> Result<bool, XdpLinkError> {
        Ok(self.chains_for(interface_mtu(&self.ifname)?).1)
    }
}

/// The MTU of `ifname` in the calling thread's network namespace (`SIOCGIFMTU`).
pub fn mtu_of(ifname: &str) -> Result<usize, XdpLinkError> {
    interface_mtu(ifname)
}

/// Why an [`XdpLink`] could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum XdpLinkError {
    /// The interface does not exist in the calling thread's network namespace.
    #[error("no network interface named {ifname:?} in this network namespace")]
    NoSuchInterface {
        /// The name asked for.
        ifname: String,
    },
    /// Creating AF_XDP sockets needs CAP_NET_RAW (and registering a UMEM may need
    /// CAP_IPC_LOCK or a raised RLIMIT_MEMLOCK).
    #[error("{op}: operation not permitted (AF_XDP needs CAP_NET_RAW; run as root)")]
    NotPermitted {
        /// What was being done.
        op: &'static str,
    },
    /// The driver refused a zero-copy bind ([`BindMode::ZeroCopy`]).
    #[error(
        "interface {ifname:?}: this driver (e.g. veth) supports AF_XDP only in copy mode \
         (zero-copy bind: EOPNOTSUPP); use BindMode::Auto or BindMode::Copy"
    )]
    ZeroCopyUnsupported {
        /// The interface.
        ifname: String,
    },
    /// The settings are inconsistent.
    #[error("invalid AF_XDP link configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// A frame cannot hold the headroom plus the largest frame of the interface.
    #[error(
        "UMEM frames of {frame_size} bytes leave {capacity} bytes after the XDP headroom, \
         but {needed} are needed (TX_HEADROOM + MTU {mtu} + 14) and multi-buffer is off; \
         use 4096-byte frames, a smaller MTU, or MultiBuffer::Auto"
    )]
    FrameTooSmall {
        /// [`XdpLinkConfig::frame_size`].
        frame_size: u32,
        /// Bytes of a frame's data area.
        capacity: usize,
        /// Bytes a tx buffer needs.
        needed: usize,
        /// The interface's MTU.
        mtu: usize,
    },
    /// Even with multi-buffer, the interface's largest frame needs more descriptors than a
    /// chain may have.
    #[error(
        "MTU {mtu} needs chains of {descriptors} descriptors of {capacity} bytes, more than \
         the {max} the kernel accepts; use 4096-byte frames or a smaller MTU"
    )]
    MtuTooLarge {
        /// The interface's MTU.
        mtu: usize,
        /// Bytes of a frame's data area.
        capacity: usize,
        /// Descriptors the largest frame would need.
        descriptors: usize,
        /// [`MAX_CHAIN_DESCRIPTORS`].
        max: usize,
    },
    /// Mapping the UMEM failed.
    #[error("creating the UMEM: {0}")]
    Umem(#[source] io::Error),
    /// [`HugePages::Require`], and the UMEM cannot have them.
    #[error(
        "interface {ifname:?} queue {queue_id}: huge pages required for the UMEM, but {reason}"
    )]
    HugePages {
        /// The interface.
        ifname: String,
        /// The queue.
        queue_id: u32,
        /// Why not.
        reason: HugePagesRefusal,
    },
    /// [`NumaNode::Node`] names a node the memory policy cannot prefer.
    #[error("placing the UMEM on NUMA node {node}: {source}")]
    NumaNode {
        /// The node.
        node: u32,
        /// The kernel's error (`EINVAL`: no such node).
        #[source]
        source: io::Error,
    },
    /// Creating or binding the socket failed.
    #[error("binding an AF_XDP socket to {ifname:?} queue {queue_id}: {source}")]
    Socket {
        /// The interface.
        ifname: String,
        /// The queue.
        queue_id: u32,
        /// The step that failed and the kernel's error.
        #[source]
        source: XskError,
    },
    /// A system call other than the above failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
}

/// Where the UMEM's memory comes from, decided once per open.
#[derive(Debug, Clone, Copy)]
struct UmemPlan {
    /// The node to prefer while the UMEM is allocated.
    node: Option<u32>,
    /// Try huge pages.
    huge: bool,
    /// Fail rather than fall back to normal pages ([`HugePages::Require`]).
    require_huge: bool,
}

/// A socket bound by [`bind_socket`], with its UMEM.
struct Bound {
    umem: Umem,
    sock: XskSocket,
    /// The UMEM is in huge pages.
    huge: bool,
    /// Huge pages were planned but the mapping failed: the kernel's error.
    huge_refused: Option<i32>,
}

/// The UMEM (on `plan`'s node, in huge pages if it says so and the kernel agrees).
fn create_umem(config: &XdpLinkConfig, plan: UmemPlan) -> Result<(Umem, bool), XdpLinkError> {
    // MAP_POPULATE allocates every page inside the mapping call, by this thread: its
    // memory policy places them (see `umem_memory`).
    let _policy = match plan.node {
        Some(node) => {
            PreferNode::set(node).map_err(|source| XdpLinkError::NumaNode { node, source })?
        }
        None => None,
    };
    if plan.huge {
        // A failure is the caller's to handle (wait for pages the kernel is releasing, or
        // fall back to normal pages).
        return match Umem::new(config.frame_count, config.frame_size, true) {
            Ok(umem) => Ok((umem, true)),
            Err(e) => Err(XdpLinkError::HugePages {
                ifname: config.ifname.clone(),
                queue_id: config.queue_id,
                reason: HugePagesRefusal::Mapping {
                    errno: e.raw_os_error().unwrap_or(0),
                },
            }),
        };
    }
    let umem = Umem::new(config.frame_count, config.frame_size, false).map_err(|e| {
        match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => XdpLinkError::NotPermitted {
                op: "creating the UMEM",
            },
            _ => XdpLinkError::Umem(e),
        }
    })?;
    Ok((umem, false))
}

/// What one bind asks for beyond the link's configuration.
#[derive(Debug, Clone, Copy)]
struct BindTry {
    /// Frames are half the UMEM each way; every ring has this many entries.
    half: u32,
    multi_buffer: bool,
    zero_copy: bool,
    metadata: TxMetadataRequest,
    /// Unaligned mode: tx frames span adjacent chunks (multi-buffer chains in place).
    unaligned: bool,
}

/// The UMEM and a socket bound to `(config.ifname, config.queue_id)`: one try.
fn bind_socket(config: &XdpLinkConfig, t: BindTry, plan: UmemPlan) -> Result<Bound, XdpLinkError> {
    let ifindex = nix::net::if_::if_nametoindex(config.ifname.as_str()).map_err(|_| {
        XdpLinkError::NoSuchInterface {
            ifname: config.ifname.clone(),
        }
    })?;
    let (umem, huge) = create_umem(config, plan)?;
    let mut bind_flags = if t.zero_copy {
        libc::XDP_ZEROCOPY
    } else {
        libc::XDP_COPY
    };
    if config.need_wakeup {
        bind_flags |= libc::XDP_USE_NEED_WAKEUP;
    }
    if t.multi_buffer {
        bind_flags |= libc::XDP_USE_SG;
    }
    let opened = XskSocket::open(
        &umem,
        XskOptions {
            ifindex,
            queue_id: config.queue_id,
            ring_size: t.half,
            bind_flags,
            metadata: t.metadata,
            unaligned: t.unaligned,
        },
    );
    let sock = opened.map_err(|e| match e.errno() {
        Some(libc::EPERM) | Some(libc::EACCES) => XdpLinkError::NotPermitted {
            op: "creating an AF_XDP socket",
        },
        Some(libc::EOPNOTSUPP) if t.zero_copy => XdpLinkError::ZeroCopyUnsupported {
            ifname: config.ifname.clone(),
        },
        Some(libc::ENODEV) => XdpLinkError::NoSuchInterface {
            ifname: config.ifname.clone(),
        },
        _ => XdpLinkError::Socket {
            ifname: config.ifname.clone(),
            queue_id: config.queue_id,
            source: e,
        },
    })?;
    Ok(Bound {
        umem,
        sock,
        huge,
        huge_refused: None,
    })
}

/// Decides the UMEM's node and page size from `config`, and the placement to report.
fn umem_plan(config: &XdpLinkConfig) -> (UmemPlan, UmemPlacement) {
    let bytes = config.frame_count as usize * config.frame_size as usize;
    let node = match config.numa_node {
        NumaNode::Interface => interface_numa_node(&config.ifname),
        NumaNode::Node(n) => Some(n),
        NumaNode::Any => None,
    };
    let (huge, refused) = match config.huge_pages {
        HugePages::Off => (false, None),
        HugePages::Auto | HugePages::Require => match huge_pages_free() {
            None => (
                false,
                Some(HugePagesRefusal::TooFewFree { needed: 1, free: 0 }),
            ),
            Some((size, _)) if size == 0 || bytes % size != 0 => (
                false,
                Some(HugePagesRefusal::NotAMultiple { huge_page: size }),
            ),
            Some((size, free)) => {
                let needed = (bytes / size) as u64;
                if free < needed {
                    (false, Some(HugePagesRefusal::TooFewFree { needed, free }))
                } else {
                    (true, None)
                }
            }
        },
    };
    let require_huge = config.huge_pages == HugePages::Require;
    (
        UmemPlan {
            node,
            huge,
            require_huge,
        },
        UmemPlacement {
            bytes,
            node,
            huge_pages: false,
            huge_pages_refused: refused,
        },
    )
}

/// [`bind_socket`], retried while the queue is busy (see
/// [`XdpLinkConfig::busy_retry`]). Both the UMEM and the socket are made afresh on each
/// try.
fn bind_retrying(
    config: &XdpLinkConfig,
    t: BindTry,
    plan: UmemPlan,
) -> Result<Bound, XdpLinkError> {
    let deadline = std::time::Instant::now() + config.busy_retry;
    let mut pause = Duration::from_millis(2);
    let mut plan = plan;
    let mut huge_refused = None;
    loop {
        match bind_socket(config, t, plan) {
            Err(XdpLinkError::Socket { source, .. })
                if source.errno() == Some(libc::EBUSY) && std::time::Instant::now() < deadline =>
            {
                debug!(
                    ifname = %config.ifname,
                    queue = config.queue_id,
                    "queue busy (a socket released it just now?); retrying the bind"
                );
            }
            // The pool had the pages when the plan was made: a UMEM of a socket closed
            // just now (an earlier try's, a restart's) holds them until the kernel's
            // deferred release.
            Err(XdpLinkError::HugePages {
                reason: HugePagesRefusal::Mapping { errno },
                ..
            }) if errno == libc::ENOMEM && std::time::Instant::now() < deadline => {
                debug!(
                    ifname = %config.ifname,
                    queue = config.queue_id,
                    "no huge pages free yet (a UMEM being released?); retrying"
                );
            }
            Err(XdpLinkError::HugePages {
                reason: HugePagesRefusal::Mapping { errno },
                ..
            }) if !plan.require_huge => {
                plan.huge = false;
                huge_refused = Some(errno);
                continue;
            }
            Ok(mut bound) => {
                bound.huge_refused = huge_refused;
                return Ok(bound);
            }
            Err(e) => return Err(e),
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// The kernel's error when a zero-copy bind failed in a way copy mode may not: the
/// driver has no zero copy (`EOPNOTSUPP`), or refuses this configuration for it (`EINVAL`:
/// e.g. a frame size or multi-buffer its zero-copy path does not take). `None` for
/// errors copy mode would meet as well (permissions, no interface, a busy queue).
fn zero_copy_refusal(e: &XdpLinkError) -> Option<i32> {
    match e {
        XdpLinkError::ZeroCopyUnsupported { .. } => Some(libc::EOPNOTSUPP),
        XdpLinkError::Socket { source, .. } => match source.errno() {
            Some(errno @ (libc::EINVAL | libc::EOPNOTSUPP)) => Some(errno),
            _ => None,
        },
        _ => None,
    }
}

/// An AF_XDP socket on one queue of an interface, with its own UMEM. See the
/// [module documentation](self).
#[derive(Debug)]
pub struct XdpLink {
    config: XdpLinkConfig,
    /// The mode the socket is bound in.
    binding: XdpBinding,
    /// Where the UMEM lives.
    placement: UmemPlacement,
    /// The address of the UMEM's first byte (for [`XdpLink::umem_page_nodes`]).
    umem_base: usize,
    mtu: usize,
    /// The socket and its rings (dropped before the UMEM they point into).
    sock: XskSocket,
    umem: Umem,
    /// Free tx frames (their chunks' addresses), used as a stack.
    free: Vec<u64>,
    /// Written tx frames not yet on the tx ring.
    staged: Vec<XdpDesc>,
    /// Tx frames on the tx ring or in the kernel, not yet completed.
    in_flight: usize,
    /// Frames set aside for transmit (free + staged + in flight).
    tx_frames: usize,
    tx_ring_size: u32,
    /// Scratch for rx ring reads.
    rx_scratch: Vec<XdpDesc>,
    /// Scratch for completion ring reads, and for the chunks `refill` hands back.
    comp_scratch: Vec<u64>,
    fill_scratch: Vec<u64>,
    /// Received frames the fill ring had no room for (never expected; kept for safety).
    fill_backlog: Vec<u64>,
    stats: LinkStats,
    /// Bytes of packet data one UMEM frame holds.
    capacity: usize,
    /// Bound with `XDP_USE_SG`: received frames may come as chains.
    multi_buffer: bool,
    /// Descriptors at the front of `rx_scratch` that begin a chain whose last part had
    /// not arrived by the end of the previous [`Link::recv_batch_parts`] call: their chunks
    /// are held off the fill ring until it does.
    rx_pending: usize,
    /// The chain being received is being dropped; its remaining parts are skipped.
    rx_dropping: bool,
    /// Where [`Link::recv_batch`] gathers a chain for callers that take one slice.
    rx_chain_buf: Vec<u8>,
    /// When one UMEM frame cannot hold a tx buffer: the slots of adjacent chunks tx
    /// frames are written in (`None` otherwise).
    tx_slots: Option<TxSlots>,
    chain_stats: ChainStats,
    /// Frames one copy-mode kick sends (`XDP_MAX_TX_SKB_BUDGET`, or the kernel's 32).
    tx_skb_budget: usize,
    /// With [`XdpLinkConfig::segmentation`]: where a writer puts a frame that may be a
    /// super-segment, before it is cut into UMEM frames (empty otherwise).
    tx_super_buf: Vec<u8>,
    /// Super-segments cut into frames.
    tx_super_segments: u64,
    /// Who completes transmitted TCP checksums.
    tx_checksum: TxChecksum,
}

/// The transmit half of an unaligned UMEM cut into slots of adjacent chunks, each holding
/// one tx buffer, sent as a chain of descriptors that point into it.
#[derive(Debug)]
struct TxSlots {
    /// The first slot's address.
    base: u64,
    /// Bytes per slot (whole chunks).
    bytes: u64,
    /// Descriptors of each slot's frame the kernel has not completed yet.
    parts_left: Vec<u16>,
}

impl TxSlots {
    /// The slot an address of one of its descriptors lies in, by index.
    fn index_of(&self, addr: u64) -> Option<usize> {
        let i = (addr.checked_sub(self.base)? / self.bytes) as usize;
        (i < self.parts_left.len()).then_some(i)
    }
}

/// Counters of multi-buffer chains.
#[derive(Debug, Clone, Copy, Default)]
struct ChainStats {
    rx_chains: u64,
    rx_chains_dropped: u64,
    tx_chains: u64,
}

impl XdpLink {
    /// Creates the UMEM and the socket and binds it to `(config.ifname, config.queue_id)`
    /// in the calling thread's network namespace; half the frames go to the fill ring.
    pub fn open(config: XdpLinkConfig) -> Result<XdpLink, XdpLinkError> {
        let invalid = |reason: String| Err(XdpLinkError::InvalidConfig { reason });
        if !config.frame_count.is_power_of_two() || config.frame_count < 64 {
            return invalid(format!(
                "frame_count {} is not a power of two of at least 64",
                config.frame_count
            ));
        }
        if config.frame_size != 2048 && config.frame_size != 4096 {
            return invalid(format!(
                "frame_size {} is neither 2048 nor 4096",
                config.frame_size
            ));
        }
        if config.rx_batch == 0 || config.tx_batch == 0 {
            return invalid("rx_batch and tx_batch must be at least 1".into());
        }
        let mtu = interface_mtu(&config.ifname)?;
        let capacity = (config.frame_size - XDP_PACKET_HEADROOM) as usize;
        let (tx_chains, multi_buffer) = config.chains_for(mtu);
        let needed = TX_HEADROOM + mtu + ETHERNET_HEADER_LEN;
        if tx_chains && !multi_buffer {
            return Err(XdpLinkError::FrameTooSmall {
                frame_size: config.frame_size,
                capacity,
                needed,
                mtu,
            });
        }
        let descriptors = (mtu + ETHERNET_HEADER_LEN).div_ceil(capacity);
        if multi_buffer && descriptors > MAX_CHAIN_DESCRIPTORS {
            return Err(XdpLinkError::MtuTooLarge {
                mtu,
                capacity,
                descriptors,
                max: MAX_CHAIN_DESCRIPTORS,
            });
        }

        let half = config.frame_count / 2;
        let (plan, mut placement) = umem_plan(&config);
        if config.huge_pages == HugePages::Require && !plan.huge {
            if let Some(reason) = placement.huge_pages_refused {
                return Err(XdpLinkError::HugePages {
                    ifname: config.ifname.clone(),
                    queue_id: config.queue_id,
                    reason,
                });
            }
        }
        // What the driver advertises, where a zero-copy bind may be tried.
        let features = match config.bind {
            BindMode::Copy => None,
            _ => Some(xdp_features(&config.ifname)),
        };
        // A driver that does not say it offloads checksums in zero copy gets the kernel's
        // software fallback.
        let driver_csum = matches!(&features, Some(Ok(f)) if f.tx_checksum());
        let tx_meta = config.tx_checksum_offload;
        let try_with = |zero_copy: bool| BindTry {
            half,
            multi_buffer,
            zero_copy,
            unaligned: tx_chains,
            metadata: if tx_meta {
                TxMetadataRequest::Metadata {
                    sw_csum: zero_copy && !driver_csum,
                }
            } else {
                TxMetadataRequest::None
            },
        };
        // Auto: zero copy first; a refusal costs one UMEM made and dropped, then copy
        // mode from scratch.
        let (binding, bound) = match config.bind {
            BindMode::Copy => (
                XdpBinding::Copy,
                bind_retrying(&config, try_with(false), plan)?,
            ),
            BindMode::ZeroCopy => (
                XdpBinding::ZeroCopy,
                bind_retrying(&config, try_with(true), plan)?,
            ),
            BindMode::Auto => {
                // Ask the driver first: a doomed zero-copy bind costs a UMEM the kernel
                // releases only later (see `xdp_features`). Kernels without the netdev
                // family (before 6.3) get the bind tried.
                let advertised = match &features {
                    Some(Ok(f)) => f.zero_copy(),
                    Some(Err(e)) => {
                        debug!(ifname = %config.ifname, error = %e, "no xdp-features; trying a zero-copy bind");
                        true
                    }
                    None => false,
                };
                let refused = if advertised {
                    match bind_retrying(&config, try_with(true), plan) {
                        Ok(bound) => Ok(bound),
                        Err(e) => match zero_copy_refusal(&e) {
                            Some(errno) => {
                                info!(
                                    ifname = %config.ifname,
                                    queue = config.queue_id,
                                    reason = %e,
                                    "AF_XDP zero-copy bind refused; binding in copy mode"
                                );
                                Err(ZeroCopyRefusal::Bind { errno })
                            }
                            None => return Err(e),
                        },
                    }
                } else {
                    info!(
                        ifname = %config.ifname,
                        queue = config.queue_id,
                        "the driver does not advertise AF_XDP zero copy; binding in copy mode"
                    );
                    Err(ZeroCopyRefusal::NotAdvertised)
                };
                match refused {
                    Ok(bound) => (XdpBinding::ZeroCopy, bound),
                    Err(reason) => (
                        XdpBinding::CopyFallback { reason },
                        bind_retrying(&config, try_with(false), plan)?,
                    ),
                }
            }
        };
        let Bound {
            umem,
            mut sock,
            huge,
            huge_refused,
        } = bound;
        placement.huge_pages = huge;
        if let Some(errno) = huge_refused {
            placement.huge_pages_refused = Some(HugePagesRefusal::Mapping { errno });
        }
        if let Some(why) = placement.huge_pages_refused {
            match why {
                HugePagesRefusal::TooFewFree { free: 0, .. } => {
                    debug!(ifname = %config.ifname, queue = config.queue_id, reason = %why, "UMEM in normal pages")
                }
                _ => {
                    info!(ifname = %config.ifname, queue = config.queue_id, reason = %why, "UMEM in normal pages")
                }
            }
        }
        let umem_base = umem.base() as usize;
        let tx_checksum = match sock.metadata {
            Ok(TxMetadataRequest::Metadata { sw_csum: false }) => TxChecksum::Offload,
            Ok(TxMetadataRequest::Metadata { sw_csum: true }) => TxChecksum::KernelSoftware,
            Ok(TxMetadataRequest::None) => TxChecksum::Software {
                reason: SoftwareChecksum::Off,
            },
            Err(errno) => {
                info!(
                    ifname = %config.ifname,
                    queue = config.queue_id,
                    error = %io::Error::from_raw_os_error(errno),
                    "the kernel refused a UMEM with TX metadata; the link sums its frames"
                );
                TxChecksum::Software {
                    reason: SoftwareChecksum::Refused { errno },
                }
            }
        };

        // Chunks [half..] are for transmit, [..half] go to the fill ring. Frames that need
        // chains are written in place across slots of adjacent chunks.
        let chunk = u64::from(config.frame_size);
        let fill: Vec<u64> = (0..u64::from(half)).map(|i| i * chunk).collect();
        let tx_base = u64::from(half) * chunk;
        let (free, tx_slots) = if tx_chains {
            let bytes = (u64::from(XDP_PACKET_HEADROOM) + needed as u64).div_ceil(chunk) * chunk;
            let count = (u64::from(half) * chunk / bytes) as usize;
            let free: Vec<u64> = (0..count as u64).map(|i| tx_base + i * bytes).collect();
            let slots = TxSlots {
                base: tx_base,
                bytes,
                parts_left: vec![0; count],
            };
            (free, Some(slots))
        } else {
            let free: Vec<u64> = (u64::from(half)..u64::from(config.frame_count))
                .map(|i| i * chunk)
                .collect();
            (free, None)
        };
        let filled = sock.fill.produce(&fill);
        if filled != fill.len() {
            return invalid(format!(
                "the fill ring took {filled} of {} frames",
                fill.len()
            ));
        }
        let tx_frames = free.len();
        debug!(
            ifname = %config.ifname,
            queue = config.queue_id,
            frames = config.frame_count,
            frame_size = config.frame_size,
            mtu,
            bind = %binding,
            tx_checksum = %tx_checksum,
            multi_buffer,
            umem_bytes = placement.bytes,
            huge_pages = placement.huge_pages,
            numa_node = ?placement.node,
            "AF_XDP link open"
        );
        let max_frame_len = mtu + ETHERNET_HEADER_LEN;
        let tx_skb_budget = if binding.is_zero_copy() {
            COPY_MODE_TX_PER_KICK
        } else {
            raise_tx_skb_budget(&sock, config.tx_skb_budget, half)
        };
        Ok(XdpLink {
            binding,
            placement,
            umem_base,
            mtu,
            sock,
            umem,
            staged: Vec::with_capacity(half as usize),
            in_flight: 0,
            tx_frames,
            tx_ring_size: half,
            // Room for a chain held over from the previous batch in front of a full batch.
            rx_scratch: vec![XdpDesc::default(); config.rx_batch + MAX_RX_CHAIN_PARTS],
            comp_scratch: vec![0; config.tx_batch],
            fill_scratch: Vec::with_capacity(config.rx_batch),
            fill_backlog: Vec::with_capacity(half as usize),
            free,
            stats: LinkStats::default(),
            capacity,
            multi_buffer,
            rx_pending: 0,
            rx_dropping: false,
            rx_chain_buf: if multi_buffer {
                Vec::with_capacity(max_frame_len)
            } else {
                Vec::new()
            },
            tx_slots,
            chain_stats: ChainStats::default(),
            tx_skb_budget,
            tx_super_buf: if config.segmentation && !tx_chains {
                vec![0; TX_HEADROOM + MAX_SUPER_FRAME_LEN]
            } else {
                Vec::new()
            },
            tx_super_segments: 0,
            tx_checksum,
            config,
        })
    }

    /// Super-segments the link cut into frames ([`XdpLinkConfig::segmentation`]).
    pub fn tx_super_segments(&self) -> u64 {
        self.tx_super_segments
    }

    /// Turns the link's segmentation ([`XdpLinkConfig::segmentation`]) on or off; returns
    /// whether it is on (it stays off when frames need multi-buffer chains). Do it before
    /// an interface is built on the link: an interface reads [`Link::offloads`] once.
    pub fn set_segmentation(&mut self, on: bool) -> bool {
        self.config.segmentation = on;
        let possible = self.tx_slots.is_none();
        if on && possible {
            if self.tx_super_buf.is_empty() {
                self.tx_super_buf = vec![0; TX_HEADROOM + MAX_SUPER_FRAME_LEN];
            }
        } else {
            self.tx_super_buf = Vec::new();
        }
        !self.tx_super_buf.is_empty()
    }

    /// [`Link::tx_batch_meta`] with segmentation: the writer fills the super-segment
    /// buffer, and the frame it wrote is cut (or copied, checksum completed or requested)
    /// into UMEM frames. A writer is only called while enough free frames remain for the
    /// largest super-segment.
    fn tx_batch_segmenting(&mut self, max: usize, f: &mut FrameWriter<'_>) -> usize {
        let max_frame_len = self.max_frame_len();
        let pieces = MAX_SUPER_FRAME_LEN.div_ceil(self.mtu.max(1));
        let request = self.tx_checksum.is_requested();
        let mut produced = 0;
        while produced < max && self.free.len() >= pieces {
            let buf_len = self.tx_super_buf.len();
            let Some((range, meta)) = f(&mut self.tx_super_buf) else {
                break;
            };
            produced += 1;
            let limit = if meta.segment_size > 0 {
                MAX_SUPER_FRAME_LEN
            } else {
                max_frame_len
            };
            if !tx_range_ok(&range, buf_len, limit) {
                self.stats.dropped_oversize += 1;
                continue;
            }
            let frame = &mut self.tx_super_buf[range];
            if meta.segment_size == 0 || frame.len() <= max_frame_len {
                let partial = meta.partial_checksum;
                let requested = partial.filter(|&p| request && checksum_fits(p, frame.len()));
                if let (Some(p), None) = (partial, requested) {
                    complete_checksum(frame, p);
                }
                let Some(chunk) = self.free.pop() else {
                    break;
                };
                let addr = chunk + DATA_AT;
                // SAFETY: a chunk on the free stack is in no ring and borrowed nowhere else.
                let Some(out) = (unsafe { self.umem.frame_mut(addr, frame.len()) }) else {
                    self.free.push(chunk);
                    self.stats.dropped_oversize += 1;
                    continue;
                };
                out.copy_from_slice(frame);
                let len = frame.len();
                self.stage(addr, len, requested);
                continue;
            }
            let seg = match Segmenter::new(frame, usize::from(meta.segment_size)) {
                Ok(seg) if (0..seg.count()).all(|i| seg.len_of(i) <= max_frame_len) => seg,
                _ => {
                    self.stats.dropped_oversize += 1;
                    continue;
                }
            };
            let requested = Some(seg.partial()).filter(|_| request);
            for i in 0..seg.count() {
                let Some(chunk) = self.free.pop() else {
                    break;
                };
                let addr = chunk + DATA_AT;
                let len = seg.len_of(i);
                // SAFETY: a chunk on the free stack is in no ring and borrowed nowhere else.
                let Some(out) = (unsafe { self.umem.frame_mut(addr, len) }) else {
                    self.free.push(chunk);
                    self.stats.dropped_oversize += 1;
                    continue;
                };
                let written = if requested.is_some() {
                    seg.write_partial(i, out)
                } else {
                    seg.write(i, out)
                };
                match written {
                    Some(n) => Self::stage_in(
                        &self.umem,
                        &mut self.stats,
                        &mut self.staged,
                        addr,
                        n,
                        requested,
                    ),
                    None => self.free.push(chunk),
                }
            }
            self.tx_super_segments += 1;
        }
        produced
    }

    /// Queues the frame of `len` bytes at UMEM address `addr` for the tx ring, with a
    /// checksum request in its TX metadata when `request` names one.
    fn stage(&mut self, addr: u64, len: usize, request: Option<PartialChecksum>) {
        Self::stage_in(
            &self.umem,
            &mut self.stats,
            &mut self.staged,
            addr,
            len,
            request,
        );
    }

    /// [`stage`](Self::stage) with the fields it needs borrowed one by one.
    fn stage_in(
        umem: &Umem,
        stats: &mut LinkStats,
        staged: &mut Vec<XdpDesc>,
        addr: u64,
        len: usize,
        request: Option<PartialChecksum>,
    ) {
        let mut options = 0;
        if let Some(p) = request {
            // SAFETY: the metadata lies in the frame's own chunk, in front of the frame
            // (`addr` is at least `DATA_AT` bytes into the chunk); the chunk is in no ring
            // and its frame's borrow has ended.
            let meta = unsafe {
                umem.frame_mut(addr - u64::from(TX_METADATA_LEN), TX_METADATA_LEN as usize)
            };
            if let Some(meta) = meta {
                meta.copy_from_slice(&checksum_request(p));
                options = XDP_TX_METADATA;
            }
        }
        stats.tx_frames += 1;
        stats.tx_bytes += len as u64;
        staged.push(XdpDesc {
            addr,
            len: len as u32,
            options,
        });
    }

    /// Frames one copy-mode `sendto` kick sends: the budget set through
    /// `XDP_MAX_TX_SKB_BUDGET` ([`XdpLinkConfig::tx_skb_budget`]), or 32 where the kernel
    /// has no such option.
    pub fn tx_skb_budget(&self) -> usize {
        self.tx_skb_budget
    }

    /// The socket's file descriptor: poll it for readability, register it in the steering
    /// program's `XSKMAP`.
    pub fn fd(&self) -> RawFd {
        self.sock.as_fd().as_raw_fd()
    }

    /// Whether a received frame is waiting on the rx ring (one ring-index read, no system
    /// call): what a busy-polling driver loop spins on.
    pub fn rx_ready(&mut self) -> bool {
        self.sock.rx.available(1) > 0
    }

    /// The settings the link was opened with.
    pub fn config(&self) -> &XdpLinkConfig {
        &self.config
    }

    /// The mode the socket is bound in, and why copy mode after a refused zero copy.
    pub fn binding(&self) -> XdpBinding {
        self.binding
    }

    /// Who completes the TCP checksums of transmitted frames: the device or the kernel
    /// through TX metadata, or the link (see the
    /// [module documentation](self#checksum-offload-through-tx-metadata)).
    pub fn tx_checksum(&self) -> TxChecksum {
        self.tx_checksum
    }

    /// Where the UMEM lives: its size, NUMA node preference and page size.
    pub fn umem_placement(&self) -> UmemPlacement {
        self.placement
    }

    /// The NUMA node of each of the UMEM's pages, as the kernel reports them
    /// (`move_pages(2)`; a negative entry is an error for that page).
    pub fn umem_page_nodes(&self) -> io::Result<Vec<i32>> {
        let base = self.umem_base;
        let page = if self.placement.huge_pages {
            huge_pages_free().map_or(2 << 20, |(size, _)| size)
        } else {
            4096
        };
        // SAFETY: the UMEM is mapped for as long as `self.umem` lives, which spans the call.
        unsafe { page_nodes(base, self.placement.bytes, page) }
    }

    /// Whether the socket is bound with `XDP_USE_SG` (frames may come as descriptor chains).
    pub fn multi_buffer(&self) -> bool {
        self.multi_buffer
    }

    /// Bytes of packet data one UMEM frame holds (frame size − 256 bytes of XDP headroom).
    pub fn frame_capacity(&self) -> usize {
        self.capacity
    }

    /// Frames received as descriptor chains and delivered.
    pub fn rx_chains(&self) -> u64 {
        self.chain_stats.rx_chains
    }

    /// Received chains dropped because they grew beyond [`Link::max_frame_len`] (also
    /// counted in [`LinkStats::dropped_oversize`]).
    pub fn rx_chains_dropped(&self) -> u64 {
        self.chain_stats.rx_chains_dropped
    }

    /// Frames transmitted as descriptor chains (more than one UMEM frame).
    pub fn tx_chains(&self) -> u64 {
        self.chain_stats.tx_chains
    }

    /// Tx frames free now (neither written, queued, nor awaiting completion).
    pub fn tx_frames_free(&self) -> usize {
        self.free.len()
    }

    /// All frames set aside for transmit: [`tx_frames_free`](Self::tx_frames_free) equals
    /// it once every sent frame has completed.
    pub fn tx_frames_total(&self) -> usize {
        self.tx_frames
    }

    /// The kernel's counters of this socket (`XDP_STATISTICS`): drops for a full rx ring
    /// or an empty fill ring, invalid descriptors.
    pub fn kernel_stats(&self) -> io::Result<XskStatistics> {
        self.sock.statistics()
    }

    /// Waits until a frame is ready on the rx ring, for at most `timeout`; returns whether
    /// one is. Spins for up to [`XdpLinkConfig::busy_poll`] first, then sleeps in `poll(2)`
    /// (a zero `timeout` only checks).
    pub fn wait_readable(&mut self, timeout: Duration) -> io::Result<bool> {
        if self.sock.rx.available(1) > 0 {
            return Ok(true);
        }
        let spin = self.config.busy_poll.min(timeout);
        if !spin.is_zero() {
            let start = std::time::Instant::now();
            while start.elapsed() < spin {
                if self.sock.rx.available(1) > 0 {
                    return Ok(true);
                }
                std::hint::spin_loop();
            }
        }
        let rest = timeout.saturating_sub(spin);
        // Round up so a sub-millisecond wait still sleeps rather than spinning the caller.
        let ms = rest.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
        self.sock.poll_readable(ms)
    }

    /// [`Link::tx_batch`] when a tx buffer does not fit one UMEM frame: the writer fills
    /// a slot of adjacent chunks in place, and the frame goes out as a chain of
    /// descriptors pointing into it, each at most a frame's capacity long.
    fn tx_batch_chained(&mut self, max: usize, f: &mut TxWriter<'_>) -> usize {
        let buf_len = TX_HEADROOM + self.max_frame_len();
        let max_frame_len = self.max_frame_len();
        let request = self.tx_checksum.is_requested();
        let Some(slots) = self.tx_slots.as_mut() else {
            return 0;
        };
        let mut produced = 0;
        while produced < max {
            let Some(slot) = self.free.pop() else {
                break;
            };
            // SAFETY: a slot on the free stack has every descriptor of its last frame
            // completed: none of its chunks is in a ring, and nothing else borrows them.
            let Some(buf) = (unsafe { self.umem.span_mut(slot + DATA_AT, buf_len) }) else {
                // Cannot happen: slots hold the buffer (sized at open).
                self.free.push(slot);
                break;
            };
            let Some((range, partial)) = f(buf) else {
                self.free.push(slot);
                break;
            };
            produced += 1;
            if range.is_empty() || !tx_range_ok(&range, buf.len(), max_frame_len) {
                self.stats.dropped_oversize += 1;
                self.free.push(slot);
                continue;
            }
            let requested = partial.filter(|&p| request && checksum_fits(p, range.len()));
            if let (Some(p), None) = (partial, requested) {
                complete_checksum(&mut buf[range.clone()], p);
            }
            let addr = slot + DATA_AT + range.start as u64;
            let mut first = 0;
            if let Some(p) = requested {
                // SAFETY: the metadata lies in the slot's first chunk, in front of the
                // frame (which starts at least `DATA_AT` bytes into it); the buffer's
                // borrow has ended.
                let meta = unsafe {
                    self.umem
                        .frame_mut(addr - u64::from(TX_METADATA_LEN), TX_METADATA_LEN as usize)
                };
                if let Some(meta) = meta {
                    meta.copy_from_slice(&checksum_request(p));
                    first = XDP_TX_METADATA;
                }
            }
            let len = range.len();
            let parts = len.div_ceil(self.capacity);
            for i in 0..parts {
                let at = i * self.capacity;
                let more = i + 1 < parts;
                self.staged.push(XdpDesc {
                    addr: addr + at as u64,
                    len: (len - at).min(self.capacity) as u32,
                    options: if more { XDP_PKT_CONTD } else { 0 } | if i == 0 { first } else { 0 },
                });
            }
            if let Some(left) = slots
                .index_of(slot)
                .and_then(|i| slots.parts_left.get_mut(i))
            {
                *left = parts as u16;
            }
            if parts > 1 {
                self.chain_stats.tx_chains += 1;
            }
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
        }
        produced
    }

    /// Lends free UMEM frames to `f` one by one, in place: the writer says where the frame
    /// lies and which checksum, if any, is left partial (requested through TX metadata
    /// where the link may, completed here otherwise).
    fn tx_batch_frames(&mut self, max: usize, f: &mut TxWriter<'_>) -> usize {
        let buf_len = TX_HEADROOM + self.max_frame_len();
        let max_frame_len = self.max_frame_len();
        let request = self.tx_checksum.is_requested();
        let mut produced = 0;
        while produced < max {
            let Some(chunk) = self.free.pop() else {
                break;
            };
            // SAFETY: a chunk on the free stack is in no ring, so the kernel does not touch
            // it while it is written here, and nothing else borrows it.
            let Some(buf) = (unsafe { self.umem.frame_mut(chunk + DATA_AT, buf_len) }) else {
                // Cannot happen: every chunk holds the data area (checked at open).
                self.free.push(chunk);
                break;
            };
            let Some((range, partial)) = f(buf) else {
                self.free.push(chunk);
                break;
            };
            produced += 1;
            if !tx_range_ok(&range, buf.len(), max_frame_len) {
                self.stats.dropped_oversize += 1;
                self.free.push(chunk);
                continue;
            }
            let requested = partial.filter(|&p| request && checksum_fits(p, range.len()));
            if let (Some(p), None) = (partial, requested) {
                complete_checksum(&mut buf[range.clone()], p);
            }
            self.stage(chunk + DATA_AT + range.start as u64, range.len(), requested);
        }
        produced
    }

    /// Moves staged frames to the tx ring (as many as it has room for).
    fn submit(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        let room = self.sock.tx.free(self.staged.len() as u32) as usize;
        let mut n = room.min(self.staged.len());
        // Whole chains only: the ring never holds the head of a frame without its tail.
        while n > 0 && self.staged[n - 1].options & XDP_PKT_CONTD != 0 {
            n -= 1;
        }
        if n == 0 {
            return;
        }
        // Staged frames are written and in no ring; once produced they are not touched
        // until the completion ring returns them.
        let produced = self.sock.tx.produce(&self.staged[..n]);
        self.staged.drain(..produced);
        self.in_flight += produced;
    }

    /// Whether the kernel has taken every frame handed to this link off the tx ring.
    fn tx_drained(&mut self) -> bool {
        self.staged.is_empty() && self.sock.tx.free(self.tx_ring_size) >= self.tx_ring_size
    }

    /// The `sendto` kick, when the kernel needs one.
    fn kick(&mut self) {
        if !self.binding.is_zero_copy() || self.sock.tx.needs_wakeup() {
            self.stats.tx_kicks += 1;
            if let Err(e) = self.sock.kick_tx() {
                warn!(ifname = %self.config.ifname, error = %e, "AF_XDP tx kick failed");
            }
        }
    }

    /// Returns completed tx frames to the free stack.
    fn reclaim(&mut self) {
        loop {
            let n = self.sock.comp.consume(&mut self.comp_scratch);
            if n == 0 {
                break;
            }
            // The kernel hands back each descriptor's address, in the order sent: its chunk
            // is free again, or its slot once the frame's last descriptor is back.
            match &mut self.tx_slots {
                None => {
                    let umem = &self.umem;
                    self.free
                        .extend(self.comp_scratch[..n].iter().map(|&a| umem.chunk_of(a)));
                }
                Some(slots) => {
                    for &a in &self.comp_scratch[..n] {
                        let Some(i) = slots.index_of(a) else {
                            continue;
                        };
                        let left = &mut slots.parts_left[i];
                        *left = left.saturating_sub(1);
                        if *left == 0 {
                            self.free.push(slots.base + i as u64 * slots.bytes);
                        }
                    }
                }
            }
            self.in_flight -= n.min(self.in_flight);
            if n < self.comp_scratch.len() {
                break;
            }
        }
    }

    /// Puts received frames back on the fill ring, keeping any it has no room for.
    fn refill(&mut self, n: usize) {
        if !self.fill_backlog.is_empty() {
            let put = self.sock.fill.produce(&self.fill_backlog);
            self.fill_backlog.drain(..put);
        }
        if n > 0 {
            // The frames were consumed from the rx ring and the callback's borrows of them
            // have ended; their chunks go back to the fill ring only.
            let umem = &self.umem;
            self.fill_scratch.clear();
            self.fill_scratch.extend(
                self.rx_scratch[..n]
                    .iter()
                    .map(|d| umem.chunk_of(data_addr(d.addr))),
            );
            let put = self.sock.fill.produce(&self.fill_scratch);
            if put < n {
                warn!(
                    frames = n,
                    "AF_XDP fill ring full; keeping received frames aside"
                );
                self.fill_backlog
                    .extend_from_slice(&self.fill_scratch[put..n]);
            }
        }
        if self.sock.fill.needs_wakeup() {
            if let Err(e) = self.sock.wake_fill() {
                warn!(ifname = %self.config.ifname, error = %e, "AF_XDP fill wakeup failed");
            }
        }
    }
}

/// Where a tx frame's data area starts in its chunk: after the XDP headroom, which holds
/// the TX metadata in front of the frame.
const DATA_AT: u64 = XDP_PACKET_HEADROOM as u64;

/// The bytes of TX metadata in front of a frame.
use super::xsk::sys::TX_METADATA_LEN;

/// What [`XdpLink::tx_batch_frames`] lends buffers to: the frame's range and its partial
/// checksum, if any.
type TxWriter<'a> = dyn FnMut(&mut [u8]) -> Option<(Range<usize>, Option<PartialChecksum>)> + 'a;

/// Whether the kernel takes a checksum request for a frame of `len` bytes: the field must
/// lie inside the frame (else it refuses the whole descriptor).
fn checksum_fits(p: PartialChecksum, len: usize) -> bool {
    usize::from(p.start) + usize::from(p.offset) + 2 <= len
}

impl AsFd for XdpLink {
    /// The socket's descriptor, to wait on with `poll(2)` beside other descriptors.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl super::QueueLink for XdpLink {
    fn rx_fd(&self) -> Option<RawFd> {
        Some(self.fd())
    }

    fn register_rx_waker(&self, _waker: &std::task::Waker) {}

    fn rx_ready(&mut self) -> bool {
        XdpLink::rx_ready(self)
    }
}

impl Link for XdpLink {
    fn mtu(&self) -> usize {
        self.mtu
    }

    fn recv_batch(&mut self, now: Instant, max: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        // Callers that take one slice get a chain gathered into the scratch buffer.
        let mut buf = std::mem::take(&mut self.rx_chain_buf);
        let n = self.recv_batch_parts(now, max, &mut |parts, _| match parts {
            [frame] => f(frame),
            _ => {
                buf.clear();
                for part in parts {
                    buf.extend_from_slice(part);
                }
                f(&buf);
            }
        });
        self.rx_chain_buf = buf;
        n
    }

    fn recv_batch_parts(
        &mut self,
        _now: Instant,
        max: usize,
        f: &mut dyn FnMut(&[&[u8]], RxMeta),
    ) -> usize {
        let held = self.rx_pending;
        let max = max.min(self.config.rx_batch);
        if max == 0 {
            return 0;
        }
        let n = held + self.sock.rx.consume(&mut self.rx_scratch[held..held + max]);
        if n == held {
            return 0;
        }
        let limits = RxLimits {
            multi_buffer: self.multi_buffer,
            max_frame_len: self.max_frame_len(),
        };
        let XdpLink {
            umem,
            rx_scratch,
            rx_dropping,
            stats,
            chain_stats,
            ..
        } = self;
        let mut counts = RxChainCounts::default();
        let read = read_frames(
            &rx_scratch[..n],
            limits,
            rx_dropping,
            // SAFETY: the kernel handed these frames over through the rx ring; it writes
            // to them again only after `refill` returns them to the fill ring, which
            // happens after the callback's borrows of the frame they belong to have ended
            // (a chain's parts held over to the next call stay off the fill ring until
            // then).
            |desc| unsafe { umem.frame(data_addr(desc.addr), desc.len as usize) },
            stats,
            &mut counts,
            |parts| f(parts, RxMeta::default()),
        );
        chain_stats.rx_chains += counts.chains;
        chain_stats.rx_chains_dropped += counts.chains_dropped;
        let (done, delivered) = (read.done, read.delivered);
        // Descriptors `done..n` begin a chain whose last part is still to come: they stay
        // off the fill ring, moved to the front of the scratch array for the next call.
        self.refill(done);
        self.rx_scratch.copy_within(done..n, 0);
        self.rx_pending = n - done;
        delivered
    }

    fn tx_batch(
        &mut self,
        _now: Instant,
        max: usize,
        f: &mut dyn FnMut(&mut [u8]) -> Option<Range<usize>>,
    ) -> usize {
        if self.tx_slots.is_some() {
            return self.tx_batch_chained(max, &mut |buf| f(buf).map(|range| (range, None)));
        }
        self.tx_batch_frames(max, &mut |buf| f(buf).map(|range| (range, None)))
    }

    fn tx_batch_meta(&mut self, _now: Instant, max: usize, f: &mut FrameWriter<'_>) -> usize {
        if !self.tx_super_buf.is_empty() {
            return self.tx_batch_segmenting(max, f);
        }
        if self.tx_slots.is_some() {
            return self.tx_batch_chained(max, &mut |buf| {
                f(buf).map(|(range, meta)| (range, meta.partial_checksum))
            });
        }
        self.tx_batch_frames(max, &mut |buf| {
            f(buf).map(|(range, meta)| (range, meta.partial_checksum))
        })
    }

    fn offloads(&self) -> Offloads {
        Offloads {
            tx_segmentation: if self.tx_super_buf.is_empty() {
                0
            } else {
                MAX_SUPER_FRAME_LEN
            },
            // Partial checksums cost the link one pass over each frame it copies or cuts
            // anyway, or nothing with TX metadata.
            tx_checksum: !self.tx_super_buf.is_empty() || self.tx_checksum.is_requested(),
            // A frame must lie in UMEM: a tail is copied there (the default gather).
            tx_gather: false,
        }
    }

    fn flush(&mut self, _now: Instant) {
        // Nothing staged and every frame handed to the ring completed: the rings have
        // nothing for this call (most rounds only receive; the ring reads were ~250
        // instructions a round, callgrind).
        if self.staged.is_empty() && self.in_flight == 0 {
            return;
        }
        self.reclaim();
        self.submit();
        // Copy mode sends at most 32 frames per kick; kick until the kernel has taken every
        // descriptor off the tx ring (bounded, in case it stops taking them). No kick when
        // the kernel has taken everything already: most rounds only receive, and a
        // `sendto` per round with nothing to send cost several system calls per message.
        let mut kicks = self.tx_ring_size as usize / self.tx_skb_budget.max(1) + 2;
        while kicks > 0 && !self.tx_drained() {
            self.kick();
            self.reclaim();
            self.submit();
            kicks -= 1;
        }
    }

    fn poll_at(&self) -> Option<Instant> {
        None
    }

    fn stats(&self) -> LinkStats {
        self.stats
    }
}

/// Asks the kernel to send up to `wanted` frames per copy-mode kick (0: the tx ring's
/// `ring` entries), within what it allows; returns the budget that applies.
fn raise_tx_skb_budget(sock: &XskSocket, wanted: u32, ring: u32) -> usize {
    let budget = if wanted == 0 { ring } else { wanted };
    let budget = budget.clamp(
        COPY_MODE_TX_PER_KICK as u32,
        ring.max(COPY_MODE_TX_PER_KICK as u32),
    );
    match sock.set_tx_skb_budget(budget) {
        Ok(()) => budget as usize,
        Err(e) => {
            debug!(
                error = %e,
                "XDP_MAX_TX_SKB_BUDGET refused (before Linux 6.17?): 32 frames per kick"
            );
            COPY_MODE_TX_PER_KICK
        }
    }
}

/// The MTU of `ifname` in the calling thread's network namespace (`SIOCGIFMTU`).
fn interface_mtu(ifname: &str) -> Result<usize, XdpLinkError> {
    let no_such = || XdpLinkError::NoSuchInterface {
        ifname: ifname.to_owned(),
    };
    // SAFETY: `ifreq` is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= req.ifr_name.len() || name.contains(&0) {
        return Err(no_such());
    }
    for (dst, &src) in req.ifr_name.iter_mut().zip(name) {
        *dst = src as libc::c_char;
    }
    // SAFETY: a plain socket(2) call; the descriptor is owned right below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(XdpLinkError::Io {
            op: "opening a socket to query the MTU",
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: SIOCGIFMTU reads `ifr_name` and writes `ifr_ifru.ifru_mtu` of the `ifreq`
    // it is given, which lives across the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut req) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ENODEV) => no_such(),
            _ => XdpLinkError::Io {
                op: "querying the interface MTU",
                source: err,
            },
        });
    }
    // SAFETY: SIOCGIFMTU succeeded, so the union holds the MTU.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    usize::try_from(mtu).map_err(|_| XdpLinkError::Io {
        op: "querying the interface MTU",
        source: io::Error::new(io::ErrorKind::InvalidData, "negative MTU"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_can_move_to_another_thread() {
        fn send<T: Send>() {}
        send::<XdpLink>();
    }

    #[test]
    fn only_driver_refusals_fall_back_to_copy_mode() {
        let unsupported = XdpLinkError::ZeroCopyUnsupported { ifname: "x".into() };
        assert_eq!(zero_copy_refusal(&unsupported), Some(libc::EOPNOTSUPP));
        for e in [
            XdpLinkError::NotPermitted { op: "x" },
            XdpLinkError::NoSuchInterface { ifname: "x".into() },
            XdpLinkError::InvalidConfig { reason: "x".into() },
        ] {
            assert_eq!(zero_copy_refusal(&e), None, "{e}");
        }
        assert_eq!(XdpLinkConfig::new("x", 0).bind, BindMode::Auto);
    }

    #[test]
    fn missing_interface_is_reported() {
        let err = XdpLink::open(XdpLinkConfig::new("nc-no-such0", 0)).unwrap_err();
        assert!(
            matches!(err, XdpLinkError::NoSuchInterface { ref ifname } if ifname == "nc-no-such0"),
            "{err}"
        );
    }

    #[test]
    fn loopback_mtu_is_read() {
        // `lo` exists in every network namespace.
        let mtu = interface_mtu("lo").unwrap();
        assert!(mtu >= 1500, "lo MTU {mtu}");
    }

    #[test]
    fn bad_settings_are_refused() {
        let mut c = XdpLinkConfig::new("lo", 0);
        c.frame_count = 1000;
        assert!(matches!(
            XdpLink::open(c).unwrap_err(),
            XdpLinkError::InvalidConfig { .. }
        ));
        let mut c = XdpLinkConfig::new("lo", 0);
        c.frame_size = 3000;
        assert!(matches!(
            XdpLink::open(c).unwrap_err(),
            XdpLinkError::InvalidConfig { .. }
        ));
        // lo's MTU (65536) does not fit a 4096-byte frame, and without multi-buffer that
        // is the end of it.
        let mut c = XdpLinkConfig::new("lo", 0);
        c.frame_size = 4096;
        c.multi_buffer = MultiBuffer::Off;
        let err = XdpLink::open(c).unwrap_err();
        assert!(matches!(err, XdpLinkError::FrameTooSmall { .. }), "{err}");
        assert!(err.to_string().contains("multi-buffer is off"), "{err}");
        // With it, a 65550-byte frame would need 18 descriptors of 3840 bytes.
        let mut c = XdpLinkConfig::new("lo", 0);
        c.frame_size = 4096;
        let err = XdpLink::open(c).unwrap_err();
        assert!(
            matches!(
                err,
                XdpLinkError::MtuTooLarge {
                    mtu: 65536,
                    capacity: 3840,
                    descriptors: 18,
                    max: MAX_CHAIN_DESCRIPTORS
                }
            ),
            "{err}"
        );
    }
}
