//! A channel as the stack's data path shares it: its transport, its transmit side (the
//! batches a full channel refused, behind a lock so that no other shard's chunk comes
//! between a header and its payload), which shards wait for its room, and whether a
//! data-path call found it dead. The receive side has no lock: it is the channel's sink
//! (`receive.rs`), owned by the queue driver that runs the channel.
//!
//! The table of channels ([`ChanTable`]) is read without a lock (`arc_swap`) and replaced
//! by the control task, under the control lock, when a channel comes or goes.

use std::collections::{BTreeMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use crossbeam_utils::CachePadded;
use netdriver::channel::{Channel, ChannelError};
use netsched::{ChannelClass, ChannelId};
use tracing::debug;

/// One channel of the stack, shared by the control task and the data path of every shard.
pub(crate) struct Chan {
    pub(crate) id: ChannelId,
    pub(crate) t: Channel,
    pub(crate) peer: Ipv4Addr,
    pub(crate) class: ChannelClass,
    // The lock and the counters each have a cache line of their own: writers on other
    // cores take them at once.
    pub(crate) tx: CachePadded<Mutex<ChanTx>>,
    /// Bytes of the batches in `tx` the channel refused (full), readable without its
    /// lock.
    pub(crate) tx_pending_bytes: CachePadded<AtomicUsize>,
    /// Shards whose output waits for the channel's room (bit *i*: shard *i*): the queue
    /// driver's `on_tx_room` sends for them.
    pub(crate) waiting: CachePadded<AtomicU64>,
    /// Found dead by a data-path call or its sink: `Gone` as a code, 0 while alive. The
    /// control task drops it from the table and tells the shards.
    dead: AtomicU8,
}

/// The transmit side of a channel: batches it refused (full), sent before anything new.
#[derive(Default)]
pub(crate) struct ChanTx {
    pub(crate) pending: VecDeque<Bytes>,
}

/// The stack's channels by id.
pub(crate) type ChanTable = BTreeMap<ChannelId, std::sync::Arc<Chan>>;

impl Chan {
    pub(crate) fn new(id: ChannelId, t: Channel, peer: Ipv4Addr, class: ChannelClass) -> Chan {
        Chan {
            id,
            t,
            peer,
            class,
            tx: CachePadded::new(Mutex::new(ChanTx::default())),
            tx_pending_bytes: CachePadded::new(AtomicUsize::new(0)),
            waiting: CachePadded::new(AtomicU64::new(0)),
            dead: AtomicU8::new(0),
        }
    }

    pub(crate) fn lock_tx(&self) -> MutexGuard<'_, ChanTx> {
        self.tx.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the channel is dead (the first reason found wins); whether this call
    /// recorded it.
    pub(crate) fn mark_dead(&self, why: Gone) -> bool {
        self.dead
            .compare_exchange(0, why.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Why the channel is dead, if a data-path call found it so.
    pub(crate) fn dead(&self) -> Option<Gone> {
        Gone::from_code(self.dead.load(Ordering::Acquire))
    }

    /// Shard `i` has output waiting for the channel's room.
    pub(crate) fn wait_for_room(&self, shard: usize) {
        self.waiting.fetch_or(1 << shard, Ordering::AcqRel);
    }

    /// The shards waiting for the channel's room (cleared).
    pub(crate) fn take_waiting(&self) -> u64 {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.waiting.swap(0, Ordering::AcqRel)
    }
}

impl ChanTx {
    /// Keeps a batch the channel could not take now (after those it refused before).
    pub(crate) fn push(&mut self, b: Bytes, bytes: &AtomicUsize) {
        if !b.is_empty() {
            bytes.fetch_add(b.len(), Ordering::Relaxed);
            self.pending.push_back(b);
        }
    }
}

/// A channel that cannot send any more: why, for its sockets.
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
