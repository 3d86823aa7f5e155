//! The wire protocol of `ncperf` (its client and server) and of the benches' remote-peer
//! mode, which run their client side against an `ncperf server`: one implementation, so
//! that both speak the same hello, send the same requests and check the same responses.
//! Not part of the stack's API.
//!
//! Every connection opens with an 8-byte hello from the client: the magic `NCP1`, an
//! operation byte, a reserved byte, and a little-endian `u16` argument. Then:
//!
//! - [`Op::Echo`]: the server writes back every byte it reads until the client closes
//!   (request/response rate, latency, isolation); the client checks every response.
//! - [`Op::Sink`]: the client writes the [`Pattern`] from stream offset 0 until it
//!   closes its side; the server checks every byte against the pattern at its offset and
//!   answers with a 16-byte [`SinkReport`] (bytes read, whether they all matched), then
//!   closes (bulk goodput).
//! - [`Op::OneShot`]: the client sends one request of `arg` bytes; the server echoes it
//!   and closes first, as an HTTP/1.0 server does (new connections per second): the
//!   closing side's TIME_WAIT is the server's, so a client opening thousands of
//!   connections does not run out of ports.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The hello's first four bytes.
pub const MAGIC: [u8; 4] = *b"NCP1";
/// Length of the hello.
pub const HELLO_LEN: usize = 8;
/// Application buffer of bulk writes and reads.
pub const BLOCK: usize = 64 << 10;
/// Length of a [`SinkReport`] on the wire.
pub const REPORT_LEN: usize = 16;
/// An `ncperf server`'s main port unless told otherwise; its latency application's is the
/// next.
pub const DEFAULT_PORT: u16 = 7700;

/// What the client asks of the server for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Echo until end of stream.
    Echo,
    /// Read and check the pattern until end of stream, then report.
    Sink,
    /// Echo one request of the hello's length, then close.
    OneShot,
}

impl Op {
    fn code(self) -> u8 {
        match self {
            Op::Echo => 1,
            Op::Sink => 2,
            Op::OneShot => 3,
        }
    }

    fn from_code(c: u8) -> Option<Op> {
        match c {
            1 => Some(Op::Echo),
            2 => Some(Op::Sink),
            3 => Some(Op::OneShot),
            _ => None,
        }
    }
}

/// The hello that opens a connection.
pub fn hello(op: Op, arg: u16) -> [u8; HELLO_LEN] {
    let a = arg.to_le_bytes();
    [
        MAGIC[0],
        MAGIC[1],
        MAGIC[2],
        MAGIC[3],
        op.code(),
        0,
        a[0],
        a[1],
    ]
}

/// Parses a hello; `None` for anything that is not one.
pub fn parse_hello(b: &[u8; HELLO_LEN]) -> Option<(Op, u16)> {
    if b[..4] != MAGIC {
        return None;
    }
    Some((Op::from_code(b[4])?, u16::from_le_bytes([b[6], b[7]])))
}

/// The server's answer to a [`Op::Sink`] connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkReport {
    /// Bytes read before the end of stream.
    pub bytes: u64,
    /// Whether every one of them was the pattern's byte at its offset.
    pub intact: bool,
}

impl SinkReport {
    /// The report on the wire.
    pub fn encode(self) -> [u8; REPORT_LEN] {
        let mut b = [0u8; REPORT_LEN];
        b[..8].copy_from_slice(&self.bytes.to_le_bytes());
        b[8] = u8::from(self.intact);
        b
    }

    /// A report read from the wire.
    pub fn decode(b: &[u8; REPORT_LEN]) -> SinkReport {
        SinkReport {
            bytes: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            intact: b[8] == 1,
        }
    }
}

/// The byte stream of bulk transfers: a pseudo-random sequence with a prime period, so
/// that no segment or chunk boundary lines up with it and a byte delivered at the wrong
/// offset is caught. Held twice over plus a block, so that any block-sized piece starting
/// anywhere in the period is one slice.
#[derive(Debug, Clone)]
pub struct Pattern {
    bytes: Vec<u8>,
}

impl Pattern {
    /// The pattern's period in bytes (prime).
    pub const PERIOD: usize = 65_521;

    /// The pattern (a fixed xorshift sequence).
    pub fn new() -> Pattern {
        let mut x: u32 = 0x9e37_79b9;
        let period: Vec<u8> = (0..Self::PERIOD)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8
            })
            .collect();
        let mut bytes = Vec::with_capacity(Self::PERIOD + BLOCK);
        while bytes.len() < Self::PERIOD + BLOCK {
            let n = (Self::PERIOD + BLOCK - bytes.len()).min(Self::PERIOD);
            bytes.extend_from_slice(&period[..n]);
        }
        Pattern { bytes }
    }

    /// The `len` bytes (at most [`BLOCK`]) the stream carries from `offset` on.
    pub fn at(&self, offset: u64, len: usize) -> &[u8] {
        let start = (offset % Self::PERIOD as u64) as usize;
        &self.bytes[start..start + len.min(BLOCK)]
    }

    /// Whether `data` (any length) is what the stream carries from `offset` on.
    pub fn check(&self, mut offset: u64, mut data: &[u8]) -> bool {
        while !data.is_empty() {
            let n = data.len().min(BLOCK);
            if data[..n] != *self.at(offset, n) {
                return false;
            }
            offset += n as u64;
            data = &data[n..];
        }
        true
    }
}

impl Default for Pattern {
    fn default() -> Self {
        Pattern::new()
    }
}

/// A connection's requests for [`Op::Echo`]: `size` bytes, the first 8 a stamp
/// (connection, count), the rest a pattern of the connection's own. Every response is
/// checked byte for byte against its request.
#[derive(Debug, Clone)]
pub struct Requests {
    req: Vec<u8>,
    resp: Vec<u8>,
    tag: u64,
    done: u64,
}

impl Requests {
    /// Requests of `size` bytes for connection `tag`.
    pub fn new(size: usize, tag: u64) -> Requests {
        Requests {
            req: (0..size)
                .map(|i| (i as u8).wrapping_mul(31) ^ tag as u8)
                .collect(),
            resp: vec![0; size],
            tag,
            done: 0,
        }
    }

    /// The connection's tag.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// Requests answered and checked so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// One request and its response, checked: an `InvalidData` error naming the request
    /// and the connection when the response differs from the request.
    pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        s: &mut S,
    ) -> io::Result<()> {
        let stamp = (self.tag << 40 | self.done).to_le_bytes();
        let k = stamp.len().min(self.req.len());
        self.req[..k].copy_from_slice(&stamp[..k]);
        s.write_all(&self.req).await?;
        s.read_exact(&mut self.resp).await?;
        if self.resp != self.req {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the response to request {} of connection {} differs from it",
                    self.done, self.tag
                ),
            ));
        }
        self.done += 1;
        Ok(())
    }
}

/// Serves one connection: reads the hello and does what it asks. Returns the bytes read
/// after the hello.
pub async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    pattern: &Pattern,
) -> io::Result<u64> {
    let mut h = [0u8; HELLO_LEN];
    s.read_exact(&mut h).await?;
    let Some((op, arg)) = parse_hello(&h) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not an ncperf client (bad hello)",
        ));
    };
    match op {
        Op::Echo => {
            let mut buf = vec![0u8; BLOCK];
            let mut total = 0u64;
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    s.shutdown().await?;
                    return Ok(total);
                }
                total += n as u64;
                s.write_all(&buf[..n]).await?;
            }
        }
        Op::Sink => {
            let mut buf = vec![0u8; BLOCK];
            let mut total = 0u64;
            let mut intact = true;
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                intact &= pattern.check(total, &buf[..n]);
                total += n as u64;
            }
            let report = SinkReport {
                bytes: total,
                intact,
            };
            s.write_all(&report.encode()).await?;
            s.shutdown().await?;
            Ok(total)
        }
        Op::OneShot => {
            let mut buf = vec![0u8; usize::from(arg)];
            s.read_exact(&mut buf).await?;
            s.write_all(&buf).await?;
            s.shutdown().await?;
            Ok(buf.len() as u64)
        }
    }
}
