#!/usr/bin/env bash
# Reproduces the storage figures of docs/BENCHMARKS.md on this machine:
# bytes per sample on disk for the simulator's traces at a fixed 100 ms and
# through the adaptive sampler, flopwatch (gRPC ingest, compaction, RocksDB
# flush and full compaction, whole data directory) against Prometheus
# (promtool tsdb create-blocks-from openmetrics on the identical samples),
# and the 30-day hourly OFU query.
# Usage: deploy/dev/bench-storage.sh [GPUs, default 4] [hours, default 3]
set -euo pipefail
cd "$(dirname "$0")/../.."
./deploy/dev/setup.sh
gpus="${1:-4}"
hours="${2:-3}"
cargo build --quiet --release --bin flopwatch -p flopwatch-collector
bin="${CARGO_TARGET_DIR:-target}/release/flopwatch"

echo "## machine"
echo "$(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(free -g | awk '/Mem/{print $2}') GiB RAM, $(uname -sr)"
promtool --version 2>&1 | head -1
echo
echo "## storage"
"$bin" bench storage --gpus "$gpus" --hours "$hours" --query-days 30
