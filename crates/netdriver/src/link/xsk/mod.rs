//! AF_XDP sockets, UMEMs and rings, driven directly through the kernel's interface
//! (`<linux/if_xdp.h>`), for the [AF_XDP link](super::xdp).
//!
//! - [`sys`]: the system calls, structures and constants;
//! - [`umem`]: the shared memory and its registration, with TX metadata
//!   (`tx_metadata_len`, Linux 6.8+; the `XDP_UMEM_TX_METADATA_LEN` flag, 6.11+);
//! - [`ring`]: the single-producer, single-consumer rings and their index arithmetic;
//! - [`socket`]: a socket with its four rings, bound to a queue.
//!
//! Owning this code (rather than going through `libxdp`'s `xsk_umem__create`, which
//! cannot ask for TX metadata) lets a tx descriptor point anywhere in its chunk and carry
//! a checksum request (`XDP_TX_METADATA`).

pub mod ring;
pub mod socket;
pub mod sys;
pub mod umem;

pub use socket::{XskError, XskOptions, XskSocket};
pub use sys::{XdpDesc, XskStatistics, XskTxMetadata};
pub use umem::{TxMetadataRequest, Umem};
