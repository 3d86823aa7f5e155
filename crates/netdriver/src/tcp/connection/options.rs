//! Per-connection options changed after creation, the sans-IO counterpart
//! of `setsockopt` on an open socket: buffer sizes (`SO_SNDBUF`, `SO_RCVBUF`), an MSS
//! clamp (`TCP_MAXSEG`), the user timeout (`TCP_USER_TIMEOUT`, RFC 9293 §3.8.3) and
//! keep-alive (`SO_KEEPALIVE`, `TCP_KEEPIDLE`, `TCP_KEEPINTVL`, `TCP_KEEPCNT`; RFC 9293
//! §3.8.4, RFC 1122 §4.2.3.6). Each takes effect at once: the next `poll_timeout`,
//! `poll_transmit` and `send` see it. None reads a clock; those that move a timer take
//! `now`.

use tracing::debug;

use super::{window_scale_for, Connection, State, MIN_PEER_MSS};
use crate::time::{Duration, Instant};

/// How many per-segment send records (RTT send times, RACK) a send buffer of `tx_buffer`
/// bytes needs: a record per 256 bytes of buffer, plus slack. The stores degrade
/// gracefully when full (they merge records), so this is a memory bound, not a limit on
/// what may be sent.
pub(super) fn send_records_for(tx_buffer: usize) -> usize {
    tx_buffer / 512 * 2 + 64
}

/// A batch of option changes for [`Connection::apply_options`]: each `Some` field is set,
/// each `None` left alone. It lets a thread that does not own the connection (a channel's
/// application side) hand changes to the one that does as one bounded value: a later
/// batch [`merge`](Self::merge)d into a pending one overrides field by field, so any
/// number of calls costs one slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OptionChanges {
    /// [`Connection::set_send_buffer`].
    pub send_buffer: Option<usize>,
    /// [`Connection::set_recv_buffer`].
    pub recv_buffer: Option<usize>,
    /// [`Connection::set_mss_clamp`] (`Some(None)` removes the clamp).
    pub mss_clamp: Option<Option<u16>>,
    /// [`Connection::set_user_timeout`].
    pub user_timeout: Option<Duration>,
    /// [`Connection::set_keepalive`] (`Some(None)` turns keep-alive off).
    pub keepalive: Option<Option<Duration>>,
    /// [`Connection::set_keepalive_interval`].
    pub keepalive_interval: Option<Option<Duration>>,
    /// [`Connection::set_keepalive_probes`].
    pub keepalive_probes: Option<u32>,
    /// [`Connection::set_quickack`].
    pub quickack: Option<bool>,
}

impl OptionChanges {
    /// No change.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the send buffer size.
    pub fn send_buffer(mut self, size: usize) -> Self {
        self.send_buffer = Some(size);
        self
    }

    /// Sets the receive buffer size.
    pub fn recv_buffer(mut self, size: usize) -> Self {
        self.recv_buffer = Some(size);
        self
    }

    /// Sets (`Some`) or removes (`None`) the MSS clamp.
    pub fn mss_clamp(mut self, mss: Option<u16>) -> Self {
        self.mss_clamp = Some(mss);
        self
    }

    /// Sets the user timeout.
    pub fn user_timeout(mut self, timeout: Duration) -> Self {
        self.user_timeout = Some(timeout);
        self
    }

    /// Turns keep-alive on with this idle time, or off with `None`.
    pub fn keepalive(mut self, idle: Option<Duration>) -> Self {
        self.keepalive = Some(idle);
        self
    }

    /// Sets the keep-alive probe interval (`None`: the idle time).
    pub fn keepalive_interval(mut self, interval: Option<Duration>) -> Self {
        self.keepalive_interval = Some(interval);
        self
    }

    /// Sets the unanswered keep-alive probes that fail the connection.
    pub fn keepalive_probes(mut self, probes: u32) -> Self {
        self.keepalive_probes = Some(probes);
        self
    }

    /// Whether nothing is to change.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Turns quick-ACK mode on or off ([`Connection::set_quickack`]).
    pub fn quickack(mut self, on: bool) -> Self {
        self.quickack = Some(on);
        self
    }

    /// Folds `later` into `self`: the fields `later` sets override.
    pub fn merge(&mut self, later: OptionChanges) {
        fn take<T>(field: &mut Option<T>, later: Option<T>) {
            if later.is_some() {
                *field = later;
            }
        }
        take(&mut self.send_buffer, later.send_buffer);
        take(&mut self.recv_buffer, later.recv_buffer);
        take(&mut self.mss_clamp, later.mss_clamp);
        take(&mut self.user_timeout, later.user_timeout);
        take(&mut self.keepalive, later.keepalive);
        take(&mut self.keepalive_interval, later.keepalive_interval);
        take(&mut self.keepalive_probes, later.keepalive_probes);
        take(&mut self.quickack, later.quickack);
    }
}

impl Connection {
    /// Applies every change `changes` sets, as the individual setters would at `now`
    /// (interval and probe count before the idle time, so a keep-alive turned on with
    /// all three starts with its final settings).
    pub fn apply_options(&mut self, now: Instant, changes: &OptionChanges) {
        let now = self.clock(now);
        if let Some(size) = changes.send_buffer {
            self.set_send_buffer(size);
        }
        if let Some(size) = changes.recv_buffer {
            self.set_recv_buffer(size);
        }
        if let Some(mss) = changes.mss_clamp {
            self.set_mss_clamp(mss);
        }
        if let Some(timeout) = changes.user_timeout {
            self.set_user_timeout(timeout);
        }
        if let Some(interval) = changes.keepalive_interval {
            self.set_keepalive_interval(interval);
        }
        if let Some(probes) = changes.keepalive_probes {
            self.set_keepalive_probes(probes);
        }
        if let Some(idle) = changes.keepalive {
            self.set_keepalive(now, idle);
        }
        if let Some(on) = changes.quickack {
            self.set_quickack(on);
        }
    }

    /// Resizes the send buffer (`SO_SNDBUF`) and returns the size now in effect.
    ///
    /// Growing takes effect at once: `send` accepts more, and the per-segment records
    /// the sender keeps for RTT samples and RACK grow with it. Shrinking never discards
    /// queued data: the buffer shrinks to `size` or to the bytes queued now (sent and
    /// unacknowledged, or unsent), whichever is larger. The ring is reallocated only if
    /// it was allocated already; the queued bytes are copied once.
    ///
    /// The size is the application's from then on: send-buffer auto-tuning
    /// ([`Config::tx_buffer_max`](crate::tcp::Config::tx_buffer_max)) stops, as Linux's
    /// does once `SO_SNDBUF` is set.
    pub fn set_send_buffer(&mut self, size: usize) -> usize {
        self.snd_space.lock();
        let size = self.resize_send_buffer(size);
        self.config.tx_buffer = size;
        debug!(size, "tcp: send buffer resized");
        size
    }

    /// Resizes the send ring and the per-segment records that follow its size; returns
    /// the size in effect (never below the bytes queued).
    pub(super) fn resize_send_buffer(&mut self, size: usize) -> usize {
        let size = size.max(self.tx.len()).max(1);
        self.tx.resize(size);
        let records = send_records_for(size);
        self.send_times.set_max(records);
        self.rack.set_max_segs(records);
        size
    }

    /// Resizes the receive buffer (`SO_RCVBUF`) and returns the size now in effect.
    ///
    /// Growing takes effect at once: the window opens by the added room, and a window
    /// update goes out at the next `poll_transmit` if receiver SWS avoidance lets it
    /// (RFC 9293 §3.8.6.2.2). The window we can express is `65535 << shift`, the shift
    /// being fixed in our SYN from [`Config::rx_buffer`](crate::tcp::Config::rx_buffer)
    /// (RFC 7323 §2.2): before our SYN or SYN-ACK is first sent the offered shift is
    /// re-derived from the new size, afterwards a buffer beyond what the shift expresses
    /// holds data but advertises no more. Size the configuration for the largest buffer
    /// a connection may grow to.
    ///
    /// Shrinking never retracts what the peer was promised (RFC 9293 §3.8.6.2.1 says a
    /// receiver should not shrink the window) and never drops data: the buffer shrinks to
    /// `size` or to the unread bytes plus the window last advertised (and any
    /// out-of-order data held beyond it), whichever is larger. Call it again once the
    /// application has read to shrink further.
    pub fn set_recv_buffer(&mut self, size: usize) -> usize {
        let readable = self.rx.readable();
        let promised = super::seq_len(self.rcv_nxt, self.rcv_adv);
        let ooo_end = self
            .assembler
            .ranges()
            .last()
            .map_or(0, |(offset, len)| offset.saturating_add(len));
        let beyond = promised.max(ooo_end);
        let size = size.max(readable.saturating_add(beyond)).max(1);
        if size > self.rx.capacity() && self.state.is_synchronized() {
            // A buffer grown after the handshake is news the peer should have at once:
            // the window-update rule measures against it as if it had been offered.
            // (Not before: a SYN's window is unscaled whatever the buffer.)
            self.rcv_wnd_max = self.rcv_wnd_max.max(size);
        }
        self.rx.resize(size, beyond);
        self.config.rx_buffer = size;
        let syn_unsent = self.snd_max == self.iss;
        if syn_unsent && self.config.window_scaling {
            self.offered_wscale = window_scale_for(super::largest_rx_buffer(&self.config, size));
            if self.ws_enabled {
                self.rcv_wscale = self.offered_wscale;
            }
        }
        self.window_update_check = true;
        debug!(size, "tcp: receive buffer resized");
        size
    }

    /// Clamps the MSS (`TCP_MAXSEG`): later segments carry at most `mss` bytes of
    /// payload plus options' allowance as [`send_mss`](Self::send_mss) computes it; `None`
    /// removes the clamp. Values below 64 count as 64, as for a peer's MSS option.
    ///
    /// The clamp also lowers the MSS option of any SYN or SYN-ACK sent after it, as Linux
    /// applies `TCP_MAXSEG` set before `connect`. Once the handshake is done it only
    /// limits what we send: the peer was told our MSS already. Data already sent keeps its
    /// segmentation; retransmissions and new data use the new size (RFC 9293 §3.7.1 lets
    /// the sender segment as it likes within the MSS). The congestion controller is told
    /// the new MSS, so that its window keeps its meaning in bytes.
    pub fn set_mss_clamp(&mut self, mss: Option<u16>) {
        self.mss_clamp = mss.map(|m| m.max(MIN_PEER_MSS));
        let smss = self.send_mss();
        self.cc.set_mss(smss);
        debug!(?mss, send_mss = smss, "tcp: MSS clamp set");
    }

    /// The MSS clamp set by [`set_mss_clamp`](Self::set_mss_clamp), if any.
    pub fn mss_clamp(&self) -> Option<u16> {
        self.mss_clamp
    }

    /// Sets the user timeout (`TCP_USER_TIMEOUT`, RFC 9293 §3.8.3): the connection fails
    /// with `TimedOut` (and an RST) once unacknowledged data, SYN or FIN has made no
    /// progress for `timeout`. It applies at once to what is outstanding: the deadline
    /// is measured from the last progress, not from this call, so lowering it below the
    /// time already waited fails the connection at the next `handle_timeout`.
    pub fn set_user_timeout(&mut self, timeout: Duration) {
        self.config.user_timeout = timeout;
    }

    /// The user timeout in effect.
    pub fn user_timeout(&self) -> Duration {
        self.config.user_timeout
    }

    /// Turns keep-alive on with idle time `idle` (`SO_KEEPALIVE` + `TCP_KEEPIDLE`), or off
    /// with `None`. Like [`Config::keepalive`](crate::tcp::Config::keepalive), the idle
    /// time counts from the last segment received: on an open connection the first probe
    /// goes out `idle` after it (at once if that is past), which is Linux's rule for
    /// `TCP_KEEPIDLE` on an open socket. Turning it off stops the timer and forgets
    /// unanswered probes. Before the handshake completes the timer starts at
    /// establishment, as it does when configured.
    pub fn set_keepalive(&mut self, now: Instant, idle: Option<Duration>) {
        let now = self.clock(now);
        self.config.keepalive = idle;
        self.keepalive_probes_out = 0;
        self.keepalive_pending = false;
        let open = self.state.is_synchronized() && self.state != State::TimeWait;
        self.keepalive_deadline = match idle {
            Some(idle) if open => Some((self.last_rcv + idle).max(now)),
            _ => None,
        };
        debug!(?idle, deadline = ?self.keepalive_deadline, "tcp: keep-alive set");
    }

    /// Sets the time between unanswered keep-alive probes (`TCP_KEEPINTVL`); `None`: the
    /// idle time. A probe already out is followed by the next one at the new interval.
    pub fn set_keepalive_interval(&mut self, interval: Option<Duration>) {
        self.config.keepalive_interval = interval;
    }

    /// Sets how many unanswered keep-alive probes fail the connection (`TCP_KEEPCNT`); 0
    /// counts as 1. Lowering it below the probes already unanswered fails the connection
    /// at the next keep-alive deadline.
    pub fn set_keepalive_probes(&mut self, probes: u32) {
        self.config.keepalive_probes = probes;
    }

    /// Keep-alive as in effect: (idle time, interval, probes).
    pub fn keepalive(&self) -> (Option<Duration>, Option<Duration>, u32) {
        (
            self.config.keepalive,
            self.config.keepalive_interval,
            self.config.keepalive_probes,
        )
    }

    /// Receive buffer size in bytes.
    pub fn recv_capacity(&self) -> usize {
        self.rx.capacity()
    }
}
