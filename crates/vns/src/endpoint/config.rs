//! The endpoint's tunables ([`Config`]) and their validation ([`ConfigError`]).

use std::time::Duration;

use thiserror::Error;

use crate::wire::MAX_PAYLOAD;

#[cfg(doc)]
use super::{Endpoint, EndpointCounters};

/// Tunables of an [`Endpoint`]. Sizes are in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Largest chunk payload this endpoint sends and accepts (the paper's code used at most
    /// 62,620; the wire limit is 65,535).
    pub max_chunk_payload: usize,
    /// Per-socket send buffer: [`Endpoint::send`] accepts at most this many unsent bytes.
    pub send_buffer: usize,
    /// Per-socket receive buffer: the reorder window a socket holds itself. At least
    /// `max_chunk_payload`.
    pub recv_buffer: usize,
    /// How far past the application's read position the peer may send (the credit). At
    /// least `recv_buffer`; the excess over `recv_buffer` is what may end up parked in the
    /// socket's response queue, charged to channel budgets.
    pub credit_window: usize,
    /// Send a credit update once the credit edge has moved this far past the last one
    /// advertised (1 ..= `credit_window`).
    pub credit_update_threshold: usize,
    /// Per-channel budget of parked bytes (response queues charged to the channel). At
    /// least `max_chunk_payload`. When a chunk would exceed it, the endpoint stops
    /// consuming the channel's bytes (the last resort that holds the channel's window).
    pub channel_budget: usize,
    /// Per-peer budget of parked bytes: the sum over all of one peer's channels (each
    /// within `channel_budget`). A peer may open many channels, so the per-channel budget
    /// alone does not bound what it can make the endpoint hold. When a chunk would exceed
    /// it, the endpoint stops consuming that channel's bytes, as for `channel_budget`, and
    /// counts it ([`EndpointCounters::peer_budget_stalls`]). At least `channel_budget`.
    pub peer_budget: usize,
    /// Local virtual ports [`Endpoint::connect`] picks from (inclusive). Each connect
    /// starts its search for a free one at a random port of the range, so that an
    /// off-path peer cannot guess the ports of the next connections.
    pub ephemeral_ports: (u16, u16),
    /// `None` (the default): every socket's initial sequence number is random, so that a
    /// peer cannot predict another connection's sequence space. `Some(isn)`, for tests
    /// only: the first connection starts at `isn` and later ones are spread from it
    /// (predictable); set it near `u32::MAX` to exercise wrap-around.
    pub first_isn: Option<u32>,
    /// Seed of the endpoint's random generator (ISNs and ephemeral ports). `None` (the
    /// default): seeded from the operating system's entropy. `Some`: reproducible runs, for
    /// tests and simulations; anyone who knows the seed can predict ports and ISNs.
    pub rng_seed: Option<u64>,
    /// Most virtual sockets that SYNCs from one peer may have created and that still
    /// exist (waiting to be accepted, open, or closed and lingering). A SYNC past the
    /// bound is refused with RESET, as a full backlog is, and counted
    /// ([`EndpointCounters::refused_syncs`]); a SYNC costs the peer 16 bytes and the
    /// endpoint a socket, so without a bound a peer could fill the memory. Sockets the
    /// application opens with [`Endpoint::connect`] do not count. At least 1.
    pub max_peer_sockets: usize,
    /// Most sockets that SYNCs from all peers together may have created and that still
    /// exist; past it SYNCs are refused like past `max_peer_sockets`. With one endpoint
    /// per stack this is the stack's total. At least 1.
    pub max_sockets: usize,
    /// How long a socket released with [`Endpoint::close`] after a shutdown may linger
    /// waiting for its bytes and FIN to leave and for the peer's FIN. Past it the socket is
    /// reset and removed ([`EndpointCounters::linger_expired`]): a peer that never sends
    /// its FIN (or never grants credit) would otherwise hold the socket forever. Time is
    /// passed in: see [`Endpoint::handle_timeout`].
    pub linger_timeout: Duration,
    /// How long a connecting socket waits for the peer's SYNC_ACK before it sends its
    /// SYNC again, doubling after each try (at most [`SYNC_RETRY_MAX`](crate::SYNC_RETRY_MAX) apart) until the
    /// caller's connect deadline fails it. A peer whose listener's backlog is full
    /// drops the SYNC, as Linux drops a SYN, so the client retries rather than being
    /// refused. Shorter than TCP's 1 s first SYN retransmission: nothing was lost, the
    /// listener only had no room, and an `accept` may make room at any moment. Time is
    /// passed in: see [`Endpoint::handle_timeout`].
    pub sync_retry: Duration,
    /// Longest a socket with `nodelay` off holds a chunk shorter than a full one while its
    /// earlier data is unacknowledged (Nagle's algorithm, RFC 896; [`SocketOptions`]).
    /// Our data-level acknowledgement comes when the peer's application reads, which an
    /// idle peer may not be doing, so the hold is bounded, like Linux's by its delayed
    /// ACK. Time is passed in: see [`Endpoint::handle_timeout`].
    pub nagle_delay: Duration,
    /// Most bytes of one socket cut into DATA chunks and not yet acknowledged at the data
    /// level (read by the peer's application), which the socket keeps to send again on
    /// another channel if theirs dies. It bounds the memory a peer that grants a huge
    /// window and never reads can make a socket hold; an honest peer's window (its
    /// `credit_window`) below it never meets it. The bound applied is the larger of this
    /// and `credit_window` (peers are usually configured alike), so raising the window
    /// alone never throttles a socket. At least `max_chunk_payload`.
    pub resend_buffer: usize,
    /// How long the sockets to a peer wait, once its last channel is lost, for a channel to
    /// it to be opened again (by either side; a stack that opened the channels reopens
    /// them itself). Past it they fail with the loss's error. Time is passed in: see
    /// [`Endpoint::handle_timeout`].
    pub channel_loss_timeout: Duration,
    /// This endpoint as one shard of several that share one host's channels (a stack
    /// splits its sockets over shards so that calls on sockets of different shards never
    /// wait for each other; see [`ShardOf`]). The default, one shard of one, owns every
    /// socket.
    pub shard: ShardOf,
}

/// Which of a stack's endpoint shards an endpoint is: shard `index` of `count`.
///
/// A socket belongs to the shard [`ShardOf::shard_for`] names for its local and remote
/// virtual ports, so that the layer that deframes a channel's chunks can hand each one to
/// its socket's shard from the chunk header alone, before any lookup. A shard picks the
/// ephemeral ports of its connects so that they map back to itself, and numbers its
/// sockets `index`, `index + count`, ... so that socket ids are unique over the shards.
///
/// With `latency_ports`, the last shard is the latency shard: it owns every socket with
/// a port (either end) in that range, and no other. A latency-class socket connected
/// there (its class set before the connect) takes an ephemeral port from the range, so
/// the peer's stack, whose rule is the same, puts it in its own latency shard too. Its
/// calls then never wait for a lock that bulk sockets' tasks and the bulk queues' drivers
/// hold (and may be preempted holding: on a busy host, the latency application waited
/// 1-5 ms for such locks, `docs/investigations/isolation.md`, "Isolation: what the latency
/// application still waited for").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardOf {
    /// This shard, `0..count`.
    pub index: u16,
    /// Shards of the stack, at least 1 (2 with a latency shard).
    pub count: u16,
    /// The ports whose sockets belong to the latency shard, the last one; `None`: there
    /// is no latency shard.
    pub latency_ports: Option<(u16, u16)>,
}

impl Default for ShardOf {
    fn default() -> Self {
        ShardOf {
            index: 0,
            count: 1,
            latency_ports: None,
        }
    }
}

impl ShardOf {
    /// The shard that owns the socket with these virtual ports (`local` on this host,
    /// `remote` on the peer), of `count` shards without a latency shard. For a received
    /// chunk, `local` is its destination port and `remote` its source port.
    pub fn of_ports(local: u16, remote: u16, count: u16) -> u16 {
        ((u32::from(local) + u32::from(remote)) % u32::from(count.max(1))) as u16
    }

    /// The shard of this stack that owns the socket with these virtual ports: the
    /// latency shard for a port in `latency_ports`, else [`ShardOf::of_ports`] over the
    /// other shards.
    pub fn shard_for(&self, local: u16, remote: u16) -> u16 {
        match self.latency_shard() {
            Some(l) if self.is_latency_port(local) || self.is_latency_port(remote) => l,
            Some(l) => Self::of_ports(local, remote, l),
            None => Self::of_ports(local, remote, self.count),
        }
    }

    /// Whether a socket with `port` at either end belongs to the latency shard.
    pub fn is_latency_port(&self, port: u16) -> bool {
        self.latency_shard().is_some()
            && self
                .latency_ports
                .is_some_and(|(lo, hi)| (lo..=hi).contains(&port))
    }

    /// The latency shard's index (the last), if there is one.
    pub fn latency_shard(&self) -> Option<u16> {
        self.latency_ports
            .filter(|_| self.count >= 2)
            .map(|_| self.count - 1)
    }

    /// Whether this shard owns the socket with these ports.
    pub fn owns(&self, local: u16, remote: u16) -> bool {
        self.shard_for(local, remote) == self.index
    }

    /// The latency shard's ports within an ephemeral range: its top sixteenth (at
    /// least one port); `None` when the range is too small to share.
    pub fn latency_ports_in(ephemeral: (u16, u16)) -> Option<(u16, u16)> {
        let span = u32::from(ephemeral.1).checked_sub(u32::from(ephemeral.0))? + 1;
        if span < 32 {
            return None;
        }
        let n = (span / 16) as u16;
        Some((ephemeral.1 - n + 1, ephemeral.1))
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_chunk_payload: 62_620,
            send_buffer: 256 * 1024,
            // Credit no larger than the buffer: every chunk the peer may send fits, so
            // parking and STOP/RESUME stay for configurations that grant more. With a
            // 256 KiB buffer and twice that in credit, a bulk sender kept overrunning the
            // buffer (a STOP/RESUME round trip per ~370 KB on the two-core bed). With
            // 768 KiB of both, one stream over AF_PACKET moved 14-18 Gbit/s where the
            // former defaults gave 11-14, and eight streams on one channel 18 where they
            // gave 6-8 (`docs/investigations/bulk.md`, "Flow control by credit alone").
            recv_buffer: 768 * 1024,
            credit_window: 768 * 1024,
            credit_update_threshold: 192 * 1024,
            channel_budget: 2 * 1024 * 1024,
            peer_budget: 32 * 1024 * 1024,
            ephemeral_ports: (49152, 65535),
            first_isn: None,
            rng_seed: None,
            max_peer_sockets: 16 * 1024,
            max_sockets: 64 * 1024,
            linger_timeout: Duration::from_secs(60),
            sync_retry: Duration::from_millis(200),
            nagle_delay: Duration::from_millis(1),
            resend_buffer: 1024 * 1024,
            channel_loss_timeout: Duration::from_secs(10),
            shard: ShardOf::default(),
        }
    }
}

/// Why a [`Config`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// A size relation documented on [`Config`] does not hold.
    #[error("invalid configuration: {0}")]
    Invalid(&'static str),
}

impl Config {
    /// Checks the relations documented on each field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m| Err(ConfigError::Invalid(m));
        if self.sync_retry.is_zero() {
            return bad("sync_retry must be positive");
        }
        if self.max_chunk_payload == 0 || self.max_chunk_payload > MAX_PAYLOAD {
            return bad("max_chunk_payload must be 1..=65535");
        }
        if self.send_buffer == 0 {
            return bad("send_buffer must be positive");
        }
        if self.recv_buffer < self.max_chunk_payload {
            return bad("recv_buffer must be at least max_chunk_payload");
        }
        if self.credit_window < self.recv_buffer || self.credit_window > 1 << 30 {
            return bad("credit_window must be recv_buffer..=2^30");
        }
        if self.credit_update_threshold == 0 || self.credit_update_threshold > self.credit_window {
            return bad("credit_update_threshold must be 1..=credit_window");
        }
        if self.channel_budget < self.max_chunk_payload {
            return bad("channel_budget must be at least max_chunk_payload");
        }
        if self.peer_budget < self.channel_budget {
            return bad("peer_budget must be at least channel_budget");
        }
        if self.ephemeral_ports.0 > self.ephemeral_ports.1 {
            return bad("ephemeral_ports must be a non-empty range");
        }
        if self.resend_buffer < self.max_chunk_payload {
            return bad("resend_buffer must be at least max_chunk_payload");
        }
        if self.max_peer_sockets == 0 || self.max_sockets == 0 {
            return bad("max_peer_sockets and max_sockets must be positive");
        }
        if self.shard.count == 0 || self.shard.index >= self.shard.count {
            return bad("shard.index must be below shard.count");
        }
        if let Some((lo, hi)) = self.shard.latency_ports {
            if lo > hi || self.shard.count < 2 {
                return bad("shard.latency_ports must be a range, beside at least one other shard");
            }
        }
        let span = u32::from(self.ephemeral_ports.1) - u32::from(self.ephemeral_ports.0) + 1;
        if span < u32::from(self.shard.count) {
            return bad("ephemeral_ports must hold at least one port per shard");
        }
        Ok(())
    }
}

/// The longest wait between two tries of a SYNC ([`Config::sync_retry`] doubles up to it).
pub const SYNC_RETRY_MAX: Duration = Duration::from_secs(3);

/// Settings of one socket, chosen before it exists: a connecting socket's
/// ([`Endpoint::connect_with`](super::Endpoint::connect_with)) or those a listener gives
/// the sockets it accepts ([`Endpoint::set_listener_options`](super::Endpoint::set_listener_options)),
/// as `SO_SNDBUF`/`SO_RCVBUF` are set on a socket before `connect` or `listen`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SocketOptions {
    /// Send buffer bytes; `None`: [`Config::send_buffer`]. Clamped to `1..=2^30`.
    pub send_buffer: Option<usize>,
    /// Receive (reorder) buffer bytes; `None`: [`Config::recv_buffer`]. Clamped to
    /// `max_chunk_payload..=2^29`. The credit window the socket grants, and its update
    /// threshold, scale with it in the configuration's proportions (by default equal to
    /// the buffer), and are announced in the SYNC or SYNC_ACK: set it before the handshake.
    pub recv_buffer: Option<usize>,
    /// Whether small chunks leave at once (`true`, the default) or wait while earlier
    /// data is unacknowledged, as Nagle's algorithm (RFC 896) makes them wait
    /// ([`Endpoint::set_nodelay`](super::Endpoint::set_nodelay)).
    pub nodelay: bool,
    /// The local virtual port of a connecting socket (`bind` before `connect`); `None`:
    /// an ephemeral one. With shards ([`ShardOf`]), the port must map to this endpoint's
    /// shard together with the remote port, or the connect fails with
    /// [`Error::AddrInUse`](super::Error::AddrInUse). Ignored by listeners.
    pub local_port: Option<u16>,
    /// The class of a connecting socket from its first chunk (the paper's
    /// `SO_APP_TYPE` set before `connect`). A stack puts a latency-class one in its
    /// latency shard ([`ShardOf`]), which changing the class later does not do. Ignored by
    /// listeners.
    pub app_class: netsched::AppClass,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            send_buffer: None,
            recv_buffer: None,
            nodelay: true,
            local_port: None,
            app_class: netsched::AppClass::Throughput,
        }
    }
}

/// A socket's buffer sizes, resolved from [`SocketOptions`] and the [`Config`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SocketBuffers {
    pub(crate) send: usize,
    pub(crate) recv: usize,
    /// The credit window the socket grants (its credit edge is its read position plus it).
    pub(crate) window: usize,
    pub(crate) update_threshold: usize,
}

impl Config {
    /// The buffers of a socket with `opts`.
    pub(crate) fn buffers(&self, opts: &SocketOptions) -> SocketBuffers {
        let send = opts
            .send_buffer
            .unwrap_or(self.send_buffer)
            .clamp(1, 1 << 30);
        let Some(recv) = opts.recv_buffer else {
            return SocketBuffers {
                send,
                recv: self.recv_buffer,
                window: self.credit_window,
                update_threshold: self.credit_update_threshold,
            };
        };
        let recv = recv.clamp(self.max_chunk_payload, 1 << 29);
        // The configuration's proportions (`validate` keeps window >= recv_buffer and the
        // threshold within the window); u128 so that no product overflows.
        let scale = |x: usize, num: usize, den: usize| {
            (x as u128 * num as u128 / den.max(1) as u128) as usize
        };
        let window = scale(recv, self.credit_window, self.recv_buffer).clamp(recv, 1 << 30);
        let update_threshold =
            scale(window, self.credit_update_threshold, self.credit_window).clamp(1, window);
        SocketBuffers {
            send,
            recv,
            window,
            update_threshold,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ShardOf;

    /// The latency shard owns exactly the sockets with a port in its range, at either
    /// end; the other shards share the rest as before, and every port maps to one shard.
    #[test]
    fn the_latency_shard_owns_its_ports_and_nothing_else() {
        let ports = ShardOf::latency_ports_in((49152, 65535)).unwrap();
        assert_eq!(ports, (64512, 65535));
        assert_eq!(
            ShardOf::latency_ports_in((1000, 1010)),
            None,
            "too few to share"
        );
        let map = |index| ShardOf {
            index,
            count: 3,
            latency_ports: Some(ports),
        };
        assert_eq!(map(0).latency_shard(), Some(2));
        for (local, remote) in [(65000, 80), (80, 65000), (64512, 7), (65535, 65535)] {
            assert_eq!(map(0).shard_for(local, remote), 2, "{local} {remote}");
            assert!(map(2).owns(local, remote) && !map(0).owns(local, remote));
        }
        for (local, remote) in [(50000, 80), (64511, 7601), (7601, 49152)] {
            let s = map(0).shard_for(local, remote);
            assert_eq!(s, ShardOf::of_ports(local, remote, 2), "{local} {remote}");
            assert_eq!((0..3).filter(|&i| map(i).owns(local, remote)).count(), 1);
        }
        // Without latency ports (or with one shard), the rule is the plain one.
        let plain = ShardOf {
            index: 0,
            count: 3,
            latency_ports: None,
        };
        assert_eq!(plain.latency_shard(), None);
        assert_eq!(plain.shard_for(65000, 80), ShardOf::of_ports(65000, 80, 3));
        let alone = ShardOf {
            index: 0,
            count: 1,
            latency_ports: Some(ports),
        };
        assert_eq!(alone.latency_shard(), None);
        assert!(alone.owns(65000, 80));
    }
}
