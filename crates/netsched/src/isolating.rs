//! Isolation of latency-sensitive sockets: their own channels on their own cores.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    AppClass, ChannelClass, ChannelId, ChannelStats, ChannelThreadId, ChunkInfo, NetScheduler,
    PlanAction, RoundRobin, StackSnapshot, DEFAULT_QUEUED_THRESHOLD,
};

/// Keeps latency-class sockets away from bulk traffic, on every level the scheduler
/// decides: queues, threads and cores.
///
/// - A latency-class chunk goes only to a latency channel: the least loaded (queued plus
///   in-flight bytes) one under the queued-bytes threshold, preferring channels whose
///   thread runs no throughput channel (as far as the channels offered show).
/// - A throughput-class chunk goes round-robin ([`RoundRobin`]) over throughput channels
///   only, preferring those whose thread runs no latency channel; it never takes a
///   latency channel, even when every throughput channel is over its threshold.
/// - Its [`plan`](NetScheduler::plan) reserves the last `latency_cores` of the
///   snapshot's cores (default 1) for latency channels and pins every channel that runs
///   on the wrong side, or on an unknown core, to the least used core of its side, so
///   latency channels and throughput channels never share a core. With fewer than two
///   cores known it plans nothing: isolation is impossible.
#[derive(Debug, Clone)]
pub struct Isolating {
    throughput: RoundRobin,
    queued_threshold: u64,
    latency_cores: usize,
}

impl Default for Isolating {
    fn default() -> Self {
        Self::with_threshold(DEFAULT_QUEUED_THRESHOLD)
    }
}

impl Isolating {
    /// An isolating policy skipping channels with more than `queued_threshold` bytes
    /// queued, with one core reserved for latency channels.
    pub fn with_threshold(queued_threshold: u64) -> Self {
        Isolating {
            throughput: RoundRobin::with_threshold(queued_threshold),
            queued_threshold,
            latency_cores: 1,
        }
    }

    /// The same policy reserving `n` cores (at least 1, and at most all but one of the
    /// snapshot's cores) for latency channels.
    pub fn with_latency_cores(mut self, n: usize) -> Self {
        self.latency_cores = n.max(1);
        self
    }

    /// The queued-bytes threshold above which a channel is skipped.
    pub fn queued_threshold(&self) -> u64 {
        self.queued_threshold
    }

    fn pick_latency(&self, channels: &[ChannelStats]) -> Option<ChannelId> {
        let bulk_threads = threads_of(channels, ChannelClass::Throughput);
        let eligible = || {
            channels.iter().filter(|c| {
                c.class == ChannelClass::Latency && c.queued_bytes <= self.queued_threshold
            })
        };
        let least_loaded = |it: &mut dyn Iterator<Item = &ChannelStats>| {
            it.min_by_key(|c| (c.queued_bytes.saturating_add(c.in_flight_bytes), c.id))
                .map(|c| c.id)
        };
        least_loaded(&mut eligible().filter(|c| !shares(c, &bulk_threads)))
            .or_else(|| least_loaded(&mut eligible()))
    }
}

/// The threads running a channel of `class` among `channels`.
fn threads_of(channels: &[ChannelStats], class: ChannelClass) -> BTreeSet<ChannelThreadId> {
    channels
        .iter()
        .filter(|c| c.class == class)
        .filter_map(|c| c.thread)
        .collect()
}

fn shares(c: &ChannelStats, threads: &BTreeSet<ChannelThreadId>) -> bool {
    c.thread.is_some_and(|t| threads.contains(&t))
}

impl NetScheduler for Isolating {
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
        match chunk.class {
            AppClass::Latency => self.pick_latency(channels),
            AppClass::Throughput => {
                let latency_threads = threads_of(channels, ChannelClass::Latency);
                if latency_threads.is_empty() {
                    return self.throughput.pick_channel(chunk, channels);
                }
                let apart: Vec<ChannelStats> = channels
                    .iter()
                    .filter(|c| !shares(c, &latency_threads))
                    .copied()
                    .collect();
                self.throughput
                    .pick_channel(chunk, &apart)
                    .or_else(|| self.throughput.pick_channel(chunk, channels))
            }
        }
    }

    fn plan(&mut self, snapshot: &StackSnapshot) -> Vec<PlanAction> {
        let cores: Vec<usize> = snapshot
            .cores
            .iter()
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if cores.len() < 2 {
            return Vec::new();
        }
        let reserved = self.latency_cores.min(cores.len() - 1);
        let (bulk_cores, latency_cores) = cores.split_at(cores.len() - reserved);
        // Channels per core on each side, counting those already well placed, so that
        // the misplaced ones spread over the least used cores.
        let mut load: BTreeMap<usize, usize> = cores.iter().map(|&c| (c, 0)).collect();
        let mut misplaced = Vec::new();
        let mut channels: Vec<&ChannelStats> = snapshot.channels.iter().collect();
        channels.sort_by_key(|c| c.id);
        for c in channels {
            let side = match c.class {
                ChannelClass::Latency => latency_cores,
                ChannelClass::Throughput => bulk_cores,
            };
            match snapshot.core_of(c.id) {
                Some(core) if side.contains(&core) => *load.entry(core).or_default() += 1,
                _ => misplaced.push((c.id, side)),
            }
        }
        misplaced
            .into_iter()
            .map(|(channel, side)| {
                let core = *side
                    .iter()
                    .min_by_key(|&&core| (load[&core], core))
                    .expect("each side has at least one core");
                *load.entry(core).or_default() += 1;
                PlanAction::Pin { channel, core }
            })
            .collect()
    }

    /// A copy: its per-chunk state (a cursor, or nothing per flow) is the shard's own.
    fn fork(&self) -> Option<Box<dyn NetScheduler>> {
        Some(Box::new(self.clone()))
    }

    /// Latency channels on queues of their own.
    fn separate_class_threads(&self) -> bool {
        true
    }

    /// Latency queues on the latency application's runtime, or on a queue runtime of
    /// their own ([`isolating_queue_placement`](crate::isolating_queue_placement)).
    fn place_queues(&self, host: &crate::QueueHost) -> Vec<crate::QueuePlace> {
        crate::isolating_queue_placement(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ThreadStats;
    use proptest::prelude::*;

    fn chan(id: u32, class: ChannelClass, thread: Option<u32>, queued: u64) -> ChannelStats {
        ChannelStats {
            id: ChannelId(id),
            class,
            thread: thread.map(ChannelThreadId),
            queued_bytes: queued,
            ..ChannelStats::default()
        }
    }

    fn chunk(class: AppClass) -> ChunkInfo {
        ChunkInfo {
            flow: 3,
            class,
            len: 100,
        }
    }

    #[test]
    fn latency_chunks_take_the_least_loaded_latency_channel_on_a_thread_of_its_own() {
        let mut iso = Isolating::default();
        let chans = [
            chan(0, ChannelClass::Throughput, Some(0), 0),
            chan(1, ChannelClass::Latency, Some(0), 0), // shares thread 0 with bulk
            chan(2, ChannelClass::Latency, Some(1), 500),
            chan(3, ChannelClass::Latency, Some(2), 100),
        ];
        assert_eq!(
            iso.pick_channel(&chunk(AppClass::Latency), &chans),
            Some(ChannelId(3))
        );
        // Only the shared one left under the threshold: better than nothing, still latency.
        let mut tight = Isolating::with_threshold(50);
        assert_eq!(
            tight.pick_channel(&chunk(AppClass::Latency), &chans),
            Some(ChannelId(1))
        );
        assert_eq!(
            tight.pick_channel(&chunk(AppClass::Latency), &chans[..1]),
            None
        );
    }

    #[test]
    fn throughput_chunks_never_take_latency_channels_and_avoid_their_threads() {
        let mut iso = Isolating::with_threshold(1000);
        let chans = [
            chan(0, ChannelClass::Throughput, Some(0), 0),
            chan(1, ChannelClass::Latency, Some(0), 0),
            chan(2, ChannelClass::Throughput, Some(1), 0),
            chan(3, ChannelClass::Throughput, Some(2), 0),
        ];
        let picks: Vec<_> = (0..4)
            .map(|_| {
                iso.pick_channel(&chunk(AppClass::Throughput), &chans)
                    .unwrap()
                    .0
            })
            .collect();
        assert_eq!(picks, [2, 3, 2, 3]);
        // Every throughput channel full: wait, never borrow the idle latency channel.
        let full = [
            chan(0, ChannelClass::Throughput, Some(0), 5000),
            chan(1, ChannelClass::Latency, Some(1), 0),
        ];
        assert_eq!(iso.pick_channel(&chunk(AppClass::Throughput), &full), None);
        // Only a thread-sharing throughput channel: used rather than stall bulk traffic.
        assert_eq!(
            iso.pick_channel(&chunk(AppClass::Throughput), &chans[..2]),
            Some(ChannelId(0))
        );
    }

    fn snapshot(chans: &[(ChannelClass, Option<usize>)], cores: Vec<usize>) -> StackSnapshot {
        let mut s = StackSnapshot {
            cores,
            ..StackSnapshot::default()
        };
        for (i, &(class, core)) in chans.iter().enumerate() {
            s.channels.push(chan(i as u32, class, Some(i as u32), 0));
            s.threads.push(ThreadStats {
                id: ChannelThreadId(i as u32),
                core,
                ..ThreadStats::default()
            });
        }
        s
    }

    /// Carries out the plan's pins on the snapshot (each pinned channel's thread moves).
    fn apply(s: &mut StackSnapshot, plan: &[PlanAction]) {
        for a in plan {
            let PlanAction::Pin { channel, core } = *a else {
                panic!("isolating plans only pins: {a:?}");
            };
            let t = s.channels[channel.0 as usize].thread.unwrap();
            s.threads.iter_mut().find(|x| x.id == t).unwrap().core = Some(core);
        }
    }

    #[test]
    fn plan_moves_latency_channels_to_reserved_cores_and_bulk_off_them() {
        use ChannelClass::{Latency as L, Throughput as T};
        let mut iso = Isolating::default();
        let mut s = snapshot(
            &[(T, Some(3)), (L, Some(0)), (T, Some(0)), (T, None)],
            vec![0, 1, 2, 3],
        );
        let plan = iso.plan(&s);
        assert_eq!(
            plan,
            [
                // Core 0 already runs channel 2: the misplaced go to the least used.
                PlanAction::Pin {
                    channel: ChannelId(0),
                    core: 1
                },
                PlanAction::Pin {
                    channel: ChannelId(1),
                    core: 3
                },
                PlanAction::Pin {
                    channel: ChannelId(3),
                    core: 2
                },
            ]
        );
        apply(&mut s, &plan);
        assert!(
            iso.plan(&s).is_empty(),
            "a carried-out plan wants nothing more"
        );
        assert!(iso
            .plan(&snapshot(&[(L, Some(0)), (T, Some(0))], vec![0]))
            .is_empty());
    }

    proptest! {
        /// Once the plan is carried out, no core runs both classes, every latency channel
        /// sits on a reserved core, and planning again changes nothing (no flapping).
        #[test]
        fn carried_out_plans_separate_the_classes_for_good(
            chans in proptest::collection::vec((any::<bool>(), proptest::option::of(0usize..6)), 0..16),
            ncores in 2usize..6,
            reserved in 1usize..4,
        ) {
            let chans: Vec<_> = chans
                .into_iter()
                .map(|(lat, core)| (if lat { ChannelClass::Latency } else { ChannelClass::Throughput }, core))
                .collect();
            let mut iso = Isolating::default().with_latency_cores(reserved);
            let mut s = snapshot(&chans, (0..ncores).collect());
            let plan = iso.plan(&s);
            apply(&mut s, &plan);
            let cores_of = |class| -> BTreeSet<usize> {
                s.channels.iter().filter(|c| c.class == class).filter_map(|c| s.core_of(c.id)).collect()
            };
            let (lat, bulk) = (cores_of(ChannelClass::Latency), cores_of(ChannelClass::Throughput));
            prop_assert!(lat.is_disjoint(&bulk), "latency {lat:?} bulk {bulk:?}");
            let first_reserved = ncores - reserved.min(ncores - 1);
            prop_assert!(lat.iter().all(|&c| c >= first_reserved));
            // Every channel has a known core now.
            prop_assert!(s.channels.iter().all(|c| s.core_of(c.id).is_some()));
            prop_assert!(iso.plan(&s).is_empty());
        }
    }
}
