//! Copy workers: per-core threads that copy between application buffers and channel
//! chunks in parallel with the application thread.
//!
//! # What the paper does
//!
//! NetChannel (SIGCOMM 2022) decouples data copy from application threads: the VNS layer
//! keeps per-core worker threads that copy between user buffers and kernel buffers, so a
//! single application thread is no longer bounded by what its own core can copy. The
//! paper's motivation measures that, even with the best steering (aRFS) and zero-copy
//! receive tricks, the copy on the application's core remains the bottleneck of one long
//! flow; with two copy workers and one channel NetChannel saturates 100 Gbit/s, and with
//! two channels and three copy workers 200 Gbit/s. The NetScheduler hands copy requests to
//! workers round-robin, skipping a worker that already holds more than 640 KB of queued
//! copies. The cost side: with two copy threads the paper measures about 12 % lower
//! throughput per core than three plain connections, mostly L1 misses because the
//! application buffer is not in the copying core's cache. All experiments use only cores
//! of the NIC's NUMA node.
//!
//! # What this module does
//!
//! - [`Topology`] reads the NUMA nodes and the calling (application) thread's core with
//!   `hwlocality`, falling back to one node of all allowed cores with a logged reason;
//!   [`Topology::from_nodes`] mocks it.
//! - [`place_workers`] chooses cores NUMA-local to the application thread: the node's other
//!   cores first, then the application's own core, other nodes only when
//!   [`CopyConfig::spill_to_remote_nodes`] allows it.
//! - [`CopyWorkerPool`] starts [`CopyConfig::workers`] threads pinned with `core_affinity`
//!   (pin failures are logged and counted, not fatal). A copy of at least
//!   [`CopyConfig::small_copy_threshold`] bytes is cut into `workers + 1` pieces: the
//!   application thread queues one piece per worker, copies the first piece itself, then
//!   waits for the others. Smaller copies, and every copy when `workers == 0`, are done
//!   inline by the application thread. This is the synchronous `read`/`write` model of the
//!   paper: the call returns when the bytes are copied.
//!   - [`CopyWorkerPool::copy_in`] cuts an application buffer into chunks of at most
//!     [`CopyConfig::chunk_size`] bytes (pieces are whole runs of chunks);
//!     [`CopyWorkerPool::copy_in_mut`] does the same into caller-held reusable buffers.
//!   - [`CopyWorkerPool::copy_out`] copies received chunks into an application buffer;
//!     each piece is a disjoint `&mut` part of the destination.
//!   - Chunk buffers come from a bounded LIFO [`BufferPool`] (warm buffers first) and go
//!     back with [`CopyWorkerPool::recycle`]; [`CopyStats::buffers`] counts allocations
//!     against reuses.
//!
//! Safety without `unsafe`: the workers are a `rayon-core` thread pool started through
//! its spawn handler (so this pool owns the `JoinHandle`s, names and pins the threads),
//! and every parallel copy runs in `ThreadPool::in_place_scope`, which lets long-lived
//! workers borrow the application's slices because the scope does not return before
//! every piece is done. No extra staging copy is needed to hand borrowed data over.
//!
//! Idle workers sleep on a condition variable; after finishing work a rayon worker
//! yields the CPU (`sched_yield`) about 32 times looking for more work before it sleeps,
//! which takes microseconds. Dropping the pool ends and joins every worker.
//!
//! Measured on the 2-core test machine (`docs/performance.md`, "Copy workers"): handing a
//! copy to workers costs 4–10 µs (waking a sleeping worker, then the application thread),
//! against 0.11–0.13 µs for an inline 4 KiB copy and 9 µs for 256 KiB — for small transfers
//! the hand-off costs far more than it saves, hence [`CopyConfig::small_copy_threshold`]
//! (default 512 KiB, where splitting starts to pay). At 1 MiB one worker on the free core
//! copied 1.4–1.6× faster than the application thread alone (and lost when that core was
//! busy); 16 MiB copies are memory-bound (~6 GiB/s) with or without workers.
//!
//! The [Stack](crate::stack#copy-workers) owns one pool built from
//! `StackBuilder::copy_workers` and uses it for large `VirtualStream` reads and writes.
//! Not done: the paper's per-worker 640 KB load threshold — work is shared by rayon's
//! queue instead — and choosing the copying core per socket.
//! Figures are in `docs/performance.md` ("Copy workers") and the design in
//! `docs/copy-workers.md`.
//!
//! # Example
//!
//! ```
//! use vns::copy::{CopyConfig, CopyWorkerPool, Topology};
//!
//! let pool = CopyWorkerPool::new(CopyConfig {
//!     workers: 2,
//!     chunk_size: 4096,
//!     small_copy_threshold: 16 * 1024,
//!     pin: false,
//!     topology: Some(Topology::from_nodes(vec![vec![0, 1], vec![2, 3]], Some(0))),
//!     ..CopyConfig::default()
//! })?;
//! assert_eq!(pool.placement().cores, vec![1, 0]); // node 0, app core last
//!
//! let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
//! let chunks = pool.copy_in(&data);
//! assert_eq!(chunks.len(), 25);
//! let mut back = vec![0u8; data.len()];
//! assert_eq!(pool.copy_out(&chunks, &mut back), data.len());
//! assert_eq!(back, data);
//! for c in chunks {
//!     pool.recycle(c);
//! }
//! assert_eq!(pool.stats().parallel_copies, 2);
//! # Ok::<(), vns::copy::CopyError>(())
//! ```

mod buffers;
mod placement;
mod topology;
mod workers;

#[cfg(test)]
mod tests;

pub use buffers::{BufferPool, BufferStats};
pub use placement::{place_workers, Placement};
pub use topology::{Topology, TopologySource};
pub use workers::{CopyConfig, CopyError, CopyStats, CopyWorkerPool};
