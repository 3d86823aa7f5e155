//! A hyper client on netchannel: hyper-util's legacy pooled client with a
//! `VirtualConnector` (cargo feature `hyper`) fetches a URL `--requests` times over the
//! connections it pools, and prints the status, the size of the last body, and whether
//! its connection was NetChannel or plain TCP (to a host that runs no stack).
//!
//! ```text
//! cargo run --example hyper_client --features hyper -- --interface vB --ipv4 10.77.0.2 \
//!     --url http://10.77.0.1:8080/ --requests 10
//! ```
//!
//! Needs root (AF_XDP).

mod support;

use std::process::ExitCode;

use clap::Parser;

/// Fetches a URL over netchannel with hyper.
#[derive(Parser, Debug)]
struct Args {
    /// Interface for the stack's AF_XDP sockets.
    #[arg(long, value_name = "IFACE")]
    interface: String,
    /// The stack's IPv4 address on that interface.
    #[arg(long, value_name = "ADDR")]
    ipv4: std::net::Ipv4Addr,
    /// What to fetch.
    #[arg(long)]
    url: String,
    /// How many times.
    #[arg(long, default_value_t = 1)]
    requests: u32,
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
            eprintln!("hyper_client: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use netchannel::ecosystem::hyper::{VirtualConnectInfo, VirtualConnector};

    use super::Args;
    use crate::support::{build_stack, error_chain};

    pub fn run(args: Args) -> Result<(), String> {
        let stack = build_stack(&args.interface, args.ipv4, None).map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let result = rt.block_on(async {
            let uri: hyper::Uri = args.url.parse().map_err(|e| format!("{e}"))?;
            let client: Client<VirtualConnector, Empty<Bytes>> =
                Client::builder(TokioExecutor::new()).build(VirtualConnector::new(stack.clone()));
            for i in 1..=args.requests {
                let response = client.get(uri.clone()).await.map_err(|e| error_chain(&e))?;
                let status = response.status();
                let info = response.extensions().get::<VirtualConnectInfo>().copied();
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| error_chain(&e))?
                    .to_bytes();
                if i == args.requests {
                    let kind = match info {
                        Some(i) if i.plain_tcp => "plain-tcp",
                        Some(_) => "netchannel",
                        None => "unknown",
                    };
                    println!(
                        "hyper_client: {} requests, last: {status}, {} bytes over {kind}",
                        args.requests,
                        body.len()
                    );
                    print!("{}", String::from_utf8_lossy(&body));
                }
                if !status.is_success() {
                    return Err(format!("request {i}: {status}"));
                }
            }
            Ok(())
        });
        drop(rt);
        stack.abort();
        result
    }
}
