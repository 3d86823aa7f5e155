//! ARP (RFC 826, "Packet format" and "Packet Reception") for Ethernet hardware addresses
//! and IPv4 protocol addresses only.
//!
//! The view ([`ArpPacket`]) reads the generic header (hardware type, protocol type, address
//! lengths, operation) and the variable-length address fields; the representation
//! ([`ArpRepr`]) accepts only hardware type 1 (Ethernet) with 6-byte addresses and protocol
//! type 0x0800 (IPv4) with 4-byte addresses, and only the Request and Reply operations.
//! Anything else parses as [`WireError::Unsupported`].

use std::net::Ipv4Addr;

use super::ethernet::EthernetAddress;
use super::WireError;

/// The ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOperation {
    /// ares_op$REQUEST (1).
    Request,
    /// ares_op$REPLY (2).
    Reply,
}

impl ArpOperation {
    /// The operation code on the wire.
    pub const fn code(self) -> u16 {
        match self {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
        }
    }
}

/// Hardware type for Ethernet.
pub const HTYPE_ETHERNET: u16 = 1;
/// Protocol type for IPv4 (the IPv4 EtherType).
pub const PTYPE_IPV4: u16 = 0x0800;
/// Length of the fixed part of the header (before the addresses).
pub const FIXED_LEN: usize = 8;
/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = FIXED_LEN + 2 * (6 + 4);

/// A zero-copy view of an ARP packet with any address lengths.
///
/// [`ArpPacket::new_checked`] validates that the buffer holds the fixed header and all
/// four addresses at the lengths it announces; afterwards every accessor is in bounds.
#[derive(Debug, Clone)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Wraps a buffer without checking it. Accessors panic on a buffer too short for the
    /// lengths its header announces; use only on buffers you sized yourself.
    pub const fn new_unchecked(buffer: T) -> ArpPacket<T> {
        ArpPacket { buffer }
    }

    /// Wraps a buffer after [`ArpPacket::check_len`].
    pub fn new_checked(buffer: T) -> Result<ArpPacket<T>, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer holds the fixed header and the four addresses.
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buffer.as_ref().len();
        if len < FIXED_LEN || len < self.packet_len() {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// Gives back the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn read_u16(&self, at: usize) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    /// Hardware type.
    pub fn hardware_type(&self) -> u16 {
        self.read_u16(0)
    }

    /// Protocol type.
    pub fn protocol_type(&self) -> u16 {
        self.read_u16(2)
    }

    /// Hardware address length.
    pub fn hardware_len(&self) -> usize {
        self.buffer.as_ref()[4] as usize
    }

    /// Protocol address length.
    pub fn protocol_len(&self) -> usize {
        self.buffer.as_ref()[5] as usize
    }

    /// Operation code.
    pub fn operation(&self) -> u16 {
        self.read_u16(6)
    }

    /// Length of the packet the header announces.
    pub fn packet_len(&self) -> usize {
        match self.buffer.as_ref().get(4..6) {
            Some(&[h, p]) => FIXED_LEN + 2 * (h as usize + p as usize),
            _ => FIXED_LEN,
        }
    }

    fn field(&self, index: usize) -> &[u8] {
        let (h, p) = (self.hardware_len(), self.protocol_len());
        let start = FIXED_LEN
            + match index {
                0 => 0,
                1 => h,
                2 => h + p,
                _ => 2 * h + p,
            };
        let len = if index % 2 == 0 { h } else { p };
        &self.buffer.as_ref()[start..start + len]
    }

    /// Sender hardware address bytes.
    pub fn source_hardware_addr(&self) -> &[u8] {
        self.field(0)
    }

    /// Sender protocol address bytes.
    pub fn source_protocol_addr(&self) -> &[u8] {
        self.field(1)
    }

    /// Target hardware address bytes.
    pub fn target_hardware_addr(&self) -> &[u8] {
        self.field(2)
    }

    /// Target protocol address bytes.
    pub fn target_protocol_addr(&self) -> &[u8] {
        self.field(3)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ArpPacket<T> {
    fn write_u16(&mut self, at: usize, v: u16) {
        self.buffer.as_mut()[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the hardware type.
    pub fn set_hardware_type(&mut self, v: u16) {
        self.write_u16(0, v);
    }

    /// Sets the protocol type.
    pub fn set_protocol_type(&mut self, v: u16) {
        self.write_u16(2, v);
    }

    /// Sets the hardware address length.
    pub fn set_hardware_len(&mut self, v: u8) {
        self.buffer.as_mut()[4] = v;
    }

    /// Sets the protocol address length.
    pub fn set_protocol_len(&mut self, v: u8) {
        self.buffer.as_mut()[5] = v;
    }

    /// Sets the operation code.
    pub fn set_operation(&mut self, v: u16) {
        self.write_u16(6, v);
    }

    fn set_field(&mut self, index: usize, value: &[u8]) {
        let (h, p) = (self.hardware_len(), self.protocol_len());
        let start = FIXED_LEN
            + match index {
                0 => 0,
                1 => h,
                2 => h + p,
                _ => 2 * h + p,
            };
        let len = if index % 2 == 0 { h } else { p };
        self.buffer.as_mut()[start..start + len].copy_from_slice(value);
    }

    /// Sets the sender hardware address (its length must equal the hardware length).
    pub fn set_source_hardware_addr(&mut self, v: &[u8]) {
        self.set_field(0, v);
    }

    /// Sets the sender protocol address (its length must equal the protocol length).
    pub fn set_source_protocol_addr(&mut self, v: &[u8]) {
        self.set_field(1, v);
    }

    /// Sets the target hardware address (its length must equal the hardware length).
    pub fn set_target_hardware_addr(&mut self, v: &[u8]) {
        self.set_field(2, v);
    }

    /// Sets the target protocol address (its length must equal the protocol length).
    pub fn set_target_protocol_addr(&mut self, v: &[u8]) {
        self.set_field(3, v);
    }
}

/// A parsed Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpRepr {
    /// Request or reply.
    pub operation: ArpOperation,
    /// Sender hardware address.
    pub source_hw: EthernetAddress,
    /// Sender IPv4 address.
    pub source_ip: Ipv4Addr,
    /// Target hardware address (all zeroes in a request, by convention).
    pub target_hw: EthernetAddress,
    /// Target IPv4 address.
    pub target_ip: Ipv4Addr,
}

fn ipv4_from(b: &[u8]) -> Result<Ipv4Addr, WireError> {
    let o: [u8; 4] = b.try_into().map_err(|_| WireError::Malformed)?;
    Ok(Ipv4Addr::from(o))
}

fn mac_from(b: &[u8]) -> Result<EthernetAddress, WireError> {
    EthernetAddress::from_bytes(b).ok_or(WireError::Malformed)
}

impl ArpRepr {
    /// Parses a packet. Hardware/protocol types other than Ethernet/IPv4 (or their usual
    /// address lengths) and operations other than Request/Reply are
    /// [`WireError::Unsupported`].
    pub fn parse<T: AsRef<[u8]>>(packet: &ArpPacket<T>) -> Result<ArpRepr, WireError> {
        packet.check_len()?;
        if packet.hardware_type() != HTYPE_ETHERNET
            || packet.protocol_type() != PTYPE_IPV4
            || packet.hardware_len() != 6
            || packet.protocol_len() != 4
        {
            return Err(WireError::Unsupported);
        }
        let operation = match packet.operation() {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            _ => return Err(WireError::Unsupported),
        };
        Ok(ArpRepr {
            operation,
            source_hw: mac_from(packet.source_hardware_addr())?,
            source_ip: ipv4_from(packet.source_protocol_addr())?,
            target_hw: mac_from(packet.target_hardware_addr())?,
            target_ip: ipv4_from(packet.target_protocol_addr())?,
        })
    }

    /// Length of the packet this emits ([`PACKET_LEN`], 28 bytes).
    pub const fn packet_len(&self) -> usize {
        PACKET_LEN
    }

    /// Writes the packet into the first [`PACKET_LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let buf = buf.get_mut(..PACKET_LEN).ok_or(WireError::Truncated)?;
        let mut p = ArpPacket::new_unchecked(buf);
        p.set_hardware_type(HTYPE_ETHERNET);
        p.set_protocol_type(PTYPE_IPV4);
        p.set_hardware_len(6);
        p.set_protocol_len(4);
        p.set_operation(self.operation.code());
        p.set_source_hardware_addr(&self.source_hw.0);
        p.set_source_protocol_addr(&self.source_ip.octets());
        p.set_target_hardware_addr(&self.target_hw.0);
        p.set_target_protocol_addr(&self.target_ip.octets());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Who has 10.0.0.2? Tell 10.0.0.1 (02:00:00:00:00:01).
    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, // fixed
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 10, 0, 0, 1, // sender
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 10, 0, 0, 2, // target
    ];

    fn request() -> ArpRepr {
        ArpRepr {
            operation: ArpOperation::Request,
            source_hw: EthernetAddress([2, 0, 0, 0, 0, 1]),
            source_ip: Ipv4Addr::new(10, 0, 0, 1),
            target_hw: EthernetAddress([0; 6]),
            target_ip: Ipv4Addr::new(10, 0, 0, 2),
        }
    }

    #[test]
    fn parse_known_request() {
        let p = ArpPacket::new_checked(&REQUEST[..]).unwrap();
        assert_eq!(ArpRepr::parse(&p).unwrap(), request());
    }

    #[test]
    fn emit_known_request() {
        let mut buf = [0xeeu8; 30];
        request().emit(&mut buf).unwrap();
        assert_eq!(&buf[..28], &REQUEST);
        assert_eq!(&buf[28..], &[0xee, 0xee]);
        assert_eq!(request().emit(&mut buf[..27]), Err(WireError::Truncated));
    }

    #[test]
    fn truncated_at_every_length() {
        for len in 0..PACKET_LEN {
            assert_eq!(
                ArpPacket::new_checked(&REQUEST[..len]).err(),
                Some(WireError::Truncated),
                "len {len}"
            );
        }
    }

    #[test]
    fn unsupported_types_and_operations() {
        for (at, value) in [(1, 6u8), (2, 0x86), (4, 8), (5, 16), (7, 3)] {
            let mut b = REQUEST.to_vec();
            b[at] = value;
            b.resize(80, 0);
            let p = ArpPacket::new_checked(&b[..]).unwrap();
            assert_eq!(ArpRepr::parse(&p), Err(WireError::Unsupported), "byte {at}");
        }
    }

    #[test]
    fn other_lengths_are_bounds_checked() {
        // hlen 255, plen 255: needs 8 + 1020 bytes.
        let mut b = REQUEST.to_vec();
        b[4] = 255;
        b[5] = 255;
        assert_eq!(
            ArpPacket::new_checked(&b[..]).err(),
            Some(WireError::Truncated)
        );
        b.resize(8 + 1020, 0);
        let p = ArpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(p.target_protocol_addr().len(), 255);
        assert_eq!(ArpRepr::parse(&p), Err(WireError::Unsupported));
    }
}
