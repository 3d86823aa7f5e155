//! Tests of the copy worker pool (placement has its own in `placement.rs`).

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use super::*;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn mock_pool(workers: usize, chunk_size: usize, small_copy_threshold: usize) -> CopyWorkerPool {
    CopyWorkerPool::new(CopyConfig {
        workers,
        chunk_size,
        small_copy_threshold,
        pin: false,
        buffer_pool_capacity: 64,
        topology: Some(Topology::from_nodes(vec![vec![0, 1]], Some(0))),
        ..CopyConfig::default()
    })
    .expect("pool starts")
}

/// Polls `cond` until it holds or `deadline` passes; returns whether it held.
fn wait_until(deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::yield_now();
    }
}

/// `/proc/self/task/<tid>/stat` field 3 (the scheduler state), if the thread exists.
fn thread_state(tid: u64) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // "tid (comm) S ..." — comm may hold spaces, so split after the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any length, chunk size, worker count and threshold: copy_in cuts exact chunks and
    /// copy_out puts back exactly the same bytes.
    #[test]
    fn copy_in_then_out_round_trips(
        len in 0usize..300_000,
        chunk_size in 1usize..70_000,
        workers in 0usize..4,
        threshold in prop_oneof![Just(0usize), 0usize..200_000],
        seed in any::<u8>(),
        picker in 0u8..4,
    ) {
        let pool = mock_pool(workers, chunk_size, threshold);
        // 0: copies split evenly; 1: a picker naming worker 0 always; 2: one declining
        // every piece; 3: the default policy's choice (fewest queued bytes).
        match picker {
            1 => pool.set_picker(Box::new(|_, _| Some(netsched::CopyWorkerId(0)))),
            2 => pool.set_picker(Box::new(|_, _| None)),
            3 => {
                let mut policy = netsched::RoundRobin::default();
                pool.set_picker(Box::new(move |r, w| {
                    netsched::NetScheduler::pick_copy_worker(&mut policy, r, w)
                }));
            }
            _ => {}
        }
        let data = pattern(len, seed);
        let chunks = pool.copy_in(&data);
        prop_assert_eq!(chunks.len(), len.div_ceil(chunk_size));
        for (i, c) in chunks.iter().enumerate() {
            let want = chunk_size.min(len - i * chunk_size);
            prop_assert_eq!(c.len(), want);
        }
        let mut back = vec![0xAAu8; len + 7];
        prop_assert_eq!(pool.copy_out(&chunks, &mut back), len);
        prop_assert_eq!(&back[..len], &data[..]);
        prop_assert!(back[len..].iter().all(|&b| b == 0xAA), "wrote past the data");
        // Caller-held buffers: reuse whatever is there, refill in order.
        let mut out: Vec<BytesMut> = (0..(seed % 5)).map(|_| BytesMut::from(&b"stale"[..])).collect();
        prop_assert_eq!(pool.copy_in_mut(&data, &mut out), chunks.len());
        prop_assert_eq!(out.len(), chunks.len());
        for (a, b) in out.iter().zip(&chunks) {
            prop_assert_eq!(&a[..], &b[..]);
        }
        let s = pool.stats();
        prop_assert_eq!(s.app_bytes + s.worker_bytes, 3 * len as u64);
        prop_assert_eq!(pool.copied_by_worker().iter().sum::<u64>(), s.worker_bytes);
        prop_assert!(pool.worker_stats().iter().all(|w| w.queued_bytes == 0));
        if picker == 2 {
            prop_assert_eq!(s.worker_bytes, 0);
        }
        if workers == 0 || len < threshold.max(1) {
            prop_assert_eq!(s.parallel_copies, 0);
        }
    }

    /// copy_out from chunks of any sizes into a destination of any size copies the
    /// longest prefix that fits.
    #[test]
    fn copy_out_fills_any_prefix(
        sizes in proptest::collection::vec(0usize..5_000, 0..40),
        dst_len in 0usize..120_000,
        workers in 0usize..4,
    ) {
        let pool = mock_pool(workers, 1024, 0);
        let all = pattern(sizes.iter().sum(), 3);
        let mut chunks = Vec::new();
        let mut at = 0;
        for s in &sizes {
            chunks.push(Bytes::copy_from_slice(&all[at..at + s]));
            at += s;
        }
        let mut dst = vec![0u8; dst_len];
        let n = pool.copy_out(&chunks, &mut dst);
        prop_assert_eq!(n, all.len().min(dst_len));
        prop_assert_eq!(&dst[..n], &all[..n]);
        prop_assert!(dst[n..].iter().all(|&b| b == 0));
    }
}

#[test]
fn small_copies_are_inline_large_ones_parallel() {
    let pool = mock_pool(2, 4096, 64 * 1024);
    let small = pattern(64 * 1024 - 1, 1);
    let chunks = pool.copy_in(&small);
    let mut back = vec![0; small.len()];
    pool.copy_out(&chunks, &mut back);
    assert_eq!(back, small);
    let s = pool.stats();
    assert_eq!((s.inline_copies, s.parallel_copies), (2, 0));
    assert_eq!((s.worker_pieces, s.worker_bytes), (0, 0));
    assert_eq!(s.app_bytes, 2 * small.len() as u64);

    let large = pattern(64 * 1024, 2);
    let chunks = pool.copy_in(&large);
    let mut back = vec![0; large.len()];
    pool.copy_out(&chunks, &mut back);
    assert_eq!(back, large);
    let s = pool.stats();
    assert_eq!((s.inline_copies, s.parallel_copies), (2, 2));
    // Two pieces per copy went to the two workers; the app thread kept one third.
    assert_eq!(s.worker_pieces, 4);
    assert!(s.worker_bytes > 0);
    assert_eq!(
        s.app_bytes + s.worker_bytes,
        2 * (small.len() + large.len()) as u64
    );
}

#[test]
fn chunk_buffers_are_reused_not_reallocated() {
    let pool = mock_pool(2, 64 * 1024, 0);
    let data = pattern(1 << 20, 4);
    let first = pool.copy_in(&data);
    assert_eq!(first.len(), 16);
    let s = pool.stats().buffers;
    assert_eq!((s.allocations, s.reuses), (16, 0));
    let ptrs: std::collections::BTreeSet<usize> =
        first.iter().map(|c| c.as_ptr() as usize).collect();
    for c in first {
        assert!(pool.recycle(c));
    }
    for round in 0..10u8 {
        let chunks = pool.copy_in(&pattern(1 << 20, round));
        let again: std::collections::BTreeSet<usize> =
            chunks.iter().map(|c| c.as_ptr() as usize).collect();
        assert_eq!(again, ptrs, "the same 16 buffers come back");
        for c in chunks {
            assert!(pool.recycle(c));
        }
    }
    let s = pool.stats().buffers;
    assert_eq!((s.allocations, s.reuses), (16, 160));
    assert_eq!((s.recycled, s.discarded), (176, 0));
    // A chunk the channel still shares is not taken back.
    let chunks = pool.copy_in(&data[..100]);
    let held = chunks[0].clone();
    assert!(!pool.recycle(chunks.into_iter().next().expect("one chunk")));
    assert_eq!(pool.stats().buffers.discarded, 1);
    drop(held);
}

#[test]
fn caller_buffers_are_reused_in_place() {
    let pool = mock_pool(1, 1000, 0);
    let mut out = Vec::new();
    assert_eq!(pool.copy_in_mut(&pattern(3500, 0), &mut out), 4);
    let ptrs: Vec<*const u8> = out.iter().map(|b| b.as_ptr()).collect();
    let s = pool.stats().buffers;
    assert_eq!((s.allocations, s.reuses), (4, 0));
    // Fewer chunks: the surplus goes to the pool; the first two keep their memory.
    assert_eq!(pool.copy_in_mut(&pattern(2000, 1), &mut out), 2);
    assert_eq!(
        out.iter().map(|b| b.as_ptr()).collect::<Vec<_>>(),
        ptrs[..2]
    );
    assert_eq!(&out[1][..], &pattern(2000, 1)[1000..]);
    assert_eq!(pool.buffers().idle(), 2);
    // More again: the pool's two come back, nothing is allocated.
    assert_eq!(pool.copy_in_mut(&pattern(4000, 2), &mut out), 4);
    let s = pool.stats().buffers;
    assert_eq!((s.allocations, s.reuses), (4, 6));
    assert_eq!(pool.copy_in_mut(&[], &mut out), 0);
    assert!(out.is_empty());
}

#[test]
fn workers_zero_copies_everything_inline() {
    let pool = mock_pool(0, 4096, 0);
    assert_eq!(pool.live_workers(), 0);
    assert!(pool.worker_tids().is_empty());
    assert!(pool.placement().cores.is_empty());
    let data = pattern(1 << 20, 9);
    let chunks = pool.copy_in(&data);
    let mut back = vec![0; data.len()];
    assert_eq!(pool.copy_out(&chunks, &mut back), data.len());
    assert_eq!(back, data);
    let s = pool.stats();
    assert_eq!(
        (s.inline_copies, s.parallel_copies, s.worker_bytes),
        (2, 0, 0)
    );
}

#[test]
fn drop_joins_every_worker() {
    let pool = mock_pool(3, 4096, 0);
    assert!(wait_until(Duration::from_secs(10), || pool
        .worker_tids()
        .len()
        == 3));
    let tids = pool.worker_tids();
    let live = pool.live_counter();
    assert_eq!(live.load(std::sync::atomic::Ordering::SeqCst), 3);
    let data = pattern(100_000, 5);
    assert_eq!(pool.copy_in(&data).len(), 25);
    drop(pool);
    // Drop returned only after joining: nothing runs any more.
    assert_eq!(live.load(std::sync::atomic::Ordering::SeqCst), 0);
    // A join returns once the kernel has cleared the thread's id (at the start of its exit),
    // a moment before the thread's /proc entry goes: wait (bounded) for that.
    for (_, tid) in tids {
        assert!(
            wait_until(Duration::from_secs(10), || thread_state(tid).is_none()),
            "worker thread {tid} still exists"
        );
    }
}

#[test]
fn idle_workers_sleep() {
    let pool = mock_pool(2, 4096, 0);
    let data = pattern(1 << 20, 6);
    for _ in 0..5 {
        let chunks = pool.copy_in(&data);
        let mut back = vec![0; data.len()];
        pool.copy_out(&chunks, &mut back);
    }
    assert!(wait_until(Duration::from_secs(10), || pool
        .worker_tids()
        .len()
        == 2));
    let tids = pool.worker_tids();
    // A spinning worker stays runnable ('R'); a blocked one sleeps ('S').
    assert!(
        wait_until(Duration::from_secs(10), || tids
            .iter()
            .all(|&(_, t)| thread_state(t) == Some('S'))),
        "workers did not go to sleep: {:?}",
        tids.iter()
            .map(|&(_, t)| thread_state(t))
            .collect::<Vec<_>>()
    );
}

/// On the real machine: hwloc's placement, and each worker pinned to its core.
#[test]
fn real_topology_workers_are_pinned_where_placed() {
    let pool = CopyWorkerPool::new(CopyConfig {
        workers: 2,
        chunk_size: 4096,
        small_copy_threshold: 0,
        pin: true,
        ..CopyConfig::default()
    })
    .expect("pool starts");
    let cores = pool.placement().cores.clone();
    assert_eq!(cores.len(), 2);
    let node = pool.placement().app_node;
    assert!(cores
        .iter()
        .all(|&c| pool.topology().node_of(c) == Some(node)));
    assert!(wait_until(Duration::from_secs(10), || pool
        .worker_tids()
        .len()
        == 2));
    assert_eq!(pool.stats().pin_failures, 0);
    for (index, tid) in pool.worker_tids() {
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
            .expect("worker status");
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list")
            .trim()
            .to_string();
        assert_eq!(allowed, cores[index].to_string(), "worker {index}");
    }
    let data = pattern(300_000, 8);
    let chunks = pool.copy_in(&data);
    let mut back = vec![0; data.len()];
    pool.copy_out(&chunks, &mut back);
    assert_eq!(back, data);
}

#[test]
fn zero_chunk_size_is_rejected() {
    let err = CopyWorkerPool::new(CopyConfig {
        chunk_size: 0,
        ..CopyConfig::default()
    })
    .expect_err("chunk_size 0");
    assert!(matches!(err, CopyError::ZeroChunkSize));
}

#[test]
fn pool_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<CopyWorkerPool>();
}

/// The scheduler's copy-worker decision is followed: every piece after the application
/// thread's goes to the worker the picker names, or stays with the application thread
/// when it declines; the workers' queued bytes are what the picker sees, and return to 0.
#[test]
fn a_picker_places_each_piece_on_the_worker_it_names() {
    let pool = mock_pool(2, 1024, 0);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    pool.set_picker(Box::new(move |request, workers| {
        log.lock().unwrap().push((request.len, workers.to_vec()));
        Some(netsched::CopyWorkerId(1))
    }));
    let data = pattern(30 * 1024, 9);
    let chunks = pool.copy_in(&data);
    let mut back = vec![0u8; data.len()];
    assert_eq!(pool.copy_out(&chunks, &mut back), data.len());
    assert_eq!(back, data);
    let s = pool.stats();
    // Three pieces per copy (2 workers + the application thread): two picked per copy.
    assert_eq!(s.parallel_copies, 2);
    assert_eq!(s.picked_pieces, 4);
    assert_eq!(s.declined_pieces, 0);
    let by_worker = pool.copied_by_worker();
    assert_eq!(by_worker[0], 0, "worker 0 was never named");
    assert_eq!(by_worker[1], s.worker_bytes);
    assert_eq!(s.worker_bytes + s.app_bytes, 2 * data.len() as u64);
    // The second piece of a copy is picked while the first waits on worker 1.
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4);
    assert_eq!(seen[0].1[1].queued_bytes, 0);
    assert_eq!(seen[1].1[1].queued_bytes, seen[0].0 as u64);
    assert!(pool.worker_stats().iter().all(|w| w.queued_bytes == 0));
}

#[test]
fn a_picker_that_declines_leaves_the_copy_to_the_application_thread() {
    let pool = mock_pool(2, 1024, 0);
    pool.set_picker(Box::new(|_, _| None));
    let data = pattern(30 * 1024, 4);
    let chunks = pool.copy_in(&data);
    assert_eq!(chunks.concat(), data);
    let s = pool.stats();
    assert_eq!(s.declined_pieces, 2);
    assert_eq!(s.worker_bytes, 0);
    assert_eq!(s.app_bytes, data.len() as u64);
}
