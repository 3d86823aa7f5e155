//! A sans-IO TCP (RFC 9293 and the RFCs each submodule names).

pub mod seq;

pub use seq::SeqNumber;
