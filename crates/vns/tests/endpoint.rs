//! Connection lifecycle tests over the simulation harness.

mod common;

use common::{pattern, small_config, Sim, A, B};
use std::time::{Duration, Instant};

use vns::{
    AppClass, ChannelClass, ChannelError, ChannelId, ChunkRepr, ChunkType, Endpoint, Error, Event,
    PeerId, Seq, SocketId, SocketOptions, RESET_ORDERED,
};

fn connect(sim: &mut Sim, port: u16) -> (vns::SocketId, vns::SocketId) {
    let c = sim.ends[A]
        .connect(PeerId(1), port, AppClass::Throughput)
        .unwrap();
    sim.settle();
    assert!(sim.ends[A].is_connected(c));
    let s = sim.ends[B].accept(port).unwrap();
    (c, s)
}

fn events(sim: &mut Sim, end: usize) -> Vec<Event> {
    std::iter::from_fn(|| sim.ends[end].poll_events()).collect()
}

fn read_all(sim: &mut Sim, end: usize, sock: vns::SocketId) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    let mut buf = [0u8; 777];
    loop {
        match sim.ends[end].recv(sock, &mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(Error::WouldBlock) => {
                if sim.step() == 0 && sim.idle() {
                    return Err(Error::WouldBlock);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

#[test]
fn handshake_connects_and_reports_events() {
    let mut sim = Sim::throughput(3, small_config(256), 512, 1);
    sim.ends[B].bind(80, 4).unwrap();
    let c = sim.ends[A]
        .connect(PeerId(1), 80, AppClass::Throughput)
        .unwrap();
    assert!(!sim.ends[A].is_connected(c));
    assert_eq!(sim.ends[B].accept(80), Err(Error::WouldBlock));
    sim.settle();
    assert!(sim.ends[A].is_connected(c));
    assert!(events(&mut sim, A).contains(&Event::Connected(c)));
    assert!(events(&mut sim, B).contains(&Event::Incoming { port: 80 }));
    let s = sim.ends[B].accept(80).unwrap();
    let (peer, local, remote) = sim.ends[B].socket_addr(s).unwrap();
    assert_eq!((peer, local), (PeerId(0), 80));
    assert_eq!(sim.ends[A].socket_addr(c).unwrap(), (PeerId(1), remote, 80));
    assert_eq!(sim.ends[B].bind(80, 1), Err(Error::AddrInUse));
}

#[test]
fn connect_to_unbound_port_is_refused() {
    let mut sim = Sim::throughput(2, small_config(256), 512, 2);
    let c = sim.ends[A]
        .connect(PeerId(1), 81, AppClass::Throughput)
        .unwrap();
    sim.ends[A].send(c, b"queued before refusal").unwrap();
    sim.settle();
    assert!(events(&mut sim, A).contains(&Event::Failed(c)));
    assert_eq!(
        sim.ends[A].recv(c, &mut [0; 8]),
        Err(Error::ConnectionRefused)
    );
    assert_eq!(sim.ends[A].send(c, b"x"), Err(Error::ConnectionRefused));
    assert_eq!(
        Error::ConnectionRefused.kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    sim.ends[A].close(c);
    assert_eq!(sim.ends[A].recv(c, &mut [0; 8]), Err(Error::InvalidSocket));
}

/// A full backlog drops the SYNC unanswered, as Linux drops a SYN, and the client sends
/// the same SYNC again after `Config::sync_retry`, doubling the wait; it gets in once an
/// accept has made room. It is never refused.
#[test]
fn a_full_backlog_drops_the_sync_and_the_client_retries() {
    let mut sim = Sim::throughput(2, small_config(256), 512, 3);
    let retry = sim.ends[A].config().sync_retry;
    let t0 = std::time::Instant::now();
    sim.ends[A].handle_timeout(t0);
    sim.ends[B].bind(90, 2).unwrap();
    let socks: Vec<_> = (0..3)
        .map(|_| {
            sim.ends[A]
                .connect(PeerId(1), 90, AppClass::Throughput)
                .unwrap()
        })
        .collect();
    sim.settle();
    // The SYNCs race over two channels: any two get in, the third waits.
    let waiting: Vec<_> = socks
        .iter()
        .copied()
        .filter(|&s| !sim.ends[A].is_connected(s))
        .collect();
    assert_eq!(waiting.len(), 1);
    let w = waiting[0];
    assert_eq!(sim.ends[A].recv(w, &mut [0; 1]), Err(Error::WouldBlock));
    assert_eq!(sim.ends[B].counters().backlog_full_syncs, 1);
    assert_eq!(sim.ends[B].counters().refused_syncs, 0);
    // The first handle_timeout only sets the retry time; it is due `retry` later.
    sim.ends[A].handle_timeout(t0);
    assert_eq!(sim.ends[A].poll_timeout(), Some(t0 + retry));
    sim.ends[A].handle_timeout(t0 + retry - std::time::Duration::from_millis(1));
    sim.settle();
    assert_eq!(sim.ends[A].counters().sync_retries, 0);
    // Due with the backlog still full: dropped again, and the wait doubles.
    sim.ends[A].handle_timeout(t0 + retry);
    sim.settle();
    assert_eq!(sim.ends[A].counters().sync_retries, 1);
    assert_eq!(sim.ends[B].counters().backlog_full_syncs, 2);
    assert!(!sim.ends[A].is_connected(w));
    assert_eq!(sim.ends[A].poll_timeout(), Some(t0 + retry * 3));
    // An accept makes room; the next try gets in.
    sim.ends[B].accept(90).unwrap();
    sim.ends[A].handle_timeout(t0 + retry * 3);
    sim.settle();
    assert!(sim.ends[A].is_connected(w));
    assert_eq!(sim.ends[A].counters().sync_retries, 2);
    assert_eq!(sim.ends[B].counters().backlog_full_syncs, 2);
    // Connected sockets are forgotten: nothing is timed any more.
    sim.ends[A].handle_timeout(t0 + retry * 7);
    assert_eq!(sim.ends[A].poll_timeout(), None);
    assert_eq!(sim.ends[A].counters().sync_retries, 2);
    // The retried socket is a whole connection: bytes go both ways.
    let s = sim.ends[B].accept(90).unwrap();
    let s2 = sim.ends[B].accept(90).unwrap();
    sim.ends[A].send(w, b"late").unwrap();
    sim.settle();
    let mut got = [0u8; 4];
    let n = [s, s2]
        .iter()
        .map(|&x| sim.ends[B].recv(x, &mut got).unwrap_or(0))
        .sum::<usize>();
    assert_eq!(n, 4);
    assert_eq!(&got, b"late");
}

/// A retried SYNC that crosses the SYNC_ACK (the backlog had room after all) is ignored:
/// one connection, not two.
#[test]
fn a_retried_sync_for_an_existing_socket_is_ignored() {
    let mut sim = Sim::throughput(1, small_config(256), 512, 5);
    let retry = sim.ends[A].config().sync_retry;
    let t0 = std::time::Instant::now();
    sim.ends[B].bind(91, 4).unwrap();
    let c = sim.ends[A]
        .connect(PeerId(1), 91, AppClass::Throughput)
        .unwrap();
    // The SYNC reaches B, but A retries before the SYNC_ACK is back.
    sim.pump_tx();
    sim.deliver(0, A, usize::MAX);
    sim.ends[A].handle_timeout(t0);
    sim.ends[A].handle_timeout(t0 + retry);
    assert_eq!(sim.ends[A].counters().sync_retries, 1);
    sim.settle();
    assert!(sim.ends[A].is_connected(c));
    sim.ends[B].accept(91).unwrap();
    assert_eq!(sim.ends[B].accept(91), Err(Error::WouldBlock));
    assert_eq!(sim.ends[B].counters().backlog_full_syncs, 0);
}

#[test]
fn no_channel_of_the_class_is_an_error() {
    let mut sim = Sim::throughput(1, small_config(256), 512, 4);
    assert_eq!(
        sim.ends[A].connect(PeerId(1), 1, AppClass::Latency),
        Err(Error::NoChannel)
    );
    assert_eq!(
        sim.ends[A].connect(PeerId(9), 1, AppClass::Throughput),
        Err(Error::NoChannel)
    );
}

/// A vectored send joins its pieces in the send buffer: three small pieces leave as one
/// DATA chunk (one header on the wire), where three sends of them would each be theirs.
#[test]
fn a_vectored_send_leaves_as_one_chunk() {
    use std::io::IoSlice;
    let mut sim = Sim::throughput(1, small_config(300), 4096, 6);
    sim.ends[B].bind(8, 1).unwrap();
    let (c, s) = connect(&mut sim, 8);
    sim.settle();
    let pieces = [
        IoSlice::new(b"one,"),
        IoSlice::new(b""),
        IoSlice::new(b"two,three"),
    ];
    assert_eq!(sim.ends[A].send_vectored(c, &pieces), Ok(13));
    sim.pump_tx();
    assert_eq!(sim.wire_bytes(0, A), vns::wire::HEADER_LEN + 13);
    sim.settle();
    let mut got = [0u8; 13];
    assert_eq!(sim.ends[B].recv(s, &mut got), Ok(13));
    assert_eq!(&got, b"one,two,three");
    // Bounded by the send buffer like `send`: the pieces are taken in order up to it.
    let cap = sim.ends[A].config().send_buffer;
    let big = vec![7u8; cap];
    let n = sim.ends[A]
        .send_vectored(c, &[IoSlice::new(b"xy"), IoSlice::new(&big)])
        .unwrap();
    assert_eq!(n, cap);
    assert_eq!(
        sim.ends[A].send_vectored(c, &[IoSlice::new(b"z")]),
        Err(Error::WouldBlock)
    );
}

/// Per-socket buffers, set before the handshake as `SO_SNDBUF`/`SO_RCVBUF` are: a
/// connecting socket's SYNC and a listener's SYNC_ACKs announce a credit window scaled to
/// the receive buffer (the configuration's 2:1), and the send buffer bounds `send`.
#[test]
fn socket_options_size_each_sockets_buffers_and_window() {
    let mut sim = Sim::throughput(1, small_config(256), 4096, 7);
    let cfg = sim.ends[A].config().clone();
    assert_eq!((cfg.recv_buffer, cfg.credit_window), (1024, 2048));
    sim.ends[B].bind(10, 4).unwrap();
    let mut small = SocketOptions::default();
    small.recv_buffer = Some(512);
    small.send_buffer = Some(100);
    let c = sim.ends[A]
        .connect_with(PeerId(1), 10, AppClass::Throughput, small)
        .unwrap();
    sim.settle();
    let s = sim.ends[B].accept(10).unwrap();
    let (cs, ss) = (
        sim.ends[A].socket_stats(c).unwrap(),
        sim.ends[B].socket_stats(s).unwrap(),
    );
    assert_eq!(cs.reorder_capacity, 512);
    // The peer may send our window: 2 × 512.
    assert_eq!(ss.send_credit, 1024);
    assert_eq!(
        ss.reorder_capacity, 1024,
        "the listener's sockets: the defaults"
    );
    assert_eq!(cs.send_credit, 2048);
    assert_eq!(sim.ends[A].send(c, &[1; 1000]), Ok(100));
    assert_eq!(sim.ends[A].send(c, &[1; 10]), Err(Error::WouldBlock));
    // The peer fills exactly our window and no more until we read.
    let data = pattern(3, 3000);
    let mut sent = 0;
    while let Ok(n) = sim.ends[B].send(s, &data[sent..]) {
        sent += n;
        sim.settle();
    }
    let cs = sim.ends[A].socket_stats(c).unwrap();
    assert_eq!(cs.reorder_bytes + cs.parked_bytes, 1024);
    let mut got = Vec::new();
    let mut buf = [0u8; 333];
    while got.len() < data.len() {
        if sent < data.len() {
            if let Ok(n) = sim.ends[B].send(s, &data[sent..]) {
                sent += n;
            }
        }
        match sim.ends[A].recv(c, &mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(Error::WouldBlock) => assert!(sim.step() > 0 || sent < data.len(), "stalled"),
            Err(e) => panic!("{e}"),
        }
    }
    assert!(got == data);
    // A listener's options reach the sockets it accepts.
    let mut big = SocketOptions::default();
    big.recv_buffer = Some(2048);
    sim.ends[B].set_listener_options(10, big).unwrap();
    let c2 = sim.ends[A]
        .connect(PeerId(1), 10, AppClass::Throughput)
        .unwrap();
    sim.settle();
    assert_eq!(sim.ends[A].socket_stats(c2).unwrap().send_credit, 4096);
    assert_eq!(
        sim.ends[B].set_listener_options(11, big),
        Err(Error::NotListening)
    );
    sim.ends[A].check_invariants().unwrap();
    sim.ends[B].check_invariants().unwrap();
}

fn read_all_until(sim: &mut Sim, end: usize, sock: vns::SocketId, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 333];
    while out.len() < len {
        match sim.ends[end].recv(sock, &mut buf) {
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(Error::WouldBlock) => assert!(sim.step() > 0 || !sim.idle(), "stalled"),
            Err(e) => panic!("{e}"),
        }
    }
    out
}

/// Nagle's algorithm with `nodelay` off (RFC 896): a short chunk waits while earlier data
/// is unacknowledged at the data level, and writes made meanwhile join it; it leaves when
/// the peer's credit acknowledges the data (its reply), when the hold of
/// `Config::nagle_delay` runs out, with the FIN, or when `nodelay` is turned on. A full
/// chunk never waits. With `nodelay` on (the default) nothing waits.
#[test]
fn nagle_holds_short_chunks_while_data_is_unacknowledged() {
    let mut sim = Sim::throughput(1, small_config(256), 4096, 8);
    let delay = sim.ends[A].config().nagle_delay;
    let t0 = std::time::Instant::now();
    sim.ends[A].handle_timeout(t0);
    sim.ends[B].bind(12, 1).unwrap();
    let (c, s) = connect(&mut sim, 12);
    sim.settle();
    assert_eq!(sim.ends[A].nodelay(c), Ok(true));
    let h = vns::wire::HEADER_LEN;
    // nodelay on: every write leaves as its own chunk.
    sim.ends[A].send(c, b"x").unwrap();
    sim.pump_tx();
    sim.ends[A].send(c, b"y").unwrap();
    sim.pump_tx();
    assert_eq!(sim.wire_bytes(0, A), 2 * (h + 1));
    sim.settle();
    assert_eq!(sim.ends[B].recv(s, &mut [0; 2]), Ok(2));
    // B's read acknowledged them only once its credit reaches A: a reply carries it.
    sim.ends[B].send(s, b"k").unwrap();
    sim.settle();
    assert_eq!(sim.ends[A].recv(c, &mut [0; 1]), Ok(1));
    assert!(!sim.ends[A].timers_changed());

    sim.ends[A].set_nodelay(c, false).unwrap();
    // Nothing unacknowledged: the first short chunk goes at once.
    sim.ends[A].send(c, b"a").unwrap();
    sim.pump_tx();
    assert_eq!(sim.wire_bytes(0, A), h + 1);
    // Then "b" and "c" wait, together.
    sim.ends[A].send(c, b"b").unwrap();
    sim.pump_tx();
    sim.ends[A].send(c, b"c").unwrap();
    sim.pump_tx();
    assert_eq!(sim.wire_bytes(0, A), h + 1);
    assert!(
        sim.ends[A].timers_changed(),
        "a driver must learn of the hold"
    );
    sim.ends[A].handle_timeout(t0);
    assert_eq!(sim.ends[A].poll_timeout(), Some(t0 + delay));
    sim.settle();
    // The hold runs out: "bc" leaves as one chunk.
    sim.ends[A].handle_timeout(t0 + delay);
    sim.pump_tx();
    assert_eq!(sim.wire_bytes(0, A), h + 2);
    sim.settle();
    let mut got = [0u8; 3];
    assert_eq!(sim.ends[B].recv(s, &mut got), Ok(3));
    assert_eq!(&got, b"abc");

    // A reply acknowledges what B read: what waited leaves without the timer.
    sim.ends[A].send(c, b"d").unwrap();
    sim.pump_tx();
    assert_eq!(sim.wire_bytes(0, A), 0, "\"abc\" is not acknowledged yet");
    sim.ends[B].send(s, b"r").unwrap();
    sim.settle();
    assert_eq!(sim.ends[B].recv(s, &mut got), Ok(1));
    assert_eq!(got[0], b'd');

    // A full chunk never waits; its short remainder does.
    let full = pattern(4, 256 + 10);
    assert_eq!(sim.ends[A].send(c, &full), Ok(266));
    sim.pump_tx();
    assert_eq!(sim.wire_bytes(0, A), h + 256);
    // Turning nodelay on sends the remainder at once.
    sim.ends[A].set_nodelay(c, true).unwrap();
    sim.pump_tx();
    assert_eq!(sim.wire_bytes(0, A), 2 * h + 266);
    sim.settle();
    assert_eq!(read_all_until(&mut sim, B, s, 266), full);

    // The FIN takes what waits with it.
    sim.ends[A].set_nodelay(c, false).unwrap();
    sim.ends[A].send(c, b"e").unwrap();
    sim.pump_tx();
    sim.ends[A].send(c, b"f").unwrap();
    sim.ends[A].shutdown(c).unwrap();
    sim.settle();
    assert_eq!(read_all(&mut sim, B, s).unwrap(), b"ef");
    sim.ends[A].check_invariants().unwrap();
}

/// A SYNC sent again (a retry) that arrives after the connection it opened is gone must
/// not queue a phantom connection: the listener remembers the ports and initial sequence
/// number of the SYNCs it accepted (TIME-WAIT's job for a late duplicate SYN). A SYNC
/// from the same ports with another initial sequence number is a new connection.
#[test]
fn a_sync_repeated_after_its_connection_is_gone_queues_no_phantom() {
    let mut sim = Sim::throughput(1, small_config(256), 4096, 14);
    sim.ends[B].bind(95, 4).unwrap();
    let (c, s) = connect(&mut sim, 95);
    let (_, local, _) = sim.ends[A].socket_addr(c).unwrap();
    // The first connection's ISN: `small_config` makes the series predictable.
    let isn = Seq(0x4e43_0001);
    let sync = |seq| {
        let mut b = Vec::new();
        ChunkRepr {
            src_port: local,
            dst_port: 95,
            seq,
            credit: 2048,
            ty: ChunkType::Sync,
            payload_len: 0,
        }
        .emit_to_vec(&[], &mut b);
        b
    };
    // Close both ways; the sockets go.
    sim.ends[A].shutdown(c).unwrap();
    sim.ends[B].shutdown(s).unwrap();
    sim.settle();
    assert_eq!(sim.ends[A].recv(c, &mut [0; 1]), Ok(0));
    assert_eq!(sim.ends[B].recv(s, &mut [0; 1]), Ok(0));
    sim.ends[A].close(c);
    sim.ends[B].close(s);
    sim.settle();
    assert!(
        sim.ends[B].socket_stats(s).is_none(),
        "the server socket is gone"
    );
    // The late copy of the first SYNC: dropped, nothing to accept.
    sim.ends[B]
        .handle_chunk_bytes(ChannelId(0), &sync(isn))
        .unwrap();
    assert_eq!(sim.ends[B].accept(95), Err(Error::WouldBlock));
    assert_eq!(sim.ends[B].counters().duplicate_syncs, 1);
    // Same ports, another ISN: a new connection.
    sim.ends[B]
        .handle_chunk_bytes(ChannelId(0), &sync(Seq(0x1234_5678)))
        .unwrap();
    assert!(sim.ends[B].accept(95).is_ok());
    assert_eq!(sim.ends[B].counters().duplicate_syncs, 1);
}

#[test]
fn half_close_then_read_to_eof_both_ways() {
    let mut sim = Sim::throughput(4, small_config(300), 700, 5);
    sim.ends[B].bind(7, 1).unwrap();
    let (c, s) = connect(&mut sim, 7);
    let up = pattern(1, 5000);
    let down = pattern(2, 4000);
    let mut sent = 0;
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while got.len() < up.len() {
        if sent < up.len() {
            if let Ok(n) = sim.ends[A].send(c, &up[sent..]) {
                sent += n;
            }
        }
        match sim.ends[B].recv(s, &mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(Error::WouldBlock) => {
                sim.step();
            }
            Err(e) => panic!("{e}"),
        }
    }
    sim.ends[A].shutdown(c).unwrap();
    assert_eq!(sim.ends[A].send(c, b"late"), Err(Error::WriteClosed));
    assert_eq!(read_all(&mut sim, B, s).unwrap(), Vec::<u8>::new());
    assert_eq!(got, up);
    // The server can still write after the client's FIN; the client still reads.
    let mut off = 0;
    let mut back = Vec::new();
    while off < down.len() || back.len() < down.len() {
        if off < down.len() {
            if let Ok(n) = sim.ends[B].send(s, &down[off..]) {
                off += n;
            }
        }
        match sim.ends[A].recv(c, &mut buf) {
            Ok(n) => back.extend_from_slice(&buf[..n]),
            Err(Error::WouldBlock) => {
                sim.step();
            }
            Err(e) => panic!("{e}"),
        }
    }
    sim.ends[B].shutdown(s).unwrap();
    assert_eq!(read_all(&mut sim, A, c).unwrap(), Vec::<u8>::new());
    assert_eq!(back, down);
    assert_eq!(sim.ends[A].recv(c, &mut buf), Ok(0));
    // Both closed gracefully: no reset anywhere, and the sockets are released.
    sim.ends[A].close(c);
    sim.ends[B].close(s);
    sim.settle();
    assert!(!events(&mut sim, A)
        .iter()
        .any(|e| matches!(e, Event::Failed(_))));
    assert!(!events(&mut sim, B)
        .iter()
        .any(|e| matches!(e, Event::Failed(_))));
    assert_eq!(sim.ends[B].recv(s, &mut buf), Err(Error::InvalidSocket));
}

#[test]
fn close_after_shutdown_lingers_until_data_is_delivered() {
    let mut sim = Sim::throughput(2, small_config(256), 512, 6);
    sim.ends[B].bind(7, 1).unwrap();
    let (c, s) = connect(&mut sim, 7);
    let data = pattern(3, 900);
    assert_eq!(sim.ends[A].send(c, &data).unwrap(), 900);
    sim.ends[A].shutdown(c).unwrap();
    sim.ends[A].close(c);
    assert_eq!(read_all(&mut sim, B, s).unwrap(), data);
    sim.ends[B].shutdown(s).unwrap();
    sim.settle();
    assert!(
        sim.ends[A].socket_stats(c).is_none(),
        "client released after FIN exchange"
    );
    assert!(!events(&mut sim, B).contains(&Event::Failed(s)));
}

#[test]
fn close_without_shutdown_delivers_the_data_then_fin() {
    let mut sim = Sim::throughput(2, small_config(256), 512, 7);
    sim.ends[B].bind(7, 1).unwrap();
    let (c, s) = connect(&mut sim, 7);
    sim.ends[A].send(c, b"some bytes").unwrap();
    sim.settle();
    sim.ends[A].close(c);
    assert_eq!(read_all(&mut sim, B, s).unwrap(), b"some bytes");
    assert!(!events(&mut sim, B).contains(&Event::Failed(s)));
    assert_eq!(
        sim.ends[B].send(s, b"x"),
        Ok(1),
        "the peer's write side is open"
    );
}

#[test]
fn close_with_unread_data_resets_even_after_shutdown() {
    let mut sim = Sim::throughput(1, small_config(256), 512, 8);
    sim.ends[B].bind(7, 1).unwrap();
    let (c, s) = connect(&mut sim, 7);
    sim.ends[B].send(s, b"unread").unwrap();
    sim.settle();
    sim.ends[A].shutdown(c).unwrap();
    sim.ends[A].close(c);
    sim.settle();
    assert_eq!(
        sim.ends[B].recv(s, &mut [0; 16]),
        Err(Error::ConnectionReset)
    );
}

#[test]
fn data_to_a_closed_socket_resets_the_sender() {
    let mut sim = Sim::throughput(1, small_config(256), 512, 9);
    sim.ends[B].bind(7, 1).unwrap();
    let (c, s) = connect(&mut sim, 7);
    sim.ends[A].shutdown(c).unwrap();
    sim.ends[A].close(c);
    sim.settle();
    assert_eq!(sim.ends[B].recv(s, &mut [0; 4]), Ok(0));
    sim.ends[B].send(s, b"nobody reads this").unwrap();
    sim.settle();
    assert_eq!(sim.ends[B].send(s, b"x"), Err(Error::ConnectionReset));
}

#[test]
fn lost_channel_moves_its_sockets_to_the_remaining_channel() {
    let classes = [ChannelClass::Throughput, ChannelClass::Latency];
    let mut sim = Sim::new(small_config(256), &classes, 512, 1 << 20, 10);
    sim.ends[B].bind(7, 4).unwrap();
    let bulk = sim.ends[A]
        .connect(PeerId(1), 7, AppClass::Throughput)
        .unwrap();
    let lat = sim.ends[A]
        .connect(PeerId(1), 7, AppClass::Latency)
        .unwrap();
    sim.settle();
    let s1 = sim.ends[B].accept(7).unwrap();
    let s2 = sim.ends[B].accept(7).unwrap();
    sim.ends[A].send(bulk, b"bulk").unwrap();
    sim.ends[A].send(lat, b"latency").unwrap();
    sim.settle();
    sim.drain_events();
    // "bulk" was delivered on channel 0 but not read, so not acknowledged: A keeps it.
    assert_eq!(sim.ends[A].socket_stats(bulk).unwrap().unacked_bytes, 4);
    sim.lose_channel(0);
    assert!(!events(&mut sim, A).contains(&Event::Failed(bulk)));
    assert!(sim.ends[A].counters().resent_chunks >= 1);
    let (bulk_b, lat_b) =
        if sim.ends[B].socket_addr(s1).unwrap().2 == sim.ends[A].socket_addr(bulk).unwrap().1 {
            (s1, s2)
        } else {
            (s2, s1)
        };
    sim.settle();
    // The resent copy arrived over the latency channel, the last one left, and was
    // dropped as a duplicate: the bytes are read once.
    assert!(sim.ends[B].counters().duplicate_chunks >= 1);
    let mut buf = [0u8; 16];
    assert_eq!(sim.ends[B].recv(bulk_b, &mut buf), Ok(4));
    assert_eq!(&buf[..4], b"bulk");
    // The bulk socket carries on over the remaining channel, both ways.
    sim.ends[A].send(bulk, b"more").unwrap();
    sim.ends[B].send(bulk_b, b"back").unwrap();
    sim.settle();
    assert_eq!(sim.ends[B].recv(bulk_b, &mut buf), Ok(4));
    assert_eq!(&buf[..4], b"more");
    assert_eq!(sim.ends[A].recv(bulk, &mut buf), Ok(4));
    assert_eq!(&buf[..4], b"back");
    assert_eq!(sim.ends[B].recv(lat_b, &mut buf), Ok(7));
    assert_eq!(&buf[..7], b"latency");
    for end in &sim.ends {
        end.check_invariants().unwrap();
    }
}

#[test]
fn sockets_without_a_channel_fail_after_the_loss_timeout_keeping_read_bytes() {
    let classes = [ChannelClass::Throughput, ChannelClass::Latency];
    let cfg = small_config(256);
    let wait = cfg.channel_loss_timeout;
    let mut sim = Sim::new(cfg, &classes, 512, 1 << 20, 12);
    sim.ends[B].bind(7, 4).unwrap();
    let bulk = sim.ends[A]
        .connect(PeerId(1), 7, AppClass::Throughput)
        .unwrap();
    sim.settle();
    let s = sim.ends[B].accept(7).unwrap();
    sim.ends[B].send(s, b"bulk").unwrap();
    sim.settle();
    sim.drain_events();
    // A's transport gave up on both channels (keep-alive or user timeout).
    let t0 = std::time::Instant::now();
    sim.ends[A].handle_timeout(t0);
    sim.ends[A].handle_channel_timed_out(sim.channels[0]);
    sim.ends[A].handle_channel_timed_out(sim.channels[1]);
    assert!(sim.ends[A].peer_orphaned(PeerId(1)));
    // It waits for a channel: writes are still taken.
    assert_eq!(sim.ends[A].send(bulk, b"x"), Ok(1));
    assert_eq!(sim.ends[A].poll_timeout(), Some(t0));
    sim.ends[A].handle_timeout(t0);
    assert_eq!(sim.ends[A].poll_timeout(), Some(t0 + wait));
    sim.ends[A].handle_timeout(t0 + wait / 2);
    assert!(!events(&mut sim, A).contains(&Event::Failed(bulk)));
    sim.ends[A].handle_timeout(t0 + wait);
    assert!(events(&mut sim, A).contains(&Event::Failed(bulk)));
    // The bytes received in order before stay readable, then the error.
    let mut buf = [0u8; 8];
    assert_eq!(sim.ends[A].recv(bulk, &mut buf), Ok(4));
    assert_eq!(&buf[..4], b"bulk");
    assert_eq!(
        sim.ends[A].recv(bulk, &mut buf),
        Err(Error::PeerUnreachable)
    );
    assert_eq!(sim.ends[A].send(bulk, b"x"), Err(Error::PeerUnreachable));
    assert!(!sim.ends[A].peer_orphaned(PeerId(1)));
    let e = std::io::Error::from(Error::PeerUnreachable);
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    assert!(e.to_string().contains("peer unreachable"), "{e}");
    assert_eq!(
        Error::ChannelLost.kind(),
        std::io::ErrorKind::ConnectionAborted
    );
}

#[test]
fn pending_connect_sends_its_sync_again_on_a_new_channel() {
    let mut sim = Sim::throughput(1, small_config(256), 512, 11);
    sim.ends[B].bind(7, 1).unwrap();
    let c = sim.ends[A]
        .connect(PeerId(1), 7, AppClass::Throughput)
        .unwrap();
    sim.pump_tx();
    sim.lose_channel(0);
    assert_eq!(sim.ends[A].recv(c, &mut [0; 4]), Err(Error::WouldBlock));
    // The stack opens channels again: the SYNC goes on the new one.
    sim.add_channel(ChannelClass::Throughput);
    sim.settle();
    assert!(sim.ends[A].is_connected(c));
    let s = sim.ends[B].accept(7).unwrap();
    sim.ends[A].send(c, b"hi").unwrap();
    sim.settle();
    assert_eq!(sim.ends[B].recv(s, &mut [0; 4]), Ok(2));
}

#[test]
fn pending_connect_fails_when_its_peer_is_gone() {
    let mut sim = Sim::throughput(1, small_config(256), 512, 11);
    sim.ends[B].bind(7, 1).unwrap();
    let c = sim.ends[A]
        .connect(PeerId(1), 7, AppClass::Throughput)
        .unwrap();
    sim.pump_tx();
    sim.lose_channel(0);
    // No channel could be opened again.
    sim.ends[A].handle_peer_gone(PeerId(1), Error::ChannelLost);
    assert_eq!(sim.ends[A].recv(c, &mut [0; 4]), Err(Error::ChannelLost));
}

#[test]
fn latency_sockets_use_only_latency_channels() {
    let classes = [
        ChannelClass::Throughput,
        ChannelClass::Latency,
        ChannelClass::Throughput,
        ChannelClass::Latency,
    ];
    let mut sim = Sim::new(small_config(128), &classes, 4096, 1 << 20, 12);
    sim.ends[B].bind(7, 1).unwrap();
    let lat = sim.ends[A]
        .connect(PeerId(1), 7, AppClass::Latency)
        .unwrap();
    sim.settle();
    let s = sim.ends[B].accept(7).unwrap();
    let data = pattern(4, 2000);
    let mut off = 0;
    let mut got = Vec::new();
    let mut buf = [0u8; 300];
    while got.len() < data.len() {
        if let Ok(n) = sim.ends[A].send(lat, &data[off..]) {
            off += n;
        }
        // Throughput channels must never carry a byte of it.
        assert_eq!(
            sim.ends[A]
                .channel_stats(ChannelId(0))
                .unwrap()
                .queued_bytes,
            0
        );
        assert_eq!(
            sim.ends[A]
                .channel_stats(ChannelId(2))
                .unwrap()
                .queued_bytes,
            0
        );
        assert_eq!(sim.wire_bytes(0, A) + sim.wire_bytes(2, A), 0);
        match sim.ends[B].recv(s, &mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => {
                sim.step();
            }
        }
    }
    assert_eq!(got, data);
}

#[test]
fn malformed_bytes_poison_the_channel() {
    let mut sim = Sim::throughput(2, small_config(256), 512, 13);
    sim.ends[B].bind(7, 1).unwrap();
    let (c, _s) = connect(&mut sim, 7);
    let ch = ChannelId(0);
    let mut bad = Vec::new();
    ChunkRepr {
        src_port: 1,
        dst_port: 2,
        seq: Seq(0),
        credit: 0,
        ty: ChunkType::Ack,
        payload_len: 0,
    }
    .emit_to_vec(&[], &mut bad);
    bad[12] = 0x24; // version 2
    let r = sim.ends[A].handle_chunk_bytes(ch, &bad);
    assert!(matches!(
        r,
        Err(ChannelError::Malformed(vns::wire::WireError::BadVersion(2)))
    ));
    assert_eq!(
        sim.ends[A].handle_chunk_bytes(ch, &bad),
        Err(ChannelError::UnknownChannel(ch))
    );
    // The socket moved to the other channel and lives on.
    assert!(sim.ends[A].channel_stats(ch).is_none());
    assert_eq!(sim.ends[A].recv(c, &mut [0; 4]), Err(Error::WouldBlock));
    assert_eq!(sim.ends[A].send(c, b"x"), Ok(1));
}

#[test]
fn data_overtaking_sync_ack_is_kept() {
    // Two channels; the server's SYNC_ACK goes back on the SYNC's channel, its data is
    // round-robined, so delivering channel 1 before channel 0 makes data overtake it.
    let mut sim = Sim::throughput(2, small_config(256), 1 << 16, 14);
    sim.ends[B].bind(7, 1).unwrap();
    let c = sim.ends[A]
        .connect(PeerId(1), 7, AppClass::Throughput)
        .unwrap();
    sim.pump_tx();
    let sync_ch = (0..2).find(|&i| sim.wire_bytes(i, A) > 0).unwrap();
    sim.deliver(sync_ch, A, usize::MAX);
    let s = sim.ends[B].accept(7).unwrap();
    let data = pattern(5, 1000);
    sim.ends[B].send(s, &data).unwrap();
    sim.ends[B].shutdown(s).unwrap();
    sim.pump_tx();
    let other = 1 - sync_ch;
    for _ in 0..10 {
        sim.deliver(other, B, usize::MAX);
        sim.pump_tx();
    }
    assert!(!sim.ends[A].is_connected(c));
    assert!(
        sim.ends[A].channel_parked_bytes(ChannelId(other as u32)) > 0,
        "early data is charged"
    );
    assert_eq!(read_all(&mut sim, A, c).unwrap(), data);
    assert_eq!(sim.ends[A].channel_parked_bytes(ChannelId(other as u32)), 0);
}

#[test]
fn last_resort_pauses_channel_reads_and_recovers() {
    // Budget of one chunk per channel and a credit window far past the receive buffer:
    // parking overflows and the endpoint must hold the channel instead of growing memory.
    let mut cfg = small_config(200);
    cfg.credit_window = 40 * 200;
    cfg.send_buffer = 40 * 200;
    cfg.channel_budget = 200;
    let mut sim = Sim::throughput(1, cfg.clone(), 1000, 15);
    sim.ends[B].bind(7, 1).unwrap();
    let (c, s) = connect(&mut sim, 7);
    let data = pattern(6, 8000);
    assert_eq!(sim.ends[A].send(c, &data).unwrap(), 8000);
    let mut paused = false;
    for _ in 0..2000 {
        sim.step();
        let parked = sim.ends[B].channel_parked_bytes(ChannelId(0));
        assert!(parked <= cfg.channel_budget);
        let st = sim.ends[B].socket_stats(s).unwrap();
        assert!(st.reorder_bytes <= cfg.recv_buffer);
        paused |= sim.ends[B].should_pause_channel_reads(ChannelId(0));
    }
    assert!(paused, "the channel was held as the last resort");
    sim.drain_events();
    assert!(sim.ends[B].socket_stats(s).unwrap().stop_sent);
    sim.ends[A].shutdown(c).unwrap();
    let got = read_all(&mut sim, B, s).unwrap();
    assert!(events(&mut sim, B).contains(&Event::ChannelUnpaused(ChannelId(0))));
    assert_eq!(got, data);
}

#[test]
fn stop_and_resume_apply_only_newer_epochs() {
    let cfg = small_config(256);
    let mut sim = Sim::throughput(2, cfg.clone(), 512, 16);
    sim.ends[B].bind(7, 1).unwrap();
    let (c, s) = connect(&mut sim, 7);
    let (_, local, _) = sim.ends[A].socket_addr(c).unwrap();
    // Three chunks sent and read: the peer may have reached epoch 6 (a STOP and a RESUME
    // per chunk it parked), no further.
    let sent = 3 * cfg.max_chunk_payload;
    assert_eq!(sim.ends[A].send(c, &pattern(8, sent)), Ok(sent));
    sim.settle();
    assert_eq!(read_all_now(&mut sim, B, s), pattern(8, sent));
    sim.settle();
    // The client is A's first connection: its credit limit is its ISN, plus what the
    // peer read, plus the window.
    let limit = Seq(cfg.first_isn.expect("small_config fixes it"))
        .plus((sent + cfg.credit_window) as u32)
        .0;
    let inject = |sim: &mut Sim, ty: ChunkType, epoch: u32| {
        let mut bytes = Vec::new();
        ChunkRepr {
            src_port: 7,
            dst_port: local,
            seq: Seq(epoch),
            credit: limit,
            ty,
            payload_len: 0,
        }
        .emit_to_vec(&[], &mut bytes);
        assert_eq!(sim.ends[A].handle_chunk_bytes(ChannelId(1), &bytes), Ok(16));
        sim.ends[A].socket_stats(c).unwrap().peer_stopped
    };
    assert!(inject(&mut sim, ChunkType::Stop, 2));
    // A RESUME from before that STOP (reordered across channels) is stale.
    assert!(inject(&mut sim, ChunkType::Resume, 1));
    assert!(inject(&mut sim, ChunkType::Ack, 5));
    assert!(!inject(&mut sim, ChunkType::Resume, 3));
    assert!(!inject(&mut sim, ChunkType::Stop, 3));
    // While stopped, nothing is cut from the send buffer even with credit.
    assert!(inject(&mut sim, ChunkType::Stop, 4));
    sim.ends[A].send(c, b"held back").unwrap();
    sim.settle();
    let st = sim.ends[A].socket_stats(c).unwrap();
    assert_eq!((st.unsent_bytes, st.send_credit), (9, cfg.credit_window));
    assert!(!inject(&mut sim, ChunkType::Resume, 5));
    sim.settle();
    assert_eq!(sim.ends[A].socket_stats(c).unwrap().unsent_bytes, 0);
    // Four chunks sent now: epoch 8 is possible, 9 is not.
    assert!(inject(&mut sim, ChunkType::Stop, 8));
    assert!(
        inject(&mut sim, ChunkType::Resume, 9),
        "impossible epoch ignored"
    );
    assert_eq!(sim.ends[A].counters().rejected_epochs, 1);
}

/// Reads what is readable now (no stepping).
fn read_all_now(sim: &mut Sim, end: usize, sock: vns::SocketId) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 777];
    while let Ok(n) = sim.ends[end].recv(sock, &mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

#[test]
fn config_relations_are_validated() {
    let ok = small_config(256);
    assert!(ok.validate().is_ok());
    let bad = [
        vns::Config {
            recv_buffer: 255,
            ..ok.clone()
        },
        vns::Config {
            credit_window: ok.recv_buffer - 1,
            ..ok.clone()
        },
        vns::Config {
            channel_budget: 100,
            ..ok.clone()
        },
        vns::Config {
            max_chunk_payload: 70_000,
            ..ok.clone()
        },
        vns::Config {
            credit_update_threshold: 0,
            ..ok.clone()
        },
    ];
    for cfg in bad {
        assert!(vns::Endpoint::new(cfg, netsched::RoundRobin::default()).is_err());
    }
}

// Closing like the kernel's close() (RFC 1122 4.2.2.13, RFC 2525 §2.17), and the order of
// a RESET against the data sent before it (docs/wire-format.md, "RESET"): two endpoints
// wired by hand, every chunk looked at, delivered in the order each test chooses.

/// One chunk taken from an endpoint: the channel it was queued on, header, payload.
type Taken = (u32, ChunkRepr, Vec<u8>);

/// Two endpoints with `n` throughput channels (ids 0..n), B listening on 7, and A's
/// socket connected to it (SYNC and SYNC_ACK delivered in channel order). Both sockets
/// start at `small_config`'s ISN.
fn wired(n: u32) -> (Endpoint, Endpoint, SocketId, SocketId) {
    let cfg = small_config(256);
    let mk = || Endpoint::new(cfg.clone(), netsched::RoundRobin::default()).unwrap();
    let (mut a, mut b) = (mk(), mk());
    for ch in (0..n).map(ChannelId) {
        a.add_channel(ch, PeerId(1), ChannelClass::Throughput)
            .unwrap();
        b.add_channel(ch, PeerId(0), ChannelClass::Throughput)
            .unwrap();
    }
    b.bind(7, 1).unwrap();
    let c = a.connect(PeerId(1), 7, AppClass::Throughput).unwrap();
    move_all(&mut a, &mut b, n);
    move_all(&mut b, &mut a, n);
    let s = b.accept(7).unwrap();
    assert!(a.is_connected(c));
    while a.poll_events().is_some() {}
    while b.poll_events().is_some() {}
    (a, b, c, s)
}

fn isn() -> Seq {
    Seq(small_config(256).first_isn.expect("fixed"))
}

/// Every chunk `from` has queued, channel by channel (0..n), each in its channel's order.
fn take(from: &mut Endpoint, n: u32) -> Vec<Taken> {
    let mut out = Vec::new();
    for ch in 0..n {
        let mut wire = Vec::new();
        while from.poll_transmit(ChannelId(ch), &mut wire).is_some() {}
        let mut rest = &wire[..];
        while !rest.is_empty() {
            let (h, p) = ChunkRepr::parse(rest).unwrap();
            out.push((ch, h, p.to_vec()));
            rest = &rest[h.wire_len()..];
        }
    }
    out
}

fn feed(to: &mut Endpoint, chunks: &[Taken]) {
    for (ch, h, p) in chunks {
        let mut b = Vec::new();
        h.emit_to_vec(p, &mut b);
        assert_eq!(to.handle_chunk_bytes(ChannelId(*ch), &b), Ok(b.len()));
    }
}

fn move_all(from: &mut Endpoint, to: &mut Endpoint, n: u32) {
    let chunks = take(from, n);
    feed(to, &chunks);
}

/// (type, sequence) of each chunk.
fn kinds(chunks: &[Taken]) -> Vec<(ChunkType, Seq)> {
    chunks.iter().map(|(_, h, _)| (h.ty, h.seq)).collect()
}

/// Reads everything readable now: the bytes, and how the read ended.
fn drain(ep: &mut Endpoint, sock: SocketId) -> (Vec<u8>, Result<usize, Error>) {
    let mut out = Vec::new();
    let mut buf = [0u8; 100];
    loop {
        match ep.recv(sock, &mut buf) {
            Ok(n) if n > 0 => out.extend_from_slice(&buf[..n]),
            end => return (out, end),
        }
    }
}

/// Written bytes still queued at close leave as DATA chunks, then the FIN; no RESET. The
/// peer reads them all, then end of stream, and the closed socket goes once the peer's
/// FIN arrives.
#[test]
fn close_with_queued_data_sends_data_chunks_then_fin() {
    let (mut a, mut b, c, s) = wired(1);
    let data = pattern(20, 1000);
    assert_eq!(a.send(c, &data), Ok(1000));
    a.close(c);
    assert_eq!(
        a.recv(c, &mut [0; 4]),
        Err(Error::InvalidSocket),
        "released"
    );
    assert_eq!(a.lingering_sockets(), 1);
    let out = take(&mut a, 1);
    let isn = isn();
    assert_eq!(
        kinds(&out),
        [
            (ChunkType::Data, isn),
            (ChunkType::Data, isn.plus(256)),
            (ChunkType::Data, isn.plus(512)),
            (ChunkType::Data, isn.plus(768)),
            (ChunkType::Fin, isn.plus(1000)),
        ]
    );
    let sent: Vec<u8> = out.iter().flat_map(|(_, _, p)| p.clone()).collect();
    assert_eq!(sent, data);
    feed(&mut b, &out);
    assert_eq!(drain(&mut b, s), (data, Ok(0)));
    move_all(&mut b, &mut a, 1); // the reads' credit update
                                 // The peer closes in turn (it read everything): a FIN only, and A's socket is reaped.
    b.close(s);
    let back = take(&mut b, 1);
    assert_eq!(kinds(&back), [(ChunkType::Fin, isn)]);
    feed(&mut a, &back);
    assert_eq!(a.lingering_sockets(), 0);
    assert_eq!(a.socket_stats(c), None);
    assert_eq!(b.socket_stats(s), None);
    assert!(take(&mut a, 1).is_empty());
    a.check_invariants().unwrap();
    b.check_invariants().unwrap();
}

/// Received bytes left unread at close reset the connection at once: bytes written but
/// not yet cut into chunks are discarded, and the RESET (ordered, at the end of what was
/// sent) is the only chunk. The peer's reads and writes then fail.
#[test]
fn close_with_unread_data_sends_reset() {
    let (mut a, mut b, c, s) = wired(1);
    b.send(s, b"left unread").unwrap();
    move_all(&mut b, &mut a, 1);
    assert_eq!(a.send(c, b"never sent"), Ok(10));
    a.close(c);
    let out = take(&mut a, 1);
    assert_eq!(kinds(&out), [(ChunkType::Reset, isn())]);
    assert_eq!(out[0].1.credit, RESET_ORDERED);
    assert_eq!(a.socket_stats(c), None);
    assert_eq!(a.lingering_sockets(), 0);
    feed(&mut b, &out);
    assert!(std::iter::from_fn(|| b.poll_events()).any(|e| e == Event::Failed(s)));
    assert_eq!(b.recv(s, &mut [0; 16]), Err(Error::ConnectionReset));
    assert_eq!(b.send(s, b"x"), Err(Error::ConnectionReset));
}

/// After everything received was read, close sends a FIN and nothing else.
#[test]
fn close_after_reading_everything_sends_fin_only() {
    let (mut a, mut b, c, s) = wired(1);
    b.send(s, b"hello").unwrap();
    move_all(&mut b, &mut a, 1);
    assert_eq!(
        drain(&mut a, c),
        (b"hello".to_vec(), Err(Error::WouldBlock))
    );
    // The read's credit update, if any, goes before the close.
    move_all(&mut a, &mut b, 1);
    a.close(c);
    let out = take(&mut a, 1);
    assert_eq!(kinds(&out), [(ChunkType::Fin, isn())]);
    feed(&mut b, &out);
    assert_eq!(drain(&mut b, s), (Vec::new(), Ok(0)));
    assert_eq!(
        b.send(s, b"reply"),
        Ok(5),
        "half-closed: the peer may still write"
    );
}

/// A closed socket whose peer keeps its window closed holds its unsent bytes only until
/// the linger timeout: then it is reset, removed and counted. The peer still reads every
/// byte that was sent before the RESET, then the reset.
#[test]
fn close_with_the_peer_window_closed_ends_at_the_linger_timeout() {
    let (mut a, mut b, c, s) = wired(1);
    let cfg = small_config(256);
    let t0 = Instant::now();
    a.handle_timeout(t0);
    let data = pattern(21, 8 * 1024);
    let mut written = 0;
    // B never reads: its buffer fills, then the credit runs out.
    for _ in 0..100 {
        if let Ok(n) = a.send(c, &data[written..]) {
            written += n;
        }
        move_all(&mut a, &mut b, 1);
        move_all(&mut b, &mut a, 1);
    }
    let unsent = a.socket_stats(c).unwrap().unsent_bytes;
    assert!(unsent > 0, "the send buffer is stuck");
    let cut = written - unsent;
    a.close(c);
    assert!(take(&mut a, 1).is_empty(), "nothing can go");
    assert_eq!(a.lingering_sockets(), 1);
    let t1 = t0 + Duration::from_secs(1);
    a.handle_timeout(t1);
    a.handle_timeout(t1 + cfg.linger_timeout - Duration::from_millis(1));
    assert_eq!(a.lingering_sockets(), 1);
    a.handle_timeout(t1 + cfg.linger_timeout);
    assert_eq!(a.lingering_sockets(), 0);
    assert_eq!(a.counters().linger_expired, 1);
    assert_eq!(a.socket_stats(c), None);
    assert_eq!(a.pending_tx_bytes(), 16, "the RESET only");
    a.check_invariants().unwrap();
    let out = take(&mut a, 1);
    assert_eq!(kinds(&out), [(ChunkType::Reset, isn().plus(cut as u32))]);
    feed(&mut b, &out);
    // B reads on: the bytes sent (some parked until now), then the reset.
    let mut got = Vec::new();
    let end = loop {
        let (bytes, end) = drain(&mut b, s);
        got.extend(bytes);
        if end != Err(Error::WouldBlock) {
            break end;
        }
        let back = take(&mut b, 1);
        assert!(back.iter().all(|(_, h, _)| h.ty != ChunkType::Reset));
    };
    assert_eq!(end, Err(Error::ConnectionReset));
    assert_eq!(got, data[..cut]);
    b.check_invariants().unwrap();
}

/// The adversarial order for a RESET: it travels on a channel of its own and arrives
/// before every data chunk sent earlier, which then arrive in reverse order. The
/// receiver holds the reset: its write side fails at once, but it reads every byte sent
/// before the RESET, in order, and only then the reset.
#[test]
fn reset_overtaking_data_on_other_channels_waits_for_it() {
    let (mut a, mut b, c, s) = wired(3);
    b.send(s, b"unread").unwrap();
    move_all(&mut b, &mut a, 3);
    let data = pattern(22, 600);
    assert_eq!(a.send(c, &data), Ok(600));
    let mut sent = take(&mut a, 3);
    assert_eq!(sent.len(), 3, "three DATA chunks");
    let used: std::collections::BTreeSet<u32> = sent.iter().map(|(ch, _, _)| *ch).collect();
    assert_eq!(used.len(), 3, "spread over the channels");
    sent.sort_by_key(|(_, h, _)| h.seq.since(isn()));
    a.close(c);
    let mut reset = take(&mut a, 3);
    assert_eq!(reset.len(), 1);
    assert_eq!(
        (reset[0].1.ty, reset[0].1.seq, reset[0].1.credit),
        (ChunkType::Reset, isn().plus(600), RESET_ORDERED)
    );
    // The RESET first, then the data chunks last to first, each on its own channel.
    reset[0].0 = 0;
    for (k, chunk) in sent.iter_mut().enumerate() {
        chunk.0 = k as u32 + 1;
    }
    b.add_channel(ChannelId(3), PeerId(0), ChannelClass::Throughput)
        .unwrap();
    feed(&mut b, &reset);
    while b.poll_events().is_some() {}
    assert_eq!(
        b.send(s, b"x"),
        Err(Error::ConnectionReset),
        "write side: at once"
    );
    assert_eq!(drain(&mut b, s), (Vec::new(), Err(Error::WouldBlock)));
    assert_eq!(b.pending_tx_bytes(), 0);
    feed(&mut b, &sent[2..]);
    feed(&mut b, &sent[1..2]);
    assert_eq!(drain(&mut b, s), (Vec::new(), Err(Error::WouldBlock)));
    assert!(!std::iter::from_fn(|| b.poll_events()).any(|e| e == Event::Failed(s)));
    feed(&mut b, &sent[..1]);
    assert!(std::iter::from_fn(|| b.poll_events()).any(|e| e == Event::Failed(s)));
    assert_eq!(drain(&mut b, s), (data, Err(Error::ConnectionReset)));
    assert_eq!(
        b.recv(s, &mut [0; 4]),
        Err(Error::ConnectionReset),
        "stays so"
    );
    b.check_invariants().unwrap();
}

/// A RESET that finds in-order bytes unread does not throw them away: the reader gets
/// them, then the reset. So for an ordered RESET whose end is already reached, and for an
/// unordered one (a reply to a chunk for no socket: credit field 0, the sequence number of
/// the chunk it answers), which applies on arrival whatever is still missing.
#[test]
fn in_order_bytes_held_at_a_reset_are_read_before_it() {
    for ordered in [true, false] {
        let (mut a, mut b, c, s) = wired(2);
        b.send(s, b"unread").unwrap();
        move_all(&mut b, &mut a, 2);
        let data = pattern(23, 300);
        assert_eq!(a.send(c, &data), Ok(300));
        let mut sent = take(&mut a, 2);
        sent.sort_by_key(|(_, h, _)| h.seq.since(isn()));
        assert_eq!(sent.len(), 2);
        a.close(c);
        let mut reset = take(&mut a, 2);
        assert_eq!(kinds(&reset), [(ChunkType::Reset, isn().plus(300))]);
        if !ordered {
            // The answer to B's DATA chunk: it echoes the chunk's first byte.
            reset[0].1.credit = 0;
            reset[0].1.seq = isn();
        }
        // The first chunk arrives and is left unread; the RESET comes next.
        feed(&mut b, &sent[..1]);
        feed(&mut b, &reset);
        if ordered {
            // Its end (300) is not reached yet: held, the write side fails at once.
            assert_eq!(b.send(s, b"x"), Err(Error::ConnectionReset));
            feed(&mut b, &sent[1..]);
            assert_eq!(
                drain(&mut b, s),
                (data.clone(), Err(Error::ConnectionReset))
            );
        } else {
            // Applies now: the 256 in-order bytes stay readable, the rest is never waited
            // for (a late chunk for the failed socket is ignored).
            feed(&mut b, &sent[1..]);
            assert_eq!(
                drain(&mut b, s),
                (data[..256].to_vec(), Err(Error::ConnectionReset))
            );
        }
        assert_eq!(b.send(s, b"x"), Err(Error::ConnectionReset));
        b.check_invariants().unwrap();
        // Closing the reset socket sends nothing: the peer is gone.
        b.close(s);
        assert!(take(&mut b, 2).is_empty());
        assert_eq!(b.socket_stats(s), None);
    }
}

/// An ordered RESET comes from the peer's socket, so it was sent after the SYNC_ACK; one
/// that overtakes the SYNC_ACK on another channel is held like early data: the connect
/// completes, then the reset applies (not a refusal).
#[test]
fn an_ordered_reset_overtaking_the_sync_ack_is_not_a_refusal() {
    let cfg = small_config(256);
    let mk = || Endpoint::new(cfg.clone(), netsched::RoundRobin::default()).unwrap();
    let (mut a, mut b) = (mk(), mk());
    for ch in (0..2).map(ChannelId) {
        a.add_channel(ch, PeerId(1), ChannelClass::Throughput)
            .unwrap();
        b.add_channel(ch, PeerId(0), ChannelClass::Throughput)
            .unwrap();
    }
    b.bind(7, 1).unwrap();
    let c = a.connect(PeerId(1), 7, AppClass::Throughput).unwrap();
    move_all(&mut a, &mut b, 2);
    // The listener goes away before accepting: the waiting connection is reset.
    b.unbind(7).unwrap();
    let mut out = take(&mut b, 2);
    let mut ks = kinds(&out);
    ks.sort_by_key(|(ty, _)| ty.code());
    assert_eq!(ks, [(ChunkType::SyncAck, isn()), (ChunkType::Reset, isn())]);
    out.sort_by_key(|(_, h, _)| h.ty != ChunkType::Reset);
    assert_eq!(out[0].1.ty, ChunkType::Reset);
    assert_eq!(out[0].1.credit, RESET_ORDERED);
    // The RESET on the other channel, first.
    let sync_ch = out[1].0;
    out[0].0 = 1 - sync_ch;
    feed(&mut a, &out[..1]);
    assert!(!a.is_connected(c));
    assert_eq!(
        a.recv(c, &mut [0; 4]),
        Err(Error::WouldBlock),
        "not refused"
    );
    a.check_invariants().unwrap();
    feed(&mut a, &out[1..]);
    assert_eq!(a.recv(c, &mut [0; 4]), Err(Error::ConnectionReset));
    assert_eq!(a.channel_parked_bytes(ChannelId(1 - sync_ch)), 0);
    a.check_invariants().unwrap();
}

/// An endpoint that is one shard of several owns only the sockets whose ports map to it:
/// its connects pick ephemeral ports that map back to it, and its socket ids step by the
/// shard count from its index (unique over a stack's shards).
#[test]
fn a_shard_picks_ports_and_ids_of_its_own() {
    for count in [1u16, 2, 3, 8] {
        for index in 0..count {
            let cfg = vns::Config {
                shard: vns::ShardOf {
                    index,
                    count,
                    latency_ports: None,
                },
                rng_seed: Some(u64::from(index)),
                ..vns::Config::default()
            };
            let mut ep = Endpoint::new(cfg, netsched::RoundRobin::default()).unwrap();
            ep.add_channel(ChannelId(0), PeerId(0), ChannelClass::Throughput)
                .unwrap();
            for remote in [80u16, 81, 65535] {
                for _ in 0..50 {
                    let sid = ep.connect(PeerId(0), remote, AppClass::Throughput).unwrap();
                    let (_, local, r) = ep.socket_addr(sid).unwrap();
                    assert_eq!(r, remote);
                    assert_eq!(vns::ShardOf::of_ports(local, remote, count), index);
                    let n: u64 = sid.to_string()[2..].parse().unwrap();
                    assert_eq!(n % u64::from(count), u64::from(index), "{sid}");
                }
            }
        }
    }
    // A shard index out of range is refused.
    let bad = vns::Config {
        shard: vns::ShardOf {
            index: 2,
            count: 2,
            latency_ports: None,
        },
        ..vns::Config::default()
    };
    assert!(bad.validate().is_err());
}

/// `handle_chunk` (a caller that deframes channels itself) dispatches like
/// `handle_chunk_bytes`, refuses chunks for unknown channels, and while the channel's reads
/// are paused refuses the next chunk and hands it back.
#[test]
fn handle_chunk_dispatches_and_hands_back_what_it_cannot_take() {
    // A channel budget of two chunks: the third parked chunk pauses the channel.
    let cfg = vns::Config {
        channel_budget: 512,
        ..small_config(256)
    };
    let mut ep = Endpoint::new(cfg.clone(), netsched::RoundRobin::default()).unwrap();
    ep.add_channel(ChannelId(0), PeerId(0), ChannelClass::Throughput)
        .unwrap();
    ep.bind(7, 4).unwrap();
    let deframe = |bytes: &[u8]| {
        let mut d = vns::Deframer::new(cfg.max_chunk_payload);
        let (used, chunk) = d.feed(bytes).unwrap();
        assert_eq!(used, bytes.len());
        chunk.unwrap()
    };
    let chunk = |ty, seq: u32, credit: u32, payload: &[u8]| {
        let mut out = Vec::new();
        ChunkRepr {
            src_port: 5000,
            dst_port: 7,
            seq: Seq(seq),
            credit,
            ty,
            payload_len: payload.len() as u16,
        }
        .emit_to_vec(payload, &mut out);
        out
    };
    let sync = deframe(&chunk(ChunkType::Sync, 1000, 1 << 20, &[]));
    assert!(matches!(
        ep.handle_chunk(ChannelId(9), sync.clone()),
        Err((ChannelError::UnknownChannel(_), _))
    ));
    assert_eq!(ep.handle_chunk(ChannelId(0), sync), Ok(false));
    let sid = ep.accept(7).unwrap();
    // Park past the budget: the channel's reads pause.
    let mut paused = false;
    let mut seq = 1000 + 4 * 256;
    for _ in 0..64 {
        let c = deframe(&chunk(ChunkType::Data, seq, 0, &[1; 256]));
        match ep.handle_chunk(ChannelId(0), c) {
            Ok(false) => seq += 256,
            Ok(true) => {
                paused = true;
                break;
            }
            Err((e, _)) => panic!("{e}"),
        }
    }
    assert!(paused && ep.should_pause_channel_reads(ChannelId(0)));
    let next = deframe(&chunk(ChunkType::Data, seq + 256, 0, &[2; 256]));
    match ep.handle_chunk(ChannelId(0), next) {
        Err((ChannelError::Paused(_), back)) => assert_eq!(back.payload, vec![2; 256]),
        other => panic!("{other:?}"),
    }
    ep.check_invariants().unwrap();
    let _ = sid;
}

/// `channels_with_transmit` names exactly the channels with chunks waiting (a driver
/// visits only those): none when idle, the scheduled channel after a send, live channels
/// only after that channel is lost, and none again once everything left.
#[test]
fn channels_with_transmit_names_the_channels_with_chunks() {
    let mut sim = Sim::throughput(3, small_config(300), 4096, 11);
    sim.ends[B].bind(9, 1).unwrap();
    let (c, _s) = connect(&mut sim, 9);
    sim.settle();
    let mut ids = Vec::new();
    sim.ends[A].channels_with_transmit(&mut ids);
    assert!(
        ids.is_empty(),
        "an idle endpoint has nothing for any channel: {ids:?}"
    );

    sim.ends[A].send(c, b"one chunk").unwrap();
    sim.ends[A].channels_with_transmit(&mut ids);
    assert_eq!(ids.len(), 1, "one chunk, one channel: {ids:?}");
    let picked = ids[0];
    for &ch in &sim.channels {
        assert_eq!(sim.ends[A].has_transmit(ch), ch == picked);
    }
    // The channel is lost before it takes the chunk: the chunk moves to another one.
    sim.ends[A].handle_channel_lost(picked);
    sim.ends[A].channels_with_transmit(&mut ids);
    assert!(
        !ids.is_empty(),
        "the chunk (and any resend) waits on live channels"
    );
    assert!(
        !ids.contains(&picked),
        "nothing for the lost channel: {ids:?}"
    );
    for &ch in &sim.channels {
        assert_eq!(sim.ends[A].has_transmit(ch), ids.contains(&ch));
    }

    let mut buf = Vec::new();
    for &ch in &ids.clone() {
        while sim.ends[A].poll_transmit(ch, &mut buf).is_some() {}
    }
    sim.ends[A].channels_with_transmit(&mut ids);
    assert!(ids.is_empty(), "everything left: {ids:?}");
}

/// `output_idle` says whether a finishing pass would have anything to do: not while a
/// write waits to be placed, a chunk waits in an outbox or an event waits to be handed
/// out; yes after a read that found nothing, even though reads mark a scheduling pass
/// as due (one with nothing to place does nothing). The stack skips its finishing pass
/// on that answer, so a wrong "idle" would strand a write or a wake-up.
#[test]
fn output_idle_tracks_pending_writes_chunks_and_events() {
    let mut sim = Sim::throughput(2, small_config(256), 512, 1);
    sim.ends[B].bind(80, 4).unwrap();
    let (c, s) = connect(&mut sim, 80);
    sim.drain_events();
    sim.settle();
    sim.drain_events();
    assert!(sim.ends[A].output_idle(), "a settled endpoint");

    // A read that finds nothing leaves nothing to do, and raises no event.
    let raised = sim.ends[B].events_raised();
    let mut buf = [0u8; 64];
    assert_eq!(sim.ends[B].recv(s, &mut buf), Err(Error::WouldBlock));
    assert!(sim.ends[B].output_idle(), "after a read that found nothing");
    assert_eq!(sim.ends[B].events_raised(), raised);

    // A write waits to be placed on a channel, then in the channel's outbox.
    sim.ends[A].send(c, &pattern(1, 100)).unwrap();
    assert!(!sim.ends[A].output_idle(), "a written chunk waits");
    assert!(!sim.ends[A].transmit_idle(), "a written chunk waits");
    let mut ids = Vec::new();
    sim.ends[A].channels_with_transmit(&mut ids);
    assert!(!ids.is_empty());
    assert!(!sim.ends[A].output_idle(), "the chunk waits in an outbox");
    assert!(!sim.ends[A].transmit_idle(), "the chunk waits in an outbox");
    sim.settle();
    assert!(
        !sim.ends[B].output_idle(),
        "the receiver's Readable event waits"
    );
    // Only the event: a finishing pass has nothing to send.
    assert!(sim.ends[B].has_events());
    assert!(
        sim.ends[B].events_raised() > raised,
        "bytes that became readable raised an event"
    );
    assert!(
        sim.ends[B].transmit_idle(),
        "nothing to send, only an event"
    );
    sim.drain_events();
    assert!(sim.ends[B].output_idle(), "events handed out");
    assert!(!sim.ends[B].has_events());
    assert_eq!(read_all_now(&mut sim, B, s), pattern(1, 100));
}

/// A connection's ports may be taken again as soon as its socket is gone, while chunks of
/// that connection are still on their way on other channels. A late DATA chunk there is
/// answered with an unordered RESET, which must not reset the connection that reuses the
/// ports: it echoes the late chunk's sequence number, outside the new socket's own.
#[test]
fn a_late_reset_for_an_earlier_connection_spares_the_one_reusing_its_ports() {
    let (mut a, mut b, c, s) = wired(2);
    let port = a.socket_addr(c).unwrap().1;
    // B's bytes are on their way when A aborts: A's RESET reaches B first, and B lets its
    // socket go.
    b.send(s, b"late").unwrap();
    let late = take(&mut b, 2);
    assert_eq!(kinds(&late), [(ChunkType::Data, isn())]);
    a.reset(c);
    move_all(&mut a, &mut b, 2);
    assert_eq!(b.send(s, b"x"), Err(Error::ConnectionReset));
    b.close(s);
    // The late bytes find no socket at A, which answers with a RESET.
    feed(&mut a, &late);
    let answer = take(&mut a, 2);
    assert_eq!(answer.len(), 1);
    assert_eq!(answer[0].1.ty, ChunkType::Reset);
    assert_ne!(answer[0].1.credit, RESET_ORDERED);
    // A new connection on the same ports, then the answer arrives.
    let mut opts = SocketOptions::default();
    opts.local_port = Some(port);
    let c2 = a
        .connect_with(PeerId(1), 7, AppClass::Throughput, opts)
        .unwrap();
    move_all(&mut a, &mut b, 2);
    move_all(&mut b, &mut a, 2);
    let s2 = b.accept(7).unwrap();
    assert!(a.is_connected(c2));
    assert_eq!(b.socket_addr(s2).unwrap().2, port, "the same ports");
    feed(&mut b, &answer);
    b.check_invariants().unwrap();
    assert!(
        b.is_connected(s2),
        "reset by the earlier connection's RESET"
    );
    // Both ways still carry bytes.
    assert_eq!(b.send(s2, b"pong"), Ok(4));
    assert_eq!(a.send(c2, b"ping"), Ok(4));
    move_all(&mut a, &mut b, 2);
    move_all(&mut b, &mut a, 2);
    assert_eq!(drain(&mut b, s2).0, b"ping");
    assert_eq!(drain(&mut a, c2).0, b"pong");
}

/// Ephemeral ports are spread over the whole range, not drawn to a few: a port taken again
/// as soon as it is free meets late chunks of the connection that had it before. A scan
/// from a random place took, for a shard beside the latency shard (whose ports fill the
/// top of the range), the lowest port of its own after every start in the latency ports:
/// one connect in sixteen.
#[test]
fn ephemeral_ports_are_spread_over_the_range_beside_a_latency_shard() {
    let range = vns::Config::default().ephemeral_ports;
    let cfg = vns::Config {
        shard: vns::ShardOf {
            index: 0,
            count: 8,
            latency_ports: vns::ShardOf::latency_ports_in(range),
        },
        rng_seed: Some(7),
        ..vns::Config::default()
    };
    let mut ep = Endpoint::new(cfg, netsched::RoundRobin::default()).unwrap();
    ep.add_channel(ChannelId(0), PeerId(0), ChannelClass::Throughput)
        .unwrap();
    let mut uses = std::collections::HashMap::<u16, u32>::new();
    let connects = 2000;
    for _ in 0..connects {
        let sid = ep.connect(PeerId(0), 7300, AppClass::Throughput).unwrap();
        let (_, local, _) = ep.socket_addr(sid).unwrap();
        *uses.entry(local).or_default() += 1;
        // Gone at once: its port is free for the next connect.
        ep.reset(sid);
    }
    let most = uses.values().max().copied().unwrap_or(0);
    // About 2,200 ports of this shard's: a uniform choice uses none of them more than a
    // handful of times.
    assert!(
        most <= 12,
        "a port taken {most} times in {connects} connects"
    );
    assert!(
        uses.len() > 1000,
        "{} ports in {connects} connects",
        uses.len()
    );
}

/// With the default configuration the credit a socket grants is no more than its receive
/// buffer holds, so a sender that uses all of it while the reader sleeps fills the buffer
/// and nothing more: nothing is parked, no STOP is sent, and the credit alone paces the
/// stream (a bulk sender kept meeting STOP and RESUME when the credit was twice the
/// buffer). Over two channels, chunks arriving out of order, every byte arrives.
#[test]
fn by_default_the_credit_alone_paces_a_bulk_sender() {
    let cfg = vns::Config {
        first_isn: Some(0x4e43_0001),
        rng_seed: Some(0x5eed),
        ..vns::Config::default()
    };
    assert!(cfg.credit_window <= cfg.recv_buffer);
    let mut sim = Sim::throughput(2, cfg.clone(), 1 << 20, 17);
    sim.ends[B].bind(7, 1).unwrap();
    let (c, s) = connect(&mut sim, 7);
    let data = pattern(9, 3 * cfg.credit_window + 12_345);
    let mut sent = 0;
    let mut got = Vec::new();
    while got.len() < data.len() {
        // The reader sleeps until the sender has used all the credit it was given (and
        // filled its send buffer behind it).
        loop {
            let n = match sent < data.len() {
                true => sim.ends[A].send(c, &data[sent..]).unwrap_or(0),
                false => 0,
            };
            sent += n;
            sim.settle();
            if n == 0 {
                break;
            }
        }
        let st = sim.ends[B].socket_stats(s).unwrap();
        assert_eq!(st.parked_bytes, 0, "nothing parked");
        assert!(!st.stop_sent, "no STOP");
        assert!(st.reorder_bytes <= cfg.recv_buffer);
        assert_eq!(sim.ends[B].channel_parked_bytes(ChannelId(0)), 0);
        assert_eq!(sim.ends[B].channel_parked_bytes(ChannelId(1)), 0);
        got.extend(read_all_now(&mut sim, B, s));
    }
    assert_eq!(got, data);
    assert!(!sim.ends[A].socket_stats(c).unwrap().peer_stopped);
}
