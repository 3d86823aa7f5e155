//! What the hello exchanges so far came to, as the control lock holds it: the hellos this
//! stack answered, and those it asked peers for and what they said. The control task's
//! `hello.rs` runs the exchanges.

/// Hellos asked for and answered (`crate::hello`, `docs/wire-format.md`). Cumulative since
/// the stack started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HelloCounts {
    /// Hello channels this stack accepted and answered with its own hello.
    pub answered: u64,
    /// Hellos from peers that described their RSS: the channels opened after them chose
    /// their ports to land on the peer's queues too.
    pub described: u64,
    /// Hellos from peers without a reproducible RSS (veth, another hash function,
    /// alignment off): channels to them are aligned at this end only.
    pub undescribed: u64,
    /// Hellos refused as malformed or past the bounds (`crate::hello::HelloError`); the
    /// channels are aligned at this end only.
    pub refused: u64,
    /// Hello channels that failed before a whole hello came: a peer that does not know
    /// them (it aborts the channel), a failed authentication, or no answer within the
    /// preamble timeout. Channels are then opened as if no hello had been asked for.
    pub unanswered: u64,
}
