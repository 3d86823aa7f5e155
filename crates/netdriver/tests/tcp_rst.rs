//! RST and SYN handling in synchronized states (RFC 5961), ACK validation, RSTs for
//! unexpected segments (RFC 9293 §3.10.7.1), abort.

mod tcp_support;
use tcp_support::*;

fn rst(seq: SeqNumber) -> TcpRepr {
    TcpRepr {
        seq,
        ack: None,
        flags: TcpFlags::RST,
        window: 0,
        ..seg()
    }
}

/// The challenge ACK `<SEQ=SND.NXT><ACK=RCV.NXT><CTL=ACK>` of an idle established harness.
fn challenge(h: &H) -> TcpRepr {
    TcpRepr {
        window: h.win(),
        ..out()
    }
}

// ---- RFC 5961 §3: RST ------------------------------------------------------------------

#[test]
fn rst_exactly_at_rcv_nxt_resets() {
    let mut h = established();
    send!(h, rst(REMOTE_ISN + 1));
    assert_eq!(h.state(), State::Closed);
    assert_eq!(h.conn.error(), Some(TcpError::Reset));
    recv_nothing!(h);
    assert_eq!(h.read(10), Err(TcpError::Reset));
    assert_eq!(h.conn.send(b"x"), Err(TcpError::Reset));
    assert!(h.conn.is_closed());
    assert_eq!(h.deadline(), None);
}

#[test]
fn rst_ack_exactly_at_rcv_nxt_resets() {
    let mut h = established();
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 1),
            ..rst(REMOTE_ISN + 1)
        }
    );
    assert_eq!(h.state(), State::Closed);
    assert_eq!(h.conn.error(), Some(TcpError::Reset));
    recv_nothing!(h);
}

#[test]
fn rst_at_rcv_nxt_after_data_across_wrap_resets() {
    // rcv.nxt moves past 2^32 (REMOTE_ISN + 1 + 2100 wraps); the RST must match exactly.
    let mut h = established();
    send!(h, seg(), &[0u8; 1400]);
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 1401,
            ..seg()
        },
        &[0u8; 700]
    );
    let _ = h.poll();
    send!(h, rst(REMOTE_ISN + 2100));
    assert_eq!(h.state(), State::Established);
    let _ = h.poll();
    send!(h, rst(REMOTE_ISN + 2101));
    assert_eq!(h.state(), State::Closed);
    assert_eq!(h.conn.error(), Some(TcpError::Reset));
}

#[test]
fn rst_in_window_but_not_exact_gets_challenge_ack() {
    for off in [2usize, 100, 16384] {
        let mut h = established();
        send!(h, rst(REMOTE_ISN + off));
        assert_eq!(h.state(), State::Established, "offset {off}");
        let c = challenge(&h);
        recv!(h, c);
        assert_eq!(h.conn.stats().challenge_acks, 1);
        assert_eq!(h.conn.error(), None);
    }
}

#[test]
fn rst_out_of_window_is_dropped_silently() {
    // Window is [rcv.nxt, rcv.nxt + 16384).
    for seq in [
        REMOTE_ISN + 16385,
        REMOTE_ISN + 100_000,
        REMOTE_ISN,
        REMOTE_ISN - 1000,
    ] {
        let mut h = established();
        send!(h, rst(seq));
        assert_eq!(h.state(), State::Established, "seq {seq:?}");
        recv_nothing!(h);
        assert_eq!(h.conn.stats().challenge_acks, 0);
    }
}

#[test]
fn rst_in_fin_wait_2_at_rcv_nxt_resets() {
    let mut h = fin_wait_2();
    send!(h, rst(REMOTE_ISN + 1));
    assert_eq!(h.state(), State::Closed);
    recv_nothing!(h);
}

#[test]
fn rst_in_close_wait_in_window_gets_challenge_ack() {
    let mut h = close_wait();
    // rcv.nxt = REMOTE_ISN + 2 after the FIN.
    send!(h, rst(REMOTE_ISN + 10));
    assert_eq!(h.state(), State::CloseWait);
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 2),
            window: h.win(),
            ..out()
        }
    );
    send!(h, rst(REMOTE_ISN + 2));
    assert_eq!(h.state(), State::Closed);
    assert_eq!(h.conn.error(), Some(TcpError::Reset));
}

#[test]
fn rst_in_last_ack_at_rcv_nxt_closes() {
    let mut h = last_ack();
    send!(h, rst(REMOTE_ISN + 2));
    assert_eq!(h.state(), State::Closed);
    recv_nothing!(h);
}

// ---- RST in SYN-RECEIVED -----------------------------------------------------------------

#[test]
fn rst_in_syn_received_at_rcv_nxt_closes() {
    let mut h = syn_received();
    send!(h, rst(REMOTE_ISN + 1));
    assert_eq!(h.state(), State::Closed);
    recv_nothing!(h);
    assert!(h.conn.is_closed());
    assert_eq!(h.deadline(), None);
}

#[test]
fn rst_in_syn_received_out_of_window_is_ignored() {
    let mut h = syn_received();
    send!(h, rst(REMOTE_ISN + 20_000));
    assert_eq!(h.state(), State::SynReceived);
    recv_nothing!(h);
    send!(h, rst(REMOTE_ISN));
    assert_eq!(h.state(), State::SynReceived);
    recv_nothing!(h);
}

// ---- RFC 5961 §4: SYN in synchronized states ---------------------------------------------

#[test]
fn syn_in_established_gets_challenge_ack() {
    for seq in [
        REMOTE_ISN,
        REMOTE_ISN + 1,
        REMOTE_ISN + 5000,
        REMOTE_ISN + 1_000_000,
    ] {
        let mut h = established();
        send!(
            h,
            TcpRepr {
                seq,
                ack: None,
                flags: TcpFlags::SYN,
                options: peer_syn_opts(),
                ..seg()
            }
        );
        assert_eq!(h.state(), State::Established, "seq {seq:?}");
        let c = challenge(&h);
        recv!(h, c);
        assert_eq!(h.conn.error(), None);
    }
}

#[test]
fn syn_ack_in_established_gets_challenge_ack() {
    let mut h = established();
    send!(h, peer_syn_ack());
    assert_eq!(h.state(), State::Established);
    let c = challenge(&h);
    recv!(h, c);
}

#[test]
fn syn_with_data_in_established_is_not_delivered() {
    let mut h = established();
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 1,
            flags: TcpFlags::SYN,
            ..seg()
        },
        b"evil"
    );
    let c = challenge(&h);
    recv!(h, c);
    assert_eq!(h.conn.recv_queue(), 0);
}

// ---- RFC 5961 §7: challenge ACK rate limit ------------------------------------------------

#[test]
fn challenge_acks_for_rsts_are_rate_limited_per_second() {
    let mut h = established();
    let c = challenge(&h);
    let mut n = 0;
    for _ in 0..15 {
        send!(h, rst(REMOTE_ISN + 7));
        n += h.poll().len();
    }
    assert_eq!(n, 10, "challenge_ack_limit_per_sec = 10");
    assert_eq!(h.conn.stats().challenge_acks, 10);
    // Still within the same second: nothing.
    h.advance(ms(999));
    send!(h, rst(REMOTE_ISN + 7));
    recv_nothing!(h);
    // A second later the budget is back.
    h.advance(ms(1));
    send!(h, rst(REMOTE_ISN + 7));
    recv!(h, c);
}

#[test]
fn challenge_acks_for_syns_are_rate_limited() {
    // smoltcp #1164: SYNs must also go through the challenge ACK limit.
    let cfg = Config {
        challenge_ack_limit_per_sec: 3,
        ..config()
    };
    let mut h = established_with(cfg);
    let mut n = 0;
    for i in 0..8 {
        send!(
            h,
            TcpRepr {
                seq: REMOTE_ISN + i * 10,
                ack: None,
                flags: TcpFlags::SYN,
                ..seg()
            }
        );
        n += h.poll().len();
    }
    assert_eq!(n, 3);
}

#[test]
fn challenge_ack_limit_does_not_apply_to_data_acks() {
    // smoltcp #1162/#1164: exhausting the challenge budget must not stop ordinary ACKs.
    let cfg = Config {
        challenge_ack_limit_per_sec: 2,
        ..config()
    };
    let mut h = established_with(cfg);
    for _ in 0..5 {
        send!(h, rst(REMOTE_ISN + 50));
        let _ = h.poll();
    }
    assert_eq!(h.conn.stats().challenge_acks, 2);
    for i in 0..5usize {
        send!(
            h,
            TcpRepr {
                seq: REMOTE_ISN + 1 + i * 10,
                ..seg()
            },
            &[i as u8; 10]
        );
        let w = h.win();
        recv!(
            h,
            TcpRepr {
                ack: Some(REMOTE_ISN + 11 + i * 10),
                window: w,
                ..out()
            }
        );
    }
    // Duplicate (already received) data is also ACKed, not rate-limited (RFC 9293 §3.10.7.4).
    // SACK is in effect, so each ACK reports the duplicate in a D-SACK block (RFC 2883).
    for _ in 0..5 {
        send!(h, seg(), &[0u8; 10]);
        let w = h.win();
        recv!(
            h,
            TcpRepr {
                ack: Some(REMOTE_ISN + 51),
                window: w,
                options: sack_opts(&[(REMOTE_ISN + 1, REMOTE_ISN + 11)]),
                ..out()
            }
        );
    }
}

#[test]
fn challenge_ack_budget_is_per_connection() {
    // CVE-2016-5696: a global counter leaks state across connections.
    let cfg = Config {
        challenge_ack_limit_per_sec: 1,
        ..config()
    };
    let mut a = established_with(cfg.clone());
    let mut b = established_with(cfg);
    send!(a, rst(REMOTE_ISN + 3));
    assert_eq!(a.poll().len(), 1);
    send!(a, rst(REMOTE_ISN + 3));
    assert_eq!(a.poll().len(), 0);
    send!(b, rst(REMOTE_ISN + 3));
    assert_eq!(b.poll().len(), 1);
}

// ---- ACK validation (RFC 9293 §3.10.7.4 fifth, RFC 5961 §5) ---------------------------------

#[test]
fn ack_of_unsent_data_is_answered_and_segment_dropped() {
    let mut h = established();
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 100),
            ..seg()
        },
        b"data"
    );
    let c = challenge(&h);
    recv!(h, c);
    assert_eq!(h.conn.recv_queue(), 0, "the segment's data must be dropped");
    assert_eq!(h.state(), State::Established);
}

#[test]
fn ack_of_unsent_data_with_data_in_flight() {
    let mut h = established();
    h.write(b"0123456789");
    let w = h.win();
    recv!(h, TcpRepr { window: w, ..out() }, b"0123456789");
    // snd.nxt = LOCAL_ISN + 11; acking + 12 is beyond it.
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 12),
            ..seg()
        }
    );
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 11,
            window: w,
            ..out()
        }
    );
    assert_eq!(h.conn.send_queue(), 10, "nothing was acknowledged");
    // The exact ACK is fine.
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 11),
            ..seg()
        }
    );
    recv_nothing!(h);
    assert_eq!(h.conn.send_queue(), 0);
}

#[test]
fn too_old_ack_is_discarded_with_data() {
    // RFC 5961 §5.2: SEG.ACK < SND.UNA - MAX.SND.WND → discard (the data is not taken) and
    // send an ACK back. MAX.SND.WND is 65535 here.
    let mut h = established();
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 1 - 65536 - 10),
            ..seg()
        },
        b"stale"
    );
    assert_eq!(h.conn.recv_queue(), 0);
    assert_eq!(h.state(), State::Established);
    let c = challenge(&h);
    recv!(h, c);
}

#[test]
fn old_but_acceptable_ack_still_delivers_data() {
    // Within [SND.UNA - MAX.SND.WND, SND.UNA] and not below the first byte sent (Linux's
    // bound, `tcp_ack`): a duplicate ACK; the text is processed.
    let mut h = established();
    h.conn.set_nodelay(true);
    h.write(&[7; 1000]);
    assert_eq!(h.poll().len(), 1);
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 1 + 1000),
            ..seg()
        }
    );
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 1 + 400),
            ..seg()
        },
        b"fresh"
    );
    assert_eq!(h.conn.recv_queue(), 5);
    let w = h.win();
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 1 + 1000,
            ack: Some(REMOTE_ISN + 6),
            window: w,
            ..out()
        }
    );
}

#[test]
fn segment_without_ack_is_dropped_in_established() {
    let mut h = established();
    send!(h, TcpRepr { ack: None, ..seg() }, b"noack");
    assert_eq!(h.conn.recv_queue(), 0);
    recv_nothing!(h);
}

#[test]
fn out_of_window_data_is_acked_not_taken() {
    let mut h = established();
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 20_000,
            ..seg()
        },
        b"far"
    );
    let c = challenge(&h);
    recv!(h, c);
    assert_eq!(h.conn.recv_queue(), 0);
}

/// Out-of-window segments without data are answered at most once per
/// `Config::invalid_ack_interval` (500 ms, Linux's `tcp_invalid_ratelimit`): two ends
/// that each find the other's ACK out of window would otherwise answer each other forever.
/// Out-of-window data is always answered.
#[test]
fn acks_to_out_of_window_pure_acks_are_rate_limited() {
    let mut h = established();
    let c = challenge(&h);
    let far = || TcpRepr {
        seq: REMOTE_ISN + 20_000,
        ..seg()
    };
    send!(h, far());
    recv!(h, c);
    send!(h, far());
    recv_nothing!(h);
    assert_eq!(h.conn.stats().oow_acks_suppressed, 1);
    // Data out of the window still gets its ACK.
    send!(h, far(), b"far");
    recv!(h, c);
    h.advance(ms(499));
    send!(h, far());
    recv_nothing!(h);
    h.advance(ms(1));
    send!(h, far());
    recv!(h, c);
    assert_eq!(h.conn.stats().oow_acks_suppressed, 2);
}

// ---- rst_for_unexpected (RFC 9293 §3.10.7.1) ----------------------------------------------

#[test]
fn rst_for_unexpected_with_ack() {
    // <SEQ=SEG.ACK><CTL=RST>
    let incoming = as_parsed(TcpRepr {
        seq: SeqNumber(1234),
        ack: Some(SeqNumber(u32::MAX - 3)),
        ..seg()
    });
    let r = rst_for_unexpected(&incoming, 100).unwrap();
    assert_eq!(
        normalise(r),
        TcpRepr {
            seq: SeqNumber(u32::MAX - 3),
            ack: None,
            flags: TcpFlags::RST,
            window: 0,
            ..out()
        }
    );
}

#[test]
fn rst_for_unexpected_syn_without_ack() {
    // <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>, SYN counts one.
    let r = rst_for_unexpected(&as_parsed(peer_syn()), 0).unwrap();
    assert!(r.flags.ack(), "RST,ACK must carry the ACK flag");
    assert_eq!(
        normalise(r),
        TcpRepr {
            seq: SeqNumber(0),
            ack: Some(REMOTE_ISN + 1),
            flags: TcpFlags::RST,
            window: 0,
            ..out()
        }
    );
}

#[test]
fn rst_for_unexpected_counts_payload_syn_and_fin_across_wrap() {
    let incoming = as_parsed(TcpRepr {
        seq: SeqNumber(u32::MAX - 4),
        ack: None,
        flags: TcpFlags::SYN | TcpFlags::FIN,
        ..seg()
    });
    let r = rst_for_unexpected(&incoming, 10).unwrap();
    // (2^32 - 5) + 10 + 1 + 1 = 7 mod 2^32.
    assert_eq!(r.ack, Some(SeqNumber(7)));
    assert_eq!(r.seq, SeqNumber(0));
    assert_eq!((r.src_port, r.dst_port), (LOCAL_PORT, REMOTE_PORT));
    let plain = as_parsed(TcpRepr {
        seq: SeqNumber(100),
        ack: None,
        ..seg()
    });
    assert_eq!(
        rst_for_unexpected(&plain, 7).unwrap().ack,
        Some(SeqNumber(107))
    );
}

#[test]
fn rst_for_unexpected_never_answers_a_rst() {
    // smoltcp #1058/#851 neighbourhood: a RST must never provoke a RST.
    for r in [
        rst(SeqNumber(5)),
        TcpRepr {
            ack: Some(SeqNumber(9)),
            ..rst(SeqNumber(5))
        },
    ] {
        assert_eq!(rst_for_unexpected(&as_parsed(r), 0), None);
    }
}

#[test]
fn closed_connection_answers_segments_with_rst() {
    let mut h = established();
    h.conn.abort();
    let _ = h.poll();
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 1),
            ..seg()
        },
        b"late"
    );
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 1,
            ack: None,
            flags: TcpFlags::RST,
            window: 0,
            ..out()
        }
    );
    send!(h, rst(REMOTE_ISN + 1));
    recv_nothing!(h);
}

// ---- abort ---------------------------------------------------------------------------------

#[test]
fn abort_in_established_sends_rst_at_snd_nxt() {
    let mut h = established();
    h.conn.abort();
    assert_eq!(h.state(), State::Closed);
    assert!(!h.conn.is_closed(), "the RST is still to be sent");
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 1,
            ack: None,
            flags: TcpFlags::RST,
            window: 0,
            ..out()
        }
    );
    assert!(h.conn.is_closed());
    assert_eq!(h.conn.error(), Some(TcpError::Closed));
    assert_eq!(h.deadline(), None);
    recv_nothing!(h);
}

#[test]
fn abort_with_data_in_flight_uses_snd_nxt_after_the_data() {
    let mut h = established();
    h.write(&[1u8; 100]);
    let _ = h.poll();
    h.conn.abort();
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 101,
            ack: None,
            flags: TcpFlags::RST,
            window: 0,
            ..out()
        }
    );
}

#[test]
fn abort_in_fin_wait_1_rst_follows_the_fin() {
    let mut h = fin_wait_1();
    h.conn.abort();
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 2,
            ack: None,
            flags: TcpFlags::RST,
            window: 0,
            ..out()
        }
    );
}

#[test]
fn abort_in_syn_received_sends_rst() {
    let mut h = syn_received();
    h.conn.abort();
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 1,
            ack: None,
            flags: TcpFlags::RST,
            window: 0,
            ..out()
        }
    );
    assert_eq!(h.state(), State::Closed);
}

#[test]
fn abort_in_syn_sent_sends_nothing() {
    let mut h = syn_sent();
    h.conn.abort();
    assert_eq!(h.state(), State::Closed);
    recv_nothing!(h);
    assert!(h.conn.is_closed());
}
