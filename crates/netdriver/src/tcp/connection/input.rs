//! Segment arrival: RFC 9293 §3.10.7 ("SEGMENT ARRIVES"), hardened by RFC 5961, with
//! RFC 7323 timestamps (§4.3 TS.Recent, §5.3 PAWS with the §5.5 idle rule), RFC 2018 / RFC 6675 SACK input and RFC 5681 / RFC 6582 loss
//! detection. Every path is panic-free for any header values and payload.

use tracing::trace;

use super::{seq_len, timestamp_value, Connection, State};
use crate::tcp::SeqNumber;
use crate::time::Instant;
use crate::wire::tcp::{SackBlock, TcpFlags, TcpRepr};
use crate::wire::Parts;

/// TSval ticks by which a segment may be older than TS.Recent and still pass PAWS
/// (RFC 7323 §5.3 R1; Linux's `TCP_PAWS_WINDOW`).
const PAWS_WINDOW: i32 = 1;
impl Connection {
    /// Feeds one received segment for this connection's 4-tuple (RFC 9293 §3.10.7).
    /// Checksums must already be verified. The ACK field is taken as present exactly when
    /// `repr.ack` is `Some`. Any reply (ACK, RST, SYN-ACK) comes out of `poll_transmit`.
    pub fn handle_segment(&mut self, now: Instant, repr: &TcpRepr, payload: &[u8]) {
        self.handle_segment_parts(now, repr, Parts::whole(payload));
    }

    /// [`handle_segment`](Self::handle_segment) for a payload held in several slices (a
    /// frame received as a chain of buffers): the bytes are copied into the receive ring
    /// from where they lie, exactly as a contiguous payload's are.
    pub fn handle_segment_parts(&mut self, now: Instant, repr: &TcpRepr, payload: Parts<'_>) {
        self.rx_placed = None;
        self.handle_segment_inner(now, repr, payload);
    }

    /// The receive fast path's first half: if this segment's payload is the next in-order
    /// data of an established connection with nothing held out of order and room for all
    /// of it, copies it into the receive ring at RCV.NXT (not yet readable) and returns its
    /// folded checksum sum, computed in the same pass
    /// ([`checksum::copy_and_sum`](crate::wire::checksum::copy_and_sum)); otherwise does
    /// nothing and returns `None`.
    ///
    /// The caller completes the segment's checksum with this sum and then either calls
    /// [`handle_segment_placed`](Self::handle_segment_placed), which skips copying the
    /// payload again, or, if the checksum fails, drops the segment: the bytes written lie
    /// in the ring's free space, where nothing is held (no out-of-order data), and are
    /// overwritten by the next arrival. Either way the payload is read once.
    ///
    /// The payload may be held in several slices ([`Parts`]); the sum is that of its
    /// bytes laid end to end. `sum: false` (the link vouched for the checksum) copies
    /// without summing and returns `Some(0)`: summing was a pass over every received byte
    /// that nothing read (8 % of a bulk transfer's instructions over AF_PACKET, both stacks
    /// and the virtual sockets included, under callgrind; more than one of the copies).
    pub fn place_payload(&mut self, seq: SeqNumber, payload: Parts<'_>, sum: bool) -> Option<u16> {
        self.rx_placed = None;
        if self.state != State::Established
            || seq != self.rcv_nxt
            || payload.is_empty()
            || !self.assembler.is_empty()
            || payload.len() > self.rx.free()
        {
            return None;
        }
        let (n, sum) = if sum {
            self.rx.write_parts_at_sum(0, payload)
        } else {
            (self.rx.write_parts_at(0, payload), 0)
        };
        if n != payload.len() {
            return None;
        }
        self.rx_placed = Some((seq, n, self.rx.layout()));
        Some(sum)
    }

    /// [`handle_segment`](Self::handle_segment) for a segment whose payload
    /// [`place_payload`](Self::place_payload) has just copied into the receive ring: if
    /// the payload is accepted in order and the ring is unchanged since, it is committed
    /// where it lies instead of being copied again; otherwise it is handled exactly like
    /// `handle_segment` handles it.
    pub fn handle_segment_placed(&mut self, now: Instant, repr: &TcpRepr, payload: Parts<'_>) {
        self.handle_segment_inner(now, repr, payload);
        self.rx_placed = None;
    }

    fn handle_segment_inner(&mut self, now: Instant, repr: &TcpRepr, payload: Parts<'_>) {
        let now = self.clock(now);
        self.counters.segments_received += 1;
        if repr.dst_port != self.local.port() || repr.src_port != self.remote.port() {
            trace!(?repr, "tcp: segment for another port pair dropped");
            return;
        }
        // A payload longer than any window would break sequence arithmetic; no real
        // segment is that long (the IPv4 total length caps it at 64 KiB).
        if payload.len() >= (1 << 30) {
            trace!("tcp: absurd payload length dropped");
            return;
        }
        match self.state {
            State::Closed => {
                // §3.10.7.1: a CLOSED connection answers everything but a RST with a RST.
                if let Some(rst) = super::rst_for_unexpected(repr, payload.len()) {
                    self.pending_rst = Some(rst);
                }
            }
            State::SynSent => self.handle_in_syn_sent(now, repr, payload),
            _ => self.handle_in_other_states(now, repr, payload),
        }
    }

    /// RFC 9293 §3.10.7.3, SYN-SENT.
    fn handle_in_syn_sent(&mut self, now: Instant, repr: &TcpRepr, payload: Parts<'_>) {
        let flags = repr.flags;
        // First: the ACK must acknowledge our SYN: ISS < SEG.ACK <= SND.NXT.
        if let Some(ack) = repr.ack {
            if ack.distance_from(self.iss) <= 0 || ack.distance_from(self.snd_max) > 0 {
                trace!(
                    ack = ack.0,
                    "tcp: SYN-SENT: unacceptable ACK, answering RST"
                );
                if !flags.rst() {
                    self.pending_rst = super::rst_for_unexpected(repr, payload.len());
                }
                return;
            }
        }
        // Second: a RST is acceptable only with an acceptable ACK (RFC 5961 §3.2 note for
        // SYN-SENT); then the peer refused the connection.
        if flags.rst() {
            if repr.ack.is_some() {
                self.fail(crate::tcp::TcpError::Refused, false);
            } else {
                trace!("tcp: SYN-SENT: RST without ACK ignored");
            }
            return;
        }
        // Fourth: SYN.
        if !flags.syn() {
            trace!("tcp: SYN-SENT: segment without SYN or RST dropped");
            return;
        }
        self.on_peer_syn(repr);
        self.ts_recent_stamp = now;
        self.last_rcv = now;
        match repr.ack {
            Some(ack) => {
                // Our SYN is acknowledged: ESTABLISHED. The window of a SYN-ACK is not
                // scaled (RFC 7323 §2.2).
                self.snd_wl2 = ack;
                self.on_new_ack(now, repr, ack);
                self.set_state(if self.fin_queued {
                    State::FinWait1
                } else {
                    State::Established
                });
                self.ack_now = true;
                self.arm_keepalive(now);
                if !payload.is_empty() || flags.fin() {
                    self.process_text(now, repr.seq + 1, payload, flags);
                }
            }
            None => {
                // Simultaneous open: SYN-RECEIVED, answer with SYN-ACK by rewinding to the
                // SYN. Any text waits for the peer's retransmission.
                self.set_state(State::SynReceived);
                self.snd_nxt = self.iss;
            }
        }
    }

    /// RFC 9293 §3.10.7.4 for SYN-RECEIVED and the synchronized states.
    fn handle_in_other_states(&mut self, now: Instant, repr: &TcpRepr, payload: Parts<'_>) {
        let flags = repr.flags;
        let seq = repr.seq;
        let seg_len = payload.len() + usize::from(flags.syn()) + usize::from(flags.fin());
        // RCV.WND is the window we advertised (RFC 9293 §3.10.7.4), not the buffer's free
        // space: receiver SWS avoidance may hold the right edge back while the reader frees
        // small amounts, and data beyond that edge is not acceptable.
        let rcv_wnd = seq_len(self.rcv_nxt, self.rcv_adv).min(self.rx.free());

        if flags.rst() {
            self.handle_rst(now, seq, rcv_wnd);
            return;
        }

        if flags.syn() {
            if self.state == State::SynReceived && seq == self.irs {
                if repr.ack.is_none() {
                    // The peer retransmitted its SYN: our SYN-ACK was lost. Resend it, at
                    // most once per `invalid_ack_interval` (Linux's `tcp_check_req` rate
                    // limits the same way): a burst of duplicate SYNs gets one SYN-ACK,
                    // and the retransmission timer resends it anyway.
                    let interval = self.config.invalid_ack_interval;
                    if self
                        .last_oow_ack
                        .is_some_and(|t| now.saturating_duration_since(t) < interval)
                    {
                        self.counters.oow_acks_suppressed += 1;
                        trace!("tcp: SYN-RECEIVED: duplicate SYN, SYN-ACK rate-limited");
                        return;
                    }
                    self.last_oow_ack = Some(now);
                    trace!("tcp: SYN-RECEIVED: retransmitted SYN, resending SYN-ACK");
                    self.snd_nxt = self.iss;
                    return;
                }
                // Simultaneous open (RFC 9293 §3.5 figure 7): the peer's SYN-ACK repeats
                // its SYN and acknowledges ours. Take the SYN as already seen, process the
                // rest as the handshake's ACK, and acknowledge.
                let mut rest = *repr;
                rest.flags = TcpFlags(flags.0 & !TcpFlags::SYN.0);
                rest.seq = seq + 1;
                self.ack_now = true;
                self.handle_in_other_states(now, &rest, payload);
                return;
            }
            // RFC 5961 §4: a SYN in a synchronized state, whatever its sequence number,
            // gets a (rate-limited) challenge ACK and is dropped.
            trace!("tcp: SYN in synchronized state, challenge ACK");
            self.challenge_ack(now);
            return;
        }

        if self.state == State::TimeWait {
            // RFC 7323 §4.3 applies in TIME-WAIT too: a retransmitted FIN refreshes
            // TS.Recent, which RFC 6191 then compares a new SYN against. Only the peer's
            // own FIN (or a bare ACK at RCV.NXT) acknowledging everything we sent may do
            // so: anything else would let a forged TSval refuse the peer's next SYN.
            let own_fin = flags.fin() && seq + payload.len() + 1 == self.rcv_nxt;
            let bare_ack = seg_len == 0 && seq == self.rcv_nxt;
            if repr.ack == Some(self.snd_max) && (own_fin || bare_ack) {
                self.update_ts_recent(now, repr);
            }
            self.handle_in_time_wait(now, repr, payload);
            return;
        }

        // RFC 7323 §5.3 R1: PAWS comes before the sequence check.
        if self.paws_rejects(now, repr) {
            trace!(
                tsval = repr.options.timestamp.map(|t| t.0),
                ts_recent = self.ts_recent,
                "tcp: PAWS: old TSval, segment dropped"
            );
            self.counters.paws_rejected += 1;
            if seg_len > 0 {
                self.ack_now = true;
            } else {
                self.challenge_ack(now);
            }
            return;
        }

        // First: sequence acceptability (§3.10.7.4 table).
        let window_probe = rcv_wnd == 0 && seg_len > 0 && seq == self.rcv_nxt;
        if !window_probe && !self.segment_acceptable(seq, seg_len, rcv_wnd) {
            trace!(
                seq = seq.0,
                seg_len,
                rcv_nxt = self.rcv_nxt.0,
                rcv_wnd,
                "tcp: unacceptable segment, ACK"
            );
            // A data segment wholly below RCV.NXT is a duplicate: report it (RFC 2883 §4).
            if !payload.is_empty() && (seq + payload.len()).distance_from(self.rcv_nxt) <= 0 {
                self.note_duplicate(seq, seq + payload.len());
            }
            if seg_len > 0 {
                self.ack_now = true;
            } else {
                self.oow_ack(now);
            }
            return;
        }
        // Nothing the peer's liveness or timestamps decide is taken from this segment yet:
        // its ACK has still to pass, and a forged segment that passed only the sequence
        // check must not move TS.Recent (every genuine segment would then fail PAWS) nor
        // count as a sign of life.

        // Fifth: ACK. Without one the segment is dropped (§3.10.7.4).
        let Some(ack) = repr.ack else {
            trace!("tcp: segment without ACK dropped");
            return;
        };

        if self.state == State::SynReceived {
            if ack.distance_from(self.snd_una) > 0 && ack.distance_from(self.snd_max) <= 0 {
                let next = if self.fin_queued {
                    State::FinWait1
                } else {
                    State::Established
                };
                self.set_state(next);
                // The handshake's ACK sets the window (§3.10.7.4 SYN-RECEIVED).
                self.snd_wl1 = seq;
                self.snd_wl2 = ack;
                self.snd_wnd = usize::from(repr.window) << self.snd_wscale;
                self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
                self.arm_keepalive(now);
            } else {
                trace!(
                    ack = ack.0,
                    "tcp: SYN-RECEIVED: unacceptable ACK, answering RST"
                );
                self.pending_rst = super::rst_for_unexpected(repr, payload.len());
                return;
            }
        }

        // RFC 5961 §5.2: acceptable ACKs lie in [SND.UNA - MAX.SND.WND, SND.NXT].
        let upper = match self.probe_end {
            Some(end) => end.max(self.snd_max),
            None => self.snd_max,
        };
        if ack.distance_from(upper) > 0 {
            trace!(
                ack = ack.0,
                snd_max = self.snd_max.0,
                "tcp: ACK of unsent data, challenge ACK"
            );
            self.challenge_ack(now);
            return;
        }
        // Not below the first byte ever sent either (Linux bounds MAX.SND.WND by the bytes
        // acknowledged so far): right after the handshake only SND.UNA itself is old
        // enough, so a blind ACK must hit [SND.UNA, SND.NXT] exactly.
        let behind = self
            .max_snd_wnd
            .min(self.counters.bytes_acked.min(1 << 30) as usize)
            .min(1 << 30);
        let oldest = self.snd_una.0.wrapping_sub(behind as u32);
        if ack.distance_from(SeqNumber(oldest)) < 0 {
            // RFC 5961 §5.2: discard, and send an ACK back (rate-limited like any
            // challenge ACK, §7).
            trace!(ack = ack.0, "tcp: ACK too old, dropped (RFC 5961 §5.2)");
            self.challenge_ack(now);
            return;
        }

        // The segment is acceptable and so is its ACK: only now may it update TS.Recent
        // (RFC 7323 §4.3 with RFC 5961 §5.2; Linux moved its update into `tcp_ack` for
        // the same reason) and restart the idle, probe and keep-alive clocks.
        self.last_rcv = now;
        self.probe_unanswered_since = None;
        self.keepalive_probes_out = 0;
        self.arm_keepalive(now);
        self.update_ts_recent(now, repr);

        self.process_ack(now, repr, ack, payload.len());
        if self.state == State::Closed {
            return;
        }

        // Sixth: URG is ignored. Seventh: segment text; eighth: FIN.
        match self.state {
            State::Established | State::FinWait1 | State::FinWait2 => {
                if window_probe {
                    // Zero window: the probe's byte cannot be stored; a FIN can still be
                    // taken since it needs no buffer space.
                    self.ack_now = true;
                    if payload.is_empty() && flags.fin() {
                        self.process_text(now, seq, Parts::whole(&[]), TcpFlags::FIN);
                    }
                } else if !payload.is_empty() || flags.fin() {
                    self.process_text(now, seq, payload, flags);
                }
            }
            _ => {
                // CLOSE-WAIT, CLOSING, LAST-ACK: the peer's FIN came already; anything
                // new is a retransmission to acknowledge.
                if seg_len > 0 {
                    self.ack_now = true;
                }
            }
        }
    }

    /// RFC 9293 §3.10.7.4 table of segment acceptability. Wraparound-safe.
    fn segment_acceptable(&self, seq: SeqNumber, seg_len: usize, rcv_wnd: usize) -> bool {
        let wnd = rcv_wnd.min(1 << 30) as u32;
        match (seg_len, wnd) {
            (0, 0) => seq == self.rcv_nxt,
            (0, _) => seq.in_window(self.rcv_nxt, wnd),
            (_, 0) => false,
            (len, _) => {
                let last = SeqNumber(seq.0.wrapping_add(len as u32).wrapping_sub(1));
                seq.in_window(self.rcv_nxt, wnd) || last.in_window(self.rcv_nxt, wnd)
            }
        }
    }

    /// RST processing with RFC 5961 §3.2: reset only on an exact match with RCV.NXT; an
    /// in-window RST gets a challenge ACK; anything else is dropped silently.
    fn handle_rst(&mut self, now: Instant, seq: SeqNumber, rcv_wnd: usize) {
        if self.state == State::TimeWait {
            // RFC 1337: no TIME-WAIT assassination.
            trace!("tcp: RST in TIME-WAIT ignored (RFC 1337)");
            return;
        }
        if seq == self.rcv_nxt {
            match self.state {
                State::SynReceived if !self.passive => {
                    self.fail(crate::tcp::TcpError::Refused, false)
                }
                State::Closing | State::LastAck => {
                    // Both sides were closing; nothing is lost (§3.10.7.4 second).
                    trace!("tcp: RST while closing, CLOSED");
                    self.enter_closed();
                }
                _ => self.fail(crate::tcp::TcpError::Reset, false),
            }
        } else if seq.in_window(self.rcv_nxt, rcv_wnd.clamp(1, 1 << 30) as u32) {
            trace!(
                seq = seq.0,
                rcv_nxt = self.rcv_nxt.0,
                "tcp: in-window RST, challenge ACK"
            );
            self.challenge_ack(now);
        } else {
            trace!(seq = seq.0, "tcp: out-of-window RST dropped");
        }
    }

    /// TIME-WAIT: the only expected arrival is a retransmitted FIN, which is acknowledged
    /// and restarts the 2*MSL timer (§3.10.7.4 eighth step); other segments carrying
    /// sequence space are answered with an ACK.
    /// Whether the flight before an ACK was limited by the congestion window rather than
    /// by the application or the peer's window. RFC 7661 §4: a window that was not used
    /// says nothing about the path, so growing it would only license a later burst (an
    /// application-limited sender's cwnd would otherwise grow without bound). In slow start
    /// a flight of half the window counts, since slow start doubles it per round trip
    /// (Linux's `tcp_is_cwnd_limited` makes the same allowance).
    fn cwnd_limited(&self, in_flight: usize) -> bool {
        let cwnd = self.cc.window();
        if cwnd < self.cc.ssthresh() {
            in_flight.saturating_mul(2) >= cwnd
        } else {
            in_flight.saturating_add(self.send_mss()) >= cwnd
        }
    }

    /// RFC 7323 §4.3 / §5.3 R3: TS.Recent follows the segment that covers Last.ACK.sent,
    /// if its TSval is not older. After the §5.5 idle limit TS.Recent is invalid and any
    /// TSval replaces it.
    fn update_ts_recent(&mut self, now: Instant, repr: &TcpRepr) {
        if !self.ts_enabled {
            return;
        }
        if let Some((tsval, _)) = repr.options.timestamp {
            let newer =
                (tsval.wrapping_sub(self.ts_recent) as i32) >= 0 || self.ts_recent_stale(now);
            if newer && repr.seq.distance_from(self.last_ack_sent) <= 0 {
                self.ts_recent = tsval;
                self.ts_recent_stamp = now;
            }
        }
    }

    /// RFC 7323 §5.5: TS.Recent unchanged for longer than the idle limit is invalid.
    fn ts_recent_stale(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.ts_recent_stamp) > self.config.paws_idle_limit
    }

    /// RFC 7323 §5.3 R1: timestamps on, PAWS configured, not a RST, a TSval older than a
    /// valid TS.Recent.
    fn paws_rejects(&self, now: Instant, repr: &TcpRepr) -> bool {
        if !self.config.paws || !self.ts_enabled || repr.flags.rst() {
            return false;
        }
        let Some((tsval, _)) = repr.options.timestamp else {
            return false;
        };
        // One tick of grace, as Linux's TCP_PAWS_WINDOW: a peer's threads may read its
        // clock on either side of a tick and send in the other order; no sequence number
        // wraps within a tick.
        (tsval.wrapping_sub(self.ts_recent) as i32) < -PAWS_WINDOW && !self.ts_recent_stale(now)
    }

    fn handle_in_time_wait(&mut self, now: Instant, repr: &TcpRepr, payload: Parts<'_>) {
        if repr.flags.fin() {
            let fin_seq = repr.seq + payload.len();
            if fin_seq + 1 == self.rcv_nxt {
                trace!("tcp: retransmitted FIN in TIME-WAIT, restarting 2MSL");
                self.enter_time_wait(now);
            }
            self.ack_now = true;
        } else if !payload.is_empty() {
            self.ack_now = true;
        }
    }

    /// Processes an acceptable ACK value (§3.10.7.4 fifth step): new data acknowledged,
    /// duplicate ACKs, SACK blocks, the send window, and FIN acknowledgement.
    fn process_ack(&mut self, now: Instant, repr: &TcpRepr, ack: SeqNumber, payload_len: usize) {
        let advance = ack.distance_from(self.snd_una);
        let old_wnd = self.snd_wnd;
        let una_before = self.snd_una;
        let sacked_before = self.sack_board.sacked_bytes();

        let mut newly_sacked = 0;
        if self.sack_enabled {
            let mut blocks = [SackBlock {
                left: SeqNumber(0),
                right: SeqNumber(0),
            }; 4];
            let mut n = 0;
            for block in repr.options.sack_blocks.iter().flatten() {
                blocks[n] = *block;
                n += 1;
            }
            let una = if advance > 0 { ack } else { self.snd_una };
            newly_sacked = self
                .sack_board
                .on_sack_blocks(una, self.snd_max, &blocks[..n]);
            self.tlp_mark_lost(newly_sacked);
        }
        // An ACK that moves nothing while nothing is outstanding and carries no SACK
        // blocks (what every data segment of a one-way transfer brings its receiver) has
        // nothing for RACK: no records, and the state it would age was aged by the ACK
        // that emptied the flight with this same SND.UNA.
        let idle_ack = advance == 0
            && self.snd_una == self.snd_max
            && repr.options.sack_blocks.iter().all(Option::is_none);
        let rack = self.rack_active() && advance >= 0 && self.state.is_synchronized() && !idle_ack;
        if rack {
            self.rack_on_ack(now, repr, ack);
        }

        if advance > 0 {
            self.on_new_ack(now, repr, ack);
        } else if advance == 0 {
            // RFC 5681 §2 duplicate ACK: nothing new acknowledged, data outstanding, no
            // payload, no SYN/FIN, and the same window.
            let window = usize::from(repr.window) << self.snd_wscale;
            let is_dup = self.snd_max != self.snd_una
                && payload_len == 0
                && !repr.flags.syn()
                && !repr.flags.fin()
                && window == old_wnd;
            // With SACK, an ACK that SACKs new data is evidence of loss too, even when it
            // carries data (both directions busy) (RFC 6675 §2 DupAck, §5).
            if is_dup || newly_sacked > 0 {
                self.on_duplicate_ack(now, newly_sacked);
            }
        }

        if rack {
            self.rack_detect(now);
        }
        if advance >= 0 && self.undo.is_some() {
            self.check_undo(repr, ack, advance);
        }
        if self.in_recovery && advance >= 0 {
            // RFC 6937 DeliveredData: change in SND.UNA plus change in SACKed bytes.
            let delivered = seq_len(una_before, self.snd_una) as i64
                + self.sack_board.sacked_bytes() as i64
                - sacked_before as i64;
            self.prr_update(delivered.max(0) as usize);
        }
        if advance >= 0 && self.state.is_synchronized() {
            self.tlp_on_ack(now, repr, ack, advance, payload_len);
        }

        // Window update (§3.10.7.4): only from a segment at least as new as the last one
        // that updated it.
        if advance >= 0 {
            let newer = self.snd_wl1.distance_from(repr.seq) < 0
                || (self.snd_wl1 == repr.seq && self.snd_wl2.distance_from(ack) <= 0);
            if newer {
                self.snd_wnd = usize::from(repr.window) << self.snd_wscale;
                self.snd_wl1 = repr.seq;
                self.snd_wl2 = ack;
                self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
                if self.snd_wnd > 0 {
                    // The window opened: the persist timer has done its job.
                    self.zero_window_since = None;
                    self.persist_deadline = None;
                    self.persist_backoff = 0;
                    self.persist_force = false;
                    if old_wnd == 0
                        && advance == 0
                        && self.snd_una.distance_from(self.snd_nxt) < 0
                        && self.snd_nxt.distance_from(self.snd_max) < 0
                    {
                        // Going back N after an RTO, and the window opened without taking
                        // what was resent into it (the probe octet was dropped): resend
                        // from SND.UNA rather than leave that octet for the next RTO.
                        self.snd_nxt = self.snd_una;
                    }
                }
            }
        }
        // RFC 9293 §3.8.6.1 (RFC 1122 §4.2.2.17): a receiver that keeps answering with a
        // closed window is alive, however long it holds the window shut. With data in
        // flight the probes are our retransmissions (the persist timer is not armed), and
        // a peer out of receive memory (Linux's ICSK_ACK_NOMEM) acknowledges nothing new;
        // while its last answer stands the user timeout is not running, and it restarts at
        // the next probe, as for persist probes (`unanswered_probes_give_up_after_user_timeout`).
        if self.snd_wnd > 0 || advance > 0 {
            self.closed_window_answered = false;
        } else if advance == 0 && self.snd_una != self.snd_max && self.state.is_synchronized() {
            self.closed_window_answered = true;
        }
    }

    /// A cumulative ACK covering new sequence space.
    fn on_new_ack(&mut self, now: Instant, repr: &TcpRepr, ack: SeqNumber) {
        let prev_una = self.snd_una;
        let acked_total = seq_len(prev_una, ack);
        let in_flight = self.bytes_in_flight();

        // Data bytes leave the send ring (the SYN and FIN have no bytes there).
        let data_acked = seq_len(self.tx_base, ack).min(self.tx.len());
        self.tx.consume(data_acked);
        self.tx_base += data_acked;
        self.counters.bytes_acked += data_acked as u64;
        let fin_acked = self.fin_queued && self.tx.is_empty() && ack == self.tx_base + 1;

        self.snd_una = ack;
        if self.snd_nxt.distance_from(ack) < 0 {
            self.snd_nxt = ack;
        }
        if self.snd_max.distance_from(ack) < 0 {
            // A zero-window probe's byte was accepted.
            self.snd_max = ack;
        }
        if let Some(end) = self.probe_end {
            if end.distance_from(ack) <= 0 {
                self.probe_end = None;
            }
        }
        if self.high_rxt.distance_from(ack) < 0 {
            self.high_rxt = ack;
        }
        if self.sack_enabled {
            self.sack_board.on_cumulative_ack(ack);
        }

        // RTT sample: with timestamps, the µs send time of the segment the echo names
        // (RTTM's sample, RFC 7323 §4, at µs resolution: our TSvals tick in ms), the echo
        // disambiguating retransmissions; else Karn's timed segment (RFC 6298 §3), which
        // retransmissions invalidate.
        let mut sample = None;
        if self.ts_enabled {
            let offset = self.ts_offset;
            let tsecr = repr.options.timestamp.map(|(_, ecr)| ecr);
            sample = self
                .send_times
                .on_ack(prev_una, ack, now, tsecr, |t| timestamp_value(t, offset));
        }
        if let Some((end, sent_at)) = self.rtt_timed {
            if end.distance_from(ack) <= 0 {
                self.rtt_timed = None;
                if sample.is_none() {
                    sample = Some(now.saturating_duration_since(sent_at));
                }
            }
        }
        if let Some(rtt) = sample {
            // Also cancels any RTO backoff: the path is demonstrably alive.
            self.rtt.on_sample(rtt);
        }

        // Loss recovery and congestion control.
        if self.in_recovery {
            if self.recover.distance_from(ack) <= 0 {
                // Full ACK: recovery ends (RFC 6582 §3.2 step 3, RFC 6675 §5).
                trace!(ack = ack.0, "tcp: loss recovery complete");
                self.in_recovery = false;
                self.recovery_inflation = 0;
                self.dup_acks = 0;
                self.limited_sent = 0;
                self.lost_below = None;
                self.cc.on_recovery_exit(now);
                self.rack.on_recovery_exit();
            } else if !self.sack_enabled {
                // NewReno partial ACK (RFC 6582 §3.2 step 4): retransmit the next hole,
                // deflate by the amount acknowledged, add back one MSS.
                let smss = self.send_mss();
                self.fast_rtx_pending = true;
                self.recovery_inflation = self
                    .recovery_inflation
                    .saturating_sub(acked_total)
                    .saturating_add(smss);
            }
        } else {
            self.dup_acks = 0;
            self.limited_sent = 0;
            if self.state.is_synchronized() && data_acked > 0 && self.cwnd_limited(in_flight) {
                self.cc.on_ack(now, data_acked, sample, in_flight);
            }
        }
        if data_acked > 0 {
            // Room appeared: a writer the full buffer held back may need a larger one.
            self.autotune_tx();
        }

        // RFC 6298 §5.2/§5.3: stop the timer when all is acknowledged, else restart it
        // (smoltcp #1018: forgetting to restart).
        self.rtx_deadline = if self.snd_una == self.snd_max {
            None
        } else {
            Some(now + self.rtt.rto())
        };
        self.last_progress = now;
        self.syn_retries_done = 0;

        if fin_acked {
            match self.state {
                State::FinWait1 => self.set_state(State::FinWait2),
                State::Closing => self.enter_time_wait(now),
                State::LastAck => {
                    trace!("tcp: FIN acknowledged in LAST-ACK, CLOSED");
                    self.enter_closed();
                }
                _ => {}
            }
        }
    }

    /// A duplicate ACK (RFC 5681 §3.2; RFC 6675 §5 when SACK is on).
    fn on_duplicate_ack(&mut self, now: Instant, newly_sacked: usize) {
        self.dup_acks = self.dup_acks.saturating_add(1);
        let smss = self.send_mss();
        if self.in_recovery {
            if !self.sack_enabled {
                // Step 4: each further duplicate means a segment left the network.
                self.recovery_inflation = self.recovery_inflation.saturating_add(smss);
            }
            return;
        }
        if self.rack_active() {
            // RACK decides (RFC 8985 §6.2), after this ACK's delivery information.
            return;
        }
        let threshold_hit = self.dup_acks >= self.config.dup_ack_threshold.max(1);
        let sack_loss = self.sack_enabled && newly_sacked > 0 && self.deemed_lost(self.snd_una);
        // RFC 6582 §3.2 step 1-2: no new recovery for ACKs below the previous recovery
        // point (duplicates caused by our own retransmissions after an RTO).
        let past_recover = self.snd_una.distance_from(self.recover) >= 0;
        if (threshold_hit || sack_loss) && past_recover {
            self.enter_recovery(now);
        }
    }

    /// Enters fast retransmit / fast recovery (RFC 5681 §3.2 steps 2-3, RFC 6675 §5).
    pub(super) fn enter_recovery(&mut self, now: Instant) {
        let smss = self.send_mss();
        trace!(
            snd_una = self.snd_una.0,
            snd_max = self.snd_max.0,
            "tcp: fast retransmit"
        );
        self.in_recovery = true;
        self.recover = self.snd_max;
        self.high_rxt = self.snd_una;
        let flight = self.bytes_in_flight();
        self.undo = self.config.undo.then(|| super::Undo {
            prior: self.cc.clone_box(),
            start: self.snd_una,
            end: self.snd_max,
            retrans: 0,
            retransmitted: false,
            first_rtx_tsval: None,
        });
        self.cc.on_congestion_event(now, flight);
        self.recovery_inflation = if self.sack_enabled {
            0
        } else {
            self.config.dup_ack_threshold.saturating_mul(smss)
        };
        self.fast_rtx_pending = true;
        self.rtt_timed = None;
        self.counters.fast_retransmits += 1;
        // Recovery makes its own congestion response: the TLP episode, if any, ends here
        // (no second response in RFC 8985 §7.4.2), and no probe runs during recovery.
        self.tlp_high = None;
        self.tlp_deadline = None;
        self.tlp_pending = false;
        self.prr_start(flight);
    }

    /// Segment text and FIN (§3.10.7.4 seventh and eighth steps). `seq` is the sequence
    /// number of the first payload byte (or of the FIN if there is no payload); of
    /// `flags`, FIN and PSH matter here.
    pub(super) fn process_text(
        &mut self,
        now: Instant,
        seq: SeqNumber,
        payload: Parts<'_>,
        flags: TcpFlags,
    ) {
        let fin = flags.fin();
        if !payload.is_empty() {
            // Linux's rule: data after a silence longer than the RTO starts a new burst
            // whose sender waits on our ACKs again; refill the quick-ACK budget.
            if let Some(last) = self.last_data_rcv {
                if now.saturating_duration_since(last) > self.rtt.rto() {
                    self.quick_acks = super::quick_ack_budget(&self.config);
                }
            }
            self.last_data_rcv = Some(now);
        }
        let had_ooo = !self.assembler.is_empty();
        let rel = seq.distance_from(self.rcv_nxt);
        // Bytes before RCV.NXT are duplicates: skip them.
        let skip = if rel < 0 {
            rel.unsigned_abs() as usize
        } else {
            0
        };
        let offset = if rel > 0 { rel as usize } else { 0 };
        if skip > 0 {
            // The front of the segment was received already (RFC 2883 §4.1.1 reports
            // the duplicated part).
            let dup_end = seq + skip.min(payload.len());
            self.note_duplicate(seq, dup_end);
        }
        let data = payload.skip(skip);
        let room = self.rx.free();
        let fit = data.len().min(room.saturating_sub(offset));
        let data = data.take(fit);
        let whole_segment_fits = fit == payload.len().saturating_sub(skip);

        let mut delivered = 0;
        if offset == 0 {
            if !data.is_empty() {
                // Already in the ring if `place_payload` put this very segment there
                // (same sequence number, at least these bytes, ring untouched since).
                let placed = self.rx_placed.take().is_some_and(|(at, len, layout)| {
                    at == seq && skip == 0 && data.len() <= len && layout == self.rx.layout()
                });
                if !placed {
                    self.rx.write_parts_at(0, data);
                }
                delivered = if self.assembler.is_empty() {
                    // In order with nothing held beyond it (the common case): nothing to
                    // merge. The assembler's ranges are relative to the contiguous point,
                    // so an empty one needs no update.
                    data.len()
                } else {
                    match self.assembler.add(0, data.len()) {
                        Ok(()) => self.assembler.remove_front(),
                        Err(_) => {
                            // No range to spare, but in-order data needs none: consume it
                            // directly and merge whatever it now touches.
                            self.assembler.advance(data.len());
                            data.len() + self.assembler.remove_front()
                        }
                    }
                };
            }
        } else if !data.is_empty() {
            // One O(log n) lookup, not a walk of every range (SegmentSmack, CVE-2018-5390).
            let held = self
                .assembler
                .containing(offset)
                .is_some_and(|(start, len)| offset + data.len() <= start + len);
            if held {
                // Out-of-order data we hold already (RFC 2883 §4.1.2).
                self.note_duplicate(seq, seq + data.len());
            }
            match self.assembler.add(offset, data.len()) {
                Ok(()) => {
                    self.rx.write_parts_at(offset, data);
                    self.note_sack_arrival(seq);
                }
                Err(_) => {
                    trace!(
                        offset,
                        len = data.len(),
                        "tcp: out-of-order range limit, segment dropped"
                    );
                    self.counters.ooo_dropped += 1;
                }
            }
            // RFC 5681 §4.2: out-of-order data is acknowledged at once (duplicate ACK).
            self.ack_now = true;
        } else if !payload.is_empty() {
            // Nothing of it fits or all of it is old: acknowledge.
            self.ack_now = true;
        }

        if delivered > 0 {
            self.rx.commit(delivered);
            self.rcv_nxt += delivered;
            self.counters.bytes_received += delivered as u64;
            if had_ooo {
                // Filling a gap: ACK at once so the sender learns quickly (RFC 5681 §4.2).
                self.ack_now = true;
            } else {
                self.schedule_delayed_ack(now, delivered, flags.psh());
            }
        }

        if fin && whole_segment_fits {
            let fin_seq = seq + payload.len();
            if fin_seq.distance_from(self.rcv_nxt) > 0 {
                self.pending_fin = Some(fin_seq);
                self.ack_now = true;
            } else if fin_seq == self.rcv_nxt {
                self.pending_fin = Some(fin_seq);
            }
        }
        if let Some(fin_seq) = self.pending_fin {
            if fin_seq == self.rcv_nxt {
                self.pending_fin = None;
                self.receive_fin(now);
            }
        }
    }

    /// The peer's FIN, now in order (§3.10.7.4 eighth step).
    ///
    /// A FIN that closes the peer's side first (ESTABLISHED to CLOSE-WAIT) is acknowledged
    /// within the delayed-ACK timeout rather than at once, as Linux does (`tcp_fin`
    /// enters ping-pong mode): the application usually answers the end of its input by
    /// closing, and our FIN then carries the ACK: three segments for the close instead
    /// of four, which a peer closing connections at a high rate pays for one by one. A
    /// FIN that answers ours (FIN-WAIT) is acknowledged at once: nothing of ours is to
    /// follow.
    fn receive_fin(&mut self, now: Instant) {
        self.rcv_nxt += 1;
        self.fin_received = true;
        self.assembler.clear();
        trace!(state = ?self.state, "tcp: FIN received");
        let passive = matches!(self.state, State::SynReceived | State::Established);
        match self.config.delayed_ack {
            Some(delay) if passive && !self.ack_now => {
                if self.delayed_ack_deadline.is_none() {
                    self.delayed_ack_deadline = Some(now + delay);
                }
            }
            _ => self.ack_now = true,
        }
        match self.state {
            State::SynReceived | State::Established => self.set_state(State::CloseWait),
            State::FinWait1 => {
                // Our FIN is acknowledged iff SND.UNA passed it.
                let fin_acked =
                    self.fin_queued && self.tx.is_empty() && self.snd_una == self.tx_base + 1;
                if fin_acked {
                    self.enter_time_wait(now);
                } else {
                    self.set_state(State::Closing);
                }
            }
            State::FinWait2 => self.enter_time_wait(now),
            _ => {}
        }
    }

    /// RFC 5681 §4.2 / RFC 9293 §3.8.6.3: ACK at least every second full-sized segment,
    /// else within the delayed-ACK timeout: counted in bytes against the peer's segment
    /// size as seen (`rcv_mss`), as Linux does, so that short segments of several
    /// request/response streams sharing the connection are acknowledged by the replies
    /// rather than by a pure ACK per two requests. The timer is armed by the first
    /// unacknowledged segment and not pushed back by later ones (smoltcp #935).
    ///
    /// Quick-ACK (Linux's quickack mode, `tcp_incr_quickack`): while the budget lasts,
    /// in-order data is acknowledged at once. A sender in slow start or holding a small
    /// segment back by Nagle waits on our ACKs; delaying them at the start of a connection
    /// or of a burst after idle costs it the delayed-ACK timeout (the 40 ms stall). Unlike
    /// Linux there is no ping-pong mode that suppresses quick ACKs for interactive
    /// exchanges. Instead, with [`Config::reply_carries_ack`](crate::tcp::Config), a
    /// short segment that ends a message (`push`, less than a full segment, nothing else
    /// unacknowledged: a request) is left to the delayed-ACK rules whatever the budget,
    /// so that the reply carries its ACK; the owner releases it when the reader waits for
    /// more ([`reader_waiting`](Self::reader_waiting)). A sender in slow start sends full
    /// segments, which the budget still acknowledges at once.
    fn schedule_delayed_ack(&mut self, now: Instant, delivered: usize, push: bool) {
        let full = usize::from(self.advertised_mss());
        let request =
            self.config.reply_carries_ack && push && delivered < full && self.bytes_unacked == 0;
        self.rcv_mss = self.rcv_mss.max(delivered.min(full)).min(full);
        match self.config.delayed_ack {
            None => self.ack_now = true,
            Some(_) if self.quick_acks > 0 && !request => {
                self.quick_acks -= 1;
                self.ack_now = true;
            }
            Some(delay) => {
                // What the quick-ACK budget would have acknowledged at once is held for
                // the reply, until the reader waits (`reader_waiting`).
                self.reply_ack_held |= self.quick_acks > 0;
                self.bytes_unacked += delivered;
                if self.bytes_unacked >= self.config.full_segments_per_ack.max(1) * self.rcv_mss {
                    self.ack_now = true;
                } else if self.delayed_ack_deadline.is_none() {
                    self.delayed_ack_deadline = Some(now + delay);
                }
            }
        }
    }

    /// A duplicate segment `[left, right)` arrived: the next ACK reports it in its first
    /// SACK block (D-SACK, RFC 2883 §4), so that the sender can tell a spurious
    /// retransmission from a loss. Only the latest duplicate is reported (§4: at most
    /// one D-SACK block per ACK), and it is sent at once.
    fn note_duplicate(&mut self, left: SeqNumber, right: SeqNumber) {
        if !self.sack_enabled || right.distance_from(left) <= 0 {
            return;
        }
        self.dsack = Some((left, right));
        self.ack_now = true;
    }

    /// Remembers that an out-of-order segment starting at `seq` arrived, newest first, for
    /// the SACK block order of RFC 2018 §4.
    fn note_sack_arrival(&mut self, seq: SeqNumber) {
        if !self.sack_enabled {
            return;
        }
        let mut recent = [Some(seq), None, None, None];
        let mut n = 1;
        for s in self.sack_recent.iter().flatten() {
            if n == recent.len() {
                break;
            }
            if *s != seq {
                recent[n] = Some(*s);
                n += 1;
            }
        }
        self.sack_recent = recent;
    }

    pub(super) fn arm_keepalive(&mut self, now: Instant) {
        if let Some(interval) = self.config.keepalive {
            self.keepalive_deadline = Some(now + interval);
        }
    }
}
