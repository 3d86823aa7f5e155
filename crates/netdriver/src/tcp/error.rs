//! Why a connection operation failed.

/// The errors a [`Connection`](crate::tcp::Connection) reports. Small and `Copy` so that
/// a failed connection can hand out its reason repeatedly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum TcpError {
    /// The peer reset the connection (an acceptable RST in a synchronized state).
    #[error("connection reset by peer")]
    Reset,
    /// The peer refused the connection (an acceptable RST in SYN-SENT).
    #[error("connection refused")]
    Refused,
    /// The user timeout expired, SYN retries ran out, or keep-alive probes went unanswered.
    #[error("connection timed out")]
    TimedOut,
    /// The operation is not possible any more: send after `close()`, or on a closed
    /// connection.
    #[error("connection closed")]
    Closed,
    /// Nothing to read yet, or no send-buffer space right now.
    #[error("operation would block")]
    WouldBlock,
}
