//! Throughput of the Internet checksum: the fast lane-parallel sum against the RFC 1071
//! byte-pair reference, at a minimum frame, a standard MTU, a jumbo frame and the largest
//! IPv4 datagram; and the copy-and-checksum of a payload, fused against copy then sum.
//! Run: `cargo bench --bench checksum`.

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

    // The copy a sender makes from its send ring into a frame, with the checksum: fused
    // (one pass) against a copy followed by the fast sum.
    let mut group = c.benchmark_group("copy_and_checksum");
    for size in [1448usize, 9000] {
        let buf: Vec<u8> = (0..size + 1).map(|i| (i * 131 + 17) as u8).collect();
        let src = &buf[1..];
        let mut dst = vec![0u8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(BenchmarkId::new("fused", size), |b| {
            b.iter(|| checksum::copy_and_sum(black_box(&mut dst), black_box(src)))
        });
        group.bench_function(BenchmarkId::new("copy_then_sum", size), |b| {
            b.iter(|| {
                black_box(&mut dst).copy_from_slice(black_box(src));
                checksum::data(&dst)
            })
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
