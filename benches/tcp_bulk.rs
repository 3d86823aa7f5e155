//! Bulk transfer over an in-memory Ethernet link: our TCP against smoltcp's, in the same
//! run, with equal MTU (1500), buffers (256 KiB) and congestion control (CUBIC), both
//! computing and verifying checksums. Throughput is wall-clock CPU throughput of one core
//! running both ends.
//!
//! It also reports goodput at 0, 1 and 5 % loss on a 1 Gbit/s, 50 µs link, in virtual
//! time (deterministic, independent of machine load), with today's loss recovery and with
//! RFC 6675 alone; and goodput on a 100 Gbit/s, 100 µs round-trip link with the receive
//! buffer fixed or auto-tuned.
use criterion::{criterion_main, Criterion, Throughput};
use netchannel::netdriver::time::Duration;

#[path = "support/ours.rs"]
mod ours;
#[path = "support/smoltcp_peer.rs"]
mod smoltcp_peer;

const BYTES: usize = 8 << 20;
const BUFFER: usize = 256 << 10;
const IP_MTU: usize = 1500;

fn bulk(c: &mut Criterion) {
    let mut g = c.benchmark_group("tcp_bulk_8MiB");
    g.throughput(Throughput::Bytes(BYTES as u64));
    g.sample_size(10);
    g.bench_function("netchannel", |b| {
        b.iter(|| {
            let out = ours::transfer(BYTES, BUFFER, IP_MTU, Duration::ZERO, None, 0.0);
            assert_eq!(out.received, BYTES);
        })
    });
    g.bench_function("smoltcp", |b| {
        b.iter(|| assert_eq!(smoltcp_peer::transfer(BYTES, BUFFER, IP_MTU), BYTES))
    });
    g.finish();

    let mut g = c.benchmark_group("tcp_bulk_8MiB_1pct_loss");
    g.throughput(Throughput::Bytes(BYTES as u64));
    g.sample_size(10);
    g.bench_function("netchannel", |b| {
        b.iter(|| {
            let out = ours::transfer(BYTES, BUFFER, IP_MTU, Duration::ZERO, None, 0.01);
            assert_eq!(out.received, BYTES);
        })
    });
    g.finish();
}

/// Goodput in virtual time on a shaped link at 0, 1 and 5 % loss, with today's loss
/// recovery (the defaults: SACK with RACK-TLP, PRR, undo, limited transmit) and with the
/// recovery before it (SACK and RFC 6675 only: RACK, TLP, PRR, undo and limited transmit
/// off), in one run. Deterministic (seeded losses, virtual time).
fn loss_report() {
    let link = |loss, modern: bool| {
        ours::transfer_with(
            BYTES,
            BUFFER,
            IP_MTU,
            Duration::from_micros(50),
            Some(1_000_000_000),
            loss,
            |c| {
                if !modern {
                    c.rack = false;
                    c.tail_loss_probe = false;
                    c.prr = false;
                    c.undo = false;
                    c.limited_transmit = false;
                }
            },
        )
    };
    let gbps = |o: &ours::Outcome| BYTES as f64 * 8.0 / o.elapsed.as_secs_f64() / 1e9;
    println!("virtual goodput, 8 MiB over a 1 Gbit/s 50 us link:");
    println!("| loss | RACK-TLP + PRR (default) | retransmitted | RFC 6675 only | retransmitted | ratio |");
    println!("|---|---|---|---|---|---|");
    for loss in [0.0, 0.01, 0.05] {
        let (new, old) = (link(loss, true), link(loss, false));
        assert_eq!(new.received, BYTES);
        assert_eq!(old.received, BYTES);
        println!(
            "| {:.0} % | {:.3} Gbit/s | {} | {:.3} Gbit/s | {} | {:.2} |",
            loss * 100.0,
            gbps(&new),
            new.retransmitted,
            gbps(&old),
            old.retransmitted,
            gbps(&new) / gbps(&old)
        );
    }
}

/// Goodput in virtual time on a 100 Gbit/s link with a 100 µs round trip (50 µs each
/// way) at MTU 9000 and 1500, the sender's buffer large (8 MiB), with the receive buffer
/// fixed at the default 256 KiB, auto-tuned from it up to 6 MiB (`rx_buffer_max`, Linux's
/// `tcp_rmem` maximum), and fixed at 6 MiB from the start (issue 15 §3). Deterministic.
fn window_report() {
    const WINDOW_BYTES: usize = 64 << 20;
    const MAX: usize = 6 << 20;
    let run = |mtu: usize, rx: usize, rx_max: Option<usize>| {
        let out = ours::transfer_with(
            WINDOW_BYTES,
            rx,
            mtu,
            Duration::from_micros(50),
            Some(100_000_000_000),
            0.0,
            |c| {
                c.mss = u16::MAX;
                c.tx_buffer = 8 << 20;
                c.rx_buffer_max = rx_max;
            },
        );
        assert_eq!(out.received, WINDOW_BYTES);
        out
    };
    let gbps = |o: &ours::Outcome| WINDOW_BYTES as f64 * 8.0 / o.elapsed.as_secs_f64() / 1e9;
    println!("virtual goodput, 64 MiB over a 100 Gbit/s link, 100 us RTT, sender buffer 8 MiB:");
    println!("| MTU | rx 256 KiB fixed | auto-tuned up to 6 MiB (final buffer) | rx 6 MiB fixed | auto / fixed 256 KiB |");
    println!("|---|---|---|---|---|");
    for mtu in [9000, 1500] {
        let fixed = run(mtu, BUFFER, None);
        let auto = run(mtu, BUFFER, Some(MAX));
        let big = run(mtu, MAX, None);
        println!(
            "| {mtu} | {:.1} Gbit/s | {:.1} Gbit/s ({} KiB) | {:.1} Gbit/s | {:.2} |",
            gbps(&fixed),
            gbps(&auto),
            auto.rx_buffer >> 10,
            gbps(&big),
            gbps(&auto) / gbps(&fixed)
        );
    }
}

/// Runs the benchmarks (written out by hand instead of `criterion_group!`, whose generated
/// function has no doc comment).
pub fn benches() {
    window_report();
    loss_report();
    let mut c = Criterion::default().configure_from_args();
    bulk(&mut c);
}

criterion_main!(benches);
