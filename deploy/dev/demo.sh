#!/usr/bin/env bash
# flopwatch demo: a collector with embedded RocksDB and a simulated fleet.
# Arguments go to `flopwatch demo` (e.g. --nodes 2 --gpus 4 --duration 30s).
set -euo pipefail
cd "$(dirname "$0")/../.."
./deploy/dev/setup.sh
# Built exactly as the test suite builds it (all targets), so the demo and
# `deploy/dev/test.sh` share one RocksDB build instead of compiling it twice.
echo "building flopwatch (the first build compiles RocksDB: ~15 min on 2 cores)..." >&2
cargo build --quiet --workspace --all-targets
exec "${CARGO_TARGET_DIR:-target}/debug/flopwatch" demo "$@"
