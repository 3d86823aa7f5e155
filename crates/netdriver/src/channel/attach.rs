//! How a channel set reaches its peers' MAC addresses: the kernel's neighbour table of
//! the interface (AF_XDP sets), or the in-memory switch's (sets on a
//! [`SimSwitch`](crate::link::switch::SimSwitch)).
//!
//! Two uses: resolving a peer before a channel to it opens ([`Resolver`], on a thread of
//! its own for the kernel, so that an ARP exchange never stalls a queue's round), and
//! checking the MAC a passive open learnt from the peer's SYN ([`Neighbors`], per queue).

use std::net::Ipv4Addr;
use std::thread::JoinHandle;

use std::future::Future;

use crossbeam_channel::{Receiver, Sender};
use tracing::debug;

use super::block::block_on;
use super::ChannelError;
use crate::link::switch::SimSwitch;
use crate::neigh::{
    judge_peer_mac, KernelNeighbors, NeighError, PeerMacProbes, PeerMacVerdict, ProbeOutcome,
};
use crate::time::{Duration, Instant};
use crate::wire::EthernetAddress;

/// A queue's view of the host's neighbour table, for checking passive opens.
pub(crate) enum Neighbors {
    /// The kernel's table of the interface, opened in its namespace when the queue was set
    /// up (so that whichever thread drives the queue has it); `None` if that failed.
    Kernel {
        table: Option<KernelNeighbors>,
        ifindex: u32,
    },
    /// The switch's table.
    Switch(SimSwitch),
}

impl Neighbors {
    /// Judges `mac`, the source of a passive open from `ip`, against the table
    /// ([`judge_peer_mac`]). The switch knows every host's MAC for certain, as an entry
    /// set by hand: another MAC there contradicts.
    pub(crate) fn judge(
        &mut self,
        ip: Ipv4Addr,
        mac: EthernetAddress,
        queue: u32,
    ) -> PeerMacVerdict {
        match self {
            Neighbors::Kernel { table, ifindex } => {
                // A match read within the last second is reused; anything else is read
                // anew (`KernelNeighbors::entry_confirming`).
                let recent = |n: &mut KernelNeighbors| {
                    n.entry_confirming(*ifindex, ip, mac, std::time::Duration::from_secs(1))
                };
                let entry = match table.as_mut().map(recent) {
                    Some(Ok(entry)) => entry,
                    Some(Err(e)) => {
                        debug!(queue, %ip, error = %e, "neighbour lookup failed");
                        None
                    }
                    None => None,
                };
                judge_peer_mac(entry.as_ref(), mac)
            }
            Neighbors::Switch(sw) => match sw.mac_of(ip) {
                Some(k) if k == mac => PeerMacVerdict::Agrees,
                Some(k) => PeerMacVerdict::Contradicted(k),
                None => PeerMacVerdict::Unknown,
            },
        }
    }

    /// Starts asking `ip`'s owner for its MAC on behalf of connection `handle`, which came
    /// from `mac` ([`PeerMacProbes::start`]); false when no probe started (the switch
    /// needs none, the table could not be read, or too many wait).
    pub(crate) fn start_probe<H: Copy>(
        &mut self,
        probes: &mut PeerMacProbes<H>,
        ip: Ipv4Addr,
        mac: EthernetAddress,
        handle: H,
        now: Instant,
    ) -> bool {
        match self {
            Neighbors::Kernel {
                table: Some(table),
                ifindex,
            } => probes.start(table, *ifindex, ip, mac, handle, now),
            _ => false,
        }
    }

    /// Reports each probe that ended ([`PeerMacProbes::poll`]).
    pub(crate) fn poll_probes<H: Copy>(
        &mut self,
        probes: &mut PeerMacProbes<H>,
        now: Instant,
        done: impl FnMut(H, Ipv4Addr, ProbeOutcome),
    ) {
        if let Neighbors::Kernel {
            table: Some(table),
            ifindex,
        } = self
        {
            probes.poll(table, *ifindex, now, done);
        }
    }
}

/// A request to the kernel resolver thread.
pub(crate) struct ResolveRequest {
    ip: Ipv4Addr,
    reply: tokio::sync::oneshot::Sender<Result<EthernetAddress, NeighError>>,
}

/// What [`Resolver::ask`] learnt: the address, or where the resolver thread will answer.
enum Answer {
    Known(EthernetAddress),
    Later(Reply),
}

/// The resolver thread's answer to come.
struct Reply(tokio::sync::oneshot::Receiver<Result<EthernetAddress, NeighError>>);

impl Reply {
    fn poll(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<EthernetAddress, ChannelError>> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|r| match r {
            Ok(r) => r.map_err(ChannelError::Neighbor),
            Err(_) => Err(ChannelError::ShutDown),
        })
    }
}

/// Resolves peers' MAC addresses for a set's connects.
pub(crate) enum Resolver {
    /// The kernel's table, through a thread of the set's namespace (a blocking ARP
    /// resolution never stalls a queue, and works from callers in any namespace).
    Kernel {
        requests: Option<Sender<ResolveRequest>>,
        thread: Option<JoinHandle<()>>,
    },
    /// The switch knows every host on it.
    Switch(SimSwitch),
}

impl Resolver {
    /// Starts the kernel resolver thread for interface `ifindex` (in the calling thread's
    /// namespace).
    pub(crate) fn kernel(
        ifname: &str,
        ifindex: u32,
        timeout: Duration,
    ) -> Result<Resolver, ChannelError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name(format!("nc-neigh-{ifname}"))
            .spawn(move || serve(ifindex, timeout, rx))
            .map_err(|source| ChannelError::Io {
                op: "spawning the resolver thread",
                source,
            })?;
        Ok(Resolver::Kernel {
            requests: Some(tx),
            thread: Some(thread),
        })
    }

    /// The MAC address of `ip` (blocking for an ARP exchange where the kernel has none).
    pub(crate) fn resolve(&self, ip: Ipv4Addr) -> Result<EthernetAddress, ChannelError> {
        match self.ask(ip)? {
            Answer::Known(mac) => Ok(mac),
            Answer::Later(mut rx) => {
                block_on(None, |cx| rx.poll(cx)).unwrap_or(Err(ChannelError::ShutDown))
            }
        }
    }

    /// [`resolve`](Self::resolve) without blocking the calling thread: an ARP exchange is
    /// awaited.
    pub(crate) async fn resolve_async(
        &self,
        ip: Ipv4Addr,
    ) -> Result<EthernetAddress, ChannelError> {
        match self.ask(ip)? {
            Answer::Known(mac) => Ok(mac),
            Answer::Later(mut rx) => std::future::poll_fn(|cx| rx.poll(cx)).await,
        }
    }

    fn ask(&self, ip: Ipv4Addr) -> Result<Answer, ChannelError> {
        match self {
            Resolver::Kernel { requests, .. } => {
                let Some(requests) = requests else {
                    return Err(ChannelError::ShutDown);
                };
                let (tx, rx) = tokio::sync::oneshot::channel();
                requests
                    .send(ResolveRequest { ip, reply: tx })
                    .map_err(|_| ChannelError::ShutDown)?;
                Ok(Answer::Later(Reply(rx)))
            }
            Resolver::Switch(sw) => sw
                .mac_of(ip)
                .map(Answer::Known)
                .ok_or(ChannelError::Neighbor(NeighError::Unreachable {
                    ip,
                    ifindex: 0,
                })),
        }
    }

    /// Ends the resolver thread (the set stops).
    pub(crate) fn stop(&mut self) {
        if let Resolver::Kernel { requests, thread } = self {
            drop(requests.take());
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resolver::Kernel { .. } => f.write_str("Resolver::Kernel"),
            Resolver::Switch(_) => f.write_str("Resolver::Switch"),
        }
    }
}

/// The resolver thread's body: serves requests until every sender is gone.
fn serve(ifindex: u32, timeout: Duration, requests: Receiver<ResolveRequest>) {
    let mut table = KernelNeighbors::open();
    while let Ok(req) = requests.recv() {
        let res = match &mut table {
            Ok(t) => t.resolve(ifindex, req.ip, timeout),
            Err(e) => Err(NeighError::Netlink {
                op: "opening the neighbour table",
                source: std::io::Error::other(e.to_string()),
            }),
        };
        let _ = req.reply.send(res);
    }
}
