//! Exact-segment tests and an in-memory pair driver. ISNs start just below 2^32 so every
//! test crosses the sequence wrap.

use core::net::{Ipv4Addr, SocketAddrV4};

use super::*;
use crate::wire::tcp::{SackBlock, TcpFlags, TcpOptions};

const A_ADDR: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
const B_ADDR: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 80);
const A_ISN: SeqNumber = SeqNumber(u32::MAX - 1000);
const B_ISN: SeqNumber = SeqNumber(u32::MAX - 500);
const MS: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

/// Drains every segment `conn` wants to send now.
fn drain(conn: &mut Connection, now: Instant) -> Vec<(TcpRepr, Vec<u8>)> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 9000];
    for _ in 0..10_000 {
        match conn.poll_transmit(now, &mut buf) {
            Some(t) => out.push((t.repr, buf[..t.payload_len].to_vec())),
            None => return out,
        }
    }
    panic!("poll_transmit never returned None");
}

/// Drains exactly one segment.
fn one(conn: &mut Connection, now: Instant) -> (TcpRepr, Vec<u8>) {
    let mut segs = drain(conn, now);
    assert_eq!(segs.len(), 1, "expected exactly one segment, got {segs:#?}");
    segs.remove(0)
}

fn nothing(conn: &mut Connection, now: Instant) {
    let segs = drain(conn, now);
    assert!(segs.is_empty(), "expected no segment, got {segs:#?}");
}

/// A handcrafted segment from B to A (or the other way with `from_b = false`).
fn seg(from_b: bool, seq: SeqNumber, ack: Option<SeqNumber>, flags: TcpFlags) -> TcpRepr {
    let (src, dst) = if from_b {
        (B_ADDR.port(), A_ADDR.port())
    } else {
        (A_ADDR.port(), B_ADDR.port())
    };
    TcpRepr {
        src_port: src,
        dst_port: dst,
        seq,
        ack,
        flags: if ack.is_some() {
            flags | TcpFlags::ACK
        } else {
            flags
        },
        window: 65535,
        urgent: 0,
        options: TcpOptions::default(),
    }
}

/// Decides whether the pair's wire loses a segment: (towards B, header, payload length).
type DropFn = Box<dyn FnMut(bool, &TcpRepr, usize) -> bool>;

/// Two connections wired back to back with a one-way delay, stepping virtual time.
struct Pair {
    a: Connection,
    b: Connection,
    now: Instant,
    delay: Duration,
    /// Segments in flight: (arrival time, to_b, repr, payload).
    wire: Vec<(Instant, bool, TcpRepr, Vec<u8>)>,
    /// Drop predicate: (to_b, repr, payload_len) -> drop?
    drop: DropFn,
}

impl Pair {
    /// Handshake via `connect` + `accept`, delivering the SYN to the listener.
    fn new(config_a: Config, config_b: Config, delay: Duration) -> Pair {
        let now = Instant::ZERO;
        let mut a = Connection::connect(config_a, A_ADDR, B_ADDR, A_ISN, now);
        let (syn, _) = one(&mut a, now);
        let now = now + delay;
        let b = Connection::accept(config_b, B_ADDR, A_ADDR, &syn, B_ISN, now).unwrap();
        let mut pair = Pair {
            a,
            b,
            now,
            delay,
            wire: Vec::new(),
            drop: Box::new(|_, _, _| false),
        };
        pair.flush();
        pair
    }

    /// Moves everything both sides want to send onto the wire.
    fn flush(&mut self) {
        for (repr, payload) in drain(&mut self.a, self.now) {
            if !(self.drop)(true, &repr, payload.len()) {
                self.wire.push((self.now + self.delay, true, repr, payload));
            }
        }
        for (repr, payload) in drain(&mut self.b, self.now) {
            if !(self.drop)(false, &repr, payload.len()) {
                self.wire
                    .push((self.now + self.delay, false, repr, payload));
            }
        }
    }

    /// Advances to the next event (arrival or timer) and processes it. False when idle.
    fn step(&mut self) -> bool {
        self.flush();
        let next_arrival = self.wire.iter().map(|w| w.0).min();
        let next_timer = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(next) = [next_arrival, next_timer].into_iter().flatten().min() else {
            return false;
        };
        self.now = self.now.max(next);
        let mut i = 0;
        while i < self.wire.len() {
            if self.wire[i].0 <= self.now {
                let (_, to_b, repr, payload) = self.wire.remove(i);
                if to_b {
                    self.b.handle_segment(self.now, &repr, &payload);
                } else {
                    self.a.handle_segment(self.now, &repr, &payload);
                }
                // Answer each segment before the next, as a real stack does (one
                // duplicate ACK per out-of-order segment).
                self.flush();
            } else {
                i += 1;
            }
        }
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        self.flush();
        true
    }

    fn run_until(&mut self, mut done: impl FnMut(&mut Pair) -> bool, max_steps: usize) {
        for _ in 0..max_steps {
            if done(self) {
                return;
            }
            assert!(self.step(), "pair went idle before the condition held");
        }
        panic!(
            "condition not reached after {max_steps} steps (now {:?})",
            self.now
        );
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2654435761)
                .rotate_left(seed as u32 % 31) as u8
                ^ seed
        })
        .collect()
}

#[test]
fn handshake_exact_segments() {
    let mut a = Connection::connect(Config::default(), A_ADDR, B_ADDR, A_ISN, ms(0));
    assert_eq!(a.state(), State::SynSent);
    let (syn, payload) = one(&mut a, ms(0));
    assert!(payload.is_empty());
    assert_eq!(syn.src_port, 40000);
    assert_eq!(syn.dst_port, 80);
    assert_eq!(syn.seq, A_ISN);
    assert_eq!(syn.ack, None);
    assert_eq!(syn.flags, TcpFlags::SYN);
    assert_eq!(syn.window, 65535);
    assert_eq!(syn.options.mss, Some(1460));
    // The shift offered expresses the auto-tuning maximum, 6 MiB, not the 256 KiB the
    // buffer starts at: 6 MiB >> 6 = 98 304 does not fit 16 bits, >> 7 does.
    assert_eq!(syn.options.window_scale, Some(7));
    assert!(syn.options.sack_permitted);
    assert_eq!(syn.options.timestamp, Some((0, 0)));
    assert_eq!(a.poll_timeout(), Some(ms(1000)));

    let mut b = Connection::accept(Config::default(), B_ADDR, A_ADDR, &syn, B_ISN, ms(5)).unwrap();
    assert_eq!(b.state(), State::SynReceived);
    let (syn_ack, _) = one(&mut b, ms(5));
    assert_eq!(syn_ack.seq, B_ISN);
    assert_eq!(syn_ack.ack, Some(A_ISN + 1));
    assert_eq!(syn_ack.flags, TcpFlags::SYN | TcpFlags::ACK);
    assert_eq!(syn_ack.window, 65535);
    assert_eq!(syn_ack.options.mss, Some(1460));
    assert_eq!(syn_ack.options.window_scale, Some(7));
    assert!(syn_ack.options.sack_permitted);
    assert_eq!(syn_ack.options.timestamp, Some((5, 0)));

    a.handle_segment(ms(10), &syn_ack, &[]);
    assert_eq!(a.state(), State::Established);
    assert_eq!(a.negotiated(), (true, true, true));
    let (ack, _) = one(&mut a, ms(10));
    assert_eq!(ack.seq, A_ISN + 1);
    assert_eq!(ack.ack, Some(B_ISN + 1));
    assert_eq!(ack.flags, TcpFlags::ACK);
    assert_eq!(ack.window, ((256 * 1024) >> 7) as u16);
    assert_eq!(ack.options.timestamp, Some((10, 5)));
    assert_eq!(a.stats().srtt, Some(Duration::from_millis(10)));
    assert_eq!(a.poll_timeout(), None);

    b.handle_segment(ms(15), &ack, &[]);
    assert_eq!(b.state(), State::Established);
    assert_eq!(b.peer_window(), 256 * 1024);
    nothing(&mut b, ms(15));
    // Timestamps cost 12 bytes of every segment.
    assert_eq!(a.send_mss(), 1448);
}

#[test]
fn handshake_without_options_defaults_mss_and_scale() {
    let mut a = Connection::connect(Config::default(), A_ADDR, B_ADDR, A_ISN, ms(0));
    let _ = one(&mut a, ms(0));
    let mut syn_ack = seg(true, B_ISN, Some(A_ISN + 1), TcpFlags::SYN);
    syn_ack.window = 1000;
    a.handle_segment(ms(1), &syn_ack, &[]);
    assert_eq!(a.state(), State::Established);
    assert_eq!(a.negotiated(), (false, false, false));
    assert_eq!(a.window_scales(), (0, 0));
    assert_eq!(a.peer_mss(), 536);
    assert_eq!(a.peer_window(), 1000);
    let (ack, _) = one(&mut a, ms(1));
    // Unscaled: a 256 KiB buffer advertises 65535.
    assert_eq!(ack.window, 65535);
    assert_eq!(ack.options, TcpOptions::default());
}

#[test]
fn data_and_delayed_ack() {
    // No quick-ACK budget at B: it would acknowledge these first segments at once, and
    // this test is about the delayed-ACK rules that follow it (tests/tcp_quick_ack.rs).
    let b_cfg = Config {
        quick_ack_segments: 0,
        ..Config::default()
    };
    let mut p = Pair::new(Config::default(), b_cfg, 5 * MS);
    p.run_until(|p| p.b.state() == State::Established, 10);
    assert_eq!(p.a.send(b"hello").unwrap(), 5);
    let now = p.now;
    let (data, payload) = one(&mut p.a, now);
    assert_eq!(payload, b"hello");
    assert_eq!(data.seq, A_ISN + 1);
    assert_eq!(data.ack, Some(B_ISN + 1));
    assert_eq!(data.flags, TcpFlags::ACK | TcpFlags::PSH);
    p.b.handle_segment(now, &data, &payload);
    // One segment: the ACK is delayed by 40 ms.
    nothing(&mut p.b, now);
    assert_eq!(p.b.poll_timeout(), Some(now + 40 * MS));
    let mut buf = [0u8; 16];
    assert_eq!(p.b.recv(&mut buf), Ok(5));
    assert_eq!(&buf[..5], b"hello");
    assert_eq!(p.b.recv(&mut buf), Err(TcpError::WouldBlock));
    p.b.handle_timeout(now + 40 * MS);
    let (ack, _) = one(&mut p.b, now + 40 * MS);
    assert_eq!(ack.ack, Some(A_ISN + 6));
    assert_eq!(ack.seq, B_ISN + 1);

    // Two short segments in a row are not two full-sized ones (RFC 5681 §4.2): the
    // delayed-ACK timer still acknowledges them (or a reply would).
    p.a.set_nodelay(true);
    p.a.send(b"ab").unwrap();
    let t = now + 50 * MS;
    let (s1, d1) = one(&mut p.a, t);
    p.a.send(b"cd").unwrap();
    let (s2, d2) = one(&mut p.a, t);
    p.b.handle_segment(t, &s1, &d1);
    nothing(&mut p.b, t);
    p.b.handle_segment(t, &s2, &d2);
    nothing(&mut p.b, t);
    assert_eq!(p.b.poll_timeout(), Some(t + 40 * MS));
    p.b.handle_timeout(t + 40 * MS);
    let (ack, _) = one(&mut p.b, t + 40 * MS);
    assert_eq!(ack.ack, Some(A_ISN + 10));

    // Two full-sized segments in a row: the second is acknowledged at once.
    let t = t + 50 * MS;
    let big = vec![7u8; 2 * 1460];
    assert_eq!(p.a.send(&big).unwrap(), big.len());
    let segs = drain(&mut p.a, t);
    assert!(segs.len() >= 2, "{} segments", segs.len());
    let (s1, d1) = &segs[0];
    let (s2, d2) = &segs[1];
    assert_eq!(d1.len(), d2.len(), "two full-sized segments");
    p.b.handle_segment(t, s1, d1);
    nothing(&mut p.b, t);
    p.b.handle_segment(t, s2, d2);
    let (ack, _) = one(&mut p.b, t);
    assert_eq!(ack.ack, Some(A_ISN + 10 + (d1.len() + d2.len())));
}

#[test]
fn fin_exchange_and_time_wait() {
    let cfg = Config {
        time_wait: Duration::from_secs(2),
        ..Config::default()
    };
    let mut p = Pair::new(cfg.clone(), cfg, 5 * MS);
    p.run_until(|p| p.b.state() == State::Established, 10);
    p.a.send(b"bye").unwrap();
    p.a.close();
    assert_eq!(p.a.state(), State::FinWait1);
    assert_eq!(p.a.send(b"x"), Err(TcpError::Closed));
    let now = p.now;
    let (fin, payload) = one(&mut p.a, now);
    assert_eq!(payload, b"bye");
    assert_eq!(fin.flags, TcpFlags::ACK | TcpFlags::PSH | TcpFlags::FIN);
    assert_eq!(fin.seq, A_ISN + 1);
    p.b.handle_segment(now, &fin, &payload);
    assert_eq!(p.b.state(), State::CloseWait);
    let (ack, _) = one(&mut p.b, now);
    assert_eq!(ack.ack, Some(A_ISN + 5));
    p.a.handle_segment(now, &ack, &[]);
    assert_eq!(p.a.state(), State::FinWait2);

    let mut buf = [0u8; 8];
    assert_eq!(p.b.recv(&mut buf), Ok(3));
    assert_eq!(p.b.recv(&mut buf), Ok(0));
    // Half-close: B can still send, A still receives.
    p.b.send(b"late").unwrap();
    p.b.close();
    assert_eq!(p.b.state(), State::LastAck);
    let (fin_b, payload) = one(&mut p.b, now);
    assert_eq!(payload, b"late");
    assert!(fin_b.flags.fin());
    p.a.handle_segment(now, &fin_b, &payload);
    assert_eq!(p.a.state(), State::TimeWait);
    assert_eq!(p.a.recv(&mut buf), Ok(4));
    assert_eq!(p.a.recv(&mut buf), Ok(0));
    let (last_ack, _) = one(&mut p.a, now);
    assert_eq!(last_ack.ack, Some(B_ISN + 6));
    p.b.handle_segment(now, &last_ack, &[]);
    assert_eq!(p.b.state(), State::Closed);
    assert!(p.b.is_closed());
    assert_eq!(p.b.error(), None);

    // A retransmitted FIN restarts 2MSL; an RST does not end TIME-WAIT (RFC 1337).
    assert_eq!(p.a.poll_timeout(), Some(now + Duration::from_secs(2)));
    let later = now + Duration::from_secs(1);
    p.a.handle_segment(later, &fin_b, b"late");
    let (re_ack, _) = one(&mut p.a, later);
    assert_eq!(re_ack.ack, Some(B_ISN + 6));
    assert_eq!(p.a.poll_timeout(), Some(later + Duration::from_secs(2)));
    p.a.handle_segment(later, &seg(true, B_ISN + 6, None, TcpFlags::RST), &[]);
    assert_eq!(p.a.state(), State::TimeWait);
    p.a.handle_timeout(later + Duration::from_secs(2));
    assert_eq!(p.a.state(), State::Closed);
    assert!(p.a.is_closed());
}

/// The peer closes first with a bare FIN and the application closes in answer: our FIN
/// carries the ACK, no pure ACK goes before it (three segments for the close, as Linux's
/// `tcp_fin` makes it).
#[test]
fn a_peer_fin_is_acknowledged_by_the_fin_that_answers_it() {
    let mut p = Pair::new(Config::default(), Config::default(), 5 * MS);
    p.run_until(|p| p.b.state() == State::Established, 10);
    let now = p.now;
    p.a.close();
    let (fin, payload) = one(&mut p.a, now);
    assert!(payload.is_empty());
    assert_eq!(fin.flags, TcpFlags::ACK | TcpFlags::FIN);
    p.b.handle_segment(now, &fin, &[]);
    assert_eq!(p.b.state(), State::CloseWait);
    nothing(&mut p.b, now);
    assert_eq!(
        p.b.poll_timeout(),
        Some(now + 40 * MS),
        "the delayed-ACK timer"
    );
    let mut buf = [0u8; 8];
    assert_eq!(p.b.recv(&mut buf), Ok(0));
    p.b.close();
    assert_eq!(p.b.state(), State::LastAck);
    let (fin_b, _) = one(&mut p.b, now);
    assert_eq!(fin_b.flags, TcpFlags::ACK | TcpFlags::FIN);
    assert_eq!(fin_b.ack, Some(A_ISN + 2));
    p.a.handle_segment(now, &fin_b, &[]);
    assert_eq!(p.a.state(), State::TimeWait);
    let (last, _) = one(&mut p.a, now);
    assert_eq!(last.flags, TcpFlags::ACK);
    assert_eq!(last.ack, Some(B_ISN + 2));
    p.b.handle_segment(now, &last, &[]);
    assert_eq!(p.b.state(), State::Closed);
}

/// A peer's FIN that the application does not answer is acknowledged alone when the
/// delayed-ACK timer runs out (well inside the peer's retransmission timeout), and at
/// once where delayed ACKs are off; a FIN that answers ours is acknowledged at once.
#[test]
fn a_peer_fin_left_unanswered_is_acknowledged_by_the_delayed_ack_timer() {
    let mut p = Pair::new(Config::default(), Config::default(), 5 * MS);
    p.run_until(|p| p.b.state() == State::Established, 10);
    let now = p.now;
    p.a.close();
    let (fin, _) = one(&mut p.a, now);
    p.b.handle_segment(now, &fin, &[]);
    nothing(&mut p.b, now + 39 * MS);
    p.b.handle_timeout(now + 40 * MS);
    let (ack, _) = one(&mut p.b, now + 40 * MS);
    assert_eq!(ack.flags, TcpFlags::ACK);
    assert_eq!(ack.ack, Some(A_ISN + 2));
    p.a.handle_segment(now + 40 * MS, &ack, &[]);
    assert_eq!(p.a.state(), State::FinWait2);
    // B's own FIN later: A, closing first, acknowledges it at once.
    let t = now + 50 * MS;
    p.b.close();
    let (fin_b, _) = one(&mut p.b, t);
    p.a.handle_segment(t, &fin_b, &[]);
    assert_eq!(p.a.state(), State::TimeWait);
    let (last, _) = one(&mut p.a, t);
    assert_eq!(last.ack, Some(B_ISN + 2));

    // Without delayed ACKs the FIN is acknowledged at once.
    let no_delay = Config {
        delayed_ack: None,
        ..Config::default()
    };
    let mut p = Pair::new(Config::default(), no_delay, 5 * MS);
    p.run_until(|p| p.b.state() == State::Established, 10);
    let now = p.now;
    p.a.close();
    let (fin, _) = one(&mut p.a, now);
    p.b.handle_segment(now, &fin, &[]);
    let (ack, _) = one(&mut p.b, now);
    assert_eq!(ack.flags, TcpFlags::ACK);
    assert_eq!(ack.ack, Some(A_ISN + 2));
}

#[test]
fn rst_in_syn_sent_refuses() {
    let mut a = Connection::connect(Config::default(), A_ADDR, B_ADDR, A_ISN, ms(0));
    let _ = one(&mut a, ms(0));
    // An RST whose ACK does not cover the SYN is ignored.
    a.handle_segment(
        ms(1),
        &seg(true, SeqNumber(0), Some(A_ISN), TcpFlags::RST),
        &[],
    );
    assert_eq!(a.state(), State::SynSent);
    nothing(&mut a, ms(1));
    a.handle_segment(
        ms(1),
        &seg(true, SeqNumber(0), Some(A_ISN + 1), TcpFlags::RST),
        &[],
    );
    assert_eq!(a.state(), State::Closed);
    assert_eq!(a.error(), Some(TcpError::Refused));
    assert_eq!(a.send(b"x"), Err(TcpError::Refused));
    assert!(a.is_closed());
}

#[test]
fn rst_for_unexpected_segments() {
    let syn = seg(false, SeqNumber(u32::MAX), None, TcpFlags::SYN);
    let rst = rst_for_unexpected(&syn, 0).unwrap();
    assert_eq!(rst.seq, SeqNumber(0));
    assert_eq!(rst.ack, Some(SeqNumber(0)));
    assert_eq!(rst.flags, TcpFlags::RST | TcpFlags::ACK);
    assert_eq!((rst.src_port, rst.dst_port), (80, 40000));
    let data = seg(false, SeqNumber(7), Some(SeqNumber(99)), TcpFlags::PSH);
    let rst = rst_for_unexpected(&data, 10).unwrap();
    assert_eq!(rst.seq, SeqNumber(99));
    assert_eq!(rst.ack, None);
    assert_eq!(rst.flags, TcpFlags::RST);
    assert_eq!(
        rst_for_unexpected(&seg(false, SeqNumber(1), None, TcpFlags::RST), 0),
        None
    );
}

#[test]
fn accept_rejects_non_syn() {
    let ack = seg(false, A_ISN, Some(B_ISN), TcpFlags::SYN);
    assert!(Connection::accept(Config::default(), B_ADDR, A_ADDR, &ack, B_ISN, ms(0)).is_err());
    let rst = seg(false, A_ISN, None, TcpFlags::SYN | TcpFlags::RST);
    assert!(Connection::accept(Config::default(), B_ADDR, A_ADDR, &rst, B_ISN, ms(0)).is_err());
    let plain = seg(false, A_ISN, None, TcpFlags::default());
    assert!(Connection::accept(Config::default(), B_ADDR, A_ADDR, &plain, B_ISN, ms(0)).is_err());
}

#[test]
fn syn_retransmission_backoff_and_give_up() {
    // The default 60 s user timeout would end the attempt first.
    let cfg = Config {
        user_timeout: Duration::from_secs(600),
        ..Config::default()
    };
    let mut a = Connection::connect(cfg, A_ADDR, B_ADDR, A_ISN, ms(0));
    let _ = one(&mut a, ms(0));
    // RTO 1 s, doubling: retransmissions at 1, 3, 7, 15, 31, 63 s; give up at 127 s.
    let mut expiry = 0u64;
    for retry in 0..6u32 {
        expiry += 1000 << retry;
        assert_eq!(a.poll_timeout(), Some(ms(expiry)));
        a.handle_timeout(ms(expiry) - Duration::from_micros(1));
        nothing(&mut a, ms(expiry) - Duration::from_micros(1));
        a.handle_timeout(ms(expiry));
        let (syn, _) = one(&mut a, ms(expiry));
        assert_eq!(syn.seq, A_ISN);
        assert_eq!(syn.flags, TcpFlags::SYN);
    }
    // 64 s is capped by max_rto (60 s).
    expiry += 60_000;
    assert_eq!(a.poll_timeout(), Some(ms(expiry)));
    a.handle_timeout(ms(expiry));
    assert_eq!(a.state(), State::Closed);
    assert_eq!(a.error(), Some(TcpError::TimedOut));
    nothing(&mut a, ms(expiry));
    assert_eq!(a.stats().rto_timeouts, 6);
}

#[test]
fn user_timeout_ends_syn_sent() {
    let mut a = Connection::connect(Config::default(), A_ADDR, B_ADDR, A_ISN, ms(0));
    let _ = one(&mut a, ms(0));
    let mut now = ms(0);
    while let Some(t) = a.poll_timeout() {
        now = t;
        a.handle_timeout(now);
        let _ = drain(&mut a, now);
    }
    assert_eq!(now, ms(60_000));
    assert_eq!(a.error(), Some(TcpError::TimedOut));
    // No RST from SYN-SENT: there is no connection at the peer to reset.
    assert!(a.is_closed());
}

#[test]
fn data_retransmission_after_rto_exact_timers() {
    let cfg = Config {
        timestamps: false,
        sack: false,
        ..Config::default()
    };
    let mut a = Connection::connect(cfg.clone(), A_ADDR, B_ADDR, A_ISN, ms(0));
    let _ = one(&mut a, ms(0));
    // 10 ms RTT sample: RTO = 10 + 4*5 = 30 ms, clamped up to min_rto 200 ms.
    a.handle_segment(
        ms(10),
        &seg(true, B_ISN, Some(A_ISN + 1), TcpFlags::SYN),
        &[],
    );
    let _ = one(&mut a, ms(10));
    assert_eq!(a.stats().rto, Duration::from_millis(200));
    a.send(&[7u8; 100]).unwrap();
    let (d, payload) = one(&mut a, ms(20));
    assert_eq!((d.seq, payload.len()), (A_ISN + 1, 100));
    assert_eq!(a.poll_timeout(), Some(ms(220)));
    a.handle_timeout(ms(220));
    let (r, payload) = one(&mut a, ms(220));
    assert_eq!((r.seq, payload.len()), (A_ISN + 1, 100));
    assert_eq!(a.poll_timeout(), Some(ms(620)));
    a.handle_timeout(ms(620));
    let _ = one(&mut a, ms(620));
    assert_eq!(a.poll_timeout(), Some(ms(1420)));
    let st = a.stats();
    assert_eq!((st.rto_timeouts, st.retransmitted_segments), (2, 2));
    // The ACK stops the timer; a new send restarts it from the (Karn-kept) backoff.
    a.handle_segment(
        ms(700),
        &seg(true, B_ISN + 1, Some(A_ISN + 101), TcpFlags::default()),
        &[],
    );
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn simultaneous_open() {
    let mut a = Connection::connect(Config::default(), A_ADDR, B_ADDR, A_ISN, ms(0));
    let mut b = Connection::connect(Config::default(), B_ADDR, A_ADDR, B_ISN, ms(0));
    let (syn_a, _) = one(&mut a, ms(0));
    let (syn_b, _) = one(&mut b, ms(0));
    a.handle_segment(ms(1), &syn_b, &[]);
    b.handle_segment(ms(1), &syn_a, &[]);
    assert_eq!(
        (a.state(), b.state()),
        (State::SynReceived, State::SynReceived)
    );
    let (sa_a, _) = one(&mut a, ms(1));
    let (sa_b, _) = one(&mut b, ms(1));
    assert_eq!(sa_a.flags, TcpFlags::SYN | TcpFlags::ACK);
    assert_eq!((sa_a.seq, sa_a.ack), (A_ISN, Some(B_ISN + 1)));
    a.handle_segment(ms(2), &sa_b, &[]);
    b.handle_segment(ms(2), &sa_a, &[]);
    assert_eq!(
        (a.state(), b.state()),
        (State::Established, State::Established)
    );
}

#[test]
fn rfc5961_rst_and_syn_challenges() {
    let mut p = Pair::new(Config::default(), Config::default(), MS);
    p.run_until(|p| p.b.state() == State::Established, 10);
    let now = p.now;
    let rcv_nxt = B_ISN + 1;
    // In window but not exact: challenge ACK, no reset.
    p.a.handle_segment(now, &seg(true, rcv_nxt + 10, None, TcpFlags::RST), &[]);
    assert_eq!(p.a.state(), State::Established);
    let (ch, _) = one(&mut p.a, now);
    assert_eq!(ch.ack, Some(rcv_nxt));
    // Out of window: silently dropped.
    p.a.handle_segment(
        now,
        &seg(true, rcv_nxt + 1_000_000, None, TcpFlags::RST),
        &[],
    );
    nothing(&mut p.a, now);
    // SYN in a synchronized state: challenge ACK.
    p.a.handle_segment(now, &seg(true, rcv_nxt + 5, None, TcpFlags::SYN), &[]);
    let (ch, _) = one(&mut p.a, now);
    assert_eq!(ch.flags, TcpFlags::ACK);
    // ACK of unsent data: ACK back, dropped.
    p.a.handle_segment(
        now,
        &seg(true, rcv_nxt, Some(A_ISN + 5000), TcpFlags::default()),
        &[],
    );
    let _ = one(&mut p.a, now);
    assert_eq!(p.a.stats().challenge_acks, 3);
    // Rate limit: 10 per second per connection.
    for _ in 0..20 {
        p.a.handle_segment(now, &seg(true, rcv_nxt + 10, None, TcpFlags::RST), &[]);
        let _ = drain(&mut p.a, now);
    }
    assert_eq!(p.a.stats().challenge_acks, 10);
    // Exact RST resets.
    p.a.handle_segment(now, &seg(true, rcv_nxt, None, TcpFlags::RST), &[]);
    assert_eq!(p.a.state(), State::Closed);
    assert_eq!(p.a.error(), Some(TcpError::Reset));
    let mut buf = [0u8; 4];
    assert_eq!(p.a.recv(&mut buf), Err(TcpError::Reset));
}

fn transfer(
    cfg_a: Config,
    cfg_b: Config,
    len_a: usize,
    len_b: usize,
    drop_every: Option<usize>,
) -> Pair {
    let mut p = Pair::new(cfg_a, cfg_b, Duration::from_micros(500));
    if let Some(n) = drop_every {
        let mut count = 0usize;
        p.drop = Box::new(move |_, _, payload_len| {
            if payload_len == 0 {
                return false;
            }
            count += 1;
            count % n == 0
        });
    }
    let data_a = pattern(len_a, 1);
    let data_b = pattern(len_b, 2);
    if len_a == 0 {
        p.a.close();
    }
    if len_b == 0 {
        p.b.close();
    }
    let (mut sent_a, mut sent_b) = (0, 0);
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let mut buf = vec![0u8; 65536];
    for _ in 0..2_000_000 {
        if sent_a < len_a {
            sent_a += p.a.send(&data_a[sent_a..]).unwrap_or(0);
            if sent_a == len_a {
                p.a.close();
            }
        }
        if sent_b < len_b {
            sent_b += p.b.send(&data_b[sent_b..]).unwrap_or(0);
            if sent_b == len_b {
                p.b.close();
            }
        }
        while let Ok(n @ 1..) = p.a.recv(&mut buf) {
            got_a.extend_from_slice(&buf[..n]);
        }
        while let Ok(n @ 1..) = p.b.recv(&mut buf) {
            got_b.extend_from_slice(&buf[..n]);
        }
        if got_a.len() == len_b
            && got_b.len() == len_a
            && p.a.recv(&mut buf) == Ok(0)
            && p.b.recv(&mut buf) == Ok(0)
            && matches!(p.a.state(), State::TimeWait | State::Closed)
            && matches!(p.b.state(), State::TimeWait | State::Closed)
        {
            assert!(got_a == data_b, "A received corrupted data");
            assert!(got_b == data_a, "B received corrupted data");
            return p;
        }
        assert!(
            p.step(),
            "idle before transfer completed: a {:?} b {:?}",
            p.a.stats(),
            p.b.stats()
        );
    }
    panic!("transfer did not finish");
}

#[test]
fn one_megabyte_both_ways() {
    let p = transfer(Config::default(), Config::default(), 1 << 20, 1 << 20, None);
    assert_eq!(p.a.stats().retransmitted_segments, 0);
    assert_eq!(p.a.stats().bytes_acked, 1 << 20);
}

/// `traffic` is the published part of `stats`, field for field, mid-transfer (data
/// queued and in flight, retransmissions counted) as at the end.
#[test]
fn traffic_matches_the_fields_of_stats() {
    let same = |c: &Connection| {
        let (t, s) = (c.traffic(), c.stats());
        assert_eq!(t.send_queue, s.send_queue);
        assert_eq!(t.recv_queue, s.recv_queue);
        assert_eq!(t.bytes_in_flight, s.bytes_in_flight);
        assert_eq!(t.cwnd, s.cwnd);
        assert_eq!(t.srtt_us, s.srtt.map(|d| d.as_micros() as u64));
        assert_eq!(t.retransmitted_segments, s.retransmitted_segments);
        assert_eq!(t.rto_timeouts, s.rto_timeouts);
        assert_eq!(t.bytes_sent, s.bytes_sent);
        assert_eq!(t.bytes_acked, s.bytes_acked);
        assert_eq!(t.bytes_received, s.bytes_received);
    };
    let mut p = Pair::new(
        Config::default(),
        Config::default(),
        Duration::from_micros(500),
    );
    let mut count = 0usize;
    p.drop = Box::new(move |_, _, len| {
        count += usize::from(len > 0);
        len > 0 && count % 7 == 0
    });
    let data = pattern(200_000, 3);
    let (mut sent, mut got) = (0, 0);
    let mut buf = vec![0u8; 65536];
    let mut mid = false;
    for _ in 0..200_000 {
        if sent < data.len() {
            sent += p.a.send(&data[sent..]).unwrap_or(0);
        }
        let st = p.a.stats();
        if st.bytes_in_flight > 0 && st.send_queue > 0 && st.retransmitted_segments > 0 {
            same(&p.a);
            same(&p.b);
            mid = true;
        }
        while let Ok(n @ 1..) = p.b.recv(&mut buf) {
            got += n;
        }
        if got == data.len() {
            break;
        }
        p.step();
    }
    assert!(
        mid,
        "never had data queued, in flight and retransmitted at once"
    );
    assert_eq!(got, data.len());
    same(&p.a);
    same(&p.b);
    assert!(p.a.traffic().srtt_us.is_some());
}

#[test]
fn one_megabyte_small_buffers_no_options() {
    let cfg = Config {
        rx_buffer: 3000,
        tx_buffer: 5000,
        window_scaling: false,
        sack: false,
        timestamps: false,
        ..Config::default()
    };
    transfer(cfg.clone(), cfg, 1 << 20, 1 << 20, None);
}

#[test]
fn transfer_with_loss_newreno() {
    let cfg = Config {
        sack: false,
        min_rto: Duration::from_millis(5),
        congestion: crate::tcp::congestion::CongestionAlgorithm::NewReno,
        ..Config::default()
    };
    let p = transfer(cfg.clone(), cfg.clone(), 300_000, 0, Some(37));
    assert!(p.a.stats().fast_retransmits > 0);
    transfer(cfg.clone(), cfg, 300_000, 300_000, Some(37));
}

#[test]
fn transfer_with_loss_sack() {
    let cfg = Config {
        min_rto: Duration::from_millis(5),
        ..Config::default()
    };
    let p = transfer(cfg.clone(), cfg.clone(), 300_000, 0, Some(37));
    assert!(p.a.stats().fast_retransmits > 0);
    let p = transfer(cfg.clone(), cfg, 300_000, 300_000, Some(37));
    assert!(p.a.stats().fast_retransmits > 0);
}

/// A seeded lossy, reordering, duplicating wire: every data-carrying and pure-ACK
/// segment may be dropped, delayed by extra jitter (reordering) or duplicated.
fn lossy_transfer(seed: u64, loss_percent: u32, cfg: Config, len_a: usize, len_b: usize) {
    use rand::{Rng, SeedableRng};
    let mut p = Pair::new(cfg.clone(), cfg, Duration::from_micros(500));
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let data_a = pattern(len_a, 3);
    let data_b = pattern(len_b, 4);
    let (mut sent_a, mut sent_b) = (0, 0);
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let mut buf = vec![0u8; 65536];
    let mut closed = (false, false);
    for _ in 0..3_000_000 {
        if sent_a < len_a {
            sent_a += p.a.send(&data_a[sent_a..]).unwrap_or(0);
        }
        if sent_a == len_a && !closed.0 {
            p.a.close();
            closed.0 = true;
        }
        if sent_b < len_b {
            sent_b += p.b.send(&data_b[sent_b..]).unwrap_or(0);
        }
        if sent_b == len_b && !closed.1 {
            p.b.close();
            closed.1 = true;
        }
        while let Ok(n @ 1..) = p.a.recv(&mut buf) {
            got_a.extend_from_slice(&buf[..n]);
        }
        while let Ok(n @ 1..) = p.b.recv(&mut buf) {
            got_b.extend_from_slice(&buf[..n]);
        }
        if got_a.len() == len_b
            && got_b.len() == len_a
            && p.a.recv(&mut buf) == Ok(0)
            && p.b.recv(&mut buf) == Ok(0)
        {
            assert!(
                got_a == data_b && got_b == data_a,
                "corrupted (seed {seed})"
            );
            return;
        }
        // Move segments onto the wire through the fault model.
        let now = p.now;

        for to_b in [true, false] {
            let conn = if to_b { &mut p.a } else { &mut p.b };
            for (repr, payload) in drain(conn, now) {
                if rng.gen_range(0..100) < loss_percent {
                    continue;
                }
                let jitter = Duration::from_micros(rng.gen_range(0..400));
                let copies = if rng.gen_range(0..100) < 2 { 2 } else { 1 };
                for _ in 0..copies {
                    p.wire
                        .push((now + p.delay + jitter, to_b, repr, payload.clone()));
                }
            }
        }
        assert!(
            p.a.error().is_none() && p.b.error().is_none(),
            "connection failed (seed {seed}): {:?} {:?}",
            p.a.error(),
            p.b.error()
        );
        // Step without the pair's own (lossless) flush: deliver or fire timers.
        let next_arrival = p.wire.iter().map(|w| w.0).min();
        let next_timer = [p.a.poll_timeout(), p.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let next = [next_arrival, next_timer].into_iter().flatten().min();
        let next = next.unwrap_or_else(|| {
            panic!(
                "idle (seed {seed}): a {:?} {:?} b {:?} {:?}",
                p.a.state(),
                p.a.stats(),
                p.b.state(),
                p.b.stats()
            )
        });
        p.now = p.now.max(next);
        let now = p.now;
        let mut i = 0;
        while i < p.wire.len() {
            if p.wire[i].0 <= now {
                let (_, to_b, repr, payload) = p.wire.remove(i);
                if to_b {
                    p.b.handle_segment(now, &repr, &payload);
                } else {
                    p.a.handle_segment(now, &repr, &payload);
                }
            } else {
                i += 1;
            }
        }
        p.a.handle_timeout(now);
        p.b.handle_timeout(now);
    }
    panic!("transfer did not finish (seed {seed})");
}

#[test]
fn lossy_reordering_sweep() {
    let base = Config {
        min_rto: Duration::from_millis(2),
        user_timeout: Duration::from_secs(600),
        ..Config::default()
    };
    let variants = [
        base.clone(),
        Config {
            sack: false,
            congestion: crate::tcp::congestion::CongestionAlgorithm::NewReno,
            ..base.clone()
        },
        Config {
            timestamps: false,
            window_scaling: false,
            rx_buffer: 4000,
            tx_buffer: 7000,
            ..base.clone()
        },
        Config {
            delayed_ack: None,
            nagle: false,
            rx_buffer: 1 << 20,
            tx_buffer: 1 << 20,
            ..base
        },
    ];
    for (v, cfg) in variants.iter().enumerate() {
        let seeds: u64 = std::env::var("TCP_SWEEP_SEEDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        for (loss, k) in [0u32, 3, 10, 25]
            .into_iter()
            .flat_map(|l| (0..seeds).map(move |k| (l, k)))
        {
            let seed = (v as u64) * 100_000 + u64::from(loss) * 1000 + k;
            lossy_transfer(seed, loss, cfg.clone(), 60_000, 45_000);
        }
    }
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn arb_repr(base_seq: u32, base_ack: u32) -> impl Strategy<Value = (TcpRepr, usize)> {
        (
            prop_oneof![
                Just(0i64),
                -70000i64..70000,
                any::<u32>().prop_map(i64::from)
            ],
            prop_oneof![
                Just(0i64),
                -70000i64..70000,
                any::<u32>().prop_map(i64::from)
            ],
            any::<bool>(),
            any::<u8>(),
            any::<u16>(),
            (
                any::<Option<u16>>(),
                any::<Option<u8>>(),
                any::<bool>(),
                any::<Option<(u32, u32)>>(),
            ),
            proptest::collection::vec((any::<u32>(), any::<u32>()), 0..4),
            prop_oneof![Just(0usize), 0usize..3000],
        )
            .prop_map(
                move |(ds, da, has_ack, flags, window, (mss, ws, sp, ts), blocks, len)| {
                    let mut sack_blocks = [None; 4];
                    for (i, (l, r)) in blocks.into_iter().enumerate() {
                        sack_blocks[i] = Some(SackBlock {
                            left: SeqNumber(base_ack.wrapping_add(l % 100_000)),
                            right: SeqNumber(base_ack.wrapping_add(r % 100_000)),
                        });
                    }
                    let repr = TcpRepr {
                        src_port: B_ADDR.port(),
                        dst_port: A_ADDR.port(),
                        seq: SeqNumber(base_seq.wrapping_add(ds as u32)),
                        ack: has_ack.then_some(SeqNumber(base_ack.wrapping_add(da as u32))),
                        flags: TcpFlags(flags),
                        window,
                        urgent: 0,
                        options: TcpOptions {
                            mss,
                            window_scale: ws,
                            sack_permitted: sp,
                            sack_blocks,
                            timestamp: ts,
                        },
                    };
                    (repr, len)
                },
            )
    }

    fn exercise(conn: &mut Connection, segs: &[(TcpRepr, usize)], steps: &[u16]) {
        let payload = vec![0x5a; 3000];
        let mut buf = vec![0u8; 1500];
        let mut now = Instant::from_millis(100);
        for (i, (repr, len)) in segs.iter().enumerate() {
            conn.handle_segment(now, repr, &payload[..*len]);
            let mut n = 0;
            while conn.poll_transmit(now, &mut buf).is_some() {
                n += 1;
                assert!(n < 10_000, "poll_transmit does not terminate");
            }
            let _ = conn.send(&payload[..100]);
            let _ = conn.recv(&mut buf);
            now += Duration::from_micros(u64::from(steps[i % steps.len()]) * 100);
            if let Some(t) = conn.poll_timeout() {
                if t <= now {
                    conn.handle_timeout(now);
                }
            }
            let _ = conn.stats();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        #[test]
        fn established_survives_any_segments(
            segs in proptest::collection::vec(arb_repr(B_ISN.0.wrapping_add(1), A_ISN.0.wrapping_add(1)), 1..40),
            steps in proptest::collection::vec(any::<u16>(), 1..8),
        ) {
            let mut p = Pair::new(Config::default(), Config::default(), MS);
            p.run_until(|p| p.b.state() == State::Established, 10);
            p.a.send(&[1u8; 5000]).unwrap();
            let mut a = p.a;
            exercise(&mut a, &segs, &steps);
        }

        #[test]
        fn syn_sent_survives_any_segments(
            segs in proptest::collection::vec(arb_repr(B_ISN.0, A_ISN.0.wrapping_add(1)), 1..20),
            steps in proptest::collection::vec(any::<u16>(), 1..8),
        ) {
            let mut a = Connection::connect(Config::default(), A_ADDR, B_ADDR, A_ISN, ms(0));
            let _ = drain(&mut a, ms(0));
            exercise(&mut a, &segs, &steps);
        }

        #[test]
        fn syn_received_survives_any_segments(
            segs in proptest::collection::vec(arb_repr(B_ISN.0.wrapping_add(1), A_ISN.0.wrapping_add(1)), 1..20),
            steps in proptest::collection::vec(any::<u16>(), 1..8),
        ) {
            // Here "A" is the passive side: its peer's ISN is B_ISN.
            let syn = TcpRepr { src_port: B_ADDR.port(), dst_port: A_ADDR.port(), ..seg(true, B_ISN, None, TcpFlags::SYN) };
            let mut a = Connection::accept(Config::default(), A_ADDR, B_ADDR, &syn, A_ISN, ms(0)).unwrap();
            let _ = drain(&mut a, ms(0));
            exercise(&mut a, &segs, &steps);
        }
    }
}

/// B accepted from a handcrafted SYN of A carrying `options`, and established by a
/// handcrafted ACK at t = 1 ms. Returns B with its SYN-ACK.
fn passive_b(cfg: Config, options: TcpOptions) -> (Connection, TcpRepr) {
    let mut syn = seg(false, A_ISN, None, TcpFlags::SYN);
    syn.options = options;
    let mut b = Connection::accept(cfg, B_ADDR, A_ADDR, &syn, B_ISN, ms(0)).unwrap();
    let (syn_ack, _) = one(&mut b, ms(0));
    let mut ack = seg(false, A_ISN + 1, Some(B_ISN + 1), TcpFlags::default());
    if let Some((tsval, _)) = options.timestamp {
        ack.options.timestamp = Some((tsval + 1, syn_ack.options.timestamp.map_or(0, |t| t.0)));
    }
    b.handle_segment(ms(1), &ack, &[]);
    assert_eq!(b.state(), State::Established);
    (b, syn_ack)
}

#[test]
fn zero_window_probe_backoff_and_update_after_drain() {
    // A fixed 2000-byte window: auto-tuning would grow it once A's bytes are read.
    let cfg_b = Config {
        rx_buffer: 2000,
        rx_buffer_max: None,
        ..Config::default()
    };
    let mut p = Pair::new(Config::default(), cfg_b, MS);
    p.run_until(
        |p| p.b.state() == State::Established && p.a.state() == State::Established,
        10,
    );
    p.a.set_nodelay(true);
    assert_eq!(p.a.peer_window(), 2000);
    assert_eq!(p.a.send(&[9u8; 5000]), Ok(5000));
    // 1448 goes at once; the remaining 552-byte window is below the sender SWS threshold
    // (half the peer's largest window) and goes only when the persist timer overrides.
    p.run_until(
        |p| p.a.peer_window() == 0 && p.a.stats().bytes_in_flight == 0,
        100,
    );
    assert_eq!(p.a.stats().bytes_acked, 2000);
    let now = p.now;
    nothing(&mut p.a, now);
    // Persist timer: first interval is the RTO (200 ms floor), then doubling.
    let rto = p.a.stats().rto;
    assert_eq!(rto, Duration::from_millis(200));
    let t1 = now + rto;
    assert_eq!(p.a.poll_timeout(), Some(t1));
    p.a.handle_timeout(t1);
    let (probe, byte) = one(&mut p.a, t1);
    assert_eq!((probe.seq, byte.len()), (A_ISN + 2001, 1));
    p.b.handle_segment(t1, &probe, &byte);
    let (ack2, _) = one(&mut p.b, t1);
    assert_eq!((ack2.ack, ack2.window), (Some(A_ISN + 2001), 0));
    p.a.handle_segment(t1, &ack2, &[]);
    nothing(&mut p.a, t1);
    let t2 = t1 + 2 * rto;
    assert_eq!(p.a.poll_timeout(), Some(t2));
    p.a.handle_timeout(t2);
    let (probe2, byte2) = one(&mut p.a, t2);
    assert_eq!(probe2.seq, A_ISN + 2001);
    p.b.handle_segment(t2, &probe2, &byte2);
    assert_eq!(
        p.a.poll_timeout(),
        None.or(Some(t2 + 4 * rto))
            .filter(|_| false)
            .or(p.a.poll_timeout())
    );
    // The reader drains: a window update must go out (smoltcp #199) without new data.
    let mut buf = [0u8; 4096];
    assert_eq!(p.b.recv(&mut buf), Ok(2000));
    let (update, _) = one(&mut p.b, t2);
    assert_eq!((update.ack, update.window), (Some(A_ISN + 2001), 2000));
    p.a.handle_segment(t2, &update, &[]);
    let segs = drain(&mut p.a, t2);
    let lens: Vec<usize> = segs.iter().map(|s| s.1.len()).collect();
    assert_eq!(lens, [1448]);
    assert_eq!(segs[0].0.seq, A_ISN + 2001);
    assert_eq!(p.a.stats().rto_timeouts, 0);
}

#[test]
fn sack_blocks_most_recent_first_and_gap_fill_acks_at_once() {
    let options = TcpOptions {
        mss: Some(1460),
        sack_permitted: true,
        ..TcpOptions::default()
    };
    let (mut b, syn_ack) = passive_b(Config::default(), options);
    assert!(syn_ack.options.sack_permitted);
    assert_eq!(syn_ack.options.window_scale, None);
    assert_eq!(syn_ack.options.timestamp, None);
    let base = A_ISN + 1;
    let data = [1u8; 100];
    let block = |l: usize, r: usize| {
        Some(SackBlock {
            left: base + l,
            right: base + r,
        })
    };
    // [100,200) arrives first, [0,100) is missing.
    b.handle_segment(
        ms(2),
        &seg(false, base + 100, Some(B_ISN + 1), TcpFlags::default()),
        &data,
    );
    let (a1, _) = one(&mut b, ms(2));
    assert_eq!(a1.ack, Some(base));
    assert_eq!(a1.options.sack_blocks, [block(100, 200), None, None, None]);
    b.handle_segment(
        ms(3),
        &seg(false, base + 300, Some(B_ISN + 1), TcpFlags::default()),
        &data,
    );
    let (a2, _) = one(&mut b, ms(3));
    assert_eq!(
        a2.options.sack_blocks,
        [block(300, 400), block(100, 200), None, None]
    );
    b.handle_segment(
        ms(4),
        &seg(false, base + 200, Some(B_ISN + 1), TcpFlags::default()),
        &data,
    );
    let (a3, _) = one(&mut b, ms(4));
    assert_eq!(a3.options.sack_blocks, [block(100, 400), None, None, None]);
    // The gap fills: immediate cumulative ACK, no blocks.
    b.handle_segment(
        ms(5),
        &seg(false, base, Some(B_ISN + 1), TcpFlags::default()),
        &data,
    );
    let (a4, _) = one(&mut b, ms(5));
    assert_eq!(a4.ack, Some(base + 400));
    assert_eq!(a4.options.sack_blocks, [None; 4]);
    let mut buf = [0u8; 1000];
    assert_eq!(b.recv(&mut buf), Ok(400));
}

#[test]
fn out_of_order_range_limit_drops_and_counts() {
    let cfg = Config {
        max_ooo_ranges: 2,
        ..Config::default()
    };
    let (mut b, _) = passive_b(cfg, TcpOptions::default());
    let base = A_ISN + 1;
    for (i, off) in [100usize, 300, 500].into_iter().enumerate() {
        b.handle_segment(
            ms(2 + i as u64),
            &seg(false, base + off, Some(B_ISN + 1), TcpFlags::default()),
            &[7u8; 50],
        );
        let _ = drain(&mut b, ms(2 + i as u64));
    }
    assert_eq!(b.stats().ooo_dropped, 1);
    // In-order data is always taken, even with the ranges exhausted.
    b.handle_segment(
        ms(9),
        &seg(false, base, Some(B_ISN + 1), TcpFlags::default()),
        &[7u8; 100],
    );
    assert_eq!(b.recv_queue(), 150);
    let (ack, _) = one(&mut b, ms(9));
    assert_eq!(ack.ack, Some(base + 150));
}

#[test]
fn window_scale_for_large_buffers_and_peer_clamp() {
    // 1 MiB needs shift 5 (2^20 >> 4 = 65536 does not fit); a peer's 15 becomes 14.
    // Without auto-tuning, whose maximum would set the shift instead.
    let cfg = Config {
        rx_buffer: 1 << 20,
        rx_buffer_max: None,
        ..Config::default()
    };
    let options = TcpOptions {
        window_scale: Some(15),
        ..TcpOptions::default()
    };
    let (mut b, syn_ack) = passive_b(cfg.clone(), options);
    assert_eq!(syn_ack.options.window_scale, Some(5));
    assert_eq!(b.window_scales(), (5, 14));
    assert_eq!(b.peer_window(), 65535 << 14);
    b.handle_segment(
        ms(2),
        &seg(false, A_ISN + 1, Some(B_ISN + 1), TcpFlags::default()),
        &[1u8; 10],
    );
    b.handle_segment(
        ms(2),
        &seg(false, A_ISN + 11, Some(B_ISN + 1), TcpFlags::default()),
        &[1u8; 10],
    );
    let (ack, _) = one(&mut b, ms(2));
    // Never more than the free space: (2^20 - 20) >> 5, rounded down.
    assert_eq!(ack.window, (((1 << 20) - 20) >> 5) as u16);
    // 4 MiB needs shift 7; without the peer's option nothing is scaled.
    let cfg4 = Config {
        rx_buffer: 4 << 20,
        rx_buffer_max: None,
        ..Config::default()
    };
    let (_, syn_ack) = passive_b(
        cfg4.clone(),
        TcpOptions {
            window_scale: Some(0),
            ..TcpOptions::default()
        },
    );
    assert_eq!(syn_ack.options.window_scale, Some(7));
    let (b, syn_ack) = passive_b(cfg4, TcpOptions::default());
    assert_eq!(syn_ack.options.window_scale, None);
    assert_eq!(b.window_scales(), (0, 0));
}

#[test]
fn delayed_ack_timer_and_second_segment_race() {
    // Without the quick-ACK budget, which would acknowledge the first segments at once.
    let cfg = Config {
        quick_ack_segments: 0,
        ..Config::default()
    };
    let (mut b, _) = passive_b(cfg, TcpOptions::default());
    let base = A_ISN + 1;
    b.handle_segment(
        ms(10),
        &seg(false, base, Some(B_ISN + 1), TcpFlags::default()),
        &[1u8; 1460],
    );
    nothing(&mut b, ms(10));
    assert_eq!(b.poll_timeout(), Some(ms(50)));
    // The second full-sized segment just before the timer: immediate ACK, timer cleared.
    b.handle_segment(
        ms(49),
        &seg(false, base + 1460, Some(B_ISN + 1), TcpFlags::default()),
        &[1u8; 1460],
    );
    let (ack, _) = one(&mut b, ms(49));
    assert_eq!(ack.ack, Some(base + 2920));
    assert_eq!(b.poll_timeout(), None);
    b.handle_timeout(ms(50));
    nothing(&mut b, ms(50));
    // A third segment starts a fresh 40 ms timer.
    b.handle_segment(
        ms(60),
        &seg(false, base + 2920, Some(B_ISN + 1), TcpFlags::default()),
        &[1u8; 1460],
    );
    nothing(&mut b, ms(60));
    assert_eq!(b.poll_timeout(), Some(ms(100)));
    b.handle_timeout(ms(100));
    let (ack, _) = one(&mut b, ms(100));
    assert_eq!(ack.ack, Some(base + 4380));
}

#[test]
fn rto_restarts_on_partial_ack_and_backoff_resets_on_sample() {
    let cfg = Config {
        timestamps: false,
        sack: false,
        ..Config::default()
    };
    let mut a = Connection::connect(cfg, A_ADDR, B_ADDR, A_ISN, ms(0));
    let _ = one(&mut a, ms(0));
    let mut syn_ack = seg(true, B_ISN, Some(A_ISN + 1), TcpFlags::SYN);
    syn_ack.options.mss = Some(1460);
    a.handle_segment(ms(10), &syn_ack, &[]);
    let _ = one(&mut a, ms(10));
    a.set_nodelay(true);
    a.send(&[1u8; 1000]).unwrap();
    let _ = one(&mut a, ms(20));
    a.send(&[1u8; 1000]).unwrap();
    let _ = one(&mut a, ms(30));
    assert_eq!(a.poll_timeout(), Some(ms(220)));
    // Partial ACK at 100 ms: the timer restarts from now (RFC 6298 §5.3, smoltcp #1018).
    a.handle_segment(
        ms(100),
        &seg(true, B_ISN + 1, Some(A_ISN + 1001), TcpFlags::default()),
        &[],
    );
    assert_eq!(a.poll_timeout(), Some(ms(300)));
    a.handle_timeout(ms(300));
    let (r, _) = one(&mut a, ms(300));
    assert_eq!(r.seq, A_ISN + 1001);
    assert_eq!(a.stats().rto, Duration::from_millis(400));
    // The ACK of the retransmission gives no sample (Karn) so the backoff stays for the
    // next send; a later clean sample clears it.
    a.handle_segment(
        ms(310),
        &seg(true, B_ISN + 1, Some(A_ISN + 2001), TcpFlags::default()),
        &[],
    );
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(a.stats().rto, Duration::from_millis(400));
    a.send(&[1u8; 10]).unwrap();
    let _ = one(&mut a, ms(320));
    assert_eq!(a.poll_timeout(), Some(ms(720)));
    a.handle_segment(
        ms(330),
        &seg(true, B_ISN + 1, Some(A_ISN + 2011), TcpFlags::default()),
        &[],
    );
    assert_eq!(a.stats().rto, Duration::from_millis(200));
}

#[test]
fn user_timeout_on_data_sends_rst() {
    let cfg = Config {
        user_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let mut p = Pair::new(cfg, Config::default(), MS);
    p.run_until(|p| p.b.state() == State::Established, 10);
    let start = p.now;
    p.a.send(b"are you there").unwrap();
    let _ = one(&mut p.a, start);
    // A lone segment: the tail loss probe takes the first RTO's instant (0.2 s, RFC 8985
    // §7.2, without backing off), then the RTO from there, doubling: 0.4, 0.8, 1.6, 3.2 s;
    // then the 5 s user timeout.
    let mut now = start;
    let mut retransmissions = 0;
    while let Some(t) = p.a.poll_timeout() {
        now = t;
        p.a.handle_timeout(now);
        for (repr, _) in drain(&mut p.a, now) {
            if repr.flags.rst() {
                assert_eq!(repr.seq, A_ISN + 14);
            } else {
                retransmissions += 1;
            }
        }
    }
    assert_eq!(now, start + Duration::from_secs(5));
    assert_eq!(retransmissions, 5);
    assert_eq!(p.a.stats().tail_loss_probes, 1);
    assert_eq!(p.a.stats().rto_timeouts, 4);
    assert_eq!(p.a.error(), Some(TcpError::TimedOut));
    assert_eq!(p.a.send(b"x"), Err(TcpError::TimedOut));
    assert!(p.a.is_closed());
}

#[test]
fn keepalive_probes_then_gives_up() {
    let cfg = Config {
        keepalive: Some(Duration::from_secs(10)),
        ..Config::default()
    };
    let (mut b, _) = passive_b(cfg, TcpOptions::default());
    assert_eq!(b.poll_timeout(), Some(ms(10_001)));
    let mut now = ms(10_001);
    for probe in 0..KEEPALIVE_PROBES {
        assert_eq!(b.poll_timeout(), Some(now));
        b.handle_timeout(now);
        let (k, payload) = one(&mut b, now);
        assert_eq!((k.seq, payload.len()), (B_ISN, 0), "probe {probe}");
        assert_eq!(k.ack, Some(A_ISN + 1));
        now += Duration::from_secs(10);
    }
    b.handle_timeout(now);
    assert_eq!(b.error(), Some(TcpError::TimedOut));
    let (rst, _) = one(&mut b, now);
    assert!(rst.flags.rst());

    // An answer resets the count.
    let cfg = Config {
        keepalive: Some(Duration::from_secs(10)),
        ..Config::default()
    };
    let (mut b, _) = passive_b(cfg, TcpOptions::default());
    b.handle_timeout(ms(10_001));
    let (k, _) = one(&mut b, ms(10_001));
    let answer = seg(false, A_ISN + 1, Some(B_ISN + 1), TcpFlags::default());
    assert_eq!(k.seq + 1, answer.ack.unwrap());
    b.handle_segment(ms(10_002), &answer, &[]);
    assert_eq!(b.poll_timeout(), Some(ms(20_002)));
}

#[test]
fn keepalive_interval_and_probe_count_bound_detection() {
    // Idle 10 s, then 3 probes 1 s apart: a dead peer is given up on exactly
    // idle + probes × interval after the last segment received from it.
    let cfg = Config {
        keepalive: Some(Duration::from_secs(10)),
        keepalive_interval: Some(Duration::from_secs(1)),
        keepalive_probes: 3,
        ..Config::default()
    };
    let (mut b, _) = passive_b(cfg.clone(), TcpOptions::default());
    // The handshake's ACK arrived at 1 ms.
    let start = ms(1);
    assert_eq!(b.poll_timeout(), Some(start + Duration::from_secs(10)));
    let mut now = start + Duration::from_secs(10);
    for probe in 0..3 {
        assert_eq!(b.poll_timeout(), Some(now), "probe {probe}");
        b.handle_timeout(now);
        let (k, payload) = one(&mut b, now);
        // RFC 9293 §3.8.4: SEG.SEQ = SND.NXT - 1, no data, ACK of what we have.
        assert_eq!((k.seq, payload.len()), (B_ISN, 0), "probe {probe}");
        assert_eq!(k.ack, Some(A_ISN + 1));
        assert!(!k.flags.rst());
        now += Duration::from_secs(1);
    }
    assert_eq!(b.poll_timeout(), Some(start + Duration::from_secs(13)));
    b.handle_timeout(now);
    assert_eq!(b.error(), Some(TcpError::TimedOut));
    let (rst, _) = one(&mut b, now);
    assert!(rst.flags.rst());
    assert_eq!(rst.seq, B_ISN + 1);
    assert!(b.is_closed());
    assert_eq!(b.poll_timeout(), None);

    // An answer to the second probe restarts the idle time and the count.
    let (mut b, _) = passive_b(cfg, TcpOptions::default());
    let t1 = start + Duration::from_secs(10);
    b.handle_timeout(t1);
    let _ = one(&mut b, t1);
    let t2 = t1 + Duration::from_secs(1);
    b.handle_timeout(t2);
    let (k, _) = one(&mut b, t2);
    let answer = seg(false, A_ISN + 1, Some(k.seq + 1), TcpFlags::default());
    let t3 = t2 + Duration::from_millis(5);
    b.handle_segment(t3, &answer, &[]);
    nothing(&mut b, t3);
    assert_eq!(b.poll_timeout(), Some(t3 + Duration::from_secs(10)));
    let mut now = t3 + Duration::from_secs(10);
    for _ in 0..3 {
        b.handle_timeout(now);
        let (k, _) = one(&mut b, now);
        assert!(!k.flags.rst());
        now += Duration::from_secs(1);
    }
    assert_eq!(b.error(), None);
    b.handle_timeout(now);
    assert_eq!(b.error(), Some(TcpError::TimedOut));
}

#[test]
fn keepalive_zero_probes_counts_as_one() {
    let cfg = Config {
        keepalive: Some(Duration::from_secs(2)),
        keepalive_interval: Some(Duration::from_millis(500)),
        keepalive_probes: 0,
        ..Config::default()
    };
    let (mut b, _) = passive_b(cfg, TcpOptions::default());
    let first = ms(1) + Duration::from_secs(2);
    b.handle_timeout(first);
    let (k, _) = one(&mut b, first);
    assert!(!k.flags.rst(), "a probe first, never an RST without one");
    assert_eq!(b.error(), None);
    let give_up = first + Duration::from_millis(500);
    assert_eq!(b.poll_timeout(), Some(give_up));
    b.handle_timeout(give_up);
    assert_eq!(b.error(), Some(TcpError::TimedOut));
}

#[test]
fn keepalive_defaults_unchanged() {
    let d = Config::default();
    assert_eq!(d.keepalive, None);
    assert_eq!(d.keepalive_interval, None);
    assert_eq!(d.keepalive_probes, KEEPALIVE_PROBES);
}

#[test]
fn time_wait_new_syn_rfc6191() {
    let cfg = Config {
        time_wait: Duration::from_secs(30),
        ..Config::default()
    };
    let mut p = Pair::new(cfg.clone(), cfg, MS);
    p.run_until(|p| p.b.state() == State::Established, 10);
    p.a.close();
    p.run_until(|p| p.b.state() == State::CloseWait, 10);
    p.b.close();
    p.run_until(
        |p| p.a.state() == State::TimeWait && p.b.state() == State::Closed,
        10,
    );
    let (_, _, rcv_nxt) = p.a.sequence_state();
    let last_tsval = 1; // older than anything B sent
    let mut syn = seg(true, rcv_nxt + 100_000, None, TcpFlags::SYN);
    syn.options.timestamp = Some((timestamp_value(p.now, 0) + 1, 0));
    assert!(p.a.accepts_new_syn_in_time_wait(&syn));
    syn.options.timestamp = Some((last_tsval, 0));
    assert!(!p.a.accepts_new_syn_in_time_wait(&syn));
    // Without timestamps the sequence number decides.
    syn.options.timestamp = None;
    assert!(p.a.accepts_new_syn_in_time_wait(&syn));
    syn.seq = rcv_nxt - 5;
    assert!(!p.a.accepts_new_syn_in_time_wait(&syn));
    // Inside the connection, a SYN in TIME-WAIT only draws a challenge ACK.
    p.a.handle_segment(p.now, &syn, &[]);
    let now = p.now;
    let (ack, _) = one(&mut p.a, now);
    assert_eq!(ack.flags, TcpFlags::ACK);
    assert_eq!(p.a.state(), State::TimeWait);
}

#[test]
fn abort_sends_rst_and_closes() {
    let mut p = Pair::new(Config::default(), Config::default(), MS);
    p.run_until(|p| p.b.state() == State::Established, 10);
    p.a.send(b"data").unwrap();
    let now = p.now;
    let _ = one(&mut p.a, now);
    p.a.abort();
    assert_eq!(p.a.state(), State::Closed);
    assert!(!p.a.is_closed());
    let (rst, _) = one(&mut p.a, now);
    assert_eq!(
        (rst.seq, rst.ack, rst.flags),
        (A_ISN + 5, None, TcpFlags::RST)
    );
    assert!(p.a.is_closed());
    // B only takes it once it reaches RCV.NXT exactly (the data is still in flight).
    p.b.handle_segment(now, &rst, &[]);
    assert_eq!(p.b.state(), State::Established);
    assert_eq!(p.b.stats().challenge_acks, 1);
}

#[test]
fn passive_rst_and_synack_loss() {
    let (mut b, _) = {
        let syn = seg(false, A_ISN, None, TcpFlags::SYN);
        let mut b =
            Connection::accept(Config::default(), B_ADDR, A_ADDR, &syn, B_ISN, ms(0)).unwrap();
        let sa = one(&mut b, ms(0));
        // The SYN is retransmitted (our SYN-ACK was lost): the SYN-ACK is resent.
        b.handle_segment(ms(5), &syn, &[]);
        let (again, _) = one(&mut b, ms(5));
        assert_eq!(
            again,
            TcpRepr {
                options: again.options,
                ..sa.0
            }
        );
        (b, sa)
    };
    b.handle_segment(ms(6), &seg(false, A_ISN + 1, None, TcpFlags::RST), &[]);
    assert_eq!(b.state(), State::Closed);
    assert_eq!(b.error(), Some(TcpError::Reset));
}

/// `recv_with` reads like `recv` (data, `WouldBlock`, end of stream after the FIN), hands
/// out at most `max` bytes, and opens the window like a read.
#[test]
fn recv_with_reads_like_recv() {
    let mut p = Pair::new(Config::default(), Config::default(), 5 * MS);
    p.run_until(|p| p.b.state() == State::Established, 10);
    let mut got = Vec::new();
    assert_eq!(
        p.b.recv_with(16, |s| got.extend_from_slice(s)),
        Err(TcpError::WouldBlock)
    );
    p.a.send(b"hello world").unwrap();
    p.a.close();
    let now = p.now;
    let (seg, payload) = one(&mut p.a, now);
    assert!(seg.flags.fin());
    p.b.handle_segment(now, &seg, &payload);
    // Nothing readable is handed out for max == 0, and the bytes stay.
    assert_eq!(p.b.recv_with(0, |_| panic!("max 0")), Ok(0));
    assert_eq!(p.b.recv_with(5, |s| got.extend_from_slice(s)), Ok(5));
    assert_eq!(got, b"hello");
    assert_eq!(p.b.recv_with(64, |s| got.extend_from_slice(s)), Ok(6));
    assert_eq!(got, b"hello world");
    // Then the end of stream, as recv reports it.
    assert_eq!(p.b.recv_with(64, |_| panic!("no bytes left")), Ok(0));
    let mut buf = [0u8; 4];
    assert_eq!(p.b.recv(&mut buf), Ok(0));
}
