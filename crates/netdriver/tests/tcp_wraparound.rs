//! Sequence numbers crossing 2^32 mid-stream in both directions: data, FIN, out-of-order
//! reassembly and SACK in both directions, retransmission. Regression class: comparisons
//! with raw integers near 2^32 (smoltcp #489, gVisor netstack #14, picoTCP #118).
//!
//! LOCAL_ISN + 1 = 2^32 - 1000 and REMOTE_ISN + 1 = 2^32 - 2000: our byte 1000 and the
//! peer's byte 2000 are the first ones at sequence number 0.

mod tcp_support;
use tcp_support::*;

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

#[test]
fn isns_are_just_below_the_wrap() {
    assert_eq!((LOCAL_ISN + 1001).0, 0);
    assert_eq!((REMOTE_ISN + 2001).0, 0);
}

#[test]
fn sending_across_the_wrap() {
    let mut h = established();
    h.conn.set_nodelay(true);
    let data = pattern(2000, 1);
    h.write(&data);
    let w = h.win();
    recv!(
        h,
        [
            (TcpRepr { window: w, ..out() }, data[..1460]),
            (
                TcpRepr {
                    seq: SeqNumber(460),
                    window: w,
                    ..out()
                },
                data[1460..]
            ),
        ]
    );
    // A cumulative ACK past the wrap acknowledges both.
    send!(
        h,
        TcpRepr {
            ack: Some(SeqNumber(1000)),
            ..seg()
        }
    );
    assert_eq!(h.conn.send_queue(), 0);
    assert_eq!(h.conn.stats().bytes_acked, 2000);
    recv_nothing!(h);
    assert_eq!(h.deadline(), None, "nothing outstanding, no timer");
}

#[test]
fn partial_ack_exactly_at_zero() {
    let mut h = established();
    h.conn.set_nodelay(true);
    h.write(&pattern(2000, 2));
    let _ = h.poll();
    send!(
        h,
        TcpRepr {
            ack: Some(SeqNumber(0)),
            ..seg()
        }
    );
    assert_eq!(h.conn.send_queue(), 1000);
    send!(
        h,
        TcpRepr {
            ack: Some(SeqNumber(u32::MAX)),
            ..seg()
        }
    );
    assert_eq!(
        h.conn.send_queue(),
        1000,
        "an older ACK acknowledges nothing"
    );
    send!(
        h,
        TcpRepr {
            ack: Some(SeqNumber(1000)),
            ..seg()
        }
    );
    assert_eq!(h.conn.send_queue(), 0);
}

#[test]
fn receiving_across_the_wrap() {
    let mut h = established();
    let data = pattern(3000, 3);
    for i in 0..3 {
        send!(
            h,
            TcpRepr {
                seq: REMOTE_ISN + 1 + i * 1000,
                ..seg()
            },
            &data[i * 1000..(i + 1) * 1000]
        );
        let w = h.win();
        recv!(
            h,
            TcpRepr {
                ack: Some(REMOTE_ISN + 1001 + i * 1000),
                window: w,
                ..out()
            }
        );
    }
    assert_eq!(h.conn.stats().bytes_received, 3000);
    assert_eq!(h.read_all(), data);
}

#[test]
fn segment_straddling_zero_is_received() {
    let mut h = established();
    send!(h, seg(), &pattern(1500, 4));
    let _ = h.poll();
    // [2^32 - 500, 500)
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 1501,
            ..seg()
        },
        &pattern(1000, 5)
    );
    recv!(
        h,
        TcpRepr {
            ack: Some(SeqNumber(500)),
            window: 16384 - 2500,
            ..out()
        }
    );
    let mut want = pattern(1500, 4);
    want.extend(pattern(1000, 5));
    assert_eq!(h.read_all(), want);
}

#[test]
fn fin_exactly_at_u32_max_both_directions() {
    // Our FIN at 2^32 - 1 (999 bytes first), the peer's FIN at 2^32 - 1 (1999 bytes).
    let mut h = established();
    h.conn.set_nodelay(true);
    h.write(&pattern(999, 6));
    h.conn.close();
    let got = h.poll();
    let fin = got.iter().find(|s| s.repr.flags.fin()).expect("FIN sent");
    assert_eq!(fin.repr.seq + fin.payload.len(), SeqNumber(u32::MAX));
    send!(
        h,
        TcpRepr {
            ack: Some(SeqNumber(0)),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::FinWait2);
    send!(
        h,
        TcpRepr {
            ack: Some(SeqNumber(0)),
            ..seg()
        },
        &pattern(1999, 7)
    );
    let _ = h.poll();
    send!(
        h,
        TcpRepr {
            seq: SeqNumber(u32::MAX),
            ack: Some(SeqNumber(0)),
            flags: TcpFlags::FIN,
            ..seg()
        }
    );
    assert_eq!(h.state(), State::TimeWait);
    recv!(
        h,
        TcpRepr {
            seq: SeqNumber(0),
            ack: Some(SeqNumber(0)),
            window: 16384 - 1999,
            ..out()
        }
    );
    assert_eq!(h.read_all(), pattern(1999, 7));
    assert_eq!(h.read(1), Ok(vec![]));
}

#[test]
fn fin_just_after_the_wrap() {
    // The peer's FIN at sequence 0 exactly, after 2000 bytes.
    let mut h = established();
    send!(h, seg(), &pattern(1000, 8));
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 1001,
            flags: TcpFlags::FIN,
            ..seg()
        },
        &pattern(1000, 9)
    );
    assert_eq!(h.state(), State::CloseWait);
    let got = h.poll();
    assert_eq!(got.last().unwrap().repr.ack, Some(SeqNumber(1)));
    h.conn.close();
    recv!(
        h,
        TcpRepr {
            flags: TcpFlags::FIN,
            ack: Some(SeqNumber(1)),
            window: 16384 - 2000,
            ..out()
        }
    );
    send!(
        h,
        TcpRepr {
            seq: SeqNumber(1),
            ack: Some(LOCAL_ISN + 2),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::Closed);
}

#[test]
fn out_of_order_across_the_wrap_is_sacked_and_reassembled() {
    let mut h = established();
    // [REMOTE_ISN + 1501, + 2501) = [2^32 - 500, 500) arrives first.
    let a = pattern(1500, 10);
    let b = pattern(1000, 11);
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 1501,
            ..seg()
        },
        &b
    );
    recv!(
        h,
        TcpRepr {
            window: 16384,
            options: sack_opts(&[(REMOTE_ISN + 1501, SeqNumber(500))]),
            ..out()
        }
    );
    assert_eq!(h.read(10), Err(TcpError::WouldBlock));
    // A second hole-creating block beyond: [1000, 1500); the newest block comes first.
    let c = pattern(500, 12);
    send!(
        h,
        TcpRepr {
            seq: SeqNumber(1000),
            ..seg()
        },
        &c
    );
    recv!(
        h,
        TcpRepr {
            window: 16384,
            options: sack_opts(&[
                (SeqNumber(1000), SeqNumber(1500)),
                (REMOTE_ISN + 1501, SeqNumber(500)),
            ]),
            ..out()
        }
    );
    // Fill the first hole: cumulative ACK jumps to 500; the remaining block is reported.
    send!(h, seg(), &a);
    recv!(
        h,
        TcpRepr {
            ack: Some(SeqNumber(500)),
            window: 16384 - 2500,
            options: sack_opts(&[(SeqNumber(1000), SeqNumber(1500))]),
            ..out()
        }
    );
    // Fill the second hole.
    let d = pattern(500, 13);
    send!(
        h,
        TcpRepr {
            seq: SeqNumber(500),
            ..seg()
        },
        &d
    );
    recv!(
        h,
        TcpRepr {
            ack: Some(SeqNumber(1500)),
            window: 16384 - 3500,
            ..out()
        }
    );
    let mut want = a;
    want.extend(b);
    want.extend(d);
    want.extend(c);
    assert_eq!(h.read_all(), want);
}

#[test]
fn sack_blocks_across_the_wrap_trigger_retransmission_of_the_hole() {
    // Peer MSS 1000: we send [2^32-1000, 0), [0, 1000), [1000, 2000), [2000, 3000).
    let mut h = syn_sent();
    send!(
        h,
        TcpRepr {
            options: TcpOptions {
                mss: Some(1000),
                ..peer_syn_opts()
            },
            ..peer_syn_ack()
        }
    );
    let _ = h.poll();
    h.conn.set_nodelay(true);
    let data = pattern(4000, 14);
    h.write(&data);
    let sent = h.poll();
    let seqs: Vec<u32> = sent.iter().map(|s| s.repr.seq.0).collect();
    assert_eq!(seqs, [u32::MAX - 999, 0, 1000, 2000]);
    // Three duplicate ACKs, SACKing the segments after the first (which straddle nothing
    // but lie wholly past the wrap while SND.UNA is before it).
    for right in [1000u32, 2000, 3000] {
        send!(
            h,
            TcpRepr {
                ack: Some(LOCAL_ISN + 1),
                options: sack_opts(&[(SeqNumber(0), SeqNumber(right))]),
                ..seg()
            }
        );
    }
    let w = h.win();
    recv!(h, TcpRepr { window: w, ..out() }, data[..1000]);
    assert_eq!(h.conn.stats().fast_retransmits, 1);
    // The retransmission's ACK covers everything, across the wrap.
    send!(
        h,
        TcpRepr {
            ack: Some(SeqNumber(3000)),
            ..seg()
        }
    );
    assert_eq!(h.conn.send_queue(), 0);
    recv_nothing!(h);
}

#[test]
fn rto_retransmission_across_the_wrap() {
    let mut h = established();
    h.conn.set_nodelay(true);
    let data = pattern(2000, 15);
    h.write(&data);
    let _ = h.poll();
    h.fire_next();
    let w = h.win();
    // After an RTO, cwnd is one segment: the first one again.
    recv!(h, TcpRepr { window: w, ..out() }, data[..1460]);
    h.advance(ms(5));
    send!(
        h,
        TcpRepr {
            ack: Some(SeqNumber(460)),
            ..seg()
        }
    );
    let rest = h.poll();
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(rest[0].repr.seq, SeqNumber(460));
    assert_eq!(rest[0].payload, data[1460..]);
}

#[test]
fn bulk_transfer_both_ways_across_the_wrap_pair() {
    // Two real connections back to back: 100 kB each way, every segment delivered but
    // each batch reversed (reordering), so both reassemblers run across 2^32.
    let cfg = Config {
        delayed_ack: None,
        rx_buffer: 32 * 1024,
        tx_buffer: 32 * 1024,
        ..Config::default()
    };
    let mut p = Pair::new(cfg.clone(), cfg, T0);
    assert_eq!(p.a.state(), State::Established);
    assert_eq!(p.b.state(), State::Established);
    let a_data = pattern(100_000, 16);
    let b_data = pattern(100_000, 17);
    let (mut a_off, mut b_off) = (0, 0);
    let (mut a_got, mut b_got) = (Vec::new(), Vec::new());
    let mut buf = vec![0u8; 8192];
    for _ in 0..10_000 {
        if a_off < a_data.len() {
            a_off += p.a.send(&a_data[a_off..]).unwrap_or(0);
        }
        if b_off < b_data.len() {
            b_off += p.b.send(&b_data[b_off..]).unwrap_or(0);
        }
        let mut sa = p.poll_a();
        let mut sb = p.poll_b();
        sa.reverse();
        sb.reverse();
        for s in &sa {
            p.b.handle_segment(p.now, &s.repr, &s.payload);
        }
        for s in &sb {
            p.a.handle_segment(p.now, &s.repr, &s.payload);
        }
        while let Ok(n) = p.a.recv(&mut buf) {
            if n == 0 {
                break;
            }
            a_got.extend_from_slice(&buf[..n]);
        }
        while let Ok(n) = p.b.recv(&mut buf) {
            if n == 0 {
                break;
            }
            b_got.extend_from_slice(&buf[..n]);
        }
        if a_got.len() == b_data.len() && b_got.len() == a_data.len() {
            break;
        }
        if sa.is_empty() && sb.is_empty() {
            let limit = p.now + Duration::from_secs(5);
            p.now += ms(1);
            p.step_timers(limit);
        } else {
            p.now += Duration::from_micros(100);
        }
    }
    assert_eq!(b_got, a_data);
    assert_eq!(a_got, b_data);
    p.a.close();
    p.run_until_quiet(100);
    assert_eq!(p.a.state(), State::FinWait2);
    assert_eq!(p.b.state(), State::CloseWait);
    p.b.close();
    p.run_until_quiet(100);
    assert_eq!(p.a.state(), State::TimeWait);
    assert_eq!(p.b.state(), State::Closed);
}
