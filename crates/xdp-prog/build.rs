//! Compiles the BPF programs in `src/bpf/` with clang and generates their libbpf-rs
//! skeletons in OUT_DIR: `steer.bpf.c` (the XDP steering program of the AF_XDP link) and
//! `packet.bpf.c` (the socket filter and TCX ingress drop of the AF_PACKET link).

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SOURCES: [(&str, &str); 2] = [
    ("src/bpf/steer.bpf.c", "steer.skel.rs"),
    ("src/bpf/packet.bpf.c", "packet.skel.rs"),
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
