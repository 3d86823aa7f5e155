//! The process's default stack: the one [`VirtualStream::connect`](super::VirtualStream::connect)
//! and [`VirtualListener::bind`](super::VirtualListener::bind) use, installed explicitly
//! or built from `NETCHANNEL_*` environment variables.

use std::io;
use std::sync::Mutex;

use super::Stack;

static DEFAULT_STACK: Mutex<Option<Stack>> = Mutex::new(None);

/// Installs the process's default stack, used by [`VirtualStream::connect`] and
/// [`VirtualListener::bind`]; returns the previous one.
pub fn set_default_stack(stack: Stack) -> Option<Stack> {
    DEFAULT_STACK
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .replace(stack)
}

/// Removes the process's default stack (it stops once its other handles are gone).
pub fn clear_default_stack() -> Option<Stack> {
    DEFAULT_STACK
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
}

/// The process's default stack: the installed one ([`set_default_stack`]), or else one
/// built (and installed) from the environment. Every builder option that is a number, a
/// switch or a string can be set there (and [`Stack::builder`] takes these as its
/// defaults too); the scheduler, `copy_config` and `vns_config`
/// (structures) only through [`set_default_stack`]. A variable that does not parse fails
/// with [`StackError::Env`] naming it and saying what it expects.
///
/// | variable | builder option |
/// |---|---|
/// | `NETCHANNEL_INTERFACE` (required) | [`StackBuilder::interface`](super::StackBuilder::interface) |
/// | `NETCHANNEL_IPV4` (required) | [`StackBuilder::ipv4`](super::StackBuilder::ipv4) |
/// | `NETCHANNEL_CHANNELS` | [`StackBuilder::channels`](super::StackBuilder::channels) |
/// | `NETCHANNEL_LATENCY_CHANNELS` | [`StackBuilder::latency_channels`](super::StackBuilder::latency_channels) |
/// | `NETCHANNEL_COPY_WORKERS` | [`StackBuilder::copy_workers`](super::StackBuilder::copy_workers) |
/// | `NETCHANNEL_CHANNEL_PORT` | [`StackBuilder::channel_port`](super::StackBuilder::channel_port) |
/// | `NETCHANNEL_BACKLOG` | [`StackBuilder::backlog`](super::StackBuilder::backlog) |
/// | `NETCHANNEL_SEND_BUFFER`, `NETCHANNEL_RECV_BUFFER` (bytes) | [`StackBuilder::socket_buffers`](super::StackBuilder::socket_buffers) |
/// | `NETCHANNEL_SCHEDULER` (`round-robin`, `source-port`, `isolating`) | [`StackBuilder::scheduler`](super::StackBuilder::scheduler) |
/// | `NETCHANNEL_EXECUTE_PLANS` (`0`, `1`) | [`StackBuilder::execute_plans`](super::StackBuilder::execute_plans) |
/// | `NETCHANNEL_SHARDS` | [`StackBuilder::shards`](super::StackBuilder::shards) |
/// | `NETCHANNEL_CONNECT_TIMEOUT_MS` | [`StackBuilder::connect_timeout`](super::StackBuilder::connect_timeout) |
/// | `NETCHANNEL_PREAMBLE_TIMEOUT_MS` | [`StackBuilder::preamble_timeout`](super::StackBuilder::preamble_timeout) |
/// | `NETCHANNEL_KEEPALIVE_MS` (0: off) | [`StackBuilder::keepalive`](super::StackBuilder::keepalive) |
/// | `NETCHANNEL_KEEPALIVE_INTERVAL_MS` | [`StackBuilder::keepalive_interval`](super::StackBuilder::keepalive_interval) |
/// | `NETCHANNEL_KEEPALIVE_PROBES` | [`StackBuilder::keepalive_probes`](super::StackBuilder::keepalive_probes) |
/// | `NETCHANNEL_USER_TIMEOUT_MS` | [`StackBuilder::user_timeout`](super::StackBuilder::user_timeout) |
/// | `NETCHANNEL_APPLICATION_RUNTIME` (`0`, `1`) | [`StackBuilder::application_runtime`](super::StackBuilder::application_runtime) |
/// | `NETCHANNEL_LINGER_MS` | [`StackBuilder::linger`](super::StackBuilder::linger) |
/// | `NETCHANNEL_CHANNEL_KEY` | [`StackBuilder::channel_key`](super::StackBuilder::channel_key) |
/// | `NETCHANNEL_BUSY_POLL_US` with `NETCHANNEL_BUSY_POLL_CORES` | [`StackBuilder::busy_poll`](super::StackBuilder::busy_poll) |
/// | `NETCHANNEL_PARTIAL_CHECKSUMS` (`auto`, `accept`, `reject`) | `StackBuilder::partial_checksums` |
/// | `NETCHANNEL_SYN_COOKIES` (`0`, `1`) | `StackBuilder::syn_cookies` |
/// | `NETCHANNEL_XDP_MODE` (`auto`, `copy`, `zerocopy`) | `StackBuilder::xdp_mode` |
/// | `NETCHANNEL_XDP_TX_CHECKSUM` (`0`, `1`) | `StackBuilder::xdp_tx_checksum` |
/// | `NETCHANNEL_RSS_ALIGN` (`0`, `1`) | `StackBuilder::rss_align` |
/// | `NETCHANNEL_LINK` (`xdp` or `af_xdp`, `packet` or `af_packet`) | `StackBuilder::link` |
pub fn default_stack() -> io::Result<Stack> {
    let mut slot = DEFAULT_STACK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = slot.as_ref() {
        return Ok(s.clone());
    }
    let stack = super::env::stack_from_env()?;
    *slot = Some(stack.clone());
    Ok(stack)
}
