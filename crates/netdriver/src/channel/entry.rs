//! A channel's driver-side state ([`Entry`]): what a queue's rounds keep per channel
//! beside its connection, and how they report the channel's end of stream and failure.

use std::sync::Arc;

use super::queue::{ChannelShared, Failure, WireSeq};
use super::sink::{RxFlow, RxSink};
use super::ChannelError;
use crate::tcp::TcpError;
use crate::time::Instant;

/// One channel's driver-side state.
pub(super) struct Entry {
    pub(super) shared: Arc<ChannelShared>,
    /// The consumer's sink, once it installed one ([`Channel::set_sink`](super::handle::Channel::set_sink)): received bytes
    /// go to it instead of the Rx queue.
    pub(super) sink: Option<Box<dyn RxSink>>,
    /// The sink paused the channel's reads; they resume when it asks.
    pub(super) sink_paused: bool,
    /// The sink was told the end of the stream (or the failure).
    pub(super) sink_ended: bool,
    /// The rest of a chunk that TCP's send buffer had no room for.
    pub(super) partial: Option<bytes::Bytes>,
    pub(super) fin_queued: bool,
    pub(super) aborted: bool,
    pub(super) eof: bool,
    /// The connection's statistics mark when they were last published (`publish` skips
    /// a connection whose mark has not moved).
    pub(super) published: Option<crate::tcp::connection::StatsMark>,
    /// What the reader was last told of a held ACK (`ChannelShared::set_ack_held`).
    pub(super) ack_held: bool,
}

impl Entry {
    pub(super) fn new(shared: Arc<ChannelShared>) -> Entry {
        Entry {
            shared,
            partial: None,
            fin_queued: false,
            aborted: false,
            eof: false,
            published: None,
            ack_held: false,
            sink: None,
            sink_paused: false,
            sink_ended: false,
        }
    }

    /// The peer's FIN was read: the channel's final figures are published, then its end
    /// of stream, once. Returns whether this was the first time.
    pub(super) fn reach_end(&mut self, conn: &crate::tcp::Connection, now: Instant) -> bool {
        if self.eof {
            return false;
        }
        self.eof = true;
        publish_entry(conn, self, now);
        self.shared.finish_rx();
        true
    }

    /// Reading the connection failed: the channel and its sink learn why.
    pub(super) fn read_failed(&mut self, err: TcpError) {
        self.shared.fail(Failure::from_tcp(err));
        self.end_sink(Err(ChannelError::from_tcp(err)));
    }

    /// Tells a reader of the Rx queue whether the connection holds an ACK back for the
    /// reply to carry, when that changed: a reader that then finds nothing to read asks
    /// for it (`Connection::reader_waiting`).
    pub(super) fn publish_ack_held(&mut self, conn: &crate::tcp::Connection) {
        let held = conn.reply_ack_held();
        if held != self.ack_held {
            self.ack_held = held;
            self.shared.set_ack_held(held);
        }
    }

    /// Tells the channel's sink (or one offered and not taken yet) that no more bytes
    /// come: `Ok` at the end of the stream, `Err` when the channel failed. Once.
    pub(super) fn end_sink(&mut self, end: Result<(), ChannelError>) {
        if self.sink_ended {
            return;
        }
        if self.sink.is_none() {
            self.sink = self.shared.take_sink();
            if let Some(sink) = self.sink.as_mut() {
                // What the sink was made with, then what the Rx queue held before the sink
                // came: still this channel's.
                let _ = sink.resume();
                while let Some(chunk) = self.shared.pop_rx_for_sink() {
                    if sink.on_bytes(chunk) == RxFlow::Pause {
                        break;
                    }
                }
            }
        }
        if let Some(sink) = self.sink.as_mut() {
            self.sink_ended = true;
            sink.on_end(end);
        }
    }
}

/// Publishes a channel's figures (`Channel::stats`), unless nothing changed since the last
/// time (most connections of a queue did nothing this round). Called at the end of every
/// round, and before a channel's end of stream is made visible: a consumer that sees the
/// end then also sees what the segment carrying the FIN acknowledged (a closed stream's
/// "nothing left to deliver" check reads these figures).
pub(super) fn publish_entry(conn: &crate::tcp::Connection, e: &mut Entry, now: Instant) {
    let mark = conn.stats_mark();
    if e.published == Some(mark) {
        return;
    }
    e.published = Some(mark);
    let wire = WireSeq {
        rcv_nxt: conn.rcv_nxt().0,
        snd_nxt: conn.snd_nxt().0,
    };
    e.shared.publish(&conn.traffic(), wire, now);
}
