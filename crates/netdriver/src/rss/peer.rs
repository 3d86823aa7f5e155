//! Where an opened channel lands at the peer: the record of whether its local port was
//! chosen under the peer's RSS as well as this host's.
//!
//! The peer's NIC puts the frames of a channel this host opens on the queue its own RSS
//! picks from the 4-tuple, and the peer's stack gives the accepted channel to that queue.
//! Only the local port is free, so a host that knows the peer's RSS (key, indirection
//! table, hashed fields) can choose a port that lands on a queue of its choice at the
//! peer too (a latency channel on one of the peer's latency queues):
//! [`PeerTarget`](super::PeerTarget) with [`RssAligner::connect`](super::RssAligner::connect).
//! Where the peer's RSS comes from is the caller's business (vns asks the accepting
//! stack for it on the first channel to a peer, `docs/wire-format.md`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether an opened channel's local port was chosen so that the peer's RSS delivers this
/// host's frames to a queue it was asked to land on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerAlignment {
    /// The peer's RSS was not known when the channel was opened (the peer did not
    /// describe it, or it was not asked, or this host's own RSS is not reproducible and
    /// no port is chosen at all): the channel lands on whichever queue the peer's RSS
    /// picks for the port.
    Unknown,
    /// The port lands on `queue` at the peer, one of the queues asked for, and on the
    /// owning queue here.
    Aligned {
        /// The peer's queue.
        queue: u32,
    },
    /// The peer's RSS was known but no free port lands on one of its target queues and on
    /// this host's queue at once (or its table names none of them): this end was aligned
    /// alone.
    Missed,
}

impl fmt::Display for PeerAlignment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerAlignment::Unknown => f.write_str("peer RSS unknown"),
            PeerAlignment::Aligned { queue } => write!(f, "peer queue {queue}"),
            PeerAlignment::Missed => f.write_str("no port lands at the peer"),
        }
    }
}

/// Opened channels by [`PeerAlignment`] (a snapshot of [`PeerAlignmentCounters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerAlignmentCounts {
    /// [`PeerAlignment::Unknown`].
    pub unknown: u64,
    /// [`PeerAlignment::Aligned`].
    pub aligned: u64,
    /// [`PeerAlignment::Missed`].
    pub missed: u64,
}

/// [`PeerAlignmentCounts`] shared between threads (one increment per channel opened).
#[derive(Debug, Default)]
pub struct PeerAlignmentCounters {
    unknown: AtomicU64,
    aligned: AtomicU64,
    missed: AtomicU64,
}

impl PeerAlignmentCounters {
    /// Counts `p`.
    pub fn record(&self, p: PeerAlignment) {
        let c = match p {
            PeerAlignment::Unknown => &self.unknown,
            PeerAlignment::Aligned { .. } => &self.aligned,
            PeerAlignment::Missed => &self.missed,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> PeerAlignmentCounts {
        PeerAlignmentCounts {
            unknown: self.unknown.load(Ordering::Relaxed),
            aligned: self.aligned.load(Ordering::Relaxed),
            missed: self.missed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_kind() {
        let c = PeerAlignmentCounters::default();
        for p in [
            PeerAlignment::Unknown,
            PeerAlignment::Aligned { queue: 3 },
            PeerAlignment::Aligned { queue: 0 },
            PeerAlignment::Missed,
        ] {
            c.record(p);
        }
        assert_eq!(
            c.snapshot(),
            PeerAlignmentCounts {
                unknown: 1,
                aligned: 2,
                missed: 1
            }
        );
        assert_eq!(
            PeerAlignment::Aligned { queue: 3 }.to_string(),
            "peer queue 3"
        );
    }
}
