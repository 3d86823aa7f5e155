//! Loss detection for SACK recovery with RACK (RFC 8985 §6; the state machine is in
//! [`crate::tcp::rack`]).
//!
//! With RACK active (configured and SACK negotiated):
//! - every ACK feeds RACK its delivery information (§6.2 steps 1-4), then RACK marks
//!   losses (step 5) and arms the reorder timer (step 6); its expiry runs detection again
//!   (§6.3);
//! - any newly marked loss outside recovery starts fast recovery (RFC 8985 §6.2: RACK
//!   replaces the DupThresh trigger; the RFC 6582 "recover" rule still applies);
//! - during recovery, RFC 6675 NextSeg rule 1 retransmits the lowest segment RACK marked
//!   lost and SetPipe counts RACK's marks (rule 3 is not used, as in Linux);
//! - an RTO marks everything outstanding lost (§6.3 `RACK_mark_losses_on_RTO`, all of it
//!   since go-back-N resends everything anyway).
//!
//! Without SACK, or with [`Config::rack`](crate::tcp::Config::rack) off, the duplicate-ACK
//! threshold (RFC 5681 §3.2) and RFC 6675 IsLost decide as before.
//!
//! Proportional Rate Reduction (RFC 6937 §3, the PRR-SSRB variant) sets the window during
//! SACK recovery ([`Config::prr`](crate::tcp::Config::prr)): at entry `RecoverFS` is the
//! flight, and on every ACK `DeliveredData` (the change in SND.UNA plus the change in
//! SACKed bytes) is added to `prr_delivered`; while pipe exceeds ssthresh,
//! `sndcnt = ⌈prr_delivered · ssthresh / RecoverFS⌉ − prr_out`, else
//! `sndcnt = min(ssthresh − pipe, max(prr_delivered − prr_out, DeliveredData) + SMSS)`.
//! cwnd is then `pipe + sndcnt` until the next ACK; every byte sent in recovery counts in
//! `prr_out`. As in Linux, the first retransmission of an episode always goes out
//! (`sndcnt >= SMSS` while `prr_out == 0`). The RFC 6582 / RFC 6675 exit on a full ACK
//! leaves cwnd at ssthresh (the controller's own window).
//!
//! Undo of spurious recoveries ([`Config::undo`](crate::tcp::Config::undo), Linux's undo
//! after RFC 2883 §4 and RFC 3708's ideas, and RFC 3522 Eifel detection): entering
//! recovery saves the congestion controller. Every byte retransmitted in the episode is
//! counted; D-SACK blocks (RFC 2883) inside the episode's space subtract what they report.
//! When nothing is left, every retransmission was unnecessary: the saved controller is
//! restored (cwnd and ssthresh as before the reduction), whether recovery is still on (PRR
//! then works towards the restored ssthresh) or over. With timestamps, the first ACK that
//! covers the episode's first retransmitted byte and echoes a TSval older than that
//! retransmission shows that the original arrived (RFC 3522 §3): the same undo. Strictly
//! older: TSvals tick in ms, so a retransmission sent in its original's millisecond
//! carries the same TSval and its echo is ambiguous; then nothing is undone. A
//! spurious retransmission also means the path reorders, which RACK is told. The record
//! is dropped by the next episode or an RTO.

use tracing::trace;

use super::{timestamp_value, Connection};
use crate::tcp::SeqNumber;
use crate::time::Instant;
use crate::wire::tcp::TcpRepr;

impl Connection {
    /// RACK's share of an acceptable ACK (`advance >= 0`), before the cumulative ACK is
    /// processed: delivery information, reordering, and the D-SACK reordering window.
    pub(super) fn rack_on_ack(&mut self, now: Instant, repr: &TcpRepr, ack: SeqNumber) {
        let una = if ack.distance_from(self.snd_una) > 0 {
            ack
        } else {
            self.snd_una
        };
        let mut blocks = [(SeqNumber(0), SeqNumber(0)); 4];
        let mut n = 0;
        let window = self.snd_max.distance_from(una);
        for block in repr.options.sack_blocks.iter().flatten() {
            // Clipped to (una, snd_max] like the scoreboard does; invalid blocks dropped.
            let len = block.right.distance_from(block.left);
            if len <= 0 || window <= 0 {
                continue;
            }
            let lo = i64::from(block.left.distance_from(una)).max(0);
            let hi =
                (i64::from(block.left.distance_from(una)) + i64::from(len)).min(i64::from(window));
            if hi <= lo {
                continue;
            }
            blocks[n] = (una + lo as usize, una + hi as usize);
            n += 1;
        }
        let tsecr = if self.ts_enabled {
            repr.options.timestamp.map(|(_, ecr)| ecr)
        } else {
            None
        };
        let offset = self.ts_offset;
        self.rack.on_ack(
            now,
            una,
            &blocks[..n],
            tsecr,
            |t| timestamp_value(t, offset),
            self.rtt.min_rtt(),
        );
        let dsack = super::tlp::dsack_block(repr, ack).is_some();
        self.rack.on_dsack_info(dsack, una, self.snd_nxt);
    }

    /// RACK_detect_loss and the reorder timer (RFC 8985 §6.2 steps 5-6), after an ACK or
    /// at the timer's expiry; enters fast recovery on a new loss.
    pub(super) fn rack_detect(&mut self, now: Instant) {
        if !self.rack_active() || !self.state.is_synchronized() {
            return;
        }
        let in_recovery = self.in_recovery || self.snd_una.distance_from(self.recover) < 0;
        let reo_wnd = self.rack.reo_wnd(
            in_recovery,
            self.config.dup_ack_threshold.max(1),
            self.rtt.min_rtt(),
            self.rtt.srtt(),
        );
        let newly_lost = self.rack.detect_loss(now, reo_wnd);
        if newly_lost {
            trace!(?reo_wnd, "tcp: RACK marked segments lost");
        }
        if newly_lost
            && !self.in_recovery
            && self.snd_una != self.snd_max
            && self.snd_una.distance_from(self.recover) >= 0
        {
            self.enter_recovery(now);
        }
    }

    /// PRR (RFC 6937 §3): a new ACK reported `delivered` bytes; recompute this ACK's
    /// window. Also called at the entry of recovery with 0.
    pub(super) fn prr_update(&mut self, delivered: usize) {
        if !self.in_recovery || !self.prr_active() {
            return;
        }
        self.prr_delivered = self.prr_delivered.saturating_add(delivered);
        let pipe = self.sack_pipe();
        let ssthresh = self.cc.ssthresh();
        let smss = self.send_mss();
        let sndcnt = if pipe > ssthresh {
            // Proportional part: ceil(prr_delivered * ssthresh / RecoverFS) - prr_out.
            let fs = self.prr_recover_fs.max(1) as u128;
            let num = self.prr_delivered as u128 * ssthresh.min(1 << 40) as u128;
            let target = num.div_ceil(fs).min(usize::MAX as u128) as usize;
            target.saturating_sub(self.prr_out)
        } else {
            // Slow-start reduction bound (PRR-SSRB).
            let limit = self
                .prr_delivered
                .saturating_sub(self.prr_out)
                .max(delivered)
                .saturating_add(smss);
            (ssthresh - pipe).min(limit)
        };
        let sndcnt = if self.prr_out == 0 {
            sndcnt.max(smss)
        } else {
            sndcnt
        };
        self.prr_cwnd = Some(pipe.saturating_add(sndcnt));
        trace!(
            pipe,
            sndcnt,
            prr_delivered = self.prr_delivered,
            prr_out = self.prr_out,
            "tcp: PRR"
        );
    }

    /// PRR: recovery starts with nothing delivered or sent (RFC 6937 §3 "on entering
    /// recovery"); `flight` is RecoverFS.
    pub(super) fn prr_start(&mut self, flight: usize) {
        self.prr_delivered = 0;
        self.prr_out = 0;
        self.prr_recover_fs = flight;
        self.prr_cwnd = None;
        self.prr_update(0);
    }

    /// Undo detection on an acceptable ACK (see the module docs).
    pub(super) fn check_undo(&mut self, repr: &TcpRepr, ack: SeqNumber, advance: i32) {
        let Some(undo) = self.undo.as_mut() else {
            return;
        };
        let mut spurious = false;
        if let Some((left, right)) = super::tlp::dsack_block(repr, ack) {
            // The part of the D-SACK inside the episode's space.
            let lo = left.max(undo.start);
            let hi = right.min(undo.end);
            let dup = hi.distance_from(lo).max(0) as usize;
            if dup > 0 && undo.retransmitted {
                undo.retrans = undo.retrans.saturating_sub(dup);
                spurious = undo.retrans == 0;
            }
        }
        if let (Some(rtx_tsval), Some((_, tsecr)), true) = (
            undo.first_rtx_tsval,
            repr.options.timestamp,
            self.ts_enabled,
        ) {
            if advance > 0 && ack.distance_from(undo.start) > 0 {
                // RFC 3522 §3: only the first ACK for the retransmitted data decides.
                undo.first_rtx_tsval = None;
                if (tsecr.wrapping_sub(rtx_tsval) as i32) < 0 {
                    spurious = true;
                }
            }
        }
        if spurious {
            self.undo_recovery();
        }
    }

    /// Restores the congestion state saved when the (spurious) episode started.
    fn undo_recovery(&mut self) {
        let Some(undo) = self.undo.take() else {
            return;
        };
        trace!(
            prior_cwnd = undo.prior.window(),
            cwnd = self.cc.window(),
            "tcp: spurious recovery, undoing the window reduction"
        );
        if undo.prior.window() >= self.cc.window() {
            self.cc = undo.prior;
        }
        self.counters.spurious_recoveries_undone += 1;
        self.rack.note_reordering();
    }

    /// The reorder timer fired (RFC 8985 §6.3).
    pub(super) fn on_rack_timeout(&mut self, now: Instant) {
        trace!("tcp: RACK reorder timer expired");
        self.rack.stop_timer();
        self.rack_detect(now);
    }
}
