//! Choosing the local port of an outgoing connection so that RSS delivers its frames to
//! chosen queues.
//!
//! A NIC picks the receive queue of a frame from the Toeplitz hash of its 4-tuple. For a
//! connection this host opens, every tuple field but the local port is fixed by the
//! destination, so the local port decides the queue the peer's replies arrive on here
//! (and, on the peer, the queue this host's frames arrive on there). [`PortChooser`]
//! scans an ephemeral range for a free port whose reply tuple hashes, under this host's
//! [`RssConfig`], to one of the target queues, and optionally whose forward tuple hashes,
//! under the peer's, to one of the peer's target queues (a latency channel must land on
//! latency queues at both ends).
//!
//! With a 128-entry table spread evenly over `n` queues, about one port in `n` lands on
//! a given queue, so a choice checks about `n` ports (a few microseconds); when both
//! ends constrain it, about `n * m`.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::RangeInclusive;

use super::toeplitz::{FlowTuple, RssConfig, Unpredictable};

/// Which end of the connection a constraint or an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum End {
    /// This host, which receives the peer's replies.
    Local,
    /// The peer, which receives this host's frames.
    Peer,
}

/// Why no port could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortChoiceError {
    /// An end's RSS configuration does not let the queue be computed.
    #[error("the {end:?} end's RSS cannot be predicted: {reason}")]
    Unpredictable {
        /// The end.
        end: End,
        /// Why.
        reason: Unpredictable,
    },
    /// No target queue appears in that end's indirection table, so no port lands there.
    #[error("no entry of the {end:?} end's RSS indirection table names any of queues {queues:?}")]
    QueueNotInTable {
        /// The end.
        end: End,
        /// The target queues.
        queues: Vec<u32>,
    },
    /// That end does not hash ports, and the addresses alone hash to another queue.
    #[error(
        "the {end:?} end hashes TCP/IPv4 without ports; its addresses alone land on queue \
         {queue}, not one of {queues:?}"
    )]
    PortsNotHashed {
        /// The end.
        end: End,
        /// The queue every port lands on.
        queue: u32,
        /// The target queues.
        queues: Vec<u32>,
    },
    /// The port range is empty or the target queue list is.
    #[error("nothing to choose from: {0}")]
    Empty(&'static str),
    /// Every port of the range that lands on the targets is in use.
    #[error(
        "no free port in {lo}..={hi} lands on the target queues ({landing} land there, all in use)"
    )]
    Exhausted {
        /// First port of the range.
        lo: u16,
        /// Last port of the range.
        hi: u16,
        /// Ports of the range that land on the targets.
        landing: u32,
    },
}

/// A port [`PortChooser::choose`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortChoice {
    /// The local port.
    pub port: u16,
    /// The queue the peer's replies arrive on at this host.
    pub local_queue: u32,
    /// The queue this host's frames arrive on at the peer, when the peer's RSS was given.
    pub peer_queue: Option<u32>,
    /// Ports whose hash was computed before this one was found.
    pub checked: u32,
}

/// The queues one end must deliver the connection's frames to, under that end's RSS.
#[derive(Debug, Clone, Copy)]
struct Target<'a> {
    rss: &'a RssConfig,
    queues: &'a [u32],
    /// `Some(q)` when this end ignores ports: every port lands on `q`.
    fixed: Option<u32>,
}

impl<'a> Target<'a> {
    fn new(
        end: End,
        rss: &'a RssConfig,
        queues: &'a [u32],
        tuple: FlowTuple,
    ) -> Result<Target<'a>, PortChoiceError> {
        if queues.is_empty() {
            return Err(PortChoiceError::Empty("no target queue"));
        }
        rss.check()
            .map_err(|reason| PortChoiceError::Unpredictable { end, reason })?;
        if !queues.iter().any(|&q| rss.reaches(q)) {
            return Err(PortChoiceError::QueueNotInTable {
                end,
                queues: queues.to_vec(),
            });
        }
        let fixed = if rss.hashes_ports() {
            None
        } else {
            let queue = rss
                .queue_of_hash(rss.hash_checked(&tuple))
                .unwrap_or(u32::MAX);
            if !queues.contains(&queue) {
                return Err(PortChoiceError::PortsNotHashed {
                    end,
                    queue,
                    queues: queues.to_vec(),
                });
            }
            Some(queue)
        };
        Ok(Target { rss, queues, fixed })
    }

    /// The queue `tuple` lands on, if it is a target.
    fn lands(&self, tuple: &FlowTuple) -> Option<u32> {
        if let Some(q) = self.fixed {
            return Some(q);
        }
        let q = self.rss.queue_of_hash(self.rss.hash_checked(tuple))?;
        self.queues.contains(&q).then_some(q)
    }
}

/// Chooses local ports for connections from `local` to `remote` (see the
/// [module documentation](self)).
///
/// ```
/// use netdriver::rss::{PortChooser, RssConfig, MICROSOFT_VERIFICATION_KEY};
///
/// let table = RssConfig::default_indirection(128, 8);
/// let rss = RssConfig::toeplitz(&MICROSOFT_VERIFICATION_KEY, &table).unwrap();
/// let remote = "10.77.0.2:9000".parse().unwrap();
/// let chooser = PortChooser::new(
///     "10.77.0.1".parse().unwrap(), remote, 61000..=65535, &rss, &[3],
/// ).unwrap();
/// // The first free port from 61000 on whose replies land on queue 3.
/// let choice = chooser.choose(61000, |_port| true).unwrap();
/// let local = std::net::SocketAddrV4::new("10.77.0.1".parse().unwrap(), choice.port);
/// assert_eq!(rss.reply_queue(local, remote), Some(3));
/// ```
#[derive(Debug, Clone)]
pub struct PortChooser<'a> {
    local: Ipv4Addr,
    remote: SocketAddrV4,
    range: RangeInclusive<u16>,
    ours: Target<'a>,
    peer: Option<Target<'a>>,
}

impl<'a> PortChooser<'a> {
    /// A chooser of ports in `range` whose replies from `remote` land, under this host's
    /// `rss`, on one of `queues`. Fails at once when no port can: an unpredictable
    /// configuration, targets absent from the table, ports not hashed, an empty range.
    pub fn new(
        local: Ipv4Addr,
        remote: SocketAddrV4,
        range: RangeInclusive<u16>,
        rss: &'a RssConfig,
        queues: &'a [u32],
    ) -> Result<PortChooser<'a>, PortChoiceError> {
        if range.is_empty() {
            return Err(PortChoiceError::Empty("empty port range"));
        }
        let reply = FlowTuple::reply(SocketAddrV4::new(local, *range.start()), remote);
        let ours = Target::new(End::Local, rss, queues, reply)?;
        Ok(PortChooser {
            local,
            remote,
            range,
            ours,
            peer: None,
        })
    }

    /// Also requires this host's frames to land, under the peer's `rss`, on one of
    /// `queues` at the peer.
    pub fn with_peer(
        mut self,
        rss: &'a RssConfig,
        queues: &'a [u32],
    ) -> Result<PortChooser<'a>, PortChoiceError> {
        let forward = FlowTuple::new(
            SocketAddrV4::new(self.local, *self.range.start()),
            self.remote,
        );
        self.peer = Some(Target::new(End::Peer, rss, queues, forward)?);
        Ok(self)
    }

    /// Where `port` lands: `(local queue, peer queue)` when both are targets.
    pub fn lands(&self, port: u16) -> Option<(u32, Option<u32>)> {
        let local = SocketAddrV4::new(self.local, port);
        let q = self.ours.lands(&FlowTuple::reply(local, self.remote))?;
        match &self.peer {
            None => Some((q, None)),
            Some(peer) => {
                let p = peer.lands(&FlowTuple::new(local, self.remote))?;
                Some((q, Some(p)))
            }
        }
    }

    /// The first port, scanning the range from `start` (wrapping around; a `start`
    /// outside the range starts at its beginning), that lands on the targets and for
    /// which `claim` returns `true`. `claim` is asked only about landing ports, in scan
    /// order, and may reserve the port it accepts (a port allocator's "take if free").
    pub fn choose(
        &self,
        start: u16,
        mut claim: impl FnMut(u16) -> bool,
    ) -> Result<PortChoice, PortChoiceError> {
        let (lo, hi) = (*self.range.start(), *self.range.end());
        let span = u32::from(hi - lo) + 1;
        let first = if (lo..=hi).contains(&start) {
            u32::from(start - lo)
        } else {
            0
        };
        let mut landing = 0u32;
        for i in 0..span {
            // `lo + (first + i) mod span` stays within lo..=hi.
            let port = lo + ((first + i) % span) as u16;
            let Some((local_queue, peer_queue)) = self.lands(port) else {
                continue;
            };
            landing += 1;
            if claim(port) {
                return Ok(PortChoice {
                    port,
                    local_queue,
                    peer_queue,
                    checked: i + 1,
                });
            }
        }
        Err(PortChoiceError::Exhausted { lo, hi, landing })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rss::toeplitz::{HashFields, InputTransform, MICROSOFT_VERIFICATION_KEY};

    fn rss(queues: u32) -> RssConfig {
        RssConfig::toeplitz(
            &MICROSOFT_VERIFICATION_KEY,
            &RssConfig::default_indirection(128, queues),
        )
        .unwrap()
    }

    const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

    fn remote() -> SocketAddrV4 {
        "10.77.0.2:9000".parse().unwrap()
    }

    #[test]
    fn chosen_port_is_the_first_landing_port_from_start() {
        let rss = rss(8);
        for q in 0..8 {
            let target = [q];
            let c = PortChooser::new(LOCAL, remote(), 61000..=65535, &rss, &target).unwrap();
            let choice = c.choose(61000, |_| true).unwrap();
            // Exact: recompute every port from 61000 by brute force.
            let expected = (61000..=65535)
                .find(|&p| rss.reply_queue(SocketAddrV4::new(LOCAL, p), remote()) == Some(q))
                .unwrap();
            assert_eq!(choice.port, expected, "queue {q}");
            assert_eq!(choice.local_queue, q);
            assert_eq!(choice.peer_queue, None);
            assert_eq!(choice.checked, u32::from(expected - 61000) + 1);
            // The hash, spelled out: Toeplitz over (remote, local, 9000, port).
            let mut input = [0u8; 12];
            input[..4].copy_from_slice(&remote().ip().octets());
            input[4..8].copy_from_slice(&LOCAL.octets());
            input[8..10].copy_from_slice(&9000u16.to_be_bytes());
            input[10..].copy_from_slice(&choice.port.to_be_bytes());
            let h = crate::rss::toeplitz_hash(&MICROSOFT_VERIFICATION_KEY, &input);
            assert_eq!((h % 128) % 8, q);
        }
    }

    #[test]
    fn busy_ports_are_skipped_and_the_scan_wraps() {
        let rss = rss(4);
        let c = PortChooser::new(LOCAL, remote(), 1000..=1099, &rss, &[2]).unwrap();
        let landing: Vec<u16> = (1000..=1099).filter(|&p| c.lands(p).is_some()).collect();
        assert!(landing.len() >= 10, "{landing:?}");
        // Start after the last landing port: the scan wraps to the first.
        let start = landing[landing.len() - 1] + 1;
        assert_eq!(c.choose(start, |_| true).unwrap().port, landing[0]);
        // The first two are taken.
        let taken = [landing[0], landing[1]];
        let mut asked = Vec::new();
        let choice = c
            .choose(1000, |p| {
                asked.push(p);
                !taken.contains(&p)
            })
            .unwrap();
        assert_eq!(choice.port, landing[2]);
        assert_eq!(
            asked,
            landing[..3].to_vec(),
            "claim is asked about landing ports only"
        );
        // All taken.
        let err = c.choose(1000, |_| false).unwrap_err();
        assert_eq!(
            err,
            PortChoiceError::Exhausted {
                lo: 1000,
                hi: 1099,
                landing: landing.len() as u32
            }
        );
        // A start outside the range begins at its start.
        assert_eq!(c.choose(5, |_| true).unwrap().port, landing[0]);
    }

    #[test]
    fn both_ends_constrained() {
        let ours = rss(8);
        // The peer: another key, 4 queues, latency queues 0 and 1.
        let mut key = MICROSOFT_VERIFICATION_KEY;
        key.reverse();
        let theirs = RssConfig::toeplitz(&key, &RssConfig::default_indirection(64, 4)).unwrap();
        let c = PortChooser::new(LOCAL, remote(), 61000..=65535, &ours, &[5])
            .unwrap()
            .with_peer(&theirs, &[0, 1])
            .unwrap();
        let choice = c.choose(61000, |_| true).unwrap();
        let local = SocketAddrV4::new(LOCAL, choice.port);
        assert_eq!(ours.reply_queue(local, remote()), Some(5));
        let at_peer = theirs.queue_of(&FlowTuple::new(local, remote())).unwrap();
        assert!(at_peer < 2, "{at_peer}");
        assert_eq!(choice.peer_queue, Some(at_peer));
        let expected = (61000..=65535u16)
            .find(|&p| {
                let l = SocketAddrV4::new(LOCAL, p);
                ours.reply_queue(l, remote()) == Some(5)
                    && theirs.queue_of(&FlowTuple::new(l, remote())).unwrap() < 2
            })
            .unwrap();
        assert_eq!(choice.port, expected);
    }

    #[test]
    fn impossible_targets_fail_at_once() {
        let rss4 = rss(4);
        assert_eq!(
            PortChooser::new(LOCAL, remote(), 1000..=2000, &rss4, &[4]).unwrap_err(),
            PortChoiceError::QueueNotInTable {
                end: End::Local,
                queues: vec![4]
            }
        );
        assert!(matches!(
            PortChooser::new(LOCAL, remote(), 1000..=2000, &rss4, &[]),
            Err(PortChoiceError::Empty(_))
        ));
        #[allow(clippy::reversed_empty_ranges)]
        let empty = 2000..=1000;
        assert!(matches!(
            PortChooser::new(LOCAL, remote(), empty, &rss4, &[0]),
            Err(PortChoiceError::Empty(_))
        ));
        let mut xor = rss4.clone();
        xor.hash = crate::rss::HashFunction::Xor;
        assert!(matches!(
            PortChooser::new(LOCAL, remote(), 1000..=2000, &xor, &[0]),
            Err(PortChoiceError::Unpredictable {
                end: End::Local,
                ..
            })
        ));
        assert!(matches!(
            PortChooser::new(LOCAL, remote(), 1000..=2000, &rss4, &[0])
                .unwrap()
                .with_peer(&xor, &[0]),
            Err(PortChoiceError::Unpredictable { end: End::Peer, .. })
        ));
    }

    #[test]
    fn addresses_only_hashing_fixes_the_queue() {
        let mut l3 = rss(4);
        l3.fields = HashFields(HashFields::IP_SRC | HashFields::IP_DST);
        let fixed = l3
            .queue_of(&FlowTuple::reply(SocketAddrV4::new(LOCAL, 1), remote()))
            .unwrap();
        // Any free port lands on the fixed queue.
        let target = [fixed];
        let c = PortChooser::new(LOCAL, remote(), 1000..=2000, &l3, &target).unwrap();
        let choice = c.choose(1500, |p| p != 1500).unwrap();
        assert_eq!((choice.port, choice.local_queue), (1501, fixed));
        // Another queue: no port can.
        let other = (fixed + 1) % 4;
        assert_eq!(
            PortChooser::new(LOCAL, remote(), 1000..=2000, &l3, &[other]).unwrap_err(),
            PortChoiceError::PortsNotHashed {
                end: End::Local,
                queue: fixed,
                queues: vec![other]
            }
        );
    }

    #[test]
    fn symmetric_hashing_is_supported() {
        let mut sym = rss(8);
        sym.input = InputTransform::SymmetricXor;
        let c = PortChooser::new(LOCAL, remote(), 61000..=65535, &sym, &[6]).unwrap();
        let choice = c.choose(61000, |_| true).unwrap();
        assert_eq!(
            sym.reply_queue(SocketAddrV4::new(LOCAL, choice.port), remote()),
            Some(6)
        );
    }

    #[test]
    fn every_queue_is_reachable_with_a_few_ports() {
        // Over 4536 ports (the stack's default range), each of 64 queues gets a share
        // within a factor of two of the even one.
        let rss = rss(64);
        let mut count = [0u32; 64];
        for p in 61000..=65535u16 {
            let q = rss
                .reply_queue(SocketAddrV4::new(LOCAL, p), remote())
                .unwrap();
            count[q as usize] += 1;
        }
        let even = 4536 / 64;
        for (q, &n) in count.iter().enumerate() {
            assert!(n > even / 2 && n < even * 2, "queue {q}: {n} ports");
        }
    }
}
