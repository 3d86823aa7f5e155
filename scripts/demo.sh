#!/usr/bin/env bash
# The main demo: two netchannel endpoints transfer data over the SIMULATED link (in memory,
# virtual time, seeded faults) and report goodput, CPU throughput, retransmissions and RTT.
# The AF_XDP test bed is not implemented yet. Extra arguments are passed to the demo and
# override the defaults below (see `--help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# Two cores shared with other work: build with one job.
exec cargo run --release -j1 --example demo -- \
    --bytes 64000000 --loss 0.001 --latency-us 50 --bandwidth-mbps 10000 --mtu 1500 \
    --seed 1 --congestion cubic "$@"
