//! The driver: one thread per stack that owns the channels' comings and goings and does
//! the work no application call does.
//!
//! The stack's sockets are split over shards (`shard.rs`), each an [`Endpoint`] with the
//! wakers of its tasks behind a lock of its own; the channels (`chan.rs`) are shared by
//! every shard, each direction behind a lock of its own; a control lock ([`Control`])
//! holds what only channel set-up, stopping and statistics need. Application calls
//! (`poll_read`, `poll_write`, ...) lock their socket's shard, call its endpoint and end
//! with [`Core::finish_call`], which moves the call's output into the channels from the
//! calling thread. Readers and blocked writers pull received bytes themselves
//! ([`Core::pull`], holding no shard's lock: it takes each chunk's shard in turn), woken
//! by the channels' receive waker ([`RxSignal`]) beside the driver, so the receive path
//! usually skips the driver's hand-off. The driver, per round: accepts channels and reads
//! their preambles, pulls every channel, moves every shard's output, turns events into
//! task wake-ups, runs timers, and drops the channels a data-path call found dead (the
//! endpoints resend their chunks on the peer's other channels). With nothing to do it
//! parks until a channel waker, an application call or a deadline wakes it: no busy
//! polling.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use netdriver::channel::{ChannelError, ChannelTransport};
use netsched::{ChannelClass, ChannelId};
use tracing::{debug, warn};

use super::auth;
use super::backend::{Acceptor, Backend, BoxedTransport};
use super::chan::{Chan, ChanRxWake, ChanTable, PullMark, Sweep};
use super::shard::{FinishNeeded, Shard, ShardSet, TxLocks, MAX_SHARDS};
use crate::endpoint::{Endpoint, Error as VnsError, PeerId, SocketId};

mod plans;
pub use plans::PlanCounters;

/// The first bytes on every channel a stack opens: magic, version, channel class, a
/// flags byte ([`auth::FLAG_AUTH`]: an authentication exchange follows) and a reserved
/// zero byte. The acceptor reads them before the channel joins the endpoint, so both
/// ends agree on the channel's class (documented in `docs/wire-format.md`).
pub(crate) const PREAMBLE_LEN: usize = 8;
const PREAMBLE_MAGIC: &[u8; 4] = b"NCHN";
const PREAMBLE_VERSION: u8 = 1;

fn class_byte(class: ChannelClass) -> u8 {
    match class {
        ChannelClass::Throughput => 0,
        ChannelClass::Latency => 1,
    }
}

pub(crate) fn preamble(class: ChannelClass, flags: u8) -> [u8; PREAMBLE_LEN] {
    let m = PREAMBLE_MAGIC;
    [
        m[0],
        m[1],
        m[2],
        m[3],
        PREAMBLE_VERSION,
        class_byte(class),
        flags,
        0,
    ]
}

/// The class and the flags byte of a preamble.
pub(crate) fn parse_preamble(b: &[u8]) -> Option<(ChannelClass, u8)> {
    if b.len() < PREAMBLE_LEN || &b[..4] != PREAMBLE_MAGIC || b[4] != PREAMBLE_VERSION {
        return None;
    }
    let class = match b[5] {
        0 => ChannelClass::Throughput,
        1 => ChannelClass::Latency,
        _ => return None,
    };
    Some((class, b[6]))
}

/// Where an accepted channel is in its handshake.
#[derive(Debug)]
enum Stage {
    /// Reading the preamble (and the opener's nonce when it authenticates).
    Preamble,
    /// Our nonce and tag are sent; reading the opener's tag.
    Challenged {
        class: ChannelClass,
        nc: [u8; auth::NONCE_LEN],
        ns: [u8; auth::NONCE_LEN],
    },
}

/// What the bytes an accepted channel has sent so far decide.
enum Verdict {
    /// It joins the endpoint; the first `consumed` bytes were its handshake.
    Join {
        class: ChannelClass,
        consumed: usize,
    },
    /// Our challenge went out: wait for the tag.
    Challenged,
    /// Abort it; `auth` when it failed authentication rather than sent garbage.
    Reject { why: &'static str, auth: bool },
}

/// Wakes a thread parked in [`dequeue_until`].
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// The channel's next bytes, waiting on this thread until `deadline`: `Ok(None)` when
/// the peer closed it, `Err` when it failed or the deadline passed. For helper threads
/// only (it parks the calling thread).
fn dequeue_until(t: &dyn ChannelTransport, deadline: Instant) -> Result<Option<Bytes>, String> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        match t.poll_dequeue(&mut cx) {
            Poll::Ready(Ok(b)) => return Ok(b),
            Poll::Ready(Err(e)) => return Err(e.to_string()),
            Poll::Pending => {
                let now = Instant::now();
                if now >= deadline {
                    return Err("no answer from the peer in time".into());
                }
                std::thread::park_timeout(deadline - now);
            }
        }
    }
}

/// Wakes the driver thread. Used as the waker of every channel and acceptor poll, and by
/// application calls.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    notified: AtomicBool,
    stop: AtomicBool,
    /// The driver sleeps without a timeout (no arrival for [`ACTIVE_WINDOW`]): an arrival
    /// handed to a reader must wake it, since it would not look for an unpaid pull.
    deep: AtomicBool,
    thread: OnceLock<Thread>,
}

impl Signal {
    /// Makes the driver run a round (cheap when it is awake already).
    pub(crate) fn notify(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.notified.store(true, Ordering::Release);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.notify();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.notify();
    }
}

/// The waker channels hold for their received bytes: wakes the task that last waited to
/// read (or to write, for credit), which pulls the bytes from the channels itself
/// ([`Core::pull`]); the driver thread is woken only when no reader waits. So one arrival
/// costs one cross-thread wake-up (channel thread → reader), not two, and the driver does
/// not contend for the stack's lock with the reader it would race.
///
/// A woken reader may never pull (its task was cancelled, or it waits on something else
/// now): the arrival leaves `owed` set until some pull pays it. While arrivals are recent
/// the driver parks at most [`PULL_FALLBACK`] and pulls an unpaid debt itself; after
/// [`ACTIVE_WINDOW`] without arrivals it sleeps untimed, and an arrival that finds it so
/// (`Signal::deep`) wakes it. Bytes therefore wait at most about [`PULL_FALLBACK`] for a
/// reader that does not come.
pub(crate) struct RxSignal {
    signal: Arc<Signal>,
    readers: super::waker_list::WakerList,
    /// An arrival was handed to a reader and no pull has taken it yet.
    owed: AtomicBool,
    /// Where the scheduler keeps the classes apart (`separate_classes`, `Isolating`): the
    /// tasks of latency-class sockets wait here, are woken for arrivals on latency
    /// channels only, and pull only those channels ([`RxScope`]); `readers` and `owed`
    /// then serve the throughput class. So a latency application's thread never reads a
    /// bulk channel, nor waits for a bulk shard's lock to hand its chunks over (the
    /// isolation bench's 1-5 ms waits, `docs/performance.md`, tenth session).
    latency_readers: super::waker_list::WakerList,
    latency_owed: AtomicBool,
    /// Whether the classes are kept apart (the two lists are used).
    split: bool,
    /// Arrivals handed to readers so far (the driver's activity measure).
    handed: AtomicU64,
    /// Channels whose receive waker marked them ready and no read has taken the mark
    /// since (counted with the marks, `ChanRxWake`): a pull of the ready channels finds
    /// nothing when it is zero, and returns without a look at the channel table (most
    /// pulls of a reader that waits find nothing: ~200 instructions each, callgrind).
    pub(crate) ready_chans: AtomicUsize,
}

/// Longest the driver sleeps while arrivals are recent, so that bytes handed to a reader
/// that never pulls them still reach their sockets. Every such sleep ends in a wake-up
/// that may preempt an application thread on a host with few cores; at 1 ms they were
/// part of the 4 KB ping-pong's tail (`docs/performance.md`, "Background wake-ups"). A
/// reader that is woken and never pulls (a read cancelled right then) is rare, and a read
/// that returns bytes leaves the readers' list (`Core::read_wait_over`), so the driver
/// is not what usually pays.
const PULL_FALLBACK: Duration = Duration::from_millis(10);
/// How long after the last arrival handed to a reader the driver keeps sleeping with
/// [`PULL_FALLBACK`] (then untimed, woken by the next arrival).
const ACTIVE_WINDOW: Duration = Duration::from_millis(20);

/// How often the driver reads the stack's pending-bytes figure while a task waits for it
/// to reach zero ([`Stack::drained`](super::Stack::drained)) or the stack is stopping:
/// the channels' TCP acknowledgements do not wake the driver, so it re-reads them on this
/// timer (and after every round). Two readings of zero at least this far apart make a
/// drained stack (channel figures are snapshots their threads publish).
const DRAIN_RECHECK: Duration = Duration::from_millis(2);

/// When the driver looks again at a shard whose lock an application call held during
/// its round.
const SHARD_RETRY: Duration = Duration::from_millis(1);

/// What a task waits for ([`Core::poll_wait`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Goal {
    /// Nothing written is undelivered: `pending_tx_bytes` read 0 twice,
    /// [`DRAIN_RECHECK`] apart.
    Drained,
    /// The stack holds no channel.
    NoChannels,
    /// The stack holds exactly this many channels.
    Channels(usize),
    /// The driver has asked the scheduler for at least this many plans.
    Plans(u64),
    /// The driver has stopped.
    Stopped,
}

/// A graceful stop in progress ([`Core::begin_stop`]).
#[derive(Debug)]
pub(crate) struct Stopping {
    /// When whatever is left is aborted.
    deadline: Instant,
    /// Everything was drained and the channels are closed (a FIN after their bytes):
    /// waiting for each peer to see the end of its channel.
    closed: bool,
}

/// A task waiting for a [`Goal`] ([`Core::poll_wait`]).
#[derive(Debug)]
struct Waiter {
    id: u64,
    goal: Goal,
    waker: Option<Waker>,
    /// The driver found the goal reached (the wait's next poll ends).
    reached: bool,
}

/// How the driver stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopOutcome {
    /// A graceful stop delivered everything and closed the channels.
    Drained,
    /// A graceful stop ran out of linger time with this many bytes undelivered (0: the
    /// peers had not yet seen the end of the channels); the rest was aborted.
    Expired { pending: usize },
    /// Stopped at once ([`Stack::abort`](super::Stack::abort)).
    Aborted,
}

thread_local! {
    /// The task running a receive round on this thread from [`Core::want_rx`], which
    /// looks for its bytes again afterwards (see [`RuntimeRound`]).
    static RUNTIME_ROUND: std::cell::Cell<Option<WakerId>> = const { std::cell::Cell::new(None) };
}

/// Which task a [`Waker`] wakes, as [`Waker::will_wake`] tells it (its data and vtable
/// pointers), without a clone: [`RuntimeRound`] is entered on every wait and read, and a
/// clone and drop of the task's waker, in a `RefCell`, was ~100 instructions each time
/// (callgrind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WakerId(*const (), *const std::task::RawWakerVTable);

impl WakerId {
    fn of(w: &Waker) -> WakerId {
        WakerId(w.data(), w.vtable())
    }
}

/// Marks the calling thread as running receive rounds for the task of `waker` until
/// dropped: an arrival that would wake that very task as the reader to pull
/// ([`RxSignal`]) leaves it to the task, which pulls once the rounds return.
pub(crate) struct RuntimeRound(Option<WakerId>);

impl RuntimeRound {
    pub(crate) fn enter(waker: &Waker) -> RuntimeRound {
        RuntimeRound(RUNTIME_ROUND.with(|r| r.replace(Some(WakerId::of(waker)))))
    }

    /// Whether this thread runs rounds for a task now.
    fn active() -> bool {
        RUNTIME_ROUND.with(|r| r.get().is_some())
    }

    /// Whether `w` wakes the task this thread runs rounds for.
    fn is_of(w: &Waker) -> bool {
        RUNTIME_ROUND.with(|r| r.get() == Some(WakerId::of(w)))
    }
}

impl Drop for RuntimeRound {
    fn drop(&mut self) {
        let was = self.0;
        RUNTIME_ROUND.with(|r| r.set(was));
    }
}

thread_local! {
    /// `Some` while this thread runs the channel kicks of an application call
    /// ([`Core::finish_call`]), which may send inline and so run a queue round that also
    /// receives; `Some(true)` once such an arrival found no reader waiting (see
    /// [`SendRound`]).
    static SEND_ROUND: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Marks the calling thread as running an application call's channel kicks until
/// dropped: an arrival of an inline round that finds no reader waiting is left to this
/// thread, which pulls once the kicks are done ([`SendRound::left_arrivals`]), instead
/// of waking the driver thread (a futex wake and a context switch, about one per
/// exchange on the 2-core bed, since a task that writes is not waiting to read).
struct SendRound(Option<bool>);

impl SendRound {
    fn enter() -> SendRound {
        SendRound(SEND_ROUND.with(|r| r.replace(Some(false))))
    }

    fn active() -> bool {
        SEND_ROUND.with(|r| r.get().is_some())
    }

    /// An arrival was left to this thread.
    fn leave_arrival() {
        SEND_ROUND.with(|r| {
            if r.get().is_some() {
                r.set(Some(true));
            }
        });
    }

    /// Whether an arrival was left to this thread (ends the mark).
    fn left_arrivals(self) -> bool {
        SEND_ROUND.with(|r| r.get()) == Some(true)
    }
}

impl Drop for SendRound {
    fn drop(&mut self) {
        let was = self.0;
        SEND_ROUND.with(|r| r.set(was));
    }
}

/// Most reader wakers an [`RxSignal`] holds (more wait for the driver's wake-up).
const MAX_RX_READERS: usize = 64;

/// Which ready channels a pull reads: all, or where the classes are kept apart
/// ([`RxSignal`]'s split) those of the caller's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxScope {
    All,
    Latency,
    Throughput,
}

impl RxScope {
    /// Whether a pull of this scope reads channels of `class`.
    pub(crate) fn covers(self, class: ChannelClass) -> bool {
        match self {
            RxScope::All => true,
            RxScope::Latency => class == ChannelClass::Latency,
            RxScope::Throughput => class == ChannelClass::Throughput,
        }
    }
}

impl RxSignal {
    /// The readers' list and the debt flag of a class (`latency`): the class's own where
    /// the classes are kept apart, else the one pair.
    fn side(&self, latency: bool) -> (&super::waker_list::WakerList, &AtomicBool) {
        if self.split && latency {
            (&self.latency_readers, &self.latency_owed)
        } else {
            (&self.readers, &self.owed)
        }
    }

    /// Whether any arrival waits for a pull.
    fn owed_any(&self) -> bool {
        self.owed.load(Ordering::SeqCst) || self.latency_owed.load(Ordering::SeqCst)
    }

    /// A pull of `scope` is about to read: the debts it covers are paid.
    fn pay(&self, scope: RxScope) {
        if scope != RxScope::Latency {
            self.owed.store(false, Ordering::SeqCst);
        }
        // Without the split nothing sets the latency debt: no store on that path.
        if self.split && scope != RxScope::Throughput {
            self.latency_owed.store(false, Ordering::SeqCst);
        }
    }

    /// Whether an arrival a pull of `scope` would read waits for one.
    fn owed_in(&self, scope: RxScope) -> bool {
        match scope {
            RxScope::All => self.owed_any(),
            RxScope::Latency => self.latency_owed.load(Ordering::SeqCst),
            RxScope::Throughput => self.owed.load(Ordering::SeqCst),
        }
    }

    /// The pull scope of a task reading a socket of class `latency`.
    pub(crate) fn scope(&self, latency: bool) -> RxScope {
        match (self.split, latency) {
            (false, _) => RxScope::All,
            (true, true) => RxScope::Latency,
            (true, false) => RxScope::Throughput,
        }
    }

    /// Bytes arrived on a channel of class `latency` (its receive waker, after marking
    /// it ready): one waiting reader of the class is woken to pull them.
    pub(crate) fn arrival(&self, latency: bool) {
        let (readers, owed) = self.side(latency);
        // One reader is enough: it feeds every socket's bytes to the endpoint and wakes
        // the other readers whose sockets became ready (no thundering herd).
        let reader = readers.pop();
        match reader {
            Some(w) => {
                owed.store(true, Ordering::SeqCst);
                self.handed.fetch_add(1, Ordering::Relaxed);
                // The reader is the task whose runtime round made this arrival: it pulls
                // right after the round. Waking it from inside its own poll would make
                // tokio treat it as yielding and wake another worker to steal it.
                if !RuntimeRound::is_of(&w) {
                    w.wake();
                }
                // Paired with the driver's store of `deep` then load of `owed`: either it
                // sees the debt before sleeping untimed, or this sees it asleep.
                if self.signal.deep.load(Ordering::SeqCst) {
                    self.signal.notify();
                }
            }
            // The thread that ran this round pulls right after it: a task's own receive
            // round (`want_rx`'s callers look again), or an application call's inline
            // send (`Core::finish_call`).
            None if RuntimeRound::active() || SendRound::active() => {
                owed.store(true, Ordering::SeqCst);
                SendRound::leave_arrival();
                // As above: a driver asleep untimed still learns of the debt.
                if self.signal.deep.load(Ordering::SeqCst) {
                    self.signal.notify();
                }
            }
            None => self.signal.notify(),
        }
    }
}

impl Wake for RxSignal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    /// An arrival on a channel of the throughput class (see [`RxSignal::arrival`]).
    fn wake_by_ref(self: &Arc<Self>) {
        self.arrival(false);
    }
}

/// Settings the driver and the application calls need.
#[derive(Debug, Clone)]
pub(crate) struct CoreConfig {
    pub channels: usize,
    pub latency_channels: usize,
    pub channel_port: u16,
    pub backlog: usize,
    pub connect_timeout: Duration,
    /// How long an accepted channel may take to send its preamble (and to complete the
    /// authentication exchange), and how long an opened one waits for the acceptor's
    /// challenge.
    pub preamble_timeout: Duration,
    /// The key channels authenticate with; `None`: unauthenticated channels.
    pub channel_key: Option<auth::ChannelKey>,
    /// Which tasks with nothing to read wait on the AF_XDP queues in their runtime and run
    /// the receive rounds themselves (see `stack::rx_poll`).
    #[cfg(target_os = "linux")]
    pub runtime_rx: super::rx_poll::RuntimeRx,
    /// Up to how many active streams every stream takes the latency-class per-message
    /// path (`StackBuilder::light_load_streams`, see `shard::LightLoad`); `None`: chosen
    /// from the host (`shard::auto_light_load_streams`).
    pub light_load_streams: Option<usize>,
    /// The driver carries out the scheduler's plans (`StackBuilder::execute_plans`).
    pub execute_plans: bool,
    /// Channel threads deliver what they receive (`StackBuilder::channel_thread_rx`).
    pub channel_thread_rx: bool,
    /// The cores the stack may place channel threads on, for the plans' snapshots.
    pub cores: Vec<usize>,
    /// Latency channels open on channel threads of their own (the scheduler's
    /// `separate_class_threads`).
    pub separate_classes: bool,
}

/// What the stack shares between its driver thread, its handles and its streams.
///
/// Three kinds of lock, none of them stack-wide on the per-message path: one per shard
/// (its endpoint and wakers: application calls on its sockets), one per channel
/// direction (`chan.rs`), and the control lock (channels coming and going, peers,
/// waiters, stopping: the driver, connects to new hosts, statistics). The channel table
/// is read without a lock.
pub(crate) struct Core {
    ctl: Mutex<Control>,
    shards: Box<[Mutex<Shard>]>,
    pub(crate) chans: ArcSwap<ChanTable>,
    /// Where the next connect's socket goes (round robin over the shards, the latency
    /// shard apart).
    next_shard: AtomicUsize,
    /// How sockets map to shards by their ports (every shard's `Config::shard`, its
    /// index apart).
    shard_map: crate::ShardOf,
    /// New channels, connects, binds and accepts are refused: the stack has stopped or is
    /// stopping (mirrors [`Control::refuses_new`] for calls that hold a shard's lock).
    refusing: AtomicBool,
    pub(crate) signal: Arc<Signal>,
    /// `signal` as a waker, made once: the finishing passes of every application call
    /// take it (an `Arc` clone and drop per call otherwise).
    signal_waker: Waker,
    rx: Arc<RxSignal>,
    /// The core itself, for the channels' receive wakers (see [`Core::pull_here`]); set
    /// once the core is in its `Arc` ([`Core::set_self`]).
    me: std::sync::OnceLock<std::sync::Weak<Core>>,
    /// Pulls channel threads ran ([`Core::pull_here`]).
    pub(crate) channel_thread_pulls: AtomicU64,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) config: CoreConfig,
    /// Largest chunk payload of the endpoints (the channels' deframers).
    max_chunk_payload: usize,
    /// The backend's queues for tasks that wait on them in their runtime (`None`: no
    /// such queues, or turned off).
    #[cfg(target_os = "linux")]
    pub(crate) rt_rx: Option<super::rx_poll::RuntimeQueues>,
    /// Active streams, and whether that is few enough for the latency-class path.
    pub(crate) load: Arc<super::shard::LightLoad>,
}

/// How a socket receives, as [`Core::rx_path`] decides when its task waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RxPath {
    /// It takes the latency-class path: its task may run the queues' receive rounds in
    /// its runtime (`rx_poll`). Its class, or a lightly loaded stack.
    pub(crate) latency_path: bool,
    /// Its class is latency: with classes on queues of their own, its task serves only
    /// the latency channels' queues (`rx_poll::Waiters`).
    pub(crate) latency_class: bool,
}

/// A stream's or connect's wakers.
#[derive(Debug, Default)]
pub(crate) struct SockWake {
    pub read: Option<Waker>,
    pub write: Option<Waker>,
    pub timed_out: bool,
    /// A read of this stream put its task on the readers' lists ([`Core::want_rx`]) and
    /// has not returned bytes since ([`Core::read_wait_over`] takes it off).
    pub listed: bool,
    /// The last activity period (`shard::LightLoad`) in which the stream read or wrote
    /// bytes, plus one (0: never).
    pub active_period: u64,
}

#[derive(Debug)]
enum Opening {
    Idle,
    Running {
        attempt: u64,
        waiters: Vec<Waker>,
    },
    Failed {
        attempt: u64,
        kind: io::ErrorKind,
        msg: String,
    },
}

#[derive(Debug)]
pub(crate) struct Peer {
    id: PeerId,
    throughput: usize,
    latency: usize,
    opening: Opening,
    /// This stack opened channels to the peer (so it opens them again when all are lost;
    /// a peer that opened them does that itself).
    opened: bool,
}

struct Incoming {
    t: BoxedTransport,
    peer: SocketAddrV4,
    got: Vec<u8>,
    stage: Stage,
    /// When the channel is dropped if its preamble is not complete.
    deadline: Instant,
}

/// Most accepted channels waiting for their preamble at once; past it the one that has
/// waited longest is aborted (a peer opening channels and never speaking must not fill
/// the queue's connection table, which our own connects share).
pub(crate) const MAX_PENDING_PREAMBLES: usize = 256;

/// Everything behind the control lock: channels being accepted, peers and the opening
/// of channels to them, waiters, a stop in progress.
pub(crate) struct Control {
    incoming: Vec<Incoming>,
    peers: HashMap<Ipv4Addr, Peer>,
    peer_ips: HashMap<PeerId, Ipv4Addr>,
    next_channel: u32,
    next_peer: u32,
    next_attempt: u64,
    /// The driver has stopped: no channel will ever move again.
    pub stopped: bool,
    /// Plain-TCP channels closed gracefully whose streams are gone, watched until their
    /// bytes and FIN are acknowledged and the peer's FIN is in, or their linger deadline.
    closing_plain: Vec<ClosingPlain>,
    /// Closed plain-TCP channels reset because they were not finished within the
    /// endpoint's `linger_timeout` (bytes unacknowledged, or no FIN from the peer).
    pub plain_linger_expired: u64,
    preamble_timeout: Duration,
    channel_key: Option<auth::ChannelKey>,
    linger_timeout: Duration,
    /// Accepted channels aborted before they joined: no preamble in time, too many
    /// waiting, a bad preamble, or failed authentication.
    pub dropped_channels: u64,
    /// The channel port's acceptor; `None` once it failed or the stack is stopping.
    acceptor: Option<Box<dyn Acceptor>>,
    /// Tasks waiting for a [`Goal`].
    waiters: Vec<Waiter>,
    next_waiter: u64,
    /// Readings of `pending_tx_bytes` in a row that found 0 (taken while someone waits).
    zero_checks: u32,
    /// When the next reading is due.
    next_check: Option<Instant>,
    /// A graceful stop in progress: no new channels or streams, the open ones draining.
    pub stopping: Option<Stopping>,
    /// Channels closed by a graceful stop, kept until their peers have seen the end.
    closing_chans: Vec<Arc<Chan>>,
    /// How the driver stopped (`None` while it runs).
    pub stop_outcome: Option<StopOutcome>,
    /// Of those, channels that failed authentication (no, or a wrong, proof of the key;
    /// or asking to authenticate when this stack has no key).
    pub auth_failures: u64,
    /// Peers whose last channel was lost, to open channels to again (the driver thread
    /// starts the opening).
    reopen: Vec<Ipv4Addr>,
    /// Carrying out the scheduler's plans (`driver/plans.rs`).
    pub(crate) plans: plans::PlanState,
}

/// Items gathered under a lock to be handled after it (wake-ups, channel kicks): the
/// first in place, the rest in a `Vec`. Most application calls leave one or none, and
/// a `Vec` per call allocated and freed a buffer per message; `SmallVec` gave that back
/// in its own drop and extend (callgrind, thirteenth session).
#[derive(Debug)]
pub(crate) struct Few<T> {
    first: Option<T>,
    rest: Vec<T>,
}

impl<T> Default for Few<T> {
    fn default() -> Self {
        Few {
            first: None,
            rest: Vec::new(),
        }
    }
}

impl<T> Few<T> {
    pub(crate) fn push(&mut self, item: T) {
        if self.first.is_none() {
            self.first = Some(item);
        } else {
            self.rest.push(item);
        }
    }

    /// Hands every item to `f`, first in first out, leaving it empty.
    pub(crate) fn drain_each(&mut self, mut f: impl FnMut(T)) {
        if let Some(first) = self.first.take() {
            f(first);
            if !self.rest.is_empty() {
                self.rest.drain(..).for_each(f);
            }
        }
    }
}

impl<T> Extend<T> for Few<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, items: I) {
        for item in items {
            self.push(item);
        }
    }
}

/// Tasks to wake once no lock is held.
pub(crate) type Wakes = Few<Waker>;

/// What a pass over some shards leaves to do once their locks are released.
#[derive(Default)]
pub(crate) struct Finish {
    pub(crate) wake: Wakes,
    #[cfg(target_os = "linux")]
    kicks: Few<(netdriver::channel::DeferredKick, super::shard::KickMode)>,
    /// Work for the driver: a budget ran out, a channel resumed or died.
    pub(crate) more: bool,
}

impl Finish {
    /// Moves a shard's kicks here, to run once its lock is released.
    #[cfg(target_os = "linux")]
    fn take_kicks(
        &mut self,
        kicks: &mut Vec<(netdriver::channel::DeferredKick, super::shard::KickMode)>,
    ) {
        if !kicks.is_empty() {
            kicks.drain(..).for_each(|k| self.kicks.push(k));
        }
    }

    /// Runs the channel kicks and wakes the tasks (no lock held).
    pub(crate) fn run(&mut self) {
        #[cfg(target_os = "linux")]
        self.kicks.drain_each(run_kick);
        self.wake.drain_each(Waker::wake);
    }
}

impl Core {
    /// A core over `endpoints`, one per shard (each numbered as its index in its
    /// config's [`ShardOf`](crate::ShardOf)).
    pub(crate) fn new(
        endpoints: Vec<Endpoint>,
        backend: Arc<dyn Backend>,
        config: CoreConfig,
        acceptor: Box<dyn Acceptor>,
    ) -> Core {
        assert!(
            !endpoints.is_empty() && endpoints.len() <= MAX_SHARDS,
            "1..=MAX_SHARDS shards"
        );
        let signal = Arc::new(Signal::default());
        let load = Arc::new(super::shard::LightLoad::new(config.light_load_streams));
        let max_chunk_payload = endpoints[0].config().max_chunk_payload;
        let linger_timeout = endpoints[0].config().linger_timeout;
        let shard_map = endpoints[0].config().shard;
        let rx = Arc::new(RxSignal {
            signal: signal.clone(),
            readers: super::waker_list::WakerList::new(MAX_RX_READERS),
            owed: AtomicBool::new(false),
            latency_readers: super::waker_list::WakerList::new(MAX_RX_READERS),
            latency_owed: AtomicBool::new(false),
            split: config.separate_classes,
            handed: AtomicU64::new(0),
            ready_chans: AtomicUsize::new(0),
        });
        Core {
            me: std::sync::OnceLock::new(),
            channel_thread_pulls: AtomicU64::new(0),
            rx,
            ctl: Mutex::new(Control {
                incoming: Vec::new(),
                peers: HashMap::new(),
                peer_ips: HashMap::new(),
                next_channel: 0,
                next_peer: 0,
                next_attempt: 0,
                stopped: false,
                closing_plain: Vec::new(),
                plain_linger_expired: 0,
                preamble_timeout: config.preamble_timeout,
                channel_key: config.channel_key.clone(),
                linger_timeout,
                dropped_channels: 0,
                auth_failures: 0,
                acceptor: Some(acceptor),
                waiters: Vec::new(),
                next_waiter: 0,
                zero_checks: 0,
                next_check: None,
                stopping: None,
                closing_chans: Vec::new(),
                stop_outcome: None,
                reopen: Vec::new(),
                plans: plans::PlanState::default(),
            }),
            shards: endpoints
                .into_iter()
                .enumerate()
                .map(|(i, ep)| {
                    let mut shard = Shard::new(ep, load.clone());
                    // Where the classes are kept apart, each shard helps only its own
                    // class's channels (`Shard::transmit_all`).
                    if config.separate_classes {
                        let latency = shard_map.latency_shard().map(usize::from) == Some(i);
                        shard.help_only(if latency {
                            ChannelClass::Latency
                        } else {
                            ChannelClass::Throughput
                        });
                    }
                    Mutex::new(shard)
                })
                .collect(),
            load,
            chans: ArcSwap::from_pointee(ChanTable::new()),
            next_shard: AtomicUsize::new(0),
            shard_map,
            refusing: AtomicBool::new(false),
            signal_waker: Waker::from(signal.clone()),
            signal,
            #[cfg(target_os = "linux")]
            rt_rx: super::rx_poll::RuntimeQueues::new(backend.rx_pollers(), config.runtime_rx),
            backend,
            config,
            max_chunk_payload,
        }
    }

    /// The control lock.
    pub(crate) fn ctl(&self) -> MutexGuard<'_, Control> {
        self.ctl.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shard `i`'s lock.
    pub(crate) fn lock_shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shard `i`'s lock if it is free now.
    fn try_lock_shard(&self, i: usize) -> Option<MutexGuard<'_, Shard>> {
        match self.shards[i].try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The shard that owns socket `sid` (ids step by the shard count from the shard's
    /// index).
    pub(crate) fn shard_of(&self, sid: SocketId) -> usize {
        (sid.number() % self.shards.len() as u64) as usize
    }

    /// Socket `sid`'s shard's lock.
    pub(crate) fn lock_socket(&self, sid: SocketId) -> MutexGuard<'_, Shard> {
        self.lock_shard(self.shard_of(sid))
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard a new connect's socket to `remote` (a virtual port) goes to: the
    /// latency shard for a latency-class socket (or a port of that shard's), else the
    /// others in turn.
    pub(crate) fn next_connect_shard(&self, remote: u16, class: netsched::AppClass) -> usize {
        let map = &self.shard_map;
        match map.latency_shard() {
            Some(l) if class == netsched::AppClass::Latency || map.is_latency_port(remote) => {
                usize::from(l)
            }
            Some(l) => self.next_shard.fetch_add(1, Ordering::Relaxed) % usize::from(l),
            None => self.next_shard.fetch_add(1, Ordering::Relaxed) % self.shards.len(),
        }
    }

    /// The shard that owns the socket with these virtual ports (`local` here, `remote`
    /// on the peer): for a received chunk, its destination and source ports.
    pub(crate) fn shard_for_ports(&self, local: u16, remote: u16) -> usize {
        usize::from(self.shard_map.shard_for(local, remote))
    }

    /// The latency shard's index, if the stack has one.
    pub(crate) fn latency_shard(&self) -> Option<usize> {
        self.shard_map.latency_shard().map(usize::from)
    }

    /// Hands the sent chunk buffers the channels are done with to `reuse`, from every
    /// shard but `own` whose lock is free now (a large write reclaims its own shard's
    /// under its lock; a write on a socket of another shard must not leave these idle).
    pub(crate) fn reclaim_sent_elsewhere(
        &self,
        own: usize,
        mut reuse: impl FnMut(bytes::BytesMut),
    ) {
        for (i, shard) in self.shards.iter().enumerate() {
            if i == own {
                continue;
            }
            if let Ok(mut s) = shard.try_lock() {
                s.ep.reclaim_sent(&mut reuse);
            }
        }
    }

    /// Whether new channels, connects, binds and accepts are refused.
    pub(crate) fn refuses_new(&self) -> bool {
        self.refusing.load(Ordering::Acquire)
    }

    /// Runs `f` on every shard in turn (each locked while `f` runs), in index order.
    pub(crate) fn each_shard(&self, mut f: impl FnMut(usize, &mut Shard)) {
        for i in 0..self.shards.len() {
            f(i, &mut self.lock_shard(i));
        }
    }

    /// Resolves `ip` to a peer with at least one channel of `class`, opening the stack's
    /// channels to it on first use (in a helper thread). `attempt` remembers which opening
    /// this caller waits for, so that it sees that opening's failure.
    pub(crate) fn poll_peer(
        self: &Arc<Self>,
        ip: Ipv4Addr,
        class: ChannelClass,
        attempt: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<PeerId>> {
        let mut ctl = self.ctl();
        if ctl.refuses_new() {
            return Poll::Ready(Err(stopped_error()));
        }
        let id = ctl.peer_id(ip);
        let next_attempt = ctl.next_attempt;
        let peer = ctl.peers.get_mut(&ip).expect("peer_id inserted it");
        let usable = match class {
            ChannelClass::Throughput => peer.throughput,
            ChannelClass::Latency => peer.latency,
        };
        if usable > 0 {
            return Poll::Ready(Ok(id));
        }
        match &mut peer.opening {
            Opening::Running {
                waiters,
                attempt: a,
            } => {
                *attempt = Some(*a);
                if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                    waiters.push(cx.waker().clone());
                }
                return Poll::Pending;
            }
            Opening::Failed {
                attempt: a,
                kind,
                msg,
            } if *attempt == Some(*a) => {
                return Poll::Ready(Err(io::Error::new(*kind, msg.clone())));
            }
            Opening::Idle | Opening::Failed { .. } if attempt.is_some() => {
                // Our opening finished with channels that were lost since, or without a
                // channel of this class.
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::AddrNotAvailable,
                    "no channel of the needed class to the peer",
                )));
            }
            _ => {}
        }
        peer.opening = Opening::Running {
            attempt: next_attempt,
            waiters: vec![cx.waker().clone()],
        };
        *attempt = Some(next_attempt);
        ctl.next_attempt += 1;
        drop(ctl);
        let core = self.clone();
        let spawned = std::thread::Builder::new()
            .name("vns-open".into())
            .spawn(move || core.open_channels(ip, next_attempt));
        if let Err(e) = spawned {
            let mut ctl = self.ctl();
            if let Some(p) = ctl.peers.get_mut(&ip) {
                p.opening = Opening::Idle;
            }
            return Poll::Ready(Err(e));
        }
        Poll::Pending
    }

    /// Opens the configured channels to `ip` (helper thread).
    fn open_channels(self: Arc<Self>, ip: Ipv4Addr, attempt: u64) {
        let remote = SocketAddrV4::new(ip, self.config.channel_port);
        let plan =
            std::iter::repeat_n(ChannelClass::Throughput, self.config.channels.max(1)).chain(
                std::iter::repeat_n(ChannelClass::Latency, self.config.latency_channels),
            );
        let mut opened = Vec::new();
        let mut error = None;
        let mut auth_error = None;
        for class in plan {
            match self
                .backend
                .connect_placed(remote, class, self.config.separate_classes)
            {
                Ok((t, _)) => match self.open_handshake(&t, class) {
                    Ok(leftover) => opened.push((t, class, leftover)),
                    Err(why) => {
                        // Every further channel would fail the same way.
                        warn!(%remote, why = %why, "channel handshake failed; aborting it");
                        t.abort();
                        auth_error = Some(why);
                        break;
                    }
                },
                Err(e) => {
                    debug!(%remote, error = %e, "opening a channel failed");
                    error = Some(e);
                    break;
                }
            }
        }
        let waiters = {
            let mut ctl = self.ctl();
            let peer = ctl.peer_id(ip);
            let mut n = 0;
            for (t, class, leftover) in opened {
                if !ctl.refuses_new() {
                    self.add_channel(&mut ctl, t, ip, peer, class, leftover);
                    n += 1;
                } else {
                    t.abort();
                }
            }
            debug!(%remote, channels = n, "channels opened");
            if n == 0 {
                // Sockets left without a channel by a loss wait for this opening; it
                // failed, so they fail now rather than at the end of their wait.
                self.each_shard(|_, s| s.ep.handle_peer_gone(peer, VnsError::ChannelLost));
            }
            let p = ctl.peers.get_mut(&ip).expect("peer_id inserted it");
            p.opened |= n > 0;
            let next = match (error, auth_error) {
                (_, Some(why)) if n == 0 => Opening::Failed {
                    attempt,
                    kind: io::ErrorKind::PermissionDenied,
                    msg: format!("opening channels to {remote}: {why}"),
                },
                (Some(e), None) if n == 0 => {
                    let kind = io::Error::from(e).kind();
                    Opening::Failed {
                        attempt,
                        kind,
                        msg: format!("opening channels to {remote}: {kind}"),
                    }
                }
                _ => Opening::Idle,
            };
            match std::mem::replace(&mut p.opening, next) {
                Opening::Running { waiters, .. } => waiters,
                _ => Vec::new(),
            }
        };
        self.signal.notify();
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Starts opening channels again to the peers that lost their last one (see
    /// [`Core::lose_channel`]), each in a helper thread like a first opening.
    fn reopen_channels(self: &Arc<Self>, ctl: &mut Control) {
        for ip in std::mem::take(&mut ctl.reopen) {
            let attempt = ctl.next_attempt;
            let Some(p) = ctl.peers.get_mut(&ip) else {
                continue;
            };
            if p.throughput + p.latency > 0 || matches!(p.opening, Opening::Running { .. }) {
                continue;
            }
            p.opening = Opening::Running {
                attempt,
                waiters: Vec::new(),
            };
            let peer = p.id;
            ctl.next_attempt += 1;
            let core = self.clone();
            let spawned = std::thread::Builder::new()
                .name("vns-open".into())
                .spawn(move || core.open_channels(ip, attempt));
            if let Err(e) = spawned {
                warn!(%ip, error = %e, "cannot start opening channels again");
                if let Some(p) = ctl.peers.get_mut(&ip) {
                    p.opening = Opening::Idle;
                }
                self.each_shard(|_, s| s.ep.handle_peer_gone(peer, VnsError::ChannelLost));
            }
        }
    }

    /// Sends the preamble on a channel this stack opened and, with a channel key, runs the
    /// opener's side of the authentication exchange (see [`auth`]), blocking this helper
    /// thread for at most the preamble timeout. Returns bytes that arrived after the
    /// exchange (chunks for the endpoint), or why the channel cannot be used.
    fn open_handshake(
        &self,
        t: &BoxedTransport,
        class: ChannelClass,
    ) -> Result<Option<Bytes>, String> {
        let Some(key) = &self.config.channel_key else {
            t.enqueue(Bytes::copy_from_slice(&preamble(class, 0)))
                .map_err(|e| format!("channel failed before its preamble: {e}"))?;
            return Ok(None);
        };
        let nc = auth::nonce().map_err(|e| format!("no randomness for a nonce: {e}"))?;
        let mut hello = Vec::with_capacity(PREAMBLE_LEN + auth::NONCE_LEN);
        hello.extend_from_slice(&preamble(class, auth::FLAG_AUTH));
        hello.extend_from_slice(&nc);
        t.enqueue(Bytes::from(hello))
            .map_err(|e| format!("channel failed before its preamble: {e}"))?;
        let deadline = Instant::now() + self.config.preamble_timeout;
        let mut got = Vec::new();
        while got.len() < auth::NONCE_LEN + auth::TAG_LEN {
            match dequeue_until(t.as_ref(), deadline) {
                Ok(Some(b)) => got.extend_from_slice(&b),
                Ok(None) => {
                    return Err(
                        "channel authentication failed: the peer closed the channel \
                         (it has no channel key, or another one)"
                            .into(),
                    )
                }
                Err(why) => return Err(format!("channel authentication failed: {why}")),
            }
        }
        let (ns, rest) = got.split_at(auth::NONCE_LEN);
        let (tag, leftover) = rest.split_at(auth::TAG_LEN);
        if !key.verify_accept(&nc, ns, class_byte(class), tag) {
            return Err(
                "channel authentication failed: the peer does not hold our channel key".into(),
            );
        }
        let proof = key.open_tag(&nc, ns, class_byte(class));
        t.enqueue(Bytes::copy_from_slice(&proof))
            .map_err(|e| format!("channel failed during authentication: {e}"))?;
        Ok((!leftover.is_empty()).then(|| Bytes::copy_from_slice(leftover)))
    }

    /// A channel joins (the control lock held): every shard's endpoint learns it first,
    /// then it enters the table, so that no chunk of it reaches a shard that does not know
    /// it. `leftover`: bytes that came after its handshake.
    fn add_channel(
        &self,
        ctl: &mut Control,
        t: BoxedTransport,
        ip: Ipv4Addr,
        peer: PeerId,
        class: ChannelClass,
        leftover: Option<Bytes>,
    ) {
        let id = ChannelId(ctl.next_channel);
        ctl.next_channel = ctl.next_channel.wrapping_add(1);
        let mut failed = None;
        self.each_shard(|i, s| {
            if failed.is_none() {
                if let Err(e) = s.ep.add_channel(id, peer, class) {
                    failed = Some((i, e));
                }
            }
        });
        if let Some((upto, e)) = failed {
            warn!(channel = %id, error = %e, "adding a channel");
            self.each_shard(|i, s| {
                if i < upto {
                    s.ep.abandon_channel(id);
                }
            });
            t.abort();
            return;
        }
        let p = ctl.peers.get_mut(&ip).expect("caller made the peer");
        match class {
            ChannelClass::Throughput => p.throughput += 1,
            ChannelClass::Latency => p.latency += 1,
        }
        let chan = Arc::new(Chan::new(
            id,
            t,
            ip,
            class,
            self.max_chunk_payload,
            leftover,
            ChanRxWake::new(
                self.rx.clone(),
                if self.config.channel_thread_rx {
                    self.me.get().cloned().unwrap_or_default()
                } else {
                    std::sync::Weak::new()
                },
                class,
            ),
        ));
        let mut table = ChanTable::clone(&self.chans.load());
        table.insert(id, chan);
        self.store_chans(table);
    }

    /// Installs a new channel table (the control lock held) and tells the runtime queues
    /// which of them carry latency channels.
    fn store_chans(&self, table: ChanTable) {
        #[cfg(target_os = "linux")]
        if let Some(rt) = &self.rt_rx {
            let mut latency = 0u64;
            if self.config.separate_classes {
                for c in table.values() {
                    if c.class == netsched::ChannelClass::Latency {
                        if let Some(w) = c.t.wire().filter(|w| w.queue < 64) {
                            latency |= 1 << w.queue;
                        }
                    }
                }
            }
            rt.set_latency_queues(latency);
        }
        self.chans.store(Arc::new(table));
    }

    /// Takes a channel out of the table (the control lock held, so that table changes do
    /// not race); returns it.
    fn unlist_channel(&self, id: ChannelId) -> Option<Arc<Chan>> {
        let current = self.chans.load();
        if !current.contains_key(&id) {
            return None;
        }
        let mut table = ChanTable::clone(&current);
        let chan = table.remove(&id);
        self.store_chans(table);
        chan
    }

    /// Drops a dead channel (the control lock held). Its sockets' chunks move to the peer's
    /// other channels (the endpoints' data-level acknowledgement). When it was the peer's
    /// last one: after a reset, a stack that opened the channels opens them again (the
    /// sockets wait for them); one the peer closed gracefully means the peer stops, and
    /// one that timed out that it is gone, so the sockets fail at once.
    fn lose_channel(&self, ctl: &mut Control, id: ChannelId, why: Gone) {
        let Some(c) = self.unlist_channel(id) else {
            return;
        };
        ctl.plans.forget(id);
        self.each_shard(|_, s| {
            match why {
                Gone::TimedOut => s.ep.handle_channel_timed_out(id),
                Gone::Lost => s.ep.handle_channel_lost(id),
                // Everything it carried was read (up to its end): what waits parked stays.
                Gone::Closed => s.ep.handle_channel_closed(id),
                Gone::Abandoned => s.ep.abandon_channel(id),
            }
            s.forget_channel(id);
        });
        debug!(channel = %id, peer = %c.peer, "channel lost");
        c.t.abort();
        let refuses_new = ctl.refuses_new();
        let Some(p) = ctl.peers.get_mut(&c.peer) else {
            return;
        };
        match c.class {
            ChannelClass::Throughput => p.throughput -= 1,
            ChannelClass::Latency => p.latency -= 1,
        }
        if p.throughput + p.latency > 0 {
            return;
        }
        let peer = p.id;
        match why {
            Gone::Closed => {
                self.each_shard(|_, s| s.ep.handle_peer_gone(peer, VnsError::ChannelLost))
            }
            // Keep-alive or the user timeout gave up on a silent peer: opening channels
            // again would only wait out `connect_timeout` past the liveness bound.
            Gone::TimedOut => {
                self.each_shard(|_, s| s.ep.handle_peer_gone(peer, VnsError::PeerUnreachable))
            }
            Gone::Lost if p.opened && !refuses_new => {
                if matches!(p.opening, Opening::Idle | Opening::Failed { .. }) {
                    debug!(peer = %c.peer, "last channel to the peer lost; opening channels again");
                    ctl.reopen.push(c.peer);
                }
            }
            _ => {}
        }
    }

    /// Drops the channels a data-path call found dead (the control lock held); returns
    /// whether there were any.
    fn reap_dead(&self, ctl: &mut Control) -> bool {
        let dead: Vec<(ChannelId, Gone)> = self
            .chans
            .load()
            .values()
            .filter_map(|c| c.dead().map(|why| (c.id, why)))
            .collect();
        for &(id, why) in &dead {
            self.lose_channel(ctl, id, why);
        }
        !dead.is_empty()
    }

    /// Ends a call on shard `shard` (its lock given): moves what the call queued (data, a
    /// credit update) into the channels from the calling thread, so that it does not wait
    /// for the driver to wake up; wakes the tasks whose sockets became ready; and wakes
    /// the driver only for work left over (a channel's budget used up, channel reads to
    /// resume, a channel found dead). A full channel wakes the driver through its own
    /// waker when it has room again.
    pub(crate) fn finish_call(&self, shard: MutexGuard<'_, Shard>) {
        // A call that found nothing to read usually leaves nothing to finish: skip the
        // pass (about 400 instructions, twice per 64-byte request; callgrind, twelfth
        // session).
        let table = self.chans.load();
        if shard.stopped {
            return;
        }
        match shard.finish_needed(&table) {
            FinishNeeded::Nothing => return,
            // Events only (a read's own `Readable`, say): handed out without the
            // transmit pass (about 500 instructions, twice per 64-byte request).
            FinishNeeded::Events => {
                drop(table);
                let mut wake = Wakes::default();
                let mut shard = shard;
                let more = shard.drain_events(&mut wake);
                drop(shard);
                if more {
                    self.signal.notify();
                }
                wake.drain_each(Waker::wake);
                return;
            }
            FinishNeeded::Full => {}
        }
        let mut fin = Finish::default();
        self.finish_shard(shard, &mut fin, &table);
        drop(table);
        if fin.more {
            self.signal.notify();
        }
        let round = SendRound::enter();
        fin.run();
        // An inline send's round received bytes nobody waited for: take them to their
        // sockets from here (no lock held) rather than wake the driver for it.
        if round.left_arrivals() {
            self.pull(usize::MAX, RxScope::All);
        }
    }

    /// [`Core::finish_call`]'s work for one shard, leaving the kicks and wake-ups in
    /// `fin` to run once no lock is held.
    /// `table`: the channels, as the caller loaded them.
    fn finish_shard(&self, mut shard: MutexGuard<'_, Shard>, fin: &mut Finish, table: &ChanTable) {
        if shard.stopped {
            return;
        }
        let mut cx = Context::from_waker(&self.signal_waker);
        fin.more |= shard.transmit_all(table, &mut cx, TxLocks::Wait);
        fin.more |= shard.drain_events(&mut fin.wake);
        // A short chunk held back (Nagle): the driver's sleep must end by its deadline.
        fin.more |= shard.ep.timers_changed();
        #[cfg(target_os = "linux")]
        fin.take_kicks(&mut shard.kicks);
    }

    /// Feeds what the channels hold to the shards' endpoints from the calling thread (the
    /// driver may not have run yet), then finishes the shards that were handed chunks,
    /// except `own`: the caller's, which it locks next and finishes itself
    /// ([`Core::finish_call`]). Returns whether any channel had bytes. Call it holding no
    /// shard's lock.
    /// `scope`: which ready channels it reads (the caller's class, where the classes are
    /// kept apart: [`RxSignal`]).
    pub(crate) fn pull(&self, own: usize, scope: RxScope) -> bool {
        // Whatever arrived before this point is taken now: the debt is paid.
        self.rx.pay(scope);
        self.pull_ready(Some(own), scope)
    }

    /// The body of [`Core::pull`] and [`Core::pull_here`]: reads the ready channels of
    /// `scope` and finishes the shards that were handed chunks, except `own`.
    fn pull_ready(&self, own: Option<usize>, scope: RxScope) -> bool {
        if self.rx.ready_chans.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let _pulling = PullMark::set();
        let mut touched = ShardSet::default();
        let r = self.receive_all(Sweep::Ready(scope), &mut touched);
        let mut others = touched.iter().filter(|&i| Some(i) != own).peekable();
        // Most pulls hand nothing to another shard (the caller finishes its own).
        if others.peek().is_none() {
            if r.more {
                self.signal.notify();
            }
            return r.any;
        }
        let mut fin = Finish {
            more: r.more,
            ..Finish::default()
        };
        let table = self.chans.load();
        for i in others {
            self.finish_shard(self.lock_shard(i), &mut fin, &table);
        }
        drop(table);
        if fin.more {
            self.signal.notify();
        }
        fin.run();
        r.any
    }

    /// Lets the channels' receive wakers reach the core (call once, right after the core
    /// is put in its `Arc`).
    pub(crate) fn set_self(self: &Arc<Self>) {
        let _ = self.me.set(Arc::downgrade(self));
    }

    /// [`Core::pull`] from a channel thread that has just queued received bytes (a
    /// channel's receive waker, see `ChanRxWake`): the channel thread deframes them,
    /// hands the chunks to their shards, finishes those shards and wakes the tasks whose
    /// sockets became ready. So an arrival costs one cross-thread wake-up (channel
    /// thread → the socket's task) instead of two (→ some waiting reader → the socket's
    /// task), and the receive work runs on the channel threads, which scale with the
    /// channels, rather than on the application's threads. The caller holds no lock of
    /// this stack.
    pub(crate) fn pull_here(&self, scope: RxScope) {
        self.channel_thread_pulls.fetch_add(1, Ordering::Relaxed);
        self.pull_ready(None, scope);
    }

    /// The pull scope of a task reading a socket of class `latency` ([`RxScope`]).
    pub(crate) fn rx_scope(&self, latency: bool) -> RxScope {
        self.rx.scope(latency)
    }

    /// [`Core::pull`] if an arrival was handed to a reader and nobody has pulled since
    /// (the woken reader may not be this one): application calls start with it, so that
    /// the bytes reach their sockets without waiting for the driver's fallback.
    pub(crate) fn pull_owed(&self, own: usize, scope: RxScope) -> bool {
        self.rx.owed_in(scope) && self.pull(own, scope)
    }

    /// Registers a task waiting to read (or to write: credit comes in on the receive
    /// side) for the next wake-up of a channel's receive side
    /// (see [`RxSignal`]), then ends the call like [`Core::finish_call`].
    ///
    /// Then, where the task's runtime waits on the AF_XDP queues itself (`rx_poll`), runs
    /// the rounds of queues with arrivals on this thread and waits on the rest. Returns
    /// whether it ran a round: the caller must then pull and look again (or wake its
    /// task to do so), since an arrival of those rounds does not wake the task that ran
    /// them ([`RuntimeRound`]).
    pub(crate) fn want_rx(
        &self,
        mut shard: MutexGuard<'_, Shard>,
        sid: SocketId,
        cx: &mut Context<'_>,
    ) -> bool {
        let path = Self::rx_path(&shard, sid);
        if let Some(sock) = shard.socks.get_mut(&sid) {
            sock.listed = true;
        }
        let w = cx.waker();
        self.rx.side(path.latency_class).0.push(w, false);
        self.finish_call(shard);
        #[cfg(target_os = "linux")]
        if let Some(rt) = &self.rt_rx {
            let _round = RuntimeRound::enter(cx.waker());
            return rt.poll(cx, path.latency_path, path.latency_class);
        }
        let _ = path;
        false
    }

    /// A read of a socket of class `latency_class` about to look for its bytes: where
    /// the task's runtime receives itself ([`Core::want_rx`]), runs the rounds of the
    /// queues that are readable now (`RuntimeQueues::run_ready`). Returns whether it ran
    /// one: the caller pulls, then looks.
    pub(crate) fn rounds_first(&self, latency_class: bool, cx: &Context<'_>) -> bool {
        #[cfg(target_os = "linux")]
        if let Some(rt) = &self.rt_rx {
            let latency_path = latency_class || self.load.is_light();
            let _round = RuntimeRound::enter(cx.waker());
            return rt.run_ready(latency_path, latency_class);
        }
        let _ = (latency_class, cx);
        false
    }

    /// Tasks on the channels' readers list now (for tests).
    #[cfg(test)]
    pub(crate) fn readers_listed(&self) -> usize {
        self.rx.readers.len() + self.rx.latency_readers.len()
    }

    /// How socket `sid` receives now ([`RxPath`]).
    pub(crate) fn rx_path(shard: &Shard, sid: SocketId) -> RxPath {
        let latency_class = shard.ep.app_class(sid) == Some(crate::AppClass::Latency);
        RxPath {
            latency_path: latency_class || shard.load.is_light(),
            latency_class,
        }
    }

    /// A read that waited returned bytes: its task no longer waits, so it leaves the
    /// readers' lists (the channels' hand-off, [`RxSignal`], and the queues' descriptors,
    /// `rx_poll`), where an arrival would otherwise pick it and wake nobody who reads.
    /// `path`: how the socket receives now, as [`Core::want_rx`] decides.
    pub(crate) fn read_wait_over(&self, cx: &mut Context<'_>, path: RxPath) {
        let w = cx.waker();
        self.rx.side(path.latency_class).0.remove(w);
        #[cfg(target_os = "linux")]
        if let Some(rt) = &self.rt_rx {
            let _round = RuntimeRound::enter(w);
            rt.leave(w, path.latency_path, path.latency_class);
        }
        let _ = path;
    }

    /// Starts a graceful stop: no new channels, connects, binds or accepts (listeners
    /// stop listening, their queued connections are reset); every open stream's write
    /// side is shut (a FIN after its bytes). The driver then waits until everything is
    /// delivered, closes the channels (a FIN after their bytes) and stops once the peers
    /// have seen their end, or at `now + linger`, aborting what is left. A second call
    /// can only bring the deadline forward. Does not block.
    pub(crate) fn begin_stop(&self, linger: Duration) {
        let deadline = Instant::now() + linger;
        let mut ctl = self.ctl();
        if ctl.stopped {
            return;
        }
        if let Some(s) = &mut ctl.stopping {
            s.deadline = s.deadline.min(deadline);
            drop(ctl);
            self.signal.notify();
            return;
        }
        debug!(?linger, "stopping the stack gracefully");
        ctl.stopping = Some(Stopping {
            deadline,
            closed: false,
        });
        self.refusing.store(true, Ordering::Release);
        let acceptor = ctl.acceptor.take();
        for inc in ctl.incoming.drain(..) {
            inc.t.abort();
        }
        let mut wake = Vec::new();
        for p in ctl.peers.values_mut() {
            if let Opening::Running { waiters, .. } = &mut p.opening {
                waiters.drain(..).for_each(|w| wake.push(w));
            }
        }
        let mut fin = Finish::default();
        for i in 0..self.shards.len() {
            let mut s = self.lock_shard(i);
            for port in s.ep.listening_ports() {
                let _ = s.ep.unbind(port);
            }
            for l in s.listeners.values_mut() {
                wake.extend(l.take());
            }
            let sids: Vec<SocketId> = s.socks.keys().copied().collect();
            for sid in sids {
                let _ = s.ep.shutdown(sid);
            }
            for w in s.socks.values_mut() {
                wake.extend(w.read.take());
                wake.extend(w.write.take());
            }
            self.finish_shard(s, &mut fin, &self.chans.load());
        }
        drop(ctl);
        fin.run();
        drop(acceptor);
        wake.into_iter().for_each(Waker::wake);
        self.signal.notify();
    }

    /// Bytes not yet delivered to peers: the endpoints', those on the way to and in the
    /// channels (queued, unsent or unacknowledged), and those of gracefully closed
    /// plain-TCP channels (the control lock held).
    fn pending_tx_bytes_locked(&self, ctl: &Control) -> usize {
        let mut n = 0;
        self.each_shard(|_, s| n += s.ep.pending_tx_bytes());
        for c in self.chans.load().values() {
            n += c.tx_pending_bytes.load(Ordering::Relaxed) + channel_pending(c.t.as_ref());
        }
        for c in &ctl.closing_plain {
            n += channel_pending(c.t.as_ref());
        }
        n
    }

    /// [`Stack::pending_tx_bytes`](super::Stack::pending_tx_bytes).
    pub(crate) fn pending_tx_bytes(&self) -> usize {
        let ctl = self.ctl();
        self.pending_tx_bytes_locked(&ctl)
    }

    /// Whether the stack holds nothing undelivered (one reading of
    /// [`Core::pending_tx_bytes`]).
    pub(crate) fn nothing_pending(&self) -> bool {
        self.pending_tx_bytes() == 0
    }

    /// Polls a wait for `goal`; `id` names the wait (given out on its first poll).
    pub(crate) fn poll_wait(
        &self,
        goal: Goal,
        id: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let mut ctl = self.ctl();
        let pos = id.and_then(|i| ctl.waiters.iter().position(|w| w.id == i));
        let reached = ctl.stopped
            || pos.is_some_and(|p| ctl.waiters[p].reached)
            || (goal == Goal::NoChannels
                && self.chans.load().is_empty()
                && ctl.closing_chans.is_empty())
            || goal == Goal::Channels(self.chans.load().len())
            || matches!(goal, Goal::Plans(k) if ctl.plans.counters.plans >= k);
        if reached {
            if let Some(p) = pos {
                ctl.waiters.swap_remove(p);
            }
            *id = None;
            return Poll::Ready(());
        }
        let w = cx.waker();
        match pos {
            Some(p) => {
                let slot = &mut ctl.waiters[p].waker;
                if !slot.as_ref().is_some_and(|old| old.will_wake(w)) {
                    *slot = Some(w.clone());
                }
            }
            None => {
                let i = ctl.next_waiter;
                ctl.next_waiter += 1;
                ctl.waiters.push(Waiter {
                    id: i,
                    goal,
                    waker: Some(w.clone()),
                    reached: false,
                });
                *id = Some(i);
            }
        }
        drop(ctl);
        // The driver reads the figures now and on its re-check timer.
        self.signal.notify();
        Poll::Pending
    }

    /// Forgets a wait that is dropped before it ended.
    pub(crate) fn cancel_wait(&self, id: u64) {
        self.ctl().waiters.retain(|w| w.id != id);
    }

    /// The driver thread's loop, until [`Signal::stop`] or the end of a graceful stop.
    pub(crate) fn run(self: Arc<Self>) {
        let _ = self.signal.thread.set(std::thread::current());
        let waker = Waker::from(self.signal.clone());
        let mut cx = Context::from_waker(&waker);
        let mut fin = Finish::default();
        let mut handed_seen = 0;
        let mut active_until: Option<Instant> = None;
        let mut slack = netdriver::time::TimerSlack::new();
        loop {
            self.signal.notified.store(false, Ordering::SeqCst);
            if self.signal.stop.load(Ordering::Acquire) {
                break;
            }
            // The round below pulls every channel: it pays any debt a reader left.
            self.rx.pay(RxScope::All);
            let (busy, deadline, done) = self.round(&mut cx, &mut fin);
            fin.run();
            if done {
                break;
            }
            if busy {
                continue;
            }
            let now = Instant::now();
            let handed = self.rx.handed.load(Ordering::Relaxed);
            if handed != handed_seen {
                handed_seen = handed;
                active_until = Some(now + ACTIVE_WINDOW);
            }
            let mut timed = active_until.is_some_and(|t| now < t);
            if !timed {
                self.signal.deep.store(true, Ordering::SeqCst);
                if self.rx.owed_any() {
                    timed = true;
                    self.signal.deep.store(false, Ordering::SeqCst);
                }
            }
            let (deadline, fallback) = if timed {
                let fallback = now + PULL_FALLBACK;
                match deadline {
                    Some(d) if d < fallback => (Some(d), false),
                    _ => (Some(fallback), true),
                }
            } else {
                (deadline, false)
            };
            // The fallback may come a timer tick late, with a tick the core takes anyway
            // (`netdriver::time::FALLBACK_SLACK`); the driver's own timers an eighth of
            // their wait.
            if let Some(d) = deadline {
                slack.set(if fallback {
                    netdriver::time::FALLBACK_SLACK
                } else {
                    netdriver::time::timer_slack(d.saturating_duration_since(now))
                });
            }
            while !self.signal.notified.load(Ordering::Acquire) {
                match deadline {
                    Some(d) => {
                        let now = Instant::now();
                        if now >= d {
                            break;
                        }
                        std::thread::park_timeout(d - now);
                    }
                    None => std::thread::park(),
                }
            }
            self.signal.deep.store(false, Ordering::SeqCst);
        }
        self.stop_now(&mut fin);
        fin.run();
        debug!("stack driver stopped");
    }

    /// One driver round; returns whether work is left over (run again without parking),
    /// when it wants to run next, and whether the driver should stop now.
    fn round(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        fin: &mut Finish,
    ) -> (bool, Option<Instant>, bool) {
        // New channels, their preambles, plain-TCP channels closing.
        let mut busy = {
            let mut ctl = self.ctl();
            let busy = self.accept_channels(&mut ctl, cx);
            ctl.poll_closing_plain(cx);
            busy
        };
        // Every channel's arrivals, to their shards.
        let mut touched = ShardSet::default();
        let r = self.receive_all(Sweep::Every, &mut touched);
        busy |= r.more;
        // Every shard's output, events and timers.
        let now = Instant::now();
        let mut deadline = None;
        let table = self.chans.load_full();
        for i in 0..self.shards.len() {
            // A shard an application call holds is not waited for: the call ends by
            // moving the shard's output and events itself; its timers run next time.
            let Some(mut s) = self.try_lock_shard(i) else {
                deadline = earliest(deadline, Some(now + SHARD_RETRY));
                continue;
            };
            busy |= s.transmit_all(&table, cx, TxLocks::Skip);
            busy |= s.drain_events(&mut fin.wake);
            deadline = earliest(deadline, s.expire(now, &mut fin.wake));
            // A socket reset by a timer queued a RESET: send it now.
            busy |= s.transmit_all(&table, cx, TxLocks::Skip);
            busy |= s.drain_events(&mut fin.wake);
            // A channel's tx lock was held: what this shard has for it goes next time.
            if s.take_tx_skipped() {
                deadline = earliest(deadline, Some(now + SHARD_RETRY));
            }
            #[cfg(target_os = "linux")]
            fin.take_kicks(&mut s.kicks);
        }
        drop(table);
        let mut ctl = self.ctl();
        if self.reap_dead(&mut ctl) {
            busy = true;
        }
        if !ctl.reopen.is_empty() {
            self.reopen_channels(&mut ctl);
        }
        deadline = earliest(deadline, ctl.expire(now));
        deadline = earliest(deadline, self.run_plans(&mut ctl, now));
        let (done, check) = self.check_waiters(&mut ctl, now, cx, &mut fin.wake);
        (busy, earliest(deadline, check), done)
    }

    /// Accepts channels on the channel port and runs their handshakes (the control lock
    /// held); returns whether any joined.
    fn accept_channels(&self, ctl: &mut Control, cx: &mut Context<'_>) -> bool {
        let mut busy = false;
        let mut acceptor = ctl.acceptor.take();
        while let Some(a) = acceptor.as_ref() {
            match a.poll_accept(cx) {
                Poll::Ready(Ok((t, peer))) => {
                    if ctl.incoming.len() >= MAX_PENDING_PREAMBLES {
                        let oldest = (0..ctl.incoming.len())
                            .min_by_key(|&i| ctl.incoming[i].deadline)
                            .expect("not empty");
                        let inc = ctl.incoming.swap_remove(oldest);
                        debug!(peer = %inc.peer, "too many channels without a preamble; aborting the oldest");
                        inc.t.abort();
                        ctl.dropped_channels += 1;
                    }
                    let deadline = Instant::now() + ctl.preamble_timeout;
                    ctl.incoming.push(Incoming {
                        t,
                        peer,
                        got: Vec::new(),
                        stage: Stage::Preamble,
                        deadline,
                    })
                }
                Poll::Ready(Err(e)) => {
                    warn!(error = %e, "channel listener failed; no more incoming channels");
                    acceptor = None;
                }
                Poll::Pending => break,
            }
        }
        ctl.acceptor = acceptor;
        let mut i = 0;
        while i < ctl.incoming.len() {
            match ctl.poll_incoming(i, cx) {
                Some(true) => match ctl.judge_incoming(i) {
                    Verdict::Challenged => {}
                    Verdict::Reject { why, auth } => {
                        let inc = ctl.incoming.swap_remove(i);
                        // A peer can open channels at line rate: a few lines a second.
                        static REFUSED: netdriver::log_limit::LogLimit =
                            netdriver::log_limit::LogLimit::new(5);
                        if let Some(suppressed) = REFUSED.check() {
                            warn!(peer = %inc.peer, why, suppressed, "channel refused; aborting it");
                        }
                        inc.t.abort();
                        ctl.dropped_channels += 1;
                        ctl.auth_failures += u64::from(auth);
                    }
                    Verdict::Join { class, consumed } => {
                        let inc = ctl.incoming.swap_remove(i);
                        let ip = *inc.peer.ip();
                        let peer = ctl.peer_id(ip);
                        let leftover = (inc.got.len() > consumed)
                            .then(|| Bytes::copy_from_slice(&inc.got[consumed..]));
                        debug!(peer = %inc.peer, ?class, "channel accepted");
                        self.add_channel(ctl, inc.t, ip, peer, class, leftover);
                        busy = true;
                    }
                },
                Some(false) => {
                    let inc = ctl.incoming.swap_remove(i);
                    inc.t.abort();
                }
                None => i += 1,
            }
        }
        busy
    }

    /// Wakes the tasks whose [`Goal`] is reached and runs a graceful stop: reads
    /// `pending_tx_bytes` (at most every [`DRAIN_RECHECK`]) while anyone waits or the
    /// stack is stopping. Returns whether the driver should stop now, and when it wants
    /// to look again.
    fn check_waiters(
        &self,
        ctl: &mut Control,
        now: Instant,
        cx: &mut Context<'_>,
        wake: &mut Wakes,
    ) -> (bool, Option<Instant>) {
        let waiting = ctl.waiters.iter().any(|w| !w.reached);
        if !waiting && ctl.stopping.is_none() {
            ctl.zero_checks = 0;
            ctl.next_check = None;
            return (false, None);
        }
        if ctl.next_check.is_none_or(|t| now >= t) {
            if self.pending_tx_bytes_locked(ctl) == 0 {
                ctl.zero_checks = ctl.zero_checks.saturating_add(1);
            } else {
                ctl.zero_checks = 0;
            }
            ctl.next_check = Some(now + DRAIN_RECHECK);
        }
        let drained = ctl.zero_checks >= 2;
        // A graceful stop: once everything is delivered, close the channels (a FIN
        // after their bytes; the peer reads what they still hold, then their end) and
        // wait for each peer to answer with its own end or a reset.
        let mut done = false;
        if let Some(stopping) = &ctl.stopping {
            let (deadline, closed) = (stopping.deadline, stopping.closed);
            if !closed && drained {
                self.close_channels(ctl, wake);
            }
            let closed = closed || drained;
            if closed {
                ctl.closing_chans.retain(|c| loop {
                    match c.t.poll_dequeue(cx) {
                        Poll::Ready(Ok(Some(_))) => continue,
                        Poll::Ready(Ok(None)) | Poll::Ready(Err(_)) => break false,
                        Poll::Pending => break true,
                    }
                });
                if ctl.closing_chans.is_empty() {
                    debug!("stack drained and its channels closed; stopping");
                    ctl.stop_outcome = Some(StopOutcome::Drained);
                    done = true;
                }
            }
            if !done && now >= deadline {
                let pending = self.pending_tx_bytes_locked(ctl);
                warn!(
                    pending,
                    closing_channels = ctl.closing_chans.len(),
                    "linger time is up; aborting what the stack has not delivered"
                );
                ctl.stop_outcome = Some(StopOutcome::Expired { pending });
                done = true;
            }
            if let Some(s) = &mut ctl.stopping {
                s.closed = closed;
            }
        }
        let mut next = None;
        let no_channels = self.chans.load().is_empty() && ctl.closing_chans.is_empty();
        let (channels, plans) = (self.chans.load().len(), ctl.plans.counters.plans);
        for w in ctl.waiters.iter_mut().filter(|w| !w.reached) {
            let reached = match w.goal {
                Goal::Drained => drained,
                Goal::NoChannels => no_channels,
                Goal::Channels(n) => channels == n,
                Goal::Plans(k) => plans >= k,
                Goal::Stopped => false,
            };
            if reached {
                w.reached = true;
                wake.extend(w.waker.take());
            } else if w.goal == Goal::Drained {
                next = ctl.next_check;
            }
        }
        if let Some(s) = &ctl.stopping {
            next = earliest(earliest(next, ctl.next_check), Some(s.deadline));
        }
        (done, next)
    }

    /// Closes every channel gracefully for a stop (everything was delivered): its
    /// sockets lose it like a lost channel (sockets whose peer's stream is complete keep
    /// their bytes), the channel sends a FIN after what it holds and is kept in
    /// `closing_chans` until the peer answers.
    fn close_channels(&self, ctl: &mut Control, wake: &mut Wakes) {
        let ids: Vec<ChannelId> = self.chans.load().keys().copied().collect();
        for id in ids {
            let Some(c) = self.unlist_channel(id) else {
                continue;
            };
            self.each_shard(|_, s| {
                s.ep.abandon_channel(id);
                s.forget_channel(id);
            });
            debug!(channel = %id, peer = %c.peer, "closing the channel");
            c.t.close();
            if let Some(p) = ctl.peers.get_mut(&c.peer) {
                match c.class {
                    ChannelClass::Throughput => p.throughput -= 1,
                    ChannelClass::Latency => p.latency -= 1,
                }
            }
            ctl.closing_chans.push(c);
        }
        self.each_shard(|_, s| {
            s.drain_events(wake);
        });
    }

    /// The end of the driver: every channel is abandoned, and every task waiting on the
    /// stack woken (their calls now fail).
    fn stop_now(&self, fin: &mut Finish) {
        let mut ctl = self.ctl();
        ctl.stopped = true;
        self.refusing.store(true, Ordering::Release);
        if ctl.stop_outcome.is_none() {
            ctl.stop_outcome = Some(StopOutcome::Aborted);
        }
        let ids: Vec<ChannelId> = self.chans.load().keys().copied().collect();
        for id in ids {
            self.lose_channel(&mut ctl, id, Gone::Abandoned);
        }
        for inc in ctl.incoming.drain(..) {
            inc.t.abort();
        }
        for c in ctl.closing_chans.drain(..) {
            c.t.abort();
        }
        for w in &mut ctl.waiters {
            w.reached = true;
            fin.wake.extend(w.waker.take());
        }
        let acceptor = ctl.acceptor.take();
        for p in ctl.peers.values_mut() {
            if let Opening::Running { waiters, .. } = &mut p.opening {
                waiters.drain(..).for_each(|w| fin.wake.push(w));
            }
        }
        self.each_shard(|_, s| {
            s.stopped = true;
            s.drain_events(&mut fin.wake);
            s.wake_all(&mut fin.wake);
            #[cfg(target_os = "linux")]
            fin.take_kicks(&mut s.kicks);
        });
        drop(ctl);
        drop(acceptor);
    }

    /// The address of a peer.
    pub(crate) fn peer_ip(&self, id: PeerId) -> Option<Ipv4Addr> {
        self.ctl().peer_ips.get(&id).copied()
    }

    /// Channels held now.
    pub(crate) fn channel_count(&self) -> usize {
        self.chans.load().len()
    }

    /// Resets the `n`-th channel held (in id order) as a failed connection: see
    /// [`Stack::reset_channel`](super::Stack::reset_channel).
    pub(crate) fn reset_channel(&self, n: usize) -> bool {
        let mut ctl = self.ctl();
        let Some(id) = self.chans.load().keys().nth(n).copied() else {
            return false;
        };
        warn!(channel = %id, "resetting a channel (fault injection)");
        self.lose_channel(&mut ctl, id, Gone::Lost);
        drop(ctl);
        // The lost channel's chunks are in other channels' outboxes now.
        let mut fin = Finish::default();
        let table = self.chans.load();
        for i in 0..self.shards.len() {
            self.finish_shard(self.lock_shard(i), &mut fin, &table);
        }
        drop(table);
        self.signal.notify();
        fin.run();
        true
    }

    /// Keeps a plain-TCP channel closed gracefully (its stream dropped) until its bytes
    /// and FIN are acknowledged and the peer's FIN is in, for `pending_tx_bytes` and to
    /// reset it if data arrives; at most the endpoint's `linger_timeout`, then it is reset
    /// (counted in `plain_linger_expired`). Wakes the driver, which watches the channel.
    pub(crate) fn keep_closing_plain(&self, t: BoxedTransport) {
        let mut ctl = self.ctl();
        let deadline = Instant::now() + ctl.linger_timeout;
        ctl.closing_plain.push(ClosingPlain {
            t,
            deadline,
            finished: false,
        });
        drop(ctl);
        self.signal.notify();
    }
}

pub(crate) fn stopped_error() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the stack was shut down")
}

impl Control {
    /// Whether new channels, connects, binds and accepts are refused: the stack has
    /// stopped or is stopping.
    pub(crate) fn refuses_new(&self) -> bool {
        self.stopped || self.stopping.is_some()
    }

    /// The id of the peer at `ip` (created on first use).
    fn peer_id(&mut self, ip: Ipv4Addr) -> PeerId {
        if let Some(p) = self.peers.get(&ip) {
            return p.id;
        }
        let id = PeerId(self.next_peer);
        self.next_peer += 1;
        self.peers.insert(
            ip,
            Peer {
                id,
                throughput: 0,
                latency: 0,
                opening: Opening::Idle,
                opened: false,
            },
        );
        self.peer_ips.insert(id, ip);
        id
    }

    /// Watches the plain-TCP channels closed gracefully (their streams dropped): a chunk
    /// arriving now has no reader, so the connection is reset, as a kernel resets a
    /// closed socket that receives data; one whose peer's FIN came and whose bytes are
    /// all acknowledged is let go (closed, not aborted).
    fn poll_closing_plain(&mut self, cx: &mut Context<'_>) {
        self.closing_plain.retain_mut(|c| {
            while !c.finished {
                match c.t.poll_dequeue(cx) {
                    Poll::Ready(Ok(Some(_))) => {
                        debug!("data for a closed plain-TCP stream; resetting");
                        c.t.abort();
                        return false;
                    }
                    Poll::Ready(Ok(None)) => c.finished = true,
                    Poll::Ready(Err(_)) => return false,
                    Poll::Pending => break,
                }
            }
            !(c.finished && channel_pending(c.t.as_ref()) == 0)
        });
    }

    /// Reads what the accepted channel's handshake needs at its stage; `Some(true)` when
    /// it is all there, `Some(false)` when the channel died.
    fn poll_incoming(&mut self, i: usize, cx: &mut Context<'_>) -> Option<bool> {
        let inc = &mut self.incoming[i];
        loop {
            let need = match inc.stage {
                Stage::Challenged { .. } => PREAMBLE_LEN + auth::NONCE_LEN + auth::TAG_LEN,
                Stage::Preamble
                    if inc.got.len() >= PREAMBLE_LEN && inc.got[6] & auth::FLAG_AUTH != 0 =>
                {
                    PREAMBLE_LEN + auth::NONCE_LEN
                }
                Stage::Preamble => PREAMBLE_LEN,
            };
            if inc.got.len() >= need {
                return Some(true);
            }
            match inc.t.poll_dequeue(cx) {
                Poll::Ready(Ok(Some(b))) => inc.got.extend_from_slice(&b),
                Poll::Ready(Ok(None)) | Poll::Ready(Err(_)) => return Some(false),
                Poll::Pending => return None,
            }
        }
    }
    /// Decides on accepted channel `i`, whose handshake bytes for its stage are all in:
    /// parses its preamble, sends our challenge when it authenticates, checks its tag.
    fn judge_incoming(&mut self, i: usize) -> Verdict {
        let key = self.channel_key.clone();
        let inc = &mut self.incoming[i];
        match inc.stage {
            Stage::Preamble => {
                let Some((class, flags)) = parse_preamble(&inc.got) else {
                    return Verdict::Reject {
                        why: "bad channel preamble",
                        auth: false,
                    };
                };
                let wants_auth = flags & auth::FLAG_AUTH != 0;
                match (key, wants_auth) {
                    (None, false) => Verdict::Join {
                        class,
                        consumed: PREAMBLE_LEN,
                    },
                    (Some(_), false) => Verdict::Reject {
                        why: "unauthenticated channel, and this stack has a channel key",
                        auth: true,
                    },
                    (None, true) => Verdict::Reject {
                        why:
                            "the peer authenticates its channels, and this stack has no channel key",
                        auth: true,
                    },
                    (Some(key), true) => {
                        let mut nc = [0u8; auth::NONCE_LEN];
                        nc.copy_from_slice(&inc.got[PREAMBLE_LEN..PREAMBLE_LEN + auth::NONCE_LEN]);
                        let Ok(ns) = auth::nonce() else {
                            return Verdict::Reject {
                                why: "no randomness for a nonce",
                                auth: false,
                            };
                        };
                        let tag = key.accept_tag(&nc, &ns, class_byte(class));
                        let mut challenge = Vec::with_capacity(auth::NONCE_LEN + auth::TAG_LEN);
                        challenge.extend_from_slice(&ns);
                        challenge.extend_from_slice(&tag);
                        if inc.t.enqueue(Bytes::from(challenge)).is_err() {
                            return Verdict::Reject {
                                why: "channel failed before its challenge",
                                auth: false,
                            };
                        }
                        inc.stage = Stage::Challenged { class, nc, ns };
                        Verdict::Challenged
                    }
                }
            }
            Stage::Challenged { class, nc, ns } => {
                let at = PREAMBLE_LEN + auth::NONCE_LEN;
                let tag = &inc.got[at..at + auth::TAG_LEN];
                match key {
                    Some(key) if key.verify_open(&nc, &ns, class_byte(class), tag) => {
                        Verdict::Join {
                            class,
                            consumed: at + auth::TAG_LEN,
                        }
                    }
                    _ => Verdict::Reject {
                        why: "channel authentication failed (wrong key)",
                        auth: true,
                    },
                }
            }
        }
    }

    /// Aborts accepted channels whose preamble did not come in time and closed plain-TCP
    /// channels past their linger deadline; returns the next such deadline.
    fn expire(&mut self, now: Instant) -> Option<Instant> {
        let mut next = None;
        let mut i = 0;
        while i < self.incoming.len() {
            let d = self.incoming[i].deadline;
            if d <= now {
                let inc = self.incoming.swap_remove(i);
                debug!(peer = %inc.peer, "no channel preamble in time; aborting the channel");
                inc.t.abort();
                self.dropped_channels += 1;
            } else {
                next = Some(next.map_or(d, |n: Instant| n.min(d)));
                i += 1;
            }
        }
        let plain_linger_expired = &mut self.plain_linger_expired;
        self.closing_plain.retain(|c| {
            if c.deadline <= now {
                debug!("closed plain-TCP stream lingered too long; resetting");
                c.t.abort();
                *plain_linger_expired += 1;
                return false;
            }
            next = Some(next.map_or(c.deadline, |n: Instant| n.min(c.deadline)));
            true
        });
        next
    }

    /// Plain-TCP channels closed gracefully and still finishing.
    pub(crate) fn closing_plain(&self) -> usize {
        self.closing_plain.len()
    }
}

/// The earlier of two optional deadlines.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Runs a channel wake-up an enqueue handed back: inline transmit allowed or not.
#[cfg(target_os = "linux")]
fn run_kick((kick, mode): (netdriver::channel::DeferredKick, super::shard::KickMode)) {
    match mode {
        super::shard::KickMode::InlineIfQuiet => kick.run(),
        super::shard::KickMode::Inline => kick.run_now(),
    }
}

/// A plain-TCP channel closed gracefully whose stream is gone.
struct ClosingPlain {
    t: BoxedTransport,
    /// Reset if not finished by then.
    deadline: Instant,
    /// The peer's FIN came (every byte it sent was dequeued).
    finished: bool,
}

/// Bytes a channel holds towards its peer: queued, in TCP's send buffer or unacknowledged.
fn channel_pending(t: &dyn ChannelTransport) -> usize {
    let s = t.stats();
    s.tx_queued + s.tx_tcp_queued.max(s.bytes_in_flight)
}

pub(crate) fn lost(id: ChannelId, e: ChannelError) -> Result<bool, Gone> {
    debug!(channel = %id, error = %e, "channel cannot send");
    Err(Gone::of(&e))
}

/// Why a channel is dropped: its sockets fail with `PeerUnreachable` (`TimedOut`) when
/// the transport gave up on a silent peer (keep-alive probes or the user timeout ran
/// out), with `ChannelLost` otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gone {
    /// The transport gave up on a silent peer.
    TimedOut,
    /// Reset, failed, or poisoned by bad bytes.
    Lost,
    /// The peer closed it (end of stream): with its last channel, the peer is stopping.
    Closed,
    /// This stack gives it up (abort).
    Abandoned,
}

impl Gone {
    pub(crate) fn of(e: &ChannelError) -> Gone {
        match e {
            ChannelError::TimedOut => Gone::TimedOut,
            _ => Gone::Lost,
        }
    }

    /// A non-zero code, for an atomic.
    pub(crate) fn code(self) -> u8 {
        match self {
            Gone::TimedOut => 1,
            Gone::Lost => 2,
            Gone::Closed => 3,
            Gone::Abandoned => 4,
        }
    }

    pub(crate) fn from_code(c: u8) -> Option<Gone> {
        match c {
            1 => Some(Gone::TimedOut),
            2 => Some(Gone::Lost),
            3 => Some(Gone::Closed),
            4 => Some(Gone::Abandoned),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the wake-ups of a task.
    #[derive(Default)]
    struct CountingWaker(AtomicU64);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn rx_signal() -> Arc<RxSignal> {
        rx_signal_split(false)
    }

    /// The count of ready-marked channels follows the marks: one for a new channel (it
    /// starts ready), none once read, one again after arrivals however many, none once
    /// the channel is gone; a pull of the ready channels skips the table at zero.
    #[test]
    fn ready_channels_are_counted_with_their_marks() {
        let rx = rx_signal();
        let count = |rx: &RxSignal| rx.ready_chans.load(Ordering::SeqCst);
        let w = super::super::chan::ChanRxWake::new(
            rx.clone(),
            std::sync::Weak::new(),
            netsched::ChannelClass::Throughput,
        );
        assert_eq!(count(&rx), 1, "a new channel is ready");
        assert!(w.take_ready());
        assert!(!w.take_ready());
        assert_eq!(count(&rx), 0);
        let waker = Waker::from(w.clone());
        waker.wake_by_ref();
        waker.wake_by_ref();
        assert_eq!(count(&rx), 1, "two arrivals, one mark");
        assert!(w.take_ready());
        assert_eq!(count(&rx), 0);
        waker.wake_by_ref();
        drop(waker);
        drop(w);
        assert_eq!(count(&rx), 0, "a channel gone with its mark");
    }

    fn rx_signal_split(split: bool) -> Arc<RxSignal> {
        Arc::new(RxSignal {
            signal: Arc::new(Signal::default()),
            readers: crate::stack::waker_list::WakerList::new(MAX_RX_READERS),
            owed: AtomicBool::new(false),
            latency_readers: crate::stack::waker_list::WakerList::new(MAX_RX_READERS),
            latency_owed: AtomicBool::new(false),
            split,
            handed: AtomicU64::new(0),
            ready_chans: AtomicUsize::new(0),
        })
    }

    /// Where the classes are kept apart, an arrival on a latency channel wakes a task of
    /// a latency-class socket and one on a throughput channel a bulk task, each whatever
    /// the order they waited in; each class's debt is its own, and a pull of one class
    /// pays only its own (its scope reads only that class's channels). Without the split
    /// there is one list, one debt, and every pull reads every ready channel.
    #[test]
    fn with_classes_apart_an_arrival_wakes_a_reader_of_its_class() {
        let lat = Arc::new(CountingWaker::default());
        let bulk = Arc::new(CountingWaker::default());
        let (lat_w, bulk_w) = (Waker::from(lat.clone()), Waker::from(bulk.clone()));
        let rx = rx_signal_split(true);
        assert_eq!(rx.scope(true), RxScope::Latency);
        assert_eq!(rx.scope(false), RxScope::Throughput);
        assert!(RxScope::Latency.covers(ChannelClass::Latency));
        assert!(!RxScope::Latency.covers(ChannelClass::Throughput));
        assert!(!RxScope::Throughput.covers(ChannelClass::Latency));
        rx.side(true).0.push(&lat_w, false);
        rx.side(false).0.push(&bulk_w, false);
        // The bulk task waited last; a latency arrival still wakes the latency task.
        rx.arrival(true);
        assert_eq!(lat.0.load(Ordering::SeqCst), 1);
        assert_eq!(bulk.0.load(Ordering::SeqCst), 0);
        assert!(rx.owed_in(RxScope::Latency) && !rx.owed_in(RxScope::Throughput));
        // With no latency task left, a latency arrival wakes the driver, not a bulk task.
        rx.arrival(true);
        assert_eq!(bulk.0.load(Ordering::SeqCst), 0);
        assert!(rx.signal.notified.load(Ordering::SeqCst));
        rx.arrival(false);
        assert_eq!(bulk.0.load(Ordering::SeqCst), 1);
        assert!(rx.owed_in(RxScope::Throughput));
        rx.pay(RxScope::Latency);
        assert!(!rx.owed_in(RxScope::Latency) && rx.owed_in(RxScope::Throughput));
        assert!(rx.owed_any());
        rx.pay(RxScope::All);
        assert!(!rx.owed_any());

        let one = rx_signal_split(false);
        assert_eq!(
            (one.scope(true), one.scope(false)),
            (RxScope::All, RxScope::All)
        );
        one.side(false).0.push(&bulk_w, false);
        one.arrival(true);
        assert_eq!(
            bulk.0.load(Ordering::SeqCst),
            2,
            "one list for both classes"
        );
        assert!(one.owed_in(RxScope::All));
    }

    /// An arrival made by a receive round that a waiting task runs itself
    /// (`Core::want_rx`) is that task's to pull: waking it from inside its own poll made
    /// tokio count it as a yield and wake a second worker, once per message (seen as a
    /// `write` to the runtime's eventfd per exchange). Outside the round, or for another
    /// task, the arrival still wakes the reader, and the debt is recorded either way.
    #[test]
    fn a_runtime_round_does_not_wake_the_task_running_it() {
        let me = Arc::new(CountingWaker::default());
        let other = Arc::new(CountingWaker::default());
        let (me_w, other_w) = (Waker::from(me.clone()), Waker::from(other.clone()));
        let rx = rx_signal();

        rx.readers.push(&me_w, false);
        {
            let _round = RuntimeRound::enter(&me_w);
            rx.wake_by_ref();
        }
        assert_eq!(me.0.load(Ordering::SeqCst), 0, "woken from its own round");
        assert!(
            rx.owed.load(Ordering::SeqCst),
            "the arrival is still owed a pull"
        );
        assert_eq!(rx.readers.len(), 0);

        // Another task's wait is served as before, inside the round too.
        rx.readers.push(&other_w, false);
        {
            let _round = RuntimeRound::enter(&me_w);
            rx.wake_by_ref();
        }
        assert_eq!(other.0.load(Ordering::SeqCst), 1);

        // The mark ends with the round.
        rx.readers.push(&me_w, false);
        rx.wake_by_ref();
        assert_eq!(
            me.0.load(Ordering::SeqCst),
            1,
            "not woken after its round ended"
        );
    }

    /// An arrival that finds no reader waiting wakes the driver, except inside a round
    /// whose thread pulls right after: an application call's inline send
    /// ([`SendRound`], `Core::finish_call` pulls when told so) or a task's own receive
    /// round. Waking the driver there cost a futex wake and a context switch about once
    /// per exchange, since a task that just wrote is not waiting to read.
    #[test]
    fn an_arrival_in_a_send_round_is_left_to_the_sending_thread() {
        let rx = rx_signal();
        let round = SendRound::enter();
        rx.wake_by_ref();
        assert!(
            !rx.signal.notified.load(Ordering::SeqCst),
            "the driver was woken"
        );
        assert!(rx.owed.load(Ordering::SeqCst));
        assert!(round.left_arrivals(), "the sender was not told to pull");

        // Without an arrival the sender has nothing to pull.
        let round = SendRound::enter();
        assert!(!round.left_arrivals());

        // Outside any round the driver is woken, as before.
        rx.wake_by_ref();
        assert!(rx.signal.notified.load(Ordering::SeqCst));
    }

    #[test]
    fn preamble_round_trips_and_rejects_garbage() {
        for class in [ChannelClass::Throughput, ChannelClass::Latency] {
            assert_eq!(parse_preamble(&preamble(class, 0)), Some((class, 0)));
            assert_eq!(
                parse_preamble(&preamble(class, auth::FLAG_AUTH)),
                Some((class, auth::FLAG_AUTH))
            );
        }
        assert_eq!(parse_preamble(b"NCHN"), None);
        assert_eq!(parse_preamble(b"GET / HTTP/1.1"), None);
        let mut p = preamble(ChannelClass::Latency, 0);
        p[5] = 7;
        assert_eq!(parse_preamble(&p), None);
        p = preamble(ChannelClass::Latency, 0);
        p[4] = 2;
        assert_eq!(parse_preamble(&p), None);
    }
}
