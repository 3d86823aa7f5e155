//! Timers: retransmission (RFC 6298), the tail loss probe's PTO (RFC 8985 §7, see `tlp`),
//! RACK's reorder timer (RFC 8985 §6.3, see `recovery`),
//! SYN retries, persist (RFC 9293 §3.8.6.1), delayed
//! ACK (§3.8.6.3), keep-alive (§3.8.4), TIME-WAIT (§3.4.2) and the user timeout (§3.8.3).
//! Timers only set flags and state; the segments they call for come out of the next
//! `poll_transmit`.

use tracing::{debug, trace};

use super::{Connection, State};
use crate::tcp::error::TcpError;
use crate::time::Instant;

impl Connection {
    /// The earliest instant at which `handle_timeout` must be called, or `None` when no
    /// timer runs. Call `poll_transmit` until `None` first: some timers are armed there.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == State::Closed {
            return None;
        }
        // Asked for every connection several times a round: a plain fold over the
        // deadlines (an iterator chain over the array cost ~130 instructions a call).
        fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
            match (a, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, None) => x,
                (None, y) => y,
            }
        }
        let mut next = earlier(self.rtx_deadline, self.tlp_deadline);
        next = earlier(next, self.rack.deadline());
        next = earlier(next, self.delayed_ack_deadline);
        next = earlier(next, self.persist_deadline);
        next = earlier(next, self.keepalive_deadline);
        next = earlier(next, self.time_wait_deadline);
        if self.user_timeout_running() {
            next = earlier(next, Some(self.last_progress + self.config.user_timeout));
        }
        next
    }

    /// Processes every timer that has expired at `now`. Harmless to call early or often.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock(now);
        if self.state == State::Closed {
            return;
        }
        if let Some(deadline) = self.time_wait_deadline {
            if now >= deadline {
                debug!("tcp: TIME-WAIT expired, CLOSED");
                self.enter_closed();
                return;
            }
        }
        // §3.8.3 user timeout: outstanding sequence space without progress.
        if self.user_timeout_running() && now >= self.last_progress + self.config.user_timeout {
            let in_handshake = matches!(self.state, State::SynSent);
            self.fail(TcpError::TimedOut, !in_handshake);
            return;
        }
        // The PTO first: one clamped to the RTO's instant replaces the RTO (RFC 8985 §7.2).
        if let Some(deadline) = self.tlp_deadline {
            if now >= deadline {
                self.on_tlp_timeout(now);
            }
        }
        if let Some(deadline) = self.rack.deadline() {
            if now >= deadline {
                self.on_rack_timeout(now);
            }
        }
        if let Some(deadline) = self.rtx_deadline {
            if now >= deadline {
                self.on_retransmission_timeout(now);
                if self.state == State::Closed {
                    return;
                }
            }
        }
        if let Some(deadline) = self.delayed_ack_deadline {
            if now >= deadline {
                trace!("tcp: delayed ACK timer expired");
                self.delayed_ack_deadline = None;
                self.ack_now = true;
            }
        }
        if let Some(deadline) = self.persist_deadline {
            if now >= deadline {
                self.persist_deadline = None;
                let unanswered = self.probe_unanswered_since.is_some_and(|since| {
                    now.saturating_duration_since(since) >= self.config.user_timeout
                });
                if unanswered {
                    // Probes unanswered for the user timeout: the peer is gone. Answered
                    // probes never end the connection (RFC 1122 §4.2.2.17).
                    self.fail(TcpError::TimedOut, true);
                    return;
                }
                if self.zero_window_outlasted(now) {
                    return;
                }
                trace!(backoff = self.persist_backoff, "tcp: persist timer expired");
                self.persist_force = true;
            }
        }
        if let Some(deadline) = self.keepalive_deadline {
            if now >= deadline {
                self.on_keepalive_timeout(now);
            }
        }
    }

    /// [`Config::zero_window_limit`]: at a probe into a shut window, notes since when it
    /// has been shut, and fails the connection once that is longer than the limit.
    /// Returns whether it failed.
    fn zero_window_outlasted(&mut self, now: Instant) -> bool {
        let Some(limit) = self.config.zero_window_limit else {
            return false;
        };
        let since = *self.zero_window_since.get_or_insert(now);
        if now.saturating_duration_since(since) < limit {
            return false;
        }
        debug!(shut_for = ?now.saturating_duration_since(since), "tcp: the peer kept its window shut past the limit");
        self.counters.zero_window_timeouts += 1;
        self.fail(TcpError::TimedOut, true);
        true
    }

    /// Whether the §3.8.3 user timeout runs: sequence space is outstanding, and the peer
    /// has not answered our last probe into its closed window (§3.8.6.1: an answering
    /// receiver is never timed out; the next probe restarts the clock).
    fn user_timeout_running(&self) -> bool {
        self.snd_una != self.snd_max && !self.closed_window_answered
    }

    /// RFC 6298 §5.4-5.7: retransmit the earliest unacknowledged segment, back off the
    /// RTO and restart the timer. SYN and SYN-ACK give up after `syn_retries`.
    fn on_retransmission_timeout(&mut self, now: Instant) {
        if self.snd_una == self.snd_max {
            self.rtx_deadline = None;
            return;
        }
        // With data in flight the retransmissions are the zero-window probes.
        if self.snd_wnd == 0 && self.state.is_synchronized() && self.zero_window_outlasted(now) {
            return;
        }
        if matches!(self.state, State::SynSent | State::SynReceived) {
            if self.syn_retries_done >= self.config.syn_retries {
                let send_rst = self.state == State::SynReceived;
                self.fail(TcpError::TimedOut, send_rst);
                return;
            }
            self.syn_retries_done += 1;
        } else {
            let in_flight = self.bytes_in_flight();
            self.cc.on_retransmission_timeout(now, in_flight);
        }
        self.counters.rto_timeouts += 1;
        self.rtt.on_timeout_backoff();
        debug!(
            snd_una = self.snd_una.0,
            rto = ?self.rtt.rto(),
            backoffs = self.rtt.backoff_count(),
            "tcp: retransmission timeout"
        );
        // Go-back-N from SND.UNA. SACK information is dropped (RFC 6675 §5.1 allows the
        // receiver to renege), recovery ends, and the new "recover" point keeps duplicate
        // ACKs of the resent data from triggering fast retransmit (RFC 6582 §3.2 step 1).
        self.snd_nxt = self.snd_una;
        self.in_recovery = false;
        self.recovery_inflation = 0;
        self.dup_acks = 0;
        self.limited_sent = 0;
        self.fast_rtx_pending = false;
        self.sack_board.clear();
        self.recover = self.snd_max;
        self.high_rxt = self.snd_una;
        self.rtt_timed = None;
        self.probe_end = None;
        self.rto_probe = true;
        // The RTO takes over from any tail loss probe (RFC 8985 §7.3).
        self.tlp_deadline = None;
        self.tlp_pending = false;
        self.tlp_high = None;
        self.lost_below = None;
        self.rack.on_rto();
        // An RTO ends any chance to undo the fast recovery before it.
        self.undo = None;
        self.rtx_deadline = Some(now + self.rtt.rto());
    }

    /// Keep-alive: probe an idle connection every `keepalive_interval`, give up after
    /// `keepalive_probes` misses.
    fn on_keepalive_timeout(&mut self, now: Instant) {
        let Some(idle_time) = self.config.keepalive else {
            self.keepalive_deadline = None;
            return;
        };
        let idle = matches!(self.state, State::Established | State::CloseWait)
            && self.snd_una == self.snd_max;
        if !idle {
            // Outstanding data has its own timers (the user timeout); look again later.
            self.keepalive_deadline = Some(now + idle_time);
            return;
        }
        if self.keepalive_probes_out >= self.config.keepalive_probes.max(1) {
            self.fail(TcpError::TimedOut, true);
            return;
        }
        self.keepalive_probes_out += 1;
        self.keepalive_pending = true;
        self.keepalive_deadline = Some(now + self.config.keepalive_interval.unwrap_or(idle_time));
    }
}
