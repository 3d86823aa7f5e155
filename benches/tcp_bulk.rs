//! Bulk transfer over an in-memory Ethernet link: our TCP against smoltcp 0.14's, in the
//! same run, two interfaces each over a link that recycles its frame buffers, with equal MTU
//! (1500), buffers (256 KiB), congestion control (CUBIC), Nagle and delayed ACK off, both
//! computing and verifying checksums in software, every byte checked at the receiver.
//! Throughput is wall-clock goodput of one thread running both ends.
//!
//! Modes, chosen by environment variables (no variable: the criterion groups below):
//!
//! - `TCP_BULK_ROUNDS=n` (with `TCP_BULK_MIB`, default 1024): `n` rounds, each moving the
//!   given amount once over each stack, the order alternating; prints each round, the median
//!   goodput of each and their ratio, then exits. This is the per-core comparison.
//! - `TCP_BULK_ONE=ours|ours-large|smoltcp` (with `TCP_BULK_MIB`, default 64): one transfer
//!   over one stack, then exit; for `valgrind --tool=callgrind`, whose instruction count
//!   divided by the bytes moved is the instructions-per-byte figure. `ours-large` is our
//!   stack with super-segments over a link that carries them whole and leaves checksums to
//!   it (the offloads of a GSO link or a NIC with TSO/GRO); `TCP_BULK_ROUNDS` runs it as a
//!   third column.
//!
//! It also reports goodput at 0, 1 and 5 % loss on a 1 Gbit/s, 50 µs link, in virtual
//! time (deterministic, independent of machine load), with today's loss recovery and with
//! RFC 6675 alone; and goodput on a 100 Gbit/s, 100 µs round-trip link with the receive
//! buffer fixed or auto-tuned.
use criterion::{criterion_main, Criterion, Throughput};
use netchannel::netdriver::time::Duration;

#[path = "support/ours.rs"]
mod ours;
#[path = "support/pattern.rs"]
mod pattern;
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
        b.iter(|| assert_eq!(ours::bulk(BYTES, BUFFER, IP_MTU), BYTES))
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

/// Goodput in virtual time on a 100 Gbit/s link with a 100 µs round trip (50 µs each way)
/// at MTU 9000 and 1500, the sender's buffer large (8 MiB), with the receive buffer fixed
/// at the default 256 KiB, auto-tuned from it up to 6 MiB (`rx_buffer_max`, Linux's
/// `tcp_rmem` maximum), and fixed at 6 MiB from the start. Deterministic.
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

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time this thread has used (`CLOCK_THREAD_CPUTIME_ID`): on a shared machine it
/// leaves out the time other processes held the core, which wall-clock time includes.
fn thread_cpu() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One transfer of `bytes` over `side`, timed (wall clock, thread CPU time); panics if it
/// did not complete.
fn timed(side: &str, bytes: usize) -> (std::time::Duration, std::time::Duration) {
    let (start, cpu) = (std::time::Instant::now(), thread_cpu());
    let received = match side {
        "ours" => ours::bulk(bytes, BUFFER, IP_MTU),
        "ours-large" => ours::bulk_large(bytes, BUFFER, IP_MTU),
        "smoltcp" => smoltcp_peer::transfer(bytes, BUFFER, IP_MTU),
        other => panic!("TCP_BULK_ONE={other}: expected ours, ours-large or smoltcp"),
    };
    let elapsed = (start.elapsed(), thread_cpu() - cpu);
    assert_eq!(received, bytes, "{side} stalled");
    elapsed
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `TCP_BULK_ROUNDS` rounds of both stacks, interleaved (see the module documentation).
/// Prints wall-clock goodput (the figure compared) and goodput per CPU second.
fn interleaved(rounds: usize) {
    let bytes = env_usize("TCP_BULK_MIB", 1024) << 20;
    let mibs = |d: std::time::Duration| bytes as f64 / d.as_secs_f64() / (1 << 20) as f64;
    let (mut o, mut s, mut oc, mut sc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut l, mut lc) = (Vec::new(), Vec::new());
    println!(
        "interleaved: {} MiB per transfer, {rounds} rounds",
        bytes >> 20
    );
    for round in 0..rounds {
        let (ours, smol) = if round % 2 == 0 {
            let ours = timed("ours", bytes);
            (ours, timed("smoltcp", bytes))
        } else {
            let smol = timed("smoltcp", bytes);
            (timed("ours", bytes), smol)
        };
        println!(
            "round {round}: wall ours {:.0} MiB/s, smoltcp {:.0} MiB/s, ratio {:.2}; \
             cpu ours {:.0} MiB/s, smoltcp {:.0} MiB/s, ratio {:.2}",
            mibs(ours.0),
            mibs(smol.0),
            smol.0.as_secs_f64() / ours.0.as_secs_f64(),
            mibs(ours.1),
            mibs(smol.1),
            smol.1.as_secs_f64() / ours.1.as_secs_f64(),
        );
        o.push(mibs(ours.0));
        s.push(mibs(smol.0));
        oc.push(mibs(ours.1));
        sc.push(mibs(smol.1));
        let large = timed("ours-large", bytes);
        println!(
            "round {round}: ours with super-segments: wall {:.0} MiB/s ({:.2} x smoltcp), cpu {:.0} MiB/s ({:.2} x smoltcp)",
            mibs(large.0),
            smol.0.as_secs_f64() / large.0.as_secs_f64(),
            mibs(large.1),
            smol.1.as_secs_f64() / large.1.as_secs_f64(),
        );
        l.push(mibs(large.0));
        lc.push(mibs(large.1));
    }
    let (mo, ms) = (median(o), median(s));
    let (mco, mcs) = (median(oc), median(sc));
    println!(
        "median wall-clock goodput: ours {mo:.0} MiB/s, smoltcp {ms:.0} MiB/s, ratio {:.2}",
        mo / ms
    );
    println!(
        "median goodput per CPU second: ours {mco:.0} MiB/s, smoltcp {mcs:.0} MiB/s, ratio {:.2}",
        mco / mcs
    );
    let (ml, mlc) = (median(l), median(lc));
    println!(
        "ours with super-segments: median wall {ml:.0} MiB/s ({:.2} x smoltcp), per CPU second {mlc:.0} MiB/s ({:.2} x smoltcp)",
        ml / ms,
        mlc / mcs
    );
}

/// Runs the benchmarks (written out by hand instead of `criterion_group!`, whose generated
/// function has no doc comment).
pub fn benches() {
    if let Ok(side) = std::env::var("TCP_BULK_ONE") {
        let bytes = env_usize("TCP_BULK_MIB", 64) << 20;
        let (wall, cpu) = timed(&side, bytes);
        println!(
            "{side}: {} MiB in {:.3} s ({:.3} s CPU)",
            bytes >> 20,
            wall.as_secs_f64(),
            cpu.as_secs_f64()
        );
        return;
    }
    let rounds = env_usize("TCP_BULK_ROUNDS", 0);
    if rounds > 0 {
        interleaved(rounds);
        return;
    }
    window_report();
    loss_report();
    let mut c = Criterion::default().configure_from_args();
    bulk(&mut c);
}

criterion_main!(benches);
