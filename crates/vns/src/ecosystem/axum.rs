//! `axum::serve::Listener` for [`VirtualListener`]: `axum::serve(listener, app)` runs an
//! axum application on virtual sockets (and on plain-TCP clients of the listener's port).
//!
//! Handlers get the peer's address as `ConnectInfo<VirtualConnectInfo>` (its
//! `remote_addr`, beside our address and whether the stream is plain TCP):
//!
//! ```no_run
//! use axum::{extract::ConnectInfo, routing::get, Router};
//! use vns::ecosystem::VirtualConnectInfo;
//!
//! # async fn run(listener: vns::stack::VirtualListener) -> std::io::Result<()> {
//! let app = Router::new().route(
//!     "/",
//!     get(|ConnectInfo(c): ConnectInfo<VirtualConnectInfo>| async move {
//!         format!("hello {}\n", c.remote_addr)
//!     }),
//! );
//! axum::serve(listener, app.into_make_service_with_connect_info::<VirtualConnectInfo>())
//!     .await
//! # }
//! ```

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;

use super::VirtualConnectInfo;
use crate::stack::{VirtualListener, VirtualStream};

impl Connected<IncomingStream<'_, VirtualListener>> for VirtualConnectInfo {
    fn connect_info(stream: IncomingStream<'_, VirtualListener>) -> VirtualConnectInfo {
        let io = stream.io();
        VirtualConnectInfo {
            local_addr: io
                .local_addr()
                .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0))),
            remote_addr: *stream.remote_addr(),
            plain_tcp: io.is_plain_tcp(),
        }
    }
}

impl axum::serve::Listener for VirtualListener {
    type Io = VirtualStream;
    type Addr = SocketAddr;

    /// The next connection. Errors are logged and retried, as axum's listener for tokio's
    /// `TcpListener` does: a refused, aborted or reset connection at once, any other after
    /// a second (a stopped stack keeps failing; stop serving with axum's graceful
    /// shutdown before stopping the stack).
    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match VirtualListener::accept(self).await {
                Ok(accepted) => return accepted,
                Err(e) => {
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                    ) {
                        tracing::debug!(error = %e, "axum listener: accept failed");
                        continue;
                    }
                    tracing::error!(error = %e, "axum listener: accept failed; retrying in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        VirtualListener::local_addr(self)
    }
}
