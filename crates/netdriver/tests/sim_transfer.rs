//! Seeded whole-stack simulations: two [`Interface`]s over a simulated link wrapped in
//! fault injectors, two connections each carrying data both ways at once, over a grid of
//! loss, reordering, duplication, corruption and buffer sizes. Every byte received is
//! checked against what was sent, and every case must finish within a virtual deadline.
//!
//! A failing case prints its name, seed and configuration. To replay one case with another
//! seed (or the printed one):
//!
//! ```text
//! NETCHANNEL_SIM_SEED=1234 cargo test -p netdriver --test sim_transfer -- <test name>
//! ```
//!
//! With `SIM_DEBUG` set, every connection's state and counters are printed each 500 ms of
//! virtual time.
//!
//! The `large_segments_*` cases run with super-segments on: the link cuts them into wire
//! segments ([`SimOffload::Segment`], as a NIC's TSO), the faults hit wire segments, and
//! the receiver's [`SoftGro`] coalesces what arrives in order again (as a kernel's GRO),
//! so losses, reordering, duplicates and corruption fall *inside* super-segments on both
//! the sending and the receiving side; one case carries super-segments whole instead
//! ([`SimOffload::Whole`], as veth between two offloading ends), where a fault takes a
//! whole super-segment.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddrV4};

use netdriver::link::fault::{FaultConfig, FaultDirection, FaultInjector};
use netdriver::link::gro::SoftGro;
use netdriver::link::sim::{self, SimConfig, SimLink, SimOffload};
use netdriver::netif::{ConnHandle, Interface, InterfaceConfig};
use netdriver::tcp::{Config, TcpError};
use netdriver::time::{Duration, Instant};
use netdriver::wire::EthernetAddress;

type Host = Interface<SoftGro<FaultInjector<SimLink>>>;

const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xb]);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// One simulated scenario.
#[derive(Debug, Clone)]
struct Case {
    name: &'static str,
    seed: u64,
    /// Bytes each side sends on each connection.
    bytes: usize,
    loss: f64,
    reorder: f64,
    duplicate: f64,
    corrupt: f64,
    /// TCP send and receive buffer size; `None` keeps the default (256 KiB).
    buffer: Option<usize>,
    latency: Duration,
    bandwidth_bps: Option<u64>,
    /// The run fails if it has not finished by then (virtual time).
    deadline: Duration,
    /// The link's offloads; with any, super-segments are on (and, when the link cuts
    /// them, the receiver coalesces).
    offload: SimOffload,
    /// The link gathers (`SimConfig::gather`): payloads the send queue holds in shared
    /// buffers leave as slices of them, not copied into the frame by the connection.
    gather: bool,
}

impl Case {
    fn new(name: &'static str, seed: u64, bytes: usize) -> Case {
        Case {
            name,
            seed,
            bytes,
            loss: 0.0,
            reorder: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            buffer: None,
            latency: Duration::from_micros(50),
            bandwidth_bps: Some(1_000_000_000),
            deadline: Duration::from_secs(120),
            offload: SimOffload::None,
            gather: false,
        }
    }
}

/// Word `index` of stream `stream`: cheap, position-addressable pseudo-random data
/// (SplitMix64), so that senders need no copy of what they sent and receivers check every
/// byte against the position it should have.
fn pattern_word(stream: u64, index: u64) -> [u8; 8] {
    let mut x = index ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)).to_le_bytes()
}

/// Fills `buf` with stream `stream`'s bytes from `offset` on (a word at a time: the tests
/// run in debug builds, where per-byte work dominates otherwise).
fn fill(stream: u64, offset: usize, buf: &mut [u8]) {
    let mut at = 0;
    while at < buf.len() {
        let pos = offset + at;
        let word = pattern_word(stream, (pos / 8) as u64);
        let skip = pos % 8;
        let n = (8 - skip).min(buf.len() - at);
        buf[at..at + n].copy_from_slice(&word[skip..skip + n]);
        at += n;
    }
}

/// One direction of one connection, as the application sees it.
#[derive(Debug, Default)]
struct Stream {
    id: u64,
    sent: usize,
    /// Writes made (`send` and `send_bytes` alternate).
    writes: u64,
    closed: bool,
    received: usize,
    eof: bool,
}

/// One end of one connection.
#[derive(Debug)]
struct End {
    handle: Option<ConnHandle>,
    /// Port to accept on, for the passive end.
    accept_port: Option<u16>,
    tx: Stream,
    rx: Stream,
}

/// Moves application data on one end; returns whether anything moved, or the failure.
fn pump(
    host: &mut Host,
    end: &mut End,
    total: usize,
    scratch: &mut [u8],
    expected: &mut [u8],
) -> Result<bool, String> {
    if end.handle.is_none() {
        end.handle = end.accept_port.and_then(|p| host.accept(p));
    }
    let Some(h) = end.handle else {
        return Ok(false);
    };
    let Some(conn) = host.conn_mut(h) else {
        if end.tx.closed && end.rx.eof {
            return Ok(false); // closed and forgotten after a clean finish
        }
        return Err(format!(
            "connection {} vanished (sent {}, received {})",
            end.tx.id, end.tx.sent, end.rx.received
        ));
    };
    let mut moved = false;
    while end.tx.sent < total {
        // Generate only what the send buffer can take now.
        let n = scratch.len().min(total - end.tx.sent).min(conn.send_free());
        if n == 0 {
            break;
        }
        fill(end.tx.id, end.tx.sent, &mut scratch[..n]);
        // Every other write hands the connection a buffer to share (a channel's chunks
        // are `Bytes`: `send_bytes` keeps large ones as they are), so that copied and
        // shared pieces of the send queue interleave under every fault.
        end.tx.writes += 1;
        let sent = if end.tx.writes % 2 == 0 {
            conn.send_bytes(&bytes::Bytes::copy_from_slice(&scratch[..n]))
        } else {
            conn.send(&scratch[..n])
        };
        match sent {
            Ok(k) => {
                end.tx.sent += k;
                moved |= k > 0;
                if k < n {
                    break;
                }
            }
            Err(TcpError::WouldBlock) => break,
            Err(e) => return Err(format!("send on stream {}: {e}", end.tx.id)),
        }
    }
    // Close only once synchronized: closing in SYN-SENT abandons the connection
    // (RFC 9293 §3.10.4), queued data and all.
    if end.tx.sent == total && !end.tx.closed && conn.state().is_synchronized() {
        conn.close();
        end.tx.closed = true;
        moved = true;
    }
    while !end.rx.eof {
        match conn.recv(scratch) {
            Ok(0) => {
                if end.rx.received != total {
                    return Err(format!(
                        "EOF on stream {} after {} of {total} bytes",
                        end.rx.id, end.rx.received
                    ));
                }
                end.rx.eof = true;
                moved = true;
            }
            Ok(n) => {
                let at = end.rx.received;
                if at + n > total {
                    return Err(format!(
                        "stream {}: {} bytes past the end",
                        end.rx.id,
                        at + n - total
                    ));
                }
                fill(end.rx.id, at, &mut expected[..n]);
                if scratch[..n] != expected[..n] {
                    let i = (0..n).find(|&i| scratch[i] != expected[i]).unwrap_or(0);
                    return Err(format!(
                        "stream {}: wrong byte at offset {}",
                        end.rx.id,
                        at + i
                    ));
                }
                end.rx.received += n;
                moved = true;
            }
            Err(TcpError::WouldBlock) => break,
            Err(e) => return Err(format!("recv on stream {}: {e}", end.rx.id)),
        }
    }
    Ok(moved)
}

fn tcp_config(case: &Case) -> Config {
    let mut c = Config {
        min_rto: Duration::from_millis(2),
        initial_rto: Duration::from_millis(20),
        max_rto: Duration::from_millis(500),
        time_wait: Duration::from_millis(10),
        delayed_ack: Some(Duration::from_millis(1)),
        user_timeout: Duration::from_secs(100),
        syn_retries: 30,
        ..Config::default()
    };
    if let Some(size) = case.buffer {
        c.rx_buffer = size;
        c.tx_buffer = size;
    }
    c
}

fn host(link: FaultInjector<SimLink>, case: &Case, mac: EthernetAddress, ip: Ipv4Addr) -> Host {
    let link = SoftGro::new(link, case.offload == SimOffload::Segment);
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&case.seed.to_le_bytes());
    key[8] = mac.0[5];
    Interface::new(
        link,
        InterfaceConfig {
            mac,
            ipv4: ip,
            tcp: tcp_config(case),
            isn_key: Some(key),
            ..InterfaceConfig::default()
        },
    )
}

/// What a finished run reports.
#[derive(Debug)]
struct Outcome {
    virtual_time: Instant,
    polls: u64,
    summary: String,
}

fn run(case: &Case) -> Result<Outcome, String> {
    let (la, lb) = sim::pair(SimConfig {
        latency: case.latency,
        bandwidth_bps: case.bandwidth_bps,
        offload: case.offload,
        gather: case.gather,
        ..SimConfig::default()
    });
    let faults = |seed: u64| FaultConfig {
        loss: case.loss,
        reorder: case.reorder,
        duplicate: case.duplicate,
        corrupt: case.corrupt,
        seed,
        direction: FaultDirection::Rx,
        reorder_delay: Duration::from_micros(200),
        ..FaultConfig::default()
    };
    let mut a = host(FaultInjector::new(la, faults(case.seed)), case, MAC_A, IP_A);
    let mut b = host(
        FaultInjector::new(lb, faults(case.seed ^ 0x5eed_5eed_5eed_5eed)),
        case,
        MAC_B,
        IP_B,
    );
    a.add_neighbor(IP_B, MAC_B);
    b.add_neighbor(IP_A, MAC_A);
    a.listen(7000, 4).map_err(|e| e.to_string())?;
    b.listen(7000, 4).map_err(|e| e.to_string())?;

    let now0 = Instant::ZERO;
    let stream = |id| Stream {
        id,
        ..Stream::default()
    };
    // Connection 1: A connects to B; connection 2: B connects to A. Streams 1..4.
    let mut a_ends = [
        End {
            handle: Some(
                a.connect(SocketAddrV4::new(IP_B, 7000), now0)
                    .map_err(|e| e.to_string())?,
            ),
            accept_port: None,
            tx: stream(1),
            rx: stream(2),
        },
        End {
            handle: None,
            accept_port: Some(7000),
            tx: stream(3),
            rx: stream(4),
        },
    ];
    let mut b_ends = [
        End {
            handle: None,
            accept_port: Some(7000),
            tx: stream(2),
            rx: stream(1),
        },
        End {
            handle: Some(
                b.connect(SocketAddrV4::new(IP_A, 7000), now0)
                    .map_err(|e| e.to_string())?,
            ),
            accept_port: None,
            tx: stream(4),
            rx: stream(3),
        },
    ];

    // Larger than `send_queue::SHARE_MIN`: whole writes of it are shared.
    let mut scratch = vec![0u8; 64 * 1024];
    let mut expected = vec![0u8; 64 * 1024];
    let mut now = now0;
    // Whether `now` is the instant of the previous polls.
    let mut same_instant = false;
    let deadline = now0 + case.deadline;
    let mut polls = 0u64;
    let mut idle_polls = 0u32;
    let mut last_report = now0;
    loop {
        polls += 1;
        if std::env::var("SIM_DEBUG").is_ok() && now >= last_report + Duration::from_millis(500) {
            last_report = now;
            for (name, host) in [("A", &a), ("B", &b)] {
                for h in host.handles() {
                    let c = host.conn(h).unwrap();
                    eprintln!(
                        "{now} {name} {:?} {:?} seq {:?} peer_win {} {:?}",
                        c.local(),
                        c.state(),
                        c.sequence_state(),
                        c.peer_window(),
                        c.stats()
                    );
                }
            }
        }
        // `Interface::settled` promises that a poll would find nothing to do but
        // frames arriving later (a queue's driver skips that poll on its word): checked
        // before every poll at the instant of the last one, where no frame has come due
        // since (the link's latency is not zero) and only the applications' reads and
        // writes (`pump`) happened in between.
        let mut progress = false;
        for (name, host) in [("A", &mut a), ("B", &mut b)] {
            let settled = same_instant && host.settled(now);
            let did = host.poll(now);
            if settled && did {
                return Err(format!(
                    "{name} reported settled at {now}, but the next poll did something"
                ));
            }
            progress |= did;
        }
        same_instant = true;
        for (name, host) in [("A", &mut a), ("B", &mut b)] {
            while let Some((_, err)) = host.pop_closed() {
                if let Some(err) = err {
                    return Err(format!(
                        "a connection of {name} failed at {now}: {err} ({})",
                        progress_report(&a_ends, &b_ends)
                    ));
                }
            }
        }
        for end in &mut a_ends {
            progress |= pump(&mut a, end, case.bytes, &mut scratch, &mut expected)?;
        }
        for end in &mut b_ends {
            progress |= pump(&mut b, end, case.bytes, &mut scratch, &mut expected)?;
        }
        let finished = a_ends
            .iter()
            .chain(&b_ends)
            .all(|e| e.tx.closed && e.rx.eof)
            && a.connection_count() == 0
            && b.connection_count() == 0;
        if finished {
            break;
        }
        if progress {
            idle_polls = 0;
            continue; // react at the same instant to what just happened
        }
        let next = [a.poll_at(), b.poll_at()].into_iter().flatten().min();
        let Some(next) = next else {
            return Err(format!(
                "stalled at {now}: nothing scheduled ({})",
                progress_report(&a_ends, &b_ends)
            ));
        };
        if next <= now {
            idle_polls += 1;
            if idle_polls > 10_000 {
                return Err(format!(
                    "livelock at {now}: {idle_polls} polls without progress or time passing ({})",
                    progress_report(&a_ends, &b_ends)
                ));
            }
        } else {
            idle_polls = 0;
            now = next;
            same_instant = false;
        }
        if now > deadline {
            return Err(format!(
                "virtual deadline {:?} exceeded ({})",
                case.deadline,
                progress_report(&a_ends, &b_ends)
            ));
        }
    }

    let mut offload_summary = String::new();
    let (fa, fb) = (
        a.link().inner().fault_stats(),
        b.link().inner().fault_stats(),
    );
    let (sa, sb) = (a.stats(), b.stats());
    let gathered = sa.tx_payload_gathered + sb.tx_payload_gathered;
    let (ga, gb) = (a.link().gro_stats(), b.link().gro_stats());
    if case.offload != SimOffload::None {
        let super_segments = sa.tx_super_segments + sb.tx_super_segments;
        let _ = write!(
            offload_summary,
            "super-segments sent {super_segments}, coalesced frames received {} ({} segments), large frames received {}; ",
            ga.merged_frames + gb.merged_frames,
            ga.merged_segments + gb.merged_segments,
            sa.rx_large_frames + sb.rx_large_frames,
        );
        if super_segments == 0 {
            return Err("large segments were on but none was sent".into());
        }
        let received_large = match case.offload {
            SimOffload::Segment => ga.merged_frames + gb.merged_frames,
            _ => sa.rx_large_frames + sb.rx_large_frames,
        };
        if received_large == 0 {
            return Err("large segments were on but none was received".into());
        }
    }
    let mut summary = String::new();
    let _ =
        write!(
        summary,
        "{}: {} virtual, {polls} polls; {offload_summary}payloads gathered {gathered}; faults lost {} reordered {} duplicated {} corrupted {}; \
         dropped corrupt/malformed/foreign {}",
        case.name,
        now,
        fa.lost + fb.lost,
        fa.reordered + fb.reordered,
        fa.duplicated + fb.duplicated,
        fa.corrupted + fb.corrupted,
        sa.rx_bad_checksum + sb.rx_bad_checksum + sa.rx_malformed + sb.rx_malformed
            + sa.rx_not_ours + sb.rx_not_ours + sa.rx_unsupported + sb.rx_unsupported,
    );
    // Gathering needs the link to complete checksums (without, payloads are summed as
    // they are copied).
    let gathers = case.gather && case.offload != SimOffload::None;
    if gathers && gathered == 0 {
        return Err("the link gathers but no payload was gathered".into());
    }
    if !gathers && gathered != 0 {
        return Err(format!("{gathered} payloads gathered where none should be"));
    }
    if case.corrupt > 0.0 && sa.rx_bad_checksum + sb.rx_bad_checksum == 0 {
        return Err("corruption was injected but no checksum failure was counted".into());
    }
    Ok(Outcome {
        virtual_time: now,
        polls,
        summary,
    })
}

fn progress_report(a: &[End], b: &[End]) -> String {
    a.iter()
        .chain(b)
        .map(|e| {
            format!(
                "stream {} sent {}{}, stream {} received {}{}",
                e.tx.id,
                e.tx.sent,
                if e.tx.closed { " (closed)" } else { "" },
                e.rx.id,
                e.rx.received,
                if e.rx.eof { " (EOF)" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs `cases`, each with its own seed or with `NETCHANNEL_SIM_SEED` when set, and fails
/// with every failing case's seed and configuration.
fn run_all(cases: &[Case]) {
    let forced = std::env::var("NETCHANNEL_SIM_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let mut failures = Vec::new();
    for case in cases {
        let mut case = case.clone();
        if let Some(seed) = forced {
            case.seed = seed;
        }
        match run(&case) {
            Ok(o) => {
                assert!(o.virtual_time <= Instant::ZERO + case.deadline);
                println!("ok {}", o.summary);
            }
            Err(e) => failures.push(format!(
                "case {} FAILED: {e}\n  replay: NETCHANNEL_SIM_SEED={} (config {case:?})",
                case.name, case.seed
            )),
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

const MB: usize = 1024 * 1024;
const SMALL_BUFFER: usize = 4 * 1024;

#[test]
fn lossless_both_buffer_sizes() {
    run_all(&[
        Case::new("clean/default-buffers/4MB", 1, 4 * MB),
        Case {
            buffer: Some(SMALL_BUFFER),
            ..Case::new("clean/4KiB-buffers/1MB", 2, MB)
        },
    ]);
}

#[test]
fn loss_grid() {
    let mut cases = Vec::new();
    for (loss, bytes, name, small) in [
        (0.01, 4 * MB, "loss1%/default/4MB", false),
        (0.01, MB, "loss1%/4KiB/1MB", true),
        (0.05, 2 * MB, "loss5%/default/2MB", false),
        (0.05, MB, "loss5%/4KiB/1MB", true),
        (0.20, MB, "loss20%/default/1MB", false),
        (0.20, MB / 2, "loss20%/4KiB/512KB", true),
    ] {
        cases.push(Case {
            loss,
            buffer: small.then_some(SMALL_BUFFER),
            ..Case::new(name, 10 + cases.len() as u64, bytes)
        });
    }
    run_all(&cases);
}

#[test]
fn reordering_duplication_corruption() {
    run_all(&[
        Case {
            reorder: 0.05,
            ..Case::new("reorder5%/default/2MB", 20, 2 * MB)
        },
        Case {
            duplicate: 0.05,
            ..Case::new("dup5%/default/2MB", 21, 2 * MB)
        },
        Case {
            corrupt: 0.05,
            ..Case::new("corrupt5%/default/1MB", 22, MB)
        },
        Case {
            reorder: 0.05,
            duplicate: 0.05,
            corrupt: 0.02,
            buffer: Some(SMALL_BUFFER),
            ..Case::new("reorder+dup+corrupt/4KiB/512KB", 23, MB / 2)
        },
    ]);
}

#[test]
fn everything_at_once() {
    run_all(&[Case {
        loss: 0.02,
        reorder: 0.02,
        duplicate: 0.02,
        corrupt: 0.02,
        ..Case::new("all-faults/default/1MB", 30, MB)
    }]);
}

#[test]
fn runs_are_deterministic_per_seed() {
    let case = Case {
        loss: 0.05,
        reorder: 0.05,
        ..Case::new("determinism", 40, 256 * 1024)
    };
    let one = run(&case).unwrap();
    let two = run(&case).unwrap();
    assert_eq!((one.virtual_time, one.polls), (two.virtual_time, two.polls));
    assert_eq!(one.summary, two.summary);
}

#[test]
fn the_harness_reports_a_stall_with_its_seed() {
    let case = Case {
        loss: 1.0,
        deadline: Duration::from_secs(2),
        ..Case::new("black-hole", 50, 1024)
    };
    let err = run(&case).unwrap_err();
    assert!(err.contains("deadline"), "{err}");
}

/// The grid again with super-segments cut on the wire and coalesced at the receiver, and
/// one case with super-segments carried whole (see the module documentation).
#[test]
fn large_segments_under_loss_reordering_duplication_and_corruption() {
    // 40 Gbit/s: several wire segments land in each microsecond of virtual time, so the
    // receiver's batches hold runs to coalesce (at 1 Gbit/s it polls each one alone).
    let large = |case: Case| Case {
        offload: SimOffload::Segment,
        bandwidth_bps: Some(40_000_000_000),
        ..case
    };
    run_all(&[
        large(Case::new("large/clean/default/4MB", 60, 4 * MB)),
        large(Case {
            loss: 0.01,
            ..Case::new("large/loss1%/default/4MB", 61, 4 * MB)
        }),
        large(Case {
            loss: 0.05,
            ..Case::new("large/loss5%/default/2MB", 62, 2 * MB)
        }),
        large(Case {
            loss: 0.20,
            ..Case::new("large/loss20%/default/1MB", 63, MB)
        }),
        large(Case {
            reorder: 0.05,
            duplicate: 0.05,
            ..Case::new("large/reorder+dup/default/2MB", 64, 2 * MB)
        }),
        large(Case {
            corrupt: 0.05,
            ..Case::new("large/corrupt5%/default/1MB", 65, MB)
        }),
        large(Case {
            loss: 0.02,
            reorder: 0.02,
            duplicate: 0.02,
            corrupt: 0.02,
            ..Case::new("large/all-faults/default/1MB", 66, MB)
        }),
        large(Case {
            loss: 0.05,
            buffer: Some(SMALL_BUFFER),
            ..Case::new("large/loss5%/4KiB/512KB", 67, MB / 2)
        }),
        Case {
            offload: SimOffload::Whole,
            loss: 0.02,
            reorder: 0.02,
            ..Case::new("whole/loss2%+reorder2%/default/2MB", 68, 2 * MB)
        },
    ]);
}

/// Payloads in shared buffers handed to a gathering link as slices (every other write is
/// shared, so shared and copied pieces meet inside segments and super-segments) under
/// loss, reordering, duplication and corruption: with super-segments cut on the wire and
/// carried whole; and without offloads, where nothing is gathered (the payload is summed
/// in the pass that copies it).
#[test]
fn gathered_payloads_under_loss_reordering_duplication_and_corruption() {
    let gathered = |case: Case| Case {
        gather: true,
        bandwidth_bps: Some(40_000_000_000),
        ..case
    };
    run_all(&[
        gathered(Case {
            offload: SimOffload::Segment,
            loss: 0.02,
            reorder: 0.02,
            duplicate: 0.02,
            corrupt: 0.02,
            ..Case::new("gather/segment/all-faults/default/2MB", 70, 2 * MB)
        }),
        gathered(Case {
            offload: SimOffload::Whole,
            loss: 0.02,
            reorder: 0.02,
            ..Case::new("gather/whole/loss2%+reorder2%/default/2MB", 71, 2 * MB)
        }),
        gathered(Case {
            loss: 0.02,
            corrupt: 0.02,
            ..Case::new("gather/no-offload/loss2%+corrupt2%/default/1MB", 72, MB)
        }),
        gathered(Case {
            offload: SimOffload::Segment,
            loss: 0.05,
            // Just over two shared writes' worth (`SHARE_MIN` is 16 KiB): the queue is
            // full most of the time and shared runs are cut by its edges.
            buffer: Some(40 * 1024),
            ..Case::new("gather/segment/loss5%/40KiB/512KB", 73, MB / 2)
        }),
    ]);
}
