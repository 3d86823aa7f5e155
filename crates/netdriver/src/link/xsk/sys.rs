//! The system calls an AF_XDP socket needs, and the kernel's structures and constants
//! (`<linux/if_xdp.h>`) that `libc` does not carry in a usable form.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// Calls a `libc` function that returns -1 on failure, giving `io::Result` (the pattern of
/// `mio`'s macro of the same name). The call is `unsafe`: each use says why its
/// arguments are sound in a `// SAFETY:` comment.
macro_rules! syscall {
    ($fn:ident ( $($arg:expr),* $(,)? )) => {{
        #[allow(unused_unsafe)]
        let res = unsafe { libc::$fn($($arg,)*) };
        if res == -1 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(res)
        }
    }};
}
pub(crate) use syscall;

/// `SOL_XDP`.
pub const SOL_XDP: libc::c_int = 283;
/// `XDP_MAX_TX_SKB_BUDGET` (Linux 6.17+): the most descriptors one copy-mode `sendto`
/// turns into skbs.
pub const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;
/// `XDP_PKT_CONTD`: the frame continues in the next descriptor.
pub const XDP_PKT_CONTD: u32 = 1 << 0;
/// `XDP_TX_METADATA`: an `xsk_tx_metadata` precedes the descriptor's data.
pub const XDP_TX_METADATA: u32 = 1 << 1;
/// `XDP_UMEM_TX_SW_CSUM`: the kernel completes requested checksums in software.
pub const XDP_UMEM_TX_SW_CSUM: u32 = 1 << 1;
/// `XDP_UMEM_TX_METADATA_LEN`: honour `tx_metadata_len` (required since Linux 6.11).
pub const XDP_UMEM_TX_METADATA_LEN: u32 = 1 << 2;
/// `XDP_TXMD_FLAGS_CHECKSUM`: the metadata asks for a checksum.
pub const XDP_TXMD_FLAGS_CHECKSUM: u64 = 1 << 1;
/// `XDP_RING_NEED_WAKEUP` in a ring's flags word.
pub const XDP_RING_NEED_WAKEUP: u32 = 1 << 0;

/// `struct xdp_desc`: one rx or tx descriptor.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XdpDesc {
    /// Address of the frame's first byte in the UMEM.
    pub addr: u64,
    /// Bytes of the frame (of this part of it, in a chain).
    pub len: u32,
    /// `XDP_PKT_CONTD`, `XDP_TX_METADATA`.
    pub options: u32,
}

/// `struct xsk_tx_metadata` with its request arm (`csum_start`, `csum_offset`): what the
/// `tx_metadata_len` bytes in front of a tx frame hold.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskTxMetadata {
    /// `XDP_TXMD_FLAGS_*`.
    pub flags: u64,
    /// Where the checksummed bytes start, from the frame's first byte.
    pub csum_start: u16,
    /// Where the checksum field lies, from `csum_start`.
    pub csum_offset: u16,
    /// The rest of the union (the completion's `tx_timestamp`) and the launch time.
    pub rest: [u8; 12],
}

/// The bytes reserved for [`XskTxMetadata`] in front of each tx frame (`tx_metadata_len`:
/// a multiple of 8, below 256).
pub const TX_METADATA_LEN: u32 = std::mem::size_of::<XskTxMetadata>() as u32;
const _: () = assert!(TX_METADATA_LEN == 24 && TX_METADATA_LEN % 8 == 0);

/// The kernel's counters of one AF_XDP socket (`XDP_STATISTICS`, `struct xdp_statistics`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskStatistics {
    /// Frames dropped on receive for any reason.
    pub rx_dropped: u64,
    /// Invalid descriptors on the fill ring or rx side.
    pub rx_invalid_descs: u64,
    /// Invalid descriptors on the tx ring.
    pub tx_invalid_descs: u64,
    /// Frames dropped because the rx ring was full.
    pub rx_ring_full: u64,
    /// Receives that found the fill ring empty.
    pub rx_fill_ring_empty_descs: u64,
    /// Kicks that found the tx ring empty.
    pub tx_ring_empty_descs: u64,
}

/// `setsockopt(fd, SOL_XDP, opt, value)`.
pub fn set_xdp_option<T>(fd: BorrowedFd<'_>, opt: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live `T` of the size passed; the kernel copies it and keeps no
    // pointer.
    syscall!(setsockopt(
        fd.as_raw_fd(),
        SOL_XDP,
        opt,
        (value as *const T).cast(),
        std::mem::size_of::<T>() as libc::socklen_t,
    ))
    .map(drop)
}

/// `getsockopt(fd, SOL_XDP, opt)` into a zeroed `T`; returns it and the length the kernel
/// wrote.
pub fn get_xdp_option<T: Default>(fd: BorrowedFd<'_>, opt: libc::c_int) -> io::Result<(T, usize)> {
    let mut value = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `value`, a live `T`, and updates
    // `len`, which lives across the call.
    syscall!(getsockopt(
        fd.as_raw_fd(),
        SOL_XDP,
        opt,
        (&mut value as *mut T).cast(),
        &mut len,
    ))?;
    Ok((value, len as usize))
}

/// A new `AF_XDP` socket.
pub fn xdp_socket() -> io::Result<OwnedFd> {
    // SAFETY: a plain socket(2) call with no pointers.
    let raw = syscall!(socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0))?;
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A memory mapping, unmapped when dropped.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is plain memory; who may touch which bytes when is the business of
// the types built on it, which are `Send` only where their protocol allows.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Anonymous shared memory of `len` bytes, populated at once (by the calling thread,
    /// under its memory policy), in huge pages when `huge`.
    pub fn anonymous(len: usize, huge: bool) -> io::Result<Mapping> {
        let mut flags = libc::MAP_ANONYMOUS | libc::MAP_SHARED | libc::MAP_POPULATE;
        if huge {
            flags |= libc::MAP_HUGETLB;
        }
        // SAFETY: a fresh anonymous mapping at an address the kernel picks; nothing else
        // refers to it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        Mapping::from_mmap(ptr, len)
    }

    /// The ring of socket `fd` at page offset `pgoff` (`XDP_PGOFF_*`), `len` bytes.
    pub fn ring(fd: BorrowedFd<'_>, len: usize, pgoff: u64) -> io::Result<Mapping> {
        // SAFETY: maps the socket's ring at an address the kernel picks; the kernel
        // checks `len` against the ring it allocated.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                pgoff as libc::off_t,
            )
        };
        Mapping::from_mmap(ptr, len)
    }

    fn from_mmap(ptr: *mut libc::c_void, len: usize) -> io::Result<Mapping> {
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        Ok(Mapping { ptr, len })
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes mapped.
    pub fn size(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `mmap` with this address and length, and every
        // borrow of its memory is tied to `self`'s lifetime.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<XdpDesc>(), 16);
        assert_eq!(std::mem::size_of::<XskTxMetadata>(), 24);
        assert_eq!(std::mem::offset_of!(XskTxMetadata, csum_offset), 10);
        assert_eq!(std::mem::size_of::<XskStatistics>(), 48);
        assert_eq!(std::mem::size_of::<libc::xdp_umem_reg>(), 32);
    }

    #[test]
    fn anonymous_memory_is_mapped_and_writable() {
        let m = Mapping::anonymous(8192, false).unwrap();
        assert_eq!(m.size(), 8192);
        // SAFETY: the mapping is 8192 bytes long, owned here, and shared with nobody.
        let bytes = unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), m.size()) };
        bytes[8191] = 7;
        assert_eq!(bytes[8191], 7);
    }
}
