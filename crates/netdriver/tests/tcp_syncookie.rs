//! SYN cookies (RFC 4987 §3.6) at the netif, segment by segment: a scripted peer on a
//! simulated link sends hand-written segments to an `Interface` listening on port 9000
//! and the test checks the exact segments it answers with and the state it keeps.
//!
//! The listener's backlog is 2: two plain SYNs fill it with half-open connections (what
//! a spoofed-SYN flood does), and every later SYN is answered with a cookie.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use netdriver::link::sim::{self, SimConfig, SimLink};
use netdriver::link::Link;
use netdriver::netif::{Interface, InterfaceConfig};
use netdriver::tcp::syncookie::{SynCookies, COOKIE_PERIOD};
use netdriver::tcp::{Config, SeqNumber, State};
use netdriver::time::{Duration, Instant};
use netdriver::wire::{
    emit_tcp_frame, parse_tcp_frame, tcp_payload_offset, EtherType, EthernetAddress, EthernetRepr,
    IpProtocol, Ipv4Repr, TcpFlags, TcpOptions, TcpRepr,
};

const HOST_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
const PEER_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const PORT: u16 = 9000;
const KEY: [u8; 16] = *b"syn-cookie-tests";
/// The host's receive buffer: small enough to advertise unscaled.
const RX_BUFFER: usize = 16 * 1024;
/// The peer's ISN, just below the wrap so that cookie arithmetic crosses it.
const PEER_ISN: SeqNumber = SeqNumber(u32::MAX - 2);
/// The first instant of every test, far from the origin.
const T0: Instant = Instant::from_millis(1_000_000);

struct Bed {
    host: Interface<SimLink>,
    peer: SimLink,
    now: Instant,
}

fn host_config(cookies: bool) -> InterfaceConfig {
    InterfaceConfig {
        mac: HOST_MAC,
        ipv4: HOST_IP,
        tcp: Config {
            rx_buffer: RX_BUFFER,
            // A fixed window (and so window scale 0): the tests predict both.
            rx_buffer_max: None,
            tx_buffer: RX_BUFFER,
            delayed_ack: None,
            ..Config::default()
        },
        isn_key: Some([9; 16]),
        syn_cookies: cookies,
        syn_cookie_secret: Some(Arc::new(SynCookies::with_key(KEY))),
        ..InterfaceConfig::default()
    }
}

impl Bed {
    /// A host listening on 9000 with a backlog of 2, and the peer.
    fn new(cookies: bool) -> Bed {
        let (lh, lp) = sim::pair(SimConfig::default());
        let mut host = Interface::new(lh, host_config(cookies));
        host.add_neighbor(PEER_IP, PEER_MAC);
        host.listen(PORT, 2).unwrap();
        Bed {
            host,
            peer: lp,
            now: T0,
        }
    }

    fn local() -> SocketAddrV4 {
        SocketAddrV4::new(HOST_IP, PORT)
    }

    fn remote(port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(PEER_IP, port)
    }

    /// Sends one segment from the peer and lets the host process it (and answer).
    fn send(&mut self, repr: TcpRepr, payload: &[u8]) {
        let mut frame = vec![0u8; tcp_payload_offset(&repr) + payload.len()];
        frame[tcp_payload_offset(&repr)..].copy_from_slice(payload);
        let eth = EthernetRepr {
            src: PEER_MAC,
            dst: HOST_MAC,
            ethertype: EtherType::Ipv4,
        };
        let ip = Ipv4Repr {
            src: PEER_IP,
            dst: HOST_IP,
            protocol: IpProtocol::Tcp,
            payload_len: 0,
            ttl: 64,
            dscp_ecn: 0,
        };
        let len = emit_tcp_frame(&mut frame, &eth, &ip, 1, &repr, payload.len()).unwrap();
        assert_eq!(len, frame.len());
        assert!(self.peer.send_frame(self.now, &frame));
        self.peer.flush(self.now);
        self.now += Duration::from_micros(20);
        self.host.poll(self.now);
    }

    /// Everything the host sent since the last call (PSH cleared: the sender's choice).
    fn recv(&mut self) -> Vec<(TcpRepr, Vec<u8>)> {
        self.host.poll(self.now);
        self.now += Duration::from_micros(20);
        let mut out = Vec::new();
        self.peer.recv_batch(self.now, 1024, &mut |f| {
            let tf = parse_tcp_frame(f, true).expect("host sends valid frames");
            assert_eq!((tf.eth.dst, tf.ip.dst), (PEER_MAC, PEER_IP));
            let mut tcp = tf.tcp;
            tcp.flags = TcpFlags(tcp.flags.0 & !TcpFlags::PSH.0);
            out.push((tcp, tf.payload.to_vec()));
        });
        out
    }

    fn expect(&mut self, want: &[TcpRepr]) {
        let got: Vec<_> = self.recv().into_iter().map(|(r, _)| r).collect();
        assert_eq!(got, want);
    }
}

/// The peer's SYN from `port`, with every option a Linux peer offers.
fn syn(port: u16) -> TcpRepr {
    TcpRepr {
        src_port: port,
        dst_port: PORT,
        seq: PEER_ISN,
        ack: None,
        flags: TcpFlags::SYN,
        window: 64240,
        urgent: 0,
        options: TcpOptions {
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: true,
            timestamp: Some((1111, 0)),
            ..TcpOptions::default()
        },
    }
}

/// The host's cookie for `syn` received at `at`, as an independent instance computes it.
fn cookie(at: Instant, syn: &TcpRepr) -> SeqNumber {
    SynCookies::with_key(KEY)
        .generate(at, Bed::local(), Bed::remote(syn.src_port), syn)
        .0
}

/// The cookie SYN-ACK: ISN = cookie, our MSS, no other option, the unscaled window.
fn cookie_syn_ack(syn: &TcpRepr, cookie: SeqNumber) -> TcpRepr {
    TcpRepr {
        src_port: PORT,
        dst_port: syn.src_port,
        seq: cookie,
        ack: Some(syn.seq + 1),
        flags: TcpFlags::SYN | TcpFlags::ACK,
        window: RX_BUFFER as u16,
        urgent: 0,
        options: TcpOptions {
            mss: Some(1460),
            ..TcpOptions::default()
        },
    }
}

/// The peer's handshake ACK for a cookie SYN-ACK (no options: none were negotiated).
fn ack_of(syn: &TcpRepr, cookie: SeqNumber) -> TcpRepr {
    TcpRepr {
        src_port: syn.src_port,
        dst_port: PORT,
        seq: syn.seq + 1,
        ack: Some(cookie + 1),
        flags: TcpFlags::ACK,
        window: 65535,
        urgent: 0,
        options: TcpOptions::default(),
    }
}

/// Fills the backlog with two half-open connections (their SYN-ACKs are normal ones,
/// with every option) and returns the bed.
fn backlog_full(cookies: bool) -> Bed {
    let mut b = Bed::new(cookies);
    for port in [1000, 1001] {
        b.send(syn(port), b"");
        let got = b.recv();
        assert_eq!(got.len(), 1);
        let (sa, _) = &got[0];
        assert_eq!(sa.flags, TcpFlags::SYN | TcpFlags::ACK);
        assert_eq!(
            sa.options.window_scale,
            Some(0),
            "a normal SYN-ACK negotiates"
        );
        assert!(sa.options.sack_permitted && sa.options.timestamp.is_some());
    }
    assert_eq!(b.host.connection_count(), 2);
    b
}

#[test]
fn backlog_full_answers_with_a_cookie_and_keeps_no_state() {
    let mut b = backlog_full(true);
    let s = syn(2000);
    b.send(s, b"");
    let c = cookie(b.now, &s);
    b.expect(&[cookie_syn_ack(&s, c)]);
    assert_eq!(b.host.connection_count(), 2, "a cookie keeps no state");
    // The peer retransmits its SYN: the same cookie again, still no state.
    b.send(s, b"");
    b.expect(&[cookie_syn_ack(&s, c)]);
    assert_eq!(b.host.connection_count(), 2);
    // Another port, another cookie.
    let s2 = syn(2001);
    b.send(s2, b"");
    let c2 = cookie(b.now, &s2);
    assert_ne!(c2, c);
    b.expect(&[cookie_syn_ack(&s2, c2)]);
    let st = b.host.stats();
    assert_eq!(
        (
            st.syn_cookies_sent,
            st.syn_cookies_accepted,
            st.syn_cookies_rejected,
            st.syn_dropped
        ),
        (3, 0, 0, 0)
    );
}

#[test]
fn cookies_off_drops_syns_when_the_backlog_is_full() {
    let mut b = backlog_full(false);
    b.send(syn(2000), b"");
    b.expect(&[]);
    let st = b.host.stats();
    assert_eq!((st.syn_dropped, st.syn_cookies_sent), (1, 0));
    assert_eq!(b.host.connection_count(), 2);
}

#[test]
fn a_valid_cookie_ack_opens_a_connection_that_moves_data_exactly() {
    let mut b = backlog_full(true);
    let s = syn(3000);
    b.send(s, b"");
    let c = cookie(b.now, &s);
    b.expect(&[cookie_syn_ack(&s, c)]);

    // The handshake's ACK carries the first bytes, as a channel's preamble would.
    b.send(ack_of(&s, c), b"hello");
    let h = b
        .host
        .lookup(Bed::local(), Bed::remote(3000))
        .expect("the cookie opened a connection");
    let conn = b.host.conn(h).unwrap();
    assert_eq!(conn.state(), State::Established);
    assert_eq!(conn.negotiated(), (false, false, false));
    assert_eq!(conn.peer_mss(), 1460);
    assert_eq!(b.host.stats().syn_cookies_accepted, 1);
    assert_eq!(b.host.connection_count(), 3);
    b.expect(&[TcpRepr {
        src_port: PORT,
        dst_port: 3000,
        seq: c + 1,
        ack: Some(s.seq + 6),
        flags: TcpFlags::ACK,
        window: (RX_BUFFER - 5) as u16,
        urgent: 0,
        options: TcpOptions::default(),
    }]);

    // The listener hands it out first: the two half-open ones are not ready.
    assert_eq!(b.host.accept(PORT), Some(h));
    assert_eq!(b.host.accept(PORT), None);

    // Peer → host: 40 KB in MSS segments within the host's 16 KiB window, read as it goes.
    let upload: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut hello = [0u8; 16];
    assert_eq!(b.host.conn_mut(h).unwrap().recv(&mut hello), Ok(5));
    assert_eq!(&hello[..5], b"hello");
    let mut received = Vec::new();
    let mut peer_seq = s.seq + 6;
    for chunk in upload.chunks(1460) {
        b.send(
            TcpRepr {
                seq: peer_seq,
                ..ack_of(&s, c)
            },
            chunk,
        );
        peer_seq += chunk.len();
        let mut buf = vec![0u8; 4096];
        loop {
            match b.host.conn_mut(h).unwrap().recv(&mut buf) {
                Ok(n) if n > 0 => received.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        // Every segment is acknowledged in full (no delayed ACKs here).
        let acks = b.recv();
        assert_eq!(acks.last().map(|(r, _)| r.ack), Some(Some(peer_seq)));
    }
    assert_eq!(received, upload, "upload not byte-exact");

    // Host → peer: 3000 bytes in segments of the cookie's MSS (1460, no options); Nagle
    // holds the 80-byte tail until the full segments are acknowledged.
    let download: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(b.host.conn_mut(h).unwrap().send(&download), Ok(3000));
    let mut seq = c + 1;
    let mut got = Vec::new();
    for want in [&[1460usize, 1460][..], &[80]] {
        let segs = b.recv();
        let lens: Vec<_> = segs.iter().map(|(_, p)| p.len()).collect();
        assert_eq!(lens, want);
        for (r, p) in &segs {
            assert_eq!(r.seq, seq);
            assert_eq!(r.ack, Some(peer_seq));
            assert_eq!(r.options, TcpOptions::default());
            seq += p.len();
            got.extend_from_slice(p);
        }
        b.send(
            TcpRepr {
                seq: peer_seq,
                ack: Some(seq),
                ..ack_of(&s, c)
            },
            b"",
        );
    }
    assert_eq!(got, download, "download not byte-exact");
    assert_eq!(b.host.conn(h).unwrap().send_queue(), 0, "all acknowledged");
}

#[test]
fn forged_cookie_acks_are_reset_and_keep_no_state() {
    let mut b = backlog_full(true);
    let s = syn(4000);
    b.send(s, b"");
    let c = cookie(b.now, &s);
    b.expect(&[cookie_syn_ack(&s, c)]);
    let good = ack_of(&s, c);
    let forged = [
        // Acknowledges one past the cookie.
        TcpRepr {
            ack: Some(c + 2),
            ..good
        },
        // Another peer ISN than the SYN's.
        TcpRepr {
            seq: s.seq + 2,
            ..good
        },
        // The right numbers from another port.
        TcpRepr {
            src_port: 4001,
            ..good
        },
        // Claims the largest MSS in the table by flipping the cookie's MSS bits.
        TcpRepr {
            ack: Some(SeqNumber((c.value() ^ (7 << 27)).wrapping_add(1))),
            ..good
        },
    ];
    for (i, f) in forged.into_iter().enumerate() {
        b.send(f, b"data");
        // RFC 9293 §3.10.7.1: <SEQ=SEG.ACK><CTL=RST>, as for any segment for no connection.
        b.expect(&[TcpRepr {
            src_port: PORT,
            dst_port: f.src_port,
            seq: f.ack.unwrap(),
            ack: None,
            flags: TcpFlags::RST,
            window: 0,
            urgent: 0,
            options: TcpOptions::default(),
        }]);
        assert_eq!(b.host.connection_count(), 2, "forgery {i} left state");
        assert_eq!(b.host.stats().syn_cookies_rejected, i as u64 + 1);
    }
    assert_eq!(b.host.stats().syn_cookies_accepted, 0);
    // The genuine ACK still works afterwards.
    b.send(good, b"");
    assert!(b.host.lookup(Bed::local(), Bed::remote(4000)).is_some());
}

#[test]
fn a_cookie_from_an_expired_counter_is_rejected() {
    let mut b = backlog_full(true);
    let (old, recent) = (syn(5000), syn(5001));
    b.send(old, b"");
    let c_old = cookie(b.now, &old);
    b.expect(&[cookie_syn_ack(&old, c_old)]);

    // One period later: the previous counter is still accepted... (The half-open
    // connections gave up meanwhile, after the 60 s user timeout: fill the backlog anew.)
    b.now += COOKIE_PERIOD;
    b.recv();
    assert_eq!(b.host.connection_count(), 0);
    for port in [1002, 1003] {
        b.send(syn(port), b"");
        assert!(b.recv()[0].0.options.timestamp.is_some(), "not a cookie");
    }
    b.send(recent, b"");
    let c_recent = cookie(b.now, &recent);
    b.expect(&[cookie_syn_ack(&recent, c_recent)]);
    b.now += COOKIE_PERIOD / 2;
    b.send(ack_of(&recent, c_recent), b"");
    assert!(b.host.lookup(Bed::local(), Bed::remote(5001)).is_some());
    assert_eq!(b.host.stats().syn_cookies_accepted, 1);

    // ...but the first cookie is now two counters old: reset, no state.
    b.recv();
    let count = b.host.connection_count();
    b.send(ack_of(&old, c_old), b"");
    b.expect(&[TcpRepr {
        src_port: PORT,
        dst_port: 5000,
        seq: c_old + 1,
        ack: None,
        flags: TcpFlags::RST,
        window: 0,
        urgent: 0,
        options: TcpOptions::default(),
    }]);
    assert!(b.host.lookup(Bed::local(), Bed::remote(5000)).is_none());
    assert_eq!(b.host.connection_count(), count);
    assert_eq!(b.host.stats().syn_cookies_rejected, 1);
}

#[test]
fn acks_are_not_taken_for_cookies_when_none_went_out() {
    // A correct cookie, computed with the host's own key, but the host never ran out of
    // backlog: an ACK for no connection is reset without being checked.
    let mut b = Bed::new(true);
    let s = syn(6000);
    let c = cookie(b.now, &s);
    b.send(ack_of(&s, c), b"");
    assert_eq!(b.recv().len(), 1, "answered with a RST");
    assert_eq!(b.host.connection_count(), 0);
    let st = b.host.stats();
    assert_eq!(
        (st.syn_cookies_accepted, st.syn_cookies_rejected, st.tx_rst),
        (0, 0, 1)
    );
}
