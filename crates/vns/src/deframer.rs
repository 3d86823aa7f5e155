//! Cutting chunks out of a channel's byte stream.
//!
//! A channel is a byte stream: a receiver is handed its bytes split at arbitrary points.
//! [`Deframer`] accumulates at most one chunk (header plus at most the configured maximum
//! payload), validates the header as soon as its 16 bytes are in, and yields whole chunks.
//! A bad header poisons the deframer: the stream has lost framing and cannot be resynced,
//! so every later call returns the same error.

use crate::wire::{ChunkPacket, ChunkRepr, WireError, HEADER_LEN, MAX_PAYLOAD};

/// A complete chunk cut from a byte stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The validated header.
    pub header: ChunkRepr,
    /// The payload (`header.payload_len` bytes).
    pub payload: Vec<u8>,
}

/// Reassembles chunks from arbitrarily split bytes of one channel, with bounded memory.
#[derive(Debug)]
pub struct Deframer {
    max_payload: usize,
    header: [u8; HEADER_LEN],
    header_filled: usize,
    current: Option<(ChunkRepr, Vec<u8>)>,
    poisoned: Option<WireError>,
}

impl Deframer {
    /// A deframer that rejects chunks with more than `max_payload` bytes of payload
    /// (capped at [`MAX_PAYLOAD`]). It never holds more than `16 + max_payload` bytes.
    pub fn new(max_payload: usize) -> Self {
        Deframer {
            max_payload: max_payload.min(MAX_PAYLOAD),
            header: [0; HEADER_LEN],
            header_filled: 0,
            current: None,
            poisoned: None,
        }
    }

    /// The largest payload accepted.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// The error that poisoned this deframer, if any.
    pub fn poisoned(&self) -> Option<WireError> {
        self.poisoned
    }

    /// Bytes of an incomplete chunk held now.
    pub fn buffered(&self) -> usize {
        self.header_filled + self.current.as_ref().map_or(0, |(_, p)| p.len())
    }

    /// Consumes bytes from `input` up to the end of the next chunk. Returns how many bytes
    /// were consumed and the chunk if one was completed; call again with the rest of the
    /// input. Consumes all of `input` when no chunk completes.
    pub fn feed(&mut self, input: &[u8]) -> Result<(usize, Option<Chunk>), WireError> {
        self.feed_pooled(input, &mut Vec::new())
    }

    /// [`feed`](Self::feed), taking the buffer of a payload longer than half the maximum
    /// from `spare` (buffers of at least the maximum payload's capacity, see
    /// [`Deframer::max_payload`]) when it has one, or allocating it with that capacity so
    /// that it can be recycled there after use: large chunks reuse warm memory instead of
    /// a fresh allocation each.
    pub fn feed_pooled(
        &mut self,
        input: &[u8],
        spare: &mut Vec<Vec<u8>>,
    ) -> Result<(usize, Option<Chunk>), WireError> {
        if let Some(e) = self.poisoned {
            return Err(e);
        }
        let mut used = 0;
        if self.current.is_none() {
            let take = (HEADER_LEN - self.header_filled).min(input.len());
            self.header[self.header_filled..self.header_filled + take]
                .copy_from_slice(&input[..take]);
            self.header_filled += take;
            used += take;
            if self.header_filled < HEADER_LEN {
                return Ok((used, None));
            }
            let repr = match ChunkRepr::parse_header(&ChunkPacket::new_unchecked(&self.header[..]))
            {
                Ok(r) => r,
                Err(e) => return Err(self.poison(e)),
            };
            let len = usize::from(repr.payload_len);
            if len > self.max_payload {
                return Err(self.poison(WireError::BadPayloadLength { ty: repr.ty, len }));
            }
            self.header_filled = 0;
            let buf = if len > self.max_payload / 2 {
                spare
                    .pop()
                    .filter(|b| b.capacity() >= self.max_payload)
                    .map(|mut b| {
                        b.clear();
                        b
                    })
                    .unwrap_or_else(|| Vec::with_capacity(self.max_payload))
            } else {
                Vec::with_capacity(len)
            };
            self.current = Some((repr, buf));
        }
        let (repr, payload) = self.current.as_mut().expect("set above");
        let want = usize::from(repr.payload_len) - payload.len();
        let take = want.min(input.len() - used);
        payload.extend_from_slice(&input[used..used + take]);
        used += take;
        if payload.len() == usize::from(repr.payload_len) {
            let (header, payload) = self.current.take().expect("set above");
            return Ok((used, Some(Chunk { header, payload })));
        }
        Ok((used, None))
    }

    fn poison(&mut self, e: WireError) -> WireError {
        // The caller drops the channel and says so (rate-limited: a peer can send
        // garbage on many channels).
        tracing::debug!(error = %e, "bad chunk header; channel stream poisoned");
        self.poisoned = Some(e);
        self.current = None;
        self.header_filled = 0;
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ChunkType, Seq};
    use proptest::prelude::*;

    fn chunk(i: u32, len: usize) -> (ChunkRepr, Vec<u8>) {
        let ty = if len == 0 {
            ChunkType::Ack
        } else {
            ChunkType::Data
        };
        let repr = ChunkRepr {
            src_port: i as u16,
            dst_port: 9,
            seq: Seq(i.wrapping_mul(977)),
            credit: i,
            ty,
            payload_len: len as u16,
        };
        (repr, (0..len).map(|b| (b as u32 ^ i) as u8).collect())
    }

    fn deframe_all(
        d: &mut Deframer,
        mut input: &[u8],
        out: &mut Vec<Chunk>,
    ) -> Result<(), WireError> {
        while !input.is_empty() {
            let (used, c) = d.feed(input)?;
            assert!(used > 0 || c.is_some());
            out.extend(c);
            input = &input[used..];
        }
        Ok(())
    }

    #[test]
    fn large_payloads_reuse_spare_buffers() {
        let mut d = Deframer::new(100);
        let mut wire = Vec::new();
        for (i, len) in [(1, 80), (2, 10), (3, 100)] {
            let (repr, payload) = chunk(i, len);
            repr.emit_to_vec(&payload, &mut wire);
        }
        let recycled = Vec::with_capacity(100);
        let ptr = recycled.as_ptr();
        let mut spare = vec![recycled];
        let mut got = Vec::new();
        let mut input = &wire[..];
        while !input.is_empty() {
            let (used, c) = d.feed_pooled(input, &mut spare).unwrap();
            got.extend(c);
            input = &input[used..];
        }
        // The first large payload took the spare buffer; the small one got its own, and
        // the second large one a fresh buffer of the maximum capacity (recyclable).
        assert!(spare.is_empty());
        assert_eq!(got[0].payload.as_ptr(), ptr);
        assert_eq!(got[0].payload, chunk(1, 80).1);
        assert_eq!(got[1].payload, chunk(2, 10).1);
        assert_eq!(got[2].payload, chunk(3, 100).1);
        assert!(got[2].payload.capacity() >= 100);
    }

    proptest! {
        #[test]
        fn any_split_points_yield_the_same_chunks(
            lens in proptest::collection::vec(0usize..300, 1..20),
            cuts in proptest::collection::vec(1usize..64, 1..200),
        ) {
            let chunks: Vec<_> = lens.iter().enumerate().map(|(i, &l)| chunk(i as u32, l)).collect();
            let mut stream = Vec::new();
            for (r, p) in &chunks {
                r.emit_to_vec(p, &mut stream);
            }
            let mut d = Deframer::new(300);
            let mut got = Vec::new();
            let mut rest = &stream[..];
            let mut i = 0;
            while !rest.is_empty() {
                let n = cuts[i % cuts.len()].min(rest.len());
                i += 1;
                deframe_all(&mut d, &rest[..n], &mut got).unwrap();
                prop_assert!(d.buffered() <= HEADER_LEN + 300);
                rest = &rest[n..];
            }
            prop_assert_eq!(d.buffered(), 0);
            let want: Vec<_> = chunks.into_iter().map(|(header, payload)| Chunk { header, payload }).collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut d = Deframer::new(64);
            let mut out = Vec::new();
            let _ = deframe_all(&mut d, &bytes, &mut out);
        }
    }

    #[test]
    fn bad_header_poisons_for_good() {
        let (r, p) = chunk(1, 4);
        let mut good = Vec::new();
        r.emit_to_vec(&p, &mut good);
        let mut bad = good.clone();
        bad[13] = 99;
        let mut d = Deframer::new(100);
        let mut out = Vec::new();
        deframe_all(&mut d, &good, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(
            deframe_all(&mut d, &bad, &mut out),
            Err(WireError::BadType(99))
        );
        assert_eq!(d.poisoned(), Some(WireError::BadType(99)));
        assert_eq!(d.feed(&good), Err(WireError::BadType(99)));
    }

    #[test]
    fn oversized_payload_is_rejected_before_buffering() {
        let (r, p) = chunk(1, 101);
        let mut bytes = Vec::new();
        r.emit_to_vec(&p, &mut bytes);
        let mut d = Deframer::new(100);
        assert_eq!(
            d.feed(&bytes),
            Err(WireError::BadPayloadLength {
                ty: ChunkType::Data,
                len: 101
            })
        );
        assert_eq!(d.buffered(), 0);
    }
}
