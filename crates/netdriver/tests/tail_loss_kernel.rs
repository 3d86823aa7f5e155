//! Tail losses against the peer's kernel TCP at its default settings: a request/response
//! exchange of two-segment messages in which the last segment of one request is lost after
//! it crossed the wire (`iptables` in the kernel's INPUT chain), so that no later segment
//! can reveal the loss by duplicate ACKs or SACK. With tail loss probes (RFC 8985 TLP: with
//! more than one segment in flight the probe timeout is two smoothed RTTs) our stack
//! recovers in about a millisecond rather than after a retransmission timeout (200 ms at
//! least); the test asserts it from the counters (`ChannelStats::rto_timeouts` stays 0
//! while a segment went again) and the exchange's time, and checks every byte. Offloads
//! stay at veth's defaults.
//!
//! The other direction, the kernel's tail lost on the wire and its own TLP recovering, is
//! made by our side: a netfilter drop in the kernel's OUTPUT or POSTROUTING chain would be
//! a local error its TCP sees (it sends the segment again later; no probe, no loss), and
//! this bed's kernel has no qdisc or tc action that drops one chosen packet after the TCP
//! layer (no `netem`, `prio` or `gact`). So our channel set drops the kernel's segments
//! as they arrive, before our TCP sees them (`ChannelSet::drop_received`): to the kernel
//! they were lost on the wire. Its recovery then depends on our answers: the probe's
//! SACK is what lets it repair the hole without a timeout.
//!
//! Privileged: each test skips without root, and fails instead when
//! `NETCHANNEL_REQUIRE_XDP=1`. Rules live in the bed's namespaces and go with them.
#![cfg(target_os = "linux")]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{config, start, DEADLINE};
use netdriver::channel::ChannelStream;
use testbed::{testbed_or_skip, Side, TestBed};

/// Exchanges in each test; the first dropped one is the `DROPPED`-th (0-based), after
/// the connection has RTT samples.
const EXCHANGES: usize = 12;
const DROPPED: usize = 5;
/// Request and response size: a full segment, then a short one whose IP length (163
/// with the timestamp option, 1448 + 111 bytes; 139 without, 1460 + 99) nothing else of
/// the connection has.
const MSG: usize = 1448 + 111;
const MATCH_LENGTHS: &str = "131:183";
/// An exchange recovered by a retransmission timeout takes at least this long.
const RTO_MIN: Duration = Duration::from_millis(200);

fn iptables(bed: &TestBed) -> &'static str {
    for tool in ["iptables", "iptables-legacy"] {
        if bed.output_in(Side::B, tool, &["-w", "-L", "-n"]).is_ok() {
            return tool;
        }
    }
    panic!("neither iptables nor iptables-legacy works (scripts/install-deps.sh installs it)");
}

/// Makes B's kernel drop the `DROPPED`-th tail segment of a request to `port` that it
/// receives (after the segment crossed the wire). Returns the tool.
fn drop_one_request(bed: &TestBed, port: u16) -> &'static str {
    let tool = iptables(bed);
    let port = port.to_string();
    let nth = DROPPED.to_string();
    bed.output_in(
        Side::B,
        tool,
        &[
            "-w",
            "-A",
            "INPUT",
            "-p",
            "tcp",
            "--dport",
            &port,
            "-m",
            "length",
            "--length",
            MATCH_LENGTHS,
            "-m",
            "statistic",
            "--mode",
            "nth",
            "--every",
            "1000000",
            "--packet",
            &nth,
            "-j",
            "DROP",
        ],
    )
    .unwrap_or_else(|e| panic!("{tool} -A INPUT: {e}"));
    tool
}

/// Packets the DROP rules of B's INPUT chain matched.
fn input_dropped(bed: &TestBed, tool: &str) -> u64 {
    let out = bed
        .output_in(Side::B, tool, &["-w", "-L", "INPUT", "-n", "-v", "-x"])
        .unwrap_or_default();
    out.lines()
        .filter(|l| l.contains("DROP"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn message(i: usize, tag: u8) -> Vec<u8> {
    (0..MSG)
        .map(|k| (i as u8).wrapping_mul(31) ^ (k as u8) ^ tag)
        .collect()
}

/// A kernel server in B: for each request, checks it and answers with the request's
/// message in one write.
fn kernel_server(bed: &TestBed) -> (SocketAddr, testbed::NsJoinHandle<()>) {
    kernel_answering(bed, |i| message(i, 0xa5))
}

/// A kernel server in B: for each request (`MSG` bytes), checks it and answers with
/// `answer(i)` in one write.
fn kernel_answering(
    bed: &TestBed,
    answer: fn(usize) -> Vec<u8>,
) -> (SocketAddr, testbed::NsJoinHandle<()>) {
    let b_ip = bed.side(Side::B).ipv4;
    let (tx, rx) = mpsc::channel();
    let server = bed
        .spawn_thread_in(Side::B, move || {
            let l = TcpListener::bind((b_ip, 0)).unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            c.set_read_timeout(Some(DEADLINE)).unwrap();
            let mut req = vec![0u8; MSG];
            for i in 0..EXCHANGES {
                c.read_exact(&mut req).unwrap();
                assert_eq!(req, message(i, 0x5a), "request {i}");
                c.write_all(&answer(i)).unwrap();
            }
        })
        .unwrap();
    (rx.recv().unwrap(), server)
}

/// Runs the exchanges from our channel, each request in one write (both segments leave
/// together, the short one last); returns how long each took.
fn exchanges(stream: &mut ChannelStream) -> Vec<Duration> {
    let mut took = Vec::new();
    let mut resp = vec![0u8; MSG];
    for i in 0..EXCHANGES {
        let t = Instant::now();
        stream.write_all(&message(i, 0x5a)).unwrap();
        stream.flush().unwrap();
        stream.read_exact(&mut resp).unwrap();
        assert_eq!(resp, message(i, 0xa5), "response {i}");
        took.push(t.elapsed());
    }
    took
}

fn slowest_other(took: &[Duration]) -> Duration {
    took.iter()
        .enumerate()
        .filter(|&(i, _)| i != DROPPED && i != EXCHANGES - 1)
        .map(|(_, d)| *d)
        .max()
        .unwrap_or_default()
}

/// Our request's last segment is lost: the kernel never sees it, and nothing follows it.
/// Our TLP sends it again two RTTs later, well before a retransmission timeout would.
#[test]
fn our_tail_loss_is_recovered_by_a_probe_not_a_timeout() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let (addr, server) = kernel_server(&bed);
    let tool = drop_one_request(&bed, addr.port());
    let mut cfg = config(&bed, Side::A);
    // `NC_TEST_NO_TLP=1` turns the probe off, to see the test fail (one timeout, 240 ms).
    if std::env::var_os("NC_TEST_NO_TLP").is_some() {
        cfg.tcp.tail_loss_probe = false;
    }
    let set = start(&bed, Side::A, cfg);
    let SocketAddr::V4(addr) = addr else {
        panic!("IPv4 bed")
    };
    let ch = set.connect(addr).expect("connect");
    let mut stream = ChannelStream::new(ch);
    stream.set_read_timeout(Some(DEADLINE));
    let took = exchanges(&mut stream);
    server.join().unwrap();
    let stats = stream.channel().stats();
    println!(
        "our tail loss: exchange {DROPPED} took {:?} (others up to {:?}); {stats:?}",
        took[DROPPED],
        slowest_other(&took)
    );
    assert_eq!(input_dropped(&bed, tool), 1, "the rule dropped one request");
    assert!(stats.retransmitted_segments >= 1, "{stats:?}");
    assert_eq!(
        stats.rto_timeouts, 0,
        "recovered by a timeout, not a probe: {stats:?}"
    );
    assert!(
        took[DROPPED] < RTO_MIN,
        "the lost tail took {:?} to recover",
        took[DROPPED]
    );
    drop(stream);
    set.shutdown().unwrap();
}

/// Response size of the kernel-side test: four full segments.
const RESPONSE: usize = 4 * 1448;

fn response(i: usize) -> Vec<u8> {
    (0..RESPONSE)
        .map(|k| (i as u8).wrapping_mul(17) ^ (k as u8).rotate_left(3))
        .collect()
}

/// B's kernel counter `TcpExt: name` (`/proc/net/netstat` of B's namespace).
fn tcp_ext(bed: &TestBed, name: &str) -> u64 {
    let text = bed
        .output_in(Side::B, "cat", &["/proc/net/netstat"])
        .expect("read /proc/net/netstat in B");
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no TcpExt {name} in B"))
}

/// The kernel's response loses its last two segments on the wire (dropped as they reach
/// us), with nothing after them. The kernel at its defaults sends a tail loss probe (its
/// last segment again, two RTTs later); our SACK of it shows the hole, which the kernel
/// repairs at once: the exchange takes milliseconds, not a retransmission timeout.
#[test]
fn the_kernels_tail_loss_is_recovered_by_its_probe_and_our_sack() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let (addr, server) = kernel_answering(&bed, response);
    let SocketAddr::V4(addr) = addr else {
        panic!("IPv4 bed")
    };
    let mut cfg = config(&bed, Side::A);
    // `NC_TEST_NO_SACK=1` takes our SACK away, to see the test fail (the kernel then
    // waits for its retransmission timeout).
    if std::env::var_os("NC_TEST_NO_SACK").is_some() {
        cfg.tcp.sack = false;
    }
    let set = start(&bed, Side::A, cfg);
    // The third and fourth data segments of the `DROPPED`-th response.
    set.drop_received(Some(netdriver::netif::RxDrop {
        from: addr,
        skip: (4 * DROPPED + 2) as u64,
        count: 2,
        seen: 0,
        dropped: 0,
    }));
    let probes_before = tcp_ext(&bed, "TCPLossProbes");
    let ch = set.connect(addr).expect("connect");
    let mut stream = ChannelStream::new(ch);
    stream.set_read_timeout(Some(DEADLINE));
    let mut took = Vec::new();
    let mut resp = vec![0u8; RESPONSE];
    for i in 0..EXCHANGES {
        let t = Instant::now();
        stream.write_all(&message(i, 0x5a)).unwrap();
        stream.flush().unwrap();
        stream.read_exact(&mut resp).unwrap();
        assert_eq!(resp, response(i), "response {i}");
        took.push(t.elapsed());
    }
    server.join().unwrap();
    let probes = tcp_ext(&bed, "TCPLossProbes") - probes_before;
    let stats = stream.channel().stats();
    println!(
        "kernel tail loss: exchange {DROPPED} took {:?} (others up to {:?}); kernel loss \
         probes {probes}; {stats:?}",
        took[DROPPED],
        slowest_other(&took)
    );
    assert_eq!(
        set.fault_dropped(),
        2,
        "the rule dropped the response's tail"
    );
    assert!(probes >= 1, "the kernel sent no tail loss probe");
    assert!(
        took[DROPPED] < RTO_MIN,
        "the kernel's lost tail took {:?} to recover",
        took[DROPPED]
    );
    drop(stream);
    set.shutdown().unwrap();
}
