//! Parses arbitrary bytes as a TCP segment: the first 8 bytes are the IPv4 source and
//! destination for the pseudo-header, the rest is the segment. The checksum need not
//! verify on the way in; on success the header is re-emitted in front of the same payload
//! and re-parsed with checksum verification.
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use netdriver::wire::{TcpOptions, TcpPacket, TcpRepr};

fuzz_target!(|data: &[u8]| {
    let Some((addrs, segment)) = data.split_first_chunk::<8>() else {
        return;
    };
    let src = Ipv4Addr::new(addrs[0], addrs[1], addrs[2], addrs[3]);
    let dst = Ipv4Addr::new(addrs[4], addrs[5], addrs[6], addrs[7]);
    // The option parser alone, on the raw bytes.
    let _ = TcpOptions::parse(segment);
    let Ok(packet) = TcpPacket::new_checked(segment) else {
        return;
    };
    let Ok((repr, payload)) = TcpRepr::parse(&packet, src, dst, false) else {
        return;
    };

    let hl = repr.header_len();
    let mut buf = vec![0u8; hl + payload.len()];
    buf[hl..].copy_from_slice(payload);
    let n = match repr.emit(&mut buf, payload.len(), src, dst) {
        Ok(n) => n,
        // Only a segment too long for an IPv4 datagram may be refused.
        Err(_) => {
            assert!(hl + payload.len() > 65535 - 20);
            return;
        }
    };
    assert_eq!(n, buf.len());
    let (again, again_payload) =
        TcpRepr::parse_segment(&buf, src, dst, true).expect("re-parse of emitted segment");

    // Emission sets ACK from `ack` and may drop SACK blocks that do not fit.
    let mut expected = repr;
    expected.flags = repr.wire_flags();
    let keep = repr.options.sack_blocks_to_emit();
    for slot in expected.options.sack_blocks.iter_mut().skip(keep) {
        *slot = None;
    }
    assert_eq!(again, expected);
    assert_eq!(again_payload, payload);
});
