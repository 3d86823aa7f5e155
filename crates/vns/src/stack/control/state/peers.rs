//! Peers as the control lock holds them: each one's channels by class and the opening of
//! channels to it. The control task's `peers.rs` opens, adds and loses the channels.

use std::io;
use std::sync::Arc;
use std::task::Waker;

use crate::endpoint::PeerId;
use crate::hello::RssDescription;

/// Where the opening of channels to a peer is.
#[derive(Debug)]
pub(in crate::stack::control) enum Opening {
    Idle,
    Running {
        attempt: u64,
        waiters: Vec<Waker>,
    },
    Failed {
        attempt: u64,
        kind: io::ErrorKind,
        msg: String,
    },
}

/// A peer: its channels by class and the opening of channels to it.
#[derive(Debug)]
pub(crate) struct Peer {
    pub(in crate::stack::control) id: PeerId,
    pub(in crate::stack::control) throughput: usize,
    pub(in crate::stack::control) latency: usize,
    pub(in crate::stack::control) opening: Opening,
    /// This stack opened channels to the peer (so it opens them again when all are lost;
    /// a peer that opened them does that itself).
    pub(in crate::stack::control) opened: bool,
    /// The peer's RSS as its hello at this stack's last opening described it: channels
    /// opened later (the scheduler's plans) aim at its queues too.
    pub(in crate::stack::control) rss: Option<Arc<RssDescription>>,
}

impl Peer {
    pub(in crate::stack::control) fn new(id: PeerId) -> Peer {
        Peer {
            id,
            throughput: 0,
            latency: 0,
            opening: Opening::Idle,
            opened: false,
            rss: None,
        }
    }
}
