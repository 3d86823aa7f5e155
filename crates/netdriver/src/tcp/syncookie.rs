//! SYN cookies (RFC 4987 §3.6): answering a SYN without keeping any state.
//!
//! When a listener's backlog of unaccepted connections is full (a spoofed-SYN flood fills
//! it with half-open connections that only time out), the netif answers a SYN with a
//! SYN-ACK whose initial sequence number is a *cookie* and forgets the SYN. A real peer's
//! ACK returns the cookie plus one in its acknowledgement field; the netif recomputes it
//! and only then creates the connection ([`Connection::accept_cookie`]).
//!
//! # Cookie layout (32 bits, most significant first)
//!
//! | bits | field |
//! |---|---|
//! | 31..30 | the time counter (`now / COOKIE_PERIOD`) modulo 4 |
//! | 29..27 | index of the peer's MSS in [`MSS_TABLE`] (largest entry not above it) |
//! | 26..0 | SipHash-2-4, keyed with a 128-bit secret, of the 4-tuple, the peer's ISN, the whole time counter and the MSS index, truncated to 27 bits |
//!
//! A cookie is accepted while the counter it was made with is the current one or the one
//! before (64 to 128 s after it was sent): the two low counter bits say which, and the
//! hash, computed over the whole counter, catches an older one whose low bits alias.
//! Forging one blindly takes 2^27 tries on average per 4-tuple.
//!
//! # What a cookie connection loses
//!
//! Only the MSS survives (in 3 bits). Window scaling, SACK and timestamps are not
//! offered in a cookie SYN-ACK, so the connection runs without them (a 64 KiB window at
//! most); Linux encodes them in the timestamp option instead, which this stack does not.
//! Data in the SYN is never accepted anyway. Cookies only come into play while a backlog
//! is full, so ordinary connections keep every option.
//!
//! [`Connection::accept_cookie`]: crate::tcp::Connection::accept_cookie

use core::hash::Hasher;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU64, Ordering};

use siphasher::sip::SipHasher24;

use crate::tcp::{Config, SeqNumber};
use crate::time::{Duration, Instant};
use crate::wire::tcp::{TcpFlags, TcpOptions, TcpRepr};

/// How long one value of the cookie time counter lasts. A cookie is valid for one to two
/// periods: long enough for any handshake's ACK (even after SYN-ACK retransmissions by
/// the peer's SYN retries), short enough that a captured cookie soon expires.
pub const COOKIE_PERIOD: Duration = Duration::from_micros(COOKIE_PERIOD_MICROS);
const COOKIE_PERIOD_MICROS: u64 = 64_000_000;

/// The MSS values a cookie can carry. The peer gets the largest one not above the MSS of
/// its SYN (or 536, the default, without an option), so we never send larger segments
/// than it asked for. The entries cover the IPv4 MSS of the usual MTUs (576, 1280 IPv6
/// tunnels, PPPoE 1492, 1500, 4096 and 9000 jumbo frames).
pub const MSS_TABLE: [u16; 8] = [64, 536, 1240, 1400, 1452, 1460, 4056, 8960];

const HASH_BITS: u32 = 27;
const HASH_MASK: u32 = (1 << HASH_BITS) - 1;
const MSS_SHIFT: u32 = HASH_BITS;
const COUNTER_SHIFT: u32 = 30;

/// Why a returning ACK's cookie was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CookieError {
    /// The segment cannot carry a cookie (SYN or RST set, or no ACK).
    #[error("segment is not a bare ACK")]
    NotAnAck,
    /// The cookie's counter is neither the current nor the previous one.
    #[error("cookie expired")]
    Expired,
    /// The hash does not match: a forged or mistyped acknowledgement.
    #[error("cookie does not verify")]
    Invalid,
}

/// The cookie secret and the time the last cookie went out, shared by every interface
/// that answers for one address (the channel layer runs one per NIC queue, and a peer's
/// ACK may come back on another queue than its SYN).
pub struct SynCookies {
    key: [u8; 16],
    /// `Instant::total_micros` of the last cookie sent, plus one (0: never). Cookies are
    /// checked only within two periods of it, so that outside a flood a blind guess of
    /// an ACK cannot open a connection at all.
    last_sent: AtomicU64,
}

impl core::fmt::Debug for SynCookies {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The key is the whole secret; it must not end up in logs.
        f.debug_struct("SynCookies").finish_non_exhaustive()
    }
}

impl Default for SynCookies {
    fn default() -> Self {
        Self::new()
    }
}

impl SynCookies {
    /// A fresh secret from the OS's random generator.
    pub fn new() -> Self {
        Self::with_key(rand::random())
    }

    /// A fixed secret, for reproducible simulations and tests.
    pub fn with_key(key: [u8; 16]) -> Self {
        SynCookies {
            key,
            last_sent: AtomicU64::new(0),
        }
    }

    /// The time counter at `now`.
    pub fn counter(now: Instant) -> u32 {
        (now.total_micros() / COOKIE_PERIOD_MICROS) as u32
    }

    /// The index in [`MSS_TABLE`] of the largest entry not above `mss`.
    pub fn mss_index(mss: u16) -> usize {
        MSS_TABLE.iter().rposition(|&m| m <= mss).unwrap_or(0)
    }

    fn hash(
        &self,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        peer_isn: SeqNumber,
        counter: u32,
        mss_index: u32,
    ) -> u32 {
        let mut h = SipHasher24::new_with_key(&self.key);
        h.write(&local.ip().octets());
        h.write(&local.port().to_be_bytes());
        h.write(&remote.ip().octets());
        h.write(&remote.port().to_be_bytes());
        h.write(&peer_isn.value().to_be_bytes());
        h.write(&counter.to_be_bytes());
        h.write_u8(mss_index as u8);
        (h.finish() as u32) & HASH_MASK
    }

    /// The cookie (our ISN) for `syn`, received at `now` on `local` from `remote`, and the
    /// MSS it encodes. Records that a cookie was sent.
    pub fn generate(
        &self,
        now: Instant,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        syn: &TcpRepr,
    ) -> (SeqNumber, u16) {
        let counter = Self::counter(now);
        let index = Self::mss_index(syn.options.mss.unwrap_or(536));
        let hash = self.hash(local, remote, syn.seq, counter, index as u32);
        let cookie = ((counter & 3) << COUNTER_SHIFT) | ((index as u32) << MSS_SHIFT) | hash;
        self.last_sent
            .fetch_max(now.total_micros().saturating_add(1), Ordering::Relaxed);
        (SeqNumber(cookie), MSS_TABLE[index])
    }

    /// Whether a cookie went out within the last two periods before `now`: only then is
    /// an ACK for no connection checked for one.
    pub fn recently_sent(&self, now: Instant) -> bool {
        match self.last_sent.load(Ordering::Relaxed) {
            0 => false,
            t => {
                let sent = Self::counter(Instant::from_micros(t - 1));
                Self::counter(now).wrapping_sub(sent) <= 1
            }
        }
    }

    /// Checks the cookie of `ack`, the first segment of the peer after our cookie
    /// SYN-ACK (a bare ACK, perhaps with data), received at `now` on `local` from
    /// `remote`. Returns the peer's MSS it encodes.
    pub fn check(
        &self,
        now: Instant,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        ack: &TcpRepr,
    ) -> Result<u16, CookieError> {
        let Some(ack_no) = ack.ack else {
            return Err(CookieError::NotAnAck);
        };
        if ack.flags.syn() || ack.flags.rst() {
            return Err(CookieError::NotAnAck);
        }
        // SEG.ACK = cookie + 1 and SEG.SEQ = peer ISN + 1 (RFC 4987 §3.6).
        let cookie = (ack_no - 1).value();
        let peer_isn = ack.seq - 1;
        let now_counter = Self::counter(now);
        let tag = cookie >> COUNTER_SHIFT;
        let counter = [now_counter, now_counter.wrapping_sub(1)]
            .into_iter()
            .find(|c| c & 3 == tag)
            .ok_or(CookieError::Expired)?;
        let index = (cookie >> MSS_SHIFT) & 7;
        if self.hash(local, remote, peer_isn, counter, index) != cookie & HASH_MASK {
            return Err(CookieError::Invalid);
        }
        Ok(MSS_TABLE[index as usize])
    }
}

/// The window a cookie SYN-ACK advertises, and that [`Connection::accept_cookie`] takes as
/// advertised: the receive buffer, unscaled (no window scaling with cookies).
///
/// [`Connection::accept_cookie`]: crate::tcp::Connection::accept_cookie
pub fn cookie_window(config: &Config) -> u16 {
    u16::try_from(config.rx_buffer).unwrap_or(u16::MAX)
}

/// The SYN-ACK that answers `syn` with `cookie` as our ISN: our MSS and nothing else
/// (see the module docs for why).
pub fn cookie_syn_ack(config: &Config, syn: &TcpRepr, cookie: SeqNumber) -> TcpRepr {
    TcpRepr {
        src_port: syn.dst_port,
        dst_port: syn.src_port,
        seq: cookie,
        ack: Some(syn.seq + 1),
        flags: TcpFlags::SYN | TcpFlags::ACK,
        window: cookie_window(config),
        urgent: 0,
        options: TcpOptions {
            mss: Some(config.mss),
            ..TcpOptions::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const KEY: [u8; 16] = *b"cookie-key-01234";

    fn addrs() -> (SocketAddrV4, SocketAddrV4) {
        (
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 9000),
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 40000),
        )
    }

    fn syn(seq: u32, mss: Option<u16>) -> TcpRepr {
        TcpRepr {
            src_port: 40000,
            dst_port: 9000,
            seq: SeqNumber(seq),
            flags: TcpFlags::SYN,
            options: TcpOptions {
                mss,
                ..TcpOptions::default()
            },
            ..TcpRepr::default()
        }
    }

    fn ack_for(syn: &TcpRepr, cookie: SeqNumber) -> TcpRepr {
        TcpRepr {
            src_port: syn.src_port,
            dst_port: syn.dst_port,
            seq: syn.seq + 1,
            ack: Some(cookie + 1),
            flags: TcpFlags::ACK,
            ..TcpRepr::default()
        }
    }

    #[test]
    fn mss_index_takes_the_largest_entry_not_above() {
        assert_eq!(MSS_TABLE[SynCookies::mss_index(1460)], 1460);
        assert_eq!(MSS_TABLE[SynCookies::mss_index(1459)], 1452);
        assert_eq!(MSS_TABLE[SynCookies::mss_index(65535)], 8960);
        assert_eq!(MSS_TABLE[SynCookies::mss_index(536)], 536);
        assert_eq!(MSS_TABLE[SynCookies::mss_index(0)], 64);
    }

    #[test]
    fn round_trip_across_counters_and_wrap() {
        let c = SynCookies::with_key(KEY);
        let (l, r) = addrs();
        for (isn, mss) in [(u32::MAX, Some(1460)), (0, None), (12345, Some(9000))] {
            let s = syn(isn, mss);
            let t = Instant::from_millis(10_000_000);
            let (cookie, enc) = c.generate(t, l, r, &s);
            assert_eq!(enc, MSS_TABLE[SynCookies::mss_index(mss.unwrap_or(536))]);
            let a = ack_for(&s, cookie);
            assert_eq!(c.check(t, l, r, &a), Ok(enc));
            // Still valid one counter later, not two.
            assert_eq!(c.check(t + COOKIE_PERIOD, l, r, &a), Ok(enc));
            let late = t + COOKIE_PERIOD + COOKIE_PERIOD;
            assert_eq!(c.check(late, l, r, &a), Err(CookieError::Expired));
            // Four periods later the low bits alias the current counter: the hash fails.
            let alias = Instant::from_micros(t.total_micros() + 4 * COOKIE_PERIOD_MICROS);
            assert_eq!(c.check(alias, l, r, &a), Err(CookieError::Invalid));
        }
    }

    #[test]
    fn anything_changed_fails() {
        let c = SynCookies::with_key(KEY);
        let (l, r) = addrs();
        let s = syn(777, Some(1460));
        let t = Instant::from_millis(500_000);
        let (cookie, _) = c.generate(t, l, r, &s);
        let good = ack_for(&s, cookie);
        let other_port = SocketAddrV4::new(*r.ip(), 40001);
        assert_eq!(c.check(t, l, other_port, &good), Err(CookieError::Invalid));
        let wrong_seq = TcpRepr {
            seq: good.seq + 1,
            ..good
        };
        assert_eq!(c.check(t, l, r, &wrong_seq), Err(CookieError::Invalid));
        // Claiming a larger MSS by flipping the index bits.
        let bigger = TcpRepr {
            ack: Some(SeqNumber(
                (cookie.value() ^ (7 << MSS_SHIFT)).wrapping_add(1),
            )),
            ..good
        };
        assert_eq!(c.check(t, l, r, &bigger), Err(CookieError::Invalid));
        let other_key = SynCookies::with_key([1; 16]);
        assert_eq!(other_key.check(t, l, r, &good), Err(CookieError::Invalid));
        let syn_ack = TcpRepr {
            flags: TcpFlags::SYN | TcpFlags::ACK,
            ..good
        };
        assert_eq!(c.check(t, l, r, &syn_ack), Err(CookieError::NotAnAck));
        assert_eq!(
            c.check(t, l, r, &TcpRepr { ack: None, ..good }),
            Err(CookieError::NotAnAck)
        );
    }

    #[test]
    fn recently_sent_spans_two_periods() {
        let c = SynCookies::with_key(KEY);
        let (l, r) = addrs();
        let t = Instant::from_millis(1_000_000);
        assert!(!c.recently_sent(t));
        c.generate(t, l, r, &syn(1, None));
        assert!(c.recently_sent(t));
        assert!(c.recently_sent(t + COOKIE_PERIOD));
        assert!(!c.recently_sent(t + COOKIE_PERIOD + COOKIE_PERIOD));
        // Debug hides the key.
        assert!(!format!("{c:?}").contains("cookie-key"));
    }
}
