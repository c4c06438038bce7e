#!/usr/bin/env bash
# Reproduces the storage figures of docs/BENCHMARKS.md on this machine:
# bytes per sample on disk for the simulator's traces at a fixed 100 ms and
# through the adaptive sampler, flopwatch (gRPC ingest, compaction, RocksDB
# flush and full compaction, whole data directory) against Prometheus
# (promtool tsdb create-blocks-from openmetrics on the identical samples),
# (lossless, and at a declared precision), and the 30-day hourly OFU query.
# Usage: deploy/dev/bench-storage.sh [GPUs, default 4] [hours, default 3]
set -euo pipefail
cd "$(dirname "$0")/../.."
./deploy/dev/setup.sh
gpus="${1:-4}"
hours="${2:-3}"
# The workspace build: the feature set every other build uses, so RocksDB's
# C++ is compiled once.
cargo build --quiet --release --workspace --all-targets
bench="${CARGO_TARGET_DIR:-target}/release/flopwatch-bench"

echo "## machine"
echo "$(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(free -g | awk '/Mem/{print $2}') GiB RAM, $(uname -sr)"
promtool --version 2>&1 | head -1
echo
echo "## storage"
# Lossless (the default), then at a declared precision ([storage.precision]):
# power to 1 W, tensor and DRAM activity to 0.001, the averaged SM clock to
# 1 MHz; Prometheus gets the values as flopwatch stores them in each case.
"$bench" storage --gpus "$gpus" --hours "$hours" --query-days 30 \
  --precision power_w=1 --precision tensor_active=0.001 \
  --precision dram_active=0.001 --precision sm_clock_avg_mhz=1
