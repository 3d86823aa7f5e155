//! Copy workers wired into the Stack (in-memory network, no privileges): large writes
//! and reads go through the workers and arrive byte-exact, chunk buffers are reused, a
//! stack without workers never uses them, and dropping a stack joins its workers.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use vns::copy::{CopyConfig, CopyStats};
use vns::stack::{MemNetwork, Stack};
use vns::{Config, VirtualStream};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// Bound on any single wait: a hang fails the test instead of blocking CI.
const LIMIT: Duration = Duration::from_secs(60);
const LEN: usize = 32 << 20;
/// Writes and read buffers: well above the small-copy threshold.
const IO: usize = 1 << 20;
const THRESHOLD: usize = 256 * 1024;
const CHANNELS: usize = 4;

/// Socket buffers large enough to hold a copy worth sharing (the defaults, 256 KiB, are
/// below the threshold, so that workers would never copy).
fn vns_config() -> Config {
    Config {
        send_buffer: 2 << 20,
        recv_buffer: 2 << 20,
        credit_window: 4 << 20,
        credit_update_threshold: 512 << 10,
        ..Config::default()
    }
}

fn stacks(workers: usize) -> (Stack, Stack) {
    let net = MemNetwork::new();
    let build = |ip| {
        Stack::builder()
            .ipv4(ip)
            .channels(CHANNELS)
            .vns_config(vns_config())
            .copy_workers(workers)
            .copy_config(CopyConfig {
                small_copy_threshold: THRESHOLD,
                ..CopyConfig::default()
            })
            .build_in_memory(&net)
            .unwrap()
    };
    (build(A), build(B))
}

fn pattern(tag: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ tag.wrapping_mul(0x9e37_79b9)).to_le_bytes()[1])
        .collect()
}

async fn connected(a: &Stack, b: &Stack, port: u16) -> (VirtualStream, VirtualStream) {
    let to: SocketAddr = SocketAddrV4::new(b.ipv4(), port).into();
    let l = b.bind(to).await.unwrap();
    let c = timeout(LIMIT, a.connect(to)).await.unwrap().unwrap();
    let (s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    (c, s)
}

/// Sends `data` in `IO`-byte writes, then shuts down.
async fn send_all(mut w: impl AsyncWriteExt + Unpin, data: Vec<u8>) {
    for part in data.chunks(IO) {
        w.write_all(part).await.unwrap();
    }
    w.shutdown().await.unwrap();
}

/// Reads to end of stream with an `IO`-byte buffer.
async fn recv_all(mut r: impl AsyncReadExt + Unpin) -> Vec<u8> {
    let mut buf = vec![0u8; IO];
    let mut got = Vec::with_capacity(LEN);
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..n]);
    }
}

/// 32 MiB each way at once between `a` and `b`, checked byte for byte.
async fn both_ways(a: &Stack, b: &Stack, port: u16) {
    let (c, s) = connected(a, b, port).await;
    let (up, down) = (pattern(1, LEN), pattern(2, LEN));
    let (cr, cw) = c.into_split();
    let (sr, sw) = s.into_split();
    let tasks = (
        tokio::spawn(send_all(cw, up.clone())),
        tokio::spawn(send_all(sw, down.clone())),
        tokio::spawn(recv_all(sr)),
        tokio::spawn(recv_all(cr)),
    );
    let (w1, w2, got_up, got_down) = timeout(LIMIT, async {
        tokio::join!(tasks.0, tasks.1, tasks.2, tasks.3)
    })
    .await
    .expect("transfer timed out");
    w1.unwrap();
    w2.unwrap();
    let (got_up, got_down) = (got_up.unwrap(), got_down.unwrap());
    assert_eq!(got_up.len(), LEN);
    assert!(got_up == up, "a -> b bytes differ");
    assert_eq!(got_down.len(), LEN);
    assert!(got_down == down, "b -> a bytes differ");
}

/// Writes 3 MiB (less than the credit window, so it all leaves without a read), waits
/// (bounded) until `a` has handed every byte to `b`, then reads it: the first read finds
/// a full buffer's worth readable, so it is copied out by the workers whatever the timing.
async fn read_after_delivery(a: &Stack, b: &Stack, port: u16) {
    const N: usize = 3 << 20;
    let (mut c, mut s) = connected(a, b, port).await;
    let data = pattern(5, N);
    timeout(LIMIT, c.write_all(&data)).await.unwrap().unwrap();
    timeout(LIMIT, a.drained())
        .await
        .expect("not delivered in time");
    assert_eq!(a.pending_tx_bytes(), 0);
    let before = b.diagnostics().copy_stats().parallel_copies_out;
    let mut got = vec![0u8; N];
    let mut buf = vec![0u8; IO];
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(n, IO, "a full read buffer was readable");
    got[..n].copy_from_slice(&buf);
    assert_eq!(b.diagnostics().copy_stats().parallel_copies_out, before + 1);
    timeout(LIMIT, s.read_exact(&mut got[n..]))
        .await
        .unwrap()
        .unwrap();
    assert!(got == data);
}

/// One application thread (a current-thread runtime) for both stacks.
#[tokio::test(flavor = "current_thread")]
async fn large_transfers_go_through_the_copy_workers() {
    let (a, b) = stacks(2);
    read_after_delivery(&a, &b, 7098).await;
    read_after_delivery(&b, &a, 7099).await;
    both_ways(&a, &b, 7100).await;
    let chunk = vns_config().max_chunk_payload;
    for (name, stack) in [("a", &a), ("b", &b)] {
        let s = stack.diagnostics().copy_stats();
        eprintln!("{name}: {s:?}");
        let copies_in = s.parallel_copies - s.parallel_copies_out;
        assert!(
            copies_in > 0,
            "{name}: no write went through the workers: {s:?}"
        );
        assert!(
            s.parallel_copies_out > 0,
            "{name}: no read went through the workers: {s:?}"
        );
        assert!(s.worker_bytes > 0 && s.worker_pieces >= 2 * s.parallel_copies);
        // The default policy's `pick_copy_worker` placed every worker piece.
        assert_eq!(s.picked_pieces, s.worker_pieces, "{name}: {s:?}");
        // No byte is copied twice: each written and read byte once at most (the rest
        // went the plain way), by a worker or by this thread.
        assert!(s.worker_bytes + s.app_bytes <= 2 * (LEN as u64 + (3 << 20)));
        // Chunk buffers are reused: what is allocated is bounded by what can be out at
        // once (a copy filling at most a send buffer's room, the send buffer, and what
        // credit lets into the channels before the peer reads), not by the 32 MiB sent.
        let cfg = vns_config();
        let in_flight = (2 * cfg.send_buffer + cfg.credit_window) / chunk + 8;
        let written_chunks = (copies_in as usize) * (THRESHOLD / chunk);
        assert!(
            s.buffers.allocations <= in_flight as u64,
            "{name}: {} allocations for at most {in_flight} chunks in flight",
            s.buffers.allocations
        );
        assert!(s.buffers.reuses > 0, "{name}: no buffer reused: {s:?}");
        assert!(
            s.buffers.allocations + s.buffers.reuses >= written_chunks as u64,
            "{name}: fewer buffers taken than chunks written"
        );
    }
}

/// Without workers nothing goes through the pool: the plain path copies everything.
#[tokio::test(flavor = "current_thread")]
async fn without_copy_workers_the_plain_path_copies() {
    let (a, b) = stacks(0);
    both_ways(&a, &b, 7101).await;
    assert_eq!(a.copy_workers(), 0);
    assert_eq!(a.diagnostics().copy_stats(), CopyStats::default());
    assert_eq!(b.diagnostics().copy_stats(), CopyStats::default());
    assert!(a.diagnostics().copy_worker_tids().is_empty());
}

/// Whether the OS still lists thread `tid` of this process.
fn thread_exists(tid: u64) -> bool {
    std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
}

/// Dropping the last handle of a stack (its streams included) joins its copy workers.
#[tokio::test(flavor = "current_thread")]
async fn dropping_the_stack_joins_its_copy_workers() {
    let (a, b) = stacks(2);
    let (mut c, mut s) = connected(&a, &b, 7102).await;
    // Put the workers to use first, so they are running threads with work behind them.
    let data = pattern(3, 4 * IO);
    let (_, got) = tokio::join!(c.write_all(&data), async {
        let mut got = vec![0u8; data.len()];
        s.read_exact(&mut got).await.unwrap();
        got
    });
    assert!(got == data);
    assert!(a.diagnostics().copy_stats().parallel_copies > 0);
    let tids = [
        a.diagnostics().copy_worker_tids(),
        b.diagnostics().copy_worker_tids(),
    ]
    .concat();
    assert_eq!(tids.len(), 4, "two started workers per stack");
    for &tid in &tids {
        let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap();
        assert!(comm.starts_with("vns-copy-"), "{tid} is {comm}");
    }
    drop((c, s, a, b));
    // The drop joined them; the kernel may list a joined thread for a moment longer.
    let end = Instant::now() + LIMIT;
    while tids.iter().any(|&t| thread_exists(t)) && Instant::now() < end {
        std::thread::yield_now();
    }
    let left: Vec<_> = tids.iter().filter(|&&t| thread_exists(t)).collect();
    assert!(left.is_empty(), "copy workers still running: {left:?}");
}

/// A stack with copy workers and no explicit `vns_config` gets socket buffers the workers
/// can use with the default threshold (the plain defaults, 256 KiB, are below it): a 1 MiB
/// write is shared with them.
#[tokio::test(flavor = "current_thread")]
async fn copy_workers_without_vns_config_get_buffers_they_can_use() {
    let net = MemNetwork::new();
    let build = |ip| {
        Stack::builder()
            .ipv4(ip)
            .copy_workers(1)
            .build_in_memory(&net)
            .unwrap()
    };
    let (a, b) = (build(A), build(B));
    let (mut c, mut s) = connected(&a, &b, 7103).await;
    let data = pattern(4, 4 * IO);
    let (_, got) = tokio::join!(
        async { timeout(LIMIT, c.write_all(&data)).await.unwrap().unwrap() },
        async {
            let mut got = vec![0u8; data.len()];
            timeout(LIMIT, s.read_exact(&mut got))
                .await
                .unwrap()
                .unwrap();
            got
        }
    );
    assert!(got == data);
    let st = a.diagnostics().copy_stats();
    assert!(
        st.parallel_copies > 0,
        "no write shared with the workers: {st:?}"
    );
    assert!(st.worker_bytes > 0, "{st:?}");
}

/// A user's scheduler decides which copy worker copies what
/// (`NetScheduler::pick_copy_worker`): one that always declines leaves every copy to the
/// application thread, and the bytes still arrive exact.
#[tokio::test(flavor = "current_thread")]
async fn the_schedulers_copy_worker_choice_is_followed() {
    #[derive(Default)]
    struct NoWorkers(netsched::RoundRobin);
    impl netsched::NetScheduler for NoWorkers {
        fn pick_channel(
            &mut self,
            chunk: &netsched::ChunkInfo,
            channels: &[netsched::ChannelStats],
        ) -> Option<netsched::ChannelId> {
            self.0.pick_channel(chunk, channels)
        }
        fn pick_copy_worker(
            &mut self,
            _: &netsched::CopyRequest,
            _: &[netsched::CopyWorkerStats],
        ) -> Option<netsched::CopyWorkerId> {
            None
        }
        fn fork(&self) -> Option<Box<dyn netsched::NetScheduler>> {
            Some(Box::new(NoWorkers::default()))
        }
    }
    let net = MemNetwork::new();
    let build = |ip| {
        Stack::builder()
            .ipv4(ip)
            .channels(CHANNELS)
            .vns_config(vns_config())
            .copy_workers(2)
            .copy_config(CopyConfig {
                small_copy_threshold: THRESHOLD,
                ..CopyConfig::default()
            })
            .scheduler(NoWorkers::default())
            .build_in_memory(&net)
            .unwrap()
    };
    let (a, b) = (build(A), build(B));
    both_ways(&a, &b, 7102).await;
    for (name, stack) in [("a", &a), ("b", &b)] {
        let s = stack.diagnostics().copy_stats();
        assert!(s.parallel_copies > 0, "{name}: no large copy: {s:?}");
        assert!(s.declined_pieces >= 2 * s.parallel_copies, "{name}: {s:?}");
        assert_eq!(s.worker_bytes, 0, "{name}: a worker copied: {s:?}");
        assert!(stack
            .diagnostics()
            .stats()
            .copy_workers
            .iter()
            .all(|w| w.queued_bytes == 0));
    }
}
