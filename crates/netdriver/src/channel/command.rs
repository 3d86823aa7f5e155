//! Work for a queue's driver from the application side: open a connection, listen, stop
//! listening, fault injection.

use std::sync::Arc;

use super::accept_queue::ListenerShared;
use super::queue::ChannelShared;
use super::ChannelError;
use crate::rss::NtupleRule;
use crate::wire::EthernetAddress;

/// Work for a queue's driver from the application side.
#[derive(Debug)]
pub(crate) enum Command {
    /// Open the channel's connection (port and flow directory entry already claimed).
    Connect {
        shared: Arc<ChannelShared>,
        mac: EthernetAddress,
        /// The ntuple rule that steers its frames to this queue, if it has one: kept
        /// with the connection and removed with it.
        rule: Option<NtupleRule>,
    },
    /// Listen on `port`; the result goes to `done`.
    Listen {
        port: u16,
        backlog: usize,
        listener: Arc<ListenerShared>,
        done: tokio::sync::mpsc::UnboundedSender<Result<(), ChannelError>>,
    },
    /// Stop listening on `port` (connections not yet accepted are aborted).
    Unlisten { port: u16 },
    /// Fault injection: install (or remove) a rule dropping received data segments.
    DropReceived(Option<crate::netif::RxDrop>),
}
