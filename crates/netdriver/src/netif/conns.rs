//! The connection table: one [`Slot`] per connection, named by a [`ConnHandle`] whose
//! generation makes a handle stale once its connection is gone; the 4-tuple index and
//! the single-entry cache of the last flow found; insertion, removal (with the record of
//! why a connection ended, for [`Interface::pop_closed`](super::Interface::pop_closed)),
//! ephemeral ports, and which connections a poll forgets or replaces with a TIME-WAIT
//! record (RFC 9293 §3.10.7.4; the record itself is [`crate::tcp::time_wait`]).

use std::net::SocketAddrV4;

use super::{Core, NetifError};
use crate::tcp::{Connection, State};
use crate::time::Instant;
use crate::wire::EthernetAddress;

/// Names a connection of an [`Interface`](super::Interface). A handle is never reused for
/// another connection: once its connection is gone, lookups with it return `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnHandle {
    pub(super) index: u32,
    pub(super) generation: u32,
}

/// One entry of the connection table.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) generation: u32,
    pub(super) conn: Option<Connection>,
    /// The remote's MAC once known.
    pub(super) remote_mac: Option<EthernetAddress>,
    /// The listening port whose accept queue holds this connection, until accepted.
    pub(super) listener: Option<u16>,
}

/// Most removal records kept for [`Interface::pop_closed`](super::Interface::pop_closed).
pub const MAX_CLOSED_EVENTS: usize = 1024;

/// The TIME-WAIT record a poll replaces `c` with: for a passively opened connection in
/// TIME-WAIT with nothing left to read or send. Connections we opened keep TIME-WAIT
/// whole: their local port stays theirs (and out of the allocators) until it ends.
pub(super) fn time_wait_record(
    c: &Connection,
    now: Instant,
) -> Option<crate::tcp::time_wait::TimeWait> {
    if !c.is_passive() || c.state() != State::TimeWait || c.recv_queue() != 0 {
        return None;
    }
    c.time_wait(now)
}

/// Whether a poll forgets the connection: closed, and nothing left to read from it.
pub(super) fn forgettable(c: &Connection) -> bool {
    c.is_closed() && (c.recv_queue() == 0 || c.error().is_some())
}

impl Core {
    pub(super) fn slot(&self, h: ConnHandle) -> Option<&Slot> {
        self.slots
            .get(h.index as usize)
            .filter(|s| s.generation == h.generation)
    }

    pub(super) fn slot_mut(&mut self, h: ConnHandle) -> Option<&mut Slot> {
        self.slots
            .get_mut(h.index as usize)
            .filter(|s| s.generation == h.generation)
    }

    pub(super) fn insert(
        &mut self,
        conn: Connection,
        remote_mac: Option<EthernetAddress>,
        listener: Option<u16>,
    ) -> ConnHandle {
        let tuple = (conn.local(), conn.remote());
        let index = match self.free_slots.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    conn: None,
                    remote_mac: None,
                    listener: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.conn = Some(conn);
        slot.remote_mac = remote_mac;
        slot.listener = listener;
        self.by_tuple.insert(tuple, index);
        self.live += 1;
        self.stats.connections_opened += 1;
        ConnHandle {
            index,
            generation: slot.generation,
        }
    }

    pub(super) fn remove(&mut self, index: u32) {
        let Some(slot) = self.slots.get_mut(index as usize) else {
            return;
        };
        let Some(conn) = slot.conn.take() else { return };
        let h = ConnHandle {
            index,
            generation: slot.generation,
        };
        // A new generation makes every outstanding handle to this slot stale.
        slot.generation = slot.generation.wrapping_add(1);
        if let Some(port) = slot.listener.take() {
            if let Some(l) = self.listeners.get_mut(&port) {
                l.queue.retain(|&q| q != h);
            }
        }
        self.by_tuple.remove(&(conn.local(), conn.remote()));
        self.last_flow = None;
        if self.closed.len() >= MAX_CLOSED_EVENTS {
            self.closed.pop_front();
        }
        self.closed.push_back((h, conn.error()));
        self.free_slots.push(index);
        self.live -= 1;
        self.stats.connections_removed += 1;
    }

    /// The next free local address towards `remote`.
    pub(super) fn ephemeral_port(
        &mut self,
        remote: SocketAddrV4,
    ) -> Result<SocketAddrV4, NetifError> {
        let (lo, hi) = (
            *self.config.ephemeral_ports.start(),
            *self.config.ephemeral_ports.end(),
        );
        if lo > hi {
            return Err(NetifError::NoFreePort);
        }
        let span = u32::from(hi - lo) + 1;
        for _ in 0..span {
            let port = self.next_port.clamp(lo, hi);
            self.next_port = if port == hi { lo } else { port + 1 };
            let local = SocketAddrV4::new(self.config.ipv4, port);
            if !self.by_tuple.contains_key(&(local, remote)) && !self.listeners.contains_key(&port)
            {
                return Ok(local);
            }
        }
        Err(NetifError::NoFreePort)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use crate::link::sim::{self, SimConfig};
    use crate::netif::tests::{hosts, IP_A, IP_B, MAC_B};
    use crate::netif::{Interface, InterfaceConfig, NetifError};
    use crate::time::Instant;

    use super::*;

    #[test]
    fn connect_needs_a_neighbor_and_free_ports() {
        let (la, _lb) = sim::pair(SimConfig::default());
        let mut a = Interface::new(
            la,
            InterfaceConfig {
                ephemeral_ports: 5000..=5001,
                isn_key: Some([0; 16]),
                ..InterfaceConfig::default()
            },
        );
        let remote = SocketAddrV4::new(IP_B, 80);
        assert_eq!(
            a.connect(remote, Instant::ZERO),
            Err(NetifError::NoNeighbor)
        );
        a.add_neighbor(IP_B, MAC_B);
        let h1 = a.connect(remote, Instant::ZERO).unwrap();
        let h2 = a.connect(remote, Instant::ZERO).unwrap();
        assert_ne!(h1, h2);
        assert_eq!(
            a.connect(remote, Instant::ZERO),
            Err(NetifError::NoFreePort)
        );
        // Another remote port: the same local ports are free towards it.
        assert!(a
            .connect(SocketAddrV4::new(IP_B, 81), Instant::ZERO)
            .is_ok());
        assert_eq!(a.listen(9, 1), Ok(()));
        assert_eq!(a.listen(9, 1), Err(NetifError::AddrInUse));
    }

    #[test]
    fn connect_from_uses_the_given_port_once() {
        let (mut a, _b) = hosts();
        let remote = SocketAddrV4::new(IP_B, 80);
        let h = a.connect_from(5555, remote, Instant::ZERO).unwrap();
        let local = SocketAddrV4::new(IP_A, 5555);
        assert_eq!(a.lookup(local, remote), Some(h));
        assert_eq!(
            a.connect_from(5555, remote, Instant::ZERO),
            Err(NetifError::AddrInUse)
        );
        // The same port towards another remote is another 4-tuple.
        let other = SocketAddrV4::new(IP_B, 81);
        assert!(a.connect_from(5555, other, Instant::ZERO).is_ok());
        a.listen(6000, 1).unwrap();
        assert_eq!(
            a.connect_from(6000, remote, Instant::ZERO),
            Err(NetifError::AddrInUse)
        );
        assert_eq!(
            a.connect_from(
                1,
                SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 9), 1),
                Instant::ZERO
            ),
            Err(NetifError::NoNeighbor)
        );
        assert_eq!(a.lookup(local, SocketAddrV4::new(IP_B, 82)), None);
    }
}
