//! Choosing the cores copy workers are pinned to.
//!
//! Copies touch the application's buffers, which live in the application thread's NUMA
//! node (first touch), so workers go to that node: first its cores other than the
//! application thread's own core (they copy in parallel with it), then the application's
//! core itself, and cores of other nodes only when spilling is allowed — nearest node
//! number first, as a stand-in for distance. When more workers are asked for than there
//! are candidate cores, the list is reused round-robin (two workers then share a core).

use super::topology::Topology;

/// Where each worker of a pool runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The core of worker `i` at index `i` (empty when the topology has no core).
    pub cores: Vec<usize>,
    /// The application thread's node.
    pub app_node: usize,
    /// The application thread's core when the topology was read, if known.
    pub app_cpu: Option<usize>,
}

/// Chooses `workers` cores for copy workers serving the application thread described by
/// `topology` (see the module docs for the order). `spill` allows cores of other nodes.
pub fn place_workers(topology: &Topology, workers: usize, spill: bool) -> Placement {
    let app_node = topology.app_node();
    let app_cpu = topology.current_cpu();
    let nodes = topology.nodes();
    let mut candidates: Vec<usize> = Vec::new();
    if let Some(local) = nodes.get(app_node) {
        // Start just after the application core so that the first workers sit beside it
        // (cores are listed in OS order, which follows the package/cache layout).
        let start = app_cpu
            .and_then(|c| local.iter().position(|&x| x == c))
            .map_or(0, |i| i + 1);
        let n = local.len();
        candidates.extend(
            (0..n)
                .map(|k| local[(start + k) % n])
                .filter(|&c| Some(c) != app_cpu),
        );
        if let Some(c) = app_cpu.filter(|c| local.contains(c)) {
            candidates.push(c);
        }
    }
    if spill || candidates.is_empty() {
        // Other nodes, nearest index first: app_node+1, app_node-1, app_node+2, ...
        let mut others: Vec<usize> = (0..nodes.len()).filter(|&n| n != app_node).collect();
        others.sort_by_key(|&n| (n.abs_diff(app_node), n));
        for n in others {
            candidates.extend(nodes[n].iter().copied());
        }
    }
    let cores = if candidates.is_empty() {
        Vec::new()
    } else {
        (0..workers)
            .map(|i| candidates[i % candidates.len()])
            .collect()
    };
    Placement {
        cores,
        app_node,
        app_cpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_node_prefers_other_cores_then_app_core() {
        let t = Topology::from_nodes(vec![vec![0, 1]], Some(0));
        assert_eq!(place_workers(&t, 0, false).cores, Vec::<usize>::new());
        assert_eq!(place_workers(&t, 1, false).cores, vec![1]);
        assert_eq!(place_workers(&t, 2, false).cores, vec![1, 0]);
        assert_eq!(place_workers(&t, 3, false).cores, vec![1, 0, 1]);
        let t = Topology::from_nodes(vec![vec![0, 1]], Some(1));
        assert_eq!(place_workers(&t, 2, true).cores, vec![0, 1]);
    }

    #[test]
    fn two_nodes_stay_local_unless_spilling() {
        let t = Topology::from_nodes(vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]], Some(5));
        let p = place_workers(&t, 3, false);
        assert_eq!(p.app_node, 1);
        assert_eq!(p.app_cpu, Some(5));
        assert_eq!(p.cores, vec![6, 7, 4]);
        // Without spill, more workers than local cores share local cores.
        let p = place_workers(&t, 6, false);
        assert_eq!(p.cores, vec![6, 7, 4, 5, 6, 7]);
        assert!(p.cores.iter().all(|&c| t.node_of(c) == Some(1)));
        // With spill the other node's cores come after all local ones.
        let p = place_workers(&t, 6, true);
        assert_eq!(p.cores, vec![6, 7, 4, 5, 0, 1]);
    }

    #[test]
    fn four_nodes_spill_to_nearest_node_first() {
        let nodes = vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]];
        let t = Topology::from_nodes(nodes, Some(4));
        let p = place_workers(&t, 2, false);
        assert_eq!(p.app_node, 2);
        assert_eq!(p.cores, vec![5, 4]);
        let p = place_workers(&t, 8, true);
        // node 2, then 1 and 3 (distance 1, lower index first), then 0.
        assert_eq!(p.cores, vec![5, 4, 2, 3, 6, 7, 0, 1]);
        let p = place_workers(&t, 9, true);
        assert_eq!(p.cores[8], 5);
    }

    #[test]
    fn four_nodes_unknown_app_core_uses_first_node() {
        let nodes = vec![vec![], vec![2, 3], vec![4, 5], vec![6, 7]];
        let t = Topology::from_nodes(nodes, None);
        let p = place_workers(&t, 3, false);
        assert_eq!(p.app_node, 1);
        assert_eq!(p.cores, vec![2, 3, 2]);
    }

    #[test]
    fn app_core_outside_every_node_uses_first_node_with_cores() {
        // An application core hwloc did not list (or outside our affinity) falls back to
        // the first node with cores; a topology without cores places nothing.
        let t = Topology::from_nodes(vec![vec![], vec![2, 3]], Some(7));
        assert_eq!(place_workers(&t, 2, false).cores, vec![2, 3]);
        let t = Topology::from_nodes(vec![vec![9], vec![2, 3]], Some(9));
        assert_eq!(place_workers(&t, 2, false).cores, vec![9, 9]);
        let empty = Topology::from_nodes(vec![], None);
        assert!(place_workers(&empty, 2, true).cores.is_empty());
    }
}
