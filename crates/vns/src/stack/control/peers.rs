//! Peers and their channels: opening the configured channels to a host on its first
//! connect (on an opener thread, `vns-open`, since a channel's handshake blocks),
//! adding a channel to every shard and installing its sink, losing one (its sockets'
//! chunks go again on the peer's other channels) and opening channels again when a peer's last one is lost.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Instant;

use bytes::Bytes;
use netdriver::channel::Channel;
use netsched::{ChannelClass, ChannelId};
use tracing::{debug, warn};

use super::super::auth;
use super::super::channel::{Chan, ChanTable, Gone};
use super::super::core::{stopped_error, Core, Finish};
use super::super::receive::ChanSink;
use super::incoming::{kind_byte, preamble, PREAMBLE_LEN};
use super::state::incoming::Kind;
use super::state::peers::Opening;
use super::state::Control;
use crate::endpoint::{Error as VnsError, PeerId};

/// Wakes a thread parked in [`dequeue_until`].
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// The channel's next bytes, waiting on this thread until `deadline`: `Ok(None)` when
/// the peer closed it, `Err` when it failed or the deadline passed. For opener threads
/// only (it parks the calling thread).
pub(super) fn dequeue_until(t: &Channel, deadline: Instant) -> Result<Option<Bytes>, String> {
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

impl Core {
    /// Resolves `ip` to a peer with at least one channel of `class`, opening the stack's
    /// channels to it on first use (in an opener thread). `attempt` remembers which opening
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

    /// Opens the configured channels to `ip` (opener thread). Where this stack chooses its
    /// channels' ports (its RSS is reproducible), it first asks the peer for its hello
    /// ([`Core::ask_hello`]) so that each channel's port lands on a queue of its class at
    /// the peer as well.
    fn open_channels(self: Arc<Self>, ip: Ipv4Addr, attempt: u64) {
        let remote = SocketAddrV4::new(ip, self.config.channel_port);
        let plan =
            std::iter::repeat_n(ChannelClass::Throughput, self.config.channels.max(1)).chain(
                std::iter::repeat_n(ChannelClass::Latency, self.config.latency_channels),
            );
        let next_bulk = AtomicUsize::new(0);
        let mut opened = Vec::new();
        let mut error = None;
        let mut auth_error = None;
        let peer_rss = if self.set.rss_state().is_predictable() {
            match self.ask_hello(remote) {
                Ok(d) => d.map(Arc::new),
                Err(e) => {
                    // The peer cannot be reached: every channel would fail the same way.
                    debug!(%remote, error = %e, "opening a hello channel failed");
                    error = Some(e);
                    None
                }
            }
        } else {
            None
        };
        // Nothing to open when the peer could not be reached for its hello.
        let reachable = error.is_none();
        let plan = plan.filter(move |_| reachable);
        for class in plan {
            match self.connect_channel(remote, class, &next_bulk, peer_rss.as_deref()) {
                Ok(t) => match self.open_handshake(&t, class) {
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
            p.rss = peer_rss;
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
        self.control.notify();
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Starts opening channels again to the peers that lost their last one (see
    /// [`Core::lose_channel`]), each in an opener thread like a first opening.
    pub(super) fn reopen_channels(self: &Arc<Self>, ctl: &mut Control) {
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
    /// opener's side of the authentication exchange (see [`auth`]), blocking this opener
    /// thread for at most the preamble timeout. Returns bytes that arrived after the
    /// exchange (chunks for the endpoint), or why the channel cannot be used.
    pub(super) fn open_handshake(
        &self,
        t: &Channel,
        class: ChannelClass,
    ) -> Result<Option<Bytes>, String> {
        let leftover = self.send_preamble(t, Kind::Channel(class))?;
        Ok((!leftover.is_empty()).then(|| Bytes::from(leftover)))
    }

    /// The opener's side of a channel's handshake for a channel of `kind`: its preamble,
    /// and with a channel key the authentication exchange. Returns the bytes that came
    /// after the acceptor's challenge (none without a key).
    pub(super) fn send_preamble(&self, t: &Channel, kind: Kind) -> Result<Vec<u8>, String> {
        let Some(key) = &self.config.channel_key else {
            t.enqueue(Bytes::copy_from_slice(&preamble(kind, 0)))
                .map_err(|e| format!("channel failed before its preamble: {e}"))?;
            return Ok(Vec::new());
        };
        let nc = auth::nonce().map_err(|e| format!("no randomness for a nonce: {e}"))?;
        let mut hello = Vec::with_capacity(PREAMBLE_LEN + auth::NONCE_LEN);
        hello.extend_from_slice(&preamble(kind, auth::FLAG_AUTH));
        hello.extend_from_slice(&nc);
        t.enqueue(Bytes::from(hello))
            .map_err(|e| format!("channel failed before its preamble: {e}"))?;
        let deadline = Instant::now() + self.config.preamble_timeout;
        let mut got = Vec::new();
        while got.len() < auth::NONCE_LEN + auth::TAG_LEN {
            match dequeue_until(t, deadline) {
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
        if !key.verify_accept(&nc, ns, kind_byte(kind), tag) {
            return Err(
                "channel authentication failed: the peer does not hold our channel key".into(),
            );
        }
        let proof = key.open_tag(&nc, ns, kind_byte(kind));
        t.enqueue(Bytes::copy_from_slice(&proof))
            .map_err(|e| format!("channel failed during authentication: {e}"))?;
        Ok(leftover.to_vec())
    }

    /// A channel joins (the control lock held): every shard's endpoint learns it first,
    /// then it enters the table, so that no chunk of it reaches a shard that does not know
    /// it. `leftover`: bytes that came after its handshake.
    pub(super) fn add_channel(
        &self,
        ctl: &mut Control,
        t: Channel,
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
        let chan = Arc::new(Chan::new(id, t, ip, class));
        let mut table = ChanTable::clone(&self.chans.load());
        table.insert(id, chan.clone());
        self.store_chans(table);
        // Last: the channel's bytes go to its sink from its queue driver's next round,
        // and every shard knows the channel by then.
        let sink = ChanSink::new(self.weak(), id, self.max_chunk_payload, leftover);
        if chan.t.set_sink(Box::new(sink)).is_err() {
            debug!(channel = %id, "channel closed before it joined");
            chan.mark_dead(Gone::Lost);
            self.control.notify();
        }
    }

    /// Installs a new channel table (the control lock held).
    fn store_chans(&self, table: ChanTable) {
        self.chans.store(Arc::new(table));
    }

    /// Takes a channel out of the table (the control lock held, so that table changes do
    /// not race); returns it.
    pub(super) fn unlist_channel(&self, id: ChannelId) -> Option<Arc<Chan>> {
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
    pub(crate) fn lose_channel(&self, ctl: &mut Control, id: ChannelId, why: Gone) {
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
    pub(super) fn reap_dead(&self, ctl: &mut Control) -> bool {
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

    /// The address of a peer.
    pub(crate) fn peer_ip(&self, id: PeerId) -> Option<Ipv4Addr> {
        self.ctl().peer_ip(id)
    }

    /// Resets the `n`-th channel held (in id order) as a failed connection: see
    /// [`Diagnostics::reset_channel`](crate::Diagnostics::reset_channel).
    pub(crate) fn reset_channel(&self, n: usize) -> bool {
        let Some(id) = self.chans.load().keys().nth(n).copied() else {
            return false;
        };
        warn!(channel = %id, "resetting a channel (fault injection)");
        {
            let mut ctl = self.ctl();
            self.lose_channel(&mut ctl, id, Gone::Lost);
        }
        // The lost channel's chunks are in other channels' outboxes now.
        let mut fin = Finish::default();
        let table = self.chans.load();
        for i in 0..self.shard_count() {
            self.finish_shard(self.lock_shard(i), &mut fin, &table);
        }
        drop(table);
        fin.run(self);
        self.control.notify();
        true
    }
}
