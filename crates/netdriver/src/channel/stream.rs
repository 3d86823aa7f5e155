//! [`ChannelStream`]: a channel as a blocking `std::io::Read + Write` byte stream.

use std::io::{self, Read, Write};

use bytes::Bytes;

use super::{Channel, ChannelError, Dequeued, EnqueueError};
use crate::time::Duration;

/// Largest chunk one `write` call enqueues; longer writes are partial, as with sockets.
const MAX_WRITE_CHUNK: usize = 64 * 1024;

/// A blocking byte stream over a [`Channel`].
///
/// `write` copies into a new chunk and waits for room in the Tx queue; `flush` waits until
/// the Tx queue has been handed to TCP; `read` waits for the next chunk (or the end of
/// stream: `Ok(0)`). Channel failures become `io::Error`s: reset → `ConnectionReset`,
/// refused → `ConnectionRefused`, TCP timeout → `TimedOut`, writing after
/// [`shutdown_write`](ChannelStream::shutdown_write) → `BrokenPipe`. With a read or write
/// timeout set, a wait that expires is `WouldBlock`, like a socket's `SO_RCVTIMEO`.
#[derive(Debug)]
pub struct ChannelStream {
    channel: Channel,
    /// The rest of the last chunk `read` did not consume.
    pending: Bytes,
    finished: bool,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
}

impl ChannelStream {
    /// Wraps `channel`.
    pub fn new(channel: Channel) -> ChannelStream {
        ChannelStream {
            channel,
            pending: Bytes::new(),
            finished: false,
            read_timeout: None,
            write_timeout: None,
        }
    }

    /// The channel.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Gives the channel back (unread bytes of a partly read chunk are lost).
    pub fn into_channel(self) -> Channel {
        self.channel
    }

    /// Longest wait of one `read` (`None`: no limit).
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) {
        self.read_timeout = timeout;
    }

    /// Longest wait of one `write` or `flush` (`None`: no limit).
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) {
        self.write_timeout = timeout;
    }

    /// Ends the sending direction after everything written (TCP: a FIN). Reading goes on.
    pub fn shutdown_write(&mut self) -> io::Result<()> {
        self.channel.close();
        Ok(())
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::WouldBlock, "channel stream timeout")
}

impl Read for ChannelStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.pending.is_empty() {
            if self.finished {
                return Ok(0);
            }
            match self.channel.dequeue_blocking(self.read_timeout)? {
                Dequeued::Chunk(c) => self.pending = c,
                Dequeued::Finished => {
                    self.finished = true;
                    return Ok(0);
                }
                Dequeued::Empty => return Err(timed_out()),
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        let _ = self.pending.split_to(n);
        Ok(n)
    }
}

impl Write for ChannelStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = buf.len().min(MAX_WRITE_CHUNK);
        let chunk = Bytes::copy_from_slice(&buf[..n]);
        match self.channel.enqueue_blocking(chunk, self.write_timeout) {
            Ok(()) => Ok(n),
            Err(EnqueueError::Full(_)) => Err(timed_out()),
            Err(EnqueueError::Closed(e)) => Err(e.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.channel.flush_blocking(self.write_timeout) {
            Ok(()) => Ok(()),
            Err(ChannelError::WouldBlockTimeout) => Err(timed_out()),
            Err(e) => Err(e.into()),
        }
    }
}
