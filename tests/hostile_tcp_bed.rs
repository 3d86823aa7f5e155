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
//! - A gratuitous ARP that claims B's address for a MAC nobody has: it rewrites A's kernel
//!   neighbour entry, and the stack's check of a new peer's MAC must not then refuse B's
//!   connections. The forged entry costs one probe, which also corrects it. The check
//!   still works: a host that completes a handshake from another MAC than the one the
//!   address's owner answers that probe from is refused.
//!
//! - Plain-TCP connections (kernel peers) get RFC 9293 §3.8.4's keep-alive: off by
//!   default, whatever the stack's channels between stacks use.
//! - A SYN with a malformed option is answered, as Linux answers it.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use netdriver::tcp::SeqNumber;
use netdriver::wire::{
    emit_tcp_frame, parse_tcp_frame, tcp_payload_offset, ArpOperation, ArpRepr, EtherType,
    EthernetAddress, EthernetRepr, IpProtocol, Ipv4Repr, TcpFlags, TcpOptions, TcpRepr,
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

/// The MAC a forged ARP claims B's address for: no host on the bed has it.
const FORGED_MAC: [u8; 6] = [0x02, 0, 0, 0x0f, 0x0f, 0x0f];

/// A gratuitous ARP (a broadcast request whose sender and target are `ip`) claiming `ip`
/// for `mac`.
fn gratuitous_arp(ip: std::net::Ipv4Addr, mac: [u8; 6]) -> Vec<u8> {
    let mut f = vec![0u8; 42];
    EthernetRepr {
        src: EthernetAddress(mac),
        dst: EthernetAddress::BROADCAST,
        ethertype: EtherType::Arp,
    }
    .emit(&mut f)
    .unwrap();
    ArpRepr {
        operation: ArpOperation::Request,
        source_hw: EthernetAddress(mac),
        source_ip: ip,
        target_hw: EthernetAddress([0; 6]),
        target_ip: ip,
    }
    .emit(&mut f[14..])
    .unwrap();
    f
}

/// A's kernel neighbour entry for `ip` (`ip neigh show` output).
fn neighbour_entry(bed: &TestBed, ip: std::net::Ipv4Addr) -> String {
    bed.output_in(
        Side::A,
        "ip",
        &["neigh", "show", &ip.to_string(), "dev", "vA"],
    )
    .expect("ip neigh show")
}

fn mac_text(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// One gratuitous ARP from B claiming B's own address for a MAC nobody has rewrites A's
/// kernel entry for B (all of B's traffic to the stack goes over AF_XDP, so A's kernel
/// never re-verifies it). B's kernel clients must still get every new connection
/// through, and the entry is back at B's real MAC afterwards (the stack's probe).
#[test]
fn a_gratuitous_arp_locks_no_peer_out() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let bin = example_binary("echo");
    let mut server = ExampleServer::start(&bed, &bin, SERVICE_PORT, &[]);
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());
    let target = SocketAddr::from((a.ipv4, SERVICE_PORT));
    let echo_once = move |i: usize| -> std::io::Result<()> {
        let mut s = TcpStream::connect_timeout(&target, DEADLINE)?;
        s.set_read_timeout(Some(ECHO_WAIT))?;
        let msg = format!("connection {i} after a forged ARP").into_bytes();
        s.write_all(&msg)?;
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got)?;
        assert_eq!(got, msg);
        Ok(())
    };
    // A first connection: A's kernel learns B (from B's ARP request for A).
    bed.run_in(Side::B, move || echo_once(0))
        .unwrap()
        .expect("first echo");
    let real = mac_text(b.mac);
    let before = neighbour_entry(&bed, b.ipv4);
    assert!(before.contains(&real), "A's entry for B before: {before}");

    let forged = gratuitous_arp(b.ipv4, FORGED_MAC);
    let ifindex = b.ifindex;
    bed.run_in(Side::B, move || {
        assert!(
            RawSocket::open(ifindex).send(&forged),
            "send the forged ARP"
        )
    })
    .unwrap();
    let poisoned = neighbour_entry(&bed, b.ipv4);
    assert!(
        poisoned.contains(&mac_text(FORGED_MAC)),
        "the forged ARP did not reach A's kernel: {poisoned}"
    );

    let results = bed
        .run_in(Side::B, move || {
            (1..=10)
                .map(|i| echo_once(i).map_err(|e| format!("connection {i}: {e}")))
                .collect::<Vec<_>>()
        })
        .unwrap();
    let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "refused after a forged ARP: {failed:?}");
    let after = neighbour_entry(&bed, b.ipv4);
    assert!(
        after.contains(&real),
        "A's entry for B was not re-probed back to B's MAC: {after}"
    );
    assert!(server.running(), "the server died");
    server.sigterm();
    let status = server.wait_exit();
    assert!(status.success(), "server exit: {status}");
}

/// An ARP frame (`op`) from `src_mac` saying that `src_ip` is at `src_mac`, to `dst_mac`
/// about `dst_ip`.
fn arp_frame(
    op: ArpOperation,
    src_mac: [u8; 6],
    src_ip: std::net::Ipv4Addr,
    dst_mac: [u8; 6],
    dst_ip: std::net::Ipv4Addr,
) -> Vec<u8> {
    let mut f = vec![0u8; 42];
    EthernetRepr {
        src: EthernetAddress(src_mac),
        dst: EthernetAddress(dst_mac),
        ethertype: EtherType::Arp,
    }
    .emit(&mut f)
    .unwrap();
    ArpRepr {
        operation: op,
        source_hw: EthernetAddress(src_mac),
        source_ip: src_ip,
        target_hw: EthernetAddress(if op == ArpOperation::Request {
            [0; 6]
        } else {
            dst_mac
        }),
        target_ip: dst_ip,
    }
    .emit(&mut f[14..])
    .unwrap();
    f
}

/// The MAC of the owner of B's address in the impostor test (no interface has it; a raw
/// socket answers ARP for it).
const OWNER_MAC: [u8; 6] = [0x02, 0, 0, 0x0e, 0x0e, 0x0e];

/// A host that claims B's address from B's MAC while the address's owner answers ARP from
/// another MAC: A's kernel had learnt the owner's MAC, the impostor's passive open is
/// disputed, the stack's probe is answered by the owner, and the impostor's connection
/// is reset.
#[test]
fn a_passive_open_from_an_impostors_mac_is_refused_once_the_owner_answers() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let bin = example_binary("echo");
    let mut server = ExampleServer::start(&bed, &bin, SERVICE_PORT, &[]);
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());
    // B's kernel (the impostor) never answers ARP, and knows A by hand.
    bed.output_in(Side::B, "arptables", &["-A", "OUTPUT", "-j", "DROP"])
        .expect("arptables in B");
    #[rustfmt::skip]
    bed.output_in(Side::B, "ip", &[
        "neigh", "replace", &a.ipv4.to_string(), "lladdr", &mac_text(a.mac),
        "dev", &b.ifname, "nud", "permanent",
    ])
    .expect("ip neigh replace in B");
    // A's kernel learnt B's address at the owner's MAC.
    #[rustfmt::skip]
    bed.output_in(Side::A, "ip", &[
        "neigh", "replace", &b.ipv4.to_string(), "lladdr", &mac_text(OWNER_MAC),
        "dev", &a.ifname, "nud", "stale",
    ])
    .expect("ip neigh replace in A");
    // The owner answers every ARP request for B's address.
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let owner = {
        let (stop, b) = (stop.clone(), b.clone());
        bed.spawn_thread_in(Side::B, move || {
            use netdriver::wire::{ArpPacket, EthernetFrame};
            let raw = RawSocket::open(b.ifindex);
            ready_tx.send(()).unwrap();
            let mut buf = vec![0u8; 2048];
            let mut answered = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let Some(n) = raw.recv(&mut buf) else {
                    continue;
                };
                let Ok(eth) = EthernetFrame::new_checked(&buf[..n]) else {
                    continue;
                };
                if EthernetRepr::parse(&eth).map(|e| e.ethertype) != Ok(EtherType::Arp) {
                    continue;
                }
                let Ok(arp) = ArpPacket::new_checked(&buf[14..n]).and_then(|p| ArpRepr::parse(&p))
                else {
                    continue;
                };
                if arp.operation == ArpOperation::Request && arp.target_ip == b.ipv4 {
                    let reply = arp_frame(
                        ArpOperation::Reply,
                        OWNER_MAC,
                        b.ipv4,
                        arp.source_hw.0,
                        arp.source_ip,
                    );
                    assert!(raw.send(&reply));
                    answered += 1;
                }
            }
            answered
        })
        .unwrap()
    };
    ready_rx.recv_timeout(DEADLINE).unwrap();
    let target = SocketAddr::from((a.ipv4, SERVICE_PORT));
    let read = bed
        .run_in(Side::B, move || -> std::io::Result<usize> {
            let mut s = TcpStream::connect_timeout(&target, DEADLINE)?;
            s.set_read_timeout(Some(ECHO_WAIT))?;
            let mut buf = [0u8; 16];
            s.read(&mut buf)
        })
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    let answered = owner.join().unwrap();
    assert_eq!(
        read.as_ref().map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionReset),
        "the impostor's connection: {read:?} (owner's ARP answers: {answered})"
    );
    assert!(answered >= 1, "nobody asked the owner");
    let entry = neighbour_entry(&bed, b.ipv4);
    assert!(
        entry.contains(&mac_text(OWNER_MAC)) && entry.contains("REACHABLE"),
        "A's entry for B: {entry}"
    );
    assert!(server.running(), "the server died");
    server.sigterm();
    assert!(server.wait_exit().success());
}

/// A kernel peer of a plain-TCP stream sees no keep-alive probe, even from a stack whose
/// channels probe after 200 ms idle: RFC 9293 §3.8.4 wants keep-alive off by default (and
/// at least two hours idle when a socket turns it on). Probes are recognised by their
/// sequence number, SND.UNA − 1.
#[test]
fn a_kernel_peer_sees_no_keepalive_probe_by_default() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());
    let stack = {
        let (ifname, ipv4) = (a.ifname.clone(), a.ipv4);
        bed.run_in(Side::A, move || {
            netchannel::Stack::builder()
                .interface(ifname)
                .ipv4(ipv4)
                .keepalive(Some(Duration::from_millis(200)))
                .keepalive_interval(Duration::from_millis(100))
                .keepalive_probes(3)
                .build()
        })
        .unwrap()
        .expect("build the stack")
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(stack.bind(SocketAddr::from((a.ipv4, 7200))))
        .unwrap();
    let server = rt.spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        assert!(s.is_plain_tcp());
        let mut buf = [0u8; 64];
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).await.unwrap();
        }
    });
    let probes = bed
        .run_in(Side::B, move || {
            let raw = RawSocket::open(b.ifindex);
            let mut s = TcpStream::connect_timeout(&SocketAddr::from((a.ipv4, 7200)), DEADLINE)
                .expect("connect");
            s.set_read_timeout(Some(ECHO_WAIT)).unwrap();
            let hs = watch_handshake(&raw, &a, &b, 7200);
            plain_echo(&mut s, b"before", "nothing");
            // Idle for ten keep-alive periods of the stack's channels.
            let server_una = hs.server_isn.wrapping_add(1 + 6);
            let mut probes = 0;
            let mut buf = vec![0u8; 4096];
            let end = Instant::now() + Duration::from_secs(2);
            while Instant::now() < end {
                let Some(n) = raw.recv(&mut buf) else {
                    continue;
                };
                let Ok(f) = parse_tcp_frame(&buf[..n], false) else {
                    continue;
                };
                let probe = f.ip.src == a.ipv4
                    && f.tcp.src_port == 7200
                    && f.payload.is_empty()
                    && f.tcp.seq.0 == server_una.wrapping_sub(1);
                probes += usize::from(probe);
            }
            plain_echo(&mut s, b"after", "two seconds idle");
            probes
        })
        .unwrap();
    assert_eq!(probes, 0, "keep-alive probes sent to a kernel peer");
    rt.block_on(server).unwrap();
    drop(rt);
    drop(stack);
}

/// A SYN from B with a malformed option: MSS 1460, then a window-scale option whose
/// length byte is 0.
fn syn_with_malformed_option(a: &Endpoint, b: &Endpoint, src_port: u16, dst_port: u16) -> Vec<u8> {
    let tcp = TcpRepr {
        src_port,
        dst_port,
        seq: SeqNumber(0x1234_5678),
        ack: None,
        flags: TcpFlags::SYN,
        window: 64240,
        urgent: 0,
        options: TcpOptions {
            mss: Some(1460),
            window_scale: Some(7),
            ..TcpOptions::default()
        },
    };
    let mut frame = vec![0u8; tcp_payload_offset(&tcp)];
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
    let len = emit_tcp_frame(&mut frame, &eth, &ip, 9, &tcp, 0).expect("emit");
    frame.truncate(len);
    // Options at 54: MSS (4 bytes), NOP, then window scale: kind 3 at 59, length at 60.
    assert_eq!((frame[59], frame[60]), (3, 3), "option layout");
    frame[60] = 0;
    let mut packet = netdriver::wire::TcpPacket::new_unchecked(&mut frame[34..]);
    packet.fill_checksum(b.ipv4, a.ipv4);
    frame
}

/// A SYN with a malformed option gets a SYN-ACK from the stack, as from Linux (a kernel
/// listener in A, beside the stack, shows it): RFC 9293 §3.1 and §3.2 (MUST-7) leave the
/// reaction to an illegal option length open; Linux ignores the options from the
/// malformed one on and answers, and so does the stack, without window scaling then.
#[test]
fn a_syn_with_a_malformed_option_is_answered_like_linux() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let bin = example_binary("echo");
    let mut server = ExampleServer::start(&bed, &bin, SERVICE_PORT, &[]);
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());
    const KERNEL_PORT: u16 = 7301;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let kernel = {
        let ip = a.ipv4;
        bed.spawn_thread_in(Side::A, move || {
            let l = std::net::TcpListener::bind((ip, KERNEL_PORT)).unwrap();
            ready_tx.send(()).unwrap();
            let _ = done_rx.recv_timeout(DEADLINE);
            drop(l);
        })
        .unwrap()
    };
    ready_rx.recv_timeout(DEADLINE).unwrap();
    let answers = bed
        .run_in(Side::B, {
            let (a, b) = (a.clone(), b.clone());
            move || {
                let raw = RawSocket::open(b.ifindex);
                let targets = [(40_001u16, SERVICE_PORT), (40_002, KERNEL_PORT)];
                for (src, dst) in targets {
                    assert!(raw.send(&syn_with_malformed_option(&a, &b, src, dst)));
                }
                let mut answers: [Option<TcpOptions>; 2] = [None, None];
                let mut buf = vec![0u8; 4096];
                let end = Instant::now() + ECHO_WAIT;
                while answers.iter().any(Option::is_none) && Instant::now() < end {
                    let Some(n) = raw.recv(&mut buf) else {
                        continue;
                    };
                    let Ok(f) = parse_tcp_frame(&buf[..n], false) else {
                        continue;
                    };
                    let synack = f.tcp.flags.syn() && f.tcp.ack == Some(SeqNumber(0x1234_5679));
                    for (i, (src, dst)) in targets.iter().enumerate() {
                        if synack && f.tcp.src_port == *dst && f.tcp.dst_port == *src {
                            answers[i] = Some(f.tcp.options);
                        }
                    }
                }
                answers
            }
        })
        .unwrap();
    done_tx.send(()).unwrap();
    kernel.join().unwrap();
    let [ours, linux] = answers;
    let linux = linux.expect("Linux answers a SYN with a malformed option");
    let ours = ours.expect("the stack answers a SYN with a malformed option, as Linux does");
    assert_eq!(linux.window_scale, None, "{linux:?}");
    assert_eq!(ours.window_scale, None, "{ours:?}");
    assert!(ours.mss.is_some(), "{ours:?}");
    assert!(server.running(), "the server died");
    server.sigterm();
    assert!(server.wait_exit().success());
}
