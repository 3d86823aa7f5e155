#!/usr/bin/env bash
# Installs the system packages netchannel needs on Debian, as root. Idempotent: packages
# already present are not reinstalled and apt is not touched when nothing is missing.
set -euo pipefail

# clang/llvm/libelf/m4: the XDP program and libbpf; make: libbpf-sys builds its vendored
# libbpf with make (a bare Debian image has none); libpcap/libhwloc/libudev: AF_XDP and
# topology crates; iproute2/ethtool/iptables/iputils-ping: the two-namespace test bed
# (crates/testbed); pkg-config for -sys crates; redis-tools: redis-cli and redis-benchmark,
# the standard clients tests/kv_example.rs drives the kv example with; curl and
# apache2-utils (ab): the HTTP clients of tests/ecosystem_examples.rs and
# benches/connection_setup.rs; ca-certificates: cargo fetches crates over HTTPS and checks
# the registry's certificate against the system's CA bundle, which a bare image lacks (and
# --no-install-recommends does not bring in with curl).
PACKAGES=(clang llvm libelf-dev m4 make libpcap-dev libhwloc-dev libudev-dev pkg-config
          iproute2 ethtool iptables iputils-ping zlib1g-dev redis-tools curl apache2-utils
          ca-certificates)

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -ne 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "install-deps: missing packages ${missing[*]}; run as root to install them" >&2
        exit 1
    fi
    echo "install-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: cargo not found; install a Rust toolchain (rustup) first" >&2
    exit 1
fi
