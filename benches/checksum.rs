//! Throughput of the Internet checksum: the fast lane-parallel sum against the RFC 1071
//! byte-pair reference, at a minimum frame, a standard MTU, a jumbo frame and the largest
//! IPv4 datagram. Run: `cargo bench --bench checksum`.

use std::hint::black_box;

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use netchannel::netdriver::wire::checksum;

fn bench_checksum(c: &mut Criterion) {
    let mut group = c.benchmark_group("checksum");
    for size in [64usize, 1500, 9000, 65535] {
        // Deterministic, non-uniform bytes; offset by one so the odd-alignment path runs.
        let buf: Vec<u8> = (0..size + 1).map(|i| (i * 131 + 17) as u8).collect();
        let data = &buf[1..];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("fast", size), data, |b, d| {
            b.iter(|| checksum::data(black_box(d)))
        });
        group.bench_with_input(BenchmarkId::new("reference", size), data, |b, d| {
            b.iter(|| checksum::data_reference(black_box(d)))
        });
    }
    group.finish();
}

/// The benchmark group (written out rather than via `criterion_group!`, whose generated
/// function carries no doc comment and trips `missing_docs`).
pub fn benches() {
    let mut c = Criterion::default().configure_from_args();
    bench_checksum(&mut c);
}

criterion_main!(benches);
