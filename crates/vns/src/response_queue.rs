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
