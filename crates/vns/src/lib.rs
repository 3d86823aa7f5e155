//! Virtual sockets for netchannel (the NetChannel paper's "virtual network system" layer).
//!
//! This crate will hold the user-facing `VirtualStream` and `VirtualListener`, the
//! NetChannel chunk header, per-socket transmit/receive buffers, reordering of chunks that
//! arrive over several channels, per-socket credit flow control with the paper's response
//! queue against head-of-line blocking, and the copy workers.
//!
//! Nothing is implemented yet: see the issue "VNS: VirtualStream and VirtualListener over
//! many channels, with copy workers". No placeholder API is exported until it is real.
#![forbid(unsafe_code)]
