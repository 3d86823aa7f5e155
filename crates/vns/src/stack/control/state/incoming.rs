//! Accepted channels as the control lock holds them while their handshakes run: the
//! channel, what it has sent so far and where it is in the exchange. The control task's
//! `incoming.rs` reads and judges them.

use std::net::SocketAddrV4;
use std::time::Instant;

use netdriver::channel::Channel;
use netsched::ChannelClass;

use crate::stack::auth;

/// An accepted channel whose handshake is under way.
pub(in crate::stack::control) struct Incoming {
    pub(in crate::stack::control) t: Channel,
    pub(in crate::stack::control) peer: SocketAddrV4,
    pub(in crate::stack::control) got: Vec<u8>,
    pub(in crate::stack::control) stage: Stage,
    /// When the channel is dropped if its preamble is not complete.
    pub(in crate::stack::control) deadline: Instant,
}

/// What an opened channel is for, as its preamble's class byte says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A channel of the class, which joins the endpoints.
    Channel(ChannelClass),
    /// A channel that asks for the acceptor's hello (its RSS, `crate::hello`), which
    /// answers and closes it; it carries no chunks.
    Hello,
}

/// Where an accepted channel is in its handshake.
#[derive(Debug)]
pub(in crate::stack::control) enum Stage {
    /// Reading the preamble (and the opener's nonce when it authenticates).
    Preamble,
    /// Our nonce and tag are sent; reading the opener's tag.
    Challenged {
        kind: Kind,
        nc: [u8; auth::NONCE_LEN],
        ns: [u8; auth::NONCE_LEN],
    },
}
