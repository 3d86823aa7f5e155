//! The acceptor's hello: how a stack that accepts channels describes its NIC's receive-side
//! scaling to a stack that opens them, so that the opener can choose each channel's local
//! port to land on the right queue at both ends (a latency channel on a latency queue at
//! each host). Layout and rules are in `docs/wire-format.md` ("Acceptor's hello").
//!
//! The hello comes from the network: [`frame_len`] and [`parse`] refuse anything malformed
//! or larger than the bounds below with a [`HelloError`], and never panic on any input.
//! [`encode`] writes what [`parse`] reads back.
//!
//! ```text
//!  0       1       2       3       4       5       6       7
//! +-------+-------+-------+-------+-------+-------+-------+-------+
//! |  'N'  |  'C'  |  'R'  |  'S'  |version| flags |  body length  |   header
//! +-------+-------+-------+-------+-------+-------+-------+-------+
//! | hfunc | xfrm  | fields (RXH)  |key len| resv  |  table length |   body, when
//! +-------+-------+-------+-------+-------+-------+-------+-------+   flags bit 0
//! | latency count | through. count| key, table, latency queues,   |
//! +-------+-------+-------+-------+  throughput queues (u16 each)  |
//! ```

use netdriver::rss::{HashFields, HashFunction, InputTransform, RssConfig, Unpredictable};
use thiserror::Error;

/// The hello's first bytes.
pub const MAGIC: &[u8; 4] = b"NCRS";
/// The hello version this crate writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the body.
pub const HEADER_LEN: usize = 8;
/// Flag: an RSS description follows (else the acceptor's RSS is unknown or not
/// reproducible, and the body is empty).
pub const FLAG_RSS: u8 = 0x01;
/// The largest body a reader accepts.
pub const MAX_BODY: usize = 16 * 1024;
/// The longest RSS key described.
pub const MAX_KEY: usize = 128;
/// The largest indirection table described.
pub const MAX_TABLE: usize = 4096;
/// The most queues in each of the two lists.
pub const MAX_QUEUES: usize = 1024;
/// Fixed bytes of a body that describes an RSS.
const BODY_FIXED: usize = 12;

/// An accepting stack's RSS and the use it makes of its queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RssDescription {
    /// Its NIC's RSS: hash function, input transform, hashed fields, key and table.
    pub rss: RssConfig,
    /// Its queues that serve latency channels (empty when it keeps no queue apart).
    pub latency: Vec<u32>,
    /// Its queues that serve throughput channels.
    pub throughput: Vec<u32>,
}

/// Why a hello was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HelloError {
    /// The first bytes are not [`MAGIC`]: the stream is not a hello.
    #[error("not a hello (bad magic)")]
    BadMagic,
    /// The declared body is longer than [`MAX_BODY`].
    #[error("hello body of {0} bytes exceeds the {MAX_BODY}-byte bound")]
    Oversized(usize),
    /// A version this crate does not read.
    #[error("hello version {0} is not supported")]
    Version(u8),
    /// Flag bits this version does not define.
    #[error("unknown hello flags {0:#04x}")]
    Flags(u8),
    /// The body's length disagrees with what its fields say it holds.
    #[error("hello body of {declared} bytes, its fields need {needed}")]
    Length {
        /// The header's body length.
        declared: usize,
        /// What the fields add up to.
        needed: usize,
    },
    /// A key longer than [`MAX_KEY`].
    #[error("RSS key of {0} bytes exceeds {MAX_KEY}")]
    KeyLength(usize),
    /// An empty table or one longer than [`MAX_TABLE`].
    #[error("indirection table of {0} entries (1..={MAX_TABLE} allowed)")]
    TableLength(usize),
    /// More than [`MAX_QUEUES`] queues in a list.
    #[error("{0} queues in a list exceed {MAX_QUEUES}")]
    QueueCount(usize),
    /// A queue id above 65535 (the hello carries 16-bit ids).
    #[error("queue {0} does not fit the hello's 16-bit ids")]
    QueueId(u32),
    /// A queue listed twice, or in both lists.
    #[error("queue {0} listed twice")]
    DuplicateQueue(u32),
    /// The described RSS does not let the queue of a frame be computed.
    #[error("the described RSS is not reproducible: {0}")]
    Unpredictable(Unpredictable),
}

/// The whole hello's length (header and body) once its header is in: `Ok(None)` while
/// fewer than [`HEADER_LEN`] bytes are. Refuses a bad magic or an oversized body, after
/// which the stream cannot be read on.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, HelloError> {
    let Some(header) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    if &header[..4] != MAGIC {
        return Err(HelloError::BadMagic);
    }
    let body = usize::from(u16::from_be_bytes([header[6], header[7]]));
    if body > MAX_BODY {
        return Err(HelloError::Oversized(body));
    }
    Ok(Some(HEADER_LEN + body))
}

/// Reads a whole hello (exactly the [`frame_len`] bytes): the acceptor's RSS, or `None`
/// when it has none to describe.
pub fn parse(frame: &[u8]) -> Result<Option<RssDescription>, HelloError> {
    let len = frame_len(frame)?.ok_or(HelloError::Length {
        declared: frame.len(),
        needed: HEADER_LEN,
    })?;
    if frame.len() != len {
        return Err(HelloError::Length {
            declared: len - HEADER_LEN,
            needed: frame.len().saturating_sub(HEADER_LEN),
        });
    }
    if frame[4] != VERSION {
        return Err(HelloError::Version(frame[4]));
    }
    let flags = frame[5];
    if flags & !FLAG_RSS != 0 {
        return Err(HelloError::Flags(flags));
    }
    let body = &frame[HEADER_LEN..];
    if flags & FLAG_RSS == 0 {
        if !body.is_empty() {
            return Err(HelloError::Length {
                declared: body.len(),
                needed: 0,
            });
        }
        return Ok(None);
    }
    let fixed = body.get(..BODY_FIXED).ok_or(HelloError::Length {
        declared: body.len(),
        needed: BODY_FIXED,
    })?;
    let be16 = |i: usize| usize::from(u16::from_be_bytes([fixed[i], fixed[i + 1]]));
    let hash = HashFunction::from_hfunc(fixed[0]);
    let input = InputTransform::from_bits(fixed[1]);
    let fields = HashFields(be16(2) as u64);
    let key_len = usize::from(fixed[4]);
    let (table_len, latency_len, throughput_len) = (be16(6), be16(8), be16(10));
    if key_len > MAX_KEY {
        return Err(HelloError::KeyLength(key_len));
    }
    if table_len == 0 || table_len > MAX_TABLE {
        return Err(HelloError::TableLength(table_len));
    }
    for n in [latency_len, throughput_len] {
        if n > MAX_QUEUES {
            return Err(HelloError::QueueCount(n));
        }
    }
    let needed = BODY_FIXED + key_len + 2 * (table_len + latency_len + throughput_len);
    if body.len() != needed {
        return Err(HelloError::Length {
            declared: body.len(),
            needed,
        });
    }
    let mut rest = &body[BODY_FIXED..];
    let key = take(&mut rest, key_len).to_vec();
    let mut ids = |n: usize| -> Vec<u32> {
        take(&mut rest, 2 * n)
            .chunks_exact(2)
            .map(|b| u32::from(u16::from_be_bytes([b[0], b[1]])))
            .collect()
    };
    let indirection = ids(table_len);
    let latency = ids(latency_len);
    let throughput = ids(throughput_len);
    check_lists(&latency, &throughput)?;
    let rss = RssConfig {
        hash,
        input,
        fields,
        key,
        indirection,
    };
    rss.check().map_err(HelloError::Unpredictable)?;
    Ok(Some(RssDescription {
        rss,
        latency,
        throughput,
    }))
}

/// The first `n` bytes of `rest`, advancing it (the caller checked the length).
fn take<'a>(rest: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = rest.split_at(n.min(rest.len()));
    *rest = tail;
    head
}

/// No queue twice, in a list or across both.
fn check_lists(latency: &[u32], throughput: &[u32]) -> Result<(), HelloError> {
    let mut all: Vec<u32> = latency.iter().chain(throughput).copied().collect();
    all.sort_unstable();
    match all.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(HelloError::DuplicateQueue(w[0])),
        None => Ok(()),
    }
}

/// The hello describing `rss` (`None`: the acceptor has no reproducible RSS). Fails where
/// the description would be refused by [`parse`] (an unreproducible RSS, values past the
/// bounds); the acceptor then sends `encode(None)`.
pub fn encode(rss: Option<&RssDescription>) -> Result<Vec<u8>, HelloError> {
    let Some(d) = rss else {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[VERSION, 0, 0, 0]);
        return Ok(out);
    };
    d.rss.check().map_err(HelloError::Unpredictable)?;
    check_lists(&d.latency, &d.throughput)?;
    let key_len = d.rss.key.len();
    if key_len > MAX_KEY {
        return Err(HelloError::KeyLength(key_len));
    }
    let table_len = d.rss.indirection.len();
    if table_len == 0 || table_len > MAX_TABLE {
        return Err(HelloError::TableLength(table_len));
    }
    for list in [&d.latency, &d.throughput] {
        if list.len() > MAX_QUEUES {
            return Err(HelloError::QueueCount(list.len()));
        }
    }
    let fields = u16::try_from(d.rss.fields.0)
        .map_err(|_| HelloError::Unpredictable(Unpredictable::Fields(d.rss.fields.0)))?;
    let body_len = BODY_FIXED + key_len + 2 * (table_len + d.latency.len() + d.throughput.len());
    let mut out = Vec::with_capacity(HEADER_LEN + body_len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[VERSION, FLAG_RSS]);
    // At most 12 + 128 + 2 * (4096 + 2 * 1024) bytes: within u16 and MAX_BODY.
    out.extend_from_slice(&(body_len as u16).to_be_bytes());
    out.push(hfunc(d.rss.hash));
    out.push(xfrm(d.rss.input));
    out.extend_from_slice(&fields.to_be_bytes());
    out.push(key_len as u8);
    out.push(0);
    for n in [table_len, d.latency.len(), d.throughput.len()] {
        out.extend_from_slice(&(n as u16).to_be_bytes());
    }
    out.extend_from_slice(&d.rss.key);
    for &q in d
        .rss
        .indirection
        .iter()
        .chain(&d.latency)
        .chain(&d.throughput)
    {
        let q = u16::try_from(q).map_err(|_| HelloError::QueueId(q))?;
        out.extend_from_slice(&q.to_be_bytes());
    }
    debug_assert_eq!(out.len(), HEADER_LEN + body_len);
    Ok(out)
}

/// The `hfunc` byte of `struct ethtool_rxfh` for `h`.
fn hfunc(h: HashFunction) -> u8 {
    match h {
        HashFunction::Toeplitz => 1,
        HashFunction::Xor => 2,
        HashFunction::Crc32 => 4,
        HashFunction::Other(b) => b,
    }
}

/// The `input_xfrm` byte of `struct ethtool_rxfh` for `t`.
fn xfrm(t: InputTransform) -> u8 {
    match t {
        InputTransform::None => 0,
        InputTransform::SymmetricXor => 1,
        InputTransform::SymmetricOrXor => 2,
        InputTransform::Other(b) => b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netdriver::rss::MICROSOFT_VERIFICATION_KEY;

    fn description() -> RssDescription {
        RssDescription {
            rss: RssConfig::toeplitz(
                &MICROSOFT_VERIFICATION_KEY,
                &RssConfig::default_indirection(128, 4),
            )
            .unwrap(),
            latency: vec![3],
            throughput: vec![0, 1, 2],
        }
    }

    fn whole(buf: &[u8]) -> Result<Option<RssDescription>, HelloError> {
        let n = frame_len(buf)?.expect("a header");
        parse(&buf[..n])
    }

    #[test]
    fn round_trips_with_the_documented_layout() {
        let d = description();
        let b = encode(Some(&d)).unwrap();
        assert_eq!(&b[..4], b"NCRS");
        assert_eq!((b[4], b[5]), (1, FLAG_RSS));
        let body = 12 + 40 + 2 * (128 + 1 + 3);
        assert_eq!(u16::from_be_bytes([b[6], b[7]]) as usize, body);
        assert_eq!(b.len(), 8 + body);
        // hfunc Toeplitz, no transform, the four fields, a 40-byte key, 128 entries.
        assert_eq!(&b[8..20], &[1, 0, 0, 0xf0, 40, 0, 0, 128, 0, 1, 0, 3]);
        assert_eq!(&b[20..60], &MICROSOFT_VERIFICATION_KEY);
        // Table entry 5 is queue 1; the latency list (queue 3) follows the table.
        assert_eq!(&b[60 + 10..60 + 12], &[0, 1]);
        assert_eq!(&b[60 + 256..60 + 258], &[0, 3]);
        assert_eq!(frame_len(&b).unwrap(), Some(b.len()));
        assert_eq!(parse(&b).unwrap(), Some(d.clone()));
        // Symmetric hashing survives.
        let mut sym = d;
        sym.rss.input = InputTransform::SymmetricXor;
        assert_eq!(whole(&encode(Some(&sym)).unwrap()).unwrap(), Some(sym));
    }

    #[test]
    fn an_acceptor_without_rss_sends_an_empty_hello() {
        let b = encode(None).unwrap();
        assert_eq!(b, b"NCRS\x01\x00\x00\x00");
        assert_eq!(whole(&b).unwrap(), None);
    }

    #[test]
    fn partial_headers_ask_for_more() {
        let b = encode(Some(&description())).unwrap();
        for n in 0..HEADER_LEN {
            assert_eq!(frame_len(&b[..n]).unwrap(), None);
        }
        assert_eq!(frame_len(&b[..HEADER_LEN]).unwrap(), Some(b.len()));
    }

    #[test]
    fn malformed_hellos_are_refused_with_their_reason() {
        let good = encode(Some(&description())).unwrap();
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            b
        };
        assert_eq!(frame_len(b"GET / HTTP/1.1"), Err(HelloError::BadMagic));
        assert_eq!(
            frame_len(b"NCRS\x01\x01\xff\xff"),
            Err(HelloError::Oversized(65535))
        );
        assert_eq!(whole(&with(&|b| b[4] = 2)), Err(HelloError::Version(2)));
        assert_eq!(whole(&with(&|b| b[5] = 3)), Err(HelloError::Flags(3)));
        // A hash function other than Toeplitz.
        assert!(matches!(
            whole(&with(&|b| b[8] = 2)),
            Err(HelloError::Unpredictable(Unpredictable::HashFunction(
                HashFunction::Xor
            )))
        ));
        // A field bit beside the four.
        assert!(matches!(
            whole(&with(&|b| b[11] |= 0x08)),
            Err(HelloError::Unpredictable(Unpredictable::Fields(_)))
        ));
        // A key length that disagrees with the body.
        assert!(matches!(
            whole(&with(&|b| b[12] = 41)),
            Err(HelloError::Length { .. })
        ));
        assert_eq!(
            whole(&with(&|b| b[12] = 200)),
            Err(HelloError::KeyLength(200))
        );
        // Table length 0, and past the bound.
        assert_eq!(
            whole(&with(&|b| b[14..16].copy_from_slice(&[0, 0]))),
            Err(HelloError::TableLength(0))
        );
        assert_eq!(
            whole(&with(&|b| b[14..16].copy_from_slice(&[0x20, 0]))),
            Err(HelloError::TableLength(8192))
        );
        assert_eq!(
            whole(&with(&|b| b[16..18].copy_from_slice(&[0x10, 0]))),
            Err(HelloError::QueueCount(4096))
        );
        // Queue 3 in both lists: the first throughput entry (queue 0) becomes 3.
        let at = good.len() - 6;
        assert_eq!(
            whole(&with(&|b| b[at + 1] = 3)),
            Err(HelloError::DuplicateQueue(3))
        );
        // A short key makes the RSS unreproducible.
        let mut short = description();
        short.rss.key.truncate(8);
        assert!(matches!(
            encode(Some(&short)),
            Err(HelloError::Unpredictable(Unpredictable::KeyTooShort { .. }))
        ));
        // A frame cut short, or longer than it says.
        assert!(matches!(
            parse(&good[..good.len() - 1]),
            Err(HelloError::Length { .. })
        ));
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(parse(&long), Err(HelloError::Length { .. })));
        // An empty hello with a body.
        assert!(matches!(
            parse(b"NCRS\x01\x00\x00\x01\x00"),
            Err(HelloError::Length { .. })
        ));
    }

    #[test]
    fn descriptions_past_the_bounds_are_not_encoded() {
        let mut d = description();
        d.latency = vec![70_000];
        assert_eq!(encode(Some(&d)), Err(HelloError::QueueId(70_000)));
        let mut d = description();
        d.throughput.push(3);
        assert_eq!(encode(Some(&d)), Err(HelloError::DuplicateQueue(3)));
        let mut d = description();
        d.rss.indirection = vec![0; MAX_TABLE + 1];
        assert_eq!(
            encode(Some(&d)),
            Err(HelloError::TableLength(MAX_TABLE + 1))
        );
        // The largest description fits the bound.
        let mut d = description();
        d.rss.key = vec![7; MAX_KEY];
        d.rss.indirection = vec![1; MAX_TABLE];
        d.latency = (0..MAX_QUEUES as u32).collect();
        d.throughput = (MAX_QUEUES as u32..2 * MAX_QUEUES as u32).collect();
        let b = encode(Some(&d)).unwrap();
        assert!(b.len() - HEADER_LEN <= MAX_BODY);
        assert_eq!(whole(&b).unwrap(), Some(d));
    }
}
