//! The hello exchange (`docs/wire-format.md`, "Acceptor's hello"): before a stack opens
//! its channels to a peer, it asks the peer for its RSS on a hello channel of its own, so
//! that each channel's local port can be chosen to land on a queue of its class at both
//! ends. The acceptor answers with [`crate::hello`]'s description of its NIC's RSS and its
//! latency and throughput queues, then closes the channel; it joins no endpoint.
//!
//! A peer that does not know hello channels aborts them (their class byte is one it
//! refuses), and one without a reproducible RSS answers with an empty hello: either way
//! the opener opens its channels as it would without asking, aligned at its own end only.

use std::net::SocketAddrV4;
use std::time::Instant;

use bytes::Bytes;
use netdriver::channel::{Channel, ChannelError};
use netdriver::rss::RssState;
use netsched::ChannelClass;
use tracing::{debug, warn};

use super::super::core::Core;
use super::peers::dequeue_until;
use super::state::incoming::{Incoming, Kind};
use super::state::Control;
use crate::hello::{self, HelloError, RssDescription};

/// Why a hello was not had.
enum NoHello {
    /// What came was refused.
    Refused(HelloError),
    /// The channel failed or closed before a whole hello came.
    Unanswered(String),
}

impl Core {
    /// This stack's hello: its RSS when reproducible, with its latency queues (where it
    /// keeps the classes apart, [`Core::queue_class`]) and its throughput queues.
    pub(super) fn own_hello(&self) -> Vec<u8> {
        let description = match self.set.rss_state() {
            RssState::Predictable(rss) => {
                let (latency, throughput) = self
                    .set
                    .queues()
                    .into_iter()
                    .partition(|&q| self.queue_class(q) == Some(ChannelClass::Latency));
                Some(RssDescription {
                    rss: rss.clone(),
                    latency,
                    throughput,
                })
            }
            _ => None,
        };
        hello::encode(description.as_ref()).unwrap_or_else(|e| {
            warn!(error = %e, "this stack's RSS cannot be described to peers");
            hello::encode(None).unwrap_or_default()
        })
    }

    /// Answers an accepted hello channel whose handshake (`consumed` bytes) is done: sends
    /// the hello and closes the channel, which is watched until it is finished like a
    /// closed plain-TCP channel (reset if anything more arrives, or at the linger
    /// deadline).
    pub(super) fn answer_hello(&self, ctl: &mut Control, inc: Incoming, consumed: usize) {
        if inc.got.len() > consumed {
            debug!(peer = %inc.peer, "bytes after a hello request; aborting the channel");
            inc.t.abort();
            ctl.dropped_channels += 1;
            return;
        }
        if inc.t.enqueue(Bytes::from(self.own_hello())).is_err() {
            debug!(peer = %inc.peer, "hello channel failed before its answer");
            inc.t.abort();
            return;
        }
        debug!(peer = %inc.peer, "hello answered");
        inc.t.close();
        ctl.hellos.answered += 1;
        ctl.keep_closing_plain(inc.t);
    }

    /// Asks `remote`'s stack for its hello on a channel of its own (opener thread; blocks
    /// for the connection and at most the preamble timeout). `Ok(None)` when the peer has
    /// no RSS to describe or none was had (counted in [`Control::hellos`]); `Err` only
    /// when the channel could not be opened, as the opening's first channel would fail.
    pub(super) fn ask_hello(
        &self,
        remote: SocketAddrV4,
    ) -> Result<Option<RssDescription>, ChannelError> {
        let t = self.set.connect(remote)?;
        let got = self.read_hello(&t);
        match &got {
            Ok(_) => t.close(),
            Err(_) => t.abort(),
        }
        let mut ctl = self.ctl();
        match got {
            Ok(Some(d)) => {
                debug!(%remote, latency = ?d.latency, throughput = ?d.throughput, table = d.rss.indirection.len(), "peer's RSS described");
                ctl.hellos.described += 1;
                Ok(Some(d))
            }
            Ok(None) => {
                debug!(%remote, "the peer has no RSS to describe");
                ctl.hellos.undescribed += 1;
                Ok(None)
            }
            Err(NoHello::Refused(e)) => {
                static REFUSED: netdriver::log_limit::LogLimit =
                    netdriver::log_limit::LogLimit::new(5);
                if let Some(suppressed) = REFUSED.check() {
                    warn!(%remote, error = %e, suppressed, "peer's hello refused; its queues are not aimed at");
                }
                ctl.hellos.refused += 1;
                Ok(None)
            }
            Err(NoHello::Unanswered(why)) => {
                debug!(%remote, why = %why, "no hello from the peer; its queues are not aimed at");
                ctl.hellos.unanswered += 1;
                Ok(None)
            }
        }
    }

    /// Sends a hello channel's preamble (and authenticates it), then reads the hello.
    fn read_hello(&self, t: &Channel) -> Result<Option<RssDescription>, NoHello> {
        let mut got = self
            .send_preamble(t, Kind::Hello)
            .map_err(NoHello::Unanswered)?;
        let deadline = Instant::now() + self.config.preamble_timeout;
        loop {
            if let Some(len) = hello::frame_len(&got).map_err(NoHello::Refused)? {
                if got.len() >= len {
                    if got.len() > len {
                        // The acceptor closes the channel after its hello.
                        return Err(NoHello::Refused(HelloError::Length {
                            declared: len - hello::HEADER_LEN,
                            needed: got.len() - hello::HEADER_LEN,
                        }));
                    }
                    return hello::parse(&got).map_err(NoHello::Refused);
                }
            }
            match dequeue_until(t, deadline) {
                Ok(Some(b)) => got.extend_from_slice(&b),
                Ok(None) => {
                    return Err(NoHello::Unanswered(
                        "the peer closed the hello channel before a whole hello".into(),
                    ))
                }
                Err(why) => return Err(NoHello::Unanswered(why)),
            }
        }
    }
}
