#!/usr/bin/env bash
# Where a VirtualStream request's time goes on a machine with cores to spare (companion of
# scripts/bench-16core.sh; bundle with `scripts/bench-bundle.sh make rpc_rate`, which
# takes `perf` along where this machine has it). Logs to $OUT (or /tmp/bench-16core).
#
# (1) rpc_rate, 64 B over 128 connections, with 1 and 4 channels per peer and 4 and 8
# tokio workers (and 2 shards instead of one per core): which of channels and
# application threads moves the rate; (2) a
# system-wide `perf record` (cpu-clock) of the VirtualStreams alone in the same setting,
# with 1 and 4 channels, reported by thread name and by symbol.
#
# `callers` instead: only a `perf record --call-graph dwarf` of the 4-channel case (bundle
# with BUNDLE_DEBUG=1), reported with the call chains of the hottest symbols.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/bench-16core}
mkdir -p "$out"
if [ "${1:-}" = callers ]; then
    log="$out/callers.log"
    NETCHANNEL_BENCH_QUEUES=4 NETCHANNEL_BENCH_SIZES=64 NETCHANNEL_BENCH_CONNS=128 \
        NETCHANNEL_BENCH_RUNTIME_RX=0 NETCHANNEL_BENCH_WORKERS=4 NETCHANNEL_BENCH_CHANNELS=4 \
        NETCHANNEL_BENCH_SECS=4 NETCHANNEL_BENCH_ROUNDS=1 NETCHANNEL_BENCH_ONLY=virtual \
        timeout -k 5 60 scripts/bench-bundle.sh run rpc_rate >"$log" 2>&1 &
    bench=$!
    sleep 3
    pid=$(pgrep -f '.devbundle/bin/rpc_rate' | head -1)
    timeout -k 5 30 .devbundle/path/perf record -p "$pid" --call-graph dwarf,8192 -F 499 \
        -o /tmp/callers.data -- sleep 1 >>"$log" 2>&1
    wait $bench
    timeout -k 5 240 .devbundle/path/perf report -i /tmp/callers.data --no-children --stdio --max-stack 14 \
        -g graph,0.5,callee --percent-limit 1.5 2>/dev/null | grep -v '^$' | head -700 >>"$log"
    echo "=== done" >>"$log"
    exit 0
fi
export NETCHANNEL_BENCH_QUEUES=4 NETCHANNEL_BENCH_SIZES=64 NETCHANNEL_BENCH_CONNS=128 \
    NETCHANNEL_BENCH_RUNTIME_RX=0
for w in 4 8; do
    for ch in 1 4; do
        echo "=== workers $w channels $ch" | tee -a "$out/matrix.log"
        timeout -k 5 60 env NETCHANNEL_BENCH_WORKERS=$w NETCHANNEL_BENCH_CHANNELS=$ch \
            NETCHANNEL_BENCH_SECS=1 NETCHANNEL_BENCH_ROUNDS=2 \
            scripts/bench-bundle.sh run rpc_rate 2>&1 | grep -E '^ +[0-9]|error|panic' |
            tee -a "$out/matrix.log"
    done
done
echo "=== workers 4 channels 4 shards 2" | tee -a "$out/matrix.log"
timeout -k 5 60 env NETCHANNEL_BENCH_WORKERS=4 NETCHANNEL_BENCH_CHANNELS=4 NETCHANNEL_BENCH_SHARDS=2 \
    NETCHANNEL_BENCH_SECS=1 NETCHANNEL_BENCH_ROUNDS=2 \
    scripts/bench-bundle.sh run rpc_rate 2>&1 | grep -E '^ +[0-9]|error|panic' | tee -a "$out/matrix.log"
command -v .devbundle/path/perf >/dev/null || { echo "no perf bundled"; exit 0; }
for ch in 1 4; do
    log="$out/profile_ch$ch.log"
    NETCHANNEL_BENCH_WORKERS=4 NETCHANNEL_BENCH_CHANNELS=$ch NETCHANNEL_BENCH_SECS=5 \
        NETCHANNEL_BENCH_ROUNDS=1 NETCHANNEL_BENCH_ONLY=virtual \
        timeout -k 5 60 scripts/bench-bundle.sh run rpc_rate >"$log" 2>&1 &
    bench=$!
    # The measurement starts after the bed, 128 connections and a 0.2 s warm-up.
    sleep 3
    timeout -k 5 30 .devbundle/path/perf record -a -e cpu-clock -F 1999 -o /tmp/perf$ch.data \
        -- sleep 2 >>"$log" 2>&1
    wait $bench
    {
        echo "=== by thread"
        .devbundle/path/perf report -i /tmp/perf$ch.data --no-children --sort comm --stdio 2>/dev/null |
            grep -v '^#' | grep -v '^$' | head -40
        echo "=== by thread and symbol"
        .devbundle/path/perf report -i /tmp/perf$ch.data --no-children --sort comm,sym --stdio 2>/dev/null |
            grep -v '^#' | grep -v '^$' | head -120
    } >>"$log"
done
echo "=== done"
