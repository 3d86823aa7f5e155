//! Parses arbitrary bytes as an IPv4 packet (checksum not required to verify, so the
//! fuzzer reaches the field checks); on success re-emits and re-parses with verification.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netdriver::wire::{Ipv4Packet, Ipv4Repr};

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = Ipv4Packet::new_checked(data) else {
        return;
    };
    let _ = (packet.options(), packet.payload(), packet.verify_checksum());
    let Ok(repr) = Ipv4Repr::parse(&packet, false) else {
        return;
    };
    let mut buf = vec![0u8; repr.total_len()];
    buf[repr.header_len()..].copy_from_slice(packet.payload());
    repr.emit(&mut buf, packet.ident()).expect("emit into a datagram-sized buffer");
    let again = Ipv4Packet::new_checked(&buf[..]).expect("re-check");
    assert_eq!(Ipv4Repr::parse(&again, true).expect("re-parse"), repr);
    assert_eq!(again.payload(), packet.payload());
});
