//! Flow control: zero windows and persist probes, window updates, silly window syndrome
//! avoidance on both sides (RFC 9293 §3.8.6), and scaled windows (RFC 7323 §2).

mod tcp_support_b;

use netdriver::tcp::{Config, State};
use tcp_support_b::*;

fn config_rx(rx_buffer: usize) -> Config {
    Config {
        rx_buffer,
        ..test_config()
    }
}

fn zero_window_peer(config: Config) -> Tcb {
    let mut t = Tcb::established(
        config,
        PeerOpts {
            window: 0,
            ..PeerOpts::default()
        },
    );
    t.conn.set_nodelay(true);
    t
}

#[test]
fn zero_window_blocks_data_and_arms_the_persist_timer() {
    let mut t = zero_window_peer(test_config());
    let d = data(100);
    t.app_send(&d);
    t.expect_none();
    assert_eq!(t.stats().bytes_in_flight, 0);
    assert_eq!(t.deadline(), t.now + ms(200), "first probe one RTO later");
}

/// gVisor #10243: zero-length window probes are ignored by some peers; a probe must carry
/// one byte of new data (RFC 9293 §3.8.6.1).
#[test]
fn persist_probe_carries_one_byte() {
    let mut t = zero_window_peer(test_config());
    let d = data(100);
    t.app_send(&d);
    t.expect_none();
    t.fire();
    t.expect(t.out().seq(l(0)).payload(&d[..1]));
    t.expect_none();
}

/// Zephyr #48471: persist probes must back off exponentially.
#[test]
fn persist_probes_back_off_exponentially() {
    let mut t = zero_window_peer(test_config());
    let d = data(100);
    t.app_send(&d);
    t.expect_none();
    let mut at = t.now;
    for k in 0..6u32 {
        at += ms(200) * 2u32.pow(k);
        assert_eq!(t.fire(), at, "probe {k}");
        t.expect(t.out().seq(l(0)).payload(&d[..1]));
        t.expect_none();
        // The peer answers with a zero window again.
        t.send(t.seg().ack(l(0)).win(0));
        t.expect_none();
    }
}

#[test]
fn persist_interval_is_capped_at_max_rto() {
    let config = Config {
        max_rto: ms(1000),
        ..test_config()
    };
    let mut t = zero_window_peer(config);
    let d = data(100);
    t.app_send(&d);
    t.expect_none(); // timers are armed by poll_transmit
    let mut at = t.now;
    for step in [200, 400, 800, 1000, 1000] {
        at += ms(step);
        assert_eq!(t.fire(), at);
        t.expect(t.out().seq(l(0)).payload(&d[..1]));
        t.send(t.seg().ack(l(0)).win(0));
        t.expect_none();
    }
}

#[test]
fn answered_probes_keep_the_connection_open_indefinitely() {
    // RFC 1122 §4.2.2.17: as long as the receiver keeps acknowledging probes, the sender
    // must keep the connection open, however long the window stays closed.
    let config = Config {
        user_timeout: ms(1000),
        max_rto: ms(2000),
        ..test_config()
    };
    let mut t = zero_window_peer(config);
    let d = data(100);
    t.app_send(&d);
    t.expect_none();
    for _ in 0..30 {
        t.fire();
        t.expect(t.out().seq(l(0)).payload(&d[..1]));
        t.send(t.seg().ack(l(0)).win(0));
        t.expect_none();
        assert_eq!(t.conn.state(), State::Established);
    }
    assert_eq!(t.conn.error(), None);
    // The window opens: everything goes.
    t.send(t.seg().ack(l(0)).win(4000));
    t.expect(t.out().seq(l(0)).payload(&d));
    t.expect_none();
}

#[test]
fn accepted_probe_byte_is_not_resent_when_the_window_opens() {
    let mut t = zero_window_peer(test_config());
    let d = data(100);
    t.app_send(&d);
    t.expect_none();
    t.fire();
    t.expect(t.out().seq(l(0)).payload(&d[..1]));
    // The peer took the byte and opened its window.
    t.send(t.seg().ack(l(1)).win(3000));
    t.expect(t.out().seq(l(1)).payload(&d[1..]));
    t.expect_none();
    t.send(t.seg().ack(l(100)).win(3000));
    assert_eq!(t.conn.send_queue(), 0);
    assert_eq!(t.conn.poll_timeout(), None);
}

#[test]
fn window_update_from_peer_stops_the_persist_timer() {
    let mut t = zero_window_peer(test_config());
    let d = data(100);
    t.app_send(&d);
    t.expect_none();
    t.advance(ms(50));
    t.send(t.seg().ack(l(0)).win(1000));
    t.expect(t.out().seq(l(0)).payload(&d));
    t.expect_none();
    // Only the retransmission timer of the data remains.
    assert_eq!(t.deadline(), t.now + ms(200));
}

/// smoltcp #199: after the reader drains a zero window, a window update must be sent, or
/// both ends stall (the peer waits for a window, we wait for data).
#[test]
fn window_update_sent_when_reader_drains_a_zero_window() {
    let mut t = Tcb::established(config_rx(4096), PeerOpts::default());
    let d = data(4096);
    for i in 0..4 {
        t.send(
            t.seg()
                .seq(r(i * 1024))
                .payload(&d[i * 1024..(i + 1) * 1024]),
        );
        t.expect(
            t.out()
                .ack(r((i + 1) * 1024))
                .win((4096 - (i + 1) * 1024) as u16),
        );
    }
    t.expect_none();
    assert_eq!(t.app_recv(4096), d);
    t.expect(t.out().ack(r(4096)).win(4096));
    t.expect_none();
}

#[test]
fn receiver_sws_avoidance_withholds_tiny_window_increases() {
    // RFC 9293 §3.8.6.2.2: the right edge moves only by min(RCV.BUFF / 2, MSS) or more.
    let mut t = Tcb::established(config_rx(4096), PeerOpts::default());
    let d = data(4096);
    for i in 0..4 {
        t.send(
            t.seg()
                .seq(r(i * 1024))
                .payload(&d[i * 1024..(i + 1) * 1024]),
        );
        t.drain();
    }
    assert_eq!(t.app_recv(100), d[..100]);
    t.expect_none();
    // A zero-window probe is answered with the window still closed.
    t.send(t.seg().seq(r(4096)).payload(b"x"));
    t.expect(t.out().ack(r(4096)).win(0));
    t.expect_none();
    // Freeing 1500 bytes in all moves the edge (1500 >= min(2048, MSS)).
    assert_eq!(t.app_recv(1400), d[100..1500]);
    t.expect(t.out().ack(r(4096)).win(1500));
    t.expect_none();
}

#[test]
fn sender_sws_avoidance_holds_a_small_segment_when_more_is_queued() {
    // RFC 9293 §3.8.6.2.1: with 500 bytes of window (< MSS, < max window / 2) and more
    // than 500 bytes queued, nothing is sent yet.
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    let d = data(6000);
    t.app_send(&d[..3000]);
    assert_eq!(t.drain().len(), 3);
    t.advance(ms(10));
    t.send(t.seg().ack(l(3000)).win(500));
    t.app_send(&d[3000..]);
    t.expect_none();
    assert_eq!(t.stats().bytes_in_flight, 0);
}

#[test]
fn sender_sws_avoidance_sends_small_segment_holding_all_queued_data() {
    let mut t = Tcb::new();
    t.conn.set_nodelay(true);
    let d = data(3300);
    t.app_send(&d[..3000]);
    assert_eq!(t.drain().len(), 3);
    t.advance(ms(10));
    t.send(t.seg().ack(l(3000)).win(500));
    t.app_send(&d[3000..]);
    t.expect(t.out().seq(l(3000)).payload(&d[3000..]));
    t.expect_none();
}

#[test]
fn sender_sws_avoidance_sends_half_the_max_window() {
    // A peer whose window never exceeds 700 bytes: 700 >= Fs * max(SND.WND) is sent.
    let mut t = Tcb::established(
        test_config(),
        PeerOpts {
            window: 700,
            ..PeerOpts::default()
        },
    );
    t.conn.set_nodelay(true);
    let d = data(3000);
    t.app_send(&d);
    t.expect(t.out().seq(l(0)).payload(&d[..700]));
    t.expect_none();
}

#[test]
fn peer_window_scale_is_applied_after_the_handshake() {
    // RFC 7323 §2.2: SYN-ACK window unscaled, every later one shifted by the peer's scale.
    let mut t = Tcb::established(
        test_config(),
        PeerOpts {
            wscale: Some(2),
            ..PeerOpts::default()
        },
    );
    t.conn.set_nodelay(true);
    t.send(t.seg().win(500)); // 500 << 2 = 2000 bytes
    t.expect_none();
    let d = data(5000);
    t.app_send(&d);
    t.expect(t.out().seq(l(0)).payload(&d[..1000]));
    t.expect(t.out().seq(l(1000)).payload(&d[1000..2000]));
    t.expect_none();
}

/// smoltcp #253: buffers of 2^19 bytes and more were mis-advertised. With a 1 MiB buffer
/// the scaled window must describe the free space exactly (rounded down to the scale).
#[test]
fn large_buffer_window_is_scaled_correctly() {
    let config = Config {
        rx_buffer: 1 << 20,
        ..test_config()
    };
    let mut t = Tcb::established(
        config,
        PeerOpts {
            wscale: Some(7),
            ..PeerOpts::default()
        },
    );
    assert!(t.our_shift > 0, "a 1 MiB buffer needs window scaling");
    assert!(t.our_shift <= 14);
    let shift = t.our_shift;
    let check = |field: u16, free: usize| {
        let bytes = usize::from(field) << shift;
        assert!(bytes <= free, "advertises {bytes} > free {free}");
        assert!(
            bytes + (1 << shift) > free,
            "advertises {bytes}, free {free}"
        );
    };
    let d = data(1000);
    t.send(t.seg().payload(&d));
    let ack = t.poll().expect("ACK");
    assert_eq!(ack.repr.ack, Some(r(1000)));
    check(ack.repr.window, (1 << 20) - 1000);
}

#[test]
fn unanswered_probes_give_up_after_user_timeout() {
    // The other side of RFC 1122 §4.2.2.17: a peer that stops answering probes is dead;
    // the connection fails with TimedOut and an RST instead of probing forever.
    let config = Config {
        user_timeout: ms(1000),
        ..test_config()
    };
    let mut t = zero_window_peer(config);
    let t1 = t.now;
    let d = data(100);
    t.app_send(&d);
    t.expect_none();
    assert_eq!(t.fire(), t1 + ms(200));
    t.expect(t.out().seq(l(0)).payload(&d[..1]));
    t.expect_none();
    assert_eq!(t.fire(), t1 + ms(600));
    t.expect(t.out().seq(l(0)).payload(&d[..1]));
    t.expect_none();
    // 1200 ms after the first unanswered probe: give up.
    assert_eq!(t.fire(), t1 + ms(1400));
    let out = t.drain();
    assert_eq!(out.len(), 1);
    assert!(out[0].repr.flags.rst());
    assert_eq!(t.conn.state(), State::Closed);
    assert_eq!(t.conn.error(), Some(netdriver::tcp::TcpError::TimedOut));
}

/// Regression (found by the lossy oracle proptest): data is outstanding when the peer's
/// window closes, and the window update that would reopen it is lost. The persist timer is
/// not armed (data is in flight), so the retransmission timer must put an octet on the wire
/// despite the zero window (RFC 9293 §3.8.6.1, RFC 1122 §4.2.2.17); before the fix each
/// RTO rewound SND.NXT, obeyed the window, sent nothing, and both ends waited until the
/// user timeout.
#[test]
fn retransmission_timeout_probes_a_window_that_closed_with_data_outstanding() {
    let mut t = Tcb::established(test_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().seq(l(0)).payload(&d));
    t.expect_none();
    // The peer takes nothing and closes its window (it shrank the window; RFC 9293
    // §3.8.6.2.1 says a sender must cope).
    t.send(t.seg().ack(l(0)).win(0));
    t.expect_none();
    // The RTO fires: one octet goes out although the window is zero.
    t.fire();
    t.expect(t.out().seq(l(0)).payload(&d[..1]));
    t.expect_none();
    // The answer reopens the window (the lost update, repeated): the rest follows.
    t.send(t.seg().ack(l(1)).win(3000));
    t.expect(t.out().seq(l(1)).payload(&d[1..]));
    t.expect_none();
    t.send(t.seg().ack(l(100)).win(3000));
    assert_eq!(t.conn.send_queue(), 0);
}

/// Regression (found on the bed: a Linux peer at its defaults with a small `SO_RCVBUF`
/// that never reads): data is in flight when the peer runs out of receive memory. Linux
/// then drops what arrives and answers each segment with a zero-window ACK that
/// acknowledges nothing new (`ICSK_ACK_NOMEM`). The persist timer is not armed (data is
/// outstanding), so our retransmission timer probes the window; those probes are
/// answered, which RFC 9293 §3.8.6.1 (RFC 1122 §4.2.2.17) says must keep the connection
/// open. Before the fix the user timeout counted only acknowledged progress, so 30 s of
/// answered probes ended the channel with a RST.
#[test]
fn answered_probes_into_a_window_closed_with_data_outstanding_keep_the_connection() {
    let config = Config {
        user_timeout: ms(1000),
        max_rto: ms(2000),
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(100);
    let start = t.now;
    t.app_send(&d);
    t.expect(t.out().seq(l(0)).payload(&d));
    t.expect_none();
    // The peer drops the segment for lack of memory and says its window is closed.
    t.send(t.seg().ack(l(0)).win(0));
    t.expect_none();
    // Each retransmission is a probe the peer answers the same way, for far longer than
    // the user timeout.
    let mut probes = 0;
    while t.now < start + ms(10_000) {
        t.fire();
        t.expect(t.out().seq(l(0)).payload(&d[..1]));
        t.expect_none();
        t.send(t.seg().ack(l(0)).win(0));
        assert_eq!(t.conn.state(), State::Established, "after {probes} probes");
        probes += 1;
    }
    assert_eq!(t.conn.error(), None);
    assert!(probes >= 5, "{probes} probes in 10 s");
    // The peer reads: the window opens and everything goes.
    t.send(t.seg().ack(l(0)).win(4000));
    t.expect(t.out().seq(l(0)).payload(&d));
    t.expect_none();
    t.send(t.seg().ack(l(100)).win(4000));
    assert_eq!(t.conn.send_queue(), 0);
}

/// The other side of the above: once the peer stops answering the probes into its closed
/// window, the user timeout runs from its last answer and the connection fails.
#[test]
fn unanswered_probes_into_a_window_closed_with_data_outstanding_time_out() {
    let config = Config {
        user_timeout: ms(1000),
        max_rto: ms(2000),
        ..test_config()
    };
    let mut t = Tcb::established(config, PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().seq(l(0)).payload(&d));
    t.send(t.seg().ack(l(0)).win(0));
    for _ in 0..3 {
        t.fire();
        t.expect(t.out().seq(l(0)).payload(&d[..1]));
        t.send(t.seg().ack(l(0)).win(0));
    }
    let last_answer = t.now;
    // Silence from here: probes go unanswered until the user timeout has passed since
    // the last answer.
    for _ in 0..20 {
        let at = t.fire();
        let out = t.drain();
        if t.conn.state() == State::Closed {
            assert!(
                at >= last_answer + ms(1000),
                "gave up at {:?}",
                at - last_answer
            );
            assert!(at <= last_answer + ms(1000) + ms(2000), "gave up late");
            assert!(out.iter().any(|s| s.repr.flags.rst()));
            break;
        }
    }
    assert_eq!(t.conn.state(), State::Closed, "still probing a silent peer");
    assert_eq!(t.conn.error(), Some(netdriver::tcp::TcpError::TimedOut));
}

/// Regression (found on the bed with the same Linux peer as above): once the peer has
/// dropped our data in flight and closed its window, it accepts a segment only at its
/// RCV.NXT, which is our SND.UNA (RFC 9293 §3.10.7.4: with RCV.WND = 0 a zero-length
/// segment is acceptable only when SEG.SEQ = RCV.NXT). Our ACKs of its data carried
/// SND.MAX, so it dropped every one of them: its own data was never acknowledged and its
/// sending stalled until its retransmissions gave up. While the peer's window is shut
/// with our data unacknowledged, each pure ACK now goes at SND.UNA and again at SND.MAX
/// (a peer that took the data takes only the second).
#[test]
fn acks_into_a_closed_window_go_at_snd_una_and_snd_max() {
    let mut t = Tcb::established(test_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(100);
    t.app_send(&d);
    t.expect(t.out().seq(l(0)).payload(&d));
    t.expect_none();
    // The peer drops it for lack of memory and closes its window; then sends data.
    t.send(t.seg().ack(l(0)).win(0));
    t.expect_none();
    t.send(t.seg().ack(l(0)).win(0).payload(b"hello"));
    let ack = t.out().ack(r(5)).win(t.window_for(BUF - 5));
    t.expect(ack.clone().seq(l(0)));
    t.expect(ack.seq(l(100)));
    t.expect_none();
    // After the RTO's one-octet probe, the same.
    t.fire();
    t.expect(
        t.out()
            .seq(l(0))
            .ack(r(5))
            .win(t.window_for(BUF - 5))
            .payload(&d[..1]),
    );
    t.expect_none();
    t.send(t.seg().seq(r(5)).ack(l(0)).win(0).payload(b"world"));
    let ack = t.out().ack(r(10)).win(t.window_for(BUF - 10));
    t.expect(ack.clone().seq(l(0)));
    t.expect(ack.seq(l(100)));
    t.expect_none();
    // With the window open again, one ACK at SND.MAX as before.
    t.send(t.seg().seq(r(10)).ack(l(0)).win(4000));
    t.expect(
        t.out()
            .seq(l(0))
            .ack(r(10))
            .win(t.window_for(BUF - 10))
            .payload(&d),
    );
    t.expect_none();
    t.send(t.seg().seq(r(10)).ack(l(0)).win(4000).payload(b"!"));
    t.expect(t.out().seq(l(100)).ack(r(11)).win(t.window_for(BUF - 11)));
    t.expect_none();
}

/// Regression (found by the lossless oracle proptest once receive-window auto-tuning made
/// window scale 7 the default): both ends probed each other's zero window at once, each
/// took the other's probe octet, and each ACK of it was dropped. Our later ACKs carried
/// SND.MAX, one below the probe octet the peer had taken, so the peer dropped them as
/// old (RFC 9293 §3.10.7.4), and so did we theirs: neither learned its probe was
/// acknowledged. A pure ACK now also goes at the end of an unacknowledged probe.
#[test]
fn acks_after_a_probe_also_carry_its_end() {
    let mut t = zero_window_peer(test_config());
    let d = data(100);
    t.app_send(&d);
    t.expect_none();
    t.fire();
    t.expect(t.out().seq(l(0)).payload(&d[..1]));
    t.expect_none();
    // The peer took the octet; its ACK is lost. It sends data (its probe, say).
    t.send(t.seg().ack(l(0)).win(0).payload(b"hi"));
    let ack = t.out().ack(r(2)).win(t.window_for(BUF - 2));
    t.expect(ack.clone().seq(l(0)));
    t.expect(ack.seq(l(1)));
    t.expect_none();
}

/// Drives a zero-window peer that answers every probe with its window still shut, for
/// `until` (virtual time); returns when the connection failed, if it did.
fn answer_probes_with_a_shut_window(
    t: &mut Tcb,
    until: netdriver::time::Duration,
) -> Option<netdriver::time::Instant> {
    let end = t.now + until;
    while t.now < end {
        // Polling arms the next probe.
        t.expect_none();
        let at = t.fire();
        if t.conn.state() == State::Closed {
            return Some(at);
        }
        for s in t.drain() {
            if !s.payload.is_empty() {
                // The probe octet is not taken: the answer acknowledges nothing new.
                t.send(t.seg().ack(l(0)).win(0));
            }
        }
    }
    None
}

/// RFC 1122 §4.2.2.17: a receiver that answers our probes is kept, however long it keeps
/// its window shut, by default. With `Config::zero_window_limit` (Linux's user timeout
/// applied to zero-window probing) the connection fails once the window has been shut for
/// that long, counted in `Stats::zero_window_timeouts`.
#[test]
fn a_window_shut_past_the_limit_fails_the_connection_however_the_peer_answers() {
    // Default: still open after ten minutes of answered probes.
    let mut t = zero_window_peer(test_config());
    t.app_send(&data(100));
    assert_eq!(answer_probes_with_a_shut_window(&mut t, ms(600_000)), None);
    assert_eq!(t.conn.state(), State::Established);
    assert_eq!(t.stats().zero_window_timeouts, 0);

    let mut t = zero_window_peer(Config {
        zero_window_limit: Some(ms(10_000)),
        ..test_config()
    });
    let start = t.now;
    t.app_send(&data(100));
    let failed = answer_probes_with_a_shut_window(&mut t, ms(600_000))
        .expect("the connection outlived the zero-window limit");
    // The first probe notes the shut window; the limit counts from it, and the failure
    // comes at the first probe past it (probes back off up to `max_rto`).
    let shut_for = failed - start;
    assert!(
        shut_for >= ms(10_000) && shut_for <= ms(10_000) + test_config().max_rto,
        "failed after {shut_for:?}"
    );
    assert_eq!(t.conn.error(), Some(netdriver::tcp::TcpError::TimedOut));
    assert_eq!(t.stats().zero_window_timeouts, 1);
}

/// An abort after the peer shrank its window below what we had sent (it acknowledged
/// half and advertised a closed window, dropping the rest): the RST goes at the window's
/// right edge, which is the peer's RCV.NXT, as Linux's `tcp_acceptable_seq` picks it,
/// not at SND.MAX beyond it. A peer takes a RST only at exactly RCV.NXT (RFC 5961 §3.2);
/// at SND.MAX it answered with a challenge ACK that nobody was left to answer, and kept
/// retransmitting its own data until its user timeout.
#[test]
fn an_abort_past_a_shrunk_window_resets_at_the_peers_rcv_nxt() {
    let mut t = Tcb::established(
        test_config(),
        PeerOpts {
            window: 1000,
            ..PeerOpts::default()
        },
    );
    t.conn.set_nodelay(true);
    let d = data(1000);
    t.app_send(&d);
    t.expect(t.out().seq(l(0)).payload(&d));
    // Half taken, the window shut: the rest was dropped.
    t.send(t.seg().ack(l(500)).win(0));
    t.expect_none();
    t.conn.abort();
    t.expect(
        t.out()
            .seq(l(500))
            .no_ack()
            .flags(netdriver::wire::TcpFlags::RST)
            .win(0),
    );
    t.expect_none();
}
