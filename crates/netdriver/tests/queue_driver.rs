//! The queue driver over the in-memory switch, without privileges: the same driver, TCP
//! and interfaces as over AF_XDP, with every queue of both hosts driven by the test's
//! own runtime ([`Placement::ExternalOnly`]). Under tokio's paused time every TCP timer
//! runs on the paused clock, so what a test sees does not depend on the machine's load:
//! rounds run until the queue settles and then nothing runs until a timer or a frame is
//! due, a poll is bounded by the work limiter, a lost segment comes back by a timer alone,
//! and enqueues made while the driver waits for its turn wake it once.
//!
//! Two tests run on real runtimes, because they are about runtimes: a queue moved back
//! and forth between two runtimes while bytes flow (every byte once, in order), and a
//! runtime that stops under its queue (the set's own runtime takes the queue over).

use std::future::poll_fn;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use netdriver::channel::{
    Channel, ChannelSet, ChannelSetConfig, ChannelStream, DriverPlace, Placement, RxFlow, RxSink,
    ROUNDS_PER_POLL,
};
use netdriver::link::switch::{SimSwitch, SwitchConfig, SwitchPort};
use netdriver::link::Link;
use netdriver::netif::{ConnHandle, Interface, InterfaceConfig};
use netdriver::rss::{ChannelSteering, ForwardReason, RssState, SteeringCounts};
use netdriver::time::Instant;
use std::io::{Read, Write};

const A: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
const PORT: u16 = 7000;

/// A host of `switch` with `queues` queues, all driven by the calling runtime.
fn host_here(switch: &SimSwitch, ip: Ipv4Addr, queues: usize) -> ChannelSet {
    let mut cfg = ChannelSetConfig::new("mem", ip);
    cfg.placement = Placement::ExternalOnly {
        name: "test".into(),
        handle: tokio::runtime::Handle::current(),
    };
    ChannelSet::start_on_switch(cfg, switch, queues).expect("host on the switch")
}

/// A channel from `a` to `b`'s listener on [`PORT`], and its accepted end.
async fn pair(a: &ChannelSet, b: &ChannelSet) -> (Channel, Channel) {
    let l = b.listen_async(PORT).await.expect("listen");
    let c = a
        .connect_async(SocketAddrV4::new(B, PORT))
        .await
        .expect("connect");
    let s = poll_fn(|cx| l.poll_accept(cx)).await.expect("accept");
    (c, s)
}

/// Reads `n` bytes from `ch`.
async fn read_n(ch: &Channel, n: usize) -> Vec<u8> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        let chunk = poll_fn(|cx| ch.poll_dequeue(cx))
            .await
            .expect("dequeue")
            .expect("bytes before the end");
        got.extend_from_slice(&chunk);
    }
    got
}

/// Pending once after waking itself: the task goes to the back of the runtime's run
/// queue, behind tasks woken before it (unlike `yield_now`, which waits for the
/// runtime's next look at its timers and I/O).
async fn requeue() {
    let mut woke = false;
    poll_fn(|cx| {
        if woke {
            Poll::Ready(())
        } else {
            woke = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

fn polls(set: &ChannelSet) -> u64 {
    set.queue_stats().iter().map(|q| q.polls).sum()
}

fn wakeups(set: &ChannelSet) -> u64 {
    set.queue_stats().iter().map(|q| q.wakeups).sum()
}

/// A message exchange ends with both drivers settled: a minute of paused time afterwards
/// costs a handful of polls (the delayed ACK and loss-probe timers the exchange armed),
/// not one per tick, and the clock jumps (nothing kept the runtime busy).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn rounds_run_until_settled_then_the_driver_sleeps() {
    let switch = SimSwitch::default();
    let (a, b) = (host_here(&switch, A, 1), host_here(&switch, B, 1));
    let (c, s) = pair(&a, &b).await;
    for i in 0..10u8 {
        c.enqueue(Bytes::from(vec![i; 100])).expect("enqueue");
        assert_eq!(read_n(&s, 100).await, vec![i; 100]);
        s.enqueue(Bytes::from(vec![i; 100])).expect("enqueue");
        assert_eq!(read_n(&c, 100).await, vec![i; 100]);
    }
    let before = (polls(&a), polls(&b));
    let t0 = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(t0.elapsed(), Duration::from_secs(60));
    let after = (polls(&a), polls(&b));
    let idle_polls = (after.0 - before.0) + (after.1 - before.1);
    assert!(
        idle_polls <= 8,
        "{idle_polls} polls in a minute with nothing to send"
    );
    // Still open and working after the minute.
    c.enqueue(Bytes::from_static(b"again")).expect("enqueue");
    assert_eq!(read_n(&s, 5).await, b"again");
    drop((c, s));
    a.shutdown().expect("shutdown");
    b.shutdown().expect("shutdown");
}

/// The switch's ports are no NIC's queues: a set on it opens channels without RSS
/// alignment (and records so), records accepted ones as accepted, and reports no AF_XDP
/// binding or UMEM for its queues.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_in_memory_set_opens_channels_unaligned_and_has_no_xdp_sockets() {
    let switch = SimSwitch::default();
    let (a, b) = (host_here(&switch, A, 2), host_here(&switch, B, 2));
    let (c, s) = pair(&a, &b).await;
    assert_eq!(a.rss_state(), &RssState::Off);
    assert_eq!(
        c.steering(),
        ChannelSteering::Forwarded {
            reason: ForwardReason::AlignmentOff
        }
    );
    assert_eq!(s.steering(), ChannelSteering::Accepted);
    assert_eq!(
        a.steering_counts(),
        SteeringCounts {
            forwarded: 1,
            ..Default::default()
        }
    );
    assert_eq!(
        b.steering_counts(),
        SteeringCounts {
            accepted: 1,
            ..Default::default()
        }
    );
    for q in a.queue_stats().into_iter().chain(b.queue_stats()) {
        assert_eq!((q.binding, q.umem), (None, None), "queue {}", q.queue);
    }
    drop((c, s));
    a.shutdown().expect("shutdown");
    b.shutdown().expect("shutdown");
}

/// A flood of frames on a queue is taken at most [`ROUNDS_PER_POLL`] rounds of one
/// receive batch per poll: between two polls the runtime's other tasks run (here, the
/// test's watcher, which sees the count of dropped frames grow in steps no larger than a
/// poll's share). Without the limiter one poll would take the whole flood.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_work_limiter_bounds_one_poll() {
    const FLOOD: u64 = 20_000;
    let switch = SimSwitch::new(SwitchConfig {
        port_frames: FLOOD as usize + 1,
        ..SwitchConfig::default()
    });
    let b = host_here(&switch, B, 1);
    let rx_batch = b.config().link.rx_batch as u64;
    // Let the driver set up and settle.
    for _ in 0..4 {
        requeue().await;
    }
    // An attacker on the switch: IPv4 frames to B whose header checksum is wrong (each
    // costs the victim a parse and a counter, nothing more).
    let (amac, mut ports) = switch.attach(A, 1).expect("attach");
    let bmac = switch.mac_of(B).expect("B's MAC");
    let mut frame = vec![0u8; 14 + 40];
    frame[0..6].copy_from_slice(bmac.as_bytes());
    frame[6..12].copy_from_slice(amac.as_bytes());
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut frame[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&40u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 6;
    ip[10..12].copy_from_slice(&[0xde, 0xad]);
    ip[12..16].copy_from_slice(&A.octets());
    ip[16..20].copy_from_slice(&B.octets());
    let port = &mut ports[0];
    for _ in 0..FLOOD {
        assert!(port.send_frame(Instant::from_micros(0), &frame));
    }
    port.flush(Instant::from_micros(0));
    let polls0 = polls(&b);
    let per_poll = ROUNDS_PER_POLL as u64 * rx_batch;
    // Observed from a task (the test's own future is polled only every few dozen tasks).
    let b = Arc::new(b);
    let watcher = {
        let b = b.clone();
        tokio::spawn(async move {
            let mut seen = vec![0u64];
            loop {
                let bad = b.rx_checksum_stats().bad;
                if bad != *seen.last().unwrap() {
                    seen.push(bad);
                }
                if bad >= FLOOD {
                    break;
                }
                requeue().await;
            }
            seen
        })
    };
    let seen = watcher.await.expect("watcher");
    let steps: Vec<u64> = seen.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        steps.iter().all(|&s| s <= per_poll),
        "a poll took more than {per_poll} frames: {steps:?}"
    );
    assert!(
        steps.len() as u64 >= FLOOD / per_poll,
        "the flood went in {} steps: {steps:?}",
        steps.len()
    );
    assert!(polls(&b) - polls0 >= FLOOD / per_poll);
    // Whatever the constant: a flood is never one poll's work.
    assert!(steps.len() >= 5, "the flood went in {} steps", steps.len());
    Arc::into_inner(b)
        .expect("last reference")
        .shutdown()
        .expect("shutdown");
}

/// A segment the receiver drops comes back by a timer alone (the loss probe or the
/// retransmission timeout): nothing else happens on either host, so only the driver's
/// timer can send it. It arrives once, whole, after at least the probe's floor.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_lost_segment_is_resent_by_the_drivers_timer() {
    let switch = SimSwitch::default();
    let (a, b) = (host_here(&switch, A, 1), host_here(&switch, B, 1));
    let (c, s) = pair(&a, &b).await;
    b.drop_received(Some(netdriver::netif::RxDrop {
        from: c.local_addr(),
        skip: 0,
        count: 1,
        seen: 0,
        dropped: 0,
    }));
    let t0 = tokio::time::Instant::now();
    c.enqueue(Bytes::from(vec![7u8; 300])).expect("enqueue");
    let got = tokio::time::timeout(Duration::from_secs(30), read_n(&s, 300))
        .await
        .expect("the lost segment never came back");
    let waited = t0.elapsed();
    assert_eq!(got, vec![7u8; 300]);
    assert_eq!(b.fault_dropped(), 1);
    assert!(
        waited >= a.config().tcp.tlp_min_pto,
        "came back after {waited:?}: before any timer could fire"
    );
    assert!(
        waited < Duration::from_secs(2),
        "came back after {waited:?}"
    );
    assert!(c.stats().retransmitted_segments >= 1);
    // Exactly once: nothing more is received.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(matches!(
        s.dequeue().expect("dequeue"),
        netdriver::channel::Dequeued::Empty
    ));
    drop((c, s));
    a.shutdown().expect("shutdown");
    b.shutdown().expect("shutdown");
}

/// Enqueues made while the driver waits for its turn coalesce into one wake-up, and their
/// bytes arrive in order.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn enqueues_under_load_coalesce_their_wakeups() {
    let switch = SimSwitch::default();
    let (a, b) = (host_here(&switch, A, 1), host_here(&switch, B, 1));
    let (c, s) = pair(&a, &b).await;
    // Let everything settle.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let w0 = wakeups(&a);
    // 1,000 chunks without giving the driver a turn.
    for i in 0..1000u32 {
        c.enqueue(Bytes::copy_from_slice(&i.to_be_bytes()))
            .expect("enqueue");
    }
    let woken = wakeups(&a) - w0;
    assert!(woken <= 1, "{woken} wake-ups for 1,000 enqueues");
    let got = read_n(&s, 4000).await;
    let want: Vec<u8> = (0..1000u32).flat_map(|i| i.to_be_bytes()).collect();
    assert_eq!(got, want);
    drop((c, s));
    a.shutdown().expect("shutdown");
    b.shutdown().expect("shutdown");
}

/// A sink that starts with bytes of its own (as a consumer that read a handshake off the
/// channel keeps what came after it) and records what it is given.
struct RecordingSink {
    kept: Option<Bytes>,
    out: Arc<std::sync::Mutex<Vec<u8>>>,
}

impl RxSink for RecordingSink {
    fn on_bytes(&mut self, bytes: Bytes) -> RxFlow {
        self.out.lock().unwrap().extend_from_slice(&bytes);
        RxFlow::Continue
    }

    fn resume(&mut self) -> RxFlow {
        if let Some(k) = self.kept.take() {
            self.out.lock().unwrap().extend_from_slice(&k);
        }
        RxFlow::Continue
    }

    fn on_end(&mut self, _: Result<(), netdriver::channel::ChannelError>) {}
}

/// A sink installed when nothing more arrives still gets going: the driver resumes it
/// once at installation, so the bytes it was made with go out first, then what the
/// channel's Rx queue held, with no arrival to prompt either.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_sink_installed_after_the_last_arrival_delivers_what_it_kept_first() {
    let switch = SimSwitch::default();
    let (a, b) = (host_here(&switch, A, 1), host_here(&switch, B, 1));
    let (c, s) = pair(&a, &b).await;
    c.enqueue(Bytes::from_static(b"queued")).expect("enqueue");
    // Until the bytes wait in the Rx queue, and the drivers have settled.
    while s.stats().rx_queued < 6 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let out = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = RecordingSink {
        kept: Some(Bytes::from_static(b"kept-")),
        out: out.clone(),
    };
    assert!(s.set_sink(Box::new(sink)).is_ok());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(&out.lock().unwrap()[..], b"kept-queued");
    drop((c, s));
    a.shutdown().expect("shutdown");
    b.shutdown().expect("shutdown");
}

/// Bytes that come with the ACK completing a passive open reach the accepted channel
/// with nothing more arriving: the round that hands the connection to its listener moves
/// them too. (Were accepts taken after the received bytes, the driver would settle with
/// them in TCP's buffer, the peer's data acknowledged and no timer due, and only a later
/// arrival would move them: a kernel client whose request followed its ACK in one receive
/// batch then waited forever for the answer.) The client here is a bare interface on the
/// switch, polled by the test, whose data rides on the handshake's last ACK.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn bytes_that_complete_a_passive_open_reach_the_accepted_channel() {
    const REQUEST: &[u8] = b"with the handshake's last ACK";
    // The ACK and the request leave in one poll; the client is polled no more, so it
    // retransmits nothing.
    let BareSession {
        _switch,
        server: b,
        client: _client,
        accepted: s,
        ..
    } = bare_session(REQUEST).await;
    let got = tokio::time::timeout(Duration::from_secs(1), read_n(&s, REQUEST.len())).await;
    assert_eq!(
        got.as_deref().map_err(|_| "nothing delivered in 1 s"),
        Ok(REQUEST)
    );
    drop(s);
    b.shutdown().expect("shutdown");
}

/// A channel set at B listening on [`PORT`], a [`bare_client`] connected to it (with
/// `early` written before the handshake) and the channel B accepted.
struct BareSession {
    /// Keeps the link between the two.
    _switch: SimSwitch,
    server: ChannelSet,
    client: Interface<SwitchPort>,
    h: ConnHandle,
    accepted: Channel,
    /// The client's clock.
    now: Instant,
}

async fn bare_session(early: &[u8]) -> BareSession {
    let switch = SimSwitch::default();
    let server = host_here(&switch, B, 1);
    let l = server.listen_async(PORT).await.expect("listen");
    let mut now = Instant::from_micros(1);
    let (client, h) = bare_client(&switch, &mut now, early).await;
    let accepted = poll_fn(|cx| l.poll_accept(cx)).await.expect("accept");
    BareSession {
        _switch: switch,
        server,
        client,
        h,
        accepted,
        now,
    }
}

/// A bare interface at A on `switch` (our TCP at its defaults: Nagle, delayed ACKs of
/// 40 ms), its connection to B's [`PORT`] established, polled by the test with a clock of
/// its own that moves 10 µs per look. `early` is written before the handshake, so that it
/// leaves with the handshake's last ACK.
async fn bare_client(
    switch: &SimSwitch,
    now: &mut Instant,
    early: &[u8],
) -> (Interface<SwitchPort>, ConnHandle) {
    let (amac, mut ports) = switch.attach(A, 1).expect("attach");
    let mut client = Interface::new(
        ports.remove(0),
        InterfaceConfig {
            mac: amac,
            ipv4: A,
            ..InterfaceConfig::default()
        },
    );
    client.add_neighbor(B, switch.mac_of(B).expect("B's MAC"));
    let h = client
        .connect(SocketAddrV4::new(B, PORT), *now)
        .expect("connect");
    if !early.is_empty() {
        let conn = client.conn_mut(h).expect("connection");
        assert_eq!(conn.send(early), Ok(early.len()));
    }
    for _ in 0..100 {
        client.poll(*now);
        if client.conn(h).is_some_and(|c| c.state().is_synchronized()) {
            return (client, h);
        }
        requeue().await;
        *now += Duration::from_micros(10);
    }
    panic!("no SYN-ACK");
}

/// Polls `client` (10 µs of its clock per look, the runtime's other tasks run between
/// looks) until `done` says so, at most 2,000 looks; whether it did. The looks keep the
/// runtime busy, so that its paused clock never jumps: no timer of either host fires.
async fn poll_client_until(
    client: &mut Interface<SwitchPort>,
    now: &mut Instant,
    mut done: impl FnMut(&mut Interface<SwitchPort>) -> bool,
) -> bool {
    for _ in 0..2000 {
        client.poll(*now);
        if done(client) {
            return true;
        }
        requeue().await;
        *now += Duration::from_micros(10);
    }
    false
}

/// A request's ACK rides on its answer: the client gets the SYN-ACK and the answer, and no
/// pure ACK between them, from a server whose reader takes the request and answers.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_answer_carries_the_ack_of_the_request() {
    let BareSession {
        _switch,
        server: b,
        mut client,
        h,
        accepted: s,
        mut now,
    } = bare_session(&[]).await;
    let server = tokio::spawn(async move {
        let req = read_n(&s, 64).await;
        s.enqueue(Bytes::from(req.iter().map(|b| !b).collect::<Vec<u8>>()))
            .expect("enqueue the answer");
        s
    });
    let conn = client.conn_mut(h).expect("connection");
    assert_eq!(conn.send(&[5u8; 64]), Ok(64));
    let answered = poll_client_until(&mut client, &mut now, |c| {
        c.conn(h).is_some_and(|c| c.recv_queue() == 64)
    })
    .await;
    assert!(answered, "no answer");
    let segments = client
        .conn(h)
        .expect("connection")
        .stats()
        .segments_received;
    assert_eq!(segments, 2, "the SYN-ACK and the answer, no pure ACK");
    let mut got = [0u8; 64];
    assert_eq!(
        client.conn_mut(h).expect("connection").recv(&mut got),
        Ok(64)
    );
    assert_eq!(got, [!5u8; 64]);
    drop(server.await.expect("server"));
    b.shutdown().expect("shutdown");
}

/// A reader that took the first part of a message and waits for the rest gets it without
/// any timer: the client's Nagle holds the second small part until the first is
/// acknowledged, and the ACK the reply would have carried goes out when the reader waits.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_reader_waiting_for_the_rest_of_a_message_releases_the_held_ack() {
    let BareSession {
        _switch,
        server: b,
        mut client,
        h,
        accepted: s,
        mut now,
    } = bare_session(&[]).await;
    let server = tokio::spawn(async move {
        let first = read_n(&s, 10).await;
        let rest = read_n(&s, 10).await;
        (s, first, rest)
    });
    let conn = client.conn_mut(h).expect("connection");
    assert_eq!(conn.send(b"first part"), Ok(10));
    client.poll(now);
    // Nagle: unacknowledged data in flight and less than a segment to send.
    let conn = client.conn_mut(h).expect("connection");
    assert_eq!(conn.send(b"the rest.."), Ok(10));
    let start = tokio::time::Instant::now();
    let served = poll_client_until(&mut client, &mut now, |_| server.is_finished()).await;
    assert!(served, "the second part never came: its ACK was held");
    assert_eq!(start.elapsed(), Duration::ZERO, "no timer fired");
    let (s, first, rest) = server.await.expect("server");
    assert_eq!(first, b"first part");
    assert_eq!(rest, b"the rest..");
    drop(s);
    b.shutdown().expect("shutdown");
}

/// A sink that takes its bytes in place and pauses after every `pause_every` bytes; it
/// counts what reached it as `Bytes` (which should be nothing) and the slices it was lent.
struct InPlaceSink {
    out: Arc<std::sync::Mutex<Vec<u8>>>,
    as_bytes: Arc<AtomicU64>,
    slices: Arc<AtomicU64>,
    since_resume: usize,
    pause_every: usize,
}

impl RxSink for InPlaceSink {
    fn on_bytes(&mut self, bytes: Bytes) -> RxFlow {
        self.as_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.out.lock().unwrap().extend_from_slice(&bytes);
        RxFlow::Continue
    }

    fn reads_in_place(&self) -> bool {
        true
    }

    fn on_slice(&mut self, bytes: &[u8]) -> RxFlow {
        // Takes every byte it is lent, paused or not (the contract: a second slice of a
        // read that paused is the sink's to keep).
        self.slices.fetch_add(1, Ordering::Relaxed);
        self.out.lock().unwrap().extend_from_slice(bytes);
        self.since_resume += bytes.len();
        if self.since_resume >= self.pause_every {
            RxFlow::Pause
        } else {
            RxFlow::Continue
        }
    }

    fn resume(&mut self) -> RxFlow {
        self.since_resume = 0;
        RxFlow::Continue
    }

    fn on_end(&mut self, _: Result<(), netdriver::channel::ChannelError>) {}
}

/// A sink that reads in place is lent TCP's receive buffer: every byte reaches it once
/// and in order as slices, none as `Bytes` the driver copied first, across the pauses it
/// asks for (each resumed by the consumer) and the ring's wrap-around.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_sink_that_reads_in_place_gets_every_byte_as_lent_slices() {
    const TOTAL: usize = 2 << 20;
    let switch = SimSwitch::default();
    let (a, b) = (host_here(&switch, A, 1), host_here(&switch, B, 1));
    let (c, s) = pair(&a, &b).await;
    let out = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (as_bytes, slices) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sink = InPlaceSink {
        out: out.clone(),
        as_bytes: as_bytes.clone(),
        slices: slices.clone(),
        since_resume: 0,
        pause_every: 100_000,
    };
    assert!(s.set_sink(Box::new(sink)).is_ok());
    let want: Vec<u8> = (0..TOTAL).map(|i| (i % 251) as u8).collect();
    for piece in want.chunks(48 * 1024) {
        c.enqueue(Bytes::copy_from_slice(piece)).expect("enqueue");
    }
    let mut idle = 0;
    while out.lock().unwrap().len() < TOTAL {
        let before = out.lock().unwrap().len();
        s.resume_rx();
        tokio::time::sleep(Duration::from_millis(1)).await;
        idle = if out.lock().unwrap().len() == before {
            idle + 1
        } else {
            0
        };
        assert!(idle < 5_000, "stalled at {before} of {TOTAL} bytes");
    }
    let got = out.lock().unwrap().clone();
    assert_eq!(got.len(), TOTAL);
    assert!(got == want, "bytes out of order or changed");
    assert_eq!(
        as_bytes.load(Ordering::Relaxed),
        0,
        "bytes copied into `Bytes` first"
    );
    // One read lends all that is readable: several pauses' worth of reads at least.
    assert!(slices.load(Ordering::Relaxed) >= 2);
    drop((c, s));
    a.shutdown().expect("shutdown");
    b.shutdown().expect("shutdown");
}

/// A multi-thread runtime with `workers` workers.
fn runtime(workers: usize, name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Writes `total` bytes of a counting pattern through `stream`.
fn write_pattern(mut stream: ChannelStream, total: usize) -> ChannelStream {
    let mut sent = 0usize;
    while sent < total {
        let n = (total - sent).min(16 * 1024);
        let buf: Vec<u8> = (sent..sent + n).map(|i| (i % 251) as u8).collect();
        stream.write_all(&buf).expect("write");
        sent += n;
    }
    stream.flush().expect("flush");
    stream
}

/// Reads `total` bytes from `stream`, checking the pattern: every byte once, in order.
fn read_pattern(stream: &mut ChannelStream, total: usize) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0usize;
    while got < total {
        let n = stream.read(&mut buf).expect("read");
        assert!(n > 0, "end of stream after {got} of {total} bytes");
        for (k, &byte) in buf[..n].iter().enumerate() {
            assert_eq!(byte, ((got + k) % 251) as u8, "byte {}", got + k);
        }
        got += n;
    }
}

/// A host whose queues are driven by runtime `rt` (named "a" in its placement), with the
/// set's own home runtime beside it.
fn host_on(
    switch: &SimSwitch,
    ip: Ipv4Addr,
    queues: usize,
    rt: &tokio::runtime::Runtime,
) -> ChannelSet {
    let mut cfg = ChannelSetConfig::new("mem", ip);
    cfg.placement = Placement::External {
        name: "a".into(),
        handle: rt.handle().clone(),
    };
    ChannelSet::start_on_switch(cfg, switch, queues).expect("host on the switch")
}

/// Both hosts' queues move back and forth between two runtimes every millisecond while
/// 8 MiB flow each way: every byte arrives once and in order.
#[test]
fn a_queue_moved_between_runtimes_while_bytes_flow_loses_nothing() {
    const TOTAL: usize = 8 << 20;
    let (ra, rb) = (runtime(1, "drv-a"), runtime(1, "drv-b"));
    let switch = SimSwitch::default();
    let (a, b) = (host_on(&switch, A, 2, &ra), host_on(&switch, B, 2, &ra));
    for s in [&a, &b] {
        s.add_external_runtime("b", rb.handle().clone());
    }
    let l = b.listen(PORT).expect("listen");
    let c = a.connect(SocketAddrV4::new(B, PORT)).expect("connect");
    let (s, _) = l.accept().expect("accept");
    let queue = c.queue();
    let done = Arc::new(AtomicBool::new(false));
    let moves = Arc::new(AtomicU64::new(0));
    let mover = {
        let (done, moves) = (done.clone(), moves.clone());
        let a_set = Arc::new(a);
        let b_set = Arc::new(b);
        let sets = (a_set.clone(), b_set.clone());
        let t = std::thread::spawn(move || {
            let names = ["a", "b"];
            let mut i = 0usize;
            while !done.load(Ordering::Acquire) {
                i += 1;
                let to = DriverPlace::External(names[i % 2].into());
                for set in [&sets.0, &sets.1] {
                    for q in set.queues() {
                        set.move_queue(q, to.clone()).expect("move");
                    }
                }
                moves.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        (t, a_set, b_set)
    };
    let (cs, mut ss) = (ChannelStream::new(c), ChannelStream::new(s));
    let back = std::thread::spawn(move || {
        read_pattern(&mut ss, TOTAL);
        write_pattern(ss, TOTAL)
    });
    let mut cs = write_pattern(cs, TOTAL);
    read_pattern(&mut cs, TOTAL);
    let _ss = back.join().expect("the other end");
    done.store(true, Ordering::Release);
    let (t, a, b) = mover;
    t.join().expect("mover");
    assert!(
        moves.load(Ordering::Relaxed) >= 10,
        "too few moves to mean anything"
    );
    let stats = a.queue_stats();
    assert!(stats.iter().any(|q| q.queue == queue && q.rounds > 0));
    drop((cs, _ss, l));
    for set in [a, b] {
        Arc::into_inner(set)
            .expect("last reference")
            .shutdown()
            .expect("shutdown");
    }
}

/// The runtime that drives a host's queues stops while a channel is open: the set's own
/// (home) runtime takes the queues over at the watchdog's next look, and the channel
/// goes on, both ways.
#[test]
fn a_runtime_that_stops_leaves_its_queues_to_the_home_runtime() {
    let ra = runtime(1, "drv-a");
    let switch = SimSwitch::default();
    let a = host_on(&switch, A, 1, &ra);
    let mut bcfg = ChannelSetConfig::new("mem", B);
    bcfg.placement = Placement::Runtimes {
        count: Some(1),
        cores: None,
    };
    let b = ChannelSet::start_on_switch(bcfg, &switch, 1).expect("B");
    let l = b.listen(PORT).expect("listen");
    let c = a.connect(SocketAddrV4::new(B, PORT)).expect("connect");
    let (s, _) = l.accept().expect("accept");
    let (mut cs, mut ss) = (ChannelStream::new(c), ChannelStream::new(s));
    let echo = |cs: &mut ChannelStream, ss: &mut ChannelStream, tag: u8| {
        cs.write_all(&[tag; 64]).expect("write");
        cs.flush().expect("flush");
        let mut buf = [0u8; 64];
        ss.read_exact(&mut buf).expect("read");
        assert_eq!(buf, [tag; 64]);
        ss.write_all(&buf).expect("write back");
        ss.flush().expect("flush");
        cs.read_exact(&mut buf).expect("read back");
        assert_eq!(buf, [tag; 64]);
    };
    echo(&mut cs, &mut ss, 1);
    // Placed on "a" (a loaded machine may have had the watchdog move it home for a
    // while: a stall of "a" beyond `STALL`, which is not what this test is about).
    assert!(a
        .placement()
        .runtime(&DriverPlace::External("a".into()))
        .is_some());
    // The runtime stops: its tasks, the queue's driver among them, are dropped.
    ra.shutdown_timeout(Duration::from_secs(5));
    cs.set_read_timeout(Some(Duration::from_secs(10)));
    echo(&mut cs, &mut ss, 2);
    let placement = a.placement();
    assert_eq!(placement.place_of(0), Some(DriverPlace::Runtime(0)));
    assert!(placement.rescues >= 1);
    // It stays home: the stopped runtime is not used again.
    assert!(placement
        .runtime(&DriverPlace::External("a".into()))
        .is_none());
    echo(&mut cs, &mut ss, 3);
    drop((cs, ss, l));
    a.shutdown().expect("shutdown");
    b.shutdown().expect("shutdown");
}

/// The CPUs a thread named `name` of this process may run on, from
/// `/proc/self/task/*/status` (`Cpus_allowed_list`).
fn thread_cpus(name: &str) -> Option<String> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).ok()?;
        return status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|v| v.trim().to_string());
    }
    None
}

/// A set's unpinned queue runtimes run on the CPUs of the NIC's NUMA node (here named in
/// the link configuration, node 0, which every Linux machine has), and the placement says
/// so; a runtime pinned to a core stays on it; with no node they run anywhere.
#[test]
fn queue_runtimes_run_on_the_nics_numa_node() {
    use netdriver::link::umem_memory::NumaNode;
    let node0: Vec<usize> = {
        let list = std::fs::read_to_string("/sys/devices/system/node/node0/cpulist").unwrap();
        let allowed: Vec<usize> = (0..1024)
            .filter(|c| {
                thread_cpus_of_self()
                    .map(|l| cpulist_contains(&l, *c))
                    .unwrap_or(false)
            })
            .collect();
        (0..1024)
            .filter(|c| cpulist_contains(&list, *c) && allowed.contains(c))
            .collect()
    };
    // An address no other test of this binary uses, so that the runtime's thread name
    // (after the address) is this set's alone.
    const NUMA_HOST: Ipv4Addr = Ipv4Addr::new(10, 9, 9, 1);
    let switch = SimSwitch::default();
    let mut cfg = ChannelSetConfig::new("numa0", NUMA_HOST);
    cfg.link.numa_node = NumaNode::Node(0);
    cfg.placement = Placement::Runtimes {
        count: Some(2),
        cores: None,
    };
    let set = ChannelSet::start_on_switch(cfg, &switch, 2).expect("set");
    let placement = set.placement();
    for r in &placement.runtimes {
        assert_eq!(r.core, None);
        assert_eq!(r.cpus.as_deref(), Some(&node0[..]), "{placement}");
    }
    assert!(placement.to_string().contains("on cpus"), "{placement}");
    // The threads themselves are confined (the kernel's view of the first runtime).
    // Named after the set (its address, on a switch), cut to the kernel's 15 bytes.
    let full = format!("nc-q-{NUMA_HOST}-0");
    let name = &full[..full.len().min(15)];
    let allowed = thread_cpus(name).expect("the runtime's thread");
    assert!(
        (0..1024).all(|c| cpulist_contains(&allowed, c) == node0.contains(&c)),
        "{name}: {allowed} against {node0:?}"
    );
    // A runtime pinned to a core reports the core, not the node.
    let id = set.add_runtime(Some(node0[0])).expect("pinned runtime");
    let placement = set.placement();
    let pinned = placement
        .runtime(&DriverPlace::Runtime(id))
        .expect("the new runtime");
    assert_eq!((pinned.core, pinned.cpus.clone()), (Some(node0[0]), None));
    drop(set);
    // No node: anywhere.
    let mut cfg = ChannelSetConfig::new("numa-any", Ipv4Addr::new(10, 9, 9, 2));
    cfg.link.numa_node = NumaNode::Any;
    cfg.placement = Placement::Runtimes {
        count: Some(1),
        cores: None,
    };
    let set = ChannelSet::start_on_switch(cfg, &switch, 1).expect("set");
    assert!(set.placement().runtimes.iter().all(|r| r.cpus.is_none()));
}

/// The calling thread's `Cpus_allowed_list`.
fn thread_cpus_of_self() -> Option<String> {
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
}

/// Whether a kernel CPU list (`0-3,8`) names `cpu`.
fn cpulist_contains(list: &str, cpu: usize) -> bool {
    list.trim()
        .split(',')
        .filter(|p| !p.is_empty())
        .any(|p| match p.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
                (a..=b).contains(&cpu)
            }
            None => p.parse() == Ok(cpu),
        })
}
