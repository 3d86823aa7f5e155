//! The Internet checksum (RFC 1071), and the IPv4 pseudo-header sum that TCP and UDP
//! checksums cover (RFC 9293 §3.1, "Checksum"; RFC 768).
//!
//! Every function here returns the *folded one's-complement sum* as a plain `u16` in
//! network order numerically (the value you would write with `to_be_bytes`), not yet
//! complemented; [`finish`] (or [`checksum`]) applies the final complement.
//!
//! [`data`] is the fast path: it relies on the byte-order independence of the one's-complement
//! sum (RFC 1071 §2 (B)) to add native-endian 32-bit lanes into 64-bit accumulators, 32 bytes
//! per step, and only swaps bytes once at the end. [`data_reference`] is the plain
//! byte-pair loop from RFC 1071 §4.1; tests and benches compare the two.

use std::net::Ipv4Addr;

/// Folds a wide one's-complement accumulator down to 16 bits (end-around carries).
pub const fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// One's-complement sum of two folded sums.
pub const fn add(a: u16, b: u16) -> u16 {
    fold(a as u64 + b as u64)
}

/// One's-complement sum of several folded sums, e.g. a pseudo-header sum, a header sum and
/// a payload sum. Every part except the last must cover an even number of bytes, or the
/// byte lanes of the following parts are misaligned.
pub fn combine(sums: &[u16]) -> u16 {
    fold(sums.iter().map(|&s| s as u64).sum())
}

/// The value to write in a checksum field: the complement of a folded sum.
pub const fn finish(sum: u16) -> u16 {
    !sum
}

/// The folded one's-complement sum of `buf` (fast version).
///
/// Any length and any alignment are handled; reads go through `from_ne_bytes` on
/// `chunks_exact` slices, so no unaligned access or `unsafe` is involved. Buffers up to
/// 2^34 bytes cannot overflow the accumulators.
pub fn data(buf: &[u8]) -> u16 {
    // Headers (20 to 60 bytes) are summed four times per segment: inline, without the
    // feature check and the call, which cost more than the sum itself at that size.
    if buf.len() <= 64 {
        return data_small(buf);
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above), the one requirement of a
        // `target_feature(enable = "avx2")` function; the function itself is safe code.
        return unsafe { data_avx2(buf) };
    }
    data_lanes(buf)
}

/// [`data`] for a header: 32-bit words into one accumulator (at most 16 of them, so no
/// overflow), then the odd tail.
#[inline(always)]
fn data_small(buf: &[u8]) -> u16 {
    let mut sum = 0u64;
    let mut words = buf.chunks_exact(4);
    for w in &mut words {
        sum += u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut pairs = rest.chunks_exact(2);
    for pair in &mut pairs {
        sum += u64::from(u16::from_ne_bytes([pair[0], pair[1]]));
    }
    if let [last] = pairs.remainder() {
        sum += u64::from(u16::from_ne_bytes([*last, 0]));
    }
    u16::from_be(fold(sum))
}

/// [`data`] compiled for AVX2: the same safe code, which the compiler vectorises over
/// 256-bit registers instead of the baseline's 128-bit SSE2 ones.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn data_avx2(buf: &[u8]) -> u16 {
    data_lanes(buf)
}

/// The body of [`data`], for every target.
#[inline(always)]
fn data_lanes(buf: &[u8]) -> u16 {
    // Eight independent accumulators, one per 32-bit lane of a 32-byte block, so the
    // additions form no long dependency chain and vectorise as plain lane-wise adds. A
    // lane is < 2^32, so no accumulator can overflow for any slice that fits in memory.
    let mut acc = [0u64; 8];
    let mut blocks = buf.chunks_exact(32);
    for block in &mut blocks {
        add_block(&mut acc, block);
    }
    finish_lanes(&acc, blocks.remainder())
}

/// Copies `src` into `dst` and returns the folded sum of the bytes copied: what
/// `dst.copy_from_slice(src)` followed by [`data`]`(src)` computes, with the sum reading
/// the bytes from L1 right after the copy brought them there, so each byte comes from
/// memory once. Copies `min(dst.len(), src.len())` bytes and sums exactly those; never
/// panics.
///
/// This is the transmit path's send ring → frame copy and the receive path's frame →
/// receive ring copy: the checksum of a TCP payload rides on the copy that moves it.
pub fn copy_and_sum(dst: &mut [u8], src: &[u8]) -> u16 {
    let n = dst.len().min(src.len());
    let dst = &mut dst[..n];
    // One `memcpy`, then the sum over the destination while it is in L1. A loop that
    // interleaves copy and sum block by block is what this replaced: compilers split it
    // back into a `memcpy` per run of blocks and a sum, and it measured slower than a
    // single copy of the whole payload (`cargo bench --bench checksum -- copy_and`).
    dst.copy_from_slice(&src[..n]);
    data(dst)
}

/// Adds one 32-byte block to the eight lane accumulators (see [`data`]).
#[inline(always)]
fn add_block(acc: &mut [u64; 8], block: &[u8]) {
    for (a, word) in acc.iter_mut().zip(block.chunks_exact(4)) {
        *a += u64::from(u32::from_ne_bytes([word[0], word[1], word[2], word[3]]));
    }
}

/// Folds the lane accumulators and a tail of fewer than 32 bytes into a network-order sum.
#[inline(always)]
fn finish_lanes(acc: &[u64; 8], rest: &[u8]) -> u16 {
    let mut sum: u64 = acc
        .iter()
        .map(|&a| (a & 0xffff_ffff_ffff) + (a >> 48))
        .sum();
    // Each term above moved a whole number of 16-bit lanes, so the sum is unchanged mod
    // 0xffff. Now the tail: fewer than 32 bytes, eight at a time, then a pair at a time
    // (every piece starts at an even offset, so its 16-bit lanes stay in step).
    let mut words = rest.chunks_exact(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        let w = u64::from_ne_bytes(w);
        sum += (w & 0xffff_ffff) + (w >> 32);
    }
    let mut pairs = words.remainder().chunks_exact(2);
    for pair in &mut pairs {
        sum += u16::from_ne_bytes([pair[0], pair[1]]) as u64;
    }
    if let [last] = pairs.remainder() {
        // An odd final byte is the high byte of a zero-padded word (RFC 1071 §4.1).
        sum += u16::from_ne_bytes([*last, 0]) as u64;
    }
    // The sum is of native-endian words; convert the folded result to network order.
    u16::from_be(fold(sum))
}

/// The sum of a part that starts `at` bytes into the data being summed, ready to
/// [`add`] to the sums of the parts before it: a part starting at an odd offset has its
/// bytes in the other lanes, and the one's-complement sum is byte-order independent
/// (RFC 1071 §2 (B)), so swapping the folded sum moves it into place.
pub const fn at_offset(sum: u16, at: usize) -> u16 {
    if at % 2 == 1 {
        sum.swap_bytes()
    } else {
        sum
    }
}

/// The folded one's-complement sum of `buf`, computed one big-endian byte pair at a time
/// exactly as RFC 1071 §4.1 describes. This is the reference implementation against which
/// tests and benches check [`data`]; it is correct but several times slower.
pub fn data_reference(buf: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut i = 0;
    while i + 1 < buf.len() {
        sum += u16::from_be_bytes([buf[i], buf[i + 1]]) as u64;
        i += 2;
    }
    if i < buf.len() {
        sum += (buf[i] as u64) << 8;
    }
    fold(sum)
}

/// The Internet checksum of `buf`: the complement of its folded sum, ready for a header.
pub fn checksum(buf: &[u8]) -> u16 {
    finish(data(buf))
}

/// The folded sum of the IPv4 pseudo-header (RFC 9293 §3.1): source and destination
/// address, zero, protocol number and the length of the transport header plus payload.
pub fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, length: u32) -> u16 {
    let s = src.octets();
    let d = dst.octets();
    let sum = u16::from_be_bytes([s[0], s[1]]) as u64
        + u16::from_be_bytes([s[2], s[3]]) as u64
        + u16::from_be_bytes([d[0], d[1]]) as u64
        + u16::from_be_bytes([d[2], d[3]]) as u64
        + protocol as u64
        + (length >> 16) as u64
        + (length & 0xffff) as u64;
    fold(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The fused copy equals a plain copy followed by the reference sum, for any bytes,
        /// length and (mis)alignment of either side.
        #[test]
        fn copy_and_sum_is_copy_plus_sum(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096),
            s_off in 0usize..8,
            d_off in 0usize..8,
        ) {
            let s_off = s_off.min(bytes.len());
            let src = &bytes[s_off..];
            let mut dst = vec![0u8; src.len() + d_off];
            let sum = copy_and_sum(&mut dst[d_off..], src);
            prop_assert_eq!(sum, data_reference(src));
            prop_assert_eq!(&dst[d_off..], src);
        }
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3 numerical example: 00 01 f2 03 f4 f5 f6 f7 sums to 0xddf2.
        let bytes = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(data_reference(&bytes), 0xddf2);
        assert_eq!(data(&bytes), 0xddf2);
        assert_eq!(checksum(&bytes), !0xddf2);
    }

    #[test]
    fn empty_and_odd() {
        assert_eq!(data(&[]), 0);
        assert_eq!(data_reference(&[]), 0);
        assert_eq!(data(&[0xab]), 0xab00);
        assert_eq!(data_reference(&[0xab]), 0xab00);
        assert_eq!(data(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }

    #[test]
    fn fast_matches_reference_all_lengths_and_offsets() {
        let buf: Vec<u8> = (0..300u32).map(|i| (i * 151 + 7) as u8).collect();
        for off in 0..8 {
            for len in 0..(buf.len() - off) {
                let s = &buf[off..off + len];
                assert_eq!(data(s), data_reference(s), "off {off} len {len}");
            }
        }
    }

    #[test]
    fn all_ones_does_not_overflow() {
        let buf = vec![0xffu8; 70_000];
        assert_eq!(data(&buf), data_reference(&buf));
        assert_eq!(data(&buf), 0xffff);
    }

    #[test]
    fn combine_of_even_parts_equals_whole() {
        let buf: Vec<u8> = (0..101u32).map(|i| (i * 37) as u8).collect();
        let whole = data(&buf);
        assert_eq!(combine(&[data(&buf[..40]), data(&buf[40..])]), whole);
        assert_eq!(add(data(&buf[..2]), data(&buf[2..])), whole);
    }

    #[test]
    fn copy_and_sum_matches_copy_then_sum_all_lengths_and_offsets() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 151 + 7) as u8).collect();
        for s_off in 0..4 {
            for d_off in 0..4 {
                for len in 0..(src.len() - 4) {
                    let s = &src[s_off..s_off + len];
                    let mut dst = vec![0xeeu8; len + 8];
                    let sum = copy_and_sum(&mut dst[d_off..d_off + len], s);
                    assert_eq!(
                        sum,
                        data_reference(s),
                        "s_off {s_off} d_off {d_off} len {len}"
                    );
                    assert_eq!(&dst[d_off..d_off + len], s);
                    // Bytes around the destination are untouched.
                    assert!(dst[..d_off].iter().all(|&b| b == 0xee));
                    assert!(dst[d_off + len..].iter().all(|&b| b == 0xee));
                }
            }
        }
    }

    #[test]
    fn copy_and_sum_of_unequal_lengths_copies_the_shorter() {
        let src = [1u8, 2, 3, 4, 5];
        let mut dst = [0u8; 3];
        assert_eq!(copy_and_sum(&mut dst, &src), data_reference(&src[..3]));
        assert_eq!(dst, [1, 2, 3]);
        let mut dst = [9u8; 8];
        assert_eq!(copy_and_sum(&mut dst, &src), data_reference(&src));
        assert_eq!(dst, [1, 2, 3, 4, 5, 9, 9, 9]);
    }

    #[test]
    fn parts_at_odd_offsets_combine() {
        let buf: Vec<u8> = (0..257u32).map(|i| (i * 89 + 3) as u8).collect();
        for cut in 0..buf.len() {
            let (a, b) = buf.split_at(cut);
            assert_eq!(
                add(data(a), at_offset(data(b), cut)),
                data(&buf),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn pseudo_header_matches_bytes() {
        let src = Ipv4Addr::new(192, 168, 1, 2);
        let dst = Ipv4Addr::new(10, 0, 0, 254);
        let bytes = [192, 168, 1, 2, 10, 0, 0, 254, 0, 6, 0x01, 0x2c];
        assert_eq!(pseudo_header_v4(src, dst, 6, 300), data_reference(&bytes));
    }
}
