//! RACK loss detection (RFC 8985 §6): time-based loss marking from per-segment transmit
//! times.
//!
//! The sender remembers, for every segment in `[SND.UNA, SND.MAX)`, when it was last sent.
//! Each ACK reports which segments were delivered (cumulatively or by SACK); the most
//! recently *sent* of them gives `RACK.xmit_ts`, `RACK.end_seq` and `RACK.rtt`
//! (§6.2 step 1). A segment sent before it that is still unacknowledged is deemed lost once
//! `xmit_ts + RACK.rtt + RACK.reo_wnd <= now` (§6.2 step 5); until then the reorder timer
//! waits for the remaining time (§6.2 step 6, §6.3).
//!
//! What is implemented:
//! - §6.2 step 1 (`RACK_update`): a retransmitted segment whose ACK echoes a TSval older
//!   than its last transmission, or that was acknowledged sooner than min_RTT after it, is
//!   ambiguous and does not update RACK. (TSvals tick in ms: a retransmission in the
//!   millisecond of the previous transmission is told apart by the min_RTT rule only.)
//! - §6.2 step 2 (`RACK_detect_reordering`): a never-retransmitted segment delivered below
//!   RACK.fack means the path reorders.
//! - §6.2 step 4 (`RACK_update_reo_wnd`): `reo_wnd = min(reo_wnd_mult · min_RTT / 4,
//!   SRTT)`, 0 while no reordering was seen and the sender is in recovery or at least
//!   DupThresh segments are SACKed; a D-SACK (once per round trip, `dsack_round`) raises
//!   `reo_wnd_mult` and keeps it for 16 recoveries (`reo_wnd_persist`).
//! - §6.2 step 5/6 (`RACK_detect_loss`, reorder timer) and §6.3 (the timer's expiry runs
//!   detection again).
//! - A lost segment whose retransmission is again older than RACK allows is marked lost
//!   once more (its retransmission was lost), so it is resent without waiting for the RTO.
//!
//! Bounded memory: the record list is capped (about twice the send buffer in segments);
//! at the cap records are not split any more and new ones merge with compatible
//! neighbours. A SACK that would need a split at the cap is not recorded here, which is
//! safe: it can only delay loss marking, never hide a loss from the RTO. The record list
//! only grows from our own transmissions; SACK input (any values) only splits records
//! within that cap.

use std::collections::VecDeque;

use crate::tcp::SeqNumber;
use crate::time::{Duration, Instant};

/// RFC 8985 §6.2 step 4: D-SACK-widened reordering windows persist for 16 recoveries.
const REO_WND_PERSIST: u32 = 16;

/// The largest `reo_wnd_mult` (the window is capped by SRTT anyway).
const MAX_REO_WND_MULT: u32 = 64;

/// One transmitted segment (or a merge of adjacent ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sent {
    start: SeqNumber,
    end: SeqNumber,
    /// When it was last (re)transmitted.
    xmit: Instant,
    /// Sent more than once (ambiguous ACKs, §6.2 step 1).
    retransmitted: bool,
    /// Deemed lost (by RACK, or by an RTO).
    lost: bool,
    /// A retransmission is in flight since it was last deemed lost (or it was resent
    /// without being deemed lost).
    rtx_in_flight: bool,
    /// Selectively acknowledged.
    sacked: bool,
}

impl Sent {
    fn len(&self) -> usize {
        self.end.distance_from(self.start).max(0) as usize
    }

    fn same_flags(&self, other: &Sent) -> bool {
        self.lost == other.lost
            && self.rtx_in_flight == other.rtx_in_flight
            && self.sacked == other.sacked
    }
}

/// `RACK_sent_after(t1, seq1, t2, seq2)` (§6.2): whether the first segment was sent after
/// the second, sequence order breaking ties of equal transmit times.
fn sent_after(t1: Instant, seq1: SeqNumber, t2: Instant, seq2: SeqNumber) -> bool {
    t1 > t2 || (t1 == t2 && seq1.distance_from(seq2) > 0)
}

/// RACK's per-connection state and the transmit-time records it works on.
#[derive(Debug, Clone)]
pub struct Rack {
    segs: VecDeque<Sent>,
    max_segs: usize,
    /// RACK.xmit_ts and RACK.end_seq: the most recently sent segment delivered so far.
    xmit_ts: Option<Instant>,
    end_seq: SeqNumber,
    /// RACK.rtt: the RTT of that segment.
    rtt: Duration,
    /// RACK.fack: the highest end sequence delivered.
    fack: Option<SeqNumber>,
    reordering_seen: bool,
    reo_wnd_mult: u32,
    reo_wnd_persist: u32,
    dsack_round: Option<SeqNumber>,
    /// The reorder timer.
    deadline: Option<Instant>,
}

impl Rack {
    /// Empty state that keeps about `max_segs` transmit records.
    pub fn new(max_segs: usize) -> Rack {
        Rack {
            segs: VecDeque::new(),
            max_segs: max_segs.max(8),
            xmit_ts: None,
            end_seq: SeqNumber(0),
            rtt: Duration::ZERO,
            fack: None,
            reordering_seen: false,
            reo_wnd_mult: 1,
            reo_wnd_persist: 0,
            dsack_round: None,
            deadline: None,
        }
    }

    /// Changes the record bound (the send buffer was resized). Records beyond a lowered
    /// bound stay until acknowledged.
    pub fn set_max_segs(&mut self, max_segs: usize) {
        self.max_segs = max_segs.max(8);
    }

    /// Records the transmission of `[start, end)` at `now`: new sequence space gets a new
    /// record, resent space has its records' transmit time moved to `now` and is marked
    /// as retransmitted.
    pub fn on_send(&mut self, start: SeqNumber, end: SeqNumber, now: Instant) {
        if end.distance_from(start) <= 0 {
            return;
        }
        let mut start = start;
        if let Some(top) = self.segs.back().map(|s| s.end) {
            if start.distance_from(top) < 0 {
                let re_end = end.min(top);
                self.split_at(start);
                self.split_at(re_end);
                for s in self.segs.iter_mut() {
                    if s.end.distance_from(start) > 0 && s.start.distance_from(re_end) < 0 {
                        s.xmit = now;
                        s.retransmitted = true;
                        s.rtx_in_flight = true;
                    }
                }
                if end.distance_from(top) <= 0 {
                    return;
                }
                start = top;
            } else if start != top {
                // Not contiguous (cannot happen while records track SND.UNA..SND.MAX):
                // the old history says nothing about this space any more.
                self.segs.clear();
            }
        }
        let new = Sent {
            start,
            end,
            xmit: now,
            retransmitted: false,
            lost: false,
            rtx_in_flight: false,
            sacked: false,
        };
        if self.segs.len() >= self.max_segs {
            if let Some(last) = self.segs.back_mut() {
                if last.same_flags(&new) && !last.retransmitted && last.end == start {
                    last.end = end;
                    last.xmit = now;
                    return;
                }
            }
            self.merge_one();
        }
        self.segs.push_back(new);
    }

    /// At the cap: merges the highest pair of adjacent records with the same state (the
    /// later transmit time wins, which can only delay a loss verdict).
    fn merge_one(&mut self) {
        for i in (1..self.segs.len()).rev() {
            let (a, b) = (self.segs[i - 1], self.segs[i]);
            if a.same_flags(&b) && a.end == b.start {
                self.segs[i - 1] = Sent {
                    end: b.end,
                    xmit: a.xmit.max(b.xmit),
                    retransmitted: a.retransmitted || b.retransmitted,
                    ..a
                };
                self.segs.remove(i);
                return;
            }
        }
    }

    /// Splits the record containing `seq` so that a record starts at it. Refused at the
    /// cap (returns false).
    fn split_at(&mut self, seq: SeqNumber) -> bool {
        let i = self.segs.partition_point(|s| s.end.distance_from(seq) <= 0);
        let Some(s) = self.segs.get(i).copied() else {
            return true;
        };
        if s.start.distance_from(seq) >= 0 {
            return true;
        }
        if self.segs.len() >= self.max_segs {
            return false;
        }
        self.segs[i].end = seq;
        self.segs.insert(i + 1, Sent { start: seq, ..s });
        true
    }

    /// Processes the delivery information of one ACK (§6.2 steps 1 and 2): everything
    /// below `una` is cumulatively acknowledged, and `blocks` (valid SACK ranges, already
    /// clipped to the outstanding space) are SACKed. `tsecr` is the ACK's timestamp echo
    /// when timestamps are on; `tsval_of` turns a transmit time into the TSval it carried.
    pub fn on_ack(
        &mut self,
        now: Instant,
        una: SeqNumber,
        blocks: &[(SeqNumber, SeqNumber)],
        tsecr: Option<u32>,
        tsval_of: impl Fn(Instant) -> u32,
        min_rtt: Option<Duration>,
    ) {
        while let Some(front) = self.segs.front().copied() {
            if front.end.distance_from(una) <= 0 {
                self.segs.pop_front();
                if !front.sacked {
                    self.delivered(&front, now, tsecr, &tsval_of, min_rtt);
                }
            } else {
                if front.start.distance_from(una) < 0 {
                    if let Some(f) = self.segs.front_mut() {
                        f.start = una;
                    }
                    if !front.sacked {
                        self.delivered(&front, now, tsecr, &tsval_of, min_rtt);
                    }
                }
                break;
            }
        }
        let mut sorted = [(SeqNumber(0), SeqNumber(0)); 4];
        let n = blocks.len().min(4);
        sorted[..n].copy_from_slice(&blocks[..n]);
        let sorted = &mut sorted[..n];
        // Ascending, so that delivery order within one ACK is not taken for reordering.
        sorted.sort_by_key(|b| b.0.distance_from(una));
        for &(left, right) in sorted.iter() {
            if right.distance_from(left) <= 0 {
                continue;
            }
            self.split_at(left);
            self.split_at(right);
            let lo = self
                .segs
                .partition_point(|s| s.end.distance_from(left) <= 0);
            for i in lo..self.segs.len() {
                let s = self.segs[i];
                if s.start.distance_from(right) >= 0 {
                    break;
                }
                let inside = s.start.distance_from(left) >= 0 && s.end.distance_from(right) <= 0;
                if !inside || s.sacked {
                    continue;
                }
                self.segs[i].sacked = true;
                self.segs[i].lost = false;
                self.segs[i].rtx_in_flight = false;
                self.delivered(&s, now, tsecr, &tsval_of, min_rtt);
            }
        }
    }

    /// `RACK_update` and `RACK_detect_reordering` for one newly delivered segment.
    fn delivered(
        &mut self,
        s: &Sent,
        now: Instant,
        tsecr: Option<u32>,
        tsval_of: &dyn Fn(Instant) -> u32,
        min_rtt: Option<Duration>,
    ) {
        // Step 2: reordering.
        match self.fack {
            Some(fack) if s.end.distance_from(fack) < 0 => {
                if !s.retransmitted {
                    self.reordering_seen = true;
                }
            }
            _ => self.fack = Some(s.end),
        }
        // Step 1: an ACK that may be for an earlier transmission says nothing.
        let rtt = now.saturating_duration_since(s.xmit);
        if s.retransmitted {
            if let Some(ecr) = tsecr {
                if (ecr.wrapping_sub(tsval_of(s.xmit)) as i32) < 0 {
                    return;
                }
            }
            if min_rtt.is_some_and(|m| rtt < m) {
                return;
            }
        }
        let newer = match self.xmit_ts {
            None => true,
            Some(t) => sent_after(s.xmit, s.end, t, self.end_seq),
        };
        if newer {
            self.xmit_ts = Some(s.xmit);
            self.end_seq = s.end;
            self.rtt = rtt;
        }
    }

    /// §6.2 step 4, D-SACK part: a D-SACK in this ACK (`dsack`) widens the reordering
    /// window, at most once per round trip.
    pub fn on_dsack_info(&mut self, dsack: bool, snd_una: SeqNumber, snd_nxt: SeqNumber) {
        if let Some(round) = self.dsack_round {
            if snd_una.distance_from(round) >= 0 {
                self.dsack_round = None;
            }
        }
        if dsack && self.dsack_round.is_none() {
            self.dsack_round = Some(snd_nxt);
            self.reo_wnd_mult = (self.reo_wnd_mult + 1).min(MAX_REO_WND_MULT);
            self.reo_wnd_persist = REO_WND_PERSIST;
        }
    }

    /// §6.2 step 4: leaving fast or RTO recovery ages a widened reordering window.
    pub fn on_recovery_exit(&mut self) {
        self.reo_wnd_persist = self.reo_wnd_persist.saturating_sub(1);
        if self.reo_wnd_persist == 0 {
            self.reo_wnd_mult = 1;
        }
    }

    /// Reordering is known to happen on this path (a spurious retransmission shows it too).
    pub fn note_reordering(&mut self) {
        self.reordering_seen = true;
    }

    /// RACK.reo_wnd (§6.2 step 4).
    pub fn reo_wnd(
        &self,
        in_recovery: bool,
        dup_thresh: usize,
        min_rtt: Option<Duration>,
        srtt: Option<Duration>,
    ) -> Duration {
        if !self.reordering_seen && (in_recovery || self.sacked_segments() >= dup_thresh) {
            return Duration::ZERO;
        }
        let wnd = min_rtt
            .unwrap_or(Duration::ZERO)
            .saturating_mul(self.reo_wnd_mult)
            / 4;
        match srtt {
            Some(srtt) => wnd.min(srtt),
            None => wnd,
        }
    }

    /// `RACK_detect_loss` (§6.2 step 5) and the reorder timer (step 6). Returns whether a
    /// segment was newly deemed lost.
    pub fn detect_loss(&mut self, now: Instant, reo_wnd: Duration) -> bool {
        self.deadline = None;
        let Some(rack_xmit) = self.xmit_ts else {
            return false;
        };
        let mut newly = false;
        let mut wait = None;
        for s in self.segs.iter_mut() {
            if s.sacked || (s.lost && !s.rtx_in_flight) {
                continue;
            }
            if !sent_after(rack_xmit, self.end_seq, s.xmit, s.end) {
                continue;
            }
            let expiry = s.xmit + self.rtt + reo_wnd;
            if expiry <= now {
                s.lost = true;
                s.rtx_in_flight = false;
                newly = true;
            } else {
                let remaining = expiry.saturating_duration_since(now);
                wait = Some(wait.map_or(remaining, |w: Duration| w.max(remaining)));
            }
        }
        self.deadline = wait.map(|w| now + w);
        newly
    }

    /// The reorder timer's deadline, if armed.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Stops the reorder timer.
    pub fn stop_timer(&mut self) {
        self.deadline = None;
    }

    /// An RTO: everything outstanding and not SACKed is lost, and SACK information is
    /// forgotten along with the scoreboard's (RFC 6675 §5.1). The go-back-N resend
    /// follows.
    pub fn on_rto(&mut self) {
        for s in self.segs.iter_mut() {
            s.sacked = false;
            s.lost = true;
            s.rtx_in_flight = false;
        }
        self.deadline = None;
    }

    /// Whether any outstanding segment is deemed lost and not yet resent.
    pub fn has_lost(&self) -> bool {
        self.segs
            .iter()
            .any(|s| s.lost && !s.rtx_in_flight && !s.sacked)
    }

    /// The lowest segment deemed lost and not resent since: NextSeg rule 1 under RACK.
    pub fn next_lost(&self) -> Option<(SeqNumber, SeqNumber)> {
        self.segs
            .iter()
            .find(|s| s.lost && !s.rtx_in_flight && !s.sacked)
            .map(|s| (s.start, s.end))
    }

    /// Whether the byte `seq` lies in a segment deemed lost.
    pub fn is_lost(&self, seq: SeqNumber) -> bool {
        self.segs
            .iter()
            .any(|s| s.lost && !s.sacked && seq.in_window(s.start, s.len() as u32))
    }

    /// RFC 6675 SetPipe with RACK's loss marks: un-SACKed bytes not deemed lost, plus
    /// bytes whose retransmission is in flight. Space not covered by records (beyond the
    /// last one, up to `snd_max`) counts as in flight.
    pub fn pipe(&self, snd_max: SeqNumber) -> usize {
        let mut pipe = 0usize;
        for s in &self.segs {
            if s.sacked {
                continue;
            }
            if !s.lost {
                pipe = pipe.saturating_add(s.len());
            }
            if s.rtx_in_flight {
                pipe = pipe.saturating_add(s.len());
            }
        }
        if let Some(top) = self.segs.back().map(|s| s.end) {
            pipe = pipe.saturating_add(snd_max.distance_from(top).max(0) as usize);
        }
        pipe
    }

    /// SACKed records (RACK.segs_sacked).
    pub fn sacked_segments(&self) -> usize {
        self.segs.iter().filter(|s| s.sacked).count()
    }

    /// Whether reordering was detected (§6.2 step 2).
    pub fn reordering_seen(&self) -> bool {
        self.reordering_seen
    }

    /// The current D-SACK multiplier of the reordering window.
    pub fn reo_wnd_mult(&self) -> u32 {
        self.reo_wnd_mult
    }

    /// RACK.rtt, once a delivery was seen.
    pub fn rtt(&self) -> Option<Duration> {
        self.xmit_ts.map(|_| self.rtt)
    }

    /// Number of transmit records held (bounded).
    pub fn record_count(&self) -> usize {
        self.segs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: SeqNumber = SeqNumber(u32::MAX - 2500);

    fn s(off: usize) -> SeqNumber {
        BASE + off
    }

    fn t(ms: u64) -> Instant {
        Instant::from_millis(1000 + ms)
    }

    /// Our TSval clock: milliseconds.
    fn tsval(i: Instant) -> u32 {
        i.total_millis() as u32
    }

    /// Ten 1000-byte segments sent at t(0).
    fn ten() -> Rack {
        let mut r = Rack::new(64);
        for i in 0..10 {
            r.on_send(s(i * 1000), s(i * 1000 + 1000), t(0));
        }
        r
    }

    #[test]
    fn loss_marked_only_after_rtt_plus_reo_wnd() {
        let mut r = ten();
        r.on_ack(
            t(10),
            s(0),
            &[(s(1000), s(2000))],
            None,
            tsval,
            Some(Duration::from_millis(10)),
        );
        assert_eq!(r.rtt(), Some(Duration::from_millis(10)));
        let reo = r.reo_wnd(false, 3, Some(Duration::from_millis(10)), None);
        assert_eq!(reo, Duration::from_micros(2500));
        assert!(!r.detect_loss(t(10), reo));
        assert_eq!(r.deadline(), Some(t(10) + Duration::from_micros(2500)));
        assert!(r.detect_loss(t(10) + Duration::from_micros(2500), reo));
        assert_eq!(r.next_lost(), Some((s(0), s(1000))));
        assert!(r.is_lost(s(999)) && !r.is_lost(s(1000)) && !r.is_lost(s(2000)));
        // Segments sent after the delivered one are never judged by it.
        assert_eq!(r.deadline(), None);
        // pipe: 8 segments in flight (0 lost, 1 SACKed).
        assert_eq!(r.pipe(s(10_000)), 8000);
    }

    #[test]
    fn reo_wnd_zero_in_recovery_or_with_dupthresh_sacked_unless_reordering_seen() {
        let mut r = ten();
        let m = Some(Duration::from_millis(8));
        r.on_ack(t(10), s(0), &[(s(1000), s(4000))], None, tsval, m);
        assert_eq!(r.sacked_segments(), 3);
        assert_eq!(r.reo_wnd(false, 3, m, None), Duration::ZERO);
        assert_eq!(r.reo_wnd(false, 4, m, None), Duration::from_millis(2));
        assert_eq!(r.reo_wnd(true, 4, m, None), Duration::ZERO);
        // A late original below the highest delivered: reordering.
        r.on_ack(t(11), s(0), &[(s(0), s(1000))], None, tsval, m);
        assert!(r.reordering_seen());
        assert_eq!(r.reo_wnd(true, 3, m, None), Duration::from_millis(2));
        // SRTT caps it.
        assert_eq!(
            r.reo_wnd(true, 3, m, Some(Duration::from_millis(1))),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn dsack_widens_once_per_round_and_persists_sixteen_recoveries() {
        let mut r = ten();
        r.on_dsack_info(true, s(0), s(10_000));
        assert_eq!(r.reo_wnd_mult(), 2);
        r.on_dsack_info(true, s(5000), s(10_000));
        assert_eq!(r.reo_wnd_mult(), 2, "same round");
        r.on_dsack_info(true, s(10_000), s(12_000));
        assert_eq!(r.reo_wnd_mult(), 3);
        for _ in 0..15 {
            r.on_recovery_exit();
        }
        assert_eq!(r.reo_wnd_mult(), 3);
        r.on_recovery_exit();
        assert_eq!(r.reo_wnd_mult(), 1);
    }

    #[test]
    fn lost_retransmission_is_marked_again() {
        let mut r = ten();
        r.on_ack(t(10), s(0), &[(s(1000), s(4000))], None, tsval, None);
        assert!(r.detect_loss(t(10), Duration::ZERO));
        assert_eq!(r.next_lost(), Some((s(0), s(1000))));
        r.on_send(s(0), s(1000), t(10));
        assert_eq!(r.next_lost(), None);
        assert_eq!(r.pipe(s(10_000)), 7000);
        // Later segments delivered 10 ms after the retransmission: it is lost too.
        r.on_send(s(10_000), s(11_000), t(12));
        r.on_ack(
            t(22),
            s(0),
            &[(s(1000), s(4000)), (s(10_000), s(11_000))],
            None,
            tsval,
            None,
        );
        assert!(r.detect_loss(t(22), Duration::ZERO));
        assert_eq!(r.next_lost(), Some((s(0), s(1000))));
    }

    #[test]
    fn ambiguous_retransmission_ack_does_not_update() {
        let mut r = ten();
        r.on_send(s(0), s(1000), t(50));
        // ACK 1 ms after the retransmission, echoing the original's TSval: ambiguous.
        r.on_ack(
            t(51),
            s(1000),
            &[],
            Some(tsval(t(0))),
            tsval,
            Some(Duration::from_millis(10)),
        );
        assert_eq!(r.rtt(), None);
        // Without timestamps, quicker than min_RTT is just as ambiguous.
        let mut r = ten();
        r.on_send(s(0), s(1000), t(50));
        r.on_ack(
            t(51),
            s(1000),
            &[],
            None,
            tsval,
            Some(Duration::from_millis(10)),
        );
        assert_eq!(r.rtt(), None);
        r.on_ack(
            t(60),
            s(2000),
            &[],
            None,
            tsval,
            Some(Duration::from_millis(10)),
        );
        assert_eq!(r.rtt(), Some(Duration::from_millis(60)));
    }

    #[test]
    fn cumulative_ack_trims_and_partial_sacks_split() {
        let mut r = ten();
        r.on_ack(t(5), s(1500), &[(s(2500), s(3200))], None, tsval, None);
        assert_eq!(r.pipe(s(10_000)), 8500 - 700);
        // The block spans two records: both parts are recorded, split at its edges.
        assert_eq!(r.sacked_segments(), 2);
        // Bogus blocks (reversed, outside) change nothing and do not panic.
        r.on_ack(
            t(6),
            s(1500),
            &[(s(9000), s(8000)), (s(20_000), s(30_000))],
            None,
            tsval,
            None,
        );
        assert_eq!(r.pipe(s(10_000)), 7800);
    }

    #[test]
    fn records_stay_bounded() {
        let mut r = Rack::new(8);
        for i in 0..1000 {
            r.on_send(s(i), s(i + 1), t(i as u64));
        }
        assert!(r.record_count() <= 9, "{}", r.record_count());
        // SACK spray of one-byte blocks: no growth beyond the cap.
        for i in 0..500 {
            r.on_ack(
                t(2000),
                s(0),
                &[(s(2 * i), s(2 * i + 1))],
                None,
                tsval,
                None,
            );
            assert!(r.record_count() <= 9);
        }
        assert_eq!(
            r.pipe(s(1000))
                + r.segs
                    .iter()
                    .filter(|x| x.sacked)
                    .map(|x| x.len())
                    .sum::<usize>(),
            1000
        );
    }

    #[test]
    fn rto_marks_everything_lost() {
        let mut r = ten();
        r.on_ack(t(10), s(0), &[(s(5000), s(6000))], None, tsval, None);
        r.on_rto();
        assert_eq!(r.pipe(s(10_000)), 0);
        assert_eq!(r.next_lost(), Some((s(0), s(1000))));
        assert_eq!(r.sacked_segments(), 0);
    }
}
