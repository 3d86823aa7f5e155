//! netchannel: a disaggregated user-space network stack after the NetChannel paper
//! (SIGCOMM 2022).
//!
//! Applications will use `netchannel::VirtualStream` where they would use
//! `tokio::net::TcpStream`. Under it, virtual sockets ([`vns`]) run over a pluggable
//! scheduler ([`netsched`]) over channels ([`netdriver`]), each channel an in-crate TCP
//! connection carried by AF_XDP sockets.
//!
//! Today the crate exposes the channel layer: the wire codecs, the sans-IO TCP and the
//! simulated link. The virtual-socket API arrives with the VNS issue.

pub use netdriver;
pub use netsched;
pub use vns;
