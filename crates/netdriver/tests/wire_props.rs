//! Property tests for `netdriver::wire`: emit→parse round trips for every representation,
//! no panic on arbitrary bytes in any parser, and fast checksum == reference checksum.

use std::net::Ipv4Addr;

use netdriver::tcp::seq::SeqNumber;
use netdriver::wire::{
    checksum, frame, ArpOperation, ArpPacket, ArpRepr, EtherType, EthernetAddress, EthernetFrame,
    EthernetRepr, IpProtocol, Ipv4Packet, Ipv4Repr, SackBlock, TcpFlags, TcpOptions, TcpPacket,
    TcpRepr,
};
use proptest::prelude::*;

fn mac() -> impl Strategy<Value = EthernetAddress> {
    any::<[u8; 6]>().prop_map(EthernetAddress)
}

fn ip() -> impl Strategy<Value = Ipv4Addr> {
    any::<[u8; 4]>().prop_map(Ipv4Addr::from)
}

/// Sequence numbers, half of them within 2^16 of the wrap point.
fn seq() -> impl Strategy<Value = SeqNumber> {
    prop_oneof![
        any::<u32>(),
        (u32::MAX - 0xffff..=u32::MAX),
        (0u32..=0xffff)
    ]
    .prop_map(SeqNumber)
}

fn ethernet_repr() -> impl Strategy<Value = EthernetRepr> {
    (mac(), mac(), any::<u16>()).prop_map(|(src, dst, t)| EthernetRepr {
        src,
        dst,
        ethertype: EtherType::from(t),
    })
}

fn arp_repr() -> impl Strategy<Value = ArpRepr> {
    (any::<bool>(), mac(), ip(), mac(), ip()).prop_map(|(req, sh, si, th, ti)| ArpRepr {
        operation: if req {
            ArpOperation::Request
        } else {
            ArpOperation::Reply
        },
        source_hw: sh,
        source_ip: si,
        target_hw: th,
        target_ip: ti,
    })
}

fn ipv4_repr() -> impl Strategy<Value = Ipv4Repr> {
    (
        ip(),
        ip(),
        any::<u8>(),
        prop_oneof![0usize..2000, 0usize..=65515],
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(|(src, dst, p, payload_len, ttl, dscp_ecn)| Ipv4Repr {
            src,
            dst,
            protocol: IpProtocol::from(p),
            payload_len,
            ttl,
            dscp_ecn,
        })
}

fn sack_block() -> impl Strategy<Value = SackBlock> {
    (seq(), seq()).prop_map(|(left, right)| SackBlock { left, right })
}

fn tcp_options() -> impl Strategy<Value = TcpOptions> {
    (
        proptest::option::of(any::<u16>()),
        proptest::option::of(any::<u8>()),
        any::<bool>(),
        proptest::collection::vec(sack_block(), 0..=4),
        proptest::option::of(any::<(u32, u32)>()),
    )
        .prop_map(|(mss, window_scale, sack_permitted, blocks, timestamp)| {
            let mut sack_blocks = [None; 4];
            for (slot, b) in sack_blocks.iter_mut().zip(blocks) {
                *slot = Some(b);
            }
            TcpOptions {
                mss,
                window_scale,
                sack_permitted,
                sack_blocks,
                timestamp,
            }
        })
}

fn tcp_repr() -> impl Strategy<Value = TcpRepr> {
    (
        any::<u16>(),
        any::<u16>(),
        seq(),
        proptest::option::of(seq()),
        any::<u8>(),
        any::<u16>(),
        any::<u16>(),
        tcp_options(),
    )
        .prop_map(
            |(src_port, dst_port, seq, ack, flags, window, urgent, options)| TcpRepr {
                src_port,
                dst_port,
                seq,
                ack,
                flags: TcpFlags(flags),
                window,
                urgent,
                options,
            },
        )
}

/// What parsing an emitted `repr` gives back: ACK follows `ack`, and SACK blocks that did
/// not fit are dropped.
fn expected_after_round_trip(repr: &TcpRepr) -> TcpRepr {
    let mut e = *repr;
    e.flags = repr.wire_flags();
    let n = repr.options.sack_blocks_to_emit();
    for slot in e.options.sack_blocks.iter_mut().skip(n) {
        *slot = None;
    }
    e
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn checksum_fast_equals_reference(
        data in proptest::collection::vec(any::<u8>(), 0..4096),
        offset in 0usize..16,
    ) {
        let s = data.get(offset..).unwrap_or(&[]);
        prop_assert_eq!(checksum::data(s), checksum::data_reference(s));
    }

    #[test]
    fn checksum_fast_equals_reference_large(
        seed in any::<u64>(),
        len in 0usize..70_000,
        offset in 0usize..8,
    ) {
        let mut x = seed | 1;
        let data: Vec<u8> = (0..len + offset).map(|_| {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8
        }).collect();
        prop_assert_eq!(checksum::data(&data[offset..]), checksum::data_reference(&data[offset..]));
    }

    #[test]
    fn ethernet_round_trip(repr in ethernet_repr(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut buf = vec![0u8; 14 + payload.len()];
        buf[14..].copy_from_slice(&payload);
        repr.emit(&mut buf).unwrap();
        let f = EthernetFrame::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(EthernetRepr::parse(&f).unwrap(), repr);
        prop_assert_eq!(f.payload(), &payload[..]);
    }

    #[test]
    fn arp_round_trip(repr in arp_repr()) {
        let mut buf = [0u8; 28];
        repr.emit(&mut buf).unwrap();
        let p = ArpPacket::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(ArpRepr::parse(&p).unwrap(), repr);
    }

    #[test]
    fn ipv4_round_trip(repr in ipv4_repr(), ident in any::<u16>(), pad in 0usize..8) {
        let mut buf = vec![0u8; repr.total_len() + pad];
        repr.emit(&mut buf, ident).unwrap();
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        prop_assert!(p.verify_checksum());
        prop_assert!(p.dont_frag());
        prop_assert_eq!(p.ident(), ident);
        prop_assert_eq!(Ipv4Repr::parse(&p, true).unwrap(), repr);
        prop_assert_eq!(p.payload().len(), repr.payload_len);
    }

    #[test]
    fn tcp_round_trip(
        repr in tcp_repr(),
        payload in proptest::collection::vec(any::<u8>(), 0..600),
        src in ip(),
        dst in ip(),
        slack in 0usize..4,
    ) {
        let hl = repr.header_len();
        prop_assert!(hl <= 60 && hl % 4 == 0);
        let mut buf = vec![0xa5u8; hl + payload.len() + slack];
        buf[hl..hl + payload.len()].copy_from_slice(&payload);
        let n = repr.emit(&mut buf, payload.len(), src, dst).unwrap();
        prop_assert_eq!(n, hl + payload.len());
        let p = TcpPacket::new_checked(&buf[..n]).unwrap();
        prop_assert!(p.verify_checksum(src, dst));
        let (parsed, data) = TcpRepr::parse(&p, src, dst, true).unwrap();
        prop_assert_eq!(parsed, expected_after_round_trip(&repr));
        prop_assert_eq!(data, &payload[..]);
        // Re-emitting the parsed header gives the same bytes.
        let mut again = buf.clone();
        parsed.emit(&mut again, payload.len(), src, dst).unwrap();
        prop_assert_eq!(&again[..n], &buf[..n]);
    }

    #[test]
    fn tcp_frame_round_trip(
        eth in ethernet_repr(),
        ip in ipv4_repr(),
        tcp in tcp_repr(),
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        ident in any::<u16>(),
    ) {
        let mut buf = vec![0u8; 14 + 20 + 60 + payload.len()];
        let at = frame::tcp_payload_offset(&tcp);
        buf[at..at + payload.len()].copy_from_slice(&payload);
        let n = frame::emit_tcp_frame(&mut buf, &eth, &ip, ident, &tcp, payload.len()).unwrap();
        let f = frame::parse_tcp_frame(&buf[..n], true).unwrap();
        prop_assert_eq!(f.eth, EthernetRepr { ethertype: EtherType::Ipv4, ..eth });
        prop_assert_eq!(f.ip, Ipv4Repr {
            protocol: IpProtocol::Tcp,
            payload_len: tcp.header_len() + payload.len(),
            ..ip
        });
        prop_assert_eq!(f.tcp, expected_after_round_trip(&tcp));
        prop_assert_eq!(f.payload, &payload[..]);
    }

    #[test]
    fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..160), src in ip(), dst in ip()) {
        if let Ok(f) = EthernetFrame::new_checked(&bytes[..]) {
            let _ = EthernetRepr::parse(&f);
            let _ = f.payload();
        }
        if let Ok(p) = ArpPacket::new_checked(&bytes[..]) {
            let _ = ArpRepr::parse(&p);
            let _ = (p.source_hardware_addr(), p.target_protocol_addr());
        }
        if let Ok(p) = Ipv4Packet::new_checked(&bytes[..]) {
            let _ = Ipv4Repr::parse(&p, true);
            let _ = Ipv4Repr::parse(&p, false);
            let _ = (p.options(), p.payload(), p.verify_checksum());
        }
        if let Ok(p) = TcpPacket::new_checked(&bytes[..]) {
            let _ = TcpRepr::parse(&p, src, dst, true);
            let _ = TcpRepr::parse(&p, src, dst, false);
            let _ = (p.options(), p.payload());
        }
        let _ = TcpOptions::parse(&bytes);
        let _ = frame::parse_tcp_frame(&bytes, false);
        let _ = frame::parse_tcp_frame(&bytes, true);
    }

    #[test]
    fn tcp_option_bytes_never_panic(
        repr in tcp_repr(),
        options in proptest::collection::vec(
            prop_oneof![0u8..=10, any::<u8>()], 0..=40),
    ) {
        // A well-formed fixed header with arbitrary (biased to known kinds) option bytes.
        let words = options.len().div_ceil(4);
        let mut buf = vec![0u8; 20 + words * 4];
        let mut r = repr;
        r.options = TcpOptions::default();
        r.emit(&mut buf, 0, Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST).unwrap();
        buf[12] = ((5 + words) as u8) << 4;
        buf[20..20 + options.len()].copy_from_slice(&options);
        let p = TcpPacket::new_checked(&buf[..]).unwrap();
        if let Ok((parsed, _)) = TcpRepr::parse(&p, Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, false) {
            // Whatever parsed can be emitted and parses to itself (modulo SACK trimming).
            let mut out = vec![0u8; 60];
            let n = parsed.emit(&mut out, 0, Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST).unwrap();
            let (again, _) = TcpRepr::parse_segment(&out[..n], Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, true).unwrap();
            prop_assert_eq!(again, expected_after_round_trip(&parsed));
        }
    }

    #[test]
    fn truncated_prefixes_of_valid_segments_never_panic(
        repr in tcp_repr(),
        payload in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let hl = repr.header_len();
        let mut buf = vec![0u8; hl + payload.len()];
        buf[hl..].copy_from_slice(&payload);
        repr.emit(&mut buf, payload.len(), Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST).unwrap();
        for len in 0..hl {
            prop_assert!(TcpRepr::parse_segment(&buf[..len], Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, false).is_err());
        }
    }
}
