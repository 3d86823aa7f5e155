//! Who completes the TCP checksums of the frames an AF_XDP link sends ([`TxChecksum`]),
//! and the TX metadata that asks the kernel to (see the
//! [AF_XDP link's documentation](super::xdp#checksum-offload-through-tx-metadata)).

use std::io;

use super::xsk::sys::{XskTxMetadata, XDP_TXMD_FLAGS_CHECKSUM};
use super::PartialChecksum;

/// The environment variable a default stack reads
/// [`XdpLinkConfig::tx_checksum_offload`](super::xdp::XdpLinkConfig::tx_checksum_offload)
/// from: `1` (the default) or `0`.
pub const TX_CHECKSUM_ENV: &str = "NETCHANNEL_XDP_TX_CHECKSUM";

/// How an open AF_XDP link's transmitted TCP checksums are completed
/// ([`XdpLink::tx_checksum`](super::xdp::XdpLink::tx_checksum)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxChecksum {
    /// Each frame carries a checksum request in its TX metadata and only the pseudo-header
    /// sum: the device completes it (in copy mode the kernel's skb goes out
    /// `CHECKSUM_PARTIAL`, completed by the driver's offload, the kernel's software
    /// fallback for a device without, or, between veth peers, not at all).
    Offload,
    /// As [`Offload`](Self::Offload), but the kernel completes the checksum in software
    /// when it takes the frame (`XDP_UMEM_TX_SW_CSUM`): a zero-copy driver that does not
    /// advertise TX checksum offload.
    KernelSoftware,
    /// The link sums each frame itself.
    Software {
        /// Why not one of the above.
        reason: SoftwareChecksum,
    },
}

/// Why an AF_XDP link sums its frames itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SoftwareChecksum {
    /// Turned off ([`XdpLinkConfig::tx_checksum_offload`](super::xdp::XdpLinkConfig::tx_checksum_offload)).
    Off,
    /// The kernel refused a UMEM with TX metadata (before Linux 6.11: `EINVAL`).
    Refused {
        /// The kernel's error.
        errno: i32,
    },
}

impl TxChecksum {
    /// Whether frames carry checksum requests (the link does not sum them).
    pub fn is_requested(self) -> bool {
        !matches!(self, TxChecksum::Software { .. })
    }
}

impl std::fmt::Display for TxChecksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TxChecksum::Offload => f.write_str("offload (TX metadata)"),
            TxChecksum::KernelSoftware => {
                f.write_str("kernel software (TX metadata, XDP_UMEM_TX_SW_CSUM)")
            }
            TxChecksum::Software { reason } => write!(f, "software ({reason})"),
        }
    }
}

impl std::fmt::Display for SoftwareChecksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SoftwareChecksum::Off => f.write_str("offload turned off"),
            SoftwareChecksum::Refused { errno } => write!(
                f,
                "TX metadata refused: {}",
                io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

/// The TX metadata asking for `partial` to be completed, as the bytes that precede the
/// frame in its chunk.
pub fn checksum_request(partial: PartialChecksum) -> [u8; 24] {
    let meta = XskTxMetadata {
        flags: XDP_TXMD_FLAGS_CHECKSUM,
        csum_start: partial.start,
        csum_offset: partial.offset,
        rest: [0; 12],
    };
    let mut out = [0u8; 24];
    out[..8].copy_from_slice(&meta.flags.to_ne_bytes());
    out[8..10].copy_from_slice(&meta.csum_start.to_ne_bytes());
    out[10..12].copy_from_slice(&meta.csum_offset.to_ne_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_has_the_kernels_layout() {
        let b = checksum_request(PartialChecksum {
            start: 34,
            offset: 16,
        });
        assert_eq!(u64::from_ne_bytes(b[..8].try_into().unwrap()), 1 << 1);
        assert_eq!(u16::from_ne_bytes([b[8], b[9]]), 34);
        assert_eq!(u16::from_ne_bytes([b[10], b[11]]), 16);
        assert!(b[12..].iter().all(|&x| x == 0));
    }

    #[test]
    fn modes_say_what_they_are() {
        assert!(TxChecksum::Offload.is_requested());
        assert!(TxChecksum::KernelSoftware.is_requested());
        let off = TxChecksum::Software {
            reason: SoftwareChecksum::Off,
        };
        assert!(!off.is_requested());
        assert_eq!(off.to_string(), "software (offload turned off)");
        assert!(TxChecksum::Software {
            reason: SoftwareChecksum::Refused {
                errno: libc::EINVAL
            }
        }
        .to_string()
        .starts_with("software (TX metadata refused"));
    }
}
