//! The tests, as a client runs them against an ncperf server ([`crate::proto`]), the
//! same code for netchannel and kernel TCP ([`Net`]). Every response is checked byte for
//! byte and every bulk byte by the server; a wrong byte or a stalled exchange fails the
//! test with an error that says which connection and which request.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Handle;

use crate::net::{Conn, Net};
use crate::proto::{self, Op, Pattern, SinkReport, BLOCK, REPORT_LEN};
use crate::stats::Samples;

/// Longest wait for one exchange (a request and its response, a connect, a bulk
/// stream's report) before the test fails.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// Where a client's connections go and where its latency application runs.
#[derive(Debug, Clone)]
pub struct Target {
    /// The transport.
    pub net: Net,
    /// The server's main port (bulk, request rate, latency, connect).
    pub addr: SocketAddr,
    /// The server's latency application's port (isolation).
    pub lat_addr: SocketAddr,
    /// The client's latency application's runtime (isolation).
    pub lat_rt: Handle,
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{what}: no answer within {STEP_TIMEOUT:?}"),
    )
}

/// `f` within [`STEP_TIMEOUT`], or a time-out error naming `what`.
async fn step<T>(
    what: impl FnOnce() -> String,
    f: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match tokio::time::timeout(STEP_TIMEOUT, f).await {
        Ok(r) => r,
        Err(_) => Err(timed_out(&what())),
    }
}

/// Opens a connection for `op`, its hello sent.
pub async fn open(target: &Target, op: Op, latency: bool) -> io::Result<Conn> {
    let addr = if latency {
        target.lat_addr
    } else {
        target.addr
    };
    let mut c = step(
        || format!("connecting to {addr}"),
        target.net.connect(addr, latency),
    )
    .await?;
    c.write_all(&proto::hello(op, 0)).await?;
    Ok(c)
}

// ---------------------------------------------------------------------------------------
// Request/response

/// A connection's requests ([`proto::Requests`]: the pattern ncperf and the benches'
/// remote mode share), each exchange bounded by [`STEP_TIMEOUT`].
struct Requests(proto::Requests);

impl Requests {
    fn new(size: usize, tag: u64) -> Requests {
        Requests(proto::Requests::new(size, tag))
    }

    /// Requests answered and checked so far.
    fn done(&self) -> u64 {
        self.0.done()
    }

    /// One request and its checked response.
    async fn exchange(&mut self, c: &mut Conn) -> io::Result<()> {
        let (tag, done) = (self.0.tag(), self.0.done());
        step(
            || format!("request {done} of connection {tag}"),
            self.0.exchange(c),
        )
        .await
    }
}

/// Closed-loop requests of `size` bytes on the first `n` of `pool` at once for
/// `duration`: requests per second, all checked.
pub async fn rpc_rate(
    pool: &mut Vec<Conn>,
    n: usize,
    size: usize,
    duration: Duration,
) -> io::Result<f64> {
    let rest = pool.split_off(n.min(pool.len()));
    let taken = std::mem::replace(pool, rest);
    let start = Instant::now();
    let until = start + duration;
    let tasks: Vec<_> = taken
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            tokio::spawn(async move {
                let mut r = Requests::new(size, i as u64);
                let mut result = Ok(());
                while Instant::now() < until {
                    if let Err(e) = r.exchange(&mut c).await {
                        result = Err(e);
                        break;
                    }
                }
                (c, r.done(), result)
            })
        })
        .collect();
    let mut total = 0u64;
    let mut back = Vec::with_capacity(tasks.len());
    let mut first_err = None;
    for t in tasks {
        let (c, done, r) = t.await.map_err(io::Error::other)?;
        back.push(c);
        total += done;
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    let elapsed = start.elapsed();
    back.append(pool);
    *pool = back;
    match first_err {
        Some(e) => Err(e),
        None => Ok(total as f64 / elapsed.as_secs_f64()),
    }
}

/// Opens `n` echo connections.
pub async fn echo_pool(target: &Target, n: usize) -> io::Result<Vec<Conn>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(open(target, Op::Echo, false).await?);
    }
    Ok(v)
}

/// Closes every connection of `pool` (a FIN each, then the server's).
pub async fn close_pool(pool: Vec<Conn>) {
    for mut c in pool {
        let _ = c.shutdown().await;
        let mut rest = [0u8; 16];
        let _ = tokio::time::timeout(Duration::from_secs(2), c.read(&mut rest)).await;
    }
}

/// One request at a time of `size` bytes on `c` for `duration` (at least one): each
/// round trip's time.
pub async fn ping_pong(c: &mut Conn, size: usize, duration: Duration) -> io::Result<Samples> {
    let mut r = Requests::new(size, 0);
    let mut samples = Samples::with_capacity(1 << 16);
    let start = Instant::now();
    loop {
        let t = Instant::now();
        r.exchange(c).await?;
        samples.push(t.elapsed());
        if start.elapsed() >= duration {
            return Ok(samples);
        }
    }
}

/// Latency of one connection: `size`-byte ping-pong for `duration`.
pub async fn latency(target: &Target, size: usize, duration: Duration) -> io::Result<Samples> {
    let mut c = open(target, Op::Echo, false).await?;
    // One exchange first: the connection's set-up is not a sample.
    Requests::new(size, 0).exchange(&mut c).await?;
    let s = ping_pong(&mut c, size, duration).await?;
    close_pool(vec![c]).await;
    Ok(s)
}

// ---------------------------------------------------------------------------------------
// New connections

/// Connections per second, `concurrency` at a time for `duration`: each connects, sends
/// one 64-byte request, checks the response and the server's close.
pub async fn connect_rate(
    target: &Target,
    concurrency: usize,
    duration: Duration,
) -> io::Result<f64> {
    const SIZE: usize = 64;
    let start = Instant::now();
    let until = start + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let target = target.clone();
            tokio::spawn(async move {
                let mut done = 0u64;
                let mut msg = proto::hello(Op::OneShot, SIZE as u16).to_vec();
                let body: Vec<u8> = (0..SIZE).map(|b| b as u8 ^ i as u8).collect();
                msg.extend_from_slice(&body);
                let mut back = [0u8; SIZE + 1];
                while Instant::now() < until {
                    let what = || format!("connection {done} of connector {i}");
                    let mut c = step(what, target.net.connect(target.addr, false)).await?;
                    let got = step(what, async {
                        c.write_all(&msg).await?;
                        c.read_exact(&mut back[..SIZE]).await?;
                        // The server closes after its answer: nothing more comes.
                        c.read(&mut back[SIZE..]).await
                    })
                    .await?;
                    if back[..SIZE] != body[..] || got != 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("{}: wrong response or no close", what()),
                        ));
                    }
                    drop(c);
                    done += 1;
                }
                Ok::<u64, io::Error>(done)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(io::Error::other)??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

// ---------------------------------------------------------------------------------------
// Bulk

/// What a set of bulk streams moved.
#[derive(Debug, Clone, Copy)]
pub struct Bulk {
    /// Bytes the server received and checked, all streams.
    pub bytes: u64,
    /// From the first write until the last stream's report.
    pub elapsed: Duration,
}

impl Bulk {
    /// Goodput in Gbit/s.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}

/// Writes the pattern on `c` until `stop` is set or `until` passes, closes, and checks
/// the server's report. Returns the bytes sent.
async fn bulk_stream(
    mut c: Conn,
    pattern: Arc<Pattern>,
    until: Option<Instant>,
    stop: Arc<AtomicBool>,
    index: usize,
) -> io::Result<u64> {
    let mut sent = 0u64;
    loop {
        if stop.load(Ordering::Relaxed) || until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
        let block = pattern.at(sent, BLOCK);
        step(
            || format!("bulk stream {index} at byte {sent}"),
            c.write_all(block),
        )
        .await?;
        sent += BLOCK as u64;
    }
    let mut r = [0u8; REPORT_LEN];
    step(|| format!("bulk stream {index}'s report"), async {
        c.shutdown().await?;
        c.read_exact(&mut r).await
    })
    .await?;
    let report = SinkReport::decode(&r);
    if report.bytes != sent || !report.intact {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "bulk stream {index}: the server read {} bytes ({}), {sent} were sent",
                report.bytes,
                if report.intact {
                    "as sent"
                } else {
                    "some not as sent"
                }
            ),
        ));
    }
    Ok(sent)
}

/// Started bulk streams; [`BulkRun::finish`] stops them.
pub struct BulkRun {
    tasks: Vec<tokio::task::JoinHandle<io::Result<u64>>>,
    stop: Arc<AtomicBool>,
    start: Instant,
}

impl BulkRun {
    /// Opens `streams` sink connections and starts writing on each, until `until` or
    /// [`finish`](Self::finish).
    pub async fn start(
        target: &Target,
        streams: usize,
        until: Option<Duration>,
    ) -> io::Result<BulkRun> {
        let pattern = Arc::new(Pattern::new());
        let mut conns = Vec::with_capacity(streams);
        for _ in 0..streams {
            conns.push(open(target, Op::Sink, false).await?);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let until = until.map(|d| start + d);
        let tasks = conns
            .into_iter()
            .enumerate()
            .map(|(i, c)| tokio::spawn(bulk_stream(c, pattern.clone(), until, stop.clone(), i)))
            .collect();
        Ok(BulkRun { tasks, stop, start })
    }

    /// Stops the streams and waits for every report.
    pub async fn finish(self) -> io::Result<Bulk> {
        self.stop.store(true, Ordering::Relaxed);
        self.join().await
    }

    /// Waits for every stream to reach its end and report.
    pub async fn join(self) -> io::Result<Bulk> {
        let mut bytes = 0;
        let mut first_err = None;
        for t in self.tasks {
            match t.await.map_err(io::Error::other)? {
                Ok(b) => bytes += b,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(Bulk {
                bytes,
                elapsed: self.start.elapsed(),
            }),
        }
    }
}

/// Bulk goodput of `streams` streams for `duration`.
pub async fn bulk(target: &Target, streams: usize, duration: Duration) -> io::Result<Bulk> {
    BulkRun::start(target, streams, Some(duration))
        .await?
        .join()
        .await
}

// ---------------------------------------------------------------------------------------
// Isolation

/// The isolation test's figures.
pub struct Isolation {
    /// The latency stream alone.
    pub alone: Samples,
    /// The latency stream beside the bulk streams.
    pub loaded: Samples,
    /// The bulk streams' goodput meanwhile.
    pub bulk: Bulk,
}

/// A latency-class connection of the latency application (its own runtime, the server's
/// latency port) pings `size` bytes for `duration` alone, then again beside `streams`
/// bulk streams of the main application.
pub async fn isolation(
    target: &Target,
    size: usize,
    streams: usize,
    duration: Duration,
) -> io::Result<Isolation> {
    let lat = target.lat_rt.clone();
    let t = target.clone();
    let ping = move |t: Target| {
        lat.spawn(async move {
            let mut c = open(&t, Op::Echo, true).await?;
            Requests::new(size, 0).exchange(&mut c).await?;
            let s = ping_pong(&mut c, size, duration).await?;
            close_pool(vec![c]).await;
            Ok::<Samples, io::Error>(s)
        })
    };
    let alone = ping(t.clone()).await.map_err(io::Error::other)??;
    let load = BulkRun::start(target, streams, None).await?;
    let loaded = ping(t).await.map_err(io::Error::other)?;
    let bulk = load.finish().await?;
    Ok(Isolation {
        alone,
        loaded: loaded?,
        bulk,
    })
}
