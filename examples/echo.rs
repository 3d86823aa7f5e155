//! A TCP echo server and a verifying client on netchannel's `VirtualListener` /
//! `VirtualStream` (tokio), serving NetChannel clients and plain TCP clients on one port.
//!
//! The command line is a contract that later versions keep:
//!
//! ```text
//! # Server: our stack on IFACE with address ADDR, echoing every connection to PORT.
//! echo --interface IFACE --ipv4 ADDR --listen PORT [--max-connections N] [--timeout-secs S]
//!
//! # Client: send N random bytes, read them back concurrently, verify, print goodput.
//! # With --interface/--ipv4 it runs on our stack; without, on the kernel's TCP.
//! echo --connect ADDR:PORT --bytes N [--interface IFACE --ipv4 ADDR] [--timeout-secs S]
//! ```
//!
//! The server is a [`netchannel::Stack`] (`Stack::builder().interface(IFACE).ipv4(ADDR)
//! .build()`, AF_XDP on every queue of IFACE) with a [`netchannel::VirtualListener`] on
//! PORT. Two kinds of clients reach it on that port:
//!
//! - **NetChannel clients** (this example with `--interface/--ipv4`, or any program on a
//!   netchannel `Stack`): their stack first opens its channels to the server's **channel
//!   port, 9000** (the `Stack` default, `StackBuilder::channel_port`), then the virtual
//!   socket to PORT runs over those channels. The server also listens on 9000, so PORT
//!   must be another port.
//! - **Plain TCP clients** (the kernel's TCP: this example without `--interface`, `nc`,
//!   `socat`, ...): they connect to PORT directly and are served as a `VirtualStream`
//!   over one plain connection (`VirtualStream::is_plain_tcp`).
//!
//! The server prints one line per connection when it accepts it and one when it ends,
//! each saying which kind it is:
//!
//! ```text
//! echo server: accepted connection 1 from 10.77.0.2:49152 over netchannel
//! echo server: connection 1 from 10.77.0.2:49152 over netchannel: echoed 20000000 bytes in 1.234 s
//! ```
//!
//! When it stops it prints how many connections it accepted and three of its stack's
//! counters of what hostile or broken peers cost (`docs/security.md`):
//!
//! ```text
//! echo server: stopped after 2 connection(s); replies dropped 0, SYNCs refused 0, channels dropped 0
//! ```
//!
//! The client on our stack connects with `Stack::connect`, which falls back to plain TCP
//! when the server has no channel port (a kernel echo server); it prints which kind it
//! got (`over netchannel` or `over plain-tcp`). Without `--interface/--ipv4` it uses
//! tokio's `TcpStream`.
//!
//! `--bytes` takes plain numbers or sizes with a suffix (`100M`, `1G`, `64k`, powers of
//! 1000; `MiB`/`GiB` for powers of 1024). `--timeout-secs` (default 30) bounds every wait
//! for progress (connect, each read and write, the close). The stack runs in the network
//! namespace of the calling process: run it inside a namespace (`ip netns exec NS echo
//! ...`), on an interface whose peer sends finished checksums (`ethtool -K PEER tx off`
//! on veth). It needs root (AF_XDP sockets and an XDP program). The server runs until
//! SIGINT or SIGTERM, then resets the connections still open, stops its stack and
//! detaches the XDP program and exits with success; with `--max-connections N` it stops
//! by itself once N connections have ended, with `Stack::shutdown_graceful`: their last
//! bytes are delivered, then the channels are closed (a FIN after their bytes, so that a
//! NetChannel client reads what they still hold) and the stack stops once the clients
//! have seen their end, waiting at most `--timeout-secs` for each. The client on our
//! stack also detaches on a signal (and then fails).
//!
//! ```text
//! ip netns exec nsA cargo run --release --example echo -- --interface vA --ipv4 10.77.0.1 --listen 7000
//! ip netns exec nsB cargo run --release --example echo -- --connect 10.77.0.1:7000 --bytes 1G
//! ip netns exec nsB cargo run --release --example echo -- --connect 10.77.0.1:7000 --bytes 1G --interface vB --ipv4 10.77.0.2
//! ```

#[path = "support/mod.rs"]
mod support;

use std::process::ExitCode;

use clap::Parser;

/// TCP echo server and verifying client on netchannel's VirtualListener/VirtualStream.
#[derive(Debug, Parser)]
#[command(version, about, after_help = support::ENV_HELP)]
struct Args {
    /// Interface our stack runs on (server; client on our stack).
    #[arg(long, value_name = "IFACE")]
    interface: Option<String>,
    /// Our stack's IPv4 address on the interface.
    #[arg(long, value_name = "ADDR")]
    ipv4: Option<std::net::Ipv4Addr>,
    /// Server: the TCP port to echo on (not 9000, the channel port).
    #[arg(long, value_name = "PORT", conflicts_with_all = ["connect", "bytes"])]
    listen: Option<u16>,
    /// Server: exit once this many connections have ended.
    #[arg(long, value_name = "N", requires = "listen")]
    max_connections: Option<u64>,
    /// Client: the echo server to connect to.
    #[arg(long, value_name = "ADDR:PORT", requires = "bytes")]
    connect: Option<std::net::SocketAddrV4>,
    /// Client: bytes to send and verify (e.g. 1000000, 100M, 1G, 64MiB).
    #[arg(long, value_name = "N", value_parser = support::parse_size, requires = "connect")]
    bytes: Option<u64>,
    /// Longest wait for progress (connect, data, close) before giving up, in seconds.
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
            eprintln!("echo: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use crate::support::{connection_kind, stop_on_signals, stopped};
    use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
    use std::time::{Duration, Instant};

    use netchannel::netdriver::channel::DEFAULT_CHANNEL_PORT;
    use netchannel::{Stack, StackError, VirtualStream};
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::sync::watch;
    use tokio::task::JoinSet;

    use super::Args;

    /// Why the example failed.
    #[derive(Debug, thiserror::Error)]
    enum EchoError {
        /// Server and client options are both missing.
        #[error(
            "say --listen PORT (server) or --connect ADDR:PORT --bytes N (client); see --help"
        )]
        NoRole,
        /// Our stack needs both the interface and the address.
        #[error("--interface and --ipv4 go together")]
        HalfStack,
        /// The server runs on our stack only.
        #[error("the server needs --interface IFACE and --ipv4 ADDR (it runs on our stack)")]
        ServerNeedsStack,
        /// The echo port is the stack's channel port.
        #[error("--listen {0}: that is the stack's channel port (NetChannel clients open their channels there); pick another port")]
        ChannelPort(u16),
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
        /// A socket operation failed.
        #[error("{what}: {source}")]
        Io {
            /// What was being done.
            what: String,
            /// The error.
            #[source]
            source: std::io::Error,
        },
        /// The echo differed from what was sent.
        #[error(
            "echo differs from what was sent at byte {offset} (got {got:#04x}, sent {want:#04x})"
        )]
        Mismatch {
            /// The first differing offset.
            offset: u64,
            /// The byte received.
            got: u8,
            /// The byte sent.
            want: u8,
        },
        /// The echo ended early or ran long.
        #[error("echo returned {got} of {want} bytes")]
        Short {
            /// Bytes received.
            got: u64,
            /// Bytes sent.
            want: u64,
        },
        /// No progress for too long.
        #[error("{0}")]
        Stalled(String),
        /// SIGINT or SIGTERM arrived.
        #[error("stopped by a signal")]
        Interrupted,
        /// The writer task failed to run to its end.
        #[error("the writer task panicked or was cancelled")]
        WriterPanicked,
        /// The steering program outlived the stack.
        #[error("an XDP program is still attached to {0} after stopping netchannel")]
        StillAttached(String),
    }

    fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EchoError {
        let what = what.into();
        move |source| EchoError::Io { what, source }
    }

    /// `fut`, failing with [`EchoError::Stalled`] (`what` and the limit) after `limit`.
    async fn within<T>(
        limit: Duration,
        what: impl FnOnce() -> String,
        fut: impl std::future::Future<Output = Result<T, EchoError>>,
    ) -> Result<T, EchoError> {
        match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(EchoError::Stalled(format!("{} for {limit:?}", what()))),
        }
    }

    /// Bytes per write the client makes, and per read of the server.
    const CHUNK: usize = 64 * 1024;
    /// Longest wait, after a signal, for connections to end and bytes to drain.
    const STOP_GRACE: Duration = Duration::from_secs(2);

    pub fn run(args: Args) -> Result<(), String> {
        let stack = match (&args.interface, args.ipv4) {
            (Some(i), Some(a)) => Some((i.clone(), a, args.channel_key.clone())),
            (None, None) => None,
            _ => return Err(EchoError::HalfStack.to_string()),
        };
        let timeout = Duration::from_secs(args.timeout_secs.max(1));
        let res = if let Some(port) = args.listen {
            match stack {
                None => Err(EchoError::ServerNeedsStack),
                Some(_) if port == DEFAULT_CHANNEL_PORT => Err(EchoError::ChannelPort(port)),
                Some((ifname, ipv4, key)) => server(
                    &ifname,
                    ipv4,
                    key.as_deref(),
                    port,
                    args.max_connections,
                    timeout,
                ),
            }
        } else if let (Some(target), Some(bytes)) = (args.connect, args.bytes) {
            client(stack, target, bytes, timeout)
        } else {
            Err(EchoError::NoRole)
        };
        res.map_err(|e| crate::support::error_chain(&e))
    }

    /// Our stack on `ifname`: AF_XDP on every queue, channel port 9000 (the default).
    fn start_stack(ifname: &str, ipv4: Ipv4Addr, key: Option<&str>) -> Result<Stack, EchoError> {
        crate::support::build_stack(ifname, ipv4, key).map_err(|source| {
            if nix::unistd::geteuid().is_root() {
                EchoError::Start {
                    ifname: ifname.into(),
                    source,
                }
            } else {
                EchoError::NotRoot {
                    ifname: ifname.into(),
                    source,
                }
            }
        })
    }

    /// Stops `stack` (its last handle: threads joined, XDP program detached) and checks
    /// that nothing stays attached to `ifname`. Callers stop it gracefully first, where
    /// its last bytes matter; what is left now is aborted, so that the drop does not go
    /// on delivering in the background ([`netchannel::StackBuilder::linger`]).
    fn stop_stack(stack: Stack, ifname: &str) -> Result<(), EchoError> {
        stack.abort();
        drop(stack);
        match xdp_prog::attached_program(ifname) {
            Ok(Some(_)) => Err(EchoError::StillAttached(ifname.into())),
            Ok(None) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, ifname, "could not query the XDP program");
                Ok(())
            }
        }
    }

    fn runtime() -> Result<tokio::runtime::Runtime, EchoError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("echo-tokio")
            .enable_all()
            .build()
            .map_err(io_err("starting the tokio runtime"))
    }

    fn server(
        ifname: &str,
        ipv4: Ipv4Addr,
        key: Option<&str>,
        port: u16,
        max_connections: Option<u64>,
        timeout: Duration,
    ) -> Result<(), EchoError> {
        let stop = stop_on_signals("echo").map_err(io_err("handling SIGINT/SIGTERM"))?;
        let stack = start_stack(ifname, ipv4, key)?;
        let rt = runtime()?;
        let res = rt.block_on(serve(&stack, ifname, port, max_connections, timeout, stop));
        // Connections still open are reset as their tasks are dropped.
        rt.shutdown_timeout(STOP_GRACE);
        // What hostile or broken peers cost (docs/security.md, "Bounds and counters").
        let counters = stack.diagnostics().endpoint_counters();
        let dropped_channels = stack.diagnostics().dropped_channels();
        let stopped = stop_stack(stack, ifname);
        let accepted = res?;
        stopped?;
        println!(
            "echo server: stopped after {accepted} connection(s); replies dropped {}, \
             SYNCs refused {}, channels dropped {dropped_channels}",
            counters.dropped_replies, counters.refused_syncs
        );
        Ok(())
    }

    /// Accepts and echoes connections until a signal or `max_connections` have ended;
    /// returns how many were accepted.
    async fn serve(
        stack: &Stack,
        ifname: &str,
        port: u16,
        max_connections: Option<u64>,
        timeout: Duration,
        mut stop: watch::Receiver<bool>,
    ) -> Result<u64, EchoError> {
        let listener = stack
            .bind(SocketAddrV4::new(stack.ipv4(), port).into())
            .await
            .map_err(io_err(format!("listening on port {port}")))?;
        println!(
            "echo server: netchannel on {ifname} ({}), channel port {DEFAULT_CHANNEL_PORT}, \
             listening on port {port} (NetChannel and plain TCP clients)",
            stack.ipv4()
        );
        let mut conns = JoinSet::new();
        let (mut accepted, mut ended) = (0u64, 0u64);
        let signalled = loop {
            if max_connections.is_some_and(|m| ended >= m) {
                break false;
            }
            let more = max_connections.is_none_or(|m| accepted < m);
            tokio::select! {
                _ = stopped(&mut stop) => break true,
                Some(_) = conns.join_next() => ended += 1,
                r = listener.accept(), if more => {
                    let (stream, peer) = r.map_err(io_err("accepting"))?;
                    accepted += 1;
                    let id = accepted;
                    let kind = connection_kind(&stream);
                    tracing::info!(%peer, id, kind, "accepted");
                    println!("echo server: accepted connection {id} from {peer} over {kind}");
                    conns.spawn(connection(id, stream, peer, timeout, stop.clone()));
                }
            }
        };
        drop(listener);
        // After a signal the connections reset themselves; then they and every ended
        // connection's last bytes get a bounded time to drain before the stack stops.
        let grace = if signalled { STOP_GRACE } else { timeout };
        let _ =
            tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
        // Delivers what the connections left behind, then closes the channels (a FIN
        // after their bytes, so that a NetChannel client reads the last echoed bytes its
        // channels still hold) and stops once the clients have seen their end.
        if let Err(e) = stack.shutdown_graceful(grace).await {
            tracing::warn!(error = %e, "stopping with bytes not yet delivered");
        }
        Ok(accepted)
    }

    /// Echoes one connection and prints how it ended; dropping the stream afterwards
    /// closes it gracefully after a completed echo, and resets it otherwise.
    async fn connection(
        id: u64,
        mut stream: VirtualStream,
        peer: SocketAddr,
        timeout: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let kind = connection_kind(&stream);
        let started = Instant::now();
        let res = tokio::select! {
            r = echo(&mut stream, timeout) => r,
            _ = stopped(&mut stop) => Err(EchoError::Interrupted),
        };
        if matches!(res, Err(EchoError::Interrupted)) {
            // Stopped by a signal: reset the connection when the stream drops below (a
            // plain drop would close it gracefully, and the client would read end of
            // stream as if the echo were complete).
            let _ = stream.set_linger(Some(Duration::ZERO));
        }
        match res {
            Ok(n) => println!(
                "echo server: connection {id} from {peer} over {kind}: echoed {n} bytes in {:.3} s",
                started.elapsed().as_secs_f64()
            ),
            Err(e) => println!("echo server: connection {id} from {peer} over {kind}: {e}"),
        }
    }

    /// Writes back everything read until the peer shuts its side down, then shuts ours.
    async fn echo(s: &mut VirtualStream, timeout: Duration) -> Result<u64, EchoError> {
        let mut buf = vec![0u8; CHUNK];
        let mut echoed = 0u64;
        loop {
            let n = within(
                timeout,
                || format!("nothing received after {echoed} bytes"),
                async {
                    s.read(&mut buf)
                        .await
                        .map_err(io_err(format!("after {echoed} bytes")))
                },
            )
            .await?;
            if n == 0 {
                break;
            }
            within(
                timeout,
                || format!("the peer read nothing after {echoed} bytes"),
                async {
                    s.write_all(&buf[..n])
                        .await
                        .map_err(io_err(format!("echoing after {echoed} bytes")))
                },
            )
            .await?;
            echoed += n as u64;
        }
        s.shutdown()
            .await
            .map_err(io_err("shutting down the write side"))?;
        Ok(echoed)
    }

    /// The byte stream the client sends: byte `i` is byte `i % 8` of `mix(seed ^ (i / 8))`
    /// (splitmix64), so it can be regenerated at any offset for checking.
    #[derive(Debug, Clone, Copy)]
    struct Pattern(u64);

    impl Pattern {
        fn mix(&self, word: u64) -> [u8; 8] {
            let mut z = (self.0 ^ word).wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)).to_le_bytes()
        }

        fn fill(&self, offset: u64, out: &mut [u8]) {
            let mut pos = offset;
            let mut i = 0;
            while i < out.len() {
                let word = self.mix(pos / 8);
                let within = (pos % 8) as usize;
                let n = (8 - within).min(out.len() - i);
                out[i..i + n].copy_from_slice(&word[within..within + n]);
                i += n;
                pos += n as u64;
            }
        }
    }

    /// Checks received data against the pattern.
    struct Verifier {
        pattern: Pattern,
        offset: u64,
        want: u64,
        scratch: Vec<u8>,
    }

    impl Verifier {
        fn check(&mut self, data: &[u8]) -> Result<(), EchoError> {
            if self.offset + data.len() as u64 > self.want {
                return Err(EchoError::Short {
                    got: self.offset + data.len() as u64,
                    want: self.want,
                });
            }
            self.scratch.resize(data.len(), 0);
            self.pattern.fill(self.offset, &mut self.scratch);
            if let Some(at) = data.iter().zip(&self.scratch).position(|(a, b)| a != b) {
                return Err(EchoError::Mismatch {
                    offset: self.offset + at as u64,
                    got: data[at],
                    want: self.scratch[at],
                });
            }
            self.offset += data.len() as u64;
            Ok(())
        }
    }

    fn client(
        stack: Option<(String, Ipv4Addr, Option<String>)>,
        target: SocketAddrV4,
        bytes: u64,
        timeout: Duration,
    ) -> Result<(), EchoError> {
        let pattern = Pattern(rand::random());
        let mut verifier = Verifier {
            pattern,
            offset: 0,
            want: bytes,
            scratch: Vec::new(),
        };
        let (which, secs) = match stack {
            Some((ifname, ipv4, key)) => {
                let mut stop =
                    stop_on_signals("echo").map_err(io_err("handling SIGINT/SIGTERM"))?;
                let stack = start_stack(&ifname, ipv4, key.as_deref())?;
                let rt = runtime()?;
                let res = rt.block_on(async {
                    tokio::select! {
                        r = our_client(&stack, target, bytes, pattern, &mut verifier, timeout) => r,
                        _ = stopped(&mut stop) => Err(EchoError::Interrupted),
                    }
                });
                // The client's own last bytes (its FIN) were acknowledged by the echo;
                // a graceful stop closes its channels rather than resetting them.
                if let Err(e) = rt.block_on(stack.shutdown_graceful(STOP_GRACE)) {
                    tracing::info!(error = %e, "stopping with bytes not yet delivered");
                }
                rt.shutdown_timeout(STOP_GRACE);
                let stopped = stop_stack(stack, &ifname);
                let (kind, secs) = res?;
                stopped?;
                (
                    format!("netchannel on {ifname} ({ipv4}, AF_XDP) over {kind}"),
                    secs,
                )
            }
            None => {
                println!(
                    "echo client: using the kernel's TCP (tokio::net::TcpStream); add \
                     --interface and --ipv4 to use netchannel"
                );
                let rt = runtime()?;
                let secs = rt.block_on(kernel_client(
                    target,
                    bytes,
                    pattern,
                    &mut verifier,
                    timeout,
                ))?;
                ("the kernel's TCP".to_string(), secs)
            }
        };
        if verifier.offset != bytes {
            return Err(EchoError::Short {
                got: verifier.offset,
                want: bytes,
            });
        }
        println!(
            "echo client ({which}): {bytes} bytes sent to {target} and echoed back, every byte \
             verified, in {secs:.3} s: goodput {:.3} Gbit/s each way",
            bytes as f64 * 8.0 / secs.max(1e-9) / 1e9
        );
        Ok(())
    }

    async fn kernel_client(
        target: SocketAddrV4,
        bytes: u64,
        pattern: Pattern,
        verifier: &mut Verifier,
        timeout: Duration,
    ) -> Result<f64, EchoError> {
        let conn = within(timeout, || format!("connecting to {target}"), async {
            tokio::net::TcpStream::connect(target)
                .await
                .map_err(io_err(format!("connecting to {target}")))
        })
        .await?;
        let started = Instant::now();
        let (r, w) = conn.into_split();
        transfer(r, w, bytes, pattern, verifier, timeout).await?;
        Ok(started.elapsed().as_secs_f64())
    }

    /// Connects over our stack (falling back to plain TCP when the server has no channel
    /// port) and runs the echo; the connection's kind and the seconds it took.
    async fn our_client(
        stack: &Stack,
        target: SocketAddrV4,
        bytes: u64,
        pattern: Pattern,
        verifier: &mut Verifier,
        timeout: Duration,
    ) -> Result<(&'static str, f64), EchoError> {
        let conn = within(timeout, || format!("connecting to {target}"), async {
            stack
                .connect(target.into())
                .await
                .map_err(io_err(format!("connecting to {target}")))
        })
        .await?;
        let kind = connection_kind(&conn);
        let local = conn
            .local_addr()
            .map_err(io_err("reading the local address"))?;
        tracing::info!(%target, %local, kind, "connected");
        println!("echo client: connected to {target} from {local} over {kind}");
        let started = Instant::now();
        let (r, w) = conn.into_split();
        transfer(r, w, bytes, pattern, verifier, timeout).await?;
        Ok((kind, started.elapsed().as_secs_f64()))
    }

    /// Sends `bytes` of `pattern` on `w` (in its own task) while reading the echo from `r`
    /// and verifying it, until the server's end of stream.
    async fn transfer<R, W>(
        mut r: R,
        mut w: W,
        bytes: u64,
        pattern: Pattern,
        verifier: &mut Verifier,
        timeout: Duration,
    ) -> Result<(), EchoError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let writer = tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            let mut off = 0u64;
            while off < bytes {
                let n = (bytes - off).min(CHUNK as u64) as usize;
                pattern.fill(off, &mut buf[..n]);
                within(
                    timeout,
                    || format!("no room to send at byte {off}"),
                    async {
                        w.write_all(&buf[..n])
                            .await
                            .map_err(io_err(format!("writing at byte {off}")))
                    },
                )
                .await?;
                off += n as u64;
            }
            w.shutdown()
                .await
                .map_err(io_err("shutting down the write side"))?;
            // Keep the write half (dropping it is a shutdown too) until the echo is in.
            Ok::<W, EchoError>(w)
        });
        let mut buf = vec![0u8; 256 * 1024];
        let read = loop {
            let got = within(
                timeout,
                || format!("nothing received after {} bytes", verifier.offset),
                async {
                    r.read(&mut buf)
                        .await
                        .map_err(io_err(format!("reading after {} bytes", verifier.offset)))
                },
            )
            .await;
            match got {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    if let Err(e) = verifier.check(&buf[..n]) {
                        break Err(e);
                    }
                }
                Err(e) => break Err(e),
            }
        };
        if read.is_err() {
            writer.abort();
        }
        let written = match writer.await {
            Ok(r) => r.map(drop),
            Err(_) if read.is_err() => Ok(()),
            Err(_) => Err(EchoError::WriterPanicked),
        };
        read.and(written)
    }
}
