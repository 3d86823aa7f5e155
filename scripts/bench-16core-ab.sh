#!/usr/bin/env bash
# A/B of bundled rpc_rate binaries on a machine with cores to spare (see
# scripts/bench-16core.sh): `scripts/bench-16core-ab.sh BIN...` runs each binary of
# .devbundle/bin in turn at 128 connections, 64 B and 4 KB, with 1 and then 4 channels
# per peer (bed with 4 queues, 4 tokio workers), ROUNDS times (default 1).
set -uo pipefail
cd "$(dirname "$0")/.."
export NETCHANNEL_BENCH_QUEUES=4 NETCHANNEL_BENCH_SIZES=64,4096 NETCHANNEL_BENCH_CONNS=128 \
    NETCHANNEL_BENCH_RUNTIME_RX=0 NETCHANNEL_BENCH_WORKERS=4 NETCHANNEL_BENCH_SECS=1 \
    NETCHANNEL_BENCH_ROUNDS=2
for _ in $(seq "${ROUNDS:-1}"); do
    for ch in 1 4; do
        for b in "$@"; do
            echo "=== $b, $ch channels"
            NETCHANNEL_BENCH_CHANNELS=$ch timeout -k 5 60 scripts/bench-bundle.sh run "$b" 2>&1 |
                grep -E '^ +[0-9]|panic|error'
        done
    done
done
