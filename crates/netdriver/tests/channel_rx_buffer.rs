//! A queue's receive buffer (the round's `pull_rx`): short arrivals share one allocation
//! while earlier pieces are still held, rather than each taking a fresh 64 KiB buffer
//! (which cost page faults, and madvise with TLB shootdowns when freed, at 8 connections
//! of 64 B requests: `docs/investigations/per-message-path.md`, "The channel thread's
//! receive buffer: a fresh 64 KiB per arrival").
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

mod common;

use std::net::SocketAddrV4;

use bytes::Bytes;
use common::{config, start, DEADLINE};
use netdriver::channel::Dequeued;
use testbed::{testbed_or_skip, Side, TestBed};

#[test]
fn short_arrivals_share_one_receive_buffer_while_held() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    let a = start(&bed, Side::A, config(&bed, Side::A));
    let b = start(&bed, Side::B, config(&bed, Side::B));
    let listener = b.listen_channels().expect("listen");
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 9000);
    let tx = a.connect_on(0, target).expect("connect");
    let (rx, _) = listener.accept_timeout(DEADLINE).expect("accept");

    // One short message at a time, each received on its own (so each is its own pull),
    // every received piece kept alive.
    let mut held: Vec<Bytes> = Vec::new();
    for i in 0..8u8 {
        let msg = Bytes::from(vec![i; 64]);
        tx.enqueue_blocking(msg.clone(), Some(DEADLINE))
            .expect("enqueue");
        let mut got = Vec::new();
        while got.len() < 64 {
            match rx.dequeue_blocking(Some(DEADLINE)).expect("dequeue") {
                Dequeued::Chunk(c) => {
                    got.extend_from_slice(&c);
                    held.push(c);
                }
                Dequeued::Empty => {}
                Dequeued::Finished => panic!("end of stream"),
            }
        }
        assert_eq!(got, msg, "message {i}");
    }
    // Each piece starts where the previous one ended: one buffer for all of them.
    let contiguous = held
        .windows(2)
        .filter(|w| w[0].as_ptr().wrapping_add(w[0].len()) == w[1].as_ptr())
        .count();
    assert_eq!(
        contiguous,
        held.len() - 1,
        "held pieces of short arrivals landed in separate buffers"
    );
}
