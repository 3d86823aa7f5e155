//! Shared harness for the exact-segment TCP tests (owned by tests-a; tests-b merges it).
//!
//! Style follows smoltcp's `socket/tcp.rs` tests: one connection under test ("local"), a
//! scripted peer ("remote") whose segments the test writes out in full, and helpers that
//! feed a segment and assert the EXACT segments the connection emits in response (seq, ack,
//! flags, window, options, payload) and that nothing else is emitted.
//!
//! Both ISNs sit just below 2^32 so every test crosses the sequence-number wrap:
//! local ISN = 2^32 - 1001, remote ISN = 2^32 - 2001.
//!
//! Time is explicit: the harness keeps `now` and tests move it with `advance`/`set_now`.
//!
//! Conventions:
//! - `seg()` is the template of a segment the remote sends to us (ports set, seq =
//!   REMOTE_ISN + 1, ack = LOCAL_ISN + 1, window 65535, no options). Override fields with
//!   struct-update syntax: `TcpRepr { seq: REMOTE_ISN + 11, ..seg() }`.
//! - `out()` is the template of a segment we expect the connection to emit (ports swapped,
//!   seq = LOCAL_ISN + 1, ack = REMOTE_ISN + 1, window = 0, no options). Tests always set
//!   the window they expect, usually with `h.win()`.
//! - ACK is carried by `ack: Some(_)`. Incoming segments get the ACK bit in `flags` exactly
//!   when `ack` is `Some` (as the wire parser produces). Emitted segments are compared with
//!   the ACK and PSH bits removed from `flags` (ACK is redundant with `ack`; PSH is the
//!   sender's free choice per RFC 9293 §3.9.1.2), after asserting that ACK, if the core sets
//!   it in `flags`, agrees with `ack`.
#![allow(dead_code)]
#![allow(unused_macros)]
#![allow(unused_imports)]

pub use netdriver::tcp::{
    rst_for_unexpected, Config, Connection, SeqNumber, State, Stats, TcpError, Transmit,
};
pub use netdriver::time::{Duration, Instant};
pub use netdriver::wire::tcp::{SackBlock, TcpFlags, TcpOptions, TcpRepr};
pub use std::net::{Ipv4Addr, SocketAddrV4};

/// Our (connection under test) address.
pub const LOCAL_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The peer's address.
pub const REMOTE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// Our port.
pub const LOCAL_PORT: u16 = 49500;
/// The peer's port.
pub const REMOTE_PORT: u16 = 9000;
/// Our ISN: 1001 bytes below the wrap.
pub const LOCAL_ISN: SeqNumber = SeqNumber(u32::MAX - 1000);
/// The peer's ISN: 2001 bytes below the wrap.
pub const REMOTE_ISN: SeqNumber = SeqNumber(u32::MAX - 2000);
/// MSS both sides use unless a test says otherwise.
pub const MSS: u16 = 1460;
/// Receive buffer of the connection under test in the default harness config.
pub const RX_BUFFER: usize = 16 * 1024;
/// Send buffer of the connection under test in the default harness config.
pub const TX_BUFFER: usize = 16 * 1024;

/// The first instant of every test (far from zero so nothing saturates).
pub const T0: Instant = Instant::from_millis(1_000_000);

/// Our socket address.
pub fn local_addr() -> SocketAddrV4 {
    SocketAddrV4::new(LOCAL_IP, LOCAL_PORT)
}

/// The peer's socket address.
pub fn remote_addr() -> SocketAddrV4 {
    SocketAddrV4::new(REMOTE_IP, REMOTE_PORT)
}

/// Milliseconds as a `Duration`.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The harness default config: the crate defaults with buffers small enough to reason
/// about, immediate ACKs (delayed ACKs are tested elsewhere), no timestamps (their TSval
/// is the core's choice; the tests that use timestamps turn them on explicitly) and no
/// tail loss probe (it would take the first RTO's place, and these tests are about the
/// RTO; `tcp_tlp.rs` and `tcp_default_config.rs` test the probe).
pub fn config() -> Config {
    Config {
        rx_buffer: RX_BUFFER,
        // A fixed window: these tests predict every advertised window and the window
        // scale from `rx_buffer` (auto-tuning has its own tests, `tcp_autotune.rs`).
        rx_buffer_max: None,
        tx_buffer: TX_BUFFER,
        // A fixed send buffer, likewise (`tcp_send_autotune.rs` tests the growth).
        tx_buffer_max: None,
        delayed_ack: None,
        timestamps: false,
        tail_loss_probe: false,
        ..Config::default()
    }
}

/// The smallest window-scale shift such that `rx_buffer >> shift` fits the 16-bit window
/// field, capped at 14 (RFC 7323 §2.3).
pub fn min_shift(rx_buffer: usize) -> u8 {
    let mut s = 0u8;
    while s < 14 && (rx_buffer >> s) > 0xffff {
        s += 1;
    }
    s
}

/// Template of a segment from the remote to us.
pub fn seg() -> TcpRepr {
    TcpRepr {
        src_port: REMOTE_PORT,
        dst_port: LOCAL_PORT,
        seq: REMOTE_ISN + 1,
        ack: Some(LOCAL_ISN + 1),
        flags: TcpFlags::default(),
        window: 65535,
        urgent: 0,
        options: TcpOptions::default(),
    }
}

/// Template of a segment we expect from the connection under test.
pub fn out() -> TcpRepr {
    TcpRepr {
        src_port: LOCAL_PORT,
        dst_port: REMOTE_PORT,
        seq: LOCAL_ISN + 1,
        ack: Some(REMOTE_ISN + 1),
        flags: TcpFlags::default(),
        window: 0,
        urgent: 0,
        options: TcpOptions::default(),
    }
}

/// SYN options: MSS only.
pub fn opts_mss(mss: u16) -> TcpOptions {
    TcpOptions {
        mss: Some(mss),
        ..TcpOptions::default()
    }
}

/// Options with SACK blocks (up to four).
pub fn sack_opts(blocks: &[(SeqNumber, SeqNumber)]) -> TcpOptions {
    let mut o = TcpOptions::default();
    for (i, &(l, r)) in blocks.iter().enumerate() {
        o.sack_blocks[i] = Some(SackBlock { left: l, right: r });
    }
    o
}

/// The segment as the wire parser would hand it over: ACK bit set exactly when `ack` is.
pub fn as_parsed(mut repr: TcpRepr) -> TcpRepr {
    if repr.ack.is_some() {
        repr.flags = repr.flags | TcpFlags::ACK;
    } else {
        repr.flags = TcpFlags(repr.flags.0 & !TcpFlags::ACK.0);
    }
    repr
}

/// An emitted segment normalised for comparison (see the module docs).
#[track_caller]
pub fn normalise(mut repr: TcpRepr) -> TcpRepr {
    if repr.flags.ack() {
        assert!(
            repr.ack.is_some(),
            "segment has the ACK flag but no ack number: {repr:?}"
        );
    }
    repr.flags = TcpFlags(repr.flags.0 & !(TcpFlags::ACK.0 | TcpFlags::PSH.0));
    repr
}

/// One emitted segment: header and payload.
#[derive(Clone, PartialEq, Eq)]
pub struct Seg {
    /// The normalised header.
    pub repr: TcpRepr,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

impl core::fmt::Debug for Seg {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let r = &self.repr;
        write!(
            f,
            "[{}->{} {:?} seq={} ack={:?} win={} len={}",
            r.src_port,
            r.dst_port,
            r.flags,
            r.seq.0,
            r.ack.map(|a| a.0),
            r.window,
            self.payload.len()
        )?;
        let o = &r.options;
        if *o != TcpOptions::default() {
            write!(f, " opts={o:?}")?;
        }
        if r.urgent != 0 {
            write!(f, " urg={}", r.urgent)?;
        }
        write!(f, "]")
    }
}

/// Poll every segment `conn` emits at `now`.
pub fn drain(conn: &mut Connection, now: Instant) -> Vec<Seg> {
    let mut v = Vec::new();
    let mut buf = vec![0u8; 70_000];
    while let Some(t) = conn.poll_transmit(now, &mut buf) {
        assert!(t.payload_len <= buf.len());
        v.push(Seg {
            repr: normalise(t.repr),
            payload: buf[..t.payload_len].to_vec(),
        });
        assert!(
            v.len() < 10_000,
            "poll_transmit never returns None (livelock)"
        );
    }
    v
}

/// A connection under test with its clock.
pub struct H {
    /// The connection under test.
    pub conn: Connection,
    /// The current time.
    pub now: Instant,
    /// The config it was built with.
    pub cfg: Config,
    /// The window-scale shift the connection announced in its SYN/SYN-ACK and that the
    /// peer accepted (0 when scaling is not in effect).
    pub shift: u8,
}

impl H {
    /// Feed one segment without payload at `now`.
    #[track_caller]
    pub fn send(&mut self, repr: TcpRepr) {
        self.send_data(repr, &[]);
    }

    /// Feed one segment with payload at `now`.
    #[track_caller]
    pub fn send_data(&mut self, repr: TcpRepr, payload: &[u8]) {
        let repr = as_parsed(repr);
        self.conn.handle_segment(self.now, &repr, payload);
    }

    /// Poll everything the connection emits now.
    pub fn poll(&mut self) -> Vec<Seg> {
        drain(&mut self.conn, self.now)
    }

    /// Assert the connection emits exactly these segments (in order) now, and nothing else.
    #[track_caller]
    pub fn expect(&mut self, want: &[(TcpRepr, &[u8])]) {
        let got = self.poll();
        let want: Vec<Seg> = want
            .iter()
            .map(|(r, p)| Seg {
                repr: normalise(*r),
                payload: p.to_vec(),
            })
            .collect();
        assert_eq!(got, want, "emitted segments differ (at {:?})", self.now);
    }

    /// Assert the connection emits exactly one segment without payload, then nothing.
    #[track_caller]
    pub fn expect1(&mut self, want: TcpRepr) {
        self.expect(&[(want, &[])]);
    }

    /// Assert the connection emits exactly one segment with this payload, then nothing.
    #[track_caller]
    pub fn expect1_data(&mut self, want: TcpRepr, payload: &[u8]) {
        self.expect(&[(want, payload)]);
    }

    /// Assert the connection emits nothing now.
    #[track_caller]
    pub fn expect_nothing(&mut self) {
        let got = self.poll();
        assert!(
            got.is_empty(),
            "expected no segment at {:?}, got {got:?}",
            self.now
        );
    }

    /// The window field the connection should advertise now on a non-SYN segment:
    /// free receive buffer, scaled down by our shift, capped at 65535.
    pub fn win(&self) -> u16 {
        let free = self.cfg.rx_buffer - self.conn.recv_queue();
        (free >> self.shift).min(0xffff) as u16
    }

    /// The window field the connection should advertise with `extra` more bytes queued.
    pub fn win_minus(&self, extra: usize) -> u16 {
        let free = self.cfg.rx_buffer - self.conn.recv_queue() - extra;
        (free >> self.shift).min(0xffff) as u16
    }

    /// Move time forward by `d` (does not fire timers).
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Set the time (must not go backwards).
    pub fn set_now(&mut self, t: Instant) {
        assert!(t >= self.now, "time went backwards");
        self.now = t;
    }

    /// The connection's next deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.conn.poll_timeout()
    }

    /// Move time to `t` and let the connection handle its timers.
    pub fn fire_at(&mut self, t: Instant) {
        self.set_now(t);
        self.conn.handle_timeout(self.now);
    }

    /// Jump to the connection's next deadline and handle it; returns the deadline.
    #[track_caller]
    pub fn fire_next(&mut self) -> Instant {
        let t = self.deadline().expect("connection has no deadline");
        self.fire_at(t);
        t
    }

    /// Application write; asserts all of `data` was accepted.
    #[track_caller]
    pub fn write(&mut self, data: &[u8]) {
        assert_eq!(self.conn.send(data), Ok(data.len()));
    }

    /// Application read of everything available (until WouldBlock or EOF).
    pub fn read_all(&mut self) -> Vec<u8> {
        let mut v = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.conn.recv(&mut buf) {
            if n == 0 {
                break;
            }
            v.extend_from_slice(&buf[..n]);
        }
        v
    }

    /// Application read into a buffer of `n` bytes.
    pub fn read(&mut self, n: usize) -> Result<Vec<u8>, TcpError> {
        let mut buf = vec![0u8; n];
        let k = self.conn.recv(&mut buf)?;
        buf.truncate(k);
        Ok(buf)
    }

    /// The connection's state.
    pub fn state(&self) -> State {
        self.conn.state()
    }
}

/// Feed a segment: `send!(h, repr)` or `send!(h, repr, b"payload")`.
#[macro_export]
macro_rules! send {
    ($h:expr, $repr:expr) => {
        $h.send($repr)
    };
    ($h:expr, $repr:expr, $payload:expr) => {
        $h.send_data($repr, $payload)
    };
}

/// Assert the exact emitted segments: `recv!(h, repr)`, `recv!(h, repr, b"payload")`,
/// `recv!(h, [(r1, p1), (r2, p2)])`.
#[macro_export]
macro_rules! recv {
    ($h:expr, [$(($r:expr, $p:expr)),* $(,)?]) => {
        $h.expect(&[$(($r, &$p[..])),*])
    };
    ($h:expr, $repr:expr) => {
        $h.expect1($repr)
    };
    ($h:expr, $repr:expr, $payload:expr) => {
        $h.expect1_data($repr, &$payload[..])
    };
}

/// Assert nothing is emitted.
#[macro_export]
macro_rules! recv_nothing {
    ($h:expr) => {
        $h.expect_nothing()
    };
}

// ---------------------------------------------------------------------------------------
// Connections in each state. The peer offers MSS 1460, window scale 0 and SACK-permitted
// (so both scaling and SACK are in effect with shift factors derived from the SYNs), and
// window 65535.
// ---------------------------------------------------------------------------------------

/// The SYN options the connection under test should send for `cfg`
/// (RFC 9293 §3.7.1 MSS, RFC 7323 §2.2 WS, RFC 2018 §2 SACK-permitted).
pub fn syn_opts(cfg: &Config) -> TcpOptions {
    TcpOptions {
        mss: Some(cfg.mss),
        window_scale: cfg.window_scaling.then(|| min_shift(cfg.rx_buffer)),
        sack_permitted: cfg.sack,
        ..TcpOptions::default()
    }
}

/// The options of the peer's SYN / SYN-ACK in the default scenario.
pub fn peer_syn_opts() -> TcpOptions {
    TcpOptions {
        mss: Some(MSS),
        window_scale: Some(0),
        sack_permitted: true,
        ..TcpOptions::default()
    }
}

/// The SYN window field: the receive buffer, unscaled, capped at 65535 (RFC 7323 §2.2).
pub fn syn_window(cfg: &Config) -> u16 {
    cfg.rx_buffer.min(0xffff) as u16
}

/// The SYN the connection under test sends on active open.
pub fn our_syn(cfg: &Config) -> TcpRepr {
    TcpRepr {
        seq: LOCAL_ISN,
        ack: None,
        flags: TcpFlags::SYN,
        window: syn_window(cfg),
        options: syn_opts(cfg),
        ..out()
    }
}

/// A fresh active-open connection; its SYN not yet polled.
pub fn connect_with(cfg: Config) -> H {
    let conn = Connection::connect(cfg.clone(), local_addr(), remote_addr(), LOCAL_ISN, T0);
    H {
        conn,
        now: T0,
        cfg,
        shift: 0,
    }
}

/// SYN-SENT with the SYN already polled and checked.
pub fn syn_sent_with(cfg: Config) -> H {
    let mut h = connect_with(cfg);
    assert_eq!(h.state(), State::SynSent);
    let syn = our_syn(&h.cfg);
    recv!(h, syn);
    h
}

/// SYN-SENT with the harness config.
pub fn syn_sent() -> H {
    syn_sent_with(config())
}

/// The peer's SYN for the passive-open scenario.
pub fn peer_syn() -> TcpRepr {
    TcpRepr {
        seq: REMOTE_ISN,
        ack: None,
        flags: TcpFlags::SYN,
        options: peer_syn_opts(),
        ..seg()
    }
}

/// The SYN-ACK the connection under test sends in reply to `syn` (options only for what
/// the SYN offered; RFC 7323 §2.2, RFC 2018 §2).
pub fn our_syn_ack(cfg: &Config, syn: &TcpRepr) -> TcpRepr {
    let o = &syn.options;
    TcpRepr {
        seq: LOCAL_ISN,
        ack: Some(syn.seq + 1),
        flags: TcpFlags::SYN,
        window: syn_window(cfg),
        options: TcpOptions {
            mss: Some(cfg.mss),
            window_scale: (cfg.window_scaling && o.window_scale.is_some())
                .then(|| min_shift(cfg.rx_buffer)),
            sack_permitted: cfg.sack && o.sack_permitted,
            ..TcpOptions::default()
        },
        ..out()
    }
}

/// Passive open from `syn`; the SYN-ACK already polled and checked.
pub fn syn_received_from(cfg: Config, syn: TcpRepr) -> H {
    let syn = as_parsed(syn);
    let conn = Connection::accept(
        cfg.clone(),
        local_addr(),
        remote_addr(),
        &syn,
        LOCAL_ISN,
        T0,
    )
    .expect("accept");
    let mut h = H {
        conn,
        now: T0,
        cfg,
        shift: 0,
    };
    assert_eq!(h.state(), State::SynReceived);
    let sa = our_syn_ack(&h.cfg, &syn);
    recv!(h, sa);
    if h.cfg.window_scaling && syn.options.window_scale.is_some() {
        h.shift = min_shift(h.cfg.rx_buffer);
    }
    h
}

/// SYN-RECEIVED with the harness config and the default peer SYN.
pub fn syn_received() -> H {
    syn_received_from(config(), peer_syn())
}

/// The peer's SYN-ACK in the active-open scenario.
pub fn peer_syn_ack() -> TcpRepr {
    TcpRepr {
        seq: REMOTE_ISN,
        ack: Some(LOCAL_ISN + 1),
        flags: TcpFlags::SYN,
        options: peer_syn_opts(),
        ..seg()
    }
}

/// ESTABLISHED by active open with `cfg`.
pub fn established_with(cfg: Config) -> H {
    let mut h = syn_sent_with(cfg);
    send!(h, peer_syn_ack());
    assert_eq!(h.state(), State::Established);
    if h.cfg.window_scaling {
        h.shift = min_shift(h.cfg.rx_buffer);
    }
    let ack = TcpRepr {
        window: h.win(),
        ..out()
    };
    recv!(h, ack);
    h
}

/// ESTABLISHED with the harness config. snd.nxt = LOCAL_ISN + 1, rcv.nxt = REMOTE_ISN + 1.
pub fn established() -> H {
    established_with(config())
}

/// FIN-WAIT-1: established, close(), FIN polled (seq LOCAL_ISN + 1).
pub fn fin_wait_1() -> H {
    let mut h = established();
    h.conn.close();
    assert_eq!(h.state(), State::FinWait1);
    let fin = TcpRepr {
        flags: TcpFlags::FIN,
        window: h.win(),
        ..out()
    };
    recv!(h, fin);
    h
}

/// FIN-WAIT-2: our FIN acknowledged.
pub fn fin_wait_2() -> H {
    let mut h = fin_wait_1();
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 2),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::FinWait2);
    recv_nothing!(h);
    h
}

/// TIME-WAIT after FIN-WAIT-2 received the peer's FIN (seq REMOTE_ISN + 1), which we ACKed.
pub fn time_wait() -> H {
    let mut h = fin_wait_2();
    send!(
        h,
        TcpRepr {
            flags: TcpFlags::FIN,
            ack: Some(LOCAL_ISN + 2),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::TimeWait);
    let ack = TcpRepr {
        seq: LOCAL_ISN + 2,
        ack: Some(REMOTE_ISN + 2),
        window: h.win(),
        ..out()
    };
    recv!(h, ack);
    h
}

/// CLOSE-WAIT: the peer's FIN (seq REMOTE_ISN + 1) received and ACKed.
pub fn close_wait() -> H {
    let mut h = established();
    send!(
        h,
        TcpRepr {
            flags: TcpFlags::FIN,
            ..seg()
        }
    );
    assert_eq!(h.state(), State::CloseWait);
    let ack = TcpRepr {
        ack: Some(REMOTE_ISN + 2),
        window: h.win(),
        ..out()
    };
    recv!(h, ack);
    h
}

/// LAST-ACK: close() in CLOSE-WAIT, our FIN (seq LOCAL_ISN + 1) polled.
pub fn last_ack() -> H {
    let mut h = close_wait();
    h.conn.close();
    assert_eq!(h.state(), State::LastAck);
    let fin = TcpRepr {
        flags: TcpFlags::FIN,
        ack: Some(REMOTE_ISN + 2),
        window: h.win(),
        ..out()
    };
    recv!(h, fin);
    h
}

/// CLOSING: in FIN-WAIT-1 the peer's FIN arrives without acknowledging ours.
pub fn closing() -> H {
    let mut h = fin_wait_1();
    send!(
        h,
        TcpRepr {
            flags: TcpFlags::FIN,
            ..seg()
        }
    );
    assert_eq!(h.state(), State::Closing);
    let ack = TcpRepr {
        seq: LOCAL_ISN + 2,
        ack: Some(REMOTE_ISN + 2),
        window: h.win(),
        ..out()
    };
    recv!(h, ack);
    h
}

// ---------------------------------------------------------------------------------------
// Two connections wired back to back (for oracle and wraparound tests).
// ---------------------------------------------------------------------------------------

/// A segment in flight between the two ends of a `Pair`.
#[derive(Clone, Debug)]
pub struct InFlight {
    /// Header as the receiver's parser would produce it.
    pub repr: TcpRepr,
    /// Payload.
    pub payload: Vec<u8>,
}

/// Two connections: `a` actively opened to `b`, which was created by `accept` of a's SYN.
pub struct Pair {
    /// The active opener (local address / LOCAL_ISN).
    pub a: Connection,
    /// The passive opener (remote address / REMOTE_ISN).
    pub b: Connection,
    /// Current time.
    pub now: Instant,
}

impl Pair {
    /// Build the pair and complete the handshake by exchanging segments directly.
    pub fn new(cfg_a: Config, cfg_b: Config, now: Instant) -> Pair {
        let mut a = Connection::connect(cfg_a, local_addr(), remote_addr(), LOCAL_ISN, now);
        let syn = drain(&mut a, now);
        assert_eq!(syn.len(), 1, "active open emits one SYN: {syn:?}");
        let syn_repr = as_parsed(syn[0].repr);
        let b = Connection::accept(
            cfg_b,
            remote_addr(),
            local_addr(),
            &syn_repr,
            REMOTE_ISN,
            now,
        )
        .expect("accept");
        let mut p = Pair { a, b, now };
        p.run_until_quiet(100);
        p
    }

    /// Segments `a` has to send now.
    pub fn poll_a(&mut self) -> Vec<InFlight> {
        drain(&mut self.a, self.now)
            .into_iter()
            .map(|s| InFlight {
                repr: as_parsed(s.repr),
                payload: s.payload,
            })
            .collect()
    }

    /// Segments `b` has to send now.
    pub fn poll_b(&mut self) -> Vec<InFlight> {
        drain(&mut self.b, self.now)
            .into_iter()
            .map(|s| InFlight {
                repr: as_parsed(s.repr),
                payload: s.payload,
            })
            .collect()
    }

    /// Exchange segments losslessly until neither side has anything to send (at most
    /// `rounds` rounds); returns the number of segments exchanged.
    #[track_caller]
    pub fn run_until_quiet(&mut self, rounds: usize) -> usize {
        let mut n = 0;
        for _ in 0..rounds {
            let sa = self.poll_a();
            let sb = self.poll_b();
            if sa.is_empty() && sb.is_empty() {
                return n;
            }
            n += sa.len() + sb.len();
            for s in sa {
                self.b.handle_segment(self.now, &s.repr, &s.payload);
            }
            for s in sb {
                self.a.handle_segment(self.now, &s.repr, &s.payload);
            }
        }
        panic!("pair did not go quiet in {rounds} rounds (livelock)");
    }

    /// Advance time to the earliest deadline of either side (at most `limit`), fire
    /// timers, and exchange segments until quiet. Returns false if no deadline is due
    /// before `limit`.
    pub fn step_timers(&mut self, limit: Instant) -> bool {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(t) if t <= limit => {
                if t > self.now {
                    self.now = t;
                }
                self.a.handle_timeout(self.now);
                self.b.handle_timeout(self.now);
                self.run_until_quiet(1000);
                true
            }
            _ => false,
        }
    }
}
