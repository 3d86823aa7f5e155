//! Virtual sockets for netchannel (the NetChannel paper's "virtual network system" layer):
//! the sans-IO core.
//!
//! An [`Endpoint`] is one host's virtual sockets over its channels to other hosts. It is a
//! deterministic state machine: the caller feeds it the bytes each channel receives and
//! polls it for the chunks each channel should send, and the application side calls
//! `connect`/`accept`/`send`/`recv`/`shutdown`/`close` on socket ids. Chunks carry the
//! NetChannel header ([`wire`], documented in `docs/wire-format.md`); a [`Deframer`] cuts
//! them out of each channel's byte stream; a [`NetScheduler`](netsched::NetScheduler)
//! picks the channel for every data chunk; a [`ReorderBuffer`] per socket restores the
//! byte order; per-socket credit, a [`ResponseQueue`] charged to channel budgets and
//! STOP/RESUME keep a socket whose reader sleeps from stalling the channels it shares.
//!
//! The [`stack`] module binds this core to channels and to tokio: a [`Stack`] (endpoint
//! shards over channels, AF_XDP or in-memory, whose NIC queues' drivers hand received
//! chunks to the shards, and one control task for what is not per message) and the
//! user-facing
//! [`VirtualStream`] and [`VirtualListener`]. [`copy`] holds the copy workers the stack
//! shares large reads and writes with ([`StackBuilder::copy_workers`](stack::StackBuilder::copy_workers)).
//!
//! # Example
//!
//! Two endpoints joined by one channel, with the bytes moved by hand:
//!
//! ```
//! use vns::{ChannelClass, ChannelId, Config, Endpoint, Error, PeerId};
//! use netsched::{AppClass, RoundRobin};
//!
//! let mut client = Endpoint::new(Config::default(), RoundRobin::default())?;
//! let mut server = Endpoint::new(Config::default(), RoundRobin::default())?;
//! let ch = ChannelId(0);
//! client.add_channel(ch, PeerId(1), ChannelClass::Throughput)?;
//! server.add_channel(ch, PeerId(0), ChannelClass::Throughput)?;
//! server.bind(7000, 16)?;
//!
//! // Move every pending chunk from one endpoint to the other (a real driver writes them
//! // into the channel, and the peer's channel hands them to `handle_chunk_bytes`).
//! fn deliver(from: &mut Endpoint, to: &mut Endpoint, ch: ChannelId) -> bool {
//!     let mut bytes = Vec::new();
//!     while from.poll_transmit(ch, &mut bytes).is_some() {}
//!     assert_eq!(to.handle_chunk_bytes(ch, &bytes).unwrap(), bytes.len());
//!     !bytes.is_empty()
//! }
//! fn pump(a: &mut Endpoint, b: &mut Endpoint, ch: ChannelId) {
//!     while deliver(a, b, ch) | deliver(b, a, ch) {}
//! }
//!
//! let sock = client.connect(PeerId(1), 7000, AppClass::Throughput)?;
//! client.send(sock, b"hello, virtual world")?;
//! client.shutdown(sock)?;
//! pump(&mut client, &mut server, ch);
//! assert!(client.is_connected(sock));
//!
//! let accepted = server.accept(7000)?;
//! let mut buf = [0u8; 64];
//! let n = server.recv(accepted, &mut buf)?;
//! assert_eq!(&buf[..n], b"hello, virtual world");
//! assert_eq!(server.recv(accepted, &mut buf), Ok(0)); // end of stream
//! assert_eq!(server.recv(accepted, &mut buf), Ok(0));
//! # let _ = Error::WouldBlock;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod copy;
pub mod deframer;
pub mod ecosystem;
mod endpoint;
pub mod hello;
pub mod reorder;
pub mod response_queue;
pub mod stack;
pub mod wire;

pub use deframer::{Chunk, Deframer};
pub use endpoint::{
    ChannelError, ChannelLoad, Config, ConfigError, Endpoint, EndpointCounters, Error, Event,
    PeerId, ShardOf, SocketId, SocketOptions, SocketStats, EARLY_CHUNK_COST, MAX_QUEUED_REPLIES,
    RESET_ORDERED, SYNC_RETRY_MAX,
};
pub use netsched::{AppClass, ChannelClass, ChannelId};
pub use reorder::ReorderBuffer;
pub use response_queue::ResponseQueue;
pub use stack::{
    default_stack, set_default_stack, BusyPoll, Diagnostics, Liveness, Stack, StackBuilder,
    StackError, VirtualListener, VirtualSocket, VirtualStream,
};
pub use wire::{ChunkPacket, ChunkRepr, ChunkType, Seq};
