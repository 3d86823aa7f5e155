//! NetDriver: the channel layer of netchannel.
//!
//! A *channel* is one L4 connection between two hosts, here an in-crate TCP connection that
//! runs in user space. This crate holds everything below the virtual sockets:
//!
//! - [`wire`]: zero-copy views and parsed representations of Ethernet II, ARP, IPv4 and TCP,
//!   and the Internet checksum. Parsing never panics on any input.
//! - [`tcp`]: a sans-IO TCP. A connection is a deterministic state machine that is fed
//!   received segments with the current time and polled for segments to send and for its
//!   next deadline. It never reads a clock and never touches a socket.
//! - [`link`]: frame pipes. The simulated link (virtual time, latency, bandwidth, MTU) and a
//!   fault-injection layer that wraps any link; the AF_XDP link implements the same trait.
//! - [`time`]: the `Instant` type that every state machine takes as an argument.
//! - [`neigh`]: peers' MAC addresses from the kernel's neighbour table (netlink), with
//!   resolution triggered through the kernel's own ARP.
//! - [`ports`]: the stack's ephemeral port range, kept outside the kernel's.
//! - [`rss`]: receive-side scaling: the Toeplitz hash, reading a NIC's RSS, choosing
//!   local ports whose frames land on a channel's queue, ntuple rules.
//!
//! `netdriver` knows nothing of virtual sockets.

pub mod channel;
pub mod link;
pub mod log_limit;
pub mod neigh;
pub mod netif;
pub mod ports;
pub mod rss;
pub mod tcp;
pub mod time;
pub mod wire;
