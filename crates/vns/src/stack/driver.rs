//! The driver: one thread per stack that owns the channels and moves bytes between them
//! and the [`Endpoint`].
//!
//! The endpoint, the channel table and the tasks' wakers live in one [`State`] behind one
//! mutex ([`Core::lock`]). Application calls (`poll_read`, `poll_write`, ...) lock it,
//! call the endpoint and end with [`Core::finish_call`], which moves the call's output
//! into the channels from the calling thread. The driver locks it once per round to
//! accept channels, feed received chunks to [`Endpoint::handle_chunk_bytes`], push
//! [`Endpoint::poll_transmit_parts`] output into the channels, report channel loads and
//! losses, and turn endpoint events into task wake-ups (after unlocking). With nothing to
//! do it parks until a channel waker, an application call or a connect deadline wakes
//! it: no busy polling. Readers and blocked writers also pull received bytes themselves
//! ([`Core::pull`]), woken by the channels' receive waker ([`RxSignal`]) beside the
//! driver, so the receive path usually skips the driver's hand-off. One lock is the
//! simple, first version: it serialises application calls of different streams of a
//! stack (each call is short: a copy into or out of a socket buffer).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use netdriver::channel::{ChannelError, ChannelTransport, EnqueueError};
use netsched::{ChannelClass, ChannelId};
use tracing::{debug, trace, warn};

use super::auth;
use super::backend::{Acceptor, Backend, BoxedTransport};
use crate::endpoint::{ChannelLoad, Endpoint, Error as VnsError, Event, PeerId, SocketId};
use crate::wire::HEADER_LEN;

/// Bytes of `poll_transmit` output gathered per batch (headers, small chunks and the
/// large payloads enqueued beside them).
const TX_BATCH: usize = 256 * 1024;
/// Payloads up to this size are copied into the batch beside their header; larger ones
/// are enqueued as they are (shared with the socket's send buffer).
const INLINE_PAYLOAD: usize = 4 * 1024;
/// Batches up to this size are copied out of the driver's batch buffer, which is kept.
const SMALL_BATCH: usize = 16 * 1024;
/// Chunks read from one channel per driver round (fairness between channels and with
/// application calls, which wait for the lock).
const RX_BUDGET: usize = 64;
/// Batches written to one channel per driver round (in bytes: `TX_BUDGET * TX_BATCH`).
const TX_BUDGET: usize = 16;

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
    readers: Mutex<Vec<Waker>>,
    /// An arrival was handed to a reader and no pull has taken it yet.
    owed: AtomicBool,
    /// Arrivals handed to readers so far (the driver's activity measure).
    handed: AtomicU64,
}

/// Longest the driver sleeps while arrivals are recent, so that bytes handed to a reader
/// that never pulls them still reach their sockets.
const PULL_FALLBACK: Duration = Duration::from_millis(1);
/// How long after the last arrival handed to a reader the driver keeps sleeping with
/// [`PULL_FALLBACK`] (then untimed, woken by the next arrival).
const ACTIVE_WINDOW: Duration = Duration::from_millis(20);

/// How often the driver reads the stack's pending-bytes figure while a task waits for it
/// to reach zero ([`Stack::drained`](super::Stack::drained)) or the stack is stopping:
/// the channels' TCP acknowledgements do not wake the driver, so it re-reads them on this
/// timer (and after every round). Two readings of zero at least this far apart make a
/// drained stack (channel figures are snapshots their threads publish).
const DRAIN_RECHECK: Duration = Duration::from_millis(2);

/// What a task waits for ([`Core::poll_wait`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Goal {
    /// Nothing written is undelivered: `pending_tx_bytes` read 0 twice,
    /// [`DRAIN_RECHECK`] apart.
    Drained,
    /// The stack holds no channel.
    NoChannels,
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

/// Most reader wakers an [`RxSignal`] holds (more wait for the driver's wake-up).
const MAX_RX_READERS: usize = 64;

impl Wake for RxSignal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // One reader is enough: it feeds every socket's bytes to the endpoint and wakes
        // the other readers whose sockets became ready (no thundering herd).
        let reader = self.readers.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match reader {
            Some(w) => {
                self.owed.store(true, Ordering::SeqCst);
                self.handed.fetch_add(1, Ordering::Relaxed);
                w.wake();
                // Paired with the driver's store of `deep` then load of `owed`: either it
                // sees the debt before sleeping untimed, or this sees it asleep.
                if self.signal.deep.load(Ordering::SeqCst) {
                    self.signal.notify();
                }
            }
            None => self.signal.notify(),
        }
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
}

/// What the stack shares between its driver thread, its handles and its streams.
pub(crate) struct Core {
    state: Mutex<State>,
    pub(crate) signal: Arc<Signal>,
    rx: Arc<RxSignal>,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) config: CoreConfig,
    /// The backend's queues for tasks that wait on them in their runtime (`None`: no
    /// such queues, or turned off).
    #[cfg(target_os = "linux")]
    pub(crate) rt_rx: Option<super::rx_poll::RuntimeQueues>,
}

/// A stream's or connect's wakers.
#[derive(Debug, Default)]
pub(crate) struct SockWake {
    pub read: Option<Waker>,
    pub write: Option<Waker>,
    pub timed_out: bool,
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

struct ChanIo {
    t: BoxedTransport,
    peer: Ipv4Addr,
    class: ChannelClass,
    rx_pending: Option<Bytes>,
    /// Batches the channel refused (full), sent before anything new; with their length.
    tx_pending: VecDeque<Bytes>,
    tx_pending_bytes: usize,
    /// The last load reported to the endpoint was zero. Only this stack enqueues into
    /// the channel, so without new chunks its load can only have fallen since: a channel
    /// with nothing to send and this set needs neither a visit nor a fresh report.
    idle_reported: bool,
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

/// Everything behind the stack's lock.
pub(crate) struct State {
    pub ep: Endpoint,
    chans: BTreeMap<ChannelId, ChanIo>,
    incoming: Vec<Incoming>,
    peers: HashMap<Ipv4Addr, Peer>,
    peer_ips: HashMap<PeerId, Ipv4Addr>,
    next_channel: u32,
    next_peer: u32,
    next_attempt: u64,
    pub socks: HashMap<SocketId, SockWake>,
    pub listeners: HashMap<u16, Option<Waker>>,
    pub deadlines: BTreeMap<SocketId, Instant>,
    /// The driver has stopped: no channel will ever move again.
    pub stopped: bool,
    /// Plain-TCP channels closed gracefully whose streams are gone, watched until their
    /// bytes and FIN are acknowledged and the peer's FIN is in, or their linger deadline.
    closing_plain: Vec<ClosingPlain>,
    /// Closed plain-TCP channels reset because they were not finished within the
    /// endpoint's `linger_timeout` (bytes unacknowledged, or no FIN from the peer).
    pub plain_linger_expired: u64,
    /// Scratch space of [`State::transmit_all`]: the batch being gathered, channel ids.
    tx_buf: Vec<u8>,
    ids: Vec<ChannelId>,
    /// Channel chunks fed to the endpoint so far.
    received: u64,
    preamble_timeout: Duration,
    channel_key: Option<auth::ChannelKey>,
    /// Channel wake-ups (or inline transmits) that enqueues handed back, run by whoever
    /// releases the lock next ([`Core::finish_call`], the driver's round): a round of a
    /// channel thread, with its system call, never runs under the stack's lock.
    #[cfg(target_os = "linux")]
    /// With whether the channel may send inline: latency-class channels only. Measured
    /// on the 2-core bed (docs/performance.md): inline rounds save a sparse stream ~10 %
    /// of its latency and up to 25 % of one connection's request rate, but cost 25-35 %
    /// of the request rate at 32-128 connections, where the channel threads batch.
    kicks: Vec<(netdriver::channel::DeferredKick, bool)>,
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
    closing_chans: Vec<BoxedTransport>,
    /// How the driver stopped (`None` while it runs).
    pub stop_outcome: Option<StopOutcome>,
    /// Of those, channels that failed authentication (no, or a wrong, proof of the key;
    /// or asking to authenticate when this stack has no key).
    pub auth_failures: u64,
    /// Peers whose last channel was lost, to open channels to again (the driver thread
    /// starts the opening).
    reopen: Vec<Ipv4Addr>,
}

impl Core {
    pub(crate) fn new(
        ep: Endpoint,
        backend: Arc<dyn Backend>,
        config: CoreConfig,
        acceptor: Box<dyn Acceptor>,
    ) -> Core {
        let signal = Arc::new(Signal::default());
        Core {
            rx: Arc::new(RxSignal {
                signal: signal.clone(),
                readers: Mutex::new(Vec::new()),
                owed: AtomicBool::new(false),
                handed: AtomicU64::new(0),
            }),
            state: Mutex::new(State {
                ep,
                chans: BTreeMap::new(),
                incoming: Vec::new(),
                peers: HashMap::new(),
                peer_ips: HashMap::new(),
                next_channel: 0,
                next_peer: 0,
                next_attempt: 0,
                socks: HashMap::new(),
                listeners: HashMap::new(),
                deadlines: BTreeMap::new(),
                stopped: false,
                closing_plain: Vec::new(),
                plain_linger_expired: 0,
                tx_buf: Vec::with_capacity(SMALL_BATCH),
                ids: Vec::new(),
                received: 0,
                preamble_timeout: config.preamble_timeout,
                channel_key: config.channel_key.clone(),
                #[cfg(target_os = "linux")]
                kicks: Vec::new(),
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
            }),
            signal,
            #[cfg(target_os = "linux")]
            rt_rx: super::rx_poll::RuntimeQueues::new(backend.rx_pollers(), config.runtime_rx),
            backend,
            config,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
        let mut st = self.lock();
        if st.refuses_new() {
            return Poll::Ready(Err(stopped_error()));
        }
        let id = st.peer_id(ip);
        let next_attempt = st.next_attempt;
        let peer = st.peers.get_mut(&ip).expect("peer_id inserted it");
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
        st.next_attempt += 1;
        drop(st);
        let core = self.clone();
        let spawned = std::thread::Builder::new()
            .name("vns-open".into())
            .spawn(move || core.open_channels(ip, next_attempt));
        if let Err(e) = spawned {
            let mut st = self.lock();
            if let Some(p) = st.peers.get_mut(&ip) {
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
            match self.backend.connect(remote) {
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
            let mut st = self.lock();
            let peer = st.peer_id(ip);
            let mut n = 0;
            for (t, class, leftover) in opened {
                if !st.refuses_new() {
                    let id = ChannelId(st.next_channel);
                    st.add_channel(t, ip, peer, class);
                    if let (Some(b), Some(c)) = (leftover, st.chans.get_mut(&id)) {
                        c.rx_pending = Some(b);
                    }
                    n += 1;
                } else {
                    t.abort();
                }
            }
            debug!(%remote, channels = n, "channels opened");
            if n == 0 {
                // Sockets left without a channel by a loss wait for this opening; it
                // failed, so they fail now rather than at the end of their wait.
                st.ep.handle_peer_gone(peer, VnsError::ChannelLost);
            }
            let p = st.peers.get_mut(&ip).expect("peer_id inserted it");
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
    /// [`State::lose_channel`]), each in a helper thread like a first opening.
    fn reopen_channels(self: &Arc<Self>, st: &mut State) {
        for ip in std::mem::take(&mut st.reopen) {
            let attempt = st.next_attempt;
            let Some(p) = st.peers.get_mut(&ip) else {
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
            st.next_attempt += 1;
            let core = self.clone();
            let spawned = std::thread::Builder::new()
                .name("vns-open".into())
                .spawn(move || core.open_channels(ip, attempt));
            if let Err(e) = spawned {
                warn!(%ip, error = %e, "cannot start opening channels again");
                if let Some(p) = st.peers.get_mut(&ip) {
                    p.opening = Opening::Idle;
                }
                st.ep.handle_peer_gone(peer, VnsError::ChannelLost);
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

    /// Ends an application call that changed the endpoint, given the stack's lock: moves
    /// what the call queued (data, a credit update) into the channels from the calling
    /// thread, so that it does not wait for the driver to wake up; wakes the tasks whose
    /// sockets became ready; and wakes the driver only for work left over (a channel's
    /// round budget used up, channel reads to resume). A full channel wakes the driver
    /// through its own waker when it has room again.
    pub(crate) fn finish_call(&self, mut st: MutexGuard<'_, State>) {
        if st.stopped {
            return;
        }
        let waker = Waker::from(self.signal.clone());
        let mut cx = Context::from_waker(&waker);
        let mut wake = Vec::new();
        let mut more = st.transmit_all(&mut cx);
        more |= st.drain_events(&mut wake);
        // A channel lost in this call: the driver thread opens channels again.
        more |= !st.reopen.is_empty();
        #[cfg(target_os = "linux")]
        let kicks = std::mem::take(&mut st.kicks);
        drop(st);
        #[cfg(target_os = "linux")]
        kicks.into_iter().for_each(run_kick);
        wake.into_iter().for_each(Waker::wake);
        if more {
            self.signal.notify();
        }
    }

    /// A reader found nothing to read (or a writer no room): feeds what the channels hold
    /// to the endpoint from
    /// the calling thread (the driver may not have run yet). Returns whether any channel
    /// had bytes. The caller ends with [`Core::finish_call`] or [`Core::want_rx`].
    pub(crate) fn pull(&self, st: &mut State) -> bool {
        if st.stopped {
            return false;
        }
        // Whatever arrived before this point is taken now: the debt is paid.
        self.rx.owed.store(false, Ordering::SeqCst);
        let rx_waker = Waker::from(self.rx.clone());
        let mut rx_cx = Context::from_waker(&rx_waker);
        let before = st.received;
        if st.receive_all(&mut rx_cx) {
            self.signal.notify();
        }
        st.received != before
    }

    /// [`Core::pull`] if an arrival was handed to a reader and nobody has pulled since
    /// (the woken reader may not be this one): application calls start with it, so that
    /// the bytes reach their sockets without waiting for the driver's fallback.
    pub(crate) fn pull_owed(&self, st: &mut State) -> bool {
        self.rx.owed.load(Ordering::SeqCst) && self.pull(st)
    }

    /// Moves the endpoint's output into the channels from the calling thread (chunks cut
    /// from send buffers that new credit opened, see [`Core::finish_call`]).
    pub(crate) fn flush(&self, st: &mut State) {
        if st.stopped {
            return;
        }
        let waker = Waker::from(self.signal.clone());
        let mut cx = Context::from_waker(&waker);
        if st.transmit_all(&mut cx) {
            self.signal.notify();
        }
        // Under the caller's lock (a rare path: a blocked writer that pulled credit):
        // the kicks run now rather than wait for the caller's next release.
        #[cfg(target_os = "linux")]
        st.kicks.drain(..).for_each(run_kick);
    }

    /// Registers a task waiting to read (or to write: credit comes in on the receive
    /// side) for the next wake-up of a channel's receive side
    /// (see [`RxSignal`]), then ends the call like [`Core::finish_call`].
    ///
    /// Then, where the task's runtime waits on the AF_XDP queues itself (`rx_poll`), runs
    /// the rounds of queues with arrivals on this thread and waits on the rest. Returns
    /// whether it ran a round: the caller looks again before it returns `Pending` (or
    /// wakes its task to do so).
    pub(crate) fn want_rx(
        &self,
        st: MutexGuard<'_, State>,
        sid: SocketId,
        cx: &mut Context<'_>,
    ) -> bool {
        let latency = st.ep.app_class(sid) == Some(crate::AppClass::Latency);
        let w = cx.waker();
        {
            let mut readers = self.rx.readers.lock().unwrap_or_else(|p| p.into_inner());
            if readers.len() < MAX_RX_READERS && !readers.iter().any(|r| r.will_wake(w)) {
                readers.push(w.clone());
            }
        }
        self.finish_call(st);
        #[cfg(target_os = "linux")]
        if let Some(rt) = &self.rt_rx {
            return rt.poll(cx, latency);
        }
        let _ = latency;
        false
    }

    /// Starts a graceful stop: no new channels, connects, binds or accepts (listeners
    /// stop listening, their queued connections are reset); every open stream's write
    /// side is shut (a FIN after its bytes). The driver then waits until everything is
    /// delivered, closes the channels (a FIN after their bytes) and stops once the peers
    /// have seen their end, or at `now + linger`, aborting what is left. A second call
    /// can only bring the deadline forward. Does not block.
    pub(crate) fn begin_stop(&self, linger: Duration) {
        let deadline = Instant::now() + linger;
        let mut st = self.lock();
        if st.stopped {
            return;
        }
        if let Some(s) = &mut st.stopping {
            s.deadline = s.deadline.min(deadline);
            drop(st);
            self.signal.notify();
            return;
        }
        debug!(?linger, "stopping the stack gracefully");
        st.stopping = Some(Stopping {
            deadline,
            closed: false,
        });
        let acceptor = st.acceptor.take();
        for inc in st.incoming.drain(..) {
            inc.t.abort();
        }
        let mut wake = Vec::new();
        for port in st.ep.listening_ports() {
            let _ = st.ep.unbind(port);
        }
        for l in st.listeners.values_mut() {
            wake.extend(l.take());
        }
        let sids: Vec<SocketId> = st.socks.keys().copied().collect();
        for sid in sids {
            let _ = st.ep.shutdown(sid);
        }
        for w in st.socks.values_mut() {
            wake.extend(w.read.take());
            wake.extend(w.write.take());
        }
        for p in st.peers.values_mut() {
            if let Opening::Running { waiters, .. } = &mut p.opening {
                wake.append(waiters);
            }
        }
        self.finish_call(st);
        drop(acceptor);
        wake.into_iter().for_each(Waker::wake);
        self.signal.notify();
    }

    /// Whether the stack holds nothing undelivered (one reading of
    /// [`State::pending_tx_bytes`]).
    pub(crate) fn nothing_pending(&self) -> bool {
        self.lock().pending_tx_bytes() == 0
    }

    /// Polls a wait for `goal`; `id` names the wait (given out on its first poll).
    pub(crate) fn poll_wait(
        &self,
        goal: Goal,
        id: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let mut st = self.lock();
        let pos = id.and_then(|i| st.waiters.iter().position(|w| w.id == i));
        let reached = st.stopped
            || pos.is_some_and(|p| st.waiters[p].reached)
            || (goal == Goal::NoChannels && st.chans.is_empty() && st.closing_chans.is_empty());
        if reached {
            if let Some(p) = pos {
                st.waiters.swap_remove(p);
            }
            *id = None;
            return Poll::Ready(());
        }
        let w = cx.waker();
        match pos {
            Some(p) => {
                let slot = &mut st.waiters[p].waker;
                if !slot.as_ref().is_some_and(|old| old.will_wake(w)) {
                    *slot = Some(w.clone());
                }
            }
            None => {
                let i = st.next_waiter;
                st.next_waiter += 1;
                st.waiters.push(Waiter {
                    id: i,
                    goal,
                    waker: Some(w.clone()),
                    reached: false,
                });
                *id = Some(i);
            }
        }
        drop(st);
        // The driver reads the figures now and on its re-check timer.
        self.signal.notify();
        Poll::Pending
    }

    /// Forgets a wait that is dropped before it ended.
    pub(crate) fn cancel_wait(&self, id: u64) {
        self.lock().waiters.retain(|w| w.id != id);
    }

    /// The driver thread's loop, until [`Signal::stop`] or the end of a graceful stop.
    pub(crate) fn run(self: Arc<Self>) {
        let _ = self.signal.thread.set(std::thread::current());
        let waker = Waker::from(self.signal.clone());
        let mut cx = Context::from_waker(&waker);
        let rx_waker = Waker::from(self.rx.clone());
        let mut rx_cx = Context::from_waker(&rx_waker);
        let mut wake = Vec::new();
        let mut handed_seen = 0;
        let mut active_until: Option<Instant> = None;
        #[cfg(target_os = "linux")]
        let mut kicks = Vec::new();
        loop {
            self.signal.notified.store(false, Ordering::SeqCst);
            if self.signal.stop.load(Ordering::Acquire) {
                break;
            }
            // The round below pulls every channel: it pays any debt a reader left.
            self.rx.owed.store(false, Ordering::SeqCst);
            let (busy, deadline, done) = {
                let mut st = self.lock();
                let busy = st.round(&mut cx, &mut rx_cx, &mut wake);
                if !st.reopen.is_empty() {
                    self.reopen_channels(&mut st);
                }
                let now = Instant::now();
                let deadline = st.expire(now, &mut wake);
                let (done, check) = st.check_waiters(now, &mut cx, &mut wake);
                #[cfg(target_os = "linux")]
                kicks.append(&mut st.kicks);
                (busy, earliest(deadline, check), done)
            };
            #[cfg(target_os = "linux")]
            kicks.drain(..).for_each(run_kick);
            wake.drain(..).for_each(Waker::wake);
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
                if self.rx.owed.load(Ordering::SeqCst) {
                    timed = true;
                    self.signal.deep.store(false, Ordering::SeqCst);
                }
            }
            let deadline = if timed {
                let fallback = now + PULL_FALLBACK;
                Some(deadline.map_or(fallback, |d| d.min(fallback)))
            } else {
                deadline
            };
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
        let mut st = self.lock();
        st.stopped = true;
        if st.stop_outcome.is_none() {
            st.stop_outcome = Some(StopOutcome::Aborted);
        }
        let ids: Vec<ChannelId> = st.chans.keys().copied().collect();
        for id in ids {
            st.lose_channel(id, Gone::Abandoned);
        }
        for inc in st.incoming.drain(..) {
            inc.t.abort();
        }
        for t in st.closing_chans.drain(..) {
            t.abort();
        }
        for w in &mut st.waiters {
            w.reached = true;
            wake.extend(w.waker.take());
        }
        let acceptor = st.acceptor.take();
        st.drain_events(&mut wake);
        for s in st.socks.values_mut() {
            wake.extend(s.read.take());
            wake.extend(s.write.take());
        }
        for l in st.listeners.values_mut() {
            wake.extend(l.take());
        }
        for p in st.peers.values_mut() {
            if let Opening::Running { waiters, .. } = &mut p.opening {
                wake.append(waiters);
            }
        }
        drop(st);
        drop(acceptor);
        wake.drain(..).for_each(Waker::wake);
        debug!("stack driver stopped");
    }
}

pub(crate) fn stopped_error() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the stack was shut down")
}

impl State {
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

    /// The address of a peer.
    pub(crate) fn peer_ip(&self, id: PeerId) -> Option<Ipv4Addr> {
        self.peer_ips.get(&id).copied()
    }

    fn add_channel(&mut self, t: BoxedTransport, ip: Ipv4Addr, peer: PeerId, class: ChannelClass) {
        let id = ChannelId(self.next_channel);
        self.next_channel = self.next_channel.wrapping_add(1);
        if let Err(e) = self.ep.add_channel(id, peer, class) {
            warn!(channel = %id, error = %e, "adding a channel");
            t.abort();
            return;
        }
        let p = self.peers.get_mut(&ip).expect("caller made the peer");
        match class {
            ChannelClass::Throughput => p.throughput += 1,
            ChannelClass::Latency => p.latency += 1,
        }
        self.chans.insert(
            id,
            ChanIo {
                t,
                peer: ip,
                class,
                rx_pending: None,
                tx_pending: VecDeque::new(),
                tx_pending_bytes: 0,
                idle_reported: false,
            },
        );
    }

    /// Drops a dead channel. Its sockets' chunks move to the peer's other channels (the
    /// endpoint's data-level acknowledgement). When it was the peer's last one: after a
    /// reset, a stack that opened the channels opens them again (the sockets wait for
    /// them); one the peer closed gracefully means the peer stops, and one that timed out
    /// that it is gone, so the sockets fail at once.
    fn lose_channel(&mut self, id: ChannelId, why: Gone) {
        match why {
            Gone::TimedOut => self.ep.handle_channel_timed_out(id),
            Gone::Lost => self.ep.handle_channel_lost(id),
            // Everything it carried was read (up to its end): what waits parked stays.
            Gone::Closed => self.ep.handle_channel_closed(id),
            Gone::Abandoned => self.ep.abandon_channel(id),
        }
        let Some(c) = self.chans.remove(&id) else {
            return;
        };
        debug!(channel = %id, peer = %c.peer, "channel lost");
        c.t.abort();
        let refuses_new = self.refuses_new();
        let Some(p) = self.peers.get_mut(&c.peer) else {
            return;
        };
        match c.class {
            ChannelClass::Throughput => p.throughput -= 1,
            ChannelClass::Latency => p.latency -= 1,
        }
        if p.throughput + p.latency > 0 {
            return;
        }
        match why {
            Gone::Closed => self.ep.handle_peer_gone(p.id, VnsError::ChannelLost),
            // Keep-alive or the user timeout gave up on a silent peer: opening channels
            // again would only wait out `connect_timeout` past the liveness bound.
            Gone::TimedOut => self.ep.handle_peer_gone(p.id, VnsError::PeerUnreachable),
            Gone::Lost if p.opened && !refuses_new => {
                if matches!(p.opening, Opening::Idle | Opening::Failed { .. }) {
                    debug!(peer = %c.peer, "last channel to the peer lost; opening channels again");
                    self.reopen.push(c.peer);
                }
            }
            _ => {}
        }
    }

    /// One driver round; returns whether work is left over (run again without parking).
    fn round(
        &mut self,
        cx: &mut Context<'_>,
        rx_cx: &mut Context<'_>,
        wake: &mut Vec<Waker>,
    ) -> bool {
        let mut busy = false;
        // New channels, then their preambles.
        let mut acceptor = self.acceptor.take();
        while let Some(a) = acceptor.as_ref() {
            match a.poll_accept(cx) {
                Poll::Ready(Ok((t, peer))) => {
                    if self.incoming.len() >= MAX_PENDING_PREAMBLES {
                        let oldest = (0..self.incoming.len())
                            .min_by_key(|&i| self.incoming[i].deadline)
                            .expect("not empty");
                        let inc = self.incoming.swap_remove(oldest);
                        debug!(peer = %inc.peer, "too many channels without a preamble; aborting the oldest");
                        inc.t.abort();
                        self.dropped_channels += 1;
                    }
                    self.incoming.push(Incoming {
                        t,
                        peer,
                        got: Vec::new(),
                        stage: Stage::Preamble,
                        deadline: Instant::now() + self.preamble_timeout,
                    })
                }
                Poll::Ready(Err(e)) => {
                    warn!(error = %e, "channel listener failed; no more incoming channels");
                    acceptor = None;
                }
                Poll::Pending => break,
            }
        }
        self.acceptor = acceptor;
        let mut i = 0;
        while i < self.incoming.len() {
            match self.poll_incoming(i, cx) {
                Some(true) => match self.judge_incoming(i) {
                    Verdict::Challenged => {}
                    Verdict::Reject { why, auth } => {
                        let inc = self.incoming.swap_remove(i);
                        warn!(peer = %inc.peer, why, "channel refused; aborting it");
                        inc.t.abort();
                        self.dropped_channels += 1;
                        self.auth_failures += u64::from(auth);
                    }
                    Verdict::Join { class, consumed } => {
                        let inc = self.incoming.swap_remove(i);
                        let ip = *inc.peer.ip();
                        let peer = self.peer_id(ip);
                        let id = ChannelId(self.next_channel);
                        self.add_channel(inc.t, ip, peer, class);
                        if inc.got.len() > consumed {
                            if let Some(c) = self.chans.get_mut(&id) {
                                c.rx_pending = Some(Bytes::copy_from_slice(&inc.got[consumed..]));
                            }
                        }
                        debug!(channel = %id, peer = %inc.peer, ?class, "channel accepted");
                        busy = true;
                    }
                },
                Some(false) => {
                    let inc = self.incoming.swap_remove(i);
                    inc.t.abort();
                }
                None => i += 1,
            }
        }
        busy |= self.receive_all(rx_cx);
        busy |= self.transmit_all(cx);
        busy |= self.drain_events(wake);
        self.poll_closing_plain(cx);
        busy
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

    /// Feeds every channel's received chunks to the endpoint; returns whether work is left
    /// over (a channel's round budget was used up).
    fn receive_all(&mut self, rx_cx: &mut Context<'_>) -> bool {
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        ids.extend(self.chans.keys().copied());
        let mut busy = false;
        for &id in &ids {
            match self.receive(id, rx_cx) {
                Ok(more) => busy |= more,
                Err(why) => self.lose_channel(id, why),
            }
        }
        self.ids = ids;
        busy
    }

    /// Moves the endpoint's output into every channel; returns whether work is left over
    /// (a channel's round budget was used up).
    fn transmit_all(&mut self, cx: &mut Context<'_>) -> bool {
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        ids.extend(self.chans.keys().copied());
        let mut buf = std::mem::take(&mut self.tx_buf);
        let mut busy = false;
        for &id in &ids {
            // Most calls concern one socket: channels with nothing to move and an idle
            // load on record are skipped (no statistics read, no endpoint poll).
            let idle = self
                .chans
                .get(&id)
                .is_some_and(|c| c.tx_pending.is_empty() && c.idle_reported);
            if idle && !self.ep.has_transmit(id) {
                continue;
            }
            match self.transmit(id, cx, &mut buf) {
                Ok(more) => busy |= more,
                Err(why) => self.lose_channel(id, why),
            }
        }
        self.tx_buf = buf;
        self.ids = ids;
        busy
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

    /// Feeds a channel's received chunks to the endpoint. `Err` when the channel is gone.
    fn receive(&mut self, id: ChannelId, cx: &mut Context<'_>) -> Result<bool, Gone> {
        for _ in 0..RX_BUDGET {
            if self.ep.should_pause_channel_reads(id) {
                return Ok(false);
            }
            let c = self.chans.get_mut(&id).ok_or(Gone::Lost)?;
            let bytes = match c.rx_pending.take() {
                Some(b) => b,
                None => match c.t.poll_dequeue(cx) {
                    Poll::Ready(Ok(Some(b))) => b,
                    Poll::Ready(Ok(None)) => {
                        debug!(channel = %id, "channel closed by the peer");
                        return Err(Gone::Closed);
                    }
                    Poll::Ready(Err(e)) => {
                        debug!(channel = %id, error = %e, "channel failed");
                        return Err(Gone::of(&e));
                    }
                    Poll::Pending => return Ok(false),
                },
            };
            self.received += 1;
            match self.ep.handle_chunk_bytes(id, &bytes) {
                Ok(n) if n < bytes.len() => {
                    trace!(channel = %id, kept = bytes.len() - n, "channel reads paused");
                    let c = self.chans.get_mut(&id).ok_or(Gone::Lost)?;
                    c.rx_pending = Some(bytes.slice(n..));
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(channel = %id, error = %e, "bad bytes on a channel; dropping it");
                    return Err(Gone::Lost);
                }
            }
        }
        Ok(true)
    }

    /// Moves the endpoint's chunks for a channel into it. `Err` when the channel is gone.
    ///
    /// Headers and small chunks are gathered into `buf` and enqueued as one `Bytes`; a
    /// large payload is enqueued as the `Bytes` the endpoint hands out (a reference to the
    /// socket's send-buffer segment), right after the batch holding its header: no copy.
    fn transmit(
        &mut self,
        id: ChannelId,
        cx: &mut Context<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<bool, Gone> {
        let mut more = false;
        let mut budget = TX_BUDGET * TX_BATCH;
        loop {
            let c = self.chans.get_mut(&id).ok_or(Gone::Lost)?;
            // What the channel refused before goes first, in order.
            while let Some(b) = c.tx_pending.pop_front() {
                let n = b.len();
                #[cfg(target_os = "linux")]
                let queued = c.t.enqueue_deferred(b).map(|kick| {
                    match kick {
                        // Latency channels may send inline, after the lock is released.
                        Some(kick) if c.class == ChannelClass::Latency => {
                            self.kicks.push((kick, true));
                        }
                        // Throughput channels: the thread is woken now, as ever.
                        Some(kick) => kick.wake(),
                        None => {}
                    }
                });
                #[cfg(not(target_os = "linux"))]
                let queued = c.t.enqueue(b);
                match queued {
                    Ok(()) => c.tx_pending_bytes -= n,
                    Err(EnqueueError::Full(b)) => {
                        c.tx_pending.push_front(b);
                        match c.t.poll_enqueue_ready(cx) {
                            Poll::Ready(Ok(())) => continue,
                            Poll::Ready(Err(e)) => return lost(id, e),
                            Poll::Pending => {
                                self.report_load(id);
                                return Ok(false);
                            }
                        }
                    }
                    Err(EnqueueError::Closed(e)) => return lost(id, e),
                }
            }
            if budget == 0 {
                more = true;
                break;
            }
            self.report_load(id);
            // Gather the next batch.
            buf.clear();
            let mut gathered = 0;
            while gathered < TX_BATCH {
                let Some(payload) = self.ep.poll_transmit_parts(id, buf) else {
                    break;
                };
                if payload.len() <= INLINE_PAYLOAD {
                    buf.extend_from_slice(&payload);
                    gathered += HEADER_LEN + payload.len();
                    continue;
                }
                gathered += HEADER_LEN + payload.len();
                let c = self.chans.get_mut(&id).ok_or(Gone::Lost)?;
                c.push_pending(take_batch(buf));
                c.push_pending(payload);
            }
            let c = self.chans.get_mut(&id).ok_or(Gone::Lost)?;
            if !buf.is_empty() {
                c.push_pending(take_batch(buf));
            }
            if gathered == 0 {
                break;
            }
            budget = budget.saturating_sub(gathered);
        }
        self.report_load(id);
        Ok(more)
    }

    /// Tells the endpoint how much the channel holds (its queue and our refused batches).
    fn report_load(&mut self, id: ChannelId) {
        if let Some(c) = self.chans.get_mut(&id) {
            let stats = c.t.stats();
            let load = ChannelLoad {
                queued_bytes: (stats.tx_queued + c.tx_pending_bytes) as u64,
                in_flight_bytes: stats.tx_tcp_queued as u64,
                cwnd_bytes: stats.cwnd as u64,
                srtt: stats.srtt,
                retransmitted_segments: stats.retransmitted_segments,
                sent_bytes: stats.bytes_sent,
            };
            c.idle_reported = load.queued_bytes == 0 && load.in_flight_bytes == 0;
            let _ = self.ep.set_channel_load(id, load);
        }
    }

    /// Turns endpoint events into wake-ups; returns whether a paused channel resumed.
    fn drain_events(&mut self, wake: &mut Vec<Waker>) -> bool {
        let mut unpaused = false;
        while let Some(e) = self.ep.poll_events() {
            match e {
                Event::Incoming { port } => {
                    if let Some(w) = self.listeners.get_mut(&port).and_then(Option::take) {
                        wake.push(w);
                    }
                }
                Event::Connected(s)
                | Event::Readable(s)
                | Event::Writable(s)
                | Event::Failed(s) => {
                    if let Some(sw) = self.socks.get_mut(&s) {
                        wake.extend(sw.read.take());
                        wake.extend(sw.write.take());
                    }
                }
                Event::ChannelUnpaused(_) => unpaused = true,
            }
        }
        unpaused
    }

    /// Fails connects past their deadline and runs the endpoint's timers; returns the next
    /// deadline.
    fn expire(&mut self, now: Instant, wake: &mut Vec<Waker>) -> Option<Instant> {
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
        let mut expired = Vec::new();
        for (&sid, &d) in &self.deadlines {
            if d <= now {
                expired.push(sid);
            } else {
                next = Some(next.map_or(d, |n: Instant| n.min(d)));
            }
        }
        for sid in expired {
            self.deadlines.remove(&sid);
            if self.ep.is_connected(sid) {
                continue;
            }
            if let Some(sw) = self.socks.get_mut(&sid) {
                debug!(socket = %sid, "connect timed out");
                sw.timed_out = true;
                wake.extend(sw.read.take());
                wake.extend(sw.write.take());
                self.ep.reset(sid);
            }
        }
        // Closed plain-TCP channels past their linger deadline.
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
        // The endpoint's own timers (closed sockets lingering for a FIN). A socket reset
        // there queued a RESET: run another round at once to send it.
        let reaped = self.ep.counters().linger_expired;
        self.ep.handle_timeout(now);
        if self.ep.counters().linger_expired != reaped {
            next = Some(now);
        }
        if let Some(d) = self.ep.poll_timeout() {
            next = Some(next.map_or(d, |n: Instant| n.min(d)));
        }
        next
    }

    /// Registers a socket created by `connect` or `accept`.
    pub(crate) fn track(&mut self, sid: SocketId) {
        self.socks.entry(sid).or_default();
    }

    /// Releases a socket whose handle is gone: closes it (`Endpoint::close`), or with
    /// `abort` resets it.
    pub(crate) fn release(&mut self, sid: SocketId, abort: bool) {
        self.socks.remove(&sid);
        self.deadlines.remove(&sid);
        if abort {
            self.ep.reset(sid);
        } else {
            self.ep.close(sid);
        }
    }

    /// Keeps a plain-TCP channel closed gracefully (its stream dropped) until its bytes
    /// and FIN are acknowledged and the peer's FIN is in, for [`State::pending_tx_bytes`]
    /// and to reset it if data arrives; at most the endpoint's `linger_timeout`, then it
    /// is reset (counted in `plain_linger_expired`). Wake the driver after, so that it
    /// watches the channel.
    pub(crate) fn keep_closing_plain(&mut self, t: BoxedTransport) {
        let deadline = Instant::now() + self.ep.config().linger_timeout;
        self.closing_plain.push(ClosingPlain {
            t,
            deadline,
            finished: false,
        });
    }

    /// Bytes not yet delivered to peers: the endpoint's, those on the way to and in the
    /// channels (queued, unsent or unacknowledged), and those of gracefully closed
    /// plain-TCP channels.
    pub(crate) fn pending_tx_bytes(&mut self) -> usize {
        let mut n = self.ep.pending_tx_bytes();
        for c in self.chans.values() {
            n += c.tx_pending_bytes + channel_pending(c.t.as_ref());
        }
        for c in &self.closing_plain {
            n += channel_pending(c.t.as_ref());
        }
        n
    }

    /// Wakes the tasks whose [`Goal`] is reached and runs a graceful stop: reads
    /// `pending_tx_bytes` (at most every [`DRAIN_RECHECK`]) while anyone waits or the
    /// stack is stopping. Returns whether the driver should stop now, and when it wants
    /// to look again.
    fn check_waiters(
        &mut self,
        now: Instant,
        cx: &mut Context<'_>,
        wake: &mut Vec<Waker>,
    ) -> (bool, Option<Instant>) {
        let waiting = self.waiters.iter().any(|w| !w.reached);
        if !waiting && self.stopping.is_none() {
            self.zero_checks = 0;
            self.next_check = None;
            return (false, None);
        }
        if self.next_check.is_none_or(|t| now >= t) {
            if self.pending_tx_bytes() == 0 {
                self.zero_checks = self.zero_checks.saturating_add(1);
            } else {
                self.zero_checks = 0;
            }
            self.next_check = Some(now + DRAIN_RECHECK);
        }
        let drained = self.zero_checks >= 2;
        // A graceful stop: once everything is delivered, close the channels (a FIN
        // after their bytes; the peer reads what they still hold, then their end) and
        // wait for each peer to answer with its own end or a reset.
        let mut done = false;
        if let Some(stopping) = &self.stopping {
            let (deadline, closed) = (stopping.deadline, stopping.closed);
            if !closed && drained {
                self.close_channels(wake);
            }
            let closed = closed || drained;
            if closed {
                self.closing_chans.retain(|t| loop {
                    match t.poll_dequeue(cx) {
                        Poll::Ready(Ok(Some(_))) => continue,
                        Poll::Ready(Ok(None)) | Poll::Ready(Err(_)) => break false,
                        Poll::Pending => break true,
                    }
                });
                if self.closing_chans.is_empty() {
                    debug!("stack drained and its channels closed; stopping");
                    self.stop_outcome = Some(StopOutcome::Drained);
                    done = true;
                }
            }
            if !done && now >= deadline {
                let pending = self.pending_tx_bytes();
                warn!(
                    pending,
                    closing_channels = self.closing_chans.len(),
                    "linger time is up; aborting what the stack has not delivered"
                );
                self.stop_outcome = Some(StopOutcome::Expired { pending });
                done = true;
            }
            if let Some(s) = &mut self.stopping {
                s.closed = closed;
            }
        }
        let mut next = None;
        let no_channels = self.chans.is_empty() && self.closing_chans.is_empty();
        for w in self.waiters.iter_mut().filter(|w| !w.reached) {
            let reached = match w.goal {
                Goal::Drained => drained,
                Goal::NoChannels => no_channels,
                Goal::Stopped => false,
            };
            if reached {
                w.reached = true;
                wake.extend(w.waker.take());
            } else if w.goal == Goal::Drained {
                next = self.next_check;
            }
        }
        if let Some(s) = &self.stopping {
            next = earliest(earliest(next, self.next_check), Some(s.deadline));
        }
        (done, next)
    }

    /// Closes every channel gracefully for a stop (everything was delivered): its
    /// sockets lose it like a lost channel (sockets whose peer's stream is complete keep
    /// their bytes), the channel sends a FIN after what it holds and is kept in
    /// `closing_chans` until the peer answers.
    fn close_channels(&mut self, wake: &mut Vec<Waker>) {
        let ids: Vec<ChannelId> = self.chans.keys().copied().collect();
        for id in ids {
            self.ep.abandon_channel(id);
            if let Some(c) = self.chans.remove(&id) {
                debug!(channel = %id, peer = %c.peer, "closing the channel");
                c.t.close();
                if let Some(p) = self.peers.get_mut(&c.peer) {
                    match c.class {
                        ChannelClass::Throughput => p.throughput -= 1,
                        ChannelClass::Latency => p.latency -= 1,
                    }
                }
                self.closing_chans.push(c.t);
            }
        }
        self.drain_events(wake);
    }

    /// Plain-TCP channels closed gracefully and still finishing.
    pub(crate) fn closing_plain(&self) -> usize {
        self.closing_plain.len()
    }

    /// Channels held now.
    pub(crate) fn channel_count(&self) -> usize {
        self.chans.len()
    }

    /// Resets the `n`-th channel held (in id order) as a failed connection: see
    /// [`Stack::reset_channel`](super::Stack::reset_channel).
    pub(crate) fn reset_channel(&mut self, n: usize) -> bool {
        let Some(&id) = self.chans.keys().nth(n) else {
            return false;
        };
        warn!(channel = %id, "resetting a channel (fault injection)");
        self.lose_channel(id, Gone::Lost);
        true
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
fn run_kick((kick, inline): (netdriver::channel::DeferredKick, bool)) {
    if inline {
        kick.run();
    } else {
        kick.wake();
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

impl ChanIo {
    fn push_pending(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.tx_pending_bytes += b.len();
            self.tx_pending.push_back(b);
        }
    }
}

/// The gathered batch as `Bytes`: small ones are copied (the buffer is kept), larger ones
/// handed over.
fn take_batch(buf: &mut Vec<u8>) -> Bytes {
    if buf.len() <= SMALL_BATCH {
        let b = Bytes::copy_from_slice(buf);
        buf.clear();
        b
    } else {
        Bytes::from(std::mem::replace(buf, Vec::with_capacity(SMALL_BATCH)))
    }
}

fn lost(id: ChannelId, e: ChannelError) -> Result<bool, Gone> {
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
    fn of(e: &ChannelError) -> Gone {
        match e {
            ChannelError::TimedOut => Gone::TimedOut,
            _ => Gone::Lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
