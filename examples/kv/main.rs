//! A small in-memory key-value server speaking the Redis protocol (RESP2) on netchannel's
//! `VirtualListener`, so that standard Redis clients and benchmark tools (`redis-cli`,
//! `redis-benchmark`, client libraries) work against it unchanged, over plain TCP, and
//! programs on a netchannel `Stack` reach it over NetChannel.
//!
//! ```text
//! kv --interface IFACE --ipv4 ADDR --listen PORT [--max-connections N] [--max-keys N]
//!    [--max-memory SIZE] [--max-request SIZE] [--max-request-memory SIZE]
//!    [--timeout-secs S]
//! ```
//!
//! Commands (names in any case, arity errors and replies as Redis gives them): `PING
//! [msg]`, `ECHO msg`, `GET key`, `SET key value [NX|XX] [EX s|PX ms]` (other SET options
//! get an error reply), `DEL key...`, `EXISTS key...`, `INCR key`, `MGET key...`, `MSET
//! key value...`, `DBSIZE`, `FLUSHDB`, `FLUSHALL`, `SELECT 0`, `QUIT`, and what clients
//! send when they connect: `CONFIG GET` (`save`, `appendonly`, `maxmemory`, `databases`),
//! `COMMAND` / `COMMAND DOCS|COUNT|INFO|LIST`, `CLIENT SETNAME|SETINFO|GETNAME`, `HELLO
//! [2]`. Anything else is `-ERR unknown command ...`. Requests may be pipelined: every
//! complete request that has arrived is executed and their replies go back in one write.
//!
//! Bounds: `--max-keys` (default 1000000) and `--max-memory` (bytes of keys and values
//! plus 64 per entry, default 256MiB) refuse writes beyond them with Redis's `-OOM`
//! error; `--max-request` (default 16MiB) bounds one request (a longer one gets a
//! protocol error and the connection closes); `--max-request-memory` (default 128MiB, at
//! least `--max-request`) bounds the bytes of requests being received by all clients
//! together (each connection's first 64 KiB of buffered input, room for small pipelined
//! requests, are not counted); `--max-connections` (default 1024) bounds
//! the clients served at once (one more gets `-ERR max number of clients reached` and is
//! closed, as with Redis's `maxclients`; unlike `echo --max-connections`, which counts
//! connections until it exits). `--timeout-secs` (default 30) bounds how long a client
//! may leave our replies unread; idle clients are kept, as Redis keeps them.
//!
//! A client whose request needs more of `--max-request-memory` than is left gets `-ERR
//! requests in progress from all clients hold the server's request memory ...` and is
//! closed, as Redis closes clients beyond its client memory limits; it is not made to
//! wait, since waiting partial requests would keep what they hold and could stall each
//! other for good. The other clients, and every client whose requests are small, go on
//! being served. The server counts such refusals and prints the count when it stops.
//!
//! The server is a [`netchannel::Stack`] on IFACE (AF_XDP on every queue, channel port
//! 9000, like `examples/echo.rs`) with a [`netchannel::VirtualListener`] on PORT, serving
//! NetChannel clients and plain TCP clients on that port, and printing one line per
//! connection when it is accepted and one when it ends. It needs root, runs in the
//! network namespace of the calling process, and stops on SIGINT or SIGTERM (resetting
//! open connections, detaching the XDP program) with success.
//!
//! ```text
//! ip netns exec nsA cargo run --release --example kv -- --interface vA --ipv4 10.77.0.1 --listen 6379
//! ip netns exec nsB redis-cli -h 10.77.0.1 -p 6379 SET greeting hello
//! ip netns exec nsB redis-benchmark -h 10.77.0.1 -p 6379 -q -n 100000 -t set,get,incr -P 16
//! ```

mod resp;
mod store;

#[path = "../support/mod.rs"]
mod support;

use std::process::ExitCode;

use clap::Parser as _;

/// In-memory key-value server speaking RESP2 on netchannel's VirtualListener.
#[derive(Debug, clap::Parser)]
#[command(version, about, after_help = support::ENV_HELP)]
struct Args {
    /// Interface our stack runs on.
    #[arg(long, value_name = "IFACE")]
    interface: String,
    /// Our stack's IPv4 address on the interface.
    #[arg(long, value_name = "ADDR")]
    ipv4: std::net::Ipv4Addr,
    /// The TCP port to serve on (not 9000, the channel port).
    #[arg(long, value_name = "PORT")]
    listen: u16,
    /// Most clients served at once.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_connections: usize,
    /// Most keys stored.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    max_keys: usize,
    /// Most bytes of keys and values stored (plus 64 per key), e.g. 256MiB.
    #[arg(long, value_name = "SIZE", value_parser = support::parse_size, default_value = "256MiB")]
    max_memory: u64,
    /// Longest request (one command with its arguments, as sent), e.g. 16MiB.
    #[arg(long, value_name = "SIZE", value_parser = support::parse_size, default_value = "16MiB")]
    max_request: u64,
    /// Most bytes of requests being received, all clients together, e.g. 128MiB (at
    /// least --max-request).
    #[arg(long, value_name = "SIZE", value_parser = support::parse_size, default_value = "128MiB")]
    max_request_memory: u64,
    /// Longest time a client may leave our replies unread, in seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    /// Secret that authenticates our stack's channels (at least 16 bytes; every
    /// NetChannel peer needs the same one). Without it channels are unauthenticated.
    #[arg(
        long,
        value_name = "SECRET",
        env = "NETCHANNEL_CHANNEL_KEY",
        hide_env_values = true
    )]
    channel_key: Option<String>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    #[cfg(target_os = "linux")]
    let result = linux::run(args);
    #[cfg(not(target_os = "linux"))]
    let result: Result<(), String> = {
        let _ = args;
        Err("AF_XDP is Linux only".to_string())
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kv: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use crate::support::{connection_kind, stop_on_signals, stopped};
    use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use netchannel::netdriver::channel::DEFAULT_CHANNEL_PORT;
    use netchannel::{Stack, StackError, VirtualStream};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
    use tokio::task::JoinSet;

    use super::Args;
    use crate::resp::Limits;
    use crate::store::{serve_connection, RequestMemory, Store, StoreLimits};

    /// Why the server failed.
    #[derive(Debug, thiserror::Error)]
    enum KvError {
        /// The port is the stack's channel port.
        #[error("--listen {0}: that is the stack's channel port (NetChannel clients open their channels there); pick another port")]
        ChannelPort(u16),
        /// A bound of zero would refuse everything.
        #[error("{0} must be at least 1")]
        Zero(&'static str),
        /// The shared request memory could never hold one request of the largest size.
        #[error("--max-request-memory ({memory} bytes) must be at least --max-request ({request} bytes)")]
        RequestMemoryBelowRequest {
            /// `--max-request-memory`.
            memory: u64,
            /// `--max-request`.
            request: u64,
        },
        /// Starting our stack failed while not root.
        #[error(
            "starting netchannel on {ifname} needs root (AF_XDP sockets and an XDP program); \
             run as root: {source}"
        )]
        NotRoot {
            /// The interface.
            ifname: String,
            /// What failed.
            #[source]
            source: StackError,
        },
        /// Starting our stack failed.
        #[error("starting netchannel on {ifname}: {source}")]
        Start {
            /// The interface.
            ifname: String,
            /// What failed.
            #[source]
            source: StackError,
        },
        /// A socket or runtime operation failed.
        #[error("{what}: {source}")]
        Io {
            /// What was being done.
            what: String,
            /// The error.
            #[source]
            source: std::io::Error,
        },
        /// The steering program outlived the stack.
        #[error("an XDP program is still attached to {0} after stopping netchannel")]
        StillAttached(String),
    }

    fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> KvError {
        let what = what.into();
        move |source| KvError::Io { what, source }
    }

    /// Longest wait, after a signal, for connections to end and bytes to drain.
    const STOP_GRACE: Duration = Duration::from_secs(2);

    /// What every connection needs.
    struct Shared {
        store: Store,
        limits: Limits,
        memory: RequestMemory,
        timeout: Duration,
    }

    pub fn run(args: Args) -> Result<(), String> {
        server(args).map_err(|e| crate::support::error_chain(&e))
    }

    fn server(args: Args) -> Result<(), KvError> {
        if args.listen == DEFAULT_CHANNEL_PORT {
            return Err(KvError::ChannelPort(args.listen));
        }
        for (name, v) in [
            ("--max-connections", args.max_connections as u64),
            ("--max-keys", args.max_keys as u64),
            ("--max-memory", args.max_memory),
            ("--max-request", args.max_request),
            ("--max-request-memory", args.max_request_memory),
        ] {
            if v == 0 {
                return Err(KvError::Zero(name));
            }
        }
        if args.max_request_memory < args.max_request {
            return Err(KvError::RequestMemoryBelowRequest {
                memory: args.max_request_memory,
                request: args.max_request,
            });
        }
        let clamp = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let shared = Arc::new(Shared {
            store: Store::new(StoreLimits {
                max_keys: args.max_keys,
                max_memory: clamp(args.max_memory),
            }),
            limits: Limits::with_max_request(clamp(args.max_request)),
            memory: RequestMemory::new(clamp(args.max_request_memory)),
            timeout: Duration::from_secs(args.timeout_secs.max(1)),
        });
        let stop = stop_on_signals("kv").map_err(io_err("handling SIGINT/SIGTERM"))?;
        let ifname = args.interface.as_str();
        let stack = start_stack(ifname, args.ipv4, args.channel_key.as_deref())?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kv-tokio")
            .enable_all()
            .build()
            .map_err(io_err("starting the tokio runtime"))?;
        let res = rt.block_on(serve(
            &stack,
            ifname,
            args.listen,
            args.max_connections,
            shared.clone(),
            stop,
        ));
        // What ended connections left behind is delivered, the channels closed; then
        // connections still open are reset as their tasks are dropped, and the stack's
        // last handle goes with nothing left to drain in the background.
        if let Err(e) = rt.block_on(stack.shutdown_graceful(STOP_GRACE)) {
            tracing::warn!(error = %e, "stopping with bytes not yet delivered");
        }
        rt.shutdown_timeout(STOP_GRACE);
        stack.abort();
        drop(stack);
        let detached = match xdp_prog::attached_program(ifname) {
            Ok(Some(_)) => Err(KvError::StillAttached(ifname.into())),
            Ok(None) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, ifname, "could not query the XDP program");
                Ok(())
            }
        };
        let accepted = res?;
        detached?;
        let memory = shared.memory.stats();
        println!(
            "kv server: stopped after {accepted} connection(s); request memory: peak {} of {} \
             bytes, {} request(s) refused for want of it",
            memory.peak, memory.limit, memory.refused
        );
        Ok(())
    }

    /// Our stack on `ifname`: AF_XDP on every queue, channel port 9000 (the default).
    fn start_stack(ifname: &str, ipv4: Ipv4Addr, key: Option<&str>) -> Result<Stack, KvError> {
        crate::support::build_stack(ifname, ipv4, key).map_err(|source| {
            if nix::unistd::geteuid().is_root() {
                KvError::Start {
                    ifname: ifname.into(),
                    source,
                }
            } else {
                KvError::NotRoot {
                    ifname: ifname.into(),
                    source,
                }
            }
        })
    }

    /// Accepts and serves connections until a signal; returns how many were accepted.
    async fn serve(
        stack: &Stack,
        ifname: &str,
        port: u16,
        max_connections: usize,
        shared: Arc<Shared>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<u64, KvError> {
        let listener = stack
            .bind(SocketAddrV4::new(stack.ipv4(), port).into())
            .await
            .map_err(io_err(format!("listening on port {port}")))?;
        println!(
            "kv server: netchannel on {ifname} ({}), channel port {DEFAULT_CHANNEL_PORT}, \
             listening on port {port} (RESP2; NetChannel and plain TCP clients)",
            stack.ipv4()
        );
        let mut conns = JoinSet::new();
        // One permit per client served; a connection gives its permit back before it
        // prints that it ended, so a client that connects after that line is served.
        let slots = Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS)));
        // Clients over the limit, being told so; not counted as served.
        let mut refused = JoinSet::new();
        let mut accepted = 0u64;
        loop {
            tokio::select! {
                _ = stopped(&mut stop) => break,
                Some(_) = conns.join_next() => {}
                Some(_) = refused.join_next() => {}
                r = listener.accept() => {
                    let (stream, peer) = r.map_err(io_err("accepting"))?;
                    let kind = connection_kind(&stream);
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        tracing::info!(%peer, kind, "refused: max connections");
                        println!("kv server: refused a connection from {peer} over {kind}: {max_connections} clients already");
                        refused.spawn(refuse(stream, shared.timeout));
                        continue;
                    };
                    accepted += 1;
                    let id = accepted;
                    tracing::info!(%peer, id, kind, "accepted");
                    println!("kv server: accepted connection {id} from {peer} over {kind}");
                    conns.spawn(connection(id, stream, peer, shared.clone(), slot, stop.clone()));
                }
            }
        }
        drop(listener);
        // Each connection resets itself on the signal (linger 0); give them a bounded
        // time to go.
        let _ = tokio::time::timeout(STOP_GRACE, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        refused.abort_all();
        Ok(accepted)
    }

    /// Tells a client over `--max-connections` why, as Redis does, and closes. Reads and
    /// drops what the client sends until it closes too (bounded by `timeout`): closing
    /// with its first request unread would reset the connection, and a reset can make the
    /// client's stack drop our error reply before the client reads it.
    async fn refuse(mut stream: VirtualStream, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, async {
            stream
                .write_all(b"-ERR max number of clients reached\r\n")
                .await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 4096];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<(), std::io::Error>(())
        })
        .await;
    }

    /// Serves one connection and prints how it ended.
    async fn connection(
        id: u64,
        mut stream: VirtualStream,
        peer: SocketAddr,
        shared: Arc<Shared>,
        slot: OwnedSemaphorePermit,
        mut stop: watch::Receiver<bool>,
    ) {
        let kind = connection_kind(&stream);
        let started = Instant::now();
        let res = tokio::select! {
            r = serve_connection(&mut stream, &shared.store, shared.limits, &shared.memory, shared.timeout) => Some(r),
            _ = stopped(&mut stop) => None,
        };
        let secs = started.elapsed().as_secs_f64();
        if res.is_none() {
            // Stopped by a signal: reset the connection when the stream drops (a plain
            // drop closes gracefully, like a kernel socket's close()).
            let _ = stream.set_linger(Some(Duration::ZERO));
        }
        // The stream is done with (closed, or reset when dropped below).
        drop(slot);
        match res {
            Some(Ok(s)) => println!(
                "kv server: connection {id} from {peer} over {kind}: {} command(s) in {secs:.3} s, {}",
                s.commands,
                if s.quit { "QUIT" } else { "closed by the client" }
            ),
            Some(Err(e)) => {
                println!("kv server: connection {id} from {peer} over {kind}: {e}")
            }
            None => println!("kv server: connection {id} from {peer} over {kind}: stopped by a signal"),
        }
    }
}
