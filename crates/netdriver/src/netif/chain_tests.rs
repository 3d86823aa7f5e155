//! Tests of frames received as chains of buffers ([`Interface::receive_parts_meta`]): a
//! segment cut anywhere after its headers leaves exactly the receive state the same
//! segment in one slice leaves (in order, out of order, corrupt), and one cut inside its
//! headers is refused and counted.

use std::net::SocketAddrV4;

use super::tests::{hosts, run_until, IP_B};
use super::{ConnHandle, Interface, StrayVerdict};
use crate::link::sim::SimLink;
use crate::link::{Link, RxMeta};
use crate::time::{Duration, Instant};

/// Headers of the data segments here: Ethernet, IPv4, TCP with timestamps.
const HEADERS: usize = 14 + 20 + 32;

struct Bed {
    a: Interface<SimLink>,
    b: Interface<SimLink>,
    cb: ConnHandle,
    now: Instant,
    /// A's data frames, taken off the wire before B saw them.
    frames: Vec<Vec<u8>>,
}

/// A connection from A to B's port 80 with A's first 3000 bytes in flight; the same
/// every time (fixed ISN key, virtual time).
fn bed() -> Bed {
    let (mut a, mut b) = hosts();
    let mut now = Instant::ZERO;
    b.listen(80, 4).unwrap();
    let ca = a.connect(SocketAddrV4::new(IP_B, 80), now).unwrap();
    let mut cb = None;
    run_until(&mut a, &mut b, &mut now, |_, b| {
        cb = cb.or_else(|| b.accept(80));
        cb.is_some()
    });
    run_until(&mut a, &mut b, &mut now, |_, b| {
        b.link().incoming_len() == 0
    });
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
    assert_eq!(a.conn_mut(ca).unwrap().send(&data).unwrap(), data.len());
    a.poll(now);
    now += Duration::from_millis(1);
    let mut frames = Vec::new();
    b.link_mut()
        .recv_batch(now, usize::MAX, &mut |f| frames.push(f.to_vec()));
    assert!(frames.len() >= 2, "{} frames", frames.len());
    Bed {
        a,
        b,
        cb: cb.unwrap(),
        now,
        frames,
    }
}

/// What B's receive state shows: the bytes it made readable, the frames it answers with
/// (its ACKs carry RCV.NXT, the window and SACK blocks), and its drop counters.
fn outcome(bed: &mut Bed) -> (Vec<u8>, Vec<Vec<u8>>, [u64; 4]) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = bed.b.conn_mut(bed.cb).unwrap().recv(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    bed.b.poll(bed.now);
    let mut answers = Vec::new();
    bed.a
        .link_mut()
        .recv_batch(bed.now + Duration::from_millis(1), usize::MAX, &mut |f| {
            answers.push(f.to_vec())
        });
    let s = bed.b.stats();
    (
        got,
        answers,
        [
            s.rx_segments,
            s.rx_bad_checksum,
            s.rx_malformed,
            s.rx_chain_headers_split,
        ],
    )
}

/// Delivers `frame` to B cut at `cuts` (ascending offsets inside it).
fn deliver_cut(bed: &mut Bed, frame: &[u8], cuts: &[usize]) {
    let mut parts = Vec::new();
    let mut at = 0;
    for &c in cuts {
        parts.push(&frame[at..c]);
        at = c;
    }
    parts.push(&frame[at..]);
    let now = bed.now;
    bed.b
        .receive_parts_meta(now, &parts, RxMeta::default(), &mut |_| StrayVerdict::Local);
}

/// Cuts after the headers: right after them, one byte into the payload, at odd and even
/// offsets inside it, one byte before the end, and three ways.
fn payload_cuts(len: usize) -> Vec<Vec<usize>> {
    let mut cuts = vec![
        vec![HEADERS],
        vec![HEADERS + 1],
        vec![HEADERS + 7],
        vec![HEADERS + 700],
        vec![len - 1],
        vec![HEADERS, HEADERS + 1],
        vec![HEADERS + 3, HEADERS + 701, len - 2],
    ];
    cuts.retain(|c| c.iter().all(|&x| x > 0 && x < len));
    cuts
}

#[test]
fn a_segment_cut_after_its_headers_leaves_the_state_one_slice_leaves() {
    // In order: the fast path places the payload from its parts, checksum on the way.
    let mut whole = bed();
    let frames = whole.frames.clone();
    for f in &frames {
        whole.b.receive_frame(whole.now, f);
    }
    let want = outcome(&mut whole);
    assert!(want.0.len() >= 2000, "{} bytes readable", want.0.len());
    for cuts in payload_cuts(frames[0].len()) {
        let mut cut = bed();
        assert_eq!(cut.frames, frames, "the bed is not reproducible");
        for f in &frames {
            deliver_cut(&mut cut, f, &cuts);
        }
        assert_eq!(outcome(&mut cut), want, "cuts {cuts:?}");
        assert_eq!(cut.b.stats().rx_chains, frames.len() as u64);
    }
}

#[test]
fn an_out_of_order_segment_cut_after_its_headers_is_held_as_one_slice_is() {
    // Later segments first: the assembler path writes each at its offset from the parts.
    let mut whole = bed();
    let frames = whole.frames.clone();
    for f in frames.iter().rev() {
        whole.b.receive_frame(whole.now, f);
    }
    let want = outcome(&mut whole);
    for cuts in payload_cuts(frames[0].len()) {
        let mut cut = bed();
        for f in frames.iter().rev() {
            deliver_cut(&mut cut, f, &cuts);
        }
        assert_eq!(outcome(&mut cut), want, "cuts {cuts:?}");
    }
    // Only the first segment out of order, then the rest: same again.
    let mut whole = bed();
    for f in frames[1..].iter().chain(&frames[..1]) {
        whole.b.receive_frame(whole.now, f);
    }
    let want = outcome(&mut whole);
    let mut cut = bed();
    for f in frames[1..].iter().chain(&frames[..1]) {
        deliver_cut(&mut cut, f, &[HEADERS + 5, HEADERS + 900]);
    }
    assert_eq!(outcome(&mut cut), want);
}

#[test]
fn a_corrupt_payload_in_a_later_part_is_caught_by_the_checksum() {
    let mut cut = bed();
    let frames = cut.frames.clone();
    let mut bad = frames[0].clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x10;
    deliver_cut(&mut cut, &bad, &[HEADERS + 1, HEADERS + 600]);
    let (got, _, counters) = outcome(&mut cut);
    assert!(got.is_empty(), "{} corrupt bytes delivered", got.len());
    assert_eq!(counters[1], 1, "{counters:?}");
    // The intact segment afterwards, cut the same way, is delivered.
    deliver_cut(&mut cut, &frames[0], &[HEADERS + 1, HEADERS + 600]);
    let (got, _, _) = outcome(&mut cut);
    assert_eq!(got[..], frames[0][HEADERS..]);
}

#[test]
fn a_chain_cut_inside_its_headers_is_refused_and_counted() {
    let mut whole = bed();
    let want = outcome(&mut whole);
    let frames = whole.frames.clone();
    for cut_at in [1, 13, 14, 20, 33, 34, 40, 53, 54, HEADERS - 1] {
        let mut cut = bed();
        deliver_cut(&mut cut, &frames[0], &[cut_at]);
        let (got, answers, counters) = outcome(&mut cut);
        assert_eq!(counters[3], 1, "cut {cut_at}: {counters:?}");
        assert_eq!(
            (got, answers),
            (want.0.clone(), want.1.clone()),
            "cut {cut_at}"
        );
        assert_eq!(counters[..3], want.2[..3], "cut {cut_at}");
    }
}
