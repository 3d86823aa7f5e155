//! Links: pipes of whole Ethernet frames that the channels run over.
//!
//! A [`Link`] moves Ethernet II frames (destination MAC first, no preamble, no FCS) between
//! this host and the wire. Two implementations share the trait:
//!
//! - [`sim::SimLink`]: an in-memory pair of ends in *virtual* time, with latency, bandwidth,
//!   MTU and a bounded queue, so every protocol test runs without privileges and
//!   deterministically;
//! - the AF_XDP link (next issue): frames live in a UMEM shared with the kernel.
//!
//! [`fault::FaultInjector`] wraps any link and loses, reorders, duplicates and corrupts
//! frames at seeded rates.
//!
//! # Why callbacks over borrowed frames
//!
//! The trait is shaped by what AF_XDP can do without copying:
//!
//! - **Receive**: a received frame is a descriptor into UMEM; it must go back to the fill
//!   ring once the stack has looked at it. [`Link::recv_batch`] lends each frame to a
//!   callback as `&[u8]` and recycles it when the callback returns, so a frame can neither
//!   leak nor be used after it went back to the kernel, and the ring indices are advanced
//!   once per batch rather than once per frame.
//! - **Transmit**: a tx frame is taken from a free-frame pool, written in place, and
//!   submitted to the tx ring; completions are reclaimed in batches and one `sendto` kick
//!   follows a batch. [`Link::tx_batch`] lends empty frame buffers (`&mut [u8]`, exactly
//!   [`TX_HEADROOM`] + [`Link::max_frame_len`] bytes long) to a callback that writes the
//!   frame in place and says where it lies, and [`Link::flush`] is the kick.
//!
//! # Why tx buffers have headroom
//!
//! A TCP sender knows its payload before it knows its header: the options (timestamps, up
//! to four SACK blocks) are chosen in the same call that copies the payload out of the send
//! buffer. To copy the payload exactly once, straight into the frame, the writer puts it at
//! a fixed offset that leaves room for the longest header, then writes the actual headers
//! just in front of it; the frame therefore starts somewhere in the first [`TX_HEADROOM`]
//! bytes of the buffer and the callback returns its range. An AF_XDP tx descriptor is an
//! address plus a length inside a UMEM chunk, so it carries such an offset for free; the
//! alternative, moving the payload once the header length is known, would be a second copy
//! of every byte sent.
//!
//! smoltcp's `Device` uses one-shot RxToken/TxToken values (a GAT per token) instead. Tokens
//! make a per-frame API that is awkward to batch and impossible to use as `dyn`; the
//! callback form keeps the trait object-safe (`Box<dyn Link>` works, e.g. to pick the link
//! at run time) while hot paths stay generic over `L: Link`, so the link's own methods are
//! called statically. The per-frame callback is a `&mut dyn FnMut`: one indirect call per
//! frame, a few nanoseconds against the microsecond a 1514-byte frame takes at 10 Gbit/s,
//! and it spares the trait generic methods that would end object safety.
//!
//! # MTU
//!
//! [`Link::mtu`] is the **IP MTU**, the largest Ethernet *payload* (1500 on the test bed),
//! because that is the number operators configure (`ip link set mtu`) and the one TCP's MSS
//! derives from. The largest frame is [`Link::max_frame_len`] = MTU + 14 (1514); links drop
//! and count anything longer.
//!
//! # Time
//!
//! Every method takes `now`; no link reads a clock. The simulated link is driven purely by
//! these arguments, and [`Link::poll_at`] tells a driver of virtual time when to call again.

pub mod fault;
pub mod sim;
pub mod switch;
#[cfg(target_os = "linux")]
pub mod umem_memory;
#[cfg(target_os = "linux")]
pub mod xdp;
#[cfg(target_os = "linux")]
pub mod xdp_bind;
#[cfg(target_os = "linux")]
pub mod xdp_features;

use core::ops::Range;

use crate::time::Instant;

/// Length of an Ethernet II header (two MAC addresses and the EtherType), the difference
/// between the largest frame and the IP MTU.
pub const ETHERNET_HEADER_LEN: usize = 14;

/// Bytes of room in front of every lent tx buffer beyond the largest frame (see the
/// [module documentation](self)): at least the 40 bytes of TCP options a header may carry,
/// rounded up to a cache line.
pub const TX_HEADROOM: usize = 64;

/// Whether `range` is a frame a link can send from a lent tx buffer of `buf_len` bytes.
pub fn tx_range_ok(range: &Range<usize>, buf_len: usize, max_frame_len: usize) -> bool {
    range.start <= range.end && range.end <= buf_len && range.len() <= max_frame_len
}

/// Counters a link keeps. All are totals since the link was created and only grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames handed to the receiver.
    pub rx_frames: u64,
    /// Bytes in the frames handed to the receiver.
    pub rx_bytes: u64,
    /// Frames accepted for transmission.
    pub tx_frames: u64,
    /// Bytes in the frames accepted for transmission.
    pub tx_bytes: u64,
    /// Frames dropped because they were longer than [`Link::max_frame_len`] (or, on
    /// transmit, longer than the buffer they were written into).
    pub dropped_oversize: u64,
    /// Frames dropped because no buffer or queue slot was free (drop-tail queue full on the
    /// simulated link; fill ring empty on AF_XDP).
    pub dropped_no_buffer: u64,
    /// System calls made to push queued frames out (`sendto` kicks on AF_XDP; zero on
    /// links that need none). A flush with nothing queued makes none.
    pub tx_kicks: u64,
}

/// A pipe of whole Ethernet frames. See the [module documentation](self) for why it is
/// shaped this way.
///
/// Implementations never panic on any frame content or length and never block.
pub trait Link {
    /// The IP MTU: the largest Ethernet payload this link carries, in bytes.
    fn mtu(&self) -> usize;

    /// The largest frame this link carries: [`mtu`](Link::mtu) plus the Ethernet header.
    fn max_frame_len(&self) -> usize {
        self.mtu() + ETHERNET_HEADER_LEN
    }

    /// Receives up to `max` frames that have arrived by `now`, lending each in turn to `f`.
    ///
    /// A frame is borrowed only for the duration of its call and is recycled afterwards;
    /// copy out whatever must outlive the call. Returns the number of frames delivered.
    fn recv_batch(&mut self, now: Instant, max: usize, f: &mut dyn FnMut(&[u8])) -> usize;

    /// Transmits up to `max` frames written in place.
    ///
    /// For each free tx buffer (while fewer than `max` frames have been produced), `f` gets
    /// a buffer of exactly [`TX_HEADROOM`] + [`max_frame_len`](Link::max_frame_len) bytes,
    /// with unspecified contents, and returns `Some(range)` to send the bytes `buf[range]`,
    /// or `None` when it has nothing more to send (the buffer then goes back to the pool
    /// unsent). A frame may start anywhere; one longer than `max_frame_len`, or a range
    /// outside the buffer, is dropped and counted in [`LinkStats::dropped_oversize`]. `f`
    /// stops being called early when the link runs out of tx buffers: that is backpressure,
    /// and the caller should try again after a later [`flush`](Link::flush).
    ///
    /// Frames may sit in the link until [`flush`](Link::flush). Returns the number of
    /// `Some` answers (frames the caller produced).
    fn tx_batch(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&mut [u8]) -> Option<Range<usize>>,
    ) -> usize;

    /// Pushes out frames queued by [`tx_batch`](Link::tx_batch) (on AF_XDP, the `sendto`
    /// kick, and reclaiming completed tx frames).
    fn flush(&mut self, now: Instant);

    /// When this link next has something to do without being asked: a frame becoming
    /// receivable in virtual time, or a held frame to release. `None` when nothing is
    /// scheduled, or when readiness comes from outside (an AF_XDP link: poll its fd).
    fn poll_at(&self) -> Option<Instant>;

    /// The link's counters.
    fn stats(&self) -> LinkStats;

    /// Copies one frame out of `frame` and transmits it (convenience for tests and control
    /// traffic; hot paths write in place with [`tx_batch`](Link::tx_batch)). Returns whether
    /// the link accepted it; an oversized frame is counted and refused.
    fn send_frame(&mut self, now: Instant, frame: &[u8]) -> bool {
        let mut done = false;
        let sent = self.tx_batch(now, 1, &mut |buf| {
            if done {
                return None;
            }
            done = true;
            if let Some(dst) = buf.get_mut(..frame.len()) {
                dst.copy_from_slice(frame);
            }
            // An oversized length is passed on unchanged so the link counts the drop.
            Some(0..frame.len())
        });
        sent == 1 && frame.len() <= self.max_frame_len()
    }
}

/// A link that a queue driver (`channel::QueueDriver`) waits on: besides moving frames, it
/// tells the driver how it learns that frames arrived.
///
/// A link over a kernel socket (AF_XDP) names its descriptor, which the driver registers
/// with its runtime's reactor and waits on for readability; an in-memory link
/// ([`switch::SwitchPort`]) has none and wakes the waker the driver registers instead.
pub trait QueueLink: Link + Send {
    /// The descriptor that polls readable when frames wait, or `None` for a link that
    /// wakes [`register_rx_waker`](Self::register_rx_waker)'s waker instead.
    fn rx_fd(&self) -> Option<std::os::fd::RawFd>;

    /// Links without a descriptor: wake `waker` when a frame arrives (it replaces the one
    /// registered before). Links with one ignore it.
    fn register_rx_waker(&self, waker: &std::task::Waker);

    /// Whether a received frame waits now (no system call).
    fn rx_ready(&mut self) -> bool;
}

impl<L: Link + ?Sized> Link for Box<L> {
    fn mtu(&self) -> usize {
        (**self).mtu()
    }
    fn max_frame_len(&self) -> usize {
        (**self).max_frame_len()
    }
    fn recv_batch(&mut self, now: Instant, max: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        (**self).recv_batch(now, max, f)
    }
    fn tx_batch(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&mut [u8]) -> Option<Range<usize>>,
    ) -> usize {
        (**self).tx_batch(now, max, f)
    }
    fn flush(&mut self, now: Instant) {
        (**self).flush(now)
    }
    fn poll_at(&self) -> Option<Instant> {
        (**self).poll_at()
    }
    fn stats(&self) -> LinkStats {
        (**self).stats()
    }
}
