//! What a silent accepted connection costs: kernel clients in A open connections to a
//! listener of a channel set in B and send nothing; the application accepts every one
//! and holds it. The heap the set holds for them (glibc's `mallinfo2`, summed over its
//! arenas) grows by at most [`SILENT_CONNECTION_BOUND`] per connection: the TCP rings and
//! the channel's Rx and Tx queues are allocated at the first byte, not at the handshake.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

mod common;

use std::net::{SocketAddr, TcpStream};

use common::{config, start, DEADLINE};
use testbed::{testbed_or_skip, Side, TestBed};

/// Silent connections held at once.
const CONNECTIONS: usize = 200;
/// Most heap one silent accepted connection may hold: its TCP state (the `Connection`,
/// about 3 KiB with its timers, SACK and RACK state), the channel's shared state and the
/// interface's table entry. Measured: see the test's output.
const SILENT_CONNECTION_BOUND: usize = 8 * 1024;

/// Bytes of heap in use now, over every malloc arena.
fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's counters; it takes no arguments and
    // returns a plain struct.
    let info = unsafe { libc::mallinfo2() };
    info.uordblks + info.hblkhd
}

#[test]
fn a_silent_accepted_connection_costs_a_few_kib() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let mut cfg = config(&bed, Side::B);
    // Room for every connection before the application accepts.
    cfg.backlog = 2 * CONNECTIONS;
    let set = start(&bed, Side::B, cfg);
    let listener = set.listen(7000).expect("listen");
    let target = SocketAddr::from((bed.side(Side::B).ipv4, 7000));
    let connect = move |n: usize| {
        (0..n)
            .map(|_| TcpStream::connect_timeout(&target, DEADLINE).expect("connect"))
            .collect::<Vec<_>>()
    };
    // A first connection, so that whatever is allocated once (lazily) is there already.
    let warm = bed.run_in(Side::A, move || connect(1)).unwrap();
    let first = listener.accept_timeout(DEADLINE).expect("accept");
    let before = heap_in_use();

    let clients = bed.run_in(Side::A, move || connect(CONNECTIONS)).unwrap();
    let held: Vec<_> = (0..CONNECTIONS)
        .map(|_| listener.accept_timeout(DEADLINE).expect("accept"))
        .collect();
    let after = heap_in_use();
    let per = after.saturating_sub(before) / CONNECTIONS;
    println!(
        "{CONNECTIONS} silent accepted connections: heap {before} -> {after} bytes, {per} bytes each"
    );
    assert!(
        per <= SILENT_CONNECTION_BOUND,
        "a silent accepted connection holds {per} bytes (bound {SILENT_CONNECTION_BOUND})"
    );
    drop((held, first, clients, warm));
    set.shutdown().unwrap();
}
