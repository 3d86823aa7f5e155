//! Where a UMEM's memory lives: the NIC's NUMA node, and huge pages (Linux only).
//!
//! A NIC DMAs into the UMEM, so its pages belong on the NIC's NUMA node; an 8 MiB UMEM in
//! 4 KiB pages costs 2048 TLB entries, in 2 MiB pages four. [`XdpLinkConfig`]'s
//! [`numa_node`](super::xdp::XdpLinkConfig::numa_node) and
//! [`huge_pages`](super::xdp::XdpLinkConfig::huge_pages) choose; the defaults place the
//! UMEM on the interface's node when the kernel names one ([`interface_numa_node`]) and
//! use huge pages when enough are free, falling back to normal pages (logged) otherwise.
//! [`XdpLink::umem_placement`](super::xdp::XdpLink::umem_placement) says what happened.
//!
//! # How
//!
//! The UMEM is mapped with `MAP_POPULATE`, so every page is allocated inside the `mmap`
//! call by the calling thread; [`PreferNode`] sets the thread's memory policy to
//! `MPOL_PREFERRED` for the node around that call and restores the previous policy
//! after (the kernel registers the pages with the socket, pinned, right after: they
//! never move). Huge pages come from the kernel's `hugetlbfs` pool (`MAP_HUGETLB`, the
//! default huge page size): reserve them with `sysctl vm.nr_hugepages=N`, per node with
//! `/sys/devices/system/node/nodeK/hugepages/hugepages-2048kB/nr_hugepages`.
//!
//! [`XdpLinkConfig`]: super::xdp::XdpLinkConfig

use std::io;
use std::path::Path;

use tracing::debug;

/// The NUMA node a UMEM is placed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NumaNode {
    /// The interface's node, when the kernel names one ([`interface_numa_node`]); no
    /// policy otherwise (veth, single-node machines without a `numa_node` file).
    #[default]
    Interface,
    /// This node; opening fails when it does not exist.
    Node(u32),
    /// No policy: wherever the calling thread's policy puts it.
    Any,
}

/// Whether a UMEM uses huge pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HugePages {
    /// Huge pages when the pool has enough free and the UMEM is a whole number of them;
    /// normal pages otherwise (logged, and kept in the link's placement).
    #[default]
    Auto,
    /// Normal pages.
    Off,
    /// Huge pages, or opening fails.
    Require,
}

/// Where an open link's UMEM lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UmemPlacement {
    /// Bytes mapped (the frames; rounded up to whole huge pages with huge pages).
    pub bytes: usize,
    /// The node the pages were preferred on, if a policy was set.
    pub node: Option<u32>,
    /// Whether the UMEM is in huge pages.
    pub huge_pages: bool,
    /// With [`HugePages::Auto`], why normal pages were used instead.
    pub huge_pages_refused: Option<HugePagesRefusal>,
}

/// Why [`HugePages::Auto`] used normal pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HugePagesRefusal {
    /// The pool has fewer free huge pages than the UMEM needs (none reserved, usually).
    TooFewFree {
        /// Huge pages needed.
        needed: u64,
        /// Huge pages free.
        free: u64,
    },
    /// The UMEM is not a whole number of huge pages (it would be unmapped wrongly).
    NotAMultiple {
        /// The huge page size in bytes.
        huge_page: usize,
    },
    /// The kernel refused the mapping (the pool ran out meanwhile, or a node policy).
    Mapping {
        /// The kernel's error.
        errno: i32,
    },
}

impl std::fmt::Display for HugePagesRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HugePagesRefusal::TooFewFree { needed, free } => write!(
                f,
                "{free} huge pages free, {needed} needed (reserve some: sysctl vm.nr_hugepages)"
            ),
            HugePagesRefusal::NotAMultiple { huge_page } => write!(
                f,
                "the UMEM is not a multiple of the {} KiB huge page",
                huge_page / 1024
            ),
            HugePagesRefusal::Mapping { errno } => write!(
                f,
                "mmap(MAP_HUGETLB) failed: {}",
                io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

/// The NUMA node of `ifname`'s device, or `None` when the kernel names none (virtual
/// devices such as veth, machines without NUMA). Reads
/// `/sys/class/net/IFNAME/device/numa_node`; when that file is not visible (a thread that
/// entered another network namespace sees its mount's `/sys`), the PCI device's
/// `numa_node` found through the bus address `ETHTOOL_GDRVINFO` gives.
pub fn interface_numa_node(ifname: &str) -> Option<u32> {
    if ifname.is_empty() || ifname.contains('/') || ifname.starts_with('.') {
        return None;
    }
    let by_name = Path::new("/sys/class/net")
        .join(ifname)
        .join("device/numa_node");
    if let Some(node) = read_node(&by_name) {
        return node;
    }
    let info = crate::rss::driver_info(ifname).ok()?;
    let bus = info.bus_info;
    if bus.is_empty() || bus.contains('/') || bus.starts_with('.') {
        return None;
    }
    read_node(
        &Path::new("/sys/bus/pci/devices")
            .join(bus)
            .join("numa_node"),
    )
    .flatten()
}

/// `Some(node)` from a `numa_node` file (`None` inside for `-1`), `None` when unreadable.
fn read_node(path: &Path) -> Option<Option<u32>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(parse_numa_node(&text))
}

/// The contents of a `numa_node` file: a node number, or `-1` for none.
pub fn parse_numa_node(text: &str) -> Option<u32> {
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// The CPUs of NUMA node `node` (`/sys/devices/system/node/nodeN/cpulist`), for pinning
/// a queue's runtime beside its NIC.
pub fn node_cpus(node: u32) -> io::Result<Vec<usize>> {
    let text = std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/cpulist"))?;
    parse_cpu_list(&text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("cpulist {text:?}")))
}

/// A kernel CPU list (`0-3,8,10-11`).
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi): (usize, usize) = (lo.parse().ok()?, hi.parse().ok()?);
                if lo > hi || hi - lo > 1 << 16 {
                    return None;
                }
                cpus.extend(lo..=hi);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// The default huge page size and the free pages of its pool, from `/proc/meminfo`.
pub fn huge_pages_free() -> Option<(usize, u64)> {
    parse_meminfo_huge(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `(Hugepagesize in bytes, HugePages_Free)` from `/proc/meminfo` text.
pub fn parse_meminfo_huge(text: &str) -> Option<(usize, u64)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let size_kb = field("Hugepagesize:")?;
    let free = field("HugePages_Free:")?;
    Some((usize::try_from(size_kb).ok()?.checked_mul(1024)?, free))
}

/// `MPOL_DEFAULT`, `MPOL_PREFERRED` of `<linux/mempolicy.h>`.
const MPOL_DEFAULT: i32 = 0;
const MPOL_PREFERRED: i32 = 1;
/// Bits of the node masks passed to the kernel (at least its `MAX_NUMNODES`).
const MASK_BITS: usize = 1024;
const MASK_WORDS: usize = MASK_BITS / 64;

/// The calling thread's memory policy set to prefer one node until dropped, when the
/// previous one is restored.
#[derive(Debug)]
pub struct PreferNode {
    mode: i32,
    mask: [u64; MASK_WORDS],
}

impl PreferNode {
    /// Prefers `node` for the calling thread's allocations. `Ok(None)` when the kernel
    /// has no NUMA support (`ENOSYS`): there is nothing to place.
    pub fn set(node: u32) -> io::Result<Option<PreferNode>> {
        if node as usize >= MASK_BITS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("NUMA node {node} is beyond {MASK_BITS}"),
            ));
        }
        let mut old = PreferNode {
            mode: MPOL_DEFAULT,
            mask: [0; MASK_WORDS],
        };
        // SAFETY: get_mempolicy(2) writes one int to `mode` and MASK_BITS bits to `mask`,
        // both of which live across the call; no address is queried.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_get_mempolicy,
                &mut old.mode as *mut i32,
                old.mask.as_mut_ptr(),
                MASK_BITS as libc::c_ulong + 1,
                std::ptr::null_mut::<libc::c_void>(),
                0 as libc::c_ulong,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOSYS) => Ok(None),
                _ => Err(e),
            };
        }
        let mut mask = [0u64; MASK_WORDS];
        mask[node as usize / 64] |= 1 << (node % 64);
        set_policy(MPOL_PREFERRED, &mask)?;
        debug!(node, "memory policy: prefer node");
        Ok(Some(old))
    }
}

impl Drop for PreferNode {
    fn drop(&mut self) {
        if let Err(e) = set_policy(self.mode, &self.mask) {
            tracing::warn!(error = %e, "restoring the thread's memory policy");
        }
    }
}

fn set_policy(mode: i32, mask: &[u64; MASK_WORDS]) -> io::Result<()> {
    let empty = mode == MPOL_DEFAULT || mask.iter().all(|&w| w == 0);
    // SAFETY: set_mempolicy(2) reads MASK_BITS bits from `mask`, which lives across the
    // call (or no mask, for MPOL_DEFAULT and the local-preferred policy).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            mode,
            if empty {
                std::ptr::null()
            } else {
                mask.as_ptr()
            },
            if empty {
                0
            } else {
                MASK_BITS as libc::c_ulong + 1
            },
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's memory policy mode (`MPOL_*`).
pub fn thread_policy_mode() -> io::Result<i32> {
    let mut mode = 0i32;
    let mut mask = [0u64; MASK_WORDS];
    // SAFETY: as in `PreferNode::set`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut i32,
            mask.as_mut_ptr(),
            MASK_BITS as libc::c_ulong + 1,
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    if rc == 0 {
        Ok(mode)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The node of each page of `len` bytes from `addr` in steps of `page` bytes
/// (`move_pages(2)` without moving; negative entries are errors such as `-ENOENT` for a
/// page not present).
///
/// # Safety
///
/// `addr..addr + len` must be mapped in this process for the duration of the call (the
/// kernel only looks the pages up).
pub unsafe fn page_nodes(addr: usize, len: usize, page: usize) -> io::Result<Vec<i32>> {
    let page = page.max(4096);
    let pages: Vec<*mut libc::c_void> = (addr..addr + len)
        .step_by(page)
        .map(|a| a as *mut libc::c_void)
        .collect();
    let mut status = vec![0i32; pages.len()];
    // SAFETY: move_pages(2) with no target nodes only reports where each page is; it
    // reads `pages.len()` pointers and writes as many ints, both buffers live across the
    // call, and the caller guarantees the addresses are mapped.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0 as libc::c_int,
            pages.len() as libc::c_ulong,
            pages.as_ptr(),
            std::ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0 as libc::c_int,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_node_files_parse() {
        assert_eq!(parse_numa_node("0\n"), Some(0));
        assert_eq!(parse_numa_node("3"), Some(3));
        assert_eq!(parse_numa_node("-1\n"), None);
        assert_eq!(parse_numa_node("x"), None);
    }

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
    }

    #[test]
    fn meminfo_huge_pages_parse() {
        let text = "MemTotal: 1 kB\nHugePages_Total:      16\nHugePages_Free:        9\n\
                    HugePages_Rsvd: 0\nHugepagesize:       2048 kB\n";
        assert_eq!(parse_meminfo_huge(text), Some((2 << 20, 9)));
        assert_eq!(parse_meminfo_huge("MemTotal: 1 kB\n"), None);
        // This machine's file has both fields.
        assert!(huge_pages_free().is_some());
    }

    #[test]
    fn virtual_and_missing_interfaces_have_no_node() {
        assert_eq!(interface_numa_node("lo"), None);
        assert_eq!(interface_numa_node("nc-no-such0"), None);
        assert_eq!(interface_numa_node("../x"), None);
        assert_eq!(interface_numa_node(""), None);
    }

    #[test]
    fn a_node_preference_is_restored() {
        let before = thread_policy_mode().unwrap();
        {
            let Some(_guard) = PreferNode::set(0).unwrap() else {
                return; // a kernel without NUMA
            };
            assert_eq!(thread_policy_mode().unwrap(), MPOL_PREFERRED);
        }
        assert_eq!(thread_policy_mode().unwrap(), before);
        // A node the machine does not have.
        assert!(PreferNode::set(1000).is_err());
        assert!(PreferNode::set(5000).is_err());
        assert_eq!(thread_policy_mode().unwrap(), before);
        let cpus = node_cpus(0).unwrap();
        assert!(!cpus.is_empty());
    }
}
