//! Initial sequence numbers (RFC 6528 §3, as required by RFC 9293 §3.4.1).
//!
//! `ISN = M + F(localip, localport, remoteip, remoteport, secretkey)`: `M` is a timer that
//! ticks every 4 µs, taken from the caller's `now` so simulations stay deterministic, and
//! `F` is SipHash-2-4 keyed with 128 secret bits. The keyed hash keeps off-path attackers
//! from predicting the ISN of a connection they cannot observe; the timer keeps successive
//! incarnations of the same 4-tuple moving forward through the sequence space.

use crate::tcp::SeqNumber;
#[cfg(test)]
use crate::time::Duration;
use crate::time::Instant;
use core::hash::Hasher;
use siphasher::sip::SipHasher24;
use std::net::SocketAddrV4;

/// Generates RFC 6528 initial sequence numbers from a secret key.
#[derive(Clone)]
pub struct IsnGenerator {
    key: [u8; 16],
}

impl core::fmt::Debug for IsnGenerator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The key is the whole secret; it must not end up in logs.
        f.debug_struct("IsnGenerator").finish_non_exhaustive()
    }
}

impl IsnGenerator {
    /// A generator with a fresh random key.
    pub fn new() -> Self {
        Self::with_key(rand::random())
    }

    /// A generator with a fixed key, for reproducible simulations and tests.
    pub fn with_key(key: [u8; 16]) -> Self {
        IsnGenerator { key }
    }

    /// The ISN for a connection from `local` to `remote` opened at `now`.
    pub fn generate(&self, now: Instant, local: SocketAddrV4, remote: SocketAddrV4) -> SeqNumber {
        let mut h = SipHasher24::new_with_key(&self.key);
        h.write(&local.ip().octets());
        h.write(&local.port().to_be_bytes());
        h.write(&remote.ip().octets());
        h.write(&remote.port().to_be_bytes());
        // M wraps modulo 2^32 like the sequence space itself (every ~4.8 hours).
        let m = (now.total_micros() / 4) as u32;
        SeqNumber(m.wrapping_add(h.finish() as u32))
    }
}

impl IsnGenerator {
    /// The offset added to a connection's millisecond timestamp clock (RFC 7323 §5.4 and
    /// §7.1): a keyed hash of the 4-tuple, so that TSvals do not reveal the host's clock
    /// and successive incarnations of one 4-tuple still see monotonic TSvals (RFC 6191).
    pub fn ts_offset(&self, local: SocketAddrV4, remote: SocketAddrV4) -> u32 {
        let mut h = SipHasher24::new_with_key(&self.key);
        // Domain separation from the ISN's F().
        h.write(b"tsoffset");
        h.write(&local.ip().octets());
        h.write(&local.port().to_be_bytes());
        h.write(&remote.ip().octets());
        h.write(&remote.port().to_be_bytes());
        h.finish() as u32
    }
}

impl Default for IsnGenerator {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn addr(a: u8, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, a), port)
    }

    const KEY: [u8; 16] = *b"0123456789abcdef";

    #[test]
    fn ts_offset_is_keyed_per_tuple_and_stable() {
        let (l, r) = (addr(1, 40000), addr(2, 80));
        let g = IsnGenerator::with_key(KEY);
        assert_eq!(g.ts_offset(l, r), g.ts_offset(l, r));
        assert_ne!(g.ts_offset(l, r), g.ts_offset(addr(1, 40001), r));
        assert_ne!(
            g.ts_offset(l, r),
            IsnGenerator::with_key([7; 16]).ts_offset(l, r)
        );
        // Not the ISN's hash: one must not give the other away.
        let isn_f = g.generate(Instant::ZERO, l, r).0;
        assert_ne!(g.ts_offset(l, r), isn_f);
    }

    #[test]
    fn deterministic_per_key() {
        let (l, r) = (addr(1, 40000), addr(2, 80));
        let t = Instant::from_millis(1234);
        let a = IsnGenerator::with_key(KEY).generate(t, l, r);
        assert_eq!(IsnGenerator::with_key(KEY).generate(t, l, r), a);
        let other = IsnGenerator::with_key([7; 16]).generate(t, l, r);
        assert_ne!(other, a);
    }

    #[test]
    fn differs_per_four_tuple() {
        let g = IsnGenerator::with_key(KEY);
        let t = Instant::ZERO;
        let base = g.generate(t, addr(1, 40000), addr(2, 80));
        let variants = [
            g.generate(t, addr(3, 40000), addr(2, 80)),
            g.generate(t, addr(1, 40001), addr(2, 80)),
            g.generate(t, addr(1, 40000), addr(4, 80)),
            g.generate(t, addr(1, 40000), addr(2, 81)),
            // Swapping the ends is a different connection.
            g.generate(t, addr(2, 80), addr(1, 40000)),
        ];
        for v in variants {
            assert_ne!(v, base);
        }
    }

    #[test]
    fn advances_one_per_four_microseconds() {
        let g = IsnGenerator::with_key(KEY);
        let (l, r) = (addr(1, 40000), addr(2, 80));
        let t0 = Instant::from_micros(1_000_000);
        let base = g.generate(t0, l, r);
        assert_eq!(g.generate(t0 + Duration::from_micros(3), l, r), base);
        assert_eq!(g.generate(t0 + Duration::from_micros(4), l, r), base + 1);
        assert_eq!(g.generate(t0 + Duration::from_millis(4), l, r), base + 1000);
        assert_eq!(
            g.generate(t0 + Duration::from_secs(1), l, r),
            base + 250_000
        );
    }

    #[test]
    fn timer_wraps_without_panicking() {
        let g = IsnGenerator::with_key(KEY);
        let (l, r) = (addr(1, 1), addr(2, 2));
        let t = Instant::from_micros(u64::from(u32::MAX) * 4);
        assert_eq!(
            g.generate(t + Duration::from_micros(8), l, r),
            g.generate(t, l, r) + 2
        );
        let _ = g.generate(Instant::from_micros(u64::MAX), l, r);
    }

    #[test]
    fn random_keys_differ_and_debug_hides_key() {
        let (l, r) = (addr(1, 1), addr(2, 2));
        let a = IsnGenerator::new();
        let b = IsnGenerator::default();
        // Equal only with probability 2^-32.
        assert_ne!(
            a.generate(Instant::ZERO, l, r),
            b.generate(Instant::ZERO, l, r)
        );
        assert!(!format!("{:?}", IsnGenerator::with_key(KEY)).contains("48"));
    }
}
