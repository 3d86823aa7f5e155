//! Gathered payloads, exact-segment: with [`Connection::poll_transmit_gather`] and
//! checksum offload, the bytes of a payload that lie in buffers the application handed
//! over to share (`send_bytes`, pieces of at least
//! [`SHARE_MIN`](netdriver::tcp::send_queue::SHARE_MIN)) leave as slices of those buffers,
//! each at its place in the payload, instead of being copied into it; copied bytes are
//! copied around them; sequence numbers, lengths and flags are those a copy would have
//! had; a retransmission gathers the same bytes again. Without checksum offload nothing
//! is gathered (the payload is summed in the pass that copies it).
//!
//! The peer's MSS is 1000 (the harness's).

mod tcp_support_b;

use bytes::Bytes;
use netdriver::tcp::send_queue::SHARE_MIN;
use netdriver::tcp::{Config, Connection, Transmit};
use netdriver::wire::tcp::TcpFlags;
use tcp_support_b::*;

fn gather_config() -> Config {
    Config {
        max_super_segment: 65_000,
        tx_buffer: 256 * 1024,
        checksum_offload: true,
        ..test_config()
    }
}

const BIG: usize = 70_000;

/// One gathered transmit: the segment, its payload made whole (the spans in their holes)
/// and the spans.
type Gathered = (Transmit, Vec<u8>, Vec<(usize, Bytes)>);

fn poll_gather(t: &mut Tcb, buf_len: usize) -> Option<Gathered> {
    gather_from(&mut t.conn, t.now, buf_len)
}

fn gather_from(
    conn: &mut Connection,
    now: netdriver::time::Instant,
    buf_len: usize,
) -> Option<Gathered> {
    // Holes keep whatever was there: a pattern no payload byte here equals all along.
    let mut buf = vec![0xeeu8; buf_len];
    let mut spans = Vec::new();
    let tx = conn.poll_transmit_gather(now, &mut buf, &mut spans)?;
    assert_eq!(tx.payload_gathered, !spans.is_empty());
    let mut end = 0;
    for (at, b) in &spans {
        assert!(*at >= end, "spans in order, apart");
        assert!(at + b.len() <= tx.payload_len, "spans inside the payload");
        assert!(buf[*at..at + b.len()].iter().all(|&x| x == 0xee), "a hole");
        buf[*at..at + b.len()].copy_from_slice(b);
        end = at + b.len();
    }
    Some((tx, buf[..tx.payload_len].to_vec(), spans))
}

#[test]
fn a_shared_buffer_leaves_as_slices_of_itself() {
    let mut t = Tcb::established(gather_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = Bytes::from(data(SHARE_MIN + 4000));
    assert_eq!(t.conn.send_bytes(&d), Ok(d.len()));
    // IW: ten 1000-byte pieces, as one super-segment, not copied.
    let (tx, payload, spans) = poll_gather(&mut t, BIG).expect("a segment");
    assert!(tx.payload_gathered);
    assert_eq!(
        (tx.repr.seq, tx.payload_len, tx.segment_size),
        (l(0), 10_000, 1000)
    );
    assert_eq!(&payload[..], &d[..10_000]);
    assert_eq!(spans.len(), 1);
    assert_eq!((spans[0].0, spans[0].1.len()), (0, 10_000));
    assert_eq!(
        spans[0].1.as_ptr(),
        d.as_ptr(),
        "the application's own memory"
    );
    assert!(poll_gather(&mut t, BIG).is_none());
    assert_eq!(t.stats().bytes_in_flight, 10_000);
}

#[test]
fn copied_bytes_are_copied_around_the_shared_ones() {
    let mut t = Tcb::established(gather_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let head = data(500);
    let shared = Bytes::from(data(SHARE_MIN + 300));
    let after = data(700);
    t.app_send(&head);
    assert_eq!(t.conn.send_bytes(&shared), Ok(shared.len()));
    t.app_send(&after);
    let mut all = head.clone();
    all.extend_from_slice(&shared);
    all.extend_from_slice(&after);
    let (tx, payload, spans) = poll_gather(&mut t, BIG).expect("a segment");
    assert_eq!((tx.repr.seq, tx.payload_len), (l(0), 10_000));
    assert_eq!(&payload[..], &all[..10_000]);
    assert_eq!(spans.len(), 1);
    assert_eq!((spans[0].0, spans[0].1.as_ptr()), (500, shared.as_ptr()));
    // The rest: shared bytes, then the copied ones after them, in one segment.
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    let (tx, payload, spans) = poll_gather(&mut t, BIG).expect("a segment");
    assert_eq!(
        (tx.repr.seq, tx.payload_len),
        (l(10_000), all.len() - 10_000)
    );
    assert_eq!(&payload[..], &all[10_000..]);
    assert_eq!(spans.len(), 1);
    assert_eq!(
        (spans[0].0, spans[0].1.as_ptr()),
        (0, shared[9_500..].as_ptr())
    );
    assert!(tx.repr.flags.contains(TcpFlags::PSH));
    assert!(poll_gather(&mut t, BIG).is_none());
}

#[test]
fn a_loss_inside_a_gathered_super_segment_is_resent_with_the_same_bytes() {
    let mut t = Tcb::established(gather_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = Bytes::from(data(SHARE_MIN));
    assert_eq!(t.conn.send_bytes(&d), Ok(d.len()));
    let (tx, _, _) = poll_gather(&mut t, BIG).expect("a segment");
    assert_eq!(tx.payload_len, 10_000);
    t.advance(ms(10));
    // The fourth wire segment was lost: resent alone, 1000 bytes, copied (shorter than a
    // run worth gathering) from the same shared buffer.
    t.send(t.seg().ack(l(3000)).sack(&[(l(4000), l(10_000))]));
    let (tx, payload, spans) = poll_gather(&mut t, BIG).expect("the retransmission");
    assert!(spans.is_empty());
    assert_eq!((tx.repr.seq, tx.payload_len), (l(3000), 1000));
    assert_eq!(&payload[..], &d[3000..4000]);
    assert_eq!(t.stats().retransmitted_segments, 1);
    // Once everything sent is acknowledged, the rest goes as one super-segment gathered
    // from the buffer.
    t.send(t.seg().ack(l(10_000)));
    let (tx, payload, spans) = poll_gather(&mut t, BIG).expect("new data");
    assert_eq!(tx.repr.seq, l(10_000));
    assert_eq!(&payload[..], &d[10_000..10_000 + tx.payload_len]);
    assert_eq!(spans[0].1.as_ptr(), d[10_000..].as_ptr());
}

#[test]
fn the_callers_buffer_still_caps_a_gathered_payload() {
    let mut t = Tcb::established(gather_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = Bytes::from(data(SHARE_MIN));
    assert_eq!(t.conn.send_bytes(&d), Ok(d.len()));
    let (tx, payload, _) = poll_gather(&mut t, 4096).expect("a segment");
    assert!(tx.payload_gathered);
    assert_eq!((tx.repr.seq, tx.payload_len), (l(0), 4000));
    assert_eq!(&payload[..], &d[..4000]);
}

#[test]
fn a_short_end_of_a_shared_buffer_is_copied() {
    let mut t = Tcb::established(gather_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = Bytes::from(data(SHARE_MIN));
    assert_eq!(t.conn.send_bytes(&d), Ok(d.len()));
    // 1000-byte segments: each run is shorter than is worth an iovec.
    let (tx, payload, spans) = poll_gather(&mut t, 1024).expect("a segment");
    assert!(!tx.payload_gathered);
    assert!(spans.is_empty());
    assert_eq!(&payload[..], &d[..1000]);
}

#[test]
fn without_checksum_offload_nothing_is_gathered() {
    let config = Config {
        checksum_offload: false,
        ..gather_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = Bytes::from(data(SHARE_MIN));
    assert_eq!(t.conn.send_bytes(&d), Ok(d.len()));
    let (tx, payload, spans) = poll_gather(&mut t, BIG).expect("a segment");
    assert!(!tx.payload_gathered && spans.is_empty());
    assert_eq!(&payload[..], &d[..tx.payload_len]);
    assert_eq!(
        tx.payload_sum,
        netdriver::wire::checksum::data(&d[..tx.payload_len])
    );
}

#[test]
fn control_segments_are_as_without_gathering() {
    let mut t = Tcb::established(gather_config(), PeerOpts::default());
    t.send(t.seg().payload(&data(100)));
    t.tick(ms(50));
    let (tx, payload, spans) = poll_gather(&mut t, BIG).expect("an ACK");
    assert!(!tx.payload_gathered && spans.is_empty());
    assert!(payload.is_empty());
    assert_eq!(tx.repr.ack, Some(r(100)));
}
