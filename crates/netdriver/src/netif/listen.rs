//! Listening ports: a listener's backlog of connections not yet accepted, passive opens
//! (RFC 9293 §3.10.7.2: a SYN to a listening port opens a connection in SYN-RECEIVED),
//! SYN cookies when the backlog or the connection table is full (RFC 4987 §3.6: answer
//! the SYN and keep nothing; open the connection when the cookie comes back in a valid
//! ACK), and holding a listener whose application accept queue is full
//! ([`Interface::hold_accepts`](super::Interface::hold_accepts)).

use std::collections::VecDeque;
use std::net::SocketAddrV4;

use super::conns::{ConnHandle, Slot};
use super::egress::Control;
use super::Core;
use crate::tcp::syncookie::{cookie_syn_ack, CookieError};
use crate::tcp::{Connection, State};
use crate::time::Instant;
use crate::wire::{EthernetAddress, TcpRepr};

/// A listening port.
#[derive(Debug)]
pub(super) struct Listener {
    pub(super) backlog: usize,
    /// Connections opened by SYNs to this port and not yet accepted, oldest first.
    pub(super) queue: VecDeque<ConnHandle>,
    /// The driver has nowhere to put accepted connections
    /// ([`Interface::hold_accepts`](super::Interface::hold_accepts)).
    pub(super) held: bool,
}

/// Whether the connection queued for a listener at `h` is ready to be accepted: its
/// handshake completed (or it closed first).
pub(super) fn handshake_over(slots: &[Slot], h: ConnHandle) -> bool {
    slots
        .get(h.index as usize)
        .and_then(|s| s.conn.as_ref())
        .is_some_and(|c| c.state().is_synchronized() || c.is_closed())
}

impl Core {
    pub(super) fn passive_open(
        &mut self,
        now: Instant,
        src_mac: EthernetAddress,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        syn: &TcpRepr,
        payload_len: usize,
    ) {
        let (full, held) = self
            .listeners
            .get(&local.port())
            .map_or((true, false), |l| (l.queue.len() >= l.backlog, l.held));
        if held {
            // Like Linux with a full accept queue: no cookie either; the SYN's
            // retransmission is the retry.
            self.stats.accept_queue_full += 1;
            self.stats.syn_dropped += 1;
            return;
        }
        if full || self.live >= self.config.max_connections {
            if self.config.syn_cookies {
                // RFC 4987 §3.6: answer, and keep nothing.
                let (cookie, mss) = self.cookies.generate(now, local, remote, syn);
                let repr = cookie_syn_ack(&self.config.tcp, syn, cookie);
                let dst_mac = *self.neighbors.get(remote.ip()).unwrap_or(&src_mac);
                tracing::trace!(%local, %remote, cookie = cookie.0, mss, "netif: backlog full, SYN cookie");
                self.queue_control(Control::CookieSynAck {
                    dst_mac,
                    dst_ip: *remote.ip(),
                    repr,
                });
                return;
            }
            // Dropped, not reset: the peer's SYN retransmission is the retry.
            self.stats.syn_dropped += 1;
            return;
        }
        let isn = self.isn.generate(now, local, remote);
        match Connection::accept(self.config.tcp.clone(), local, remote, syn, isn, now) {
            Ok(mut conn) => {
                conn.set_ts_offset(self.isn.ts_offset(local, remote));
                // Static entries win; otherwise answer where the SYN came from, so that a
                // peer without a static entry here can still connect.
                let mac = *self.neighbors.get(remote.ip()).unwrap_or(&src_mac);
                let h = self.insert(conn, Some(mac), Some(local.port()));
                if let Some(l) = self.listeners.get_mut(&local.port()) {
                    l.queue.push_back(h);
                }
            }
            Err(_) => {
                self.stats.rx_no_connection += 1;
                self.reset(src_mac, *remote.ip(), syn, payload_len);
            }
        }
    }

    /// A bare ACK to a listening port for no connection, while cookies are out: opens the
    /// connection if it returns a valid cookie (RFC 4987 §3.6). Returns false when the
    /// cookie does not verify (the caller then resets, as for any stray segment).
    pub(super) fn cookie_open(
        &mut self,
        now: Instant,
        src_mac: EthernetAddress,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        repr: &TcpRepr,
        payload: &[u8],
    ) -> bool {
        let mss = match self.cookies.check(now, local, remote, repr) {
            Ok(mss) => mss,
            Err(e) => {
                let why = match e {
                    CookieError::Expired => "expired",
                    CookieError::Invalid | CookieError::NotAnAck => "invalid",
                };
                tracing::debug!(%local, %remote, why, "netif: SYN cookie rejected");
                self.stats.syn_cookies_rejected += 1;
                return false;
            }
        };
        // The cookie is genuine; what remains is room.
        if !self.cookie_room(local.port()) || self.live >= self.config.max_connections {
            // Dropped, not reset: the peer's data retransmission carries the cookie again.
            if self.listeners.get(&local.port()).is_some_and(|l| l.held) {
                self.stats.accept_queue_full += 1;
            }
            self.stats.syn_dropped += 1;
            return true;
        }
        let cookie = repr.ack.unwrap_or_default() - 1;
        match Connection::accept_cookie(
            self.config.tcp.clone(),
            local,
            remote,
            repr,
            payload,
            cookie,
            mss,
            now,
        ) {
            Ok(conn) => {
                self.stats.syn_cookies_accepted += 1;
                self.stats.rx_segments += 1;
                let mac = *self.neighbors.get(remote.ip()).unwrap_or(&src_mac);
                let h = self.insert(conn, Some(mac), Some(local.port()));
                if let Some(l) = self.listeners.get_mut(&local.port()) {
                    l.queue.push_back(h);
                }
                true
            }
            Err(_) => {
                self.stats.syn_cookies_rejected += 1;
                false
            }
        }
    }

    /// Whether listener `port` has room for a connection opened from a cookie: it is not
    /// held and fewer than its backlog of established connections wait in it. Half-open
    /// connections in the queue (a SYN flood's) do not count against a cookie connection,
    /// or cookies would be useless exactly when they are needed.
    pub(super) fn cookie_room(&self, port: u16) -> bool {
        self.listeners.get(&port).is_some_and(|l| {
            if l.held {
                return false;
            }
            let established = l
                .queue
                .iter()
                .filter(|&&h| {
                    self.slots
                        .get(h.index as usize)
                        .and_then(|s| s.conn.as_ref())
                        .is_some_and(|c| c.state() != State::SynReceived)
                })
                .count();
            established < l.backlog
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::netif::tests::{hosts, run_until, IP_B};
    use crate::time::{Duration, Instant};

    use super::*;

    #[test]
    fn the_backlog_bounds_unaccepted_connections() {
        let (mut a, mut b) = hosts();
        // Without cookies, SYNs beyond the backlog are dropped (see the cookie tests in
        // tests/tcp_syncookie.rs for the default).
        b.core.config.syn_cookies = false;
        let mut now = Instant::ZERO;
        b.listen(80, 2).unwrap();
        let hs: Vec<_> = (0..4)
            .map(|_| a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap())
            .collect();
        for _ in 0..6 {
            a.poll(now);
            b.poll(now);
            now += Duration::from_micros(20);
        }
        assert_eq!(b.connection_count(), 2);
        assert_eq!(b.stats().syn_dropped, 2);
        let established = hs
            .iter()
            .filter(|&&h| a.conn(h).unwrap().state() == State::Established)
            .count();
        assert_eq!(established, 2);
        // Accepting makes room; the dropped SYNs get through on retransmission.
        assert!(b.accept(80).is_some() && b.accept(80).is_some());
        assert!(b.accept(80).is_none());
        run_until(&mut a, &mut b, &mut now, |a, _| {
            hs.iter()
                .all(|&h| a.conn(h).unwrap().state() == State::Established)
        });
        assert_eq!(b.connection_count(), 4);
    }

    /// A held listener (the application's accept queue full) keeps completed connections
    /// established and queued, drops new SYNs and cookie ACKs (no reset, no cookie), and
    /// lets the interface settle; released, the dropped SYNs get in on retransmission.
    #[test]
    fn a_held_listener_keeps_connections_and_drops_new_syns() {
        let (mut a, mut b) = hosts();
        let mut now = Instant::ZERO;
        b.listen(80, 4).unwrap();
        let first: Vec<_> = (0..2)
            .map(|_| a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap())
            .collect();
        run_until(&mut a, &mut b, &mut now, |a, _| {
            first
                .iter()
                .all(|&h| a.conn(h).unwrap().state() == State::Established)
        });
        b.hold_accepts(80, true);
        // Held, the two waiting connections do not keep the interface busy.
        b.poll(now);
        assert!(b.settled(now), "held connections kept the interface busy");
        let later: Vec<_> = (0..3)
            .map(|_| a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap())
            .collect();
        for _ in 0..6 {
            a.poll(now);
            b.poll(now);
            now += Duration::from_micros(20);
        }
        assert_eq!(b.connection_count(), 2);
        assert_eq!(b.stats().accept_queue_full, 3);
        assert_eq!(b.stats().syn_dropped, 3);
        assert_eq!((b.stats().tx_rst, b.stats().syn_cookies_sent), (0, 0));
        for &h in &first {
            assert_eq!(a.conn(h).unwrap().state(), State::Established);
        }
        // Released: the queued ones are accepted, the others get in on retransmission.
        b.hold_accepts(80, false);
        assert!(b.accept(80).is_some() && b.accept(80).is_some());
        run_until(&mut a, &mut b, &mut now, |a, _| {
            later
                .iter()
                .all(|&h| a.conn(h).unwrap().state() == State::Established)
        });
        assert_eq!(b.connection_count(), 5);
        assert_eq!(b.stats().tx_rst, 0);
    }

    #[test]
    fn half_open_connections_hold_no_ring_memory() {
        let (mut a, mut b) = hosts();
        b.listen(80, 64).unwrap();
        let target = SocketAddrV4::new(IP_B, 80);
        let mut now = Instant::ZERO;
        for port in 0..40 {
            a.connect_from(41_000 + port, target, now).unwrap();
        }
        // SYNs out, SYN-ACKs back; A does not complete the handshakes yet.
        a.poll(now);
        for _ in 0..10_000 {
            if b.handles().count() == 40 {
                break;
            }
            now += Duration::from_micros(10);
            b.poll(now);
        }
        let half_open: Vec<_> = b.handles().collect();
        assert_eq!(half_open.len(), 40);
        for &h in &half_open {
            let c = b.conn(h).unwrap();
            assert_eq!(c.state(), State::SynReceived);
            assert_eq!(c.buffer_memory(), 0, "a SYN allocated buffers");
        }
        // Completing one handshake and moving data allocates that connection's rings.
        let first = a.handles().next().unwrap();
        run_until(&mut a, &mut b, &mut now, |a, _| {
            a.conn(first).unwrap().state() == State::Established
        });
        assert_eq!(a.conn_mut(first).unwrap().send(b"hello"), Ok(5));
        run_until(&mut a, &mut b, &mut now, |_, b| {
            b.handles()
                .filter_map(|h| b.conn(h))
                .any(|c| c.recv_queue() == 5)
        });
        let (used, idle): (Vec<_>, Vec<_>) = b
            .handles()
            .filter_map(|h| b.conn(h))
            .partition(|c| c.recv_queue() == 5);
        assert_eq!(used.len(), 1);
        assert!(used[0].buffer_memory() > 0);
        assert!(idle.iter().all(|c| c.buffer_memory() == 0));
    }
}
