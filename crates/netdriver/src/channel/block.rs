//! Blocking on a poll function from a plain thread (the set's blocking calls: connect,
//! listen, stop), parking between polls.

use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::time::Duration;

/// Unparks a blocked thread: the waker behind the blocking calls.
struct Unparker(std::thread::Thread);

impl Wake for Unparker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    static THREAD_WAKER: Waker = Waker::from(Arc::new(Unparker(std::thread::current())));
}

/// Drives `f` on the calling thread, parking between polls, until it is ready or the
/// `timeout` passes (`None`: no limit). Returns `None` on timeout.
pub(crate) fn block_on<T>(
    timeout: Option<Duration>,
    mut f: impl FnMut(&mut Context<'_>) -> Poll<T>,
) -> Option<T> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    THREAD_WAKER.with(|waker| {
        let mut cx = Context::from_waker(waker);
        loop {
            if let Poll::Ready(v) = f(&mut cx) {
                return Some(v);
            }
            match deadline {
                None => std::thread::park(),
                Some(d) => {
                    let now = std::time::Instant::now();
                    if now >= d {
                        return None;
                    }
                    std::thread::park_timeout(d - now);
                }
            }
        }
    })
}
