//! The reference peer for the bulk-transfer benchmark: smoltcp's TCP, two sockets on one
//! interface over an in-memory Ethernet loopback, with the same MTU, buffer sizes and
//! congestion control as our side, and checksums computed and verified like ours.

use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{ChecksumCapabilities, Device, DeviceCapabilities, Loopback, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{EthernetAddress, IpAddress, IpCidr};

/// smoltcp's `Loopback` with a real Ethernet MTU and real checksums: the stock device
/// reports a 65535-byte MTU and skips checksums, which would not be a like-for-like peer.
struct EthernetLoopback {
    inner: Loopback,
    frame_mtu: usize,
}

impl Device for EthernetLoopback {
    type RxToken<'a> = <Loopback as Device>::RxToken<'a>;
    type TxToken<'a> = <Loopback as Device>::TxToken<'a>;

    fn receive(&mut self, now: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        self.inner.receive(now)
    }

    fn transmit(&mut self, now: Instant) -> Option<Self::TxToken<'_>> {
        self.inner.transmit(now)
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.frame_mtu;
        caps.checksum = ChecksumCapabilities::default();
        caps
    }
}

/// Transfers `bytes` from a client socket to a server socket over smoltcp and returns the
/// number of bytes the server received (always `bytes` unless the transfer stalled).
/// `ip_mtu` is the IP MTU (1500 for a standard Ethernet link).
pub fn transfer(bytes: usize, buffer: usize, ip_mtu: usize) -> usize {
    let mut device = EthernetLoopback {
        inner: Loopback::new(Medium::Ethernet),
        frame_mtu: ip_mtu + 14,
    };
    let mut now = Instant::from_millis(0);
    let config = Config::new(EthernetAddress([0x02, 0, 0, 0, 0, 1]).into());
    let mut iface = Interface::new(config, &mut device, now);
    iface.update_ip_addrs(|addrs| {
        addrs
            .push(IpCidr::new(IpAddress::v4(10, 77, 0, 1), 24))
            .expect("one address fits");
    });

    let mk = || {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; buffer]),
            tcp::SocketBuffer::new(vec![0u8; buffer]),
        );
        s.set_congestion_control(tcp::CongestionControl::Cubic);
        s
    };
    let mut sockets = SocketSet::new(Vec::new());
    let server = sockets.add(mk());
    let client = sockets.add(mk());
    sockets
        .get_mut::<tcp::Socket>(server)
        .listen(7000)
        .expect("listen");
    sockets
        .get_mut::<tcp::Socket>(client)
        .connect(iface.context(), (IpAddress::v4(10, 77, 0, 1), 7000), 49152)
        .expect("connect");

    let chunk = vec![0x5au8; 64 * 1024];
    let mut sink = vec![0u8; 64 * 1024];
    let (mut sent, mut received) = (0usize, 0usize);
    let mut idle_rounds = 0u32;
    while received < bytes {
        iface.poll(now, &mut device, &mut sockets);
        let mut progressed = false;
        {
            let c = sockets.get_mut::<tcp::Socket>(client);
            if c.can_send() && sent < bytes {
                let n = c
                    .send_slice(&chunk[..chunk.len().min(bytes - sent)])
                    .unwrap_or(0);
                sent += n;
                progressed |= n > 0;
            }
        }
        {
            let s = sockets.get_mut::<tcp::Socket>(server);
            while s.can_recv() {
                let n = s.recv_slice(&mut sink).unwrap_or(0);
                if n == 0 {
                    break;
                }
                received += n;
                progressed = true;
            }
        }
        if progressed {
            idle_rounds = 0;
        } else {
            // Nothing moved: jump virtual time to the next timer (delayed ACK, RTO).
            idle_rounds += 1;
            if idle_rounds > 10_000 {
                break;
            }
            let delay = iface
                .poll_delay(now, &sockets)
                .unwrap_or(Duration::from_millis(1));
            now += delay.max(Duration::from_micros(1));
        }
    }
    received
}
