//! The CPUs of the NIC's NUMA node, on which a set's unpinned queue runtimes run: a
//! queue's driver touches its UMEM and its connections on every round, and the NIC writes
//! that UMEM, so the driver belongs on the node whose memory controller holds it (where
//! the UMEM is placed too, [`XdpLinkConfig::numa_node`](crate::link::xdp::XdpLinkConfig)).
//!
//! The node is the one the link configuration names (the interface's by default, read
//! from sysfs); its CPUs come from `/sys/devices/system/node/nodeN/cpulist`, intersected
//! with the CPUs this process may use. No node (veth, a single-node machine without a
//! `numa_node` file) or no usable CPU on it leaves the runtimes where the scheduler puts
//! them. A runtime pinned to a core (busy polling, a plan's `Pin`) stays on that core.

use std::sync::Arc;

use tracing::{debug, warn};

use crate::link::umem_memory::{interface_numa_node, NumaNode};

/// The CPUs an unpinned queue runtime of a set on `ifname` is confined to, given the
/// link's node setting: the node's CPUs this process may use, or `None` (no node, or none
/// of its CPUs usable).
pub(crate) fn runtime_cpus(ifname: &str, node: NumaNode) -> Option<Arc<[usize]>> {
    let node = match node {
        NumaNode::Interface => interface_numa_node(ifname)?,
        NumaNode::Node(n) => n,
        NumaNode::Any => return None,
    };
    let path = format!("/sys/devices/system/node/node{node}/cpulist");
    let Some(cpus) = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| parse_cpulist(&s))
    else {
        warn!(node, %path, "the NUMA node's CPU list cannot be read; queue runtimes run anywhere");
        return None;
    };
    let allowed: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    let usable: Vec<usize> = cpus.into_iter().filter(|c| allowed.contains(c)).collect();
    if usable.is_empty() {
        warn!(
            node,
            "none of the NIC's NUMA node's CPUs is allowed to this process; queue runtimes run anywhere"
        );
        return None;
    }
    debug!(node, cpus = ?usable, "queue runtimes on the NIC's NUMA node");
    Some(usable.into())
}

/// Parses a kernel CPU list (`0-15,32-47`, `3`, empty for none); `None` when malformed.
pub(crate) fn parse_cpulist(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// Confines the calling thread to `cpus` (`sched_setaffinity`). CPUs beyond what a
/// `cpu_set_t` holds are ignored; an empty result leaves the thread as it is.
pub(crate) fn confine_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: `cpu_set_t` is a plain bit array, valid when zeroed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    let mut any = false;
    for &c in cpus.iter().filter(|&&c| c < max) {
        // SAFETY: `c` is below the set's capacity in bits.
        unsafe { libc::CPU_SET(c, &mut set) };
        any = true;
    }
    if !any {
        return Ok(());
    }
    // SAFETY: `set` is a valid `cpu_set_t` of the size passed; pid 0 is the calling thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs the calling thread may run on (`sched_getaffinity`).
#[cfg(test)]
pub(crate) fn current_thread_cpus() -> std::io::Result<Vec<usize>> {
    // SAFETY: as above.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `c` is below the set's capacity in bits.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpulist("0-3\n"), Some(vec![0, 1, 2, 3]));
        assert_eq!(
            parse_cpulist("0-1,8-9,4"),
            Some(vec![0, 1, 4, 8, 9]),
            "sorted"
        );
        assert_eq!(parse_cpulist("5"), Some(vec![5]));
        assert_eq!(parse_cpulist("\n"), Some(vec![]), "a node without CPUs");
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("a-b"), None);
        assert_eq!(parse_cpulist("0-99999999"), None, "bounded");
    }

    #[test]
    fn no_node_means_no_confinement() {
        assert_eq!(runtime_cpus("lo", NumaNode::Any), None);
        assert_eq!(runtime_cpus("no-such-if0", NumaNode::Interface), None);
        assert_eq!(
            runtime_cpus("lo", NumaNode::Node(1 << 20)),
            None,
            "no such node"
        );
    }

    /// Node 0 exists on every Linux machine: its usable CPUs are those this process may
    /// use that the node lists.
    #[test]
    fn a_named_node_gives_its_usable_cpus() {
        let cpus = runtime_cpus("lo", NumaNode::Node(0)).expect("node 0 has usable CPUs");
        let node0 = parse_cpulist(
            &std::fs::read_to_string("/sys/devices/system/node/node0/cpulist").unwrap(),
        )
        .unwrap();
        assert!(!cpus.is_empty());
        assert!(cpus.iter().all(|c| node0.contains(c)));
    }

    #[test]
    fn a_thread_is_confined_to_the_cpus_given() {
        let first = current_thread_cpus().unwrap()[0];
        let got = std::thread::spawn(move || {
            confine_current_thread(&[first]).unwrap();
            current_thread_cpus().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(got, vec![first]);
    }
}
