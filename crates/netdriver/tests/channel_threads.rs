//! Channel threads added, pinned and removed, and queues moved between them, while
//! channels carry data both ways between two of our channel sets on a 2-queue test bed:
//! every byte arrives once and in order, the connections stay up, and the placement
//! snapshots show each change.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

mod common;

use std::io::Write as _;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use common::{config, echo, eventually, fill, program_attached, start, Verifier, DEADLINE};
use netdriver::channel::{
    Channel, ChannelError, ChannelPlacement, ChannelSet, ChannelStream, Dequeued,
};
use testbed::{testbed_or_skip, Side, TestBed};

const CHANNELS: usize = 4;
const PER_CHANNEL: u64 = 8 << 20;
const TOTAL: u64 = PER_CHANNEL * CHANNELS as u64;

/// Sends stream `seed` on `ch`, then closes it.
fn send(ch: &Channel, seed: u64) {
    let mut off = 0;
    while off < PER_CHANNEL {
        let n = (PER_CHANNEL - off).min(32 * 1024) as usize;
        let mut buf = vec![0u8; n];
        fill(seed, off, &mut buf);
        ch.enqueue_blocking(Bytes::from(buf), Some(DEADLINE))
            .unwrap_or_else(|e| panic!("enqueue at {off}: {e}"));
        off += n as u64;
    }
    ch.close();
}

/// Receives the echo of stream `seed` on `ch`, verifying it and counting into `progress`.
fn receive(ch: &Channel, seed: u64, progress: &AtomicU64) -> u64 {
    let mut v = Verifier::new(seed);
    loop {
        match ch.dequeue_blocking(Some(DEADLINE)) {
            Ok(Dequeued::Chunk(c)) => {
                v.check(&c);
                progress.fetch_add(c.len() as u64, Ordering::Relaxed);
            }
            Ok(Dequeued::Finished) => return v.offset(),
            Ok(Dequeued::Empty) => panic!("nothing for {DEADLINE:?} after {} bytes", v.offset()),
            Err(e) => panic!("after {} bytes: {e}", v.offset()),
        }
    }
}

/// Waits until `progress` passes `at` bytes (of [`TOTAL`]) and returns it.
fn after(progress: &AtomicU64, at: u64) -> u64 {
    assert!(
        eventually(DEADLINE, || progress.load(Ordering::Relaxed) >= at),
        "the transfer stalled at {} bytes",
        progress.load(Ordering::Relaxed)
    );
    progress.load(Ordering::Relaxed)
}

fn busy_of(p: &ChannelPlacement, id: u32) -> std::time::Duration {
    p.thread(id).expect("thread in the placement").busy
}

/// The cores this process may run on.
fn cores() -> Vec<usize> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids()
        .expect("affinity mask")
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort_unstable();
    ids
}

/// The changes, made on `a` (the sending side) and `b` (the echoing side) while the
/// transfer runs; returns the progress seen at each step, every one of which must come
/// before the end of the transfer.
fn reshape(a: &ChannelSet, b: &ChannelSet, progress: &AtomicU64) -> Vec<u64> {
    let cores = cores();
    let (first, last) = (cores[0], cores[cores.len() - 1]);
    let mut seen = Vec::new();
    let p = a.placement();
    assert_eq!(p.threads.len(), 2, "{p}");
    assert_eq!((p.thread_of(0), p.thread_of(1)), (Some(0), Some(1)), "{p}");

    seen.push(after(progress, TOTAL / 16));
    // A thread of its own for both queues, pinned; the first two are left with none.
    let t = a.add_thread(Some(first)).expect("add a thread");
    let p = a.placement();
    assert_eq!(p.threads.len(), 3, "{p}");
    assert_eq!(
        p.thread(t).map(|x| (x.queues.clone(), x.core)),
        Some((vec![], Some(first)))
    );
    a.move_queue(0, t).expect("move queue 0");
    a.move_queue(1, t).expect("move queue 1");
    let p = a.placement();
    assert_eq!((p.thread_of(0), p.thread_of(1)), (Some(t), Some(t)), "{p}");
    assert_eq!(p.thread(0).map(|x| x.queues.len()), Some(0), "{p}");
    // The new thread does the work now: its busy time grows with the transfer.
    let busy = busy_of(&p, t);
    seen.push(after(progress, TOTAL / 4));
    assert!(
        eventually(DEADLINE, || busy_of(&a.placement(), t) > busy),
        "thread {t} ran no rounds: {}",
        a.placement()
    );
    a.pin_thread(t, last).expect("pin");
    assert_eq!(a.placement().thread(t).and_then(|x| x.core), Some(last));

    // On the echoing side, queue 1 moves back and forth between the two threads.
    for round in 0..8u64 {
        let to = if round % 2 == 0 { 0 } else { 1 };
        b.move_queue(1, to).expect("move on b");
        assert_eq!(b.placement().thread_of(1), Some(to));
        seen.push(after(progress, TOTAL / 4 + (round + 1) * TOTAL / 64));
    }
    assert_eq!(b.placement().thread_of(1), Some(1));

    // Thread 0 serves nothing: it goes. Then the added one goes, and its queues go to
    // thread 1, the only one left, which cannot be removed.
    a.remove_thread(0).expect("remove thread 0");
    let p = a.placement();
    assert!(p.thread(0).is_none(), "{p}");
    seen.push(after(progress, TOTAL * 3 / 4));
    a.remove_thread(t).expect("remove the added thread");
    let p = a.placement();
    assert_eq!(p.threads.len(), 1, "{p}");
    assert_eq!(
        p.thread(1).map(|x| x.queues.clone()),
        Some(vec![0, 1]),
        "{p}"
    );
    seen.push(progress.load(Ordering::Relaxed));
    assert!(matches!(
        a.remove_thread(1),
        Err(ChannelError::LastThread(1))
    ));
    seen
}

#[test]
fn threads_and_queues_move_under_load_without_losing_a_byte() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = start(&bed, Side::A, config(&bed, Side::A));
    let b = start(&bed, Side::B, config(&bed, Side::B));
    let listener = b.listen_channels().expect("listen");
    let server = std::thread::spawn(move || {
        let echoers: Vec<_> = (0..CHANNELS)
            .map(|_| {
                let (ch, _) = listener.accept_timeout(DEADLINE).expect("accept");
                std::thread::spawn(move || {
                    let mut s = ChannelStream::new(ch);
                    let n = echo(&mut s).expect("echo");
                    s.shutdown_write().unwrap();
                    s.flush().unwrap();
                    n
                })
            })
            .collect();
        echoers
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 9000);
    let channels: Vec<Channel> = (0..CHANNELS)
        .map(|i| a.connect_on((i % 2) as u32, target).expect("connect"))
        .collect();
    let progress = AtomicU64::new(0);
    let seen = std::thread::scope(|s| {
        for (i, ch) in channels.iter().enumerate() {
            let seed = 900 + i as u64;
            let progress = &progress;
            s.spawn(move || send(ch, seed));
            s.spawn(move || assert_eq!(receive(ch, seed, progress), PER_CHANNEL, "channel {i}"));
        }
        reshape(&a, &b, &progress)
    });
    // Every change happened while data was still on its way.
    assert!(seen.iter().all(|&at| at < TOTAL), "{seen:?} of {TOTAL}");
    assert_eq!(progress.load(Ordering::Relaxed), TOTAL);
    let echoed = server.join().unwrap();
    assert_eq!(echoed, vec![PER_CHANNEL; CHANNELS]);
    // Nothing was reset or refused on the way; the placement serialises.
    assert_eq!((a.resets_received(), b.resets_received()), (0, 0));
    let json = serde_json::to_string(&a.placement()).unwrap();
    println!("placement after the changes: {}", a.placement());
    let back: ChannelPlacement = serde_json::from_str(&json).unwrap();
    assert_eq!(back.thread_of(0), Some(1), "{json}");
    drop(channels);
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::A) && !program_attached(&bed, Side::B));
}

#[test]
fn placement_calls_refuse_what_cannot_be() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = start(&bed, Side::A, config(&bed, Side::A));
    assert!(matches!(
        a.move_queue(7, 0),
        Err(ChannelError::NoSuchQueue(7))
    ));
    assert!(matches!(
        a.move_queue(0, 42),
        Err(ChannelError::NoSuchThread(42))
    ));
    assert!(matches!(
        a.pin_thread(42, 0),
        Err(ChannelError::NoSuchThread(42))
    ));
    assert!(matches!(
        a.add_thread(Some(usize::MAX)),
        Err(ChannelError::CoreNotAllowed(_))
    ));
    assert!(matches!(
        a.pin_thread(0, usize::MAX),
        Err(ChannelError::CoreNotAllowed(_))
    ));
    // Moving a queue to where it is changes nothing.
    a.move_queue(0, 0).unwrap();
    assert_eq!(a.placement().thread_of(0), Some(0));
    // Removing thread 0 moves its queue to thread 1; thread 1 is then the last one.
    a.remove_thread(0).unwrap();
    assert_eq!(
        a.placement().thread(1).map(|t| t.queues.clone()),
        Some(vec![0, 1])
    );
    assert!(matches!(
        a.remove_thread(1),
        Err(ChannelError::LastThread(1))
    ));
    assert!(matches!(
        a.remove_thread(0),
        Err(ChannelError::NoSuchThread(0))
    ));
    // A killed thread's queue cannot be moved away (it is dead), nor can queues go to it.
    let t = a.add_thread(None).unwrap();
    a.move_queue(0, t).unwrap();
    assert!(a.kill_queue_thread(0));
    let p = a.placement();
    assert!(p.thread(t).is_some_and(|x| x.dead), "{p}");
    assert!(matches!(a.move_queue(1, t), Err(ChannelError::ThreadDied)));
    assert!(matches!(a.move_queue(0, 1), Err(ChannelError::ThreadDied)));
    // Queue 1 is still served by thread 1: a channel opens on it and carries data.
    let b = start(&bed, Side::B, config(&bed, Side::B));
    let listener = b.listen_channels().expect("listen");
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 9000);
    assert!(matches!(
        a.connect_on(0, target),
        Err(ChannelError::ThreadDied)
    ));
    let ch = a.connect_on(1, target).expect("connect on queue 1");
    let (peer_ch, _) = listener.accept_timeout(DEADLINE).expect("accept");
    ch.enqueue(Bytes::from_static(b"still served"))
        .map_err(|e| e.into_error())
        .unwrap();
    let mut got = Vec::new();
    while got.len() < 12 {
        match peer_ch.dequeue_blocking(Some(DEADLINE)).unwrap() {
            Dequeued::Chunk(c) => got.extend_from_slice(&c),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, b"still served");
    drop((ch, peer_ch));
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::A) && !program_attached(&bed, Side::B));
}

/// A crash takes every queue of the thread with it: a thread given both queues (killed
/// whether or not the handovers have happened yet) leaves the set with no live queue,
/// while the two first threads, now serving nothing, live on; the set still shuts down
/// cleanly.
#[test]
fn killing_a_thread_kills_every_queue_it_serves() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = start(&bed, Side::A, config(&bed, Side::A));
    let t = a.add_thread(None).unwrap();
    a.move_queue(0, t).unwrap();
    a.move_queue(1, t).unwrap();
    assert!(a.kill_queue_thread(1));
    assert!(!a.kill_queue_thread(0), "died with its thread");
    let pollers = a.rx_pollers();
    assert!(
        eventually(DEADLINE, || pollers.iter().all(|p| p.is_dead())),
        "{}",
        a.placement()
    );
    let p = a.placement();
    assert!(p.thread(t).is_some_and(|x| x.dead), "{p}");
    assert!(
        p.threads
            .iter()
            .filter(|x| x.id != t)
            .all(|x| !x.dead && x.queues.is_empty()),
        "{p}"
    );
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 9000);
    assert!(matches!(a.connect(target), Err(ChannelError::ThreadDied)));
    a.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::A));
}

/// A runtime that keeps a queue's receive lease and runs its rounds ([`RxPoller`]) serves
/// the queue alone: the queue's channel thread, woken at each lease's end, runs no round
/// of its own. Before, every inline round left the thread "work pending", so each of those
/// wake-ups ran a round, which under traffic took the frames of an exchange in flight
/// from the runtime and handed them over with a cross-thread wake-up (most of the 4 KB
/// ping-pong's p99 gap to kernel TCP, `docs/performance.md`, fourteenth session).
///
/// [`RxPoller`]: netdriver::channel::RxPoller
#[test]
fn a_leased_queue_is_left_to_the_runtime_that_serves_it() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = start(&bed, Side::A, config(&bed, Side::A));
    let b = start(&bed, Side::B, config(&bed, Side::B));
    let listener = b.listen_channels().expect("listen");
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 9000);
    let q = a.queues()[0];
    let ch = a.connect_on(q, target).expect("connect");
    let (peer_ch, _) = listener.accept_timeout(DEADLINE).expect("accept");
    // One exchange, so that the connection is settled (nothing in flight, no timer due).
    ch.enqueue_blocking(Bytes::from_static(b"ping"), Some(DEADLINE))
        .expect("enqueue");
    assert!(
        matches!(peer_ch.dequeue_blocking(Some(DEADLINE)), Ok(Dequeued::Chunk(c)) if &c[..] == b"ping")
    );
    peer_ch
        .enqueue_blocking(Bytes::from_static(b"pong"), Some(DEADLINE))
        .expect("enqueue the reply");
    assert!(
        matches!(ch.dequeue_blocking(Some(DEADLINE)), Ok(Dequeued::Chunk(c)) if &c[..] == b"pong")
    );

    let poller = a
        .rx_pollers()
        .into_iter()
        .find(|p| p.queue() == q)
        .expect("a poller for the queue");
    let stats = || {
        a.thread_stats()
            .into_iter()
            .find(|s| s.queue == q)
            .expect("the queue's stats")
    };
    let before = stats();
    // The runtime: renews a lease (as long as `vns`'s) and runs the queue's rounds until
    // the thread has woken at a few of the lease's ends.
    const WAKEUPS: u64 = 6;
    let started = std::time::Instant::now();
    let mut now = stats();
    let mut passes = 0u64;
    while now.wakeups - before.wakeups < WAKEUPS {
        poller.lease(std::time::Duration::from_millis(10));
        poller.poll_now();
        passes += 1;
        if passes % 64 == 0 {
            now = stats();
            assert!(
                started.elapsed() < DEADLINE,
                "the thread woke {} times in {DEADLINE:?}",
                now.wakeups - before.wakeups
            );
        }
    }
    let inline = now.inline_rounds - before.inline_rounds;
    let thread = now.thread_rounds - before.thread_rounds;
    assert!(inline > 0, "the runtime ran no round");
    // A timer of the connection that comes due may take one, and so may a lease that ran
    // out while this thread was preempted (the tests of this file run side by side);
    // before, every wake-up took at least one.
    assert!(
        thread <= 2,
        "the channel thread ran {thread} rounds of a queue served under a lease \
         ({} wake-ups, {inline} inline rounds)",
        now.wakeups - before.wakeups
    );
    poller.end_lease();
    drop((ch, peer_ch));
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::A) && !program_attached(&bed, Side::B));
}
