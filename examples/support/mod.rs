//! What the server examples (`echo`, `kv`) share: size arguments, error messages with
//! their causes, stopping on SIGINT/SIGTERM, and naming a connection's kind. Included by
//! each with `#[path]`; not an example itself (no `main.rs`).
// Each example uses its own part of this module.
#![allow(dead_code)]

/// The `--help` epilogue: the environment variables that tune the stack of a server
/// example (`Stack::builder()` takes every `NETCHANNEL_*` variable as a default; the full
/// table is at `vns::stack::default_stack`).
pub const ENV_HELP: &str = "\
Environment (defaults for the stack; command-line options win):
  NETCHANNEL_BACKLOG=N                 connections waiting to be accepted (128)
  NETCHANNEL_SYN_COOKIES=0|1           SYN cookies when a backlog is full (1)
  NETCHANNEL_PARTIAL_CHECKSUMS=auto|accept|reject
                                       trust a Linux peer's unfinished checksums (auto: veth)
  NETCHANNEL_PREAMBLE_TIMEOUT_MS=N     a new channel's time to identify itself (5000)
  NETCHANNEL_CHANNEL_KEY=SECRET        authenticate channels (at least 16 bytes)
  NETCHANNEL_KEEPALIVE_MS=N            idle time before channels between stacks are probed,
                                       0: off (10000; plain-TCP streams: off)
  NETCHANNEL_KEEPALIVE_INTERVAL_MS=N, NETCHANNEL_KEEPALIVE_PROBES=N (1000, 5)
  NETCHANNEL_USER_TIMEOUT_MS=N         unacknowledged data without progress fails (30000)
  NETCHANNEL_CONNECT_TIMEOUT_MS=N      opening channels (10000)
  NETCHANNEL_CHANNELS=N, NETCHANNEL_LATENCY_CHANNELS=N, NETCHANNEL_SHARDS=N
  NETCHANNEL_SEND_BUFFER=BYTES, NETCHANNEL_RECV_BUFFER=BYTES   per socket
  NETCHANNEL_LINGER_MS=N               graceful close bound
  NETCHANNEL_XDP_MODE=auto|copy|zerocopy
                                       AF_XDP zero copy where the driver has it (auto)
  NETCHANNEL_RSS_ALIGN=0|1             channels' ports chosen for the NIC's RSS (1)
  RUST_LOG=netdriver=debug,vns=debug   logs (tracing)
";

/// Parses `123`, `100M`, `1G`, `64k`, `64KiB`, `1GiB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a size (examples: 1000000, 100M, 1G, 64MiB)"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use k, M, G, KiB, MiB, GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// `e` and its causes in one line ("starting ...: not permitted ...: Operation not
/// permitted"), skipping a cause whose text the message already contains.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

#[cfg(target_os = "linux")]
pub use linux::*;

#[cfg(target_os = "linux")]
mod linux {
    use nix::sys::signal::{SigSet, Signal};
    use tokio::sync::watch;

    /// Blocks SIGINT and SIGTERM in the calling thread (call it before starting other
    /// threads, so they inherit the mask) and waits for them on a thread of their own
    /// (`<program>-signals`), which sets the returned flag and says so on stderr.
    pub fn stop_on_signals(program: &'static str) -> std::io::Result<watch::Receiver<bool>> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGINT);
        set.add(Signal::SIGTERM);
        set.thread_block().map_err(|e| {
            std::io::Error::new(
                std::io::Error::from(e).kind(),
                format!("blocking SIGINT/SIGTERM: {e}"),
            )
        })?;
        let (tx, rx) = watch::channel(false);
        std::thread::Builder::new()
            .name(format!("{program}-signals"))
            .spawn(move || {
                if let Ok(sig) = set.wait() {
                    tracing::info!(?sig, "stopping");
                    eprintln!("{program}: {sig}, shutting down");
                    let _ = tx.send(true);
                }
            })?;
        Ok(rx)
    }

    /// Resolves once the stop flag is set (never, if its sender is gone without it).
    pub async fn stopped(stop: &mut watch::Receiver<bool>) {
        if stop.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Our stack on `ifname` (AF_XDP on every queue, channel port 9000), its channels
    /// authenticated with `channel_key` when one is given (`--channel-key`).
    pub fn build_stack(
        ifname: &str,
        ipv4: std::net::Ipv4Addr,
        channel_key: Option<&str>,
    ) -> Result<netchannel::Stack, netchannel::StackError> {
        let mut builder = netchannel::Stack::builder().interface(ifname).ipv4(ipv4);
        if let Some(k) = channel_key {
            builder = builder.channel_key(k);
        }
        builder.build()
    }

    /// How a connection reached the server, as the examples print it.
    pub fn connection_kind(s: &netchannel::VirtualStream) -> &'static str {
        if s.is_plain_tcp() {
            "plain-tcp"
        } else {
            "netchannel"
        }
    }
}
