//! The copy worker pool: pinned threads that copy between application buffers and chunk
//! buffers in parallel with the application thread.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::{Bytes, BytesMut};
use netsched::{CopyDirection, CopyRequest, CopyWorkerId, CopyWorkerStats};
use tracing::{debug, warn};

use super::buffers::{BufferPool, BufferStats};
use super::placement::{place_workers, Placement};
use super::topology::Topology;

/// Configuration of a [`CopyWorkerPool`].
#[derive(Debug, Clone)]
pub struct CopyConfig {
    /// Worker threads. 0: the application thread copies everything.
    pub workers: usize,
    /// Largest chunk [`CopyWorkerPool::copy_in`] cuts (must be > 0).
    pub chunk_size: usize,
    /// Transfers shorter than this are copied by the application thread alone: handing
    /// work to a worker costs a wake-up and cache traffic that a small copy does not
    /// repay (see `docs/performance.md`, "Copy workers").
    pub small_copy_threshold: usize,
    /// Pin each worker to its chosen core with `core_affinity` (failures are logged).
    pub pin: bool,
    /// Allow workers on other NUMA nodes once the application's node is used up.
    pub spill_to_remote_nodes: bool,
    /// Most idle chunk buffers kept for reuse.
    pub buffer_pool_capacity: usize,
    /// Bytes of room [`CopyWorkerPool::copy_in`] and [`CopyWorkerPool::copy_in_mut`] leave
    /// (zeroed) in front of each chunk's data, for a header written in place later, so
    /// that header and payload leave as one buffer (the Stack uses the chunk header's
    /// length). Buffers have `chunk_size + headroom` bytes of capacity. Default 0.
    pub headroom: usize,
    /// The topology to place workers by; `None` reads the machine with hwloc from the
    /// thread calling [`CopyWorkerPool::new`], taken to be the application thread.
    pub topology: Option<Topology>,
}

impl Default for CopyConfig {
    fn default() -> Self {
        Self {
            workers: 1,
            chunk_size: 64 * 1024,
            small_copy_threshold: 512 * 1024,
            pin: true,
            spill_to_remote_nodes: false,
            buffer_pool_capacity: 1024,
            headroom: 0,
            topology: None,
        }
    }
}

/// Errors of [`CopyWorkerPool::new`].
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// `chunk_size` is 0.
    #[error("chunk_size must be greater than 0")]
    ZeroChunkSize,
    /// The worker threads could not be started.
    #[error("cannot start copy worker threads: {0}")]
    Spawn(String),
}

/// Counters of a [`CopyWorkerPool`] (monotonic since creation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Copies (in or out) the application thread did alone: below the threshold, no
    /// workers, or a single piece.
    pub inline_copies: u64,
    /// Copies cut into pieces shared with workers.
    pub parallel_copies: u64,
    /// Of those, copies out of chunks ([`CopyWorkerPool::copy_out`]); the rest copied
    /// into chunks.
    pub parallel_copies_out: u64,
    /// Pieces the workers copied.
    pub worker_pieces: u64,
    /// Bytes the workers copied.
    pub worker_bytes: u64,
    /// Bytes the application thread copied.
    pub app_bytes: u64,
    /// Workers that could not be pinned to their core.
    pub pin_failures: u64,
    /// Pieces the stack's copy picker (its scheduler's `pick_copy_worker`) placed on a worker of its choice.
    pub picked_pieces: u64,
    /// Pieces the copy picker gave back to the application thread (`None`).
    pub declined_pieces: u64,
    /// The chunk buffer pool's counters.
    pub buffers: BufferStats,
}

/// An installed [`CopyPicker`] (a closure has no `Debug`).
struct Picker(CopyPicker);

impl std::fmt::Debug for Picker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CopyPicker")
    }
}

/// Chooses the worker that copies each piece of a large copy, from the workers' queued
/// bytes ([`CopyWorkerPool::set_picker`]); `None` leaves the piece to the application
/// thread. The stack installs its scheduler's
/// [`pick_copy_worker`](netsched::NetScheduler::pick_copy_worker) here.
pub type CopyPicker =
    Box<dyn FnMut(&CopyRequest, &[CopyWorkerStats]) -> Option<CopyWorkerId> + Send>;

#[derive(Debug, Default)]
struct Counters {
    inline_copies: AtomicU64,
    parallel_copies: AtomicU64,
    parallel_copies_out: AtomicU64,
    worker_pieces: AtomicU64,
    worker_bytes: AtomicU64,
    app_bytes: AtomicU64,
    pin_failures: AtomicU64,
    picked_pieces: AtomicU64,
    declined_pieces: AtomicU64,
}

/// Counts `n` bytes copied by the calling worker thread.
fn note_copied(copied: &[AtomicU64], n: usize) {
    if let Some(slot) = rayon_core::current_thread_index().and_then(|i| copied.get(i)) {
        slot.fetch_add(n as u64, Ordering::Relaxed);
    }
}

fn add(c: &AtomicU64, n: usize) {
    c.fetch_add(n as u64, Ordering::Relaxed);
}

/// Worker threads plus a chunk buffer pool. See the [module docs](super).
///
/// All methods take `&self`; the pool is `Send + Sync` and may be shared by several
/// application threads (their copies then share the workers).
#[derive(Debug)]
pub struct CopyWorkerPool {
    chunk_size: usize,
    small_copy_threshold: usize,
    headroom: usize,
    workers: usize,
    threads: Option<rayon_core::ThreadPool>,
    handles: Vec<JoinHandle<()>>,
    live: Arc<AtomicUsize>,
    /// OS thread ids of the workers (Linux `/proc/thread-self`), for tests and tools.
    tids: Arc<Mutex<Vec<(usize, u64)>>>,
    placement: Placement,
    topology: Topology,
    buffers: BufferPool,
    counters: Arc<Counters>,
    /// How pieces are placed on workers; `None`: a copy is split evenly over all of them.
    picker: Mutex<Option<Picker>>,
    /// Bytes handed to each worker and not copied yet.
    queued: Vec<AtomicU64>,
    /// Bytes each worker copied.
    copied: Vec<AtomicU64>,
}

impl CopyWorkerPool {
    /// Places and starts `config.workers` threads (none for 0) and an empty buffer pool.
    pub fn new(config: CopyConfig) -> Result<Self, CopyError> {
        if config.chunk_size == 0 {
            return Err(CopyError::ZeroChunkSize);
        }
        let topology = config.topology.unwrap_or_else(Topology::detect);
        let placement = place_workers(&topology, config.workers, config.spill_to_remote_nodes);
        debug!(?placement, "copy workers placed");
        let counters = Arc::new(Counters::default());
        let live = Arc::new(AtomicUsize::new(0));
        let tids = Arc::new(Mutex::new(Vec::new()));
        let mut handles = Vec::with_capacity(config.workers);
        let threads = if config.workers == 0 {
            None
        } else {
            let cores = placement.cores.clone();
            let pin = config.pin;
            let built = rayon_core::ThreadPoolBuilder::new()
                .num_threads(config.workers)
                .spawn_handler(|thread| {
                    let index = thread.index();
                    let core = cores.get(index).copied();
                    let counters = Arc::clone(&counters);
                    let alive = Arc::clone(&live);
                    let tids = Arc::clone(&tids);
                    live.fetch_add(1, Ordering::SeqCst);
                    let spawned = std::thread::Builder::new()
                        .name(format!("vns-copy-{index}"))
                        .spawn(move || {
                            let _alive = LiveGuard(alive);
                            if pin {
                                pin_to(index, core, &counters);
                            }
                            if let Some(tid) = own_tid() {
                                let mut tids = tids.lock().unwrap_or_else(|e| e.into_inner());
                                tids.push((index, tid));
                            }
                            thread.run();
                        });
                    match spawned {
                        Ok(h) => {
                            handles.push(h);
                            Ok(())
                        }
                        Err(e) => {
                            live.fetch_sub(1, Ordering::SeqCst);
                            Err(e)
                        }
                    }
                })
                .build();
            match built {
                Ok(p) => Some(p),
                Err(e) => {
                    // Threads started before the failure exit once the registry is gone.
                    for h in handles.drain(..) {
                        let _ = h.join();
                    }
                    return Err(CopyError::Spawn(e.to_string()));
                }
            }
        };
        Ok(Self {
            chunk_size: config.chunk_size,
            small_copy_threshold: config.small_copy_threshold,
            headroom: config.headroom,
            workers: config.workers,
            threads,
            handles,
            live,
            tids,
            placement,
            topology,
            buffers: BufferPool::new(
                config.chunk_size + config.headroom,
                config.buffer_pool_capacity,
            ),
            counters,
            picker: Mutex::new(None),
            queued: (0..config.workers).map(|_| AtomicU64::new(0)).collect(),
            copied: (0..config.workers).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Places the pieces of large copies on the workers `picker` chooses (the paper's
    /// scheduler skips a worker holding more than 640 KB), instead of splitting every
    /// copy evenly over all workers. A copy is still cut into one piece per worker plus
    /// one for the application thread, which always copies that one itself.
    pub fn set_picker(&self, picker: CopyPicker) {
        *self.picker.lock().unwrap_or_else(|e| e.into_inner()) = Some(Picker(picker));
    }

    /// Each worker with its core and the bytes handed to it and not copied yet, as a
    /// scheduler sees them.
    pub fn worker_stats(&self) -> Vec<CopyWorkerStats> {
        self.queued
            .iter()
            .enumerate()
            .map(|(i, q)| CopyWorkerStats {
                id: CopyWorkerId(i as u32),
                core: self.placement.cores.get(i).copied(),
                queued_bytes: q.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Bytes each worker has copied, by worker index.
    pub fn copied_by_worker(&self) -> Vec<u64> {
        self.copied
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Whether a picker is installed (then large copies go through [`Self::run_picked`]).
    fn picking(&self) -> bool {
        self.picker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// A large copy's pieces: the first (`pieces[0]`) is the application thread's; each
    /// other one goes to the worker the picker names, or stays with the application
    /// thread. Workers run theirs in one broadcast over the pool, each taking the pieces
    /// placed on it; the call returns once every piece is copied.
    fn run_picked<P: Send>(
        &self,
        threads: &rayon_core::ThreadPool,
        flow: u64,
        direction: CopyDirection,
        pieces: Vec<(usize, P)>,
        work: impl Fn(P) + Sync,
    ) {
        let c = &self.counters;
        let mut app = Vec::new();
        let mut placed: Vec<Vec<(usize, P)>> = (0..self.workers).map(|_| Vec::new()).collect();
        {
            let mut picker = self.picker.lock().unwrap_or_else(|e| e.into_inner());
            for (i, (len, piece)) in pieces.into_iter().enumerate() {
                let pick = match picker.as_mut() {
                    Some(Picker(pick)) if i > 0 => {
                        let request = CopyRequest {
                            flow,
                            len,
                            direction,
                        };
                        pick(&request, &self.worker_stats())
                    }
                    _ => None,
                };
                match pick.map(|w| w.0 as usize).filter(|&w| w < self.workers) {
                    Some(w) => {
                        self.queued[w].fetch_add(len as u64, Ordering::Relaxed);
                        add(&c.picked_pieces, 1);
                        placed[w].push((len, piece));
                    }
                    None => {
                        if i > 0 {
                            add(&c.declined_pieces, 1);
                        }
                        app.push((len, piece));
                    }
                }
            }
        }
        let any_placed = placed.iter().any(|p| !p.is_empty());
        let placed: Vec<Mutex<Vec<(usize, P)>>> = placed.into_iter().map(Mutex::new).collect();
        let work = &work;
        let placed = &placed;
        threads.in_place_scope(|scope| {
            if any_placed {
                scope.spawn_broadcast(move |_, ctx| {
                    let me = ctx.index();
                    let Some(slot) = placed.get(me) else {
                        return;
                    };
                    let mine = std::mem::take(&mut *slot.lock().unwrap_or_else(|e| e.into_inner()));
                    for (len, piece) in mine {
                        work(piece);
                        self.queued[me].fetch_sub(len as u64, Ordering::Relaxed);
                        self.copied[me].fetch_add(len as u64, Ordering::Relaxed);
                        add(&c.worker_pieces, 1);
                        add(&c.worker_bytes, len);
                    }
                });
            }
            for (len, piece) in app {
                work(piece);
                add(&c.app_bytes, len);
            }
        });
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The chunk size `copy_in` cuts at.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Copies shorter than this are done by the calling thread alone.
    pub fn small_copy_threshold(&self) -> usize {
        self.small_copy_threshold
    }

    /// Bytes of room in front of each chunk [`CopyWorkerPool::copy_in`] makes.
    pub fn headroom(&self) -> usize {
        self.headroom
    }

    /// The cores the workers were placed on.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The topology the workers were placed by.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The chunk buffer pool (give chunks back with [`CopyWorkerPool::recycle`]).
    pub fn buffers(&self) -> &BufferPool {
        &self.buffers
    }

    /// Worker threads currently running (drops to 0 once the pool is dropped).
    pub fn live_workers(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// `(worker index, OS thread id)` of the workers that have started (and been pinned,
    /// if asked), in start order (Linux), for inspection.
    pub fn worker_tids(&self) -> Vec<(usize, u64)> {
        self.tids.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The live-worker counter itself, to watch it after the pool is dropped.
    #[cfg(test)]
    pub(crate) fn live_counter(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.live)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> CopyStats {
        let c = &self.counters;
        CopyStats {
            inline_copies: c.inline_copies.load(Ordering::Relaxed),
            parallel_copies: c.parallel_copies.load(Ordering::Relaxed),
            parallel_copies_out: c.parallel_copies_out.load(Ordering::Relaxed),
            worker_pieces: c.worker_pieces.load(Ordering::Relaxed),
            worker_bytes: c.worker_bytes.load(Ordering::Relaxed),
            app_bytes: c.app_bytes.load(Ordering::Relaxed),
            pin_failures: c.pin_failures.load(Ordering::Relaxed),
            picked_pieces: c.picked_pieces.load(Ordering::Relaxed),
            declined_pieces: c.declined_pieces.load(Ordering::Relaxed),
            buffers: self.buffers.stats(),
        }
    }

    /// Gives a chunk back to the buffer pool once the channel is done with it (kept only
    /// if no other reference remains). Returns whether it was kept.
    pub fn recycle(&self, chunk: Bytes) -> bool {
        self.buffers.put_bytes(chunk)
    }

    /// Copies `src` into chunks of at most `chunk_size` bytes, in buffers from the pool
    /// (each preceded by [`CopyConfig::headroom`] zero bytes). An empty `src` gives no
    /// chunk.
    pub fn copy_in(&self, src: &[u8]) -> Vec<Bytes> {
        let mut bufs = Vec::new();
        self.buffers
            .take_into(src.len().div_ceil(self.chunk_size), &mut bufs);
        self.fill(0, src, &mut bufs);
        bufs.into_iter().map(BytesMut::freeze).collect()
    }

    /// Like [`CopyWorkerPool::copy_in`] into the caller's reusable buffers: `out`'s
    /// buffers are cleared and refilled in order, missing ones come from the pool, and
    /// surplus ones go back to it. Afterwards `out` holds exactly the chunks of `src`
    /// (each after [`CopyConfig::headroom`] zero bytes). Returns the number of chunks.
    pub fn copy_in_mut(&self, src: &[u8], out: &mut Vec<BytesMut>) -> usize {
        self.copy_in_mut_for(0, src, out)
    }

    /// [`CopyWorkerPool::copy_in_mut`] for the virtual socket `flow` (what a
    /// copy picker is told).
    pub fn copy_in_mut_for(&self, flow: u64, src: &[u8], out: &mut Vec<BytesMut>) -> usize {
        let k = src.len().div_ceil(self.chunk_size);
        for surplus in out.drain(k.min(out.len())..) {
            self.buffers.put(surplus);
        }
        for b in out.iter_mut() {
            b.clear();
            // A caller's buffer that is too small grows once and stays grown.
            b.reserve(self.chunk_size + self.headroom);
        }
        self.buffers.note_reuse(out.len());
        let missing = k - out.len();
        self.buffers.take_into(missing, out);
        self.fill(flow, src, out);
        k
    }

    /// Fills `bufs` (empty, `len == ceil(src.len() / chunk_size)`) with the chunks of `src`.
    fn fill(&self, flow: u64, src: &[u8], bufs: &mut [BytesMut]) {
        let cs = self.chunk_size;
        let h = self.headroom;
        let parts = self.parts(src.len()).min(bufs.len());
        let c = &self.counters;
        match (&self.threads, parts) {
            (Some(threads), 2..) if self.picking() => {
                add(&c.parallel_copies, 1);
                let k = bufs.len();
                let mut pieces = Vec::with_capacity(parts);
                let (mut rest_bufs, mut rest_src) = (bufs, src);
                for p in 0..parts {
                    let n = k * (p + 1) / parts - k * p / parts;
                    let (piece_bufs, tail_bufs) = rest_bufs.split_at_mut(n);
                    let (piece_src, tail_src) = rest_src.split_at((n * cs).min(rest_src.len()));
                    rest_bufs = tail_bufs;
                    rest_src = tail_src;
                    pieces.push((piece_src.len(), (piece_bufs, piece_src)));
                }
                self.run_picked(
                    threads,
                    flow,
                    CopyDirection::ToChannels,
                    pieces,
                    |(b, s)| fill_chunks(b, s, cs, h),
                );
            }
            (Some(threads), 2..) => {
                add(&c.parallel_copies, 1);
                let k = bufs.len();
                threads.in_place_scope(|scope| {
                    // Cut the chunk list into `parts` runs of near-equal chunk counts;
                    // run 0 is the application thread's, spawned runs go to workers.
                    let (mut rest_bufs, mut rest_src) = (bufs, src);
                    let app_len = k / parts;
                    let (app_bufs, tail_bufs) = rest_bufs.split_at_mut(app_len);
                    let (app_src, tail_src) = rest_src.split_at(app_len * cs);
                    rest_bufs = tail_bufs;
                    rest_src = tail_src;
                    for p in 1..parts {
                        let n = k * (p + 1) / parts - k * p / parts;
                        let (piece_bufs, tail_bufs) = rest_bufs.split_at_mut(n);
                        let (piece_src, tail_src) = rest_src.split_at((n * cs).min(rest_src.len()));
                        rest_bufs = tail_bufs;
                        rest_src = tail_src;
                        let copied = &self.copied;
                        scope.spawn(move |_| {
                            fill_chunks(piece_bufs, piece_src, cs, h);
                            add(&c.worker_pieces, 1);
                            add(&c.worker_bytes, piece_src.len());
                            note_copied(copied, piece_src.len());
                        });
                    }
                    fill_chunks(app_bufs, app_src, cs, h);
                    add(&c.app_bytes, app_src.len());
                });
            }
            _ => {
                add(&c.inline_copies, 1);
                fill_chunks(bufs, src, cs, h);
                add(&c.app_bytes, src.len());
            }
        }
    }

    /// Copies the bytes of `chunks`, in order, into `dst`: as many as fit
    /// (`min(total, dst.len())`), which it returns. Large copies are cut into one piece per
    /// worker plus one for the application thread, each writing its own part of `dst`.
    /// The chunks are plain data (no headroom): `Bytes`, `Vec<u8>`, `&[u8]`, ...
    pub fn copy_out<C: AsRef<[u8]> + Sync>(&self, chunks: &[C], dst: &mut [u8]) -> usize {
        self.copy_out_for(0, chunks, dst)
    }

    /// [`CopyWorkerPool::copy_out`] for the virtual socket `flow` (what a copy picker
    /// is told).
    pub fn copy_out_for<C: AsRef<[u8]> + Sync>(
        &self,
        flow: u64,
        chunks: &[C],
        dst: &mut [u8],
    ) -> usize {
        let total = chunks
            .iter()
            .map(|c| c.as_ref().len())
            .sum::<usize>()
            .min(dst.len());
        let dst = &mut dst[..total];
        let parts = self.parts(total);
        let c = &self.counters;
        match (&self.threads, parts) {
            (Some(threads), 2..) if self.picking() => {
                add(&c.parallel_copies, 1);
                add(&c.parallel_copies_out, 1);
                let mut pieces = Vec::with_capacity(parts);
                let mut rest = dst;
                let mut offset = 0;
                for p in 0..parts {
                    let end = total * (p + 1) / parts;
                    let (piece, tail) = rest.split_at_mut(end - offset);
                    rest = tail;
                    pieces.push((piece.len(), (offset, piece)));
                    offset = end;
                }
                self.run_picked(
                    threads,
                    flow,
                    CopyDirection::FromChannels,
                    pieces,
                    |(start, piece)| copy_range(chunks, start, piece),
                );
            }
            (Some(threads), 2..) => {
                add(&c.parallel_copies, 1);
                add(&c.parallel_copies_out, 1);
                threads.in_place_scope(|scope| {
                    let app_len = total / parts;
                    let (app_dst, mut rest) = dst.split_at_mut(app_len);
                    let mut offset = app_len;
                    for p in 1..parts {
                        let end = total * (p + 1) / parts;
                        let (piece, tail) = rest.split_at_mut(end - offset);
                        rest = tail;
                        let start = offset;
                        offset = end;
                        let copied = &self.copied;
                        scope.spawn(move |_| {
                            copy_range(chunks, start, piece);
                            add(&c.worker_pieces, 1);
                            add(&c.worker_bytes, piece.len());
                            note_copied(copied, piece.len());
                        });
                    }
                    copy_range(chunks, 0, app_dst);
                    add(&c.app_bytes, app_dst.len());
                });
            }
            _ => {
                add(&c.inline_copies, 1);
                copy_range(chunks, 0, dst);
                add(&c.app_bytes, total);
            }
        }
        total
    }

    /// How many pieces a copy of `len` bytes is cut into (1: inline).
    fn parts(&self, len: usize) -> usize {
        if self.threads.is_none() || len < self.small_copy_threshold || len == 0 {
            1
        } else {
            self.workers + 1
        }
    }
}

impl Drop for CopyWorkerPool {
    fn drop(&mut self) {
        // Dropping the rayon pool tells its threads to finish; no copy is in flight (every
        // copy returns only once its scope has completed), so they exit promptly.
        drop(self.threads.take());
        for h in self.handles.drain(..) {
            if h.join().is_err() {
                warn!("a copy worker thread panicked");
            }
        }
    }
}

/// Decrements the live-worker count when a worker thread ends (even by panic).
struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn pin_to(index: usize, core: Option<usize>, counters: &Counters) {
    let Some(id) = core else {
        warn!(index, "copy worker: no core to pin to, left unpinned");
        add(&counters.pin_failures, 1);
        return;
    };
    if core_affinity::set_for_current(core_affinity::CoreId { id }) {
        debug!(index, core = id, "copy worker pinned");
    } else {
        warn!(
            index,
            core = id,
            "copy worker: pinning failed, left unpinned"
        );
        add(&counters.pin_failures, 1);
    }
}

/// The calling thread's OS thread id, read from `/proc/thread-self` (Linux).
fn own_tid() -> Option<u64> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// Copies consecutive `chunk_size` pieces of `src` into `bufs` (one per buffer), each
/// after `headroom` zero bytes.
fn fill_chunks(bufs: &mut [BytesMut], src: &[u8], chunk_size: usize, headroom: usize) {
    for (buf, piece) in bufs.iter_mut().zip(src.chunks(chunk_size)) {
        buf.resize(headroom, 0);
        buf.extend_from_slice(piece);
    }
}

/// Copies `dst.len()` bytes of the concatenation of `chunks`, starting at byte `offset`.
fn copy_range<C: AsRef<[u8]>>(chunks: &[C], mut offset: usize, dst: &mut [u8]) {
    let mut written = 0;
    for chunk in chunks {
        let chunk = chunk.as_ref();
        if written == dst.len() {
            break;
        }
        if offset >= chunk.len() {
            offset -= chunk.len();
            continue;
        }
        let avail = &chunk[offset..];
        offset = 0;
        let n = avail.len().min(dst.len() - written);
        dst[written..written + n].copy_from_slice(&avail[..n]);
        written += n;
    }
}
