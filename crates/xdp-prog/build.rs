//! Compiles the BPF programs in `src/bpf/` with clang and generates their libbpf-rs
//! skeletons in OUT_DIR: `steer.bpf.c` (the XDP steering program of the AF_XDP link),
//! `packet.bpf.c` (the socket filter and TCX ingress drop of the AF_PACKET link) and
//! `rss_relay.bpf.c` (the RSS test bed's tc relay).

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SOURCES: [(&str, &str); 3] = [
    ("src/bpf/steer.bpf.c", "steer.skel.rs"),
    ("src/bpf/packet.bpf.c", "packet.skel.rs"),
    ("src/bpf/rss_relay.bpf.c", "rss_relay.skel.rs"),
];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    // `clang -target bpf` does not search the multiarch directory that holds <asm/types.h>
    // on Debian; name it. The libbpf headers (<bpf/bpf_helpers.h>) come from libbpf-sys.
    let multiarch = format!("-I/usr/include/{arch}-linux-gnu");
    for (src, skel) in SOURCES {
        SkeletonBuilder::new()
            .source(src)
            .clang_args([multiarch.as_str(), "-Wall", "-Werror"])
            .build_and_generate(out.join(skel))
            .unwrap_or_else(|e| panic!("building the BPF program {src}: {e:#}"));
        println!("cargo:rerun-if-changed={src}");
    }
}
