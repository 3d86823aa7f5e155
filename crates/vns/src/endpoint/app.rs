//! The application side: `send` (copied or lent segments), `recv` (copied or lent),
//! `shutdown`, `close`, `reset`, the socket's application class, and per-socket accessors
//! and statistics ([`SocketStats`]).

use bytes::BytesMut;

use netsched::AppClass;
use tracing::debug;

use crate::wire::HEADER_LEN;

use super::socket::State;
#[cfg(doc)]
use super::Event;
use super::{Endpoint, Error, PeerId, SocketId, SPARE_BUFFERS};

/// A snapshot of one socket's buffers, for tests and monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SocketStats {
    /// Bytes accepted by `send` and not yet cut into chunks.
    pub unsent_bytes: usize,
    /// Bytes more the peer's credit allows now.
    pub send_credit: usize,
    /// Bytes held in the reorder buffer (readable plus out of order).
    pub reorder_bytes: usize,
    /// The reorder buffer's bound.
    pub reorder_capacity: usize,
    /// Bytes readable in order now.
    pub readable_bytes: usize,
    /// Bytes parked in the response queue.
    pub parked_bytes: usize,
    /// Whether the peer asked us to stop sending.
    pub peer_stopped: bool,
    /// Whether we asked the peer to stop sending.
    pub stop_sent: bool,
    /// Bytes sent and kept until the peer acknowledges them at the data level (to send
    /// again on another channel if theirs dies).
    pub unacked_bytes: usize,
}

impl Endpoint {
    /// Changes a socket's application class (the paper's `SO_APP_TYPE`): its later chunks
    /// go to channels of the new class. [`Error::NoChannel`] when no channel of that class
    /// leads to the socket's peer.
    pub fn set_app_class(&mut self, id: SocketId, class: AppClass) -> Result<(), Error> {
        let peer = self.live_socket(id)?.key.peer;
        if !self
            .channels
            .values()
            .any(|c| c.peer == peer && c.class == class.channel_class())
        {
            return Err(Error::NoChannel);
        }
        self.live_socket(id)?.class = class;
        self.schedule_needed = true;
        Ok(())
    }

    /// A socket's application class.
    pub fn app_class(&self, id: SocketId) -> Option<AppClass> {
        self.sockets.get(&id).map(|s| s.class)
    }

    /// The peer host and the local and remote virtual ports of a socket.
    pub fn socket_addr(&self, id: SocketId) -> Option<(PeerId, u16, u16)> {
        self.sockets
            .get(&id)
            .map(|s| (s.key.peer, s.key.local, s.key.remote))
    }

    /// Whether the socket completed its handshake (and has not failed).
    pub fn is_connected(&self, id: SocketId) -> bool {
        self.sockets
            .get(&id)
            .is_some_and(|s| s.state == State::Established)
    }

    /// A snapshot of the socket's buffers.
    pub fn socket_stats(&self, id: SocketId) -> Option<SocketStats> {
        let s = self.sockets.get(&id)?;
        Some(SocketStats {
            unsent_bytes: s.send_buf.len(),
            send_credit: s.send_credit(),
            reorder_bytes: s.rx.as_ref().map_or(0, |r| r.len()),
            reorder_capacity: s.bufs.recv,
            readable_bytes: s.rx.as_ref().map_or(0, |r| r.readable()),
            parked_bytes: s.parked.bytes(),
            peer_stopped: s.peer_stopped,
            stop_sent: s.stop_sent,
            unacked_bytes: s.unacked_bytes(),
        })
    }

    /// Whether the socket's short chunks leave at once (`true`, the default) or wait
    /// while its earlier data is unacknowledged, at most [`Config::nagle_delay`]
    /// (Nagle's algorithm, `TCP_NODELAY` off). Turning it on sends what waits at once.
    ///
    /// [`Config::nagle_delay`]: super::Config::nagle_delay
    pub fn set_nodelay(&mut self, id: SocketId, on: bool) -> Result<(), Error> {
        let s = self.live_socket(id)?;
        s.nodelay = on;
        let waiting = !s.send_buf.is_empty();
        if on && self.nagle_holds.remove(&id).is_some() && waiting {
            self.sendable.insert(id);
            self.schedule_needed = true;
        }
        Ok(())
    }

    /// The socket's [`set_nodelay`](Self::set_nodelay) setting.
    pub fn nodelay(&self, id: SocketId) -> Result<bool, Error> {
        self.sockets
            .get(&id)
            .map(|s| s.nodelay)
            .ok_or(Error::InvalidSocket)
    }

    /// Queues bytes for sending; returns how many were taken (bounded by the free space of
    /// the socket's send buffer; credit limits when they leave it). Allowed before the
    /// handshake completes. [`Error::WouldBlock`] when the buffer is full
    /// ([`Event::Writable`] follows).
    pub fn send(&mut self, id: SocketId, data: &[u8]) -> Result<usize, Error> {
        self.send_vectored(id, &[std::io::IoSlice::new(data)])
    }

    /// [`Endpoint::send`] of several buffers in order, as one write: the bytes join the
    /// send buffer together, so that small pieces leave in one chunk rather than one each
    /// (`writev`). Takes buffers from the front while the send buffer has room and returns
    /// the bytes taken; [`Error::WouldBlock`] when it took none.
    pub fn send_vectored(
        &mut self,
        id: SocketId,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Result<usize, Error> {
        let seg = self.config.max_chunk_payload;
        // Not `live_socket`: the segment pool is borrowed beside the socket.
        let s = match self.sockets.get_mut(&id) {
            Some(s) if !s.detached => s,
            _ => return Err(Error::InvalidSocket),
        };
        if let Some(e) = s.write_error() {
            return Err(e);
        }
        if s.write_shut {
            return Err(Error::WriteClosed);
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Ok(0);
        }
        let mut room = s.bufs.send.saturating_sub(s.send_buf.len());
        if room == 0 {
            s.write_blocked = true;
            s.write_low_water = 1;
            return Err(Error::WouldBlock);
        }
        let mut taken = 0;
        for b in bufs {
            let n = room.min(b.len());
            s.send_buf.push(&b[..n], seg, &mut self.seg_pool);
            room -= n;
            taken += n;
            if room == 0 {
                break;
            }
        }
        self.sendable.insert(id);
        self.schedule_needed = true;
        Ok(taken)
    }

    /// Free bytes in the socket's send buffer, if at least `min` (clamped to
    /// `1..=send_buffer`); otherwise [`Error::WouldBlock`], and [`Event::Writable`] follows
    /// once that much is free (a low-water mark, so that a writer with a large buffer is
    /// woken for a large copy rather than for every chunk sent). Fails like
    /// [`Endpoint::send`] on a failed or shut-down socket.
    pub(crate) fn send_room(&mut self, id: SocketId, min: usize) -> Result<usize, Error> {
        let s = self.live_socket(id)?;
        if let Some(e) = s.write_error() {
            return Err(e);
        }
        if s.write_shut {
            return Err(Error::WriteClosed);
        }
        let cap = s.bufs.send;
        let room = cap.saturating_sub(s.send_buf.len());
        let min = min.clamp(1, cap);
        if room < min {
            s.write_blocked = true;
            s.write_low_water = min;
            return Err(Error::WouldBlock);
        }
        Ok(room)
    }

    /// [`Endpoint::send`] of data already cut into send-buffer segments, without copying:
    /// each buffer holds [`HEADER_LEN`] bytes of room for its chunk header, then at most
    /// `max_chunk_payload` bytes. Takes buffers from the front of `segs` while they fit
    /// in the free space and returns the payload bytes taken; the rest stay in `segs`.
    /// Sent buffers come back through [`Endpoint::reclaim_sent`].
    pub(crate) fn send_chunks(
        &mut self,
        id: SocketId,
        segs: &mut Vec<BytesMut>,
    ) -> Result<usize, Error> {
        let seg = self.config.max_chunk_payload;
        let s = self.live_socket(id)?;
        if let Some(e) = s.write_error() {
            return Err(e);
        }
        if s.write_shut {
            return Err(Error::WriteClosed);
        }
        let mut room = s.bufs.send.saturating_sub(s.send_buf.len());
        let mut taken = 0;
        let mut bytes = 0;
        for b in segs.iter() {
            let n = b.len().saturating_sub(HEADER_LEN);
            if n > room || n > seg {
                break;
            }
            room -= n;
            bytes += n;
            taken += 1;
        }
        if taken == 0 {
            return if segs.is_empty() {
                Ok(0)
            } else {
                s.write_blocked = true;
                s.write_low_water = 1;
                Err(Error::WouldBlock)
            };
        }
        s.send_buf.push_segments(segs.drain(..taken));
        self.sendable.insert(id);
        self.schedule_needed = true;
        Ok(bytes)
    }

    /// Reads in-order bytes. `Ok(0)` (with a non-empty `buf`) is the end of the stream:
    /// the peer shut down its write side and everything before was read. A socket the
    /// peer reset still hands out the in-order bytes it received before the RESET, then
    /// fails with [`Error::ConnectionReset`].
    /// [`Error::WouldBlock`] when nothing is readable yet ([`Event::Readable`] follows).
    pub fn recv(&mut self, id: SocketId, buf: &mut [u8]) -> Result<usize, Error> {
        let max = self.config.max_chunk_payload;
        let s = match self.sockets.get_mut(&id) {
            Some(s) if !s.detached => s,
            _ => return Err(Error::InvalidSocket),
        };
        let failed = s.read_error(buf.len());
        if let Some(Err(e)) = failed {
            return Err(e);
        }
        let Some(rx) = s.rx.as_mut() else {
            return Err(Error::WouldBlock);
        };
        if buf.is_empty() {
            return Ok(0);
        }
        let n = rx.read_recycling(buf, &mut self.spare, SPARE_BUFFERS, max);
        if n == 0 {
            return if s.at_eof() {
                Ok(0)
            } else {
                Err(Error::WouldBlock)
            };
        }
        if failed.is_none() {
            self.after_read(id);
        } else if self.unpark(id) == Some(true) {
            // A failed socket's parked bytes (kept when its received bytes stay readable)
            // follow the ones just read; no credit goes to a peer that is gone.
            self.retry_stalled();
        }
        Ok(n)
    }

    /// Copies in-order bytes into `buf` without consuming them: the next
    /// [`recv`](Endpoint::recv) returns them again (`MSG_PEEK`). Same results as `recv`
    /// otherwise (`Ok(0)` at end of stream, [`Error::WouldBlock`] when nothing is
    /// readable yet); no credit update, since nothing was read.
    pub fn peek(&mut self, id: SocketId, buf: &mut [u8]) -> Result<usize, Error> {
        let s = match self.sockets.get_mut(&id) {
            Some(s) if !s.detached => s,
            _ => return Err(Error::InvalidSocket),
        };
        if let Some(Err(e)) = s.read_error(buf.len()) {
            return Err(e);
        }
        let Some(rx) = s.rx.as_mut() else {
            return Err(Error::WouldBlock);
        };
        if buf.is_empty() {
            return Ok(0);
        }
        let mut copied = 0;
        rx.read_with(buf.len(), &mut Vec::new(), 0, 0, |slices| {
            for sl in slices {
                buf[copied..copied + sl.len()].copy_from_slice(sl);
                copied += sl.len();
            }
            // Nothing is consumed.
            0
        });
        if copied == 0 {
            return if s.at_eof() {
                Ok(0)
            } else {
                Err(Error::WouldBlock)
            };
        }
        Ok(copied)
    }

    /// [`Endpoint::recv`] into `len` bytes (> 0) of the caller's, copied by `copy`: it is
    /// lent the in-order bytes (at most `len`) as the received chunks' slices and returns
    /// how many it copied. Same results, events and credit updates as `recv`.
    pub(crate) fn recv_with(
        &mut self,
        id: SocketId,
        len: usize,
        copy: impl FnOnce(&[&[u8]]) -> usize,
    ) -> Result<usize, Error> {
        let max = self.config.max_chunk_payload;
        let s = match self.sockets.get_mut(&id) {
            Some(s) if !s.detached => s,
            _ => return Err(Error::InvalidSocket),
        };
        let failed = s.read_error(len);
        if let Some(Err(e)) = failed {
            return Err(e);
        }
        let Some(rx) = s.rx.as_mut() else {
            return Err(Error::WouldBlock);
        };
        if len == 0 {
            return Ok(0);
        }
        let n = rx.read_with(len, &mut self.spare, SPARE_BUFFERS, max, copy);
        if n == 0 {
            return if s.at_eof() {
                Ok(0)
            } else {
                Err(Error::WouldBlock)
            };
        }
        if failed.is_none() {
            self.after_read(id);
        } else if self.unpark(id) == Some(true) {
            self.retry_stalled();
        }
        Ok(n)
    }

    /// Shuts the write side: a FIN follows the bytes already sent, and the peer reads end
    /// of stream after them. Reading continues to work.
    pub fn shutdown(&mut self, id: SocketId) -> Result<(), Error> {
        let s = self.live_socket(id)?;
        if let Some(e) = s.write_error() {
            return Err(e);
        }
        s.write_shut = true;
        self.sendable.insert(id);
        self.schedule_needed = true;
        Ok(())
    }

    /// Releases the socket, as dropping a stream does, with the kernel's `close()` rules
    /// (RFC 1122 4.2.2.13, RFC 2525 §2.17):
    ///
    /// - received bytes left unread (readable, out of order or parked): the connection is
    ///   reset at once. Unsent bytes are discarded; chunks already handed to channels
    ///   still go, and the RESET is ordered after them (`docs/wire-format.md`, "RESET");
    /// - otherwise the write side is shut (if it was not) and the socket lingers,
    ///   invisible to the caller, until its unsent bytes and FIN have left and the peer's
    ///   FIN has arrived. Data arriving meanwhile resets it (nobody will read it), and so
    ///   does [`Config::linger_timeout`](super::Config::linger_timeout) passing first
    ///   (counted in [`EndpointCounters::linger_expired`](super::EndpointCounters));
    /// - a socket still connecting is reset; a failed one (or one the peer reset) is
    ///   released without a word to the peer.
    pub fn close(&mut self, id: SocketId) {
        let Some(s) = self.sockets.get_mut(&id) else {
            return;
        };
        if s.detached {
            return;
        }
        if s.write_error().is_some() {
            self.remove_socket(id);
            return;
        }
        let unread = s.rx.as_ref().is_none_or(|r| !r.is_empty()) || !s.parked.is_empty();
        if s.state != State::Established || unread {
            self.reset(id);
            return;
        }
        if !s.write_shut {
            s.write_shut = true;
            self.sendable.insert(id);
            self.schedule_needed = true;
        }
        self.detach(id);
    }

    /// Aborts the connection: a RESET goes to the peer (unless it failed or was reset
    /// already) and the socket is released.
    pub fn reset(&mut self, id: SocketId) {
        let Some(s) = self.sockets.get(&id) else {
            return;
        };
        if s.write_error().is_none() {
            let header = s.reset_header();
            debug!(socket = %id, "reset");
            self.queue_control(id, header);
        }
        self.remove_socket(id);
    }
}
