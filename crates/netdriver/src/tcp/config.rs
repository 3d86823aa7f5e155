//! Per-connection configuration.

use crate::tcp::congestion::CongestionAlgorithm;
use crate::time::Duration;

/// Default of [`Config::keepalive_probes`]: unanswered keep-alive probes after which the
/// connection fails (Linux's default 9).
pub const KEEPALIVE_PROBES: u32 = 9;

/// Settings of one TCP connection. `Config::default()` gives Linux-like defaults; tests
/// shrink the timers (`time_wait`, `min_rto`, ...) to keep virtual time short.
#[derive(Debug, Clone)]
pub struct Config {
    /// The MSS we advertise in our SYN (what we can receive without fragmentation). It also
    /// caps the segments we send. Default 1460 (an Ethernet MTU of 1500).
    pub mss: u16,
    /// Receive buffer (ring) size in bytes; the advertised window never exceeds its free
    /// space. Default 256 KiB.
    pub rx_buffer: usize,
    /// Receive-buffer auto-tuning (dynamic right-sizing, as Linux's
    /// `tcp_rcv_space_adjust`): `Some(max)` lets the receive buffer grow from
    /// [`rx_buffer`](Self::rx_buffer) up to `max` bytes as the application proves it reads
    /// faster than the buffer allows. Once per round trip the bytes the application read in
    /// that round trip are measured; when they exceed the most read in any round trip so
    /// far, the buffer grows to twice that plus 16 segments (slow start doubles the
    /// sender's flight per round trip, and the window must stay ahead of it), at most
    /// `max`. It never shrinks by itself. The window scale offered in our SYN is chosen to
    /// express `max` (RFC 7323 §2.3). `None`: the buffer stays at `rx_buffer`.
    /// Memory is bounded by `max`, and growth needs a reader that keeps up: a peer alone
    /// cannot make the buffer grow.
    ///
    /// Default `Some(6 MiB)`, Linux's `tcp_rmem` maximum. A fixed 256 KiB window caps a
    /// connection at 21 Gbit/s over a 100 µs round trip; auto-tuned, one connection moved
    /// 74–81 Gbit/s over a simulated 100 Gbit/s × 100 µs link (4× the fixed buffer, as
    /// much as a 6 MiB buffer from the start, the buffer ending near 2.5 MiB), and made no
    /// measurable difference on the two-core test bed, whose round trip is too short for
    /// the window to matter (`docs/tcp.md`, "Receive-buffer auto-tuning").
    pub rx_buffer_max: Option<usize>,
    /// Send buffer (ring) size in bytes: data queued by `send` and not yet acknowledged.
    /// Default 256 KiB.
    pub tx_buffer: usize,
    /// Send-buffer auto-tuning (as Linux's `tcp_sndbuf_expand`): `Some(max)` lets the send
    /// buffer grow from [`tx_buffer`](Self::tx_buffer) up to `max` bytes while the
    /// application keeps it full and the congestion window has room the buffer does not
    /// fill. When an ACK frees room after a `send` found the buffer full, and less than the
    /// congestion window is in flight, the buffer grows to twice the congestion window
    /// (what is in flight plus the next window to send), at most `max`. It never shrinks
    /// by itself; [`Connection::set_send_buffer`](crate::tcp::Connection::set_send_buffer)
    /// fixes the size from then on (as `SO_SNDBUF` does). `None`: the buffer stays at
    /// `tx_buffer`. Memory is bounded by `max`, and only the application's own writes
    /// make it grow.
    ///
    /// Default `Some(4 MiB)`, Linux's `tcp_wmem` maximum. A fixed 256 KiB buffer holds at
    /// most 256 KiB in flight whatever the window: on the two-core bed, one channel
    /// carrying eight virtual streams over AF_PACKET moved 7 Gbit/s with it and 17 with a
    /// 1 MiB buffer (`docs/investigations/bulk.md`, "Eight streams on one channel").
    pub tx_buffer_max: Option<usize>,
    /// Nagle's algorithm (RFC 9293 §3.7.4). Default on; `set_nodelay(true)` turns it off.
    pub nagle: bool,
    /// Delayed-ACK timeout (RFC 9293 §3.8.6.3). `None` acknowledges every segment at once.
    /// Default `Some(40 ms)`.
    pub delayed_ack: Option<Duration>,
    /// With delayed ACKs, how many full-sized segments' worth of unacknowledged data makes
    /// an ACK go out at once (RFC 5681 §4.2's "every second full-sized segment": 2, the
    /// default). More lets a short message of a few segments be acknowledged by the reply
    /// that usually follows it instead of by a pure ACK in between, at the price of
    /// sparser ACKs for a bulk sender.
    pub full_segments_per_ack: usize,
    /// RTO before the first RTT sample (RFC 6298 §2.1). Default 1 s.
    pub initial_rto: Duration,
    /// Lower bound on the RTO. Default 200 ms; may be as low as 1 ms for µs-scale links
    /// (a fixed 1 s floor was smoltcp #1190).
    pub min_rto: Duration,
    /// Upper bound on the RTO, and on the persist (zero-window probe) interval. Default 60 s.
    pub max_rto: Duration,
    /// Give up (state Closed, error `TimedOut`, RST sent) when unacknowledged data, SYN or
    /// FIN makes no progress for this long. Default 60 s. Without it a dead peer would hang
    /// the connection forever (smoltcp #1034, #323).
    pub user_timeout: Duration,
    /// Give up (`TimedOut`, RST sent, counted in `Stats::zero_window_timeouts`) when the
    /// peer keeps its window shut on data (or a FIN) to send for this long, however
    /// faithfully it answers our probes. `None` (default): RFC 1122 §4.2.2.17's
    /// "indefinitely". Like Linux's `TCP_USER_TIMEOUT` applied to zero-window probing (and
    /// `tcp_orphan_retries`): a peer that opens a window of 0 and never reads would
    /// otherwise hold the connection and its send buffer for ever. Checked when a probe
    /// (persist or retransmission) goes out, so the bound is this plus one probe interval.
    pub zero_window_limit: Option<Duration>,
    /// How many times a SYN (or SYN-ACK) is retransmitted before giving up with
    /// `TimedOut`. Default 6 (about 127 s with a 1 s initial RTO).
    pub syn_retries: u32,
    /// Keep-alive idle time (RFC 9293 §3.8.4, RFC 1122 §4.2.3.6); `None` (default)
    /// disables keep-alive. When set, a connection that has received nothing for this long
    /// while having nothing unacknowledged out is probed, then every
    /// [`keepalive_interval`](Self::keepalive_interval); after
    /// [`keepalive_probes`](Self::keepalive_probes) unanswered probes it fails with
    /// `TimedOut` (and an RST). A dead peer of an idle connection is so detected at the
    /// latest `keepalive + keepalive_probes × keepalive_interval` after the last segment
    /// received from it (data in flight is the user timeout's business instead).
    pub keepalive: Option<Duration>,
    /// Time between unanswered keep-alive probes; `None` (default): the idle time
    /// [`keepalive`](Self::keepalive) (Linux's
    /// `TCP_KEEPINTVL`).
    pub keepalive_interval: Option<Duration>,
    /// Unanswered keep-alive probes after which the connection fails (Linux's
    /// `TCP_KEEPCNT`). Default [`KEEPALIVE_PROBES`]
    /// (9); 0 counts as 1, since giving up without a single probe would end connections
    /// whose peer is merely silent.
    pub keepalive_probes: u32,
    /// Congestion-control algorithm. Default CUBIC.
    pub congestion: CongestionAlgorithm,
    /// Offer window scaling (RFC 7323 §2). Default true.
    pub window_scaling: bool,
    /// Offer selective acknowledgements (RFC 2018). Default true.
    pub sack: bool,
    /// Offer timestamps (RFC 7323 §3). Default true.
    pub timestamps: bool,
    /// Most disjoint out-of-order ranges (holes' far sides) the receiver holds; a segment
    /// that would need one more is dropped and counted in
    /// [`Stats::ooo_dropped`](crate::tcp::connection::Stats::ooo_dropped). Default 512.
    ///
    /// Why 512: a 100 Gbit/s path with a 100 µs RTT has a bandwidth-delay product of
    /// 1.25 MB, about 860 full segments at MTU 1500; the worst loss pattern the receiver
    /// must still reassemble (every other segment lost) leaves about 430 holes, and 512 is
    /// the next power of two. The old default of 16 made a receiver drop out-of-order data
    /// after the 16th hole of a window, turning a burst of losses into RTOs.
    ///
    /// Why it stays bounded (CVE-2019-11477 "SACK panic", CVE-2018-5390 "SegmentSmack"):
    /// the ranges live in a B-tree of at most this many entries, allocated on demand (under
    /// 48 KiB at 512, nothing while data arrives in order), the bytes they describe live
    /// in the receive buffer and never exceed the window, and every segment costs
    /// O(log ranges) to add, merge or look up, so a peer creating hole after hole gains
    /// neither memory nor a linear walk per segment.
    pub max_ooo_ranges: usize,
    /// Most disjoint SACKed ranges the sender's scoreboard remembers; when one more
    /// arrives, the lowest is forgotten (a needless retransmission at worst). Default 512.
    ///
    /// Why 512, as [`max_ooo_ranges`](Self::max_ooo_ranges): a 100 Gbit/s × 100 µs window
    /// (1.25 MB, about 860 segments of 1460 bytes) with every other segment lost leaves
    /// about 430 SACKed ranges, and the receivers of this crate report at most 512. The
    /// old default of 32 covered 64 segments: beyond it the scoreboard forgot ranges, so
    /// PRR counted delivered data short (and sent less) and, without RACK, RFC 6675 chose
    /// holes from a partial picture. (RACK keeps its own per-segment SACK marks, bounded by
    /// the send buffer.)
    ///
    /// Why it stays bounded (CVE-2019-11477 "SACK panic", CVE-2019-11478 "SACK
    /// slowness"): at most this many 8-byte ranges, allocated on demand (4 KiB at 512),
    /// only ever inside `(SND.UNA, SND.NXT]`; an ACK's blocks (at most 4) each cost a
    /// binary search and at most one shift of the array, and the loss queries are binary
    /// searches or stop after `dup_threshold` ranges (see `tcp::sack`), so a peer's SACK
    /// pattern buys neither memory nor a per-segment walk.
    pub max_sack_ranges: usize,
    /// TIME-WAIT duration, 2*MSL (RFC 9293 §3.4.2). Default 60 s.
    pub time_wait: Duration,
    /// Duplicate-ACK threshold for fast retransmit (RFC 5681 §3.2). Default 3.
    pub dup_ack_threshold: usize,
    /// Tail Loss Probe (RFC 8985 §7): when SACK is negotiated and an RTT sample exists, a
    /// probe timeout (PTO, 2·SRTT) after the last new data or cumulative ACK sends one new
    /// segment, or resends the last one, so that a lost tail is repaired by SACK recovery
    /// instead of waiting for the RTO (at least `min_rto`). Default true.
    pub tail_loss_probe: bool,
    /// The allowance added to the PTO when a single segment is in flight, for the peer's
    /// delayed ACK (RFC 8985 §7.2 WCDelAckT). Default 200 ms, RFC 8985's value.
    pub tlp_max_ack_delay: Duration,
    /// The shortest PTO. RFC 8985's 2·SRTT is tens of microseconds on a datacenter link,
    /// less than a busy host takes to schedule the peer's ACK: probes then go out for
    /// nothing (on the 2-core test bed nearly every probe was D-SACKed), and a thread that
    /// sleeps until the next timer is woken per message. Linux adds 2 ms to every PTO
    /// (`TCP_TIMEOUT_MIN_US`); this is a floor instead, so that PTOs on slower paths stay
    /// 2·SRTT. Default 2 ms.
    pub tlp_min_pto: Duration,
    /// Quick-ACK budget (Linux's quickack mode): this many data segments at the start of
    /// the connection, and again after more than an RTO without data from the peer, are
    /// acknowledged at once instead of by the delayed-ACK rules, so that a peer's slow
    /// start and Nagle do not wait on our delayed-ACK timer. The budget is capped, like
    /// Linux's, at `rx_buffer / (2 × mss)` (at least 2). 0 disables it. Only matters when
    /// [`delayed_ack`](Self::delayed_ack) is on. Default 16 (Linux's `TCP_MAX_QUICKACKS`).
    pub quick_ack_segments: usize,
    /// Let the reply carry the ACK of a request: a short in-order segment that ends a
    /// message (PSH, less than a full segment, nothing else unacknowledged) is not
    /// acknowledged at once by the quick-ACK budget but by the delayed-ACK rules, so that
    /// the answer the application usually writes next carries the ACK instead of a pure
    /// ACK going out before it (one frame fewer per request and per short connection).
    /// The ACK still goes out at once when the application has read everything and waits
    /// for more ([`Connection::reader_waiting`](super::Connection::reader_waiting)): a peer
    /// holding its next small write back by Nagle waits on that ACK, and the reader is
    /// the one who knows that no answer is coming. Only matters when
    /// [`delayed_ack`](Self::delayed_ack) is on, and only with an owner that calls
    /// `reader_waiting`. Default false (Linux acknowledges such a segment at once).
    pub reply_carries_ack: bool,
    /// Limited transmit (RFC 3042): on the first and second duplicate ACK, send one new
    /// segment each if the peer's window allows, beyond the congestion window. Default true.
    pub limited_transmit: bool,
    /// RACK loss detection (RFC 8985 §6) when SACK is negotiated: a segment is deemed
    /// lost once a segment sent after it was delivered and `RTT + reo_wnd` has passed
    /// since it was sent, `reo_wnd` being min_RTT/4 (widened by D-SACKs, 0 in recovery
    /// until reordering is seen). It replaces the duplicate-ACK threshold and RFC 6675
    /// IsLost for SACK connections; without SACK (or with this off) those remain.
    /// Default true.
    pub rack: bool,
    /// Proportional Rate Reduction (RFC 6937, PRR-SSRB) during SACK fast recovery: instead
    /// of cutting cwnd to ssthresh at once (and sending nothing until pipe falls below
    /// it), each ACK lets out data in proportion to what it reports delivered, so that the
    /// flight shrinks smoothly to ssthresh by the end of recovery, and grows back towards
    /// it by slow start when losses drained it below. Without SACK the RFC 5681 / RFC 6582
    /// window inflation remains. Default true.
    pub prr: bool,
    /// Undo of spurious fast recoveries (Linux's undo, after RFC 2883 §4 and RFC 3522):
    /// the congestion controller's state is saved when recovery starts and restored when
    /// every byte retransmitted in the episode is reported as a duplicate by D-SACK, or,
    /// with timestamps, when the first ACK covering the first retransmission echoes a
    /// TSval older than that retransmission (Eifel detection: the original arrived).
    /// Default true.
    pub undo: bool,
    /// PAWS (RFC 7323 §5) when timestamps are negotiated: a segment (other than a RST)
    /// whose TSval is older than TS.Recent is dropped, and answered with an ACK (a
    /// zero-length one only within the challenge-ACK budget, since it may just be a
    /// reordered ACK). Default true.
    pub paws: bool,
    /// PAWS's idle rule (RFC 7323 §5.5): after this long without updating TS.Recent it
    /// is taken as invalid and the next segment's TSval is accepted whatever its value.
    /// Default 24 days, the RFC's value (and Linux's): a peer clock ticking at most once
    /// per millisecond (RFC 7323 §5.4, as ours does) takes 24.8 days to cross half the
    /// 32-bit TSval space.
    pub paws_idle_limit: Duration,
    /// Challenge ACKs per second (RFC 5961 §7), counted per connection: a global counter
    /// leaks sequence state across connections (CVE-2016-5696). Default 10.
    pub challenge_ack_limit_per_sec: u32,
    /// Shortest time between two ACKs answering out-of-window segments that carry no
    /// data (RFC 9293 §3.10.7.4 answers every unacceptable segment with an ACK). Two ends
    /// that each find the other's ACK out of window would otherwise answer each other
    /// forever, an ACK loop; data segments are always answered. Default 500 ms, Linux's
    /// `tcp_invalid_ratelimit`.
    pub invalid_ack_interval: Duration,
    /// Super-segments (TSO/GSO, see [`crate::link`]'s offloads): the largest payload one
    /// segment handed to the link may carry when the link cuts segments into wire
    /// segments of the MSS itself; 0 (the default) sends every segment as one wire
    /// segment. A super-segment holds whole MSS-sized segments, and a shorter last one only
    /// when that would have been sent alone at once (Nagle and sender SWS avoidance apply
    /// to it as to a segment of its own); everything the connection accounts per segment
    /// (RACK and RTT send records, SACK and loss marks) is kept per wire segment, so loss
    /// inside a super-segment is repaired segment by segment. Tail loss probes, zero-window
    /// probes and retransmissions of segments deemed lost stay single segments. The
    /// interface sets it from its link ([`crate::netif::InterfaceConfig::large_segments`]).
    pub max_super_segment: usize,
    /// The link completes TCP checksums (checksum offload): payload bytes are copied out of
    /// the send buffer without being summed, and [`Transmit::payload_sum`] is 0. Set by
    /// the interface from its link. Default false.
    ///
    /// [`Transmit::payload_sum`]: crate::tcp::Transmit::payload_sum
    pub checksum_offload: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mss: 1460,
            rx_buffer: 256 * 1024,
            rx_buffer_max: Some(6 << 20),
            tx_buffer: 256 * 1024,
            tx_buffer_max: Some(4 << 20),
            nagle: true,
            delayed_ack: Some(Duration::from_millis(40)),
            full_segments_per_ack: 2,
            initial_rto: Duration::from_secs(1),
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(60),
            user_timeout: Duration::from_secs(60),
            zero_window_limit: None,
            syn_retries: 6,
            keepalive: None,
            keepalive_interval: None,
            keepalive_probes: KEEPALIVE_PROBES,
            congestion: CongestionAlgorithm::default(),
            window_scaling: true,
            sack: true,
            timestamps: true,
            max_ooo_ranges: 512,
            max_sack_ranges: 512,
            time_wait: Duration::from_secs(60),
            dup_ack_threshold: 3,
            tail_loss_probe: true,
            tlp_max_ack_delay: Duration::from_millis(200),
            tlp_min_pto: Duration::from_millis(2),
            quick_ack_segments: 16,
            reply_carries_ack: false,
            limited_transmit: true,
            rack: true,
            prr: true,
            undo: true,
            paws: true,
            paws_idle_limit: Duration::from_secs(24 * 24 * 60 * 60),
            challenge_ack_limit_per_sec: 10,
            invalid_ack_interval: Duration::from_millis(500),
            max_super_segment: 0,
            checksum_offload: false,
        }
    }
}
