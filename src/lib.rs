//! netchannel: a disaggregated user-space network stack after the NetChannel paper
//! (SIGCOMM 2022).
//!
//! Applications use `netchannel::VirtualStream` where they would use
//! `tokio::net::TcpStream`. Under it, virtual sockets ([`vns`]) run over a pluggable
//! scheduler ([`netsched`]) over channels ([`netdriver`]), each channel an in-crate TCP
//! connection carried by AF_XDP sockets.
//!
//! ```no_run
//! use netchannel::{Stack, VirtualListener, VirtualStream, AppClass};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let stack = Stack::builder()
//!     .interface("vB")                     // AF_XDP sockets on this interface's queues
//!     .ipv4("10.77.0.2".parse()?)          // the stack's own address there
//!     .copy_workers(1)
//!     .scheduler(netchannel::sched::RoundRobin::default())
//!     .build()?;
//! let listener: VirtualListener = stack.bind("10.77.0.2:7000".parse()?).await?;
//! let (mut stream, _peer) = listener.accept().await?;
//! stream.set_app_class(AppClass::Latency)?;
//! let mut buf = [0u8; 4];
//! stream.read_exact(&mut buf).await?;
//! stream.write_all(&buf).await?;
//! let other: VirtualStream = stack.connect("10.77.0.1:7000".parse()?).await?;
//! let (_rd, _wr) = other.into_split();
//! # Ok(())
//! # }
//! ```
//!
//! Without privileges, stacks run on an in-memory network
//! ([`vns::stack::MemNetwork`], [`Stack::pair_in_memory`]).

/// The `ncperf` wire protocol (hello, requests and their checks, the bulk pattern and the
/// server's side), shared by the `ncperf` binary and the benches' remote-peer mode.
#[doc(hidden)]
pub mod perf_proto;

pub use netdriver;
pub use netsched;
/// Scheduling policies ([`netsched`]): pass one to [`StackBuilder::scheduler`].
pub use netsched as sched;
pub use vns;
/// Trait implementations and adapters for axum, tonic and hyper (cargo features `axum`,
/// `tonic`, `hyper`, off by default); see [`vns::ecosystem`]. TLS (`tokio-rustls`) needs
/// none: a `VirtualStream` is an `AsyncRead + AsyncWrite + Unpin` stream.
pub use vns::ecosystem;

/// tokio's networking names for netchannel's streams, so that porting a tokio program is
/// a rename: `use netchannel::net::{TcpListener, TcpStream};` in place of
/// `use tokio::net::{TcpListener, TcpStream};` (and `TcpSocket` for options set before
/// connecting or listening), and `netchannel::net::tcp::OwnedReadHalf` and friends in
/// place of `tokio::net::tcp::...`.
///
/// ```no_run
/// use netchannel::net::{TcpListener, TcpStream};
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// # async fn demo() -> std::io::Result<()> {
/// // On the default stack (`NETCHANNEL_INTERFACE`, `NETCHANNEL_IPV4`).
/// let listener = TcpListener::bind("10.0.0.1:7000").await?;
/// let (mut socket, _) = listener.accept().await?;
/// let mut buf = [0u8; 1024];
/// let n = socket.read(&mut buf).await?;
/// socket.write_all(&buf[..n]).await?;
/// let mut client = TcpStream::connect("10.0.0.2:7000").await?;
/// client.write_all(b"hello").await?;
/// # Ok(())
/// # }
/// ```
///
/// # What differs from tokio's types
///
/// The readiness methods (`ready`, `readable`, `writable`, `try_*`, `peek`), on the stream
/// and on its four halves, behave as tokio's. Some socket options are about a kernel
/// socket, which a virtual stream is not:
///
/// | tokio | here | why |
/// | --- | --- | --- |
/// | `TcpStream::from_std`, `TcpListener::from_std` | absent | a kernel socket's connection lives in the kernel's TCP; it cannot be moved into the stack's |
/// | `into_std`, `AsRawFd`, `AsFd` | `into_std` fails with `Unsupported` (but for loopback streams) | there is no file descriptor |
/// | `ttl`, `TcpListener::ttl` | `Ok(IP_TTL)` (64) | the stack sends every segment with the interface's TTL |
/// | `set_ttl` | `Unsupported` for anything but 64 | segments share a header template; no socket has its own |
/// | `set_linger`, `set_zero_linger` | zero lingers abort on drop; other durations are recorded only | a drop never blocks |
/// | `take_error` | always `Ok(None)` | a failure is returned by the pending call and every later one, never held back |
/// | `quickack`, `set_quickack` | recorded only on a virtual stream; a plain-TCP stream's channel and a loopback stream's socket get it | a virtual socket's data is acknowledged per chunk, by credit, over channels that many sockets share |
///
/// [`IP_TTL`]: vns::stack::IP_TTL
pub mod net {
    pub use vns::stack::{
        VirtualListener as TcpListener, VirtualSocket as TcpSocket, VirtualStream as TcpStream,
    };

    /// The halves of a stream, as in `tokio::net::tcp`.
    pub mod tcp {
        pub use vns::stack::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, ReuniteError, WriteHalf};
    }
}
pub use vns::stack::{
    clear_default_stack, default_stack, set_default_stack, BusyPoll, Diagnostics, Liveness,
    OwnedReadHalf, OwnedWriteHalf, ReadHalf, Stack, StackBuilder, StackError, VirtualListener,
    VirtualSocket, VirtualStream, WriteHalf,
};
pub use vns::AppClass;
