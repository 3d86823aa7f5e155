//! What an interface's driver advertises of XDP and AF_XDP: the kernel's `netdev`
//! generic-netlink family (`NETDEV_CMD_DEV_GET`, Linux 6.3 and later), as
//! `ynl --family netdev --do dev-get` shows it.
//!
//! [`BindMode::Auto`](super::xdp::BindMode::Auto) asks first whether the driver has AF_XDP
//! zero copy (`xsk-zerocopy`): where it does not (veth), a zero-copy bind would only fail
//! after a UMEM was made, pinned and handed back to the kernel, which releases it later
//! from a work queue (holding huge pages the copy-mode UMEM then cannot have).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `NETDEV_XDP_ACT_*` of `<linux/netdev.h>`.
const XDP_ACT_BASIC: u64 = 1 << 0;
const XDP_ACT_REDIRECT: u64 = 1 << 1;
const XDP_ACT_XSK_ZEROCOPY: u64 = 1 << 3;
const XDP_ACT_RX_SG: u64 = 1 << 5;

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
const NETDEV_A_DEV_XDP_ZC_MAX_SEGS: u16 = 4;
const NETDEV_A_DEV_XSK_FEATURES: u16 = 6;
/// `NETDEV_XSK_FLAGS_TX_CHECKSUM` of `<linux/netdev.h>` (Linux 6.8+).
const XSK_FLAGS_TX_CHECKSUM: u64 = 1 << 1;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// What a driver advertises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct XdpFeatures {
    /// The raw `NETDEV_XDP_ACT_*` bits.
    pub bits: u64,
    /// The most descriptors of a zero-copy multi-buffer frame (1: no multi-buffer in zero
    /// copy), when the kernel says.
    pub zc_max_segs: Option<u32>,
    /// The raw `NETDEV_XSK_FLAGS_*` bits (`xsk-features`: what the driver does with AF_XDP
    /// TX metadata in zero copy), when the kernel says (6.8+).
    pub xsk_features: Option<u64>,
}

impl XdpFeatures {
    /// AF_XDP zero copy (`xsk-zerocopy`).
    pub fn zero_copy(&self) -> bool {
        self.bits & XDP_ACT_XSK_ZEROCOPY != 0
    }

    /// Native XDP (`basic`) with redirects (`redirect`): what AF_XDP needs at all.
    pub fn native_redirect(&self) -> bool {
        self.bits & (XDP_ACT_BASIC | XDP_ACT_REDIRECT) == XDP_ACT_BASIC | XDP_ACT_REDIRECT
    }

    /// TX checksum offload requested through AF_XDP TX metadata, in zero copy
    /// (`xsk-features` `tx-checksum`).
    pub fn tx_checksum(&self) -> bool {
        self.xsk_features.unwrap_or(0) & XSK_FLAGS_TX_CHECKSUM != 0
    }

    /// Multi-buffer frames on receive (`rx-sg`, the `xdp.frags` programs).
    pub fn rx_sg(&self) -> bool {
        self.bits & XDP_ACT_RX_SG != 0
    }
}

/// The XDP features `ifname`'s driver advertises, in the calling thread's network
/// namespace. Fails on kernels without the `netdev` family (before 6.3).
pub fn xdp_features(ifname: &str) -> io::Result<XdpFeatures> {
    let ifindex = nix::net::if_::if_nametoindex(ifname).map_err(io::Error::from)?;
    let sock = GenlSocket::open()?;
    let family = sock.family_id("netdev")?;
    let mut attrs = Vec::new();
    put_attr(&mut attrs, NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes());
    let reply = sock.request(family, NETDEV_CMD_DEV_GET, &attrs)?;
    let mut features = XdpFeatures {
        bits: 0,
        zc_max_segs: None,
        xsk_features: None,
    };
    let mut found = false;
    for (kind, value) in attributes(&reply) {
        match kind {
            NETDEV_A_DEV_XDP_FEATURES => {
                if let Ok(b) = <[u8; 8]>::try_from(value) {
                    features.bits = u64::from_ne_bytes(b);
                    found = true;
                }
            }
            NETDEV_A_DEV_XDP_ZC_MAX_SEGS => {
                if let Ok(b) = <[u8; 4]>::try_from(value) {
                    features.zc_max_segs = Some(u32::from_ne_bytes(b));
                }
            }
            NETDEV_A_DEV_XSK_FEATURES => {
                if let Ok(b) = <[u8; 8]>::try_from(value) {
                    features.xsk_features = Some(u64::from_ne_bytes(b));
                }
            }
            _ => {}
        }
    }
    if !found {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the netdev family's reply has no xdp-features",
        ));
    }
    Ok(features)
}

/// A generic-netlink socket.
struct GenlSocket {
    fd: OwnedFd,
}

impl GenlSocket {
    fn open() -> io::Result<GenlSocket> {
        // SAFETY: a plain socket(2) call; the descriptor is owned right below.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_GENERIC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // A reply that never comes must not hang the caller.
        let timeout = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        // SAFETY: SO_RCVTIMEO reads a `timeval` that lives across the call.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        Ok(GenlSocket { fd })
    }

    /// The id of generic-netlink family `name`.
    fn family_id(&self, name: &str) -> io::Result<u16> {
        let mut attrs = Vec::new();
        let mut cname = name.as_bytes().to_vec();
        cname.push(0);
        put_attr(&mut attrs, CTRL_ATTR_FAMILY_NAME, &cname);
        let reply = self.request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, &attrs)?;
        let id = attributes(&reply)
            .find(|(kind, _)| *kind == CTRL_ATTR_FAMILY_ID)
            .and_then(|(_, v)| <[u8; 2]>::try_from(v).ok())
            .map(u16::from_ne_bytes);
        id.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no family id"))
    }

    /// Sends one request and returns the attribute bytes of its reply.
    fn request(&self, family: u16, cmd: u8, attrs: &[u8]) -> io::Result<Vec<u8>> {
        let len = 16 + 4 + attrs.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_ne_bytes());
        msg.extend_from_slice(&family.to_ne_bytes());
        msg.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
        msg.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel's
        msg.extend_from_slice(&[cmd, 1, 0, 0]); // genlmsghdr: cmd, version
        msg.extend_from_slice(attrs);
        // SAFETY: send(2) reads `msg.len()` bytes of `msg`, which lives across the call.
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; 8192];
        // SAFETY: recv(2) writes at most `buf.len()` bytes into `buf`, which lives across
        // the call.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        parse_reply(&buf)
    }
}

/// The attributes of a generic-netlink reply, or the error it carries.
fn parse_reply(buf: &[u8]) -> io::Result<Vec<u8>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed netlink reply");
    let header = buf.get(..16).ok_or_else(bad)?;
    let len = u32::from_ne_bytes(header[0..4].try_into().map_err(|_| bad())?) as usize;
    let kind = u16::from_ne_bytes(header[4..6].try_into().map_err(|_| bad())?);
    let body = buf.get(16..len.min(buf.len())).ok_or_else(bad)?;
    if kind == NLMSG_ERROR {
        let code = i32::from_ne_bytes(
            body.get(..4)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        );
        return Err(io::Error::from_raw_os_error(-code));
    }
    Ok(body.get(4..).ok_or_else(bad)?.to_vec())
}

fn put_attr(buf: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(buf.len() + (4 - len % 4) % 4, 0);
}

/// `(type, value)` of each attribute in `buf`; stops at the first malformed one.
fn attributes(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_ne_bytes(rest.get(0..2)?.try_into().ok()?));
        let kind = u16::from_ne_bytes(rest.get(2..4)?.try_into().ok()?) & NLA_TYPE_MASK;
        let value = rest.get(4..len)?;
        rest = rest.get(len.div_ceil(4) * 4..).unwrap_or(&[]);
        Some((kind, value))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_and_stop_at_garbage() {
        let mut buf = Vec::new();
        put_attr(&mut buf, 7, b"abc");
        put_attr(&mut buf, 3, &5u64.to_ne_bytes());
        assert_eq!(buf.len(), 8 + 12);
        let got: Vec<(u16, Vec<u8>)> = attributes(&buf).map(|(k, v)| (k, v.to_vec())).collect();
        assert_eq!(
            got,
            vec![(7, b"abc".to_vec()), (3, 5u64.to_ne_bytes().to_vec())]
        );
        assert_eq!(attributes(&[0xff, 0xff, 1, 0]).count(), 0);
        assert_eq!(attributes(&[]).count(), 0);
        assert!(parse_reply(&[1, 2, 3]).is_err());
    }

    #[test]
    fn loopback_has_no_zero_copy() {
        // Every namespace has `lo`; kernels before 6.3 lack the family.
        match xdp_features("lo") {
            Ok(f) => assert!(!f.zero_copy(), "{f:?}"),
            Err(e) => eprintln!("no netdev family here: {e}"),
        }
        assert!(xdp_features("nc-no-such0").is_err());
    }
}
