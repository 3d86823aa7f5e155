//! The scheduler as a stack uses it: a user policy placing chunks on in-memory stacks,
//! the richer per-channel statistics it decides from, `Diagnostics::stats` and
//! `Diagnostics::scheduler_plan`.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netsched::{
    ChannelClass, ChannelId, ChannelStats, ChunkInfo, NetScheduler, PlanAction, StackSnapshot,
    Steering,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use vns::stack::{MemNetwork, Stack};
use vns::AppClass;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const LIMIT: Duration = Duration::from_secs(30);

/// Every chunk on the highest-numbered channel of its class; records what it was shown.
#[derive(Default)]
struct HighestChannel {
    seen: Arc<Mutex<Vec<ChannelStats>>>,
    planned_over: Arc<Mutex<Option<StackSnapshot>>>,
}

impl NetScheduler for HighestChannel {
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
        self.seen.lock().unwrap().extend_from_slice(channels);
        channels
            .iter()
            .filter(|c| c.class == chunk.class.channel_class())
            .map(|c| c.id)
            .max()
    }

    fn plan(&mut self, snapshot: &StackSnapshot) -> Vec<PlanAction> {
        *self.planned_over.lock().unwrap() = Some(snapshot.clone());
        snapshot
            .peers()
            .into_iter()
            .map(|peer| PlanAction::OpenChannel {
                peer,
                class: ChannelClass::Throughput,
            })
            .collect()
    }
}

fn addr(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddrV4::new(ip, port).into()
}

#[tokio::test]
async fn a_user_policy_places_every_chunk_and_stats_show_it() {
    let net = MemNetwork::new();
    let policy = HighestChannel::default();
    let (seen, planned_over) = (policy.seen.clone(), policy.planned_over.clone());
    // Plans shown, not carried out: this policy always wants one more channel.
    let a = Stack::builder()
        .ipv4(A)
        .channels(3)
        .scheduler(policy)
        .execute_plans(false)
        .build_in_memory(&net)
        .unwrap();
    let b = Stack::builder()
        .ipv4(B)
        .channels(3)
        .build_in_memory(&net)
        .unwrap();
    let listener = b.bind(addr(B, 7000)).await.unwrap();
    let mut client = timeout(LIMIT, a.connect(addr(B, 7000)))
        .await
        .unwrap()
        .unwrap();
    let (mut server, _) = timeout(LIMIT, listener.accept()).await.unwrap().unwrap();

    let data = vec![0x5a; 1 << 20];
    let write = async {
        client.write_all(&data).await?;
        client.shutdown().await
    };
    let mut got = Vec::new();
    let (written, read) = timeout(LIMIT, async {
        tokio::join!(write, server.read_to_end(&mut got))
    })
    .await
    .unwrap();
    written.unwrap();
    assert_eq!(read.unwrap(), data.len());

    let stats = a.diagnostics().stats();
    let bulk: Vec<_> = stats
        .channels
        .iter()
        .filter(|c| c.class == ChannelClass::Throughput)
        .collect();
    assert_eq!(bulk.len(), 3);
    assert_eq!(
        stats.channels.len(),
        4,
        "3 throughput + 1 latency: {stats:?}"
    );
    let chosen = bulk.iter().map(|c| c.id).max().unwrap();
    for c in &bulk {
        if c.id == chosen {
            assert!(c.sent_bytes >= data.len() as u64, "{c:?}");
        } else {
            // Only the channel's 8-byte class preamble: the policy never picked it.
            assert!(c.sent_bytes <= 8, "{c:?}");
        }
    }
    // The policy saw the same statistics, peer included, at its decisions.
    let seen = seen.lock().unwrap();
    assert!(seen.iter().any(|c| c.id == chosen && c.sent_bytes > 0));
    let peer = stats.channels[0].peer;
    assert!(seen.iter().all(|c| c.peer == peer));
    drop(seen);
    // How each channel's frames reach its queue: A opened them over the in-memory switch,
    // whose ports are no NIC's (no alignment), and B accepted them.
    assert!(
        stats
            .channels
            .iter()
            .all(|c| c.steering == Some(Steering::Forwarded)),
        "{stats:?}"
    );
    let b_stats = b.diagnostics().stats();
    assert_eq!(b_stats.channels.len(), 4);
    assert!(
        b_stats
            .channels
            .iter()
            .all(|c| c.steering == Some(Steering::Accepted)),
        "{b_stats:?}"
    );

    // The socket is listed with its class; the snapshot serialises.
    assert!(stats
        .flows
        .iter()
        .any(|f| f.class == AppClass::Throughput && f.peer == peer));
    let json = serde_json::to_string(&stats).unwrap();
    assert!(json.contains("\"sent_bytes\""), "{json}");
    let back: StackSnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, stats);

    // The plan is computed over the stack's snapshot and handed back, not carried out.
    let plan = a.diagnostics().scheduler_plan();
    assert_eq!(
        plan,
        [PlanAction::OpenChannel {
            peer,
            class: ChannelClass::Throughput
        }]
    );
    let over = planned_over.lock().unwrap().clone().unwrap();
    assert_eq!(over.channels.len(), 4);
    assert_eq!(over.cores, stats.cores);
    assert_eq!(
        a.diagnostics().channel_count(),
        4,
        "plans off: nothing opened"
    );
    assert_eq!(a.diagnostics().plan_counters().plans, 0);
}

#[tokio::test]
async fn copy_workers_and_the_default_plan_appear_in_the_snapshot() {
    let net = MemNetwork::new();
    let a = Stack::builder()
        .ipv4(A)
        .copy_workers(2)
        .build_in_memory(&net)
        .unwrap();
    let stats = a.diagnostics().stats();
    assert_eq!(stats.copy_workers.len(), 2);
    assert!(stats.copy_workers.iter().all(|w| w.queued_bytes == 0));
    assert!(stats.channels.is_empty() && stats.flows.is_empty());
    // RoundRobin plans nothing.
    assert!(a.diagnostics().scheduler_plan().is_empty());
}
