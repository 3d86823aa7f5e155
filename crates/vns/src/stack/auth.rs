//! Channel authentication: a challenge-response run on every channel right after its
//! preamble, when the stack has a key ([`ChannelKey`], `StackBuilder::channel_key`).
//!
//! Without it, any process that reaches the channel port from a peer's address becomes
//! one of that peer's channels: the scheduler hands it chunks of the real peer's sockets,
//! and it may reset, stop or overrun them. With a key, both ends prove they hold it
//! before the channel joins the endpoint (layout in `docs/wire-format.md`):
//!
//! 1. opener → acceptor: the preamble with [`FLAG_AUTH`] set, then a fresh 16-byte nonce
//!    `Nc`;
//! 2. acceptor → opener: its own fresh nonce `Ns` and
//!    `HMAC-SHA256(key, "netchannel accept v1" ‖ Nc ‖ Ns ‖ class)`;
//! 3. opener → acceptor, once it has checked that tag:
//!    `HMAC-SHA256(key, "netchannel open v1" ‖ Nc ‖ Ns ‖ class)`; chunks may follow.
//!
//! The acceptor's fresh nonce makes a recorded exchange useless on a new channel (no
//! replay), the distinct labels keep one side's tag from serving as the other's, and the
//! class is covered so that an on-path party cannot move a channel between classes. Tags
//! are compared in constant time (RFC 2104 HMAC from the RustCrypto `hmac` crate). What
//! this does not give: confidentiality or integrity of the chunks that follow (an on-path
//! attacker who can rewrite TCP segments can still tamper with them; use IPsec or a
//! private network for that), see `docs/security.md`.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bit of the preamble's flags byte (offset 6): the opener will authenticate.
pub(crate) const FLAG_AUTH: u8 = 0x01;
/// Length of each side's nonce.
pub(crate) const NONCE_LEN: usize = 16;
/// Length of an HMAC-SHA256 tag.
pub(crate) const TAG_LEN: usize = 32;
/// Shortest key accepted: 16 bytes (128 bits) of secret.
pub const MIN_KEY_LEN: usize = 16;

const ACCEPT_LABEL: &[u8] = b"netchannel accept v1";
const OPEN_LABEL: &[u8] = b"netchannel open v1";

/// The secret both ends of a channel must share when channels are authenticated
/// (`StackBuilder::channel_key`, `NETCHANNEL_CHANNEL_KEY`). Cheap to clone; its `Debug`
/// output never shows the bytes.
#[derive(Clone)]
pub struct ChannelKey(Arc<[u8]>);

impl ChannelKey {
    /// A key from `secret`, at least [`MIN_KEY_LEN`] bytes (use a random string of 32 or
    /// more characters); `None` when shorter.
    pub fn new(secret: impl AsRef<[u8]>) -> Option<ChannelKey> {
        let s = secret.as_ref();
        (s.len() >= MIN_KEY_LEN).then(|| ChannelKey(Arc::from(s)))
    }

    fn tag(&self, label: &[u8], nc: &[u8], ns: &[u8], class: u8) -> Hmac<Sha256> {
        // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
        let mut mac = match Hmac::<Sha256>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        };
        mac.update(label);
        mac.update(nc);
        mac.update(ns);
        mac.update(&[class]);
        mac
    }

    /// The acceptor's tag (step 2).
    pub(crate) fn accept_tag(&self, nc: &[u8], ns: &[u8], class: u8) -> [u8; TAG_LEN] {
        self.tag(ACCEPT_LABEL, nc, ns, class)
            .finalize()
            .into_bytes()
            .into()
    }

    /// The opener's tag (step 3).
    pub(crate) fn open_tag(&self, nc: &[u8], ns: &[u8], class: u8) -> [u8; TAG_LEN] {
        self.tag(OPEN_LABEL, nc, ns, class)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `tag` is the acceptor's tag for these nonces (constant time).
    pub(crate) fn verify_accept(&self, nc: &[u8], ns: &[u8], class: u8, tag: &[u8]) -> bool {
        self.tag(ACCEPT_LABEL, nc, ns, class)
            .verify_slice(tag)
            .is_ok()
    }

    /// Whether `tag` is the opener's tag for these nonces (constant time).
    pub(crate) fn verify_open(&self, nc: &[u8], ns: &[u8], class: u8, tag: &[u8]) -> bool {
        self.tag(OPEN_LABEL, nc, ns, class)
            .verify_slice(tag)
            .is_ok()
    }
}

impl fmt::Debug for ChannelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChannelKey(<{} bytes, hidden>)", self.0.len())
    }
}

/// A fresh random nonce from the operating system.
pub(crate) fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::getrandom(&mut n).map_err(std::io::Error::other)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> ChannelKey {
        ChannelKey::new([b; 32]).unwrap()
    }

    #[test]
    fn short_keys_are_refused_and_debug_hides_the_bytes() {
        assert!(ChannelKey::new(b"too short").is_none());
        assert!(ChannelKey::new([7u8; MIN_KEY_LEN]).is_some());
        let k = ChannelKey::new(b"a secret of thirty-two bytes!!!!").unwrap();
        let shown = format!("{k:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("32 bytes"), "{shown}");
    }

    #[test]
    fn tags_verify_only_with_the_same_key_nonces_class_and_direction() {
        let (nc, ns) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        let k = key(9);
        let a = k.accept_tag(&nc, &ns, 0);
        let o = k.open_tag(&nc, &ns, 0);
        assert!(k.verify_accept(&nc, &ns, 0, &a));
        assert!(k.verify_open(&nc, &ns, 0, &o));
        // One direction's tag is not the other's.
        assert_ne!(a, o);
        assert!(!k.verify_open(&nc, &ns, 0, &a));
        assert!(!k.verify_accept(&nc, &ns, 0, &o));
        // Another key, nonce or class: rejected.
        assert!(!key(8).verify_open(&nc, &ns, 0, &o));
        assert!(!k.verify_open(&ns, &nc, 0, &o));
        assert!(!k.verify_open(&nc, &[3u8; NONCE_LEN], 0, &o));
        assert!(!k.verify_open(&nc, &ns, 1, &o));
        // Truncated or empty tags.
        assert!(!k.verify_open(&nc, &ns, 0, &o[..16]));
        assert!(!k.verify_open(&nc, &ns, 0, &[]));
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}
