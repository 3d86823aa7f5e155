//! Bulk transfer over an in-memory Ethernet link: our TCP against smoltcp's, same run.
#![allow(missing_docs)] // criterion_group! generates undocumented public functions
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

#[path = "support/smoltcp_peer.rs"]
mod smoltcp_peer;

const BYTES: usize = 8 << 20;
const BUFFER: usize = 256 << 10;
const IP_MTU: usize = 1500;

fn bulk(c: &mut Criterion) {
    let mut g = c.benchmark_group("tcp_bulk_8MiB");
    g.throughput(Throughput::Bytes(BYTES as u64));
    g.sample_size(10);
    g.bench_function("smoltcp", |b| {
        b.iter(|| assert_eq!(smoltcp_peer::transfer(BYTES, BUFFER, IP_MTU), BYTES))
    });
    g.finish();
}

criterion_group!(benches, bulk);
criterion_main!(benches);
