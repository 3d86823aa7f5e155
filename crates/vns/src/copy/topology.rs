//! Which NUMA node each core belongs to, and where the application thread runs.
//!
//! [`Topology::detect`] reads the machine through `hwlocality` (hwloc 2.8+): every NUMA
//! node's cpuset, restricted to the cores this process may run on, and the core the calling
//! thread last ran on. When hwloc cannot be loaded or answers nonsense, it falls back to
//! one node holding every allowed core and logs why. [`Topology::from_nodes`] builds a
//! mocked topology so that placement can be tested with several nodes on a one-node
//! machine.

use hwlocality::cpu::binding::CpuBindingFlags;
use hwlocality::object::types::ObjectType;
use tracing::{debug, warn};

/// The NUMA layout the copy workers are placed by.
///
/// Cores are operating-system CPU numbers (the numbers `core_affinity` pins to and hwloc
/// cpusets hold). Nodes are numbered by their position in [`Topology::nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    nodes: Vec<Vec<usize>>,
    current_cpu: Option<usize>,
    source: TopologySource,
}

/// Where a [`Topology`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologySource {
    /// Read from hwloc.
    Hwloc,
    /// hwloc failed; one node of all allowed cores. The string says why.
    Fallback(String),
    /// Built by [`Topology::from_nodes`].
    Mock,
}

impl Topology {
    /// A mocked topology: `nodes[i]` lists the cores of node `i`; `current_cpu` is the core
    /// the application thread runs on (`None`: unknown, treated as node 0). Duplicate
    /// cores keep their first node.
    pub fn from_nodes(nodes: Vec<Vec<usize>>, current_cpu: Option<usize>) -> Self {
        let mut seen = std::collections::BTreeSet::new();
        let nodes = nodes
            .into_iter()
            .map(|cores| {
                let mut kept = Vec::with_capacity(cores.len());
                for c in cores {
                    if seen.insert(c) {
                        kept.push(c);
                    }
                }
                kept
            })
            .collect();
        Self {
            nodes,
            current_cpu,
            source: TopologySource::Mock,
        }
    }

    /// Reads the machine's topology with hwloc, seen from the calling thread (the
    /// application thread). Never fails: on any hwloc error it logs the reason and returns
    /// one node holding every core this process may use.
    pub fn detect() -> Self {
        let allowed = allowed_cores();
        match detect_hwloc(allowed.as_deref()) {
            Ok(t) => {
                debug!(nodes = ?t.nodes, current_cpu = ?t.current_cpu, "copy workers: hwloc topology");
                t
            }
            Err(reason) => {
                warn!(%reason, "copy workers: hwloc topology unavailable, assuming one NUMA node");
                Self::fallback(allowed, reason)
            }
        }
    }

    fn fallback(allowed: Option<Vec<usize>>, reason: String) -> Self {
        let cores = allowed.unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n).collect()
        });
        Self {
            nodes: vec![cores],
            current_cpu: None,
            source: TopologySource::Fallback(reason),
        }
    }

    /// The cores of each node (a node without cores, e.g. memory-only, is an empty list).
    pub fn nodes(&self) -> &[Vec<usize>] {
        &self.nodes
    }

    /// The core the application thread ran on when the topology was read, if known.
    pub fn current_cpu(&self) -> Option<usize> {
        self.current_cpu
    }

    /// Where this topology came from.
    pub fn source(&self) -> &TopologySource {
        &self.source
    }

    /// The node that holds `cpu`, if any.
    pub fn node_of(&self, cpu: usize) -> Option<usize> {
        self.nodes.iter().position(|cores| cores.contains(&cpu))
    }

    /// The application thread's node: the node of [`Topology::current_cpu`], or the first
    /// node with cores when that is unknown.
    pub fn app_node(&self) -> usize {
        self.current_cpu
            .and_then(|c| self.node_of(c))
            .or_else(|| self.nodes.iter().position(|n| !n.is_empty()))
            .unwrap_or(0)
    }

    /// Number of cores over all nodes.
    pub fn core_count(&self) -> usize {
        self.nodes.iter().map(Vec::len).sum()
    }
}

/// The cores this process may run on (its affinity mask), if the OS tells.
fn allowed_cores() -> Option<Vec<usize>> {
    core_affinity::get_core_ids().map(|ids| ids.into_iter().map(|c| c.id).collect())
}

fn detect_hwloc(allowed: Option<&[usize]>) -> Result<Topology, String> {
    let topo = hwlocality::Topology::new().map_err(|e| format!("hwloc_topology_load: {e}"))?;
    let mut nodes = Vec::new();
    for node in topo.objects_with_type(ObjectType::NUMANode) {
        let cpuset = node
            .cpuset()
            .ok_or_else(|| "a NUMA node has no cpuset".to_string())?;
        if cpuset.weight().is_none() {
            return Err("a NUMA node has an infinite cpuset".into());
        }
        let cores: Vec<usize> = cpuset
            .iter_set()
            .map(usize::from)
            .filter(|c| allowed.is_none_or(|a| a.contains(c)))
            .collect();
        nodes.push(cores);
    }
    if nodes.iter().all(Vec::is_empty) {
        return Err("no NUMA node holds a core this process may use".into());
    }
    let current_cpu = match topo.last_cpu_location(CpuBindingFlags::THREAD) {
        Ok(set) => set.first_set().map(usize::from),
        Err(e) => {
            debug!(error = %e, "copy workers: hwloc cannot tell the current core");
            None
        }
    };
    Ok(Topology {
        nodes,
        current_cpu,
        source: TopologySource::Hwloc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mock_nodes_and_lookup() {
        let t = Topology::from_nodes(vec![vec![0, 1], vec![2, 3], vec![3, 4]], Some(3));
        assert_eq!(t.nodes(), &[vec![0, 1], vec![2, 3], vec![4]]);
        assert_eq!(t.node_of(3), Some(1));
        assert_eq!(t.node_of(9), None);
        assert_eq!(t.app_node(), 1);
        assert_eq!(t.core_count(), 5);
        assert_eq!(t.source(), &TopologySource::Mock);
    }

    #[test]
    fn unknown_current_cpu_is_first_node_with_cores() {
        let t = Topology::from_nodes(vec![vec![], vec![5, 6]], None);
        assert_eq!(t.app_node(), 1);
        let t = Topology::from_nodes(vec![vec![0], vec![1]], Some(42));
        assert_eq!(t.app_node(), 0);
    }

    #[test]
    fn fallback_is_one_node_of_allowed_cores() {
        let t = Topology::fallback(Some(vec![3, 5]), "no hwloc".into());
        assert_eq!(t.nodes(), &[vec![3, 5]]);
        assert_eq!(t.current_cpu(), None);
        assert_eq!(t.app_node(), 0);
        assert_eq!(t.source(), &TopologySource::Fallback("no hwloc".into()));
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(Topology::fallback(None, String::new()).core_count(), n);
    }

    /// The real machine: hwloc (or the logged fallback) must see every core this process
    /// may use, each in exactly one node, and the current core among them.
    #[test]
    fn detect_sees_allowed_cores() {
        let t = Topology::detect();
        let mut all: Vec<usize> = t.nodes().iter().flatten().copied().collect();
        all.sort_unstable();
        let mut allowed = allowed_cores().expect("sched_getaffinity works on Linux");
        allowed.sort_unstable();
        assert_eq!(all, allowed);
        if let TopologySource::Hwloc = t.source() {
            let cpu = t
                .current_cpu()
                .expect("hwloc tells the current core on Linux");
            assert!(t.node_of(cpu).is_some(), "current cpu {cpu} in no node");
        }
    }
}
