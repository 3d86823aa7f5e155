//! Tail Loss Probe (RFC 8985 §7).
//!
//! When the last segments of a flight are lost, no later segment produces the duplicate
//! ACKs or SACK blocks that fast recovery needs, and recovery waits for the RTO (at least
//! `min_rto`, 200 ms by default). TLP arms a probe timeout (PTO) of 2·SRTT instead
//! (§7.2), plus the peer's worst-case delayed ACK when a single segment is in flight, after
//! sending new data or on a cumulative ACK. When it expires, one probe goes out (§7.3): a
//! new segment if there is unsent data and the peer's window allows, else the
//! highest-sequence MSS of outstanding data. The probe's ACK then carries the SACK
//! information that lets RFC 6675 recovery repair the rest; the RTO is re-armed after the
//! probe and still fires if the probe is lost too.
//!
//! What is implemented, and how it differs from the RFC:
//! - §7.2 scheduling: only with SACK negotiated (without SACK the probe's ACK says nothing
//!   about the holes), an RTT sample, nothing SACKed, and not in fast or RTO recovery.
//!   The PTO is clamped to the RTO's expiry: with one segment in flight and the 200 ms
//!   allowance that is the usual case, and the probe then takes the RTO's place (the
//!   segment is resent without the RTO's collapse of cwnd, and the RTO re-armed).
//! - The PTO is at least `Config::tlp_min_pto` (2 ms by default; Linux adds 2 ms to
//!   every PTO): 2·SRTT of a link with a 50 µs RTT is shorter than a loaded host's
//!   scheduling delay, and probes fired then were nearly all spurious.
//! - §7.3 at most one probe per episode: no PTO is armed while TLP.end_seq is set.
//! - §7.4 detection of a loss repaired by the probe: an ACK beyond TLP.end_seq after a
//!   retransmitted probe, without a D-SACK for the probe, costs a congestion response
//!   equivalent to fast recovery (ssthresh and cwnd reduced at once). A D-SACK for the
//!   probe, or a pure duplicate ACK of TLP.end_seq, shows that nothing was lost.
//! - With `Config::rack` off, RACK's rule (§6.2) is applied to the probe alone: when the probe (or anything above it) is SACKed,
//!   every un-SACKed byte below it, sent at least a PTO earlier, is deemed lost, so the
//!   probe's ACK enters fast recovery and the holes are resent at once rather than waiting
//!   for RFC 6675's three-segment evidence. With RACK on, RACK does this for every segment
//!   (see `recovery`).

use tracing::trace;

use super::{seq_len, Connection, State, Transmit};
use crate::tcp::SeqNumber;
use crate::time::Instant;
use crate::wire::tcp::{TcpOptions, TcpRepr};

use super::output::SendKind;

impl Connection {
    /// (Re)arms or cancels the PTO after new data went out or an ACK arrived (§7.2).
    pub(super) fn arm_tlp(&mut self, now: Instant) {
        self.tlp_deadline = self.pto_deadline(now);
    }

    /// When a probe would be due if armed now, or `None` when §7.2's conditions do not
    /// hold.
    fn pto_deadline(&self, now: Instant) -> Option<Instant> {
        if !self.config.tail_loss_probe || !self.sack_enabled || self.tlp_high.is_some() {
            return None;
        }
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
        // Nothing outstanding, SND.NXT rewound by an RTO, fast recovery or the RTO's own
        // recovery (SND.UNA below "recover"), or SACKed data (loss detection has what it
        // needs): no probe.
        if self.snd_una == self.snd_max
            || self.snd_nxt != self.snd_max
            || self.in_recovery
            || self.snd_una.distance_from(self.recover) < 0
            || self.sack_board.range_count() > 0
        {
            return None;
        }
        let srtt = self.rtt.srtt()?;
        let rto_at = self.rtx_deadline?;
        let mut pto = srtt.saturating_mul(2).max(self.config.tlp_min_pto);
        if self.bytes_in_flight() <= self.send_mss() {
            // A lone segment may wait for the peer's delayed-ACK timer (§7.2 WCDelAckT).
            pto = pto.saturating_add(self.config.tlp_max_ack_delay);
        }
        // §7.2: never later than the RTO. A probe due at the RTO's instant replaces the
        // retransmission timeout: the last segment is resent without collapsing cwnd to
        // one segment, and the RTO is re-armed behind it.
        Some((now + pto).min(rto_at))
    }

    /// The PTO expired (§7.3): the probe goes out at the next `poll_transmit`, and the RTO
    /// is re-armed from now, so that a PTO clamped to the RTO's instant takes its place.
    pub(super) fn on_tlp_timeout(&mut self, now: Instant) {
        self.tlp_deadline = None;
        self.tlp_pending = true;
        self.rtx_deadline = Some(now + self.rtt.rto());
        trace!(
            snd_una = self.snd_una.0,
            snd_max = self.snd_max.0,
            "tcp: PTO expired"
        );
    }

    /// Sends the loss probe if the PTO fired (§7.3): a new segment if data is unsent and
    /// the peer's window has room (the congestion window is not consulted: the probe
    /// replaces an ACK that did not come), else the last MSS of outstanding sequence space
    /// (with the FIN if it was sent). Then the RTO is re-armed.
    pub(super) fn transmit_tlp(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        options: TcpOptions,
        max_seg: usize,
    ) -> Option<Transmit> {
        if !self.tlp_pending {
            return None;
        }
        self.tlp_pending = false;
        // Conditions may have changed since the timer fired (an ACK in between).
        if self.snd_una == self.snd_max
            || self.snd_nxt != self.snd_max
            || self.in_recovery
            || self.tlp_high.is_some()
        {
            return None;
        }
        let send_end = self.send_end();
        let in_flight = seq_len(self.snd_una, self.snd_nxt);
        let room_wnd = self.snd_wnd.saturating_sub(in_flight);
        let unsent = seq_len(self.snd_nxt, send_end);
        let flight_before = self.bytes_in_flight();
        // Mark the episode first so that `emit_data` does not re-arm the PTO.
        self.tlp_high = Some(self.snd_max);
        let (seq, len, kind) = if unsent > 0 && room_wnd > 0 {
            (
                self.snd_nxt,
                unsent.min(max_seg).min(room_wnd),
                SendKind::New,
            )
        } else {
            // The end of outstanding data: SND.MAX, or the end of the queue if the FIN
            // was sent after it.
            let data_end = if self.snd_max.distance_from(send_end) > 0 {
                send_end
            } else {
                self.snd_max
            };
            let outstanding = seq_len(self.snd_una, data_end);
            let start = if outstanding > max_seg {
                data_end - max_seg
            } else {
                self.snd_una
            };
            (start, seq_len(start, data_end), SendKind::Retransmit)
        };
        let transmit = self.emit_data(now, seq, len, buf, options, kind);
        self.tlp_high = Some(self.snd_max);
        self.tlp_probe_seq = seq;
        self.tlp_retrans = kind == SendKind::Retransmit;
        self.tlp_flight = flight_before;
        self.counters.tail_loss_probes += 1;
        // §7.3: after the probe the RTO, not the PTO, guards the flight.
        self.rtx_deadline = Some(now + self.rtt.rto());
        trace!(
            seq = seq.0,
            len = transmit.payload_len,
            retransmission = self.tlp_retrans,
            "tcp: tail loss probe"
        );
        Some(transmit)
    }

    /// Whether un-SACKed byte `seq` counts as lost: RFC 6675 IsLost, or below a SACKed
    /// probe (see the module docs).
    pub(super) fn deemed_lost(&self, seq: SeqNumber) -> bool {
        if self.rack_active() {
            return self.rack.is_lost(seq);
        }
        self.lost_below
            .is_some_and(|below| seq.distance_from(below) < 0)
            || self
                .sack_board
                .is_lost(seq, self.config.dup_ack_threshold.max(1), self.send_mss())
    }

    /// Before loss detection runs on an ACK during an episode: when the probe or anything
    /// above it is SACKed, the holes below it are lost (RACK's rule, §6.2, for the probe).
    pub(super) fn tlp_mark_lost(&mut self, newly_sacked: usize) {
        // RACK applies this rule to every segment, the probe included.
        if self.tlp_high.is_none() || newly_sacked == 0 || self.rack_active() {
            return;
        }
        let probe = self.tlp_probe_seq;
        if self
            .sack_board
            .highest_sacked()
            .is_some_and(|h| h.distance_from(probe) > 0)
        {
            self.lost_below = Some(probe);
        }
    }

    /// After an acceptable ACK (`advance >= 0`): ends the TLP episode when the ACK tells
    /// whether the probe repaired a loss (§7.4), enters recovery when a cumulative ACK
    /// left holes below a SACKed probe, and re-arms or cancels the PTO.
    pub(super) fn tlp_on_ack(
        &mut self,
        now: Instant,
        repr: &TcpRepr,
        ack: SeqNumber,
        advance: i32,
        payload_len: usize,
    ) {
        if let Some(end) = self.tlp_high {
            let probe = (self.tlp_probe_seq, end);
            let dsack_of_probe = self.tlp_retrans
                && dsack_block(repr, ack).is_some_and(|(l, r)| {
                    l.distance_from(probe.1) < 0 && r.distance_from(probe.0) > 0
                });
            let pure_dup = advance == 0
                && payload_len == 0
                && repr.options.sack_blocks.iter().flatten().next().is_none();
            if dsack_of_probe {
                // §7.4.1: both the original and the probe arrived; nothing was lost.
                trace!("tcp: D-SACK for the loss probe, no loss");
                self.tlp_high = None;
            } else if ack.distance_from(end) >= 0 && !self.tlp_retrans {
                // A probe of new data: any loss it revealed went through SACK recovery.
                self.tlp_high = None;
            } else if ack.distance_from(end) > 0 {
                // §7.4.2: the retransmitted probe repaired a loss that no other mechanism
                // saw; respond as fast recovery would, at once.
                trace!(ack = ack.0, "tcp: loss repaired by the tail loss probe");
                self.cc.on_congestion_event(now, self.tlp_flight);
                self.cc.on_recovery_exit(now);
                self.counters.tlp_recoveries += 1;
                self.tlp_high = None;
            } else if ack == end && pure_dup {
                // A duplicate ACK of TLP.end_seq: the probe duplicated data that had
                // arrived (§7.4.1, Linux's rule in the absence of a D-SACK).
                self.tlp_high = None;
            }
        }
        if advance > 0
            && !self.in_recovery
            && self.lost_below.is_some()
            && self.snd_una != self.snd_max
            && self.snd_una.distance_from(self.recover) >= 0
            && self.deemed_lost(self.snd_una)
        {
            // The cumulative ACK moved, but holes below the SACKed probe remain: the
            // duplicate-ACK path does not see this ACK, so recovery starts here.
            self.enter_recovery(now);
        }
        self.arm_tlp(now);
    }
}

/// The D-SACK block of an ACK (RFC 2883 §4): the first SACK block, when it lies at or
/// below the cumulative ACK or inside the second block.
pub(super) fn dsack_block(repr: &TcpRepr, ack: SeqNumber) -> Option<(SeqNumber, SeqNumber)> {
    let first = repr.options.sack_blocks[0]?;
    if first.right.distance_from(first.left) <= 0 {
        return None;
    }
    let below_ack = first.right.distance_from(ack) <= 0;
    let inside_second = repr.options.sack_blocks[1].is_some_and(|second| {
        first.left.distance_from(second.left) >= 0 && first.right.distance_from(second.right) <= 0
    });
    (below_ack || inside_second).then_some((first.left, first.right))
}
