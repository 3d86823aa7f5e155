#!/usr/bin/env bash
# Multi-core measurements (request rate by channel count, the paper's operating points,
# latency), for a machine with cores to spare and no Rust toolchain: run
# `scripts/bench-bundle.sh make` first (here), carry `.devbundle/`, then run this there
# as root. Logs go to $OUT (or /tmp/bench-16core). Each step has its own time limit, so
# that one hanging step leaves the others' figures.
#
# Steps: (1) rpc_rate at 128 connections with 1, 2 and 4 channels per peer; (2) the
# paper's three operating points; (3) rpc_rate over 1-128 connections with 4 channels;
# (4) vns_latency (the stack's default channel count: 4 on such a machine). BUSY=1 adds
# (5) vns_latency and rpc_rate at 128 connections with busy polling. The bed has 4 queues
# (so 4 queue drivers per side) and the tokio runtime 4 workers, for the VirtualStreams
# and kernel TCP alike. NETCHANNEL_BENCH_CHANNEL_THREAD_RX, NETCHANNEL_BENCH_RUNTIME_RX
# and NETCHANNEL_BENCH_LIGHT_LOAD_STREAMS below switched receive paths that queue drivers
# replaced; the benches no longer read them, so the `rx` loops and `rpc_conns_nolight`
# repeat the measurement beside them.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/bench-16core}
mkdir -p "$out"
step() {
    local log=$1 limit=$2
    shift 2
    echo "=== $(date +%T) $log: $*" | tee -a "$out/$log.log"
    timeout -k 5 "$limit" env "$@" 2>&1 | tee -a "$out/$log.log"
    echo "=== $(date +%T) exit ${PIPESTATUS[0]}" | tee -a "$out/$log.log"
}
{
    echo "nproc $(nproc); kernel $(uname -r)"
    grep -m1 'model name' /proc/cpuinfo
    free -g | head -2
} | tee "$out/machine.log"

export NETCHANNEL_BENCH_QUEUES=4 NETCHANNEL_BENCH_WORKERS=4
common=(NETCHANNEL_BENCH_SECS=1 NETCHANNEL_BENCH_ROUNDS=2 NETCHANNEL_BENCH_RUNTIME_RX=0)
spin=(NETCHANNEL_BENCH_BUSY_POLL_US=200 NETCHANNEL_BENCH_CORES_A=8,9,10,11 NETCHANNEL_BENCH_CORES_B=12,13,14,15)

for ch in 1 2 4; do
    for rx in 1 0; do
        step rpc128 100 "${common[@]}" NETCHANNEL_BENCH_CONNS=128 NETCHANNEL_BENCH_CHANNELS=$ch \
            NETCHANNEL_BENCH_CHANNEL_THREAD_RX=$rx scripts/bench-bundle.sh run rpc_rate
    done
done
# Point 3 with the latency application on its own runtime (the paper's setup; the
# shared-runtime mode measures the application's run queue, not the stack).
step points 300 NETCHANNEL_BENCH_SECS=1 NETCHANNEL_BENCH_LATENCY_APP=own \
    scripts/bench-bundle.sh run operating_points
# Point 3 again with the applications pinned apart (the latency one on the last core,
# whose runtime drives the latency channels' queues under `Isolating`) and the 10
# slowest samples.
step points_pinned 200 NETCHANNEL_BENCH_POINTS=3 NETCHANNEL_BENCH_LATENCY_APP=own \
    NETCHANNEL_BENCH_PIN_APPS=1 NETCHANNEL_BENCH_SLOWEST=10 \
    scripts/bench-bundle.sh run operating_points
step rpc_conns 120 "${common[@]}" NETCHANNEL_BENCH_CHANNELS=4 scripts/bench-bundle.sh run rpc_rate
# Once more (NETCHANNEL_BENCH_LIGHT_LOAD_STREAMS is no longer read).
step rpc_conns_nolight 120 "${common[@]}" NETCHANNEL_BENCH_CHANNELS=4 \
    NETCHANNEL_BENCH_LIGHT_LOAD_STREAMS=0 scripts/bench-bundle.sh run rpc_rate
for rx in 1 0; do
    step latency 90 NETCHANNEL_BENCH_SAMPLES=8000 NETCHANNEL_BENCH_ROUNDS=2 \
        NETCHANNEL_BENCH_CHANNEL_THREAD_RX=$rx scripts/bench-bundle.sh run vns_latency
done
if [ "${BUSY:-0}" = 1 ]; then
    step latency 90 "${spin[@]}" NETCHANNEL_BENCH_SAMPLES=8000 NETCHANNEL_BENCH_ROUNDS=2 \
        scripts/bench-bundle.sh run vns_latency
    for ch in 1 4; do
        step rpc128_spin 100 "${common[@]}" "${spin[@]}" NETCHANNEL_BENCH_CONNS=128 \
            NETCHANNEL_BENCH_CHANNELS=$ch scripts/bench-bundle.sh run rpc_rate
    done
fi
echo "=== $(date +%T) all steps done"
