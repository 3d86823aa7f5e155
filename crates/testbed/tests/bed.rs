//! Privileged tests of the test bed. They skip with a printed reason without root, and fail
//! instead when `NETCHANNEL_REQUIRE_XDP=1`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use testbed::{testbed_or_skip, Side, TestBed, TestBedBuilder};

fn bed(builder: TestBedBuilder) -> Option<TestBed> {
    testbed_or_skip(builder)
}

/// The names `ip netns list` shows.
fn netns_list() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(out.status.success(), "ip netns list: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

fn names(bed: &TestBed) -> [String; 2] {
    Side::BOTH.map(|s| bed.side(s).netns.clone())
}

fn assert_gone(names: &[String]) {
    let list = netns_list();
    for n in names {
        assert!(!list.contains(n), "namespace {n} is still listed: {list:?}");
    }
}

fn ping(bed: &TestBed, from: Side, extra: &[&str]) -> std::process::Output {
    let to = bed.side(from.peer()).ipv4.to_string();
    bed.command_in(from, "ping")
        .args(["-c1", "-W1"])
        .args(extra)
        .arg(&to)
        .output()
        .expect("ping runs (package iputils-ping)")
}

#[test]
fn endpoints_describe_the_bed() {
    let Some(bed) = bed(TestBed::builder()) else {
        return;
    };
    let (a, b) = (bed.side(Side::A), bed.side(Side::B));
    assert_eq!(a.ipv4, Ipv4Addr::new(10, 77, 0, 1));
    assert_eq!(b.ipv4, Ipv4Addr::new(10, 77, 0, 2));
    assert_eq!((a.ifname.as_str(), b.ifname.as_str()), ("vA", "vB"));
    assert_eq!(a.netns, format!("{}-a", bed.id()));
    assert_eq!(b.netns, format!("{}-b", bed.id()));
    assert_ne!(a.mac, b.mac);
    for side in Side::BOTH {
        let ep = bed.side(side);
        // The kernel's own view of the interface, from inside the namespace.
        let sys = |file: &str| {
            bed.output_in(
                side,
                "cat",
                &[&format!("/sys/class/net/{}/{file}", ep.ifname)],
            )
            .unwrap()
            .trim()
            .to_owned()
        };
        assert_eq!(sys("ifindex"), ep.ifindex.to_string());
        let mac = ep.mac.map(|b| format!("{b:02x}")).join(":");
        assert_eq!(sys("address"), mac);
        assert_eq!(sys("operstate"), "up");
        let addrs = bed
            .output_in(side, "ip", &["-o", "-4", "addr", "show", "dev", &ep.ifname])
            .unwrap();
        assert!(addrs.contains(&format!("{}/24", ep.ipv4)), "{addrs}");
        // IPv6 is off by default.
        let v6 = bed
            .output_in(side, "ip", &["-o", "-6", "addr", "show"])
            .unwrap();
        assert!(v6.trim().is_empty(), "IPv6 addresses present: {v6}");
    }
}

#[test]
fn kernel_ping_works_both_ways() {
    let Some(bed) = bed(TestBed::builder()) else {
        return;
    };
    for from in Side::BOTH {
        let out = ping(&bed, from, &[]);
        assert!(out.status.success(), "ping from {from}: {out:?}");
    }
}

#[test]
fn kernel_tcp_moves_one_megabyte() {
    let Some(bed) = bed(TestBed::builder().queues(2)) else {
        return;
    };
    let b_ip = bed.side(Side::B).ipv4;
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = bed
        .spawn_thread_in(Side::B, move || {
            let listener = TcpListener::bind((b_ip, 0)).unwrap();
            ready_tx.send(listener.local_addr().unwrap()).unwrap();
            let (mut conn, peer) = listener.accept().unwrap();
            let mut got = Vec::new();
            conn.read_to_end(&mut got).unwrap();
            (got, peer)
        })
        .unwrap();
    let addr: SocketAddr = ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let sent = data.clone();
    let local = bed
        .run_in(Side::A, move || {
            let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
            conn.write_all(&sent).unwrap();
            conn.local_addr().unwrap()
        })
        .unwrap();
    let (got, peer) = server.join().unwrap();
    assert_eq!(peer, local);
    assert_eq!(peer.ip(), bed.side(Side::A).ipv4);
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the bytes differ");
}

#[test]
fn run_in_enters_the_namespace_and_returns() {
    let Some(bed) = bed(TestBed::builder()) else {
        return;
    };
    let a = bed.side(Side::A).clone();
    let inside = bed
        .run_in(Side::A, || {
            let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
            let bound = TcpListener::bind((a.ipv4, 0)).is_ok();
            (dev.contains(&format!("{}:", a.ifname)), bound)
        })
        .unwrap();
    assert_eq!(inside, (true, true));
    // The calling thread stayed outside: the bed's address does not exist here.
    assert!(TcpListener::bind((a.ipv4, 0)).is_err());
    let here = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
    assert!(!here.contains("vA:"));
}

#[test]
fn queues_are_configured() {
    let n = 4;
    let Some(bed) = bed(TestBed::builder().queues(n)) else {
        return;
    };
    assert_eq!(bed.queues(), n);
    for side in Side::BOTH {
        let ifname = &bed.side(side).ifname;
        let channels = bed.output_in(side, "ethtool", &["-l", ifname]).unwrap();
        let current = channels
            .split("Current hardware settings:")
            .nth(1)
            .unwrap_or_else(|| panic!("no current settings in {channels}"));
        for key in ["RX:", "TX:"] {
            let value = current
                .lines()
                .find_map(|l| l.trim().strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in {channels}"));
            assert_eq!(value.trim(), n.to_string(), "{key} of {ifname}: {channels}");
        }
        let queues = bed
            .output_in(side, "ls", &[&format!("/sys/class/net/{ifname}/queues")])
            .unwrap();
        let count = |p: &str| {
            queues
                .split_whitespace()
                .filter(|q| q.starts_with(p))
                .count()
        };
        assert_eq!(
            (count("rx-"), count("tx-")),
            (n as usize, n as usize),
            "{queues}"
        );
    }
}

#[test]
fn mtu_is_applied_end_to_end() {
    let Some(bed) = bed(TestBed::builder().mtu(9000)) else {
        return;
    };
    assert_eq!(bed.mtu(), 9000);
    for side in Side::BOTH {
        let mtu = bed
            .output_in(
                side,
                "cat",
                &[&format!("/sys/class/net/{}/mtu", bed.side(side).ifname)],
            )
            .unwrap();
        assert_eq!(mtu.trim(), "9000");
    }
    // 8972 bytes of ICMP payload + 28 of headers = 9000, not fragmented.
    let out = ping(&bed, Side::A, &["-M", "do", "-s", "8972"]);
    assert!(out.status.success(), "{out:?}");
    // One byte more does not fit.
    let out = ping(&bed, Side::A, &["-M", "do", "-s", "8973"]);
    assert!(!out.status.success(), "{out:?}");
}

#[test]
fn other_subnet() {
    let Some(bed) = bed(TestBed::builder().subnet(Ipv4Addr::new(10, 77, 9, 0), 24)) else {
        return;
    };
    assert_eq!(bed.side(Side::A).ipv4, Ipv4Addr::new(10, 77, 9, 1));
    assert_eq!(bed.side(Side::B).ipv4, Ipv4Addr::new(10, 77, 9, 2));
    assert!(ping(&bed, Side::A, &[]).status.success());
}

#[test]
fn drop_removes_namespaces_and_processes() {
    let Some(bed) = bed(TestBed::builder().queues(2)) else {
        return;
    };
    let names = names(&bed);
    let listed = netns_list();
    for n in &names {
        assert!(listed.contains(n), "{n} not in {listed:?}");
    }
    // A process left running inside namespace B is killed by the drop. It says "ready"
    // once it runs inside the namespace (`spawn` returns while `ip netns exec` may not
    // have entered it yet), then becomes `sleep` with the same pid.
    let mut child = bed
        .command_in(Side::B, "sh")
        .args(["-c", "echo ready; exec sleep 600"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = [0u8; 6];
    child.stdout.take().unwrap().read_exact(&mut ready).unwrap();
    assert_eq!(&ready, b"ready\n");
    let pids = bed.output_in(
        Side::B,
        "ip",
        &["netns", "identify", &child.id().to_string()],
    );
    // `ip netns exec` execs the program, so the child's pid is the process inside.
    assert_eq!(pids.unwrap().trim(), names[1]);
    drop(bed);
    assert_gone(&names);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the process in the namespace survived the drop");
        }
        std::thread::yield_now();
    };
    assert!(!status.success());
}

#[test]
fn drop_after_panic_removes_namespaces() {
    let mut seen = Vec::new();
    let result = catch_unwind(AssertUnwindSafe(|| {
        let Some(bed) = bed(TestBed::builder()) else {
            return;
        };
        seen.extend(names(&bed));
        let _ = bed.run_in(Side::A, || panic!("boom inside namespace A"));
        unreachable!("run_in resumes the panic");
    }));
    if seen.is_empty() {
        return; // skipped
    }
    let payload = result.expect_err("the panic propagates out of run_in");
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"boom inside namespace A")
    );
    assert_gone(&seen);
}

#[test]
fn two_beds_at_once_do_not_collide() {
    let Some(one) = bed(TestBed::builder().queues(2)) else {
        return;
    };
    let Some(two) = bed(TestBed::builder().queues(3)) else {
        return;
    };
    let (n1, n2) = (names(&one), names(&two));
    assert!(n1.iter().all(|n| !n2.contains(n)), "{n1:?} {n2:?}");
    assert_ne!(one.id(), two.id());
    // Both work, with the same addresses, each in isolation.
    assert_eq!(one.side(Side::B).ipv4, two.side(Side::B).ipv4);
    assert!(ping(&one, Side::A, &[]).status.success());
    assert!(ping(&two, Side::B, &[]).status.success());
    let q = two
        .output_in(Side::A, "ls", &["/sys/class/net/vA/queues"])
        .unwrap();
    assert_eq!(
        q.split_whitespace()
            .filter(|q| q.starts_with("rx-"))
            .count(),
        3
    );
    drop(one);
    assert_gone(&n1);
    // The second bed is unaffected by the first one's removal.
    assert!(netns_list().contains(&n2[0]));
    assert!(ping(&two, Side::A, &[]).status.success());
    drop(two);
    assert_gone(&n2);
}

#[test]
fn stale_namespaces_of_dead_processes_are_removed() {
    // Need privileges: let the bed decide whether to run or skip.
    let Some(bed) = bed(TestBed::builder()) else {
        return;
    };
    // A pid that existed and no longer does.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = format!("nctb-{dead}-0-a");
    let out = Command::new("ip")
        .args(["netns", "add", &stale])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // Removes the stale namespace even if an assertion below fails.
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = Command::new("ip")
                .args(["netns", "delete", &self.0])
                .output();
        }
    }
    let _cleanup = Cleanup(stale.clone());
    // Other tests' builds clean up stale namespaces too, so this one may be gone already
    // (removed by the same function); either way it must be gone afterwards.
    TestBed::cleanup_stale().unwrap();
    assert_gone(&[stale]);
    // A live bed (this process's) is left alone.
    let list = netns_list();
    assert!(names(&bed).iter().all(|n| list.contains(n)), "{list:?}");
}

/// `ethtool -k` of one side's interface: the line for `feature`.
fn feature_line(bed: &TestBed, side: Side, feature: &str) -> String {
    let ifname = bed.side(side).ifname.clone();
    let out = bed.output_in(side, "ethtool", &["-k", &ifname]).unwrap();
    out.lines()
        .find(|l| l.trim_start().starts_with(feature))
        .unwrap_or_else(|| panic!("no {feature} in ethtool -k output: {out}"))
        .trim()
        .to_owned()
}

#[test]
fn tx_checksum_offload_is_on_by_default_and_can_be_switched_off() {
    let Some(on) = bed(TestBed::builder()) else {
        return;
    };
    for side in Side::BOTH {
        assert_eq!(
            feature_line(&on, side, "tx-checksumming:"),
            "tx-checksumming: on",
            "{side}"
        );
    }
    drop(on);
    let Some(off) = bed(TestBed::builder().tx_checksum_offload(false)) else {
        return;
    };
    for side in Side::BOTH {
        assert_eq!(
            feature_line(&off, side, "tx-checksumming:"),
            "tx-checksumming: off",
            "{side}"
        );
        // TSO of TCP over IPv4 depends on tx checksumming: no super-MTU frames. (The
        // summary line "tcp-segmentation-offload" may stay "on" for other variants.)
        let tso = feature_line(&off, side, "tx-tcp-segmentation:");
        assert!(tso.starts_with("tx-tcp-segmentation: off"), "{side}: {tso}");
    }
}

/// A 40-byte key and a 128-entry table over `queues` queues.
fn rss_tables(queues: u32) -> (testbed::RssTable, testbed::RssTable) {
    let key_b: Vec<u8> = (0u8..40).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let key_a: Vec<u8> = key_b.iter().rev().copied().collect();
    (
        testbed::RssTable::spread(&key_a, 128, queues).unwrap(),
        testbed::RssTable::spread(&key_b, 128, queues).unwrap(),
    )
}

#[test]
fn rss_bed_carries_kernel_traffic_and_counts_its_queues() {
    let (nic_a, nic_b) = rss_tables(4);
    let Some(bed) = bed(TestBed::builder()
        .queues(4)
        .rss(nic_a.clone(), nic_b.clone()))
    else {
        return;
    };
    let middle = bed
        .middle_netns()
        .expect("an RSS bed has a middle")
        .to_owned();
    assert_eq!(middle, format!("{}-m", bed.id()));
    assert!(netns_list().contains(&middle));
    assert_eq!(bed.rss_table(Side::A), Some(&nic_a));
    assert_eq!(bed.rss_table(Side::B), Some(&nic_b));
    // The stacks' ends are the plain bed's: names, addresses, queues.
    assert_eq!(bed.side(Side::A).ifname, "vA");
    assert_eq!(bed.side(Side::B).ipv4, Ipv4Addr::new(10, 77, 0, 2));
    for side in Side::BOTH {
        let out = bed
            .output_in(side, "ethtool", &["-l", &bed.side(side).ifname])
            .unwrap();
        assert!(out.matches("RX:\t\t4").count() >= 1, "{out}");
    }
    assert!(ping(&bed, Side::A, &[]).status.success());
    assert!(ping(&bed, Side::B, &[]).status.success());

    // One megabyte of kernel TCP, A to B, through the relay.
    let b_ip = bed.side(Side::B).ipv4;
    let (tx, rx) = mpsc::channel();
    let server = bed
        .spawn_thread_in(Side::B, move || {
            let l = TcpListener::bind((b_ip, 0)).unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            got
        })
        .unwrap();
    let addr: SocketAddr = rx.recv().unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let sent = data.clone();
    bed.run_in(Side::A, move || {
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        c.write_all(&sent).unwrap();
    })
    .unwrap();
    assert_eq!(server.join().unwrap(), data);

    let relay = bed.relay().unwrap();
    let c = relay.counters().unwrap();
    assert!(c.tcp_hashed > 0, "{c:?}");
    assert!(c.unhashed > 0, "ARP is not hashed: {c:?}");
    assert_eq!(c.no_route, 0, "{c:?}");
    let toward_b: u64 = relay
        .queue_counts(testbed::RelayEnd::B, 4)
        .unwrap()
        .iter()
        .sum();
    let toward_a: u64 = relay
        .queue_counts(testbed::RelayEnd::A, 4)
        .unwrap()
        .iter()
        .sum();
    assert_eq!(toward_a + toward_b, c.tcp_hashed + c.ip_hashed + c.unhashed);
    assert!(toward_b > 0 && toward_a > 0);
}

#[test]
fn rss_bed_is_removed_on_drop_and_after_a_panic() {
    let (nic_a, nic_b) = rss_tables(2);
    let Some(bed) = bed(TestBed::builder()
        .queues(2)
        .rss(nic_a.clone(), nic_b.clone()))
    else {
        return;
    };
    let mut all = names(&bed).to_vec();
    all.push(bed.middle_netns().unwrap().to_owned());
    drop(bed);
    assert_gone(&all);

    let mut all = Vec::new();
    let result = catch_unwind(AssertUnwindSafe(|| {
        let bed = TestBed::builder()
            .queues(2)
            .rss(nic_a, nic_b)
            .build()
            .unwrap();
        all = names(&bed).to_vec();
        all.push(bed.middle_netns().unwrap().to_owned());
        panic!("a failing test");
    }));
    assert!(result.is_err());
    assert_eq!(all.len(), 3);
    assert_gone(&all);
}

#[test]
fn rss_tables_must_fit_the_queues() {
    let (nic_a, nic_b) = rss_tables(4);
    let e = TestBed::builder()
        .queues(2)
        .rss(nic_a, nic_b)
        .build()
        .unwrap_err();
    assert!(
        matches!(e, testbed::TestBedError::InvalidConfig(ref m) if m.contains("queue 2")),
        "{e}"
    );
}
