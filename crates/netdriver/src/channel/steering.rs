//! What steers a set's flows to its sockets and keeps them from the kernel's TCP: the
//! steering XDP program of an AF_XDP set, or the socket filter and TCX ingress drop of an
//! AF_PACKET set. Both claim the same things (a listened port, a connection's local
//! endpoint) and are detached when the set stops.

use std::net::SocketAddrV4;

use xdp_prog::{PacketCounters, PacketSteering, XdpSteering};

use super::ChannelError;

/// A set's steering, by link ([`LinkKind`](super::LinkKind)).
#[derive(Debug)]
pub(crate) enum SetSteering {
    /// The XDP program and its maps (AF_XDP sockets are registered in its `XSKMAP`).
    Xdp(XdpSteering),
    /// The socket filter every AF_PACKET socket of the set carries, and the TCX ingress
    /// program that drops the same segments on the kernel's path.
    Packet(PacketSteering),
}

impl SetSteering {
    /// Claims TCP destination `port` on every local address.
    pub(crate) fn own_port(&self, port: u16) -> Result<(), ChannelError> {
        match self {
            SetSteering::Xdp(s) => s.own_port(port).map_err(ChannelError::Xdp),
            SetSteering::Packet(s) => s.own_port(port).map_err(ChannelError::PacketSteering),
        }
    }

    /// Gives `port` back to the kernel. Returns whether it was owned.
    pub(crate) fn release_port(&self, port: u16) -> Result<bool, ChannelError> {
        match self {
            SetSteering::Xdp(s) => s.release_port(port).map_err(ChannelError::Xdp),
            SetSteering::Packet(s) => s.release_port(port).map_err(ChannelError::PacketSteering),
        }
    }

    /// Claims TCP segments to exactly `endpoint`.
    pub(crate) fn own_endpoint(&self, endpoint: SocketAddrV4) -> Result<(), ChannelError> {
        match self {
            SetSteering::Xdp(s) => s.own_endpoint(endpoint).map_err(ChannelError::Xdp),
            SetSteering::Packet(s) => s
                .own_endpoint(endpoint)
                .map_err(ChannelError::PacketSteering),
        }
    }

    /// Gives `endpoint` back to the kernel. Returns whether it was owned.
    pub(crate) fn release_endpoint(&self, endpoint: SocketAddrV4) -> Result<bool, ChannelError> {
        match self {
            SetSteering::Xdp(s) => s.release_endpoint(endpoint).map_err(ChannelError::Xdp),
            SetSteering::Packet(s) => s
                .release_endpoint(endpoint)
                .map_err(ChannelError::PacketSteering),
        }
    }

    /// The XDP program's counters; for AF_PACKET steering, `redirected` counts the frames
    /// the socket filter handed to the set's sockets and the rest is zero (see
    /// [`packet_counters`](Self::packet_counters)).
    pub(crate) fn counters(&self) -> Result<xdp_prog::Counters, ChannelError> {
        match self {
            SetSteering::Xdp(s) => s.counters().map_err(ChannelError::Xdp),
            SetSteering::Packet(s) => {
                let c = s.counters().map_err(ChannelError::PacketSteering)?;
                Ok(xdp_prog::Counters {
                    redirected: c.filtered_in,
                    ..xdp_prog::Counters::default()
                })
            }
        }
    }

    /// The AF_PACKET programs' counters; `None` for an XDP program.
    pub(crate) fn packet_counters(&self) -> Result<Option<PacketCounters>, ChannelError> {
        match self {
            SetSteering::Xdp(_) => Ok(None),
            SetSteering::Packet(s) => s.counters().map(Some).map_err(ChannelError::PacketSteering),
        }
    }

    /// Detaches the program (the XDP program, or the TCX ingress drop; sockets keep their
    /// filter until they close).
    pub(crate) fn detach(self) -> Result<(), ChannelError> {
        match self {
            SetSteering::Xdp(s) => s.detach().map_err(ChannelError::Xdp),
            SetSteering::Packet(s) => s.detach().map_err(ChannelError::PacketSteering),
        }
    }
}
