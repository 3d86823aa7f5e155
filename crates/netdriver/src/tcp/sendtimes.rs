//! Per-segment transmit times for µs-resolution RTT samples while timestamps are on.
//!
//! Our TSval ticks in milliseconds (RFC 7323 §5.4, see the connection module docs), far
//! too coarse for RTTs of tens of µs, so the timestamp echo no longer gives the RTT
//! (RFC 7323 §4 RTTM). Instead the sender remembers when each outstanding segment was
//! last sent, at [`Instant`]'s µs resolution, as Linux does with its per-skb send times.
//! An ACK that advances SND.UNA samples the segment that held SND.UNA: the oldest one it
//! newly covers, which is the one whose TSval a timestamp-echoing peer reflects
//! (RFC 7323 §4.3, TS.Recent is taken from the first segment after its last ACK), so the
//! samples are the ones RTTM would give, delayed-ACK time included.
//!
//! Karn's rule (RFC 6298 §3): a retransmitted segment's ACK may be for any transmission.
//! The timestamp echo disambiguates it (RFC 7323 §4.1) only when it equals the TSval of
//! the last transmission and the transmission before that carried a different TSval;
//! a retransmission in the same millisecond as the one before is ambiguous and gives
//! no sample.
//!
//! Bounded memory: at `max` records, new space is appended to the last record, which
//! keeps its older send time (the sample can only overestimate). Resending part of a
//! record counts as resending the whole record (no sample rather than a wrong one).

use std::collections::VecDeque;

use crate::tcp::SeqNumber;
use crate::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
struct Timed {
    start: SeqNumber,
    end: SeqNumber,
    /// The last transmission.
    xmit: Instant,
    /// The transmission before the last one, if it was resent.
    prev_xmit: Option<Instant>,
}

/// Transmit times of the outstanding sequence space (see the module docs).
#[derive(Debug, Clone)]
pub struct SendTimes {
    segs: VecDeque<Timed>,
    max: usize,
}

impl SendTimes {
    /// An empty log keeping at most about `max` records.
    pub fn new(max: usize) -> SendTimes {
        SendTimes {
            segs: VecDeque::new(),
            max: max.max(4),
        }
    }

    /// Changes the record bound (the send buffer was resized). Records beyond a lowered
    /// bound stay until acknowledged; new space then extends the last record.
    pub fn set_max(&mut self, max: usize) {
        self.max = max.max(4);
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.segs.clear();
    }

    /// Records the transmission of `[start, end)` at `now`.
    pub fn on_send(&mut self, start: SeqNumber, end: SeqNumber, now: Instant) {
        if end.distance_from(start) <= 0 {
            return;
        }
        let mut start = start;
        if let Some(top) = self.segs.back().map(|s| s.end) {
            if start.distance_from(top) < 0 {
                for s in self.segs.iter_mut() {
                    if s.end.distance_from(start) > 0 && s.start.distance_from(end) < 0 {
                        s.prev_xmit = Some(s.xmit);
                        s.xmit = now;
                    }
                }
                if end.distance_from(top) <= 0 {
                    return;
                }
                start = top;
            } else if start != top {
                // Not contiguous: the old history says nothing about this space.
                self.segs.clear();
            }
        }
        if self.segs.len() >= self.max {
            if let Some(last) = self.segs.back_mut() {
                last.end = end;
                return;
            }
        }
        self.segs.push_back(Timed {
            start,
            end,
            xmit: now,
            prev_xmit: None,
        });
    }

    /// A cumulative ACK moved SND.UNA from `una` to `ack` at `now`; `tsecr` is its
    /// timestamp echo and `tsval_of` turns a send time into the TSval it carried. Drops the
    /// acknowledged records and returns the RTT sample, if one is unambiguous.
    pub fn on_ack(
        &mut self,
        una: SeqNumber,
        ack: SeqNumber,
        now: Instant,
        tsecr: Option<u32>,
        tsval_of: impl Fn(Instant) -> u32,
    ) -> Option<Duration> {
        if ack.distance_from(una) <= 0 {
            return None;
        }
        let sample = self.segs.front().and_then(|s| {
            if s.start.distance_from(una) > 0 || s.end.distance_from(una) <= 0 {
                return None;
            }
            match s.prev_xmit {
                None => Some(now.saturating_duration_since(s.xmit)),
                Some(prev) => {
                    let last = tsval_of(s.xmit);
                    (tsecr == Some(last) && tsval_of(prev) != last)
                        .then(|| now.saturating_duration_since(s.xmit))
                }
            }
        });
        while let Some(front) = self.segs.front_mut() {
            if front.end.distance_from(ack) <= 0 {
                self.segs.pop_front();
            } else {
                if front.start.distance_from(ack) < 0 {
                    front.start = ack;
                }
                break;
            }
        }
        sample
    }

    /// Records kept (for tests of the bound).
    pub fn len(&self) -> usize {
        self.segs.len()
    }

    /// Whether no record is kept.
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u32) -> SeqNumber {
        SeqNumber(1000 + n)
    }

    fn us(n: u64) -> Instant {
        Instant::from_micros(1_000_000 + n)
    }

    fn ms_tick(t: Instant) -> u32 {
        t.total_millis() as u32
    }

    #[test]
    fn samples_the_oldest_newly_acknowledged_segment_in_micros() {
        let mut log = SendTimes::new(64);
        log.on_send(s(0), s(100), us(0));
        log.on_send(s(100), s(200), us(10));
        log.on_send(s(200), s(300), us(20));
        // A delayed ACK of the first two: the first one's send time counts (RTTM's choice).
        let rtt = log.on_ack(s(0), s(200), us(37), Some(1_000), ms_tick);
        assert_eq!(rtt, Some(Duration::from_micros(37)));
        assert_eq!(log.len(), 1);
        let rtt = log.on_ack(s(200), s(250), us(60), None, ms_tick);
        assert_eq!(rtt, Some(Duration::from_micros(40)));
        let rtt = log.on_ack(s(250), s(300), us(70), None, ms_tick);
        assert_eq!(rtt, Some(Duration::from_micros(50)));
        assert!(log.is_empty());
    }

    #[test]
    fn retransmissions_sample_only_when_the_echo_names_the_last_one() {
        let mut log = SendTimes::new(64);
        log.on_send(s(0), s(100), us(0));
        // Resent within the same millisecond: ambiguous whatever the echo.
        log.on_send(s(0), s(100), us(500));
        assert_eq!(log.on_ack(s(0), s(50), us(900), Some(1_000), ms_tick), None);
        // Resent 2 ms later: an echo of the retransmission's TSval decides.
        log.on_send(s(50), s(100), us(2_500));
        assert_eq!(
            log.on_ack(s(50), s(60), us(3_000), Some(1_000), ms_tick),
            None
        );
        log.on_send(s(60), s(100), us(4_100));
        assert_eq!(
            log.on_ack(s(60), s(100), us(4_137), Some(1_004), ms_tick),
            Some(Duration::from_micros(37))
        );
        // Without timestamps, never.
        log.on_send(s(100), s(200), us(5_000));
        log.on_send(s(100), s(200), us(9_000));
        assert_eq!(log.on_ack(s(100), s(200), us(9_100), None, ms_tick), None);
    }

    #[test]
    fn bounded_records_keep_the_older_send_time() {
        let mut log = SendTimes::new(4);
        for i in 0..10u32 {
            log.on_send(s(i * 10), s(i * 10 + 10), us(u64::from(i)));
        }
        assert_eq!(log.len(), 4);
        assert_eq!(
            log.on_ack(s(0), s(30), us(100), None, ms_tick),
            Some(Duration::from_micros(100))
        );
        // The last record covers 30..100 and was first sent at 3.
        assert_eq!(
            log.on_ack(s(30), s(100), us(100), None, ms_tick),
            Some(Duration::from_micros(97))
        );
        assert!(log.is_empty());
    }
}
