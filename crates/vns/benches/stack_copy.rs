//! Bulk goodput of one application thread through a pair of in-memory stacks with 0, 1
//! and 2 copy workers, side by side in one run: a current-thread tokio runtime (the one
//! application thread) runs a writer task (1 MiB `write_all`s on stack A) and a reader task
//! (1 MiB reads on stack B) of one `VirtualStream`; each iteration moves 32 MiB. Both
//! stacks have the same worker count and 2 MiB socket buffers (the default 256 KiB ones
//! are below the default 512 KiB small-copy threshold, so workers would never copy). The
//! in-memory channels copy nothing, but each stack's queue drivers deframe (copy) what
//! they receive, on queue runtimes of the stack's own (the stacks are built outside a
//! runtime), so the application thread competes with both stacks' queue runtimes and the
//! workers for the machine's cores. After the measurements it prints each stack's
//! `CopyStats`, to show which copies went through the workers.
//!
//! Run: `cargo bench -j1 -p vns --bench stack_copy -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use vns::stack::{MemNetwork, Stack};
use vns::{Config, VirtualStream};

const BYTES: usize = 32 << 20;
const IO: usize = 1 << 20;

struct Setup {
    workers: usize,
    rt: Runtime,
    a: Stack,
    b: Stack,
    client: VirtualStream,
    server: VirtualStream,
}

fn setup(workers: usize) -> Setup {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let net = MemNetwork::new();
    let vns = Config {
        send_buffer: 2 << 20,
        recv_buffer: 2 << 20,
        credit_window: 4 << 20,
        credit_update_threshold: 512 << 10,
        ..Config::default()
    };
    let build = |ip| {
        Stack::builder()
            .ipv4(ip)
            .channels(4)
            .vns_config(vns.clone())
            .copy_workers(workers)
            .build_in_memory(&net)
            .expect("stack")
    };
    let (a, b) = (
        build(Ipv4Addr::new(10, 0, 0, 1)),
        build(Ipv4Addr::new(10, 0, 0, 2)),
    );
    let (client, server) = rt.block_on(async {
        let to = SocketAddrV4::new(b.ipv4(), 7000);
        let l = b.bind(to.into()).await.expect("bind");
        let client = a.connect(to.into()).await.expect("connect");
        let (server, _) = l.accept().await.expect("accept");
        (client, server)
    });
    Setup {
        workers,
        rt,
        a,
        b,
        client,
        server,
    }
}

/// Moves `BYTES` from client to server `iters` times; returns the time it took.
fn transfer(s: &mut Setup, src: &[u8], dst: &mut [u8], iters: u64) -> Duration {
    let Setup {
        rt, client, server, ..
    } = s;
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let write = async {
                for part in src.chunks(IO) {
                    client.write_all(part).await.expect("write");
                }
            };
            let read = async {
                let mut got = 0;
                while got < BYTES {
                    let n = server.read(&mut dst[..]).await.expect("read");
                    assert!(n > 0, "early end of stream");
                    got += n;
                }
            };
            tokio::join!(write, read);
            black_box(&dst[..]);
        }
        start.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let src: Vec<u8> = (0..BYTES).map(|i| (i * 131 + 17) as u8).collect();
    let mut dst = vec![0u8; IO];
    let mut setups: Vec<Setup> = [0usize, 1, 2].into_iter().map(setup).collect();
    let mut group = c.benchmark_group("stack_copy");
    group.throughput(Throughput::Bytes(BYTES as u64));
    group.sample_size(10);
    for s in &mut setups {
        let id = BenchmarkId::new(format!("{}w", s.workers), "32MiB_1MiB_io");
        group.bench_function(id, |b| {
            b.iter_custom(|iters| transfer(s, &src, &mut dst, iters))
        });
    }
    group.finish();
    for s in &setups {
        println!(
            "{} workers: writer stack {:?}\n           reader stack {:?}",
            s.workers,
            s.a.diagnostics().copy_stats(),
            s.b.diagnostics().copy_stats()
        );
    }
}

fn benches() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
}

criterion_main!(benches);
