//! Where a stack drives each of its NIC queues: the scheduler's placement decision, taken
//! when the stack starts and again when its plans change the host's shape.
//!
//! A queue's protocol work (its TCP connections, its rings) is done by one driver,
//! polled by one tokio runtime. Which one is a trade:
//!
//! - **The application's runtime** ([`QueuePlace::Application`]): the queue's rounds run
//!   between the application's tasks, on the same threads, run to completion. No thread
//!   hand-off on a message's path; the best on a host without cores to spare, where any
//!   other thread would take a core from the application.
//! - **A latency application's runtime** ([`QueuePlace::LatencyApplication`]): the queues
//!   that carry latency channels run beside the latency application only, so that bulk
//!   work never shares its threads (isolation).
//! - **Queue runtimes of the stack's own** ([`QueuePlace::Runtime`]): threads that only
//!   drive queues, the paper's disaggregated mode, for hosts with cores to spare: the
//!   application's threads hand messages over and go on.

use serde::{Deserialize, Serialize};

use crate::ChannelClass;

/// Hosts with at least this many usable cores get queue runtimes of their own by default;
/// smaller ones drive their queues on the application's runtime.
pub const DISAGGREGATE_MIN_CORES: usize = 8;

/// One NIC queue, as the placement decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueInfo {
    /// The queue's id.
    pub queue: u32,
    /// The class of channels the stack opens on it, where it keeps the classes on queues
    /// of their own ([`NetScheduler::separate_class_threads`](crate::NetScheduler::separate_class_threads)); `None`: any.
    pub class: Option<ChannelClass>,
}

/// The host a placement is decided for.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QueueHost {
    /// Cores the process may run on.
    pub cores: usize,
    /// The queues, in the stack's order.
    pub queues: Vec<QueueInfo>,
    /// The stack was built inside a multi-thread tokio runtime it may drive queues on.
    pub application_runtime: bool,
    /// A latency application's runtime was handed to the stack.
    pub latency_runtime: bool,
}

/// Where one queue's driver runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QueuePlace {
    /// The runtime the stack was built in.
    Application,
    /// The latency application's runtime.
    LatencyApplication,
    /// The stack's queue runtime number *i* (they are numbered from 0; the stack starts
    /// as many as the placement names, at least one).
    Runtime(usize),
}

/// The default placement: on a host with fewer than [`DISAGGREGATE_MIN_CORES`] usable
/// cores and an application runtime, every queue on the application's runtime (run to
/// completion: no hand-off, no thread competing for the few cores); otherwise queue
/// runtimes of the stack's own, one per queue up to half the cores, queue *i* on runtime
/// *i* modulo their number.
pub fn default_queue_placement(host: &QueueHost) -> Vec<QueuePlace> {
    if host.application_runtime && host.cores < DISAGGREGATE_MIN_CORES {
        return vec![QueuePlace::Application; host.queues.len()];
    }
    let runtimes = host.queues.len().min(host.cores / 2).max(1);
    (0..host.queues.len())
        .map(|i| QueuePlace::Runtime(i % runtimes))
        .collect()
}

/// [`default_queue_placement`], except that queues of latency channels go to the latency
/// application's runtime when there is one, or else to a queue runtime of their own
/// (never shared with a throughput queue), and throughput queues never go to the latency
/// application's runtime.
pub fn isolating_queue_placement(host: &QueueHost) -> Vec<QueuePlace> {
    let mut places = default_queue_placement(host);
    let latency: Vec<usize> = host
        .queues
        .iter()
        .enumerate()
        .filter(|(_, q)| q.class == Some(ChannelClass::Latency))
        .map(|(i, _)| i)
        .collect();
    if latency.is_empty() {
        return places;
    }
    if host.latency_runtime {
        for &i in &latency {
            places[i] = QueuePlace::LatencyApplication;
        }
        return places;
    }
    if places.iter().all(|p| *p == QueuePlace::Application) {
        // A small host: latency queues stay with the application, which is the only
        // runtime there is (a thread of their own would take a core from it).
        return places;
    }
    // A queue runtime of their own, after the throughput queues' ones.
    let bulk_count = host.queues.len() - latency.len();
    let bulk_runtimes = bulk_count.min((host.cores / 2).saturating_sub(1)).max(1);
    let mut bulk = 0;
    for (i, p) in places.iter_mut().enumerate() {
        if latency.contains(&i) {
            *p = QueuePlace::Runtime(bulk_runtimes);
        } else {
            *p = QueuePlace::Runtime(bulk % bulk_runtimes);
            bulk += 1;
        }
    }
    places
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(cores: usize, classes: &[Option<ChannelClass>], app: bool, lat: bool) -> QueueHost {
        QueueHost {
            cores,
            queues: classes
                .iter()
                .enumerate()
                .map(|(i, &class)| QueueInfo {
                    queue: i as u32,
                    class,
                })
                .collect(),
            application_runtime: app,
            latency_runtime: lat,
        }
    }

    /// Small hosts run to completion on the application's runtime; hosts with cores to
    /// spare get a runtime per queue up to half their cores; without an application
    /// runtime every host gets runtimes of its own.
    #[test]
    fn the_default_follows_the_cores_and_the_runtime() {
        use QueuePlace::*;
        assert_eq!(
            default_queue_placement(&host(2, &[None, None], true, false)),
            [Application, Application]
        );
        assert_eq!(
            default_queue_placement(&host(2, &[None, None], false, false)),
            [Runtime(0), Runtime(0)]
        );
        assert_eq!(
            default_queue_placement(&host(16, &[None; 4], true, false)),
            [Runtime(0), Runtime(1), Runtime(2), Runtime(3)]
        );
        assert_eq!(
            default_queue_placement(&host(8, &[None; 8], true, false)),
            [
                Runtime(0),
                Runtime(1),
                Runtime(2),
                Runtime(3),
                Runtime(0),
                Runtime(1),
                Runtime(2),
                Runtime(3)
            ]
        );
    }

    /// Latency queues go to the latency application's runtime when there is one, else to a
    /// runtime of their own on a host with runtimes; never beside throughput queues.
    #[test]
    fn isolating_keeps_latency_queues_apart() {
        use ChannelClass::*;
        use QueuePlace::*;
        let classes = [Some(Throughput), Some(Latency)];
        assert_eq!(
            isolating_queue_placement(&host(2, &classes, true, true)),
            [Application, LatencyApplication]
        );
        assert_eq!(
            isolating_queue_placement(&host(2, &classes, true, false)),
            [Application, Application]
        );
        assert_eq!(
            isolating_queue_placement(&host(16, &classes, true, false)),
            [Runtime(0), Runtime(1)]
        );
        let classes = [
            Some(Throughput),
            Some(Throughput),
            Some(Throughput),
            Some(Latency),
        ];
        let p = isolating_queue_placement(&host(16, &classes, false, false));
        assert_eq!(p, [Runtime(0), Runtime(1), Runtime(2), Runtime(3)]);
    }
}
