//! The benches' remote-peer mode: instead of a test bed with both ends in one process,
//! one netchannel stack on a real interface runs the bench's client side against an
//! `ncperf server` on another host, as `ncperf client` does, speaking ncperf's protocol
//! (`netchannel::perf_proto`: the hello, the requests and their byte-for-byte checks, the
//! bulk pattern and the server's report).
//!
//! - `NETCHANNEL_BENCH_PEER=IPV4[:PORT]`: the peer (port default 7700). Its netchannel
//!   server (`ncperf server -i IFACE -a ADDR`) and its kernel TCP server
//!   (`ncperf server --kernel -a ADDR`) both listen on PORT, the first as a virtual
//!   listener, the second as a kernel socket; each one's latency application listens on
//!   PORT+1.
//! - `NETCHANNEL_BENCH_INTERFACE=IFACE`, `NETCHANNEL_BENCH_ADDRESS=IPV4`: the local stack's
//!   interface and its address there (run the bench in the interface's namespace).
//!
//! A misconfiguration (a variable missing or malformed, no such interface, no privileges,
//! a peer that does not answer) stops the bench with one line and exit status 1.
#![allow(dead_code)]

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use netchannel::perf_proto::{self, Op, Pattern, Requests, SinkReport, REPORT_LEN};
use netchannel::{AppClass, Stack, StackError, VirtualStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;

use super::vns::{env_or, vns_config, wait_for_previous_stack};

/// The peer's address variable.
pub const PEER_VAR: &str = "NETCHANNEL_BENCH_PEER";
/// The local interface variable.
pub const INTERFACE_VAR: &str = "NETCHANNEL_BENCH_INTERFACE";
/// The local address variable.
pub const ADDRESS_VAR: &str = "NETCHANNEL_BENCH_ADDRESS";

/// Longest wait for one connect or exchange before the bench fails.
pub const STEP: Duration = Duration::from_secs(10);

/// What stops a bench in remote mode, each in one line with what to do.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The peer variable is not an address.
    #[error("NETCHANNEL_BENCH_PEER={0:?} is not IPV4 or IPV4:PORT")]
    BadPeer(String),
    /// The peer is set without the local stack's interface or address.
    #[error(
        "NETCHANNEL_BENCH_PEER is set but {0} is not: the remote mode needs \
         NETCHANNEL_BENCH_INTERFACE=IFACE and NETCHANNEL_BENCH_ADDRESS=IPV4 for the local \
         netchannel stack"
    )]
    Missing(&'static str),
    /// The address variable is not an IPv4 address.
    #[error("NETCHANNEL_BENCH_ADDRESS={0:?} is not an IPv4 address")]
    BadAddress(String),
    /// The interface is not in this namespace.
    #[error(
        "no interface {0:?} in this network namespace; set NETCHANNEL_BENCH_INTERFACE to one \
         that `ip -br link` lists, or run the bench inside the interface's namespace"
    )]
    NoSuchInterface(String),
    /// No privileges for AF_XDP.
    #[error(
        "not permitted to start netchannel on {0}: run as root (AF_XDP and XDP need \
         CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF and CAP_SYS_ADMIN)"
    )]
    NotPermitted(String),
    /// The stack did not start for another reason.
    #[error("starting netchannel on {iface} ({addr}): {source}")]
    Stack {
        /// The interface.
        iface: String,
        /// The address.
        addr: Ipv4Addr,
        /// Why.
        source: StackError,
    },
    /// The peer's server did not answer a first request.
    #[error("peer {peer} unreachable over {transport}: {source}; start `{start}` there first")]
    Peer {
        /// The server's address.
        peer: SocketAddr,
        /// netchannel or kernel TCP.
        transport: &'static str,
        /// The command that serves it.
        start: &'static str,
        /// What went wrong.
        source: io::Error,
    },
    /// No runtime.
    #[error("starting a tokio runtime: {0}")]
    Runtime(io::Error),
}

/// The remote mode's settings, from the environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// The peer's main port (both servers); the latency application's is the next.
    pub peer: SocketAddr,
    /// The local stack's interface.
    pub iface: String,
    /// The local stack's address.
    pub addr: Ipv4Addr,
}

impl Config {
    /// `Ok(None)` when `NETCHANNEL_BENCH_PEER` is unset (the bench runs on its test bed).
    pub fn from_env() -> Result<Option<Config>, RemoteError> {
        let Ok(peer) = std::env::var(PEER_VAR) else {
            return Ok(None);
        };
        let peer = parse_peer(&peer).ok_or_else(|| RemoteError::BadPeer(peer.clone()))?;
        let iface = std::env::var(INTERFACE_VAR)
            .ok()
            .filter(|i| !i.is_empty())
            .ok_or(RemoteError::Missing(INTERFACE_VAR))?;
        let addr = std::env::var(ADDRESS_VAR).map_err(|_| RemoteError::Missing(ADDRESS_VAR))?;
        let addr = addr
            .trim()
            .parse()
            .map_err(|_| RemoteError::BadAddress(addr.clone()))?;
        Ok(Some(Config { peer, iface, addr }))
    }
}

/// `IPV4` or `IPV4:PORT`, the port by default ncperf's.
fn parse_peer(s: &str) -> Option<SocketAddr> {
    let s = s.trim();
    if let Ok(a) = s.parse::<SocketAddrV4>() {
        return Some(a.into());
    }
    let ip: Ipv4Addr = s.parse().ok()?;
    Some(SocketAddrV4::new(ip, perf_proto::DEFAULT_PORT).into())
}

/// The local stack and where the peer's servers listen.
pub struct Remote {
    /// The stack on the local interface.
    pub stack: Stack,
    /// The settings.
    pub config: Config,
    /// The peer's latency application (main port + 1).
    pub lat_peer: SocketAddr,
}

/// The remote mode of bench `name`: `None` when `NETCHANNEL_BENCH_PEER` is unset; else
/// the local stack (`channels` throughput channels per peer, 0 for the stack's default,
/// and `latency` latency channels) and the benches' runtime, after one checked request
/// to each of the peer's servers (netchannel; kernel TCP when `kernel`). Any failure
/// prints one line and exits with status 1.
pub fn start(
    name: &str,
    channels: usize,
    latency: usize,
    kernel: bool,
) -> Option<(Remote, Runtime)> {
    match try_start(channels, latency, kernel) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(bench = name, error = %e, "remote mode");
            eprintln!("{name}: {e}");
            std::process::exit(1);
        }
    }
}

fn try_start(
    channels: usize,
    latency: usize,
    kernel: bool,
) -> Result<Option<(Remote, Runtime)>, RemoteError> {
    let Some(config) = Config::from_env()? else {
        return Ok(None);
    };
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_or("NETCHANNEL_BENCH_WORKERS", 2usize).max(1))
        .enable_all()
        .build()
        .map_err(RemoteError::Runtime)?;
    // A stack this process stopped before (another configuration of the same bench)
    // detaches its program first.
    wait_for_previous_stack(&config.iface);
    let mut b = Stack::builder()
        .interface(config.iface.clone())
        .ipv4(config.addr)
        .vns_config(vns_config())
        .latency_channels(latency)
        .connect_timeout(STEP);
    if channels > 0 {
        b = b.channels(channels);
    }
    b = if std::env::var("NETCHANNEL_BENCH_PLACEMENT").as_deref() == Ok("own") {
        b.application_runtime(false)
    } else {
        b.runtime(rt.handle().clone())
    };
    let stack = b.build().map_err(|e| match e {
        StackError::NoSuchInterface(i) => RemoteError::NoSuchInterface(i),
        StackError::NotPermitted(_) => RemoteError::NotPermitted(config.iface.clone()),
        source => RemoteError::Stack {
            iface: config.iface.clone(),
            addr: config.addr,
            source,
        },
    })?;
    let lat_peer = SocketAddr::new(config.peer.ip(), config.peer.port().wrapping_add(1));
    let remote = Remote {
        stack,
        config,
        lat_peer,
    };
    let peer = remote.config.peer;
    rt.block_on(async {
        let mut v = remote.virtual_conn(Op::Echo, false).await?;
        Requests::new(64, 0).exchange(&mut v).await?;
        close_echo(v).await
    })
    .map_err(|source| {
        remote.stack.abort();
        RemoteError::Peer {
            peer,
            transport: "netchannel",
            start: "ncperf server -i IFACE -a ADDR",
            source,
        }
    })?;
    if kernel {
        rt.block_on(async {
            let mut k = remote.kernel_conn(Op::Echo, false).await?;
            Requests::new(64, 0).exchange(&mut k).await?;
            close_echo(k).await
        })
        .map_err(|source| {
            remote.stack.abort();
            RemoteError::Peer {
                peer,
                transport: "kernel TCP",
                start: "ncperf server --kernel -a ADDR",
                source,
            }
        })?;
    }
    Ok(Some((remote, rt)))
}

/// `f` within [`STEP`], or a time-out error naming `what`.
pub async fn step<T>(
    what: &str,
    f: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match tokio::time::timeout(STEP, f).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what}: no answer within {STEP:?}"),
        )),
    }
}

impl Remote {
    /// The peer's address for a main-port or latency-port connection.
    fn to(&self, latency: bool) -> SocketAddr {
        if latency {
            self.lat_peer
        } else {
            self.config.peer
        }
    }

    /// The first line of a remote run's output.
    pub fn banner(&self, name: &str) -> String {
        format!(
            "{name}: against remote peer {} (ncperf server: netchannel and kernel TCP on port \
             {}, latency application on {}), local netchannel stack on {} ({})",
            self.config.peer.ip(),
            self.config.peer.port(),
            self.lat_peer.port(),
            self.config.iface,
            self.config.addr
        )
    }

    /// A virtual stream to the peer's netchannel server, its hello for `op` sent;
    /// latency-class (set before the connect) to its latency application when `latency`.
    pub async fn virtual_conn(&self, op: Op, latency: bool) -> io::Result<VirtualStream> {
        self.virtual_conn_arg(op, 0, latency).await
    }

    /// [`virtual_conn`](Self::virtual_conn) with the hello's argument.
    pub async fn virtual_conn_arg(
        &self,
        op: Op,
        arg: u16,
        latency: bool,
    ) -> io::Result<VirtualStream> {
        let to = self.to(latency);
        let socket = self.stack.socket();
        if latency {
            socket.set_app_class(AppClass::Latency)?;
        }
        let mut s = step(&format!("connecting to {to}"), socket.connect(to)).await?;
        s.write_all(&perf_proto::hello(op, arg)).await?;
        Ok(s)
    }

    /// A kernel TCP connection (`TCP_NODELAY`) to the peer's kernel server, its hello for
    /// `op` sent; to its latency application when `latency`.
    pub async fn kernel_conn(&self, op: Op, latency: bool) -> io::Result<TcpStream> {
        self.kernel_conn_arg(op, 0, latency).await
    }

    /// [`kernel_conn`](Self::kernel_conn) with the hello's argument.
    pub async fn kernel_conn_arg(&self, op: Op, arg: u16, latency: bool) -> io::Result<TcpStream> {
        let to = self.to(latency);
        let mut s = step(&format!("connecting to {to}"), TcpStream::connect(to)).await?;
        s.set_nodelay(true)?;
        s.write_all(&perf_proto::hello(op, arg)).await?;
        Ok(s)
    }

    /// Stops the local stack.
    pub fn stop(self) {
        self.stack.abort();
    }
}

/// Ends an echo connection: a FIN, then the server's (a bounded wait: a server slow to
/// close is not a wrong answer, bytes after the last response are).
pub async fn close_echo<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> io::Result<()> {
    s.shutdown().await?;
    let mut rest = [0u8; 64];
    match tokio::time::timeout(STEP, s.read(&mut rest)).await {
        Ok(Ok(0)) | Err(_) => Ok(()),
        Ok(Ok(_)) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the server sent bytes after the last response",
        )),
        Ok(Err(e)) => Err(e),
    }
}

/// One bulk stream to a [`Op::Sink`] connection: `total` bytes of ncperf's pattern from
/// offset 0, then the end of stream; the server's report must say it read exactly those
/// bytes and every one matched.
pub async fn sink_transfer<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    pattern: &Pattern,
    total: u64,
) -> io::Result<()> {
    let mut sent = 0u64;
    while sent < total {
        let n = (total - sent).min(perf_proto::BLOCK as u64) as usize;
        s.write_all(pattern.at(sent, n)).await?;
        sent += n as u64;
    }
    s.shutdown().await?;
    let mut r = [0u8; REPORT_LEN];
    step("the server's report", s.read_exact(&mut r)).await?;
    let report = SinkReport::decode(&r);
    if report.bytes != total || !report.intact {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the server read {} of {total} bytes, {}",
                report.bytes,
                if report.intact {
                    "all of them the pattern's"
                } else {
                    "some of them not the pattern's"
                }
            ),
        ));
    }
    Ok(())
}

impl Remote {
    /// One bulk transfer of `total` bytes on a fresh [`Op::Sink`] connection to the
    /// peer's netchannel server (`kernel`: its kernel TCP server), checked by the server:
    /// the time from the connect to the server's report, as the bed's transfers are timed
    /// from the connect to the receiver's end of stream.
    pub async fn timed_sink(
        &self,
        pattern: &Pattern,
        total: u64,
        kernel: bool,
    ) -> io::Result<Duration> {
        let t = std::time::Instant::now();
        if kernel {
            let s = self.kernel_conn(Op::Sink, false).await?;
            sink_transfer(s, pattern, total).await?;
        } else {
            let s = self.virtual_conn(Op::Sink, false).await?;
            sink_transfer(s, pattern, total).await?;
        }
        Ok(t.elapsed())
    }
}

/// The body of a one-shot request of `size` bytes for connector `tag`.
pub fn one_shot_body(size: usize, tag: u64) -> Vec<u8> {
    (0..size).map(|b| b as u8 ^ tag as u8).collect()
}

/// One request on a fresh [`Op::OneShot`] connection (its hello already sent, with the
/// body's length): writes `body`, reads its echo, checks it, and the server's close.
pub async fn one_shot<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, body: &[u8]) -> io::Result<()> {
    s.write_all(body).await?;
    let mut back = vec![0u8; body.len() + 1];
    step("a one-shot request", s.read_exact(&mut back[..body.len()])).await?;
    if back[..body.len()] != *body {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the one-shot response differs from its request",
        ));
    }
    // The server closes after its answer: nothing more comes.
    let n = step("the server's close", s.read(&mut back[body.len()..])).await?;
    if n != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the server sent more than the one-shot response",
        ));
    }
    Ok(())
}

/// Stops the bench after a failure in remote mode: one line, exit status 1.
pub fn fail(name: &str, e: impl std::fmt::Display) -> ! {
    tracing::error!(bench = name, error = %e, "remote run failed");
    eprintln!("{name}: {e}");
    std::process::exit(1);
}
