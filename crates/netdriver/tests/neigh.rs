//! Privileged tests of `netdriver::neigh` and `netdriver::ports` in a test bed.
//!
//! They skip with a printed reason without root, and fail instead when
//! `NETCHANNEL_REQUIRE_XDP=1`.

use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use netdriver::neigh::{ifindex_of, interface_mac, KernelNeighbors, NeighError};
use netdriver::ports::{
    ensure_not_host_namespace, kernel_port_range, kernel_reserved_ports, EphemeralRange,
    PortsError, PORT_RANGE_SYSCTL,
};
use netdriver::wire::EthernetAddress;
use testbed::{testbed_or_skip, Side, TestBed};

/// An address of the bed's subnet that no interface has.
const UNUSED: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 99);
/// Scheduling slack allowed past a timeout (the machine is shared and slow).
const SLACK: Duration = Duration::from_millis(400);

#[test]
fn interface_helpers_match_the_bed() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    for side in Side::BOTH {
        let ep = bed.side(side).clone();
        let (index, mac, link_mac) = bed
            .run_in(side, || {
                let index = ifindex_of(&ep.ifname).unwrap();
                let mac = interface_mac(&ep.ifname).unwrap();
                let link_mac = KernelNeighbors::open().unwrap().link_mac(index).unwrap();
                (index, mac, link_mac)
            })
            .unwrap();
        assert_eq!(index, ep.ifindex, "side {side}");
        assert_eq!(mac, EthernetAddress(ep.mac), "side {side}");
        assert_eq!(link_mac, mac, "side {side}");
    }
    // The peer's interface does not exist in A's namespace.
    let missing = bed
        .run_in(Side::A, || (ifindex_of("vB"), interface_mac("vB")))
        .unwrap();
    assert!(matches!(missing.0, Err(NeighError::InterfaceNotFound(ref n)) if n == "vB"));
    assert!(matches!(missing.1, Err(NeighError::InterfaceNotFound(ref n)) if n == "vB"));
}

#[test]
fn lookup_resolve_and_timeout() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let a = bed.side(Side::A).clone();
    let b = bed.side(Side::B).clone();
    let mut table = bed
        .run_in(Side::A, || {
            let mut table = KernelNeighbors::open().unwrap();
            // Nothing has talked to B yet (IPv6 is off in the bed): no entry at all.
            assert_eq!(table.entry(a.ifindex, b.ipv4).unwrap(), None);
            assert_eq!(table.lookup(a.ifindex, b.ipv4).unwrap(), None);

            let start = Instant::now();
            let mac = table
                .resolve(a.ifindex, b.ipv4, Duration::from_secs(2))
                .unwrap();
            let took = start.elapsed();
            eprintln!("resolved {} on a veth in {took:?}", b.ipv4);
            assert_eq!(mac, EthernetAddress(b.mac));
            assert!(took < Duration::from_secs(2) + SLACK, "{took:?}");
            assert_eq!(table.lookup(a.ifindex, b.ipv4).unwrap(), Some(mac));
            let entry = table.entry(a.ifindex, b.ipv4).unwrap().unwrap();
            assert!(entry.state.is_usable(), "{entry:?}");

            // A second resolve is answered from the table.
            assert_eq!(
                table
                    .resolve(a.ifindex, b.ipv4, Duration::from_millis(1))
                    .unwrap(),
                mac
            );

            // Nobody has 10.77.0.99: the kernel's ARP (3 probes 1 s apart) is still
            // trying when the deadline passes.
            let timeout = Duration::from_millis(500);
            let start = Instant::now();
            let err = table.resolve(a.ifindex, UNUSED, timeout).unwrap_err();
            let elapsed = start.elapsed();
            match err {
                NeighError::Timeout {
                    ip,
                    ifindex,
                    waited,
                } => {
                    assert_eq!(ip, UNUSED);
                    assert_eq!(ifindex, a.ifindex);
                    assert!(waited >= timeout, "{waited:?}");
                }
                other => panic!("expected a timeout, got {other}"),
            }
            assert!(elapsed >= timeout, "{elapsed:?}");
            assert!(elapsed < timeout + SLACK, "{elapsed:?}");
            let entry = table.entry(a.ifindex, UNUSED).unwrap();
            assert_eq!(entry.and_then(|e| e.usable_mac()), None);

            // An interface index that does not exist.
            let r = table.resolve(9999, b.ipv4, timeout);
            assert!(matches!(r, Err(NeighError::InterfaceNotFound(_))), "{r:?}");
            let r = table.lookup(9999, b.ipv4);
            assert!(matches!(r, Err(NeighError::InterfaceNotFound(_))), "{r:?}");
            assert!(matches!(
                table.link_mac(9999),
                Err(NeighError::InterfaceNotFound(_))
            ));
            table
        })
        .unwrap();

    // The table stays in A's namespace whichever thread uses it: from a thread in B it
    // still reads A's entries, but refuses to trigger resolution from there.
    bed.run_in(Side::B, move || {
        assert_eq!(
            table.lookup(a.ifindex, b.ipv4).unwrap(),
            Some(EthernetAddress(b.mac))
        );
        assert!(matches!(
            table.resolve(
                a.ifindex,
                Ipv4Addr::new(10, 77, 0, 98),
                Duration::from_millis(100)
            ),
            Err(NeighError::WrongNamespace)
        ));
    })
    .unwrap();
}

#[test]
fn failed_resolution_is_unreachable() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let a = bed.side(Side::A).clone();
    bed.run_in(Side::A, || {
        // In the bed's own namespace only: one ARP probe, 100 ms to answer it.
        std::fs::write("/proc/sys/net/ipv4/neigh/vA/mcast_solicit", "1\n").unwrap();
        std::fs::write("/proc/sys/net/ipv4/neigh/vA/retrans_time_ms", "100\n").unwrap();
        let mut table = KernelNeighbors::open().unwrap();
        let start = Instant::now();
        let err = table
            .resolve(a.ifindex, UNUSED, Duration::from_secs(3))
            .unwrap_err();
        let elapsed = start.elapsed();
        assert!(
            matches!(err, NeighError::Unreachable { ip, ifindex } if ip == UNUSED && ifindex == a.ifindex),
            "{err}"
        );
        // FAILED comes after the single 100 ms probe, well before the 3 s deadline.
        assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
        assert_eq!(
            table.entry(a.ifindex, UNUSED).unwrap().map(|e| e.state),
            Some(netdriver::neigh::NeighborState::Failed)
        );
    })
    .unwrap();
}

#[test]
fn ports_sysctl_follows_thread_namespace() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    // A thread that entered A's namespace writes and reads A's sysctl.
    let (range_a, ephemeral_a, kernel_port) = bed
        .run_in(Side::A, || {
            std::fs::write(PORT_RANGE_SYSCTL, "40000 50000\n").unwrap();
            let range = kernel_port_range().unwrap();
            let ephemeral = EphemeralRange::from_kernel().unwrap();
            // The kernel really picks its ports from that range.
            let port = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            (range, ephemeral, port)
        })
        .unwrap();
    assert_eq!(range_a, 40000..=50000);
    assert_eq!(ephemeral_a.kernel, 40000..=50000);
    assert_eq!(ephemeral_a.ours, 50001..=65535);
    assert!(range_a.contains(&kernel_port), "{kernel_port}");
    assert!(!ephemeral_a.ours.contains(&kernel_port));

    // B's namespace still has a fresh namespace's default.
    let range_b = bed.run_in(Side::B, kernel_port_range).unwrap().unwrap();
    assert_eq!(range_b, 32768..=60999);
    assert_ne!(range_b, range_a);

    // The opt-in reservation lands in A's namespace only.
    let reserved_a = bed
        .run_in(Side::A, || {
            ensure_not_host_namespace().unwrap();
            ephemeral_a.reserve_in_kernel().unwrap();
            kernel_reserved_ports().unwrap()
        })
        .unwrap();
    assert_eq!(reserved_a, vec![50001..=65535]);
    let reserved_b = bed.run_in(Side::B, kernel_reserved_ports).unwrap().unwrap();
    assert_eq!(reserved_b, vec![]);

    // The test's own thread is in the host's namespace: reservation is refused there
    // (checked without attempting it).
    assert!(matches!(
        ensure_not_host_namespace(),
        Err(PortsError::HostNamespace)
    ));
}

/// `entry_confirming` answers from what it read within `max_age` only for the MAC address
/// it read there, and only while the kernel reports no change to the entry; any other
/// address, or any address after a change, gets the kernel's current entry (a forged ARP
/// that rewrote the entry must be seen at the next passive open, not a second later).
#[test]
fn recent_entries_confirm_only_their_own_address() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let a = bed.side(Side::A).clone();
    let ifname = a.ifname.clone();
    let set_mac = |mac: &str| {
        let ip = UNUSED.to_string();
        let args = [
            "neigh",
            "replace",
            &ip,
            "lladdr",
            mac,
            "dev",
            &ifname,
            "nud",
            "permanent",
        ];
        bed.output_in(Side::A, "ip", &args)
            .expect("ip neigh replace");
    };
    let (m1, m2) = (
        EthernetAddress([2, 0, 0, 0, 0, 1]),
        EthernetAddress([2, 0, 0, 0, 0, 2]),
    );
    let age = Duration::from_secs(60);
    set_mac("02:00:00:00:00:01");
    let mut table = bed.run_in(Side::A, KernelNeighbors::open).unwrap().unwrap();
    let mac_of = |e: Option<netdriver::neigh::NeighborEntry>| e.and_then(|e| e.mac);
    assert_eq!(
        mac_of(table.entry_confirming(a.ifindex, UNUSED, m1, age).unwrap()),
        Some(m1)
    );
    // A peer from another address gets the kernel's current entry.
    assert_eq!(
        mac_of(table.entry_confirming(a.ifindex, UNUSED, m2, age).unwrap()),
        Some(m1)
    );
    set_mac("02:00:00:00:00:02");
    // The kernel reported the change: the remembered match for m1 is gone, within its age.
    assert_eq!(
        mac_of(table.entry_confirming(a.ifindex, UNUSED, m1, age).unwrap()),
        Some(m2)
    );
    assert_eq!(
        mac_of(table.entry_confirming(a.ifindex, UNUSED, m2, age).unwrap()),
        Some(m2)
    );
    assert_eq!(
        mac_of(table.entry_confirming(a.ifindex, UNUSED, m1, age).unwrap()),
        Some(m2)
    );
    // Past its age a match is read again.
    assert_eq!(
        mac_of(
            table
                .entry_confirming(a.ifindex, UNUSED, m2, Duration::ZERO)
                .unwrap()
        ),
        Some(m2)
    );
}
