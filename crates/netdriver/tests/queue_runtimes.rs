//! Queue runtimes added, pinned and removed, and queues moved between them (and onto a
//! runtime handed to the set) while channels carry data both ways between two of our
//! channel sets on a 2-queue test bed: every byte arrives once and in order, the
//! connections stay up, and the placement snapshots show each change.
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
    Channel, ChannelError, ChannelPlacement, ChannelSet, ChannelStream, Dequeued, DriverPlace,
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

fn rt(id: u32) -> DriverPlace {
    DriverPlace::Runtime(id)
}

fn busy_of(p: &ChannelPlacement, place: &DriverPlace) -> std::time::Duration {
    p.runtime(place).expect("runtime in the placement").busy
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
/// before the end of the transfer. `app` is a runtime of the test's own, handed to `b`.
fn reshape(
    a: &ChannelSet,
    b: &ChannelSet,
    app: &tokio::runtime::Runtime,
    progress: &AtomicU64,
) -> Vec<u64> {
    let cores = cores();
    let (first, last) = (cores[0], cores[cores.len() - 1]);
    let mut seen = Vec::new();
    let p = a.placement();
    assert_eq!(p.runtimes.len(), 2, "{p}");
    assert_eq!(
        (p.place_of(0), p.place_of(1)),
        (Some(rt(0)), Some(rt(1))),
        "{p}"
    );

    seen.push(after(progress, TOTAL / 16));
    // A runtime of its own for both queues, pinned; the first two are left with none.
    let t = a.add_runtime(Some(first)).expect("add a runtime");
    let p = a.placement();
    assert_eq!(p.runtimes.len(), 3, "{p}");
    assert_eq!(
        p.runtime(&rt(t)).map(|x| (x.queues.clone(), x.core)),
        Some((vec![], Some(first)))
    );
    a.move_queue(0, rt(t)).expect("move queue 0");
    a.move_queue(1, rt(t)).expect("move queue 1");
    let p = a.placement();
    assert_eq!(
        (p.place_of(0), p.place_of(1)),
        (Some(rt(t)), Some(rt(t))),
        "{p}"
    );
    assert_eq!(p.runtime(&rt(0)).map(|x| x.queues.len()), Some(0), "{p}");
    // The new runtime does the work now: its queues' busy time grows with the transfer.
    let busy = busy_of(&p, &rt(t));
    seen.push(after(progress, TOTAL / 4));
    assert!(
        eventually(DEADLINE, || busy_of(&a.placement(), &rt(t)) > busy),
        "runtime {t} ran no rounds: {}",
        a.placement()
    );
    a.pin_runtime(t, last).expect("pin");
    assert_eq!(
        a.placement().runtime(&rt(t)).and_then(|x| x.core),
        Some(last)
    );

    // On the echoing side, queue 1 moves back and forth between its runtimes and the
    // application's.
    let app_place = DriverPlace::External("app".into());
    b.add_external_runtime("app", app.handle().clone());
    for round in 0..9u64 {
        let to = match round % 3 {
            0 => rt(0),
            1 => app_place.clone(),
            _ => rt(1),
        };
        b.move_queue(1, to.clone()).expect("move on b");
        assert_eq!(b.placement().place_of(1), Some(to));
        seen.push(after(progress, TOTAL / 4 + (round + 1) * TOTAL / 64));
    }
    assert_eq!(b.placement().place_of(1), Some(rt(1)));

    // Runtime 1 drives nothing: it goes. Then the added one goes, and its queues go to
    // runtime 0, the home runtime, which cannot be removed.
    a.remove_runtime(1).expect("remove runtime 1");
    let p = a.placement();
    assert!(p.runtime(&rt(1)).is_none(), "{p}");
    seen.push(after(progress, TOTAL * 3 / 4));
    a.remove_runtime(t).expect("remove the added runtime");
    let p = a.placement();
    assert_eq!(p.runtimes.len(), 1, "{p}");
    assert_eq!(
        p.runtime(&rt(0)).map(|x| x.queues.clone()),
        Some(vec![0, 1]),
        "{p}"
    );
    seen.push(progress.load(Ordering::Relaxed));
    assert!(matches!(
        a.remove_runtime(0),
        Err(ChannelError::HomeRuntime(0))
    ));
    seen
}

#[test]
fn runtimes_and_queues_move_under_load_without_losing_a_byte() {
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
    let app = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let seen = std::thread::scope(|s| {
        for (i, ch) in channels.iter().enumerate() {
            let seed = 900 + i as u64;
            let progress = &progress;
            s.spawn(move || send(ch, seed));
            s.spawn(move || assert_eq!(receive(ch, seed, progress), PER_CHANNEL, "channel {i}"));
        }
        reshape(&a, &b, &app, &progress)
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
    assert_eq!(back.place_of(0), Some(rt(0)), "{json}");
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
        a.move_queue(7, rt(0)),
        Err(ChannelError::NoSuchQueue(7))
    ));
    assert!(matches!(
        a.move_queue(0, rt(42)),
        Err(ChannelError::NoSuchRuntime(42))
    ));
    assert!(matches!(
        a.move_queue(0, DriverPlace::External("nobody".into())),
        Err(ChannelError::InvalidConfig(_))
    ));
    assert!(matches!(
        a.pin_runtime(42, 0),
        Err(ChannelError::NoSuchRuntime(42))
    ));
    assert!(matches!(
        a.add_runtime(Some(usize::MAX)),
        Err(ChannelError::CoreNotAllowed(_))
    ));
    assert!(matches!(
        a.pin_runtime(0, usize::MAX),
        Err(ChannelError::CoreNotAllowed(_))
    ));
    // Moving a queue to where it is changes nothing.
    a.move_queue(0, rt(0)).unwrap();
    assert_eq!(a.placement().place_of(0), Some(rt(0)));
    // Removing runtime 1 moves its queue to runtime 0, the home runtime, which stays.
    a.remove_runtime(1).unwrap();
    assert_eq!(
        a.placement().runtime(&rt(0)).map(|t| t.queues.clone()),
        Some(vec![0, 1])
    );
    assert!(matches!(
        a.remove_runtime(0),
        Err(ChannelError::HomeRuntime(0))
    ));
    assert!(matches!(
        a.remove_runtime(1),
        Err(ChannelError::NoSuchRuntime(1))
    ));
    // A killed queue cannot be moved, and is in nobody's list.
    let t = a.add_runtime(None).unwrap();
    a.move_queue(0, rt(t)).unwrap();
    assert!(a.kill_queue(0));
    assert!(!a.kill_queue(0), "killed once");
    let p = a.placement();
    assert_eq!(p.dead, vec![0], "{p}");
    assert_eq!(p.place_of(0), None, "{p}");
    assert!(matches!(
        a.move_queue(0, rt(0)),
        Err(ChannelError::QueueDied)
    ));
    // Queue 1 is still driven: a channel opens on it and carries data.
    let b = start(&bed, Side::B, config(&bed, Side::B));
    let listener = b.listen_channels().expect("listen");
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 9000);
    assert!(matches!(
        a.connect_on(0, target),
        Err(ChannelError::QueueDied)
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

/// Killing every queue leaves the set with nothing to open channels on; it still shuts
/// down cleanly, and a killed queue's channels fail at once on this side.
#[test]
fn killed_queues_fail_their_channels_and_take_no_new_ones() {
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let a = start(&bed, Side::A, config(&bed, Side::A));
    let b = start(&bed, Side::B, config(&bed, Side::B));
    let listener = b.listen_channels().expect("listen");
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 9000);
    let ch = a.connect_on(1, target).expect("connect");
    let _peer = listener.accept_timeout(DEADLINE).expect("accept");
    assert!(a.kill_queue(1));
    assert!(matches!(ch.dequeue(), Err(ChannelError::QueueDied)));
    assert!(a.kill_queue(0));
    assert!(matches!(a.connect(target), Err(ChannelError::QueueDied)));
    let p = a.placement();
    assert_eq!(p.dead, vec![0, 1], "{p}");
    assert!(p.runtimes.iter().all(|r| r.queues.is_empty()), "{p}");
    drop(ch);
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    assert!(!program_attached(&bed, Side::A) && !program_attached(&bed, Side::B));
}

/// A queue placed on a runtime the set does not own, whose only worker then blocks (a
/// task that sleeps on it without yielding), is moved to the set's home runtime by the
/// watchdog within [`STALL`] plus a tick or two, so that its channels keep flowing; it goes
/// back once the worker is free and [`RETURN_AFTER`] has passed.
///
/// [`STALL`]: netdriver::channel::placement::STALL
/// [`RETURN_AFTER`]: netdriver::channel::placement::RETURN_AFTER
#[test]
fn a_blocked_application_runtime_loses_its_queue_to_the_home_runtime() {
    use netdriver::channel::placement::{RETURN_AFTER, STALL, WATCH_TICK};
    let Some(bed) = testbed_or_skip(TestBed::builder().queues(1)) else {
        return;
    };
    let a = start(&bed, Side::A, config(&bed, Side::A));
    let b = start(&bed, Side::B, config(&bed, Side::B));
    let listener = b.listen_channels().expect("listen");
    let target = SocketAddrV4::new(bed.side(Side::B).ipv4, 9000);
    let app = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let app_thread = {
        let (tx, rx) = std::sync::mpsc::channel::<tokio::runtime::Handle>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(app.handle().clone()).unwrap();
            app.block_on(async {
                let _ = stop_rx.await;
            });
        });
        (rx.recv().unwrap(), stop_tx, t)
    };
    let (handle, stop, thread) = app_thread;
    a.add_external_runtime("app", handle.clone());
    let app_place = DriverPlace::External("app".into());
    a.move_queue(0, app_place.clone()).unwrap();
    let ch = a.connect(target).expect("connect");
    let (peer_ch, _) = listener.accept_timeout(DEADLINE).expect("accept");
    let exchange = |msg: &'static [u8]| -> std::time::Duration {
        let t0 = std::time::Instant::now();
        ch.enqueue_blocking(Bytes::from_static(msg), Some(DEADLINE))
            .expect("enqueue");
        match peer_ch.dequeue_blocking(Some(DEADLINE)) {
            Ok(Dequeued::Chunk(c)) => assert_eq!(&c[..], msg),
            other => panic!("{other:?}"),
        }
        t0.elapsed()
    };
    exchange(b"before");
    // The application's only worker blocks for 200 ms.
    let blocked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = blocked.clone();
    handle.spawn(async move {
        flag.store(true, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(200));
    });
    assert!(eventually(DEADLINE, || blocked.load(Ordering::SeqCst)));
    let took = exchange(b"while blocked");
    let bound = STALL + 3 * WATCH_TICK + std::time::Duration::from_millis(20);
    assert!(
        took < bound,
        "an exchange took {took:?} behind a blocked runtime (bound {bound:?}): {}",
        a.placement()
    );
    let p = a.placement();
    assert_eq!(p.rescues, 1, "{p}");
    assert_eq!(p.place_of(0), Some(rt(0)), "{p}");
    // Back on the application's runtime once it is free again.
    assert!(
        eventually(RETURN_AFTER * 3, || a.placement().place_of(0)
            == Some(app_place.clone())),
        "{}",
        a.placement()
    );
    exchange(b"after");
    drop((ch, peer_ch));
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    let _ = stop.send(());
    thread.join().unwrap();
    assert!(!program_attached(&bed, Side::A) && !program_attached(&bed, Side::B));
}
