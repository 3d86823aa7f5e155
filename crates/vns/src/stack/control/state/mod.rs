//! The control lock's state ([`Control`], behind `Core::ctl`): everything the control
//! task and the calls that take the lock share. Plain data: one file here for each concept
//! of the control task (`drain.rs`, `incoming.rs`, `peers.rs`, `plans.rs`), beside the
//! control file of the same name that acts on it with the core. Nothing here knows the
//! core, so the core can hold this state without the control task's files.

pub(super) mod drain;
pub(super) mod hello;
pub(super) mod incoming;
pub(super) mod peers;
pub(super) mod plans;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use netdriver::channel::{Channel, ChannelListener};

use super::super::auth::ChannelKey;
use super::super::channel::Chan;
use crate::endpoint::PeerId;
use drain::{StopOutcome, Stopping, Waiter};
use hello::HelloCounts;
use incoming::Incoming;
use peers::Peer;
use plans::PlanState;

/// Everything behind the control lock: channels being accepted, peers and the opening
/// of channels to them, waiters, a stop in progress.
pub(crate) struct Control {
    pub(super) incoming: Vec<Incoming>,
    pub(super) peers: HashMap<Ipv4Addr, Peer>,
    pub(super) peer_ips: HashMap<PeerId, Ipv4Addr>,
    pub(super) next_channel: u32,
    pub(super) next_peer: u32,
    pub(super) next_attempt: u64,
    /// The control task has stopped: no channel will ever move again.
    pub stopped: bool,
    /// Plain-TCP channels closed gracefully whose streams are gone, watched until their
    /// bytes and FIN are acknowledged and the peer's FIN is in, or their linger deadline.
    pub(super) closing_plain: Vec<ClosingPlain>,
    /// Closed plain-TCP channels reset because they were not finished within the
    /// endpoint's `linger_timeout` (bytes unacknowledged, or no FIN from the peer).
    pub plain_linger_expired: u64,
    pub(super) preamble_timeout: Duration,
    pub(super) channel_key: Option<ChannelKey>,
    pub(super) linger_timeout: Duration,
    /// Accepted channels aborted before they joined: no preamble in time, too many
    /// waiting, a bad preamble, or failed authentication.
    pub dropped_channels: u64,
    /// Of those, channels that failed authentication (no, or a wrong, proof of the key;
    /// or asking to authenticate when this stack has no key).
    pub auth_failures: u64,
    /// Hellos answered and asked for.
    pub hellos: HelloCounts,
    /// The channel port's listener; `None` once it failed or the stack is stopping.
    pub(super) acceptor: Option<ChannelListener>,
    /// Tasks waiting for a [`Goal`](drain::Goal).
    pub(super) waiters: Vec<Waiter>,
    pub(super) next_waiter: u64,
    /// Readings of `pending_tx_bytes` in a row that found 0 (taken while someone waits).
    pub(super) zero_checks: u32,
    /// When the next reading is due.
    pub(super) next_check: Option<Instant>,
    /// A graceful stop in progress: no new channels or streams, the open ones draining.
    pub stopping: Option<Stopping>,
    /// Channels closed by a graceful stop, kept until their peers have seen the end.
    pub(super) closing_chans: Vec<Arc<Chan>>,
    /// How the stack stopped (`None` while it runs).
    pub stop_outcome: Option<StopOutcome>,
    /// Peers whose last channel was lost, to open channels to again.
    pub(super) reopen: Vec<Ipv4Addr>,
    /// Carrying out the scheduler's plans (`plans.rs`).
    pub(crate) plans: PlanState,
}

/// A plain-TCP channel closed gracefully whose stream is gone.
pub(super) struct ClosingPlain {
    pub(super) t: Channel,
    /// Reset if not finished by then.
    pub(super) deadline: Instant,
    /// The peer's FIN came (every byte it sent was dequeued).
    pub(super) finished: bool,
}

impl Control {
    /// The control state of a stack that listens for channels with `acceptor`.
    pub(crate) fn new(
        acceptor: ChannelListener,
        preamble_timeout: Duration,
        channel_key: Option<ChannelKey>,
        linger_timeout: Duration,
    ) -> Control {
        Control {
            incoming: Vec::new(),
            peers: HashMap::new(),
            peer_ips: HashMap::new(),
            next_channel: 0,
            next_peer: 0,
            next_attempt: 0,
            stopped: false,
            closing_plain: Vec::new(),
            plain_linger_expired: 0,
            preamble_timeout,
            channel_key,
            linger_timeout,
            dropped_channels: 0,
            auth_failures: 0,
            hellos: HelloCounts::default(),
            acceptor: Some(acceptor),
            waiters: Vec::new(),
            next_waiter: 0,
            zero_checks: 0,
            next_check: None,
            stopping: None,
            closing_chans: Vec::new(),
            stop_outcome: None,
            reopen: Vec::new(),
            plans: PlanState::default(),
        }
    }

    /// Whether new channels, connects, binds and accepts are refused: the stack has
    /// stopped or is stopping.
    pub(crate) fn refuses_new(&self) -> bool {
        self.stopped || self.stopping.is_some()
    }
}
