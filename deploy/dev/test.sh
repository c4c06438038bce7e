#!/usr/bin/env bash
# Runs flopwatch's whole test suite (unit, property, end-to-end, process).
set -euo pipefail
cd "$(dirname "$0")/../.."
./deploy/dev/setup.sh
cargo fmt --all -- --check
cargo test --workspace --all-targets "$@"
# The agent-only build (what a node runs) compiles, and carries no RocksDB,
# collector, selector or terminal view.
cargo build -p flopwatch-cli --no-default-features --features agent
if cargo tree -p flopwatch-cli --no-default-features --features agent -e normal | grep -q rocksdb; then
    echo "error: the agent-only build (flopwatch-cli --no-default-features --features agent) depends on rocksdb" >&2
    exit 1
fi
# That build wrote its binary to target/debug/flopwatch: put the full one
# back for the demo and later test runs (nothing to compile).
cargo build --workspace --all-targets
