//! The acceptor's hello decoder against hostile input: any bytes, and valid hellos with
//! bytes changed, cut or added, are read without a panic, and what is accepted stays
//! within the documented bounds and encodes back to the same bytes. Any description the
//! encoder takes round-trips.

use netdriver::rss::{HashFields, InputTransform, RssConfig};
use proptest::prelude::*;
use vns::hello::{
    encode, frame_len, parse, HelloError, RssDescription, HEADER_LEN, MAX_BODY, MAX_KEY,
    MAX_QUEUES, MAX_TABLE,
};

/// Reads `buf` as an opener does: the frame's length from its header, then the frame.
fn read(buf: &[u8]) -> Option<Result<Option<RssDescription>, HelloError>> {
    match frame_len(buf) {
        Ok(Some(n)) => {
            assert!((HEADER_LEN..=HEADER_LEN + MAX_BODY).contains(&n));
            buf.get(..n).map(parse)
        }
        Ok(None) => {
            assert!(buf.len() < HEADER_LEN);
            None
        }
        Err(e) => {
            assert!(matches!(e, HelloError::BadMagic | HelloError::Oversized(_)));
            None
        }
    }
}

/// What an accepted description must satisfy.
fn within_bounds(d: &RssDescription) {
    assert!(d.rss.key.len() <= MAX_KEY);
    assert!(!d.rss.indirection.is_empty() && d.rss.indirection.len() <= MAX_TABLE);
    assert!(d.latency.len() <= MAX_QUEUES && d.throughput.len() <= MAX_QUEUES);
    assert!(d.rss.check().is_ok());
}

fn description() -> impl Strategy<Value = RssDescription> {
    (
        prop::collection::vec(any::<u8>(), 16..=MAX_KEY),
        prop::collection::vec(0u32..64, 1..=512),
        prop::sample::subsequence((0u32..64).collect::<Vec<_>>(), 0..8),
        0usize..8,
        prop_oneof![
            Just(InputTransform::None),
            Just(InputTransform::SymmetricXor),
            Just(InputTransform::SymmetricOrXor)
        ],
        prop_oneof![
            Just(HashFields::FOUR_TUPLE),
            Just(HashFields(HashFields::IP_SRC | HashFields::IP_DST))
        ],
    )
        .prop_map(|(key, table, queues, split, input, fields)| {
            let split = split.min(queues.len());
            let mut rss = RssConfig::toeplitz(&key, &table).unwrap();
            rss.input = input;
            rss.fields = fields;
            RssDescription {
                rss,
                latency: queues[..split].to_vec(),
                throughput: queues[split..].to_vec(),
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_bytes_are_read_without_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Some(Ok(Some(d))) = read(&bytes) {
            within_bounds(&d);
        }
        // Also behind a valid magic and version, where the fields get read.
        let mut framed = b"NCRS\x01\x01".to_vec();
        framed.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
        framed.extend_from_slice(&bytes);
        if let Some(Ok(Some(d))) = read(&framed) {
            within_bounds(&d);
            // The encoding is the same but for the reserved byte, which is read as
            // anything and written as 0.
            framed[HEADER_LEN + 5] = 0;
            prop_assert_eq!(encode(Some(&d)).unwrap(), framed);
        }
    }

    #[test]
    fn descriptions_round_trip(d in description()) {
        let b = encode(Some(&d)).unwrap();
        prop_assert_eq!(frame_len(&b).unwrap(), Some(b.len()));
        prop_assert_eq!(parse(&b).unwrap(), Some(d));
    }

    #[test]
    fn changed_hellos_are_read_without_a_panic(
        d in description(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        extra in prop::collection::vec(any::<u8>(), 0..4),
    ) {
        let mut b = encode(Some(&d)).unwrap();
        for (at, v) in &edits {
            let i = at.index(b.len());
            b[i] = *v;
        }
        if let Some(Ok(Some(d))) = read(&b) {
            within_bounds(&d);
        }
        if let Some(Ok(Some(d))) = read(&b[..cut.index(b.len())]) {
            within_bounds(&d);
        }
        // The unchanged hello cut short or with bytes past its declared end is refused.
        let whole = encode(Some(&d)).unwrap();
        let short = &whole[..cut.index(whole.len())];
        prop_assert!(matches!(read(short), None | Some(Err(_))));
        prop_assert!(parse(short).is_err());
        if !extra.is_empty() {
            let mut long = whole.clone();
            long.extend_from_slice(&extra);
            prop_assert!(parse(&long).is_err());
        }
    }
}
