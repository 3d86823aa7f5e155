//! Run-time channel scaling: the stack carries out its scheduler's plans,
//! opening channels to a peer and retiring them, under load, without losing, duplicating
//! or reordering a byte. Over the in-memory network; `tests/vns_xdp.rs` repeats it on the
//! AF_XDP bed.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use netsched::{
    ChannelClass, ChannelId, ChannelStats, ChunkInfo, NetScheduler, PlanAction, StackSnapshot,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use vns::stack::{MemNetwork, Stack};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const LIMIT: Duration = Duration::from_secs(60);

/// A user's policy: round robin over the offered channels, and as many throughput
/// channels to each peer as `target` says (opening one, or closing the newest, per plan).
#[derive(Debug)]
struct FollowTarget {
    target: Arc<AtomicUsize>,
    next: usize,
}

impl NetScheduler for FollowTarget {
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
        let fit: Vec<_> = channels
            .iter()
            .filter(|c| c.class == chunk.class.channel_class())
            .collect();
        self.next = self.next.wrapping_add(1);
        fit.get(self.next % fit.len().max(1)).map(|c| c.id)
    }

    fn plan(&mut self, snapshot: &StackSnapshot) -> Vec<PlanAction> {
        let want = self.target.load(Ordering::Relaxed);
        let mut actions = Vec::new();
        for peer in snapshot.peers() {
            let mut ours: Vec<_> = snapshot
                .channels_to(peer)
                .filter(|c| c.class == ChannelClass::Throughput)
                .map(|c| c.id)
                .collect();
            ours.sort();
            if ours.len() < want {
                actions.push(PlanAction::OpenChannel {
                    peer,
                    class: ChannelClass::Throughput,
                });
            } else if ours.len() > want {
                let channel = *ours.last().expect("more than the target");
                actions.push(PlanAction::CloseChannel { channel });
            }
        }
        actions
    }

    fn plan_period(&self) -> Duration {
        Duration::from_millis(5)
    }
}

fn pattern(tag: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8 ^ tag as u8)
        .collect()
}

/// Waits (woken by the stack's control task, bounded) until `a` holds `n` channels.
async fn channels_become(a: &Stack, n: usize) {
    timeout(LIMIT, a.channels_reach(n))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "never reached {n} channels (at {})",
                a.diagnostics().channel_count()
            )
        });
}

/// Stack A with `FollowTarget` (starting at `target` channels) and stack B, one
/// throughput channel each and no latency channel, over one in-memory network.
fn one_channel_pair(target: usize) -> (MemNetwork, Arc<AtomicUsize>, Stack, Stack) {
    let net = MemNetwork::new();
    let target = Arc::new(AtomicUsize::new(target));
    let one = |ip| Stack::builder().ipv4(ip).channels(1).latency_channels(0);
    let a = one(A)
        .scheduler(FollowTarget {
            target: target.clone(),
            next: 0,
        })
        .build_in_memory(&net)
        .unwrap();
    let b = one(B).build_in_memory(&net).unwrap();
    (net, target, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_scale_channels_1_to_4_to_1_under_load_losing_nothing() {
    let (_net, target, a, b) = one_channel_pair(1);
    let at = |port| SocketAddr::from(SocketAddrV4::new(B, port));
    const BIG: usize = 8 << 20;
    const SMALL: u32 = 16;
    const PER: usize = 64 * 1024;
    let big_l = b.bind(at(7800)).await.unwrap();
    let small_l = b.bind_with_backlog(at(7801), SMALL as usize).await.unwrap();
    let mut c = a.connect(at(7800)).await.unwrap();
    let (mut s, _) = big_l.accept().await.unwrap();
    assert_eq!(a.diagnostics().channel_count(), 1);
    let echo = tokio::spawn(async move {
        let mut tasks = Vec::new();
        for _ in 0..SMALL {
            let (mut s, _) = small_l.accept().await.unwrap();
            tasks.push(tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                tokio::io::copy(&mut r, &mut w).await.unwrap();
                w.shutdown().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let small: Vec<_> = (0..SMALL)
        .map(|i| {
            let a = a.clone();
            tokio::spawn(async move {
                let c = a.connect(at(7801)).await.unwrap();
                let (mut r, mut w) = c.into_split();
                let data = pattern(100 + i, PER);
                let sent = data.clone();
                let send = async move {
                    for piece in sent.chunks(PER / 16) {
                        w.write_all(piece).await.unwrap();
                        tokio::task::yield_now().await;
                    }
                    w.shutdown().await.unwrap();
                };
                let recv = async move {
                    let mut got = Vec::new();
                    r.read_to_end(&mut got).await.unwrap();
                    got
                };
                let (_, got) = tokio::join!(send, recv);
                assert!(got == data, "small stream {i}: {} bytes", got.len());
            })
        })
        .collect();
    let big = pattern(7, BIG);
    let sent = big.clone();
    let writer = tokio::spawn(async move {
        for piece in sent.chunks(100_003) {
            c.write_all(piece).await.unwrap();
        }
        c.shutdown().await.unwrap();
        c
    });
    // The reader drives the scaling: up to 4 channels at a quarter of the stream, back
    // to 1 at a half, while every stream is moving.
    let mut got = Vec::with_capacity(BIG);
    let mut buf = vec![0u8; 64 * 1024];
    let mut phase = 0;
    let a2 = a.clone();
    timeout(LIMIT, async {
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            if phase == 0 && got.len() >= BIG / 4 {
                target.store(4, Ordering::Relaxed);
                phase = 1;
            } else if phase == 1 && a2.diagnostics().channel_count() == 4 {
                target.store(1, Ordering::Relaxed);
                phase = 2;
            }
        }
    })
    .await
    .expect("the large stream stalled while channels scaled");
    assert!(got == big, "the large stream differs ({} bytes)", got.len());
    assert!(phase >= 1, "the scaling never started");
    if phase == 1 {
        // The stream finished before the fourth channel came: finish the round trip.
        channels_become(&a, 4).await;
        target.store(1, Ordering::Relaxed);
    }
    channels_become(&a, 1).await;
    timeout(LIMIT, writer).await.unwrap().unwrap();
    timeout(LIMIT, async {
        for t in small {
            t.await.unwrap();
        }
        echo.await.unwrap();
    })
    .await
    .expect("small streams stalled while channels scaled");
    let pc = a.diagnostics().plan_counters();
    assert!(
        pc.opened >= 3 && pc.retired >= 3 && pc.closed >= 3,
        "{pc:?}"
    );
    assert_eq!(pc.open_failed, 0, "{pc:?}");
    // The peer followed: its channels are ours.
    channels_become(&b, 1).await;
    println!(
        "plan counters: {pc:?}; resent {} chunks",
        a.diagnostics().endpoint_counters().resent_chunks
    );
}

/// A plan cannot retire a peer's last channel, and actions on channels that do not exist
/// are refused, not carried out; with plans off, nothing is done at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_never_retire_the_last_channel() {
    let (net, target, a, b) = one_channel_pair(0);
    let at = SocketAddr::from(SocketAddrV4::new(B, 7810));
    let l = b.bind(at).await.unwrap();
    let mut c = a.connect(at).await.unwrap();
    let (mut s, _) = l.accept().await.unwrap();
    // Target 0: every plan since the channel exists asks to close it, and is refused.
    let asked = a.diagnostics().plan_counters().plans;
    timeout(LIMIT, a.plans_reach(asked + 3))
        .await
        .expect("the plans were never asked for");
    assert!(
        a.diagnostics().plan_counters().refused >= 3,
        "{:?}",
        a.diagnostics().plan_counters()
    );
    assert_eq!(a.diagnostics().channel_count(), 1);
    assert_eq!(a.diagnostics().plan_counters().retired, 0);
    c.write_all(b"still here").await.unwrap();
    let mut buf = [0u8; 10];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"still here");

    let off = Stack::builder()
        .ipv4(Ipv4Addr::new(10, 0, 0, 3))
        .execute_plans(false)
        .scheduler(FollowTarget { target, next: 0 })
        .build_in_memory(&net)
        .unwrap();
    let _c = off.connect(at).await.unwrap();
    assert_eq!(off.diagnostics().plan_counters().plans, 0);
}

/// A policy that wants a queue runtime spawned, a queue moved and a runtime retired at
/// every plan, whatever the snapshot says.
#[derive(Debug, Default)]
struct WantsThreads {
    next: usize,
}

impl NetScheduler for WantsThreads {
    fn pick_channel(&mut self, _chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
        self.next = self.next.wrapping_add(1);
        channels
            .get(self.next % channels.len().max(1))
            .map(|c| c.id)
    }

    fn plan(&mut self, _snapshot: &StackSnapshot) -> Vec<PlanAction> {
        vec![
            PlanAction::SpawnThread { core: 0 },
            PlanAction::AssignQueue {
                queue: 0,
                thread: netsched::ChannelThreadId(0),
            },
            PlanAction::RetireThread {
                thread: netsched::ChannelThreadId(0),
            },
        ]
    }

    fn plan_period(&self) -> Duration {
        Duration::from_millis(5)
    }
}

/// The runtime actions reach an in-memory stack's queue runtimes as an AF_XDP stack's:
/// a runtime is spawned on core 0 (once: it is there at the next plan), queue 0 moves to
/// the home runtime (once), and retiring the home runtime is refused at every plan; the
/// streams carry on throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_actions_reach_an_in_memory_stacks_queue_runtimes() {
    let net = MemNetwork::new();
    let a = Stack::builder()
        .ipv4(A)
        .scheduler(WantsThreads::default())
        .build_in_memory(&net)
        .unwrap();
    let b = Stack::builder().ipv4(B).build_in_memory(&net).unwrap();
    let at = SocketAddr::from(SocketAddrV4::new(B, 7810));
    let l = b.bind(at).await.unwrap();
    let mut c = a.connect(at).await.unwrap();
    let (mut s, _) = l.accept().await.unwrap();
    timeout(LIMIT, a.plans_reach(3)).await.expect("plans");
    let data = pattern(5, 256 * 1024);
    let (w, r) = tokio::join!(c.write_all(&data), async {
        let mut got = vec![0u8; data.len()];
        s.read_exact(&mut got).await.map(|_| got)
    });
    w.unwrap();
    assert!(r.unwrap() == data);
    let pc = a.diagnostics().plan_counters();
    assert!(pc.plans >= 3, "{pc:?}");
    assert_eq!(
        (pc.threads_spawned, pc.queues_moved, pc.threads_retired),
        (1, 1, 0),
        "{pc:?}"
    );
    assert_eq!(
        pc.refused, pc.plans,
        "one retirement refused per plan: {pc:?}"
    );
    let placement = a.diagnostics().channel_placement();
    assert_eq!(
        placement.place_of(0),
        Some(netdriver::channel::DriverPlace::Runtime(0)),
        "{placement}"
    );
    let stats = a.diagnostics().stats();
    assert!(
        stats.queues.iter().any(|q| q.queue == 0 && q.thread.0 == 0),
        "{stats:?}"
    );
}
