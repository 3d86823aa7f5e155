#!/usr/bin/env bash
# Runs every test of the workspace. As root on Debian it first installs what it needs.
# Ends with one line totalling every test binary's results.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Two cores: keep the build lean. Every feature on: the ecosystem integrations (axum,
# tonic, hyper) and their examples' tests build and run only with theirs.
cargo test --workspace --all-targets --all-features -j2 2>&1 | tee "$log"
cargo test --workspace --doc --all-features -j2 2>&1 | tee -a "$log"

# "test result: ok. 12 passed; 0 failed; ..." from every test binary and doctest run.
read -r passed failed < <(awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i) ~ /^passed;?$/) p += $(i - 1)
            if ($(i) ~ /^failed;?$/) f += $(i - 1)
        }
    } END { print p + 0, f + 0 }' "$log")
echo
echo "all tests: ${passed} passed, ${failed} failed"
