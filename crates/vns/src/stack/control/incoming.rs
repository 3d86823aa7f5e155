//! Accepted channels: each sends a preamble (magic, version, class, flags) and, where the
//! stacks hold a channel key, completes the authentication exchange before it joins the
//! stack (`docs/wire-format.md`). A hello channel (class byte 2) joins nothing: it gets
//! this stack's hello (its RSS, [`crate::hello`]) and is closed. The control task reads
//! them without blocking.

use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use netsched::ChannelClass;
use tracing::{debug, warn};

use super::super::auth;
use super::super::core::Core;
use super::state::incoming::{Incoming, Kind, Stage};
use super::state::Control;
use super::MAX_PENDING_PREAMBLES;

/// The first bytes on every channel a stack opens: magic, version, channel class, a
/// flags byte ([`auth::FLAG_AUTH`]: an authentication exchange follows) and a reserved
/// zero byte. The acceptor reads them before the channel joins the endpoint, so both
/// ends agree on the channel's class (documented in `docs/wire-format.md`).
pub(crate) const PREAMBLE_LEN: usize = 8;
const PREAMBLE_MAGIC: &[u8; 4] = b"NCHN";
const PREAMBLE_VERSION: u8 = 1;

/// The preamble's class byte (also part of the authentication tags).
pub(crate) fn kind_byte(kind: Kind) -> u8 {
    match kind {
        Kind::Channel(ChannelClass::Throughput) => 0,
        Kind::Channel(ChannelClass::Latency) => 1,
        Kind::Hello => 2,
    }
}

pub(crate) fn preamble(kind: Kind, flags: u8) -> [u8; PREAMBLE_LEN] {
    let m = PREAMBLE_MAGIC;
    [
        m[0],
        m[1],
        m[2],
        m[3],
        PREAMBLE_VERSION,
        kind_byte(kind),
        flags,
        0,
    ]
}

/// The kind and the flags byte of a preamble.
pub(crate) fn parse_preamble(b: &[u8]) -> Option<(Kind, u8)> {
    if b.len() < PREAMBLE_LEN || &b[..4] != PREAMBLE_MAGIC || b[4] != PREAMBLE_VERSION {
        return None;
    }
    let kind = match b[5] {
        0 => Kind::Channel(ChannelClass::Throughput),
        1 => Kind::Channel(ChannelClass::Latency),
        2 => Kind::Hello,
        _ => return None,
    };
    Some((kind, b[6]))
}

/// What the bytes an accepted channel has sent so far decide.
enum Verdict {
    /// It joins the endpoint (or, a hello channel, gets the hello); the first `consumed`
    /// bytes were its handshake.
    Join { kind: Kind, consumed: usize },
    /// Our challenge went out: wait for the tag.
    Challenged,
    /// Abort it; `auth` when it failed authentication rather than sent garbage.
    Reject { why: &'static str, auth: bool },
}

impl Core {
    /// Accepts channels on the channel port and runs their handshakes (the control lock
    /// held); returns whether any joined.
    pub(super) fn accept_channels(&self, ctl: &mut Control, cx: &mut Context<'_>) -> bool {
        let mut busy = false;
        let mut acceptor = ctl.acceptor.take();
        while let Some(a) = acceptor.as_ref() {
            match a.poll_accept(cx) {
                Poll::Ready(Ok(t)) => {
                    let peer = t.peer_addr();
                    if ctl.incoming.len() >= MAX_PENDING_PREAMBLES {
                        let oldest = (0..ctl.incoming.len())
                            .min_by_key(|&i| ctl.incoming[i].deadline)
                            .expect("not empty");
                        let inc = ctl.incoming.swap_remove(oldest);
                        debug!(peer = %inc.peer, "too many channels without a preamble; aborting the oldest");
                        inc.t.abort();
                        ctl.dropped_channels += 1;
                    }
                    let deadline = Instant::now() + ctl.preamble_timeout;
                    ctl.incoming.push(Incoming {
                        t,
                        peer,
                        got: Vec::new(),
                        stage: Stage::Preamble,
                        deadline,
                    })
                }
                Poll::Ready(Err(e)) => {
                    warn!(error = %e, "channel listener failed; no more incoming channels");
                    acceptor = None;
                }
                Poll::Pending => break,
            }
        }
        ctl.acceptor = acceptor;
        let mut i = 0;
        while i < ctl.incoming.len() {
            match ctl.poll_incoming(i, cx) {
                Some(true) => match ctl.judge_incoming(i) {
                    Verdict::Challenged => {}
                    Verdict::Reject { why, auth } => {
                        let inc = ctl.incoming.swap_remove(i);
                        // A peer can open channels at line rate: a few lines a second.
                        static REFUSED: netdriver::log_limit::LogLimit =
                            netdriver::log_limit::LogLimit::new(5);
                        if let Some(suppressed) = REFUSED.check() {
                            warn!(peer = %inc.peer, why, suppressed, "channel refused; aborting it");
                        }
                        inc.t.abort();
                        ctl.dropped_channels += 1;
                        ctl.auth_failures += u64::from(auth);
                    }
                    Verdict::Join {
                        kind: Kind::Hello,
                        consumed,
                    } => {
                        let inc = ctl.incoming.swap_remove(i);
                        self.answer_hello(ctl, inc, consumed);
                    }
                    Verdict::Join {
                        kind: Kind::Channel(class),
                        consumed,
                    } => {
                        let inc = ctl.incoming.swap_remove(i);
                        let ip = *inc.peer.ip();
                        let peer = ctl.peer_id(ip);
                        let leftover = (inc.got.len() > consumed)
                            .then(|| Bytes::copy_from_slice(&inc.got[consumed..]));
                        debug!(peer = %inc.peer, ?class, "channel accepted");
                        self.add_channel(ctl, inc.t, ip, peer, class, leftover);
                        busy = true;
                    }
                },
                Some(false) => {
                    let inc = ctl.incoming.swap_remove(i);
                    inc.t.abort();
                }
                None => i += 1,
            }
        }
        busy
    }

    /// Aborts accepted channels whose preamble did not come in time; returns the next
    /// such deadline.
    pub(super) fn expire_incoming(&self, ctl: &mut Control, now: Instant) -> Option<Instant> {
        let mut next = None;
        let mut i = 0;
        while i < ctl.incoming.len() {
            let d = ctl.incoming[i].deadline;
            if d <= now {
                let inc = ctl.incoming.swap_remove(i);
                debug!(peer = %inc.peer, "no channel preamble in time; aborting the channel");
                inc.t.abort();
                ctl.dropped_channels += 1;
            } else {
                next = Some(next.map_or(d, |n: Instant| n.min(d)));
                i += 1;
            }
        }
        next
    }
}

impl Control {
    /// Reads what the accepted channel's handshake needs at its stage; `Some(true)` when
    /// it is all there, `Some(false)` when the channel died.
    fn poll_incoming(&mut self, i: usize, cx: &mut Context<'_>) -> Option<bool> {
        let inc = &mut self.incoming[i];
        loop {
            let need = match inc.stage {
                Stage::Challenged { .. } => PREAMBLE_LEN + auth::NONCE_LEN + auth::TAG_LEN,
                Stage::Preamble
                    if inc.got.len() >= PREAMBLE_LEN && inc.got[6] & auth::FLAG_AUTH != 0 =>
                {
                    PREAMBLE_LEN + auth::NONCE_LEN
                }
                Stage::Preamble => PREAMBLE_LEN,
            };
            if inc.got.len() >= need {
                return Some(true);
            }
            match inc.t.poll_dequeue(cx) {
                Poll::Ready(Ok(Some(b))) => inc.got.extend_from_slice(&b),
                Poll::Ready(Ok(None)) | Poll::Ready(Err(_)) => return Some(false),
                Poll::Pending => return None,
            }
        }
    }
    /// Decides on accepted channel `i`, whose handshake bytes for its stage are all in:
    /// parses its preamble, sends our challenge when it authenticates, checks its tag.
    fn judge_incoming(&mut self, i: usize) -> Verdict {
        let key = self.channel_key.clone();
        let inc = &mut self.incoming[i];
        match inc.stage {
            Stage::Preamble => {
                let Some((kind, flags)) = parse_preamble(&inc.got) else {
                    return Verdict::Reject {
                        why: "bad channel preamble",
                        auth: false,
                    };
                };
                let wants_auth = flags & auth::FLAG_AUTH != 0;
                match (key, wants_auth) {
                    (None, false) => Verdict::Join {
                        kind,
                        consumed: PREAMBLE_LEN,
                    },
                    (Some(_), false) => Verdict::Reject {
                        why: "unauthenticated channel, and this stack has a channel key",
                        auth: true,
                    },
                    (None, true) => Verdict::Reject {
                        why:
                            "the peer authenticates its channels, and this stack has no channel key",
                        auth: true,
                    },
                    (Some(key), true) => {
                        let mut nc = [0u8; auth::NONCE_LEN];
                        nc.copy_from_slice(&inc.got[PREAMBLE_LEN..PREAMBLE_LEN + auth::NONCE_LEN]);
                        let Ok(ns) = auth::nonce() else {
                            return Verdict::Reject {
                                why: "no randomness for a nonce",
                                auth: false,
                            };
                        };
                        let tag = key.accept_tag(&nc, &ns, kind_byte(kind));
                        let mut challenge = Vec::with_capacity(auth::NONCE_LEN + auth::TAG_LEN);
                        challenge.extend_from_slice(&ns);
                        challenge.extend_from_slice(&tag);
                        if inc.t.enqueue(Bytes::from(challenge)).is_err() {
                            return Verdict::Reject {
                                why: "channel failed before its challenge",
                                auth: false,
                            };
                        }
                        inc.stage = Stage::Challenged { kind, nc, ns };
                        Verdict::Challenged
                    }
                }
            }
            Stage::Challenged { kind, nc, ns } => {
                let at = PREAMBLE_LEN + auth::NONCE_LEN;
                let tag = &inc.got[at..at + auth::TAG_LEN];
                match key {
                    Some(key) if key.verify_open(&nc, &ns, kind_byte(kind), tag) => Verdict::Join {
                        kind,
                        consumed: at + auth::TAG_LEN,
                    },
                    _ => Verdict::Reject {
                        why: "channel authentication failed (wrong key)",
                        auth: true,
                    },
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preamble_round_trips_and_rejects_garbage() {
        for kind in [
            Kind::Channel(ChannelClass::Throughput),
            Kind::Channel(ChannelClass::Latency),
            Kind::Hello,
        ] {
            assert_eq!(parse_preamble(&preamble(kind, 0)), Some((kind, 0)));
            assert_eq!(
                parse_preamble(&preamble(kind, auth::FLAG_AUTH)),
                Some((kind, auth::FLAG_AUTH))
            );
        }
        assert_eq!(preamble(Kind::Hello, 0), *b"NCHN\x01\x02\x00\x00");
        assert_eq!(parse_preamble(b"NCHN"), None);
        assert_eq!(parse_preamble(b"GET / HTTP/1.1"), None);
        let mut p = preamble(Kind::Channel(ChannelClass::Latency), 0);
        p[5] = 7;
        assert_eq!(parse_preamble(&p), None);
        p = preamble(Kind::Channel(ChannelClass::Latency), 0);
        p[4] = 2;
        assert_eq!(parse_preamble(&p), None);
    }
}
