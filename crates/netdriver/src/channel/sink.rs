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
