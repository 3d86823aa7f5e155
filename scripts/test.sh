#!/usr/bin/env bash
# Runs every test of the workspace. As root on Debian it first installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# Two cores: keep the build lean.
cargo test --workspace --all-targets -j2
cargo test --workspace --doc -j2
