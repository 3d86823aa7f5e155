//! Initial sequence numbers (RFC 6528 §3, as required by RFC 9293 §3.4.1).
//!
//! `ISN = M + F(localip, localport, remoteip, remoteport, secretkey)`: `M` is a timer that
//! ticks every 4 µs, taken from the caller's `now` so simulations stay deterministic, and
//! `F` is SipHash-2-4 keyed with 128 secret bits. The keyed hash keeps off-path attackers
//! from predicting the ISN of a connection they cannot observe; the timer keeps successive
//! incarnations of the same 4-tuple moving forward through the sequence space.

use crate::tcp::SeqNumber;
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

impl Default for IsnGenerator {
    fn default() -> Self {
        Self::new()
    }
}
