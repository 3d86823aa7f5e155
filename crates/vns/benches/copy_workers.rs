//! Throughput of one application thread copying with 0, 1 and 2 copy workers, side by side
//! in one run: `copy_in` (application buffer -> 64 KiB chunks from the buffer pool, which
//! are recycled every iteration) and `copy_out` (chunks -> application buffer) of 1 MiB and
//! 16 MiB, plus `copy_out` of small transfers (4 KiB to 256 KiB) with the small-copy
//! threshold disabled, to show what handing a small copy to workers costs.
//!
//! Run: `cargo bench -j1 -p vns --bench copy_workers -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use vns::copy::{CopyConfig, CopyWorkerPool};

const CHUNK: usize = 64 * 1024;

/// Pools with 0, 1 and 2 workers splitting copies evenly, and 2 workers whose pieces the
/// default policy's `pick_copy_worker` places (what the Stack runs), labelled `2wpick`.
fn pools() -> Vec<(String, CopyWorkerPool)> {
    [(0usize, false), (1, false), (2, false), (2, true)]
        .into_iter()
        .map(|(workers, pick)| {
            let pool = CopyWorkerPool::new(CopyConfig {
                workers,
                chunk_size: CHUNK,
                // Every copy is split when there are workers: the threshold is what we
                // measure here.
                small_copy_threshold: 0,
                pin: true,
                ..CopyConfig::default()
            })
            .expect("copy worker pool");
            if pick {
                let mut policy = netsched::RoundRobin::default();
                pool.set_picker(Box::new(move |r, w| {
                    netsched::NetScheduler::pick_copy_worker(&mut policy, r, w)
                }));
            }
            (
                format!("{workers}w{}", if pick { "pick" } else { "" }),
                pool,
            )
        })
        .collect()
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + 17) as u8).collect()
}

fn bench_copy(c: &mut Criterion, pools: &[(String, CopyWorkerPool)]) {
    let mut group = c.benchmark_group("copy_in");
    for size in [1usize << 20, 16 << 20] {
        let src = data(size);
        group.throughput(Throughput::Bytes(size as u64));
        for (workers, pool) in pools {
            let id = BenchmarkId::new(workers.as_str(), format!("{}MiB", size >> 20));
            group.bench_function(id, |b| {
                b.iter(|| {
                    let chunks = pool.copy_in(black_box(&src));
                    for chunk in chunks {
                        pool.recycle(chunk);
                    }
                })
            });
        }
    }
    group.finish();

    let mut group = c.benchmark_group("copy_out");
    for size in [
        4usize << 10,
        16 << 10,
        64 << 10,
        256 << 10,
        1 << 20,
        16 << 20,
    ] {
        let src = data(size);
        let chunks = pools[0].1.copy_in(&src);
        let mut dst = vec![0u8; size];
        group.throughput(Throughput::Bytes(size as u64));
        for (workers, pool) in pools {
            let label = if size >= 1 << 20 {
                format!("{}MiB", size >> 20)
            } else {
                format!("{}KiB", size >> 10)
            };
            let id = BenchmarkId::new(workers.as_str(), label);
            group.bench_function(id, |b| {
                b.iter(|| pool.copy_out(black_box(&chunks), black_box(&mut dst)))
            });
        }
    }
    group.finish();
}

/// The benchmark group (written out rather than via `criterion_group!`, whose generated
/// function carries no doc comment and trips `missing_docs`).
pub fn benches() {
    let pools = pools();
    for (workers, pool) in &pools {
        eprintln!(
            "copy workers: {workers} on cores {:?} (app node {}, app core {:?})",
            pool.placement().cores,
            pool.placement().app_node,
            pool.placement().app_cpu
        );
    }
    let mut c = Criterion::default().configure_from_args();
    bench_copy(&mut c, &pools);
    for (workers, pool) in &pools {
        eprintln!("copy workers: {workers}: {:?}", pool.stats());
    }
}

criterion_main!(benches);
