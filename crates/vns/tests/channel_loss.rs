//! No data lost when a channel dies. Each virtual socket keeps the chunks it
//! sent until the peer acknowledges them at the data level (its credit edge less its
//! window) and sends them again on a remaining channel when theirs dies; the receiver
//! drops the copies of bytes the lost channel had in fact delivered.
//!
//! Seeded simulations lose channels mid-transfer (the bytes in flight on them vanish, as
//! with a reset TCP connection) and check that every byte arrives exactly once, in order,
//! with the endpoints' accounting intact at every step; exact-chunk tests cover the
//! duplicate rules, the resend bound and the handshake and close chunks that go again.

mod common;

use common::{pattern, small_config, Sim, A, B};
use rand::Rng;
use vns::wire::{ChunkRepr, ChunkType, Seq};
use vns::{
    AppClass, ChannelClass, ChannelError, ChannelId, Config, Endpoint, Error, Event, PeerId,
    SocketId,
};

/// One socket pair's transfer both ways: what each end writes and has read.
struct Flow {
    a: SocketId,
    b: SocketId,
    to_b: Vec<u8>,
    to_a: Vec<u8>,
    sent_to_b: usize,
    sent_to_a: usize,
    got_b: Vec<u8>,
    got_a: Vec<u8>,
    eof_b: bool,
    eof_a: bool,
}

/// Writes what fits, shuts down after the last byte, reads what is there.
fn pump(sim: &mut Sim, f: &mut Flow) {
    for (end, sock, data, sent) in [
        (A, f.a, &f.to_b, &mut f.sent_to_b),
        (B, f.b, &f.to_a, &mut f.sent_to_a),
    ] {
        if *sent < data.len() {
            if let Ok(n) = sim.ends[end].send(sock, &data[*sent..]) {
                *sent += n;
                if *sent == data.len() {
                    sim.ends[end].shutdown(sock).unwrap();
                }
            }
        }
    }
    let mut buf = [0u8; 700];
    for (end, sock, got, eof) in [
        (B, f.b, &mut f.got_b, &mut f.eof_b),
        (A, f.a, &mut f.got_a, &mut f.eof_a),
    ] {
        while !*eof {
            match sim.ends[end].recv(sock, &mut buf) {
                Ok(0) => *eof = true,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(Error::WouldBlock) => break,
                Err(e) => panic!("socket failed: {e:?}"),
            }
        }
    }
}

/// `sockets` pairs over `channels` channels; while they transfer, a live channel is lost
/// every `loss_every` steps on average (never more than `max_losses`), and a new one
/// opened whenever none is left (after a while) or at random.
fn transfer_with_losses(
    seed: u64,
    channels: usize,
    sockets: usize,
    max_losses: usize,
) -> (u64, u64) {
    let cfg = small_config(256);
    let mut sim = Sim::throughput(channels, cfg, 700, seed);
    sim.ends[B].bind(7, sockets).unwrap();
    let mut flows = Vec::new();
    for i in 0..sockets {
        let a = sim.ends[A]
            .connect(PeerId(1), 7, AppClass::Throughput)
            .unwrap();
        sim.settle();
        let b = sim.ends[B].accept(7).unwrap();
        let len_b = sim.rng.gen_range(0..6000);
        let len_a = sim.rng.gen_range(0..3000);
        flows.push(Flow {
            a,
            b,
            to_b: pattern(i as u8, len_b),
            to_a: pattern(100 + i as u8, len_a),
            sent_to_b: 0,
            sent_to_a: 0,
            got_b: Vec::new(),
            got_a: Vec::new(),
            eof_b: false,
            eof_a: false,
        });
    }
    let mut losses = 0;
    let mut orphaned_for = 0;
    for step in 0..400_000u64 {
        for f in &mut flows {
            pump(&mut sim, f);
        }
        if flows.iter().all(|f| f.eof_a && f.eof_b) {
            break;
        }
        let live: Vec<usize> = (0..sim.channels.len())
            .filter(|&i| !sim.is_lost(i))
            .collect();
        if live.is_empty() {
            orphaned_for += 1;
            assert!(sim.ends[A].peer_orphaned(PeerId(1)));
            if orphaned_for > 50 {
                sim.add_channel(ChannelClass::Throughput);
                orphaned_for = 0;
            }
        } else if losses < max_losses && sim.rng.gen_ratio(1, 300) {
            let i = live[sim.rng.gen_range(0..live.len())];
            sim.lose_channel(i);
            losses += 1;
        } else if live.len() < channels && sim.rng.gen_ratio(1, 2000) {
            sim.add_channel(ChannelClass::Throughput);
        }
        sim.step();
        for end in &sim.ends {
            if let Err(e) = end.check_invariants() {
                panic!("seed {seed} step {step}: {e}");
            }
        }
    }
    for (i, f) in flows.iter().enumerate() {
        if !(f.eof_a && f.eof_b) {
            eprintln!(
                "seed {seed} flow {i}: sent {}/{} {}/{} got {} {} eof {} {}\nA {:?}\nB {:?}",
                f.sent_to_b,
                f.to_b.len(),
                f.sent_to_a,
                f.to_a.len(),
                f.got_b.len(),
                f.got_a.len(),
                f.eof_b,
                f.eof_a,
                sim.ends[A].socket_stats(f.a),
                sim.ends[B].socket_stats(f.b)
            );
        }
        assert!(f.eof_a && f.eof_b, "seed {seed}: flow {i} did not finish");
        assert!(f.got_b == f.to_b, "seed {seed}: flow {i} A→B bytes differ");
        assert!(f.got_a == f.to_a, "seed {seed}: flow {i} B→A bytes differ");
    }
    let resent = sim.ends[A].counters().resent_chunks + sim.ends[B].counters().resent_chunks;
    let dups = sim.ends[A].counters().duplicate_chunks + sim.ends[B].counters().duplicate_chunks;
    (resent, dups)
}

#[test]
fn every_byte_arrives_once_in_order_across_channel_losses() {
    let (mut resent, mut dups) = (0, 0);
    let seeds = match std::env::var("SEED") {
        Ok(v) => v.parse().unwrap()..v.parse::<u64>().unwrap() + 1,
        Err(_) => 0..24,
    };
    for seed in seeds {
        let (r, d) = transfer_with_losses(seed, 4, 6, 3);
        resent += r;
        dups += d;
    }
    // The runs did exercise the resend path and the duplicate rule.
    assert!(resent > 0, "no chunk was resent");
    assert!(dups > 0, "no duplicate was dropped");
}

#[test]
fn every_byte_arrives_once_when_every_channel_dies_and_one_comes_back() {
    for seed in 100..112 {
        transfer_with_losses(seed, 1, 4, 4);
    }
}

// Exact-chunk tests: endpoint A against a peer spoken by hand on channel 0.

const PEER: PeerId = PeerId(1);
const CH: ChannelId = ChannelId(0);

fn chunk(ty: ChunkType, src: u16, dst: u16, seq: u32, credit: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    ChunkRepr {
        src_port: src,
        dst_port: dst,
        seq: Seq(seq),
        credit,
        ty,
        payload_len: payload.len() as u16,
    }
    .emit_to_vec(payload, &mut out);
    out
}

/// Every chunk queued for channel `ch`, parsed.
fn drain(ep: &mut Endpoint, ch: ChannelId) -> Vec<(ChunkRepr, Vec<u8>)> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while ep.poll_transmit(ch, &mut buf).is_some() {
        let (h, payload) = ChunkRepr::parse(&buf).unwrap();
        out.push((h, payload.to_vec()));
        buf.clear();
    }
    out
}

/// A passive socket on port 7 of `ep`, opened by the peer's SYNC (ISN 1000, `window`) on
/// channel 0; returns it and its ISN (from the SYNC_ACK).
fn accept_from_peer(ep: &mut Endpoint, window: u32) -> (SocketId, u32) {
    ep.bind(7, 4).unwrap();
    ep.handle_chunk_bytes(CH, &chunk(ChunkType::Sync, 5000, 7, 1000, window, &[]))
        .unwrap();
    let sid = ep.accept(7).unwrap();
    let out = drain(ep, CH);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.ty, ChunkType::SyncAck);
    (sid, out[0].0.seq.0)
}

fn two_channel_endpoint(cfg: Config) -> Endpoint {
    let mut ep = Endpoint::new(cfg, netsched::RoundRobin::default()).unwrap();
    ep.add_channel(CH, PEER, ChannelClass::Throughput).unwrap();
    ep.add_channel(ChannelId(1), PEER, ChannelClass::Throughput)
        .unwrap();
    ep
}

#[test]
fn a_chunk_arriving_again_is_dropped_but_a_partial_overlap_still_resets() {
    let mut ep = two_channel_endpoint(small_config(256));
    let (sid, _) = accept_from_peer(&mut ep, 2048);
    let data = |seq, p: &[u8]| chunk(ChunkType::Data, 5000, 7, seq, 0, p);
    // In order, then out of order (a hole at 1010..1020).
    ep.handle_chunk_bytes(CH, &data(1000, &[1; 10])).unwrap();
    ep.handle_chunk_bytes(CH, &data(1020, &[3; 10])).unwrap();
    // The same chunks again, on the other channel: ignored, counted.
    ep.handle_chunk_bytes(ChannelId(1), &data(1000, &[1; 10]))
        .unwrap();
    ep.handle_chunk_bytes(ChannelId(1), &data(1020, &[3; 10]))
        .unwrap();
    assert_eq!(ep.counters().duplicate_chunks, 2);
    let mut buf = [0u8; 64];
    assert_eq!(ep.recv(sid, &mut buf), Ok(10));
    // Read bytes arriving again are duplicates too.
    ep.handle_chunk_bytes(CH, &data(1000, &[1; 10])).unwrap();
    assert_eq!(ep.counters().duplicate_chunks, 3);
    assert!(drain(&mut ep, CH)
        .iter()
        .all(|(h, _)| h.ty != ChunkType::Reset));
    assert!(drain(&mut ep, ChannelId(1))
        .iter()
        .all(|(h, _)| h.ty != ChunkType::Reset));
    // A chunk that overlaps held bytes only in part is no copy: the peer is broken.
    ep.handle_chunk_bytes(CH, &data(1015, &[9; 10])).unwrap();
    let out: Vec<_> = [CH, ChannelId(1)]
        .into_iter()
        .flat_map(|c| drain(&mut ep, c))
        .collect();
    assert!(out.iter().any(|(h, _)| h.ty == ChunkType::Reset));
    ep.check_invariants().unwrap();
}

#[test]
fn data_handed_to_a_lost_channel_goes_again_until_acknowledged() {
    let cfg = small_config(256);
    let window = cfg.credit_window as u32;
    let mut ep = two_channel_endpoint(cfg);
    let (sid, isn) = accept_from_peer(&mut ep, window);
    // The peer's first chunk tells the endpoint it heard the SYNC_ACK.
    let ack = |credit| chunk(ChunkType::Ack, 5000, 7, 0, credit, &[]);
    ep.handle_chunk_bytes(CH, &ack(isn.wrapping_add(window)))
        .unwrap();
    ep.send(sid, &pattern(1, 600)).unwrap();
    let on0 = drain(&mut ep, CH);
    let on1 = drain(&mut ep, ChannelId(1));
    let data0: Vec<_> = on0
        .iter()
        .filter(|(h, _)| h.ty == ChunkType::Data)
        .collect();
    assert!(!data0.is_empty(), "round-robin put data on channel 0");
    assert_eq!(ep.socket_stats(sid).unwrap().unacked_bytes, 600);
    // The peer reads the first 256 bytes: its credit edge moves by as much.
    ep.handle_chunk_bytes(ChannelId(1), &ack(isn.wrapping_add(window + 256)))
        .unwrap();
    assert_eq!(ep.socket_stats(sid).unwrap().unacked_bytes, 600 - 256);
    ep.handle_channel_lost(CH);
    let again = drain(&mut ep, ChannelId(1));
    // Exactly the DATA chunks of channel 0 not yet acknowledged go again, byte for byte,
    // with a credit update after them; those of channel 1 do not.
    let resent: Vec<_> = again
        .iter()
        .filter(|(h, _)| h.ty == ChunkType::Data)
        .collect();
    let expect: Vec<_> = data0
        .iter()
        .filter(|(h, p)| Seq(h.seq.0).plus(p.len() as u32).since(Seq(isn + 256)) > 0)
        .collect();
    assert_eq!(resent.len(), expect.len());
    for ((h, p), (eh, ep_)) in resent.iter().zip(&expect) {
        assert_eq!((h.seq, p), (eh.seq, ep_));
    }
    assert!(on1.iter().all(|(h, _)| resent
        .iter()
        .all(|(r, _)| r.seq != h.seq || h.ty != ChunkType::Data)));
    assert!(again.iter().any(|(h, _)| h.ty == ChunkType::Ack));
    assert_eq!(ep.counters().resent_chunks as usize, resent.len());
    ep.check_invariants().unwrap();
}

/// Regression (CI of the data-level acknowledgement): an idle socket's credit refresh,
/// sent on the remaining channels whenever one died, put bytes in flight on channels
/// that were idle, so they waited out the user timeout instead of detecting a vanished
/// peer by keep-alive (`tests/vns_liveness.rs`). A channel that timed out idle delivered
/// its flow-control chunks; only a reset one may have lost them.
#[test]
fn a_timed_out_channel_refreshes_flow_state_only_for_sockets_with_chunks_on_it() {
    let cfg = small_config(256);
    let window = cfg.credit_window as u32;
    for timed_out in [true, false] {
        let mut ep = two_channel_endpoint(cfg.clone());
        let (sid, isn) = accept_from_peer(&mut ep, window);
        let ack = |credit| chunk(ChunkType::Ack, 5000, 7, 0, credit, &[]);
        ep.handle_chunk_bytes(CH, &ack(isn.wrapping_add(window)))
            .unwrap();
        // Bytes from the peer, read: the socket's credit edge has moved (it has flow
        // state to refresh), and nothing of it waits on either channel.
        ep.handle_chunk_bytes(CH, &chunk(ChunkType::Data, 5000, 7, 1000, 0, &[7; 100]))
            .unwrap();
        assert_eq!(ep.recv(sid, &mut [0u8; 128]), Ok(100));
        drain(&mut ep, CH);
        drain(&mut ep, ChannelId(1));
        if timed_out {
            ep.handle_channel_timed_out(CH);
        } else {
            ep.handle_channel_lost(CH);
        }
        let again = drain(&mut ep, ChannelId(1));
        if timed_out {
            assert!(again.is_empty(), "an idle socket sends nothing: {again:?}");
        } else {
            assert!(
                again.iter().any(|(h, _)| h.ty == ChunkType::Ack),
                "a reset channel's loss refreshes the credit: {again:?}"
            );
        }
        assert_eq!(ep.counters().resent_chunks, 0);
        ep.check_invariants().unwrap();
    }
    // A socket with DATA on the timed-out channel sends it again, credit refresh included.
    let mut ep = two_channel_endpoint(cfg);
    let (sid, isn) = accept_from_peer(&mut ep, window);
    ep.handle_chunk_bytes(
        CH,
        &chunk(ChunkType::Ack, 5000, 7, 0, isn.wrapping_add(window), &[]),
    )
    .unwrap();
    ep.send(sid, &pattern(2, 600)).unwrap();
    let on0 = drain(&mut ep, CH);
    drain(&mut ep, ChannelId(1));
    assert!(on0.iter().any(|(h, _)| h.ty == ChunkType::Data));
    ep.handle_channel_timed_out(CH);
    let again = drain(&mut ep, ChannelId(1));
    assert!(again.iter().any(|(h, _)| h.ty == ChunkType::Data));
    assert!(again.iter().any(|(h, _)| h.ty == ChunkType::Ack));
    ep.check_invariants().unwrap();
}

/// Regression (echo example under load): a peer whose stack stops gracefully closes its
/// channels once our transport has acknowledged everything, and sends nothing again. A
/// slow reader's chunks parked past its receive buffer were dropped with the closed
/// channel, so the reader got `ChannelLost` a few KB before the end. Now a gracefully
/// closed channel's parked chunks stay, and the reader gets every byte, then end of
/// stream. A reset channel's stay too (see the next test): the reader gets every byte
/// that arrived, and the peer's FIN made them the whole stream.
#[test]
fn parked_bytes_of_a_gracefully_closed_channel_stay_readable() {
    let cfg = small_config(256);
    let window = cfg.credit_window as u32;
    for graceful in [true, false] {
        let mut ep = two_channel_endpoint(cfg.clone());
        let (sid, _) = accept_from_peer(&mut ep, window);
        let data = pattern(3, 8 * 256);
        // The whole credit window arrives before the reader reads: the first 1024 bytes
        // fill the receive buffer, the rest is parked, charged to channel 0.
        for (i, part) in data.chunks(256).enumerate() {
            let seq = 1000 + (i * 256) as u32;
            ep.handle_chunk_bytes(CH, &chunk(ChunkType::Data, 5000, 7, seq, 0, part))
                .unwrap();
        }
        let fin = chunk(ChunkType::Fin, 5000, 7, 1000 + data.len() as u32, 0, &[]);
        ep.handle_chunk_bytes(ChannelId(1), &fin).unwrap();
        assert_eq!(ep.channel_parked_bytes(CH), 4 * 256);
        if graceful {
            ep.handle_channel_closed(CH);
            ep.handle_channel_closed(ChannelId(1));
        } else {
            ep.handle_channel_lost(CH);
            ep.handle_channel_lost(ChannelId(1));
        }
        // No channel left, and none will come.
        ep.handle_peer_gone(PEER, Error::ChannelLost);
        ep.check_invariants().unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 300];
        let end = loop {
            match ep.recv(sid, &mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => break Err(e),
            }
            ep.check_invariants().unwrap();
        };
        assert_eq!(end, Ok(()), "end of stream after every byte ({graceful})");
        assert!(got == data, "{} of {} bytes", got.len(), data.len());
        assert_eq!(
            ep.peer_parked_bytes(PEER),
            0,
            "the kept charge is given back"
        );
        ep.check_invariants().unwrap();
    }
}

/// Regression (forged RSTs on the bed stalled a 100 MB stream in about 1 run of 20 when
/// three or four channels were struck, `docs/investigations/forged-resets.md`). The two
/// ends of a reset channel learn of it at different times. Here the sender learned first:
/// it sent again, on channel 1, the chunks it had handed channel 0, while ours still waited
/// parked past the receive buffer, so its copies were ignored as duplicates. Then our
/// channel 0 went too. Dropping the parked chunks with it (as one might with a reset channel's)
/// left a hole that nobody would fill: the sender had its copies delivered, the reader
/// waited, and the sender waited for a RESUME. Kept, every byte arrives.
#[test]
fn parked_chunks_stay_when_their_copies_came_first_on_another_channel() {
    let cfg = small_config(256);
    let window = cfg.credit_window as u32;
    let mut ep = two_channel_endpoint(cfg);
    let (sid, _) = accept_from_peer(&mut ep, window);
    let data = pattern(5, 8 * 256);
    let piece = |i: usize| {
        chunk(
            ChunkType::Data,
            5000,
            7,
            1000 + (i * 256) as u32,
            0,
            &data[i * 256..(i + 1) * 256],
        )
    };
    for i in 0..8 {
        ep.handle_chunk_bytes(CH, &piece(i)).unwrap();
    }
    assert_eq!(ep.channel_parked_bytes(CH), 4 * 256);
    // The sender's copies of what channel 0 carried past the receive buffer.
    for i in 4..8 {
        ep.handle_chunk_bytes(ChannelId(1), &piece(i)).unwrap();
    }
    assert_eq!(ep.counters().duplicate_chunks, 4);
    ep.handle_channel_lost(CH);
    ep.check_invariants().unwrap();
    assert_eq!(
        ep.peer_parked_bytes(PEER),
        4 * 256,
        "still charged to the peer"
    );
    let fin = chunk(ChunkType::Fin, 5000, 7, 1000 + data.len() as u32, 0, &[]);
    ep.handle_chunk_bytes(ChannelId(1), &fin).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 300];
    loop {
        match ep.recv(sid, &mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("after {} of {} bytes: {e:?}", got.len(), data.len()),
        }
        ep.check_invariants().unwrap();
    }
    assert!(got == data, "{} of {} bytes", got.len(), data.len());
    assert_eq!(
        ep.peer_parked_bytes(PEER),
        0,
        "the kept charge is given back"
    );
    // The sender's copies sent again once more (it learns of nothing else) are ignored.
    for i in 4..8 {
        ep.handle_chunk_bytes(ChannelId(1), &piece(i)).unwrap();
    }
    assert_eq!(ep.counters().duplicate_chunks, 8);
    ep.check_invariants().unwrap();
}

#[test]
fn fin_and_reset_that_went_on_a_lost_channel_go_again() {
    let cfg = small_config(256);
    let window = cfg.credit_window as u32;
    let mut ep = Endpoint::new(cfg, netsched::RoundRobin::default()).unwrap();
    ep.add_channel(CH, PEER, ChannelClass::Throughput).unwrap();
    let (fin_sock, isn) = accept_from_peer(&mut ep, window);
    let ack = |port, credit| chunk(ChunkType::Ack, port, 7, 0, credit, &[]);
    ep.handle_chunk_bytes(CH, &ack(5000, isn.wrapping_add(window)))
        .unwrap();
    ep.shutdown(fin_sock).unwrap();
    assert!(drain(&mut ep, CH)
        .iter()
        .any(|(h, _)| h.ty == ChunkType::Fin));
    // A second socket, reset by the application after it received unread bytes.
    ep.handle_chunk_bytes(CH, &chunk(ChunkType::Sync, 5001, 7, 9000, window, &[]))
        .unwrap();
    let reset_sock = ep.accept(7).unwrap();
    ep.handle_chunk_bytes(CH, &chunk(ChunkType::Data, 5001, 7, 9000, 0, b"unread"))
        .unwrap();
    ep.close(reset_sock);
    let out = drain(&mut ep, CH);
    let reset = out
        .iter()
        .find(|(h, _)| h.ty == ChunkType::Reset)
        .unwrap()
        .0;
    assert_eq!(reset.credit, vns::RESET_ORDERED);
    // Channel 0 dies; the stack opens channel 2.
    ep.handle_channel_lost(CH);
    assert!(ep.peer_orphaned(PEER));
    ep.add_channel(ChannelId(2), PEER, ChannelClass::Throughput)
        .unwrap();
    let again = drain(&mut ep, ChannelId(2));
    assert!(again
        .iter()
        .any(|(h, _)| h.ty == ChunkType::Fin && h.dst_port == 5000));
    assert!(again
        .iter()
        .any(|(h, _)| h.ty == ChunkType::Reset && h.dst_port == 5001 && h.seq == reset.seq));
    // The SYNC_ACK is not sent again: the peer was heard since.
    assert!(again.iter().all(|(h, _)| h.ty != ChunkType::SyncAck));
    ep.check_invariants().unwrap();
}

#[test]
fn sync_ack_goes_again_while_the_peer_was_not_heard() {
    let mut ep = two_channel_endpoint(small_config(256));
    let (_sid, isn) = accept_from_peer(&mut ep, 2048);
    ep.handle_channel_lost(CH);
    let again = drain(&mut ep, ChannelId(1));
    let sa = again
        .iter()
        .find(|(h, _)| h.ty == ChunkType::SyncAck)
        .expect("SYNC_ACK sent again");
    assert_eq!(sa.0.seq.0, isn);
    assert_eq!(sa.0.dst_port, 5000);
}

#[test]
fn a_held_reset_applies_when_a_channel_is_lost() {
    let mut ep = two_channel_endpoint(small_config(256));
    let (sid, _) = accept_from_peer(&mut ep, 2048);
    ep.handle_chunk_bytes(CH, &chunk(ChunkType::Data, 5000, 7, 1000, 0, b"first"))
        .unwrap();
    // The peer's RESET ends its stream at 1010: bytes 1005..1010 are still on their way,
    // on the channel that dies.
    ep.handle_chunk_bytes(
        ChannelId(1),
        &chunk(ChunkType::Reset, 5000, 7, 1010, vns::RESET_ORDERED, &[]),
    )
    .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(ep.recv(sid, &mut buf), Ok(5));
    assert_eq!(ep.recv(sid, &mut buf), Err(Error::WouldBlock));
    ep.handle_channel_lost(CH);
    assert_eq!(ep.recv(sid, &mut buf), Err(Error::ConnectionReset));
}

#[test]
fn a_peer_granting_a_huge_window_and_never_reading_holds_at_most_the_resend_buffer() {
    let cfg = Config {
        send_buffer: 64 * 1024,
        resend_buffer: 8 * 1024,
        ..small_config(1024)
    };
    let mut ep = two_channel_endpoint(cfg);
    // The peer claims a 1 GiB window.
    let (sid, _) = accept_from_peer(&mut ep, 1 << 30);
    ep.send(sid, &pattern(3, 64 * 1024)).unwrap();
    let sent: usize = [CH, ChannelId(1)]
        .into_iter()
        .flat_map(|c| drain(&mut ep, c))
        .filter(|(h, _)| h.ty == ChunkType::Data)
        .map(|(_, p)| p.len())
        .sum();
    assert_eq!(sent, 8 * 1024);
    let st = ep.socket_stats(sid).unwrap();
    assert_eq!(st.unacked_bytes, 8 * 1024);
    assert_eq!(st.unsent_bytes, 56 * 1024);
    ep.check_invariants().unwrap();
}

#[test]
fn orphaned_sockets_fail_at_once_when_the_peer_is_gone() {
    let mut ep = Endpoint::new(small_config(256), netsched::RoundRobin::default()).unwrap();
    ep.add_channel(CH, PEER, ChannelClass::Throughput).unwrap();
    let (sid, _) = accept_from_peer(&mut ep, 2048);
    ep.handle_channel_lost(CH);
    while ep.poll_events().is_some() {}
    ep.handle_peer_gone(PEER, Error::ChannelLost);
    let events: Vec<Event> = std::iter::from_fn(|| ep.poll_events()).collect();
    assert!(events.contains(&Event::Failed(sid)));
    assert_eq!(ep.recv(sid, &mut [0; 4]), Err(Error::ChannelLost));
    assert!(!ep.peer_orphaned(PEER));
}

/// A retired channel (run-time scaling down) takes no new chunk, sends what it holds, and
/// once closed loses nothing: bytes both ways arrive exactly once, in order, over the
/// channel that remains, whatever was on the retired one when it closed.
#[test]
fn a_retired_channel_drains_and_closes_without_losing_a_byte() {
    let mut sim = Sim::throughput(2, small_config(256), 512, 11);
    sim.ends[B].bind(40, 1).unwrap();
    let c = sim.ends[A]
        .connect(PeerId(1), 40, AppClass::Throughput)
        .unwrap();
    sim.settle();
    let s = sim.ends[B].accept(40).unwrap();
    let (ch0, ch1) = (ChannelId(0), ChannelId(1));
    let up = pattern(21, 40_000);
    let down = pattern(22, 40_000);
    let (mut up_sent, mut down_sent) = (0, 0);
    let (mut up_got, mut down_got) = (Vec::new(), Vec::new());
    let mut buf = [0u8; 700];
    let mut retired = false;
    let mut closed = false;
    let mut steps = 0;
    while up_got.len() < up.len() || down_got.len() < down.len() {
        steps += 1;
        assert!(
            steps < 200_000,
            "stalled at {} / {}",
            up_got.len(),
            down_got.len()
        );
        if up_sent < up.len() {
            up_sent += sim.ends[A].send(c, &up[up_sent..]).unwrap_or(0);
        }
        if down_sent < down.len() {
            down_sent += sim.ends[B].send(s, &down[down_sent..]).unwrap_or(0);
        }
        if let Ok(n) = sim.ends[B].recv(s, &mut buf) {
            up_got.extend_from_slice(&buf[..n]);
        }
        if let Ok(n) = sim.ends[A].recv(c, &mut buf) {
            down_got.extend_from_slice(&buf[..n]);
        }
        if !retired && up_got.len() > up.len() / 3 {
            sim.ends[A].retire_channel(ch0).unwrap();
            // Its peer's last other channel cannot go too.
            assert_eq!(
                sim.ends[A].retire_channel(ch1),
                Err(ChannelError::LastChannel(ch1))
            );
            retired = true;
        }
        if retired && !closed {
            // Nothing new is scheduled on it: once drained, its queue stays empty.
            if sim.ends[A].channel_drained(ch0) {
                // What it held arrives; then new writes go elsewhere, for as long as
                // the other channel keeps them moving.
                while sim.deliver(0, A, usize::MAX) > 0 {}
                for _ in 0..50 {
                    if up_sent < up.len() {
                        up_sent += sim.ends[A].send(c, &up[up_sent..]).unwrap_or(0);
                    }
                    sim.pump_tx();
                    assert_eq!(
                        sim.wire_bytes(0, A),
                        0,
                        "a chunk went on the retired channel"
                    );
                    sim.deliver(1, A, usize::MAX);
                    sim.deliver(1, B, usize::MAX);
                    if let Ok(n) = sim.ends[B].recv(s, &mut buf) {
                        up_got.extend_from_slice(&buf[..n]);
                    }
                }
                sim.close_retired_channel(0, A);
                closed = true;
            }
        }
        sim.step();
    }
    assert!(closed, "the retired channel never drained");
    assert!(up_got == up, "A → B differs");
    assert!(down_got == down, "B → A differs");
    assert!(!sim.ends[A].channel_drained(ch1));
    sim.ends[A].check_invariants().unwrap();
    sim.ends[B].check_invariants().unwrap();
}
