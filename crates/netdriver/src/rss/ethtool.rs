//! Reading an interface's RSS and installing ntuple rules through the `SIOCETHTOOL`
//! ioctl (Linux only).
//!
//! - [`EthtoolSocket::read_rss`]: `ETHTOOL_GRSSH` (key, indirection table, hash function,
//!   input transform) and `ETHTOOL_GRXFH` for `TCP_V4_FLOW` (the hashed fields).
//! - [`EthtoolSocket::install_ntuple`]: `ETHTOOL_SRXCLSRLINS`, a rule that sends one
//!   TCP/IPv4 4-tuple to one queue, removed by [`NtupleRule::remove`] or when the rule is
//!   dropped (`ETHTOOL_SRXCLSRLDEL`). ConnectX-5 needs `ethtool -K IFACE ntuple on` first.
//! - [`EthtoolSocket::driver_of`]: `ETHTOOL_GDRVINFO`, the driver's name, for messages.
//!
//! An [`EthtoolSocket`] names interfaces of the network namespace of the thread that
//! opened it, whichever thread uses it later; the free functions [`read_rss`],
//! [`install_ntuple`] and [`driver_of`] open one in the calling thread's namespace.
//! Drivers without RSS answer `EOPNOTSUPP`, reported as [`RssError::Unsupported`]; veth is
//! one of them (a frame sent on a veth's tx queue `q` arrives on its peer's rx queue `q`:
//! the sender, not a hash, picks the queue).

use std::ffi::c_void;
use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tracing::{debug, warn};

use super::toeplitz::{FlowTuple, HashFields, HashFunction, InputTransform, RssConfig};

const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GRXFH: u32 = 0x29;
const ETHTOOL_SRXCLSRLDEL: u32 = 0x31;
const ETHTOOL_SRXCLSRLINS: u32 = 0x32;
const ETHTOOL_GRSSH: u32 = 0x46;
const TCP_V4_FLOW: u32 = 0x01;
/// Let the driver choose the rule's location (`RX_CLS_LOC_ANY`).
const RX_CLS_LOC_ANY: u32 = 0xffff_ffff;
/// The largest indirection table and key accepted from a driver (sanity bounds: real
/// tables have 64 to 2048 entries, keys 40 or 52 bytes).
const MAX_INDIR: u32 = 1 << 16;
const MAX_KEY: u32 = 1 << 10;

/// Why an interface's RSS could not be read, or a rule not installed.
#[derive(Debug, thiserror::Error)]
pub enum RssError {
    /// No such interface in the calling thread's network namespace.
    #[error("no network interface named {ifname:?} in this network namespace")]
    NoSuchInterface {
        /// The name asked for.
        ifname: String,
    },
    /// The driver does not implement the operation.
    #[error("{ifname:?} (driver {driver}) does not support {op}{}", unsupported_note(.driver, .op))]
    Unsupported {
        /// The interface.
        ifname: String,
        /// The driver's name (`ETHTOOL_GDRVINFO`), or `"unknown"`.
        driver: String,
        /// What was asked.
        op: &'static str,
    },
    /// The operation needs `CAP_NET_ADMIN`.
    #[error("{op} on {ifname:?}: operation not permitted (needs CAP_NET_ADMIN; run as root)")]
    NotPermitted {
        /// The interface.
        ifname: String,
        /// What was asked.
        op: &'static str,
    },
    /// The driver refused the request (`EINVAL`, `ENOSPC`: a full rule table, a field it
    /// cannot match, a queue it does not have).
    #[error("{op} on {ifname:?} refused: {source}")]
    Refused {
        /// The interface.
        ifname: String,
        /// What was asked.
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// The driver answered sizes outside any real NIC's.
    #[error("{op} on {ifname:?}: implausible answer ({detail})")]
    InvalidAnswer {
        /// The interface.
        ifname: String,
        /// What was asked.
        op: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// Another system call failed.
    #[error("{op} on {ifname:?}: {source}")]
    Io {
        /// The interface.
        ifname: String,
        /// What was asked.
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
}

/// The explanation appended to [`RssError::Unsupported`].
fn unsupported_note(driver: &str, op: &str) -> &'static str {
    match (driver, op.contains("ntuple")) {
        ("veth", false) => {
            "; veth has no RSS: a frame sent on the peer's tx queue q arrives on rx queue q"
        }
        ("veth", true) => "; veth has no flow steering",
        (_, true) => "; if the NIC has flow steering, enable it with `ethtool -K IFACE ntuple on`",
        _ => "",
    }
}

const OP_RSS: &str = "reading the RSS key and indirection table (ETHTOOL_GRSSH)";
const OP_FIELDS: &str = "reading the TCP/IPv4 RSS hash fields (ETHTOOL_GRXFH)";
const OP_NTUPLE: &str = "installing an ntuple rule (ETHTOOL_SRXCLSRLINS)";
const OP_NTUPLE_DEL: &str = "removing an ntuple rule (ETHTOOL_SRXCLSRLDEL)";
const OP_DRVINFO: &str = "reading the driver name (ETHTOOL_GDRVINFO)";

/// `struct ethtool_rxfh` without its flexible array.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct EthtoolRxfh {
    cmd: u32,
    rss_context: u32,
    indir_size: u32,
    key_size: u32,
    hfunc: u8,
    /// `input_xfrm` since Linux 6.8 (reserved, and zero, before).
    input_xfrm: u8,
    rsvd8: [u8; 2],
    rsvd32: u32,
}
const _: () = assert!(size_of::<EthtoolRxfh>() == 24);

/// `struct ethtool_rx_flow_spec`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RxFlowSpec {
    flow_type: u32,
    h_u: [u8; 52],
    h_ext: [u8; 20],
    m_u: [u8; 52],
    m_ext: [u8; 20],
    ring_cookie: u64,
    location: u32,
}

/// `struct ethtool_rxnfc` without its flexible array.
#[repr(C)]
#[derive(Clone, Copy)]
struct EthtoolRxnfc {
    cmd: u32,
    flow_type: u32,
    data: u64,
    fs: RxFlowSpec,
    rule_cnt: u32,
}
// The layout of <linux/ethtool.h> on every Linux ABI (checked against gcc's).
const _: () = assert!(size_of::<RxFlowSpec>() == 168);
const _: () = assert!(offset_of!(RxFlowSpec, m_u) == 76);
const _: () = assert!(offset_of!(RxFlowSpec, ring_cookie) == 152);
const _: () = assert!(offset_of!(RxFlowSpec, location) == 160);
const _: () = assert!(size_of::<EthtoolRxnfc>() == 192);
const _: () = assert!(offset_of!(EthtoolRxnfc, fs) == 16);
const _: () = assert!(offset_of!(EthtoolRxnfc, rule_cnt) == 184);

impl EthtoolRxnfc {
    fn zeroed(cmd: u32) -> EthtoolRxnfc {
        EthtoolRxnfc {
            cmd,
            flow_type: 0,
            data: 0,
            fs: RxFlowSpec {
                flow_type: 0,
                h_u: [0; 52],
                h_ext: [0; 20],
                m_u: [0; 52],
                m_ext: [0; 20],
                ring_cookie: 0,
                location: 0,
            },
            rule_cnt: 0,
        }
    }
}

/// `struct ethtool_drvinfo`: `cmd`, `driver[32]`, `version[32]`, `fw_version[32]`,
/// `bus_info[32]`, and more we do not read.
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    rest: [u8; 64],
}
const _: () = assert!(size_of::<EthtoolDrvinfo>() == 196);
const _: () = assert!(offset_of!(EthtoolDrvinfo, bus_info) == 100);

/// What `ETHTOOL_GDRVINFO` says of an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInfo {
    /// The driver's name (`"veth"`, `"mlx5_core"`).
    pub driver: String,
    /// The device's bus address (`"0000:3b:00.0"` for PCI; empty for virtual devices).
    pub bus_info: String,
}

/// The `struct ethtool_tcpip4_spec` of a received frame of `tuple` and its all-ones mask
/// (ToS not matched): the `h_u`/`m_u` bytes of a `TCP_V4_FLOW` rule.
fn tcpip4_spec(tuple: &FlowTuple) -> ([u8; 52], [u8; 52]) {
    let mut h = [0u8; 52];
    let mut m = [0u8; 52];
    h[0..4].copy_from_slice(&tuple.src.ip().octets());
    h[4..8].copy_from_slice(&tuple.dst.ip().octets());
    h[8..10].copy_from_slice(&tuple.src.port().to_be_bytes());
    h[10..12].copy_from_slice(&tuple.dst.port().to_be_bytes());
    m[0..12].fill(0xff);
    (h, m)
}

/// A socket for `SIOCETHTOOL` requests, bound to the network namespace of the thread
/// that opened it: requests through it name interfaces of that namespace whichever thread
/// makes them (the kernel resolves the name in the socket's namespace).
#[derive(Debug)]
pub struct EthtoolSocket {
    fd: OwnedFd,
}

impl EthtoolSocket {
    /// Opens one in the calling thread's network namespace.
    pub fn open() -> io::Result<EthtoolSocket> {
        // SAFETY: a plain socket(2) call; the descriptor is owned right below.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        Ok(EthtoolSocket {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
    }

    /// `SIOCETHTOOL` on `ifname` with the command block at `data`.
    ///
    /// # Safety
    ///
    /// `data` must point to a command block of the size and layout the command in its
    /// first four bytes expects, including any trailing array its size fields announce,
    /// valid for reads and writes for the duration of the call.
    unsafe fn request(
        &self,
        ifname: &str,
        op: &'static str,
        data: *mut c_void,
    ) -> Result<(), RssError> {
        let no_such = || RssError::NoSuchInterface {
            ifname: ifname.to_owned(),
        };
        // SAFETY: `ifreq` is plain old data; all zeroes is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        let name = ifname.as_bytes();
        if name.is_empty() || name.len() >= req.ifr_name.len() || name.contains(&0) {
            return Err(no_such());
        }
        for (dst, &src) in req.ifr_name.iter_mut().zip(name) {
            *dst = src as libc::c_char;
        }
        req.ifr_ifru.ifru_data = data.cast();
        // SAFETY: SIOCETHTOOL reads `ifr_name` and the command block `ifru_data` points
        // to, which the caller guarantees is valid and sized for its command; `req` lives
        // across the call.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        Err(match err.raw_os_error() {
            Some(libc::ENODEV) => no_such(),
            Some(libc::EOPNOTSUPP) => RssError::Unsupported {
                ifname: ifname.to_owned(),
                // Asked only once: a driver without GDRVINFO answers EOPNOTSUPP there too.
                driver: if op == OP_DRVINFO {
                    "unknown".to_owned()
                } else {
                    self.driver_of(ifname)
                        .unwrap_or_else(|_| "unknown".to_owned())
                },
                op,
            },
            Some(libc::EPERM) | Some(libc::EACCES) => RssError::NotPermitted {
                ifname: ifname.to_owned(),
                op,
            },
            Some(libc::EINVAL) | Some(libc::ENOSPC) | Some(libc::ERANGE) | Some(libc::EEXIST) => {
                RssError::Refused {
                    ifname: ifname.to_owned(),
                    op,
                    source: err,
                }
            }
            _ => RssError::Io {
                ifname: ifname.to_owned(),
                op,
                source: err,
            },
        })
    }

    /// The name of `ifname`'s driver (`"veth"`, `"mlx5_core"`, ...).
    pub fn driver_of(&self, ifname: &str) -> Result<String, RssError> {
        Ok(self.driver_info(ifname)?.driver)
    }

    /// `ifname`'s driver name and bus address (`ETHTOOL_GDRVINFO`).
    pub fn driver_info(&self, ifname: &str) -> Result<DriverInfo, RssError> {
        let mut info = EthtoolDrvinfo {
            cmd: ETHTOOL_GDRVINFO,
            driver: [0; 32],
            version: [0; 32],
            fw_version: [0; 32],
            bus_info: [0; 32],
            rest: [0; 64],
        };
        // SAFETY: a `struct ethtool_drvinfo`-sized block for ETHTOOL_GDRVINFO.
        unsafe {
            self.request(
                ifname,
                OP_DRVINFO,
                (&mut info as *mut EthtoolDrvinfo).cast(),
            )?
        };
        let text = |b: &[u8; 32]| {
            let end = b.iter().position(|&c| c == 0).unwrap_or(32);
            String::from_utf8_lossy(&b[..end]).into_owned()
        };
        Ok(DriverInfo {
            driver: text(&info.driver),
            bus_info: text(&info.bus_info),
        })
    }

    /// The hashed fields of TCP/IPv4 frames (`ETHTOOL_GRXFH`, `TCP_V4_FLOW`).
    pub fn read_hash_fields(&self, ifname: &str) -> Result<HashFields, RssError> {
        let mut nfc = EthtoolRxnfc::zeroed(ETHTOOL_GRXFH);
        nfc.flow_type = TCP_V4_FLOW;
        // SAFETY: a `struct ethtool_rxnfc`-sized block; GRXFH uses no trailing array.
        unsafe { self.request(ifname, OP_FIELDS, (&mut nfc as *mut EthtoolRxnfc).cast())? };
        Ok(HashFields(nfc.data))
    }

    /// Reads `ifname`'s RSS: key, indirection table, hash function, input transform and
    /// the fields hashed for TCP/IPv4. The result may still be one whose queues cannot be
    /// predicted ([`RssConfig::check`]).
    pub fn read_rss(&self, ifname: &str) -> Result<RssConfig, RssError> {
        // First the sizes, then the table and key.
        let mut head = EthtoolRxfh {
            cmd: ETHTOOL_GRSSH,
            ..Default::default()
        };
        // SAFETY: sizes of zero: the kernel writes only the 24-byte head.
        unsafe { self.request(ifname, OP_RSS, (&mut head as *mut EthtoolRxfh).cast())? };
        let (indir_size, key_size) = (head.indir_size, head.key_size);
        if indir_size > MAX_INDIR || key_size > MAX_KEY {
            return Err(RssError::InvalidAnswer {
                ifname: ifname.to_owned(),
                op: OP_RSS,
                detail: format!(
                    "indirection table of {indir_size} entries, key of {key_size} bytes"
                ),
            });
        }
        // Head, table (u32 each), key bytes; in u32 words so the block is aligned.
        let bytes = size_of::<EthtoolRxfh>() + indir_size as usize * 4 + key_size as usize;
        let mut block = vec![0u32; bytes.div_ceil(4)];
        let ask = EthtoolRxfh {
            cmd: ETHTOOL_GRSSH,
            indir_size,
            key_size,
            ..Default::default()
        };
        // SAFETY: `block` holds at least 24 bytes and is u32-aligned, as the head is.
        unsafe { std::ptr::write(block.as_mut_ptr().cast::<EthtoolRxfh>(), ask) };
        // SAFETY: `block` holds the head plus `indir_size` u32 entries plus `key_size`
        // bytes, exactly what ETHTOOL_GRSSH writes for the sizes in the head (it fails
        // with EINVAL rather than write more when the sizes changed meanwhile).
        unsafe { self.request(ifname, OP_RSS, block.as_mut_ptr().cast())? };
        // SAFETY: the head is the first 24 bytes of the u32-aligned block.
        let got = unsafe { std::ptr::read(block.as_ptr().cast::<EthtoolRxfh>()) };
        let words = size_of::<EthtoolRxfh>() / 4;
        let indirection = block[words..words + indir_size as usize].to_vec();
        let key: Vec<u8> = block[words + indir_size as usize..]
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .take(key_size as usize)
            .collect();
        let fields = self.read_hash_fields(ifname)?;
        let config = RssConfig {
            hash: HashFunction::from_hfunc(got.hfunc),
            input: InputTransform::from_bits(got.input_xfrm),
            fields,
            key,
            indirection,
        };
        debug!(
            ifname,
            hash = ?config.hash,
            input = ?config.input,
            fields = format_args!("{:#x}", config.fields.0),
            key_len = config.key.len(),
            table_len = config.indirection.len(),
            queues = ?config.queues(),
            "read the interface's RSS"
        );
        Ok(config)
    }

    /// Installs a rule that delivers received TCP/IPv4 frames of exactly `tuple` (source =
    /// the sender) to rx `queue` of `ifname`, at a location the driver chooses. The rule
    /// keeps its own copy of this socket, so it can be removed from any thread.
    pub fn install_ntuple(
        &self,
        ifname: &str,
        tuple: FlowTuple,
        queue: u32,
    ) -> Result<NtupleRule, RssError> {
        let mut nfc = EthtoolRxnfc::zeroed(ETHTOOL_SRXCLSRLINS);
        let (h, m) = tcpip4_spec(&tuple);
        nfc.fs.flow_type = TCP_V4_FLOW;
        nfc.fs.h_u = h;
        nfc.fs.m_u = m;
        nfc.fs.ring_cookie = u64::from(queue);
        nfc.fs.location = RX_CLS_LOC_ANY;
        let sock = self.try_clone().map_err(|source| RssError::Io {
            ifname: ifname.to_owned(),
            op: OP_NTUPLE,
            source,
        })?;
        // SAFETY: a `struct ethtool_rxnfc`-sized block; SRXCLSRLINS uses no trailing array.
        unsafe { self.request(ifname, OP_NTUPLE, (&mut nfc as *mut EthtoolRxnfc).cast())? };
        debug!(
            ifname,
            location = nfc.fs.location,
            queue,
            ?tuple,
            "ntuple rule installed"
        );
        Ok(NtupleRule {
            sock,
            ifname: ifname.to_owned(),
            location: nfc.fs.location,
            tuple,
            queue,
            installed: true,
        })
    }

    fn try_clone(&self) -> io::Result<EthtoolSocket> {
        Ok(EthtoolSocket {
            fd: self.fd.try_clone()?,
        })
    }
}

/// A fresh [`EthtoolSocket`] in the calling thread's namespace, errors typed for `ifname`.
fn socket_for(ifname: &str, op: &'static str) -> Result<EthtoolSocket, RssError> {
    EthtoolSocket::open().map_err(|source| RssError::Io {
        ifname: ifname.to_owned(),
        op,
        source,
    })
}

/// The name of `ifname`'s driver, in the calling thread's network namespace.
pub fn driver_of(ifname: &str) -> Result<String, RssError> {
    socket_for(ifname, OP_DRVINFO)?.driver_of(ifname)
}

/// `ifname`'s driver name and bus address, in the calling thread's network namespace.
pub fn driver_info(ifname: &str) -> Result<DriverInfo, RssError> {
    socket_for(ifname, OP_DRVINFO)?.driver_info(ifname)
}

/// `ifname`'s RSS, in the calling thread's network namespace
/// ([`EthtoolSocket::read_rss`]).
pub fn read_rss(ifname: &str) -> Result<RssConfig, RssError> {
    socket_for(ifname, OP_RSS)?.read_rss(ifname)
}

/// An ntuple rule on `ifname` in the calling thread's network namespace
/// ([`EthtoolSocket::install_ntuple`]).
pub fn install_ntuple(ifname: &str, tuple: FlowTuple, queue: u32) -> Result<NtupleRule, RssError> {
    socket_for(ifname, OP_NTUPLE)?.install_ntuple(ifname, tuple, queue)
}

/// An ntuple (flow steering) rule installed by [`EthtoolSocket::install_ntuple`]; removed
/// when dropped, from whichever thread.
#[derive(Debug)]
pub struct NtupleRule {
    sock: EthtoolSocket,
    ifname: String,
    location: u32,
    tuple: FlowTuple,
    queue: u32,
    installed: bool,
}

impl NtupleRule {
    /// The rule's location in the NIC's table (`ethtool -n IFACE` lists it).
    pub fn location(&self) -> u32 {
        self.location
    }

    /// The received frames it matches.
    pub fn tuple(&self) -> FlowTuple {
        self.tuple
    }

    /// The queue it delivers them to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Removes the rule now, reporting failure (dropping does the same and logs it).
    pub fn remove(mut self) -> Result<(), RssError> {
        self.remove_now()
    }

    fn remove_now(&mut self) -> Result<(), RssError> {
        if !std::mem::take(&mut self.installed) {
            return Ok(());
        }
        let mut nfc = EthtoolRxnfc::zeroed(ETHTOOL_SRXCLSRLDEL);
        nfc.fs.location = self.location;
        // SAFETY: a `struct ethtool_rxnfc`-sized block; SRXCLSRLDEL uses no trailing array.
        unsafe {
            self.sock.request(
                &self.ifname,
                OP_NTUPLE_DEL,
                (&mut nfc as *mut EthtoolRxnfc).cast(),
            )
        }?;
        debug!(ifname = %self.ifname, location = self.location, "ntuple rule removed");
        Ok(())
    }
}

impl Drop for NtupleRule {
    fn drop(&mut self) {
        if let Err(e) = self.remove_now() {
            warn!(error = %e, "removing an ntuple rule");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ntuple_spec_bytes_are_network_order() {
        let tuple = FlowTuple::new(
            "10.77.0.2:9000".parse().unwrap(),
            "10.77.0.1:61001".parse().unwrap(),
        );
        let (h, m) = tcpip4_spec(&tuple);
        assert_eq!(
            &h[..12],
            &[10, 77, 0, 2, 10, 77, 0, 1, 0x23, 0x28, 0xee, 0x49]
        );
        assert!(h[12..].iter().all(|&b| b == 0));
        assert_eq!(&m[..12], &[0xff; 12]);
        assert!(m[12..].iter().all(|&b| b == 0), "ToS is not matched");
    }

    #[test]
    fn missing_interface_is_typed() {
        for r in [
            read_rss("nc-no-such0").map(drop),
            driver_of("nc-no-such0").map(drop),
            install_ntuple(
                "nc-no-such0",
                FlowTuple::new("1.1.1.1:1".parse().unwrap(), "2.2.2.2:2".parse().unwrap()),
                0,
            )
            .map(drop),
            read_rss("").map(drop),
            read_rss("a-name-longer-than-ifnamsiz").map(drop),
        ] {
            assert!(matches!(r, Err(RssError::NoSuchInterface { .. })), "{r:?}");
        }
    }

    #[test]
    fn loopback_has_no_rss() {
        // `lo` exists in every namespace and implements no RSS.
        match read_rss("lo") {
            Err(RssError::Unsupported { driver, op, .. }) => {
                assert_eq!(op, OP_RSS);
                assert!(!driver.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn veth_message_says_why() {
        let e = RssError::Unsupported {
            ifname: "vB".into(),
            driver: "veth".into(),
            op: OP_RSS,
        };
        let msg = e.to_string();
        assert!(msg.contains("veth has no RSS"), "{msg}");
        assert!(msg.contains("rx queue q"), "{msg}");
        let e = RssError::Unsupported {
            ifname: "eth0".into(),
            driver: "mlx5_core".into(),
            op: OP_NTUPLE,
        };
        assert!(e.to_string().contains("ntuple on"), "{e}");
    }
}
