//! An in-memory Ethernet switch: hosts in one process, each with several NIC queues,
//! exchanging whole frames in real time. It is what stacks without privileges run over
//! (the in-memory stacks of `vns`, unprivileged tests), with the same queue drivers,
//! TCP and interfaces as over AF_XDP.
//!
//! A host joins with [`SimSwitch::attach`] (a MAC address is assigned) and gets one
//! [`SwitchPort`] per queue. A unicast frame sent on a host's queue *q* arrives on the
//! destination host's queue *q* (modulo its queue count), as a frame sent on veth tx
//! queue *q* arrives on the peer's rx queue *q*; a broadcast goes to every other host's
//! queue *q*. Frames are delivered when the sender flushes: [`Link::poll_at`] is always
//! `None`, and a port wakes the waker its driver registered
//! ([`QueueLink::register_rx_waker`]) when a frame lands.
//!
//! Memory is bounded: each port holds at most [`SwitchConfig::port_frames`] frames
//! waiting to be received; beyond that frames are dropped (counted in the receiver's
//! [`LinkStats::dropped_no_buffer`], as a NIC's full rx ring drops). A seeded loss rate
//! ([`SwitchConfig::loss`]) drops frames at random, for tests of recovery.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use atomic_waker::AtomicWaker;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{tx_range_ok, Link, LinkStats, QueueLink, TX_HEADROOM};
use crate::time::Instant;
use crate::wire::EthernetAddress;

/// Settings of a [`SimSwitch`].
#[derive(Debug, Clone, PartialEq)]
pub struct SwitchConfig {
    /// IP MTU of every port (largest Ethernet payload).
    pub mtu: usize,
    /// Frames a port holds for its receiver; more are dropped.
    pub port_frames: usize,
    /// Probability that a unicast frame is lost (0: none), drawn from a generator seeded
    /// with [`seed`](Self::seed).
    pub loss: f64,
    /// Seed of the loss generator.
    pub seed: u64,
}

impl Default for SwitchConfig {
    /// MTU 1500 (the test bed's), 4096 frames per port (an AF_XDP rx ring's default
    /// size), no loss.
    fn default() -> Self {
        SwitchConfig {
            mtu: 1500,
            port_frames: 4096,
            loss: 0.0,
            seed: 1,
        }
    }
}

/// One frame waiting at a port: a buffer and where the frame lies in it.
type Frame = (Vec<u8>, Range<usize>);

/// The receive side of one port.
#[derive(Debug, Default)]
struct PortRx {
    frames: Mutex<VecDeque<Frame>>,
    waker: AtomicWaker,
    dropped: AtomicU64,
}

impl PortRx {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Frame>> {
        self.frames.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug)]
struct Host {
    ipv4: Ipv4Addr,
    ports: Vec<Arc<PortRx>>,
}

#[derive(Debug)]
struct Fabric {
    hosts: HashMap<EthernetAddress, Host>,
    by_ip: HashMap<Ipv4Addr, EthernetAddress>,
    next_mac: u32,
    rng: SmallRng,
    /// Frames lost by [`SwitchConfig::loss`].
    lost: u64,
}

/// An in-memory switch; clones share it. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct SimSwitch {
    fabric: Arc<Mutex<Fabric>>,
    config: SwitchConfig,
}

impl Default for SimSwitch {
    fn default() -> Self {
        SimSwitch::new(SwitchConfig::default())
    }
}

/// Why [`SimSwitch::attach`] refused a host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwitchError {
    /// Another host on the switch has this address.
    #[error("address {0} is already on the switch")]
    AddressInUse(Ipv4Addr),
    /// A host needs at least one queue.
    #[error("a host needs at least one queue")]
    NoQueues,
}

impl SimSwitch {
    /// An empty switch.
    pub fn new(config: SwitchConfig) -> SimSwitch {
        SimSwitch {
            fabric: Arc::new(Mutex::new(Fabric {
                hosts: HashMap::new(),
                by_ip: HashMap::new(),
                next_mac: 1,
                rng: SmallRng::seed_from_u64(config.seed),
                lost: 0,
            })),
            config,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Fabric> {
        self.fabric.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The switch's settings.
    pub fn config(&self) -> &SwitchConfig {
        &self.config
    }

    /// Attaches a host with address `ipv4` and `queues` queues; returns its MAC address
    /// and one port per queue (port *i* is queue *i*). The host stays on the switch until
    /// [`detach`](Self::detach), so that frames to a stopped host are dropped like frames
    /// to a host whose stack is down.
    pub fn attach(
        &self,
        ipv4: Ipv4Addr,
        queues: usize,
    ) -> Result<(EthernetAddress, Vec<SwitchPort>), SwitchError> {
        if queues == 0 {
            return Err(SwitchError::NoQueues);
        }
        let mut f = self.lock();
        if f.by_ip.contains_key(&ipv4) {
            return Err(SwitchError::AddressInUse(ipv4));
        }
        let n = f.next_mac;
        f.next_mac += 1;
        // Locally administered, unicast: 02:00:<n>.
        let b = n.to_be_bytes();
        let mac = EthernetAddress([0x02, 0x00, b[0], b[1], b[2], b[3]]);
        let rx: Vec<Arc<PortRx>> = (0..queues).map(|_| Arc::default()).collect();
        f.hosts.insert(
            mac,
            Host {
                ipv4,
                ports: rx.clone(),
            },
        );
        f.by_ip.insert(ipv4, mac);
        drop(f);
        let ports = rx
            .into_iter()
            .enumerate()
            .map(|(queue, rx)| SwitchPort {
                switch: self.clone(),
                mac,
                queue,
                rx,
                stats: LinkStats::default(),
                staged: Vec::new(),
                free: Vec::new(),
                rx_stage: Vec::new(),
            })
            .collect();
        Ok((mac, ports))
    }

    /// Takes the host with address `ipv4` off the switch: frames to it are dropped from
    /// now on, and its address may be attached again.
    pub fn detach(&self, ipv4: Ipv4Addr) {
        let mut f = self.lock();
        if let Some(mac) = f.by_ip.remove(&ipv4) {
            f.hosts.remove(&mac);
        }
    }

    /// The MAC address of the host with address `ipv4`, if it is on the switch (the
    /// switch's neighbour table: what ARP would answer).
    pub fn mac_of(&self, ipv4: Ipv4Addr) -> Option<EthernetAddress> {
        self.lock().by_ip.get(&ipv4).copied()
    }

    /// Frames lost to [`SwitchConfig::loss`] so far.
    pub fn lost_frames(&self) -> u64 {
        self.lock().lost
    }

    /// Delivers the frames `from`'s queue `queue` flushed; frames that find no port, a
    /// full one, or the loss generator go back to `spare`.
    fn deliver(
        &self,
        from: EthernetAddress,
        queue: usize,
        frames: &mut Vec<Frame>,
        spare: &mut Vec<Vec<u8>>,
    ) -> (u64, u64) {
        let mut f = self.lock();
        let mut sent = (0, 0);
        for (buf, range) in frames.drain(..) {
            let Some(dst) = buf.get(range.clone()).and_then(|fr| fr.get(..6)) else {
                spare.push(buf);
                continue;
            };
            let dst = EthernetAddress([dst[0], dst[1], dst[2], dst[3], dst[4], dst[5]]);
            sent.0 += 1;
            sent.1 += range.len() as u64;
            if dst.is_broadcast() {
                for (mac, host) in &f.hosts {
                    if *mac == from {
                        continue;
                    }
                    let port = &host.ports[queue % host.ports.len()];
                    let copy = buf.clone();
                    push(port, (copy, range.clone()), self.config.port_frames);
                }
                spare.push(buf);
                continue;
            }
            if self.config.loss > 0.0 && f.rng.gen_bool(self.config.loss.min(1.0)) {
                f.lost += 1;
                spare.push(buf);
                continue;
            }
            match f.hosts.get(&dst) {
                Some(host) => {
                    let port = host.ports[queue % host.ports.len()].clone();
                    if let Some((buf, _)) = push(&port, (buf, range), self.config.port_frames) {
                        spare.push(buf);
                    }
                }
                None => spare.push(buf),
            }
        }
        sent
    }
}

/// Queues a frame at a port and wakes its receiver; the frame back when the port is full.
fn push(port: &PortRx, frame: Frame, limit: usize) -> Option<Frame> {
    let mut q = port.lock();
    if q.len() >= limit {
        drop(q);
        port.dropped.fetch_add(1, Ordering::Relaxed);
        return Some(frame);
    }
    let was_empty = q.is_empty();
    q.push_back(frame);
    drop(q);
    if was_empty {
        port.waker.wake();
    }
    None
}

/// One queue of a host on a [`SimSwitch`]: a [`Link`] and a [`QueueLink`].
#[derive(Debug)]
pub struct SwitchPort {
    switch: SimSwitch,
    mac: EthernetAddress,
    queue: usize,
    rx: Arc<PortRx>,
    stats: LinkStats,
    /// Frames written by `tx_batch`, not yet flushed.
    staged: Vec<Frame>,
    /// Empty buffers for transmit.
    free: Vec<Vec<u8>>,
    /// Frames taken for the current `recv_batch`.
    rx_stage: Vec<Frame>,
}

/// Spare buffers a port keeps; more are freed.
const SPARE_BUFFERS: usize = 256;

impl SwitchPort {
    /// The host's MAC address.
    pub fn mac(&self) -> EthernetAddress {
        self.mac
    }

    /// The queue this port is.
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// The switch.
    pub fn switch(&self) -> &SimSwitch {
        &self.switch
    }
}

impl Link for SwitchPort {
    fn mtu(&self) -> usize {
        self.switch.config.mtu
    }

    fn recv_batch(&mut self, _now: Instant, max: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        {
            let mut q = self.rx.lock();
            while self.rx_stage.len() < max {
                match q.pop_front() {
                    Some(fr) => self.rx_stage.push(fr),
                    None => break,
                }
            }
        }
        let n = self.rx_stage.len();
        for (buf, range) in self.rx_stage.drain(..) {
            let data = buf.get(range).unwrap_or(&[]);
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += data.len() as u64;
            f(data);
            if self.free.len() < SPARE_BUFFERS {
                self.free.push(buf);
            }
        }
        self.stats.dropped_no_buffer = self.rx.dropped.load(Ordering::Relaxed);
        n
    }

    fn tx_batch(
        &mut self,
        _now: Instant,
        max: usize,
        f: &mut dyn FnMut(&mut [u8]) -> Option<Range<usize>>,
    ) -> usize {
        let frame_len = self.max_frame_len();
        let buf_len = TX_HEADROOM + frame_len;
        let mut produced = 0;
        while produced < max {
            let mut buf = self.free.pop().unwrap_or_default();
            buf.resize(buf_len, 0);
            match f(&mut buf) {
                None => {
                    self.free.push(buf);
                    break;
                }
                Some(range) => {
                    produced += 1;
                    if tx_range_ok(&range, buf_len, frame_len) {
                        self.staged.push((buf, range));
                    } else {
                        self.stats.dropped_oversize += 1;
                        self.free.push(buf);
                    }
                }
            }
        }
        produced
    }

    fn flush(&mut self, _now: Instant) {
        if self.staged.is_empty() {
            return;
        }
        self.stats.tx_kicks += 1;
        let (frames, bytes) =
            self.switch
                .deliver(self.mac, self.queue, &mut self.staged, &mut self.free);
        self.stats.tx_frames += frames;
        self.stats.tx_bytes += bytes;
        self.free.truncate(SPARE_BUFFERS);
    }

    fn poll_at(&self) -> Option<Instant> {
        None
    }

    fn stats(&self) -> LinkStats {
        self.stats
    }
}

impl QueueLink for SwitchPort {
    fn rx_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    fn register_rx_waker(&self, waker: &Waker) {
        self.rx.waker.register(waker);
    }

    fn rx_ready(&mut self) -> bool {
        !self.rx.lock().is_empty()
    }
}

impl Drop for SwitchPort {
    fn drop(&mut self) {
        // The host leaves with its first port: its address may be attached again.
        if self.queue == 0 {
            let mut f = self.switch.lock();
            if f.hosts.contains_key(&self.mac) {
                let ip = f.hosts.get(&self.mac).map(|h| h.ipv4);
                f.hosts.remove(&self.mac);
                if let Some(ip) = ip {
                    f.by_ip.remove(&ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_to(dst: EthernetAddress, tag: u8) -> Vec<u8> {
        let mut f = vec![tag; 60];
        f[..6].copy_from_slice(&dst.0);
        f
    }

    fn send(port: &mut SwitchPort, frame: &[u8]) {
        let n = port.tx_batch(Instant::ZERO, 1, &mut |buf| {
            buf[..frame.len()].copy_from_slice(frame);
            Some(0..frame.len())
        });
        assert_eq!(n, 1);
        port.flush(Instant::ZERO);
    }

    fn recv(port: &mut SwitchPort) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        port.recv_batch(Instant::ZERO, usize::MAX, &mut |f| out.push(f.to_vec()));
        out
    }

    /// A frame sent on queue q arrives on the destination's queue q (modulo its queue
    /// count), and wakes that port's registered waker.
    #[test]
    fn frames_go_to_the_destinations_queue_of_the_same_index() {
        let sw = SimSwitch::default();
        let (_, mut a) = sw.attach(Ipv4Addr::new(10, 0, 0, 1), 2).unwrap();
        let (mac_b, mut b) = sw.attach(Ipv4Addr::new(10, 0, 0, 2), 2).unwrap();
        assert_eq!(sw.mac_of(Ipv4Addr::new(10, 0, 0, 2)), Some(mac_b));
        let woken = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        b[1].register_rx_waker(&Waker::from(Arc::new(Flag(woken.clone()))));
        send(&mut a[1], &frame_to(mac_b, 7));
        assert!(woken.load(Ordering::SeqCst));
        assert!(b[1].rx_ready());
        assert!(!b[0].rx_ready());
        assert_eq!(recv(&mut b[1]), vec![frame_to(mac_b, 7)]);
        assert!(!b[1].rx_ready());
        assert_eq!(a[1].stats().tx_frames, 1);
        assert_eq!(b[1].stats().rx_frames, 1);
    }

    /// A full port drops and counts; a broadcast reaches every other host; frames to an
    /// unknown or detached host vanish.
    #[test]
    fn ports_are_bounded_and_broadcasts_flood() {
        let sw = SimSwitch::new(SwitchConfig {
            port_frames: 2,
            ..SwitchConfig::default()
        });
        let (_, mut a) = sw.attach(Ipv4Addr::new(10, 0, 0, 1), 1).unwrap();
        let (mac_b, mut b) = sw.attach(Ipv4Addr::new(10, 0, 0, 2), 1).unwrap();
        let (_, mut c) = sw.attach(Ipv4Addr::new(10, 0, 0, 3), 1).unwrap();
        for i in 0..3 {
            send(&mut a[0], &frame_to(mac_b, i));
        }
        assert_eq!(recv(&mut b[0]).len(), 2);
        assert_eq!(b[0].stats().dropped_no_buffer, 1);
        send(&mut a[0], &frame_to(EthernetAddress::BROADCAST, 9));
        assert_eq!(recv(&mut b[0]).len(), 1);
        assert_eq!(recv(&mut c[0]).len(), 1);
        assert!(recv(&mut a[0]).is_empty());
        assert_eq!(
            sw.attach(Ipv4Addr::new(10, 0, 0, 2), 1).unwrap_err(),
            SwitchError::AddressInUse(Ipv4Addr::new(10, 0, 0, 2))
        );
        sw.detach(Ipv4Addr::new(10, 0, 0, 2));
        send(&mut a[0], &frame_to(mac_b, 1));
        assert!(recv(&mut b[0]).is_empty());
    }

    /// The loss rate drops about that share of unicast frames, reproducibly per seed.
    #[test]
    fn loss_is_seeded() {
        let run = || {
            let sw = SimSwitch::new(SwitchConfig {
                loss: 0.25,
                seed: 7,
                port_frames: 10_000,
                ..SwitchConfig::default()
            });
            let (_, mut a) = sw.attach(Ipv4Addr::new(10, 0, 0, 1), 1).unwrap();
            let (mac_b, mut b) = sw.attach(Ipv4Addr::new(10, 0, 0, 2), 1).unwrap();
            for i in 0..1000 {
                send(&mut a[0], &frame_to(mac_b, i as u8));
            }
            (recv(&mut b[0]).len(), sw.lost_frames())
        };
        let (got, lost) = run();
        assert_eq!(got as u64 + lost, 1000);
        assert!((180..320).contains(&lost), "lost {lost}");
        assert_eq!(run(), (got, lost));
    }
}
