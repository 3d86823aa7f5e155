//! Connection establishment: active, passive and simultaneous open, SYN/SYN-ACK
//! retransmission, refusal, option negotiation (MSS, window scale, SACK, timestamps).

mod tcp_support;
use tcp_support::*;

// ---- active open -------------------------------------------------------------------------

#[test]
fn active_open_syn_carries_all_options_for_default_config() {
    // Crate defaults: the auto-tuning maximum, 6 MiB, needs shift 7 (6 MiB >> 7 = 49152;
    // the 256 KiB the buffer starts at would need 3), timestamps on.
    let cfg = Config::default();
    let mut h = connect_with(cfg);
    assert_eq!(h.state(), State::SynSent);
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN,
            ack: None,
            flags: TcpFlags::SYN,
            window: 65535,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                // TSval is the core's clock (µs); TSecr is 0 on an initial SYN (RFC 7323 §3.2).
                timestamp: Some((T0.total_millis() as u32, 0)),
                ..TcpOptions::default()
            },
            ..out()
        }
    );
    assert_eq!(h.state(), State::SynSent);
}

#[test]
fn active_open_syn_harness_config() {
    // 16 KiB fits the window field unscaled: shift 0 is still offered so the peer may scale.
    let mut h = connect_with(config());
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN,
            ack: None,
            flags: TcpFlags::SYN,
            window: 16384,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(0),
                sack_permitted: true,
                ..TcpOptions::default()
            },
            ..out()
        }
    );
}

#[test]
fn active_open_without_optional_features_sends_only_mss() {
    let cfg = Config {
        window_scaling: false,
        sack: false,
        timestamps: false,
        mss: 1200,
        ..config()
    };
    let mut h = connect_with(cfg);
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN,
            ack: None,
            flags: TcpFlags::SYN,
            window: 16384,
            options: opts_mss(1200),
            ..out()
        }
    );
}

#[test]
fn active_open_syn_is_sent_once() {
    let mut h = syn_sent();
    recv_nothing!(h);
    h.advance(ms(999));
    h.conn.handle_timeout(h.now);
    recv_nothing!(h);
}

#[test]
fn active_open_completes_with_exact_ack() {
    let mut h = syn_sent();
    send!(h, peer_syn_ack());
    assert_eq!(h.state(), State::Established);
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 1,
            ack: Some(REMOTE_ISN + 1),
            window: 16384,
            ..out()
        }
    );
    recv_nothing!(h);
    assert!(h.conn.may_send());
    assert!(h.conn.may_recv());
    assert_eq!(h.conn.error(), None);
}

#[test]
fn data_queued_in_syn_sent_goes_out_after_handshake() {
    let mut h = syn_sent();
    h.write(b"hello");
    recv_nothing!(h);
    send!(h, peer_syn_ack());
    assert_eq!(h.state(), State::Established);
    recv!(
        h,
        TcpRepr {
            window: 16384,
            ..out()
        },
        b"hello"
    );
}

// ---- passive open ------------------------------------------------------------------------

#[test]
fn passive_open_syn_ack_mirrors_offered_options() {
    let syn = TcpRepr {
        options: TcpOptions {
            mss: Some(1400),
            window_scale: Some(7),
            sack_permitted: true,
            timestamp: Some((777, 0)),
            ..TcpOptions::default()
        },
        ..peer_syn()
    };
    let cfg = Config::default();
    let conn = Connection::accept(
        cfg,
        local_addr(),
        remote_addr(),
        &as_parsed(syn),
        LOCAL_ISN,
        T0,
    )
    .unwrap();
    let mut h = H {
        conn,
        now: T0,
        cfg: Config::default(),
        // For the default's 6 MiB auto-tuning maximum.
        shift: 7,
    };
    assert_eq!(h.state(), State::SynReceived);
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN,
            ack: Some(REMOTE_ISN + 1),
            flags: TcpFlags::SYN,
            window: 65535,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                timestamp: Some((T0.total_millis() as u32, 777)),
                ..TcpOptions::default()
            },
            ..out()
        }
    );
}

#[test]
fn passive_open_plain_syn_gets_only_mss() {
    // RFC 7323 §2.2 / §3.2, RFC 2018 §2: no WS, SACK-permitted or TS unless the SYN had them.
    let syn = TcpRepr {
        options: TcpOptions::default(),
        ..peer_syn()
    };
    let mut h = syn_received_from(Config::default(), syn);
    // syn_received_from checked the exact SYN-ACK; restate it for the reader.
    assert_eq!(
        our_syn_ack(&Config::default(), &syn).options,
        opts_mss(1460)
    );
    send!(h, seg());
    assert_eq!(h.state(), State::Established);
    recv_nothing!(h);
}

#[test]
fn passive_open_syn_ack_only_sack_when_only_sack_offered() {
    let syn = TcpRepr {
        options: TcpOptions {
            mss: Some(1460),
            sack_permitted: true,
            ..TcpOptions::default()
        },
        ..peer_syn()
    };
    let conn = Connection::accept(
        config(),
        local_addr(),
        remote_addr(),
        &as_parsed(syn),
        LOCAL_ISN,
        T0,
    )
    .unwrap();
    let mut h = H {
        conn,
        now: T0,
        cfg: config(),
        shift: 0,
    };
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN,
            ack: Some(REMOTE_ISN + 1),
            flags: TcpFlags::SYN,
            window: 16384,
            options: TcpOptions {
                mss: Some(1460),
                sack_permitted: true,
                ..TcpOptions::default()
            },
            ..out()
        }
    );
}

#[test]
fn passive_open_completes_on_ack_and_receives_data() {
    let mut h = syn_received();
    send!(h, seg(), b"abc");
    assert_eq!(h.state(), State::Established);
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 4),
            window: 16384 - 3,
            ..out()
        }
    );
    assert_eq!(h.read_all(), b"abc");
}

#[test]
fn accept_rejects_segments_that_are_not_a_plain_syn() {
    for bad in [
        TcpRepr {
            flags: TcpFlags::SYN,
            ack: Some(SeqNumber(5)),
            ..peer_syn()
        },
        TcpRepr {
            flags: TcpFlags::SYN | TcpFlags::RST,
            ..peer_syn()
        },
        TcpRepr {
            flags: TcpFlags::default(),
            ..peer_syn()
        },
    ] {
        let r = Connection::accept(
            config(),
            local_addr(),
            remote_addr(),
            &as_parsed(bad),
            LOCAL_ISN,
            T0,
        );
        assert_eq!(r.err(), Some(TcpError::Refused), "{bad:?}");
    }
}

#[test]
fn syn_received_bad_ack_gets_rst() {
    // RFC 9293 §3.10.7.4 fifth check, SYN-RECEIVED: an unacceptable ACK → <SEQ=SEG.ACK><CTL=RST>.
    let mut h = syn_received();
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 100),
            ..seg()
        }
    );
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 100,
            ack: None,
            flags: TcpFlags::RST,
            window: 0,
            ..out()
        }
    );
    assert_eq!(h.state(), State::SynReceived);
}

// ---- simultaneous open -------------------------------------------------------------------

#[test]
fn simultaneous_open() {
    // RFC 9293 Figure 8: SYN-SENT receives a SYN → SYN-RECEIVED, sends SYN,ACK with the
    // same ISN; the peer's ACK completes the handshake.
    let mut h = syn_sent();
    send!(h, peer_syn());
    assert_eq!(h.state(), State::SynReceived);
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN,
            ack: Some(REMOTE_ISN + 1),
            flags: TcpFlags::SYN,
            window: 16384,
            options: syn_opts(&config()),
            ..out()
        }
    );
    send!(h, seg());
    assert_eq!(h.state(), State::Established);
    recv_nothing!(h);
    h.write(b"x");
    recv!(
        h,
        TcpRepr {
            window: 16384,
            ..out()
        },
        b"x"
    );
}

#[test]
fn simultaneous_open_completed_by_peer_syn_ack() {
    // RFC 9293 Figure 8 line 6: the peer's SYN,ACK (seq = its ISN) moves us to ESTABLISHED.
    let mut h = syn_sent();
    send!(h, peer_syn());
    let _ = h.poll();
    send!(h, peer_syn_ack());
    assert_eq!(h.state(), State::Established);
    for s in h.poll() {
        assert_eq!(s.repr.flags, TcpFlags::default(), "only pure ACKs: {s:?}");
        assert_eq!(s.repr.seq, LOCAL_ISN + 1);
        assert_eq!(s.repr.ack, Some(REMOTE_ISN + 1));
        assert!(s.payload.is_empty());
    }
}

// ---- SYN retransmission ------------------------------------------------------------------

#[test]
fn syn_retries_back_off_exponentially_then_time_out() {
    // Regression class: no give-up, so a dead peer hangs the connection forever
    // (smoltcp #1034, #323).
    let cfg = Config {
        syn_retries: 3,
        user_timeout: Duration::from_secs(600),
        ..config()
    };
    let mut h = syn_sent_with(cfg.clone());
    let syn = our_syn(&cfg);
    // RFC 6298 §2.1 initial RTO 1 s, §5.5 doubling: retransmissions at +1, +3, +7 s.
    for at in [1_000u64, 3_000, 7_000] {
        let t = T0 + ms(at);
        assert_eq!(h.deadline(), Some(t));
        h.fire_at(t - Duration::from_micros(1));
        recv_nothing!(h);
        h.fire_at(t);
        recv!(h, syn);
        assert_eq!(h.state(), State::SynSent);
    }
    // The third retransmission was the last: the next expiry (8 s later) gives up.
    let t = T0 + ms(15_000);
    assert_eq!(h.deadline(), Some(t));
    h.fire_at(t);
    assert_eq!(h.state(), State::Closed);
    assert_eq!(h.conn.error(), Some(TcpError::TimedOut));
    assert_eq!(h.conn.send(b"x"), Err(TcpError::TimedOut));
    // Nothing to reset in SYN-SENT: the peer never answered.
    recv_nothing!(h);
    assert!(h.conn.is_closed());
    assert_eq!(h.deadline(), None);
}

#[test]
fn syn_retry_backoff_is_capped_by_max_rto() {
    let cfg = Config {
        syn_retries: 5,
        max_rto: Duration::from_secs(5),
        user_timeout: Duration::from_secs(600),
        ..config()
    };
    let mut h = syn_sent_with(cfg.clone());
    // 1, 2, 4, then capped at 5, 5: retransmissions at +1, +3, +7, +12, +17; give-up at +22.
    for at in [1_000u64, 3_000, 7_000, 12_000, 17_000] {
        assert_eq!(h.fire_next(), T0 + ms(at));
        recv!(h, our_syn(&cfg));
    }
    assert_eq!(h.fire_next(), T0 + ms(22_000));
    assert_eq!(h.conn.error(), Some(TcpError::TimedOut));
    assert_eq!(h.state(), State::Closed);
}

#[test]
fn syn_ack_after_syn_retransmission_establishes() {
    let mut h = syn_sent();
    h.fire_next();
    recv!(h, our_syn(&config()));
    h.advance(ms(100));
    send!(h, peer_syn_ack());
    assert_eq!(h.state(), State::Established);
    recv!(
        h,
        TcpRepr {
            window: 16384,
            ..out()
        }
    );
    // No retransmission timer is left running with nothing outstanding.
    assert_eq!(h.deadline(), None);
}

#[test]
fn syn_ack_is_retransmitted_with_backoff() {
    let syn = as_parsed(peer_syn());
    let mut h = syn_received();
    let sa = our_syn_ack(&config(), &syn);
    assert_eq!(h.fire_next(), T0 + ms(1_000));
    recv!(h, sa);
    assert_eq!(h.state(), State::SynReceived);
    assert_eq!(h.fire_next(), T0 + ms(3_000));
    recv!(h, sa);
    // The ACK completes the handshake and cancels the timer.
    send!(h, seg());
    assert_eq!(h.state(), State::Established);
    recv_nothing!(h);
    assert_eq!(h.deadline(), None);
}

#[test]
fn retransmitted_peer_syn_in_syn_received_is_answered_with_syn_ack() {
    // The peer lost our SYN-ACK and retransmits its SYN (RFC 9293 §3.10.7.4: a duplicate
    // SYN in SYN-RECEIVED is below the window; we answer with our SYN-ACK again).
    let mut h = syn_received();
    send!(h, peer_syn());
    let got = h.poll();
    assert!(!got.is_empty());
    for s in got {
        assert_eq!(s.repr.seq, LOCAL_ISN, "{s:?}");
        assert_eq!(s.repr.ack, Some(REMOTE_ISN + 1), "{s:?}");
    }
    assert_eq!(h.state(), State::SynReceived);
}

/// A burst of duplicate SYNs in SYN-RECEIVED gets one SYN-ACK, not one each: like Linux
/// (`tcp_check_req` through `tcp_oow_rate_limited`), at most one per
/// `Config::invalid_ack_interval` (500 ms); the retransmission timer resends it anyway.
#[test]
fn duplicate_syns_in_syn_received_get_rate_limited_syn_acks() {
    let mut h = syn_received();
    let mut answered = 0;
    for _ in 0..10 {
        send!(h, peer_syn());
        answered += h.poll().len();
    }
    assert_eq!(answered, 1, "SYN-ACKs for 10 duplicate SYNs at once");
    assert_eq!(h.conn.stats().oow_acks_suppressed, 9);
    // Half a second later the next duplicate is answered again.
    h.advance(ms(500));
    send!(h, peer_syn());
    assert_eq!(h.poll().len(), 1);
    send!(h, peer_syn());
    assert!(h.poll().is_empty());
    assert_eq!(h.state(), State::SynReceived);
}

// ---- refusal -----------------------------------------------------------------------------

#[test]
fn rst_ack_in_syn_sent_is_refused() {
    let mut h = syn_sent();
    send!(
        h,
        TcpRepr {
            seq: SeqNumber(0),
            ack: Some(LOCAL_ISN + 1),
            flags: TcpFlags::RST,
            window: 0,
            ..seg()
        }
    );
    assert_eq!(h.state(), State::Closed);
    assert_eq!(h.conn.error(), Some(TcpError::Refused));
    recv_nothing!(h);
    assert_eq!(h.conn.send(b"x"), Err(TcpError::Refused));
    assert_eq!(h.read(10), Err(TcpError::Refused));
    assert!(h.conn.is_closed());
}

#[test]
fn rst_with_unacceptable_ack_in_syn_sent_is_ignored() {
    // RFC 9293 §3.10.7.3: if the ACK is not acceptable, drop the RST.
    let mut h = syn_sent();
    for ack in [LOCAL_ISN, LOCAL_ISN + 2, LOCAL_ISN - 100] {
        send!(
            h,
            TcpRepr {
                seq: SeqNumber(0),
                ack: Some(ack),
                flags: TcpFlags::RST,
                ..seg()
            }
        );
        assert_eq!(h.state(), State::SynSent);
        recv_nothing!(h);
    }
}

#[test]
fn rst_without_ack_in_syn_sent_is_ignored() {
    let mut h = syn_sent();
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN,
            ack: None,
            flags: TcpFlags::RST,
            ..seg()
        }
    );
    assert_eq!(h.state(), State::SynSent);
    assert_eq!(h.conn.error(), None);
    recv_nothing!(h);
}

#[test]
fn bad_ack_in_syn_sent_gets_rst() {
    // RFC 9293 §3.10.7.3: SEG.ACK =< ISS or SEG.ACK > SND.NXT → <SEQ=SEG.ACK><CTL=RST>.
    for ack in [LOCAL_ISN, LOCAL_ISN + 10, LOCAL_ISN - 5] {
        let mut h = syn_sent();
        send!(
            h,
            TcpRepr {
                ack: Some(ack),
                ..peer_syn_ack()
            }
        );
        recv!(
            h,
            TcpRepr {
                seq: ack,
                ack: None,
                flags: TcpFlags::RST,
                window: 0,
                ..out()
            }
        );
        assert_eq!(h.state(), State::SynSent);
        assert_eq!(h.conn.error(), None);
    }
}

#[test]
fn plain_ack_in_syn_sent_with_bad_ack_gets_rst() {
    let mut h = syn_sent();
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 7),
            ..seg()
        }
    );
    recv!(
        h,
        TcpRepr {
            seq: LOCAL_ISN + 7,
            ack: None,
            flags: TcpFlags::RST,
            window: 0,
            ..out()
        }
    );
    assert_eq!(h.state(), State::SynSent);
}

// ---- MSS negotiation ---------------------------------------------------------------------

fn established_with_peer_opts(cfg: Config, opts: TcpOptions, window: u16) -> H {
    let mut h = syn_sent_with(cfg);
    send!(
        h,
        TcpRepr {
            options: opts,
            window,
            ..peer_syn_ack()
        }
    );
    assert_eq!(h.state(), State::Established);
    let _ = h.poll();
    if h.cfg.window_scaling && opts.window_scale.is_some() {
        h.shift = min_shift(h.cfg.rx_buffer);
    }
    h
}

#[test]
fn peer_mss_caps_segment_size() {
    let mut h = established_with_peer_opts(config(), opts_mss(100), 65535);
    h.write(&[7u8; 300]);
    let w = h.win();
    recv!(
        h,
        [
            (TcpRepr { window: w, ..out() }, [7u8; 100]),
            (
                TcpRepr {
                    seq: LOCAL_ISN + 101,
                    window: w,
                    ..out()
                },
                [7u8; 100]
            ),
            (
                TcpRepr {
                    seq: LOCAL_ISN + 201,
                    window: w,
                    ..out()
                },
                [7u8; 100]
            ),
        ]
    );
}

#[test]
fn missing_mss_option_defaults_to_536() {
    // RFC 9293 §3.7.1: without an MSS option, assume 536.
    let mut h = established_with_peer_opts(config(), TcpOptions::default(), 65535);
    h.write(&[1u8; 1072]);
    let w = h.win();
    recv!(
        h,
        [
            (TcpRepr { window: w, ..out() }, [1u8; 536]),
            (
                TcpRepr {
                    seq: LOCAL_ISN + 537,
                    window: w,
                    ..out()
                },
                [1u8; 536]
            ),
        ]
    );
}

#[test]
fn our_mss_caps_segments_even_if_peer_allows_more() {
    let cfg = Config {
        mss: 1000,
        ..config()
    };
    let mut h = established_with_peer_opts(cfg, opts_mss(9000), 65535);
    h.write(&[2u8; 2000]);
    let w = h.win();
    recv!(
        h,
        [
            (TcpRepr { window: w, ..out() }, [2u8; 1000]),
            (
                TcpRepr {
                    seq: LOCAL_ISN + 1001,
                    window: w,
                    ..out()
                },
                [2u8; 1000]
            ),
        ]
    );
}

#[test]
fn mss_of_passive_open_comes_from_the_syn() {
    let syn = TcpRepr {
        options: opts_mss(300),
        ..peer_syn()
    };
    let mut h = syn_received_from(config(), syn);
    send!(h, seg());
    h.write(&[3u8; 600]);
    let w = h.win();
    recv!(
        h,
        [
            (TcpRepr { window: w, ..out() }, [3u8; 300]),
            (
                TcpRepr {
                    seq: LOCAL_ISN + 301,
                    window: w,
                    ..out()
                },
                [3u8; 300]
            ),
        ]
    );
}

// ---- window scale negotiation ------------------------------------------------------------

#[test]
fn window_scale_for_rx_buffers_of_2_pow_19_and_more() {
    // smoltcp #253: buffers of 2^19 bytes and more were mis-advertised.
    for (rx, shift) in [
        (1usize << 16, 1u8),
        (1 << 19, 4),
        (1 << 20, 5),
        (1 << 23, 8),
    ] {
        let cfg = Config {
            rx_buffer: rx,
            ..config()
        };
        let mut h = connect_with(cfg.clone());
        recv!(
            h,
            TcpRepr {
                seq: LOCAL_ISN,
                ack: None,
                flags: TcpFlags::SYN,
                window: 65535,
                options: TcpOptions {
                    mss: Some(1460),
                    window_scale: Some(shift),
                    sack_permitted: true,
                    ..TcpOptions::default()
                },
                ..out()
            }
        );
        send!(h, peer_syn_ack());
        // The first scaled window: the whole buffer >> shift.
        recv!(
            h,
            TcpRepr {
                window: (rx >> shift) as u16,
                ..out()
            }
        );
    }
}

#[test]
fn window_of_2_pow_19_buffer_shrinks_by_received_bytes() {
    // smoltcp #253 continued: with shift 4, 1000 bytes queued → (524288 - 1000) >> 4.
    let mut h = established_with(Config {
        rx_buffer: 1 << 19,
        ..config()
    });
    assert_eq!(h.shift, 4);
    send!(h, seg(), &[9u8; 1000]);
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 1001),
            window: ((524288 - 1000) >> 4) as u16,
            ..out()
        }
    );
}

#[test]
fn no_window_scaling_unless_peer_offers_it_active() {
    // smoltcp #518 (stale scale): we offered shift 3, the peer did not answer with WS, so
    // our windows go out unscaled (capped at 65535) and the peer's are taken unscaled.
    let cfg = Config {
        rx_buffer: 256 * 1024,
        ..config()
    };
    let mut h = syn_sent_with(cfg);
    send!(
        h,
        TcpRepr {
            options: opts_mss(1460),
            window: 1000,
            ..peer_syn_ack()
        }
    );
    recv!(
        h,
        TcpRepr {
            window: 65535,
            ..out()
        }
    );
    // The peer's window of 1000 is not scaled by anything: exactly 1000 bytes fit.
    h.conn.set_nodelay(true);
    h.write(&[5u8; 1000]);
    recv!(
        h,
        TcpRepr {
            window: 65535,
            ..out()
        },
        [5u8; 1000]
    );
    h.write(&[5u8; 1000]);
    recv_nothing!(h);
}

#[test]
fn no_window_scaling_unless_peer_offers_it_passive() {
    // smoltcp #518: a SYN without WS means neither side scales, whatever our config.
    let cfg = Config {
        rx_buffer: 256 * 1024,
        ..config()
    };
    let syn = TcpRepr {
        options: opts_mss(1460),
        window: 2000,
        ..peer_syn()
    };
    let mut h = syn_received_from(cfg, syn);
    assert_eq!(h.shift, 0);
    send!(
        h,
        TcpRepr {
            window: 1500,
            ..seg()
        },
        b"hi"
    );
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 3),
            window: 65535,
            ..out()
        }
    );
    h.conn.set_nodelay(true);
    h.write(&[1u8; 1500]);
    // Peer window 1500, unscaled; MSS 1460 → one full segment and a 40-byte one.
    recv!(
        h,
        [
            (
                TcpRepr {
                    ack: Some(REMOTE_ISN + 3),
                    window: 65535,
                    ..out()
                },
                [1u8; 1460]
            ),
            (
                TcpRepr {
                    seq: LOCAL_ISN + 1461,
                    ack: Some(REMOTE_ISN + 3),
                    window: 65535,
                    ..out()
                },
                [1u8; 40]
            ),
        ]
    );
    h.write(&[1u8; 100]);
    recv_nothing!(h);
}

#[test]
fn no_window_scaling_when_disabled_locally_even_if_peer_offers() {
    let cfg = Config {
        rx_buffer: 256 * 1024,
        window_scaling: false,
        ..config()
    };
    let syn = TcpRepr {
        options: TcpOptions {
            window_scale: Some(5),
            ..peer_syn_opts()
        },
        ..peer_syn()
    };
    let mut h = syn_received_from(cfg, syn);
    // Peer's window field 100 must be read unscaled (not 100 << 5 = 3200).
    send!(
        h,
        TcpRepr {
            window: 100,
            ..seg()
        }
    );
    assert_eq!(h.state(), State::Established);
    h.conn.set_nodelay(true);
    h.write(&[4u8; 100]);
    recv!(
        h,
        TcpRepr {
            window: 65535,
            ..out()
        },
        [4u8; 100]
    );
    h.write(&[4u8; 100]);
    recv_nothing!(h);
}

#[test]
fn peer_window_is_scaled_by_its_shift() {
    let mut h = established_with_peer_opts(
        config(),
        TcpOptions {
            window_scale: Some(2),
            ..peer_syn_opts()
        },
        65535,
    );
    // Window field 500 << 2 = 2000 bytes.
    send!(
        h,
        TcpRepr {
            window: 500,
            ..seg()
        }
    );
    h.conn.set_nodelay(true);
    h.write(&[6u8; 2000]);
    let w = h.win();
    recv!(
        h,
        [
            (TcpRepr { window: w, ..out() }, [6u8; 1460]),
            (
                TcpRepr {
                    seq: LOCAL_ISN + 1461,
                    window: w,
                    ..out()
                },
                [6u8; 540]
            ),
        ]
    );
    h.write(&[6u8; 100]);
    recv_nothing!(h);
}

#[test]
fn peer_shift_above_14_is_clamped() {
    // Demikernel #1244 / RFC 7323 §2.3: a shift above 14 is used as 14. With window field 1
    // the peer offers 1 << 14 = 16384 bytes; unclamped (255) it would overflow.
    let cfg = Config {
        tx_buffer: 64 * 1024,
        ..config()
    };
    let mut h = established_with_peer_opts(
        cfg,
        TcpOptions {
            window_scale: Some(255),
            ..peer_syn_opts()
        },
        65535,
    );
    send!(h, TcpRepr { window: 1, ..seg() });
    h.conn.set_nodelay(true);
    h.write(&[8u8; 1000]);
    let w = h.win();
    recv!(h, TcpRepr { window: w, ..out() }, [8u8; 1000]);
    // Window field 0 is zero whatever the shift: nothing more goes out.
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 1001),
            window: 0,
            ..seg()
        }
    );
    h.write(&[8u8; 10]);
    recv_nothing!(h);
}

#[test]
fn peer_shift_15_limits_flight_to_16384_bytes() {
    // RFC 7323 §2.3: shift 15 is treated as 14. Grow cwnd beyond 16384 first, then offer
    // window field 1: at most 1 << 14 bytes may be in flight (not 1 << 15).
    let cfg = Config {
        tx_buffer: 256 * 1024,
        ..config()
    };
    let mut h = established_with_peer_opts(
        cfg,
        TcpOptions {
            window_scale: Some(15),
            ..peer_syn_opts()
        },
        65535,
    );
    h.conn.set_nodelay(true);
    let data = vec![0u8; 100_000];
    assert_eq!(h.conn.send(&data), Ok(100_000));
    // Initial window: 10 segments (RFC 6928). ACK them all with window field 2 (= 32768).
    let first = h.poll();
    let sent: usize = first.iter().map(|s| s.payload.len()).sum();
    assert_eq!(sent, 14600);
    h.advance(ms(10));
    for s in &first {
        send!(
            h,
            TcpRepr {
                ack: Some(s.repr.seq + s.payload.len()),
                window: 2,
                ..seg()
            }
        );
    }
    let second: usize = h.poll().iter().map(|s| s.payload.len()).sum();
    // cwnd has grown to about 29200 > 16384 ... and the window is 2 << 14 = 32768.
    assert!(
        second > 16384,
        "cwnd should allow more than 16384, sent {second}"
    );
    assert!(second <= 32768, "sent {second}");
    // Now everything is acked with window field 1: 16384 bytes may be in flight.
    h.advance(ms(10));
    send!(
        h,
        TcpRepr {
            ack: Some(LOCAL_ISN + 1 + 14600 + second),
            window: 1,
            ..seg()
        }
    );
    let third: usize = h.poll().iter().map(|s| s.payload.len()).sum();
    assert!(third <= 16384, "flight {third} exceeds 1 << 14");
    assert!(
        third > 16384 - 1460,
        "flight {third} should fill the window"
    );
}

#[test]
fn our_advertised_window_is_scaled_for_large_buffers_after_data() {
    let mut h = established_with(Config {
        rx_buffer: 256 * 1024,
        ..config()
    });
    assert_eq!(h.shift, 3);
    send!(h, seg(), &[1u8; 1460]);
    recv!(
        h,
        TcpRepr {
            ack: Some(REMOTE_ISN + 1461),
            window: ((262144 - 1460) >> 3) as u16,
            ..out()
        }
    );
}
