#!/usr/bin/env bash
# The main job: `ncperf demo`. Installs the Debian packages the build and the test bed need
# (as root), builds ncperf in release mode and runs the whole suite: as root on the
# two-namespace AF_XDP test bed (a veth pair with two queues, MTU 1500), netchannel against
# kernel TCP at its defaults, about five minutes on 2 cores; without root on in-memory
# stacks against kernel TCP over loopback, which its first line says.
#
# Arguments go to `ncperf demo` (see `ncperf demo --help`), for example:
#   ./scripts/demo.sh --quick                      # a short run
#   ./scripts/demo.sh --json report.json --plot charts/
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# Two cores shared with other work: build with one job.
cargo build --release -j1 --bin ncperf
# The binary is where cargo put it: under CARGO_TARGET_DIR when that is set.
exec "${CARGO_TARGET_DIR:-target}/release/ncperf" demo "$@"
