//! The RSS relay: the tc program that makes the test bed's veth ends behave like NICs with
//! receive-side scaling, and its loader.
//!
//! On a veth, a frame sent on tx queue `q` arrives on the peer's rx queue `q`: the sender
//! picks the queue. On a NIC, the receiver's RSS picks it from the frame's 4-tuple. The
//! RSS test bed puts a middle network namespace between the two stacks' veth ends, with
//! one veth pair to each (`vA`–`mA`, `mB`–`vB`), and attaches [`RssRelay`] to `mA` and
//! `mB`: every frame arriving on `mA` leaves through `mB` on the queue that `vB`'s "NIC"
//! would deliver it to — Toeplitz over the 4-tuple with [`RssTable`]'s key, then its
//! indirection table — and likewise the other way. `src/bpf/rss_relay.bpf.c` says how
//! non-TCP frames are hashed.
//!
//! The program is attached at tc ingress through TCX links (`BPF_TCX_INGRESS`, Linux 6.6
//! and later), which the kernel removes when the last descriptor closes: dropping the
//! relay, or the process dying, leaves nothing behind.
//!
//! ```no_run
//! use xdp_prog::{RelayEnd, RssRelay, RssTable};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let key = [0x6d, 0x5a].repeat(20); // 40 bytes
//! // Inside the middle namespace:
//! let relay = RssRelay::attach(
//!     "mA", &RssTable::spread(&key, 128, 4)?,   // toward vA: 4 queues
//!     "mB", &RssTable::spread(&key, 128, 4)?,   // toward vB
//! )?;
//! println!("toward B per queue: {:?}", relay.queue_counts(RelayEnd::B, 4)?);
//! # Ok(())
//! # }
//! ```

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, MapHandle, OpenObject};
use tracing::info;

#[allow(missing_docs, clippy::all, clippy::pedantic, unsafe_op_in_unsafe_fn)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/rss_relay.skel.rs"));
}

use skel::RssRelaySkelBuilder;

/// Queues the relay can pick: indirection entries must be below it. Kept in sync with
/// `MAX_QUEUES` in `src/bpf/rss_relay.bpf.c`.
pub const RELAY_MAX_QUEUES: u32 = 256;
/// The longest indirection table the relay takes (`MAX_INDIR`).
pub const RELAY_MAX_INDIRECTION: usize = 512;
/// The longest key the relay takes (`MAX_KEY`).
pub const RELAY_MAX_KEY: usize = 52;
/// Bytes of the key area of a direction (`MAX_KEY + 4`: zeros past the key).
const KEY_AREA: usize = RELAY_MAX_KEY + 4;

/// Errors of the relay.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// An [`RssTable`] the relay cannot use.
    #[error("invalid RSS table: {0}")]
    InvalidTable(String),
    /// No such interface in the calling thread's network namespace.
    #[error("no network interface named {ifname:?} in this network namespace")]
    NoSuchInterface {
        /// The name asked for.
        ifname: String,
    },
    /// Loading or attaching needs CAP_BPF and CAP_NET_ADMIN.
    #[error("{op}: operation not permitted (needs CAP_BPF and CAP_NET_ADMIN; run as root)")]
    NotPermitted {
        /// What was being done.
        op: &'static str,
    },
    /// The kernel refused to load the program.
    #[error("loading the RSS relay: {0}")]
    Load(#[source] libbpf_rs::Error),
    /// The kernel refused the TCX attachment (Linux before 6.6 has no TCX).
    #[error("attaching the RSS relay to {ifname:?} at tc ingress (TCX, Linux 6.6+): {source}")]
    Attach {
        /// The interface.
        ifname: String,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// A map operation failed.
    #[error("{op} in the relay's map {map}: {source}")]
    Map {
        /// The map.
        map: &'static str,
        /// What was being done.
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: libbpf_rs::Error,
    },
}

/// The RSS of one "NIC": a Toeplitz key and an indirection table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RssTable {
    key: Vec<u8>,
    indirection: Vec<u32>,
}

impl RssTable {
    /// A table with `key` (16 to [`RELAY_MAX_KEY`] bytes) and `indirection` (1 to
    /// [`RELAY_MAX_INDIRECTION`] entries, each below [`RELAY_MAX_QUEUES`]).
    pub fn new(key: &[u8], indirection: &[u32]) -> Result<RssTable, RelayError> {
        if !(16..=RELAY_MAX_KEY).contains(&key.len()) {
            return Err(RelayError::InvalidTable(format!(
                "a key of {} bytes (16 to {RELAY_MAX_KEY})",
                key.len()
            )));
        }
        if !(1..=RELAY_MAX_INDIRECTION).contains(&indirection.len()) {
            return Err(RelayError::InvalidTable(format!(
                "an indirection table of {} entries (1 to {RELAY_MAX_INDIRECTION})",
                indirection.len()
            )));
        }
        if let Some(q) = indirection.iter().find(|&&q| q >= RELAY_MAX_QUEUES) {
            return Err(RelayError::InvalidTable(format!(
                "queue {q} in the indirection table (below {RELAY_MAX_QUEUES})"
            )));
        }
        Ok(RssTable {
            key: key.to_vec(),
            indirection: indirection.to_vec(),
        })
    }

    /// `key` with a table of `len` entries spread round-robin over `queues` queues (entry
    /// `i` is queue `i mod queues`), as a driver's default table.
    pub fn spread(key: &[u8], len: usize, queues: u32) -> Result<RssTable, RelayError> {
        if queues == 0 {
            return Err(RelayError::InvalidTable("zero queues".into()));
        }
        let table: Vec<u32> = (0..len).map(|i| (i % queues as usize) as u32).collect();
        RssTable::new(key, &table)
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The indirection table.
    pub fn indirection(&self) -> &[u32] {
        &self.indirection
    }

    /// The bytes of a `struct rss_dir` for this table.
    fn dir_bytes(&self, out_ifindex: u32, slot: u32) -> Vec<u8> {
        let mut v = Vec::with_capacity(16 + KEY_AREA + 4 * RELAY_MAX_INDIRECTION);
        v.extend_from_slice(&out_ifindex.to_ne_bytes());
        v.extend_from_slice(&slot.to_ne_bytes());
        v.extend_from_slice(&(self.indirection.len() as u32).to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        let mut key = [0u8; KEY_AREA];
        key[..self.key.len()].copy_from_slice(&self.key);
        v.extend_from_slice(&key);
        for i in 0..RELAY_MAX_INDIRECTION {
            let q = self.indirection.get(i).copied().unwrap_or(0);
            v.extend_from_slice(&q.to_ne_bytes());
        }
        v
    }
}

/// One end of the relay: the side frames are sent toward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RelayEnd {
    /// Toward the first interface given to [`RssRelay::attach`] (the bed's side A).
    A,
    /// Toward the second (side B).
    B,
}

impl RelayEnd {
    fn slot(self) -> u32 {
        match self {
            RelayEnd::A => 0,
            RelayEnd::B => 1,
        }
    }
}

/// The relay's counters, summed over CPUs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RelayCounters {
    /// Frames hashed over the TCP/IPv4 4-tuple.
    pub tcp_hashed: u64,
    /// Frames hashed over the IPv4 addresses (other protocols, fragments).
    pub ip_hashed: u64,
    /// Frames not hashed (not IPv4), sent on queue 0.
    pub unhashed: u64,
    /// Frames that arrived on an interface the relay has no direction for (passed on to
    /// the middle namespace's own stack, which drops them).
    pub no_route: u64,
}

/// The relay attached between two interfaces; detached when dropped.
#[derive(Debug)]
pub struct RssRelay {
    ifnames: [String; 2],
    /// The TCX links, one per interface.
    _links: Vec<OwnedFd>,
    dirs: MapHandle,
    queue_counts: MapHandle,
    counters: MapHandle,
    last: MapHandle,
}

/// The program and its maps, loaded but not attached.
struct Loaded {
    prog: OwnedFd,
    dirs: MapHandle,
    queue_counts: MapHandle,
    counters: MapHandle,
    last: MapHandle,
}

fn load() -> Result<Loaded, RelayError> {
    let mut storage = MaybeUninit::<OpenObject>::uninit();
    let open = RssRelaySkelBuilder::default()
        .open(&mut storage)
        .map_err(RelayError::Load)?;
    let skel = open.load().map_err(|e| match e.kind() {
        libbpf_rs::ErrorKind::PermissionDenied => RelayError::NotPermitted {
            op: "loading the RSS relay",
        },
        _ => RelayError::Load(e),
    })?;
    let prog = skel
        .progs
        .rss_relay
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| RelayError::Load(libbpf_rs::Error::from(e)))?;
    let handle = |map: &libbpf_rs::Map<'_>, name: &'static str| {
        MapHandle::try_from(map).map_err(|source| RelayError::Map {
            map: name,
            op: "duplicating the descriptor",
            source,
        })
    };
    Ok(Loaded {
        prog,
        dirs: handle(&skel.maps.dirs, "dirs")?,
        queue_counts: handle(&skel.maps.queue_counts, "queue_counts")?,
        counters: handle(&skel.maps.counters, "counters")?,
        last: handle(&skel.maps.last, "last")?,
    })
}

fn ifindex_of(ifname: &str) -> Result<u32, RelayError> {
    match nix::net::if_::if_nametoindex(ifname) {
        Ok(i) if i != 0 => Ok(i),
        _ => Err(RelayError::NoSuchInterface {
            ifname: ifname.to_owned(),
        }),
    }
}

fn set_dir(
    dirs: &MapHandle,
    in_ifindex: u32,
    table: &RssTable,
    out_ifindex: u32,
    slot: u32,
) -> Result<(), RelayError> {
    dirs.update(
        &in_ifindex.to_ne_bytes(),
        &table.dir_bytes(out_ifindex, slot),
        MapFlags::ANY,
    )
    .map_err(|source| RelayError::Map {
        map: "dirs",
        op: "setting a direction",
        source,
    })
}

fn tcx_attach(prog: &OwnedFd, ifname: &str, ifindex: u32) -> Result<OwnedFd, RelayError> {
    let opts = libbpf_sys::bpf_link_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as libbpf_sys::size_t,
        ..Default::default()
    };
    let target = i32::try_from(ifindex).map_err(|_| RelayError::NoSuchInterface {
        ifname: ifname.to_owned(),
    })?;
    // SAFETY: BPF_LINK_CREATE system call; `opts` is a properly sized, initialised options
    // struct that outlives the call, and the kernel keeps no pointer into it.
    let fd = unsafe {
        libbpf_sys::bpf_link_create(prog.as_raw_fd(), target, libbpf_sys::BPF_TCX_INGRESS, &opts)
    };
    if fd < 0 {
        let source = io::Error::from_raw_os_error(-fd);
        if matches!(source.kind(), io::ErrorKind::PermissionDenied) {
            return Err(RelayError::NotPermitted {
                op: "attaching the RSS relay",
            });
        }
        return Err(RelayError::Attach {
            ifname: ifname.to_owned(),
            source,
        });
    }
    // SAFETY: `fd` is a new descriptor the kernel just returned to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl RssRelay {
    /// Attaches the relay to `a` and `b` (interfaces of the calling thread's network
    /// namespace): frames arriving on `a` leave through `b` on the queue `toward_b` picks,
    /// frames arriving on `b` leave through `a` on the queue `toward_a` picks.
    pub fn attach(
        a: &str,
        toward_a: &RssTable,
        b: &str,
        toward_b: &RssTable,
    ) -> Result<RssRelay, RelayError> {
        let (ia, ib) = (ifindex_of(a)?, ifindex_of(b)?);
        let loaded = load()?;
        set_dir(&loaded.dirs, ia, toward_b, ib, RelayEnd::B.slot())?;
        set_dir(&loaded.dirs, ib, toward_a, ia, RelayEnd::A.slot())?;
        let links = vec![
            tcx_attach(&loaded.prog, a, ia)?,
            tcx_attach(&loaded.prog, b, ib)?,
        ];
        info!(a, b, "RSS relay attached");
        Ok(RssRelay {
            ifnames: [a.to_owned(), b.to_owned()],
            _links: links,
            dirs: loaded.dirs,
            queue_counts: loaded.queue_counts,
            counters: loaded.counters,
            last: loaded.last,
        })
    }

    /// Replaces the table frames toward `end` are queued by (a NIC re-keyed at run time).
    pub fn set_table(&self, end: RelayEnd, table: &RssTable) -> Result<(), RelayError> {
        let (from, to) = match end {
            RelayEnd::A => (&self.ifnames[1], &self.ifnames[0]),
            RelayEnd::B => (&self.ifnames[0], &self.ifnames[1]),
        };
        set_dir(
            &self.dirs,
            ifindex_of(from)?,
            table,
            ifindex_of(to)?,
            end.slot(),
        )
    }

    /// Frames sent toward `end` on each of its first `queues` queues (at most
    /// [`RELAY_MAX_QUEUES`]).
    pub fn queue_counts(&self, end: RelayEnd, queues: u32) -> Result<Vec<u64>, RelayError> {
        (0..queues.min(RELAY_MAX_QUEUES))
            .map(|q| {
                let idx = end.slot() * RELAY_MAX_QUEUES + q;
                let v = self
                    .queue_counts
                    .lookup(&idx.to_ne_bytes(), MapFlags::ANY)
                    .map_err(|source| RelayError::Map {
                        map: "queue_counts",
                        op: "reading a queue's count",
                        source,
                    })?
                    .unwrap_or_default();
                Ok(v.get(..8)
                    .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes"))))
            })
            .collect()
    }

    /// The relay's counters, summed over CPUs.
    pub fn counters(&self) -> Result<RelayCounters, RelayError> {
        let per_cpu = self
            .counters
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| RelayError::Map {
                map: "counters",
                op: "reading the counters",
                source,
            })?
            .unwrap_or_default();
        let mut sum = RelayCounters::default();
        for bytes in per_cpu {
            let f = |i: usize| {
                bytes
                    .get(i * 8..i * 8 + 8)
                    .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
            };
            sum.tcp_hashed += f(0);
            sum.ip_hashed += f(1);
            sum.unhashed += f(2);
            sum.no_route += f(3);
        }
        Ok(sum)
    }

    /// The hash and queue of the latest frame relayed.
    pub fn last_frame(&self) -> Result<(u32, u32), RelayError> {
        read_last(&self.last)
    }

    /// The two interfaces, as given to [`attach`](Self::attach).
    pub fn ifnames(&self) -> [&str; 2] {
        [&self.ifnames[0], &self.ifnames[1]]
    }
}

fn read_last(last: &MapHandle) -> Result<(u32, u32), RelayError> {
    let v = last
        .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
        .map_err(|source| RelayError::Map {
            map: "last",
            op: "reading the last frame",
            source,
        })?
        .unwrap_or_default();
    let f = |i: usize| {
        v.get(i * 4..i * 4 + 4)
            .map_or(0, |b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
    };
    Ok((f(0), f(1)))
}

/// Runs the program once on `frame` (`BPF_PROG_TEST_RUN`, nothing is sent) and returns
/// its verdict; the frame counts as arrived on the loopback interface.
#[cfg(test)]
fn test_run(prog: &OwnedFd, frame: &[u8]) -> Result<u32, RelayError> {
    // SAFETY: `bpf_test_run_opts` is plain data; all zeroes is valid and asks for nothing.
    let mut opts: libbpf_sys::bpf_test_run_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as libbpf_sys::size_t;
    opts.data_in = frame.as_ptr().cast();
    opts.data_size_in = frame.len() as u32;
    opts.repeat = 1;
    // SAFETY: BPF_PROG_TEST_RUN on a program we own; `opts` points at `frame`, which
    // outlives the call and is only read; no output buffers are given.
    let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(prog.as_raw_fd(), &mut opts) };
    if rc < 0 {
        return Err(RelayError::Map {
            map: "(test run)",
            op: "running the program on a frame",
            source: libbpf_rs::Error::from(io::Error::from_raw_os_error(-rc)),
        });
    }
    Ok(opts.retval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direction_layout_matches_the_c_struct() {
        assert_eq!(
            std::mem::size_of::<skel::types::rss_dir>(),
            16 + KEY_AREA + 4 * RELAY_MAX_INDIRECTION
        );
        let t = RssTable::new(&[7; 40], &[1, 2, 3]).unwrap();
        let b = t.dir_bytes(9, 1);
        assert_eq!(b.len(), std::mem::size_of::<skel::types::rss_dir>());
        assert_eq!(&b[0..4], &9u32.to_ne_bytes());
        assert_eq!(&b[4..8], &1u32.to_ne_bytes());
        assert_eq!(&b[8..12], &3u32.to_ne_bytes());
        assert_eq!(&b[16..56], &[7; 40]);
        assert!(b[56..16 + KEY_AREA].iter().all(|&x| x == 0));
        assert_eq!(&b[16 + KEY_AREA..16 + KEY_AREA + 4], &1u32.to_ne_bytes());
        assert_eq!(std::mem::size_of::<skel::types::relay_counters>(), 32);
        assert_eq!(std::mem::size_of::<skel::types::last_frame>(), 8);
    }

    #[test]
    fn tables_are_checked() {
        assert!(RssTable::new(&[0; 15], &[0]).is_err());
        assert!(RssTable::new(&[0; 53], &[0]).is_err());
        assert!(RssTable::new(&[0; 40], &[]).is_err());
        assert!(RssTable::new(&[0; 40], &[0; 513]).is_err());
        assert!(RssTable::new(&[0; 40], &[256]).is_err());
        assert!(RssTable::spread(&[0; 40], 128, 0).is_err());
        let t = RssTable::spread(&[0; 40], 8, 3).unwrap();
        assert_eq!(t.indirection(), &[0, 1, 2, 0, 1, 2, 0, 1]);
    }

    /// Microsoft's RSS verification key and its IPv4 table: destination, source, hash of
    /// the addresses, hash with the TCP ports.
    const MS_KEY: [u8; 40] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f,
        0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
        0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
    ];
    /// (destination, port, source, port, address hash, 4-tuple hash).
    type Vector = ([u8; 4], u16, [u8; 4], u16, u32, u32);
    const VECTORS: [Vector; 5] = [
        (
            [161, 142, 100, 80],
            1766,
            [66, 9, 149, 187],
            2794,
            0x323e_8fc2,
            0x51cc_c178,
        ),
        (
            [65, 69, 140, 83],
            4739,
            [199, 92, 111, 2],
            14230,
            0xd718_262a,
            0xc626_b0ea,
        ),
        (
            [12, 22, 207, 184],
            38024,
            [24, 19, 198, 95],
            12898,
            0xd2d0_a5de,
            0x5c2b_394a,
        ),
        (
            [209, 142, 163, 6],
            2217,
            [38, 27, 205, 30],
            48228,
            0x8298_9176,
            0xafc7_327f,
        ),
        (
            [202, 188, 127, 2],
            1303,
            [153, 39, 163, 191],
            44251,
            0x5d18_09c5,
            0x10e8_28a2,
        ),
    ];

    /// An Ethernet + IPv4 + 20-byte L4 header frame.
    fn frame(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, proto: u8, frag: u16) -> Vec<u8> {
        let mut f = vec![0u8; 54];
        f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&40u16.to_be_bytes());
        f[20..22].copy_from_slice(&frag.to_be_bytes());
        f[22] = 64;
        f[23] = proto;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    /// Loading a program needs root; without it this skips, unless
    /// `NETCHANNEL_REQUIRE_XDP=1` makes it fail.
    fn loaded_or_skip() -> Option<Loaded> {
        match load() {
            Ok(l) => Some(l),
            Err(e) if std::env::var("NETCHANNEL_REQUIRE_XDP").as_deref() == Ok("1") => {
                panic!("NETCHANNEL_REQUIRE_XDP=1 but the relay cannot be loaded: {e}")
            }
            Err(e) => {
                eprintln!("skipping: {e}");
                None
            }
        }
    }

    #[test]
    fn program_hash_matches_the_microsoft_verification_vectors() {
        let Some(l) = loaded_or_skip() else { return };
        // 512 entries, entry i = i: the queue is the hash's low 9 bits, above the relay's
        // 256 queues folded to 0, so compare the hash itself and the queue where valid.
        let identity: Vec<u32> = (0..RELAY_MAX_INDIRECTION as u32)
            .map(|i| i % RELAY_MAX_QUEUES)
            .collect();
        let table = RssTable::new(&MS_KEY, &identity).unwrap();
        set_dir(&l.dirs, 1, &table, 1, 0).unwrap();
        const TCP: u8 = 6;
        const UDP: u8 = 17;
        for (dst, dport, src, sport, addr_hash, tcp_hash) in VECTORS {
            // TC_ACT_REDIRECT (7): the frame would leave through the configured interface.
            assert_eq!(
                test_run(&l.prog, &frame(src, sport, dst, dport, TCP, 0)).unwrap(),
                7
            );
            let (hash, queue) = read_last(&l.last).unwrap();
            assert_eq!(hash, tcp_hash, "{src:?}:{sport} -> {dst:?}:{dport}");
            assert_eq!(queue, (tcp_hash % 512) % 256);
            // UDP and a fragment of TCP: the addresses alone.
            for (proto, frag) in [(UDP, 0), (TCP, 0x2000)] {
                test_run(&l.prog, &frame(src, sport, dst, dport, proto, frag)).unwrap();
                assert_eq!(
                    read_last(&l.last).unwrap().0,
                    addr_hash,
                    "proto {proto} frag {frag:#x}"
                );
            }
        }
        // Not IPv4 (an ARP frame's EtherType): queue 0, no hash.
        let mut arp = frame([1; 4], 1, [2; 4], 2, TCP, 0);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        test_run(&l.prog, &arp).unwrap();
        assert_eq!(read_last(&l.last).unwrap(), (0, 0));
        // A table over 3 queues: queue = table[hash % len].
        let spread = RssTable::spread(&MS_KEY, 128, 3).unwrap();
        set_dir(&l.dirs, 1, &spread, 1, 0).unwrap();
        let (dst, dport, src, sport, _, tcp_hash) = VECTORS[2];
        test_run(&l.prog, &frame(src, sport, dst, dport, TCP, 0)).unwrap();
        assert_eq!(
            read_last(&l.last).unwrap(),
            (tcp_hash, (tcp_hash % 128) % 3)
        );
    }

    #[test]
    fn unknown_interface_is_typed() {
        let t = RssTable::spread(&[1; 40], 4, 2).unwrap();
        let e = RssRelay::attach("nc-relay-none0", &t, "nc-relay-none1", &t).unwrap_err();
        assert!(matches!(e, RelayError::NoSuchInterface { .. }), "{e}");
    }
}
