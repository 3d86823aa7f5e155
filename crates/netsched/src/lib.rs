//! The NetChannel scheduler layer.
//!
//! This crate will hold the `NetScheduler` trait and its policies: which channel carries
//! each chunk of a virtual socket, how many channels exist and on which cores they run, and
//! which copy worker copies a transfer. A scheduler sees only statistics snapshots (queue
//! occupancy, bytes in flight, per-thread utilisation, application class) and returns
//! decisions, so users can write their own policies.
//!
//! Nothing is implemented yet; no placeholder API is exported until it is real.
#![forbid(unsafe_code)]
