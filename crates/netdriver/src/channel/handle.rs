//! [`Channel`]: the application's handle of one channel, the paper's create / destroy /
//! enqueue / dequeue over the state it shares with its queue driver.

use std::net::SocketAddrV4;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;

use super::block::block_on;
use super::queue::ChannelShared;
use super::sink::RxSink;
use super::{
    ChannelError, ChannelState, ChannelStats, ChannelTransport, ChannelWire, Dequeued, EnqueueError,
};
use crate::rss::{ChannelSteering, PeerAlignment};
use crate::tcp::OptionChanges;
use crate::time::Duration;

/// One channel: an in-crate TCP connection plus its Tx and Rx queues, driven by the queue
/// driver of [`queue`](Channel::queue). See the [module documentation](super).
///
/// Dropping a channel that was not [`close`](Channel::close)d aborts it (the peer gets a
/// reset); after `close`, dropping lets the queued data and the FIN go out, like closing a
/// socket after `shutdown(SHUT_WR)`.
#[derive(Debug)]
pub struct Channel {
    pub(crate) shared: Arc<ChannelShared>,
}

impl Channel {
    pub(crate) fn new(shared: Arc<ChannelShared>) -> Channel {
        Channel { shared }
    }

    /// Queues `chunk` for sending, without blocking. `Full` hands it back when the Tx
    /// queue is at its chunk or byte limit (a chunk is taken while fewer bytes than the
    /// limit are queued, so the last one may overshoot it); `Closed` after [`close`](Channel::close), or once the
    /// channel failed. Chunks may be enqueued while the handshake is under way.
    pub fn enqueue(&self, chunk: Bytes) -> Result<(), EnqueueError> {
        self.shared.enqueue(chunk)
    }

    /// Hands the channel's received bytes to `sink` from now on, in order, instead of
    /// queueing them for [`dequeue`](Self::dequeue): the queue driver calls the sink
    /// from its round (what the Rx queue holds first), so that a consumer such as the
    /// virtual sockets takes its bytes where they arrive, without another task's
    /// wake-up. The sink may pause the channel's reads (the bytes then stay in TCP's
    /// receive buffer, whose window closes) until [`resume_rx`](Self::resume_rx). The sink
    /// comes back when the channel is closed or already has one.
    pub fn set_sink(&self, sink: Box<dyn RxSink>) -> Result<(), Box<dyn RxSink>> {
        self.shared.offer_sink(sink)
    }

    /// Resumes reads its sink paused ([`RxFlow::Pause`](super::RxFlow::Pause)): the
    /// driver offers the sink what it keeps and reads on at its next round.
    pub fn resume_rx(&self) {
        self.shared.request_resume();
    }

    /// Takes the next received chunk without blocking: a chunk, `Empty` (nothing yet), or
    /// `Finished` (the peer closed and everything was dequeued). Chunks queued before a
    /// failure are still delivered; then the failure (`Reset`, `TimedOut`, ...) is
    /// returned.
    pub fn dequeue(&self) -> Result<Dequeued, ChannelError> {
        self.shared.dequeue()
    }

    /// Async readiness to enqueue: `Ready(Ok)` when there is room.
    pub fn poll_enqueue_ready(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        self.shared.poll_enqueue_ready(cx)
    }

    /// Async dequeue: `Ready(Ok(Some(chunk)))`, `Ready(Ok(None))` at the end of stream.
    pub fn poll_dequeue(&self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ChannelError>> {
        self.shared.poll_dequeue(cx)
    }

    /// Async flush: ready once every enqueued byte has been handed to TCP.
    pub fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        self.shared.poll_flushed(cx)
    }

    /// Enqueues `chunk`, waiting for room at most `timeout` (`None`: as long as it
    /// takes). `Full` hands the chunk back on timeout.
    pub fn enqueue_blocking(
        &self,
        chunk: Bytes,
        timeout: Option<Duration>,
    ) -> Result<(), EnqueueError> {
        let mut chunk = Some(chunk);
        let res = block_on(timeout, |cx| loop {
            let Some(c) = chunk.take() else {
                return Poll::Ready(Ok(()));
            };
            match self.shared.enqueue(c) {
                Err(EnqueueError::Full(c)) => {
                    chunk = Some(c);
                    match self.shared.poll_enqueue_ready(cx) {
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(EnqueueError::Closed(e))),
                        // Room appeared since the attempt: try again at once.
                        Poll::Ready(Ok(())) => continue,
                        Poll::Pending => return Poll::Pending,
                    }
                }
                other => return Poll::Ready(other),
            }
        });
        match res {
            Some(r) => r,
            None => Err(EnqueueError::Full(chunk.unwrap_or_default())),
        }
    }

    /// Dequeues, waiting at most `timeout` (`None`: as long as it takes) for a chunk or
    /// the end of stream; `Ok(Dequeued::Empty)` on timeout.
    pub fn dequeue_blocking(&self, timeout: Option<Duration>) -> Result<Dequeued, ChannelError> {
        match block_on(timeout, |cx| self.shared.poll_dequeue(cx)) {
            None => Ok(Dequeued::Empty),
            Some(Ok(Some(c))) => Ok(Dequeued::Chunk(c)),
            Some(Ok(None)) => Ok(Dequeued::Finished),
            Some(Err(e)) => Err(e),
        }
    }

    /// Waits until every enqueued byte has been handed to TCP (not acknowledged: see
    /// [`stats`](Channel::stats) for that), at most `timeout`.
    pub fn flush_blocking(&self, timeout: Option<Duration>) -> Result<(), ChannelError> {
        block_on(timeout, |cx| self.shared.poll_flushed(cx))
            .unwrap_or(Err(ChannelError::WouldBlockTimeout))
    }

    /// Ends the sending direction: a FIN follows every chunk already enqueued. Receiving
    /// goes on until the peer closes.
    pub fn close(&self) {
        self.shared.request_close();
        self.shared.signal.notify();
    }

    /// Destroys the channel now: queued data is dropped and the peer gets a reset.
    pub fn abort(&self) {
        self.shared.request_abort();
        self.shared.signal.notify();
    }

    /// Changes TCP options of the channel's connection after creation: buffer sizes,
    /// MSS clamp, user timeout, keep-alive (see [`OptionChanges`] and the
    /// [`Connection`](crate::tcp::Connection) setters it names for what each does). The
    /// queue driver applies them at its next round; changes requested before it
    /// does are merged, the later ones winning. Options of a connection that is gone are
    /// ignored.
    pub fn set_options(&self, changes: OptionChanges) {
        self.shared.request_options(changes);
    }

    /// Our address of the connection.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.shared.local
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddrV4 {
        self.shared.peer
    }

    /// The NIC queue (and so the queue driver) the channel lives on.
    pub fn queue(&self) -> u32 {
        self.shared.queue
    }

    /// How the channel's received frames reach its queue: accepted (owned by the queue
    /// its SYN arrived on), aligned (opened from a local port whose replies RSS delivers
    /// to its queue), steered by an ntuple rule, or forwarded from the queue they land on
    /// (see [`RssAlignment`](super::RssAlignment)).
    pub fn steering(&self) -> ChannelSteering {
        self.shared.steering
    }

    /// For a channel this host opened, whether its local port was chosen to land on given
    /// queues at the peer too ([`ChannelSet::connect_toward`](super::ChannelSet::connect_toward));
    /// `None` for an accepted channel.
    pub fn peer_alignment(&self) -> Option<PeerAlignment> {
        self.shared.peer_alignment
    }

    /// Where the channel is in its life.
    pub fn state(&self) -> ChannelState {
        self.shared.state()
    }

    /// Queue occupancy and the TCP connection's latest snapshot.
    pub fn stats(&self) -> ChannelStats {
        self.shared.stats()
    }

    /// The connection's 4-tuple, queue and sequence numbers as its driver last published
    /// them, for diagnostics and fault-injection tests (see [`ChannelWire`]).
    pub fn wire(&self) -> ChannelWire {
        self.shared.wire()
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        if !self.shared.close_requested() {
            self.abort();
        }
    }
}

impl ChannelTransport for Channel {
    fn enqueue(&self, chunk: Bytes) -> Result<(), EnqueueError> {
        Channel::enqueue(self, chunk)
    }
    fn set_options(&self, changes: OptionChanges) {
        Channel::set_options(self, changes)
    }
    fn dequeue(&self) -> Result<Dequeued, ChannelError> {
        Channel::dequeue(self)
    }
    fn poll_enqueue_ready(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        Channel::poll_enqueue_ready(self, cx)
    }
    fn poll_dequeue(&self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ChannelError>> {
        Channel::poll_dequeue(self, cx)
    }
    fn close(&self) {
        Channel::close(self)
    }
    fn abort(&self) {
        Channel::abort(self)
    }
    fn stats(&self) -> ChannelStats {
        Channel::stats(self)
    }
    fn wire(&self) -> Option<ChannelWire> {
        Some(Channel::wire(self))
    }
}
