//! System details of the channel layer: how many rx queues an interface has, which
//! driver runs it, and what an AF_XDP socket's rings dropped.
//!
//! Both come from `SIOCETHTOOL` ioctls (`ETHTOOL_GCHANNELS`, `ETHTOOL_GDRVINFO`) on a socket of the calling thread's
//! network namespace, not from `/sys/class/net/<if>/queues`: sysfs shows the network
//! namespace of whoever mounted it, so a thread that entered a namespace with `setns(2)`
//! would read the host's interfaces there (or none).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `ETHTOOL_GCHANNELS` from `<linux/ethtool.h>`.
const ETHTOOL_GCHANNELS: u32 = 0x0000_003c;

/// `struct ethtool_channels` from `<linux/ethtool.h>`.
#[repr(C)]
#[derive(Debug, Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// `ETHTOOL_GDRVINFO` from `<linux/ethtool.h>`.
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;

/// `struct ethtool_drvinfo` from `<linux/ethtool.h>`.
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// Runs the `SIOCETHTOOL` request whose command struct `data` points at, for `ifname` in
/// the calling thread's network namespace.
///
/// # Safety
/// `data` must point at a live, writable value of the struct that the command word at its
/// start names, laid out as `<linux/ethtool.h>` declares it.
unsafe fn ethtool_ioctl(ifname: &str, data: *mut libc::c_void) -> io::Result<()> {
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid interface name {ifname:?}"),
        ));
    }
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor we just created and own exclusively.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `ifreq` is plain old data; all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in ifr.ifr_name.iter_mut().zip(name) {
        *dst = src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = data.cast();
    // SAFETY: SIOCETHTOOL with a NUL-terminated name (the name is shorter than IFNAMSIZ
    // and the rest is zero) and `ifru_data` pointing at the command struct, which the
    // caller guarantees is live and correctly laid out for the duration of the call.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Number of rx queues of `ifname` in the calling thread's network namespace: the
/// driver's dedicated rx channels plus its combined (rx+tx) channels, as `ethtool -l`
/// reports them. Fails with the driver's error when it does not report channels
/// (`EOPNOTSUPP`); configure the queues explicitly then.
pub fn rx_queue_count(ifname: &str) -> io::Result<u32> {
    let mut channels = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..EthtoolChannels::default()
    };
    // SAFETY: `channels` is a live `ethtool_channels` starting with ETHTOOL_GCHANNELS.
    unsafe { ethtool_ioctl(ifname, (&mut channels as *mut EthtoolChannels).cast())? };
    Ok(channels.rx_count + channels.combined_count)
}

/// Name of the driver of `ifname` in the calling thread's network namespace (`veth`,
/// `mlx5_core`, ...), as `ethtool -i` reports it.
pub fn driver_name(ifname: &str) -> io::Result<String> {
    let mut info = EthtoolDrvinfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        n_priv_flags: 0,
        n_stats: 0,
        testinfo_len: 0,
        eedump_len: 0,
        regdump_len: 0,
    };
    // SAFETY: `info` is a live `ethtool_drvinfo` starting with ETHTOOL_GDRVINFO.
    unsafe { ethtool_ioctl(ifname, (&mut info as *mut EthtoolDrvinfo).cast())? };
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// Whether frames on an interface of this driver never leave the host, so that a Linux
/// sender's partial checksum (`CHECKSUM_PARTIAL`) arrives uncompleted and is as
/// trustworthy as a memory copy: veth pairs and netkit devices.
pub fn is_host_local_driver(driver: &str) -> bool {
    matches!(driver, "veth" | "netkit")
}

/// `struct xdp_statistics` from `<linux/if_xdp.h>` (Linux 5.9 and later; older kernels
/// fill only the first three fields and report the shorter length).
#[repr(C)]
#[derive(Debug, Default)]
struct XdpStatistics {
    rx_dropped: u64,
    rx_invalid_descs: u64,
    tx_invalid_descs: u64,
    rx_ring_full: u64,
    rx_fill_ring_empty_descs: u64,
    tx_ring_empty_descs: u64,
}

/// What the kernel dropped at one AF_XDP socket's rings since it was bound
/// (`XDP_STATISTICS`): frames the XDP program sent to the socket that never reached it.
/// The rx ring is a queue the network fills, so these are its overflow counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskDrops {
    /// Frames dropped on receive for any reason (the two below included).
    pub rx_dropped: u64,
    /// Of those, dropped because the rx ring was full (the thread did not keep up).
    pub rx_ring_full: u64,
    /// Receives that found the fill ring empty (no frame to copy into).
    pub rx_fill_ring_empty: u64,
    /// Invalid descriptors on the rx side.
    pub rx_invalid_descs: u64,
    /// Invalid descriptors on the tx ring.
    pub tx_invalid_descs: u64,
}

/// Reads the drop counters of the AF_XDP socket `fd`.
pub fn xsk_drops(fd: BorrowedFd<'_>) -> io::Result<XskDrops> {
    let mut stats = XdpStatistics::default();
    let mut len = std::mem::size_of::<XdpStatistics>() as libc::socklen_t;
    // SAFETY: getsockopt(2) writes at most `len` bytes into `stats`, a live, correctly
    // aligned `xdp_statistics`, and updates `len`; the descriptor is borrowed for the call.
    let ret = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            libc::XDP_STATISTICS,
            (&mut stats as *mut XdpStatistics).cast(),
            &mut len,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(XskDrops {
        rx_dropped: stats.rx_dropped,
        rx_ring_full: stats.rx_ring_full,
        rx_fill_ring_empty: stats.rx_fill_ring_empty_descs,
        rx_invalid_descs: stats.rx_invalid_descs,
        tx_invalid_descs: stats.tx_invalid_descs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(
            rx_queue_count("").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            rx_queue_count("a-name-much-too-long-for-ifnamsiz")
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        // No such device (or, without privileges, whatever the kernel says): an error.
        assert!(rx_queue_count("nc-nonexist0").is_err());
        assert_eq!(
            driver_name("").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert!(driver_name("nc-nonexist0").is_err());
    }

    #[test]
    fn drop_counters_are_asked_only_of_af_xdp_sockets() {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        use std::os::fd::AsFd;
        assert!(xsk_drops(udp.as_fd()).is_err());
    }

    #[test]
    fn host_local_drivers() {
        assert!(is_host_local_driver("veth"));
        assert!(is_host_local_driver("netkit"));
        assert!(!is_host_local_driver("mlx5_core"));
        assert!(!is_host_local_driver(""));
        // `lo` exists in every namespace; its driver (if it reports one) is not veth.
        if let Ok(name) = driver_name("lo") {
            assert!(!is_host_local_driver(&name), "lo reports {name:?}");
        }
    }
}
