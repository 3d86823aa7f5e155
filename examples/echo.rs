//! A TCP echo server and a verifying client, on netchannel's stack over AF_XDP.
//!
//! The command line is a contract that later versions keep:
//!
//! ```text
//! # Server: our TCP over AF_XDP on IFACE with address ADDR, echoing every connection to PORT.
//! echo --interface IFACE --ipv4 ADDR --listen PORT [--max-connections N]
//!
//! # Client: send N random bytes, read them back concurrently, verify, print goodput.
//! # With --interface/--ipv4 it runs on our stack; without, on the kernel's TCP.
//! echo --connect ADDR:PORT --bytes N [--interface IFACE --ipv4 ADDR]
//! ```
//!
//! `--bytes` takes plain numbers or sizes with a suffix (`100M`, `1G`, `64k`, powers of
//! 1000; `MiB`/`GiB` for powers of 1024). The stack runs in the network namespace of the
//! calling process: run it inside a namespace (`ip netns exec NS echo ...`), on an
//! interface whose peer sends finished checksums (`ethtool -K PEER tx off` on veth). It
//! needs root (AF_XDP sockets and an XDP program). The server runs until SIGINT or
//! SIGTERM (or `--max-connections` connections have ended), then aborts what is left,
//! stops its threads and detaches the XDP program.
//!
//! ```text
//! ip netns exec nsA cargo run --release --example echo -- --interface vA --ipv4 10.77.0.1 --listen 7000
//! ip netns exec nsB cargo run --release --example echo -- --connect 10.77.0.1:7000 --bytes 1G
//! ```

use std::process::ExitCode;

use clap::Parser;

/// TCP echo server and verifying client on netchannel's stack over AF_XDP.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Interface our stack runs on (server; client on our stack).
    #[arg(long, value_name = "IFACE")]
    interface: Option<String>,
    /// Our stack's IPv4 address on the interface.
    #[arg(long, value_name = "ADDR")]
    ipv4: Option<std::net::Ipv4Addr>,
    /// Server: the TCP port to echo on.
    #[arg(long, value_name = "PORT", conflicts_with_all = ["connect", "bytes"])]
    listen: Option<u16>,
    /// Server: exit once this many connections have ended.
    #[arg(long, value_name = "N", requires = "listen")]
    max_connections: Option<u64>,
    /// Client: the echo server to connect to.
    #[arg(long, value_name = "ADDR:PORT", requires = "bytes")]
    connect: Option<std::net::SocketAddrV4>,
    /// Client: bytes to send and verify (e.g. 1000000, 100M, 1G, 64MiB).
    #[arg(long, value_name = "N", value_parser = parse_size, requires = "connect")]
    bytes: Option<u64>,
    /// Longest wait for progress (connect, data, close) before giving up, in seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
}

/// Parses `123`, `100M`, `1G`, `64k`, `64KiB`, `1GiB`.
fn parse_size(s: &str) -> Result<u64, String> {
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
    use std::io::{Read, Write};
    use std::net::{Shutdown, SocketAddrV4, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use netchannel::netdriver::channel::{
        Channel, ChannelError, ChannelSet, ChannelSetConfig, ChannelState, Dequeued, EnqueueError,
    };
    use nix::sys::signal::{SigSet, Signal};

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
            source: ChannelError,
        },
        /// Starting our stack failed.
        #[error("starting netchannel on {ifname}: {source}")]
        Start {
            /// The interface.
            ifname: String,
            /// What failed.
            #[source]
            source: ChannelError,
        },
        /// A channel operation failed.
        #[error("{what}: {source}")]
        Channel {
            /// What was being done.
            what: String,
            /// The error.
            #[source]
            source: ChannelError,
        },
        /// A kernel socket operation failed.
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
        /// The writer thread panicked.
        #[error("the writer thread panicked")]
        WriterPanicked,
    }

    fn channel_err(what: impl Into<String>) -> impl FnOnce(ChannelError) -> EchoError {
        let what = what.into();
        move |source| EchoError::Channel { what, source }
    }

    fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EchoError {
        let what = what.into();
        move |source| EchoError::Io { what, source }
    }

    /// Bytes per chunk the client writes.
    const CHUNK: usize = 64 * 1024;
    /// How often waiting loops look at the stop flag.
    const TICK: Duration = Duration::from_millis(200);

    pub fn run(args: Args) -> Result<(), String> {
        let stack = match (&args.interface, args.ipv4) {
            (Some(i), Some(a)) => Some((i.clone(), a)),
            (None, None) => None,
            _ => return Err(EchoError::HalfStack.to_string()),
        };
        let timeout = Duration::from_secs(args.timeout_secs.max(1));
        let res = if let Some(port) = args.listen {
            let Some((ifname, ipv4)) = stack else {
                return Err(EchoError::ServerNeedsStack.to_string());
            };
            server(&ifname, ipv4, port, args.max_connections, timeout)
        } else if let (Some(target), Some(bytes)) = (args.connect, args.bytes) {
            client(stack, target, bytes, timeout)
        } else {
            Err(EchoError::NoRole)
        };
        res.map_err(|e| {
            // The whole chain: "starting ...: XDP steering: attach: Operation not permitted".
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                let text = s.to_string();
                if !msg.contains(&text) {
                    msg.push_str(": ");
                    msg.push_str(&text);
                }
                source = s.source();
            }
            msg
        })
    }

    fn start_stack(ifname: &str, ipv4: std::net::Ipv4Addr) -> Result<ChannelSet, EchoError> {
        ChannelSet::start(ChannelSetConfig::new(ifname, ipv4)).map_err(|source| {
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

    /// Blocks SIGINT and SIGTERM in this thread (and so in every thread spawned after) and
    /// sets the returned flag from a thread that waits for them.
    fn stop_on_signals() -> Result<Arc<AtomicBool>, EchoError> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGINT);
        set.add(Signal::SIGTERM);
        set.thread_block()
            .map_err(|e| io_err("blocking SIGINT/SIGTERM")(e.into()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("echo-signals".into())
            .spawn(move || {
                if let Ok(sig) = set.wait() {
                    tracing::info!(?sig, "stopping");
                    eprintln!("echo: {sig}, shutting down");
                    flag.store(true, Ordering::Release);
                }
            })
            .map_err(io_err("spawning the signal thread"))?;
        Ok(stop)
    }

    fn server(
        ifname: &str,
        ipv4: std::net::Ipv4Addr,
        port: u16,
        max_connections: Option<u64>,
        timeout: Duration,
    ) -> Result<(), EchoError> {
        let stop = stop_on_signals()?;
        let set = start_stack(ifname, ipv4)?;
        let listener = set
            .listen(port)
            .map_err(channel_err(format!("listening on port {port}")))?;
        println!(
            "echo server: netchannel on {ifname} ({ipv4}), queues {:?}, listening on port {port}",
            set.queues()
        );
        let mut workers = Vec::new();
        let mut accepted = 0u64;
        while !stop.load(Ordering::Acquire) && max_connections.is_none_or(|m| accepted < m) {
            match listener.accept_timeout(TICK) {
                Ok((ch, peer)) => {
                    accepted += 1;
                    let id = accepted;
                    tracing::info!(%peer, id, "accepted");
                    let stop = Arc::clone(&stop);
                    let worker = std::thread::Builder::new()
                        .name(format!("echo-{id}"))
                        .spawn(move || {
                            let started = Instant::now();
                            match echo_channel(&ch, &stop, timeout) {
                                Ok(n) => println!(
                                    "echo server: connection {id} from {peer}: echoed {n} bytes in {:.3} s",
                                    started.elapsed().as_secs_f64()
                                ),
                                Err(e) => {
                                    ch.abort();
                                    println!("echo server: connection {id} from {peer}: {e}");
                                }
                            }
                        })
                        .map_err(io_err("spawning a connection thread"))?;
                    workers.push(worker);
                }
                Err(ChannelError::WouldBlockTimeout) => {}
                Err(e) => return Err(channel_err("accepting")(e)),
            }
            workers.retain(|w| !w.is_finished());
        }
        for w in workers {
            let _ = w.join();
        }
        set.shutdown().map_err(channel_err(
            "stopping netchannel (detaching the XDP program)",
        ))?;
        println!("echo server: stopped after {accepted} connection(s)");
        Ok(())
    }

    /// Echoes `ch` until the peer closes, handing each received chunk straight back.
    fn echo_channel(ch: &Channel, stop: &AtomicBool, timeout: Duration) -> Result<u64, EchoError> {
        let mut echoed = 0u64;
        let mut idle_since = Instant::now();
        loop {
            if stop.load(Ordering::Acquire) {
                return Err(EchoError::Stalled("stopped by a signal".into()));
            }
            match ch.dequeue_blocking(Some(TICK)) {
                Ok(Dequeued::Chunk(chunk)) => {
                    idle_since = Instant::now();
                    let len = chunk.len() as u64;
                    let mut pending = chunk;
                    loop {
                        match ch.enqueue_blocking(pending, Some(TICK)) {
                            Ok(()) => break,
                            Err(EnqueueError::Full(c)) => {
                                if stop.load(Ordering::Acquire) {
                                    return Err(EchoError::Stalled("stopped by a signal".into()));
                                }
                                if idle_since.elapsed() > timeout {
                                    return Err(EchoError::Stalled(format!(
                                        "the peer read nothing for {timeout:?}"
                                    )));
                                }
                                pending = c;
                            }
                            Err(EnqueueError::Closed(e)) => {
                                return Err(channel_err("echoing")(e));
                            }
                        }
                    }
                    echoed += len;
                }
                Ok(Dequeued::Empty) => {
                    if idle_since.elapsed() > timeout {
                        return Err(EchoError::Stalled(format!("idle for {timeout:?}")));
                    }
                }
                Ok(Dequeued::Finished) => break,
                Err(e) => return Err(channel_err(format!("after {echoed} bytes"))(e)),
            }
        }
        // The peer closed: close ours after the echo and wait until the FIN is acknowledged.
        ch.close();
        let deadline = Instant::now() + timeout;
        while ch.state() != ChannelState::Closed {
            if Instant::now() > deadline || stop.load(Ordering::Acquire) {
                return Err(EchoError::Stalled(format!(
                    "the connection did not close within {timeout:?}"
                )));
            }
            // The channel offers no wait for this; poll its state.
            std::thread::sleep(Duration::from_millis(1));
        }
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
        stack: Option<(String, std::net::Ipv4Addr)>,
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
            Some((ifname, ipv4)) => {
                let set = start_stack(&ifname, ipv4)?;
                let which = format!("netchannel on {ifname} ({ipv4}, AF_XDP)");
                let res = our_client(&set, target, bytes, pattern, &mut verifier, timeout);
                set.shutdown().map_err(channel_err(
                    "stopping netchannel (detaching the XDP program)",
                ))?;
                (which, res?)
            }
            None => {
                println!("echo client: using the kernel's TCP (std::net); add --interface and --ipv4 to use netchannel");
                let secs = kernel_client(target, bytes, pattern, &mut verifier, timeout)?;
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

    fn kernel_client(
        target: SocketAddrV4,
        bytes: u64,
        pattern: Pattern,
        verifier: &mut Verifier,
        timeout: Duration,
    ) -> Result<f64, EchoError> {
        let conn = TcpStream::connect_timeout(&target.into(), timeout)
            .map_err(io_err(format!("connecting to {target}")))?;
        let started = Instant::now();
        conn.set_read_timeout(Some(timeout))
            .map_err(io_err("setting the read timeout"))?;
        conn.set_write_timeout(Some(timeout))
            .map_err(io_err("setting the write timeout"))?;
        let mut writer = conn.try_clone().map_err(io_err("cloning the socket"))?;
        std::thread::scope(|s| {
            let w = s.spawn(move || -> Result<(), EchoError> {
                let mut buf = vec![0u8; CHUNK];
                let mut off = 0;
                while off < bytes {
                    let n = (bytes - off).min(CHUNK as u64) as usize;
                    pattern.fill(off, &mut buf[..n]);
                    writer
                        .write_all(&buf[..n])
                        .map_err(io_err(format!("writing at byte {off}")))?;
                    off += n as u64;
                }
                writer
                    .shutdown(Shutdown::Write)
                    .map_err(io_err("shutting down the write side"))
            });
            let mut buf = vec![0u8; 256 * 1024];
            let read = loop {
                match (&conn).read(&mut buf) {
                    Ok(0) => break Ok(()),
                    Ok(n) => {
                        if let Err(e) = verifier.check(&buf[..n]) {
                            break Err(e);
                        }
                    }
                    Err(e) => {
                        break Err(io_err(format!("reading after {} bytes", verifier.offset))(
                            e,
                        ))
                    }
                }
            };
            if read.is_err() {
                // Unblocks the writer.
                let _ = conn.shutdown(Shutdown::Both);
            }
            let written = w.join().map_err(|_| EchoError::WriterPanicked)?;
            read.and(written)
        })?;
        Ok(started.elapsed().as_secs_f64())
    }

    fn our_client(
        set: &ChannelSet,
        target: SocketAddrV4,
        bytes: u64,
        pattern: Pattern,
        verifier: &mut Verifier,
        timeout: Duration,
    ) -> Result<f64, EchoError> {
        let ch = set
            .connect(target)
            .map_err(channel_err(format!("connecting to {target}")))?;
        let started = Instant::now();
        let failed = AtomicBool::new(false);
        std::thread::scope(|s| {
            let w = s.spawn(|| -> Result<(), EchoError> {
                let mut off = 0;
                while off < bytes {
                    let n = (bytes - off).min(CHUNK as u64) as usize;
                    let mut buf = vec![0u8; n];
                    pattern.fill(off, &mut buf);
                    let mut chunk = Bytes::from(buf);
                    let waited = Instant::now();
                    loop {
                        match ch.enqueue_blocking(chunk, Some(TICK)) {
                            Ok(()) => break,
                            Err(EnqueueError::Full(c)) => {
                                if failed.load(Ordering::Acquire) {
                                    return Ok(());
                                }
                                if waited.elapsed() > timeout {
                                    return Err(EchoError::Stalled(format!(
                                        "no room to send for {timeout:?} at byte {off}"
                                    )));
                                }
                                chunk = c;
                            }
                            Err(EnqueueError::Closed(e)) => {
                                return Err(channel_err(format!("sending at byte {off}"))(e))
                            }
                        }
                    }
                    off += n as u64;
                }
                ch.close();
                Ok(())
            });
            let read = loop {
                match ch.dequeue_blocking(Some(timeout)) {
                    Ok(Dequeued::Chunk(c)) => {
                        if let Err(e) = verifier.check(&c) {
                            break Err(e);
                        }
                    }
                    Ok(Dequeued::Finished) => break Ok(()),
                    Ok(Dequeued::Empty) => {
                        break Err(EchoError::Stalled(format!(
                            "nothing received for {timeout:?} after {} bytes",
                            verifier.offset
                        )))
                    }
                    Err(e) => {
                        break Err(channel_err(format!(
                            "receiving after {} bytes",
                            verifier.offset
                        ))(e))
                    }
                }
            };
            if read.is_err() {
                failed.store(true, Ordering::Release);
                ch.abort();
            }
            let written = w.join().map_err(|_| EchoError::WriterPanicked)?;
            read.and(written)
        })?;
        Ok(started.elapsed().as_secs_f64())
    }
}
