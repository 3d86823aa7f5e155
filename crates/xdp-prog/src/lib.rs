//! The XDP program that steers netchannel's flows to AF_XDP sockets, and its loader.
//!
//! `src/bpf/steer.bpf.c` is compiled at build time by `libbpf-cargo` into a skeleton and
//! loaded with `libbpf-rs`. Attached to an interface, it redirects to the AF_XDP socket
//! registered for the receiving queue (an `XSKMAP` keyed by rx queue index) exactly the IPv4
//! TCP segments whose destination the stack owns, and passes everything else — ARP, ICMP,
//! IPv6, VLAN-tagged frames, IPv4 fragments, the kernel's own TCP, ssh — to the kernel. It is
//! the only crate that touches BPF. For the AF_PACKET link, where no XDP program runs,
//! [`packet`] holds the socket filter and the TCX ingress drop that play the same part.
//!
//! It also holds [`RssRelay`] (`src/bpf/rss_relay.bpf.c`), the tc program that makes the
//! RSS test bed's veth ends behave like NICs with receive-side scaling.
//!
//! # Ownership of flows
//!
//! The stack declares what it owns with [`XdpSteering::own_port`] (a TCP destination port
//! on any local address) or [`XdpSteering::own_endpoint`] (one IPv4 address and port), and
//! withdraws it with the matching `release_*`. Ports are given in host byte order; the
//! program converts. A segment to an owned destination is redirected when a socket is
//! registered for its queue ([`XdpSteering::register_socket`]) and otherwise passed to the
//! kernel and counted in [`Counters::no_socket`].
//!
//! # Attachment
//!
//! The program is attached through a BPF link (`BPF_LINK_CREATE`), not the netlink
//! `IFLA_XDP` attribute: the kernel detaches a link-attached program as soon as the last
//! descriptor of the link closes, so a crashed process leaves nothing behind. Dropping
//! [`XdpSteering`] detaches it explicitly as well. Programs attached through netlink (by a
//! loader that crashed, or that attached our program some other way) do outlive their
//! process; [`XdpSteering::attach`] removes such a stale program first when
//! [`AttachOptions::replace_stale`] is set, and [`detach_stale`] does it on its own.
//!
//! Only a stale copy of *this crate's* program is ever removed: an XDP program named
//! `steer_linear` or `steer_frags` whose maps are exactly `xsks` (XSKMAP), `owned_ports`
//! (HASH) and `counters` (PERCPU_ARRAY), as in `src/bpf/steer.bpf.c`. Anything else on the
//! interface belongs to another tool, which may need it; it is left in place and the
//! removal fails with [`XdpError::ForeignProgram`], which says how to remove it by hand
//! (`ip link set dev IFACE xdpdrv off`, or `xdpgeneric off`) if it is not needed. The
//! removal names the program it expects (`XDP_FLAGS_REPLACE`), so a program swapped in
//! between the check and the removal is not touched either. A program held by a live BPF
//! link (another running process) is never removed ([`XdpError::Busy`]).
//!
//! [`AttachMode::Auto`] tries native (driver) mode and falls back to generic (SKB) mode,
//! logging the reason at `warn` level. [`AttachOptions::frags`] selects the `xdp.frags`
//! variant, needed on veth when the peer's MTU exceeds 3506 (sockets must then bind with
//! `XDP_USE_SG`).
//!
//! # For the AF_XDP link
//!
//! - Create sockets without a default program of their own (libxdp's: `LibxdpFlags::
//!   XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD`; netdriver's link loads none): this crate's
//!   program is the only one on the interface, and a second one would be refused.
//! - Bind one socket per rx queue and register each with [`XdpSteering::register_socket`]
//!   (netdriver's `XdpLink::fd`). The program looks up `ctx->rx_queue_index`;
//!   on veth that is the sender's tx queue index.
//! - Claim ports before the first segment can arrive (a listener's port before `listen`
//!   returns; a connection's local port before its SYN leaves), release them when the last
//!   listener or connection using them is gone.
//! - With [`AttachOptions::frags`], bind with `XDP_USE_SG`.
//!
//! # Example
//!
//! ```no_run
//! use std::os::fd::AsRawFd;
//! use xdp_prog::{AttachMode, AttachOptions, XdpSteering};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let xsk = std::net::UdpSocket::bind("0.0.0.0:0")?; // stands for an AF_XDP socket
//! let steering = XdpSteering::attach(
//!     "vB",
//!     AttachOptions { mode: AttachMode::Auto, frags: false, replace_stale: true },
//! )?;
//! // One AF_XDP socket per rx queue, bound to (vB, queue 0) elsewhere.
//! steering.register_socket(0, xsk.as_raw_fd())?;
//! steering.own_port(7000)?; // a listener on port 7000
//! let c = steering.counters()?;
//! println!("{:?} mode: seen {} redirected {} passed {}", steering.mode(), c.seen, c.redirected, c.passed);
//! drop(steering); // detaches the program
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddrV4;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Once;

use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType, OpenObject};
use tracing::{debug, info, warn};

pub mod rss_relay;

pub use rss_relay::{
    RelayCounters, RelayEnd, RelayError, RssRelay, RssTable, RELAY_MAX_INDIRECTION, RELAY_MAX_KEY,
    RELAY_MAX_QUEUES,
};

#[allow(missing_docs, clippy::all, clippy::pedantic, unsafe_op_in_unsafe_fn)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/steer.skel.rs"));
}

pub mod packet;
pub use packet::{tcx_ingress_programs, PacketCounters, PacketSteering, PacketSteeringError};

use skel::{types, SteerSkelBuilder};

/// Number of rx queues the program can steer: slots `0..MAX_QUEUES` of its `XSKMAP`.
///
/// Kept in sync with `MAX_QUEUES` in `src/bpf/steer.bpf.c`.
pub const MAX_QUEUES: u32 = 256;

/// How the program is attached to the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttachMode {
    /// Native mode if the driver supports it, else generic mode (the reason is logged).
    Auto,
    /// Native (driver) mode, `XDP_FLAGS_DRV_MODE`: the program runs in the driver's rx path.
    Native,
    /// Generic mode, `XDP_FLAGS_SKB_MODE`: the program runs after the kernel built an skb.
    Generic,
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttachMode::Auto => "auto",
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
        })
    }
}

/// Options of [`XdpSteering::attach`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachOptions {
    /// Native, generic, or native with a fallback to generic.
    pub mode: AttachMode,
    /// Attach the `xdp.frags` (multi-buffer) variant. Needed on veth when the peer's MTU is
    /// above 3506; AF_XDP sockets must then bind with `XDP_USE_SG`.
    pub frags: bool,
    /// Detach a stale copy of this crate's program attached to the interface through
    /// netlink (left by a crashed loader) instead of failing with [`XdpError::Busy`].
    /// Another tool's program is never replaced: with this set, it gives
    /// [`XdpError::ForeignProgram`].
    pub replace_stale: bool,
}

impl Default for AttachOptions {
    /// `Auto` mode, no frags, replace a stale program.
    fn default() -> Self {
        AttachOptions {
            mode: AttachMode::Auto,
            frags: false,
            replace_stale: true,
        }
    }
}

/// The program's counters, summed over CPUs.
///
/// Every frame counts in `seen` and then in exactly one of `redirected` and `passed`, so
/// `seen == redirected + passed` at rest. `no_socket` is a subset of `passed`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// Frames the program ran on.
    pub seen: u64,
    /// Owned segments handed to the queue's AF_XDP socket (the socket may still drop them
    /// when its fill or rx ring is full; see its `XDP_STATISTICS`).
    pub redirected: u64,
    /// Frames passed to the kernel, including the `no_socket` ones.
    pub passed: u64,
    /// Owned segments that arrived on a queue with no registered socket (passed to the
    /// kernel).
    pub no_socket: u64,
}

/// A program found attached to an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachedProgram {
    /// The kernel's id of the program (`bpftool prog show id N`).
    pub id: u32,
    /// Where it runs: [`AttachMode::Native`] or [`AttachMode::Generic`] (offloaded programs
    /// are reported as native).
    pub mode: AttachMode,
}

/// Errors of the loader.
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    /// The interface does not exist in the calling thread's network namespace.
    #[error("no network interface named {ifname:?} in this network namespace")]
    NoSuchInterface {
        /// The name asked for.
        ifname: String,
    },
    /// The operation needs CAP_BPF and CAP_NET_ADMIN (root).
    #[error("{op}: operation not permitted (loading and attaching XDP needs CAP_BPF and CAP_NET_ADMIN; run as root)")]
    NotPermitted {
        /// What was being done.
        op: &'static str,
    },
    /// The BPF object could not be opened or the kernel refused to load the program (the
    /// verifier log is in the `tracing` output of target `libbpf`).
    #[error("loading the XDP program: {0}")]
    Load(#[source] libbpf_rs::Error),
    /// Another XDP program is attached to the interface and was not replaced.
    #[error("interface {ifname:?} already has XDP program id {prog_id} attached ({reason})")]
    Busy {
        /// The interface.
        ifname: String,
        /// The id of the program found there.
        prog_id: u32,
        /// Why it was left in place.
        reason: &'static str,
    },
    /// The XDP program attached to the interface is not this crate's (another tool's), so
    /// it was neither replaced ([`AttachOptions::replace_stale`]) nor detached
    /// ([`detach_stale`]).
    #[error(
        "interface {ifname:?} has another tool's XDP program attached ({mode} mode, id \
         {prog_id}, name {name:?}; not netchannel's steering program), left in place; if \
         nothing needs it, remove it with `{off}` (or stop the program that holds it) and \
         try again",
        off = ip_xdp_off(.ifname, .mode)
    )]
    ForeignProgram {
        /// The interface.
        ifname: String,
        /// The kernel's id of the program found there (`bpftool prog show id N`).
        prog_id: u32,
        /// Its name as the kernel keeps it (at most 15 bytes; empty if it has none).
        name: String,
        /// Where it runs.
        mode: AttachMode,
    },
    /// Finding out what the program attached to an interface is failed.
    #[error("inspecting XDP program id {prog_id} attached to {ifname:?}: {source}")]
    Inspect {
        /// The interface.
        ifname: String,
        /// The kernel's id of the program.
        prog_id: u32,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// The kernel refused to attach the program in this mode.
    #[error("attaching XDP to {ifname:?} in {mode} mode: {source}{hint}")]
    Attach {
        /// The interface.
        ifname: String,
        /// The mode tried.
        mode: AttachMode,
        /// The kernel's error.
        #[source]
        source: io::Error,
        /// A likely cause, from the error code (empty when none is known).
        hint: &'static str,
    },
    /// Querying or detaching the program attached to an interface failed.
    #[error("{op} XDP on {ifname:?}: {source}")]
    Netlink {
        /// What was being done.
        op: &'static str,
        /// The interface.
        ifname: String,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// An update, deletion or lookup in one of the program's maps failed.
    #[error("{op} in BPF map {map}: {source}")]
    Map {
        /// The map: `xsks`, `owned_ports` or `counters`.
        map: &'static str,
        /// What was being done.
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: libbpf_rs::Error,
    },
    /// The queue index is outside the program's `XSKMAP`.
    #[error("rx queue {queue} is out of range: the program steers queues 0..{max}")]
    QueueOutOfRange {
        /// The queue asked for.
        queue: u32,
        /// [`MAX_QUEUES`].
        max: u32,
    },
}

/// The steering program, loaded and attached to one interface.
///
/// Dropping it detaches the program (errors are logged, never panic). All methods take
/// `&self`: map updates are single system calls, safe from any thread.
#[derive(Debug)]
pub struct XdpSteering {
    ifname: String,
    ifindex: u32,
    mode: AttachMode,
    frags: bool,
    prog_id: u32,
    /// The BPF link; `None` once detached.
    link: Option<OwnedFd>,
    xsks: MapHandle,
    owned: MapHandle,
    counters: MapHandle,
}

impl XdpSteering {
    /// Loads the program and attaches it to `ifname` (in the calling thread's network
    /// namespace).
    ///
    /// A stale copy of this crate's program attached through netlink is detached first
    /// when `opts.replace_stale` is set. Another tool's program is never touched and gives
    /// [`XdpError::ForeignProgram`]; one held by a live BPF link (another running process)
    /// is never touched either and gives [`XdpError::Busy`].
    pub fn attach(ifname: &str, opts: AttachOptions) -> Result<XdpSteering, XdpError> {
        route_libbpf_logs();
        let ifindex = ifindex_of(ifname)?;

        if let Some(old) = query(ifname, ifindex)? {
            if !opts.replace_stale {
                return Err(XdpError::Busy {
                    ifname: ifname.to_owned(),
                    prog_id: old.id,
                    reason: "replace_stale is off",
                });
            }
            remove_stale(ifname, ifindex)?;
        }

        let loaded = load(opts.frags)?;
        let (link, mode) = match opts.mode {
            AttachMode::Native => (
                link_create(ifname, ifindex, &loaded.prog, AttachMode::Native)?,
                AttachMode::Native,
            ),
            AttachMode::Generic => (
                link_create(ifname, ifindex, &loaded.prog, AttachMode::Generic)?,
                AttachMode::Generic,
            ),
            AttachMode::Auto => {
                match link_create(ifname, ifindex, &loaded.prog, AttachMode::Native) {
                    Ok(link) => (link, AttachMode::Native),
                    Err(XdpError::Attach { source, .. })
                        if !matches!(
                            source.raw_os_error(),
                            Some(libc_errno::EPERM | libc_errno::EBUSY | libc_errno::EEXIST)
                        ) =>
                    {
                        warn!(
                            ifname,
                            reason = %source,
                            "native XDP attach failed; falling back to generic (SKB) mode"
                        );
                        (
                            link_create(ifname, ifindex, &loaded.prog, AttachMode::Generic)?,
                            AttachMode::Generic,
                        )
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        // From here on, dropping `steering` detaches the program.
        let mut steering = XdpSteering {
            ifname: ifname.to_owned(),
            ifindex,
            mode,
            frags: opts.frags,
            prog_id: 0,
            link: Some(link),
            xsks: loaded.xsks,
            owned: loaded.owned,
            counters: loaded.counters,
        };
        match query(ifname, ifindex)? {
            Some(found) => steering.prog_id = found.id,
            None => {
                return Err(XdpError::Netlink {
                    op: "verifying the attachment of",
                    ifname: ifname.to_owned(),
                    source: io::Error::new(
                        io::ErrorKind::NotFound,
                        "no program attached after link creation",
                    ),
                })
            }
        }
        info!(ifname, ifindex, %mode, frags = opts.frags, prog_id = steering.prog_id, "XDP steering attached");
        Ok(steering)
    }

    /// Directs owned segments arriving on rx `queue` to the AF_XDP socket `xsk_fd` (bound
    /// to this interface and queue). Replaces the socket registered there before, if any.
    ///
    /// The map keeps its own reference to the socket; closing the socket removes it from the
    /// map.
    pub fn register_socket(&self, queue: u32, xsk_fd: RawFd) -> Result<(), XdpError> {
        check_queue(queue)?;
        let fd = u32::try_from(xsk_fd).map_err(|_| XdpError::Map {
            map: "xsks",
            op: "registering a socket",
            source: libbpf_rs::Error::from(io::Error::from_raw_os_error(libc_errno::EBADF)),
        })?;
        self.xsks
            .update(&queue.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| XdpError::Map {
                map: "xsks",
                op: "registering a socket",
                source,
            })?;
        debug!(ifname = %self.ifname, queue, xsk_fd, "AF_XDP socket registered");
        Ok(())
    }

    /// Removes the socket of rx `queue`, if any; owned segments arriving there are then
    /// passed to the kernel (and counted in `no_socket`). (The kernel does not let user space
    /// read an `XSKMAP`, so whether a socket was there is not reported.)
    pub fn unregister_socket(&self, queue: u32) -> Result<(), XdpError> {
        check_queue(queue)?;
        delete(
            &self.xsks,
            &queue.to_ne_bytes(),
            "xsks",
            "unregistering a socket",
        )
        .map(drop)
    }

    /// Claims TCP destination `port` (host byte order) on every local address.
    pub fn own_port(&self, port: u16) -> Result<(), XdpError> {
        self.own(owned_key(None, port))
    }

    /// Gives TCP destination `port` (claimed by [`own_port`](Self::own_port)) back to the
    /// kernel. Returns whether it was owned.
    pub fn release_port(&self, port: u16) -> Result<bool, XdpError> {
        delete(
            &self.owned,
            &owned_key(None, port),
            "owned_ports",
            "releasing a port",
        )
    }

    /// Claims TCP segments to exactly `endpoint` (one local IPv4 address and port).
    pub fn own_endpoint(&self, endpoint: SocketAddrV4) -> Result<(), XdpError> {
        self.own(owned_key(Some(endpoint), endpoint.port()))
    }

    /// Gives `endpoint` (claimed by [`own_endpoint`](Self::own_endpoint)) back to the kernel.
    /// Returns whether it was owned.
    pub fn release_endpoint(&self, endpoint: SocketAddrV4) -> Result<bool, XdpError> {
        delete(
            &self.owned,
            &owned_key(Some(endpoint), endpoint.port()),
            "owned_ports",
            "releasing an endpoint",
        )
    }

    fn own(&self, key: Vec<u8>) -> Result<(), XdpError> {
        self.owned
            .update(&key, &[1u8], MapFlags::ANY)
            .map_err(|source| XdpError::Map {
                map: "owned_ports",
                op: "claiming a destination",
                source,
            })
    }

    /// The program's counters, summed over all CPUs.
    pub fn counters(&self) -> Result<Counters, XdpError> {
        let per_cpu = self
            .counters
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| XdpError::Map {
                map: "counters",
                op: "reading the counters",
                source,
            })?
            .unwrap_or_default();
        let mut sum = Counters::default();
        for bytes in per_cpu {
            let c = decode_counters(&bytes);
            sum.seen += c.seen;
            sum.redirected += c.redirected;
            sum.passed += c.passed;
            sum.no_socket += c.no_socket;
        }
        Ok(sum)
    }

    /// The mode the program actually runs in: [`AttachMode::Native`] or
    /// [`AttachMode::Generic`].
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// Whether the `xdp.frags` variant is attached.
    pub fn frags(&self) -> bool {
        self.frags
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The kernel's id of the attached program.
    pub fn prog_id(&self) -> u32 {
        self.prog_id
    }

    /// Detaches the program now, reporting failure (dropping does the same and logs it).
    pub fn detach(mut self) -> Result<(), XdpError> {
        self.detach_link()
    }

    fn detach_link(&mut self) -> Result<(), XdpError> {
        let Some(link) = self.link.take() else {
            return Ok(());
        };
        // SAFETY: BPF_LINK_DETACH on a link descriptor we own; no memory is passed.
        let ret = unsafe { libbpf_sys::bpf_link_detach(link.as_raw_fd()) };
        // Closing the last descriptor releases the link, which detaches it too.
        drop(link);
        if ret < 0 {
            return Err(XdpError::Netlink {
                op: "detaching",
                ifname: self.ifname.clone(),
                source: io::Error::from_raw_os_error(-ret),
            });
        }
        info!(ifname = %self.ifname, prog_id = self.prog_id, "XDP steering detached");
        Ok(())
    }
}

impl Drop for XdpSteering {
    fn drop(&mut self) {
        if let Err(e) = self.detach_link() {
            warn!(error = %e, "detaching the XDP program (the link is closed anyway)");
        }
    }
}

/// Detaches a stale copy of this crate's program attached to `ifname` through netlink (left
/// by a crashed loader) and returns it, or `None` when nothing was attached.
///
/// Another tool's program is not touched and gives [`XdpError::ForeignProgram`]; a program
/// held by a live BPF link (such as a running [`XdpSteering`]) is not touched and gives
/// [`XdpError::Busy`].
pub fn detach_stale(ifname: &str) -> Result<Option<AttachedProgram>, XdpError> {
    let ifindex = ifindex_of(ifname)?;
    remove_stale(ifname, ifindex)
}

/// The XDP program attached to `ifname`, if any.
pub fn attached_program(ifname: &str) -> Result<Option<AttachedProgram>, XdpError> {
    let ifindex = ifindex_of(ifname)?;
    query(ifname, ifindex)
}

/// The iproute2 command that detaches a program attached through netlink in `mode`
/// (without a mode keyword, `ip` detaches the native one only).
fn ip_xdp_off(ifname: &str, mode: &AttachMode) -> String {
    let keyword = match mode {
        AttachMode::Generic => "xdpgeneric",
        _ => "xdpdrv",
    };
    format!("ip link set dev {ifname} {keyword} off")
}

/// The error codes this crate tests for (Linux values, the same on every architecture this
/// crate builds for).
mod libc_errno {
    pub const EPERM: i32 = 1;
    pub const EBADF: i32 = 9;
    pub const EACCES: i32 = 13;
    pub const EBUSY: i32 = 16;
    pub const EEXIST: i32 = 17;
    pub const ENOSPC: i32 = 28;
    pub const ERANGE: i32 = 34;
    pub const EOPNOTSUPP: i32 = 95;
}

fn ifindex_of(ifname: &str) -> Result<u32, XdpError> {
    match nix::net::if_::if_nametoindex(ifname) {
        Ok(i) if i != 0 => Ok(i),
        _ => Err(XdpError::NoSuchInterface {
            ifname: ifname.to_owned(),
        }),
    }
}

fn check_queue(queue: u32) -> Result<(), XdpError> {
    if queue < MAX_QUEUES {
        Ok(())
    } else {
        Err(XdpError::QueueOutOfRange {
            queue,
            max: MAX_QUEUES,
        })
    }
}

/// The bytes of a `struct owned_key`: the IPv4 address in network byte order (0 = any),
/// the port in host byte order, and zero padding.
fn owned_key(endpoint: Option<SocketAddrV4>, port: u16) -> Vec<u8> {
    let key = types::owned_key {
        addr: endpoint.map_or(0, |e| u32::from_ne_bytes(e.ip().octets())),
        port,
        pad: 0,
    };
    let mut bytes = Vec::with_capacity(8);
    bytes.extend_from_slice(&key.addr.to_ne_bytes());
    bytes.extend_from_slice(&key.port.to_ne_bytes());
    bytes.extend_from_slice(&key.pad.to_ne_bytes());
    bytes
}

fn decode_counters(bytes: &[u8]) -> types::counters {
    let field = |i: usize| {
        bytes
            .get(i * 8..i * 8 + 8)
            .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
    };
    types::counters {
        seen: field(0),
        redirected: field(1),
        passed: field(2),
        no_socket: field(3),
    }
}

fn delete(
    map: &MapHandle,
    key: &[u8],
    name: &'static str,
    op: &'static str,
) -> Result<bool, XdpError> {
    match map.delete(key) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(XdpError::Map {
            map: name,
            op,
            source,
        }),
    }
}

struct Loaded {
    prog: OwnedFd,
    xsks: MapHandle,
    owned: MapHandle,
    counters: MapHandle,
}

/// Opens and loads the object with only the wanted variant, and keeps descriptors of its
/// program and maps; the skeleton itself is dropped here (the kernel objects live on as long
/// as a descriptor does).
fn load(frags: bool) -> Result<Loaded, XdpError> {
    let mut storage = MaybeUninit::<OpenObject>::uninit();
    let mut open = SteerSkelBuilder::default()
        .open(&mut storage)
        .map_err(XdpError::Load)?;
    open.progs.steer_linear.set_autoload(!frags);
    open.progs.steer_frags.set_autoload(frags);
    let skel = open.load().map_err(|e| match e.kind() {
        libbpf_rs::ErrorKind::PermissionDenied => XdpError::NotPermitted {
            op: "loading the XDP program",
        },
        _ => XdpError::Load(e),
    })?;
    let prog = if frags {
        &skel.progs.steer_frags
    } else {
        &skel.progs.steer_linear
    };
    let prog = prog
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| XdpError::Load(libbpf_rs::Error::from(e)))?;
    let handle = |map: &libbpf_rs::Map<'_>, name: &'static str| {
        MapHandle::try_from(map).map_err(|source| XdpError::Map {
            map: name,
            op: "duplicating the descriptor",
            source,
        })
    };
    Ok(Loaded {
        prog,
        xsks: handle(&skel.maps.xsks, "xsks")?,
        owned: handle(&skel.maps.owned_ports, "owned_ports")?,
        counters: handle(&skel.maps.counters, "counters")?,
    })
}

fn link_create(
    ifname: &str,
    ifindex: u32,
    prog: &OwnedFd,
    mode: AttachMode,
) -> Result<OwnedFd, XdpError> {
    let flags = match mode {
        AttachMode::Native => libbpf_sys::XDP_FLAGS_DRV_MODE,
        AttachMode::Generic => libbpf_sys::XDP_FLAGS_SKB_MODE,
        AttachMode::Auto => 0,
    };
    let opts = libbpf_sys::bpf_link_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as libbpf_sys::size_t,
        flags,
        ..Default::default()
    };
    let target = i32::try_from(ifindex).map_err(|_| XdpError::NoSuchInterface {
        ifname: ifname.to_owned(),
    })?;
    // SAFETY: BPF_LINK_CREATE system call; `opts` is a properly sized, initialised options
    // struct that outlives the call, and the kernel keeps no pointer into it.
    let fd = unsafe {
        libbpf_sys::bpf_link_create(prog.as_raw_fd(), target, libbpf_sys::BPF_XDP, &opts)
    };
    if fd < 0 {
        let errno = -fd;
        if matches!(errno, libc_errno::EPERM | libc_errno::EACCES) {
            return Err(XdpError::NotPermitted {
                op: "attaching the XDP program",
            });
        }
        return Err(XdpError::Attach {
            ifname: ifname.to_owned(),
            mode,
            source: io::Error::from_raw_os_error(errno),
            hint: attach_hint(errno, mode),
        });
    }
    // SAFETY: `fd` is a new descriptor the kernel just returned to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn attach_hint(errno: i32, mode: AttachMode) -> &'static str {
    match (errno, mode) {
        (libc_errno::ERANGE, AttachMode::Native) => {
            " (on veth: the peer's MTU is above 3506; attach the xdp.frags variant or lower it)"
        }
        (libc_errno::ENOSPC, AttachMode::Native) => {
            " (on veth: this end has fewer rx queues than its peer has tx queues)"
        }
        (libc_errno::EOPNOTSUPP, AttachMode::Native) => {
            " (the driver has no native XDP; try generic mode)"
        }
        (libc_errno::EBUSY | libc_errno::EEXIST, _) => " (another XDP program is attached)",
        _ => "",
    }
}

fn query(ifname: &str, ifindex: u32) -> Result<Option<AttachedProgram>, XdpError> {
    let mut opts = libbpf_sys::bpf_xdp_query_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_xdp_query_opts>() as libbpf_sys::size_t,
        ..Default::default()
    };
    let target = i32::try_from(ifindex).map_err(|_| XdpError::NoSuchInterface {
        ifname: ifname.to_owned(),
    })?;
    // SAFETY: an RTM_GETLINK netlink request; `opts` is a properly sized options struct the
    // call fills in and keeps no pointer to.
    let ret = unsafe { libbpf_sys::bpf_xdp_query(target, 0, &mut opts) };
    if ret < 0 {
        return Err(XdpError::Netlink {
            op: "querying",
            ifname: ifname.to_owned(),
            source: io::Error::from_raw_os_error(-ret),
        });
    }
    let found = |id: u32, mode| (id != 0).then_some(AttachedProgram { id, mode });
    Ok(found(opts.drv_prog_id, AttachMode::Native)
        .or_else(|| found(opts.skb_prog_id, AttachMode::Generic))
        .or_else(|| found(opts.hw_prog_id, AttachMode::Native))
        .or_else(|| found(opts.prog_id, AttachMode::Native)))
}

/// The names of the programs in `src/bpf/steer.bpf.c` (their C function names).
const OUR_PROGRAMS: [&str; 2] = ["steer_linear", "steer_frags"];

/// The maps of `src/bpf/steer.bpf.c`, by name and type: all of them, none else.
const OUR_MAPS: [(&str, MapType); 3] = [
    ("xsks", MapType::Xskmap),
    ("owned_ports", MapType::Hash),
    ("counters", MapType::PercpuArray),
];

/// What [`inspect`] found out about a program.
#[derive(Debug)]
struct Inspected {
    /// Its name as the kernel keeps it.
    name: String,
    /// Whether it is this crate's program.
    ours: bool,
    /// A descriptor of it, to name it as the program expected when detaching.
    fd: OwnedFd,
}

/// Whether a program with this type, name and maps (name, type) is this crate's: an XDP
/// program with one of [`OUR_PROGRAMS`]' names and exactly [`OUR_MAPS`]. Any version of
/// the crate with the same program and map names passes, so that a stale program left by
/// an older build is recognised too.
fn is_ours(prog_type: u32, name: &str, maps: &[(String, MapType)]) -> bool {
    prog_type == libbpf_sys::BPF_PROG_TYPE_XDP
        && OUR_PROGRAMS.contains(&name)
        && maps.len() == OUR_MAPS.len()
        && OUR_MAPS
            .iter()
            .all(|(n, t)| maps.iter().any(|(m, u)| m == n && u == t))
}

/// Inspects program `prog_id` (found attached to `ifname`): its name, and whether it is
/// ours; `None` when it no longer exists.
fn inspect(ifname: &str, prog_id: u32) -> Result<Option<Inspected>, XdpError> {
    let err = |source: io::Error| match source.raw_os_error() {
        Some(libc_errno::EPERM | libc_errno::EACCES) => XdpError::NotPermitted {
            op: "inspecting the XDP program attached to the interface",
        },
        _ => XdpError::Inspect {
            ifname: ifname.to_owned(),
            prog_id,
            source,
        },
    };
    let fd = match libbpf_rs::Program::fd_from_id(prog_id) {
        Ok(fd) => fd,
        Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(io::Error::other(e))),
    };
    // Twice: first for the number of maps, then with room for their ids.
    let mut map_ids: Vec<u32> = Vec::new();
    let info = loop {
        // SAFETY: `bpf_prog_info` is plain integers and arrays of them; all zeroes is a
        // valid value, and the kernel requires the fields it is not asked to fill to be 0.
        let mut info: libbpf_sys::bpf_prog_info = unsafe { std::mem::zeroed() };
        info.nr_map_ids = map_ids.len() as u32;
        info.map_ids = map_ids.as_mut_ptr() as u64;
        let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
        // SAFETY: BPF_OBJ_GET_INFO_BY_FD on a program descriptor we own; `info` is `len`
        // bytes, and `map_ids` has room for the `nr_map_ids` ids the kernel may write.
        let ret =
            unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd.as_raw_fd(), &mut info, &mut len) };
        if ret < 0 {
            return Err(err(io::Error::from_raw_os_error(-ret)));
        }
        // A loaded program's maps do not change in number (short of BPF_PROG_BIND_MAP
        // between the calls, which the next round catches).
        if info.nr_map_ids as usize <= map_ids.len() {
            map_ids.truncate(info.nr_map_ids as usize);
            break info;
        }
        map_ids = vec![0; info.nr_map_ids as usize];
    };
    let raw: [u8; 16] = info.name.map(|c| c as u8);
    let name = std::ffi::CStr::from_bytes_until_nul(&raw)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&raw).into_owned());
    let mut maps = Vec::with_capacity(map_ids.len());
    for id in map_ids {
        let map = MapHandle::from_map_id(id).map_err(|e| err(io::Error::other(e)))?;
        maps.push((map.name().to_string_lossy().into_owned(), map.map_type()));
    }
    let ours = is_ours(info.type_, &name, &maps);
    debug!(
        ifname,
        prog_id,
        name,
        ?maps,
        ours,
        "inspected the attached XDP program"
    );
    Ok(Some(Inspected { name, ours, fd }))
}

/// Detaches from `ifname` what is attached through netlink if it is a stale copy of our
/// program, until nothing is left; the first program removed.
fn remove_stale(ifname: &str, ifindex: u32) -> Result<Option<AttachedProgram>, XdpError> {
    let mut removed = None;
    // Each round removes one program. More than one round: native and generic programs
    // cannot coexist, but a program may be swapped in between our look and our removal
    // (the kernel then refuses the removal, and we look again).
    for _ in 0..4 {
        let Some(found) = query(ifname, ifindex)? else {
            return Ok(removed);
        };
        let Some(program) = inspect(ifname, found.id)? else {
            // Gone meanwhile.
            continue;
        };
        if !program.ours {
            return Err(XdpError::ForeignProgram {
                ifname: ifname.to_owned(),
                prog_id: found.id,
                name: program.name,
                mode: found.mode,
            });
        }
        if detach_expected(ifname, ifindex, found, &program.fd)? {
            warn!(
                ifname,
                prog_id = found.id,
                mode = %found.mode,
                name = program.name,
                "detached a stale copy of netchannel's XDP program"
            );
            removed.get_or_insert(found);
        }
    }
    Err(XdpError::Busy {
        ifname: ifname.to_owned(),
        prog_id: query(ifname, ifindex)?.map_or(0, |p| p.id),
        reason: "the attached program kept changing while stale ones were being removed",
    })
}

/// Detaches `old` through netlink if it is still the program `expected` names
/// (`XDP_FLAGS_REPLACE`); `false` when another program (or none) is attached now.
fn detach_expected(
    ifname: &str,
    ifindex: u32,
    old: AttachedProgram,
    expected: &OwnedFd,
) -> Result<bool, XdpError> {
    let flags = match old.mode {
        AttachMode::Generic => libbpf_sys::XDP_FLAGS_SKB_MODE,
        _ => libbpf_sys::XDP_FLAGS_DRV_MODE,
    };
    let target = i32::try_from(ifindex).map_err(|_| XdpError::NoSuchInterface {
        ifname: ifname.to_owned(),
    })?;
    // With `old_prog_fd` set, libbpf adds XDP_FLAGS_REPLACE and the kernel detaches only if
    // that program is the one attached.
    let opts = libbpf_sys::bpf_xdp_attach_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_xdp_attach_opts>() as libbpf_sys::size_t,
        old_prog_fd: expected.as_raw_fd(),
        ..Default::default()
    };
    // SAFETY: an RTM_SETLINK netlink request; `opts` is a properly sized, initialised
    // options struct that outlives the call, and `expected` is a program descriptor we own.
    let ret = unsafe { libbpf_sys::bpf_xdp_detach(target, flags, &opts) };
    match -ret {
        0 => Ok(true),
        // Another program, or none, is attached now.
        libc_errno::EEXIST => Ok(false),
        libc_errno::EBUSY => Err(XdpError::Busy {
            ifname: ifname.to_owned(),
            prog_id: old.id,
            reason: "it is held by a live BPF link, i.e. a running process",
        }),
        libc_errno::EPERM | libc_errno::EACCES => Err(XdpError::NotPermitted {
            op: "detaching a stale XDP program",
        }),
        errno => Err(XdpError::Netlink {
            op: "detaching a stale program from",
            ifname: ifname.to_owned(),
            source: io::Error::from_raw_os_error(errno),
        }),
    }
}

/// Sends libbpf's own messages (verifier logs included) to `tracing`, target `libbpf`.
fn route_libbpf_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        fn print(level: libbpf_rs::PrintLevel, msg: String) {
            let msg = msg.trim_end();
            match level {
                libbpf_rs::PrintLevel::Warn => warn!(target: "libbpf", "{msg}"),
                libbpf_rs::PrintLevel::Info => info!(target: "libbpf", "{msg}"),
                libbpf_rs::PrintLevel::Debug => debug!(target: "libbpf", "{msg}"),
            }
        }
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, print)));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_key_layout_matches_the_c_struct() {
        assert_eq!(std::mem::size_of::<types::owned_key>(), 8);
        let key = owned_key(Some("10.77.0.2:7000".parse().unwrap()), 7000);
        assert_eq!(&key[..4], &[10, 77, 0, 2], "address in network byte order");
        assert_eq!(
            &key[4..6],
            &7000u16.to_ne_bytes(),
            "port in host byte order"
        );
        assert_eq!(&key[6..], &[0, 0]);
        assert_eq!(&owned_key(None, 80)[..4], &[0, 0, 0, 0], "0 = any address");
    }

    #[test]
    fn counters_decode_in_field_order() {
        assert_eq!(std::mem::size_of::<types::counters>(), 32);
        let bytes: Vec<u8> = [1u64, 2, 3, 4]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let c = decode_counters(&bytes);
        assert_eq!((c.seen, c.redirected, c.passed, c.no_socket), (1, 2, 3, 4));
    }

    #[test]
    fn unknown_interface_is_a_typed_error() {
        let err = XdpSteering::attach("ncxdp-nonexist", AttachOptions::default()).unwrap_err();
        assert!(matches!(err, XdpError::NoSuchInterface { .. }), "{err}");
        assert!(err.to_string().contains("ncxdp-nonexist"));
    }

    #[test]
    fn steering_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<XdpSteering>();
        shared::<XdpError>();
    }

    #[test]
    fn queue_range_is_checked() {
        assert!(check_queue(MAX_QUEUES - 1).is_ok());
        let err = check_queue(MAX_QUEUES).unwrap_err();
        assert!(
            matches!(
                err,
                XdpError::QueueOutOfRange {
                    queue: MAX_QUEUES,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn only_our_program_with_exactly_our_maps_is_ours() {
        let ours: Vec<(String, MapType)> = OUR_MAPS
            .iter()
            .rev()
            .map(|(n, t)| (n.to_string(), *t))
            .collect();
        let xdp = libbpf_sys::BPF_PROG_TYPE_XDP;
        assert!(is_ours(xdp, "steer_linear", &ours));
        assert!(is_ours(xdp, "steer_frags", &ours));
        assert!(!is_ours(xdp, "xdp_dispatcher", &ours), "libxdp's");
        assert!(!is_ours(xdp, "steer_linear", &[]), "our name, no maps");
        assert!(!is_ours(xdp, "steer_linear", &ours[..2]), "a map missing");
        let mut more = ours.clone();
        more.push(("xsks_map".into(), MapType::Xskmap));
        assert!(!is_ours(xdp, "steer_linear", &more), "a map more");
        let mut retyped = ours.clone();
        retyped[0].1 = MapType::Array;
        assert!(
            !is_ours(xdp, "steer_linear", &retyped),
            "a map of another type"
        );
        assert!(!is_ours(
            libbpf_sys::BPF_PROG_TYPE_SCHED_CLS,
            "steer_linear",
            &ours
        ));
    }

    #[test]
    fn foreign_program_error_says_how_to_remove_it() {
        for (mode, off) in [
            (AttachMode::Native, "`ip link set dev eth0 xdpdrv off`"),
            (AttachMode::Generic, "`ip link set dev eth0 xdpgeneric off`"),
        ] {
            let e = XdpError::ForeignProgram {
                ifname: "eth0".into(),
                prog_id: 42,
                name: "xdp_dispatcher".into(),
                mode,
            };
            let msg = e.to_string();
            for part in ["\"eth0\"", "id 42", "\"xdp_dispatcher\"", off] {
                assert!(msg.contains(part), "{part} in {msg}");
            }
        }
    }

    #[test]
    fn native_mtu_refusal_suggests_frags() {
        assert!(attach_hint(libc_errno::ERANGE, AttachMode::Native).contains("xdp.frags"));
        assert_eq!(attach_hint(12345, AttachMode::Generic), "");
    }
}
