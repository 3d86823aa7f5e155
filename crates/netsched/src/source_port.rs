//! The paper's code default: each socket pinned to one channel by a hash of its flow.

use crate::{ChannelId, ChannelStats, ChunkInfo, NetScheduler, DEFAULT_QUEUED_THRESHOLD};

/// Pins each socket (flow) to one channel of its class, chosen by a hash of its flow
/// number, as the paper's code does with the source port.
///
/// All chunks of a flow then take one channel, so they arrive in order and the receiver
/// never reorders them; the price is that one flow cannot use more than one channel.
/// The hash is a jump consistent hash (Lamping and Veach) over the class's channels in id
/// order: when a channel with a higher id than all others is added, only the flows that
/// move to it change channel; the rest stay where they were.
///
/// A flow whose channel holds more than the queued-bytes threshold (2 MB by default) gets
/// `None` and waits: moving it would break the pinning.
#[derive(Debug, Clone)]
pub struct SourcePort {
    queued_threshold: u64,
}

impl Default for SourcePort {
    fn default() -> Self {
        Self::with_threshold(DEFAULT_QUEUED_THRESHOLD)
    }
}

impl SourcePort {
    /// A pinning policy that holds a flow back while its channel has more than
    /// `queued_threshold` bytes queued.
    pub fn with_threshold(queued_threshold: u64) -> Self {
        SourcePort { queued_threshold }
    }

    /// The queued-bytes threshold above which a flow waits.
    pub fn queued_threshold(&self) -> u64 {
        self.queued_threshold
    }

    /// The channel `flow` is pinned to among `channels` of `class`, whatever their loads.
    pub fn channel_of(
        flow: u64,
        class: crate::ChannelClass,
        channels: &[ChannelStats],
    ) -> Option<ChannelId> {
        let mut ids: Vec<ChannelId> = channels
            .iter()
            .filter(|c| c.class == class)
            .map(|c| c.id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let n = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        if n == 0 {
            return None;
        }
        Some(ids[jump_hash(flow, n) as usize])
    }
}

impl NetScheduler for SourcePort {
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
        let id = Self::channel_of(chunk.flow, chunk.class.channel_class(), channels)?;
        let stats = channels.iter().find(|c| c.id == id)?;
        (stats.queued_bytes <= self.queued_threshold).then_some(id)
    }

    /// A copy: its per-chunk state (a cursor, or nothing per flow) is the shard's own.
    fn fork(&self) -> Option<Box<dyn NetScheduler>> {
        Some(Box::new(self.clone()))
    }
}

/// Jump consistent hash: a bucket in `0..buckets` for `key` (`buckets` > 0), such that
/// growing `buckets` by one moves only the keys that land in the new bucket.
fn jump_hash(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AppClass, ChannelClass};
    use proptest::prelude::*;

    fn chan(id: u32, class: ChannelClass, queued_bytes: u64) -> ChannelStats {
        ChannelStats {
            id: ChannelId(id),
            class,
            queued_bytes,
            ..ChannelStats::default()
        }
    }

    fn chunk(flow: u64, class: AppClass) -> ChunkInfo {
        ChunkInfo {
            flow,
            class,
            len: 1000,
        }
    }

    #[test]
    fn a_flow_stays_on_one_channel_and_flows_spread() {
        let mut sp = SourcePort::default();
        let chans: Vec<_> = (0..4)
            .map(|i| chan(i, ChannelClass::Throughput, 0))
            .collect();
        let mut used = std::collections::BTreeSet::new();
        for flow in 0..64 {
            let first = sp.pick_channel(&chunk(flow, AppClass::Throughput), &chans);
            for _ in 0..5 {
                assert_eq!(
                    sp.pick_channel(&chunk(flow, AppClass::Throughput), &chans),
                    first
                );
            }
            used.insert(first.unwrap());
        }
        assert_eq!(used.len(), 4, "64 flows over 4 channels use them all");
    }

    #[test]
    fn an_overloaded_channel_holds_its_flows_back_instead_of_moving_them() {
        let mut sp = SourcePort::with_threshold(1000);
        let mut chans: Vec<_> = (0..3)
            .map(|i| chan(i, ChannelClass::Throughput, 0))
            .collect();
        let c = chunk(5, AppClass::Throughput);
        let home = sp.pick_channel(&c, &chans).unwrap();
        chans[home.0 as usize].queued_bytes = 1001;
        assert_eq!(sp.pick_channel(&c, &chans), None);
        chans[home.0 as usize].queued_bytes = 1000;
        assert_eq!(sp.pick_channel(&c, &chans), Some(home));
    }

    #[test]
    fn classes_are_never_mixed() {
        let mut sp = SourcePort::default();
        let chans = [
            chan(0, ChannelClass::Throughput, 0),
            chan(1, ChannelClass::Latency, 0),
            chan(2, ChannelClass::Throughput, 0),
        ];
        for flow in 0..32 {
            assert_eq!(
                sp.pick_channel(&chunk(flow, AppClass::Latency), &chans),
                Some(ChannelId(1))
            );
            let bulk = sp.pick_channel(&chunk(flow, AppClass::Throughput), &chans);
            assert!(matches!(bulk, Some(ChannelId(0 | 2))), "{bulk:?}");
        }
        assert_eq!(
            sp.pick_channel(&chunk(1, AppClass::Latency), &chans[..1]),
            None
        );
    }

    proptest! {
        /// Adding a channel with a higher id moves a flow only onto that new channel.
        #[test]
        fn growing_the_channel_set_moves_flows_only_to_the_new_channel(
            flow in any::<u64>(),
            n in 1u32..32,
        ) {
            let before: Vec<_> = (0..n).map(|i| chan(i * 3, ChannelClass::Throughput, 0)).collect();
            let mut after = before.clone();
            after.push(chan(n * 3, ChannelClass::Throughput, 0));
            let old = SourcePort::channel_of(flow, ChannelClass::Throughput, &before).unwrap();
            let new = SourcePort::channel_of(flow, ChannelClass::Throughput, &after).unwrap();
            prop_assert!(new == old || new == ChannelId(n * 3));
        }

        /// The pinning does not depend on the order channels are listed in.
        #[test]
        fn pinning_ignores_listing_order(flow in any::<u64>(), n in 1u32..16, rot in 0usize..16) {
            let mut chans: Vec<_> = (0..n).map(|i| chan(i, ChannelClass::Throughput, 0)).collect();
            let a = SourcePort::channel_of(flow, ChannelClass::Throughput, &chans);
            chans.rotate_left(rot % n as usize);
            prop_assert_eq!(SourcePort::channel_of(flow, ChannelClass::Throughput, &chans), a);
        }
    }
}
