//! RESP2 requests and replies: the subset of the Redis protocol a server needs.
//!
//! Requests come in two forms, both accepted here as Redis accepts them:
//!
//! - **multibulk**: an array of bulk strings, `*2\r\n$3\r\nGET\r\n$1\r\nk\r\n` (what every
//!   client library, `redis-cli` and `redis-benchmark` send);
//! - **inline**: one line of space-separated words, `GET k\r\n`, with Redis's quoting
//!   (`"a b"`, `'c'`, `\x41`-style escapes inside double quotes), as typed into `nc`.
//!
//! [`Parser::next`] takes complete requests off the front of a connection's input buffer
//! one at a time and leaves an incomplete one there until more bytes arrive. It never
//! panics on any input and bounds everything a peer controls: the length of one bulk
//! string, the number of arguments, the length of an inline line or a length header, and
//! the bytes an incomplete request may occupy. A violation is a [`ProtocolError`]; the
//! server replies with it ([`ProtocolError::reply`]) and closes the connection, as Redis
//! does, because the stream can no longer be framed.
//!
//! ```ignore
//! let mut parser = Parser::new(Limits::default());
//! let mut input = BytesMut::from(&b"*1\r\n$4\r\nPING\r\nECHO hi\r\n*1\r\n$4\r\nPI"[..]);
//! assert_eq!(parser.next(&mut input).unwrap().unwrap(), vec![Bytes::from("PING")]);
//! assert_eq!(parser.next(&mut input).unwrap().unwrap(), vec![Bytes::from("ECHO"), Bytes::from("hi")]);
//! assert_eq!(parser.next(&mut input).unwrap(), None); // waits for the rest
//! ```
//!
//! Replies are written with the `put_*` functions into one output buffer per batch of
//! requests, so a pipelined batch goes back in one write.

use std::fmt::Write as _;
use std::ops::Range;

use bytes::{Bytes, BytesMut};

/// What one connection may send; see [`Parser`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest bulk string (one argument), in bytes.
    pub max_bulk: usize,
    /// Most arguments in one multibulk request.
    pub max_args: usize,
    /// Longest inline request line and longest `*N` / `$N` header line, in bytes.
    pub max_inline: usize,
    /// Most bytes one incomplete request may occupy in the input buffer.
    pub max_request: usize,
}

impl Limits {
    /// Limits for requests of at most `max_request` bytes: one argument may take all of
    /// it; inline lines and argument counts keep Redis's bounds (64 KiB, 1 Mi).
    pub fn with_max_request(max_request: usize) -> Limits {
        Limits {
            max_bulk: max_request,
            max_args: 1024 * 1024,
            max_inline: 64 * 1024,
            max_request,
        }
    }
}

impl Default for Limits {
    /// Requests up to 16 MiB.
    fn default() -> Limits {
        Limits::with_max_request(16 << 20)
    }
}

/// A request that breaks the protocol or a [`Limits`] bound. The connection cannot be
/// framed after it: reply with [`ProtocolError::reply`] and close.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// `*N` with N not an integer or above [`Limits::max_args`].
    #[error("invalid multibulk length")]
    InvalidMultibulkLength,
    /// `$N` with N not an integer, negative or above [`Limits::max_bulk`].
    #[error("invalid bulk length")]
    InvalidBulkLength,
    /// An array element that is not a bulk string.
    #[error("expected '$', got '{}'", char::from(*.0).escape_default())]
    ExpectedBulk(u8),
    /// A bulk string not followed by CRLF.
    #[error("expected CRLF after the bulk string")]
    MissingCrlf,
    /// A header line (`*N`, `$N`) longer than [`Limits::max_inline`] or with CR not
    /// followed by LF.
    #[error("invalid or too long length header")]
    BadHeader,
    /// An inline request line longer than [`Limits::max_inline`].
    #[error("too big inline request")]
    InlineTooBig,
    /// An inline request with an unclosed quote, or a closing quote not followed by a
    /// space.
    #[error("unbalanced quotes in request")]
    UnbalancedQuotes,
    /// An incomplete request already larger than [`Limits::max_request`].
    #[error("request larger than {0} bytes")]
    RequestTooLarge(usize),
}

impl ProtocolError {
    /// The error reply a server sends before closing, in Redis's wording
    /// (`-ERR Protocol error: ...`).
    pub fn reply(&self, out: &mut BytesMut) {
        put_error(out, &format!("ERR Protocol error: {self}"));
    }
}

/// Progress through a multibulk request whose arguments have not all arrived: the bytes
/// before `pos` are parsed already, so a long request is scanned once however it is split.
#[derive(Debug)]
struct Partial {
    /// Arguments still to come.
    left: usize,
    /// Where the next argument's `$` header starts.
    pos: usize,
    /// The arguments so far, as ranges of the buffer.
    args: Vec<Range<usize>>,
}

/// Takes RESP requests off a connection's input buffer; see the module docs.
#[derive(Debug)]
pub struct Parser {
    limits: Limits,
    partial: Option<Partial>,
}

/// What one step of parsing found at the front of the buffer.
enum Step {
    /// A multibulk request: its arguments as ranges of the buffer, and the bytes it took.
    Request(Vec<Range<usize>>, usize),
    /// An inline request: its words (unescaped, so copies), and the bytes it took.
    Inline(Vec<Bytes>, usize),
    /// An empty request (`*0`, a blank line) taking this many bytes: skipped, as Redis does.
    Empty(usize),
    /// Not all of the request is there yet.
    Incomplete,
}

impl Parser {
    /// A parser for one connection.
    pub fn new(limits: Limits) -> Parser {
        Parser {
            limits,
            partial: None,
        }
    }

    /// The next complete request at the front of `buf` (its arguments, at least one),
    /// removed from `buf`; `Ok(None)` when `buf` holds no complete request yet.
    ///
    /// Between calls `buf` may only grow at its end (new input): the parser remembers how
    /// far it got into an incomplete request. After an error the connection must close.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        loop {
            // Only the first max_request bytes of a request are looked at, so that what is
            // found (a request, an error, or "too large") does not depend on how the input
            // was split into reads.
            let view = &buf[..buf.len().min(self.limits.max_request)];
            let step = match view.first() {
                None => return Ok(None),
                Some(b'*') => self.multibulk(view)?,
                Some(_) => self.inline(view)?,
            };
            match step {
                Step::Request(ranges, len) => {
                    // The request's own bytes, frozen: its arguments are slices of them.
                    let frame = buf.split_to(len).freeze();
                    return Ok(Some(ranges.into_iter().map(|r| frame.slice(r)).collect()));
                }
                Step::Inline(words, len) => {
                    let _ = buf.split_to(len);
                    return Ok(Some(words));
                }
                Step::Empty(len) => {
                    let _ = buf.split_to(len);
                }
                Step::Incomplete => {
                    if buf.len() >= self.limits.max_request {
                        return Err(ProtocolError::RequestTooLarge(self.limits.max_request));
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// `*N\r\n` followed by N `$len\r\n<bytes>\r\n`.
    fn multibulk(&mut self, buf: &[u8]) -> Result<Step, ProtocolError> {
        let mut partial = match self.partial.take() {
            Some(p) => p,
            None => {
                let Some((digits, next)) = header_line(buf, 1, self.limits.max_inline)? else {
                    return Ok(Step::Incomplete);
                };
                let count = parse_int(&buf[digits]).ok_or(ProtocolError::InvalidMultibulkLength)?;
                if count > self.limits.max_args as i64 {
                    return Err(ProtocolError::InvalidMultibulkLength);
                }
                if count <= 0 {
                    return Ok(Step::Empty(next));
                }
                let left = count as usize;
                Partial {
                    left,
                    pos: next,
                    // Grows with what actually arrives, not with what the header claims.
                    args: Vec::with_capacity(left.min(16)),
                }
            }
        };
        while partial.left > 0 {
            match self.bulk(buf, partial.pos)? {
                Some((range, next)) => {
                    partial.args.push(range);
                    partial.pos = next;
                    partial.left -= 1;
                }
                None => {
                    self.partial = Some(partial);
                    return Ok(Step::Incomplete);
                }
            }
        }
        Ok(Step::Request(partial.args, partial.pos))
    }

    /// One `$len\r\n<bytes>\r\n` at `pos`: the bytes' range and where the next element
    /// starts, or `None` while incomplete.
    fn bulk(&self, buf: &[u8], pos: usize) -> Result<Option<(Range<usize>, usize)>, ProtocolError> {
        let Some(&first) = buf.get(pos) else {
            return Ok(None);
        };
        if first != b'$' {
            return Err(ProtocolError::ExpectedBulk(first));
        }
        let Some((digits, start)) = header_line(buf, pos + 1, self.limits.max_inline)? else {
            return Ok(None);
        };
        let len = parse_int(&buf[digits])
            .filter(|&n| n >= 0 && n as u64 <= self.limits.max_bulk as u64)
            .ok_or(ProtocolError::InvalidBulkLength)? as usize;
        // No overflow: len <= max_bulk, a usize, and start <= buf.len().
        let end = start.saturating_add(len);
        match buf.get(end..end.saturating_add(2)) {
            Some(b"\r\n") => Ok(Some((start..end, end + 2))),
            Some(_) => Err(ProtocolError::MissingCrlf),
            None => Ok(None),
        }
    }

    /// A line of words ending in `\n` (a `\r` before it is dropped).
    fn inline(&self, buf: &[u8]) -> Result<Step, ProtocolError> {
        let max = self.limits.max_inline;
        let Some(nl) = buf.iter().take(max + 1).position(|&b| b == b'\n') else {
            return if buf.len() > max {
                Err(ProtocolError::InlineTooBig)
            } else {
                Ok(Step::Incomplete)
            };
        };
        let line = &buf[..nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let words = split_inline(line)?;
        Ok(if words.is_empty() {
            Step::Empty(nl + 1)
        } else {
            Step::Inline(words, nl + 1)
        })
    }
}

/// The line starting at `from` up to `\r\n`: the range of its content and where the next
/// line starts; `None` while no `\r\n` has arrived. Errors if the line would be longer than
/// `max` or its `\r` is followed by anything but `\n`.
fn header_line(
    buf: &[u8],
    from: usize,
    max: usize,
) -> Result<Option<(Range<usize>, usize)>, ProtocolError> {
    let rest = buf.get(from..).unwrap_or_default();
    match rest.iter().take(max + 1).position(|&b| b == b'\r') {
        None if rest.len() > max => Err(ProtocolError::BadHeader),
        None => Ok(None),
        Some(cr) => match rest.get(cr + 1) {
            None => Ok(None),
            Some(b'\n') => Ok(Some((from..from + cr, from + cr + 2))),
            Some(_) => Err(ProtocolError::BadHeader),
        },
    }
}

/// A decimal integer in canonical form, as Redis's `string2ll` accepts it: an optional
/// `-`, no `+`, no leading zeros, no spaces, within `i64`.
pub fn parse_int(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let n: i64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    // Rejects "+1", "01", "-0": the canonical spelling of n must be the input itself.
    (n.to_string().as_bytes() == s).then_some(n)
}

/// Redis's inline splitting (`sdssplitargs`): words separated by whitespace; `"..."` with
/// `\n \r \t \b \a \\ \" \xHH` escapes and `'...'` with `\'`; a closing quote must be
/// followed by whitespace or the end of the line.
pub fn split_inline(line: &[u8]) -> Result<Vec<Bytes>, ProtocolError> {
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
    // Redis splits a C string: a NUL ends the line (inside quotes, it leaves them open).
    let line = &line[..line.iter().position(|&b| b == 0).unwrap_or(line.len())];
    let mut words = Vec::new();
    let mut i = 0;
    loop {
        while line.get(i).is_some_and(|&b| is_space(b)) {
            i += 1;
        }
        if i >= line.len() {
            return Ok(words);
        }
        let mut word = Vec::new();
        // 0: unquoted, b'"' or b'\'': inside that quote.
        let mut quote = 0u8;
        loop {
            let c = line.get(i).copied();
            match (quote, c) {
                (b'"' | b'\'', None) => return Err(ProtocolError::UnbalancedQuotes),
                (_, None) => break,
                (b'"', Some(b'\\')) => {
                    let hex = |k: usize| line.get(i + k).and_then(|&h| (h as char).to_digit(16));
                    if line.get(i + 1) == Some(&b'x') {
                        if let (Some(h), Some(l)) = (hex(2), hex(3)) {
                            word.push((h * 16 + l) as u8);
                            i += 4;
                            continue;
                        }
                    }
                    match line.get(i + 1) {
                        Some(&e) => {
                            word.push(match e {
                                b'n' => b'\n',
                                b'r' => b'\r',
                                b't' => b'\t',
                                b'b' => 0x08,
                                b'a' => 0x07,
                                other => other,
                            });
                            i += 2;
                        }
                        // A lone backslash before the end: the quote stays open.
                        None => return Err(ProtocolError::UnbalancedQuotes),
                    }
                }
                (b'\'', Some(b'\\')) if line.get(i + 1) == Some(&b'\'') => {
                    word.push(b'\'');
                    i += 2;
                }
                (b'"' | b'\'', Some(c)) if c == quote => {
                    // The closing quote must end the word.
                    if line.get(i + 1).is_some_and(|&b| !is_space(b)) {
                        return Err(ProtocolError::UnbalancedQuotes);
                    }
                    i += 1;
                    break;
                }
                (b'"' | b'\'', Some(c)) => {
                    word.push(c);
                    i += 1;
                }
                (_, Some(c)) if is_space(c) => break,
                (_, Some(c @ (b'"' | b'\''))) => {
                    quote = c;
                    i += 1;
                }
                (_, Some(c)) => {
                    word.push(c);
                    i += 1;
                }
            }
        }
        words.push(Bytes::from(word));
    }
}

/// `+s\r\n`. `s` must not contain CR or LF.
pub fn put_simple(out: &mut BytesMut, s: &str) {
    out.reserve(s.len() + 3);
    out.extend_from_slice(b"+");
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `-msg\r\n`, with any CR or LF in `msg` turned into spaces (they would end the reply
/// early: messages may quote what a client sent).
pub fn put_error(out: &mut BytesMut, msg: &str) {
    out.reserve(msg.len() + 3);
    out.extend_from_slice(b"-");
    out.extend(
        msg.bytes()
            .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

/// `:n\r\n`.
pub fn put_int(out: &mut BytesMut, n: i64) {
    let _ = write!(out, ":{n}\r\n");
}

/// `$len\r\n<bytes>\r\n`.
pub fn put_bulk(out: &mut BytesMut, b: &[u8]) {
    out.reserve(b.len() + 16);
    let _ = write!(out, "${}\r\n", b.len());
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

/// The null bulk string, `$-1\r\n` (a missing key).
pub fn put_null(out: &mut BytesMut) {
    out.extend_from_slice(b"$-1\r\n");
}

/// `*n\r\n`, the header of an array of `n` replies that follow.
pub fn put_array(out: &mut BytesMut, n: usize) {
    let _ = write!(out, "*{n}\r\n");
}

/// `args` as a multibulk request (what clients send; used by the tests).
#[cfg(test)]
pub fn encode_request(args: &[&[u8]], out: &mut BytesMut) {
    put_array(out, args.len());
    for a in args {
        put_bulk(out, a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all(parser: &mut Parser, buf: &mut BytesMut) -> Result<Vec<Vec<Bytes>>, ProtocolError> {
        let mut got = Vec::new();
        while let Some(req) = parser.next(buf)? {
            got.push(req);
        }
        Ok(got)
    }

    fn words(ws: &[&str]) -> Vec<Bytes> {
        ws.iter()
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect()
    }

    fn parse_all(input: &[u8]) -> Result<Vec<Vec<Bytes>>, ProtocolError> {
        let mut buf = BytesMut::from(input);
        all(&mut Parser::new(Limits::default()), &mut buf)
    }

    #[test]
    fn multibulk_and_inline_requests_in_one_buffer() {
        let got =
            parse_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nset a  b\r\nPING\n*1\r\n$0\r\n\r\n").unwrap();
        assert_eq!(
            got,
            vec![
                words(&["GET", "k"]),
                words(&["set", "a", "b"]),
                words(&["PING"]),
                words(&[""])
            ]
        );
    }

    #[test]
    fn binary_bulk_strings_are_kept_exactly() {
        let got = parse_all(b"*2\r\n$4\r\n\r\n\0\xff\r\n$2\r\n*1\r\n").unwrap();
        assert_eq!(
            got,
            vec![vec![
                Bytes::from_static(b"\r\n\0\xff"),
                Bytes::from_static(b"*1")
            ]]
        );
    }

    #[test]
    fn empty_requests_are_skipped() {
        let got = parse_all(b"\r\n*0\r\n*-1\r\n   \nPING\r\n").unwrap();
        assert_eq!(got, vec![words(&["PING"])]);
    }

    #[test]
    fn incomplete_requests_wait_and_stay_in_the_buffer() {
        let mut parser = Parser::new(Limits::default());
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$5\r\nab"[..]);
        assert_eq!(parser.next(&mut buf), Ok(None));
        assert_eq!(buf.len(), 19, "nothing consumed");
        buf.extend_from_slice(b"cde\r");
        assert_eq!(parser.next(&mut buf), Ok(None));
        buf.extend_from_slice(b"\nGET x");
        assert_eq!(parser.next(&mut buf), Ok(Some(words(&["GET", "abcde"]))));
        assert_eq!(
            parser.next(&mut buf),
            Ok(None),
            "inline waits for its newline"
        );
        buf.extend_from_slice(b"\n");
        assert_eq!(parser.next(&mut buf), Ok(Some(words(&["GET", "x"]))));
        assert!(buf.is_empty());
    }

    #[test]
    fn inline_quoting_follows_redis() {
        assert_eq!(
            split_inline(br#"set "a b" 'c d' "\x41\n\"" 'it\'s' x"#).unwrap(),
            vec![
                Bytes::from_static(b"set"),
                Bytes::from_static(b"a b"),
                Bytes::from_static(b"c d"),
                Bytes::from_static(b"A\n\""),
                Bytes::from_static(b"it's"),
                Bytes::from_static(b"x"),
            ]
        );
        assert_eq!(
            split_inline(br#"get "abc"#),
            Err(ProtocolError::UnbalancedQuotes)
        );
        assert_eq!(
            split_inline(br#"get "a"b"#),
            Err(ProtocolError::UnbalancedQuotes)
        );
        assert_eq!(
            split_inline(b"get 'a"),
            Err(ProtocolError::UnbalancedQuotes)
        );
        assert_eq!(split_inline(b"  "), Ok(vec![]));
        // A NUL ends the line, as in Redis's C-string splitting.
        assert_eq!(
            split_inline(b"get a\0b c"),
            Ok(vec![Bytes::from_static(b"get"), Bytes::from_static(b"a")])
        );
        assert_eq!(split_inline(b"\0get"), Ok(vec![]));
        assert_eq!(
            split_inline(b"get \"a\0\""),
            Err(ProtocolError::UnbalancedQuotes)
        );
    }

    #[test]
    fn malformed_requests_are_errors() {
        let cases: &[(&[u8], ProtocolError)] = &[
            (b"*x\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*+1\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*01\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*1\r\n:1\r\n", ProtocolError::ExpectedBulk(b':')),
            (b"*1\r\n$-1\r\n", ProtocolError::InvalidBulkLength),
            (b"*1\r\n$x\r\n", ProtocolError::InvalidBulkLength),
            (b"*1\r\n$1\r\nab\r\n", ProtocolError::MissingCrlf),
            (b"*1\rx", ProtocolError::BadHeader),
            (b"*\"a\" b\r\n", ProtocolError::InvalidMultibulkLength),
            (
                b"*1\r\n$99999999999999999999999\r\n",
                ProtocolError::InvalidBulkLength,
            ),
            (
                b"*99999999999999999999999\r\n",
                ProtocolError::InvalidMultibulkLength,
            ),
            (b"get \"x\n", ProtocolError::UnbalancedQuotes),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_all(input).as_ref(),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn limits_are_enforced() {
        let limits = Limits {
            max_bulk: 10,
            max_args: 3,
            max_inline: 16,
            max_request: 40,
        };
        let run = |input: &[u8]| {
            let mut buf = BytesMut::from(input);
            all(&mut Parser::new(limits), &mut buf)
        };
        assert!(run(b"*3\r\n$10\r\n0123456789\r\n$0\r\n\r\n$0\r\n\r\n").is_ok());
        assert_eq!(run(b"*4\r\n"), Err(ProtocolError::InvalidMultibulkLength));
        assert_eq!(run(b"*1\r\n$11\r\n"), Err(ProtocolError::InvalidBulkLength));
        assert_eq!(
            run(b"*1\r\n$99999999999\r\n"),
            Err(ProtocolError::InvalidBulkLength)
        );
        // A header line that never ends, an inline line that never ends.
        assert_eq!(run(b"*11111111111111111111"), Err(ProtocolError::BadHeader));
        assert_eq!(
            run(b"GET aaaaaaaaaaaaaaaa"),
            Err(ProtocolError::InlineTooBig)
        );
        // Within each bound, but the incomplete request outgrows max_request.
        let big = b"*3\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n$10\r\n0123";
        assert_eq!(run(big), Err(ProtocolError::RequestTooLarge(40)));
        // The same bytes minus a few are merely incomplete.
        assert_eq!(run(&big[..38]), Ok(vec![]));
    }

    #[test]
    fn int_parsing_is_canonical() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-12"), Some(-12));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"+1",
            b"01",
            b"-0",
            b" 1",
            b"1 ",
            b"9223372036854775808",
            b"1a",
        ] {
            assert_eq!(parse_int(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn error_replies_cannot_break_framing() {
        let mut out = BytesMut::new();
        put_error(&mut out, "ERR unknown command 'a\r\n+OK'");
        assert_eq!(&out[..], b"-ERR unknown command 'a  +OK'\r\n");
        out.clear();
        ProtocolError::ExpectedBulk(b'\n').reply(&mut out);
        assert_eq!(
            &out[..],
            b"-ERR Protocol error: expected '$', got '\\n'\r\n"
        );
    }

    /// Bytes that look like requests: protocol fragments (headers, lengths, CRLF, quotes,
    /// escapes) and random bytes in random order, so the parser's deeper paths run.
    fn protocol_like() -> impl Strategy<Value = Vec<u8>> {
        let token = prop_oneof![
            any::<u8>().prop_map(|b| vec![b]),
            prop::sample::select(vec![
                &b"*"[..],
                b"$",
                b"\r\n",
                b"\r",
                b"\n",
                b"-",
                b"0",
                b"1",
                b"3",
                b"9",
                b"64",
                b"65",
                b"*2\r\n",
                b"$3\r\nGET\r\n",
                b"$0\r\n\r\n",
                b" ",
                b"\"",
                b"'",
                b"\\",
                b"\\x4",
                b"\0",
                b"GET a",
                b"SET",
            ])
            .prop_map(|t| t.to_vec()),
        ];
        prop::collection::vec(token, 0..80).prop_map(|ts| ts.concat())
    }

    /// A request to encode: random arguments, including CR/LF and empty ones.
    fn request() -> impl Strategy<Value = Vec<Vec<u8>>> {
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6)
    }

    proptest! {
        /// Random bytes, however split, never panic; whole or split, the same requests
        /// come out, followed by the same outcome (waiting for more, or the same error).
        #[test]
        fn random_bytes_never_panic(
            input in prop_oneof![prop::collection::vec(any::<u8>(), 0..512), protocol_like()],
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let limits = Limits { max_bulk: 64, max_args: 8, max_inline: 64, max_request: 256 };
            let whole = feed_split(&input, &[], limits);
            let split = feed_split(&input, &cuts, limits);
            prop_assert_eq!(whole, split);
        }

        /// Valid pipelined multibulk and inline requests, split anywhere, parse to exactly
        /// the requests that were encoded, in order.
        #[test]
        fn pipelined_requests_parse_identically_however_split(
            reqs in prop::collection::vec(request(), 1..12),
            inline in prop::collection::vec(any::<bool>(), 12),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
        ) {
            let mut input = BytesMut::new();
            let mut want = Vec::new();
            for (i, req) in reqs.iter().enumerate() {
                let plain = req.iter().all(|a| !a.is_empty() && a.iter().all(|b| b.is_ascii_alphanumeric()));
                if inline[i] && plain {
                    // The same words as an inline line.
                    let line: Vec<u8> = req.join(&b' ');
                    input.extend_from_slice(&line);
                    input.extend_from_slice(b"\r\n");
                } else {
                    let args: Vec<&[u8]> = req.iter().map(|a| &a[..]).collect();
                    encode_request(&args, &mut input);
                }
                want.push(req.iter().map(|a| Bytes::copy_from_slice(a)).collect::<Vec<_>>());
            }
            let got = feed_split(&input, &cuts, Limits::default());
            prop_assert_eq!(got, Ok(want));
        }
    }

    /// The requests parsed before an error, and the error.
    type ErrorAfter = (Vec<Vec<Bytes>>, ProtocolError);

    /// Feeds `input` in pieces cut at `cuts`, taking every complete request after each
    /// piece; all requests, or the error with the requests before it.
    fn feed_split(
        input: &[u8],
        cuts: &[prop::sample::Index],
        limits: Limits,
    ) -> Result<Vec<Vec<Bytes>>, ErrorAfter> {
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
        at.push(input.len());
        at.sort_unstable();
        let mut parser = Parser::new(limits);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut from = 0;
        for to in at {
            buf.extend_from_slice(&input[from..to]);
            from = to;
            loop {
                match parser.next(&mut buf) {
                    Ok(Some(req)) => got.push(req),
                    Ok(None) => break,
                    Err(e) => return Err((got, e)),
                }
            }
        }
        Ok(got)
    }
}
