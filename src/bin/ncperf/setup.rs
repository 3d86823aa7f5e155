//! Building a side's netchannel stack from the command line, and the one-line errors,
//! each with its fix, for what a user can get wrong: an interface that does not exist, an
//! address that is not on it, missing privileges, another XDP program in the way, a
//! driver without zero copy, a peer that does not answer.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use netchannel::netdriver::channel::ChannelError;
use netchannel::netdriver::link::xdp::{BindMode, XdpLinkError};
use netchannel::{Stack, StackBuilder, StackError};

use crate::cli::{Scheduler, StackArgs};

/// A failure the user can act on: one line, saying what is wrong and what to do.
#[derive(Debug)]
pub struct Fail(pub String);

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fail {}

/// A failure from a message.
pub fn fail(msg: impl Into<String>) -> Fail {
    Fail(msg.into())
}

/// The IPv4 addresses of every interface in this network namespace, by interface.
fn addresses() -> io::Result<Vec<(String, Option<Ipv4Addr>)>> {
    let list = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
    Ok(list
        .map(|a| {
            let v4 = a
                .address
                .as_ref()
                .and_then(|s| s.as_sockaddr_in())
                .map(|s| s.ip());
            (a.interface_name, v4)
        })
        .collect())
}

/// Checks that `iface` exists in this namespace and carries `addr`.
pub fn check_interface(iface: &str, addr: Ipv4Addr) -> Result<(), Fail> {
    let all = addresses().map_err(|e| fail(format!("listing interfaces: {e}")))?;
    let mut names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    if !names.contains(&iface) {
        return Err(fail(format!(
            "no interface {iface:?} in this network namespace (there are: {}); pass \
             --interface with one of them, or run ncperf inside the interface's namespace \
             (`ip netns exec NS ncperf ...`)",
            names.join(", ")
        )));
    }
    let mine: Vec<String> = all
        .iter()
        .filter(|(n, a)| n == iface && a.is_some())
        .filter_map(|(_, a)| a.map(|a| a.to_string()))
        .collect();
    if !mine.iter().any(|a| *a == addr.to_string()) {
        return Err(fail(format!(
            "address {addr} is not on {iface} (it has: {}); pass --address with one of \
             them, or add it: `ip addr add {addr}/24 dev {iface}`",
            if mine.is_empty() {
                "no IPv4 address".to_string()
            } else {
                mine.join(", ")
            }
        )));
    }
    Ok(())
}

/// A builder with the command line's settings (interface and address aside).
pub fn builder(args: &StackArgs) -> StackBuilder {
    let mut b = Stack::builder().connect_timeout(Duration::from_secs(10));
    if let Some(n) = args.channels {
        b = b.channels(n as usize);
    }
    if let Some(n) = args.latency_channels {
        b = b.latency_channels(n as usize);
    }
    if let Some(n) = args.copy_workers {
        b = b.copy_workers(n as usize);
    }
    if let Some(link) = args.link {
        b = b.link(link.kind());
    }
    b = match args.scheduler {
        Scheduler::RoundRobin => b.scheduler(netchannel::sched::RoundRobin::default()),
        Scheduler::SourcePort => b.scheduler(netchannel::sched::SourcePort::default()),
        Scheduler::Isolating => b.scheduler(netchannel::sched::Isolating::default()),
    };
    if !args.busy_poll.is_empty() {
        b = b.busy_poll(
            args.busy_poll.iter().map(|&c| c as usize),
            Duration::from_micros(args.busy_poll_us.max(1)),
        );
    }
    let (queues, zero_copy) = (args.queues, args.zero_copy);
    if queues.is_some() || zero_copy {
        b = b.configure_channels(move |c| {
            if let Some(q) = queues {
                c.queues = Some((0..q.max(1)).collect());
            }
            if zero_copy {
                c.link.bind = BindMode::ZeroCopy;
            }
        });
    }
    b
}

/// Builds the stack on `iface` with address `addr` (call it inside the interface's
/// namespace), after checking both.
pub fn build(args: &StackArgs, iface: &str, addr: Ipv4Addr) -> Result<Stack, Fail> {
    check_interface(iface, addr)?;
    builder(args)
        .interface(iface)
        .ipv4(addr)
        .build()
        .map_err(|e| explain_stack(e, iface))
}

/// A stack that failed to start, in one line with the fix.
pub fn explain_stack(e: StackError, iface: &str) -> Fail {
    let root = "run as root (AF_XDP and XDP need CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF and \
                CAP_SYS_ADMIN), or measure kernel TCP alone with --kernel";
    match &e {
        StackError::NotPermitted(_) => fail(format!("not permitted: {root}")),
        StackError::NoSuchInterface(i) => fail(format!(
            "no interface {i:?} in this network namespace; pass --interface with one that \
             `ip -br link` lists"
        )),
        StackError::Channels(c) => match c {
            ChannelError::Xdp(x) => match x {
                xdp_prog::XdpError::ForeignProgram { .. } | xdp_prog::XdpError::Busy { .. } => {
                    fail(x.to_string())
                }
                other => fail(format!("attaching the XDP program to {iface}: {other}")),
            },
            ChannelError::Link(XdpLinkError::ZeroCopyUnsupported { .. }) => fail(format!(
                "{iface}'s driver has no zero-copy AF_XDP (veth never has); drop --zero-copy"
            )),
            ChannelError::Link(XdpLinkError::NotPermitted { .. }) => {
                fail(format!("not permitted: {root}"))
            }
            other => fail(format!("starting the channels on {iface}: {other}")),
        },
        other => fail(format!("starting netchannel on {iface}: {other}")),
    }
}

/// A connection to the server that failed, in one line with the fix.
pub fn explain_connect(e: &io::Error, peer: SocketAddr, kernel: bool) -> Fail {
    let start = if kernel {
        "`ncperf server --kernel`"
    } else {
        "`ncperf server -i IFACE -a ADDR`"
    };
    match e.kind() {
        io::ErrorKind::ConnectionRefused => fail(format!(
            "peer {peer} refused the connection: nothing listens there; start {start} on \
             that host first (its --port must match)"
        )),
        io::ErrorKind::TimedOut => fail(format!(
            "peer {peer} unreachable: no answer ({e}); check that the host is up, that \
             {start} runs there, and the route (`ping {}`)",
            peer.ip()
        )),
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => fail(format!(
            "peer {peer} unreachable: {e}; check the route (`ip route get {}`) and the \
             address",
            peer.ip()
        )),
        _ => fail(format!("peer {peer}: {e}; is {start} running there?")),
    }
}
