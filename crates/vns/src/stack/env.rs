//! The stack's configuration from the environment: every `NETCHANNEL_*` variable (the
//! table at [`default_stack`](super::default_stack)) is a default for the matching
//! [`StackBuilder`] option. [`Stack::builder`] starts from them, so a stack that a program
//! builds (as the examples do) can be told from outside, and the program's own builder
//! calls, made after, win; the default stack is built from them alone. A variable that
//! does not parse is an error naming it: at once for the default stack, at `build` for a
//! builder.

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use super::auth::MIN_KEY_LEN;
use super::{Stack, StackBuilder, StackError};
use crate::endpoint::Config;

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

/// [`Stack::builder`]: the built-in defaults, then the environment's. A variable that does
/// not parse leaves the built-in defaults and is reported by `build`.
pub(super) fn builder() -> StackBuilder {
    apply(StackBuilder::default()).unwrap_or_else(|e| StackBuilder::default().with_env_error(e))
}

/// Applies every `NETCHANNEL_*` variable that is set to `b` (see [`default_stack`]'s
/// table); fails on the first that does not parse, naming it.
///
/// [`default_stack`]: super::default_stack
pub(super) fn apply(mut b: StackBuilder) -> Result<StackBuilder, StackError> {
    if let Some(ifname) = env_var("NETCHANNEL_INTERFACE")? {
        b = b.interface(ifname);
    }
    if let Some(ipv4) = env_parse::<Ipv4Addr>("NETCHANNEL_IPV4")? {
        b = b.ipv4(ipv4);
    }
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
        use netdriver::link::xdp::{BindMode, BIND_MODE_ENV};
        match BindMode::from_env() {
            Ok(Some(mode)) => b = b.xdp_mode(mode),
            Ok(None) => {}
            Err(e) => {
                return Err(StackError::Env {
                    name: BIND_MODE_ENV,
                    msg: e.to_string(),
                })
            }
        }
        if let Some(v) = env_var(netdriver::link::xdp::TX_CHECKSUM_ENV)? {
            b = b.xdp_tx_checksum(parse_switch(netdriver::link::xdp::TX_CHECKSUM_ENV, &v)?);
        }
        if let Some(v) = env_var("NETCHANNEL_RSS_ALIGN")? {
            b = b.rss_align(parse_switch("NETCHANNEL_RSS_ALIGN", &v)?);
        }
        if let Some(link) = env_parse::<netdriver::channel::LinkKind>("NETCHANNEL_LINK")? {
            b = b.link(link);
        }
    }
    Ok(b)
}

/// The default stack from the environment alone: [`apply`], with `NETCHANNEL_INTERFACE`
/// and `NETCHANNEL_IPV4` required.
pub(super) fn stack_from_env() -> Result<Stack, StackError> {
    let b = apply(StackBuilder::default())?;
    if !b.has_interface() {
        return Err(StackError::Env {
            name: "NETCHANNEL_INTERFACE",
            msg: "not set, and no default stack installed (netchannel::set_default_stack)".into(),
        });
    }
    if !b.has_ipv4() {
        return Err(StackError::Env {
            name: "NETCHANNEL_IPV4",
            msg: "not set".into(),
        });
    }
    #[cfg(target_os = "linux")]
    {
        b.build()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = b;
        Err(StackError::Missing("AF_XDP (Linux only)"))
    }
}
