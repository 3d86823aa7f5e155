//! One side of a measurement as a process sees it: an application runtime and a latency
//! application's runtime (one worker), each thread of both inside the side's network
//! namespace when it has one (the test bed's), so that every socket, AF_XDP socket and
//! stack thread made from them belongs there. The server's side serves ncperf clients on
//! two listeners: the main port on the application runtime and the latency port on the
//! latency runtime, where accepted streams are made latency-class.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::task::JoinHandle;

use crate::net::{Listener, Net};
use crate::proto::{self, Pattern};

/// Something that moves the calling thread into a network namespace.
pub type Enter = Arc<dyn Fn() + Send + Sync>;

/// A side's runtimes.
pub struct Host {
    /// The application's runtime.
    pub rt: Runtime,
    /// The latency application's runtime.
    pub lat: Runtime,
}

impl Host {
    /// Runtimes of `workers` and 1 worker threads, named `name-…`, every thread first
    /// calling `enter` when given.
    pub fn new(name: &str, workers: usize, enter: Option<Enter>) -> io::Result<Host> {
        let build = |label: String, n: usize| {
            let mut b = Builder::new_multi_thread();
            b.worker_threads(n.max(1)).thread_name(label).enable_all();
            if let Some(e) = enter.clone() {
                b.on_thread_start(move || e());
            }
            b.build()
        };
        Ok(Host {
            rt: build(format!("{name}-app"), workers)?,
            lat: build(format!("{name}-lat"), 1)?,
        })
    }

    /// Runs `f` as a task of the application runtime (so on one of its threads, in the
    /// side's namespace) and waits for it.
    pub fn run<F>(&self, f: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = self.rt.spawn(f);
        match self.rt.block_on(task) {
            Ok(v) => v,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("a task of the {} runtime was cancelled: {e}", "application"),
        }
    }

    /// The latency runtime's handle.
    pub fn lat_handle(&self) -> Handle {
        self.lat.handle().clone()
    }
}

/// What a server has seen.
#[derive(Debug, Default)]
pub struct ServeCounters {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections that ended in an error (bad hello, reset, …).
    pub failed: AtomicU64,
}

/// A running server: its two accept loops.
pub struct Serving {
    loops: Vec<JoinHandle<()>>,
    /// Its counters.
    pub counters: Arc<ServeCounters>,
    /// The latency port's address.
    pub lat_addr: SocketAddr,
}

impl Serving {
    /// Binds `addr` (on the application runtime) and `addr`'s port + 1 (on the latency
    /// runtime) on `net` and serves both until [`stop`](Self::stop).
    pub fn start(host: &Host, net: &Net, addr: SocketAddr) -> io::Result<Serving> {
        let lat_addr = SocketAddr::new(addr.ip(), addr.port().wrapping_add(1));
        let counters = Arc::new(ServeCounters::default());
        let n = net.clone();
        let main = host.run(async move { n.bind(addr).await })?;
        let n = net.clone();
        let lat = host
            .lat
            .block_on(host.lat.spawn(async move { n.bind(lat_addr).await }))
            .map_err(io::Error::other)??;
        let loops = vec![
            host.rt.spawn(accept_loop(main, false, counters.clone())),
            host.lat.spawn(accept_loop(lat, true, counters.clone())),
        ];
        Ok(Serving {
            loops,
            counters,
            lat_addr,
        })
    }

    /// Stops accepting (connections being served go on until their clients close).
    pub fn stop(self) {
        for l in self.loops {
            l.abort();
        }
    }
}

async fn accept_loop(l: Listener, latency: bool, counters: Arc<ServeCounters>) {
    let pattern = Arc::new(Pattern::new());
    loop {
        let (conn, peer) = match l.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, a stack being stopped: back off rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        counters.accepted.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = Net::classify(&conn, latency) {
            tracing::warn!(%peer, error = %e, "cannot make the stream latency-class");
        }
        let (pattern, counters) = (pattern.clone(), counters.clone());
        tokio::spawn(async move {
            if let Err(e) = proto::serve(conn, &pattern).await {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, error = %e, "connection ended in an error");
            }
        });
    }
}
