#!/usr/bin/env bash
# The main demo. As root it runs on the two-namespace AF_XDP test bed (a veth pair with two
# queues) and prints, side by side in one run: the raw frame rate of our AF_XDP link (the
# ceiling), one TCP channel's goodput (ours -> ours, kernel -> ours, ours -> kernel), kernel
# TCP over the same veth without and with our XDP program attached, and their ratios; then
# the product, a VirtualStream from a netchannel Stack in one namespace to a VirtualListener
# on a Stack in the other (1, then 4 throughput channels per peer), interleaved round by
# round with one raw channel of the same stacks' channel sets (without and with copies) and
# kernel TCP over the same veth, with the ratios VirtualStream / raw channel / kernel TCP.
# Without root (or with --sim) it falls back to two endpoints over the SIMULATED link (in
# memory, virtual time, seeded faults; the --bytes/--loss/... arguments below), then one
# VirtualStream between two in-memory Stacks (no TCP, no AF_XDP), and says so.
# Extra arguments are passed to the demo and override the defaults below (see `--help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# Two cores shared with other work: build with one job.
exec cargo run --release -j1 --example demo -- \
    --bed-bytes 268435456 --rounds 5 \
    --vns-bytes 268435456 --vns-rounds 3 --vns-channels 4 \
    --bytes 64000000 --loss 0.001 --latency-us 50 --bandwidth-mbps 10000 --mtu 1500 \
    --seed 1 --congestion cubic "$@"
