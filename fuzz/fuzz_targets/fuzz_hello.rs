//! Reads arbitrary bytes as the acceptor's hello, as an opener does (`vns::hello`): the
//! frame's length from its header, then the frame. Nothing may panic; a hello that is
//! accepted stays within the documented bounds, describes a reproducible RSS and encodes
//! back to the same bytes (the reserved byte written as 0).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vns::hello::{encode, frame_len, parse, HEADER_LEN, MAX_BODY, MAX_KEY, MAX_QUEUES, MAX_TABLE};

fuzz_target!(|data: &[u8]| {
    let Ok(Some(n)) = frame_len(data) else {
        return;
    };
    assert!(n <= HEADER_LEN + MAX_BODY);
    let Some(frame) = data.get(..n) else {
        return;
    };
    if let Ok(Some(d)) = parse(frame) {
        assert!(d.rss.key.len() <= MAX_KEY);
        assert!(!d.rss.indirection.is_empty() && d.rss.indirection.len() <= MAX_TABLE);
        assert!(d.latency.len() <= MAX_QUEUES && d.throughput.len() <= MAX_QUEUES);
        assert!(d.rss.check().is_ok());
        let mut expected = frame.to_vec();
        expected[HEADER_LEN + 5] = 0;
        assert_eq!(encode(Some(&d)).unwrap(), expected);
    }
});
