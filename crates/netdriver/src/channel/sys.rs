//! System details of the channel layer: how many rx queues an interface has.
//!
//! The count comes from the `ETHTOOL_GCHANNELS` ioctl on a socket of the calling thread's
//! network namespace, not from `/sys/class/net/<if>/queues`: sysfs shows the network
//! namespace of whoever mounted it, so a thread that entered a namespace with `setns(2)`
//! would read the host's interfaces there (or none).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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

/// Number of rx queues of `ifname` in the calling thread's network namespace: the
/// driver's dedicated rx channels plus its combined (rx+tx) channels, as `ethtool -l`
/// reports them. Fails with the driver's error when it does not report channels
/// (`EOPNOTSUPP`); configure the queues explicitly then.
pub fn rx_queue_count(ifname: &str) -> io::Result<u32> {
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
    let mut channels = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..EthtoolChannels::default()
    };
    // SAFETY: `ifreq` is plain old data; all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in ifr.ifr_name.iter_mut().zip(name) {
        *dst = src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (&mut channels as *mut EthtoolChannels).cast();
    // SAFETY: SIOCETHTOOL with a NUL-terminated name and `ifru_data` pointing at a live,
    // correctly laid out `ethtool_channels` that the kernel fills; both outlive the call.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(channels.rx_count + channels.combined_count)
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
    }
}
