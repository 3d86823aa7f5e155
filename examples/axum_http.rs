//! An axum HTTP service on netchannel: `axum::serve` over a `VirtualListener` (cargo
//! feature `axum`), which serves NetChannel clients and plain-TCP ones (curl, wrk, ab)
//! alike, with the peer's address as connect info.
//!
//! Routes: `GET /` (a greeting), `GET /peer` (the caller's address and how it came),
//! `GET /bytes/{n}` (n bytes of a pattern, at most 64 MiB), `POST /echo` (the body back).
//!
//! ```text
//! cargo run --example axum_http --features axum -- --interface vA --ipv4 10.77.0.1 --listen 8080
//! curl http://10.77.0.1:8080/peer
//! ab -n 5000 -c 8 http://10.77.0.1:8080/
//! ```
//!
//! Needs root (AF_XDP). Stops on SIGINT/SIGTERM (axum's graceful shutdown).

mod support;

use std::process::ExitCode;

use clap::Parser;

/// An axum HTTP service on netchannel.
#[derive(Parser, Debug)]
struct Args {
    /// Interface for the stack's AF_XDP sockets.
    #[arg(long, value_name = "IFACE")]
    interface: String,
    /// The stack's IPv4 address on that interface.
    #[arg(long, value_name = "ADDR")]
    ipv4: std::net::Ipv4Addr,
    /// The port to serve on.
    #[arg(long, value_name = "PORT")]
    listen: u16,
}

/// Largest `/bytes/{n}`.
const MAX_BYTES: usize = 64 << 20;

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
            eprintln!("axum_http: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::net::SocketAddrV4;

    use axum::extract::{ConnectInfo, Path};
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use axum::Router;
    use netchannel::ecosystem::VirtualConnectInfo;

    use super::{Args, MAX_BYTES};
    use crate::support::{build_stack, stop_on_signals, stopped};

    pub fn app() -> Router {
        Router::new()
            .route("/", get(|| async { "Hello from netchannel\n" }))
            .route(
                "/peer",
                get(
                    |ConnectInfo(c): ConnectInfo<VirtualConnectInfo>| async move {
                        let kind = if c.plain_tcp {
                            "plain-tcp"
                        } else {
                            "netchannel"
                        };
                        format!("you are {} over {kind}\n", c.remote_addr)
                    },
                ),
            )
            .route(
                "/bytes/{n}",
                get(|Path(n): Path<usize>| async move {
                    if n > MAX_BYTES {
                        return Err((StatusCode::BAD_REQUEST, "at most 64 MiB\n"));
                    }
                    Ok((0..n).map(|i| b'a' + (i % 26) as u8).collect::<Vec<u8>>())
                }),
            )
            .route("/echo", post(|body: axum::body::Bytes| async move { body }))
    }

    pub fn run(args: Args) -> Result<(), String> {
        let stop = stop_on_signals("axum_http").map_err(|e| e.to_string())?;
        let stack = build_stack(&args.interface, args.ipv4, None).map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let result = rt.block_on(async {
            let mut stop = stop;
            let addr = SocketAddrV4::new(stack.ipv4(), args.listen);
            let listener = stack.bind(addr.into()).await.map_err(|e| e.to_string())?;
            println!(
                "axum_http: netchannel on {} ({}), channel port 9000, listening on port {}",
                args.interface, args.ipv4, args.listen
            );
            axum::serve(
                listener,
                app().into_make_service_with_connect_info::<VirtualConnectInfo>(),
            )
            .with_graceful_shutdown(async move { stopped(&mut stop).await })
            .await
            .map_err(|e| e.to_string())
        });
        rt.shutdown_timeout(std::time::Duration::from_secs(1));
        stack.abort();
        println!("axum_http: stopped");
        result
    }
}
