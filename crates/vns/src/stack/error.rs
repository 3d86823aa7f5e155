//! Why a stack could not be built: [`StackError`], and how a channel set's error is
//! classified into one.

use std::io;

use thiserror::Error;

use crate::copy::CopyError;
use crate::endpoint::ConfigError;

/// Why a [`Stack`] could not be built.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StackError {
    /// AF_XDP or AF_PACKET sockets and BPF programs need privileges (CAP_NET_ADMIN,
    /// CAP_NET_RAW, CAP_BPF, ...).
    #[error("not permitted (AF_XDP and AF_PACKET need CAP_NET_ADMIN/CAP_NET_RAW/CAP_BPF): {0}")]
    NotPermitted(#[source] netdriver::channel::ChannelError),
    /// The interface does not exist (in the calling thread's network namespace).
    #[error("no such interface: {0}")]
    NoSuchInterface(String),
    /// A required builder setting is missing.
    #[error("missing setting: {0}")]
    Missing(&'static str),
    /// A builder setting has a value that cannot work (the message says which and why).
    #[error("invalid setting: {0}")]
    Invalid(&'static str),
    /// The virtual-socket configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Starting or using the channels failed otherwise.
    #[error("channels: {0}")]
    Channels(#[source] netdriver::channel::ChannelError),
    /// The copy workers could not be started.
    #[error("copy workers: {0}")]
    CopyWorkers(#[source] CopyError),
    /// An environment variable for the default stack is malformed.
    #[error("environment variable {name}: {msg}")]
    Env {
        /// The variable.
        name: &'static str,
        /// What is wrong.
        msg: String,
    },
}

impl From<StackError> for io::Error {
    fn from(e: StackError) -> io::Error {
        let kind = match &e {
            StackError::NotPermitted(_) => io::ErrorKind::PermissionDenied,
            StackError::NoSuchInterface(_) => io::ErrorKind::NotFound,
            StackError::Missing(_)
            | StackError::Invalid(_)
            | StackError::Config(_)
            | StackError::Env { .. } => io::ErrorKind::InvalidInput,
            StackError::Channels(c) => c.kind(),
            StackError::CopyWorkers(_) => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// Classifies a channel-set start failure by the errors in its source chain.
pub(crate) fn classify(e: netdriver::channel::ChannelError, ifname: &str) -> StackError {
    let mut text = e.to_string();
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    let mut perm = false;
    let mut nodev = false;
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            perm |= io.kind() == io::ErrorKind::PermissionDenied;
            nodev |= matches!(io.raw_os_error(), Some(19) | Some(6));
        }
        text.push_str(&s.to_string());
        src = s.source();
    }
    let t = text.to_ascii_lowercase();
    if perm || t.contains("operation not permitted") || t.contains("permission denied") {
        StackError::NotPermitted(e)
    } else if nodev || t.contains("no such device") || t.contains("no such interface") {
        StackError::NoSuchInterface(ifname.to_string())
    } else {
        StackError::Channels(e)
    }
}
