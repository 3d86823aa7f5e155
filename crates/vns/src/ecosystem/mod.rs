//! The service ecosystem on virtual sockets: trait implementations that let axum, tonic
//! and hyper use [`VirtualListener`](crate::stack::VirtualListener) and
//! [`VirtualStream`](crate::stack::VirtualStream) as they use tokio's TCP types, each
//! behind a cargo feature that is off by default (the root package `netchannel` has the
//! same features and re-exports this module as `netchannel::ecosystem`):
//!
//! | feature | what it adds |
//! | --- | --- |
//! | `axum` | `axum::serve::Listener` for `VirtualListener`; `axum::serve(listener, app)` serves on virtual sockets, with the peer's address as connect info (`into_make_service_with_connect_info::<VirtualConnectInfo>()`) |
//! | `tonic` | `tonic::transport::server::Connected` for `VirtualStream` (tonic's `TcpConnectInfo`, so `Request::remote_addr` works), [`VirtualIncoming`](tonic::VirtualIncoming) for `Server::serve_with_incoming`, and the connector of `hyper` for `Endpoint::connect_with_connector` |
//! | `hyper` | [`VirtualConnector`](hyper::VirtualConnector), a `tower::Service<Uri>` for hyper-util's legacy pooled client and for tonic's channels, and hyper-util's `Connection` for `VirtualStream` |
//!
//! These live here, beside the types, because Rust's orphan rule allows implementing a
//! foreign trait only in the crate that defines the type or the trait. TLS needs nothing
//! of its own: `tokio-rustls` takes any `AsyncRead + AsyncWrite + Unpin` stream, so a
//! `VirtualStream` goes straight into `TlsAcceptor::accept` and `TlsConnector::connect`
//! (the `tls` example of the root package shows both ends).

#[cfg(feature = "axum")]
pub mod axum;
#[cfg(feature = "hyper")]
pub mod hyper;
#[cfg(feature = "tonic")]
pub mod tonic;

use std::net::SocketAddr;

/// The addresses of an accepted or opened virtual stream: what axum handlers get as
/// `ConnectInfo<VirtualConnectInfo>`, and what hyper-util's client puts in each
/// response's extensions. (axum's `ConnectInfo<SocketAddr>` cannot be had for a listener
/// outside axum and tokio: the orphan rule allows `Connected` only for a type of this
/// crate.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtualConnectInfo {
    /// Our address.
    pub local_addr: SocketAddr,
    /// The peer's address.
    pub remote_addr: SocketAddr,
    /// Whether the stream is plain TCP (the peer runs no NetChannel stack).
    pub plain_tcp: bool,
}

impl VirtualConnectInfo {
    /// The addresses of `stream`, or `None` if it has none (never for an open stream).
    pub fn of(stream: &crate::stack::VirtualStream) -> Option<VirtualConnectInfo> {
        Some(VirtualConnectInfo {
            local_addr: stream.local_addr().ok()?,
            remote_addr: stream.peer_addr().ok()?,
            plain_tcp: stream.is_plain_tcp(),
        })
    }
}
