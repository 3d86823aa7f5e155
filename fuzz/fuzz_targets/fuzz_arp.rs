//! Parses arbitrary bytes as an ARP packet; on success re-emits and re-parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netdriver::wire::{ArpPacket, ArpRepr};

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = ArpPacket::new_checked(data) else {
        return;
    };
    let _ = (packet.source_hardware_addr(), packet.target_protocol_addr());
    let Ok(repr) = ArpRepr::parse(&packet) else {
        return;
    };
    let mut buf = vec![0u8; repr.packet_len()];
    repr.emit(&mut buf).expect("emit into a packet-sized buffer");
    let again =
        ArpRepr::parse(&ArpPacket::new_checked(&buf[..]).expect("re-check")).expect("re-parse");
    assert_eq!(again, repr);
    assert_eq!(&buf[..], &data[..buf.len()]);
});
