//! An AF_XDP socket with its four rings, bound to one queue of an interface: created as
//! `libxdp`'s `xsk_socket__create` does (UMEM registration, ring sizes, `XDP_MMAP_OFFSETS`,
//! the four `mmap`s, `bind`), with the UMEM's TX metadata under this crate's control.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use super::ring::{ConsRing, ProdRing, RingLayout};
use super::sys::{
    get_xdp_option, set_xdp_option, syscall, xdp_socket, Mapping, XdpDesc, XskStatistics,
};
use super::umem::{TxMetadataRequest, Umem};

/// `struct xdp_ring_offset` (Linux 5.4+, with the flags word).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RingOffset {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

/// `struct xdp_mmap_offsets`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct MmapOffsets {
    rx: RingOffset,
    tx: RingOffset,
    fr: RingOffset,
    cr: RingOffset,
}

/// What [`XskSocket::open`] does.
#[derive(Debug, Clone, Copy)]
pub struct XskOptions {
    /// Interface index.
    pub ifindex: u32,
    /// The queue to bind to.
    pub queue_id: u32,
    /// Entries of each of the four rings (a power of two).
    pub ring_size: u32,
    /// `XDP_COPY` or `XDP_ZEROCOPY`, `XDP_USE_NEED_WAKEUP`, `XDP_USE_SG`.
    pub bind_flags: u16,
    /// TX metadata asked of the UMEM registration.
    pub metadata: TxMetadataRequest,
    /// Register the UMEM in unaligned mode (`XDP_UMEM_UNALIGNED_CHUNK_FLAG`).
    pub unaligned: bool,
}

/// Which step of opening a socket failed, and the kernel's error.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct XskError {
    /// The step.
    pub step: &'static str,
    /// The kernel's error.
    #[source]
    pub source: io::Error,
}

impl XskError {
    /// The kernel's error number.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

fn step(step: &'static str) -> impl FnOnce(io::Error) -> XskError {
    move |source| XskError { step, source }
}

/// An AF_XDP socket bound to one queue, with its fill, completion, rx and tx rings.
#[derive(Debug)]
pub struct XskSocket {
    /// Producer of free chunk addresses for the kernel to receive into.
    pub fill: ProdRing<u64>,
    /// Consumer of the addresses of sent frames.
    pub comp: ConsRing<u64>,
    /// Consumer of received frames.
    pub rx: ConsRing<XdpDesc>,
    /// Producer of frames to send.
    pub tx: ProdRing<XdpDesc>,
    /// The TX metadata the UMEM was registered with, or the kernel's refusal of the
    /// request (registered without then).
    pub metadata: Result<TxMetadataRequest, i32>,
    // Dropped last: the rings' mappings go first.
    fd: OwnedFd,
}

impl XskSocket {
    /// Creates a socket, registers `umem` with it (with the TX metadata asked for where
    /// the kernel accepts it, without where it refuses with `EINVAL`), sets up and maps
    /// the rings and binds it.
    pub fn open(umem: &Umem, o: XskOptions) -> Result<XskSocket, XskError> {
        let fd = xdp_socket().map_err(step("creating an AF_XDP socket"))?;
        let metadata = match umem.register(fd.as_fd(), o.metadata, o.unaligned) {
            Ok(()) => Ok(o.metadata),
            Err(e)
                if o.metadata != TxMetadataRequest::None
                    && e.raw_os_error() == Some(libc::EINVAL) =>
            {
                // Kernels before 6.11 know no XDP_UMEM_TX_METADATA_LEN, before 6.8 no TX
                // metadata at all; the failed registration left the socket without one.
                umem.register(fd.as_fd(), TxMetadataRequest::None, o.unaligned)
                    .map_err(step("registering the UMEM"))?;
                Err(libc::EINVAL)
            }
            Err(e) => return Err(step("registering the UMEM")(e)),
        };
        let size = o.ring_size;
        for (opt, what) in [
            (libc::XDP_UMEM_FILL_RING, "sizing the fill ring"),
            (libc::XDP_UMEM_COMPLETION_RING, "sizing the completion ring"),
            (libc::XDP_RX_RING, "sizing the rx ring"),
            (libc::XDP_TX_RING, "sizing the tx ring"),
        ] {
            set_xdp_option(fd.as_fd(), opt, &size).map_err(step(what))?;
        }
        let (off, len) = get_xdp_option::<MmapOffsets>(fd.as_fd(), libc::XDP_MMAP_OFFSETS)
            .map_err(step("reading the ring offsets"))?;
        if len != std::mem::size_of::<MmapOffsets>() {
            return Err(step("reading the ring offsets")(io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel's rings have no flags word (before Linux 5.4)",
            )));
        }
        let layout = |o: RingOffset| RingLayout {
            size,
            producer: o.producer,
            consumer: o.consumer,
            desc: o.desc,
            flags: o.flags,
        };
        let map = |l: RingLayout, entry: usize, pgoff: u64, what: &'static str| {
            Mapping::ring(fd.as_fd(), l.map_len(entry), pgoff).map_err(step(what))
        };
        let bad_layout = || {
            step("mapping the rings")(io::Error::new(
                io::ErrorKind::InvalidData,
                "ring offsets outside the mapping",
            ))
        };
        let (fr, cr, rx, tx) = (
            layout(off.fr),
            layout(off.cr),
            layout(off.rx),
            layout(off.tx),
        );
        let fill = ProdRing::new(
            map(
                fr,
                8,
                libc::XDP_UMEM_PGOFF_FILL_RING,
                "mapping the fill ring",
            )?,
            fr,
        )
        .ok_or_else(bad_layout)?;
        let comp = ConsRing::new(
            map(
                cr,
                8,
                libc::XDP_UMEM_PGOFF_COMPLETION_RING,
                "mapping the completion ring",
            )?,
            cr,
        )
        .ok_or_else(bad_layout)?;
        let rx = ConsRing::new(
            map(
                rx,
                16,
                libc::XDP_PGOFF_RX_RING as u64,
                "mapping the rx ring",
            )?,
            rx,
        )
        .ok_or_else(bad_layout)?;
        let tx = ProdRing::new(
            map(
                tx,
                16,
                libc::XDP_PGOFF_TX_RING as u32 as u64,
                "mapping the tx ring",
            )?,
            tx,
        )
        .ok_or_else(bad_layout)?;
        let addr = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: o.bind_flags,
            sxdp_ifindex: o.ifindex,
            sxdp_queue_id: o.queue_id,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `addr` is a live `sockaddr_xdp` of the length passed; the kernel copies it.
        syscall!(bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_xdp).cast(),
            std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        ))
        .map_err(step("binding"))?;
        Ok(XskSocket {
            fill,
            comp,
            rx,
            tx,
            metadata,
            fd,
        })
    }

    /// Asks the kernel to send what the tx ring holds (`sendto`). A busy or out-of-buffer
    /// kernel (`EAGAIN`, `EBUSY`, `ENOBUFS`) or a down interface (`ENETDOWN`) is no error:
    /// the frames stay on the ring for the next kick.
    pub fn kick_tx(&self) -> io::Result<()> {
        // SAFETY: a sendto(2) with no buffer and no address.
        match syscall!(sendto(
            self.fd.as_raw_fd(),
            std::ptr::null(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null(),
            0,
        )) {
            Ok(_) => Ok(()),
            Err(e) => match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN) => Ok(()),
                _ => Err(e),
            },
        }
    }

    /// Tells the kernel the fill ring has frames again (`recvfrom`, as `libxdp`'s samples).
    pub fn wake_fill(&self) -> io::Result<()> {
        // SAFETY: a recvfrom(2) with no buffer and no address.
        match syscall!(recvfrom(
            self.fd.as_raw_fd(),
            std::ptr::null_mut(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )) {
            Ok(_) => Ok(()),
            Err(e) => match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN) => Ok(()),
                _ => Err(e),
            },
        }
    }

    /// Sleeps in `poll(2)` until the socket is readable, for at most `ms` milliseconds;
    /// returns whether it is.
    pub fn poll_readable(&self, ms: i32) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live `pollfd`, as counted.
        match syscall!(poll(&mut pfd, 1, ms)) {
            Ok(n) => Ok(n > 0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The kernel's counters of this socket (`XDP_STATISTICS`).
    pub fn statistics(&self) -> io::Result<XskStatistics> {
        get_xdp_option::<XskStatistics>(self.fd.as_fd(), libc::XDP_STATISTICS).map(|(s, _)| s)
    }

    /// Copy mode: asks the kernel to send up to `budget` frames per kick
    /// (`XDP_MAX_TX_SKB_BUDGET`, Linux 6.17+).
    pub fn set_tx_skb_budget(&self, budget: u32) -> io::Result<()> {
        set_xdp_option(self.fd.as_fd(), super::sys::XDP_MAX_TX_SKB_BUDGET, &budget)
    }
}

impl AsFd for XskSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
