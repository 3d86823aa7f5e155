//! The stack's shards: no lock is shared by every stream.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::mpsc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

use super::{MemNetwork, Stack, VirtualStream};
use netsched::AppClass;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const LIMIT: Duration = Duration::from_secs(10);

fn pair(shards: usize) -> (Stack, Stack) {
    let net = MemNetwork::new();
    let build = |ip| {
        Stack::builder()
            .ipv4(ip)
            .channels(3)
            .shards(shards)
            .build_in_memory(&net)
            .unwrap()
    };
    (build(A), build(B))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `n` connected pairs (client on `a`, server on `b`), with each end's shard.
async fn pairs(a: &Stack, b: &Stack, port: u16, n: usize) -> Vec<(VirtualStream, VirtualStream)> {
    let l = b
        .bind(SocketAddr::V4(SocketAddrV4::new(B, port)))
        .await
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let c = a
            .connect(SocketAddr::V4(SocketAddrV4::new(B, port)))
            .await
            .unwrap();
        let (s, _) = l.accept().await.unwrap();
        out.push((c, s));
    }
    out
}

fn shard(stack: &Stack, s: &VirtualStream) -> usize {
    let sid = s.socket_id().expect("a virtual stream");
    stack.core().shard_of(sid)
}

/// Holds shard `i` of `stack` locked in a thread of its own until the returned sender is
/// dropped.
fn hold_shard(stack: &Stack, i: usize) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let core = stack.core().clone();
    let (locked_tx, locked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let guard = core.lock_shard(i);
        locked_tx.send(()).unwrap();
        // Until the test lets go (the sender dropped).
        let _ = release_rx.recv();
        drop(guard);
    });
    locked_rx.recv().unwrap();
    (release_tx, t)
}

/// Twenty 100-byte messages from `c` to `s`, each echoed back, every byte checked.
async fn round_trips(c: &mut VirtualStream, s: &mut VirtualStream) {
    for k in 0..20u8 {
        c.write_all(&[k; 100]).await.unwrap();
        let mut buf = [0u8; 100];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, [k; 100]);
        s.write_all(&buf).await.unwrap();
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, [k; 100]);
    }
}

#[test]
fn sockets_spread_over_the_shards() {
    let rt = runtime();
    let (a, b) = pair(4);
    // Four, and the latency shard (the stacks have a latency channel).
    assert_eq!((a.diagnostics().shards(), b.diagnostics().shards()), (5, 5));
    assert_eq!(
        (
            a.diagnostics().latency_shard(),
            b.diagnostics().latency_shard()
        ),
        (Some(4), Some(4))
    );
    rt.block_on(async {
        let ps = pairs(&a, &b, 7600, 32).await;
        let mut seen_a = [0usize; 5];
        let mut seen_b = [0usize; 5];
        for (c, s) in &ps {
            seen_a[shard(&a, c)] += 1;
            seen_b[shard(&b, s)] += 1;
        }
        // Connects go round robin; accepted sockets follow their ports; none of these
        // throughput-class streams is in the latency shard.
        assert_eq!(seen_a, [8, 8, 8, 8, 0], "client sockets per shard");
        assert_eq!(seen_b[4], 0, "{seen_b:?}");
        assert!(seen_b.iter().filter(|&&n| n > 0).count() >= 2, "{seen_b:?}");
    });
}

/// The point of the shards: while one shard's lock is held (a long call on one of its
/// streams, say), streams of the other shards still exchange bytes, both ways, on both
/// stacks. With one stack-wide lock this exchange would wait for the holder (checked:
/// with every shard's lock taken through shard 0's, this test fails).
#[test]
fn streams_of_other_shards_run_while_one_shard_is_held() {
    let rt = runtime();
    let (a, b) = pair(4);
    // Quiet first, every stream kept open: a chunk of a shard-0 socket still on its way
    // (a FIN of a dropped stream, say) would hold its channel's receive side behind the
    // held shard (a channel's chunks are taken in order), which is not what this tests.
    let mut ps = rt.block_on(async {
        let ps = pairs(&a, &b, 7601, 24).await;
        timeout(LIMIT, a.drained()).await.unwrap();
        timeout(LIMIT, b.drained()).await.unwrap();
        ps
    });
    // A pair whose ends are in shards we do not hold: hold shard 0 of both stacks and use
    // a pair outside it on both sides.
    let at = ps
        .iter()
        .position(|(c, s)| shard(&a, c) != 0 && shard(&b, s) != 0)
        .expect("a pair outside shard 0 on both stacks");
    let (mut c, mut s) = ps.swap_remove(at);
    let (ra, ta) = hold_shard(&a, 0);
    let (rb, tb) = hold_shard(&b, 0);
    // The exchange runs on the runtime; this thread only watches the clock (a task
    // blocked on a lock would stop the runtime's own timers too).
    let (done_tx, done_rx) = mpsc::channel();
    rt.spawn(async move {
        for round in 0..50u32 {
            let msg = round.to_be_bytes().repeat(64);
            c.write_all(&msg).await.unwrap();
            let mut got = vec![0u8; msg.len()];
            s.read_exact(&mut got).await.unwrap();
            assert_eq!(got, msg);
            s.write_all(&got).await.unwrap();
            c.read_exact(&mut got).await.unwrap();
            assert_eq!(got, msg);
        }
        done_tx.send(()).unwrap();
    });
    let finished = done_rx.recv_timeout(LIMIT);
    // Let go of the shards before judging, so that a failure unwinds cleanly.
    drop((ra, rb));
    ta.join().unwrap();
    tb.join().unwrap();
    assert!(
        finished.is_ok(),
        "an exchange in other shards waited for the held one"
    );
    drop(ps);
}

/// One backlog for all shards: once `backlog` connections wait, whichever shards they
/// went to, further SYNCs are dropped (their clients wait and retry), and one accept lets
/// exactly one of them in.
#[test]
fn the_backlog_is_one_for_all_shards() {
    let rt = runtime();
    let (a, b) = pair(8);
    rt.block_on(async {
        let at = SocketAddr::V4(SocketAddrV4::new(B, 7602));
        let l = b.bind_with_backlog(at, 3).await.unwrap();
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(a.connect(at).await.unwrap());
        }
        let waiting: Vec<_> = (0..5)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move { a.connect(at).await })
            })
            .collect();
        timeout(LIMIT, async {
            while b.diagnostics().endpoint_counters().backlog_full_syncs < 5 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the five SYNCs never met the full backlog");
        assert!(waiting.iter().all(|w| !w.is_finished()));
        assert_eq!(b.diagnostics().endpoint_counters().refused_syncs, 0);
        let (_s, _) = l.accept().await.unwrap();
        // Room for exactly one more: one of the waiting clients gets in.
        timeout(LIMIT, async {
            while !waiting.iter().any(|w| w.is_finished()) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("no waiting client got in after an accept");
        let done: Vec<_> = waiting.iter().filter(|w| w.is_finished()).collect();
        assert_eq!(done.len(), 1, "one accept made room for one connection");
        for w in &waiting {
            w.abort();
        }
    });
}

/// A scheduler that cannot be forked keeps the stack on one shard.
#[test]
fn a_scheduler_without_fork_keeps_one_shard() {
    #[derive(Debug)]
    struct First;
    impl netsched::NetScheduler for First {
        fn pick_channel(
            &mut self,
            _: &netsched::ChunkInfo,
            c: &[netsched::ChannelStats],
        ) -> Option<netsched::ChannelId> {
            c.first().map(|c| c.id)
        }
    }
    let net = MemNetwork::new();
    let s = Stack::builder()
        .ipv4(A)
        .shards(4)
        .scheduler(First)
        .build_in_memory(&net)
        .unwrap();
    assert_eq!(
        (s.diagnostics().shards(), s.diagnostics().latency_shard()),
        (1, None)
    );
    let s = Stack::builder()
        .ipv4(B)
        .shards(4)
        .build_in_memory(&net)
        .unwrap();
    assert_eq!(
        (s.diagnostics().shards(), s.diagnostics().latency_shard()),
        (5, Some(4))
    );
}

/// A latency-class stream connected as such (`VirtualSocket::set_app_class` before the
/// connect) lives in the latency shard on both stacks, apart from every bulk stream, so
/// that its calls never wait for a bulk stream's shard lock: with every other shard of
/// both stacks held, it still exchanges bytes both ways. One whose class changes after
/// the connect stays where it was.
#[test]
fn a_latency_stream_connected_as_such_has_the_latency_shard_to_itself() {
    let rt = runtime();
    let (a, b) = pair(2);
    let (l_a, l_b) = (
        a.diagnostics().latency_shard().unwrap(),
        b.diagnostics().latency_shard().unwrap(),
    );
    let (mut lat_c, mut lat_s, bulk, late) = rt.block_on(async {
        let bulk = pairs(&a, &b, 7602, 8).await;
        let l = b.bind(SocketAddr::from((B, 7603))).await.unwrap();
        let socket = a.socket();
        socket.set_app_class(AppClass::Latency).unwrap();
        assert_eq!(socket.app_class().unwrap(), AppClass::Latency);
        let c = timeout(LIMIT, socket.connect(SocketAddr::from((B, 7603))))
            .await
            .unwrap()
            .unwrap();
        let (s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
        // Classed after the connect: where round robin put it.
        let late_c = timeout(LIMIT, a.connect(SocketAddr::from((B, 7603))))
            .await
            .unwrap()
            .unwrap();
        late_c.set_app_class(AppClass::Latency).unwrap();
        let (late_s, _) = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
        timeout(LIMIT, a.drained()).await.unwrap();
        timeout(LIMIT, b.drained()).await.unwrap();
        (c, s, bulk, (late_c, late_s))
    });
    assert_eq!(lat_c.app_class(), AppClass::Latency);
    assert_eq!((shard(&a, &lat_c), shard(&b, &lat_s)), (l_a, l_b));
    assert_eq!(lat_c.shard(), Some(l_a));
    let local = lat_c.local_addr().unwrap().port();
    let (lo, hi) =
        crate::ShardOf::latency_ports_in(crate::Config::default().ephemeral_ports).unwrap();
    assert!((lo..=hi).contains(&local), "{local} outside {lo}..={hi}");
    for (c, s) in &bulk {
        assert_ne!(shard(&a, c), l_a);
        assert_ne!(shard(&b, s), l_b);
    }
    assert_ne!(shard(&a, &late.0), l_a);
    // Every other shard of both stacks held: the latency stream still runs.
    let held: Vec<_> = (0..a.diagnostics().shards())
        .filter(|&i| i != l_a)
        .map(|i| hold_shard(&a, i))
        .chain(
            (0..b.diagnostics().shards())
                .filter(|&i| i != l_b)
                .map(|i| hold_shard(&b, i)),
        )
        .collect();
    rt.block_on(async {
        timeout(LIMIT, round_trips(&mut lat_c, &mut lat_s))
            .await
            .expect("the latency stream waited for a bulk shard");
    });
    for (release, t) in held {
        drop(release);
        t.join().unwrap();
    }
    drop((bulk, late));
}
