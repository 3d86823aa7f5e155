//! Errors: [`Error`](enum@Error) of socket operations (with its [`std::io::ErrorKind`]
//! mapping for the tokio layer) and [`ChannelError`] of channel-facing operations.

use netsched::ChannelId;
use thiserror::Error;

use crate::wire::WireError;

#[cfg(doc)]
use super::Event;

/// Errors of socket operations. Non-exhaustive: new failure causes (as `PeerUnreachable`
/// was) may be added without breaking callers' `match`es.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
#[non_exhaustive]
pub enum Error {
    /// The operation cannot make progress now; wait for an [`Event`].
    #[error("operation would block")]
    WouldBlock,
    /// No socket with this id (closed, or never existed).
    #[error("no such virtual socket")]
    InvalidSocket,
    /// The peer has no listener on the port, or its backlog was full.
    #[error("connection refused")]
    ConnectionRefused,
    /// The peer reset the connection (closed its socket with received bytes unread, its
    /// closed socket lingered too long, or it saw a protocol violation), or this end saw
    /// a protocol violation.
    #[error("connection reset by peer")]
    ConnectionReset,
    /// Every channel to the peer was lost and none came back within
    /// [`Config::channel_loss_timeout`](super::Config::channel_loss_timeout) (or none could
    /// be opened); in-order bytes received before stay readable.
    #[error("channel to the peer lost")]
    ChannelLost,
    /// The channels to the peer timed out: it stopped answering (keep-alive probes or
    /// retransmissions went unacknowledged), as when its host went down or the path to it
    /// was cut, and no channel to it came back (see [`Error::ChannelLost`]).
    #[error(
        "peer unreachable: a channel to it timed out (keep-alive or retransmissions unanswered)"
    )]
    PeerUnreachable,
    /// The socket is not connected yet.
    #[error("not connected")]
    NotConnected,
    /// The write side was shut down.
    #[error("write side already shut down")]
    WriteClosed,
    /// The virtual port is already bound.
    #[error("virtual port already in use")]
    AddrInUse,
    /// Nothing is listening on this local virtual port.
    #[error("virtual port not bound")]
    NotListening,
    /// No channel of the socket's class leads to the peer.
    #[error("no channel of the needed class to the peer")]
    NoChannel,
    /// Every ephemeral virtual port to this peer is in use.
    #[error("ephemeral virtual ports exhausted")]
    PortsExhausted,
}

impl Error {
    /// The closest [`std::io::ErrorKind`], for the tokio layer.
    pub fn kind(self) -> std::io::ErrorKind {
        use std::io::ErrorKind as K;
        match self {
            Error::WouldBlock => K::WouldBlock,
            Error::InvalidSocket | Error::NotListening => K::InvalidInput,
            Error::ConnectionRefused => K::ConnectionRefused,
            Error::ConnectionReset => K::ConnectionReset,
            Error::ChannelLost => K::ConnectionAborted,
            Error::PeerUnreachable => K::TimedOut,
            Error::NotConnected => K::NotConnected,
            Error::WriteClosed => K::BrokenPipe,
            Error::AddrInUse | Error::PortsExhausted => K::AddrInUse,
            Error::NoChannel => K::AddrNotAvailable,
        }
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(e.kind(), e)
    }
}

/// Errors of channel-facing operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ChannelError {
    /// The channel was never added, or was lost.
    #[error("unknown channel {0}")]
    UnknownChannel(ChannelId),
    /// The channel was already added.
    #[error("channel {0} already exists")]
    DuplicateChannel(ChannelId),
    /// The channel's byte stream carried a bad chunk header; the channel is treated as
    /// lost ([`Endpoint::handle_channel_lost`](super::Endpoint::handle_channel_lost)) and
    /// must be destroyed.
    #[error("malformed chunk on channel: {0}")]
    Malformed(#[from] WireError),
    /// A chunk was offered ([`Endpoint::handle_chunk`](super::Endpoint::handle_chunk))
    /// while the channel's reads are paused; it was not taken, and the caller keeps it
    /// until [`Event::ChannelUnpaused`](super::Event::ChannelUnpaused).
    #[error("reads of channel {0} are paused")]
    Paused(ChannelId),
    /// The channel is its peer's last usable one: retiring it would strand its sockets.
    #[error("channel {0} is its peer's last one")]
    LastChannel(ChannelId),
}
