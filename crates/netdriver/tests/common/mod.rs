//! Helpers shared by the privileged channel tests: a deterministic byte stream that can be
//! generated and verified chunk by chunk at any offset (no second copy of the data), waits
//! on conditions with deadlines, and channel-set configurations for the test bed.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use netdriver::channel::{Channel, ChannelSet, ChannelSetConfig, Dequeued};
use testbed::{Side, TestBed};

/// How long any single wait in these tests may take before it is a failure.
pub const DEADLINE: Duration = Duration::from_secs(60);

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `out` with the bytes at `offset..` of stream `seed`: byte `i` is byte `i % 8` of
/// `splitmix64(seed ^ i / 8)`.
pub fn fill(seed: u64, offset: u64, out: &mut [u8]) {
    let mut pos = offset;
    let mut i = 0;
    while i < out.len() {
        let word = splitmix64(seed ^ (pos / 8)).to_le_bytes();
        let within = (pos % 8) as usize;
        let n = (8 - within).min(out.len() - i);
        out[i..i + n].copy_from_slice(&word[within..within + n]);
        i += n;
        pos += n as u64;
    }
}

/// Checks a stream chunk by chunk against [`fill`].
pub struct Verifier {
    seed: u64,
    offset: u64,
    scratch: Vec<u8>,
}

impl Verifier {
    pub fn new(seed: u64) -> Verifier {
        Verifier {
            seed,
            offset: 0,
            scratch: Vec::new(),
        }
    }

    /// Bytes verified so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Verifies the next `data`; panics with the first differing offset.
    pub fn check(&mut self, data: &[u8]) {
        self.scratch.resize(data.len(), 0);
        fill(self.seed, self.offset, &mut self.scratch);
        if self.scratch[..] != *data {
            let at = data
                .iter()
                .zip(&self.scratch)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!(
                "stream {:#x} differs at byte {} (got {:#04x}, want {:#04x})",
                self.seed,
                self.offset + at as u64,
                data[at],
                self.scratch[at]
            );
        }
        self.offset += data.len() as u64;
    }
}

/// Writes `total` bytes of stream `seed` in chunks of `chunk`.
pub fn write_stream(w: &mut impl Write, seed: u64, total: u64, chunk: usize) -> io::Result<()> {
    let mut buf = vec![0u8; chunk];
    let mut off = 0;
    while off < total {
        let n = (total - off).min(chunk as u64) as usize;
        fill(seed, off, &mut buf[..n]);
        w.write_all(&buf[..n])?;
        off += n as u64;
    }
    w.flush()
}

/// Reads to the end of `r`, verifying stream `seed`; returns the byte count.
pub fn read_verify(r: &mut impl Read, seed: u64) -> io::Result<u64> {
    let mut v = Verifier::new(seed);
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(v.offset()),
            Ok(n) => v.check(&buf[..n]),
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("after {} bytes: {e}", v.offset()),
                ))
            }
        }
    }
}

/// Writes back everything read from `s` until its end; returns the byte count.
pub fn echo(s: &mut (impl Read + Write)) -> io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        match s.read(&mut buf)? {
            0 => {
                s.flush()?;
                return Ok(total);
            }
            n => {
                s.write_all(&buf[..n])?;
                total += n as u64;
            }
        }
    }
}

/// Enqueues `total` bytes of stream `seed` on `ch` in chunks of `chunk`, then closes it.
pub fn send_stream(ch: &Channel, seed: u64, total: u64, chunk: usize) {
    let mut off = 0;
    while off < total {
        let n = (total - off).min(chunk as u64) as usize;
        let mut buf = vec![0u8; n];
        fill(seed, off, &mut buf);
        ch.enqueue_blocking(Bytes::from(buf), Some(DEADLINE))
            .unwrap_or_else(|e| panic!("enqueue at {off}: {e}"));
        off += n as u64;
    }
    ch.close();
}

/// Dequeues from `ch` until the end of stream, verifying stream `seed`; returns the count.
pub fn recv_stream(ch: &Channel, seed: u64) -> u64 {
    let mut v = Verifier::new(seed);
    loop {
        match ch.dequeue_blocking(Some(DEADLINE)) {
            Ok(Dequeued::Chunk(c)) => v.check(&c),
            Ok(Dequeued::Finished) => return v.offset(),
            Ok(Dequeued::Empty) => panic!("nothing for {DEADLINE:?} after {} bytes", v.offset()),
            Err(e) => panic!("after {} bytes: {e}", v.offset()),
        }
    }
}

/// Polls `cond` until it holds or `deadline` passes; returns whether it held.
pub fn eventually(deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A channel-set configuration for `side` of `bed`.
pub fn config(bed: &TestBed, side: Side) -> ChannelSetConfig {
    let e = bed.side(side);
    let mut c = ChannelSetConfig::new(e.ifname.clone(), e.ipv4);
    c.connect_timeout = Duration::from_secs(10);
    c
}

/// Starts a channel set inside `side`'s namespace (its threads stay there) and returns it.
pub fn start(bed: &TestBed, side: Side, config: ChannelSetConfig) -> ChannelSet {
    bed.run_in(side, move || ChannelSet::start(config))
        .expect("enter the namespace")
        .expect("start the channel set")
}

/// Whether an XDP program is attached to `side`'s interface.
pub fn program_attached(bed: &TestBed, side: Side) -> bool {
    let ifname = bed.side(side).ifname.clone();
    bed.run_in(side, move || xdp_prog::attached_program(&ifname))
        .unwrap()
        .unwrap()
        .is_some()
}
