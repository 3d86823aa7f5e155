//! Reading an AF_XDP rx ring's descriptors into frames: one descriptor per frame, or a
//! multi-buffer *chain* (every part but the last flagged `XDP_PKT_CONTD`) lent as its
//! parts where they lie ([`Link::recv_batch_parts`](super::Link::recv_batch_parts)).
//!
//! Kept apart from the link's rings and UMEM so that the rules for malformed input can be
//! tested without a kernel: a chain longer than the largest frame or than
//! [`MAX_RX_CHAIN_PARTS`] descriptors, or with a part outside its UMEM chunk, is dropped
//! whole and counted, its remaining parts skipped as they arrive; a chain the batch ends
//! inside is left for the next call, which reads it again from its first descriptor
//! (its chunks must stay off the fill ring meanwhile). A chain that never ends grows
//! past one of the limits and is dropped.

use super::xsk::sys::{XdpDesc, XDP_PKT_CONTD};
use super::LinkStats;

/// The most buffers one received frame may span: the kernel builds frames of at most
/// `MAX_SKB_FRAGS` (17) fragments behind a linear part. Longer chains are dropped.
pub const MAX_RX_CHAIN_PARTS: usize = 18;

/// What [`read_frames`] needs to know of the link.
#[derive(Debug, Clone, Copy)]
pub(super) struct RxLimits {
    /// The socket is bound with `XDP_USE_SG`: chains are expected.
    pub multi_buffer: bool,
    /// The largest frame, Ethernet header included.
    pub max_frame_len: usize,
}

/// Counters [`read_frames`] adds to besides the link's [`LinkStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct RxChainCounts {
    /// Frames received as chains and delivered.
    pub chains: u64,
    /// Chains dropped (too long, too many parts, a part outside its chunk).
    pub chains_dropped: u64,
}

/// Where [`read_frames`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RxRead {
    /// Descriptors done with, from the first: their buffers may go back to the fill ring.
    /// The rest begin a chain whose last part is still to come.
    pub done: usize,
    /// Frames delivered.
    pub delivered: usize,
}

/// Reads `descs` in order, lending each whole frame to `f` as its parts (`part_of` gives
/// a descriptor's bytes, `None` for one leaving its chunk). `dropping` carries "the
/// chain being read is being dropped" from one call to the next.
pub(super) fn read_frames<'a>(
    descs: &[XdpDesc],
    limits: RxLimits,
    dropping: &mut bool,
    part_of: impl Fn(&XdpDesc) -> Option<&'a [u8]>,
    stats: &mut LinkStats,
    counts: &mut RxChainCounts,
    mut f: impl FnMut(&[&[u8]]),
) -> RxRead {
    let mut parts: [&[u8]; MAX_RX_CHAIN_PARTS] = [&[]; MAX_RX_CHAIN_PARTS];
    // The chain being read: its parts so far and their bytes.
    let mut count = 0;
    let mut bytes = 0;
    let mut read = RxRead {
        done: 0,
        delivered: 0,
    };
    for (i, desc) in descs.iter().enumerate() {
        let more = desc.options & XDP_PKT_CONTD != 0;
        if *dropping {
            *dropping = more;
            read.done = i + 1;
            continue;
        }
        let part = part_of(desc);
        if count == 0 && !more {
            read.done = i + 1;
            match part {
                Some(part) if part.len() <= limits.max_frame_len => {
                    stats.rx_frames += 1;
                    stats.rx_bytes += part.len() as u64;
                    read.delivered += 1;
                    f(&[part]);
                }
                // Too long, or a descriptor leaving its chunk (never from a kernel that
                // works).
                _ => stats.dropped_oversize += 1,
            }
            continue;
        }
        if !limits.multi_buffer {
            // A chain without XDP_USE_SG cannot happen; drop it whole rather than trust
            // it (its last part is no frame either).
            stats.dropped_oversize += 1;
            *dropping = more;
            read.done = i + 1;
            continue;
        }
        match part {
            Some(part)
                if count < MAX_RX_CHAIN_PARTS && bytes + part.len() <= limits.max_frame_len =>
            {
                parts[count] = part;
                count += 1;
                bytes += part.len();
            }
            _ => {
                stats.dropped_oversize += 1;
                counts.chains_dropped += 1;
                count = 0;
                bytes = 0;
                *dropping = more;
                read.done = i + 1;
                continue;
            }
        }
        if more {
            continue;
        }
        stats.rx_frames += 1;
        stats.rx_bytes += bytes as u64;
        counts.chains += 1;
        read.delivered += 1;
        f(&parts[..count]);
        count = 0;
        bytes = 0;
        read.done = i + 1;
    }
    read
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pretend UMEM of 8 chunks of 64 bytes, each byte its own address's low bits.
    const CHUNK: u64 = 64;
    const LIMITS: RxLimits = RxLimits {
        multi_buffer: true,
        max_frame_len: 150,
    };

    fn umem() -> Vec<u8> {
        (0..8 * CHUNK).map(|a| a as u8).collect()
    }

    fn desc(chunk: u64, len: u32, more: bool) -> XdpDesc {
        XdpDesc {
            addr: chunk * CHUNK + 8,
            len,
            options: if more { XDP_PKT_CONTD } else { 0 },
        }
    }

    struct Out {
        frames: Vec<Vec<Vec<u8>>>,
        read: RxRead,
        stats: LinkStats,
        counts: RxChainCounts,
        dropping: bool,
    }

    fn read(descs: &[XdpDesc], dropping: bool, limits: RxLimits) -> Out {
        let mem = umem();
        let part_of = |d: &XdpDesc| {
            let end = d.addr.checked_add(u64::from(d.len))?;
            // Inside the descriptor's chunk, as `Umem::frame` checks.
            (end <= (d.addr / CHUNK + 1) * CHUNK)
                .then(|| mem.get(d.addr as usize..end as usize))
                .flatten()
        };
        let mut out = Out {
            frames: Vec::new(),
            read: RxRead {
                done: 0,
                delivered: 0,
            },
            stats: LinkStats::default(),
            counts: RxChainCounts::default(),
            dropping,
        };
        let mut frames = Vec::new();
        out.read = read_frames(
            descs,
            limits,
            &mut out.dropping,
            part_of,
            &mut out.stats,
            &mut out.counts,
            |parts| frames.push(parts.iter().map(|p| p.to_vec()).collect()),
        );
        out.frames = frames;
        out
    }

    #[test]
    fn single_frames_and_chains_are_lent_where_they_lie() {
        let out = read(
            &[
                desc(0, 40, false),
                desc(1, 56, true),
                desc(2, 56, true),
                desc(3, 10, false),
                desc(4, 20, false),
            ],
            false,
            LIMITS,
        );
        let lens: Vec<Vec<usize>> = out
            .frames
            .iter()
            .map(|f| f.iter().map(Vec::len).collect())
            .collect();
        assert_eq!(lens, [vec![40], vec![56, 56, 10], vec![20]]);
        assert_eq!(out.frames[1][1][0], (2 * CHUNK + 8) as u8);
        assert_eq!(
            out.read,
            RxRead {
                done: 5,
                delivered: 3
            }
        );
        assert_eq!(out.counts.chains, 1);
        assert_eq!(out.stats.rx_bytes, 40 + 122 + 20);
    }

    #[test]
    fn a_chain_the_batch_ends_inside_is_left_for_the_next_call() {
        let descs = [desc(0, 40, false), desc(1, 56, true), desc(2, 56, true)];
        let out = read(&descs, false, LIMITS);
        assert_eq!(
            out.read,
            RxRead {
                done: 1,
                delivered: 1
            }
        );
        assert!(!out.dropping);
        // The next call reads the held descriptors again, then the rest of the chain.
        let next = read(&[descs[1], descs[2], desc(3, 10, false)], false, LIMITS);
        assert_eq!(
            next.read,
            RxRead {
                done: 3,
                delivered: 1
            }
        );
        assert_eq!(next.frames[0].len(), 3);
    }

    #[test]
    fn malformed_chains_are_dropped_whole_and_counted() {
        // Longer than the largest frame: dropped at the part that overflows, the rest
        // skipped, the frame after it delivered.
        let out = read(
            &[
                desc(0, 56, true),
                desc(1, 56, true),
                desc(2, 56, true),
                desc(3, 10, false),
                desc(4, 20, false),
            ],
            false,
            LIMITS,
        );
        assert_eq!(out.frames.len(), 1);
        let want: Vec<u8> = (4 * CHUNK + 8..4 * CHUNK + 28).map(|a| a as u8).collect();
        assert_eq!(out.frames[0], [want]);
        assert_eq!(out.counts.chains_dropped, 1);
        assert_eq!(out.stats.dropped_oversize, 1);
        assert_eq!(out.read.done, 5);
        // A part leaving its chunk (past the UMEM too): the chain goes.
        let out = read(
            &[desc(0, 56, true), desc(1, 60, true), desc(2, 5, false)],
            false,
            LIMITS,
        );
        assert!(out.frames.is_empty());
        assert_eq!(out.counts.chains_dropped, 1);
        let out = read(&[desc(0, 56, true), desc(9, 5, false)], false, LIMITS);
        assert!(out.frames.is_empty());
        assert_eq!(out.counts.chains_dropped, 1);
        // A chain that never ends: more parts than any frame has.
        let limits = RxLimits {
            max_frame_len: usize::MAX,
            ..LIMITS
        };
        let endless: Vec<XdpDesc> = (0..MAX_RX_CHAIN_PARTS as u64 + 3)
            .map(|i| desc(i % 8, 1, true))
            .collect();
        let out = read(&endless, false, limits);
        assert!(out.frames.is_empty());
        assert_eq!(out.counts.chains_dropped, 1);
        assert!(out.dropping, "the rest of the chain is skipped");
        assert_eq!(out.read.done, endless.len());
        // Its end arrives in a later call: skipped, and the next frame is delivered.
        let out = read(&[desc(0, 1, false), desc(1, 9, false)], true, LIMITS);
        assert_eq!(out.frames.len(), 1);
        assert!(!out.dropping);
        // Without XDP_USE_SG no part of a chain is trusted.
        let out = read(
            &[desc(0, 56, true), desc(1, 5, false)],
            false,
            RxLimits {
                multi_buffer: false,
                ..LIMITS
            },
        );
        assert!(out.frames.is_empty());
        assert_eq!(out.stats.dropped_oversize, 1);
    }
}
