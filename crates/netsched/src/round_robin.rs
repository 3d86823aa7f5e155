//! The paper's policy: round-robin with thresholds, for channels and copy workers.

use crate::{
    next_after, ChannelId, ChannelStats, ChunkInfo, CopyRequest, CopyWorkerId, CopyWorkerStats,
    NetScheduler, DEFAULT_COPY_WORKER_THRESHOLD, DEFAULT_QUEUED_THRESHOLD,
};

/// Round-robin per chunk over the channels of the chunk's class, skipping channels whose
/// queued bytes exceed a threshold (2 MB by default); and round-robin over copy workers,
/// skipping workers whose queued copy bytes exceed another (640 KB by default).
#[derive(Debug, Clone)]
pub struct RoundRobin {
    queued_threshold: u64,
    copy_worker_threshold: u64,
    /// The channel picked last; the next pick starts after it.
    last: Option<ChannelId>,
    /// The copy worker picked last.
    last_worker: Option<CopyWorkerId>,
}

impl Default for RoundRobin {
    fn default() -> Self {
        Self::with_threshold(DEFAULT_QUEUED_THRESHOLD)
    }
}

impl RoundRobin {
    /// A round-robin policy that skips channels holding more than `queued_threshold` bytes
    /// (and copy workers holding more than [`DEFAULT_COPY_WORKER_THRESHOLD`]).
    pub fn with_threshold(queued_threshold: u64) -> Self {
        RoundRobin {
            queued_threshold,
            copy_worker_threshold: DEFAULT_COPY_WORKER_THRESHOLD,
            last: None,
            last_worker: None,
        }
    }

    /// The same policy skipping copy workers that hold more than `bytes` queued.
    pub fn with_copy_worker_threshold(mut self, bytes: u64) -> Self {
        self.copy_worker_threshold = bytes;
        self
    }

    /// The queued-bytes threshold above which a channel is skipped.
    pub fn queued_threshold(&self) -> u64 {
        self.queued_threshold
    }

    /// The queued-bytes threshold above which a copy worker is skipped.
    pub fn copy_worker_threshold(&self) -> u64 {
        self.copy_worker_threshold
    }
}

impl NetScheduler for RoundRobin {
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
        let class = chunk.class.channel_class();
        let threshold = self.queued_threshold;
        let eligible = channels
            .iter()
            .filter(|c| c.class == class && c.queued_bytes <= threshold)
            .map(|c| c.id);
        let pick = next_after(self.last, eligible)?;
        self.last = Some(pick);
        Some(pick)
    }

    fn pick_copy_worker(
        &mut self,
        _request: &CopyRequest,
        workers: &[CopyWorkerStats],
    ) -> Option<CopyWorkerId> {
        let threshold = self.copy_worker_threshold;
        let eligible = workers
            .iter()
            .filter(|w| w.queued_bytes <= threshold)
            .map(|w| w.id);
        let pick = next_after(self.last_worker, eligible)?;
        self.last_worker = Some(pick);
        Some(pick)
    }

    /// A copy: its per-chunk state (a cursor, or nothing per flow) is the shard's own.
    fn fork(&self) -> Option<Box<dyn NetScheduler>> {
        Some(Box::new(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AppClass, ChannelClass, CopyDirection};
    use proptest::prelude::*;

    fn stats(id: u32, class: ChannelClass, queued: u64) -> ChannelStats {
        ChannelStats {
            id: ChannelId(id),
            class,
            queued_bytes: queued,
            ..ChannelStats::default()
        }
    }

    fn bulk(len: usize) -> ChunkInfo {
        ChunkInfo {
            flow: 1,
            class: AppClass::Throughput,
            len,
        }
    }

    fn worker(id: u32, queued_bytes: u64) -> CopyWorkerStats {
        CopyWorkerStats {
            id: CopyWorkerId(id),
            queued_bytes,
            ..CopyWorkerStats::default()
        }
    }

    const COPY: CopyRequest = CopyRequest {
        flow: 1,
        len: 1 << 20,
        direction: CopyDirection::FromChannels,
    };

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

    #[test]
    fn copy_workers_rotate_and_skip_those_over_640_kb() {
        let mut rr = RoundRobin::default();
        assert_eq!(rr.copy_worker_threshold(), 640 * 1024);
        let workers = [
            worker(0, 0),
            worker(1, 640 * 1024 + 1),
            worker(2, 640 * 1024),
        ];
        let picks: Vec<_> = (0..4)
            .map(|_| rr.pick_copy_worker(&COPY, &workers).unwrap().0)
            .collect();
        assert_eq!(picks, [0, 2, 0, 2]);
        assert_eq!(rr.pick_copy_worker(&COPY, &workers[1..2]), None);
        let mut low = RoundRobin::default().with_copy_worker_threshold(10);
        assert_eq!(low.pick_copy_worker(&COPY, &workers[2..]), None);
        assert_eq!(low.pick_copy_worker(&COPY, &workers), Some(CopyWorkerId(0)));
    }

    proptest! {
        /// Whatever the loads and classes, a pick is of the chunk's class and under the
        /// threshold, and `None` only when no channel qualifies.
        #[test]
        fn picks_respect_class_and_threshold(
            chans in proptest::collection::vec((any::<bool>(), 0u64..4000), 0..12),
            latency in any::<bool>(),
            rounds in 1usize..20,
        ) {
            let threshold = 2000;
            let mut rr = RoundRobin::with_threshold(threshold);
            let stats: Vec<_> = chans
                .iter()
                .enumerate()
                .map(|(i, &(lat, q))| {
                    let class = if lat { ChannelClass::Latency } else { ChannelClass::Throughput };
                    stats(i as u32, class, q)
                })
                .collect();
            let class = if latency { AppClass::Latency } else { AppClass::Throughput };
            let chunk = ChunkInfo { flow: 9, class, len: 100 };
            let eligible = stats
                .iter()
                .filter(|c| c.class == class.channel_class() && c.queued_bytes <= threshold)
                .count();
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..rounds {
                match rr.pick_channel(&chunk, &stats) {
                    Some(id) => {
                        let c = stats.iter().find(|c| c.id == id).unwrap();
                        prop_assert_eq!(c.class, class.channel_class());
                        prop_assert!(c.queued_bytes <= threshold);
                        seen.insert(id);
                    }
                    None => prop_assert_eq!(eligible, 0),
                }
            }
            // Rotation: the first `eligible` picks are all different.
            prop_assert_eq!(seen.len(), eligible.min(rounds));
        }
    }
}
