//! Property tests: arbitrary segments (any flags, seq, ack, window, options, payloads up to
//! 2000 bytes) and arbitrary timer steps fed to connections in every state. The ingress
//! path must never panic (smoltcp #538, #562 were fuzzer-found panics and hangs),
//! `poll_transmit` must terminate, no timer may livelock, and memory stays within the
//! configured buffers.

mod tcp_support_b;

use netdriver::tcp::{Config, Connection, SeqNumber, State};
use netdriver::time::{Duration, Instant};
use netdriver::wire::tcp::{SackBlock, TcpFlags, TcpOptions, TcpRepr};
use proptest::prelude::*;
use tcp_support_b::*;

const RX: usize = 4096;
const TX: usize = 4096;
/// Smallest payload buffer the properties poll with (the core clamps peer MSS to >= 64).
const MIN_BUF: usize = 64;
/// Generous bound on segments one drain may produce: all of the send buffer in minimal
/// segments plus control segments.
const MAX_SEGMENTS_PER_DRAIN: usize = TX / MIN_BUF + 16;

#[derive(Debug, Clone)]
enum Op {
    Segment(TcpRepr, usize),
    Advance(u64),
    Timeout,
    Send(usize),
    Recv(usize),
    Close,
    Abort,
    Poll(usize),
}

#[derive(Debug, Clone)]
struct Knobs {
    sack: bool,
    timestamps: bool,
    wscale: Option<u8>,
    delayed_ack: bool,
    nagle: bool,
    max_ooo_ranges: usize,
    min_rto_ms: u64,
}

fn config(k: &Knobs) -> Config {
    Config {
        rx_buffer: RX,
        tx_buffer: TX,
        nagle: k.nagle,
        delayed_ack: k.delayed_ack.then(|| ms(40)),
        initial_rto: ms(200),
        min_rto: ms(k.min_rto_ms),
        max_rto: ms(5000),
        user_timeout: ms(20_000),
        time_wait: ms(2000),
        max_ooo_ranges: k.max_ooo_ranges,
        max_sack_ranges: 8,
        keepalive: Some(ms(3000)),
        ..test_config()
    }
}

fn peer(k: &Knobs) -> PeerOpts {
    PeerOpts {
        sack: k.sack,
        timestamps: k.timestamps,
        wscale: k.wscale,
        ..PeerOpts::default()
    }
}

fn drain(conn: &mut Connection, now: Instant, buf_len: usize) {
    let mut buf = vec![0u8; buf_len];
    let mut n = 0;
    while let Some(t) = conn.poll_transmit(now, &mut buf) {
        assert!(t.payload_len <= buf_len);
        assert_eq!(t.repr.src_port, LOCAL_PORT);
        assert_eq!(t.repr.dst_port, REMOTE_PORT);
        if t.repr.flags.rst() {
            assert_eq!(t.payload_len, 0, "RST with payload");
        }
        n += 1;
        assert!(
            n <= MAX_SEGMENTS_PER_DRAIN,
            "poll_transmit does not terminate ({n} segments)"
        );
    }
}

fn peer_seg(flags: TcpFlags, seq: SeqNumber, ack: Option<SeqNumber>) -> TcpRepr {
    TcpRepr {
        src_port: REMOTE_PORT,
        dst_port: LOCAL_PORT,
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

/// A connection in state number `which` (0..=9), and the time it got there.
fn connection_in_state(which: u8, k: &Knobs) -> (Connection, Instant) {
    let cfg = config(k);
    if which == 0 {
        let mut c = Connection::connect(cfg, local_addr(), remote_addr(), SeqNumber(LOCAL_ISN), T0);
        drain(&mut c, T0, 2048);
        assert_eq!(c.state(), State::SynSent);
        return (c, T0);
    }
    if which == 1 {
        let mut syn = peer_seg(TcpFlags::SYN, SeqNumber(REMOTE_ISN), None);
        syn.options.mss = Some(1000);
        syn.options.sack_permitted = k.sack;
        syn.options.window_scale = k.wscale;
        syn.options.timestamp = k.timestamps.then_some((5000, 0));
        let mut c = Connection::accept(
            cfg,
            local_addr(),
            remote_addr(),
            &syn,
            SeqNumber(LOCAL_ISN),
            T0,
        )
        .expect("accept");
        drain(&mut c, T0, 2048);
        assert_eq!(c.state(), State::SynReceived);
        return (c, T0);
    }
    let mut t = Tcb::established(cfg, peer(k));
    let feed = |t: &mut Tcb, flags: TcpFlags, ack: SeqNumber| {
        let mut s = t.seg().ack(ack).flags(flags);
        s.repr.seq = r(0);
        t.send(s);
        t.drain();
    };
    match which {
        2 => {}
        3 => {
            // FIN-WAIT-1
            t.conn.close();
            t.drain();
        }
        4 => {
            // FIN-WAIT-2
            t.conn.close();
            t.drain();
            feed(&mut t, TcpFlags::default(), l(1));
        }
        5 => {
            // CLOSE-WAIT
            feed(&mut t, TcpFlags::FIN, l(0));
        }
        6 => {
            // LAST-ACK
            feed(&mut t, TcpFlags::FIN, l(0));
            t.conn.close();
            t.drain();
        }
        7 => {
            // CLOSING
            t.conn.close();
            t.drain();
            feed(&mut t, TcpFlags::FIN, l(0));
        }
        8 => {
            // TIME-WAIT
            t.conn.close();
            t.drain();
            feed(&mut t, TcpFlags::default(), l(1));
            let mut s = t.seg().ack(l(1)).flags(TcpFlags::FIN);
            s.repr.seq = r(0);
            t.send(s);
            t.drain();
        }
        _ => {
            t.conn.abort();
            t.drain();
        }
    }
    let expected = [
        State::SynSent,
        State::SynReceived,
        State::Established,
        State::FinWait1,
        State::FinWait2,
        State::CloseWait,
        State::LastAck,
        State::Closing,
        State::TimeWait,
        State::Closed,
    ][usize::from(which)];
    assert_eq!(t.conn.state(), expected, "could not reach state {which}");
    (t.conn, t.now)
}

fn seq_near(base: SeqNumber) -> impl Strategy<Value = SeqNumber> {
    prop_oneof![
        3 => (-3000i32..20_000).prop_map(move |off| SeqNumber(base.0.wrapping_add(off as u32))),
        1 => any::<u32>().prop_map(SeqNumber),
    ]
}

fn sack_block() -> impl Strategy<Value = Option<SackBlock>> {
    prop_oneof![
        1 => Just(None),
        2 => (seq_near(l(0)), seq_near(l(0)))
            .prop_map(|(left, right)| Some(SackBlock { left, right })),
    ]
}

fn options() -> impl Strategy<Value = TcpOptions> {
    (
        proptest::option::of(any::<u16>()),
        proptest::option::of(any::<u8>()),
        any::<bool>(),
        proptest::array::uniform4(sack_block()),
        proptest::option::of((any::<u32>(), any::<u32>())),
    )
        .prop_map(
            |(mss, window_scale, sack_permitted, sack_blocks, timestamp)| TcpOptions {
                mss,
                window_scale,
                sack_permitted,
                sack_blocks,
                timestamp,
            },
        )
}

fn repr() -> impl Strategy<Value = TcpRepr> {
    (
        (prop_oneof![4 => Just(REMOTE_PORT), 1 => any::<u16>()]),
        (prop_oneof![4 => Just(LOCAL_PORT), 1 => any::<u16>()]),
        seq_near(r(0)),
        proptest::option::of(seq_near(l(0))),
        prop_oneof![
            3 => Just(TcpFlags::default()),
            1 => Just(TcpFlags::FIN),
            1 => Just(TcpFlags::SYN),
            1 => Just(TcpFlags::RST),
            2 => any::<u8>().prop_map(TcpFlags),
        ],
        any::<u16>(),
        any::<u16>(),
        options(),
    )
        .prop_map(
            |(src_port, dst_port, seq, ack, flags, window, urgent, options)| TcpRepr {
                src_port,
                dst_port,
                seq,
                ack,
                flags: if ack.is_some() {
                    flags | TcpFlags::ACK
                } else {
                    flags
                },
                window,
                urgent,
                options,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (repr(), 0usize..=2000).prop_map(|(r, n)| Op::Segment(r, n)),
        2 => (0u64..3000).prop_map(Op::Advance),
        2 => Just(Op::Timeout),
        2 => (0usize..6000).prop_map(Op::Send),
        2 => (0usize..6000).prop_map(Op::Recv),
        1 => Just(Op::Close),
        1 => (MIN_BUF..3000).prop_map(Op::Poll),
        1 => Just(Op::Abort),
    ]
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(0u8..=15),
        any::<bool>(),
        any::<bool>(),
        1usize..20,
        1u64..300,
    )
        .prop_map(
            |(sack, timestamps, wscale, delayed_ack, nagle, max_ooo_ranges, min_rto_ms)| Knobs {
                sack,
                timestamps,
                wscale,
                delayed_ack,
                nagle,
                max_ooo_ranges,
                min_rto_ms,
            },
        )
}

fn check_bounds(conn: &Connection) {
    assert!(conn.send_queue() <= TX, "send queue {}", conn.send_queue());
    assert!(conn.recv_queue() <= RX, "recv queue {}", conn.recv_queue());
    let s = conn.stats();
    assert!(s.send_queue <= TX);
    assert!(s.recv_queue <= RX);
    assert!(
        s.bytes_in_flight <= TX + 2,
        "in flight {}",
        s.bytes_in_flight
    );
    assert!(s.rto <= ms(5000));
}

fn run(which: u8, k: &Knobs, ops: &[Op]) {
    let (mut conn, mut now) = connection_in_state(which, k);
    let payload = data(2000);
    for op in ops {
        match op {
            Op::Segment(repr, n) => conn.handle_segment(now, repr, &payload[..*n]),
            Op::Advance(d) => now += ms(*d),
            Op::Timeout => {
                if let Some(t) = conn.poll_timeout() {
                    now = now.max(t);
                }
                conn.handle_timeout(now);
            }
            Op::Send(n) => {
                let _ = conn.send(&payload[..(*n).min(2000)]);
            }
            Op::Recv(n) => {
                let mut buf = vec![0u8; *n];
                let _ = conn.recv(&mut buf);
            }
            Op::Close => conn.close(),
            Op::Abort => conn.abort(),
            Op::Poll(size) => drain(&mut conn, now, *size),
        }
        drain(&mut conn, now, 2048);
        check_bounds(&conn);
        // No livelock: after running timers at `now` and draining, the next deadline is
        // strictly in the future.
        conn.handle_timeout(now);
        drain(&mut conn, now, 2048);
        if let Some(t) = conn.poll_timeout() {
            assert!(t > now, "deadline {t:?} not after now {now:?}: livelock");
        }
    }
    // Whatever happened, the connection winds down: with no more input, timers alone
    // take it to Closed or leave it idle with no deadline (or only keep-alive).
    for _ in 0..200 {
        let Some(t) = conn.poll_timeout() else { break };
        now = now.max(t) + Duration::from_micros(1);
        conn.handle_timeout(now);
        drain(&mut conn, now, 2048);
        check_bounds(&conn);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_segments_in_every_state_never_panic(
        which in 0u8..10,
        k in knobs(),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        run(which, &k, &ops);
    }

    #[test]
    fn arbitrary_segments_burst_without_time_passing(
        which in 0u8..10,
        k in knobs(),
        segs in proptest::collection::vec((repr(), 0usize..=2000), 1..60),
    ) {
        let (mut conn, now) = connection_in_state(which, &k);
        let payload = data(2000);
        let _ = conn.send(&payload);
        for (repr, n) in &segs {
            conn.handle_segment(now, repr, &payload[..*n]);
            drain(&mut conn, now, 2048);
            check_bounds(&conn);
        }
    }
}

/// Deterministic companion to the properties: each single-flag and every flag
/// combination with seq/ack at the window edges, in every state.
#[test]
fn every_flag_combination_at_window_edges_in_every_state() {
    let k = Knobs {
        sack: true,
        timestamps: true,
        wscale: Some(7),
        delayed_ack: true,
        nagle: true,
        max_ooo_ranges: 4,
        min_rto_ms: 1,
    };
    let payload = data(2000);
    for which in 0..10 {
        for flags in 0..=255u8 {
            for (seq, ack) in [
                (r(0), Some(l(0))),
                (r(0) - 1, Some(l(0) - 1)),
                (r(RX), Some(l(1))),
                (r(0) + 70_000, Some(l(0) + 100_000)),
                (SeqNumber(0), None),
            ] {
                let (mut conn, now) = connection_in_state(which, &k);
                let mut s = peer_seg(TcpFlags(flags), seq, ack);
                s.options.sack_blocks[0] = Some(SackBlock {
                    left: l(0),
                    right: l(0) + 10,
                });
                s.options.timestamp = Some((u32::MAX, 0));
                conn.handle_segment(now, &s, &payload[..100]);
                drain(&mut conn, now, 2048);
                conn.handle_timeout(now + ms(100_000));
                drain(&mut conn, now + ms(100_000), 2048);
                check_bounds(&conn);
            }
        }
    }
}
