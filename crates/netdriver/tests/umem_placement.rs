//! Privileged tests of where an AF_XDP link's UMEM lives: the NUMA node and huge pages
//! (`netdriver::link::umem_memory`), on the veth test bed.
//!
//! They need root. Without it each test prints why it skips, unless
//! `NETCHANNEL_REQUIRE_XDP=1`, which turns the skip into a failure (CI). One test reserves
//! a few huge pages (`vm.nr_hugepages`) for its run and restores the previous count after,
//! even when it fails.
#![cfg(target_os = "linux")]

use netdriver::link::umem_memory::{
    huge_pages_free, interface_numa_node, thread_policy_mode, HugePages, HugePagesRefusal, NumaNode,
};
use netdriver::link::xdp::{XdpLink, XdpLinkConfig, XdpLinkError};
use testbed::{testbed_or_skip, Side, TestBed};

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Held by the tests whose links may take huge pages, so that one does not take those
/// another reserved for itself.
static HUGE_POOL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn huge_pool() -> std::sync::MutexGuard<'static, ()> {
    HUGE_POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The default placement on veth: no node (veth has no device), and huge pages exactly
/// when the pool has enough free for the 8 MiB UMEM.
#[test]
fn default_placement_on_veth() {
    let _pool = huge_pool();
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let ifname = bed.side(Side::A).ifname.clone();
    bed.run_in(Side::A, move || {
        assert_eq!(interface_numa_node(&ifname), None, "veth has no NUMA node");
        let config = XdpLinkConfig::new(&ifname, 0);
        assert_eq!(config.numa_node, NumaNode::Interface);
        assert_eq!(config.huge_pages, HugePages::Auto);
        let free_before = huge_pages_free();
        let link = XdpLink::open(config).unwrap();
        let p = link.umem_placement();
        assert_eq!(p.bytes, 4096 * 2048);
        assert_eq!(p.node, None);
        match free_before {
            Some((size, free)) if free as usize * size >= p.bytes && p.bytes % size == 0 => {
                assert!(p.huge_pages, "{p:?}");
            }
            Some((size, free)) if p.bytes % size == 0 => {
                assert!(!p.huge_pages);
                assert_eq!(
                    p.huge_pages_refused,
                    Some(HugePagesRefusal::TooFewFree {
                        needed: (p.bytes / size) as u64,
                        free
                    })
                );
            }
            _ => assert!(!p.huge_pages),
        }
    })
    .unwrap();
}

/// A UMEM placed on node 0 has every page there, and the opening thread's memory policy
/// is what it was; a node the machine lacks is a typed error.
#[test]
fn umem_on_a_chosen_node() {
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let ifname = bed.side(Side::A).ifname.clone();
    bed.run_in(Side::A, move || {
        let policy_before = thread_policy_mode().unwrap();
        let mut config = XdpLinkConfig::new(&ifname, 0);
        config.numa_node = NumaNode::Node(0);
        config.huge_pages = HugePages::Off;
        let link = XdpLink::open(config).unwrap();
        assert_eq!(thread_policy_mode().unwrap(), policy_before);
        let p = link.umem_placement();
        assert_eq!((p.node, p.huge_pages), (Some(0), false));
        let nodes = link.umem_page_nodes().unwrap();
        assert_eq!(nodes.len(), p.bytes / 4096);
        assert!(nodes.iter().all(|&n| n == 0), "pages off node 0: {nodes:?}");
        drop(link);

        let mut config = XdpLinkConfig::new(&ifname, 0);
        config.numa_node = NumaNode::Node(999);
        let err = XdpLink::open(config).unwrap_err();
        assert!(
            matches!(err, XdpLinkError::NumaNode { node: 999, .. }),
            "{err}"
        );
        assert_eq!(thread_policy_mode().unwrap(), policy_before);
    })
    .unwrap();
}

/// Restores `vm.nr_hugepages` when dropped.
struct HugePoolGuard {
    before: String,
}

impl Drop for HugePoolGuard {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(NR_HUGEPAGES, &self.before) {
            eprintln!("restoring {NR_HUGEPAGES} to {}: {e}", self.before.trim());
        }
    }
}

/// With a pool of huge pages the UMEM takes them (4 of 2 MiB for 8 MiB); required and
/// unavailable is a typed error; a UMEM that is not a whole number of huge pages falls
/// back with that reason.
#[test]
fn huge_pages_when_reserved() {
    let _pool = huge_pool();
    let Some(bed) = testbed_or_skip(TestBed::builder()) else {
        return;
    };
    let ifname = bed.side(Side::A).ifname.clone();
    // A UMEM of 64 frames (128 KiB) is no whole number of huge pages.
    bed.run_in(Side::A, {
        let ifname = ifname.clone();
        move || {
            let mut small = XdpLinkConfig::new(&ifname, 0);
            small.frame_count = 64;
            let p = XdpLink::open(small).unwrap().umem_placement();
            assert!(!p.huge_pages);
            assert!(
                matches!(
                    p.huge_pages_refused,
                    Some(HugePagesRefusal::NotAMultiple { .. })
                ),
                "{p:?}"
            );
        }
    })
    .unwrap();

    let before = std::fs::read_to_string(NR_HUGEPAGES).unwrap();
    let count: u64 = before.trim().parse().unwrap();
    let (size, free) = huge_pages_free().unwrap();
    let needed = (4096 * 2048 / size) as u64;
    if free < needed {
        // Required and unavailable.
        bed.run_in(Side::A, {
            let ifname = ifname.clone();
            move || {
                let mut c = XdpLinkConfig::new(&ifname, 0);
                c.huge_pages = HugePages::Require;
                let err = XdpLink::open(c).unwrap_err();
                assert!(
                    matches!(
                        err,
                        XdpLinkError::HugePages {
                            reason: HugePagesRefusal::TooFewFree { .. },
                            ..
                        }
                    ),
                    "{err}"
                );
            }
        })
        .unwrap();
    }
    let _guard = HugePoolGuard { before };
    std::fs::write(NR_HUGEPAGES, (count + needed).to_string()).unwrap();
    let (_, free) = huge_pages_free().unwrap();
    if free < needed {
        // The kernel found no contiguous memory for them: nothing to test with.
        eprintln!("note: the kernel reserved too few huge pages ({free} free)");
        return;
    }
    bed.run_in(Side::A, move || {
        let mut c = XdpLinkConfig::new(&ifname, 0);
        c.huge_pages = HugePages::Require;
        let link = XdpLink::open(c).unwrap();
        let p = link.umem_placement();
        assert!(p.huge_pages, "{p:?}");
        assert_eq!(p.huge_pages_refused, None);
        let (_, free_now) = huge_pages_free().unwrap();
        assert!(
            free_now + needed <= free,
            "{free} free before, {free_now} after"
        );
        assert_eq!(link.umem_page_nodes().unwrap().len() as u64, needed);
        drop(link);
        // The kernel releases a closed socket's UMEM from a work queue.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while huge_pages_free().unwrap().1 < free && std::time::Instant::now() < end {
            std::thread::yield_now();
        }
        let (_, free_after) = huge_pages_free().unwrap();
        assert_eq!(
            free_after, free,
            "the UMEM's huge pages went back to the pool"
        );
    })
    .unwrap();
}
