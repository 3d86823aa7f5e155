//! Hand-made frames against connections that carry traffic, on the test bed: the `echo`
//! example serves in namespace A (virtual listener on port 7000, channel port 9000), and
//! kernel clients in namespace B echo verified data while an `AF_PACKET` socket in B
//! forges what a hostile host on the link could send.
//!
//! - A segment that overlaps RCV.NXT and carries a TSval far in the peer's future, with no
//!   ACK or with an ACK of data never sent: dropped (RFC 9293 §3.10.7.4, RFC 5961 §5.2)
//!   and without moving TS.Recent (RFC 7323 §4.3), so the genuine segments after it still
//!   pass PAWS and the connection keeps echoing, on the service port (a plain-TCP
//!   connection) and on a channel alike.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use netdriver::tcp::SeqNumber;
use netdriver::wire::{
    emit_tcp_frame, parse_tcp_frame, tcp_payload_offset, EtherType, EthernetAddress, EthernetRepr,
    IpProtocol, Ipv4Repr, TcpFlags, TcpOptions, TcpRepr,
};
use support::chunks::{chunk, Hostile, DATA, SERVICE_PORT};
use support::raw::RawSocket;
use support::{example_binary, ExampleServer, DEADLINE};
use testbed::{testbed_or_skip, Endpoint, Side, TestBed};

mod support;

const CHANNEL_PORT: u16 = 9000;
/// How long a legitimate client waits for its echo after a forged segment. A connection
/// stalled by a forged TS.Recent never echoes again (every genuine segment fails PAWS and
/// is answered with a duplicate ACK); a healthy one echoes within milliseconds.
const ECHO_WAIT: Duration = Duration::from_secs(5);
/// The forged TSval's lead over the client's own clock: about 12 days ahead, still "newer"
/// in the 32-bit comparison of RFC 7323 §5.3.
const TSVAL_LEAD: u32 = 1 << 30;

/// What the handshake of a kernel connection from B to A showed.
#[derive(Debug, Clone, Copy)]
struct Handshake {
    client_port: u16,
    server_port: u16,
    client_isn: u32,
    client_tsval: u32,
    server_isn: u32,
}

/// Reads frames from `raw` (in B) until it has seen the SYN from B to `server_port` of A
/// and A's SYN-ACK to it.
fn watch_handshake(raw: &RawSocket, a: &Endpoint, b: &Endpoint, server_port: u16) -> Handshake {
    let mut buf = vec![0u8; 4096];
    let (mut syn, mut synack) = (None, None);
    let end = Instant::now() + DEADLINE;
    while syn.is_none() || synack.is_none() {
        assert!(
            Instant::now() < end,
            "no handshake to port {server_port} seen"
        );
        let Some(n) = raw.recv(&mut buf) else {
            continue;
        };
        let Ok(f) = parse_tcp_frame(&buf[..n], false) else {
            continue;
        };
        let t = &f.tcp;
        if f.ip.src == b.ipv4 && t.dst_port == server_port && t.flags.syn() && t.ack.is_none() {
            let tsval = t
                .options
                .timestamp
                .expect("the kernel's SYN has timestamps")
                .0;
            syn = Some((t.src_port, t.seq.0, tsval));
        }
        if f.ip.src == a.ipv4 && t.src_port == server_port && t.flags.syn() && t.ack.is_some() {
            synack = Some((t.dst_port, t.seq.0));
        }
    }
    let ((client_port, client_isn, client_tsval), (to_port, server_isn)) =
        (syn.unwrap(), synack.unwrap());
    assert_eq!(client_port, to_port, "one connection at a time");
    Handshake {
        client_port,
        server_port,
        client_isn,
        client_tsval,
        server_isn,
    }
}

/// A forged segment from B's address on the connection `hs`: 20 bytes at `seq`, the
/// TSval `tsval`, and `ack` (none: no ACK bit).
fn forged_segment(
    a: &Endpoint,
    b: &Endpoint,
    hs: &Handshake,
    seq: u32,
    ack: Option<u32>,
    tsval: u32,
) -> Vec<u8> {
    let tcp = TcpRepr {
        src_port: hs.client_port,
        dst_port: hs.server_port,
        seq: SeqNumber(seq),
        ack: ack.map(SeqNumber),
        flags: if ack.is_some() {
            TcpFlags::ACK
        } else {
            TcpFlags::default()
        },
        window: 502,
        urgent: 0,
        options: TcpOptions {
            timestamp: Some((tsval, 0)),
            ..TcpOptions::default()
        },
    };
    let payload = [0xeeu8; 20];
    let at = tcp_payload_offset(&tcp);
    let mut frame = vec![0u8; at + payload.len()];
    frame[at..].copy_from_slice(&payload);
    let eth = EthernetRepr {
        src: EthernetAddress(b.mac),
        dst: EthernetAddress(a.mac),
        ethertype: EtherType::Ipv4,
    };
    let ip = Ipv4Repr {
        src: b.ipv4,
        dst: a.ipv4,
        protocol: IpProtocol::Tcp,
        payload_len: 0,
        ttl: 64,
        dscp_ecn: 0,
    };
    let len = emit_tcp_frame(&mut frame, &eth, &ip, 7, &tcp, payload.len()).expect("emit");
    frame.truncate(len);
    frame
}

/// The two forged segments of the attack on a connection whose server has received
/// `client_sent` bytes: each overlaps RCV.NXT by 10 bytes and carries a TSval
/// [`TSVAL_LEAD`] ahead of the client's; the first has no ACK, the second acknowledges
/// data the server never sent.
fn forgeries(a: &Endpoint, b: &Endpoint, hs: &Handshake, client_sent: u32) -> [Vec<u8>; 2] {
    let rcv_nxt = hs.client_isn.wrapping_add(1).wrapping_add(client_sent);
    let seq = rcv_nxt.wrapping_sub(10);
    let tsval = hs.client_tsval.wrapping_add(TSVAL_LEAD);
    let unsent = hs.server_isn.wrapping_add(1 << 30);
    [
        forged_segment(a, b, hs, seq, None, tsval),
        forged_segment(a, b, hs, seq, Some(unsent), tsval),
    ]
}

/// Writes `msg` on a plain-TCP connection to the echo server and reads it back.
fn plain_echo(s: &mut TcpStream, msg: &[u8], after: &str) {
    s.write_all(msg).expect("write");
    let mut got = vec![0u8; msg.len()];
    s.read_exact(&mut got)
        .unwrap_or_else(|e| panic!("no echo after {after}: {e}"));
    assert_eq!(got, msg, "echo after {after}");
}

/// A forged segment (no ACK, or an ACK of unsent data) with a TSval far in the future,
/// overlapping RCV.NXT, against a plain-TCP connection to the service port and against a
/// channel: both keep echoing, and a NetChannel client still gets through.
#[test]
fn a_forged_future_timestamp_stalls_no_connection() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let bin = example_binary("echo");
    let mut server = ExampleServer::start(&bed, &bin, SERVICE_PORT, &[]);
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());

    // The service port: a plain kernel TCP connection.
    bed.run_in(Side::B, {
        let (a, b) = (a.clone(), b.clone());
        move || {
            let raw = RawSocket::open(b.ifindex);
            let target = SocketAddr::from((a.ipv4, SERVICE_PORT));
            let mut s = TcpStream::connect_timeout(&target, DEADLINE).expect("connect 7000");
            s.set_read_timeout(Some(ECHO_WAIT)).unwrap();
            let hs = watch_handshake(&raw, &a, &b, SERVICE_PORT);
            let msg: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
            plain_echo(&mut s, &msg, "nothing");
            let mut sent = msg.len() as u32;
            let [no_ack, _] = forgeries(&a, &b, &hs, sent);
            assert!(raw.send(&no_ack), "send the forged segment");
            plain_echo(&mut s, &msg, "a forged segment without ACK (plain TCP)");
            sent += msg.len() as u32;
            let [_, bad_ack] = forgeries(&a, &b, &hs, sent);
            assert!(raw.send(&bad_ack), "send the forged segment");
            plain_echo(
                &mut s,
                &msg,
                "a forged segment acking unsent data (plain TCP)",
            );
        }
    })
    .unwrap();
    assert!(server.running(), "the server died");

    // A channel: a kernel TCP connection to the channel port speaking the chunk format.
    bed.run_in(Side::B, {
        let (a, b) = (a.clone(), b.clone());
        move || {
            let raw = RawSocket::open(b.ifindex);
            let mut h = Hostile::open(SocketAddr::from((a.ipv4, CHANNEL_PORT)));
            h.s.set_read_timeout(Some(ECHO_WAIT)).unwrap();
            let hs = watch_handshake(&raw, &a, &b, CHANNEL_PORT);
            // Bytes the client has written: the preamble (8), then chunks.
            let mut sent = 8u32;
            let (port, isn) = (41_000u16, 1u32);
            let sisn = h.sync(port, isn, 1 << 20);
            sent += 16;
            let credit = sisn.wrapping_add(1 << 20);
            let msg = b"echoed across a forged segment".to_vec();
            let mut seq = isn;
            let mut echo = |h: &mut Hostile, sent: &mut u32, after: &str| {
                h.send(&chunk(port, SERVICE_PORT, seq, credit, DATA, &msg));
                seq = seq.wrapping_add(msg.len() as u32);
                *sent += 16 + msg.len() as u32;
                assert_eq!(h.read_echo(port, &msg), msg, "echo after {after}");
            };
            echo(&mut h, &mut sent, "nothing");
            let [no_ack, _] = forgeries(&a, &b, &hs, sent);
            assert!(raw.send(&no_ack));
            echo(&mut h, &mut sent, "a forged segment without ACK (channel)");
            let [_, bad_ack] = forgeries(&a, &b, &hs, sent);
            assert!(raw.send(&bad_ack));
            echo(
                &mut h,
                &mut sent,
                "a forged segment with an ACK of unsent data (channel)",
            );
        }
    })
    .unwrap();
    assert!(server.running(), "the server died");
    server.sigterm();
    let status = server.wait_exit();
    assert!(status.success(), "server exit: {status}");
}
