//! What a [`ChannelSet`] reports: steering counters and RSS state, the flow directory,
//! checksum and SYN statistics, and each queue's [`QueueStats`].

use super::super::placement::DriverPlace;
use super::super::stats::{QueueStats, RxChecksumStats, SynStats};
use super::super::sys::xsk_drops;
use super::super::ChannelError;
use super::ChannelSet;
use crate::rss::{PeerAlignmentCounts, RssState, SteeringCounts};
use std::sync::atomic::Ordering;

impl ChannelSet {
    /// The steering program's counters (redirected, passed, ...); an in-memory set has
    /// none to report and returns zeros. An AF_PACKET set reports the frames its socket
    /// filter handed to its sockets as `redirected` ([`packet_steering_counters`] has
    /// both of its counters).
    ///
    /// [`packet_steering_counters`]: ChannelSet::packet_steering_counters
    pub fn steering_counters(&self) -> Result<xdp_prog::Counters, ChannelError> {
        self.shared.with_steering(|s| s.counters())
    }

    /// How many of the set's channels so far were steered each way: accepted (owned by
    /// the queue their SYN arrived on), aligned (opened from a port whose replies land on
    /// their queue, or moved to the queue they land on), by an ntuple rule, or forwarded
    /// (alignment not possible or off, see [`ChannelSetConfig::rss`](crate::channel::ChannelSetConfig::rss)). Cumulative since
    /// the set started; each channel's own record is [`Channel::steering`](crate::channel::Channel::steering).
    pub fn steering_counts(&self) -> SteeringCounts {
        self.shared.aligner.counts()
    }

    /// How many of the channels the set opened so far had their port chosen to land on
    /// given queues at the peer as well ([`ChannelSet::connect_toward`]), missed them,
    /// or were opened without the peer's RSS. Cumulative; each channel's own record is
    /// [`Channel::peer_alignment`](crate::channel::Channel::peer_alignment).
    pub fn peer_alignment_counts(&self) -> PeerAlignmentCounts {
        self.shared.aligner.peer_counts()
    }

    /// What the set found of the interface's RSS when it started: reproducible (and so
    /// aligned to), not reproducible, not readable (veth), or alignment off.
    pub fn rss_state(&self) -> &RssState {
        self.shared.aligner.state()
    }

    /// The AF_PACKET steering's counters (frames handed to the set's sockets, frames kept
    /// from the kernel's TCP); `None` for a set of another link.
    pub fn packet_steering_counters(
        &self,
    ) -> Result<Option<xdp_prog::PacketCounters>, ChannelError> {
        self.shared.with_steering(|s| s.packet_counters())
    }

    /// Flows the flow directory holds (for tests and diagnostics).
    pub fn flow_count(&self) -> usize {
        self.shared.directory.len()
    }

    /// Frames that arrived on one queue for a flow owned by another queue and were
    /// forwarded to it, and those dropped because its forwarding queue was full.
    pub fn forwarded_frames(&self) -> (u64, u64) {
        (
            self.shared.forwarded.load(Ordering::Relaxed),
            self.shared.forward_dropped.load(Ordering::Relaxed),
        )
    }

    /// Receive checksum counters of all queues, and whether partial checksums are
    /// accepted on this interface (see [`PartialChecksums`](super::PartialChecksums)).
    pub fn rx_checksum_stats(&self) -> RxChecksumStats {
        let mut stats = RxChecksumStats {
            accept_partial: self.accept_partial,
            ..RxChecksumStats::default()
        };
        for p in &self.shared.peers {
            stats.partial += p.checksums.partial.load(Ordering::Relaxed);
            stats.bad += p.checksums.bad.load(Ordering::Relaxed);
        }
        stats
    }

    /// SYN and SYN-cookie counters of all queues.
    pub fn syn_stats(&self) -> SynStats {
        let mut stats = SynStats {
            cookies_enabled: self.config.syn_cookies,
            ..SynStats::default()
        };
        for p in &self.shared.peers {
            let s = &p.syns;
            stats.dropped += s.dropped.load(Ordering::Relaxed);
            stats.cookies_sent += s.cookies_sent.load(Ordering::Relaxed);
            stats.cookies_accepted += s.cookies_accepted.load(Ordering::Relaxed);
            stats.cookies_rejected += s.cookies_rejected.load(Ordering::Relaxed);
            stats.neighbor_mismatches += s.neighbor_mismatches.load(Ordering::Relaxed);
            stats.neighbor_unverified += s.neighbor_unverified.load(Ordering::Relaxed);
            stats.neighbor_reprobes += s.neighbor_reprobes.load(Ordering::Relaxed);
        }
        stats
    }

    /// Connections of all queues failed by a RST from the peer (one that passed RFC
    /// 5961's check: exactly at RCV.NXT). Local aborts are not counted.
    pub fn resets_received(&self) -> u64 {
        self.shared
            .peers
            .iter()
            .map(|p| p.resets_received.load(Ordering::Relaxed))
            .sum()
    }

    /// Each queue's driver: where it runs, the work it has done so far (time in polls
    /// that ran rounds, rounds, polls, wake-ups), cumulative since the set started,
    /// whatever runtime did it. Sample it twice for a utilisation.
    pub fn queue_stats(&self) -> Vec<QueueStats> {
        let rt = self.placement.lock();
        self.slots
            .iter()
            .enumerate()
            .map(|(i, slot)| {
                let place = rt
                    .queues
                    .get(i)
                    .map_or(DriverPlace::Runtime(rt.home), |q| q.now.clone());
                let core = match &place {
                    DriverPlace::Runtime(id) => rt.own.get(id).and_then(|r| r.core()),
                    DriverPlace::External(_) => None,
                };
                let fd = slot.rx_fd;
                let (binding, umem, tx_checksum) = self.links.get(i).copied().unwrap_or_default();
                QueueStats {
                    queue: slot.queue,
                    place,
                    core,
                    busy: std::time::Duration::from_nanos(slot.busy_ns.load(Ordering::Relaxed)),
                    rounds: slot.rounds.load(Ordering::Relaxed),
                    polls: slot.polls.load(Ordering::Relaxed),
                    wakeups: slot.signal.wakeups(),
                    xsk_drops: fd.and_then(|fd| {
                        // SAFETY: the descriptor is the queue's AF_XDP socket, open for as
                        // long as its slot, which `self.slots` holds.
                        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
                        xsk_drops(fd).ok()
                    }),
                    binding,
                    umem,
                    tx_checksum,
                    packet: self
                        .packet_counters
                        .get(i)
                        .and_then(Option::as_ref)
                        .map(|c| {
                            if let Some(fd) = fd {
                                // SAFETY: the descriptor is the queue's AF_PACKET socket, open
                                // for as long as its slot, which `self.slots` holds.
                                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
                                // The kernel's count resets when read: it is added to the
                                // link's own, which every reader shares.
                                let _ = c.collect_socket_drops(fd);
                            }
                            c.snapshot()
                        }),
                }
            })
            .collect()
    }
}
