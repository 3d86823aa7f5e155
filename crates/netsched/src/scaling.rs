//! Run-time scaling decisions: when to open one more channel to a peer and when to close
//! an idle one, as pure decision logic over snapshots.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::{
    ChannelClass, ChannelId, ChannelStats, ChannelThreadId, ChunkInfo, CopyRequest, CopyWorkerId,
    CopyWorkerStats, NetScheduler, PeerId, PlanAction, StackSnapshot,
};

/// When a [`Scaler`] opens and closes channels. Evaluations are counted in calls to
/// [`Scaler::evaluate`] (one per plan period).
#[derive(Debug, Clone, PartialEq)]
pub struct ScalingConfig {
    /// A group of channels (one peer, one class) is busy when the mean utilisation of the
    /// queue runtimes driving it is above this (default 0.85).
    pub scale_up_utilisation: f64,
    /// Consecutive busy evaluations before a channel is added to the group (default 3).
    pub scale_up_periods: u32,
    /// An idle channel is closed only while the group's utilisation is below this, which
    /// must be lower than `scale_up_utilisation` (hysteresis; default 0.4). A group whose
    /// threads are unknown counts as below.
    pub scale_down_utilisation: f64,
    /// Consecutive evaluations a channel must be idle (nothing queued, nothing in flight,
    /// nothing sent since the previous evaluation) before it is closed (default 10).
    pub idle_grace_periods: u32,
    /// Evaluations after an action during which the group is left alone, so that the
    /// effect of one change is seen before the next (default 5).
    pub cooldown_periods: u32,
    /// Fewest channels a group keeps (default 1; at least 1).
    pub min_channels: usize,
    /// Most channels a group grows to (default 16, the paper's fixed count).
    pub max_channels: usize,
}

impl Default for ScalingConfig {
    fn default() -> Self {
        ScalingConfig {
            scale_up_utilisation: 0.85,
            scale_up_periods: 3,
            scale_down_utilisation: 0.4,
            idle_grace_periods: 10,
            cooldown_periods: 5,
            min_channels: 1,
            max_channels: 16,
        }
    }
}

/// Why a [`ScalingConfig`] was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ScalingConfigError {
    /// A utilisation threshold is outside `0.0..=1.0` (or not a number).
    #[error("utilisation thresholds must lie in 0.0..=1.0 (up {up}, down {down})")]
    UtilisationOutOfRange {
        /// `scale_up_utilisation`.
        up: f64,
        /// `scale_down_utilisation`.
        down: f64,
    },
    /// The scale-down threshold is not below the scale-up one: no hysteresis.
    #[error("scale_down_utilisation ({down}) must be below scale_up_utilisation ({up})")]
    NoHysteresis {
        /// `scale_up_utilisation`.
        up: f64,
        /// `scale_down_utilisation`.
        down: f64,
    },
    /// A period count that must be at least 1 is 0.
    #[error("{0} must be at least 1")]
    ZeroPeriods(&'static str),
    /// `min_channels` is 0 or above `max_channels`.
    #[error("need 1 <= min_channels ({min}) <= max_channels ({max})")]
    ChannelBounds {
        /// `min_channels`.
        min: usize,
        /// `max_channels`.
        max: usize,
    },
}

impl ScalingConfig {
    /// Checks the thresholds and bounds.
    pub fn validate(&self) -> Result<(), ScalingConfigError> {
        let (up, down) = (self.scale_up_utilisation, self.scale_down_utilisation);
        let unit = 0.0..=1.0;
        if !unit.contains(&up) || !unit.contains(&down) {
            return Err(ScalingConfigError::UtilisationOutOfRange { up, down });
        }
        if down >= up {
            return Err(ScalingConfigError::NoHysteresis { up, down });
        }
        if self.scale_up_periods == 0 {
            return Err(ScalingConfigError::ZeroPeriods("scale_up_periods"));
        }
        if self.idle_grace_periods == 0 {
            return Err(ScalingConfigError::ZeroPeriods("idle_grace_periods"));
        }
        if self.min_channels == 0 || self.min_channels > self.max_channels {
            return Err(ScalingConfigError::ChannelBounds {
                min: self.min_channels,
                max: self.max_channels,
            });
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct GroupState {
    /// Consecutive evaluations the group was busy.
    busy_streak: u32,
    /// Evaluations left during which the group is left alone.
    cooldown: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct ThreadTrack {
    /// Consecutive evaluations the thread was busy.
    busy_streak: u32,
    /// Consecutive evaluations it served no queue.
    empty_streak: u32,
}

#[derive(Debug, Clone, Copy)]
struct ChannelTrack {
    sent_bytes: u64,
    idle_streak: u32,
}

/// Decides, once per plan period, when a peer needs one more channel of a class and when
/// an idle channel can go: pure decision logic that any policy can call from its
/// [`plan`](NetScheduler::plan) (or use through [`Scaled`]).
///
/// Channels are grouped by (peer, class). A group gets an
/// [`OpenChannel`](PlanAction::OpenChannel) once the queue runtimes driving it have stayed
/// busier than [`ScalingConfig::scale_up_utilisation`] for
/// [`ScalingConfig::scale_up_periods`] evaluations in a row, up to
/// [`ScalingConfig::max_channels`]. It gets a [`CloseChannel`](PlanAction::CloseChannel)
/// for its highest-numbered channel idle for [`ScalingConfig::idle_grace_periods`]
/// evaluations, while its utilisation is below the lower
/// [`ScalingConfig::scale_down_utilisation`], down to [`ScalingConfig::min_channels`].
/// After either, the group is left alone for [`ScalingConfig::cooldown_periods`]
/// evaluations: at most one change per group per cooldown, so it cannot flap.
///
/// ```
/// use std::time::Duration;
/// use netsched::{ChannelClass, ChannelId, ChannelStats, ChannelThreadId, PeerId, PlanAction,
///     Scaler, ScalingConfig, StackSnapshot, ThreadStats};
///
/// let mut scaler = Scaler::new(ScalingConfig { scale_up_periods: 2, ..ScalingConfig::default() })?;
/// let busy = StackSnapshot {
///     channels: vec![ChannelStats {
///         id: ChannelId(0),
///         peer: PeerId(1),
///         thread: Some(ChannelThreadId(0)),
///         queued_bytes: 1 << 20,
///         ..ChannelStats::default()
///     }],
///     threads: vec![ThreadStats {
///         id: ChannelThreadId(0),
///         busy: Duration::from_millis(95),
///         window: Duration::from_millis(100),
///         ..ThreadStats::default()
///     }],
///     ..StackSnapshot::default()
/// };
/// assert!(scaler.evaluate(&busy).is_empty()); // busy once: not yet
/// assert_eq!(
///     scaler.evaluate(&busy),
///     [PlanAction::OpenChannel { peer: PeerId(1), class: ChannelClass::Throughput }]
/// );
/// assert!(scaler.evaluate(&busy).is_empty()); // cooling down
/// # Ok::<(), netsched::ScalingConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Scaler {
    config: ScalingConfig,
    groups: BTreeMap<(PeerId, ChannelClass), GroupState>,
    channels: BTreeMap<ChannelId, ChannelTrack>,
    threads: BTreeMap<ChannelThreadId, ThreadTrack>,
    /// Evaluations left during which threads are left alone.
    thread_cooldown: u32,
    /// [`Scaler::placing_threads`].
    place_threads: bool,
}

impl Scaler {
    /// A scaler with `config`, once it is valid.
    pub fn new(config: ScalingConfig) -> Result<Self, ScalingConfigError> {
        config.validate()?;
        Ok(Scaler {
            config,
            groups: BTreeMap::new(),
            channels: BTreeMap::new(),
            threads: BTreeMap::new(),
            thread_cooldown: 0,
            place_threads: false,
        })
    }

    /// The scaler also places queue runtimes (off unless asked): a runtime that drives
    /// several NIC queues and stays busier than [`ScalingConfig::scale_up_utilisation`]
    /// for [`ScalingConfig::scale_up_periods`] evaluations hands its highest queue
    /// ([`PlanAction::AssignQueue`]) to a runtime that drives none, spawning one
    /// ([`PlanAction::SpawnThread`]) on a core of the snapshot's `cores` that no runtime
    /// is pinned to when there is no such runtime; a runtime that drives no queue for
    /// [`ScalingConfig::idle_grace_periods`] evaluations is retired
    /// ([`PlanAction::RetireThread`]). After a queue moves, runtimes are left alone for
    /// [`ScalingConfig::cooldown_periods`]. It needs snapshots with the placement
    /// ([`StackSnapshot::queues`]); without it, it does nothing.
    pub fn placing_threads(mut self) -> Self {
        self.place_threads = true;
        self
    }

    /// Whether the scaler places queue runtimes ([`Scaler::placing_threads`]).
    pub fn places_threads(&self) -> bool {
        self.place_threads
    }

    /// The configuration.
    pub fn config(&self) -> &ScalingConfig {
        &self.config
    }

    /// The mean utilisation of the threads running `channels`, if any of them is known.
    fn utilisation<'a>(
        snapshot: &StackSnapshot,
        channels: impl Iterator<Item = &'a ChannelStats>,
    ) -> Option<f64> {
        let threads: BTreeSet<_> = channels.filter_map(|c| c.thread).collect();
        let known: Vec<f64> = threads
            .into_iter()
            .filter_map(|t| snapshot.thread(t))
            .map(|t| t.utilisation())
            .collect();
        (!known.is_empty()).then(|| known.iter().sum::<f64>() / known.len() as f64)
    }

    /// One evaluation: updates the streaks from `snapshot` and returns the changes due
    /// now (at most one per group).
    pub fn evaluate(&mut self, snapshot: &StackSnapshot) -> Vec<PlanAction> {
        let cfg = &self.config;
        // Idle streaks, per channel; channels gone from the snapshot are forgotten.
        let mut tracks = BTreeMap::new();
        for c in &snapshot.channels {
            let previous = self.channels.get(&c.id);
            let idle = c.queued_bytes == 0
                && c.in_flight_bytes == 0
                && previous.is_some_and(|p| p.sent_bytes == c.sent_bytes);
            let idle_streak = match (idle, previous) {
                (true, Some(p)) => p.idle_streak.saturating_add(1),
                _ => 0,
            };
            tracks.insert(
                c.id,
                ChannelTrack {
                    sent_bytes: c.sent_bytes,
                    idle_streak,
                },
            );
        }
        self.channels = tracks;

        let mut groups: BTreeMap<(PeerId, ChannelClass), Vec<&ChannelStats>> = BTreeMap::new();
        for c in &snapshot.channels {
            groups.entry((c.peer, c.class)).or_default().push(c);
        }
        self.groups.retain(|key, _| groups.contains_key(key));

        let mut actions = Vec::new();
        for (&(peer, class), members) in &groups {
            let state = self.groups.entry((peer, class)).or_default();
            let utilisation = Self::utilisation(snapshot, members.iter().copied());
            let busy = utilisation.is_some_and(|u| u > cfg.scale_up_utilisation);
            state.busy_streak = if busy {
                state.busy_streak.saturating_add(1)
            } else {
                0
            };
            if state.cooldown > 0 {
                state.cooldown -= 1;
                continue;
            }
            let count = members.len();
            if state.busy_streak >= cfg.scale_up_periods && count < cfg.max_channels {
                actions.push(PlanAction::OpenChannel { peer, class });
                state.busy_streak = 0;
                state.cooldown = cfg.cooldown_periods;
                continue;
            }
            let quiet = utilisation.is_none_or(|u| u < cfg.scale_down_utilisation);
            if !quiet || count <= cfg.min_channels {
                continue;
            }
            let idle = members
                .iter()
                .filter(|c| self.channels[&c.id].idle_streak >= cfg.idle_grace_periods)
                .map(|c| c.id)
                .max();
            if let Some(channel) = idle {
                actions.push(PlanAction::CloseChannel { channel });
                state.cooldown = cfg.cooldown_periods;
                if let Some(t) = self.channels.get_mut(&channel) {
                    t.idle_streak = 0;
                }
            }
        }
        if self.place_threads {
            actions.extend(self.place_threads(snapshot));
        }
        actions
    }

    /// The thread placement of [`Scaler::placing_threads`]: at most one action.
    fn place_threads(&mut self, snapshot: &StackSnapshot) -> Option<PlanAction> {
        if snapshot.queues.is_empty() {
            return None;
        }
        let cfg = &self.config;
        let mut tracks = BTreeMap::new();
        for t in &snapshot.threads {
            let before = self.threads.get(&t.id).copied().unwrap_or_default();
            let busy = t.utilisation() > cfg.scale_up_utilisation;
            let empty = snapshot.queues_of(t.id).next().is_none();
            tracks.insert(
                t.id,
                ThreadTrack {
                    busy_streak: if busy { before.busy_streak + 1 } else { 0 },
                    empty_streak: if empty { before.empty_streak + 1 } else { 0 },
                },
            );
        }
        self.threads = tracks;
        if self.thread_cooldown > 0 {
            self.thread_cooldown -= 1;
            return None;
        }
        let crowded = snapshot
            .threads
            .iter()
            .filter(|t| snapshot.queues_of(t.id).nth(1).is_some())
            .filter(|t| self.threads[&t.id].busy_streak >= cfg.scale_up_periods)
            .max_by(|a, b| a.utilisation().total_cmp(&b.utilisation()));
        if let Some(crowded) = crowded {
            let queue = snapshot.queues_of(crowded.id).max()?;
            let spare = snapshot
                .threads
                .iter()
                .find(|t| snapshot.queues_of(t.id).next().is_none());
            return match spare {
                Some(spare) => {
                    self.thread_cooldown = cfg.cooldown_periods;
                    if let Some(t) = self.threads.get_mut(&crowded.id) {
                        t.busy_streak = 0;
                    }
                    Some(PlanAction::AssignQueue {
                        queue,
                        thread: spare.id,
                    })
                }
                // Repeated until the thread shows up, which the stack makes harmless
                // (one thread per core); the next evaluation then assigns.
                None => snapshot
                    .cores
                    .iter()
                    .find(|&&c| !snapshot.threads.iter().any(|t| t.core == Some(c)))
                    .map(|&core| PlanAction::SpawnThread { core }),
            };
        }
        snapshot
            .threads
            .iter()
            .find(|t| self.threads[&t.id].empty_streak >= cfg.idle_grace_periods)
            .map(|t| PlanAction::RetireThread { thread: t.id })
    }
}

/// Any policy with a [`Scaler`] added: chunk and copy decisions are the policy's, and its
/// plan is followed by the scaler's actions.
#[derive(Debug, Clone)]
pub struct Scaled<P> {
    policy: P,
    scaler: Scaler,
}

impl<P: NetScheduler> Scaled<P> {
    /// `policy`, scaled by a scaler with `config`.
    pub fn new(policy: P, config: ScalingConfig) -> Result<Self, ScalingConfigError> {
        Ok(Scaled {
            policy,
            scaler: Scaler::new(config)?,
        })
    }

    /// The wrapped policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// The scaler.
    pub fn scaler(&self) -> &Scaler {
        &self.scaler
    }

    /// The scaler also places queue runtimes ([`Scaler::placing_threads`]).
    pub fn placing_threads(mut self) -> Self {
        self.scaler = self.scaler.placing_threads();
        self
    }
}

impl<P: NetScheduler> NetScheduler for Scaled<P> {
    fn pick_channel(&mut self, chunk: &ChunkInfo, channels: &[ChannelStats]) -> Option<ChannelId> {
        self.policy.pick_channel(chunk, channels)
    }

    fn pick_copy_worker(
        &mut self,
        request: &CopyRequest,
        workers: &[CopyWorkerStats],
    ) -> Option<CopyWorkerId> {
        self.policy.pick_copy_worker(request, workers)
    }

    fn plan(&mut self, snapshot: &StackSnapshot) -> Vec<PlanAction> {
        let mut actions = self.policy.plan(snapshot);
        actions.extend(self.scaler.evaluate(snapshot));
        actions
    }

    fn plan_period(&self) -> Duration {
        self.policy.plan_period()
    }

    /// The wrapped policy's fork: per-chunk decisions are the policy's; the scaler's
    /// plans are asked of the first instance only.
    fn fork(&self) -> Option<Box<dyn NetScheduler>> {
        self.policy.fork()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChannelThreadId, ThreadStats};
    use proptest::prelude::*;

    const PEER: PeerId = PeerId(7);

    /// A snapshot of one peer's throughput channels, each on its own thread, all threads
    /// at `utilisation` (per mille); `active` channels have bytes queued.
    fn snapshot(ids: &[u32], utilisation: u64, active: &[u32], sent: u64) -> StackSnapshot {
        let mut s = StackSnapshot::default();
        for &id in ids {
            let busy = active.contains(&id);
            s.channels.push(ChannelStats {
                id: ChannelId(id),
                peer: PEER,
                thread: Some(ChannelThreadId(id)),
                queued_bytes: if busy { 4096 } else { 0 },
                sent_bytes: sent,
                ..ChannelStats::default()
            });
            s.threads.push(ThreadStats {
                id: ChannelThreadId(id),
                core: None,
                busy: Duration::from_millis(utilisation),
                window: Duration::from_millis(1000),
                rx_dropped: 0,
            });
        }
        s
    }

    fn open() -> PlanAction {
        PlanAction::OpenChannel {
            peer: PEER,
            class: ChannelClass::Throughput,
        }
    }

    /// Threads `(id, core, utilisation per mille, queues)`, the cores the stack may use.
    fn placed(threads: &[(u32, Option<usize>, u64, &[u32])], cores: &[usize]) -> StackSnapshot {
        let mut s = StackSnapshot {
            cores: cores.to_vec(),
            ..StackSnapshot::default()
        };
        for &(id, core, utilisation, queues) in threads {
            s.threads.push(ThreadStats {
                id: ChannelThreadId(id),
                core,
                busy: Duration::from_millis(utilisation),
                window: Duration::from_millis(1000),
                rx_dropped: 0,
            });
            for &queue in queues {
                s.queues.push(crate::QueueStats {
                    queue,
                    thread: ChannelThreadId(id),
                });
            }
        }
        s
    }

    fn placing() -> Scaler {
        Scaler::new(ScalingConfig {
            scale_up_periods: 2,
            idle_grace_periods: 3,
            cooldown_periods: 2,
            ..ScalingConfig::default()
        })
        .unwrap()
        .placing_threads()
    }

    #[test]
    fn a_busy_thread_with_two_queues_gets_a_thread_on_a_free_core_for_one() {
        let mut scaler = placing();
        let crowded = placed(&[(0, Some(0), 950, &[0, 1])], &[0, 1]);
        assert!(scaler.evaluate(&crowded).is_empty(), "busy once: not yet");
        let spawn = [PlanAction::SpawnThread { core: 1 }];
        assert_eq!(scaler.evaluate(&crowded), spawn);
        // Wished again until the thread shows up (the stack spawns one per core).
        assert_eq!(scaler.evaluate(&crowded), spawn);
        // It did, serving nothing (no utilisation measured yet): queue 1 goes to it.
        let spare = placed(&[(0, Some(0), 950, &[0, 1]), (5, Some(1), 0, &[])], &[0, 1]);
        assert_eq!(
            scaler.evaluate(&spare),
            [PlanAction::AssignQueue {
                queue: 1,
                thread: ChannelThreadId(5)
            }]
        );
        // Cooling down, even though the snapshot does not show the move yet.
        assert!(scaler.evaluate(&spare).is_empty());
        assert!(scaler.evaluate(&spare).is_empty());
        let spread = placed(&[(0, Some(0), 600, &[0]), (5, Some(1), 500, &[1])], &[0, 1]);
        for _ in 0..10 {
            assert!(scaler.evaluate(&spread).is_empty());
        }
    }

    #[test]
    fn no_free_core_no_spare_thread_no_move() {
        let mut scaler = placing();
        // Both cores have a thread; the busy one's queues have nowhere to go.
        let s = placed(
            &[(0, Some(0), 990, &[0, 1]), (1, Some(1), 990, &[2])],
            &[0, 1],
        );
        for _ in 0..10 {
            assert!(scaler.evaluate(&s).is_empty());
        }
    }

    #[test]
    fn a_thread_serving_nothing_is_retired_after_the_grace() {
        let mut scaler = placing();
        let s = placed(&[(0, None, 100, &[0, 1]), (3, None, 0, &[])], &[0, 1]);
        assert!(scaler.evaluate(&s).is_empty());
        assert!(scaler.evaluate(&s).is_empty());
        assert_eq!(
            scaler.evaluate(&s),
            [PlanAction::RetireThread {
                thread: ChannelThreadId(3)
            }]
        );
    }

    #[test]
    fn thread_placement_is_off_by_default_and_without_a_placement() {
        let mut off = Scaler::new(ScalingConfig {
            scale_up_periods: 1,
            ..ScalingConfig::default()
        })
        .unwrap();
        assert!(!off.places_threads() && placing().places_threads());
        let crowded = placed(&[(0, Some(0), 990, &[0, 1]), (3, None, 0, &[])], &[0, 1]);
        for _ in 0..20 {
            assert!(off.evaluate(&crowded).is_empty());
        }
        // On, but the snapshot has no placement (an in-memory stack): nothing.
        let mut on = placing();
        let mut bare = crowded.clone();
        bare.queues.clear();
        for _ in 0..20 {
            assert!(on.evaluate(&bare).is_empty());
        }
    }

    #[test]
    fn configs_without_hysteresis_or_with_bad_bounds_are_refused() {
        let ok = ScalingConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        let bad = |c: ScalingConfig| Scaler::new(c).unwrap_err();
        assert!(matches!(
            bad(ScalingConfig {
                scale_down_utilisation: 0.85,
                ..ok.clone()
            }),
            ScalingConfigError::NoHysteresis { .. }
        ));
        assert!(matches!(
            bad(ScalingConfig {
                scale_up_utilisation: 1.5,
                ..ok.clone()
            }),
            ScalingConfigError::UtilisationOutOfRange { .. }
        ));
        assert!(matches!(
            bad(ScalingConfig {
                scale_up_utilisation: f64::NAN,
                ..ok.clone()
            }),
            ScalingConfigError::UtilisationOutOfRange { .. }
        ));
        assert_eq!(
            bad(ScalingConfig {
                scale_up_periods: 0,
                ..ok.clone()
            }),
            ScalingConfigError::ZeroPeriods("scale_up_periods")
        );
        assert_eq!(
            bad(ScalingConfig {
                min_channels: 5,
                max_channels: 4,
                ..ok.clone()
            }),
            ScalingConfigError::ChannelBounds { min: 5, max: 4 }
        );
        assert!(matches!(
            bad(ScalingConfig {
                min_channels: 0,
                ..ok
            }),
            ScalingConfigError::ChannelBounds { .. }
        ));
    }

    #[test]
    fn opens_after_n_busy_periods_then_cools_down_and_stops_at_max() {
        let mut s = Scaler::new(ScalingConfig {
            scale_up_periods: 3,
            cooldown_periods: 2,
            max_channels: 2,
            ..ScalingConfig::default()
        })
        .unwrap();
        let busy = snapshot(&[0], 950, &[0], 0);
        assert!(s.evaluate(&busy).is_empty());
        assert!(s.evaluate(&busy).is_empty());
        assert_eq!(s.evaluate(&busy), [open()]);
        // Cooldown: two evaluations with no action even though still busy.
        assert!(s.evaluate(&busy).is_empty());
        assert!(s.evaluate(&busy).is_empty());
        // The streak kept counting through the cooldown, so a still-busy group grows
        // again at once, but never past max_channels.
        assert_eq!(s.evaluate(&busy), [open()]);
        let two = snapshot(&[0, 1], 950, &[0, 1], 0);
        for _ in 0..10 {
            assert!(s.evaluate(&two).is_empty());
        }
    }

    #[test]
    fn utilisation_oscillating_around_the_threshold_never_opens() {
        let mut s = Scaler::new(ScalingConfig::default()).unwrap();
        for round in 0..50 {
            let u = if round % 3 == 2 { 500 } else { 950 };
            assert!(
                s.evaluate(&snapshot(&[0], u, &[0], 0)).is_empty(),
                "round {round}"
            );
        }
    }

    #[test]
    fn idle_channels_close_after_the_grace_only_below_the_lower_threshold() {
        let cfg = ScalingConfig {
            idle_grace_periods: 3,
            cooldown_periods: 1,
            min_channels: 2,
            ..ScalingConfig::default()
        };
        let mut s = Scaler::new(cfg.clone()).unwrap();
        // Between the thresholds (0.6): idle channels stay, however long.
        for _ in 0..20 {
            assert!(s
                .evaluate(&snapshot(&[0, 1, 2, 3], 600, &[0], 0))
                .is_empty());
        }
        // Below 0.4: the highest idle channel goes right away, its streak being long.
        assert_eq!(
            s.evaluate(&snapshot(&[0, 1, 2, 3], 100, &[0], 0)),
            [PlanAction::CloseChannel {
                channel: ChannelId(3)
            }]
        );
        // The next one waits for the cooldown, then goes; the minimum of 2 holds.
        let three = snapshot(&[0, 1, 2], 100, &[0], 0);
        assert!(s.evaluate(&three).is_empty());
        assert_eq!(
            s.evaluate(&three),
            [PlanAction::CloseChannel {
                channel: ChannelId(2)
            }]
        );
        let two = snapshot(&[0, 1], 100, &[0], 0);
        for _ in 0..10 {
            assert!(s.evaluate(&two).is_empty());
        }
        // A channel that sends between evaluations is not idle, even with empty queues.
        let mut fresh = Scaler::new(cfg).unwrap();
        for sent in 0..10 {
            assert!(fresh
                .evaluate(&snapshot(&[0, 1, 2], 100, &[], sent))
                .is_empty());
        }
    }

    proptest! {
        /// Carrying out every action on a simulated peer under random load: opens only
        /// after `scale_up_periods` busy evaluations, closes only channels idle for the
        /// grace while the group is below the lower threshold, at least `cooldown + 1`
        /// evaluations between two changes, and the channel count within its bounds.
        #[test]
        fn scaling_respects_thresholds_hysteresis_and_cooldown(
            load in proptest::collection::vec(
                (prop_oneof![Just(100u64), Just(600), Just(950)], any::<u8>()),
                1..120,
            ),
            up_periods in 1u32..4,
            grace in 1u32..5,
            cooldown in 0u32..4,
        ) {
            let cfg = ScalingConfig {
                scale_up_periods: up_periods,
                idle_grace_periods: grace,
                cooldown_periods: cooldown,
                min_channels: 1,
                max_channels: 4,
                ..ScalingConfig::default()
            };
            let mut scaler = Scaler::new(cfg).unwrap();
            let mut ids = vec![0u32];
            let mut next_id = 1;
            let mut sent: BTreeMap<u32, u64> = BTreeMap::new();
            // Per evaluation: utilisation, and per channel whether it was idle (None: new).
            let mut history: Vec<(u64, BTreeMap<u32, Option<bool>>)> = Vec::new();
            let mut last_action: Option<usize> = None;
            for (t, &(util, activity)) in load.iter().enumerate() {
                let mut s = StackSnapshot::default();
                let mut idle_now = BTreeMap::new();
                for (k, &id) in ids.iter().enumerate() {
                    // Bit k of `activity` says whether channel k moved bytes this period.
                    let active = activity & (1 << (k % 8)) != 0;
                    let before = sent.get(&id).copied();
                    let bytes = before.unwrap_or(0) + u64::from(active) * 1000;
                    sent.insert(id, bytes);
                    idle_now.insert(id, before.map(|b| b == bytes));
                    s.channels.push(ChannelStats {
                        id: ChannelId(id),
                        peer: PEER,
                        thread: Some(ChannelThreadId(id)),
                        sent_bytes: bytes,
                        ..ChannelStats::default()
                    });
                    s.threads.push(ThreadStats {
                        id: ChannelThreadId(id),
                        core: None,
                        busy: Duration::from_millis(util),
                        window: Duration::from_millis(1000),
                        rx_dropped: 0,
                    });
                }
                history.push((util, idle_now));
                let actions = scaler.evaluate(&s);
                prop_assert!(actions.len() <= 1, "one group, one change at most: {actions:?}");
                let Some(&action) = actions.first() else { continue };
                if let Some(prev) = last_action {
                    prop_assert!(t - prev > cooldown as usize, "flapping: {prev} then {t}");
                }
                last_action = Some(t);
                match action {
                    PlanAction::OpenChannel { .. } => {
                        let streak = up_periods as usize;
                        prop_assert!(t + 1 >= streak);
                        prop_assert!(history[t + 1 - streak..].iter().all(|(u, _)| *u == 950));
                        ids.push(next_id);
                        next_id += 1;
                    }
                    PlanAction::CloseChannel { channel } => {
                        prop_assert!(util == 100, "closed at utilisation {util}");
                        let g = grace as usize;
                        prop_assert!(t + 1 >= g);
                        for (_, idle) in &history[t + 1 - g..] {
                            prop_assert_eq!(idle.get(&channel.0).copied().flatten(), Some(true));
                        }
                        ids.retain(|&id| id != channel.0);
                        sent.remove(&channel.0);
                    }
                    other => prop_assert!(false, "unexpected {other:?}"),
                }
                prop_assert!((1..=4).contains(&ids.len()), "{} channels", ids.len());
            }
        }
    }
}
