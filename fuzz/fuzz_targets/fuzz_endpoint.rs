//! Drives a `vns::Endpoint` as a hostile peer would: arbitrary bytes on four channels of
//! one peer, interleaved with the application's reads, accepts, shutdowns and closes and
//! with channels being drained or lost. The endpoint listens on port 80 and has accepted
//! one SYNC before the input starts, so DATA/STOP/FIN chunks for that socket are reachable.
//!
//! Input: a sequence of operations, each one byte of opcode then its arguments:
//! `0..=3` feed (channel = opcode, then a length byte, then that many bytes of the stream);
//! `4` read (a length byte); `5` accept; `6` shutdown the oldest socket; `7` close it;
//! `8` drain a channel's output (a channel byte); `9` lose a channel (a channel byte);
//! `10` let time pass (a byte of seconds; closed sockets' linger timers run out).
//! After every operation: no panic, and `check_invariants` holds (parked bytes equal what
//! the response queues hold and stay within the channel budget; reorder and send buffers
//! within their bounds).
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use vns::wire::{ChunkRepr, ChunkType, Seq};
use vns::{ChannelClass, ChannelId, Config, Endpoint, PeerId};

fn config() -> Config {
    // Small buffers so that the input reaches parking, STOP and the budget quickly.
    Config {
        max_chunk_payload: 256,
        send_buffer: 1024,
        recv_buffer: 1024,
        credit_window: 2048,
        credit_update_threshold: 256,
        channel_budget: 4096,
        first_isn: Some(1000),
        rng_seed: Some(0),
        linger_timeout: Duration::from_secs(30),
        ..Config::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let mut ep = Endpoint::new(config(), netsched::RoundRobin::default()).expect("valid");
    for i in 0..4 {
        ep.add_channel(ChannelId(i), PeerId(1), ChannelClass::Throughput)
            .expect("new channel");
    }
    ep.bind(80, 4).expect("free port");
    let mut now = Instant::now();
    ep.handle_timeout(now);
    let sync = ChunkRepr {
        src_port: 5000,
        dst_port: 80,
        seq: Seq(0),
        credit: 2048,
        ty: ChunkType::Sync,
        payload_len: 0,
    };
    let mut first = Vec::new();
    sync.emit_to_vec(&[], &mut first);
    ep.handle_chunk_bytes(ChannelId(0), &first).expect("valid SYNC");
    let mut socks = Vec::new();
    let mut out = Vec::new();
    let mut rest = data;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        let mut arg = || {
            let (&a, t) = rest.split_first()?;
            rest = t;
            Some(a)
        };
        match op % 11 {
            ch @ 0..=3 => {
                let Some(n) = arg() else { break };
                let n = usize::from(n).min(rest.len());
                let (bytes, t) = rest.split_at(n);
                rest = t;
                let _ = ep.handle_chunk_bytes(ChannelId(u32::from(ch)), bytes);
            }
            4 => {
                let Some(n) = arg() else { break };
                let mut buf = vec![0; usize::from(n) * 8];
                for &s in &socks {
                    let _ = ep.recv(s, &mut buf);
                }
            }
            5 => {
                while let Ok(s) = ep.accept(80) {
                    socks.push(s);
                }
            }
            6 => {
                if let Some(&s) = socks.first() {
                    let _ = ep.shutdown(s);
                }
            }
            7 => {
                if !socks.is_empty() {
                    ep.close(socks.remove(0));
                }
            }
            8 => {
                let Some(ch) = arg() else { break };
                out.clear();
                while ep.poll_transmit(ChannelId(u32::from(ch % 4)), &mut out).is_some() {}
            }
            9 => {
                let Some(ch) = arg() else { break };
                let id = ChannelId(u32::from(ch % 4));
                match ch / 4 % 3 {
                    0 => ep.handle_channel_lost(id),
                    1 => ep.handle_channel_closed(id),
                    _ => ep.handle_channel_timed_out(id),
                }
            }
            _ => {
                let Some(secs) = arg() else { break };
                now += Duration::from_secs(u64::from(secs));
                ep.handle_timeout(now);
            }
        }
        while ep.poll_events().is_some() {}
        if let Err(e) = ep.check_invariants() {
            panic!("invariant broken: {e}");
        }
    }
});
