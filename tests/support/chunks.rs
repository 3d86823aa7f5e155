//! The chunk format spoken by hand (`docs/wire-format.md`: preamble, then 16-byte
//! headers and payloads) over a kernel TCP connection to a stack's channel port, as a
//! hostile or hand-made peer speaks it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};

use super::DEADLINE;

/// The virtual port the echo server listens on in the tests that use this module.
pub const SERVICE_PORT: u16 = 7000;

// Chunk types (docs/wire-format.md).
pub const DATA: u8 = 1;
pub const ACK: u8 = 2;
pub const SYNC: u8 = 3;
pub const SYNC_ACK: u8 = 4;
pub const RESET: u8 = 6;
pub const STOP: u8 = 7;

/// A 16-byte version-1 header and its payload.
pub fn chunk(src: u16, dst: u16, seq: u32, credit: u32, ty: u8, payload: &[u8]) -> Vec<u8> {
    let mut c = Vec::with_capacity(16 + payload.len());
    c.extend_from_slice(&src.to_be_bytes());
    c.extend_from_slice(&dst.to_be_bytes());
    c.extend_from_slice(&seq.to_be_bytes());
    c.extend_from_slice(&credit.to_be_bytes());
    c.push(0x14); // version 1, 4 words
    c.push(ty);
    c.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    c.extend_from_slice(payload);
    c
}

/// A received chunk's header fields.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub src: u16,
    pub dst: u16,
    pub seq: u32,
    pub ty: u8,
}

/// A hand-speaking channel: a kernel TCP connection to the channel port.
pub struct Hostile {
    pub s: TcpStream,
}

impl Hostile {
    /// Connects and sends the preamble (throughput class, no authentication).
    pub fn open(target: SocketAddr) -> Hostile {
        let s = TcpStream::connect_timeout(&target, DEADLINE).expect("connect to 9000");
        Hostile::join(s)
    }

    /// Sends the preamble on a connected stream.
    pub fn join(mut s: TcpStream) -> Hostile {
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        s.set_write_timeout(Some(DEADLINE)).unwrap();
        s.write_all(b"NCHN\x01\x00\x00\x00").expect("preamble");
        Hostile { s }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("write chunks");
    }

    pub fn read_chunk(&mut self) -> io::Result<(Header, Vec<u8>)> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
        let len = usize::from(u16::from_be_bytes([h[14], h[15]]));
        let mut payload = vec![0u8; len];
        self.s.read_exact(&mut payload)?;
        let header = Header {
            src: u16::from_be_bytes([h[0], h[1]]),
            dst: u16::from_be_bytes([h[2], h[3]]),
            seq: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
            ty: h[13],
        };
        Ok((header, payload))
    }

    /// Opens virtual socket `port` → 7000 with ISN `isn` and window `window`; returns the
    /// server's ISN from its SYNC_ACK (other chunks before it are skipped).
    pub fn sync(&mut self, port: u16, isn: u32, window: u32) -> u32 {
        self.send(&chunk(port, SERVICE_PORT, isn, window, SYNC, b""));
        loop {
            let (h, _) = self.read_chunk().expect("SYNC_ACK");
            if h.ty == SYNC_ACK && h.dst == port && h.src == SERVICE_PORT {
                return h.seq;
            }
        }
    }

    /// Reads the echo of `want` on socket `port` (DATA chunks in order on this channel).
    pub fn read_echo(&mut self, port: u16, want: &[u8]) -> Vec<u8> {
        let mut got = Vec::new();
        while got.len() < want.len() {
            let (h, p) = self.read_chunk().expect("echoed DATA");
            assert!(h.ty != RESET || h.dst != port, "socket {port} was reset");
            if h.ty == DATA && h.dst == port {
                got.extend_from_slice(&p);
            }
        }
        got
    }
}
