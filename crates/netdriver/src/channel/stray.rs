//! What a queue does with a segment its interface has no connection for (a stray
//! segment), given the set's flow directory: process it here (a SYN or a SYN cookie's
//! ACK to a listener claims its flow for this queue), forward it to the queue that owns
//! the flow, or drop it (a frame forwarded once is never forwarded again).

use super::directory::{Owner, Tuple};
use super::shared::SetShared;
use crate::netif::{StraySegment, StrayVerdict};

/// What the stray-segment hook decides, given the directory.
pub(super) fn stray_verdict(
    set: &SetShared,
    me: usize,
    claims: &mut Vec<Tuple>,
    s: &StraySegment<'_>,
    from_link: bool,
) -> StrayVerdict {
    let tuple = (s.local, s.remote);
    // A SYN cookie's ACK may open a connection just as a SYN does: claim it the same way
    // (settle_claims releases the claim if the cookie does not verify).
    let may_open = s.syn_to_listener || s.cookie_ack;
    let owner = if may_open {
        set.directory.claim(tuple, me)
    } else {
        set.directory.owner(&tuple, me)
    };
    match owner {
        Owner::Me => {
            if may_open {
                claims.push(tuple);
            }
            StrayVerdict::Local
        }
        Owner::Nobody => StrayVerdict::Local,
        // A frame that was forwarded once is never forwarded again.
        Owner::Other(_) if !from_link => StrayVerdict::Drop,
        Owner::Other(o) => set.forward(o, s.frame),
    }
}
