//! Ephemeral ports of the user-space stack, kept apart from the kernel's.
//!
//! The stack and the kernel share each IPv4 address: the XDP program steers the stack's
//! flows to it by port and passes everything else to the kernel. A local port the stack
//! picks for an outgoing connection must therefore never be one the kernel could pick for
//! one of its own sockets, or the two flows' packets would be confused.
//!
//! # Policy
//!
//! The kernel picks automatic local ports from `net.ipv4.ip_local_port_range` (default
//! `32768 60999`), read by [`kernel_port_range`]. The stack takes its ephemeral ports from
//! a range **outside** it, chosen by [`EphemeralRange::outside_kernel`]:
//!
//! 1. Ports below 1024 (well-known, privileged) are never used.
//! 2. The candidates are the ports above the kernel's range (up to 65535) and those
//!    between 1024 and the start of the kernel's range.
//! 3. The part above is taken when it holds at least [`PREFERRED_MIN_PORTS`] ports: those
//!    are (or are near) the IANA dynamic range 49152–65535, which no service is assigned,
//!    whereas ports below the kernel's range include registered service ports (3306, 5432,
//!    8080, ...) that kernel servers commonly listen on. With the default kernel range
//!    this gives `61000..=65535` (4536 ports).
//! 4. Otherwise the larger of the two parts is taken; if both are empty (the kernel uses
//!    every port from 1024 up), [`PortsError::NoFreeRange`].
//!
//! This keeps the stack clear of the kernel's *automatic* choices. It cannot stop a kernel
//! program from `bind`ing explicitly to a port of the stack's range: deployments must keep
//! their kernel servers off it.
//!
//! [`EphemeralRange::reserve_in_kernel`] goes one step further, as an explicit opt-in that
//! is never done implicitly: it adds the stack's range to
//! `net.ipv4.ip_local_reserved_ports`, so the kernel keeps away from it even if the
//! administrator later widens `ip_local_port_range`. It writes a sysctl, so it needs
//! `CAP_NET_ADMIN`, and it refuses to run in the host's network namespace: it is meant for
//! namespaces the caller created and owns.
//!
//! # Network namespaces
//!
//! Both sysctls are per network namespace. Files under `/proc/sys/net/` show the values of
//! the network namespace of the **thread** that opens them (the kernel resolves them with
//! the opening task's namespace, not the process's), so [`kernel_port_range`] called on a
//! thread that entered a namespace with `setns(2)` reads that namespace's range. The
//! test `ports_sysctl_follows_thread_namespace` in `tests/neigh.rs` checks it.

use std::io;
use std::ops::RangeInclusive;
use std::os::unix::fs::MetadataExt;

/// The kernel's automatic local port range sysctl, per network namespace.
pub const PORT_RANGE_SYSCTL: &str = "/proc/sys/net/ipv4/ip_local_port_range";
/// The kernel's reserved local ports sysctl, per network namespace.
pub const RESERVED_PORTS_SYSCTL: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";
/// The first port the stack may use: those below are well-known ports.
pub const FIRST_UNPRIVILEGED_PORT: u16 = 1024;
/// The part of the free ports above the kernel's range is preferred when it holds at least
/// this many ports.
pub const PREFERRED_MIN_PORTS: usize = 1024;

/// Why the port ranges could not be read, chosen or reserved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PortsError {
    /// A sysctl file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// A sysctl file did not hold what the kernel writes there.
    #[error("cannot parse {what} from {text:?}")]
    Parse {
        /// What was expected.
        what: &'static str,
        /// The text.
        text: String,
    },
    /// The kernel's range leaves no port from 1024 up for the stack.
    #[error(
        "the kernel's local port range {lo}-{hi} leaves no free port from 1024 up for the stack"
    )]
    NoFreeRange {
        /// First port of the kernel's range.
        lo: u16,
        /// Last port of the kernel's range.
        hi: u16,
    },
    /// [`EphemeralRange::reserve_in_kernel`] was called in the host's network namespace.
    #[error("refusing to reserve ports in the host's network namespace: do it only in a namespace you own")]
    HostNamespace,
}

/// Parses the contents of `ip_local_port_range`: two port numbers separated by white
/// space (the kernel writes `"32768\t60999\n"`).
pub fn parse_port_range(text: &str) -> Result<RangeInclusive<u16>, PortsError> {
    let bad = || PortsError::Parse {
        what: "a local port range",
        text: text.to_string(),
    };
    let mut it = text.split_whitespace();
    let lo: u16 = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let hi: u16 = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    if it.next().is_some() || lo > hi {
        return Err(bad());
    }
    Ok(lo..=hi)
}

/// Reads the kernel's automatic local port range of the calling thread's network
/// namespace.
pub fn kernel_port_range() -> Result<RangeInclusive<u16>, PortsError> {
    let text = read_sysctl(PORT_RANGE_SYSCTL)?;
    parse_port_range(&text)
}

/// The stack's ephemeral port range, chosen outside the kernel's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EphemeralRange {
    /// The kernel's automatic local port range it was chosen against.
    pub kernel: RangeInclusive<u16>,
    /// The stack's range.
    pub ours: RangeInclusive<u16>,
}

impl EphemeralRange {
    /// The stack's range for a kernel range `kernel`, by the [module's policy](self).
    pub fn outside_kernel(kernel: RangeInclusive<u16>) -> Result<RangeInclusive<u16>, PortsError> {
        let (lo, hi) = (*kernel.start(), *kernel.end());
        let above = (hi < u16::MAX).then(|| hi.max(FIRST_UNPRIVILEGED_PORT - 1) + 1..=u16::MAX);
        let below = (lo > FIRST_UNPRIVILEGED_PORT).then(|| FIRST_UNPRIVILEGED_PORT..=lo - 1);
        let len = |r: &Option<RangeInclusive<u16>>| {
            r.as_ref()
                .map_or(0, |r| usize::from(*r.end() - *r.start()) + 1)
        };
        let chosen = if len(&above) >= PREFERRED_MIN_PORTS || len(&above) >= len(&below) {
            above
        } else {
            below
        };
        chosen.ok_or(PortsError::NoFreeRange { lo, hi })
    }

    /// Reads the calling thread's namespace's kernel range and chooses the stack's.
    pub fn from_kernel() -> Result<EphemeralRange, PortsError> {
        let kernel = kernel_port_range()?;
        let ours = EphemeralRange::outside_kernel(kernel.clone())?;
        Ok(EphemeralRange { kernel, ours })
    }

    /// Number of ports in the stack's range.
    pub fn len(&self) -> usize {
        usize::from(*self.ours.end() - *self.ours.start()) + 1
    }

    /// Always false: a range holds at least one port.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Adds the stack's range to `ip_local_reserved_ports` of the calling thread's network
    /// namespace, keeping the ports already reserved there. Opt-in only: it needs
    /// `CAP_NET_ADMIN` and returns [`PortsError::HostNamespace`] without writing anything
    /// when the thread is in the host's network namespace (see [`ensure_not_host_namespace`]).
    pub fn reserve_in_kernel(&self) -> Result<(), PortsError> {
        ensure_not_host_namespace()?;
        let current = read_sysctl(RESERVED_PORTS_SYSCTL)?;
        let current = current.trim();
        let ours = format!("{}-{}", self.ours.start(), self.ours.end());
        let list = if current.is_empty() {
            ours
        } else {
            format!("{current},{ours}")
        };
        std::fs::write(RESERVED_PORTS_SYSCTL, format!("{list}\n")).map_err(|source| {
            PortsError::Io {
                path: RESERVED_PORTS_SYSCTL.to_string(),
                source,
            }
        })?;
        tracing::info!(reserved = %list, "reserved the stack's ports in the kernel");
        Ok(())
    }
}

/// Parses `ip_local_reserved_ports` (`"8080,9000-9010\n"`, or `"\n"` when empty) into
/// ranges.
pub fn parse_reserved_ports(text: &str) -> Result<Vec<RangeInclusive<u16>>, PortsError> {
    let bad = || PortsError::Parse {
        what: "a reserved port list",
        text: text.to_string(),
    };
    text.trim()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (lo, hi) = item.split_once('-').unwrap_or((item, item));
            let lo: u16 = lo.trim().parse().map_err(|_| bad())?;
            let hi: u16 = hi.trim().parse().map_err(|_| bad())?;
            if lo > hi {
                return Err(bad());
            }
            Ok(lo..=hi)
        })
        .collect()
}

/// Reads `ip_local_reserved_ports` of the calling thread's network namespace.
pub fn kernel_reserved_ports() -> Result<Vec<RangeInclusive<u16>>, PortsError> {
    parse_reserved_ports(&read_sysctl(RESERVED_PORTS_SYSCTL)?)
}

/// `Ok` when the calling thread is in another network namespace than the host's,
/// [`PortsError::HostNamespace`] when it is in the host's.
///
/// The host's namespace is pid 1's. Where `/proc/1/ns/net` cannot be read (sandboxes
/// hide it even from root), the namespace this process started in (its main thread's,
/// `/proc/self/ns/net`) is taken for the host's instead, which is conservative: it then
/// only allows namespaces a thread of this process entered with `setns(2)`.
pub fn ensure_not_host_namespace() -> Result<(), PortsError> {
    let id = |path: &str| {
        std::fs::metadata(path)
            .map(|m| (m.dev(), m.ino()))
            .map_err(|source| PortsError::Io {
                path: path.to_string(),
                source,
            })
    };
    let ours = id("/proc/thread-self/ns/net")?;
    let host = match id("/proc/1/ns/net") {
        Ok(host) => host,
        Err(e) => {
            tracing::debug!("{e}; taking this process's initial namespace for the host's");
            id("/proc/self/ns/net")?
        }
    };
    if ours == host {
        Err(PortsError::HostNamespace)
    } else {
        Ok(())
    }
}

fn read_sysctl(path: &str) -> Result<String, PortsError> {
    std::fs::read_to_string(path).map_err(|source| PortsError::Io {
        path: path.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_format() {
        assert_eq!(parse_port_range("32768\t60999\n").unwrap(), 32768..=60999);
        assert_eq!(parse_port_range(" 1024 65535").unwrap(), 1024..=65535);
        assert_eq!(parse_port_range("5000\t5000\n").unwrap(), 5000..=5000);
        for bad in [
            "",
            "32768",
            "32768 60999 1",
            "60999 32768",
            "a b",
            "1 70000",
            "-1 5",
        ] {
            assert!(
                matches!(parse_port_range(bad), Err(PortsError::Parse { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn parses_reserved_lists() {
        assert_eq!(parse_reserved_ports("\n").unwrap(), vec![]);
        assert_eq!(
            parse_reserved_ports("8080,9000-9010\n").unwrap(),
            vec![8080..=8080, 9000..=9010]
        );
        assert!(parse_reserved_ports("9010-9000").is_err());
        assert!(parse_reserved_ports("x").is_err());
    }

    #[test]
    fn default_kernel_range_gives_the_top() {
        assert_eq!(
            EphemeralRange::outside_kernel(32768..=60999).unwrap(),
            61000..=65535
        );
    }

    #[test]
    fn small_top_part_gives_the_larger_bottom() {
        // 64001..=65535 holds 1535 ports: still preferred.
        assert_eq!(
            EphemeralRange::outside_kernel(10000..=64000).unwrap(),
            64001..=65535
        );
        // 65001..=65535 holds 535 ports, 1024..=9999 holds 8976.
        assert_eq!(
            EphemeralRange::outside_kernel(10000..=65000).unwrap(),
            1024..=9999
        );
        // Kernel reaching 65535: only the bottom is left.
        assert_eq!(
            EphemeralRange::outside_kernel(32768..=65535).unwrap(),
            1024..=32767
        );
        // Both small: the larger one (top 35 vs bottom 76).
        assert_eq!(
            EphemeralRange::outside_kernel(1100..=65500).unwrap(),
            1024..=1099
        );
        assert_eq!(
            EphemeralRange::outside_kernel(1050..=65400).unwrap(),
            65401..=65535
        );
    }

    #[test]
    fn low_kernel_ranges() {
        // The kernel's range starts below 1024: no bottom part, and the top starts after it.
        assert_eq!(
            EphemeralRange::outside_kernel(500..=2000).unwrap(),
            2001..=65535
        );
        assert_eq!(
            EphemeralRange::outside_kernel(1..=100).unwrap(),
            1024..=65535
        );
        assert_eq!(
            EphemeralRange::outside_kernel(1024..=1024).unwrap(),
            1025..=65535
        );
    }

    #[test]
    fn no_free_range() {
        for kernel in [1024..=65535, 1..=65535, 1000..=65535] {
            assert!(matches!(
                EphemeralRange::outside_kernel(kernel.clone()),
                Err(PortsError::NoFreeRange { .. })
            ));
        }
    }

    #[test]
    fn chosen_range_never_overlaps_the_kernel_or_well_known_ports() {
        for lo in (1..=65535u16).step_by(997) {
            for hi in (lo..=65535u16).step_by(1231) {
                if let Ok(ours) = EphemeralRange::outside_kernel(lo..=hi) {
                    assert!(
                        *ours.start() >= FIRST_UNPRIVILEGED_PORT,
                        "{lo}-{hi}: {ours:?}"
                    );
                    assert!(
                        *ours.end() < lo || *ours.start() > hi,
                        "{lo}-{hi}: {ours:?}"
                    );
                } else {
                    assert!(lo <= FIRST_UNPRIVILEGED_PORT && hi == 65535, "{lo}-{hi}");
                }
            }
        }
    }

    #[test]
    fn len_counts_ports() {
        let r = EphemeralRange {
            kernel: 32768..=60999,
            ours: 61000..=65535,
        };
        assert_eq!(r.len(), 4536);
        assert!(!r.is_empty());
    }
}
