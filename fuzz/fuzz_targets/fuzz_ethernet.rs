//! Parses arbitrary bytes as an Ethernet II frame; on success re-emits and re-parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netdriver::wire::{EthernetFrame, EthernetRepr};

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = EthernetFrame::new_checked(data) else {
        return;
    };
    let Ok(repr) = EthernetRepr::parse(&frame) else {
        return;
    };
    let mut buf = vec![0u8; repr.header_len()];
    repr.emit(&mut buf).expect("emit into a header-sized buffer");
    let again = EthernetRepr::parse(&EthernetFrame::new_checked(&buf[..]).expect("re-check"))
        .expect("re-parse");
    assert_eq!(again, repr);
    assert_eq!(&buf[..], &data[..buf.len()]);
});
