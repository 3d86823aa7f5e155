//! [`ChannelSet::start`] over AF_PACKET ([`LinkKind::Packet`](super::LinkKind::Packet)): the
//! steering (socket filter, TCX ingress drop) and one [`PacketLink`] per queue.
//!
//! A socket bound to an interface gets every frame of it, whatever its receive queue, so
//! the queues' sockets share the frames in a `PACKET_FANOUT_QM` group, joined in the
//! order of the set's queues: the *i*-th gets the frames of receive queue *r* when *r*
//! mod *n* = *i* (*n* queues). That is what the set's queues expect of AF_XDP sockets
//! bound to NIC queues: every frame of a flow on one queue, picked by the receiver (on
//! veth, by the sender's transmit queue). A flow that lands on another queue than its
//! owner's is forwarded to it, as over AF_XDP. One queue needs no group.

use tracing::{info, warn};
use xdp_prog::PacketSteering;

use super::attach::{Neighbors, Resolver};
use super::config::resolve_partial_checksums;
use super::set::{aligner_for, QueueParts};
use super::steering::SetSteering;
use super::{ChannelError, ChannelSet, ChannelSetConfig};
use crate::link::packet::{Fanout, PacketLink};

impl ChannelSet {
    /// Attaches the AF_PACKET steering to `config.ifname`, opens one AF_PACKET link per
    /// queue of `queues` (with the steering's socket filter, in one fanout group) and
    /// starts the set. On any error everything done so far is undone (sockets closed,
    /// TCX program detached).
    pub(super) fn start_packet(
        config: ChannelSetConfig,
        queues: Vec<u32>,
    ) -> Result<ChannelSet, ChannelError> {
        let accept_partial = resolve_partial_checksums(&config);
        let mac = crate::neigh::interface_mac(&config.ifname).map_err(ChannelError::Neighbor)?;
        let ifindex = crate::neigh::ifindex_of(&config.ifname).map_err(ChannelError::Neighbor)?;
        // From here on, `steering` detaches on every early return (its drop).
        let steering =
            PacketSteering::attach(&config.ifname).map_err(ChannelError::PacketSteering)?;
        let mut parts = Vec::with_capacity(queues.len());
        let mut group = None;
        for &q in &queues {
            let mut lc = config.packet_link.clone();
            lc.ifname = config.ifname.clone();
            lc.fanout = match (queues.len(), group) {
                (1, _) => None,
                (_, None) => Some(Fanout::New),
                (_, Some(id)) => Some(Fanout::Join(id)),
            };
            let link = PacketLink::open(lc, |fd| steering.attach_socket(fd))
                .map_err(ChannelError::PacketLink)?;
            group = group.or(link.fanout_group());
            // Opened here, in the interface's namespace, so that whichever runtime drives
            // the queue has it.
            let table = match crate::neigh::KernelNeighbors::open() {
                Ok(n) => Some(n),
                Err(e) => {
                    warn!(queue = q, error = %e, "opening the neighbour table; accepted peers' MAC addresses go unchecked");
                    None
                }
            };
            parts.push(QueueParts {
                queue: q,
                packet: Some(link.counters()),
                link: Box::new(link),
                neighbors: Neighbors::Kernel { table, ifindex },
                binding: None,
                umem: None,
                tx_checksum: None,
            });
        }
        let resolver = Resolver::kernel(&config.ifname, ifindex, config.neighbor_timeout)?;
        // The fanout hands each socket its receive queue's frames, so ports chosen for the
        // NIC's RSS land on the queue that owns them here as on AF_XDP.
        let aligner = aligner_for(&config);
        let set = ChannelSet::assemble(
            config,
            mac,
            parts,
            Some(SetSteering::Packet(steering)),
            resolver,
            accept_partial,
            aligner,
        )?;
        info!(
            ifname = %set.config().ifname, ipv4 = %set.config().ipv4, ?queues, fanout_group = ?group,
            "channel set started over AF_PACKET"
        );
        Ok(set)
    }
}
