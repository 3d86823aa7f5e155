//! An `AF_PACKET` socket for the raw-frame tests (a spoofed-SYN flood, forged segments,
//! forged ARP): it sends hand-made frames on an interface and sees every frame the
//! interface sends or receives through the kernel (not those an XDP program redirects).

use std::io;

/// An `AF_PACKET` socket on `ifname` (in the calling thread's namespace).
pub struct RawSocket {
    fd: std::os::fd::OwnedFd,
    ifindex: i32,
}

impl RawSocket {
    /// Opens a socket bound to interface `ifindex` that sees every frame (`ETH_P_ALL`),
    /// with a 50 ms receive timeout.
    pub fn open(ifindex: u32) -> RawSocket {
        use std::os::fd::FromRawFd;
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2) call; the result is checked before use.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        assert!(fd >= 0, "AF_PACKET socket: {}", io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let raw = RawSocket {
            fd,
            ifindex: ifindex as i32,
        };
        let sll = raw.addr(proto);
        use std::os::fd::AsRawFd;
        // SAFETY: `sll` is a valid sockaddr_ll and its size is passed with it.
        let rc = unsafe {
            libc::bind(
                raw.fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0, "bind AF_PACKET: {}", io::Error::last_os_error());
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 50_000,
        };
        // SAFETY: SO_RCVTIMEO takes a timeval, passed with its size.
        let rc = unsafe {
            libc::setsockopt(
                raw.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        assert_eq!(rc, 0, "SO_RCVTIMEO: {}", io::Error::last_os_error());
        raw
    }

    fn addr(&self, proto: u16) -> libc::sockaddr_ll {
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = self.ifindex;
        sll
    }

    /// Sends one whole frame; whether all of it went.
    pub fn send(&self, frame: &[u8]) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: the buffer is valid for its length; the socket is bound.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr() as *const libc::c_void,
                frame.len(),
                0,
            )
        };
        n == frame.len() as isize
    }

    /// One frame (incoming or outgoing), or `None` after the receive timeout.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        use std::os::fd::AsRawFd;
        // SAFETY: the buffer is valid for its length.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
            )
        };
        usize::try_from(n).ok()
    }
}
