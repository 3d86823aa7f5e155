//! The reference peer for the bulk-transfer benchmark: smoltcp's TCP on two interfaces
//! joined by an in-memory Ethernet link whose frame buffers are recycled (as our simulated
//! link's are), with the same MTU, buffer sizes, congestion control, Nagle and delayed-ACK
//! settings as our side, timestamps on (as ours), and checksums computed and verified in
//! software like ours. SACK is on in both by default.

use smoltcp::iface::{Config, Interface, PollResult, SocketSet};
use smoltcp::phy::{self, ChecksumCapabilities, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{EthernetAddress, IpAddress, IpCidr};

use std::sync::atomic::{AtomicU32, Ordering};

use super::pattern;

/// Virtual time in milliseconds, for the timestamp option: smoltcp takes TSvals from a
/// plain `fn() -> u32`, which cannot capture the transfer's clock.
static NOW_MS: AtomicU32 = AtomicU32::new(0);

fn tsval() -> u32 {
    NOW_MS.load(Ordering::Relaxed)
}

/// Frames that may wait in one direction; beyond this `transmit` reports no buffer
/// (backpressure, as a full tx ring does). A 256 KiB window is about 180 frames.
const QUEUE_FRAMES: usize = 1024;

/// One direction of the wire: frames in flight, and the buffers the receiver has finished
/// with, which the sender takes again before allocating.
#[derive(Default)]
struct Direction {
    /// `(buffer, frame length)`: buffers stay `frame_mtu` bytes long, so reuse never
    /// zero-fills.
    queue: std::collections::VecDeque<(Vec<u8>, usize)>,
    free: Vec<Vec<u8>>,
    allocated: usize,
}

/// The wire between the two interfaces: `dirs[i]` carries frames sent by end `i`.
struct Wire {
    dirs: [Direction; 2],
    frame_mtu: usize,
}

/// One end of the wire as a smoltcp device, borrowed for one `poll`.
struct End<'w> {
    wire: &'w mut Wire,
    side: usize,
}

struct RxToken<'a> {
    buf: Vec<u8>,
    len: usize,
    /// Where the buffer goes back once read: the sender's free list.
    free: &'a mut Vec<Vec<u8>>,
}

struct TxToken<'a> {
    dir: &'a mut Direction,
    frame_mtu: usize,
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        let r = f(&self.buf[..self.len]);
        self.free.push(self.buf);
        r
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = match self.dir.free.pop() {
            Some(buf) => buf,
            None => {
                self.dir.allocated += 1;
                vec![0u8; self.frame_mtu]
            }
        };
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let r = f(&mut buf[..len]);
        if self.dir.queue.len() < QUEUE_FRAMES {
            self.dir.queue.push_back((buf, len));
        } else {
            self.dir.free.push(buf);
        }
        r
    }
}

impl Device for End<'_> {
    type RxToken<'a>
        = RxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = TxToken<'a>
    where
        Self: 'a;

    fn receive(&mut self, _now: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let frame_mtu = self.wire.frame_mtu;
        let [d0, d1] = &mut self.wire.dirs;
        let (out, inc) = if self.side == 0 { (d0, d1) } else { (d1, d0) };
        let (buf, len) = inc.queue.pop_front()?;
        Some((
            RxToken {
                buf,
                len,
                free: &mut inc.free,
            },
            TxToken {
                dir: out,
                frame_mtu,
            },
        ))
    }

    fn transmit(&mut self, _now: Instant) -> Option<Self::TxToken<'_>> {
        let frame_mtu = self.wire.frame_mtu;
        let out = &mut self.wire.dirs[self.side];
        if out.queue.len() >= QUEUE_FRAMES {
            return None;
        }
        Some(TxToken {
            dir: out,
            frame_mtu,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.wire.frame_mtu;
        // Compute on transmit and verify on receive: IPv4 header and TCP (the default).
        caps.checksum = ChecksumCapabilities::default();
        caps
    }
}

/// Transfers `bytes` from a client on one interface to a server on the other over smoltcp
/// and returns the number of bytes the server received and checked (always `bytes` unless
/// the transfer stalled; panics if a byte differs from what was sent). `ip_mtu` is the IP
/// MTU (1500 for a standard Ethernet link).
pub fn transfer(bytes: usize, buffer: usize, ip_mtu: usize) -> usize {
    let mut wire = Wire {
        dirs: [Direction::default(), Direction::default()],
        frame_mtu: ip_mtu + 14,
    };
    let mut now = Instant::from_millis(0);
    let ip_a = IpAddress::v4(10, 77, 0, 1);
    let ip_b = IpAddress::v4(10, 77, 0, 2);
    let iface = |wire: &mut Wire, side: usize, ip: IpAddress| {
        let mac = EthernetAddress([0x02, 0, 0, 0, 0, 0xa + side as u8]);
        let mut iface = Interface::new(
            Config::new(mac.into()),
            &mut End { wire, side },
            Instant::from_millis(0),
        );
        iface.update_ip_addrs(|addrs| {
            addrs.push(IpCidr::new(ip, 24)).expect("one address fits");
        });
        iface
    };
    let mut a = iface(&mut wire, 0, ip_a);
    let mut b = iface(&mut wire, 1, ip_b);

    let socket = || {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; buffer]),
            tcp::SocketBuffer::new(vec![0u8; buffer]),
        );
        s.set_congestion_control(tcp::CongestionControl::Cubic);
        s.set_nagle_enabled(false);
        s.set_ack_delay(None);
        // Timestamps (RFC 7323) as ours sends them; smoltcp's default is off.
        s.set_tsval_generator(Some(tsval));
        s
    };
    let mut sockets_a = SocketSet::new(Vec::new());
    let mut sockets_b = SocketSet::new(Vec::new());
    let client = sockets_a.add(socket());
    let server = sockets_b.add(socket());
    sockets_b
        .get_mut::<tcp::Socket>(server)
        .listen(7000)
        .expect("listen");
    sockets_a
        .get_mut::<tcp::Socket>(client)
        .connect(a.context(), (ip_b, 7000), 49152)
        .expect("connect");

    let pattern = pattern::pattern();
    let lend = pattern::recv_lends();
    let mut sink = vec![0u8; 64 * 1024];
    let (mut sent, mut received) = (0usize, 0usize);
    let mut idle_rounds = 0u32;
    let mut rounds = 0u64;
    while received < bytes {
        rounds += 1;
        NOW_MS.store(now.total_millis() as u32, Ordering::Relaxed);
        let ra = a.poll(
            now,
            &mut End {
                wire: &mut wire,
                side: 0,
            },
            &mut sockets_a,
        );
        let rb = b.poll(
            now,
            &mut End {
                wire: &mut wire,
                side: 1,
            },
            &mut sockets_b,
        );
        let mut progressed = matches!(ra, PollResult::SocketStateChanged)
            | matches!(rb, PollResult::SocketStateChanged)
            | wire.dirs.iter().any(|d| !d.queue.is_empty());
        let c = sockets_a.get_mut::<tcp::Socket>(client);
        while sent < bytes && c.can_send() {
            let piece = pattern::next(&pattern, sent, bytes - sent);
            let n = c.send_slice(piece).unwrap_or(0);
            if n == 0 {
                break;
            }
            sent += n;
            progressed = true;
        }
        let s = sockets_b.get_mut::<tcp::Socket>(server);
        while s.can_recv() {
            let n = if lend {
                let at = received;
                s.recv(|bytes| {
                    assert!(
                        pattern::check(&pattern, at, bytes),
                        "smoltcp delivered a wrong byte near offset {at}"
                    );
                    (bytes.len(), bytes.len())
                })
                .unwrap_or(0)
            } else {
                let n = s.recv_slice(&mut sink).unwrap_or(0);
                assert!(
                    pattern::check(&pattern, received, &sink[..n]),
                    "smoltcp delivered a wrong byte near offset {received}"
                );
                n
            };
            if n == 0 {
                break;
            }
            received += n;
            progressed = true;
        }
        if progressed {
            idle_rounds = 0;
        } else {
            // Nothing moved: jump virtual time to the next timer (RTO, ARP retry).
            idle_rounds += 1;
            if idle_rounds > 10_000 {
                break;
            }
            let next = [a.poll_delay(now, &sockets_a), b.poll_delay(now, &sockets_b)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(Duration::from_millis(1));
            now += next.max(Duration::from_micros(1));
        }
    }
    if std::env::var_os("TCP_BULK_DEBUG").is_some() {
        eprintln!(
            "rounds {rounds}, allocated {} {}",
            wire.dirs[0].allocated, wire.dirs[1].allocated
        );
    }
    debug_assert!(wire.dirs.iter().all(|d| d.allocated <= QUEUE_FRAMES + 1));
    received
}
