//! TCP checksums through AF_XDP TX metadata, against the peer's kernel TCP on the test
//! bed: with the request on, the frames our channel sends leave with only the
//! pseudo-header sum and a checksum request; the sending veth end has its tx checksum
//! offload off, so the kernel completes each checksum in software before the frame
//! crosses, and the peer verifies every one. A wrong seed would be a wrong checksum, the
//! peer would drop the segment (`TcpInCsumErrors`), and the transfer would stall. With the
//! request off, the link sums the frames itself and the statistics say so. Jumbo frames
//! sent as descriptor chains carry the request too.
//!
//! Privileged: each test skips without root, and fails instead when
//! `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

mod common;

use std::net::{Shutdown, SocketAddr, TcpListener};
use std::sync::mpsc;

use common::{config, echo, recv_stream, send_stream, start, DEADLINE};
use netdriver::channel::ChannelSetConfig;
use netdriver::link::xdp::{SoftwareChecksum, TxChecksum, XdpLink, XdpLinkConfig};
use testbed::{testbed_or_skip, Side, TestBed};

const BULK: u64 = 32 << 20;

/// `TcpExt`/`Tcp` `InCsumErrors` of side `side`'s namespace (`/proc/net/snmp`).
fn in_csum_errors(bed: &TestBed, side: Side) -> u64 {
    let snmp = bed.output_in(side, "cat", &["/proc/net/snmp"]).unwrap();
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap(), tcp.next().unwrap());
    let at = names
        .split_whitespace()
        .position(|n| n == "InCsumErrors")
        .expect("InCsumErrors in /proc/net/snmp");
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

/// Our channel in A sends `BULK` bytes to a kernel echo server in B and verifies the
/// echo; returns what A's queue reported of its transmit checksums, and the checksum
/// errors B's kernel counted meanwhile.
fn echo_through_kernel(bed: &TestBed, cfg: ChannelSetConfig) -> (Option<TxChecksum>, u64) {
    let b_ip = bed.side(Side::B).ipv4;
    let errors_before = in_csum_errors(bed, Side::B);
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = bed
        .spawn_thread_in(Side::B, move || {
            let l = TcpListener::bind((b_ip, 0)).unwrap();
            ready_tx.send(l.local_addr().unwrap()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            c.set_read_timeout(Some(DEADLINE)).unwrap();
            let n = echo(&mut c).unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            n
        })
        .unwrap();
    let addr = match ready_rx.recv().unwrap() {
        SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let set = start(bed, Side::A, cfg);
    let ch = set.connect(addr).expect("connect");
    let got = std::thread::scope(|s| {
        s.spawn(|| send_stream(&ch, 3, BULK, 64 * 1024));
        recv_stream(&ch, 3)
    });
    assert_eq!(got, BULK, "every byte came back, in order");
    assert_eq!(
        server.join().unwrap(),
        BULK,
        "the kernel peer got every byte"
    );
    let queues = set.queue_stats();
    assert_eq!(queues.len(), 1);
    let drops = queues[0].xsk_drops.expect("an AF_XDP socket's counters");
    assert_eq!(drops.tx_invalid_descs, 0, "{drops:?}");
    drop(ch);
    set.shutdown().unwrap();
    (
        queues[0].tx_checksum,
        in_csum_errors(bed, Side::B) - errors_before,
    )
}

/// With TX metadata (the default), the kernel completes the checksums from our
/// pseudo-header sums and the verifying peer receives every byte; the statistics say the
/// offload is in use.
#[test]
fn checksums_completed_from_tx_metadata_verify_at_a_kernel_peer() {
    let Some(bed) = testbed_or_skip(TestBed::builder().tx_checksum_offload(false)) else {
        return;
    };
    let cfg = config(&bed, Side::A);
    assert!(cfg.link.tx_checksum_offload, "on by default");
    let (mode, errors) = echo_through_kernel(&bed, cfg);
    assert_eq!(mode, Some(TxChecksum::Offload));
    assert_eq!(errors, 0, "the peer found no bad TCP checksum");
}

/// The same at veth's default offloads: the peer takes the partial checksums as they
/// are (host-local), and the transfer is exact.
#[test]
fn offloaded_checksums_at_default_veth_offloads() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let (mode, errors) = echo_through_kernel(&bed, config(&bed, Side::A));
    assert_eq!(mode, Some(TxChecksum::Offload));
    assert_eq!(errors, 0);
}

/// With the request turned off, the link sums every frame itself, the peer verifies
/// them, and the statistics report the fallback and why.
#[test]
fn with_tx_metadata_off_the_link_sums_and_says_so() {
    let Some(bed) = testbed_or_skip(TestBed::builder().tx_checksum_offload(false)) else {
        return;
    };
    let mut cfg = config(&bed, Side::A);
    cfg.link.tx_checksum_offload = false;
    let (mode, errors) = echo_through_kernel(&bed, cfg);
    assert_eq!(
        mode,
        Some(TxChecksum::Software {
            reason: SoftwareChecksum::Off
        })
    );
    assert_eq!(errors, 0);
}

/// Frames that need multi-buffer chains (MTU 9000 in 2048-byte UMEM frames: six
/// descriptors, written in place across adjacent chunks of an unaligned UMEM) carry the
/// request on their first descriptor; the verifying peer receives every byte.
#[test]
fn jumbo_chains_carry_checksum_requests_to_a_verifying_peer() {
    let Some(bed) = testbed_or_skip(TestBed::builder().mtu(9000).tx_checksum_offload(false)) else {
        return;
    };
    let ifname = bed.side(Side::A).ifname.clone();
    let (multi_buffer, mode) = bed
        .run_in(Side::A, move || {
            let link = XdpLink::open(XdpLinkConfig::new(ifname, 0)).expect("open with chains");
            (link.multi_buffer(), link.tx_checksum())
        })
        .unwrap();
    assert!(multi_buffer);
    assert_eq!(mode, TxChecksum::Offload);
    let (mode, errors) = echo_through_kernel(&bed, config(&bed, Side::A));
    assert_eq!(mode, Some(TxChecksum::Offload));
    assert_eq!(errors, 0, "the peer found no bad TCP checksum");
}
