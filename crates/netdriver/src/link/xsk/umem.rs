//! The UMEM: the memory an AF_XDP socket shares with the kernel, cut into equal chunks
//! (aligned mode), and its registration (`XDP_UMEM_REG`) with room for TX metadata.
//!
//! A chunk is owned by whoever holds its address: this process while it is in no ring, the
//! kernel from the moment it is published on the fill or tx ring until it comes back on
//! the rx or completion ring. [`Umem::frame`] and [`Umem::frame_mut`] lend a chunk's
//! bytes, [`Umem::span_mut`] those of adjacent chunks; their callers vouch that they own
//! them.
//!
//! In unaligned mode (`XDP_UMEM_UNALIGNED_CHUNK_FLAG`) a tx descriptor may start anywhere
//! and cross into the next chunk (up to a chunk's length), and the kernel gives a received
//! frame's address as the fill ring's address plus the data's offset in the upper 16 bits
//! ([`data_addr`] decodes both forms).

use std::io;
use std::os::fd::BorrowedFd;

use super::sys::{
    set_xdp_option, Mapping, TX_METADATA_LEN, XDP_UMEM_TX_METADATA_LEN, XDP_UMEM_TX_SW_CSUM,
};

/// What a UMEM registration asks for beyond the memory itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxMetadataRequest {
    /// No TX metadata (`tx_metadata_len` 0).
    None,
    /// [`TX_METADATA_LEN`] bytes of TX metadata before each tx frame; with `sw_csum`, the
    /// kernel completes requested checksums itself (`XDP_UMEM_TX_SW_CSUM`, for zero-copy
    /// drivers without checksum offload).
    Metadata {
        /// `XDP_UMEM_TX_SW_CSUM`.
        sw_csum: bool,
    },
}

/// A UMEM of `chunk_count` chunks of `chunk_size` bytes.
#[derive(Debug)]
pub struct Umem {
    map: Mapping,
    chunk_size: u32,
}

impl Umem {
    /// Maps the memory (populated by the calling thread, so under its memory policy; in
    /// huge pages when `huge`).
    pub fn new(chunk_count: u32, chunk_size: u32, huge: bool) -> io::Result<Umem> {
        let len = chunk_count as usize * chunk_size as usize;
        Ok(Umem {
            map: Mapping::anonymous(len, huge)?,
            chunk_size,
        })
    }

    /// Registers the memory with socket `fd` (`XDP_UMEM_REG`), no headroom, in aligned or
    /// unaligned mode.
    pub fn register(
        &self,
        fd: BorrowedFd<'_>,
        metadata: TxMetadataRequest,
        unaligned: bool,
    ) -> io::Result<()> {
        let (tx_metadata_len, mut flags) = match metadata {
            TxMetadataRequest::None => (0, 0),
            TxMetadataRequest::Metadata { sw_csum } => (
                TX_METADATA_LEN,
                XDP_UMEM_TX_METADATA_LEN | if sw_csum { XDP_UMEM_TX_SW_CSUM } else { 0 },
            ),
        };
        if unaligned {
            flags |= libc::XDP_UMEM_UNALIGNED_CHUNK_FLAG;
        }
        let reg = libc::xdp_umem_reg {
            addr: self.map.as_ptr() as u64,
            len: self.map.size() as u64,
            chunk_size: self.chunk_size,
            headroom: 0,
            flags,
            tx_metadata_len,
        };
        set_xdp_option(fd, libc::XDP_UMEM_REG, &reg)
    }

    /// The address of the UMEM's first byte.
    pub fn base(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// Bytes of the UMEM.
    pub fn size(&self) -> usize {
        self.map.size()
    }

    /// Bytes per chunk.
    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    /// The chunk an address lies in (its first byte's address).
    pub fn chunk_of(&self, addr: u64) -> u64 {
        addr & !u64::from(self.chunk_size - 1)
    }

    /// `len` bytes at UMEM address `addr`, or `None` when they would leave `addr`'s chunk.
    ///
    /// # Safety
    ///
    /// The chunk must be this process's (in no ring the kernel reads or writes) for as
    /// long as the borrow lives, or be one the kernel handed over and writes no more.
    pub unsafe fn frame(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let at = self.check(addr, len)?;
        // SAFETY: `check` keeps the range inside one chunk of the mapping; the caller
        // vouches that nobody writes it while the borrow lives.
        Some(unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(at), len) })
    }

    /// `len` bytes at UMEM address `addr` to write, or `None` when they would leave
    /// `addr`'s chunk.
    ///
    /// # Safety
    ///
    /// The chunk must be this process's (in no ring) and not otherwise borrowed for as
    /// long as the borrow lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn frame_mut(&self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let at = self.check(addr, len)?;
        // SAFETY: `check` keeps the range inside one chunk of the mapping; the caller
        // vouches that the chunk is exclusively its own while the borrow lives.
        Some(unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(at), len) })
    }

    /// `len` bytes at UMEM address `addr` to write, across chunk boundaries, or `None`
    /// when they would leave the UMEM.
    ///
    /// # Safety
    ///
    /// Every chunk the range touches must be this process's (in no ring) and not otherwise
    /// borrowed for as long as the borrow lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn span_mut(&self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let end = addr.checked_add(len as u64)?;
        if end > self.map.size() as u64 {
            return None;
        }
        // SAFETY: the range lies inside the mapping; the caller vouches that its chunks
        // are exclusively its own while the borrow lives.
        Some(unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(addr as usize), len) })
    }

    fn check(&self, addr: u64, len: usize) -> Option<usize> {
        let end = addr.checked_add(len as u64)?;
        let chunk_end = self.chunk_of(addr) + u64::from(self.chunk_size);
        (end <= chunk_end && end <= self.map.size() as u64).then_some(addr as usize)
    }
}

/// The bits of an unaligned-mode address that hold the base address; the offset lies
/// above them (`XSK_UNALIGNED_BUF_ADDR_MASK`, `XSK_UNALIGNED_BUF_OFFSET_SHIFT`).
const UNALIGNED_ADDR_MASK: u64 = (1 << 48) - 1;

/// A descriptor's address as a plain UMEM address: in unaligned mode the base plus the
/// offset the kernel put in the upper 16 bits; aligned-mode addresses (upper bits zero)
/// are unchanged.
pub fn data_addr(addr: u64) -> u64 {
    (addr & UNALIGNED_ADDR_MASK) + (addr >> 48)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_addresses_are_decoded() {
        assert_eq!(data_addr(8192 + 256), 8192 + 256);
        assert_eq!(data_addr((256 << 48) | 8192), 8192 + 256);
        let umem = Umem::new(4, 2048, false).unwrap();
        // SAFETY: no socket shares this UMEM; nothing else borrows it.
        unsafe {
            assert_eq!(umem.span_mut(256, 4000).map(|s| s.len()), Some(4000));
            assert!(umem.span_mut(4096, 4097).is_none(), "beyond the UMEM");
        }
    }

    #[test]
    fn frames_stay_inside_their_chunk() {
        let umem = Umem::new(4, 2048, false).unwrap();
        assert_eq!(umem.size(), 8192);
        assert_eq!(umem.chunk_of(2048 + 300), 2048);
        // SAFETY: no socket shares this UMEM; nothing else borrows it.
        unsafe {
            assert_eq!(umem.frame(2048 + 256, 1792).map(<[u8]>::len), Some(1792));
            assert!(
                umem.frame(2048 + 256, 1793).is_none(),
                "crosses into the next chunk"
            );
            assert!(umem.frame(3 * 2048, 2049).is_none(), "beyond the UMEM");
            assert!(umem.frame(u64::MAX - 4, 8).is_none());
            umem.frame_mut(256, 4).unwrap().copy_from_slice(b"abcd");
            assert_eq!(umem.frame(256, 4).unwrap(), b"abcd");
        }
    }
}
