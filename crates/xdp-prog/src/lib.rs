//! The XDP program that steers netchannel's flows to AF_XDP sockets, and its loader.
//!
//! This crate will hold a C XDP program, compiled at build time by `libbpf-cargo` into a
//! skeleton and loaded with `libbpf-rs`, that redirects exactly the IPv4 TCP flows the stack
//! owns to the XSKMAP entry of the receiving queue and passes everything else (ARP, ICMP,
//! the kernel's own TCP) to the kernel. It is the only crate that touches BPF.
//!
//! Nothing is implemented yet: see the issue "NetDriver over AF_XDP".
