//! [`Liveness`]: how a stack's channels notice a peer that vanished without a word.

use std::time::Duration;

/// How a stack's channels notice a peer that vanished without a word (host down, link
/// cut): TCP keep-alive for idle channels and the user timeout for channels with data in
/// flight. Set with [`StackBuilder::keepalive`], [`StackBuilder::keepalive_interval`],
/// [`StackBuilder::keepalive_probes`] and [`StackBuilder::user_timeout`]; read with
/// [`Stack::liveness`]. See [liveness](crate::stack#liveness).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Liveness {
    /// Idle time before the first keep-alive probe; `None`: no keep-alive. Default 10 s.
    pub keepalive: Option<Duration>,
    /// Time between unanswered probes. Default 1 s.
    pub keepalive_interval: Duration,
    /// Unanswered probes after which a channel fails (0 counts as 1). Default 5.
    pub keepalive_probes: u32,
    /// Longest time unacknowledged data may see no progress. Default 30 s.
    pub user_timeout: Duration,
}

impl Default for Liveness {
    /// Datacenter defaults: a peer silent for 10 s is probed every second, and given up
    /// after 5 misses (15 s in all); data unacknowledged for 30 s fails the channel.
    fn default() -> Self {
        Liveness {
            keepalive: Some(Duration::from_secs(10)),
            keepalive_interval: Duration::from_secs(1),
            keepalive_probes: 5,
            user_timeout: Duration::from_secs(30),
        }
    }
}

impl Liveness {
    /// The longest an idle channel (nothing of ours unacknowledged) to a vanished peer
    /// stays up after the last segment received from it: idle + probes × interval.
    /// `None` without keep-alive: then only sending notices a dead peer.
    pub fn idle_detection(&self) -> Option<Duration> {
        self.keepalive.map(|idle| {
            idle.saturating_add(
                self.keepalive_interval
                    .saturating_mul(self.keepalive_probes.max(1)),
            )
        })
    }

    /// Writes the policy into a channel's TCP configuration.
    pub(crate) fn apply(&self, tcp: &mut netdriver::tcp::Config) {
        tcp.keepalive = self.keepalive;
        tcp.keepalive_interval = Some(self.keepalive_interval);
        tcp.keepalive_probes = self.keepalive_probes;
        tcp.user_timeout = self.user_timeout;
    }

    /// The policy a channel's TCP configuration carries.
    pub(crate) fn of_tcp(tcp: &netdriver::tcp::Config) -> Liveness {
        Liveness {
            keepalive: tcp.keepalive,
            keepalive_interval: tcp.keepalive_interval.or(tcp.keepalive).unwrap_or_default(),
            keepalive_probes: tcp.keepalive_probes,
            user_timeout: tcp.user_timeout,
        }
    }
}
