//! TIME-WAIT: 2*MSL duration, restart by a retransmitted FIN, RFC 1337 (no assassination
//! by RST), RFC 6191 (new SYN acceptance with timestamps).

mod tcp_support;
use tcp_support::*;

fn peer_fin() -> TcpRepr {
    TcpRepr {
        flags: TcpFlags::FIN,
        ack: Some(LOCAL_ISN + 2),
        ..seg()
    }
}

fn our_ack_of_fin() -> TcpRepr {
    TcpRepr {
        seq: LOCAL_ISN + 2,
        ack: Some(REMOTE_ISN + 2),
        window: 16384,
        ..out()
    }
}

#[test]
fn time_wait_lasts_exactly_config_time_wait() {
    let mut h = time_wait();
    assert_eq!(h.deadline(), Some(T0 + Duration::from_secs(60)));
    h.fire_at(T0 + Duration::from_secs(60) - Duration::from_micros(1));
    assert_eq!(h.state(), State::TimeWait);
    assert!(!h.conn.is_closed());
    h.fire_at(T0 + Duration::from_secs(60));
    assert_eq!(h.state(), State::Closed);
    assert!(h.conn.is_closed());
    assert_eq!(h.conn.error(), None);
    assert_eq!(h.deadline(), None);
    recv_nothing!(h);
}

#[test]
fn time_wait_duration_follows_config_and_entry_time() {
    let cfg = Config {
        time_wait: Duration::from_millis(1500),
        ..config()
    };
    let mut h = established_with(cfg);
    h.conn.close();
    let _ = h.poll();
    h.advance(ms(300));
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 2),
            ..seg()
        }
    );
    h.advance(ms(700));
    send!(h, peer_fin());
    assert_eq!(h.state(), State::TimeWait);
    recv!(h, our_ack_of_fin());
    // Entered at T0 + 1 s: expires at T0 + 2.5 s.
    assert_eq!(h.deadline(), Some(T0 + ms(2500)));
    assert_eq!(h.fire_next(), T0 + ms(2500));
    assert_eq!(h.state(), State::Closed);
}

#[test]
fn time_wait_from_closing_lasts_time_wait() {
    let mut h = closing();
    h.advance(ms(50));
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 2,
            ack: Some(LOCAL_ISN + 2),
            ..seg()
        }
    );
    assert_eq!(h.state(), State::TimeWait);
    assert_eq!(h.deadline(), Some(T0 + ms(50) + Duration::from_secs(60)));
}

#[test]
fn retransmitted_fin_restarts_2msl_and_is_reacked() {
    // RFC 9293 §3.10.7.4 eighth step, TIME-WAIT: "Acknowledge it, and restart the 2 MSL
    // timeout."
    let mut h = time_wait();
    h.advance(Duration::from_secs(10));
    send!(h, peer_fin());
    recv!(h, our_ack_of_fin());
    assert_eq!(h.state(), State::TimeWait);
    assert_eq!(h.deadline(), Some(T0 + Duration::from_secs(70)));
    h.fire_at(T0 + Duration::from_secs(60));
    assert_eq!(
        h.state(),
        State::TimeWait,
        "the original deadline no longer applies"
    );
    h.advance(Duration::from_secs(5));
    send!(h, peer_fin());
    recv!(h, our_ack_of_fin());
    assert_eq!(h.deadline(), Some(T0 + Duration::from_secs(125)));
    h.fire_at(T0 + Duration::from_secs(70));
    assert_eq!(h.state(), State::TimeWait);
    assert_eq!(h.fire_next(), T0 + Duration::from_secs(125));
    assert_eq!(h.state(), State::Closed);
}

#[test]
fn retransmitted_fin_with_data_in_time_wait_is_reacked() {
    let mut h = fin_wait_2();
    send!(h, peer_fin(), b"tail");
    assert_eq!(h.state(), State::TimeWait);
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 6),
            window: 16384 - 4,
            ..our_ack_of_fin()
        }
    );
    h.advance(Duration::from_secs(1));
    send!(h, peer_fin(), b"tail");
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 6),
            window: 16384 - 4,
            ..our_ack_of_fin()
        }
    );
    assert_eq!(h.deadline(), Some(T0 + Duration::from_secs(61)));
    assert_eq!(h.read_all(), b"tail");
}

#[test]
fn rst_in_time_wait_is_ignored() {
    // RFC 1337 TIME-WAIT assassination (MicroPython #15844): an RST must not end TIME-WAIT.
    let mut h = time_wait();
    for seq in [REMOTE_ISN + 2, REMOTE_ISN + 3, REMOTE_ISN + 1] {
        for ack in [None, Some(LOCAL_ISN + 2)] {
            send!(
                h,
                TcpRepr {
                    seq,
                    ack,
                    flags: TcpFlags::RST,
                    window: 0,
                    ..seg()
                }
            );
            assert_eq!(h.state(), State::TimeWait);
            recv_nothing!(h);
        }
    }
    assert_eq!(h.conn.error(), None);
    assert_eq!(h.deadline(), Some(T0 + Duration::from_secs(60)));
}

#[test]
fn pure_ack_in_time_wait_is_ignored() {
    let mut h = time_wait();
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 2,
            ack: Some(LOCAL_ISN + 2),
            ..seg()
        }
    );
    recv_nothing!(h);
    assert_eq!(h.state(), State::TimeWait);
    assert_eq!(h.deadline(), Some(T0 + Duration::from_secs(60)));
}

#[test]
fn time_wait_state_is_closed_to_the_application() {
    let mut h = time_wait();
    assert_eq!(h.read(10), Ok(vec![]));
    assert_eq!(h.conn.send(b"x"), Err(TcpError::Closed));
    assert!(!h.conn.may_send());
    assert!(!h.conn.may_recv());
    h.conn.close();
    assert_eq!(h.state(), State::TimeWait);
    recv_nothing!(h);
}

// ---- RFC 6191 ------------------------------------------------------------------------------

/// A TIME-WAIT connection with timestamps negotiated; the peer's last TSval is 5000.
fn time_wait_with_timestamps() -> H {
    let cfg = Config {
        timestamps: true,
        ..config()
    };
    let conn = Connection::connect(cfg.clone(), local_addr(), remote_addr(), LOCAL_ISN, T0);
    let mut h = H {
        conn,
        now: T0,
        cfg,
        shift: 0,
    };
    let syn = h.poll();
    assert_eq!(syn.len(), 1);
    let our_ts = syn[0]
        .repr
        .options
        .timestamp
        .expect("SYN offers timestamps")
        .0;
    let ts = |tsval: u32| TcpOptions {
        timestamp: Some((tsval, our_ts)),
        ..TcpOptions::default()
    };
    send!(
        h,
        TcpRepr {
            options: TcpOptions {
                timestamp: Some((1000, our_ts)),
                ..peer_syn_opts()
            },
            ..peer_syn_ack()
        }
    );
    assert_eq!(h.state(), State::Established);
    let _ = h.poll();
    h.conn.close();
    let _ = h.poll();
    send!(
        h,
        TcpRepr {
            options: ts(5000),
            ..peer_fin()
        }
    );
    assert_eq!(h.state(), State::TimeWait);
    let acks = h.poll();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].repr.options.timestamp.map(|t| t.1), Some(5000));
    h
}

#[test]
fn retransmitted_fin_in_time_wait_updates_ts_recent() {
    // RFC 7323 §4.3 holds in every state: SEG.TSval >= TS.Recent and SEG.SEQ =< Last.ACK.sent
    // → TS.Recent = SEG.TSval. The ACK echoes it, and RFC 6191 then compares against it.
    let mut h = time_wait_with_timestamps();
    recv_nothing!(h);
    h.advance(ms(10));
    send!(
        h,
        TcpRepr {
            options: TcpOptions {
                timestamp: Some((6000, 0)),
                ..TcpOptions::default()
            },
            ..peer_fin()
        }
    );
    let acks = h.poll();
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!(acks[0].repr.options.timestamp.map(|t| t.1), Some(6000));
    assert!(!h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN + 1000, Some(5500))));
    assert!(h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN + 1000, Some(6001))));
}

fn new_syn(seq: SeqNumber, tsval: Option<u32>) -> TcpRepr {
    as_parsed(TcpRepr {
        seq,
        ack: None,
        flags: TcpFlags::SYN,
        options: TcpOptions {
            timestamp: tsval.map(|v| (v, 0)),
            ..peer_syn_opts()
        },
        ..seg()
    })
}

#[test]
fn new_syn_in_time_wait_with_greater_timestamp_is_accepted() {
    let h = time_wait_with_timestamps();
    // Sequence number deliberately BELOW rcv.nxt: with timestamps only TSval matters.
    assert!(h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN - 100, Some(5001))));
    assert!(h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN + 9, Some(9_000_000))));
}

#[test]
fn new_syn_in_time_wait_with_equal_or_smaller_timestamp_is_refused() {
    let h = time_wait_with_timestamps();
    // Sequence number above rcv.nxt must not rescue a stale TSval.
    assert!(!h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN + 1000, Some(5000))));
    assert!(!h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN + 1000, Some(4999))));
    assert!(!h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN + 1000, Some(1))));
}

#[test]
fn new_syn_in_time_wait_timestamp_comparison_wraps() {
    // TSval comparison is modulo 2^32 (RFC 7323 §5.2): 5000 - 2^31 + 1 is "older".
    let h = time_wait_with_timestamps();
    assert!(!h.conn.accepts_new_syn_in_time_wait(&new_syn(
        REMOTE_ISN + 1000,
        Some(5000u32.wrapping_sub(1 << 31).wrapping_add(1))
    )));
}

#[test]
fn new_syn_in_time_wait_without_timestamps_uses_sequence_numbers() {
    // RFC 6191 §2 falls back to RFC 1122 §4.2.2.13: acceptable iff SEG.SEQ > RCV.NXT.
    let h = time_wait();
    // rcv.nxt = REMOTE_ISN + 2 (after the FIN).
    assert!(h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN + 3, None)));
    assert!(h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN + 100_000, None)));
    assert!(!h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN + 2, None)));
    assert!(!h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN - 5, None)));
}

#[test]
fn accepts_new_syn_only_in_time_wait_and_only_for_plain_syns() {
    let h = established();
    assert!(!h
        .conn
        .accepts_new_syn_in_time_wait(&new_syn(REMOTE_ISN + 100_000, None)));
    let h = time_wait();
    let syn_ack = as_parsed(TcpRepr {
        ack: Some(LOCAL_ISN + 2),
        ..new_syn(REMOTE_ISN + 100_000, None)
    });
    assert!(!h.conn.accepts_new_syn_in_time_wait(&syn_ack));
    let not_syn = as_parsed(TcpRepr {
        flags: TcpFlags::default(),
        ..new_syn(REMOTE_ISN + 100_000, None)
    });
    assert!(!h.conn.accepts_new_syn_in_time_wait(&not_syn));
}

#[test]
fn syn_in_time_wait_does_not_end_it() {
    // The netif decides via accepts_new_syn_in_time_wait; the connection itself answers a
    // SYN in TIME-WAIT at most with an ACK and stays put.
    let mut h = time_wait();
    send!(h, new_syn(REMOTE_ISN + 100_000, None));
    assert_eq!(h.state(), State::TimeWait);
    for s in h.poll() {
        assert_eq!(s.repr, normalise(our_ack_of_fin()), "{s:?}");
    }
}
