//! The Toeplitz hash of receive-side scaling, and the queue an RSS NIC picks with it.
//!
//! Implements the hash of Microsoft's "RSS hashing functions" specification (the
//! `NDIS_HASH_FUNCTION_TOEPLITZ` of the NDIS RSS documentation), which NICs of the
//! ConnectX, Intel and Broadcom families implement in hardware and the kernel calls
//! `ETH_RSS_HASH_TOP`: for every set bit of the input, taken from the first byte's most
//! significant bit on, the 32 key bits starting at that bit's position are XORed into the
//! result. The input for IPv4/TCP is the source address, the destination address, the
//! source port and the destination port of the *received* frame, each in network byte
//! order (12 bytes); the NIC then takes the entry `hash mod table size` of its indirection
//! table as the receive queue.
//!
//! [`RssConfig`] holds one interface's key, indirection table, hash function, input
//! transform and hashed fields (read by [`super::ethtool::read_rss`], or built with
//! [`RssConfig::toeplitz`] for a known key), and answers which queue a frame of a given
//! [`FlowTuple`] arrives on.

use std::net::SocketAddrV4;

/// The key of Microsoft's RSS verification suite (40 bytes), also the default key of many
/// drivers' documentation. The unit tests check [`toeplitz_hash`] against its published
/// results.
pub const MICROSOFT_VERIFICATION_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// The longest hash input this module builds: two IPv4 addresses and two ports.
pub const MAX_INPUT_LEN: usize = 12;

/// The Toeplitz hash of `input` under `key`.
///
/// Bits of the input beyond `8 * key.len() - 32` see a key window padded with zero bits
/// (a key must be at least 4 bytes longer than the input for every bit to count, which
/// [`RssConfig::toeplitz`] checks).
pub fn toeplitz_hash(key: &[u8], input: &[u8]) -> u32 {
    let key_bit = |i: usize| -> u32 {
        key.get(i / 8)
            .map_or(0, |byte| u32::from(byte >> (7 - (i % 8)) & 1))
    };
    // The 32-bit key window that starts at bit 0; it slides one bit per input bit.
    let mut window: u32 = key
        .iter()
        .chain(std::iter::repeat(&0))
        .take(4)
        .fold(0, |w, &b| (w << 8) | u32::from(b));
    let mut hash = 0u32;
    let mut next = 32;
    for &byte in input {
        for bit in (0..8).rev() {
            if byte >> bit & 1 != 0 {
                hash ^= window;
            }
            window = (window << 1) | key_bit(next);
            next += 1;
        }
    }
    hash
}

/// The addresses and ports of a TCP/IPv4 frame **as its receiver sees it**: `src` is the
/// sender, `dst` the receiver. A NIC hashes the frames it receives, so the tuple to hash
/// for the replies to a connection this host opened is [`FlowTuple::reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowTuple {
    /// The sender's address and port.
    pub src: SocketAddrV4,
    /// The receiver's address and port.
    pub dst: SocketAddrV4,
}

impl FlowTuple {
    /// A frame from `src` to `dst`.
    pub fn new(src: SocketAddrV4, dst: SocketAddrV4) -> FlowTuple {
        FlowTuple { src, dst }
    }

    /// The frames `remote` sends to `local`: what this host's NIC hashes for a connection
    /// between the two.
    pub fn reply(local: SocketAddrV4, remote: SocketAddrV4) -> FlowTuple {
        FlowTuple {
            src: remote,
            dst: local,
        }
    }

    /// The same connection's frames in the other direction.
    pub fn reversed(self) -> FlowTuple {
        FlowTuple {
            src: self.dst,
            dst: self.src,
        }
    }
}

/// The hash function an interface's RSS uses (`ETH_RSS_HASH_*` of the kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashFunction {
    /// `ETH_RSS_HASH_TOP`: Toeplitz, the only one this module computes.
    Toeplitz,
    /// `ETH_RSS_HASH_XOR`.
    Xor,
    /// `ETH_RSS_HASH_CRC32`.
    Crc32,
    /// The driver did not say (an `hfunc` of 0), or reported several bits or an unknown
    /// one; the raw value.
    Other(u8),
}

impl HashFunction {
    /// From the `hfunc` byte of `struct ethtool_rxfh`.
    pub fn from_hfunc(hfunc: u8) -> HashFunction {
        match hfunc {
            1 => HashFunction::Toeplitz,
            2 => HashFunction::Xor,
            4 => HashFunction::Crc32,
            other => HashFunction::Other(other),
        }
    }
}

/// How the hashed fields are combined before hashing (`RXH_XFRM_*`, the `input_xfrm` of
/// `struct ethtool_rxfh`, kernel 6.8 and later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InputTransform {
    /// The fields as they are.
    #[default]
    None,
    /// `RXH_XFRM_SYM_XOR`: `(src ^ dst, src ^ dst, sport ^ dport, sport ^ dport)`, so both
    /// directions of a flow hash alike.
    SymmetricXor,
    /// `RXH_XFRM_SYM_OR_XOR`: `(src | dst, src ^ dst, sport | dport, sport ^ dport)`.
    SymmetricOrXor,
    /// A transform this module does not know; the raw bits.
    Other(u8),
}

impl InputTransform {
    /// From the `input_xfrm` byte of `struct ethtool_rxfh`.
    pub fn from_bits(bits: u8) -> InputTransform {
        match bits {
            0 => InputTransform::None,
            1 => InputTransform::SymmetricXor,
            2 => InputTransform::SymmetricOrXor,
            other => InputTransform::Other(other),
        }
    }
}

/// Which header fields an interface hashes for TCP/IPv4 (`RXH_*` bits of
/// `ETHTOOL_GRXFH` with `TCP_V4_FLOW`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HashFields(pub u64);

impl HashFields {
    /// `RXH_IP_SRC`.
    pub const IP_SRC: u64 = 1 << 4;
    /// `RXH_IP_DST`.
    pub const IP_DST: u64 = 1 << 5;
    /// `RXH_L4_B_0_1`: the source port.
    pub const L4_SRC: u64 = 1 << 6;
    /// `RXH_L4_B_2_3`: the destination port.
    pub const L4_DST: u64 = 1 << 7;
    /// `RXH_DISCARD`: frames of this flow type are dropped.
    pub const DISCARD: u64 = 1 << 31;

    /// Both addresses and both ports: what RSS NICs hash for TCP by default.
    pub const FOUR_TUPLE: HashFields =
        HashFields(Self::IP_SRC | Self::IP_DST | Self::L4_SRC | Self::L4_DST);

    /// Whether every bit of `bits` is set.
    pub fn has(self, bits: u64) -> bool {
        self.0 & bits == bits
    }

    /// Bits other than the four this module knows how to hash (L2 address, VLAN, L3
    /// protocol, discard): the hash then depends on fields it cannot reproduce.
    pub fn unknown_bits(self) -> u64 {
        self.0 & !Self::FOUR_TUPLE.0
    }
}

/// Why an [`RssConfig`] does not let this host predict the queue of a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unpredictable {
    /// The hash function is not Toeplitz.
    #[error("the interface hashes with {0:?}, not Toeplitz")]
    HashFunction(HashFunction),
    /// The input transform is unknown.
    #[error("unknown RSS input transform bits {0:#x}")]
    InputTransform(u8),
    /// The interface hashes fields beside addresses and ports for TCP/IPv4.
    #[error("the TCP/IPv4 hash covers fields other than addresses and ports (RXH bits {0:#x})")]
    Fields(u64),
    /// TCP/IPv4 frames are dropped (`RXH_DISCARD`) or hashed over nothing.
    #[error("the interface hashes no field of TCP/IPv4 frames (RXH bits {0:#x})")]
    NoFields(u64),
    /// The key is shorter than the input plus 4 bytes.
    #[error("a {len}-byte RSS key is too short for a {input}-byte input")]
    KeyTooShort {
        /// The key's length.
        len: usize,
        /// The input's length.
        input: usize,
    },
    /// The indirection table is empty.
    #[error("the RSS indirection table is empty")]
    NoIndirection,
}

/// One interface's RSS: what decides the receive queue of each frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RssConfig {
    /// The hash function.
    pub hash: HashFunction,
    /// How fields are combined before hashing.
    pub input: InputTransform,
    /// The fields hashed for TCP/IPv4.
    pub fields: HashFields,
    /// The hash key.
    pub key: Vec<u8>,
    /// The indirection table: entry `hash mod len` is the receive queue.
    pub indirection: Vec<u32>,
}

impl RssConfig {
    /// Toeplitz over the TCP/IPv4 4-tuple with `key` and `indirection`, as a NIC at its
    /// defaults (and the RSS test bed) hashes. Fails when the key is shorter than 16 bytes
    /// or the table is empty.
    pub fn toeplitz(key: &[u8], indirection: &[u32]) -> Result<RssConfig, Unpredictable> {
        let config = RssConfig {
            hash: HashFunction::Toeplitz,
            input: InputTransform::None,
            fields: HashFields::FOUR_TUPLE,
            key: key.to_vec(),
            indirection: indirection.to_vec(),
        };
        config.check()?;
        Ok(config)
    }

    /// An indirection table of `len` entries spread over `queues` queues round-robin
    /// (`ethtool_rxfh_indir_default`: entry `i` is queue `i mod queues`), the table a
    /// driver starts with.
    pub fn default_indirection(len: usize, queues: u32) -> Vec<u32> {
        (0..len)
            .map(|i| u32::try_from(i).unwrap_or(u32::MAX) % queues.max(1))
            .collect()
    }

    /// Whether this configuration lets the queue of a TCP/IPv4 frame be computed, and if
    /// not, why.
    pub fn check(&self) -> Result<(), Unpredictable> {
        if self.hash != HashFunction::Toeplitz {
            return Err(Unpredictable::HashFunction(self.hash));
        }
        if let InputTransform::Other(bits) = self.input {
            return Err(Unpredictable::InputTransform(bits));
        }
        if self.fields.has(HashFields::DISCARD) {
            return Err(Unpredictable::NoFields(self.fields.0));
        }
        if self.fields.unknown_bits() != 0 {
            return Err(Unpredictable::Fields(self.fields.0));
        }
        let input = self.input_len();
        if input == 0 {
            return Err(Unpredictable::NoFields(self.fields.0));
        }
        if self.key.len() < input + 4 {
            return Err(Unpredictable::KeyTooShort {
                len: self.key.len(),
                input,
            });
        }
        if self.indirection.is_empty() {
            return Err(Unpredictable::NoIndirection);
        }
        Ok(())
    }

    /// Whether the local port of a connection decides anything: both ports are hashed
    /// (under a symmetric transform the ports are combined, so both must be).
    pub fn hashes_ports(&self) -> bool {
        self.fields.has(HashFields::L4_SRC) && self.fields.has(HashFields::L4_DST)
    }

    fn input_len(&self) -> usize {
        let f = self.fields;
        [
            (HashFields::IP_SRC, 4),
            (HashFields::IP_DST, 4),
            (HashFields::L4_SRC, 2),
            (HashFields::L4_DST, 2),
        ]
        .iter()
        .filter(|(bit, _)| f.has(*bit))
        .map(|(_, n)| n)
        .sum()
    }

    /// The bytes hashed for `tuple`: the hashed fields in the order source address,
    /// destination address, source port, destination port, after the input transform.
    /// Returns the buffer and the number of bytes used.
    pub fn hash_input(&self, tuple: &FlowTuple) -> ([u8; MAX_INPUT_LEN], usize) {
        let (s, d) = (u32::from(*tuple.src.ip()), u32::from(*tuple.dst.ip()));
        let (sp, dp) = (tuple.src.port(), tuple.dst.port());
        let (s, d, sp, dp) = match self.input {
            InputTransform::None | InputTransform::Other(_) => (s, d, sp, dp),
            InputTransform::SymmetricXor => (s ^ d, s ^ d, sp ^ dp, sp ^ dp),
            InputTransform::SymmetricOrXor => (s | d, s ^ d, sp | dp, sp ^ dp),
        };
        let mut buf = [0u8; MAX_INPUT_LEN];
        let mut n = 0;
        let mut put = |bytes: &[u8]| {
            buf[n..n + bytes.len()].copy_from_slice(bytes);
            n += bytes.len();
        };
        let f = self.fields;
        if f.has(HashFields::IP_SRC) {
            put(&s.to_be_bytes());
        }
        if f.has(HashFields::IP_DST) {
            put(&d.to_be_bytes());
        }
        if f.has(HashFields::L4_SRC) {
            put(&sp.to_be_bytes());
        }
        if f.has(HashFields::L4_DST) {
            put(&dp.to_be_bytes());
        }
        (buf, n)
    }

    /// The RSS hash of a frame of `tuple`, or `None` when it cannot be computed
    /// ([`check`](Self::check) says why).
    pub fn hash(&self, tuple: &FlowTuple) -> Option<u32> {
        self.check().ok()?;
        Some(self.hash_unchecked(tuple))
    }

    fn hash_unchecked(&self, tuple: &FlowTuple) -> u32 {
        let (buf, n) = self.hash_input(tuple);
        toeplitz_hash(&self.key, &buf[..n])
    }

    /// The indirection-table entry for `hash`.
    pub fn queue_of_hash(&self, hash: u32) -> Option<u32> {
        let len = self.indirection.len();
        if len == 0 {
            return None;
        }
        self.indirection.get(hash as usize % len).copied()
    }

    /// The receive queue of a frame of `tuple`, or `None` when it cannot be computed.
    pub fn queue_of(&self, tuple: &FlowTuple) -> Option<u32> {
        self.queue_of_hash(self.hash(tuple)?)
    }

    /// The queue this host's NIC delivers `remote`'s frames to on a connection from
    /// `local`.
    pub fn reply_queue(&self, local: SocketAddrV4, remote: SocketAddrV4) -> Option<u32> {
        self.queue_of(&FlowTuple::reply(local, remote))
    }

    /// Whether some indirection entry names `queue`.
    pub fn reaches(&self, queue: u32) -> bool {
        self.indirection.contains(&queue)
    }

    /// The queues the table names, sorted, each once.
    pub fn queues(&self) -> Vec<u32> {
        let mut q = self.indirection.clone();
        q.sort_unstable();
        q.dedup();
        q
    }

    /// Internal: the hash of `tuple` for a configuration already [`check`](Self::check)ed.
    pub(crate) fn hash_checked(&self, tuple: &FlowTuple) -> u32 {
        self.hash_unchecked(tuple)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(src: &str, dst: &str) -> FlowTuple {
        FlowTuple::new(src.parse().unwrap(), dst.parse().unwrap())
    }

    /// Microsoft's "Verifying the RSS hash calculation" table (IPv4): destination,
    /// source, the hash of the addresses alone and the hash with TCP ports.
    const VECTORS: [(&str, &str, u32, u32); 5] = [
        (
            "161.142.100.80:1766",
            "66.9.149.187:2794",
            0x323e_8fc2,
            0x51cc_c178,
        ),
        (
            "65.69.140.83:4739",
            "199.92.111.2:14230",
            0xd718_262a,
            0xc626_b0ea,
        ),
        (
            "12.22.207.184:38024",
            "24.19.198.95:12898",
            0xd2d0_a5de,
            0x5c2b_394a,
        ),
        (
            "209.142.163.6:2217",
            "38.27.205.30:48228",
            0x8298_9176,
            0xafc7_327f,
        ),
        (
            "202.188.127.2:1303",
            "153.39.163.191:44251",
            0x5d18_09c5,
            0x10e8_28a2,
        ),
    ];

    #[test]
    fn microsoft_verification_vectors_ipv4_with_tcp() {
        let rss = RssConfig::toeplitz(&MICROSOFT_VERIFICATION_KEY, &[0]).unwrap();
        for (dst, src, _, with_tcp) in VECTORS {
            let tuple = t(src, dst);
            assert_eq!(rss.hash(&tuple), Some(with_tcp), "{src} -> {dst}");
        }
    }

    #[test]
    fn microsoft_verification_vectors_ipv4_addresses_only() {
        let mut rss = RssConfig::toeplitz(&MICROSOFT_VERIFICATION_KEY, &[0]).unwrap();
        rss.fields = HashFields(HashFields::IP_SRC | HashFields::IP_DST);
        for (dst, src, addresses_only, _) in VECTORS {
            assert_eq!(
                rss.hash(&t(src, dst)),
                Some(addresses_only),
                "{src} -> {dst}"
            );
        }
        // The ports no longer matter.
        assert!(!rss.hashes_ports());
    }

    #[test]
    fn raw_hash_of_the_first_vector_input() {
        // 66.9.149.187 161.142.100.80 2794 1766, byte by byte.
        let input = [66, 9, 149, 187, 161, 142, 100, 80, 0x0a, 0xea, 0x06, 0xe6];
        assert_eq!(
            toeplitz_hash(&MICROSOFT_VERIFICATION_KEY, &input),
            0x51cc_c178
        );
        assert_eq!(toeplitz_hash(&MICROSOFT_VERIFICATION_KEY, &[]), 0);
        // A single set bit picks the key's first 32 bits.
        assert_eq!(
            toeplitz_hash(&MICROSOFT_VERIFICATION_KEY, &[0x80]),
            0x6d5a_56da
        );
        // The last bit of the first byte: the window that starts at key bit 7.
        assert_eq!(
            toeplitz_hash(&MICROSOFT_VERIFICATION_KEY, &[0x01]),
            (0x6d5a_56da_u64 << 7 | 0x25 >> 1) as u32
        );
    }

    #[test]
    fn symmetric_transforms_hash_both_directions_alike() {
        for input in [InputTransform::SymmetricXor, InputTransform::SymmetricOrXor] {
            let mut rss = RssConfig::toeplitz(&MICROSOFT_VERIFICATION_KEY, &[0, 1, 2]).unwrap();
            rss.input = input;
            for (dst, src, _, _) in VECTORS {
                let tuple = t(src, dst);
                assert_eq!(rss.hash(&tuple), rss.hash(&tuple.reversed()), "{input:?}");
            }
        }
        // Without a transform the directions differ (the first vector, both ways).
        let rss = RssConfig::toeplitz(&MICROSOFT_VERIFICATION_KEY, &[0]).unwrap();
        let tuple = t(VECTORS[0].1, VECTORS[0].0);
        assert_ne!(rss.hash(&tuple), rss.hash(&tuple.reversed()));
    }

    #[test]
    fn symmetric_xor_input_layout() {
        let mut rss = RssConfig::toeplitz(&MICROSOFT_VERIFICATION_KEY, &[0]).unwrap();
        rss.input = InputTransform::SymmetricXor;
        let (buf, n) = rss.hash_input(&t("1.2.3.4:5", "1.2.3.0:1"));
        assert_eq!(&buf[..n], &[0, 0, 0, 4, 0, 0, 0, 4, 0, 4, 0, 4]);
        rss.input = InputTransform::SymmetricOrXor;
        let (buf, n) = rss.hash_input(&t("1.2.3.4:5", "1.2.3.0:1"));
        assert_eq!(&buf[..n], &[1, 2, 3, 4, 0, 0, 0, 4, 0, 5, 0, 4]);
    }

    #[test]
    fn queue_is_the_indirection_entry_of_hash_mod_len() {
        let table = RssConfig::default_indirection(128, 6);
        assert_eq!(table[..8], [0, 1, 2, 3, 4, 5, 0, 1]);
        let rss = RssConfig::toeplitz(&MICROSOFT_VERIFICATION_KEY, &table).unwrap();
        for (dst, src, _, hash) in VECTORS {
            let expected = (hash % 128) % 6;
            assert_eq!(rss.queue_of(&t(src, dst)), Some(expected));
        }
        assert_eq!(rss.queues(), vec![0, 1, 2, 3, 4, 5]);
        assert!(rss.reaches(5) && !rss.reaches(6));
        // The reply of a connection 66.9.149.187:2794 -> 161.142.100.80:1766 is the first
        // vector's tuple reversed.
        let local: SocketAddrV4 = VECTORS[0].1.parse().unwrap();
        let remote: SocketAddrV4 = VECTORS[0].0.parse().unwrap();
        assert_eq!(
            rss.reply_queue(remote, local),
            Some((0x51cc_c178 % 128) % 6)
        );
    }

    #[test]
    fn unpredictable_configurations_say_why() {
        let ok = RssConfig::toeplitz(&MICROSOFT_VERIFICATION_KEY, &[0]).unwrap();
        let tuple = t("10.0.0.1:1", "10.0.0.2:2");
        let mut c = ok.clone();
        c.hash = HashFunction::Xor;
        assert_eq!(
            c.check(),
            Err(Unpredictable::HashFunction(HashFunction::Xor))
        );
        assert_eq!(c.queue_of(&tuple), None);
        let mut c = ok.clone();
        c.input = InputTransform::Other(8);
        assert_eq!(c.check(), Err(Unpredictable::InputTransform(8)));
        let mut c = ok.clone();
        c.fields = HashFields(HashFields::FOUR_TUPLE.0 | (1 << 3));
        assert!(matches!(c.check(), Err(Unpredictable::Fields(_))));
        let mut c = ok.clone();
        c.fields = HashFields(0);
        assert!(matches!(c.check(), Err(Unpredictable::NoFields(0))));
        let mut c = ok.clone();
        c.fields = HashFields(HashFields::DISCARD | HashFields::FOUR_TUPLE.0);
        assert!(matches!(c.check(), Err(Unpredictable::NoFields(_))));
        assert_eq!(
            RssConfig::toeplitz(&MICROSOFT_VERIFICATION_KEY[..15], &[0]),
            Err(Unpredictable::KeyTooShort { len: 15, input: 12 })
        );
        assert_eq!(
            RssConfig::toeplitz(&MICROSOFT_VERIFICATION_KEY, &[]),
            Err(Unpredictable::NoIndirection)
        );
        assert_eq!(HashFunction::from_hfunc(1), HashFunction::Toeplitz);
        assert_eq!(HashFunction::from_hfunc(0), HashFunction::Other(0));
        assert_eq!(InputTransform::from_bits(2), InputTransform::SymmetricOrXor);
    }
}
