//! How a stack is sized from its host and settings: shards and their endpoints, socket
//! buffers, the copy path, and the default channel count.

use super::{shard, StackError};
use crate::copy::{CopyConfig, CopyWorkerPool};
use crate::endpoint::{Config, Endpoint};
use crate::wire::HEADER_LEN;
use netsched::NetScheduler;
use tracing::{debug, warn};

/// The default number of shards: the cores the building thread may run on, at most 16.
pub(super) fn default_shards() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, 16)
}

/// One endpoint per shard, each with its share of the bounds and its own instance of the
/// scheduler; one shard when the scheduler cannot be forked. With `latency` (the stack
/// has latency channels), one more: the latency shard ([`crate::ShardOf`]), for the
/// latency-class sockets connected as such and the peer's.
pub(super) fn shard_endpoints(
    vns: &Config,
    scheduler: Box<dyn NetScheduler>,
    shards: Option<usize>,
    latency: bool,
) -> Result<Vec<Endpoint>, StackError> {
    let latency_ports = if latency {
        crate::ShardOf::latency_ports_in(vns.ephemeral_ports)
    } else {
        None
    };
    let mut n = shards
        .unwrap_or_else(default_shards)
        .clamp(1, shard::MAX_SHARDS - usize::from(latency_ports.is_some()));
    // Every shard needs ephemeral ports of its own.
    let span = usize::from(vns.ephemeral_ports.1 - vns.ephemeral_ports.0) + 1;
    let latency_span = latency_ports.map_or(0, |(lo, hi)| usize::from(hi - lo) + 1);
    n = n.min(span - latency_span) + usize::from(latency_ports.is_some());
    let mut schedulers = vec![scheduler];
    while schedulers.len() < n {
        match schedulers[0].fork() {
            Some(s) => schedulers.push(s),
            None => {
                if shards.is_some_and(|s| s > 1) {
                    warn!("the scheduler cannot be forked (NetScheduler::fork); the stack runs one shard");
                } else {
                    debug!("the scheduler cannot be forked; one shard");
                }
                schedulers.truncate(1);
                n = 1;
                break;
            }
        }
    }
    // The latency shard takes a sixteenth of each bound (its share of the ports), the
    // others share the rest evenly: the configured bounds hold for the stack as a whole.
    let latency_index = latency_ports.filter(|_| n >= 2).map(|_| n - 1);
    let bulk = n - usize::from(latency_index.is_some());
    let share = |v: usize, min: usize, i: usize| {
        if Some(i) == latency_index {
            (v / 16).max(min)
        } else if latency_index.is_some() {
            ((v - v / 16) / bulk).max(min)
        } else {
            (v / n).max(min)
        }
    };
    schedulers
        .into_iter()
        .enumerate()
        .map(|(i, scheduler)| {
            let mut c = vns.clone();
            if n > 1 {
                c.channel_budget = share(vns.channel_budget, vns.max_chunk_payload, i);
                c.peer_budget = share(vns.peer_budget, c.channel_budget, i);
                c.max_peer_sockets = share(vns.max_peer_sockets, 1, i);
                c.max_sockets = share(vns.max_sockets, 1, i);
                c.rng_seed = vns.rng_seed.map(|s| s.wrapping_add(i as u64));
            }
            c.shard = crate::endpoint::ShardOf {
                index: i as u16,
                count: n as u16,
                // One shard alone owns everything (the scheduler could not be forked).
                latency_ports: latency_ports.filter(|_| n >= 2),
            };
            Endpoint::new(c, scheduler).map_err(StackError::from)
        })
        .collect()
}

/// `c` with these socket buffers, the credit window and its update threshold scaled with
/// the receive buffer (a socket's own buffers scale the same way, `Config::buffers`).
pub(super) fn with_socket_buffers(c: Config, send: usize, recv: usize) -> Config {
    let b = c.buffers(&crate::endpoint::SocketOptions {
        send_buffer: Some(send),
        recv_buffer: Some(recv),
        ..Default::default()
    });
    Config {
        send_buffer: b.send,
        recv_buffer: b.recv,
        credit_window: b.window,
        credit_update_threshold: b.update_threshold,
        ..c
    }
}

/// The default virtual-socket configuration of a stack with copy workers: the default
/// send buffer (256 KiB) is below the default small-copy threshold (512 KiB, where a
/// hand-off starts to pay), so the workers would never copy writes. Send and receive buffers of
/// four times the threshold let a large write or read be shared while the rest of the
/// buffer is in flight; the credit window is twice the receive buffer (the proportion the
/// defaults had before their credit became equal to the buffer; not measured again with
/// copy workers).
pub(super) fn copy_worker_buffers(threshold: usize) -> Config {
    let d = Config::default();
    let buffer = threshold
        .saturating_mul(4)
        .clamp(d.send_buffer.max(d.max_chunk_payload), 64 << 20);
    Config {
        send_buffer: buffer,
        recv_buffer: buffer,
        credit_window: 2 * buffer,
        credit_update_threshold: buffer / 2,
        ..d
    }
}

/// The copy workers of a stack and which transfers use them.
pub(crate) struct CopyPath {
    pub(crate) pool: CopyWorkerPool,
    /// Writes of at least this many bytes go through the workers (the pool's small-copy
    /// threshold); `None` when the send buffer could never take that much at once.
    pub(crate) write_min: Option<usize>,
    /// Reads into buffers of at least this many bytes copy out through the workers;
    /// `None` when the receive buffer could never hold that much.
    pub(crate) read_min: Option<usize>,
}

impl CopyPath {
    pub(super) fn new(
        workers: usize,
        config: CopyConfig,
        vns: &Config,
    ) -> Result<Option<Self>, StackError> {
        if workers == 0 {
            return Ok(None);
        }
        vns.validate()?;
        let threshold = config.small_copy_threshold;
        let pool = CopyWorkerPool::new(CopyConfig {
            workers,
            chunk_size: vns.max_chunk_payload,
            headroom: HEADER_LEN,
            ..config
        })
        .map_err(StackError::CopyWorkers)?;
        let usable = |buffer: usize| (buffer >= threshold).then_some(threshold.max(1));
        let path = CopyPath {
            pool,
            write_min: usable(vns.send_buffer),
            read_min: usable(vns.recv_buffer),
        };
        if path.write_min.is_none() || path.read_min.is_none() {
            warn!(
                threshold,
                send_buffer = vns.send_buffer,
                recv_buffer = vns.recv_buffer,
                "copy workers: a socket buffer is smaller than the small-copy threshold, so \
                 the workers never copy in that direction (raise the buffers with \
                 vns_config or lower the threshold with copy_config)"
            );
        }
        Ok(Some(path))
    }
}

/// The [`StackBuilder::channels`] a stack takes by default on hosts with cores to spare.
pub const DEFAULT_CHANNELS: usize = 4;

/// The throughput channels per peer a stack opens when its user sets none
/// ([`StackBuilder::channels`]): one where the process may run on fewer than 4 `cores`
/// (every channel is a TCP connection whose work shares those cores with the
/// application, and more of them only split the batches), [`DEFAULT_CHANNELS`]
/// otherwise.
pub(crate) fn auto_channels(cores: usize) -> usize {
    if cores < 4 {
        1
    } else {
        DEFAULT_CHANNELS
    }
}
