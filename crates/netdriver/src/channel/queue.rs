//! The state a channel shares between its application handle ([`Channel`]) and the
//! queue driver that runs its connection: two bounded lock-free chunk queues with byte
//! counters, wakers, status flags, the slot through which a consumer installs its
//! [`RxSink`], and a statistics snapshot. Nothing on the data path takes a lock.
//!
//! Orderings: flags that pair a "work is there" store on one side with a "someone waits"
//! load on the other (the Rx-queue-full handshake) use `SeqCst` on both sides, so at
//! least one side sees the other (Dekker); everything else is release/acquire or relaxed
//! counters.

use std::net::SocketAddrV4;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use bytes::Bytes;

use super::lazy_queue::LazyQueue;

use super::signal::QueueSignal;
use super::sink::RxSink;
use super::{ChannelError, ChannelState, ChannelStats, ChannelWire, Dequeued, EnqueueError};
use crate::rss::{ChannelSteering, PeerAlignment};
use crate::tcp::OptionChanges;
use crate::tcp::Traffic;
use crate::time::{Duration, Instant};

/// A connection's sequence numbers as the driver publishes them with its statistics.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WireSeq {
    pub(crate) rcv_nxt: u32,
    pub(crate) snd_nxt: u32,
}

/// Number of words in [`StatsCell`].
const STATS_WORDS: usize = 13;
const NO_SRTT: u64 = u64::MAX;

/// The TCP part of [`ChannelStats`], written by the queue driver and read by anyone: a
/// sequence lock over atomic words (one writer; readers retry while a write is under
/// way), so neither side takes a lock and no reader can see a torn snapshot.
#[derive(Debug, Default)]
struct StatsCell {
    seq: AtomicU64,
    words: [AtomicU64; STATS_WORDS],
}

impl StatsCell {
    fn write(&self, s: &Traffic, wire: WireSeq, now: Instant) {
        let srtt = s.srtt_us.map_or(NO_SRTT, |us| us.min(NO_SRTT - 1));
        let words = [
            s.send_queue as u64,
            s.recv_queue as u64,
            s.bytes_in_flight as u64,
            s.cwnd as u64,
            srtt,
            s.retransmitted_segments,
            s.rto_timeouts,
            s.bytes_sent,
            s.bytes_acked,
            s.bytes_received,
            now.total_micros(),
            u64::from(wire.rcv_nxt),
            u64::from(wire.snd_nxt),
        ];
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    fn read(&self) -> [u64; STATS_WORDS] {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let words = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return words;
            }
        }
    }
}

/// Why a channel ended, as stored in an atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Failure {
    Reset = 1,
    Refused = 2,
    TimedOut = 3,
    Closed = 4,
    ShutDown = 5,
    TooManyConnections = 6,
    NoFreePort = 7,
    QueueDied = 8,
}

impl Failure {
    fn from_u8(v: u8) -> Option<Failure> {
        Some(match v {
            1 => Failure::Reset,
            2 => Failure::Refused,
            3 => Failure::TimedOut,
            4 => Failure::Closed,
            5 => Failure::ShutDown,
            6 => Failure::TooManyConnections,
            7 => Failure::NoFreePort,
            8 => Failure::QueueDied,
            _ => return None,
        })
    }

    pub(crate) fn from_tcp(e: crate::tcp::TcpError) -> Failure {
        use crate::tcp::TcpError;
        match e {
            TcpError::Reset => Failure::Reset,
            TcpError::Refused => Failure::Refused,
            TcpError::TimedOut => Failure::TimedOut,
            TcpError::Closed | TcpError::WouldBlock => Failure::Closed,
        }
    }

    fn error(self) -> ChannelError {
        match self {
            Failure::Reset => ChannelError::Reset,
            Failure::Refused => ChannelError::Refused,
            Failure::TimedOut => ChannelError::TimedOut,
            Failure::Closed => ChannelError::Closed,
            Failure::ShutDown => ChannelError::ShutDown,
            Failure::TooManyConnections => ChannelError::TooManyConnections,
            Failure::NoFreePort => ChannelError::NoFreePort,
            Failure::QueueDied => ChannelError::QueueDied,
        }
    }
}

const STATE_CONNECTING: u8 = 0;
const STATE_OPEN: u8 = 1;
const STATE_CLOSED: u8 = 2;

/// What a [`Channel`] and its queue driver share.
pub(crate) struct ChannelShared {
    pub(crate) local: SocketAddrV4,
    pub(crate) peer: SocketAddrV4,
    pub(crate) queue: u32,
    /// How the channel's received frames reach `queue`, decided when it was opened or
    /// accepted.
    pub(crate) steering: ChannelSteering,
    /// For a channel this host opened, whether its port was chosen to land on given
    /// queues at the peer too; `None` for an accepted one (the peer chose the port).
    pub(crate) peer_alignment: Option<PeerAlignment>,
    tx: LazyQueue<Bytes>,
    /// Bytes enqueued and not yet taken by TCP (including the rest of a chunk that did not
    /// fit, which the driver keeps).
    tx_bytes: AtomicUsize,
    tx_limit: usize,
    rx: LazyQueue<Bytes>,
    rx_bytes: AtomicUsize,
    rx_limit: usize,
    rx_waker: AtomicWaker,
    tx_waker: AtomicWaker,
    state: AtomicU8,
    failure: AtomicU8,
    rx_finished: AtomicBool,
    /// Set by the driver when it stopped reading because the Rx queue was full.
    rx_blocked: AtomicBool,
    close_requested: AtomicBool,
    abort_requested: AtomicBool,
    /// Option changes the application asked for and the driver has not applied yet,
    /// merged into one value (bounded whatever the number of calls).
    options: Mutex<OptionChanges>,
    /// `options` holds changes: the driver looks without taking the lock otherwise.
    options_pending: AtomicBool,
    stats: StatsCell,
    /// A consumer's sink waiting for the driver to take it ([`Channel::set_sink`]).
    sink: Mutex<Option<Box<dyn RxSink>>>,
    /// `sink` holds one: the driver looks without taking the lock otherwise.
    sink_offered: AtomicBool,
    /// The sink paused the channel's reads and wants them resumed
    /// ([`Channel::resume_rx`]).
    resume: AtomicBool,
    /// The connection holds an ACK back for the reply to carry (set by the driver,
    /// `Connection::reply_ack_held`); a reader that finds the Rx queue empty takes it and
    /// asks for the ACK (`ack_wanted`).
    ack_held: AtomicBool,
    /// The reader waits for more while an ACK was held: the driver sends it
    /// (`Connection::reader_waiting`).
    ack_wanted: AtomicBool,
    pub(crate) signal: Arc<QueueSignal>,
}

impl std::fmt::Debug for ChannelShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelShared")
            .field("local", &self.local)
            .field("peer", &self.peer)
            .field("queue", &self.queue)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

/// Chunk and byte limits of one queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) chunks: usize,
    pub(crate) bytes: usize,
}

impl ChannelShared {
    pub(crate) fn new(
        local: SocketAddrV4,
        peer: SocketAddrV4,
        queue: u32,
        steering: ChannelSteering,
        tx: Limits,
        rx: Limits,
        signal: Arc<QueueSignal>,
    ) -> ChannelShared {
        ChannelShared {
            local,
            peer,
            queue,
            steering,
            peer_alignment: None,
            tx: LazyQueue::new(tx.chunks),
            tx_bytes: AtomicUsize::new(0),
            tx_limit: tx.bytes.max(1),
            rx: LazyQueue::new(rx.chunks),
            rx_bytes: AtomicUsize::new(0),
            rx_limit: rx.bytes.max(1),
            rx_waker: AtomicWaker::new(),
            tx_waker: AtomicWaker::new(),
            state: AtomicU8::new(STATE_CONNECTING),
            failure: AtomicU8::new(0),
            rx_finished: AtomicBool::new(false),
            rx_blocked: AtomicBool::new(false),
            close_requested: AtomicBool::new(false),
            abort_requested: AtomicBool::new(false),
            options: Mutex::new(OptionChanges::default()),
            options_pending: AtomicBool::new(false),
            stats: StatsCell::default(),
            sink: Mutex::new(None),
            sink_offered: AtomicBool::new(false),
            resume: AtomicBool::new(false),
            ack_held: AtomicBool::new(false),
            ack_wanted: AtomicBool::new(false),
            signal,
        }
    }

    /// The shared state of a channel this host opens, with where its port lands at the
    /// peer.
    pub(crate) fn opened_toward(mut self, peer: PeerAlignment) -> ChannelShared {
        self.peer_alignment = Some(peer);
        self
    }

    // ---- driver side ----

    /// The next chunk to hand to TCP.
    pub(crate) fn pop_tx(&self) -> Option<Bytes> {
        self.tx.pop()
    }

    /// Whether the thread has nothing to take from the application side: no chunk queued
    /// and no option change pending.
    pub(crate) fn tx_idle(&self) -> bool {
        self.tx.is_empty() && !self.options_pending.load(Ordering::Acquire)
    }

    /// `n` bytes were handed to TCP.
    pub(crate) fn tx_taken(&self, n: usize) {
        self.tx_bytes.fetch_sub(n, Ordering::AcqRel);
    }

    /// Bytes the Rx queue may take now (0 when at a limit).
    pub(crate) fn rx_room(&self) -> usize {
        if self.rx.is_full() {
            return 0;
        }
        self.rx_limit
            .saturating_sub(self.rx_bytes.load(Ordering::SeqCst))
    }

    /// The next chunk of the Rx queue (the driver hands what was queued before a sink
    /// came to the sink, in order).
    pub(crate) fn pop_rx_for_sink(&self) -> Option<Bytes> {
        let chunk = self.rx.pop()?;
        self.rx_bytes.fetch_sub(chunk.len(), Ordering::SeqCst);
        Some(chunk)
    }

    /// The sink a consumer installed, if one waits (taken once).
    pub(crate) fn take_sink(&self) -> Option<Box<dyn RxSink>> {
        if !self.sink_offered.load(Ordering::Acquire) {
            return None;
        }
        self.sink_offered.store(false, Ordering::Release);
        self.sink.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Whether the sink asked for its paused reads to resume (cleared).
    pub(crate) fn take_resume(&self) -> bool {
        self.resume.load(Ordering::Acquire) && self.resume.swap(false, Ordering::AcqRel)
    }

    /// Whether the sink asked for its paused reads to resume (not cleared).
    pub(crate) fn resume_requested(&self) -> bool {
        self.resume.load(Ordering::Acquire)
    }

    /// Whether a consumer offered a sink the driver has not taken yet.
    pub(crate) fn sink_offered(&self) -> bool {
        self.sink_offered.load(Ordering::Acquire)
    }

    /// Queues a received chunk; the caller checked [`rx_room`](Self::rx_room).
    pub(crate) fn push_rx(&self, chunk: Bytes) {
        let len = chunk.len();
        self.rx_bytes.fetch_add(len, Ordering::SeqCst);
        if self.rx.push(chunk).is_err() {
            // Only the driver pushes and it checked for room: unreachable in practice.
            self.rx_bytes.fetch_sub(len, Ordering::SeqCst);
            tracing::error!("channel rx queue overflow; chunk dropped");
        }
    }

    /// The driver stops reading for lack of room. Returns false when room appeared
    /// meanwhile (keep reading).
    pub(crate) fn block_rx(&self) -> bool {
        self.rx_blocked.store(true, Ordering::SeqCst);
        if self.rx_room() > 0 {
            self.rx_blocked.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    pub(crate) fn close_requested(&self) -> bool {
        self.close_requested.load(Ordering::Acquire)
    }

    pub(crate) fn abort_requested(&self) -> bool {
        self.abort_requested.load(Ordering::Acquire)
    }

    /// The option changes pending since the last call, if any (driver side).
    pub(crate) fn take_options(&self) -> Option<OptionChanges> {
        if !self.options_pending.swap(false, Ordering::AcqRel) {
            return None;
        }
        let mut pending = self.options.lock().unwrap_or_else(|e| e.into_inner());
        Some(std::mem::take(&mut *pending))
    }

    /// Queues option changes for the driver (application side).
    pub(crate) fn request_options(&self, changes: OptionChanges) {
        if changes.is_empty() {
            return;
        }
        self.options
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .merge(changes);
        // After the merge: the thread that sees the flag finds the changes.
        self.options_pending.store(true, Ordering::Release);
        self.signal.notify();
    }

    pub(crate) fn set_open(&self) {
        if self
            .state
            .compare_exchange(
                STATE_CONNECTING,
                STATE_OPEN,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            self.wake_all();
        }
    }

    /// End of stream: every byte before the peer's FIN is queued.
    pub(crate) fn finish_rx(&self) {
        if !self.rx_finished.swap(true, Ordering::AcqRel) {
            self.rx_waker.wake();
        }
    }

    /// Records why the channel failed (the first reason sticks).
    pub(crate) fn fail(&self, f: Failure) {
        let _ = self
            .failure
            .compare_exchange(0, f as u8, Ordering::AcqRel, Ordering::Acquire);
        self.wake_all();
    }

    /// The connection is gone.
    pub(crate) fn set_closed(&self) {
        self.state.store(STATE_CLOSED, Ordering::Release);
        self.wake_all();
    }

    pub(crate) fn wake_rx(&self) {
        self.rx_waker.wake();
    }

    /// Wakes the Tx side once the queue has drained to half its limits (chunks and
    /// bytes), not after every chunk taken: a writer blocked on a full queue then refills
    /// half of it per wake-up instead of one chunk, sparing a wake-up per chunk while TCP
    /// still has half the queue to send. An empty queue (what flush waits for) is always
    /// below the mark. Returns whether it was below.
    pub(crate) fn wake_tx_at_low_water(&self) -> bool {
        let chunks_low = self.tx.len() <= self.tx.capacity() / 2;
        let bytes_low = self.tx_bytes.load(Ordering::Acquire) <= self.tx_limit / 2;
        if chunks_low && bytes_low {
            self.tx_waker.wake();
            return true;
        }
        false
    }

    pub(crate) fn wake_all(&self) {
        self.rx_waker.wake();
        self.tx_waker.wake();
    }

    pub(crate) fn publish(&self, s: &Traffic, wire: WireSeq, now: Instant) {
        self.stats.write(s, wire, now);
    }

    pub(crate) fn failure(&self) -> Option<Failure> {
        Failure::from_u8(self.failure.load(Ordering::Acquire))
    }

    pub(crate) fn state(&self) -> ChannelState {
        match self.state.load(Ordering::Acquire) {
            STATE_CONNECTING => ChannelState::Connecting,
            STATE_OPEN => ChannelState::Open,
            _ => ChannelState::Closed,
        }
    }

    // ---- application side ----

    pub(crate) fn send_error(&self) -> Option<ChannelError> {
        if let Some(f) = self.failure() {
            return Some(f.error());
        }
        if self.close_requested.load(Ordering::Acquire)
            || self.state.load(Ordering::Acquire) == STATE_CLOSED
        {
            return Some(ChannelError::Closed);
        }
        None
    }

    pub(crate) fn tx_has_room(&self) -> bool {
        !self.tx.is_full() && self.tx_bytes.load(Ordering::Acquire) < self.tx_limit
    }

    /// Puts a chunk on the Tx queue and wakes the driver.
    pub(crate) fn enqueue(&self, chunk: Bytes) -> Result<(), EnqueueError> {
        if let Some(e) = self.send_error() {
            return Err(EnqueueError::Closed(e));
        }
        if chunk.is_empty() {
            return Ok(());
        }
        let len = chunk.len();
        // Taken while fewer bytes than the limit are queued: the last chunk may overshoot
        // it, so any chunk fits an empty queue, and "ready" means the same for every size.
        if !self.tx_has_room() {
            return Err(EnqueueError::Full(chunk));
        }
        self.tx_bytes.fetch_add(len, Ordering::AcqRel);
        if let Err(chunk) = self.tx.push(chunk) {
            self.tx_bytes.fetch_sub(len, Ordering::AcqRel);
            return Err(EnqueueError::Full(chunk));
        }
        self.signal.notify();
        Ok(())
    }

    /// Offers `sink` to the driver (see [`Channel::set_sink`]); the sink back when the
    /// channel is already closed or has one.
    pub(crate) fn offer_sink(&self, sink: Box<dyn RxSink>) -> Result<(), Box<dyn RxSink>> {
        if self.state() == ChannelState::Closed {
            return Err(sink);
        }
        let mut slot = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return Err(sink);
        }
        *slot = Some(sink);
        drop(slot);
        self.sink_offered.store(true, Ordering::Release);
        self.signal.notify();
        Ok(())
    }

    /// Ends the sending direction after the queued chunks (the driver queues the FIN).
    pub(crate) fn request_close(&self) {
        self.close_requested.store(true, Ordering::Release);
        self.signal.notify();
    }

    /// Destroys the connection at the driver's next round.
    pub(crate) fn request_abort(&self) {
        self.abort_requested.store(true, Ordering::Release);
        self.signal.notify();
    }

    /// The sink wants its paused reads resumed: tells the driver.
    pub(crate) fn request_resume(&self) {
        self.resume.store(true, Ordering::Release);
        self.signal.notify();
    }

    pub(crate) fn pop_rx(&self) -> Option<Bytes> {
        let chunk = self.rx.pop()?;
        self.rx_bytes.fetch_sub(chunk.len(), Ordering::SeqCst);
        if self.rx_blocked.load(Ordering::SeqCst) && self.rx_blocked.swap(false, Ordering::SeqCst) {
            self.signal.notify();
        }
        Some(chunk)
    }

    pub(crate) fn dequeue(&self) -> Result<Dequeued, ChannelError> {
        if let Some(c) = self.pop_rx() {
            return Ok(Dequeued::Chunk(c));
        }
        let finished = self.rx_finished.load(Ordering::Acquire);
        let failure = self.failure();
        if finished || failure.is_some() {
            // The driver queues every chunk before it sets either flag.
            if let Some(c) = self.pop_rx() {
                return Ok(Dequeued::Chunk(c));
            }
        }
        if finished {
            return Ok(Dequeued::Finished);
        }
        if let Some(f) = failure {
            return Err(f.error());
        }
        if self.state.load(Ordering::Acquire) == STATE_CLOSED {
            return Err(ChannelError::Closed);
        }
        self.reader_waits();
        Ok(Dequeued::Empty)
    }

    /// The reader found nothing to read: if the connection holds an ACK back for a reply,
    /// none is coming before more data, so the driver is asked to send it. Costs the
    /// reader one load when nothing is held.
    fn reader_waits(&self) {
        if self.ack_held.load(Ordering::Acquire) && self.ack_held.swap(false, Ordering::AcqRel) {
            self.ack_wanted.store(true, Ordering::Release);
            self.signal.notify();
        }
    }

    /// The driver: whether the connection now holds an ACK back (see `reader_waits`).
    pub(crate) fn set_ack_held(&self, held: bool) {
        self.ack_held.store(held, Ordering::Release);
    }

    /// The driver: takes the reader's request for a held ACK.
    pub(crate) fn take_ack_wanted(&self) -> bool {
        self.ack_wanted.load(Ordering::Acquire) && self.ack_wanted.swap(false, Ordering::AcqRel)
    }

    /// Whether the reader asked for a held ACK (not cleared).
    pub(crate) fn ack_wanted(&self) -> bool {
        self.ack_wanted.load(Ordering::Acquire)
    }

    pub(crate) fn poll_enqueue_ready(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ChannelError>> {
        for attempt in 0..2 {
            if let Some(e) = self.send_error() {
                return Poll::Ready(Err(e));
            }
            if self.tx_has_room() {
                return Poll::Ready(Ok(()));
            }
            if attempt == 0 {
                self.tx_waker.register(cx.waker());
            }
        }
        Poll::Pending
    }

    pub(crate) fn poll_dequeue(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, ChannelError>> {
        for attempt in 0..2 {
            match self.dequeue() {
                Ok(Dequeued::Chunk(c)) => return Poll::Ready(Ok(Some(c))),
                Ok(Dequeued::Finished) => return Poll::Ready(Ok(None)),
                Err(e) => return Poll::Ready(Err(e)),
                Ok(Dequeued::Empty) if attempt == 0 => self.rx_waker.register(cx.waker()),
                Ok(Dequeued::Empty) => {}
            }
        }
        Poll::Pending
    }

    /// Ready when the driver has handed every enqueued byte to TCP.
    pub(crate) fn poll_flushed(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        for attempt in 0..2 {
            if self.tx_bytes.load(Ordering::Acquire) == 0 {
                return Poll::Ready(Ok(()));
            }
            if let Some(f) = self.failure() {
                return Poll::Ready(Err(f.error()));
            }
            if attempt == 0 {
                self.tx_waker.register(cx.waker());
            }
        }
        Poll::Pending
    }

    /// Ready once the handshake is done or has failed.
    pub(crate) fn poll_established(&self, cx: &mut Context<'_>) -> Poll<Result<(), ChannelError>> {
        for attempt in 0..2 {
            if let Some(f) = self.failure() {
                return Poll::Ready(Err(f.error()));
            }
            match self.state() {
                ChannelState::Open => return Poll::Ready(Ok(())),
                ChannelState::Closed => return Poll::Ready(Err(ChannelError::Closed)),
                ChannelState::Connecting if attempt == 0 => self.tx_waker.register(cx.waker()),
                ChannelState::Connecting => {}
            }
        }
        Poll::Pending
    }

    pub(crate) fn stats(&self) -> ChannelStats {
        let w = self.stats.read();
        let us = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        // A closed channel's connection is gone, and its buffers with it: the driver
        // publishes no snapshot after removing it, so the last one may predate the final
        // acknowledgements.
        let closed = self.state() == ChannelState::Closed;
        let tcp = |v: u64| if closed { 0 } else { us(v) };
        ChannelStats {
            tx_queued: self.tx_bytes.load(Ordering::Relaxed),
            rx_queued: self.rx_bytes.load(Ordering::Relaxed),
            tx_tcp_queued: tcp(w[0]),
            rx_tcp_queued: tcp(w[1]),
            bytes_in_flight: tcp(w[2]),
            cwnd: us(w[3]),
            srtt: (w[4] != NO_SRTT).then(|| Duration::from_micros(w[4])),
            retransmitted_segments: w[5],
            rto_timeouts: w[6],
            bytes_sent: w[7],
            bytes_acked: w[8],
            bytes_received: w[9],
            updated_at: Instant::from_micros(w[10]),
        }
    }

    pub(crate) fn wire(&self) -> ChannelWire {
        let w = self.stats.read();
        ChannelWire {
            local: self.local,
            peer: self.peer,
            queue: self.queue,
            rcv_nxt: w[11] as u32,
            snd_nxt: w[12] as u32,
            updated_at: Instant::from_micros(w[10]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::handle::Channel;
    use std::task::{Wake, Waker};

    use super::*;
    use std::net::Ipv4Addr;

    fn shared(tx: Limits, rx: Limits) -> Arc<ChannelShared> {
        let a = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1);
        Arc::new(ChannelShared::new(
            a,
            a,
            0,
            ChannelSteering::Accepted,
            tx,
            rx,
            Arc::new(QueueSignal::new(super::super::clock::RuntimeClock::new())),
        ))
    }

    const L: Limits = Limits {
        chunks: 4,
        bytes: 10,
    };

    #[test]
    fn tx_limits_hand_chunks_back() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        // An oversized chunk enters an empty queue; then the queue is full.
        ch.enqueue(Bytes::from(vec![0; 20])).unwrap();
        match ch.enqueue(Bytes::from_static(b"x")) {
            Err(EnqueueError::Full(c)) => assert_eq!(&c[..], b"x"),
            other => panic!("{other:?}"),
        }
        assert_eq!(ch.stats().tx_queued, 20);
        let c = s.pop_tx().unwrap();
        s.tx_taken(c.len());
        for _ in 0..4 {
            ch.enqueue(Bytes::from_static(b"ab")).unwrap();
        }
        // Chunk limit.
        assert!(matches!(
            ch.enqueue(Bytes::from_static(b"a")),
            Err(EnqueueError::Full(_))
        ));
        ch.close();
        assert!(matches!(
            ch.enqueue(Bytes::from_static(b"a")),
            Err(EnqueueError::Closed(ChannelError::Closed))
        ));
    }

    /// A waker that counts its wake-ups.
    struct CountWaker(std::sync::atomic::AtomicUsize);

    impl Wake for CountWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_blocked_writer_is_woken_at_half_the_queue() {
        let s = shared(
            Limits {
                chunks: 8,
                bytes: 80,
            },
            L,
        );
        let ch = Channel::new(s.clone());
        for _ in 0..8 {
            ch.enqueue(Bytes::from(vec![0; 10])).unwrap();
        }
        let count = Arc::new(CountWaker(std::sync::atomic::AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(ch.poll_enqueue_ready(&mut cx).is_pending());
        let take = || {
            let c = s.pop_tx().unwrap();
            s.tx_taken(c.len());
            s.wake_tx_at_low_water();
            count.0.load(Ordering::SeqCst)
        };
        // Room for one chunk is not worth a wake-up yet; half the queue is.
        for _ in 0..3 {
            assert_eq!(take(), 0);
        }
        assert_eq!(take(), 1);
        assert!(ch.poll_enqueue_ready(&mut cx).is_ready());
    }

    /// Every enqueue tells the driver; a burst between two of its rounds wakes it once.
    #[test]
    fn enqueues_tell_the_driver_once_per_round() {
        let big = Limits {
            chunks: 16,
            bytes: 1 << 20,
        };
        let s = shared(big, big);
        let ch = Channel::new(s.clone());
        let count = Arc::new(CountWaker(std::sync::atomic::AtomicUsize::new(0)));
        s.signal.register(&Waker::from(count.clone()));
        for i in 0..5 {
            ch.enqueue(Bytes::from(vec![i; 100])).unwrap();
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(s.signal.take_pending());
        let sizes: Vec<usize> = std::iter::from_fn(|| s.pop_tx()).map(|c| c.len()).collect();
        assert_eq!(sizes, vec![100; 5]);
    }

    #[test]
    fn option_changes_merge_into_one_pending_value_and_wake_the_driver() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        assert_eq!(s.take_options(), None);
        // An empty batch is no work.
        ch.set_options(OptionChanges::new());
        assert!(!s.signal.take_pending());
        assert_eq!(s.take_options(), None);
        ch.set_options(
            OptionChanges::new()
                .send_buffer(1 << 20)
                .keepalive(Some(Duration::from_secs(5))),
        );
        assert!(s.signal.take_pending(), "the driver is told");
        ch.set_options(
            OptionChanges::new()
                .send_buffer(1 << 21)
                .mss_clamp(Some(1200)),
        );
        let want = OptionChanges::new()
            .send_buffer(1 << 21)
            .mss_clamp(Some(1200))
            .keepalive(Some(Duration::from_secs(5)));
        assert_eq!(s.take_options(), Some(want));
        assert_eq!(s.take_options(), None, "taken once");
    }

    #[test]
    fn dequeue_tells_empty_finished_and_failure_apart() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        assert_eq!(ch.dequeue().unwrap(), Dequeued::Empty);
        s.push_rx(Bytes::from_static(b"hi"));
        s.finish_rx();
        assert_eq!(
            ch.dequeue().unwrap(),
            Dequeued::Chunk(Bytes::from_static(b"hi"))
        );
        assert_eq!(ch.dequeue().unwrap(), Dequeued::Finished);
        assert_eq!(ch.dequeue().unwrap(), Dequeued::Finished);

        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        s.push_rx(Bytes::from_static(b"x"));
        s.fail(Failure::Reset);
        assert!(matches!(ch.dequeue(), Ok(Dequeued::Chunk(_))));
        assert!(matches!(ch.dequeue(), Err(ChannelError::Reset)));
        assert!(matches!(
            ch.enqueue(Bytes::from_static(b"a")),
            Err(EnqueueError::Closed(ChannelError::Reset))
        ));
    }

    #[test]
    fn a_full_rx_queue_blocks_until_dequeued() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        s.push_rx(Bytes::from(vec![1; 10]));
        assert_eq!(s.rx_room(), 0);
        assert!(s.block_rx());
        assert!(!s.signal.take_pending());
        assert!(matches!(ch.dequeue(), Ok(Dequeued::Chunk(_))));
        // The dequeue that made room told the driver.
        assert!(s.signal.take_pending());
        assert_eq!(s.rx_room(), 10);
        assert!(!s.block_rx());
    }

    #[test]
    fn blocking_dequeue_wakes_on_push_and_times_out() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        assert_eq!(
            ch.dequeue_blocking(Some(Duration::from_millis(5))).unwrap(),
            Dequeued::Empty
        );
        let pusher = {
            let s = s.clone();
            std::thread::spawn(move || {
                s.push_rx(Bytes::from_static(b"late"));
                s.wake_rx();
            })
        };
        let got = ch.dequeue_blocking(Some(Duration::from_secs(10))).unwrap();
        pusher.join().unwrap();
        assert_eq!(got, Dequeued::Chunk(Bytes::from_static(b"late")));
    }

    #[test]
    fn stats_snapshots_round_trip() {
        let s = shared(L, L);
        let ch = Channel::new(s.clone());
        let t = Traffic {
            cwnd: 14600,
            srtt_us: Some(250),
            retransmitted_segments: 3,
            bytes_in_flight: 2920,
            send_queue: 5000,
            recv_queue: 7,
            ..Traffic::default()
        };
        let seq = WireSeq {
            rcv_nxt: 0xfffe_0001,
            snd_nxt: 77,
        };
        s.publish(&t, seq, Instant::from_millis(9));
        let w = ch.wire();
        assert_eq!(
            (w.local, w.peer, w.queue, w.rcv_nxt, w.snd_nxt),
            (s.local, s.peer, s.queue, 0xfffe_0001, 77)
        );
        assert_eq!(w.updated_at, Instant::from_millis(9));
        let st = ch.stats();
        assert_eq!(st.cwnd, 14600);
        assert_eq!(st.srtt, Some(Duration::from_micros(250)));
        assert_eq!(st.retransmitted_segments, 3);
        assert_eq!(
            (st.bytes_in_flight, st.tx_tcp_queued, st.rx_tcp_queued),
            (2920, 5000, 7)
        );
        assert_eq!(st.updated_at, Instant::from_millis(9));
        // Once closed (the connection removed, no later snapshot), nothing is in TCP's
        // buffers any more; the counters stay.
        s.set_closed();
        let st = ch.stats();
        assert_eq!(
            (st.bytes_in_flight, st.tx_tcp_queued, st.rx_tcp_queued),
            (0, 0, 0)
        );
        assert_eq!(st.retransmitted_segments, 3);
    }
}
