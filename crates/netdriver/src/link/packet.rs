//! The AF_PACKET link: frames through the kernel's own device layer, with segmentation and
//! checksum offload through a `virtio_net_hdr` (`PACKET_VNET_HDR`), for hosts where AF_XDP
//! must copy (Linux only).
//!
//! # Why a second link
//!
//! In AF_XDP copy mode (every driver without zero-copy support, veth among them) the
//! kernel allocates an skb and copies each transmitted frame, one 1514-byte frame at a
//! time; nothing segments or coalesces. An AF_PACKET socket with `PACKET_VNET_HDR` hands
//! the kernel one 64 KiB *super-segment* per system call slot together with its segment
//! size, exactly as a virtio guest or a TUN device with `IFF_VNET_HDR` does (gVisor's and
//! Tailscale's path to kernel-class bulk): the device segments it (TSO) or the kernel does
//! in software (GSO), and on veth it crosses to the peer whole. On receive the socket gets
//! what the kernel's GRO built, whole, with a header that says so. So the per-segment cost
//! of the stack, the system calls and the kernel's per-skb work are paid once per 64 KiB
//! instead of once per 1448 bytes.
//!
//! # Shape
//!
//! - One `SOCK_RAW` socket bound to the interface with protocol `ETH_P_ALL` (a *tap*: see
//!   [`xdp_prog::packet`] for why `ETH_P_IP` would not do), non-blocking, outgoing frames
//!   ignored (`PACKET_IGNORE_OUTGOING`), a socket filter attached before the bind so that
//!   it never holds a frame the stack does not own ([`PacketLink::open`] takes the filter:
//!   [`PacketSteering`](xdp_prog::PacketSteering) gives one, and its TCX ingress drop keeps
//!   the kernel's TCP from answering those frames).
//! - Receive: [`Link::recv_batch_meta`] is one `recvmmsg` of up to
//!   [`PacketLinkConfig::rx_batch`] messages into buffers of 64 KiB (a GRO'd segment is
//!   up to [`MAX_SUPER_FRAME_LEN`](super::MAX_SUPER_FRAME_LEN)); each frame's
//!   `virtio_net_hdr` says whether its checksum was verified (`DATA_VALID`) or left partial
//!   by a sender on this host (`NEEDS_CSUM`): either way
//!   [`RxMeta::checksum_verified`], as Linux trusts both.
//! - Transmit: [`Link::tx_batch_meta`] lends up to [`PacketLinkConfig::tx_frames`] buffers
//!   of 64 KiB (with [`PacketLinkConfig::segmentation`]); [`Link::flush`] sends what was
//!   written with `sendmmsg`, one message per frame with its `virtio_net_hdr` (GSO type
//!   TCPv4 and segment size for a super-segment, `NEEDS_CSUM` for a partial checksum).
//!   A full socket buffer (`EAGAIN`) keeps the rest for the next flush, and the buffers
//!   stay lent until then: that is the link's backpressure ([`PacketLink::tx_pending`];
//!   a queue driver waits for the socket to poll writable, [`QueueLink::tx_blocked`]).
//!   A frame the device or its queueing discipline dropped (`ENOBUFS`) is gone, as on a
//!   lossy wire, and counted ([`PacketLinkStats::tx_dropped`]); TCP retransmits it.
//! - Gather: [`Link::tx_batch_gather`] takes frames with holes that shared buffers fill
//!   ([`SharedSpan`](super::SharedSpan)), and each message's iovecs are the buffer's
//!   parts between the holes and the spans themselves, so the kernel's copy into the skb
//!   reads a TCP payload straight from the application's buffers
//!   ([`PacketLinkStats::tx_gathered_bytes`]); the spans are held until `sendmmsg` took
//!   the frame. With segmentation off (no checksum offload) spans are copied into their
//!   holes, since the checksum needs the frame whole.
//! - Queues: several links on one interface share its frames by receive queue
//!   ([`PacketLinkConfig::fanout`], `PACKET_FANOUT` in mode `PACKET_FANOUT_QM`): the
//!   *i*-th socket to join a group gets the frames of receive queue *r* when
//!   *r* mod *n* = *i* (*n* members), every frame of a flow to one socket, as an AF_XDP
//!   socket per queue gets its queue's. Transmit leaves on the queue the kernel picks
//!   for the flow (its hash), not the socket's.
//!
//! The socket's descriptor is the readiness source ([`AsFd`], [`QueueLink::rx_fd`]):
//! readable when a frame waits, writable when a full send buffer has room again.
//! [`Link::poll_at`] is `None`.
//!
//! Copies: the kernel copies each frame once each way (`sendmsg` into an skb, the skb into
//! the `recvmsg` buffer), as in AF_XDP copy mode, but per 64 KiB rather than per frame;
//! with gathering, a payload the application's buffers hold is not copied into a tx
//! buffer first.

use core::ops::Range;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};

pub use super::packet_stats::{PacketCounters, PacketLinkStats};
use super::{
    fill_spans, spans_ok, tx_range_ok, FrameWriter, GatherWriter, Link, LinkStats, Offloads,
    QueueLink, RxMeta, SharedSpan, TxMeta, ETHERNET_HEADER_LEN, MAX_SUPER_FRAME_LEN, TX_HEADROOM,
};
use crate::time::Instant;

/// `struct virtio_net_hdr` (`<linux/virtio_net.h>`), the header `PACKET_VNET_HDR` puts in
/// front of every frame, in the host's byte order (little-endian on the hosts we run).
const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum from `csum_start` on is to be completed.
const VNET_F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the checksum was verified.
const VNET_F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_NONE` and `VIRTIO_NET_HDR_GSO_TCPV4`.
const VNET_GSO_NONE: u8 = 0;
const VNET_GSO_TCPV4: u8 = 1;

/// Most shared spans of one frame sent as they lie; more are copied into their holes. A
/// TCP super-segment's payload spans at most a few of the application's buffers.
const MAX_GATHER_SPANS: usize = 16;

/// Socket options of `<linux/if_packet.h>` (the same on every architecture).
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_FANOUT: libc::c_int = 18;
/// `PACKET_FANOUT_QM`: a group's frames go to its members by receive queue.
const PACKET_FANOUT_QM: u32 = 5;
/// `PACKET_FANOUT_FLAG_UNIQUEID`: the kernel picks an id no group of the namespace has.
const PACKET_FANOUT_FLAG_UNIQUEID: u32 = 0x2000;
/// `SO_SNDBUFFORCE` and `SO_RCVBUFFORCE` of `<asm-generic/socket.h>`: buffer sizes beyond
/// `net.core.[rw]mem_max`, for CAP_NET_ADMIN.
const SO_SNDBUFFORCE: libc::c_int = 32;
const SO_RCVBUFFORCE: libc::c_int = 33;
/// `ETH_P_ALL` in network byte order, as `socket(2)` and `bind(2)` take it.
const ETH_P_ALL_BE: u16 = (libc::ETH_P_ALL as u16).to_be();

/// Settings of a [`PacketLink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketLinkConfig {
    /// The interface, in the calling thread's network namespace.
    pub ifname: String,
    /// Most frames one receive call takes (one `recvmmsg`); each has a 64 KiB buffer.
    pub rx_batch: usize,
    /// Tx buffers: most frames written and not yet sent (one `sendmmsg` per flush).
    pub tx_frames: usize,
    /// Hand super-segments to the kernel to segment (GSO/TSO through the
    /// `virtio_net_hdr`), and leave checksums to it. Off, the link takes frames of at most
    /// the MTU with complete checksums, as the AF_XDP link does (received frames may still
    /// be large: the kernel's GRO and a local sender's GSO do not ask).
    pub segmentation: bool,
    /// The socket's receive buffer (`SO_RCVBUFFORCE`, else `SO_RCVBUF` up to
    /// `net.core.rmem_max`): what the kernel may hold for the stack between two receive
    /// calls. A 64 KiB segment takes about 66 KiB of it.
    pub rx_buffer_bytes: usize,
    /// The socket's send buffer (`SO_SNDBUFFORCE`, else `SO_SNDBUF`).
    pub tx_buffer_bytes: usize,
    /// `PACKET_QDISC_BYPASS`: hand frames straight to the driver, skipping the interface's
    /// queueing discipline (and its backpressure). Off by default.
    pub qdisc_bypass: bool,
    /// Share the interface's frames with other sockets by receive queue (see the
    /// [module documentation](self)); `None` (the default): this socket gets every frame
    /// its filter passes.
    pub fanout: Option<Fanout>,
}

/// A `PACKET_FANOUT_QM` group for [`PacketLinkConfig::fanout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fanout {
    /// Start a group under an id the kernel picks (unique in the network namespace, so
    /// that no other program's group is joined by mistake); read it with
    /// [`PacketLink::fanout_group`] for the other members.
    New,
    /// Join the group with this id (same interface and namespace).
    Join(u16),
}

impl PacketLinkConfig {
    /// Defaults for `ifname`: 32 receive and 64 transmit buffers, segmentation on, 8 MiB
    /// receive and 4 MiB send socket buffers, through the qdisc.
    pub fn new(ifname: impl Into<String>) -> PacketLinkConfig {
        PacketLinkConfig {
            ifname: ifname.into(),
            rx_batch: 32,
            tx_frames: 64,
            segmentation: true,
            rx_buffer_bytes: 8 << 20,
            tx_buffer_bytes: 4 << 20,
            qdisc_bypass: false,
            fanout: None,
        }
    }
}

/// Why a [`PacketLink`] could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum PacketLinkError {
    /// The interface does not exist in the calling thread's network namespace.
    #[error("no network interface named {ifname:?} in this network namespace")]
    NoSuchInterface {
        /// The name asked for.
        ifname: String,
    },
    /// Creating packet sockets needs CAP_NET_RAW.
    #[error("{op}: operation not permitted (AF_PACKET needs CAP_NET_RAW; run as root)")]
    NotPermitted {
        /// What was being done.
        op: &'static str,
    },
    /// The settings are inconsistent.
    #[error("invalid AF_PACKET link configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// The socket filter could not be attached.
    #[error("attaching the socket filter: {0}")]
    Filter(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
}

/// One frame written and waiting for [`Link::flush`]: in tx buffer `buf`, with its shared
/// spans (if gathered) in `tx_spans[buf]`, sent as `iovecs` iovecs (the virtio header
/// included).
#[derive(Debug, Clone)]
struct Staged {
    buf: usize,
    frame: Range<usize>,
    hdr: [u8; VNET_HDR_LEN],
    iovecs: usize,
}

/// An AF_PACKET socket on an interface, with GSO/GRO through `virtio_net_hdr`. See the
/// [module documentation](self).
#[derive(Debug)]
pub struct PacketLink {
    config: PacketLinkConfig,
    fd: OwnedFd,
    ifindex: u32,
    mtu: usize,
    /// The `PACKET_FANOUT_QM` group the socket joined.
    fanout_group: Option<u16>,
    /// Receive buffers and the virtio headers read with them.
    rx_bufs: Vec<Vec<u8>>,
    rx_hdrs: Vec<[u8; VNET_HDR_LEN]>,
    /// Transmit buffers, and which of them are free (a stack, hottest last).
    tx_bufs: Vec<Vec<u8>>,
    /// Each tx buffer's shared spans (its frame's holes, [`Link::tx_batch_gather`]), held
    /// until the kernel took the frame (allocated once per buffer).
    tx_spans: Vec<Vec<SharedSpan>>,
    tx_free: Vec<usize>,
    staged: Vec<Staged>,
    /// Scratch for the system calls' arrays (rebuilt per call, allocated once).
    iovecs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    stats: LinkStats,
    /// The counters beyond `stats`, shared with the channel set that reports them
    /// ([`PacketLink::counters`]).
    packet_stats: Arc<PacketCounters>,
}

// SAFETY: the raw pointers in `iovecs` and `msgs` are scratch, rebuilt from the link's own
// buffers right before each system call and never dereferenced otherwise; the link owns
// every buffer they point into, so moving it to another thread moves them all.
unsafe impl Send for PacketLink {}

/// Sets an integer socket option.
fn set_int(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: setsockopt with a pointer to a local c_int and its size; the kernel copies
    // the value and keeps no pointer.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl PacketLink {
    /// Opens a socket on `config.ifname` (in the calling thread's network namespace),
    /// attaches the socket filter with `attach_filter` (given the unbound socket; e.g.
    /// `|fd| steering.attach_socket(fd)`), then binds it to the interface.
    pub fn open<E>(
        config: PacketLinkConfig,
        attach_filter: impl FnOnce(BorrowedFd<'_>) -> Result<(), E>,
    ) -> Result<PacketLink, PacketLinkError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        if config.rx_batch == 0 || config.tx_frames == 0 {
            return Err(PacketLinkError::InvalidConfig {
                reason: "rx_batch and tx_frames must be at least 1".into(),
            });
        }
        let ifindex = nix::net::if_::if_nametoindex(config.ifname.as_str()).map_err(|_| {
            PacketLinkError::NoSuchInterface {
                ifname: config.ifname.clone(),
            }
        })?;
        let mtu =
            super::xdp::mtu_of(&config.ifname).map_err(|_| PacketLinkError::NoSuchInterface {
                ifname: config.ifname.clone(),
            })?;
        let io_err = |op: &'static str| {
            move |source: io::Error| match source.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => PacketLinkError::NotPermitted { op },
                _ => PacketLinkError::Io { op, source },
            }
        };
        // Protocol 0: the socket receives nothing until it is bound below, after the
        // filter is in place.
        // SAFETY: a plain socket(2) call; the descriptor is owned right below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(io_err("creating an AF_PACKET socket")(
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        set_int(&fd, libc::SOL_PACKET, PACKET_VNET_HDR, 1).map_err(io_err("PACKET_VNET_HDR"))?;
        set_int(&fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            .map_err(io_err("PACKET_IGNORE_OUTGOING"))?;
        if config.qdisc_bypass {
            set_int(&fd, libc::SOL_PACKET, PACKET_QDISC_BYPASS, 1)
                .map_err(io_err("PACKET_QDISC_BYPASS"))?;
        }
        let clamp = |n: usize| libc::c_int::try_from(n).unwrap_or(libc::c_int::MAX);
        for (force, plain, bytes, what) in [
            (
                SO_RCVBUFFORCE,
                libc::SO_RCVBUF,
                config.rx_buffer_bytes,
                "receive",
            ),
            (
                SO_SNDBUFFORCE,
                libc::SO_SNDBUF,
                config.tx_buffer_bytes,
                "send",
            ),
        ] {
            if set_int(&fd, libc::SOL_SOCKET, force, clamp(bytes)).is_err() {
                // Without CAP_NET_ADMIN: as much as net.core.[rw]mem_max allows.
                if let Err(e) = set_int(&fd, libc::SOL_SOCKET, plain, clamp(bytes)) {
                    warn!(error = %e, what, "setting the AF_PACKET socket buffer size");
                }
            }
        }
        attach_filter(fd.as_fd()).map_err(|e| PacketLinkError::Filter(Box::new(e)))?;

        // SAFETY: `sockaddr_ll` is plain old data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETH_P_ALL_BE;
        addr.sll_ifindex = i32::try_from(ifindex).unwrap_or(0);
        // SAFETY: bind with a pointer to a local, initialised `sockaddr_ll` and its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io_err("binding the AF_PACKET socket")(
                io::Error::last_os_error(),
            ));
        }
        // After the bind: the kernel only lets a running socket into a group.
        let fanout_group = match config.fanout {
            None => None,
            Some(f) => {
                Some(join_fanout(&fd, f).map_err(io_err("joining the PACKET_FANOUT group"))?)
            }
        };
        let max_frame = mtu + ETHERNET_HEADER_LEN;
        let tx_len = TX_HEADROOM
            + if config.segmentation {
                MAX_SUPER_FRAME_LEN.max(max_frame)
            } else {
                max_frame
            };
        let rx_len = MAX_SUPER_FRAME_LEN.max(max_frame);
        debug!(
            ifname = %config.ifname,
            ifindex,
            mtu,
            segmentation = config.segmentation,
            ?fanout_group,
            "AF_PACKET link open"
        );
        let tx_frames = config.tx_frames;
        let rx_batch = config.rx_batch;
        Ok(PacketLink {
            ifindex,
            mtu,
            fanout_group,
            fd,
            rx_bufs: (0..rx_batch).map(|_| vec![0u8; rx_len]).collect(),
            rx_hdrs: vec![[0u8; VNET_HDR_LEN]; rx_batch],
            tx_bufs: (0..tx_frames).map(|_| vec![0u8; tx_len]).collect(),
            tx_spans: (0..tx_frames).map(|_| Vec::new()).collect(),
            tx_free: (0..tx_frames).rev().collect(),
            staged: Vec::with_capacity(tx_frames),
            iovecs: Vec::with_capacity(2 * rx_batch.max(tx_frames)),
            msgs: Vec::with_capacity(rx_batch.max(tx_frames)),
            stats: LinkStats::default(),
            packet_stats: Arc::new(PacketCounters::default()),
            config,
        })
    }

    /// The settings the link was opened with.
    pub fn config(&self) -> &PacketLinkConfig {
        &self.config
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The id of the `PACKET_FANOUT_QM` group the socket is in ([`PacketLinkConfig::fanout`];
    /// with [`Fanout::New`], the id the kernel picked).
    pub fn fanout_group(&self) -> Option<u16> {
        self.fanout_group
    }

    /// The counters beyond [`LinkStats`].
    pub fn packet_stats(&self) -> PacketLinkStats {
        self.packet_stats.snapshot()
    }

    /// The link's counters, shared: whoever holds them reads what the link counts from
    /// now on without reaching the link (a channel set reports them in its
    /// [`QueueStats`](crate::channel::QueueStats) while a queue driver owns the link).
    pub fn counters(&self) -> Arc<PacketCounters> {
        self.packet_stats.clone()
    }

    /// Reads (and resets) the kernel's drop count of this socket (`PACKET_STATISTICS`:
    /// frames that found the receive buffer full), adds it to
    /// [`PacketLinkStats::rx_socket_drops`] and returns the new total.
    pub fn kernel_drops(&mut self) -> io::Result<u64> {
        self.packet_stats.collect_socket_drops(self.fd.as_fd())
    }

    /// Frames written and not yet accepted by the kernel.
    pub fn tx_pending(&self) -> usize {
        self.staged.len()
    }

    /// Waits until a frame may be ready, for at most `timeout`; returns whether the socket
    /// is readable (`poll(2)`; a zero `timeout` only checks).
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one local, initialised pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(rc > 0 && pfd.revents & libc::POLLIN != 0)
    }

    /// The `virtio_net_hdr` for `frame` (of which only the headers are read: the payload
    /// may be a hole, [`SharedSpan`]) sent with `meta`.
    fn vnet_header(&self, frame: &[u8], meta: TxMeta) -> [u8; VNET_HDR_LEN] {
        let mut hdr = [0u8; VNET_HDR_LEN];
        let (mut flags, mut gso_type, mut hdr_len, mut gso_size) = (0u8, VNET_GSO_NONE, 0u16, 0u16);
        let (mut csum_start, mut csum_offset) = (0u16, 0u16);
        if let Some(p) = meta.partial_checksum {
            flags |= VNET_F_NEEDS_CSUM;
            csum_start = p.start;
            csum_offset = p.offset;
        }
        if meta.segment_size > 0 && self.config.segmentation {
            // Headers: Ethernet, IPv4 (its IHL) and TCP (its data offset).
            let ihl = frame
                .get(ETHERNET_HEADER_LEN)
                .map_or(20, |b| usize::from(b & 0x0f) * 4);
            let doff = frame
                .get(ETHERNET_HEADER_LEN + ihl + 12)
                .map_or(20, |b| usize::from(b >> 4) * 4);
            let headers = ETHERNET_HEADER_LEN + ihl + doff;
            if frame.len() > headers + usize::from(meta.segment_size) {
                gso_type = VNET_GSO_TCPV4;
                hdr_len = headers as u16;
                gso_size = meta.segment_size;
            }
        }
        hdr[0] = flags;
        hdr[1] = gso_type;
        hdr[2..4].copy_from_slice(&hdr_len.to_le_bytes());
        hdr[4..6].copy_from_slice(&gso_size.to_le_bytes());
        hdr[6..8].copy_from_slice(&csum_start.to_le_bytes());
        hdr[8..10].copy_from_slice(&csum_offset.to_le_bytes());
        hdr
    }

    /// Gives tx buffer `buf` back to the pool, dropping its spans (the kernel copied them,
    /// or the frame is dropped).
    fn release(&mut self, buf: usize) {
        self.tx_spans[buf].clear();
        self.tx_free.push(buf);
    }

    /// Sends staged frames with `sendmmsg` until all are taken or the socket is full.
    fn send_staged(&mut self) {
        while !self.staged.is_empty() {
            let n = self.staged.len();
            self.iovecs.clear();
            self.msgs.clear();
            // Each message: the virtio header, then the frame: the buffer's parts between
            // the holes, and the shared spans in them. The iovecs are all pushed before
            // any pointer to them is taken below.
            for s in &mut self.staged {
                self.iovecs.push(libc::iovec {
                    iov_base: s.hdr.as_mut_ptr().cast(),
                    iov_len: VNET_HDR_LEN,
                });
                let buf = &mut self.tx_bufs[s.buf];
                let mut pos = s.frame.start;
                for span in &self.tx_spans[s.buf] {
                    if span.at > pos {
                        self.iovecs.push(libc::iovec {
                            iov_base: buf[pos..span.at].as_mut_ptr().cast(),
                            iov_len: span.at - pos,
                        });
                    }
                    self.iovecs.push(libc::iovec {
                        // The kernel only reads through it (`sendmmsg`).
                        iov_base: span.bytes.as_ptr().cast_mut().cast(),
                        iov_len: span.bytes.len(),
                    });
                    pos = span.at + span.bytes.len();
                }
                if s.frame.end > pos {
                    self.iovecs.push(libc::iovec {
                        iov_base: buf[pos..s.frame.end].as_mut_ptr().cast(),
                        iov_len: s.frame.end - pos,
                    });
                }
            }
            let mut at = 0;
            for s in &self.staged {
                // SAFETY: `msghdr` is plain old data; all zeroes is a valid value.
                let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
                hdr.msg_iov = self.iovecs[at..].as_mut_ptr();
                hdr.msg_iovlen = s.iovecs as _;
                at += s.iovecs;
                self.msgs.push(libc::mmsghdr {
                    msg_hdr: hdr,
                    msg_len: 0,
                });
            }
            // SAFETY: `msgs` holds `n` headers whose iovecs point into `staged` headers,
            // `tx_bufs` frames and `tx_spans` buffers that this link holds and does not
            // touch during the call (their spans were checked to lie inside the frames,
            // in order); the kernel only reads them.
            let rc = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    self.msgs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if rc < 0 {
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => {
                        self.packet_stats.tx_full.add(1);
                        return;
                    }
                    Some(libc::ENOBUFS) => {
                        // The device's queue (or the qdisc's) dropped the first frame, or
                        // the kernel had no memory to copy it: gone, as on a lossy wire.
                        // Kept, it would be offered again at once: the socket polls
                        // writable (its buffer is not what is full), so a driver waiting
                        // for room would spin while the device's queue stays full.
                        self.packet_stats.tx_dropped.add(1);
                        let s = self.staged.remove(0);
                        self.release(s.buf);
                        continue;
                    }
                    _ => {
                        // The first frame is refused (a malformed one): drop it, go on.
                        warn!(ifname = %self.config.ifname, error = %err, "AF_PACKET send refused a frame");
                        self.packet_stats.tx_errors.add(1);
                        let s = self.staged.remove(0);
                        self.release(s.buf);
                        continue;
                    }
                }
            }
            let sent = (rc as usize).min(n);
            self.stats.tx_kicks += 1;
            for i in 0..sent {
                let buf = self.staged[i].buf;
                self.release(buf);
            }
            self.staged.drain(..sent);
            if sent < n {
                // The socket took part of the batch: full for now.
                self.packet_stats.tx_full.add(1);
                return;
            }
        }
    }
}

/// Puts `fd` (bound) into a `PACKET_FANOUT_QM` group; returns the group's id.
fn join_fanout(fd: &OwnedFd, fanout: Fanout) -> io::Result<u16> {
    let (id, flags) = match fanout {
        Fanout::New => (0u16, PACKET_FANOUT_FLAG_UNIQUEID),
        Fanout::Join(id) => (id, 0),
    };
    let arg = u32::from(id) | ((PACKET_FANOUT_QM | flags) << 16);
    set_int(fd, libc::SOL_PACKET, PACKET_FANOUT, arg as libc::c_int)?;
    let mut value: u32 = 0;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: getsockopt writing at most `len` bytes into a local u32.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            PACKET_FANOUT,
            (&mut value as *mut u32).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // The group's id in the low 16 bits, its mode and flags above.
    Ok((value & 0xffff) as u16)
}

impl AsFd for PacketLink {
    /// The socket: readable when a frame waits (for `poll(2)`, epoll, `AsyncFd`).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A queue driver's view: the socket is the readiness source both ways. Whether a frame
/// waits cannot be told without a system call (`rx_ready` is `false`: the driver's
/// rounds ran until a `recvmmsg` found nothing, so it clears the descriptor's readiness
/// and waits for the next edge); frames a full send buffer refused make the link
/// [`tx_blocked`], and the driver waits for the socket to poll writable.
///
/// [`tx_blocked`]: QueueLink::tx_blocked
impl QueueLink for PacketLink {
    fn rx_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn register_rx_waker(&self, _waker: &std::task::Waker) {}

    fn rx_ready(&mut self) -> bool {
        false
    }

    fn tx_blocked(&self) -> bool {
        !self.staged.is_empty()
    }
}

impl Link for PacketLink {
    fn mtu(&self) -> usize {
        self.mtu
    }

    fn recv_batch(&mut self, now: Instant, max: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        self.recv_batch_meta(now, max, &mut |frame, _| f(frame))
    }

    fn recv_batch_meta(
        &mut self,
        _now: Instant,
        max: usize,
        f: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        let n = max.min(self.rx_bufs.len());
        if n == 0 {
            return 0;
        }
        self.iovecs.clear();
        self.msgs.clear();
        for i in 0..n {
            self.iovecs.push(libc::iovec {
                iov_base: self.rx_hdrs[i].as_mut_ptr().cast(),
                iov_len: VNET_HDR_LEN,
            });
            self.iovecs.push(libc::iovec {
                iov_base: self.rx_bufs[i].as_mut_ptr().cast(),
                iov_len: self.rx_bufs[i].len(),
            });
        }
        for i in 0..n {
            // SAFETY: `msghdr` is plain old data; all zeroes is a valid value.
            let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
            hdr.msg_iov = self.iovecs[2 * i..].as_mut_ptr();
            hdr.msg_iovlen = 2;
            self.msgs.push(libc::mmsghdr {
                msg_hdr: hdr,
                msg_len: 0,
            });
        }
        // SAFETY: `msgs` holds `n` headers whose iovecs point into this link's receive
        // buffers and headers, which live across the call and which nothing else touches
        // during it; the kernel writes at most each iovec's length.
        let rc = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                self.msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if rc <= 0 {
            if rc < 0 {
                let err = io::Error::last_os_error();
                if !matches!(err.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
                    warn!(ifname = %self.config.ifname, error = %err, "AF_PACKET receive failed");
                }
            }
            return 0;
        }
        let got = (rc as usize).min(n);
        let mut delivered = 0;
        for i in 0..got {
            let len = self.msgs[i].msg_len as usize;
            let truncated = self.msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            if truncated || len < VNET_HDR_LEN {
                self.packet_stats.rx_truncated.add(u64::from(truncated));
                self.stats.dropped_oversize += 1;
                continue;
            }
            let hdr = self.rx_hdrs[i];
            let frame = &self.rx_bufs[i][..len - VNET_HDR_LEN];
            let verified = hdr[0] & (VNET_F_NEEDS_CSUM | VNET_F_DATA_VALID) != 0;
            let segment_size = if hdr[1] != VNET_GSO_NONE {
                u16::from_le_bytes([hdr[4], hdr[5]])
            } else {
                0
            };
            if segment_size > 0 {
                self.packet_stats.rx_coalesced.add(1);
            }
            if verified {
                self.packet_stats.rx_checksum_verified.add(1);
            }
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += frame.len() as u64;
            delivered += 1;
            f(
                frame,
                RxMeta {
                    checksum_verified: verified,
                    segment_size,
                },
            );
        }
        delivered
    }

    fn tx_batch(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&mut [u8]) -> Option<Range<usize>>,
    ) -> usize {
        self.tx_batch_meta(now, max, &mut |buf| {
            let range = f(buf)?;
            Some((range, TxMeta::default()))
        })
    }

    fn tx_batch_meta(&mut self, now: Instant, max: usize, f: &mut FrameWriter<'_>) -> usize {
        self.tx_batch_gather(now, max, &mut |buf, _tail| f(buf))
    }

    fn tx_batch_gather(&mut self, _now: Instant, max: usize, f: &mut GatherWriter<'_>) -> usize {
        let max_frame = self.max_frame_len();
        let mut produced = 0;
        while produced < max {
            let Some(idx) = self.tx_free.pop() else { break };
            let buf = &mut self.tx_bufs[idx];
            let spans = &mut self.tx_spans[idx];
            let buf_len = buf.len();
            let Some((range, mut meta)) = f(buf, spans) else {
                self.release(idx);
                break;
            };
            produced += 1;
            let limit = if meta.segment_size > 0 && self.config.segmentation {
                MAX_SUPER_FRAME_LEN
            } else {
                max_frame
            };
            let spans = &self.tx_spans[idx];
            let valid = tx_range_ok(&range, buf_len, limit) && spans_ok(spans, &range);
            if valid
                && !spans.is_empty()
                && (!self.config.segmentation || spans.len() > MAX_GATHER_SPANS)
            {
                // No offloads: the checksum below needs the frame in one piece. Or more
                // spans than one message should carry (the kernel takes at most
                // `UIO_MAXIOV`, 1024, iovecs per message): copied into their holes.
                fill_spans(&mut self.tx_bufs[idx], &range, &self.tx_spans[idx]);
                self.tx_spans[idx].clear();
            }
            if !valid {
                self.stats.dropped_oversize += 1;
                self.release(idx);
                continue;
            }
            if !self.config.segmentation {
                // No offloads were offered; a checksum left partial anyway is completed.
                if let (Some(p), Some(frame)) = (
                    meta.partial_checksum.take(),
                    self.tx_bufs[idx].get_mut(range.clone()),
                ) {
                    super::offload::complete_checksum(frame, p);
                }
                meta.segment_size = 0;
            }
            let spans = &self.tx_spans[idx];
            let gathered: usize = spans.iter().map(|s| s.bytes.len()).sum();
            // The header, each span, and the buffer's parts around them.
            let mut iovecs = 1 + spans.len();
            let mut pos = range.start;
            for s in spans {
                iovecs += usize::from(s.at > pos);
                pos = s.at + s.bytes.len();
            }
            iovecs += usize::from(range.end > pos);
            // The headers lie in the buffer (a writer leaves holes only in the payload).
            let hdr = self.vnet_header(&self.tx_bufs[idx][range.clone()], meta);
            if hdr[1] != VNET_GSO_NONE {
                self.packet_stats.tx_super_segments.add(1);
            }
            self.packet_stats.tx_gathered_bytes.add(gathered as u64);
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += range.len() as u64;
            self.staged.push(Staged {
                buf: idx,
                frame: range,
                hdr,
                iovecs,
            });
        }
        produced
    }

    fn flush(&mut self, _now: Instant) {
        self.send_staged();
    }

    fn poll_at(&self) -> Option<Instant> {
        None
    }

    fn stats(&self) -> LinkStats {
        self.stats
    }

    fn offloads(&self) -> Offloads {
        if self.config.segmentation {
            Offloads {
                tx_segmentation: MAX_SUPER_FRAME_LEN,
                tx_checksum: true,
                tx_gather: true,
            }
        } else {
            Offloads::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_can_move_to_another_thread() {
        fn send<T: Send>() {}
        send::<PacketLink>();
    }

    #[test]
    fn a_missing_interface_is_reported() {
        let err = PacketLink::open(PacketLinkConfig::new("nc-no-such0"), |_| {
            Ok::<(), io::Error>(())
        })
        .unwrap_err();
        assert!(
            matches!(err, PacketLinkError::NoSuchInterface { ref ifname } if ifname == "nc-no-such0"),
            "{err}"
        );
    }

    #[test]
    fn bad_settings_are_refused() {
        let mut c = PacketLinkConfig::new("lo");
        c.rx_batch = 0;
        let err = PacketLink::open(c, |_| Ok::<(), io::Error>(())).unwrap_err();
        assert!(
            matches!(err, PacketLinkError::InvalidConfig { .. }),
            "{err}"
        );
    }
}
