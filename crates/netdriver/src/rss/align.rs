//! The decision, per outgoing channel, of how its frames will reach the queue that owns
//! it: a local port RSS maps there, else an ntuple rule, else forwarding.
//!
//! An [`RssAligner`] is made once per interface ([`RssAligner::probe`] reads the NIC's RSS
//! in the calling thread's network namespace and logs what alignment will do), then asked
//! once per channel: [`RssAligner::connect`] for a channel this host opens,
//! [`RssAligner::accepted`] for one it accepted (owned by the queue its SYN arrived on,
//! where RSS puts every later frame as well). Both return the [`ChannelSteering`] record
//! the channel keeps and count it ([`RssAligner::counts`]).
//!
//! A channel set opens each channel on a queue of its own choosing (round robin), so the
//! queue may give way where the port cannot: [`RssAligner::connect_among`] takes the
//! set's other queues, and when no free port lands on the preferred one, it takes a port
//! that lands on one of them and names that queue as the owner
//! ([`ConnectSteering::queue`]). The port and the owner then agree, whatever the NIC's
//! table looks like (a queue it leaves out, or fields that hash no ports).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{info, warn};

use super::ethtool::{EthtoolSocket, NtupleRule, RssError};
use super::peer::{PeerAlignment, PeerAlignmentCounters, PeerAlignmentCounts};
use super::port::{PortChoiceError, PortChooser};
use super::steering::{ChannelSteering, ForwardReason, SteeringCounters, SteeringCounts};
use super::toeplitz::{FlowTuple, RssConfig};

/// What [`RssAligner::probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RssState {
    /// Toeplitz over the 4-tuple (or a variant this crate reproduces): ports are chosen.
    Predictable(RssConfig),
    /// Read, but not reproducible; the reason.
    Unpredictable(RssConfig, String),
    /// Not readable (veth has no RSS); the reason.
    Unreadable(String),
    /// Alignment is off ([`RssAligner::disabled`]): for A/B measurements, and for links
    /// whose queues are no NIC's (an in-memory switch).
    Off,
}

impl RssState {
    /// Whether ports are chosen ([`RssState::Predictable`]).
    pub fn is_predictable(&self) -> bool {
        matches!(self, RssState::Predictable(_))
    }
}

/// The outcome of [`RssAligner::connect`].
#[derive(Debug)]
pub struct ConnectSteering {
    /// The local port to connect from (claimed through the caller's `claim`).
    pub port: u16,
    /// The queue that must own the channel: the one asked for, or, from
    /// [`RssAligner::connect_among`], the other queue the port's replies land on.
    pub queue: u32,
    /// How the channel's frames reach its queue.
    pub steering: ChannelSteering,
    /// The queue the peer's replies land on, under this host's RSS, when known.
    pub local_queue: Option<u32>,
    /// The queue this host's frames land on at the peer, under the peer's RSS, when it
    /// was given and honoured.
    pub peer_queue: Option<u32>,
    /// Whether the port lands where [`ChannelEnds::peer`] asked at the peer.
    pub peer_alignment: PeerAlignment,
    /// The ntuple rule, for [`ChannelSteering::Ntuple`]: keep it as long as the channel
    /// lives; dropping it removes the rule.
    pub rule: Option<NtupleRule>,
}

/// A channel to open: between which addresses, owned by which queue.
#[derive(Debug, Clone, Copy)]
pub struct ChannelEnds<'a> {
    /// This host's address.
    pub local: Ipv4Addr,
    /// The peer's address and channel port.
    pub remote: SocketAddrV4,
    /// The queue that will own the channel.
    pub queue: u32,
    /// Where its frames should land at the peer, when the peer's RSS is known.
    pub peer: Option<PeerTarget<'a>>,
}

/// The peer's RSS and the queues a channel must land on there (its latency queues, for a
/// latency channel).
#[derive(Debug, Clone, Copy)]
pub struct PeerTarget<'a> {
    /// The peer's RSS.
    pub rss: &'a RssConfig,
    /// Acceptable queues at the peer.
    pub queues: &'a [u32],
}

/// Every local port in the range is in use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no free local port in {lo}..={hi}")]
pub struct NoFreePort {
    /// First port of the range.
    pub lo: u16,
    /// Last port of the range.
    pub hi: u16,
}

/// Per-interface RSS alignment of outgoing channels. See the [module documentation](self).
#[derive(Debug)]
pub struct RssAligner {
    ifname: String,
    state: RssState,
    /// Where ntuple rules are installed; `None` when they are not to be tried.
    ntuple: Option<EthtoolSocket>,
    /// Set once the NIC said it has no ntuple rules, so that later channels skip the try.
    ntuple_unsupported: AtomicBool,
    counters: SteeringCounters,
    peer_counters: PeerAlignmentCounters,
}

impl RssAligner {
    /// Reads `ifname`'s RSS in the calling thread's network namespace. With `ntuple`,
    /// channels whose port cannot align get an ntuple rule where the NIC allows. Never
    /// fails: an unreadable RSS means forwarding (logged once, here).
    pub fn probe(ifname: &str, ntuple: bool) -> RssAligner {
        let sock = match EthtoolSocket::open() {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(ifname, error = %e, "opening an ethtool socket; channels will be forwarded");
                None
            }
        };
        let state = match sock.as_ref().map(|s| s.read_rss(ifname)) {
            None => RssState::Unreadable("no ethtool socket".into()),
            Some(Ok(config)) => match config.check() {
                Ok(()) => RssState::Predictable(config),
                Err(reason) => RssState::Unpredictable(config, reason.to_string()),
            },
            Some(Err(e)) => RssState::Unreadable(e.to_string()),
        };
        let aligner = RssAligner {
            ifname: ifname.to_owned(),
            state,
            ntuple: if ntuple { sock } else { None },
            ntuple_unsupported: AtomicBool::new(false),
            counters: SteeringCounters::default(),
            peer_counters: PeerAlignmentCounters::default(),
        };
        aligner.log_state();
        aligner
    }

    /// An aligner for a known RSS (the RSS test bed's, or a NIC's read elsewhere), with
    /// ntuple rules installed through `ntuple` when given.
    pub fn with_config(
        ifname: &str,
        config: RssConfig,
        ntuple: Option<EthtoolSocket>,
    ) -> RssAligner {
        let state = match config.check() {
            Ok(()) => RssState::Predictable(config),
            Err(reason) => RssState::Unpredictable(config, reason.to_string()),
        };
        RssAligner {
            ifname: ifname.to_owned(),
            state,
            ntuple,
            ntuple_unsupported: AtomicBool::new(false),
            counters: SteeringCounters::default(),
            peer_counters: PeerAlignmentCounters::default(),
        }
    }

    /// An aligner that never aligns (every opened channel is recorded as forwarded, for
    /// [`ForwardReason::AlignmentOff`]): any free port, on the queue asked for.
    pub fn disabled(ifname: &str) -> RssAligner {
        RssAligner {
            ifname: ifname.to_owned(),
            state: RssState::Off,
            ntuple: None,
            ntuple_unsupported: AtomicBool::new(false),
            counters: SteeringCounters::default(),
            peer_counters: PeerAlignmentCounters::default(),
        }
    }

    /// Logs what alignment will do on the interface (once per aligner: `probe` does).
    pub(crate) fn log_state(&self) {
        let ifname = &self.ifname;
        match &self.state {
            RssState::Predictable(c) => info!(
                ifname,
                queues = ?c.queues(),
                table = c.indirection.len(),
                "RSS read: outgoing channels choose local ports that land on their queue"
            ),
            RssState::Unpredictable(_, why) => warn!(
                ifname,
                reason = %why,
                ntuple = self.ntuple.is_some(),
                "RSS cannot be reproduced: outgoing channels use ntuple rules where the NIC \
                 allows, else their frames are forwarded between queues"
            ),
            RssState::Unreadable(why) => info!(
                ifname,
                reason = %why,
                ntuple = self.ntuple.is_some(),
                "RSS not readable: outgoing channels use ntuple rules where the NIC allows, \
                 else their frames are forwarded between queues"
            ),
            RssState::Off => info!(ifname, "RSS alignment is off"),
        }
    }

    /// What the probe found.
    pub fn state(&self) -> &RssState {
        &self.state
    }

    /// This host's RSS when it is reproducible: the configuration to send a peer for
    /// [`PeerTarget`].
    pub fn rss(&self) -> Option<&RssConfig> {
        match &self.state {
            RssState::Predictable(c) => Some(c),
            _ => None,
        }
    }

    /// Records an accepted channel.
    pub fn accepted(&self) -> ChannelSteering {
        self.counters.record(ChannelSteering::Accepted);
        ChannelSteering::Accepted
    }

    /// Chooses the local port of a channel from `ends.local` to `ends.remote` owned by
    /// `ends.queue`, and how its frames will reach it (see the
    /// [module documentation](self)).
    ///
    /// `claim(port)` is asked about candidate ports in scan order from `start` (wrapping
    /// within `range`) and returns whether it took the port (a port allocator's "take if
    /// free"); the first port it takes is the one returned. With `ends.peer`, a port that
    /// also lands on one of the peer's queues is preferred; if none is free, the peer's
    /// constraint is dropped (logged at debug level) rather than the local one. An ntuple
    /// rule is installed through the socket [`probe`](Self::probe) opened, in the
    /// interface's network namespace.
    pub fn connect(
        &self,
        ends: ChannelEnds<'_>,
        range: RangeInclusive<u16>,
        start: u16,
        claim: impl FnMut(u16) -> bool,
    ) -> Result<ConnectSteering, NoFreePort> {
        self.connect_among(ends, &[], range, start, claim)
    }

    /// [`connect`](Self::connect) for a channel that any of `others` may own as well as
    /// `ends.queue` (the preferred one). Where the RSS is reproducible and no free port
    /// lands on `ends.queue` (every one in use, a queue the indirection table leaves out,
    /// or a hash over the addresses alone), a port that lands on one of `others` is taken
    /// and [`ConnectSteering::queue`] names that queue: the channel is then aligned by
    /// its owner rather than by its port. Only when none lands on any of them does the
    /// channel fall back to a rule or forwarding, on `ends.queue`.
    pub fn connect_among(
        &self,
        ends: ChannelEnds<'_>,
        others: &[u32],
        range: RangeInclusive<u16>,
        start: u16,
        mut claim: impl FnMut(u16) -> bool,
    ) -> Result<ConnectSteering, NoFreePort> {
        let ChannelEnds {
            local,
            remote,
            queue,
            peer,
        } = ends;
        let reason = match &self.state {
            RssState::Predictable(rss) => {
                let mut chosen = choose(
                    local,
                    remote,
                    range.clone(),
                    rss,
                    &[queue],
                    peer,
                    start,
                    &mut claim,
                );
                if let Err(e) = &chosen {
                    tracing::debug!(ifname = %self.ifname, %remote, queue, error = %e, "no port lands on the preferred queue");
                    let others: Vec<u32> = others.iter().copied().filter(|&q| q != queue).collect();
                    if !others.is_empty() {
                        chosen = choose(
                            local,
                            remote,
                            range.clone(),
                            rss,
                            &others,
                            peer,
                            start,
                            &mut claim,
                        );
                    }
                }
                match chosen {
                    Ok(c) => {
                        self.counters.record(ChannelSteering::Aligned);
                        let peer_alignment = match (peer, c.peer_queue) {
                            (None, _) => PeerAlignment::Unknown,
                            (Some(_), Some(queue)) => PeerAlignment::Aligned { queue },
                            (Some(_), None) => PeerAlignment::Missed,
                        };
                        self.peer_counters.record(peer_alignment);
                        return Ok(ConnectSteering {
                            port: c.port,
                            queue: c.local_queue,
                            steering: ChannelSteering::Aligned,
                            local_queue: Some(c.local_queue),
                            peer_queue: c.peer_queue,
                            peer_alignment,
                            rule: None,
                        });
                    }
                    Err(e) => {
                        tracing::debug!(ifname = %self.ifname, %remote, queue, error = %e, "no port aligns");
                        ForwardReason::NoPortLands
                    }
                }
            }
            RssState::Unpredictable(..) => ForwardReason::RssUnpredictable,
            RssState::Unreadable(_) => ForwardReason::RssUnreadable,
            RssState::Off => ForwardReason::AlignmentOff,
        };
        // Any free port, then a rule if the NIC takes one.
        let port = any_port(range.clone(), start, &mut claim).ok_or(NoFreePort {
            lo: *range.start(),
            hi: *range.end(),
        })?;
        let local_queue = self
            .rss()
            .and_then(|r| r.reply_queue(SocketAddrV4::new(local, port), remote));
        let tuple = FlowTuple::reply(SocketAddrV4::new(local, port), remote);
        let (steering, rule) = match self.try_ntuple(tuple, queue) {
            Some(rule) => (
                ChannelSteering::Ntuple {
                    location: rule.location(),
                },
                Some(rule),
            ),
            None => {
                let reason = if self.ntuple.is_some() {
                    ForwardReason::NtupleUnavailable
                } else {
                    reason
                };
                (ChannelSteering::Forwarded { reason }, None)
            }
        };
        self.counters.record(steering);
        let peer_alignment = if peer.is_some() {
            PeerAlignment::Missed
        } else {
            PeerAlignment::Unknown
        };
        self.peer_counters.record(peer_alignment);
        Ok(ConnectSteering {
            port,
            queue,
            steering,
            local_queue,
            peer_queue: None,
            peer_alignment,
            rule,
        })
    }

    fn try_ntuple(&self, tuple: FlowTuple, queue: u32) -> Option<NtupleRule> {
        let sock = self.ntuple.as_ref()?;
        if self.ntuple_unsupported.load(Ordering::Relaxed) {
            return None;
        }
        match sock.install_ntuple(&self.ifname, tuple, queue) {
            Ok(rule) => Some(rule),
            Err(e @ (RssError::Unsupported { .. } | RssError::NotPermitted { .. })) => {
                if !self.ntuple_unsupported.swap(true, Ordering::Relaxed) {
                    warn!(ifname = %self.ifname, error = %e, "no ntuple rules on this interface; unaligned channels are forwarded");
                }
                None
            }
            Err(e) => {
                warn!(ifname = %self.ifname, error = %e, ?tuple, queue, "ntuple rule refused; this channel is forwarded");
                None
            }
        }
    }

    /// How many channels were steered each way so far.
    pub fn counts(&self) -> SteeringCounts {
        self.counters.snapshot()
    }

    /// How many opened channels so far were aligned at the peer as well, missed it, or
    /// were opened without the peer's RSS.
    pub fn peer_counts(&self) -> PeerAlignmentCounts {
        self.peer_counters.snapshot()
    }
}

/// A port landing on the targets, with the peer's constraint first if given.
#[allow(clippy::too_many_arguments)]
fn choose(
    local: Ipv4Addr,
    remote: SocketAddrV4,
    range: RangeInclusive<u16>,
    rss: &RssConfig,
    queues: &[u32],
    peer: Option<PeerTarget<'_>>,
    start: u16,
    claim: &mut impl FnMut(u16) -> bool,
) -> Result<super::port::PortChoice, PortChoiceError> {
    let chooser = PortChooser::new(local, remote, range, rss, queues)?;
    if let Some(peer) = peer {
        match chooser.clone().with_peer(peer.rss, peer.queues) {
            Ok(both) => match both.choose(start, &mut *claim) {
                Ok(c) => return Ok(c),
                Err(e) => {
                    tracing::debug!(%remote, error = %e, "no port lands on the peer's queues too; aligning this end only")
                }
            },
            Err(e) => {
                tracing::debug!(%remote, error = %e, "the peer's RSS constrains nothing; aligning this end only")
            }
        }
    }
    chooser.choose(start, claim)
}

/// The first port `claim` takes, scanning `range` from `start`.
fn any_port(
    range: RangeInclusive<u16>,
    start: u16,
    claim: &mut impl FnMut(u16) -> bool,
) -> Option<u16> {
    let (lo, hi) = (*range.start(), *range.end());
    if lo > hi {
        return None;
    }
    let span = u32::from(hi - lo) + 1;
    let first = if range.contains(&start) {
        u32::from(start - lo)
    } else {
        0
    };
    (0..span)
        .map(|i| lo + ((first + i) % span) as u16)
        .find(|&p| claim(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rss::toeplitz::{HashFields, MICROSOFT_VERIFICATION_KEY};
    use std::collections::HashSet;

    const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

    fn remote() -> SocketAddrV4 {
        "10.77.0.2:9000".parse().unwrap()
    }

    fn ends(queue: u32, peer: Option<PeerTarget<'_>>) -> ChannelEnds<'_> {
        ChannelEnds {
            local: LOCAL,
            remote: remote(),
            queue,
            peer,
        }
    }

    fn rss(n: u32) -> RssConfig {
        RssConfig::toeplitz(
            &MICROSOFT_VERIFICATION_KEY,
            &RssConfig::default_indirection(128, n),
        )
        .unwrap()
    }

    #[test]
    fn predictable_rss_aligns_every_queue() {
        let a = RssAligner::with_config("x", rss(4), None);
        let mut used = HashSet::new();
        for q in [0, 1, 2, 3, 3, 2, 1, 0] {
            let c = a
                .connect(ends(q, None), 61000..=65535, 61000, |p| used.insert(p))
                .unwrap();
            assert_eq!(c.steering, ChannelSteering::Aligned);
            assert_eq!(c.local_queue, Some(q));
            assert_eq!(
                rss(4).reply_queue(SocketAddrV4::new(LOCAL, c.port), remote()),
                Some(q)
            );
            assert!(c.rule.is_none());
        }
        assert_eq!(used.len(), 8, "each channel its own port");
        assert_eq!(
            a.counts(),
            SteeringCounts {
                aligned: 8,
                ..Default::default()
            }
        );
    }

    #[test]
    fn exhausted_alignment_falls_back_to_forwarding() {
        let a = RssAligner::with_config("x", rss(4), None);
        // Ten ports; take every port that lands on queue 1.
        let landing: Vec<u16> = (1000..=1009)
            .filter(|&p| rss(4).reply_queue(SocketAddrV4::new(LOCAL, p), remote()) == Some(1))
            .collect();
        let mut used: HashSet<u16> = landing.iter().copied().collect();
        assert!(used.len() < 10, "some port of the ten lands elsewhere");
        let c = a
            .connect(ends(1, None), 1000..=1009, 1000, |p| used.insert(p))
            .unwrap();
        assert_eq!(
            c.steering,
            ChannelSteering::Forwarded {
                reason: ForwardReason::NoPortLands
            }
        );
        assert!(!landing.contains(&c.port));
        assert_ne!(c.local_queue, Some(1));
        // Now every port is taken.
        let mut all = |_p: u16| false;
        assert_eq!(
            a.connect(ends(1, None), 1000..=1009, 1000, &mut all)
                .unwrap_err(),
            NoFreePort { lo: 1000, hi: 1009 }
        );
        assert_eq!(a.counts().forwarded, 1);
    }

    #[test]
    fn disabled_and_unpredictable_forward_with_their_reason() {
        let off = RssAligner::disabled("x");
        let c = off
            .connect(ends(0, None), 1000..=1009, 1005, |_| true)
            .unwrap();
        assert_eq!(c.port, 1005);
        assert_eq!(c.queue, 0);
        assert_eq!(
            c.steering,
            ChannelSteering::Forwarded {
                reason: ForwardReason::AlignmentOff
            }
        );
        assert_eq!(off.state(), &RssState::Off);
        // Other queues change nothing when alignment is off.
        let c = off
            .connect_among(ends(2, None), &[0, 1, 3], 1000..=1009, 1003, |_| true)
            .unwrap();
        assert_eq!((c.port, c.queue), (1003, 2));
        let mut xor = rss(2);
        xor.hash = crate::rss::HashFunction::Xor;
        let a = RssAligner::with_config("x", xor, None);
        assert!(matches!(a.state(), RssState::Unpredictable(_, why) if why.contains("Xor")));
        assert!(a.rss().is_none());
        let c = a
            .connect(ends(0, None), 1000..=1009, 1000, |_| true)
            .unwrap();
        assert_eq!(
            c.steering,
            ChannelSteering::Forwarded {
                reason: ForwardReason::RssUnpredictable
            }
        );
        assert_eq!(a.accepted(), ChannelSteering::Accepted);
        assert_eq!(a.counts().accepted, 1);
    }

    #[test]
    fn peer_constraint_is_honoured_then_dropped_when_impossible() {
        let ours = rss(4);
        let theirs = rss(8);
        let a = RssAligner::with_config("x", ours.clone(), None);
        let peer = PeerTarget {
            rss: &theirs,
            queues: &[6, 7],
        };
        let c = a
            .connect(ends(2, Some(peer)), 61000..=65535, 61000, |_| true)
            .unwrap();
        assert_eq!(c.steering, ChannelSteering::Aligned);
        let l = SocketAddrV4::new(LOCAL, c.port);
        assert_eq!(ours.reply_queue(l, remote()), Some(2));
        let p = theirs.queue_of(&FlowTuple::new(l, remote())).unwrap();
        assert!(p == 6 || p == 7);
        assert_eq!(c.peer_queue, Some(p));
        assert_eq!(c.peer_alignment, PeerAlignment::Aligned { queue: p });
        // A peer queue its table never names: this end is still aligned.
        let impossible = PeerTarget {
            rss: &theirs,
            queues: &[99],
        };
        let c = a
            .connect(ends(2, Some(impossible)), 61000..=65535, 61000, |_| true)
            .unwrap();
        assert_eq!(c.steering, ChannelSteering::Aligned);
        assert_eq!(c.peer_queue, None);
        assert_eq!(c.peer_alignment, PeerAlignment::Missed);
        assert_eq!(c.local_queue, Some(2));
        // No peer target: unknown.
        let c = a
            .connect(ends(2, None), 61000..=65535, 61000, |_| true)
            .unwrap();
        assert_eq!(c.peer_alignment, PeerAlignment::Unknown);
        assert_eq!(
            a.peer_counts(),
            PeerAlignmentCounts {
                unknown: 1,
                aligned: 1,
                missed: 1
            }
        );
    }

    #[test]
    fn another_queue_owns_the_channel_when_no_port_lands_on_the_preferred_one() {
        let a = RssAligner::with_config("x", rss(4), None);
        let lands = |p: u16| rss(4).reply_queue(SocketAddrV4::new(LOCAL, p), remote());
        // Every port of the ten that lands on the first port's queue is taken.
        let q = lands(1000).unwrap();
        let mut used: HashSet<u16> = (1000..=1009).filter(|&p| lands(p) == Some(q)).collect();
        assert!(used.len() < 10, "some port lands elsewhere");
        let c = a
            .connect_among(ends(q, None), &[0, 1, 2, 3], 1000..=1009, 1000, |p| {
                used.insert(p)
            })
            .unwrap();
        assert_eq!(c.steering, ChannelSteering::Aligned);
        assert_ne!(c.queue, q);
        assert_eq!(
            lands(c.port),
            Some(c.queue),
            "the owner is where replies land"
        );
        assert_eq!(c.local_queue, Some(c.queue));
        // The scan went from 1000: the first free port, whichever queue it lands on.
        let first_free = (1000..=1009).find(|&p| lands(p) != Some(q)).unwrap();
        assert_eq!(c.port, first_free);
        assert_eq!(a.counts().aligned, 1);
        assert_eq!(a.counts().forwarded, 0);
    }

    #[test]
    fn a_queue_the_table_leaves_out_gives_way_to_one_it_names() {
        // Queues 0 and 1 only in the table; the set also drives queue 2.
        let two = RssConfig::toeplitz(
            &MICROSOFT_VERIFICATION_KEY,
            &RssConfig::default_indirection(128, 2),
        )
        .unwrap();
        let a = RssAligner::with_config("x", two.clone(), None);
        let c = a
            .connect_among(ends(2, None), &[0, 1, 2], 61000..=65535, 61000, |_| true)
            .unwrap();
        assert_eq!(c.steering, ChannelSteering::Aligned);
        assert!(c.queue < 2, "{c:?}");
        assert_eq!(
            two.reply_queue(SocketAddrV4::new(LOCAL, c.port), remote()),
            Some(c.queue)
        );
        // Without other queues to give way to: forwarded, on the queue asked for.
        let c = a
            .connect(ends(2, None), 61000..=65535, 61000, |_| true)
            .unwrap();
        assert_eq!(c.queue, 2);
        assert_eq!(
            c.steering,
            ChannelSteering::Forwarded {
                reason: ForwardReason::NoPortLands
            }
        );
    }

    #[test]
    fn a_hash_without_ports_puts_the_channel_on_the_addresses_queue() {
        let mut no_ports = rss(4);
        no_ports.fields = HashFields(HashFields::IP_SRC | HashFields::IP_DST);
        let fixed = no_ports
            .reply_queue(SocketAddrV4::new(LOCAL, 61000), remote())
            .unwrap();
        let a = RssAligner::with_config("x", no_ports, None);
        let other = (fixed + 1) % 4;
        let c = a
            .connect_among(
                ends(other, None),
                &[0, 1, 2, 3],
                61000..=65535,
                61000,
                |_| true,
            )
            .unwrap();
        assert_eq!((c.queue, c.steering), (fixed, ChannelSteering::Aligned));
        assert_eq!(c.port, 61000);
    }

    #[test]
    fn probing_an_interface_without_rss_says_why() {
        let a = RssAligner::probe("lo", true);
        match a.state() {
            RssState::Unreadable(why) => assert!(why.contains("ETHTOOL_GRSSH"), "{why}"),
            other => panic!("{other:?}"),
        }
        // lo has no ntuple rules either: forwarded, and the next try is skipped.
        for _ in 0..2 {
            let c = a
                .connect(ends(0, None), 1000..=1009, 1000, |_| true)
                .unwrap();
            assert_eq!(
                c.steering,
                ChannelSteering::Forwarded {
                    reason: ForwardReason::NtupleUnavailable
                }
            );
        }
        assert!(a.ntuple_unsupported.load(Ordering::Relaxed));
    }
}
