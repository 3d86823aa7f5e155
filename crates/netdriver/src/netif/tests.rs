//! Tests of the interface as a whole (a handshake, data and an orderly close; TIME-WAIT
//! records), and the hosts on a simulated link that every file's tests build on.

use std::net::{Ipv4Addr, SocketAddrV4};

use super::{Interface, InterfaceConfig};
use crate::link::sim::{self, SimConfig, SimLink};
use crate::tcp::{Config, State, TcpError};
use crate::time::{Duration, Instant};
use crate::wire::EthernetAddress;

pub(super) const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
pub(super) const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xb]);
pub(super) const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub(super) const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

pub(super) fn tcp_config() -> Config {
    Config {
        min_rto: Duration::from_millis(1),
        initial_rto: Duration::from_millis(10),
        time_wait: Duration::from_millis(5),
        delayed_ack: None,
        ..Config::default()
    }
}

pub(super) fn host(link: SimLink, mac: EthernetAddress, ip: Ipv4Addr) -> Interface<SimLink> {
    Interface::new(
        link,
        InterfaceConfig {
            mac,
            ipv4: ip,
            tcp: tcp_config(),
            isn_key: Some([7; 16]),
            ..InterfaceConfig::default()
        },
    )
}

pub(super) fn hosts() -> (Interface<SimLink>, Interface<SimLink>) {
    let (la, lb) = sim::pair(SimConfig::default());
    let mut a = host(la, MAC_A, IP_A);
    let mut b = host(lb, MAC_B, IP_B);
    a.add_neighbor(IP_B, MAC_B);
    b.add_neighbor(IP_A, MAC_A);
    (a, b)
}

/// Polls both hosts, jumping virtual time, until `done` or nothing is scheduled.
pub(super) fn run_until(
    a: &mut Interface<SimLink>,
    b: &mut Interface<SimLink>,
    now: &mut Instant,
    mut done: impl FnMut(&mut Interface<SimLink>, &mut Interface<SimLink>) -> bool,
) {
    for _ in 0..100_000 {
        a.poll(*now);
        b.poll(*now);
        if done(a, b) {
            return;
        }
        match [a.poll_at(), b.poll_at()].into_iter().flatten().min() {
            Some(t) => *now = (*now).max(t),
            None => return,
        }
    }
    panic!("no end in sight");
}

#[test]
fn handshake_data_and_close() {
    let (mut a, mut b) = hosts();
    let mut now = Instant::ZERO;
    b.listen(80, 4).unwrap();
    let ca = a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap();
    let mut cb = None;
    run_until(&mut a, &mut b, &mut now, |_, b| {
        cb = cb.or_else(|| b.accept(80));
        cb.is_some()
    });
    let cb = cb.unwrap();
    assert_eq!(a.conn(ca).unwrap().state(), State::Established);
    assert_eq!(a.conn_mut(ca).unwrap().send(b"hello").unwrap(), 5);
    a.conn_mut(ca).unwrap().close();
    let mut got = Vec::new();
    run_until(&mut a, &mut b, &mut now, |_, b| {
        let mut buf = [0u8; 64];
        match b.conn_mut(cb).unwrap().recv(&mut buf) {
            Ok(0) => true,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                false
            }
            Err(TcpError::WouldBlock) => false,
            Err(e) => panic!("{e}"),
        }
    });
    assert_eq!(got, b"hello");
    b.conn_mut(cb).unwrap().close();
    run_until(&mut a, &mut b, &mut now, |a, b| {
        a.connection_count() + b.connection_count() == 0
    });
    assert!(a.conn(ca).is_none() && b.conn(cb).is_none());
    assert_eq!(a.stats().connections_removed, 1);
    assert_eq!(b.stats().connections_removed, 1);
}

/// A passively opened connection whose side closes first leaves the connection table
/// for a TIME-WAIT record once the peer's FIN is in (HTTP/1.0's server): the record
/// ends after 2×MSL, or earlier when a new SYN of the same 4-tuple reopens it
/// (RFC 6191).
#[test]
fn a_server_that_closes_first_keeps_a_time_wait_record_not_a_connection() {
    let (mut a, mut b) = hosts();
    let mut now = Instant::ZERO;
    b.listen(80, 4).unwrap();
    let remote = SocketAddrV4::new(IP_B, 80);
    let mut recorded = now;
    for round in 0..2 {
        let ca = a.connect_from(40_000, remote, now).unwrap();
        let mut cb = None;
        run_until(&mut a, &mut b, &mut now, |_, b| {
            cb = cb.or_else(|| b.accept(80));
            cb.is_some()
        });
        let cb = cb.unwrap();
        // The server answers and closes first; the client reads to the end and closes.
        assert_eq!(b.conn_mut(cb).unwrap().send(b"bye").unwrap(), 3);
        b.conn_mut(cb).unwrap().close();
        let mut got = Vec::new();
        run_until(&mut a, &mut b, &mut now, |a, _| {
            let mut buf = [0u8; 16];
            match a.conn_mut(ca).unwrap().recv(&mut buf) {
                Ok(0) => true,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    false
                }
                Err(TcpError::WouldBlock) => false,
                Err(e) => panic!("{e}"),
            }
        });
        assert_eq!(got, b"bye");
        a.conn_mut(ca).unwrap().close();
        run_until(&mut a, &mut b, &mut now, |a, b| {
            a.connection_count() == 0 && b.connection_count() == 0
        });
        // An orderly end for the application; the 4-tuple is held by a record.
        let mut closed = Vec::new();
        while let Some(c) = b.pop_closed() {
            closed.push(c);
        }
        assert_eq!(closed, [(cb, None)]);
        assert_eq!(b.time_wait_count(), 1);
        assert_eq!(b.stats().time_wait_records, round + 1);
        assert_eq!(b.stats().time_wait_reopened, round);
        recorded = now;
        // Then a new connection from the same port: its SYN ends the record.
        now += Duration::from_millis(1);
    }
    // Without one, the record ends with 2×MSL (5 ms here, from the peer's FIN, which
    // came just before the record).
    run_until(&mut a, &mut b, &mut now, |_, b| b.time_wait_count() == 0);
    let lived = now - recorded;
    assert!(
        lived > Duration::from_millis(1) && lived <= Duration::from_millis(5),
        "{lived:?}"
    );
    assert!(b.poll_at().is_none());
    assert_eq!(b.stats().rx_no_connection, 0);
}
