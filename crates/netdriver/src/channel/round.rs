//! One NIC queue's state and its round: the interface with every TCP connection whose
//! frames arrive on the queue, the channels' application sides, and what one pass over
//! them does (see the [module documentation](super) for the steps). The state is owned
//! by the queue's driver (`driver.rs`); nothing else runs a round.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use crossbeam_channel::{Receiver, TryRecvError};
use rustc_hash::FxHashMap;
use tracing::{debug, trace, warn};

use super::accept_queue::ListenerShared;
use super::attach::Neighbors;
use super::clock::RuntimeClock;
use super::command::Command;
use super::directory::Tuple;
use super::entry::{publish_entry, Entry};
use super::handle::Channel;
use super::queue::{ChannelShared, Failure};
use super::shared::SetShared;
use super::signal::QueueSignal;
use super::sink::RxFlow;
use super::stats::SynCounters;
use super::stray::stray_verdict;
use super::ChannelError;
use crate::link::QueueLink;
use crate::netif::{ConnHandle, Interface};
use crate::rss::NtupleRule;
use crate::tcp::TcpError;
use crate::time::Instant;
use crate::wire::EthernetAddress;

/// Largest chunk cut from a connection's receive buffer at once.
const RX_CHUNK: usize = 64 * 1024;
/// Most commands handled per round, so a flood of them cannot starve the data path.
const COMMANDS_PER_ROUND: usize = 64;
/// Longest a stopping queue waits for its link to take the resets of its connections.
const STOP_FLUSH_LIMIT: std::time::Duration = std::time::Duration::from_millis(20);
/// Most forwarded frames handled per round.
const FORWARDED_PER_ROUND: usize = 256;

/// A flow this queue must release from the directory (and, for an outgoing channel, its
/// port and steering entry) when the interface forgets the connection.
#[derive(Debug)]
struct Owned {
    tuple: Tuple,
    active_port: Option<u16>,
    /// An outgoing channel's ntuple rule: dropped (removed from the NIC) when the
    /// connection is forgotten, TIME-WAIT included, with its port.
    _rule: Option<NtupleRule>,
}

/// Everything a queue owns, apart from its bookkeeping.
pub(crate) struct Worker {
    pub(crate) index: usize,
    pub(crate) queue: u32,
    pub(crate) iface: Interface<Box<dyn QueueLink>>,
    pub(crate) clock: RuntimeClock,
    pub(crate) signal: Arc<QueueSignal>,
    pub(crate) commands: Receiver<Command>,
    pub(crate) forwarded: Receiver<Vec<u8>>,
    pub(crate) set: Arc<SetShared>,
    /// What vouches for a peer's MAC address (the kernel's neighbour table, or the
    /// in-memory switch's).
    pub(crate) neighbors: Neighbors,
}

/// Mutable bookkeeping of the rounds, apart from the interface so both can be borrowed.
#[derive(Default)]
struct Book {
    // Keys this host assigns: FxHash (see Cargo.toml).
    entries: FxHashMap<ConnHandle, Entry>,
    owned: FxHashMap<ConnHandle, Owned>,
    listeners: FxHashMap<u16, Arc<ListenerShared>>,
    /// Flows claimed in the directory for a SYN during this round's receive.
    claims: Vec<Tuple>,
    /// Some listener's accept queue was full at the last look, so its connections wait
    /// in the interface ([`Interface::hold_accepts`]).
    accepts_held: bool,
    /// Passive opens whose MAC a learnt neighbour entry disputed, being probed.
    mac_probes: crate::neigh::PeerMacProbes<ConnHandle>,
}

/// A queue's state: what its driver owns and runs rounds over.
pub(crate) struct QueueState {
    pub(crate) worker: Worker,
    book: Book,
    rxbuf: BytesMut,
}

impl QueueState {
    pub(crate) fn new(worker: Worker) -> QueueState {
        QueueState {
            worker,
            book: Book::default(),
            rxbuf: BytesMut::new(),
        }
    }

    /// One round: commands and forwarded frames, the channels' Tx queues into TCP, the
    /// interface (receive, timers, transmit), accepts, received bytes to the channels'
    /// sinks or Rx queues, reaping, statistics. Returns whether anything happened.
    pub(crate) fn round(&mut self, now: Instant) -> bool {
        let (w, book) = (&mut self.worker, &mut self.book);
        let mut active = false;
        if w.signal.take_control() {
            active |= w.handle_commands(book, now);
            active |= w.handle_forwarded(book, now);
            if !w.commands.is_empty() || !w.forwarded.is_empty() {
                // A round's budget left some.
                w.signal.mark_control();
            }
        }
        active |= w.push_tx(book, now);
        let (set, me) = (&w.set, w.index);
        let claims = &mut book.claims;
        active |= w
            .iface
            .poll_with(now, &mut |s| stray_verdict(set, me, claims, s, true));
        w.settle_claims(book);
        // Accepts before the received bytes: a connection handed to its listener in this
        // round may hold bytes already (they came with the handshake's last ACK, or while
        // a full accept queue held it), and nothing else would bring the driver back for
        // them once the round settles.
        active |= w.accept(book, now);
        active |= w.pull_rx(book, &mut self.rxbuf, now);
        active |= w.reap(book);
        w.publish(book, now);
        active
    }

    /// Whether a round right now would find nothing to do, arrivals on the link apart
    /// (the kernel announces those through the socket's readiness): no command or
    /// forwarded frame waits, no claim is open, every channel's application side is idle
    /// and its close or abort handled, and the interface is settled
    /// ([`Interface::settled`]). Conservative: it may say no when a round would idle.
    /// `Some` carries, when it is settled, the interface's next timer
    /// ([`Interface::settled_until`]).
    pub(crate) fn settled_until(&self, now: Instant) -> Option<Option<Instant>> {
        let w = &self.worker;
        let quiet = !w.signal.control_pending()
            && self.book.claims.is_empty()
            && self.book.entries.values().all(|e| {
                e.aborted
                    || (e.partial.is_none()
                        && e.shared.tx_idle()
                        && !e.shared.abort_requested()
                        && (e.fin_queued || !e.shared.close_requested())
                        && !(e.sink_paused && e.shared.resume_requested())
                        && !e.shared.ack_wanted()
                        && !(e.sink.is_none() && e.shared.sink_offered()))
            });
        if quiet {
            w.iface.settled_until(now)
        } else {
            None
        }
    }

    /// Whether frames wait on the link's receive ring.
    pub(crate) fn rx_ready(&mut self) -> bool {
        self.worker.iface.link_mut().rx_ready()
    }

    /// The link's readiness descriptor, if it has one.
    pub(crate) fn rx_fd(&self) -> Option<std::os::fd::RawFd> {
        self.worker.iface.link().rx_fd()
    }

    /// Links without a descriptor: the driver's waker for arrivals.
    pub(crate) fn register_rx_waker(&self, waker: &std::task::Waker) {
        self.worker.iface.link().register_rx_waker(waker);
    }

    /// The next deadline: the interface's next timer, or the next look at the neighbour
    /// probes of disputed passive opens while any is out (nothing else would wake an
    /// idle queue to abort an impostor's connection once the owner answered).
    pub(crate) fn poll_at(&self) -> Option<Instant> {
        let probes = self.book.mac_probes.next_look();
        match (self.worker.iface.poll_at(), probes) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The set stops: every connection is aborted (see [`Worker::stop`]).
    pub(crate) fn stop(&mut self) {
        let (w, book) = (&mut self.worker, &mut self.book);
        w.stop(book);
    }

    /// The queue dies as if its driver had crashed (fault injection; see [`Worker::die`]).
    pub(crate) fn die(&mut self) {
        let (w, book) = (&mut self.worker, &mut self.book);
        w.die(book);
    }
}

impl Worker {
    /// Fault injection: the queue dies as if its driver had crashed, except that its channels
    /// learn of it (what a supervisor noticing the death would tell them), so that the
    /// local side sees them lost. Nothing goes on the wire: no FIN, no RST; the
    /// connections stay in the interface, their flows steered to the queue's socket,
    /// where arrivals now pile up unread, so the peer learns of the death only by its
    /// own liveness checks (keep-alive, user timeout). Connects and listens queued for
    /// the thread fail.
    fn die(&mut self, book: &mut Book) {
        for e in book.entries.values_mut() {
            e.shared.fail(Failure::QueueDied);
            e.end_sink(Err(ChannelError::QueueDied));
            e.shared.set_closed();
        }
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::Connect { shared, .. } => {
                    // Its SYN never left: nothing of it is on the wire to keep steered.
                    shared.fail(Failure::QueueDied);
                    shared.set_closed();
                    let t = (shared.local, shared.peer);
                    self.set
                        .release_flow(self.index, &t, Some(shared.local.port()));
                }
                Command::Listen { done, .. } => {
                    let _ = done.send(Err(ChannelError::QueueDied));
                }
                Command::Unlisten { .. } | Command::DropReceived(_) => {}
            }
        }
    }

    fn handle_commands(&mut self, book: &mut Book, now: Instant) -> bool {
        let mut any = false;
        for _ in 0..COMMANDS_PER_ROUND {
            let cmd = match self.commands.try_recv() {
                Ok(c) => c,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            };
            any = true;
            match cmd {
                Command::Connect { shared, mac, rule } => {
                    self.connect(book, shared, mac, rule, now)
                }
                Command::Listen {
                    port,
                    backlog,
                    listener,
                    done,
                } => {
                    let res = self
                        .iface
                        .listen(port, backlog)
                        .map_err(|_| ChannelError::AddrInUse(port));
                    if res.is_ok() {
                        book.listeners.insert(port, listener);
                    }
                    let _ = done.send(res);
                }
                Command::Unlisten { port } => {
                    self.iface.unlisten(port);
                    book.listeners.remove(&port);
                }
                Command::DropReceived(rule) => self.iface.drop_received(rule),
            }
        }
        any
    }

    fn connect(
        &mut self,
        book: &mut Book,
        shared: Arc<ChannelShared>,
        mac: EthernetAddress,
        rule: Option<NtupleRule>,
        now: Instant,
    ) {
        let (local, peer) = (shared.local, shared.peer);
        self.iface.add_neighbor(*peer.ip(), mac);
        match self.iface.connect_from(local.port(), peer, now) {
            Ok(h) => {
                if let Some(conn) = self.iface.conn_mut(h) {
                    conn.set_nodelay(self.set.nodelay);
                }
                trace!(queue = self.queue, %local, %peer, steering = %shared.steering, "channel connecting");
                book.owned.insert(
                    h,
                    Owned {
                        tuple: (local, peer),
                        active_port: Some(local.port()),
                        _rule: rule,
                    },
                );
                book.entries.insert(h, Entry::new(shared));
            }
            Err(e) => {
                warn!(queue = self.queue, %local, %peer, error = %e, "channel connect failed");
                shared.fail(match e {
                    crate::netif::NetifError::TooManyConnections => Failure::TooManyConnections,
                    _ => Failure::NoFreePort,
                });
                shared.set_closed();
                self.set
                    .release_flow(self.index, &(local, peer), Some(local.port()));
            }
        }
    }

    fn handle_forwarded(&mut self, book: &mut Book, now: Instant) -> bool {
        let mut any = false;
        for _ in 0..FORWARDED_PER_ROUND {
            let Ok(frame) = self.forwarded.try_recv() else {
                break;
            };
            any = true;
            let (set, me) = (&self.set, self.index);
            let claims = &mut book.claims;
            self.iface.receive_frame_with(now, &frame, &mut |s| {
                stray_verdict(set, me, claims, s, false)
            });
            self.set.pool.put(frame);
        }
        any
    }

    /// Applies each channel's pending option changes, then moves chunks from its Tx queue
    /// into its connection.
    fn push_tx(&mut self, book: &mut Book, now: Instant) -> bool {
        let mut any = false;
        for (&h, e) in book.entries.iter_mut() {
            let Some(conn) = self.iface.conn_mut(h) else {
                continue;
            };
            if e.aborted {
                continue;
            }
            if e.shared.abort_requested() {
                conn.abort();
                e.aborted = true;
                e.shared.fail(Failure::Closed);
                e.end_sink(Err(ChannelError::Closed));
                while let Some(c) = e.partial.take().or_else(|| e.shared.pop_tx()) {
                    e.shared.tx_taken(c.len());
                }
                any = true;
                continue;
            }
            // Before the data: a send buffer grown by these changes takes this round's
            // chunks already.
            if let Some(changes) = e.shared.take_options() {
                trace!(
                    queue = self.queue,
                    ?changes,
                    "channel: applying option changes"
                );
                conn.apply_options(now, &changes);
                any = true;
            }
            // With the chunks below: an answer written before the reader waited carries
            // the ACK it asks for.
            if e.shared.take_ack_wanted() {
                conn.reader_waiting();
                any = true;
            }
            // Read the close request before draining, so a chunk enqueued before close()
            // is never left behind the FIN.
            let closing = e.shared.close_requested();
            let mut moved = false;
            let mut drained = false;
            loop {
                let Some(chunk) = e.partial.take().or_else(|| e.shared.pop_tx()) else {
                    drained = true;
                    break;
                };
                // Shared, not copied: a large chunk is read from where it lies into the
                // frames (`Connection::send_bytes`).
                match conn.send_bytes(&chunk) {
                    Ok(n) => {
                        e.shared.tx_taken(n);
                        moved = true;
                        if n < chunk.len() {
                            e.partial = Some(chunk.slice(n..));
                            break;
                        }
                    }
                    Err(TcpError::WouldBlock) => {
                        e.partial = Some(chunk);
                        break;
                    }
                    Err(_) => {
                        // The connection cannot send any more: the data is dropped and the
                        // failure (if any) reported by `pull_rx`.
                        e.shared.tx_taken(chunk.len());
                        while let Some(c) = e.shared.pop_tx() {
                            e.shared.tx_taken(c.len());
                        }
                        moved = true;
                        break;
                    }
                }
            }
            if moved {
                if e.shared.wake_tx_at_low_water() {
                    // A consumer that kept output the full queue refused sends it now,
                    // from this round.
                    if let Some(sink) = e.sink.as_mut() {
                        sink.on_tx_room();
                    }
                }
                any = true;
            }
            if closing && drained && !e.fin_queued {
                conn.close();
                e.fin_queued = true;
                any = true;
            }
        }
        any
    }

    /// Records the connections opened by SYNs claimed during this round, and releases the
    /// claims of SYNs that opened nothing (backlog full).
    fn settle_claims(&mut self, book: &mut Book) {
        // Every round asks; nearly none has a claim.
        if book.claims.is_empty() {
            return;
        }
        let mut claims = std::mem::take(&mut book.claims);
        for tuple in claims.drain(..) {
            match self.iface.lookup(tuple.0, tuple.1) {
                Some(h) => self.own_passive_in(&mut book.owned, h, tuple),
                None => self.set.directory.remove(&tuple, self.index),
            }
        }
        book.claims = claims;
    }

    /// Records a passively opened connection (once) and claims its endpoint.
    fn own_passive_in(
        &self,
        owned: &mut FxHashMap<ConnHandle, Owned>,
        h: ConnHandle,
        tuple: Tuple,
    ) {
        if owned.contains_key(&h) {
            return;
        }
        if let Err(e) = self.set.claim_endpoint(tuple.0) {
            warn!(local = %tuple.0, error = %e, "claiming an accepted connection's endpoint");
        }
        owned.insert(
            h,
            Owned {
                tuple,
                active_port: None,
                _rule: None,
            },
        );
    }

    /// Moves received bytes to each channel's sink, or into its Rx queue up to its limits;
    /// notices establishment, end of stream and failures.
    fn pull_rx(&mut self, book: &mut Book, rxbuf: &mut BytesMut, now: Instant) -> bool {
        let mut any = false;
        for (&h, e) in book.entries.iter_mut() {
            let Some(conn) = self.iface.conn_mut(h) else {
                continue;
            };
            if conn.state().is_synchronized() {
                e.shared.set_open();
            }
            if e.sink.is_none() {
                if let Some(mut sink) = e.shared.take_sink() {
                    // A sink takes bytes as they come and cannot tell whether a reply
                    // follows: the reply no longer carries the ACK (released if held).
                    conn.set_reply_carries_ack(false);
                    // What the sink was made with goes first, then what the Rx queue holds
                    // (below): a sink is resumed once when installed, or bytes it kept
                    // would wait for the channel's next arrival, which may never come.
                    e.sink_paused = sink.resume() == RxFlow::Pause;
                    e.sink = Some(sink);
                    any = true;
                }
            }
            if e.sink.is_some() {
                any |= Self::feed_sink(conn, e, rxbuf, now);
                continue;
            }
            let mut moved = false;
            loop {
                let room = e.shared.rx_room();
                if room == 0 {
                    if e.shared.block_rx() {
                        break;
                    }
                    continue;
                }
                // No more than TCP holds: a short message then takes the rest of the
                // buffer's capacity instead of asking for a whole RX_CHUNK, which
                // allocated a fresh 64 KiB buffer per arrival whenever an earlier piece was
                // still held (8 connections of 64 B requests: page faults on the new
                // buffer, and glibc's madvise with a TLB shootdown when it was freed).
                // At least 1, so that nothing readable still reports end of stream.
                let want = room.min(RX_CHUNK).min(conn.recv_queue().max(1));
                match read_into(conn, rxbuf, want) {
                    Ok(None) => {
                        any |= e.reach_end(conn, now);
                        break;
                    }
                    Ok(Some(chunk)) => {
                        e.shared.push_rx(chunk);
                        moved = true;
                    }
                    Err(TcpError::WouldBlock | TcpError::Closed) => break,
                    Err(err) => {
                        e.shared.fail(Failure::from_tcp(err));
                        any = true;
                        break;
                    }
                }
            }
            e.publish_ack_held(conn);
            if moved {
                e.shared.wake_rx();
                any = true;
            }
        }
        any
    }

    /// Hands a channel's received bytes to its sink: what its Rx queue held before the
    /// sink came, then TCP's receive buffer, until the sink pauses or nothing is left;
    /// then the end of the stream once. A paused sink is offered nothing until it asks
    /// to resume. Returns whether anything moved.
    fn feed_sink(
        conn: &mut crate::tcp::Connection,
        e: &mut Entry,
        rxbuf: &mut BytesMut,
        now: Instant,
    ) -> bool {
        let Some(sink) = e.sink.as_mut() else {
            return false;
        };
        let mut any = false;
        if e.sink_paused {
            if !e.shared.take_resume() {
                return false;
            }
            if sink.resume() == RxFlow::Pause {
                return true;
            }
            e.sink_paused = false;
            any = true;
        }
        while let Some(chunk) = e.shared.pop_rx_for_sink() {
            any = true;
            if sink.on_bytes(chunk) == RxFlow::Pause {
                e.sink_paused = true;
                return true;
            }
        }
        let in_place = sink.reads_in_place();
        loop {
            if in_place {
                // TCP's receive buffer lent to the sink, all that is readable in one read
                // (at most two slices): no copy into a `Bytes` first, one call per read.
                let Some(sink) = e.sink.as_mut() else {
                    break;
                };
                let mut flow = RxFlow::Continue;
                match conn.recv_with(usize::MAX, |s| {
                    if sink.on_slice(s) == RxFlow::Pause {
                        flow = RxFlow::Pause;
                    }
                }) {
                    Ok(0) => {
                        any |= e.reach_end(conn, now);
                        e.end_sink(Ok(()));
                        break;
                    }
                    Ok(_) => {
                        any = true;
                        if flow == RxFlow::Pause {
                            e.sink_paused = true;
                            break;
                        }
                    }
                    Err(TcpError::WouldBlock | TcpError::Closed) => break,
                    Err(err) => {
                        e.read_failed(err);
                        any = true;
                        break;
                    }
                }
                continue;
            }
            let want = RX_CHUNK.min(conn.recv_queue().max(1));
            match read_into(conn, rxbuf, want) {
                Ok(None) => {
                    any |= e.reach_end(conn, now);
                    e.end_sink(Ok(()));
                    break;
                }
                Ok(Some(chunk)) => {
                    any = true;
                    let Some(sink) = e.sink.as_mut() else {
                        break;
                    };
                    if sink.on_bytes(chunk) == RxFlow::Pause {
                        e.sink_paused = true;
                        break;
                    }
                }
                Err(TcpError::WouldBlock | TcpError::Closed) => break,
                Err(err) => {
                    e.read_failed(err);
                    any = true;
                    break;
                }
            }
        }
        any
    }

    /// Hands connections that completed their handshake to their listeners.
    fn accept(&mut self, book: &mut Book, now: Instant) -> bool {
        // A probe that refused a connection leaves its RST to send: the round was active.
        let refused = !book.mac_probes.is_empty() && self.poll_mac_probes(book, now);
        // Every round asks; a connection to accept is rare.
        if !self.iface.accept_pending() && !book.accepts_held {
            return refused;
        }
        let mut any = refused;
        book.accepts_held = false;
        for (&port, l) in &book.listeners {
            // A full accept queue leaves the connections where they are, established in
            // the interface, rather than resetting them; the application's next accept
            // wakes this queue's driver ([`ChannelListener`](super::ChannelListener)).
            let mut held = !l.has_room_or_hold();
            while !held {
                let Some(h) = self.iface.accept(port) else {
                    break;
                };
                any = true;
                let Some(conn) = self.iface.conn_mut(h) else {
                    continue;
                };
                conn.set_nodelay(self.set.nodelay);
                let tuple = (conn.local(), conn.remote());
                self.own_passive_in(&mut book.owned, h, tuple);
                if !self.neighbor_check(&mut book.mac_probes, h, *tuple.1.ip(), now) {
                    // Aborted; `reap` releases the flow once the interface forgets it.
                    continue;
                }
                let shared = Arc::new(ChannelShared::new(
                    tuple.0,
                    tuple.1,
                    self.queue,
                    self.set.aligner.accepted(),
                    self.set.tx_limits,
                    self.set.rx_limits,
                    self.signal.clone(),
                ));
                self.set.directory.insert(tuple, self.index);
                book.entries.insert(h, Entry::new(shared.clone()));
                trace!(queue = self.queue, local = %tuple.0, peer = %tuple.1, "channel accepted");
                // A closed listener drops the channel, which aborts it at the next round.
                if l.push(Channel::new(shared)) {
                    l.wake();
                }
                held = !l.has_room_or_hold();
            }
            self.iface.hold_accepts(port, held);
            book.accepts_held |= held;
        }
        any
    }

    /// Checks the MAC address a passive open learnt from the peer's SYN (or cookie ACK)
    /// against the host's neighbour table for its IP address ([`Neighbors::judge`]). An
    /// entry set by hand that names another MAC refuses the connection (counted in
    /// `SynStats::neighbor_mismatches`). A learnt entry that disagrees proves nothing (one
    /// forged ARP packet sets it): the connection keeps the SYN's MAC while the kernel
    /// asks the address's owner, and is refused only if the answer names another MAC
    /// (`SynStats::neighbor_reprobes`, [`PeerMacProbes`](crate::neigh::PeerMacProbes)).
    /// Without a usable entry the connection keeps the SYN's MAC
    /// (`SynStats::neighbor_unverified`). Returns whether the connection may be handed to
    /// its listener.
    fn neighbor_check(
        &mut self,
        probes: &mut crate::neigh::PeerMacProbes<ConnHandle>,
        h: ConnHandle,
        ip: std::net::Ipv4Addr,
        now: Instant,
    ) -> bool {
        use crate::neigh::PeerMacVerdict;
        let Some(mac) = self.iface.remote_mac(h) else {
            return true;
        };
        let counters = self.set.peers.get(self.index).map(|p| &p.syns);
        let count = |pick: fn(&SynCounters) -> &AtomicU64| {
            if let Some(c) = counters {
                pick(c).fetch_add(1, Ordering::Relaxed);
            }
        };
        match self.neighbors.judge(ip, mac, self.queue) {
            PeerMacVerdict::Agrees => true,
            PeerMacVerdict::Contradicted(k) => {
                if let Some(suppressed) = NEIGHBOR_WARNINGS.check() {
                    warn!(queue = self.queue, %ip, syn_mac = %mac, known_mac = %k, suppressed, "passive open from another MAC than the neighbour entry set by hand for this address; aborted");
                }
                count(|c| &c.neighbor_mismatches);
                if let Some(conn) = self.iface.conn_mut(h) {
                    conn.abort();
                }
                false
            }
            PeerMacVerdict::Disputed(k) => {
                debug!(queue = self.queue, %ip, syn_mac = %mac, kernel_mac = %k, "passive open from another MAC than the kernel learnt for this address; asking the owner");
                count(|c| &c.neighbor_reprobes);
                if !self.neighbors.start_probe(probes, ip, mac, h, now) {
                    count(|c| &c.neighbor_unverified);
                }
                true
            }
            PeerMacVerdict::Unknown => {
                debug!(queue = self.queue, %ip, %mac, "no neighbour entry; keeping the SYN's MAC");
                count(|c| &c.neighbor_unverified);
                true
            }
        }
    }

    /// Ends the probes of disputed passive opens that were answered (or timed out): a
    /// connection whose address's owner answered from another MAC is aborted. Returns
    /// whether one was.
    fn poll_mac_probes(&mut self, book: &mut Book, now: Instant) -> bool {
        let mut aborted = false;
        use crate::neigh::ProbeOutcome;
        let (iface, queue) = (&mut self.iface, self.queue);
        let counters = self.set.peers.get(self.index).map(|p| &p.syns);
        self.neighbors
            .poll_probes(&mut book.mac_probes, now, |h, ip, outcome| match outcome {
                ProbeOutcome::Confirmed => {
                    debug!(queue, %ip, "the address's owner confirmed the passive open's MAC");
                }
                ProbeOutcome::Contradicted(owner) => {
                    if let Some(suppressed) = NEIGHBOR_WARNINGS.check() {
                        warn!(queue, %ip, %owner, suppressed, "the address's owner answered from another MAC than its passive open; aborted");
                    }
                    if let Some(c) = counters {
                        c.neighbor_mismatches.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Some(conn) = iface.conn_mut(h) {
                        conn.abort();
                        aborted = true;
                    }
                }
                ProbeOutcome::Unanswered => {
                    debug!(queue, %ip, "no answer to the neighbour probe; keeping the SYN's MAC");
                    if let Some(c) = counters {
                        c.neighbor_unverified.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        aborted
    }

    /// Forgets connections the interface removed, releasing their flows and ports.
    fn reap(&mut self, book: &mut Book) -> bool {
        let mut any = false;
        while let Some((h, err)) = self.iface.pop_closed() {
            any = true;
            if let Some(o) = book.owned.remove(&h) {
                // A SYN that ended this flow's TIME-WAIT (RFC 6191) opened the next
                // incarnation of its 4-tuple here before the old one was reaped: the
                // directory entry is the new connection's and stays, or its segments
                // arriving on another queue would find no owner and be reset there.
                let successor = self.iface.lookup(o.tuple.0, o.tuple.1).is_some();
                self.set
                    .release_incarnation(self.index, &o.tuple, o.active_port, successor);
            }
            if err == Some(TcpError::Reset) {
                // Only a RST received from the peer (RFC 5961-checked) fails a connection
                // with `Reset`; local aborts fail it with `Closed`.
                if let Some(p) = self.set.peers.get(self.index) {
                    p.resets_received.fetch_add(1, Ordering::Relaxed);
                }
            }
            if let Some(mut e) = book.entries.remove(&h) {
                match err {
                    Some(err) => {
                        e.shared.fail(Failure::from_tcp(err));
                        e.end_sink(Err(ChannelError::from_tcp(err)));
                    }
                    // An orderly removal: both FINs are through and every byte was read.
                    None => {
                        e.shared.finish_rx();
                        e.end_sink(Ok(()));
                    }
                }
                e.shared.set_closed();
            }
        }
        any
    }

    fn publish(&self, book: &mut Book, now: Instant) {
        let stats = self.iface.stats();
        if let Some(peer) = self.set.peers.get(self.index) {
            let c = &peer.checksums;
            c.partial
                .store(stats.rx_partial_checksum, Ordering::Relaxed);
            c.bad.store(stats.rx_bad_checksum, Ordering::Relaxed);
            let s = &peer.syns;
            s.dropped.store(stats.syn_dropped, Ordering::Relaxed);
            s.cookies_sent
                .store(stats.syn_cookies_sent, Ordering::Relaxed);
            s.cookies_accepted
                .store(stats.syn_cookies_accepted, Ordering::Relaxed);
            s.cookies_rejected
                .store(stats.syn_cookies_rejected, Ordering::Relaxed);
            if let Some(rule) = self.iface.rx_drop() {
                peer.rx_fault_dropped.store(rule.dropped, Ordering::Relaxed);
            }
        }
        for (&h, e) in book.entries.iter_mut() {
            if let Some(conn) = self.iface.conn(h) {
                publish_entry(conn, e, now);
            }
        }
    }

    /// Aborts every connection, tells every channel the set is gone, fails pending
    /// commands.
    fn stop(&mut self, book: &mut Book) {
        for e in book.entries.values_mut() {
            e.shared.fail(Failure::ShutDown);
            e.end_sink(Err(ChannelError::ShutDown));
        }
        let handles: Vec<_> = self.iface.handles().collect();
        for h in handles {
            if let Some(conn) = self.iface.conn_mut(h) {
                conn.abort();
            }
        }
        // Sends the resets and forgets the connections. A full transmit ring holds resets
        // back (a queue stopped in the middle of a bulk transfer): the link gets a bounded
        // moment to drain, or each peer's connection would wait out its retransmissions
        // (tens of seconds) before its sockets learn that this side is gone.
        self.iface.poll(self.clock.now());
        let give_up = std::time::Instant::now() + STOP_FLUSH_LIMIT;
        while self.iface.tx_blocked() && std::time::Instant::now() < give_up {
            std::thread::sleep(std::time::Duration::from_micros(100));
            self.iface.poll(self.clock.now());
        }
        self.reap(book);
        for e in book.entries.values() {
            e.shared.set_closed();
        }
        for (_, o) in book.owned.drain() {
            self.set.release_flow(self.index, &o.tuple, o.active_port);
        }
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::Connect { shared, .. } => {
                    shared.fail(Failure::ShutDown);
                    shared.set_closed();
                    let t = (shared.local, shared.peer);
                    self.set
                        .release_flow(self.index, &t, Some(shared.local.port()));
                }
                Command::Listen { done, .. } => {
                    let _ = done.send(Err(ChannelError::ShutDown));
                }
                Command::Unlisten { .. } | Command::DropReceived(_) => {}
            }
        }
        while let Ok(frame) = self.forwarded.try_recv() {
            self.set.pool.put(frame);
        }
    }
}

/// Reads up to `want` bytes from `conn` into `rxbuf` and hands them out as one chunk;
/// `Ok(None)` at the end of the stream.
fn read_into(
    conn: &mut crate::tcp::Connection,
    rxbuf: &mut BytesMut,
    want: usize,
) -> Result<Option<bytes::Bytes>, TcpError> {
    // Appended, not read into a zero-filled slice: zeroing every 64 KiB buffer before the
    // copy cost ~6 % of a bulk receiver's CPU. `reserve` takes the previous allocation
    // back when every piece handed out of it has been dropped (the consumer kept up),
    // else allocates a fresh one.
    debug_assert!(rxbuf.is_empty());
    if rxbuf.capacity() < want {
        rxbuf.reserve(RX_CHUNK);
    }
    match conn.recv_with(want, |s| rxbuf.extend_from_slice(s))? {
        0 => Ok(None),
        n => {
            debug_assert_eq!(rxbuf.len(), n);
            Ok(Some(rxbuf.split().freeze()))
        }
    }
}

/// Warnings about refused passive opens (neighbour check): a peer can cause one per SYN.
static NEIGHBOR_WARNINGS: crate::log_limit::LogLimit = crate::log_limit::LogLimit::new(5);

#[cfg(test)]
#[path = "round_tests.rs"]
mod tests;
