//! Parses arbitrary bytes as a NetChannel chunk and deframes them as a channel byte stream.
//! The first byte chooses the deframer's maximum payload and the split stride; the rest is
//! the stream. A chunk that parses must re-emit to the same bytes; the deframer must never
//! panic, never hold more than one chunk, and yield the same chunks whatever the splits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vns::wire::{ChunkRepr, HEADER_LEN};
use vns::Deframer;

fuzz_target!(|data: &[u8]| {
    let Some((&knob, stream)) = data.split_first() else {
        return;
    };
    if let Ok((repr, payload)) = ChunkRepr::parse(stream) {
        let mut out = Vec::new();
        repr.emit_to_vec(payload, &mut out);
        assert_eq!(&out[..], &stream[..repr.wire_len()]);
    }

    let max_payload = usize::from(knob) * 64;
    let stride = usize::from(knob % 17) + 1;
    let run = |split: usize| {
        let mut d = Deframer::new(max_payload);
        let mut chunks = Vec::new();
        let mut err = None;
        'outer: for piece in stream.chunks(split) {
            let mut rest = piece;
            while !rest.is_empty() {
                match d.feed(rest) {
                    Ok((used, chunk)) => {
                        chunks.extend(chunk);
                        rest = &rest[used..];
                    }
                    Err(e) => {
                        err = Some(e);
                        break 'outer;
                    }
                }
                assert!(d.buffered() <= HEADER_LEN + max_payload);
            }
        }
        (chunks, err)
    };
    assert_eq!(run(stride), run(stream.len().max(1)));
});
