//! Proptest: several sockets share channels; one reader sleeps for an arbitrary time. The
//! others finish within a bound that does not depend on the sleep, every byte of every
//! socket arrives exactly once, and parked bytes stay within each channel's budget.

mod common;

use common::{pattern, small_config, Sim, A, B};
use proptest::prelude::*;
use rand::Rng;
use vns::{AppClass, Error, PeerId};

const MAX_CHUNK: usize = 256;
const MAX_LEN: usize = 12_000;

/// Steps within which the active sockets must finish, whatever the sleeper does. One step
/// delivers at most one window of one channel; measured runs finish within about
/// 0.04 steps per byte, so this leaves a margin of about 2.5x.
fn bound(active_bytes: usize) -> u64 {
    1_000 + active_bytes as u64 / 10
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_sleeping_reader_does_not_stall_the_others(
        sockets in 2usize..=4,
        channels in 1usize..=4,
        len in 1000usize..MAX_LEN,
        // Up to three times the largest bound: the sleeper often outlasts the others.
        pause in 0u64..(3 * (1_000 + 3 * MAX_LEN as u64 / 10)),
        window in 64usize..1024,
        seed in any::<u64>(),
    ) {
        let mut cfg = small_config(MAX_CHUNK);
        // Enough budget for every socket's worst-case overshoot (credit beyond the receive
        // buffer plus one straddling chunk): the last resort must never be needed.
        cfg.channel_budget = sockets * (cfg.credit_window - cfg.recv_buffer + MAX_CHUNK);
        let mut sim = Sim::throughput(channels, cfg.clone(), window, seed);
        sim.ends[B].bind(6, sockets).unwrap();
        let clients: Vec<_> =
            (0..sockets).map(|_| sim.ends[A].connect(PeerId(1), 6, AppClass::Throughput).unwrap()).collect();
        sim.settle();
        // Match accepted sockets to clients by port.
        let mut servers = vec![None; sockets];
        for _ in 0..sockets {
            let s = sim.ends[B].accept(6).unwrap();
            let remote = sim.ends[B].socket_addr(s).unwrap().2;
            let i = clients.iter().position(|&c| sim.ends[A].socket_addr(c).unwrap().1 == remote).unwrap();
            servers[i] = Some(s);
        }
        let servers: Vec<_> = servers.into_iter().map(Option::unwrap).collect();
        let data: Vec<Vec<u8>> = (0..sockets).map(|i| pattern(i as u8 + 1, len)).collect();
        let mut sent = vec![0; sockets];
        let mut shut = vec![false; sockets];
        let mut got = vec![Vec::new(); sockets];
        let mut done_at = vec![None; sockets];
        let mut buf = vec![0u8; 2 * MAX_CHUNK];
        let limit = bound((sockets - 1) * len);
        let mut saw_park = false;
        while done_at.iter().any(Option::is_none) {
            let step = sim.steps;
            prop_assert!(step < pause + 10 * limit, "stuck after the sleeper woke");
            for i in 0..sockets {
                if sent[i] < len {
                    match sim.ends[A].send(clients[i], &data[i][sent[i]..]) {
                        Ok(n) => sent[i] += n,
                        Err(Error::WouldBlock) => {}
                        Err(e) => panic!("send {i}: {e}"),
                    }
                } else if !shut[i] {
                    sim.ends[A].shutdown(clients[i]).unwrap();
                    shut[i] = true;
                }
                if (i == 0 && step < pause) || done_at[i].is_some() {
                    continue;
                }
                let want = sim.rng.gen_range(1..buf.len());
                match sim.ends[B].recv(servers[i], &mut buf[..want]) {
                    Ok(0) => done_at[i] = Some(step),
                    Ok(n) => got[i].extend_from_slice(&buf[..n]),
                    Err(Error::WouldBlock) => {}
                    Err(e) => panic!("recv {i}: {e}"),
                }
            }
            sim.step();
            sim.drain_events();
            for &ch in &sim.channels {
                prop_assert!(sim.ends[B].channel_parked_bytes(ch) <= cfg.channel_budget);
                prop_assert!(!sim.ends[B].should_pause_channel_reads(ch), "last resort used");
            }
            let sleeper = sim.ends[B].socket_stats(servers[0]).unwrap();
            saw_park |= sleeper.parked_bytes > 0 && sleeper.stop_sent;
            let parked: usize = servers.iter().map(|&s| sim.ends[B].socket_stats(s).unwrap().parked_bytes).sum();
            prop_assert!(parked <= cfg.channel_budget * channels);
            for (i, done) in done_at.iter().enumerate().skip(1) {
                prop_assert!(
                    done.is_some() || sim.steps <= limit,
                    "socket {} not done after {} steps (sleeper paused for {})", i, limit, pause
                );
            }
        }
        if pause > limit && len > 2 * cfg.credit_window {
            // The sleeper's stream outgrew its receive buffer while it slept: the response
            // queue and STOP, not the channel window, must have absorbed it.
            prop_assert!(saw_park, "sleeper never parked or sent STOP");
        }
        for i in 0..sockets {
            prop_assert!(got[i] == data[i], "socket {} stream differs", i);
        }
    }
}
