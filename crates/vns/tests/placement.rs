//! Where a stack drives its NIC queues, over the in-memory network (no privileges): the
//! default placement follows the host's shape, `Isolating` puts the latency queues on a
//! latency application's runtime, and a queue driven on an application's runtime
//! survives a task that blocks that runtime's worker.
//!
//! The bound for the last: a queue's work that waits longer than netdriver's
//! `placement::STALL` (20 ms) for its runtime is moved, at the watchdog's next look
//! (every `placement::WATCH_TICK`, 10 ms), to the stack's own home runtime; so other
//! tasks' sockets on those channels wait about 30 ms behind a blocked worker, not as
//! long as the block. The test blocks a worker for 200 ms and allows 120 ms (the rest is
//! room for a loaded 2-core machine), and then sees the queues go back once the
//! runtime has been free for `placement::RETURN_AFTER`.
//!
//! Also: a placement set through `configure_channels` is kept, queues are not sent back
//! to an application runtime that is gone, and a plan's pin never lands on the home
//! runtime that a rescued queue visits.

mod common;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netdriver::channel::placement::{RETURN_AFTER, STALL, WATCH_TICK};
use netdriver::channel::{DriverPlace, Placement};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use vns::stack::{MemNetwork, Stack, APPLICATION_RUNTIME, LATENCY_RUNTIME};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 7, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 7, 2);
const PORT: u16 = 7400;

fn addr(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddrV4::new(ip, port).into()
}

fn runtime(workers: usize, name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Echoes every stream accepted on `addr` of `stack`, from tasks of `rt`.
fn echo_server(stack: &Stack, rt: &tokio::runtime::Runtime, addr: SocketAddr) {
    let l = rt.block_on(stack.bind(addr)).expect("bind");
    rt.spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
}

/// One 64-byte echo over `s`: how long it took.
async fn round_trip(s: &mut vns::VirtualStream) -> Option<Duration> {
    let t = Instant::now();
    let echo = async {
        s.write_all(&[7u8; 64]).await.expect("write");
        let mut buf = [0u8; 64];
        s.read_exact(&mut buf).await.expect("read");
        assert_eq!(buf, [7u8; 64]);
    };
    tokio::time::timeout(Duration::from_secs(10), echo)
        .await
        .ok()?;
    Some(t.elapsed())
}

/// The queues of `stack` on runtime `place`.
fn queues_on(stack: &Stack, place: &DriverPlace) -> Vec<u32> {
    stack
        .diagnostics()
        .channel_placement()
        .runtime(place)
        .map(|r| r.queues.clone())
        .unwrap_or_default()
}

/// A task that blocks the only worker of the runtime driving stack A's queues for
/// 200 ms delays round trips of a task on another runtime, over those queues, by at most
/// the rescue bound; the queues go back to the application's runtime once it is free.
#[test]
fn a_blocked_application_worker_delays_other_tasks_by_the_rescue_bound_only() {
    const BLOCK: Duration = Duration::from_millis(200);
    const BOUND: Duration = Duration::from_millis(120);
    assert!(STALL + WATCH_TICK < BOUND && BOUND < BLOCK);
    let net = MemNetwork::new();
    // The application: one worker, which drives A's queues and runs the blocking task.
    let app = runtime(1, "app");
    let other = runtime(1, "other");
    let b_rt = runtime(1, "b-app");
    let a = Stack::builder()
        .ipv4(A)
        .channels(2)
        .scheduler(common::OnApplication::default())
        .runtime(app.handle().clone())
        .build_in_memory(&net)
        .expect("stack A");
    let b = Stack::builder()
        .ipv4(B)
        .channels(2)
        .application_runtime(false)
        .build_in_memory(&net)
        .expect("stack B");
    let app_place = DriverPlace::External(APPLICATION_RUNTIME.into());
    assert_eq!(queues_on(&a, &app_place).len(), net.queues());
    echo_server(&b, &b_rt, addr(B, PORT));
    let blocked = Arc::new(AtomicBool::new(false));
    let (worst, rescues) = other.block_on({
        let (a, app_handle, blocked) = (a.clone(), app.handle().clone(), blocked.clone());
        let b2 = b.clone();
        async move {
            let mut s = a.connect(addr(B, PORT)).await.expect("connect");
            let stuck = |a: &Stack, i: usize| -> ! {
                panic!(
                    "round trip {i} never completed; A: {} {:?}\nA channels {:#?}\nB channels {:#?} {:?}\nA wire {:#?}\nB wire {:#?}",
                    a.diagnostics().channel_placement(),
                    a.diagnostics().queue_stats(),
                    a.diagnostics().stats().channels,
                    b2.diagnostics().stats().channels,
                    b2.diagnostics().queue_stats(),
                    a.diagnostics().channel_wire(),
                    b2.diagnostics().channel_wire(),
                )
            };
            for i in 0..20 {
                if round_trip(&mut s).await.is_none() {
                    stuck(&a, i);
                }
            }
            // The block: on the application's only worker.
            let (started_tx, started_rx) = tokio::sync::oneshot::channel();
            let blocker = app_handle.spawn({
                let blocked = blocked.clone();
                async move {
                    blocked.store(true, Ordering::Release);
                    let _ = started_tx.send(());
                    std::thread::sleep(BLOCK);
                    blocked.store(false, Ordering::Release);
                }
            });
            started_rx.await.expect("the blocker started");
            let mut worst = Duration::ZERO;
            let mut during = 0;
            while blocked.load(Ordering::Acquire) {
                worst = worst.max(
                    round_trip(&mut s)
                        .await
                        .unwrap_or_else(|| stuck(&a, 100 + during)),
                );
                during += 1;
            }
            blocker.await.expect("blocker");
            assert!(during > 0);
            (worst, a.diagnostics().channel_placement().rescues)
        }
    });
    assert!(
        worst < BOUND,
        "a round trip took {worst:?} while the application's worker was blocked"
    );
    assert!(rescues >= 1, "no queue was rescued");
    eprintln!("worst round trip while the application's worker was blocked: {worst:?}");
    // Once the application's runtime has been free for RETURN_AFTER, the queues are back.
    let deadline = Instant::now() + RETURN_AFTER + Duration::from_secs(5);
    while queues_on(&a, &app_place).len() < net.queues() {
        assert!(
            Instant::now() < deadline,
            "the queues did not go back: {}",
            a.diagnostics().channel_placement()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    a.abort();
    b.abort();
}

/// Built in a multi-thread runtime with the default scheduler, a stack drives its queues
/// on that runtime on a host of fewer than `netsched::DISAGGREGATE_MIN_CORES` cores, and
/// on runtimes of its own otherwise; with `application_runtime(false)`, always on its own.
#[test]
fn the_default_placement_follows_the_host() {
    let app = runtime(2, "app");
    let net = MemNetwork::new();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let a = app
        .block_on(async { Stack::builder().ipv4(A).build_in_memory(&net) })
        .expect("stack A");
    let on_app = queues_on(&a, &DriverPlace::External(APPLICATION_RUNTIME.into()));
    if cores < netsched::DISAGGREGATE_MIN_CORES {
        assert_eq!(
            on_app.len(),
            net.queues(),
            "{}",
            a.diagnostics().channel_placement()
        );
    } else {
        assert!(on_app.is_empty(), "{}", a.diagnostics().channel_placement());
    }
    let b = app
        .block_on(async {
            Stack::builder()
                .ipv4(B)
                .application_runtime(false)
                .build_in_memory(&net)
        })
        .expect("stack B");
    let placement = b.diagnostics().channel_placement();
    for r in &placement.runtimes {
        assert!(
            r.queues.is_empty() || matches!(r.place, DriverPlace::Runtime(_)),
            "{placement}"
        );
    }
    // Both placements carry a stream.
    echo_server(&b, &app, addr(B, PORT + 1));
    app.block_on(async {
        let mut s = a.connect(addr(B, PORT + 1)).await.expect("connect");
        s.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"ping");
    });
    a.abort();
    b.abort();
}

/// Under `Isolating` with a latency application's runtime, the queue of the latency
/// channels is driven there and no other queue is; a latency-class stream works over it.
#[test]
fn isolating_drives_the_latency_queue_on_the_latency_runtime() {
    let app = runtime(1, "app");
    let latency_app = runtime(1, "latency-app");
    let net = MemNetwork::new();
    let build = |ip| {
        Stack::builder()
            .ipv4(ip)
            .channels(1)
            .latency_channels(1)
            .scheduler(netsched::Isolating::default())
            .runtime(app.handle().clone())
            .latency_runtime(latency_app.handle().clone())
            .build_in_memory(&net)
            .expect("stack")
    };
    let (a, b) = (build(A), build(B));
    let latency = DriverPlace::External(LATENCY_RUNTIME.into());
    for s in [&a, &b] {
        let q = queues_on(s, &latency);
        assert_eq!(q.len(), 1, "{}", s.diagnostics().channel_placement());
        assert!(
            s.diagnostics()
                .channel_placement()
                .runtimes
                .iter()
                .filter(|r| r.place != latency)
                .all(|r| !r.queues.contains(&q[0])),
            "{}",
            s.diagnostics().channel_placement()
        );
    }
    echo_server(&b, &latency_app, addr(B, PORT + 2));
    latency_app.block_on(async {
        let socket = a.socket();
        socket
            .set_app_class(vns::AppClass::Latency)
            .expect("latency class");
        let mut s = socket.connect(addr(B, PORT + 2)).await.expect("connect");
        // In the latency shard, whose channels are the latency channels.
        assert_eq!(s.shard(), a.diagnostics().latency_shard());
        for i in 0..50u8 {
            s.write_all(&[i; 100]).await.expect("write");
            let mut buf = [0u8; 100];
            s.read_exact(&mut buf).await.expect("read");
            assert_eq!(buf, [i; 100]);
        }
    });
    a.abort();
    b.abort();
}

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
    let p = stack.diagnostics().channel_placement();
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
    let p = other.diagnostics().channel_placement();
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
    let p = a.diagnostics().channel_placement();
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
    let rescues = a.diagnostics().channel_placement().rescues;
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
    let p = a.diagnostics().channel_placement();
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
        let asked = a.diagnostics().plan_counters().plans;
        timeout(LIMIT, a.plans_reach(asked + 3)).await.unwrap();
        assert_eq!(
            a.diagnostics().plan_counters().pinned,
            0,
            "{:?}",
            a.diagnostics().plan_counters()
        );
        assert!(
            a.diagnostics().plan_counters().refused > 0,
            "{:?}",
            a.diagnostics().plan_counters()
        );

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
            let p = a.diagnostics().channel_placement();
            if let Some(r) = p.runtime(&home).filter(|r| !r.queues.is_empty()) {
                break r.queues.clone();
            }
            assert!(Instant::now() < deadline, "no rescue: {p}");
        };
        let asked = a.diagnostics().plan_counters().plans;
        timeout(LIMIT, a.plans_reach(asked + 3)).await.unwrap();
        let p = a.diagnostics().channel_placement();
        blocked.store(false, Ordering::SeqCst);
        timeout(LIMIT, blocker).await.unwrap().unwrap();
        println!(
            "rescued {rescued:?}; {p}; {:?}",
            a.diagnostics().plan_counters()
        );
        assert_eq!(
            p.runtime(&home).and_then(|r| r.core),
            None,
            "the home runtime pinned for a rescued queue: {p}"
        );
        assert_eq!(
            a.diagnostics().plan_counters().pinned,
            0,
            "{:?}",
            a.diagnostics().plan_counters()
        );
        assert!(p.runtime(&application).is_some(), "{p}");
        c.shutdown().await.unwrap();
        timeout(LIMIT, server).await.unwrap().unwrap();
    });
}
