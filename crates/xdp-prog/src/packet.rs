//! Steering for the AF_PACKET link: a socket filter that hands the stack's AF_PACKET socket
//! exactly the flows it owns, and a TCX ingress program that keeps those flows from the
//! kernel's TCP (`src/bpf/packet.bpf.c`).
//!
//! An AF_PACKET socket bound to `ETH_P_ALL` is a *tap*: the kernel gives it a copy of every
//! frame the interface receives and goes on processing the frame itself. Two things make
//! such a socket a link for a user-space stack that shares the interface's address with
//! the kernel:
//!
//! - the socket filter ([`PacketSteering::attach_socket`]) drops, before any copy, every
//!   frame but the IPv4 TCP segments to an owned destination (the same ownership rule as
//!   [`XdpSteering`](crate::XdpSteering): [`own_port`](PacketSteering::own_port),
//!   [`own_endpoint`](PacketSteering::own_endpoint));
//! - the TCX ingress program drops those same segments on the kernel's path, so its TCP
//!   never answers a segment for a port it has no socket on with a RST. In
//!   `__netif_receive_skb_core` the taps of `ptype_all` (sockets bound to `ETH_P_ALL`) are
//!   served before the ingress hook (`sch_handle_ingress`, where TCX runs; a tap still
//!   pending is delivered first), so the stack's socket has its copy by then. A socket
//!   bound to `ETH_P_IP` would be served after it, and see nothing.
//!
//! TCX (Linux 6.6+) attaches through a BPF link, which the kernel detaches when its last
//! descriptor closes: a crashed process leaves nothing behind. No XDP program runs, so
//! the interface keeps its offloads (on veth, an XDP program on one end turns off TSO on
//! the other).

use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddrV4;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, MapHandle, OpenObject};
use tracing::{info, warn};

use crate::{owned_key, route_libbpf_logs};

#[allow(missing_docs, clippy::all, clippy::pedantic, unsafe_op_in_unsafe_fn)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/packet.skel.rs"));
}

use skel::PacketSkelBuilder;

/// `SO_ATTACH_BPF` (`<asm-generic/socket.h>`; the same on every architecture this crate
/// builds for).
const SO_ATTACH_BPF: libc::c_int = 50;

/// Errors of [`PacketSteering`].
#[derive(Debug, thiserror::Error)]
pub enum PacketSteeringError {
    /// The interface does not exist in the calling thread's network namespace.
    #[error("no network interface named {ifname:?} in this network namespace")]
    NoSuchInterface {
        /// The name asked for.
        ifname: String,
    },
    /// Loading and attaching BPF needs CAP_BPF and CAP_NET_ADMIN.
    #[error("{op}: operation not permitted (needs CAP_BPF and CAP_NET_ADMIN; run as root)")]
    NotPermitted {
        /// What was being done.
        op: &'static str,
    },
    /// The object could not be opened or the kernel refused a program (the verifier log
    /// is in the `tracing` output of target `libbpf`).
    #[error("loading the AF_PACKET steering programs: {0}")]
    Load(#[source] libbpf_rs::Error),
    /// The kernel refused to attach the TCX ingress program.
    #[error(
        "attaching the TCX ingress program to {ifname:?}: {source} (TCX needs Linux 6.6 or later)"
    )]
    Attach {
        /// The interface.
        ifname: String,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// Attaching the socket filter failed.
    #[error("attaching the socket filter: {0}")]
    Socket(#[source] io::Error),
    /// An update, deletion or lookup in a map failed.
    #[error("{op} in BPF map {map}: {source}")]
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

/// The programs' counters, summed over CPUs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PacketCounters {
    /// Frames the socket filter handed to sockets (each socket that has the filter counts
    /// its own).
    pub filtered_in: u64,
    /// Frames the TCX program kept from the kernel.
    pub kernel_dropped: u64,
}

/// The socket filter and the TCX ingress drop of one interface (see the
/// [module documentation](self)). Dropping it detaches the TCX program; sockets keep their
/// filter until they close.
#[derive(Debug)]
pub struct PacketSteering {
    ifname: String,
    ifindex: u32,
    filter: OwnedFd,
    /// The TCX link; `None` once detached.
    link: Option<OwnedFd>,
    owned: MapHandle,
    counters: MapHandle,
}

impl PacketSteering {
    /// Loads both programs and attaches the TCX ingress drop to `ifname` (in the calling
    /// thread's network namespace). Nothing is owned yet: until a port is claimed, no
    /// frame reaches a filtered socket and the kernel sees everything.
    pub fn attach(ifname: &str) -> Result<PacketSteering, PacketSteeringError> {
        route_libbpf_logs();
        let ifindex =
            crate::ifindex_of(ifname).map_err(|_| PacketSteeringError::NoSuchInterface {
                ifname: ifname.to_owned(),
            })?;
        let mut storage = MaybeUninit::<OpenObject>::uninit();
        let open = PacketSkelBuilder::default()
            .open(&mut storage)
            .map_err(PacketSteeringError::Load)?;
        let skel = open.load().map_err(|e| match e.kind() {
            libbpf_rs::ErrorKind::PermissionDenied => PacketSteeringError::NotPermitted {
                op: "loading the AF_PACKET steering programs",
            },
            _ => PacketSteeringError::Load(e),
        })?;
        let dup = |fd: BorrowedFd<'_>| {
            fd.try_clone_to_owned()
                .map_err(|e| PacketSteeringError::Load(libbpf_rs::Error::from(e)))
        };
        let filter = dup(skel.progs.packet_filter.as_fd())?;
        let drop_prog = dup(skel.progs.kernel_drop.as_fd())?;
        let handle = |map: &libbpf_rs::Map<'_>, name: &'static str| {
            MapHandle::try_from(map).map_err(|source| PacketSteeringError::Map {
                map: name,
                op: "duplicating the descriptor",
                source,
            })
        };
        let owned = handle(&skel.maps.owned_ports, "owned_ports")?;
        let counters = handle(&skel.maps.packet_counters, "packet_counters")?;
        let link = tcx_attach(ifname, ifindex, &drop_prog)?;
        info!(
            ifname,
            ifindex, "AF_PACKET steering attached (socket filter, TCX ingress drop)"
        );
        Ok(PacketSteering {
            ifname: ifname.to_owned(),
            ifindex,
            filter,
            link: Some(link),
            owned,
            counters,
        })
    }

    /// Attaches the socket filter to `socket` (an AF_PACKET socket; attach it before the
    /// socket is bound, so that it never holds an unfiltered frame).
    pub fn attach_socket(&self, socket: BorrowedFd<'_>) -> Result<(), PacketSteeringError> {
        let prog: i32 = self.filter.as_raw_fd();
        // SAFETY: setsockopt with a pointer to a local i32 and its size; the kernel copies
        // the value and keeps no pointer.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_ATTACH_BPF,
                (&prog as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(PacketSteeringError::Socket(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Claims TCP destination `port` (host byte order) on every local address: its
    /// segments go to filtered sockets and no longer to the kernel.
    pub fn own_port(&self, port: u16) -> Result<(), PacketSteeringError> {
        self.own(owned_key(None, port))
    }

    /// Gives `port` back to the kernel. Returns whether it was owned.
    pub fn release_port(&self, port: u16) -> Result<bool, PacketSteeringError> {
        self.release(owned_key(None, port))
    }

    /// Claims TCP segments to exactly `endpoint`.
    pub fn own_endpoint(&self, endpoint: SocketAddrV4) -> Result<(), PacketSteeringError> {
        self.own(owned_key(Some(endpoint), endpoint.port()))
    }

    /// Gives `endpoint` back to the kernel. Returns whether it was owned.
    pub fn release_endpoint(&self, endpoint: SocketAddrV4) -> Result<bool, PacketSteeringError> {
        self.release(owned_key(Some(endpoint), endpoint.port()))
    }

    fn own(&self, key: Vec<u8>) -> Result<(), PacketSteeringError> {
        self.owned
            .update(&key, &[1u8], MapFlags::ANY)
            .map_err(|source| PacketSteeringError::Map {
                map: "owned_ports",
                op: "claiming a destination",
                source,
            })
    }

    fn release(&self, key: Vec<u8>) -> Result<bool, PacketSteeringError> {
        match self.owned.delete(&key) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(PacketSteeringError::Map {
                map: "owned_ports",
                op: "releasing a destination",
                source,
            }),
        }
    }

    /// The programs' counters, summed over all CPUs.
    pub fn counters(&self) -> Result<PacketCounters, PacketSteeringError> {
        let per_cpu = self
            .counters
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| PacketSteeringError::Map {
                map: "packet_counters",
                op: "reading the counters",
                source,
            })?
            .unwrap_or_default();
        let mut sum = PacketCounters::default();
        for bytes in per_cpu {
            let field = |i: usize| {
                bytes
                    .get(i * 8..i * 8 + 8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_ne_bytes)
            };
            sum.filtered_in += field(0);
            sum.kernel_dropped += field(1);
        }
        Ok(sum)
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Detaches the TCX program now (dropping does the same and logs failures).
    pub fn detach(mut self) -> Result<(), PacketSteeringError> {
        self.detach_link()
    }

    fn detach_link(&mut self) -> Result<(), PacketSteeringError> {
        let Some(link) = self.link.take() else {
            return Ok(());
        };
        // SAFETY: BPF_LINK_DETACH on a link descriptor we own; no memory is passed.
        let ret = unsafe { libbpf_sys::bpf_link_detach(link.as_raw_fd()) };
        // Closing the last descriptor releases the link, which detaches it too.
        drop(link);
        if ret < 0 {
            return Err(PacketSteeringError::Attach {
                ifname: self.ifname.clone(),
                source: io::Error::from_raw_os_error(-ret),
            });
        }
        info!(ifname = %self.ifname, "AF_PACKET steering detached");
        Ok(())
    }
}

impl Drop for PacketSteering {
    fn drop(&mut self) {
        if let Err(e) = self.detach_link() {
            warn!(error = %e, "detaching the TCX program (the link is closed anyway)");
        }
    }
}

/// How many programs are attached to `ifname`'s TCX ingress hook (in the calling thread's
/// network namespace), whoever attached them: for checking that [`PacketSteering`] was
/// detached.
pub fn tcx_ingress_programs(ifname: &str) -> Result<u32, PacketSteeringError> {
    let ifindex = crate::ifindex_of(ifname).map_err(|_| PacketSteeringError::NoSuchInterface {
        ifname: ifname.to_owned(),
    })?;
    let target = i32::try_from(ifindex).map_err(|_| PacketSteeringError::NoSuchInterface {
        ifname: ifname.to_owned(),
    })?;
    let mut opts = libbpf_sys::bpf_prog_query_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_prog_query_opts>() as libbpf_sys::size_t,
        ..Default::default()
    };
    // SAFETY: BPF_PROG_QUERY with a properly sized, initialised options struct that
    // outlives the call and asks for no id arrays (null pointers): the kernel writes the
    // count into `opts` only.
    let rc =
        unsafe { libbpf_sys::bpf_prog_query_opts(target, libbpf_sys::BPF_TCX_INGRESS, &mut opts) };
    if rc < 0 {
        let errno = -rc;
        if matches!(errno, 1 | 13) {
            return Err(PacketSteeringError::NotPermitted {
                op: "querying the TCX ingress programs",
            });
        }
        return Err(PacketSteeringError::Attach {
            ifname: ifname.to_owned(),
            source: io::Error::from_raw_os_error(errno),
        });
    }
    // SAFETY: both members of the union are the same `u32` (`count` is the newer name).
    Ok(unsafe { opts.__bindgen_anon_1.count })
}

fn tcx_attach(ifname: &str, ifindex: u32, prog: &OwnedFd) -> Result<OwnedFd, PacketSteeringError> {
    let opts = libbpf_sys::bpf_link_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as libbpf_sys::size_t,
        ..Default::default()
    };
    let target = i32::try_from(ifindex).map_err(|_| PacketSteeringError::NoSuchInterface {
        ifname: ifname.to_owned(),
    })?;
    // SAFETY: BPF_LINK_CREATE system call; `opts` is a properly sized, initialised options
    // struct that outlives the call, and the kernel keeps no pointer into it.
    let fd = unsafe {
        libbpf_sys::bpf_link_create(prog.as_raw_fd(), target, libbpf_sys::BPF_TCX_INGRESS, &opts)
    };
    if fd < 0 {
        let errno = -fd;
        if matches!(errno, 1 | 13) {
            return Err(PacketSteeringError::NotPermitted {
                op: "attaching the TCX ingress program",
            });
        }
        return Err(PacketSteeringError::Attach {
            ifname: ifname.to_owned(),
            source: io::Error::from_raw_os_error(errno),
        });
    }
    // SAFETY: `fd` is a new descriptor the kernel just returned to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
