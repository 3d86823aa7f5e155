//! A sans-IO TCP (RFC 9293 and the RFCs each submodule names).

pub mod seq;

pub mod assembler;
pub mod congestion;
pub mod isn;
pub mod rtt;
pub mod sack;

pub use seq::SeqNumber;
