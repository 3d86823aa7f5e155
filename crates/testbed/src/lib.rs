//! The netchannel test bed: two network namespaces joined by a veth pair.
//!
//! A [`TestBed`] stands in for two hosts with a NIC each. [`TestBed::builder`] creates two
//! fresh network namespaces, a veth pair with one end in each (`vA` in side
//! [`Side::A`], `vB` in side [`Side::B`]), `N` rx and `N` tx queues on both ends, an MTU,
//! and one IPv4 address per end on the test subnet (by default `10.77.0.1/24` on `vA` and
//! `10.77.0.2/24` on `vB`). Code then runs *inside* either namespace:
//!
//! - [`TestBed::run_in`] runs a closure on a thread that has entered the namespace (sockets
//!   it creates belong to that namespace) and returns its result; a panic in the closure
//!   resumes in the caller.
//! - [`TestBed::spawn_thread_in`] does the same for a long-running thread (a server).
//! - [`TestBed::command_in`] builds a [`std::process::Command`] that runs a program in the
//!   namespace (through `ip netns exec`, which also mounts that namespace's `/sys`).
//!
//! Dropping the bed kills the processes still running in its namespaces and deletes both
//! namespaces, which destroys the veth pair.
//!
//! # The RSS bed
//!
//! On a veth, a frame sent on tx queue `q` arrives on the peer's rx queue `q`: the sender
//! picks the queue. On a NIC the receiver's RSS picks it (Toeplitz over the 4-tuple, then
//! an indirection table). [`TestBedBuilder::rss`] builds a bed whose ends behave like
//! NICs with RSS: a third namespace `…-m` sits between them, joined to `vA` by `mA` and
//! to `vB` by `mB`, and `xdp-prog`'s [`RssRelay`] forwards every frame between `mA` and
//! `mB` on the queue the receiving end's [`RssTable`] picks. A frame thus arrives at `vB`
//! on the queue a NIC with `vB`'s key and table would deliver it to, whoever sent it and
//! on whichever queue; likewise at `vA`. Addresses, names and everything else are those
//! of the plain bed; [`TestBed::relay`] reads the relay's per-queue counters. It never panics (failures are logged through
//! `tracing`) and, since `Drop` runs while a panic unwinds, it also cleans up after a
//! failed test. Namespaces left behind by a process that was killed outright are removed
//! by [`TestBed::cleanup_stale`], which every [`TestBedBuilder::build`] calls first.
//!
//! # Choices
//!
//! - **Names.** Namespaces are called `nctb-<pid>-<counter>-a` and `-b` (and `-m`, the
//!   RSS bed's middle): the pid keeps
//!   parallel test processes apart, the per-process counter keeps parallel tests of one
//!   process apart, and the pid lets [`TestBed::cleanup_stale`] tell a crashed run's
//!   leftovers from a live one's. The veth pair is created from inside namespace A with its
//!   peer placed straight into namespace B, so it never exists in the host's namespace and
//!   the fixed interface names `vA`/`vB` cannot collide between beds.
//! - **Addresses.** They exist only inside the bed's own namespaces, so every bed can use
//!   the same subnet; [`TestBedBuilder::subnet`] may pick another one, but it must lie in
//!   `10.77.0.0/16`. The host's interfaces and routes are never touched.
//! - **Queues.** `numtxqueues`/`numrxqueues` at creation, then `ethtool -L dev rx N tx N`
//!   (a request that changes nothing is not an error). A veth rx queue is the sender's tx
//!   queue index.
//! - **Offloads** stay at veth's defaults (tx checksum offload, TSO/GSO, as a user's
//!   namespaces have them) unless [`TestBedBuilder::tx_checksum_offload`]`(false)` switches
//!   tx checksumming off on both ends (`ethtool -K <dev> tx off` inside each namespace),
//!   which also turns off TSO and GSO. With it on, the kernel leaves the TCP checksum of
//!   the frames it sends unfinished (`CHECKSUM_PARTIAL`: only the pseudo-header sum is
//!   filled in), trusting the "NIC" to complete it; a frame redirected to AF_XDP on the
//!   other end arrives that way, and the user-space stack accepts it only because the
//!   link is a veth (netdriver's `PartialChecksums`). Attaching an XDP program to one end
//!   makes veth drop GSO on the other, so no frame longer than the MTU reaches AF_XDP.
//! - **IPv6** is disabled in both namespaces unless [`TestBedBuilder::ipv6`] asks for it,
//!   so no neighbour-discovery or MLD frames show up on the link beside the test's own.
//! - **Privileges.** Creating the bed needs `CAP_SYS_ADMIN` and `CAP_NET_ADMIN` (root).
//!   Without them [`TestBedBuilder::build`] returns [`TestBedError::NotPermitted`] before
//!   touching anything; a missing `ip` or `ethtool` gives [`TestBedError::ToolMissing`].
//!   [`testbed_or_skip`] turns such errors into a printed skip, or into a failure when
//!   `NETCHANNEL_REQUIRE_XDP=1` (set by `.ci/run`).
//!
//! # Example
//!
//! ```
//! use std::io::{Read, Write};
//! use std::net::{SocketAddr, TcpListener, TcpStream};
//! use std::sync::mpsc;
//! use testbed::{testbed_or_skip, Side, TestBed};
//!
//! // Without privileges this prints "skipping: ..." and returns, unless
//! // NETCHANNEL_REQUIRE_XDP=1, where it panics with the reason.
//! let Some(bed) = testbed_or_skip(TestBed::builder().queues(2).mtu(1500)) else {
//!     return;
//! };
//! let b_ip = bed.side(Side::B).ipv4;
//!
//! // A server in namespace B; it says when it listens (no sleeping).
//! let (ready_tx, ready_rx) = mpsc::channel();
//! let server = bed
//!     .spawn_thread_in(Side::B, move || {
//!         let listener = TcpListener::bind((b_ip, 0)).unwrap();
//!         ready_tx.send(listener.local_addr().unwrap()).unwrap();
//!         let (mut conn, _) = listener.accept().unwrap();
//!         let mut got = Vec::new();
//!         conn.read_to_end(&mut got).unwrap();
//!         got
//!     })
//!     .unwrap();
//! let addr: SocketAddr = ready_rx.recv().unwrap();
//!
//! // A client in namespace A.
//! bed.run_in(Side::A, move || {
//!     let mut conn = TcpStream::connect(addr).unwrap();
//!     conn.write_all(b"hello").unwrap();
//! })
//! .unwrap();
//! assert_eq!(server.join().unwrap(), b"hello");
//!
//! // A process in namespace A.
//! let status = bed
//!     .command_in(Side::A, "ip")
//!     .args(["-o", "addr", "show", "dev", "vA"])
//!     .status()
//!     .unwrap();
//! assert!(status.success());
//! // Dropping `bed` removes both namespaces and the veth pair.
//! ```

use std::fmt;
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use nix::errno::Errno;
use nix::sched::CloneFlags;
pub use xdp_prog::{RelayCounters, RelayEnd, RelayError, RssRelay, RssTable};

/// Environment variable that turns a bed that cannot be built into a test failure.
///
/// `.ci/run` sets it to `1`: in CI, privileged tests must run, never skip.
pub const REQUIRE_ENV: &str = "NETCHANNEL_REQUIRE_XDP";

/// Prefix of every namespace a bed creates.
pub const NETNS_PREFIX: &str = "nctb-";

/// Suffix of the RSS bed's middle namespace.
const MIDDLE_SUFFIX: &str = "m";

/// Where `ip netns` keeps its namespace handles.
const NETNS_RUN_DIR: &str = "/var/run/netns";

/// Interface name of the veth end in namespace A.
pub const IFNAME_A: &str = "vA";
/// Interface name of the veth end in namespace B.
pub const IFNAME_B: &str = "vB";
/// Interface name, in the RSS bed's middle namespace, of the peer of `vA`.
pub const IFNAME_MIDDLE_A: &str = "mA";
/// Interface name, in the RSS bed's middle namespace, of the peer of `vB`.
pub const IFNAME_MIDDLE_B: &str = "mB";

/// `CAP_NET_ADMIN` bit in the capability sets.
const CAP_NET_ADMIN: u32 = 12;
/// `CAP_SYS_ADMIN` bit in the capability sets.
const CAP_SYS_ADMIN: u32 = 21;

/// Distinguishes the beds of one process.
static BED_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Why a test bed could not be built or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestBedError {
    /// The process lacks the privileges to create namespaces and links (it needs root, or
    /// `CAP_SYS_ADMIN` and `CAP_NET_ADMIN`).
    #[error("{what} is not permitted: the test bed needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN): {detail}")]
    NotPermitted {
        /// The operation that was refused.
        what: String,
        /// What the kernel or the tool said.
        detail: String,
    },
    /// A program the bed runs is not installed.
    #[error("`{tool}` is not installed (package {package}); run scripts/install-deps.sh as root")]
    ToolMissing {
        /// The missing program.
        tool: String,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// A command exited with a failure status.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// What it wrote to standard error.
        stderr: String,
    },
    /// A command's output was not what the bed expected.
    #[error("unexpected output from `{cmd}`: {output:?}")]
    Parse {
        /// The command line.
        cmd: String,
        /// Its standard output.
        output: String,
    },
    /// Entering a network namespace with `setns(2)` failed.
    #[error("cannot enter network namespace {netns}: {errno}")]
    Setns {
        /// The namespace.
        netns: String,
        /// The error `setns` returned.
        errno: Errno,
    },
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What the bed was doing.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The builder's settings are out of range.
    #[error("invalid test bed configuration: {0}")]
    InvalidConfig(String),
    /// The RSS bed's relay could not be loaded or attached.
    #[error("the RSS bed's relay: {0}")]
    Relay(#[source] RelayError),
}

/// One end of the bed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Namespace `…-a`, interface `vA`, host address `.1` of the subnet.
    A,
    /// Namespace `…-b`, interface `vB`, host address `.2` of the subnet.
    B,
}

impl Side {
    /// Both sides, A first.
    pub const BOTH: [Side; 2] = [Side::A, Side::B];

    /// The other side.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }

    fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Side::A => "a",
            Side::B => "b",
        }
    }

    fn ifname(self) -> &'static str {
        match self {
            Side::A => IFNAME_A,
            Side::B => IFNAME_B,
        }
    }
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::A => "A",
            Side::B => "B",
        })
    }
}

/// What one side of a built bed looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Name of the network namespace (as `ip netns` knows it).
    pub netns: String,
    /// Name of the veth end inside that namespace.
    pub ifname: String,
    /// Index of the veth end inside that namespace.
    pub ifindex: u32,
    /// MAC address of the veth end.
    pub mac: [u8; 6],
    /// IPv4 address of the veth end.
    pub ipv4: Ipv4Addr,
    /// Prefix length of the subnet.
    pub prefix_len: u8,
}

/// Settings of a bed; [`TestBedBuilder::build`] creates it.
#[derive(Debug, Clone)]
pub struct TestBedBuilder {
    queues: u32,
    mtu: u32,
    subnet: Ipv4Addr,
    prefix_len: u8,
    ipv6: bool,
    tx_checksum_offload: bool,
    rss: Option<[RssTable; 2]>,
}

impl Default for TestBedBuilder {
    fn default() -> Self {
        TestBedBuilder {
            queues: 1,
            mtu: 1500,
            subnet: Ipv4Addr::new(10, 77, 0, 0),
            prefix_len: 24,
            ipv6: false,
            tx_checksum_offload: true,
            rss: None,
        }
    }
}

impl TestBedBuilder {
    /// Number of rx and of tx queues on each veth end (default 1, at most 1024).
    pub fn queues(mut self, n: u32) -> Self {
        self.queues = n;
        self
    }

    /// MTU of both veth ends (default 1500).
    pub fn mtu(mut self, mtu: u32) -> Self {
        self.mtu = mtu;
        self
    }

    /// The subnet the two ends share: side A gets host address 1, side B host address 2
    /// (default `10.77.0.0/24`). It must lie inside `10.77.0.0/16` and leave room for
    /// two hosts (prefix length 16 to 30).
    pub fn subnet(mut self, network: Ipv4Addr, prefix_len: u8) -> Self {
        self.subnet = network;
        self.prefix_len = prefix_len;
        self
    }

    /// Keep IPv6 enabled in both namespaces (default: disabled, so that no neighbour
    /// discovery or MLD frames appear on the link).
    pub fn ipv6(mut self, enabled: bool) -> Self {
        self.ipv6 = enabled;
        self
    }

    /// Whether tx checksum offload (and with it TSO/GSO) stays on on both veth ends, as
    /// veth starts (default: on). `false` switches it off, so that frames the kernel sends
    /// carry complete checksums and at most MTU-sized payloads; see the
    /// [crate documentation](crate).
    pub fn tx_checksum_offload(mut self, enabled: bool) -> Self {
        self.tx_checksum_offload = enabled;
        self
    }

    /// Makes the bed's ends behave like NICs with RSS (see the
    /// [crate documentation](crate#the-rss-bed)): frames arrive at `vA` on the queue
    /// `nic_a` picks and at `vB` on the queue `nic_b` picks. Every indirection entry must
    /// be below [`queues`](Self::queues).
    pub fn rss(mut self, nic_a: RssTable, nic_b: RssTable) -> Self {
        self.rss = Some([nic_a, nic_b]);
        self
    }

    fn validate(&self) -> Result<(Ipv4Addr, Ipv4Addr), TestBedError> {
        if let Some(tables) = &self.rss {
            for (side, table) in Side::BOTH.iter().zip(tables) {
                if let Some(q) = table.indirection().iter().find(|&&q| q >= self.queues) {
                    return Err(TestBedError::InvalidConfig(format!(
                        "side {side}'s RSS table names queue {q}, but the bed has {} queues",
                        self.queues
                    )));
                }
            }
        }
        if !(1..=1024).contains(&self.queues) {
            return Err(TestBedError::InvalidConfig(format!(
                "queues must be 1..=1024, not {}",
                self.queues
            )));
        }
        if !(68..=65535).contains(&self.mtu) {
            return Err(TestBedError::InvalidConfig(format!(
                "mtu must be 68..=65535, not {}",
                self.mtu
            )));
        }
        if !(16..=30).contains(&self.prefix_len) {
            return Err(TestBedError::InvalidConfig(format!(
                "prefix length must be 16..=30, not {}",
                self.prefix_len
            )));
        }
        let mask = u32::MAX << (32 - u32::from(self.prefix_len));
        let net = u32::from(self.subnet) & mask;
        if net & 0xffff_0000 != u32::from(Ipv4Addr::new(10, 77, 0, 0)) {
            return Err(TestBedError::InvalidConfig(format!(
                "subnet {}/{} is outside 10.77.0.0/16",
                self.subnet, self.prefix_len
            )));
        }
        Ok((Ipv4Addr::from(net | 1), Ipv4Addr::from(net | 2)))
    }

    /// Creates the namespaces, the veth pair, its queues, MTU and addresses, and brings
    /// the links up.
    ///
    /// Removes stale namespaces of crashed runs first ([`TestBed::cleanup_stale`]). On
    /// error, whatever was created is removed again.
    pub fn build(self) -> Result<TestBed, TestBedError> {
        let (ip_a, ip_b) = self.validate()?;
        check_capabilities()?;
        match TestBed::cleanup_stale() {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "removed stale test bed namespaces"),
            Err(e @ (TestBedError::NotPermitted { .. } | TestBedError::ToolMissing { .. })) => {
                return Err(e)
            }
            Err(e) => tracing::warn!(error = %e, "cannot remove stale test bed namespaces"),
        }

        let id = format!(
            "{NETNS_PREFIX}{}-{}",
            std::process::id(),
            BED_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let netns = Side::BOTH.map(|s| format!("{id}-{}", s.suffix()));
        let middle = self.rss.as_ref().map(|_| format!("{id}-{MIDDLE_SUFFIX}"));
        // From here on, `guard` removes whatever exists if a step fails.
        let mut guard = NamespaceGuard { names: Vec::new() };
        for name in netns.iter().chain(&middle) {
            run_tool("ip", &["netns", "add", name])?;
            guard.names.push(name.clone());
        }
        if !self.ipv6 {
            for name in netns.iter().chain(&middle) {
                disable_ipv6(name)?;
            }
        }

        let q = self.queues.to_string();
        let mtu = self.mtu.to_string();
        match &middle {
            None => {
                #[rustfmt::skip]
                run_tool("ip", &[
                    "-n", &netns[0], "link", "add", IFNAME_A,
                    "numtxqueues", &q, "numrxqueues", &q, "mtu", &mtu,
                    "type", "veth", "peer", "name", IFNAME_B,
                    "numtxqueues", &q, "numrxqueues", &q, "mtu", &mtu, "netns", &netns[1],
                ])?;
            }
            Some(m) => {
                for (ns, outer, inner) in [
                    (&netns[0], IFNAME_A, IFNAME_MIDDLE_A),
                    (&netns[1], IFNAME_B, IFNAME_MIDDLE_B),
                ] {
                    #[rustfmt::skip]
                    run_tool("ip", &[
                        "-n", ns, "link", "add", outer,
                        "numtxqueues", &q, "numrxqueues", &q, "mtu", &mtu,
                        "type", "veth", "peer", "name", inner,
                        "numtxqueues", &q, "numrxqueues", &q, "mtu", &mtu, "netns", m,
                    ])?;
                    set_channels(m, inner, self.queues)?;
                    run_tool("ip", &["-n", m, "link", "set", "dev", inner, "up"])?;
                }
                run_tool("ip", &["-n", m, "link", "set", "dev", "lo", "up"])?;
            }
        }
        let ips = [ip_a, ip_b];
        let mut sides = Vec::with_capacity(2);
        for side in Side::BOTH {
            let ns = netns[side.index()].as_str();
            let ifname = side.ifname();
            set_channels(ns, ifname, self.queues)?;
            if !self.tx_checksum_offload {
                run_tool(
                    "ip",
                    &["netns", "exec", ns, "ethtool", "-K", ifname, "tx", "off"],
                )?;
            }
            let cidr = format!("{}/{}", ips[side.index()], self.prefix_len);
            run_tool("ip", &["-n", ns, "addr", "add", &cidr, "dev", ifname])?;
            run_tool("ip", &["-n", ns, "link", "set", "dev", "lo", "up"])?;
            run_tool("ip", &["-n", ns, "link", "set", "dev", ifname, "up"])?;
            let (ifindex, mac) = read_link(ns, ifname)?;
            sides.push(Endpoint {
                netns: ns.to_owned(),
                ifname: ifname.to_owned(),
                ifindex,
                mac,
                ipv4: ips[side.index()],
                prefix_len: self.prefix_len,
            });
        }
        let sides: [Endpoint; 2] = sides.try_into().expect("two sides were pushed");
        let rss = match (middle, self.rss) {
            (Some(netns), Some(tables)) => {
                let relay = attach_relay(&netns, &tables)?;
                Some(RssBed {
                    netns,
                    tables,
                    relay,
                })
            }
            _ => None,
        };
        tracing::info!(
            %id, queues = self.queues, mtu = self.mtu, rss = rss.is_some(),
            a = %sides[0].ipv4, b = %sides[1].ipv4, "test bed up"
        );
        Ok(TestBed {
            id,
            sides,
            queues: self.queues,
            mtu: self.mtu,
            rss,
            _guard: guard,
        })
    }
}

/// The middle of an RSS bed.
#[derive(Debug)]
struct RssBed {
    netns: String,
    tables: [RssTable; 2],
    relay: RssRelay,
}

/// Loads the relay inside namespace `netns` between `mA` and `mB`.
fn attach_relay(netns: &str, tables: &[RssTable; 2]) -> Result<RssRelay, TestBedError> {
    let file =
        File::open(Path::new(NETNS_RUN_DIR).join(netns)).map_err(|source| TestBedError::Io {
            context: format!("opening namespace {netns}"),
            source,
        })?;
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(&file, netns)?;
            RssRelay::attach(IFNAME_MIDDLE_A, &tables[0], IFNAME_MIDDLE_B, &tables[1]).map_err(
                |e| match e {
                    RelayError::NotPermitted { op } => TestBedError::NotPermitted {
                        what: op.to_owned(),
                        detail: e.to_string(),
                    },
                    e => TestBedError::Relay(e),
                },
            )
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Two network namespaces joined by a veth pair (or, for the RSS bed, through a middle
/// namespace); removed on drop.
///
/// See the [crate documentation](crate) for an example.
#[derive(Debug)]
pub struct TestBed {
    id: String,
    sides: [Endpoint; 2],
    queues: u32,
    mtu: u32,
    /// Dropped before the namespaces: the relay's links close first.
    rss: Option<RssBed>,
    // Declared last: dropped after everything else, deletes the namespaces.
    _guard: NamespaceGuard,
}

impl TestBed {
    /// A builder with the defaults: 1 queue, MTU 1500, `10.77.0.0/24`, no IPv6.
    pub fn builder() -> TestBedBuilder {
        TestBedBuilder::default()
    }

    /// The bed's name, `nctb-<pid>-<counter>`; its namespaces are this plus `-a`/`-b`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Namespace, interface, addresses and index of one side.
    pub fn side(&self, side: Side) -> &Endpoint {
        &self.sides[side.index()]
    }

    /// Number of rx and of tx queues on each veth end.
    pub fn queues(&self) -> u32 {
        self.queues
    }

    /// MTU of both veth ends.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The RSS table of `side`'s "NIC", on an RSS bed ([`TestBedBuilder::rss`]).
    pub fn rss_table(&self, side: Side) -> Option<&RssTable> {
        self.rss.as_ref().map(|r| &r.tables[side.index()])
    }

    /// The RSS bed's relay (its per-queue counters), on an RSS bed.
    pub fn relay(&self) -> Option<&RssRelay> {
        self.rss.as_ref().map(|r| &r.relay)
    }

    /// The RSS bed's middle namespace, on an RSS bed.
    pub fn middle_netns(&self) -> Option<&str> {
        self.rss.as_ref().map(|r| r.netns.as_str())
    }

    fn open_netns(&self, side: Side) -> Result<(File, String), TestBedError> {
        let name = self.side(side).netns.clone();
        let path = Path::new(NETNS_RUN_DIR).join(&name);
        let file = File::open(&path).map_err(|source| TestBedError::Io {
            context: format!("opening {}", path.display()),
            source,
        })?;
        Ok((file, name))
    }

    /// An open handle on `side`'s network namespace that threads of the caller's own
    /// making can enter ([`NetnsHandle::enter`]): the worker threads of a tokio runtime
    /// that plays one host, say (`on_thread_start`). Such threads keep the namespace
    /// alive while they run; end them before the bed is dropped.
    pub fn netns_handle(&self, side: Side) -> Result<NetnsHandle, TestBedError> {
        let (file, name) = self.open_netns(side)?;
        Ok(NetnsHandle { file, name })
    }

    /// Runs `f` on a new thread inside `side`'s network namespace and returns its result.
    ///
    /// Sockets `f` creates belong to that namespace. A panic in `f` resumes in the caller.
    /// Fails, without running `f`, if the thread cannot enter the namespace.
    pub fn run_in<F, R>(&self, side: Side, f: F) -> Result<R, TestBedError>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        let (file, netns) = self.open_netns(side)?;
        let joined = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name(format!("{netns}-run"))
                .spawn_scoped(scope, move || {
                    enter(&file, &netns)?;
                    Ok(f())
                })
                .map(|h| h.join())
        });
        match joined {
            Err(source) => Err(TestBedError::Io {
                context: "spawning a thread".into(),
                source,
            }),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Ok(Ok(result)) => result,
        }
    }

    /// Starts `f` on a new thread inside `side`'s network namespace (for servers and
    /// other long-running work) and returns its handle once the thread is inside.
    ///
    /// Fails, without running `f`, if the thread cannot enter the namespace. Join the
    /// handle before the bed is dropped: a thread still inside keeps the namespace alive.
    pub fn spawn_thread_in<F, R>(&self, side: Side, f: F) -> Result<NsJoinHandle<R>, TestBedError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let (file, netns) = self.open_netns(side)?;
        let (entered_tx, entered_rx) = mpsc::sync_channel(1);
        let handle = std::thread::Builder::new()
            .name(format!("{netns}-thread"))
            .spawn(move || {
                let entered = enter(&file, &netns);
                drop(file);
                let ok = entered.is_ok();
                // Cannot fail: the caller is blocked in `recv` until this arrives.
                let _ = entered_tx.send(entered);
                if ok {
                    Some(f())
                } else {
                    None
                }
            })
            .map_err(|source| TestBedError::Io {
                context: "spawning a thread".into(),
                source,
            })?;
        match entered_rx.recv() {
            Ok(Ok(())) => Ok(NsJoinHandle { inner: handle }),
            Ok(Err(e)) => {
                // The thread returns at once without running `f`.
                let _ = handle.join();
                Err(e)
            }
            Err(mpsc::RecvError) => {
                // The thread died before reporting: only a panic does that.
                match handle.join() {
                    Err(panic) => std::panic::resume_unwind(panic),
                    Ok(_) => unreachable!("the thread reports before it returns"),
                }
            }
        }
    }

    /// A command that runs `program` inside `side`'s network namespace (through
    /// `ip netns exec`, which also mounts that namespace's view of `/sys`).
    ///
    /// Add arguments, environment and I/O as with any [`Command`]. Processes still
    /// running in the namespace when the bed is dropped are killed.
    pub fn command_in(&self, side: Side, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.side(side).netns])
            .arg(program);
        cmd
    }

    /// Runs `program args…` inside `side`'s namespace to completion and returns its
    /// standard output; a failure status is a [`TestBedError::Command`].
    pub fn output_in(
        &self,
        side: Side,
        program: &str,
        args: &[&str],
    ) -> Result<String, TestBedError> {
        let mut full = vec!["netns", "exec", &self.side(side).netns, program];
        full.extend_from_slice(args);
        run_tool("ip", &full)
    }

    /// Removes namespaces left by crashed runs: those named `nctb-<pid>-…` (sides `a` and
    /// `b`, and the RSS bed's middle `m`) whose process no longer exists. Returns how many were removed.
    pub fn cleanup_stale() -> Result<usize, TestBedError> {
        let list = run_tool("ip", &["netns", "list"])?;
        let mut removed = 0;
        for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
            let Some(pid) = stale_pid(name) else { continue };
            if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            tracing::info!(netns = name, pid, "removing stale test bed namespace");
            kill_processes_in(name);
            match run_tool("ip", &["netns", "delete", name]) {
                Ok(_) => removed += 1,
                // Another bed's cleanup, running at the same time, was quicker.
                Err(_) if !Path::new(NETNS_RUN_DIR).join(name).exists() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }
}

/// An open network namespace of a bed ([`TestBed::netns_handle`]).
#[derive(Debug)]
pub struct NetnsHandle {
    file: File,
    name: String,
}

impl NetnsHandle {
    /// The namespace's name (as `ip netns` lists it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Moves the calling thread into the namespace (`setns(2)`): sockets, AF_XDP
    /// sockets and threads it creates from then on belong there.
    pub fn enter(&self) -> Result<(), TestBedError> {
        enter(&self.file, &self.name)
    }
}

/// Handle of a thread started by [`TestBed::spawn_thread_in`]; like a [`JoinHandle`].
#[derive(Debug)]
pub struct NsJoinHandle<R> {
    // `None` only when the thread could not enter the namespace, which
    // `spawn_thread_in` reports itself instead of returning a handle.
    inner: JoinHandle<Option<R>>,
}

impl<R> NsJoinHandle<R> {
    /// Waits for the thread to finish and returns its result, or the payload of its
    /// panic (as [`JoinHandle::join`]).
    pub fn join(self) -> std::thread::Result<R> {
        self.inner
            .join()
            .map(|r| r.expect("spawn_thread_in returns a handle only once the thread is inside"))
    }

    /// Whether the thread has finished.
    pub fn is_finished(&self) -> bool {
        self.inner.is_finished()
    }

    /// The underlying thread.
    pub fn thread(&self) -> &std::thread::Thread {
        self.inner.thread()
    }
}

/// Deletes the namespaces it holds when dropped; logs, never panics.
#[derive(Debug)]
struct NamespaceGuard {
    names: Vec<String>,
}

impl Drop for NamespaceGuard {
    fn drop(&mut self) {
        for name in self.names.iter().rev() {
            kill_processes_in(name);
            match run_tool("ip", &["netns", "delete", name]) {
                Ok(_) => tracing::debug!(netns = %name, "test bed namespace removed"),
                Err(e) => {
                    tracing::error!(netns = %name, error = %e, "cannot remove test bed namespace")
                }
            }
        }
    }
}

/// Kills (SIGKILL) the processes inside namespace `name`, except this one.
fn kill_processes_in(name: &str) {
    let pids = match run_tool("ip", &["netns", "pids", name]) {
        Ok(out) => out,
        Err(e) => {
            tracing::warn!(netns = %name, error = %e, "cannot list the processes in a namespace");
            return;
        }
    };
    let me = std::process::id();
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        if u32::try_from(pid) == Ok(me) {
            continue;
        }
        tracing::info!(netns = %name, pid, "killing a process left in a test bed namespace");
        if let Err(e) = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        ) {
            tracing::warn!(netns = %name, pid, error = %e, "cannot kill a process in a namespace");
        }
    }
}

/// Moves the current thread into the network namespace `file` refers to.
fn enter(file: &File, netns: &str) -> Result<(), TestBedError> {
    nix::sched::setns(file, CloneFlags::CLONE_NEWNET).map_err(|errno| match errno {
        Errno::EPERM => TestBedError::NotPermitted {
            what: format!("entering network namespace {netns}"),
            detail: errno.desc().to_owned(),
        },
        errno => TestBedError::Setns {
            netns: netns.to_owned(),
            errno,
        },
    })
}

/// Turns IPv6 off in namespace `netns` before any interface comes up.
fn disable_ipv6(netns: &str) -> Result<(), TestBedError> {
    let file =
        File::open(Path::new(NETNS_RUN_DIR).join(netns)).map_err(|source| TestBedError::Io {
            context: format!("opening namespace {netns}"),
            source,
        })?;
    let netns = netns.to_owned();
    // /proc/sys/net is resolved against the opening thread's namespace.
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(&file, &netns)?;
            for knob in ["all", "default", "lo"] {
                let path = format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6");
                match std::fs::write(&path, "1") {
                    Ok(()) => {}
                    // A kernel without IPv6 has nothing to disable.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(source) => {
                        return Err(TestBedError::Io {
                            context: format!("writing {path} in {netns}"),
                            source,
                        })
                    }
                }
            }
            Ok(())
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// `ethtool -L ifname rx n tx n` inside `netns`; "nothing to change" is success.
fn set_channels(netns: &str, ifname: &str, n: u32) -> Result<(), TestBedError> {
    let n = n.to_string();
    match run_tool(
        "ip",
        &[
            "netns", "exec", netns, "ethtool", "-L", ifname, "rx", &n, "tx", &n,
        ],
    ) {
        Ok(_) => Ok(()),
        Err(TestBedError::Command { stderr, .. })
            if stderr.contains("unmodified") || stderr.contains("no change") =>
        {
            Ok(())
        }
        // `ip netns exec` reports a program it cannot run on stderr with status 255.
        Err(TestBedError::Command { stderr, .. })
            if stderr.contains("No such file or directory") && stderr.contains("ethtool") =>
        {
            Err(TestBedError::ToolMissing {
                tool: "ethtool".into(),
                package: "ethtool",
            })
        }
        Err(e) => Err(e),
    }
}

/// Reads the index and MAC address of `ifname` inside `netns`.
fn read_link(netns: &str, ifname: &str) -> Result<(u32, [u8; 6]), TestBedError> {
    let out = run_tool("ip", &["-n", netns, "-o", "link", "show", "dev", ifname])?;
    parse_link_line(&out).ok_or_else(|| TestBedError::Parse {
        cmd: format!("ip -n {netns} -o link show dev {ifname}"),
        output: out.clone(),
    })
}

/// Parses `7: vA@if6: <…> mtu 1500 …\    link/ether aa:bb:cc:dd:ee:ff brd …`.
fn parse_link_line(line: &str) -> Option<(u32, [u8; 6])> {
    let (index, rest) = line.trim_start().split_once(':')?;
    let ifindex = index.trim().parse().ok()?;
    let mac_text = rest
        .split_once("link/ether ")?
        .1
        .split_whitespace()
        .next()?;
    let mut mac = [0u8; 6];
    let mut parts = mac_text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some((ifindex, mac))
}

/// The pid in a bed namespace name `nctb-<pid>-<counter>-<a|b|m>`, or `None` for any
/// other name.
fn stale_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NETNS_PREFIX)?;
    let mut parts = rest.split('-');
    let pid = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u32>().ok()?;
    match (parts.next(), parts.next()) {
        (Some("a" | "b" | MIDDLE_SUFFIX), None) => Some(pid),
        _ => None,
    }
}

/// Whether a `CapEff:` hex mask holds both capabilities the bed needs.
fn caps_sufficient(cap_eff_hex: &str) -> Option<bool> {
    let mask = u64::from_str_radix(cap_eff_hex.trim(), 16).ok()?;
    Some(mask & (1 << CAP_NET_ADMIN) != 0 && mask & (1 << CAP_SYS_ADMIN) != 0)
}

/// Refuses early, before creating anything, when the effective capabilities lack
/// `CAP_SYS_ADMIN` or `CAP_NET_ADMIN`. If `/proc/self/status` cannot be read, the
/// commands themselves will say.
fn check_capabilities() -> Result<(), TestBedError> {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Ok(());
    };
    let Some(hex) = status.lines().find_map(|l| l.strip_prefix("CapEff:")) else {
        return Ok(());
    };
    match caps_sufficient(hex) {
        Some(false) => Err(TestBedError::NotPermitted {
            what: "creating network namespaces".into(),
            detail: format!("effective capabilities are {}", hex.trim()),
        }),
        _ => Ok(()),
    }
}

/// Runs `tool args…`, returns its standard output, and types its failures.
fn run_tool(tool: &str, args: &[&str]) -> Result<String, TestBedError> {
    let cmd = std::iter::once(tool)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    tracing::debug!(%cmd, "test bed command");
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => TestBedError::ToolMissing {
                tool: tool.to_owned(),
                package: package_of(tool),
            },
            _ => TestBedError::Io {
                context: format!("running `{cmd}`"),
                source,
            },
        })?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if !out.status.success() {
        return Err(classify_failure(cmd, out.status.to_string(), stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A failed command's error: refusals for lack of privileges become `NotPermitted`.
fn classify_failure(cmd: String, status: String, stderr: String) -> TestBedError {
    if stderr.contains("Operation not permitted") || stderr.contains("Permission denied") {
        TestBedError::NotPermitted {
            what: format!("`{cmd}`"),
            detail: stderr,
        }
    } else {
        TestBedError::Command {
            cmd,
            status,
            stderr,
        }
    }
}

fn package_of(tool: &str) -> &'static str {
    match tool {
        "ip" => "iproute2",
        "ethtool" => "ethtool",
        "ping" => "iputils-ping",
        _ => "unknown",
    }
}

/// The policy every privileged test applies to a bed it cannot build.
///
/// Builds the bed; on success returns it. On failure, if the environment variable
/// [`REQUIRE_ENV`] (`NETCHANNEL_REQUIRE_XDP`) is `1` (CI), panics with the error, so the
/// test fails; otherwise prints `skipping: <error>` to standard error and returns `None`,
/// so the test can return early.
pub fn testbed_or_skip(builder: TestBedBuilder) -> Option<TestBed> {
    or_skip(builder.build(), required())
}

/// Whether [`REQUIRE_ENV`] is set to `1`.
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
}

fn or_skip(result: Result<TestBed, TestBedError>, required: bool) -> Option<TestBed> {
    match result {
        Ok(bed) => Some(bed),
        Err(err) if required => panic!("{REQUIRE_ENV}=1 but the test bed cannot be built: {err}"),
        Err(err) => {
            eprintln!("skipping: {err}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_link_lines() {
        let line = "7: vA@if6: <BROADCAST,MULTICAST> mtu 9000 qdisc noop state DOWN mode DEFAULT \
                    group default qlen 1000\\    link/ether d6:d3:61:c0:8c:b9 brd ff:ff:ff:ff:ff:ff link-netns x\n";
        assert_eq!(
            parse_link_line(line),
            Some((7, [0xd6, 0xd3, 0x61, 0xc0, 0x8c, 0xb9]))
        );
        assert_eq!(
            parse_link_line("1: lo: <LOOPBACK> mtu 65536\\    link/loopback 00:00"),
            None
        );
        assert_eq!(parse_link_line("x: vA: link/ether 00:11:22:33:44:55"), None);
        assert_eq!(parse_link_line("3: vA: link/ether 00:11:22:33:44"), None);
    }

    #[test]
    fn recognises_only_bed_namespace_names() {
        assert_eq!(stale_pid("nctb-1234-0-a"), Some(1234));
        assert_eq!(stale_pid("nctb-1234-17-b"), Some(1234));
        assert_eq!(stale_pid("nctb-1234-17-m"), Some(1234));
        assert_eq!(stale_pid("nctb-1234-17-c"), None);
        assert_eq!(stale_pid("nctb-1234-a"), None);
        assert_eq!(stale_pid("nctb-x-0-a"), None);
        assert_eq!(stale_pid("nctb-1-0-a-b"), None);
        assert_eq!(stale_pid("other-1-0-a"), None);
    }

    #[test]
    fn capability_mask() {
        assert_eq!(caps_sufficient("000001ffffffffff"), Some(true));
        assert_eq!(caps_sufficient("0000000000000000"), Some(false));
        // CAP_NET_ADMIN alone is not enough.
        assert_eq!(caps_sufficient("0000000000001000"), Some(false));
        assert_eq!(caps_sufficient("0000000000201000"), Some(true));
        assert_eq!(caps_sufficient("zz"), None);
    }

    #[test]
    fn refusals_are_typed_as_not_permitted() {
        let e = classify_failure(
            "ip netns add x".into(),
            "exit status: 1".into(),
            "mount --make-shared /run/netns failed: Operation not permitted".into(),
        );
        assert!(matches!(e, TestBedError::NotPermitted { .. }), "{e}");
        let e = classify_failure(
            "ip link add".into(),
            "exit status: 2".into(),
            "RTNETLINK answers: File exists".into(),
        );
        assert!(matches!(e, TestBedError::Command { .. }), "{e}");
    }

    #[test]
    fn missing_tool_is_typed() {
        let e = run_tool("netchannel-no-such-tool", &[]).unwrap_err();
        assert!(matches!(e, TestBedError::ToolMissing { .. }), "{e}");
    }

    #[test]
    fn invalid_settings_are_refused_before_anything_is_created() {
        for b in [
            TestBed::builder().queues(0),
            TestBed::builder().mtu(10),
            TestBed::builder().subnet(Ipv4Addr::new(192, 168, 0, 0), 24),
            TestBed::builder().subnet(Ipv4Addr::new(10, 77, 0, 0), 8),
        ] {
            let e = b.build().unwrap_err();
            assert!(matches!(e, TestBedError::InvalidConfig(_)), "{e}");
        }
        assert_eq!(
            TestBed::builder()
                .subnet(Ipv4Addr::new(10, 77, 5, 9), 24)
                .validate()
                .unwrap(),
            (Ipv4Addr::new(10, 77, 5, 1), Ipv4Addr::new(10, 77, 5, 2))
        );
    }

    #[test]
    fn skip_policy_skips_when_not_required() {
        let err = TestBedError::NotPermitted {
            what: "test".into(),
            detail: "no".into(),
        };
        assert!(or_skip(Err(err), false).is_none());
    }

    #[test]
    #[should_panic(expected = "NETCHANNEL_REQUIRE_XDP=1")]
    fn skip_policy_fails_when_required() {
        let err = TestBedError::NotPermitted {
            what: "test".into(),
            detail: "no".into(),
        };
        let _ = or_skip(Err(err), true);
    }
}
