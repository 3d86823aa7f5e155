//! Opening a virtual stream: a socket of the stack's endpoint and its connect.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddrV4;
use std::task::Poll;
use std::time::Instant;

use tracing::debug;

use crate::stack::core::stopped_error;
use crate::stack::Stack;

use super::plain::connect_plain;
use super::{StreamInner, VirtualStream};
use crate::endpoint::{Error, SocketOptions};

/// Opens a virtual socket to `addr` on `stack` (see [`Stack::connect`]).
pub(crate) async fn connect(stack: &Stack, addr: SocketAddrV4) -> io::Result<VirtualStream> {
    connect_with(stack, addr, SocketOptions::default()).await
}

/// [`connect`] with per-socket settings ([`VirtualSocket`](super::VirtualSocket)).
pub(crate) async fn connect_with(
    stack: &Stack,
    addr: SocketAddrV4,
    opts: SocketOptions,
) -> io::Result<VirtualStream> {
    let core = stack.core();
    let class = opts.app_class;
    let mut attempt = None;
    let peer =
        match poll_fn(|cx| core.poll_peer(*addr.ip(), class.channel_class(), &mut attempt, cx))
            .await
        {
            Ok(p) => p,
            // No channel port there: a host without NetChannel; try plain TCP.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                debug!(%addr, "no channel port; falling back to plain TCP");
                return connect_plain(stack, addr).await;
            }
            Err(e) => return Err(e),
        };
    let (sid, local) = {
        // A chosen local port decides the shard, as for a received chunk.
        let shard = match opts.local_port {
            Some(p) => core.shard_for_ports(p, addr.port()),
            None => core.next_connect_shard(addr.port(), class),
        };
        let mut st = core.lock_shard(shard);
        if core.refuses_new() {
            return Err(stopped_error());
        }
        let sid = st.ep.connect_with(peer, addr.port(), class, opts)?;
        let (_, local, _) = st.ep.socket_addr(sid).expect("just created");
        st.track(sid);
        st.deadlines
            .insert(sid, Instant::now() + core.config.connect_timeout);
        // The SYNC goes now.
        core.finish_call(st);
        (sid, local)
    };
    // The connect deadline reaches the control task.
    core.control.notify();
    // From here on, dropping the stream (or this future) releases the socket.
    let stream = VirtualStream::from_inner(StreamInner::new(
        stack.clone(),
        sid,
        SocketAddrV4::new(core.ipv4(), local),
        addr,
    ));
    poll_fn(|cx| {
        let mut st = core.lock_socket(sid);
        if st.ep.is_connected(sid) {
            st.deadlines.remove(&sid);
            return Poll::Ready(Ok(()));
        }
        if st.socks.get(&sid).is_some_and(|s| s.timed_out) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect to {addr} timed out"),
            )));
        }
        match st.ep.recv(sid, &mut []) {
            Err(Error::WouldBlock) if st.stopped => Poll::Ready(Err(stopped_error())),
            Err(Error::WouldBlock) | Ok(_) => {
                if let Some(w) = st.socks.get_mut(&sid) {
                    w.write = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e.into())),
        }
    })
    .await?;
    debug!(socket = %sid, %addr, "connected");
    Ok(stream)
}
