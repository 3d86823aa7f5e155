//! The key-value store, the commands, and the per-connection request loop of the `kv`
//! example. Nothing here knows about netchannel: a connection is any tokio
//! `AsyncRead + AsyncWrite`, so the loop is unit-tested over an in-memory pipe.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::{BufMut as _, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::resp::{
    parse_int, put_array, put_bulk, put_error, put_int, put_null, put_simple, Limits, Parser,
    ProtocolError,
};

/// Bytes counted for each entry beyond its key and value: the hash-table slot, the two
/// `Bytes` handles and their allocations' headers, roughly. Keeps `--max-memory` honest
/// for many small keys.
pub const ENTRY_OVERHEAD: usize = 64;

/// Bounds of a [`Store`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Most keys.
    pub max_keys: usize,
    /// Most bytes of keys, values and [`ENTRY_OVERHEAD`] per entry.
    pub max_memory: usize,
}

/// The reply to a write that would exceed the store's bounds (Redis's wording).
pub const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";
const NOT_INTEGER: &str = "ERR value is not an integer or out of range";

#[derive(Debug)]
struct Entry {
    value: Bytes,
    /// When the key expires (`SET ... EX/PX`); expired keys are removed when next touched
    /// or when the store is full.
    expires: Option<Instant>,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<Bytes, Entry>,
    /// Bytes counted against `max_memory`.
    used: usize,
}

fn cost(key: &[u8], value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD
}

impl Inner {
    /// The live entry for `key`, removing it if it expired.
    fn live(&mut self, key: &[u8], now: Instant) -> Option<&mut Entry> {
        let expired = self
            .map
            .get(key)
            .is_some_and(|e| e.expires.is_some_and(|t| t <= now));
        if expired {
            self.remove(key);
            return None;
        }
        self.map.get_mut(key)
    }

    fn remove(&mut self, key: &[u8]) -> bool {
        match self.map.remove_entry(key) {
            Some((k, e)) => {
                self.used -= cost(&k, &e.value);
                true
            }
            None => false,
        }
    }

    fn purge_expired(&mut self, now: Instant) {
        let mut freed = 0;
        self.map.retain(|k, e| {
            let keep = e.expires.is_none_or(|t| t > now);
            if !keep {
                freed += cost(k, &e.value);
            }
            keep
        });
        self.used -= freed;
    }

    /// Whether the writes in `puts` (key, new value length; each key at most once) fit the
    /// bounds, after replacing what the keys hold now. Purges expired keys once before
    /// saying no. One lookup per write: linear in `puts`.
    fn fits(&mut self, limits: &StoreLimits, puts: &[(&[u8], usize)], now: Instant) -> bool {
        for attempt in 0..2 {
            let (mut keys, mut used) = (self.map.len(), self.used);
            for &(key, len) in puts {
                match self.map.get(key) {
                    Some(old) => used -= cost(key, &old.value),
                    None => keys += 1,
                }
                used += key.len() + len + ENTRY_OVERHEAD;
            }
            if keys <= limits.max_keys && used <= limits.max_memory {
                return true;
            }
            if attempt == 0 {
                self.purge_expired(now);
            }
        }
        false
    }

    /// Stores `value` under `key`. Both must be copies of their own (see [`owned`]), made
    /// before the lock was taken.
    fn put(&mut self, key: Bytes, value: Bytes, expires: Option<Instant>) {
        self.used += cost(&key, &value);
        if let Some(old) = self.map.insert(key.clone(), Entry { value, expires }) {
            self.used -= cost(&key, &old.value);
        }
    }
}

/// A copy of `b` in an allocation of its own. A request's arguments share one allocation
/// with everything read in the same batch; storing a slice of it would pin all of that.
fn owned(b: &[u8]) -> Bytes {
    Bytes::copy_from_slice(b)
}

/// MSET's `key value ...` arguments with each key once, holding the last value given for
/// it (Redis: the last one wins), in the order the keys first appear; copies (see
/// [`owned`]). One hash-map pass, so linear in the request, and done before the store's
/// lock is taken.
fn last_wins(pairs: &[Bytes]) -> Vec<(Bytes, Bytes)> {
    let mut index: HashMap<&[u8], usize> = HashMap::with_capacity(pairs.len() / 2);
    let mut unique: Vec<(&[u8], &[u8])> = Vec::with_capacity(pairs.len() / 2);
    for kv in pairs.chunks_exact(2) {
        match index.entry(&kv[0][..]) {
            std::collections::hash_map::Entry::Occupied(at) => unique[*at.get()].1 = &kv[1],
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(unique.len());
                unique.push((&kv[0], &kv[1]));
            }
        }
    }
    unique
        .into_iter()
        .map(|(k, v)| (owned(k), owned(v)))
        .collect()
}

/// A shared in-memory key-value store with bounded keys and bytes.
#[derive(Debug)]
pub struct Store {
    inner: Mutex<Inner>,
    limits: StoreLimits,
}

/// What the connection does after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Read the next command.
    Continue,
    /// Send the replies and close (QUIT).
    Close,
}

/// How SET decides whether to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Condition {
    Always,
    IfAbsent,
    IfPresent,
}

/// The commands with their arity as Redis declares it: `n` exactly n words (the name
/// included), `-n` at least n.
const COMMANDS: &[(&str, i32)] = &[
    ("PING", -1),
    ("ECHO", 2),
    ("GET", 2),
    ("SET", -3),
    ("DEL", -2),
    ("EXISTS", -2),
    ("INCR", 2),
    ("MGET", -2),
    ("MSET", -3),
    ("DBSIZE", 1),
    ("FLUSHDB", -1),
    ("FLUSHALL", -1),
    ("SELECT", 2),
    ("CONFIG", -2),
    ("COMMAND", -1),
    ("CLIENT", -2),
    ("HELLO", -1),
    ("QUIT", -1),
];

fn arity_ok(arity: i32, n: usize) -> bool {
    if arity >= 0 {
        n == arity as usize
    } else {
        n >= arity.unsigned_abs() as usize
    }
}

fn wrong_arity(out: &mut BytesMut, name: &str) {
    put_error(
        out,
        &format!("ERR wrong number of arguments for '{name}' command"),
    );
}

/// Redis's reply to an unknown command, quoting (a bounded part of) what was sent.
fn unknown_command(out: &mut BytesMut, args: &[Bytes]) {
    let quote = |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(128)]).into_owned();
    let mut msg = format!(
        "ERR unknown command '{}', with args beginning with: ",
        quote(&args[0])
    );
    for a in args[1..].iter().take(8) {
        msg.push_str(&format!("'{}' ", quote(a)));
    }
    put_error(out, &msg);
}

/// `pattern` (Redis `CONFIG GET` glob: `*` and `?`, ASCII case-insensitive) matches `name`.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| glob(rest, &name[i..])),
        Some((&p, rest)) => name.split_first().is_some_and(|(&c, tail)| {
            (p == b'?' || p.eq_ignore_ascii_case(&c)) && glob(rest, tail)
        }),
    }
}

impl Store {
    /// An empty store.
    pub fn new(limits: StoreLimits) -> Store {
        Store {
            inner: Mutex::new(Inner::default()),
            limits,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the map inconsistent in a way that
        // matters more than losing the server: keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keys stored now (expired ones not yet removed included).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Runs one request (`args[0]` the command name, any case) and appends its reply to
    /// `out`.
    pub fn execute(&self, args: &[Bytes], out: &mut BytesMut) -> Flow {
        self.execute_at(args, out, Instant::now())
    }

    /// [`execute`](Self::execute) at time `now`, which expiry is judged against (tests
    /// pass the time in instead of waiting for the clock).
    fn execute_at(&self, args: &[Bytes], out: &mut BytesMut, now: Instant) -> Flow {
        let Some(name) = args.first() else {
            return Flow::Continue;
        };
        let Some(&(cmd, arity)) = COMMANDS
            .iter()
            .find(|(c, _)| c.as_bytes().eq_ignore_ascii_case(name))
        else {
            unknown_command(out, args);
            return Flow::Continue;
        };
        if !arity_ok(arity, args.len()) {
            wrong_arity(out, &cmd.to_ascii_lowercase());
            return Flow::Continue;
        }
        match cmd {
            "PING" => match args.len() {
                1 => put_simple(out, "PONG"),
                2 => put_bulk(out, &args[1]),
                _ => wrong_arity(out, "ping"),
            },
            "ECHO" => put_bulk(out, &args[1]),
            "GET" => match self.lock().live(&args[1], now) {
                Some(e) => put_bulk(out, &e.value),
                None => put_null(out),
            },
            "SET" => self.set(args, out, now),
            "DEL" => {
                let mut inner = self.lock();
                let n = args[1..].iter().filter(|k| inner.remove(k)).count();
                put_int(out, n as i64);
            }
            "EXISTS" => {
                // Each key counts as often as it is named, as in Redis.
                let mut inner = self.lock();
                let n = args[1..]
                    .iter()
                    .filter(|k| inner.live(k, now).is_some())
                    .count();
                put_int(out, n as i64);
            }
            "INCR" => self.incr(&args[1], out, now),
            "MGET" => {
                let mut inner = self.lock();
                put_array(out, args.len() - 1);
                for k in &args[1..] {
                    match inner.live(k, now) {
                        Some(e) => put_bulk(out, &e.value),
                        None => put_null(out),
                    }
                }
            }
            "MSET" => {
                if args.len() % 2 == 0 {
                    wrong_arity(out, "mset");
                    return Flow::Continue;
                }
                // Deduplicated and copied before locking: the lock is held only for one
                // lookup and one insertion per distinct key.
                let writes = last_wins(&args[1..]);
                let sizes: Vec<(&[u8], usize)> =
                    writes.iter().map(|(k, v)| (&k[..], v.len())).collect();
                let mut inner = self.lock();
                if !inner.fits(&self.limits, &sizes, now) {
                    put_error(out, OOM);
                    return Flow::Continue;
                }
                for (key, value) in writes {
                    inner.put(key, value, None);
                }
                put_simple(out, "OK");
            }
            "DBSIZE" => {
                let mut inner = self.lock();
                inner.purge_expired(now);
                put_int(out, inner.map.len() as i64);
            }
            "FLUSHDB" | "FLUSHALL" => {
                let mut inner = self.lock();
                inner.map.clear();
                inner.used = 0;
                put_simple(out, "OK");
            }
            "SELECT" => match parse_int(&args[1]) {
                Some(0) => put_simple(out, "OK"),
                Some(_) => put_error(out, "ERR DB index is out of range"),
                None => put_error(out, NOT_INTEGER),
            },
            "CONFIG" => self.config(args, out),
            "COMMAND" => command(args, out),
            "CLIENT" => client(args, out),
            "HELLO" => hello(args, out),
            "QUIT" => {
                put_simple(out, "OK");
                return Flow::Close;
            }
            _ => unknown_command(out, args),
        }
        Flow::Continue
    }

    /// `SET key value [NX|XX] [EX seconds|PX milliseconds]`.
    fn set(&self, args: &[Bytes], out: &mut BytesMut, now: Instant) {
        let mut condition = Condition::Always;
        let mut ttl: Option<Duration> = None;
        let mut i = 3;
        while i < args.len() {
            let opt = args[i].to_ascii_uppercase();
            match &opt[..] {
                b"NX" if condition != Condition::IfPresent => condition = Condition::IfAbsent,
                b"XX" if condition != Condition::IfAbsent => condition = Condition::IfPresent,
                b"EX" | b"PX" if ttl.is_none() && i + 1 < args.len() => {
                    let Some(n) = parse_int(&args[i + 1]) else {
                        put_error(out, NOT_INTEGER);
                        return;
                    };
                    if n <= 0 {
                        put_error(out, "ERR invalid expire time in 'set' command");
                        return;
                    }
                    ttl = Some(if &opt[..] == b"EX" {
                        Duration::from_secs(n as u64)
                    } else {
                        Duration::from_millis(n as u64)
                    });
                    i += 1;
                }
                b"GET" | b"KEEPTTL" | b"EXAT" | b"PXAT" => {
                    put_error(
                        out,
                        &format!(
                            "ERR SET option '{}' is not supported by this server (NX, XX, EX and PX are)",
                            String::from_utf8_lossy(&opt)
                        ),
                    );
                    return;
                }
                _ => {
                    put_error(out, "ERR syntax error");
                    return;
                }
            }
            i += 1;
        }
        let expires = match ttl.map(|t| now.checked_add(t)) {
            None => None,
            Some(Some(t)) => Some(t),
            // Too far in the future to represent: Redis says the same of such times.
            Some(None) => {
                put_error(out, "ERR invalid expire time in 'set' command");
                return;
            }
        };
        let (key, value) = (owned(&args[1]), owned(&args[2]));
        let mut inner = self.lock();
        let present = inner.live(&key, now).is_some();
        let write = match condition {
            Condition::Always => true,
            Condition::IfAbsent => !present,
            Condition::IfPresent => present,
        };
        if !write {
            put_null(out);
            return;
        }
        if !inner.fits(&self.limits, &[(&key, value.len())], now) {
            put_error(out, OOM);
            return;
        }
        inner.put(key, value, expires);
        put_simple(out, "OK");
    }

    /// `INCR key`: the value as a canonical 64-bit integer plus one; a missing key is 0.
    /// Keeps the key's expiry, as Redis does.
    fn incr(&self, key: &Bytes, out: &mut BytesMut, now: Instant) {
        let key = owned(key);
        let mut inner = self.lock();
        let (old, expires) = match inner.live(&key, now) {
            Some(e) => match parse_int(&e.value) {
                Some(n) => (n, e.expires),
                None => {
                    put_error(out, NOT_INTEGER);
                    return;
                }
            },
            None => (0, None),
        };
        let Some(new) = old.checked_add(1) else {
            put_error(out, "ERR increment or decrement would overflow");
            return;
        };
        let text = Bytes::from(new.to_string());
        if !inner.fits(&self.limits, &[(&key, text.len())], now) {
            put_error(out, OOM);
            return;
        }
        inner.put(key, text, expires);
        put_int(out, new);
    }

    /// `CONFIG GET pattern...`: the few parameters clients ask about at start-up
    /// (`redis-benchmark` reads `save` and `appendonly`); `CONFIG RESETSTAT` is accepted;
    /// `CONFIG SET` is refused.
    fn config(&self, args: &[Bytes], out: &mut BytesMut) {
        let sub = args[1].to_ascii_uppercase();
        match &sub[..] {
            b"GET" if args.len() >= 3 => {
                let params = [
                    ("save", String::new()),
                    ("appendonly", "no".to_string()),
                    ("maxmemory", self.limits.max_memory.to_string()),
                    ("databases", "1".to_string()),
                ];
                let found: Vec<_> = params
                    .iter()
                    .filter(|(name, _)| args[2..].iter().any(|p| glob(p, name.as_bytes())))
                    .collect();
                put_array(out, found.len() * 2);
                for (name, value) in found {
                    put_bulk(out, name.as_bytes());
                    put_bulk(out, value.as_bytes());
                }
            }
            b"GET" => wrong_arity(out, "config|get"),
            b"RESETSTAT" => put_simple(out, "OK"),
            b"SET" => put_error(out, "ERR CONFIG SET is not supported by this server"),
            _ => put_error(
                out,
                &format!(
                    "ERR unknown subcommand '{}'. Try CONFIG HELP.",
                    String::from_utf8_lossy(&args[1])
                ),
            ),
        }
    }
}

/// `COMMAND` (the names, without Redis's per-command details), `COMMAND COUNT`,
/// `COMMAND DOCS` (none: `redis-cli` then falls back to its built-in help), `COMMAND INFO`
/// (null for each name), `COMMAND LIST`.
fn command(args: &[Bytes], out: &mut BytesMut) {
    let names = || COMMANDS.iter().map(|(c, _)| c.to_ascii_lowercase());
    let Some(sub) = args.get(1) else {
        put_array(out, 0);
        return;
    };
    match &sub.to_ascii_uppercase()[..] {
        b"COUNT" => put_int(out, COMMANDS.len() as i64),
        b"DOCS" => put_array(out, 0),
        b"INFO" => {
            put_array(out, args.len() - 2);
            for _ in 2..args.len() {
                put_null(out);
            }
        }
        b"LIST" => {
            put_array(out, COMMANDS.len());
            for n in names() {
                put_bulk(out, n.as_bytes());
            }
        }
        _ => put_error(
            out,
            &format!(
                "ERR unknown subcommand '{}'. Try COMMAND HELP.",
                String::from_utf8_lossy(sub)
            ),
        ),
    }
}

/// `CLIENT SETNAME/SETINFO` (accepted, not kept: client libraries send them on connect)
/// and `CLIENT GETNAME`.
fn client(args: &[Bytes], out: &mut BytesMut) {
    match &args[1].to_ascii_uppercase()[..] {
        b"SETNAME" | b"SETINFO" => put_simple(out, "OK"),
        b"GETNAME" => put_null(out),
        _ => put_error(
            out,
            &format!(
                "ERR unknown subcommand '{}'. Try CLIENT HELP.",
                String::from_utf8_lossy(&args[1])
            ),
        ),
    }
}

/// `HELLO [2]`: the server's description as a flat RESP2 map; RESP3 is refused with
/// `NOPROTO`, on which clients fall back to RESP2.
fn hello(args: &[Bytes], out: &mut BytesMut) {
    if let Some(v) = args.get(1) {
        match parse_int(v) {
            Some(2) => {}
            Some(_) => {
                put_error(out, "NOPROTO unsupported protocol version");
                return;
            }
            None => {
                put_error(
                    out,
                    "ERR Protocol version is not an integer or out of range",
                );
                return;
            }
        }
    }
    put_array(out, 12);
    for (k, v) in [
        ("server", "netchannel-kv"),
        ("version", env!("CARGO_PKG_VERSION")),
    ] {
        put_bulk(out, k.as_bytes());
        put_bulk(out, v.as_bytes());
    }
    put_bulk(out, b"proto");
    put_int(out, 2);
    for (k, v) in [("mode", "standalone"), ("role", "master")] {
        put_bulk(out, k.as_bytes());
        put_bulk(out, v.as_bytes());
    }
    put_bulk(out, b"modules");
    put_array(out, 0);
}

/// Why a connection ended other than by the client closing it or QUIT.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The client broke the protocol; it got an error reply first.
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtocolError),
    /// Reading or writing failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The client read nothing of our replies for too long.
    #[error("the client read no replies for {0:?}")]
    WriteStalled(Duration),
    /// The request being received needed more of the memory shared by all connections
    /// than was left; the client got an error reply first.
    #[error("refused a request: {0}")]
    RequestMemory(RequestMemoryFull),
}

/// Bytes of a connection's input buffer not counted against [`RequestMemory`]: the room
/// of a read ([`READ_CHUNK`]) plus a few small pipelined requests, so that clients with
/// small requests never wait for, nor get refused by, the shared bound (these bytes are
/// bounded by the number of connections instead).
pub const UNCOUNTED_PER_CONNECTION: usize = 64 * 1024;

/// The memory that requests being received may hold, shared by all connections: bytes in
/// input buffers beyond [`UNCOUNTED_PER_CONNECTION`] each. A connection reserves bytes
/// before each read and gives back what it no longer buffers before the next; one that
/// finds too little left is refused (error reply, then closed) instead of waiting:
/// partial requests that wait for memory would keep holding what they have, so waiting
/// clients could hold all of it and stall each other for good.
#[derive(Debug)]
pub struct RequestMemory {
    limit: usize,
    in_use: AtomicUsize,
    peak: AtomicUsize,
    refused: AtomicU64,
}

/// What [`RequestMemory`] has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestMemoryStats {
    /// The bound, in bytes.
    pub limit: usize,
    /// Bytes reserved now.
    pub in_use: usize,
    /// Most bytes reserved at once so far.
    pub peak: usize,
    /// Requests refused because too little was left.
    pub refused: u64,
}

/// A request refused by [`RequestMemory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "requests in progress from all clients hold the server's request memory \
     ({limit} bytes, --max-request-memory)"
)]
pub struct RequestMemoryFull {
    /// The bound, in bytes.
    pub limit: usize,
}

impl RequestMemory {
    /// A bound of `limit` bytes.
    pub fn new(limit: usize) -> RequestMemory {
        RequestMemory {
            limit,
            in_use: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Counters and the bound, now.
    pub fn stats(&self) -> RequestMemoryStats {
        RequestMemoryStats {
            limit: self.limit,
            in_use: self.in_use.load(Ordering::Relaxed),
            peak: self.peak.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }

    /// Reserves `n` more bytes if they fit under the bound.
    fn try_reserve(&self, n: usize) -> bool {
        let reserved = self
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            });
        match reserved {
            Ok(before) => {
                self.peak.fetch_max(before + n, Ordering::Relaxed);
                true
            }
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    fn release(&self, n: usize) {
        self.in_use.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The bytes of [`RequestMemory`] one connection holds; given back when dropped, however
/// the connection ends.
struct Reservation<'a> {
    memory: &'a RequestMemory,
    held: usize,
}

impl Reservation<'_> {
    /// Holds exactly what a buffer of `buffered` bytes about to take one more read needs:
    /// reserves the difference, or gives back the excess.
    fn hold_for(&mut self, buffered: usize) -> Result<(), RequestMemoryFull> {
        let need = (buffered + READ_CHUNK).saturating_sub(UNCOUNTED_PER_CONNECTION);
        if need > self.held {
            if !self.memory.try_reserve(need - self.held) {
                return Err(RequestMemoryFull {
                    limit: self.memory.limit,
                });
            }
        } else {
            self.memory.release(self.held - need);
        }
        self.held = need;
        Ok(())
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.memory.release(self.held);
    }
}

/// Replies are sent once this many bytes are pending even if more complete requests are
/// buffered, so a long pipeline does not pile up unbounded output.
const FLUSH_AT: usize = 64 * 1024;
/// Bytes asked of each read.
const READ_CHUNK: usize = 16 * 1024;

/// What [`serve_connection`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// Requests executed.
    pub commands: u64,
    /// Whether the client ended with QUIT (otherwise it closed its side).
    pub quit: bool,
}

async fn send<S: AsyncWrite + Unpin>(
    stream: &mut S,
    out: &mut BytesMut,
    timeout: Duration,
) -> Result<(), ConnError> {
    if out.is_empty() {
        return Ok(());
    }
    match tokio::time::timeout(timeout, stream.write_all(out)).await {
        Ok(Ok(())) => {
            out.clear();
            Ok(())
        }
        Ok(Err(source)) => Err(ConnError::Io {
            what: "writing replies",
            source,
        }),
        Err(_) => Err(ConnError::WriteStalled(timeout)),
    }
}

/// Serves one client on `stream` until it closes its side, sends QUIT, breaks the
/// protocol, or needs more of `memory` than is left for the request it is sending (in the
/// last two cases it gets an error reply first). Every complete request in what has
/// arrived is executed before the replies go out together in one write (pipelining);
/// `write_timeout` bounds each write. Shuts down the write side at the end.
pub async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    store: &Store,
    limits: Limits,
    memory: &RequestMemory,
    write_timeout: Duration,
) -> Result<Served, ConnError> {
    let mut reservation = Reservation { memory, held: 0 };
    let mut parser = Parser::new(limits);
    let mut input = BytesMut::with_capacity(READ_CHUNK);
    let mut out = BytesMut::with_capacity(READ_CHUNK);
    let mut served = Served {
        commands: 0,
        quit: false,
    };
    loop {
        loop {
            match parser.next(&mut input) {
                Ok(Some(req)) => {
                    served.commands += 1;
                    if store.execute(&req, &mut out) == Flow::Close {
                        served.quit = true;
                        break;
                    }
                    if out.len() >= FLUSH_AT {
                        send(stream, &mut out, write_timeout).await?;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    e.reply(&mut out);
                    send(stream, &mut out, write_timeout).await?;
                    let _ = stream.shutdown().await;
                    return Err(e.into());
                }
            }
        }
        send(stream, &mut out, write_timeout).await?;
        if served.quit {
            break;
        }
        // The requests executed above are gone from `input` (and their bytes freed once
        // their replies were built); what is left is the start of the next request.
        if let Err(full) = reservation.hold_for(input.len()) {
            put_error(&mut out, &format!("ERR {full}; try again later"));
            send(stream, &mut out, write_timeout).await?;
            let _ = stream.shutdown().await;
            return Err(ConnError::RequestMemory(full));
        }
        input.reserve(READ_CHUNK);
        // At most READ_CHUNK, however much room `reserve` left: that is what was reserved.
        let n = stream
            .read_buf(&mut (&mut input).limit(READ_CHUNK))
            .await
            .map_err(|source| ConnError::Io {
                what: "reading requests",
                source,
            })?;
        if n == 0 {
            break;
        }
    }
    let _ = stream.shutdown().await;
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::encode_request;
    use std::sync::Arc;

    const BIG: StoreLimits = StoreLimits {
        max_keys: 1000,
        max_memory: 1 << 20,
    };
    const BIG_VALUES: StoreLimits = StoreLimits {
        max_keys: 1000,
        max_memory: 16 << 20,
    };

    /// Runs `args` (words) against `store`; the raw reply.
    fn run(store: &Store, args: &[&str]) -> String {
        run_at(store, Instant::now(), args)
    }

    /// Like [`run`] at time `now`.
    fn run_at(store: &Store, now: Instant, args: &[&str]) -> String {
        let args: Vec<Bytes> = args
            .iter()
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect();
        let mut out = BytesMut::new();
        store.execute_at(&args, &mut out, now);
        String::from_utf8(out.to_vec()).expect("ASCII replies in these tests")
    }

    #[test]
    fn get_set_del_exists() {
        let s = Store::new(BIG);
        assert_eq!(run(&s, &["GET", "k"]), "$-1\r\n");
        assert_eq!(run(&s, &["set", "k", "v1"]), "+OK\r\n");
        assert_eq!(run(&s, &["GeT", "k"]), "$2\r\nv1\r\n");
        assert_eq!(run(&s, &["SET", "k", ""]), "+OK\r\n");
        assert_eq!(run(&s, &["GET", "k"]), "$0\r\n\r\n");
        assert_eq!(run(&s, &["SET", "j", "x"]), "+OK\r\n");
        assert_eq!(run(&s, &["EXISTS", "k", "j", "k", "none"]), ":3\r\n");
        assert_eq!(run(&s, &["DEL", "k", "none", "j", "k"]), ":2\r\n");
        assert_eq!(run(&s, &["EXISTS", "k", "j"]), ":0\r\n");
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn set_options() {
        let s = Store::new(BIG);
        assert_eq!(run(&s, &["SET", "k", "a", "XX"]), "$-1\r\n");
        assert_eq!(run(&s, &["SET", "k", "a", "nx"]), "+OK\r\n");
        assert_eq!(run(&s, &["SET", "k", "b", "NX"]), "$-1\r\n");
        assert_eq!(run(&s, &["SET", "k", "c", "XX"]), "+OK\r\n");
        assert_eq!(run(&s, &["GET", "k"]), "$1\r\nc\r\n");
        assert_eq!(
            run(&s, &["SET", "k", "c", "NX", "XX"]),
            "-ERR syntax error\r\n"
        );
        assert_eq!(run(&s, &["SET", "k", "c", "EX"]), "-ERR syntax error\r\n");
        assert_eq!(run(&s, &["SET", "k", "c", "FOO"]), "-ERR syntax error\r\n");
        assert_eq!(
            run(&s, &["SET", "k", "c", "EX", "x"]),
            "-ERR value is not an integer or out of range\r\n"
        );
        assert_eq!(
            run(&s, &["SET", "k", "c", "PX", "0"]),
            "-ERR invalid expire time in 'set' command\r\n"
        );
        assert!(run(&s, &["SET", "k", "c", "GET"])
            .starts_with("-ERR SET option 'GET' is not supported"));
        assert_eq!(
            run(&s, &["GET", "k"]),
            "$1\r\nc\r\n",
            "failed SETs changed nothing"
        );
    }

    #[test]
    fn keys_expire() {
        let s = Store::new(BIG);
        let t0 = Instant::now();
        assert_eq!(run_at(&s, t0, &["SET", "k", "v", "PX", "30"]), "+OK\r\n");
        assert_eq!(
            run_at(&s, t0, &["SET", "long", "v", "EX", "100"]),
            "+OK\r\n"
        );
        let before = t0 + Duration::from_millis(29);
        assert_eq!(run_at(&s, before, &["GET", "k"]), "$1\r\nv\r\n");
        let after = t0 + Duration::from_millis(30);
        assert_eq!(run_at(&s, after, &["GET", "k"]), "$-1\r\n");
        assert_eq!(run_at(&s, after, &["EXISTS", "k", "long"]), ":1\r\n");
        assert_eq!(run_at(&s, after, &["DBSIZE"]), ":1\r\n");
    }

    #[test]
    fn incr_like_redis() {
        let s = Store::new(BIG);
        assert_eq!(run(&s, &["INCR", "n"]), ":1\r\n");
        assert_eq!(run(&s, &["incr", "n"]), ":2\r\n");
        assert_eq!(run(&s, &["GET", "n"]), "$1\r\n2\r\n");
        assert_eq!(run(&s, &["SET", "n", "-5"]), "+OK\r\n");
        assert_eq!(run(&s, &["INCR", "n"]), ":-4\r\n");
        for bad in ["abc", "1.5", " 1", "01", "+1", "", "99999999999999999999"] {
            assert_eq!(run(&s, &["SET", "b", bad]), "+OK\r\n");
            assert_eq!(
                run(&s, &["INCR", "b"]),
                "-ERR value is not an integer or out of range\r\n",
                "{bad:?}"
            );
        }
        assert_eq!(run(&s, &["SET", "m", &i64::MAX.to_string()]), "+OK\r\n");
        assert_eq!(
            run(&s, &["INCR", "m"]),
            "-ERR increment or decrement would overflow\r\n"
        );
        assert_eq!(run(&s, &["GET", "m"]), format!("$19\r\n{}\r\n", i64::MAX));
    }

    #[test]
    fn mget_mset() {
        let s = Store::new(BIG);
        assert_eq!(run(&s, &["MSET", "a", "1", "b", "2", "a", "3"]), "+OK\r\n");
        assert_eq!(
            run(&s, &["MGET", "a", "none", "b"]),
            "*3\r\n$1\r\n3\r\n$-1\r\n$1\r\n2\r\n"
        );
        assert_eq!(
            run(&s, &["MSET", "a", "1", "b"]),
            "-ERR wrong number of arguments for 'mset' command\r\n"
        );
    }

    #[test]
    fn arity_unknown_commands_and_ping_echo() {
        let s = Store::new(BIG);
        assert_eq!(run(&s, &["PING"]), "+PONG\r\n");
        assert_eq!(run(&s, &["ping", "hi"]), "$2\r\nhi\r\n");
        assert_eq!(
            run(&s, &["PING", "a", "b"]),
            "-ERR wrong number of arguments for 'ping' command\r\n"
        );
        assert_eq!(run(&s, &["ECHO", "x y"]), "$3\r\nx y\r\n");
        for (args, name) in [
            (&["GET"][..], "get"),
            (&["GET", "a", "b"], "get"),
            (&["SET", "a"], "set"),
            (&["DEL"], "del"),
            (&["INCR"], "incr"),
            (&["MGET"], "mget"),
            (&["ECHO"], "echo"),
            (&["EXISTS"], "exists"),
        ] {
            assert_eq!(
                run(&s, args),
                format!("-ERR wrong number of arguments for '{name}' command\r\n")
            );
        }
        assert_eq!(
            run(&s, &["FOO", "a", "b"]),
            "-ERR unknown command 'FOO', with args beginning with: 'a' 'b' \r\n"
        );
        assert_eq!(
            run(&s, &["GETX"]),
            "-ERR unknown command 'GETX', with args beginning with: \r\n"
        );
    }

    #[test]
    fn start_up_commands_clients_send() {
        let s = Store::new(BIG);
        assert_eq!(
            run(&s, &["CONFIG", "GET", "save"]),
            "*2\r\n$4\r\nsave\r\n$0\r\n\r\n"
        );
        assert_eq!(
            run(&s, &["config", "get", "appendonly"]),
            "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n"
        );
        assert_eq!(
            run(&s, &["CONFIG", "GET", "max*"]),
            "*2\r\n$9\r\nmaxmemory\r\n$7\r\n1048576\r\n"
        );
        assert_eq!(run(&s, &["CONFIG", "GET", "nothing"]), "*0\r\n");
        assert!(run(&s, &["CONFIG", "SET", "save", ""]).starts_with("-ERR"));
        assert_eq!(
            run(&s, &["CONFIG", "GET"]),
            "-ERR wrong number of arguments for 'config|get' command\r\n"
        );
        assert_eq!(run(&s, &["COMMAND", "DOCS"]), "*0\r\n");
        assert_eq!(run(&s, &["COMMAND"]), "*0\r\n");
        assert_eq!(
            run(&s, &["COMMAND", "COUNT"]),
            format!(":{}\r\n", COMMANDS.len())
        );
        assert_eq!(
            run(&s, &["COMMAND", "INFO", "get", "x"]),
            "*2\r\n$-1\r\n$-1\r\n"
        );
        assert_eq!(run(&s, &["SELECT", "0"]), "+OK\r\n");
        assert_eq!(
            run(&s, &["SELECT", "1"]),
            "-ERR DB index is out of range\r\n"
        );
        assert_eq!(run(&s, &["CLIENT", "SETNAME", "x"]), "+OK\r\n");
        assert_eq!(
            run(&s, &["HELLO", "3"]),
            "-NOPROTO unsupported protocol version\r\n"
        );
        assert!(run(&s, &["HELLO", "2"]).starts_with("*12\r\n$6\r\nserver\r\n"));
    }

    #[test]
    fn writes_beyond_the_bounds_get_oom() {
        let s = Store::new(StoreLimits {
            max_keys: 2,
            max_memory: 2 * (ENTRY_OVERHEAD + 12),
        });
        assert_eq!(run(&s, &["SET", "a", "1"]), "+OK\r\n");
        assert_eq!(run(&s, &["SET", "b", "2"]), "+OK\r\n");
        assert_eq!(
            run(&s, &["SET", "c", "3"]),
            format!("-{OOM}\r\n"),
            "third key"
        );
        assert_eq!(run(&s, &["INCR", "c"]), format!("-{OOM}\r\n"));
        assert_eq!(
            run(&s, &["MSET", "a", "5", "c", "3"]),
            format!("-{OOM}\r\n")
        );
        assert_eq!(
            run(&s, &["GET", "a"]),
            "$1\r\n1\r\n",
            "a failed MSET writes nothing"
        );
        // Overwriting an existing key is fine while the bytes fit...
        assert_eq!(run(&s, &["SET", "a", "12345678901"]), "+OK\r\n");
        // ...and not once they do not.
        assert_eq!(
            run(&s, &["SET", "b", "123456789012"]),
            format!("-{OOM}\r\n")
        );
        assert_eq!(run(&s, &["DEL", "a"]), ":1\r\n");
        assert_eq!(
            run(&s, &["SET", "c", "3"]),
            "+OK\r\n",
            "room again after DEL"
        );
        // Expired keys make room.
        let t0 = Instant::now();
        assert_eq!(run_at(&s, t0, &["FLUSHALL"]), "+OK\r\n");
        assert_eq!(run_at(&s, t0, &["SET", "a", "1", "PX", "1"]), "+OK\r\n");
        assert_eq!(run_at(&s, t0, &["SET", "b", "1"]), "+OK\r\n");
        let later = t0 + Duration::from_millis(5);
        assert_eq!(run_at(&s, later, &["SET", "c", "1"]), "+OK\r\n");
    }

    /// 100 000 keys in one MSET of 250 000 pairs: every key twice, every other one three
    /// times. The last value of each key is the one stored, each key counts once against
    /// the bounds, and the bytes counted are those of the final values. (Checking each
    /// pair against all the pairs before it, as MSET once did, would take some 3 * 10^10
    /// comparisons here.)
    #[test]
    fn mset_with_many_duplicate_keys_keeps_the_last_value_of_each() {
        const KEYS: usize = 100_000;
        let key = |i: usize| format!("key:{i}");
        let mut args = vec![Bytes::from_static(b"MSET")];
        let mut push = |k: String, v: String| {
            args.push(Bytes::from(k));
            args.push(Bytes::from(v));
        };
        for i in 0..KEYS {
            push(key(i), format!("first:{i}"));
        }
        for i in (0..KEYS).step_by(2) {
            push(key(i), format!("middle value {i}"));
        }
        for i in (0..KEYS).rev() {
            push(key(i), format!("v{i}"));
        }
        assert_eq!(args.len(), 1 + 2 * 250_000);

        let writes = last_wins(&args[1..]);
        assert_eq!(writes.len(), KEYS, "each key once");
        for (i, (k, v)) in writes.iter().enumerate() {
            assert_eq!(
                (&k[..], &v[..]),
                (key(i).as_bytes(), format!("v{i}").as_bytes())
            );
        }

        // Bounds that fit the final values exactly: counting duplicates (or their values)
        // would refuse it.
        let final_bytes: usize = (0..KEYS)
            .map(|i| cost(key(i).as_bytes(), format!("v{i}").as_bytes()))
            .sum();
        let s = Store::new(StoreLimits {
            max_keys: KEYS,
            max_memory: final_bytes,
        });
        let mut out = BytesMut::new();
        s.execute(&args, &mut out);
        assert_eq!(&out[..], b"+OK\r\n");
        assert_eq!(s.len(), KEYS);
        assert_eq!(s.lock().used, final_bytes);
        for i in [0, 1, 10, 4242, KEYS - 1] {
            let v = format!("v{i}");
            assert_eq!(
                run(&s, &["GET", &key(i)]),
                format!("${}\r\n{v}\r\n", v.len())
            );
        }
        // One byte less and the same MSET is refused, writing nothing.
        let s = Store::new(StoreLimits {
            max_keys: KEYS,
            max_memory: final_bytes - 1,
        });
        out.clear();
        s.execute(&args, &mut out);
        assert_eq!(out, format!("-{OOM}\r\n").as_bytes());
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn memory_accounting_returns_to_zero() {
        let s = Store::new(BIG);
        let t0 = Instant::now();
        run_at(&s, t0, &["MSET", "a", "1", "b", "22", "a", "333"]);
        run_at(&s, t0, &["SET", "c", "x", "PX", "1"]);
        run_at(&s, t0, &["INCR", "n"]);
        run_at(&s, t0, &["INCR", "n"]);
        let later = t0 + Duration::from_millis(5);
        run_at(&s, later, &["DBSIZE"]);
        run_at(&s, later, &["DEL", "a", "b", "n"]);
        assert_eq!(s.lock().used, 0);
        assert!(s.lock().map.is_empty());
    }

    /// Runs `serve_connection` over an in-memory pipe, writing `input` in pieces of
    /// `chunk` bytes and closing; everything the server sent back and how it ended.
    async fn converse(
        store: &Store,
        limits: Limits,
        input: &[u8],
        chunk: usize,
    ) -> (Vec<u8>, Result<Served, ConnError>) {
        converse_with(store, limits, &RequestMemory::new(usize::MAX), input, chunk).await
    }

    /// [`converse`] with request memory shared with other connections.
    async fn converse_with(
        store: &Store,
        limits: Limits,
        memory: &RequestMemory,
        input: &[u8],
        chunk: usize,
    ) -> (Vec<u8>, Result<Served, ConnError>) {
        let (mut client, mut server) = tokio::io::duplex(1 << 20);
        let serving = serve_connection(&mut server, store, limits, memory, Duration::from_secs(10));
        let talking = async {
            for piece in input.chunks(chunk.max(1)) {
                client.write_all(piece).await.unwrap();
            }
            client.shutdown().await.unwrap();
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        };
        let (served, got) = tokio::join!(serving, talking);
        (got, served)
    }

    #[tokio::test]
    async fn pipelined_requests_get_their_replies_in_order() {
        let store = Store::new(BIG);
        let mut input = BytesMut::new();
        for i in 0..100 {
            encode_request(&[b"SET", format!("k{i}").as_bytes(), b"v"], &mut input);
            encode_request(&[b"INCR", b"counter"], &mut input);
        }
        input.extend_from_slice(b"GET counter\r\nMGET k0 k99 nope\r\n");
        let mut want = String::new();
        for i in 1..=100 {
            want.push_str(&format!("+OK\r\n:{i}\r\n"));
        }
        want.push_str("$3\r\n100\r\n*3\r\n$1\r\nv\r\n$1\r\nv\r\n$-1\r\n");
        for chunk in [input.len(), 1, 7, 1000] {
            let store = Store::new(BIG);
            let (got, served) = converse(&store, Limits::default(), &input, chunk).await;
            assert_eq!(String::from_utf8_lossy(&got), want, "chunk {chunk}");
            assert_eq!(
                served.unwrap(),
                Served {
                    commands: 202,
                    quit: false
                }
            );
        }
        drop(store);
    }

    #[tokio::test]
    async fn quit_replies_then_closes_and_ignores_the_rest() {
        let store = Store::new(BIG);
        let (got, served) = converse(
            &store,
            Limits::default(),
            b"PING\r\nQUIT\r\nSET a b\r\n",
            64,
        )
        .await;
        assert_eq!(&got[..], b"+PONG\r\n+OK\r\n");
        assert!(served.unwrap().quit);
        assert_eq!(store.len(), 0, "nothing after QUIT ran");
    }

    #[tokio::test]
    async fn protocol_errors_are_replied_then_the_connection_closes() {
        let store = Store::new(BIG);
        let (got, served) = converse(
            &store,
            Limits::default(),
            b"SET a 1\r\n*1\r\n:12\r\nSET b 2\r\n",
            64,
        )
        .await;
        assert_eq!(
            String::from_utf8_lossy(&got),
            "+OK\r\n-ERR Protocol error: expected '$', got ':'\r\n"
        );
        assert!(matches!(
            served,
            Err(ConnError::Protocol(ProtocolError::ExpectedBulk(b':')))
        ));
        assert_eq!(store.len(), 1);
        // A request that outgrows the per-connection bound.
        let limits = Limits::with_max_request(1000);
        let mut input = BytesMut::new();
        encode_request(&[b"SET", b"k", &[b'x'; 2000]], &mut input);
        let (got, served) = converse(&store, limits, &input, 100).await;
        assert_eq!(
            String::from_utf8_lossy(&got),
            "-ERR Protocol error: invalid bulk length\r\n"
        );
        assert!(served.is_err());
        let (got, served) = converse(&store, limits, &[b'a'; 5000], 100).await;
        assert_eq!(
            String::from_utf8_lossy(&got),
            "-ERR Protocol error: request larger than 1000 bytes\r\n"
        );
        assert!(served.is_err());
    }

    /// Serves `server` as the kv server does, on its own task.
    fn spawn_server(
        mut server: tokio::io::DuplexStream,
        store: &Arc<Store>,
        limits: Limits,
        memory: &Arc<RequestMemory>,
    ) -> tokio::task::JoinHandle<Result<Served, ConnError>> {
        let (store, memory) = (store.clone(), memory.clone());
        tokio::spawn(async move {
            serve_connection(
                &mut server,
                &store,
                limits,
                &memory,
                Duration::from_secs(10),
            )
            .await
        })
    }

    /// Clients sending big requests slowly (the start of a 1 MB SET, 300 KB of it, then
    /// nothing) cannot make the server buffer more than the shared bound: two fill it, the
    /// third is refused with an error reply and closed, while a client with small requests
    /// is served throughout. The memory comes back when the big clients go.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn request_memory_is_bounded_across_connections() {
        const LIMIT: usize = 512 * 1024;
        const SENT: usize = 300 * 1024;
        const PIPE: usize = 4096;
        const DEADLINE: Duration = Duration::from_secs(60);
        let store = Arc::new(Store::new(BIG_VALUES));
        let memory = Arc::new(RequestMemory::new(LIMIT));
        let limits = Limits::with_max_request(2 << 20);
        let mut head = BytesMut::new();
        put_array(&mut head, 3);
        put_bulk(&mut head, b"SET");
        put_bulk(&mut head, b"big");
        head.extend_from_slice(b"$1000000\r\n");
        let mut partial = head.to_vec();
        partial.resize(SENT, b'x');

        // Two clients each get their 300 KB buffered: with a pipe of 4 KB, `write_all`
        // returns only once the server has read all but the last 4 KB.
        let mut holders = Vec::new();
        for _ in 0..2 {
            let (mut client, server) = tokio::io::duplex(PIPE);
            let task = spawn_server(server, &store, limits, &memory);
            client.write_all(&partial).await.unwrap();
            holders.push((client, task));
        }
        let held = memory.stats();
        // Each holds what it had buffered before its last read (all but the last two
        // pipefuls at least) beyond the uncounted part, plus room for that read.
        let at_least = 2 * (SENT - 2 * PIPE + READ_CHUNK - UNCOUNTED_PER_CONNECTION);
        assert!(held.in_use >= at_least, "{held:?}");
        assert!(held.in_use <= LIMIT && held.peak <= LIMIT, "{held:?}");
        assert_eq!(held.refused, 0);

        // The third cannot get its 300 KB buffered: it is told why and closed. (Its
        // writes fail once the server has closed; what it reads is what counts.)
        let (mut client, server) = tokio::io::duplex(PIPE);
        let task = spawn_server(server, &store, limits, &memory);
        let _ = client.write_all(&partial).await;
        let mut reply = Vec::new();
        // A deadline, so that a server that kept the connection open fails the test.
        tokio::time::timeout(DEADLINE, client.read_to_end(&mut reply))
            .await
            .expect("the server closed in time")
            .unwrap();
        let reply = String::from_utf8_lossy(&reply);
        assert!(
            reply.starts_with("-ERR requests in progress from all clients hold the server's request memory (524288 bytes"),
            "{reply}"
        );
        assert!(matches!(
            task.await.unwrap(),
            Err(ConnError::RequestMemory(RequestMemoryFull { limit: LIMIT }))
        ));
        let after = memory.stats();
        assert_eq!(after.refused, 1, "{after:?}");
        assert!(after.in_use <= LIMIT && after.peak <= LIMIT, "{after:?}");

        // A client with small requests is served meanwhile.
        let (mut client, server) = tokio::io::duplex(PIPE);
        let task = spawn_server(server, &store, limits, &memory);
        client
            .write_all(b"SET small v\r\nGET small\r\nMGET small big\r\n")
            .await
            .unwrap();
        client.shutdown().await.unwrap();
        let mut reply = Vec::new();
        // A deadline, so that a server that kept the connection open fails the test.
        tokio::time::timeout(DEADLINE, client.read_to_end(&mut reply))
            .await
            .expect("the server closed in time")
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&reply),
            "+OK\r\n$1\r\nv\r\n*2\r\n$1\r\nv\r\n$-1\r\n"
        );
        assert_eq!(task.await.unwrap().unwrap().commands, 3);
        assert_eq!(memory.stats().refused, 1);

        // The big clients go: everything they held (and the refused client's share) comes
        // back, and a big request fits.
        for (client, task) in holders {
            drop(client);
            assert!(task.await.unwrap().is_ok(), "closed by the client");
        }
        assert_eq!(memory.stats().in_use, 0);
        let mut input = BytesMut::new();
        encode_request(&[b"SET", b"big", &[b'y'; 400 * 1024]], &mut input);
        let (got, served) = converse_with(&store, limits, &memory, &input, PIPE).await;
        assert_eq!(&got[..], b"+OK\r\n");
        assert!(served.is_ok());
        let end = memory.stats();
        assert_eq!((end.in_use, end.refused), (0, 1), "{end:?}");
        assert!(end.peak <= LIMIT, "{end:?}");
    }

    #[test]
    fn glob_matching() {
        assert!(glob(b"*", b"save"));
        assert!(glob(b"SA?E", b"save"));
        assert!(glob(b"*only", b"appendonly"));
        assert!(!glob(b"save", b"saves"));
        assert!(!glob(b"", b"x"));
    }
}
