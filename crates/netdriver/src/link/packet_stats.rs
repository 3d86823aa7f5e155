//! The AF_PACKET link's counters beyond [`LinkStats`](super::LinkStats): a snapshot
//! ([`PacketLinkStats`]) and the shared words the link counts in ([`PacketCounters`]),
//! which the channel set reads for its queue statistics while a queue driver owns the
//! link.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the AF_PACKET link beyond [`LinkStats`](super::LinkStats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketLinkStats {
    /// Frames received that held several wire segments (the kernel's GRO, or a local
    /// sender's GSO carried whole).
    pub rx_coalesced: u64,
    /// Frames received whose checksum the kernel vouched for.
    pub rx_checksum_verified: u64,
    /// Frames received longer than the buffer (cut: dropped, and in
    /// [`LinkStats::dropped_oversize`](super::LinkStats::dropped_oversize)).
    pub rx_truncated: u64,
    /// Super-segments handed to the kernel to segment.
    pub tx_super_segments: u64,
    /// `sendmmsg` calls that found the socket buffer full (frames kept for the next flush).
    pub tx_full: u64,
    /// Frames the device or its queueing discipline dropped (`ENOBUFS`: a full queue, or
    /// no memory for the copy); gone, as on a lossy wire.
    pub tx_dropped: u64,
    /// Frames the kernel dropped because the socket's receive buffer was full
    /// (`PACKET_STATISTICS`' `tp_drops`, summed over `PacketLink::kernel_drops` calls).
    pub rx_socket_drops: u64,
    /// Frames the kernel refused (`sendmmsg` error other than a full buffer); dropped.
    pub tx_errors: u64,
    /// Bytes sent from shared buffers behind a frame's head ([`Link::tx_batch_gather`]'s
    /// tails), which the kernel read where they lay and user space never copied.
    ///
    /// [`Link::tx_batch_gather`]: super::Link::tx_batch_gather
    pub tx_gathered_bytes: u64,
}

/// One counter with a single writer (the link, from its driver's round): an increment is a
/// plain load and store, no locked instruction; any thread may read it.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The counters an AF_PACKET link keeps, shared with whoever reports them
/// (`PacketLink::counters`).
#[derive(Debug, Default)]
pub struct PacketCounters {
    pub(crate) rx_coalesced: Counter,
    pub(crate) rx_checksum_verified: Counter,
    pub(crate) rx_truncated: Counter,
    pub(crate) tx_super_segments: Counter,
    pub(crate) tx_full: Counter,
    pub(crate) tx_dropped: Counter,
    /// Written by whoever collects the kernel's count (the link, or the set reporting
    /// it), so added atomically.
    rx_socket_drops: AtomicU64,
    pub(crate) tx_errors: Counter,
    pub(crate) tx_gathered_bytes: Counter,
}

impl PacketCounters {
    /// What the counters hold now.
    pub fn snapshot(&self) -> PacketLinkStats {
        PacketLinkStats {
            rx_coalesced: self.rx_coalesced.get(),
            rx_checksum_verified: self.rx_checksum_verified.get(),
            rx_truncated: self.rx_truncated.get(),
            tx_super_segments: self.tx_super_segments.get(),
            tx_full: self.tx_full.get(),
            tx_dropped: self.tx_dropped.get(),
            rx_socket_drops: self.rx_socket_drops.load(Ordering::Relaxed),
            tx_errors: self.tx_errors.get(),
            tx_gathered_bytes: self.tx_gathered_bytes.get(),
        }
    }

    /// Takes the kernel's drop count from the link's socket `fd` (it resets on reading)
    /// into [`PacketLinkStats::rx_socket_drops`]; returns the new total.
    pub fn collect_socket_drops(&self, fd: BorrowedFd<'_>) -> std::io::Result<u64> {
        let n = take_socket_drops(fd)?;
        Ok(self.rx_socket_drops.fetch_add(n, Ordering::Relaxed) + n)
    }
}

/// Reads and resets the kernel's count of frames an AF_PACKET socket dropped for a full
/// receive buffer (`PACKET_STATISTICS`' `tp_drops`).
fn take_socket_drops(fd: BorrowedFd<'_>) -> io::Result<u64> {
    #[repr(C)]
    #[derive(Default)]
    struct TpacketStats {
        tp_packets: u32,
        tp_drops: u32,
    }
    const PACKET_STATISTICS: libc::c_int = 6;
    let mut st = TpacketStats::default();
    let mut len = std::mem::size_of::<TpacketStats>() as libc::socklen_t;
    // SAFETY: getsockopt writing at most `len` bytes into a local `tpacket_stats`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            PACKET_STATISTICS,
            (&mut st as *mut TpacketStats).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from(st.tp_drops))
}
