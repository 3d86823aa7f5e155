//! Segment construction: what `poll_transmit` sends next, in priority order — a pending
//! RST, the SYN or SYN-ACK, retransmissions (fast retransmit, RFC 6675 NextSeg), new data
//! and FIN under the windows, Nagle and sender SWS rules, zero-window and keep-alive probes,
//! and finally pure ACKs (delayed-ACK expiry, window updates, challenge ACKs).

use tracing::trace;

use super::{seq_len, Connection, State, Transmit};
use crate::tcp::SeqNumber;
use crate::time::Instant;
use crate::wire::tcp::{SackBlock, TcpFlags, TcpOptions, TcpRepr};

/// Shared runs shorter than this are copied rather than gathered: a gathered run costs the
/// link an iovec and the kernel a separate copy call, more than copying a few hundred
/// bytes; runs of this size appear only at the ends of the application's buffers.
const GATHER_MIN_SPAN: usize = 2048;

/// Why a data segment is being sent, for accounting.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum SendKind {
    /// First transmission of new sequence space (advances SND.NXT).
    New,
    /// Resends sequence space already sent.
    Retransmit,
    /// A one-byte zero-window probe beyond the window (RFC 9293 §3.8.6.1); SND.NXT stays.
    Probe,
}

impl Connection {
    /// Whether a call to [`poll_transmit`](Self::poll_transmit) now might return a
    /// segment: a conservative test (it may say yes when the windows, Nagle or the SWS
    /// rules would hold the data back) that never says no while a segment is owed,
    /// timers apart (see [`poll_timeout`](Self::poll_timeout)). A driver that has just
    /// polled every connection dry uses it to skip a further round that would only find
    /// nothing to do.
    pub fn output_pending(&self) -> bool {
        if self.pending_rst.is_some() {
            return true;
        }
        if self.state == State::Closed {
            return false;
        }
        if self.second_ack.is_some()
            || self.ack_now
            || self.fast_rtx_pending
            || self.tlp_pending
            || self.keepalive_pending
            || self.persist_force
            || self.in_recovery
            || self.window_update_due()
        {
            return true;
        }
        match self.state {
            State::SynSent | State::SynReceived => self.snd_nxt == self.iss,
            State::Established
            | State::CloseWait
            | State::FinWait1
            | State::Closing
            | State::LastAck => {
                // Unsent bytes, or a queued FIN not yet sent (`transmit_data`'s cases).
                let send_end = self.send_end();
                self.snd_nxt.distance_from(send_end) < 0
                    || (self.fin_queued && self.snd_nxt == send_end)
            }
            _ => false,
        }
    }

    /// The next segment to send, or `None`. Payload bytes (if any) are copied from the send
    /// ring straight into `payload_buf[..payload_len]`; `payload_buf.len()` caps the
    /// payload, as does the peer's MSS less the options this segment carries. Call until
    /// `None`, then consult `poll_timeout`.
    pub fn poll_transmit(&mut self, now: Instant, payload_buf: &mut [u8]) -> Option<Transmit> {
        let now = self.clock(now);
        if let Some(rst) = self.pending_rst.take() {
            trace!(seq = rst.seq.0, "tcp: sending RST");
            self.counters.segments_sent += 1;
            return Some(Transmit {
                repr: rst,
                payload_len: 0,
                payload_sum: 0,
                segment_size: 0,
                payload_gathered: false,
            });
        }
        // Before any segment: a grown receive buffer goes out in this poll's window.
        self.autotune_rx(now);
        // The common case of a driver that polls every connection each round: nothing is
        // owed. Said without building options (timestamps, SACK blocks) for each
        // connection; `arm_persist` would only disarm, since no data waits.
        if !self.output_pending() {
            self.persist_deadline = None;
            return None;
        }
        let transmit = match self.state {
            State::Closed => None,
            State::SynSent | State::SynReceived if self.snd_nxt == self.iss => {
                Some(self.transmit_syn(now))
            }
            State::SynSent => None,
            _ => self
                .transmit_data(now, payload_buf)
                .or_else(|| self.transmit_keepalive(now))
                .or_else(|| self.transmit_ack(now)),
        };
        if transmit.is_none() {
            self.arm_persist(now);
        } else {
            self.counters.segments_sent += 1;
        }
        transmit
    }

    /// [`poll_transmit`](Self::poll_transmit) for a link that gathers
    /// ([`Link::tx_batch_gather`](crate::link::Link::tx_batch_gather)): the parts of a
    /// payload that lie in buffers the application handed over to share
    /// ([`send_bytes`](Self::send_bytes)) are not copied into `payload_buf` but pushed onto
    /// `spans` as slices of those buffers, each with its offset in `payload_buf`, where
    /// they leave a hole ([`Transmit::payload_gathered`]); the other bytes are copied as
    /// by `poll_transmit`. Only with [`Config::checksum_offload`](crate::tcp::Config)
    /// (without it, payloads are summed in the pass that copies them, and nothing is
    /// gathered).
    pub fn poll_transmit_gather(
        &mut self,
        now: Instant,
        payload_buf: &mut [u8],
        spans: &mut Vec<(usize, bytes::Bytes)>,
    ) -> Option<Transmit> {
        self.gather = true;
        self.gathered.clear();
        let t = self.poll_transmit(now, payload_buf);
        self.gather = false;
        if t.is_some_and(|t| t.payload_gathered) {
            spans.append(&mut self.gathered);
        }
        self.gathered.clear();
        t
    }

    /// SYN (SYN-SENT) or SYN-ACK (SYN-RECEIVED), sent or resent at ISS.
    fn transmit_syn(&mut self, now: Instant) -> Transmit {
        let retransmission = self.snd_max != self.iss;
        let mut flags = TcpFlags::SYN;
        let ack = if self.state == State::SynReceived {
            flags = flags | TcpFlags::ACK;
            Some(self.rcv_nxt)
        } else {
            None
        };
        let mut options = TcpOptions {
            mss: Some(self.advertised_mss()),
            ..TcpOptions::default()
        };
        // In a SYN-ACK only what the peer offered is echoed (RFC 7323 §1.3, RFC 2018 §2).
        let answering = self.state == State::SynReceived;
        if self.config.window_scaling && (!answering || self.ws_enabled) {
            options.window_scale = Some(self.offered_wscale);
        }
        options.sack_permitted = self.config.sack && (!answering || self.sack_enabled);
        if self.config.timestamps && (!answering || self.ts_enabled) {
            let echo = if answering { self.ts_recent } else { 0 };
            options.timestamp = Some((self.tsval(now), echo));
        }
        // RFC 7323 §2.2: the window in a SYN is never scaled.
        let window = self.rx.free().min(usize::from(u16::MAX));
        if ack.is_some() {
            self.rcv_adv = self.rcv_nxt + window;
            self.rcv_wnd_max = self.rcv_wnd_max.max(window);
            self.note_ack_sent();
        }
        self.snd_nxt = self.iss + 1;
        if options.timestamp.is_some() {
            self.send_times.on_send(self.iss, self.iss + 1, now);
        }
        if retransmission {
            self.counters.retransmitted_segments += 1;
            self.rtt_timed = None;
        } else {
            self.snd_max = self.iss + 1;
            self.rtt_timed = Some((self.iss + 1, now));
            self.last_progress = now;
        }
        if self.rtx_deadline.is_none() {
            self.rtx_deadline = Some(now + self.rtt.rto());
        }
        trace!(?flags, seq = self.iss.0, retransmission, "tcp: sending SYN");
        Transmit {
            repr: TcpRepr {
                src_port: self.local.port(),
                dst_port: self.remote.port(),
                seq: self.iss,
                ack,
                flags,
                window: window as u16,
                urgent: 0,
                options,
            },
            payload_len: 0,
            payload_sum: 0,
            segment_size: 0,
            payload_gathered: false,
        }
    }

    /// Data and FIN: retransmissions first, then new data.
    fn transmit_data(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if !matches!(
            self.state,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::Closing
                | State::LastAck
        ) {
            return None;
        }
        let options = self.data_options(now);
        let max_seg = self.max_payload(&options).min(buf.len());
        let burst = self.burst_limit(max_seg, buf.len());

        if self.fast_rtx_pending {
            self.fast_rtx_pending = false;
            if self.rack_active() {
                // The lowest segment RACK deems lost (not necessarily at SND.UNA).
                if let Some((start, end)) = self.rack.next_lost() {
                    let len = seq_len(start, end).min(max_seg);
                    return Some(self.emit_data(
                        now,
                        start,
                        len,
                        buf,
                        options,
                        SendKind::Retransmit,
                    ));
                }
            } else if self.snd_una != self.snd_max {
                let seq = self.snd_una;
                return Some(self.emit_data(now, seq, max_seg, buf, options, SendKind::Retransmit));
            }
        }

        if self.tlp_pending {
            if let Some(probe) = self.transmit_tlp(now, buf, options, max_seg) {
                return Some(probe);
            }
        }

        if self.in_recovery && self.sack_enabled {
            return self.transmit_sack_recovery(now, buf, options, max_seg, burst);
        }

        let send_end = self.send_end();
        let in_flight = seq_len(self.snd_una, self.snd_nxt);
        let room_wnd = self.snd_wnd.saturating_sub(in_flight);
        let room_cwnd = self.congestion_window().saturating_sub(in_flight);
        // RFC 3042 limited transmit: the first and second duplicate ACKs each let one new
        // segment out beyond cwnd (FlightSize <= cwnd + 2·SMSS), cwnd itself unchanged.
        let limited_allowance = self.limited_transmit_allowance();
        let room_limited = self
            .congestion_window()
            .saturating_add(limited_allowance)
            .saturating_sub(in_flight);
        let nothing_outstanding = self.snd_una == self.snd_max;

        if self.snd_nxt.distance_from(send_end) < 0 {
            let avail = seq_len(self.snd_nxt, send_end);
            let retransmission = self.snd_nxt.distance_from(self.snd_max) < 0;
            if self.persist_force && nothing_outstanding {
                self.persist_force = false;
                if room_wnd == 0 {
                    // Zero-window probe: one real byte (a zero-length probe is ignored by
                    // some peers, gVisor #10243). Each probe doubles the next interval.
                    self.persist_backoff = self.persist_backoff.saturating_add(1);
                    let seq = self.snd_nxt;
                    return Some(self.emit_data(
                        now,
                        seq,
                        max_seg.min(1),
                        buf,
                        options,
                        SendKind::Probe,
                    ));
                }
                // Sender SWS override timeout (RFC 9293 §3.8.6.2.1): send what fits.
                let len = avail.min(max_seg).min(room_wnd);
                let seq = self.snd_nxt;
                return Some(self.emit_data(now, seq, len, buf, options, SendKind::New));
            }
            if self.rto_probe && retransmission && room_wnd == 0 {
                // RFC 9293 §3.8.6.1, RFC 1122 §4.2.2.17: the sender must keep
                // retransmitting into a zero window. Data is outstanding, so the persist
                // timer is not armed; if the RTO only rewound SND.NXT and then obeyed the
                // window, a lost window update would leave both ends waiting for ever.
                self.rto_probe = false;
                if std::mem::take(&mut self.closed_window_answered) {
                    // The last probe was answered: the user timeout restarts here.
                    self.last_progress = now;
                }
                let seq = self.snd_nxt;
                return Some(self.emit_data(
                    now,
                    seq,
                    max_seg.min(1),
                    buf,
                    options,
                    SendKind::Retransmit,
                ));
            }
            let room = if retransmission {
                room_cwnd
            } else {
                room_limited
            };
            let mut len = avail.min(burst).min(room_wnd).min(room);
            if len > max_seg {
                len = self.super_segment_len(len, max_seg, avail, room_cwnd, retransmission);
            }
            if len > 0 {
                self.rto_probe = false;
                let kind = if retransmission {
                    SendKind::Retransmit
                } else {
                    SendKind::New
                };
                let full = len >= max_seg;
                let all_queued = len == avail;
                // Nagle (RFC 9293 §3.7.4): a small segment waits while data is
                // unacknowledged, unless disabled or the FIN follows.
                let nagle_ok = self.nodelay || nothing_outstanding || self.fin_queued;
                // Sender SWS avoidance (§3.8.6.2.1): at least half the peer's largest
                // window is worth sending.
                let big_enough = len >= (self.max_snd_wnd / 2).max(1);
                if retransmission || full || (nagle_ok && (all_queued || big_enough)) {
                    if len > room_cwnd {
                        self.limited_sent += 1;
                        self.counters.limited_transmits += 1;
                    }
                    let seq = self.snd_nxt;
                    return Some(self.emit_data(now, seq, len, buf, options, kind));
                }
            }
        } else if self.fin_queued && self.snd_nxt == send_end {
            // A bare FIN (first time, or resent after an RTO rewound SND.NXT). It takes no
            // buffer space at the receiver, so it is sent whatever the window.
            let seq = self.snd_nxt;
            return Some(self.emit_data(now, seq, 0, buf, options, SendKind::New));
        }
        None
    }

    /// The most payload one segment may carry now: one wire segment (`max_seg`), or, with
    /// super-segments on ([`Config::max_super_segment`]), as many whole wire segments as
    /// the configured maximum and the caller's buffer hold.
    ///
    /// [`Config::max_super_segment`]: crate::tcp::Config::max_super_segment
    fn burst_limit(&self, max_seg: usize, buf_len: usize) -> usize {
        let cap = self.config.max_super_segment.min(buf_len);
        if max_seg == 0 || cap <= max_seg {
            return max_seg;
        }
        cap / max_seg * max_seg
    }

    /// The length of a super-segment of at most `len` (more than one wire segment) bytes:
    /// what the same calls without super-segments would have sent back to back now.
    /// Whole wire segments; a shorter tail only when it would have gone out alone right
    /// after them (a retransmission, or Nagle off or the FIN next, and the tail either
    /// ends the queue or is worth sending under sender SWS avoidance); limited transmit's
    /// allowance beyond cwnd, and new data beyond SND.MAX in a retransmission, are left to
    /// the next call (single segments, as before).
    fn super_segment_len(
        &self,
        len: usize,
        max_seg: usize,
        avail: usize,
        room_cwnd: usize,
        retransmission: bool,
    ) -> usize {
        let mut len = len;
        if retransmission {
            len = len.min(seq_len(self.snd_nxt, self.snd_max).max(max_seg));
        } else if len > room_cwnd {
            len = room_cwnd.max(max_seg);
        }
        let whole = len / max_seg * max_seg;
        let tail = len - whole;
        let tail_goes = tail > 0
            && (retransmission
                || ((self.nodelay || self.fin_queued)
                    && (len == avail || tail >= (self.max_snd_wnd / 2).max(1))));
        if tail_goes {
            len
        } else {
            whole
        }
    }

    /// Bytes limited transmit adds to cwnd now (RFC 3042 §2): one SMSS per duplicate ACK
    /// received, at most two, less what it already let out; only outside recovery, for
    /// new data, when enabled.
    fn limited_transmit_allowance(&self) -> usize {
        if !self.config.limited_transmit
            || self.in_recovery
            || self.dup_acks == 0
            || self.snd_nxt != self.snd_max
        {
            return 0;
        }
        let granted = self.dup_acks.min(2);
        if self.limited_sent >= granted {
            return 0;
        }
        // The segments already sent by it are in the flight: the allowance covers them and
        // one more.
        (self.limited_sent + 1).saturating_mul(self.send_mss())
    }

    /// RFC 6675 §5 step (C): while `cwnd - pipe >= SMSS`, send NextSeg (§4 rules 1-3).
    fn transmit_sack_recovery(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        options: TcpOptions,
        max_seg: usize,
        burst: usize,
    ) -> Option<Transmit> {
        let smss = self.send_mss();
        let pipe = self.sack_pipe();
        if self.congestion_window() < pipe.saturating_add(smss) {
            return None;
        }
        // New data may go as a super-segment of the whole segments cwnd leaves room for
        // (what repeated calls would send: each needs `cwnd - pipe >= SMSS`).
        let room = self.congestion_window() - pipe;
        let new_data_max = if burst > max_seg && max_seg > 0 {
            (room.min(burst) / max_seg * max_seg).max(max_seg)
        } else {
            max_seg
        };
        if self.rack_active() {
            // Rule 1 with RACK's marks (RFC 8985 §6.2), then rule 2; no rule 3.
            if let Some((start, end)) = self.rack.next_lost() {
                let len = seq_len(start, end).min(max_seg);
                return Some(self.emit_data(now, start, len, buf, options, SendKind::Retransmit));
            }
            return self.transmit_new_in_recovery(now, buf, options, new_data_max);
        }
        let from = self.high_rxt.max(self.snd_una);
        let hole = self.sack_board.next_hole(from);
        // Rule 1: the first un-SACKed, lost sequence number above HighRxt.
        if let Some((start, end)) = hole {
            if self.deemed_lost(start) {
                let len = seq_len(start, end).min(max_seg);
                return Some(self.emit_data(now, start, len, buf, options, SendKind::Retransmit));
            }
        }
        // Rule 2: new data, if the receiver's window allows.
        if let Some(t) = self.transmit_new_in_recovery(now, buf, options, new_data_max) {
            return Some(t);
        }
        // Rule 3: an un-SACKed hole above HighRxt even if not yet deemed lost.
        if let Some((start, end)) = hole {
            let len = seq_len(start, end).min(max_seg);
            return Some(self.emit_data(now, start, len, buf, options, SendKind::Retransmit));
        }
        None
    }

    /// RFC 6675 §4 NextSeg rule 2: new data (or the FIN), if the receiver's window allows.
    fn transmit_new_in_recovery(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        options: TcpOptions,
        max_seg: usize,
    ) -> Option<Transmit> {
        let send_end = self.send_end();
        let in_flight = seq_len(self.snd_una, self.snd_nxt);
        let room_wnd = self.snd_wnd.saturating_sub(in_flight);
        if self.snd_nxt.distance_from(send_end) < 0 {
            let len = seq_len(self.snd_nxt, send_end).min(max_seg).min(room_wnd);
            if len > 0 {
                let seq = self.snd_nxt;
                return Some(self.emit_data(now, seq, len, buf, options, SendKind::New));
            }
        } else if self.fin_queued && self.snd_nxt == send_end {
            let seq = self.snd_nxt;
            return Some(self.emit_data(now, seq, 0, buf, options, SendKind::New));
        }
        None
    }

    /// RFC 6675 §4 SetPipe: un-SACKed bytes not deemed lost, plus retransmitted ones
    /// (with RACK's loss marks when RACK is active).
    pub(super) fn sack_pipe(&self) -> usize {
        if self.rack_active() {
            return self.rack.pipe(self.snd_max);
        }
        let mut pipe = 0usize;
        let mut cursor = self.snd_una;
        // Holes lie below the highest SACKed byte; the scoreboard holds a bounded number.
        for _ in 0..=self.config.max_sack_ranges {
            let Some((start, end)) = self.sack_board.next_hole(cursor) else {
                break;
            };
            // IsLost is monotone: true for every byte below some boundary in the hole.
            // So is the TLP rule (everything below a point), and so their disjunction.
            let boundary = if self.deemed_lost(start) {
                let (mut lost, mut kept) = (start, end);
                while seq_len(lost, kept) > 1 {
                    let mid = lost + seq_len(lost, kept) / 2;
                    if self.deemed_lost(mid) {
                        lost = mid;
                    } else {
                        kept = mid;
                    }
                }
                kept
            } else {
                start
            };
            pipe += seq_len(boundary, end);
            pipe += seq_len(start, self.high_rxt.min(end));
            cursor = end;
        }
        let top = match self.sack_board.highest_sacked() {
            Some(h) if h.distance_from(self.snd_una) > 0 => h,
            _ => self.snd_una,
        };
        pipe + seq_len(top, self.snd_max)
    }

    /// Builds and accounts one data/FIN segment of up to `max_len` payload bytes at `seq`.
    pub(super) fn emit_data(
        &mut self,
        now: Instant,
        seq: SeqNumber,
        max_len: usize,
        buf: &mut [u8],
        options: TcpOptions,
        kind: SendKind,
    ) -> Transmit {
        let send_end = self.send_end();
        let offset = seq_len(self.tx_base, seq);
        let len = max_len.min(seq_len(seq, send_end)).min(buf.len());
        // Shared bytes go as they lie when the caller gathers and the link completes the
        // checksum (else they are summed as they are copied, in one pass).
        let (len, payload_sum) = if self.gather && self.config.checksum_offload {
            let n =
                self.tx
                    .read_gather(offset, &mut buf[..len], GATHER_MIN_SPAN, &mut self.gathered);
            (n, 0)
        } else if self.config.checksum_offload {
            (self.tx.read_at(offset, &mut buf[..len]), 0)
        } else {
            self.tx.read_at_sum(offset, &mut buf[..len])
        };
        // One wire segment's payload: the pieces a super-segment is cut into.
        let segment_size = self.max_payload(&options).min(buf.len()).max(1);
        let end = seq + len;
        // The FIN rides on the segment that reaches the end of the queued data.
        let fin = self.fin_queued && end == send_end && kind != SendKind::Probe;
        let mut flags = TcpFlags::ACK;
        if len > 0 && end == send_end {
            flags = flags | TcpFlags::PSH;
        }
        if fin {
            flags = flags | TcpFlags::FIN;
        }
        let seq_end = end + usize::from(fin);
        let resent = seq_end.distance_from(self.snd_max) <= 0 && kind != SendKind::Probe;
        match kind {
            SendKind::Probe => {
                trace!(seq = seq.0, "tcp: zero-window probe");
                self.probe_end = Some(seq_end);
                if self.probe_unanswered_since.is_none() {
                    self.probe_unanswered_since = Some(now);
                }
            }
            SendKind::New | SendKind::Retransmit => {
                if resent || kind == SendKind::Retransmit {
                    self.counters.retransmitted_segments += 1;
                    // Karn: the timed segment's sample would be ambiguous.
                    self.rtt_timed = None;
                }
                if self.snd_una == self.snd_max && seq_end.distance_from(self.snd_max) > 0 {
                    // Outstanding space appears: the user timeout counts from here.
                    self.last_progress = now;
                    if let Some(last) = self.last_data_send {
                        if now.saturating_duration_since(last) > self.rtt.rto() {
                            // RFC 5681 §4.1: restart after an idle period.
                            self.cc.on_idle_restart(now);
                        }
                    }
                }
                if seq_end.distance_from(self.snd_max) > 0 {
                    if self.rtt_timed.is_none() && !self.ts_enabled && !resent {
                        self.rtt_timed = Some((seq_end, now));
                    }
                    self.snd_max = seq_end;
                    self.last_data_send = Some(now);
                }
                if seq_end.distance_from(self.snd_nxt) > 0 && seq.distance_from(self.snd_nxt) <= 0 {
                    self.snd_nxt = seq_end;
                }
                if kind == SendKind::Retransmit
                    && self.in_recovery
                    && seq_end.distance_from(self.high_rxt) > 0
                {
                    self.high_rxt = seq_end;
                }
                if resent || kind == SendKind::Retransmit {
                    let ts = self.ts_enabled.then(|| self.tsval(now));
                    if let Some(undo) = self.undo.as_mut() {
                        undo.retrans = undo.retrans.saturating_add(seq_len(seq, end));
                        undo.retransmitted = true;
                        if undo.first_rtx_tsval.is_none() {
                            undo.first_rtx_tsval = ts;
                        }
                    }
                }
                if self.in_recovery {
                    // RFC 6937 prr_out.
                    self.prr_out = self.prr_out.saturating_add(seq_len(seq, seq_end));
                }
                // Per wire segment, so that a loss inside a super-segment is marked and
                // repaired as the loss of that segment alone.
                let rack = self.rack_active();
                let mut at = seq;
                while seq_end.distance_from(at) > 0 {
                    let piece_end = if seq_len(at, seq_end) > segment_size {
                        at + segment_size
                    } else {
                        seq_end
                    };
                    if rack {
                        self.rack.on_send(at, piece_end, now);
                    }
                    if self.ts_enabled {
                        self.send_times.on_send(at, piece_end, now);
                    }
                    at = piece_end;
                }
                // RFC 6298 §5.1: start the timer if it is not running.
                if self.rtx_deadline.is_none() && seq_len(seq, seq_end) > 0 {
                    self.rtx_deadline = Some(now + self.rtt.rto());
                }
                if kind == SendKind::New && seq_len(seq, seq_end) > 0 {
                    // RFC 8985 §7.2: (re)start the PTO after sending new data.
                    self.arm_tlp(now);
                }
            }
        }
        self.counters.bytes_sent += len as u64;
        if len > segment_size {
            self.counters.super_segments_sent += 1;
            self.counters.super_segment_pieces += len.div_ceil(segment_size) as u64;
        }
        let repr = self.finish_segment(seq, flags, options);
        trace!(seq = seq.0, len, ?flags, "tcp: sending data");
        Transmit {
            repr,
            payload_len: len,
            payload_sum,
            segment_size,
            payload_gathered: !self.gathered.is_empty(),
        }
    }

    /// Keep-alive probe `<SEQ=SND.UNA-1><ACK=RCV.NXT>`, no data: the peer answers it with
    /// an ACK since it is out of window.
    fn transmit_keepalive(&mut self, now: Instant) -> Option<Transmit> {
        if !self.keepalive_pending {
            return None;
        }
        self.keepalive_pending = false;
        let options = self.data_options(now);
        let repr = self.finish_segment(self.snd_una - 1, TcpFlags::ACK, options);
        trace!("tcp: keep-alive probe");
        Some(Transmit {
            repr,
            payload_len: 0,
            payload_sum: 0,
            segment_size: 0,
            payload_gathered: false,
        })
    }

    /// A pure ACK when one is owed: an immediate ACK, a challenge ACK, an expired delayed
    /// ACK, or a window update after the reader freed space (smoltcp #199). Sometimes two
    /// copies at different sequence numbers ([`Connection::ack_seqs`]).
    fn transmit_ack(&mut self, now: Instant) -> Option<Transmit> {
        let seq = match self.second_ack.take() {
            Some(seq) => seq,
            None if self.ack_now || self.window_update_due() => {
                let (first, second) = self.ack_seqs();
                self.second_ack = second;
                first
            }
            None => return None,
        };
        let options = self.data_options(now);
        let repr = self.finish_segment(seq, TcpFlags::ACK, options);
        trace!(
            seq = seq.0,
            ack = self.rcv_nxt.0,
            window = repr.window,
            "tcp: sending ACK"
        );
        Some(Transmit {
            repr,
            payload_len: 0,
            payload_sum: 0,
            segment_size: 0,
            payload_gathered: false,
        })
    }

    /// The sequence number(s) of a segment without data. The peer drops one whose number
    /// it does not accept, ACK field and window included (RFC 9293 §3.10.7.4): with its
    /// window open, RCV.NXT <= SEG.SEQ < RCV.NXT + RCV.WND; with it shut, exactly
    /// RCV.NXT. Its RCV.NXT lies between SND.UNA and the end of what we sent (SND.MAX,
    /// or a persist probe's octet beyond it), and we cannot tell where:
    ///
    /// - The end, normally: after an RTO rewound SND.NXT (go-back-N) a rewound number lies
    ///   left of a peer that took more, which deadlocks two senders that both retransmit.
    /// - Both, while the peer's window is shut and sequence space is unacknowledged: a peer
    ///   out of receive memory (Linux's `ICSK_ACK_NOMEM`) dropped what we sent and takes
    ///   only SND.UNA; a peer that took our octets (a probe, a FIN, data whose ACK is still
    ///   on its way) takes only the end. Sending one number alone stalled one of them: the
    ///   first, a Linux peer's data flow (our ACKs unread); the second, two of our own
    ///   stacks that each dropped the other's ACKs (found by the oracle proptest). The
    ///   copy the peer does not take costs it a rate-limited reply at most.
    fn ack_seqs(&self) -> (SeqNumber, Option<SeqNumber>) {
        let end = match self.probe_end {
            Some(end) if end.distance_from(self.snd_max) > 0 => end,
            _ => self.snd_max,
        };
        if self.snd_wnd == 0 && self.snd_una != end {
            (self.snd_una, Some(end))
        } else {
            (end, None)
        }
    }

    /// Fills in ports, ACK, window and the ACK bookkeeping of a non-SYN segment.
    fn finish_segment(&mut self, seq: SeqNumber, flags: TcpFlags, options: TcpOptions) -> TcpRepr {
        if let Some((left, right)) = self.dsack.take() {
            // Reported once: the block rides on this segment if its options carry it.
            if options.sack_blocks[0] == Some(SackBlock { left, right }) {
                self.counters.dsacks_sent += 1;
            }
        }
        let window = self.window_field();
        let offered = usize::from(window) << self.rcv_wscale;
        let right_edge = self.rcv_nxt + offered;
        if right_edge.distance_from(self.rcv_adv) > 0 {
            self.rcv_adv = right_edge;
        }
        self.rcv_wnd_max = self.rcv_wnd_max.max(offered);
        self.note_ack_sent();
        TcpRepr {
            src_port: self.local.port(),
            dst_port: self.remote.port(),
            seq,
            ack: Some(self.rcv_nxt),
            flags: flags | TcpFlags::ACK,
            window,
            urgent: 0,
            options,
        }
    }

    /// Every segment we send carries an ACK of RCV.NXT: pending ACK state is satisfied.
    pub(super) fn note_ack_sent(&mut self) {
        self.ack_now = false;
        self.window_update_check = false;
        self.bytes_unacked = 0;
        self.delayed_ack_deadline = None;
        self.reply_ack_held = false;
        self.last_ack_sent = self.rcv_nxt;
    }

    /// Timestamps and SACK blocks for a non-SYN segment.
    fn data_options(&self, now: Instant) -> TcpOptions {
        let mut options = TcpOptions::default();
        if self.ts_enabled {
            options.timestamp = Some((self.tsval(now), self.ts_recent));
        }
        if self.sack_enabled && (!self.assembler.is_empty() || self.dsack.is_some()) {
            options.sack_blocks = self.sack_blocks();
        }
        options
    }

    /// RFC 2018 §4: the first block holds the most recently received segment, then the
    /// other recently reported ones, then the remaining ranges; 3 blocks beside timestamps,
    /// 4 without. A pending D-SACK (RFC 2883 §4) goes first, followed by the SACKed range
    /// that contains it, if any.
    fn sack_blocks(&self) -> [Option<SackBlock>; 4] {
        let limit = if self.ts_enabled { 3 } else { 4 };
        let mut blocks: [Option<SackBlock>; 4] = [None; 4];
        let mut n = 0;
        let to_block = |(offset, len): (usize, usize)| SackBlock {
            left: self.rcv_nxt + offset,
            right: self.rcv_nxt + offset + len,
        };
        let mut containing = None;
        if let Some((left, right)) = self.dsack {
            blocks[0] = Some(SackBlock { left, right });
            n = 1;
            let rel = left.distance_from(self.rcv_nxt);
            if rel >= 0 {
                let (lo, hi) = (rel as usize, seq_len(self.rcv_nxt, right));
                containing = self
                    .assembler
                    .containing(lo)
                    .filter(|&(offset, len)| hi <= offset + len);
            }
        }
        let recent_ranges = self.sack_recent.iter().flatten().filter_map(|seq| {
            let rel = seq.distance_from(self.rcv_nxt);
            if rel < 0 {
                return None;
            }
            let rel = rel as usize;
            self.assembler.containing(rel)
        });
        for range in containing
            .into_iter()
            .chain(recent_ranges)
            .chain(self.assembler.ranges())
        {
            if n == limit {
                break;
            }
            let block = to_block(range);
            // The D-SACK block (index 0) may equal a SACKed range; that range is still
            // reported after it (RFC 2883 §4).
            let start = usize::from(self.dsack.is_some()).min(n);
            if blocks[start..n].iter().flatten().any(|b| *b == block) {
                continue;
            }
            blocks[n] = Some(block);
            n += 1;
        }
        blocks
    }

    /// The largest payload for a segment with `options`: the send MSS (which already
    /// accounts for timestamps) less any SACK blocks.
    fn max_payload(&self, options: &TcpOptions) -> usize {
        let sack_count = options.sack_blocks.iter().flatten().count();
        let sack_len = if sack_count > 0 {
            // 2 NOPs + kind + length + 8 bytes per block.
            4 + 8 * sack_count
        } else {
            0
        };
        self.send_mss().saturating_sub(sack_len).max(1)
    }

    /// The receive window to offer now, in bytes (RFC 9293 §3.8.6.2.2 receiver SWS
    /// avoidance): the right edge moves only when it can move by at least
    /// `min(buffer/2, MSS)`, and never moves left.
    fn window_to_advertise(&self) -> usize {
        let free = self.rx.free();
        let promised = seq_len(self.rcv_nxt, self.rcv_adv).min(free);
        let threshold = (self.rx.capacity() / 2)
            .min(usize::from(self.config.mss))
            .max(1);
        if free >= promised.saturating_add(threshold) {
            free
        } else {
            promised
        }
    }

    /// The window field for the next segment: scaled, clamped to 16 bits, never more than
    /// the buffer's free space (RFC 7323 §2.3).
    pub(super) fn window_field(&self) -> u16 {
        let window = if self.fin_received {
            // No more data can come; the free space is still the honest answer.
            self.rx.free()
        } else {
            self.window_to_advertise()
        };
        (window >> self.rcv_wscale).min(usize::from(u16::MAX)) as u16
    }

    /// Whether a window update is owed: the window we would now advertise moves the right
    /// edge (subject to receiver SWS avoidance) beyond the last one advertised. This
    /// always fires after the reader drains a zero or small window far enough.
    fn window_update_due(&self) -> bool {
        if !self.window_update_check
            || self.fin_received
            || !matches!(
                self.state,
                State::Established | State::FinWait1 | State::FinWait2
            )
        {
            return false;
        }
        // As Linux does: only when what the peer may still send has fallen to half of
        // what it was offered or less and the update at least doubles it, so that a
        // reader keeping up with a large window does not send an update per read.
        // Measured against the largest window advertised, not the buffer: a SYN's window
        // is unscaled (at most 64 KiB), so against a larger buffer the first read of a
        // connection found the peer's 64 KiB "fallen" and sent a pure ACK for nothing
        // (one per accepted connection, before its answer).
        let promised = seq_len(self.rcv_nxt, self.rcv_adv);
        let window = usize::from(self.window_field()) << self.rcv_wscale;
        window > promised
            && promised <= self.rx.capacity().min(self.rcv_wnd_max) / 2
            && window >= promised.saturating_mul(2)
    }

    /// Arms the persist timer when data waits but nothing is in flight to carry a window
    /// update back: a zero window, or one too small for the SWS rules (RFC 9293 §3.8.6.1).
    fn arm_persist(&mut self, now: Instant) {
        let can_send_data = matches!(
            self.state,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::Closing
                | State::LastAck
        );
        let waiting = can_send_data
            && self.snd_una == self.snd_max
            && self.snd_nxt.distance_from(self.send_end()) < 0;
        if !waiting {
            self.persist_deadline = None;
            return;
        }
        if self.persist_deadline.is_none() && !self.persist_force {
            // Exponential backoff from the RTO, capped at max_rto (Zephyr #48471).
            let shift = self.persist_backoff.min(20);
            let interval = self
                .rtt
                .rto()
                .saturating_mul(1u32 << shift)
                .min(self.config.max_rto);
            self.persist_deadline = Some(now + interval);
        }
    }
}
