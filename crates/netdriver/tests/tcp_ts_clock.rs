//! The timestamp clock (RFC 7323 §5.4): our TSval ticks once per millisecond (plus a
//! per-connection offset), so that a peer's PAWS (§5), which forgives an old TSval only
//! after 24 days idle (Linux's TS.Recent ageing), keeps taking our segments after hours of
//! idleness; RTT samples still have µs resolution (per-segment send times), and the echo
//! still tells a retransmission's ACK apart when it is unambiguous.

mod tcp_support_b;

use netdriver::tcp::{Config, Connection, SeqNumber, State};
use netdriver::time::{Duration, Instant};
use netdriver::wire::tcp::{TcpFlags, TcpOptions, TcpRepr};
use tcp_support_b::*;

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

fn ts_peer() -> PeerOpts {
    PeerOpts {
        mss: Some(1012),
        ..PeerOpts::with_ts()
    }
}

fn tsval(seg: &Seg) -> u32 {
    seg.repr.options.timestamp.expect("timestamps negotiated").0
}

/// Sends one byte (the `n`-th of the stream), returns the segment's TSval, and has the
/// peer (which sent `p` bytes so far) acknowledge it at once.
fn one_byte_tsval_after(t: &mut Tcb, n: usize, p: usize) -> u32 {
    t.app_send(&[n as u8]);
    let seg = t.poll().expect("the byte goes out");
    assert_eq!(seg.repr.seq, l(n));
    t.expect_none();
    t.send(t.seg().seq(r(p)).ack(l(n + 1)));
    assert_eq!(t.stats().bytes_in_flight, 0);
    tsval(&seg)
}

fn one_byte_tsval(t: &mut Tcb, n: usize) -> u32 {
    one_byte_tsval_after(t, n, 0)
}

#[test]
fn tsval_advances_by_one_per_millisecond() {
    let mut t = Tcb::established(test_config(), ts_peer());
    t.conn.set_nodelay(true);
    // The handshake ACK left at T0 + 10 ms: 10 010 ms, offset 0.
    assert_eq!(t.last_tsval, 10_010);
    assert_eq!(one_byte_tsval(&mut t, 0), 10_010);
    t.advance(us(999));
    assert_eq!(one_byte_tsval(&mut t, 1), 10_010, "same millisecond");
    t.advance(us(1));
    assert_eq!(one_byte_tsval(&mut t, 2), 10_011);
    t.advance(ms(1));
    assert_eq!(one_byte_tsval(&mut t, 3), 10_012);
    t.advance(ms(1000));
    assert_eq!(one_byte_tsval(&mut t, 4), 11_012);
    t.advance(Duration::from_secs(3600));
    assert_eq!(one_byte_tsval(&mut t, 5), 3_611_012);
}

#[test]
fn the_per_connection_offset_is_added_and_wraps() {
    let mut c = Connection::connect(
        Config::default(),
        local_addr(),
        remote_addr(),
        SeqNumber(LOCAL_ISN),
        Instant::from_millis(10),
    );
    c.set_ts_offset(u32::MAX - 4);
    let mut buf = [0u8; 64];
    let syn = c.poll_transmit(Instant::from_millis(10), &mut buf).unwrap();
    assert_eq!(syn.repr.options.timestamp, Some((5, 0)));
}

/// A PAWS check as Linux does it (RFC 7323 §5.3 R1 with the §5.5 idle rule of 24 days):
/// TS.Recent from the last segment taken, and when it was taken.
struct LinuxPaws {
    ts_recent: u32,
    stamp: Instant,
}

impl LinuxPaws {
    const IDLE: Duration = Duration::from_secs(24 * 24 * 3600);

    fn accepts(&mut self, tsval: u32, now: Instant) -> bool {
        let ok = (tsval.wrapping_sub(self.ts_recent) as i32) >= 0
            || now.saturating_duration_since(self.stamp) > Self::IDLE;
        if ok {
            self.ts_recent = tsval;
            self.stamp = now;
        }
        ok
    }
}

#[test]
fn a_microsecond_clock_would_be_rejected_after_two_hours() {
    // The bug this clock fixes: 2 h of µs ticks is more than half the TSval space, and
    // far less than Linux's 24 days of forgiveness.
    let mut peer = LinuxPaws {
        ts_recent: 1_000_000,
        stamp: T0,
    };
    let two_hours = Duration::from_secs(7200);
    let us_tsval = 1_000_000u32.wrapping_add(two_hours.as_micros() as u32);
    assert!(!peer.accepts(us_tsval, T0 + two_hours));
    let ms_tsval = 1_000_000u32.wrapping_add(two_hours.as_millis() as u32);
    assert!(peer.accepts(ms_tsval, T0 + two_hours));
}

#[test]
fn idle_for_hours_and_days_still_passes_a_linux_peers_paws() {
    let mut t = Tcb::established(test_config(), ts_peer());
    t.conn.set_nodelay(true);
    let mut peer = LinuxPaws {
        ts_recent: t.last_tsval,
        stamp: t.now,
    };
    let idles = [
        Duration::from_secs(2 * 3600),
        Duration::from_secs(37 * 60),
        Duration::from_secs(24 * 3600),
        Duration::from_secs(20 * 24 * 3600),
    ];
    // Bytes sent so far by us and by the peer.
    let (mut n, mut p) = (0, 0);
    for idle in idles {
        let before = one_byte_tsval_after(&mut t, n, p);
        n += 1;
        assert!(peer.accepts(before, t.now));
        t.advance(idle);
        // Our next segment's TSval is "after" the peer's TS.Recent: taken, and not by the
        // idle rule (less than 24 days passed).
        assert!(idle < LinuxPaws::IDLE);
        t.app_send(&[7]);
        let seg = t.poll().expect("data after the idle period");
        assert_eq!(seg.repr.seq, l(n));
        assert!(
            (tsval(&seg).wrapping_sub(peer.ts_recent) as i32) > 0,
            "TSval {} not after {} following {idle:?} idle",
            tsval(&seg),
            peer.ts_recent
        );
        assert!(peer.accepts(tsval(&seg), t.now));
        n += 1;
        // The peer's ACK and data (its own ms clock moved on as much) pass our PAWS.
        t.send(t.seg().seq(r(p)).ack(l(n)));
        assert_eq!(t.stats().bytes_in_flight, 0);
        let d = data(10);
        t.send(t.seg().seq(r(p)).ack(l(n)).payload(&d));
        p += 10;
        // (Receiver SWS avoidance keeps the right edge: the window shrinks by what came.)
        t.expect(t.out().seq(l(n)).ack(r(p)).win(t.window_for(BUF - p)));
        assert_eq!(t.app_recv(10), d);
        assert_eq!(t.stats().paws_rejected, 0);
        assert_eq!(t.conn.state(), State::Established);
    }
}

/// A connection opened at `t0` whose peer answers with timestamps `rtt` later.
fn open_with_rtt(config: Config, t0: Instant, rtt: Duration) -> (Connection, u32) {
    let mut c = Connection::connect(
        config,
        local_addr(),
        remote_addr(),
        SeqNumber(LOCAL_ISN),
        t0,
    );
    let mut buf = [0u8; 64];
    let syn = c.poll_transmit(t0, &mut buf).unwrap().repr;
    let synack = TcpRepr {
        src_port: REMOTE_PORT,
        dst_port: LOCAL_PORT,
        seq: SeqNumber(REMOTE_ISN),
        ack: Some(SeqNumber(LOCAL_ISN) + 1),
        flags: TcpFlags::SYN | TcpFlags::ACK,
        window: 65535,
        urgent: 0,
        options: TcpOptions {
            mss: Some(1012),
            sack_permitted: true,
            timestamp: Some((5000, syn.options.timestamp.unwrap().0)),
            ..TcpOptions::default()
        },
    };
    c.handle_segment(t0 + rtt, &synack, &[]);
    assert_eq!(c.state(), State::Established);
    let ack = c.poll_transmit(t0 + rtt, &mut buf).unwrap().repr;
    assert!(c.poll_transmit(t0 + rtt, &mut buf).is_none());
    (c, ack.options.timestamp.unwrap().0)
}

/// The peer's ACK of our bytes up to `ack` (data byte numbers), echoing `tsecr`.
fn peer_ack(ack: usize, tsecr: u32) -> TcpRepr {
    TcpRepr {
        src_port: REMOTE_PORT,
        dst_port: LOCAL_PORT,
        seq: r(0),
        ack: Some(l(ack)),
        flags: TcpFlags::ACK,
        window: 65535,
        urgent: 0,
        options: TcpOptions {
            timestamp: Some((6000, tsecr)),
            ..TcpOptions::default()
        },
    }
}

/// Polls one data segment: (seq, TSval).
fn poll_data(c: &mut Connection, now: Instant) -> (SeqNumber, u32) {
    let mut buf = [0u8; 2048];
    let t = c.poll_transmit(now, &mut buf).expect("a segment");
    assert!(t.payload_len > 0);
    (t.repr.seq, t.repr.options.timestamp.unwrap().0)
}

#[test]
fn rtt_stays_accurate_to_the_microsecond() {
    let config = Config {
        min_rto: ms(1),
        initial_rto: ms(200),
        tail_loss_probe: false,
        delayed_ack: None,
        ..Config::default()
    };
    // The SYN leaves 10 µs before a millisecond boundary, the SYN-ACK comes 37 µs later:
    // the echo is one tick old (a TSval RTT would say 1000 µs), the RTT is 37 µs.
    let t0 = Instant::from_micros(10_000_990);
    let (mut c, syn_ts) = open_with_rtt(config, t0, us(37));
    assert_eq!(syn_ts, 10_001);
    assert_eq!(c.stats().srtt, Some(us(37)));
    c.set_nodelay(true);

    // A data segment echoed in the same millisecond: 37 µs, not 0.
    let t1 = t0 + ms(5);
    c.send(&[1; 100]).unwrap();
    let (seq, ts) = poll_data(&mut c, t1);
    assert_eq!(seq, l(0));
    c.handle_segment(t1 + us(37), &peer_ack(100, ts), &[]);
    assert_eq!(c.stats().srtt, Some(us(37)));
    assert_eq!(c.stats().rto, ms(1));

    // Two segments 10 µs apart, one (delayed) ACK for both: the older one is timed
    // (what the echo names, RFC 7323 §4.3).
    let t2 = t1 + ms(5);
    c.send(&[2; 100]).unwrap();
    let (_, ts) = poll_data(&mut c, t2);
    c.send(&[3; 100]).unwrap();
    let _ = poll_data(&mut c, t2 + us(10));
    c.handle_segment(t2 + us(37), &peer_ack(300, ts), &[]);
    assert_eq!(c.stats().srtt, Some(us(37)));

    // A retransmission by RTO, 1 ms or more after the original: an ACK echoing the
    // retransmission's TSval times it, to the µs; the backoff is cancelled.
    let t3 = t2 + ms(5);
    c.send(&[4; 100]).unwrap();
    let (_, orig_ts) = poll_data(&mut c, t3);
    let rto_at = c.poll_timeout().unwrap();
    assert_eq!(rto_at, t3 + ms(1));
    c.handle_timeout(rto_at);
    let (seq, rtx_ts) = poll_data(&mut c, rto_at);
    assert_eq!(seq, l(300));
    assert_eq!(rtx_ts, orig_ts + 1);
    assert_eq!(c.stats().rto, ms(2), "backed off");
    c.handle_segment(rto_at + us(37), &peer_ack(400, rtx_ts), &[]);
    assert_eq!(c.stats().srtt, Some(us(37)));
    assert_eq!(c.stats().rto, ms(1));

    // The same, but the ACK echoes the original's TSval: the original arrived late, and
    // no sample is taken (Karn); the backoff stays.
    let t4 = t3 + ms(5);
    c.send(&[5; 100]).unwrap();
    let (_, orig_ts) = poll_data(&mut c, t4);
    let rto_at = c.poll_timeout().unwrap();
    c.handle_timeout(rto_at);
    let _ = poll_data(&mut c, rto_at);
    c.handle_segment(rto_at + us(5), &peer_ack(500, orig_ts), &[]);
    assert_eq!(c.stats().srtt, Some(us(37)));
    assert_eq!(c.stats().rto, ms(2), "no sample, the backoff stays");
    assert_eq!(c.stats().bytes_in_flight, 0);
}

/// Regression (found on the bed: 11,910 segments dropped by the peer's PAWS in one
/// isolation benchmark run, each then resent): several threads drove one connection, each
/// reading the clock before taking it, so one could call in with an instant older than
/// the last call's; any caller may still do so. A TSval from that older instant lies below
/// the peer's TS.Recent and the peer drops the segment (RFC 7323 §5.3 R1). The
/// connection's clock never runs backwards: an older `now` counts as the newest seen.
#[test]
fn an_older_now_never_lowers_the_tsval() {
    let mut t = Tcb::established(test_config(), ts_peer());
    t.conn.set_nodelay(true);
    let later = t.now + ms(5);
    t.app_send(&[1]);
    let mut buf = [0u8; 2048];
    let first = t
        .conn
        .poll_transmit(later, &mut buf)
        .expect("the byte goes out");
    let first_ts = first.repr.options.timestamp.unwrap().0;
    assert_eq!(first_ts, t.last_tsval + 5, "5 ms after the handshake's ACK");
    // Another thread calls in with the instant it read before this one.
    t.app_send(&[2]);
    let second = t
        .conn
        .poll_transmit(later - ms(3), &mut buf)
        .expect("the byte goes out");
    assert_eq!(second.repr.seq, l(1));
    assert_eq!(second.repr.options.timestamp.unwrap().0, first_ts);
    // Timers and input take the newest instant as well: nothing runs backwards.
    t.conn.handle_timeout(later - ms(4));
    assert!(t.conn.poll_timeout().is_some_and(|d| d > later));
}
