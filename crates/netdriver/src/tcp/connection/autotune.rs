//! Buffer auto-tuning: the receive buffer
//! ([`Config::rx_buffer_max`](crate::tcp::Config::rx_buffer_max)), after Linux's dynamic
//! right-sizing (`tcp_rcv_space_adjust`, itself after Fisk and Feng, "Dynamic
//! right-sizing in TCP", 2001), and the send buffer
//! ([`Config::tx_buffer_max`](crate::tcp::Config::tx_buffer_max)), after Linux's
//! `tcp_sndbuf_expand`.
//!
//! # Receive buffer
//!
//! A fixed receive buffer caps a connection at one buffer per round trip whatever the
//! path: 256 KiB per 100 µs is 21 Gbit/s. A buffer sized for the largest path up front
//! costs that memory on every connection, fast or not. Instead, once per round trip the
//! bytes the application read in that round trip are measured; when the reader proves
//! faster than ever before, the buffer grows to twice that amount plus 16 segments, so
//! that the window advertised stays ahead of a sender in slow start (which doubles its
//! flight per round trip). A slow reader never grows it: what it measures is what the
//! application consumes, not what the peer sends.
//!
//! The round trip is our smoothed RTT. A pure receiver samples it only in the handshake
//! (ACKs carry no timed data); Linux measures the receiver's RTT from the timestamp echo
//! instead (`tcp_rcv_rtt_measure_ts`), which our millisecond TSval clock (RFC 7323 §5.4)
//! makes too coarse for µs-scale paths. The handshake's RTT is the path's unloaded RTT,
//! which errs towards measuring more often, i.e. growing sooner.
//!
//! # Send buffer
//!
//! A send buffer holds what is in flight and what waits to be sent, so a fixed one caps
//! the flight whatever the congestion window: 256 KiB per round trip. Growing it only
//! pays when both hold: the application keeps it full (a `send` took less than it was
//! given), and the congestion window has room the buffer does not fill (less than the
//! window is in flight). Then, at the next ACK that frees room, it grows to twice the
//! congestion window (the flight plus the next window), at least twice the initial
//! window, at most `tx_buffer_max`. An application that writes less than the buffer holds
//! never grows it, and neither does a path whose window the buffer already covers. It
//! never shrinks by itself; `set_send_buffer` fixes the size from then on, as Linux does
//! once `SO_SNDBUF` is set (`SOCK_SNDBUF_LOCK`).

use tracing::debug;

use super::{Connection, State};
use crate::time::Instant;

/// Segments of slack added to twice the measured rate (Linux's `16 * advmss`).
const SLACK_SEGMENTS: usize = 16;

/// Segments read per round trip a reader must beat before the first growth (Linux starts
/// `rcvq_space` at `TCP_INIT_CWND` segments).
const INITIAL_SPACE_SEGMENTS: usize = 10;

/// Auto-tuning's measurements.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RcvSpace {
    /// Bytes the application ever read.
    read: u64,
    /// Start of the current measurement: when, and `read` then.
    epoch: Option<(Instant, u64)>,
    /// The most bytes read in one round trip so far (0 until the first measurement).
    space: usize,
}

impl RcvSpace {
    /// The application read `n` bytes.
    pub(super) fn on_read(&mut self, n: usize) {
        self.read = self.read.saturating_add(n as u64);
    }
}

/// Segments of the initial window a grown send buffer holds at least twice over (Linux's
/// `2 * TCP_INIT_CWND`).
const INITIAL_WINDOW_SEGMENTS: usize = 10;

/// Send-buffer auto-tuning's state.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SndSpace {
    /// A `send` found the buffer full since the last ACK that freed room (Linux's
    /// `SOCK_NOSPACE`).
    limited: bool,
    /// The application set the size (`set_send_buffer`): no auto-tuning.
    locked: bool,
}

impl SndSpace {
    /// A `send` took `taken` of `offered` bytes.
    pub(super) fn on_send(&mut self, taken: usize, offered: usize) {
        if taken < offered {
            self.limited = true;
        }
    }

    /// The application set the size.
    pub(super) fn lock(&mut self) {
        self.locked = true;
    }
}

impl Connection {
    /// Grows the send buffer if the application is held back by it and the congestion
    /// window is not (see the module docs). Called when an ACK frees room.
    pub(super) fn autotune_tx(&mut self) {
        let limited = std::mem::take(&mut self.snd_space.limited);
        let Some(max) = self.config.tx_buffer_max else {
            return;
        };
        if !limited || self.snd_space.locked || self.tx.capacity() >= max {
            return;
        }
        let cwnd = self.cc.window();
        if self.bytes_in_flight() >= cwnd {
            // The window, not the buffer, holds the sender back.
            return;
        }
        let mss = self.send_mss().max(1);
        let target = cwnd
            .max(mss.saturating_mul(INITIAL_WINDOW_SEGMENTS))
            .saturating_mul(2)
            .min(max);
        if target > self.tx.capacity() {
            let size = self.resize_send_buffer(target);
            self.counters.tx_buffer_grown += 1;
            debug!(cwnd, size, "tcp: send buffer auto-tuned");
        }
    }

    /// Grows the receive buffer if the last round trip's reads call for it (see the
    /// module docs). Called at the start of every `poll_transmit`, so the larger window
    /// goes out (as a window update if nothing else is sent) in the same poll.
    pub(super) fn autotune_rx(&mut self, now: Instant) {
        let Some(max) = self.config.rx_buffer_max else {
            return;
        };
        let receiving = matches!(
            self.state,
            State::Established | State::FinWait1 | State::FinWait2
        ) && !self.fin_received;
        if !receiving || self.rx.capacity() >= max {
            return;
        }
        let Some(rtt) = self.rtt.srtt() else {
            return;
        };
        let mss = usize::from(self.config.mss.max(1));
        let (start, read_then) = match self.rcv_space.epoch {
            Some(epoch) => epoch,
            None => {
                self.rcv_space.epoch = Some((now, self.rcv_space.read));
                self.rcv_space.space = mss.saturating_mul(INITIAL_SPACE_SEGMENTS);
                return;
            }
        };
        if now.saturating_duration_since(start) < rtt {
            return;
        }
        let copied =
            usize::try_from(self.rcv_space.read.saturating_sub(read_then)).unwrap_or(usize::MAX);
        self.rcv_space.epoch = Some((now, self.rcv_space.read));
        if copied <= self.rcv_space.space {
            return;
        }
        self.rcv_space.space = copied;
        let target = copied
            .saturating_mul(2)
            .saturating_add(mss.saturating_mul(SLACK_SEGMENTS))
            .min(max);
        if target > self.rx.capacity() {
            let size = self.set_recv_buffer(target);
            self.counters.rx_buffer_grown += 1;
            debug!(copied, ?rtt, size, "tcp: receive buffer auto-tuned");
        }
    }
}
