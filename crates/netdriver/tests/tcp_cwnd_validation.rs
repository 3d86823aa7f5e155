//! Congestion-window validation (RFC 7661 §4): the window grows only while the sender
//! actually uses it. Regression for the unbounded growth found by the simulated demo: a
//! lossless transfer paced by the application ended with a 64 MB cwnd.

mod tcp_support;

use netdriver::tcp::Config;
use tcp_support::*;

/// An application that writes one small message per round trip never fills the window,
/// so the window must stay where it started however many messages are acknowledged.
#[test]
fn application_limited_sender_does_not_grow_cwnd() {
    let mut p = Pair::new(config(), config(), netdriver::time::Instant::from_millis(1));
    p.run_until_quiet(100);
    let initial = p.a.stats().cwnd;
    assert!(initial > 0);
    let mut buf = [0u8; 4096];
    for _ in 0..500 {
        assert_eq!(p.a.send(&[7u8; 100]), Ok(100));
        p.run_until_quiet(100);
        // Let the delayed ACK fire so every message is acknowledged before the next.
        while p.a.stats().bytes_in_flight > 0 {
            assert!(p.step_timers(p.now + ms(1000)), "ACK never came");
        }
        assert_eq!(p.b.recv(&mut buf), Ok(100));
    }
    assert_eq!(p.a.stats().bytes_acked, 50_000);
    assert_eq!(
        p.a.stats().cwnd,
        initial,
        "cwnd grew while the sender never used more than 100 bytes of it"
    );
}

/// The same connection does grow its window once the application keeps it full.
#[test]
fn window_limited_sender_grows_cwnd() {
    let cfg = Config {
        nagle: false,
        rx_buffer: 1 << 20,
        tx_buffer: 1 << 20,
        ..config()
    };
    let mut p = Pair::new(cfg.clone(), cfg, netdriver::time::Instant::from_millis(1));
    p.run_until_quiet(100);
    let initial = p.a.stats().cwnd;
    let mut buf = vec![0u8; 1 << 16];
    let mut received = 0;
    for _ in 0..50 {
        while p.a.send(&[1u8; 8192]).is_ok() {}
        p.run_until_quiet(1000);
        p.step_timers(p.now + ms(1000));
        while let Ok(n) = p.b.recv(&mut buf) {
            if n == 0 {
                break;
            }
            received += n;
        }
    }
    assert!(received > 4 << 20, "only {received} bytes moved");
    assert!(
        p.a.stats().cwnd > initial,
        "cwnd {} did not grow from {initial} under a full window",
        p.a.stats().cwnd
    );
}
