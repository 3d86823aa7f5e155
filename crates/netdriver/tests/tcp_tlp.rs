//! Tail Loss Probe (RFC 8985 §7): the probe timeout (PTO = 2·SRTT, at least `tlp_min_pto`, plus the delayed-ACK
//! allowance for a lone segment, never later than the RTO), the probe's content (new data
//! if the window allows, else the last segment), one probe per episode, the probe's ACK
//! starting SACK recovery, the RTO behind a lost probe, and the congestion response to a
//! loss the probe repaired (§7.4.2).
//!
//! The harness handshake gives one RTT sample of 10 ms: SRTT 10 ms, RTO 200 ms (the floor).

mod tcp_support_b;

use netdriver::tcp::Config;
use tcp_support_b::*;

fn tlp_config() -> Config {
    Config {
        tail_loss_probe: true,
        ..test_config()
    }
}

/// Ten full segments (the initial window) sent at once at `t.now`, nodelay.
fn ten_sent(config: Config, peer: PeerOpts) -> (Tcb, Vec<u8>) {
    let mut t = Tcb::established(config, peer);
    t.conn.set_nodelay(true);
    assert_eq!(t.stats().srtt, Some(ms(10)));
    let d = data(10_000);
    t.app_send(&d);
    t.expect_full_segments(&d, 0..10);
    t.expect_none();
    (t, d)
}

#[test]
fn pto_is_two_srtt_after_new_data() {
    let (t, _) = ten_sent(tlp_config(), PeerOpts::default());
    // §7.2: 2·SRTT = 20 ms, well before the RTO (200 ms).
    assert_eq!(t.deadline(), t.now + ms(20));
}

/// The PTO is at least `tlp_min_pto`: 2·SRTT of a datacenter path (tens of µs) is shorter
/// than a loaded host takes to schedule the peer's ACK, and such probes were nearly all
/// spurious on the test bed (and woke sleeping queue drivers per message). The harness's
/// SRTT is 10 ms, so a 30 ms floor stands in for the 2 ms default on a 50 µs path.
#[test]
fn pto_has_a_floor() {
    let floor = Config {
        tlp_min_pto: ms(30),
        ..tlp_config()
    };
    let (mut t, d) = ten_sent(floor, PeerOpts::default());
    let sent = t.now;
    assert_eq!(
        t.deadline(),
        sent + ms(30),
        "2·SRTT (20 ms) under the floor"
    );
    // Nothing goes out at 2·SRTT; the probe does at the floor.
    assert_eq!(t.fire(), sent + ms(30));
    t.expect(t.out().seq(l(9000)).payload(&d[9000..10_000]));
    assert_eq!(t.stats().tail_loss_probes, 1);
    // Without a floor, 2·SRTT as RFC 8985 §7.2 has it.
    let none = Config {
        tlp_min_pto: ms(0),
        ..tlp_config()
    };
    let (t, _) = ten_sent(none, PeerOpts::default());
    assert_eq!(t.deadline(), t.now + ms(20));
}

#[test]
fn lost_tail_is_repaired_by_a_probe_at_two_srtt() {
    let (mut t, d) = ten_sent(tlp_config(), PeerOpts::default());
    let sent = t.now;
    // Segments 0-7 are acknowledged; 8 arrived but its ACK waits for a second segment at
    // the peer; 9 is lost. Two segments are in flight: no delayed-ACK allowance.
    t.advance(ms(10));
    t.send(t.seg().ack(l(8000)));
    t.expect_none();
    let ack_at = t.now;
    assert_eq!(t.deadline(), ack_at + ms(20), "the ACK restarts the PTO");
    assert_eq!(t.fire(), ack_at + ms(20));
    // §7.3: no unsent data, so the probe is the highest-sequence segment.
    t.expect(t.out().seq(l(9000)).payload(&d[9000..10_000]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.tail_loss_probes, 1);
    assert_eq!(s.retransmitted_segments, 1);
    assert_eq!(s.rto_timeouts, 0);
    // §7.3: the RTO, not a second PTO, guards the probe.
    assert_eq!(t.deadline(), t.now + ms(200));
    // The probe fills the tail: everything is acknowledged 40 ms after the flight was sent
    // instead of after the 200 ms RTO.
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    t.expect_none();
    assert_eq!(t.now, sent + ms(40));
    assert_eq!(t.stats().bytes_in_flight, 0);
    assert_eq!(
        t.conn.poll_timeout(),
        None,
        "nothing outstanding: no PTO, no RTO"
    );
    assert_eq!(t.stats().rto_timeouts, 0);
    assert_eq!(t.stats().fast_retransmits, 0);
    // The ACK equal to TLP.end_seq does not yet tell whether the probe repaired a loss;
    // the next ACK beyond it without a D-SACK does (§7.4.2): a congestion response with
    // the flight of the probe's time (2000 bytes, so ssthresh = 2 SMSS).
    assert_eq!(t.stats().tlp_recoveries, 0);
    let more = data(1000);
    t.advance(ms(10));
    t.app_send(&more);
    t.expect(t.out().seq(l(10_000)).payload(&more));
    t.advance(ms(10));
    t.send(t.seg().ack(l(11_000)));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.tlp_recoveries, 1);
    assert_eq!(s.ssthresh, 2000);
    assert_eq!(s.cwnd, 2000);
}

#[test]
fn probe_ack_with_sack_starts_recovery_for_the_rest() {
    let (mut t, d) = ten_sent(tlp_config(), PeerOpts::default());
    // Segments 7, 8 and 9 lost.
    t.advance(ms(10));
    t.send(t.seg().ack(l(7000)));
    t.expect_none();
    let pto_at = t.now + ms(20);
    assert_eq!(t.fire(), pto_at);
    t.expect(t.out().seq(l(9000)).payload(&d[9000..10_000]));
    t.expect_none();
    // The probe arrives: its SACK shows 7 and 8 missing below it. Both were sent a PTO
    // before the probe, so they count as lost at once (RACK's rule for the probe) and fast
    // recovery starts: the first hole is resent immediately.
    t.advance(ms(10));
    t.send(t.seg().ack(l(7000)).sack(&[(l(9000), l(10_000))]));
    t.expect(t.out().seq(l(7000)).payload(&d[7000..8000]));
    // ssthresh = max(FlightSize / 2, 2 SMSS) = 2000 with 3000 bytes in flight; the pipe
    // (7 resent, 8 lost, 9 SACKed) is 1000, so the second hole goes out at once too
    // (RFC 6675 NextSeg rule 1: it is deemed lost).
    t.expect(t.out().seq(l(8000)).payload(&d[8000..9000]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.fast_retransmits, 1);
    assert_eq!(s.ssthresh, 2000);
    assert_eq!(s.tail_loss_probes, 1);
    assert_eq!(s.retransmitted_segments, 3);
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.rto_timeouts, 0);
    assert_eq!(s.bytes_in_flight, 0);
    assert_eq!(s.cwnd, 2000);
    // Recovery made the congestion response; the probe adds none.
    assert_eq!(s.tlp_recoveries, 0);
    assert_eq!(t.conn.poll_timeout(), None);
}

#[test]
fn probe_sends_new_data_when_the_window_allows() {
    // 12 segments queued; cwnd (10 segments) holds back the last two.
    let mut t = Tcb::established(tlp_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(12_000);
    t.app_send(&d);
    t.expect_full_segments(&d, 0..10);
    t.expect_none();
    let sent = t.now;
    // Every ACK is lost: the PTO fires 2·SRTT after the last new data.
    assert_eq!(t.fire(), sent + ms(20));
    // §7.3: a previously unsent segment, beyond cwnd (the peer's window allows it).
    t.expect(t.out().seq(l(10_000)).payload(&d[10_000..11_000]));
    t.expect_none();
    assert_eq!(t.stats().tail_loss_probes, 1);
    assert_eq!(t.stats().retransmitted_segments, 0);
    // One probe per episode: next comes the RTO, re-armed at the probe.
    assert_eq!(t.deadline(), sent + ms(220));
}

#[test]
fn lone_segment_probe_takes_the_rto_instant() {
    // One segment in flight: PTO = 2·SRTT + 200 ms (the peer's delayed ACK) = 220 ms,
    // clamped to the RTO's expiry at 200 ms (§7.2). The probe replaces the RTO: same
    // segment, no RTO backoff and no collapse of cwnd.
    let mut t = Tcb::established(tlp_config(), PeerOpts::default());
    t.conn.set_nodelay(true);
    let d = data(500);
    t.app_send(&d);
    t.expect(t.out().payload(&d));
    let sent = t.now;
    assert_eq!(t.fire(), sent + ms(200));
    t.expect(t.out().payload(&d));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.tail_loss_probes, 1);
    assert_eq!(s.rto_timeouts, 0);
    assert_eq!(s.rto, ms(200));
    assert_eq!(s.cwnd, 10_000);
    // The probe is lost too: the RTO fires one RTO after it, as before.
    assert_eq!(t.fire(), sent + ms(400));
    t.expect(t.out().payload(&d));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.rto_timeouts, 1);
    assert_eq!(s.tail_loss_probes, 1);
    assert_eq!(s.cwnd, 1000);
}

#[test]
fn rto_fires_when_the_probe_is_lost_too() {
    let (mut t, d) = ten_sent(tlp_config(), PeerOpts::default());
    t.advance(ms(10));
    t.send(t.seg().ack(l(8000)));
    let probe_at = t.fire();
    t.expect(t.out().seq(l(9000)).payload(&d[9000..10_000]));
    t.expect_none();
    // No second probe: the RTO fires one RTO after the probe and goes back to SND.UNA.
    assert_eq!(t.fire(), probe_at + ms(200));
    t.expect(t.out().seq(l(8000)).payload(&d[8000..9000]));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.rto_timeouts, 1);
    assert_eq!(s.tail_loss_probes, 1);
    assert_eq!(s.cwnd, 1000);
    // Backed off: the next RTO is 400 ms later, with no PTO in between (RTO recovery).
    assert_eq!(t.deadline(), t.now + ms(400));
}

#[test]
fn no_probe_when_nothing_is_outstanding() {
    let (mut t, _) = ten_sent(tlp_config(), PeerOpts::default());
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)));
    t.expect_none();
    assert_eq!(t.conn.poll_timeout(), None);
    // Time passes: nothing is sent.
    t.tick(ms(1000));
    t.expect_none();
    assert_eq!(t.stats().tail_loss_probes, 0);
}

#[test]
fn no_probe_without_sack() {
    // Without SACK the probe's ACK cannot show the holes: the RTO handles the tail.
    let (t, _) = ten_sent(tlp_config(), PeerOpts::no_sack());
    assert_eq!(t.deadline(), t.now + ms(200));
}

#[test]
fn no_probe_while_sack_shows_holes_or_when_disabled() {
    // RFC 8985 §7.2: SACKed segments mean loss detection has what it needs.
    let (mut t, _) = ten_sent(tlp_config(), PeerOpts::default());
    t.advance(ms(10));
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(3000))]));
    t.expect_none();
    // No PTO: the next deadline is RACK's reorder timer (min_RTT/4 = 2.5 ms, RFC 8985
    // §6.2 step 6), then the RTO.
    assert_eq!(
        t.deadline(),
        t.now + netdriver::time::Duration::from_micros(2500)
    );
    // Without RACK the RTO is all that is left.
    let (mut t, _) = ten_sent(
        Config {
            rack: false,
            ..tlp_config()
        },
        PeerOpts::default(),
    );
    t.advance(ms(10));
    t.send(t.seg().ack(l(1000)).sack(&[(l(2000), l(3000))]));
    t.expect_none();
    assert_eq!(t.deadline(), t.now + ms(200), "RTO, restarted by the ACK");
    // Disabled in the config.
    let (t, _) = ten_sent(test_config(), PeerOpts::default());
    assert_eq!(t.deadline(), t.now + ms(200));
}

#[test]
fn dsack_for_the_probe_means_no_loss() {
    // The ACK of segment 9 was lost, not the segment: the probe is a duplicate and the
    // peer reports it with a D-SACK (RFC 2883). No congestion response (§7.4.1).
    let (mut t, d) = ten_sent(tlp_config(), PeerOpts::default());
    t.advance(ms(10));
    t.send(t.seg().ack(l(8000)));
    t.fire();
    t.expect(t.out().seq(l(9000)).payload(&d[9000..10_000]));
    t.advance(ms(10));
    t.send(t.seg().ack(l(10_000)).sack(&[(l(9000), l(10_000))]));
    t.expect_none();
    let more = data(1000);
    t.app_send(&more);
    t.expect(t.out().seq(l(10_000)).payload(&more));
    t.advance(ms(10));
    t.send(t.seg().ack(l(11_000)));
    t.expect_none();
    let s = t.stats();
    assert_eq!(s.tlp_recoveries, 0);
    assert_eq!(s.ssthresh, usize::MAX);
}
