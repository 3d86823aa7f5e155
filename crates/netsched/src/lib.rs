//! The NetChannel scheduler layer.
//!
//! A [`NetScheduler`] decides which channel carries each chunk of a virtual socket. It sees
//! only statistics snapshots ([`ChannelStats`]: queued bytes, bytes in flight, the
//! channel's [`ChannelClass`]) and a description of the chunk ([`ChunkInfo`]), and returns
//! a decision; it never touches a channel or a socket itself, so users can write their own
//! policies against the trait.
//!
//! [`RoundRobin`] is the paper's policy: round-robin per chunk over the channels of the
//! socket's class, skipping any channel that holds more than a threshold of queued bytes
//! (2 MB by default). A latency-class socket uses only latency channels and a
//! throughput-class socket only throughput channels, so the two never share a queue.
//!
//! ```
//! use netsched::{AppClass, ChannelClass, ChannelId, ChannelStats, ChunkInfo, NetScheduler, RoundRobin};
//!
//! let mut rr = RoundRobin::default();
//! let stats = [
//!     ChannelStats { id: ChannelId(0), class: ChannelClass::Throughput, queued_bytes: 0, in_flight_bytes: 0 },
//!     ChannelStats { id: ChannelId(1), class: ChannelClass::Latency, queued_bytes: 0, in_flight_bytes: 0 },
//!     ChannelStats { id: ChannelId(2), class: ChannelClass::Throughput, queued_bytes: 3 << 20, in_flight_bytes: 0 },
//!     ChannelStats { id: ChannelId(3), class: ChannelClass::Throughput, queued_bytes: 0, in_flight_bytes: 0 },
//! ];
//! let chunk = ChunkInfo { flow: 7, class: AppClass::Throughput, len: 4096 };
//! // Channel 1 is latency-only, channel 2 is over the 2 MB threshold.
//! assert_eq!(rr.pick_channel(&chunk, &stats), Some(ChannelId(0)));
//! assert_eq!(rr.pick_channel(&chunk, &stats), Some(ChannelId(3)));
//! assert_eq!(rr.pick_channel(&chunk, &stats), Some(ChannelId(0)));
//! let urgent = ChunkInfo { flow: 8, class: AppClass::Latency, len: 64 };
//! assert_eq!(rr.pick_channel(&urgent, &stats), Some(ChannelId(1)));
//! ```
#![forbid(unsafe_code)]

use std::fmt;

/// Identifies one channel (one L4 connection to a peer host) within a host.
///
/// The number is chosen by whoever creates channels (the channel layer); the scheduler and
/// the virtual-socket layer only compare it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChannelId(pub u32);

impl fmt::Display for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ch{}", self.0)
    }
}

/// What a channel is reserved for (the paper's isolation of latency-sensitive traffic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum ChannelClass {
    /// Carries only latency-class sockets; runs on its own threads/cores.
    Latency,
    /// Carries throughput-class (bulk) sockets.
    #[default]
    Throughput,
}

/// What an application declared its socket to be (the paper's `SO_APP_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum AppClass {
    /// Latency-sensitive: uses only [`ChannelClass::Latency`] channels.
    Latency,
    /// Throughput-oriented (the default): uses only [`ChannelClass::Throughput`] channels.
    #[default]
    Throughput,
}

impl AppClass {
    /// The channel class this application class is allowed to use.
    pub fn channel_class(self) -> ChannelClass {
        match self {
            AppClass::Latency => ChannelClass::Latency,
            AppClass::Throughput => ChannelClass::Throughput,
        }
    }
}

/// A statistics snapshot of one channel, as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelStats {
    /// The channel.
    pub id: ChannelId,
    /// What the channel is reserved for.
    pub class: ChannelClass,
    /// Bytes accepted for this channel and not yet sent on the wire (chunks waiting in the
    /// virtual-socket layer's outbox plus the channel's own unsent transmit queue).
    pub queued_bytes: u64,
    /// Bytes sent on the wire and not yet acknowledged by the peer's channel.
    pub in_flight_bytes: u64,
}

/// The chunk a scheduling decision is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    /// A stable number for the flow (the virtual socket), for policies that pin flows.
    pub flow: u64,
    /// The socket's application class.
    pub class: AppClass,
    /// Payload bytes in the chunk (0 for a control chunk).
    pub len: usize,
}

/// A chunk-to-channel scheduling policy.
///
/// Implementations must be deterministic functions of their own state and their
/// arguments: the virtual-socket core is a deterministic state machine and its tests replay
/// exact schedules.
pub trait NetScheduler: Send {
    /// Picks the channel that carries `chunk`, among `channels` (every channel to the
    /// socket's peer host, of every class). Returns `None` when no channel should take the
    /// chunk now (all eligible channels are over their thresholds); the caller keeps the
    /// data and asks again later. Returning an id that is not in `channels` is a bug the
    /// caller treats like `None`.
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId>;
}

impl<S: NetScheduler + ?Sized> NetScheduler for Box<S> {
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
        (**self).pick_channel(chunk, channels)
    }
}

/// The paper's default queued-bytes threshold: a channel holding more is skipped.
pub const DEFAULT_QUEUED_THRESHOLD: u64 = 2 * 1024 * 1024;

/// Round-robin per chunk over the channels of the chunk's class, skipping channels whose
/// queued bytes exceed a threshold.
#[derive(Debug, Clone)]
pub struct RoundRobin {
    queued_threshold: u64,
    /// The id of the channel picked last; the next pick starts after it.
    last: Option<ChannelId>,
}

impl Default for RoundRobin {
    fn default() -> Self {
        Self::with_threshold(DEFAULT_QUEUED_THRESHOLD)
    }
}

impl RoundRobin {
    /// A round-robin policy that skips channels holding more than `queued_threshold` bytes.
    pub fn with_threshold(queued_threshold: u64) -> Self {
        RoundRobin {
            queued_threshold,
            last: None,
        }
    }

    /// The queued-bytes threshold above which a channel is skipped.
    pub fn queued_threshold(&self) -> u64 {
        self.queued_threshold
    }
}

impl NetScheduler for RoundRobin {
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
        let class = chunk.class.channel_class();
        let eligible =
            |c: &&ChannelStats| c.class == class && c.queued_bytes <= self.queued_threshold;
        // The cursor is an id, not an index, so channels coming and going do not skew the
        // rotation: take the first eligible id after the last pick, wrapping around.
        let after = channels
            .iter()
            .filter(eligible)
            .filter(|c| self.last.is_some_and(|last| c.id > last))
            .min_by_key(|c| c.id);
        let pick = after.or_else(|| channels.iter().filter(eligible).min_by_key(|c| c.id))?;
        self.last = Some(pick.id);
        Some(pick.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(id: u32, class: ChannelClass, queued: u64) -> ChannelStats {
        ChannelStats {
            id: ChannelId(id),
            class,
            queued_bytes: queued,
            in_flight_bytes: 0,
        }
    }

    fn bulk(len: usize) -> ChunkInfo {
        ChunkInfo {
            flow: 1,
            class: AppClass::Throughput,
            len,
        }
    }

    #[test]
    fn rotates_over_all_eligible_channels() {
        let mut rr = RoundRobin::default();
        let chans: Vec<_> = (0..4)
            .map(|i| stats(i, ChannelClass::Throughput, 0))
            .collect();
        let picks: Vec<_> = (0..8)
            .map(|_| rr.pick_channel(&bulk(1), &chans).unwrap().0)
            .collect();
        assert_eq!(picks, [0, 1, 2, 3, 0, 1, 2, 3]);
    }

    #[test]
    fn skips_channels_over_threshold_and_returns_none_when_all_are() {
        let mut rr = RoundRobin::with_threshold(1000);
        let chans = [
            stats(0, ChannelClass::Throughput, 1001),
            stats(1, ChannelClass::Throughput, 1000),
            stats(2, ChannelClass::Throughput, 5000),
        ];
        for _ in 0..3 {
            assert_eq!(rr.pick_channel(&bulk(1), &chans), Some(ChannelId(1)));
        }
        let full = [stats(0, ChannelClass::Throughput, 1001)];
        assert_eq!(rr.pick_channel(&bulk(1), &full), None);
        assert_eq!(rr.pick_channel(&bulk(1), &[]), None);
    }

    #[test]
    fn default_threshold_is_two_megabytes() {
        let mut rr = RoundRobin::default();
        assert_eq!(rr.queued_threshold(), 2 * 1024 * 1024);
        let chans = [
            stats(0, ChannelClass::Throughput, 2 * 1024 * 1024 + 1),
            stats(1, ChannelClass::Throughput, 2 * 1024 * 1024),
        ];
        assert_eq!(rr.pick_channel(&bulk(1), &chans), Some(ChannelId(1)));
    }

    #[test]
    fn classes_are_isolated() {
        let mut rr = RoundRobin::default();
        let chans = [
            stats(0, ChannelClass::Latency, 0),
            stats(1, ChannelClass::Throughput, 0),
            stats(2, ChannelClass::Latency, 0),
        ];
        let lat = ChunkInfo {
            flow: 2,
            class: AppClass::Latency,
            len: 10,
        };
        for _ in 0..6 {
            let l = rr.pick_channel(&lat, &chans).unwrap();
            assert!(l == ChannelId(0) || l == ChannelId(2));
            assert_eq!(rr.pick_channel(&bulk(10), &chans), Some(ChannelId(1)));
        }
        let only_bulk = [stats(5, ChannelClass::Throughput, 0)];
        assert_eq!(rr.pick_channel(&lat, &only_bulk), None);
    }

    #[test]
    fn rotation_survives_channels_coming_and_going() {
        let mut rr = RoundRobin::default();
        let all: Vec<_> = (0..3)
            .map(|i| stats(i, ChannelClass::Throughput, 0))
            .collect();
        assert_eq!(rr.pick_channel(&bulk(1), &all), Some(ChannelId(0)));
        assert_eq!(rr.pick_channel(&bulk(1), &all), Some(ChannelId(1)));
        // Channel 2 disappears: wrap to 0.
        assert_eq!(rr.pick_channel(&bulk(1), &all[..2]), Some(ChannelId(0)));
        assert_eq!(rr.pick_channel(&bulk(1), &all), Some(ChannelId(1)));
    }
}
