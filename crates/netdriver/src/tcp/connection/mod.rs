//! The sans-IO TCP connection: one RFC 9293 state machine.
//!
//! A [`Connection`] never reads a clock and never touches a socket. The driver (the netif)
//! feeds it received segments ([`Connection::handle_segment`]) and expired timers
//! ([`Connection::handle_timeout`]) with the current time, then drains the segments it wants
//! sent ([`Connection::poll_transmit`], until `None`) and asks when to call it next
//! ([`Connection::poll_timeout`]).
//!
//! The code is split by direction:
//! - `input`: segment arrival (RFC 9293 §3.10.7, RFC 5961, RFC 7323, loss detection,
//!   RFC 3042 limited transmit, quick-ACK, D-SACK generation per RFC 2883),
//! - `output`: segment construction (sender and receiver SWS avoidance, Nagle, delayed
//!   ACK, SACK and D-SACK blocks, NewReno and RFC 6675 SACK recovery),
//! - `timers`: retransmission, persist, delayed ACK, keep-alive, TIME-WAIT, user timeout,
//! - `tlp`: the Tail Loss Probe of RFC 8985 §7,
//! - `recovery`: RACK loss detection (RFC 8985 §6, state in [`crate::tcp::rack`]) wired
//!   into SACK recovery, PRR (RFC 6937) for the window during it, and the undo of
//!   spurious recoveries (D-SACK, RFC 2883 §4; timestamps, RFC 3522).
//!
//! Conventions a test writer needs:
//! - Timestamps: TSval is `now` in **milliseconds** plus a per-connection offset
//!   ([`Connection::set_ts_offset`], 0 unless the driver sets one), truncated to 32 bits:
//!   RFC 7323 §5.4 asks for a clock of 1 ms to 1 s per tick, which peers' PAWS (§5.5,
//!   Linux forgets TS.Recent only after 24 days idle) relies on. The echo is no longer
//!   the RTT source: RTT samples come from per-segment µs send times
//!   ([`crate::tcp::sendtimes`]), with the echo disambiguating retransmissions. PAWS
//!   (RFC 7323 §5.3, `input`) checks the peer's TSvals against TS.Recent, with the idle
//!   limit [`Config::paws_idle_limit`]; TS.Recent also serves RFC 6191.
//! - Emitted segments carry `TcpFlags::ACK` in `flags` whenever `ack` is `Some`, as a
//!   parser would report them. Data segments that empty the send queue carry PSH.
//! - Our RSTs (abort, user timeout) are `<SEQ=SND.NXT><CTL=RST>` without ACK (§3.10.5).

use core::net::SocketAddrV4;

use bytes::Bytes;
use tracing::{debug, trace};

use crate::tcp::assembler::Assembler;
use crate::tcp::buffer::{RxLayout, RxRing};
use crate::tcp::config::Config;
use crate::tcp::congestion::CongestionControl;
use crate::tcp::error::TcpError;
use crate::tcp::rack::Rack;
use crate::tcp::rtt::RttEstimator;
use crate::tcp::sack::SackScoreboard;
use crate::tcp::send_queue::SendQueue;
use crate::tcp::sendtimes::SendTimes;
use crate::tcp::SeqNumber;
use crate::time::{Duration, Instant};
use crate::wire::tcp::{TcpFlags, TcpRepr};

mod autotune;
mod input;
mod options;
mod output;
mod recovery;
mod timers;
mod tlp;

#[cfg(test)]
mod tests;

pub use options::OptionChanges;

pub use super::config::KEEPALIVE_PROBES;

/// The MSS assumed when the peer's SYN carries no MSS option (RFC 9293 §3.7.1).
pub const DEFAULT_PEER_MSS: u16 = 536;

/// The smallest peer MSS we honour: a tiny or zero MSS option would otherwise make us send
/// empty or absurdly small segments forever (Linux clamps to 48 for the same reason).
const MIN_PEER_MSS: u16 = 64;

/// The largest window-scale shift (RFC 7323 §2.3).
const MAX_WINDOW_SCALE: u8 = 14;

/// Bytes the timestamp option takes on the wire, with its two NOP pads.
const TIMESTAMP_OPTION_LEN: usize = 12;

/// Connection states (RFC 9293 §3.3.2). LISTEN is not here: listening is the netif's job,
/// which creates a connection with [`Connection::accept`] once a SYN arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// No connection (initial state of nothing, or after failure/abort/TIME-WAIT expiry).
    Closed,
    /// Our SYN is sent; waiting for the peer's SYN.
    SynSent,
    /// Both SYNs seen; waiting for the ACK of ours.
    SynReceived,
    /// Open in both directions.
    Established,
    /// We closed (FIN queued or sent); our FIN is not acknowledged yet.
    FinWait1,
    /// Our FIN is acknowledged; waiting for the peer's FIN.
    FinWait2,
    /// The peer closed; we may still send.
    CloseWait,
    /// Both sides sent FIN simultaneously; waiting for the ACK of ours.
    Closing,
    /// The peer closed first, then we did; waiting for the ACK of our FIN.
    LastAck,
    /// Both FINs exchanged and acknowledged; lingering 2*MSL to absorb stray segments.
    TimeWait,
}

impl State {
    /// Whether both sides' SYNs have been exchanged (RFC 9293's "synchronized states").
    pub fn is_synchronized(self) -> bool {
        !matches!(self, State::Closed | State::SynSent | State::SynReceived)
    }
}

/// One segment to send: the header to emit and how many payload bytes were written to the
/// front of the caller's `payload_buf` (with
/// [`payload_gathered`](Self::payload_gathered), some of them as shared buffers in holes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// The TCP header (ports, seq, ack, flags, window, options).
    pub repr: TcpRepr,
    /// Payload length; the bytes are `payload_buf[..payload_len]`.
    pub payload_len: usize,
    /// The folded Internet checksum sum ([`checksum::data`](crate::wire::checksum::data))
    /// of those bytes, computed in the pass that copied them out of the send ring (0
    /// without payload, or with [`Config::checksum_offload`]), so that emitting the frame
    /// need not read the payload again.
    pub payload_sum: u16,
    /// The largest payload of one wire segment for this segment's options (the MSS less
    /// options). A payload longer than this makes a super-segment, which the link cuts
    /// into wire segments of this size ([`Config::max_super_segment`]).
    pub segment_size: usize,
    /// Parts of the payload are not in `payload_buf`: they are the slices of the send
    /// queue's shared buffers that [`Connection::poll_transmit_gather`] pushed, each at
    /// its offset in `payload_buf`.
    pub payload_gathered: bool,
}

impl Transmit {
    /// Whether this is a super-segment: more payload than one wire segment carries.
    pub fn is_super_segment(&self) -> bool {
        self.payload_len > self.segment_size
    }
}

/// A snapshot of a connection's counters and congestion state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Payload bytes sent, retransmissions included.
    pub bytes_sent: u64,
    /// Payload bytes cumulatively acknowledged by the peer.
    pub bytes_acked: u64,
    /// In-order payload bytes delivered to the receive buffer.
    pub bytes_received: u64,
    /// Segments produced by `poll_transmit`.
    pub segments_sent: u64,
    /// Segments fed to `handle_segment`.
    pub segments_received: u64,
    /// Segments that resent sequence space already sent (any cause).
    pub retransmitted_segments: u64,
    /// Entries into fast retransmit / loss recovery.
    pub fast_retransmits: u64,
    /// Retransmission-timer expiries.
    pub rto_timeouts: u64,
    /// Smoothed RTT, once sampled.
    pub srtt: Option<Duration>,
    /// Current RTO (with backoff).
    pub rto: Duration,
    /// Congestion window in bytes (including NewReno recovery inflation).
    pub cwnd: usize,
    /// Slow-start threshold in bytes.
    pub ssthresh: usize,
    /// Sent but not cumulatively acknowledged sequence space.
    pub bytes_in_flight: usize,
    /// Bytes in the send buffer (unacknowledged and unsent).
    pub send_queue: usize,
    /// Bytes readable by the application.
    pub recv_queue: usize,
    /// Out-of-order segments dropped because the reassembly range limit was hit.
    pub ooo_dropped: u64,
    /// Disjoint out-of-order ranges held now (at most [`Config::max_ooo_ranges`]).
    pub ooo_ranges: usize,
    /// SACKed ranges the sender's scoreboard forgot because it held
    /// [`Config::max_sack_ranges`] already (each may cost a needless retransmission).
    pub sack_ranges_forgotten: u64,
    /// Receive buffer size now (it changes by auto-tuning or `set_recv_buffer`).
    pub rx_buffer: usize,
    /// Times auto-tuning grew the receive buffer ([`Config::rx_buffer_max`]).
    pub rx_buffer_grown: u64,
    /// Send buffer size now (it changes by auto-tuning or `set_send_buffer`).
    pub tx_buffer: usize,
    /// Times auto-tuning grew the send buffer ([`Config::tx_buffer_max`]).
    pub tx_buffer_grown: u64,
    /// Challenge ACKs sent (RFC 5961).
    pub challenge_acks: u64,
    /// Out-of-window segments without data left unanswered by the rate limit
    /// ([`Config::invalid_ack_interval`]): an ACK loop broken.
    pub oow_acks_suppressed: u64,
    /// Tail loss probes sent (RFC 8985 §7), new data or a retransmission.
    pub tail_loss_probes: u64,
    /// Losses repaired by a retransmitted probe, which cost a congestion response
    /// (RFC 8985 §7.4.2).
    pub tlp_recoveries: u64,
    /// Segments sent by limited transmit (RFC 3042).
    pub limited_transmits: u64,
    /// ACKs sent whose first SACK block reported a duplicate segment (D-SACK, RFC 2883).
    pub dsacks_sent: u64,
    /// Fast recoveries found spurious (by D-SACK or timestamps) whose congestion window
    /// reduction was undone.
    pub spurious_recoveries_undone: u64,
    /// Segments dropped by PAWS (RFC 7323 §5): TSval older than TS.Recent.
    pub paws_rejected: u64,
    /// Super-segments sent ([`Config::max_super_segment`]), each also counted once in
    /// `segments_sent`.
    pub super_segments_sent: u64,
    /// Wire segments those super-segments were cut into.
    pub super_segment_pieces: u64,
    /// Times the connection failed because the peer kept its window shut on data to send
    /// for longer than [`Config::zero_window_limit`] (0 or 1).
    pub zero_window_timeouts: u64,
}

/// The undo record of one fast-recovery episode (see [`Config::undo`]).
#[derive(Debug)]
struct Undo {
    /// The congestion controller as it was before the episode's reduction.
    prior: Box<dyn CongestionControl>,
    /// SND.UNA and SND.MAX when the episode started: the space it may retransmit.
    start: SeqNumber,
    end: SeqNumber,
    /// Bytes retransmitted in the episode and not yet reported duplicate by D-SACK.
    retrans: usize,
    /// Some retransmission happened in the episode.
    retransmitted: bool,
    /// TSval of the episode's first retransmission (Eifel, RFC 3522), until checked.
    first_rtx_tsval: Option<u32>,
}

/// Mutable counters kept in the connection; [`Stats`] adds the derived values.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    bytes_sent: u64,
    bytes_acked: u64,
    bytes_received: u64,
    segments_sent: u64,
    segments_received: u64,
    retransmitted_segments: u64,
    fast_retransmits: u64,
    rto_timeouts: u64,
    ooo_dropped: u64,
    challenge_acks: u64,
    oow_acks_suppressed: u64,
    tail_loss_probes: u64,
    tlp_recoveries: u64,
    limited_transmits: u64,
    dsacks_sent: u64,
    spurious_recoveries_undone: u64,
    paws_rejected: u64,
    rx_buffer_grown: u64,
    tx_buffer_grown: u64,
    super_segments_sent: u64,
    super_segment_pieces: u64,
    zero_window_timeouts: u64,
}

/// The part of [`Stats`] a driver publishes on every round that moved the connection
/// ([`Connection::traffic`]): queues, window and byte counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Traffic {
    /// As [`Stats::send_queue`].
    pub send_queue: usize,
    /// As [`Stats::recv_queue`].
    pub recv_queue: usize,
    /// As [`Stats::bytes_in_flight`].
    pub bytes_in_flight: usize,
    /// As [`Stats::cwnd`].
    pub cwnd: usize,
    /// [`Stats::srtt`] in whole microseconds, `None` before the first sample.
    pub srtt_us: Option<u64>,
    /// As [`Stats::retransmitted_segments`].
    pub retransmitted_segments: u64,
    /// As [`Stats::rto_timeouts`].
    pub rto_timeouts: u64,
    /// As [`Stats::bytes_sent`].
    pub bytes_sent: u64,
    /// As [`Stats::bytes_acked`].
    pub bytes_acked: u64,
    /// As [`Stats::bytes_received`].
    pub bytes_received: u64,
}

/// See [`Connection::stats_mark`]: equal marks, equal statistics (the clock apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsMark([u64; 6]);

/// One TCP connection (a transmission control block, RFC 9293 §3.3.1) and its buffers.
#[derive(Debug)]
pub struct Connection {
    config: Config,
    local: SocketAddrV4,
    remote: SocketAddrV4,
    state: State,
    error: Option<TcpError>,
    /// Opened by `accept` (passive) rather than `connect`.
    passive: bool,
    nodelay: bool,

    // ---- send sequence space (RFC 9293 §3.3.1) ----
    iss: SeqNumber,
    snd_una: SeqNumber,
    /// Next sequence number to send; rewound to `snd_una` by an RTO (go-back-N).
    snd_nxt: SeqNumber,
    /// Highest sequence number ever sent plus one ("SND.MAX"); ACK validity uses it.
    snd_max: SeqNumber,
    /// Peer's window in bytes, already scaled.
    snd_wnd: usize,
    snd_wl1: SeqNumber,
    snd_wl2: SeqNumber,
    /// Largest window the peer ever offered (RFC 5961 §5 and sender SWS).
    max_snd_wnd: usize,
    /// Peer's window-scale shift (0 unless negotiated).
    snd_wscale: u8,
    /// Peer's MSS option (or the default), clamped.
    peer_mss: u16,
    /// The application's MSS clamp (`set_mss_clamp`), on top of the peer's and ours.
    mss_clamp: Option<u16>,
    tx: SendQueue,
    /// Within [`Connection::poll_transmit_gather`]: payload bytes that lie in shared
    /// buffers go as slices of them (with their offsets in the payload), pushed on
    /// `gathered`, rather than copied.
    gather: bool,
    gathered: Vec<(usize, bytes::Bytes)>,
    /// Sequence number of the first byte in `tx`.
    tx_base: SeqNumber,
    /// `close()` was called: a FIN follows the queued data.
    fin_queued: bool,

    // ---- receive sequence space ----
    irs: SeqNumber,
    rcv_nxt: SeqNumber,
    /// Right edge of the window we last advertised; never moved left (RFC 9293 §3.8.6).
    rcv_adv: SeqNumber,
    /// The largest window we have advertised, in bytes: what a window update is measured
    /// against (`window_update_due`).
    rcv_wnd_max: usize,
    /// Our window-scale shift (0 unless negotiated).
    rcv_wscale: u8,
    /// The shift we offer in our SYN: the smallest that lets the window cover `rx_buffer`.
    offered_wscale: u8,
    rx: RxRing,
    /// A payload [`place_payload`](Connection::place_payload) has copied into the receive
    /// ring at RCV.NXT (while summing it for the checksum), for the
    /// [`handle_segment_placed`](Connection::handle_segment_placed) call that follows:
    /// its sequence number, length and the ring's layout when it was written. Honoured
    /// only by that call and cleared by every `handle_segment*`.
    rx_placed: Option<(SeqNumber, usize, RxLayout)>,
    assembler: Assembler,
    /// Receive-buffer auto-tuning's measurements ([`Config::rx_buffer_max`]).
    rcv_space: autotune::RcvSpace,
    /// Send-buffer auto-tuning's state ([`Config::tx_buffer_max`]).
    snd_space: autotune::SndSpace,
    /// The peer's FIN has been received in order (rcv_nxt includes it).
    fin_received: bool,
    /// Sequence number of a FIN that arrived ahead of missing data.
    pending_fin: Option<SeqNumber>,
    /// Sequence numbers of the most recently received out-of-order segments, newest first:
    /// the first SACK block must describe the newest (RFC 2018 §4).
    sack_recent: [Option<SeqNumber>; 4],

    // ---- negotiated options ----
    ws_enabled: bool,
    sack_enabled: bool,
    ts_enabled: bool,
    /// Added to our millisecond clock to make TSvals (RFC 7323 §5.4, §7.1).
    ts_offset: u32,
    /// TS.Recent (RFC 7323 §4.3).
    ts_recent: u32,
    /// When TS.Recent was last set (RFC 7323 §5.5 idle rule).
    ts_recent_stamp: Instant,
    /// RCV.NXT as of the last ACK we sent (Last.ACK.sent, RFC 7323 §4.3).
    last_ack_sent: SeqNumber,

    // ---- ACK generation ----
    /// An ACK must go out at the next `poll_transmit`.
    ack_now: bool,
    /// In-order payload bytes received since our last ACK (RFC 5681 §4.2: ACK at least
    /// every second full-sized segment, i.e. once two of [`rcv_mss`](Self::rcv_mss)
    /// are unacknowledged).
    bytes_unacked: usize,
    /// The peer's full segment size as seen: the largest payload received, from 536
    /// (RFC 9293's default MSS) up to what we advertised (Linux's `rcv_mss`). Small
    /// segments (requests of a few bytes) are not full-sized: two of them wait for the
    /// delayed-ACK timer or a reply to carry the ACK, instead of costing a pure ACK.
    rcv_mss: usize,
    delayed_ack_deadline: Option<Instant>,
    /// An ACK the quick-ACK budget would have sent at once is held for the reply
    /// (`Config::reply_carries_ack`); cleared by any segment we send.
    reply_ack_held: bool,
    /// The application read data since our last segment: a window update may be due.
    window_update_check: bool,
    /// Data segments left to acknowledge at once (quick-ACK mode, see
    /// [`Config::quick_ack_segments`]).
    quick_acks: usize,
    /// When the last data segment arrived (quick-ACK after idle).
    last_data_rcv: Option<Instant>,
    /// A duplicate segment arrived: the next ACK's first SACK block reports this range
    /// (D-SACK, RFC 2883 §4).
    dsack: Option<(SeqNumber, SeqNumber)>,
    /// Start of the current one-second challenge-ACK accounting window (RFC 5961 §7).
    challenge_window_start: Option<Instant>,
    challenge_count: u32,
    /// When an out-of-window segment without data was last answered (rate limit,
    /// [`Config::invalid_ack_interval`]).
    last_oow_ack: Option<Instant>,

    // ---- retransmission ----
    rtt: RttEstimator,
    /// µs send times of the outstanding segments: the RTT samples while timestamps are
    /// on (or offered in our SYN).
    send_times: SendTimes,
    /// Karn's timed segment (end sequence, send time) when timestamps are off.
    rtt_timed: Option<(SeqNumber, Instant)>,
    rtx_deadline: Option<Instant>,
    syn_retries_done: u32,
    /// When outstanding sequence space last made progress (or became outstanding).
    last_progress: Instant,
    /// When we last sent new data (RFC 5681 §4.1 restart after idle).
    last_data_send: Option<Instant>,

    // ---- congestion control and loss recovery ----
    cc: Box<dyn CongestionControl>,
    dup_acks: usize,
    in_recovery: bool,
    /// RFC 6582 "recover" / RFC 6675 RecoveryPoint.
    recover: SeqNumber,
    /// NewReno cwnd inflation during fast recovery (RFC 5681 §3.2 steps 3-4).
    recovery_inflation: usize,
    /// Retransmit the segment at snd_una at the next opportunity.
    fast_rtx_pending: bool,
    /// RFC 6675 HighRxt.
    high_rxt: SeqNumber,
    sack_board: SackScoreboard,
    /// Un-SACKed sequence space below this is deemed lost (besides RFC 6675 IsLost): set
    /// when a tail loss probe is SACKed, since everything below it was sent a PTO
    /// (2·SRTT) earlier and would have been delivered before it (RFC 8985 §6.2's rule,
    /// applied to the probe only).
    lost_below: Option<SeqNumber>,
    /// PRR (RFC 6937): bytes delivered since recovery started (`prr_delivered`).
    prr_delivered: usize,
    /// PRR: bytes sent since recovery started (`prr_out`).
    prr_out: usize,
    /// PRR: the flight when recovery started (`RecoverFS`).
    prr_recover_fs: usize,
    /// PRR: the congestion window for this ACK, `pipe + sndcnt`, while in recovery.
    prr_cwnd: Option<usize>,
    /// Undo of a spurious recovery: what the episode saved and has seen since.
    undo: Option<Undo>,
    /// RACK loss detection (RFC 8985 §6): transmit times and loss marks, used when
    /// [`Config::rack`] is on and SACK was negotiated.
    rack: Rack,

    // ---- tail loss probe (RFC 8985 §7) ----
    /// When the probe timeout fires.
    tlp_deadline: Option<Instant>,
    /// The PTO fired: the next `poll_transmit` sends the probe.
    tlp_pending: bool,
    /// TLP.end_seq: SND.MAX when the probe went out; `Some` while the episode lasts (at
    /// most one probe per episode).
    tlp_high: Option<SeqNumber>,
    /// Start of the probe segment.
    tlp_probe_seq: SeqNumber,
    /// The probe resent sequence space (rather than sending new data).
    tlp_retrans: bool,
    /// Bytes in flight when the probe went out: the flight a repaired loss belonged to,
    /// for the congestion response (RFC 8985 §7.4.2).
    tlp_flight: usize,
    /// Limited-transmit segments sent since the last cumulative ACK (RFC 3042: one per
    /// duplicate ACK, two at most).
    limited_sent: usize,

    // ---- persist (zero window) ----
    persist_deadline: Option<Instant>,
    persist_backoff: u32,
    /// The persist timer fired: send a probe or an SWS-override segment.
    persist_force: bool,
    /// A retransmission timeout fired: the next retransmission goes out even into a zero
    /// window (one octet), so a lost window update cannot leave both ends waiting.
    rto_probe: bool,
    /// End of an outstanding 1-byte zero-window probe sent beyond snd_max.
    probe_end: Option<SeqNumber>,
    /// When the oldest zero-window probe that no segment has answered yet was sent. The
    /// persist timer gives up only on this: answered probes keep the connection open
    /// however long the window stays closed (RFC 1122 §4.2.2.17).
    probe_unanswered_since: Option<Instant>,
    /// The peer answered with a closed window while our data was in flight: the next
    /// retransmission into that window is a fresh probe, and the user timeout counts from
    /// it (RFC 9293 §3.8.6.1).
    closed_window_answered: bool,
    /// Since when the peer's window has been shut on something to send, as a timer of
    /// ours (persist or retransmission) last found it ([`Config::zero_window_limit`]).
    zero_window_since: Option<Instant>,
    /// The second copy of a pure ACK still to send, at this sequence number
    /// (`Connection::ack_seqs`).
    second_ack: Option<SeqNumber>,

    // ---- keep-alive, TIME-WAIT, reset ----
    keepalive_deadline: Option<Instant>,
    keepalive_probes_out: u32,
    keepalive_pending: bool,
    /// When the last segment arrived from the peer.
    last_rcv: Instant,
    /// The newest instant any call passed in (`Connection::clock`).
    clock: Instant,
    time_wait_deadline: Option<Instant>,
    pending_rst: Option<TcpRepr>,

    counters: Counters,
}

/// The smallest shift that makes `buffer` fit a 16-bit window field (RFC 7323 §2.3),
/// capped at 14. Buffers of 2^19 bytes and more need shifts above 3 (smoltcp #253).
fn window_scale_for(buffer: usize) -> u8 {
    let mut shift = 0u8;
    while shift < MAX_WINDOW_SCALE && (buffer >> shift) > u16::MAX as usize {
        shift += 1;
    }
    shift
}

/// The largest receive buffer a connection may reach, `size` or the auto-tuning maximum
/// ([`Config::rx_buffer_max`]): what the window scale we offer must express.
fn largest_rx_buffer(config: &Config, size: usize) -> usize {
    size.max(config.rx_buffer_max.unwrap_or(0))
}

/// The TSval for `now` with a connection's `offset`: milliseconds, truncated to 32 bits
/// (see the module docs).
fn timestamp_value(now: Instant, offset: u32) -> u32 {
    (now.total_millis() as u32).wrapping_add(offset)
}

impl Connection {
    fn new(
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        state: State,
        isn: SeqNumber,
        now: Instant,
    ) -> Connection {
        let offered_wscale = if config.window_scaling {
            window_scale_for(largest_rx_buffer(&config, config.rx_buffer))
        } else {
            0
        };
        let send_mss = usize::from(DEFAULT_PEER_MSS.min(config.mss).max(1));
        Connection {
            local,
            remote,
            state,
            error: None,
            passive: false,
            nodelay: !config.nagle,
            iss: isn,
            snd_una: isn,
            snd_nxt: isn,
            snd_max: isn,
            snd_wnd: 0,
            snd_wl1: SeqNumber(0),
            snd_wl2: isn,
            max_snd_wnd: 0,
            snd_wscale: 0,
            peer_mss: DEFAULT_PEER_MSS,
            mss_clamp: None,
            tx: SendQueue::new(config.tx_buffer),
            gather: false,
            gathered: Vec::new(),
            tx_base: isn + 1,
            fin_queued: false,
            irs: SeqNumber(0),
            rcv_nxt: SeqNumber(0),
            rcv_adv: SeqNumber(0),
            rcv_wnd_max: 0,
            rcv_wscale: 0,
            offered_wscale,
            rx: RxRing::new(config.rx_buffer),
            rx_placed: None,
            assembler: Assembler::new(config.max_ooo_ranges),
            rcv_space: autotune::RcvSpace::default(),
            snd_space: autotune::SndSpace::default(),
            fin_received: false,
            pending_fin: None,
            sack_recent: [None; 4],
            ws_enabled: false,
            sack_enabled: false,
            ts_enabled: false,
            ts_offset: 0,
            ts_recent: 0,
            ts_recent_stamp: now,
            last_ack_sent: SeqNumber(0),
            ack_now: false,
            bytes_unacked: 0,
            rcv_mss: 536,
            delayed_ack_deadline: None,
            reply_ack_held: false,
            window_update_check: false,
            quick_acks: quick_ack_budget(&config),
            last_data_rcv: None,
            dsack: None,
            challenge_window_start: None,
            challenge_count: 0,
            last_oow_ack: None,
            rtt: RttEstimator::new(config.initial_rto, config.min_rto, config.max_rto),
            send_times: SendTimes::new(options::send_records_for(config.tx_buffer)),
            rtt_timed: None,
            rtx_deadline: None,
            syn_retries_done: 0,
            last_progress: now,
            last_data_send: None,
            cc: config.congestion.build(send_mss),
            dup_acks: 0,
            in_recovery: false,
            recover: isn,
            recovery_inflation: 0,
            fast_rtx_pending: false,
            high_rxt: isn,
            sack_board: SackScoreboard::new(config.max_sack_ranges),
            lost_below: None,
            prr_delivered: 0,
            prr_out: 0,
            prr_recover_fs: 0,
            prr_cwnd: None,
            undo: None,
            rack: Rack::new(options::send_records_for(config.tx_buffer)),
            tlp_deadline: None,
            tlp_pending: false,
            tlp_high: None,
            tlp_probe_seq: isn,
            tlp_retrans: false,
            tlp_flight: 0,
            limited_sent: 0,
            persist_deadline: None,
            persist_backoff: 0,
            persist_force: false,
            rto_probe: false,
            probe_end: None,
            probe_unanswered_since: None,
            closed_window_answered: false,
            zero_window_since: None,
            second_ack: None,
            keepalive_deadline: None,
            keepalive_probes_out: 0,
            keepalive_pending: false,
            last_rcv: now,
            clock: now,
            time_wait_deadline: None,
            pending_rst: None,
            counters: Counters::default(),
            config,
        }
    }

    /// Active open (RFC 9293 §3.10.1): the connection starts in SYN-SENT and the first
    /// `poll_transmit` yields the SYN `<SEQ=isn><CTL=SYN>` with our MSS, window scale,
    /// SACK-permitted and timestamp options as configured.
    pub fn connect(
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        isn: SeqNumber,
        now: Instant,
    ) -> Connection {
        debug!(%local, %remote, isn = isn.0, "tcp: active open, SYN-SENT");
        Connection::new(config, local, remote, State::SynSent, isn, now)
    }

    /// Passive open from a SYN received by a listener (the LISTEN processing of RFC 9293
    /// §3.10.7.2): the connection starts in SYN-RECEIVED and the first `poll_transmit`
    /// yields the SYN-ACK. Options are negotiated from `syn` (RFC 7323 §2.2: window
    /// scaling only if the SYN offers it, and so on). Data or FIN in the SYN is not
    /// accepted; the peer retransmits it once the connection is established.
    ///
    /// Returns `Err(TcpError::Refused)` if `syn` is not an acceptable SYN (no SYN bit, or
    /// ACK or RST set); the listener should then answer with [`rst_for_unexpected`].
    pub fn accept(
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        syn: &TcpRepr,
        isn: SeqNumber,
        now: Instant,
    ) -> Result<Connection, TcpError> {
        if !syn.flags.syn() || syn.flags.rst() || syn.ack.is_some() || syn.flags.ack() {
            debug!(?syn.flags, "tcp: accept refused a segment that is not a plain SYN");
            return Err(TcpError::Refused);
        }
        let mut conn = Connection::new(config, local, remote, State::SynReceived, isn, now);
        conn.passive = true;
        conn.on_peer_syn(syn);
        debug!(%local, %remote, isn = isn.0, irs = syn.seq.0, "tcp: passive open, SYN-RECEIVED");
        Ok(conn)
    }

    /// Passive open from the ACK that returns a SYN cookie (RFC 4987 §3.6), after the
    /// caller checked it ([`SynCookies::check`](crate::tcp::syncookie::SynCookies::check)):
    /// the connection is rebuilt as if the SYN (`SEG.SEQ - 1`, with the MSS `peer_mss`
    /// the cookie encodes and no other option) had been accepted and our cookie SYN-ACK
    /// ([`cookie_syn_ack`](crate::tcp::syncookie::cookie_syn_ack), ISN `cookie`) sent,
    /// then `ack` and its payload are processed as the handshake's ACK, which normally
    /// makes it ESTABLISHED. No window scaling, SACK or timestamps: the SYN-ACK offered
    /// none.
    ///
    /// Returns `Err(TcpError::Refused)` if `ack` is not a bare ACK (the caller answers
    /// with [`rst_for_unexpected`]).
    #[allow(clippy::too_many_arguments)]
    pub fn accept_cookie(
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        ack: &TcpRepr,
        payload: &[u8],
        cookie: SeqNumber,
        peer_mss: u16,
        now: Instant,
    ) -> Result<Connection, TcpError> {
        if ack.ack.is_none() || ack.flags.syn() || ack.flags.rst() {
            return Err(TcpError::Refused);
        }
        let syn = TcpRepr {
            src_port: ack.src_port,
            dst_port: ack.dst_port,
            seq: ack.seq - 1,
            ack: None,
            flags: TcpFlags::SYN,
            window: ack.window,
            urgent: 0,
            options: crate::wire::tcp::TcpOptions {
                mss: Some(peer_mss),
                ..Default::default()
            },
        };
        let mut conn = Connection::accept(config, local, remote, &syn, cookie, now)?;
        // The state `transmit_syn` would have left after sending the cookie SYN-ACK, less
        // the retransmission timer (nothing is outstanding once `ack` is processed) and
        // the RTT sample (the SYN-ACK's send time is not known).
        let window = usize::from(crate::tcp::syncookie::cookie_window(&conn.config));
        conn.rcv_adv = conn.rcv_nxt + window;
        conn.rcv_wnd_max = window;
        conn.note_ack_sent();
        conn.snd_nxt = cookie + 1;
        conn.snd_max = cookie + 1;
        conn.last_progress = now;
        debug!(%local, %remote, isn = cookie.0, peer_mss, "tcp: passive open from a SYN cookie");
        conn.handle_segment(now, ack, payload);
        Ok(conn)
    }

    /// Records the peer's SYN: IRS, RCV.NXT, and the option negotiation (RFC 9293 §3.7.1
    /// MSS, RFC 7323 §2.2 window scale and §3.2 timestamps, RFC 2018 §2 SACK-permitted).
    /// Everything is (re)derived here so nothing stale survives (smoltcp #518).
    fn on_peer_syn(&mut self, syn: &TcpRepr) {
        self.irs = syn.seq;
        self.rcv_nxt = syn.seq + 1;
        self.last_ack_sent = self.rcv_nxt;
        self.peer_mss = syn
            .options
            .mss
            .unwrap_or(DEFAULT_PEER_MSS)
            .max(MIN_PEER_MSS);
        match (self.config.window_scaling, syn.options.window_scale) {
            (true, Some(shift)) => {
                self.ws_enabled = true;
                if shift > MAX_WINDOW_SCALE {
                    // A peer can send these at line rate: a few lines a second.
                    static WARNINGS: crate::log_limit::LogLimit =
                        crate::log_limit::LogLimit::new(5);
                    if let Some(suppressed) = WARNINGS.check_at(self.clock) {
                        tracing::warn!(
                            shift,
                            suppressed,
                            "tcp: peer window scale above 14, clamped (RFC 7323 §2.3)"
                        );
                    }
                }
                self.snd_wscale = shift.min(MAX_WINDOW_SCALE);
                self.rcv_wscale = self.offered_wscale;
            }
            _ => {
                self.ws_enabled = false;
                self.snd_wscale = 0;
                self.rcv_wscale = 0;
            }
        }
        self.sack_enabled = self.config.sack && syn.options.sack_permitted;
        match (self.config.timestamps, syn.options.timestamp) {
            (true, Some((tsval, _))) => {
                self.ts_enabled = true;
                self.ts_recent = tsval;
            }
            _ => {
                self.ts_enabled = false;
                // Karn's timed segment takes the RTT samples.
                self.send_times.clear();
            }
        }
        // The window in a SYN is never scaled (RFC 7323 §2.2).
        self.snd_wnd = usize::from(syn.window);
        self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
        self.snd_wl1 = syn.seq;
        let smss = self.send_mss();
        self.cc.set_mss(smss);
        // Until we advertise, the promised right edge is RCV.NXT itself.
        self.rcv_adv = self.rcv_nxt;
    }

    /// Sets the offset added to our millisecond clock in every TSval (RFC 7323 §5.4 and
    /// §7.1: a per-connection offset hides the host's uptime). Call it right after
    /// [`connect`](Self::connect) or [`accept`](Self::accept), before the first
    /// `poll_transmit`; a later change would make TSvals jump. The netif derives it from
    /// its secret key and the 4-tuple ([`IsnGenerator::ts_offset`]), so that successive
    /// incarnations of a 4-tuple keep monotonic TSvals (RFC 6191). Tests leave it at 0.
    ///
    /// [`IsnGenerator::ts_offset`]: crate::tcp::isn::IsnGenerator::ts_offset
    pub fn set_ts_offset(&mut self, offset: u32) {
        self.ts_offset = offset;
    }

    /// The TSval we send at `now`.
    /// The connection's clock: `now`, or the newest instant seen before it. A caller may
    /// pass an instant older than one passed before (read on another thread, or before it
    /// took the connection), and a TSval from an older one would fall below the peer's
    /// TS.Recent and be dropped by its PAWS (RFC 7323 §5.3), and timers would be armed in
    /// the past.
    fn clock(&mut self, now: Instant) -> Instant {
        if now > self.clock {
            self.clock = now;
        }
        self.clock
    }

    fn tsval(&self, now: Instant) -> u32 {
        timestamp_value(now, self.ts_offset)
    }

    /// Queues `data` for sending; returns how many bytes were taken (fewer than
    /// `data.len()` when the send buffer fills). `Err(WouldBlock)` when there is no room at
    /// all, `Err(Closed)` after `close()` or once closed, the failure reason
    /// (`Reset`, `TimedOut`, `Refused`) if the connection failed. Data may be queued in
    /// SYN-SENT and SYN-RECEIVED; it is sent once established (RFC 9293 §3.10.2).
    pub fn send(&mut self, data: &[u8]) -> Result<usize, TcpError> {
        self.check_sendable()?;
        if data.is_empty() {
            return Ok(0);
        }
        let n = self.tx.push(data);
        self.snd_space.on_send(n, data.len());
        match n {
            0 => Err(TcpError::WouldBlock),
            n => Ok(n),
        }
    }

    /// [`send`](Self::send) of a buffer the caller shares instead of lending: a part of at
    /// least [`SHARE_MIN`](crate::tcp::send_queue::SHARE_MIN) bytes is held as it is
    /// (a reference, no copy) until acknowledged, and read straight into the frames; a
    /// shorter one is copied as `send` copies. Same results as `send`.
    pub fn send_bytes(&mut self, data: &Bytes) -> Result<usize, TcpError> {
        self.check_sendable()?;
        if data.is_empty() {
            return Ok(0);
        }
        let n = self.tx.push_shared(data);
        self.snd_space.on_send(n, data.len());
        match n {
            0 => Err(TcpError::WouldBlock),
            n => Ok(n),
        }
    }

    /// Whether data may be queued now: the failure reason if the connection failed,
    /// `Err(Closed)` after `close()` or outside SYN-SENT, SYN-RECEIVED, ESTABLISHED and
    /// CLOSE-WAIT.
    fn check_sendable(&self) -> Result<(), TcpError> {
        if let Some(err) = self.error {
            return Err(err);
        }
        let open = matches!(
            self.state,
            State::SynSent | State::SynReceived | State::Established | State::CloseWait
        );
        if !open || self.fin_queued {
            return Err(TcpError::Closed);
        }
        Ok(())
    }

    /// Reads received in-order bytes, with read(2) semantics: `Ok(n > 0)` data, `Ok(0)` end
    /// of stream (the peer's FIN arrived and everything before it was read),
    /// `Err(WouldBlock)` nothing yet, or the failure reason. Reading frees receive-window
    /// space; a window update goes out at the next `poll_transmit` when the window has
    /// opened enough (RFC 9293 §3.8.6.2.2).
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize, TcpError> {
        if let Some(err) = self.error {
            return Err(err);
        }
        if self.rx.readable() > 0 {
            if buf.is_empty() {
                return Ok(0);
            }
            self.window_update_check = true;
            let n = self.rx.read(buf);
            self.rcv_space.on_read(n);
            return Ok(n);
        }
        if self.fin_received {
            return Ok(0);
        }
        if self.state == State::Closed {
            return Err(TcpError::Closed);
        }
        Err(TcpError::WouldBlock)
    }

    /// Like [`recv`](Self::recv), but hands up to `max` bytes to `sink` (as at most two
    /// slices, in order) instead of copying into a caller's slice: a channel appends them
    /// to a growable buffer without zero-filling it first. Same results as `recv`
    /// (`Ok(0)` end of stream, `WouldBlock`, failures); `max == 0` returns `Ok(0)` only
    /// when bytes are readable.
    pub fn recv_with(&mut self, max: usize, sink: impl FnMut(&[u8])) -> Result<usize, TcpError> {
        if let Some(err) = self.error {
            return Err(err);
        }
        if self.rx.readable() > 0 {
            if max == 0 {
                return Ok(0);
            }
            self.window_update_check = true;
            let n = self.rx.read_with(max, sink);
            self.rcv_space.on_read(n);
            return Ok(n);
        }
        if self.fin_received {
            return Ok(0);
        }
        if self.state == State::Closed {
            return Err(TcpError::Closed);
        }
        Err(TcpError::WouldBlock)
    }

    /// Closes the sending direction (shutdown(SHUT_WR), RFC 9293 §3.10.4): a FIN follows
    /// the queued data. Receiving continues until the peer's FIN. In SYN-SENT and
    /// SYN-RECEIVED the FIN waits for the handshake to complete.
    pub fn close(&mut self) {
        match self.state {
            State::SynSent | State::SynReceived => {
                // RFC 9293 §3.10.4 lets SYN-RECEIVED queue the FIN until established; we
                // do the same in SYN-SENT (where RFC 793 deleted the TCB) because `send`
                // may queue data there and shutdown(SHUT_WR) must not discard it. The
                // handshake then leads straight to FIN-WAIT-1. `abort` cancels instead.
                self.fin_queued = true;
            }
            State::Established => {
                self.fin_queued = true;
                self.set_state(State::FinWait1);
            }
            State::CloseWait => {
                self.fin_queued = true;
                self.set_state(State::LastAck);
            }
            _ => {}
        }
    }

    /// Aborts the connection (RFC 9293 §3.10.5): in SYN-RECEIVED, ESTABLISHED, FIN-WAIT-1,
    /// FIN-WAIT-2 and CLOSE-WAIT a RST `<SEQ=SND.NXT><CTL=RST>` is queued for the next
    /// `poll_transmit`; the state becomes CLOSED at once and buffers are dropped.
    pub fn abort(&mut self) {
        let send_rst = matches!(
            self.state,
            State::SynReceived
                | State::Established
                | State::FinWait1
                | State::FinWait2
                | State::CloseWait
        );
        debug!(state = ?self.state, "tcp: abort");
        if send_rst {
            self.pending_rst = Some(self.make_rst());
        }
        self.enter_closed();
        if self.error.is_none() {
            self.error = Some(TcpError::Closed);
        }
    }

    /// RCV.NXT: the next sequence number expected from the peer. A RST is accepted only at
    /// exactly this number (RFC 5961 §3.2); diagnostics and fault-injection tests read it
    /// to forge one.
    pub fn rcv_nxt(&self) -> SeqNumber {
        self.rcv_nxt
    }

    /// SND.NXT: the next sequence number to send (rewound by an RTO), for diagnostics.
    pub fn snd_nxt(&self) -> SeqNumber {
        self.snd_nxt
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// CLOSED with nothing left to transmit: the netif may drop the connection. TIME-WAIT
    /// is not closed.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed && self.pending_rst.is_none()
    }

    /// Why the connection failed, if it did (`Closed` after `abort`).
    pub fn error(&self) -> Option<TcpError> {
        self.error
    }

    /// Our address.
    pub fn local(&self) -> SocketAddrV4 {
        self.local
    }

    /// The peer's address.
    pub fn remote(&self) -> SocketAddrV4 {
        self.remote
    }

    /// Send buffer size in bytes.
    pub fn send_capacity(&self) -> usize {
        self.tx.capacity()
    }

    /// Bytes in the send buffer (sent-but-unacknowledged plus unsent).
    pub fn send_queue(&self) -> usize {
        self.tx.len()
    }

    /// Free room in the send buffer.
    pub fn send_free(&self) -> usize {
        self.tx.free()
    }

    /// Bytes ready for `recv`.
    pub fn recv_queue(&self) -> usize {
        self.rx.readable()
    }

    /// Whether `send` may queue data now (open for sending and not closed by us).
    pub fn may_send(&self) -> bool {
        matches!(self.state, State::Established | State::CloseWait) && !self.fin_queued
    }

    /// Whether more data may still be received (the peer has not closed), or unread data
    /// remains.
    pub fn may_recv(&self) -> bool {
        matches!(
            self.state,
            State::Established | State::FinWait1 | State::FinWait2
        ) || self.rx.readable() > 0
    }

    /// Linux's `TCP_QUICKACK`. `true` acknowledges the next in-order data segments at once
    /// (the quick-ACK budget, [`Config::quick_ack_segments`](crate::tcp::Config), at least
    /// one, is refilled) and sends an ACK the delayed-ACK timer holds at the next
    /// transmit; `false` empties the budget, so that data is acknowledged by the
    /// delayed-ACK rules (RFC 5681 §4.2) from the next segment on. Like Linux's, the mode
    /// is not permanent: the budget is spent as segments arrive and refilled after idle.
    pub fn set_quickack(&mut self, on: bool) {
        if on {
            self.quick_acks = quick_ack_budget(&self.config).max(1);
            if self.delayed_ack_deadline.is_some() {
                self.ack_now = true;
            }
        } else {
            self.quick_acks = 0;
        }
    }

    /// Whether an ACK that the quick-ACK rules would have sent at once is held for the
    /// reply to carry ([`Config::reply_carries_ack`](crate::tcp::Config)): the next
    /// segment we send carries it, else [`reader_waiting`](Self::reader_waiting) or the
    /// delayed-ACK timer sends it. An owner that knows when the application waits for
    /// more watches this to tell it only then.
    pub fn reply_ack_held(&self) -> bool {
        self.reply_ack_held
    }

    /// Turns [`Config::reply_carries_ack`](crate::tcp::Config) on or off for this
    /// connection. Turning it off sends an ACK it holds at the next transmit, as the
    /// quick-ACK rules would have.
    pub fn set_reply_carries_ack(&mut self, on: bool) {
        if !on {
            self.reader_waiting();
        }
        self.config.reply_carries_ack = on;
    }

    /// The application has read everything received and waits for more: an ACK held for
    /// the reply ([`reply_ack_held`](Self::reply_ack_held)) goes out at the next
    /// transmit, since no reply is coming to carry it and the peer may be holding its
    /// next small write back until it comes (Nagle). What makes
    /// [`Config::reply_carries_ack`](crate::tcp::Config) safe; nothing to do otherwise
    /// (other delayed ACKs keep their rules).
    pub fn reader_waiting(&mut self) {
        if self.reply_ack_held {
            self.ack_now = true;
        }
    }

    /// Whether the next in-order data segment is acknowledged at once: delayed ACKs off,
    /// or quick-ACK budget left (`TCP_QUICKACK` as `getsockopt` reads it).
    pub fn quickack(&self) -> bool {
        self.config.delayed_ack.is_none() || self.quick_acks > 0
    }

    /// Disables (`true`) or re-enables (`false`) Nagle's algorithm.
    pub fn set_nodelay(&mut self, nodelay: bool) {
        self.nodelay = nodelay;
    }

    /// The effective send MSS: the peer's MSS and ours, less the timestamp option that
    /// every segment carries once negotiated (RFC 6691).
    pub fn send_mss(&self) -> usize {
        let mss = usize::from(self.peer_mss.min(self.advertised_mss().max(MIN_PEER_MSS)));
        let opts = if self.ts_enabled {
            TIMESTAMP_OPTION_LEN
        } else {
            0
        };
        mss.saturating_sub(opts).max(1)
    }

    /// The MSS we advertise (or advertised) in our SYN: the configured one, lowered by an
    /// MSS clamp set before the SYN went out. Also a bound on what we send.
    fn advertised_mss(&self) -> u16 {
        match self.mss_clamp {
            Some(clamp) => self.config.mss.min(clamp),
            None => self.config.mss,
        }
    }

    /// The peer's MSS option as negotiated (536 if it sent none).
    pub fn peer_mss(&self) -> u16 {
        self.peer_mss
    }

    /// Whether window scaling, SACK and timestamps were negotiated, in that order.
    pub fn negotiated(&self) -> (bool, bool, bool) {
        (self.ws_enabled, self.sack_enabled, self.ts_enabled)
    }

    /// The window-scale shifts in use: (ours, applied to windows we advertise; the peer's,
    /// applied to windows we receive).
    pub fn window_scales(&self) -> (u8, u8) {
        (self.rcv_wscale, self.snd_wscale)
    }

    /// The peer's current send window in bytes (scaled).
    pub fn peer_window(&self) -> usize {
        self.snd_wnd
    }

    /// SND.UNA, SND.NXT and RCV.NXT, for tests and diagnostics.
    pub fn sequence_state(&self) -> (SeqNumber, SeqNumber, SeqNumber) {
        (self.snd_una, self.snd_nxt, self.rcv_nxt)
    }

    /// RFC 6191: whether a new SYN arriving for this 4-tuple while in TIME-WAIT may
    /// reopen the connection (the netif then drops this connection and accepts the SYN).
    /// With timestamps, the SYN's TSval must be newer than TS.Recent; without them (or if
    /// the SYN carries none), RFC 1122's rule applies: its sequence number must be beyond
    /// RCV.NXT.
    pub fn accepts_new_syn_in_time_wait(&self, syn: &TcpRepr) -> bool {
        if self.state != State::TimeWait || !syn.flags.syn() || syn.flags.rst() || syn.ack.is_some()
        {
            return false;
        }
        match (self.ts_enabled, syn.options.timestamp) {
            (true, Some((tsval, _))) => (tsval.wrapping_sub(self.ts_recent) as i32) > 0,
            _ => syn.seq.distance_from(self.rcv_nxt) > 0,
        }
    }

    /// What the connection keeps of itself once in TIME-WAIT with nothing left to send:
    /// a [`TimeWait`](crate::tcp::time_wait::TimeWait) record that answers for the 4-tuple
    /// until the 2×MSL timer ends, so that the connection can go. `None` in any other
    /// state, or while a segment is still owed.
    pub fn time_wait(&self, now: Instant) -> Option<crate::tcp::time_wait::TimeWait> {
        if self.state != State::TimeWait || self.output_pending() {
            return None;
        }
        Some(crate::tcp::time_wait::TimeWait {
            local: self.local,
            remote: self.remote,
            snd_nxt: self.snd_nxt,
            rcv_nxt: self.rcv_nxt,
            window: self.window_field(),
            timestamps: self
                .ts_enabled
                .then_some(crate::tcp::time_wait::TimeWaitTimestamps {
                    recent: self.ts_recent,
                    offset: self.ts_offset,
                }),
            expires: self
                .time_wait_deadline
                .unwrap_or(now + self.config.time_wait),
            last_challenge: None,
        })
    }

    /// Whether the connection was opened by a SYN from its peer (passive open).
    pub fn is_passive(&self) -> bool {
        self.passive
    }

    /// Bytes of send and receive ring memory the connection holds: 0 until data flows
    /// (a half-open connection from a SYN costs no ring memory), then the configured
    /// buffer sizes.
    pub fn buffer_memory(&self) -> usize {
        self.tx.allocated() + self.rx.allocated()
    }

    /// A value that changes whenever [`stats`](Self::stats) may have: segments sent or
    /// received, retransmission timeouts and fast retransmits, and the bytes queued to
    /// send and ready to read (what the application moves). A driver that publishes
    /// statistics every round compares it to skip connections that did nothing.
    pub fn stats_mark(&self) -> StatsMark {
        let c = &self.counters;
        StatsMark([
            c.segments_sent,
            c.segments_received,
            c.rto_timeouts,
            c.fast_retransmits,
            self.tx.len() as u64,
            self.rx.readable() as u64,
        ])
    }

    /// The fields of [`stats`](Self::stats) that a driver publishes every round
    /// ([`Traffic`]), at a fraction of its cost: no RTO, reassembly or SACK state is
    /// derived (`stats` was ~180 instructions a round, callgrind).
    pub fn traffic(&self) -> Traffic {
        let c = &self.counters;
        Traffic {
            send_queue: self.tx.len(),
            recv_queue: self.rx.readable(),
            bytes_in_flight: self.bytes_in_flight(),
            cwnd: self.congestion_window(),
            srtt_us: self.rtt.srtt_micros(),
            retransmitted_segments: c.retransmitted_segments,
            rto_timeouts: c.rto_timeouts,
            bytes_sent: c.bytes_sent,
            bytes_acked: c.bytes_acked,
            bytes_received: c.bytes_received,
        }
    }

    /// A snapshot of counters and congestion state.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            bytes_sent: c.bytes_sent,
            bytes_acked: c.bytes_acked,
            bytes_received: c.bytes_received,
            segments_sent: c.segments_sent,
            segments_received: c.segments_received,
            retransmitted_segments: c.retransmitted_segments,
            fast_retransmits: c.fast_retransmits,
            rto_timeouts: c.rto_timeouts,
            srtt: self.rtt.srtt(),
            rto: self.rtt.rto(),
            cwnd: self.congestion_window(),
            ssthresh: self.cc.ssthresh(),
            bytes_in_flight: self.bytes_in_flight(),
            send_queue: self.tx.len(),
            recv_queue: self.rx.readable(),
            ooo_dropped: c.ooo_dropped,
            ooo_ranges: self.assembler.range_count(),
            sack_ranges_forgotten: self.sack_board.forgotten(),
            rx_buffer: self.rx.capacity(),
            rx_buffer_grown: c.rx_buffer_grown,
            tx_buffer: self.tx.capacity(),
            tx_buffer_grown: c.tx_buffer_grown,
            challenge_acks: c.challenge_acks,
            oow_acks_suppressed: c.oow_acks_suppressed,
            tail_loss_probes: c.tail_loss_probes,
            tlp_recoveries: c.tlp_recoveries,
            limited_transmits: c.limited_transmits,
            dsacks_sent: c.dsacks_sent,
            spurious_recoveries_undone: c.spurious_recoveries_undone,
            paws_rejected: c.paws_rejected,
            super_segments_sent: c.super_segments_sent,
            super_segment_pieces: c.super_segment_pieces,
            zero_window_timeouts: c.zero_window_timeouts,
        }
    }

    // ---- internal helpers shared by the submodules ----

    fn set_state(&mut self, state: State) {
        if self.state != state {
            debug!(from = ?self.state, to = ?state, local = %self.local, remote = %self.remote, "tcp: state change");
            self.state = state;
        }
    }

    /// Sequence number just past the last queued data byte (where the FIN goes).
    fn send_end(&self) -> SeqNumber {
        self.tx_base + self.tx.len()
    }

    /// The congestion window: PRR's during SACK recovery, else the controller's with
    /// NewReno's recovery inflation.
    fn congestion_window(&self) -> usize {
        if let (true, Some(cwnd)) = (self.in_recovery, self.prr_cwnd) {
            return cwnd;
        }
        self.cc.window().saturating_add(self.recovery_inflation)
    }

    /// Whether PRR (RFC 6937) sets cwnd during recovery: configured and SACK negotiated.
    fn prr_active(&self) -> bool {
        self.config.prr && self.sack_enabled
    }

    /// Sent and not cumulatively acknowledged sequence space.
    fn bytes_in_flight(&self) -> usize {
        seq_len(self.snd_una, self.snd_max)
    }

    /// Enters CLOSED, stopping all timers.
    fn enter_closed(&mut self) {
        self.set_state(State::Closed);
        self.rtx_deadline = None;
        self.tlp_deadline = None;
        self.tlp_pending = false;
        self.rack.stop_timer();
        self.persist_deadline = None;
        self.delayed_ack_deadline = None;
        self.reply_ack_held = false;
        self.keepalive_deadline = None;
        self.time_wait_deadline = None;
        self.ack_now = false;
        self.fast_rtx_pending = false;
        self.persist_force = false;
        self.keepalive_pending = false;
    }

    /// Fails the connection with `err`, optionally queueing a RST.
    fn fail(&mut self, err: TcpError, send_rst: bool) {
        debug!(?err, state = ?self.state, send_rst, "tcp: connection failed");
        if send_rst {
            self.pending_rst = Some(self.make_rst());
        }
        self.enter_closed();
        self.error = Some(err);
    }

    /// `<SEQ=SND.NXT><CTL=RST>` (RFC 9293 §3.10.5); SND.MAX, since SND.NXT may have been
    /// rewound by an RTO and the peer may already hold everything we sent.
    /// The RST of an abort. Its sequence number is the peer's acceptable one as Linux
    /// picks it (`tcp_acceptable_seq`): SND.MAX, unless that lies beyond the peer's window
    /// (a zero-window probe's byte, say), then the window's right edge. The peer takes a
    /// RST only at exactly RCV.NXT (RFC 5961 §3.2) and answers any other with a challenge
    /// ACK, which an aborted connection is no longer there to answer: a RST at SND.MAX
    /// one byte past a closed window left the peer retransmitting until its user timeout.
    fn make_rst(&self) -> TcpRepr {
        let wnd_end = self.snd_una + self.snd_wnd;
        TcpRepr {
            src_port: self.local.port(),
            dst_port: self.remote.port(),
            seq: self.snd_max.min(wnd_end),
            ack: None,
            flags: TcpFlags::RST,
            window: 0,
            urgent: 0,
            options: Default::default(),
        }
    }

    /// Enters TIME-WAIT (or restarts its 2*MSL timer, RFC 9293 §3.10.7.4 eighth step).
    fn enter_time_wait(&mut self, now: Instant) {
        self.set_state(State::TimeWait);
        self.time_wait_deadline = Some(now + self.config.time_wait);
        self.rtx_deadline = None;
        self.tlp_deadline = None;
        self.rack.stop_timer();
        self.persist_deadline = None;
        self.keepalive_deadline = None;
    }

    /// Whether RACK (RFC 8985 §6) does loss detection: configured and SACK negotiated.
    fn rack_active(&self) -> bool {
        self.config.rack && self.sack_enabled
    }

    /// Queues a challenge ACK unless this connection's per-second budget is spent
    /// (RFC 5961 §7; per connection, never global: CVE-2016-5696).
    /// Answers an out-of-window segment without data with an ACK, at most once per
    /// [`Config::invalid_ack_interval`] (Linux's `tcp_oow_rate_limited`): such answers
    /// are what two ends in an ACK loop keep sending each other.
    fn oow_ack(&mut self, now: Instant) {
        let interval = self.config.invalid_ack_interval;
        if self
            .last_oow_ack
            .is_some_and(|t| now.saturating_duration_since(t) < interval)
        {
            self.counters.oow_acks_suppressed += 1;
            trace!("tcp: ACK to an out-of-window segment suppressed by rate limit");
            return;
        }
        self.last_oow_ack = Some(now);
        self.ack_now = true;
    }

    fn challenge_ack(&mut self, now: Instant) {
        let window_expired = match self.challenge_window_start {
            Some(start) => now.saturating_duration_since(start) >= Duration::from_secs(1),
            None => true,
        };
        if window_expired {
            self.challenge_window_start = Some(now);
            self.challenge_count = 0;
        }
        if self.challenge_count >= self.config.challenge_ack_limit_per_sec {
            trace!("tcp: challenge ACK suppressed by rate limit");
            return;
        }
        self.challenge_count += 1;
        self.counters.challenge_acks += 1;
        self.ack_now = true;
        trace!("tcp: challenge ACK");
    }
}

/// The quick-ACK budget (Linux's `tcp_incr_quickack`): the configured number of segments,
/// but no more than half the receive buffer in MSS-sized segments (at least 2), since
/// acknowledging every segment of a window larger than the buffer gains nothing.
fn quick_ack_budget(config: &Config) -> usize {
    if config.quick_ack_segments == 0 {
        return 0;
    }
    let per_window = config.rx_buffer / (2 * usize::from(config.mss.max(1)));
    config.quick_ack_segments.min(per_window.max(2))
}

/// The length of `[from, to)` in sequence space, 0 when `to` is not after `from`.
fn seq_len(from: SeqNumber, to: SeqNumber) -> usize {
    to.distance_from(from).max(0) as usize
}

/// RFC 9293 §3.10.7.1: the reset that answers a segment arriving for no connection (or
/// refused by a listener). `None` if the segment itself carries RST. If it has an ACK:
/// `<SEQ=SEG.ACK><CTL=RST>`; otherwise `<SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>`, where
/// SEG.LEN counts SYN and FIN.
pub fn rst_for_unexpected(repr: &TcpRepr, payload_len: usize) -> Option<TcpRepr> {
    if repr.flags.rst() {
        return None;
    }
    let base = TcpRepr {
        src_port: repr.dst_port,
        dst_port: repr.src_port,
        seq: SeqNumber(0),
        ack: None,
        flags: TcpFlags::RST,
        window: 0,
        urgent: 0,
        options: Default::default(),
    };
    Some(match repr.ack {
        Some(ack) => TcpRepr { seq: ack, ..base },
        None => {
            // Payload lengths above 2^31 cannot occur on the wire; wrapping keeps this
            // panic-free for any handcrafted input.
            let seg_len = (payload_len as u32)
                .wrapping_add(u32::from(repr.flags.syn()))
                .wrapping_add(u32::from(repr.flags.fin()));
            TcpRepr {
                ack: Some(SeqNumber(repr.seq.0.wrapping_add(seg_len))),
                flags: TcpFlags::RST | TcpFlags::ACK,
                ..base
            }
        }
    })
}
