//! The error of a non-blocking call that cannot make progress now, shared by every kind
//! of stream.

use std::io;

pub(super) fn would_block() -> io::Error {
    io::ErrorKind::WouldBlock.into()
}
