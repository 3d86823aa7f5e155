//! TLS over virtual sockets with tokio-rustls: a `VirtualStream` is an
//! `AsyncRead + AsyncWrite + Unpin` stream, so `TlsAcceptor::accept` and
//! `TlsConnector::connect` take it as they take a `TcpStream`. No feature is needed.
//!
//! The server makes a self-signed certificate for `netchannel.test` (rcgen), writes it
//! (PEM) to `--cert-out`, and echoes each TLS connection line by line; the client trusts
//! that certificate (`--ca`), sends `--lines` lines and checks the echo. The server also
//! serves plain-TCP clients of its port, such as `openssl s_client`.
//!
//! ```text
//! cargo run --example tls -- --interface vA --ipv4 10.77.0.1 --listen 8443 --cert-out /tmp/nc.pem
//! cargo run --example tls -- --interface vB --ipv4 10.77.0.2 --connect 10.77.0.1:8443 --ca /tmp/nc.pem
//! openssl s_client -connect 10.77.0.1:8443 -CAfile /tmp/nc.pem -servername netchannel.test
//! ```
//!
//! Needs root (AF_XDP). The server stops on SIGINT/SIGTERM.

mod support;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// A TLS echo server or client on netchannel.
#[derive(Parser, Debug)]
struct Args {
    /// Interface for the stack's AF_XDP sockets.
    #[arg(long, value_name = "IFACE")]
    interface: String,
    /// The stack's IPv4 address on that interface.
    #[arg(long, value_name = "ADDR")]
    ipv4: std::net::Ipv4Addr,
    /// Serve on this port.
    #[arg(
        long,
        value_name = "PORT",
        conflicts_with = "connect",
        requires = "cert_out"
    )]
    listen: Option<u16>,
    /// Where the server writes its certificate (PEM).
    #[arg(long, value_name = "PATH")]
    cert_out: Option<PathBuf>,
    /// Connect to this TLS echo server.
    #[arg(long, value_name = "ADDR:PORT", requires = "ca")]
    connect: Option<std::net::SocketAddr>,
    /// The certificate the client trusts (PEM).
    #[arg(long, value_name = "PATH")]
    ca: Option<PathBuf>,
    /// Lines the client sends.
    #[arg(long, default_value_t = 100)]
    lines: u32,
}

/// The name in the server's certificate.
const SERVER_NAME: &str = "netchannel.test";

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
            eprintln!("tls: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::net::{SocketAddr, SocketAddrV4};
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use netchannel::{Stack, VirtualStream};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
    use tokio_rustls::{TlsAcceptor, TlsConnector};

    use super::{Args, SERVER_NAME};
    use crate::support::{build_stack, connection_kind, stop_on_signals, stopped};

    /// Longest a client waits for its echo.
    const TIMEOUT: Duration = Duration::from_secs(30);

    pub fn run(args: Args) -> Result<(), String> {
        let stop = stop_on_signals("tls").map_err(|e| e.to_string())?;
        let stack = build_stack(&args.interface, args.ipv4, None).map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let result = match (
            args.listen,
            args.cert_out.as_deref(),
            args.connect,
            args.ca.as_deref(),
        ) {
            (Some(port), Some(out), _, _) => rt.block_on(server(&stack, &args, port, out, stop)),
            (None, _, Some(to), Some(ca)) => rt
                .block_on(async {
                    tokio::time::timeout(TIMEOUT, client(&stack, to, ca, args.lines)).await
                })
                .unwrap_or_else(|_| Err(format!("no echo within {TIMEOUT:?}"))),
            _ => Err("give --listen PORT --cert-out PATH, or --connect ADDR:PORT --ca PATH".into()),
        };
        rt.shutdown_timeout(Duration::from_secs(1));
        stack.abort();
        result
    }

    async fn server(
        stack: &Stack,
        args: &Args,
        port: u16,
        cert_out: &Path,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), String> {
        let certified = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
            .map_err(|e| format!("making a certificate: {e}"))?;
        std::fs::write(cert_out, certified.cert.pem())
            .map_err(|e| format!("writing {}: {e}", cert_out.display()))?;
        let key = PrivateKeyDer::try_from(certified.signing_key.serialize_der())
            .map_err(|e| format!("the key: {e}"))?;
        let config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![certified.cert.der().clone()], key)
            .map_err(|e| format!("TLS configuration: {e}"))?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let addr = SocketAddrV4::new(stack.ipv4(), port);
        let listener = stack.bind(addr.into()).await.map_err(|e| e.to_string())?;
        println!(
            "tls server: netchannel on {} ({}), channel port 9000, listening on port {port}",
            args.interface, args.ipv4
        );
        loop {
            tokio::select! {
                _ = stopped(&mut stop) => break,
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => return Err(format!("accept: {e}")),
                    };
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let kind = connection_kind(&stream);
                        match echo(acceptor, stream).await {
                            Ok(n) => println!("tls server: {peer} over {kind}: echoed {n} lines"),
                            Err(e) => println!("tls server: {peer} over {kind}: {e}"),
                        }
                    });
                }
            }
        }
        println!("tls server: stopped");
        Ok(())
    }

    /// Completes the handshake on `stream` and echoes lines until the client ends.
    async fn echo(acceptor: TlsAcceptor, stream: VirtualStream) -> Result<u64, String> {
        let tls = acceptor
            .accept(stream)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let (rd, mut wr) = tokio::io::split(tls);
        let mut lines = BufReader::new(rd).lines();
        let mut n = 0;
        while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
            wr.write_all(format!("{line}\n").as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            n += 1;
        }
        wr.shutdown().await.map_err(|e| e.to_string())?;
        Ok(n)
    }

    async fn client(stack: &Stack, to: SocketAddr, ca: &Path, lines: u32) -> Result<(), String> {
        let mut roots = RootCertStore::empty();
        for cert in
            CertificateDer::pem_file_iter(ca).map_err(|e| format!("{}: {e}", ca.display()))?
        {
            roots
                .add(cert.map_err(|e| format!("{}: {e}", ca.display()))?)
                .map_err(|e| format!("{}: {e}", ca.display()))?;
        }
        let config = ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let stream = stack
            .connect(to)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let kind = connection_kind(&stream);
        let name = ServerName::try_from(SERVER_NAME).map_err(|e| e.to_string())?;
        let tls = TlsConnector::from(Arc::new(config))
            .connect(name, stream)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let protocol = tls.get_ref().1.protocol_version();
        let (rd, mut wr) = tokio::io::split(tls);
        let writer = async move {
            for i in 0..lines {
                wr.write_all(format!("line {i} over TLS\n").as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            wr.shutdown().await.map_err(|e| e.to_string())
        };
        let reader = async move {
            let mut got = BufReader::new(rd).lines();
            for i in 0..lines {
                let line = got.next_line().await.map_err(|e| e.to_string())?;
                if line.as_deref() != Some(&format!("line {i} over TLS")) {
                    return Err(format!("line {i}: got {line:?}"));
                }
            }
            Ok(())
        };
        let (w, r) = tokio::join!(writer, reader);
        w?;
        r?;
        println!("tls client: {lines} lines echoed over TLS ({protocol:?}) to {to} over {kind}");
        Ok(())
    }
}
