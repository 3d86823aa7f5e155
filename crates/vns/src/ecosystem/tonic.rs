//! tonic on virtual sockets: a server that accepts [`VirtualStream`]s, and clients whose
//! channels open them.
//!
//! - `Connected` for `VirtualStream`, with tonic's own `TcpConnectInfo`, so that
//!   `Request::local_addr` and `Request::remote_addr` work in handlers as over TCP.
//! - [`VirtualIncoming`]: a [`VirtualListener`]'s connections as the stream
//!   `Server::serve_with_incoming` takes ([`VirtualListener::incoming`]).
//! - Clients: `Endpoint::connect_with_connector(VirtualConnector::new(stack))` (the
//!   connector of [`hyper`](super::hyper)).
//!
//! ```no_run
//! use tonic::transport::{Endpoint, Server};
//! use vns::ecosystem::hyper::VirtualConnector;
//!
//! # async fn run(
//! #     stack: vns::stack::Stack,
//! #     router: tonic::service::Routes,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! let listener = stack.bind("10.77.0.2:50051".parse()?).await?;
//! tokio::spawn(Server::builder().add_routes(router).serve_with_incoming(listener.incoming()));
//! let channel = Endpoint::from_static("http://10.77.0.2:50051")
//!     .connect_with_connector(VirtualConnector::new(stack))
//!     .await?;
//! # drop(channel);
//! # Ok(())
//! # }
//! ```

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::stack::{VirtualListener, VirtualStream};

impl Connected for VirtualStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.local_addr().ok(),
            remote_addr: self.peer_addr().ok(),
        }
    }
}

/// The connections of a [`VirtualListener`] as a stream of `io::Result<VirtualStream>`,
/// for tonic's `Server::serve_with_incoming` (or any consumer of a `Stream`). It ends
/// never: errors are yielded as items (tonic logs and goes on), and a stopped stack's
/// error ends tonic's serve future.
#[derive(Debug)]
pub struct VirtualIncoming {
    listener: VirtualListener,
}

impl VirtualIncoming {
    /// The listener's connections.
    pub fn new(listener: VirtualListener) -> VirtualIncoming {
        VirtualIncoming { listener }
    }

    /// The listener back.
    pub fn into_inner(self) -> VirtualListener {
        self.listener
    }
}

impl VirtualListener {
    /// This listener's connections as a stream (see [`VirtualIncoming`]).
    pub fn incoming(self) -> VirtualIncoming {
        VirtualIncoming::new(self)
    }
}

impl futures_core::Stream for VirtualIncoming {
    type Item = io::Result<VirtualStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.listener
            .poll_accept(cx)
            .map(|r| Some(r.map(|(stream, _)| stream)))
    }
}
