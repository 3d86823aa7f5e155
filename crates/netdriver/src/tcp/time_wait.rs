//! TIME-WAIT without a connection (RFC 9293 §3.10.7.4, TIME-WAIT state; RFC 6191; RFC
//! 1337): what a connection that closed first keeps for 2×MSL once everything else is
//! done, a few dozen bytes in place of a whole [`Connection`](super::Connection).
//!
//! A server that closes first (HTTP/1.0, connection-per-request protocols) holds one
//! TIME-WAIT per connection for [`Config::time_wait`] (60 s by default). Kept as full
//! connections, they filled the interface's connection table (a server at 1,000
//! connections/s holds 60,000 of them), made every round walk them, and kept their
//! channels' queues allocated. A [`TimeWait`] record holds only what the state still
//! does:
//!
//! - acknowledge a retransmitted FIN (the peer lost our last ACK) and restart 2×MSL
//!   (§3.10.7.4, eighth step);
//! - acknowledge anything else that carries data or a FIN; ignore bare ACKs;
//! - ignore RSTs (RFC 1337: no TIME-WAIT assassination);
//! - let a new SYN of the same 4-tuple end it early when its timestamp (or, without
//!   timestamps, its sequence number) shows a new incarnation (RFC 6191), and answer any
//!   other SYN with a rate-limited challenge ACK (RFC 5961 §4).
//!
//! [`TimeWaitTable`] keeps the records of an interface, bounded (the oldest is dropped
//! when a new one finds the table full, counted), and expires them in order. Nothing here
//! reads a clock.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;
use std::time::Duration;

use crate::time::Instant;
use crate::wire::{TcpFlags, TcpOptions, TcpRepr};

use super::SeqNumber;

/// A connection's `(local, remote)` addresses.
type Tuple = (SocketAddrV4, SocketAddrV4);

/// The timestamp state a TIME-WAIT keeps (RFC 7323): the peer's last TSval and the offset
/// of our own clock for this 4-tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWaitTimestamps {
    /// TS.Recent: the peer's last TSval.
    pub recent: u32,
    /// Added to our millisecond clock for the TSvals we send.
    pub offset: u32,
}

/// What remains of a connection in TIME-WAIT. Made by
/// [`Connection::time_wait`](super::Connection::time_wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWait {
    /// Our address.
    pub local: SocketAddrV4,
    /// The peer's address.
    pub remote: SocketAddrV4,
    /// SND.NXT: one past our FIN.
    pub snd_nxt: SeqNumber,
    /// RCV.NXT: one past the peer's FIN.
    pub rcv_nxt: SeqNumber,
    /// The window field our ACKs carry (scaled as the connection's were).
    pub window: u16,
    /// Timestamps, when the connection used them.
    pub timestamps: Option<TimeWaitTimestamps>,
    /// When the state ends (2×MSL after it began or was last restarted).
    pub expires: Instant,
    /// When we last sent an ACK not asked for by a FIN or data (a challenge ACK to a
    /// SYN), for the rate limit.
    pub last_challenge: Option<Instant>,
}

/// What a segment for a [`TimeWait`] leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeWaitInput {
    /// A SYN of a new incarnation (RFC 6191): the record is to go, and the SYN to be
    /// treated as if it had found nothing.
    Reopen,
    /// Send this ACK.
    Answer(TcpRepr),
    /// Nothing to do.
    Ignore,
}

impl TimeWait {
    /// RFC 6191: whether a SYN ends this TIME-WAIT. With timestamps, its TSval must be
    /// newer than TS.Recent; without them (or if the SYN carries none) its sequence
    /// number must lie beyond RCV.NXT (RFC 1122 §4.2.2.13). The same rule as
    /// [`Connection::accepts_new_syn_in_time_wait`](super::Connection::accepts_new_syn_in_time_wait).
    pub fn accepts_new_syn(&self, syn: &TcpRepr) -> bool {
        if !syn.flags.syn() || syn.flags.rst() || syn.ack.is_some() {
            return false;
        }
        match (self.timestamps, syn.options.timestamp) {
            (Some(ts), Some((tsval, _))) => (tsval.wrapping_sub(ts.recent) as i32) > 0,
            _ => syn.seq.distance_from(self.rcv_nxt) > 0,
        }
    }

    /// Processes a segment of this 4-tuple at `now`, with `payload_len` bytes of payload.
    /// `time_wait` is the 2×MSL a retransmitted FIN restarts; `challenge_interval` the
    /// least time between two challenge ACKs.
    pub fn on_segment(
        &mut self,
        now: Instant,
        repr: &TcpRepr,
        payload_len: usize,
        time_wait: Duration,
        challenge_interval: Duration,
    ) -> TimeWaitInput {
        let flags = repr.flags;
        if flags.rst() {
            // RFC 1337.
            return TimeWaitInput::Ignore;
        }
        if flags.syn() {
            if self.accepts_new_syn(repr) {
                return TimeWaitInput::Reopen;
            }
            // RFC 5961 §4: any other SYN gets a (rate-limited) challenge ACK.
            if self
                .last_challenge
                .is_some_and(|t| now.saturating_duration_since(t) < challenge_interval)
            {
                return TimeWaitInput::Ignore;
            }
            self.last_challenge = Some(now);
            return TimeWaitInput::Answer(self.ack(now));
        }
        // RFC 7323 §4.3 holds here too: a retransmitted FIN refreshes TS.Recent, which
        // RFC 6191 then compares a new SYN against.
        if let (Some(ts), Some((tsval, _))) = (self.timestamps.as_mut(), repr.options.timestamp) {
            if (tsval.wrapping_sub(ts.recent) as i32) >= 0
                && repr.seq.distance_from(self.rcv_nxt) <= 0
            {
                ts.recent = tsval;
            }
        }
        if flags.fin() {
            if repr.seq + payload_len + 1 == self.rcv_nxt {
                // The peer did not get our ACK of its FIN: 2×MSL again (§3.10.7.4).
                self.expires = now + time_wait;
            }
            return TimeWaitInput::Answer(self.ack(now));
        }
        if payload_len > 0 {
            return TimeWaitInput::Answer(self.ack(now));
        }
        TimeWaitInput::Ignore
    }

    /// The ACK this state sends: SND.NXT, RCV.NXT, the kept window and timestamps.
    pub fn ack(&self, now: Instant) -> TcpRepr {
        TcpRepr {
            src_port: self.local.port(),
            dst_port: self.remote.port(),
            seq: self.snd_nxt,
            ack: Some(self.rcv_nxt),
            flags: TcpFlags::ACK,
            window: self.window,
            urgent: 0,
            options: TcpOptions {
                timestamp: self.timestamps.map(|ts| {
                    (
                        (now.total_millis() as u32).wrapping_add(ts.offset),
                        ts.recent,
                    )
                }),
                ..TcpOptions::default()
            },
        }
    }
}

/// An interface's TIME-WAIT records: at most `capacity`, found by 4-tuple, expired in
/// the order they end.
#[derive(Debug, Default)]
pub struct TimeWaitTable {
    /// Keyed by peer-chosen 4-tuples: SipHash.
    map: HashMap<Tuple, TimeWait>,
    /// `(expires, tuple)` in non-decreasing order of `expires` (every record ends a fixed
    /// time after now, and restarting pushes it again: the older entry is then stale and
    /// skipped, as is one whose record went).
    order: VecDeque<(Instant, Tuple)>,
    capacity: usize,
    evicted: u64,
}

impl TimeWaitTable {
    /// A table of at most `capacity` records (0 keeps none).
    pub fn new(capacity: usize) -> TimeWaitTable {
        TimeWaitTable {
            capacity,
            ..TimeWaitTable::default()
        }
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Records dropped before their end to make room for newer ones.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Keeps `tw`, dropping the record that ends first if the table is full.
    pub fn insert(&mut self, tw: TimeWait) {
        if self.capacity == 0 {
            self.evicted += 1;
            return;
        }
        let key = (tw.local, tw.remote);
        if !self.map.contains_key(&key) {
            while self.map.len() >= self.capacity {
                let Some((at, old)) = self.order.pop_front() else {
                    break;
                };
                if self.map.get(&old).is_some_and(|r| r.expires == at) {
                    self.map.remove(&old);
                    self.evicted += 1;
                }
            }
        }
        self.order.push_back((tw.expires, key));
        self.map.insert(key, tw);
        self.compact_order();
    }

    /// The record of `(local, remote)`.
    pub fn get(&self, local: SocketAddrV4, remote: SocketAddrV4) -> Option<&TimeWait> {
        self.map.get(&(local, remote))
    }

    /// Feeds a segment to the record of `(local, remote)`, if there is one (see
    /// [`TimeWait::on_segment`]); a SYN that reopens the 4-tuple removes the record.
    #[allow(clippy::too_many_arguments)]
    pub fn on_segment(
        &mut self,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        now: Instant,
        repr: &TcpRepr,
        payload_len: usize,
        time_wait: Duration,
        challenge_interval: Duration,
    ) -> Option<TimeWaitInput> {
        let key = (local, remote);
        let tw = self.map.get_mut(&key)?;
        let before = tw.expires;
        let input = tw.on_segment(now, repr, payload_len, time_wait, challenge_interval);
        let after = tw.expires;
        match input {
            TimeWaitInput::Reopen => {
                self.map.remove(&key);
            }
            _ if after != before => {
                self.order.push_back((after, key));
                self.compact_order();
            }
            _ => {}
        }
        Some(input)
    }

    /// Forgets the records that ended by `now`; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some(&(at, key)) = self.order.front() {
            if at > now {
                break;
            }
            self.order.pop_front();
            if self.map.get(&key).is_some_and(|r| r.expires == at) {
                self.map.remove(&key);
                n += 1;
            }
        }
        n
    }

    /// When the next record may end (possibly earlier than any does: a restarted
    /// record's old entry), or `None` when none is held.
    pub fn next_expiry(&self) -> Option<Instant> {
        if self.map.is_empty() {
            return None;
        }
        self.order.front().map(|&(at, _)| at)
    }

    /// Drops stale entries of `order` once they outnumber the records (a peer that keeps
    /// retransmitting its FIN pushes one per restart), so that it stays within twice the
    /// table's size.
    fn compact_order(&mut self) {
        if self.order.len() <= 2 * self.map.len() + 16 {
            return;
        }
        let map = &self.map;
        self.order
            .retain(|(at, key)| map.get(key).is_some_and(|r| r.expires == *at));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const T0: Instant = Instant::from_millis(1_000);
    const TW: Duration = Duration::from_secs(60);
    const CHALLENGE: Duration = Duration::from_millis(500);

    fn addr(port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), port)
    }

    fn record(port: u16, expires: Instant, ts: bool) -> TimeWait {
        TimeWait {
            local: addr(80),
            remote: addr(port),
            snd_nxt: SeqNumber(5001),
            rcv_nxt: SeqNumber(9001),
            window: 512,
            timestamps: ts.then_some(TimeWaitTimestamps {
                recent: 700,
                offset: 10,
            }),
            expires,
            last_challenge: None,
        }
    }

    fn seg(seq: u32, flags: TcpFlags, ack: bool, tsval: Option<u32>) -> TcpRepr {
        TcpRepr {
            src_port: 4000,
            dst_port: 80,
            seq: SeqNumber(seq),
            ack: ack.then_some(SeqNumber(5001)),
            flags,
            window: 100,
            urgent: 0,
            options: TcpOptions {
                timestamp: tsval.map(|v| (v, 0)),
                ..TcpOptions::default()
            },
        }
    }

    #[test]
    fn a_retransmitted_fin_is_acknowledged_and_restarts_two_msl() {
        let mut tw = record(4000, T0 + TW, true);
        let later = T0 + Duration::from_secs(5);
        let fin = seg(9000, TcpFlags::FIN, true, Some(800));
        let TimeWaitInput::Answer(ack) = tw.on_segment(later, &fin, 0, TW, CHALLENGE) else {
            panic!("no ACK");
        };
        assert_eq!(ack.seq, SeqNumber(5001));
        assert_eq!(ack.ack, Some(SeqNumber(9001)));
        assert_eq!(ack.flags, TcpFlags::ACK);
        assert_eq!(ack.window, 512);
        assert_eq!((ack.src_port, ack.dst_port), (80, 4000));
        // TSval: our clock plus the offset; TSecr: the FIN's TSval, now TS.Recent.
        assert_eq!(ack.options.timestamp, Some((6_000 + 10, 800)));
        assert_eq!(tw.expires, later + TW);
    }

    #[test]
    fn rsts_and_bare_acks_are_ignored_data_is_acknowledged() {
        let mut tw = record(4000, T0 + TW, false);
        let rst = seg(9001, TcpFlags::RST, false, None);
        assert_eq!(
            tw.on_segment(T0, &rst, 0, TW, CHALLENGE),
            TimeWaitInput::Ignore
        );
        let ack = seg(9001, TcpFlags::ACK, true, None);
        assert_eq!(
            tw.on_segment(T0, &ack, 0, TW, CHALLENGE),
            TimeWaitInput::Ignore
        );
        assert!(matches!(
            tw.on_segment(T0, &ack, 10, TW, CHALLENGE),
            TimeWaitInput::Answer(a) if a.ack == Some(SeqNumber(9001))
        ));
        // Nothing restarted the timer.
        assert_eq!(tw.expires, T0 + TW);
    }

    #[test]
    fn new_syns_reopen_by_timestamp_or_sequence_old_ones_get_a_rate_limited_challenge() {
        let mut tw = record(4000, T0 + TW, true);
        // With timestamps only the TSval decides (RFC 6191).
        assert!(tw.accepts_new_syn(&seg(1, TcpFlags::SYN, false, Some(701))));
        assert!(!tw.accepts_new_syn(&seg(20_000, TcpFlags::SYN, false, Some(700))));
        let old = seg(20_000, TcpFlags::SYN, false, Some(600));
        assert!(matches!(
            tw.on_segment(T0, &old, 0, TW, CHALLENGE),
            TimeWaitInput::Answer(_)
        ));
        assert_eq!(
            tw.on_segment(T0 + Duration::from_millis(10), &old, 0, TW, CHALLENGE),
            TimeWaitInput::Ignore
        );
        assert!(matches!(
            tw.on_segment(T0 + CHALLENGE, &old, 0, TW, CHALLENGE),
            TimeWaitInput::Answer(_)
        ));
        let new = seg(1, TcpFlags::SYN, false, Some(900));
        assert_eq!(
            tw.on_segment(T0, &new, 0, TW, CHALLENGE),
            TimeWaitInput::Reopen
        );
        // Without timestamps the sequence number decides.
        let tw = record(4000, T0 + TW, false);
        assert!(tw.accepts_new_syn(&seg(9002, TcpFlags::SYN, false, None)));
        assert!(!tw.accepts_new_syn(&seg(9000, TcpFlags::SYN, false, None)));
        // A SYN-ACK is no new SYN.
        assert!(!tw.accepts_new_syn(&seg(9002, TcpFlags::SYN, true, None)));
    }

    #[test]
    fn the_table_is_bounded_expires_in_order_and_reopens() {
        let mut t = TimeWaitTable::new(2);
        t.insert(record(1, T0 + TW, false));
        t.insert(record(2, T0 + TW + Duration::from_millis(1), false));
        t.insert(record(3, T0 + TW + Duration::from_millis(2), false));
        // The oldest made room.
        assert_eq!(t.len(), 2);
        assert_eq!(t.evicted(), 1);
        assert!(t.get(addr(80), addr(1)).is_none());
        assert_eq!(t.next_expiry(), Some(T0 + TW + Duration::from_millis(1)));
        // A retransmitted FIN restarts record 2: it now ends after record 3.
        let fin = seg(9000, TcpFlags::FIN, true, None);
        let at = T0 + Duration::from_secs(1);
        assert!(matches!(
            t.on_segment(addr(80), addr(2), at, &fin, 0, TW, CHALLENGE),
            Some(TimeWaitInput::Answer(_))
        ));
        assert_eq!(t.expire(T0 + TW + Duration::from_millis(2)), 1);
        assert!(t.get(addr(80), addr(3)).is_none());
        assert!(t.get(addr(80), addr(2)).is_some());
        assert_eq!(t.expire(at + TW), 1);
        assert!(t.is_empty());
        assert_eq!(t.next_expiry(), None);
        // A new incarnation's SYN removes its record; unknown tuples are not answered.
        t.insert(record(4, T0 + TW, false));
        let syn = seg(9_500, TcpFlags::SYN, false, None);
        assert_eq!(
            t.on_segment(addr(80), addr(4), T0, &syn, 0, TW, CHALLENGE),
            Some(TimeWaitInput::Reopen)
        );
        assert!(t.is_empty());
        assert_eq!(
            t.on_segment(addr(80), addr(5), T0, &syn, 0, TW, CHALLENGE),
            None
        );
    }

    #[test]
    fn restarts_cannot_grow_the_order_queue_without_bound() {
        let mut t = TimeWaitTable::new(4);
        t.insert(record(1, T0 + TW, false));
        let fin = seg(9000, TcpFlags::FIN, true, None);
        for i in 1..1_000u64 {
            let now = T0 + Duration::from_millis(i);
            t.on_segment(addr(80), addr(1), now, &fin, 0, TW, CHALLENGE);
        }
        assert!(t.order.len() <= 2 * t.len() + 17, "{}", t.order.len());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_table_of_no_capacity_keeps_nothing() {
        let mut t = TimeWaitTable::new(0);
        t.insert(record(1, T0 + TW, false));
        assert!(t.is_empty());
        assert_eq!(t.evicted(), 1);
    }
}
