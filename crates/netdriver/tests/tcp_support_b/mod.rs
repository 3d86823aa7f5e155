//! Exact-segment harness for the tcp-b test files (data, retransmission, recovery, windows,
//! ACK/Nagle, fuzzing).
//!
//! One [`Tcb`] drives one `Connection` from the peer's side with explicit virtual time.
//! Segments the connection emits are compared field by field with an expected [`Seg`]:
//! ports, seq, ack, flags, window, urgent, options and payload. Two fields are normalised
//! because the RFCs leave them to the implementation: the PSH bit is ignored, and the ACK
//! bit is derived from `ack.is_some()` (the wire module's convention). When timestamps are
//! negotiated the TSval we emit is not predicted (its clock is the implementation's
//! choice); the TSecr is compared exactly and TSval is checked to never go backwards.
//!
//! ISNs sit just below 2^32 so every test crosses the sequence wrap after 1000 (local) or
//! 2000 (remote) bytes.
#![allow(dead_code)]

use netdriver::tcp::congestion::CongestionAlgorithm;
use netdriver::tcp::rtt::RttEstimator;
use netdriver::tcp::{Config, Connection, SeqNumber, State, Stats, Transmit};
use netdriver::time::{Duration, Instant};
use netdriver::wire::tcp::{SackBlock, TcpFlags, TcpOptions, TcpRepr};
use std::net::{Ipv4Addr, SocketAddrV4};

pub const LOCAL_ISN: u32 = u32::MAX - 1000;
pub const REMOTE_ISN: u32 = u32::MAX - 2000;
pub const LOCAL_PORT: u16 = 4000;
pub const REMOTE_PORT: u16 = 5000;
/// The MSS the simulated peer announces; our segments must not exceed it.
pub const PEER_MSS: usize = 1000;
/// Receive and send buffers of [`test_config`].
pub const BUF: usize = 16384;
/// Start of virtual time.
pub const T0: Instant = Instant::from_millis(10_000);
/// The round trip of the harness handshake.
pub const HS_RTT: Duration = Duration::from_millis(10);

pub fn local_addr() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), LOCAL_PORT)
}

pub fn remote_addr() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), REMOTE_PORT)
}

/// Our sequence number of data byte `n` (byte 0 follows our SYN).
pub fn l(n: usize) -> SeqNumber {
    SeqNumber(LOCAL_ISN) + 1 + n
}

/// The peer's sequence number of data byte `n` (byte 0 follows its SYN).
pub fn r(n: usize) -> SeqNumber {
    SeqNumber(REMOTE_ISN) + 1 + n
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Deterministic, position-dependent payload bytes (so misplaced bytes are detected).
pub fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// Config used by most tests: 16 KiB buffers (windows fit in 16 bits unscaled), ACK for
/// every segment (delayed ACKs are tested on their own), NewReno (exact arithmetic), RTO
/// initial = minimum = 200 ms so the value after the harness handshake does not depend on
/// whether the handshake produced an RTT sample (it is 200 ms either way). No tail loss
/// probe, so that `deadline()` with data outstanding is the RTO these tests are about; the
/// probe has its own tests (`tcp_tlp.rs`), as does the default configuration
/// (`tcp_default_config.rs`).
pub fn test_config() -> Config {
    Config {
        rx_buffer: BUF,
        // A fixed window: these tests predict every advertised window and the window
        // scale from `rx_buffer` (auto-tuning has its own tests, `tcp_autotune.rs`).
        rx_buffer_max: None,
        tx_buffer: BUF,
        // A fixed send buffer, likewise (`tcp_send_autotune.rs` tests the growth).
        tx_buffer_max: None,
        delayed_ack: None,
        initial_rto: ms(200),
        min_rto: ms(200),
        congestion: CongestionAlgorithm::NewReno,
        tail_loss_probe: false,
        ..Config::default()
    }
}

/// What the simulated peer puts in its SYN or SYN-ACK.
#[derive(Debug, Clone, Copy)]
pub struct PeerOpts {
    pub mss: Option<u16>,
    pub sack: bool,
    pub wscale: Option<u8>,
    pub timestamps: bool,
    pub window: u16,
}

impl Default for PeerOpts {
    fn default() -> Self {
        PeerOpts {
            mss: Some(PEER_MSS as u16),
            sack: true,
            wscale: None,
            timestamps: false,
            window: 65535,
        }
    }
}

impl PeerOpts {
    pub fn no_sack() -> Self {
        PeerOpts {
            sack: false,
            ..PeerOpts::default()
        }
    }
    pub fn with_ts() -> Self {
        PeerOpts {
            timestamps: true,
            ..PeerOpts::default()
        }
    }
}

/// A segment: header plus payload. Used both for segments the peer sends and for the
/// segments we expect the connection to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seg {
    pub repr: TcpRepr,
    pub payload: Vec<u8>,
    /// For expected segments: ignore the TSval we emit (the TSecr is still compared).
    pub any_tsval: bool,
}

impl Seg {
    pub fn seq(mut self, seq: SeqNumber) -> Seg {
        self.repr.seq = seq;
        self
    }
    pub fn ack(mut self, ack: SeqNumber) -> Seg {
        self.repr.ack = Some(ack);
        self
    }
    pub fn no_ack(mut self) -> Seg {
        self.repr.ack = None;
        self
    }
    pub fn flags(mut self, flags: TcpFlags) -> Seg {
        self.repr.flags = flags;
        self
    }
    pub fn win(mut self, window: u16) -> Seg {
        self.repr.window = window;
        self
    }
    pub fn payload(mut self, payload: &[u8]) -> Seg {
        self.payload = payload.to_vec();
        self
    }
    /// SACK blocks as `(left, right)` pairs.
    pub fn sack(mut self, blocks: &[(SeqNumber, SeqNumber)]) -> Seg {
        let mut b = [None; 4];
        for (i, &(left, right)) in blocks.iter().enumerate() {
            b[i] = Some(SackBlock { left, right });
        }
        self.repr.options.sack_blocks = b;
        self
    }
    pub fn ts(mut self, tsval: u32, tsecr: u32) -> Seg {
        self.repr.options.timestamp = Some((tsval, tsecr));
        self
    }
    pub fn no_ts(mut self) -> Seg {
        self.repr.options.timestamp = None;
        self
    }
    pub fn options(mut self, options: TcpOptions) -> Seg {
        self.repr.options = options;
        self
    }
    pub fn len(&self) -> usize {
        self.payload.len() + usize::from(self.repr.flags.syn()) + usize::from(self.repr.flags.fin())
    }
}

fn normalise_flags(flags: TcpFlags) -> TcpFlags {
    TcpFlags(flags.0 & !(TcpFlags::ACK.0 | TcpFlags::PSH.0))
}

/// One connection driven from the peer's side.
pub struct Tcb {
    pub conn: Connection,
    pub now: Instant,
    pub rx_buffer: usize,
    /// The shift we apply to the window we advertise (0 unless both sides sent one).
    pub our_shift: u8,
    /// The shift the peer applies to its window field.
    pub peer_shift: u8,
    /// Whether timestamps were negotiated.
    pub ts: bool,
    /// The last TSval the connection sent (the peer echoes it).
    pub last_tsval: u32,
    /// The base of the peer's timestamp clock (TSval = base + ms since T0).
    pub peer_tsval: u32,
    /// The TSval the connection should echo (the last one the peer sent in order).
    pub ts_recent: u32,
    /// Reference RFC 6298 estimator, fed the same samples the connection should take.
    pub rtt: RttEstimator,
    /// The window the peer advertises in `seg()`, as a field value.
    pub peer_window: u16,
}

impl Tcb {
    /// A connection established by an active open (`connect`), with the peer answering at
    /// `T0 + HS_RTT`. `now` is left at the time the handshake ACK was emitted.
    pub fn established(config: Config, peer: PeerOpts) -> Tcb {
        let rx_buffer = config.rx_buffer;
        let (min_rto, max_rto, initial_rto) = (config.min_rto, config.max_rto, config.initial_rto);
        let mut conn = Connection::connect(
            config,
            local_addr(),
            remote_addr(),
            SeqNumber(LOCAL_ISN),
            T0,
        );
        let mut buf = vec![0u8; 65536];
        let syn = conn
            .poll_transmit(T0, &mut buf)
            .expect("connect must emit a SYN");
        assert!(syn.repr.flags.syn() && syn.repr.ack.is_none(), "{syn:?}");
        assert_eq!(syn.repr.seq, SeqNumber(LOCAL_ISN));
        assert!(conn.poll_transmit(T0, &mut buf).is_none());
        let now = T0 + HS_RTT;
        let our_shift = match (syn.repr.options.window_scale, peer.wscale) {
            (Some(s), Some(_)) => s.min(14),
            _ => 0,
        };
        let ts = syn.repr.options.timestamp.is_some() && peer.timestamps;
        let our_syn_tsval = syn.repr.options.timestamp.map_or(0, |t| t.0);
        let peer_tsval = 5_000;
        let synack = TcpRepr {
            src_port: REMOTE_PORT,
            dst_port: LOCAL_PORT,
            seq: SeqNumber(REMOTE_ISN),
            ack: Some(SeqNumber(LOCAL_ISN) + 1),
            flags: TcpFlags::SYN | TcpFlags::ACK,
            window: peer.window,
            urgent: 0,
            options: TcpOptions {
                mss: peer.mss,
                window_scale: peer.wscale,
                sack_permitted: peer.sack,
                sack_blocks: [None; 4],
                timestamp: if peer.timestamps {
                    Some((peer_tsval, our_syn_tsval))
                } else {
                    None
                },
            },
        };
        conn.handle_segment(now, &synack, &[]);
        assert_eq!(conn.state(), State::Established);
        let mut tcb = Tcb {
            conn,
            now,
            rx_buffer,
            our_shift,
            peer_shift: if syn.repr.options.window_scale.is_some() {
                peer.wscale.unwrap_or(0).min(14)
            } else {
                0
            },
            ts,
            last_tsval: our_syn_tsval,
            peer_tsval,
            rtt: RttEstimator::new(initial_rto, min_rto, max_rto),
            peer_window: peer.window,
            ts_recent: peer_tsval,
        };
        let ack = tcb.out();
        tcb.expect(ack);
        tcb.expect_none();
        if tcb.conn.stats().srtt.is_some() {
            tcb.rtt.on_sample(HS_RTT);
        }
        tcb
    }

    /// [`Tcb::established`] with [`test_config`] and default peer options (MSS 1000, SACK,
    /// no window scaling, no timestamps).
    pub fn new() -> Tcb {
        Tcb::established(test_config(), PeerOpts::default())
    }

    /// The full window we advertise when the receive buffer is empty.
    pub fn full_window(&self) -> u16 {
        self.window_for(self.rx_buffer)
    }

    /// The window field for `free` bytes of receive space.
    pub fn window_for(&self, free: usize) -> u16 {
        (free >> self.our_shift).min(65535) as u16
    }

    /// A segment from the peer, with defaults: seq = peer byte 0, ACK of our byte 0, the
    /// peer's window, and a timestamp if negotiated.
    pub fn seg(&self) -> Seg {
        let mut repr = TcpRepr {
            src_port: REMOTE_PORT,
            dst_port: LOCAL_PORT,
            seq: r(0),
            ack: Some(l(0)),
            flags: TcpFlags::default(),
            window: self.peer_window,
            urgent: 0,
            options: TcpOptions::default(),
        };
        if self.ts {
            let elapsed = (self.now - T0).as_millis() as u32;
            repr.options.timestamp = Some((self.peer_tsval + elapsed, self.last_tsval));
        }
        Seg {
            repr,
            payload: Vec::new(),
            any_tsval: false,
        }
    }

    /// A segment we expect from the connection, with defaults: seq = our byte 0, ACK of
    /// peer byte 0, the full window, and the timestamp echo if negotiated.
    pub fn out(&self) -> Seg {
        let mut repr = TcpRepr {
            src_port: LOCAL_PORT,
            dst_port: REMOTE_PORT,
            seq: l(0),
            ack: Some(r(0)),
            flags: TcpFlags::default(),
            window: self.full_window(),
            urgent: 0,
            options: TcpOptions::default(),
        };
        if self.ts {
            repr.options.timestamp = Some((0, self.ts_recent));
        }
        Seg {
            repr,
            payload: Vec::new(),
            any_tsval: true,
        }
    }

    /// Feeds a segment from the peer at the current time.
    #[track_caller]
    pub fn send(&mut self, seg: Seg) {
        let mut repr = seg.repr;
        if repr.ack.is_some() {
            repr.flags = repr.flags | TcpFlags::ACK;
        }
        if let Some((tsval, _)) = repr.options.timestamp {
            self.ts_recent = tsval;
        }
        self.conn.handle_segment(self.now, &repr, &seg.payload);
    }

    /// Polls one segment with a payload buffer of `buf_len` bytes.
    pub fn poll_with(&mut self, buf_len: usize) -> Option<Seg> {
        let mut buf = vec![0u8; buf_len];
        let t: Transmit = self.conn.poll_transmit(self.now, &mut buf)?;
        assert!(
            t.payload_len <= buf_len,
            "payload_len {} exceeds the buffer {buf_len}",
            t.payload_len
        );
        let mut repr = t.repr;
        if let Some((tsval, _)) = repr.options.timestamp {
            assert!(
                tsval.wrapping_sub(self.last_tsval) < (1 << 31),
                "TSval went backwards: {tsval} after {}",
                self.last_tsval
            );
            self.last_tsval = tsval;
        }
        repr.flags = normalise_flags(repr.flags);
        Some(Seg {
            repr,
            payload: buf[..t.payload_len].to_vec(),
            any_tsval: false,
        })
    }

    /// Polls one segment with a 4 KiB payload buffer (more than any MSS in these tests).
    pub fn poll(&mut self) -> Option<Seg> {
        self.poll_with(4096)
    }

    /// Asserts that the next segment emitted (4 KiB buffer) is exactly `expected`.
    #[track_caller]
    pub fn expect(&mut self, expected: Seg) {
        self.expect_with(4096, expected)
    }

    /// Asserts that the next segments emitted are the full 1000-byte segments `range` of
    /// `d` (the harness's MSS), the first byte of `d` being at `l(0)`.
    #[track_caller]
    pub fn expect_full_segments(&mut self, d: &[u8], range: std::ops::Range<usize>) {
        for i in range {
            self.expect(
                self.out()
                    .seq(l(i * 1000))
                    .payload(&d[i * 1000..(i + 1) * 1000]),
            );
        }
    }

    /// Asserts that the next segment emitted with a `buf_len`-byte buffer is `expected`.
    #[track_caller]
    pub fn expect_with(&mut self, buf_len: usize, expected: Seg) {
        let now = self.now;
        let Some(got) = self.poll_with(buf_len) else {
            panic!("at {now:?}: expected {expected:?}, the connection emitted nothing");
        };
        self.check(&got, expected);
    }

    /// Asserts that `got` (a polled segment) matches `expected` under the harness's
    /// normalisation (PSH ignored, ACK bit from `ack`, TSval ignored when asked).
    #[track_caller]
    pub fn check(&self, got: &Seg, expected: Seg) {
        let mut exp = expected;
        exp.repr.flags = normalise_flags(exp.repr.flags);
        if exp.any_tsval {
            if let (Some((_, e)), Some((g, _))) =
                (exp.repr.options.timestamp, got.repr.options.timestamp)
            {
                exp.repr.options.timestamp = Some((g, e));
            }
        }
        let mut got = got.clone();
        got.repr.flags = normalise_flags(got.repr.flags);
        exp.any_tsval = false;
        got.any_tsval = false;
        assert_eq!(
            SegView(&got),
            SegView(&exp),
            "at {:?}: emitted segment differs from the expected one",
            self.now
        );
    }

    /// Asserts that nothing is emitted now.
    #[track_caller]
    pub fn expect_none(&mut self) {
        let now = self.now;
        if let Some(s) = self.poll() {
            panic!("at {now:?}: expected no segment, got {:?}", SegView(&s));
        }
    }

    /// Collects everything the connection emits now (at most 1000 segments).
    pub fn drain(&mut self) -> Vec<Seg> {
        let mut v = Vec::new();
        while let Some(s) = self.poll() {
            v.push(s);
            assert!(v.len() < 1000, "poll_transmit does not terminate");
        }
        v
    }

    /// Moves time forward without running timers.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Moves time to `t` and runs timers.
    pub fn tick_to(&mut self, t: Instant) {
        assert!(t >= self.now, "time must not go backwards");
        self.now = t;
        self.conn.handle_timeout(t);
    }

    /// Moves time forward by `d` and runs timers.
    pub fn tick(&mut self, d: Duration) {
        let t = self.now + d;
        self.tick_to(t);
    }

    /// The connection's next deadline, which must exist.
    #[track_caller]
    pub fn deadline(&self) -> Instant {
        self.conn
            .poll_timeout()
            .expect("the connection should have a deadline")
    }

    /// Moves time to the next deadline, runs timers, and returns the deadline.
    #[track_caller]
    pub fn fire(&mut self) -> Instant {
        let t = self.deadline();
        assert!(
            t >= self.now,
            "deadline {t:?} lies in the past (now {:?})",
            self.now
        );
        self.tick_to(t);
        t
    }

    /// Queues application data; asserts all of it was accepted.
    #[track_caller]
    pub fn app_send(&mut self, bytes: &[u8]) {
        let n = self.conn.send(bytes).expect("send failed");
        assert_eq!(n, bytes.len(), "send accepted only {n} bytes");
    }

    /// Reads up to `n` bytes of application data.
    #[track_caller]
    pub fn app_recv(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        match self.conn.recv(&mut buf) {
            Ok(k) => buf[..k].to_vec(),
            Err(e) => panic!("recv failed: {e:?}"),
        }
    }

    pub fn stats(&self) -> Stats {
        self.conn.stats()
    }
}

impl Default for Tcb {
    fn default() -> Self {
        Tcb::new()
    }
}

/// A compact debug view used in assertion messages.
#[derive(PartialEq, Eq)]
pub struct SegView<'a>(pub &'a Seg);

impl core::fmt::Debug for SegView<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let r = &self.0.repr;
        write!(
            f,
            "{}->{} seq={:?} ack={:?} [{:?}] win={} urg={}",
            r.src_port, r.dst_port, r.seq, r.ack, r.flags, r.window, r.urgent
        )?;
        let o = &r.options;
        if o.mss.is_some() || o.window_scale.is_some() || o.sack_permitted {
            write!(
                f,
                " mss={:?} ws={:?} sackok={}",
                o.mss, o.window_scale, o.sack_permitted
            )?;
        }
        let blocks: Vec<_> = o
            .sack_blocks
            .iter()
            .flatten()
            .map(|b| (b.left, b.right))
            .collect();
        if !blocks.is_empty() {
            write!(f, " sack={blocks:?}")?;
        }
        if let Some(ts) = o.timestamp {
            write!(f, " ts={ts:?}")?;
        }
        write!(f, " len={}", self.0.payload.len())?;
        if !self.0.payload.is_empty() {
            let p = &self.0.payload;
            write!(f, " data={:?}..", &p[..p.len().min(8)])?;
        }
        Ok(())
    }
}
