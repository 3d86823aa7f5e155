//! The process's default stack: the one [`VirtualStream::connect`](super::VirtualStream::connect)
//! and [`VirtualListener::bind`](super::VirtualListener::bind) use, installed explicitly
//! or built from `NETCHANNEL_*` environment variables.

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::time::Duration;

use super::auth::MIN_KEY_LEN;
use super::{Stack, StackError};
use crate::endpoint::Config;

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
/// switch or a string can be set there; the scheduler, `copy_config` and `vns_config`
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
pub fn default_stack() -> io::Result<Stack> {
    let mut slot = DEFAULT_STACK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = slot.as_ref() {
        return Ok(s.clone());
    }
    let stack = stack_from_env()?;
    *slot = Some(stack.clone());
    Ok(stack)
}

fn env_var(name: &'static str) -> Result<Option<String>, StackError> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(StackError::Env {
            name,
            msg: e.to_string(),
        }),
    }
}

fn env_parse<T: std::str::FromStr>(name: &'static str) -> Result<Option<T>, StackError>
where
    T::Err: fmt::Display,
{
    env_var(name)?
        .map(|v| {
            v.parse().map_err(|e: T::Err| StackError::Env {
                name,
                msg: e.to_string(),
            })
        })
        .transpose()
}

/// A switch's value: `0` (off) or `1` (on).
pub(crate) fn parse_switch(name: &'static str, v: &str) -> Result<bool, StackError> {
    match v {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(StackError::Env {
            name,
            msg: format!("{v:?}: expected 0 (off) or 1 (on)"),
        }),
    }
}

fn stack_from_env() -> Result<Stack, StackError> {
    let ifname = env_var("NETCHANNEL_INTERFACE")?.ok_or(StackError::Env {
        name: "NETCHANNEL_INTERFACE",
        msg: "not set, and no default stack installed (netchannel::set_default_stack)".into(),
    })?;
    let ipv4: Ipv4Addr = env_parse("NETCHANNEL_IPV4")?.ok_or(StackError::Env {
        name: "NETCHANNEL_IPV4",
        msg: "not set".into(),
    })?;
    let mut b = Stack::builder().interface(ifname).ipv4(ipv4);
    if let Some(n) = env_parse("NETCHANNEL_CHANNELS")? {
        b = b.channels(n);
    }
    if let Some(n) = env_parse("NETCHANNEL_LATENCY_CHANNELS")? {
        b = b.latency_channels(n);
    }
    if let Some(n) = env_parse("NETCHANNEL_COPY_WORKERS")? {
        b = b.copy_workers(n);
    }
    if let Some(port) = env_parse("NETCHANNEL_CHANNEL_PORT")? {
        b = b.channel_port(port);
    }
    if let Some(n) = env_parse("NETCHANNEL_SHARDS")? {
        b = b.shards(n);
    }
    if let Some(n) = env_parse("NETCHANNEL_BACKLOG")? {
        b = b.backlog(n);
    }
    match (
        env_parse::<usize>("NETCHANNEL_SEND_BUFFER")?,
        env_parse::<usize>("NETCHANNEL_RECV_BUFFER")?,
    ) {
        (None, None) => {}
        (send, recv) => {
            let d = Config::default();
            b = b.socket_buffers(send.unwrap_or(d.send_buffer), recv.unwrap_or(d.recv_buffer));
        }
    }
    if let Some(v) = env_var("NETCHANNEL_EXECUTE_PLANS")? {
        b = b.execute_plans(parse_switch("NETCHANNEL_EXECUTE_PLANS", &v)?);
    }
    if let Some(v) = env_var("NETCHANNEL_APPLICATION_RUNTIME")? {
        b = b.application_runtime(parse_switch("NETCHANNEL_APPLICATION_RUNTIME", &v)?);
    }
    if let Some(v) = env_var("NETCHANNEL_SCHEDULER")? {
        b = match v.as_str() {
            "round-robin" => b.scheduler(netsched::RoundRobin::default()),
            "source-port" => b.scheduler(netsched::SourcePort::default()),
            "isolating" => b.scheduler(netsched::Isolating::default()),
            _ => {
                return Err(StackError::Env {
                    name: "NETCHANNEL_SCHEDULER",
                    msg: format!("{v:?}: expected round-robin, source-port or isolating"),
                })
            }
        };
    }
    let ms = |name| env_parse::<u64>(name).map(|v| v.map(Duration::from_millis));
    if let Some(d) = ms("NETCHANNEL_CONNECT_TIMEOUT_MS")? {
        b = b.connect_timeout(d);
    }
    if let Some(d) = ms("NETCHANNEL_PREAMBLE_TIMEOUT_MS")? {
        b = b.preamble_timeout(d);
    }
    // Keep-alive idle time; 0 turns keep-alive off.
    if let Some(d) = ms("NETCHANNEL_KEEPALIVE_MS")? {
        b = b.keepalive((!d.is_zero()).then_some(d));
    }
    if let Some(d) = ms("NETCHANNEL_KEEPALIVE_INTERVAL_MS")? {
        b = b.keepalive_interval(d);
    }
    if let Some(n) = env_parse("NETCHANNEL_KEEPALIVE_PROBES")? {
        b = b.keepalive_probes(n);
    }
    if let Some(d) = ms("NETCHANNEL_USER_TIMEOUT_MS")? {
        b = b.user_timeout(d);
    }
    if let Some(ms) = env_parse::<u64>("NETCHANNEL_LINGER_MS")? {
        b = b.linger(Duration::from_millis(ms));
    }
    if let Some(key) = env_var("NETCHANNEL_CHANNEL_KEY")? {
        if key.len() < MIN_KEY_LEN {
            return Err(StackError::Env {
                name: "NETCHANNEL_CHANNEL_KEY",
                msg: format!("must be at least {MIN_KEY_LEN} bytes (32 random characters or more)"),
            });
        }
        b = b.channel_key(key);
    }
    if let Some(us) = env_parse::<u64>("NETCHANNEL_BUSY_POLL_US")? {
        let cores = env_var("NETCHANNEL_BUSY_POLL_CORES")?.ok_or(StackError::Env {
            name: "NETCHANNEL_BUSY_POLL_CORES",
            msg: "must list the cores that may spin (e.g. 6,7) when NETCHANNEL_BUSY_POLL_US is set"
                .into(),
        })?;
        let cores = cores
            .split(',')
            .map(|c| c.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StackError::Env {
                name: "NETCHANNEL_BUSY_POLL_CORES",
                msg: format!("a comma-separated list of core numbers: {e}"),
            })?;
        b = b.busy_poll(cores, Duration::from_micros(us));
    }
    #[cfg(target_os = "linux")]
    {
        if let Some(p) =
            env_parse::<netdriver::channel::PartialChecksums>("NETCHANNEL_PARTIAL_CHECKSUMS")?
        {
            b = b.partial_checksums(p);
        }
        if let Some(v) = env_var("NETCHANNEL_SYN_COOKIES")? {
            b = b.syn_cookies(parse_switch("NETCHANNEL_SYN_COOKIES", &v)?);
        }
        b.build()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = b;
        Err(StackError::Missing("AF_XDP (Linux only)"))
    }
}
