//! Links: pipes of whole Ethernet frames that the channels run over.
//!
//! A [`Link`] moves Ethernet II frames (destination MAC first, no preamble, no FCS) between
//! this host and the wire. Two implementations share the trait:
//!
//! - [`sim::SimLink`]: an in-memory pair of ends in *virtual* time, with latency, bandwidth,
//!   MTU and a bounded queue, so every protocol test runs without privileges and
//!   deterministically;
//! - the AF_XDP link ([`xdp`]): frames live in a UMEM shared with the kernel;
//! - the AF_PACKET link ([`packet`]): frames through the kernel's device layer, with
//!   segmentation and checksum offload through a `virtio_net_hdr`, for hosts where AF_XDP
//!   must copy (veth, drivers without zero-copy). Which to choose: `docs/investigations/bulk.md`.
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
//!
//! # Offloads: segmentation and checksums
//!
//! A link may do work the stack would otherwise do per wire segment, and says which in
//! [`Link::offloads`] ([`Offloads`]; none by default, today's behaviour):
//!
//! - **Segmentation** (TSO/GSO): the stack hands over one *super-segment*, a TCP segment of
//!   up to 64 KiB of payload whose headers are those of its first wire segment, with the
//!   wire segment size noted in [`TxMeta::segment_size`]; the link (a NIC, the kernel
//!   behind a `virtio_net_hdr`, the simulated wire) cuts it into segments of that size,
//!   advancing the sequence number and keeping PSH and FIN for the last one, as Linux's
//!   `tcp_gso_segment` does. One super-segment then costs the stack's per-segment work
//!   (headers, timers, loss records, a ring slot, a system call) once instead of up to 44
//!   times at MTU 1500.
//! - **Checksum**: the stack leaves the TCP checksum to the link
//!   ([`TxMeta::partial_checksum`]: the field holds the pseudo-header sum, as Linux's
//!   `CHECKSUM_PARTIAL`), so payload bytes are copied without being summed; segmentation
//!   needs it, since every cut segment has its own checksum.
//! - **Coalescing on receive** (GRO/LRO): a link may deliver several in-order segments of
//!   one flow as one large segment, and may vouch for a frame's checksum
//!   ([`RxMeta::checksum_verified`]: the kernel or NIC verified it, or it came from a
//!   local sender that never computed one). The TCP accepts segments of any length up to
//!   what IPv4 carries, whatever MSS it advertised, so a link needs no setting for this.
//!
//! A frame a link received as a chain of buffers (AF_XDP multi-buffer: jumbo frames in
//! UMEM chunks, each behind the kernel's headroom) is lent by [`Link::recv_batch_parts`]
//! as its parts, so the stack parses the headers in the first and copies the payload into
//! TCP's receive ring straight from where each part lies; the other receive methods
//! gather such a frame into one slice first.
//!
//! - **Gather on transmit**: parts of a frame may lie in buffers the stack shares rather
//!   than copies ([`Link::tx_batch_gather`], [`SharedSpan`]): a TCP sender whose send
//!   queue holds the application's own buffers writes the headers (and any bytes it holds
//!   copied) into the lent buffer and leaves holes where the shared bytes go, and a link
//!   that passes a gather list to the kernel ([`Offloads::tx_gather`]: AF_PACKET's
//!   `sendmmsg`) never has user space touch those bytes again. AF_XDP cannot: a frame
//!   must lie in UMEM.
//!
//! The offload-aware methods are [`Link::recv_batch_meta`], [`Link::tx_batch_meta`] and
//! [`Link::tx_batch_gather`]; their default implementations fall back on
//! [`Link::recv_batch`] and [`Link::tx_batch`] (completing a requested checksum in
//! software, copying a gathered tail), so a link without offloads implements only the
//! plain pair, and a wrapper around another link must forward all five and
//! [`Link::offloads`] to keep its inner link's offloads.

pub mod fault;
pub mod gro;
pub mod offload;
#[cfg(target_os = "linux")]
pub mod packet;
#[cfg(target_os = "linux")]
pub mod packet_stats;
pub mod sim;
pub mod switch;
#[cfg(target_os = "linux")]
pub mod umem_memory;
#[cfg(target_os = "linux")]
pub mod xdp;
#[cfg(target_os = "linux")]
pub mod xdp_bind;
#[cfg(target_os = "linux")]
pub mod xdp_checksum;
#[cfg(target_os = "linux")]
pub mod xdp_features;
#[cfg(target_os = "linux")]
mod xdp_rx_chain;
#[cfg(target_os = "linux")]
pub mod xsk;

use core::ops::Range;

use bytes::Bytes;

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

/// Bytes of a frame that lie in a shared buffer instead of the lent tx buffer: the
/// frame's bytes at offsets `at..at + bytes.len()` of the buffer (a hole there, left
/// unwritten) are `bytes` ([`Link::tx_batch_gather`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedSpan {
    /// Offset in the lent buffer where the bytes belong.
    pub at: usize,
    /// The bytes.
    pub bytes: Bytes,
}

impl SharedSpan {
    /// The offsets in the lent buffer the span fills.
    pub fn range(&self) -> Range<usize> {
        self.at..self.at.saturating_add(self.bytes.len())
    }
}

/// Whether `spans` lie inside the frame `frame`, in order, without overlapping.
pub fn spans_ok(spans: &[SharedSpan], frame: &Range<usize>) -> bool {
    let mut pos = frame.start;
    spans.iter().all(|s| {
        let r = s.range();
        let ok = r.start >= pos && r.end <= frame.end;
        pos = r.end;
        ok
    })
}

/// Copies `spans` into their holes in `buf`, making the frame whole in the buffer; returns
/// `false` (copying nothing) unless they lie inside `frame` in order ([`spans_ok`]) and
/// `frame` inside the buffer.
pub fn fill_spans(buf: &mut [u8], frame: &Range<usize>, spans: &[SharedSpan]) -> bool {
    if frame.end > buf.len() || !spans_ok(spans, frame) {
        return false;
    }
    for s in spans {
        buf[s.range()].copy_from_slice(&s.bytes);
    }
    true
}

/// [`Link::tx_batch_gather`] for a link that does not gather: each frame's spans are
/// copied into their holes and the frame goes through [`Link::tx_batch_meta`].
pub fn gather_by_copying<L: Link + ?Sized>(
    link: &mut L,
    now: Instant,
    max: usize,
    f: &mut GatherWriter<'_>,
) -> usize {
    let mut spans = Vec::new();
    link.tx_batch_meta(now, max, &mut |buf| {
        spans.clear();
        let (range, meta) = f(buf, &mut spans)?;
        if fill_spans(buf, &range, &spans) {
            Some((range, meta))
        } else {
            // Past the buffer's end: the link refuses the frame and counts it.
            Some((0..buf.len() + 1, meta))
        }
    })
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

/// What a link does for the stack beyond moving frames (see the
/// [module documentation](self#offloads-segmentation-and-checksums)). The default is
/// nothing: every frame is one wire segment with complete checksums.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offloads {
    /// The largest frame (Ethernet header included) [`Link::tx_batch_meta`] takes with a
    /// [`TxMeta::segment_size`] to cut into wire segments (TSO/GSO): at most
    /// [`MAX_SUPER_FRAME_LEN`]. 0: no segmentation, frames are at most
    /// [`Link::max_frame_len`].
    pub tx_segmentation: usize,
    /// The link completes the TCP checksum of a frame sent with
    /// [`TxMeta::partial_checksum`].
    pub tx_checksum: bool,
    /// [`Link::tx_batch_gather`] hands a frame's shared spans to the kernel (or device)
    /// as they lie, without copying them into the frame's buffer in user space (a gather
    /// list: `sendmmsg`'s iovecs). Without it, gathering still works but the link copies
    /// the spans, which a writer that can copy the bytes straight into the buffer does for
    /// less.
    pub tx_gather: bool,
}

impl Offloads {
    /// Whether the link cuts super-segments of more than one wire segment.
    pub fn segments(&self, max_frame_len: usize) -> bool {
        self.tx_segmentation > max_frame_len && self.tx_checksum
    }
}

/// The largest frame a segmenting link takes: an Ethernet header and the longest IPv4
/// datagram (65535 bytes).
pub const MAX_SUPER_FRAME_LEN: usize = ETHERNET_HEADER_LEN + 65535;

/// Where a frame's checksum is to be completed by the link (Linux's `csum_start` and
/// `csum_offset`, as in a `virtio_net_hdr`): the link sums the bytes from `start` to the
/// end of the frame, the field included (it holds the pseudo-header sum), and writes the
/// complement at `start + offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialChecksum {
    /// Offset of the first byte summed (the TCP header), from the frame's first byte.
    pub start: u16,
    /// Offset of the checksum field from `start` (16 for TCP).
    pub offset: u16,
}

/// What a transmitted frame asks of the link ([`Link::tx_batch_meta`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxMeta {
    /// For a super-segment: the payload bytes of each wire segment it is cut into (TSO's
    /// `gso_size`); 0 sends the frame as it is. Only for links whose
    /// [`Offloads::tx_segmentation`] is non-zero; the frame must then ask for
    /// [`partial_checksum`](Self::partial_checksum) too.
    pub segment_size: u16,
    /// The TCP checksum is left to the link (only for links with
    /// [`Offloads::tx_checksum`]; others complete it in software, see
    /// [`Link::tx_batch_meta`]).
    pub partial_checksum: Option<PartialChecksum>,
}

/// The writer [`Link::tx_batch_meta`] lends buffers to: it writes a frame into the buffer
/// and returns where it lies and what it asks of the link, or `None` when it has nothing
/// more to send.
pub type FrameWriter<'a> = dyn FnMut(&mut [u8]) -> Option<(Range<usize>, TxMeta)> + 'a;

/// The writer [`Link::tx_batch_gather`] lends buffers to: as a [`FrameWriter`], plus the
/// frame's [`SharedSpan`]s, pushed onto the vector (empty when lent) in the order of
/// their offsets: the bytes of `buf[range]` that lie in shared buffers rather than in
/// `buf`.
pub type GatherWriter<'a> =
    dyn FnMut(&mut [u8], &mut Vec<SharedSpan>) -> Option<(Range<usize>, TxMeta)> + 'a;

/// What a link knows about a received frame ([`Link::recv_batch_meta`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxMeta {
    /// The link vouches for the frame's TCP checksum: its driver or the kernel verified it
    /// (possibly per wire segment, before coalescing them), or it came from a sender on
    /// this host that left it partial and whose bytes crossed no wire. The stack then
    /// skips its own verification.
    pub checksum_verified: bool,
    /// For a frame coalesced from several wire segments: their payload size (GRO's
    /// `gso_size`); 0 otherwise.
    pub segment_size: u16,
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

    /// What the link offloads from the stack; nothing by default.
    fn offloads(&self) -> Offloads {
        Offloads::default()
    }

    /// [`recv_batch`](Link::recv_batch) with what the link knows of each frame. A frame may
    /// be longer than [`max_frame_len`](Link::max_frame_len) only on a link that coalesces
    /// segments (and then at most [`MAX_SUPER_FRAME_LEN`]). The default lends the frames of
    /// `recv_batch` with [`RxMeta::default`] (nothing vouched for).
    fn recv_batch_meta(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        self.recv_batch(now, max, &mut |frame| f(frame, RxMeta::default()))
    }

    /// [`recv_batch_meta`](Link::recv_batch_meta) lending each frame as its buffers in
    /// order: one slice for a frame that lies in one, several for a frame a link received
    /// as a chain (AF_XDP multi-buffer), lent where the parts lie instead of gathered into
    /// one slice. Every part but the last is non-empty, and the first holds at least the
    /// first buffer's worth of the frame (the links that chain fill each buffer before the
    /// next, and a buffer holds over 1700 bytes), so the Ethernet, IPv4 and TCP headers
    /// lie in it; a receiver refuses, and counts, a chained frame whose first part does
    /// not hold them, rather than gathering it. The default lends the frames of
    /// `recv_batch_meta` as one part each.
    fn recv_batch_parts(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&[&[u8]], RxMeta),
    ) -> usize {
        self.recv_batch_meta(now, max, &mut |frame, meta| {
            f(core::slice::from_ref(&frame), meta)
        })
    }

    /// [`tx_batch`](Link::tx_batch) with offload requests per frame. Lent buffers are
    /// [`TX_HEADROOM`] + the larger of [`max_frame_len`](Link::max_frame_len) and
    /// [`Offloads::tx_segmentation`] bytes long; a frame with a
    /// [`TxMeta::segment_size`] may be up to `tx_segmentation` long, others up to
    /// `max_frame_len` (longer ones are dropped and counted as in `tx_batch`).
    ///
    /// The default lends the buffers of `tx_batch` and completes a requested partial
    /// checksum in software ([`offload::complete_checksum`]), so a frame asking for it is
    /// correct on every link; it has no segmentation, so a super-segment longer than
    /// `max_frame_len` is dropped and counted. Returns the frames the caller produced.
    fn tx_batch_meta(&mut self, now: Instant, max: usize, f: &mut FrameWriter<'_>) -> usize {
        self.tx_batch(now, max, &mut |buf| {
            let (range, meta) = f(buf)?;
            if let (Some(partial), Some(frame)) =
                (meta.partial_checksum, buf.get_mut(range.clone()))
            {
                offload::complete_checksum(frame, partial);
            }
            Some(range)
        })
    }

    /// [`tx_batch_meta`](Link::tx_batch_meta) for frames parts of which lie in shared
    /// buffers (see [`GatherWriter`]): the frame is `buf[range]` with the writer's
    /// [`SharedSpan`]s in their holes, and its limits are those of `tx_batch_meta`. A TCP
    /// sender whose payload lies in the application's buffers writes the headers alone,
    /// and the payload is copied once, by the kernel, instead of twice.
    ///
    /// A link with [`Offloads::tx_gather`] sends the spans as they lie. The default copies
    /// them into their holes ([`fill_spans`]) and sends the frame with `tx_batch_meta`, so
    /// that every link takes such frames. A frame whose spans do not lie inside it in
    /// order is dropped and counted as a range outside the buffer is.
    fn tx_batch_gather(&mut self, now: Instant, max: usize, f: &mut GatherWriter<'_>) -> usize {
        gather_by_copying(self, now, max, f)
    }

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
/// A link over a kernel socket (AF_XDP, AF_PACKET) names its descriptor, which the driver
/// registers with its runtime's reactor and waits on for readability; an in-memory link
/// ([`switch::SwitchPort`]) has none and wakes the waker the driver registers instead.
///
/// A link whose socket can refuse frames for want of room and keep them
/// ([`packet::PacketLink`]: a full send buffer) says so with
/// [`tx_blocked`](Self::tx_blocked); the driver then also waits for the descriptor to
/// poll writable, rather than retrying at every round.
pub trait QueueLink: Link + Send {
    /// The descriptor that polls readable when frames wait (and writable when a
    /// [`tx_blocked`](Self::tx_blocked) link has room again), or `None` for a link that
    /// wakes [`register_rx_waker`](Self::register_rx_waker)'s waker instead.
    fn rx_fd(&self) -> Option<std::os::fd::RawFd>;

    /// Links without a descriptor: wake `waker` when a frame arrives (it replaces the one
    /// registered before). Links with one ignore it.
    fn register_rx_waker(&self, waker: &std::task::Waker);

    /// Whether a received frame waits now (no system call). A link that cannot tell
    /// without one answers `false`, and its descriptor's readiness covers it.
    fn rx_ready(&mut self) -> bool;

    /// Whether the link holds frames its socket refused for want of room, after a
    /// [`flush`](Link::flush): they go out at a later flush, once
    /// [`rx_fd`](Self::rx_fd) polls writable, which the kernel announces (the driver
    /// waits for that instead of retrying). `false` by default: a link that answers
    /// `false` either never keeps refused frames or has no descriptor to announce room
    /// (AF_XDP's completion ring refills without an event the driver could wait for, and
    /// it runs out of tx frames only for the time a copy-mode kick takes).
    fn tx_blocked(&self) -> bool {
        false
    }
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
    fn offloads(&self) -> Offloads {
        (**self).offloads()
    }
    fn recv_batch_meta(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        (**self).recv_batch_meta(now, max, f)
    }
    fn recv_batch_parts(
        &mut self,
        now: Instant,
        max: usize,
        f: &mut dyn FnMut(&[&[u8]], RxMeta),
    ) -> usize {
        (**self).recv_batch_parts(now, max, f)
    }
    fn tx_batch_meta(&mut self, now: Instant, max: usize, f: &mut FrameWriter<'_>) -> usize {
        (**self).tx_batch_meta(now, max, f)
    }
    fn tx_batch_gather(&mut self, now: Instant, max: usize, f: &mut GatherWriter<'_>) -> usize {
        (**self).tx_batch_gather(now, max, f)
    }
}
