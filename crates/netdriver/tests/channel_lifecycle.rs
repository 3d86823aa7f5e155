//! Starting and stopping a channel set: shutdown joins the threads, aborts connections
//! (the kernel peer sees a reset), fails channels and listeners with `ShutDown`, and
//! detaches the steering program; a failed start and a plain drop detach it too.
//!
//! Privileged: each test skips without root, and fails instead when
//! `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

mod common;

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use common::{config, program_attached, start, DEADLINE};
use netdriver::channel::{ChannelError, ChannelSet, EnqueueError, XskDrops};
use testbed::{testbed_or_skip, Side, TestBed};

/// Held by the tests that start sets on side A: the thread names they count belong to
/// the whole process, and a set another test starts at the same moment on its own bed
/// names its threads the same way (`nc-neigh-vA`).
static SIDE_A: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Names of this process's threads that start with `prefix`.
fn threads_named(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .filter(|c| c.starts_with(prefix))
        .collect()
}

/// CPU time (user + system, in clock ticks) of this process's threads named `prefix…`.
fn cpu_ticks(prefix: &str) -> u64 {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            if !comm.starts_with(prefix) {
                return None;
            }
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
            let rest = stat.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .sum()
}

#[test]
fn shutdown_joins_threads_aborts_and_detaches() {
    let _side_a = SIDE_A.lock().unwrap_or_else(|e| e.into_inner());
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let b_ip = bed.side(Side::B).ipv4;
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = bed
        .spawn_thread_in(Side::B, move || {
            let l = TcpListener::bind((b_ip, 0)).unwrap();
            ready_tx.send(l.local_addr().unwrap()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            c.set_read_timeout(Some(DEADLINE)).unwrap();
            let mut got = [0u8; 5];
            c.read_exact(&mut got).unwrap();
            // Then wait for what the shutdown does to the connection.
            let end = c.read(&mut [0u8; 16]);
            (got, end.map_err(|e| e.kind()))
        })
        .unwrap();
    let addr = match ready_rx.recv().unwrap() {
        SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let mut cfg = config(&bed, Side::A);
    cfg.placement = netdriver::channel::Placement::Runtimes {
        count: None,
        cores: Some(vec![0]),
    };
    let set = start(&bed, Side::A, cfg);
    assert!(program_attached(&bed, Side::A));
    let mut names = threads_named("nc-q-vA");
    names.sort();
    assert_eq!(names, ["nc-q-vA-0", "nc-q-vA-1"]);
    assert_eq!(threads_named("nc-neigh-vA").len(), 1);
    let listener = set.listen(7100).expect("listen");
    let ch = set.connect(addr).expect("connect");
    ch.enqueue(Bytes::from_static(b"hello")).unwrap();
    ch.flush_blocking(Some(DEADLINE)).unwrap();
    assert_eq!(set.flow_count(), 1);
    // Each queue reports its AF_XDP socket's kernel drop counters: none on a quiet link.
    let queues = set.queue_stats();
    assert_eq!(queues.len(), 2);
    for q in &queues {
        assert_eq!(q.xsk_drops, Some(XskDrops::default()), "{q:?}");
    }

    // The handshake's arrivals got the queues' drivers polled.
    let polls = |set: &ChannelSet| -> u64 { set.queue_stats().iter().map(|q| q.polls).sum() };
    let polled_before = polls(&set);
    assert!(polled_before > 0, "{:?}", set.queue_stats());

    // Idle queue runtimes wait in epoll: over half a second they use (almost) no CPU. A
    // spinning thread would use all of it (about 50 ticks at 100 Hz).
    let before = cpu_ticks("nc-q-vA");
    std::thread::sleep(Duration::from_millis(500));
    let used = cpu_ticks("nc-q-vA") - before;
    assert!(used <= 5, "idle queue runtimes used {used} ticks in 500 ms");
    // And their drivers are polled rarely: for the connection's timers only (and a timer
    // pushed back fires early once). A driver that polled in a loop would count
    // thousands.
    let polled = polls(&set) - polled_before;
    assert!(
        polled <= 50,
        "idle drivers were polled {polled} times in 500 ms"
    );

    set.shutdown().expect("shutdown");

    assert!(threads_named("nc-q-vA").is_empty());
    assert!(threads_named("nc-neigh-vA").is_empty());
    assert!(!program_attached(&bed, Side::A));
    assert!(matches!(ch.dequeue(), Err(ChannelError::ShutDown)));
    assert!(matches!(
        ch.enqueue(Bytes::from_static(b"x")),
        Err(EnqueueError::Closed(ChannelError::ShutDown))
    ));
    assert!(matches!(
        listener.accept_timeout(Duration::from_millis(10)),
        Err(ChannelError::ShutDown)
    ));
    let (got, end) = server.join().unwrap();
    assert_eq!(&got, b"hello");
    assert_eq!(
        end,
        Err(io::ErrorKind::ConnectionReset),
        "the abort reached the peer"
    );
}

#[test]
fn a_failed_start_and_a_drop_detach_the_program() {
    let _side_a = SIDE_A.lock().unwrap_or_else(|e| e.into_inner());
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    // Queue 7 does not exist: the second link fails to bind after the program attached.
    let mut cfg = config(&bed, Side::B);
    cfg.queues = Some(vec![0, 7]);
    let err = bed
        .run_in(Side::B, move || ChannelSet::start(cfg))
        .unwrap()
        .expect_err("queue 7 does not exist");
    assert!(matches!(err, ChannelError::Link(_)), "{err}");
    assert!(!program_attached(&bed, Side::B));

    // Bad configurations fail before anything is attached.
    let mut cfg = config(&bed, Side::B);
    cfg.queues = Some(vec![1, 1]);
    let err = bed
        .run_in(Side::B, move || ChannelSet::start(cfg))
        .unwrap()
        .expect_err("duplicate queue");
    assert!(matches!(err, ChannelError::InvalidConfig(_)), "{err}");

    // A set that is simply dropped detaches too.
    let set = start(&bed, Side::B, config(&bed, Side::B));
    assert!(program_attached(&bed, Side::B));
    drop(set);
    assert!(!program_attached(&bed, Side::B));
}

/// With busy polling configured, data still flows, and a thread stops spinning once its
/// link has been idle for the busy-poll time.
#[test]
fn busy_polling_is_bounded_when_idle() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    // Side B runs the set here: the other tests of this file look at side A's threads.
    let a_ip = bed.side(Side::A).ipv4;
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = bed
        .spawn_thread_in(Side::A, move || {
            let l = TcpListener::bind((a_ip, 0)).unwrap();
            ready_tx.send(l.local_addr().unwrap()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            c.set_read_timeout(Some(DEADLINE)).unwrap();
            common::echo(&mut c).unwrap()
        })
        .unwrap();
    let addr = match ready_rx.recv().unwrap() {
        SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let mut cfg = config(&bed, Side::B);
    cfg.link.busy_poll = Duration::from_millis(20);
    let set = start(&bed, Side::B, cfg);
    let ch = set.connect(addr).expect("connect");
    std::thread::scope(|s| {
        s.spawn(|| common::send_stream(&ch, 9, 1 << 20, 32 * 1024));
        assert_eq!(common::recv_stream(&ch, 9), 1 << 20);
    });
    assert_eq!(server.join().unwrap(), 1 << 20);
    let before = cpu_ticks("nc-chan-vB");
    std::thread::sleep(Duration::from_millis(500));
    let used = cpu_ticks("nc-chan-vB") - before;
    assert!(
        used <= 10,
        "busy-polling threads used {used} ticks in 500 ms idle"
    );
}
