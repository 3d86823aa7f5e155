//! A stream's linger setting (`set_linger`), as its drop reads it.

use std::sync::Mutex;
use std::time::Duration;

/// Whether a stream's linger setting makes its drop an abort (`Some(Duration::ZERO)`).
pub(super) fn aborts(linger: &Mutex<Option<Duration>>) -> bool {
    *linger.lock().unwrap_or_else(|p| p.into_inner()) == Some(Duration::ZERO)
}
