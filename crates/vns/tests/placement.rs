//! Where a stack's NIC queues are driven, as its builder sets them up, on the in-memory
//! network (the same channel sets and placements as over AF_XDP, no privileges).
#![cfg(target_os = "linux")]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use netdriver::channel::{DriverPlace, Placement};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use vns::stack::{MemNetwork, Stack, APPLICATION_RUNTIME};

const LIMIT: Duration = Duration::from_secs(30);

/// A placement set through `StackBuilder::configure_channels` is the one the channel set
/// starts with: the hook runs after the builder's own settings so that it may override
/// them, and the scheduler's placement is one of those settings. Queue 0 on runtime 1 and
/// queue 1 on runtime 0 is a placement no default makes.
#[test]
fn a_placement_set_by_configure_channels_is_kept() {
    let net = MemNetwork::new().queues_per_host(2);
    let stack = Stack::builder()
        .ipv4("10.0.0.1".parse().unwrap())
        .application_runtime(false)
        .configure_channels(|c| {
            c.placement = Placement::Explicit {
                places: vec![DriverPlace::Runtime(1), DriverPlace::Runtime(0)],
                external: Vec::new(),
                cores: None,
            };
        })
        .build_in_memory(&net)
        .expect("stack");
    let p = stack.channel_placement();
    assert_eq!(
        (p.place_of(0), p.place_of(1)),
        (Some(DriverPlace::Runtime(1)), Some(DriverPlace::Runtime(0))),
        "{p}"
    );
    // A hook that leaves the placement alone gets the scheduler's: without a runtime of
    // the application's, runtimes of the stack's own.
    let other = Stack::builder()
        .ipv4("10.0.0.2".parse().unwrap())
        .configure_channels(|c| c.nodelay = true)
        .build_in_memory(&net)
        .expect("stack");
    let p = other.channel_placement();
    assert!(
        (0..2).all(|q| matches!(p.place_of(q), Some(DriverPlace::Runtime(_)))),
        "{p}"
    );
}

/// The default policy, except that every queue is driven by the application's runtime,
/// whatever the host.
#[derive(Debug, Clone, Default)]
struct OnTheApplicationRuntime(netsched::RoundRobin);

impl netsched::NetScheduler for OnTheApplicationRuntime {
    fn pick_channel(
        &mut self,
        chunk: &netsched::ChunkInfo,
        channels: &[netsched::ChannelStats],
    ) -> Option<netsched::ChannelId> {
        self.0.pick_channel(chunk, channels)
    }

    fn fork(&self) -> Option<Box<dyn netsched::NetScheduler>> {
        Some(Box::new(self.clone()))
    }

    fn place_queues(&self, host: &netsched::QueueHost) -> Vec<netsched::QueuePlace> {
        vec![netsched::QueuePlace::Application; host.queues.len()]
    }
}

/// One 64-byte message each way on `s`, echoed by the peer.
async fn small_exchange(s: &mut vns::stack::VirtualStream, tag: u8) {
    let msg = [tag; 64];
    let mut back = [0u8; 64];
    s.write_all(&msg).await.expect("write");
    s.read_exact(&mut back).await.expect("read the echo");
    assert_eq!(back, msg, "echo of {tag}");
}

/// A stack outlives the application runtime it drives its queues on: once that runtime is
/// gone (dropped while the stack lives on, as a test's runtime under a process-wide
/// default stack), its queues are driven by the stack's home runtime for good. Each is
/// rescued once (its work waited `STALL` for a driver that no longer runs) and is not
/// placed back on a runtime that is gone, where nobody would drive it until the next
/// rescue: a stream over it waits for a rescue once, not every `RETURN_AFTER`.
#[test]
fn queues_are_not_placed_back_on_an_application_runtime_that_is_gone() {
    use netdriver::channel::placement::{RETURN_AFTER, STALL};
    let net = MemNetwork::new().queues_per_host(2);
    let app = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let a = Stack::builder()
        .ipv4("10.0.0.1".parse().unwrap())
        .runtime(app.handle().clone())
        .scheduler(OnTheApplicationRuntime::default())
        .build_in_memory(&net)
        .expect("stack A");
    let b = Stack::builder()
        .ipv4("10.0.0.2".parse().unwrap())
        .application_runtime(false)
        .build_in_memory(&net)
        .expect("stack B");
    let application = DriverPlace::External(APPLICATION_RUNTIME.into());
    let p = a.channel_placement();
    assert_eq!(
        p.runtime(&application).map(|r| r.queues.clone()),
        Some(vec![0, 1]),
        "{p}"
    );
    let at: SocketAddr = "10.0.0.2:7000".parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut c, server) = rt.block_on(async {
        let l = b.bind(at).await.unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let (mut r, mut w) = s.split();
            tokio::io::copy(&mut r, &mut w).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut c = timeout(LIMIT, a.connect(at)).await.unwrap().unwrap();
        small_exchange(&mut c, 0).await;
        (c, server)
    });
    // The application's runtime ends; the stack goes on.
    drop(app);
    let rescues = a.channel_placement().rescues;
    let mut slow = Vec::new();
    let mut exchanges = 0u32;
    rt.block_on(async {
        let start = Instant::now();
        while start.elapsed() < 3 * RETURN_AFTER {
            let t0 = Instant::now();
            timeout(LIMIT, small_exchange(&mut c, (exchanges % 251) as u8))
                .await
                .expect("an exchange stalled");
            if t0.elapsed() >= STALL {
                slow.push((t0 - start, t0.elapsed()));
            }
            exchanges += 1;
        }
        c.shutdown().await.unwrap();
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
    let p = a.channel_placement();
    println!("{exchanges} exchanges; slow ones (start, time): {slow:?}; {p}");
    assert!(
        p.runtime(&application).is_none_or(|r| r.queues.is_empty()),
        "a queue placed on a runtime that is gone: {p}"
    );
    assert!(
        p.rescues - rescues <= 2,
        "{} rescues of 2 queues in {:?} after the runtime was gone (slow exchanges {slow:?}): {p}",
        p.rescues - rescues,
        3 * RETURN_AFTER
    );
}

/// A policy whose queues are all driven by the application's runtime and whose every plan
/// (each 10 ms) asks to pin each channel's runtime to the first core the stack may use.
#[derive(Debug, Clone, Default)]
struct PinEveryChannel(netsched::RoundRobin);

impl netsched::NetScheduler for PinEveryChannel {
    fn pick_channel(
        &mut self,
        chunk: &netsched::ChunkInfo,
        channels: &[netsched::ChannelStats],
    ) -> Option<netsched::ChannelId> {
        self.0.pick_channel(chunk, channels)
    }

    fn plan(&mut self, snapshot: &netsched::StackSnapshot) -> Vec<netsched::PlanAction> {
        let Some(&core) = snapshot.cores.first() else {
            return Vec::new();
        };
        snapshot
            .channels
            .iter()
            .map(|c| netsched::PlanAction::Pin {
                channel: c.id,
                core,
            })
            .collect()
    }

    fn plan_period(&self) -> Duration {
        Duration::from_millis(10)
    }

    fn fork(&self) -> Option<Box<dyn netsched::NetScheduler>> {
        Some(Box::new(self.clone()))
    }

    fn place_queues(&self, host: &netsched::QueueHost) -> Vec<netsched::QueuePlace> {
        vec![netsched::QueuePlace::Application; host.queues.len()]
    }
}

/// A plan's `Pin` leaves a queue placed on the application's runtime alone (that runtime
/// is not the stack's to pin), also while the watchdog has rescued the queue to the
/// stack's home runtime because the application blocked its worker: the home runtime,
/// which hosts the control task and every rescued queue, is not pinned on behalf of a
/// queue that is only passing through.
#[test]
fn plans_do_not_pin_the_home_runtime_for_a_rescued_queue() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let net = MemNetwork::new().queues_per_host(2);
    let app = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let a = Stack::builder()
        .ipv4("10.0.0.1".parse().unwrap())
        .runtime(app.handle().clone())
        .latency_channels(0)
        .scheduler(PinEveryChannel::default())
        .build_in_memory(&net)
        .expect("stack A");
    let b = Stack::builder()
        .ipv4("10.0.0.2".parse().unwrap())
        .latency_channels(0)
        .application_runtime(false)
        .build_in_memory(&net)
        .expect("stack B");
    let application = DriverPlace::External(APPLICATION_RUNTIME.into());
    let home = DriverPlace::Runtime(0);
    let at: SocketAddr = "10.0.0.2:7000".parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let l = b.bind(at).await.unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let (mut r, mut w) = s.split();
            tokio::io::copy(&mut r, &mut w).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut c = timeout(LIMIT, a.connect(at)).await.unwrap().unwrap();
        small_exchange(&mut c, 0).await;
        // Plans with the channels there: their queues are on the application's runtime,
        // so every pin is refused.
        let asked = a.plan_counters().plans;
        timeout(LIMIT, a.plans_reach(asked + 3)).await.unwrap();
        assert_eq!(a.plan_counters().pinned, 0, "{:?}", a.plan_counters());
        assert!(a.plan_counters().refused > 0, "{:?}", a.plan_counters());

        // The application blocks its only worker while the stream goes on: the queue the
        // echoes arrive on is rescued to the home runtime.
        let blocked = Arc::new(AtomicBool::new(true));
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let blocker = {
            let blocked = blocked.clone();
            app.spawn(async move {
                let _ = started_tx.send(());
                // Until the test has seen its plans over the rescued queue (bounded).
                let end = Instant::now() + Duration::from_secs(5);
                while blocked.load(Ordering::SeqCst) && Instant::now() < end {
                    std::thread::yield_now();
                }
            })
        };
        started.await.unwrap();
        let mut tag = 1u8;
        let deadline = Instant::now() + LIMIT;
        let rescued = loop {
            small_exchange(&mut c, tag).await;
            tag = tag.wrapping_add(1);
            let p = a.channel_placement();
            if let Some(r) = p.runtime(&home).filter(|r| !r.queues.is_empty()) {
                break r.queues.clone();
            }
            assert!(Instant::now() < deadline, "no rescue: {p}");
        };
        let asked = a.plan_counters().plans;
        timeout(LIMIT, a.plans_reach(asked + 3)).await.unwrap();
        let p = a.channel_placement();
        blocked.store(false, Ordering::SeqCst);
        timeout(LIMIT, blocker).await.unwrap().unwrap();
        println!("rescued {rescued:?}; {p}; {:?}", a.plan_counters());
        assert_eq!(
            p.runtime(&home).and_then(|r| r.core),
            None,
            "the home runtime pinned for a rescued queue: {p}"
        );
        assert_eq!(a.plan_counters().pinned, 0, "{:?}", a.plan_counters());
        assert!(p.runtime(&application).is_some(), "{p}");
        c.shutdown().await.unwrap();
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
}
