//! The receive sink: what a channel's consumer does with the bytes its queue driver
//! receives, called from the driver's round.

use bytes::Bytes;

use super::ChannelError;

/// What a channel's consumer does with the bytes its queue driver receives
/// ([`Channel::set_sink`](super::Channel::set_sink)): called from the driver's round,
/// in order, on whichever thread drives the queue, so it must not block (it may take
/// locks that no holder keeps across a wait for this queue).
pub trait RxSink: Send {
    /// Received bytes of the channel, in order. [`RxFlow::Pause`] stops the channel's
    /// reads: the sink keeps what it did not take of `bytes`, the driver leaves the rest
    /// in TCP's receive buffer (whose advertised window then closes, the backpressure to
    /// the peer), and offers nothing more until the consumer asks with
    /// [`Channel::resume_rx`](super::Channel::resume_rx).
    fn on_bytes(&mut self, bytes: Bytes) -> RxFlow;

    /// Whether the sink takes received bytes in place, as slices of TCP's receive buffer
    /// ([`on_slice`](Self::on_slice)), instead of as `Bytes` the driver copies them into
    /// first. A sink that copies what it keeps anyway (a deframer cutting chunks out of
    /// the stream) saves a copy of every byte. Asked once, when the sink is installed.
    /// The default is `false`.
    fn reads_in_place(&self) -> bool {
        false
    }

    /// Received bytes of the channel, in order, lent from TCP's receive buffer (a sink
    /// that [`reads_in_place`](Self::reads_in_place)). Unlike [`on_bytes`](Self::on_bytes),
    /// the sink takes all of `bytes` whatever it returns: it keeps (copies) what it could
    /// not deliver, and may be handed one more slice of the same read after it paused
    /// (TCP's buffer is a ring: one read is at most two slices), which it keeps too.
    /// [`RxFlow::Pause`] then stops the reads as `on_bytes`' does. The default copies
    /// `bytes` and hands them to `on_bytes`.
    fn on_slice(&mut self, bytes: &[u8]) -> RxFlow {
        self.on_bytes(Bytes::copy_from_slice(bytes))
    }

    /// Go on with what the sink kept: called once when the driver installs the sink
    /// (before the bytes queued until then, so that bytes the sink was made with go
    /// first), and whenever the consumer asks to resume paused reads.
    /// [`RxFlow::Pause`] when it cannot (the driver waits for the consumer's next ask).
    fn resume(&mut self) -> RxFlow;

    /// No more bytes will come: `Ok` after the peer's FIN (every byte before it was
    /// delivered), `Err` when the channel failed, was aborted or its set stopped.
    /// Called once.
    fn on_end(&mut self, end: Result<(), ChannelError>);

    /// The channel's Tx queue drained to half its limits: a consumer that kept output a
    /// full queue refused may enqueue it now, from this round. The default does nothing.
    fn on_tx_room(&mut self) {}
}

/// Whether an [`RxSink`] takes more bytes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxFlow {
    /// Go on.
    Continue,
    /// Stop reading the channel until the consumer resumes it.
    Pause,
}
