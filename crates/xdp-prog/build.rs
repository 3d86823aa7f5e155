//! Compiles `src/bpf/steer.bpf.c` with clang and generates its libbpf-rs skeleton in OUT_DIR.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/steer.bpf.c";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    // `clang -target bpf` does not search the multiarch directory that holds <asm/types.h>
    // on Debian; name it. The libbpf headers (<bpf/bpf_helpers.h>) come from libbpf-sys.
    let multiarch = format!("-I/usr/include/{arch}-linux-gnu");
    SkeletonBuilder::new()
        .source(SRC)
        .clang_args([multiarch.as_str(), "-Wall", "-Werror"])
        .build_and_generate(out.join("steer.skel.rs"))
        .unwrap_or_else(|e| panic!("building the XDP program {SRC}: {e:#}"));
    println!("cargo:rerun-if-changed={SRC}");
}
