//! A hyper-util connector over virtual sockets.
//!
//! [`VirtualConnector`] is a `tower::Service<Uri>` that opens a [`VirtualStream`] to the
//! URI's host and port (80 for `http`, 443 for `https` when none is given) on a given
//! [`Stack`], or on the process's default stack, and returns it in hyper-util's
//! `TokioIo`. hyper-util's legacy pooled client takes it as its connector, and tonic's
//! `Endpoint::connect_with_connector` as a channel's. Like any stream of the stack, a
//! connection to a host that runs no NetChannel stack falls back to plain TCP.
//!
//! ```no_run
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use vns::ecosystem::hyper::VirtualConnector;
//!
//! # async fn run(stack: vns::stack::Stack) -> Result<(), Box<dyn std::error::Error>> {
//! // Request bodies of type String (http-body-util's `Empty` or `Full` do as well).
//! let client: Client<_, String> =
//!     Client::builder(TokioExecutor::new()).build(VirtualConnector::new(stack));
//! let response = client.get("http://10.77.0.2:8080/".parse()?).await?;
//! assert!(response.status().is_success());
//! # Ok(())
//! # }
//! ```
//!
//! `VirtualStream` implements hyper-util's `Connection`: the connection's metadata
//! carries a [`VirtualConnectInfo`] (`Connected::extra`), which the legacy client copies
//! into every response's extensions.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;

pub use super::VirtualConnectInfo;
use crate::stack::{resolve_v4, Stack, VirtualStream};

impl Connection for VirtualStream {
    fn connected(&self) -> Connected {
        let connected = Connected::new();
        match VirtualConnectInfo::of(self) {
            Some(info) => connected.extra(info),
            None => connected,
        }
    }
}

/// Opens virtual streams to URIs: a hyper-util connector (see the
/// [module documentation](self)).
#[derive(Clone, Default)]
pub struct VirtualConnector {
    stack: Option<Stack>,
}

impl std::fmt::Debug for VirtualConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualConnector")
            .field("default_stack", &self.stack.is_none())
            .finish()
    }
}

impl VirtualConnector {
    /// A connector on `stack`.
    pub fn new(stack: Stack) -> VirtualConnector {
        VirtualConnector { stack: Some(stack) }
    }

    /// A connector on the process's default stack, looked up at each connect (see
    /// [`set_default_stack`](crate::stack::set_default_stack)).
    pub fn on_default_stack() -> VirtualConnector {
        VirtualConnector { stack: None }
    }
}

/// The host and port a URI names (the scheme's port when it has none).
fn host_port(uri: &Uri) -> io::Result<(String, u16)> {
    let invalid =
        |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{what}: {uri}"));
    let host = uri.host().ok_or_else(|| invalid("URI without a host"))?;
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(p), _) => p,
        (None, Some("http")) | (None, None) => 80,
        (None, Some("https")) => 443,
        (None, Some(_)) => return Err(invalid("URI of an unknown scheme without a port")),
    };
    // An IPv6 literal keeps its brackets in `host`; the stack is IPv4-only and says so
    // when resolution finds no IPv4 address.
    Ok((
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
    ))
}

async fn connect(stack: Option<Stack>, uri: Uri) -> io::Result<VirtualStream> {
    let (host, port) = host_port(&uri)?;
    let stack = match stack {
        Some(s) => s,
        None => crate::stack::default_stack()?,
    };
    let mut last = None;
    for addr in resolve_v4((host.as_str(), port)).await? {
        match stack.connect(addr.into()).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address")))
}

impl tower_service::Service<Uri> for VirtualConnector {
    type Response = TokioIo<VirtualStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<VirtualStream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let stack = self.stack.clone();
        Box::pin(async move { connect(stack, uri).await.map(TokioIo::new) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_give_their_port_or_their_schemes() {
        let hp = |s: &str| host_port(&s.parse().unwrap());
        assert_eq!(
            hp("http://10.0.0.1:8080/x").unwrap(),
            ("10.0.0.1".into(), 8080)
        );
        assert_eq!(
            hp("http://example.test/").unwrap(),
            ("example.test".into(), 80)
        );
        assert_eq!(
            hp("https://example.test").unwrap(),
            ("example.test".into(), 443)
        );
        assert_eq!(hp("http://[::1]:9/").unwrap(), ("::1".into(), 9));
        assert_eq!(
            hp("ftp://example.test/").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            hp("/relative").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
