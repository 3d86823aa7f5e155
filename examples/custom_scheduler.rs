//! A user-written scheduling policy plugged into a real stack.
//!
//! `SizeSteering` keeps the lowest-numbered throughput channel to each peer as a fast
//! lane for flows of small messages (requests, replies) and spreads bulk flows (any flow
//! that once sent a chunk of 16 KiB or more) round-robin over the other throughput
//! channels, so a bulk transfer never queues in front of a small message. Latency-class
//! sockets keep their own channels, as in every policy.
//!
//! The example runs the same traffic (a bulk flow beside a request/response flow) twice
//! over two in-memory stacks (no privileges), once with the default `RoundRobin` and once
//! with `SizeSteering`, and prints each channel's bytes from `Diagnostics::stats()`: under
//! round-robin the bulk bytes land on every channel, under `SizeSteering` the fast lane
//! carries the small messages only. It exits with an error if the policy did not steer.
//!
//! ```text
//! cargo run --example custom_scheduler
//! ```

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use netchannel::sched::{
    ChannelClass, ChannelId, ChannelStats, ChunkInfo, NetScheduler, PlanAction, StackSnapshot,
};
use netchannel::vns::stack::MemNetwork;
use netchannel::Stack;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A flow that sends a chunk this large is bulk from then on.
const BULK_CHUNK: usize = 16 * 1024;
/// Bytes of the bulk flow.
const BULK_BYTES: usize = 8 << 20;
/// Request/response rounds of the small flow, and the size of each message.
const ROUNDS: usize = 200;
const MESSAGE: usize = 256;
const CHANNELS: usize = 4;

/// Small-message flows on the lowest throughput channel, bulk flows round-robin over the
/// rest.
#[derive(Debug, Default)]
struct SizeSteering {
    /// Flows seen sending a bulk chunk. Even their short chunks (the tail of a write, or
    /// a chunk cut short by the receiver's credit) stay off the fast lane.
    bulk_flows: BTreeSet<u64>,
    /// The bulk channel used last; the next one follows it.
    last_bulk: Option<ChannelId>,
}

impl NetScheduler for SizeSteering {
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
        let class = chunk.class.channel_class();
        let mut ids: Vec<ChannelId> = channels
            .iter()
            .filter(|c| c.class == class)
            .map(|c| c.id)
            .collect();
        ids.sort_unstable();
        let (&fast_lane, rest) = ids.split_first()?;
        if chunk.len >= BULK_CHUNK {
            self.bulk_flows.insert(chunk.flow);
        }
        let bulk = self.bulk_flows.contains(&chunk.flow);
        if class == ChannelClass::Latency || !bulk || rest.is_empty() {
            return Some(fast_lane);
        }
        let next = rest
            .iter()
            .copied()
            .find(|&id| self.last_bulk.is_some_and(|last| id > last))
            .unwrap_or(rest[0]);
        self.last_bulk = Some(next);
        Some(next)
    }

    /// The slow-period hook, used here only to forget flows that are gone; it wants no
    /// change of channels (a policy that returned `PlanAction`s here would have the stack
    /// open, retire or pin channels: see `tests/vns_xdp.rs`, `FollowTarget`).
    fn plan(&mut self, snapshot: &StackSnapshot) -> Vec<PlanAction> {
        let live: BTreeSet<u64> = snapshot.flows.iter().map(|f| f.flow).collect();
        self.bulk_flows.retain(|f| live.contains(f));
        Vec::new()
    }
}

fn addr(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddrV4::new(ip, port).into()
}

/// Runs a bulk flow and a request/response flow from stack A (built with `scheduler`)
/// to stack B; returns A's throughput channels afterwards, in id order.
async fn run(
    scheduler: impl NetScheduler + 'static,
) -> Result<Vec<ChannelStats>, Box<dyn std::error::Error>> {
    let (ip_a, ip_b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    let net = MemNetwork::new();
    let a = Stack::builder()
        .ipv4(ip_a)
        .channels(CHANNELS)
        .scheduler(scheduler)
        .build_in_memory(&net)?;
    let b = Stack::builder()
        .ipv4(ip_b)
        .channels(CHANNELS)
        .build_in_memory(&net)?;
    let listener = b.bind(addr(ip_b, 7000)).await?;

    let mut bulk = a.connect(addr(ip_b, 7000)).await?;
    let (mut bulk_in, _) = listener.accept().await?;
    let mut rpc = a.connect(addr(ip_b, 7000)).await?;
    let (mut rpc_in, _) = listener.accept().await?;

    let sink = tokio::spawn(async move {
        let mut got = Vec::new();
        bulk_in.read_to_end(&mut got).await.map(|_| got.len())
    });
    let echo = tokio::spawn(async move {
        let mut msg = [0u8; MESSAGE];
        for _ in 0..ROUNDS {
            rpc_in.read_exact(&mut msg).await?;
            rpc_in.write_all(&msg).await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let send_bulk = async {
        bulk.write_all(&vec![0xb5; BULK_BYTES]).await?;
        bulk.shutdown().await
    };
    let requests = async {
        let mut reply = [0u8; MESSAGE];
        for i in 0..ROUNDS {
            rpc.write_all(&[i as u8; MESSAGE]).await?;
            rpc.read_exact(&mut reply).await?;
        }
        Ok::<_, std::io::Error>(())
    };
    let (sent, asked) = tokio::join!(send_bulk, requests);
    sent?;
    asked?;
    assert_eq!(sink.await??, BULK_BYTES);
    echo.await??;

    let stats = a.diagnostics().stats();
    println!(
        "  plan the policy would carry out: {:?}",
        a.diagnostics().scheduler_plan()
    );
    let mut channels: Vec<ChannelStats> = stats
        .channels
        .into_iter()
        .filter(|c| c.class == ChannelClass::Throughput)
        .collect();
    channels.sort_by_key(|c| c.id);
    for c in &channels {
        println!(
            "  {:<5} sent {:>9} bytes ({:>5.1} % of the bulk flow's size)",
            c.id.to_string(),
            c.sent_bytes,
            100.0 * c.sent_bytes as f64 / BULK_BYTES as f64
        );
    }
    a.shutdown_graceful(std::time::Duration::from_secs(5))
        .await?;
    Ok(channels)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("RoundRobin (the default):");
    let round_robin = run(netchannel::sched::RoundRobin::default()).await?;
    println!("SizeSteering (user-defined, fast lane = lowest channel):");
    let steered = run(SizeSteering::default()).await?;

    // Round-robin puts bulk bytes on every channel; SizeSteering keeps them off the fast
    // lane, which then carries the small flow's messages, their chunk headers and the
    // connections' control chunks only.
    let small_flow = (ROUNDS * MESSAGE) as u64;
    let bulk_share = BULK_BYTES as u64 / CHANNELS as u64;
    let fast_lane = steered[0].sent_bytes;
    if round_robin[0].sent_bytes < bulk_share / 2 {
        return Err(format!("round-robin left channel {} idle", round_robin[0].id).into());
    }
    if fast_lane >= 2 * small_flow {
        return Err(format!("the fast lane carried {fast_lane} bytes: not steered").into());
    }
    println!(
        "fast lane {}: {} bytes under SizeSteering (small flow ~{} bytes), {} under RoundRobin",
        steered[0].id, fast_lane, small_flow, round_robin[0].sent_bytes
    );
    Ok(())
}
