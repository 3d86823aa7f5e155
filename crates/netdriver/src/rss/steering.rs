//! The per-channel record of how its frames reach the queue that owns it, and counters of
//! those records for a stack's statistics.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// How a channel's received frames reach the queue that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChannelSteering {
    /// An accepted channel: owned by the queue its SYN arrived on, which is where the NIC
    /// puts all its frames.
    Accepted,
    /// An opened channel whose local port was chosen so that the NIC's RSS delivers the
    /// peer's replies to the owning queue.
    Aligned,
    /// An ntuple rule at this location of the NIC's table delivers its frames to the
    /// owning queue.
    Ntuple {
        /// The rule's location (`ethtool -n IFACE`).
        location: u32,
    },
    /// Neither: frames that arrive on another queue are forwarded to the owning one.
    Forwarded {
        /// Why alignment was not possible.
        reason: ForwardReason,
    },
}

/// Why a channel is served by forwarding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardReason {
    /// The interface's RSS could not be read (veth has none).
    RssUnreadable,
    /// It was read but its queue choice cannot be reproduced (another hash function,
    /// unknown fields or transform).
    RssUnpredictable,
    /// No free local port lands on the owning queue.
    NoPortLands,
    /// The NIC has no ntuple rules, or refused this one.
    NtupleUnavailable,
    /// Alignment is off (`RssAligner::disabled`: an A/B measurement, or queues that are
    /// no NIC's).
    AlignmentOff,
}

impl fmt::Display for ChannelSteering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelSteering::Accepted => f.write_str("accepted"),
            ChannelSteering::Aligned => f.write_str("aligned"),
            ChannelSteering::Ntuple { location } => write!(f, "ntuple rule {location}"),
            ChannelSteering::Forwarded { reason } => write!(f, "forwarded ({reason})"),
        }
    }
}

impl fmt::Display for ForwardReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ForwardReason::RssUnreadable => "RSS unreadable",
            ForwardReason::RssUnpredictable => "RSS unpredictable",
            ForwardReason::NoPortLands => "no free port lands on the queue",
            ForwardReason::NtupleUnavailable => "no ntuple rule",
            ForwardReason::AlignmentOff => "alignment off",
        })
    }
}

/// How many channels were steered each way (a snapshot of [`SteeringCounters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SteeringCounts {
    /// [`ChannelSteering::Accepted`].
    pub accepted: u64,
    /// [`ChannelSteering::Aligned`].
    pub aligned: u64,
    /// [`ChannelSteering::Ntuple`].
    pub ntuple: u64,
    /// [`ChannelSteering::Forwarded`].
    pub forwarded: u64,
}

impl SteeringCounts {
    /// Counts `steering`.
    pub fn record(&mut self, steering: ChannelSteering) {
        *self.slot(steering) += 1;
    }

    fn slot(&mut self, steering: ChannelSteering) -> &mut u64 {
        match steering {
            ChannelSteering::Accepted => &mut self.accepted,
            ChannelSteering::Aligned => &mut self.aligned,
            ChannelSteering::Ntuple { .. } => &mut self.ntuple,
            ChannelSteering::Forwarded { .. } => &mut self.forwarded,
        }
    }

    /// All channels counted.
    pub fn total(&self) -> u64 {
        self.accepted + self.aligned + self.ntuple + self.forwarded
    }
}

/// [`SteeringCounts`] shared between threads (one increment per channel opened).
#[derive(Debug, Default)]
pub struct SteeringCounters {
    accepted: AtomicU64,
    aligned: AtomicU64,
    ntuple: AtomicU64,
    forwarded: AtomicU64,
}

impl SteeringCounters {
    /// Counts `steering`.
    pub fn record(&self, steering: ChannelSteering) {
        let c = match steering {
            ChannelSteering::Accepted => &self.accepted,
            ChannelSteering::Aligned => &self.aligned,
            ChannelSteering::Ntuple { .. } => &self.ntuple,
            ChannelSteering::Forwarded { .. } => &self.forwarded,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> SteeringCounts {
        SteeringCounts {
            accepted: self.accepted.load(Ordering::Relaxed),
            aligned: self.aligned.load(Ordering::Relaxed),
            ntuple: self.ntuple.load(Ordering::Relaxed),
            forwarded: self.forwarded.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_kind() {
        let c = SteeringCounters::default();
        let all = [
            ChannelSteering::Accepted,
            ChannelSteering::Aligned,
            ChannelSteering::Aligned,
            ChannelSteering::Ntuple { location: 7 },
            ChannelSteering::Forwarded {
                reason: ForwardReason::RssUnreadable,
            },
            ChannelSteering::Forwarded {
                reason: ForwardReason::NoPortLands,
            },
        ];
        let mut plain = SteeringCounts::default();
        for s in all {
            c.record(s);
            plain.record(s);
        }
        let expected = SteeringCounts {
            accepted: 1,
            aligned: 2,
            ntuple: 1,
            forwarded: 2,
        };
        assert_eq!(c.snapshot(), expected);
        assert_eq!(plain, expected);
        assert_eq!(expected.total(), 6);
        assert_eq!(all[3].to_string(), "ntuple rule 7");
        assert_eq!(all[4].to_string(), "forwarded (RSS unreadable)");
    }
}
