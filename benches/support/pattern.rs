//! The byte stream both bulk-transfer peers carry: a pseudo-random pattern with a prime
//! period, so that no segment boundary lines up with it and every byte the receiver reads is
//! checked against the byte that was sent at that stream offset.

/// The pattern's period in bytes (prime, and not a multiple of any segment size).
pub const PERIOD: usize = 65_521;

/// The pattern: [`PERIOD`] bytes of a fixed xorshift sequence.
pub fn pattern() -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..PERIOD)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

/// The bytes to send next from stream offset `offset`, at most `max` of them (one contiguous
/// piece of the pattern, so it may be shorter than `max`).
pub fn next(pattern: &[u8], offset: usize, max: usize) -> &[u8] {
    let start = offset % PERIOD;
    let len = max.min(PERIOD - start);
    &pattern[start..start + len]
}

/// Whether `data`, read at stream offset `offset`, is what the sender sent there.
pub fn check(pattern: &[u8], mut offset: usize, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        let want = next(pattern, offset, data.len());
        if data[..want.len()] != *want {
            return false;
        }
        offset += want.len();
        data = &data[want.len()..];
    }
    true
}

/// Whether the receivers read through their stack's lending call (`TCP_BULK_RECV=lend`:
/// ours `recv_with`, smoltcp's `recv`, the bytes checked where they lie in the receive
/// buffer) instead of copying into a buffer of the application's (`recv` and `recv_slice`,
/// the default).
pub fn recv_lends() -> bool {
    std::env::var("TCP_BULK_RECV").is_ok_and(|v| v == "lend")
}
