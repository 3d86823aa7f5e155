//! The reply carries the ACK of a request (`Config::reply_carries_ack`), and the window
//! update after a passive open's first read (RFC 9293 §3.8.6.2.2, §3.8.6.3; RFC 5681
//! §4.2).
//!
//! A passive open whose peer sends one short request and waits for the answer: Linux
//! acknowledges the request at once (quick-ACK) and then sends the answer, two segments
//! where one would do. With `reply_carries_ack` the request's ACK is left to the
//! delayed-ACK rules, so that the answer carries it; the owner releases it when the reader
//! has read everything and waits for more (`Connection::reader_waiting`), which is when a
//! peer holding a second small write back by Nagle would otherwise wait for the timer.

mod tcp_support;

use tcp_support::*;

/// A 256 KiB receive buffer (window scaling in effect, so that a SYN-ACK's unscaled window
/// is less than the buffer), delayed ACKs of 40 ms, the quick-ACK budget at its default.
fn cfg(reply_carries_ack: bool) -> Config {
    Config {
        rx_buffer: 256 * 1024,
        delayed_ack: Some(ms(40)),
        reply_carries_ack,
        ..config()
    }
}

/// A passive open with `cfg` whose handshake the peer completed (its ACK, no data).
fn accepted(cfg: Config) -> H {
    let peer = TcpRepr {
        options: TcpOptions {
            window_scale: Some(7),
            ..peer_syn_opts()
        },
        ..peer_syn()
    };
    let mut h = syn_received_from(cfg, peer);
    send!(h, seg());
    assert_eq!(h.state(), State::Established);
    recv_nothing!(h);
    h
}

/// The peer's 64-byte request, with PSH.
fn request(h: &mut H) -> Vec<u8> {
    let req: Vec<u8> = (0..64u8).collect();
    send!(
        h,
        TcpRepr {
            flags: TcpFlags::PSH,
            ..seg()
        },
        &req
    );
    req
}

/// Our answer of `n` bytes, acknowledging `acked` request bytes.
fn answer(h: &H, acked: usize) -> TcpRepr {
    TcpRepr {
        ack: Some(REMOTE_ISN + 1 + acked),
        window: h.win(),
        ..out()
    }
}

#[test]
fn the_answer_carries_the_ack_of_a_request() {
    let mut h = accepted(cfg(true));
    let req = request(&mut h);
    // Held for the answer: nothing now, the delayed-ACK timer armed.
    recv_nothing!(h);
    assert!(h.conn.reply_ack_held());
    assert_eq!(h.deadline(), Some(h.now + ms(40)));
    assert_eq!(h.read_all(), req);
    // The first read of the connection sends no window update either.
    recv_nothing!(h);
    h.advance(ms(1));
    h.write(b"answer");
    let a = answer(&h, 64);
    recv!(h, a, b"answer");
    assert!(!h.conn.reply_ack_held());
}

#[test]
fn without_the_option_a_request_is_quick_acked_as_linux_does() {
    let mut h = accepted(cfg(false));
    let req = request(&mut h);
    let ack = TcpRepr {
        ack: Some(REMOTE_ISN + 1 + 64),
        window: h.win(),
        ..out()
    };
    recv!(h, ack);
    assert!(!h.conn.reply_ack_held());
    assert_eq!(h.read_all(), req);
    recv_nothing!(h);
}

#[test]
fn a_reader_that_waits_for_more_releases_the_held_ack_at_once() {
    let mut h = accepted(cfg(true));
    // A peer that holds its next small write back by Nagle until this is acknowledged.
    let req = request(&mut h);
    recv_nothing!(h);
    assert_eq!(h.read_all(), req);
    h.conn.reader_waiting();
    let ack = answer(&h, 64);
    recv!(h, ack);
    assert!(!h.conn.reply_ack_held());
    // Nothing is owed any more: waiting again sends nothing.
    h.conn.reader_waiting();
    recv_nothing!(h);
}

#[test]
fn a_held_ack_goes_out_at_the_delayed_ack_timeout() {
    let mut h = accepted(cfg(true));
    request(&mut h);
    recv_nothing!(h);
    let at = h.fire_next();
    assert_eq!(at, T0 + ms(40));
    let ack = answer(&h, 64);
    recv!(h, ack);
}

#[test]
fn turning_the_option_off_releases_a_held_ack() {
    let mut h = accepted(cfg(true));
    request(&mut h);
    recv_nothing!(h);
    h.conn.set_reply_carries_ack(false);
    let ack = answer(&h, 64);
    recv!(h, ack);
    // From now on requests are quick-ACKed.
    let req2: Vec<u8> = vec![7; 10];
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 1 + 64,
            flags: TcpFlags::PSH,
            ..seg()
        },
        &req2
    );
    let ack = answer(&h, 74);
    recv!(h, ack);
}

#[test]
fn segments_that_are_not_a_short_request_are_still_quick_acked() {
    let mut h = accepted(cfg(true));
    // No PSH: more of the message follows. (104 bytes: a multiple of the window scale's
    // 8, so that the window the next ACK offers is the unread buffer's, rounded down.)
    let part = vec![1u8; 104];
    send!(h, seg(), &part);
    let ack = answer(&h, 104);
    recv!(h, ack);
    // A full-sized segment with PSH: a sender in slow start.
    let full = vec![2u8; usize::from(MSS)];
    send!(
        h,
        TcpRepr {
            seq: REMOTE_ISN + 1 + 104,
            flags: TcpFlags::PSH,
            ..seg()
        },
        &full
    );
    let ack = answer(&h, 104 + usize::from(MSS));
    recv!(h, ack);
}

/// The window-update rule measures what the peer may still send against the largest
/// window we offered, not against the buffer: a SYN-ACK offers at most 64 KiB unscaled,
/// and reading a 64-byte request out of a 256 KiB buffer used to find the peer's 64 KiB
/// "fallen to half the buffer" and send a pure ACK for nothing before the answer.
#[test]
fn the_first_read_of_a_passive_open_sends_no_window_update() {
    let mut h = accepted(Config {
        quick_ack_segments: 0,
        ..cfg(false)
    });
    let req = request(&mut h);
    recv_nothing!(h);
    assert_eq!(h.read_all(), req);
    recv_nothing!(h);
    h.write(b"answer");
    let a = answer(&h, 64);
    recv!(h, a, b"answer");
}
