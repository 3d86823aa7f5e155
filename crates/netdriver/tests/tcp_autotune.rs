//! Receive-buffer auto-tuning (`Config::rx_buffer_max`; Linux's dynamic right-sizing): the
//! buffer, and so the advertised window, grows once per round trip with what the
//! application read in it, up to the maximum, and never for a slow reader.

mod tcp_support_b;

use netdriver::tcp::Config;
use tcp_support_b::*;

/// Auto-tuning up to 100 000 bytes from the harness's 16 KiB. The window scale offered
/// covers the maximum: 100 000 >> 1 fits 16 bits.
fn autotuned(max: Option<usize>) -> Tcb {
    let config = Config {
        rx_buffer_max: max,
        ..test_config()
    };
    let peer = PeerOpts {
        wscale: Some(7),
        ..PeerOpts::default()
    };
    let t = Tcb::established(config, peer);
    // The handshake's RTT sample is the round trip auto-tuning measures over.
    assert_eq!(t.stats().srtt, Some(HS_RTT));
    t
}

/// The peer sends `n` full segments starting at peer byte `from`; every ACK is drained.
/// Returns the last ACK.
fn receive(t: &mut Tcb, d: &[u8], from: usize, n: usize) -> Seg {
    let mut last = None;
    for i in 0..n {
        let at = from + i * 1000;
        t.send(t.seg().seq(r(at)).payload(&d[at..at + 1000]));
        let acks = t.drain();
        assert_eq!(acks.len(), 1, "one ACK per segment");
        last = acks.into_iter().next();
    }
    last.expect("an ACK")
}

#[test]
fn a_reader_that_keeps_up_grows_the_window_each_round_trip_up_to_the_maximum() {
    let mut t = autotuned(Some(100_000));
    assert_eq!(t.our_shift, 1);
    assert_eq!(t.stats().rx_buffer, BUF);
    let d = data(400_000);
    // Round trip 1: 16 segments (the whole 16 KiB window, less 384 bytes), all read.
    let ack = receive(&mut t, &d, 0, 16);
    assert_eq!(ack.repr.ack, Some(r(16_000)));
    assert_eq!(t.app_recv(100_000), d[..16_000]);
    // Less than a round trip later nothing is measured yet: the read frees the ring and a
    // plain window update offers the 16 KiB again.
    t.advance(ms(5));
    t.expect(t.out().ack(r(16_000)).win((BUF >> 1) as u16));
    t.expect_none();
    assert_eq!(t.stats().rx_buffer, BUF);
    // One round trip (10 ms) after the measurement started: 16 000 bytes read beat the
    // initial 10 segments of 1460, so the buffer grows to 2 * 16 000 + 16 * 1460.
    t.advance(ms(5));
    let grown = 2 * 16_000 + 16 * 1460;
    t.expect(t.out().ack(r(16_000)).win((grown >> 1) as u16));
    t.expect_none();
    assert_eq!(t.stats().rx_buffer, grown);
    assert_eq!(t.stats().rx_buffer_grown, 1);
    // Round trip 2: the peer fills 50 segments of the new window, all read; a round trip
    // later the buffer would grow to 2 * 50 000 + 16 * 1460 but stops at the maximum.
    let ack = receive(&mut t, &d, 16_000, 50);
    assert_eq!(ack.repr.ack, Some(r(66_000)));
    assert_eq!(ack.repr.window, ((grown - 50_000) >> 1) as u16);
    assert_eq!(t.app_recv(100_000), d[16_000..66_000]);
    t.advance(ms(10));
    t.expect(t.out().ack(r(66_000)).win((100_000 >> 1) as u16));
    t.expect_none();
    assert_eq!(t.stats().rx_buffer, 100_000);
    assert_eq!(t.stats().rx_buffer_grown, 2);
    // Round trip 3: more read than ever, but the maximum is reached.
    receive(&mut t, &d, 66_000, 90);
    assert_eq!(t.app_recv(100_000), d[66_000..156_000]);
    t.advance(ms(10));
    t.drain();
    assert_eq!(t.stats().rx_buffer, 100_000);
    assert_eq!(t.stats().rx_buffer_grown, 2);
}

/// A reader slower than 10 segments per round trip never grows the buffer, however full
/// the peer keeps it.
#[test]
fn a_slow_reader_does_not_grow_the_buffer() {
    let mut t = autotuned(Some(1 << 20));
    let d = data(200_000);
    let mut sent = 0;
    let mut read = 0;
    for _ in 0..20 {
        // The peer fills whatever window is open.
        let room = BUF - t.stats().recv_queue;
        let n = room / 1000;
        if n > 0 {
            receive(&mut t, &d, sent, n);
            sent += n * 1000;
        }
        let got = t.app_recv(5000);
        assert_eq!(got, d[read..read + got.len()]);
        read += got.len();
        t.advance(ms(10));
        t.drain();
    }
    assert!(read >= 90_000, "the reader did read: {read}");
    assert_eq!(t.stats().rx_buffer, BUF);
    assert_eq!(t.stats().rx_buffer_grown, 0);
}

/// Without `rx_buffer_max` the buffer is fixed, and the window scale offered is the one
/// for `rx_buffer`.
#[test]
fn without_a_maximum_nothing_grows() {
    let mut t = autotuned(None);
    assert_eq!(t.our_shift, 0);
    let d = data(100_000);
    for round in 0..4 {
        receive(&mut t, &d, round * 16_000, 16);
        assert_eq!(t.app_recv(100_000).len(), 16_000);
        t.advance(ms(10));
        t.expect(t.out().ack(r((round + 1) * 16_000)).win(BUF as u16));
        t.expect_none();
    }
    assert_eq!(t.stats().rx_buffer, BUF);
    assert_eq!(t.stats().rx_buffer_grown, 0);
}

/// The default configuration auto-tunes (up to 6 MiB, Linux's `tcp_rmem` maximum): a
/// reader that keeps up grows the buffer a round trip after reading more than the
/// initial 10 segments, exactly as with an explicit maximum.
#[test]
fn the_default_configuration_auto_tunes() {
    let max = Config::default().rx_buffer_max;
    assert_eq!(max, Some(6 << 20));
    let mut t = autotuned(max);
    // 6 MiB >> 6 does not fit 16 bits, >> 7 does.
    assert_eq!(t.our_shift, 7);
    let d = data(16_000);
    receive(&mut t, &d, 0, 16);
    assert_eq!(t.app_recv(100_000), d[..16_000]);
    t.advance(ms(10));
    t.drain();
    assert_eq!(t.stats().rx_buffer, 2 * 16_000 + 16 * 1460);
    assert_eq!(t.stats().rx_buffer_grown, 1);
}
