//! Proptest: one socket's chunks spread over 1–16 channels, delivered in any interleaving
//! and with any delay, arrive as exactly the sent bytes, with bounded buffering.

mod common;

use common::{pattern, small_config, Sim, A, B};
use proptest::prelude::*;
use rand::Rng;
use vns::{AppClass, Error, PeerId};

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn any_interleaving_across_channels_yields_the_stream(
        channels in 1usize..=16,
        len in 1usize..30_000,
        max_chunk in 8usize..1200,
        window in 1usize..3000,
        near_wrap in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut cfg = small_config(max_chunk);
        if near_wrap {
            // Both directions' sequence numbers wrap in the middle of the stream.
            cfg.first_isn = Some(u32::MAX - (len as u32 / 2));
        }
        let mut sim = Sim::throughput(channels, cfg.clone(), window, seed);
        sim.ends[B].bind(5, 1).unwrap();
        let c = sim.ends[A].connect(PeerId(1), 5, AppClass::Throughput).unwrap();
        sim.settle();
        let s = sim.ends[B].accept(5).unwrap();
        let data = pattern(9, len);
        let (mut sent, mut shut) = (0, false);
        let mut got = Vec::new();
        let mut buf = vec![0u8; 4 * max_chunk];
        let limit = 200_000;
        loop {
            prop_assert!(sim.steps < limit, "no progress after {} steps", limit);
            if sent < len {
                match sim.ends[A].send(c, &data[sent..]) {
                    Ok(n) => sent += n,
                    Err(Error::WouldBlock) => {}
                    Err(e) => panic!("send: {e}"),
                }
            } else if !shut {
                sim.ends[A].shutdown(c).unwrap();
                shut = true;
            }
            // Read a random amount (sometimes nothing) so the window is exercised.
            let want = sim.rng.gen_range(0..buf.len());
            match sim.ends[B].recv(s, &mut buf[..want]) {
                Ok(0) if want > 0 => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(Error::WouldBlock) => {}
                Err(e) => panic!("recv: {e}"),
            }
            sim.step();
            let st = sim.ends[B].socket_stats(s).unwrap();
            prop_assert!(st.reorder_bytes <= st.reorder_capacity);
            prop_assert!(st.reorder_capacity == cfg.recv_buffer);
            for &ch in &sim.channels {
                prop_assert!(sim.ends[B].channel_parked_bytes(ch) <= cfg.channel_budget);
            }
            sim.drain_events();
        }
        prop_assert_eq!(got.len(), data.len());
        prop_assert!(got == data, "stream differs");
    }
}
