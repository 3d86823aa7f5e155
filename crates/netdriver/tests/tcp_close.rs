//! Connection release: active, passive and simultaneous close, half-close, EOF semantics,
//! FIN retransmission (RFC 9293 §3.6, §3.10.4, §3.10.7.4 eighth step).

mod tcp_support;
use tcp_support::*;

fn fin_seg(seq: SeqNumber, ack: SeqNumber) -> TcpRepr {
    TcpRepr {
        seq,
        ack: Some(ack),
        flags: TcpFlags::FIN,
        ..seg()
    }
}

// ---- active close ------------------------------------------------------------------------

#[test]
fn active_close_full_sequence() {
    let mut h = established();
    h.conn.close();
    assert_eq!(h.state(), State::FinWait1);
    assert!(!h.conn.may_send());
    assert!(h.conn.may_recv());
    recv!(
        h,
        TcpRepr {
            flags: TcpFlags::FIN,
            window: 16384,
            ..out()
        }
    );
    // ACK of our FIN → FIN-WAIT-2, nothing sent.
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 2),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::FinWait2);
    recv_nothing!(h);
    // Peer FIN → TIME-WAIT, ACK it.
    send!(h, fin_seg(REMOTE_ISN + 1, LOCAL_ISN + 2));
    assert_eq!(h.state(), State::TimeWait);
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 2,
            ack: Some(REMOTE_ISN + 2),
            window: 16384,
            ..out()
        }
    );
    assert_eq!(h.read(10), Ok(vec![]));
    assert_eq!(h.conn.error(), None);
}

#[test]
fn close_after_data_sends_fin_after_the_data() {
    let mut h = established();
    h.write(b"0123456789");
    h.conn.close();
    assert_eq!(h.state(), State::FinWait1);
    // The FIN may ride on the data segment or follow it; either way it sits at +11.
    let got = h.poll();
    let data: Vec<u8> = got.iter().flat_map(|s| s.payload.clone()).collect();
    assert_eq!(data, b"0123456789");
    let fins: Vec<_> = got.iter().filter(|s| s.repr.flags.fin()).collect();
    assert_eq!(fins.len(), 1, "{got:?}");
    assert_eq!(fins[0].repr.seq + fins[0].payload.len(), LOCAL_ISN + 11);
    for s in &got {
        assert_eq!(s.repr.ack, Some(REMOTE_ISN + 1));
        assert_eq!(s.repr.window, 16384);
    }
    // ACK of the data only: still FIN-WAIT-1.
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 11),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::FinWait1);
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 12),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::FinWait2);
    recv_nothing!(h);
}

#[test]
fn fin_and_ack_of_our_fin_together_go_straight_to_time_wait() {
    let mut h = fin_wait_1();
    send!(h, fin_seg(REMOTE_ISN + 1, LOCAL_ISN + 2));
    assert_eq!(h.state(), State::TimeWait);
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 2,
            ack: Some(REMOTE_ISN + 2),
            window: 16384,
            ..out()
        }
    );
}

#[test]
fn close_twice_sends_one_fin() {
    let mut h = fin_wait_1();
    h.conn.close();
    assert_eq!(h.state(), State::FinWait1);
    recv_nothing!(h);
}

#[test]
fn close_in_syn_sent_defers_fin_until_established() {
    // RFC 9293 §3.10.4 would delete the TCB here; the core deliberately treats close() as
    // shutdown(SHUT_WR) so data already accepted by send() is not lost: the data and FIN go
    // out once the handshake completes.
    let mut h = syn_sent();
    h.write(b"abc");
    h.conn.close();
    assert_eq!(h.conn.send(b"x"), Err(TcpError::Closed));
    recv_nothing!(h);
    send!(h, peer_syn_ack());
    assert_eq!(h.state(), State::FinWait1);
    let got = h.poll();
    let data: Vec<u8> = got.iter().flat_map(|s| s.payload.clone()).collect();
    assert_eq!(data, b"abc");
    let fin = got.iter().find(|s| s.repr.flags.fin()).expect("FIN");
    assert_eq!(fin.repr.seq + fin.payload.len(), LOCAL_ISN + 4);
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 5),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::FinWait2);
}

#[test]
fn close_in_syn_received_sends_fin_after_handshake() {
    let mut h = syn_received();
    h.conn.close();
    recv_nothing!(h);
    send!(h, seg());
    assert_eq!(h.state(), State::FinWait1);
    recv!(
        h,
        TcpRepr {
            flags: TcpFlags::FIN,
            window: 16384,
            ..out()
        }
    );
}

// ---- passive close -----------------------------------------------------------------------

#[test]
fn passive_close_full_sequence() {
    let mut h = established();
    send!(h, fin_seg(REMOTE_ISN + 1, LOCAL_ISN + 1));
    assert_eq!(h.state(), State::CloseWait);
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 2),
            window: 16384,
            ..out()
        }
    );
    assert!(h.conn.may_send());
    assert!(!h.conn.may_recv());
    h.conn.close();
    assert_eq!(h.state(), State::LastAck);
    recv!(
        h,
        TcpRepr {
            flags: TcpFlags::FIN,
            ack: Some(REMOTE_ISN + 2),
            window: 16384,
            ..out()
        }
    );
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 2,
            ack: Some(LOCAL_ISN + 2),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::Closed);
    assert!(h.conn.is_closed());
    assert_eq!(h.conn.error(), None);
    assert_eq!(h.deadline(), None);
    recv_nothing!(h);
}

#[test]
fn close_wait_can_still_send() {
    let mut h = close_wait();
    h.write(b"reply");
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 2),
            window: 16384,
            ..out()
        },
        b"reply"
    );
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 2,
            ack: Some(LOCAL_ISN + 6),
            ..seg()
        }
    );
    assert_eq!(h.conn.send_queue(), 0);
    assert_eq!(h.state(), State::CloseWait);
}

#[test]
fn last_ack_fin_is_retransmitted() {
    let mut h = last_ack();
    let rto = h.conn.stats().rto;
    let fin = TcpRepr {
        flags: TcpFlags::FIN,
        ack: Some(REMOTE_ISN + 2),
        window: 16384,
        ..out()
    };
    assert_eq!(h.fire_next(), T0 + rto);
    recv!(h, fin);
    assert_eq!(h.fire_next(), T0 + rto + rto * 2);
    recv!(h, fin);
    assert_eq!(h.state(), State::LastAck);
}

#[test]
fn last_ack_ignores_ack_not_covering_fin() {
    let mut h = last_ack();
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 2,
            ack: Some(LOCAL_ISN + 1),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::LastAck);
    recv_nothing!(h);
}

// ---- simultaneous close ------------------------------------------------------------------

#[test]
fn simultaneous_close_through_closing() {
    let mut h = closing();
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 2,
            ack: Some(LOCAL_ISN + 2),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::TimeWait);
    recv_nothing!(h);
}

#[test]
fn closing_retransmits_fin_on_rto() {
    let mut h = closing();
    let rto = h.conn.stats().rto;
    assert_eq!(h.fire_next(), T0 + rto);
    recv!(
        h,
        TcpRepr {
            flags: TcpFlags::FIN,
            ack: Some(REMOTE_ISN + 2),
            window: 16384,
            ..out()
        }
    );
    assert_eq!(h.state(), State::Closing);
}

// ---- half-close ----------------------------------------------------------------------------

#[test]
fn fin_wait_1_still_receives_data() {
    let mut h = fin_wait_1();
    send!(h, seg(), b"more");
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 2,
            ack: Some(REMOTE_ISN + 5),
            window: 16384 - 4,
            ..out()
        }
    );
    assert_eq!(h.read_all(), b"more");
    assert_eq!(h.state(), State::FinWait1);
}

#[test]
fn fin_wait_2_still_receives_data_then_eof() {
    let mut h = fin_wait_2();
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 2),
            ..seg()
        },
        b"half-closed"
    );
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 2,
            ack: Some(REMOTE_ISN + 12),
            window: 16384 - 11,
            ..out()
        }
    );
    assert_eq!(h.read(100), Ok(b"half-closed".to_vec()));
    assert_eq!(h.read(100), Err(TcpError::WouldBlock));
    send!(h, fin_seg(REMOTE_ISN + 12, LOCAL_ISN + 2));
    assert_eq!(h.state(), State::TimeWait);
    let _ = h.poll();
    assert_eq!(h.read(100), Ok(vec![]));
}

#[test]
fn recv_returns_buffered_data_then_eof() {
    let mut h = established();
    send!(h, seg(), b"hello");
    let _ = h.poll();
    send!(h, fin_seg(REMOTE_ISN + 6, LOCAL_ISN + 1));
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 7),
            window: 16384 - 5,
            ..out()
        }
    );
    assert_eq!(h.state(), State::CloseWait);
    assert!(h.conn.may_recv(), "unread data remains");
    assert_eq!(h.read(3), Ok(b"hel".to_vec()));
    assert_eq!(h.read(3), Ok(b"lo".to_vec()));
    assert_eq!(h.read(3), Ok(vec![]));
    assert_eq!(h.read(3), Ok(vec![]));
    assert!(!h.conn.may_recv());
}

#[test]
fn data_and_fin_in_one_segment() {
    let mut h = established();
    send!(
        h,
        TcpRepr {
            flags: TcpFlags::FIN,
            ..seg()
        },
        b"bye"
    );
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 5),
            window: 16384 - 3,
            ..out()
        }
    );
    assert_eq!(h.state(), State::CloseWait);
    assert_eq!(h.read_all(), b"bye");
    assert_eq!(h.read(1), Ok(vec![]));
}

#[test]
fn out_of_order_fin_waits_for_the_hole() {
    let mut h = established();
    // Data "world" + FIN at +6, before "hello" at +1 arrives.
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 6,
            flags: TcpFlags::FIN,
            ..seg()
        },
        b"world"
    );
    assert_eq!(h.state(), State::Established);
    let got = h.poll();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].repr.ack, Some(REMOTE_ISN + 1), "duplicate ACK");
    assert_eq!(h.read(10), Err(TcpError::WouldBlock));
    send!(h, seg(), b"hello");
    assert_eq!(h.state(), State::CloseWait);
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 12),
            window: 16384 - 10,
            ..out()
        }
    );
    assert_eq!(h.read_all(), b"helloworld");
    assert_eq!(h.read(1), Ok(vec![]));
}

#[test]
fn retransmitted_fin_in_close_wait_is_reacked() {
    let mut h = close_wait();
    send!(h, fin_seg(REMOTE_ISN + 1, LOCAL_ISN + 1));
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 2),
            window: 16384,
            ..out()
        }
    );
    assert_eq!(h.state(), State::CloseWait);
    assert_eq!(h.read(1), Ok(vec![]));
}

// ---- send after close ----------------------------------------------------------------------

#[test]
fn send_after_close_is_closed_error() {
    let mut h = fin_wait_1();
    assert_eq!(h.conn.send(b"x"), Err(TcpError::Closed));
    let mut h2 = fin_wait_2();
    assert_eq!(h2.conn.send(b"x"), Err(TcpError::Closed));
    let mut h3 = time_wait();
    assert_eq!(h3.conn.send(b"x"), Err(TcpError::Closed));
    let mut h4 = last_ack();
    assert_eq!(h4.conn.send(b"x"), Err(TcpError::Closed));
    let mut h5 = closing();
    assert_eq!(h5.conn.send(b"x"), Err(TcpError::Closed));
    assert!(!h5.conn.may_send());
    recv_nothing!(h);
}

#[test]
fn send_after_close_in_syn_received_is_closed_error() {
    let mut h = syn_received();
    h.conn.close();
    assert_eq!(h.conn.send(b"x"), Err(TcpError::Closed));
}

#[test]
fn queued_data_is_sent_before_fin_even_if_window_limited() {
    // 3000 bytes queued, peer window 1000: FIN must not overtake the unsent data.
    let mut h = syn_sent();
    send!(
        h,
        TcpRepr {
            window: 1000,
            ..peer_syn_ack()
        }
    );
    h.shift = 0;
    let _ = h.poll();
    h.conn.set_nodelay(true);
    h.write(&[1u8; 3000]);
    h.conn.close();
    let first = h.poll();
    assert!(first.iter().all(|s| !s.repr.flags.fin()), "{first:?}");
    let sent: usize = first.iter().map(|s| s.payload.len()).sum();
    assert_eq!(sent, 1000);
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 1001),
            window: 5000,
            ..seg()
        }
    );
    let second = h.poll();
    let sent2: usize = second.iter().map(|s| s.payload.len()).sum();
    assert_eq!(sent2, 2000);
    let last = second.last().unwrap();
    let fin_at = second
        .iter()
        .find(|s| s.repr.flags.fin())
        .map(|s| s.repr.seq + s.payload.len());
    assert_eq!(fin_at, Some(LOCAL_ISN + 3001), "{second:?} last {last:?}");
}

// ---- FIN retransmission ----------------------------------------------------------------------

#[test]
fn fin_is_retransmitted_on_rto_with_backoff() {
    let mut h = fin_wait_1();
    let rto = h.conn.stats().rto;
    let fin = TcpRepr {
        flags: TcpFlags::FIN,
        window: 16384,
        ..out()
    };
    assert_eq!(h.deadline(), Some(T0 + rto));
    h.fire_at(T0 + rto - Duration::from_micros(1));
    recv_nothing!(h);
    h.fire_at(T0 + rto);
    recv!(h, fin);
    assert_eq!(h.fire_next(), T0 + rto * 3);
    recv!(h, fin);
    assert_eq!(h.fire_next(), T0 + rto * 7);
    recv!(h, fin);
    assert_eq!(h.state(), State::FinWait1);
    assert_eq!(h.conn.stats().rto_timeouts, 3);
    // The ACK finally arrives.
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 2),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::FinWait2);
}

#[test]
fn unanswered_fin_gives_up_after_user_timeout() {
    // Regression class: no give-up timeout, so a dead peer hangs the connection forever
    // (smoltcp #1034, #323).
    let cfg = Config {
        user_timeout: Duration::from_secs(10),
        ..config()
    };
    let mut h = established_with(cfg);
    h.conn.close();
    let _ = h.poll();
    let mut last = T0;
    for _ in 0..100 {
        if h.state() == State::Closed {
            break;
        }
        last = h.fire_next();
        let _ = h.poll();
    }
    assert_eq!(h.state(), State::Closed);
    assert_eq!(h.conn.error(), Some(TcpError::TimedOut));
    assert!(
        last <= T0 + Duration::from_secs(10) + Duration::from_millis(1),
        "gave up at {last:?}"
    );
    assert!(
        last >= T0 + Duration::from_secs(10),
        "gave up too early at {last:?}"
    );
}
