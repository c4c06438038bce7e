#!/usr/bin/env bash
# Runs flopwatch's whole test suite (unit, property, end-to-end, process).
set -euo pipefail
cd "$(dirname "$0")/../.."
./deploy/dev/setup.sh
cargo fmt --all -- --check
cargo test --workspace --all-targets "$@"
