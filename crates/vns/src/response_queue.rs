//! The per-socket response queue (the paper's head-of-line protection).

use std::collections::VecDeque;

use netsched::ChannelId;

use crate::wire::Seq;

/// A data chunk parked because its socket's receive window could not take it yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedChunk {
    /// Sequence number of the first payload byte.
    pub seq: Seq,
    /// The payload.
    pub payload: Vec<u8>,
    /// The channel it arrived on, whose buffer budget it is charged to.
    pub channel: ChannelId,
}

/// Chunks taken off a shared channel for one socket whose application is not reading.
///
/// Parking lets the channel keep delivering other sockets' chunks. The bytes are charged
/// to the arrival channel's buffer budget by the endpoint; this queue only remembers which
/// channel each chunk is charged to.
#[derive(Debug, Default)]
pub struct ResponseQueue {
    chunks: VecDeque<ParkedChunk>,
    bytes: usize,
}

impl ResponseQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Payload bytes parked.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether nothing is parked.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Whether `len` bytes at `seq` overlap a parked chunk (sequence numbers compared
    /// with wrap-around, as they lie within one credit window of each other).
    pub fn overlaps(&self, seq: Seq, len: usize) -> bool {
        len > 0
            && self.chunks.iter().any(|c| {
                !c.payload.is_empty()
                    && seq.since(c.seq) < c.payload.len() as i64
                    && c.seq.since(seq) < len as i64
            })
    }

    /// Whether a chunk of exactly `len` bytes at `seq` is parked (the same chunk arriving
    /// again).
    pub fn contains(&self, seq: Seq, len: usize) -> bool {
        self.chunks
            .iter()
            .any(|c| c.seq == seq && c.payload.len() == len)
    }

    /// The parked chunks' sequence numbers and lengths, in arrival order.
    pub fn spans(&self) -> impl Iterator<Item = (Seq, usize)> + '_ {
        self.chunks.iter().map(|c| (c.seq, c.payload.len()))
    }

    /// Payload bytes parked that are charged to channel `ch`.
    pub fn charged_to(&self, ch: ChannelId) -> usize {
        self.chunks
            .iter()
            .filter(|c| c.channel == ch)
            .map(|c| c.payload.len())
            .sum()
    }

    /// Parks a chunk.
    pub fn park(&mut self, chunk: ParkedChunk) {
        self.bytes += chunk.payload.len();
        self.chunks.push_back(chunk);
    }

    /// Removes and returns, in arrival order, every chunk `take` selects.
    pub fn take_where(&mut self, mut take: impl FnMut(&ParkedChunk) -> bool) -> Vec<ParkedChunk> {
        let mut out = Vec::new();
        let mut keep = VecDeque::with_capacity(self.chunks.len());
        for c in self.chunks.drain(..) {
            if take(&c) {
                self.bytes -= c.payload.len();
                out.push(c);
            } else {
                keep.push_back(c);
            }
        }
        self.chunks = keep;
        out
    }

    /// Removes and returns everything.
    pub fn take_all(&mut self) -> Vec<ParkedChunk> {
        self.bytes = 0;
        self.chunks.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(seq: u32, len: usize) -> ParkedChunk {
        ParkedChunk {
            seq: Seq(seq),
            payload: vec![7; len],
            channel: ChannelId(0),
        }
    }

    #[test]
    fn overlaps_compares_ranges_across_wrap_around() {
        let mut q = ResponseQueue::new();
        q.park(chunk(u32::MAX - 4, 10)); // [MAX-4, 5) across the wrap
        assert!(q.overlaps(Seq(0), 1));
        assert!(q.overlaps(Seq(u32::MAX - 10), 7));
        assert!(!q.overlaps(Seq(u32::MAX - 10), 6));
        assert!(!q.overlaps(Seq(5), 100));
        assert!(!q.overlaps(Seq(0), 0), "an empty range overlaps nothing");
        assert_eq!(q.bytes(), 10);
    }
}
