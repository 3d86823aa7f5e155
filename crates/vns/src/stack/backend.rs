//! Where a stack's channels come from: the [`Backend`] trait, implemented over AF_XDP
//! channel sets ([`XdpBackend`], netdriver's [`ChannelSet`]) and over the in-process
//! [`MemNetwork`](super::MemNetwork).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::task::{Context, Poll};

use netdriver::channel::{ChannelError, ChannelTransport};

/// A channel as the stack's driver holds it.
pub type BoxedTransport = Box<dyn ChannelTransport>;

/// Opens and accepts channels for a [`Stack`](super::Stack).
///
/// Implementations: [`XdpBackend`] (in-crate TCP over AF_XDP) and
/// [`MemBackend`](super::MemBackend) (in-memory, for tests). `connect` may block for a
/// handshake; the stack calls it from a helper thread, never from its driver or from a
/// tokio task.
pub trait Backend: Send + Sync + 'static {
    /// The host's own address.
    fn ipv4(&self) -> Ipv4Addr;

    /// Opens a channel to `remote` (blocking until established, refused or timed out);
    /// returns it with its local address.
    fn connect(&self, remote: SocketAddrV4)
        -> Result<(BoxedTransport, SocketAddrV4), ChannelError>;

    /// [`connect`](Self::connect) for a channel of `class`; with `separate`, latency
    /// channels go to channel threads (NIC queues) of their own, apart from throughput
    /// ones, where the backend has more than one (`NetScheduler::separate_class_threads`).
    /// The default ignores both.
    fn connect_placed(
        &self,
        remote: SocketAddrV4,
        class: netsched::ChannelClass,
        separate: bool,
    ) -> Result<(BoxedTransport, SocketAddrV4), ChannelError> {
        let _ = (class, separate);
        self.connect(remote)
    }

    /// Pins the channel thread of NIC queue `queue` to `core` (a plan's `Pin`); `false`
    /// (the default) where the backend has no such threads or cannot.
    fn pin_queue_thread(&self, queue: u32, core: usize) -> bool {
        let _ = (queue, core);
        false
    }

    /// Which channel thread serves which NIC queue, on which core, and each thread's
    /// cumulative busy time (see netdriver's `ChannelSet::placement`); `None` (the default)
    /// for backends without channel threads.
    #[cfg(target_os = "linux")]
    fn placement(&self) -> Option<netdriver::channel::ChannelPlacement> {
        None
    }

    /// Runs one more channel thread, pinned to `core` when given, serving no queue yet (a
    /// plan's `SpawnThread`); returns its id. Refused (the default) where the backend has
    /// no channel threads.
    fn add_thread(&self, core: Option<usize>) -> Result<u32, ChannelError> {
        let _ = core;
        Err(ChannelError::InvalidConfig(
            "this backend has no channel threads".into(),
        ))
    }

    /// Ends channel thread `thread` after moving its queues to the others (a plan's
    /// `RetireThread`). Refused (the default) where the backend has no channel threads.
    fn remove_thread(&self, thread: u32) -> Result<(), ChannelError> {
        Err(ChannelError::NoSuchThread(thread))
    }

    /// Serves NIC queue `queue` from channel thread `thread` (a plan's `AssignQueue`).
    /// Refused (the default) where the backend has no channel threads.
    fn move_queue(&self, queue: u32, thread: u32) -> Result<(), ChannelError> {
        let _ = thread;
        Err(ChannelError::NoSuchQueue(queue))
    }

    /// Listens on `port`; accepted channels arrive through the returned [`Acceptor`],
    /// which stops listening when dropped.
    fn listen(&self, port: u16) -> Result<Box<dyn Acceptor>, ChannelError>;

    /// The receive sides of the backend's NIC queues, for a runtime that waits on them
    /// itself (run-to-completion receive); none by default.
    #[cfg(target_os = "linux")]
    fn rx_pollers(&self) -> Vec<netdriver::channel::RxPoller> {
        Vec::new()
    }

    /// Connections lost to a RST received from the wire, for diagnostics and tests; 0
    /// (the default) for backends without a wire.
    fn resets_received(&self) -> u64 {
        0
    }

    /// Fault injection: kills the thread that serves NIC queue `queue` as if it had
    /// crashed (see netdriver's `ChannelSet::kill_queue_thread`). Returns whether it did;
    /// `false` (the default) for backends without such threads.
    fn kill_queue_thread(&self, _queue: u32) -> bool {
        false
    }

    /// Fault injection: holds NIC queue `queue`'s round from another thread until the
    /// hold is dropped (see netdriver's `ChannelSet::hold_queue_round`); `None` (the
    /// default) for backends without NIC queues.
    #[cfg(target_os = "linux")]
    fn hold_queue_round(&self, _queue: u32) -> Option<netdriver::channel::RoundHold> {
        None
    }

    /// The work each channel thread has done so far (cumulative busy time per NIC queue,
    /// see netdriver's `ChannelSet::thread_stats`), from which the stack derives the
    /// utilisation its scheduler's plans see; none (the default) for backends without
    /// channel threads.
    #[cfg(target_os = "linux")]
    fn thread_stats(&self) -> Vec<netdriver::channel::QueueThreadStats> {
        Vec::new()
    }
}

/// Accepted channels of one listened port.
pub trait Acceptor: Send + Sync {
    /// The next accepted channel and its peer's address, or registers `cx`'s waker.
    #[allow(clippy::type_complexity)]
    fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(BoxedTransport, SocketAddrV4), ChannelError>>;
}

#[cfg(target_os = "linux")]
pub use xdp::XdpBackend;

#[cfg(target_os = "linux")]
mod xdp {
    use super::*;
    use netdriver::channel::{ChannelListener, ChannelSet};

    /// Channels over AF_XDP: a netdriver [`ChannelSet`] (one channel thread per NIC
    /// queue to begin with; plans add, move and retire threads). Dropping the backend shuts the set down (threads joined, XDP program
    /// detached).
    #[derive(Debug)]
    pub struct XdpBackend {
        set: ChannelSet,
        /// The next queue a throughput channel goes to when classes are kept apart.
        next_bulk: std::sync::atomic::AtomicUsize,
    }

    impl XdpBackend {
        /// A backend over a started channel set.
        pub fn new(set: ChannelSet) -> XdpBackend {
            XdpBackend {
                set,
                next_bulk: std::sync::atomic::AtomicUsize::new(0),
            }
        }

        /// The channel set.
        pub fn channel_set(&self) -> &ChannelSet {
            &self.set
        }
    }

    impl Backend for XdpBackend {
        fn ipv4(&self) -> Ipv4Addr {
            self.set.config().ipv4
        }

        fn connect(
            &self,
            remote: SocketAddrV4,
        ) -> Result<(BoxedTransport, SocketAddrV4), ChannelError> {
            let c = self.set.connect(remote)?;
            let local = c.local_addr();
            Ok((Box::new(c), local))
        }

        fn listen(&self, port: u16) -> Result<Box<dyn Acceptor>, ChannelError> {
            Ok(Box::new(self.set.listen(port)?))
        }

        /// Keeping classes apart: latency channels on the last queue, throughput channels
        /// round robin over the others (the peer's kernel delivers a veth frame on the
        /// queue it was sent from, so the accepting side's threads follow).
        fn connect_placed(
            &self,
            remote: SocketAddrV4,
            class: netsched::ChannelClass,
            separate: bool,
        ) -> Result<(BoxedTransport, SocketAddrV4), ChannelError> {
            let queues = self.set.queues();
            if !separate || queues.len() < 2 {
                return self.connect(remote);
            }
            let queue = match class {
                netsched::ChannelClass::Latency => queues[queues.len() - 1],
                netsched::ChannelClass::Throughput => {
                    let i = self
                        .next_bulk
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    queues[i % (queues.len() - 1)]
                }
            };
            let c = self.set.connect_on(queue, remote)?;
            let local = c.local_addr();
            Ok((Box::new(c), local))
        }

        fn pin_queue_thread(&self, queue: u32, core: usize) -> bool {
            self.set.pin_queue_thread(queue, core)
        }

        fn rx_pollers(&self) -> Vec<netdriver::channel::RxPoller> {
            self.set.rx_pollers()
        }

        fn resets_received(&self) -> u64 {
            self.set.resets_received()
        }

        fn kill_queue_thread(&self, queue: u32) -> bool {
            self.set.kill_queue_thread(queue)
        }

        fn hold_queue_round(&self, queue: u32) -> Option<netdriver::channel::RoundHold> {
            self.set.hold_queue_round(queue)
        }

        fn thread_stats(&self) -> Vec<netdriver::channel::QueueThreadStats> {
            self.set.thread_stats()
        }

        fn placement(&self) -> Option<netdriver::channel::ChannelPlacement> {
            Some(self.set.placement())
        }

        fn add_thread(&self, core: Option<usize>) -> Result<u32, ChannelError> {
            self.set.add_thread(core)
        }

        fn remove_thread(&self, thread: u32) -> Result<(), ChannelError> {
            self.set.remove_thread(thread)
        }

        fn move_queue(&self, queue: u32, thread: u32) -> Result<(), ChannelError> {
            self.set.move_queue(queue, thread)
        }
    }

    impl Acceptor for ChannelListener {
        fn poll_accept(
            &self,
            cx: &mut Context<'_>,
        ) -> Poll<Result<(BoxedTransport, SocketAddrV4), ChannelError>> {
            ChannelListener::poll_accept(self, cx).map_ok(|c| {
                let peer = c.peer_addr();
                (Box::new(c) as BoxedTransport, peer)
            })
        }
    }
}
