//! How an AF_XDP socket shares frames with its driver: the bind mode asked for
//! ([`BindMode`], parsed from `auto`, `copy` or `zerocopy`) and the one the socket got
//! ([`XdpBinding`], with the reason for a fallback to copy mode). See
//! [the AF_XDP link's documentation](super::xdp#zero-copy-and-copy-mode).

use std::io;

/// How the socket shares frames with the driver (see the
/// [AF_XDP link's documentation](super::xdp#zero-copy-and-copy-mode)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BindMode {
    /// Zero copy where the driver supports it, else copy mode; the fallback and its
    /// reason are logged and kept in [`XdpLink::binding`](super::xdp::XdpLink::binding).
    #[default]
    Auto,
    /// `XDP_COPY`: the kernel copies frames between the UMEM and its own buffers. Works on
    /// every driver (veth included).
    Copy,
    /// `XDP_ZEROCOPY`: the NIC DMAs straight into the UMEM. Needs driver support
    /// (e.g. mlx5); opening fails where there is none (veth).
    ZeroCopy,
}

/// The environment variable a default stack reads its [`BindMode`] from
/// (`auto`, `copy` or `zerocopy`).
pub const BIND_MODE_ENV: &str = "NETCHANNEL_XDP_MODE";

/// A [`BindMode`] could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an AF_XDP bind mode: expected auto, copy or zerocopy")]
pub struct ParseBindModeError(pub String);

impl std::str::FromStr for BindMode {
    type Err = ParseBindModeError;

    /// `auto`, `copy`, or `zerocopy` (also `zero-copy`, `zc`), in any case.
    fn from_str(s: &str) -> Result<BindMode, ParseBindModeError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(BindMode::Auto),
            "copy" => Ok(BindMode::Copy),
            "zerocopy" | "zero-copy" | "zero_copy" | "zc" => Ok(BindMode::ZeroCopy),
            _ => Err(ParseBindModeError(s.to_owned())),
        }
    }
}

impl std::fmt::Display for BindMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BindMode::Auto => "auto",
            BindMode::Copy => "copy",
            BindMode::ZeroCopy => "zerocopy",
        })
    }
}

impl BindMode {
    /// The mode in [`BIND_MODE_ENV`], or `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<BindMode>, ParseBindModeError> {
        match std::env::var(BIND_MODE_ENV) {
            Ok(v) if !v.trim().is_empty() => v.parse().map(Some),
            _ => Ok(None),
        }
    }
}

/// How an open [`XdpLink`](super::xdp::XdpLink)'s socket is bound ([`XdpLink::binding`](super::xdp::XdpLink::binding)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XdpBinding {
    /// `XDP_ZEROCOPY`.
    ZeroCopy,
    /// `XDP_COPY`, as asked ([`BindMode::Copy`]).
    Copy,
    /// `XDP_COPY` because zero copy was not to be had ([`BindMode::Auto`]).
    CopyFallback {
        /// Why.
        reason: ZeroCopyRefusal,
    },
}

/// Why [`BindMode::Auto`] bound in copy mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZeroCopyRefusal {
    /// The driver does not advertise AF_XDP zero copy (`xsk-zerocopy` missing from its
    /// `xdp-features`, [`xdp_features`](super::xdp_features::xdp_features)); veth is one.
    NotAdvertised,
    /// The zero-copy bind failed with this error (`EOPNOTSUPP`, `EINVAL`).
    Bind {
        /// The kernel's error.
        errno: i32,
    },
}

impl XdpBinding {
    /// Whether frames go between the NIC and the UMEM without a copy.
    pub fn is_zero_copy(self) -> bool {
        self == XdpBinding::ZeroCopy
    }
}

impl std::fmt::Display for XdpBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            XdpBinding::ZeroCopy => f.write_str("zero copy"),
            XdpBinding::Copy => f.write_str("copy"),
            XdpBinding::CopyFallback { reason } => write!(f, "copy ({reason})"),
        }
    }
}

impl std::fmt::Display for ZeroCopyRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ZeroCopyRefusal::NotAdvertised => {
                f.write_str("the driver does not advertise AF_XDP zero copy")
            }
            ZeroCopyRefusal::Bind { errno } => write!(
                f,
                "zero-copy bind refused: {}",
                io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_modes_parse_and_print() {
        for (text, mode) in [
            ("auto", BindMode::Auto),
            ("copy", BindMode::Copy),
            ("zerocopy", BindMode::ZeroCopy),
            ("ZeroCopy", BindMode::ZeroCopy),
            ("zero-copy", BindMode::ZeroCopy),
            (" zc ", BindMode::ZeroCopy),
            ("COPY", BindMode::Copy),
        ] {
            assert_eq!(text.parse::<BindMode>(), Ok(mode), "{text}");
        }
        for mode in [BindMode::Auto, BindMode::Copy, BindMode::ZeroCopy] {
            assert_eq!(mode.to_string().parse::<BindMode>(), Ok(mode));
        }
        let err = "fast".parse::<BindMode>().unwrap_err();
        assert_eq!(err, ParseBindModeError("fast".into()));
        assert!(err.to_string().contains("auto, copy or zerocopy"), "{err}");
        assert_eq!(BindMode::default(), BindMode::Auto);
    }

    #[test]
    fn bindings_say_why() {
        assert_eq!(
            XdpBinding::CopyFallback {
                reason: ZeroCopyRefusal::Bind {
                    errno: libc::EOPNOTSUPP
                }
            }
            .to_string(),
            format!(
                "copy (zero-copy bind refused: {})",
                io::Error::from_raw_os_error(libc::EOPNOTSUPP)
            )
        );
        assert_eq!(
            XdpBinding::CopyFallback {
                reason: ZeroCopyRefusal::NotAdvertised
            }
            .to_string(),
            "copy (the driver does not advertise AF_XDP zero copy)"
        );
        assert!(XdpBinding::ZeroCopy.is_zero_copy());
        assert!(!XdpBinding::Copy.is_zero_copy());
    }
}
