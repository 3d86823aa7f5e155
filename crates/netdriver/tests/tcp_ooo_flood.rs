//! Hostile out-of-order flood against the reassembly bounds (CVE-2018-5390 "SegmentSmack",
//! CVE-2019-11477 "SACK panic"): a peer sends every other full segment of a window far
//! larger than the range cap. The ranges held stop at the cap, the rest is dropped and
//! counted, the memory the connection holds stops growing at the cap, nothing panics, and
//! once the holes are filled every byte held is delivered exactly.
//!
//! This file holds a single test because it measures heap use with a counting global
//! allocator, which other tests running in parallel threads would disturb.

mod tcp_support_b;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use netdriver::tcp::Config;
use tcp_support_b::*;

/// The system allocator, counting live bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

#[test]
fn every_other_segment_flood_stays_at_the_range_cap() {
    const SEG: usize = PEER_MSS;
    // Room for 4096 segments, so that the window never refuses the flood: only the range
    // cap does.
    const RX: usize = 4096 * SEG;
    let cap = Config::default().max_ooo_ranges;
    assert_eq!(cap, 512);
    let config = Config {
        rx_buffer: RX,
        ..test_config()
    };
    let peer = PeerOpts {
        wscale: Some(7),
        ..PeerOpts::default()
    };
    let mut t = Tcb::established(config, peer);
    let d = data(RX);
    // One in-order segment first, read by the application: the receive ring is allocated
    // before the measurement starts.
    t.send(t.seg().payload(&d[..SEG]));
    t.drain();
    assert_eq!(t.app_recv(SEG), d[..SEG]);
    let before = live();

    // Every other segment from segment 2 on: 2 * cap holes' worth, the second half past
    // the cap.
    let mut after_cap = None;
    for k in 0..2 * cap {
        let at = (2 * k + 2) * SEG;
        t.send(t.seg().seq(r(at)).payload(&d[at..at + SEG]));
        let out = t.drain();
        // Each out-of-order segment is answered by exactly one duplicate ACK.
        assert_eq!(out.len(), 1, "segment {k}");
        assert_eq!(out[0].repr.ack, Some(r(SEG)));
        let held = (k + 1).min(cap);
        assert_eq!(t.stats().ooo_ranges, held, "segment {k}");
        assert_eq!(t.stats().ooo_dropped, (k + 1 - held) as u64);
        if k + 1 == cap {
            after_cap = Some(live());
        }
    }
    let at_cap = after_cap.unwrap();
    let grown = at_cap - before;
    // The ranges' B-tree is bounded as Config::max_ooo_ranges documents (under 48 KiB
    // at 512 ranges); the bytes themselves are in the receive ring, which grows with the
    // offsets written (by doubling) up to its capacity, RX.
    assert!(
        grown <= 48 * 1024 + RX as isize,
        "{grown} bytes for {cap} ranges"
    );
    // Past the cap nothing more is held: not one byte of heap more.
    assert!(live() <= at_cap, "{} > {at_cap}", live());
    assert_eq!(t.stats().recv_queue, 0);

    // Fill the holes in order: each fill delivers the segment plus the held one after it,
    // until the last held range; then the rest arrives in order.
    for k in 0..cap {
        let at = (2 * k + 1) * SEG;
        t.send(t.seg().seq(r(at)).payload(&d[at..at + SEG]));
        let out = t.drain();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].repr.ack, Some(r(at + 2 * SEG)));
    }
    assert_eq!(t.stats().ooo_ranges, 0);
    let delivered = (2 * cap + 1) * SEG;
    assert_eq!(t.stats().recv_queue, delivered - SEG);
    assert_eq!(t.app_recv(RX), d[SEG..delivered]);
}
