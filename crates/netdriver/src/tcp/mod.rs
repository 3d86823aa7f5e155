//! A sans-IO TCP (RFC 9293 and the RFCs each submodule names).

pub mod seq;

pub mod assembler;
pub mod congestion;
pub mod isn;
pub mod rack;
pub mod rtt;
pub mod sack;
pub mod send_queue;
pub mod sendtimes;
pub mod syncookie;
pub mod time_wait;

pub mod buffer;
pub mod config;
pub mod connection;
pub mod error;

pub use config::Config;
pub use connection::{
    rst_for_unexpected, Connection, OptionChanges, State, Stats, Traffic, Transmit,
};
pub use error::TcpError;
pub use seq::SeqNumber;
